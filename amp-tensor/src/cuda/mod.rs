//! The CUDA backend's host side: availability checks, devices, streams, a caching
//! device allocator and device buffers.
//!
//! Every entry point first checks that the shared libraries it needs (`libcuda`,
//! `libnvrtc`, `libcublas`, `libcublasLt`) can be opened, by opening them itself, and
//! only then lets `cudarc` (which panics on a missing library) touch them. Without a
//! driver, without a device, or in a build without the `cuda` feature, every entry point
//! returns [`Error::DeviceUnavailable`] naming what is missing; nothing panics.
//!
//! ```
//! use amp_tensor::{cuda, Device, Error, Tensor};
//! if !cuda::is_available() {
//!     let t = Tensor::zeros([2], amp_tensor::DType::F32);
//!     assert!(matches!(t.to_device(Device::Cuda(0)), Err(Error::DeviceUnavailable { .. })));
//! }
//! ```

use crate::{Device, Error, Result};

mod probe;
pub use probe::Library;
#[cfg(not(feature = "cuda"))]
pub(crate) use probe::NOT_BUILT;
pub mod sources;

#[cfg(feature = "cuda")]
pub mod launch;

#[cfg(feature = "cuda")]
mod alloc;
#[cfg(feature = "cuda")]
mod context;
#[cfg(feature = "cuda")]
mod storage;

#[cfg(feature = "cuda")]
pub use alloc::{empty_cache, memory_stats, Block, MemoryStats};
#[cfg(feature = "cuda")]
pub use context::{device_context, driver_error, DeviceContext};
#[cfg(feature = "cuda")]
pub use storage::CudaStorage;

/// Re-exported so the kernel crate names the same `cudarc` as this one.
#[cfg(feature = "cuda")]
pub use cudarc;

/// `true` when the driver library loads and reports at least one device.
pub fn is_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

/// The number of CUDA devices the driver reports.
///
/// # Errors
/// [`Error::DeviceUnavailable`] when the build lacks the `cuda` feature, `libcuda`
/// cannot be opened, or the driver fails to initialise.
pub fn device_count() -> Result<usize> {
    imp::device_count()
}

/// Check that `device` is a CUDA device that exists and that `libs` can be opened.
///
/// # Errors
/// [`Error::DeviceUnavailable`] naming the missing library or the absent ordinal;
/// [`Error::InvalidArgument`] for [`Device::Cpu`].
pub fn ensure_device(device: Device, libs: &[Library]) -> Result<usize> {
    let ordinal = match device {
        Device::Cuda(n) => n,
        Device::Cpu => {
            return Err(Error::invalid(
                "cuda",
                "expected a CUDA device, got cpu".to_string(),
            ))
        }
    };
    for lib in libs {
        lib.ensure(device)?;
    }
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::DeviceUnavailable {
            device,
            reason: format!("invalid device ordinal: the driver reports {count} device(s)"),
        });
    }
    Ok(ordinal)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::*;

    pub(super) fn device_count() -> Result<usize> {
        Err(Error::DeviceUnavailable {
            device: Device::Cuda(0),
            reason: probe::NOT_BUILT.into(),
        })
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use std::sync::OnceLock;

    pub(super) fn device_count() -> Result<usize> {
        static COUNT: OnceLock<Result<usize>> = OnceLock::new();
        COUNT
            .get_or_init(|| {
                let device = Device::Cuda(0);
                Library::Driver.ensure(device)?;
                let fail = |e: cudarc::driver::DriverError| Error::DeviceUnavailable {
                    device,
                    reason: format!("the CUDA driver failed to initialise: {e}"),
                };
                cudarc::driver::result::init().map_err(fail)?;
                let n = cudarc::driver::result::device::get_count().map_err(fail)?;
                Ok(n.max(0) as usize)
            })
            .clone()
    }
}
