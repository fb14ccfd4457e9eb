//! Scaled dot-product attention computed a block of keys at a time (the
//! flash-attention loop): the scores of at most [`BQ`]×[`BK`] query-key pairs exist at
//! once, in the compute type (float32 for f16/bf16/f32, float64 for f64), with an
//! online softmax (running maximum and sum per query row). The forward also returns
//! each row's log-sum-exp, from which the backward recomputes the probabilities block
//! by block (FlashAttention-2's backward), so no `[L, S]` matrix is ever allocated.
//!
//! Inputs are `[B, L, E]` queries, `[B, S, E]` keys and `[B, S, Ev]` values
//! (contiguous; the caller flattens and broadcasts leading dims), an optional additive
//! bias `[1 or B, L, S]` (a boolean mask is `0` / `-inf`), the causal flag (query `i`
//! sees keys `0..=i`, PyTorch's top-left `tril`) and the scale. A row whose scores are
//! all `-inf` (every key masked) gives zeros and no gradient, as PyTorch's attention
//! does (its `_safe_softmax`; a plain `softmax` over such a row is NaN); its
//! log-sum-exp is `-inf`.

use std::sync::Mutex;

use amp_tensor::{cast_into, ensure, Element, Error, Result, Tensor};

use crate::compute::{with_slice, Real};
use crate::conv::{gemm_into, Mat};
use crate::vmath;
use gemm::Parallelism;

/// Query rows per block.
const BQ: usize = 32;
/// Keys per block.
const BK: usize = 64;

/// The options of [`flash_attention`] and [`flash_attention_backward`].
#[derive(Clone, Copy, Debug)]
pub struct FlashOptions<'a> {
    /// The factor applied to `q kᵀ`.
    pub scale: f64,
    /// Query `i` attends to keys `0..=i` only.
    pub causal: bool,
    /// An additive bias `[1 or B, L, S]` (any floating dtype).
    pub bias: Option<&'a Tensor>,
}

/// The shapes, checked: `(B, L, S, E, Ev)`.
fn geometry(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(usize, usize, usize, usize, usize)> {
    let bad = |why: String| Err(Error::invalid("scaled_dot_product_attention", why));
    if q.rank() != 3 || k.rank() != 3 || v.rank() != 3 {
        return bad("flash attention takes [B, L, E], [B, S, E], [B, S, Ev]".into());
    }
    let (b, l, e) = (q.dims()[0], q.dims()[1], q.dims()[2]);
    let (s, ev) = (k.dims()[1], v.dims()[2]);
    if k.dims() != [b, s, e] || v.dims()[..2] != [b, s] {
        return bad(format!(
            "flash attention: query {:?}, key {:?} and value {:?} do not agree",
            q.dims(),
            k.dims(),
            v.dims()
        ));
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::DTypeMismatch {
            op: "scaled_dot_product_attention",
            expected: q.dtype(),
            got: if q.dtype() != k.dtype() {
                k.dtype()
            } else {
                v.dtype()
            },
        });
    }
    Ok((b, l, s, e, ev))
}

/// The bias as `(values, batch stride)` in the compute type.
fn bias_of<C: Real>(t: &Tensor, b: usize, l: usize, s: usize) -> Result<(Vec<C>, usize)> {
    let d = t.dims();
    ensure!(
        !(t.rank() != 3 || d[1..] != [l, s] || (d[0] != 1 && d[0] != b)),
        invalid(
            "scaled_dot_product_attention",
            "flash attention: the bias {d:?} is not [1 or {b}, {l}, {s}]"
        )
    );
    let stride = if d[0] == 1 { 0 } else { l * s };
    Ok((t.try_contiguous()?.host_vec_as::<C>()?, stride))
}

/// The per-batch view the loops read.
struct Batch<'a, C> {
    q: &'a [C],
    k: &'a [C],
    v: &'a [C],
    bias: Option<&'a [C]>,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    scale: C,
    causal: bool,
}

