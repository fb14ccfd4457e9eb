//! Softmax and log-softmax along one dim, and their fused backward helpers.
//!
//! Each line along `dim` is processed in the compute type (f32 for f16/bf16/f32, f64
//! for f64) and rounded once: the maximum is subtracted before exponentiating, so
//! large inputs do not overflow. f32 uses a vectorised exponential (Cephes' polynomial,
//! about 1 ulp; AVX2 when the CPU has it). Rows run in parallel when large; lines along
//! other dims are transposed in small tiles (see `map_lines`).

use amp_tensor::{promote_types, DType, Error, Result, Tensor};

use crate::compute::{with_slice, Real};
use crate::reduce::{cast_opt, lane_sum, line_geometry, map_lines, max_nan, Num};

/// Float compute types with a fast shifted exponential over slices.
pub(crate) trait FastExp: Real + Num {
    /// `y[i] = exp(x[i] - shift)` for `x[i] <= shift` (NaN propagates), returning the
    /// sum of `y`.
    fn exp_shift_into(x: &[Self], shift: Self, y: &mut [Self]) -> Self;

    /// `sum(exp(x[i] - shift))` for `x[i] <= shift`, without storing the terms.
    fn exp_shift_sum(x: &[Self], shift: Self) -> Self {
        let mut buf = [Self::ZERO; 256];
        x.chunks(256).fold(Self::ZERO, |s, c| {
            s + Self::exp_shift_into(c, shift, &mut buf[..c.len()])
        })
    }
}

impl FastExp for f64 {
    fn exp_shift_into(x: &[f64], shift: f64, y: &mut [f64]) -> f64 {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = (v - shift).exp();
        }
        lane_sum(y)
    }
}

/// `exp(x)` for `x <= 0` or NaN, vectorisable: Cephes' `expf` polynomial with the
/// power of two built from the exponent bits. Below `ln(2^-126)` the result is 0 (so
/// `exp(-inf)` is exactly 0, as masked softmax needs).
#[inline(always)]
fn exp_le0(x: f32) -> f32 {
    const LO: f32 = -87.336_55;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = if x < LO { LO } else { x };
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 5.000_000_1e-1;
    let y = p * (r * r) + r + 1.0;
    // The low mantissa bits of `t` hold n; (n + 127) << 23 is 2^n.
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < LO {
        0.0
    } else {
        y * pow2
    }
}

#[inline(always)]
fn exp_into_f32(x: &[f32], shift: f32, y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = exp_le0(v - shift);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_into_f32_avx2(x: &[f32], shift: f32, y: &mut [f32]) {
    exp_into_f32(x, shift, y)
}

impl FastExp for f32 {
    fn exp_shift_into(x: &[f32], shift: f32, y: &mut [f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { exp_into_f32_avx2(x, shift, y) };
            return lane_sum(y);
        }
        exp_into_f32(x, shift, y);
        lane_sum(y)
    }
}

fn softmax_line<C: FastExp>(ins: &[&[C]], out: &mut [C]) {
    let x = ins[0];
    let m = max_nan(x);
    let inv = C::ONE / C::exp_shift_into(x, m, out);
    for o in out.iter_mut() {
        *o = *o * inv;
    }
}

fn log_softmax_line<C: FastExp>(ins: &[&[C]], out: &mut [C]) {
    let x = ins[0];
    let m = max_nan(x);
    let lse = C::exp_shift_sum(x, m).ln();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - m) - lse;
    }
}

fn softmax_backward_line<C: FastExp>(ins: &[&[C]], out: &mut [C]) {
    let (g, y) = (ins[0], ins[1]);
    // `out` is scratch for the products until the final pass overwrites it.
    let mut dot = C::ZERO;
    for (gc, yc) in g.chunks(1024).zip(y.chunks(1024)) {
        let o = &mut out[..gc.len()];
        for ((o, &a), &b) in o.iter_mut().zip(gc).zip(yc) {
            *o = a * b;
        }
        dot = dot + lane_sum(o);
    }
    for ((o, &a), &b) in out.iter_mut().zip(g).zip(y) {
        *o = b * (a - dot);
    }
}

fn log_softmax_backward_line<C: FastExp>(ins: &[&[C]], out: &mut [C]) {
    let (g, y) = (ins[0], ins[1]);
    let s = lane_sum(g);
    for ((o, &a), &b) in out.iter_mut().zip(g).zip(y) {
        *o = a - b.exp() * s;
    }
}

/// Run a one-input line op over floating `x` (cast to `dtype` first when given).
fn unary_lines(op: &'static str, x: &Tensor, dim: i64, dtype: Option<DType>, log: bool) -> Result<Tensor> {
    let x = cast_opt(x, dtype)?;
    if !x.dtype().is_floating_point() {
        return Err(Error::UnsupportedDType { op, dtype: x.dtype() });
    }
    let geom = line_geometry(&x, dim)?;
    let xc = x.contiguous();
    float_kernel!(x.dtype(), op, |T, C| {
        let out = with_slice::<T, _>(&xc, |s| {
            if log {
                map_lines::<T, C>(&[s], geom, log_softmax_line::<C>)
            } else {
                map_lines::<T, C>(&[s], geom, softmax_line::<C>)
            }
        });
        Tensor::from_vec(out, x.dims().to_vec())
    })
}

/// Run a (grad, output) line op; both are promoted to their common floating dtype.
fn backward_lines(op: &'static str, grad: &Tensor, out: &Tensor, dim: i64, log: bool) -> Result<Tensor> {
    if grad.dims() != out.dims() {
        return Err(Error::shape_mismatch(op, grad.dims(), out.dims()));
    }
    let dtype = promote_types(grad.dtype(), out.dtype());
    if !dtype.is_floating_point() {
        return Err(Error::UnsupportedDType { op, dtype });
    }
    let geom = line_geometry(out, dim)?;
    let g = grad.to_dtype(dtype)?.contiguous();
    let y = out.to_dtype(dtype)?.contiguous();
    float_kernel!(dtype, op, |T, C| {
        let res = with_slice::<T, _>(&g, |gs| {
            with_slice::<T, _>(&y, |ys| {
                if log {
                    map_lines::<T, C>(&[gs, ys], geom, log_softmax_backward_line::<C>)
                } else {
                    map_lines::<T, C>(&[gs, ys], geom, softmax_backward_line::<C>)
                }
            })
        });
        Tensor::from_vec(res, out.dims().to_vec())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = exp_le0(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_le0(0.0), 1.0);
        assert_eq!(exp_le0(f32::NEG_INFINITY), 0.0);
        assert!(exp_le0(f32::NAN).is_nan());
    }
}
