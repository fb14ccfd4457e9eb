//! AVX-512 row kernels for softmax, log-softmax and layer norm that read float32,
//! bfloat16 or float16 storage directly: 16 elements are loaded and widened in a
//! register, the float32 math runs on it, and the result is rounded once and stored
//! (the bfloat16 rounding of [`amp_tensor::round_to_bf16`], float16 by `vcvtps2ph`).
//! Where the CPU has AVX512-BF16, bfloat16 rows are rounded by `vcvtneps2bf16`, one
//! instruction where the integer rounding takes seven; a row with a NaN or subnormal
//! result, which that instruction rounds otherwise, is written again with the integer
//! rounding (`map_row_bf16_ne`), so the bits never depend on the CPU.
//!
//! The generic row path ([`crate::reduce::map_lines`]) widens each 16-bit row into a
//! float32 buffer, runs the float32 line kernel and narrows the result back: two extra
//! passes and two allocations per call, which left the 16-bit softmax at 0.75–0.9× and
//! layer norm at 0.55–0.9× the speed of the float32 ones although they move half the
//! bytes. The kernels here also keep their accumulators in registers (the portable
//! layer-norm sums kept theirs on the stack) and handle the last `n % 16` elements of a
//! row with masked loads and stores instead of scalar loops. Rows of up to
//! [`PAIR_ROW`] elements (layer norm: under 256) are run two at a time, their vectors
//! alternating, so that one row's reductions (the sum's fold, the division, the
//! maximum), which leave a short row's vector units waiting, overlap the other's work;
//! each row is computed exactly as it is alone.
//!
//! Every result is bit for bit the one of the portable kernels compiled for AVX-512:
//! the same operations in the same order. The sums reproduce
//! [`crate::reduce::lane_sum`]'s 16 lanes (element `i` goes to lane `i % 16`, then the
//! lanes are added pairwise, 8 + 8, 4 + 4, 2 + 2, 1 + 1) and `norm.rs`'s 64-lane
//! `wide_sum`; the maximum is `lane_extreme`'s (strictly greater wins, the first NaN of
//! the row if there is one); the exponentials are [`vmath::exp`] and
//! [`vmath::exp_fma_le0`] written with intrinsics (checked against them in the
//! tests).
//!
//! [`available`] says whether the CPU runs them (AVX-512 F/BW/DQ/VL, FMA, F16C);
//! [`line_rows`] and [`layer_norm`] run them over a whole tensor.

use std::any::TypeId;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use amp_tensor::half::{bf16, f16};
use amp_tensor::{Element, Result};

use crate::reduce::{as_same, as_same_mut, for_row_blocks};

use crate::half16::lanes::narrow_bf16_16;
use crate::vmath;
use crate::vmath::{EXP_HI, EXP_LO};

/// Whether the CPU has the features the kernels are compiled with.
pub(crate) fn available() -> bool {
    crate::vmath::has_gelu_table()
}

/// A storage type the kernels load and store 16 lanes of float32 at a time.
///
/// Every method is `unsafe`: the caller runs with AVX-512 F/BW/DQ/VL and F16C, and the
/// pointer is valid for the lanes read or written (`k` lanes for the `_tail` forms,
/// `k < 16`; the other lanes are not touched in memory).
pub(crate) trait Lane: Copy + 'static {
    /// `true` for float32 itself (the output can hold float32 intermediates).
    const F32: bool;
    /// 16 elements, widened.
    unsafe fn load(p: *const Self) -> __m512;
    /// Whether [`Lane::load2`] is cheaper than two [`Lane::load`]s (the loops then take
    /// 32 elements a step; for float32 and float16 that measured slower).
    const LOAD2: bool = false;
    /// 32 elements, widened: elements 0..16 and 16..32, as two [`Lane::load`]s.
    #[inline(always)]
    unsafe fn load2(p: *const Self) -> (__m512, __m512) {
        // SAFETY: the trait's contract (32 elements).
        unsafe { (Self::load(p), Self::load(p.add(16))) }
    }
    /// `k` elements widened into the low lanes, `fill` in the others.
    unsafe fn load_tail(p: *const Self, k: usize, fill: __m512) -> __m512;
    /// 16 elements rounded and stored.
    unsafe fn store(p: *mut Self, v: __m512);
    /// The low `k` lanes rounded and stored.
    unsafe fn store_tail(p: *mut Self, k: usize, v: __m512);
}

/// The mask of the low `k` lanes (`k < 16`).
#[inline(always)]
fn low(k: usize) -> __mmask16 {
    ((1u32 << k) - 1) as __mmask16
}

impl Lane for f32 {
    const F32: bool = true;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_tail(p: *const f32, k: usize, fill: __m512) -> __m512 {
        // SAFETY: the trait's contract; masked-off lanes are not read.
        unsafe { _mm512_mask_loadu_ps(fill, low(k), p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the trait's contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_tail(p: *mut f32, k: usize, v: __m512) {
        // SAFETY: the trait's contract; masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, low(k), v) }
    }
}

/// float32 lanes from 16 bfloat16 bit patterns (exact).
///
/// # Safety
/// The caller runs with AVX-512 F/BW.
#[inline(always)]
unsafe fn widen_bf16(h: __m256i) -> __m512 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))) }
}

/// [`Lane`] for a 16-bit type: 16 values widened by `$widen` on load, rounded by
/// `$narrow` on store.
macro_rules! half_lane {
    ($T:ty, $widen:ident, $narrow:ident $(, $load2:ident)?) => {
        impl Lane for $T {
            const F32: bool = false;
            #[inline(always)]
            unsafe fn load(p: *const $T) -> __m512 {
                // SAFETY: the trait's contract.
                unsafe { $widen(_mm256_loadu_si256(p.cast())) }
            }
            $(
            const LOAD2: bool = true;
            #[inline(always)]
            unsafe fn load2(p: *const $T) -> (__m512, __m512) {
                // SAFETY: the trait's contract.
                unsafe { $load2(p) }
            }
            )?
            #[inline(always)]
            unsafe fn load_tail(p: *const $T, k: usize, fill: __m512) -> __m512 {
                // SAFETY: the trait's contract; masked-off lanes are not read.
                unsafe {
                    let v = $widen(_mm256_maskz_loadu_epi16(low(k), p.cast()));
                    _mm512_mask_blend_ps(low(k), fill, v)
                }
            }
            #[inline(always)]
            unsafe fn store(p: *mut $T, v: __m512) {
                // SAFETY: the trait's contract.
                unsafe { _mm256_storeu_si256(p.cast(), $narrow(v)) }
            }
            #[inline(always)]
            unsafe fn store_tail(p: *mut $T, k: usize, v: __m512) {
                // SAFETY: the trait's contract; masked-off lanes are not written.
                unsafe { _mm256_mask_storeu_epi16(p.cast(), low(k), $narrow(v)) }
            }
        }
    };
}

half_lane!(bf16, widen_bf16, narrow_bf16_16, load2_bf16);
half_lane!(f16, widen_f16, narrow_f16);

/// 32 bfloat16 values widened in order from one 64-byte load: the quadwords are put
/// in the order `0, 4, 1, 5, 2, 6, 3, 7`, so that 128-bit lane `q` holds elements
/// `4q..4q + 4` and `16 + 4q..16 + 4q + 4`, and interleaving zeros below the low and
/// the high words of each lane widens elements 0..16 and 16..32. Three instructions
/// for 32 values where [`widen_bf16`] takes four (Zen 5: 0.21 against 0.33 ns per 16
/// values in a summing loop; bfloat16 softmax of `[128, 128]` 7% faster,
/// `[256, 256]` 10%).
///
/// # Safety
/// `p` is valid for 32 reads; the caller runs with AVX-512 F/BW.
#[inline(always)]
unsafe fn load2_bf16(p: *const bf16) -> (__m512, __m512) {
    // SAFETY: the caller's contract.
    unsafe {
        let order = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0);
        let h = _mm512_permutexvar_epi64(order, _mm512_loadu_si512(p.cast()));
        let z = _mm512_setzero_si512();
        (
            _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, h)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, h)),
        )
    }
}

/// float16 bits of 16 float32 lanes (`vcvtps2ph`, nearest even, as `f16::from_f32`).
///
/// # Safety
/// The caller runs with AVX-512F.
#[inline(always)]
unsafe fn narrow_f16(v: __m512) -> __m256i {
    // SAFETY: register-only intrinsic; the feature is the caller's.
    unsafe { _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v) }
}

/// float32 lanes from 16 float16 bit patterns (`vcvtph2ps`, exact).
///
/// # Safety
/// The caller runs with AVX-512F.
#[inline(always)]
unsafe fn widen_f16(h: __m256i) -> __m512 {
    // SAFETY: register-only intrinsic; the feature is the caller's.
    unsafe { _mm512_cvtph_ps(h) }
}

// ----- lane math ----------------------------------------------------------------------

/// `x.clamp(lo, hi)` as `f32::clamp` computes it (NaN stays NaN).
///
/// # Safety
/// The caller runs with AVX-512F.
#[inline(always)]
unsafe fn clamp(x: __m512, lo: f32, hi: f32) -> __m512 {
    // SAFETY: register-only intrinsics; the feature is the caller's.
    unsafe {
        let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        // `x < lo` and `x > hi` are false for NaN, which is kept.
        let x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, lo), lo);
        _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, hi), hi)
    }
}

/// `0` where `x < lo`, `+inf` where `x > hi`, else `y`: [`vmath::exp`]'s range checks.
///
/// # Safety
/// The caller runs with AVX-512F.
#[inline(always)]
unsafe fn exp_range(x: __m512, y: __m512, lo: f32, hi: f32) -> __m512 {
    // SAFETY: register-only intrinsics; the feature is the caller's.
    unsafe {
        let y = _mm512_mask_mov_ps(
            y,
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(lo)),
            _mm512_setzero_ps(),
        );
        _mm512_mask_mov_ps(
            y,
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(hi)),
            _mm512_set1_ps(f32::INFINITY),
        )
    }
}

