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

/// One parameter of a multi-tensor Adam/AdamW step ([`adam_steps`]): the parameter,
/// its gradient, the moments `m`, `v` and the amsgrad maximum `vmax` (of the compute
/// type), and its step's constants.
#[derive(Debug, Clone, Copy)]
pub struct AdamTensors<'a> {
    /// The parameter, updated in place.
    pub p: &'a Tensor,
    /// Its gradient (the parameter's dtype).
    pub g: &'a Tensor,
    /// First moment.
    pub m: &'a Tensor,
    /// Second moment.
    pub v: &'a Tensor,
    /// The running maximum of `v` (amsgrad).
    pub vmax: Option<&'a Tensor>,
    /// The step's constants (each parameter its own bias corrections).
    pub step: AdamStep,
}

/// The table row of one chunk (`AdamChunk` in the sources).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AdamChunk {
    p: u64,
    g: u64,
    m: u64,
    v: u64,
    vmax: u64,
    len: i64,
    dtype: i64,
    hyper: i64,
}

/// The device bytes `t` may touch: its elements' range when contiguous, else its whole
/// buffer; `None` on the host.
fn bytes(t: &Tensor) -> Result<Option<(u64, u64)>> {
    if t.device().is_cpu() {
        return Ok(None);
    }
    let st = t.storage();
    let size = t.dtype().size_in_bytes() as u64;
    Ok(Some(if t.is_contiguous() {
        let start = super::route::addr(&st, t)?;
        (start, start + t.elem_count() as u64 * size)
    } else {
        let buf = st.cuda()?;
        (buf.device_ptr(), buf.device_ptr() + buf.len() as u64 * size)
    }))
}

/// Adam/AdamW steps of many parameters in one launch per device (PyTorch's
/// `fused=True`), in place; with `grad_scale` (a 1-element float32 tensor on the
/// parameters' device) every gradient is divided by it on the device, inside the
/// update. Returns, per parameter, whether it was updated: one that does not fit the
/// kernel (see `fits`: views, shared buffers, dtypes) or whose memory overlaps an
/// earlier parameter's where either writes it ([`later_overlaps`]) is left for the
/// caller's op-by-op path, to run after this call in order (stream order keeps such a
/// parameter's update after the earlier one's).
///
/// Each element goes through exactly the operations of the host update, in its order
/// (see [`super::sources::OPTIM`]): float32 and float64 parameters get the host's bits.
///
/// # Errors
/// Device errors.
pub fn adam_steps(params: &[AdamTensors<'_>], grad_scale: Option<&Tensor>) -> Result<Vec<bool>> {
    let mut fit = Vec::with_capacity(params.len());
    let mut spans: Vec<MemSpan> = Vec::new();
    for (i, t) in params.iter().enumerate() {
        let state: Vec<&Tensor> = [t.m, t.v].into_iter().chain(t.vmax).collect();
        let scale_fits = grad_scale.is_none_or(|s| {
            s.dtype() == DType::F32 && s.elem_count() == 1 && s.device() == t.p.device()
        });
        fit.push(fits(t.p, t.g, &state) && scale_fits);
        for (tensor, written) in [(t.p, true), (t.g, false), (t.m, true), (t.v, true)]
            .into_iter()
            .chain(t.vmax.map(|x| (x, true)))
        {
            if let Some(bytes) = bytes(tensor)? {
                spans.push(MemSpan {
                    bytes,
                    param: i,
                    written,
                });
            }
        }
    }
    let clash = later_overlaps(spans, params.len());
    let done: Vec<bool> = fit.iter().zip(&clash).map(|(f, c)| *f && !c).collect();
    let mut devices: Vec<amp_tensor::Device> = Vec::new();
    for (t, _) in params.iter().zip(&done).filter(|(_, d)| **d) {
        if !devices.contains(&t.p.device()) {
            devices.push(t.p.device());
        }
    }
    for dev in devices {
        let on: Vec<&AdamTensors<'_>> = params
            .iter()
            .zip(&done)
            .filter(|(t, d)| **d && t.p.device() == dev)
            .map(|(t, _)| t)
            .collect();
        launch_adam(&on, grad_scale)?;
    }
    Ok(done)
}

/// Device memory one parameter of a batch touches: its bytes, the parameter's place in
/// the batch, and whether the update writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemSpan {
    /// `[start, end)` device addresses.
    pub bytes: (u64, u64),
    /// The parameter's index in the batch.
    pub param: usize,
    /// Written (parameter, moments) rather than only read (gradient).
    pub written: bool,
}

