//! The integration tests of `amp-autocast`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-autocast --release --test autocast <module>::`
//! runs one subject).

mod autocast;
mod extra;
mod guards;
mod nesting;
