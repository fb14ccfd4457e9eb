//! The multi-process checks of `amp-distributed`, one scenario per run, under
//! `mpirun -np 2 --oversubscribe mpi_ranks <scenario>` (the crate's `mpirun::` tests
//! launch it). Each rank prints `rank R: <scenario> ok` or exits non-zero with the
//! mismatch.
//!
//! - `collectives`: all-reduce (sum, max, average) in every communicated dtype,
//!   broadcast, all-gather, barrier, non-blocking operations waited out of order.
//! - `ddp`: each rank on its part of the batch reaches the parameters of one process on
//!   the whole batch, in float64 to rounding, with SGD (momentum) and Adam, with and
//!   without gradient accumulation (`no_sync`).
//! - `scaler`: an inf on rank 1 only makes both ranks skip the step and back off the
//!   scale alike: through DDP's averaged gradients, and with each rank checking only its
//!   own gradients through the found_inf MAX reduction (without it the ranks diverge).
//! - `dead`: rank 1 leaves after a barrier; rank 0's next all-reduce fails with
//!   `Error::Timeout` within the timeout instead of hanging.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use amp_autograd::{ops, Reduction, Tensor};
use amp_distributed::{
    sharded_grad_scaler, DdpOptions, DistributedDataParallel, Error, Mpi, ProcessGroup, ReduceOp,
};
use amp_nn::Module;
use amp_optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use amp_scaler::{GradScaler, GradScalerOptions, StepOutcome};
use amp_tensor::{DType, Generator, Tensor as Raw};