/// `2^n` from `t = n + 1.5·2^23` (the low mantissa bits of `t` hold `n`).
///
/// # Safety
/// The caller runs with AVX-512F.
#[inline(always)]
unsafe fn pow2(t: __m512) -> __m512 {
    // SAFETY: register-only intrinsics; the feature is the caller's.
    unsafe {
        let b = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B40_0000 - 127));
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(b))
    }
}

const MAGIC: f32 = 12_582_912.0;

/// `(y, t)` of [`vmath::exp`] (`FMA = false`, no fused operations) or
/// `vmath::exp_fma_checked` (`FMA = true`) on 16 lanes, without their range handling:
/// `exp(x) = y · 2^n` for `x` in `[EXP_LO, EXP_HI]`, `t = n + 1.5·2^23` (NaN
/// propagates; garbage elsewhere).
///
/// # Safety
/// The caller runs with AVX-512F, and FMA when `FMA`.
#[inline(always)]
unsafe fn exp_parts<const FMA: bool>(x: __m512) -> (__m512, __m512) {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        vmath::exp_parts_lanes!(
            x,
            FMA,
            _mm512_set1_ps,
            _mm512_add_ps,
            _mm512_sub_ps,
            _mm512_mul_ps,
            _mm512_fmadd_ps
        )
    }
}

/// `y · 2^n` from [`exp_parts`], `2^n` built from the bits of `t` (`n = 128`, at the
/// top of the range, gives `+inf`, as [`vmath::exp`]).
///
/// # Safety
/// The caller runs with AVX-512F, and FMA when `FMA`.
#[inline(always)]
unsafe fn exp_core<const FMA: bool>(x: __m512) -> __m512 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let (y, t) = exp_parts::<FMA>(x);
        _mm512_mul_ps(y, pow2(t))
    }
}

/// [`vmath::exp`] on 16 lanes (no fused operations), bit for bit.
///
/// # Safety
/// The caller runs with AVX-512F.
#[inline(always)]
unsafe fn exp(x: __m512) -> __m512 {
    // SAFETY: register-only intrinsics; the feature is the caller's.
    unsafe {
        let y = exp_core::<false>(clamp(x, EXP_LO, EXP_HI));
        exp_range(x, y, EXP_LO, EXP_HI)
    }
}

/// `vmath::exp_fma_checked` on 16 lanes, bit for bit (the kernels take
/// [`exp_le0`]; this form pins it in the tests).
///
/// # Safety
/// The caller runs with AVX-512F and FMA.
#[cfg(test)]
#[inline(always)]
unsafe fn exp_fma(x: __m512) -> __m512 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let y = exp_core::<true>(clamp(x, EXP_LO, EXP_HI));
        exp_range(x, y, EXP_LO, EXP_HI)
    }
}

/// [`exp`] (`FMA = false`) or `exp_fma` (`FMA = true`) for lanes that are `<= 0` or
/// NaN, bit for bit, in 8 fewer operations of 22: such a lane never reaches the
/// upper clamp or the `+inf` check; the lower clamp leaves every lane it keeps as it
/// is, and a lane below it is set to 0 whatever was computed on it; and `y · 2^n`,
/// `n` in `[-126, 0]` where kept, is one `vscalefps` (masked, which also zeroes the
/// lanes below), rounded once as the product by the integer-built `2^n` is. A
/// softmax's `x - max` spends most of its time here.
///
/// A lane above 0 gets an unspecified value (the masked-off tail lanes of a row).
///
/// # Safety
/// The caller runs with AVX-512F, and FMA when `FMA`.
#[inline(always)]
unsafe fn exp_le0<const FMA: bool>(x: __m512) -> __m512 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let (y, t) = exp_parts::<FMA>(x);
        let n = _mm512_sub_ps(t, _mm512_set1_ps(MAGIC));
        let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(EXP_LO));
        _mm512_maskz_scalef_ps(keep, y, n)
    }
}

/// The 16 lanes added pairwise as [`crate::reduce::lane_sum`] finishes: lane `k` plus
/// lane `k + 8`, then `k + 4`, `k + 2`, `k + 1`.
///
/// # Safety
/// The caller runs with AVX-512 F/DQ.
#[inline(always)]
unsafe fn fold16(acc: __m512) -> f32 {
    // SAFETY: register-only intrinsics; the features are the caller's.
    unsafe {
        let a = _mm256_add_ps(
            _mm512_castps512_ps256(acc),
            _mm512_extractf32x8_ps::<1>(acc),
        );
        let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
        _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
    }
}

/// The running state of a 16-lane sum over a row: element `i` goes to lane `i % 16`.
#[derive(Clone, Copy)]
struct Sum16(__m512);

impl Sum16 {
    /// # Safety
    /// The caller runs with AVX-512F.
    #[inline(always)]
    unsafe fn new() -> Self {
        // SAFETY: register-only intrinsic; the feature is the caller's.
        Sum16(unsafe { _mm512_setzero_ps() })
    }
    /// Add 16 consecutive elements.
    ///
    /// # Safety
    /// The caller runs with AVX-512F.
    #[inline(always)]
    unsafe fn add(&mut self, v: __m512) {
        // SAFETY: register-only intrinsic; the feature is the caller's.
        self.0 = unsafe { _mm512_add_ps(self.0, v) };
    }
    /// Add the low `k` lanes of `v` (the row's last `k` elements); the other lanes are
    /// left as they are.
    ///
    /// # Safety
    /// The caller runs with AVX-512F.
    #[inline(always)]
    unsafe fn add_tail(&mut self, k: usize, v: __m512) {
        // SAFETY: register-only intrinsic; the feature is the caller's.
        self.0 = unsafe { _mm512_mask_add_ps(self.0, low(k), self.0, v) };
    }
    /// The sum.
    ///
    /// # Safety
    /// The caller runs with AVX-512 F/DQ.
    #[inline(always)]
    unsafe fn finish(self) -> f32 {
        // SAFETY: the features are the caller's.
        unsafe { fold16(self.0) }
    }
}

/// Elements `i..i + k` of `x` (16 lanes, the lanes from `k` on zero), also stored
/// widened to float32 at `keep + i` when `KEEP`.
///
/// # Safety
/// `x` is valid for `i + k` reads (and, with `KEEP`, `keep` for `i + k` writes),
/// `k <= 16`; the caller runs with the kernels' features.
#[inline(always)]
unsafe fn load_keep<S: Lane, const KEEP: bool>(
    x: *const S,
    keep: *mut f32,
    i: usize,
    k: usize,
) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let v = lanes(x, i, k);
        if KEEP && k == 16 {
            f32::store(keep.add(i), v);
        } else if KEEP {
            f32::store_tail(keep.add(i), k, v);
        }
        v
    }
}

/// Elements `i..i + 32` of `x` ([`Lane::load2`]), also stored widened to float32 at
/// `keep + i` when `KEEP`.
///
/// # Safety
/// `x` is valid for `i + 32` reads (and, with `KEEP`, `keep` for `i + 32` writes); the
/// caller runs with the kernels' features.
#[inline(always)]
unsafe fn load_keep2<S: Lane, const KEEP: bool>(
    x: *const S,
    keep: *mut f32,
    i: usize,
) -> (__m512, __m512) {
    // SAFETY: the caller's contract.
    unsafe {
        let (p, q) = S::load2(x.add(i));
        if KEEP {
            f32::store(keep.add(i), p);
            f32::store(keep.add(i + 16), q);
        }
        (p, q)
    }
}

/// The sums (`[f32; R]`) of `R` rows of `len` elements in [`Sum16`]'s order, `$v`
/// giving elements `$i..$i + $k` of row `$r` (`$k` is 16 but for the last `len % 16`;
/// lanes from `$k` on are not added). The rows' vectors alternate, so one row's chain
/// of additions runs beside the others' ([`PAIR_ROW`]); each row's sum is the one it
/// has alone. With `if $two => |$r2, $i2| $v2` (`$two` a constant, [`Lane::LOAD2`]),
/// `$v2` gives elements `$i2..$i2 + 32` of row `$r2` as two vectors, taken first while
/// 32 are left. A macro, not a function taking a closure: a closure is compiled without
/// the kernels' features unless it inlines, and one holding an exponential did not
/// (softmax ran 25 times slower).
macro_rules! sum16_rows_by {
    ($R:expr, $len:expr, |$r:ident, $i:ident, $k:ident| $v:expr
     $(, if $two:expr => |$r2:ident, $i2:ident| $v2:expr)?) => {{
        let len = $len;
        let mut acc = [Sum16::new(); $R];
        let mut $i = 0;
        $(
        while $two && $i + 32 <= len {
            {
                let $i2 = $i;
                for ($r2, a) in acc.iter_mut().enumerate() {
                    let (p, q) = $v2;
                    a.add(p);
                    a.add(q);
                }
            }
            $i += 32;
        }
        )?
        while $i + 16 <= len {
            let $k = 16;
            for ($r, a) in acc.iter_mut().enumerate() {
                a.add($v);
            }
            $i += 16;
        }
        if $i < len {
            let $k = len - $i;
            for ($r, a) in acc.iter_mut().enumerate() {
                a.add_tail($k, $v);
            }
        }
        let mut sums = [0f32; $R];
        for (s, a) in sums.iter_mut().zip(acc) {
            *s = a.finish();
        }
        sums
    }};
}

