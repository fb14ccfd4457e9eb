//! Project automation, run as `cargo xtask <command>` (an alias in `.cargo/config.toml`
//! for `cargo run --package xtask --release --`):
//!
//! - `bench [--json] [--filter SUBSTR] [--compare FILE.json]`: the performance
//!   benchmarks of the design targets, optionally side by side with a `torch-baseline` JSON;
//!   `bench --sweep` the size sweep (every training op at sizes 8 to 2048, `sweep.rs`);
//! - `ci`: format check, clippy, tests, docs, stopping at the first failure;
//! - `conformance`: the conformance suite table.

use std::process::ExitCode;

mod bench;
mod ci;
mod sweep;
#[cfg(test)]
mod tidy;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  bench [--json] [--filter SUBSTR] [--compare FILE.json]
        run the benchmarks (median of several runs after warm-ups) and print a table
        (metric, value, unit); --json prints one JSON object {metric: number} instead;
        --filter keeps the metrics whose name contains SUBSTR; --compare reads a
        torch-baseline JSON and prints ours, PyTorch's and the ratio per shared metric
  bench --sweep [--json] [--filter SUBSTR] [--compare FILE.json] [--out DIR]
        the size sweep: mm, bmm, linear forward+backward, softmax, layer_norm, add, mul,
        gelu at n = 8..2048 in f32/bf16/f16 (products also f32 under bf16 autocast);
        --compare reads `xtask/torch/torch-baseline --sweep` JSON; writes
        DIR/<cpu flags>.json and .svg (DIR defaults to target/sweep; the repository
        keeps one per machine kind in xtask/sweeps)
  ci    cargo fmt --check, clippy -D warnings, tests (release), rustdoc -D warnings;
        stops at the first failure
  conformance
        the conformance suites (pass/fail/skip per suite, op coverage)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    match cmd.as_str() {
        "bench" => match bench::Options::parse(rest) {
            Ok(opts) => bench::main(&opts),
            Err(e) => {
                eprintln!("xtask bench: {e}\n\n{USAGE}");
                ExitCode::from(2)
            }
        },
        "ci" => {
            if !rest.is_empty() {
                eprintln!("xtask ci: takes no arguments\n\n{USAGE}");
                return ExitCode::from(2);
            }
            ci::main()
        }
        "conformance" => conformance_cmd(rest),
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

/// `cargo xtask conformance [--vectors DIR] [--texts]`: run the built-in vectors (or those
/// in DIR), print the report (with `--texts`, every error text that is not PyTorch's), exit
/// 1 on any failure.
fn conformance_cmd(args: &[String]) -> ExitCode {
    let texts = args.iter().any(|a| a == "--texts");
    let args: Vec<String> = args.iter().filter(|a| *a != "--texts").cloned().collect();
    let report = match args.as_slice() {
        [] => conformance::run_builtin(),
        [flag, dir] if flag == "--vectors" => match conformance::run_dir(std::path::Path::new(dir))
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("xtask conformance: {e}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: cargo xtask conformance [--vectors DIR] [--texts]");
            return ExitCode::from(2);
        }
    };
    print!("{report}");
    if texts {
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
