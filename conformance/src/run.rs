//! Loading vector files and running them into a [`Report`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use amp::policy::Profile;

use crate::backend::{AutocastBackend, GradBackend};
use crate::coverage::{Coverage, OpCalls};
use crate::report::{Failure, Report, Skip, SkipCause, SuiteReport, TextDiff};
use crate::suite::{self, guarded, Outcome};
use crate::vectors::{Cases, Suite, VectorFile};
use crate::ConformanceError;

/// `(name, text)` of each named file of `conformance/data/`, embedded at build time.
macro_rules! embedded {
    ($($name:literal),* $(,)?) => {
        [$(($name, include_str!(concat!("../data/", $name)))),*]
    };
}

/// The built-in copy of the vectors (`conformance/data/`), embedded at build time:
/// `(file name, text)`, sorted by name as [`load_dir`] sorts a directory's files. The
/// `*_values.json` files are `tools/value_variants.py`'s: every case of the file of the
/// same stem again with other input values, its expectations computed by PyTorch;
/// `autocast_cpu_scenarios.json` is its `--scenarios` (float16 autocast, float64,
/// float16 and mixed-dtype inputs); the `*_subsets.json` are its `--subsets` (one input
/// at a time not requiring grad), the `*_kwargs.json` its `--kwargs` (one keyword
/// argument changed at a time); `scaler_programs.json` holds random GradScaler
/// programs recorded from PyTorch (`tools/scaler_programs.py`), `train_programs.json`
/// random training runs (`tools/train_programs.py`).
pub const BUILTIN: [(&str, &str); 24] = embedded![
    "autocast_cpu.json",
    "autocast_cpu_kwargs.json",
    "autocast_cpu_scenarios.json",
    "autocast_cpu_values.json",
    "errors.json",
    "errors_variants.json",
    "grad_f32.json",
    "grad_f32_values.json",
    "grad_f64.json",
    "grad_f64_kwargs.json",
    "grad_f64_subsets.json",
    "grad_f64_values.json",
    "grad_layers_f32.json",
    "grad_layers_f32_values.json",
    "grad_layers_f64.json",
    "grad_layers_f64_subsets.json",
    "grad_layers_f64_values.json",
    "policy.json",
    "scaler.json",
    "scaler_programs.json",
    "scaler_values.json",
    "train.json",
    "train_programs.json",
    "train_values.json",
];

/// The built-in vector files, parsed once per process.
pub fn builtin_files() -> &'static [VectorFile] {
    static FILES: OnceLock<Vec<VectorFile>> = OnceLock::new();
    FILES.get_or_init(|| {
        let files = BUILTIN
            .iter()
            .map(|(name, text)| VectorFile::parse(name, text))
            .collect::<Result<Vec<_>, _>>()
            .expect("the built-in vectors are valid (checked by the crate's tests)");
        check_unique_ids(&files).expect("the built-in vectors have unique ids");
        files
    })
}

/// Every `*.json` file of `dir` (not recursive), sorted by name, parsed. Other files
/// (`README.md`, `torch_runner.py`) are ignored; no `*.json` file at all is an error, and so
/// is a file of an unknown format or suite.
pub fn load_dir(dir: &Path) -> Result<Vec<VectorFile>, ConformanceError> {
    let io = |source| ConformanceError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "json") && path.is_file() {
            paths.push(path);
        }
    }
    if paths.is_empty() {
        return Err(ConformanceError::NoVectors {
            dir: dir.to_owned(),
        });
    }
    paths.sort();
    let files = paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|source| ConformanceError::Io {
                path: path.clone(),
                source,
            })?;
            VectorFile::parse(&path.display().to_string(), &text)
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_unique_ids(&files)?;
    Ok(files)
}

