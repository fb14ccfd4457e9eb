//! In-place elementwise updates of parameters and state, computed in float32 (or
//! float64 for float64 parameters) whatever the parameter's storage dtype.

use amp_autograd::Tensor;
use amp_tensor::{scatter_cast, with_dtype, Element, Layout, Tensor as Raw};

use crate::Result;

/// The elements of `t` as f32, in row-major order.
pub(crate) fn read_f32(t: &Raw) -> Vec<f32> {
    if t.dtype() == amp_tensor::DType::F32 && t.is_contiguous() {
        let st = t.storage();
        let r = t.layout().contiguous_range().expect("contiguous");
        return f32::slice(st.cpu()).expect("f32")[r].to_vec();
    }
    t.to_vec_as::<f32>()
}

/// Run `f` over the parameter's values as a mutable f32 slice and write them back
/// (in place when the parameter is contiguous float32).
pub(crate) fn update_f32(p: &Raw, f: impl FnOnce(&mut [f32])) -> Result<()> {
    if p.dtype() == amp_tensor::DType::F32 && p.is_contiguous() {
        let mut st = p.storage_mut();
        let r = p.layout().contiguous_range().expect("contiguous");
        f(&mut f32::slice_mut(st.cpu_mut()).expect("f32")[r]);
        return Ok(());
    }
    let mut v = p.to_vec_as::<f32>();
    f(&mut v);
    let mut st = p.storage_mut();
    let layout: Layout = p.layout().clone();
    with_dtype!(p.dtype(), D => scatter_cast::<f32, D>(&v, D::slice_mut(st.cpu_mut()).expect("dtype"), &layout));
    Ok(())
}

/// A float32 state buffer of a parameter's shape, zero-initialised.
pub(crate) fn zeros_state(p: &Tensor) -> Raw {
    Raw::zeros(p.dims(), amp_tensor::DType::F32)
}
