//! The differentiable tensor: a raw tensor plus gradient metadata.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use amp_tensor::{DType, Device, Element, Layout, Shape, Tensor as Raw};

use crate::engine;
use crate::graph::Node;
use crate::{Error, Result};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Inner {
    id: u64,
    data: Raw,
    requires_grad: AtomicBool,
    grad_fn: Option<Arc<Node>>,
    output_nr: usize,
    grad: Mutex<Option<Tensor>>,
    /// Hooks run after backward accumulated into `.grad` (leaves only), with the id
    /// each was registered under.
    post_accumulate_grad_hooks: Mutex<Vec<(u64, PostAccumulateGradHook)>>,
}

/// A hook run once per backward after a leaf's gradient was accumulated into `.grad`
/// (see [`Tensor::register_post_accumulate_grad_hook`]).
pub type PostAccumulateGradHook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

static NEXT_HOOK_ID: AtomicU64 = AtomicU64::new(1);

/// Removes the hook it was returned for ([`Tensor::register_post_accumulate_grad_hook`]);
/// dropping it leaves the hook in place, as PyTorch's `RemovableHandle` does.
#[derive(Debug, Clone)]
pub struct HookHandle {
    tensor: std::sync::Weak<Inner>,
    id: u64,
}

impl HookHandle {
    /// Unregister the hook (nothing happens if the tensor is gone or it was removed).
    pub fn remove(&self) {
        if let Some(inner) = self.tensor.upgrade() {
            inner
                .post_accumulate_grad_hooks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(id, _)| *id != self.id);
        }
    }
}

/// A tensor that can take part in automatic differentiation.
///
/// Wraps an [`amp_tensor::Tensor`] (its [`data`](Tensor::data)) with `requires_grad`,
/// the node that produced it (non-leaves) and the accumulated `.grad` (leaves).
/// Cloning is cheap and yields the same tensor (same identity, same grad).
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

impl Tensor {
    /// A leaf that does not require grad, over `data`.
    pub fn from_raw(data: Raw) -> Tensor {
        Self::make(data, false, None, 0)
    }

    /// A leaf over `data` that requires grad (a parameter). Fails for non-float dtypes.
    pub fn parameter(data: Raw) -> Result<Tensor> {
        let t = Self::from_raw(data);
        t.requires_grad_(true)?;
        Ok(t)
    }

