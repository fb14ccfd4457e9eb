//! Training on a CUDA device: an MLP under float16 autocast with a `GradScaler`, against
//! the same MLP trained in float32 on the host. Skips (printing why) without a device;
//! a GPU session runs it from the `gpu-bundle` (`cargo xtask gpu-bundle`).
#![cfg(feature = "cuda")]

use amp::autograd::{ops, Reduction, Tensor};
use amp::prelude::*;
use amp::tensor::Tensor as Raw;

const DEV: Device = Device::Cuda(0);

fn device_or_skip(test: &str) -> bool {
    if let Err(e) = amp::tensor::cuda::ensure_device(DEV, &[amp::tensor::cuda::Library::Driver]) {
        eprintln!("SKIPPED {test}: {e}");
        return false;
    }
    true
}

/// A 2-layer MLP (`in → hidden → ReLU → out`) with the same initial values on `device`.
struct Mlp {
    l1: Linear,
    l2: Linear,
}

impl Mlp {
    fn new(device: Device) -> Mlp {
        let mut g = Generator::new(7);
        let move_to = |l: Linear| {
            let p = |t: &Tensor| Tensor::parameter(t.data().to_device(device).unwrap()).unwrap();
            Linear::from_parts(p(&l.weight), l.bias.as_ref().map(p))
        };
        Mlp {
            l1: move_to(Linear::new(32, 64, &mut g).unwrap()),
            l2: move_to(Linear::new(64, 8, &mut g).unwrap()),
        }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.l1.forward(x).unwrap().relu().unwrap();
        self.l2.forward(&h).unwrap()
    }
    fn params(&self) -> Vec<Tensor> {
        [self.l1.parameters(), self.l2.parameters()].concat()
    }
}

fn data(device: Device) -> (Tensor, Tensor) {
    let mut g = Generator::new(11);
    let x = Raw::randn([128, 32], DType::F32, &mut g).unwrap();
    let w = Raw::randn([32, 8], DType::F32, &mut g).unwrap();
    let y = amp::kernels::mm(&x, &w).unwrap();
    let up = |t: Raw| Tensor::from_raw(t.to_device(device).unwrap());
    (up(x), up(y))
}

/// `steps` steps of `opt` on the MLP, with float16 autocast and a scaler when `amp`;
/// the losses, the scales and the final parameters (on the host).
fn train(
    device: Device,
    amp: bool,
    adam: bool,
    steps: usize,
) -> (Vec<f64>, Vec<f64>, Vec<Vec<f64>>) {
    let model = Mlp::new(device);
    let (x, y) = data(device);
    let mut opt: Box<dyn Optimizer> = if adam {
        Box::new(Adam::new(model.params(), 1e-3, AdamOptions::default()).unwrap())
    } else {
        Box::new(
            Sgd::new(
                model.params(),
                0.02,
                SgdOptions {
                    momentum: 0.9,
                    ..SgdOptions::default()
                },
            )
            .unwrap(),
        )
    };
    let mut scaler = GradScaler::with_options(GradScalerOptions::default().enabled(amp)).unwrap();
    let (mut losses, mut scales) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        opt.zero_grad();
        let loss = if amp {
            let out = autocast(DeviceType::Cuda, DType::F16, || model.forward(&x)).unwrap();
            assert_eq!(
                out.dtype(),
                DType::F16,
                "linear runs in float16 under CUDA autocast"
            );
            ops::mse_loss(&out, &y, Reduction::Mean).unwrap()
        } else {
            ops::mse_loss(&model.forward(&x), &y, Reduction::Mean).unwrap()
        };
        assert_eq!(loss.device(), device);
        losses.push(loss.item_f64().unwrap());
        let reads = amp::tensor::host_reads();
        scaler.scale(&loss).unwrap().backward().unwrap();
        scaler.step(opt.as_mut()).unwrap();
        scaler.update().unwrap();
        if amp && !device.is_cpu() {
            // The scale and found_inf stay on the device: one read per step, the skip.
            assert!(
                amp::tensor::host_reads() - reads <= 1,
                "host reads per step"
            );
        }
        scales.push(scaler.get_scale());
    }
    let params = model
        .params()
        .iter()
        .map(|p| p.data().to_vec_f64())
        .collect();
    (losses, scales, params)
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: cuda {x} vs cpu {y}"
        );
    }
}

