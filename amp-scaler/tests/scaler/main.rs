//! The integration tests of `amp-scaler`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-scaler --release --test scaler <module>::`
//! runs one subject).

mod api;
mod host_reads;
mod identity;
mod patterns;
mod reduction;
mod state_dict_fuzz;
