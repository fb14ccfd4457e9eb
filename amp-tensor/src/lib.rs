//! Tensors.
