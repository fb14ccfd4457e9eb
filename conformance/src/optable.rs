//! The registry mapping a vector's `call` to the workspace function that implements it.
//!
//! The entries themselves live in [`crate::ops`]; this module is the table type.

use std::collections::BTreeMap;
use std::fmt;

use crate::args::{Arg, Kwargs, Output};

/// An op implementation: the vector's positional and keyword arguments (tensors already
/// converted to the backend's tensor type) in, the op's output or an error message out.
pub type OpFn<T> = dyn Fn(&[Arg<T>], &Kwargs<T>) -> Result<Output<T>, String> + Send + Sync;

struct Entry<T> {
    /// The documented op names this entry serves; `None`: every op whose vectors use the call.
    ops: Option<Vec<String>>,
    f: Box<OpFn<T>>,
}

/// Calls (`torch.mm`, `torch.nn.functional.conv2d`, `torch.Tensor.__rpow__`) → op functions.
///
/// An op is *executable* when the table has an entry for its call; every other case of that
/// op is skipped with the reason "op `NAME` not implemented yet".
///
/// ```
/// use conformance::args::Output;
/// use conformance::optable::OpTable;
///
/// let mut table: OpTable<f64> = OpTable::new();
/// table.insert("torch.neg", |args, kwargs| {
///     kwargs.only(&[])?;
///     Ok(Output::Tensor(-*args[0].tensor()?))
/// });
/// // torch.nn.functional.pad serves several documented ops; this entry only two of them.
/// table.insert_for("torch.nn.functional.pad", &["reflection_pad1d", "reflection_pad2d"], |_, _| {
///     Err("not needed here".into())
/// });
/// assert!(table.supports("neg", "torch.neg"));
/// assert!(table.supports("reflection_pad1d", "torch.nn.functional.pad"));
/// assert!(!table.supports("replication_pad1d", "torch.nn.functional.pad"));
/// let out = table.call("neg", "torch.neg", &[conformance::args::Arg::Tensor(2.0)], &Default::default());
/// assert_eq!(out, Some(Ok(Output::Tensor(-2.0))));
/// ```
pub struct OpTable<T> {
    entries: BTreeMap<String, Vec<Entry<T>>>,
}

impl<T> Default for OpTable<T> {
    fn default() -> Self {
        OpTable {
            entries: BTreeMap::new(),
        }
    }
}

impl<T> OpTable<T> {
    /// An empty table.
    pub fn new() -> OpTable<T> {
        OpTable::default()
    }

    /// Registers `f` for `call`, serving every documented op whose vectors use that call.
    pub fn insert(
        &mut self,
        call: &str,
        f: impl Fn(&[Arg<T>], &Kwargs<T>) -> Result<Output<T>, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.push(call, None, Box::new(f))
    }

    /// Registers `f` for `call`, serving only the documented ops `ops` (for a call shared by
    /// several ops, such as `torch.nn.functional.pad` for the reflection and replication
    /// pads, when only some are implemented).
    pub fn insert_for(
        &mut self,
        call: &str,
        ops: &[&str],
        f: impl Fn(&[Arg<T>], &Kwargs<T>) -> Result<Output<T>, String> + Send + Sync + 'static,
    ) -> &mut Self {
        let ops = ops.iter().map(|s| (*s).to_owned()).collect();
        self.push(call, Some(ops), Box::new(f))
    }

    fn push(&mut self, call: &str, ops: Option<Vec<String>>, f: Box<OpFn<T>>) -> &mut Self {
        self.entries
            .entry(call.to_owned())
            .or_default()
            .push(Entry { ops, f });
        self
    }

    fn entry(&self, op: &str, call: &str) -> Option<&Entry<T>> {
        self.entries
            .get(call)?
            .iter()
            .find(|e| e.ops.as_ref().is_none_or(|ops| ops.iter().any(|o| o == op)))
    }

    /// Whether documented op `op`, reached through `call`, has an implementation.
    pub fn supports(&self, op: &str, call: &str) -> bool {
        self.entry(op, call).is_some()
    }

    /// Runs `op` through `call`; `None` when the table has no entry for it.
    pub fn call(
        &self,
        op: &str,
        call: &str,
        args: &[Arg<T>],
        kwargs: &Kwargs<T>,
    ) -> Option<Result<Output<T>, String>> {
        self.entry(op, call).map(|e| (e.f)(args, kwargs))
    }

    /// The calls with at least one entry, sorted.
    pub fn calls(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Number of calls with an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when no op is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<T> fmt::Debug for OpTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.calls()).finish()
    }
}
