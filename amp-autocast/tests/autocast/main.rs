//! The integration tests of `amp-autocast`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-autocast --release --test autocast <module>::`
//! runs one subject).

mod autocast;
mod extra;
mod guards;
mod nesting;

use amp_autograd::Tensor;
use amp_tensor::DType;

/// Asserts that every one of `leaves` got a float32 gradient.
fn assert_f32_grads(leaves: &[&Tensor]) {
    for (i, t) in leaves.iter().enumerate() {
        assert_eq!(t.grad().unwrap().dtype(), DType::F32, "leaf {i}");
    }
}
