//! Graph nodes and how ops record themselves.

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
