//! The main job: a small GPT-style character-level transformer trained twice on the same
//! data in the same order — first in float32, then under bfloat16 autocast with a
//! `GradScaler` — and compared: step time, validation loss, the scale, skipped steps,
//! text sampled from each model, and a picture of it all.
//!
//! ```sh
//! cargo run --release --example train -- [--dtype bfloat16|float16] [--text FILE]
//!     [--steps N] [--batch N] [--lr X] [--seed N] [--out DIR] [--checkpoint-every N]
//!     [--stop-after N] [--resume DIR]
//! ```
//!
//! The text is the repository's own (its README, architecture notes and a few source
//! files, embedded at build time) unless `--text` names another. The model: token and
//! position embeddings, pre-norm causal `TransformerEncoderLayer`s with GELU, a final
//! layer norm and a linear head (`gpt.rs`); AdamW with a warm-up + cosine schedule.
//!
//! Checkpoints (`--checkpoint-every N`) go to `DIR/checkpoints/<run>` through
//! `amp::checkpoint`: model, optimizer and scaler, with the loop's step and history in
//! the manifest. `--resume DIR` continues each run from the checkpoint under `DIR`
//! (a run without one starts afresh) to exactly the numbers of an uninterrupted run;
//! `--stop-after N` ends each run after step N, as an interruption would.

mod gpt;
mod ranks;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

use amp::prelude::*;
use gpt::{Gpt, GptConfig};
use indicatif::{ProgressBar, ProgressStyle};
use ranks::{CommTotals, Ranks, Replica};
use serde::{Deserialize, Serialize};
use serde_json::json;

type Res<T> = Result<T, Box<dyn Error>>;

/// The text trained on by default: the repository's own, embedded at build time.
const CORPUS: [(&str, &str); 13] = [
    ("README.md", include_str!("../../../README.md")),
    ("ARCHITECTURE.md", include_str!("../../../ARCHITECTURE.md")),
    ("amp/src/lib.rs", include_str!("../../../amp/src/lib.rs")),
    (
        "amp-checkpoint/src/lib.rs",
        include_str!("../../../amp-checkpoint/src/lib.rs"),
    ),
    (
        "amp-scaler/src/scaler.rs",
        include_str!("../../../amp-scaler/src/scaler.rs"),
    ),
    (
        "amp-autocast/src/region.rs",
        include_str!("../../../amp-autocast/src/region.rs"),
    ),
    (
        "amp-autograd/src/engine.rs",
        include_str!("../../../amp-autograd/src/engine.rs"),
    ),
    (
        "amp-autograd/src/dispatch.rs",
        include_str!("../../../amp-autograd/src/dispatch.rs"),
    ),
    (
        "amp-optim/src/adam.rs",
        include_str!("../../../amp-optim/src/adam.rs"),
    ),
    (
        "amp-optim/src/schedule.rs",
        include_str!("../../../amp-optim/src/schedule.rs"),
    ),
    (
        "amp-nn/src/layers.rs",
        include_str!("../../../amp-nn/src/layers.rs"),
    ),
    (
        "amp-nn/src/transformer.rs",
        include_str!("../../../amp-nn/src/transformer.rs"),
    ),
    (
        "amp-tensor/src/dtype.rs",
        include_str!("../../../amp-tensor/src/dtype.rs"),
    ),
];

/// Everything that decides the numbers of a run (what a checkpoint must agree with).
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    model: GptConfig,
    steps: usize,
    batch: usize,
    lr: f64,
    min_lr: f64,
    warmup: usize,
    weight_decay: f64,
    eval_every: usize,
    val_batches: usize,
    seed: u64,
}

impl Settings {
    /// The default run: sized to train both models within the time budget on two cores.
    fn default_for(vocab: usize) -> Settings {
        Settings {
            model: GptConfig {
                vocab,
                ..GptConfig::default()
            },
            steps: 400,
            batch: 16,
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: 30,
            weight_decay: 0.01,
            eval_every: 50,
            val_batches: 4,
            seed: 1,
        }
    }

    fn to_json(&self) -> serde_json::Value {
        let m = &self.model;
        json!({
            "model": {
                "vocab": m.vocab, "context": m.context, "d_model": m.d_model,
                "layers": m.layers, "heads": m.heads, "feedforward": m.feedforward,
                "dropout": m.dropout,
            },
            "steps": self.steps, "batch": self.batch, "lr": self.lr, "min_lr": self.min_lr,
            "warmup": self.warmup, "weight_decay": self.weight_decay,
            "eval_every": self.eval_every, "val_batches": self.val_batches, "seed": self.seed,
        })
    }
}

/// One of the two runs: float32, or autocast to `dtype` with a `GradScaler`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Precision {
    amp: bool,
    dtype: DType,
    /// Where the run trains (`--device`).
    device: Device,
}

impl Precision {
    const F32: Precision = Precision {
        amp: false,
        dtype: DType::F32,
        device: Device::Cpu,
    };
    fn autocast(dtype: DType) -> Precision {
        Precision {
            amp: true,
            dtype,
            device: Device::Cpu,
        }
    }
    /// The same run on `device`.
    fn on(self, device: Device) -> Precision {
        Precision { device, ..self }
    }
    /// The run's name (and its checkpoint folder's).
    fn label(self) -> String {
        if self.amp {
            self.dtype.to_string()
        } else {
            "float32".into()
        }
    }
    fn region(self) -> Autocast {
        Autocast::new(self.device.device_type())
            .dtype(if self.amp { self.dtype } else { DType::BF16 })
            .enabled(self.amp)
    }
}

