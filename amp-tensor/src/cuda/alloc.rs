//! A caching device allocator: freed blocks go to per-device free lists keyed by size
//! class and are handed out again, so steady-state training does no `cuMemAlloc` per op.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::context::{device_context, driver_error};
use crate::{Device, Result};

/// Smallest block handed out, in bytes (also the alignment of every size class).
const MIN_BLOCK: usize = 512;
/// Requests below this are rounded up to a power of two; larger ones to a multiple of
/// [`LARGE_ROUND`].
const SMALL_LIMIT: usize = 1 << 20;
const LARGE_ROUND: usize = 2 << 20;

/// The size class a request of `bytes` is served from.
fn size_class(bytes: usize) -> usize {
    if bytes <= MIN_BLOCK {
        MIN_BLOCK
    } else if bytes <= SMALL_LIMIT {
        bytes.next_power_of_two()
    } else {
        bytes.div_ceil(LARGE_ROUND) * LARGE_ROUND
    }
}

/// Counters of the caching allocator, per device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks currently owned by live buffers.
    pub allocated_bytes: usize,
    /// Bytes in freed blocks kept for reuse.
    pub cached_bytes: usize,
    /// Requests served from the cache.
    pub cache_hits: u64,
    /// Requests that needed a fresh device allocation.
    pub device_allocs: u64,
}

#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<CudaSlice<u8>>>,
    stats: MemoryStats,
}

fn with_pool<R>(ordinal: usize, f: impl FnOnce(&mut Pool) -> R) -> R {
    static POOLS: Mutex<Vec<Pool>> = Mutex::new(Vec::new());
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if pools.len() <= ordinal {
        pools.resize_with(ordinal + 1, Pool::default);
    }
    f(&mut pools[ordinal])
}

/// A block of device memory from the caching allocator; dropping it returns it to the
/// free list of its device and size class (no device call).
#[derive(Debug)]
pub struct Block {
    slice: Option<CudaSlice<u8>>,
    device: Device,
    class: usize,
}

impl Block {
    /// A block of at least `bytes` bytes on `device` (contents unspecified).
    ///
    /// # Errors
    /// [`crate::Error::DeviceUnavailable`] without a driver or device;
    /// [`crate::Error::DeviceFailure`] when the device is out of memory even after the
    /// cache of that device was released.
    pub fn alloc(device: Device, bytes: usize) -> Result<Block> {
        let ordinal = match device {
            Device::Cuda(n) => n,
            Device::Cpu => {
                return Err(crate::Error::invalid(
                    "cuda alloc",
                    "expected a CUDA device, got cpu",
                ))
            }
        };
        let dc = device_context(device)?;
        let class = size_class(bytes);
        let reused = with_pool(ordinal, |p| {
            let s = p.free.get_mut(&class).and_then(|v| v.pop());
            if s.is_some() {
                p.stats.cached_bytes -= class;
                p.stats.allocated_bytes += class;
                p.stats.cache_hits += 1;
            }
            s
        });
        let slice = match reused {
            Some(s) => s,
            None => {
                let fresh = alloc_raw(&dc.stream, class).or_else(|_| {
                    empty_cache(device);
                    alloc_raw(&dc.stream, class)
                });
                let s = fresh.map_err(driver_error("cuMemAlloc", device))?;
                with_pool(ordinal, |p| {
                    p.stats.allocated_bytes += class;
                    p.stats.device_allocs += 1;
                });
                s
            }
        };
        Ok(Block {
            slice: Some(slice),
            device,
            class,
        })
    }

    /// The device the block is on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The usable size in bytes (the size class, at least what was asked for).
    pub fn capacity(&self) -> usize {
        self.class
    }

    /// The block as a `cudarc` slice of bytes.
    pub fn slice(&self) -> &CudaSlice<u8> {
        self.slice.as_ref().expect("present until drop")
    }

    /// The block as a mutable `cudarc` slice of bytes.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        self.slice.as_mut().expect("present until drop")
    }

    /// The raw device address (for kernel arguments).
    pub fn device_ptr(&self, stream: &Arc<CudaStream>) -> u64 {
        let (p, _sync) = self.slice().device_ptr(stream);
        p
    }
}

fn alloc_raw(
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> std::result::Result<CudaSlice<u8>, cudarc::driver::DriverError> {
    // SAFETY: the memory is uninitialised; every user writes before it reads.
    unsafe { stream.alloc::<u8>(bytes) }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let (Some(s), Device::Cuda(ordinal)) = (self.slice.take(), self.device) {
            let class = self.class;
            with_pool(ordinal, |p| {
                p.stats.allocated_bytes -= class;
                p.stats.cached_bytes += class;
                p.free.entry(class).or_default().push(s);
            });
        }
    }
}

/// The allocator's counters for `device` (zeros for a device never used).
pub fn memory_stats(device: Device) -> MemoryStats {
    match device {
        Device::Cuda(n) => with_pool(n, |p| p.stats),
        Device::Cpu => MemoryStats::default(),
    }
}

/// Return every cached (free) block of `device` to the driver.
pub fn empty_cache(device: Device) {
    if let Device::Cuda(n) = device {
        let freed: Vec<CudaSlice<u8>> = with_pool(n, |p| {
            p.stats.cached_bytes = 0;
            p.free.drain().flat_map(|(_, v)| v).collect()
        });
        // Dropped outside the lock: cudarc frees them on their stream.
        drop(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(SMALL_LIMIT), SMALL_LIMIT);
        assert_eq!(size_class(SMALL_LIMIT + 1), LARGE_ROUND);
        assert_eq!(size_class(5 << 20), 6 << 20);
        for b in [1usize, 700, 4097, 3 << 20] {
            assert!(size_class(b) >= b && size_class(b).is_multiple_of(MIN_BLOCK));
        }
    }
}
