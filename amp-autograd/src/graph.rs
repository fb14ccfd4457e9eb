//! Graph nodes and how ops record themselves.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use amp_tensor::{DType, Tensor as Raw};

use crate::grad_mode::is_grad_enabled;
use crate::{Result, Tensor};

/// Computes the gradients of a node's inputs from the gradients of its outputs.
/// `grads[i]` is `None` when output `i` received no gradient (treat it as zeros).
/// Returns one entry per input, `None` where the input gets no gradient.
pub type BackwardFn = Box<dyn Fn(&[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// Where a node's input gradient goes.
pub(crate) enum Edge {
    /// The input does not require grad.
    None,
    /// A leaf that requires grad: accumulate into its `.grad`.
    Leaf(Tensor),
    /// Output `nr` of another node.
    Node(Arc<Node>, usize),
}

/// What the engine checks a gradient for an input against (PyTorch casts a gradient of
/// another dtype to the input's dtype: this is how a float32 leaf used through a
/// bfloat16 cast ends up with a float32 `.grad`).
pub(crate) struct InputMeta {
    pub dims: Vec<usize>,
    pub dtype: DType,
}

/// One recorded op.
pub(crate) struct Node {
    pub name: &'static str,
    pub edges: Vec<(Edge, InputMeta)>,
    pub num_outputs: usize,
    pub backward: Mutex<Option<BackwardFn>>,
}

/// Takes `node`'s edges and backward closure out of it, pushing the nodes it held onto
/// `stack` (the closure is dropped after the edges are taken, so the tensors it saved
/// never release the last handle to an input's node).
fn unlink(node: &mut Node, stack: &mut Vec<Arc<Node>>) {
    for (edge, _) in std::mem::take(&mut node.edges) {
        if let Edge::Node(n, _) = edge {
            stack.push(n);
        }
    }
    let backward = node
        .backward
        .get_mut()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    drop(backward);
}

impl Drop for Node {
    /// Frees the graph behind this node without recursion (PyTorch frees graphs
    /// iteratively too): the children of a node nothing else holds are moved onto an
    /// explicit stack before it is freed, so a chain of a million ops is a loop, not a
    /// million nested drops. Nodes still held elsewhere (another output, another graph,
    /// a running backward on another thread) just lose one reference.
    fn drop(&mut self) {
        let mut stack = Vec::new();
        unlink(self, &mut stack);
        while let Some(n) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(n) {
                unlink(&mut node, &mut stack);
                // `node` is dropped here with nothing left to free recursively.
            }
        }
    }
}

fn edge_of(t: &Tensor) -> Edge {
    if !t.requires_grad() {
        Edge::None
    } else if let Some(n) = t.grad_fn() {
        Edge::Node(n.clone(), t.output_nr())
    } else {
        Edge::Leaf(t.clone())
    }
}

/// Whether an op with these inputs must be recorded.
#[inline]
pub fn needs_grad(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// One input's gradient in a backward closure: `f()` when the input needs one (`needed`:
/// its `requires_grad`, or that and a condition of the op), else `None` without running
/// `f`, so a backward computes only the gradients its inputs ask for.
#[inline]
pub(crate) fn grad_if(needed: bool, f: impl FnOnce() -> Result<Tensor>) -> Result<Option<Tensor>> {
    if needed {
        f().map(Some)
    } else {
        Ok(None)
    }
}

thread_local! {
    /// The nodes whose backward closure is running on this thread, innermost last (a
    /// backward may run another one: `grad()` inside a custom function's backward).
    static RUNNING: RefCell<Vec<Arc<Node>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `node`'s backward closure `f` on `grads` with `node` known as the running one,
/// so that a [`SavedOutput`] read inside it can hand out the node's own output.
pub(crate) fn run_backward(
    node: &Arc<Node>,
    f: &BackwardFn,
    grads: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            RUNNING.with(|r| r.borrow_mut().pop());
        }
    }
    RUNNING.with(|r| r.borrow_mut().push(node.clone()));
    let _pop = Pop;
    f(grads)
}

/// An input a backward formula reads, kept only when a gradient that reads it will be
/// computed: `mul(a, b)` keeps `b` only when `a` needs a gradient, and `a` only when `b`
/// does (burn's `binary()`; PyTorch's generated `should_compute_output` tests). An input
/// that no side reads is never kept, so the graph does not hold its buffer alive.
pub(crate) struct Kept(Option<Tensor>);

impl Kept {
    /// Keeps `t` when `needed`.
    pub(crate) fn new(t: &Tensor, needed: bool) -> Kept {
        Kept(needed.then(|| t.clone()))
    }

    /// The kept tensor.
    ///
    /// # Panics
    /// When it was not kept: a formula read an input its op did not declare it reads
    /// (a bug in the op, caught by the gradient tests that turn each input's
    /// `requires_grad` off in turn).
    pub(crate) fn get(&self) -> &Tensor {
        self.0
            .as_ref()
            .expect("a backward formula read an input its op did not keep")
    }
}

/// An op's output kept for its backward (PyTorch's `SavedVariable` of an output): its
/// values, handed out under `create_graph` as the output itself again, with the running
/// node as its `grad_fn`, so that a formula reading it (`exp`'s `g * out`) is
/// differentiated through that node. The op's inputs need not be kept to recompute it.
pub(crate) struct SavedOutput {
    data: Raw,
    nr: usize,
}

impl SavedOutput {
    /// Keeps output `nr` of an op (0 for a single-output op).
    pub(crate) fn new(data: &Raw, nr: usize) -> SavedOutput {
        SavedOutput {
            data: data.clone(),
            nr,
        }
    }

    /// The output: differentiable when a graph is being recorded, plain values otherwise.
    pub(crate) fn get(&self) -> Tensor {
        let node = is_grad_enabled()
            .then(|| RUNNING.with(|r| r.borrow().last().cloned()))
            .flatten();
        match node {
            Some(node) => Tensor::make(self.data.clone(), true, Some(node), self.nr),
            None => Tensor::from_raw(self.data.clone()),
        }
    }
}

/// Wrap op outputs, recording a node when grad mode is on and an input requires grad.
/// `differentiable[i]` says whether output `i` carries gradients (indices do not).
pub fn record_multi(
    outputs: Vec<Raw>,
    differentiable: &[bool],
    name: &'static str,
    inputs: &[&Tensor],
    backward: BackwardFn,
) -> Vec<Tensor> {
    if !needs_grad(inputs) {
        return outputs.into_iter().map(Tensor::from_raw).collect();
    }
    let node = Arc::new(Node {
        name,
        edges: inputs
            .iter()
            .map(|t| {
                (
                    edge_of(t),
                    InputMeta {
                        dims: t.dims().to_vec(),
                        dtype: t.dtype(),
                    },
                )
            })
            .collect(),
        num_outputs: outputs.len(),
        backward: Mutex::new(Some(backward)),
    });
    outputs
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            if differentiable.get(i).copied().unwrap_or(true) {
                Tensor::make(o, true, Some(node.clone()), i)
            } else {
                Tensor::from_raw(o)
            }
        })
        .collect()
}

/// [`record_multi`] for the common single-output op; `backward` gets the output's
/// gradient (only called when there is one).
pub fn record(
    output: Raw,
    name: &'static str,
    inputs: &[&Tensor],
    backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Tensor {
    if !needs_grad(inputs) {
        return Tensor::from_raw(output);
    }
    let n = inputs.len();
    let f: BackwardFn = Box::new(move |grads: &[Option<Tensor>]| match &grads[0] {
        Some(g) => backward(g),
        None => Ok(vec![None; n]),
    });
    record_multi(vec![output], &[true], name, inputs, f)
        .pop()
        .expect("one output")
}
