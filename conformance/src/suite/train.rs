//! The train suite: a small MLP trained with autocast + GradScaler. Skipped until the
//! training pieces (`amp-nn`, `amp-optim`, `amp-scaler`) are wired into the runner (the
//! cases are parsed and validated already).

use super::Outcome;
use crate::vectors::TrainCase;

/// The skip reason of every train case for now.
pub const NOT_IMPLEMENTED: &str = "training loop not implemented yet";

/// Runs `case`: skipped for now.
pub fn run(_case: &TrainCase) -> Outcome {
    Outcome::Skipped(NOT_IMPLEMENTED.to_owned())
}
