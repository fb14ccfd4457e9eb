//! `cargo xtask gpu-bundle [--out DIR]`: everything a GPU session needs, built here
//! (no GPU needed) into one git-ignored folder (default `target/gpu-bundle`):
//!
//! - `bin/*.gz`: the CUDA test binaries (`amp-kernels`' and `amp`'s, with the `cuda`
//!   feature), the conformance runner, the main job (`train`), the NCCL checks
//!   (`nccl_ranks`), and the two benchmark binaries, stripped of debug info and gzipped (the device tool carries 64 MiB);
//! - `run.sh` (from `xtask/gpu/run.sh`): on the GPU machine, `bash <folder>/run.sh`
//!   runs every check and writes one report;
//! - the PyTorch side of the benchmarks (`cuda_bench_torch.py`, `gpu_step_bench_torch.py`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::ci::workspace_root;

/// The binaries of the bundle, each `(name, package, kind)`: cargo's target `name` of
/// that kind (`--test`, `--bin`, `--example`) in `package`, built in release with the
/// `cuda` feature; `name` is also its file in `bin/`.
const BINARIES: &[(&str, &str, &str)] = &[
    ("kernels", "amp-kernels", "--test"),
    ("amp", "amp", "--test"),
    ("conformance", "conformance", "--bin"),
    ("train", "amp", "--example"),
    ("gpu_step_bench", "amp", "--example"),
    ("cuda_bench", "amp-kernels", "--example"),
    ("nccl_ranks", "amp-distributed", "--example"),
];

/// The scripts copied beside the binaries: (source in the workspace, name in the bundle).
const SCRIPTS: &[(&str, &str)] = &[
    ("xtask/gpu/run.sh", "run.sh"),
    (
        "amp-kernels/examples/cuda_bench_torch.py",
        "cuda_bench_torch.py",
    ),
    (
        "amp/examples/gpu_step_bench_torch.py",
        "gpu_step_bench_torch.py",
    ),
    // The PyTorch GPT that gpu_step_bench_torch.py imports.
    ("xtask/torch/torch_baseline.py", "torch_baseline.py"),
];

pub fn main(args: &[String]) -> ExitCode {
    let root = workspace_root();
    let out = match args {
        [] => root.join("target/gpu-bundle"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => {
            eprintln!("usage: cargo xtask gpu-bundle [--out DIR]");
            return ExitCode::from(2);
        }
    };
    match build(&root, &out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask gpu-bundle: {e}");
            ExitCode::FAILURE
        }
    }
}

fn build(root: &Path, out: &Path) -> Result<(), String> {
    let bin = out.join("bin");
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    for &(name, package, kind) in BINARIES {
        let built = cargo_artifact(root, name, package, kind)?;
        let dest = bin.join(name);
        std::fs::copy(&built, &dest).map_err(|e| format!("{}: {e}", built.display()))?;
        run(Command::new("strip").arg("--strip-debug").arg(&dest))?;
        run(Command::new("gzip").args(["-9", "-f"]).arg(&dest))?;
    }
    for (src, name) in SCRIPTS {
        let from = root.join(src);
        std::fs::copy(&from, out.join(name)).map_err(|e| format!("{}: {e}", from.display()))?;
    }
    let size: u64 = std::fs::read_dir(&bin)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "gpu-bundle: {} ({:.1} MiB of binaries); on a GPU machine: bash {}/run.sh",
        out.display(),
        size as f64 / (1 << 20) as f64,
        out.display()
    );
    Ok(())
}

/// Build target `name` of `kind` in `package` (release, `cuda` feature) and return the
/// path of the executable cargo reports.
fn cargo_artifact(root: &Path, name: &str, package: &str, kind: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build: &[&str] = if kind == "--test" {
        &["test", "--no-run"]
    } else {
        &["build"]
    };
    let args: Vec<&str> = [build, &["-p", package, "--features", "cuda", kind, name]].concat();
    let output = Command::new(cargo)
        .args(&args)
        .args(["--release", "--message-format=json-render-diagnostics"])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    // The last artifact line with an executable is the target asked for.
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .rev()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = start + l[start..].find('"')?;
            Some(PathBuf::from(&l[start..end]))
        })
        .next()
        .ok_or_else(|| format!("cargo {} reported no executable", args.join(" ")))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed"))
    }
}
