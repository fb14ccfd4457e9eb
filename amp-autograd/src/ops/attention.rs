//! Scaled dot-product attention (`torch.nn.functional.scaled_dot_product_attention`),
//! as PyTorch's math reference computes it:
//! `softmax(q kᵀ · scale + bias) v`, the bias holding `-inf` where a boolean mask (or
//! the causal mask) is false, or the float mask itself.
//!
//! The forward is a composite of differentiable ops, so its first and second
//! derivatives are the formula's (PyTorch's math backend; its CPU flash kernel has no
//! double backward). The op is on the lower-precision lists of PyTorch 2.15 (`torch-2.15`
//! profile): under autocast its floating arguments are cast first, then its body runs
//! with the layer excluded.

use amp_tensor::{DType, Generator};

use super::matmul::matmul;
use super::nn::{dropout, softmax};
use super::pointwise::*;
use super::shape::transpose;
use super::{check::refused, enter_vec};
use crate::dispatch::OpName;
use crate::{Error, Result, Tensor};

static SDPA: OpName = OpName::opaque("scaled_dot_product_attention");

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
}

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
    let (l, e) = (q.dims()[q.rank() - 2], q.dims()[q.rank() - 1]);
    let s = k.dims()[k.rank() - 2];
    let scale = opts.scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mut w = mul_scalar(&matmul(q, &transpose(k, -2, -1)?)?, scale)?;
    let wdt = w.dtype();
    let neg_inf = || Tensor::scalar(f32::NEG_INFINITY).to_dtype(wdt);
    if opts.is_causal {
        let tril: Vec<bool> = (0..l).flat_map(|i| (0..s).map(move |j| j <= i)).collect();
        let keep = Tensor::from_vec(tril, [l, s])?;
        w = where_(&keep, &w, &neg_inf()?)?;
    }
    match opts.attn_mask {
        Some(m) if m.dtype() == DType::Bool => w = where_(m, &w, &neg_inf()?)?,
        Some(_) => w = add(&w, &a[3])?,
        None => {}
    }
    let mut p = softmax(&w, -1, None)?;
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
    use super::shape::{contiguous, narrow, permute, reshape};
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
    let part = |t: &Tensor, i: usize| narrow(t, 0, i * e, e);
    let (w, b) = (weights.in_proj_weight, weights.in_proj_bias);
    let proj = |x: &Tensor, i: usize| -> Result<Tensor> {
        let bi = b.map(|b| part(b, i)).transpose()?;
        linear(x, &part(w, i)?, bi.as_ref())
    };
    // [len, N, E] -> [N, heads, len, hd]
    let heads = |x: Tensor, len: usize| -> Result<Tensor> {
        permute(&reshape(&x, [len, n, num_heads, hd])?, &[1, 2, 0, 3])
    };
    let q = heads(proj(query, 0)?, l)?;
    let k = heads(proj(key, 1)?, s)?;
    let v = heads(proj(value, 2)?, s)?;
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
    // [N, heads, L, hd] -> [L, N, E]
    let o = reshape(&contiguous(&permute(&o, &[2, 0, 1, 3])?)?, [l * n, e])?;
    let o = linear(&o, weights.out_proj_weight, weights.out_proj_bias)?;
    reshape(&o, [l, n, e])
}
