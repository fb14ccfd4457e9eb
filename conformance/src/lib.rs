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
//! assert_eq!(scaler.total(), 134); // scaler.json, its value variants, random programs
//! assert!(scaler.skipped.is_empty());
//! let policy = report.suite(conformance::Suite::Policy);
//! assert_eq!(policy.passed, 374);
//! let text = report.to_string(); // what `cargo xtask conformance` prints
//! assert!(text.contains("coverage of the documented op lists"));
//! ```
//!
//! `cargo xtask conformance [--vectors DIR]` prints [`run_builtin`] or [`run_dir`] and exits
//! 1 unless [`Report::passed`]. With `--device cuda` ([`cli::Options`], [`run_on`]) the op
//! suites' tensors are CUDA tensors: a case meeting an op without a CUDA kernel is skipped
//! and counted, suites that do not run on the device are skipped with their reason, and
//! the report gives, per suite, the cases that ran on the device and those that lacked a
//! kernel. Without the `cuda` feature or a GPU that is a [`ConformanceError::Device`].
//!
//! # Layout
//! - [`vectors`]: the file format (typed cases per suite), [`value`]: tensor literals,
//!   [`args`]: op arguments and outputs, [`compare`]: the comparison rule.
//! - [`suite`]: one runner per suite; [`backend`]: the traits the op suites run against
//!   (tensors + op table, autograd, autocast); [`optable`] / [`ops`]: which `call` runs
//!   which workspace function (adding an op is one entry in `ops.rs`).
//! - [`device`]: device runs (`--device`, missing device kernels); [`cli`]: the command
//!   line.
//! - [`report`], [`coverage`]: the results and their printed form.
//!
//! Skips are only for what the workspace does not implement yet (an op with no entry in
//! the op table, or in a device run an op without a kernel on that device, and the cases
//! that do not run there), and they are counted and listed. A case whose op exists but misbehaves — wrong value, wrong dtype,
//! an error, a panic — is a failure.

#![deny(missing_docs)]

pub mod args;
pub mod backend;
pub mod cli;
pub mod compare;
pub mod coverage;
pub mod device;
mod error;
pub mod ops;
pub mod optable;
pub mod report;
mod run;
pub mod suite;
pub mod value;
pub mod vectors;

use std::path::Path;

use amp::tensor::Device;

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

/// Runs the built-in vectors, or those of `dir` (as [`run_dir`]), with the op suites'
/// tensors on `device` ([`backend::Autograd::on`]); on [`Device::Cpu`] this is
/// [`run_builtin`] / [`run_dir`].
///
/// ```
/// use amp::tensor::Device;
///
/// if !amp::tensor::cuda::is_available() {
///     let e = conformance::run_on(Device::Cuda(0), None).unwrap_err();
///     assert!(e.to_string().contains("device cuda:0 is unavailable"), "{e}");
/// }
/// ```
///
/// # Errors
/// [`ConformanceError::Device`] when `device` cannot be used (checked first); as
/// [`run_dir`] for `dir`'s files.
pub fn run_on(device: Device, dir: Option<&Path>) -> Result<Report, ConformanceError> {
    let backend = backend::Autograd::on(device).map_err(ConformanceError::Device)?;
    match dir {
        None => Ok(run_files(&backend, builtin_files())),
        Some(dir) => Ok(run_files(&backend, &load_dir(dir)?)),
    }
}
