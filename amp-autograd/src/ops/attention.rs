//! Scaled dot-product attention (`torch.nn.functional.scaled_dot_product_attention`),
//! as PyTorch's math reference computes it:
//! `softmax(q kᵀ · scale + bias) v`, the bias holding `-inf` where a boolean mask (or
//! the causal mask) is false, or the float mask itself.
//!
//! Without dropout it runs [`amp_kernels::flash_attention`], a loop over blocks of keys
//! with an online softmax that never holds more than one block of scores (its backward
//! recomputes the probabilities block by block from the saved log-sum-exp); under
//! `create_graph` the backward is the formula in differentiable ops, so second
//! derivatives are the math path's (PyTorch's CPU flash kernel has none). With dropout,
//! a mask that needs a gradient or one broadcast in another way, the forward is the
//! composite of differentiable ops (PyTorch's math backend). The op is on the lower-precision lists of PyTorch 2.15 (`torch-2.15`
//! profile): under autocast its floating arguments are cast first, then its body runs
//! with the layer excluded.

use amp_tensor::{DType, Generator};

use super::matmul::matmul;
use super::names::SDPA;
use super::nn::{dropout, safe_softmax};
use super::pointwise::*;
use super::reduce::sum;
use super::shape::transpose;
use super::{check::refused, enter_vec, sum_to};
use crate::grad_mode::is_grad_enabled;
use crate::graph::{record, SavedOutput};
use crate::{Error, Result, Tensor};

/// The optional arguments of [`scaled_dot_product_attention`], PyTorch's defaults by
/// `Default`: no mask, no dropout, not causal, scale `1 / sqrt(E)`.
#[derive(Default)]
pub struct Attention<'a> {
    /// A boolean mask (true: attend) or a float bias added to the scores, broadcast to
    /// `[.., L, S]`.
    pub attn_mask: Option<&'a Tensor>,
    /// Dropout probability on the attention weights (needs `generator` when above 0).
    pub dropout_p: f64,
    /// Query `i` attends to keys `0..=i` only.
    pub is_causal: bool,
    /// The factor applied to `q kᵀ`; `None`: `1 / sqrt(E)`.
    pub scale: Option<f64>,
    /// The random generator of the dropout.
    pub generator: Option<&'a mut Generator>,
    /// Which implementation runs (PyTorch's `torch.nn.attention.sdpa_kernel`).
    pub backend: SdpBackend,
}

/// The implementations of [`scaled_dot_product_attention`], as PyTorch's `SDPBackend`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SdpBackend {
    /// The block loop where the score matrix is large (at least [`FLASH_MIN_SCORES`]
    /// scores in all, where holding it costs memory and the blocks cost no speed) and
    /// it applies; the composite of matrix products and softmax otherwise.
    #[default]
    Auto,
    /// The block loop ([`amp_kernels::flash_attention`]): an error where it does not
    /// apply (dropout, a float mask that needs its gradient, a mask broadcast other
    /// than `[L, S]` or batched like the inputs).
    Flash,
    /// The composite of differentiable ops (PyTorch's math backend).
    Math,
}

/// The number of scores (batch × L × S) from which [`SdpBackend::Auto`] takes the block
/// loop. Measured float32 causal forward + backward, 64-wide heads, 2 cores (AMD EPYC,
/// AVX-512): 64 × 128 × 128 scores, composite 10.0 ms, loop 10.7 ms; 8 × 1024 × 1024,
/// 45.7 ms against 24.7 ms; 4 × 2048 × 2048, 85.5 ms against 43.0 ms (and no 64 MB
/// score matrix per copy).
pub const FLASH_MIN_SCORES: usize = 1 << 22;