// ----- data -----------------------------------------------------------------------------

/// The characters of the text as token ids, split into training and validation text.
struct Data {
    vocab: Vec<char>,
    train: Vec<i64>,
    val: Vec<i64>,
}

impl Data {
    /// The documents' characters; the last tenth of each document is validation text.
    fn new(docs: &[&str]) -> Data {
        let mut vocab: Vec<char> = docs.iter().flat_map(|d| d.chars()).collect();
        vocab.sort_unstable();
        vocab.dedup();
        let id = |c: char| vocab.binary_search(&c).expect("in the vocabulary") as i64;
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for d in docs {
            let ids: Vec<i64> = d.chars().map(id).collect();
            let cut = ids.len() * 9 / 10;
            train.extend_from_slice(&ids[..cut]);
            val.extend_from_slice(&ids[cut..]);
        }
        Data { vocab, train, val }
    }

    /// `[batch, t]` windows of `text` at `starts` and the same shifted by one (targets).
    fn windows(text: &[i64], starts: &[usize], t: usize) -> Res<(Tensor, Tensor)> {
        let x: Vec<i64> = starts
            .iter()
            .flat_map(|&s| text[s..s + t].iter().copied())
            .collect();
        let y: Vec<i64> = starts
            .iter()
            .flat_map(|&s| text[s + 1..s + t + 1].iter().copied())
            .collect();
        let dims = [starts.len(), t];
        Ok((Tensor::from_vec(x, dims)?, Tensor::from_vec(y, dims)?))
    }

    /// The training batch of `step`: random windows drawn from a generator seeded by
    /// the run's seed and the step alone, so a resumed run sees the same batches.
    fn batch(&self, s: &Settings, step: usize) -> Res<(Tensor, Tensor)> {
        let t = s.model.context;
        self.check(t)?;
        let mut g = Generator::new(s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (step as u64 + 1));
        let hi = (self.train.len() - t - 1) as i64;
        let starts: Vec<usize> = (0..s.batch).map(|_| g.int_range(0, hi) as usize).collect();
        Self::windows(&self.train, &starts, t)
    }

    /// An error unless both texts hold a window of `t` characters and its target.
    fn check(&self, t: usize) -> Res<()> {
        if self.train.len() < t + 2 || self.val.len() < t + 2 {
            return Err(format!(
                "the text is too short: {} training and {} validation characters, a context of {t} needs {} of each",
                self.train.len(),
                self.val.len(),
                t + 2
            )
            .into());
        }
        Ok(())
    }

    /// The validation batches: windows evenly spread over the validation text.
    fn val_batches(&self, s: &Settings) -> Res<Vec<(Tensor, Tensor)>> {
        let t = s.model.context;
        self.check(t)?;
        let n = s.val_batches * s.batch;
        let span = self.val.len().saturating_sub(t + 1);
        let starts: Vec<usize> = (0..n).map(|i| i * span / n.max(1)).collect();
        starts
            .chunks(s.batch)
            .map(|c| Self::windows(&self.val, c, t))
            .collect()
    }

    fn decode(&self, ids: &[i64]) -> String {
        ids.iter().map(|&i| self.vocab[i as usize]).collect()
    }
}

// ----- training -------------------------------------------------------------------------

/// What a run records, step by step; saved in its checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct History {
    /// Training loss of each step.
    loss: Vec<f64>,
    /// The loss scale after each step (1 without a scaler).
    scale: Vec<f64>,
    /// Skipped steps so far, after each step.
    skipped: Vec<u64>,
    /// Milliseconds of each training step.
    step_ms: Vec<f64>,
    /// `(step, seconds since the run began, validation loss)` of each evaluation.
    evals: Vec<(usize, f64, f64)>,
    /// Seconds the run has taken so far (training, evaluation and checkpoints).
    seconds: f64,
}

impl History {
    fn final_val_loss(&self) -> f64 {
        self.evals.last().map_or(f64::NAN, |e| e.2)
    }
    fn skipped_steps(&self) -> u64 {
        self.skipped.last().copied().unwrap_or(0)
    }
    /// The same record without the timings (which differ from run to run).
    #[cfg(test)]
    fn untimed(&self) -> History {
        History {
            step_ms: Vec::new(),
            evals: self.evals.iter().map(|&(s, _, l)| (s, 0.0, l)).collect(),
            seconds: 0.0,
            ..self.clone()
        }
    }
}

/// Where a run keeps and finds its checkpoints, and where it stops.
#[derive(Debug, Clone, Default)]
struct RunIo {
    /// Save every `every` steps (and after the last) into `out/checkpoints/<run>`.
    every: usize,
    out: PathBuf,
    /// Continue from `resume/checkpoints/<run>` when it holds a checkpoint.
    resume: Option<PathBuf>,
    /// Stop after this many steps (an interruption).
    stop_after: Option<usize>,
    /// Draw the progress bar.
    progress: bool,
    /// This process's place in a data-parallel job (`--ddp`).
    ranks: std::rc::Rc<Ranks>,
}

