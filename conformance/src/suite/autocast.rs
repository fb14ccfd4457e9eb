//! The autocast suite: run one op inside the case's nested autocast regions and compare
//! its output (dtype included) with PyTorch's.

use super::{check_output, Outcome};
use crate::backend::AutocastBackend;
use crate::vectors::AutocastCase;

/// Runs `case` on `backend`; skipped when the op table has no entry for its op, or when
/// an op has no kernel for the backend's device.
pub fn run<B: AutocastBackend>(backend: &B, case: &AutocastCase) -> Outcome {
    let skip = case.op_call.unsupported(backend);
    skip.unwrap_or_else(|| Outcome::from_result(check(backend, case)))
}

fn check<B: AutocastBackend>(b: &B, case: &AutocastCase) -> Result<(), String> {
    // Autocast cases never differentiate: `requires_grad` marks are not applied.
    let call = &case.op_call;
    let (args, kwargs) = super::arguments(b, call, false)?;
    let out = b
        .with_autocast(case.device, &case.autocast, &mut || {
            call.run(b, &args, &kwargs)
        })
        .map_err(|e| format!("{} failed: {e}", call.call))?;
    check_output(
        b,
        "output",
        &out.into_tensors(),
        &case.expect.output,
        case.expect.tol.tolerance(),
    )
    .map_err(|m| m.to_string())
}
