//! `cargo xtask bench`: the performance figures of the design targets and the issues, timed like
//! `xtask/torch/torch_baseline.py` (warm-up runs, then the median of several), with
//! the same metric names so the two JSON objects compare key by key.
//!
//! Adding a metric is one entry in [`METRICS`]: a name, a unit and a function that
//! sets up its workload and returns the figure.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use amp_kernels::{mm, non_finite_check_and_unscale_};

/// The main job's model (`cargo run --example train`), timed by [`gpt_step_ms`].
#[path = "../../amp/examples/train/gpt.rs"]
mod gpt;
use amp_tensor::{DType, Tensor};
use serde_json::{Map, Number, Value};

/// One benchmark: its metric name (as in the PyTorch baseline), its unit, and the
/// function that measures it.
pub struct Metric {
    /// The key in the JSON output (shared with `torch_baseline.py`).
    pub name: &'static str,
    /// `GFLOP/s`, `GB/s` (higher is better) or `ms`, `us` (lower is better).
    pub unit: &'static str,
    /// Set up the workload, time it, return the figure in `unit`.
    pub run: fn() -> f64,
}

impl Metric {
    /// `true` for throughputs, `false` for times.
    pub fn higher_is_better(&self) -> bool {
        !matches!(self.unit, "ms" | "us")
    }
}

/// Every benchmark, in the order they run.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "mm_f32_1024_gflops",
        unit: "GFLOP/s",
        run: || mm_gflops(DType::F32, 1024, 7, 2),
    },
    Metric {
        name: "mm_bf16_1024_gflops",
        unit: "GFLOP/s",
        run: || mm_gflops(DType::BF16, 1024, 7, 2),
    },
    Metric {
        name: "mm_bf16_256_gflops",
        unit: "GFLOP/s",
        run: || mm_gflops(DType::BF16, 256, 41, 5),
    },
    Metric {
        name: "mm_bf16_2048_gflops",
        unit: "GFLOP/s",
        run: || mm_gflops(DType::BF16, 2048, 5, 1),
    },
    Metric {
        name: "mm_f16_1024_gflops",
        unit: "GFLOP/s",
        run: || mm_gflops(DType::F16, 1024, 7, 2),
    },
    Metric {
        name: "mm_8x8_us",
        unit: "us",
        run: || small_op_us(SmallOp::Mm, Mode::Plain),
    },
    Metric {
        name: "mm_8x8_autocast_us",
        unit: "us",
        run: || small_op_us(SmallOp::Mm, Mode::Autocast),
    },
    Metric {
        name: "mm_8x8_manual_bf16_us",
        unit: "us",
        run: || small_op_us(SmallOp::Mm, Mode::ManualCasts),
    },
    Metric {
        name: "add_8x8_us",
        unit: "us",
        run: || small_op_us(SmallOp::Add, Mode::Plain),
    },
    Metric {
        name: "add_8x8_autocast_us",
        unit: "us",
        run: || small_op_us(SmallOp::Add, Mode::Autocast),
    },
    Metric {
        name: "unscale_64x1M_f32_gbps",
        unit: "GB/s",
        run: unscale_gbps,
    },
    Metric {
        name: "copy_256MB_gbps",
        unit: "GB/s",
        run: copy_gbps,
    },
    Metric {
        name: "cast_f32_bf16_64M_gbps",
        unit: "GB/s",
        run: || cast_gbps(DType::BF16),
    },
    Metric {
        name: "cast_f32_f16_64M_gbps",
        unit: "GB/s",
        run: || cast_gbps(DType::F16),
    },
    Metric {
        name: "conv2d_f32_fwd_bwd_ms",
        unit: "ms",
        run: || conv2d_fwd_bwd_ms(false),
    },
    Metric {
        name: "conv2d_autocast_bf16_fwd_bwd_ms",
        unit: "ms",
        run: || conv2d_fwd_bwd_ms(true),
    },
    Metric {
        name: "linear_bf16_fwd_bwd_ms",
        unit: "ms",
        run: linear_bf16_fwd_bwd_ms,
    },
    Metric {
        name: "mlp_step_f32_ms",
        unit: "ms",
        run: || mlp_step_ms(false),
    },
    Metric {
        name: "mlp_step_autocast_bf16_scaler_ms",
        unit: "ms",
        run: || mlp_step_ms(true),
    },
    Metric {
        name: "gpt_step_f32_ms",
        unit: "ms",
        run: || gpt_step_ms(false),
    },
    Metric {
        name: "gpt_step_autocast_bf16_scaler_ms",
        unit: "ms",
        run: || gpt_step_ms(true),
    },
];