/// `sum(g(x[i]))` over each of `R` rows of `len` elements at `x` (row `r` from
/// `x + r·stride`; `g` is given the row) in [`Sum16`]'s order (`lane_sum`), also
/// storing the elements widened to float32 at `keep` (row `r` at `keep + r·stride`)
/// when `KEEP`.
///
/// # Safety
/// `x` is valid for `(R - 1)·stride + len` reads (and, with `KEEP`, `keep` for as many
/// writes); the caller runs with the kernels' features.
#[inline(always)]
unsafe fn sum16_rows<S: Lane, const KEEP: bool, const R: usize>(
    x: *const S,
    (stride, len): (usize, usize),
    g: impl Fn(__m512, usize) -> __m512,
    keep: *mut f32,
) -> [f32; R] {
    // SAFETY: the loads (and stores) stay within the rows; `keep` is only offset
    // (`wrapping_add`: it may be null) and written with `KEEP`.
    unsafe {
        sum16_rows_by!(R, len, |r, i, k| {
            let at = r * stride;
            g(load_keep::<S, KEEP>(x.add(at), keep.wrapping_add(at), i, k), r)
        }, if S::LOAD2 => |r, i| {
            let at = r * stride;
            let (p, q) = load_keep2::<S, KEEP>(x.add(at), keep.wrapping_add(at), i);
            (g(p, r), g(q, r))
        })
    }
}

/// `sum(g(x[i]))` as `norm.rs`'s `wide_sum`: [`sum16_rows`] for rows under 256 elements,
/// else 64 lanes (four registers; element `i` to lane `i % 64`) folded into 16 lanes in
/// order (`((0 + a0) + a1) + a2) + a3`) and then pairwise.
///
/// # Safety
/// `x` is valid for `n` reads; the caller runs with the kernels' features.
#[inline(always)]
unsafe fn wide_sum<S: Lane>(x: *const S, n: usize, g: impl Fn(__m512) -> __m512) -> f32 {
    // SAFETY: the caller's contract (nothing kept).
    unsafe { wide_sum_keep::<S, false>(x, n, g, std::ptr::null_mut()) }
}

/// [`wide_sum`], also storing the elements widened to float32 at `keep` when `KEEP`
/// (a 16-bit layer norm's first pass: one pass where widening first took two).
///
/// # Safety
/// As [`sum16_rows`] for one row.
#[inline(always)]
unsafe fn wide_sum_keep<S: Lane, const KEEP: bool>(
    x: *const S,
    n: usize,
    g: impl Fn(__m512) -> __m512,
    keep: *mut f32,
) -> f32 {
    if n < 256 {
        // SAFETY: the caller's contract.
        return unsafe { sum16_rows::<S, KEEP, 1>(x, (n, n), |v, _| g(v), keep)[0] };
    }
    // SAFETY: the loads (and stores) stay within `n` elements; the features are the
    // caller's.
    unsafe {
        let z = _mm512_setzero_ps();
        let load = |i: usize| load_keep::<S, KEEP>(x, keep, i, 16);
        let mut a = [z; 4];
        let mut i = 0;
        while i + 64 <= n {
            let ((v0, v1), (v2, v3)) = (
                load_keep2::<S, KEEP>(x, keep, i),
                load_keep2::<S, KEEP>(x, keep, i + 32),
            );
            for (a, v) in a.iter_mut().zip([v0, v1, v2, v3]) {
                *a = _mm512_add_ps(*a, g(v));
            }
            i += 64;
        }
        for a in a.iter_mut() {
            if i + 16 <= n {
                *a = _mm512_add_ps(*a, g(load(i)));
                i += 16;
            } else if i < n {
                let k = n - i;
                let v = load_keep::<S, KEEP>(x, keep, i, k);
                *a = _mm512_mask_add_ps(*a, low(k), *a, g(v));
                i = n;
            }
        }
        let mut acc = Sum16::new();
        for a in a {
            acc.add(a);
        }
        acc.finish()
    }
}

/// The maximum of the `n` elements at `x`, or the first NaN among them, as
/// `reduce::max_nan` (16 lanes, strictly greater wins, the lanes folded in order).
///
/// Four running maxima (`vmaxps`) take it at the loads' pace, where the one running
/// compare-and-select of the exact fold waited on its own latency every vector (a
/// fifth of a 1024-wide softmax). The value is the fold's, all but the sign of a zero
/// maximum (`+0` and `-0` tie; the fold keeps the lower lane's). That sign never
/// reaches an output: a row with one zero
/// at its maximum has that zero's sign either way, and a row with two has `sum >= 2`,
/// where `exp(±0) = 1` and `(±0) - lse` are the same for either sign (pinned by
/// `a_zero_maximum_gives_the_portable_bits`). A NaN (the first one) is found again in
/// the exact order ([`first_nan`]).
///
/// # Safety
/// `x` is valid for `n` reads; the caller runs with the kernels' features.
#[inline(always)]
unsafe fn max_nan<S: Lane>(x: *const S, n: usize) -> f32 {
    // SAFETY: the loads stay within `n` elements; the features are the caller's.
    unsafe {
        let lowest = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut acc = [lowest; 4];
        let mut nan: __mmask16 = 0;
        let step = |acc: &mut __m512, v: __m512, nan: &mut __mmask16| {
            *nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            *acc = _mm512_max_ps(*acc, v);
        };
        let mut i = 0;
        while i + 64 <= n {
            let ((a0, a1), (a2, a3)) = (S::load2(x.add(i)), S::load2(x.add(i + 32)));
            for (a, v) in acc.iter_mut().zip([a0, a1, a2, a3]) {
                step(a, v, &mut nan);
            }
            i += 64;
        }
        while i + 16 <= n {
            step(&mut acc[0], S::load(x.add(i)), &mut nan);
            i += 16;
        }
        if i < n {
            // `-inf` never beats a lane, as the untouched lanes of the portable loop.
            step(&mut acc[0], S::load_tail(x.add(i), n - i, lowest), &mut nan);
        }
        if nan != 0 {
            return first_nan(x, n);
        }
        let m = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
        _mm512_reduce_max_ps(m)
    }
}

/// The first NaN of the `n` elements at `x` (widened as the loads widen); there is one.
///
/// # Safety
/// `x` is valid for `n` reads; the caller runs with the kernels' features.
#[cold]
#[inline(never)]
unsafe fn first_nan<S: Lane>(x: *const S, n: usize) -> f32 {
    let mut i = 0;
    while i < n {
        let k = (n - i).min(16);
        // SAFETY: `k` elements from `i` are in the row (the caller's contract).
        let lanes = unsafe { widened(x, i, k) };
        if let Some(v) = lanes[..k].iter().find(|v| v.is_nan()) {
            return *v;
        }
        i += k;
    }
    f32::NAN
}

/// Elements `i..i + k` of the row at `x` widened into an array (`k <= 16`, zeros past
/// `k`), for the cold scan of [`first_nan`].
///
/// # Safety
/// `x` is valid for those `k` elements; the CPU has the kernels' features (this is
/// only called from the kernels).
unsafe fn widened<S: Lane>(x: *const S, i: usize, k: usize) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: the caller's contract.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), lanes(x, i, k)) };
    out
}

/// `out[i] = f(x[i])` over `n` elements (16 at a time, the tail masked).
///
/// # Safety
/// `x` and `out` are valid for `n` elements; the caller runs with the kernels'
/// features.
#[inline(always)]
unsafe fn map_row<S: Lane, D: Lane>(
    x: *const S,
    out: *mut D,
    n: usize,
    f: impl Fn(__m512, usize) -> __m512,
) {
    // SAFETY: the loads and stores stay within `n` elements; the features are the
    // caller's.
    unsafe {
        let mut i = 0;
        while i + 16 <= n {
            D::store(out.add(i), f(S::load(x.add(i)), i));
            i += 16;
        }
        if i < n {
            let k = n - i;
            D::store_tail(
                out.add(i),
                k,
                f(S::load_tail(x.add(i), k, _mm512_setzero_ps()), i),
            );
        }
    }
}

// ----- row kernels ----------------------------------------------------------------------

