//! Layers, losses and the Module trait.
