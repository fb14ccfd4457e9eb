//! Combining the inf checks of the processes of a data-parallel job.

use amp_tensor::{SharedError, Tensor as Raw};

/// How a [`GradScaler`](crate::GradScaler) combines its inf check with the other
/// processes' before the skip decision (PyTorch's `ShardedGradScaler` all-reduces
/// `found_inf` with MAX). Where each process checks other gradients (a sharded
/// optimizer, each rank holding a slice of the optimizer state), the ranks must still
/// all skip the same steps and back off the scale alike; one rank's inf must count
/// everywhere. Implemented by the distributed crate over its process groups, so this
/// crate does not depend on a transport.
pub trait FoundInfReduction: Send + Sync + std::fmt::Debug {
    /// Replace `found_inf` — a one-element float32 tensor on the host, nonzero when this
    /// process found an inf or NaN — with its maximum over all processes, in place.
    /// Every process calls it once per inf check, in the same order.
    fn all_reduce_max(&self, found_inf: &Raw) -> Result<(), SharedError>;
}
