//! Softmax, log-softmax and their gradients over contiguous rows on AVX2 with explicit
//! 8-lane vectors, straight from and to float32, bfloat16 or float16 storage: the
//! AVX2 counterpart of [`crate::rows512`]'s row kernels, for CPUs without AVX-512.
//!
//! The generic row path ([`crate::reduce::map_lines`]) widens each 16-bit row into a
//! float32 buffer, runs the float32 line kernel and narrows the result back, two extra
//! passes over every row: on a Zen 3 EPYC (AVX2 only) that left the bfloat16 and
//! float16 softmax at 0.55–0.95× the speed of the float32 one at every size of the
//! sweep, although they move half the bytes. Here every pass loads 8 elements and
//! widens them in a register, and the output is rounded in registers and stored.
//! [`RowOp::ScaledSoftmax`] (attention's fused scale and causal mask) and its
//! gradient run here too, so a 16-bit scaled softmax rounds once on AVX2 as on
//! AVX-512, where the op-by-op path rounded `scale · x` to 16 bits first: its bits no
//! longer depend on the CPU.
//!
//! The bits are the portable line kernels' (`softmax.rs`, compiled for AVX2 with FMA:
//! [`crate::vmath::exp_fma_le0`] for softmax, [`crate::vmath::exp`] for log-softmax and
//! its gradient) and so [`crate::rows512`]'s: the same float32 operations in the same
//! order. Sums keep [`lane_sum`]'s 16 lanes (element `i` in lane `i mod 16`, the lanes
//! then folded pairwise; log-softmax's in pieces of 256 added in order, as
//! `FastExp::exp_shift_sum`); the maximum is any-order (`vmaxps`), which can differ
//! from the portable fold only in the sign of a zero maximum, which no output shows
//! (see `rows512::max_nan`); the first NaN of a row is found again in order. The
//! rounding is the buffer cast's ([`Io`]).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use amp_tensor::half::{bf16, f16};
use amp_tensor::{Element, Result};

use crate::half16::Io;
use crate::reduce::{for_row_blocks, lane_sum};
use crate::rows512::{RowKernels, RowOp};
use crate::vmath::{self, EXP_HI, EXP_LO};

/// Whether the CPU has what the kernels are compiled with (AVX2, FMA, F16C).
pub(crate) fn available() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx2") && has!("fma") && has!("f16c")
}

/// `(y, t)` of [`vmath::exp`] (`FMA = false`, no fused operations) or of
/// `vmath::exp_fma` (`FMA = true`) on 8 lanes, without their range handling:
/// `exp(x) = y · 2^n` for `x` in `[EXP_LO, EXP_HI]`, `t = n + 1.5·2^23`
/// ([`vmath::exp_parts_lanes`], the polynomial `rows512` evaluates too).
///
/// # Safety
/// The caller runs with AVX2 and FMA.
#[inline(always)]
unsafe fn exp_parts<const FMA: bool>(x: __m256) -> (__m256, __m256) {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        vmath::exp_parts_lanes!(
            x,
            FMA,
            _mm256_set1_ps,
            _mm256_add_ps,
            _mm256_sub_ps,
            _mm256_mul_ps,
            _mm256_fmadd_ps
        )
    }
}

/// `y · 2^n` from [`exp_parts`], `2^n` built from the bits of `t`.
///
/// # Safety
/// The caller runs with AVX2 and FMA.
#[inline(always)]
unsafe fn exp_core<const FMA: bool>(x: __m256) -> __m256 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let (y, t) = exp_parts::<FMA>(x);
        let b = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B40_0000 - 127));
        _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(b)))
    }
}

/// [`vmath::exp`] on 8 lanes, bit for bit: clamped to `[EXP_LO, EXP_HI]` (NaN kept),
/// then 0 below the range and `+inf` above it.
///
/// # Safety
/// The caller runs with AVX2 and FMA.
#[inline(always)]
unsafe fn exp(x: __m256) -> __m256 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let (lo, hi) = (_mm256_set1_ps(EXP_LO), _mm256_set1_ps(EXP_HI));
        // `x < lo` and `x > hi` are false for NaN, which is kept.
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
        let above = _mm256_cmp_ps::<_CMP_GT_OQ>(x, hi);
        let xc = _mm256_blendv_ps(_mm256_blendv_ps(x, lo, below), hi, above);
        let y = _mm256_andnot_ps(below, exp_core::<false>(xc));
        _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), above)
    }
}

