//! The optimizer trait, parameter groups and the serialisable state dict.

use std::sync::atomic::{AtomicU64, Ordering};

use amp_autograd::Tensor;
use amp_tensor::Tensor as Raw;

use crate::{Error, OptimizerStateDict, Result};

/// The identity of an optimizer: unique in the process, given at construction, kept
/// when the optimizer value moves (out of a `Vec`, into a `Box`, through a `Vec` that
/// reallocates). A `GradScaler` keys its per-optimizer state by it, never by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OptimizerId(u64);

impl OptimizerId {
    /// A new identity, different from every other one this process has handed out.
    pub fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Relaxed is enough: only uniqueness matters, and fetch_add is atomic. 2^64
        // optimizers cannot be built in a process's lifetime, so it never wraps.
        OptimizerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The number behind the identity (for logs).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Where an optimizer keeps its [`OptimizerId`]: a fresh identity at construction and
/// a fresh one for every clone (a clone is another optimizer, with stages of its own),
/// the same identity through any move.
#[derive(Debug, PartialEq, Eq)]
pub struct IdSlot(OptimizerId);

impl IdSlot {
    /// A slot holding a fresh identity.
    pub fn new() -> Self {
        IdSlot(OptimizerId::fresh())
    }

    /// The identity held.
    pub fn get(&self) -> OptimizerId {
        self.0
    }
}

impl Default for IdSlot {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for IdSlot {
    /// A clone is a new object: it gets a new identity.
    fn clone(&self) -> Self {
        Self::new()
    }
}

/// Parameters sharing a learning rate and options.
#[derive(Clone)]
pub struct ParamGroup<O> {
    /// The parameters (leaves that require grad).
    pub params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// The optimizer's other options for this group.
    pub options: O,
}

/// An optimizer: updates its parameters from their `.grad` in place.
pub trait Optimizer {
    /// This optimizer's identity (see [`OptimizerId`]): the same for the optimizer's
    /// whole life wherever the value moves, never shared with another optimizer. Keep
    /// it in an [`IdSlot`] field.
    fn id(&self) -> OptimizerId;
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;
    /// Every parameter, in group order.
    fn params(&self) -> Vec<Tensor>;
    /// Clear every parameter's gradient (`zero_grad(set_to_none=True)`).
    fn zero_grad(&mut self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
    /// Learning rate of each group.
    fn learning_rates(&self) -> Vec<f64>;
    /// Set the learning rate of every group.
    fn set_learning_rate(&mut self, lr: f64);
    /// The state and hyper-parameters, serialisable.
    fn state_dict(&self) -> OptimizerStateDict;
    /// Restore from [`Optimizer::state_dict`], all or nothing: every entry is checked
    /// first ([`Optimizer::validate_state_dict`]), and on an error nothing has changed.
    fn load_state_dict(&mut self, sd: &OptimizerStateDict) -> Result<()>;
    /// The checks of [`Optimizer::load_state_dict`] without the loading: `Ok` exactly
    /// when loading `sd` would succeed. Lets a caller restoring several objects (a
    /// checkpoint) check all of them before changing any.
    fn validate_state_dict(&self, sd: &OptimizerStateDict) -> Result<()>;
    /// `true` if [`Optimizer::step_with_scaling`] unscales, checks for infs and skips
    /// inside its own step (PyTorch's `_step_supports_amp_scaling`).
    fn supports_amp_scaling(&self) -> bool {
        false
    }
    /// A step that takes the loss scale (`None` when the gradients were already
    /// unscaled) and the found-inf flag (1-element float32 tensors), and unscales the
    /// gradients and skips when `found_inf != 0` itself: `Ok(true)` when it stepped,
    /// `Ok(false)` when it skipped (parameters and state untouched). The flag is read
    /// once (the skip decision, one synchronisation for a device flag); the scale is
    /// not read back: device kernels take it by pointer.
    fn step_with_scaling(&mut self, _grad_scale: Option<&Raw>, _found_inf: &Raw) -> Result<bool> {
        Err(Error::ScalingUnsupported)
    }
}

/// PyTorch's checks of the parameter groups (`Optimizer.__init__` and
/// `add_param_group`): at least one group, leaves only, no parameter in two groups.
pub(crate) fn check_param_groups<O>(groups: &[ParamGroup<O>]) -> Result<()> {
    if groups.is_empty() {
        return Err(Error::EmptyParameterList);
    }
    let mut seen = std::collections::HashSet::new();
    for g in groups {
        if g.params.iter().any(|p| !p.is_leaf()) {
            return Err(Error::NonLeafParameter);
        }
        // Within a group a repeat is only a warning in PyTorch; across groups an error.
        let ids: std::collections::HashSet<u64> = g.params.iter().map(Tensor::id).collect();
        if ids.iter().any(|id| seen.contains(id)) {
            return Err(Error::DuplicateParameter);
        }
        seen.extend(ids);
    }
    Ok(())
}

/// PyTorch's learning-rate check (Adam's `not 0.0 <= lr`: NaN is refused too).
pub(crate) fn check_lr(lr: f64) -> Result<()> {
    if lr.is_nan() || lr < 0.0 {
        return Err(Error::InvalidLearningRate(lr));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_a_clone_gets_a_new_one() {
        let a = IdSlot::new();
        let b = IdSlot::default();
        assert_ne!(a.get(), b.get());
        let c = a.clone();
        assert_ne!(c.get(), a.get());
        assert_ne!(c.get(), b.get());
        let moved = a;
        let id = moved.get();
        let boxed = Box::new(moved);
        assert_eq!(boxed.get(), id);
    }
}
