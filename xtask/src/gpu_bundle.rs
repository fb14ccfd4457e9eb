//! `cargo xtask gpu-bundle [--out DIR]`: everything a GPU session needs, built here
//! (no GPU needed) into one git-ignored folder (default `target/gpu-bundle`):
//!
//! - `bin/*.gz`: the CUDA test binaries (`amp-kernels`' and `amp`'s, with the `cuda`
//!   feature), the conformance runner, the main job (`train`), and the two benchmark
//!   binaries, stripped of debug info and gzipped (the device tool carries 64 MiB);
//! - `run.sh` (from `xtask/gpu/run.sh`): on the GPU machine, `bash <folder>/run.sh`
//!   runs every check and writes one report;
//! - the PyTorch side of the benchmarks (`cuda_bench_torch.py`, `gpu_step_bench_torch.py`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::ci::workspace_root;

/// A binary of the bundle: its name in `bin/` and how cargo builds it.
struct Binary {
    name: &'static str,
    cargo: &'static [&'static str],
}

const BINARIES: &[Binary] = &[
    Binary {
        name: "kernels",
        cargo: &[
            "test",
            "--no-run",
            "-p",
            "amp-kernels",
            "--features",
            "cuda",
            "--test",
            "kernels",
        ],
    },
    Binary {
        name: "amp",
        cargo: &[
            "test",
            "--no-run",
            "-p",
            "amp",
            "--features",
            "cuda",
            "--test",
            "amp",
        ],
    },
    Binary {
        name: "conformance",
        cargo: &[
            "build",
            "-p",
            "conformance",
            "--features",
            "cuda",
            "--bin",
            "conformance",
        ],
    },
    Binary {
        name: "train",
        cargo: &[
            "build",
            "-p",
            "amp",
            "--features",
            "cuda",
            "--example",
            "train",
        ],
    },
    Binary {
        name: "gpu_step_bench",
        cargo: &[
            "build",
            "-p",
            "amp",
            "--features",
            "cuda",
            "--example",
            "gpu_step_bench",
        ],
    },
    Binary {
        name: "cuda_bench",
        cargo: &[
            "build",
            "-p",
            "amp-kernels",
            "--features",
            "cuda",
            "--example",
            "cuda_bench",
        ],
    },
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
    for b in BINARIES {
        let built = cargo_artifact(root, b)?;
        let dest = bin.join(b.name);
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

/// Build `b` in release and return the path of the executable cargo reports.
fn cargo_artifact(root: &Path, b: &Binary) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(b.cargo)
        .args(["--release", "--message-format=json-render-diagnostics"])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo {} failed", b.cargo.join(" ")));
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
        .ok_or_else(|| format!("cargo {} reported no executable", b.cargo.join(" ")))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed"))
    }
}
