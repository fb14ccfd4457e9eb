//! Loss scaling across ranks: the scaler's inf check all-reduced with MAX.

use std::sync::Arc;

use amp_scaler::{FoundInfReduction, GradScaler, GradScalerOptions};
use amp_tensor::{SharedError, Tensor as Raw};

use crate::{ProcessGroup, ReduceOp};

/// [`FoundInfReduction`] over a process group: `found_inf` all-reduced with MAX, so one
/// rank's inf makes every rank skip the step and back off the scale. A flag that is not
/// on the group's [`device`](ProcessGroup::device) (the scaler's host flag under `Nccl`)
/// is reduced there and copied back.
#[derive(Debug, Clone)]
pub struct AllReduceFoundInf(pub Arc<dyn ProcessGroup>);

impl FoundInfReduction for AllReduceFoundInf {
    fn all_reduce_max(&self, found_inf: &Raw) -> std::result::Result<(), SharedError> {
        let device = self.0.device();
        let reduce = || -> crate::Result<()> {
            if found_inf.device() == device {
                return self.0.all_reduce(found_inf, ReduceOp::Max);
            }
            let there = found_inf.to_device(device)?;
            self.0.all_reduce(&there, ReduceOp::Max)?;
            found_inf.copy_(&there)?;
            Ok(())
        };
        reduce().map_err(SharedError::new)
    }
}

/// A [`GradScaler`] whose inf checks are combined over `group` (PyTorch's
/// `ShardedGradScaler`): the scale, the growth tracker and the skipped steps are the
/// same on every rank even when each rank checks different gradients (a sharded
/// optimizer). With [`crate::DistributedDataParallel`] alone every rank holds the same
/// averaged gradients and a plain `GradScaler` reaches the same decision.
pub fn sharded_grad_scaler(
    opts: GradScalerOptions,
    group: Arc<dyn ProcessGroup>,
) -> amp_scaler::Result<GradScaler> {
    Ok(
        GradScaler::with_options(opts)?
            .with_found_inf_reduction(Arc::new(AllReduceFoundInf(group))),
    )
}
