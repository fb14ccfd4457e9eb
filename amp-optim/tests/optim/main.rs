//! The integration tests of `amp-optim`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-optim --release --test optim <module>::`
//! runs one subject).

mod compute_dtype;
mod state_dict_fuzz;
mod validation;
