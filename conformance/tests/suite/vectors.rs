//! Runs every built-in vector (the README test command runs this with the workspace).

use conformance::{run_builtin, Suite};

#[test]
fn builtin_vectors_have_no_failures() {
    let report = run_builtin();
    // The whole report, skips included: `cargo test -p conformance -- --nocapture` shows it.
    println!("{report}");
    let (_, _, skipped) = report.totals();
    if skipped > 0 {
        eprintln!("conformance: {skipped} cases skipped (listed above, by reason)");
    }
    for (suite, f) in report.failures() {
        eprintln!("FAIL {suite} {} [{}]: {}", f.id, f.file, f.message);
    }
    assert!(
        report.passed(),
        "{} conformance failures",
        report.totals().1
    );
}

#[test]
fn every_builtin_case_is_counted() {
    let report = run_builtin();
    // Every file but policy.json and errors.json has its value variants, case for case;
    // autocast_cpu.json also its 775 scenario and 212 keyword variants.
    let expected = [
        (Suite::Policy, 374),
        (Suite::Autocast, 2 * 232 + 775 + 212),
        // grad_f32/f64 (246) and grad_layers_f32/f64 (34), their value variants, and the
        // float64 files' requires-grad subsets (108 + 34), grad_f64's keyword variants (86).
        (Suite::Grad, 2 * (246 + 34) + 108 + 34 + 86),
        // scaler.json, its value variants and 78 random programs.
        (Suite::Scaler, 2 * 28 + 78),
        // train.json, its value variants and 30 random training programs.
        (Suite::Train, 2 * 6 + 30),
        (Suite::Errors, 722 + 1755),
    ];
    for (suite, n) in expected {
        assert_eq!(report.suite(suite).total(), n, "{suite}");
    }
    // The policy suite needs no other crate: it runs fully.
    assert_eq!(report.suite(Suite::Policy).passed, 374);
    // The scaler and train suites run on the workspace's crates: nothing is skipped.
    assert!(report.suite(Suite::Scaler).skipped.is_empty());
    assert!(report.suite(Suite::Train).skipped.is_empty());
    // Every errors case runs, and every error it returns is compared with PyTorch's text.
    let errors = report.suite(Suite::Errors);
    assert!(errors.skipped.is_empty());
    assert_eq!(errors.texts.compared, errors.passed);
    // Every skip says why.
    for (suite, s) in report.skipped() {
        assert!(
            s.reason.ends_with("not implemented yet"),
            "{suite} {}: {}",
            s.id,
            s.reason
        );
    }
}