#[test]
fn mlp_trains_on_cuda_as_on_the_host() {
    if !device_or_skip("mlp_trains_on_cuda_as_on_the_host") {
        return;
    }
    for adam in [false, true] {
        let opt = if adam { "adam" } else { "sgd" };
        let (cpu_loss, _, cpu_params) = train(Device::Cpu, false, adam, 30);
        // float32 on the device: the host run up to summation order.
        let (f32_loss, _, f32_params) = train(DEV, false, adam, 30);
        close(&f32_loss, &cpu_loss, 1e-4, &format!("{opt} f32 losses"));
        for (a, b) in f32_params.iter().zip(&cpu_params) {
            close(a, b, 1e-3, &format!("{opt} f32 params"));
        }
        // float16 autocast + GradScaler: the same descent within float16's precision.
        let (amp_loss, scales, _) = train(DEV, true, adam, 30);
        close(&amp_loss, &cpu_loss, 2e-2, &format!("{opt} amp losses"));
        assert!(amp_loss[29] < amp_loss[0], "{opt}: {amp_loss:?}");
        assert!(
            scales.iter().all(|&s| s == 65536.0),
            "{opt} scales {scales:?}"
        );
        eprintln!(
            "{opt}: cpu f32 loss {:.5} -> {:.5}, cuda amp {:.5} -> {:.5}",
            cpu_loss[0], cpu_loss[29], amp_loss[0], amp_loss[29]
        );
    }
}

#[test]
fn an_overflow_on_cuda_skips_the_step_and_backs_off_the_scale() {
    if !device_or_skip("an_overflow_on_cuda_skips_the_step_and_backs_off_the_scale") {
        return;
    }
    let model = Mlp::new(DEV);
    let (x, y) = data(DEV);
    let mut opt = Sgd::new(model.params(), 0.1, SgdOptions::default()).unwrap();
    let mut scaler = GradScaler::new();
    let before: Vec<Vec<f64>> = model
        .params()
        .iter()
        .map(|p| p.data().to_vec_f64())
        .collect();
    let out = autocast(DeviceType::Cuda, DType::F16, || model.forward(&x)).unwrap();
    let loss = ops::mse_loss(&out, &y, Reduction::Mean).unwrap();
    // An inf in the loss makes every gradient non-finite.
    let loss = loss.mul_scalar(f64::INFINITY).unwrap();
    scaler.scale(&loss).unwrap().backward().unwrap();
    let outcome = scaler.step(&mut opt).unwrap();
    scaler.update().unwrap();
    assert_eq!(outcome, StepOutcome::Skipped);
    let after: Vec<Vec<f64>> = model
        .params()
        .iter()
        .map(|p| p.data().to_vec_f64())
        .collect();
    assert_eq!(
        before, after,
        "a skipped step leaves the parameters untouched"
    );
    assert_eq!(scaler.get_scale(), 32768.0);
    // The state dict has the host scaler's keys, order and types.
    let host = GradScaler::new();
    let keys = |v: serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(scaler.state_dict_json()), keys(host.state_dict_json()));
}

/// A one-layer causal transformer language model (the main job's shape, small).
struct TinyGpt {
    emb: Embedding,
    layer: TransformerEncoderLayer,
    ln: LayerNorm,
    head: Linear,
}

