//! `cargo xtask ci`: the format check and clippy, then `.ci/run` itself (so the two
//! cannot drift apart: the tests in release, the CUDA backend's compile check, the NVRTC
//! compile of every kernel source), then rustdoc; in order, stopping at the first
//! failure.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// One check: a program (`cargo` unless named), its arguments and extra environment
/// variables.
struct Step {
    program: Option<&'static str>,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const STEPS: &[Step] = &[
    Step {
        program: None,
        args: &["fmt", "--all", "--", "--check"],
        env: &[],
    },
    Step {
        program: None,
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    Step {
        program: Some("bash"),
        args: &[".ci/run"],
        env: &[],
    },
    Step {
        program: None,
        args: &["doc", "--workspace", "--no-deps"],
        env: &[("RUSTDOCFLAGS", "-Dwarnings")],
    },
];

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map_or(here.clone(), |p| p.to_path_buf())
}

fn describe(step: &Step) -> String {
    let env: String = step.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    format!(
        "{env}{} {}",
        step.program.unwrap_or("cargo"),
        step.args.join(" ")
    )
}

/// Run every step; the first failing one ends the run with a non-zero exit.
pub fn main() -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = workspace_root();
    let total = STEPS.len();
    for (i, step) in STEPS.iter().enumerate() {
        let what = describe(step);
        eprintln!("==> [{}/{total}] {what}", i + 1);
        let status = Command::new(step.program.unwrap_or(&cargo))
            .args(step.args)
            .envs(step.env.iter().copied())
            .current_dir(&root)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                let code = s.code().map_or("a signal".to_string(), |c| c.to_string());
                eprintln!(
                    "\nxtask ci: FAILED at step {}/{total}: `{what}` exited with {code}",
                    i + 1
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!(
                    "\nxtask ci: FAILED at step {}/{total}: could not run `{what}`: {e}",
                    i + 1
                );
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("\nxtask ci: all {total} steps passed");
    ExitCode::SUCCESS
}
