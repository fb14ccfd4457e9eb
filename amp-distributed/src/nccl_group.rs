//! The NCCL backend (feature `cuda`): the collectives run on the GPU, on tensors that
//! live there (`torch.distributed`'s `nccl` backend). `libnccl` is opened at run time
//! (through `cudarc`), after a probe that turns a missing library into a typed
//! `DeviceUnavailable` error.
//!
//! Bootstrap as NCCL and PyTorch do: rank 0 makes an [`NcclId`], sends it to the other
//! ranks out of band ([`NcclId::to_hex`] / [`NcclId::from_hex`]: a command line, a file,
//! a key-value store), and every rank calls [`Nccl::init`] with its rank and GPU. NCCL
//! wants one GPU per rank: two ranks on one GPU fail at init with `ncclInvalidUsage`.
//!
//! Every operation is queued on the stream that all work on the group's device goes to
//! (amp-tensor's one stream per device), so it runs after the kernels that produced its
//! tensors and before the ones that read them, with no extra synchronisation; a CUDA
//! event recorded after it is what [`Work`] polls against the timeout. A collective
//! that does not complete in time (a dead peer) aborts the communicator
//! (`ncclCommAbort`, which stops its kernels) and fails with [`Error::Timeout`]; the
//! group refuses every later operation.
//!
//! The numerics are the [`ProcessGroup`] contract: float32 and float64 reduce natively;
//! a 16-bit tensor is widened to float32 on the device, reduced, and rounded once when
//! it is written back; an average is the sum divided by the group size in the wide type
//! (not `ncclAvg`, which multiplies by `1/size` before summing). Broadcast and
//! all-gather move the values unchanged in their own dtype. A non-contiguous tensor is
//! communicated through a contiguous copy, copied back. Nothing read from the
//! environment changes a result (NCCL's own `NCCL_*` variables tune transports and
//! algorithms, not this crate's arithmetic; the reduction order across ranks is NCCL's).

use std::ffi::c_void;
use std::fmt;
use std::sync::{mpsc, Arc, MutexGuard};
use std::time::Duration;