    pub(crate) fn make(
        data: Raw,
        requires_grad: bool,
        grad_fn: Option<Arc<Node>>,
        output_nr: usize,
    ) -> Tensor {
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            data,
            requires_grad: AtomicBool::new(requires_grad),
            grad_fn,
            output_nr,
            grad: Mutex::new(None),
            post_accumulate_grad_hooks: Mutex::new(Vec::new()),
        }))
    }

    /// A contiguous tensor from row-major `data` with `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::from_vec(data, shape)?))
    }

    /// A contiguous tensor copied from `data`.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::from_slice(data, shape)?))
    }

    /// A 0-dim tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Self::from_raw(Raw::scalar(v))
    }

    /// Zeros of `dtype`.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Self::from_raw(Raw::zeros(shape, dtype))
    }

    /// Zeros of `dtype` on `device`.
    ///
    /// # Errors
    /// As [`amp_tensor::Tensor::zeros_on`].
    pub fn zeros_on(
        shape: impl Into<Shape>,
        dtype: DType,
        device: amp_tensor::Device,
    ) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::zeros_on(shape, dtype, device)?))
    }

    /// Ones of `dtype`.
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Self::from_raw(Raw::ones(shape, dtype))
    }

    /// `value` everywhere.
    pub fn full(
        shape: impl Into<Shape>,
        value: impl Into<amp_tensor::Scalar>,
        dtype: DType,
    ) -> Tensor {
        Self::from_raw(Raw::full(shape, value, dtype))
    }

    /// Zeros, with a shape whose size overflows and a failed allocation as errors (the
    /// infallible constructors panic on them).
    pub fn try_zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::try_zeros(shape, dtype)?))
    }

    /// `value` everywhere, with overflow and allocation failure as errors.
    pub fn try_full(
        shape: impl Into<Shape>,
        value: impl Into<amp_tensor::Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::try_full(shape, value, dtype)?))
    }

    /// Standard normal samples.
    pub fn randn(
        shape: impl Into<Shape>,
        dtype: DType,
        gen: &mut amp_tensor::Generator,
    ) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::randn(shape, dtype, gen)?))
    }

    /// Uniform samples in `[0, 1)`.
    pub fn rand(
        shape: impl Into<Shape>,
        dtype: DType,
        gen: &mut amp_tensor::Generator,
    ) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::rand(shape, dtype, gen)?))
    }

    /// `0, 1, ..., n - 1`-style ranges.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        Ok(Self::from_raw(Raw::arange(start, end, step, dtype)?))
    }

    // ----- metadata -----------------------------------------------------------------

    /// The values (no gradient information).
    #[inline]
    pub fn data(&self) -> &Raw {
        &self.0.data
    }
    /// A process-unique identity (clones share it).
    #[inline]
    pub fn id(&self) -> u64 {
        self.0.id
    }
    #[inline]
    pub fn dtype(&self) -> DType {
        self.0.data.dtype()
    }
    #[inline]
    pub fn device(&self) -> Device {
        self.0.data.device()
    }
    #[inline]
    pub fn dims(&self) -> &[usize] {
        self.0.data.dims()
    }
    #[inline]
    pub fn shape(&self) -> &Shape {
        self.0.data.shape()
    }
    #[inline]
    pub fn layout(&self) -> &Layout {
        self.0.data.layout()
    }
    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.0.data.rank()
    }
    /// Size of one dimension (negative counts from the end).
    pub fn dim(&self, d: impl amp_tensor::Dim) -> Result<usize> {
        Ok(self.0.data.dim(d)?)
    }
    /// Number of elements.
    #[inline]
    pub fn elem_count(&self) -> usize {
        self.0.data.elem_count()
    }
    /// `true` when made by a view op (shares another tensor's storage).
    pub fn is_view(&self) -> bool {
        self.0.data.is_view()
    }
    /// `true` when the elements are row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        self.0.data.is_contiguous()
    }
    /// Whether gradients are computed for this tensor.
    #[inline]
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }
    /// `true` for tensors not produced by a recorded op.
    #[inline]
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }
    /// The name of the backward node that produced this tensor (`"MmBackward0"`-style).
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        self.0.grad_fn.as_ref().map(|n| n.name)
    }
    pub(crate) fn grad_fn(&self) -> Option<&Arc<Node>> {
        self.0.grad_fn.as_ref()
    }
    pub(crate) fn output_nr(&self) -> usize {
        self.0.output_nr
    }

    /// Turn gradient tracking of a leaf on or off.
    pub fn requires_grad_(&self, requires_grad: bool) -> Result<&Self> {
        if !self.is_leaf() {
            if requires_grad {
                return Ok(self);
            }
            return Err(Error::invalid(
                "requires_grad_",
                "you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().",
            ));
        }
        if requires_grad && !self.dtype().is_floating_point() {
            return Err(Error::invalid(
                "requires_grad_",
                "only Tensors of floating point dtype can require gradients",
            ));
        }
        self.0.requires_grad.store(requires_grad, Ordering::Relaxed);
        Ok(self)
    }

    /// The same values, cut from the graph (shares storage; does not require grad).
    pub fn detach(&self) -> Tensor {
        Tensor::from_raw(self.0.data.clone())
    }

    /// The accumulated gradient of a leaf (`.grad`).
    pub fn grad(&self) -> Option<Tensor> {
        self.0
            .grad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replace the accumulated gradient (`.grad = g`); `None` clears it.
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            if g.dims() != self.dims() {
                return Err(Error::BadGradient(format!(
                    "assigned grad has data of a different size: {:?} vs {:?}",
                    g.dims(),
                    self.dims()
                )));
            }
            if g.dtype() != self.dtype() {
                return Err(Error::BadGradient(format!(
                    "assigned grad has data of a different type: {} vs {}",
                    g.dtype(),
                    self.dtype()
                )));
            }
        }
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = grad;
        Ok(())
    }

    /// Clear `.grad` (PyTorch's `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Run `hook` after each backward has accumulated this leaf's gradient into `.grad`
    /// (PyTorch's `register_post_accumulate_grad_hook`): once per backward, after the
    /// last contribution, with the leaf as argument (its `.grad` is final). Data-parallel
    /// training starts a gradient's all-reduce from it while backward goes on. An error
    /// from a hook stops the backward and is returned by it. Hooks do not run for
    /// [`crate::grad`], which accumulates nothing.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use amp_autograd::{ops, Tensor};
    ///
    /// let w = Tensor::from_vec(vec![3.0f32], [1])?;
    /// w.requires_grad_(true)?;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let handle = w.register_post_accumulate_grad_hook(move |p| {
    ///     log.lock().unwrap().push(p.grad().unwrap().to_vec_f64()[0]);
    ///     Ok(())
    /// })?;
    /// ops::sum_all(&ops::mul(&w, &w)?)?.backward()?; // w used twice: the hook runs once
    /// assert_eq!(*seen.lock().unwrap(), vec![6.0]);
    /// handle.remove();
    /// ops::sum_all(&w)?.backward()?;
    /// assert_eq!(seen.lock().unwrap().len(), 1);
    /// # Ok::<(), amp_autograd::Error>(())
    /// ```
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        if !self.is_leaf() {
            return Err(Error::invalid(
                "register_post_accumulate_grad_hook",
                "post accumulate grad hooks cannot be registered on non-leaf tensors",
            ));
        }
        if !self.requires_grad() {
            return Err(Error::invalid(
                "register_post_accumulate_grad_hook",
                "cannot register a hook on a tensor that doesn't require gradient",
            ));
        }
        let id = NEXT_HOOK_ID.fetch_add(1, Ordering::Relaxed);
        self.0
            .post_accumulate_grad_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, Arc::new(hook)));
        Ok(HookHandle {
            tensor: Arc::downgrade(&self.0),
            id,
        })
    }

    /// The registered post-accumulate hooks, in registration order (a copy, so that a
    /// hook may register or remove hooks).
    pub(crate) fn post_accumulate_grad_hooks(&self) -> Vec<PostAccumulateGradHook> {
        self.0
            .post_accumulate_grad_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, h)| h.clone())
            .collect()
    }

    pub(crate) fn grad_slot(&self) -> std::sync::MutexGuard<'_, Option<Tensor>> {
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Backpropagate from this scalar, accumulating into the leaves' `.grad`; frees the
    /// graph.
    pub fn backward(&self) -> Result<()> {
        engine::backward(std::slice::from_ref(self), &[], false, false)
    }

    /// Backpropagate with options (PyTorch's `backward(gradient, retain_graph,
    /// create_graph)`): an explicit gradient for a non-scalar output, keeping the graph,
    /// recording the backward pass.
    ///
    /// ```
    /// use amp_autograd::{ops, BackwardOptions, Tensor};
    ///
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
    /// x.requires_grad_(true)?;
    /// let y = ops::mul(&x, &x)?;
    /// let g = Tensor::from_vec(vec![1.0f32, 0.5], [2])?;
    /// y.backward_with(BackwardOptions { gradient: Some(&g), retain_graph: Some(true), ..Default::default() })?;
    /// y.backward_with(BackwardOptions { gradient: Some(&g), ..Default::default() })?; // graph kept once
    /// assert_eq!(x.grad().unwrap().to_vec_f64(), vec![4.0, 4.0]);
    /// # Ok::<(), amp_autograd::Error>(())
    /// ```
    pub fn backward_with(&self, opts: BackwardOptions<'_>) -> Result<()> {
        let g: Vec<Option<Tensor>> = vec![opts.gradient.cloned()];
        let retain = opts.retain_graph.unwrap_or(opts.create_graph);
        engine::backward(std::slice::from_ref(self), &g, retain, opts.create_graph)
    }

    /// The values as `T` (must be the element type).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.0.data.to_vec()?)
    }
    /// The values as f64.
    pub fn to_vec_f64(&self) -> Vec<f64> {
        self.0.data.to_vec_f64()
    }
    /// The value of a one-element tensor as f64.
    pub fn item_f64(&self) -> Result<f64> {
        Ok(self.0.data.item_f64()?)
    }
    /// The value of a one-element tensor as `T`.
    pub fn item<T: Element>(&self) -> Result<T> {
        Ok(self.0.data.item()?)
    }
}

impl From<Raw> for Tensor {
    fn from(data: Raw) -> Self {
        Tensor::from_raw(data)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.data.to_string();
        let s = s.strip_suffix(')').unwrap_or(&s);
        match self.grad_fn_name() {
            Some(n) => write!(f, "{s}, grad_fn=<{n}>)"),
            None if self.requires_grad() => write!(f, "{s}, requires_grad=True)"),
            None => write!(f, "{s})"),
        }
    }
}

/// Options of [`Tensor::backward_with`], PyTorch's defaults: no explicit gradient (the
/// output must be a scalar), graph freed unless `retain_graph` (which defaults to
/// `create_graph`), backward not recorded.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackwardOptions<'a> {
    /// The gradient of the output (its shape); `None` for a one-element output.
    pub gradient: Option<&'a Tensor>,
    /// Keep the graph for another backward (defaults to `create_graph`).
    pub retain_graph: Option<bool>,
    /// Record the backward pass so the accumulated gradients are differentiable.
    pub create_graph: bool,
}