/// A performance target of the design or of an issue, checked when the figures it needs
/// are there.
enum Target {
    /// ours ≥ factor × PyTorch's figure of the same metric (throughputs).
    VsTorch(&'static str, f64),
    /// ours ≤ factor × PyTorch's figure of the same metric (times).
    TimeVsTorch(&'static str, f64),
    /// ours (first) ≥ factor × our own figure of another metric (second; throughputs).
    VsOurs(&'static str, &'static str, f64),
    /// ours (first) ≤ factor × our own figure of another metric (second; times).
    TimeVsOurs(&'static str, &'static str, f64),
    /// ours ≤ an absolute bound (times, in the metric's unit).
    TimeBelow(&'static str, f64),
    /// ours (first) − our other metric (second) ≤ a bound (an overhead, in the unit).
    OverheadBelow(&'static str, &'static str, f64),
}

const TARGETS: &[Target] = &[
    Target::VsTorch("mm_f32_1024_gflops", 0.8),
    Target::VsOurs("mm_bf16_1024_gflops", "mm_f32_1024_gflops", 0.7),
    Target::VsOurs("mm_f16_1024_gflops", "mm_f32_1024_gflops", 0.7),
    Target::VsTorch("cast_f32_bf16_64M_gbps", 3.0),
    Target::VsTorch("cast_f32_f16_64M_gbps", 3.0),
    Target::VsOurs("unscale_64x1M_f32_gbps", "copy_256MB_gbps", 0.8),
    Target::TimeBelow("mm_8x8_us", 1.0),
    Target::TimeBelow("add_8x8_us", 1.0),
    // autocast adds at most 0.5 us to a listed op beyond its casts (the same casts and op
    // written by hand), and about nothing to an unlisted one
    Target::OverheadBelow("mm_8x8_autocast_us", "mm_8x8_manual_bf16_us", 0.5),
    Target::OverheadBelow("add_8x8_autocast_us", "add_8x8_us", 0.1),
    Target::TimeVsTorch("conv2d_f32_fwd_bwd_ms", 1.5),
    Target::TimeVsOurs(
        "conv2d_autocast_bf16_fwd_bwd_ms",
        "conv2d_f32_fwd_bwd_ms",
        1.0,
    ),
    Target::TimeVsTorch("mlp_step_f32_ms", 1.2),
    Target::TimeVsOurs("mlp_step_autocast_bf16_scaler_ms", "mlp_step_f32_ms", 1.3),
    // The native 16-bit issue's figures (set for CPUs with AMX; reported on every CPU).
    Target::VsTorch("mm_bf16_1024_gflops", 1.5),
    Target::VsTorch("mm_bf16_2048_gflops", 1.5),
    Target::VsTorch("mm_bf16_256_gflops", 1.0),
    Target::VsTorch("mm_f16_1024_gflops", 1.0),
    Target::TimeVsTorch("mlp_step_autocast_bf16_scaler_ms", 0.8),
    Target::TimeVsOurs("mlp_step_autocast_bf16_scaler_ms", "mlp_step_f32_ms", 0.5),
    Target::TimeVsTorch("conv2d_autocast_bf16_fwd_bwd_ms", 0.8),
    Target::VsTorch("unscale_64x1M_f32_gbps", 1.0),
];

/// Parsed command-line options of `bench`.
pub struct Options {
    json: bool,
    filter: Option<String>,
    compare: Option<String>,
    sweep: bool,
    with_torch: bool,
    out: Option<String>,
}

impl Options {
    /// Parse `[--sweep] [--json] [--filter SUBSTR] [--compare FILE.json | --with-torch]
    /// [--out DIR]`.
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            json: false,
            filter: None,
            compare: None,
            sweep: false,
            with_torch: false,
            out: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--json" => o.json = true,
                "--sweep" => o.sweep = true,
                "--with-torch" => o.with_torch = true,
                "--out" => o.out = Some(it.next().ok_or("--out needs a folder")?.clone()),
                "--filter" => {
                    o.filter = Some(it.next().ok_or("--filter needs a substring")?.clone())
                }
                "--compare" => {
                    o.compare = Some(it.next().ok_or("--compare needs a JSON file")?.clone())
                }
                other => return Err(format!("unknown option `{other}`")),
            }
        }
        if o.out.is_some() && !o.sweep {
            return Err("--out is an option of --sweep".into());
        }
        if o.with_torch && !o.sweep {
            return Err("--with-torch is an option of --sweep".into());
        }
        if o.with_torch && o.compare.is_some() {
            return Err("--with-torch measures PyTorch itself: leave out --compare".into());
        }
        Ok(o)
    }
}

