//! Reductions over any set of dimensions — `sum`, `mean`, `prod`, max/min (values,
//! indices, `amax`/`amin`, `argmax`/`argmin`), vector norms, `logsumexp`, `var`/`std` —
//! and the cumulative `cumsum`/`cumprod`.
//!
//! Every reduction goes through one [`Plan`]: the input is viewed (without a copy when
//! its strides allow, transposed inputs included) as `[outer, red, inner]` with the
//! reduced elements in the middle. With `inner == 1` each output folds one contiguous
//! row in a tight, vectorised loop (rows in parallel; one long row split into segments
//! across threads). Otherwise whole input rows are accumulated into a block of output
//! accumulators, so no reduction gathers strided elements one at a time. Reductions
//! over scattered dims that fit neither shape are permuted into one contiguous copy.
//!
//! Floats accumulate in their compute type (f32 for f16/bf16/f32, f64 for f64) and are
//! rounded once; sums use lane-parallel blocks joined with Neumaier compensation.
//! Integers and bools accumulate in i64 (their sums and products are int64 as in
//! PyTorch). Results are deterministic: the split into blocks and tasks depends on the
//! shape only, never on the number of threads.

use std::any::TypeId;
use std::ops::Range;

use amp_tensor::{
    cast_into, ensure, gather_cast, wrap_dim, DType, Element, Error, Layout, Result, Tensor,
};

use crate::compute::{with_slice, Real, CHUNK};
use crate::softmax::FastExp;

/// Work (elements) below which kernels stay on the calling thread.
pub(crate) const PAR_MIN: usize = 1 << 15;
/// Work (elements) per parallel task.
pub(crate) const TASK: usize = 1 << 14;
/// Elements below which a row-wise line op (softmax, layer norm, scans along the last
/// dim) stays on the calling thread. With `amp_tensor::parallel::for_each` (the caller
/// starts at once, a woken worker joins) a split pays early: at 1 << 18 a 128×128 to
/// 384×384 softmax ran on one thread at 0.5–0.6× PyTorch's speed, which splits these.
pub(crate) const LINE_PAR_MIN: usize = 1 << 13;
/// Elements a task of a row-wise split covers at least (a task is claimed with one
/// atomic add; below this the claims start to show).
const LINE_TASK_MIN: usize = 1 << 11;

/// Rows per task when `rows` rows of `n` elements are split across threads: about
/// eight tasks per thread, so that a worker joining a few microseconds late, or one
/// running slower, leaves the caller at most one small task to wait for (two large
/// blocks per thread left the caller waiting a third of a 128×128 softmax), and never
/// fewer than [`LINE_TASK_MIN`] elements.
pub(crate) fn rows_per_task(rows: usize, n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    rows.div_ceil(8 * threads)
        .max(LINE_TASK_MIN.div_ceil(n.max(1)))
        .max(1)
}

/// Segment length when one long row is split across threads.
const SEG: usize = 1 << 16;
/// Elements folded by the lane kernels before being merged into an accumulator.
const BLOCK: usize = 1024;
/// Output columns accumulated together when reducing over a non-trailing dim.
const COL_W: usize = 1024;
/// Input rows accumulated plainly before being merged into the column accumulators.
const RBLK: usize = 256;
/// Granularity (columns) of the tiles a line op over a non-trailing dim transposes.
const TILE: usize = 16;
/// Independent accumulators of the lane kernels (vectorisation and accuracy).
const LANES: usize = 16;

// ----- accumulation types -------------------------------------------------------------

/// The accumulation types of the kernels (f32, f64 and i64) with the few operations the
/// generic kernels need. Integer arithmetic wraps, as in PyTorch.
pub(crate) trait Num: Element {
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// The identity of `max` (-inf, or the minimum integer).
    const LOWEST: Self;
    /// The identity of `min` (+inf, or the maximum integer).
    const HIGHEST: Self;
    /// `self + o` (wrapping for integers).
    fn nadd(self, o: Self) -> Self;
    /// `self * o` (wrapping for integers).
    fn nmul(self, o: Self) -> Self;
    /// `true` for NaN.
    fn isnan(self) -> bool;
    /// Add `v` to the Neumaier-compensated sum `(sum, compensation)`.
    fn comp_add(acc: (Self, Self), v: Self) -> (Self, Self);
    /// In-place running sum (floats accumulate in f64, as PyTorch's CPU scan).
    fn cumsum(xs: &mut [Self]);
    /// In-place running product (floats accumulate in f64).
    fn cumprod(xs: &mut [Self]);
}

macro_rules! float_num {
    ($t:ty) => {
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)]
            fn nadd(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn nmul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn isnan(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn comp_add((s, c): (Self, Self), v: Self) -> (Self, Self) {
                let t = s + v;
                if !t.is_finite() {
                    return (t, c);
                }
                let e = if s.abs() >= v.abs() {
                    (s - t) + v
                } else {
                    (v - t) + s
                };
                (t, c + e)
            }
            fn cumsum(xs: &mut [Self]) {
                let mut a = 0f64;
                for x in xs {
                    a += *x as f64;
                    *x = a as $t;
                }
            }
            fn cumprod(xs: &mut [Self]) {
                let mut a = 1f64;
                for x in xs {
                    a *= *x as f64;
                    *x = a as $t;
                }
            }
        }
    };
}
float_num!(f32);
float_num!(f64);

impl Num for i64 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    const LOWEST: Self = i64::MIN;
    const HIGHEST: Self = i64::MAX;
    #[inline(always)]
    fn nadd(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn nmul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn isnan(self) -> bool {
        false
    }
    #[inline(always)]
    fn comp_add((s, c): (Self, Self), v: Self) -> (Self, Self) {
        (s.wrapping_add(v), c)
    }
    fn cumsum(xs: &mut [Self]) {
        let mut a = 0i64;
        for x in xs {
            a = a.wrapping_add(*x);
            *x = a;
        }
    }
    fn cumprod(xs: &mut [Self]) {
        let mut a = 1i64;
        for x in xs {
            a = a.wrapping_mul(*x);
            *x = a;
        }
    }
}

/// Bind `$T` (storage element) and `$N` (accumulation type: f32 for the 16-bit floats
/// and f32, f64 for f64, i64 for the integer types and bool) for any `$dtype`.
macro_rules! num_kernel {
    ($dtype:expr, |$T:ident, $N:ident| $body:expr) => {
        $crate::amp_tensor::bind_dtypes!($dtype, $body, [
            F16 => {$T = $crate::amp_tensor::half::f16, $N = f32}
            BF16 => {$T = $crate::amp_tensor::half::bf16, $N = f32}
            F32 => {$T = f32, $N = f32}
            F64 => {$T = f64, $N = f64}
            I64 => {$T = i64, $N = i64}
            I32 => {$T = i32, $N = i64}
            Bool => {$T = bool, $N = i64}
        ])
    };
}
pub(crate) use num_kernel;

/// `xs` viewed as `[N]` when `T` is `N` itself (no copy needed).
#[inline(always)]
pub(crate) fn as_same<T: 'static, N: 'static>(xs: &[T]) -> Option<&[N]> {
    if TypeId::of::<T>() == TypeId::of::<N>() {
        // SAFETY: `T` and `N` are the same type, so the slice is reinterpreted as itself.
        Some(unsafe { std::slice::from_raw_parts(xs.as_ptr().cast::<N>(), xs.len()) })
    } else {
        None
    }
}

