//! `run_dir`: vector files from a directory instead of the built-in copy.

use std::path::{Path, PathBuf};

use conformance::{run_builtin, run_dir, ConformanceError, Suite};

/// A fresh, empty directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("conformance-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, file: &str, text: &str) -> &TempDir {
        std::fs::write(self.0.join(file), text).unwrap();
        self
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The error of running a fresh directory (named after `tag`) holding only `file`.
fn error_of(tag: &str, file: &str, text: &str) -> ConformanceError {
    let dir = TempDir::new(tag);
    dir.write(file, text);
    run_dir(dir.path()).unwrap_err()
}

/// Asserts that `msg` mentions every one of `parts`.
fn assert_mentions(msg: &str, parts: &[&str]) {
    assert!(parts.iter().all(|p| msg.contains(p)), "{msg}");
}

fn policy_file(cases: &str) -> String {
    format!(
        r#"{{"format": "amp-vectors/1", "suite": "policy", "source": "test", "cases": [{cases}]}}"#
    )
}

#[test]
fn unknown_suite_is_an_error_naming_the_file() {
    let dir = TempDir::new("unknown-suite");
    dir.write("policy.json", &policy_file("")).write(
        "odd.json",
        r#"{"format": "amp-vectors/1", "suite": "nope", "cases": []}"#,
    );
    let err = run_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, ConformanceError::UnknownSuite { suite, .. } if suite == "nope"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert_mentions(&msg, &["odd.json", "unknown suite `nope`"]);
}

#[test]
fn unknown_format_is_an_error() {
    let msg = error_of(
        "unknown-format",
        "v2.json",
        r#"{"format": "amp-vectors/2", "suite": "policy", "cases": []}"#,
    )
    .to_string();
    assert_mentions(&msg, &["v2.json", "unknown format `amp-vectors/2`"]);
}

#[test]
fn a_wrong_policy_vector_is_a_failure_with_its_id() {
    let dir = TempDir::new("wrong-policy");
    dir.write(
        "policy.json",
        &policy_file(
            r#"{"id": "cuda/fp32/mm", "device": "cuda", "op": "mm", "policy": "fp32"},
               {"id": "cpu/lower_precision_fp/mm", "device": "cpu", "op": "mm", "policy": "lower_precision_fp"}"#,
        ),
    );
    let report = run_dir(dir.path()).unwrap();
    assert!(!report.passed());
    let policy = report.suite(Suite::Policy);
    assert_eq!(
        (policy.passed, policy.failed(), policy.skipped.len()),
        (1, 1, 0)
    );
    let f = &policy.failures[0];
    assert_eq!(f.id, "cuda/fp32/mm");
    assert_eq!(
        f.message,
        "policy of `mm` on cuda: got lower_precision_fp, expected fp32"
    );
    let text = report.to_string();
    assert!(text.contains("failures (1):"), "{text}");
    assert!(
        text.contains("policy cuda/fp32/mm [policy.json]: policy of `mm` on cuda: got lower_precision_fp, expected fp32"),
        "{text}"
    );
}

#[test]
fn files_of_one_suite_add_up() {
    let dir = TempDir::new("add-up");
    dir.write(
        "a.json",
        &policy_file(r#"{"id": "a", "device": "cpu", "op": "add", "policy": "none"}"#),
    )
    .write(
        "b.json",
        &policy_file(
            r#"{"id": "b", "device": "cuda", "op": "binary_cross_entropy", "policy": "banned"},
               {"id": "c", "device": "cpu", "op": "binary_cross_entropy", "policy": "fp32"}"#,
        ),
    )
    .write("README.md", "not a vector file");
    let report = run_dir(dir.path()).unwrap();
    assert!(report.passed());
    let policy = report.suite(Suite::Policy);
    assert_eq!(policy.passed, 3);
    assert_eq!(policy.files, ["a.json", "b.json"]);
    assert_eq!(report.suite(Suite::Grad).total(), 0);
    assert!(report.to_string().contains("(no vector file)"));
}

#[test]
fn duplicate_ids_are_an_error() {
    let case = r#"{"id": "same", "device": "cpu", "op": "add", "policy": "none"}"#;
    let dir = TempDir::new("dup-in-file");
    dir.write("p.json", &policy_file(&format!("{case}, {case}")));
    let msg = run_dir(dir.path()).unwrap_err().to_string();
    assert_mentions(&msg, &["p.json", "`same`"]);

    let dir = TempDir::new("dup-across-files");
    dir.write("p.json", &policy_file(case))
        .write("q.json", &policy_file(case));
    let msg = run_dir(dir.path()).unwrap_err().to_string();
    assert_mentions(&msg, &["p.json", "q.json", "`same`"]);
}

#[test]
fn a_malformed_case_is_an_error_naming_file_and_case() {
    let msg = error_of(
        "bad-case",
        "p.json",
        &policy_file(r#"{"id": "x/1", "device": "tpu", "op": "mm", "policy": "fp32"}"#),
    )
    .to_string();
    assert_mentions(&msg, &["p.json", "case 0 (`x/1`)", "tpu"]);

    let msg = error_of(
        "bad-tensor",
        "g.json",
        r#"{"format": "amp-vectors/1", "suite": "grad", "cases": [{"id": "g/1", "op": "neg", "call": "torch.neg",
            "args": [{"dtype": "float32", "shape": [2], "data": [1.0]}], "kwargs": {},
            "grad_output": {"dtype": "float32", "shape": [2], "data": [1.0, 1.0]},
            "expect": {"output": {"dtype": "float32", "shape": [2], "data": [1.0, 1.0]}, "grads": []}}]}"#,
    )
    .to_string();
    assert_mentions(&msg, &["g.json", "g/1", "holds 2 elements"]);
}

#[test]
fn a_directory_without_vectors_is_an_error() {
    let dir = TempDir::new("empty");
    dir.write("notes.txt", "nothing here");
    assert!(matches!(
        run_dir(dir.path()),
        Err(ConformanceError::NoVectors { .. })
    ));
    assert!(matches!(
        run_dir(&dir.path().join("missing")),
        Err(ConformanceError::Io { .. })
    ));
}

#[test]
fn the_data_directory_gives_the_builtin_report() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    assert_eq!(run_dir(&data).unwrap(), run_builtin());
}
