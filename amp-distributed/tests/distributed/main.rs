//! The integration tests of `amp-distributed`, one module per subject, in one test
//! binary: `single` on the one-rank group (no MPI needed), `mpirun` (feature `mpi`) the
//! multi-process checks under `mpirun -np 2`.

#[cfg(feature = "mpi")]
mod mpirun;
mod single;
mod zero;

/// The one-rank group the tests without MPI run on.
fn group() -> std::sync::Arc<dyn amp_distributed::ProcessGroup> {
    std::sync::Arc::new(amp_distributed::SingleProcess)
}
