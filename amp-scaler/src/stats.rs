//! Statistics a training loop can read after `update` (PyTorch issues #55585, #67590:
//! "how do I know the step was skipped?").

/// Counters kept by the scaler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScalerStats {
    /// `step` calls that stepped the optimizer.
    pub steps_taken: u64,
    /// `step` calls that were skipped for inf/NaN gradients.
    pub steps_skipped: u64,
    /// Whether the last `update` saw an inf/NaN.
    pub last_found_inf: bool,
    /// Whether the last `step` was skipped.
    pub last_step_skipped: bool,
}

impl ScalerStats {
    pub(crate) fn record_step(&mut self, skipped: bool) {
        if skipped {
            self.steps_skipped += 1;
        } else {
            self.steps_taken += 1;
        }
        self.last_step_skipped = skipped;
    }
}
