//! `cargo xtask bench --sweep`: every op a training step runs, at every size from 8 to
//! 2048, in float32, bfloat16, float16 and float32 under bfloat16 autocast, timed as
//! `xtask/torch/torch_sweep.py` times PyTorch (same keys, same workloads), so that the
//! two JSON objects compare entry by entry.
//!
//! An entry is `op/mode/n`. Its timing: two calls to warm up and size the rounds, one
//! untimed round, then [`ROUNDS`] rounds of `reps` calls (a round lasts about
//! [`ROUND_S`]); the figure is the median round's time per call, the spread the slowest
//! round over the fastest minus one. An entry whose first call takes over [`SLOW_S`] is
//! that one call (PyTorch's float16 products on a CPU without float16 arithmetic: 43 s
//! for one 2048³ `mm`).
//!
//! PyTorch's figures come either from a `torch-baseline --sweep` JSON (`--compare`), or,
//! with `--with-torch`, from `torch-baseline --sweep --serve` run beside this process and
//! asked for each entry in turn: PyTorch, ours, ours, PyTorch (with a pause of
//! [`SETTLE`] at each change of side), each side's figure the median of its pooled
//! rounds, so that both sides of a ratio are measured within a second or so of each
//! other (on a shared host, two runs minutes apart differ by up to 2× on memory-bound
//! entries). An entry whose first call is over [`SLOW_S`] is measured once per side.
//! An entry whose spread (ours, or PyTorch's measured beside it) is over [`SPREAD_OK`]
//! is measured again, up to [`ATTEMPTS`] times in all, and the steadiest measurement is
//! kept (both sides of it, so a ratio's two sides always come from one measurement).
//!
//! The run writes `<out>/<machine>.json` (ours, and PyTorch's when compared) and `<out>/<machine>.svg` (ours / PyTorch per size, one panel per op), where
//! `<machine>` is the CPU flags the kernels choose by; `xtask/sweeps/` keeps one per
//! machine kind in the repository.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::Instant;

use amp::prelude::*;
use serde_json::{json, Map, Value};

/// The sizes of the sweep (`n` of an `n×n` operand, or the sequence length of `bmm`).
pub const SIZES: [usize; 12] = [8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048];
/// Timed rounds per entry.
pub const ROUNDS: usize = 5;
/// The length a round aims at, in seconds.
pub const ROUND_S: f64 = 0.025;
/// A first call longer than this is the whole measurement.
pub const SLOW_S: f64 = 1.0;
/// `bmm` is shaped like attention scores: `[BH, T, HEAD] × [BH, HEAD, T]` with `T = n`.
const BH: usize = 32;
const HEAD: usize = 64;
/// The pause between PyTorch's side of an entry and ours, both ways, so that neither
/// side's idle workers are still awake when the other is timed. PyTorch's OpenMP
/// workers (libgomp, `OMP_WAIT_POLICY` unset) spin for 300,000 pause instructions after
/// each parallel region (milliseconds), where ours linger 200 µs. On a 2-core EPYC our
/// float32 `add` of 384² varied 57–121% between its rounds beside PyTorch without the
/// pause, 15–24% with it, and 6–25% alone (three runs each).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(50);
/// The spread (max/min − 1 over the rounds) an entry is trusted within.
const SPREAD_OK: f64 = 0.20;
/// Measurements of an entry at most: one whose spread (ours, or PyTorch's beside it) is
/// over [`SPREAD_OK`] is measured again, both sides, and the measurement with the
/// smaller worst spread is kept; the JSON records how many were made (`attempts`), and
/// the summary counts the entries measured more than once. On a shared 2-core host a
/// neighbour's burst of a few milliseconds spoils a round, and a full sweep beside
/// PyTorch had 176 of 324 entries over 20% in one measurement each (Zen 5, 2026-12-02);
/// with three measurements at most, the float32 entries kept 45 and then 20 of 96 over
/// 20% in two runs an hour apart (the host's noise comes and goes; alone, without
/// PyTorch's side, 2 to 6 of 324).
const ATTEMPTS: usize = 5;

/// Options of `bench --sweep`.
pub struct SweepOptions {
    /// Keep the entries whose key contains this.
    pub filter: Option<String>,
    /// A `torch-baseline --sweep` JSON to compare with.
    pub compare: Option<String>,
    /// Measure PyTorch beside us, entry by entry (`torch-baseline --sweep --serve`).
    pub with_torch: bool,
    /// Print the JSON object instead of the table.
    pub json: bool,
    /// Where the JSON and the picture go.
    pub out: PathBuf,
}

