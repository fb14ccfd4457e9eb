//! The helpers of the op tables' unit tests (`mod.rs`, `extra.rs`, `pool.rs`).

use super::{table, A, K, R};
use crate::args::{Arg, Kwargs, Output};
use amp::autograd::Tensor;

/// A float64 tensor argument.
pub(super) fn t(v: &[f64], shape: &[usize]) -> A {
    Arg::Tensor(Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap())
}

/// A list of ints (`int[]`).
pub(super) fn ints(v: &[i64]) -> A {
    Arg::List(v.iter().map(|&i| Arg::Int(i)).collect())
}

impl From<&A> for A {
    fn from(a: &A) -> A {
        a.clone()
    }
}

impl From<i64> for A {
    fn from(i: i64) -> A {
        Arg::Int(i)
    }
}

impl From<f64> for A {
    fn from(x: f64) -> A {
        Arg::Float(x)
    }
}

impl From<bool> for A {
    fn from(b: bool) -> A {
        Arg::Bool(b)
    }
}

impl From<&str> for A {
    fn from(s: &str) -> A {
        Arg::Str(s.to_owned())
    }
}

/// One call of the op table, built argument by argument:
/// `call("torch.exp").arg(&x).kw("alpha", 1).err()`.
pub(super) struct Call {
    call: &'static str,
    op: String,
    args: Vec<A>,
    kwargs: Vec<(String, A)>,
}

/// A call of `call`, for the documented op of its last name (`torch.exp`: `exp`).
pub(super) fn call(call: &'static str) -> Call {
    let op = call.rsplit('.').next().unwrap_or(call).to_owned();
    Call {
        call,
        op,
        args: Vec::new(),
        kwargs: Vec::new(),
    }
}

impl Call {
    /// For the documented op `op` instead.
    pub(super) fn op(mut self, op: &str) -> Call {
        self.op = op.to_owned();
        self
    }

    /// The next positional argument.
    pub(super) fn arg(mut self, a: impl Into<A>) -> Call {
        self.args.push(a.into());
        self
    }

    /// A keyword argument.
    pub(super) fn kw(mut self, name: &str, a: impl Into<A>) -> Call {
        self.kwargs.push((name.to_owned(), a.into()));
        self
    }

    /// What the table's entry (which must exist) returns.
    pub(super) fn run(&self) -> R {
        let kwargs: K = Kwargs::new(self.kwargs.clone());
        table()
            .call(&self.op, self.call, &self.args, &kwargs)
            .expect("the call has an entry")
    }

    /// The error (the call must fail).
    pub(super) fn err(&self) -> String {
        self.run().expect_err("the call fails")
    }

    /// The output tensors (the call must succeed).
    pub(super) fn tensors(&self) -> Vec<Tensor> {
        self.run().unwrap().into_tensors()
    }

    /// The values of a one-tensor result.
    pub(super) fn values(&self) -> Vec<f64> {
        match self.run().unwrap() {
            Output::Tensor(t) => t.to_vec_f64(),
            Output::Tensors(_) => panic!("one tensor expected"),
        }
    }

    /// The values of a result, every tensor of a tuple one after another.
    pub(super) fn flat_values(&self) -> Vec<f64> {
        let ts = self.tensors();
        ts.iter().flat_map(|t| t.to_vec_f64()).collect()
    }
}
