//! The remaining losses: kl_div, poisson_nll_loss, hinge_embedding_loss,
//! margin_ranking_loss, soft_margin_loss, multilabel_margin_loss (and its
//! `multilabel_margin_loss_forward`), multi_margin_loss, cosine_embedding_loss,
//! triplet_margin_loss, ctc_loss.
//!
//! Each enters the dispatch point once under its documented name and computes its value
//! from differentiable ops as an [opaque](crate::OpName::opaque) op (the body runs with the
//! layer excluded, so the op's policy alone decides its dtypes); 16-bit inputs are
//! computed in float32 and the result rounded once, as PyTorch's kernels accumulate in
//! float32.

use amp_tensor::{promote_types, DType};

use super::distance::pairwise_distance;
use super::loss::{reduce, Reduction};
use super::names::{
    COSINE_EMBEDDING, CTC, HINGE_EMBEDDING, KL_DIV, MARGIN_RANKING, MULTILABEL_MARGIN,
    MULTILABEL_MARGIN_FORWARD, MULTI_MARGIN, POISSON_NLL, SOFT_MARGIN, TRIPLET_MARGIN,
};
use super::pointwise::*;
use super::reduce::{logsumexp, mean_all, sum, sum_all};
use super::shape::{cat, gather, index_select, reshape, select, squeeze, stack, unsqueeze};
use super::{check, enter, enter_vec};
use crate::dispatch::{BodyGuard, OpName};
use crate::{Error, Result, Tensor};

/// `x` in float32 when it is a 16-bit float (differentiably), else itself.
pub(super) fn acc(x: &Tensor) -> Result<Tensor> {
    if x.dtype().is_reduced_float() {
        x.to_dtype(DType::F32)
    } else {
        Ok(x.clone())
    }
}

/// `y` cast (differentiably) to `dtype` if it is not already.
pub(super) fn back(y: Tensor, dtype: DType) -> Result<Tensor> {
    y.to_dtype(dtype)
}

/// The floating dtype of a result computed from `a` and `b`.
fn result_dtype(a: &Tensor, b: &Tensor) -> DType {
    promote_types(a.dtype(), b.dtype())
}

/// A two-tensor loss's arguments: entered as its op (`input`, `target`, the guard that
/// lives as long as the op), widened for accumulation ([`acc`]: `x`, `t`), and the dtype
/// its result comes back in.
struct Args {
    input: Tensor,
    target: Tensor,
    x: Tensor,
    t: Tensor,
    dt: DType,
    _body: BodyGuard,
}

fn args(op: &'static OpName, input: &Tensor, target: &Tensor) -> Result<Args> {
    let ([input, target], _body) = enter(op, [input, target])?;
    Ok(Args {
        x: acc(&input)?,
        t: acc(&target)?,
        dt: result_dtype(&input, &target),
        input,
        target,
        _body,
    })
}

amp_kernels::named_mode! {
    /// How [`kl_div`] reduces: [`Reduction`]'s three and `batchmean` (the sum divided by
    /// the batch size, the mathematically correct KL divergence).
    #[derive(Default)]
    pub enum KlDivReduction {
        /// Per-element losses.
        None = "none",
        /// Mean over every element (the default; PyTorch warns it is not the KL divergence).
        #[default]
        Mean = "mean",
        /// Sum.
        Sum = "sum",
        /// Sum divided by `input.size(0)`.
        BatchMean = "batchmean",
    }
    else |other| -> Error { Error::invalid("kl_div", format!("{other} is not a valid value for reduction")) }
}

/// `x * log(x)`, 0 where `x == 0` (PyTorch's `xlogy(x, x)`).
fn xlogx(x: &Tensor) -> Result<Tensor> {
    let zero = eq_scalar(x, 0.0)?;
    let safe = where_(&zero, &ones_like(x), x)?;
    mul(x, &log(&safe)?)
}

