//! Errors of the optimizers, with PyTorch's message texts where PyTorch has one.

use crate::pyfloat::PyFloat;
use crate::state_dict::StateProblem;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong in an optimizer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An error of an autograd op.
    #[error(transparent)]
    Autograd(#[from] amp_autograd::Error),
    /// An error of a tensor operation.
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
    /// No parameters to optimize (`torch.optim.Optimizer.__init__`).
    #[error("optimizer got an empty parameter list")]
    EmptyParameterList,
    /// A parameter produced by an op rather than a leaf (`add_param_group`).
    #[error("can't optimize a non-leaf Tensor")]
    NonLeafParameter,
    /// The same parameter in two groups (`add_param_group`).
    #[error("some parameters appear in more than one parameter group")]
    DuplicateParameter,
    /// A negative or NaN learning rate.
    #[error("Invalid learning rate: {}", PyFloat(*.0))]
    InvalidLearningRate(f64),
    /// A negative or NaN momentum (SGD).
    #[error("Invalid momentum value: {}", PyFloat(*.0))]
    InvalidMomentum(f64),
    /// A NaN dampening (SGD). PyTorch does not check dampening; a NaN one would turn
    /// every momentum buffer into NaN without a word, so it is refused here, in
    /// PyTorch's wording for the other SGD options.
    #[error("Invalid dampening value: {}", PyFloat(*.0))]
    InvalidDampening(f64),
    /// A negative or NaN weight decay.
    #[error("Invalid weight_decay value: {}", PyFloat(*.0))]
    InvalidWeightDecay(f64),
    /// A negative or NaN epsilon (Adam, AdamW).
    #[error("Invalid epsilon value: {}", PyFloat(*.0))]
    InvalidEpsilon(f64),
    /// A beta outside `[0, 1)` (Adam, AdamW); `index` is 0 or 1.
    #[error("Invalid beta parameter at index {index}: {}", PyFloat(*.value))]
    InvalidBeta {
        /// Which of the two betas.
        index: usize,
        /// Its value.
        value: f64,
    },
    /// Nesterov momentum with no momentum or with dampening (SGD).
    #[error("Nesterov momentum requires a momentum and zero dampening")]
    NesterovRequiresMomentum,
    /// A state dict with another number of groups (PyTorch's `load_state_dict` text).
    #[error("loaded state dict has a different number of parameter groups")]
    GroupCountMismatch,
    /// A state dict whose groups hold other numbers of parameters (PyTorch's text).
    #[error("loaded state dict contains a parameter group that doesn't match the size of optimizer's group")]
    GroupSizeMismatch,
    /// A saved group's entry missing or of the wrong type.
    #[error("loaded state dict: param_groups[{group}][\"{key}\"] must be {expected}")]
    GroupEntry {
        /// The group's position.
        group: usize,
        /// The entry's key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// State saved for a parameter index that no saved group lists.
    #[error("loaded state dict: state for parameter {0}, which no parameter group lists")]
    UnknownStateIndex(usize),
    /// A parameter's saved state entry that cannot be used.
    #[error("loaded state dict: state[{index}][\"{key}\"] {problem}")]
    StateEntry {
        /// The parameter's index in the state dict.
        index: usize,
        /// The entry's key.
        key: String,
        /// What is wrong with it.
        #[source]
        problem: StateProblem,
    },
    /// The total gradient norm was not finite and the caller asked for an error.
    #[error("The total norm of order {} for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`", PyFloat(*.norm_type))]
    NonFiniteNorm {
        /// The order of the norm.
        norm_type: f64,
    },
    /// `step_with_scaling` on an optimizer that does not support it.
    #[error("this optimizer does not handle gradient scaling itself")]
    ScalingUnsupported,
    /// A learning-rate schedule whose settings do not make one (PyTorch's
    /// `lr_scheduler` texts where it has them).
    #[error("{0}")]
    InvalidSchedule(String),
}
