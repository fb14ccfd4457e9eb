//! The tensor value: shared storage + layout + dtype + device.

use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::convert::{copy_cast, gather_cast, scatter_cast};
use crate::shape::Dim;
use crate::{
    ensure, with_dtype, CpuStorage, DType, Device, Element, Error, Generator, Layout, Result,
    Scalar, Shape, Storage,
};

struct Inner {
    storage: Arc<RwLock<Storage>>,
    layout: Layout,
    dtype: DType,
    /// The storage's device ([`Tensor::move_to_device_`] changes it), encoded by
    /// [`DeviceCell`].
    device: DeviceCell,
    is_view: bool,
}

/// A device that can change in place: 0 for the host, `n + 1` for CUDA device `n`.
struct DeviceCell(std::sync::atomic::AtomicUsize);

impl DeviceCell {
    fn new(d: Device) -> DeviceCell {
        DeviceCell(std::sync::atomic::AtomicUsize::new(Self::code(d)))
    }
    fn code(d: Device) -> usize {
        match d {
            Device::Cpu => 0,
            Device::Cuda(n) => n + 1,
        }
    }
    fn get(&self) -> Device {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            0 => Device::Cpu,
            n => Device::Cuda(n - 1),
        }
    }
    fn set(&self, d: Device) {
        self.0
            .store(Self::code(d), std::sync::atomic::Ordering::Release);
    }
}

/// An n-dimensional array of one [`DType`] on one [`Device`].
///
/// Cloning is cheap (reference counted). Views (`transpose`, `narrow`, `expand`, ...)
/// share the storage; writes through one (`copy_`) are visible through the others.
/// This type knows nothing about gradients: `amp-autograd` wraps it.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

/// A copy of the whole buffer `st` on `device` (a different device than its own).
#[cfg(feature = "cuda")]
fn moved_to(st: &Storage, device: Device) -> Result<Storage> {
    use crate::cuda::CudaStorage;
    Ok(match (st, device) {
        (Storage::Cpu(h), Device::Cuda(_)) => Storage::Cuda(CudaStorage::from_cpu(h, device)?),
        (Storage::Cuda(d), Device::Cpu) => Storage::Cpu(d.to_cpu()?),
        (Storage::Cuda(d), Device::Cuda(_)) => {
            Storage::Cuda(CudaStorage::from_cpu(&d.to_cpu()?, device)?)
        }
        (Storage::Cpu(h), Device::Cpu) => Storage::Cpu(h.clone()),
    })
}

fn poisoned<T>(e: std::sync::PoisonError<T>) -> T {
    e.into_inner()
}

impl Tensor {
    // ----- construction -------------------------------------------------------------

    /// A tensor over `storage` viewed through `layout` (host storage).
    pub fn from_storage(storage: CpuStorage, layout: Layout) -> Result<Tensor> {
        Self::over_checked("from_storage", Storage::Cpu(storage), layout)
    }

    /// A tensor over a device buffer viewed through `layout`.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when the layout reaches past the buffer.
    #[cfg(feature = "cuda")]
    pub fn from_cuda(storage: crate::cuda::CudaStorage, layout: Layout) -> Result<Tensor> {
        Self::over_checked("from_cuda", Storage::Cuda(storage), layout)
    }

    /// [`Tensor::over`], failing when `layout` reaches past the buffer.
    fn over_checked(op: &'static str, storage: Storage, layout: Layout) -> Result<Tensor> {
        let needed = max_offset(&layout).map_or(0, |m| m + 1);
        if needed > storage.len() {
            return Err(Error::InvalidShape {
                op,
                shape: layout.dims().to_vec(),
                msg: format!(
                    "layout needs {needed} elements but storage has {}",
                    storage.len()
                ),
            });
        }
        Ok(Self::over(storage, layout))
    }

    fn over(storage: Storage, layout: Layout) -> Tensor {
        Tensor(Arc::new(Inner {
            dtype: storage.dtype(),
            device: DeviceCell::new(storage.device()),
            storage: Arc::new(RwLock::new(storage)),
            layout,
            is_view: false,
        }))
    }

