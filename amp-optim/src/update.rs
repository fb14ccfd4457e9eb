//! In-place elementwise updates of parameters and state, computed in float64 for float64
//! parameters and in float32 for every other dtype (PyTorch's "opmath" type), whatever the
//! parameter's storage dtype.

use std::ops::Range;

use amp_autograd::Tensor;
use amp_tensor::parallel::SendPtr;
use amp_tensor::{scatter_cast, with_dtype, DType, Element, Layout, Tensor as Raw};

use crate::Result;

/// The compute type of an update: `f32` or `f64`.
pub(crate) trait Real:
    Element
    + num_traits::Float
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
{
    /// `v` rounded to this type.
    fn of(v: f64) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn of(v: f64) -> f32 {
        v as f32
    }
}

impl Real for f64 {
    #[inline(always)]
    fn of(v: f64) -> f64 {
        v
    }
}

/// Tensors at least this long are updated by several threads, in parts of
/// [`amp_tensor::parallel::part_len`] ([`amp_tensor::parallel::for_each`]'s fork-join
/// costs well under a microsecond; rayon's parallel iterators, used before, handed each
/// call to the pool and put the caller to sleep, tens of microseconds, so they started
/// at 256K elements). Each element is computed the same way whatever the split.
const PARALLEL_MIN: usize = 1 << 15;

/// `body(range)` over `0..len`: in disjoint ranges on several threads when `len` is at
/// least [`PARALLEL_MIN`], else as one range on the calling thread.
fn split(len: usize, body: &(dyn Fn(Range<usize>) + Sync)) {
    if len < PARALLEL_MIN {
        return body(0..len);
    }
    let per = amp_tensor::parallel::part_len(len, PARALLEL_MIN);
    amp_tensor::parallel::for_each(len.div_ceil(per), &|i| {
        body(i * per..((i + 1) * per).min(len))
    });
}

/// The elements `r` of the buffer `p` points into.
///
/// # Safety
/// `r` lies inside that buffer, which outlives the returned slice, and no other live
/// reference reaches the elements `r` (the ranges [`split`] hands out are disjoint).
unsafe fn part<'a, F>(p: SendPtr<F>, r: Range<usize>) -> &'a mut [F] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(p.at(r.start), r.len()) }
}

/// `f()` compiled with FMA where the CPU has it, so that the `mul_add`s it inlines are
/// one instruction each (elsewhere each is a libm `fma` call; the bits are the same).
#[inline(always)]
pub(crate) fn with_fma<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "fma")]
        unsafe fn on_fma<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked just above).
            return unsafe { on_fma(f) };
        }
    }
    f()
}

/// `p += a * d` elementwise, one rounding: PyTorch's CPU `p.add_(d, alpha=a)` is
/// `fmadd(d, a, p)`.
pub(crate) fn axpy<F: Real>(p: &mut [F], d: &[F], a: F) {
    assert_eq!(p.len(), d.len(), "axpy: length mismatch");
    let pp = SendPtr(p.as_mut_ptr());
    split(p.len(), &|r| {
        // SAFETY: `r` is one of `split`'s disjoint ranges of `p`, borrowed for the call.
        let p = unsafe { part(pp, r.clone()) };
        with_fma(|| {
            p.iter_mut()
                .zip(&d[r])
                .for_each(|(p, &d)| *p = d.mul_add(a, *p))
        })
    });
}

/// `f(p[i], g[i], b[i])` for every element (a fused optimizer step with one state buffer),
/// compiled with FMA where the CPU has it.
pub(crate) fn zip3<F: Real>(
    p: &mut [F],
    g: &[F],
    b: &mut [F],
    f: impl Fn(&mut F, F, &mut F) + Sync,
) {
    assert!(
        p.len() == g.len() && p.len() == b.len(),
        "zip3: length mismatch"
    );
    let (pp, pb) = (SendPtr(p.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
    split(p.len(), &|r| {
        // SAFETY: `r` is one of `split`'s disjoint ranges of `p` and `b` (same length,
        // two distinct buffers, both borrowed mutably for the call).
        let (p, b) = unsafe { (part(pp, r.clone()), part(pb, r.clone())) };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked just above).
            return unsafe { each3_fma(p, &g[r], b, &f) };
        }
        each3(p, &g[r], b, &f)
    });
}

/// The loop of [`zip3`], `#[inline(always)]` so that it is compiled inside
/// [`each3_fma`] (passed to [`with_fma`] inside a closure, the loop of [`zip4`] was not
/// inlined there, and each of its `mul_add`s became a libm call: AdamW 12× slower).
#[inline(always)]
fn each3<F: Copy>(p: &mut [F], g: &[F], b: &mut [F], f: &impl Fn(&mut F, F, &mut F)) {
    for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
        f(p, g, b)
    }
}

