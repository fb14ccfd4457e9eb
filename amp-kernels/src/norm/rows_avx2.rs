//! Layer norm rows on AVX2 with explicit 8-lane vectors: bfloat16 / float16 straight
//! from the 16-bit storage, and float32.
//!
//! 16-bit rows: each pass loads 8 elements and widens them in a register, and the
//! output is rounded in registers and stored, where the portable path widened every
//! row into a float32 buffer, wrote the normalised row into a second one and narrowed
//! that (on a Zen 3 EPYC, bfloat16 layer norm of `[512, 512]` took 1.6× the float32
//! time, 30% of it in the two casts).
//!
//! float32 rows: the portable `norm_block` compiled for AVX2 kept the 64 lanes of its
//! mean's sum on the stack (a store and a reload per 8 lanes, every step waiting on
//! the last) and, before its row writer was a function, wrote the rows 4 lanes wide;
//! here every sum stays in registers. On a Zen 3 EPYC (AVX2 only), float32 layer norm
//! of `[n, n]` with a weight and a bias, GB/s before both changes → the row writer a
//! function → here (medians, three alternations in one session): n = 256 16.5 / 17.6 /
//! 24.0, 512 23.5 / 24.8 / 34.5, 1024 25.1 / 27.8 / 38.1 (PyTorch's time over ours at
//! 1024 was 0.75 in the sweep before).
//!
//! The bits are the portable path's: the same float32 operations in the same order,
//! none fused. The sums keep `wide_sum`'s lanes (element `i` in lane `i mod 64` for
//! rows of at least 256, else `i mod 16`, in order; the lanes then folded by
//! [`lane_sum`]), and the rounding is the buffer cast's (bfloat16 nearest even with
//! NaN as `0x7FC0`, float16 by `vcvtps2ph`, as `half::f16::from_f32`).

use std::arch::x86_64::*;

use crate::half16::Io;
use crate::reduce::lane_sum;

/// `sum(g(x))` over a row in `8·A` lanes (element `i` in lane `i mod 8A`, in order),
/// folded by [`lane_sum`]: `vg` is `g` on 8 lanes, `sg` on one value, the same
/// operations.
///
/// # Safety
/// The CPU has AVX2 and F16C (the caller is compiled with them).
#[inline(always)]
unsafe fn lanes<S: Io, const A: usize>(
    x: &[S],
    vg: impl Fn(__m256) -> __m256,
    sg: impl Fn(f32) -> f32,
) -> f32 {
    // SAFETY: every chunk holds `8·A` elements; the lanes are stored into `flat`,
    // which holds 64 ≥ 8·A.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); A];
        let mut chunks = x.chunks_exact(8 * A);
        for c in &mut chunks {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, vg(S::load8(c.as_ptr().add(8 * j))));
            }
        }
        let mut flat = [0f32; 64];
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(flat.as_mut_ptr().add(8 * j), *a);
        }
        for (a, &v) in flat.iter_mut().zip(chunks.remainder()) {
            *a += sg(v.widen());
        }
        lane_sum(&flat[..8 * A])
    }
}

/// `sum(g(x))` over a row in `wide_sum`'s lanes: 64 for rows of at least 256
/// elements, else 16.
///
/// # Safety
/// As [`lanes`].
#[inline(always)]
unsafe fn wide_sum<S: Io>(x: &[S], vg: impl Fn(__m256) -> __m256, sg: impl Fn(f32) -> f32) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        if x.len() < 256 {
            lanes::<S, 2>(x, vg, sg)
        } else {
            lanes::<S, 8>(x, vg, sg)
        }
    }
}

/// Layer norm of the rows of `n` elements of `s` (as many as `out` holds), `w` and `b`
/// applied per element: `out` rounded to `S`, the float32 mean and rstd of each row
/// into `mean` and `rstd`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<S: Io>(
    s: &[S],
    n: usize,
    eps: f32,
    (w, b): (Option<&[f32]>, Option<&[f32]>),
    out: &mut [S],
    (mean, rstd): (&mut [f32], &mut [f32]),
) {
    assert!(n > 0 && s.len() >= out.len() && out.len() == n * mean.len());
    assert!(rstd.len() == mean.len());
    assert!(w.is_none_or(|w| w.len() == n) && b.is_none_or(|b| b.len() == n));
    let nf = n as f32;
    for (r, (orow, (m, rs_out))) in out
        .chunks_exact_mut(n)
        .zip(mean.iter_mut().zip(rstd.iter_mut()))
        .enumerate()
    {
        let x = &s[r * n..(r + 1) * n];
        // SAFETY: register arithmetic and loads of `x` (the CPU's features: the
        // caller's contract).
        let mu = unsafe { wide_sum(x, |v| v, |v| v) } / nf;
        // SAFETY: as above.
        let var = unsafe {
            let vmu = _mm256_set1_ps(mu);
            wide_sum(
                x,
                |v| {
                    let d = _mm256_sub_ps(v, vmu);
                    _mm256_mul_ps(d, d)
                },
                |v| (v - mu) * (v - mu),
            )
        } / nf;
        let rs = 1.0 / (var + eps).sqrt();
        (*m, *rs_out) = (mu, rs);
        // SAFETY: the CPU's features (the caller's contract).
        unsafe {
            match (w, b) {
                (Some(w), Some(b)) => write::<S, true, true>(x, orow, w, b, mu, rs),
                (Some(w), None) => write::<S, true, false>(x, orow, w, &[], mu, rs),
                (None, Some(b)) => write::<S, false, true>(x, orow, &[], b, mu, rs),
                (None, None) => write::<S, false, false>(x, orow, &[], &[], mu, rs),
            }
        }
    }
}

