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
//! - `zero`: `ShardedOptimizer` (ZeRO-1) with SGD (momentum) and Adam under DDP reaches
//!   the replicated optimizer's parameters bit for bit in float64 and float32, holds
//!   state only for its own shard, and its consolidated state dict is the replicated
//!   optimizer's.
//! - `zero_scaler`: an inf on rank 1 only, in a gradient of a parameter rank 0 owns:
//!   `ShardedOptimizer` + `sharded_grad_scaler` skip on both ranks and back off alike
//!   (plain and fused Adam steps), and the replicas stay identical.
//! - `zero_checkpoint`: the sharded state dicts and the consolidated one, loaded into
//!   fresh optimizers, resume bit for bit; the consolidated one loads on one rank too.
//! - `compression`: bfloat16-compressed DDP stays within bfloat16's rounding of the
//!   uncompressed gradients without being equal to them; the communication statistics
//!   are present and sane.
//! - `bench`: samples/s of a small training step (DDP + Adam, replicated and ZeRO-1,
//!   with and without bfloat16 compression) and the overlap share; run it on 1 and on
//!   2 processes (`RAYON_NUM_THREADS=1`).
//! - `dead`: rank 1 leaves after a barrier; rank 0's next all-reduce fails with
//!   `Error::Timeout` within the timeout instead of hanging.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use amp_autograd::{ops, Reduction, Tensor};
use amp_distributed::{
    sharded_grad_scaler, CommStats, DdpOptions, DistributedDataParallel, Error, Mpi, ProcessGroup,
    ReduceOp, ShardedOptimizer, SingleProcess,
};
use amp_nn::Module;
use amp_optim::{Adam, AdamOptions, Optimizer, OptimizerStateDict, Sgd, SgdOptions};
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
        "zero" => zero(group.clone()),
        "zero_scaler" => zero_scaler(group.clone()),
        "zero_checkpoint" => zero_checkpoint(group.clone()),
        "compression" => compression(group.clone()),
        "bench" => bench(group.clone()),
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
                ..Default::default()
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

fn sgd_raw(p: Vec<Tensor>) -> amp_optim::Result<Sgd> {
    let opts = SgdOptions {
        momentum: 0.9,
        ..Default::default()
    };
    Sgd::new(p, 0.1, opts)
}

fn adam_raw(p: Vec<Tensor>) -> amp_optim::Result<Adam> {
    Adam::new(p, 0.01, AdamOptions::default())
}

