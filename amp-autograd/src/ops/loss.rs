//! Losses: mse, l1, smooth_l1, huber, nll, cross_entropy, binary_cross_entropy (with
//! logits). Each enters the dispatch point under its documented name.

use amp_tensor::DType;

use super::names::{BCE, BCE_LOGITS, CROSS_ENTROPY, HUBER, L1, MSE, NLL, SMOOTH_L1};
use super::nn::{class_dim, log_softmax};
use super::pointwise::*;
use super::reduce::{mean_all, sum, sum_all};
use super::shape::{gather, index_select, permute, reshape, squeeze, unsqueeze};
use super::{enter, enter_vec};
use crate::dispatch::{BodyGuard, OpName};
use crate::{Error, Result, Tensor};

amp_kernels::named_mode! {
    /// How a loss reduces over elements.
    #[derive(Default)]
    pub enum Reduction {
        /// Keep per-element losses.
        None = "none",
        /// Average (the default).
        #[default]
        Mean = "mean",
        /// Sum.
        Sum = "sum",
    }
    else |other| -> Error { Error::invalid("reduction", format!("{other} is not a valid value for reduction")) }
}

pub(super) fn reduce(l: Tensor, r: Reduction) -> Result<Tensor> {
    match r {
        Reduction::None => Ok(l),
        Reduction::Mean => mean_all(&l),
        Reduction::Sum => sum_all(&l),
    }
}

/// `|input - target|` for the regression loss `op`, with the guard its body keeps.
fn abs_error(op: &'static OpName, input: &Tensor, target: &Tensor) -> Result<(Tensor, BodyGuard)> {
    let ([input, target], body) = enter(op, [input, target])?;
    Ok((abs(&sub(&input, &target)?)?, body))
}

/// The reduced piecewise loss: `quad` where `d < threshold`, `lin` elsewhere.
fn below_or(
    d: &Tensor,
    threshold: f64,
    quad: &Tensor,
    lin: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    reduce(where_(&lt_scalar(d, threshold)?, quad, lin)?, reduction)
}

/// Mean squared error.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let ([input, target], _body) = enter(&MSE, [input, target])?;
    reduce(square(&sub(&input, &target)?)?, reduction)
}

/// Mean absolute error.
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let (d, _body) = abs_error(&L1, input, target)?;
    reduce(d, reduction)
}

/// Smooth L1: quadratic below `beta`, linear above.
pub fn smooth_l1_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    beta: f64,
) -> Result<Tensor> {
    let (d, _body) = abs_error(&SMOOTH_L1, input, target)?;
    if beta == 0.0 {
        return reduce(d, reduction);
    }
    let quad = div_scalar(&mul_scalar(&square(&d)?, 0.5)?, beta)?;
    let lin = sub_scalar(&d, 0.5 * beta)?;
    below_or(&d, beta, &quad, &lin, reduction)
}

/// Huber loss with threshold `delta`.
pub fn huber_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    delta: f64,
) -> Result<Tensor> {
    let (d, _body) = abs_error(&HUBER, input, target)?;
    let quad = mul_scalar(&square(&d)?, 0.5)?;
    let lin = mul_scalar(&sub_scalar(&d, 0.5 * delta)?, delta)?;
    below_or(&d, delta, &quad, &lin, reduction)
}

/// Negative log-likelihood of class indices `target` under log-probabilities `input`
/// (`[N, C, ...]` or `[C]`), with optional class `weight` and `ignore_index`.
pub fn nll_loss(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: i64,
    reduction: Reduction,
) -> Result<Tensor> {
    let mut args = vec![input, target];
    args.extend(weight);
    let (a, _body) = enter_vec(&NLL, &args)?;
    super::check::nll_batch(&a[0], &a[1])?;
    super::check::floating(nll_kernel(&a[0]), &a[0])?;
    nll_impl(&a[0], &a[1], weight.map(|_| &a[2]), ignore_index, reduction)
}

fn nll_impl(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: i64,
    reduction: Reduction,
) -> Result<Tensor> {
    if target.dtype().is_floating_point() {
        return Err(Error::invalid(
            "nll_loss",
            format!("expected scalar type Long but found {}", target.dtype()),
        ));
    }
    // Move the class dim last and flatten: [M, C] log-probs, [M] targets.
    let cd = class_dim(input);
    let c = input.dims()[cd];
    let (lp, out_dims) = if input.rank() <= 2 {
        (
            if input.rank() == 1 {
                unsqueeze(input, 0)?
            } else {
                input.clone()
            },
            target.dims().to_vec(),
        )
    } else {
        let r = input.rank() as i64;
        let mut perm: Vec<i64> = vec![0];
        perm.extend(2..r);
        perm.push(1);
        (
            reshape(&permute(input, &perm)?, [-1, c as i64])?,
            target.dims().to_vec(),
        )
    };
    let tgt = reshape(target, [-1i64])?.to_dtype(DType::I64)?;
    let valid = ne_scalar(&tgt, ignore_index)?;
    let safe = where_(&valid, &tgt, &Tensor::scalar(0i64))?;
    let picked = squeeze(&gather(&lp, 1, &unsqueeze(&safe, 1)?)?, 1)?;
    let validf = valid.to_dtype(lp.dtype())?;
    let w = match weight {
        Some(w) => mul(&index_select(w, 0, &safe)?, &validf)?,
        None => validf,
    };
    let losses = neg(&mul(&picked, &w)?)?;
    match reduction {
        Reduction::None => reshape(&losses, out_dims),
        Reduction::Sum => sum_all(&losses),
        Reduction::Mean => div(&sum_all(&losses)?, &sum_all(&w)?),
    }
}

