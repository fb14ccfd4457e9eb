//! The errors suite: a call PyTorch refuses (one argument of a valid call given a wrong
//! shape, rank or dtype, or made 0-dim) must return an error — not a value, not a panic.
//!
//! The error's text is compared with PyTorch's first line for the report's count of
//! matching texts; a different text is not a failure.

use super::Outcome;
use crate::backend::Backend;
use crate::vectors::ErrorCase;

/// What running one errors case gave: its outcome, and for a case that returned an error,
/// whether the text is PyTorch's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorOutcome {
    /// Passed (an error), failed (a value), or skipped (no op-table entry, or the error is
    /// the op's missing device kernel: that refusal says nothing of the arguments).
    pub outcome: Outcome,
    /// For a returned error: its first line, and whether that is PyTorch's message.
    pub text: Option<(String, bool)>,
}

/// Runs `case` on `backend`; skipped when the op table has no entry for its op, or when
/// the error is a missing device kernel.
pub fn run<B: Backend>(backend: &B, case: &ErrorCase) -> ErrorOutcome {
    if let Some(skip) = case.op_call.unsupported(backend) {
        return ErrorOutcome {
            outcome: skip,
            text: None,
        };
    }
    let args = match super::arguments(backend, &case.op_call, true) {
        Ok(args) => args,
        Err(e) => {
            return ErrorOutcome {
                outcome: Outcome::Failed(format!("the arguments could not be built: {e}")),
                text: None,
            }
        }
    };
    match case.op_call.run(backend, &args.0, &args.1) {
        Ok(_) => ErrorOutcome {
            outcome: Outcome::Failed(format!(
                "returned a value; PyTorch raises {}: {}",
                case.expect_error.kind, case.expect_error.message
            )),
            text: None,
        },
        Err(message) => {
            if let Some(reason) = crate::device::no_kernel(&message) {
                return ErrorOutcome {
                    outcome: Outcome::NoDeviceKernel(reason),
                    text: None,
                };
            }
            let got = first_line(&message).to_owned();
            let same = got == first_line(&case.expect_error.message);
            ErrorOutcome {
                outcome: Outcome::Passed,
                text: Some((got, same)),
            }
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("").trim_end()
}
