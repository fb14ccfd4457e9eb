//! The workspace's dev-only test kit.
//!
//! [`gradcheck`] is the workspace's one gradient checker (central differences in
//! float64, first and second order; on autograd tensors with the `autograd` feature);
//! [`tensors`] the seeded test data, per-dtype tolerances and the [`each_dtype!`] macro
//! (with the `tensor` feature); [`json`] the strategies for fuzzing loaders.
//!
//! Every property test in the workspace takes its configuration from [`proptest_config`],
//! so that a test run is a pure function of the code: the same cases are drawn on every
//! machine and every run, and CI cannot fail at random.
//!
//! ```
//! use amp_testing::proptest_config;
//! use proptest::prelude::*;
//!
//! proptest! {
//!     #![proptest_config(proptest_config(16))]
//!     // (in a test file, with `#[test]` here)
//!     fn addition_commutes(a in -1e3f64..1e3, b in -1e3f64..1e3) {
//!         prop_assert_eq!(a + b, b + a);
//!     }
//! }
//! # addition_commutes();
//! ```
//!
//! # Exploratory runs
//!
//! To look for new failures, set [`SEED_VAR`] (`AMP_TEST_SEED`) to a number, or to `random`
//! for a fresh seed per test; the seed used is printed with any failure. A failure found
//! that way is kept by proptest in `tests/NAME.proptest-regressions`: commit it, and
//! every later run (CI included) replays that case first. CI never sets the variable.

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};

pub mod gradcheck;
pub mod json;
pub mod tensors;

/// The seed every property test starts from unless [`SEED_VAR`] says otherwise.
pub const SEED: u64 = 0x5eed_a3b0_0017_2026;

/// The opt-in environment variable for exploratory runs: a `u64` seed, or `random`.
pub const SEED_VAR: &str = "AMP_TEST_SEED";

/// The seed to use: [`SEED`], or what [`SEED_VAR`] asks for.
///
/// # Panics
/// If [`SEED_VAR`] is set to something other than a `u64` or `random` (a typo must not
/// quietly fall back to the fixed seed).
pub fn rng_seed() -> RngSeed {
    match std::env::var(SEED_VAR) {
        Err(_) => RngSeed::Fixed(SEED),
        Ok(v) if v.trim() == "random" => RngSeed::Random,
        Ok(v) => RngSeed::Fixed(
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{SEED_VAR} must be a u64 or `random`, got {v:?}")),
        ),
    }
}

/// A proptest configuration with `cases` cases, drawn from the fixed seed ([`rng_seed`]).
///
/// Failures persist to (and replay from) the file beside the test's source,
/// `tests/NAME.proptest-regressions` (proptest's default looks for a `lib.rs` first and
/// warns before it falls back to the same file for an integration test).
pub fn proptest_config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: rng_seed(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// Say, in the test output, that a test skipped `what` and why (a kernel path this CPU
/// lacks, say). Written straight to the process's standard error, which the test harness
/// does not capture, so the line shows in every `cargo test` run: a skip is counted and
/// printed, never hidden.
pub fn report_skip(test: &str, what: &str, why: &str) {
    use std::io::Write;
    // A failed write of a diagnostic line must not fail the test.
    let _ = writeln!(std::io::stderr(), "SKIPPED in {test}: {what} ({why})");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    /// Draws a few values the way `proptest!` does for a test configured by
    /// [`proptest_config`].
    fn draw() -> Vec<u64> {
        let mut runner = TestRunner::new(proptest_config(8));
        (0..8)
            .map(|_| (0..u64::MAX).new_tree(&mut runner).unwrap().current())
            .collect()
    }

    #[test]
    fn two_runners_draw_the_same_cases() {
        if std::env::var(SEED_VAR).is_ok() {
            return; // an exploratory run may ask for `random`
        }
        assert_eq!(draw(), draw());
        assert!(matches!(rng_seed(), RngSeed::Fixed(SEED)));
    }
}
