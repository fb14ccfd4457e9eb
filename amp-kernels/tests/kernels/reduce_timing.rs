//! Timings of the hot kernels (ignored by default; run with
//! `cargo test -p amp-kernels --release --test kernels reduce_timing:: -- --ignored --nocapture`).

use std::time::Instant;

use amp_kernels::*;
use amp_tensor::{DType, Generator, Tensor};

/// Median wall time of `f` in microseconds over `reps` runs (after one warm-up).
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[reps / 2]
}

#[test]
#[ignore]
fn kernel_timings() {
    let mut gen = Generator::new(0);
    let x = Tensor::randn([1usize << 20], DType::F32, &mut gen).unwrap();
    let us = time(200, || {
        sum(&x, &[], false, None).unwrap();
    });
    println!(
        "sum 1M f32: {us:.1} us ({:.1} GB/s)",
        4.0 * (1 << 20) as f64 / us / 1e3
    );
    let xb = x.to_dtype(DType::BF16).unwrap();
    println!(
        "sum 1M bf16: {:.1} us",
        time(100, || drop(sum(&xb, &[], false, None).unwrap()))
    );
    let m = x.reshape([1024usize, 1024]).unwrap();
    println!(
        "sum [1024,1024] f32 dim 0: {:.1} us",
        time(100, || drop(sum(&m, &[0], false, None).unwrap()))
    );
    println!(
        "sum [1024,1024] f32 dim 1: {:.1} us",
        time(100, || drop(sum(&m, &[1], false, None).unwrap()))
    );
    println!(
        "amax [1024,1024] f32 dim 1: {:.1} us",
        time(100, || drop(amax(&m, &[1], false).unwrap()))
    );
    println!(
        "norm2 1M f32: {:.1} us",
        time(100, || drop(norm(&x, 2.0, &[], false).unwrap()))
    );
    let s = Tensor::randn([256usize, 1024], DType::F32, &mut gen).unwrap();
    println!(
        "softmax [256,1024] f32 dim -1: {:.1} us",
        time(200, || drop(softmax(&s, -1, None).unwrap()))
    );
    println!(
        "log_softmax [256,1024] f32 dim -1: {:.1} us",
        time(100, || drop(log_softmax(&s, -1, None).unwrap()))
    );
    println!(
        "softmax [256,1024] f32 dim 0: {:.1} us",
        time(50, || drop(softmax(&s, 0, None).unwrap()))
    );
    let sb = s.to_dtype(DType::BF16).unwrap();
    println!(
        "softmax [256,1024] bf16 dim -1: {:.1} us",
        time(100, || drop(softmax(&sb, -1, None).unwrap()))
    );
    println!(
        "logsumexp [256,1024] f32 dim -1: {:.1} us",
        time(100, || drop(logsumexp(&s, &[-1], false).unwrap()))
    );
    println!(
        "layer_norm [256,1024] f32: {:.1} us",
        time(100, || drop(
            layer_norm(&s, &[1024], None, None, 1e-5).unwrap()
        ))
    );
}