/// Case ids must be unique within a suite, across its files.
fn check_unique_ids(files: &[VectorFile]) -> Result<(), ConformanceError> {
    let mut seen: HashMap<(Suite, &str), &str> = HashMap::new();
    for file in files {
        for id in file.cases.ids() {
            if let Some(first) = seen.insert((file.suite(), id), &file.name) {
                return Err(ConformanceError::DuplicateIdAcrossFiles {
                    suite: file.suite().to_string(),
                    id: id.to_owned(),
                    first: first.to_owned(),
                    second: file.name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Why the cases of a suite that builds its own host tensors (or none) are not run in a
/// device run: `None` for the op-running suites (autocast, grad, errors), which run on the
/// backend's device.
pub(crate) fn host_only(suite: Suite) -> Option<&'static str> {
    match suite {
        Suite::Policy => Some(
            "no tensors: the documented lists are the same on every device (the cpu run checks them)",
        ),
        Suite::Scaler => Some(
            "host-only: the GradScaler programs build cpu tensors (the cpu run checks them)",
        ),
        Suite::Train => Some(
            "host-only: the MLP trains on cpu tensors under autocast(cpu) (the cpu run checks it)",
        ),
        Suite::Autocast | Suite::Grad | Suite::Errors => None,
    }
}

/// Runs every case of `files` on `backend` (policy cases against [`Profile::docs`]) and
/// reports. Several files of one suite add up. A panicking case fails; the run goes on.
///
/// On a device backend ([`Backend::device`](crate::backend::Backend::device) not the cpu)
/// the grad, errors and autocast suites' tensors are on that device; a case meeting an op
/// without a kernel there is skipped ([`SkipCause::NoDeviceKernel`]). Cases that cannot
/// run on the device are skipped with their reason ([`SkipCause::NotOnDevice`]): the
/// host-only suites (policy: no tensors; scaler and train: they build cpu tensors), and
/// autocast cases of another device type (autocast(cpu) does not apply to CUDA tensors).
pub fn run_files<B: GradBackend + AutocastBackend>(backend: &B, files: &[VectorFile]) -> Report {
    let profile = Profile::docs();
    let device = backend.device();
    let mut suites: Vec<SuiteReport> = Suite::ALL.into_iter().map(SuiteReport::new).collect();
    for file in files {
        let report = suites
            .iter_mut()
            .find(|s| s.suite == file.suite())
            .expect("every suite has a report");
        report.files.push(file.name.clone());
        let mut record = |id: &str, outcome: Outcome| {
            let skip = |reason, cause| Skip {
                id: id.to_owned(),
                reason,
                cause,
            };
            match outcome {
                Outcome::Passed => report.passed += 1,
                Outcome::Failed(message) => report.failures.push(Failure {
                    id: id.to_owned(),
                    file: file.name.clone(),
                    message,
                }),
                Outcome::Skipped(r) => report.skipped.push(skip(r, SkipCause::NotImplemented)),
                Outcome::NoDeviceKernel(r) => {
                    report.skipped.push(skip(r, SkipCause::NoDeviceKernel))
                }
                Outcome::NotOnDevice(r) => report.skipped.push(skip(r, SkipCause::NotOnDevice)),
            }
        };
        if let Some(reason) = host_only(file.suite()).filter(|_| !device.is_cpu()) {
            for id in file.cases.ids() {
                record(id, Outcome::NotOnDevice(reason.to_owned()));
            }
            continue;
        }
        match &file.cases {
            Cases::Policy(cases) => cases
                .iter()
                .for_each(|c| record(&c.id, guarded(|| suite::policy::run(&profile, c)))),
            Cases::Autocast(cases) => {
                for c in cases {
                    let outcome = if !device.is_cpu() && c.device != device.device_type() {
                        Outcome::NotOnDevice(format!(
                            "autocast({}) does not apply to {} tensors",
                            c.device,
                            device.device_type()
                        ))
                    } else {
                        guarded(|| suite::autocast::run(backend, c))
                    };
                    record(&c.id, outcome);
                }
            }
            Cases::Grad(cases) => cases
                .iter()
                .for_each(|c| record(&c.id, guarded(|| suite::grad::run(backend, c)))),
            Cases::Scaler(cases) => cases
                .iter()
                .for_each(|c| record(&c.id, guarded(|| suite::scaler::run(c)))),
            Cases::Train(cases) => cases
                .iter()
                .for_each(|c| record(&c.id, guarded(|| suite::train::run(c)))),
            Cases::Errors(cases) => {
                for c in cases {
                    let mut text = None;
                    let outcome = guarded(|| {
                        let r = suite::errors::run(backend, c);
                        text = r.text;
                        r.outcome
                    });
                    record(&c.id, outcome);
                    if let Some((got, same)) = text {
                        report.texts.compared += 1;
                        if same {
                            report.texts.matched += 1;
                        } else {
                            report.texts.differing.push(TextDiff {
                                id: c.id.clone(),
                                got,
                                expected: c.expect_error.message.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    Report {
        backend: backend.name().to_owned(),
        device,
        suites,
        coverage: Coverage::compute(&profile, backend.ops(), &op_calls(files)),
    }
}

/// `op` → `call` from the built-in vectors, `files`, and
/// [`ops::CALLS_WITHOUT_VECTORS`](crate::ops::CALLS_WITHOUT_VECTORS).
pub fn op_calls(files: &[VectorFile]) -> OpCalls {
    let mut calls = OpCalls::new();
    for file in builtin_files().iter().chain(files) {
        for (op, call) in file.cases.op_calls() {
            calls.add(op, call);
        }
    }
    for (op, call) in crate::ops::CALLS_WITHOUT_VECTORS {
        calls.add(op, call);
    }
    calls
}
