//! What the op-running suites need from the workspace: a tensor type with autograd, the op
//! table, and autocast regions.
//!
//! The suite runners ([`crate::suite`]) are written against these traits; [`Autograd`]
//! implements them over the workspace's real crates (`amp::autograd` tensors and ops,
//! `amp::autocast` regions), and is the [`Builtin`] backend. It runs on the host, or with
//! every tensor it makes on a device ([`Autograd::on`], `--device cuda`), reading values
//! back to the host for comparison.

use amp::autocast::{Autocast, AutocastGuard};
use amp::autograd::{self, GradOptions};
use amp::policy::DeviceType;
use amp::tensor::{Device, Tensor};

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

    /// The device the leaves of [`Backend::tensor`] live on, and so the ops run on
    /// ([`Device::Cpu`] unless the backend says otherwise).
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// A leaf tensor holding `value` (same dtype, shape and values) on
    /// [`Backend::device`], marked `requires_grad` when asked.
    fn tensor(&self, value: &Tensor, requires_grad: bool) -> Result<Self::Tensor, String>;

    /// The value of `t` (detached), on the host, for comparison.
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
pub type Builtin = Autograd;

/// The built-in backend (on the host).
pub fn builtin() -> Builtin {
    Autograd::new()
}

/// The workspace itself: [`amp::autograd::Tensor`]s, the op table of [`crate::ops`],
/// `amp::autograd::grad` for gradients, and `amp::autocast` regions.
///
/// Its leaves live on its device ([`Autograd::on`]): on a CUDA device, every input of an
/// op is moved there with `to_device` before it becomes a leaf
/// ([`amp::autograd::Tensor::from_raw`]), so the ops run their device kernels, and
/// [`Backend::value`] copies results back to the host (`to_device(Device::Cpu)`).
///
/// ```
/// use conformance::backend::{Autograd, Backend, GradBackend};
/// use amp::tensor::Tensor;
///
/// let b = Autograd::new();
/// let x = b.tensor(&Tensor::from_vec(vec![1.0f64, 2.0], [2]).unwrap(), true).unwrap();
/// let y = b.sum(&b.mul(&x, &x).unwrap()).unwrap();
/// let one = b.tensor(&Tensor::ones((), amp::tensor::DType::F64), false).unwrap();
/// let g = b.grad(&[y], &[x], &[one], false).unwrap();
/// assert_eq!(b.value(g[0].as_ref().unwrap()).to_vec_f64(), vec![2.0, 4.0]);
/// ```
#[derive(Debug)]
pub struct Autograd {
    ops: OpTable<autograd::Tensor>,
    device: Device,
    name: String,
}

impl Autograd {
    /// The backend with the op table of [`crate::ops::table`], on the host.
    pub fn new() -> Autograd {
        Autograd {
            ops: crate::ops::table(),
            device: Device::Cpu,
            name: "amp-autograd + amp-autocast".to_owned(),
        }
    }

    /// The backend with its tensors on `device`.
    ///
    /// # Errors
    /// [`amp::tensor::Error::DeviceUnavailable`] (or the driver's failure) when a tensor
    /// cannot be put on `device`: a build without the `cuda` feature, no driver, no such
    /// device.
    ///
    /// ```
    /// use amp::tensor::Device;
    /// use conformance::backend::{Autograd, Backend};
    ///
    /// assert_eq!(Autograd::on(Device::Cpu).unwrap().device(), Device::Cpu);
    /// if !amp::tensor::cuda::is_available() {
    ///     let e = Autograd::on(Device::Cuda(0)).unwrap_err();
    ///     assert!(matches!(e, amp::tensor::Error::DeviceUnavailable { .. }), "{e}");
    /// }
    /// ```
    pub fn on(device: Device) -> Result<Autograd, amp::tensor::Error> {
        let mut b = Autograd::new();
        if !device.is_cpu() {
            // A tensor there and back: the device, its driver and the copies work.
            Tensor::zeros([1], amp::tensor::DType::F32)
                .to_device(device)?
                .to_device(Device::Cpu)?;
            b.name = format!("{} on {device}", b.name);
        }
        b.device = device;
        Ok(b)
    }
}

