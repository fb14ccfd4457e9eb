//! An MLP classifier trained with autocast + GradScaler, then the same model in plain
//! float32, and compared (the main job, `--example train`, does the same for a
//! transformer).
//!
//! ```sh
//! cargo run --release --example mlp -- [--epochs N] [--dtype bfloat16|float16]
//!     [--no-amp] [--device cpu|cuda] [--trace] [--out DIR]
//! ```
//!
//! The data set is generated in code (no download): 10 classes in 256 dimensions, each a
//! Gaussian cloud around a random prototype, with label noise, so the task is learnable
//! but not trivial.

use std::path::PathBuf;
use std::time::Instant;

use amp::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};

const FEATURES: usize = 256;
const HIDDEN: usize = 1024;
const CLASSES: usize = 10;
const BATCH: usize = 256;
const TRAIN_BATCHES: usize = 40;
const TEST_BATCHES: usize = 8;

struct Args {
    epochs: usize,
    dtype: DType,
    amp: bool,
    device: Device,
    trace: bool,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        epochs: 4,
        dtype: DType::BF16,
        amp: true,
        device: Device::Cpu,
        trace: false,
        out: PathBuf::from("target/mlp"),
    };
    let mut dtype_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--epochs" => {
                a.epochs = val("--epochs")?
                    .parse()
                    .map_err(|e| format!("--epochs: {e}"))?
            }
            "--dtype" => {
                a.dtype = val("--dtype")?
                    .parse()
                    .map_err(|e: amp::tensor::Error| e.to_string())?;
                dtype_given = true;
            }
            "--no-amp" => a.amp = false,
            "--device" => {
                a.device = val("--device")?
                    .parse()
                    .map_err(|e: amp::tensor::Error| e.to_string())?
            }
            "--trace" => a.trace = true,
            "--out" => a.out = PathBuf::from(val("--out")?),
            "-h" | "--help" => {
                println!("usage: mlp [--epochs N] [--dtype bfloat16|float16] [--no-amp] [--device cpu|cuda] [--trace] [--out DIR]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    if !dtype_given && a.device != Device::Cpu {
        a.dtype = DType::F16;
    }
    amp::autocast::check_dtype(a.device.device_type(), a.dtype).map_err(|e| e.to_string())?;
    Ok(a)
}

/// The synthetic data set: `(inputs [n, FEATURES], labels [n])` batches.
struct Data {
    train: Vec<(Tensor, Tensor)>,
    test: Vec<(Tensor, Tensor)>,
}

fn make_data(seed: u64) -> Result<Data, Box<dyn std::error::Error>> {
    let mut g = Generator::new(seed);
    let protos: Vec<Vec<f64>> = (0..CLASSES)
        .map(|_| (0..FEATURES).map(|_| g.normal() * 0.35).collect())
        .collect();
    let batch = |g: &mut Generator| -> Result<(Tensor, Tensor), Box<dyn std::error::Error>> {
        let mut x = Vec::with_capacity(BATCH * FEATURES);
        let mut y = Vec::with_capacity(BATCH);
        for _ in 0..BATCH {
            let c = g.int_range(0, CLASSES as i64) as usize;
            let label = if g.bernoulli(0.05) {
                g.int_range(0, CLASSES as i64)
            } else {
                c as i64
            };
            x.extend(protos[c].iter().map(|p| (p + g.normal()) as f32));
            y.push(label);
        }
        Ok((
            Tensor::from_vec(x, [BATCH, FEATURES])?,
            Tensor::from_vec(y, [BATCH])?,
        ))
    };
    let train = (0..TRAIN_BATCHES)
        .map(|_| batch(&mut g))
        .collect::<Result<_, _>>()?;
    let test = (0..TEST_BATCHES)
        .map(|_| batch(&mut g))
        .collect::<Result<_, _>>()?;
    Ok(Data { train, test })
}

