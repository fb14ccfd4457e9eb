//! The autocast suite: run one op inside the case's nested autocast regions and compare
//! its output (dtype included) with PyTorch's.

use super::{check_output, Outcome};
use crate::backend::AutocastBackend;
use crate::vectors::AutocastCase;

/// Runs `case` on `backend`; skipped when the op table has no entry for its op.
pub fn run<B: AutocastBackend>(backend: &B, case: &AutocastCase) -> Outcome {
    if !backend.ops().supports(&case.op, &case.call) {
        return Outcome::op_not_implemented(&case.op);
    }
    Outcome::from_result(check(backend, case))
}

fn check<B: AutocastBackend>(b: &B, case: &AutocastCase) -> Result<(), String> {
    // Autocast cases never differentiate: `requires_grad` marks are not applied.
    let (args, kwargs) = super::arguments(b, &case.args, &case.kwargs, false)?;
    let out = b
        .with_autocast(case.device, &case.autocast, &mut || {
            b.ops()
                .call(&case.op, &case.call, &args, &kwargs)
                .unwrap_or_else(|| Err(format!("no entry for `{}`", case.call)))
        })
        .map_err(|e| format!("{} failed: {e}", case.call))?;
    check_output(
        b,
        "output",
        &out.into_tensors(),
        &case.expect.output,
        case.expect.tol.tolerance(),
    )
    .map_err(|m| m.to_string())
}
