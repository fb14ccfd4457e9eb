//! The backward pass: topological order over the recorded nodes, gradient
//! accumulation, and `grad()` with `create_graph`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::grad_mode::GradModeGuard;
use crate::graph::{run_backward, Edge, Node};
use crate::{ops, Error, Result, Tensor};

fn node_key(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// Make a gradient fit the input it flows into: PyTorch casts it to the input's dtype
/// and insists on the shape.
fn validate(
    name: &str,
    i: usize,
    g: Tensor,
    dims: &[usize],
    dtype: amp_tensor::DType,
) -> Result<Tensor> {
    if g.dims() != dims {
        return Err(Error::BadGradient(format!(
            "Function {name} returned an invalid gradient at index {i} - got {:?} but expected shape compatible with {:?}",
            g.dims(),
            dims
        )));
    }
    if g.dtype() != dtype {
        return ops::to_dtype(&g, dtype);
    }
    Ok(g)
}

fn accumulate(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(prev) => ops::add(&prev, &g)?,
    });
    Ok(())
}

/// What to do with gradients reaching leaves.
enum Sink<'a> {
    /// Accumulate into `.grad` (`backward()`).
    LeafGrads,
    /// Capture gradients of these tensors (`grad()`): by leaf id or by (node, output).
    Capture {
        leaves: &'a HashMap<u64, usize>,
        nodes: &'a HashMap<(usize, usize), usize>,
        out: &'a mut Vec<Option<Tensor>>,
    },
}

/// The leaves with post-accumulate hooks that a backward reaches, by id: how many
/// deliveries are still to come, whether one brought a gradient, and the leaf. The hooks
/// run when the last delivery arrives, so once per backward, after `.grad` is final.
#[derive(Default)]
struct HookWaits(HashMap<u64, (usize, bool, Tensor)>);

impl HookWaits {
    /// One more delivery will reach `leaf`.
    fn expect(&mut self, leaf: &Tensor) {
        if let Some(e) = self.0.get_mut(&leaf.id()) {
            e.0 += 1;
        } else if !leaf.post_accumulate_grad_hooks().is_empty() {
            self.0.insert(leaf.id(), (1, false, leaf.clone()));
        }
    }

    /// A delivery reached `leaf` (`got`: with a gradient); the last one runs its hooks.
    fn arrived(&mut self, leaf: &Tensor, got: bool) -> Result<()> {
        let Some(e) = self.0.get_mut(&leaf.id()) else {
            return Ok(());
        };
        e.0 -= 1;
        e.1 |= got;
        if e.0 == 0 {
            let (_, got, leaf) = self.0.remove(&leaf.id()).expect("present");
            if got {
                for hook in leaf.post_accumulate_grad_hooks() {
                    hook(&leaf)?;
                }
            }
        }
        Ok(())
    }
}

fn run(
    roots: &[Tensor],
    grad_outputs: &[Option<Tensor>],
    retain_graph: bool,
    create_graph: bool,
    mut sink: Sink<'_>,
) -> Result<()> {
    let _mode = GradModeGuard::new(create_graph);
    // Seed gradients.
    let mut pending: HashMap<usize, Vec<Option<Tensor>>> = HashMap::new();
    let mut nodes: HashMap<usize, Arc<Node>> = HashMap::new();
    let mut stack: Vec<Arc<Node>> = Vec::new();
    // Hooks run only where gradients are accumulated into `.grad`.
    let mut hooks = matches!(sink, Sink::LeafGrads).then(HookWaits::default);
    let mut root_leaves = Vec::new();
    for (i, root) in roots.iter().enumerate() {
        let g = match grad_outputs.get(i).cloned().flatten() {
            Some(g) => {
                if g.dims() != root.dims() {
                    return Err(Error::BadGradient(format!(
                        "Mismatch in shape: grad_output[{i}] has a shape of {:?} and output[{i}] has a shape of {:?}.",
                        g.dims(),
                        root.dims()
                    )));
                }
                g
            }
            None => {
                if root.elem_count() != 1 {
                    return Err(Error::NonScalarBackward);
                }
                Tensor::from_raw(root.data().ones_like())
            }
        };
        if !root.requires_grad() {
            return Err(Error::NoGradFn);
        }
        match root.grad_fn() {
            Some(n) => {
                let k = node_key(n);
                let slot = pending
                    .entry(k)
                    .or_insert_with(|| vec![None; n.num_outputs]);
                accumulate(&mut slot[root.output_nr()], g)?;
                if nodes.insert(k, n.clone()).is_none() {
                    stack.push(n.clone());
                }
            }
            None => root_leaves.push((root.clone(), g)),
        }
    }
    // Count dependencies among reachable nodes.
    let mut deps: HashMap<usize, usize> = HashMap::new();
    let mut seen: Vec<Arc<Node>> = stack.clone();
    while let Some(n) = stack.pop() {
        for (e, _) in &n.edges {
            if let Edge::Node(m, _) = e {
                let k = node_key(m);
                *deps.entry(k).or_insert(0) += 1;
                if nodes.insert(k, m.clone()).is_none() {
                    stack.push(m.clone());
                    seen.push(m.clone());
                }
            } else if let (Edge::Leaf(t), Some(h)) = (e, &mut hooks) {
                h.expect(t);
            }
        }
    }
    if let Some(h) = &mut hooks {
        root_leaves.iter().for_each(|(t, _)| h.expect(t));
    }
    for (root, g) in root_leaves {
        deliver_leaf(&mut sink, &root, g, create_graph)?;
        if let Some(h) = &mut hooks {
            h.arrived(&root, true)?;
        }
    }
    let mut ready: Vec<Arc<Node>> = seen
        .into_iter()
        .filter(|n| !deps.contains_key(&node_key(n)))
        .collect();
    while let Some(node) = ready.pop() {
        let k = node_key(&node);
        let grads = pending
            .remove(&k)
            .unwrap_or_else(|| vec![None; node.num_outputs]);
        if let Sink::Capture {
            nodes: wanted, out, ..
        } = &mut sink
        {
            for (nr, g) in grads.iter().enumerate() {
                if let (Some(&slot), Some(g)) = (wanted.get(&(k, nr)), g) {
                    out[slot] = Some(g.clone());
                }
            }
        }
        let input_grads = if grads.iter().all(Option::is_none) {
            vec![None; node.edges.len()]
        } else {
            let mut guard = node.backward.lock().unwrap_or_else(|e| e.into_inner());
            let f = guard.as_ref().ok_or(Error::GraphFreed)?;
            let r = run_backward(&node, f, &grads)?;
            if !retain_graph {
                *guard = None;
            }
            r
        };
        // Let go of the incoming gradients first: an input gradient that is a view of one
        // (`t()`'s backward) then owns its buffer, and a leaf can take it over.
        drop(grads);
        for (i, ((edge, meta), g)) in node.edges.iter().zip(input_grads).enumerate() {
            let g = match g {
                Some(g) => Some(validate(node.name, i, g, &meta.dims, meta.dtype)?),
                None => None,
            };
            match edge {
                Edge::None => {}
                Edge::Leaf(t) => {
                    let got = g.is_some();
                    if let Some(g) = g {
                        deliver_leaf(&mut sink, t, g, create_graph)?;
                    }
                    if let Some(h) = &mut hooks {
                        h.arrived(t, got)?;
                    }
                }
                Edge::Node(m, nr) => {
                    let mk = node_key(m);
                    if let Some(g) = g {
                        let slot = pending
                            .entry(mk)
                            .or_insert_with(|| vec![None; m.num_outputs]);
                        accumulate(&mut slot[*nr], g)?;
                    }
                    let d = deps.get_mut(&mk).expect("counted");
                    *d -= 1;
                    if *d == 0 {
                        ready.push(m.clone());
                    }
                }
            }
        }
    }
    Ok(())
}