fn model(seed: u64) -> Result<Sequential, Box<dyn std::error::Error>> {
    let mut g = Generator::new(seed);
    Ok(Sequential::new()
        .add(Linear::new(FEATURES, HIDDEN, &mut g)?)
        .add(ReLU)
        .add(Linear::new(HIDDEN, HIDDEN, &mut g)?)
        .add(ReLU)
        .add(Linear::new(HIDDEN, CLASSES, &mut g)?))
}

#[derive(Default)]
struct History {
    loss: Vec<f64>,
    scale: Vec<f64>,
    skipped: Vec<u64>,
    step_ms: Vec<f64>,
    final_loss: f64,
    accuracy: f64,
}

fn run(
    args: &Args,
    data: &Data,
    use_amp: bool,
    label: &str,
) -> Result<History, Box<dyn std::error::Error>> {
    let net = model(7)?;
    let mut opt = Sgd::new(
        net.parameters(),
        0.05,
        SgdOptions {
            momentum: 0.9,
            ..Default::default()
        },
    )?;
    let mut scaler = GradScaler::with_options(GradScalerOptions::default().enabled(use_amp))?;
    let region = Autocast::new(args.device.device_type())
        .dtype(args.dtype)
        .enabled(use_amp);
    let mut h = History::default();
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}")?
        .progress_chars("=> ");
    let mut traced_once = !(args.trace && use_amp);
    for epoch in 0..args.epochs {
        let bar = ProgressBar::new(data.train.len() as u64)
            .with_style(style.clone())
            .with_prefix(format!("{label} {}/{}", epoch + 1, args.epochs));
        for (x, y) in &data.train {
            let t = Instant::now();
            opt.zero_grad();
            let loss = if !traced_once {
                traced_once = true;
                let (loss, trace) =
                    amp::autocast::traced(region.clone(), || -> amp::autograd::Result<Tensor> {
                        ops::cross_entropy(&net.forward(x)?, y, None, -100, Reduction::Mean, 0.0)
                    })?;
                bar.suspend(|| println!("autocast decisions for one step ({label}):\n{trace}\n"));
                loss?
            } else {
                region.try_run(|| {
                    ops::cross_entropy(&net.forward(x)?, y, None, -100, Reduction::Mean, 0.0)
                })?
            };
            scaler.scale(&loss)?.backward()?;
            scaler.step(&mut opt)?;
            scaler.update()?;
            h.step_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let l = loss.item_f64()?;
            h.loss.push(l);
            h.scale.push(scaler.get_scale());
            h.skipped.push(scaler.stats().steps_skipped);
            bar.set_message(format!(
                "loss {l:.4}  scale {:.0}  skipped {}",
                scaler.get_scale(),
                scaler.stats().steps_skipped
            ));
            bar.inc(1);
        }
        bar.finish();
    }
    // evaluation in the same precision, without gradients
    let (mut correct, mut total, mut loss_sum) = (0usize, 0usize, 0.0);
    for (x, y) in &data.test {
        let (logits, loss) = no_grad(|| {
            region.try_run(|| -> amp::autograd::Result<(Tensor, Tensor)> {
                let logits = net.forward(x)?;
                let loss = ops::cross_entropy(&logits, y, None, -100, Reduction::Mean, 0.0)?;
                Ok((logits, loss))
            })
        })?;
        loss_sum += loss.item_f64()?;
        let pred = ops::argmax(&logits, Some(1), false)?.to_vec::<i64>()?;
        let truth = y.to_vec::<i64>()?;
        correct += pred.iter().zip(&truth).filter(|(a, b)| a == b).count();
        total += truth.len();
    }
    h.final_loss = loss_sum / data.test.len() as f64;
    h.accuracy = correct as f64 / total as f64;
    Ok(h)
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().skip(v.len().min(3)).cloned().collect();
    if s.is_empty() {
        s = v.to_vec();
    }
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