/// Kullback-Leibler divergence of log-probabilities `input` from `target`
/// (probabilities, or log-probabilities when `log_target`):
/// `target * (log(target) - input)` per element, then `reduction`.
pub fn kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: KlDivReduction,
    log_target: bool,
) -> Result<Tensor> {
    let a = args(&KL_DIV, input, target)?;
    check::kl_div(&a.input, &a.target)?;
    let l = if log_target {
        mul(&exp(&a.t)?, &sub(&a.t, &a.x)?)?
    } else {
        sub(&xlogx(&a.t)?, &mul(&a.t, &a.x)?)?
    };
    let out = match reduction {
        KlDivReduction::None => l,
        KlDivReduction::Mean => mean_all(&l)?,
        KlDivReduction::Sum => sum_all(&l)?,
        KlDivReduction::BatchMean if input.rank() == 0 => sum_all(&l)?,
        KlDivReduction::BatchMean => div_scalar(&sum_all(&l)?, input.dims()[0] as f64)?,
    };
    back(out, a.dt)
}

/// Poisson negative log-likelihood: `exp(input) - target * input` when `log_input`,
/// else `input - target * log(input + eps)`; with `full`, the Stirling term
/// `target * log(target) - target + log(2π target) / 2` is added where `target > 1`.
pub fn poisson_nll_loss(
    input: &Tensor,
    target: &Tensor,
    log_input: bool,
    full: bool,
    eps: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    let a = args(&POISSON_NLL, input, target)?;
    let mut l = if log_input {
        sub(&exp(&a.x)?, &mul(&a.t, &a.x)?)?
    } else {
        sub(&a.x, &mul(&a.t, &log(&add_scalar(&a.x, eps)?)?)?)?
    };
    if full {
        let big = gt_scalar(&a.t, 1.0)?;
        let safe = where_(&big, &a.t, &ones_like(&a.t))?;
        let stirling = add(
            &sub(&mul(&safe, &log(&safe)?)?, &safe)?,
            &mul_scalar(&log(&mul_scalar(&safe, 2.0 * std::f64::consts::PI)?)?, 0.5)?,
        )?;
        l = add(&l, &where_(&big, &stirling, &zeros_like(&stirling))?)?;
    }
    back(reduce(l, reduction)?, a.dt)
}

/// Hinge embedding loss: `input` where `target == 1`, `max(0, margin - input)` where
/// `target == -1` (other target values contribute both, as in PyTorch).
pub fn hinge_embedding_loss(
    input: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    let a = args(&HINGE_EMBEDDING, input, target)?;
    if reduction == Reduction::Mean {
        check::mean_dtype(&a.input)?;
    }
    let zeros = zeros_like(&a.x);
    let margin_clamp = clamp(&rsub_scalar(&a.x, margin)?, Some(0.0), None)?;
    let out_margin = where_(&ne_scalar(&a.t, 1.0)?, &margin_clamp, &zeros)?;
    let out_self = where_(&ne_scalar(&a.t, -1.0)?, &a.x, &zeros)?;
    back(reduce(add(&out_margin, &out_self)?, reduction)?, a.dt)
}

/// Margin ranking loss `max(0, -target * (input1 - input2) + margin)`.
pub fn margin_ranking_loss(
    input1: &Tensor,
    input2: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    let ([input1, input2, target], _body) = enter(&MARGIN_RANKING, [input1, input2, target])?;
    check::margin_ranking_loss(&input1, &input2, &target)?;
    let dt = promote_types(result_dtype(&input1, &input2), target.dtype());
    let (a, b, t) = (acc(&input1)?, acc(&input2)?, acc(&target)?);
    let l = clamp(
        &add_scalar(&mul(&neg(&t)?, &sub(&a, &b)?)?, margin)?,
        Some(0.0),
        None,
    )?;
    back(reduce(l, reduction)?, dt)
}

/// Two-class logistic loss `log(1 + exp(-target * input))`.
pub fn soft_margin_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let a = args(&SOFT_MARGIN, input, target)?;
    check::soft_margin_loss(&a.input, &a.target)?;
    let l = log1p_exp(&neg(&mul(&a.x, &a.t)?)?)?;
    back(reduce(l, reduction)?, a.dt)
}