/// Whether every rank holds the same values in `params`, bit for bit.
fn replicas_identical(g: &dyn ProcessGroup, params: &[Tensor]) -> Res<bool> {
    for p in params {
        let all: Vec<Raw> = (0..g.size()).map(|_| p.data().zeros_like()).collect();
        g.all_gather(&all, p.data())?;
        if !all.iter().all(|o| values(o) == p.to_vec_f64()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// This rank's batch of step `s`: 4 rows of a generator seeded by rank and step.
fn local_batch(rank: usize, s: usize, dtype: DType) -> Res<(Tensor, Tensor)> {
    let mut gen = Generator::new(1000 * rank as u64 + s as u64);
    Ok((
        Tensor::randn([4, 3], dtype, &mut gen)?,
        Tensor::randn([4, 2], dtype, &mut gen)?,
    ))
}

fn ddp_model(g: &Arc<dyn ProcessGroup>, dtype: DType) -> Res<DistributedDataParallel<Mlp>> {
    let opts = DdpOptions {
        bucket_cap_bytes: 64,
        ..Default::default()
    };
    Ok(DistributedDataParallel::with_options(
        Mlp::new(dtype, 40 + g.rank() as u64)?,
        g.clone(),
        opts,
    )?)
}

fn train<O: Optimizer + ?Sized>(
    model: &dyn Module,
    opt: &mut O,
    rank: usize,
    steps: std::ops::Range<usize>,
    dtype: DType,
) -> Res {
    for s in steps {
        let (x, y) = local_batch(rank, s, dtype)?;
        opt.zero_grad();
        loss(model, &x, &y)?.backward()?;
        opt.step()?;
    }
    Ok(())
}

fn zero(g: Arc<dyn ProcessGroup>) -> Res {
    let rank = g.rank();
    for dtype in [DType::F64, DType::F32] {
        for name in ["sgd", "adam"] {
            let replicated = ddp_model(&g, dtype)?;
            let sharded = ddp_model(&g, dtype)?;
            // The same optimizer replicated, and sharded over the group.
            fn both<O: Optimizer + 'static>(
                replicated: &DistributedDataParallel<Mlp>,
                sharded: &DistributedDataParallel<Mlp>,
                g: &Arc<dyn ProcessGroup>,
                make: fn(Vec<Tensor>) -> amp_optim::Result<O>,
            ) -> Res<(Box<dyn Optimizer>, Box<dyn Optimizer>)> {
                Ok((
                    Box::new(make(replicated.parameters())?),
                    Box::new(ShardedOptimizer::new(
                        sharded.parameters(),
                        g.clone(),
                        make,
                    )?),
                ))
            }
            let (mut ropt, mut zopt) = match name {
                "sgd" => both(&replicated, &sharded, &g, sgd_raw)?,
                _ => both(&replicated, &sharded, &g, adam_raw)?,
            };
            train(&replicated, &mut *ropt, rank, 0..4, dtype)?;
            train(&sharded, &mut *zopt, rank, 0..4, dtype)?;
            let (a, b) = (replicated.parameters(), sharded.parameters());
            let same = a
                .iter()
                .zip(&b)
                .all(|(a, b)| a.to_vec_f64() == b.to_vec_f64());
            ensure(same, || {
                format!(
                    "{dtype} {name}: sharded differs from replicated by {:e}",
                    max_diff(&a, &b)
                )
            })?;
            ensure(replicas_identical(&*g, &b)?, || {
                format!("{dtype} {name}: the ranks' parameters differ")
            })?;
            // This rank's state covers exactly its shard; the shards split the model.
            let shard_sd = zopt.state_dict();
            let owned: Vec<usize> = shard_sd.state.keys().copied().collect();
            let full = ropt.state_dict();
            ensure(!owned.is_empty() && owned.len() < full.state.len(), || {
                format!("{dtype} {name}: rank {rank} holds state for {owned:?}")
            })?;
            let counts = Raw::from_vec(vec![owned.len() as f64], [1])?;
            g.all_reduce(&counts, ReduceOp::Sum)?;
            ensure(values(&counts) == vec![full.state.len() as f64], || {
                format!(
                    "{dtype} {name}: the shards hold {:?} states of {}",
                    values(&counts),
                    full.state.len()
                )
            })?;
        }
    }
    // The consolidated state dict is the replicated optimizer's, bit for bit.
    let replicated = ddp_model(&g, DType::F64)?;
    let sharded = ddp_model(&g, DType::F64)?;
    let mut ropt = adam_raw(replicated.parameters())?;
    let mut zopt = ShardedOptimizer::new(sharded.parameters(), g.clone(), adam_raw)?;
    train(&replicated, &mut ropt, rank, 0..3, DType::F64)?;
    train(&sharded, &mut zopt, rank, 0..3, DType::F64)?;
    let consolidated = zopt.consolidated_state_dict(0)?;
    ensure(consolidated.is_some() == (rank == 0), || {
        "the consolidated state dict belongs on rank 0 only".into()
    })?;
    if let Some(c) = consolidated {
        ensure(c == ropt.state_dict(), || {
            format!("consolidated {c:?}\nreplicated {:?}", ropt.state_dict())
        })?;
    }
    Ok(())
}

/// 3 steps without DDP: at step 1 rank 1 puts an inf into the gradient of parameter 0,
/// which rank 0 owns. Returns each step's gathered decisions.
fn zero_scaled_run(g: &Arc<dyn ProcessGroup>, fused: bool) -> Res<Vec<Vec<Vec<f64>>>> {
    let rank = g.rank();
    let model = Mlp::new(DType::F32, 5)?;
    let mut opt = ShardedOptimizer::new(model.parameters(), g.clone(), adam_raw)?;
    ensure(opt.owners()[0] == 0, || {
        format!("owners {:?}", opt.owners())
    })?;
    let opts = GradScalerOptions::default().init_scale(1024.0);
    let mut scaler = sharded_grad_scaler(opts, g.clone())?;
    let mut steps = Vec::new();
    for s in 0..3 {
        let (x, y) = local_batch(rank, s, DType::F32)?;
        opt.zero_grad();
        scaler.scale(&loss(&model, &x, &y)?)?.backward()?;
        if s == 1 && rank == 1 {
            let g0 = model.parameters()[0].grad().expect("a gradient");
            g0.data().narrow(0, 0, 1)?.fill_(f32::INFINITY)?;
        }
        if !fused {
            scaler.try_unscale_(&mut opt)?;
        }
        let outcome = scaler.step(&mut opt)?;
        scaler.update()?;
        steps.push(gather_decisions(&**g, outcome, &scaler)?);
    }
    ensure(replicas_identical(&**g, &model.parameters())?, || {
        "the ranks' parameters differ".into()
    })?;
    Ok(steps)
}

fn zero_scaler(g: Arc<dyn ProcessGroup>) -> Res {
    let want = [[0.0, 1024.0, 1.0], [1.0, 512.0, 0.0], [0.0, 512.0, 1.0]];
    for fused in [false, true] {
        let steps = zero_scaled_run(&g, fused)?;
        for (s, ranks) in steps.iter().enumerate() {
            ensure(ranks.iter().all(|d| *d == want[s]), || {
                format!(
                    "fused {fused}: step {s}: decisions {ranks:?}, want {:?} on every rank",
                    want[s]
                )
            })?;
        }
    }
    Ok(())
}

fn copy_params(from: &dyn Module, to: &dyn Module) -> Res {
    for (a, b) in from.parameters().iter().zip(to.parameters()) {
        b.data().copy_(a.data())?;
    }
    Ok(())
}

fn zero_checkpoint(g: Arc<dyn ProcessGroup>) -> Res {
    let rank = g.rank();
    let dtype = DType::F64;
    let original = ddp_model(&g, dtype)?;
    let mut opt = ShardedOptimizer::new(original.parameters(), g.clone(), adam_raw)?;
    train(&original, &mut opt, rank, 0..2, dtype)?;
    let shard_sd = opt.state_dict();
    // Consolidated onto each rank in turn, as a checkpoint file read by every rank.
    let mut consolidated: Option<OptimizerStateDict> = None;
    for to in 0..g.size() {
        if let Some(c) = opt.consolidated_state_dict(to)? {
            consolidated = Some(c);
        }
    }
    let consolidated = consolidated.ok_or("no consolidated state dict on this rank")?;
    // The consolidated one loads on a group of one as well.
    let single = Mlp::new(dtype, 1)?;
    copy_params(&original, &single)?;
    let mut one = ShardedOptimizer::new(single.parameters(), Arc::new(SingleProcess), adam_raw)?;
    one.load_consolidated_state_dict(&consolidated)?;
    ensure(one.state_dict() == consolidated, || {
        "the consolidated state dict did not load on one rank".into()
    })?;

    // A copy of the original model (its parameters after step 2) with a fresh
    // sharded Adam.
    let restart = || -> Res<(DistributedDataParallel<Mlp>, ShardedOptimizer<Adam>)> {
        let model = ddp_model(&g, dtype)?;
        copy_params(&original, &model)?;
        let opt = ShardedOptimizer::new(model.parameters(), g.clone(), adam_raw)?;
        Ok((model, opt))
    };
    let (from_shard, mut opt_shard) = restart()?;
    opt_shard.load_state_dict(&shard_sd)?;
    let (from_full, mut opt_full) = restart()?;
    opt_full.load_consolidated_state_dict(&consolidated)?;
    ensure(opt_full.state_dict() == shard_sd, || {
        "the consolidated state dict restored another shard".into()
    })?;
    // Without the state: a fresh Adam restarts its moments and lands elsewhere.
    let (fresh, mut opt_fresh) = restart()?;

    train(&original, &mut opt, rank, 2..4, dtype)?;
    train(&from_shard, &mut opt_shard, rank, 2..4, dtype)?;
    train(&from_full, &mut opt_full, rank, 2..4, dtype)?;
    train(&fresh, &mut opt_fresh, rank, 2..4, dtype)?;
    let want: Vec<Vec<f64>> = original
        .parameters()
        .iter()
        .map(Tensor::to_vec_f64)
        .collect();
    for (what, m) in [("shard", &from_shard), ("consolidated", &from_full)] {
        let got: Vec<Vec<f64>> = m.parameters().iter().map(Tensor::to_vec_f64).collect();
        ensure(got == want, || {
            format!("resumed from the {what} state dict: {got:?}\nwant {want:?}")
        })?;
    }
    let got: Vec<Vec<f64>> = fresh.parameters().iter().map(Tensor::to_vec_f64).collect();
    ensure(got != want, || {
        "a fresh optimizer resumed identically: the check is void".into()
    })
}

/// One synchronised backward of `model` on this rank's batch: the averaged gradients
/// and the statistics.
fn grads_and_stats(
    model: &DistributedDataParallel<Mlp>,
    rank: usize,
) -> Res<(Vec<f64>, CommStats)> {
    let (x, y) = local_batch(rank, 0, DType::F32)?;
    model.zero_grad();
    loss(model, &x, &y)?.backward()?;
    let g: Vec<f64> = model
        .parameters()
        .iter()
        .flat_map(|p| p.grad().map(|g| g.to_vec_f64()).unwrap_or_default())
        .collect();
    Ok((
        g,
        model
            .last_comm_stats()
            .ok_or("no communication statistics")?,
    ))
}

fn compression(g: Arc<dyn ProcessGroup>) -> Res {
    let rank = g.rank();
    let make = |compression| {
        let opts = DdpOptions {
            bucket_cap_bytes: 64,
            compression,
            ..Default::default()
        };
        DistributedDataParallel::with_options(Mlp::new(DType::F32, 9)?, g.clone(), opts)
            .map_err(Box::<dyn StdError>::from)
    };
    let (plain, s32) = grads_and_stats(&make(None)?, rank)?;
    let (bf16, s16) = grads_and_stats(&make(Some(DType::BF16))?, rank)?;
    let (f16, _) = grads_and_stats(&make(Some(DType::F16))?, rank)?;
    // The mean over the ranks of each local gradient's magnitude: each local gradient
    // is rounded once to 16 bits before the all-reduce, the average once after it.
    let local = Mlp::new(DType::F32, 9)?;
    let (x, y) = local_batch(rank, 0, DType::F32)?;
    loss(&local, &x, &y)?.backward()?;
    let mags: Vec<f64> = local
        .parameters()
        .iter()
        .flat_map(|p| p.grad().map(|g| g.to_vec_f64()).unwrap_or_default())
        .map(f64::abs)
        .collect();
    let mags = Raw::from_vec(mags, [plain.len()])?;
    g.all_reduce(&mags, ReduceOp::Avg)?;
    let mags = values(&mags);
    for (name, got, bits) in [("bfloat16", &bf16, 8), ("float16", &f16, 11)] {
        let ulp = 2f64.powi(-bits);
        let bad: Vec<(f64, f64)> = plain
            .iter()
            .zip(got.iter())
            .zip(&mags)
            .filter(|((a, b), m)| (*a - *b).abs() > ulp * (*m + a.abs()) + 1e-6)
            .map(|((a, b), _)| (*a, *b))
            .collect();
        ensure(bad.is_empty(), || {
            format!("{name}: outside its rounding: {bad:?}")
        })?;
        ensure(*got != plain, || {
            format!("{name}: equal to the uncompressed gradients")
        })?;
    }
    ensure(s32.buckets > 1 && s16.buckets == s32.buckets, || {
        format!("buckets: {s32:?} {s16:?}")
    })?;
    ensure(
        s16.bytes * 2 == s32.bytes && s32.bytes == plain.len() * 4,
        || {
            format!(
                "bytes: {} compressed, {} plain, {} gradients",
                s16.bytes,
                s32.bytes,
                plain.len()
            )
        },
    )?;
    for s in [s32, s16] {
        let share = s.overlap_share();
        ensure(
            s.overlapped <= s.in_flight && (0.0..=1.0).contains(&share),
            || format!("statistics out of range: {s:?} (share {share})"),
        )?;
    }
    ensure(
        replicas_identical(
            &*g,
            &[Tensor::from_raw(Raw::from_vec(bf16, [plain.len()])?)],
        )?,
        || "the compressed averages differ between the ranks".into(),
    )
}

/// The bench's perceptron: `widths[0] -> widths[1] -> ... ` with tanh between layers.
struct Wide {
    params: Vec<(String, Tensor)>,
}

impl Wide {
    fn new(widths: &[usize], seed: u64) -> Res<Wide> {
        let mut gen = Generator::new(seed);
        let mut params = Vec::new();
        for (l, w) in widths.windows(2).enumerate() {
            let scale = 1.0 / (w[0] as f64).sqrt();
            let weight = Tensor::randn([w[1], w[0]], DType::F32, &mut gen)?.mul_scalar(scale)?;
            let weight = Tensor::from_raw(weight.data().clone());
            let bias = Tensor::zeros([w[1]], DType::F32);
            for (name, t) in [("weight", weight), ("bias", bias)] {
                t.requires_grad_(true)?;
                params.push((format!("{}.{name}", 2 * l), t));
            }
        }
        Ok(Wide { params })
    }
}

impl Module for Wide {
    fn forward(&self, x: &Tensor) -> amp_autograd::Result<Tensor> {
        let layers = self.params.len() / 2;
        let mut h = x.clone();
        for l in 0..layers {
            h = ops::linear(&h, &self.params[2 * l].1, Some(&self.params[2 * l + 1].1))?;
            if l + 1 < layers {
                h = h.tanh()?;
            }
        }
        Ok(h)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.params.clone()
    }
}

/// Samples/s of DDP + Adam on a 256-1024-1024-64 perceptron, global batch 128 split over
/// the ranks, 4 warm-up steps and 20 timed ones (the slowest rank's time), for the
/// replicated optimizer and ZeRO-1, with and without bfloat16 compression; and the mean
/// overlap share of the timed steps. Printed by rank 0.
fn bench(g: Arc<dyn ProcessGroup>) -> Res {
    const WIDTHS: [usize; 4] = [256, 1024, 1024, 64];
    const BATCH: usize = 128;
    const WARMUP: usize = 4;
    const STEPS: usize = 20;
    let (rank, size) = (g.rank(), g.size());
    ensure(BATCH.is_multiple_of(size), || {
        format!("{size} ranks do not split {BATCH}")
    })?;
    let local = BATCH / size;
    let mut gen = Generator::new(77 + rank as u64);
    let x = Tensor::randn([local, WIDTHS[0]], DType::F32, &mut gen)?;
    let y = Tensor::randn([local, WIDTHS[3]], DType::F32, &mut gen)?;
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into());
    for zero_1 in [false, true] {
        for compression in [None, Some(DType::BF16)] {
            let opts = DdpOptions {
                bucket_cap_bytes: 1 << 20,
                compression,
                ..Default::default()
            };
            let model =
                DistributedDataParallel::with_options(Wide::new(&WIDTHS, 3)?, g.clone(), opts)?;
            let mut opt: Box<dyn Optimizer> = if zero_1 {
                Box::new(ShardedOptimizer::new(
                    model.parameters(),
                    g.clone(),
                    adam_raw,
                )?)
            } else {
                Box::new(adam_raw(model.parameters())?)
            };
            let (mut share, mut waited) = (0.0, Duration::ZERO);
            let mut start = Instant::now();
            for s in 0..WARMUP + STEPS {
                if s == WARMUP {
                    g.barrier()?;
                    start = Instant::now();
                }
                opt.zero_grad();
                loss(&model, &x, &y)?.backward()?;
                opt.step()?;
                if s >= WARMUP {
                    let st = model.last_comm_stats().ok_or("no statistics")?;
                    share += st.overlap_share() / STEPS as f64;
                    waited += st.waited / STEPS as u32;
                }
            }
            let took = Raw::from_vec(vec![start.elapsed().as_secs_f64()], [1])?;
            g.all_reduce(&took, ReduceOp::Max)?;
            let secs = values(&took)[0];
            let stats = model.last_comm_stats().ok_or("no statistics")?;
            if rank == 0 {
                println!(
                    "bench: {size} process(es), RAYON_NUM_THREADS={threads}, {} optimizer, compression {}: {:.0} samples/s ({:.2} ms/step), overlap share {:.2}, waited {:.3} ms/step, {} buckets, {} bytes reduced/step",
                    if zero_1 { "ZeRO-1 Adam" } else { "replicated Adam" },
                    compression.map_or("none".to_string(), |d| d.to_string()),
                    (BATCH * STEPS) as f64 / secs,
                    secs * 1e3 / STEPS as f64,
                    share,
                    waited.as_secs_f64() * 1e3,
                    stats.buckets,
                    stats.bytes,
                );
            }
        }
    }
    Ok(())
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