/// Run the selected benchmarks and print the table, the JSON object or the comparison.
pub fn main(opts: &Options) -> ExitCode {
    if opts.sweep {
        let sweep = crate::sweep::SweepOptions {
            filter: opts.filter.clone(),
            compare: opts.compare.clone(),
            with_torch: opts.with_torch,
            json: opts.json,
            out: opts.out.as_deref().unwrap_or("target/sweep").into(),
        };
        return crate::sweep::main(&sweep, isa());
    }
    let torch = match opts.compare.as_deref().map(read_baseline).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("xtask bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let selected: Vec<&Metric> = METRICS
        .iter()
        .filter(|m| opts.filter.as_deref().is_none_or(|f| m.name.contains(f)))
        .collect();
    if selected.is_empty() {
        eprintln!("xtask bench: no metric matches the filter");
        return ExitCode::FAILURE;
    }
    let isa = isa();
    eprintln!(
        "xtask bench: {} metric(s), {} hardware thread(s), isa {isa}",
        selected.len(),
        hardware_threads()
    );
    let mut ours: Vec<(&Metric, f64)> = Vec::new();
    for m in selected {
        eprint!("  {:<32}", m.name);
        let v = (m.run)();
        eprintln!(" {v:>10.3} {}", m.unit);
        ours.push((m, v));
    }
    if opts.json {
        let mut obj: Map<String, Value> = ours
            .iter()
            .map(|(m, v)| {
                let n = Number::from_f64(*v).map_or(Value::Null, Value::Number);
                (m.name.to_string(), n)
            })
            .collect();
        obj.insert("isa".into(), isa);
        println!(
            "{}",
            serde_json::to_string_pretty(&Value::Object(obj)).expect("serialisable")
        );
    } else if torch.is_none() {
        print_table(&ours);
        print!("{}", targets_report(&ours, &BTreeMap::new()));
    }
    if let Some(torch) = &torch {
        let report = comparison(&ours, torch);
        if opts.json {
            eprint!("{report}");
        } else {
            print!("{report}");
        }
    }
    ExitCode::SUCCESS
}

/// The CPU features the kernels choose by (as `/proc/cpuinfo` spells them) and the
/// kernel each dtype's products take: `{"cpu": [...], "f32": .., "bf16": .., "f16": ..}`.
/// `torch_baseline.py` writes the same key with PyTorch's own capability.
fn isa() -> Value {
    const FLAGS: [&str; 10] = [
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_fp16",
    ];
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let cpu: Vec<Value> = FLAGS
        .iter()
        .filter(|f| flags.contains(f))
        .map(|f| Value::from(*f))
        .collect();
    let path = |dt: DType| amp_kernels::kernel16(dt).map_or("none", |k| k.name());
    serde_json::json!({
        "cpu": cpu,
        "f32": "faer",
        "bf16": path(DType::BF16),
        "f16": path(DType::F16),
    })
}

/// The hardware threads of this machine.
pub(crate) fn hardware_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn print_table(ours: &[(&Metric, f64)]) {
    println!("{:<32} {:>12}  unit", "metric", "value");
    for (m, v) in ours {
        println!("{:<32} {:>12.3}  {}", m.name, v, m.unit);
    }
}

/// The numeric entries of a `torch-baseline` JSON object.
fn read_baseline(path: &str) -> Result<BTreeMap<String, f64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path} is not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{path}: expected one JSON object"))?;
    Ok(obj
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|f| (k.clone(), f)))
        .collect())
}

fn comparison(ours: &[(&Metric, f64)], torch: &BTreeMap<String, f64>) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<32} {:>12} {:>12} {:>8}  unit     (ratio = ours / PyTorch)",
        "metric", "ours", "PyTorch", "ratio"
    );
    for (m, v) in ours {
        let Some(&t) = torch.get(m.name) else {
            continue;
        };
        let better = if m.higher_is_better() {
            "higher is better"
        } else {
            "lower is better"
        };
        let _ = writeln!(
            s,
            "{:<32} {:>12.3} {:>12.3} {:>8.2}  {:<8} {better}",
            m.name,
            v,
            t,
            v / t,
            m.unit
        );
    }
    s.push_str(&targets_report(ours, torch));
    s
}

