//! Vectorisable float32 math for the elementwise kernels: `exp`, `tanh`, `sigmoid`,
//! `erf`, exact GELU and the tanh-approximated GELU, as branch-free scalar functions the
//! compiler turns into SIMD code when they are called in a loop compiled for AVX-512 or
//! AVX2 + FMA (see [`map_f32`], which picks the widest the CPU has at run time), and
//! GELU's tables in intrinsics.
//!
//! The polynomials rely on fused multiply-adds for their accuracy, so they are only
//! used where the CPU has FMA; elsewhere [`map_f32`] reports that it cannot help and the
//! callers keep their scalar (libm) code.
//!
//! `exp` is Cephes' (~1 ulp; [`exp`] and [`exp_fma_le0`], the row kernels', flush
//! results below 2^-126 to 0, [`exp_full`], the `exp` op's, rounds them to subnormals),
//! `tanh` and `sigmoid` are built on it (≤ 2 and 3 ulp), `erf` is Norbert Juffa's
//! (≤ 1 ulp). Exact GELU is `x·Φ(x)` from a table of polynomial pieces, fitted and
//! checked by `tools/fit_gelu.py`: on AVX-512 32 pieces of `Φ` selected by `vpermt2ps`
//! (|error| ≤ 5.8e-8), read straight from f32/bf16/f16 storage; on AVX2 8 pieces of
//! the tail `Φ(-|x|)` selected by `vpermps`. Its gradient takes `Φ` from the same
//! tables.
use std::mem::MaybeUninit;

/// Below this `exp` is 0 (`ln(2^-126)`, the smallest normal result): every exponential
/// here and in the row kernels (`rows512`) flushes there.
pub(crate) const EXP_LO: f32 = -87.336_55;
/// Above this `exp` is `+inf` (`127.5 · ln 2`).
pub(crate) const EXP_HI: f32 = 88.376_26;

/// `exp(x)`, vectorisable: Cephes' `expf` polynomial (about 1 ulp) with the power of
/// two built from the exponent bits. Below `ln(2^-126)` the result is 0 (so `exp(-inf)`
/// is exactly 0, as masked softmax needs); above `127.5 * ln 2` (≈ 88.38) it is +inf;
/// NaN propagates.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(EXP_LO, EXP_HI); // NaN stays NaN
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    // Horner without fused multiply-adds.
    let p = EXP_POLY[1..].iter().fold(EXP_POLY[0], |p, &c| p * r + c);
    let y = p * (r * r) + r + 1.0;
    // The low mantissa bits of `t` hold n; (n + 127) << 23 is 2^n.
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < EXP_LO {
        0.0
    } else if x > EXP_HI {
        f32::INFINITY
    } else {
        y * pow2
    }
}

/// `c[0]·xⁿ⁻¹ + ... + c[n-1]` by Horner's rule with fused multiply-adds, highest
/// coefficient first (unrolled: the callers pass constant arrays).
#[inline(always)]
fn horner<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    c[1..].iter().fold(c[0], |p, &k| p.mul_add(x, k))
}