/// A row kernel `$name(args.., ne)` with the kernels' features (its docs end with the
/// contract of `ne`, which the macro adds after the invocation's `# Safety`), and `$ne`,
/// a second copy of its body compiled with AVX512-BF16 as well, which it runs when
/// `ne`. The body
/// reads the constant `$NE` (false in the first copy, true in the second) to round
/// bfloat16 rows by [`map_row_bf16_ne`], which inlines only into the second copy. Both
/// copies are the body itself, not calls of a shared function: closures take the
/// features of the function they are written in, so the body's closures (the lane
/// maps) must be written inside each copy (an `#[inline(always)]` body called from both
/// made bfloat16 layer norm ten times slower).
macro_rules! ne_kernel {
    ($(#[$attr:meta])*
     fn $name:ident, $ne:ident<S $(, const $c:ident: $ct:ty)*; $NE:ident>(
        $($arg:ident: $ty:ty),* $(,)?
     ) $body:block) => {
        $(#[$attr])*
        ///
        /// With `ne`, bfloat16 outputs are rounded by `vcvtneps2bf16`
        /// ([`map_row_bf16_ne`]): `ne` only for bfloat16 on a CPU with AVX512-BF16.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
        pub(crate) unsafe fn $name<S: Lane $(, const $c: $ct)*>($($arg: $ty,)* ne: bool) {
            if ne {
                // SAFETY: the caller's contract (`ne` only for bfloat16 on a CPU with
                // AVX512-BF16, as `$ne` needs).
                return unsafe { $ne::<S $(, $c)*>($($arg),*) };
            }
            const $NE: bool = false;
            $body
        }

        /// The `ne` copy of the kernel of the same name (compiled with AVX512-BF16).
        ///
        /// # Safety
        /// As that kernel with `ne`.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,avx512bf16")]
        unsafe fn $ne<S: Lane $(, const $c: $ct)*>($($arg: $ty),*) {
            const $NE: bool = true;
            $body
        }
    };
}

/// Every one of `$rows` rows through the kernel's own `$block!(R, first row)`: two at a
/// time ([`PAIR_ROW`]) when `$pair`, the row left over (or every row) one at a time.
macro_rules! paired {
    ($pair:expr, $rows:expr, $block:ident) => {{
        let rows = $rows;
        let pairs = if $pair { rows / 2 } else { 0 };
        for p in 0..pairs {
            $block!(2, 2 * p);
        }
        for r in 2 * pairs..rows {
            $block!(1, r);
        }
    }};
}

/// Rows of scratch a softmax keeps on the stack (longer rows allocate once per block).
const STACK_ROW: usize = 1024;

/// Softmax of each row of `n` elements of `x` into `out` (`exp` with fused
/// multiply-adds, as the float32 line kernel on AVX-512): `exp(x - max)` goes to a
/// float32 row (the output itself for float32), is summed in [`Sum16`]'s order, and is
/// multiplied by `1 / sum` while being rounded to the output.
///
/// # Safety
/// The CPU has the kernels' features ([`available`]); `x.len() == out.len()`, a
/// multiple of `n > 0`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn softmax_rows<S: Lane>(x: &[S], out: &mut [MaybeUninit<S>], n: usize) {
    // SAFETY: the caller's contract; `ne` only where the CPU has AVX512-BF16.
    unsafe { softmax_rows_with(x, out, n, 1.0, 0, 0, bf16_ne::<S>()) }
}

/// The softmax of `scale · x` over each row (attention's probabilities, one pass for
/// what the math path does in three); with `causal > 0` row `r` (counted from `r0`, the
/// first row's index in the whole input, so a block of rows may start anywhere) keeps
/// its first `r % causal + 1` elements and the others get probability 0, never
/// computed. The maximum is `scale` times the row's maximum, which is the maximum of
/// the products (rounding is monotonic and `scale > 0`), so every exponent is the
/// plain kernel's of the scaled row; with `scale = 1` and no mask the bits are
/// [`softmax_rows`]'.
///
/// # Safety
/// As [`softmax_rows`]; `scale > 0`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn scaled_softmax_rows<S: Lane>(
    x: &[S],
    out: &mut [MaybeUninit<S>],
    n: usize,
    scale: f32,
    causal: usize,
    r0: usize,
) {
    // SAFETY: the caller's contract; `ne` only where the CPU has AVX512-BF16.
    unsafe { softmax_rows_with(x, out, n, scale, causal, r0, bf16_ne::<S>()) }
}

ne_kernel! {
    /// [`scaled_softmax_rows`], with the rounding chosen by the caller.
    ///
    /// # Safety
    /// As [`scaled_softmax_rows`].
    fn softmax_rows_with, softmax_rows_ne<S; NE>(
        x: &[S],
        out: &mut [MaybeUninit<S>],
        n: usize,
        scale: f32,
        causal: usize,
        r0: usize,
    ) {
        let mut stack = [MaybeUninit::<f32>::uninit(); STACK_ROW];
        let mut heap = Vec::new();
        let scratch: *mut f32 = if S::F32 {
            std::ptr::null_mut()
        } else if n <= STACK_ROW {
            stack.as_mut_ptr().cast()
        } else {
            heap.resize(n, 0f32);
            heap.as_mut_ptr()
        };
        let rows = x.len() / n;
        let (xs, os) = (x.as_ptr(), out.as_mut_ptr().cast::<S>());
        // `R` rows from row `r`, written here so that the closures have this function's
        // features.
        macro_rules! block {
            ($R:literal, $r:expr) => {{
                let r = $r;
                let (xp, op) = (xs.add(r * n), os.add(r * n));
                let len = if causal > 0 {
                    ((r0 + r) % causal + 1).min(n)
                } else {
                    n
                };
                // The float32 rows: the output itself when it is float32.
                let buf: *mut f32 = if S::F32 { op.cast() } else { scratch };
                let mut m = [0f32; $R];
                for (j, m) in m.iter_mut().enumerate() {
                    *m = max_nan(xp.add(j * n), len) * scale;
                }
                let sums = if scale == 1.0 {
                    exp_rows::<S, false, $R>(xp, buf, (n, len), scale, m)
                } else {
                    exp_rows::<S, true, $R>(xp, buf, (n, len), scale, m)
                };
                for (j, sum) in sums.into_iter().enumerate() {
                    let inv = _mm512_set1_ps(1.0 / sum);
                    let (b, o) = (buf.add(j * n).cast_const(), op.add(j * n));
                    map_row_ne::<_, _, NE>(b, o, len, |e, _| _mm512_mul_ps(e, inv));
                    // Masked entries: probability 0 (all-zero bits in every storage type).
                    std::ptr::write_bytes(o.add(len), 0, n - len);
                }
            }};
        }
        // Unmasked short rows two at a time; `2n <= STACK_ROW` keeps a 16-bit pair's
        // scratch on the stack.
        let pair = causal == 0 && n <= PAIR_ROW && 2 * n <= STACK_ROW;
        // SAFETY: every pointer covers the rows it is given (`x` and `out` hold `rows`
        // rows; `buf` is the output rows or `STACK_ROW >= 2n` / `heap.len() == n`
        // elements, a pair's only with `2n <= STACK_ROW`); the features are this
        // function's. `buf` is written before it is read back.
        unsafe { paired!(pair, rows, block) }
    }
}

/// Rows of at most this many elements are run two at a time (softmax, log-softmax,
/// their backward, layer norm), their vectors alternating: a short row's time is mostly
/// the latency of its reductions (the sum's fold, the division, the maximum), which one
/// row alone leaves the vector units waiting on. Zen 5, `[64, 64]` softmax: float32
/// 1.43 to 1.17 µs, bfloat16 1.76 to 1.58.
const PAIR_ROW: usize = 256;

/// `buf[i] = exp(scale · x[i] - m[r])` over each of `R` consecutive rows (row `r` at
/// `x + r·stride` and `buf + r·stride`, `len` elements), returning their sums, each in
/// [`Sum16`]'s order (`m[r]` is `scale` times row `r`'s maximum, so every exponent is
/// `<= 0` or NaN: [`exp_le0`]); the rows' vectors alternate ([`sum16_rows`]).
/// `SCALED = false` skips the product, for `scale == 1` (exact: `x · 1 = x`).
///
/// # Safety
/// `x` and `buf` are valid for `(R - 1)·stride + len` elements; the caller runs with
/// the kernels' features.
#[inline(always)]
unsafe fn exp_rows<S: Lane, const SCALED: bool, const R: usize>(
    x: *const S,
    buf: *mut f32,
    (stride, len): (usize, usize),
    scale: f32,
    m: [f32; R],
) -> [f32; R] {
    // SAFETY: the loads and stores stay within the rows; the features are the caller's.
    unsafe {
        let sc = _mm512_set1_ps(scale);
        let mut mv = [_mm512_setzero_ps(); R];
        for (v, m) in mv.iter_mut().zip(m) {
            *v = _mm512_set1_ps(m);
        }
        let shifted = |v: __m512, m: __m512| {
            let v = if SCALED { _mm512_mul_ps(v, sc) } else { v };
            exp_le0::<true>(_mm512_sub_ps(v, m))
        };
        sum16_rows_by!(R, len, |r, i, k| {
            let at = r * stride + i;
            let e = shifted(lanes(x.add(at), 0, k), mv[r]);
            if k == 16 {
                _mm512_storeu_ps(buf.add(at), e);
            } else {
                f32::store_tail(buf.add(at), k, e);
            }
            e
        }, if S::LOAD2 => |r, i| {
            let at = r * stride + i;
            let (v0, v1) = S::load2(x.add(at));
            let (e0, e1) = (shifted(v0, mv[r]), shifted(v1, mv[r]));
            _mm512_storeu_ps(buf.add(at), e0);
            _mm512_storeu_ps(buf.add(at + 16), e1);
            (e0, e1)
        })
    }
}

/// `out[i] = bf16(f(i, k))` over a row of `n` elements, 16 at a time (`f` gives the
/// float32 values of elements `i..i + k`, `k` = 16 except for the last `n % 16`),
/// rounded by `vcvtneps2bf16` (one instruction where the integer rounding takes seven):
/// `false` when a value is NaN or subnormal, which the instruction rounds differently
/// (payload kept, subnormals flushed). The check is one `vfpclassps` per vector,
/// gathered into a mask and read once at the end, so the caller writes the row again
/// with the integer rounding only then, and the bits are always the integer rounding's.
/// (A branch per vector instead was slower than the integer rounding.) `out` is a
/// slice, which no other pointer reaches, so the loads of what `f` captures by
/// reference leave the loop; through a raw pointer they were made again every vector
/// (the bfloat16 layer norm was 20% slower). With `f2` (`f2(i)` giving elements
/// `i..i + 32`, for a [`Lane::LOAD2`] input), 32 values a step are rounded by one
/// `vcvtne2ps2bf16` and stored at once.
///
/// Always inlined, into the row kernels' copies compiled with AVX512-BF16 ([`ne_kernel!`]):
/// called from the kernels' own features, one call per row, the call itself (closure
/// captures reloaded from memory, `vzeroupper`, no overlap of one row's tail with the
/// next row's sums) cost more than the rounding saved (Zen 5: bfloat16 layer norm of
/// `[128, 128]` at 1.3× the float32 time).
///
/// # Safety
/// `out` is valid for `n` elements and `f` reads only what its `(i, k)` cover; the CPU
/// has AVX-512 and AVX512-BF16, and the caller is compiled with them.
#[inline(always)]
unsafe fn map_row_bf16_ne(
    out: &mut [MaybeUninit<bf16>],
    f: impl Fn(usize, usize) -> __m512,
    f2: Option<impl Fn(usize) -> (__m512, __m512)>,
) -> bool {
    let (n, out) = (out.len(), out.as_mut_ptr().cast::<bf16>());
    // fpclass categories: 0x01 quiet NaN, 0x80 signalling NaN, 0x20 subnormal.
    const ODD: i32 = 0xA1;
    // SAFETY: the stores stay within `n` elements; the features are this function's.
    unsafe {
        let mut bad: __mmask16 = 0;
        let mut i = 0;
        if let Some(f2) = &f2 {
            while i + 32 <= n {
                let (v, w) = f2(i);
                bad |= _mm512_fpclass_ps_mask::<ODD>(v) | _mm512_fpclass_ps_mask::<ODD>(w);
                let h: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(w, v));
                _mm512_storeu_si512(out.add(i).cast(), h);
                i += 32;
            }
        }
        while i + 16 <= n {
            let v = f(i, 16);
            bad |= _mm512_fpclass_ps_mask::<ODD>(v);
            let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_storeu_si256(out.add(i).cast(), h);
            i += 16;
        }
        if i < n {
            let k = n - i;
            let v = f(i, k);
            bad |= _mm512_fpclass_ps_mask::<ODD>(v) & low(k);
            let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_mask_storeu_epi16(out.add(i).cast(), low(k), h);
        }
        bad == 0
    }
}

