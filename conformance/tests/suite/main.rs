//! The integration tests of `conformance`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p conformance --release --test suite <module>::`
//! runs one subject).

mod compare;
mod device;
mod grad_runner;
mod messages;
mod op_names;
mod policy_tables;
mod run_dir;
mod scaler_train;
mod vector_fuzz;
mod vectors;