    /// `value` everywhere with `shape` and `dtype` on `device` (filled on the device).
    ///
    /// # Errors
    /// As [`Tensor::try_full`], and [`Error::DeviceUnavailable`] for a device this build
    /// or machine lacks.
    pub fn full_on(
        shape: impl Into<Shape>,
        value: impl Into<Scalar>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        if device.is_cpu() {
            return Self::try_full(shape, value, dtype);
        }
        shape.storage_bytes(dtype)?;
        let one = Self::try_full([1usize], value, dtype)?.to_device(device)?;
        one.reshape(vec![1usize; shape.rank()])?
            .expand(shape.dims().to_vec())?
            .try_contiguous()
    }

    /// Zeros with `shape` and `dtype` on `device`.
    ///
    /// # Errors
    /// As [`Tensor::full_on`].
    pub fn zeros_on(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        match device {
            Device::Cpu => Self::try_zeros(shape, dtype),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => {
                shape.storage_bytes(dtype)?;
                let s = crate::cuda::CudaStorage::zeros(device, dtype, shape.elem_count())?;
                Self::from_cuda(s, Layout::contiguous(shape))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Self::full_on(shape, 0i64, dtype, device),
        }
    }

    /// A contiguous tensor owning `data` (row-major) with `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        shape.storage_bytes(T::DTYPE)?;
        if shape.elem_count() != data.len() {
            return Err(Error::InvalidShape {
                op: "from_vec",
                shape: shape.into_dims(),
                msg: format!("shape does not hold {} elements", data.len()),
            });
        }
        Self::from_storage(T::into_storage(data), Layout::contiguous(shape))
    }