impl Default for Autograd {
    fn default() -> Self {
        Autograd::new()
    }
}

fn msg(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// An autograd error's message (a missing device kernel is noted for [`crate::device`]).
fn grad_msg(e: autograd::Error) -> String {
    crate::device::error_text(&e)
}

impl Backend for Autograd {
    type Tensor = autograd::Tensor;

    fn name(&self) -> &str {
        &self.name
    }

    fn ops(&self) -> &OpTable<autograd::Tensor> {
        &self.ops
    }

    fn device(&self) -> Device {
        self.device
    }

    fn tensor(&self, value: &Tensor, requires_grad: bool) -> Result<autograd::Tensor, String> {
        // A fresh buffer: the leaf shares nothing with the caller's tensor (`to_device`
        // to another device copies).
        let raw = if self.device.is_cpu() {
            value.copy()
        } else {
            value
                .to_device(self.device)
                .map_err(|e| crate::device::tensor_error_text(&e))?
        };
        let t = autograd::Tensor::from_raw(raw);
        if requires_grad {
            t.requires_grad_(true).map_err(grad_msg)?;
        }
        Ok(t)
    }

    /// # Panics
    /// When a device tensor cannot be copied to the host (the driver's error; the runner
    /// fails the case).
    fn value(&self, t: &autograd::Tensor) -> Tensor {
        let data = t.data();
        if data.device().is_cpu() {
            data.contiguous()
        } else {
            data.to_device(Device::Cpu)
                .unwrap_or_else(|e| panic!("reading a result back from {}: {e}", data.device()))
        }
    }
}

impl GradBackend for Autograd {
    fn requires_grad(&self, t: &autograd::Tensor) -> bool {
        t.requires_grad()
    }

    fn grad(
        &self,
        outputs: &[autograd::Tensor],
        inputs: &[autograd::Tensor],
        grad_outputs: &[autograd::Tensor],
        create_graph: bool,
    ) -> Result<Vec<Option<autograd::Tensor>>, String> {
        let grad_outputs: Vec<Option<autograd::Tensor>> =
            grad_outputs.iter().cloned().map(Some).collect();
        let opts = GradOptions {
            retain_graph: create_graph.then_some(true),
            create_graph,
            allow_unused: true,
        };
        autograd::grad(outputs, inputs, &grad_outputs, opts).map_err(grad_msg)
    }

    fn mul(&self, a: &autograd::Tensor, b: &autograd::Tensor) -> Result<autograd::Tensor, String> {
        autograd::ops::mul(a, b).map_err(grad_msg)
    }

    fn sum(&self, a: &autograd::Tensor) -> Result<autograd::Tensor, String> {
        autograd::ops::sum_all(a).map_err(grad_msg)
    }

    fn add(&self, a: &autograd::Tensor, b: &autograd::Tensor) -> Result<autograd::Tensor, String> {
        autograd::ops::add(a, b).map_err(grad_msg)
    }
}

/// Open regions, left innermost first (also when entering a later one fails or the body
/// panics).
struct Regions(Vec<AutocastGuard>);

impl Drop for Regions {
    fn drop(&mut self) {
        while let Some(g) = self.0.pop() {
            drop(g);
        }
    }
}

/// Enters the nested autocast `regions` of `device`, outermost first; the regions stay
/// open until the returned value drops, which leaves them innermost first.
fn enter_regions(device: DeviceType, regions: &[AutocastRegion]) -> Result<Regions, String> {
    let mut open = Regions(Vec::with_capacity(regions.len()));
    for r in regions {
        let mut region = Autocast::new(device).enabled(r.enabled);
        if let Some(dtype) = r.dtype {
            region = region.dtype(dtype);
        }
        open.0.push(region.enter().map_err(msg)?);
    }
    Ok(open)
}

impl AutocastBackend for Autograd {
    fn with_autocast(
        &self,
        device: DeviceType,
        regions: &[AutocastRegion],
        body: &mut dyn FnMut() -> Result<Output<autograd::Tensor>, String>,
    ) -> Result<Output<autograd::Tensor>, String> {
        let open = enter_regions(device, regions)?;
        let out = body();
        drop(open);
        out
    }
}
