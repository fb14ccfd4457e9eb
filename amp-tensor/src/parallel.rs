//! Fork-join for kernels, cheap enough for work of a few microseconds.
//!
//! `rayon`'s parallel iterators called from a thread outside its pool (the user's main
//! thread, where every op is called from) hand the whole job to the pool and put the
//! caller to sleep on a lock until a woken worker has run it: tens of microseconds per
//! call on a 2-core machine, more than a 192×192 `add` costs. [`for_each`] instead
//! starts the work on the calling thread at once and lets up to `threads - 1` rayon
//! workers join in as they wake, each task taken from a shared counter; a worker that
//! wakes after the caller took the last task finds nothing to do and does not hold the
//! caller up. The caller only ever waits for tasks that a worker has already begun.
//!
//! A worker that finishes its share stays awake for [`LINGER`] (spinning, as OpenMP's
//! threads do between parallel regions) and joins the next call's job at once: a
//! training step runs op after op, and waking a sleeping worker costs more than a
//! 1M-element `add` gains from it (measured: the second core added 1.78× instead of
//! 2× to such an `add` before lingering).
//!
//! The caller claims tasks from the front (`0, 1, ...`) and helpers from the back
//! (`count - 1, count - 2, ...`), so with helpers that keep pace the caller runs the
//! first part of every call and a helper the last, as OpenMP's static schedule would:
//! consecutive elementwise ops over tensors of one size then find their part of the data
//! in the same core's cache (a 512×512 float32 `add` reads and writes 3 MB, which fits in
//! two cores' L2 caches but not in one). A late helper still takes only what is left.
//!
//! Which tasks run on which thread changes nothing in a result: each task writes its
//! own part of the output, computed the same way whoever runs it.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let sum = AtomicUsize::new(0);
//! amp_tensor::parallel::for_each(100, &|i| {
//!     sum.fetch_add(i, Ordering::Relaxed);
//! });
//! assert_eq!(sum.into_inner(), 4950);
//! ```

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a worker stays awake for the next job after finishing its share of one.
pub const LINGER: Duration = Duration::from_micros(200);

