//! The integration tests of `amp-nn`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-nn --release --test nn <module>::`
//! runs one subject).

mod extra;
mod pool;
mod transformer;