/// One timed entry.
#[derive(Clone, Debug)]
struct Timing {
    s: f64,
    min_s: f64,
    max_s: f64,
    reps: usize,
    rounds: usize,
    /// The time per call of each round, ascending (empty when read from a file that
    /// did not keep them).
    times: Vec<f64>,
}

impl Timing {
    /// The timing of the given rounds (at least one).
    fn of_rounds(mut times: Vec<f64>, reps: usize) -> Timing {
        times.sort_by(f64::total_cmp);
        Timing {
            s: times[times.len() / 2],
            min_s: times[0],
            max_s: times[times.len() - 1],
            reps,
            rounds: times.len(),
            times,
        }
    }
    /// Two measurements of one entry as one: the median of their pooled rounds.
    fn pooled(a: Timing, b: Timing) -> Timing {
        Timing::of_rounds([a.times, b.times].concat(), a.reps.min(b.reps))
    }
    /// A single slow call, the whole measurement.
    fn is_one_call(&self) -> bool {
        self.rounds == 1
    }
    fn spread(&self) -> f64 {
        self.max_s / self.min_s - 1.0
    }
    fn from_json(v: &Value) -> Option<Timing> {
        Some(Timing {
            s: v.get("s")?.as_f64()?,
            min_s: v.get("min_s")?.as_f64()?,
            max_s: v.get("max_s")?.as_f64()?,
            reps: v.get("reps")?.as_u64()? as usize,
            rounds: v
                .get("rounds")
                .and_then(Value::as_u64)
                .unwrap_or(ROUNDS as u64) as usize,
            times: v
                .get("times")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default(),
        })
    }
}

/// PyTorch measuring on demand: `torch-baseline --sweep --serve`, asked one key per line.
struct TorchServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl TorchServer {
    /// Start the script beside this crate (`xtask/torch/torch-baseline`).
    fn start() -> Result<TorchServer, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/torch/torch-baseline");
        let mut child = Command::new(&script)
            .args(["--sweep", "--serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", script.display()))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(TorchServer {
            child,
            stdin,
            stdout,
        })
    }

    /// PyTorch's timing of `key`, `None` when it has no such entry.
    fn measure(&mut self, key: &str) -> Result<Option<Timing>, String> {
        let stdin = self.stdin.as_mut().expect("open until drop");
        writeln!(stdin, "{key}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("torch-baseline --serve: {e}"))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("torch-baseline --serve: {e}"))?;
        if line.is_empty() {
            return Err(format!(
                "torch-baseline --serve ended before answering {key}"
            ));
        }
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| format!("torch-baseline --serve answered {line:?}: {e}"))?;
        if v.get("missing").is_some() {
            return Ok(None);
        }
        Timing::from_json(&v)
            .map(Some)
            .ok_or_else(|| format!("torch-baseline --serve: {key}: no timing in {line:?}"))
    }
}