/// Per parameter of a batch of `n`, whether its memory overlaps an earlier parameter's
/// where either writes it: such a parameter must wait for the earlier one's update
/// (the op-by-op path, after the launch). Sorted by start, each span is compared only
/// with the spans that begin before it ends: O(n log n) for disjoint parameters.
pub fn later_overlaps(mut spans: Vec<MemSpan>, n: usize) -> Vec<bool> {
    spans.retain(|s| s.bytes.0 < s.bytes.1);
    spans.sort_unstable_by_key(|s| s.bytes.0);
    let mut clash = vec![false; n];
    for (i, a) in spans.iter().enumerate() {
        for b in spans[i + 1..].iter().take_while(|b| b.bytes.0 < a.bytes.1) {
            if a.param != b.param && (a.written || b.written) {
                clash[a.param.max(b.param)] = true;
            }
        }
    }
    clash
}

/// One `adam_multi` launch over `params` (all fitting, on one device).
fn launch_adam(params: &[&AdamTensors<'_>], grad_scale: Option<&Tensor>) -> Result<()> {
    let Some(first) = params.iter().find(|t| t.p.elem_count() > 0) else {
        return Ok(());
    };
    let mut chunks: Vec<AdamChunk> = Vec::new();
    let chunk = super::host::multi_tensor_chunk(params.iter().map(|t| t.p.elem_count()).sum());
    let mut hypers: Vec<i64> = Vec::with_capacity(params.len() * 8);
    // The read locks keep every buffer in place until the launch is queued.
    let mut locks = Vec::with_capacity(params.len() * 5);
    for (row, t) in params.iter().enumerate() {
        let h = &t.step;
        let flags = i64::from(h.maximize)
            | (i64::from(h.weight_decay != 0.0) << 1)
            | (i64::from(h.decoupled) << 2);
        hypers.extend(
            [
                h.step_size,
                h.bc2_sqrt,
                h.beta1,
                h.beta2,
                h.eps,
                h.weight_decay,
                h.decay,
            ]
            .map(|x| x.to_bits() as i64),
        );
        hypers.push(flags);
        let (guards, [pp, gp, mp, vp, xp]) =
            addresses([Some(t.p), Some(t.g), Some(t.m), Some(t.v), t.vmax])?;
        locks.extend(guards);
        let code = match t.p.dtype() {
            DType::F16 => 0,
            DType::BF16 => 1,
            DType::F32 => 2,
            _ => 3,
        };
        let (ps, ss) = (
            t.p.dtype().size_in_bytes() as u64,
            state_dtype(t.p.dtype()).size_in_bytes() as u64,
        );
        let n = t.p.elem_count();
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let (a, b) = (start as u64 * ps, start as u64 * ss);
            chunks.push(AdamChunk {
                p: pp + a,
                g: gp + a,
                m: mp + b,
                v: vp + b,
                vmax: if xp == 0 { 0 } else { xp + b },
                len: len as i64,
                dtype: code,
                hyper: row as i64,
            });
            start += len;
        }
    }
    // Chunks, then the hyper-parameter rows, as one upload of int64 words (queued on
    // the launch's stream, so the cached buffer may be dropped right after).
    let nchunks = chunks.len();
    let mut words: Vec<i64> = chunks
        .iter()
        .flat_map(|c| {
            [
                c.p as i64,
                c.g as i64,
                c.m as i64,
                c.v as i64,
                c.vmax as i64,
                c.len,
                c.dtype,
                c.hyper,
            ]
        })
        .collect();
    words.extend(hypers);
    let table =
        Tensor::from_vec(words, [nchunks * 8 + params.len() * 8])?.to_device(first.p.device())?;
    let (_table_lock, [tp]) = addresses([Some(&table)])?;
    let (_scale_lock, [sp]) = addresses([grad_scale])?;
    let hp = tp + (nchunks * 8 * 8) as u64;
    let dc = device_context(first.p.device())?;
    let m = super::sources::module("optim").expect("the module list names optim");
    let f = function(&dc, m, "adam_multi")?;
    let cfg = amp_tensor::cuda::cudarc::driver::LaunchConfig {
        grid_dim: (nchunks.clamp(1, 65535 * 8) as u32, 1, 1),
        block_dim: (amp_tensor::cuda::launch::THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let nc = nchunks as i64;
    amp_tensor::cuda_launch!(dc, f, cfg, &tp, &nc, &hp, &sp);
    drop(locks);
    Ok(())
}

/// One Adam/AdamW step of `p` from `g`, in place, with the moments `m`, `v` and the
/// amsgrad maximum `vmax` (of the compute type): [`adam_steps`] for one parameter.
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
    let t = AdamTensors {
        p,
        g,
        m,
        v,
        vmax,
        step: *h,
    };
    Ok(adam_steps(&[t], grad_scale)?[0])
}