/// One normalised row: `y = (x - mu)·rs`, then `·w` when `W`, `+ b` when `B` (each a
/// separate rounding, as the portable path), rounded into `out`; 16 elements per step.
///
/// # Safety
/// The CPU has AVX2 and F16C (the caller is compiled with them).
#[inline(always)]
unsafe fn write<S: Io, const W: bool, const B: bool>(
    x: &[S],
    out: &mut [S],
    w: &[f32],
    b: &[f32],
    mu: f32,
    rs: f32,
) {
    let n = x.len();
    assert!(out.len() == n && (!W || w.len() == n) && (!B || b.len() == n));
    let y8 = |i: usize| {
        // SAFETY: elements `i..i + 8 ≤ n` of the row, of `w` and of `b` (asserted; the
        // callers below keep `i + 8 ≤ n`); register arithmetic.
        unsafe {
            let v = S::load8(x.as_ptr().add(i));
            let mut y = _mm256_mul_ps(_mm256_sub_ps(v, _mm256_set1_ps(mu)), _mm256_set1_ps(rs));
            if W {
                y = _mm256_mul_ps(y, _mm256_loadu_ps(w.as_ptr().add(i)));
            }
            if B {
                y = _mm256_add_ps(y, _mm256_loadu_ps(b.as_ptr().add(i)));
            }
            y
        }
    };
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: elements `i..i + 16 ≤ n` of the output row.
        unsafe { S::store16(out.as_mut_ptr().add(i), y8(i), y8(i + 8)) };
        i += 16;
    }
    if i + 8 <= n {
        // SAFETY: elements `i..i + 8 ≤ n` of the output row.
        unsafe { S::store8(out.as_mut_ptr().add(i), y8(i)) };
        i += 8;
    }
    for i in i..n {
        let mut y = (x[i].widen() - mu) * rs;
        if W {
            y *= w[i];
        }
        if B {
            y += b[i];
        }
        out[i] = S::narrow(y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amp_tensor::half::{bf16, f16};

    /// Rows with every kind of value: random ones over many magnitudes, and (in some
    /// rows) NaN, infinities, subnormals and exact zeros.
    fn row_values<S: Io>(rows: usize, n: usize, narrow: fn(f32) -> S) -> Vec<S> {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e-41,
            -0.0,
            0.0,
            6e4,
        ];
        (0..rows * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                let x = ((i * 7919 % 1013) as f32 - 506.0) * 0.01 * (1.0 + (i % 11) as f32);
                match r % 4 {
                    3 if c % 37 == 5 => narrow(specials[(i / 37) % specials.len()]),
                    2 => narrow(x * 1e-3 + 1e3),
                    _ => narrow(x),
                }
            })
            .collect()
    }

    /// The AVX2 rows give the portable `norm_block`'s bits: outputs, means and rstds,
    /// for rows shorter and longer than the 64-lane sums, with and without a weight
    /// and a bias, in both 16-bit types and float32.
    fn check<S: Io + amp_tensor::Element>(narrow: fn(f32) -> S) {
        for n in [1usize, 7, 8, 9, 16, 63, 100, 255, 256, 257, 300, 1000, 1031] {
            let rows = 5;
            let s = row_values(rows, n, narrow);
            let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 13) as f32 * 0.125).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
            for wb in [
                (None, None),
                (Some(&w[..]), None),
                (None, Some(&b[..])),
                (Some(&w[..]), Some(&b[..])),
            ] {
                let input = super::super::NormInput {
                    s: &s,
                    n,
                    eps: 1e-5f32,
                    wb,
                    affine: None,
                };
                let zero = narrow(0.0);
                let (mut want, mut wm, mut wr) =
                    (vec![zero; rows * n], vec![0f32; rows], vec![0f32; rows]);
                super::super::norm_block(&input, 0, &mut want, &mut wm, &mut wr);
                let (mut got, mut gm, mut gr) =
                    (vec![zero; rows * n], vec![1f32; rows], vec![1f32; rows]);
                // SAFETY: the CPU has AVX2, FMA and F16C (checked by the caller).
                unsafe { super::rows::<S>(&s, n, 1e-5, wb, &mut got, (&mut gm, &mut gr)) };
                let what = format!(
                    "{} n={n} w={} b={}",
                    S::DTYPE,
                    wb.0.is_some(),
                    wb.1.is_some()
                );
                // The same bits, any NaN for a NaN: which operand's NaN an addition
                // returns is the compiler's choice (LLVM may swap them), so a NaN's sign
                // and payload are not part of any result's contract.
                let same = |what: &str, g: &[f32], w: &[f32]| {
                    for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
                        let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                        assert!(
                            ok,
                            "{what} {i}: {:#010x}, expected {:#010x}",
                            g.to_bits(),
                            w.to_bits()
                        );
                    }
                };
                same(&format!("{what}: mean"), &gm, &wm);
                same(&format!("{what}: rstd"), &gr, &wr);
                let wide = |v: &[S]| v.iter().map(|x| x.widen()).collect::<Vec<_>>();
                same(&format!("{what}: output"), &wide(&got), &wide(&want));
            }
        }
    }

    #[test]
    fn avx2_rows_give_the_portable_bits() {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma") && has!("f16c")) {
            amp_testing::report_skip(
                "avx2_rows_give_the_portable_bits",
                "AVX2 layer norm rows",
                "this CPU lacks AVX2, FMA or F16C",
            );
            return;
        }
        check::<bf16>(amp_tensor::round_to_bf16);
        check::<f16>(f16::from_f32);
        check::<f32>(|v| v);
    }
}
