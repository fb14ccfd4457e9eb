//! Neural-network functions: softmax, log_softmax, softmin, layer_norm, dropout.

use amp_tensor::{DType, Generator, Tensor as Raw};

use super::names::{DROPOUT, LAYER_NORM, LOG_SOFTMAX, SOFTMAX, SOFTMIN};
use super::pointwise::*;
use super::reduce::{mean, sum};
use super::{enter, enter_cast};
use crate::grad_mode::is_grad_enabled;
use crate::graph::{record, record_multi, SavedOutput};
use crate::{Error, Result, Tensor};

/// Softmax along `dim` (computed in float32 for 16-bit inputs), optionally in `dtype`.
pub fn softmax(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&SOFTMAX, x, dtype)?;
    softmax_or_log(&x, dim, false)
}

/// Softmax (`log`: log-softmax) recorded with only its output kept, as PyTorch's
/// `SoftmaxBackward0` / `LogSoftmaxBackward0`: one fused kernel for the backward, and
/// under `create_graph` the formula in differentiable ops (`y (g - Σ g y)` and
/// `g - exp(y) Σ g`).
fn softmax_or_log(x: &Tensor, dim: i64, log: bool) -> Result<Tensor> {
    let (forward, backward, name): Kernels = if log {
        (
            amp_kernels::log_softmax,
            amp_kernels::log_softmax_backward,
            "LogSoftmaxBackward0",
        )
    } else {
        (
            amp_kernels::softmax,
            amp_kernels::softmax_backward,
            "SoftmaxBackward0",
        )
    };
    let out = forward(x.data(), dim, None)?;
    Ok(record_softmax(x, out, dim, log, backward, name))
}

/// PyTorch's `_safe_softmax` over the last dim, the softmax of its math attention: a row
/// whose elements are all `-inf` (every key masked) gives zeros, not NaN, and so no
/// gradient (the softmax backward `y (g - Σ g y)` is 0 where `y` is). A row is all `-inf`
/// exactly when its maximum is (a NaN makes the maximum NaN).
pub(crate) fn safe_softmax(x: &Tensor) -> Result<Tensor> {
    use amp_kernels::CmpOp;
    let raw = x.data();
    let mut out = amp_kernels::softmax(raw, -1, None)?;
    let dead = amp_kernels::compare_scalar(
        CmpOp::Eq,
        &amp_kernels::amax(raw, &[-1], true)?,
        f64::NEG_INFINITY,
    )?;
    // On the host, the rewrite only where a row is dead; a device always rewrites (no
    // read back).
    if !dead.device().is_cpu() || dead.try_to_vec_as::<bool>()?.contains(&true) {
        let zero = Raw::scalar_of(0.0, out.dtype()).to_device(out.device())?;
        out = amp_kernels::where_cond(&dead, &zero, &out)?;
    }
    Ok(record_softmax(
        x,
        out,
        -1,
        false,
        amp_kernels::softmax_backward,
        "SafeSoftmaxBackward0",
    ))
}

/// Records a softmax (`log`: log-softmax) output `out` of `x` along `dim`, keeping only
/// the output; `backward` is the fused kernel of the backward.
fn record_softmax(
    x: &Tensor,
    out: Raw,
    dim: i64,
    log: bool,
    backward: fn(&Raw, &Raw, i64) -> amp_tensor::Result<Raw>,
    name: &'static str,
) -> Tensor {
    let y = SavedOutput::new(&out, 0);
    record(out, name, &[x], move |g| {
        let y = y.get();
        Ok(vec![Some(match (is_grad_enabled(), log) {
            (false, _) => Tensor::from_raw(backward(g.data(), y.data(), dim)?),
            (true, false) => mul(&y, &sub(g, &sum(&mul(g, &y)?, &[dim], true, None)?)?)?,
            (true, true) => sub(g, &mul(&exp(&y)?, &sum(g, &[dim], true, None)?)?)?,
        })])
    })
}

/// A softmax kernel, its backward, and the backward node's name.
type Kernels = (
    fn(&Raw, i64, Option<DType>) -> amp_tensor::Result<Raw>,
    fn(&Raw, &Raw, i64) -> amp_tensor::Result<Raw>,
    &'static str,
);

/// `log(softmax(x))` along `dim`, computed stably.
pub fn log_softmax(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&LOG_SOFTMAX, x, dtype)?;
    softmax_or_log(&x, dim, true)
}

/// `softmax(-x)` along `dim`.
pub fn softmin(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&SOFTMIN, x, dtype)?;
    softmax_or_log(&neg(&x)?, dim, false)
}