    /// A contiguous tensor copied from `data`.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_vec(data.to_vec(), shape)
    }

    /// A 0-dim tensor holding `value`.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Self::from_vec(vec![value], ()).expect("one element fits a 0-dim shape")
    }

    /// A 0-dim tensor of `dtype` holding `value` cast to it.
    pub fn scalar_of(value: impl Into<Scalar>, dtype: DType) -> Tensor {
        Self::full((), value, dtype)
    }

    /// Every element `value` (cast to `dtype` with PyTorch's rules).
    ///
    /// # Panics
    /// When the shape's size overflows or the buffer cannot be allocated; [`Tensor::try_full`]
    /// returns those errors.
    pub fn full(shape: impl Into<Shape>, value: impl Into<Scalar>, dtype: DType) -> Tensor {
        Self::try_full(shape, value, dtype).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::full`], with a shape whose size overflows and a failed allocation as errors
    /// (PyTorch's "Storage size calculation overflowed", [`Error::OutOfMemory`]).
    ///
    /// ```
    /// use amp_tensor::{DType, Tensor};
    ///
    /// assert!(Tensor::try_full([(1usize << 62) + 1, 4], 1.0, DType::F32).is_err());
    /// assert!(Tensor::try_zeros([1usize << 60], DType::F32).is_err()); // 4 EiB
    /// assert_eq!(Tensor::try_ones([2], DType::F32).unwrap().to_vec_f64(), [1.0, 1.0]);
    /// ```
    pub fn try_full(
        shape: impl Into<Shape>,
        value: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        let shape = shape.into();
        shape.storage_bytes(dtype)?;
        let n = shape.elem_count();
        let storage = match value.into() {
            Scalar::Int(i) => with_dtype!(dtype, T => T::into_storage(
                crate::pool::try_filled(n, <i64 as Element>::cast::<T>(i))?
            )),
            Scalar::Bool(b) => with_dtype!(dtype, T => T::into_storage(
                crate::pool::try_filled(n, <bool as Element>::cast::<T>(b))?
            )),
            Scalar::Float(f) => CpuStorage::try_full(dtype, n, f)?,
        };
        Self::from_storage(storage, Layout::contiguous(shape))
    }

    /// Zeros.
    ///
    /// # Panics
    /// As [`Tensor::full`]; [`Tensor::try_zeros`] returns the error.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Self::try_zeros(shape, dtype).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::zeros`], with overflow and allocation failure as errors.
    pub fn try_zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        shape.storage_bytes(dtype)?;
        let storage = CpuStorage::try_zeros(dtype, shape.elem_count())?;
        Self::from_storage(storage, Layout::contiguous(shape))
    }

    /// Ones.
    ///
    /// # Panics
    /// As [`Tensor::full`]; [`Tensor::try_ones`] returns the error.
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Self::full(shape, 1i64, dtype)
    }

    /// [`Tensor::ones`], with overflow and allocation failure as errors.
    pub fn try_ones(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Self::try_full(shape, 1i64, dtype)
    }

    /// Zeros with this tensor's shape, dtype and device.
    ///
    /// # Panics
    /// When the buffer cannot be allocated.
    pub fn zeros_like(&self) -> Tensor {
        Self::zeros_on(self.shape(), self.dtype(), self.device()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Ones with this tensor's shape, dtype and device.
    ///
    /// # Panics
    /// When the buffer cannot be allocated.
    pub fn ones_like(&self) -> Tensor {
        self.full_like(1i64)
    }

    /// `value` everywhere, with this tensor's shape, dtype and device.
    ///
    /// # Panics
    /// When the buffer cannot be allocated.
    pub fn full_like(&self, value: impl Into<Scalar>) -> Tensor {
        Self::full_on(self.shape(), value, self.dtype(), self.device())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `start, start + step, ...` up to (excluding) `end`, as PyTorch's `arange`.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        ensure!(
            !(step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite()),
            invalid("arange", "invalid step {step} or bounds {start}..{end}")
        );
        if (end - start) * step < 0.0 {
            return Err(Error::invalid(
                "arange",
                "upper bound and larger bound inconsistent with step sign",
            ));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let data = with_dtype!(dtype, T => T::into_storage(crate::pool::try_collect(
            n, (0..n).map(|i| <f64 as Element>::cast::<T>(start + i as f64 * step)))?));
        Self::from_storage(data, Layout::contiguous([n]))
    }

    /// The `n × n` identity.
    pub fn eye(n: usize, dtype: DType) -> Tensor {
        let mut v = vec![0f64; n * n];
        for i in 0..n {
            v[i * n + i] = 1.0;
        }
        Tensor::from_vec(v, [n, n])
            .and_then(|t| t.to_dtype(dtype))
            .expect("sizes agree")
    }

    /// Uniform samples in `[0, 1)` drawn from `gen`.
    pub fn rand(shape: impl Into<Shape>, dtype: DType, gen: &mut Generator) -> Result<Tensor> {
        Self::sampled("rand", shape.into(), dtype, || gen.uniform())
    }

    /// Standard normal samples drawn from `gen`.
    pub fn randn(shape: impl Into<Shape>, dtype: DType, gen: &mut Generator) -> Result<Tensor> {
        Self::sampled("randn", shape.into(), dtype, || gen.normal())
    }

    /// Uniform samples in `[lo, hi)` drawn from `gen`.
    pub fn uniform(
        shape: impl Into<Shape>,
        lo: f64,
        hi: f64,
        dtype: DType,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        Self::sampled("uniform", shape.into(), dtype, || gen.uniform_range(lo, hi))
    }

    fn sampled(
        op: &'static str,
        shape: Shape,
        dtype: DType,
        mut f: impl FnMut() -> f64,
    ) -> Result<Tensor> {
        if !dtype.is_floating_point() {
            return Err(Error::UnsupportedDType { op, dtype });
        }
        shape.storage_bytes(DType::F64)?;
        let mut data = crate::pool::try_filled(shape.elem_count(), 0.0f64)?;
        data.iter_mut().for_each(|x| *x = f());
        Tensor::from_vec(data, shape)?.to_dtype(dtype)
    }

    // ----- metadata -----------------------------------------------------------------

    #[inline]
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    #[inline]
    pub fn device(&self) -> Device {
        self.0.device.get()
    }
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    #[inline]
    pub fn shape(&self) -> &Shape {
        self.0.layout.shape()
    }
    #[inline]
    pub fn dims(&self) -> &[usize] {
        self.0.layout.dims()
    }
    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }
    /// Size of one dimension (negative counts from the end).
    pub fn dim(&self, d: impl Dim) -> Result<usize> {
        self.shape().dim(d)
    }
    /// Number of elements.
    #[inline]
    pub fn elem_count(&self) -> usize {
        self.0.layout.elem_count()
    }
    #[inline]
    pub fn strides(&self) -> &[usize] {
        self.0.layout.strides()
    }
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// `true` when this tensor was made by a view op and shares another's storage.
    pub fn is_view(&self) -> bool {
        self.0.is_view
    }
    /// `true` when both tensors use the same storage buffer.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }
    /// `true` when nothing else refers to this tensor or its storage and it covers the
    /// whole storage contiguously: taking it over is then as good as a fresh copy.
    pub fn is_exclusive(&self) -> bool {
        Arc::strong_count(&self.0) == 1
            && Arc::weak_count(&self.0) == 0
            && Arc::strong_count(&self.0.storage) == 1
            && Arc::weak_count(&self.0.storage) == 0
            && self.0.layout.offset() == 0
            && self.0.layout.is_contiguous()
            && self.storage().len() == self.0.layout.elem_count()
    }
    /// An address identifying the storage buffer (for caches keyed by storage).
    pub fn storage_id(&self) -> usize {
        Arc::as_ptr(&self.0.storage) as *const () as usize
    }
    /// Read access to the storage (kernels use it with [`Tensor::layout`]).
    pub fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        self.0.storage.read().unwrap_or_else(poisoned)
    }
    /// Write access to the storage: in-place ops (optimizers, unscale) use it.
    pub fn storage_mut(&self) -> RwLockWriteGuard<'_, Storage> {
        self.0.storage.write().unwrap_or_else(poisoned)
    }

    fn view_of(&self, layout: Layout) -> Tensor {
        Tensor(Arc::new(Inner {
            storage: self.0.storage.clone(),
            layout,
            dtype: self.0.dtype,
            device: DeviceCell::new(self.device()),
            is_view: true,
        }))
    }

    // ----- extraction ---------------------------------------------------------------

    /// The elements in row-major order; `T` must be this tensor's element type.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                expected: T::DTYPE,
                got: self.dtype(),
            });
        }
        self.try_to_vec_as()
    }

    /// The elements in row-major order, each cast to `T` with PyTorch's rules.
    ///
    /// # Panics
    /// When the vector cannot be allocated ([`Tensor::try_to_vec_as`] returns the error).
    pub fn to_vec_as<T: Element>(&self) -> Vec<T> {
        self.try_to_vec_as().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::to_vec_as`], with a vector that cannot be allocated as
    /// [`Error::OutOfMemory`] (a broadcast view can stand for far more elements than its
    /// storage holds).
    pub fn try_to_vec_as<T: Element>(&self) -> Result<Vec<T>> {
        if !self.device().is_cpu() {
            return self.to_device(Device::Cpu)?.try_to_vec_as();
        }
        let st = self.storage();
        with_dtype!(self.dtype(), S => gather_cast::<S, T>(S::slice(st.cpu()?).expect("dtype matches storage"), self.layout()))
    }

    /// [`Tensor::try_to_vec_as`] for host kernels: a device tensor is
    /// [`Error::NoDeviceKernel`] instead of a copy to the host, so a kernel without a
    /// device version never computes on the host behind the caller's back. (The other
    /// reads, `to_vec*`, `item*`, copy a device tensor to the host, as PyTorch's
    /// `.tolist()` and `.item()` do.)
    pub fn host_vec_as<T: Element>(&self) -> Result<Vec<T>> {
        if !self.device().is_cpu() {
            return Err(Error::no_device_kernel("host kernel", self.device()));
        }
        self.try_to_vec_as()
    }

    /// [`Tensor::to_vec`] for host kernels (see [`Tensor::host_vec_as`]).
    pub fn host_vec<T: Element>(&self) -> Result<Vec<T>> {
        if !self.device().is_cpu() {
            return Err(Error::no_device_kernel("host kernel", self.device()));
        }
        self.to_vec()
    }

    /// The elements as f64 (exact for every dtype but int64 beyond 2^53).
    ///
    /// # Panics
    /// When the vector cannot be allocated ([`Tensor::try_to_vec_as`] returns the error).
    pub fn to_vec_f64(&self) -> Vec<f64> {
        self.to_vec_as()
    }

    /// The value of a one-element tensor as `T` (must be its element type). Counted by
    /// [`host_reads`].
    pub fn item<T: Element>(&self) -> Result<T> {
        self.check_one("item")?;
        count_host_read();
        Ok(self.to_vec::<T>()?[0])
    }

    /// The value of a one-element tensor (converted to `T`) read as an operand of a
    /// host kernel: the inverse scale of the unscale kernel, the inputs of the scale
    /// update, the gradient scale of a fused optimizer update. A host tensor's operand
    /// is not counted by [`host_reads`] (no device waits); a device tensor's is, since
    /// reading it synchronises with the device (device kernels take such operands by
    /// pointer instead).
    pub fn operand<T: Element>(&self) -> Result<T> {
        self.check_one("item")?;
        let v = self.try_to_vec_as::<T>()?[0];
        if !self.device().is_cpu() {
            count_host_read();
        }
        Ok(v)
    }

    /// The value of a one-element tensor as f64. Counted by [`host_reads`].
    pub fn item_f64(&self) -> Result<f64> {
        let v = self.operand::<f64>()?;
        if self.device().is_cpu() {
            count_host_read();
        }
        Ok(v)
    }

    fn check_one(&self, op: &'static str) -> Result<()> {
        let n = self.elem_count();
        ensure!(
            n == 1,
            invalid(
                op,
                "a Tensor with {n} elements cannot be converted to Scalar"
            )
        );
        Ok(())
    }

    // ----- conversion ---------------------------------------------------------------

    /// A copy converted to `dtype` (this tensor itself when it already has it).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        #[cfg(feature = "cuda")]
        if let Storage::Cuda(x) = &*self.storage() {
            let out = crate::cuda::launch::cast(x, self.layout(), dtype)?;
            return Tensor::from_cuda(out, Layout::contiguous(self.shape()));
        }
        let st = self.storage();
        let storage = with_dtype!(self.dtype(), S => {
            let src = S::slice(st.cpu()?).expect("dtype matches storage");
            with_dtype!(dtype, D => D::into_storage(gather_cast::<S, D>(src, self.layout())?))
        });
        Tensor::from_storage(storage, Layout::contiguous(self.shape()))
    }

    /// A copy on `device` (this tensor itself when it is already there), contiguous.
    ///
    /// # Errors
    /// [`Error::DeviceUnavailable`] naming what is missing when this build or machine
    /// lacks the device; [`Error::DeviceFailure`] with the driver's error.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        // Checks the build, the driver library and the ordinal: without them this is
        // the typed "device unavailable" error naming what is missing.
        if !device.is_cpu() {
            crate::cuda::ensure_device(device, &[crate::cuda::Library::Driver])?;
        }
        self.to_device_imp(device)
    }

    /// Move this tensor's storage to `device` in place (PyTorch's `param.data =
    /// param.data.to(device)`, what `Module::to_device` does to each parameter): clones
    /// of this tensor see it moved. The tensor must own its storage alone, with no view
    /// of it anywhere, which a freshly built parameter does.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when views share the storage; as [`Tensor::to_device`]
    /// otherwise.
    pub fn move_to_device_(&self, device: Device) -> Result<()> {
        if device == self.device() {
            return Ok(());
        }
        ensure!(
            Arc::strong_count(&self.0.storage) == 1,
            invalid(
                "to_device_",
                "the tensor shares its storage with views; move the tensor that owns it before taking views"
            )
        );
        // The whole buffer travels, so the layout (offset, strides) stays valid.
        let moved = self.to_device_checked(device)?;
        *self.storage_mut() = moved;
        self.0.device.set(device);
        Ok(())
    }

    /// This tensor's whole buffer on `device` (checked to exist).
    fn to_device_checked(&self, device: Device) -> Result<Storage> {
        if !device.is_cpu() {
            crate::cuda::ensure_device(device, &[crate::cuda::Library::Driver])?;
        }
        #[cfg(feature = "cuda")]
        return moved_to(&self.storage(), device);
        #[cfg(not(feature = "cuda"))]
        unreachable!("ensure_device fails without the cuda feature")
    }

    #[cfg(not(feature = "cuda"))]
    fn to_device_imp(&self, device: Device) -> Result<Tensor> {
        Err(Error::DeviceUnavailable {
            device,
            reason: crate::cuda::NOT_BUILT.into(),
        })
    }

    #[cfg(feature = "cuda")]
    fn to_device_imp(&self, device: Device) -> Result<Tensor> {
        // Only the view's elements travel: a copy first unless it is its whole buffer.
        let c = self.try_contiguous()?;
        let range = c.layout().contiguous_range().expect("contiguous");
        let c = if range.start == 0 && range.len() == c.storage().len() {
            c
        } else {
            c.try_copy()?
        };
        let moved = moved_to(&c.storage(), device)?;
        Ok(Self::over(moved, Layout::contiguous(self.shape())))
    }

    /// A contiguous tensor with the same values (this tensor itself when contiguous).
    ///
    /// # Panics
    /// When the copy cannot be allocated ([`Tensor::try_contiguous`] returns the error).
    pub fn contiguous(&self) -> Tensor {
        self.try_contiguous().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::contiguous`], with a copy that cannot be allocated as
    /// [`Error::OutOfMemory`] (PyTorch's `RuntimeError` for an expanded view too large
    /// to materialise).
    pub fn try_contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.try_copy()
    }

    /// A fresh contiguous copy that shares nothing with this tensor.
    ///
    /// # Panics
    /// When the copy cannot be allocated ([`Tensor::try_copy`] returns the error).
    pub fn copy(&self) -> Tensor {
        self.try_copy().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::copy`], with a copy that cannot be allocated as [`Error::OutOfMemory`].
    pub fn try_copy(&self) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Storage::Cuda(x) = &*self.storage() {
            let out = crate::cuda::launch::cast(x, self.layout(), self.dtype())?;
            return Tensor::from_cuda(out, Layout::contiguous(self.shape()));
        }
        let st = self.storage();
        let storage = with_dtype!(self.dtype(), S => S::into_storage(
            gather_cast::<S, S>(S::slice(st.cpu()?).expect("dtype matches storage"), self.layout())?));
        Tensor::from_storage(storage, Layout::contiguous(self.shape()))
    }

    /// Copy `src` into this tensor in place (PyTorch's `copy_`): `src` is broadcast to
    /// this shape, cast to this dtype and moved to this device. Views of the same
    /// storage see the change.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        if src.device() != self.device() {
            // Only the source's elements travel; the broadcast happens on arrival.
            return self.copy_(&src.to_device(self.device())?);
        }
        let src_layout = src.layout().broadcast_as(self.dims())?;
        #[cfg(feature = "cuda")]
        if !self.device().is_cpu() {
            use crate::cuda::launch::{cast, cast_into};
            if !self.same_storage(src) {
                let st = src.storage();
                let dst = self.storage_mut();
                return cast_into(st.cuda()?, &src_layout, dst.cuda()?, self.layout());
            }
            // Same storage: gather first, the source may overlap the destination.
            let gathered = cast(src.storage().cuda()?, &src_layout, src.dtype())?;
            let dst = self.storage_mut();
            return cast_into(
                &gathered,
                &Layout::contiguous(self.shape()),
                dst.cuda()?,
                self.layout(),
            );
        }
        if !self.same_storage(src) {
            let st = src.storage();
            let mut dst = self.storage_mut();
            with_dtype!(src.dtype(), S => {
                let s = S::slice(st.cpu()?).expect("dtype matches storage");
                with_dtype!(self.dtype(), D => copy_cast::<S, D>(s, &src_layout, D::slice_mut(dst.cpu_mut()?).expect("dtype matches storage"), self.layout()))
            })?;
            return Ok(());
        }
        // Same storage: gather first, the source may overlap the destination.
        let gathered = {
            let st = src.storage();
            with_dtype!(src.dtype(), S => S::into_storage(
                gather_cast::<S, S>(S::slice(st.cpu()?).expect("dtype matches storage"), &src_layout)?))
        };
        let mut dst = self.storage_mut();
        with_dtype!(src.dtype(), S => {
            let s = S::slice(&gathered).expect("gathered as S");
            with_dtype!(self.dtype(), D => scatter_cast::<S, D>(s, D::slice_mut(dst.cpu_mut()?).expect("dtype matches storage"), self.layout()))
        });
        Ok(())
    }

    /// Set every element to `value` in place.
    pub fn fill_(&self, value: impl Into<Scalar>) -> Result<()> {
        self.copy_(&Tensor::scalar_of(value, self.dtype()))
    }

    // ----- views --------------------------------------------------------------------

    /// A view with another shape; `-1` infers one size. Fails when the strides do not
    /// allow a view (use [`Tensor::reshape`]).
    pub fn view(&self, shape: impl IntoDims) -> Result<Tensor> {
        let dims = shape.resolve("view", self.elem_count())?;
        match self.layout().view(&dims) {
            Some(layout) => Ok(self.view_of(layout)),
            None => Err(Error::invalid(
                "view",
                "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces). Use .reshape(...) instead.",
            )),
        }
    }

    /// Another shape over the same elements: a view when possible, else a copy.
    pub fn reshape(&self, shape: impl IntoDims) -> Result<Tensor> {
        let dims = shape.resolve("reshape", self.elem_count())?;
        match self.layout().view(&dims) {
            Some(layout) => Ok(self.view_of(layout)),
            None => self.try_copy()?.view(dims),
        }
    }

    /// Swap two dimensions (a view).
    pub fn transpose(&self, d0: impl Dim, d1: impl Dim) -> Result<Tensor> {
        Ok(self.view_of(self.layout().transpose(d0, d1)?))
    }

    /// Transpose of a tensor with at most 2 dims (PyTorch's `.t()`).
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.view_of(self.layout().clone())),
            2 => self.transpose(0usize, 1usize),
            n => Err(Error::invalid(
                "t",
                format!("t() expects a tensor with <= 2 dimensions, but self is {n}D"),
            )),
        }
    }

    /// Reorder dimensions (a view).
    pub fn permute<D: Dim>(&self, dims: &[D]) -> Result<Tensor> {
        Ok(self.view_of(self.layout().permute(dims)?))
    }

    /// `len` entries of `dim` from `start` (a view).
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.view_of(self.layout().narrow(dim, start, len)?))
    }

    /// `x[start:end:step]` along `dim` (a view; bounds are clamped as in Python).
    pub fn slice(&self, dim: impl Dim, start: usize, end: usize, step: usize) -> Result<Tensor> {
        Ok(self.view_of(self.layout().slice(dim, start, end, step)?))
    }

    /// Entry `index` of `dim`, dropping the dimension (a view; `x[i]` for dim 0).
    pub fn select(&self, dim: impl Dim, index: i64) -> Result<Tensor> {
        Ok(self.view_of(self.layout().select(dim, index)?))
    }

    /// `x[i]`: entry `i` of the first dimension.
    pub fn get(&self, index: i64) -> Result<Tensor> {
        self.select(0usize, index)
    }

    /// Insert a size-1 dimension (a view).
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Tensor> {
        Ok(self.view_of(self.layout().unsqueeze(dim)?))
    }

    /// Drop `dim` if its size is 1 (a view).
    pub fn squeeze(&self, dim: impl Dim) -> Result<Tensor> {
        Ok(self.view_of(self.layout().squeeze(dim)?))
    }

    /// Drop every size-1 dimension (a view).
    pub fn squeeze_all(&self) -> Tensor {
        self.view_of(self.layout().squeeze_all())
    }

    /// Broadcast to `shape` without copying; `-1` keeps a size (PyTorch's `expand`).
    pub fn expand(&self, shape: impl IntoDims) -> Result<Tensor> {
        let raw = shape.raw();
        let lead = raw.len().saturating_sub(self.rank());
        let mut dims = Vec::with_capacity(raw.len());
        for (i, &s) in raw.iter().enumerate() {
            if s == -1 {
                ensure!(
                    i >= lead,
                    invalid(
                        "expand",
                        "-1 is not allowed in a leading, non-existing dimension"
                    )
                );
                dims.push(self.dims()[i - lead]);
            } else if s < 0 {
                return Err(Error::invalid("expand", format!("invalid size {s}")));
            } else {
                dims.push(s as usize);
            }
        }
        Shape::from(&dims).storage_bytes(self.dtype())?;
        Ok(self.view_of(self.layout().broadcast_as(&dims)?))
    }

    /// Broadcast to `shape` without copying.
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        shape.storage_bytes(self.dtype())?;
        Ok(self.view_of(self.layout().broadcast_as(shape.dims())?))
    }

    /// Merge dims `start..=end` into one (a view when possible).
    pub fn flatten(&self, start: impl Dim, end: impl Dim) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape([1usize]);
        }
        let (s, e) = (start.to_index(self.rank())?, end.to_index(self.rank())?);
        ensure!(
            s <= e,
            invalid(
                "flatten",
                "flatten() has invalid args: start_dim cannot come after end_dim"
            )
        );
        let d = self.dims();
        let mut dims = d[..s].to_vec();
        dims.push(d[s..=e].iter().product());
        dims.extend_from_slice(&d[e + 1..]);
        self.reshape(dims)
    }
}

