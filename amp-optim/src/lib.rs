//! Optimizers (SGD, Adam, AdamW) with the scaling-aware step contract.
