//! User-defined differentiable functions (PyTorch's `torch.autograd.Function`).

use std::any::Any;
use std::sync::Arc;

use crate::grad_mode::no_grad;
use crate::graph::record_multi;
use crate::{Error, Result, Tensor};

/// What forward hands to backward: saved tensors, flags, and typed extras.
#[derive(Default)]
pub struct Ctx {
    saved: Vec<Tensor>,
    non_differentiable: Vec<bool>,
    extras: Vec<Box<dyn Any + Send + Sync>>,
}

impl Ctx {
    /// Save tensors for backward (inputs or outputs). They keep their graph, so a
    /// backward written in differentiable ops supports `create_graph`.
    pub fn save_for_backward(&mut self, ts: &[&Tensor]) {
        self.saved = ts.iter().map(|t| (*t).clone()).collect();
    }
    /// The tensors saved by forward.
    pub fn saved_tensors(&self) -> &[Tensor] {
        &self.saved
    }
    /// Mark output `i` as not differentiable (an index, a mask).
    pub fn mark_non_differentiable(&mut self, i: usize) {
        if self.non_differentiable.len() <= i {
            self.non_differentiable.resize(i + 1, false);
        }
        self.non_differentiable[i] = true;
    }
    /// Store a typed value for backward (replaces one of the same type).
    pub fn set<T: Any + Send + Sync>(&mut self, v: T) {
        self.extras.retain(|e| !e.is::<T>());
        self.extras.push(Box::new(v));
    }
    /// A value stored with [`Ctx::set`].
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.extras.iter().find_map(|e| e.downcast_ref::<T>())
    }
}

/// A differentiable function with a hand-written backward.
pub trait Function: Send + Sync + 'static {
    /// Compute the outputs (runs with gradient recording off).
    fn forward(&self, ctx: &mut Ctx, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
    /// Gradients of the inputs (one entry each, `None` for none) from the outputs'
    /// gradients (`None` where an output got no gradient).
    fn backward(&self, ctx: &Ctx, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;
    /// The node name shown by `grad_fn_name`.
    fn name(&self) -> &'static str {
        "CustomFunctionBackward"
    }
}

/// Run `f` on `inputs`, recording it so backward calls `f.backward`.
pub fn apply<F: Function>(f: F, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    let f = Arc::new(f);
    let mut ctx = Ctx::default();
    let outs = no_grad(|| f.forward(&mut ctx, inputs))?;
    let raws = outs.iter().map(|t| t.data().clone()).collect();
    let diff: Vec<bool> = (0..outs.len())
        .map(|i| !ctx.non_differentiable.get(i).copied().unwrap_or(false))
        .collect();
    let n_in = inputs.len();
    let name = f.name();
    let ctx = Arc::new(ctx);
    let backward = Box::new(move |grads: &[Option<Tensor>]| {
        let g = f.backward(&ctx, grads)?;
        if g.len() != n_in {
            return Err(Error::Custom(format!(
                "function {name} returned an incorrect number of gradients (expected {n_in}, got {})",
                g.len()
            )));
        }
        Ok(g)
    });
    let refs: Vec<&Tensor> = inputs.iter().collect();
    Ok(record_multi(raws, &diff, name, &refs, backward))
}
