//! The one error type of the tensor layer (and of the kernels built on it).

use crate::{DType, Device};

/// Result alias used across the tensor and kernel crates.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong with user input at the tensor level.
///
/// Messages name the offending values; where PyTorch has a message for the same
/// situation its wording is followed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two shapes that must agree (or broadcast) do not. With a hint (PyTorch's own text for
    /// the case, e.g. a broadcasting failure), the hint is the message.
    #[error("{}", shape_mismatch_text(op, lhs, rhs, hint))]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        hint: Option<String>,
    },
    /// A shape that is invalid on its own (wrong rank, wrong element count, ...).
    #[error("{op}: invalid shape {shape:?}: {msg}")]
    InvalidShape {
        op: &'static str,
        shape: Vec<usize>,
        msg: String,
    },
    /// Tensors of different dtypes where one dtype is required.
    #[error("{op}: expected dtype {expected}, but got {got}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },
    /// Tensors on different devices.
    #[error("Expected all tensors to be on the same device, but found at least two devices, {lhs} and {rhs}! (in {op})")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },
    /// A dimension index outside `[-ndim, ndim - 1]`.
    #[error("Dimension out of range (expected to be in range of [{}, {}], but got {dim})", -(*.ndim.max(&1) as i64), (*.ndim.max(&1) as i64) - 1)]
    DimOutOfRange { dim: i64, ndim: usize },
    /// An index or a range outside a dimension.
    #[error("{op}: index {index} is out of bounds for dimension {dim} with size {size}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        dim: usize,
        size: usize,
    },
    /// The op has no kernel for this dtype (PyTorch's text, with its `ScalarType` name).
    #[error("\"{op}\" not implemented for '{}'", .dtype.scalar_type_name())]
    UnsupportedDType { op: &'static str, dtype: DType },
    /// The device cannot be used (no driver, no library, feature not compiled in).
    /// An op without a kernel for the device its tensors are on (PyTorch's "Could not
    /// run ... with arguments from the 'CUDA' backend"). Nothing falls back to the host.
    #[error("Could not run '{op}' with arguments from the '{}' backend: it has no kernel for {device} yet", .device.backend_name())]
    NoDeviceKernel { op: &'static str, device: Device },
    #[error("device {device} is unavailable: {reason}")]
    DeviceUnavailable { device: Device, reason: String },
    /// A device call failed (a CUDA driver, NVRTC or cuBLAS error, out of memory, ...):
    /// the library's own error is the `source`.
    #[error("{op} on {device} failed: {source}")]
    DeviceFailure {
        op: &'static str,
        device: Device,
        #[source]
        source: SharedError,
    },
    /// Any other invalid argument, with the op and a sentence saying what is wrong.
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    /// A buffer could not be allocated (PyTorch's CPU allocator's text).
    #[error("DefaultCPUAllocator: not enough memory: you tried to allocate {bytes} bytes.")]
    OutOfMemory { bytes: usize },
    /// An argument PyTorch refuses, with PyTorch's message word for word (the op is kept
    /// for callers that match on it; the text already names it where PyTorch's does).
    #[error("{msg}")]
    Refused { op: &'static str, msg: String },
}

fn shape_mismatch_text(op: &str, lhs: &[usize], rhs: &[usize], hint: &Option<String>) -> String {
    match hint {
        Some(h) => h.clone(),
        None => format!("{op}: shape mismatch: {lhs:?} and {rhs:?}"),
    }
}

/// Return early with an [`Error`] made by one of its shorthands
/// ([`Error::invalid`], [`Error::refused`]) unless `cond` holds, the message formatted
/// as `format!` does; the error is converted with `From`, so crates with their own
/// error type wrapping this one use it too. The one spelling of an argument check:
///
/// ```
/// use amp_tensor::{ensure, Error};
///
/// fn take(n: usize) -> Result<usize, Error> {
///     ensure!(n > 0, invalid("take", "expected a positive count, got {n}"));
///     Ok(n)
/// }
/// assert_eq!(take(0).unwrap_err().to_string(), "take: expected a positive count, got 0");
/// ```
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $kind:ident($op:expr, $($msg:tt)+)) => {
        if !$cond {
            return Err(::core::convert::From::from($crate::Error::$kind(
                $op,
                format!($($msg)+),
            )));
        }
    };
}

impl Error {
    /// Shorthand for [`Error::NoDeviceKernel`].
    pub fn no_device_kernel(op: &'static str, device: Device) -> Error {
        Error::NoDeviceKernel { op, device }
    }
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }

    /// Shorthand for [`Error::Refused`].
    pub fn refused(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Refused {
            op,
            msg: msg.into(),
        }
    }

    /// Shorthand for [`Error::ShapeMismatch`] without a hint.
    pub fn shape_mismatch(op: &'static str, lhs: &[usize], rhs: &[usize]) -> Self {
        Error::ShapeMismatch {
            op,
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
            hint: None,
        }
    }
}

/// An error of another library or layer (a CUDA driver error, an autocast refusal, ...)
/// kept as its own type behind a shared pointer, so that the error enums holding it stay
/// `Clone`: shown as it shows itself, its `source` chain intact, recovered with
/// [`SharedError::downcast_ref`].
#[derive(Debug, Clone)]
pub struct SharedError(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl SharedError {
    /// Keep `e`.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        SharedError(std::sync::Arc::new(e))
    }

    /// The error as `E`, when it is one.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Two shared errors are equal when they are the same error or show the same text.
impl PartialEq for SharedError {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

/// Builder setters for an options struct, inside its `impl` block: for each field
/// `name: T` a `pub fn name(mut self, v: T) -> Self` that stores `v` (through `wrap`,
/// e.g. `Some` for an optional field, when given) and returns `self`. The workspace's
/// option structs (the scaler's, autocast's region, the layers' configs) spell their
/// setters this way.
///
/// ```
/// #[derive(Default)]
/// struct Opts {
///     scale: f64,
///     floor: Option<f64>,
/// }
/// impl Opts {
///     amp_tensor::setters! {
///         /// Set the scale.
///         scale: f64;
///         /// Set a floor.
///         floor: f64 => Some;
///     }
/// }
/// let o = Opts::default().scale(2.0).floor(0.5);
/// assert_eq!((o.scale, o.floor), (2.0, Some(0.5)));
/// ```
#[macro_export]
macro_rules! setters {
    ($($(#[$m:meta])* $name:ident: $t:ty $(=> $wrap:expr)?;)*) => {$(
        $(#[$m])*
        pub fn $name(mut self, v: $t) -> Self {
            self.$name = $crate::setters!(@wrap v $(, $wrap)?);
            self
        }
    )*};
    (@wrap $v:ident) => { $v };
    (@wrap $v:ident, $wrap:expr) => { ($wrap)($v) };
}
