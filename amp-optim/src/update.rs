//! In-place elementwise updates of parameters and state, computed in float64 for float64
//! parameters and in float32 for every other dtype (PyTorch's "opmath" type), whatever the
//! parameter's storage dtype.

use amp_autograd::Tensor;
use amp_tensor::{scatter_cast, with_dtype, DType, Element, Layout, Tensor as Raw};

use crate::Result;

/// The compute type of an update: `f32` or `f64`.
pub(crate) trait Real:
    Element
    + num_traits::Float
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
{
    /// `v` rounded to this type.
    fn of(v: f64) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn of(v: f64) -> f32 {
        v as f32
    }
}

impl Real for f64 {
    #[inline(always)]
    fn of(v: f64) -> f64 {
        v
    }
}

/// Tensors at least `4 * CHUNK` long are updated over rayon, `CHUNK` elements a task
/// (each element is computed the same way whatever the split).
const CHUNK: usize = 1 << 16;

fn parallel(len: usize) -> bool {
    len >= 4 * CHUNK
}

/// `p += a * d` elementwise.
pub(crate) fn axpy<F: Real>(p: &mut [F], d: &[F], a: F) {
    use rayon::prelude::*;
    let body = |p: &mut [F], d: &[F]| p.iter_mut().zip(d).for_each(|(p, d)| *p += a * *d);
    if parallel(p.len()) {
        p.par_chunks_mut(CHUNK)
            .zip(d.par_chunks(CHUNK))
            .for_each(|(p, d)| body(p, d));
    } else {
        body(p, d);
    }
}

/// `f(p[i], g[i], b[i])` for every element (a fused optimizer step with one state buffer).
pub(crate) fn zip3<F: Real>(
    p: &mut [F],
    g: &[F],
    b: &mut [F],
    f: impl Fn(&mut F, F, &mut F) + Sync,
) {
    use rayon::prelude::*;
    let body = |p: &mut [F], g: &[F], b: &mut [F]| {
        p.iter_mut()
            .zip(g)
            .zip(b.iter_mut())
            .for_each(|((p, &g), b)| f(p, g, b))
    };
    if parallel(p.len()) {
        p.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(b.par_chunks_mut(CHUNK))
            .for_each(|((p, g), b)| body(p, g, b));
    } else {
        body(p, g, b);
    }
}

/// `f(p[i], g[i], m[i], v[i])` for every element (a fused step with two state buffers).
pub(crate) fn zip4<F: Real>(
    p: &mut [F],
    g: &[F],
    m: &mut [F],
    v: &mut [F],
    f: impl Fn(&mut F, F, &mut F, &mut F) + Sync,
) {
    use rayon::prelude::*;
    let body = |p: &mut [F], g: &[F], m: &mut [F], v: &mut [F]| {
        p.iter_mut()
            .zip(g)
            .zip(m.iter_mut())
            .zip(v.iter_mut())
            .for_each(|(((p, &g), m), v)| f(p, g, m, v))
    };
    if parallel(p.len()) {
        p.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .for_each(|(((p, g), m), v)| body(p, g, m, v));
    } else {
        body(p, g, m, v);
    }
}

/// Whether `t` can be read and updated where it lies as an `F` slice (dtype `F`,
/// contiguous, in host memory): the fused paths' condition.
pub(crate) fn in_place<F: Real>(t: &Raw) -> bool {
    t.dtype() == F::DTYPE && t.is_contiguous() && t.device().is_cpu()
}

/// `f` over the values of an [`in_place`] tensor, where they lie.
pub(crate) fn with_slice<F: Real, R>(t: &Raw, f: impl FnOnce(&[F]) -> R) -> R {
    let st = t.storage();
    let r = t.layout().contiguous_range().expect("contiguous");
    f(&F::slice(st.cpu().expect("in_place: a host tensor")).expect("dtype matches storage")[r])
}

/// `f` over the values of an [`in_place`] tensor, mutably, where they lie.
pub(crate) fn with_slice_mut<F: Real, R>(t: &Raw, f: impl FnOnce(&mut [F]) -> R) -> R {
    let mut st = t.storage_mut();
    let r = t.layout().contiguous_range().expect("contiguous");
    f(
        &mut F::slice_mut(st.cpu_mut().expect("in_place: a host tensor"))
            .expect("dtype matches storage")[r],
    )
}

/// Whether a parameter of `dtype` is updated in float64 (else float32).
pub(crate) fn computes_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

/// The elements of `t` as `F`, in row-major order.
pub(crate) fn read<F: Real>(t: &Raw) -> Vec<F> {
    if in_place::<F>(t) {
        return with_slice(t, <[F]>::to_vec);
    }
    t.to_vec_as::<F>()
}

/// Run `f` over the tensor's values as a mutable `F` slice and write them back (in place
/// when the tensor is contiguous and of dtype `F`).
pub(crate) fn update<F: Real>(p: &Raw, f: impl FnOnce(&mut [F])) -> Result<()> {
    if in_place::<F>(p) {
        with_slice_mut(p, f);
        return Ok(());
    }
    let mut v = p.to_vec_as::<F>();
    f(&mut v);
    let mut st = p.storage_mut();
    let layout: Layout = p.layout().clone();
    with_dtype!(p.dtype(), D => scatter_cast::<F, D>(&v, D::slice_mut(st.cpu_mut()?).expect("dtype"), &layout));
    Ok(())
}

/// A zero-initialised state buffer of a parameter's shape, in its compute type (float64
/// for float64 parameters, float32 otherwise).
pub(crate) fn zeros_state(p: &Tensor) -> Raw {
    Raw::zeros_on(p.dims(), state_dtype(p.dtype()), p.device()).unwrap_or_else(|e| panic!("{e}"))
}

/// Tensor arithmetic for the device updates: each is one device kernel over tensors of
/// the compute type, rounding as the host loops do (the scalar in the compute type).
pub(crate) mod dev {
    use amp_kernels::{binary, binary_scalar, unary, BinaryOp, UnaryOp};
    use amp_tensor::{Result, Tensor as Raw};

    /// `a * s`.
    pub(crate) fn scale(a: &Raw, s: f64) -> Result<Raw> {
        binary_scalar(BinaryOp::Mul, a, s)
    }
    /// `a + s * b` (the product rounded first, as `a += s * b` on the host).
    pub(crate) fn axpy(a: &Raw, b: &Raw, s: f64) -> Result<Raw> {
        binary(BinaryOp::Add, a, &scale(b, s)?)
    }
    /// `a op b`.
    pub(crate) fn op(o: BinaryOp, a: &Raw, b: &Raw) -> Result<Raw> {
        binary(o, a, b)
    }
    /// `-a`.
    pub(crate) fn neg(a: &Raw) -> Result<Raw> {
        unary(UnaryOp::Neg, a)
    }
    /// `sqrt(a)`.
    pub(crate) fn sqrt(a: &Raw) -> Result<Raw> {
        unary(UnaryOp::Sqrt, a)
    }
    /// `a / s` for a scalar.
    pub(crate) fn div(a: &Raw, s: f64) -> Result<Raw> {
        binary_scalar(BinaryOp::Div, a, s)
    }
    /// `a + s` for a scalar.
    pub(crate) fn add(a: &Raw, s: f64) -> Result<Raw> {
        binary_scalar(BinaryOp::Add, a, s)
    }
}

/// The dtype of the state of a parameter of `dtype`: its compute type.
pub(crate) fn state_dtype(dtype: DType) -> DType {
    if computes_in_f64(dtype) {
        DType::F64
    } else {
        DType::F32
    }
}