/// Cephes' `expf` polynomial in the reduced argument `r` (highest coefficient first):
/// `exp(r) ≈ 1 + r + r²·p(r)`. The vector kernels (`rows512`) evaluate the same one.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// The body of a vector `exp_parts::<FMA>(x) -> (y, t)` (the row kernels' at AVX-512
/// width in `rows512.rs` and AVX2 width in `softmax/rows_avx2.rs`), given the width's
/// `set1`, `add`, `sub`, `mul` and `fmadd` intrinsics: `exp(x) = y · 2^n` with
/// `t = n + 1.5·2^23`, the operations of [`exp`] (`FMA = false`, none fused) or of
/// `exp_parts` (`FMA = true`), in the same order, so every lane has their bits. One
/// definition of the polynomial for every width. Expands to unsafe intrinsic calls:
/// the caller runs with the width's features and FMA.
macro_rules! exp_parts_lanes {
    ($x:expr, $fma_on:expr, $set1:ident, $add:ident, $sub:ident, $mul:ident, $fma:ident) => {{
        let x = $x;
        let s = $set1;
        let (add, sub, mul, fma) = ($add, $sub, $mul, $fma);
        const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
        use $crate::vmath::EXP_POLY;
        if $fma_on {
            let t = fma(x, s(std::f32::consts::LOG2_E), s(MAGIC));
            let n = sub(t, s(MAGIC));
            let r = fma(n, s(-0.693_359_4), x);
            let r = fma(n, s(2.121_944_4e-4), r);
            let mut p = s(EXP_POLY[0]);
            for c in &EXP_POLY[1..] {
                p = fma(p, r, s(*c));
            }
            (add(fma(p, mul(r, r), r), s(1.0)), t)
        } else {
            let t = add(mul(x, s(std::f32::consts::LOG2_E)), s(MAGIC));
            let n = sub(t, s(MAGIC));
            let r = sub(sub(x, mul(n, s(0.693_359_4))), mul(n, s(-2.121_944_4e-4)));
            let mut p = s(EXP_POLY[0]);
            for c in &EXP_POLY[1..] {
                p = add(mul(p, r), s(*c));
            }
            (add(add(mul(p, mul(r, r)), r), s(1.0)), t)
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(crate) use exp_parts_lanes;

/// `exp(x) = y · 2^n` with fused multiply-adds, Cephes' `expf` polynomial (about 1
/// ulp): `(y, t)`, `y` in `[0.7, 1.42]` and `n = round(x · log2 e)` in the low mantissa
/// bits of `t` (`t.to_bits() - 0x4B40_0000`). For `|x| < 2^21`; no range checks.
#[inline(always)]
fn exp_parts(x: f32) -> (f32, f32) {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let t = x.mul_add(std::f32::consts::LOG2_E, MAGIC);
    let n = t - MAGIC;
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let p = horner(r, EXP_POLY);
    (p.mul_add(r * r, r) + 1.0, t)
}

/// `exp(x)` for finite `x` in `[-87, 88]` (no range checks), with fused multiply-adds:
/// Cephes' `expf` polynomial, about 1 ulp. Only for callers compiled with FMA.
#[inline(always)]
fn exp_fma(x: f32) -> f32 {
    let (y, t) = exp_parts(x);
    // (n + 127) << 23 is 2^n.
    y * f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23)
}

/// [`exp`] with fused multiply-adds (the same range handling: 0 below `ln(2^-126)`,
/// +inf above `127.5 * ln 2`, NaN propagates). Only for callers compiled with FMA.
/// The kernels call [`exp_fma_le0`] (their arguments are `<= 0`); this is the form the
/// tests check it and the row kernels' lanes against.
#[cfg(test)]
#[inline(always)]
pub(crate) fn exp_fma_checked(x: f32) -> f32 {
    let y = exp_fma(x.clamp(EXP_LO, EXP_HI)); // NaN stays NaN
    if x < EXP_LO {
        0.0
    } else if x > EXP_HI {
        f32::INFINITY
    } else {
        y
    }
}

/// `exp_fma_checked` (the checked form, in the tests) for `x <= 0` or NaN, bit for bit, without the checks such an
/// argument never needs: it never reaches the upper clamp or `+inf`, and the lower
/// clamp only changes lanes that are set to 0 anyway (whatever [`exp_fma`] made of
/// them). A softmax's `x - max` and GELU's `-x²/2` are such arguments. Only for
/// callers compiled with FMA.
#[inline(always)]
pub(crate) fn exp_fma_le0(x: f32) -> f32 {
    let y = exp_fma(x);
    if x < EXP_LO {
        0.0
    } else {
        y
    }
}

/// `exp(x)` over the whole float32 range, vectorisable: [`exp_fma`]'s polynomial with
/// the power of two applied as two factors, so results between 2^-149 and 2^-126 are
/// subnormal (rounded once, as libm's) instead of 0; +inf from about 88.72 up, 0 below
/// about -103.97, NaN propagates. About 1 ulp. Needs FMA.
#[inline(always)]
pub(crate) fn exp_full(x: f32) -> f32 {
    // n = round(x·log2 e) stays in [-150, 128]: both halves of 2^n are normal floats.
    // NaN stays NaN through the clamp.
    let (y, t) = exp_parts(x.clamp(-104.0, 89.0));
    // 2^n = 2^(n >> 1) · 2^(n - (n >> 1)).
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let (n1, n2) = (ni >> 1, ni - (ni >> 1));
    let pow2 = |k: i32| f32::from_bits(((k + 127) << 23) as u32);
    // `y · 2^n1` is exact; the second product rounds once (to a subnormal, or to inf).
    y * pow2(n1) * pow2(n2)
}

/// The logistic sigmoid `1 / (1 + e^-x)`, vectorisable: `e = exp(-|x|)`, then
/// `1 / (1 + e)` for `x >= 0` and `e / (1 + e)` below (the unary kernel's scalar form,
/// so a very negative `x` gives its subnormal result, not 0). Needs FMA.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    let e = exp_full(-x.abs());
    let d = 1.0 + e;
    // NaN fails the comparison and takes `e / d`, which propagates it.
    if x >= 0.0 {
        1.0 / d
    } else {
        e / d
    }
}

/// `erf(x)`, vectorisable and within 1 ulp of the correctly rounded result (Norbert
/// Juffa's minimax approximations: `x * p(x²)` for `|x| <= 0.9277`, else
/// `1 - exp(q(|x|))` with the sign of `x`). Both halves are computed and one is
/// selected, so there is no branch; ±0, subnormals, ±inf and NaN come out right.
/// Needs FMA (its accuracy relies on fused multiply-adds).
#[inline(always)]
pub(crate) fn erf(a: f32) -> f32 {
    let s = a * a;
    // |x| <= 0.927734375: an odd polynomial.
    let p = horner(
        s,
        [
            -5.967_617e-4,
            4.991_194_2e-3,
            -2.676_813_5e-2,
            1.128_199_3e-1,
            -3.761_253_4e-1,
            1.283_791_7e-1,
        ],
    );
    let small = p.mul_add(a, a);
    // Larger |x|: 1 - exp(q(t)); past 4, erf rounds to ±1 (the clamp also keeps
    // infinities out of the polynomial).
    let t = a.abs().min(4.0);
    let ts = t * t;
    let mut r = (-1.728_534_7e-5f32).mul_add(t, 3.831_971_3e-4);
    let u = (-3.883_964_4e-3f32).mul_add(t, 2.425_462_2e-2);
    r = r.mul_add(ts, u);
    r = r.mul_add(t, -1.067_778_8e-1);
    r = r.mul_add(t, -6.348_467e-1);
    r = r.mul_add(t, -1.287_175_1e-1);
    r = r.mul_add(t, -t);
    let large = (1.0 - exp_fma(r)).copysign(a);
    // NaN fails the comparison and takes the small branch, which propagates it.
    if a.abs() > 0.927_734_4 {
        large
    } else {
        small
    }
}

/// Exact GELU, `x/2 * (1 + erf(x/√2))`, as the scalar kernel writes it.
#[inline(always)]
pub(crate) fn gelu(v: f32) -> f32 {
    v * 0.5 * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2))
}

/// `tanh(u)`, vectorisable: `1 - 2 / (exp(2|u|) + 1)` with the sign of `u`, and an odd
/// polynomial for `|u| < 0.625` where that would cancel. About 2 ulp. Needs FMA.
#[inline(always)]
pub(crate) fn tanh(u: f32) -> f32 {
    let a = u.abs();
    let e = exp_fma(2.0 * a.min(44.0));
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(u);
    // Minimax for tanh(u)/u - 1 on |u| < 0.625 in u² (Cephes' tanhf).
    let s = u * u;
    let p = horner(
        s,
        [
            -5.704_988_7e-3,
            2.063_909e-2,
            -5.373_971_6e-2,
            1.333_144_2e-1,
            -3.333_328e-1,
        ],
    );
    // The sign keeps tanh(-0) = -0 (the sum would round it to +0).
    let small = (p * s).mul_add(u, u).copysign(u);
    // NaN fails the comparison and takes the polynomial, which propagates it.
    if a >= 0.625 {
        large
    } else {
        small
    }
}

/// GELU with PyTorch's tanh approximation, as the scalar kernel writes it.
#[inline(always)]
pub(crate) fn gelu_tanh(v: f32) -> f32 {
    const BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
    let inner = BETA * (v + 0.044_715 * (v * v * v));
    0.5 * v * (1.0 + tanh(inner))
}

