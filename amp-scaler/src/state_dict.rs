//! The scaler's state dict: exactly PyTorch's five keys, in order, with their types.

use serde::{Deserialize, Serialize};

/// `GradScaler.state_dict()` of an enabled scaler. Serialises (serde) as
/// `{"scale": float, "growth_factor": float, "backoff_factor": float,
/// "growth_interval": int, "_growth_tracker": int}` in that order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalerStateDict {
    pub scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: i64,
    #[serde(rename = "_growth_tracker")]
    pub growth_tracker: i64,
}

impl ScalerStateDict {
    /// As a JSON value (an object with the five keys in order).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("plain data serialises")
    }
}
