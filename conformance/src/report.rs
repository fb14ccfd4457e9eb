//! The result of a conformance run: per-suite counts, failures, skips, op-list coverage.
//!
//! Its [`Display`](fmt::Display) is what `cargo xtask conformance` prints: a table of
//! passed / failed / skipped per suite, every failure (id and first mismatch, with both
//! values), every skip grouped by reason (count and ids), then the coverage of the
//! documented op lists. A device run (`--device cuda`) adds two columns to the table: per
//! suite, the cases that ran on the device and those skipped there for lack of a device
//! kernel.

use std::fmt;

use amp::tensor::Device;

use crate::coverage::Coverage;
use crate::vectors::Suite;

/// A case that did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The case id.
    pub id: String,
    /// The file the case comes from.
    pub file: String,
    /// The first mismatch (or error), with both values.
    pub message: String,
}

/// A case that was not run: the workspace does not implement what it needs yet, or (in a
/// device run) the device lacks its kernel or the case does not run on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    /// The case id.
    pub id: String,
    /// Why (`op `mm` not implemented yet`).
    pub reason: String,
    /// What kind of skip.
    pub cause: SkipCause,
}

/// Why a case was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipCause {
    /// The op has no entry in the op table: the workspace does not implement it yet.
    NotImplemented,
    /// An op returned `NoDeviceKernel`: it has no kernel for the run's device.
    NoDeviceKernel,
    /// The case does not run on the run's device (a host-only suite, or autocast of
    /// another device type).
    NotOnDevice,
}

/// The results of one suite (over all its files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteReport {
    /// The suite.
    pub suite: Suite,
    /// The files that held its cases.
    pub files: Vec<String>,
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed, in run order.
    pub failures: Vec<Failure>,
    /// Cases that were skipped, in run order.
    pub skipped: Vec<Skip>,
    /// The errors suite: how many error texts equal PyTorch's (zero elsewhere).
    pub texts: TextMatches,
}

/// How many of the errors a suite compared have PyTorch's text (the first line).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextMatches {
    /// Errors whose first line equals PyTorch's message.
    pub matched: usize,
    /// Errors compared.
    pub compared: usize,
    /// The errors whose text differs, in run order (`cargo xtask conformance --texts`
    /// prints them).
    pub differing: Vec<TextDiff>,
}

/// An error whose text is not PyTorch's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDiff {
    /// The case id.
    pub id: String,
    /// Our error's first line.
    pub got: String,
    /// PyTorch's.
    pub expected: String,
}

impl SuiteReport {
    /// An empty report for `suite`.
    pub fn new(suite: Suite) -> SuiteReport {
        SuiteReport {
            suite,
            files: Vec::new(),
            passed: 0,
            failures: Vec::new(),
            skipped: Vec::new(),
            texts: TextMatches::default(),
        }
    }

    /// Number of failed cases.
    pub fn failed(&self) -> usize {
        self.failures.len()
    }

    /// Number of cases run or skipped.
    pub fn total(&self) -> usize {
        self.passed + self.failures.len() + self.skipped.len()
    }

    /// Number of cases that ran (passed or failed): in a device run, those that ran on
    /// the device.
    pub fn ran(&self) -> usize {
        self.passed + self.failures.len()
    }

    /// Number of skips of `cause`.
    pub fn skipped_for(&self, cause: SkipCause) -> usize {
        self.skipped.iter().filter(|s| s.cause == cause).count()
    }

    /// The skips grouped by reason, in order of first appearance: `(reason, ids)`.
    pub fn skips_by_reason(&self) -> Vec<(&str, Vec<&str>)> {
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for s in &self.skipped {
            match groups.iter_mut().find(|(r, _)| *r == s.reason) {
                Some((_, ids)) => ids.push(&s.id),
                None => groups.push((&s.reason, vec![&s.id])),
            }
        }
        groups
    }

    /// Whether no case of this suite ran on the run's device (every one skipped as
    /// [`SkipCause::NotOnDevice`]; a suite without cases too).
    pub fn not_on_device(&self) -> bool {
        self.skipped_for(SkipCause::NotOnDevice) == self.total()
    }
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The backend that ran the op suites.
    pub backend: String,
    /// The device the op suites' tensors were on ([`Device::Cpu`]: the host run).
    pub device: Device,
    /// One entry per suite, in [`Suite::ALL`] order (a suite without files has zero cases).
    pub suites: Vec<SuiteReport>,
    /// Coverage of the documented op lists.
    pub coverage: Coverage,
}

impl Report {
    /// `true` when no case failed (skips are allowed): `cargo xtask conformance` exits 1
    /// otherwise.
    pub fn passed(&self) -> bool {
        self.suites.iter().all(|s| s.failures.is_empty())
    }

    /// The report of `suite`.
    pub fn suite(&self, suite: Suite) -> &SuiteReport {
        self.suites
            .iter()
            .find(|s| s.suite == suite)
            .expect("a report has every suite")
    }

    /// Every failure with its suite, in suite order.
    pub fn failures(&self) -> impl Iterator<Item = (Suite, &Failure)> {
        self.suites
            .iter()
            .flat_map(|s| s.failures.iter().map(move |f| (s.suite, f)))
    }