/// The normal CDF `Φ(x)` on `[-6, 6)` as 32 pieces of width 3/8, a degree-6 polynomial
/// in `x - centre` each (`PHI[k][i]`: the `d^k` coefficient of piece `i`), fitted for
/// the least relative error by `amp-kernels/tools/fit_gelu.py`, which prints this
/// table: absolute error at most 5.8e-8 (half an ulp of 1), relative error at most
/// 4.6e-6 in the far negative tail, where `1 + erf(x/√2)` in float32 has none left.
#[rustfmt::skip]
const PHI: [[f32; 32]; 7] = [
    [3.077346e-09, 2.7016734e-08, 2.0689727e-07, 1.3828143e-06, 8.070946e-06, 4.116747e-05, 0.00018366995, 0.0007175423, 0.0024579011, 0.007394607, 0.01958008, 0.045753624, 0.09467574, 0.1742507, 0.2868877, 0.42563432, 0.5743657, 0.7131123, 0.8257493, 0.9053243, 0.9542464, 0.98041993, 0.9926054, 0.9975421, 0.9992825, 0.99981636, 0.9999588, 0.99999195, 0.9999986, 0.9999998, 1.0, 1.0],
    [1.8389247e-08, 1.5158328e-07, 1.0855922e-06, 6.7547617e-06, 3.6515827e-05, 0.00017150624, 0.0006998521, 0.0024811907, 0.007642605, 0.020452673, 0.04755389, 0.096061505, 0.16859318, 0.2570739, 0.3405676, 0.3919909, 0.3919909, 0.3405676, 0.2570739, 0.16859318, 0.096061505, 0.04755389, 0.020452673, 0.007642605, 0.0024811907, 0.0006998522, 0.00017150627, 3.651585e-05, 6.754771e-06, 1.0855955e-06, 1.5158419e-07, 1.8389452e-08],
    [5.343682e-08, 4.1208335e-07, 2.7477713e-06, 1.5831047e-05, 7.87362e-05, 0.00033765106, 0.0012466098, 0.003954399, 0.010747421, 0.024926707, 0.04903996, 0.081051886, 0.11063926, 0.12050337, 0.095784634, 0.036749158, -0.036749132, -0.09578463, -0.120503396, -0.11063928, -0.08105189, -0.049039952, -0.024926696, -0.010747413, -0.003954397, -0.0012466112, -0.00033765272, -7.873719e-05, -1.5831458e-05, -2.7479032e-06, -4.1211717e-07, -5.344388e-08],
    [1.0039493e-07, 7.2124726e-07, 4.454255e-06, 2.3604443e-05, 0.000107082014, 0.00041455403, 0.0013636803, 0.0037880505, 0.00880212, 0.016844489, 0.02578952, 0.029581092, 0.020304862, -0.005189201, -0.038801458, -0.063033685, -0.063033685, -0.038801458, -0.0051892144, 0.020304846, 0.029581087, 0.02578953, 0.016844505, 0.00880213, 0.0037880524, 0.0013636771, 0.00041455025, 0.00010707965, 2.3603392e-05, 4.453894e-06, 7.2114864e-07, 1.003727e-07],
    [1.3751233e-07, 9.1433634e-07, 5.189631e-06, 2.505531e-05, 0.000102405036, 0.00035194412, 0.0010069042, 0.0023594769, 0.0043972237, 0.0061091897, 0.00512363, -0.0010287929, -0.0117757935, -0.021298418, -0.021419967, -0.0090802265, 0.0090784235, 0.021419698, 0.021299753, 0.011777426, 0.0010294488, -0.0051240805, -0.0061100037, -0.004397741, -0.0023595812, -0.001006801, -0.00035182363, -0.00010233356, -2.5025385e-05, -5.1799952e-06, -9.118529e-07, -1.3699098e-07],
    [1.494842e-07, 9.10232e-07, 4.687687e-06, 2.0290676e-05, 7.3153285e-05, 0.00021661563, 0.00051439373, 0.0009341183, 0.0011432426, 0.00043419847, -0.0017656102, -0.0047660903, -0.006086434, -0.0031697324, 0.0034003968, 0.009045617, 0.009045606, 0.0034004648, -0.003169444, -0.0060860743, -0.004765963, -0.00176582, 0.0004338528, 0.0011430143, 0.0009340797, 0.00051446294, 0.00021669565, 7.320348e-05, 2.0313068e-05, 4.695389e-06, 9.1234205e-07, 1.4996078e-07],
    [1.16209584e-07, 6.531718e-07, 3.0647532e-06, 1.1872581e-05, 3.7314756e-05, 9.224227e-05, 0.00016779611, 0.00018184612, -4.083159e-05, -0.00061810383, -0.0012705654, -0.0012034064, 0.00021047686, 0.0023037835, 0.0031494182, 0.0014978619, -0.001466259, -0.0031446796, -0.002327242, -0.0002391474, 0.0011918859, 0.0012785192, 0.0006324646, 4.997011e-05, -0.00018000444, -0.00016963296, -9.4389325e-05, -3.859121e-05, -1.2408365e-05, -3.2377964e-06, -6.9792134e-07, -1.2563194e-07],
];

/// Exact GELU `x·Φ(x)` over 16 lanes at a time from the [`PHI`] table (see
/// [`gelu_table`]): the piece index
/// selects the coefficients from two registers (`vpermt2ps`), so no `exp` and no
/// branch-both-ways select run. 1.7× the speed of [`gelu`] (whose `erf` evaluates
/// both its halves and an `exp`), which left PyTorch's AVX-512 GELU 1.7× faster.
/// `x ≤ -6`, as in [`gelu256`] and the scalar [`gelu`], gives `x·0` (−0, or NaN for −∞), `x ≥ 6` gives `x`, NaN propagates.
#[cfg(target_arch = "x86_64")]
mod gelu512 {
    use std::arch::x86_64::*;
    use std::mem::{transmute, MaybeUninit};

    use amp_tensor::half::{bf16, f16};

    use super::PHI;
    use crate::half16::lanes;

    const LO: f32 = -6.0;
    const H: f32 = 0.375;

    /// The [`PHI`] table as pairs of registers (pieces 0–15, 16–31).
    ///
    /// # Safety
    /// The caller runs with AVX-512F.
    #[inline(always)]
    unsafe fn table() -> [(__m512, __m512); 7] {
        // SAFETY: `PHI[k]` is 32 floats, two unaligned 16-lane loads; AVX-512F is the
        // caller's.
        std::array::from_fn(|k| unsafe {
            (
                _mm512_loadu_ps(PHI[k].as_ptr()),
                _mm512_loadu_ps(PHI[k][16..].as_ptr()),
            )
        })
    }

    /// `v·Φ(v)` on 16 lanes.
    ///
    /// # Safety
    /// The caller runs with AVX-512F/DQ and FMA.
    #[inline(always)]
    unsafe fn lanes_gelu(coef: &[(__m512, __m512); 7], v: __m512) -> __m512 {
        // SAFETY: the features are the caller's.
        unsafe { _mm512_mul_ps(v, lanes_cdf(coef, v)) }
    }

