//! Errors of the optimizers.

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong in an optimizer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Autograd(#[from] amp_autograd::Error),
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
    /// A hyper-parameter out of range (PyTorch's messages).
    #[error("{0}")]
    InvalidHyperParameter(String),
    /// A state dict that does not fit this optimizer.
    #[error("{0}")]
    BadStateDict(String),
    /// The total gradient norm was not finite and the caller asked for an error.
    #[error("The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")]
    NonFiniteNorm { norm_type: f64 },
    /// `step_with_scaling` on an optimizer that does not support it.
    #[error("this optimizer does not handle gradient scaling itself")]
    ScalingUnsupported,
}
