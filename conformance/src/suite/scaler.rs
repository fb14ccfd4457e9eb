//! The scaler suite: GradScaler programs. Skipped until `amp-scaler` is wired into the
//! runner (the cases are parsed and validated already).

use super::Outcome;
use crate::vectors::ScalerCase;

/// The skip reason of every scaler case for now.
pub const NOT_IMPLEMENTED: &str = "GradScaler not implemented yet";

/// Runs `case`: skipped for now.
pub fn run(_case: &ScalerCase) -> Outcome {
    Outcome::Skipped(NOT_IMPLEMENTED.to_owned())
}
