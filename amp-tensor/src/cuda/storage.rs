//! A device buffer of one dtype, and host <-> device copies.

use std::sync::Arc;

use super::alloc::Block;
use super::context::{device_context, driver_error, DeviceContext};
use crate::{with_dtype, CpuStorage, DType, Device, Element, Error, Result};

/// `n` elements of one dtype in device memory (a block of the caching allocator).
#[derive(Debug)]
pub struct CudaStorage {
    block: Block,
    dtype: DType,
    len: usize,
    ctx: Arc<DeviceContext>,
}

fn bytes_of<T>(s: &[T]) -> &[u8] {
    // SAFETY: every element type of a storage is plain data without padding.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

fn bytes_of_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; the bytes written come from a buffer of the same dtype (bool
    // buffers hold only 0 or 1, which the device kernels preserve).
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

impl CudaStorage {
    /// An uninitialised buffer of `len` elements of `dtype` on `device`, for kernels
    /// that write every element.
    ///
    /// # Errors
    /// [`Error::DeviceUnavailable`] without driver or device; [`Error::DeviceFailure`]
    /// when out of memory.
    pub fn uninit(device: Device, dtype: DType, len: usize) -> Result<CudaStorage> {
        let ctx = device_context(device)?;
        let block = Block::alloc(device, len * dtype.size_in_bytes())?;
        Ok(CudaStorage {
            block,
            dtype,
            len,
            ctx,
        })
    }

    /// `len` zeros (false for bool) on `device`, set on the device's stream.
    ///
    /// # Errors
    /// As [`CudaStorage::uninit`].
    pub fn zeros(device: Device, dtype: DType, len: usize) -> Result<CudaStorage> {
        let mut s = Self::uninit(device, dtype, len)?;
        let stream = s.ctx.stream.clone();
        stream
            .memset_zeros(s.block.slice_mut())
            .map_err(driver_error("cuMemsetD8", device))?;
        Ok(s)
    }

    /// A copy of a host buffer on `device` (queued on its stream).
    ///
    /// # Errors
    /// As [`CudaStorage::uninit`].
    pub fn from_cpu(src: &CpuStorage, device: Device) -> Result<CudaStorage> {
        let mut s = Self::uninit(device, src.dtype(), src.len())?;
        let nbytes = s.nbytes();
        if nbytes > 0 {
            let stream = s.ctx.stream.clone();
            with_dtype!(src.dtype(), T => {
                let host = bytes_of(T::slice(src).expect("dtype matches storage"));
                let mut dst = s.block.slice_mut().slice_mut(0..nbytes);
                stream
                    .memcpy_htod(host, &mut dst)
                    .map_err(driver_error("cuMemcpyHtoD", device))?;
            });
        }
        Ok(s)
    }

    /// The elements copied back to the host (waits for the device's stream).
    ///
    /// # Errors
    /// [`Error::DeviceFailure`] with any error of the queued work.
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        let nbytes = self.nbytes();
        let device = self.device();
        with_dtype!(self.dtype, T => {
            let mut host = vec![T::default(); self.len];
            if nbytes > 0 {
                let src = self.block.slice().slice(0..nbytes);
                self.ctx
                    .stream
                    .memcpy_dtoh(&src, bytes_of_mut(&mut host))
                    .map_err(driver_error("cuMemcpyDtoH", device))?;
                self.ctx.synchronize()?;
            }
            Ok(T::into_storage(host))
        })
    }

    /// A device-to-device copy of this buffer (on the same device).
    ///
    /// # Errors
    /// As [`CudaStorage::uninit`].
    pub fn try_clone(&self) -> Result<CudaStorage> {
        let mut s = Self::uninit(self.device(), self.dtype, self.len)?;
        let nbytes = self.nbytes();
        if nbytes > 0 {
            let src = self.block.slice().slice(0..nbytes);
            let mut dst = s.block.slice_mut().slice_mut(0..nbytes);
            self.ctx
                .stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(driver_error("cuMemcpyDtoD", self.device()))?;
        }
        Ok(s)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// `true` when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size of the elements in bytes.
    pub fn nbytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }
    /// The device it lives on.
    pub fn device(&self) -> Device {
        self.block.device()
    }
    /// The device's context and stream.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }
    /// The raw device address of element 0 (for kernel arguments).
    pub fn device_ptr(&self) -> u64 {
        self.block.device_ptr(&self.ctx.stream)
    }
    /// Check that this buffer holds `dtype`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] otherwise.
    pub fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype != dtype {
            return Err(Error::DTypeMismatch {
                op,
                expected: dtype,
                got: self.dtype,
            });
        }
        Ok(())
    }
}