/// `softmax(q kᵀ · scale + mask) v` over query `[.., L, E]`, key `[.., S, E]` and value
/// `[.., S, Ev]` (leading dims broadcast), giving `[.., L, Ev]`.
///
/// ```
/// use amp_autograd::{ops, Tensor};
/// # fn main() -> amp_autograd::Result<()> {
/// let q = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [1, 2, 2])?;
/// let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 2, 2])?;
/// let causal = ops::Attention { is_causal: true, ..Default::default() };
/// let y = ops::scaled_dot_product_attention(&q, &q, &v, causal)?;
/// // The first query sees only the first key.
/// assert_eq!(&y.to_vec_f64()[..2], &[1.0, 2.0]);
/// # Ok(())
/// # }
/// ```
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    opts: Attention<'_>,
) -> Result<Tensor> {
    const OP: &str = "scaled_dot_product_attention";
    let float_mask = opts.attn_mask.filter(|m| m.dtype().is_floating_point());
    let mut args = vec![query, key, value];
    args.extend(float_mask);
    let (a, _body) = enter_vec(&SDPA, &args)?;
    let (q, k, v) = (&a[0], &a[1], &a[2]);
    for (name, t) in [("query", q), ("key", k), ("value", v)] {
        if t.rank() < 2 {
            return Err(refused(
                OP,
                format!("{name} must have at least 2 dimensions, got {}", t.rank()),
            ));
        }
    }
    if opts.is_causal && opts.attn_mask.is_some() {
        return Err(refused(
            OP,
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"
                .to_string(),
        ));
    }
    let e = q.dims()[q.rank() - 1];
    let scale = opts.scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mask = match opts.attn_mask {
        Some(m) if m.dtype() == DType::Bool => Some(m.clone()),
        Some(_) => Some(a[3].clone()),
        None => None,
    };
    // The leading (batch) dims the three broadcast to.
    let lead = |t: &Tensor| t.dims()[..t.rank() - 2].to_vec();
    let batch = amp_tensor::broadcast_shapes(
        OP,
        &amp_tensor::broadcast_shapes(OP, &lead(q), &lead(k))?,
        &lead(v),
    )?;
    let scores = batch.iter().product::<usize>() * q.dims()[q.rank() - 2] * k.dims()[k.rank() - 2];
    let try_flash = match opts.backend {
        // The block loop is a host kernel: device tensors take the composite.
        SdpBackend::Auto => {
            opts.dropout_p == 0.0 && scores >= FLASH_MIN_SCORES && q.device().is_cpu()
        }
        SdpBackend::Flash => true,
        SdpBackend::Math => false,
    };
    if try_flash {
        let y = if opts.dropout_p == 0.0 {
            flash(q, k, v, &batch, mask.as_ref(), opts.is_causal, scale)?
        } else {
            None
        };
        match (y, opts.backend) {
            (Some(y), _) => return Ok(y),
            (None, SdpBackend::Flash) => {
                return Err(refused(
                    OP,
                    "No available kernel. Aborting execution. (the flash backend takes no dropout, no float mask that needs a gradient, and a mask of shape [L, S] or batched like the inputs)"
                        .to_string(),
                ))
            }
            (None, _) => {}
        }
    }
    let mut p = probabilities(q, k, mask.as_ref(), opts.is_causal, scale)?;
    if opts.dropout_p > 0.0 {
        let Some(gen) = opts.generator else {
            return Err(Error::invalid(
                OP,
                "dropout_p > 0 needs a generator (Attention::generator)",
            ));
        };
        p = dropout(&p, opts.dropout_p, true, gen)?;
    }
    matmul(&p, v)
}

/// `softmax(q kᵀ · scale + mask)` in differentiable ops (PyTorch's math path); `mask`
/// is boolean (true: attend) or an additive float bias.
fn probabilities(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
) -> Result<Tensor> {
    let (l, s) = (q.dims()[q.rank() - 2], k.dims()[k.rank() - 2]);
    if mask.is_none() {
        return scaled_softmax(&matmul(q, &transpose(k, -2, -1)?)?, scale, causal);
    }
    let mut w = mul_scalar(&matmul(q, &transpose(k, -2, -1)?)?, scale)?;
    let wdt = w.dtype();
    let neg_inf = || Tensor::scalar(f32::NEG_INFINITY).to_dtype(wdt);
    if causal {
        let tril: Vec<bool> = (0..l).flat_map(|i| (0..s).map(move |j| j <= i)).collect();
        let keep =
            Tensor::from_raw(amp_tensor::Tensor::from_vec(tril, [l, s])?.to_device(w.device())?);
        w = where_(&keep, &w, &neg_inf()?)?;
    }
    match mask {
        Some(m) if m.dtype() == DType::Bool => w = where_(m, &w, &neg_inf()?)?,
        Some(m) => w = add(&w, m)?,
        None => {}
    }
    safe_softmax(&w)
}

