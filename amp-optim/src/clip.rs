//! Gradient clipping (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`).

use amp_autograd::Tensor;
use amp_tensor::Tensor as Raw;

use crate::update::update_f32;
use crate::{Error, Result};

/// Scale the gradients of `params` in place so their total `norm_type`-norm is at
/// most `max_norm`; returns the total norm before clipping (a 0-dim float32 tensor).
/// As PyTorch: the coefficient is `max_norm / (total + 1e-6)` clamped to 1, and it is
/// applied even when it is 1.
pub fn clip_grad_norm_(
    params: &[Tensor],
    max_norm: f64,
    norm_type: f64,
    error_if_nonfinite: bool,
) -> Result<Raw> {
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    if grads.is_empty() {
        return Ok(Raw::scalar(0.0f32));
    }
    let norms: Vec<f64> = grads
        .iter()
        .map(|g| Ok(amp_kernels::norm(g.data(), norm_type, &[], false)?.item_f64()?))
        .collect::<Result<_>>()?;
    let total = if norm_type.is_infinite() {
        norms.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
    } else {
        let stacked = Raw::from_vec(
            norms.iter().map(|&n| n as f32).collect::<Vec<_>>(),
            [norms.len()],
        )?;
        amp_kernels::norm(&stacked, norm_type, &[], false)?.item_f64()?
    };
    let total32 = total as f32;
    if error_if_nonfinite && !total32.is_finite() {
        return Err(Error::NonFiniteNorm { norm_type });
    }
    let coef = ((max_norm as f32) / (total32 + 1e-6)).min(1.0);
    for g in &grads {
        update_f32(g.data(), |v| v.iter_mut().for_each(|x| *x *= coef))?;
    }
    Ok(Raw::scalar(total32))
}

/// Clamp every gradient of `params` into `[-clip_value, clip_value]` in place.
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    let c = clip_value as f32;
    for g in params.iter().filter_map(|p| p.grad()) {
        update_f32(g.data(), |v| v.iter_mut().for_each(|x| *x = x.clamp(-c, c)))?;
    }
    Ok(())
}
