//! Winograd F(2×2, 3×3) for the forward of 16-bit (float16 / bfloat16) 2-d 3×3
//! convolutions with stride 1 and dilation 1, computed in float32.
//!
//! Each 2×2 output tile is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d Bᵀᵀ)] A` for its 4×4 input tile `d`
//! and the 3×3 kernel `g`: summed over input channels, the element-wise products
//! become 16 matrix products `M_ξ = U_ξ @ V_ξ` (`U_ξ`: out × in channels, `V_ξ`: in
//! channels × tiles) with 2.25× fewer multiplications than the direct product. The
//! transforms only add, subtract and halve, so the float32 result differs from the
//! direct one by a few float32 rounding steps, far below one float16 / bfloat16 ulp
//! (the inputs are 16-bit values and the output is rounded to 16 bits once). float32
//! and float64 convolutions keep the direct product (as PyTorch's CPU kernels do);
//! GPU libraries pick Winograd for half-precision convolutions in the same way.
//!
//! Work per sample and group: tiles are taken a few tile rows at a time so that the
//! transformed inputs `V` and the products `M` (16 × channels × tiles each) stay in
//! cache; every transform runs along contiguous rows of tiles (vectorised), input rows
//! are widened as they are read.

use amp_tensor::Element;
use gemm::Parallelism;

use super::{copy_into, gemm_into, Geo, Mat};

/// Transformed tiles per chunk (times `channels × 16 × 4` bytes for `V` and for `M`).
const CHUNK_TILES: usize = 128;

/// Whether the forward of `g` goes through Winograd (for 16-bit inputs): a 2-d 3×3
/// kernel, stride and dilation 1, and enough channels and positions for the transforms
/// to pay.
pub(super) fn applies(g: &Geo) -> bool {
    g.k == [1, 3, 3]
        && g.is[0] == 1
        && g.os[0] == 1
        && g.s == [1, 1, 1]
        && g.d[1] == 1
        && g.d[2] == 1
        && g.c >= 16
        && g.o >= 16
        && g.ol() >= 64
}

/// The tile grid of `g`'s output and its chunking.
pub(super) struct Plan {
    /// Tile rows.
    th: usize,
    /// Tiles per row, padded to whole blocks of [`L`] lanes (the padding tiles are
    /// computed and dropped).
    tp: usize,
    /// Tile rows per chunk.
    rows: usize,
}

impl Plan {
    pub(super) fn new(g: &Geo) -> Plan {
        let th = g.os[1].div_ceil(2);
        let tp = g.os[2].div_ceil(2).next_multiple_of(L);
        Plan {
            th,
            tp,
            rows: (CHUNK_TILES / tp).clamp(1, th),
        }
    }

    /// Even (or odd) input columns of a row: one more block than the tiles.
    fn half(&self) -> usize {
        self.tp + L
    }

    /// Input columns read per row.
    fn wp(&self) -> usize {
        2 * self.half()
    }

    /// Input rows a chunk reads.
    fn need(&self) -> usize {
        2 * self.rows + 2
    }

    /// Scratch (in f32 elements) one worker needs.
    pub(super) fn scratch_len(&self, g: &Geo) -> usize {
        let tc = self.rows * self.tp;
        16 * (g.c + g.o) * tc
            + self.need() * self.wp()
            + g.c * self.need() * 2 * self.half()
            + 4 * self.tp
    }
}

/// `U` for every group: `u[gi][ξ][o][c]`, from the float32 weight `[G·O, C, 1, 3, 3]`.
pub(super) fn weights(w: &[f32], g: &Geo) -> Vec<f32> {
    let (o, c) = (g.o, g.c);
    let mut u = vec![0.0f32; g.groups * 16 * o * c];
    for (gi, ug) in u.chunks_mut(16 * o * c).enumerate() {
        for oi in 0..o {
            for ci in 0..c {
                let k = &w[((gi * o + oi) * c + ci) * 9..][..9];
                // G k: 4×3, then (G k) Gᵀ: 4×4.
                let mut t = [[0.0f32; 3]; 4];
                for j in 0..3 {
                    let (a, b, e) = (k[j], k[3 + j], k[6 + j]);
                    t[0][j] = a;
                    t[1][j] = 0.5 * (a + b + e);
                    t[2][j] = 0.5 * (a - b + e);
                    t[3][j] = e;
                }
                for (i, ti) in t.iter().enumerate() {
                    let (a, b, e) = (ti[0], ti[1], ti[2]);
                    let row = [a, 0.5 * (a + b + e), 0.5 * (a - b + e), e];
                    for (j, &v) in row.iter().enumerate() {
                        ug[(i * 4 + j) * o * c + oi * c + ci] = v;
                    }
                }
            }
        }
    }
    u
}