impl Drop for TorchServer {
    fn drop(&mut self) {
        // End of input ends the script's loop.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Time `f` as the module documentation says.
fn measure(mut f: impl FnMut()) -> Timing {
    let t = Instant::now();
    f();
    let first = t.elapsed().as_secs_f64();
    if first > SLOW_S {
        return Timing::of_rounds(vec![first], 1);
    }
    let t = Instant::now();
    f();
    let one = t.elapsed().as_secs_f64();
    let reps = ((ROUND_S / one.max(1e-9)).ceil() as usize).clamp(1, 10_000);
    for _ in 0..reps {
        f();
    }
    let rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    Timing::of_rounds(rounds, reps)
}

/// Ours and PyTorch's timing of one entry measured in turn: PyTorch, ours, ours,
/// PyTorch, each side pooled (a single slow call is not repeated).
fn interleaved(
    server: &mut TorchServer,
    key: &str,
    mut run: impl FnMut(),
) -> Result<(Timing, Option<Timing>), String> {
    let torch = server.measure(key)?;
    std::thread::sleep(SETTLE);
    let ours = measure(&mut run);
    let ours = if ours.is_one_call() {
        ours
    } else {
        Timing::pooled(ours, measure(&mut run))
    };
    std::thread::sleep(SETTLE);
    let torch = match torch {
        Some(t) if !t.is_one_call() => server.measure(key)?.map(|u| Timing::pooled(t, u)),
        t => t,
    };
    Ok((ours, torch))
}

/// One workload of the sweep: what it is, how much work a call does, and the call.
struct Workload {
    op: &'static str,
    mode: &'static str,
    /// FLOPs (products) or bytes moved (the rest) per call.
    work: f64,
    unit: &'static str,
    run: Box<dyn FnMut()>,
}

/// Uniform values in [-2, 2) of `dims`, cast to `dtype` (a leaf that does not require grad).
fn data(dims: &[usize], dtype: DType, gen: &mut Generator) -> Tensor {
    let u = Tensor::rand(dims.to_vec(), DType::F32, gen).expect("rand");
    let x = ops::add_scalar(&ops::mul_scalar(&u, 4.0).expect("scale"), -2.0).expect("shift");
    x.to_dtype(dtype).expect("cast").detach()
}

fn dtype_of(mode: &str) -> DType {
    match mode {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    }
}

/// Run `f` under cpu bfloat16 autocast when `auto`.
fn region<R>(auto: bool, f: impl FnOnce() -> R) -> R {
    if auto {
        autocast(DeviceType::Cpu, DType::BF16, f).expect("autocast region")
    } else {
        f()
    }
}

/// The workloads of one size, in `torch_sweep.py`'s order: op by op (in the order
/// they are set up here), each op's modes in turn, so that an op's 16-bit entries are
/// measured within seconds of its float32 entry that the summary compares them with
/// (mode by mode, minutes apart on a host whose speed drifts, a full sweep counted 122
/// 16-bit entries below our float32 where most were the drift: Zen 5, 2026-12-02).
/// Only those `keep(op, mode)` accepts are set up (the data is drawn in set-up order).
fn workloads(n: usize, gen: &mut Generator, keep: &dyn Fn(&str, &str) -> bool) -> Vec<Workload> {
    let mut out = Vec::new();
    let nf = n as f64;
    let mut push = |op, mode, work, unit, run: Box<dyn FnMut()>| {
        out.push(Workload {
            op,
            mode,
            work,
            unit,
            run,
        })
    };
    for mode in ["f32", "bf16", "f16", "autocast_bf16"] {
        let auto = mode == "autocast_bf16";
        let dt = dtype_of(mode);
        if keep("mm", mode) {
            let (a, b) = (data(&[n, n], dt, gen), data(&[n, n], dt, gen));
            push(
                "mm",
                mode,
                2.0 * nf.powi(3),
                "GFLOP/s",
                Box::new(move || {
                    std::hint::black_box(region(auto, || ops::mm(&a, &b)).expect("mm"));
                }),
            );
        }
        if keep("bmm", mode) {
            let (q, k) = (data(&[BH, n, HEAD], dt, gen), data(&[BH, HEAD, n], dt, gen));
            push(
                "bmm",
                mode,
                2.0 * (BH * HEAD) as f64 * nf * nf,
                "GFLOP/s",
                Box::new(move || {
                    std::hint::black_box(region(auto, || ops::bmm(&q, &k)).expect("bmm"));
                }),
            );
        }
        if keep("linear_fwd_bwd", mode) {
            let x = data(&[n, n], dt, gen);
            let w = ops::div_scalar(&data(&[n, n], dt, gen), nf.sqrt())
                .expect("scale")
                .detach();
            let bias = data(&[n], dt, gen);
            for p in [&x, &w, &bias] {
                p.requires_grad_(true).expect("leaf");
            }
            let g = data(&[n, n], if auto { DType::BF16 } else { dt }, gen);
            push(
                "linear_fwd_bwd",
                mode,
                6.0 * nf.powi(3),
                "GFLOP/s",
                Box::new(move || {
                    for p in [&x, &w, &bias] {
                        p.set_grad(None).expect("zero_grad");
                    }
                    let y = region(auto, || ops::linear(&x, &w, Some(&bias))).expect("linear");
                    y.backward_with(BackwardOptions {
                        gradient: Some(&g),
                        ..Default::default()
                    })
                    .expect("backward");
                }),
            );
        }
    }
    for mode in ["f32", "bf16", "f16"] {
        let dt = dtype_of(mode);
        let size = dt.size_in_bytes() as f64;
        let bytes2 = 2.0 * nf * nf * size;
        let bytes3 = 3.0 * nf * nf * size;
        if keep("softmax", mode) {
            let x = data(&[n, n], dt, gen);
            push(
                "softmax",
                mode,
                bytes2,
                "GB/s",
                Box::new(move || {
                    std::hint::black_box(ops::softmax(&x, -1, None).expect("softmax"));
                }),
            );
        }
        if keep("layer_norm", mode) {
            let x = data(&[n, n], dt, gen);
            let (w, bias) = (data(&[n], dt, gen), data(&[n], dt, gen));
            push(
                "layer_norm",
                mode,
                bytes2,
                "GB/s",
                Box::new(move || {
                    std::hint::black_box(
                        ops::layer_norm(&x, &[n], Some(&w), Some(&bias), 1e-5).expect("layer_norm"),
                    );
                }),
            );
        }
        for (op, f) in [
            (
                "add",
                ops::add as fn(&Tensor, &Tensor) -> amp::autograd::Result<Tensor>,
            ),
            ("mul", ops::mul),
        ] {
            if keep(op, mode) {
                let (x, y) = (data(&[n, n], dt, gen), data(&[n, n], dt, gen));
                push(
                    op,
                    mode,
                    bytes3,
                    "GB/s",
                    Box::new(move || {
                        std::hint::black_box(f(&x, &y).expect("binary op"));
                    }),
                );
            }
        }
        if keep("gelu", mode) {
            let x = data(&[n, n], dt, gen);
            push(
                "gelu",
                mode,
                bytes2,
                "GB/s",
                Box::new(move || {
                    std::hint::black_box(ops::gelu(&x).expect("gelu"));
                }),
            );
        }
    }
    // A stable sort by each op's first appearance keeps the modes' order.
    let mut ops: Vec<&str> = Vec::new();
    for w in &out {
        if !ops.contains(&w.op) {
            ops.push(w.op);
        }
    }
    out.sort_by_key(|w| ops.iter().position(|&op| op == w.op));
    out
}

/// One entry of the sweep, ours and (when compared) PyTorch's.
struct Entry {
    /// How many times it was measured ([`ATTEMPTS`]).
    attempts: usize,
    key: String,
    op: &'static str,
    mode: &'static str,
    n: usize,
    work: f64,
    unit: &'static str,
    ours: Timing,
    torch: Option<Timing>,
}

impl Entry {
    /// Our speed over PyTorch's (> 1: we are faster).
    fn ratio(&self) -> Option<f64> {
        self.torch.as_ref().map(|t| t.s / self.ours.s)
    }
    fn figure(&self, t: &Timing) -> f64 {
        self.work / t.s / 1e9
    }
}

/// The machine kind: the CPU flags the kernels choose by, joined by `-`.
fn machine(isa: &Value) -> String {
    let flags: Vec<&str> = isa["cpu"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if flags.is_empty() {
        "generic".into()
    } else {
        flags.join("-")
    }
}

/// Read the entries of a `torch-baseline --sweep` JSON object.
fn read_torch(path: &str) -> Result<BTreeMap<String, Timing>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
    let entries = v.get("entries").and_then(Value::as_object).ok_or_else(|| {
        format!("{path}: no \"entries\" object (made by torch-baseline --sweep?)")
    })?;
    entries
        .iter()
        .map(|(k, e)| {
            Timing::from_json(e)
                .map(|t| (k.clone(), t))
                .ok_or_else(|| format!("{path}: entry {k} lacks s/min_s/max_s/reps"))
        })
        .collect()
}

/// Run the sweep, print the table (or JSON), write the JSON and the picture.
pub fn main(opts: &SweepOptions, isa: Value) -> ExitCode {
    let torch = match opts.compare.as_deref().map(read_torch).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("xtask bench --sweep: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut server = if opts.with_torch {
        match TorchServer::start() {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("xtask bench --sweep: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let interleaved_torch = server.is_some();
    let machine = machine(&isa);
    eprintln!("xtask bench --sweep: machine {machine}, isa {isa}");
    let mut gen = Generator::new(0);
    let mut entries = Vec::new();
    for n in SIZES {
        let keep = |op: &str, mode: &str| {
            let key = format!("{op}/{mode}/{n}");
            opts.filter.as_deref().is_none_or(|f| key.contains(f))
        };
        for mut w in workloads(n, &mut gen, &keep) {
            let key = format!("{}/{}/{n}", w.op, w.mode);
            let mut attempt = || match server.as_mut() {
                Some(s) => interleaved(s, &key, &mut w.run),
                None => Ok((
                    measure(&mut w.run),
                    torch.as_ref().and_then(|t| t.get(&key).cloned()),
                )),
            };
            // The worst spread of a measurement: ours, or PyTorch's when measured beside.
            let worst = |(o, t): &(Timing, Option<Timing>)| {
                let t = if interleaved_torch { t.as_ref() } else { None };
                t.map_or(o.spread(), |t| o.spread().max(t.spread()))
            };
            let mut attempts = 0;
            let mut best: Option<(Timing, Option<Timing>)> = None;
            while attempts < ATTEMPTS && best.as_ref().is_none_or(|b| worst(b) > SPREAD_OK) {
                let m = match attempt() {
                    Ok(m) => m,
                    Err(e) => {
                        eprintln!("xtask bench --sweep: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                attempts += 1;
                if best.as_ref().is_none_or(|b| worst(&m) < worst(b)) {
                    best = Some(m);
                }
            }
            let (ours, torch) = best.expect("measured at least once");
            let e = Entry {
                attempts,
                torch,
                key,
                op: w.op,
                mode: w.mode,
                n,
                work: w.work,
                unit: w.unit,
                ours,
            };
            eprintln!("  {}", row(&e));
            entries.push(e);
        }
    }
    if entries.is_empty() {
        eprintln!("xtask bench --sweep: no entry matches the filter");
        return ExitCode::FAILURE;
    }
    let doc = to_json(&entries, &isa, &machine, server.is_some());
    if opts.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serialisable")
        );
    } else {
        println!("{}", header());
        for e in &entries {
            println!("{}", row(e));
        }
        print!("{}", summary(&entries));
    }
    if let Err(e) = write_outputs(&opts.out, &machine, &doc, &entries) {
        eprintln!("xtask bench --sweep: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn header() -> String {
    format!(
        "{:<28} {:>10} {:>7} {:>10} {:>7} {:>7}  unit  (ratio = our speed / PyTorch's)",
        "entry", "ours", "spread", "PyTorch", "spread", "ratio"
    )
}

fn row(e: &Entry) -> String {
    let (t, ts, r) = match &e.torch {
        Some(t) => (
            format!("{:.2}", e.figure(t)),
            format!("{:.0}%", t.spread() * 100.0),
            format!("{:.2}", e.ratio().unwrap_or(f64::NAN)),
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    format!(
        "{:<28} {:>10.2} {:>6.0}% {:>10} {:>7} {:>7}  {}",
        e.key,
        e.figure(&e.ours),
        e.ours.spread() * 100.0,
        t,
        ts,
        r,
        e.unit
    )
}

/// The verdicts of the size-sweep issue: the worst f32 ratios, every f32 entry below
/// PyTorch, every entry whose spread is over [`SPREAD_OK`], every 16-bit entry (and
/// float32 under autocast) slower than our own float32 at the same op and size.
fn summary(entries: &[Entry]) -> String {
    let mut s = String::new();
    let f32s: Vec<&Entry> = entries.iter().filter(|e| e.mode == "f32").collect();
    let mut rated: Vec<(&Entry, f64)> = f32s
        .iter()
        .filter_map(|e| e.ratio().map(|r| (*e, r)))
        .collect();
    rated.sort_by(|a, b| a.1.total_cmp(&b.1));
    if !rated.is_empty() {
        let below = rated.iter().filter(|(_, r)| *r < 1.0).count();
        let _ = writeln!(
            s,
            "\nfloat32 entries at or above PyTorch: {} of {} (worst three: {})",
            rated.len() - below,
            rated.len(),
            rated
                .iter()
                .take(3)
                .map(|(e, r)| format!("{} {r:.2}x", e.key))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (e, r) in rated.iter().filter(|(_, r)| *r < 1.0) {
            let _ = writeln!(s, "  below PyTorch: {} {r:.2}x", e.key);
        }
    }
    let noisy: Vec<String> = entries
        .iter()
        .filter(|e| e.ours.spread() > SPREAD_OK)
        .map(|e| format!("{} {:.0}%", e.key, e.ours.spread() * 100.0))
        .collect();
    let _ = writeln!(
        s,
        "entries with a spread over {:.0}% (min-max of an entry's rounds): {} of {}{}{}",
        SPREAD_OK * 100.0,
        noisy.len(),
        entries.len(),
        if noisy.is_empty() { "" } else { ": " },
        noisy.join(", ")
    );
    let again = entries.iter().filter(|e| e.attempts > 1).count();
    let _ = writeln!(
        s,
        "entries measured again for a spread over {:.0}% (at most {ATTEMPTS} times, the \
         steadiest kept): {again} of {}",
        SPREAD_OK * 100.0,
        entries.len(),
    );
    let ours_f32: BTreeMap<(&str, usize), f64> = entries
        .iter()
        .filter(|e| e.mode == "f32")
        .map(|e| ((e.op, e.n), e.ours.s))
        .collect();
    let slower: Vec<String> = entries
        .iter()
        .filter(|e| e.mode != "f32")
        .filter_map(|e| {
            let f = ours_f32.get(&(e.op, e.n))?;
            (e.ours.s > *f).then(|| format!("{} {:.2}x", e.key, f / e.ours.s))
        })
        .collect();
    let _ = writeln!(
        s,
        "16-bit entries slower than our float32 entry of the same op and size: {}{}{}",
        slower.len(),
        if slower.is_empty() { "" } else { ": " },
        slower.join(", ")
    );
    s
}

fn timing_json(t: &Timing) -> Value {
    json!({"s": t.s, "min_s": t.min_s, "max_s": t.max_s, "reps": t.reps, "rounds": t.rounds})
}

/// The run as JSON; `interleaved` when PyTorch was measured beside us entry by entry.
fn to_json(entries: &[Entry], isa: &Value, machine: &str, interleaved: bool) -> Value {
    let mut ours = Map::new();
    let mut torch = Map::new();
    for e in entries {
        let mut o = timing_json(&e.ours);
        o["work"] = json!(e.work);
        o["unit"] = json!(e.unit);
        o["attempts"] = json!(e.attempts);
        ours.insert(e.key.clone(), o);
        if let Some(t) = &e.torch {
            let mut o = timing_json(t);
            o["work"] = json!(e.work);
            o["unit"] = json!(e.unit);
            torch.insert(e.key.clone(), o);
        }
    }
    json!({
        "machine": machine,
        "isa": isa,
        "threads": crate::bench::hardware_threads(),
        "rounds": ROUNDS,
        "interleaved": interleaved,
        "entries": ours,
        "torch": torch,
    })
}

fn write_outputs(out: &Path, machine: &str, doc: &Value, entries: &[Entry]) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let json_path = out.join(format!("{machine}.json"));
    let text = serde_json::to_string_pretty(doc).expect("serialisable") + "\n";
    std::fs::write(&json_path, text)
        .map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    eprintln!("wrote {}", json_path.display());
    if entries.iter().any(|e| e.torch.is_some()) {
        let svg = out.join(format!("{machine}.svg"));
        plot(&svg, entries).map_err(|e| format!("cannot draw {}: {e}", svg.display()))?;
        eprintln!("wrote {}", svg.display());
    }
    Ok(())
}

/// One panel per op: our speed over PyTorch's (log scale) against the size, one line per
/// mode, and the 1.0 line.
fn plot(path: &Path, entries: &[Entry]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let mut ops: Vec<&str> = Vec::new();
    for e in entries {
        if !ops.contains(&e.op) {
            ops.push(e.op);
        }
    }
    let cols = 4;
    let rows = ops.len().div_ceil(cols);
    let root = SVGBackend::new(path, (1400, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((rows, cols));
    let modes = ["f32", "bf16", "f16", "autocast_bf16"];
    let colours = [BLUE, RED, GREEN, MAGENTA];
    for (panel, op) in panels.iter().zip(&ops) {
        let points = |mode: &str| -> Vec<(f64, f64)> {
            entries
                .iter()
                .filter(|e| e.op == *op && e.mode == mode)
                .filter_map(|e| e.ratio().map(|r| (e.n as f64, r)))
                .collect()
        };
        let all: Vec<f64> = modes.iter().flat_map(|m| points(m)).map(|p| p.1).collect();
        let lo = all.iter().cloned().fold(1.0f64, f64::min) * 0.8;
        let hi = all.iter().cloned().fold(1.0f64, f64::max) * 1.25;
        let mut c = ChartBuilder::on(panel)
            .caption(format!("{op}: ours / PyTorch"), ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(44)
            .build_cartesian_2d((6f64..2800f64).log_scale(), (lo..hi).log_scale())?;
        c.configure_mesh().x_desc("n").draw()?;
        c.draw_series(LineSeries::new(vec![(6.0, 1.0), (2800.0, 1.0)], &BLACK))?;
        for (mode, colour) in modes.iter().zip(colours) {
            let p = points(mode);
            if p.is_empty() {
                continue;
            }
            c.draw_series(LineSeries::new(p, &colour))?
                .label(*mode)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
        }
        c.configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
