//! The integration tests of `amp-tensor`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-tensor --release --test tensor <module>::`
//! runs one subject).

mod allocations;
mod cast_stream;
mod casts;
mod copy_pool;
mod cuda_unavailable;
mod sizes;
mod views;
