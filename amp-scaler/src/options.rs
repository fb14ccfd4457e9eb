//! Constructor options: PyTorch's five, plus opt-in extras that are off by default so
//! the defaults stay exact.

/// `GradScaler(init_scale, growth_factor, backoff_factor, growth_interval, enabled)`
/// and the extras.
#[derive(Debug, Clone, PartialEq)]
pub struct GradScalerOptions {
    /// Initial scale (65536.0).
    pub init_scale: f64,
    /// Multiplier after `growth_interval` clean steps (2.0).
    pub growth_factor: f64,
    /// Multiplier after an overflow (0.5).
    pub backoff_factor: f64,
    /// Clean steps between growths (2000).
    pub growth_interval: i64,
    /// `false` makes every call a pass-through.
    pub enabled: bool,
    /// Extra: never back off below this scale (off: `None`).
    pub min_scale: Option<f64>,
    /// Extra: never grow above this scale (off: `None`).
    pub max_scale: Option<f64>,
    /// Extra: back off only after this many consecutive overflowing steps, as
    /// DeepSpeed and Megatron do (1: every overflow, PyTorch's behaviour).
    pub hysteresis: u32,
}

impl Default for GradScalerOptions {
    fn default() -> Self {
        GradScalerOptions {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
            min_scale: None,
            max_scale: None,
            hysteresis: 1,
        }
    }
}

impl GradScalerOptions {
    amp_tensor::setters! {
        /// Set `init_scale`.
        init_scale: f64;
        /// Set `growth_factor`.
        growth_factor: f64;
        /// Set `backoff_factor`.
        backoff_factor: f64;
        /// Set `growth_interval`.
        growth_interval: i64;
        /// Set `enabled`.
        enabled: bool;
        /// Extra: a floor for the scale.
        min_scale: f64 => Some;
        /// Extra: a ceiling for the scale.
        max_scale: f64 => Some;
    }
    /// Extra: consecutive overflows needed before backing off.
    pub fn hysteresis(mut self, n: u32) -> Self {
        self.hysteresis = n.max(1);
        self
    }
}
