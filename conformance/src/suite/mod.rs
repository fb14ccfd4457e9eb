//! The runner of each suite: one case in, an [`Outcome`] out.
//!
//! - [`policy`]: the documented lists, checked against `Profile::docs().listed_policy`.
//! - [`autocast`]: run the op inside the case's autocast regions, compare the output.
//! - [`grad`]: forward, backward, and (f64) second-order gradients.
//! - [`scaler`]: GradScaler programs on `amp::scaler::GradScaler` with SGD optimizers.
//! - [`train`]: a small MLP trained with autocast + GradScaler.
//! - [`errors`]: calls PyTorch refuses must return an error.

pub mod autocast;
pub mod errors;
pub mod grad;
pub mod policy;
pub mod scaler;
pub mod train;

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::args::{Arg, Kwargs, Output};
use crate::backend::Backend;
use crate::compare::{all_zero, compare, Mismatch, Tolerance};
use crate::value::TensorLit;
use crate::vectors::OpCall;

/// What running one case gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every expectation held.
    Passed,
    /// The first mismatch or error, with both values.
    Failed(String),
    /// Not run: the workspace does not implement what the case needs yet (the reason).
    Skipped(String),
    /// Not run on this device: an op returned [`amp::tensor::Error::NoDeviceKernel`], it has
    /// no kernel for the device its tensors are on (the reason names the op; see
    /// [`crate::device`]).
    NoDeviceKernel(String),
    /// Not run: the case does not run on the backend's device (a host-only suite,
    /// autocast of another device type; the reason).
    NotOnDevice(String),
}

impl Outcome {
    /// The skip of a case whose op has no entry in the op table.
    pub fn op_not_implemented(op: &str) -> Outcome {
        Outcome::Skipped(format!("op `{op}` not implemented yet"))
    }

    /// `Passed` for `Ok`, `Failed` with the message for `Err` — `NoDeviceKernel` when the
    /// message is an op's missing device kernel.
    pub fn from_result(r: Result<(), String>) -> Outcome {
        match r {
            Ok(()) => Outcome::Passed,
            Err(m) => {
                crate::device::no_kernel(&m).map_or(Outcome::Failed(m), Outcome::NoDeviceKernel)
            }
        }
    }
}

impl OpCall {
    /// The skip of a case whose call has no entry in the backend's op table.
    pub(crate) fn unsupported<B: Backend>(&self, b: &B) -> Option<Outcome> {
        let supported = b.ops().supports(&self.op, &self.call);
        (!supported).then(|| Outcome::op_not_implemented(&self.op))
    }

    /// What the op table's entry returns for `args` and `kwargs` (this call's arguments
    /// as backend tensors).
    pub(crate) fn run<B: Backend>(
        &self,
        b: &B,
        args: &[Arg<B::Tensor>],
        kwargs: &Kwargs<B::Tensor>,
    ) -> Result<Output<B::Tensor>, String> {
        b.ops()
            .call(&self.op, &self.call, args, kwargs)
            .unwrap_or_else(|| Err(format!("no entry for `{}`", self.call)))
    }
}

/// Positional and keyword arguments of an op call.
pub(crate) type Arguments<T> = (Vec<Arg<T>>, Kwargs<T>);

/// A case's arguments as backend tensors; `marks` applies the literals' `requires_grad`
/// marks (cases that never differentiate leave them off).
pub(crate) fn arguments<B: Backend>(
    b: &B,
    call: &OpCall,
    marks: bool,
) -> Result<Arguments<B::Tensor>, String> {
    let mut leaf = |lit: &TensorLit| b.tensor(&lit.to_tensor(), marks && lit.requires_grad());
    let args = call
        .args
        .iter()
        .map(|a| a.try_map(&mut leaf))
        .collect::<Result<Vec<_>, String>>()?;
    let kwargs = call.kwargs.try_map(&mut leaf)?;
    Ok((args, kwargs))
}

/// Runs `f`, turning a panic into a failure (a panicking op fails its case, and the run
/// goes on).
pub(crate) fn guarded(f: impl FnOnce() -> Outcome) -> Outcome {
    // Each case starts with no missing device kernel noted.
    crate::device::clear();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(o) => o,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".to_owned());
            Outcome::Failed(format!("panicked: {msg}"))
        }
    }
}

/// `got` tensors where `expected` were expected: a [`Mismatch::Count`] unless equal.
fn same_count(what: &str, got: usize, expected: usize) -> Result<(), Mismatch> {
    if got == expected {
        return Ok(());
    }
    Err(Mismatch::Count {
        what: what.to_owned(),
        got,
        expected,
    })
}

/// Compares an op's output tensors with the expected output (one tensor, labelled `what`,
/// or a list, labelled `what[i]`).
pub(crate) fn check_output<B: Backend>(
    b: &B,
    what: &str,
    got: &[B::Tensor],
    expected: &Output<TensorLit>,
    tol: Option<Tolerance>,
) -> Result<(), Mismatch> {
    let want = expected.tensors();
    same_count(what, got.len(), want.len())?;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let label = if expected.is_list() {
            format!("{what}[{i}]")
        } else {
            what.to_owned()
        };
        compare(&label, &b.value(g), &w.to_tensor(), tol)?;
    }
    Ok(())
}

/// Compares optional tensors (gradients) with their expectation, labelled `what[i]`: an
/// expected `null` accepts no tensor or an all-zero one; an expected tensor needs one.
pub(crate) fn check_optional<B: Backend>(
    b: &B,
    what: &str,
    got: &[Option<B::Tensor>],
    expected: &[Option<TensorLit>],
    tol: Option<Tolerance>,
) -> Result<(), Mismatch> {
    same_count(what, got.len(), expected.len())?;
    for (i, (g, w)) in got.iter().zip(expected).enumerate() {
        let label = format!("{what}[{i}]");
        match (g, w) {
            (None, None) => {}
            (Some(g), None) => all_zero(&label, &b.value(g))?,
            (None, Some(_)) => return Err(Mismatch::Missing { what: label }),
            (Some(g), Some(w)) => compare(&label, &b.value(g), &w.to_tensor(), tol)?,
        }
    }
    Ok(())
}