/// Whether bfloat16 outputs of `S` round with `vcvtneps2bf16` ([`map_row_bf16_ne`]):
/// `S` is bfloat16 and the CPU has AVX512-BF16.
fn bf16_ne<S: Lane>() -> bool {
    TypeId::of::<S>() == TypeId::of::<bf16>() && vmath::has_bf16_ne()
}

/// [`map_row`], with a bfloat16 output rounded by `vcvtneps2bf16` when `NE`
/// ([`map_row_bf16_ne`]; a row holding a NaN or subnormal is computed again and
/// written with the integer rounding, so the bits are [`map_row`]'s).
///
/// # Safety
/// As [`map_row`]; `NE` only for a bfloat16 `D` on a CPU with AVX512-BF16, in a caller
/// compiled with it.
#[inline(always)]
unsafe fn map_row_ne<S: Lane, D: Lane, const NE: bool>(
    x: *const S,
    out: *mut D,
    n: usize,
    f: impl Fn(__m512, usize) -> __m512,
) {
    // SAFETY: the caller's contract.
    unsafe {
        if !(NE
            && map_row_bf16_ne(
                std::slice::from_raw_parts_mut(out.cast(), n),
                |i, k| f(lanes(x, i, k), i),
                S::LOAD2.then_some(|i: usize| {
                    let (v, w) = S::load2(x.add(i));
                    (f(v, i), f(w, i + 16))
                }),
            ))
        {
            map_row(x, out, n, f);
        }
    }
}

/// Elements `i..i + k` of `p` widened (`k <= 16`; zeros in the lanes past `k`).
///
/// # Safety
/// `p` is valid for those `k` elements; the caller has the kernels' features.
#[inline(always)]
unsafe fn lanes<L: Lane>(p: *const L, i: usize, k: usize) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        if k == 16 {
            L::load(p.add(i))
        } else {
            L::load_tail(p.add(i), k, _mm512_setzero_ps())
        }
    }
}

ne_kernel! {
    /// Log-softmax of each row: `(x - max) - ln(sum)`, the sum of `exp(x - max)`
    /// (without fused multiply-adds) taken as `FastExp::exp_shift_sum` does, in pieces
    /// of 256 elements each summed in [`Sum16`]'s order, the pieces added in order.
    ///
    /// # Safety
    /// As [`softmax_rows`].
    fn log_softmax_rows, log_softmax_rows_ne<S; NE>(
        x: &[S],
        out: &mut [MaybeUninit<S>],
        n: usize,
    ) {
        let rows = x.len() / n;
        let (xs, os) = (x.as_ptr(), out.as_mut_ptr().cast::<S>());
        // `R` rows from row `r` (the closures written here have this function's
        // features).
        macro_rules! block {
            ($R:literal, $r:expr) => {{
                let (xp, op) = (xs.add($r * n), os.add($r * n));
                let mut m = [_mm512_setzero_ps(); $R];
                for (j, m) in m.iter_mut().enumerate() {
                    *m = _mm512_set1_ps(max_nan(xp.add(j * n), n));
                }
                let mut s = [0f32; $R];
                let mut j = 0;
                while j < n {
                    let len = (n - j).min(256);
                    let e = |v, r: usize| exp_le0::<false>(_mm512_sub_ps(v, m[r]));
                    let part = sum16_rows::<S, false, $R>(
                        xp.add(j),
                        (n, len),
                        e,
                        std::ptr::null_mut(),
                    );
                    for (s, p) in s.iter_mut().zip(part) {
                        *s += p;
                    }
                    j += len;
                }
                for (r, s) in s.into_iter().enumerate() {
                    let (lse, m) = (_mm512_set1_ps(s.ln()), m[r]);
                    map_row_ne::<_, _, NE>(xp.add(r * n), op.add(r * n), n, |v, _| {
                        _mm512_sub_ps(_mm512_sub_ps(v, m), lse)
                    });
                }
            }};
        }
        // SAFETY: every pointer covers the rows it is given (a pair's rows are one
        // piece: `n <= PAIR_ROW = 256`); the features are this function's.
        unsafe { paired!(n <= PAIR_ROW, rows, block) }
    }
}

ne_kernel! {
    /// The gradient of each row of softmax (`LOG = false`: `y * (g - sum(g * y))`, the
    /// sum in [`Sum16`]'s order) or of log-softmax (`LOG = true`: `g - exp(y) * sum(g)`,
    /// `exp` without fused multiply-adds, of `y - 0` as the portable kernel computes
    /// it), times `scale` ([`scaled_softmax_rows`]' backward) before the one rounding.
    ///
    /// # Safety
    /// As [`softmax_rows`], and `g.len() == y.len() == out.len()`.
    fn softmax_backward_rows, softmax_backward_rows_ne<S, const LOG: bool; NE>(
            g: &[S],
            y: &[S],
            out: &mut [MaybeUninit<S>],
            n: usize,
            scale: f32,
        ) {
        let rows = g.len() / n;
        let (gs, ys, os) = (g.as_ptr(), y.as_ptr(), out.as_mut_ptr().cast::<S>());
        // `R` rows from row `r` (the closures written here have this function's
        // features).
        macro_rules! block {
            ($R:literal, $r:expr) => {{
                let at = $r * n;
                let (gp, yp, op) = (gs.add(at), ys.add(at), os.add(at));
                let zero = _mm512_setzero_ps();
                let sums: [f32; $R] = if LOG {
                    sum16_rows_by!($R, n, |r, i, k| lanes(gp.add(r * n), i, k))
                } else {
                    // `g * y` lane by lane: the `y` row is loaded alongside.
                    sum16_rows_by!($R, n, |r, i, k| {
                        _mm512_mul_ps(lanes(gp.add(r * n), i, k), lanes(yp.add(r * n), i, k))
                    })
                };
                let sc = _mm512_set1_ps(scale);
                for (r, s) in sums.into_iter().enumerate() {
                    let (s, yr) = (_mm512_set1_ps(s), yp.add(r * n));
                    // Times `scale` (exact when it is 1: the plain kernel's bits).
                    let grad = |gv, i| {
                        let yv = lanes(yr, i, (n - i).min(16));
                        let d = if LOG {
                            _mm512_sub_ps(gv, _mm512_mul_ps(exp(_mm512_sub_ps(yv, zero)), s))
                        } else {
                            _mm512_mul_ps(yv, _mm512_sub_ps(gv, s))
                        };
                        _mm512_mul_ps(d, sc)
                    };
                    map_row_ne::<_, _, NE>(gp.add(r * n), op.add(r * n), n, grad);
                }
            }};
        }
        // SAFETY: every pointer covers the rows it is given; the features are this
        // function's.
        unsafe { paired!(n <= PAIR_ROW, rows, block) }
    }
}

/// Layer norm of each row of `n` elements: `mean = wide_sum(x) / n`,
/// `var = wide_sum((x - mean)²) / n`, `rstd = 1 / sqrt(var + eps)`, then
/// `y = (x - mean) * rstd`, times `w` and plus `b` when given (float32, `n` each),
/// rounded once. The statistics of row `k` go to `mean[k]`, `rstd[k]`. A 16-bit row
/// of 256 to [`STACK_ROW`] elements is widened once into float32 scratch by the mean's
/// pass (the other two then read the scratch); other rows read their storage three
/// times. A short row's scratch is read back while its stores are still in flight,
/// which measured slower than widening again (Zen 4: float16 [32, 32] took 1.55× as
/// long, [64, 64] 1.35×).
///
/// # Safety
/// As [`softmax_rows`]; `mean` and `rstd` hold one value per row.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn layer_norm_rows<S: Lane>(
    x: &[S],
    out: &mut [MaybeUninit<S>],
    n: usize,
    eps: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    // SAFETY: the caller's contract; `ne` only where the CPU has AVX512-BF16.
    unsafe { layer_norm_rows_with(x, out, n, eps, (w, b), (mean, rstd), bf16_ne::<S>()) }
}

