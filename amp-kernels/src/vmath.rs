//! Vectorisable float32 math for the elementwise kernels: `exp`, `erf`, exact GELU
//! and the tanh-approximated GELU, as branch-free scalar functions the compiler turns
//! into SIMD code when they are called in a loop compiled for AVX-512 or AVX2 + FMA
//! (see [`map_f32`], which picks the widest the CPU has at run time).
//!
//! The polynomials rely on fused multiply-adds for their accuracy, so they are only
//! used where the CPU has FMA; elsewhere [`map_f32`] reports that it cannot help and the
//! callers keep their scalar (libm) code.

use std::mem::MaybeUninit;

/// `exp(x)`, vectorisable: Cephes' `expf` polynomial (about 1 ulp) with the power of
/// two built from the exponent bits. Below `ln(2^-126)` the result is 0 (so `exp(-inf)`
/// is exactly 0, as masked softmax needs); above `127.5 * ln 2` (≈ 88.38) it is +inf;
/// NaN propagates.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LO: f32 = -87.336_55;
    const HI: f32 = 88.376_26;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(LO, HI); // NaN stays NaN
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * (r * r) + r + 1.0;
    // The low mantissa bits of `t` hold n; (n + 127) << 23 is 2^n.
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        y * pow2
    }
}

/// `exp(x)` for finite `x` in `[-87, 88]` (no range checks), with fused multiply-adds:
/// Cephes' `expf` polynomial, about 1 ulp. Only for callers compiled with FMA.
#[inline(always)]
fn exp_fma(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let t = x.mul_add(std::f32::consts::LOG2_E, MAGIC);
    let n = t - MAGIC;
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = p.mul_add(r * r, r) + 1.0;
    // The low mantissa bits of `t` hold n; (n + 127) << 23 is 2^n.
    y * f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23)
}

/// [`exp`] with fused multiply-adds (the same range handling: 0 below `ln(2^-126)`,
/// +inf above `127.5 * ln 2`, NaN propagates). Only for callers compiled with FMA.
#[inline(always)]
pub(crate) fn exp_fma_checked(x: f32) -> f32 {
    const LO: f32 = -87.336_55;
    const HI: f32 = 88.376_26;
    let y = exp_fma(x.clamp(LO, HI)); // NaN stays NaN
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        y
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
    let mut p = -5.967_617e-4f32;
    p = p.mul_add(s, 4.991_194_2e-3);
    p = p.mul_add(s, -2.676_813_5e-2);
    p = p.mul_add(s, 1.128_199_3e-1);
    p = p.mul_add(s, -3.761_253_4e-1);
    p = p.mul_add(s, 1.283_791_7e-1);
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
    let mut p = -5.704_988_7e-3f32;
    p = p.mul_add(s, 2.063_909e-2);
    p = p.mul_add(s, -5.373_971_6e-2);
    p = p.mul_add(s, 1.333_144_2e-1);
    p = p.mul_add(s, -3.333_328e-1);
    let small = (p * s).mul_add(u, u);
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

/// The float32 maps [`map_f32`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum F32Map {
    Erf,
    Gelu,
    GeluTanh,
}

#[inline(always)]
fn map_body(op: F32Map, x: &[f32], y: &mut [MaybeUninit<f32>]) {
    let y = y.iter_mut().zip(x);
    match op {
        F32Map::Erf => y.for_each(|(o, &v)| {
            o.write(erf(v));
        }),
        F32Map::Gelu => y.for_each(|(o, &v)| {
            o.write(gelu(v));
        }),
        F32Map::GeluTanh => y.for_each(|(o, &v)| {
            o.write(gelu_tanh(v));
        }),
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
        if has!("avx512f") && has!("avx512dq") && has!("avx512vl") && has!("fma") {
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
        let mut y = vec![MaybeUninit::uninit(); xs.len()];
        match level() {
            Some(l) => map_f32(l, op, xs, &mut y).to_vec(),
            None => {
                map_body(op, xs, &mut y);
                // SAFETY: `map_body` wrote every element.
                y.into_iter().map(|v| unsafe { v.assume_init() }).collect()
            }
        }
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

    #[test]
    fn gelu_close_to_f64() {
        if level().is_none() {
            return;
        }
        let xs: Vec<f32> = sweep(1009).filter(|x| x.abs() < 1e30).collect();
        let exact = |x: f64| x * 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
        let ys = through_map(F32Map::Gelu, &xs);
        for (&x, &y) in xs.iter().zip(&ys) {
            let want = exact(x as f64);
            // For x < 0, 1 + erf cancels (in every float32 evaluation, libm's too): an
            // absolute error of about an ulp of 1 in that sum, scaled by x/2.
            let tol = f32::EPSILON as f64 * (x as f64).abs();
            let ok = ulps(y, want) <= 3.0 || (y as f64 - want).abs() <= tol;
            assert!(ok, "gelu({x:e}) = {y:e}, want {want:e}");
        }
        let s = through_map(F32Map::Gelu, &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(s[0], f32::INFINITY);
        assert!(s[1].is_nan()); // -inf * 0, as the scalar formula (and PyTorch) give
        assert!(s[2].is_nan());
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
