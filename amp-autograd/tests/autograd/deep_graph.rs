//! Very deep graphs: freeing a chain of a million recorded ops and backpropagating
//! through it must not recurse once per op (PyTorch frees graphs and runs backward
//! iteratively). Each test runs on a thread with a small stack, so a recursive drop or
//! traversal overflows it (and aborts the process) long before a million levels.

use amp_autograd::{ops, Tensor};

/// Ops in each chain.
const DEPTH: usize = 1_000_000;

/// Stack of the thread each test runs on: far below what a million nested drops need
/// (each level takes well over a hundred bytes), comfortably above what one op needs.
const STACK: usize = 512 * 1024;

fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn a test thread")
        .join()
        .expect("the test thread finished without panicking");
}

fn leaf() -> Tensor {
    let x = Tensor::from_vec(vec![0.5f32], [1]).unwrap();
    x.requires_grad_(true).unwrap();
    x
}

/// `neg` applied `DEPTH` times to `x`: a chain where each node holds the previous one
/// through its edge and through the input its backward saved.
fn neg_chain(x: &Tensor) -> Tensor {
    let mut y = x.clone();
    for _ in 0..DEPTH {
        y = ops::neg(&y).unwrap();
    }
    y
}

#[test]
fn dropping_a_million_op_chain_does_not_recurse() {
    on_small_stack(|| {
        let x = leaf();
        let y = neg_chain(&x);
        assert_eq!(y.grad_fn_name(), Some("NegBackward0"));
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.5]); // an even number of negations
        drop(y);
        // The leaf outlives its graph and is untouched by the teardown.
        assert!(x.grad().is_none());
        assert!(x.requires_grad());
    });
}

#[test]
fn dropping_a_million_op_chain_with_shared_edges_does_not_recurse() {
    // `y + y` holds the previous node twice: the teardown must free it exactly once,
    // after both references are gone.
    on_small_stack(|| {
        let x = leaf();
        let mut y = x.clone();
        for _ in 0..DEPTH {
            y = ops::add(&y, &y).unwrap();
        }
        assert_eq!(y.grad_fn_name(), Some("AddBackward0"));
        drop(y);
    });
}

#[test]
fn dropping_a_chain_that_is_still_shared_keeps_the_shared_part() {
    on_small_stack(|| {
        let x = leaf();
        let middle = neg_chain(&x);
        // Two graphs share `middle`'s chain: dropping one must leave the other whole.
        let a = ops::mul_scalar(&middle, 3.0).unwrap();
        let b = ops::mul_scalar(&middle, 5.0).unwrap();
        drop(middle);
        drop(a);
        ops::sum_all(&b).unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![5.0]);
    });
}

#[test]
fn backward_through_a_million_op_chain() {
    on_small_stack(|| {
        let x = leaf();
        let y = neg_chain(&x);
        ops::sum_all(&y).unwrap().backward().unwrap();
        // d/dx of (-1)^DEPTH x with DEPTH even.
        assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0]);
        // The graph was freed by backward: a second pass reports it.
        let again = ops::sum_all(&y).unwrap().backward();
        assert!(again.is_err(), "the graph was freed: {again:?}");
        drop(y);
    });
}
