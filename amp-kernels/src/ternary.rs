//! Three-operand elementwise ops: `where`, `clamp` (scalar and tensor bounds),
//! `addcmul`, `addcdiv`, `lerp` and `threshold_backward`, with PyTorch's broadcasting, promotion and NaN
//! rules. 16-bit floats compute in float32 and round once.

use amp_tensor::{
    broadcast_shapes, ensure, result_type, with_dtype, DType, Error, Operand, Result, Scalar,
    Tensor,
};

use crate::compute::Real;
use crate::unary::ewise::{
    any_kernel, ensure_cpu, full_tensor, int_kernel, meta, scalar_as, zip1, zip2, zip3, Arg,
    Guards, Int, Src,
};

/// The broadcast of several shapes (PyTorch's error text on a mismatch).
fn broadcast_all(op: &'static str, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let mut out: Vec<usize> = shapes.first().map_or_else(Vec::new, |s| s.to_vec());
    for s in shapes.iter().skip(1) {
        if out.as_slice() != *s {
            out = broadcast_shapes(op, &out, s)?;
        }
    }
    Ok(out)
}

/// `cond ? a : b` elementwise (`torch.where`): `cond` must be a bool tensor; the
/// three operands broadcast together and `a`, `b` are promoted to
/// `result_type([a, b])`.
pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "where";
    ensure!(
        cond.dtype() == DType::Bool,
        invalid(
            OP,
            "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
            cond.dtype()
        )
    );
    let dt = result_type(&[meta(a), meta(b)]).unwrap_or(a.dtype());
    crate::compute::on_device!(
        OP,
        [cond, a, b],
        crate::cuda::route::where_cond(cond, &a.to_dtype(dt)?, &b.to_dtype(dt)?)
    );
    ensure_cpu(OP, &[cond, a, b])?;
    let dims = broadcast_all(OP, &[cond.dims(), a.dims(), b.dims()])?;
    let (c, x, y) = (
        Src::of(cond, DType::Bool, OP)?,
        Src::of(a, dt, OP)?,
        Src::of(b, dt, OP)?,
    );
    let g = Guards::new([c.tensor(), x.tensor(), y.tensor()]);
    let c: Arg<bool, bool> = c.arg(g.get(0)?, false, OP)?;
    with_dtype!(dt, T => {
        let out: Vec<T> = zip3(
            &dims,
            c,
            x.arg::<T, T>(g.get(1)?, false, OP)?,
            y.arg::<T, T>(g.get(2)?, false, OP)?,
            |c: bool, p: T, q: T| if c { p } else { q },
        )?;
        Tensor::from_vec(out, dims)
    })
}

fn no_bounds() -> Error {
    Error::invalid("clamp", "At least one of 'min' or 'max' must not be None")
}

/// A clamp bound as the Python scalar it stands for: an integral bound of an
/// integer tensor is an int (keeping the dtype), otherwise a float.
fn bound_scalar(x: &Tensor, v: f64) -> Scalar {
    if !x.dtype().is_floating_point() && v.fract() == 0.0 && v.abs() < 9.2e18 {
        Scalar::Int(v as i64)
    } else {
        Scalar::Float(v)
    }
}

/// Clamp with scalar bounds in compute type `C` (bounds unrounded, as PyTorch's
/// `min.to<opmath_t>()`); NaN elements stay NaN.
fn clamp_kernel<T: amp_tensor::Element, C: amp_tensor::Element>(
    x: &Src<'_>,
    dims: &[usize],
    lo: Option<Scalar>,
    hi: Option<Scalar>,
) -> Result<Vec<T>> {
    let g = Guards::new([x.tensor()]);
    let a: Arg<T, C> = x.arg(g.get(0)?, false, "clamp")?;
    let (lo, hi) = (lo.map(scalar_as::<C>), hi.map(scalar_as::<C>));
    match (lo, hi) {
        (Some(l), Some(h)) => zip1(dims, a, move |v: C| {
            let r = if v < l { l } else { v };
            if h < r {
                h
            } else {
                r
            }
        }),
        (Some(l), None) => zip1(dims, a, move |v: C| if v < l { l } else { v }),
        (None, Some(h)) => zip1(dims, a, move |v: C| if h < v { h } else { v }),
        (None, None) => Err(no_bounds()),
    }
}

