//! Learning-rate schedules: linear warm-up then cosine decay, the schedule transformer
//! training uses, with the closed forms of PyTorch's `LinearLR` and `CosineAnnealingLR`
//! chained as `SequentialLR` chains them.

use crate::{Error, Optimizer, Result};

/// Warm-up from `start_factor · base_lr` to `base_lr` over `warmup_steps` steps (PyTorch's
/// `LinearLR(start_factor, end_factor=1, total_iters=warmup_steps)`), then cosine decay
/// to `min_lr` at `total_steps` (`CosineAnnealingLR(T_max=total_steps - warmup_steps,
/// eta_min=min_lr)`), and `min_lr` after.
///
/// ```
/// use amp_optim::WarmupCosine;
/// # fn main() -> amp_optim::Result<()> {
/// let s = WarmupCosine::new(1e-3, 10, 110, 1e-5, 0.1)?;
/// assert!((s.lr_at(0) - 1e-4).abs() < 1e-12); // start_factor · base
/// assert!((s.lr_at(10) - 1e-3).abs() < 1e-12); // warm-up done
/// assert!((s.lr_at(60) - (1e-5 + 0.5 * (1e-3 - 1e-5))).abs() < 1e-12); // half way down
/// assert!((s.lr_at(500) - 1e-5).abs() < 1e-12);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    base_lr: f64,
    warmup_steps: usize,
    total_steps: usize,
    min_lr: f64,
    start_factor: f64,
}

impl WarmupCosine {
    /// A schedule; `warmup_steps <= total_steps`, `0 < start_factor <= 1` (PyTorch's
    /// `LinearLR` check), learning rates finite and not negative.
    pub fn new(
        base_lr: f64,
        warmup_steps: usize,
        total_steps: usize,
        min_lr: f64,
        start_factor: f64,
    ) -> Result<Self> {
        crate::optimizer::check_lr(base_lr)?;
        crate::optimizer::check_lr(min_lr)?;
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::InvalidSchedule(
                "Starting multiplicative factor expected to be greater than 0 and less or equal to 1."
                    .to_string(),
            ));
        }
        if warmup_steps > total_steps {
            return Err(Error::InvalidSchedule(format!(
                "warm-up of {warmup_steps} steps is longer than the schedule's {total_steps}"
            )));
        }
        Ok(WarmupCosine {
            base_lr,
            warmup_steps,
            total_steps,
            min_lr,
            start_factor,
        })
    }

    /// The learning rate of step `step` (0 for the first `optimizer.step()`).
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            let f = self.start_factor
                + (1.0 - self.start_factor) * step as f64 / self.warmup_steps as f64;
            return self.base_lr * f;
        }
        let span = self.total_steps - self.warmup_steps;
        if step >= self.total_steps || span == 0 {
            return if step >= self.total_steps {
                self.min_lr
            } else {
                self.base_lr
            };
        }
        let t = (step - self.warmup_steps) as f64 / span as f64;
        self.min_lr + (self.base_lr - self.min_lr) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
    }

    /// Set every group of `opt` to [`WarmupCosine::lr_at`]`(step)`.
    pub fn apply(&self, opt: &mut dyn Optimizer, step: usize) {
        opt.set_learning_rate(self.lr_at(step));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_is_linear_and_the_decay_monotone_to_the_floor() {
        let s = WarmupCosine::new(2.0, 4, 12, 0.5, 0.25).unwrap();
        let lrs: Vec<f64> = (0..14).map(|i| s.lr_at(i)).collect();
        // LinearLR: factors 0.25, 0.4375, 0.625, 0.8125, then 1.
        for (i, want) in [0.5, 0.875, 1.25, 1.625, 2.0].iter().enumerate() {
            assert!((lrs[i] - want).abs() < 1e-12, "step {i}: {}", lrs[i]);
        }
        assert!(lrs[4..=12].windows(2).all(|w| w[1] < w[0]), "{lrs:?}");
        assert!((lrs[8] - 1.25).abs() < 1e-12, "the cosine's midpoint");
        assert_eq!((lrs[12], lrs[13]), (0.5, 0.5));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(WarmupCosine::new(1.0, 5, 4, 0.0, 0.5).is_err());
        assert!(WarmupCosine::new(1.0, 1, 4, 0.0, 0.0).is_err());
        assert!(WarmupCosine::new(f64::NAN, 1, 4, 0.0, 0.5).is_err());
        assert!(WarmupCosine::new(1.0, 1, 4, -1.0, 0.5).is_err());
        // No warm-up and no decay span: the base rate, then the floor.
        let s = WarmupCosine::new(1.0, 3, 3, 0.1, 1.0).unwrap();
        assert_eq!((s.lr_at(2), s.lr_at(3)), (1.0, 0.1));
    }
}
