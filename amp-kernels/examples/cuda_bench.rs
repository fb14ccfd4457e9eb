//! CUDA figures of issue 9, to set beside `cuda_bench_torch.py` on the same GPU:
//! cuBLAS matmul TFLOP/s for float16/bfloat16 (float32 compute), the fused
//! non-finite-check-and-unscale in GB/s against a device-to-device copy of the same bytes,
//! and each cuDNN pass of a float16 conv2d in ms.
//!
//! `cargo run --release -p amp-kernels --features cuda --example cuda_bench`; prints one
//! `metric value unit` line per figure, or why it could not run.

#[cfg(feature = "cuda")]
fn main() {
    use std::time::Instant;

    use amp_kernels::cuda as k;
    use amp_tensor::cuda::{self, device_context, CudaStorage};
    use amp_tensor::{DType, Device, Generator, Tensor};

    const DEV: Device = Device::Cuda(0);
    if let Err(e) = cuda::ensure_device(DEV, &[cuda::Library::Driver, cuda::Library::Nvrtc]) {
        println!("cuda_bench: not run: {e}");
        return;
    }
    let dc = device_context(DEV).expect("context");
    // Median seconds per call of `f` (after warm-ups), synchronising around each call.
    let time = |f: &mut dyn FnMut(), reps: usize| -> f64 {
        for _ in 0..3 {
            f();
        }
        dc.synchronize().expect("sync");
        let mut ts: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                dc.synchronize().expect("sync");
                t.elapsed().as_secs_f64()
            })
            .collect();
        ts.sort_by(f64::total_cmp);
        ts[reps / 2]
    };
    let up = |t: &Tensor| -> CudaStorage {
        let c = t.contiguous();
        let s = c.storage();
        CudaStorage::from_cpu(s.cpu().expect("a host tensor"), DEV).expect("upload")
    };
    let mut gen = Generator::new(0);
    let n = 4096;
    for (dtype, name) in [
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
        (DType::F32, "f32"),
    ] {
        let a = up(&Tensor::randn([n, n], DType::F32, &mut gen)
            .expect("randn")
            .to_dtype(dtype)
            .expect("cast"));
        let b = up(&Tensor::randn([n, n], DType::F32, &mut gen)
            .expect("randn")
            .to_dtype(dtype)
            .expect("cast"));
        let t = time(
            &mut || {
                k::matmul(&a, &b, 1, n, n, n).expect("matmul");
            },
            20,
        );
        println!(
            "cuda_mm_{name}_{n}_tflops {:.1} TFLOP/s",
            2.0 * (n * n * n) as f64 / t / 1e12
        );
    }
    // 64 gradients of 2^20 float32 elements, as the CPU benchmark.
    let numel = 1usize << 20;
    let grads: Vec<CudaStorage> = (0..64)
        .map(|_| up(&Tensor::randn([numel], DType::F32, &mut gen).expect("randn")))
        .collect();
    let ranges: Vec<k::GradRange<'_>> = grads
        .iter()
        .map(|s| k::GradRange {
            storage: s,
            offset: 0,
            len: numel,
        })
        .collect();
    let found = up(&Tensor::zeros([1], DType::F32));
    let inv = up(&Tensor::full([1], 1.0 / 65536.0, DType::F32));
    let bytes = (64 * numel * 8) as f64;
    let t = time(
        &mut || k::non_finite_check_and_unscale_(&ranges, &found, &inv).expect("unscale"),
        20,
    );
    println!("cuda_unscale_gbps {:.1} GB/s", bytes / t / 1e9);
    let big = up(&Tensor::zeros([64 * numel], DType::F32));
    let t = time(
        &mut || {
            big.try_clone().expect("copy");
        },
        20,
    );
    println!("cuda_copy_gbps {:.1} GB/s", bytes / t / 1e9);
    // Each cuDNN pass of a float16 conv2d 64→64 3×3 (padding 1) on [32, 64, 56, 56]
    // alone (the first calls, in the warm-up, rank the algorithms).
    let spec = k::cudnn::ConvSpec::new(
        &[32, 64, 56, 56],
        &[64, 64, 3, 3],
        &[32, 64, 56, 56],
        &[1, 1],
        &[1, 1],
        &[1, 1],
        1,
    )
    .expect("geometry");
    let f16 = |dims: &[usize]| {
        up(
            &Tensor::randn(dims.to_vec(), DType::F32, &mut Generator::new(1))
                .expect("randn")
                .to_dtype(DType::F16)
                .expect("cast"),
        )
    };
    let (x, w, dy) = (
        f16(&[32, 64, 56, 56]),
        f16(&[64, 64, 3, 3]),
        f16(&[32, 64, 56, 56]),
    );
    let passes: [(&str, &mut dyn FnMut()); 3] = [
        ("fwd", &mut || {
            k::cudnn::conv_forward(&x, &w, &spec).expect("forward");
        }),
        ("bwd_data", &mut || {
            k::cudnn::conv_backward_data(&dy, &w, &spec).expect("backward data");
        }),
        ("bwd_filter", &mut || {
            k::cudnn::conv_backward_filter(&x, &dy, &spec).expect("backward filter");
        }),
    ];
    for (name, f) in passes {
        println!("cuda_conv2d_f16_{name}_ms {:.3} ms", time(f, 20) * 1e3);
    }
    let stats = cuda::memory_stats(DEV);
    println!("cuda_allocator {stats:?}");
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("cuda_bench: built without the `cuda` feature");
}