ne_kernel! {
    /// [`layer_norm_rows`], with the rounding chosen by the caller.
    ///
    /// # Safety
    /// As [`layer_norm_rows`].
    fn layer_norm_rows_with, layer_norm_rows_ne<S; NE>(
        x: &[S],
        out: &mut [MaybeUninit<S>],
        n: usize,
        eps: f32,
        wb: (Option<&[f32]>, Option<&[f32]>),
        stats: (&mut [f32], &mut [f32]),
    ) {
        let ((w, b), (mean, rstd)) = (wb, stats);
        let nc = n as f32;
        let wp = w.map(|w| w[..n].as_ptr());
        let bp = b.map(|b| b[..n].as_ptr());
        let mut stack = [MaybeUninit::<f32>::uninit(); STACK_ROW];
        let widen = !S::F32 && (256..=STACK_ROW).contains(&n);
        let buf: *mut f32 = stack.as_mut_ptr().cast();
        let rows = x.len() / n;
        let (xs, os) = (x.as_ptr(), out.as_mut_ptr().cast::<S>());
        // Row `$k`'s output from `$xp` (the storage, or the widened scratch) with its
        // statistics. The closures are written here so that they have this function's
        // features.
        macro_rules! normalize {
            ($xp:expr, $k:expr, $mu:expr, $var:expr) => {{
                let (xp, op, mu) = ($xp, os.add($k * n), $mu);
                let rs = 1.0 / ($var + eps).sqrt();
                (mean[$k], rstd[$k]) = (mu, rs);
                let (muv, rsv) = (_mm512_set1_ps(mu), _mm512_set1_ps(rs));
                let param = |p: *const f32, i: usize| {
                    if i + 16 <= n {
                        f32::load(p.add(i))
                    } else {
                        f32::load_tail(p.add(i), n - i, _mm512_setzero_ps())
                    }
                };
                let norm = |v, i| {
                    let y = _mm512_mul_ps(_mm512_sub_ps(v, muv), rsv);
                    match (wp, bp) {
                        (Some(w), Some(b)) => {
                            _mm512_add_ps(_mm512_mul_ps(y, param(w, i)), param(b, i))
                        }
                        (Some(w), None) => _mm512_mul_ps(y, param(w, i)),
                        (None, Some(b)) => _mm512_add_ps(y, param(b, i)),
                        (None, None) => y,
                    }
                };
                map_row_ne::<_, _, NE>(xp, op, n, norm);
            }};
        }
        let square = |v, mu| {
            let d = _mm512_sub_ps(v, mu);
            _mm512_mul_ps(d, d)
        };
        // Two rows from row `$k` (16-lane sums: rows under 256 elements), or one.
        macro_rules! block {
            (2, $k:expr) => {{
                let (k, xp) = ($k, xs.add($k * n));
                let null = std::ptr::null_mut();
                let sums = sum16_rows::<S, false, 2>(xp, (n, n), |v, _| v, null);
                let mu = sums.map(|s| s / nc);
                let muv = mu.map(|m| _mm512_set1_ps(m));
                let vars = sum16_rows::<S, false, 2>(xp, (n, n), |v, r| square(v, muv[r]), null);
                for (r, (mu, var)) in mu.into_iter().zip(vars).enumerate() {
                    normalize!(xp.add(r * n), k + r, mu, var / nc);
                }
            }};
            (1, $k:expr) => {{
                let k = $k;
                // The variance's pass and the output read `$xp`.
                macro_rules! single {
                    ($sum:expr, $xp:expr) => {{
                        let (mu, xp) = ($sum / nc, $xp);
                        let muv = _mm512_set1_ps(mu);
                        let var = wide_sum(xp, n, |v| square(v, muv)) / nc;
                        normalize!(xp, k, mu, var);
                    }};
                }
                let xp = xs.add(k * n);
                if widen {
                    // The mean's pass widens the row into `buf` as it sums it.
                    single!(wide_sum_keep::<S, true>(xp, n, |v| v, buf), buf.cast_const());
                } else {
                    single!(wide_sum(xp, n, |v| v), xp);
                }
            }};
        }
        // SAFETY: every pointer covers the rows it is given (`w` and `b` were cut to
        // `n`; `buf` holds `STACK_ROW >= n` and is written before it is read); the
        // features are this function's.
        unsafe { paired!(n < 256, rows, block) }
    }
}

// ----- drivers --------------------------------------------------------------------------

/// The line ops [`line_rows`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowOp {
    /// [`softmax_rows`] (`ins = [x]`).
    Softmax,
    /// [`log_softmax_rows`] (`ins = [x]`).
    LogSoftmax,
    /// [`softmax_backward_rows`] (`ins = [g, y]`).
    SoftmaxBackward,
    /// [`softmax_backward_rows`] with `LOG` (`ins = [g, y]`).
    LogSoftmaxBackward,
    /// [`scaled_softmax_rows`] (`ins = [x]`): `scale` as float32 bits, `causal` the
    /// rows of each masked matrix (0: none).
    ScaledSoftmax { scale: u32, causal: usize },
    /// [`softmax_backward_rows`] times `scale` (float32 bits; `ins = [g, y]`).
    ScaledSoftmaxBackward { scale: u32 },
}

impl RowOp {
    /// How many input rows the op reads per output row (`x`, or `g` and `y`).
    pub(crate) fn inputs(self) -> usize {
        match self {
            RowOp::Softmax | RowOp::LogSoftmax | RowOp::ScaledSoftmax { .. } => 1,
            RowOp::SoftmaxBackward
            | RowOp::LogSoftmaxBackward
            | RowOp::ScaledSoftmaxBackward { .. } => 2,
        }
    }
}

/// `op` over the `rows` contiguous rows of `n > 0` elements of `ins` (each
/// `rows * n` long, as many as `op` takes), split into blocks of rows as
/// [`crate::reduce::map_lines`] splits them.
fn run_rows<S: Lane + Send + Sync>(
    op: RowOp,
    ins: &[&[S]],
    out: &mut [MaybeUninit<S>],
    rows: usize,
    n: usize,
) {
    let ne = bf16_ne::<S>();
    let body = |r0: usize, block: &mut [MaybeUninit<S>]| {
        let lo = r0 * n;
        let part = |k: usize| &ins[k][lo..lo + block.len()];
        // SAFETY: `line_rows` checked `available()`; the parts and the block have the
        // same length, a multiple of `n > 0`.
        unsafe {
            match op {
                RowOp::Softmax => softmax_rows(part(0), block, n),
                RowOp::LogSoftmax => log_softmax_rows(part(0), block, n, ne),
                RowOp::SoftmaxBackward => {
                    softmax_backward_rows::<_, false>(part(0), part(1), block, n, 1.0, ne)
                }
                RowOp::LogSoftmaxBackward => {
                    softmax_backward_rows::<_, true>(part(0), part(1), block, n, 1.0, ne)
                }
                RowOp::ScaledSoftmax { scale, causal } => {
                    scaled_softmax_rows(part(0), block, n, f32::from_bits(scale), causal, r0)
                }
                RowOp::ScaledSoftmaxBackward { scale } => softmax_backward_rows::<_, false>(
                    part(0),
                    part(1),
                    block,
                    n,
                    f32::from_bits(scale),
                    ne,
                ),
            }
        }
    };
    for_row_blocks(out, rows, n, &body);
}

/// `op` over `rows` rows of `n` elements of float32, bfloat16 or float16 storage `T`
/// (the inputs are `rows * n` long, contiguous), straight from and to the storage type;
/// `None` (nothing done) for other types or when the CPU lacks the features.
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

/// One storage type's row driver: `op` over the `rows` rows of `n > 0` elements of the
/// inputs into the output (every element written).
pub(crate) type RowFn<S> = fn(RowOp, &[&[S]], &mut [MaybeUninit<S>], usize, usize);

/// A back-end's row drivers ([`line_rows`] here, `softmax/rows_avx2.rs` on AVX2), one
/// per storage type.
pub(crate) struct RowKernels {
    pub(crate) f32: RowFn<f32>,
    pub(crate) bf16: RowFn<bf16>,
    pub(crate) f16: RowFn<f16>,
}

impl RowKernels {
    /// `op` over `rows > 0` rows of `n > 0` elements of `ins` through the driver of
    /// `T` (the inputs `rows * n` long, as many as `op` takes): the output, taken
    /// uninitialised from the buffer pool; `None` for another type.
    pub(crate) fn run<T: Element>(
        &self,
        op: RowOp,
        ins: &[&[T]],
        rows: usize,
        n: usize,
    ) -> Option<Result<Vec<T>>> {
        let need = op.inputs();
        assert!(
            ins.len() == need && ins.iter().all(|s| s.len() == rows * n),
            "line_rows: {op:?} takes {need} inputs of {rows}x{n}"
        );
        macro_rules! typed {
            ($S:ty, $f:expr) => {
                if as_same::<T, $S>(&[]).is_some() {
                    let f = $f;
                    let a: [&[$S]; 2] = std::array::from_fn(|k| {
                        as_same::<T, $S>(ins.get(k).copied().unwrap_or(&[])).expect("same type")
                    });
                    // SAFETY: each row driver writes its rows in full.
                    return Some(unsafe {
                        written::<T, $S>(rows * n, |o| f(op, &a[..need], o, rows, n))
                    });
                }
            };
        }
        typed!(f32, self.f32);
        typed!(bf16, self.bf16);
        typed!(f16, self.f16);
        None
    }
}

/// A `len`-element output of `T` (which is `S`) filled by `fill`, taken uninitialised
/// from the buffer pool: every element is written, so it is never zeroed first (a
/// zeroing `calloc` of a 128 KiB bfloat16 output cost 6% of a 256×256 layer norm).
///
/// # Safety
/// `fill` writes every element of the slice it is given.
unsafe fn written<T: Element, S: 'static>(
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<S>]),
) -> Result<Vec<T>> {
    let mut out = amp_tensor::pool::try_vec_with_capacity::<T>(len)?;
    fill(as_same_mut(&mut out.spare_capacity_mut()[..len]).expect("T is S"));
    // SAFETY: `fill` wrote all `len` elements (the caller's contract), within the
    // capacity reserved above.
    unsafe { out.set_len(len) };
    Ok(out)
}

/// A pointer the row blocks write their statistics through (each block its own rows).
struct Stats(*mut f32);
// SAFETY: the blocks write disjoint elements (see `layer_norm`).
unsafe impl Sync for Stats {}