/// Row-major `data` with row stride `rs`, as a [`gemm_into`] operand.
fn rows<C>(data: &[C], rs: usize) -> Mat<'_, C> {
    (data, rs, 1)
}

/// The transpose of row-major `data` with row stride `rs`.
fn cols<C>(data: &[C], rs: usize) -> Mat<'_, C> {
    (data, 1, rs)
}

/// The shared strided product (`faer`), single-threaded: the callers split the work
/// by batch.
#[allow(clippy::too_many_arguments)]
fn product<C: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [C],
    ldd: usize,
    accumulate: bool,
    a: Mat<'_, C>,
    b: Mat<'_, C>,
) {
    gemm_into(m, n, k, dst, ldd, accumulate, a, b, Parallelism::None)
}

impl<C: Real> Batch<'_, C> {
    /// Scores of query block `i0..i1` against keys `j0..j1` into `sc` (row stride
    /// `BK`): `q kᵀ · scale + bias`, `-inf` where the causal mask hides a key.
    #[inline(always)]
    fn scores(&self, i0: usize, i1: usize, j0: usize, j1: usize, sc: &mut [C]) {
        let (e, nk) = (self.e, j1 - j0);
        let q = rows(&self.q[i0 * e..], e);
        let kt = cols(&self.k[j0 * e..], e);
        product(i1 - i0, nk, e, sc, BK, false, q, kt);
        for (r, i) in (i0..i1).enumerate() {
            let row = &mut sc[r * BK..r * BK + nk];
            for o in row.iter_mut() {
                *o = *o * self.scale;
            }
            if let Some(bias) = self.bias {
                for (o, &bv) in row.iter_mut().zip(&bias[i * self.s + j0..i * self.s + j1]) {
                    *o = *o + bv;
                }
            }
            if self.causal && j1 > i + 1 {
                for o in &mut row[(i + 1).saturating_sub(j0)..] {
                    *o = C::neg_infinity();
                }
            }
        }
    }

    /// The end of the keys query block `..i1` can see (all of them unless causal).
    #[inline(always)]
    fn key_end(&self, i1: usize) -> usize {
        if self.causal {
            self.s.min(i1)
        } else {
            self.s
        }
    }

    /// Forward of one batch: `out` `[L][Ev]`, `lse` `[L]`.
    #[inline(always)]
    fn forward(&self, out: &mut [C], lse: &mut [C]) {
        let ev = self.ev;
        let mut sc = vec![C::zero(); BQ * BK];
        let mut m = [C::neg_infinity(); BQ];
        let mut sum = [C::zero(); BQ];
        for i0 in (0..self.l).step_by(BQ) {
            let i1 = (i0 + BQ).min(self.l);
            let acc = &mut out[i0 * ev..i1 * ev];
            acc.fill(C::zero());
            m.fill(C::neg_infinity());
            sum.fill(C::zero());
            let end = self.key_end(i1);
            for j0 in (0..end).step_by(BK) {
                let j1 = (j0 + BK).min(end);
                self.scores(i0, i1, j0, j1, &mut sc);
                for r in 0..i1 - i0 {
                    let row = &mut sc[r * BK..r * BK + (j1 - j0)];
                    let bmax = row.iter().fold(C::neg_infinity(), |a, &x| a.max(x));
                    let mut m_new = m[r].max(bmax);
                    if m_new == C::neg_infinity() {
                        // `max` skips NaN: a block of NaN (and `-inf`) scores is NaN, not
                        // masked (a NaN beside finite scores reaches the sums anyway).
                        if !row.iter().any(|x| x.is_nan()) {
                            row.fill(C::zero()); // nothing visible yet in this row
                            continue;
                        }
                        m_new = C::nan();
                    }
                    let alpha = (m[r] - m_new).exp_v();
                    let mut bsum = C::zero();
                    for x in row.iter_mut() {
                        *x = (*x - m_new).exp_v();
                        bsum = bsum + *x;
                    }
                    sum[r] = sum[r] * alpha + bsum;
                    m[r] = m_new;
                    for o in &mut acc[r * ev..(r + 1) * ev] {
                        *o = *o * alpha;
                    }
                }
                let p = rows(&sc, BK);
                let v = rows(&self.v[j0 * ev..], ev);
                product(i1 - i0, ev, j1 - j0, acc, ev, true, p, v);
            }
            for r in 0..i1 - i0 {
                if m[r] == C::neg_infinity() {
                    // Every score -inf: the row stays 0 (`acc` was never added to).
                    lse[i0 + r] = C::neg_infinity();
                    continue;
                }
                let inv = C::one() / sum[r];
                for o in &mut acc[r * ev..(r + 1) * ev] {
                    *o = *o * inv;
                }
                lse[i0 + r] = m[r] + sum[r].ln();
            }
        }
    }

    /// Backward of one batch into `dq` `[L][E]`, `dk` `[S][E]`, `dv` `[S][Ev]`
    /// (overwritten), from `out`, `dout` (`[L][Ev]`) and `lse`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn backward(&self, out: &[C], dout: &[C], lse: &[C], dq: &mut [C], dk: &mut [C], dv: &mut [C]) {
        let (e, ev) = (self.e, self.ev);
        dq.fill(C::zero());
        dk.fill(C::zero());
        dv.fill(C::zero());
        // D_i = dO_i · O_i.
        let d: Vec<C> = (0..self.l)
            .map(|i| {
                let (o, g) = (&out[i * ev..(i + 1) * ev], &dout[i * ev..(i + 1) * ev]);
                o.iter().zip(g).fold(C::zero(), |a, (&x, &y)| a + x * y)
            })
            .collect();
        let mut p = vec![C::zero(); BQ * BK];
        let mut ds = vec![C::zero(); BQ * BK];
        for j0 in (0..self.s).step_by(BK) {
            let j1 = (j0 + BK).min(self.s);
            let nk = j1 - j0;
            // Causal: query i sees key j only when j <= i.
            let first = if self.causal { j0 } else { 0 };
            for i0 in (first - first % BQ..self.l).step_by(BQ) {
                let i1 = (i0 + BQ).min(self.l);
                let bq = i1 - i0;
                self.scores(i0, i1, j0, j1, &mut p);
                for (r, i) in (i0..i1).enumerate() {
                    let row = &mut p[r * BK..r * BK + nk];
                    if lse[i] == C::neg_infinity() {
                        row.fill(C::zero()); // a row with every key masked: probability 0
                        continue;
                    }
                    for x in row {
                        *x = (*x - lse[i]).exp_v();
                    }
                }
                let g = rows(&dout[i0 * ev..], ev);
                // dV_j += Pᵀ dO_i.
                product(nk, ev, bq, &mut dv[j0 * ev..], ev, true, cols(&p, BK), g);
                // dP = dO_i V_jᵀ, then dS = P (dP - D) · scale.
                let vt = cols(&self.v[j0 * ev..], ev);
                product(bq, nk, ev, &mut ds, BK, false, g, vt);
                for (r, i) in (i0..i1).enumerate() {
                    let (pr, dr) = (&p[r * BK..r * BK + nk], &mut ds[r * BK..r * BK + nk]);
                    for (o, &pij) in dr.iter_mut().zip(pr) {
                        *o = pij * (*o - d[i]) * self.scale;
                    }
                }
                // dQ_i += dS K_j; dK_j += dSᵀ Q_i.
                let kj = rows(&self.k[j0 * e..], e);
                product(bq, e, nk, &mut dq[i0 * e..], e, true, rows(&ds, BK), kj);
                let qi = rows(&self.q[i0 * e..], e);
                product(nk, e, bq, &mut dk[j0 * e..], e, true, cols(&ds, BK), qi);
            }
        }
    }
}

