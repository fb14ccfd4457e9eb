//! Winograd F(2×2, 3×3) for the forward and both gradients of 16-bit (float16 /
//! bfloat16) 2-d 3×3 convolutions with stride 1 and dilation 1, computed in float32.
//! The input gradient is itself such a convolution (see [`data_grad`]); the weight
//! gradient is summed in the transformed domain (see [`Grad`]).
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
//! cache; every transform runs along contiguous rows of tiles, as whole blocks of 16
//! lanes (one vector instruction each), and input rows are widened as they are read.

use amp_tensor::pool::{try_with_capacity, try_zeroed};
use amp_tensor::{Element, Result};
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

/// The input gradient of `g` as a forward convolution that Winograd runs: the output
/// gradient correlated with the kernel turned by 180° (see [`flipped`]), the channel
/// roles swapped and the padding `2 - p`, which gives back the input size exactly (stride
/// 1). `None` when that is no Winograd case (padding above 2 included).
pub(super) fn data_grad(g: &Geo) -> Option<Geo> {
    let t = Geo {
        c: g.o,
        o: g.c,
        is: g.os,
        os: g.is,
        p: [
            g.p[0],
            2usize.checked_sub(g.p[1])?,
            2usize.checked_sub(g.p[2])?,
        ],
        ..g.clone()
    };
    applies(&t).then_some(t)
}

/// The kernel of [`data_grad`]'s convolution from the weight `w` `[G·O, C, 1, 3, 3]` of
/// `g`: `[G·C, O, 1, 3, 3]`, each 3×3 kernel turned by 180° (a permutation: exact in
/// any dtype). [`amp_tensor::Error::OutOfMemory`] when it cannot be allocated.
pub(super) fn flipped<T: Element>(w: &[T], g: &Geo) -> Result<Vec<T>> {
    let (o, c) = (g.o, g.c);
    let mut f = try_with_capacity(w.len())?;
    f.extend_from_slice(w);
    for gi in 0..g.groups {
        for oi in 0..o {
            for ci in 0..c {
                let src = &w[((gi * o + oi) * c + ci) * 9..][..9];
                let dst = &mut f[((gi * c + ci) * o + oi) * 9..][..9];
                for (d, &v) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = v;
                }
            }
        }
    }
    Ok(f)
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
        16 * ((g.c + g.o) * tc + 2 * SKEW)
            + self.need() * self.wp()
            + g.c * self.need() * 2 * self.half()
            + 8 * self.tp
    }
}

/// `U` for every group: `u[gi][ξ][o][c]`, from the float32 weight `[G·O, C, 1, 3, 3]`
/// ([`amp_tensor::Error::OutOfMemory`] when it cannot be allocated).
pub(super) fn weights(w: &[f32], g: &Geo) -> Result<Vec<f32>> {
    let (o, c) = (g.o, g.c);
    let mut u = try_zeroed::<f32>(g.groups * 16 * o * c)?;
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
    Ok(u)
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

/// Work that runs with the transforms compiled for AVX-512 or AVX2 as well, picked at
/// run time: [`Sample`] (a forward) and [`Grad`] (a weight gradient).
pub(super) trait Job {
    /// The work itself; implementations are `#[inline(always)]` so that it is compiled
    /// into each of [`run`]'s target-feature wrappers.
    fn run(self, g: &Geo, plan: &Plan);
}

/// Runs `job` for the geometry `g` (its Winograd case) chunked as `plan` says.
pub(super) fn run<J: Job>(g: &Geo, plan: &Plan, job: J) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<J: Job>(g: &Geo, plan: &Plan, job: J) {
            job.run(g, plan)
        }
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<J: Job>(g: &Geo, plan: &Plan, job: J) {
            job.run(g, plan)
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512 F (checked just above).
            return unsafe { avx512(g, plan, job) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { avx2(g, plan, job) };
        }
    }
    job.run(g, plan)
}

/// One worker's scratch ([`Plan::scratch_len`] elements), split: `V`, then `M` (the
/// products of a forward, or the transformed gradient of a weight gradient), 16
/// matrices each a [`SKEW`] apart; the widened input rows and their even/odd split;
/// and a line buffer of `8 · tp`.
type Parts<'s> = (
    &'s mut [f32],
    &'s mut [f32],
    &'s mut [f32],
    &'s mut [f32],
    &'s mut [f32],
);

