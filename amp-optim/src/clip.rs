//! Gradient clipping (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`).

use amp_autograd::Tensor;
use amp_tensor::Tensor as Raw;

use crate::update::{computes_in_f64, update, Real};
use crate::{Error, Result};

/// Scale the gradients of `params` in place so their total `norm_type`-norm is at
/// most `max_norm`; returns the total norm before clipping (a 0-dim tensor: float64 when
/// every gradient is float64, else float32, in which the arithmetic is also done).
/// As PyTorch: the coefficient is `max_norm / (total + 1e-6)` clamped to 1, and it is
/// applied even when it is 1.
///
/// ```
/// use amp_autograd::Tensor;
/// use amp_optim::{clip_grad_norm_, ClipGradNormOptions};
///
/// let w = Tensor::from_vec(vec![0.0f32, 0.0], [2])?;
/// w.set_grad(Some(Tensor::from_vec(vec![3.0f32, 4.0], [2])?))?;
/// let total = clip_grad_norm_(&[w.clone()], 1.0, ClipGradNormOptions::default())?;
/// assert_eq!(total.item_f64()?, 5.0);
/// let g = w.grad().unwrap().to_vec_f64();
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, opts: ClipGradNormOptions) -> Result<Raw> {
    let ClipGradNormOptions {
        norm_type,
        error_if_nonfinite,
    } = opts;
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    if grads.is_empty() {
        return Ok(Raw::scalar(0.0f32));
    }
    if grads.iter().all(|g| computes_in_f64(g.dtype())) {
        clip_norm_in::<f64>(&grads, max_norm, norm_type, error_if_nonfinite)
    } else {
        clip_norm_in::<f32>(&grads, max_norm, norm_type, error_if_nonfinite)
    }
}

/// Options of [`clip_grad_norm_`], PyTorch's defaults: the 2-norm, no error on a
/// non-finite total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipGradNormOptions {
    /// The norm (`f64::INFINITY` for the max-norm).
    pub norm_type: f64,
    /// Fail with [`Error::NonFiniteNorm`] when the total norm is inf or NaN.
    pub error_if_nonfinite: bool,
}

impl Default for ClipGradNormOptions {
    fn default() -> Self {
        ClipGradNormOptions {
            norm_type: 2.0,
            error_if_nonfinite: false,
        }
    }
}

fn clip_norm_in<F: Real>(
    grads: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Raw> {
    let norms: Vec<f64> = grads
        .iter()
        .map(|g| Ok(amp_kernels::norm(g.data(), norm_type, &[], false)?.item_f64()?))
        .collect::<Result<_>>()?;
    let total = if norm_type.is_infinite() {
        norms.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
    } else {
        let stacked = Raw::from_vec(
            norms.iter().map(|&n| F::of(n)).collect::<Vec<F>>(),
            [norms.len()],
        )?;
        amp_kernels::norm(&stacked, norm_type, &[], false)?.item_f64()?
    };
    let total = F::of(total);
    if error_if_nonfinite && !total.is_finite() {
        return Err(Error::NonFiniteNorm { norm_type });
    }
    let coef = (F::of(max_norm) / (total + F::of(1e-6))).min(F::one());
    for g in grads {
        update::<F>(g.data(), |v| v.iter_mut().for_each(|x| *x *= coef))?;
    }
    Ok(Raw::scalar(total))
}

/// `torch.clamp(x, lo, hi)` of one element: `min(max(x, lo), hi)` with NaN (of `x` or a
/// bound) propagating, so `lo > hi` gives `hi` as in PyTorch (`f32::clamp` would panic).
fn clamp<F: Real>(x: F, lo: F, hi: F) -> F {
    if x.is_nan() || lo.is_nan() || hi.is_nan() {
        return F::nan();
    }
    let x = if x < lo { lo } else { x };
    if x > hi {
        hi
    } else {
        x
    }
}

/// Clamp every gradient of `params` into `[-clip_value, clip_value]` in place (as
/// PyTorch: a negative `clip_value` sets every gradient to it, a NaN one makes them NaN).
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    for g in params.iter().filter_map(|p| p.grad()) {
        if computes_in_f64(g.dtype()) {
            update::<f64>(g.data(), |v| {
                v.iter_mut()
                    .for_each(|x| *x = clamp(*x, -clip_value, clip_value))
            })?;
        } else {
            let c = clip_value as f32;
            update::<f32>(g.data(), |v| {
                v.iter_mut().for_each(|x| *x = clamp(*x, -c, c))
            })?;
        }
    }
    Ok(())
}
