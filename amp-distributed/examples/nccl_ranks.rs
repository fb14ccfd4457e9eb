//! The NCCL checks of `amp-distributed`, one process per rank and GPU.
//!
//! `nccl_ranks --world N [--force]` is the launcher: it makes the communicator's id,
//! starts N copies of itself (`--rank r --world N --id HEX`), rank r on GPU
//! `r % device_count`, waits for them (with a deadline), prints each rank's result and a
//! final `PASS`, `SKIPPED` or `FAIL` line; the exit status is non-zero on failure.
//!
//! NCCL refuses two ranks on one GPU (`ncclInvalidUsage`, "Duplicate GPU detected"), so
//! with fewer GPUs than ranks the launcher reports the run as skipped without starting
//! it; `--force` starts it anyway and reports NCCL's typed error (still a skip when it
//! is that refusal).
//!
//! Each rank checks, against values it computes on the host: all-reduce (sum, max,
//! average) in float32, float64, bfloat16 and float16 with rank-dependent inputs (a
//! non-contiguous view too), broadcast from root 1 (root 0 alone), all-gather, barrier,
//! non-blocking all-reduces waited out of order, the typed refusals (a host tensor, an
//! integer tensor); `DistributedDataParallel` on a small MLP on the GPU (after SGD
//! steps every rank's parameters equal rank 0's bit for bit and a one-process run on the
//! whole batch within float32 rounding); the sharded `GradScaler` (an inf in rank
//! N-1's gradient makes every rank skip the step and back off the scale). With N >= 2
//! and a GPU per rank, a second launch checks a dead rank: rank 1 leaves, rank 0's next
//! all-reduce fails within a short timeout instead of hanging.