/// Whether the loops run in their AVX-512 compilation.
fn avx512() -> bool {
    vmath::level() == Some(vmath::Level::Avx512)
}

/// [`Batch::forward`] and [`Batch::backward`] compiled for AVX-512 (the loops vectorise
/// at that width; the arithmetic is the same, unfused, so results do not depend on the
/// path). A closure handed to a `target_feature` function is compiled without the
/// features, so these are functions of their own.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{Batch, Real};

    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
    pub(super) fn forward<C: Real>(b: &Batch<'_, C>, out: &mut [C], lse: &mut [C]) {
        b.forward(out, lse)
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
    pub(super) fn backward<C: Real>(
        b: &Batch<'_, C>,
        out: &[C],
        dout: &[C],
        lse: &[C],
        dq: &mut [C],
        dk: &mut [C],
        dv: &mut [C],
    ) {
        b.backward(out, dout, lse, dq, dk, dv)
    }
}

/// The inputs widened to the compute type, with the geometry and options.
struct Inputs<C> {
    q: Vec<C>,
    k: Vec<C>,
    v: Vec<C>,
    bias: Option<(Vec<C>, usize)>,
    dims: (usize, usize, usize, usize, usize),
    scale: C,
    causal: bool,
}

impl<C: Real> Inputs<C> {
    fn new<T: Element>(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        opts: FlashOptions<'_>,
        dims: (usize, usize, usize, usize, usize),
    ) -> Result<Self> {
        let (b, l, s, _, _) = dims;
        let bias = match opts.bias {
            Some(t) => Some(bias_of::<C>(t, b, l, s)?),
            None => None,
        };
        Ok(Inputs {
            q: widen::<T, C>(q)?,
            k: widen::<T, C>(k)?,
            v: widen::<T, C>(v)?,
            bias,
            dims,
            scale: C::from_f64c(opts.scale),
            causal: opts.causal,
        })
    }