impl TinyGpt {
    fn new(device: Device) -> TinyGpt {
        let mut g = Generator::new(3);
        let opts = TransformerEncoderLayerOptions {
            dim_feedforward: 32,
            dropout: 0.0,
            activation: Activation::Gelu,
            batch_first: true,
            norm_first: true,
            ..TransformerEncoderLayerOptions::new(16, 2)
        };
        let m = TinyGpt {
            emb: Embedding::from_pretrained(
                Tensor::parameter(Raw::randn([11, 16], DType::F32, &mut g).unwrap()).unwrap(),
                None,
            ),
            layer: TransformerEncoderLayer::new(opts, &mut g).unwrap(),
            ln: LayerNorm::new(&[16]).unwrap(),
            head: Linear::new(16, 11, &mut g).unwrap(),
        };
        for module in [&m.emb as &dyn Module, &m.layer, &m.ln, &m.head] {
            module.to_device(device).unwrap();
        }
        m
    }
    fn params(&self) -> Vec<Tensor> {
        [
            self.emb.parameters(),
            self.layer.parameters(),
            self.ln.parameters(),
            self.head.parameters(),
        ]
        .concat()
    }
    fn loss(&self, x: &Tensor, y: &Tensor) -> Tensor {
        let h = self
            .layer
            .forward_with(&self.emb.forward(x).unwrap(), None, true)
            .unwrap();
        let logits = self.head.forward(&self.ln.forward(&h).unwrap()).unwrap();
        ops::cross_entropy(
            &ops::reshape(&logits, [-1, 11]).unwrap(),
            &ops::reshape(y, [-1i64]).unwrap(),
            None,
            -100,
            Reduction::Mean,
            0.0,
        )
        .unwrap()
    }
}

fn tokens(device: Device, seed: u64) -> Tensor {
    let mut g = Generator::new(seed);
    let v: Vec<i64> = (0..24).map(|_| g.int_range(0, 10)).collect();
    Tensor::from_raw(Raw::from_vec(v, [3, 8]).unwrap().to_device(device).unwrap())
}

/// `steps` steps of SGD with momentum (lr 0.05, momentum 0.9) over `params`, under
/// float16 CUDA autocast with a `GradScaler` when `amp`; `loss(step)` computes a step's
/// loss inside the autocast region. The losses and the final parameters (on the host).
fn sgd_steps(
    params: &[Tensor],
    device: Device,
    amp: bool,
    steps: u64,
    loss: impl Fn(u64) -> amp::autograd::Result<Tensor>,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let momentum = SgdOptions {
        momentum: 0.9,
        ..SgdOptions::default()
    };
    let mut opt = Sgd::new(params.to_vec(), 0.05, momentum).unwrap();
    let mut scaler = GradScaler::with_options(GradScalerOptions::default().enabled(amp)).unwrap();
    let region = Autocast::new(DeviceType::Cuda)
        .dtype(DType::F16)
        .enabled(amp);
    let mut losses = Vec::new();
    for step in 0..steps {
        opt.zero_grad();
        let loss = region.run(|| loss(step)).unwrap().unwrap();
        assert_eq!(loss.device(), device);
        losses.push(loss.item_f64().unwrap());
        scaler.scale(&loss).unwrap().backward().unwrap();
        scaler.step(&mut opt).unwrap();
        scaler.update().unwrap();
    }
    let params = params.iter().map(|p| p.data().to_vec_f64()).collect();
    (losses, params)
}

/// `run(device, amp)` in float32 on the host and on the device (losses within 1e-4,
/// parameters within `param_tol`), and with AMP on the device (losses within 3e-2 of
/// the host's float32 ones).
fn matches_the_host(
    what: &str,
    param_tol: f64,
    run: impl Fn(Device, bool) -> (Vec<f64>, Vec<Vec<f64>>),
) {
    let (cpu_loss, cpu_params) = run(Device::Cpu, false);
    let (dev_loss, dev_params) = run(DEV, false);
    close(&dev_loss, &cpu_loss, 1e-4, &format!("{what} f32 losses"));
    for (i, (a, b)) in dev_params.iter().zip(&cpu_params).enumerate() {
        close(a, b, param_tol, &format!("{what} f32 parameter {i}"));
    }
    let (amp_loss, _) = run(DEV, true);
    close(&amp_loss, &cpu_loss, 3e-2, &format!("{what} amp losses"));
    eprintln!("{what}: cpu {cpu_loss:?}\n  cuda amp {amp_loss:?}");
}