#[inline(always)]
fn split_scratch<'s>(g: &Geo, plan: &Plan, scratch: &'s mut [f32]) -> Parts<'s> {
    let tc_max = plan.rows * plan.tp;
    let (v, rest) = scratch.split_at_mut(16 * (g.c * tc_max + SKEW));
    let (m, rest) = rest.split_at_mut(16 * (g.o * tc_max + SKEW));
    let (rows, rest) = rest.split_at_mut(plan.need() * plan.wp());
    let (eo, line) = rest.split_at_mut(g.c * plan.need() * 2 * plan.half());
    (v, m, rows, eo, line)
}

impl<T: Element> Job for Sample<'_, T> {
    #[inline(always)]
    fn run(self, g: &Geo, plan: &Plan) {
        let (x, u, y, bias, par) = (self.x, self.u, self.y, self.bias, self.par);
        let (v, m, rows, eo, line) = split_scratch(g, plan, self.scratch);
        let (il, ol) = (g.il(), g.ol());
        let (o, c, tp) = (g.o, g.c, plan.tp);
        for gi in 0..g.groups {
            let xg = &x[gi * c * il..][..c * il];
            let ug = &u[gi * 16 * o * c..][..16 * o * c];
            let yg = &mut y[gi * o * ol..][..o * ol];
            let mut ty0 = 0;
            while ty0 < plan.th {
                let ty1 = (ty0 + plan.rows).min(plan.th);
                // Tiles of this chunk, each tile row padded to `tp` columns of V and M.
                let tc = (ty1 - ty0) * tp;
                transform_inputs(g, plan, xg, (ty0, ty1), v, rows, eo);
                for xi in 0..16 {
                    let a: Mat<'_, f32> = (&ug[xi * o * c..][..o * c], c, 1);
                    let b: Mat<'_, f32> = (&v[xi * (c * tc + SKEW)..][..c * tc], tc, 1);
                    let mx = &mut m[xi * (o * tc + SKEW)..];
                    gemm_into(o, tc, c, mx, tc, false, a, b, par);
                }
                for oi in 0..o {
                    let yo = &mut yg[oi * ol..][..ol];
                    for ty in ty0..ty1 {
                        let at = oi * tc + (ty - ty0) * tp;
                        output_row(g, plan, m, o * tc + SKEW, at, ty, yo, bias, line);
                    }
                }
                ty0 = ty1;
            }
        }
    }
}

/// `V` for the tile rows `ty0..ty1` of one group's input planes `xg`: `v[ξ·c·tc + ci·tc +
/// (ty - ty0)·tp + tx]`, `tc` being the chunk's tiles. `rows` and `eo` are scratch
/// ([`Plan::scratch_len`]'s shares).
#[inline(always)]
fn transform_inputs<T: Element>(
    g: &Geo,
    plan: &Plan,
    xg: &[T],
    (ty0, ty1): (usize, usize),
    v: &mut [f32],
    rows: &mut [f32],
    eo: &mut [f32],
) {
    let (il, c, tp) = (g.il(), g.c, plan.tp);
    let (half, need_max) = (plan.half(), plan.need());
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
            input_tiles(plan, &ec[2 * (ty - ty0) * 2 * half..], v, c * tc + SKEW, at);
        }
    }
}

/// One sample's share of a weight gradient: its input planes `x` (`G·C × il`) and
/// output gradient `gy` (`G·O × ol`), both in `T`, added into `acc` in the transformed
/// domain (`[G][ξ][O][C]`, float32; [`weight_grad`] turns the sum into the gradient),
/// using `scratch` ([`Plan::scratch_len`] elements).
///
/// The forward is `y = Aᵀ [(G k Gᵀ) ⊙ (Bᵀ d B)] A` per tile, so the gradient of the
/// kernel is `Gᵀ [Σ (A dy Aᵀ) ⊙ (Bᵀ d B)] G`, the sum running over tiles, samples and
/// (per output and input channel) nothing else: per ξ, one product of the transformed
/// gradient (`O × tiles`) with the transformed input (`tiles × C`).
pub(super) struct Grad<'a, T> {
    pub(super) x: &'a [T],
    pub(super) gy: &'a [T],
    pub(super) acc: &'a mut [f32],
    pub(super) scratch: &'a mut [f32],
    pub(super) par: Parallelism,
}

