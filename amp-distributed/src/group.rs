//! The `ProcessGroup` trait, the `Work` handle of a non-blocking operation, and the
//! host buffers operations run on.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use amp_tensor::{DType, Device, Tensor as Raw};

use crate::{Error, Result};

/// How [`ProcessGroup::all_reduce`] combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise maximum (a NaN on any rank need not win; use `Sum` to spread NaNs).
    Max,
    /// The sum divided by the group size (in the wide type, before narrowing).
    Avg,
}

/// PyTorch's default collective timeout (`torch.distributed`'s 30 minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A group of processes that communicate (`torch.distributed.ProcessGroup`).
///
/// Every operation works on raw tensors of float32, float64, bfloat16 or float16, in
/// place, on every rank of the group in the same order (the collective contract: a rank
/// that calls another operation, or none, makes the others wait). The values travel as
/// float32 (16-bit and float32 tensors) or float64: a 16-bit tensor is widened, reduced
/// in float32 (MPI has no 16-bit float type) and rounded once to nearest even when it is
/// written back, so a bfloat16 sum is the float32 sum of the bfloat16 values, rounded.
///
/// A blocking operation is its non-blocking form followed by [`Work::wait`], which
/// polls the request against the group's [`timeout`](ProcessGroup::timeout) and fails
/// with [`Error::Timeout`] instead of hanging when a peer died.
pub trait ProcessGroup: Send + Sync + fmt::Debug {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// How long a blocking operation (or [`Work::wait`]) waits for its peers.
    fn timeout(&self) -> Duration;
    /// Where the tensors it communicates live: the host for the backends that copy
    /// through host buffers (they take tensors on any device), the group's GPU for
    /// `Nccl` (which takes tensors on that GPU only).
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// Start reducing `t` across the ranks; every rank's `t` holds the result once the
    /// returned work has completed.
    fn all_reduce_async(&self, t: &Raw, op: ReduceOp) -> Result<Work>;
    /// Start copying `root`'s `t` into every other rank's `t`.
    fn broadcast_async(&self, t: &Raw, root: usize) -> Result<Work>;
    /// Start gathering every rank's `input` into `outputs[rank]` on every rank
    /// (`outputs`: `size()` tensors of `input`'s shape and dtype).
    fn all_gather_async(&self, outputs: &[Raw], input: &Raw) -> Result<Work>;
    /// Start a barrier: it completes once every rank has started it.
    fn barrier_async(&self) -> Result<Work>;

    /// [`ProcessGroup::all_reduce_async`], waited for.
    fn all_reduce(&self, t: &Raw, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(t, op)?.wait()
    }
    /// [`ProcessGroup::broadcast_async`], waited for.
    fn broadcast(&self, t: &Raw, root: usize) -> Result<()> {
        self.broadcast_async(t, root)?.wait()
    }
    /// [`ProcessGroup::all_gather_async`], waited for.
    fn all_gather(&self, outputs: &[Raw], input: &Raw) -> Result<()> {
        self.all_gather_async(outputs, input)?.wait()
    }
    /// [`ProcessGroup::barrier_async`], waited for.
    fn barrier(&self) -> Result<()> {
        self.barrier_async()?.wait()
    }
}

/// A backend's communicator behind the mutex that serialises the calls on it, and
/// whether an operation of the group failed (then every later one is refused with
/// [`Error::GroupFailed`]).
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))] // the backends'
pub(crate) struct Guarded<C> {
    comm: Mutex<C>,
    failed: AtomicBool,
}

#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
impl<C> Guarded<C> {
    pub(crate) fn new(comm: C) -> Self {
        Guarded {
            comm: Mutex::new(comm),
            failed: AtomicBool::new(false),
        }
    }

    /// The communicator, unless an earlier operation failed.
    pub(crate) fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, C>> {
        if self.failed.load(Ordering::Acquire) {
            return Err(Error::GroupFailed { op });
        }
        Ok(self.lock_anyway())
    }

    /// The communicator, failed or not (to abort or free it).
    pub(crate) fn lock_anyway(&self) -> MutexGuard<'_, C> {
        self.comm.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mark the group failed.
    pub(crate) fn set_failed(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// The communicator and whether the group failed, when nothing else holds it (drop).
    pub(crate) fn get_mut(&mut self) -> (&mut C, bool) {
        let failed = *self.failed.get_mut();
        (
            self.comm.get_mut().unwrap_or_else(|e| e.into_inner()),
            failed,
        )
    }
}

/// An operation in flight, as a backend runs it.
pub(crate) trait Pending: Send {
    /// Drive the operation; `true` once it has completed (its buffers are the
    /// transport's no more).
    fn test(&mut self) -> Result<bool>;
    /// Write the results into the tensors, after `test` returned `true`.
    fn finish(self: Box<Self>) -> Result<()>;
    /// Give up on an operation that did not complete: its buffers stay allocated (the
    /// transport may still write them) and the group is marked failed.
    fn abandon(self: Box<Self>);
}

/// The handle of a non-blocking operation (`torch.distributed.Work`): the tensors hold
/// the result after [`Work::wait`] returned `Ok`. Dropping a work that has not completed
/// waits for it (up to the timeout), since its buffers belong to the transport until
/// then.
#[must_use = "the result is in the tensors only after wait()"]
pub struct Work {
    op: &'static str,
    timeout: Duration,
    pending: Option<Box<dyn Pending>>,
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("op", &self.op)
            .field("completed", &self.pending.is_none())
            .finish()
    }
}

