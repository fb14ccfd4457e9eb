//! The conformance runner, run by `cargo xtask conformance [--vectors DIR] [--texts]`
//! (which runs this binary in release): every suite's vectors against this
//! implementation, a pass/fail/skip table, exit 1 on any failure.

use std::process::ExitCode;

/// `cargo xtask conformance [--vectors DIR] [--texts]`: run the built-in vectors (or those
/// in DIR), print the report (with `--texts`, every error text that is not PyTorch's), exit
/// 1 on any failure.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = &args[..];
    let texts = args.iter().any(|a| a == "--texts");
    let args: Vec<String> = args.iter().filter(|a| *a != "--texts").cloned().collect();
    let report = match args.as_slice() {
        [] => conformance::run_builtin(),
        [flag, dir] if flag == "--vectors" => match conformance::run_dir(std::path::Path::new(dir))
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("conformance: {e}");
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