impl<T: Element> Job for Grad<'_, T> {
    #[inline(always)]
    fn run(self, g: &Geo, plan: &Plan) {
        let (x, gy, acc, par) = (self.x, self.gy, self.acc, self.par);
        // The transformed gradient takes the place of the forward's products.
        let (v, dt, rows, eo, line) = split_scratch(g, plan, self.scratch);
        let (il, ol) = (g.il(), g.ol());
        let (o, c, tp) = (g.o, g.c, plan.tp);
        for gi in 0..g.groups {
            let xg = &x[gi * c * il..][..c * il];
            let gyg = &gy[gi * o * ol..][..o * ol];
            let ag = &mut acc[gi * 16 * o * c..][..16 * o * c];
            let mut ty0 = 0;
            while ty0 < plan.th {
                let ty1 = (ty0 + plan.rows).min(plan.th);
                let tc = (ty1 - ty0) * tp;
                transform_inputs(g, plan, xg, (ty0, ty1), v, rows, eo);
                for oi in 0..o {
                    let go = &gyg[oi * ol..][..ol];
                    for ty in ty0..ty1 {
                        let at = oi * tc + (ty - ty0) * tp;
                        grad_tiles(g, plan, go, ty, dt, o * tc + SKEW, at, line);
                    }
                }
                for xi in 0..16 {
                    // acc_ξ (O × C) += D_ξ (O × tc) @ V_ξᵀ (tc × C).
                    let a: Mat<'_, f32> = (&dt[xi * (o * tc + SKEW)..][..o * tc], tc, 1);
                    let b: Mat<'_, f32> = (&v[xi * (c * tc + SKEW)..][..c * tc], 1, tc);
                    gemm_into(o, c, tc, &mut ag[xi * o * c..], c, true, a, b, par);
                }
                ty0 = ty1;
            }
        }
    }
}

/// `A dy Aᵀ` for the tiles of tile row `ty` of one output channel's gradient plane
/// `go`, written into `dt[ξ·stride + at + tx]`; the parts of a tile outside the output
/// count as zeros. `line` is scratch (`8 · tp`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn grad_tiles<T: Element>(
    g: &Geo,
    plan: &Plan,
    go: &[T],
    ty: usize,
    dt: &mut [f32],
    stride: usize,
    at: usize,
    line: &mut [f32],
) {
    let (oh, ow, tp) = (g.os[1], g.os[2], plan.tp);
    // Rows 2·ty and 2·ty + 1, widened and zero-padded to 2·tp columns, then split
    // into even and odd columns: line = [r0 | r1 | e0 | o0 | e1 | o1].
    let (r, split) = line.split_at_mut(4 * tp);
    for a in 0..2 {
        let ra = &mut r[a * 2 * tp..][..2 * tp];
        let yy = 2 * ty + a;
        padded_row((yy < oh).then(|| &go[yy * ow..][..ow]), 0, ra);
        let (e, od) = split[a * 2 * tp..][..2 * tp].split_at_mut(tp);
        deinterleave(ra, e, od);
    }
    let (e0, rest) = split.split_at(tp);
    let (o0, rest) = rest.split_at(tp);
    let (e1, o1) = rest.split_at(tp);
    // A dy: rows (a, b), (a + c, b + d), (a - c, b - d), (-c, -d); then each row
    // (p, q) times Aᵀ: (p, p + q, p - q, -q).
    for b0 in (0..tp).step_by(L) {
        let (a, b, c, d) = (ld(e0, b0), ld(o0, b0), ld(e1, b0), ld(o1, b0));
        let rows = [
            (a, b),
            (add(a, c), add(b, d)),
            (sub(a, c), sub(b, d)),
            (neg(c), neg(d)),
        ];
        for (i, (p, q)) in rows.into_iter().enumerate() {
            for (j, x) in a4t(p, q).into_iter().enumerate() {
                st(dt, (i * 4 + j) * stride + at + b0, x);
            }
        }
    }
}

/// The weight gradient `[G·O, C, 1, 3, 3]` from the transformed-domain sums `acc`
/// (`[G][ξ][O][C]`, see [`Grad`]): `Gᵀ X G` per output and input channel
/// ([`amp_tensor::Error::OutOfMemory`] when it cannot be allocated).
#[allow(clippy::needless_range_loop)] // j indexes the 4×4 transform
pub(super) fn weight_grad(acc: &[f32], g: &Geo) -> Result<Vec<f32>> {
    let (o, c) = (g.o, g.c);
    let mut w = try_zeroed::<f32>(g.groups * o * c * 9)?;
    for (gi, ag) in acc.chunks(16 * o * c).enumerate() {
        for oi in 0..o {
            for ci in 0..c {
                let x = |i: usize, j: usize| ag[(i * 4 + j) * o * c + oi * c + ci];
                // Gᵀ X: 3×4, rows (X0 + (X1 + X2)/2, (X1 - X2)/2, (X1 + X2)/2 + X3).
                let mut t = [[0.0f32; 4]; 3];
                for j in 0..4 {
                    let (x0, x1, x2, x3) = (x(0, j), x(1, j), x(2, j), x(3, j));
                    t[0][j] = x0 + 0.5 * (x1 + x2);
                    t[1][j] = 0.5 * (x1 - x2);
                    t[2][j] = 0.5 * (x1 + x2) + x3;
                }
                let k = &mut w[((gi * o + oi) * c + ci) * 9..][..9];
                for (i, [p0, p1, p2, p3]) in t.iter().enumerate() {
                    k[i * 3] = p0 + 0.5 * (p1 + p2);
                    k[i * 3 + 1] = 0.5 * (p1 - p2);
                    k[i * 3 + 2] = 0.5 * (p1 + p2) + p3;
                }
            }
        }
    }
    Ok(w)
}

