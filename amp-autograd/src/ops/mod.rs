//! The differentiable ops. Each enters through [`crate::dispatch()`] under its documented
//! name, runs its kernel, and records a backward written in differentiable ops (so
//! `create_graph` gives higher-order gradients).

mod attention;
mod batch_norm;
mod cast;
mod check;
mod conv;
mod distance;
mod linalg;
mod loss;
mod loss_extra;
mod matmul;
pub mod names;
mod nn;
mod nn_extra;
mod pointwise;
mod pool;
mod recurrent;
mod reduce;
mod rnn;
mod shape;

pub use attention::*;
pub use batch_norm::*;
pub use cast::*;
pub use conv::*;
pub use distance::*;
pub use linalg::*;
pub use loss::*;
pub use loss_extra::*;
pub use matmul::*;
pub use nn::*;
pub use nn_extra::*;
pub use pointwise::*;
pub use pool::*;
pub use recurrent::*;
pub use reduce::*;
pub use rnn::*;
pub use shape::*;

use crate::dispatch::{dispatch, BodyGuard, CallKind, OpName};
use crate::{Result, Tensor};

// Every `enter*` returns the op's [`BodyGuard`] beside its arguments: bind it to a named
// variable (`_body`, never `_`) so that it lives until the op's body is done.

/// Dispatch a functional call with tensor arguments `args` (no dtype argument); returns
/// the arguments and the guard the body runs under.
#[inline]
pub(crate) fn enter<const N: usize>(
    op: &'static OpName,
    args: [&Tensor; N],
) -> Result<([Tensor; N], BodyGuard)> {
    entered(args, |a| {
        dispatch(op, a, None, false, CallKind::Functional).map(|(_, body)| body)
    })
}

/// [`enter`] for an op that can read float32 arguments as a 16-bit dtype itself
/// ([`crate::dispatch_read_as`]): the guard's [`BodyGuard::read_as`] says when the layer
/// asked for that instead of casting.
#[inline]
pub(crate) fn enter_read_as<const N: usize>(
    op: &'static OpName,
    args: [&Tensor; N],
) -> Result<([Tensor; N], BodyGuard)> {
    entered(args, |a| crate::dispatch::dispatch_read_as(op, a))
}

/// The arguments, owned, after `dispatch` has seen (and maybe rewritten) them, and the
/// guard it returned.
#[inline(always)]
fn entered<const N: usize>(
    args: [&Tensor; N],
    dispatch: impl FnOnce(&mut [Tensor]) -> Result<BodyGuard>,
) -> Result<([Tensor; N], BodyGuard)> {
    let mut a: [Tensor; N] = args.map(Tensor::clone);
    let body = dispatch(&mut a)?;
    Ok((a, body))
}

/// The floating arguments of a pointwise composite (`addcmul`, `addcdiv`, `addr`) cast
/// to the dtype PyTorch's TensorIterator computes it in, `result_type` of all of them
/// (dimensioned tensors outranking 0-dim ones), so that mixed dtypes are not rounded
/// to the narrower one on the way: `addcmul` of float32 `input` and float16 `t1`, `t2`
/// multiplies in float32, as PyTorch does, not in float16. Casts on the tape (each
/// argument's gradient comes back in its own dtype); integer and bool arguments, and
/// arguments already of that dtype, as they are.
pub(crate) fn promoted<const N: usize>(args: [&Tensor; N]) -> Result<[Tensor; N]> {
    let operands = args.map(|t| amp_tensor::Operand::Tensor {
        dtype: t.dtype(),
        ndim: t.rank(),
    });
    let mut out = args.map(Tensor::clone);
    if let Some(common) = amp_tensor::result_type(&operands).filter(|d| d.is_floating_point()) {
        for t in out.iter_mut() {
            if t.dtype().is_floating_point() && t.dtype() != common {
                *t = t.to_dtype(common)?;
            }
        }
    }
    Ok(out)
}

/// Dispatch a functional call that has a `dtype=` argument; returns the args, the
/// dtype to use and the guard the body runs under.
#[inline]
pub(crate) fn enter_dtype<const N: usize>(
    op: &'static OpName,
    args: [&Tensor; N],
    dtype: Option<amp_tensor::DType>,
) -> Result<([Tensor; N], Option<amp_tensor::DType>, BodyGuard)> {
    let mut a: [Tensor; N] = args.map(Tensor::clone);
    let (d, body) = dispatch(op, &mut a, dtype, true, CallKind::Functional)?;
    Ok((a, d, body))
}

/// `x` entered as `op` (with the op's `dtype` argument), then cast to that dtype when one
/// is given (the guard lives as long as the caller's op).
pub(crate) fn enter_cast(
    op: &'static OpName,
    x: &Tensor,
    dtype: Option<amp_tensor::DType>,
) -> Result<(Tensor, BodyGuard)> {
    let ([x], dtype, body) = enter_dtype(op, [x], dtype)?;
    let x = match dtype {
        Some(d) => x.to_dtype(d)?,
        None => x,
    };
    Ok((x, body))
}

/// Dispatch a call with a variable number of tensor arguments; returns them and the
/// guard the body runs under.
pub(crate) fn enter_vec(op: &'static OpName, args: &[&Tensor]) -> Result<(Vec<Tensor>, BodyGuard)> {
    let mut a: Vec<Tensor> = args.iter().map(|t| (*t).clone()).collect();
    let (_, body) = dispatch(op, &mut a, None, false, CallKind::Functional)?;
    Ok((a, body))
}

/// Sum a broadcast gradient back to `dims` (the shape of the input it belongs to).
pub fn sum_to(g: &Tensor, dims: &[usize]) -> Result<Tensor> {
    if g.dims() == dims {
        return Ok(g.clone());
    }
    let lead = g.rank() - dims.len();
    let mut axes: Vec<i64> = (0..lead as i64).collect();
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 && g.dims()[lead + i] != 1 {
            axes.push((lead + i) as i64);
        }
    }
    let s = reduce::sum_impl(g, &axes, true, None)?;
    reshape(&s, dims)
}
