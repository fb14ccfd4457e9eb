//! The one-rank group: every collective of one process is the identity.

use std::time::Duration;

use amp_tensor::Tensor as Raw;

use crate::group::{check_gather, check_rank, wire_dtype, DEFAULT_TIMEOUT};
use crate::{ProcessGroup, ReduceOp, Result, Work};

/// A group of one process (rank 0 of 1), always available: training code written for a
/// [`ProcessGroup`] runs unchanged without MPI, and tests need no launcher. Arguments are
/// checked as the other backends check them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl ProcessGroup for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn timeout(&self) -> Duration {
        DEFAULT_TIMEOUT
    }
    fn all_reduce_async(&self, t: &Raw, _op: ReduceOp) -> Result<Work> {
        // Sum, max and average of one value are that value (a 16-bit value widened and
        // narrowed again is unchanged).
        wire_dtype("all_reduce", t.dtype())?;
        Ok(Work::done("all_reduce"))
    }
    fn broadcast_async(&self, t: &Raw, root: usize) -> Result<Work> {
        wire_dtype("broadcast", t.dtype())?;
        check_rank("broadcast", root, 1)?;
        Ok(Work::done("broadcast"))
    }
    fn all_gather_async(&self, outputs: &[Raw], input: &Raw) -> Result<Work> {
        check_gather(outputs, input, 1)?;
        outputs[0].copy_(input)?;
        Ok(Work::done("all_gather"))
    }
    fn barrier_async(&self) -> Result<Work> {
        Ok(Work::done("barrier"))
    }
}