    /// Batch `bi`'s view.
    fn batch(&self, bi: usize) -> Batch<'_, C> {
        let (_, l, s, e, ev) = self.dims;
        Batch {
            q: &self.q[bi * l * e..(bi + 1) * l * e],
            k: &self.k[bi * s * e..(bi + 1) * s * e],
            v: &self.v[bi * s * ev..(bi + 1) * s * ev],
            bias: self
                .bias
                .as_ref()
                .map(|(b, stride)| &b[bi * stride..bi * stride + l * s]),
            l,
            s,
            e,
            ev,
            scale: self.scale,
            causal: self.causal,
        }
    }
}

/// A tensor widened to the compute type.
fn widen<T: Element, C: Real>(t: &Tensor) -> Result<Vec<C>> {
    let t = t.try_contiguous()?;
    with_slice::<T, _>(&t, |s| {
        let mut w = amp_tensor::pool::try_zeroed::<C>(s.len())?;
        cast_into(s, &mut w);
        Ok(w)
    })?
}

/// Attention output `[B, L, Ev]` (the inputs' dtype) and the per-row log-sum-exp
/// `[B, L]` (float32, float64 for float64 inputs) the backward needs.
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: FlashOptions<'_>,
) -> Result<(Tensor, Tensor)> {
    let (b, l, s, e, ev) = geometry(q, k, v)?;
    crate::float_kernel!(q.dtype(), "scaled_dot_product_attention", |T, C| {
        let inputs = Inputs::<C>::new::<T>(q, k, v, opts, (b, l, s, e, ev))?;
        let mut out = amp_tensor::pool::try_zeroed::<C>(b * l * ev)?;
        let mut lse = amp_tensor::pool::try_zeroed::<C>(b * l)?;
        {
            let parts: Vec<_> = out
                .chunks_mut((l * ev).max(1))
                .zip(lse.chunks_mut(l.max(1)))
                .map(Mutex::new)
                .collect();
            amp_tensor::parallel::for_each(parts.len(), &|bi| {
                let mut part = parts[bi].lock().unwrap_or_else(|e| e.into_inner());
                let (o, m) = &mut *part;
                let batch = inputs.batch(bi);
                #[cfg(target_arch = "x86_64")]
                if avx512() {
                    // SAFETY: the CPU has AVX-512F/DQ/VL and FMA (`vmath::level`).
                    unsafe { wide::forward(&batch, o, m) };
                    return;
                }
                batch.forward(o, m);
            });
        }
        let mut narrow = amp_tensor::pool::try_zeroed::<T>(out.len())?;
        cast_into(&out, &mut narrow);
        Ok((
            Tensor::from_vec(narrow, vec![b, l, ev])?,
            Tensor::from_vec(lse, vec![b, l])?,
        ))
    })
}

