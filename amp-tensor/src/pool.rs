//! A cache of large host buffers, so that a training loop (or a cast in a loop) reuses the
//! memory of tensors it has dropped instead of asking the kernel for fresh pages every time.
//!
//! A fresh multi-megabyte allocation is backed by pages the kernel maps and zeroes on first
//! touch: writing a 128 MB cast result into fresh memory runs at a few GB/s, into memory
//! already mapped at 25–30 GB/s on the same machine. PyTorch keeps such a cache for its
//! CUDA tensors; this is the host counterpart, bounded and observable:
//!
//! - Only buffers of at least [`MIN_POOLED_BYTES`] are cached (smaller ones are cheap to
//!   allocate); the cache holds at most [`cache_limit`] bytes (default
//!   [`DEFAULT_CACHE_LIMIT`]) in at most [`MAX_CACHED_BUFFERS`] buffers, dropping the
//!   least recently cached buffers first.
//! - A request for `n` elements of a dtype takes the smallest cached buffer of that dtype
//!   holding at least `n` and at most `2n` elements (the most recently cached of equals).
//! - [`empty_cache`] gives every cached buffer back to the allocator; [`stats`] counts.
//!
//! Recycled buffers only ever back new outputs that their kernel writes in full, so the
//! cache changes speed and memory use, never a value.
//!
//! ```
//! use amp_tensor::{pool, DType, Tensor};
//!
//! # fn main() -> amp_tensor::Result<()> {
//! let x = Tensor::ones([1024, 1024], DType::F32);
//! drop(x.to_dtype(DType::BF16)?); // 2 MB: cached when dropped
//! let before = pool::stats();
//! let y = x.to_dtype(DType::BF16)?; // reuses it
//! assert_eq!(pool::stats().hits, before.hits + 1);
//! assert_eq!(y.to_vec_f64()[7], 1.0);
//! pool::empty_cache();
//! assert_eq!(pool::stats().cached_bytes, 0);
//! # Ok(())
//! # }
//! ```

use std::sync::Mutex;

use crate::{CpuStorage, Element, Error, Result, ZeroBits};

/// Buffers smaller than this are left to the allocator. (At 256 KiB the allocator's
/// `calloc` of a reused block zeroes it first: a tenth of a 512×512 bfloat16 `mul`.
/// At 64–128 KiB glibc gives freed blocks back to the kernel and faults them in again:
/// the two 64 KiB bfloat16 casts of a `bmm` of [32, 16, 64] × [32, 64, 16] under
/// autocast made it take 47 µs with a 256 KiB floor, 21 µs with this one.)
pub const MIN_POOLED_BYTES: usize = 1 << 16;
/// At most this many buffers are cached (the oldest go first), so a lookup stays short.
pub const MAX_CACHED_BUFFERS: usize = 256;
/// The default bound on cached bytes (1 GiB).
pub const DEFAULT_CACHE_LIMIT: usize = 1 << 30;

/// Counters of the host buffer cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes held in cached buffers now.
    pub cached_bytes: usize,
    /// Buffers held now.
    pub cached_buffers: usize,
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests (of pooled size) the cache could not serve.
    pub misses: u64,
}

struct Cached {
    bytes: usize,
    buf: CpuStorage,
}

struct Pool {
    /// Oldest first.
    entries: Vec<Cached>,
    limit: usize,
    stats: PoolStats,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    entries: Vec::new(),
    limit: DEFAULT_CACHE_LIMIT,
    stats: PoolStats {
        cached_bytes: 0,
        cached_buffers: 0,
        hits: 0,
        misses: 0,
    },
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

fn bytes_of(buf: &CpuStorage) -> usize {
    let cap = match buf {
        CpuStorage::F16(v) => v.capacity(),
        CpuStorage::BF16(v) => v.capacity(),
        CpuStorage::F32(v) => v.capacity(),
        CpuStorage::F64(v) => v.capacity(),
        CpuStorage::I64(v) => v.capacity(),
        CpuStorage::I32(v) => v.capacity(),
        CpuStorage::Bool(v) => v.capacity(),
    };
    cap * buf.dtype().size_in_bytes()
}

/// The error of a buffer of `n` elements of `T` that cannot be had: PyTorch's
/// "DefaultCPUAllocator: not enough memory" with the byte count (saturating).
fn out_of_memory<T>(n: usize) -> Error {
    Error::OutOfMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    }
}

/// An empty vector with room for exactly `n` elements, freshly allocated (never from the
/// cache), or [`Error::OutOfMemory`]: the fallible `Vec::with_capacity`, for outputs and
/// scratch of any element type built with `push`/`extend`.
pub fn try_with_capacity<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| out_of_memory::<T>(n))?;
    Ok(v)
}

/// `n` copies of `value` in a fresh buffer, or [`Error::OutOfMemory`]: the fallible
/// `vec![value; n]`.
pub fn try_filled<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n)?;
    v.resize(n, value);
    Ok(v)
}

/// `n` zeros in a fresh buffer the allocator zeroes (`calloc`: large buffers come as
/// untouched zero pages, as `vec![0; n]` gives them), or [`Error::OutOfMemory`]: the
/// fallible `vec![0; n]` for buffers that must start at zero (accumulators).
pub fn try_zeroed<T: ZeroBits>(n: usize) -> Result<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        // SAFETY: all-zero bytes are a valid `T` (`ZeroBits`).
        return try_filled(n, unsafe { std::mem::zeroed::<T>() });
    }
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| out_of_memory::<T>(n))?;
    // SAFETY: `layout` has a non-zero size (n > 0, T not zero-sized).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(out_of_memory::<T>(n));
    }
    // SAFETY: `p` comes from the global allocator with the layout of `n` `T`s (so
    // capacity `n`), and all `n` elements are all-zero bytes, a valid `T` (`ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// `v` resized to `len` elements (new ones `value`), growing as `Vec::resize` does, or
