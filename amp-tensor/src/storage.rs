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

/// A tensor's buffer on some device.
///
/// Only host storage exists in this build; device buffers arrive with the CUDA
/// backend (behind the `cuda` feature), and every path that would need one reports
/// [`crate::Error::DeviceUnavailable`] instead.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    Cpu(CpuStorage),
}

impl Drop for Storage {
    /// Large host buffers go to the [`crate::pool`] cache for reuse.
    fn drop(&mut self) {
        match self {
            Storage::Cpu(s) => crate::pool::give(std::mem::replace(s, CpuStorage::F32(Vec::new()))),
        }
    }
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
        }
    }
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The host buffer.
    pub fn cpu(&self) -> &CpuStorage {
        match self {
            Storage::Cpu(s) => s,
        }
    }
    /// The host buffer, mutably.
    pub fn cpu_mut(&mut self) -> &mut CpuStorage {
        match self {
            Storage::Cpu(s) => s,
        }
    }
}