/// `xs` viewed mutably as `[N]` when `T` is `N` itself.
#[inline(always)]
pub(crate) fn as_same_mut<T: 'static, N: 'static>(xs: &mut [T]) -> Option<&mut [N]> {
    if TypeId::of::<T>() == TypeId::of::<N>() {
        // SAFETY: as in `as_same`; the exclusive borrow is carried over.
        Some(unsafe { std::slice::from_raw_parts_mut(xs.as_mut_ptr().cast::<N>(), xs.len()) })
    } else {
        None
    }
}

/// Call `f(chunk, offset)` over `xs` converted to `N`: the slice itself when `T == N`,
/// else [`CHUNK`]-sized widened copies (vectorised casts).
#[inline]
fn for_widened<T: Element, N: Element>(xs: &[T], mut f: impl FnMut(&[N], usize)) {
    if let Some(s) = as_same::<T, N>(xs) {
        f(s, 0);
        return;
    }
    let mut buf = [N::default(); CHUNK];
    for (k, c) in xs.chunks(CHUNK).enumerate() {
        let b = &mut buf[..c.len()];
        cast_into(c, b);
        f(b, k * CHUNK);
    }
}

// ----- lane kernels ---------------------------------------------------------------------

/// Fold `g(x)` over `xs` with the associative `op` in [`LANES`] independent lanes
/// (vectorisable), then combine the lanes pairwise.
#[inline(always)]
pub(crate) fn lane_reduce<N: Num>(
    xs: &[N],
    id: N,
    op: impl Fn(N, N) -> N,
    g: impl Fn(N) -> N,
) -> N {
    let mut acc = [id; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = op(*a, g(x));
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = op(*a, g(x));
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        let (lo, hi) = acc.split_at_mut(w);
        for (a, &b) in lo.iter_mut().zip(hi.iter()) {
            *a = op(*a, b);
        }
    }
    acc[0]
}

/// Sum of `xs` in lanes.
#[inline]
pub(crate) fn lane_sum<N: Num>(xs: &[N]) -> N {
    lane_reduce(xs, N::ZERO, N::nadd, |x| x)
}

/// `x` if it beats `acc` (greater for `MAX`, smaller otherwise) or is NaN: NaN sticks.
#[inline(always)]
fn pick<N: Num, const MAX: bool>(acc: N, x: N) -> N {
    let better = if MAX { x > acc } else { x < acc };
    if better || x.isnan() {
        x
    } else {
        acc
    }
}