/// `softmax(scale · w)` over the last dim, causally masked with `causal`, as one op
/// ([`amp_kernels::scaled_softmax`]: one launch on a device for the math path's scalar
/// product, mask and softmax, and one for their backward). Under `create_graph` the
/// backward is the formula in differentiable ops, `scale · y (g - Σ g y)`.
fn scaled_softmax(w: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let out = amp_kernels::scaled_softmax(w.data(), scale, causal)?;
    let y = SavedOutput::new(&out, 0);
    Ok(record(out, "SoftmaxBackward0", &[w], move |g| {
        let y = y.get();
        Ok(vec![Some(if is_grad_enabled() {
            let gy = sum(&mul(g, &y)?, &[-1], true, None)?;
            mul_scalar(&mul(&y, &sub(g, &gy)?)?, scale)?
        } else {
            Tensor::from_raw(amp_kernels::scaled_softmax_backward(
                g.data(),
                y.data(),
                scale,
            )?)
        })])
    }))
}

/// The attention through the block-at-a-time kernel ([`amp_kernels::flash_attention`]),
/// or `None` where it does not apply: a mask that is neither `[L, S]` nor batched like
/// the inputs, or a float mask that needs its own gradient (the composite path runs
/// then). The backward runs the kernel's block loop too, and under `create_graph` the
/// formula in differentiable ops, so the second derivatives are the math path's.
fn flash(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    batch: &[usize],
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
) -> Result<Option<Tensor>> {
    use amp_kernels::{flash_attention, flash_attention_backward, FlashOptions};
    use amp_tensor::Tensor as Raw;
    let (l, e) = (q.dims()[q.rank() - 2], q.dims()[q.rank() - 1]);
    let (s, ev) = (k.dims()[k.rank() - 2], v.dims()[v.rank() - 1]);
    if k.dims()[k.rank() - 1] != e || v.dims()[v.rank() - 2] != s {
        return Ok(None); // the composite path reports the mismatch as matmul does
    }
    let bsz: usize = batch.iter().product();
    let lead_dims = batch.to_vec();
    let with =
        move |last: [usize; 2]| -> Vec<usize> { lead_dims.iter().copied().chain(last).collect() };
    let with_c = with.clone();
    let flat = move |t: &Raw, last: [usize; 2]| -> Result<Raw> {
        Ok(t.expand(with(last))?
            .try_contiguous()?
            .reshape(vec![bsz, last[0], last[1]])?)
    };
    let bias = match mask {
        None => None,
        Some(m) => {
            if m.requires_grad() || m.rank() < 2 || m.dims()[m.rank() - 2..] != [l, s] {
                return Ok(None);
            }
            let mlead = &m.dims()[..m.rank() - 2];
            let nb = if mlead.iter().all(|&d| d == 1) {
                1
            } else if mlead == batch {
                bsz
            } else {
                return Ok(None);
            };
            let raw = m.data().try_contiguous()?.reshape(vec![nb, l, s])?;
            Some(if m.dtype() == DType::Bool {
                let keep: Vec<bool> = raw.try_to_vec_as()?;
                let b: Vec<f32> = keep
                    .iter()
                    .map(|&t| if t { 0.0 } else { f32::NEG_INFINITY })
                    .collect();
                Raw::from_vec(b, vec![nb, l, s])?
            } else {
                raw
            })
        }
    };
    let (qf, kf, vf) = (
        flat(q.data(), [l, e])?,
        flat(k.data(), [s, e])?,
        flat(v.data(), [s, ev])?,
    );
    let fo = FlashOptions {
        scale,
        causal,
        bias: bias.as_ref(),
    };
    let (out, lse) = flash_attention(&qf, &kf, &vf, fo)?;
    let y = out.reshape(with_c([l, ev]))?;
    let (qs, ks, vs, mask) = (q.clone(), k.clone(), v.clone(), mask.cloned());
    Ok(Some(record(
        y,
        "ScaledDotProductFlashAttentionForCpuBackward0",
        &[q, k, v],
        move |g| {
            let (dq, dk, dv) = if is_grad_enabled() {
                // create_graph: the math path's formula, differentiable again.
                let p = probabilities(&qs, &ks, mask.as_ref(), causal, scale)?;
                let dv = matmul(&transpose(&p, -2, -1)?, g)?;
                let dp = matmul(g, &transpose(&vs, -2, -1)?)?;
                let row = sum(&mul(&dp, &p)?, &[-1], true, None)?;
                let ds = mul_scalar(&mul(&p, &sub(&dp, &row)?)?, scale)?;
                (
                    matmul(&ds, &ks)?,
                    matmul(&transpose(&ds, -2, -1)?, &qs)?,
                    dv,
                )
            } else {
                let fo = FlashOptions {
                    scale,
                    causal,
                    bias: bias.as_ref(),
                };
                let gf = flat(g.data(), [l, ev])?;
                let (dq, dk, dv) = flash_attention_backward(&qf, &kf, &vf, &out, &gf, &lse, fo)?;
                let back = |t: Raw, last: [usize; 2]| -> Result<Tensor> {
                    Ok(Tensor::from_raw(t.reshape(with_c(last))?))
                };
                (back(dq, [l, e])?, back(dk, [s, e])?, back(dv, [s, ev])?)
            };
            Ok(vec![
                Some(sum_to(&dq, qs.dims())?),
                Some(sum_to(&dk, ks.dims())?),
                Some(sum_to(&dv, vs.dims())?),
            ])
        },
    )))
}

