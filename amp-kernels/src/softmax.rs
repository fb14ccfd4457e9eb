//! Softmax and log-softmax along one dim, and their fused backward helpers.
//!
//! Each line along `dim` is processed in the compute type (f32 for f16/bf16/f32, f64
//! for f64) and rounded once: the maximum is subtracted before exponentiating, so
//! large inputs do not overflow. f32 uses a vectorised exponential (Cephes' polynomial,
//! about 1 ulp; AVX2 when the CPU has it). Rows run in parallel when large; lines along
//! other dims are transposed in small tiles (see `map_lines`).

use amp_tensor::{promote_types, DType, Element, Error, Result, Tensor};

use crate::compute::{with_slice, Real};
use crate::reduce::{
    as_same, as_same_mut, cast_opt, lane_sum, line_geometry, map_lines, max_nan, Num,
};
#[cfg(target_arch = "x86_64")]
use crate::rows512::{self, RowOp};
use crate::vmath::{self, Level};

#[cfg(target_arch = "x86_64")]
mod rows_avx2;

/// Float compute types with a fast shifted exponential over slices.
pub(crate) trait FastExp: Real + Num {
    /// `y[i] = exp(x[i] - shift)` for `x[i] <= shift` (NaN propagates), returning the
    /// sum of `y`. Always inlined, so it takes the SIMD level of its caller.
    fn exp_shift_into(x: &[Self], shift: Self, y: &mut [Self]) -> Self;

    /// [`FastExp::exp_shift_into`] for callers compiled with FMA (f32 then fuses its
    /// polynomial; other types fall back to the plain one).
    #[inline(always)]
    fn exp_shift_into_fma(x: &[Self], shift: Self, y: &mut [Self]) -> Self {
        Self::exp_shift_into(x, shift, y)
    }

    /// `sum(exp(x[i] - shift))` for `x[i] <= shift`, without storing the terms.
    #[inline(always)]
    fn exp_shift_sum(x: &[Self], shift: Self) -> Self {
        // A plain loop (no iterator adapter): it must inline into AVX2 callers.
        let mut buf = [Self::ZERO; 256];
        let mut s = Self::ZERO;
        for c in x.chunks(256) {
            s = s + Self::exp_shift_into(c, shift, &mut buf[..c.len()]);
        }
        s
    }

    /// `(max(x), sum(exp(x - max(x))))`, NaN-propagating (AVX2 for f32 when present).
    fn max_exp_sum(x: &[Self]) -> (Self, Self) {
        max_exp_sum_body(x)
    }
}

#[inline(always)]
fn max_exp_sum_body<C: FastExp>(x: &[C]) -> (C, C) {
    let m = max_nan(x);
    (m, C::exp_shift_sum(x, m))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_exp_sum_avx2(x: &[f32]) -> (f32, f32) {
    max_exp_sum_body(x)
}

impl FastExp for f64 {
    #[inline(always)]
    fn exp_shift_into(x: &[f64], shift: f64, y: &mut [f64]) -> f64 {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = (v - shift).exp();
        }
        lane_sum(y)
    }
}

impl FastExp for f32 {
    #[inline(always)]
    fn exp_shift_into(x: &[f32], shift: f32, y: &mut [f32]) -> f32 {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = exp_le0(v - shift);
        }
        lane_sum(y)
    }

    #[inline(always)]
    fn exp_shift_into_fma(x: &[f32], shift: f32, y: &mut [f32]) -> f32 {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = vmath::exp_fma_le0(v - shift);
        }
        lane_sum(y)
    }

    fn max_exp_sum(x: &[f32]) -> (f32, f32) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { max_exp_sum_avx2(x) };
        }
        max_exp_sum_body(x)
    }
}

/// `exp(x)` for the kernels (which call it on `x - max <= 0`): [`vmath::exp`].
#[inline(always)]
fn exp_le0(x: f32) -> f32 {
    vmath::exp(x)
}

