//! A run stopped at a checkpoint and resumed from it continues bit for bit: model
//! parameters and buffers (safetensors; a batch norm's running statistics and its int64
//! batch count), optimizer state (Adam moments, step counts) and scaler state (scale,
//! growth tracker) all come back exactly.

use amp::checkpoint;
use amp::prelude::*;

struct Run {
    model: Sequential,
    opt: Adam,
    scaler: GradScaler,
}

fn fresh(seed: u64) -> Run {
    let mut gen = Generator::new(seed);
    let model = Sequential::new()
        .add(Linear::new(6, 16, &mut gen).unwrap())
        .add(BatchNorm1d::new(16).unwrap())
        .add(Tanh)
        .add(Linear::new(16, 3, &mut gen).unwrap());
    let opt = Adam::new(model.parameters(), 1e-2, AdamOptions::default()).unwrap();
    // Small growth interval and a huge initial scale: the scale both backs off (inf
    // gradients in bfloat16 are impossible, so an inf is injected below) and grows.
    let scaler = GradScaler::with_options(
        GradScalerOptions::default()
            .init_scale(2f64.powi(20))
            .growth_interval(3),
    )
    .unwrap();
    Run { model, opt, scaler }
}

/// The batch of step `i`; step 4 carries an infinite input, so its step is skipped.
fn batch(i: usize) -> (Tensor, Tensor) {
    let mut gen = Generator::new(100 + i as u64);
    let mut x = Tensor::randn([8, 6], DType::F32, &mut gen).unwrap();
    if i == 4 {
        let mut v = x.to_vec::<f32>().unwrap();
        v[5] = f32::INFINITY;
        x = Tensor::from_vec(v, [8, 6]).unwrap();
    }
    let y = Tensor::randn([8, 3], DType::F32, &mut gen).unwrap();
    (x, y)
}

fn step(run: &mut Run, i: usize) {
    let (x, y) = batch(i);
    run.opt.zero_grad();
    let loss = autocast(DeviceType::Cpu, DType::BF16, || {
        ops::mse_loss(&run.model.forward(&x)?, &y, Reduction::Mean)
    })
    .unwrap()
    .unwrap();
    run.scaler.scale(&loss).unwrap().backward().unwrap();
    run.scaler.step(&mut run.opt).unwrap();
    run.scaler.update().unwrap();
}

/// Every parameter and buffer, by name, as bits (float32 values as their bits, the
/// int64 batch count as itself).
fn bits(run: &Run) -> Vec<(String, Vec<u64>)> {
    run.model
        .named_state()
        .into_iter()
        .map(|(name, t)| {
            let v = match t.dtype() {
                DType::I64 => t
                    .to_vec::<i64>()
                    .unwrap()
                    .iter()
                    .map(|&v| v as u64)
                    .collect(),
                _ => t
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| u64::from(v.to_bits()))
                    .collect(),
            };
            (name, v)
        })
        .collect()
}

#[test]
fn resumed_run_continues_bit_for_bit() {
    let (total, stop) = (10, 6);
    let mut straight = fresh(7);
    for i in 0..total {
        step(&mut straight, i);
    }

    let dir = std::env::temp_dir().join(format!("amp-ckpt-test-{}", std::process::id()));
    let mut first = fresh(7);
    for i in 0..stop {
        step(&mut first, i);
    }
    checkpoint::save(&dir, &first.model, &first.opt, &first.scaler).unwrap();
    drop(first);

    // A different seed: everything that matters must come from the checkpoint.
    let mut resumed = fresh(99);
    checkpoint::load(&dir, &resumed.model, &mut resumed.opt, &mut resumed.scaler).unwrap();
    for i in stop..total {
        step(&mut resumed, i);
    }
    std::fs::remove_dir_all(&dir).ok();

    let (b, keys) = (
        bits(&resumed),
        ["1.running_mean", "1.running_var", "1.num_batches_tracked"],
    );
    for k in keys {
        assert!(b.iter().any(|(n, _)| n == k), "{k} is saved and restored");
    }
    assert_eq!(b, bits(&straight));
    assert_eq!(resumed.scaler.get_scale(), straight.scaler.get_scale());
    assert_eq!(
        resumed.scaler.state_dict_json(),
        straight.scaler.state_dict_json()
    );
    assert_eq!(
        serde_json::to_string(&resumed.opt.state_dict()).unwrap(),
        serde_json::to_string(&straight.opt.state_dict()).unwrap()
    );
}

/// The training loop's own state rides in the manifest: given back by `load_with_meta`,
/// absent (`None`) from a checkpoint saved without it, and replaced by the next save.
#[test]
fn the_loops_state_is_committed_with_the_checkpoint() {
    let dir = std::env::temp_dir().join(format!("amp-ckpt-meta-{}", std::process::id()));
    let mut run = fresh(3);
    step(&mut run, 0);
    let meta = serde_json::json!({"step": 1, "history": [0.5, 0.25], "run": "bfloat16"});
    checkpoint::save_with_meta(&dir, &run.model, &run.opt, &run.scaler, &meta).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(checkpoint::MANIFEST)).unwrap()).unwrap();
    assert_eq!(manifest["meta"], meta);

    let mut other = fresh(4);
    let got =
        checkpoint::load_with_meta(&dir, &other.model, &mut other.opt, &mut other.scaler).unwrap();
    assert_eq!(got, Some(meta));
    assert_eq!(bits(&other), bits(&run));

    checkpoint::save(&dir, &run.model, &run.opt, &run.scaler).unwrap();
    let got =
        checkpoint::load_with_meta(&dir, &other.model, &mut other.opt, &mut other.scaler).unwrap();
    assert_eq!(got, None);
    std::fs::remove_dir_all(&dir).ok();
}