/// The verdict on every target whose figures are there (PyTorch's may be empty).
fn targets_report(ours: &[(&Metric, f64)], torch: &BTreeMap<String, f64>) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let value = |name: &str| ours.iter().find(|(m, _)| m.name == name).map(|(_, v)| *v);
    let mut lines = Vec::new();
    for target in TARGETS {
        let torch_of = |name: &str| torch.get(name).copied();
        // (label, figure, bound, figure must be at least the bound, unit of the figure)
        let (label, got, need, at_least, unit) = match *target {
            Target::VsTorch(name, f) => match (value(name), torch_of(name)) {
                (Some(v), Some(t)) => (format!("{name} >= {f} x PyTorch"), v / t, f, true, "x"),
                _ => continue,
            },
            Target::TimeVsTorch(name, f) => match (value(name), torch_of(name)) {
                (Some(v), Some(t)) => (format!("{name} <= {f} x PyTorch"), v / t, f, false, "x"),
                _ => continue,
            },
            Target::VsOurs(name, other, f) => match (value(name), value(other)) {
                (Some(v), Some(o)) => (format!("{name} >= {f} x our {other}"), v / o, f, true, "x"),
                _ => continue,
            },
            Target::TimeVsOurs(name, other, f) => match (value(name), value(other)) {
                (Some(v), Some(o)) => {
                    (format!("{name} <= {f} x our {other}"), v / o, f, false, "x")
                }
                _ => continue,
            },
            Target::TimeBelow(name, bound) => match value(name) {
                Some(v) => (format!("{name} <= {bound}"), v, bound, false, ""),
                None => continue,
            },
            Target::OverheadBelow(name, base, bound) => match (value(name), value(base)) {
                (Some(v), Some(b)) => (
                    format!("{name} - {base} <= {bound}"),
                    v - b,
                    bound,
                    false,
                    "",
                ),
                _ => continue,
            },
        };
        let met = if at_least { got >= need } else { got <= need };
        let verdict = if met { "met" } else { "MISSED" };
        lines.push(format!("  {label:<72} {got:>7.2}{unit:<1}  {verdict}"));
    }
    if !lines.is_empty() {
        let _ = writeln!(s, "\ntargets (the design and the issues):");
        for l in lines {
            let _ = writeln!(s, "{l}");
        }
    }
    s
}

// ----- timing ---------------------------------------------------------------------------

/// Seconds per call of `f`: `warm` untimed calls, then the median of `n` timed ones
/// (as `torch_baseline.py`'s `median_time`).
pub fn median_time(mut f: impl FnMut(), n: usize, warm: usize) -> f64 {
    for _ in 0..warm {
        f();
    }
    let mut ts: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[ts.len() / 2]
}

/// `n` pseudo-random f32 values in [-2, 2) (fast to make, no NaN or subnormal).
fn data_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn tensor_f32(dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(data_f32(n, seed), dims.to_vec()).expect("sizes agree")
}

// ----- workloads ------------------------------------------------------------------------

fn mm_gflops(dtype: DType, n: usize, n_runs: usize, warm: usize) -> f64 {
    let a = tensor_f32(&[n, n], 1).to_dtype(dtype).expect("cast");
    let b = tensor_f32(&[n, n], 2).to_dtype(dtype).expect("cast");
    let t = median_time(
        || {
            std::hint::black_box(mm(&a, &b).expect("mm"));
        },
        n_runs,
        warm,
    );
    2.0 * (n as f64).powi(3) / t / 1e9
}

/// The two small ops of the dispatch-overhead benchmarks.
#[derive(Clone, Copy)]
enum SmallOp {
    /// `mm` (on the lower-precision list: autocast casts both arguments to bfloat16).
    Mm,
    /// `add` (on no list: autocast leaves it alone).
    Add,
}

/// How the small op is called.
#[derive(Clone, Copy)]
enum Mode {
    /// Outside autocast.
    Plain,
    /// Inside a cpu bfloat16 autocast region.
    Autocast,
    /// Outside autocast, with the casts autocast would make written by hand.
    ManualCasts,
}