/// [`each3`] compiled with FMA.
///
/// # Safety
/// The CPU has FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn each3_fma<F: Copy>(p: &mut [F], g: &[F], b: &mut [F], f: &impl Fn(&mut F, F, &mut F)) {
    each3(p, g, b, f)
}

/// One element's step of [`zip4`], `#[inline(always)]` so that it lands inside the FMA
/// loop (a closure holding a whole Adam step was not inlined there).
pub(crate) trait Step4<F>: Sync {
    /// Updates `p`, `m` and `v` from `g`.
    fn step(&self, p: &mut F, g: F, m: &mut F, v: &mut F);
}

impl<F, T: Fn(&mut F, F, &mut F, &mut F) + Sync> Step4<F> for T {
    #[inline(always)]
    fn step(&self, p: &mut F, g: F, m: &mut F, v: &mut F) {
        self(p, g, m, v)
    }
}

/// The loop of [`zip4`].
#[inline(always)]
fn each4<F: Copy>(p: &mut [F], g: &[F], m: &mut [F], v: &mut [F], s: &impl Step4<F>) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        s.step(p, g, m, v)
    }
}

/// [`each4`] compiled with FMA.
///
/// # Safety
/// The CPU has FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn each4_fma<F: Copy>(p: &mut [F], g: &[F], m: &mut [F], v: &mut [F], s: &impl Step4<F>) {
    each4(p, g, m, v, s)
}

/// `f.step(p[i], g[i], m[i], v[i])` for every element (a fused step with two state
/// buffers), compiled with FMA where the CPU has it.
pub(crate) fn zip4<F: Real>(p: &mut [F], g: &[F], m: &mut [F], v: &mut [F], f: impl Step4<F>) {
    assert!(
        p.len() == g.len() && p.len() == m.len() && p.len() == v.len(),
        "zip4: length mismatch"
    );
    let (pp, pm, pv) = (
        SendPtr(p.as_mut_ptr()),
        SendPtr(m.as_mut_ptr()),
        SendPtr(v.as_mut_ptr()),
    );
    split(p.len(), &|r| {
        // SAFETY: `r` is one of `split`'s disjoint ranges of `p`, `m` and `v` (same
        // length, three distinct buffers, all borrowed mutably for the call).
        let (p, m, v) = unsafe {
            (
                part(pp, r.clone()),
                part(pm, r.clone()),
                part(pv, r.clone()),
            )
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA (checked just above).
            return unsafe { each4_fma(p, &g[r], m, v, &f) };
        }
        each4(p, &g[r], m, v, &f)
    });
}

/// Whether `t` can be read and updated where it lies as an `F` slice (dtype `F`,
/// contiguous, in host memory): the fused paths' condition.
pub(crate) fn in_place<F: Real>(t: &Raw) -> bool {
    t.dtype() == F::DTYPE && t.is_contiguous() && t.device().is_cpu()
}

/// `f` over the values of an [`in_place`] tensor, where they lie.
pub(crate) fn with_slice<F: Real, R>(t: &Raw, f: impl FnOnce(&[F]) -> R) -> R {
    let st = t.storage();
    let r = t.layout().contiguous_range().expect("contiguous");
    f(&F::slice(st.cpu().expect("in_place: a host tensor")).expect("dtype matches storage")[r])
}

/// `f` over the values of an [`in_place`] tensor, mutably, where they lie.
pub(crate) fn with_slice_mut<F: Real, R>(t: &Raw, f: impl FnOnce(&mut [F]) -> R) -> R {
    let mut st = t.storage_mut();
    let r = t.layout().contiguous_range().expect("contiguous");
    f(
        &mut F::slice_mut(st.cpu_mut().expect("in_place: a host tensor"))
            .expect("dtype matches storage")[r],
    )
}

/// Whether a parameter of `dtype` is updated in float64 (else float32).
pub(crate) fn computes_in_f64(dtype: DType) -> bool {
    dtype == DType::F64
}

/// The elements of `t` as `F`, in row-major order.
pub(crate) fn read<F: Real>(t: &Raw) -> Vec<F> {
    if in_place::<F>(t) {
        return with_slice(t, <[F]>::to_vec);
    }
    t.to_vec_as::<F>()
}

/// Run `f` over the tensor's values as a mutable `F` slice and write them back (in place
/// when the tensor is contiguous and of dtype `F`).
pub(crate) fn update<F: Real>(p: &Raw, f: impl FnOnce(&mut [F])) -> Result<()> {
    if in_place::<F>(p) {
        with_slice_mut(p, f);
        return Ok(());
    }
    let mut v = p.to_vec_as::<F>();
    f(&mut v);
    let mut st = p.storage_mut();
    let layout: Layout = p.layout().clone();
    with_dtype!(p.dtype(), D => scatter_cast::<F, D>(&v, D::slice_mut(st.cpu_mut()?).expect("dtype"), &layout));
    Ok(())
}