/// Clamp every element into `[min, max]` (`torch.clamp` with number bounds; either
/// bound may be absent, not both). NaN elements stay NaN; a NaN bound when both are
/// given makes every element NaN, as in PyTorch. An integer tensor with integral
/// bounds keeps its dtype; a fractional bound promotes it to float32.
pub fn clamp(x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
    const OP: &str = "clamp";
    if min.is_none() && max.is_none() {
        return Err(no_bounds());
    }
    crate::compute::on_device!(OP, [x], crate::cuda::route::clamp(x, min, max));
    ensure_cpu(OP, &[x])?;
    let (lo, hi) = (
        min.map(|v| bound_scalar(x, v)),
        max.map(|v| bound_scalar(x, v)),
    );
    let ops: Vec<Operand> = std::iter::once(meta(x))
        .chain(lo.into_iter().chain(hi).map(Operand::Scalar))
        .collect();
    let dt = result_type(&ops).unwrap_or(x.dtype());
    if let (Some(l), Some(h)) = (min, max) {
        if dt.is_floating_point() && (l.is_nan() || h.is_nan()) {
            return full_tensor(x.dims(), f64::NAN, dt);
        }
    }
    let src = Src::of(x, dt, OP)?;
    let out = any_kernel!(dt, |T, C| {
        Tensor::from_vec(
            clamp_kernel::<T, C>(&src, x.dims(), lo, hi)?,
            x.dims().to_vec(),
        )
    });
    out
}

/// Clamp with tensor bounds in compute type `C`; NaN in any operand propagates.
fn clamp_tensor_kernel<T: amp_tensor::Element, C: amp_tensor::Element>(
    dims: &[usize],
    x: &Src<'_>,
    lo: Option<&Src<'_>>,
    hi: Option<&Src<'_>>,
) -> Result<Vec<T>> {
    const OP: &str = "clamp";
    let g = Guards::new([
        x.tensor(),
        lo.and_then(Src::tensor),
        hi.and_then(Src::tensor),
    ]);
    let a: Arg<T, C> = x.arg(g.get(0)?, false, OP)?;
    match (lo, hi) {
        (Some(l), Some(h)) => zip3(
            dims,
            a,
            l.arg::<T, C>(g.get(1)?, false, OP)?,
            h.arg::<T, C>(g.get(2)?, false, OP)?,
            |v: C, l: C, h: C| {
                #[allow(clippy::eq_op)]
                if l != l {
                    l
                } else if h != h {
                    h
                } else {
                    let r = if v < l { l } else { v };
                    if h < r {
                        h
                    } else {
                        r
                    }
                }
            },
        ),
        (Some(l), None) => zip2(
            dims,
            a,
            l.arg::<T, C>(g.get(1)?, false, OP)?,
            |v: C, l: C| {
                #[allow(clippy::eq_op)]
                if v != v || l != l {
                    if v != v {
                        v
                    } else {
                        l
                    }
                } else if v < l {
                    l
                } else {
                    v
                }
            },
        ),
        (None, Some(h)) => zip2(
            dims,
            a,
            h.arg::<T, C>(g.get(2)?, false, OP)?,
            |v: C, h: C| {
                #[allow(clippy::eq_op)]
                if v != v || h != h {
                    if v != v {
                        v
                    } else {
                        h
                    }
                } else if h < v {
                    h
                } else {
                    v
                }
            },
        ),
        (None, None) => Err(no_bounds()),
    }
}

