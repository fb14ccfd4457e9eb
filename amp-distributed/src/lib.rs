//! Data-parallel training for the amp workspace (`torch.distributed` and
//! `DistributedDataParallel`): several processes each train the same model on their own
//! part of the batch and average the gradients, so that every replica takes the same
//! optimizer step.
//!
//! - [`ProcessGroup`]: all-reduce (sum, max, average), broadcast, all-gather and barrier
//!   on raw tensors, blocking or non-blocking ([`Work`]), failing with
//!   [`Error::Timeout`] instead of hanging when a peer died.
//! - Backends: [`SingleProcess`] (one rank, always available), `Mpi` (feature
//!   `mpi`: the `mpi` crate on the system's OpenMPI or MPICH; run with
//!   `mpirun -np 2 ...`; tensors on any device, through host buffers) and `Nccl`
//!   (feature `cuda`: NCCL's collectives on the GPU, one GPU per rank, `libnccl`
//!   opened at run time; rank 0 makes an `NcclId` and hands it to the others, as
//!   `examples/nccl_ranks.rs` does).
//! - [`DistributedDataParallel`]: parameters broadcast from rank 0, gradients averaged
//!   in buckets from post-accumulate hooks while backward runs, `no_sync` for gradient
//!   accumulation; optional bfloat16/float16 gradient compression
//!   ([`DdpOptions::compression`], PyTorch's `bf16_compress_hook`); per-backward
//!   communication statistics ([`DistributedDataParallel::last_comm_stats`],
//!   [`CommStats`]: bytes, buckets, time in flight, time overlapped with backward, time
//!   waited at its end, the overlap share).
//! - [`ShardedOptimizer`]: ZeRO stage 1 (`ZeroRedundancyOptimizer`): the parameters
//!   are split over the ranks ([`partition_parameters`]), each rank's optimizer holds
//!   state for its shard only, and every step ends with each parameter broadcast from
//!   its owner; sharded and consolidated state dicts.
//! - Loss scaling across ranks: [`sharded_grad_scaler`] / [`AllReduceFoundInf`] make a
//!   `GradScaler` all-reduce its inf check with MAX before the skip decision.
//!
//! The same code runs on one process with [`SingleProcess`] and on many with `Mpi` or
//! `Nccl`:
//!
//! ```
//! use std::sync::Arc;
//! use amp_autograd::{ops, Tensor};
//! use amp_distributed::{DistributedDataParallel, ProcessGroup, ReduceOp, SingleProcess};
//! use amp_nn::{Linear, Module};
//! use amp_optim::{Optimizer, Sgd, SgdOptions};
//! use amp_tensor::{DType, Generator, Tensor as Raw};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let group: Arc<dyn ProcessGroup> = Arc::new(SingleProcess);
//! // Under MPI: `let group = Arc::new(amp_distributed::Mpi::init()?);`
//! // Under NCCL, on GPU `rank`, with the id rank 0 made (`NcclId::new()?`):
//! // `Arc::new(Nccl::init(rank, world, &id, Device::Cuda(rank), DEFAULT_TIMEOUT)?)`,
//! // the model and data moved to that GPU.
//!
//! let t = Raw::from_vec(vec![1.0f32, 2.0], [2])?;
//! group.all_reduce(&t, ReduceOp::Avg)?; // the mean over the ranks, in place
//! assert_eq!(t.to_vec::<f32>()?, vec![1.0, 2.0]);
//!
//! let mut gen = Generator::new(0);
//! let model = DistributedDataParallel::new(Linear::new(4, 1, &mut gen)?, group.clone())?;
//! let mut opt = Sgd::new(model.parameters(), 0.1, SgdOptions::default())?;
//! let x = Tensor::randn([8, 4], DType::F32, &mut gen)?; // this rank's part of the batch
//! let loss = ops::mean_all(&ops::square(&model.forward(&x)?)?)?;
//! loss.backward()?; // the gradients are averaged over the ranks here
//! opt.step()?;
//! # Ok(())
//! # }
//! ```

mod ddp;
mod error;
mod group;
#[cfg(feature = "mpi")]
mod mpi_group;
#[cfg(feature = "cuda")]
mod nccl_group;
mod scaler;
mod single;
mod zero;

pub use ddp::{
    CommStats, DdpOptions, DistributedDataParallel, NoSync, DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_CAP_BYTES,
};
pub use error::{Error, Result};
pub use group::{ProcessGroup, ReduceOp, Work, DEFAULT_TIMEOUT};
#[cfg(feature = "mpi")]
pub use mpi_group::Mpi;
#[cfg(feature = "cuda")]
pub use nccl_group::{Nccl, NcclFailure, NcclId};
pub use scaler::{sharded_grad_scaler, AllReduceFoundInf};
pub use single::SingleProcess;
pub use zero::{partition_parameters, ShardedOptimizer};