/// The gradients `(dq, dk, dv)` of [`flash_attention`] for the output gradient `dout`
/// `[B, L, Ev]`, from its output and log-sum-exp (the probabilities are recomputed a
/// block at a time).
pub fn flash_attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    dout: &Tensor,
    lse: &Tensor,
    opts: FlashOptions<'_>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, l, s, e, ev) = geometry(q, k, v)?;
    ensure!(!(out.dims() != [b, l, ev] || dout.dims() != [b, l, ev] || lse.dims() != [b, l]), invalid("scaled_dot_product_attention", "flash attention backward: output {:?}, its gradient {:?} and log-sum-exp {:?} do not match [{b}, {l}, {ev}]", out.dims(), dout.dims(), lse.dims()));
    crate::float_kernel!(q.dtype(), "scaled_dot_product_attention", |T, C| {
        let inputs = Inputs::<C>::new::<T>(q, k, v, opts, (b, l, s, e, ev))?;
        let oc: Vec<C> = out.try_contiguous()?.host_vec_as()?;
        let gc: Vec<C> = dout.try_contiguous()?.host_vec_as()?;
        let lc: Vec<C> = lse.try_contiguous()?.host_vec_as()?;
        let mut dq = amp_tensor::pool::try_zeroed::<C>(b * l * e)?;
        let mut dk = amp_tensor::pool::try_zeroed::<C>(b * s * e)?;
        let mut dv = amp_tensor::pool::try_zeroed::<C>(b * s * ev)?;
        {
            let parts: Vec<_> = dq
                .chunks_mut((l * e).max(1))
                .zip(dk.chunks_mut((s * e).max(1)))
                .zip(dv.chunks_mut((s * ev).max(1)))
                .map(Mutex::new)
                .collect();
            amp_tensor::parallel::for_each(parts.len(), &|bi| {
                let mut part = parts[bi].lock().unwrap_or_else(|e| e.into_inner());
                let ((gq, gk), gv) = &mut *part;
                let batch = inputs.batch(bi);
                let rows = bi * l * ev..(bi + 1) * l * ev;
                let (o, g) = (&oc[rows.clone()], &gc[rows]);
                let lse = &lc[bi * l..(bi + 1) * l];
                #[cfg(target_arch = "x86_64")]
                if avx512() {
                    // SAFETY: the CPU has AVX-512F/DQ/VL and FMA (`vmath::level`).
                    unsafe { wide::backward(&batch, o, g, lse, gq, gk, gv) };
                    return;
                }
                batch.backward(o, g, lse, gq, gk, gv);
            });
        }
        let narrow = |c: Vec<C>, dims: Vec<usize>| -> Result<Tensor> {
            let mut t = amp_tensor::pool::try_zeroed::<T>(c.len())?;
            cast_into(&c, &mut t);
            Tensor::from_vec(t, dims)
        };
        Ok((
            narrow(dq, vec![b, l, e])?,
            narrow(dk, vec![b, s, e])?,
            narrow(dv, vec![b, s, ev])?,
        ))
    })
}
