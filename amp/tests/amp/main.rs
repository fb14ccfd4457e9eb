//! The integration tests of `amp`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp --release --test amp <module>::`
//! runs one subject).

#[cfg(feature = "checkpoint")]
mod checkpoint_atomic;
#[cfg(feature = "checkpoint")]
mod checkpoint_resume;
mod cuda_train;
mod gradient_penalty;
