//! GradScaler with PyTorch's exact dynamic loss-scaling semantics.
