//! Errors of the GradScaler, with PyTorch's message texts.

use crate::state_dict::StateDictProblem;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ScalerError>;

/// Everything `GradScaler` refuses. The messages are PyTorch's, word for word.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScalerError {
    #[error("The growth factor must be > 1.0.")]
    GrowthFactor,
    #[error("The backoff factor must be < 1.0.")]
    BackoffFactor,
    /// `unscale_`, `step` or `update` before any `scale()`.
    #[error("Attempted {0} but _scale is None.  This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.")]
    ScaleIsNone(&'static str),
    #[error("unscale_() has already been called on this optimizer since the last update().")]
    AlreadyUnscaled,
    #[error("unscale_() is being called after step().")]
    UnscaleAfterStep,
    #[error("Attempting to unscale FP16 gradients.")]
    Fp16Gradients,
    #[error("Closure use is not currently supported if GradScaler is enabled.")]
    Closure,
    #[error("step() has already been called since the last update().")]
    AlreadyStepped,
    #[error("No inf checks were recorded for this optimizer.")]
    NoInfChecksForOptimizer,
    #[error("No inf checks were recorded prior to update.")]
    NoInfChecks,
    #[error("new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor with requires_grad=False.")]
    BadNewScale,
    #[error("The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.")]
    EmptyStateDict,
    #[error("outputs must be a Tensor or an iterable of Tensors")]
    NotATensor,
    /// A state dict missing a key or with a value of the wrong type.
    #[error(transparent)]
    BadStateDict(#[from] StateDictProblem),
    /// Combining `found_inf` with the other processes failed (a peer died, ...): the
    /// reduction's own error, kept whole.
    #[error("combining found_inf across processes failed: {0}")]
    FoundInfReduction(amp_tensor::SharedError),
    #[error(transparent)]
    Optim(#[from] amp_optim::Error),
    #[error(transparent)]
    Autograd(#[from] amp_autograd::Error),
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
}