/// Clamp into `[min, max]` with tensor bounds (`torch.clamp(x, min_t, max_t)`):
/// all present operands broadcast together and promote to their `result_type`;
/// NaN in the input or a bound gives NaN (min-only is `maximum`, max-only is
/// `minimum`, as in PyTorch).
pub fn clamp_tensor(x: &Tensor, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "clamp";
    if min.is_none() && max.is_none() {
        return Err(no_bounds());
    }
    let present: Vec<&Tensor> = std::iter::once(x).chain(min).chain(max).collect();
    #[cfg(feature = "cuda")]
    if crate::compute::device_of(OP, &present)?.is_some() {
        let shapes: Vec<&[usize]> = present.iter().map(|t| t.dims()).collect();
        broadcast_all(OP, &shapes)?;
        return crate::cuda::route::clamp_tensor(x, min, max);
    }
    ensure_cpu(OP, &present)?;
    let metas: Vec<Operand> = present.iter().map(|t| meta(t)).collect();
    let dt = result_type(&metas).unwrap_or(x.dtype());
    let shapes: Vec<&[usize]> = present.iter().map(|t| t.dims()).collect();
    let dims = broadcast_all(OP, &shapes)?;
    let src = Src::of(x, dt, OP)?;
    let lo = min.map(|t| Src::of(t, dt, OP)).transpose()?;
    let hi = max.map(|t| Src::of(t, dt, OP)).transpose()?;
    any_kernel!(dt, |T, C| {
        let out = clamp_tensor_kernel::<T, C>(&dims, &src, lo.as_ref(), hi.as_ref())?;
        Tensor::from_vec(out, dims)
    })
}

/// `input + value * t1 * t2` (`div == false`) or `input + value * t1 / t2`.
fn addc(
    op: &'static str,
    div: bool,
    input: &Tensor,
    t1: &Tensor,
    t2: &Tensor,
    value: f64,
) -> Result<Tensor> {
    ensure_cpu(op, &[input, t1, t2])?;
    let integral = |t: &Tensor| !t.dtype().is_floating_point();
    ensure!(!(div && integral(t1) && integral(t2)), invalid(op, "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: (input + value * tensor1 / tensor2), for all dtypes."));
    let dt = result_type(&[meta(input), meta(t1), meta(t2)]).unwrap_or(input.dtype());
    let dims = broadcast_all(op, &[input.dims(), t1.dims(), t2.dims()])?;
    let (s, p, q) = (
        Src::of(input, dt, op)?,
        Src::of(t1, dt, op)?,
        Src::of(t2, dt, op)?,
    );
    let g = Guards::new([s.tensor(), p.tensor(), q.tensor()]);
    if dt.is_floating_point() {
        return crate::float_kernel!(dt, op, |T, C| {
            let v = C::from_f64c(value);
            let (s, p, q) = (
                s.arg::<T, C>(g.get(0)?, false, op)?,
                p.arg::<T, C>(g.get(1)?, false, op)?,
                q.arg::<T, C>(g.get(2)?, false, op)?,
            );
            let out: Vec<T> = if div {
                zip3(&dims, s, p, q, move |s: C, p: C, q: C| s + v * p / q)?
            } else {
                zip3(&dims, s, p, q, move |s: C, p: C, q: C| s + v * p * q)?
            };
            Tensor::from_vec(out, dims)
        });
    }
    int_kernel!(dt, |T| {
        let v = T::from_integral(value).ok_or_else(|| {
            Error::invalid(
                op,
                "For integral input tensors, argument value must not be a floating point number.",
            )
        })?;
        let out: Vec<T> = zip3(
            &dims,
            s.arg::<T, T>(g.get(0)?, false, op)?,
            p.arg::<T, T>(g.get(1)?, false, op)?,
            q.arg::<T, T>(g.get(2)?, false, op)?,
            move |s: T, p: T, q: T| s.wadd(v.wmul(p).wmul(q)),
        )?;
        Tensor::from_vec(out, dims)
    }, _ => Err(Error::UnsupportedDType { op, dtype: dt }))
}

