//! Tidy tests: invariants of the repository itself, checked by `cargo test`.
//!
//! - Integration tests are modules of one test binary per crate (`tests/<crate>/main.rs`).
//! - The repository stands alone: no file refers to material outside it (the sibling
//!   folders it was developed beside, or their files by name). A user's clone has only
//!   this tree, so such a reference would point nowhere.
//! - Library code fans out through `amp_tensor::parallel`, never through rayon's
//!   parallel iterators, `join` or `scope`: called from the user's thread, those hand
//!   the call to the pool and put the caller to sleep (tens of microseconds, more than
//!   a 256K-element cast costs), and `try_fold` cuts its pieces where work is stolen,
//!   so a sum's grouping would depend on timing.

use std::path::{Path, PathBuf};

/// Text files a reader opens: sources, docs, manifests and data.
const CHECKED: [&str; 8] = ["rs", "md", "toml", "json", "py", "txt", "snap", "sh"];

/// Folders never scanned: build output, version control, and recorded measurements.
const SKIPPED_DIRS: [&str; 3] = ["target", ".git", "sweeps"];

/// References to material outside the repository. Spelled in pieces so that this file
/// does not match itself.
fn outside_references() -> Vec<String> {
    vec![
        ["..", "/shared"].concat(),
        ["REFERENCE", ".md"].concat(),
        ["DESIGN", ".md"].concat(),
        ["spec", "/seeds"].concat(),
        ["seed ", "00"].concat(),
    ]
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_path_buf()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_str()) {
                files(&p, out);
            }
        } else if p
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| CHECKED.contains(&x))
            || name == "run"
        {
            out.push(p);
        }
    }
}

#[test]
fn no_file_refers_to_material_outside_the_repository() {
    let root = repo_root();
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(
        all.iter().any(|p| p.ends_with("xtask/src/tidy.rs")),
        "the scan found its own file (walked {} files from {})",
        all.len(),
        root.display()
    );
    let needles = outside_references();
    let mut found = Vec::new();
    for p in &all {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            for n in &needles {
                if line.contains(n.as_str()) {
                    let rel = p.strip_prefix(&root).unwrap_or(p);
                    found.push(format!("{}:{}: {n}", rel.display(), i + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "references to files outside the repository (a user's clone has none of them):\n{}",
        found.join("\n")
    );
}

/// The workspace's member crates (folders with a `Cargo.toml` beside the root's).
fn member_crates(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("the workspace root is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    out.sort();
    out
}

/// A crate's integration tests are modules of one binary, `tests/<name>/main.rs`: a
/// loose `tests/*.rs` file would be a test binary of its own (one more link per CI run).
#[test]
fn integration_tests_are_modules_of_one_binary_per_crate() {
    let root = repo_root();
    let crates = member_crates(&root);
    assert!(
        crates.iter().any(|c| c.ends_with("amp-kernels")),
        "found the member crates ({} of them)",
        crates.len()
    );
    let mut loose = Vec::new();
    for c in &crates {
        let Ok(entries) = std::fs::read_dir(c.join("tests")) else {
            continue;
        };
        let mut binaries = 0;
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rs") {
                loose.push(p.strip_prefix(&root).unwrap_or(&p).display().to_string());
            } else if p.join("main.rs").is_file() {
                binaries += 1;
            }
        }
        assert!(
            binaries <= 1,
            "{} has {binaries} test binaries",
            c.display()
        );
    }
    assert!(
        loose.is_empty(),
        "integration test files outside tests/<crate>/ (make each a module of that crate's \
         tests/<crate>/main.rs):\n{}",
        loose.join("\n")
    );
}

/// Calls that fan out through rayon from the caller's thread. Spelled in pieces so that
/// this file does not match itself.
fn rayon_fan_outs() -> Vec<String> {
    [
        "par_iter()",
        "par_chunks",
        "par_extend",
        "par_bridge",
        "join(",
        "scope(",
    ]
    .iter()
    .map(|s| match *s {
        "join(" | "scope(" => ["rayon::", s].concat(),
        s => [".", s].concat(),
    })
    .chain([[".into_", "par_iter()"].concat()])
    .collect()
}

#[test]
fn library_code_fans_out_through_amp_tensor_parallel() {
    let root = repo_root();
    let mut sources = Vec::new();
    for krate in member_crates(&root) {
        files(&krate.join("src"), &mut sources);
    }
    assert!(
        sources
            .iter()
            .any(|p| p.ends_with("amp-kernels/src/conv.rs")),
        "the scan found the kernels ({} files)",
        sources.len()
    );
    let needles = rayon_fan_outs();
    let mut found = Vec::new();
    for p in sources
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
    {
        let text = std::fs::read_to_string(p).expect("readable source");
        for (i, line) in text.lines().enumerate() {
            for n in needles.iter().filter(|n| line.contains(n.as_str())) {
                let rel = p.strip_prefix(&root).unwrap_or(p);
                found.push(format!("{}:{}: {n}", rel.display(), i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "rayon fan-outs in library code (use amp_tensor::parallel::for_each, \
         for_each_chunk_mut, map or map_chunks_mut):\n{}",
        found.join("\n")
    );
}