/// Padding (in f32 elements, one cache line) between the 16 matrices `ξ` of `V` and `M`:
/// the transforms touch all 16 at once, and without it their rows would be a multiple
/// of 4 KiB apart and contend for the same L1 cache sets.
const SKEW: usize = 16;

/// Lanes per block: every transform loop runs over whole blocks of 16 tiles (one
/// AVX-512 vector), the tile rows being padded to a multiple of it.
const L: usize = 16;

/// One block of [`L`] lanes, passed by value: the transforms are written as whole-block
/// adds and subtracts (each one vector instruction), which compilers keep in registers
/// where per-lane loops over nested arrays were left scalar.
type Lanes = [f32; L];

#[inline(always)]
fn ld(s: &[f32], at: usize) -> Lanes {
    s[at..at + L].try_into().expect("L lanes")
}

#[inline(always)]
fn st(s: &mut [f32], at: usize, v: Lanes) {
    s[at..at + L].copy_from_slice(&v);
}

#[inline(always)]
fn add(a: Lanes, b: Lanes) -> Lanes {
    let mut r = a;
    for k in 0..L {
        r[k] += b[k];
    }
    r
}

#[inline(always)]
fn sub(a: Lanes, b: Lanes) -> Lanes {
    let mut r = a;
    for k in 0..L {
        r[k] -= b[k];
    }
    r
}

#[inline(always)]
fn neg(a: Lanes) -> Lanes {
    let mut r = a;
    for v in &mut r {
        *v = -*v;
    }
    r
}

/// `Bᵀ` times four rows (or columns) of a tile: Bᵀ has the rows (1, 0, -1, 0),
/// (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1).
#[inline(always)]
fn bt(d0: Lanes, d1: Lanes, d2: Lanes, d3: Lanes) -> [Lanes; 4] {
    [sub(d0, d2), add(d1, d2), sub(d2, d1), sub(d1, d3)]
}

/// `Aᵀ` times four rows (or columns): Aᵀ has the rows (1, 1, 1, 0) and (0, 1, -1, -1).
#[inline(always)]
fn at2(m0: Lanes, m1: Lanes, m2: Lanes, m3: Lanes) -> [Lanes; 2] {
    [add(add(m0, m1), m2), sub(sub(m1, m2), m3)]
}

/// A row `(p, q)` times `Aᵀ`: `(p, p + q, p - q, -q)`.
#[inline(always)]
fn a4t(p: Lanes, q: Lanes) -> [Lanes; 4] {
    [p, add(p, q), sub(p, q), neg(q)]
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
        let yi = y0 as isize - ph + k as isize;
        let src = (0..h as isize)
            .contains(&yi)
            .then(|| &xc[yi as usize * w..][..w]);
        padded_row(src, pw, &mut rows[k * wp..(k + 1) * wp]);
    }
    for k in 0..need {
        let (e, od) = eo[k * 2 * half..(k + 1) * 2 * half].split_at_mut(half);
        deinterleave(&rows[k * wp..(k + 1) * wp], e, od);
    }
}

/// `r` = the row `src` widened to float32 and starting at column `-pw` (zeros left of
/// it, right of it, and all through `r` when there is no row).
#[inline(always)]
fn padded_row<T: Element>(src: Option<&[T]>, pw: isize, r: &mut [f32]) {
    let Some(src) = src else {
        return r.fill(0.0);
    };
    let wp = r.len() as isize;
    let lo = pw.clamp(0, wp) as usize;
    let hi = (src.len() as isize + pw).clamp(lo as isize, wp) as usize;
    r[..lo].fill(0.0);
    if hi > lo {
        let (a, b) = ((lo as isize - pw) as usize, (hi as isize - pw) as usize);
        copy_into(&src[a..b], &mut r[lo..hi]);
    }
    r[hi..].fill(0.0);
}