impl Work {
    /// A work that has completed (a one-rank group's operations).
    pub(crate) fn done(op: &'static str) -> Work {
        Work {
            op,
            timeout: Duration::ZERO,
            pending: None,
        }
    }

    #[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))] // the backends' (and tests')
    pub(crate) fn pending(op: &'static str, timeout: Duration, p: Box<dyn Pending>) -> Work {
        Work {
            op,
            timeout,
            pending: Some(p),
        }
    }

    /// The operation's name (`"all_reduce"`, ...).
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Drive the operation once without blocking; `true` once it has completed and the
    /// results are in the tensors (`Work.is_completed`). Calling it while other work
    /// goes on is what makes a transport without a progress thread advance.
    pub fn is_completed(&mut self) -> Result<bool> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(true);
        };
        match p.test() {
            Ok(false) => Ok(false),
            Ok(true) => {
                let p = self.pending.take().expect("checked");
                p.finish()?;
                Ok(true)
            }
            Err(e) => {
                self.pending.take().expect("checked").abandon();
                Err(e)
            }
        }
    }

    /// Wait until the operation has completed, or fail with [`Error::Timeout`] after the
    /// group's timeout (the request is polled, so a dead peer cannot hang this call).
    pub fn wait(mut self) -> Result<()> {
        self.wait_inner()
    }

    fn wait_inner(&mut self) -> Result<()> {
        let start = Instant::now();
        let mut idle = Duration::ZERO;
        loop {
            if self.is_completed()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                if let Some(p) = self.pending.take() {
                    p.abandon();
                }
                return Err(Error::Timeout {
                    op: self.op,
                    after: self.timeout,
                });
            }
            // Spin briefly (a reduction among local processes takes microseconds), then
            // back off to at most a millisecond between polls.
            if waited < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                idle = (idle * 2)
                    .clamp(Duration::from_micros(20), Duration::from_millis(1))
                    .min(self.timeout - waited);
                std::thread::sleep(idle);
            }
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if self.pending.is_some() {
            // The error has nowhere to go; a timed-out work leaves its buffers allocated.
            let _ = self.wait_inner();
        }
    }
}

/// A tensor's values on the host as the transport carries them: float64 stays float64,
/// the other floating dtypes travel as float32.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // the MPI backend's (and tests')
pub(crate) enum HostBuffer {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl HostBuffer {
    /// `t`'s values in row-major order, widened (float32/float64 are copied exactly).
    pub(crate) fn of(op: &'static str, t: &Raw) -> Result<HostBuffer> {
        let host = if t.device() == Device::Cpu {
            t.clone()
        } else {
            t.to_device(Device::Cpu)?
        };
        Ok(match wire_dtype(op, t.dtype())? {
            DType::F64 => HostBuffer::F64(host.try_to_vec_as()?),
            _ => HostBuffer::F32(host.try_to_vec_as()?),
        })
    }

    /// Zeros of `t`'s wire type, `n` elements.
    pub(crate) fn zeros_like(&self, n: usize) -> HostBuffer {
        match self {
            HostBuffer::F32(_) => HostBuffer::F32(vec![0.0; n]),
            HostBuffer::F64(_) => HostBuffer::F64(vec![0.0; n]),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            HostBuffer::F32(v) => v.len(),
            HostBuffer::F64(v) => v.len(),
        }
    }

    /// Divide every element by `n` (an average from a sum).
    pub(crate) fn divide(&mut self, n: usize) {
        match self {
            HostBuffer::F32(v) => v.iter_mut().for_each(|x| *x /= n as f32),
            HostBuffer::F64(v) => v.iter_mut().for_each(|x| *x /= n as f64),
        }
    }

    /// Write elements `start..start + t.elem_count()` into `t`, narrowed to its dtype
    /// (round to nearest even).
    pub(crate) fn write_into(&self, t: &Raw, start: usize) -> Result<()> {
        let n = t.elem_count();
        let src = match self {
            HostBuffer::F32(v) => Raw::from_slice(&v[start..start + n], t.dims())?,
            HostBuffer::F64(v) => Raw::from_slice(&v[start..start + n], t.dims())?,
        };
        let src = if t.device() == Device::Cpu {
            src
        } else {
            src.to_device(t.device())?
        };
        t.copy_(&src)?;
        Ok(())
    }
}

/// The type `dtype` travels as; only floating dtypes are communicated.
pub(crate) fn wire_dtype(op: &'static str, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::BF16 | DType::F16 => Ok(DType::F32),
        _ => Err(Error::UnsupportedDtype { op, dtype }),
    }
}

