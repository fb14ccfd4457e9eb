//! The integration tests of `amp-distributed`, one module per subject, in one test
//! binary: `single` on the one-rank group (no MPI needed), `mpirun` (feature `mpi`) the
//! multi-process checks under `mpirun -np 2`.

#[cfg(feature = "mpi")]
mod mpirun;
mod single;
mod zero;
