//! Batch normalisation (`torch.nn.functional.batch_norm`): per-channel statistics over
//! every dim but dim 1, the batch's in training (updating the running statistics in
//! place), the running ones in evaluation.
//!
//! The forward is a composite of differentiable ops (mean, variance, `rsqrt`, products),
//! so its first and second derivatives are those of the formula, as PyTorch's
//! `native_batch_norm` backward and its double backward give. Float16/bfloat16 inputs
//! are normalised in float32 and the result cast back to the input's dtype, as PyTorch's
//! CPU kernel accumulates in float32. The op is opaque to autocast (it is on no list):
//! its inner ops run with the layer excluded.

use super::check::{self, refused};
use super::enter_vec;
use super::loss_extra::{acc, back};
use super::names::BATCH_NORM;
use super::pointwise::*;
use super::reduce::mean;
use super::shape::reshape;
use crate::grad_mode::no_grad;
use crate::{Error, Result, Tensor};

/// `(x - mean) / sqrt(var + eps) * weight + bias` per channel (dim 1 of `x`).
///
/// In training the statistics are the batch's (biased variance); when given,
/// `running_mean` and `running_var` are updated in place to
/// `(1 - momentum) * running + momentum * batch` (the unbiased variance for
/// `running_var`), outside the graph. In evaluation the running statistics are used and
/// must be given. `weight`, `bias` and the running statistics have one element per
/// channel.
///
/// ```
/// use amp_autograd::{ops, Tensor};
/// # fn main() -> amp_autograd::Result<()> {
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 5.0], [2, 2])?;
/// let (rm, rv) = (Tensor::zeros([2], x.dtype()), Tensor::ones([2], x.dtype()));
/// let y = ops::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5)?;
/// let v = y.to_vec_f64();
/// assert!((v[0] + 1.0).abs() < 1e-3 && (v[2] - 1.0).abs() < 1e-3);
/// assert!((rm.to_vec_f64()[1] - 0.35).abs() < 1e-6); // 0.9 * 0 + 0.1 * 3.5
/// # Ok(())
/// # }
/// ```
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "batch_norm";
    let mut args = vec![x];
    args.extend(weight);
    args.extend(bias);
    let (a, _body) = enter_vec(&BATCH_NORM, &args)?;
    let x = &a[0];
    let w = weight.map(|_| &a[1]);
    let b = bias.map(|_| &a[1 + weight.is_some() as usize]);
    check::norm_parameters(OP, x, w, b)?;
    if x.rank() < 2 {
        return Err(refused(
            OP,
            format!(
                "batch_norm(): expected input to have at least 2 dimensions, but got {}",
                x.rank()
            ),
        ));
    }
    let dims = x.dims().to_vec();
    let c = dims[1];
    let per_channel = x.elem_count() / c.max(1);
    for (name, t) in [
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", w),
        ("bias", b),
    ] {
        if let Some(t) = t {
            if t.elem_count() != c {
                return Err(refused(
                    OP,
                    format!("{name} should contain {c} elements not {}", t.elem_count()),
                ));
            }
        }
    }
    let mut cs = vec![1usize; dims.len()];
    cs[1] = c;
    let outer: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != 1).collect();
    let dt = x.dtype();
    let xa = acc(x)?;
    let (mu, var) = if training {
        if per_channel <= 1 {
            return Err(refused(
                OP,
                format!(
                    "Expected more than 1 value per channel when training, got input size {}",
                    check::torch_size(&dims)
                ),
            ));
        }
        let mu = mean(&xa, &outer, true, None)?;
        let var = mean(&square(&sub(&xa, &mu)?)?, &outer, true, None)?;
        update_running(running_mean, running_var, &mu, &var, momentum, per_channel)?;
        (mu, var)
    } else {
        let (Some(rm), Some(rv)) = (running_mean, running_var) else {
            return Err(Error::invalid(
                OP,
                "running_mean and running_var must be defined in evaluation mode",
            ));
        };
        (
            reshape(&acc(&rm.detach())?, cs.clone())?,
            reshape(&acc(&rv.detach())?, cs.clone())?,
        )
    };
    let mut y = mul(&sub(&xa, &mu)?, &rsqrt(&add_scalar(&var, eps)?)?)?;
    if let Some(w) = w {
        y = mul(&y, &reshape(&acc(w)?, cs.clone())?)?;
    }
    if let Some(b) = b {
        y = add(&y, &reshape(&acc(b)?, cs.clone())?)?;
    }
    back(y, dt)
}

/// `running = (1 - momentum) * running + momentum * batch` in place, outside the graph,
/// with the unbiased batch variance (`n` values per channel).
fn update_running(
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    mu: &Tensor,
    var: &Tensor,
    momentum: f64,
    n: usize,
) -> Result<()> {
    no_grad(|| -> Result<()> {
        let unbiased = n as f64 / (n as f64 - 1.0);
        for (running, batch, scale) in [(running_mean, mu, 1.0), (running_var, var, unbiased)] {
            let Some(r) = running else { continue };
            let batch = reshape(&batch.detach(), r.dims().to_vec())?;
            let new = add(
                &mul_scalar(&r.detach(), 1.0 - momentum)?,
                &mul_scalar(&batch, momentum * scale)?,
            )?;
            r.data().copy_(new.to_dtype(r.dtype())?.data())?;
        }
        Ok(())
    })
}
