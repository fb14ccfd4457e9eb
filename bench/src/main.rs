//! The benchmarks, run by `cargo xtask bench [...]` (which runs this binary in release):
//! the design-target figures (`bench.rs`) and, with `--sweep`, the size sweep
//! (`sweep.rs`), optionally side by side with PyTorch's (`xtask/torch/torch-baseline`).

use std::process::ExitCode;

mod bench;
mod sweep;

const USAGE: &str = "\
usage: cargo xtask bench [options]   (or: cargo run --release -p amp-bench -- [options])

  bench [--json] [--filter SUBSTR] [--compare FILE.json]
        run the benchmarks (median of several runs after warm-ups) and print a table
        (metric, value, unit); --json prints one JSON object {metric: number} instead;
        --filter keeps the metrics whose name contains SUBSTR; --compare reads a
        torch-baseline JSON and prints ours, PyTorch's and the ratio per shared metric
  bench --sweep [--json] [--filter SUBSTR] [--compare FILE.json | --with-torch] [--out DIR]
        the size sweep: mm, bmm, linear forward+backward, softmax, layer_norm, add, mul,
        gelu at n = 8..2048 in f32/bf16/f16 (products also f32 under bf16 autocast);
        --compare reads `xtask/torch/torch-baseline --sweep` JSON; --with-torch runs
        `torch-baseline --sweep --serve` beside it and measures PyTorch and ours in
        turn, entry by entry (PyTorch, ours, ours, PyTorch); writes
        DIR/<cpu flags>.json and .svg (DIR defaults to target/sweep; the repository
        keeps one per machine kind in xtask/sweeps)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match bench::Options::parse(&args) {
        Ok(opts) => bench::main(&opts),
        Err(e) => {
            eprintln!("bench: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