/// One sample's work: its output `y` (`G·O × ol`, float32; the bias already in it
/// when `bias`) from its input planes `x` (`G·C × il`, in `T`), with the transformed
/// weights `u`, in `scratch` ([`Plan::scratch_len`] elements).
pub(super) struct Sample<'a, T> {
    pub(super) x: &'a [T],
    pub(super) u: &'a [f32],
    pub(super) y: &'a mut [f32],
    pub(super) bias: bool,
    pub(super) scratch: &'a mut [f32],
    pub(super) par: Parallelism,
}

/// Runs one [`Sample`]; the transforms are compiled for AVX-512 or AVX2 as well,
/// picked at run time.
pub(super) fn sample<T: Element>(g: &Geo, plan: &Plan, s: Sample<'_, T>) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<T: Element>(g: &Geo, plan: &Plan, s: Sample<'_, T>) {
            sample_body(g, plan, s)
        }
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<T: Element>(g: &Geo, plan: &Plan, s: Sample<'_, T>) {
            sample_body(g, plan, s)
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512 F (checked just above).
            return unsafe { avx512(g, plan, s) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { avx2(g, plan, s) };
        }
    }
    sample_body(g, plan, s)
}

#[inline(always)]
fn sample_body<T: Element>(g: &Geo, plan: &Plan, s: Sample<'_, T>) {
    let Sample {
        x,
        u,
        y,
        bias,
        scratch,
        par,
    } = s;
    let (il, ol) = (g.il(), g.ol());
    let (o, c, tp) = (g.o, g.c, plan.tp);
    let (wp, half, need_max) = (plan.wp(), plan.half(), plan.need());
    let tc_max = plan.rows * tp;
    let (v, rest) = scratch.split_at_mut(16 * c * tc_max);
    let (m, rest) = rest.split_at_mut(16 * o * tc_max);
    let (rows, rest) = rest.split_at_mut(need_max * wp);
    let (eo, rest) = rest.split_at_mut(c * need_max * 2 * half);
    let line = rest;
    for gi in 0..g.groups {
        let xg = &x[gi * c * il..][..c * il];
        let ug = &u[gi * 16 * o * c..][..16 * o * c];
        let yg = &mut y[gi * o * ol..][..o * ol];
        let mut ty0 = 0;
        while ty0 < plan.th {
            let ty1 = (ty0 + plan.rows).min(plan.th);
            // Tiles of this chunk, each tile row padded to `tp` columns of V and M.
            let tc = (ty1 - ty0) * tp;
            // The input rows the chunk reads, split into even and odd columns, for every
            // channel first: the split reads rows written long before (no stalled
            // store-to-load forwarding), and each row is split once, not per tile row.
            let need = 2 * (ty1 - ty0) + 2;
            for ci in 0..c {
                let xc = &xg[ci * il..][..il];
                let ec = &mut eo[ci * need_max * 2 * half..][..need * 2 * half];
                split_rows(g, plan, xc, 2 * ty0, need, rows, ec);
            }
            for ci in 0..c {
                let ec = &eo[ci * need_max * 2 * half..][..need * 2 * half];
                for ty in ty0..ty1 {
                    let at = ci * tc + (ty - ty0) * tp;
                    input_tiles(plan, &ec[2 * (ty - ty0) * 2 * half..], v, c * tc, at);
                }
            }
            for xi in 0..16 {
                let a: Mat<'_, f32> = (&ug[xi * o * c..][..o * c], c, 1);
                let b: Mat<'_, f32> = (&v[xi * c * tc..][..c * tc], tc, 1);
                gemm_into(o, tc, c, &mut m[xi * o * tc..], tc, false, a, b, par);
            }
            for oi in 0..o {
                let yo = &mut yg[oi * ol..][..ol];
                for ty in ty0..ty1 {
                    let at = oi * tc + (ty - ty0) * tp;
                    output_row(g, plan, &m[..16 * o * tc], o * tc, at, ty, yo, bias, line);
                }
            }
            ty0 = ty1;
        }
    }
}