use std::error::Error as StdError;
use std::process::{Child, Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amp_autograd::{ops, Reduction, Tensor};
use amp_distributed::{
    sharded_grad_scaler, DdpOptions, DistributedDataParallel, Error, Nccl, NcclId, ProcessGroup,
    ReduceOp,
};
use amp_nn::Module;
use amp_optim::{Optimizer, Sgd, SgdOptions};
use amp_scaler::{GradScaler, GradScalerOptions, StepOutcome};
use amp_tensor::{DType, Device, Generator, Tensor as Raw};

type Res<T = ()> = Result<T, Box<dyn StdError>>;
/// One check a rank runs on the group.
type Check = fn(&Arc<dyn ProcessGroup>) -> Res;

/// A rank's exit status when NCCL refused ranks sharing a GPU.
const EXIT_SHARED_GPU: u8 = 3;
/// How long the launcher waits for its ranks.
const DEADLINE: Duration = Duration::from_secs(240);

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Res {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// The command line: `--world N`, and for a rank `--rank r --id HEX [--dead]`.
#[derive(Debug, Default)]
struct Args {
    world: usize,
    rank: Option<usize>,
    id: Option<String>,
    force: bool,
    dead: bool,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args::default();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{v:?}: {e}"));
        match flag.as_str() {
            "--world" => a.world = number(value("--world")?)?,
            "--rank" => a.rank = Some(number(value("--rank")?)?),
            "--id" => a.id = Some(value("--id")?),
            "--force" => a.force = true,
            "--dead" => a.dead = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.world == 0 {
        return Err("usage: nccl_ranks --world N [--force]".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nccl_ranks: {e}");
            return ExitCode::from(2);
        }
    };
    match (args.rank, &args.id) {
        (Some(rank), Some(id)) => run_rank(rank, args.world, id, args.dead),
        (None, None) => launch_all(&args),
        _ => {
            eprintln!("nccl_ranks: --rank and --id go together");
            ExitCode::from(2)
        }
    }
}

// ----- the launcher -----------------------------------------------------------------

fn launch_all(args: &Args) -> ExitCode {
    let n = args.world;
    let gpus = match amp_tensor::cuda::device_count() {
        Ok(g) if g > 0 => g,
        Ok(_) => return fail("no CUDA device"),
        Err(e) => return fail(&format!("no CUDA device: {e}")),
    };
    match Nccl::version() {
        Ok(v) => println!("NCCL {v}, {gpus} GPU(s), {n} rank(s)"),
        Err(e) => return fail(&e.to_string()),
    }
    if n > gpus && !args.force {
        println!("skipped: NCCL needs one GPU per rank ({n} ranks, {gpus} GPUs)");
        println!("SKIPPED");
        return ExitCode::SUCCESS;
    }
    let statuses = match launch(n, false) {
        Ok(s) => s,
        Err(e) => return fail(&e.to_string()),
    };
    if n > gpus {
        // --force with shared GPUs: NCCL's refusal is the expected outcome.
        if statuses
            .iter()
            .all(|s| *s == Some(i32::from(EXIT_SHARED_GPU)))
        {
            println!("skipped: NCCL refused {n} ranks on {gpus} GPU(s) (ncclInvalidUsage, printed by each rank above)");
            println!("SKIPPED");
            return ExitCode::SUCCESS;
        }
    }
    let mut ok = report("checks", &statuses);
    if n >= 2 && n <= gpus {
        match launch(n, true) {
            Ok(s) => ok &= report("dead rank", &s),
            Err(e) => {
                eprintln!("dead rank: {e}");
                ok = false;
            }
        }
    }
    if ok {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!("FAIL");
        ExitCode::FAILURE
    }
}

fn fail(why: &str) -> ExitCode {
    println!("FAIL: {why}");
    ExitCode::FAILURE
}

/// Print each rank's exit status; `true` when all succeeded.
fn report(what: &str, statuses: &[Option<i32>]) -> bool {
    for (r, s) in statuses.iter().enumerate() {
        match s {
            Some(0) => println!("{what}: rank {r} passed"),
            Some(c) => println!("{what}: rank {r} FAILED (exit {c})"),
            None => println!("{what}: rank {r} FAILED (killed after {DEADLINE:?} or by a signal)"),
        }
    }
    statuses.iter().all(|s| *s == Some(0))
}

/// Start `n` ranks with a fresh id and wait for them (killed at the deadline): their
/// exit codes (`None`: killed, by the deadline or a signal).
fn launch(n: usize, dead: bool) -> Res<Vec<Option<i32>>> {
    let id = NcclId::new()?.to_hex();
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--rank",
            &r.to_string(),
            "--world",
            &n.to_string(),
            "--id",
            &id,
        ]);
        if dead {
            cmd.arg("--dead");
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("starting rank {r}: {e}").into());
            }
        }
    }
    let start = Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; n];
    while codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(&mut codes) {
            if code.is_none() {
                if let Some(s) = c.try_wait()? {
                    *code = Some(s.code());
                }
            }
        }
        if start.elapsed() > DEADLINE {
            for (c, code) in children.iter_mut().zip(&mut codes) {
                if code.is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                    *code = Some(None);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(codes.into_iter().map(|c| c.flatten()).collect())
}

// ----- a rank -----------------------------------------------------------------------

fn run_rank(rank: usize, world: usize, id: &str, dead_scenario: bool) -> ExitCode {
    let gpus = amp_tensor::cuda::device_count().unwrap_or(1).max(1);
    let device = Device::Cuda(rank % gpus);
    let timeout = Duration::from_secs(if dead_scenario { 5 } else { 120 });
    let group = match NcclId::from_hex(id)
        .and_then(|id| Nccl::init(rank, world, &id, device, Duration::from_secs(120)))
    {
        Ok(g) => Arc::new(g.with_timeout(timeout)),
        Err(e) => {
            println!("rank {rank}: init on {device} failed: {e}");
            if let Error::Nccl { source, .. } = &e {
                if source.is_invalid_usage() && world > gpus {
                    return ExitCode::from(EXIT_SHARED_GPU);
                }
            }
            return ExitCode::FAILURE;
        }
    };
    let g: Arc<dyn ProcessGroup> = group;
    let checks: &[(&str, Check)] = if dead_scenario {
        &[("dead rank", dead)]
    } else {
        &[
            ("all_reduce", all_reduce),
            ("broadcast", broadcast),
            ("all_gather", all_gather),
            ("barrier", barrier),
            ("non-blocking", non_blocking),
            ("refusals", refusals),
            ("ddp", ddp),
            ("scaler", scaler),
        ]
    };
    for (name, check) in checks {
        match check(&g) {
            Ok(()) => println!("rank {rank}: {name} ok"),
            Err(e) => {
                println!("rank {rank}: {name} FAILED: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// `t`'s values, read back to the host.
fn values(t: &Raw) -> Vec<f64> {
    t.to_vec_f64()
}

fn on(g: &Arc<dyn ProcessGroup>, t: Raw) -> Res<Raw> {
    Ok(t.to_device(g.device())?)
}

/// Rank `r`'s all-reduce input in `dtype` (exact small dyadic values, so the sum does
/// not depend on NCCL's order; the last one is not a bfloat16 after averaging).
fn reduce_input(r: usize, dtype: DType) -> Res<Raw> {
    let r = r as f64;
    let v = vec![
        r + 1.0,
        -(r + 1.0) / 2.0,
        3.0,
        1.0 + (r % 2.0) / 128.0,
        -r * 0.25,
    ];
    Ok(Raw::from_vec(v, [5])?.to_dtype(dtype)?)
}

/// The contract, on the host: every rank's input widened (float32, or float64), summed
/// or maxed in rank order, averaged by a division in the wide type, rounded once.
fn expected(n: usize, dtype: DType, op: ReduceOp) -> Res<Vec<f64>> {
    let wide = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let inputs: Vec<Vec<f64>> = (0..n)
        .map(|r| Ok(values(&reduce_input(r, dtype)?)))
        .collect::<Res<_>>()?;
    let combine = |f: &dyn Fn(f64, f64) -> f64| -> Vec<f64> {
        (0..inputs[0].len())
            .map(|i| inputs[1..].iter().fold(inputs[0][i], |acc, x| f(acc, x[i])))
            .collect()
    };
    // The values are exact in the wide type, so f64 arithmetic then a rounding to it
    // is the wide arithmetic; the division rounds once in the wide type.
    let combined = match op {
        ReduceOp::Max => combine(&f64::max),
        _ => combine(&|a, b| a + b),
    };
    let mut w = Raw::from_vec(combined, [5])?.to_dtype(wide)?;
    if op == ReduceOp::Avg {
        w = amp_kernels::binary_scalar(amp_kernels::BinaryOp::Div, &w, n as f64)?;
    }
    Ok(values(&w.to_dtype(dtype)?))
}

fn all_reduce(g: &Arc<dyn ProcessGroup>) -> Res {
    let (r, n) = (g.rank(), g.size());
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            let want = expected(n, dtype, op)?;
            let t = on(g, reduce_input(r, dtype)?)?;
            g.all_reduce(&t, op)?;
            ensure(t.dtype() == dtype && values(&t) == want, || {
                format!("{dtype} {op:?}: {:?}, want {want:?}", values(&t))
            })?;
            // A non-contiguous view of a bigger buffer: reduced through a copy, written
            // back into the view only.
            let base = on(g, Raw::full([5, 2], 7.0, dtype))?;
            base.narrow(1, 0, 1)?
                .copy_(&on(g, reduce_input(r, dtype)?.reshape([5, 1])?)?)?;
            let view = base.narrow(1, 0, 1)?;
            g.all_reduce(&view, op)?;
            let got = values(&base.t()?.contiguous());
            ensure(got[..5] == want[..] && got[5..] == [7.0; 5], || {
                format!("{dtype} {op:?} (a strided view): {got:?}, want {want:?} then 7s")
            })?;
        }
    }
    Ok(())
}

fn broadcast(g: &Arc<dyn ProcessGroup>) -> Res {
    let root = usize::from(g.size() > 1);
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let t = on(g, Raw::full([2, 2], g.rank() as f64 + 0.5, dtype))?;
        g.broadcast(&t, root)?;
        ensure(values(&t) == vec![root as f64 + 0.5; 4], || {
            format!("{dtype} broadcast from {root}: {:?}", values(&t))
        })?;
    }
    Ok(())
}

fn all_gather(g: &Arc<dyn ProcessGroup>) -> Res {
    let r = g.rank() as f64;
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let outs: Vec<Raw> = (0..g.size())
            .map(|_| Raw::zeros_on([2], dtype, g.device()))
            .collect::<Result<_, _>>()?;
        g.all_gather(
            &outs,
            &on(g, Raw::from_vec(vec![r, 10.0 * r], [2])?.to_dtype(dtype)?)?,
        )?;
        for (i, o) in outs.iter().enumerate() {
            let i = i as f64;
            ensure(values(o) == vec![i, 10.0 * i], || {
                format!("{dtype} all_gather [{i}]: {:?}", values(o))
            })?;
        }
    }
    Ok(())
}

fn barrier(g: &Arc<dyn ProcessGroup>) -> Res {
    Ok(g.barrier()?)
}

fn non_blocking(g: &Arc<dyn ProcessGroup>) -> Res {
    let (r, n) = (g.rank() as f64, g.size() as f64);
    let a = on(g, Raw::full([4], r, DType::F32))?;
    let b = on(g, Raw::full([4], 1.0, DType::F64))?;
    let wa = g.all_reduce_async(&a, ReduceOp::Max)?;
    let mut wb = g.all_reduce_async(&b, ReduceOp::Sum)?;
    let start = Instant::now();
    while !wb.is_completed()? {
        ensure(start.elapsed() < g.timeout(), || "never completed".into())?;
    }
    wa.wait()?;
    ensure(
        values(&a) == vec![n - 1.0; 4] && values(&b) == vec![n; 4],
        || format!("non-blocking: {:?} {:?}", values(&a), values(&b)),
    )
}

fn refusals(g: &Arc<dyn ProcessGroup>) -> Res {
    // Refused before anything is queued (every rank refuses alike).
    let e = g
        .all_reduce(&Raw::ones([2], DType::F32), ReduceOp::Sum)
        .unwrap_err();
    ensure(
        matches!(
            e,
            Error::WrongDevice {
                got: Device::Cpu,
                ..
            }
        ) && e.to_string().contains("Tensors must be CUDA and dense"),
        || format!("host all_reduce: {e}"),
    )?;
    let e = g
        .all_reduce(&Raw::zeros_on([1], DType::I32, g.device())?, ReduceOp::Sum)
        .unwrap_err();
    ensure(matches!(e, Error::UnsupportedDtype { .. }), || {
        format!("int32 all_reduce: {e}")
    })?;
    // The group still works.
    Ok(g.barrier()?)
}

/// A two-layer perceptron on `device`, initialised from `seed`.
struct Mlp {
    params: Vec<(String, Tensor)>,
}

impl Mlp {
    fn new(seed: u64, device: Device) -> Res<Mlp> {
        let mut gen = Generator::new(seed);
        let mut params = Vec::new();
        for (name, shape) in [
            ("0.weight", vec![8, 3]),
            ("0.bias", vec![8]),
            ("2.weight", vec![2, 8]),
            ("2.bias", vec![2]),
        ] {
            let t = Raw::randn(shape, DType::F32, &mut gen)?.to_device(device)?;
            params.push((name.to_string(), Tensor::parameter(t)?));
        }
        Ok(Mlp { params })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> amp_autograd::Result<Tensor> {
        let p = |i: usize| &self.params[i].1;
        let h = ops::linear(x, p(0), Some(p(1)))?.relu()?;
        ops::linear(&h, p(2), Some(p(3)))
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.params.clone()
    }
}

fn loss(model: &dyn Module, x: &Tensor, y: &Tensor) -> Res<Tensor> {
    Ok(ops::mse_loss(&model.forward(x)?, y, Reduction::Mean)?)
}

/// Rows `start..start + len` of `t`.
fn rows(t: &Tensor, start: usize, len: usize) -> Res<Tensor> {
    Ok(Tensor::from_raw(
        t.data().narrow(0, start, len)?.try_contiguous()?,
    ))
}

fn ddp(g: &Arc<dyn ProcessGroup>) -> Res {
    const STEPS: usize = 4;
    let (rank, size, dev) = (g.rank(), g.size(), g.device());
    let batch = 4 * size;
    let mut data = Generator::new(7);
    let up = |t: Raw| -> Res<Tensor> { Ok(Tensor::from_raw(t.to_device(dev)?)) };
    let xs: Vec<Tensor> = (0..STEPS)
        .map(|_| up(Raw::randn([batch, 3], DType::F32, &mut data)?))
        .collect::<Res<_>>()?;
    let ys: Vec<Tensor> = (0..STEPS)
        .map(|_| up(Raw::randn([batch, 2], DType::F32, &mut data)?))
        .collect::<Res<_>>()?;
    // One process on the whole batch, on the same GPU.
    let reference = Mlp::new(100, dev)?;
    // Every rank starts from its own weights: DDP's broadcast makes them rank 0's.
    let opts = DdpOptions {
        bucket_cap_bytes: 64,
        ..Default::default()
    };
    let model =
        DistributedDataParallel::with_options(Mlp::new(100 + rank as u64, dev)?, g.clone(), opts)?;
    ensure(model.num_buckets() > 1, || {
        "expected several buckets".into()
    })?;
    let mut ref_opt = Sgd::new(reference.parameters(), 0.1, SgdOptions::default())?;
    let mut opt = Sgd::new(model.parameters(), 0.1, SgdOptions::default())?;
    for s in 0..STEPS {
        reference.zero_grad();
        loss(&reference, &xs[s], &ys[s])?.backward()?;
        ref_opt.step()?;
        model.zero_grad();
        let (x, y) = (rows(&xs[s], rank * 4, 4)?, rows(&ys[s], rank * 4, 4)?);
        loss(&model, &x, &y)?.backward()?;
        opt.step()?;
    }
    // Within float32 rounding of one process (the mean over the batch is summed in
    // another order); the parameters are of order 1.
    for (p, q) in model.parameters().iter().zip(reference.parameters()) {
        let d = p
            .to_vec_f64()
            .iter()
            .zip(q.to_vec_f64())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        ensure(d <= 1e-5, || {
            format!("{size} ranks differ from one process by {d:e}")
        })?;
    }
    // The replicas are identical, bit for bit.
    for p in model.parameters() {
        let all: Vec<Raw> = (0..size)
            .map(|_| Raw::zeros_on(p.dims(), DType::F32, dev))
            .collect::<Result<_, _>>()?;
        g.all_gather(&all, p.data())?;
        let mine: Vec<u32> = p
            .data()
            .to_vec::<f32>()?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        for (r, o) in all.iter().enumerate() {
            let theirs: Vec<u32> = o.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect();
            ensure(theirs == mine, || {
                format!("rank {r}'s parameters differ from rank {rank}'s")
            })?;
        }
    }
    Ok(())
}

/// Each rank's `[skipped, scale, growth tracker]`, gathered.
fn gather_decisions(
    g: &Arc<dyn ProcessGroup>,
    outcome: StepOutcome,
    s: &GradScaler,
) -> Res<Vec<Vec<f64>>> {
    let skipped = f64::from(u8::from(outcome.is_skipped()));
    let mine = on(
        g,
        Raw::from_vec(
            vec![skipped, s.get_scale(), s.get_growth_tracker() as f64],
            [3],
        )?,
    )?;
    let all: Vec<Raw> = (0..g.size())
        .map(|_| Raw::zeros_on([3], DType::F64, g.device()))
        .collect::<Result<_, _>>()?;
    g.all_gather(&all, &mine)?;
    Ok(all.iter().map(values).collect())
}

/// Train 3 steps, each rank checking only its own gradients; at step 1 rank N-1's first
/// gradient gets an inf. Each step's gathered decisions.
fn scaled_run(g: &Arc<dyn ProcessGroup>, mut scaler: GradScaler) -> Res<Vec<Vec<Vec<f64>>>> {
    let (rank, dev) = (g.rank(), g.device());
    let model = Mlp::new(5, dev)?;
    let mut opt = Sgd::new(model.parameters(), 0.1, SgdOptions::default())?;
    let mut data = Generator::new(11 + rank as u64);
    let mut steps = Vec::new();
    for s in 0..3 {
        let x = Tensor::from_raw(Raw::randn([4, 3], DType::F32, &mut data)?.to_device(dev)?);
        let y = Tensor::from_raw(Raw::randn([4, 2], DType::F32, &mut data)?.to_device(dev)?);
        model.zero_grad();
        scaler.scale(&loss(&model, &x, &y)?)?.backward()?;
        if s == 1 && rank == g.size() - 1 {
            let g0 = model.parameters()[0].grad().ok_or("no gradient")?;
            g0.data().narrow(0, 0, 1)?.fill_(f32::INFINITY)?;
        }
        let outcome = scaler.step(&mut opt)?;
        scaler.update()?;
        steps.push(gather_decisions(g, outcome, &scaler)?);
    }
    Ok(steps)
}

fn scaler(g: &Arc<dyn ProcessGroup>) -> Res {
    let opts = GradScalerOptions::default().init_scale(1024.0);
    let steps = scaled_run(g, sharded_grad_scaler(opts.clone(), g.clone())?)?;
    let want = [[0.0, 1024.0, 1.0], [1.0, 512.0, 0.0], [0.0, 512.0, 1.0]];
    for (s, (ranks, w)) in steps.iter().zip(want).enumerate() {
        ensure(ranks.iter().all(|d| *d == w), || {
            format!("step {s}: every rank should decide {w:?}: {ranks:?}")
        })?;
    }
    if g.size() > 1 {
        // The control: without the reduction, rank 0 steps where rank N-1 skips.
        let steps = scaled_run(g, GradScaler::with_options(opts)?)?;
        ensure(
            steps[1][0][0] == 0.0 && steps[1][g.size() - 1][0] == 1.0,
            || format!("without the reduction the ranks should diverge at step 1: {steps:?}"),
        )?;
    }
    Ok(())
}

fn dead(g: &Arc<dyn ProcessGroup>) -> Res {
    g.barrier()?;
    if g.rank() == 1 {
        // Leave without taking part in anything more.
        println!("rank 1: leaving");
        std::process::exit(0);
    }
    if g.rank() != 0 {
        return Ok(());
    }
    let t = on(g, Raw::ones([4], DType::F32))?;
    let start = Instant::now();
    let e = g.all_reduce(&t, ReduceOp::Sum).unwrap_err();
    let took = start.elapsed();
    // A timeout, or NCCL noticing the dead peer first (a remote or system error).
    let noticed = match &e {
        Error::Timeout { .. } => true,
        Error::Nccl { source, .. } => matches!(source.code(), 2 | 6),
        _ => false,
    };
    ensure(noticed, || format!("expected a timeout, got {e}"))?;
    ensure(took < g.timeout() * 4, || {
        format!("failed after {took:?} (timeout {:?})", g.timeout())
    })?;
    let e2 = g.barrier().unwrap_err();
    ensure(matches!(e2, Error::GroupFailed { .. }), || {
        format!("after the failure: {e2}")
    })?;
    println!("rank 0: {e} (after {took:.1?})");
    Ok(())
}
