//! Flat element buffers. A tensor's storage is shared (`Arc<RwLock<_>>`) between views.

use half::{bf16, f16};

use crate::{with_dtype, DType, Device, Element, Result};

/// A host buffer of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuStorage {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

impl CpuStorage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_dtype!(self.dtype(), T => T::slice(self).map_or(0, |s| s.len()))
    }

    /// `true` when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (false for bool).
    ///
    /// # Panics
    /// When the buffer cannot be allocated ([`CpuStorage::try_zeros`] returns the error).
    pub fn zeros(dtype: DType, n: usize) -> Self {
        Self::try_zeros(dtype, n).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `n` copies of `value` cast to `dtype`.
    ///
    /// # Panics
    /// When the buffer cannot be allocated ([`CpuStorage::try_full`] returns the error).
    pub fn full(dtype: DType, n: usize, value: f64) -> Self {
        Self::try_full(dtype, n, value).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `n` zeros, or [`crate::Error::OutOfMemory`] when the buffer cannot be allocated.
    pub fn try_zeros(dtype: DType, n: usize) -> Result<Self> {
        with_dtype!(dtype, T => Ok(T::into_storage(crate::pool::try_filled(n, T::default())?)))
    }

    /// `n` copies of `value` cast to `dtype`, or [`crate::Error::OutOfMemory`].
    pub fn try_full(dtype: DType, n: usize, value: f64) -> Result<Self> {
        with_dtype!(dtype, T => Ok(T::into_storage(crate::pool::try_filled(n, <f64 as Element>::cast::<T>(value))?)))
    }

    /// The elements as `T`, if the storage holds `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::slice(self)
    }

    /// The elements as mutable `T`, if the storage holds `T`.
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        T::slice_mut(self)
    }
}

/// A tensor's buffer on some device: host memory, or (behind the `cuda` feature) a
/// CUDA device buffer.
///
/// Kernels reach a buffer through [`Storage::cpu`] or `Storage::cuda` (with the `cuda`
/// feature), which fail with [`crate::Error::NoDeviceKernel`] (or a device mismatch)
/// when the buffer lives elsewhere: a host kernel handed a device tensor reports that
/// the op has no kernel there, it never copies the data to the host behind the
/// caller's back.
#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaStorage),
}

impl Clone for Storage {
    /// A copy on the same device.
    ///
    /// # Panics
    /// When a device copy cannot be made (out of device memory, a failed device).
    fn clone(&self) -> Self {
        match self {
            Storage::Cpu(s) => Storage::Cpu(s.clone()),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Storage::Cuda(s.try_clone().unwrap_or_else(|e| panic!("{e}"))),
        }
    }
}

impl Drop for Storage {
    /// Large host buffers go to the [`crate::pool`] cache for reuse (device buffers go
    /// back to the device's caching allocator when their block drops).
    fn drop(&mut self) {
        match self {
            Storage::Cpu(s) => crate::pool::give(std::mem::replace(s, CpuStorage::F32(Vec::new()))),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => {}
        }
    }
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.dtype(),
        }
    }
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.device(),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The host buffer.
    ///
    /// # Errors
    /// [`crate::Error::NoDeviceKernel`] for a device buffer (a host kernel reached with a
    /// device tensor).
    pub fn cpu(&self) -> Result<&CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Err(crate::Error::no_device_kernel(HOST_KERNEL, s.device())),
        }
    }
    /// The host buffer, mutably.
    ///
    /// # Errors
    /// As [`Storage::cpu`].
    pub fn cpu_mut(&mut self) -> Result<&mut CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Err(crate::Error::no_device_kernel(HOST_KERNEL, s.device())),
        }
    }
    /// The device buffer.
    ///
    /// # Errors
    /// [`crate::Error::DeviceMismatch`] for a host buffer (a device kernel reached with a
    /// host tensor).
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Result<&crate::cuda::CudaStorage> {
        match self {
            Storage::Cuda(s) => Ok(s),
            Storage::Cpu(_) => Err(crate::Error::DeviceMismatch {
                op: "device kernel",
                lhs: Device::Cuda(0),
                rhs: Device::Cpu,
            }),
        }
    }
}

/// The op named when a host kernel that does not name itself meets a device buffer.
#[cfg(feature = "cuda")]
const HOST_KERNEL: &str = "host kernel";