type Res<T = ()> = Result<T, Box<dyn StdError>>;

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Res {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

fn main() -> ExitCode {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let timeout = Duration::from_secs(if scenario == "dead" { 3 } else { 120 });
    let group = match Mpi::init() {
        Ok(g) => Arc::new(g.with_timeout(timeout)),
        Err(e) => {
            eprintln!("MPI init failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rank = group.rank();
    let result = match scenario.as_str() {
        "collectives" => collectives(&*group),
        "ddp" => ddp(group.clone()),
        "scaler" => scaler(group.clone()),
        "dead" => dead(&*group),
        other => Err(format!("unknown scenario {other:?}").into()),
    };
    match result {
        Ok(()) => {
            println!("rank {rank}: {scenario} ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rank {rank}: {scenario} FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn values(t: &Raw) -> Vec<f64> {
    t.to_vec_f64()
}

fn collectives(g: &dyn ProcessGroup) -> Res {
    let (r, n) = (g.rank() as f64, g.size() as f64);
    let tri = n * (n + 1.0) / 2.0;
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let mine = || Raw::from_vec(vec![r + 1.0, -(r + 1.0) / 2.0, 3.0], [3])?.to_dtype(dtype);
        for (op, want) in [
            (ReduceOp::Sum, vec![tri, -tri / 2.0, 3.0 * n]),
            (ReduceOp::Max, vec![n, -0.5, 3.0]),
            (ReduceOp::Avg, vec![tri / n, -tri / n / 2.0, 3.0]),
        ] {
            let t = mine()?;
            g.all_reduce(&t, op)?;
            ensure(t.dtype() == dtype && values(&t) == want, || {
                format!("{dtype} {op:?}: {:?}, want {want:?}", values(&t))
            })?;
        }
        let root = g.size() - 1;
        let t = Raw::full([2, 2], r, dtype);
        g.broadcast(&t, root)?;
        ensure(values(&t) == vec![root as f64; 4], || {
            format!("{dtype} broadcast: {:?}", values(&t))
        })?;
        let outs: Vec<Raw> = (0..g.size()).map(|_| Raw::zeros([2], dtype)).collect();
        g.all_gather(
            &outs,
            &Raw::from_vec(vec![r, 10.0 * r], [2])?.to_dtype(dtype)?,
        )?;
        for (i, o) in outs.iter().enumerate() {
            let i = i as f64;
            ensure(values(o) == vec![i, 10.0 * i], || {
                format!("{dtype} all_gather [{i}]: {:?}", values(o))
            })?;
        }
    }
    // Non-blocking: two reductions in flight, waited for in the other order.
    let (a, b) = (
        Raw::full([4], r, DType::F32),
        Raw::full([4], 1.0, DType::F64),
    );
    let wa = g.all_reduce_async(&a, ReduceOp::Max)?;
    let mut wb = g.all_reduce_async(&b, ReduceOp::Sum)?;
    while !wb.is_completed()? {}
    wa.wait()?;
    ensure(
        values(&a) == vec![n - 1.0; 4] && values(&b) == vec![n; 4],
        || format!("non-blocking: {:?} {:?}", values(&a), values(&b)),
    )?;
    g.barrier()?;
    // Refused before anything is sent (every rank refuses alike).
    let e = g
        .all_reduce(&Raw::zeros([1], DType::I32), ReduceOp::Sum)
        .unwrap_err();
    ensure(matches!(e, Error::UnsupportedDtype { .. }), || {
        format!("int32 all_reduce: {e}")
    })
}

/// A two-layer perceptron of any float dtype, initialised from `seed`.
struct Mlp {
    params: Vec<(String, Tensor)>,
}

impl Mlp {
    fn new(dtype: DType, seed: u64) -> Res<Mlp> {
        let mut gen = Generator::new(seed);
        let mut params = Vec::new();
        for (name, shape) in [
            ("0.weight", vec![5, 3]),
            ("0.bias", vec![5]),
            ("2.weight", vec![2, 5]),
            ("2.bias", vec![2]),
        ] {
            let t = Tensor::randn(shape, dtype, &mut gen)?;
            t.requires_grad_(true)?;
            params.push((name.to_string(), t));
        }
        Ok(Mlp { params })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> amp_autograd::Result<Tensor> {
        let p = |i: usize| &self.params[i].1;
        let h = ops::linear(x, p(0), Some(p(1)))?.tanh()?;
        ops::linear(&h, p(2), Some(p(3)))
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.params.clone()
    }
}

/// Rows `start..start + len` of `t`.
fn rows(t: &Tensor, start: usize, len: usize) -> Res<Tensor> {
    Ok(Tensor::from_raw(
        t.data().narrow(0, start, len)?.contiguous(),
    ))
}

fn loss(model: &dyn Module, x: &Tensor, y: &Tensor) -> Res<Tensor> {
    Ok(ops::mse_loss(&model.forward(x)?, y, Reduction::Mean)?)
}

type MakeOpt = fn(Vec<Tensor>) -> Res<Box<dyn Optimizer>>;

fn sgd(p: Vec<Tensor>) -> Res<Box<dyn Optimizer>> {
    let opts = SgdOptions {
        momentum: 0.9,
        ..Default::default()
    };
    Ok(Box::new(Sgd::new(p, 0.1, opts)?))
}

fn adam(p: Vec<Tensor>) -> Res<Box<dyn Optimizer>> {
    Ok(Box::new(Adam::new(p, 0.01, AdamOptions::default())?))
}

/// The largest difference between two lists of parameters.
fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter()
        .zip(b)
        .flat_map(|(a, b)| a.to_vec_f64().into_iter().zip(b.to_vec_f64()))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

fn ddp(g: Arc<dyn ProcessGroup>) -> Res {
    const BATCH: usize = 8;
    const STEPS: usize = 5;
    let (rank, size) = (g.rank(), g.size());
    ensure(BATCH.is_multiple_of(2 * size), || {
        format!("{size} ranks do not split the batch")
    })?;
    let mut data = Generator::new(7);
    let x = Tensor::randn([STEPS, BATCH, 3], DType::F64, &mut data)?;
    let y = Tensor::randn([STEPS, BATCH, 2], DType::F64, &mut data)?;
    let step_data = |s: usize| -> Res<(Tensor, Tensor)> {
        Ok((
            Tensor::from_raw(x.data().select(0, s as i64)?.contiguous()),
            Tensor::from_raw(y.data().select(0, s as i64)?.contiguous()),
        ))
    };
    let share = BATCH / size;
    for (name, make) in [("sgd", sgd as MakeOpt), ("adam", adam as MakeOpt)] {
        for accumulate in [false, true] {
            // Every rank starts from its own weights: DDP's broadcast makes them rank 0's.
            let reference = Mlp::new(DType::F64, 100)?;
            let opts = DdpOptions {
                bucket_cap_bytes: 64,
            };
            let model = DistributedDataParallel::with_options(
                Mlp::new(DType::F64, 100 + rank as u64)?,
                g.clone(),
                opts,
            )?;
            ensure(model.num_buckets() > 1, || {
                "expected several buckets".into()
            })?;
            let mut ref_opt = make(reference.parameters())?;
            let mut opt = make(model.parameters())?;
            for s in 0..STEPS {
                let (xs, ys) = step_data(s)?;
                reference.zero_grad();
                loss(&reference, &xs, &ys)?.backward()?;
                ref_opt.step()?;

                model.zero_grad();
                let (xr, yr) = (
                    rows(&xs, rank * share, share)?,
                    rows(&ys, rank * share, share)?,
                );
                if accumulate {
                    // Two micro-batches: the first accumulates locally, the second syncs.
                    let half = share / 2;
                    {
                        let _local = model.no_sync();
                        let l = loss(&model, &rows(&xr, 0, half)?, &rows(&yr, 0, half)?)?;
                        (&l * 0.5)?.backward()?;
                    }
                    let l = loss(&model, &rows(&xr, half, half)?, &rows(&yr, half, half)?)?;
                    (&l * 0.5)?.backward()?;
                } else {
                    loss(&model, &xr, &yr)?.backward()?;
                }
                opt.step()?;
            }
            let d = max_diff(&model.parameters(), &reference.parameters());
            ensure(d <= 1e-12, || {
                format!("{name} (accumulate {accumulate}): {size} ranks differ from one process by {d:e}")
            })?;
            // The replicas are identical, bit for bit.
            for p in model.parameters() {
                let all: Vec<Raw> = (0..size).map(|_| p.data().zeros_like()).collect();
                g.all_gather(&all, p.data())?;
                ensure(all.iter().all(|o| values(o) == p.to_vec_f64()), || {
                    format!("{name}: the ranks' parameters differ")
                })?;
            }
        }
    }
    Ok(())
}

/// Each rank's `[skipped, scale, growth tracker]`, gathered.
fn gather_decisions(
    g: &dyn ProcessGroup,
    outcome: StepOutcome,
    s: &GradScaler,
) -> Res<Vec<Vec<f64>>> {
    let mine = Raw::from_vec(
        vec![
            f64::from(u8::from(outcome.is_skipped())),
            s.get_scale(),
            s.get_growth_tracker() as f64,
        ],
        [3],
    )?;
    let all: Vec<Raw> = (0..g.size()).map(|_| mine.zeros_like()).collect();
    g.all_gather(&all, &mine)?;
    Ok(all.iter().map(values).collect())
}

/// Train 3 steps; at step 1 rank 1's gradients get an inf (in its input with DDP,
/// injected into one gradient after backward otherwise). Returns each step's gathered
/// decisions.
fn scaled_run(
    g: &Arc<dyn ProcessGroup>,
    with_ddp: bool,
    mut scaler: GradScaler,
) -> Res<Vec<Vec<Vec<f64>>>> {
    let rank = g.rank();
    let inner = Mlp::new(DType::F32, 5)?;
    let model: Box<dyn Module> = if with_ddp {
        Box::new(DistributedDataParallel::new(inner, g.clone())?)
    } else {
        Box::new(inner)
    };
    let mut opt = Sgd::new(model.parameters(), 0.1, SgdOptions::default())?;
    let mut data = Generator::new(11 + rank as u64);
    let mut steps = Vec::new();
    for s in 0..3 {
        let x = Tensor::randn([4, 3], DType::F32, &mut data)?;
        let y = Tensor::randn([4, 2], DType::F32, &mut data)?;
        let poisoned = s == 1 && rank == 1;
        if poisoned && with_ddp {
            x.data().narrow(0, 0, 1)?.fill_(f32::INFINITY)?;
        }
        model.zero_grad();
        scaler.scale(&loss(&*model, &x, &y)?)?.backward()?;
        if poisoned && !with_ddp {
            let g0 = model.parameters()[0].grad().expect("a gradient");
            g0.data().narrow(0, 0, 1)?.fill_(f32::INFINITY)?;
        }
        let outcome = scaler.step(&mut opt)?;
        scaler.update()?;
        steps.push(gather_decisions(&**g, outcome, &scaler)?);
    }
    Ok(steps)
}

fn scaler(g: Arc<dyn ProcessGroup>) -> Res {
    let opts = GradScalerOptions::default().init_scale(1024.0);
    let alike = |steps: &[Vec<Vec<f64>>]| {
        steps
            .iter()
            .all(|ranks| ranks.iter().all(|d| *d == ranks[0]))
    };
    let check = |what: &str, steps: Vec<Vec<Vec<f64>>>| -> Res {
        ensure(alike(&steps), || {
            format!("{what}: the ranks decided differently: {steps:?}")
        })?;
        let want = [[0.0, 1024.0, 1.0], [1.0, 512.0, 0.0], [0.0, 512.0, 1.0]];
        ensure(steps.iter().zip(want).all(|(s, w)| s[0] == w), || {
            format!("{what}: expected a skip and a backoff at step 1 only: {steps:?}")
        })
    };
    // DDP: rank 1's inf reaches every rank through the averaged gradients.
    check(
        "ddp",
        scaled_run(&g, true, GradScaler::with_options(opts.clone())?)?,
    )?;
    // Each rank checks its own gradients: the MAX reduction makes the decision common.
    check(
        "found_inf all-reduced",
        scaled_run(&g, false, sharded_grad_scaler(opts.clone(), g.clone())?)?,
    )?;
    // The control: without the reduction, rank 0 steps where rank 1 skips.
    let steps = scaled_run(&g, false, GradScaler::with_options(opts)?)?;
    ensure(steps[1][0][0] == 0.0 && steps[1][1][0] == 1.0, || {
        format!("without the reduction the ranks should diverge at step 1: {steps:?}")
    })
}

fn dead(g: &dyn ProcessGroup) -> Res {
    g.barrier()?;
    if g.rank() == 1 {
        // Leave without taking part in anything more (nor finalizing MPI).
        println!("rank 1: dead ok (leaving)");
        std::process::exit(0);
    }
    let t = Raw::ones([4], DType::F32);
    let start = Instant::now();
    let e = g.all_reduce(&t, ReduceOp::Sum).unwrap_err();
    let took = start.elapsed();
    ensure(
        matches!(
            e,
            Error::Timeout {
                op: "all_reduce",
                ..
            }
        ),
        || format!("expected a timeout, got {e}"),
    )?;
    ensure(took >= g.timeout() && took < g.timeout() * 4, || {
        format!("timed out after {took:?} (timeout {:?})", g.timeout())
    })?;
    // The group refuses further use.
    let e2 = g.barrier().unwrap_err();
    ensure(matches!(e2, Error::GroupFailed { .. }), || {
        format!("after the timeout: {e2}")
    })?;
    println!("rank 0: {e} (after {took:.1?})");
    Ok(())
}