fn deliver_leaf(sink: &mut Sink<'_>, leaf: &Tensor, g: Tensor, create_graph: bool) -> Result<()> {
    match sink {
        Sink::LeafGrads => {
            // A fresh buffer: a gradient may alias another's (the grad of `a + b` is the
            // same tensor for both), and `.grad` is modified in place (unscale_, step).
            let g = if create_graph {
                g
            } else if Arc::strong_count(&g.0) == 1 && g.data().is_exclusive() {
                // Nothing else holds this gradient or its buffer: take it over.
                Tensor::from_raw(g.data().clone())
            } else {
                Tensor::from_raw(g.data().try_copy()?)
            };
            let mut slot = leaf.grad_slot();
            let new = match slot.take() {
                None => g,
                Some(prev) if create_graph => ops::add(&prev, &g)?,
                Some(prev) => Tensor::from_raw(amp_kernels::add(prev.data(), g.data())?),
            };
            *slot = Some(new);
        }
        Sink::Capture { leaves, out, .. } => {
            if let Some(&slot) = leaves.get(&leaf.id()) {
                accumulate(&mut out[slot], g)?;
            }
        }
    }
    Ok(())
}

/// Backpropagate from `roots`, accumulating into the `.grad` of every leaf reached.
/// A missing (or `None`) gradient for a root means ones (roots must then be scalars).
pub fn backward(
    roots: &[Tensor],
    grad_outputs: &[Option<Tensor>],
    retain_graph: bool,
    create_graph: bool,
) -> Result<()> {
    run(
        roots,
        grad_outputs,
        retain_graph || create_graph,
        create_graph,
        Sink::LeafGrads,
    )
}

/// Options of [`grad`], PyTorch's defaults: graph freed unless `retain_graph`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GradOptions {
    /// Keep the graph for another backward (defaults to `create_graph`).
    pub retain_graph: Option<bool>,
    /// Record the backward pass so the returned gradients are differentiable.
    pub create_graph: bool,
    /// Return `None` for inputs the outputs do not depend on instead of failing.
    pub allow_unused: bool,
}

/// Gradients of `outputs` with respect to `inputs` (PyTorch's `torch.autograd.grad`),
/// returned instead of accumulated. With `create_graph` they are themselves
/// differentiable (gradient penalty, double backward).
pub fn grad(
    outputs: &[Tensor],
    inputs: &[Tensor],
    grad_outputs: &[Option<Tensor>],
    opts: GradOptions,
) -> Result<Vec<Option<Tensor>>> {
    let mut leaves = HashMap::new();
    let mut nodes = HashMap::new();
    for (i, t) in inputs.iter().enumerate() {
        if !t.requires_grad() {
            return Err(Error::InputDoesNotRequireGrad);
        }
        match t.grad_fn() {
            Some(n) => nodes.insert((node_key(n), t.output_nr()), i),
            None => leaves.insert(t.id(), i),
        };
    }
    let mut out = vec![None; inputs.len()];
    let retain = opts.retain_graph.unwrap_or(opts.create_graph);
    run(
        outputs,
        grad_outputs,
        retain,
        opts.create_graph,
        Sink::Capture {
            leaves: &leaves,
            nodes: &nodes,
            out: &mut out,
        },
    )?;
    if !opts.allow_unused && out.iter().any(Option::is_none) {
        return Err(Error::UnusedInput);
    }
    Ok(out)
}