/// Microseconds per call of a differentiable op on two 8x8 float32 tensors (forward
/// only, through the dispatch point), as `torch_baseline.py` times `torch.mm(x, x)`.
fn small_op_us(op: SmallOp, mode: Mode) -> f64 {
    use amp::autocast::autocast;
    use amp::autograd::{ops, Tensor as T};
    use amp::policy::DeviceType;
    let x = T::from_raw(tensor_f32(&[8, 8], 5));
    let k = 2000;
    let call = |x: &T| match (op, mode) {
        (SmallOp::Mm, Mode::ManualCasts) => {
            let xb = x.to_dtype(DType::BF16).expect("cast");
            let yb = x.to_dtype(DType::BF16).expect("cast");
            ops::mm(&xb, &yb).expect("mm")
        }
        (SmallOp::Mm, _) => ops::mm(x, x).expect("mm"),
        (SmallOp::Add, _) => ops::add(x, x).expect("add"),
    };
    let run = || {
        for _ in 0..k {
            std::hint::black_box(call(&x));
        }
    };
    let t = match mode {
        Mode::Autocast => median_time(
            || autocast(DeviceType::Cpu, DType::BF16, run).expect("autocast region"),
            7,
            2,
        ),
        Mode::Plain | Mode::ManualCasts => median_time(run, 7, 2),
    };
    t / k as f64 * 1e6
}

/// Milliseconds per forward + backward of `torch_baseline.py`'s convolution (Conv2d
/// 64→64, 3×3, padding 1, input 32×64×32×32, backward of the sum): float32, or with the
/// forward under cpu bfloat16 autocast and the sum of its float32 cast outside.
fn conv2d_fwd_bwd_ms(amp_on: bool) -> f64 {
    use amp::prelude::*;
    let mut gen = Generator::new(0);
    let conv = amp::nn::Conv2d::with_options(
        amp::nn::ConvOptions::new(64, 64, &[3, 3]).padding(&[1, 1]),
        &mut gen,
    )
    .expect("conv");
    let x = Tensor::randn([32, 64, 32, 32], DType::F32, &mut gen).expect("randn");
    // The same number of runs for both, enough for a stable median on a noisy machine.
    let (n, warm) = (11, 2);
    let t = median_time(
        || {
            conv.weight.set_grad(None).expect("zero_grad");
            if let Some(b) = &conv.bias {
                b.set_grad(None).expect("zero_grad");
            }
            let loss = if amp_on {
                let y = autocast(DeviceType::Cpu, DType::BF16, || conv.forward(&x))
                    .expect("autocast region")
                    .expect("forward");
                ops::sum_all(&y.to_dtype(DType::F32).expect("cast"))
            } else {
                ops::sum_all(&conv.forward(&x).expect("forward"))
            };
            loss.expect("sum").backward().expect("backward");
        },
        n,
        warm,
    );
    t * 1e3
}

/// Milliseconds per forward + backward of a bfloat16 `Linear(1024, 1024)` on a batch of
/// 256 bfloat16 inputs that require grad (the forward product and both gradient
/// products), as `torch_baseline.py` times it.
fn linear_bf16_fwd_bwd_ms() -> f64 {
    use amp::prelude::*;
    let mut gen = Generator::new(0);
    let leaf = |dims: &[usize], scale: f64, gen: &mut Generator| {
        let t = ops::mul_scalar(
            &Tensor::randn(dims.to_vec(), DType::F32, gen).expect("randn"),
            scale,
        )
        .expect("scale")
        .to_dtype(DType::BF16)
        .expect("cast")
        .detach();
        t.requires_grad_(true).expect("leaf");
        t
    };
    let w = leaf(&[1024, 1024], 1.0 / 32.0, &mut gen);
    let b = leaf(&[1024], 1.0 / 32.0, &mut gen);
    let x = leaf(&[256, 1024], 1.0, &mut gen);
    let t = median_time(
        || {
            for p in [&x, &w, &b] {
                p.set_grad(None).expect("zero_grad");
            }
            let y = ops::linear(&x, &w, Some(&b)).expect("forward");
            ops::sum_all(&y).expect("sum").backward().expect("backward");
        },
        21,
        3,
    );
    t * 1e3
}

/// Milliseconds per training step of `torch_baseline.py`'s MLP (784-1024-1024-10, batch
/// 256, cross entropy, SGD lr 0.01): float32, or under cpu bfloat16 autocast with a
/// `GradScaler`.
fn mlp_step_ms(amp_on: bool) -> f64 {
    use amp::prelude::*;
    let mut gen = Generator::new(0);
    let layer = |i, o, gen: &mut Generator| Linear::new(i, o, gen).expect("linear");
    let model = Sequential::new()
        .add(layer(784, 1024, &mut gen))
        .add(ReLU)
        .add(layer(1024, 1024, &mut gen))
        .add(ReLU)
        .add(layer(1024, 10, &mut gen));
    let mut opt = Sgd::new(model.parameters(), 0.01, SgdOptions::default()).expect("sgd");
    let x = Tensor::randn([256, 784], DType::F32, &mut gen).expect("randn");
    let labels: Vec<i64> = (0..256).map(|i| (i * 7 % 10) as i64).collect();
    let y = Tensor::from_vec(labels, [256]).expect("labels");
    let loss_of = |model: &Sequential| {
        ops::cross_entropy(&model.forward(&x)?, &y, None, -100, Reduction::Mean, 0.0)
    };
    // The same number of runs for both, enough for a stable median on a noisy machine.
    train_step_ms(amp_on, &mut opt, || loss_of(&model), 21)
}

