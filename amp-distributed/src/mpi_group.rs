//! The MPI backend (feature `mpi`): rsmpi initializes MPI; the collectives are MPI's
//! non-blocking ones (`MPI_Iallreduce`, `MPI_Ibcast`, `MPI_Iallgather`, `MPI_Ibarrier`)
//! called through `mpi::ffi` on a duplicate of `MPI_COMM_WORLD` whose error handler
//! returns error codes (the default one aborts the job), so every failure keeps its code.
//!
//! Each operation owns its host buffers until MPI has finished with them; waiting is
//! polling `MPI_Test` against the group's timeout, because a blocking MPI call waits
//! forever for a dead peer.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use ::mpi::environment::Universe;
use ::mpi::ffi;
use ::mpi::Threading;
use amp_tensor::Tensor as Raw;

use crate::group::{check_gather, check_rank, Guarded, HostBuffer, Pending, DEFAULT_TIMEOUT};
use crate::{Error, ProcessGroup, ReduceOp, Result, Work};

/// A communicator handle.
struct Comm(ffi::MPI_Comm);

// SAFETY: the handle is only used while the group's mutex is held, and MPI is
// initialized with `MPI_THREAD_SERIALIZED` (or better), which allows MPI calls from any
// thread as long as no two run at once.
unsafe impl Send for Comm {}

/// What every operation of one group shares: the communicator (its mutex serializes all
/// MPI calls), whether an operation failed, and the MPI environment (finalized when the
/// last holder drops it).
struct Shared {
    comm: Guarded<Comm>,
    universe: Option<Universe>,
}

impl Shared {
    /// The communicator, unless an earlier operation failed.
    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, Comm>> {
        self.comm.lock(op)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let universe = self.universe.take();
        let (comm, failed) = self.comm.get_mut();
        if failed {
            // A peer is gone or out of step: `MPI_Finalize` could wait for it forever.
            // Leave MPI as it is; the process exits without finalizing.
            std::mem::forget(universe);
            return;
        }
        // SAFETY: the communicator was created by `MPI_Comm_dup` and no operation is in
        // flight (each holds this `Shared`).
        unsafe { ffi::MPI_Comm_free(&mut comm.0) };
        drop(universe); // MPI_Finalize
    }
}

/// `Err(Error::Mpi)` with the code and MPI's text unless `code` is `MPI_SUCCESS`.
fn check(op: &'static str, code: c_int) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let mut text = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as the call requires.
    let rc = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    let message = if rc == 0 {
        String::from_utf8_lossy(&text[..len.clamp(0, text.len() as c_int) as usize]).into_owned()
    } else {
        "(no error text)".to_string()
    };
    Err(Error::Mpi { op, code, message })
}