/// `log1p(exp(v))` (soft_margin_loss's element, PyTorch's formula) with PyTorch's
/// closed-form derivatives: `g · z / (1 + z)` with `z = exp(v)`, and of that
/// `g · z / ((1 + z)(1 + z))` ([`logistic_of_exp`]). Through autograd of the composite the
/// second derivative was `z/(1+z) - z·z/(1+z)²`, whose second term is 0 once `(1 + z)²`
/// overflows (`v` over 355 in float64), leaving the first (about 1) where PyTorch's
/// closed form gives 0.
fn log1p_exp(v: &Tensor) -> Result<Tensor> {
    let out = crate::grad_mode::no_grad(|| log1p(&exp(v)?))?;
    let saved = v.clone();
    Ok(crate::graph::record(
        out.data().clone(),
        "SoftMarginLossBackward0",
        &[v],
        move |g| Ok(vec![Some(mul(g, &logistic_of_exp(&saved)?)?)]),
    ))
}

/// `z / (1 + z)` with `z = exp(v)`, differentiable, its derivative the closed form
/// `g · z / ((1 + z)(1 + z))` (PyTorch's `soft_margin_loss_double_backward`).
fn logistic_of_exp(v: &Tensor) -> Result<Tensor> {
    let (out, z) = crate::grad_mode::no_grad(|| -> Result<(Tensor, Tensor)> {
        let z = exp(v)?;
        Ok((div(&z, &add_scalar(&z, 1.0)?)?, z))
    })?;
    Ok(crate::graph::record(
        out.data().clone(),
        "SoftMarginLossBackwardBackward0",
        &[v],
        move |g| {
            let zp1 = add_scalar(&z, 1.0)?;
            Ok(vec![Some(mul(g, &div(&z, &mul(&zp1, &zp1)?)?)?)])
        },
    ))
}

/// Integer values of an index tensor (no gradient).
fn int_values(t: &Tensor, op: &'static str) -> Result<Vec<i64>> {
    if t.dtype().is_floating_point() {
        return Err(Error::invalid(
            op,
            format!("expected an integer target, got {}", t.dtype()),
        ));
    }
    Ok(t.to_vec_f64().into_iter().map(|v| v as i64).collect())
}

/// `input` as `[N, C]` (1-D input is one row), with `N` and `C`.
fn rows(input: &Tensor, op: &'static str) -> Result<(Tensor, usize, usize)> {
    match input.rank() {
        0 => Ok((reshape(input, [1usize, 1])?, 1, 1)),
        1 => {
            let c = input.dims()[0];
            Ok((reshape(input, [1, c])?, 1, c))
        }
        2 => Ok((input.clone(), input.dims()[0], input.dims()[1])),
        r => Err(Error::invalid(
            op,
            format!("Expected non-empty vector or matrix with optional 0-dim batch size, but got: {r}-D input"),
        )),
    }
}

/// Multi-label one-versus-all margin loss; `target` holds each sample's class indices,
/// ended by the first `-1`. Per sample,
/// `sum_{j in targets} sum_{i not in targets} max(0, 1 - (x[j] - x[i])) / C`.
pub fn multilabel_margin_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    let ([input, target], _body) = enter(&MULTILABEL_MARGIN, [input, target])?;
    check::float32_or_64("multilabel_margin_loss_forward_out_frame", &input)?;
    Ok(multilabel_margin_loss_forward(&input, &target, reduction)?.0)
}