/// Median milliseconds of one training step (3 warm-up runs, then `runs`): zero the
/// gradients, `loss()` (under cpu bfloat16 autocast, scaled by a `GradScaler`, when
/// `amp_on`), backward, the optimizer's step.
fn train_step_ms(
    amp_on: bool,
    opt: &mut dyn amp::optim::Optimizer,
    loss: impl Fn() -> amp::autograd::Result<amp::autograd::Tensor>,
    runs: usize,
) -> f64 {
    use amp::prelude::*;
    let mut scaler = GradScaler::new();
    let t = median_time(
        || {
            opt.zero_grad();
            if amp_on {
                let l = autocast(DeviceType::Cpu, DType::BF16, &loss)
                    .expect("autocast region")
                    .expect("forward");
                scaler
                    .scale(&l)
                    .expect("scale")
                    .backward()
                    .expect("backward");
                scaler.step(opt).expect("step");
                scaler.update().expect("update");
            } else {
                loss().expect("forward").backward().expect("backward");
                opt.step().expect("step");
            }
        },
        runs,
        3,
    );
    t * 1e3
}

/// Milliseconds per training step of the main job's model ([`gpt::GptConfig::default`]:
/// 4 pre-norm layers of width 128, 4 heads, feed-forward 512, context 128, vocabulary
/// 96) on a batch of 16 sequences: forward, cross-entropy, backward and an AdamW step
/// (lr 3e-3, weight decay 0.01), as `torch_baseline.py` times the same model in
/// PyTorch: float32, or the forward and loss under cpu bfloat16 autocast with a
/// `GradScaler`.
fn gpt_step_ms(amp_on: bool) -> f64 {
    use amp::prelude::*;
    use gpt::{Gpt, GptConfig};
    let config = GptConfig::default();
    let model = Gpt::new(config, &mut Generator::new(0)).expect("model");
    let opt_options = AdamOptions {
        weight_decay: 0.01,
        decoupled: true,
        ..Default::default()
    };
    let mut opt = Adam::new(model.parameters(), 3e-3, opt_options).expect("adamw");
    let (b, t) = (16, config.context);
    let tokens = |shift: usize| {
        let v: Vec<i64> = (0..b * t)
            .map(|i| ((i + shift) * 7919 % config.vocab) as i64)
            .collect();
        Tensor::from_vec(v, [b, t]).expect("tokens")
    };
    let (x, y) = (tokens(0), tokens(1));
    // The same number of runs for both, enough for a stable median on a noisy machine.
    train_step_ms(amp_on, &mut opt, || model.loss(&x, &y), 11)
}

fn unscale_gbps() -> f64 {
    let numel = 1usize << 20;
    let grads: Vec<Tensor> = (0..64).map(|i| tensor_f32(&[numel], 10 + i)).collect();
    let found = Tensor::zeros([1], DType::F32);
    let inv = Tensor::full([1], 1.0 / 65536.0, DType::F32);
    let t = median_time(
        || non_finite_check_and_unscale_(&grads, &found, &inv).expect("unscale"),
        5,
        2,
    );
    (64 * numel * 8) as f64 / t / 1e9
}

fn copy_gbps() -> f64 {
    let numel = 64usize << 20;
    let src = tensor_f32(&[numel], 3);
    let dst = Tensor::zeros([numel], DType::F32);
    let t = median_time(|| dst.copy_(&src).expect("copy_"), 5, 2);
    (numel * 8) as f64 / t / 1e9
}

fn cast_gbps(dtype: DType) -> f64 {
    let numel = 64usize << 20;
    let src = tensor_f32(&[numel], 4);
    let t = median_time(
        || {
            std::hint::black_box(src.to_dtype(dtype).expect("cast"));
        },
        5,
        2,
    );
    (numel * 6) as f64 / t / 1e9
}