/// Lanes per block: every transform loop runs over whole blocks of 16 tiles (one
/// AVX-512 vector), the tile rows being padded to a multiple of it.
const L: usize = 16;

#[inline(always)]
fn lanes(s: &[f32], at: usize) -> &[f32; L] {
    s[at..at + L].try_into().expect("L lanes")
}

#[inline(always)]
fn lanes_mut(s: &mut [f32], at: usize) -> &mut [f32; L] {
    (&mut s[at..at + L]).try_into().expect("L lanes")
}

/// Padded input rows `y0 - ph .. + need` of plane `xc` (zero rows outside it), each
/// starting at input column `-pw`, widened into `rows` and then split into even and
/// odd columns: `eo[k]` = `[even (half), odd (half)]` of row `k`.
#[inline(always)]
fn split_rows<T: Element>(
    g: &Geo,
    plan: &Plan,
    xc: &[T],
    y0: usize,
    need: usize,
    rows: &mut [f32],
    eo: &mut [f32],
) {
    let (h, w) = (g.is[1], g.is[2]);
    let (ph, pw) = (g.p[1] as isize, g.p[2] as isize);
    let (wp, half) = (plan.wp(), plan.half());
    for k in 0..need {
        let r = &mut rows[k * wp..(k + 1) * wp];
        let yi = y0 as isize - ph + k as isize;
        if yi < 0 || yi >= h as isize {
            r.fill(0.0);
        } else {
            let src = &xc[yi as usize * w..][..w];
            let lo = pw.clamp(0, wp as isize) as usize;
            let hi = (w as isize + pw).clamp(lo as isize, wp as isize) as usize;
            r[..lo].fill(0.0);
            if hi > lo {
                let (a, b) = ((lo as isize - pw) as usize, (hi as isize - pw) as usize);
                copy_into(&src[a..b], &mut r[lo..hi]);
            }
            r[hi..].fill(0.0);
        }
    }
    for k in 0..need {
        let (e, od) = eo[k * 2 * half..(k + 1) * 2 * half].split_at_mut(half);
        deinterleave(&rows[k * wp..(k + 1) * wp], e, od);
    }
}

/// `Bᵀ d B` for one tile row from its four split input rows `eo` (as [`split_rows`]
/// lays them out), written straight into `V`: `v[ξ·stride + at + tx]`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // (i, j) index the 4×4 transform
fn input_tiles(plan: &Plan, eo: &[f32], v: &mut [f32], stride: usize, at: usize) {
    let (tp, half) = (plan.tp, plan.half());
    // d B along each row i, then Bᵀ (d B) down the rows
    // (per column j): d[i][0..4] = (e[tx], o[tx], e[tx+1], o[tx+1]).
    let mut t = [[[0.0f32; L]; 4]; 4];
    for b0 in (0..tp).step_by(L) {
        for (i, ti) in t.iter_mut().enumerate() {
            let (e, od) = eo[i * 2 * half..(i + 1) * 2 * half].split_at(half);
            let (d0, d1, d2, d3) = (
                lanes(e, b0),
                lanes(od, b0),
                lanes(e, b0 + 1),
                lanes(od, b0 + 1),
            );
            for k in 0..L {
                ti[0][k] = d0[k] - d2[k];
                ti[1][k] = d1[k] + d2[k];
                ti[2][k] = d2[k] - d1[k];
                ti[3][k] = d1[k] - d3[k];
            }
        }
        for j in 0..4 {
            let (c0, c1, c2, c3) = (&t[0][j], &t[1][j], &t[2][j], &t[3][j]);
            let mut out = [[0.0f32; L]; 4];
            for k in 0..L {
                out[0][k] = c0[k] - c2[k];
                out[1][k] = c1[k] + c2[k];
                out[2][k] = c2[k] - c1[k];
                out[3][k] = c1[k] - c3[k];
            }
            for (i, oi) in out.iter().enumerate() {
                lanes_mut(v, (i * 4 + j) * stride + at + b0).copy_from_slice(oi);
            }
        }
    }
}

