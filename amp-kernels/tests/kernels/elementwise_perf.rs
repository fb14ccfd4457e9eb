//! Timing of the elementwise hot paths (ignored by default; run with
//! `cargo test -p amp-kernels --release --test kernels elementwise_perf:: -- --ignored --nocapture`).

use std::hint::black_box;
use std::time::Instant;

use amp_kernels::{add, binary, mul_scalar, relu, BinaryOp};
use amp_tensor::{DType, Tensor};

/// Fastest round's nanoseconds per call of `f` over `rounds` rounds of `iters`
/// calls (the minimum is the least disturbed by other load on the machine).
fn time_ns(iters: u32, rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[0]
}

fn filled(n: usize, dims: &[usize], dtype: DType) -> Tensor {
    let v: Vec<f32> = (0..n).map(|i| (i % 101) as f32 * 0.01).collect();
    Tensor::from_vec(v, dims.to_vec())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[test]
#[ignore = "timing; run explicitly in release"]
fn elementwise_timings() {
    let a = filled(64, &[8, 8], DType::F32);
    let b = filled(64, &[8, 8], DType::F32);
    let small = time_ns(20_000, 15, || {
        black_box(add(black_box(&a), black_box(&b)).unwrap());
    });
    println!("add 8x8 f32: {small:.0} ns");
    let alloc = time_ns(20_000, 15, || {
        black_box(Tensor::from_vec(black_box(vec![0f32; 64]), [8, 8]).unwrap());
    });
    println!("(baseline: Tensor::from_vec of an 8x8 f32 output: {alloc:.0} ns)");
    let r = time_ns(20_000, 15, || {
        black_box(relu(black_box(&a)).unwrap());
    });
    println!("relu 8x8 f32: {r:.0} ns");
    let s = time_ns(20_000, 15, || {
        black_box(mul_scalar(black_box(&a), 0.5).unwrap());
    });
    println!("mul_scalar 8x8 f32: {s:.0} ns");
    let bias = filled(8, &[8], DType::F32);
    let bb = time_ns(20_000, 15, || {
        black_box(add(black_box(&a), black_box(&bias)).unwrap());
    });
    println!("add 8x8 + [8] f32: {bb:.0} ns");

    let n = 1 << 20;
    for dtype in [DType::F32, DType::BF16] {
        let x = filled(n, &[1024, 1024], dtype);
        let y = filled(n, &[1024, 1024], dtype);
        let big = time_ns(20, 11, || {
            black_box(add(black_box(&x), black_box(&y)).unwrap());
        });
        println!(
            "add 1M {dtype}: {big:.0} ns ({:.3} ns/elem)",
            big / n as f64
        );
        let bias = filled(1024, &[1024], dtype);
        let t = time_ns(20, 11, || {
            black_box(add(black_box(&x), black_box(&bias)).unwrap());
        });
        println!("bias add 1024x1024 + [1024] {dtype}: {t:.0} ns");
        let xt = x.t().unwrap();
        let t = time_ns(10, 7, || {
            black_box(binary(BinaryOp::Add, black_box(&xt), black_box(&y)).unwrap());
        });
        println!("add transposed + contiguous 1M {dtype}: {t:.0} ns");
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let t1 = one.install(|| {
            time_ns(10, 7, || {
                black_box(binary(BinaryOp::Add, black_box(&xt), black_box(&y)).unwrap());
            })
        });
        println!("  ... on one thread: {t1:.0} ns");
        let c1 = one.install(|| {
            time_ns(20, 11, || {
                black_box(add(black_box(&x), black_box(&y)).unwrap());
            })
        });
        println!("add 1M {dtype} on one thread: {c1:.0} ns");
    }
    // in-cache throughput (single thread): vectorised loops run well under 1 ns/elem
    let m = 16 * 1024;
    let x = filled(m, &[m], DType::F32);
    let y = filled(m, &[m], DType::F32);
    let t = time_ns(2000, 11, || {
        black_box(add(black_box(&x), black_box(&y)).unwrap());
    });
    println!(
        "add 16K f32 (in cache): {t:.0} ns ({:.3} ns/elem)",
        t / m as f64
    );
}