/// [`exp`] (`FMA = false`) or [`vmath::exp_fma_le0`] (`FMA = true`) for lanes that
/// are `<= 0` or NaN, bit for bit: such a lane never reaches the upper clamp or the
/// `+inf` check, and the lower clamp leaves every lane it keeps as it is (a lane below
/// `EXP_LO` is 0 whatever was computed on it).
///
/// # Safety
/// The caller runs with AVX2 and FMA.
#[inline(always)]
unsafe fn exp_le0<const FMA: bool>(x: __m256) -> __m256 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
        _mm256_andnot_ps(below, exp_core::<FMA>(x))
    }
}

/// The scalar form of [`exp_le0`] (a row's last `n % 8` elements).
#[inline(always)]
fn exp_le0_1<const FMA: bool>(x: f32) -> f32 {
    if FMA {
        vmath::exp_fma_le0(x)
    } else {
        vmath::exp(x)
    }
}

/// `sum(f(i))` over `i < len` in [`lane_sum`]'s 16 lanes: `v8(i)` gives elements
/// `i..i + 8` (lanes `i mod 16` on), `s1(i)` element `i` alone (the last `len % 8`).
///
/// # Safety
/// The caller runs with AVX2 (and what the closures need); `v8` and `s1` are only
/// called on elements below `len`.
#[inline(always)]
unsafe fn sum16(
    len: usize,
    mut v8: impl FnMut(usize) -> __m256,
    mut s1: impl FnMut(usize) -> f32,
) -> f32 {
    // SAFETY: register arithmetic and stores into `flat` (16 lanes); the features are
    // the caller's.
    unsafe {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= len {
            lo = _mm256_add_ps(lo, v8(i));
            hi = _mm256_add_ps(hi, v8(i + 8));
            i += 16;
        }
        // The last `len % 16` elements go to lanes 0.. in order.
        let mut tail_lane = 0;
        if i + 8 <= len {
            lo = _mm256_add_ps(lo, v8(i));
            i += 8;
            tail_lane = 8;
        }
        let mut flat = [0f32; 16];
        _mm256_storeu_ps(flat.as_mut_ptr(), lo);
        _mm256_storeu_ps(flat.as_mut_ptr().add(8), hi);
        for (k, j) in (i..len).enumerate() {
            flat[tail_lane + k] += s1(j);
        }
        lane_sum(&flat)
    }
}

/// The maximum of the `n` elements at `x`, or the first NaN among them: the value of
/// `reduce::max_nan` (but for the sign of a zero maximum, see the module docs), four
/// running maxima of 8 lanes at a time.
///
/// # Safety
/// `x` is valid for `n` reads; the caller runs with AVX2 and F16C.
#[inline(always)]
unsafe fn max_nan<S: Io>(x: *const S, n: usize) -> f32 {
    // SAFETY: the loads stay within `n` elements; the features are the caller's.
    unsafe {
        let lowest = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut acc = [lowest; 4];
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let v = S::load8(x.add(i + 8 * k));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                *a = _mm256_max_ps(*a, v);
            }
            i += 32;
        }
        while i + 8 <= n {
            let v = S::load8(x.add(i));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            acc[0] = _mm256_max_ps(acc[0], v);
            i += 8;
        }
        let mut any_nan = _mm256_movemask_ps(nan) != 0;
        let m = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let mut best = f32::NEG_INFINITY;
        for v in lanes.into_iter().chain((i..n).map(|j| (*x.add(j)).widen())) {
            any_nan |= v.is_nan();
            if v > best {
                best = v;
            }
        }
        if any_nan {
            return first_nan(x, n);
        }
        best
    }
}

/// The first NaN of the `n` elements at `x` (there is one).
///
/// # Safety
/// `x` is valid for `n` reads.
#[cold]
#[inline(never)]
unsafe fn first_nan<S: Io>(x: *const S, n: usize) -> f32 {
    // SAFETY: the caller's contract.
    let row = unsafe { std::slice::from_raw_parts(x, n) };
    row.iter()
        .map(|v| v.widen())
        .find(|v| v.is_nan())
        .unwrap_or(f32::NAN)
}

/// `out[i] = f(i)` over `n` elements rounded to `D`, 8 at a time (`f8(i)` gives
/// elements `i..i + 8`, `f1(i)` element `i` alone, for the last `n % 8`).
///
/// # Safety
/// `out` is valid for `n` writes; the caller runs with AVX2 and F16C (and what the
/// closures need).
#[inline(always)]
unsafe fn write_row<D: Io>(
    out: *mut D,
    n: usize,
    f8: impl Fn(usize) -> __m256,
    f1: impl Fn(usize) -> f32,
) {
    // SAFETY: the stores stay within `n` elements; the features are the caller's.
    unsafe {
        let mut i = 0;
        while i + 16 <= n {
            D::store16(out.add(i), f8(i), f8(i + 8));
            i += 16;
        }
        if i + 8 <= n {
            D::store8(out.add(i), f8(i));
            i += 8;
        }
        for j in i..n {
            *out.add(j) = D::narrow(f1(j));
        }
    }
}

