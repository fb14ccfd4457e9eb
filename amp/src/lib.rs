//! Automatic mixed precision for Rust: autocast + GradScaler (facade).