    /// `Φ(v)` on 16 lanes (0 from -6 down, where `1 + erf(v/√2)` is 0 in float32).
    ///
    /// # Safety
    /// The caller runs with AVX-512F/DQ and FMA.
    #[inline(always)]
    unsafe fn lanes_cdf(coef: &[(__m512, __m512); 7], v: __m512) -> __m512 {
        // SAFETY: register-only intrinsics; the features are the caller's.
        unsafe {
            let (lo, hi) = (_mm512_set1_ps(LO), _mm512_set1_ps(-LO));
            // `max(lo, v)` keeps a NaN `v` (the second operand wins when one is NaN).
            let xc = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
            let s = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.0 / H), _mm512_set1_ps(-LO / H));
            let idx = _mm512_min_epi32(_mm512_cvttps_epi32(s), _mm512_set1_epi32(31));
            let centre = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(idx),
                _mm512_set1_ps(H),
                _mm512_set1_ps(LO + H / 2.0),
            );
            let d = _mm512_sub_ps(xc, centre);
            let c = |k: usize| _mm512_permutex2var_ps(coef[k].0, idx, coef[k].1);
            let mut p = c(6);
            for k in (0..6).rev() {
                p = _mm512_fmadd_ps(p, d, c(k));
            }
            let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, lo);
            _mm512_mask_mov_ps(p, below, _mm512_setzero_ps())
        }
    }

    /// One storage type's loop: 16 lanes loaded (widened), mapped, stored (rounded);
    /// the tail goes through the same lanes, padded, so a value's result does not
    /// depend on where it sits.
    macro_rules! gelu_loop {
        ($name:ident, $S:ty, $zero:expr, $ld:expr, $st:expr) => {
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
            pub(crate) fn $name(x: &[$S], y: &mut [MaybeUninit<$S>]) {
                let n = x.len().min(y.len());
                // SAFETY: the features are this function's.
                let coef = unsafe { table() };
                let mut i = 0;
                while i + 16 <= n {
                    // SAFETY: `i + 16 <= n` for both slices; the features are this
                    // function's.
                    unsafe {
                        let v = $ld(x.as_ptr().add(i));
                        $st(y.as_mut_ptr().add(i), lanes_gelu(&coef, v));
                    }
                    i += 16;
                }
                if i < n {
                    let mut t = [$zero; 16];
                    t[..n - i].copy_from_slice(&x[i..n]);
                    let mut o = [MaybeUninit::<$S>::uninit(); 16];
                    // SAFETY: `t` and `o` are 16 elements; the features are this
                    // function's.
                    unsafe { $st(o.as_mut_ptr(), lanes_gelu(&coef, $ld(t.as_ptr()))) };
                    y[i..n].copy_from_slice(&o[..n - i]);
                }
            }
        };
    }

    /// bfloat16 with AVX512-BF16: 32 elements at a time as even/odd vectors
    /// ([`lanes::ld_bf16_pairs`], no shuffle to widen), rounded by `vcvtne2ps2bf16`
    /// ([`lanes::st_bf16_pairs_ne`]). 1.2× the speed of 16 lanes widened and rounded
    /// with shuffles, which left this loop 0.75× the float32 one (the table's
    /// `vpermt2ps` already keeps the shuffle unit busy). A slice holding a result the
    /// instruction rounds differently (NaN, subnormal) is written again by
    /// [`gelu_bf16`], so the bits are [`narrow_bf16_16`](lanes::narrow_bf16_16)'s.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,avx512bf16")]
    pub(crate) fn gelu_bf16_ne(x: &[bf16], y: &mut [MaybeUninit<bf16>]) {
        let n = x.len().min(y.len());
        // SAFETY: the features are this function's.
        let coef = unsafe { table() };
        // SAFETY: 32 readable lanes at `p`, 32 writable at `q`; the features are this
        // function's.
        let step = |p: *const bf16, q: *mut MaybeUninit<bf16>| unsafe {
            let (e, o) = lanes::ld_bf16_pairs(p);
            lanes::st_bf16_pairs_ne(q, lanes_gelu(&coef, e), lanes_gelu(&coef, o))
        };
        let mut redo = 0;
        let mut i = 0;
        while i + 32 <= n {
            // `i + 32 <= n` for both slices.
            redo |= step(x[i..].as_ptr(), y[i..].as_mut_ptr());
            i += 32;
        }
        if i < n {
            let mut t = [bf16::ZERO; 32];
            t[..n - i].copy_from_slice(&x[i..n]);
            let mut o = [MaybeUninit::<bf16>::uninit(); 32];
            redo |= step(t.as_ptr(), o.as_mut_ptr());
            y[i..n].copy_from_slice(&o[..n - i]);
        }
        if redo != 0 {
            gelu_bf16(&x[..n], &mut y[..n]);
        }
    }

    /// [`super::gelu_grad_f32`] with `Φ` from the table.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    pub(crate) fn gelu_grad(g: &[f32], x: &[f32], y: &mut [MaybeUninit<f32>]) {
        // SAFETY: the features are this function's.
        let coef = unsafe { table() };
        super::gelu_grad_blocks(g, x, y, |x, c| {
            let n = x.len();
            let mut i = 0;
            while i + 16 <= n {
                // SAFETY: `i + 16 <= n` for `x` and `c` (as long); the features are this
                // function's.
                unsafe {
                    let r = lanes_cdf(&coef, _mm512_loadu_ps(x.as_ptr().add(i)));
                    _mm512_storeu_ps(c.as_mut_ptr().add(i).cast(), r);
                }
                i += 16;
            }
            if i < n {
                // The tail through the same lanes, padded.
                let mut t = [0f32; 16];
                t[..n - i].copy_from_slice(&x[i..n]);
                // SAFETY: `t` is 16 floats; the features are this function's.
                unsafe {
                    let r = lanes_cdf(&coef, _mm512_loadu_ps(t.as_ptr()));
                    _mm512_storeu_ps(t.as_mut_ptr(), r);
                }
                for (c, &t) in c[i..n].iter_mut().zip(&t) {
                    c.write(t);
                }
            }
        })
    }

    gelu_loop!(
        gelu_f32,
        f32,
        0.0f32,
        |p: *const f32| _mm512_loadu_ps(p),
        |p: *mut MaybeUninit<f32>, r| _mm512_storeu_ps(p.cast(), r)
    );
    gelu_loop!(
        gelu_bf16,
        bf16,
        bf16::ZERO,
        |p| transmute::<[f32; 16], __m512>(lanes::ld_bf16_16(p)),
        |p, r| lanes::st_bf16_16(p, transmute::<__m512, [f32; 16]>(r))
    );
    gelu_loop!(
        gelu_f16,
        f16,
        f16::ZERO,
        |p| transmute::<[f32; 16], __m512>(lanes::ld_f16_16(p)),
        |p, r| lanes::st_f16_16(p, transmute::<__m512, [f32; 16]>(r))
    );
}

