//! Project automation, run as `cargo xtask <command>` (an alias in `.cargo/config.toml`
//! for `cargo run --package xtask --release --`). It depends on nothing but the standard
//! library, so it builds in seconds; the heavy commands run the workspace's own binaries:
//!
//! - `bench [...]`: `cargo run --release -p amp-bench -- [...]` (the design-target
//!   benchmarks, `--sweep` the size sweep; see `bench/`);
//! - `conformance [...]`: `cargo run --release -p conformance -- [...]` (with
//!   `--features cuda` for `--device cuda`);
//! - `gpu-bundle [--out DIR]`: the binaries and `run.sh` of the GPU checks, in one
//!   folder for a GPU machine (see `gpu_bundle`);
//! - `ci`: what `.ci/run` runs, plus format check, clippy and rustdoc, stopping at the
//!   first failure.

use std::process::{Command, ExitCode};

mod ci;
mod gpu_bundle;
#[cfg(test)]
mod tidy;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  bench [options]
        the benchmarks (cargo run --release -p amp-bench -- [options]; --help lists them)
  ci    cargo fmt --check, clippy -D warnings, then .ci/run itself (tests in release, the
        CUDA backend's compile check, the NVRTC compile of the kernel sources), rustdoc
        -D warnings; stops at the first failure
  conformance [--vectors DIR] [--device cpu|cuda|cuda:N] [--texts]
        the conformance suites (cargo run --release -p conformance -- [options]; a CUDA
        device builds it with --features cuda)
  gpu-bundle [--out DIR]
        builds (no GPU needed) the CUDA tests, the conformance runner, the main job and
        the benchmarks with the `cuda` feature into one folder (default
        target/gpu-bundle) with run.sh: on a GPU machine, bash DIR/run.sh runs them all
        and writes one report";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    match cmd.as_str() {
        "bench" => run_package("amp-bench", &[], rest),
        "conformance" => {
            // A device run needs the CUDA backend compiled in.
            let cuda = rest.windows(2).any(|w| w[0] == "--device" && w[1] != "cpu");
            run_package("conformance", if cuda { &["cuda"] } else { &[] }, rest)
        }
        "gpu-bundle" => gpu_bundle::main(rest),
        "ci" => {
            if !rest.is_empty() {
                eprintln!("xtask ci: takes no arguments\n\n{USAGE}");
                return ExitCode::from(2);
            }
            ci::main()
        }
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("xtask: unknown command `{other}`\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `cargo run --release -p <package> [--features F] -- <args>` from the workspace root,
/// passing its exit status on.
fn run_package(package: &str, features: &[&str], args: &[String]) -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["run", "--quiet", "--release", "-p", package])
        .args(features.iter().flat_map(|f| ["--features", *f]))
        .arg("--")
        .args(args)
        .current_dir(ci::workspace_root())
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(1, 255) as u8)),
        Err(e) => {
            eprintln!("xtask: could not run cargo: {e}");
            ExitCode::from(2)
        }
    }
}