/// The task of one [`for_each`] call, its lifetime erased so that pool workers (which
/// need `'static` jobs) can hold it.
type ErasedTask = *const (dyn Fn(usize) + Sync + 'static);

/// What the caller and its helpers share.
struct Shared {
    /// The tasks not yet claimed, `front..back`, packed as `back << 32 | front`: the
    /// caller claims `front`, helpers claim `back - 1`.
    unclaimed: AtomicU64,
    /// Tasks finished (or panicked).
    done: AtomicUsize,
    task: ErasedTask,
    /// The first panic of a task, re-raised on the caller's thread.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `task` points at a `Fn + Sync` closure, which may be called from any thread;
// it is only dereferenced for a claimed task (one of the `count` of the call), and
// `for_each` does not return (so the closure outlives every such call) before all
// `count` tasks are done.
unsafe impl Send for Shared {}
// SAFETY: as above; the other fields are atomics and a mutex.
unsafe impl Sync for Shared {}

impl Shared {
    /// Claim the next task from the front (the caller) or the back (a helper); `None`
    /// when every task is claimed.
    fn claim(&self, from_back: bool) -> Option<usize> {
        let mut cur = self.unclaimed.load(Ordering::Relaxed);
        loop {
            let (front, back) = (cur & 0xffff_ffff, cur >> 32);
            if front >= back {
                return None;
            }
            let (next, t) = if from_back {
                ((back - 1) << 32 | front, back - 1)
            } else {
                (back << 32 | (front + 1), front)
            };
            match self.unclaimed.compare_exchange_weak(
                cur,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                // A task index is below `count`, which fits in 32 bits.
                Ok(_) => return Some(t as usize),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Claim and run tasks until none is left.
    fn work(&self, from_back: bool) {
        while let Some(t) = self.claim(from_back) {
            // SAFETY: task `t` was claimed before the last task was done, so the
            // caller is still inside `for_each` and the closure alive (see `Shared`).
            let task = unsafe { &*self.task };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| task(t))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Run `task(0)`, ..., `task(count - 1)`, each once, on the calling thread and on up
/// to `rayon::current_num_threads() - 1` pool workers; return when all are done.
/// A panic in a task is re-raised here after every started task has finished.
pub fn for_each(count: usize, task: &(dyn Fn(usize) + Sync)) {
    let threads = rayon::current_num_threads();
    if count <= 1 || threads <= 1 {
        (0..count).for_each(task);
        return;
    }
    // More tasks than 32 bits count run as chunks of tasks (never in practice: a task
    // is at least a cache line of work).
    if count > u32::MAX as usize {
        let per = count.div_ceil(u32::MAX as usize);
        return for_each(count.div_ceil(per), &|c| {
            (c * per..((c + 1) * per).min(count)).for_each(task)
        });
    }
    let short: *const (dyn Fn(usize) + Sync + '_) = task;
    // SAFETY: only the lifetime changes (same fat pointer); see `Shared` for why the
    // closure outlives every call made through the erased pointer.
    let erased: ErasedTask = unsafe { std::mem::transmute(short) };
    let shared = Arc::new(Shared {
        unclaimed: AtomicU64::new((count as u64) << 32),
        done: AtomicUsize::new(0),
        task: erased,
        panic: Mutex::new(None),
    });
    let helpers = (threads - 1).min(count - 1);
    let awake = publish(&shared);
    for _ in awake.min(helpers)..helpers {
        let s = Arc::clone(&shared);
        rayon::spawn(move || {
            s.work(true);
            drop(s);
            linger();
        });
    }
    shared.work(false);
    // Every index is claimed now; wait for the tasks workers are still running.
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < count {
        if spins < 1 << 12 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    retract(&shared);
    let panic = shared
        .panic
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(p) = panic {
        resume_unwind(p);
    }
}

/// The job lingering workers join next (the latest published), and its number.
static CURRENT: Mutex<Option<Arc<Shared>>> = Mutex::new(None);
static EPOCH: AtomicUsize = AtomicUsize::new(0);
/// Workers lingering now (ready to join a published job).
static LINGERING: AtomicUsize = AtomicUsize::new(0);

/// Offer `job` to lingering workers; returns how many were lingering after it was
/// offered (each of them will see it, unless another call's job replaces it first —
/// then the caller does more of its own work, which changes no result).
fn publish(job: &Arc<Shared>) -> usize {
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(job));
    EPOCH.fetch_add(1, Ordering::SeqCst);
    LINGERING.load(Ordering::SeqCst)
}

/// Take `job` back from the offer (if it is still the one offered), so that its
/// closure's erased pointer is not handed out after the call; a worker that already
/// holds it claims no task (they are all done).
fn retract(job: &Arc<Shared>) {
    let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, job)) {
        *cur = None;
    }
}

/// Stay awake for [`LINGER`] after a job, joining each newly published job at once.
fn linger() {
    LINGERING.fetch_add(1, Ordering::SeqCst);
    let mut seen = EPOCH.load(Ordering::SeqCst);
    let mut since = Instant::now();
    let mut spins = 0u32;
    loop {
        let epoch = EPOCH.load(Ordering::SeqCst);
        if epoch != seen {
            seen = epoch;
            let job = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(job) = job {
                job.work(true);
                since = Instant::now();
            }
            continue;
        }
        spins += 1;
        if spins.is_multiple_of(64) && since.elapsed() > LINGER {
            // Leave, then look once more: a caller that counted this worker as
            // lingering published its job before this worker left (and it is taken
            // here), or saw it gone and woke a worker of its own.
            LINGERING.fetch_sub(1, Ordering::SeqCst);
            if EPOCH.load(Ordering::SeqCst) != seen {
                let job = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some(job) = job {
                    job.work(true);
                }
            }
            return;
        }
        std::hint::spin_loop();
    }
}

/// The part length for splitting `n` elements over the threads: about four parts per
/// thread (so a worker that joins late, or runs slower, leaves little to wait for), at
/// least `min / 2` elements each, in whole cache lines (a multiple of 64 elements).
///
/// ```
/// let per = amp_tensor::parallel::part_len(1 << 20, 1 << 15);
/// assert!(per >= 1 << 14 && per % 64 == 0);
/// ```
pub fn part_len(n: usize, min: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(threads * 4)
        .max(min / 2)
        .max(1)
        .next_multiple_of(64)
}

/// `f(chunk_index, chunk)` for consecutive chunks of `len` elements of `out` (the last
/// may be shorter), in parallel as [`for_each`].
pub fn for_each_chunk_mut<T: Send>(
    out: &mut [T],
    len: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    // A vector of `()` allocates nothing.
    map_chunks_mut(out, len, f);
}

/// `task(0)`, ..., `task(count - 1)` run as [`for_each`] runs them, their results in
/// index order (the fork-join counterpart of a rayon `into_par_iter().map().collect()`,
/// without its hand-off of the call to the pool). A panic in a task is re-raised here;
/// the results of the tasks that finished are then leaked, not dropped.
///
/// ```
/// let squares = amp_tensor::parallel::map(5, &|i| i * i);
/// assert_eq!(squares, [0, 1, 4, 9, 16]);
/// ```
pub fn map<R: Send>(count: usize, task: &(dyn Fn(usize) -> R + Sync)) -> Vec<R> {
    let mut out: Vec<R> = Vec::with_capacity(count);
    let slots = SendPtr(out.spare_capacity_mut().as_mut_ptr());
    for_each(count, &|i| {
        let r = task(i);
        // SAFETY: slot `i < count` lies inside the capacity reserved above; each index
        // runs once, so no two tasks write one slot, and nothing reads the slots until
        // `for_each` has returned.
        unsafe { (*slots.at(i)).write(r) };
    });
    // SAFETY: `for_each` returned normally, so every task ran and wrote its slot.
    unsafe { out.set_len(count) };
    out
}

/// `f(chunk_index, chunk)` for consecutive chunks of `len` elements of `out` (the last
/// may be shorter), in parallel as [`for_each`], their results in chunk order.
pub fn map_chunks_mut<T: Send, R: Send>(
    out: &mut [T],
    len: usize,
    f: &(dyn Fn(usize, &mut [T]) -> R + Sync),
) -> Vec<R> {
    assert!(len > 0, "chunk length must be positive");
    let total = out.len();
    let base = SendPtr(out.as_mut_ptr());
    map(total.div_ceil(len), &|i| {
        let start = i * len;
        let l = len.min(total - start);
        // SAFETY: chunk `i` is elements `start..start + l` of `out`, disjoint from every
        // other chunk, each index run once; `out` is borrowed mutably for the call.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.at(start), l) };
        f(i, chunk)
    })
}

/// A raw pointer that may cross threads, for tasks that each write their own disjoint
/// elements of one buffer (the user upholds that; see [`for_each_chunk_mut`]).
pub struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only hands disjoint parts of one buffer to tasks; writes through it are the
// users' `unsafe` blocks, each with its own disjointness argument.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// The pointer `i` elements further (computed with wrapping arithmetic; only
    /// dereferenced by the caller inside the buffer).
    pub fn at(self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once() {
        for count in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            for_each(count, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "count {count}"
            );
        }
    }

    #[test]
    fn chunks_cover_the_slice() {
        let mut v = vec![0usize; 1003];
        for_each_chunk_mut(&mut v, 100, &|i, c| {
            for (j, x) in c.iter_mut().enumerate() {
                *x = i * 100 + j;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| i == x));
    }

    #[test]
    fn map_keeps_index_order() {
        for count in [0, 1, 2, 3, 17, 1000] {
            let v = map(count, &|i| vec![i; i % 3]);
            assert_eq!(v.len(), count);
            assert!(v.iter().enumerate().all(|(i, x)| *x == vec![i; i % 3]));
        }
        let mut data: Vec<usize> = (0..1003).collect();
        let sums = map_chunks_mut(&mut data, 100, &|i, c| {
            c.iter_mut().for_each(|x| *x += 1);
            (i, c.iter().sum::<usize>())
        });
        assert_eq!(sums.len(), 11);
        for (i, &(j, s)) in sums.iter().enumerate() {
            let expect: usize = (i * 100 + 1..=(i * 100 + 100).min(1003)).sum();
            assert_eq!((j, s), (i, expect));
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller_after_the_others() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            for_each(64, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 5, "task five");
            })
        }));
        let msg = r.expect_err("panics");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"task five"));
        assert_eq!(ran.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn nested_calls_finish() {
        let sum = AtomicUsize::new(0);
        for_each(8, &|_| {
            for_each(8, &|j| {
                sum.fetch_add(j, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.into_inner(), 8 * 28);
    }

    #[test]
    fn the_caller_runs_a_prefix_and_helpers_the_rest() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            for _ in 0..50 {
                let caller = std::thread::current().id();
                let on_caller: Vec<AtomicUsize> = (0..16).map(|_| AtomicUsize::new(0)).collect();
                for_each(16, &|i| {
                    if std::thread::current().id() == caller {
                        on_caller[i].store(1, Ordering::Relaxed);
                    }
                    // Long enough for a helper to wake and claim tasks.
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(20) {
                        std::hint::spin_loop();
                    }
                });
                let mine: Vec<usize> = on_caller
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .collect();
                let k = mine.iter().sum::<usize>();
                assert!(mine[..k].iter().all(|&m| m == 1), "caller ran {mine:?}");
            }
        });
    }
}