/// The weights of [`multi_head_attention_forward`] (PyTorch's packed in-projection).
pub struct MultiHeadWeights<'a> {
    /// `[3E, E]`: the query, key and value projections stacked.
    pub in_proj_weight: &'a Tensor,
    /// `[3E]`.
    pub in_proj_bias: Option<&'a Tensor>,
    /// `[E, E]`.
    pub out_proj_weight: &'a Tensor,
    /// `[E]`.
    pub out_proj_bias: Option<&'a Tensor>,
}

/// `torch.nn.functional.multi_head_attention_forward` without attention weights
/// (`need_weights=False`, the path `nn.MultiheadAttention` takes for speed): query
/// `[L, N, E]`, key and value `[S, N, E]` (sequence first), `num_heads` heads of
/// `E / num_heads`; the projections, then [`scaled_dot_product_attention`] per head
/// (`opts` carries the mask, a `[L, S]` or `[N·heads, L, S]` boolean or float mask,
/// and the dropout), then the output projection. Returns `[L, N, E]`.
///
/// The mask follows `nn.MultiheadAttention`'s convention, not
/// [`scaled_dot_product_attention`]'s: a boolean `true` marks a position that may
/// **not** be attended (PyTorch's `_canonical_mask` turns it into `-inf`); a float mask
/// is added to the scores.
pub fn multi_head_attention_forward(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    num_heads: usize,
    weights: MultiHeadWeights<'_>,
    opts: Attention<'_>,
) -> Result<Tensor> {
    const OP: &str = "multi_head_attention_forward";
    use super::matmul::linear;
    use super::shape::{contiguous, narrow, permute, reshape, split};
    if query.rank() != 3 || key.rank() != 3 || value.rank() != 3 {
        return Err(refused(
            OP,
            format!(
                "query, key and value should be 3-D (L, N, E), got {}-D, {}-D and {}-D",
                query.rank(),
                key.rank(),
                value.rank()
            ),
        ));
    }
    let (l, n, e) = (query.dims()[0], query.dims()[1], query.dims()[2]);
    let s = key.dims()[0];
    if num_heads == 0 || e % num_heads != 0 {
        return Err(refused(
            OP,
            format!("embed_dim {e} not divisible by num_heads {num_heads}"),
        ));
    }
    let hd = e / num_heads;
    let (w, b) = (weights.in_proj_weight, weights.in_proj_bias);
    // Self-attention (`query is key is value`, PyTorch's `_in_projection_packed`): one
    // product with the whole [3E, E] weight, split three ways, so the backward is one
    // product pair and one `cat` instead of three of each plus a zero-filled scatter per
    // weight and bias part. Its rows are taken batch-major ([N, L, E]) when that is how
    // the input lies (a batch-first caller's transposed view): no copy on the way in,
    // none on the way out.
    let packed = query.id() == key.id() && key.id() == value.id();
    let batch_major = packed && n > 1 && l > 1 && query.data().transpose(0, 1)?.is_contiguous();
    // [L, N, heads, hd] (or [N, L, heads, hd] batch-major) -> [N, heads, L, hd]
    let order: &[i64] = if batch_major {
        &[0, 2, 1, 3]
    } else {
        &[1, 2, 0, 3]
    };
    let heads = |x: &Tensor, len: usize| -> Result<Tensor> {
        let dims = if batch_major {
            [n, len, num_heads, hd]
        } else {
            [len, n, num_heads, hd]
        };
        permute(&reshape(x, dims)?, order)
    };
    let (q, k, v) = if packed {
        let x = if batch_major {
            transpose(query, 0, 1)?
        } else {
            query.clone()
        };
        // [.., 3E] -> [.., 3, heads, hd] -> [3, N, heads, L, hd] in one copy, split on
        // the 3: q, k and v come out contiguous, so the batched products read them in
        // place (split first, each would be gathered on its own), and the backward
        // is one `cat` of contiguous gradients and one copy back.
        let (a, c) = if batch_major { (n, l) } else { (l, n) };
        let to_heads: &[i64] = if batch_major {
            &[2, 0, 3, 1, 4]
        } else {
            &[2, 1, 3, 0, 4]
        };
        let qkv = contiguous(&permute(
            &reshape(&linear(&x, w, b)?, [a, c, 3, num_heads, hd])?,
            to_heads,
        )?)?;
        let qkv = split(&qkv, 1, 0)?;
        let part = |i: usize| reshape(&qkv[i], [n, num_heads, l, hd]);
        (part(0)?, part(1)?, part(2)?)
    } else {
        let part = |t: &Tensor, i: usize| narrow(t, 0, i * e, e);
        let proj = |x: &Tensor, i: usize| -> Result<Tensor> {
            let bi = b.map(|b| part(b, i)).transpose()?;
            linear(x, &part(w, i)?, bi.as_ref())
        };
        (
            heads(&proj(query, 0)?, l)?,
            heads(&proj(key, 1)?, s)?,
            heads(&proj(value, 2)?, s)?,
        )
    };
    // A per-(batch, head) mask [N·heads, L, S] becomes [N, heads, L, S]; a [L, S] one
    // broadcasts.
    // A boolean mask says where not to attend; the attention op's says where to.
    let mask = match opts.attn_mask {
        Some(m) if m.dtype() == DType::Bool => {
            Some(Tensor::from_raw(amp_kernels::logical_not(m.data())?))
        }
        Some(m) => Some(m.clone()),
        None => None,
    };
    let mask = match mask {
        Some(m) if m.rank() == 3 => Some(reshape(&m, [n, num_heads, l, s])?),
        m => m,
    };
    let o = scaled_dot_product_attention(
        &q,
        &k,
        &v,
        Attention {
            attn_mask: mask.as_ref(),
            ..opts
        },
    )?;
    // [N, heads, L, hd] -> [L, N, E] (batch-major: [N, L, E], returned transposed)
    let back: &[i64] = if batch_major {
        &[0, 2, 1, 3]
    } else {
        &[2, 0, 1, 3]
    };
    let o = reshape(&contiguous(&permute(&o, back)?)?, [l * n, e])?;
    let o = linear(&o, weights.out_proj_weight, weights.out_proj_bias)?;
    if batch_major {
        transpose(&reshape(&o, [n, l, e])?, 0, 1)
    } else {
        reshape(&o, [l, n, e])
    }
}