fn checkpoint_dir(root: &Path, p: Precision) -> PathBuf {
    root.join("checkpoints").join(p.label())
}

/// A trained (or partly trained) run.
struct Run {
    model: Replica,
    opt: Adam,
    scaler: GradScaler,
    history: History,
    /// Steps done.
    step: usize,
    /// This rank's gradient communication over the run's steps (`--ddp`).
    comm: CommTotals,
}

fn fresh_run(s: &Settings, p: Precision, ranks: &Ranks) -> Res<Run> {
    let gpt = Gpt::new(s.model, &mut Generator::new(s.seed))?;
    gpt.to_device(p.device)?;
    let model = ranks.replica(gpt)?;
    let opt = Adam::new(
        model.parameters(),
        s.lr,
        AdamOptions {
            weight_decay: s.weight_decay,
            decoupled: true,
            ..Default::default()
        },
    )?;
    let scaler = GradScaler::with_options(GradScalerOptions::default().enabled(p.amp))?;
    Ok(Run {
        model,
        opt,
        scaler,
        history: History::default(),
        step: 0,
        comm: CommTotals::default(),
    })
}

/// What identifies a run: a checkpoint of another run, other settings or another text
/// is refused.
fn identity(s: &Settings, data: &Data, p: Precision) -> serde_json::Value {
    json!({
        "run": p.label(),
        "settings": s.to_json(),
        "vocab": data.vocab.iter().collect::<String>(),
    })
}

/// The loop's state kept in a checkpoint's manifest: the run's identity, the steps
/// done and the history.
fn meta(s: &Settings, data: &Data, p: Precision, run: &Run) -> Res<serde_json::Value> {
    let mut m = identity(s, data, p);
    m["step"] = run.step.into();
    m["history"] = serde_json::to_value(&run.history)?;
    Ok(m)
}

/// Restore `run` from the checkpoint in `dir`, refusing one of other settings.
fn resume(dir: &Path, s: &Settings, data: &Data, p: Precision, run: &mut Run) -> Res<()> {
    let meta = amp::checkpoint::load_with_meta(dir, &*run.model, &mut run.opt, &mut run.scaler)?
        .ok_or_else(|| format!("{}: the checkpoint has no training state", dir.display()))?;
    let want = identity(s, data, p);
    for key in ["run", "settings", "vocab"] {
        if meta[key] != want[key] {
            return Err(format!(
                "{}: the checkpoint's {key} is {}, this run's is {}",
                dir.display(),
                meta[key],
                want[key]
            )
            .into());
        }
    }
    run.step = serde_json::from_value(meta["step"].clone())?;
    run.history = serde_json::from_value(meta["history"].clone())?;
    if run.step > s.steps || run.history.loss.len() != run.step {
        return Err(format!("{}: an inconsistent training state", dir.display()).into());
    }
    Ok(())
}

/// Mean validation loss (evaluation mode, no gradients, in the run's precision).
fn evaluate(model: &mut Gpt, val: &[(Tensor, Tensor)], p: Precision) -> Res<f64> {
    model.eval();
    let region = p.region();
    let mut sum = 0.0;
    for (x, y) in val {
        let loss = no_grad(|| region.try_run(|| model.loss(x, y)))?;
        sum += loss.item_f64()?;
    }
    model.train(true);
    Ok(sum / val.len() as f64)
}

/// Train (or continue) one run to `s.steps` (or `io.stop_after`).
fn train(s: &Settings, data: &Data, p: Precision, io: &RunIo) -> Res<Run> {
    let mut run = fresh_run(s, p, &io.ranks)?;
    if let Some(root) = &io.resume {
        let dir = checkpoint_dir(root, p);
        if dir.join(amp::checkpoint::MANIFEST).exists() {
            resume(&dir, s, data, p, &mut run)?;
        }
    }
    let schedule = WarmupCosine::new(s.lr, s.warmup, s.steps, s.min_lr, 0.1)?;
    let on_device = |(x, y): (Tensor, Tensor)| -> Res<(Tensor, Tensor)> {
        Ok((x.to_device(p.device)?, y.to_device(p.device)?))
    };
    let val = data
        .val_batches(s)?
        .into_iter()
        .map(on_device)
        .collect::<Res<Vec<_>>>()?;
    let region = p.region();
    let end = io.stop_after.map_or(s.steps, |n| n.min(s.steps));
    let bar = if io.progress && io.ranks.is_root() {
        ProgressBar::new(s.steps as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:30}] {pos}/{len} {msg}")?
            .progress_chars("=> "),
    );
    bar.set_prefix(p.label());
    bar.set_position(run.step as u64);
    let tokens_per_step = (s.batch * s.model.context) as f64;
    // Seconds of the run so far: those of the checkpoint resumed from, then this process's.
    let (offset, began) = (run.history.seconds, Instant::now());
    let clock = move || offset + began.elapsed().as_secs_f64();
    while run.step < end {
        let step = run.step;
        let (x, y) = on_device(io.ranks.shard(data.batch(s, step)?)?)?;
        let t = Instant::now();
        schedule.apply(&mut run.opt, step);
        run.opt.zero_grad();
        let loss = region.try_run(|| run.model.train_loss(&x, &y))?;
        run.scaler.scale(&loss)?.backward()?;
        run.comm.add(&run.model);
        let outcome = run.scaler.step(&mut run.opt)?;
        run.scaler.update()?;
        let l = io.ranks.mean(loss.item_f64()?)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let h = &mut run.history;
        let skipped = h.skipped_steps() + u64::from(outcome.is_skipped());
        h.loss.push(l);
        h.scale
            .push(if p.amp { run.scaler.get_scale() } else { 1.0 });
        h.skipped.push(skipped);
        h.step_ms.push(ms);
        run.step += 1;
        if run.step % s.eval_every == 0 || run.step == s.steps {
            let v = evaluate(&mut run.model, &val, p)?;
            let h = &mut run.history;
            h.evals.push((run.step, clock(), v));
        }
        let h = &run.history;
        bar.set_message(format!(
            "loss {l:.3} | {:.1}k tok/s | scale {} | skipped {skipped}{}",
            tokens_per_step / median(&h.step_ms),
            if p.amp {
                format!("{:.0}", run.scaler.get_scale())
            } else {
                "-".into()
            },
            h.evals
                .last()
                .map_or(String::new(), |e| format!(" | val {:.3}", e.2)),
        ));
        bar.set_position(run.step as u64);
        run.history.seconds = clock();
        let saves = io.every > 0 && (run.step % io.every == 0 || run.step == s.steps);
        if saves && io.ranks.is_root() {
            let dir = checkpoint_dir(&io.out, p);
            amp::checkpoint::save_with_meta(
                &dir,
                &*run.model,
                &run.opt,
                &run.scaler,
                &meta(s, data, p, &run)?,
            )?;
        }
        if saves {
            // Rank 0 alone writes; nobody reads the checkpoint before it is complete.
            io.ranks.barrier()?;
        }
    }
    bar.finish();
    Ok(run)
}