/// Rows of float32 scratch a 16-bit softmax keeps on the stack (longer rows allocate
/// once per block of rows).
const STACK_ROW: usize = 1024;

/// The softmax of `scale · x` over each row of `n` elements into `out`: `exp` with fused
/// multiply-adds (the float32 line kernel's on AVX2), `exp(scale · x - m)` going to a
/// float32 row (the output itself for float32) and summed in 16 lanes, then multiplied
/// by `1 / sum` while being rounded to the output. `m` is `scale` times the row's
/// maximum (the maximum of the products: rounding is monotonic and `scale > 0`). With
/// `causal > 0` row `r` (counted from `r0`, the block's first row in the whole input)
/// keeps its first `r % causal + 1` elements and the others get probability 0, never
/// computed: the bits of the op-by-op path (product, `where` with -inf, softmax) in
/// float32, rounded once in 16 bits. `scale = 1` skips the product (exact anyway).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x.len() == out.len()`, a multiple of `n > 0`;
/// `scale > 0`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_rows<S: Io>(
    x: &[S],
    out: &mut [MaybeUninit<S>],
    n: usize,
    scale: f32,
    causal: usize,
    r0: usize,
) {
    let mut stack = [0f32; STACK_ROW];
    let mut heap = Vec::new();
    let scratch: *mut f32 = if S::F32 {
        std::ptr::null_mut()
    } else if n <= STACK_ROW {
        stack.as_mut_ptr()
    } else {
        heap.resize(n, 0f32);
        heap.as_mut_ptr()
    };
    let (xs, os) = (x.as_ptr(), out.as_mut_ptr().cast::<S>());
    for r in 0..x.len() / n {
        // SAFETY: row `r` is within `x` and `out`; `buf` is the output row or
        // scratch of at least `n` elements, written before it is read back; the
        // features are this function's.
        unsafe {
            let (xp, op) = (xs.add(r * n), os.add(r * n));
            let len = if causal > 0 {
                ((r0 + r) % causal + 1).min(n)
            } else {
                n
            };
            let buf: *mut f32 = if S::F32 { op.cast() } else { scratch };
            let m = max_nan(xp, len) * scale;
            let sum = if scale == 1.0 {
                exp_row::<S, false>(xp, buf, len, scale, m)
            } else {
                exp_row::<S, true>(xp, buf, len, scale, m)
            };
            let inv = 1.0 / sum;
            let iv = _mm256_set1_ps(inv);
            write_row(
                op,
                len,
                |i| _mm256_mul_ps(_mm256_loadu_ps(buf.add(i)), iv),
                |i| *buf.add(i) * inv,
            );
            // Masked entries: probability 0 (all-zero bits in every storage type).
            std::ptr::write_bytes(op.add(len), 0, n - len);
        }
    }
}

/// `buf[i] = exp(scale · x[i] - m)` over a row of `len` elements, returning their sum
/// in 16 lanes (`m` is `scale` times the row's maximum, so every exponent is `<= 0` or
/// NaN). `SCALED = false` skips the product, for `scale == 1` (exact: `x · 1 = x`);
/// a constant, so the loop holds no test of it. Compiled with the kernels' features
/// itself, not only inlined into them: its closures would otherwise be compiled for the
/// baseline and called per vector (30 times slower).
///
/// # Safety
/// `x` and `buf` are valid for `len` elements; the CPU has AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_row<S: Io, const SCALED: bool>(
    x: *const S,
    buf: *mut f32,
    len: usize,
    scale: f32,
    m: f32,
) -> f32 {
    // SAFETY: the loads and stores stay within `len` elements; the features are the
    // caller's.
    unsafe {
        let (mv, sc) = (_mm256_set1_ps(m), _mm256_set1_ps(scale));
        sum16(
            len,
            |i| {
                let v = S::load8(x.add(i));
                let v = if SCALED { _mm256_mul_ps(v, sc) } else { v };
                let e = exp_le0::<true>(_mm256_sub_ps(v, mv));
                _mm256_storeu_ps(buf.add(i), e);
                e
            },
            |i| {
                let v = (*x.add(i)).widen();
                let v = if SCALED { v * scale } else { v };
                let e = exp_le0_1::<true>(v - m);
                *buf.add(i) = e;
                e
            },
        )
    }
}

