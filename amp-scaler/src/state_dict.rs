//! The scaler's state dict: exactly PyTorch's five keys, in order, with their types.

use amp_optim::json_float;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ScalerError;

/// `GradScaler.state_dict()` of an enabled scaler. Serialises (serde) as
/// `{"scale": float, "growth_factor": float, "backoff_factor": float,
/// "growth_interval": int, "_growth_tracker": int}` in that order. A float that is NaN
/// or infinite (a scale that overflowed) is written as the string `"NaN"`,
/// `"Infinity"` or `"-Infinity"` ([`amp_optim::json_float`]), so it reads back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalerStateDict {
    /// The loss scale.
    #[serde(with = "json_float")]
    pub scale: f64,
    /// Multiplier after `growth_interval` clean steps.
    #[serde(with = "json_float")]
    pub growth_factor: f64,
    /// Multiplier after an overflow.
    #[serde(with = "json_float")]
    pub backoff_factor: f64,
    /// Clean steps between growths.
    pub growth_interval: i64,
    /// Clean steps since the last growth or backoff.
    #[serde(rename = "_growth_tracker")]
    pub growth_tracker: i64,
}

/// What is wrong with a JSON value given as a scaler state dict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateDictProblem {
    /// Not a JSON object.
    #[error("a GradScaler state dict is a JSON object")]
    NotAnObject,
    /// One of the five keys missing or of the wrong type.
    #[error("GradScaler state dict: `{key}` must be {expected}")]
    Entry {
        /// The key.
        key: &'static str,
        /// What its value must be.
        expected: &'static str,
    },
}

impl ScalerStateDict {
    /// As a JSON value (an object with the five keys in order).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("plain data serialises")
    }

    /// Read a state dict from JSON (PyTorch's dict as `json.dumps` writes it, or
    /// [`ScalerStateDict::to_json`]'s): `{}` is [`ScalerError::EmptyStateDict`] as in
    /// PyTorch; a missing key or a value of the wrong type is
    /// [`ScalerError::BadStateDict`], and so is a growth tracker outside int32's range
    /// (the dtype it is kept in); other keys are ignored, as PyTorch ignores them. The
    /// values are not otherwise checked, as in PyTorch (a NaN scale loads).
    pub fn from_json(v: &Value) -> Result<Self, ScalerError> {
        let m = v
            .as_object()
            .ok_or(ScalerError::BadStateDict(StateDictProblem::NotAnObject))?;
        if m.is_empty() {
            return Err(ScalerError::EmptyStateDict);
        }
        let bad =
            |key, expected| ScalerError::BadStateDict(StateDictProblem::Entry { key, expected });
        let float = |key: &'static str| {
            m.get(key)
                .and_then(json_float::from_json)
                .ok_or_else(|| bad(key, "a number"))
        };
        let int = |key: &'static str| {
            m.get(key)
                .and_then(Value::as_i64)
                .ok_or_else(|| bad(key, "an integer"))
        };
        // The tracker lives in an int32 tensor: PyTorch's `torch.full(..., dtype=int32)`
        // refuses a value that overflows it, so it is refused here, at the load.
        let tracker = int("_growth_tracker")?;
        if i32::try_from(tracker).is_err() {
            return Err(bad("_growth_tracker", "an integer within int32's range"));
        }
        Ok(ScalerStateDict {
            scale: float("scale")?,
            growth_factor: float("growth_factor")?,
            backoff_factor: float("backoff_factor")?,
            growth_interval: int("growth_interval")?,
            growth_tracker: tracker,
        })
    }
}
