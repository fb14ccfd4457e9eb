//! The conformance runner, run by
//! `cargo xtask conformance [--vectors DIR] [--device cpu|cuda|cuda:N] [--texts]`
//! (which runs this binary in release): every suite's vectors against this
//! implementation, a pass/fail/skip table, exit 1 on any failure.
//!
//! `--device cuda` runs the op suites (grad, errors, and autocast cases of that device
//! type) on CUDA tensors: cases meeting an op without a CUDA kernel are skipped and
//! counted, the host-only suites are skipped with their reason, and the table gains the
//! per-suite device columns. It needs a build with the `cuda` feature (`cargo xtask`
//! adds it) and a GPU; without them it prints the device-unavailable error and exits 2.

use std::process::ExitCode;

use conformance::cli::{Options, USAGE};

/// `cargo xtask conformance [--vectors DIR] [--device D] [--texts]`: run the built-in vectors
/// (or those in DIR) with the op suites' tensors on device D (default `cpu`), print the
/// report (with `--texts`, every error text that is not PyTorch's), exit 1 on any failure
/// and 2 when the arguments, the directory or the device cannot be used.
fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("conformance: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let report = match options.run() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("conformance: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{report}");
    if options.texts {
        for s in &report.suites {
            for d in &s.texts.differing {
                println!(
                    "text {} {}\n  ours:    {}\n  PyTorch: {}",
                    s.suite, d.id, d.got, d.expected
                );
            }
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