/// `n` characters from `model` after `prompt` (temperature 0.8, seeded).
fn sample(
    run: &mut Run,
    data: &Data,
    p: Precision,
    prompt: &str,
    n: usize,
    seed: u64,
) -> Res<String> {
    let ids: Vec<i64> = prompt
        .chars()
        .filter_map(|c| data.vocab.binary_search(&c).ok().map(|i| i as i64))
        .collect();
    let mut ids = if ids.is_empty() { vec![0] } else { ids };
    let start = ids.len();
    let mut g = Generator::new(seed);
    let ctx = run.model.config.context;
    let region = p.region();
    run.model.eval();
    for _ in 0..n {
        let window = &ids[ids.len().saturating_sub(ctx)..];
        let x = Tensor::from_vec(window.to_vec(), [1, window.len()])?.to_device(p.device)?;
        let logits = no_grad(|| region.try_run(|| run.model.logits(&x)))?;
        let last = logits.select(1, window.len() as i64 - 1)?.to_vec_f64();
        let m = last.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = last.iter().map(|l| ((l - m) / 0.8).exp()).collect();
        let mut u = g.uniform() * w.iter().sum::<f64>();
        let mut next = w.len() - 1;
        for (i, wi) in w.iter().enumerate() {
            if u < *wi {
                next = i;
                break;
            }
            u -= wi;
        }
        ids.push(next as i64);
    }
    run.model.train(true);
    Ok(data.decode(&ids[start..]))
}