/// [`Error::OutOfMemory`] (then `v` is unchanged): the fallible `Vec::resize`, for
/// reusable scratch buffers that grow on demand.
pub fn try_resize<T: Clone>(v: &mut Vec<T>, len: usize, value: T) -> Result<()> {
    if len > v.len() {
        v.try_reserve(len - v.len())
            .map_err(|_| out_of_memory::<T>(len))?;
    }
    v.resize(len, value);
    Ok(())
}

/// The `n` items of `iter` in a vector allocated for exactly `n` up front, or
/// [`Error::OutOfMemory`]: the fallible `collect()` of an output of known length.
pub fn try_collect<T>(n: usize, iter: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n)?;
    v.extend(iter);
    Ok(v)
}

/// An empty vector with room for at least `n` elements: a cached buffer when one fits,
/// else a fresh allocation, or [`Error::OutOfMemory`] when that cannot be had. For
/// kernels that write their output through the spare capacity
/// (`Vec::spare_capacity_mut`) and then `set_len`.
pub fn try_vec_with_capacity<T: Element>(n: usize) -> Result<Vec<T>> {
    match take::<T>(n) {
        Some(mut v) => {
            v.clear();
            Ok(v)
        }
        None => try_with_capacity(n),
    }
}

/// A vector of `n` elements for an output its caller writes in full: a cached buffer when
/// one fits (its elements then hold old, valid values), else a fresh one (zeros), or
/// [`Error::OutOfMemory`] when that cannot be had.
///
/// Kernels in other crates use it for large outputs so that they reuse dropped buffers.
pub fn try_recycled_vec<T: Element>(n: usize) -> Result<Vec<T>> {
    match take(n) {
        Some(v) => Ok(v),
        None => try_zeroed(n),
    }
}

/// A cached vector of `n` elements, or `None` (below the pooled size, or no fit).
/// Its elements hold old (valid) values: the caller overwrites every one.
pub(crate) fn take<T: Element>(n: usize) -> Option<Vec<T>> {
    if n.saturating_mul(std::mem::size_of::<T>()) < MIN_POOLED_BYTES {
        return None;
    }
    let mut p = pool();
    let best = p
        .entries
        .iter()
        .enumerate()
        .filter(|(_, c)| c.buf.dtype() == T::DTYPE)
        .map(|(i, c)| (i, c.buf.len()))
        .filter(|&(_, len)| len >= n && len <= n.saturating_mul(2))
        // The smallest fit, the most recently cached of equals: a loop that drops and
        // makes same-sized outputs keeps reusing the buffer still in cache, instead of
        // cycling through every cached one (an `add` of 1024×1024 float32 ran at half
        // speed from memory).
        .min_by_key(|&(i, len)| (len, std::cmp::Reverse(i)))
        .map(|(i, _)| i);
    let Some(i) = best else {
        p.stats.misses += 1;
        return None;
    };
    let c = p.entries.remove(i);
    p.stats.hits += 1;
    p.stats.cached_bytes -= c.bytes;
    p.stats.cached_buffers -= 1;
    drop(p);
    let mut v = into_vec::<T>(c.buf)?;
    v.truncate(n);
    Some(v)
}

fn into_vec<T: Element>(mut buf: CpuStorage) -> Option<Vec<T>> {
    T::vec_mut(&mut buf).map(std::mem::take)
}

/// Offer a dropped buffer to the cache (kept when large enough and within the limit).
pub(crate) fn give(buf: CpuStorage) {
    let bytes = bytes_of(&buf);
    if bytes < MIN_POOLED_BYTES || buf.is_empty() {
        return;
    }
    // Evicted buffers are freed after the lock is released: giving a large buffer back
    // to the kernel (`munmap`) took 440 µs per call on average in a size sweep, time in
    // which every other thread's allocation would wait on the lock.
    let mut evicted = Vec::new();
    {
        let mut p = pool();
        if bytes > p.limit {
            return;
        }
        while p.stats.cached_bytes + bytes > p.limit || p.entries.len() >= MAX_CACHED_BUFFERS {
            let old = p.entries.remove(0);
            p.stats.cached_bytes -= old.bytes;
            p.stats.cached_buffers -= 1;
            evicted.push(old);
        }
        p.stats.cached_bytes += bytes;
        p.stats.cached_buffers += 1;
        p.entries.push(Cached { bytes, buf });
    }
    drop(evicted);
}

/// Give every cached buffer back to the allocator.
pub fn empty_cache() {
    let entries = {
        let mut p = pool();
        p.stats.cached_bytes = 0;
        p.stats.cached_buffers = 0;
        std::mem::take(&mut p.entries)
    };
    drop(entries);
}

/// The cache's counters.
pub fn stats() -> PoolStats {
    pool().stats
}

/// The bound on cached bytes.
pub fn cache_limit() -> usize {
    pool().limit
}

/// Set the bound on cached bytes (0 disables the cache); buffers over it are freed now.
pub fn set_cache_limit(bytes: usize) {
    let freed = {
        let mut p = pool();
        p.limit = bytes;
        let mut freed = Vec::new();
        while p.stats.cached_bytes > bytes {
            let old = p.entries.remove(0);
            p.stats.cached_bytes -= old.bytes;
            p.stats.cached_buffers -= 1;
            freed.push(old);
        }
        freed
    };
    drop(freed);
}