impl Stats {
    /// Row `r`'s element (a method, so closures capture the whole `Stats`).
    fn at(&self, r: usize) -> *mut f32 {
        self.0.wrapping_add(r)
    }
}

/// A layer norm's output and per-row mean and rstd.
type Normed<T> = (Vec<T>, Vec<f32>, Vec<f32>);

/// Layer norm ([`layer_norm_rows`]) of `rows` contiguous rows of `n > 0` elements of
/// float32, bfloat16 or float16 storage `T`, with float32 `w` and `b` of `n` elements:
/// `(output, mean, rstd)`, the blocks of rows split as `norm.rs`'s `norm_rows` splits
/// them. `None` (nothing done) for other types or when the CPU lacks the features.
pub(crate) fn layer_norm<T: Element>(
    x: &[T],
    rows: usize,
    n: usize,
    eps: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) -> Option<Result<Normed<T>>> {
    if n == 0 || rows == 0 || !available() {
        return None;
    }
    assert_eq!(x.len(), rows * n, "layer_norm: {rows}x{n} rows");
    let run = || -> Result<Normed<T>> {
        let mut out = None;
        let mut mean = amp_tensor::pool::try_zeroed::<f32>(rows)?;
        let mut rstd = amp_tensor::pool::try_zeroed::<f32>(rows)?;
        let (mp, rp) = (Stats(mean.as_mut_ptr()), Stats(rstd.as_mut_ptr()));
        macro_rules! typed {
            ($($S:ty),*) => {$(
                if let Some(xs) = as_same::<T, $S>(x) {
                    let body = |r0: usize, block: &mut [MaybeUninit<$S>]| {
                        let k = block.len() / n;
                        let xb = &xs[r0 * n..r0 * n + block.len()];
                        // SAFETY: rows `r0..r0 + k` are this block's alone (the blocks
                        // are disjoint), within the `rows` statistics; `available()`
                        // was checked and the slices hold `k` rows of `n`.
                        unsafe {
                            let m = std::slice::from_raw_parts_mut(mp.at(r0), k);
                            let r = std::slice::from_raw_parts_mut(rp.at(r0), k);
                            layer_norm_rows(xb, block, n, eps, w, b, m, r);
                        }
                    };
                    // SAFETY: the blocks cover every row, and each writes its rows in
                    // full.
                    out = Some(unsafe {
                        written::<T, $S>(rows * n, |o| for_row_blocks(o, rows, n, &body))
                    }?);
                }
            )*};
        }
        typed!(f32, bf16, f16);
        Ok((out.expect("one of the types"), mean, rstd))
    };
    if [
        as_same::<T, f32>(&[]).is_some(),
        as_same::<T, bf16>(&[]).is_some(),
        as_same::<T, f16>(&[]).is_some(),
    ]
    .contains(&true)
    {
        Some(run())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 lanes of `xs` through a lane exponential: `exp_fma` or `exp` (`fma`), or
    /// their `exp_le0` forms when `le0` (the CPU has the kernels' features).
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    fn lanes(xs: &[f32; 16], fma: bool, le0: bool) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: 16-element arrays; the features are this function's.
        unsafe {
            let v = _mm512_loadu_ps(xs.as_ptr());
            let r = match (fma, le0) {
                (true, false) => exp_fma(v),
                (false, false) => exp(v),
                (true, true) => exp_le0::<true>(v),
                (false, true) => exp_le0::<false>(v),
            };
            _mm512_storeu_ps(out.as_mut_ptr(), r);
        }
        out
    }

    #[test]
    fn bfloat16_softmax_rounds_with_vcvtneps2bf16_to_the_integer_rounding_bits() {
        if !vmath::has_bf16_ne() {
            eprintln!("skipped: no AVX512-BF16");
            return;
        }
        // A row whose outputs are all normal (one instruction), and rows with a
        // subnormal output or NaN, which the instruction would round differently:
        // written again with the integer rounding.
        let n = 37;
        let mut x: Vec<f32> = (0..4 * n)
            .map(|i| ((i * 7919) % 113) as f32 * 0.05 - 2.0)
            .collect();
        // Rows 1 and 2: zeros but one element, whose softmax (~e^-87 / 36) is a
        // bfloat16 subnormal.
        x[n..3 * n].fill(0.0);
        x[n + 3] = -87.0;
        x[2 * n + 30] = -86.0;
        x[3 * n + 5] = f32::NAN;
        let x: Vec<bf16> = x.into_iter().map(bf16::from_f32).collect();
        let run = |ne: bool| -> Vec<u16> {
            let mut out = vec![MaybeUninit::<bf16>::uninit(); x.len()];
            // SAFETY: `available()` (implied by `has_bf16_ne`) and AVX512-BF16 checked;
            // whole rows.
            unsafe { softmax_rows_with(&x, &mut out, n, 1.0, 0, 0, ne) };
            // SAFETY: every element was written.
            out.iter()
                .map(|o| unsafe { o.assume_init() }.to_bits())
                .collect()
        };
        let (fast, integer) = (run(true), run(false));
        assert!(
            integer[n + 3] != 0 && integer[n + 3] < 0x80,
            "a subnormal output"
        );
        assert_eq!(fast, integer);
    }

    #[test]
    fn bfloat16_layer_norm_rounds_with_vcvtneps2bf16_to_the_integer_rounding_bits() {
        if !vmath::has_bf16_ne() {
            eprintln!("skipped: no AVX512-BF16");
            return;
        }
        // Rows of 37 (a tail) and 300 (the 64-lane sums) elements: with a weight of
        // ones every output is normal (one instruction); a weight of 1e-39 makes them
        // bfloat16 subnormals, and a NaN input a NaN row, which the instruction would
        // round differently: written again with the integer rounding.
        for n in [37, 300] {
            let mut x: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 7919) % 113) as f32 * 0.05 - 2.0)
                .collect();
            x[2 * n + 5] = f32::NAN;
            let x: Vec<bf16> = x.into_iter().map(bf16::from_f32).collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 * 1e-3).collect();
            for (scale, subnormal) in [(1.0f32, false), (1e-39, true)] {
                let w: Vec<f32> = (0..n).map(|i| scale * (1.0 + i as f32 * 0.01)).collect();
                let bias = (!subnormal).then_some(&b[..]);
                let run = |ne: bool| -> Vec<u16> {
                    let mut out = vec![MaybeUninit::<bf16>::uninit(); x.len()];
                    let (mut m, mut r) = (vec![0f32; 3], vec![0f32; 3]);
                    // SAFETY: `available()` (implied by `has_bf16_ne`) and AVX512-BF16
                    // checked; whole rows, one mean and rstd per row.
                    unsafe {
                        layer_norm_rows_with(
                            &x,
                            &mut out,
                            n,
                            1e-5,
                            (Some(&w), bias),
                            (&mut m, &mut r),
                            ne,
                        )
                    };
                    // SAFETY: every element was written.
                    out.iter()
                        .map(|o| unsafe { o.assume_init() }.to_bits())
                        .collect()
                };
                let (fast, integer) = (run(true), run(false));
                let tiny = integer[..n]
                    .iter()
                    .filter(|&&h| h & 0x7F80 == 0 && h & 0x7F != 0);
                assert_eq!(tiny.count() > n / 2, subnormal, "n {n}, weight {scale}");
                assert!(integer[2 * n..].iter().all(|&h| h & 0x7FFF > 0x7F80));
                assert_eq!(fast, integer, "n {n}, weight {scale}");
            }
        }
    }

    #[test]
    fn lane_exps_match_the_scalar_ones_bit_for_bit() {
        if !available() {
            eprintln!("skipped: no AVX-512");
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
        ]);
        xs.resize(xs.len().next_multiple_of(16), 0.5);
        for c in xs.chunks_exact(16) {
            let c: &[f32; 16] = c.try_into().expect("16");
            // The same lanes made `<= 0` (NaN kept) for the `exp_le0` forms.
            let neg = c.map(|x| if x > 0.0 { -x } else { x });
            for (fma, le0) in [(false, false), (true, false), (false, true), (true, true)] {
                let c = if le0 { &neg } else { c };
                // SAFETY: `available()` checked the features.
                let got = unsafe { lanes(c, fma, le0) };
                for (&x, g) in c.iter().zip(got) {
                    let want = if fma {
                        crate::vmath::exp_fma_checked(x)
                    } else {
                        crate::vmath::exp(x)
                    };
                    assert_eq!(g.to_bits(), want.to_bits(), "exp({x}) fma={fma} le0={le0}");
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod same_as_portable {
    //! The kernels against the portable line kernels they replace, bit for bit, on
    //! rows of every length up to 70 and around the 256 and 1024 boundaries, with
    //! zeros of both signs, infinities and NaNs sprinkled in.
    use super::*;
    use crate::reduce::map_lines;
    use crate::softmax::{
        log_softmax_backward_line, log_softmax_line, softmax_backward_line, softmax_line,
    };

    fn data(len: usize, seed: u32, specials: bool) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
        (0..len)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let u = (s >> 8) as f32 / (1u32 << 24) as f32;
                match (specials, i % 97) {
                    (true, 5) => f32::NAN,
                    (true, 11) => -0.0,
                    (true, 13) => 0.0,
                    (true, 17) => f32::NEG_INFINITY,
                    (true, 19) => f32::INFINITY,
                    // A subnormal, and values whose softmax is subnormal in rows with
                    // a finite maximum near 5 (`exp` stops at -87.3, the division by
                    // the sum goes below 2^-126): the rounding to 16 bits must keep
                    // those as the portable kernels do (`vcvtneps2bf16` would flush
                    // them; a per-vector check to avoid it cost more than it saved).
                    (true, 23) => 1e-39,
                    (true, 29) => -81.0,
                    (true, 31) => -82.5,
                    (true, 37) => -83.5,
                    _ => (u - 0.5) * 12.0,
                }
            })
            .collect()
    }

    /// [`data`] rounded to `T` by `from`.
    fn data_as<T>(from: fn(f32) -> T, len: usize, seed: u32, specials: bool) -> Vec<T> {
        data(len, seed, specials).into_iter().map(from).collect()
    }

    /// The bits of each value, every NaN as one pattern: which NaN an operation on
    /// NaNs gives depends on the operand order the compiler picks (LLVM treats `+` and
    /// `*` as commutative), in the portable kernels as much as here.
    fn bits<T: Element>(v: &[T]) -> Vec<u64> {
        v.iter()
            .map(|x| x.to_f64())
            .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
            .collect()
    }

    fn lengths() -> Vec<usize> {
        let mut v: Vec<usize> = (1..=70).collect();
        v.extend([127, 128, 129, 255, 256, 257, 300, 1023, 1024, 1025, 1100]);
        v
    }

    /// A row back-end under test: a `line_rows` (this module's, or the AVX2 one's).
    pub(crate) trait Rows<T>:
        Fn(RowOp, &[&[T]], usize, usize) -> Option<Result<Vec<T>>>
    {
    }
    impl<T, F: Fn(RowOp, &[&[T]], usize, usize) -> Option<Result<Vec<T>>>> Rows<T> for F {}

    /// The softmax-family row kernels of `run` against the portable line kernels, bit
    /// for bit, on rows of every length of [`lengths`], with and without specials; and
    /// the scaled (and causal) softmax and its gradient against the op-by-op path in
    /// float32 on the widened input, rounded once ([`check_scaled`]).
    pub(crate) fn check_line_kernels<T: Element>(from: fn(f32) -> T, run: impl Rows<T>) {
        let rows = 3;
        for n in lengths() {
            for specials in [false, true] {
                let x: Vec<T> = data_as(from, rows * n, n as u32, specials);
                let g: Vec<T> = data_as(from, rows * n, 7 + n as u32, false);
                let geom = (rows, n, 1);
                let want = |ins: &[&[T]], f: fn(&[&[f32]], &mut [f32])| {
                    map_lines::<T, f32>(ins, geom, f).expect("portable")
                };
                let got = |op, ins: &[&[T]]| run(op, ins, rows, n).expect("kernel").expect("alloc");
                let y = want(&[&x], softmax_line::<f32>);
                assert_eq!(bits(&got(RowOp::Softmax, &[&x])), bits(&y), "softmax n={n}");
                let ly = want(&[&x], log_softmax_line::<f32>);
                assert_eq!(
                    bits(&got(RowOp::LogSoftmax, &[&x])),
                    bits(&ly),
                    "log_softmax n={n}"
                );
                assert_eq!(
                    bits(&got(RowOp::SoftmaxBackward, &[&g, &y])),
                    bits(&want(&[&g, &y], softmax_backward_line::<f32>)),
                    "softmax_backward n={n}"
                );
                assert_eq!(
                    bits(&got(RowOp::LogSoftmaxBackward, &[&g, &ly])),
                    bits(&want(&[&g, &ly], log_softmax_backward_line::<f32>)),
                    "log_softmax_backward n={n}"
                );
            }
        }
        check_scaled(from, &run);
    }

    /// [`RowOp::ScaledSoftmax`] (plain and causal: one `[n, n]` matrix, row `r`
    /// keeping `r + 1` elements) against the float32 op-by-op path on the widened
    /// input (the product, the mask as -inf, the portable softmax), rounded once to
    /// `T`; a masked entry is 0 (never computed, even where a NaN in the row makes the
    /// op-by-op path's NaN). Its gradient against the portable softmax gradient times
    /// `scale` in float32, rounded once.
    fn check_scaled<T: Element>(from: fn(f32) -> T, run: &impl Rows<T>) {
        let wide = |v: &[T]| v.iter().map(|x| x.to_f64() as f32).collect::<Vec<f32>>();
        for n in [1usize, 5, 37, 300] {
            let rows = n;
            let geom = (rows, n, 1);
            for specials in [false, true] {
                let x: Vec<T> = data_as(from, rows * n, 11 + n as u32, specials);
                let g: Vec<T> = data_as(from, rows * n, 5 + n as u32, false);
                for (scale, causal) in [(0.125f32, 0), (0.125, n), (1.0, n), (3.0, 0)] {
                    let masked = |k: usize| causal > 0 && k % n > k / n;
                    let w: Vec<f32> = (wide(&x).into_iter().enumerate())
                        .map(|(k, v)| {
                            if masked(k) {
                                f32::NEG_INFINITY
                            } else {
                                v * scale
                            }
                        })
                        .collect();
                    let want: Vec<T> = map_lines::<f32, f32>(&[&w], geom, softmax_line::<f32>)
                        .expect("portable")
                        .into_iter()
                        .enumerate()
                        .map(|(k, v)| from(if masked(k) { 0.0 } else { v }))
                        .collect();
                    let op = RowOp::ScaledSoftmax {
                        scale: scale.to_bits(),
                        causal,
                    };
                    let y = run(op, &[&x], rows, n).expect("kernel").expect("alloc");
                    let what = format!("n={n} scale={scale} causal={causal} specials={specials}");
                    assert_eq!(bits(&y), bits(&want), "scaled softmax {what}");
                    let d: Vec<T> = map_lines::<f32, f32>(
                        &[&wide(&g), &wide(&y)],
                        geom,
                        softmax_backward_line::<f32>,
                    )
                    .expect("portable")
                    .into_iter()
                    .map(|v| from(v * scale))
                    .collect();
                    let op = RowOp::ScaledSoftmaxBackward {
                        scale: scale.to_bits(),
                    };
                    let got = run(op, &[&g, &y], rows, n).expect("kernel").expect("alloc");
                    assert_eq!(bits(&got), bits(&d), "scaled softmax backward {what}");
                }
            }
        }
    }

    /// [`layer_norm`] against the portable layer norm, bit for bit (outputs, means,
    /// rstds), on rows of every length of [`lengths`], with and without a weight and a
    /// bias.
    fn check_layer_norm<T: Element>(from: fn(f32) -> T) {
        let rows = 3;
        for n in lengths() {
            for specials in [false, true] {
                let x: Vec<T> = data_as(from, rows * n, n as u32, specials);
                let w: Vec<f32> = data(n, 3, false);
                let b: Vec<f32> = data(n, 4, false);
                let xt = amp_tensor::Tensor::from_vec(x.clone(), vec![rows, n]).expect("x");
                let wt = amp_tensor::Tensor::from_vec(w.clone(), vec![n]).expect("w");
                let bt = amp_tensor::Tensor::from_vec(b.clone(), vec![n]).expect("b");
                for (wo, bo) in [
                    (None, None),
                    (Some(&wt), None),
                    (None, Some(&bt)),
                    (Some(&wt), Some(&bt)),
                ] {
                    let (o, m, r) = crate::norm::layer_norm_portable(&xt, &[n], wo, bo, 1e-5)
                        .expect("portable");
                    let (o2, m2, r2) =
                        layer_norm::<T>(&x, rows, n, 1e-5, wo.map(|_| &w[..]), bo.map(|_| &b[..]))
                            .expect("kernel")
                            .expect("alloc");
                    let tb = |t: &amp_tensor::Tensor| bits(&t.host_vec_as::<f64>().expect("vec"));
                    assert_eq!(tb(&o), bits(&o2), "layer_norm n={n}");
                    assert_eq!(tb(&m), bits(&m2), "layer_norm mean n={n}");
                    assert_eq!(tb(&r), bits(&r2), "layer_norm rstd n={n}");
                }
            }
        }
    }

    /// Rows whose maximum is zero, `-0` and `+0` in every pair of lanes and
    /// accumulators, the rest far below, through `run`'s log-softmax: the kernels'
    /// running maxima may keep the other zero than the portable fold, which must not
    /// change a bit of log-softmax (`x - max - lse`), the kernel where a sign could
    /// show.
    pub(crate) fn check_zero_maximum<T: Element>(from: fn(f32) -> T, run: impl Rows<T>) {
        for n in [20, 100, 300] {
            for (i, j) in (0..n)
                .step_by(7)
                .flat_map(|i| (0..n).step_by(5).map(move |j| (i, j)))
            {
                if i == j {
                    continue;
                }
                let mut x = vec![-40.0f32; n];
                (x[i], x[j]) = (-0.0, 0.0);
                let x: Vec<T> = x.into_iter().map(from).collect();
                let want = map_lines::<T, f32>(&[&x], (1, n, 1), log_softmax_line::<f32>)
                    .expect("portable");
                let got = run(RowOp::LogSoftmax, &[&x], 1, n)
                    .expect("kernel")
                    .expect("alloc");
                assert_eq!(bits(&got), bits(&want), "n {n}, -0 at {i}, +0 at {j}");
            }
        }
    }

    #[test]
    fn a_zero_maximum_gives_the_portable_bits() {
        if !available() {
            eprintln!("skipped: no AVX-512");
            return;
        }
        check_zero_maximum::<f32>(|v| v, line_rows);
        check_zero_maximum::<bf16>(amp_tensor::round_to_bf16, line_rows);
        check_zero_maximum::<f16>(f16::from_f32, line_rows);
    }

    #[test]
    fn every_kernel_matches_the_portable_one() {
        if !available() {
            eprintln!("skipped: no AVX-512");
            return;
        }
        check_line_kernels::<f32>(|v| v, line_rows);
        check_line_kernels::<bf16>(amp_tensor::round_to_bf16, line_rows);
        check_line_kernels::<f16>(f16::from_f32, line_rows);
        check_layer_norm::<f32>(|v| v);
        check_layer_norm::<bf16>(amp_tensor::round_to_bf16);
        check_layer_norm::<f16>(f16::from_f32);
    }
}