/// `input + value * t1 * t2` (`torch.addcmul`): broadcast and promoted together;
/// 16-bit types compute in float32 (with `value` in float32) and round once.
pub fn addcmul(input: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    addc("addcmul", false, input, t1, t2, value)
}

/// `input + value * t1 / t2` (`torch.addcdiv`); integer `t1` and `t2` together are
/// an error, as in PyTorch.
pub fn addcdiv(input: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<Tensor> {
    addc("addcdiv", true, input, t1, t2, value)
}

/// `a + weight * (b - a)` (`torch.lerp` with a number weight), using PyTorch's
/// two-sided formula (`b - (b - a) * (1 - weight)` when `|weight| >= 0.5`). `a` and
/// `b` must share a floating dtype; they broadcast.
pub fn lerp(a: &Tensor, b: &Tensor, weight: f64) -> Result<Tensor> {
    const OP: &str = "lerp";
    ensure_cpu(OP, &[a, b])?;
    ensure!(
        a.dtype() == b.dtype(),
        invalid(
            OP,
            "expected dtype {} for `end` but got dtype {}",
            a.dtype(),
            b.dtype()
        )
    );
    let dt = a.dtype();
    let dims = broadcast_shapes(OP, a.dims(), b.dims())?;
    let (x, y) = (Src::of(a, dt, OP)?, Src::of(b, dt, OP)?);
    let g = Guards::new([x.tensor(), y.tensor()]);
    crate::float_kernel!(dt, OP, |T, C| {
        let w = C::from_f64c(weight);
        let (x, y) = (
            x.arg::<T, C>(g.get(0)?, false, OP)?,
            y.arg::<T, C>(g.get(1)?, false, OP)?,
        );
        let out: Vec<T> = if weight.abs() < 0.5 {
            zip2(&dims, x, y, move |s: C, e: C| s + w * (e - s))?
        } else {
            let omw = C::from_f64c(1.0) - w;
            zip2(&dims, x, y, move |s: C, e: C| e - (e - s) * omw)?
        };
        Tensor::from_vec(out, dims)
    })
}

/// `x <= threshold ? 0 : grad` (`aten::threshold_backward`, the gradient of `relu`
/// and `threshold`): one pass, and a masked element is exactly 0 even where `grad`
/// is inf or NaN (a multiply by a 0/1 mask would give NaN there, which would turn a
/// GradScaler's overflow into a NaN and change what it sees). A NaN `x` passes
/// `grad` through, as in PyTorch. `grad` and `x` share a floating dtype and broadcast.
pub fn threshold_backward(grad: &Tensor, x: &Tensor, threshold: f64) -> Result<Tensor> {
    const OP: &str = "threshold_backward";
    crate::compute::on_device!(
        OP,
        [grad, x],
        crate::cuda::route::threshold_backward(grad, x, threshold)
    );
    ensure_cpu(OP, &[grad, x])?;
    ensure!(
        grad.dtype() == x.dtype(),
        invalid(
            OP,
            "expected grad_output and self to have the same dtype, but got {} and {}",
            grad.dtype(),
            x.dtype()
        )
    );
    let dt = x.dtype();
    let dims = broadcast_shapes(OP, grad.dims(), x.dims())?;
    let (gs, xs) = (Src::of(grad, dt, OP)?, Src::of(x, dt, OP)?);
    let guards = Guards::new([gs.tensor(), xs.tensor()]);
    crate::float_kernel!(dt, OP, |T, C| {
        let (th, zero) = (C::from_f64c(threshold), C::from_f64c(0.0));
        let out: Vec<T> = zip2(
            &dims,
            gs.arg::<T, C>(guards.get(0)?, false, OP)?,
            xs.arg::<T, C>(guards.get(1)?, false, OP)?,
            move |g: C, x: C| if x <= th { zero } else { g },
        )?;
        Tensor::from_vec(out, dims)
    })
}