/// A zero-initialised state buffer of a parameter's shape, in its compute type (float64
/// for float64 parameters, float32 otherwise).
pub(crate) fn zeros_state(p: &Tensor) -> Raw {
    Raw::zeros_on(p.dims(), state_dtype(p.dtype()), p.device()).unwrap_or_else(|e| panic!("{e}"))
}

/// Tensor arithmetic for the device updates: each is one device kernel over tensors of
/// the compute type, rounding as the host loops do (the scalar in the compute type).
pub(crate) mod dev {
    use amp_kernels::{binary, binary_scalar, unary, BinaryOp, UnaryOp};
    use amp_tensor::{Result, Tensor as Raw};

    /// `a * s`.
    pub(crate) fn scale(a: &Raw, s: f64) -> Result<Raw> {
        binary_scalar(BinaryOp::Mul, a, s)
    }
    /// `a + s * b` (the product rounded first, as `a += s * b` on the host).
    pub(crate) fn axpy(a: &Raw, b: &Raw, s: f64) -> Result<Raw> {
        binary(BinaryOp::Add, a, &scale(b, s)?)
    }
    /// `a op b`.
    pub(crate) fn op(o: BinaryOp, a: &Raw, b: &Raw) -> Result<Raw> {
        binary(o, a, b)
    }
    /// `-a`.
    pub(crate) fn neg(a: &Raw) -> Result<Raw> {
        unary(UnaryOp::Neg, a)
    }
    /// `sqrt(a)`.
    pub(crate) fn sqrt(a: &Raw) -> Result<Raw> {
        unary(UnaryOp::Sqrt, a)
    }
    /// `a / s` for a scalar.
    pub(crate) fn div(a: &Raw, s: f64) -> Result<Raw> {
        binary_scalar(BinaryOp::Div, a, s)
    }
    /// `a + s` for a scalar.
    pub(crate) fn add(a: &Raw, s: f64) -> Result<Raw> {
        binary_scalar(BinaryOp::Add, a, s)
    }
}

/// The dtype of the state of a parameter of `dtype`: its compute type.
pub(crate) fn state_dtype(dtype: DType) -> DType {
    if computes_in_f64(dtype) {
        DType::F64
    } else {
        DType::F32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of a buffer long enough to be split is updated once, with its own
    /// `axpy` rounds once, as PyTorch's `p.add_(d, alpha=a)` (`fmadd`): with `a = d =
    /// 1 + 2^-12` the product `1 + 2^-11 + 2^-24` rounds to `1 + 2^-11` on its own, so
    /// `p = -(1 + 2^-11)` plus it is 0 with two roundings and `2^-24` with one; on every
    /// element of a split tensor too.
    #[test]
    fn axpy_is_one_fused_multiply_add() {
        let x = 1.0 + 2f32.powi(-12);
        for n in [1, 7, 3 * PARALLEL_MIN + 5] {
            let mut p = vec![-(1.0 + 2f32.powi(-11)); n];
            axpy(&mut p, &vec![x; n], x);
            assert!(p.iter().all(|&v| v == 2f32.powi(-24)), "n = {n}: {}", p[0]);
        }
    }

    /// operands (a split that dropped, repeated or shifted a range would show).
    #[test]
    fn split_updates_match_the_element_by_element_loop() {
        let n = 3 * PARALLEL_MIN + 17;
        let g: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 * 0.25 - 100.0).collect();
        let start: Vec<f32> = (0..n).map(|i| (i % 977) as f32 * 0.5).collect();

        let mut p = start.clone();
        axpy(&mut p, &g, 2.0);
        assert!((0..n).all(|i| p[i] == g[i].mul_add(2.0, start[i])), "axpy");

        let (mut p, mut b) = (start.clone(), vec![1.0f32; n]);
        zip3(&mut p, &g, &mut b, |p, g, b| {
            *b += g;
            *p -= *b;
        });
        assert!((0..n).all(|i| b[i] == 1.0 + g[i] && p[i] == start[i] - (1.0 + g[i])));

        let (mut p, mut m, mut v) = (start.clone(), vec![0.0f32; n], vec![3.0f32; n]);
        zip4(
            &mut p,
            &g,
            &mut m,
            &mut v,
            |p: &mut f32, g: f32, m: &mut f32, v: &mut f32| {
                *m = g * 0.5;
                *v *= g;
                *p += *m + *v;
            },
        );
        assert!((0..n).all(|i| m[i] == g[i] * 0.5
            && v[i] == 3.0 * g[i]
            && p[i] == start[i] + (g[i] * 0.5 + 3.0 * g[i])));
    }
}
