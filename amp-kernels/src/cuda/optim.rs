//! Fused optimizer steps on device tensors: one launch of the `optim` module's
//! `sgd_step_*` / `adam_step_*` updates a parameter, its state and (Adam) unscales its
//! gradient on the device, where the op-by-op path takes five to twelve launches and
//! as many temporaries. The kernels repeat the host update's operations in its order
//! (see `sources::OPTIM`), so float32 and float64 parameters get the host's bits.

use std::sync::{Arc, RwLockReadGuard};

use amp_tensor::cuda::cudarc::driver::{CudaFunction, PushKernelArg};
use amp_tensor::cuda::launch::{function, grid_for, suffix};
use amp_tensor::cuda::{device_context, DeviceContext};
use amp_tensor::{DType, Result, Storage, Tensor};

/// Hyper-parameters of one SGD step (PyTorch's `SGD`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: no buffer).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Ascend instead of descend.
    pub maximize: bool,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// Hyper-parameters of one Adam/AdamW step, its bias corrections already taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// `lr / (1 - beta1^step)`.
    pub step_size: f64,
    /// `sqrt(1 - beta2^step)`.
    pub bc2_sqrt: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay (coupled: added to the gradient; decoupled: see `decay`).
    pub weight_decay: f64,
    /// AdamW's factor `1 - lr * weight_decay` on the parameter.
    pub decay: f64,
    /// Ascend instead of descend.
    pub maximize: bool,
    /// AdamW's decoupled weight decay.
    pub decoupled: bool,
}

/// The state dtype of a parameter of `dtype`: float64 for float64, else float32.
fn state_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Whether the fused kernel can run on `p` (a float device tensor), its gradient `g`
/// and its state `state` in place: all contiguous on `p`'s device, `g` of `p`'s dtype,
/// the state of the compute type, one element count, no two sharing a buffer.
fn fits(p: &Tensor, g: &Tensor, state: &[&Tensor]) -> bool {
    let dev = p.device();
    let n = p.elem_count();
    let sd = state_dtype(p.dtype());
    let all: Vec<&Tensor> = [p, g].into_iter().chain(state.iter().copied()).collect();
    p.dtype().is_floating_point()
        && !dev.is_cpu()
        && g.dtype() == p.dtype()
        && state.iter().all(|s| s.dtype() == sd)
        && all
            .iter()
            .all(|t| t.device() == dev && t.is_contiguous() && t.elem_count() == n)
        && all
            .iter()
            .enumerate()
            .all(|(i, a)| all[i + 1..].iter().all(|b| !a.same_storage(b)))
}

/// The read locks of `ts` (which keep their buffers in place until the launch is
/// queued) and the device address of each one's first element (0 for an absent one).
fn addresses<'a, const N: usize>(
    ts: [Option<&'a Tensor>; N],
) -> Result<(Vec<RwLockReadGuard<'a, Storage>>, [u64; N])> {
    let mut guards = Vec::with_capacity(N);
    let mut out = [0u64; N];
    for (o, t) in out.iter_mut().zip(ts) {
        if let Some(t) = t {
            let g = t.storage();
            *o = super::route::addr(&g, t)?;
            guards.push(g);
        }
    }
    Ok((guards, out))
}

/// The `optim` module's kernel `family` for `p`'s dtype, on `p`'s device.
fn kernel(p: &Tensor, family: &str) -> Result<(Arc<DeviceContext>, CudaFunction)> {
    let dc = device_context(p.device())?;
    let m = super::sources::module("optim").expect("the module list names optim");
    let f = function(&dc, m, &format!("{family}_{}", suffix(p.dtype())))?;
    Ok((dc, f))
}

/// One SGD step of `p` from `g`, in place, with the momentum buffer `buf` (of the
/// compute type; `first`: it holds nothing yet and is written, not read).
/// `Ok(false)` (nothing done) when the tensors do not fit the fused kernel (see
/// `fits`): the caller's op-by-op path runs instead.
///
/// # Errors
/// Device errors.
pub fn sgd_step(
    p: &Tensor,
    g: &Tensor,
    buf: Option<&Tensor>,
    first: bool,
    h: &SgdStep,
) -> Result<bool> {
    let state: Vec<&Tensor> = buf.into_iter().collect();
    if !fits(p, g, &state) || (h.momentum != 0.0) != buf.is_some() {
        return Ok(false);
    }
    let n = p.elem_count();
    if n == 0 {
        return Ok(true);
    }
    let (dc, f) = kernel(p, "sgd_step")?;
    let flags = i32::from(h.maximize)
        | (i32::from(h.weight_decay != 0.0) << 1)
        | (i32::from(h.nesterov) << 2)
        | (i32::from(first) << 3)
        | (i32::from(h.momentum != 0.0) << 4);
    let (_locks, [pp, gp, bp]) = addresses([Some(p), Some(g), buf])?;
    let (n64, damp) = (n as i64, 1.0 - h.dampening);
    amp_tensor::cuda_launch!(
        dc,
        f,
        grid_for(n),
        &pp,
        &gp,
        &bp,
        &n64,
        &h.lr,
        &h.momentum,
        &damp,
        &h.weight_decay,
        &flags
    );
    Ok(true)
}

/// One Adam/AdamW step of `p` from `g`, in place, with the moments `m`, `v` and the
/// amsgrad maximum `vmax` (of the compute type). With `grad_scale` (a 1-element float32
/// device tensor) the gradient is divided by it on the device, inside the update.
/// `Ok(false)` (nothing done) when the tensors do not fit the fused kernel.
///
/// # Errors
/// Device errors.
pub fn adam_step(
    p: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    vmax: Option<&Tensor>,
    grad_scale: Option<&Tensor>,
    h: &AdamStep,
) -> Result<bool> {
    let state: Vec<&Tensor> = [m, v].into_iter().chain(vmax).collect();
    let scale_fits = grad_scale
        .is_none_or(|s| s.dtype() == DType::F32 && s.elem_count() == 1 && s.device() == p.device());
    if !fits(p, g, &state) || !scale_fits {
        return Ok(false);
    }
    let n = p.elem_count();
    if n == 0 {
        return Ok(true);
    }
    let (dc, f) = kernel(p, "adam_step")?;
    let flags = i32::from(h.maximize)
        | (i32::from(h.weight_decay != 0.0) << 1)
        | (i32::from(h.decoupled) << 2);
    let (_locks, [pp, gp, mp, vp, xp, scp]) =
        addresses([Some(p), Some(g), Some(m), Some(v), vmax, grad_scale])?;
    let n64 = n as i64;
    amp_tensor::cuda_launch!(
        dc,
        f,
        grid_for(n),
        &pp,
        &gp,
        &mp,
        &vp,
        &xp,
        &n64,
        &scp,
        &h.step_size,
        &h.bc2_sqrt,
        &h.beta1,
        &h.beta2,
        &h.eps,
        &h.weight_decay,
        &h.decay,
        &flags
    );
    Ok(true)
}