/// The ATen op behind [`multilabel_margin_loss`]: the loss and `is_target` (1 where a
/// class is one of the sample's targets, in the input's dtype, shaped like `target`).
pub fn multilabel_margin_loss_forward(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "multilabel_margin_loss";
    let ([input, target], _body) = enter(&MULTILABEL_MARGIN_FORWARD, [input, target])?;
    let dt = input.dtype();
    let (x, n, c) = rows(&acc(&input)?, OP)?;
    if target.dims() != input.dims() {
        return Err(Error::invalid(
            OP,
            format!(
                "inconsistent target size: {:?} for input of size: {:?}",
                target.dims(),
                input.dims()
            ),
        ));
    }
    let tv = int_values(&target, OP)?;
    // Per sample: the target classes (the prefix before -1), padded to `k` with
    // weight 0, and whether each class is a target.
    let mut lists: Vec<Vec<i64>> = Vec::with_capacity(n);
    let mut is_target = vec![0.0f64; n * c];
    for s in 0..n {
        let mut list = Vec::new();
        for &j in &tv[s * c..(s + 1) * c] {
            if j < 0 {
                break;
            }
            if j as usize >= c {
                return Err(Error::invalid(
                    OP,
                    format!("target index {j} is out of bounds for {c} classes"),
                ));
            }
            list.push(j);
            is_target[s * c + j as usize] = 1.0;
        }
        lists.push(list);
    }
    let k = lists.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut idx = vec![0i64; n * k];
    let mut valid = vec![0.0f64; n * k];
    for (s, list) in lists.iter().enumerate() {
        for (p, &j) in list.iter().enumerate() {
            idx[s * k + p] = j;
            valid[s * k + p] = 1.0;
        }
    }
    let cdt = x.dtype();
    let dev = x.device();
    let idx = Tensor::from_vec(idx, [n, k])?.to_device(dev)?;
    let valid = Tensor::from_vec(valid, [n, k, 1])?
        .to_dtype(cdt)?
        .to_device(dev)?;
    let is_t = Tensor::from_vec(is_target, [n, c])?.to_device(dev)?;
    let not_t = unsqueeze(&rsub_scalar(&is_t, 1.0)?.to_dtype(cdt)?, 1)?;
    let xj = gather(&x, 1, &idx)?; // [n, k]
                                   // 1 - x[j] + x[i] over [n, k, c]
    let d = add(&rsub_scalar(&unsqueeze(&xj, 2)?, 1.0)?, &unsqueeze(&x, 1)?)?;
    let h = mul(&mul(&relu(&d)?, &valid)?, &not_t)?;
    let per = div_scalar(&sum(&h, &[1, 2], false, None)?, c as f64)?;
    let out = match reduction {
        Reduction::None if input.rank() <= 1 => reshape(&per, Vec::<usize>::new())?,
        r => reduce(per, r)?,
    };
    let is_target = Tensor::from_raw(is_t.data().to_dtype(dt)?);
    let is_target = reshape(&is_target, target.dims().to_vec())?;
    Ok((back(out, dt)?, is_target))
}

/// Multi-class margin loss: per sample,
/// `sum_{i != y} w[y] * max(0, margin - x[y] + x[i])^p / C` with `p` 1 or 2.
pub fn multi_margin_loss(
    input: &Tensor,
    target: &Tensor,
    p: i64,
    margin: f64,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "multi_margin_loss";
    let mut args = vec![input, target];
    args.extend(weight);
    let (a, _body) = enter_vec(&MULTI_MARGIN, &args)?;
    let (input, target, weight) = (&a[0], &a[1], weight.map(|_| &a[2]));
    check::float32_or_64("multi_margin_loss_cpu_kernel", input)?;
    if p != 1 && p != 2 {
        return Err(Error::invalid(OP, "only p == 1 and p == 2 supported"));
    }
    let dt = match weight {
        Some(w) => promote_types(input.dtype(), w.dtype()),
        None => input.dtype(),
    };
    let (x, n, c) = rows(&acc(input)?, OP)?;
    if target.elem_count() != n || (input.rank() == 2 && target.rank() != 1) {
        return Err(Error::invalid(
            OP,
            format!(
                "inconsistent target size, expected {n} but got {:?}",
                target.dims()
            ),
        ));
    }
    let tv = int_values(target, OP)?;
    if let Some(&bad) = tv.iter().find(|&&y| y < 0 || y as usize >= c) {
        return Err(Error::invalid(OP, format!("target out of range: {bad}")));
    }
    let mut other = vec![1.0f64; n * c];
    for (s, &y) in tv.iter().enumerate() {
        other[s * c + y as usize] = 0.0;
    }
    let cdt = x.dtype();
    let y = Tensor::from_vec(tv, [n, 1])?.to_device(x.device())?;
    let other = Tensor::from_vec(other, [n, c])?
        .to_dtype(cdt)?
        .to_device(x.device())?;
    let xy = gather(&x, 1, &y)?; // [n, 1]
    let z = add(&rsub_scalar(&xy, margin)?, &x)?;
    let mut h = relu(&z)?;
    if p == 2 {
        h = square(&h)?;
    }
    if let Some(w) = weight {
        let wy = index_select(&acc(w)?, 0, &reshape(&y, [n])?)?;
        h = mul(&h, &unsqueeze(&wy, 1)?)?;
    }
    let per = div_scalar(&sum(&mul(&h, &other)?, &[1], false, None)?, c as f64)?;
    let out = match reduction {
        Reduction::None if input.rank() <= 1 => reshape(&per, Vec::<usize>::new())?,
        r => reduce(per, r)?,
    };
    back(out, dt)
}