/// The normal distribution's lower tail `Q(t) = Φ(-t)` on `[0, 6)` as 8 pieces of width
/// 3/4, a degree-7 polynomial in `t - centre` each (`TAIL[k][i]`: the `d^k` coefficient
/// of piece `i`), fitted by `amp-kernels/tools/fit_gelu.py`, which prints this table
/// and the GELU error it gives: at most 0.67 of the bound `gelu_close_to_f64` allows
/// (3 ulp, or an ulp of 1 scaled by `|x|` where `1 + erf` cancels).
#[rustfmt::skip]
const TAIL: [[f32; 8]; 8] = [
    [0.35383025, 0.13029452, 0.03039636, 0.0043324484, 0.00036907854, 1.853672e-05, 5.4403665e-07, 9.27494e-09],
    [-0.37185508, -0.21187665, -0.068786286, -0.012724178, -0.0013411191, -8.0540456e-05, -2.7559295e-06, -5.3730712e-08],
    [0.06972257, 0.11918059, 0.06448724, 0.016700465, 0.0022631232, 0.00016611838, 6.718789e-06, 1.5121836e-07],
    [0.053259883, -0.009379831, -0.02883965, -0.012492426, -0.0023224992, -0.00021498394, -1.0457747e-05, -2.74515e-07],
    [-0.016605016, -0.01722465, 0.0027669654, 0.0054155514, 0.0015829281, 0.00019389456, 1.1585933e-05, 3.5754073e-07],
    [-0.006734113, 0.005279608, 0.0032816553, -0.00096598367, -0.0007200249, -0.00012782247, -9.746101e-06, -3.6225836e-07],
    [0.0025440026, 0.0012991462, -0.0013522061, -0.00030956126, 0.00018856379, 6.330014e-05, 6.7898955e-06, 3.2645795e-07],
    [0.00061796466, -0.0008109231, -2.9547252e-06, 0.00021420322, -5.42162e-06, -2.1278069e-05, -3.4336954e-06, -2.1068038e-07],
];

/// Exact GELU `x·Φ(x)` over 8 lanes at a time from the [`TAIL`] table, for CPUs with
/// AVX2 and FMA: `Φ(x)` is `Q(|x|)` for `x < 0` and `1 - Q(|x|)` otherwise, so one
/// 8-entry table serves both signs and each coefficient is one `vpermps`. About 25
/// instructions per 8 lanes where [`gelu`] (whose `erf` evaluates both its halves and
/// an `exp`) takes about 70, which left PyTorch's AVX2 GELU 1.4× faster on an AMD EPYC.
/// `x ≤ -6` gives `x·0` (−0, or NaN for −∞), `x ≥ 6` gives `x`, NaN propagates.
#[cfg(target_arch = "x86_64")]
mod gelu256 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use super::TAIL;

    const HI: f32 = 6.0;
    const H: f32 = 0.75;

    /// The [`TAIL`] table, one register per coefficient.
    ///
    /// # Safety
    /// The caller runs with AVX.
    #[inline(always)]
    unsafe fn table() -> [__m256; 8] {
        // SAFETY: `TAIL[k]` is 8 floats; AVX is the caller's.
        std::array::from_fn(|k| unsafe { _mm256_loadu_ps(TAIL[k].as_ptr()) })
    }

    /// `Φ(v)` on 8 lanes: 0 from -6 down, 1 from 6 up; a NaN lane gives a number (the
    /// callers' products with `v` make it NaN).
    ///
    /// # Safety
    /// The caller runs with AVX2 and FMA.
    #[inline(always)]
    unsafe fn lanes_cdf(coef: &[__m256; 8], v: __m256) -> __m256 {
        // SAFETY: register-only intrinsics; the features are the caller's.
        unsafe {
            let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
            // A NaN `a` gives `HI` (the second operand wins), and is masked below.
            let t = _mm256_min_ps(a, _mm256_set1_ps(HI));
            // `t = 6` gives index 8, which `vpermps` reads as 0: masked below too.
            let idx = _mm256_cvttps_epi32(_mm256_mul_ps(t, _mm256_set1_ps(1.0 / H)));
            let centre = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(idx),
                _mm256_set1_ps(H),
                _mm256_set1_ps(H / 2.0),
            );
            let d = _mm256_sub_ps(t, centre);
            let c = |k: usize| _mm256_permutevar8x32_ps(coef[k], idx);
            let mut q = c(7);
            for k in (0..7).rev() {
                q = _mm256_fmadd_ps(q, d, c(k));
            }
            let q = _mm256_and_ps(q, _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(HI)));
            // The sign bit of `v` picks `Q` (negative) or `1 - Q`.
            _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0), q), q, v)
        }
    }

    /// `f` over `x` 8 lanes at a time into `y` (as long as `x`); the tail goes through
    /// the same lanes, padded, so a value's result does not depend on where it sits.
    ///
    /// # Safety
    /// The caller runs with AVX.
    #[inline(always)]
    unsafe fn map8(x: &[f32], y: &mut [MaybeUninit<f32>], f: impl Fn(__m256) -> __m256) {
        let n = x.len();
        assert_eq!(n, y.len(), "map8: length mismatch");
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` for both slices; AVX is the caller's.
            unsafe {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                _mm256_storeu_ps(y.as_mut_ptr().add(i).cast(), f(v));
            }
            i += 8;
        }
        if i < n {
            let mut t = [0f32; 8];
            t[..n - i].copy_from_slice(&x[i..n]);
            // SAFETY: `t` is 8 floats; AVX is the caller's.
            unsafe { _mm256_storeu_ps(t.as_mut_ptr(), f(_mm256_loadu_ps(t.as_ptr()))) };
            for (y, &t) in y[i..n].iter_mut().zip(&t) {
                y.write(t);
            }
        }
    }

    /// `y[i] = GELU(x[i])`, every element of `y` (as long as `x`) written.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn gelu_f32(x: &[f32], y: &mut [MaybeUninit<f32>]) {
        // SAFETY: the features are this function's.
        let coef = unsafe { table() };
        // SAFETY: as above (and for the register-only closure).
        unsafe { map8(x, y, |v| _mm256_mul_ps(v, lanes_cdf(&coef, v))) }
    }

    /// [`super::gelu_grad_f32`] with `Φ` from the table.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn gelu_grad(g: &[f32], x: &[f32], y: &mut [MaybeUninit<f32>]) {
        // SAFETY: the features are this function's.
        let coef = unsafe { table() };
        super::gelu_grad_blocks(g, x, y, |x, c| {
            // SAFETY: as above (and for the register-only closure).
            unsafe { map8(x, c, |v| lanes_cdf(&coef, v)) }
        })
    }
}

/// Whether the CPU runs [`gelu_table`] (AVX-512 F/BW/DQ/VL, FMA, F16C).
pub(crate) fn has_gelu_table() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f")
            && has!("avx512bw")
            && has!("avx512dq")
            && has!("avx512vl")
            && has!("fma")
            && has!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU also rounds to bfloat16 in one instruction (AVX512-BF16's
/// `vcvtneps2bf16`), beside [`has_gelu_table`]'s features.
pub(crate) fn has_bf16_ne() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_gelu_table() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Exact GELU straight from float32, bfloat16 or float16 storage into the same type
/// (widened and rounded in registers as [`crate::half16`] does) with the AVX-512
/// [`PHI`] table; `false` (nothing written) for other types or CPUs.
pub(crate) fn gelu_table<S: amp_tensor::Element>(x: &[S], y: &mut [MaybeUninit<S>]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::unary::ewise::{same, same_mut};
        use amp_tensor::half::{bf16, f16};
        if !has_gelu_table() {
            return false;
        }
        if let (Some(x), Some(y)) = (same::<S, f32>(x), same_mut::<_, MaybeUninit<f32>>(y)) {
            // SAFETY: the CPU has the loop's features (`has_gelu_table()` above).
            unsafe { gelu512::gelu_f32(x, y) };
            return true;
        }
        if let (Some(x), Some(y)) = (same::<S, bf16>(x), same_mut::<_, MaybeUninit<bf16>>(y)) {
            if has_bf16_ne() {
                // SAFETY: and AVX512-BF16 (checked just above).
                unsafe { gelu512::gelu_bf16_ne(x, y) };
                return true;
            }
            // SAFETY: the CPU has the loop's features (`has_gelu_table()` above).
            unsafe { gelu512::gelu_bf16(x, y) };
            return true;
        }
        if let (Some(x), Some(y)) = (same::<S, f16>(x), same_mut::<_, MaybeUninit<f16>>(y)) {
            // SAFETY: the CPU has the loop's features (`has_gelu_table()` above).
            unsafe { gelu512::gelu_f16(x, y) };
            return true;
        }
    }
    let _ = (x, y);
    false
}

/// The float32 maps [`map_f32`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum F32Map {
    Exp,
    Tanh,
    Sigmoid,
    Erf,
    Gelu,
    GeluTanh,
}

#[inline(always)]
fn map_body(op: F32Map, x: &[f32], y: &mut [MaybeUninit<f32>]) {
    // Each arm a loop of its own (the function items inline into it).
    #[inline(always)]
    fn each(x: &[f32], y: &mut [MaybeUninit<f32>], f: impl Fn(f32) -> f32) {
        for (o, &v) in y.iter_mut().zip(x) {
            o.write(f(v));
        }
    }
    match op {
        F32Map::Exp => each(x, y, exp_full),
        F32Map::Tanh => each(x, y, tanh),
        F32Map::Sigmoid => each(x, y, sigmoid),
        F32Map::Erf => each(x, y, erf),
        F32Map::Gelu => each(x, y, gelu),
        F32Map::GeluTanh => each(x, y, gelu_tanh),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
unsafe fn map_avx512(op: F32Map, x: &[f32], y: &mut [MaybeUninit<f32>]) {
    map_body(op, x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2(op: F32Map, x: &[f32], y: &mut [MaybeUninit<f32>]) {
    map_body(op, x, y)
}

/// The derivative factor of exact GELU times the incoming gradient,
/// `g · (Φ(x) + x·φ(x))`, as PyTorch's `gelu_backward` writes it, given `Φ(x)` (`cdf`;
/// `φ(x) = e^(-x²/2)/√(2π)` through [`exp_fma_le0`]).
#[inline(always)]
fn gelu_grad(g: f32, x: f32, cdf: f32) -> f32 {
    const PDF: f32 =
        (std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2 * 0.5) as f32;
    let pdf = exp_fma_le0(-0.5 * x * x) * PDF;
    g * (cdf + x * pdf)
}

/// [`gelu_grad`] over blocks of 64 elements: `cdf` writes `Φ` of a block's `x` (every
/// element), then a loop the compiler vectorises in the caller's features finishes it.
#[inline(always)]
fn gelu_grad_blocks(
    g: &[f32],
    x: &[f32],
    y: &mut [MaybeUninit<f32>],
    cdf: impl Fn(&[f32], &mut [MaybeUninit<f32>]),
) {
    let mut c = [MaybeUninit::<f32>::uninit(); 64];
    for ((g, x), y) in g.chunks(64).zip(x.chunks(64)).zip(y.chunks_mut(64)) {
        let c = &mut c[..x.len()];
        cdf(x, c);
        for (((o, &g), &x), c) in y.iter_mut().zip(g).zip(x).zip(c.iter()) {
            // SAFETY: `cdf` wrote every element of `c`.
            o.write(gelu_grad(g, x, unsafe { c.assume_init() }));
        }
    }
}

/// `y[i] = g[i] · GELU'(x[i])` at `level` (from [`level`]), vectorised; every element of
/// `y` (the length of `g` and `x`) written.
pub(crate) fn gelu_grad_f32(level: Level, g: &[f32], x: &[f32], y: &mut [MaybeUninit<f32>]) {
    assert!(
        g.len() == y.len() && x.len() == y.len(),
        "gelu_grad_f32: length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the CPU has the table's features (`has_gelu_table()`).
        Level::Avx512 if has_gelu_table() => unsafe { gelu512::gelu_grad(g, x, y) },
        // SAFETY: every level's CPU has AVX2 and FMA (`level()` checked them).
        _ => unsafe { gelu256::gelu_grad(g, x, y) },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        gelu_grad_blocks(g, x, y, |x, c| {
            for (c, &x) in c.iter_mut().zip(x) {
                c.write(0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)));
            }
        })
    }
}