/// Define a line kernel `fn $name<C: FastExp>(ins: &[&[C]], out: &mut [C])` whose body
/// runs on f32 compiled for AVX-512 or AVX2 with FMA (the `exp` polynomial fused, the
/// same bits at both widths), or for AVX2 alone, as the CPU has them (portable code
/// otherwise). Fused on an AVX2-only EPYC, one core, softmax over `[1024, 1024]` went
/// from 6.5 to 8.5 GB/s in float32 and from 3.1 to 3.7 in bfloat16 (medians of
/// interleaved runs).
macro_rules! line_kernel {
    ($(#[$meta:meta])* $vis:vis fn $name:ident(|$ins:ident, $out:ident| $body:block)) => {
        $(#[$meta])*
        $vis fn $name<C: FastExp>(ins: &[&[C]], out: &mut [C]) {
            /// `FMA`: compiled with fused multiply-adds available (see [`exp_into`]).
            #[inline(always)]
            fn body<C: FastExp, const FMA: bool>($ins: &[&[C]], $out: &mut [C]) $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
            unsafe fn avx512(ins: &[&[f32]], out: &mut [f32]) {
                body::<f32, true>(ins, out)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2_fma(ins: &[&[f32]], out: &mut [f32]) {
                body::<f32, true>(ins, out)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            unsafe fn avx2(ins: &[&[f32]], out: &mut [f32]) {
                body::<f32, false>(ins, out)
            }

            #[cfg(target_arch = "x86_64")]
            if let (Some(a), Some(b)) = (ins.first(), ins.get(1).or(ins.first())) {
                if let (Some(a), Some(b), Some(o)) =
                    (as_same::<C, f32>(a), as_same::<C, f32>(b), as_same_mut::<C, f32>(out))
                {
                    let lines = [a, b];
                    let lines = &lines[..ins.len()];
                    match vmath::level() {
                        // SAFETY: the CPU has AVX-512F/DQ/VL and FMA (checked by `level`).
                        Some(Level::Avx512) => return unsafe { avx512(lines, o) },
                        // SAFETY: the CPU has AVX2 and FMA (checked by `level`).
                        Some(Level::Avx2) => return unsafe { avx2_fma(lines, o) },
                        None => {}
                    }
                    if std::arch::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU supports AVX2 (checked just above).
                        unsafe { avx2(lines, o) };
                        return;
                    }
                }
            }
            body::<C, false>(ins, out)
        }
    };
}

/// `out[i] = exp(x[i] - shift)`, returning the sum: fused multiply-adds when `FMA` (the
/// caller is compiled with them).
#[inline(always)]
fn exp_into<C: FastExp, const FMA: bool>(x: &[C], shift: C, out: &mut [C]) -> C {
    if FMA {
        C::exp_shift_into_fma(x, shift, out)
    } else {
        C::exp_shift_into(x, shift, out)
    }
}

line_kernel! {
    /// `out = exp(x - max) / sum(exp(x - max))` for one line.
    pub(crate) fn softmax_line(|ins, out| {
        let x = ins[0];
        let m = max_nan(x);
        let inv = C::ONE / exp_into::<C, FMA>(x, m, out);
        for o in out.iter_mut() {
            *o = *o * inv;
        }
    })
}

line_kernel! {
    /// `out = (x - max) - log(sum(exp(x - max)))` for one line.
    pub(crate) fn log_softmax_line(|ins, out| {
        let x = ins[0];
        let m = max_nan(x);
        let lse = C::exp_shift_sum(x, m).ln();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v - m) - lse;
        }
    })
}

line_kernel! {
    /// `out = y * (g - sum(g * y))` for one line (`ins = [g, y]`).
    pub(crate) fn softmax_backward_line(|ins, out| {
        let (g, y) = (ins[0], ins[1]);
        // `out` holds the products until the final pass overwrites it.
        for ((o, &a), &b) in out.iter_mut().zip(g).zip(y) {
            *o = a * b;
        }
        let dot = lane_sum(out);
        for ((o, &a), &b) in out.iter_mut().zip(g).zip(y) {
            *o = b * (a - dot);
        }
    })
}

line_kernel! {
    /// `out = g - exp(y) * sum(g)` for one line (`ins = [g, y]`, `y <= 0`).
    pub(crate) fn log_softmax_backward_line(|ins, out| {
        let (g, y) = (ins[0], ins[1]);
        let s = lane_sum(g);
        C::exp_shift_into(y, C::ZERO, out);
        for (o, &a) in out.iter_mut().zip(g) {
            *o = a - *o * s;
        }
    })
}

/// Run a one-input line op over floating `x` (cast to `dtype` first when given).
fn unary_lines(
    op: &'static str,
    x: &Tensor,
    dim: i64,
    dtype: Option<DType>,
    log: bool,
) -> Result<Tensor> {
    let x = cast_opt(x, dtype)?;
    if !x.dtype().is_floating_point() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype(),
        });
    }
    let geom = line_geometry(&x, dim)?;
    crate::compute::on_device!(op, [&x], {
        let d = amp_tensor::wrap_dim(dim, x.rank().max(1))?;
        crate::cuda::route::softmax(&x, d, None, log)
    });
    let xc = x.try_contiguous()?;
    float_kernel!(x.dtype(), op, |T, C| {
        let out = with_slice::<T, _>(&xc, |s| {
            if log {
                lines::<T, C>(RowOp::LogSoftmax, &[s], geom, log_softmax_line::<C>)
            } else {
                lines::<T, C>(RowOp::Softmax, &[s], geom, softmax_line::<C>)
            }
        })??;
        Tensor::from_vec(out, x.dims())
    })
}