/// Layer normalisation over the trailing `normalized_shape` dims, with optional
/// elementwise affine `weight` and `bias`.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let mut args: Vec<&Tensor> = vec![x];
    args.extend(weight);
    args.extend(bias);
    let (a, _body) = super::enter_vec(&LAYER_NORM, &args)?;
    let x = a[0].clone();
    let w = weight.map(|_| a[1].clone());
    let b = bias.map(|_| a[if weight.is_some() { 2 } else { 1 }].clone());
    super::check::norm_parameters("layer_norm", &x, w.as_ref(), b.as_ref())?;
    let (out, mean_, rstd) = amp_kernels::layer_norm(
        x.data(),
        normalized_shape,
        w.as_ref().map(|t| t.data()),
        b.as_ref().map(|t| t.data()),
        eps,
    )?;
    let ns = normalized_shape.to_vec();
    let (xs, ws, has_b) = (x.clone(), w.clone(), b.is_some());
    let mut inputs = vec![&x];
    inputs.extend(w.as_ref());
    inputs.extend(b.as_ref());
    let f = move |grads: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &grads[0] else {
            return Ok(vec![None; 1 + ws.is_some() as usize + has_b as usize]);
        };
        let (gi, gw, gb) = if is_grad_enabled() {
            layer_norm_backward_composite(g, &xs, &ns, ws.as_ref(), eps)?
        } else {
            let (gi, gw, gb) = amp_kernels::layer_norm_backward(
                g.data(),
                xs.data(),
                &ns,
                &mean_,
                &rstd,
                ws.as_ref().map(|t| t.data()),
            )?;
            (
                Tensor::from_raw(gi),
                gw.map(Tensor::from_raw),
                gb.map(Tensor::from_raw),
            )
        };
        let mut v = vec![Some(gi)];
        if ws.is_some() {
            v.push(gw);
        }
        if has_b {
            v.push(gb);
        }
        Ok(v)
    };
    Ok(record_multi(
        vec![out],
        &[true],
        "NativeLayerNormBackward0",
        &inputs,
        Box::new(f),
    )
    .pop()
    .expect("one output"))
}

/// The layer-norm gradients written in differentiable ops (used under `create_graph`).
fn layer_norm_backward_composite(
    g: &Tensor,
    x: &Tensor,
    ns: &[usize],
    w: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    let r = x.rank();
    let k = ns.len();
    let norm_dims: Vec<i64> = (r - k..r).map(|d| d as i64).collect();
    let outer_dims: Vec<i64> = (0..r - k).map(|d| d as i64).collect();
    let x = if x.dtype().is_reduced_float() {
        x.to_dtype(DType::F32)?
    } else {
        x.clone()
    };
    let g = g.to_dtype(x.dtype())?;
    let mu = mean(&x, &norm_dims, true, None)?;
    let d = sub(&x, &mu)?;
    let var = mean(&square(&d)?, &norm_dims, true, None)?;
    let rstd = rsqrt(&add_scalar(&var, eps)?)?;
    let xhat = mul(&d, &rstd)?;
    let gxhat = match w {
        Some(w) => mul(&g, w)?,
        None => g.clone(),
    };
    let m1 = mean(&gxhat, &norm_dims, true, None)?;
    let m2 = mean(&mul(&gxhat, &xhat)?, &norm_dims, true, None)?;
    let gi = mul(&rstd, &sub(&sub(&gxhat, &m1)?, &mul(&xhat, &m2)?)?)?;
    let gw = match w {
        Some(_) => Some(sum(&mul(&g, &xhat)?, &outer_dims, false, None)?),
        None => None,
    };
    let gb = Some(sum(&g, &outer_dims, false, None)?);
    Ok((gi, gw, gb))
}

/// Zero each element with probability `p` and scale the rest by `1 / (1 - p)` when
/// `training`; the identity otherwise.
pub fn dropout(x: &Tensor, p: f64, training: bool, gen: &mut Generator) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid(
            "dropout",
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        ));
    }
    let ([x], _body) = enter(&DROPOUT, [x])?;
    if !training || p == 0.0 {
        return Ok(x);
    }
    if p == 1.0 {
        return mul_scalar(&x, 0.0);
    }
    // The draws come from the host generator whatever the device, so a seed gives the
    // same mask on every device; the mask then goes to `x`'s device.
    let u = amp_tensor::Tensor::rand(x.dims(), DType::F32, gen)?;
    let keep = amp_kernels::compare_scalar(amp_kernels::CmpOp::Ge, &u, p)?;
    let mask = Tensor::from_raw(keep.to_dtype(x.dtype())?.to_device(x.device())?);
    mul_scalar(&mul(&x, &mask)?, 1.0 / (1.0 - p))
}

/// The dim a class index lives in for loss inputs (`[N, C, ...]` → 1, `[C]` → 0).
pub(crate) fn class_dim(x: &Tensor) -> usize {
    if x.rank() == 1 {
        0
    } else {
        1
    }
}