/// The median, leaving out the first steps (warm-up of caches and allocator) when
/// there are enough.
fn median(v: &[f64]) -> f64 {
    let skip = if v.len() > 10 { 3 } else { 0 };
    let mut s: Vec<f64> = v[skip..].to_vec();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

// ----- command line ---------------------------------------------------------------------

struct Args {
    dtype: DType,
    text: Option<PathBuf>,
    steps: Option<usize>,
    batch: Option<usize>,
    lr: Option<f64>,
    seed: Option<u64>,
    out: PathBuf,
    checkpoint_every: usize,
    stop_after: Option<usize>,
    resume: Option<PathBuf>,
    ddp: bool,
    device: Device,
    /// `--dtype` was given (else the device's default: bfloat16 on the CPU, float16 on
    /// CUDA, as PyTorch's autocast).
    dtype_given: bool,
}

const USAGE: &str =
    "usage: train [--dtype bfloat16|float16] [--text FILE] [--steps N] [--batch N] [--lr X]
             [--seed N] [--out DIR] [--checkpoint-every N] [--stop-after N] [--resume DIR]
             [--ddp] [--device cpu|cuda|cuda:N]
  --dtype             the autocast dtype of the mixed-precision run (default bfloat16 on
                      the CPU, float16 on CUDA)
  --device            where both runs train (default cpu; cuda needs a build with
                      --features cuda and a GPU)
  --text              train on this UTF-8 file instead of the repository's own text
  --steps, --batch    training steps (default 400) and sequences per batch (default 16)
  --lr                the peak learning rate (default 0.003; the schedule ends at a tenth)
  --seed              model, data order and sampling seed (default 1)
  --out               where the picture and checkpoints go (default target/train)
  --checkpoint-every  save model, optimizer and scaler every N steps (and after the last)
                      into OUT/checkpoints/<run> (default 0: no checkpoints)
  --stop-after        end each run after step N, as an interruption would
  --resume            continue each run from DIR/checkpoints/<run> where there is one
  --ddp               data-parallel over the ranks of an MPI job (build with --features mpi;
                      mpirun -np 2 -x RAYON_NUM_THREADS=1 target/release/examples/train --ddp):
                      each rank trains on its share of every batch, gradients averaged";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        dtype: DType::BF16,
        text: None,
        steps: None,
        batch: None,
        lr: None,
        seed: None,
        out: PathBuf::from("target/train"),
        checkpoint_every: 0,
        stop_after: None,
        resume: None,
        ddp: false,
        device: Device::Cpu,
        dtype_given: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let num = |name: &str, v: String| v.parse::<usize>().map_err(|e| format!("{name}: {e}"));
        match arg.as_str() {
            "--dtype" => {
                a.dtype = val("--dtype")?
                    .parse()
                    .map_err(|e: amp::tensor::Error| e.to_string())?;
                a.dtype_given = true;
            }
            "--text" => a.text = Some(PathBuf::from(val("--text")?)),
            "--steps" => a.steps = Some(num("--steps", val("--steps")?)?),
            "--batch" => a.batch = Some(num("--batch", val("--batch")?)?),
            "--lr" => {
                let v = val("--lr")?;
                a.lr = Some(v.parse().map_err(|e| format!("--lr: {e}"))?)
            }
            "--seed" => a.seed = Some(num("--seed", val("--seed")?)? as u64),
            "--out" => a.out = PathBuf::from(val("--out")?),
            "--checkpoint-every" => {
                a.checkpoint_every = num("--checkpoint-every", val("--checkpoint-every")?)?
            }
            "--stop-after" => a.stop_after = Some(num("--stop-after", val("--stop-after")?)?),
            "--resume" => a.resume = Some(PathBuf::from(val("--resume")?)),
            "--ddp" => a.ddp = true,
            "--device" => {
                a.device = val("--device")?
                    .parse()
                    .map_err(|e: amp::tensor::Error| e.to_string())?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    if !a.dtype_given && !a.device.is_cpu() {
        a.dtype = DType::F16;
    }
    if !matches!(a.dtype, DType::BF16 | DType::F16) {
        return Err(format!(
            "--dtype: autocast runs in bfloat16 or float16, not {}",
            a.dtype
        ));
    }
    if a.steps == Some(0) || a.batch == Some(0) {
        return Err("--steps and --batch must be at least 1".into());
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // Errors are reported with their message (not `Debug`), as a command-line tool should.
    if let Err(e) = train_both(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn train_both(args: &Args) -> Res<()> {
    let began = Instant::now();
    let ranks = std::rc::Rc::new(if args.ddp {
        Ranks::mpi()?
    } else {
        Ranks::default()
    });
    let root = ranks.is_root();
    let user_text = match &args.text {
        Some(path) => {
            Some(std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    let (data, source) = match &user_text {
        Some(t) => (
            Data::new(&[t]),
            args.text.as_ref().map(|p| p.display().to_string()),
        ),
        None => (Data::new(&CORPUS.map(|(_, text)| text)), None),
    };
    let mut s = Settings::default_for(data.vocab.len());
    s.steps = args.steps.unwrap_or(s.steps);
    s.batch = args.batch.unwrap_or(s.batch);
    s.seed = args.seed.unwrap_or(s.seed);
    if let Some(lr) = args.lr {
        (s.lr, s.min_lr) = (lr, lr / 10.0);
    }
    s.warmup = s.warmup.min(s.steps);
    let m = &s.model;
    let probe = Gpt::new(s.model, &mut Generator::new(0))?;
    let (_, size) = ranks.rank_size();
    if root && size > 1 {
        println!(
            "data parallel: {size} ranks, {} sequences per rank and step",
            s.batch / size
        );
    }
    if root {
        println!(
        "GPT: {} layers, d_model {}, {} heads, feed-forward {}, context {}, vocabulary {} ({} parameters)",
        m.layers, m.d_model, m.heads, m.feedforward, m.context, m.vocab, probe.num_parameters()
        );
    }
    drop(probe);
    if root {
        println!(
        "text: {} ({} training / {} validation characters); {} steps of {} x {} tokens, AdamW lr {} (warm-up {}, cosine to {})",
        source.unwrap_or_else(|| CORPUS.map(|(name, _)| name).join(", ")),
        data.train.len(),
        data.val.len(),
        s.steps,
        s.batch,
        m.context,
        s.lr,
        s.warmup,
        s.min_lr
        );
    }
    let io = RunIo {
        every: args.checkpoint_every,
        out: args.out.clone(),
        resume: args.resume.clone(),
        stop_after: args.stop_after,
        progress: true,
        ranks: ranks.clone(),
    };
    if !args.device.is_cpu() {
        // Fails here, with what is missing, on a machine or build without the device.
        amp::tensor::cuda::ensure_device(args.device, &[amp::tensor::cuda::Library::Driver])?;
        if root {
            println!("device: {}", args.device);
        }
    }
    let runs = [Precision::F32, Precision::autocast(args.dtype)].map(|p| p.on(args.device));
    let mut done = Vec::new();
    for p in runs {
        let run = train(&s, &data, p, &io)?;
        done.push((p, run));
    }
    if !root {
        return Ok(());
    }
    if done.iter().any(|(_, r)| r.step < s.steps) {
        println!(
            "stopped after step {} (--stop-after); continue with --resume {}",
            done[0].1.step,
            args.out.display()
        );
        return Ok(());
    }

    println!();
    println!(
        "{:<30} {:>9} {:>10} {:>10} {:>12} {:>8}",
        "run", "ms/step", "tokens/s", "val loss", "final scale", "skipped"
    );
    let tokens = (s.batch * s.model.context) as f64;
    for (p, run) in &done {
        let h = &run.history;
        let name = if p.amp {
            format!("autocast {} + GradScaler", p.dtype)
        } else {
            "float32".into()
        };
        println!(
            "{:<30} {:>9.1} {:>9.1}k {:>10.4} {:>12} {:>8}",
            name,
            median(&h.step_ms),
            tokens / median(&h.step_ms),
            h.final_val_loss(),
            if p.amp {
                format!("{:.0}", run.scaler.get_scale())
            } else {
                "-".into()
            },
            h.skipped_steps()
        );
    }
    for (p, run) in &done {
        if let Some(line) = run.comm.summary() {
            println!("{} on {ranks:?}: {line}", p.label());
        }
    }
    let (f, a) = (&done[0].1.history, &done[1].1.history);
    println!(
        "AMP speed-up over float32: {:.2}x (median ms/step); validation loss AMP / float32: {:.4} ({:+.2}%)",
        median(&f.step_ms) / median(&a.step_ms),
        a.final_val_loss() / f.final_val_loss(),
        (a.final_val_loss() / f.final_val_loss() - 1.0) * 100.0
    );
    let prompt = "The ";
    println!(
        "\nsamples (temperature 0.8, seed {}, prompt {prompt:?}):",
        s.seed
    );
    for (p, run) in &mut done {
        let text = sample(run, &data, *p, prompt, 240, s.seed)?;
        println!("--- {} ---\n{prompt}{text}", p.label());
    }
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("training.svg");
    plot(&path, &done)?;
    println!(
        "\nwrote {} ({:.1} s in all)",
        path.display(),
        began.elapsed().as_secs_f64()
    );
    Ok(())
}

// ----- picture --------------------------------------------------------------------------

/// Validation loss against step and against seconds, the loss scale and skipped steps,
/// and the step time: four panels, both runs.
fn plot(path: &Path, runs: &[(Precision, Run)]) -> Res<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let colour = |p: &Precision| if p.amp { RED } else { BLUE };
    let name = |p: &Precision| {
        if p.amp {
            format!("autocast {} + GradScaler", p.dtype)
        } else {
            "float32".into()
        }
    };
    let steps = runs
        .iter()
        .map(|(_, r)| r.history.loss.len())
        .max()
        .unwrap_or(1);
    let all = |f: &dyn Fn(&History) -> Vec<f64>| -> (f64, f64) {
        runs.iter()
            .flat_map(|(_, r)| f(&r.history))
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (lo, hi) = all(&|h| h.evals.iter().map(|e| e.2).collect());
    let (lo, hi) = (lo * 0.95, hi * 1.05);

    // 1. validation loss vs step
    let mut c = ChartBuilder::on(&panels[0])
        .caption("validation loss vs step", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..steps, lo..hi)?;
    c.configure_mesh().x_desc("step").y_desc("loss").draw()?;
    for (p, r) in runs {
        let col = colour(p);
        c.draw_series(LineSeries::new(
            r.history.evals.iter().map(|e| (e.0, e.2)),
            col.stroke_width(2),
        ))?
        .label(name(p))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;

    // 2. validation loss vs wall-clock seconds
    let secs = runs
        .iter()
        .flat_map(|(_, r)| r.history.evals.last().map(|e| e.1))
        .fold(1e-3, f64::max);
    let mut c = ChartBuilder::on(&panels[1])
        .caption("validation loss vs wall-clock seconds", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..secs * 1.02, lo..hi)?;
    c.configure_mesh().x_desc("seconds").y_desc("loss").draw()?;
    for (p, r) in runs {
        c.draw_series(LineSeries::new(
            r.history.evals.iter().map(|e| (e.1, e.2)),
            colour(p).stroke_width(2),
        ))?;
    }

    // 3. loss scale (log2) and skipped steps of the mixed-precision run
    if let Some((p, r)) = runs.iter().find(|(p, _)| p.amp) {
        let h = &r.history;
        let top = h
            .scale
            .iter()
            .map(|s| s.log2())
            .chain(std::iter::once(h.skipped_steps() as f64))
            .fold(1.0, f64::max);
        let mut c = ChartBuilder::on(&panels[2])
            .caption(
                format!(
                    "{}: log2 loss scale (red), skipped steps (black)",
                    p.label()
                ),
                ("sans-serif", 20),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0..steps, 0.0..top * 1.1)?;
        c.configure_mesh().x_desc("step").draw()?;
        c.draw_series(LineSeries::new(
            h.scale.iter().enumerate().map(|(i, s)| (i, s.log2())),
            RED.stroke_width(2),
        ))?;
        c.draw_series(LineSeries::new(
            h.skipped.iter().enumerate().map(|(i, &s)| (i, s as f64)),
            BLACK.stroke_width(2),
        ))?;
    }

    // 4. step time
    let (_, ms_hi) = all(&|h| h.step_ms.clone());
    let mut c = ChartBuilder::on(&panels[3])
        .caption("step time (ms)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..steps, 0.0..ms_hi.max(1.0) * 1.05)?;
    c.configure_mesh().x_desc("step").y_desc("ms").draw()?;
    for (p, r) in runs {
        c.draw_series(LineSeries::new(
            r.history.step_ms.iter().enumerate().map(|(i, &m)| (i, m)),
            colour(p),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run of the real loop: small model, few steps.
    fn tiny() -> (Settings, Data) {
        let data = Data::new(&CORPUS.map(|(_, text)| text));
        let s = Settings {
            model: GptConfig {
                vocab: data.vocab.len(),
                context: 16,
                d_model: 16,
                layers: 2,
                heads: 2,
                feedforward: 32,
                dropout: 0.0,
            },
            steps: 8,
            batch: 4,
            lr: 1e-2,
            min_lr: 1e-3,
            warmup: 2,
            weight_decay: 0.01,
            eval_every: 3,
            val_batches: 1,
            seed: 5,
        };
        (s, data)
    }

    /// Every parameter as bits.
    fn bits(run: &Run) -> Vec<(String, Vec<u32>)> {
        run.model
            .named_state()
            .into_iter()
            .map(|(n, t)| {
                let v = t.to_vec::<f32>().unwrap();
                (n, v.iter().map(|x| x.to_bits()).collect())
            })
            .collect()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("amp-train-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    /// N steps straight and N/2 steps + checkpoint + resume + N/2 steps give the same
    /// parameters, optimizer state, scaler state and history, bit for bit, for both
    /// runs of the main job and for float16 (whose scaler backs off and skips).
    #[test]
    fn a_resumed_run_continues_bit_for_bit() {
        let (s, data) = tiny();
        for p in [
            Precision::F32,
            Precision::autocast(DType::BF16),
            Precision::autocast(DType::F16),
        ] {
            let what = p.label();
            let straight = train(&s, &data, p, &RunIo::default()).unwrap();
            assert_eq!(straight.step, s.steps);

            let first_dir = scratch(&format!("first-{what}"));
            let half = s.steps / 2;
            let first = RunIo {
                every: half,
                out: first_dir.clone(),
                stop_after: Some(half),
                ..RunIo::default()
            };
            let stopped = train(&s, &data, p, &first).unwrap();
            assert_eq!(stopped.step, half, "{what}");
            assert_ne!(
                bits(&stopped),
                bits(&straight),
                "{what}: half way is not the end"
            );
            let second_dir = scratch(&format!("second-{what}"));
            let second = RunIo {
                every: half,
                out: second_dir.clone(),
                resume: Some(first_dir.clone()),
                ..RunIo::default()
            };
            let resumed = train(&s, &data, p, &second).unwrap();
            assert_eq!(resumed.step, s.steps, "{what}");
            assert_eq!(bits(&resumed), bits(&straight), "{what}: parameters");
            assert_eq!(
                serde_json::to_string(&resumed.opt.state_dict()).unwrap(),
                serde_json::to_string(&straight.opt.state_dict()).unwrap(),
                "{what}: optimizer state"
            );
            assert_eq!(
                resumed.scaler.state_dict_json(),
                straight.scaler.state_dict_json(),
                "{what}: scaler state"
            );
            assert_eq!(
                resumed.history.untimed(),
                straight.history.untimed(),
                "{what}: history"
            );
            if p.dtype == DType::F16 {
                assert!(
                    straight.history.skipped_steps() > 0,
                    "float16 from a scale of 65536 overflows at least once"
                );
            }
            // The final checkpoint of the resumed run holds the end state too.
            let mut again = fresh_run(&s, p, &Ranks::default()).unwrap();
            resume(&checkpoint_dir(&second_dir, p), &s, &data, p, &mut again).unwrap();
            assert_eq!(again.step, s.steps);
            assert_eq!(bits(&again), bits(&straight), "{what}: the last checkpoint");

            // A checkpoint of other settings is refused, naming what differs.
            let other = Settings {
                lr: 2e-2,
                ..s.clone()
            };
            let mut wrong = fresh_run(&other, p, &Ranks::default()).unwrap();
            let err = resume(&checkpoint_dir(&first_dir, p), &other, &data, p, &mut wrong)
                .unwrap_err()
                .to_string();
            assert!(err.contains("settings"), "{err}");
            std::fs::remove_dir_all(&first_dir).ok();
            std::fs::remove_dir_all(&second_dir).ok();
        }
    }

    #[test]
    fn data_windows_are_shifted_by_one_and_deterministic() {
        let (s, data) = tiny();
        let (x, y) = data.batch(&s, 3).unwrap();
        assert_eq!(x.dims(), &[4, 16]);
        let (x2, _) = data.batch(&s, 3).unwrap();
        assert_eq!(x.to_vec::<i64>().unwrap(), x2.to_vec::<i64>().unwrap());
        let (x4, _) = data.batch(&s, 4).unwrap();
        assert_ne!(x.to_vec::<i64>().unwrap(), x4.to_vec::<i64>().unwrap());
        let (xv, yv) = (x.to_vec::<i64>().unwrap(), y.to_vec::<i64>().unwrap());
        for r in 0..4 {
            assert_eq!(xv[r * 16 + 1..(r + 1) * 16], yv[r * 16..(r + 1) * 16 - 1]);
        }
        let text = data.decode(&xv[..16]);
        assert_eq!(text.chars().count(), 16);
        assert_eq!(data.val_batches(&s).unwrap().len(), 1);
        // A text without a whole window is an error, not a panic.
        let short = Data::new(&["far too short for a context of 16"]);
        assert!(short.val_batches(&s).is_err() && short.batch(&s, 0).is_err());
        assert!(train(&s, &short, Precision::F32, &RunIo::default()).is_err());
    }
    /// The final validation losses of both runs of `tiny()`, trained as `ranks` says.
    #[cfg(feature = "mpi")]
    fn tiny_losses(ranks: &std::rc::Rc<Ranks>) -> [f64; 2] {
        let (s, data) = tiny();
        let io = RunIo {
            ranks: ranks.clone(),
            ..RunIo::default()
        };
        [Precision::F32, Precision::autocast(DType::BF16)]
            .map(|p| train(&s, &data, p, &io).unwrap().history.final_val_loss())
    }

    /// One rank of the job that `two_ranks_reach_the_validation_loss_of_one_process`
    /// starts under `mpirun` (rank 0 prints the losses).
    #[cfg(feature = "mpi")]
    #[test]
    #[ignore = "a rank of the mpirun job of two_ranks_reach_the_validation_loss_of_one_process"]
    fn rank_of_a_two_process_job() {
        use std::hash::{Hash, Hasher};
        let ranks = std::rc::Rc::new(Ranks::mpi().unwrap());
        let (rank, _) = ranks.rank_size();
        let [f32_loss, bf16_loss] = tiny_losses(&ranks);
        if rank == 0 {
            println!("val losses {f32_loss:e} {bf16_loss:e}");
        }
        // Half way, rank 0 writes a checkpoint; both ranks resume from it to the end.
        let (s, data) = tiny();
        let p = Precision::autocast(DType::BF16);
        let job = std::os::unix::process::parent_id(); // mpirun, the same for both ranks
        let dir = std::env::temp_dir().join(format!("amp-train-ddp-{job}"));
        let io = |every, stop_after, resume| RunIo {
            every,
            out: dir.clone(),
            stop_after,
            resume,
            ranks: ranks.clone(),
            ..RunIo::default()
        };
        let straight = train(&s, &data, p, &io(0, None, None)).unwrap();
        train(&s, &data, p, &io(s.steps / 2, Some(s.steps / 2), None)).unwrap();
        let resumed = train(&s, &data, p, &io(0, None, Some(dir.clone()))).unwrap();
        ranks.barrier().unwrap();
        if rank == 0 {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bits(&resumed).hash(&mut h);
        let same = bits(&resumed) == bits(&straight);
        println!("rank {rank} resumed: {same} {:016x}", h.finish());
    }

    /// The main job on 2 processes, each on half of every batch, ends at the validation
    /// loss of 1 process on the whole batch: float32 to rounding, bfloat16 autocast within
    /// its tolerance; a checkpoint rank 0 wrote half way, resumed on both ranks, gives
    /// both the parameters of the uninterrupted 2-rank run, bit for bit. Skipped (printed)
    /// where `mpirun` is missing.
    #[cfg(feature = "mpi")]
    #[test]
    fn two_ranks_reach_the_validation_loss_of_one_process() {
        use std::process::Command;
        if Command::new("mpirun").arg("--version").output().is_err() {
            println!("skipped: mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev)");
            return;
        }
        let one = tiny_losses(&std::rc::Rc::new(Ranks::default()));
        let mut out = Command::new("mpirun")
            .args(["-np", "2", "--oversubscribe", "--allow-run-as-root"])
            .args(["-x", "RAYON_NUM_THREADS=1"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "tests::rank_of_a_two_process_job",
                "--nocapture",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("mpirun starts");
        // A job that hangs (a rank waiting for a peer that went another way) fails the
        // test instead of holding CI up.
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        while out.try_wait().expect("mpirun can be waited for").is_none() {
            if Instant::now() > deadline {
                let _ = out.kill();
                panic!("the 2-rank job did not finish within 300 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = out.wait_with_output().expect("mpirun's output");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "mpirun failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .find_map(|l| l.split_once("val losses ").map(|x| x.1))
            .unwrap_or_else(|| panic!("rank 0 printed no losses:\n{text}"));
        let two: Vec<f64> = line.split(' ').map(|v| v.parse().unwrap()).collect();
        // A checkpoint written by rank 0 alone, loaded on both: the same state everywhere,
        // and the state of the run that was not interrupted.
        let resumed: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(" resumed: ").map(|x| x.1))
            .collect();
        assert_eq!(
            resumed.len(),
            2,
            "both ranks report their resumed state:\n{text}"
        );
        assert!(
            resumed.iter().all(|r| r.starts_with("true ")),
            "{resumed:?}"
        );
        assert_eq!(resumed[0], resumed[1], "the ranks' parameters differ");
        for (k, (tol, what)) in [(1e-5, "float32"), (1e-2, "bfloat16 autocast")]
            .iter()
            .enumerate()
        {
            let rel = (two[k] - one[k]).abs() / one[k];
            assert!(
                rel <= *tol,
                "{what}: 2 ranks {} vs 1 process {} ({rel:e})",
                two[k],
                one[k]
            );
        }
    }
}