/// `Bᵀ d B` for one tile row from its four split input rows `eo` (as [`split_rows`]
/// lays them out), written straight into `V`: `v[ξ·stride + at + tx]`.
#[inline(always)]
fn input_tiles(plan: &Plan, eo: &[f32], v: &mut [f32], stride: usize, at: usize) {
    let (tp, half) = (plan.tp, plan.half());
    // `bt` along each row, then down the columns. Row i of tile tx is
    // d[i] = (e[tx], o[tx], e[tx+1], o[tx+1]).
    for b0 in (0..tp).step_by(L) {
        let mut t = [[[0.0; L]; 4]; 4];
        for (i, ti) in t.iter_mut().enumerate() {
            let (e, od) = eo[i * 2 * half..(i + 1) * 2 * half].split_at(half);
            *ti = bt(ld(e, b0), ld(od, b0), ld(e, b0 + 1), ld(od, b0 + 1));
        }
        #[allow(clippy::needless_range_loop)] // j picks a column of every row
        for j in 0..4 {
            let out = bt(t[0][j], t[1][j], t[2][j], t[3][j]);
            for (i, oi) in out.into_iter().enumerate() {
                st(v, (i * 4 + j) * stride + at + b0, oi);
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

/// `r[2q] = e[q]`, `r[2q + 1] = od[q]`: the inverse of [`deinterleave`], with the same
/// lengths.
fn interleave(e: &[f32], od: &[f32], r: &mut [f32]) {
    let n = e.len();
    assert!(
        n.is_multiple_of(L) && od.len() == n && r.len() >= 2 * n,
        "interleave"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512 F (checked just above); lengths checked above.
        return unsafe { interleave_avx512(e, od, r) };
    }
    for (q, (&a, &b)) in e.iter().zip(od).enumerate() {
        r[2 * q] = a;
        r[2 * q + 1] = b;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn interleave_avx512(e: &[f32], od: &[f32], r: &mut [f32]) {
    use std::arch::x86_64::*;
    let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for q in (0..e.len()).step_by(L) {
        // SAFETY: q + 16 <= e.len() == od.len() and 2q + 32 <= r.len() (the caller's
        // lengths); unaligned loads and stores.
        unsafe {
            let a = _mm512_loadu_ps(e.as_ptr().add(q));
            let b = _mm512_loadu_ps(od.as_ptr().add(q));
            _mm512_storeu_ps(r.as_mut_ptr().add(2 * q), _mm512_permutex2var_ps(a, lo, b));
            let h = _mm512_permutex2var_ps(a, hi, b);
            _mm512_storeu_ps(r.as_mut_ptr().add(2 * q + L), h);
        }
    }
}

/// `Aᵀ m A` for the tiles of tile row `ty` of one output channel (`m[ξ·stride + at +
/// tx]`), written (clipped to the output) into the channel's plane `yo`, added to the
/// bias already there when `bias`. `line` is scratch (`8 · tp`).
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
        // m A along each row i, then Aᵀ (m A) down the rows.
        let mut s = [[[0.0; L]; 2]; 4];
        for (i, si) in s.iter_mut().enumerate() {
            let at = (i * 4) * stride + at + b0;
            *si = at2(
                ld(m, at),
                ld(m, at + stride),
                ld(m, at + 2 * stride),
                ld(m, at + 3 * stride),
            );
        }
        // cols[b][a]: output row a, columns 2·tx + b.
        let cols = [
            at2(s[0][0], s[1][0], s[2][0], s[3][0]),
            at2(s[0][1], s[1][1], s[2][1], s[3][1]),
        ];
        for (b, col) in cols.into_iter().enumerate() {
            for (a, v) in col.into_iter().enumerate() {
                st(line, (2 * a + b) * tp + b0, v);
            }
        }
    }
    // line = [row 0 even | row 0 odd | row 1 even | row 1 odd | one interleaved row].
    let (halves, row) = line.split_at_mut(4 * tp);
    for a in 0..2 {
        let yy = 2 * ty + a;
        if yy >= oh {
            break;
        }
        let (e, od) = halves[2 * a * tp..][..2 * tp].split_at(tp);
        interleave(e, od, &mut row[..2 * tp]);
        let dst = &mut yo[yy * ow..(yy + 1) * ow];
        let src = &row[..ow];
        if bias {
            dst.iter_mut().zip(src).for_each(|(d, &v)| *d += v);
        } else {
            dst.copy_from_slice(src);
        }
    }
}