/// PyTorch's checks of `broadcast`'s root.
pub(crate) fn check_rank(op: &'static str, rank: usize, size: usize) -> Result<()> {
    if rank >= size {
        return Err(Error::InvalidRank { op, rank, size });
    }
    Ok(())
}

/// `all_gather`'s outputs: one per rank, each of the input's shape and dtype.
pub(crate) fn check_gather(outputs: &[Raw], input: &Raw, size: usize) -> Result<()> {
    const OP: &str = "all_gather";
    wire_dtype(OP, input.dtype())?;
    if outputs.len() != size {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!(
                "expected {size} output tensors (one per rank), got {}",
                outputs.len()
            ),
        });
    }
    for (i, o) in outputs.iter().enumerate() {
        if o.dims() != input.dims() || o.dtype() != input.dtype() {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!(
                    "output {i} is {:?} {} but the input is {:?} {}",
                    o.dims(),
                    o.dtype(),
                    input.dims(),
                    input.dtype()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An operation that completes after `polls` tests (never, with `usize::MAX`),
    /// counting what happens to it.
    struct Scripted {
        polls: usize,
        seen: Arc<[AtomicUsize; 3]>, // tests, finishes, abandons
    }

    impl Pending for Scripted {
        fn test(&mut self) -> Result<bool> {
            let n = self.seen[0].fetch_add(1, Ordering::Relaxed) + 1;
            Ok(n >= self.polls)
        }
        fn finish(self: Box<Self>) -> Result<()> {
            self.seen[1].fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn abandon(self: Box<Self>) {
            self.seen[2].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn work(polls: usize, timeout: Duration) -> (Work, Arc<[AtomicUsize; 3]>) {
        let seen = Arc::new([
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        ]);
        let p = Scripted {
            polls,
            seen: seen.clone(),
        };
        (Work::pending("all_reduce", timeout, Box::new(p)), seen)
    }

    fn counts(seen: &[AtomicUsize; 3]) -> [usize; 3] {
        [0, 1, 2].map(|i| seen[i].load(Ordering::Relaxed))
    }

    #[test]
    fn wait_polls_until_done_and_finishes_once() {
        let (w, seen) = work(5, Duration::from_secs(60));
        w.wait().unwrap();
        assert_eq!(counts(&seen), [5, 1, 0]);
    }

    #[test]
    fn a_peer_that_never_answers_is_a_timeout_not_a_hang() {
        let timeout = Duration::from_millis(50);
        let (w, seen) = work(usize::MAX, timeout);
        let start = Instant::now();
        let e = w.wait().unwrap_err();
        let took = start.elapsed();
        assert_eq!(
            e,
            Error::Timeout {
                op: "all_reduce",
                after: timeout
            }
        );
        assert!(
            e.to_string().contains("did not complete within 50ms"),
            "{e}"
        );
        assert!(took >= timeout && took < Duration::from_secs(5), "{took:?}");
        let [tests, finishes, abandons] = counts(&seen);
        assert!(tests > 1);
        assert_eq!((finishes, abandons), (0, 1));
    }

    #[test]
    fn is_completed_drives_and_dropping_waits() {
        let (mut w, seen) = work(3, Duration::from_secs(60));
        assert!(!w.is_completed().unwrap());
        assert!(!w.is_completed().unwrap());
        assert!(w.is_completed().unwrap());
        assert!(w.is_completed().unwrap());
        assert_eq!(counts(&seen), [3, 1, 0]);
        let (w, seen) = work(4, Duration::from_secs(60));
        drop(w);
        assert_eq!(counts(&seen), [4, 1, 0]);
    }

    #[test]
    fn host_buffers_widen_and_narrow() {
        let t = Raw::from_vec(vec![1.0f32, 2.5, -3.0], [3])
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let mut b = HostBuffer::of("all_reduce", &t).unwrap();
        assert_eq!(b, HostBuffer::F32(vec![1.0, 2.5, -3.0]));
        b.divide(2);
        b.write_into(&t, 0).unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(t.to_vec_f64(), vec![0.5, 1.25, -1.5]);
        let d = Raw::from_vec(vec![0.1f64], [1]).unwrap();
        assert_eq!(
            HostBuffer::of("broadcast", &d).unwrap(),
            HostBuffer::F64(vec![0.1])
        );
        let e = HostBuffer::of("broadcast", &Raw::zeros([1], DType::I64)).unwrap_err();
        assert!(matches!(
            e,
            Error::UnsupportedDtype {
                op: "broadcast",
                dtype: DType::I64
            }
        ));
    }
}