fn plot(
    path: &std::path::Path,
    amp_h: Option<&History>,
    f32_h: &History,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let n = f32_h.loss.len();
    let max_loss = f32_h
        .loss
        .iter()
        .chain(amp_h.map_or(&[][..], |h| &h.loss))
        .cloned()
        .fold(0.0, f64::max);
    let mut c = ChartBuilder::on(&top)
        .caption("training loss", ("sans-serif", 22))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..n, 0.0..max_loss * 1.05)?;
    c.configure_mesh().x_desc("step").y_desc("loss").draw()?;
    let runs = std::iter::once((f32_h, "float32", BLUE))
        .chain(amp_h.map(|h| (h, "autocast + GradScaler", RED)));
    for (h, label, color) in runs {
        let points = h.loss.iter().enumerate().map(|(i, &l)| (i, l));
        c.draw_series(LineSeries::new(points, &color))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    if let Some(h) = amp_h {
        let max_scale = h.scale.iter().cloned().fold(1.0, f64::max);
        let max_skip = h.skipped.last().copied().unwrap_or(0).max(1) as f64;
        let mut c = ChartBuilder::on(&bottom)
            .caption(
                "loss scale (log2, red) and skipped steps (black)",
                ("sans-serif", 22),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0..n, 0.0..max_scale.log2().max(max_skip) * 1.1)?;
        c.configure_mesh().x_desc("step").draw()?;
        c.draw_series(LineSeries::new(
            h.scale.iter().enumerate().map(|(i, &s)| (i, s.log2())),
            &RED,
        ))?;
        c.draw_series(LineSeries::new(
            h.skipped.iter().enumerate().map(|(i, &s)| (i, s as f64)),
            &BLACK,
        ))?;
    }
    root.present()?;
    Ok(())
}

fn main() {
    // Errors are reported with their message (not `Debug`), as a command-line tool
    // should: exit status 2 for bad arguments, 1 for a failed run.
    let (status, err) = match parse_args() {
        Err(e) => (2, e.to_string()),
        Ok(args) => match train_both(args) {
            Ok(()) => return,
            Err(e) => (1, e.to_string()),
        },
    };
    eprintln!("error: {err}");
    std::process::exit(status);
}

fn train_both(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.device != Device::Cpu {
        // Tensors on a GPU need the CUDA backend; say so instead of failing mid-run.
        Tensor::zeros([1], DType::F32)
            .data()
            .to_device(args.device)?;
    }
    println!(
        "MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}, {} steps/epoch, {} epochs, device {}, autocast dtype {}",
        TRAIN_BATCHES, args.epochs, args.device, args.dtype
    );
    let data = make_data(42)?;
    let amp_h = if args.amp {
        Some(run(&args, &data, true, "amp")?)
    } else {
        None
    };
    let f32_h = run(&args, &data, false, "float32")?;

    println!();
    println!(
        "{:<32} {:>9} {:>12} {:>12} {:>10} {:>8}",
        "run", "ms/step", "test loss", "accuracy", "scale", "skipped"
    );
    let row = |name: &str, h: &History| {
        println!(
            "{:<32} {:>9.2} {:>12.6} {:>11.2}% {:>10} {:>8}",
            name,
            median(&h.step_ms),
            h.final_loss,
            h.accuracy * 100.0,
            h.scale.last().map_or("-".into(), |s| format!("{s:.0}")),
            h.skipped.last().copied().unwrap_or(0)
        )
    };
    row("float32", &f32_h);
    if let Some(h) = &amp_h {
        row(&format!("autocast {} + GradScaler", args.dtype), h);
        println!(
            "AMP speed-up over float32: {:.2}x (median step time)",
            median(&f32_h.step_ms) / median(&h.step_ms)
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("training.svg");
    plot(&path, amp_h.as_ref(), &f32_h)?;
    println!("wrote {}", path.display());
    Ok(())
}