    /// Every skip with its suite, in suite order.
    pub fn skipped(&self) -> impl Iterator<Item = (Suite, &Skip)> {
        self.suites
            .iter()
            .flat_map(|s| s.skipped.iter().map(move |k| (s.suite, k)))
    }

    /// Total passed, failed, skipped.
    pub fn totals(&self) -> (usize, usize, usize) {
        self.suites.iter().fold((0, 0, 0), |(p, f, s), r| {
            (p + r.passed, f + r.failed(), s + r.skipped.len())
        })
    }

    /// Total skips of `cause`.
    pub fn skipped_for(&self, cause: SkipCause) -> usize {
        self.suites.iter().map(|s| s.skipped_for(cause)).sum()
    }
}

/// The device columns of a suite's row in a device run: cases that ran on the device, and
/// cases skipped there for lack of a device kernel (`-` for a suite that does not run on
/// the device).
fn device_columns(s: &SuiteReport) -> String {
    if s.total() > 0 && s.not_on_device() {
        format!("{:>11}{:>11}", "-", "-")
    } else {
        format!(
            "{:>11}{:>11}",
            s.ran(),
            s.skipped_for(SkipCause::NoDeviceKernel)
        )
    }
}

const WIDTH: usize = 100;

/// Writes `head` then `items` joined by `, `, wrapping at 100 columns with continuation
/// lines indented to the head's indentation plus four.
pub(crate) fn write_wrapped(
    f: &mut fmt::Formatter<'_>,
    head: &str,
    items: &[impl AsRef<str>],
) -> fmt::Result {
    let indent = " ".repeat(head.len() - head.trim_start().len() + 4);
    let mut line = head.to_owned();
    let mut fresh = true;
    for (i, item) in items.iter().enumerate() {
        let item = item.as_ref();
        let sep = if i + 1 < items.len() { "," } else { "" };
        if !fresh && line.len() + 1 + item.len() + sep.len() > WIDTH {
            writeln!(f, "{line}")?;
            line = indent.clone();
            fresh = true;
        }
        if !fresh {
            line.push(' ');
        }
        line.push_str(item);
        line.push_str(sep);
        fresh = false;
    }
    writeln!(f, "{line}")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance: amp-vectors/1 (backend: {})", self.backend)?;
        // A device run: per suite, what ran on the device and what lacked a kernel there.
        let on_device = !self.device.is_cpu();
        writeln!(f)?;
        let device_head = if on_device {
            format!("{:>11}{:>11}", format!("on {}", self.device), "no kernel")
        } else {
            String::new()
        };
        writeln!(
            f,
            "{:<10}{:>7}{:>8}{:>9}{:>7}{device_head}  files",
            "suite", "passed", "failed", "skipped", "total"
        )?;
        for s in &self.suites {
            let files = if s.files.is_empty() {
                "(no vector file)".to_owned()
            } else {
                s.files.join(", ")
            };
            let device = if on_device {
                device_columns(s)
            } else {
                String::new()
            };
            writeln!(
                f,
                "{:<10}{:>7}{:>8}{:>9}{:>7}{device}  {files}",
                s.suite.as_str(),
                s.passed,
                s.failed(),
                s.skipped.len(),
                s.total()
            )?;
        }
        let (p, fl, sk) = self.totals();
        let device = if on_device {
            format!(
                "{:>11}{:>11}",
                p + fl,
                self.skipped_for(SkipCause::NoDeviceKernel)
            )
        } else {
            String::new()
        };
        writeln!(
            f,
            "{:<10}{:>7}{:>8}{:>9}{:>7}{device}",
            "total",
            p,
            fl,
            sk,
            p + fl + sk
        )?;
        if on_device {
            writeln!(
                f,
                "on {}: {} cases ran, {} skipped for lack of a device kernel, {} not run there",
                self.device,
                p + fl,
                self.skipped_for(SkipCause::NoDeviceKernel),
                self.skipped_for(SkipCause::NotOnDevice)
            )?;
        }

        for s in self.suites.iter().filter(|s| s.texts.compared > 0) {
            writeln!(
                f,
                "{}: {} of {} error texts are PyTorch's",
                s.suite, s.texts.matched, s.texts.compared
            )?;
        }

        writeln!(f)?;
        if fl == 0 {
            writeln!(f, "failures: none")?;
        } else {
            writeln!(f, "failures ({fl}):")?;
            for (suite, x) in self.failures() {
                writeln!(f, "  {suite} {} [{}]: {}", x.id, x.file, x.message)?;
            }
        }

        writeln!(f)?;
        if sk == 0 {
            writeln!(f, "skipped: none")?;
        } else {
            writeln!(f, "skipped ({sk}), by reason:")?;
            for s in &self.suites {
                for (reason, ids) in s.skips_by_reason() {
                    let head = format!("  {}: {reason} ({}): ", s.suite, ids.len());
                    if s.total() > 0 && s.not_on_device() && ids.len() == s.total() {
                        // A suite that does not run on the device: its ids are every id.
                        writeln!(f, "{head}every case of {}", s.files.join(", "))?;
                    } else {
                        write_wrapped(f, &head, &ids)?;
                    }
                }
            }
        }

        writeln!(f)?;
        write!(f, "{}", self.coverage)
    }
}
