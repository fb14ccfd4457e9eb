//! The conformance runner of the amp workspace: replays the PyTorch-computed vectors in
//! `conformance/data` (format `amp-vectors/1`, built into this crate) through
//! the workspace's public API and reports, per suite, what passed, failed and was skipped,
//! and how much of each documented op list runs end to end.
//!
//! ```
//! let report = conformance::run_builtin();
//! // Skips (ops the workspace does not implement yet) are allowed; failures are not:
//! // `report.passed()` is what `cargo xtask conformance` (and this crate's tests) check.
//! let scaler = report.suite(conformance::Suite::Scaler);
//! assert_eq!(scaler.total(), 28);
//! assert!(scaler.skipped.is_empty());
//! let policy = report.suite(conformance::Suite::Policy);
//! assert_eq!(policy.passed, 374);
//! let text = report.to_string(); // what `cargo xtask conformance` prints
//! assert!(text.contains("coverage of the documented op lists"));
//! ```
//!
//! `cargo xtask conformance [--vectors DIR]` prints [`run_builtin`] or [`run_dir`] and exits
//! 1 unless [`Report::passed`].
//!
//! # Layout
//! - [`vectors`]: the file format (typed cases per suite), [`value`]: tensor literals,
//!   [`args`]: op arguments and outputs, [`compare`]: the comparison rule.
//! - [`suite`]: one runner per suite; [`backend`]: the traits the op suites run against
//!   (tensors + op table, autograd, autocast); [`optable`] / [`ops`]: which `call` runs
//!   which workspace function (adding an op is one entry in `ops.rs`).
//! - [`report`], [`coverage`]: the results and their printed form.
//!
//! Skips are only for what the workspace does not implement yet (an op with no entry in
//! the op table), and they are counted and listed. A case whose op exists but misbehaves — wrong value, wrong dtype,
//! an error, a panic — is a failure.

#![deny(missing_docs)]

pub mod args;
pub mod backend;
pub mod compare;
pub mod coverage;
mod error;
pub mod ops;
pub mod optable;
pub mod report;
mod run;
pub mod suite;
pub mod value;
pub mod vectors;

use std::path::Path;

pub use error::ConformanceError;
pub use report::Report;
pub use run::{builtin_files, load_dir, op_calls, run_files, BUILTIN};
pub use vectors::{Suite, VectorFile};

/// Runs the built-in copy of the vectors on the built-in backend.
pub fn run_builtin() -> Report {
    run_files(&backend::builtin(), builtin_files())
}

/// Runs the vector files found in `dir` (every `*.json`, sorted by name) instead of the
/// built-in copy. A file of an unknown format or suite, a malformed case, duplicate ids, or
/// a directory without vector files is an error naming the file.
pub fn run_dir(dir: &Path) -> Result<Report, ConformanceError> {
    let files = load_dir(dir)?;
    Ok(run_files(&backend::builtin(), &files))
}