/// Log-softmax of each row: `(x - max) - ln(sum)`, the sum of `exp(x - max)` (without
/// fused multiply-adds) taken as `FastExp::exp_shift_sum` does, in pieces of 256
/// elements each summed in 16 lanes, the pieces added in order.
///
/// # Safety
/// As [`softmax_rows`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn log_softmax_rows<S: Io>(x: &[S], out: &mut [MaybeUninit<S>], n: usize) {
    let (xs, os) = (x.as_ptr(), out.as_mut_ptr().cast::<S>());
    for r in 0..x.len() / n {
        // SAFETY: row `r` is within `x` and `out`; the features are this function's.
        unsafe {
            let (xp, op) = (xs.add(r * n), os.add(r * n));
            let m = max_nan(xp, n);
            let mv = _mm256_set1_ps(m);
            let mut s = 0f32;
            let mut j = 0;
            while j < n {
                let len = (n - j).min(256);
                let piece = xp.add(j);
                s += sum16(
                    len,
                    |i| exp_le0::<false>(_mm256_sub_ps(S::load8(piece.add(i)), mv)),
                    |i| exp_le0_1::<false>((*piece.add(i)).widen() - m),
                );
                j += len;
            }
            let lse = s.ln();
            let lv = _mm256_set1_ps(lse);
            write_row(
                op,
                n,
                |i| _mm256_sub_ps(_mm256_sub_ps(S::load8(xp.add(i)), mv), lv),
                |i| ((*xp.add(i)).widen() - m) - lse,
            );
        }
    }
}

/// The gradient of each row of softmax (`LOG = false`: `y * (g - sum(g * y))`) or of
/// log-softmax (`LOG = true`: `g - exp(y) * sum(g)`, `exp` without fused
/// multiply-adds, of `y - 0` as the portable kernel computes it), the sums in 16
/// lanes, times `scale` (the scaled softmax's gradient; exact when it is 1) before the
/// one rounding.
///
/// # Safety
/// As [`softmax_rows`], and `g.len() == y.len() == out.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn backward_rows<S: Io, const LOG: bool>(
    g: &[S],
    y: &[S],
    out: &mut [MaybeUninit<S>],
    n: usize,
    scale: f32,
) {
    let (gs, ys, os) = (g.as_ptr(), y.as_ptr(), out.as_mut_ptr().cast::<S>());
    for r in 0..g.len() / n {
        // SAFETY: row `r` is within `g`, `y` and `out`; the features are this
        // function's.
        unsafe {
            let (gp, yp, op) = (gs.add(r * n), ys.add(r * n), os.add(r * n));
            let ld = |p: *const S, i: usize| S::load8(p.add(i));
            let at = |p: *const S, i: usize| (*p.add(i)).widen();
            let s = if LOG {
                sum16(n, |i| ld(gp, i), |i| at(gp, i))
            } else {
                sum16(
                    n,
                    |i| _mm256_mul_ps(ld(gp, i), ld(yp, i)),
                    |i| at(gp, i) * at(yp, i),
                )
            };
            let (sv, sc, zero) = (
                _mm256_set1_ps(s),
                _mm256_set1_ps(scale),
                _mm256_setzero_ps(),
            );
            write_row(
                op,
                n,
                |i| {
                    let (gv, yv) = (ld(gp, i), ld(yp, i));
                    let d = if LOG {
                        _mm256_sub_ps(gv, _mm256_mul_ps(exp(_mm256_sub_ps(yv, zero)), sv))
                    } else {
                        _mm256_mul_ps(yv, _mm256_sub_ps(gv, sv))
                    };
                    _mm256_mul_ps(d, sc)
                },
                |i| {
                    let (gv, yv) = (at(gp, i), at(yp, i));
                    let d = if LOG {
                        gv - vmath::exp(yv - 0.0) * s
                    } else {
                        yv * (gv - s)
                    };
                    d * scale
                },
            );
        }
    }
}

