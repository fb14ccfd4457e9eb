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

/// `p += a * d` elementwise, over rayon in large chunks for large tensors (each element
/// is computed the same way whatever the split).
pub(crate) fn axpy<F: Real>(p: &mut [F], d: &[F], a: F) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let body = |p: &mut [F], d: &[F]| p.iter_mut().zip(d).for_each(|(p, d)| *p += a * *d);
    if p.len() >= 4 * CHUNK {
        p.par_chunks_mut(CHUNK)
            .zip(d.par_chunks(CHUNK))
            .for_each(|(p, d)| body(p, d));
    } else {
        body(p, d);
    }
}

/// Whether a parameter of `dtype` is updated in float64 (else float32).
pub(crate) fn computes_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

/// The elements of `t` as `F`, in row-major order.
pub(crate) fn read<F: Real>(t: &Raw) -> Vec<F> {
    if t.dtype() == F::DTYPE && t.is_contiguous() {
        let st = t.storage();
        let r = t.layout().contiguous_range().expect("contiguous");
        return F::slice(st.cpu()).expect("dtype matches storage")[r].to_vec();
    }
    t.to_vec_as::<F>()
}

/// Run `f` over the tensor's values as a mutable `F` slice and write them back (in place
/// when the tensor is contiguous and of dtype `F`).
pub(crate) fn update<F: Real>(p: &Raw, f: impl FnOnce(&mut [F])) -> Result<()> {
    if p.dtype() == F::DTYPE && p.is_contiguous() {
        let mut st = p.storage_mut();
        let r = p.layout().contiguous_range().expect("contiguous");
        f(&mut F::slice_mut(st.cpu_mut()).expect("dtype matches storage")[r]);
        return Ok(());
    }
    let mut v = p.to_vec_as::<F>();
    f(&mut v);
    let mut st = p.storage_mut();
    let layout: Layout = p.layout().clone();
    with_dtype!(p.dtype(), D => scatter_cast::<F, D>(&v, D::slice_mut(st.cpu_mut()).expect("dtype"), &layout));
    Ok(())
}

/// A zero-initialised state buffer of a parameter's shape, in its compute type (float64
/// for float64 parameters, float32 otherwise).
pub(crate) fn zeros_state(p: &Tensor) -> Raw {
    let dtype = if computes_in_f64(p.dtype()) {
        DType::F64
    } else {
        DType::F32
    };
    Raw::zeros(p.dims(), dtype)
}