/// `e[q] = r[2q]`, `od[q] = r[2q + 1]` (lengths: `e`, `od` a multiple of [`L`], `r` twice
/// that). Compilers leave this stride-2 split scalar; AVX-512 does it with two permutes
/// per 16 pairs.
fn deinterleave(r: &[f32], e: &mut [f32], od: &mut [f32]) {
    let n = e.len();
    assert!(
        n.is_multiple_of(L) && od.len() == n && r.len() >= 2 * n,
        "deinterleave"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512 F (checked just above); lengths checked above.
        return unsafe { deinterleave_avx512(r, e, od) };
    }
    for (q, (a, b)) in e.iter_mut().zip(od.iter_mut()).enumerate() {
        *a = r[2 * q];
        *b = r[2 * q + 1];
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn deinterleave_avx512(r: &[f32], e: &mut [f32], od: &mut [f32]) {
    use std::arch::x86_64::*;
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for q in (0..e.len()).step_by(L) {
        // SAFETY: q + 16 <= e.len() == od.len() and 2q + 32 <= r.len() (the caller's
        // lengths); unaligned loads and stores.
        unsafe {
            let a = _mm512_loadu_ps(r.as_ptr().add(2 * q));
            let b = _mm512_loadu_ps(r.as_ptr().add(2 * q + L));
            _mm512_storeu_ps(e.as_mut_ptr().add(q), _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(od.as_mut_ptr().add(q), _mm512_permutex2var_ps(a, odd, b));
        }
    }
}

/// `Aᵀ m A` for the tiles of tile row `ty` of one output channel (`m[ξ·stride + at +
/// tx]`), written (clipped to the output) into the channel's plane `yo`, added to the
/// bias already there when `bias`. `line` is scratch (two output rows).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn output_row(
    g: &Geo,
    plan: &Plan,
    m: &[f32],
    stride: usize,
    at: usize,
    ty: usize,
    yo: &mut [f32],
    bias: bool,
    line: &mut [f32],
) {
    let (oh, ow, tp) = (g.os[1], g.os[2], plan.tp);
    for b0 in (0..tp).step_by(L) {
        // m A along each row i: s[i][0] = m0 + m1 + m2, s[i][1] = m1 - m2 - m3.
        let mut s = [[[0.0f32; L]; 2]; 4];
        for (i, si) in s.iter_mut().enumerate() {
            let mi = |j: usize| lanes(m, (i * 4 + j) * stride + at + b0);
            let (m0, m1, m2, m3) = (mi(0), mi(1), mi(2), mi(3));
            for k in 0..L {
                si[0][k] = m0[k] + m1[k] + m2[k];
                si[1][k] = m1[k] - m2[k] - m3[k];
            }
        }
        // Aᵀ (m A) down the rows: output row a, columns 2·tx + b, interleaved.
        for a in 0..2 {
            let mut out = [0.0f32; 2 * L];
            for b in 0..2 {
                let (s0, s1, s2, s3) = (&s[0][b], &s[1][b], &s[2][b], &s[3][b]);
                for k in 0..L {
                    out[2 * k + b] = if a == 0 {
                        s0[k] + s1[k] + s2[k]
                    } else {
                        s1[k] - s2[k] - s3[k]
                    };
                }
            }
            line[a * 2 * tp + 2 * b0..][..2 * L].copy_from_slice(&out);
        }
    }
    for a in 0..2 {
        let yy = 2 * ty + a;
        if yy >= oh {
            break;
        }
        let dst = &mut yo[yy * ow..(yy + 1) * ow];
        let src = &line[a * 2 * tp..][..ow];
        if bias {
            dst.iter_mut().zip(src).for_each(|(d, &v)| *d += v);
        } else {
            dst.copy_from_slice(src);
        }
    }
}