/// The data-parallel process group over MPI (`MPI_COMM_WORLD`): one per process, made
/// by [`Mpi::init`] in a program started by `mpirun`. A program started without a
/// launcher is a world of one.
///
/// MPI is finalized when the group and every [`Work`] of it have been dropped, unless an
/// operation failed or timed out: then the process exits without finalizing (a
/// finalize could wait for the dead peer), and `mpirun` reports the job as failed.
#[derive(Clone)]
pub struct Mpi {
    shared: Arc<Shared>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Mpi {
    /// Initialize MPI (`MPI_Init_thread`, serialized threading) and make the world's
    /// group, with [`DEFAULT_TIMEOUT`]. Fails when MPI was initialized before.
    pub fn init() -> Result<Mpi> {
        let (universe, provided) = ::mpi::initialize_with_threading(Threading::Serialized)
            .ok_or(Error::AlreadyInitialized)?;
        if matches!(provided, Threading::Single | Threading::Funneled) {
            return Err(Error::InvalidArgument {
                op: "init",
                msg: format!(
                    "this MPI library provides {provided:?} threading; the group needs MPI_THREAD_SERIALIZED"
                ),
            });
        }
        // SAFETY: reading MPI's predefined null communicator.
        let mut comm = unsafe { ffi::RSMPI_COMM_NULL };
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: MPI is initialized; `comm`, `rank` and `size` are valid out-pointers;
        // no other thread can use the new communicator before it is returned.
        unsafe {
            check("init", ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &mut comm))?;
            check(
                "init",
                ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN),
            )?;
            check("init", ffi::MPI_Comm_rank(comm, &mut rank))?;
            check("init", ffi::MPI_Comm_size(comm, &mut size))?;
        }
        Ok(Mpi {
            shared: Arc::new(Shared {
                comm: Guarded::new(Comm(comm)),
                universe: Some(universe),
            }),
            rank: rank as usize,
            size: size as usize,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same group, whose blocking operations give up after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Mpi {
        self.timeout = timeout;
        self
    }

    /// Start an operation: `call` gets the communicator, the send and receive buffers'
    /// addresses, their element count and MPI type, and the request to fill.
    fn start(
        &self,
        op: &'static str,
        send: Option<HostBuffer>,
        mut recv: Option<HostBuffer>,
        finish: Finish,
        call: impl FnOnce(ffi::MPI_Comm, Buffers, *mut ffi::MPI_Request) -> c_int,
    ) -> Result<Work> {
        let comm = self.shared.lock(op)?;
        let of = |b: &HostBuffer| -> Result<(c_int, ffi::MPI_Datatype)> {
            let n = c_int::try_from(b.len()).map_err(|_| Error::InvalidArgument {
                op,
                msg: format!("{} elements are more than one MPI call carries", b.len()),
            })?;
            // SAFETY: reading MPI's predefined datatype handles.
            let ty = unsafe {
                match b {
                    HostBuffer::F32(_) => ffi::RSMPI_FLOAT,
                    HostBuffer::F64(_) => ffi::RSMPI_DOUBLE,
                }
            };
            Ok((n, ty))
        };
        let send_ptr = send.as_ref().map_or(std::ptr::null(), |b| match b {
            HostBuffer::F32(v) => v.as_ptr().cast::<c_void>(),
            HostBuffer::F64(v) => v.as_ptr().cast::<c_void>(),
        });
        let recv_ptr = recv.as_mut().map_or(std::ptr::null_mut(), |b| match b {
            HostBuffer::F32(v) => v.as_mut_ptr().cast::<c_void>(),
            HostBuffer::F64(v) => v.as_mut_ptr().cast::<c_void>(),
        });
        let (count, ty) = match (&send, &recv) {
            (Some(b), _) | (None, Some(b)) => of(b)?,
            // SAFETY: reading MPI's predefined null datatype.
            (None, None) => (0, unsafe { ffi::RSMPI_DATATYPE_NULL }),
        };
        // SAFETY: reading MPI's predefined null request.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let bufs = Buffers {
            send: send_ptr,
            recv: recv_ptr,
            count,
            ty,
        };
        let code = call(comm.0, bufs, &mut request);
        drop(comm);
        if let Err(e) = check(op, code) {
            self.shared.comm.set_failed();
            // MPI may hold the buffers' addresses: keep them allocated.
            std::mem::forget((send, recv));
            return Err(e);
        }
        Ok(Work::pending(
            op,
            self.timeout,
            Box::new(MpiPending {
                shared: self.shared.clone(),
                op,
                request,
                send,
                recv,
                finish,
            }),
        ))
    }
}

/// The addresses an MPI call is given; the buffers behind them are owned by the
/// operation (a `Vec`'s elements do not move when the `Vec` does).
#[derive(Clone, Copy)]
struct Buffers {
    send: *const c_void,
    recv: *mut c_void,
    count: c_int,
    ty: ffi::MPI_Datatype,
}

/// Where an operation's result goes once it has completed.
enum Finish {
    /// Nothing to write (a barrier, the root of a broadcast).
    Nothing,
    /// The receive buffer into `t`, divided by `divide_by` first (an average).
    Into { t: Raw, divide_by: Option<usize> },
    /// The receive buffer in rank order into the outputs.
    Gathered(Vec<Raw>),
}

struct MpiPending {
    shared: Arc<Shared>,
    op: &'static str,
    request: ffi::MPI_Request,
    send: Option<HostBuffer>,
    recv: Option<HostBuffer>,
    finish: Finish,
}

// SAFETY: the request handle is only used under the group's mutex (see `Comm`); the
// buffers are plain vectors.
unsafe impl Send for MpiPending {}

impl Pending for MpiPending {
    fn test(&mut self) -> Result<bool> {
        let _comm = self.shared.lock(self.op)?;
        let mut flag: c_int = 0;
        // SAFETY: `request` came from a non-blocking call of this group and has not
        // completed (a completed request is never tested again); MPI is serialized by
        // the lock held.
        let code = unsafe { ffi::MPI_Test(&mut self.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        check(self.op, code)?;
        Ok(flag != 0)
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let recv = self.recv.take();
        match std::mem::replace(&mut self.finish, Finish::Nothing) {
            Finish::Nothing => {}
            Finish::Into { t, divide_by } => {
                let mut r = recv.expect("an operation with a result receives");
                if let Some(n) = divide_by {
                    r.divide(n);
                }
                r.write_into(&t, 0)?;
            }
            Finish::Gathered(outputs) => {
                let r = recv.expect("a gather receives");
                for (i, o) in outputs.iter().enumerate() {
                    r.write_into(o, i * o.elem_count())?;
                }
            }
        }
        Ok(())
    }

    fn abandon(mut self: Box<Self>) {
        self.shared.comm.set_failed();
        // MPI may still write into (or read from) these buffers.
        std::mem::forget((self.send.take(), self.recv.take()));
    }
}

impl ProcessGroup for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_reduce_async(&self, t: &Raw, op: ReduceOp) -> Result<Work> {
        const OP: &str = "all_reduce";
        let send = HostBuffer::of(OP, t)?;
        let recv = send.zeros_like(send.len());
        // SAFETY: reading MPI's predefined reduction handles.
        let (mpi_op, divide_by) = unsafe {
            match op {
                ReduceOp::Sum => (ffi::RSMPI_SUM, None),
                ReduceOp::Max => (ffi::RSMPI_MAX, None),
                ReduceOp::Avg => (ffi::RSMPI_SUM, Some(self.size)),
            }
        };
        let finish = Finish::Into {
            t: t.clone(),
            divide_by,
        };
        self.start(OP, Some(send), Some(recv), finish, |comm, b, req| {
            // SAFETY: both buffers hold `count` elements of `ty` and outlive the request
            // (owned by the pending operation); `req` is a valid out-pointer.
            unsafe { ffi::MPI_Iallreduce(b.send, b.recv, b.count, b.ty, mpi_op, comm, req) }
        })
    }

    fn broadcast_async(&self, t: &Raw, root: usize) -> Result<Work> {
        const OP: &str = "broadcast";
        check_rank(OP, root, self.size)?;
        let buf = HostBuffer::of(OP, t)?;
        let finish = if root == self.rank {
            Finish::Nothing
        } else {
            Finish::Into {
                t: t.clone(),
                divide_by: None,
            }
        };
        let root = root as c_int;
        self.start(OP, None, Some(buf), finish, |comm, b, req| {
            // SAFETY: the buffer holds `count` elements of `ty` and outlives the request.
            unsafe { ffi::MPI_Ibcast(b.recv, b.count, b.ty, root, comm, req) }
        })
    }

    fn all_gather_async(&self, outputs: &[Raw], input: &Raw) -> Result<Work> {
        const OP: &str = "all_gather";
        check_gather(outputs, input, self.size)?;
        let send = HostBuffer::of(OP, input)?;
        let recv = send.zeros_like(send.len() * self.size);
        let finish = Finish::Gathered(outputs.to_vec());
        self.start(OP, Some(send), Some(recv), finish, |comm, b, req| {
            // SAFETY: the send buffer holds `count` elements, the receive buffer
            // `count * size`, both owned by the pending operation.
            unsafe { ffi::MPI_Iallgather(b.send, b.count, b.ty, b.recv, b.count, b.ty, comm, req) }
        })
    }

    fn barrier_async(&self) -> Result<Work> {
        self.start("barrier", None, None, Finish::Nothing, |comm, _, req| {
            // SAFETY: `req` is a valid out-pointer.
            unsafe { ffi::MPI_Ibarrier(comm, req) }
        })
    }
}
