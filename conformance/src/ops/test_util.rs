//! The helpers of the op tables' unit tests (`mod.rs`, `extra.rs`, `pool.rs`).

pub(super) use super::K;
use super::{table, A, R};
use crate::args::{Arg, Kwargs, Output};
use amp::autograd::Tensor;

/// A float64 tensor argument.
pub(super) fn t(v: &[f64], shape: &[usize]) -> A {
    Arg::Tensor(Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap())
}

/// Keyword arguments from `(name, value)` pairs.
pub(super) fn kw(entries: Vec<(&str, A)>) -> K {
    Kwargs::new(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

/// The table's entry for `op` called as `call` (which must exist).
pub(super) fn run(call: &str, op: &str, args: &[A], kwargs: &K) -> R {
    table()
        .call(op, call, args, kwargs)
        .expect("the call has an entry")
}

/// The values of a one-tensor result.
pub(super) fn values(r: R) -> Vec<f64> {
    match r.unwrap() {
        Output::Tensor(t) => t.to_vec_f64(),
        Output::Tensors(_) => panic!("one tensor expected"),
    }
}

/// The values of a result, every tensor of a tuple one after another.
pub(super) fn flat_values(r: R) -> Vec<f64> {
    match r.unwrap() {
        Output::Tensor(t) => t.to_vec_f64(),
        Output::Tensors(ts) => ts.iter().flat_map(|t| t.to_vec_f64()).collect(),
    }
}
