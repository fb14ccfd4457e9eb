//! Training steps on a CUDA device, to set beside `gpu_step_bench_torch.py` (PyTorch,
//! same models, same GPU): the MLP step and the main job's GPT step (`train/gpt.rs`), each
//! in float32 and under float16 autocast + `GradScaler`, and a float16-autocast
//! convolution forward and backward (cuDNN). One `metric value unit` line per figure, or
//! why it could not run.
//!
//! `cargo run --release -p amp --features cuda --example gpu_step_bench [mlp] [gpt] [conv]`
//! (every workload when none is named). After the timed calls, one more call of each
//! workload runs between `cuProfilerStart` and `cuProfilerStop`, so that a profiler
//! started with `--profile-from-start off` (`ncu`, as the GPU bundle's `run.sh` does)
//! sees exactly one step's kernels.

use std::time::Instant;

use amp::autograd::{ops, Reduction, Tensor};
use amp::prelude::*;
use amp::tensor::Tensor as Raw;

/// The main job's model, timed by [`gpt_step_ms`].
#[path = "train/gpt.rs"]
mod gpt;

/// Batch, input, hidden and output widths of the MLP.
const SHAPE: (usize, usize, usize, usize) = (512, 1024, 4096, 1024);

fn main() {
    let dev = Device::Cuda(0);
    if let Err(e) = amp::tensor::cuda::ensure_device(dev, &[amp::tensor::cuda::Library::Driver]) {
        println!("gpu_step_bench: not run: {e}");
        return;
    }
    let named: Vec<String> = std::env::args().skip(1).collect();
    let wants = |w: &str| named.is_empty() || named.iter().any(|n| n == w);
    for amp in [false, true].into_iter().filter(|_| wants("mlp")) {
        match step_ms(dev, amp) {
            Ok(ms) => println!(
                "cuda_mlp_step_{}_ms {ms:.3} ms",
                if amp { "amp_f16" } else { "f32" }
            ),
            Err(e) => println!("gpu_step_bench: {}: {e}", if amp { "amp" } else { "f32" }),
        }
    }
    for amp in [false, true].into_iter().filter(|_| wants("gpt")) {
        match gpt_step_ms(dev, amp) {
            Ok(ms) => println!(
                "cuda_gpt_step_{}_ms {ms:.3} ms",
                if amp { "amp_f16" } else { "f32" }
            ),
            Err(e) => println!(
                "gpu_step_bench: gpt {}: {e}",
                if amp { "amp" } else { "f32" }
            ),
        }
    }
    if wants("conv") {
        match conv_ms(dev) {
            Ok(ms) => println!("cuda_conv2d_amp_f16_fwd_bwd_ms {ms:.3} ms"),
            Err(e) => println!("gpu_step_bench: conv2d: {e}"),
        }
    }
}

/// The median milliseconds of `f`, after 5 warm-up calls, over 20 calls; then one call
/// more inside the profiler's capture range.
fn median_ms(mut f: impl FnMut() -> Res<f64>) -> Res<f64> {
    for _ in 0..5 {
        f()?;
    }
    let mut ts: Vec<f64> = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        f()?;
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ts.sort_by(f64::total_cmp);
    in_capture_range(f)?;
    Ok(ts[ts.len() / 2])
}

/// Conv2d 64→64 3×3 (padding 1) on `[32, 64, 56, 56]` under float16 autocast, forward
/// and backward (input and weight gradients), the sum read back each time.
fn conv_ms(dev: Device) -> Res<f64> {
    use amp::nn::{Conv2d, ConvOptions};
    let mut g = Generator::new(0);
    let conv = Conv2d::with_options(ConvOptions::new(64, 64, &[3]).padding(&[1]), &mut g)?;
    conv.to_device(dev)?;
    let x = Tensor::from_raw(Raw::randn([32, 64, 56, 56], DType::F32, &mut g)?.to_device(dev)?);
    x.requires_grad_(true)?;
    let region = Autocast::new(DeviceType::Cuda).dtype(DType::F16);
    median_ms(|| {
        conv.weight.zero_grad();
        let out = region.try_run(|| conv.forward(&x))?;
        let s = ops::sum_all(&out)?;
        s.backward()?;
        Ok(s.item_f64()?)
    })
}