use amp_kernels::BinaryOp;
use amp_tensor::cuda::{device_context, driver_error, DeviceContext, Library};
use amp_tensor::{DType, Device, Tensor as Raw};
use cudarc::driver::CudaEvent;
use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys::{self, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::group::{check_gather, check_rank, wire_dtype, Guarded, Pending};
use crate::{Error, ProcessGroup, ReduceOp, Result, Work};

/// The size of NCCL's unique id (`NCCL_UNIQUE_ID_BYTES`).
const ID_BYTES: usize = 128;

/// The unique id of an NCCL communicator (`ncclUniqueId`): made once, by rank 0, and
/// handed to every rank's [`Nccl::init`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; ID_BYTES]);

impl fmt::Debug for NcclId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclId({})", self.to_hex())
    }
}

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`; it also picks the address rank 0 listens on).
    ///
    /// # Errors
    /// [`Error::Tensor`] with `DeviceUnavailable` when `libnccl` cannot be opened;
    /// [`Error::Nccl`] when NCCL fails.
    pub fn new() -> Result<NcclId> {
        Library::Nccl.ensure(Device::Cuda(0))?;
        let id = nccl::get_uniqueid().map_err(nccl_error("ncclGetUniqueId"))?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// The id's 128 bytes.
    pub fn as_bytes(&self) -> &[u8; ID_BYTES] {
        &self.0
    }

    /// The id as 256 lower-case hex digits, to pass on a command line.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// An id from [`NcclId::to_hex`]'s text (either case).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `hex` is exactly 256 hex digits.
    pub fn from_hex(hex: &str) -> Result<NcclId> {
        let bad = |msg: String| Error::InvalidArgument {
            op: "NcclId::from_hex",
            msg,
        };
        let digits: Vec<char> = hex.chars().collect();
        if digits.len() != 2 * ID_BYTES {
            return Err(bad(format!(
                "expected {} hex digits, got {} characters",
                2 * ID_BYTES,
                digits.len()
            )));
        }
        let mut id = [0u8; ID_BYTES];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            let digit = |c: char| {
                c.to_digit(16)
                    .ok_or_else(|| bad(format!("{c:?} is not a hex digit")))
            };
            id[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Ok(NcclId(id))
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

/// NCCL's result code of a failed call (`ncclResult_t`), the source of [`Error::Nccl`].
#[derive(Clone, PartialEq, Eq)]
pub struct NcclFailure(pub NcclError);

impl NcclFailure {
    /// The code, as NCCL numbers it (`ncclInvalidUsage` is 5).
    pub fn code(&self) -> u32 {
        self.0 .0 as u32
    }

    /// `true` for `ncclInvalidUsage` (among others: two ranks on one GPU).
    pub fn is_invalid_usage(&self) -> bool {
        self.0 .0 == ncclResult_t::ncclInvalidUsage
    }

    /// The code's name and NCCL's description of it (`ncclGetErrorString`'s text).
    fn describe(&self) -> (&'static str, &'static str) {
        match self.0 .0 {
            ncclResult_t::ncclSuccess => ("ncclSuccess", "no error"),
            ncclResult_t::ncclUnhandledCudaError => {
                ("ncclUnhandledCudaError", "unhandled cuda error")
            }
            ncclResult_t::ncclSystemError => ("ncclSystemError", "unhandled system error"),
            ncclResult_t::ncclInternalError => ("ncclInternalError", "internal error"),
            ncclResult_t::ncclInvalidArgument => ("ncclInvalidArgument", "invalid argument"),
            ncclResult_t::ncclInvalidUsage => ("ncclInvalidUsage", "invalid usage"),
            ncclResult_t::ncclRemoteError => (
                "ncclRemoteError",
                "remote process exited or there was a network error",
            ),
            ncclResult_t::ncclInProgress => ("ncclInProgress", "NCCL operation in progress"),
            _ => ("unknown", "an NCCL result code this build does not know"),
        }
    }
}

impl fmt::Debug for NcclFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclFailure({:?})", self.0 .0)
    }
}

impl fmt::Display for NcclFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, text) = self.describe();
        write!(f, "{name} ({}): {text}", self.code())
    }
}

impl std::error::Error for NcclFailure {}

/// The [`Error::Nccl`] of call `op`.
fn nccl_error(op: &'static str) -> impl Fn(NcclError) -> Error {
    move |e| Error::Nccl {
        op,
        source: NcclFailure(e),
    }
}

/// A communicator handle; null once aborted or destroyed.
struct Comm(sys::ncclComm_t);

// SAFETY: the handle is only used while the group's mutex is held (an NCCL
// communicator may be used from any thread, one call at a time).
unsafe impl Send for Comm {}

/// What every operation of one group shares: the communicator (its mutex serializes the
/// NCCL calls), whether an operation failed, and the device's context and stream.
struct Shared {
    comm: Guarded<Comm>,
    ctx: Arc<DeviceContext>,
}

impl Shared {
    /// The communicator, unless an earlier operation failed.
    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, Comm>> {
        self.comm.lock(op)
    }

    /// Mark the group failed and abort the communicator (its kernels stop waiting for
    /// peers); `comm` is the held lock, if the caller has it.
    fn fail(&self, comm: Option<&mut Comm>) {
        self.comm.set_failed();
        let mut guard;
        let comm = match comm {
            Some(c) => c,
            None => {
                guard = self.comm.lock_anyway();
                &mut *guard
            }
        };
        if !comm.0.is_null() {
            // SAFETY: the handle came from `ncclCommInitRank` and is aborted once (it is
            // nulled here); an abort is how NCCL ends a communicator in an unknown
            // state. Its result has nowhere to go: the group is failed either way.
            let _ = unsafe { nccl::comm_abort(comm.0) };
            comm.0 = std::ptr::null_mut();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let (comm, _) = self.comm.get_mut();
        if comm.0.is_null() {
            return;
        }
        // SAFETY: no operation is in flight (each holds this `Shared` until it has
        // completed or been abandoned, which aborts), and the handle is not used again.
        // `ncclCommDestroy` waits for the communicator's queued work.
        let _ = unsafe { nccl::comm_destroy(comm.0) };
        comm.0 = std::ptr::null_mut();
    }
}

/// The data-parallel process group over NCCL, one rank per process and GPU, made by
/// [`Nccl::init`]. It communicates tensors on its GPU only (a host tensor is
/// [`Error::WrongDevice`], PyTorch's "Tensors must be CUDA and dense").
///
/// The communicator is destroyed when the group and every [`Work`] of it have been
/// dropped (aborted instead when an operation failed or timed out).
#[derive(Clone)]
pub struct Nccl {
    shared: Arc<Shared>,
    rank: usize,
    size: usize,
    device: Device,
    timeout: Duration,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Nccl {
    /// Join the communicator `id` as `rank` of `world_size` on the CUDA `device`
    /// (`ncclCommInitRank`), waiting at most `timeout` for the other ranks to join; the
    /// group's operations use the same timeout.
    ///
    /// # Errors
    /// [`Error::InvalidRank`] for a rank outside the world; [`Error::Tensor`] with
    /// `DeviceUnavailable` without `libnccl`, driver or device; [`Error::Nccl`] with
    /// NCCL's code (`ncclInvalidUsage` for two ranks on one GPU); [`Error::Timeout`]
    /// when the other ranks do not join in time (the joining thread is left behind:
    /// NCCL's init cannot be cancelled before it returns a communicator).
    pub fn init(
        rank: usize,
        world_size: usize,
        id: &NcclId,
        device: Device,
        timeout: Duration,
    ) -> Result<Nccl> {
        const OP: &str = "init";
        check_rank(OP, rank, world_size)?;
        let nranks = i32::try_from(world_size).map_err(|_| Error::InvalidArgument {
            op: OP,
            msg: format!("a world of {world_size} ranks is more than NCCL takes"),
        })?;
        Library::Nccl.ensure(device)?;
        let ctx = device_context(device)?;
        let (tx, rx) = mpsc::channel();
        let (bind, raw_id) = (ctx.ctx.clone(), id.raw());
        // `ncclCommInitRank` blocks until every rank has joined: run it aside, so that a
        // rank that never comes is a timeout here.
        std::thread::spawn(move || {
            let joined = bind
                .bind_to_thread()
                .map_err(driver_error("cuCtxSetCurrent", device))
                .map_err(Error::from)
                .and_then(|()| {
                    let mut comm = std::mem::MaybeUninit::uninit();
                    // SAFETY: `comm` is a valid out-pointer, written when the call
                    // succeeds; the thread's current context is the device's, which is
                    // the device NCCL binds the communicator to.
                    unsafe {
                        nccl::comm_init_rank(comm.as_mut_ptr(), nranks, raw_id, rank as i32)
                            .map_err(nccl_error("ncclCommInitRank"))?;
                        Ok(Comm(comm.assume_init()))
                    }
                });
            // The receiver is gone after a timeout: the communicator is then leaked.
            let _ = tx.send(joined);
        });
        let comm = match rx.recv_timeout(timeout) {
            Ok(joined) => joined?,
            Err(_) => {
                return Err(Error::Timeout {
                    op: "ncclCommInitRank",
                    after: timeout,
                })
            }
        };
        Ok(Nccl {
            shared: Arc::new(Shared {
                comm: Guarded::new(comm),
                ctx,
            }),
            rank,
            size: world_size,
            device,
            timeout,
        })
    }

    /// The same group, whose blocking operations give up after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Nccl {
        self.timeout = timeout;
        self
    }

    /// The version of the NCCL library loaded (`ncclGetVersion`: 22304 for 2.23.4).
    ///
    /// # Errors
    /// As [`NcclId::new`].
    pub fn version() -> Result<i32> {
        Library::Nccl.ensure(Device::Cuda(0))?;
        nccl::get_nccl_version().map_err(nccl_error("ncclGetVersion"))
    }

    /// `t` is on this group's device and of a communicated dtype.
    fn check(&self, op: &'static str, t: &Raw) -> Result<()> {
        if t.device() != self.device {
            return Err(Error::WrongDevice {
                op,
                got: t.device(),
                expected: self.device,
            });
        }
        wire_dtype(op, t.dtype())?;
        Ok(())
    }

    /// Start an operation: `enqueue` queues it on the device's stream (given the
    /// communicator and stream handles) and returns the temporaries it uses; an event
    /// recorded after it tells when it has run. An NCCL error fails the group.
    fn start(
        &self,
        op: &'static str,
        enqueue: impl FnOnce(&Call) -> Result<Vec<Raw>>,
    ) -> Result<Work> {
        let mut comm = self.shared.lock(op)?;
        let ctx = &self.shared.ctx;
        ctx.ctx
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent", self.device))?;
        let call = Call {
            comm: comm.0,
            stream: ctx.stream.cu_stream() as sys::cudaStream_t,
        };
        let temporaries = match enqueue(&call) {
            Ok(t) => t,
            Err(e) => {
                if matches!(e, Error::Nccl { .. }) {
                    self.shared.fail(Some(&mut comm));
                }
                return Err(e);
            }
        };
        let event = ctx
            .stream
            .record_event(None)
            .map_err(driver_error("cuEventRecord", self.device))?;
        drop(comm);
        Ok(Work::pending(
            op,
            self.timeout,
            Box::new(NcclPending {
                shared: self.shared.clone(),
                op,
                device: self.device,
                event,
                temporaries,
            }),
        ))
    }
}

/// The handles an NCCL call is given.
struct Call {
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
}

/// NCCL's type for `dtype`.
fn nccl_type(dtype: DType) -> ncclDataType_t {
    match dtype {
        DType::F64 => ncclDataType_t::ncclFloat64,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::F16 => ncclDataType_t::ncclFloat16,
        _ => ncclDataType_t::ncclFloat32,
    }
}

/// The device address of contiguous `t`'s first element.
fn address(t: &Raw) -> Result<*mut c_void> {
    let st = t.storage();
    let base = st.cuda()?.device_ptr();
    let offset = (t.layout().offset() * t.dtype().size_in_bytes()) as u64;
    Ok((base + offset) as *mut c_void)
}

struct NcclPending {
    shared: Arc<Shared>,
    op: &'static str,
    device: Device,
    event: CudaEvent,
    /// The buffers the queued work reads and writes.
    temporaries: Vec<Raw>,
}

impl Pending for NcclPending {
    fn test(&mut self) -> Result<bool> {
        let comm = self.shared.lock(self.op)?;
        if self
            .event
            .try_is_complete()
            .map_err(driver_error("cuEventQuery", self.device))?
        {
            return Ok(true);
        }
        // Not done: NCCL may know already that a peer is gone.
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: the communicator is live (the group has not failed, the lock is held)
        // and `state` is a valid out-pointer.
        unsafe { sys::ncclCommGetAsyncError(comm.0, &mut state) }
            .result()
            .map_err(nccl_error("ncclCommGetAsyncError"))?;
        match state {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(false),
            other => Err(nccl_error(self.op)(NcclError(other))),
        }
    }

    fn finish(self: Box<Self>) -> Result<()> {
        // The results were written by the work queued at the start.
        Ok(())
    }

    fn abandon(mut self: Box<Self>) {
        self.shared.fail(None);
        // The aborted kernels are stopped, but nothing says when: keep their buffers
        // out of the allocator's reuse.
        std::mem::forget(std::mem::take(&mut self.temporaries));
    }
}

impl ProcessGroup for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn device(&self) -> Device {
        self.device
    }

    fn all_reduce_async(&self, t: &Raw, op: ReduceOp) -> Result<Work> {
        const OP: &str = "all_reduce";
        self.check(OP, t)?;
        let wide = wire_dtype(OP, t.dtype())?;
        let size = self.size;
        self.start(OP, |call| {
            // The reduction runs in the wide type, in place, on a contiguous buffer: the
            // tensor itself, or a copy written back below.
            let buf = if t.dtype() == wide {
                t.try_contiguous()?
            } else {
                t.to_dtype(wide)?
            };
            let n = buf.elem_count();
            if n > 0 {
                let nccl_op = match op {
                    ReduceOp::Max => ncclRedOp_t::ncclMax,
                    _ => ncclRedOp_t::ncclSum,
                };
                let p = address(&buf)?;
                // SAFETY: `p` addresses `n` elements of `wide` on the communicator's
                // device, kept alive by the operation; the call queues the reduction on
                // `stream`, behind the kernels that wrote `buf`.
                unsafe {
                    nccl::all_reduce(p, p, n, nccl_type(wide), nccl_op, call.comm, call.stream)
                }
                .map_err(nccl_error("ncclAllReduce"))?;
            }
            let result = if op == ReduceOp::Avg {
                amp_kernels::binary_scalar(BinaryOp::Div, &buf, size as f64)?
            } else {
                buf.clone()
            };
            if !result.same_storage(t) {
                t.copy_(&result)?; // narrowed once (round to nearest even)
            }
            Ok(vec![buf, result])
        })
    }

    fn broadcast_async(&self, t: &Raw, root: usize) -> Result<Work> {
        const OP: &str = "broadcast";
        self.check(OP, t)?;
        check_rank(OP, root, self.size)?;
        let rank = self.rank;
        self.start(OP, |call| {
            let buf = t.try_contiguous()?;
            let n = buf.elem_count();
            if n > 0 {
                let p = address(&buf)?;
                // SAFETY: as in `all_reduce_async`: `n` elements of the tensor's dtype
                // on the device, alive until the operation completes.
                unsafe {
                    nccl::broadcast(
                        p,
                        p,
                        n,
                        nccl_type(t.dtype()),
                        root as i32,
                        call.comm,
                        call.stream,
                    )
                }
                .map_err(nccl_error("ncclBroadcast"))?;
            }
            if rank != root && !buf.same_storage(t) {
                t.copy_(&buf)?;
            }
            Ok(vec![buf])
        })
    }

    fn all_gather_async(&self, outputs: &[Raw], input: &Raw) -> Result<Work> {
        const OP: &str = "all_gather";
        self.check(OP, input)?;
        check_gather(outputs, input, self.size)?;
        for o in outputs {
            self.check(OP, o)?;
        }
        let device = self.device;
        self.start(OP, |call| {
            let send = input.try_contiguous()?;
            let n = send.elem_count();
            let recv = Raw::zeros_on([n * outputs.len()], input.dtype(), device)?;
            if n > 0 {
                let (s, r) = (address(&send)?, address(&recv)?);
                // SAFETY: `s` holds `n` elements and `r` `n * size` of the input's dtype
                // on the device, both alive until the operation completes.
                unsafe {
                    nccl::all_gather(s, r, n, nccl_type(input.dtype()), call.comm, call.stream)
                }
                .map_err(nccl_error("ncclAllGather"))?;
            }
            for (i, o) in outputs.iter().enumerate() {
                o.copy_(&recv.narrow(0, i * n, n)?.reshape(input.dims())?)?;
            }
            Ok(vec![send, recv])
        })
    }

    fn barrier_async(&self) -> Result<Work> {
        // NCCL has no barrier: a one-element all-reduce, as PyTorch's NCCL group does.
        let device = self.device;
        self.start("barrier", |call| {
            let one = Raw::zeros_on([1usize], DType::F32, device)?;
            let p = address(&one)?;
            // SAFETY: one float32 on the device, alive until the operation completes.
            unsafe {
                nccl::all_reduce(
                    p,
                    p,
                    1,
                    ncclDataType_t::ncclFloat32,
                    ncclRedOp_t::ncclSum,
                    call.comm,
                    call.stream,
                )
            }
            .map_err(nccl_error("ncclAllReduce"))?;
            Ok(vec![one])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_hex() {
        let mut bytes = [0u8; ID_BYTES];
        bytes
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 37 + 5) as u8);
        let id = NcclId(bytes);
        let hex = id.to_hex();
        assert_eq!(hex.len(), 256);
        assert!(hex.starts_with("052a4f"), "{hex}");
        assert_eq!(NcclId::from_hex(&hex).unwrap(), id);
        assert_eq!(NcclId::from_hex(&hex.to_uppercase()).unwrap(), id);
        // The raw id carries the same bytes (a c_char may be signed).
        let raw = id.raw();
        assert_eq!(raw.internal.map(|c| c as u8), bytes);
    }

    #[test]
    fn bad_hex_is_refused_with_the_reason() {
        let e = NcclId::from_hex("abc").unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    op: "NcclId::from_hex",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("expected 256 hex digits, got 3"),
            "{e}"
        );
        let mut hex = "0".repeat(256);
        hex.replace_range(10..11, "g");
        let e = NcclId::from_hex(&hex).unwrap_err();
        assert!(e.to_string().contains("'g' is not a hex digit"), "{e}");
        // Characters are counted and named whole, not as bytes.
        let e = NcclId::from_hex(&"é".repeat(128)).unwrap_err();
        assert!(e.to_string().contains("got 128 characters"), "{e}");
        let e = NcclId::from_hex(&"é".repeat(256)).unwrap_err();
        assert!(e.to_string().contains("'é' is not a hex digit"), "{e}");
    }

    #[test]
    fn nccl_errors_keep_the_code() {
        let e = nccl_error("ncclCommInitRank")(NcclError(ncclResult_t::ncclInvalidUsage));
        let Error::Nccl { op, source } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*op, "ncclCommInitRank");
        assert_eq!(source.code(), 5);
        assert!(source.is_invalid_usage());
        assert_eq!(source.0, NcclError(ncclResult_t::ncclInvalidUsage));
        assert_eq!(
            e.to_string(),
            "ncclCommInitRank: NCCL error ncclInvalidUsage (5): invalid usage"
        );
        let src = std::error::Error::source(&e).expect("the NCCL code is the source");
        assert_eq!(src.to_string(), "ncclInvalidUsage (5): invalid usage");
        let remote = NcclFailure(NcclError(ncclResult_t::ncclRemoteError));
        assert_eq!(remote.code(), 6);
        assert!(!remote.is_invalid_usage());
        assert!(remote.to_string().contains("remote process exited"));
    }

    #[test]
    fn host_tensors_are_refused_with_pytorchs_text() {
        let e = Error::WrongDevice {
            op: "all_reduce",
            got: Device::Cpu,
            expected: Device::Cuda(0),
        };
        assert_eq!(
            e.to_string(),
            "all_reduce: Tensors must be CUDA and dense: this group communicates tensors on cuda:0, got one on cpu"
        );
    }

    #[test]
    fn without_a_gpu_init_is_a_typed_error_not_a_panic() {
        if amp_tensor::cuda::is_available() && Library::Nccl.is_present() {
            println!("skipped: a GPU and libnccl are present (the GPU checks are nccl_ranks)");
            return;
        }
        let id = NcclId([0; ID_BYTES]);
        let e = Nccl::init(0, 1, &id, Device::Cuda(0), Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Tensor(amp_tensor::Error::DeviceUnavailable { .. })
            ),
            "{e:?}"
        );
        let e = Nccl::init(1, 1, &id, Device::Cuda(0), Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidRank {
                    op: "init",
                    rank: 1,
                    size: 1
                }
            ),
            "{e:?}"
        );
    }
}