/// Cosine embedding loss: `1 - cos(x1, x2)` where `target == 1`,
/// `max(0, cos(x1, x2) - margin)` where `target == -1` (cosine along the last dim of
/// 1-D or 2-D inputs, with PyTorch's `1e-12` added to the squared magnitudes).
pub fn cosine_embedding_loss(
    input1: &Tensor,
    input2: &Tensor,
    target: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "cosine_embedding_loss";
    let ([input1, input2, target], _body) = enter(&COSINE_EMBEDDING, [input1, input2, target])?;
    if input1.dims() != input2.dims() {
        return Err(Error::invalid(
            OP,
            format!(
                "the sizes of input1 {:?} and input2 {:?} must match",
                input1.dims(),
                input2.dims()
            ),
        ));
    }
    let r = input1.rank();
    if !(1..=2).contains(&r) || target.rank() + 1 != r {
        return Err(Error::invalid(
            OP,
            format!(
                "{r}D inputs need a {}D target, got {}D",
                r.saturating_sub(1),
                target.rank()
            ),
        ));
    }
    const EPSILON: f64 = 1e-12;
    let dt = result_dtype(&input1, &input2);
    let (a, b, t) = (acc(&input1)?, acc(&input2)?, acc(&target)?);
    let d = [r as i64 - 1];
    let prod = sum(&mul(&a, &b)?, &d, false, None)?;
    let m1 = add_scalar(&sum(&mul(&a, &a)?, &d, false, None)?, EPSILON)?;
    let m2 = add_scalar(&sum(&mul(&b, &b)?, &d, false, None)?, EPSILON)?;
    let cos = div(&prod, &sqrt(&mul(&m1, &m2)?)?)?;
    let zeros = zeros_like(&cos);
    let pos = rsub_scalar(&cos, 1.0)?;
    let negv = clamp(&sub_scalar(&cos, margin)?, Some(0.0), None)?;
    let out = add(
        &where_(&eq_scalar(&t, 1.0)?, &pos, &zeros)?,
        &where_(&eq_scalar(&t, -1.0)?, &negv, &zeros)?,
    )?;
    back(reduce(out, reduction)?, dt)
}

/// Triplet margin loss
/// `max(0, margin + d(anchor, positive) - d(anchor, negative))` with `d` the
/// [`pairwise_distance`] of norm `p` (plus `eps`); with `swap`, the negative distance is
/// the smaller of `d(anchor, negative)` and `d(positive, negative)`.
#[allow(clippy::too_many_arguments)]
pub fn triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "triplet_margin_loss";
    let ([a, pos, negt], _body) = enter(&TRIPLET_MARGIN, [anchor, positive, negative])?;
    if a.rank() != pos.rank() || a.rank() != negt.rank() {
        return Err(Error::invalid(
            OP,
            format!(
                "The anchor, positive, and negative tensors are expected to have the same \
                 number of dimensions, but got: anchor {}D, positive {}D, and negative {}D inputs",
                a.rank(),
                pos.rank(),
                negt.rank()
            ),
        ));
    }
    if margin <= 0.0 {
        return Err(Error::invalid(
            OP,
            format!("margin must be greater than 0, got {margin}"),
        ));
    }
    let dt = promote_types(result_dtype(&a, &pos), negt.dtype());
    let (a, pos, negt) = (acc(&a)?, acc(&pos)?, acc(&negt)?);
    let d_pos = pairwise_distance(&a, &pos, p, eps, false)?;
    let mut d_neg = pairwise_distance(&a, &negt, p, eps, false)?;
    if swap {
        let d_swap = pairwise_distance(&pos, &negt, p, eps, false)?;
        d_neg = minimum(&d_neg, &d_swap)?;
    }
    let l = clamp(&sub(&add_scalar(&d_pos, margin)?, &d_neg)?, Some(0.0), None)?;
    back(reduce(l, reduction)?, dt)
}