#[test]
fn a_transformer_step_on_cuda_matches_the_host() {
    if !device_or_skip("a_transformer_step_on_cuda_matches_the_host") {
        return;
    }
    // SGD, not Adam: the key bias of attention has a gradient of pure rounding noise
    // (softmax ignores a constant added to a row of scores), which Adam's normalisation
    // would turn into full-size steps of either sign.
    matches_the_host("transformer", 2e-3, |device, amp| {
        let m = TinyGpt::new(device);
        sgd_steps(&m.params(), device, amp, 5, |step| {
            Ok(m.loss(&tokens(device, step), &tokens(device, step + 100)))
        })
    });
}

#[test]
fn a_conv_net_trains_on_cuda_as_on_the_host() {
    if !device_or_skip("a_conv_net_trains_on_cuda_as_on_the_host") {
        return;
    }
    // conv 3→8 (3×3, padding 1) → ReLU → conv 8→4 (3×3, stride 2) → flatten → linear,
    // moved to the device with `Module::to_device`; SGD with momentum.
    use amp::nn::{Conv2d, ConvOptions};
    matches_the_host("conv net", 1e-3, |device, amp| {
        let mut g = Generator::new(5);
        let c1 = Conv2d::with_options(ConvOptions::new(3, 8, &[3]).padding(&[1]), &mut g).unwrap();
        let c2 = Conv2d::with_options(ConvOptions::new(8, 4, &[3]).stride(&[2]), &mut g).unwrap();
        let head = Linear::new(4 * 3 * 3, 5, &mut g).unwrap();
        for m in [&c1 as &dyn Module, &c2, &head] {
            m.to_device(device).unwrap();
        }
        let params = [c1.parameters(), c2.parameters(), head.parameters()].concat();
        let x = Raw::randn([6, 3, 8, 8], DType::F32, &mut g).unwrap();
        let y = Raw::randn([6, 5], DType::F32, &mut g).unwrap();
        let (x, y) = (
            Tensor::from_raw(x.to_device(device).unwrap()),
            Tensor::from_raw(y.to_device(device).unwrap()),
        );
        sgd_steps(&params, device, amp, 6, |_| {
            let h = c1.forward(&x)?.relu()?;
            let h = c2.forward(&h)?;
            if amp {
                assert_eq!(h.dtype(), DType::F16, "conv runs in float16 under autocast");
            }
            let out = head.forward(&h.reshape([6, 36])?)?;
            ops::mse_loss(&out, &y, Reduction::Mean)
        })
    });
}

