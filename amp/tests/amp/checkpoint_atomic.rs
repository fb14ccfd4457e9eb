//! Checkpoints are atomic and checked: a save cut short at any byte leaves the previous
//! checkpoint loadable; every kind of damage (truncation, a flipped byte, corrupt JSON, a
//! wrong shape, a missing file) is an error naming the file, and a failed load leaves
//! model, optimizer and scaler exactly as they were; NaN and infinite values
//! round-trip.

use std::cell::Cell;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use amp::checkpoint::{self, CheckpointError, SyncWrite, MANIFEST};
use amp::prelude::*;
use amp::scaler::NewScale;
use sha2::{Digest, Sha256};

struct Run {
    model: Sequential,
    opt: Adam,
    scaler: GradScaler,
}

fn fresh(seed: u64, hidden: usize) -> Run {
    let mut gen = Generator::new(seed);
    let model = Sequential::new()
        .add(Linear::new(3, hidden, &mut gen).unwrap())
        .add(Tanh)
        .add(Linear::new(hidden, 2, &mut gen).unwrap());
    let opt = Adam::new(model.parameters(), 1e-2, AdamOptions::default()).unwrap();
    let scaler = GradScaler::with_options(GradScalerOptions::default().init_scale(256.0)).unwrap();
    Run { model, opt, scaler }
}

