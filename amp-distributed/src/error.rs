//! Errors of the process groups and of data-parallel training.

use std::time::Duration;

use amp_tensor::{DType, Device};

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong communicating between processes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An MPI call returned an error: its code (`MPI_SUCCESS` is 0) and
    /// `MPI_Error_string`'s text. The group is unusable afterwards.
    #[error("{op}: MPI error {code}: {message}")]
    Mpi {
        op: &'static str,
        code: i32,
        message: String,
    },
    /// A collective did not complete within the group's timeout: a peer died, hangs, or
    /// called a different collective. The group is unusable afterwards (MPI: its buffers
    /// are left to MPI, and MPI is not finalized at exit; NCCL: the communicator is
    /// aborted).
    #[error("{op} did not complete within {after:?}: a peer process has died or stopped taking part; the process group cannot be used any more")]
    Timeout { op: &'static str, after: Duration },
    /// An earlier operation failed or timed out, which leaves the group in an unknown
    /// state.
    #[error("{op}: the process group failed earlier and cannot be used any more")]
    GroupFailed { op: &'static str },
    /// An NCCL call failed (feature `cuda`): NCCL's result code is the `source`. The
    /// group is unusable afterwards (its communicator is aborted).
    #[cfg(feature = "cuda")]
    #[error("{op}: NCCL error {source}")]
    Nccl {
        op: &'static str,
        #[source]
        source: crate::NcclFailure,
    },
    /// A tensor not on the group's device (PyTorch's text for a host tensor given to
    /// its NCCL group).
    #[error("{op}: Tensors must be CUDA and dense: this group communicates tensors on {expected}, got one on {got}")]
    WrongDevice {
        op: &'static str,
        got: Device,
        expected: Device,
    },
    /// Only floating-point tensors are communicated.
    #[error(
        "{op}: {dtype} tensors cannot be communicated (float32, float64, bfloat16 and float16 can)"
    )]
    UnsupportedDtype { op: &'static str, dtype: DType },
    /// A root or rank outside the group.
    #[error("{op}: rank {rank} is not in a group of size {size}")]
    InvalidRank {
        op: &'static str,
        rank: usize,
        size: usize,
    },
    /// Arguments that do not fit together (output count, shapes, dtypes).
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    /// MPI was initialized already (by an earlier `Mpi::init` (feature `mpi`) or another
    /// library), or finalized; a process initializes it once.
    #[error("MPI cannot be initialized: it was initialized before in this process")]
    AlreadyInitialized,
    /// [`crate::DdpOptions::compression`] names a dtype other than bfloat16 and float16.
    #[error("gradient compression to {dtype} is not supported: use bfloat16 or float16")]
    UnsupportedCompression { dtype: DType },
    /// A [`crate::ShardedOptimizer`] over fewer parameters than ranks: `rank` would own
    /// none.
    #[error("ShardedOptimizer: rank {rank} of {world} would own no parameter ({params} parameters in all); use fewer ranks than parameters")]
    EmptyShard {
        rank: usize,
        world: usize,
        params: usize,
    },
    /// A sharded optimizer state dict naming a parameter this rank does not own: it was
    /// saved by another rank, or with another number of ranks.
    #[error("ShardedOptimizer: the state dict names parameter {index}, which rank {rank} does not own (saved by another rank or another world size? use the consolidated state dict)")]
    ShardMismatch { rank: usize, index: usize },
    /// A shard's state could not be carried to the other ranks (serialised or read back).
    #[error("ShardedOptimizer: the state of rank {rank} could not be transferred: {reason}")]
    StateTransfer { rank: usize, reason: String },
    /// An optimizer operation failed.
    #[error(transparent)]
    Optim(amp_optim::Error),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
    /// An autograd operation failed.
    #[error(transparent)]
    Autograd(amp_autograd::Error),
}

impl From<amp_autograd::Error> for Error {
    /// An autograd error; one that carries this crate's error out of a gradient hook
    /// (an all-reduce started during backward) gives that error back.
    fn from(e: amp_autograd::Error) -> Self {
        if let amp_autograd::Error::Hook(h) = &e {
            if let Some(ours) = h.downcast_ref::<Error>() {
                return ours.clone();
            }
        }
        Error::Autograd(e)
    }
}

impl From<Error> for amp_autograd::Error {
    /// Carried through backward as a hook's error, recovered by `Error::from`.
    fn from(e: Error) -> Self {
        amp_autograd::Error::Hook(amp_tensor::SharedError::new(e))
    }
}

impl From<amp_optim::Error> for Error {
    /// An optimizer error; one that carries this crate's error (a broadcast failed in a
    /// [`crate::ShardedOptimizer`] step) gives that error back.
    fn from(e: amp_optim::Error) -> Self {
        match e {
            amp_optim::Error::Autograd(a) => Error::from(a),
            other => Error::Optim(other),
        }
    }
}
