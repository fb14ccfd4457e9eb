//! What the op-running suites need from the workspace: a tensor type with autograd, the op
//! table, and autocast regions.
//!
//! The suite runners ([`crate::suite`]) are written against these traits, so plugging in the
//! real `amp-autograd` / `amp-autocast` crates is implementing them for their tensor type
//! (and pointing [`Builtin`] at that implementation). Until then [`Pending`] stands in: its
//! op table is empty, so every op-running case is skipped as not implemented yet.

use amp_policy::DeviceType;
use amp_tensor::Tensor;

use crate::args::Output;
use crate::optable::OpTable;
use crate::vectors::AutocastRegion;

/// Tensors and ops: the part every op-running suite needs.
pub trait Backend {
    /// The tensor type ops take and return (a differentiable tensor).
    type Tensor: Clone;

    /// A short name for reports (`amp-autograd`, `pending`).
    fn name(&self) -> &str;

    /// The op implementations, by call (see [`crate::ops`]).
    fn ops(&self) -> &OpTable<Self::Tensor>;

    /// A leaf tensor holding `value` (same dtype, shape and values), marked `requires_grad`
    /// when asked.
    fn tensor(&self, value: &Tensor, requires_grad: bool) -> Result<Self::Tensor, String>;

    /// The value of `t` (detached), for comparison.
    fn value(&self, t: &Self::Tensor) -> Tensor;
}

/// Reverse-mode autograd with double backward: what the grad suite needs.
pub trait GradBackend: Backend {
    /// Whether `t` requires grad (a leaf marked so, or a result of ops on one; a gradient
    /// computed with `create_graph` that depends on an input).
    fn requires_grad(&self, t: &Self::Tensor) -> bool;

    /// The gradients of `outputs` with respect to `inputs`, backpropagating `grad_outputs`
    /// (one per output): PyTorch's
    /// `torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True, create_graph=create_graph)`.
    /// `None` for an input the outputs do not depend on. With `create_graph` the gradients
    /// are themselves differentiable.
    fn grad(
        &self,
        outputs: &[Self::Tensor],
        inputs: &[Self::Tensor],
        grad_outputs: &[Self::Tensor],
        create_graph: bool,
    ) -> Result<Vec<Option<Self::Tensor>>, String>;

    /// Differentiable elementwise product (same shapes).
    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor, String>;

    /// Differentiable sum of every element, a 0-dim tensor.
    fn sum(&self, a: &Self::Tensor) -> Result<Self::Tensor, String>;

    /// Differentiable sum of two 0-dim tensors.
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor, String>;
}

/// Autocast regions: what the autocast suite needs.
pub trait AutocastBackend: Backend {
    /// Runs `body` inside the nested autocast `regions` of `device` (outermost first; empty:
    /// no autocast), restoring the previous state afterwards.
    fn with_autocast(
        &self,
        device: DeviceType,
        regions: &[AutocastRegion],
        body: &mut dyn FnMut() -> Result<Output<Self::Tensor>, String>,
    ) -> Result<Output<Self::Tensor>, String>;
}

/// The backend [`run_builtin`](crate::run_builtin) and [`run_dir`](crate::run_dir) use.
///
/// Today [`Pending`]; when `amp-autograd` and `amp-autocast` land, an implementation of the
/// three traits over their tensor type (and `ops::table` returning an `OpTable` of it).
pub type Builtin = Pending;

/// The built-in backend.
pub fn builtin() -> Builtin {
    Pending::new()
}

/// Stands in until the autograd and autocast crates are wired: plain [`Tensor`]s and the
/// (empty) op table of [`crate::ops`], so every op-running case is skipped, and an error
/// for any autograd or autocast request.
#[derive(Debug)]
pub struct Pending {
    ops: OpTable<Tensor>,
}

impl Pending {
    /// The pending backend with the op table of [`crate::ops::table`].
    pub fn new() -> Pending {
        Pending {
            ops: crate::ops::table(),
        }
    }
}

impl Default for Pending {
    fn default() -> Self {
        Pending::new()
    }
}

const NO_AUTOGRAD: &str = "no autograd backend is wired into the conformance runner yet";

impl Backend for Pending {
    type Tensor = Tensor;

    fn name(&self) -> &str {
        "pending: autograd and autocast not wired yet"
    }

    fn ops(&self) -> &OpTable<Tensor> {
        &self.ops
    }

    fn tensor(&self, value: &Tensor, requires_grad: bool) -> Result<Tensor, String> {
        if requires_grad {
            return Err(NO_AUTOGRAD.into());
        }
        Ok(value.clone())
    }

    fn value(&self, t: &Tensor) -> Tensor {
        t.clone()
    }
}

impl GradBackend for Pending {
    fn requires_grad(&self, _: &Tensor) -> bool {
        false
    }

    fn grad(
        &self,
        _: &[Tensor],
        _: &[Tensor],
        _: &[Tensor],
        _: bool,
    ) -> Result<Vec<Option<Tensor>>, String> {
        Err(NO_AUTOGRAD.into())
    }

    fn mul(&self, _: &Tensor, _: &Tensor) -> Result<Tensor, String> {
        Err(NO_AUTOGRAD.into())
    }

    fn sum(&self, _: &Tensor) -> Result<Tensor, String> {
        Err(NO_AUTOGRAD.into())
    }

    fn add(&self, _: &Tensor, _: &Tensor) -> Result<Tensor, String> {
        Err(NO_AUTOGRAD.into())
    }
}

impl AutocastBackend for Pending {
    fn with_autocast(
        &self,
        _: DeviceType,
        regions: &[AutocastRegion],
        body: &mut dyn FnMut() -> Result<Output<Tensor>, String>,
    ) -> Result<Output<Tensor>, String> {
        if regions.iter().any(|r| r.enabled) {
            return Err("no autocast backend is wired into the conformance runner yet".into());
        }
        body()
    }
}