/// The lines of `ins` (`geom`: outer, length, inner) through the row kernel `k` where
/// it applies (contiguous rows; AVX-512 ([`rows512`]), else AVX2 with FMA and F16C
/// (`rows_avx2`)), else through the portable `line` kernel: all give the same bits. The row kernels are as fast or faster at
/// every row length (since their maximum runs four accumulators: softmax/f32/2048 and
/// the 16-bit ones at 384–2048 used to be slower).
fn lines<T: Element, C: Real>(
    k: RowOp,
    ins: &[&[T]],
    geom: (usize, usize, usize),
    line: impl Fn(&[&[C]], &mut [C]) + Sync + Send,
) -> Result<Vec<T>> {
    #[cfg(target_arch = "x86_64")]
    if geom.2 == 1 {
        if let Some(out) = rows512::line_rows::<T>(k, ins, geom.0, geom.1)
            .or_else(|| rows_avx2::line_rows::<T>(k, ins, geom.0, geom.1))
        {
            return out;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = k;
    map_lines::<T, C>(ins, geom, line)
}

/// Run a (grad, output) line op; both are promoted to their common floating dtype.
fn backward_lines(
    op: &'static str,
    grad: &Tensor,
    out: &Tensor,
    dim: i64,
    log: bool,
) -> Result<Tensor> {
    if grad.dims() != out.dims() {
        return Err(Error::shape_mismatch(op, grad.dims(), out.dims()));
    }
    let dtype = promote_types(grad.dtype(), out.dtype());
    if !dtype.is_floating_point() {
        return Err(Error::UnsupportedDType { op, dtype });
    }
    let geom = line_geometry(out, dim)?;
    crate::compute::on_device!(op, [grad, out], {
        let d = amp_tensor::wrap_dim(dim, out.rank().max(1))?;
        crate::cuda::route::softmax_backward(&grad.to_dtype(dtype)?, out, d, log)
    });
    let g = grad.to_dtype(dtype)?.try_contiguous()?;
    let y = out.to_dtype(dtype)?.try_contiguous()?;
    float_kernel!(dtype, op, |T, C| {
        let res = with_slice::<T, _>(&g, |gs| {
            with_slice::<T, _>(&y, |ys| {
                let ins = [gs, ys];
                if log {
                    let line = log_softmax_backward_line::<C>;
                    lines::<T, C>(RowOp::LogSoftmaxBackward, &ins, geom, line)
                } else {
                    lines::<T, C>(
                        RowOp::SoftmaxBackward,
                        &ins,
                        geom,
                        softmax_backward_line::<C>,
                    )
                }
            })
        })???;
        Tensor::from_vec(res, out.dims())
    })
}

/// `exp(x - max) / sum(exp(x - max))` along `dim` (negative wraps). With `dtype` the
/// input is cast to it first; f16/bf16 compute in f32 and round once. A line that is
/// all -inf, or holds +inf or NaN, gives NaN as in PyTorch.
pub fn softmax(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    unary_lines("softmax", x, dim, dtype, false)
}

/// `x - max - log(sum(exp(x - max)))` along `dim`, computed stably (dtype rules as
/// [`softmax`]).
pub fn log_softmax(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    unary_lines("log_softmax", x, dim, dtype, true)
}

/// The gradient of [`softmax`] given its output: `out * (g - sum(g * out, dim))`.
/// `grad_out` and `out` must have the same shape; the result has their promoted dtype.
pub fn softmax_backward(grad_out: &Tensor, out: &Tensor, dim: i64) -> Result<Tensor> {
    backward_lines("softmax_backward", grad_out, out, dim, false)
}

/// The gradient of [`log_softmax`] given its output: `g - exp(out) * sum(g, dim)`.
pub fn log_softmax_backward(grad_out: &Tensor, out: &Tensor, dim: i64) -> Result<Tensor> {
    backward_lines("log_softmax_backward", grad_out, out, dim, true)
}

/// Attention's probabilities: `softmax(scale · x)` over the last dim, with `causal` each
/// trailing `[L, S]` matrix masked above its diagonal (row `i` keeps columns `0..=i`;
/// the others get probability 0). On a device one launch; on the host one pass per
/// row on the AVX-512 or AVX2 row kernels where they apply (the masked part of a row
/// never computed; float32 gives the bits of the math path's kernels, 16-bit rounds
/// once where they round `scale · x` first), else the scalar product, the mask (`where`
/// with -inf) and [`softmax`] in turn.
pub fn scaled_softmax(x: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    const OP: &str = "scaled_softmax";
    if x.rank() < 1 + usize::from(causal) {
        return Err(Error::invalid(
            OP,
            format!(
                "expects a tensor of at least {} dims, got {}",
                1 + usize::from(causal),
                x.rank()
            ),
        ));
    }
    if !x.dtype().is_floating_point() {
        return Err(Error::UnsupportedDType {
            op: OP,
            dtype: x.dtype(),
        });
    }
    crate::compute::on_device!(
        OP,
        [x],
        crate::cuda::route::scaled_softmax(x, scale, causal)
    );
    let causal_rows = if causal { x.dims()[x.rank() - 2] } else { 0 };
    let rows_op = |scale: u32| RowOp::ScaledSoftmax {
        scale,
        causal: causal_rows,
    };
    if let Some(y) = scaled_rows(OP, rows_op, &[x], scale)? {
        return Ok(y);
    }
    let mut w = crate::binary_scalar(crate::BinaryOp::Mul, x, scale)?;
    if causal {
        let (l, s) = (x.dims()[x.rank() - 2], x.dims()[x.rank() - 1]);
        let keep: Vec<bool> = (0..l).flat_map(|i| (0..s).map(move |j| j <= i)).collect();
        let keep = Tensor::from_vec(keep, [l, s])?;
        let neg_inf = Tensor::scalar(f32::NEG_INFINITY).to_dtype(w.dtype())?;
        w = crate::where_cond(&keep, &w, &neg_inf)?;
    }
    softmax(&w, -1, None)
}

/// The gradient of [`scaled_softmax`] given its output: `scale · out (g - Σ g out)`
/// over the last dim (a masked entry's is 0: its output is).
pub fn scaled_softmax_backward(grad_out: &Tensor, out: &Tensor, scale: f64) -> Result<Tensor> {
    const OP: &str = "scaled_softmax_backward";
    if grad_out.dims() != out.dims() {
        return Err(Error::shape_mismatch(OP, grad_out.dims(), out.dims()));
    }
    crate::compute::on_device!(
        OP,
        [grad_out, out],
        crate::cuda::route::scaled_softmax_backward(grad_out, out, scale)
    );
    if grad_out.dtype() == out.dtype() {
        let rows_op = |scale: u32| RowOp::ScaledSoftmaxBackward { scale };
        if let Some(d) = scaled_rows(OP, rows_op, &[grad_out, out], scale)? {
            return Ok(d);
        }
    }
    let d = softmax_backward(grad_out, out, -1)?;
    crate::binary_scalar(crate::BinaryOp::Mul, &d, scale)
}

/// A scaled softmax row op (`op` of the scale's float32 bits) over the last dim of
/// `ins` (one dtype and shape) on the AVX-512 or AVX2 row kernels, one pass per row (a causal
/// row's masked part never computed), where they apply: float32, bfloat16 or float16
/// rows, `scale` positive and finite as float32, a CPU that
/// has them. `None` elsewhere (the caller runs the ops in turn); the rows give what the
/// ops give up to their intermediate roundings: float32 bit for bit, 16-bit rounded once.
fn scaled_rows(
    name: &'static str,
    op: impl Fn(u32) -> RowOp,
    ins: &[&Tensor],
    scale: f64,
) -> Result<Option<Tensor>> {
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (name, op, ins, scale);
        Ok(None)
    }
    #[cfg(target_arch = "x86_64")]
    {
        let x = ins[0];
        let n = x.dims().last().copied().unwrap_or(1);
        let s = scale as f32;
        let kind = matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16);
        if !(kind && s > 0.0 && s.is_finite()) || n == 0 {
            return Ok(None);
        }
        let rows = x.elem_count() / n;
        let cs = ins
            .iter()
            .map(|t| t.try_contiguous())
            .collect::<Result<Vec<_>>>()?;
        float_kernel!(x.dtype(), name, |T, C| {
            let run = |a: &[T], b: Option<&[T]>| -> Option<Result<Vec<T>>> {
                let parts: Vec<&[T]> = std::iter::once(a).chain(b).collect();
                let op = op(s.to_bits());
                rows512::line_rows::<T>(op, &parts, rows, n)
                    .or_else(|| rows_avx2::line_rows::<T>(op, &parts, rows, n))
            };
            let out = match &cs[..] {
                [a] => with_slice::<T, _>(a, |a| run(a, None))?,
                [a, b, ..] => {
                    with_slice::<T, _>(a, |a| with_slice::<T, _>(b, |b| run(a, Some(b))))??
                }
                [] => None,
            };
            let _: Option<C> = None;
            match out {
                Some(v) => Ok(Some(Tensor::from_vec(v?, x.dims())?)),
                None => Ok(None),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let got = exp_le0(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_le0(0.0), 1.0);
        assert!(((exp_le0(88.0) as f64) / 88f64.exp() - 1.0).abs() < 2.5e-7);
        assert_eq!(exp_le0(100.0), f32::INFINITY);
        assert_eq!(exp_le0(f32::NEG_INFINITY), 0.0);
        assert!(exp_le0(f32::NAN).is_nan());
    }
}