/// Cross entropy of logits `input` (`[N, C, ...]` or `[C]`) against class indices
/// (or class probabilities of `input`'s shape), with `label_smoothing`.
pub fn cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: i64,
    reduction: Reduction,
    label_smoothing: f64,
) -> Result<Tensor> {
    let mut args = vec![input, target];
    args.extend(weight);
    let (a, _body) = enter_vec(&CROSS_ENTROPY, &args)?;
    let (input, target, weight) = (&a[0], &a[1], weight.map(|_| &a[2]));
    if input.rank() == 0 {
        return Err(amp_tensor::Error::DimOutOfRange { dim: 1, ndim: 0 }.into());
    }
    if !target.dtype().is_floating_point() {
        super::check::nll_batch(input, target)?;
    }
    let cd = class_dim(input) as i64;
    let c = input.dims()[cd as usize] as f64;
    let lp = log_softmax(input, cd, None)?;
    if target.dtype().is_floating_point() {
        // class probabilities
        let t = if label_smoothing > 0.0 {
            add_scalar(
                &mul_scalar(target, 1.0 - label_smoothing)?,
                label_smoothing / c,
            )?
        } else {
            target.clone()
        };
        let mut prod = mul(&lp, &t)?;
        if let Some(w) = weight {
            let mut shape = vec![1usize; input.rank()];
            shape[cd as usize] = w.elem_count();
            prod = mul(&prod, &reshape(w, shape)?)?;
        }
        let per = neg(&sum(&prod, &[cd], false, None)?)?;
        return match reduction {
            Reduction::None => Ok(per),
            Reduction::Sum => sum_all(&per),
            Reduction::Mean => {
                div_scalar(&sum_all(&per)?, (input.elem_count() as f64 / c).max(1.0))
            }
        };
    }
    let nll = nll_impl(&lp, target, weight, ignore_index, reduction)?;
    if label_smoothing <= 0.0 {
        return Ok(nll);
    }
    if weight.is_some() {
        return Err(Error::invalid(
            "cross_entropy",
            "label_smoothing together with weight is not supported yet",
        ));
    }
    let valid = ne_scalar(target, ignore_index)?.to_dtype(lp.dtype())?;
    let smooth = mul(&neg(&sum(&lp, &[cd], false, None)?)?, &valid)?;
    let smooth = match reduction {
        Reduction::None => smooth,
        Reduction::Sum => sum_all(&smooth)?,
        Reduction::Mean => div(&sum_all(&smooth)?, &sum_all(&valid)?)?,
    };
    add(
        &mul_scalar(&nll, 1.0 - label_smoothing)?,
        &mul_scalar(&smooth, label_smoothing / c)?,
    )
}

/// Binary cross entropy of probabilities `input` (logs clamped at -100 as PyTorch).
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let mut args = vec![input, target];
    args.extend(weight);
    let (a, _body) = enter_vec(&BCE, &args)?;
    let (x, y) = (&a[0], &a[1]);
    super::check::binary_cross_entropy(x, y)?;
    super::check::probabilities(x)?;
    let lx = clamp(&log(x)?, Some(-100.0), None)?;
    let l1x = clamp(&log(&rsub_scalar(x, 1.0)?)?, Some(-100.0), None)?;
    let mut l = neg(&add(&mul(y, &lx)?, &mul(&rsub_scalar(y, 1.0)?, &l1x)?)?)?;
    if weight.is_some() {
        l = mul(&l, &a[2])?;
    }
    reduce(l, reduction)
}

/// Binary cross entropy of logits `input`, stable, with optional `pos_weight`.
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let mut args = vec![input, target];
    args.extend(weight);
    args.extend(pos_weight);
    let (a, _body) = enter_vec(&BCE_LOGITS, &args)?;
    let (x, y) = (&a[0], &a[1]);
    super::check::bce_with_logits(x, y)?;
    let w = weight.map(|_| &a[2]);
    let pw = pos_weight.map(|_| &a[2 + weight.is_some() as usize]);
    // log(1 + exp(-|x|)) + max(-x, 0)
    let sp = add(
        &log1p(&exp(&neg(&abs(x)?)?)?)?,
        &clamp(&neg(x)?, Some(0.0), None)?,
    )?;
    let lin = mul(&rsub_scalar(y, 1.0)?, x)?;
    let mut l = match pw {
        Some(pw) => add(
            &lin,
            &mul(&add_scalar(&mul(&sub_scalar(pw, 1.0)?, y)?, 1.0)?, &sp)?,
        )?,
        None => add(&lin, &sp)?,
    };
    if let Some(w) = w {
        l = mul(&l, w)?;
    }
    reduce(l, reduction)
}

/// The name of the CPU kernel PyTorch's `nll_loss` runs for an input of this rank (its
/// dtype message names it).
fn nll_kernel(input: &Tensor) -> &'static str {
    if input.rank() == 4 {
        "nll_loss2d_forward_out_frame"
    } else {
        "nll_loss_out_frame"
    }
}