/// Three steps of the optimizer `make` builds over three parameters on `device` (same
/// values everywhere): 257 elements of `dtype`, 70001 of `dtype` (two chunks of the
/// multi-tensor table) and 5 of float32 (mixed dtypes in one launch), with gradients set
/// directly; with `scaled`, the steps go through `step_with_scaling` with a loss scale of
/// 1024 (gradients scaled by it) and a clean flag, then one with an inf flag that must
/// skip; with `view`, the first parameter's second gradient is a strided view (the
/// op-by-op path beside the kernel). The final parameters and the state dict's
/// tensors, on the host.
fn optimizer_run(
    device: Device,
    dtype: DType,
    scaled: bool,
    view: bool,
    make: &dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let mut g = Generator::new(3);
    let shapes = [(257usize, dtype), (70_001, dtype), (5, DType::F32)];
    let params: Vec<Tensor> = shapes
        .iter()
        .map(|&(n, dt)| {
            let init = Raw::randn([n], DType::F64, &mut g).unwrap();
            Tensor::parameter(init.to_dtype(dt).unwrap().to_device(device).unwrap()).unwrap()
        })
        .collect();
    let mut opt = make(params.clone());
    let scale = Raw::full([1usize], 1024.0f64, DType::F32)
        .to_device(device)
        .unwrap();
    for step in 0..3 {
        for (i, (p, &(n, dt))) in params.iter().zip(&shapes).enumerate() {
            let grad = Raw::randn([n], DType::F64, &mut g).unwrap();
            let grad = if scaled {
                amp::kernels::binary_scalar(amp::kernels::BinaryOp::Mul, &grad, 1024.0).unwrap()
            } else {
                grad
            };
            let grad = grad.to_dtype(dt).unwrap().to_device(device).unwrap();
            // A strided gradient view exercises the op-by-op path instead of the kernel.
            let grad = if view && step == 1 && i == 0 {
                let wide = Raw::zeros_on([n, 2], dt, device).unwrap();
                wide.narrow(1, 0, 1)
                    .unwrap()
                    .copy_(&grad.reshape([n, 1]).unwrap())
                    .unwrap();
                wide.narrow(1, 0, 1).unwrap().reshape([n]).unwrap()
            } else {
                grad
            };
            p.set_grad(Some(Tensor::from_raw(grad))).unwrap();
        }
        if scaled {
            let clean = Raw::zeros_on([1], DType::F32, device).unwrap();
            assert!(opt.step_with_scaling(Some(&scale), &clean).unwrap());
        } else {
            opt.step().unwrap();
        }
    }
    let values =
        |ps: &[Tensor]| -> Vec<f64> { ps.iter().flat_map(|p| p.data().to_vec_f64()).collect() };
    if scaled {
        let before = values(&params);
        let inf = Raw::full([1usize], 1.0f64, DType::F32)
            .to_device(device)
            .unwrap();
        assert!(
            !opt.step_with_scaling(Some(&scale), &inf).unwrap(),
            "an inf flag skips"
        );
        assert_eq!(
            values(&params),
            before,
            "a skipped step leaves the parameters"
        );
    }
    let sd = opt.state_dict();
    let state = sd
        .state
        .values()
        .flat_map(|m| m.values())
        .map(|v| match v {
            amp::optim::StateValue::Tensor(t) => t.to_raw().unwrap().to_vec_f64(),
            amp::optim::StateValue::Number(n) => vec![*n],
        })
        .collect();
    (values(&params), state)
}

#[test]
fn fused_device_optimizers_match_the_host() {
    if !device_or_skip("fused_device_optimizers_match_the_host") {
        return;
    }
    type Make = Box<dyn Fn(Vec<Tensor>) -> Box<dyn Optimizer>>;
    let sgd =
        |o: SgdOptions| -> Make { Box::new(move |ps| Box::new(Sgd::new(ps, 0.05, o).unwrap())) };
    let adam =
        |o: AdamOptions| -> Make { Box::new(move |ps| Box::new(Adam::new(ps, 1e-2, o).unwrap())) };
    let base = SgdOptions::default();
    let cases: Vec<(&str, Make, bool)> = vec![
        ("sgd", sgd(base), false),
        (
            "sgd momentum",
            sgd(SgdOptions {
                momentum: 0.9,
                dampening: 0.1,
                ..base
            }),
            false,
        ),
        (
            "sgd nesterov wd maximize",
            sgd(SgdOptions {
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.01,
                maximize: true,
                ..base
            }),
            false,
        ),
        ("adam", adam(AdamOptions::default()), true),
        (
            "adam amsgrad wd",
            adam(AdamOptions {
                amsgrad: true,
                weight_decay: 0.1,
                ..AdamOptions::default()
            }),
            true,
        ),
        (
            "adamw maximize",
            adam(AdamOptions {
                maximize: true,
                ..AdamOptions::adamw()
            }),
            true,
        ),
        ("adam unscaled", adam(AdamOptions::default()), false),
    ];
    for (name, make, scaled) in &cases {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for view in [false, true] {
                let (hp, hs) = optimizer_run(Device::Cpu, dtype, *scaled, view, make.as_ref());
                let (dp, ds) = optimizer_run(DEV, dtype, *scaled, view, make.as_ref());
                let what = format!("{name} {dtype} view={view}");
                if matches!(dtype, DType::F32 | DType::F64) {
                    // The fused kernel repeats the host's operations: the same bits.
                    assert_eq!(dp, hp, "{what}: parameter");
                    assert_eq!(ds, hs, "{what}: state");
                } else {
                    // 16-bit parameters: the same float32 arithmetic, rounded once.
                    close(&dp, &hp, 1e-2, &format!("{what}: parameter"));
                    for (a, b) in ds.iter().zip(&hs) {
                        close(a, b, 1e-3, &format!("{what}: state"));
                    }
                }
            }
        }
    }
    eprintln!(
        "fused_device_optimizers_match_the_host: {} cases x 4 dtypes x 2 layouts",
        cases.len()
    );
}

