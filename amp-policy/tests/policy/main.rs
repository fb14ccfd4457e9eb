//! The integration tests of `amp-policy`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-policy --release --test policy <module>::`
//! runs one subject).

mod errors;
mod explain;
mod intern;
mod overrides;
mod policy_vectors;
mod props;
mod tables;