/// `op` over the `rows` contiguous rows of `n > 0` elements of `ins`, split into
/// blocks of rows as [`crate::reduce::map_lines`] splits them.
fn run_rows<S: Io + Send + Sync>(
    op: RowOp,
    ins: &[&[S]],
    out: &mut [MaybeUninit<S>],
    rows: usize,
    n: usize,
) {
    let body = |r0: usize, block: &mut [MaybeUninit<S>]| {
        let lo = r0 * n;
        let part = |k: usize| &ins[k][lo..lo + block.len()];
        // SAFETY: `line_rows` checked `available()`; the parts and the block have the
        // same length, a multiple of `n > 0`; scales are positive (`RowOp`'s
        // contract, checked by the callers).
        unsafe {
            match op {
                RowOp::Softmax => softmax_rows(part(0), block, n, 1.0, 0, r0),
                RowOp::LogSoftmax => log_softmax_rows(part(0), block, n),
                RowOp::SoftmaxBackward => {
                    backward_rows::<_, false>(part(0), part(1), block, n, 1.0)
                }
                RowOp::LogSoftmaxBackward => {
                    backward_rows::<_, true>(part(0), part(1), block, n, 1.0)
                }
                RowOp::ScaledSoftmax { scale, causal } => {
                    softmax_rows(part(0), block, n, f32::from_bits(scale), causal, r0)
                }
                RowOp::ScaledSoftmaxBackward { scale } => {
                    backward_rows::<_, false>(part(0), part(1), block, n, f32::from_bits(scale))
                }
            }
        }
    };
    for_row_blocks(out, rows, n, &body);
}

/// `op` over `rows` rows of `n` elements of float32, bfloat16 or float16 storage `T`
/// (the inputs `rows * n` long, contiguous), straight from and to the storage type, as
/// [`crate::rows512::line_rows`]; `None` (nothing done) for other types or when the
/// CPU lacks AVX2, FMA or F16C. float32 rows run here too: as fast as the portable
/// line kernels compiled for AVX2 or faster (softmax of `[n, n]`, Zen 3: 1.2–2× at
/// n = 8..96, within the host's noise above).
pub(crate) fn line_rows<T: Element>(
    op: RowOp,
    ins: &[&[T]],
    rows: usize,
    n: usize,
) -> Option<Result<Vec<T>>> {
    if n == 0 || rows == 0 || !available() {
        return None;
    }
    let kernels = RowKernels {
        f32: run_rows::<f32>,
        bf16: run_rows::<bf16>,
        f16: run_rows::<f16>,
    };
    kernels.run(op, ins, rows, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows512::same_as_portable::{check_line_kernels, check_zero_maximum};

    fn skipped() -> bool {
        if available() {
            return false;
        }
        amp_testing::report_skip(
            "softmax::rows_avx2",
            "AVX2 softmax rows",
            "this CPU lacks AVX2, FMA or F16C",
        );
        true
    }

    /// 8 lanes through the lane exponentials against the scalar ones.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lanes(xs: &[f32; 8], which: u8) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: 8-element arrays; the features are this function's.
        unsafe {
            let v = _mm256_loadu_ps(xs.as_ptr());
            let r = match which {
                0 => exp(v),
                1 => exp_le0::<false>(v),
                _ => exp_le0::<true>(v),
            };
            _mm256_storeu_ps(out.as_mut_ptr(), r);
        }
        out
    }

    #[test]
    fn lane_exps_match_the_scalar_ones_bit_for_bit() {
        if skipped() {
            return;
        }
        let mut xs: Vec<f32> = (0..200_000).map(|i| -100.0 + i as f32 * 0.001_01).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            EXP_LO,
            EXP_HI,
            f32::MIN_POSITIVE,
            -1e-40,
            -1e30,
        ]);
        xs.resize(xs.len().next_multiple_of(8), 0.5);
        for c in xs.chunks_exact(8) {
            let c: &[f32; 8] = c.try_into().expect("8");
            let neg = c.map(|x| if x > 0.0 { -x } else { x });
            for which in 0..3u8 {
                let c = if which == 0 { c } else { &neg };
                // SAFETY: `available()` checked the features.
                let got = unsafe { lanes(c, which) };
                for (&x, g) in c.iter().zip(got) {
                    let want = match which {
                        0 | 1 => vmath::exp(x),
                        _ => vmath::exp_fma_le0(x),
                    };
                    let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                    assert!(same, "exp({x}) kind {which}: {g} want {want}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_matches_the_portable_one() {
        if skipped() {
            return;
        }
        check_line_kernels::<f32>(|v| v, line_rows);
        check_line_kernels::<bf16>(amp_tensor::round_to_bf16, line_rows);
        check_line_kernels::<f16>(f16::from_f32, line_rows);
    }

    #[test]
    fn a_zero_maximum_gives_the_portable_bits() {
        if skipped() {
            return;
        }
        check_zero_maximum::<f32>(|v| v, line_rows);
        check_zero_maximum::<bf16>(amp_tensor::round_to_bf16, line_rows);
        check_zero_maximum::<f16>(f16::from_f32, line_rows);
    }
}