fn step(run: &mut Run, i: u64) {
    let mut gen = Generator::new(1000 + i);
    let x = Tensor::randn([4, 3], DType::F32, &mut gen).unwrap();
    let y = Tensor::randn([4, 2], DType::F32, &mut gen).unwrap();
    run.opt.zero_grad();
    let loss = ops::mse_loss(&run.model.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
    run.scaler.scale(&loss).unwrap().backward().unwrap();
    run.scaler.step(&mut run.opt).unwrap();
    run.scaler.update().unwrap();
}

/// A run of `steps` steps from `seed`.
fn trained(seed: u64, hidden: usize, steps: u64) -> Run {
    let mut run = fresh(seed, hidden);
    for i in 0..steps {
        step(&mut run, i);
    }
    run
}

/// Everything a load could change: parameter bits, optimizer and scaler state.
#[derive(Debug, PartialEq)]
struct Snapshot {
    params: Vec<Vec<u32>>,
    opt: String,
    scaler: String,
}

fn snapshot(run: &Run) -> Snapshot {
    Snapshot {
        params: run
            .model
            .parameters()
            .iter()
            .map(|p| {
                p.to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            })
            .collect(),
        opt: serde_json::to_string(&run.opt.state_dict()).unwrap(),
        scaler: run.scaler.state_dict_json().to_string(),
    }
}

fn load(dir: &Path, run: &mut Run) -> Result<(), CheckpointError> {
    checkpoint::load(dir, &run.model, &mut run.opt, &mut run.scaler)
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("amp-ckpt-atomic-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// A file writer that fails once a byte budget shared by all files is spent, after
/// writing what the budget allows (a full disk, or a process killed mid-write).
struct Budgeted {
    file: std::fs::File,
    left: Rc<Cell<usize>>,
    written: Rc<Cell<usize>>,
}

impl Write for Budgeted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left.get();
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::other("no space left on device (test)"));
        }
        let n = self.file.write(&buf[..buf.len().min(left)])?;
        self.left.set(left - n);
        self.written.set(self.written.get() + n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl SyncWrite for Budgeted {
    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// Save with a byte budget; returns the result and the size of each file started.
fn save_budgeted(
    dir: &Path,
    run: &Run,
    budget: usize,
) -> (Result<(), CheckpointError>, Vec<usize>) {
    let left = Rc::new(Cell::new(budget));
    let mut sizes: Vec<Rc<Cell<usize>>> = Vec::new();
    let r = checkpoint::save_with(dir, &run.model, &run.opt, &run.scaler, |path| {
        let written = Rc::new(Cell::new(0));
        sizes.push(written.clone());
        Ok(Budgeted {
            file: std::fs::File::create(path)?,
            left: left.clone(),
            written,
        })
    });
    (r, sizes.iter().map(|c| c.get()).collect())
}

#[test]
fn an_interrupted_save_leaves_the_previous_checkpoint_loadable() {
    let dir = scratch("interrupted");
    let first = trained(1, 8, 3);
    checkpoint::save(&dir, &first.model, &first.opt, &first.scaler).unwrap();
    let saved = snapshot(&first);
    let committed = listing(&dir);
    assert_eq!(committed.len(), 4, "{committed:?}");

    // The same run, three steps later: another state to save over the first.
    let mut later = first;
    for i in 3..6 {
        step(&mut later, i);
    }
    assert_ne!(snapshot(&later), saved);
    // The size of each file a save writes (three data files, then the manifest).
    let (r, sizes) = save_budgeted(&scratch("interrupted-sizes"), &later, usize::MAX);
    r.unwrap();
    assert_eq!(sizes.len(), 4);
    let mut budgets = vec![0, 1];
    let mut start = 0;
    for s in &sizes {
        budgets.extend([start, start + 1, start + s / 2, start + s - 1]);
        start += s;
    }
    budgets.sort();
    budgets.dedup();
    for budget in budgets {
        let (r, _) = save_budgeted(&dir, &later, budget);
        let e = r.expect_err("the save ran out of space");
        assert!(matches!(e, CheckpointError::Io { .. }), "{e}");
        assert!(e.to_string().contains("no space left"), "{e}");
        // The error names the file being written, in the checkpoint directory.
        assert!(e.to_string().contains(dir.to_str().unwrap()), "{e}");
        // The failed save cleaned up after itself; the previous checkpoint is whole.
        assert_eq!(listing(&dir), committed, "budget {budget}");
        let mut resumed = trained(7, 8, 1);
        load(&dir, &mut resumed).unwrap();
        assert_eq!(snapshot(&resumed), saved, "budget {budget}");
    }

    // A save killed outright leaves temporaries and unreferenced data files; the next
    // save that completes commits the new state and removes them, and nothing else.
    std::fs::write(
        dir.join(".model-0123456789abcdef.safetensors.1-0.tmp"),
        b"x",
    )
    .unwrap();
    std::fs::write(dir.join("optimizer-0123456789abcdef.json"), b"{}").unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    checkpoint::save(&dir, &later.model, &later.opt, &later.scaler).unwrap();
    let files = listing(&dir);
    assert_eq!(files.len(), 5, "{files:?}");
    assert!(files.contains(&"notes.txt".to_owned()));
    assert!(files.contains(&MANIFEST.to_owned()));
    let mut resumed = trained(7, 8, 1);
    load(&dir, &mut resumed).unwrap();
    assert_eq!(snapshot(&resumed), snapshot(&later));
    // Saving the same state again keeps the same file names (content-addressed).
    checkpoint::save(&dir, &later.model, &later.opt, &later.scaler).unwrap();
    assert_eq!(listing(&dir), files);
    std::fs::remove_dir_all(&dir).ok();
}

/// The file names the manifest of `dir` gives for `model`, `optimizer`, `scaler`.
fn file_of(dir: &Path, part: &str) -> PathBuf {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
    dir.join(m["files"][part]["file"].as_str().unwrap())
}

/// Replace the bytes of a part and record them in the manifest, as a writer with a
/// bug (rather than a damaged disk) would: the checksums match, the content is wrong.
fn replace_recorded(dir: &Path, part: &str, bytes: &[u8]) {
    let path = file_of(dir, part);
    std::fs::write(&path, bytes).unwrap();
    let mpath = dir.join(MANIFEST);
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    m["files"][part]["bytes"] = bytes.len().into();
    m["files"][part]["sha256"] = hex.into();
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
}

/// Save a checkpoint of `source` into a fresh directory, damage it, load it into a
/// trained run of the usual shape: the load must fail, change nothing, and name the
/// file `blame` (a part name or `MANIFEST`) in its message.
fn damaged(name: &str, source: &Run, damage: impl FnOnce(&Path), blame: &str) -> CheckpointError {
    let dir = scratch(name);
    checkpoint::save(&dir, &source.model, &source.opt, &source.scaler).unwrap();
    let blamed = if blame == MANIFEST {
        dir.join(MANIFEST)
    } else {
        file_of(&dir, blame)
    };
    damage(&dir);
    let mut target = trained(2, 8, 2);
    let before = snapshot(&target);
    let e = load(&dir, &mut target).expect_err(name);
    assert_eq!(
        snapshot(&target),
        before,
        "{name}: the failed load changed something"
    );
    assert!(
        e.to_string().contains(blamed.to_str().unwrap()),
        "{name}: `{e}` does not name {}",
        blamed.display()
    );
    std::fs::remove_dir_all(&dir).ok();
    e
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(path).unwrap();
    f(&mut b);
    std::fs::write(path, b).unwrap();
}

#[test]
fn every_kind_of_damage_is_an_error_naming_the_file_and_changes_nothing() {
    let good = trained(1, 8, 3);

    for part in ["model", "optimizer", "scaler"] {
        let e = damaged(
            &format!("truncated-{part}"),
            &good,
            |d| edit(&file_of(d, part), |b| b.truncate(b.len() / 2)),
            part,
        );
        assert!(matches!(e, CheckpointError::Size { .. }), "{e}");
        let e = damaged(
            &format!("flipped-{part}"),
            &good,
            // The last byte: tensor data in the model file, a brace in the JSON files.
            |d| edit(&file_of(d, part), |b| *b.last_mut().unwrap() ^= 0x40),
            part,
        );
        assert!(matches!(e, CheckpointError::Checksum { .. }), "{e}");
        let e = damaged(
            &format!("missing-{part}"),
            &good,
            |d| std::fs::remove_file(file_of(d, part)).unwrap(),
            part,
        );
        assert!(matches!(e, CheckpointError::Missing { .. }), "{e}");
    }

    // Bytes that match their recorded checksum but are not what they should be.
    let e = damaged(
        "model-not-safetensors",
        &good,
        |d| replace_recorded(d, "model", b"\x10\0\0\0\0\0\0\0{\"a\": 1}       "),
        "model",
    );
    assert!(matches!(e, CheckpointError::Model { .. }), "{e}");
    let e = damaged(
        "optimizer-corrupt-json",
        &good,
        |d| replace_recorded(d, "optimizer", br#"{"state": {}, "param_groups": ["#),
        "optimizer",
    );
    assert!(matches!(e, CheckpointError::Json { .. }), "{e}");
    let e = damaged(
        "scaler-corrupt-json",
        &good,
        |d| replace_recorded(d, "scaler", b"{\"scale\": 2.0,"),
        "scaler",
    );
    assert!(matches!(e, CheckpointError::Json { .. }), "{e}");
    // The scaler is checked last: a bad one must not leave model and optimizer loaded.
    let e = damaged(
        "scaler-wrong-type",
        &good,
        |d| {
            replace_recorded(
                d,
                "scaler",
                br#"{"scale": "big", "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1, "_growth_tracker": 0}"#,
            )
        },
        "scaler",
    );
    assert!(matches!(e, CheckpointError::Scaler { .. }), "{e}");
    assert!(e.to_string().contains("`scale` must be a number"), "{e}");
    let e = damaged(
        "scaler-empty",
        &good,
        |d| replace_recorded(d, "scaler", b"{}"),
        "scaler",
    );
    assert!(
        e.to_string().contains("The source state dict is empty"),
        "{e}"
    );

    // A model of another shape: refused before a single value is copied.
    let wide = trained(3, 12, 1);
    let e = damaged("wrong-shape", &wide, |_| {}, "model");
    match &e {
        CheckpointError::Model { source, .. } => assert!(
            source
                .to_string()
                .starts_with("size mismatch for 0.weight: copying a param with shape [12, 3] from checkpoint, the shape in current model is [8, 3]."),
            "{source}"
        ),
        other => panic!("{other}"),
    }
    // Optimizer state of another shape beside a model that fits.
    let e = damaged(
        "optimizer-wrong-shape",
        &good,
        |d| {
            let wide_opt = serde_json::to_vec(&wide.opt.state_dict()).unwrap();
            replace_recorded(d, "optimizer", &wide_opt)
        },
        "optimizer",
    );
    assert!(matches!(e, CheckpointError::Optimizer { .. }), "{e}");
    assert!(
        e.to_string().contains("differs from the parameter's"),
        "{e}"
    );
    // An SGD state dict where Adam's is expected.
    let e = damaged(
        "optimizer-of-another-kind",
        &good,
        |d| {
            let sgd = Sgd::new(good.model.parameters(), 0.1, SgdOptions::default()).unwrap();
            replace_recorded(
                d,
                "optimizer",
                &serde_json::to_vec(&sgd.state_dict()).unwrap(),
            )
        },
        "optimizer",
    );
    assert!(e.to_string().contains("must be a pair of numbers"), "{e}");

    // The manifest itself.
    let e = damaged(
        "manifest-missing",
        &good,
        |d| std::fs::remove_file(d.join(MANIFEST)).unwrap(),
        MANIFEST,
    );
    assert!(matches!(e, CheckpointError::Missing { .. }), "{e}");
    let e = damaged(
        "manifest-corrupt",
        &good,
        |d| edit(&d.join(MANIFEST), |b| b.truncate(b.len() - 3)),
        MANIFEST,
    );
    assert!(matches!(e, CheckpointError::Json { .. }), "{e}");
    let e = damaged(
        "manifest-escapes",
        &good,
        |d| {
            let p = d.join(MANIFEST);
            let text = std::fs::read_to_string(&p).unwrap();
            let m = file_of(d, "model");
            let name = m.file_name().unwrap().to_str().unwrap();
            std::fs::write(&p, text.replace(name, "../model.safetensors")).unwrap();
        },
        MANIFEST,
    );
    assert!(matches!(e, CheckpointError::BadFileName { .. }), "{e}");
    let e = damaged(
        "manifest-format",
        &good,
        |d| {
            let p = d.join(MANIFEST);
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, text.replace("amp-checkpoint/1", "amp-checkpoint/9")).unwrap();
        },
        MANIFEST,
    );
    assert!(matches!(e, CheckpointError::UnknownFormat { .. }), "{e}");

    // No directory at all.
    let mut target = trained(2, 8, 1);
    let nowhere = scratch("nowhere").join("absent");
    let e = load(&nowhere, &mut target).unwrap_err();
    assert!(e.to_string().contains(MANIFEST), "{e}");
}

#[test]
fn non_finite_scales_and_state_round_trip() {
    for scale in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let dir = scratch(&format!("nonfinite-{scale}"));
        let mut run = trained(1, 8, 2);
        run.scaler.update_with(NewScale::Value(scale)).unwrap();
        // A NaN moment too: a step on a NaN gradient outside the scaler.
        let p = run.model.parameters()[1].clone();
        p.set_grad(Some(Tensor::full([8], f32::NAN, DType::F32)))
            .unwrap();
        run.opt.step().unwrap();
        checkpoint::save(&dir, &run.model, &run.opt, &run.scaler).unwrap();
        let text = std::fs::read_to_string(file_of(&dir, "scaler")).unwrap();
        assert!(!text.contains("null"), "{text}");
        let mut resumed = trained(5, 8, 1);
        load(&dir, &mut resumed).unwrap();
        let got = resumed.scaler.get_scale();
        assert!(
            got.to_bits() == (scale as f32 as f64).to_bits() || (got.is_nan() && scale.is_nan()),
            "{got}"
        );
        assert_eq!(snapshot(&resumed), snapshot(&run));
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn a_disabled_scaler_ignores_the_saved_scaler_state() {
    let dir = scratch("disabled");
    let run = trained(1, 8, 2);
    checkpoint::save(&dir, &run.model, &run.opt, &run.scaler).unwrap();
    let mut target = trained(2, 8, 1);
    target.scaler = GradScaler::with_options(GradScalerOptions::default().enabled(false)).unwrap();
    load(&dir, &mut target).unwrap();
    assert_eq!(snapshot(&target).params, snapshot(&run).params);
    assert_eq!(target.scaler.state_dict_json().to_string(), "{}");
    std::fs::remove_dir_all(&dir).ok();
}

// ----- fuzzing: checkpoint files are outside data ----------------------------------

mod fuzz {
    use super::*;
    use amp_testing::json::{damaged_bytes, mutated_json};
    use amp_testing::proptest_config;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    const KEYS: &[&str] = &[
        "format",
        "files",
        "model",
        "optimizer",
        "scaler",
        "file",
        "bytes",
        "sha256",
        "state",
        "param_groups",
        "params",
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "step",
        "exp_avg",
        "exp_avg_sq",
        "dtype",
        "shape",
        "data",
        "scale",
        "_growth_tracker",
        "0",
    ];

    /// The files of a good checkpoint: (name, bytes) of model, optimizer, scaler, and
    /// the manifest.
    struct Pristine {
        parts: Vec<(String, String, Vec<u8>)>,
        manifest: serde_json::Value,
    }

    fn pristine() -> &'static Pristine {
        static P: OnceLock<Pristine> = OnceLock::new();
        P.get_or_init(|| {
            let dir = scratch("fuzz-pristine");
            let run = trained(1, 8, 2);
            checkpoint::save(&dir, &run.model, &run.opt, &run.scaler).unwrap();
            let manifest: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
            let parts = ["model", "optimizer", "scaler"]
                .into_iter()
                .map(|part| {
                    let name = manifest["files"][part]["file"].as_str().unwrap().to_owned();
                    let bytes = std::fs::read(dir.join(&name)).unwrap();
                    (part.to_owned(), name, bytes)
                })
                .collect();
            std::fs::remove_dir_all(&dir).ok();
            Pristine { parts, manifest }
        })
    }

    fn part_bytes(part: &str) -> Vec<u8> {
        let p = pristine();
        p.parts
            .iter()
            .find(|(n, _, _)| n == part)
            .unwrap()
            .2
            .clone()
    }

    fn part_json(part: &str) -> serde_json::Value {
        serde_json::from_slice(&part_bytes(part)).unwrap()
    }

    /// Lay out the pristine checkpoint in `dir` with `part` replaced by `bytes` (its
    /// manifest entry updated to match, so the loader's checks beyond the digest are
    /// reached), or the manifest replaced when `part` is `MANIFEST`; load it into a
    /// trained run: no panic; a failure changes nothing; a success leaves a run that
    /// trains.
    fn check(dir: &Path, part: &str, bytes: &[u8]) -> Result<(), TestCaseError> {
        let p = pristine();
        for (_, name, b) in &p.parts {
            std::fs::write(dir.join(name), b).unwrap();
        }
        let manifest = if part == MANIFEST {
            bytes.to_vec()
        } else {
            let name = &p.parts.iter().find(|(n, _, _)| n == part).unwrap().1;
            std::fs::write(dir.join(name), bytes).unwrap();
            let mut m = p.manifest.clone();
            let hex: String = Sha256::digest(bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            m["files"][part]["bytes"] = bytes.len().into();
            m["files"][part]["sha256"] = hex.into();
            serde_json::to_vec(&m).unwrap()
        };
        std::fs::write(dir.join(MANIFEST), manifest).unwrap();
        let mut target = trained(2, 8, 1);
        let before = snapshot(&target);
        match load(dir, &mut target) {
            Err(_) => prop_assert_eq!(snapshot(&target), before),
            Ok(()) => step(&mut target, 9),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(proptest_config(128))]

        #[test]
        fn damaged_model_files_never_panic(bytes in damaged_bytes(part_bytes("model"))) {
            check(&scratch("fuzz-model"), "model", &bytes)?;
        }

        #[test]
        fn damaged_optimizer_files_never_panic(bytes in damaged_bytes(part_bytes("optimizer"))) {
            check(&scratch("fuzz-optimizer-bytes"), "optimizer", &bytes)?;
        }

        #[test]
        fn mutated_optimizer_files_never_panic(v in mutated_json(part_json("optimizer"), KEYS)) {
            check(&scratch("fuzz-optimizer-json"), "optimizer", &serde_json::to_vec(&v).unwrap())?;
        }

        #[test]
        fn mutated_scaler_files_never_panic(v in mutated_json(part_json("scaler"), KEYS)) {
            check(&scratch("fuzz-scaler"), "scaler", &serde_json::to_vec(&v).unwrap())?;
        }

        #[test]
        fn damaged_manifests_never_panic(
            bytes in prop_oneof![
                damaged_bytes(serde_json::to_vec(&pristine().manifest).unwrap()),
                mutated_json(pristine().manifest.clone(), KEYS)
                    .prop_map(|v| serde_json::to_vec(&v).unwrap()),
            ]
        ) {
            check(&scratch("fuzz-manifest"), MANIFEST, &bytes)?;
        }
    }
}