fn max_offset(l: &Layout) -> Option<usize> {
    (l.elem_count() > 0).then(|| {
        l.offset()
            + l.dims()
                .iter()
                .zip(l.strides())
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
    })
}

/// A shape argument that may contain `-1` (inferred) entries.
pub trait IntoDims {
    /// The sizes as given (may contain -1).
    fn raw(&self) -> Vec<i64>;
    /// The sizes with `-1` inferred from `numel`.
    fn resolve(&self, op: &'static str, numel: usize) -> Result<Vec<usize>> {
        let raw = self.raw();
        let mut infer = None;
        let mut known = 1usize;
        for (i, &s) in raw.iter().enumerate() {
            match s {
                -1 if infer.is_none() => infer = Some(i),
                -1 => return Err(Error::invalid(op, "only one dimension can be inferred")),
                s if s < 0 => {
                    return Err(Error::invalid(op, format!("invalid shape dimension {s}")))
                }
                s => {
                    known = known
                        .checked_mul(s as usize)
                        .ok_or_else(|| crate::shape::overflow(&dims_for_msg(&raw)))?
                }
            }
        }
        let mut dims: Vec<usize> = raw.iter().map(|&s| s.max(0) as usize).collect();
        let bad = || Error::InvalidShape {
            op,
            shape: dims_for_msg(&raw),
            msg: format!("shape '{raw:?}' is invalid for input of size {numel}"),
        };
        match infer {
            Some(i) => {
                if known == 0 || !numel.is_multiple_of(known) {
                    return Err(bad());
                }
                dims[i] = numel / known;
            }
            None if known != numel => return Err(bad()),
            None => {}
        }
        Ok(dims)
    }
}

