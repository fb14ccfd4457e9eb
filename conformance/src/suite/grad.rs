//! The grad suite: forward values, input gradients and second-order gradients of one op,
//! without autocast.
//!
//! For a case (as `torch_runner.py` does with `torch.autograd.grad`):
//! 1. Every argument tensor becomes a leaf; those marked `requires_grad` are the *inputs*,
//!    collected depth-first in argument order (the tensors inside a list argument come in
//!    list order). Keyword tensors never require grad.
//! 2. Run the op; compare its output(s) with `expect.output`.
//! 3. Backpropagate `grad_output` (one tensor per output) to the inputs, with `create_graph`
//!    when the case has `second_order_grads`; compare with `expect.grads`. An expected
//!    `null` accepts no gradient or an all-zero one.
//! 4. With `second_order_grads`: `penalty = sum over first-order grads g that require grad
//!    of sum(g * g)`, then the gradients of `penalty` with respect to the same inputs,
//!    compared the same way.

use amp::tensor::Tensor;

use super::{check_optional, check_output, Outcome};
use crate::backend::GradBackend;
use crate::value::TensorLit;
use crate::vectors::GradCase;

/// Runs `case` on `backend`; skipped when the op table has no entry for its op, or when
/// an op has no kernel for the backend's device.
pub fn run<B: GradBackend>(backend: &B, case: &GradCase) -> Outcome {
    let skip = case.op_call.unsupported(backend);
    skip.unwrap_or_else(|| Outcome::from_result(check(backend, case)))
}

fn check<B: GradBackend>(b: &B, case: &GradCase) -> Result<(), String> {
    let e = &case.expect;
    let tol = e.tol.tolerance();

    // 1. Leaves, and the inputs to differentiate in depth-first argument order.
    let mut inputs = Vec::new();
    let call = &case.op_call;
    let args = call
        .args
        .iter()
        .map(|a| {
            a.try_map(&mut |lit: &TensorLit| {
                let t = b.tensor(&lit.to_tensor(), lit.requires_grad())?;
                if lit.requires_grad() {
                    inputs.push(t.clone());
                }
                Ok::<_, String>(t)
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let kwargs = call
        .kwargs
        .try_map(&mut |lit: &TensorLit| b.tensor(&lit.to_tensor(), false))?;
    if e.grads.len() != inputs.len() {
        return Err(format!(
            "bad vector: {} grads listed for {} argument tensors requiring grad",
            e.grads.len(),
            inputs.len()
        ));
    }

    // 2. Forward.
    let outputs = call
        .run(b, &args, &kwargs)
        .map_err(|m| format!("{} failed: {m}", call.call))?
        .into_tensors();
    check_output(b, "output", &outputs, &e.output, tol).map_err(|m| m.to_string())?;

    // 3. First-order gradients.
    let grad_outputs = case
        .grad_output
        .tensors()
        .into_iter()
        .map(|lit| b.tensor(&lit.to_tensor(), false))
        .collect::<Result<Vec<_>, String>>()?;
    if grad_outputs.len() != outputs.len() {
        return Err(format!(
            "bad vector: {} grad_output tensors for {} outputs",
            grad_outputs.len(),
            outputs.len()
        ));
    }
    let second = e.second_order_grads.as_deref();
    let grads = b
        .grad(&outputs, &inputs, &grad_outputs, second.is_some())
        .map_err(|m| format!("backward failed: {m}"))?;
    check_optional(b, "grads", &grads, &e.grads, tol).map_err(|m| m.to_string())?;

    // 4. Second-order gradients of sum(g * g) over the first-order grads.
    let Some(expected2) = second else {
        return Ok(());
    };
    let mut penalty = None;
    for g in grads.iter().flatten().filter(|g| b.requires_grad(g)) {
        let s = b.sum(&b.mul(g, g)?)?;
        penalty = Some(match penalty {
            None => s,
            Some(p) => b.add(&p, &s)?,
        });
    }
    let grads2 = match penalty {
        Some(penalty) => {
            let one = b.tensor(&Tensor::ones((), b.value(&penalty).dtype()), false)?;
            b.grad(&[penalty], &inputs, &[one], false)
                .map_err(|m| format!("double backward failed: {m}"))?
        }
        // No first-order gradient depends on an input, so every second-order gradient is
        // zero. PyTorch's graph can still link one to an input its value does not depend
        // on (a convolution's weight gradient to the weight, prelu's input gradient to
        // the input): its expectations are then null or zeros, which zeros match.
        None => inputs
            .iter()
            .map(|x| {
                let v = b.value(x);
                b.tensor(&Tensor::zeros(v.dims().to_vec(), v.dtype()), false)
                    .map(Some)
            })
            .collect::<Result<Vec<_>, String>>()?,
    };
    check_optional(b, "second_order_grads", &grads2, expected2, tol).map_err(|m| m.to_string())
}