/// `f()` between `cuProfilerStart` and `cuProfilerStop` (without the `cuda` feature
/// there is no device and nothing to mark).
fn in_capture_range<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "cuda")]
    {
        use amp::tensor::cuda::cudarc::driver::sys::{cuProfilerStart, cuProfilerStop};
        // SAFETY: both calls take no arguments and only mark the capture range of an
        // attached profiler (without one they do nothing); the driver is loaded (the
        // timed calls before this one ran on the device).
        unsafe { cuProfilerStart() };
        let out = f();
        // SAFETY: as above.
        unsafe { cuProfilerStop() };
        out
    }
    #[cfg(not(feature = "cuda"))]
    f()
}

/// The median milliseconds of one training step (forward, backward, SGD with momentum,
/// the scaler's unscale, skip decision and update), the loss read back each step.
type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn step_ms(dev: Device, amp: bool) -> Res<f64> {
    let (b, i, h, o) = SHAPE;
    let mut g = Generator::new(0);
    let (l1, l2) = (Linear::new(i, h, &mut g)?, Linear::new(h, o, &mut g)?);
    l1.to_device(dev)?;
    l2.to_device(dev)?;
    let params = [l1.parameters(), l2.parameters()].concat();
    let up = |t: Raw| -> Res<Tensor> { Ok(Tensor::from_raw(t.to_device(dev)?)) };
    let x = up(Raw::randn([b, i], DType::F32, &mut g)?)?;
    let y = up(Raw::randn([b, o], DType::F32, &mut g)?)?;
    let mut opt = Sgd::new(
        params,
        1e-3,
        SgdOptions {
            momentum: 0.9,
            ..SgdOptions::default()
        },
    )?;
    let mut scaler = GradScaler::with_options(GradScalerOptions::default().enabled(amp))?;
    let region = Autocast::new(DeviceType::Cuda)
        .dtype(DType::F16)
        .enabled(amp);
    let step = || -> Res<f64> {
        opt.zero_grad();
        let out = region.try_run(|| l2.forward(&l1.forward(&x)?.relu()?))?;
        let loss = ops::mse_loss(&out, &y, Reduction::Mean)?;
        scaler.scale(&loss)?.backward()?;
        scaler.step(&mut opt)?;
        scaler.update()?;
        Ok(loss.item_f64()?)
    };
    median_ms(step)
}

/// The median milliseconds of one training step of the main job's model
/// (`GptConfig::default()`, 16 sequences of 128 tokens): forward, cross-entropy,
/// backward, AdamW (lr 3e-3, weight decay 0.01) through the scaler, the loss read back
/// each step; the forward and loss under float16 autocast when `amp`.
fn gpt_step_ms(dev: Device, amp: bool) -> Res<f64> {
    use gpt::{Gpt, GptConfig};
    let config = GptConfig::default();
    let model = Gpt::new(config, &mut Generator::new(0))?;
    model.to_device(dev)?;
    let options = AdamOptions {
        weight_decay: 0.01,
        decoupled: true,
        ..Default::default()
    };
    let mut opt = Adam::new(model.parameters(), 3e-3, options)?;
    let (b, t) = (16, config.context);
    let tokens = |shift: usize| -> Res<Tensor> {
        let v: Vec<i64> = (0..b * t)
            .map(|i| ((i + shift) * 7919 % config.vocab) as i64)
            .collect();
        Ok(Tensor::from_raw(Raw::from_vec(v, [b, t])?.to_device(dev)?))
    };
    let (x, y) = (tokens(0)?, tokens(1)?);
    let mut scaler = GradScaler::with_options(GradScalerOptions::default().enabled(amp))?;
    let region = Autocast::new(DeviceType::Cuda)
        .dtype(DType::F16)
        .enabled(amp);
    median_ms(|| {
        opt.zero_grad();
        let loss = region.try_run(|| model.loss(&x, &y))?;
        scaler.scale(&loss)?.backward()?;
        scaler.step(&mut opt)?;
        scaler.update()?;
        Ok(loss.item_f64()?)
    })
}