#[test]
fn a_run_resumed_from_a_checkpoint_on_cuda_continues_exactly() {
    if !device_or_skip("a_run_resumed_from_a_checkpoint_on_cuda_continues_exactly") {
        return;
    }
    // A linear model under float16 autocast with Adam and a GradScaler on the device;
    // after 3 steps its model, optimizer and scaler state dicts (read to the host) are
    // loaded into a fresh model moved to the device, and both runs take 3 more steps.
    let build = || {
        let mut g = Generator::new(9);
        let m = Linear::new(16, 4, &mut g).unwrap();
        m.to_device(DEV).unwrap();
        let opt = Adam::new(m.parameters(), 1e-2, AdamOptions::adamw()).unwrap();
        let scaler = GradScaler::new();
        (m, opt, scaler)
    };
    let batch = |i: u64| {
        let mut g = Generator::new(100 + i);
        let x = Raw::randn([8, 16], DType::F32, &mut g)
            .unwrap()
            .to_device(DEV)
            .unwrap();
        let y = Raw::randn([8, 4], DType::F32, &mut g)
            .unwrap()
            .to_device(DEV)
            .unwrap();
        (Tensor::from_raw(x), Tensor::from_raw(y))
    };
    let step = |m: &Linear, opt: &mut Adam, scaler: &mut GradScaler, i: u64| {
        let (x, y) = batch(i);
        opt.zero_grad();
        let loss = autocast(DeviceType::Cuda, DType::F16, || {
            ops::mse_loss(&m.forward(&x).unwrap(), &y, Reduction::Mean).unwrap()
        })
        .unwrap();
        scaler.scale(&loss).unwrap().backward().unwrap();
        scaler.step(opt).unwrap();
        scaler.update().unwrap();
    };
    let (m, mut opt, mut scaler) = build();
    for i in 0..3 {
        step(&m, &mut opt, &mut scaler, i);
    }
    let (msd, osd, ssd) = (m.state_dict(), opt.state_dict(), scaler.state_dict());
    let (m2, mut opt2, mut scaler2) = build();
    m2.load_state_dict(&msd).unwrap();
    opt2.load_state_dict(&osd).unwrap();
    scaler2.load_state_dict(ssd.as_ref()).unwrap();
    for i in 3..6 {
        step(&m, &mut opt, &mut scaler, i);
        step(&m2, &mut opt2, &mut scaler2, i);
    }
    for (a, b) in m.parameters().iter().zip(m2.parameters()) {
        assert_eq!(b.device(), DEV);
        assert_eq!(
            a.data().to_vec_f64(),
            b.data().to_vec_f64(),
            "resumed parameters"
        );
    }
    assert_eq!(scaler.get_scale(), scaler2.get_scale());
    assert_eq!(
        serde_json::to_string(&opt.state_dict()).unwrap(),
        serde_json::to_string(&opt2.state_dict()).unwrap()
    );
}
