//! Shared plumbing for CPU kernels: the compute type of each storage dtype, slice
//! access to (made contiguous) inputs, and chunked widen-compute-narrow loops.
//!
//! Kernels are generic over `T: Element` (storage) and `C: Real` (compute): f16 and
//! bf16 compute in f32, f32 in f32, f64 in f64. The [`crate::float_kernel!`] macro turns a
//! runtime [`DType`] into that pair once per call.

use amp_tensor::{cast_into, DType, Device, Element, Error, Result, Tensor};

/// The floating compute types (f32, f64) with the math kernels need.
pub trait Real: num_traits::Float + Element + Send + Sync + std::iter::Sum + 'static {
    fn from_f64c(v: f64) -> Self;
    fn to_f64c(self) -> f64;
    fn erf(self) -> Self;
    /// `e^self` written to vectorise inside SIMD loops: a branch-free Cephes `expf` (~1 ulp,
    /// 0 below `ln(2^-126)`) for float32, libm for float64.
    fn exp_v(self) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn from_f64c(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_f64c(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline(always)]
    fn exp_v(self) -> Self {
        crate::vmath::exp(self)
    }
}

impl Real for f64 {
    #[inline(always)]
    fn from_f64c(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_f64c(self) -> f64 {
        self
    }
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline(always)]
    fn exp_v(self) -> Self {
        self.exp()
    }
}

/// Bind `$T` (storage element) and `$C` (compute type) for a floating `$dtype`, or
/// return [`Error::UnsupportedDType`] naming `$op`.
#[macro_export]
macro_rules! float_kernel {
    ($dtype:expr, $op:expr, |$T:ident, $C:ident| $body:expr) => {
        $crate::amp_tensor::bind_dtypes!($dtype, $body, [
            F16 => {$T = $crate::amp_tensor::half::f16, $C = f32}
            BF16 => {$T = $crate::amp_tensor::half::bf16, $C = f32}
            F32 => {$T = f32, $C = f32}
            F64 => {$T = f64, $C = f64}
        ], _ => return Err($crate::amp_tensor::Error::UnsupportedDType { op: $op, dtype: $dtype }))
    };
}

/// A mode chosen by name, as PyTorch's string arguments (`padding_mode="reflect"`,
/// `reduction="sum"`): the enum, `as_str`, `Display` (padded as a string) and
/// `FromStr`, each variant with its one spelling. Any other string is the error the
/// `else` closure makes of it (`|other| -> ErrorType { ... }`).
#[doc(hidden)]
#[macro_export]
macro_rules! named_mode {
    (
        $(#[$m:meta])*
        pub enum $E:ident { $($(#[$vm:meta])* $V:ident = $s:literal,)+ }
        else |$other:ident| -> $Err:ty { $err:expr }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $E {
            $($(#[$vm])* $V,)+
        }

        impl $E {
            /// The name PyTorch spells the mode with.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$V => $s,)+
                }
            }
        }

        impl ::std::fmt::Display for $E {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl ::std::str::FromStr for $E {
            type Err = $Err;
            fn from_str($other: &str) -> ::std::result::Result<Self, $Err> {
                match $other {
                    $($s => Ok(Self::$V),)+
                    _ => Err($err),
                }
            }
        }
    };
}

/// Fail unless `t` has a floating dtype.
pub fn ensure_float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_floating_point() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
        })
    }
}

/// Fail unless every tensor is on the first one's device.
pub fn ensure_same_device(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    if let Some(first) = ts.first() {
        for t in &ts[1..] {
            if t.device() != first.device() {
                return Err(Error::DeviceMismatch {
                    op,
                    lhs: first.device(),
                    rhs: t.device(),
                });
            }
        }
    }
    Ok(())
}

/// The device of an op's tensors when they are on a CUDA device, `None` when they are
/// all host tensors. A 0-dim host tensor goes along with device tensors as a scalar
/// (PyTorch's rule); any other mix is PyTorch's [`Error::DeviceMismatch`].
pub fn device_of(op: &'static str, ts: &[&Tensor]) -> Result<Option<Device>> {
    let Some(dev) = ts.iter().map(|t| t.device()).find(|d| !d.is_cpu()) else {
        return Ok(None);
    };
    for t in ts {
        if t.device() != dev && !(t.device().is_cpu() && t.rank() == 0) {
            return Err(Error::DeviceMismatch {
                op,
                lhs: dev,
                rhs: t.device(),
            });
        }
    }
    Ok(Some(dev))
}

/// The first line of every op family's public entry: when the tensors are on a CUDA
/// device, return the family's device route (`crate::cuda::route`) instead of running
/// the host kernel. Compiles to nothing without the `cuda` feature (no device tensor
/// can exist then).
macro_rules! on_device {
    ($op:expr, [$($t:expr),+ $(,)?], $route:expr) => {
        #[cfg(feature = "cuda")]
        if $crate::compute::device_of($op, &[$($t),+])?.is_some() {
            return $route;
        }
    };
}
pub(crate) use on_device;

/// Call `f` with the elements of `t` as a contiguous row-major slice of `T`
/// (copying only when `t` is not contiguous). `T` must be `t`'s element type.
/// [`amp_tensor::Error::OutOfMemory`] when the copy cannot be allocated.
pub fn with_slice<T: Element, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    let c = t.try_contiguous()?;
    let st = c.storage();
    let all = T::slice(st.cpu()?).expect("with_slice: T must be the tensor's element type");
    let r = c.layout().contiguous_range().expect("contiguous");
    Ok(f(&all[r]))
}

/// The first error of tasks run by `amp_tensor::parallel` (whose closures return
/// nothing): each task records its outcome, and the caller returns the first failure
/// once they have all run.
pub(crate) struct FirstError(std::sync::Mutex<Option<Error>>);

impl FirstError {
    pub(crate) fn new() -> Self {
        FirstError(std::sync::Mutex::new(None))
    }

    /// Keep `r`'s error unless one is already kept.
    pub(crate) fn record(&self, r: Result<()>) {
        if let Err(e) = r {
            let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(e);
        }
    }

    /// The first recorded error, if any.
    pub(crate) fn into_result(self) -> Result<()> {
        match self.0.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Elements per chunk when widening 16-bit floats for compute.
pub const CHUNK: usize = 1024;

/// Map `src` (storage `T`) through `f` in compute type `C` into `dst`, widening and
/// narrowing in chunks so 16-bit types use the vectorised casts.
#[inline]
pub fn map_chunked<T: Element, C: Real, U: Element>(src: &[T], dst: &mut [U], f: impl Fn(C) -> C) {
    let mut buf = [C::zero(); CHUNK];
    for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(CHUNK)) {
        let b = &mut buf[..s.len()];
        cast_into(s, b);
        for v in b.iter_mut() {
            *v = f(*v);
        }
        cast_into(b, d);
    }
}

/// The dtype a floating result of `dtype` inputs has (ints promote to float32 where
/// PyTorch does for float-only ops such as `exp`).
pub fn float_result_dtype(dtype: DType) -> DType {
    if dtype.is_floating_point() {
        dtype
    } else {
        DType::F32
    }
}