/// The maximum (`MAX`) or minimum of `g(x)` over `xs` (the identity for an empty
/// slice), or the first NaN: lanes track the extreme and a NaN flag separately, which
/// vectorises far better than a NaN-aware select.
#[inline(always)]
fn lane_extreme<N: Num, const MAX: bool>(xs: &[N], g: impl Fn(N) -> N) -> N {
    let id = if MAX { N::LOWEST } else { N::HIGHEST };
    let mut acc = [id; LANES];
    let mut nan = [0u32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    let step = |a: &mut N, f: &mut u32, x: N| {
        let v = g(x);
        let better = if MAX { v > *a } else { v < *a };
        *a = if better { v } else { *a };
        *f |= v.isnan() as u32;
    };
    for c in &mut chunks {
        for ((a, f), &x) in acc.iter_mut().zip(nan.iter_mut()).zip(c) {
            step(a, f, x);
        }
    }
    for ((a, f), &x) in acc.iter_mut().zip(nan.iter_mut()).zip(chunks.remainder()) {
        step(a, f, x);
    }
    if nan.iter().any(|&f| f != 0) {
        if let Some(v) = xs.iter().map(|&x| g(x)).find(|v| v.isnan()) {
            return v;
        }
    }
    acc.iter().fold(id, |a, &b| pick::<N, MAX>(a, b))
}

/// The maximum of `xs`, NaN if any element is NaN (-inf for an empty slice).
#[inline]
pub(crate) fn max_nan<N: Num>(xs: &[N]) -> N {
    lane_extreme::<N, true>(xs, |x| x)
}

// ----- folds ------------------------------------------------------------------------------

/// One reduction: an accumulator per output, fed single elements (`step`, with the
/// element's index along the reduced elements), whole slices (`fold`, overridden with
/// lane kernels) or a row of columns (`step_row`), joined with `merge` (`a` precedes
/// `b`) and turned into the result by `finish` (given the number of reduced elements).
pub(crate) trait Fold<N: Copy>: Sync {
    /// The running state of one output.
    type Acc: Copy + Send + Sync;
    /// The result of one output.
    type Out: Copy + Send + Sync;
    /// The state before any element.
    fn init(&self) -> Self::Acc;
    /// Add element `x` with index `i`.
    fn step(&self, acc: Self::Acc, x: N, i: usize) -> Self::Acc;
    /// Join the states of consecutive ranges (`a` first).
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The result after `n` elements.
    fn finish(&self, acc: Self::Acc, n: usize) -> Self::Out;
    /// Add the consecutive elements `xs`, the first having index `base`.
    #[inline]
    fn fold(&self, acc: Self::Acc, xs: &[N], base: usize) -> Self::Acc {
        xs.iter()
            .enumerate()
            .fold(acc, |a, (k, &x)| self.step(a, x, base + k))
    }
    /// Add `xs[j]` (index `i`) to `accs[j]` for every column `j`.
    #[inline]
    fn step_row(&self, accs: &mut [Self::Acc], xs: &[N], i: usize) {
        for (a, &x) in accs.iter_mut().zip(xs) {
            *a = self.step(*a, x, i);
        }
    }
}

/// Sum of `g(x)`: lane sums over blocks, joined with Neumaier compensation inside each
/// slice; columns and segments add plainly (a few hundred terms at most per result).
struct MapSum<G>(G);

impl<N: Num, G: Fn(N) -> N + Sync> Fold<N> for MapSum<G> {
    type Acc = N;
    type Out = N;
    #[inline]
    fn init(&self) -> N {
        N::ZERO
    }
    #[inline(always)]
    fn step(&self, a: N, x: N, _: usize) -> N {
        a.nadd((self.0)(x))
    }
    #[inline]
    fn merge(&self, a: N, b: N) -> N {
        a.nadd(b)
    }
    #[inline]
    fn finish(&self, a: N, _: usize) -> N {
        a
    }
    #[inline]
    fn fold(&self, acc: N, xs: &[N], _: usize) -> N {
        let (s, c) = xs.chunks(BLOCK).fold((acc, N::ZERO), |a, b| {
            N::comp_add(a, lane_reduce(b, N::ZERO, N::nadd, &self.0))
        });
        s.nadd(c)
    }
}

fn identity<N>(x: N) -> N {
    x
}

/// The plain sum.
fn sum_fold<N: Num>() -> MapSum<impl Fn(N) -> N + Sync> {
    MapSum(identity::<N>)
}

/// The mean: the sum divided by the count.
struct MeanFold;

impl<C: Real + Num> Fold<C> for MeanFold {
    type Acc = C;
    type Out = C;
    #[inline]
    fn init(&self) -> C {
        C::ZERO
    }
    #[inline(always)]
    fn step(&self, a: C, x: C, _: usize) -> C {
        a + x
    }
    #[inline]
    fn merge(&self, a: C, b: C) -> C {
        a + b
    }
    #[inline]
    fn finish(&self, a: C, n: usize) -> C {
        a / C::from_f64c(n as f64)
    }
    #[inline]
    fn fold(&self, acc: C, xs: &[C], base: usize) -> C {
        sum_fold::<C>().fold(acc, xs, base)
    }
}

/// The product.
struct ProdFold;

impl<N: Num> Fold<N> for ProdFold {
    type Acc = N;
    type Out = N;
    #[inline]
    fn init(&self) -> N {
        N::ONE
    }
    #[inline(always)]
    fn step(&self, a: N, x: N, _: usize) -> N {
        a.nmul(x)
    }
    #[inline]
    fn merge(&self, a: N, b: N) -> N {
        a.nmul(b)
    }
    #[inline]
    fn finish(&self, a: N, _: usize) -> N {
        a
    }
    #[inline]
    fn fold(&self, acc: N, xs: &[N], _: usize) -> N {
        acc.nmul(lane_reduce(xs, N::ONE, N::nmul, |x| x))
    }
}

/// Maximum (`MAX`) or minimum of `g(x)`, NaN-propagating.
struct Extreme<const MAX: bool, G>(G);

impl<N: Num, G: Fn(N) -> N + Sync, const MAX: bool> Fold<N> for Extreme<MAX, G> {
    type Acc = N;
    type Out = N;
    #[inline]
    fn init(&self) -> N {
        if MAX {
            N::LOWEST
        } else {
            N::HIGHEST
        }
    }
    #[inline(always)]
    fn step(&self, a: N, x: N, _: usize) -> N {
        pick::<N, MAX>(a, (self.0)(x))
    }
    #[inline]
    fn merge(&self, a: N, b: N) -> N {
        pick::<N, MAX>(a, b)
    }
    #[inline]
    fn finish(&self, a: N, _: usize) -> N {
        a
    }
    #[inline]
    fn fold(&self, acc: N, xs: &[N], _: usize) -> N {
        pick::<N, MAX>(acc, lane_extreme::<N, MAX>(xs, &self.0))
    }
}

/// Value and index of the maximum (`MAX`) or minimum: the first NaN wins, else the
/// first occurrence of the extreme value.
struct ArgFold<const MAX: bool>;

const NO_INDEX: usize = usize::MAX;

impl<N: Num, const MAX: bool> Fold<N> for ArgFold<MAX> {
    type Acc = (N, usize);
    type Out = (N, i64);
    #[inline]
    fn init(&self) -> (N, usize) {
        (N::ZERO, NO_INDEX)
    }
    #[inline(always)]
    fn step(&self, a: (N, usize), x: N, i: usize) -> (N, usize) {
        self.merge(a, (x, i))
    }
    #[inline]
    fn merge(&self, a: (N, usize), b: (N, usize)) -> (N, usize) {
        if b.1 == NO_INDEX || a.0.isnan() {
            return a;
        }
        if a.1 == NO_INDEX || b.0.isnan() {
            return b;
        }
        let better = if MAX { b.0 > a.0 } else { b.0 < a.0 };
        if better {
            b
        } else {
            a
        }
    }
    #[inline]
    fn finish(&self, a: (N, usize), _: usize) -> (N, i64) {
        (a.0, if a.1 == NO_INDEX { 0 } else { a.1 as i64 })
    }
}

/// Blue's scaling constants (LAPACK `la_constants`) of a float type.
pub(crate) trait BlueConst: Real + Num {
    /// Below this, values are scaled up before squaring.
    const TSML: Self;
    /// Above this, values are scaled down before squaring.
    const TBIG: Self;
    /// The scale-up factor of small values.
    const SSML: Self;
    /// The scale-down factor of big values.
    const SBIG: Self;
}

const fn pow2_f32(e: i32) -> f32 {
    f32::from_bits(((127 + e) as u32) << 23)
}

const fn pow2_f64(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

impl BlueConst for f32 {
    const TSML: f32 = pow2_f32(-63);
    const TBIG: f32 = pow2_f32(52);
    const SSML: f32 = pow2_f32(75);
    const SBIG: f32 = pow2_f32(-76);
}

impl BlueConst for f64 {
    const TSML: f64 = pow2_f64(-511);
    const TBIG: f64 = pow2_f64(486);
    const SSML: f64 = pow2_f64(537);
    const SBIG: f64 = pow2_f64(-538);
}

/// The Euclidean norm without overflow or underflow (Blue's algorithm: small, medium
/// and big magnitudes accumulate separately, scaled; blocks of medium values take a
/// plain lane sum of squares).
struct L2Fold;

impl<C: BlueConst> Fold<C> for L2Fold {
    type Acc = (C, C, C);
    type Out = C;
    #[inline]
    fn init(&self) -> (C, C, C) {
        (C::ZERO, C::ZERO, C::ZERO)
    }
    #[inline(always)]
    fn step(&self, (sml, med, big): (C, C, C), x: C, _: usize) -> (C, C, C) {
        let ax = x.abs();
        if ax > C::TBIG {
            let s = ax * C::SBIG;
            (sml, med, big + s * s)
        } else if ax < C::TSML {
            let s = ax * C::SSML;
            (sml + s * s, med, big)
        } else {
            (sml, med + ax * ax, big)
        }
    }
    #[inline]
    fn merge(&self, a: (C, C, C), b: (C, C, C)) -> (C, C, C) {
        (a.0 + b.0, a.1 + b.1, a.2 + b.2)
    }
    fn finish(&self, (asml, amed, abig): (C, C, C), _: usize) -> C {
        let medium = amed > C::ZERO || amed.is_nan();
        if abig > C::ZERO {
            let abig = if medium {
                abig + (amed * C::SBIG) * C::SBIG
            } else {
                abig
            };
            abig.sqrt() / C::SBIG
        } else if asml > C::ZERO {
            if medium {
                let m = amed.sqrt();
                let s = asml.sqrt() / C::SSML;
                let (lo, hi) = if s > m { (m, s) } else { (s, m) };
                let r = lo / hi;
                hi * (C::ONE + r * r).sqrt()
            } else {
                asml.sqrt() / C::SSML
            }
        } else {
            amed.sqrt()
        }
    }
    #[inline]
    fn fold(&self, acc: (C, C, C), xs: &[C], base: usize) -> (C, C, C) {
        // A block whose plain sum of squares neither overflowed nor came close to the
        // subnormal range is exact enough; others take Blue's per-element path.
        let lo = C::min_positive_value() / C::epsilon() * C::from_f64c(BLOCK as f64);
        let hi = C::TBIG * C::TBIG * C::from_f64c(BLOCK as f64);
        xs.chunks(BLOCK).fold(acc, |a, b| {
            let ssq = lane_reduce(b, C::ZERO, C::nadd, |x: C| x * x);
            if ssq >= lo && ssq <= hi {
                (a.0, a.1 + ssq, a.2)
            } else {
                b.iter().fold(a, |a, &x| self.step(a, x, base))
            }
        })
    }
}

/// Variance (or standard deviation) with a correction: Welford per element, exact
/// two-pass moments per block, blocks joined with Chan's formula.
struct VarFold {
    correction: f64,
    sqrt: bool,
}

impl<C: Real + Num> Fold<C> for VarFold {
    type Acc = (usize, C, C);
    type Out = C;
    #[inline]
    fn init(&self) -> (usize, C, C) {
        (0, C::ZERO, C::ZERO)
    }
    #[inline(always)]
    fn step(&self, (n, mean, m2): (usize, C, C), x: C, _: usize) -> (usize, C, C) {
        let n = n + 1;
        let d = x - mean;
        let mean = mean + d / C::from_f64c(n as f64);
        (n, mean, m2 + d * (x - mean))
    }
    #[inline]
    fn merge(&self, a: (usize, C, C), b: (usize, C, C)) -> (usize, C, C) {
        if a.0 == 0 {
            return b;
        }
        if b.0 == 0 {
            return a;
        }
        let n = a.0 + b.0;
        let (na, nb, nn) = (
            C::from_f64c(a.0 as f64),
            C::from_f64c(b.0 as f64),
            C::from_f64c(n as f64),
        );
        let d = b.1 - a.1;
        (n, a.1 + d * (nb / nn), a.2 + b.2 + d * d * (na * nb / nn))
    }
    #[inline]
    fn finish(&self, (n, _, m2): (usize, C, C), _: usize) -> C {
        let v = m2 / C::from_f64c((n as f64 - self.correction).max(0.0));
        if self.sqrt {
            v.sqrt()
        } else {
            v
        }
    }
    #[inline]
    fn fold(&self, acc: (usize, C, C), xs: &[C], _: usize) -> (usize, C, C) {
        xs.chunks(BLOCK).fold(acc, |a, b| {
            let mean = lane_sum(b) / C::from_f64c(b.len() as f64);
            let m2 = lane_reduce(b, C::ZERO, C::nadd, |x: C| (x - mean) * (x - mean));
            self.merge(a, (b.len(), mean, m2))
        })
    }
}

/// `log(sum(exp(x)))`: a running (max, scaled sum) pair; blocks subtract their max.
struct LseFold;

impl<C: FastExp> Fold<C> for LseFold {
    type Acc = (C, C);
    type Out = C;
    #[inline]
    fn init(&self) -> (C, C) {
        (C::neg_infinity(), C::ZERO)
    }
    #[inline(always)]
    fn step(&self, a: (C, C), x: C, _: usize) -> (C, C) {
        self.merge(a, (x, C::ONE))
    }
    #[inline]
    fn merge(&self, a: (C, C), b: (C, C)) -> (C, C) {
        if a.0.is_nan() || b.0.is_nan() {
            (C::nan(), C::ONE)
        } else if b.1 == C::ZERO {
            a
        } else if a.1 == C::ZERO || a.0 == b.0 {
            (b.0, a.1 + b.1)
        } else if a.0 > b.0 {
            (a.0, a.1 + b.1 * (b.0 - a.0).exp())
        } else {
            (b.0, b.1 + a.1 * (a.0 - b.0).exp())
        }
    }
    #[inline]
    fn finish(&self, (m, s): (C, C), _: usize) -> C {
        if m.is_nan() {
            m
        } else if s == C::ZERO || m == C::neg_infinity() {
            C::neg_infinity()
        } else {
            m + s.ln()
        }
    }
    #[inline]
    fn fold(&self, acc: (C, C), xs: &[C], _: usize) -> (C, C) {
        xs.chunks(BLOCK).fold(acc, |a, b| {
            let (m, s) = C::max_exp_sum(b);
            let part = if m.is_finite() {
                (m, s)
            } else {
                (m, C::from_f64c(b.len() as f64))
            };
            self.merge(a, part)
        })
    }
}

// ----- drivers ------------------------------------------------------------------------------

/// Run `task(0..n)` (each giving a run of results, `len` in all) in order; in parallel
/// when the total `work` is large. [`Error::OutOfMemory`] when the results (or a task's
/// buffers) cannot be allocated.
pub(crate) fn run_tasks<R: Send>(
    n: usize,
    work: usize,
    len: usize,
    task: impl Fn(usize) -> Result<Vec<R>> + Sync + Send,
) -> Result<Vec<R>> {
    let mut out = amp_tensor::pool::try_with_capacity(len)?;
    if work >= PAR_MIN && n > 1 {
        let parts: Vec<Vec<R>> = amp_tensor::parallel::map(n, &task)
            .into_iter()
            .collect::<Result<_>>()?;
        out.extend(parts.into_iter().flatten());
    } else {
        for t in 0..n {
            out.extend(task(t)?);
        }
    }
    Ok(out)
}

/// Fold the storage elements `xs` (first index `base`) into `acc`.
#[inline]
fn fold_widened<T: Element, N: Num, F: Fold<N>>(
    f: &F,
    acc: F::Acc,
    xs: &[T],
    base: usize,
) -> F::Acc {
    let mut acc = acc;
    for_widened::<T, N>(xs, |c, off| acc = f.fold(acc, c, base + off));
    acc
}

/// Reduce each contiguous row of `src` (`outer` rows of `red` elements).
fn reduce_rows<T: Element, N: Num, F: Fold<N>>(
    src: &[T],
    outer: usize,
    red: usize,
    f: &F,
) -> Result<Vec<F::Out>> {
    let row = |o: usize| &src[o * red..(o + 1) * red];
    if red >= 2 * SEG {
        return amp_tensor::pool::try_collect(
            outer,
            (0..outer).map(|o| {
                let r = row(o);
                let parts: Vec<F::Acc> = amp_tensor::parallel::map(red.div_ceil(SEG), &|k| {
                    let seg = &r[k * SEG..((k + 1) * SEG).min(red)];
                    fold_widened::<T, N, F>(f, f.init(), seg, k * SEG)
                });
                let acc = parts.into_iter().fold(f.init(), |a, b| f.merge(a, b));
                f.finish(acc, red)
            }),
        );
    }
    let per = (TASK / red.max(1)).max(1);
    run_tasks(outer.div_ceil(per), outer * red, outer, |t| {
        Ok((t * per..((t + 1) * per).min(outer))
            .map(|o| f.finish(fold_widened::<T, N, F>(f, f.init(), row(o), 0), red))
            .collect())
    })
}

/// Merge `part` into `acc` column by column and reset `part`.
fn merge_into<N: Copy, F: Fold<N>>(f: &F, acc: &mut [F::Acc], part: &mut [F::Acc]) {
    for (a, p) in acc.iter_mut().zip(part.iter_mut()) {
        *a = f.merge(*a, *p);
        *p = f.init();
    }
}

/// Accumulate rows `rows` of the `[outer, red, inner]` source into the columns
/// `j0..j0 + w` of output row `o`.
fn reduce_col_block<T: Element, N: Num, F: Fold<N>>(
    f: &F,
    src: &[T],
    (o, j0, w): (usize, usize, usize),
    rows: Range<usize>,
    (red, inner): (usize, usize),
) -> Vec<F::Acc> {
    let mut acc = vec![f.init(); w];
    let mut part = acc.clone();
    let mut buf = vec![N::default(); if as_same::<T, N>(&[]).is_some() { 0 } else { w }];
    let mut pending = 0;
    for r in rows {
        let row = &src[(o * red + r) * inner + j0..][..w];
        match as_same::<T, N>(row) {
            Some(s) => f.step_row(&mut part, s, r),
            None => {
                cast_into(row, &mut buf);
                f.step_row(&mut part, &buf, r);
            }
        }
        pending += 1;
        if pending == RBLK {
            merge_into(f, &mut acc, &mut part);
            pending = 0;
        }
    }
    if pending > 0 {
        merge_into(f, &mut acc, &mut part);
    }
    acc
}

/// Reduce the middle dim of the `[outer, red, inner]` source (`inner > 1`): blocks of
/// output columns accumulate whole input rows; tall inputs split the rows into
/// segments merged in order.
fn reduce_cols<T: Element, N: Num, F: Fold<N>>(
    src: &[T],
    outer: usize,
    red: usize,
    inner: usize,
    f: &F,
) -> Result<Vec<F::Out>> {
    let nb = inner.div_ceil(COL_W);
    let blocks = outer * nb;
    let width = inner.min(COL_W);
    let nseg = if blocks >= 8 {
        1
    } else {
        (red * width).div_ceil(SEG).clamp(1, 64)
    };
    let seg = red.div_ceil(nseg).max(1);
    let nseg = red.div_ceil(seg).max(1);
    let tasks = blocks * nseg;
    let parts: Vec<Vec<F::Acc>> = run_tasks(tasks, outer * red * inner, tasks, |t| {
        let (ob, s) = (t / nseg, t % nseg);
        let (o, j0) = (ob / nb, (ob % nb) * COL_W);
        let w = COL_W.min(inner - j0);
        let rows = s * seg..((s + 1) * seg).min(red);
        Ok(vec![reduce_col_block::<T, N, F>(
            f,
            src,
            (o, j0, w),
            rows,
            (red, inner),
        )])
    })?;
    let mut out = amp_tensor::pool::try_with_capacity(outer * inner)?;
    for group in parts.chunks(nseg) {
        let mut acc = group[0].clone();
        for p in &group[1..] {
            for (a, &b) in acc.iter_mut().zip(p) {
                *a = f.merge(*a, b);
            }
        }
        out.extend(acc.into_iter().map(|a| f.finish(a, red)));
    }
    Ok(out)
}

/// Fold a whole slice with `f` (one output).
#[inline]
pub(crate) fn fold_slice<N: Num, F: Fold<N>>(f: &F, xs: &[N]) -> F::Out {
    f.finish(f.fold(f.init(), xs, 0), xs.len())
}

// ----- plans ------------------------------------------------------------------------------

/// Which dims a reduction over `dims` (empty = all) of a rank-`rank` tensor reduces.
fn reduce_mask(op: &'static str, rank: usize, dims: &[i64]) -> Result<Vec<bool>> {
    if dims.is_empty() {
        return Ok(vec![true; rank]);
    }
    let mut mask = vec![false; rank];
    for &d in dims {
        let i = wrap_dim(d, rank)?;
        ensure!(
            !(rank > 0 && std::mem::replace(&mut mask[i], true)),
            invalid(op, "dim {i} appears multiple times in the list of dims")
        );
    }
    Ok(mask)
}

/// How one reduction runs: a contiguous source seen as `[outer, red, inner]`, and how
/// its `outer * inner` results become the output tensor.
pub(crate) struct Plan {
    src: Tensor,
    outer: usize,
    red: usize,
    inner: usize,
    /// Sizes of the kept dims in the order the results come out.
    out_dims: Vec<usize>,
    /// Permutation bringing the results back to the original dim order, if needed.
    restore: Option<Vec<usize>>,
    /// The output shape (with or without the kept size-1 dims).
    shape: Vec<usize>,
}

impl Plan {
    /// Plan a reduction of `x` over `dims` (empty = all; negative wrap).
    pub(crate) fn new(op: &'static str, x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Plan> {
        let mask = reduce_mask(op, x.rank(), dims)?;
        Self::from_mask(x, &mask, keepdim)
    }

    /// Plan a reduction of `x` over the dims flagged in `mask`.
    pub(crate) fn from_mask(x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Plan> {
        let rank = x.rank();
        let dims = x.dims().to_vec();
        let identity: Vec<usize> = (0..rank).collect();
        // Walk the dims in storage order when that makes the input contiguous (a
        // transposed input needs no copy); else copy it once.
        let (src, order) = if x.is_contiguous() {
            (x.clone(), identity)
        } else {
            let mut order = identity.clone();
            order.sort_by(|&a, &b| x.strides()[b].cmp(&x.strides()[a]));
            let p = x.permute(&order)?;
            if p.is_contiguous() {
                (p, order)
            } else {
                (x.try_contiguous()?, identity)
            }
        };
        let mut groups: Vec<(usize, bool)> = Vec::new();
        for &a in &order {
            if dims[a] == 1 {
                continue;
            }
            match groups.last_mut() {
                Some(g) if g.1 == mask[a] => g.0 *= dims[a],
                _ => groups.push((dims[a], mask[a])),
            }
        }
        let kept: Vec<usize> = order.iter().copied().filter(|&a| !mask[a]).collect();
        let (src, outer, red, inner) = match groups[..] {
            [] => (src, 1, 1, 1),
            [(r, true)] => (src, 1, r, 1),
            [(k, false)] => (src, k, 1, 1),
            [(k, false), (r, true)] => (src, k, r, 1),
            [(r, true), (k, false)] => (src, 1, r, k),
            [(k0, false), (r, true), (k1, false)] => (src, k0, r, k1),
            _ => {
                let perm: Vec<usize> = kept
                    .iter()
                    .copied()
                    .chain(order.iter().copied().filter(|&a| mask[a]))
                    .collect();
                let k = kept.iter().map(|&a| dims[a]).product();
                let r = (0..rank).filter(|&a| mask[a]).map(|a| dims[a]).product();
                (x.permute(&perm)?.try_contiguous()?, k, r, 1)
            }
        };
        let out_dims: Vec<usize> = kept.iter().map(|&a| dims[a]).collect();
        let restore = (!kept.windows(2).all(|w| w[0] < w[1])).then(|| {
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            sorted
                .iter()
                .map(|a| kept.iter().position(|b| b == a).expect("kept dim"))
                .collect()
        });
        let shape = if keepdim {
            (0..rank)
                .map(|a| if mask[a] { 1 } else { dims[a] })
                .collect()
        } else {
            (0..rank).filter(|&a| !mask[a]).map(|a| dims[a]).collect()
        };
        Ok(Plan {
            src,
            outer,
            red,
            inner,
            out_dims,
            restore,
            shape,
        })
    }

    /// Number of elements each output reduces.
    pub(crate) fn reduced(&self) -> usize {
        self.red
    }

    /// Number of outputs.
    pub(crate) fn outputs(&self) -> usize {
        self.outer * self.inner
    }

    /// Run fold `f` over storage `T` accumulating in `N`; one result per output.
    pub(crate) fn run<T: Element, N: Num, F: Fold<N>>(&self, f: &F) -> Result<Vec<F::Out>> {
        with_slice::<T, _>(&self.src, |s| {
            if self.inner == 1 {
                reduce_rows::<T, N, F>(s, self.outer, self.red, f)
            } else {
                reduce_cols::<T, N, F>(s, self.outer, self.red, self.inner, f)
            }
        })?
    }

    /// The output tensor holding results `v` (in the order [`Plan::run`] gives them).
    pub(crate) fn output<U: Element>(&self, v: Vec<U>) -> Result<Tensor> {
        let v = match &self.restore {
            Some(perm) => gather_cast::<U, U>(
                &v,
                &Layout::contiguous(self.out_dims.clone()).permute(perm)?,
            )?,
            None => v,
        };
        Tensor::from_vec(v, self.shape.clone())
    }
}

// ----- helpers for the public ops -----------------------------------------------------------

/// `x` cast to `dtype` when one is given.
pub(crate) fn cast_opt(x: &Tensor, dtype: Option<DType>) -> Result<Tensor> {
    match dtype {
        Some(d) => x.to_dtype(d),
        None => Ok(x.clone()),
    }
}

/// int64 for integer and bool dtypes, the dtype itself for floats.
fn long_if_int(d: DType) -> DType {
    if d.is_floating_point() {
        d
    } else {
        DType::I64
    }
}

/// `(outer, n, inner)` of `x` around `dim` (a 0-dim tensor is one line of one element).
pub(crate) fn line_geometry(x: &Tensor, dim: i64) -> Result<(usize, usize, usize)> {
    let d = wrap_dim(dim, x.rank())?;
    if x.rank() == 0 {
        return Ok((1, 1, 1));
    }
    let dims = x.dims();
    Ok((
        dims[..d].iter().product(),
        dims[d],
        dims[d + 1..].iter().product(),
    ))
}

/// Fail as PyTorch does when a reduction without identity meets an empty input:
/// `dims` empty means all dims.
fn check_nonempty(op: &'static str, name: &str, x: &Tensor, dims: &[i64]) -> Result<()> {
    if x.elem_count() != 0 {
        return Ok(());
    }
    ensure!(!dims.is_empty(), invalid(op, "{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument."));
    let mask = reduce_mask(op, x.rank(), dims)?;
    if let Some(d) = (0..x.rank()).find(|&a| mask[a] && x.dims()[a] == 0) {
        return Err(Error::invalid(
            op,
            format!("{name}(): Expected reduction dim {d} to have non-zero size."),
        ));
    }
    Ok(())
}

// ----- sum, mean, prod ------------------------------------------------------------------------

/// Sum over `dims` (empty = all; negative dims wrap), keeping reduced dims as size 1
/// when `keepdim`. With `dtype` the input is cast to it first; without, integer and
/// bool inputs sum to int64. f16/bf16 accumulate in f32 and round once.
pub fn sum(x: &Tensor, dims: &[i64], keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    let x = cast_opt(x, dtype)?;
    let out_dtype = dtype.unwrap_or_else(|| long_if_int(x.dtype()));
    // On a device a float sum is one reduction in its own dtype: the kernels load a
    // 16-bit input into float32 sums and round once on the way out, the bits of a float32
    // sum cast down, without the two casts around it (a bias gradient under autocast).
    if x.dtype().is_floating_point() {
        crate::compute::on_device!("sum", [&x], {
            let mask = reduce_mask("sum", x.rank(), dims)?;
            crate::cuda::route::reduce("sum", &x, &mask, keepdim)
        });
    }
    sum_accumulated(&x, dims, keepdim)?.to_dtype(out_dtype)
}

/// Sum over `dims` left in the accumulation type (float32 for f16/bf16, int64 for
/// integers), not rounded: partial sums that are summed again before one rounding.
pub(crate) fn sum_accumulated(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    crate::compute::on_device!("sum", [x], {
        let mask = reduce_mask("sum", x.rank(), dims)?;
        let wide = x.to_dtype(crate::cuda::route::compute_dtype(x.dtype()))?;
        crate::cuda::route::reduce("sum", &wide, &mask, keepdim)
    });
    let plan = Plan::new("sum", x, dims, keepdim)?;
    num_kernel!(x.dtype(), |T, N| plan
        .output(plan.run::<T, N, _>(&sum_fold::<N>())?))
}

/// Mean over `dims` (empty = all). Integer inputs need a floating `dtype` (the input is
/// cast to it first), as in PyTorch.
pub fn mean(x: &Tensor, dims: &[i64], keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    let (what, d) = match dtype {
        Some(d) => ("Optional", d),
        None => ("Input", x.dtype()),
    };
    ensure!(d.is_floating_point(), invalid("mean", "mean(): could not infer output dtype. {what} dtype must be either a floating point or complex dtype. Got: {}", d.scalar_type_name()));
    let x = cast_opt(x, dtype)?;
    crate::compute::on_device!("mean", [&x], {
        let mask = reduce_mask("mean", x.rank(), dims)?;
        crate::cuda::route::reduce("mean", &x, &mask, keepdim)
    });
    let plan = Plan::new("mean", &x, dims, keepdim)?;
    float_kernel!(x.dtype(), "mean", |T, C| {
        plan.output(plan.run::<T, C, _>(&MeanFold)?)?
            .to_dtype(x.dtype())
    })
}

/// Product over `dim` (all dims when `None`). Integer and bool inputs give int64 unless
/// `dtype` is given (the input is cast to it first).
pub fn prod(x: &Tensor, dim: Option<i64>, keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    let x = cast_opt(x, dtype)?;
    let out_dtype = dtype.unwrap_or_else(|| long_if_int(x.dtype()));
    let dims: Vec<i64> = dim.into_iter().collect();
    let plan = Plan::new("prod", &x, &dims, keepdim)?;
    let out = num_kernel!(x.dtype(), |T, N| plan
        .output(plan.run::<T, N, _>(&ProdFold)?)?);
    out.to_dtype(out_dtype)
}

// ----- max / min ----------------------------------------------------------------------------

fn extreme(op: &'static str, x: &Tensor, dims: &[i64], keepdim: bool, max: bool) -> Result<Tensor> {
    check_nonempty(op, op, x, dims)?;
    crate::compute::on_device!(op, [x], {
        let mask = reduce_mask(op, x.rank(), dims)?;
        crate::cuda::route::reduce(if max { "max" } else { "min" }, x, &mask, keepdim)
    });
    let plan = Plan::new(op, x, dims, keepdim)?;
    num_kernel!(x.dtype(), |T, N| {
        let v = if max {
            plan.run::<T, N, _>(&Extreme::<true, _>(identity::<N>))?
        } else {
            plan.run::<T, N, _>(&Extreme::<false, _>(identity::<N>))?
        };
        plan.output(v)?.to_dtype(x.dtype())
    })
}

/// The largest element as a 0-dim tensor (NaN if any element is NaN); an empty input
/// is an error.
pub fn max_all(x: &Tensor) -> Result<Tensor> {
    check_nonempty("max", "max", x, &[])?;
    extreme("max", x, &[], false, true)
}

/// The smallest element as a 0-dim tensor (NaN if any element is NaN); an empty input
/// is an error.
pub fn min_all(x: &Tensor) -> Result<Tensor> {
    check_nonempty("min", "min", x, &[])?;
    extreme("min", x, &[], false, false)
}

/// Maximum over `dims` (empty = all), NaN-propagating; the input's dtype.
pub fn amax(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    extreme("amax", x, dims, keepdim, true)
}

/// Minimum over `dims` (empty = all), NaN-propagating; the input's dtype.
pub fn amin(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    extreme("amin", x, dims, keepdim, false)
}

fn extreme_dim(
    op: &'static str,
    x: &Tensor,
    dim: i64,
    keepdim: bool,
    max: bool,
) -> Result<(Tensor, Tensor)> {
    check_nonempty(op, op, x, &[dim])?;
    let plan = Plan::new(op, x, &[dim], keepdim)?;
    num_kernel!(x.dtype(), |T, N| {
        let v: Vec<(N, i64)> = if max {
            plan.run::<T, N, _>(&ArgFold::<true>)?
        } else {
            plan.run::<T, N, _>(&ArgFold::<false>)?
        };
        let mut split: (Vec<N>, Vec<i64>) = (
            amp_tensor::pool::try_with_capacity(v.len())?,
            amp_tensor::pool::try_with_capacity(v.len())?,
        );
        split.extend(v);
        let (vals, idx) = split;
        Ok((plan.output(vals)?.to_dtype(x.dtype())?, plan.output(idx)?))
    })
}

/// `(values, indices)` of the maximum along `dim`: the index of the first occurrence,
/// or of the first NaN (whose value is then NaN). Indices are int64.
pub fn max_dim(x: &Tensor, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    extreme_dim("max", x, dim, keepdim, true)
}

/// `(values, indices)` of the minimum along `dim` (first occurrence; NaN wins).
pub fn min_dim(x: &Tensor, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    extreme_dim("min", x, dim, keepdim, false)
}

fn arg_extreme(
    op: &'static str,
    x: &Tensor,
    dim: Option<i64>,
    keepdim: bool,
    max: bool,
) -> Result<Tensor> {
    match dim {
        Some(d) => Ok(extreme_dim(op, x, d, keepdim, max)?.1),
        None => {
            check_nonempty(op, op, x, &[])?;
            let flat = x.reshape([x.elem_count()])?;
            let i = extreme_dim(op, &flat, 0, false, max)?.1.item::<i64>()?;
            let shape = if keepdim { vec![1; x.rank()] } else { vec![] };
            Tensor::from_vec(vec![i], shape)
        }
    }
}

/// Index (int64) of the maximum along `dim`, or into the flattened input when `None`
/// (first occurrence; the first NaN wins).
pub fn argmax(x: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    arg_extreme("argmax", x, dim, keepdim, true)
}

/// Index (int64) of the minimum along `dim`, or into the flattened input when `None`.
pub fn argmin(x: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    arg_extreme("argmin", x, dim, keepdim, false)
}

// ----- norms, logsumexp, moments --------------------------------------------------------

/// The vector `p`-norm of a slice (`p` = 0 counts non-zeros, ±inf take the max/min
/// magnitude, 2 is overflow- and underflow-safe).
pub(crate) fn vector_norm<C: BlueConst>(xs: &[C], p: f64) -> C {
    if p == 0.0 {
        fold_slice(
            &MapSum(|v: C| if v != C::ZERO { C::ONE } else { C::ZERO }),
            xs,
        )
    } else if p == 1.0 {
        fold_slice(&MapSum(|v: C| v.abs()), xs)
    } else if p == 2.0 {
        fold_slice(&L2Fold, xs)
    } else if p == f64::INFINITY {
        fold_slice(&Extreme::<true, _>(|v: C| v.abs()), xs)
    } else if p == f64::NEG_INFINITY {
        fold_slice(&Extreme::<false, _>(|v: C| v.abs()), xs)
    } else {
        let pc = C::from_f64c(p);
        fold_slice(&MapSum(move |v: C| v.abs().powf(pc)), xs).powf(C::from_f64c(1.0 / p))
    }
}

/// Check the arguments of a vector norm.
pub(crate) fn check_norm(op: &'static str, x: &Tensor, p: f64) -> Result<()> {
    ensure!(
        x.dtype().is_floating_point(),
        invalid(
            op,
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
            x.dtype().scalar_type_name()
        )
    );
    ensure!(
        !p.is_nan(),
        invalid(op, "the order p of a norm must not be NaN")
    );
    Ok(())
}

/// Vector `p`-norm over `dims` (empty = all): `p = 0` counts non-zeros, `1` sums
/// magnitudes, `2` is computed with Blue's scaled accumulation (no overflow or
/// underflow in the compute type), `±inf` take the largest/smallest magnitude, any
/// other `p` is `sum(|x|^p)^(1/p)`. Floating inputs only; NaN propagates.
pub fn norm(x: &Tensor, p: f64, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    check_norm("norm", x, p)?;
    let plan = Plan::new("norm", x, dims, keepdim)?;
    ensure!(!(p.is_infinite() && plan.reduced() == 0 && plan.outputs() > 0), invalid("norm", "linalg.vector_norm cannot compute the {p} norm on an empty tensor because the operation does not have an identity"));
    crate::compute::on_device!("norm", [x], {
        let mask = reduce_mask("norm", x.rank(), dims)?;
        crate::cuda::route::norm(x, p, &mask, keepdim)
    });
    float_kernel!(x.dtype(), "norm", |T, C| {
        let v: Vec<C> = if p == 0.0 {
            plan.run::<T, C, _>(&MapSum(|v: C| if v != 0.0 { 1.0 } else { 0.0 }))?
        } else if p == 1.0 {
            plan.run::<T, C, _>(&MapSum(|v: C| v.abs()))?
        } else if p == 2.0 {
            plan.run::<T, C, _>(&L2Fold)?
        } else if p == f64::INFINITY {
            plan.run::<T, C, _>(&Extreme::<true, _>(|v: C| v.abs()))?
        } else if p == f64::NEG_INFINITY {
            plan.run::<T, C, _>(&Extreme::<false, _>(|v: C| v.abs()))?
        } else {
            let (pc, inv) = (p as C, (1.0 / p) as C);
            let mut v = plan.run::<T, C, _>(&MapSum(move |v: C| v.abs().powf(pc)))?;
            v.iter_mut().for_each(|s| *s = s.powf(inv));
            v
        };
        plan.output(v)?.to_dtype(x.dtype())
    })
}

/// `log(sum(exp(x)))` over `dims` (empty = all), computed stably (the maximum is
/// subtracted); all -inf (or empty) gives -inf, +inf gives +inf, NaN propagates.
/// Integer inputs are computed in float32.
pub fn logsumexp(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    let x = if x.dtype().is_floating_point() {
        x.clone()
    } else {
        x.to_dtype(DType::F32)?
    };
    let plan = Plan::new("logsumexp", &x, dims, keepdim)?;
    float_kernel!(x.dtype(), "logsumexp", |T, C| {
        plan.output(plan.run::<T, C, _>(&LseFold)?)?
            .to_dtype(x.dtype())
    })
}

fn moments(
    op: &'static str,
    x: &Tensor,
    dims: &[i64],
    correction: f64,
    keepdim: bool,
    sqrt: bool,
) -> Result<Tensor> {
    ensure!(
        x.dtype().is_floating_point(),
        invalid(
            op,
            "std and var only support floating point and complex dtypes (got {})",
            x.dtype().scalar_type_name()
        )
    );
    let plan = Plan::new(op, x, dims, keepdim)?;
    let f = VarFold { correction, sqrt };
    float_kernel!(x.dtype(), op, |T, C| plan
        .output(plan.run::<T, C, _>(&f)?)?
        .to_dtype(x.dtype()))
}

/// Variance over `dims` (empty = all): `sum((x - mean)^2) / max(0, n - correction)`
/// (PyTorch's default correction is 1). Floating inputs only.
pub fn var(x: &Tensor, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
    moments("var", x, dims, correction, keepdim, false)
}

/// Standard deviation over `dims` (the square root of [`var`]).
pub fn std(x: &Tensor, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
    moments("std", x, dims, correction, keepdim, true)
}

// ----- line ops and scans ---------------------------------------------------------------------

/// Apply `f` to every line along the middle dim of `[outer, n, inner]` sources (all of
/// storage type `T`, converted to `N`), producing the same-shaped output. Lines along
/// the last dim are processed in place (rows in parallel when large); other dims are
/// transposed in [`TILE`]-column tiles.
pub(crate) fn map_lines<T: Element, N: Element>(
    ins: &[&[T]],
    (outer, n, inner): (usize, usize, usize),
    f: impl Fn(&[&[N]], &mut [N]) + Sync + Send,
) -> Result<Vec<T>> {
    let total = outer * n * inner;
    if total == 0 {
        return Ok(Vec::new());
    }
    if inner == 1 {
        map_rows(ins, outer, n, f)
    } else {
        map_cols(ins, (outer, n, inner), f)
    }
}

/// Run `body(r0, block)` over blocks of whole rows of `out` (`rows` rows of `n`
/// elements; `r0` is the block's first row): blocks of [`rows_per_task`] rows taken by
/// the threads as they come when there are at least [`LINE_PAR_MIN`] elements, else one
/// block on the calling thread ([`map_lines`]' split).
pub(crate) fn for_row_blocks<T: Send>(
    out: &mut [T],
    rows: usize,
    n: usize,
    body: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    if rows > 1 && rows * n >= LINE_PAR_MIN {
        let per = rows_per_task(rows, n);
        amp_tensor::parallel::for_each_chunk_mut(out, per * n, &|c, chunk| body(c * per, chunk));
    } else {
        body(0, out);
    }
}

fn map_rows<T: Element, N: Element>(
    ins: &[&[T]],
    rows: usize,
    n: usize,
    f: impl Fn(&[&[N]], &mut [N]) + Sync + Send,
) -> Result<Vec<T>> {
    const MAX_INS: usize = 4;
    assert!(ins.len() <= MAX_INS, "map_rows: at most {MAX_INS} inputs");
    let same = as_same::<T, N>(&[]).is_some();
    // Every row is written in full, so a recycled buffer (already mapped pages) serves.
    let mut out = amp_tensor::pool::try_recycled_vec::<T>(rows * n)?;
    // Rows `r0..` of `chunk`, with widening scratch allocated once per block.
    let body = |r0: usize, chunk: &mut [T]| {
        let scratch = if same { 0 } else { n };
        let mut bufs: [Vec<N>; MAX_INS] =
            std::array::from_fn(|i| vec![N::default(); if i < ins.len() { scratch } else { 0 }]);
        let mut obuf = vec![N::default(); scratch];
        for (k, orow) in chunk.chunks_mut(n).enumerate() {
            let r = r0 + k;
            let mut lines: [&[N]; MAX_INS] = [&[]; MAX_INS];
            for ((l, s), b) in lines.iter_mut().zip(ins).zip(bufs.iter_mut()) {
                let s = &s[r * n..(r + 1) * n];
                *l = match as_same::<T, N>(s) {
                    Some(v) => v,
                    None => {
                        cast_into(s, b);
                        &b[..]
                    }
                };
            }
            let lines = &lines[..ins.len()];
            match as_same_mut::<T, N>(orow) {
                Some(o) => f(lines, o),
                None => {
                    f(lines, &mut obuf);
                    cast_into(&obuf, orow);
                }
            }
        }
    };
    for_row_blocks(&mut out, rows, n, &body);
    Ok(out)
}

/// `dst[c * ds + r] = src[r * ss + c]` (cast) for `r < rows`, `c < cols`, through
/// 8×8 blocks held locally, so power-of-two strides do not thrash the cache: each
/// block reads 8 short rows and writes 8 short contiguous runs.
fn transpose_into<S: Element, D: Element>(
    src: &[S],
    ss: usize,
    dst: &mut [D],
    ds: usize,
    (rows, cols): (usize, usize),
) {
    const B: usize = 8;
    let mut blk = [[D::default(); B]; B];
    for r0 in (0..rows).step_by(B) {
        let rn = B.min(rows - r0);
        for c0 in (0..cols).step_by(B) {
            let cn = B.min(cols - c0);
            for r in 0..rn {
                let row = &src[(r0 + r) * ss + c0..][..cn];
                for (b, &v) in blk.iter_mut().zip(row) {
                    b[r] = v.cast();
                }
            }
            for (c, b) in blk.iter().enumerate().take(cn) {
                let d = &mut dst[(c0 + c) * ds + r0..];
                if rn == B {
                    // a fixed-size copy: plain moves rather than a memcpy call
                    let d: &mut [D; B] = (&mut d[..B]).try_into().expect("B elements");
                    *d = *b;
                } else {
                    d[..rn].copy_from_slice(&b[..rn]);
                }
            }
        }
    }
}

fn map_cols<T: Element, N: Element>(
    ins: &[&[T]],
    (outer, n, inner): (usize, usize, usize),
    f: impl Fn(&[&[N]], &mut [N]) + Sync + Send,
) -> Result<Vec<T>> {
    // Tiles of `w` columns, transposed so each line is contiguous (at most TILE_ELEMS
    // elements per input, so a tile stays in cache).
    const TILE_ELEMS: usize = 1 << 15;
    let w_max = (TILE_ELEMS / n).clamp(TILE, 16 * TILE) / TILE * TILE;
    let nb = inner.div_ceil(w_max);
    let total = outer * n * inner;
    let tiles: Vec<Vec<N>> = run_tasks(outer * nb, total, outer * nb, |t| {
        let (o, j0) = (t / nb, (t % nb) * w_max);
        let w = w_max.min(inner - j0);
        let bufs: Vec<Vec<N>> = ins
            .iter()
            .map(|s| {
                let mut buf = amp_tensor::pool::try_zeroed::<N>(w * n)?;
                transpose_into(&s[o * n * inner + j0..], inner, &mut buf, n, (n, w));
                Ok(buf)
            })
            .collect::<Result<_>>()?;
        let mut res = amp_tensor::pool::try_zeroed::<N>(w * n)?;
        for (jj, line) in res.chunks_mut(n).enumerate() {
            let lines: Vec<&[N]> = bufs.iter().map(|b| &b[jj * n..(jj + 1) * n]).collect();
            f(&lines, line);
        }
        Ok(vec![res])
    })?;
    // Transpose the tiles back, a block of rows per task.
    let mut out = amp_tensor::pool::try_zeroed::<T>(total)?;
    let rows_per = (TASK / inner).max(TILE);
    let scatter = |(c, chunk): (usize, &mut [T])| {
        let q_end = c * rows_per + chunk.len() / inner;
        let mut q = c * rows_per;
        while q < q_end {
            let o = q / n;
            let run = ((o + 1) * n).min(q_end) - q;
            let dst = &mut chunk[(q - c * rows_per) * inner..];
            for (b, tile) in tiles[o * nb..(o + 1) * nb].iter().enumerate() {
                let j0 = b * w_max;
                let w = w_max.min(inner - j0);
                transpose_into(&tile[q - o * n..], n, &mut dst[j0..], inner, (w, run));
            }
            q += run;
        }
    };
    if total >= PAR_MIN {
        amp_tensor::parallel::for_each_chunk_mut(&mut out, rows_per * inner, &|c, chunk| {
            scatter((c, chunk))
        });
    } else {
        out.chunks_mut(rows_per * inner)
            .enumerate()
            .for_each(scatter);
    }
    Ok(out)
}

fn scan(x: &Tensor, dim: i64, dtype: Option<DType>, mul: bool) -> Result<Tensor> {
    let x = match dtype {
        Some(d) => x.to_dtype(d)?,
        None => x.to_dtype(long_if_int(x.dtype()))?,
    };
    let geom = line_geometry(&x, dim)?;
    let xc = x.try_contiguous()?;
    num_kernel!(x.dtype(), |T, N| {
        let out = with_slice::<T, _>(&xc, |s| {
            map_lines::<T, N>(&[s], geom, |ins, out| {
                out.copy_from_slice(ins[0]);
                if mul {
                    N::cumprod(out)
                } else {
                    N::cumsum(out)
                }
            })
        })??;
        Tensor::from_vec(out, x.dims())
    })
}

/// Running sum along `dim`. With `dtype` the input is cast to it first; without,
/// integer and bool inputs give int64. Floats accumulate in f64 (as PyTorch's CPU scan
/// does for float32) and each output is rounded once to the result dtype.
pub fn cumsum(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    scan(x, dim, dtype, false)
}

/// Running product along `dim` (dtype rules as [`cumsum`]).
pub fn cumprod(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    scan(x, dim, dtype, true)
}