fn dims_for_msg(raw: &[i64]) -> Vec<usize> {
    raw.iter().map(|&s| s.max(0) as usize).collect()
}

macro_rules! into_dims {
    ($($t:ty),*) => {$(
        impl IntoDims for &[$t] {
            fn raw(&self) -> Vec<i64> { self.iter().map(|&v| v as i64).collect() }
        }
        impl IntoDims for Vec<$t> {
            fn raw(&self) -> Vec<i64> { self.iter().map(|&v| v as i64).collect() }
        }
        impl IntoDims for &Vec<$t> {
            fn raw(&self) -> Vec<i64> { self.iter().map(|&v| v as i64).collect() }
        }
        impl<const N: usize> IntoDims for [$t; N] {
            fn raw(&self) -> Vec<i64> { self.iter().map(|&v| v as i64).collect() }
        }
        impl<const N: usize> IntoDims for &[$t; N] {
            fn raw(&self) -> Vec<i64> { self.iter().map(|&v| v as i64).collect() }
        }
    )*};
}
into_dims!(usize, i64, i32);

impl IntoDims for &Shape {
    fn raw(&self) -> Vec<i64> {
        self.dims().iter().map(|&v| v as i64).collect()
    }
}
impl IntoDims for Shape {
    fn raw(&self) -> Vec<i64> {
        self.dims().iter().map(|&v| v as i64).collect()
    }
}
impl IntoDims for () {
    fn raw(&self) -> Vec<i64> {
        Vec::new()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tensor {
    /// `tensor([...], shape=[..], dtype=bfloat16)`, eliding the middle of long tensors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.to_vec_f64();
        let show = |x: f64| {
            if self.dtype() == DType::Bool {
                (if x != 0.0 { "True" } else { "False" }).to_string()
            } else if self.dtype().is_floating_point() {
                format!("{x:.4}")
            } else {
                format!("{x}")
            }
        };
        let items: Vec<String> = if v.len() > 12 {
            v[..6]
                .iter()
                .map(|&x| show(x))
                .chain(std::iter::once("...".into()))
                .chain(v[v.len() - 6..].iter().map(|&x| show(x)))
                .collect()
        } else {
            v.iter().map(|&x| show(x)).collect()
        };
        write!(
            f,
            "tensor([{}], shape={:?}, dtype={}",
            items.join(", "),
            self.dims(),
            self.dtype()
        )?;
        if self.device() != Device::Cpu {
            write!(f, ", device={}", self.device())?;
        }
        f.write_str(")")
    }
}

thread_local! {
    static HOST_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_host_read() {
    HOST_READS.with(|c| c.set(c.get() + 1));
}

/// How many single values this thread has read back with [`Tensor::item`] or
/// [`Tensor::item_f64`], or as the [`Tensor::operand`] of a device tensor. For a device
/// tensor each is a synchronisation with the device,
/// which a training step should make at most once (`GradScaler` reads one flag per
/// step: the skip decision); tests pin such counts with it.
pub fn host_reads() -> u64 {
    HOST_READS.with(|c| c.get())
}