/// The SIMD level [`map_f32`] runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Avx512,
    Avx2,
}

/// The widest level this CPU runs, or `None` without FMA (then the callers keep their
/// scalar code).
#[inline]
pub(crate) fn level() -> Option<Level> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512dq") && has!("avx512vl") && has!("avx2") && has!("fma") {
            return Some(Level::Avx512);
        }
        if has!("avx2") && has!("fma") {
            return Some(Level::Avx2);
        }
    }
    None
}

/// `y[i] = op(x[i])` at `level` (from [`level`]), into a possibly uninitialised `y`
/// of the same length as `x`; returns `y`, every element written.
#[inline]
pub(crate) fn map_f32<'y>(
    level: Level,
    op: F32Map,
    x: &[f32],
    y: &'y mut [MaybeUninit<f32>],
) -> &'y mut [f32] {
    assert_eq!(x.len(), y.len(), "map_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: `level` came from `level()`, which checked the CPU has AVX-512F/DQ/VL
        // and FMA.
        Level::Avx512 if op == F32Map::Gelu && gelu_table(x, y) => {}
        // SAFETY: every level's CPU has AVX2 and FMA (`level()` checked them).
        _ if op == F32Map::Gelu => unsafe { gelu256::gelu_f32(x, y) },
        // SAFETY: as above.
        Level::Avx512 => unsafe { map_avx512(op, x, y) },
        // SAFETY: `level` came from `level()`, which checked the CPU has AVX2 and FMA.
        Level::Avx2 => unsafe { map_avx2(op, x, y) },
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        map_body(op, x, y)
    }
    // SAFETY: `map_body` wrote every element of `y` (same length as `x`, checked above).
    unsafe { &mut *(y as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in ulps of `got` from the f64 value `want` (the ulp of `want` rounded
    /// to f32).
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        if got == w {
            return 0.0;
        }
        let a = w.abs();
        let ulp = if a == 0.0 || a < f32::MIN_POSITIVE {
            f32::from_bits(1) as f64
        } else {
            (f32::from_bits(a.to_bits() + 1) - a) as f64
        };
        (got as f64 - want).abs() / ulp
    }

    /// Test points: a dense sweep of every `step`-th f32 bit pattern, both signs.
    fn sweep(step: u32) -> impl Iterator<Item = f32> {
        (0..0x7f80_0000u32)
            .step_by(step as usize)
            .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
    }

    /// Run `f` through the SIMD map when this CPU has one, else the scalar function.
    fn through_map(op: F32Map, xs: &[f32]) -> Vec<f32> {
        written(xs.len(), |y| match level() {
            Some(l) => {
                map_f32(l, op, xs, y);
            }
            None => map_body(op, xs, y),
        })
    }

    #[test]
    fn exp_fma_close_to_f64() {
        // Called directly: where the CPU lacks FMA, `mul_add` is libm's (exact) fma.
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            worst = worst.max(ulps(exp_fma_checked(x), (x as f64).exp()));
            x += 0.001_37;
        }
        assert!(worst <= 2.0, "exp: {worst} ulp");
        assert_eq!(exp_fma_checked(0.0), 1.0);
        assert_eq!(exp_fma_checked(100.0), f32::INFINITY);
        assert_eq!(exp_fma_checked(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_fma_checked(-100.0), 0.0);
        assert!(exp_fma_checked(f32::NAN).is_nan());
    }

    #[test]
    fn exp_fma_le0_is_exp_fma_checked_at_or_below_zero() {
        let specials = [0.0, -0.0, EXP_LO, -87.336_56, -1e-40, -1e30, f32::MIN];
        let nans = [f32::NAN, -f32::NAN, f32::from_bits(0x7FA0_0001)];
        let sweep = (0..400_000).map(|i| -110.0 + i as f32 * 0.000_275);
        let xs = sweep.chain(specials).chain(nans).chain([f32::NEG_INFINITY]);
        for x in xs.filter(|x| x.is_nan() || *x <= 0.0) {
            let (got, want) = (exp_fma_le0(x), exp_fma_checked(x));
            assert_eq!(got.to_bits(), want.to_bits(), "exp({x})");
        }
    }

    #[test]
    fn erf_within_one_ulp() {
        if level().is_none() {
            return; // the polynomial needs FMA; the kernels use libm there
        }
        let xs: Vec<f32> = sweep(97)
            .chain((0..200_000).map(|k| k as f32 * 2.5e-5))
            .collect();
        let ys = through_map(F32Map::Erf, &xs);
        let mut worst = (0.0, 0.0f32);
        for (&x, &y) in xs.iter().zip(&ys) {
            let e = ulps(y, libm::erf(x as f64));
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 1.0, "erf: {} ulp at {:e}", worst.0, worst.1);
        let special = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-45,
            -1e-45,
        ];
        let ys = through_map(F32Map::Erf, &special);
        assert_eq!(ys[0].to_bits(), 0.0f32.to_bits());
        assert_eq!(ys[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(ys[2], 1.0);
        assert_eq!(ys[3], -1.0);
        assert!(ys[4].is_nan());
        assert_eq!(ys[5], 1e-45); // 2/√π · 2^-149 rounds back to the smallest subnormal
        assert_eq!(ys[6], -1e-45);
        let tiny = f32::from_bits(0x0040_0000); // a larger subnormal
        let y = through_map(F32Map::Erf, &[tiny])[0];
        assert!(ulps(y, libm::erf(tiny as f64)) <= 1.0);
    }

    /// The worst distance in ulps of `op` through the map from `want` over `xs`, and
    /// the `x` it was met at.
    fn worst_ulps(op: F32Map, xs: &[f32], want: impl Fn(f64) -> f64) -> (f64, f32) {
        let ys = through_map(op, xs);
        xs.iter()
            .zip(&ys)
            .map(|(&x, &y)| (ulps(y, want(x as f64)), x))
            .fold((0.0, 0.0), |w, e| if e.0 > w.0 { e } else { w })
    }

    #[test]
    fn exp_tanh_sigmoid_close_to_f64() {
        if level().is_none() {
            return;
        }
        let xs: Vec<f32> = sweep(1009)
            .chain((0..=200_000).map(|k| -105.0 + k as f32 * 1.0e-3))
            .collect();
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        for (op, want, bound) in [
            // Measured on an AVX2 EPYC: 0.997, 1.20 and 2.01 ulps.
            (F32Map::Exp, f64::exp as fn(f64) -> f64, 1.5),
            (F32Map::Tanh, f64::tanh, 2.0),
            (F32Map::Sigmoid, sig, 3.0),
        ] {
            let (w, at) = worst_ulps(op, &xs, want);
            assert!(w <= bound, "{op:?}: {w} ulps at {at:e}");
        }
        // Specials and the ends of the range.
        let s = [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            88.8,
            -103.0,
            -104.0,
            0.0,
            -0.0,
        ];
        let e = through_map(F32Map::Exp, &s);
        assert_eq!(e[..2], [f32::INFINITY, 0.0]);
        assert!(e[2].is_nan());
        assert_eq!(e[3], f32::INFINITY);
        assert_eq!(e[4], (-103f64).exp() as f32); // a subnormal, rounded once
        assert_eq!(e[5], 0.0);
        assert_eq!(e[6..], [1.0, 1.0]);
        let t = through_map(F32Map::Tanh, &s);
        assert_eq!(t[..2], [1.0, -1.0]);
        assert!(t[2].is_nan());
        assert!(t[7] == 0.0 && t[7].is_sign_negative());
        let g = through_map(F32Map::Sigmoid, &s);
        assert_eq!(g[..2], [1.0, 0.0]);
        assert!(g[2].is_nan());
        assert_eq!(g[4], sig(-103.0) as f32);
        assert_eq!(g[6..], [0.5, 0.5]);
    }

    /// The GELU tests' points: the whole range, densely where the tables' pieces lie
    /// (an odd count, so the lanes' tails run too), each end of the AVX2 table's pieces
    /// and its neighbours (the piece index is rounded from `|x| · 4/3`), then
    /// `specials`.
    fn gelu_points(specials: &[f32]) -> Vec<f32> {
        let ends = (1..=8).flat_map(|k| {
            let e = k as f32 * 0.75;
            let (below, above) = (
                f32::from_bits(e.to_bits() - 1),
                f32::from_bits(e.to_bits() + 1),
            );
            [below, e, above, -below, -e, -above]
        });
        sweep(1009)
            .filter(|x| x.abs() < 1e30)
            .chain((0..=140_001).map(|k| -7.0 + k as f32 * 1.0e-4))
            .chain(ends)
            .chain(specials.iter().copied())
            .collect()
    }

    /// Runs a kernel that writes every element of its `n`-element output; returns it.
    fn written(n: usize, f: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
        let mut y = vec![MaybeUninit::uninit(); n];
        f(&mut y);
        // SAFETY: `f` wrote every element.
        y.into_iter().map(|v| unsafe { v.assume_init() }).collect()
    }

    /// The AVX2 table's GELU of `xs` (`g` `None`), or its gradient times `g`, where the
    /// CPU has AVX2 and FMA (which an AVX-512 CPU's map does not take); else `None`, and
    /// the test says it skipped it.
    fn avx2_table(xs: &[f32], g: Option<&[f32]>) -> Option<Vec<f32>> {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return Some(written(xs.len(), |y| unsafe {
                match g {
                    None => gelu256::gelu_f32(xs, y),
                    Some(g) => gelu256::gelu_grad(g, xs, y),
                }
            }));
        }
        let _ = (xs, g);
        eprintln!("skipped: the AVX2 GELU table (the CPU lacks AVX2 or FMA)");
        None
    }

    #[test]
    fn gelu_close_to_f64() {
        if level().is_none() {
            return;
        }
        let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 6.0, -6.0];
        let xs = gelu_points(&specials);
        let exact = |x: f64| x * 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
        let mut forms = vec![("map", through_map(F32Map::Gelu, &xs))];
        forms.extend(avx2_table(&xs, None).map(|ys| ("AVX2 table", ys)));
        let finite = xs.len() - specials.len();
        for (form, ys) in forms {
            for (&x, &y) in xs[..finite].iter().zip(&ys) {
                let want = exact(x as f64);
                // For x < 0, 1 + erf cancels (in every float32 evaluation, libm's too):
                // an absolute error of about an ulp of 1 in that sum, scaled by x/2.
                let tol = f32::EPSILON as f64 * (x as f64).abs();
                let ok = ulps(y, want) <= 3.0 || (y as f64 - want).abs() <= tol;
                assert!(ok, "{form}: gelu({x:e}) = {y:e}, want {want:e}");
            }
            let s = &ys[finite..];
            assert_eq!(s[0], f32::INFINITY, "{form}");
            assert!(s[1].is_nan(), "{form}"); // -inf * 0, as the scalar formula (and PyTorch) give
            assert!(s[2].is_nan(), "{form}");
            assert_eq!(s[3], 6.0, "{form}");
            assert!(s[4] == 0.0 && s[4].is_sign_negative(), "{form}: {}", s[4]);
        }
    }

    #[test]
    fn gelu_grad_close_to_f64() {
        let Some(level) = level() else {
            return;
        };
        let xs = gelu_points(&[]);
        let exact = |x: f64| {
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)) + x * pdf
        };
        for g in [1.0f32, -3.0] {
            let gs = vec![g; xs.len()];
            let mut forms = vec![(
                "map",
                written(xs.len(), |y| gelu_grad_f32(level, &gs, &xs, y)),
            )];
            forms.extend(avx2_table(&xs, Some(&gs)).map(|ys| ("AVX2 table", ys)));
            for (form, ys) in forms {
                for (&x, &y) in xs.iter().zip(&ys) {
                    let want = g as f64 * exact(x as f64);
                    // Φ(x) + x·φ(x) cancels for x < 0: an error of a few ulp of the
                    // larger term, |g|·max(Φ(x), |x|·φ(x)) <= |g|.
                    let err = (y as f64 - want).abs() / (g.abs() as f64 * f32::EPSILON as f64);
                    assert!(
                        ulps(y, want) <= 4.0 || err <= 2.0,
                        "{form}: gelu_backward({g}, {x:e}) = {y:e}, want {want:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn gelu_of_16_bit_storage_is_the_rounded_float32_gelu() {
        use amp_tensor::half::{bf16, f16};
        if !has_gelu_table() {
            eprintln!("skipped: the AVX-512 GELU table (the CPU lacks AVX-512 F/BW/DQ/VL)");
            return;
        }
        // The rounding of the buffer casts (bfloat16 NaN → 0x7FC0).
        fn check<S: amp_tensor::Element>(
            all: Vec<S>,
            round: impl Fn(f32) -> S,
            bits: impl Fn(S) -> u16,
        ) {
            let wide: Vec<f32> = all.iter().map(|v| v.to_f32()).collect();
            let mut w = vec![MaybeUninit::uninit(); all.len()];
            let mut y = vec![MaybeUninit::uninit(); all.len()];
            assert!(gelu_table(&wide, &mut w) && gelu_table(&all, &mut y));
            for (k, (w, y)) in w.iter().zip(&y).enumerate() {
                // SAFETY: `gelu_table` wrote every element.
                let (w, y) = unsafe { (w.assume_init(), y.assume_init()) };
                assert_eq!(bits(y), bits(round(w)), "pattern {k}");
            }
        }
        // Every pattern (65,531: not a multiple of 16, so the tails run too).
        let patterns = 0..u16::MAX - 4;
        check(
            patterns.clone().map(bf16::from_bits).collect(),
            amp_tensor::round_to_bf16,
            bf16::to_bits,
        );
        check(
            patterns.map(f16::from_bits).collect(),
            f16::from_f32,
            f16::to_bits,
        );
    }

    #[test]
    fn gelu_tanh_close_to_f64() {
        if level().is_none() {
            return;
        }
        let xs: Vec<f32> = sweep(1009).filter(|x| x.abs() < 1e12).collect();
        let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
        let exact = |x: f64| 0.5 * x * (1.0 + (beta * (x + 0.044715 * x * x * x)).tanh());
        let ys = through_map(F32Map::GeluTanh, &xs);
        for (&x, &y) in xs.iter().zip(&ys) {
            let want = exact(x as f64);
            // 1 + tanh cancels for x < 0 (as in every float32 evaluation): an absolute
            // error of a few ulp of 1 in that sum, scaled by x/2.
            let tol = 4.0 * f32::EPSILON as f64 * (x as f64).abs() + 1e-44;
            let ok = ulps(y, want) <= 4.0 || (y as f64 - want).abs() <= tol;
            assert!(ok, "gelu_tanh({x:e}) = {y:e}, want {want:e}");
        }
        let t = through_map(
            F32Map::GeluTanh,
            &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN],
        );
        assert_eq!(t[0], f32::INFINITY);
        assert!(t[1].is_nan() || t[1] == 0.0);
        assert!(t[2].is_nan());
    }
}
