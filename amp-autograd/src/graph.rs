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