/// Connectionist temporal classification loss of `log_probs` (`[T, N, C]`, or `[T, C]`
/// unbatched, log-softmax outputs) against `targets` (`[N, S]` padded, or the
/// concatenation of every target sequence), with per-sample `input_lengths` and
/// `target_lengths`; `blank` is the blank class. With `zero_infinity`, infinite losses
/// (impossible alignments) and their gradients become zero. `Reduction::Mean` divides
/// each loss by its target length, then averages over the batch, as PyTorch does.
///
/// Computed by the forward (alpha) recursion in log space from differentiable ops. The
/// gradient is PyTorch's: that of the logits when `log_probs = log_softmax(logits)`
/// (the exact gradient plus `exp(log_probs)` over each sample's input steps), so both
/// agree through a `log_softmax`.
#[allow(clippy::too_many_arguments)]
pub fn ctc_loss(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &[usize],
    target_lengths: &[usize],
    blank: usize,
    reduction: Reduction,
    zero_infinity: bool,
) -> Result<Tensor> {
    const OP: &str = "ctc_loss";
    let ([lp, targets], _body) = enter(&CTC, [log_probs, targets])?;
    let unbatched = lp.rank() == 2;
    if !(2..=3).contains(&lp.rank()) {
        return Err(Error::invalid(
            OP,
            format!("log_probs must be 2-D or 3-D, got {}-D", lp.rank()),
        ));
    }
    let (t_max, n, c) = if unbatched {
        (lp.dims()[0], 1, lp.dims()[1])
    } else {
        (lp.dims()[0], lp.dims()[1], lp.dims()[2])
    };
    if input_lengths.len() != n || target_lengths.len() != n {
        return Err(Error::invalid(
            OP,
            format!(
                "expected {n} input and target lengths, got {} and {}",
                input_lengths.len(),
                target_lengths.len()
            ),
        ));
    }
    if blank >= c {
        return Err(Error::invalid(OP, "blank must be in label range"));
    }
    let tv = int_values(&targets, OP)?;
    // Each sample's target sequence.
    let mut seqs: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut off = 0usize;
    for (s, &len) in target_lengths.iter().enumerate() {
        // Padded `[N, S]` targets, or every target sequence concatenated.
        let slice: &[i64] = match targets.rank() {
            2 if !unbatched => {
                let w = targets.dims()[1];
                if len > w {
                    return Err(Error::invalid(
                        OP,
                        "target length exceeds the padded targets",
                    ));
                }
                &tv[s * w..s * w + len]
            }
            1 => {
                if off + len > tv.len() {
                    return Err(Error::invalid(OP, "target lengths exceed the targets"));
                }
                off += len;
                &tv[off - len..off]
            }
            r => {
                return Err(Error::invalid(
                    OP,
                    format!("targets must be 1-D, or 2-D for batched log_probs, got {r}-D"),
                ))
            }
        };
        let mut seq = Vec::with_capacity(len);
        for &v in slice {
            if v < 0 || v as usize >= c || v as usize == blank {
                return Err(Error::invalid(
                    OP,
                    format!("target label {v} is out of range or the blank"),
                ));
            }
            seq.push(v as usize);
        }
        seqs.push(seq);
    }
    for &il in input_lengths {
        if il > t_max {
            return Err(Error::invalid(
                OP,
                format!("input length {il} exceeds the {t_max} time steps"),
            ));
        }
    }
    let dt = lp.dtype();
    let x = acc(&lp)?;
    let x = if unbatched { unsqueeze(&x, 1)? } else { x };
    let cdt = x.dtype();
    let mut losses = Vec::with_capacity(n);
    for (s, seq) in seqs.iter().enumerate() {
        let il = input_lengths[s];
        // The extended label sequence: blank, l1, blank, l2, ..., blank.
        let ext: Vec<usize> = std::iter::once(blank)
            .chain(seq.iter().flat_map(|&l| [l, blank]))
            .collect();
        let len = ext.len();
        let ext_idx = Tensor::from_vec(ext.iter().map(|&v| v as i64).collect(), [len])?;
        // Where alpha may also come from two positions back (a label differing from
        // the one two back): 0 there, -inf elsewhere.
        let skip: Vec<f64> = (0..len)
            .map(|i| {
                if i >= 2 && ext[i] != blank && ext[i] != ext[i - 2] {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let skip = Tensor::from_vec(skip, [len])?.to_dtype(cdt)?;
        let ninf = Tensor::full([1usize], f64::NEG_INFINITY, cdt);
        let ninf2 = Tensor::full([2usize], f64::NEG_INFINITY, cdt);
        let sample = select(&x, 1, s as i64)?; // [T, C]
        let loss = if il == 0 {
            if seq.is_empty() {
                Tensor::zeros(Vec::<usize>::new(), cdt)
            } else {
                Tensor::full(Vec::<usize>::new(), f64::INFINITY, cdt)
            }
        } else {
            // alpha_0: the first two positions.
            let e0 = index_select(&select(&sample, 0, 0)?, 0, &ext_idx)?;
            let init: Vec<f64> = (0..len)
                .map(|i| if i < 2 { 0.0 } else { f64::NEG_INFINITY })
                .collect();
            let mut alpha = add(&e0, &Tensor::from_vec(init, [len])?.to_dtype(cdt)?)?;
            for t in 1..il {
                let e = index_select(&select(&sample, 0, t as i64)?, 0, &ext_idx)?;
                let prev1 = if len > 1 {
                    cat(
                        &[ninf.clone(), super::shape::narrow(&alpha, 0, 0, len - 1)?],
                        0,
                    )?
                } else {
                    ninf.clone()
                };
                let prev2 = if len > 2 {
                    add(
                        &cat(
                            &[ninf2.clone(), super::shape::narrow(&alpha, 0, 0, len - 2)?],
                            0,
                        )?,
                        &skip,
                    )?
                } else {
                    Tensor::full([len], f64::NEG_INFINITY, cdt)
                };
                let three = stack(&[alpha.clone(), prev1, prev2], 0)?;
                alpha = add(&safe_logsumexp0(&three)?, &e)?;
            }
            let last = if len >= 2 {
                super::shape::narrow(&alpha, 0, len - 2, 2)?
            } else {
                alpha.clone()
            };
            let nll = neg(&safe_logsumexp0(&unsqueeze(&last, 1)?)?)?;
            // PyTorch's CTC gradient is that of the logits behind a log_softmax:
            // it carries an extra `exp(log_probs)` over the first `il` steps. A
            // term of value zero adds exactly that gradient.
            let live = super::shape::narrow(&sample, 0, 0, il)?;
            let extra = sum_all(&sub(&exp(&live)?, &exp(&live.detach())?)?)?;
            add(&nll, &extra)?
        };
        let loss = squeeze_all(&loss)?;
        losses.push(loss);
    }
    let mut l = stack(&losses, 0)?; // [N]
    if zero_infinity {
        let inf = eq_scalar(&l, f64::INFINITY)?;
        l = where_(&inf, &zeros_like(&l), &l)?;
    }
    let out = match reduction {
        Reduction::None if unbatched => squeeze(&l, 0)?,
        Reduction::None => l,
        Reduction::Sum => sum_all(&l)?,
        Reduction::Mean => {
            let tl: Vec<f64> = target_lengths.iter().map(|&v| (v.max(1)) as f64).collect();
            let tl = Tensor::from_vec(tl, [n])?.to_dtype(cdt)?;
            mean_all(&div(&l, &tl)?)?
        }
    };
    back(out, dt)
}

/// `logsumexp` over dim 0 that is `-inf` (with zero gradient) where every entry is
/// `-inf`, instead of NaN.
fn safe_logsumexp0(x: &Tensor) -> Result<Tensor> {
    let dead = eq_scalar(&amax_detached(x)?, f64::NEG_INFINITY)?;
    // Replace all -inf columns by zeros, take logsumexp, then put -inf back.
    let xs = where_(&unsqueeze(&dead, 0)?, &zeros_like(x), x)?;
    let l = logsumexp(&xs, &[0], false)?;
    where_(
        &dead,
        &Tensor::full(l.dims().to_vec(), f64::NEG_INFINITY, l.dtype()),
        &l,
    )
}

/// The maximum over dim 0, without gradient.
fn amax_detached(x: &Tensor) -> Result<Tensor> {
    super::reduce::amax(&x.detach(), &[0], false)
}

/// A one-element tensor as a 0-dim tensor.
fn squeeze_all(x: &Tensor) -> Result<Tensor> {
    reshape(x, Vec::<usize>::new())
}
