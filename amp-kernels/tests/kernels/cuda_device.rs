//! CUDA kernels against the CPU kernels, on a real device. Skips (printing why) where
//! no CUDA device is available, so it runs only on a GPU machine:
//! `cargo test --release -p amp-kernels --features cuda --test kernels cuda_device::`.
#![cfg(feature = "cuda")]

use amp_kernels::cuda as k;
use amp_kernels::{BinaryOp, UnaryOp};
use amp_tensor::cuda::{self, CudaStorage};
use amp_tensor::{DType, Device, Layout, Tensor};
use amp_testing::tensors::bits;

const DEV: Device = Device::Cuda(0);
const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

fn device_or_skip() -> bool {
    if let Err(e) = cuda::ensure_device(DEV, &[cuda::Library::Driver, cuda::Library::Nvrtc]) {
        eprintln!("SKIPPED cuda_device: {e}");
        return false;
    }
    true
}

/// A host tensor (contiguous) on the device.
fn up(t: &Tensor) -> CudaStorage {
    let st = t.contiguous();
    let s = st.storage();
    CudaStorage::from_cpu(s.cpu().unwrap(), DEV).unwrap()
}

fn down(s: &CudaStorage, dims: &[usize]) -> Tensor {
    Tensor::from_storage(s.to_cpu().unwrap(), Layout::contiguous(dims.to_vec())).unwrap()
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut g = amp_tensor::Generator::new(seed);
    Tensor::randn([n], DType::F64, &mut g).unwrap().to_vec_f64()
}

fn specials() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        65520.0,
        1e-8,
        6e-8,
        3.0e38,
        1e39,
        -1e300,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        0.1,
        2.5,
        3.5,
        -7.25,
        1e10,
        -3e9,
    ]
}

fn close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + y.abs());
        assert!(ok, "{what}[{i}]: device {x} vs cpu {y}");
    }
}

fn tol(d: DType) -> f64 {
    match d {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        DType::F32 => 2e-6,
        _ => 1e-13,
    }
}

#[test]
fn host_device_round_trip_and_allocator_reuse() {
    if !device_or_skip() {
        return;
    }
    for d in DType::FLOATS
        .into_iter()
        .chain([DType::I32, DType::I64, DType::Bool])
    {
        let t = Tensor::from_vec(specials(), [20])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let back = down(&up(&t), &[20]);
        let (a, b) = (back.to_vec_f64(), t.to_vec_f64());
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{d}"
        );
    }
    let before = cuda::memory_stats(DEV);
    drop(CudaStorage::zeros(DEV, DType::F32, 1000).unwrap());
    drop(CudaStorage::zeros(DEV, DType::F32, 1000).unwrap());
    let after = cuda::memory_stats(DEV);
    assert!(
        after.cache_hits > before.cache_hits,
        "{before:?} -> {after:?}"
    );
}

#[test]
fn casts_match_the_host_bitwise() {
    if !device_or_skip() {
        return;
    }
    let all = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];
    for s in all {
        let src = Tensor::from_vec(specials(), [4, 5])
            .unwrap()
            .to_dtype(s)
            .unwrap();
        let view = src.transpose(0, 1).unwrap();
        let dev = up(&src);
        for d in all {
            let got = down(&k::cast(&dev, view.layout(), d).unwrap(), &[5, 4]);
            let want = view.to_dtype(d).unwrap();
            let (a, b) = (got.to_vec_f64(), want.to_vec_f64());
            assert!(
                a.iter()
                    .zip(&b)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())),
                "cast {s} -> {d}: {a:?} vs {b:?}"
            );
        }
    }
}

#[test]
fn unary_and_binary_match_the_host() {
    if !device_or_skip() {
        return;
    }
    let unary = [
        ("neg", UnaryOp::Neg),
        ("abs", UnaryOp::Abs),
        ("exp", UnaryOp::Exp),
        ("log", UnaryOp::Log),
        ("sqrt", UnaryOp::Sqrt),
        ("rsqrt", UnaryOp::Rsqrt),
        ("reciprocal", UnaryOp::Reciprocal),
        ("sin", UnaryOp::Sin),
        ("cos", UnaryOp::Cos),
        ("tanh", UnaryOp::Tanh),
    ];
    let binary = [
        ("add", BinaryOp::Add),
        ("sub", BinaryOp::Sub),
        ("mul", BinaryOp::Mul),
        ("div", BinaryOp::Div),
        ("maximum", BinaryOp::Maximum),
        ("minimum", BinaryOp::Minimum),
        ("pow", BinaryOp::Pow),
    ];
    for d in FLOATS {
        let x = Tensor::from_vec(values(96, 1), [8, 12])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let xt = x.transpose(0, 1).unwrap();
        let dx = up(&x);
        for (name, op) in unary {
            let got = down(&k::unary(name, &dx, xt.layout()).unwrap(), &[12, 8]);
            let want = amp_kernels::unary(op, &xt).unwrap();
            close(
                &got.to_vec_f64(),
                &want.to_vec_f64(),
                4.0 * tol(d),
                &format!("{name} {d}"),
            );
        }
        let y = Tensor::from_vec(values(12, 2), [12])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let yb = y.broadcast_to([8, 12]).unwrap();
        let dy = up(&y);
        let yl = Layout::new(vec![8, 12], vec![0, 1], 0);
        for (name, op) in binary {
            let got = down(
                &k::binary(name, &dx, x.layout(), &dy, &yl).unwrap(),
                &[8, 12],
            );
            let want = amp_kernels::binary(op, &x, &yb).unwrap();
            close(
                &got.to_vec_f64(),
                &want.to_vec_f64(),
                4.0 * tol(d),
                &format!("{name} {d}"),
            );
        }
    }
}

/// `reduce_rows` of every op on the device against the host reduction of `x`
/// (`[rows, n]`).
fn row_reductions_match(x: &Tensor, rows: usize, n: usize) {
    let (d, dx) = (x.dtype(), up(x));
    let red = [
        ("sum", amp_kernels::sum(x, &[1], false, None).unwrap()),
        ("mean", amp_kernels::mean(x, &[1], false, None).unwrap()),
        ("max", amp_kernels::amax(x, &[1], false).unwrap()),
        ("min", amp_kernels::amin(x, &[1], false).unwrap()),
    ];
    for (name, want) in red {
        let got = down(&k::reduce_rows(name, &dx, rows, n).unwrap(), &[rows]);
        close(
            &got.to_vec_f64(),
            &want.to_vec_f64(),
            4.0 * tol(d),
            &format!("{name} {rows}x{n} {d}"),
        );
    }
}

#[test]
fn reductions_softmax_layer_norm_matmul_match_the_host() {
    if !device_or_skip() {
        return;
    }
    // One block per row, then few long rows cut into chunks (`split_count`), with a
    // NaN in the last chunk of the second row, to cross the partial buffer.
    for d in FLOATS {
        for (rows, n) in [(3, 100_000), (1, (1 << 20) + 37)] {
            assert!(k::split_count(rows, n) > 1, "{rows}x{n} is split");
            let mut v = values(rows * n, 6);
            if rows > 1 {
                v[2 * n - 5] = f64::NAN;
            }
            let x = Tensor::from_vec(v, [rows, n]).unwrap().to_dtype(d).unwrap();
            row_reductions_match(&x, rows, n);
        }
    }
    for d in FLOATS {
        let (rows, n) = (7, 1000);
        assert_eq!(k::split_count(rows, n), 1);
        let x = Tensor::from_vec(values(rows * n, 3), [rows, n])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        row_reductions_match(&x, rows, n);
        let dx = up(&x);
        for log in [false, true] {
            let got = down(
                &k::softmax_rows(&dx, rows, n, log, (1.0, 0)).unwrap(),
                &[rows, n],
            );
            let want = if log {
                amp_kernels::log_softmax(&x, 1, None).unwrap()
            } else {
                amp_kernels::softmax(&x, 1, None).unwrap()
            };
            close(
                &got.to_vec_f64(),
                &want.to_vec_f64(),
                4.0 * tol(d),
                &format!("softmax log={log} {d}"),
            );
        }
        let w = Tensor::from_vec(values(n, 4), [n])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let b = Tensor::from_vec(values(n, 5), [n])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let (dw, db) = (up(&w), up(&b));
        let (o, _, _) = k::layer_norm_rows(&dx, Some(&dw), Some(&db), rows, n, 1e-5).unwrap();
        let (want, _, _) = amp_kernels::layer_norm(&x, &[n], Some(&w), Some(&b), 1e-5).unwrap();
        close(
            &down(&o, &[rows, n]).to_vec_f64(),
            &want.to_vec_f64(),
            4.0 * tol(d),
            &format!("layer_norm {d}"),
        );

        let (bt, m, kk, nn) = (3, 33, 70, 17);
        let a = Tensor::from_vec(values(bt * m * kk, 6), [bt, m, kk])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let bm = Tensor::from_vec(values(bt * kk * nn, 7), [bt, kk, nn])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let got = down(
            &k::matmul(&up(&a), &up(&bm), bt, m, kk, nn).unwrap(),
            &[bt, m, nn],
        );
        let want = amp_kernels::bmm(&a, &bm).unwrap();
        close(
            &got.to_vec_f64(),
            &want.to_vec_f64(),
            8.0 * tol(d),
            &format!("matmul {d}"),
        );
    }
}

#[test]
fn amp_kernels_match_the_host_bitwise() {
    if !device_or_skip() {
        return;
    }
    for inv in [1.0f32, 0.5, 1.0 / 65536.0, 3.0e-5] {
        for with_inf in [false, true] {
            let mut vals = values(70_000, 8);
            if with_inf {
                vals[69_999] = f64::INFINITY;
            }
            let hosts: Vec<Tensor> = FLOATS
                .iter()
                .map(|&d| {
                    Tensor::from_vec(vals.clone(), [70_000])
                        .unwrap()
                        .to_dtype(d)
                        .unwrap()
                })
                .collect();
            let devs: Vec<CudaStorage> = hosts.iter().map(up).collect();
            let ranges: Vec<k::GradRange<'_>> = devs
                .iter()
                .map(|s| k::GradRange {
                    storage: s,
                    offset: 0,
                    len: s.len(),
                })
                .collect();
            let found = up(&Tensor::from_vec(vec![0.0f32], [1]).unwrap());
            let invt = up(&Tensor::from_vec(vec![inv], [1]).unwrap());
            k::non_finite_check_and_unscale_(&ranges, &found, &invt).unwrap();
            let hfound = Tensor::from_vec(vec![0.0f32], [1]).unwrap();
            let hinv = Tensor::from_vec(vec![inv], [1]).unwrap();
            amp_kernels::non_finite_check_and_unscale_(&hosts, &hfound, &hinv).unwrap();
            assert_eq!(down(&found, &[1]).to_vec_f64(), hfound.to_vec_f64());
            for (dv, h) in devs.iter().zip(&hosts) {
                let (a, b) = (down(dv, &[70_000]).to_vec_f64(), h.to_vec_f64());
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{} inv {inv}",
                    h.dtype()
                );
            }
        }
    }
    for (scale, tracker, found, interval) in [
        (3.0f32, 1999i32, 0.0f32, 2000i64),
        (3.0, 0, 0.0, 1),
        (65536.0, 5, 1.0, 2000),
        (3.0e38, 0, 0.0, 1),
        (1e-45, 3, 1.0, 10),
        (2.0, i32::MAX, 0.0, 2000),
    ] {
        let (hs, ht, hf) = (
            Tensor::from_vec(vec![scale], [1]).unwrap(),
            Tensor::from_vec(vec![tracker], [1]).unwrap(),
            Tensor::from_vec(vec![found], [1]).unwrap(),
        );
        let (ds, dt, df) = (up(&hs), up(&ht), up(&hf));
        k::update_scale_(&ds, &dt, &df, 1.1, 0.5, interval).unwrap();
        amp_kernels::update_scale_(&hs, &ht, &hf, 1.1, 0.5, interval).unwrap();
        assert_eq!(
            down(&ds, &[1]).to_vec_f64()[0].to_bits(),
            hs.to_vec_f64()[0].to_bits()
        );
        assert_eq!(down(&dt, &[1]).to_vec_f64(), ht.to_vec_f64());
    }
}

// ----- the device seam: public kernel entries on device tensors ----------------------

/// `t` on the device.
fn dev(t: &Tensor) -> Tensor {
    t.to_device(DEV).unwrap()
}

/// Random values of `dims` as `dtype` on the host.
fn rand(dims: &[usize], d: DType, seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(values(n, seed), dims.to_vec())
        .unwrap()
        .to_dtype(d)
        .unwrap()
}

/// `f` on host tensors and on their device copies: same dims and dtype, values within
/// the dtype's tolerance (`scale` times it), and the device result stays on the device.
fn same_on_device(what: &str, inputs: Vec<Tensor>, scale: f64, f: impl Fn(&[Tensor]) -> Tensor) {
    let host = f(&inputs);
    let on_dev: Vec<Tensor> = inputs.iter().map(dev).collect();
    let d = f(&on_dev);
    assert_eq!(d.device(), DEV, "{what}: result left the device");
    assert_eq!(d.dims(), host.dims(), "{what}");
    assert_eq!(d.dtype(), host.dtype(), "{what}");
    let t = tol(host.dtype()) * scale;
    close(&d.to_vec_f64(), &host.to_vec_f64(), t, what);
}

#[test]
fn tensor_entries_route_to_the_device() {
    use amp_kernels::{self as kx, BinaryOp as B};
    if !device_or_skip() {
        return;
    }
    let mut checked = 0;
    for d in FLOATS {
        let x = rand(&[7, 33], d, 1);
        let y = rand(&[7, 33], d, 2);
        let row = rand(&[33], d, 3);
        for op in UnaryOp::ALL {
            if op.cuda_kernel().is_some() {
                let input = if matches!(op.name(), "log" | "sqrt" | "rsqrt") {
                    kx::unary(UnaryOp::Abs, &x).unwrap()
                } else {
                    x.clone()
                };
                same_on_device(&format!("{} {d}", op.name()), vec![input], 2.0, |t| {
                    kx::unary(op, &t[0]).unwrap()
                });
                checked += 1;
            }
        }
        for op in [B::Add, B::Sub, B::Mul, B::Div, B::Maximum, B::Minimum] {
            let name = format!("{} {d}", op.name());
            same_on_device(&name, vec![x.clone(), row.clone()], 1.0, |t| {
                kx::binary(op, &t[0], &t[1]).unwrap()
            });
            same_on_device(&format!("{name} scalar"), vec![x.clone()], 1.0, |t| {
                kx::binary_scalar(op, &t[0], 0.1).unwrap()
            });
            same_on_device(&format!("scalar {name}"), vec![x.clone()], 1.0, |t| {
                kx::scalar_binary(op, 3.0, &t[0]).unwrap()
            });
            checked += 3;
        }
        same_on_device(
            &format!("add_scaled {d}"),
            vec![x.clone(), y.clone()],
            1.0,
            |t| kx::add_scaled(&t[0], &t[1], -0.25).unwrap(),
        );
        same_on_device(
            &format!("threshold_backward {d}"),
            vec![x.clone(), y.clone()],
            1.0,
            |t| kx::threshold_backward(&t[0], &t[1], 0.0).unwrap(),
        );
        same_on_device(
            &format!("threshold_backward 0.3 {d}"),
            vec![x.clone(), y.clone()],
            1.0,
            |t| kx::threshold_backward(&t[0], &t[1], 0.3).unwrap(),
        );
        same_on_device(
            &format!("gelu_backward {d}"),
            vec![x.clone(), y.clone()],
            2.0,
            |t| kx::gelu_backward(&t[0], &t[1]).unwrap(),
        );
        // Leading dims reduced take the column kernels: [300, 200] over dim 0 is five
        // chunks of 64 rows and a partial last block of 32 columns.
        let cube = rand(&[4, 5, 6], d, 4);
        let tall = rand(&[300, 200], d, 5);
        for (x, dims, keep) in [
            (&cube, &[][..], false),
            (&cube, &[0][..], true),
            (&cube, &[0, 1][..], false),
            (&cube, &[-1][..], false),
            (&cube, &[0, 2][..], false),
            (&tall, &[0][..], false),
        ] {
            let cube = x.clone();
            let w = format!("{:?} over {dims:?} keepdim {keep} {d}", x.dims());
            same_on_device(&format!("sum {w}"), vec![cube.clone()], 4.0, |t| {
                kx::sum(&t[0], dims, keep, None).unwrap()
            });
            same_on_device(&format!("mean {w}"), vec![cube.clone()], 4.0, |t| {
                kx::mean(&t[0], dims, keep, None).unwrap()
            });
            same_on_device(&format!("amax {w}"), vec![cube.clone()], 0.0, |t| {
                kx::amax(&t[0], dims, keep).unwrap()
            });
            same_on_device(&format!("amin {w}"), vec![cube.clone()], 0.0, |t| {
                kx::amin(&t[0], dims, keep).unwrap()
            });
            checked += 4;
        }
        for dim in [0i64, 1, -1] {
            let w = format!("dim {dim} {d}");
            same_on_device(&format!("softmax {w}"), vec![cube.clone()], 2.0, |t| {
                kx::softmax(&t[0], dim, None).unwrap()
            });
            same_on_device(&format!("log_softmax {w}"), vec![cube.clone()], 2.0, |t| {
                kx::log_softmax(&t[0], dim, None).unwrap()
            });
            let g = rand(&[4, 5, 6], d, 5);
            same_on_device(
                &format!("softmax_backward {w}"),
                vec![g.clone(), cube.clone()],
                4.0,
                |t| {
                    let y = kx::softmax(&t[1], dim, None).unwrap();
                    kx::softmax_backward(&t[0], &y, dim).unwrap()
                },
            );
            same_on_device(
                &format!("log_softmax_backward {w}"),
                vec![g, cube.clone()],
                4.0,
                |t| {
                    let y = kx::log_softmax(&t[1], dim, None).unwrap();
                    kx::log_softmax_backward(&t[0], &y, dim).unwrap()
                },
            );
            checked += 4;
        }
        // Attention's probabilities: causal with fewer and with more rows than columns.
        for (x, causal, scale) in [
            (cube.clone(), false, 0.5),
            (cube.clone(), true, 0.35),
            (rand(&[2, 7, 5], d, 8), true, 1.0),
        ] {
            let w = format!("{:?} causal {causal} scale {scale} {d}", x.dims());
            let g = rand(x.dims(), d, 9);
            same_on_device(&format!("scaled_softmax {w}"), vec![x.clone()], 2.0, |t| {
                kx::scaled_softmax(&t[0], scale, causal).unwrap()
            });
            same_on_device(
                &format!("scaled_softmax_backward {w}"),
                vec![g, x],
                4.0,
                |t| {
                    let y = kx::scaled_softmax(&t[1], scale, causal).unwrap();
                    kx::scaled_softmax_backward(&t[0], &y, scale).unwrap()
                },
            );
            checked += 2;
        }
        let (w, b) = (rand(&[6], d, 6), rand(&[6], d, 7));
        same_on_device(
            &format!("layer_norm {d}"),
            vec![cube.clone(), w.clone(), b.clone()],
            4.0,
            |t| {
                kx::layer_norm(&t[0], &[6], Some(&t[1]), Some(&t[2]), 1e-5)
                    .unwrap()
                    .0
            },
        );
        // [4, 5, 6], and [300, 200]: several chunks of rows for the weight and bias
        // sums (300 rows of 64), and columns past the last full 32 (200 = 6 x 32 + 8).
        let (x2, g2) = (rand(&[300, 200], d, 12), rand(&[300, 200], d, 13));
        let (w2, b2) = (rand(&[200], d, 14), rand(&[200], d, 15));
        let cases = [
            (rand(&[4, 5, 6], d, 8), cube.clone(), w.clone(), b.clone()),
            (g2.clone(), x2.clone(), w2, b2),
        ];
        for (g, x, w, b) in cases {
            let n = x.dims()[x.rank() - 1];
            for part in 0..3 {
                same_on_device(
                    &format!("layer_norm_backward {:?} {part} {d}", x.dims()),
                    vec![g.clone(), x.clone(), w.clone(), b.clone()],
                    8.0,
                    |t| {
                        let (_, mean, rstd) =
                            kx::layer_norm(&t[1], &[n], Some(&t[2]), Some(&t[3]), 1e-5).unwrap();
                        let (gi, gw, gb) =
                            kx::layer_norm_backward(&t[0], &t[1], &[n], &mean, &rstd, Some(&t[2]))
                                .unwrap();
                        [Some(gi), gw, gb][part].clone().unwrap()
                    },
                );
            }
        }
        same_on_device(
            &format!("layer_norm_backward without a weight {d}"),
            vec![g2.clone(), x2.clone()],
            8.0,
            |t| {
                let (_, mean, rstd) = kx::layer_norm(&t[1], &[200], None, None, 1e-5).unwrap();
                kx::layer_norm_backward(&t[0], &t[1], &[200], &mean, &rstd, None)
                    .unwrap()
                    .0
            },
        );
        let (a, bm, c) = (rand(&[5, 7], d, 9), rand(&[7, 3], d, 10), rand(&[3], d, 11));
        let k = 8.0;
        same_on_device(&format!("mm {d}"), vec![a.clone(), bm.clone()], k, |t| {
            kx::mm(&t[0], &t[1]).unwrap()
        });
        same_on_device(
            &format!("mm transposed {d}"),
            vec![a.clone(), bm.clone()],
            k,
            |t| kx::mm(&t[1].t().unwrap(), &t[0].t().unwrap()).unwrap(),
        );
        same_on_device(
            &format!("addmm {d}"),
            vec![c.clone(), a.clone(), bm.clone()],
            k,
            |t| kx::addmm(&t[0], &t[1], &t[2], 0.5, 2.0).unwrap(),
        );
        let (ba, bb, bi) = (
            rand(&[3, 5, 7], d, 12),
            rand(&[3, 7, 4], d, 13),
            rand(&[5, 4], d, 14),
        );
        same_on_device(&format!("bmm {d}"), vec![ba.clone(), bb.clone()], k, |t| {
            kx::bmm(&t[0], &t[1]).unwrap()
        });
        same_on_device(
            &format!("baddbmm {d}"),
            vec![bi.clone(), ba.clone(), bb.clone()],
            k,
            |t| kx::baddbmm(&t[0], &t[1], &t[2], 1.0, 1.0).unwrap(),
        );
        same_on_device(
            &format!("addbmm {d}"),
            vec![bi.clone(), ba.clone(), bb.clone()],
            k,
            |t| kx::addbmm(&t[0], &t[1], &t[2], 0.5, 1.0).unwrap(),
        );
        same_on_device(
            &format!("matmul broadcast {d}"),
            vec![ba.clone(), bm.clone()],
            k,
            |t| kx::matmul(&t[0], &t[1].narrow(0, 0, 7).unwrap()).unwrap(),
        );
        // Operands cuBLAS reads in place (one side transposed, a column slice with a
        // row stride above its width, a permuted batch) and one it cannot (a broadcast
        // row: gathered); an empty sum; beta 0 ignoring a NaN input.
        same_on_device(
            &format!("mm one transposed {d}"),
            vec![a.clone(), rand(&[3, 7], d, 15)],
            k,
            |t| kx::mm(&t[0], &t[1].t().unwrap()).unwrap(),
        );
        same_on_device(
            &format!("mm column slice {d}"),
            vec![rand(&[5, 9], d, 16), bm.clone()],
            k,
            |t| kx::mm(&t[0].narrow(1, 1, 7).unwrap(), &t[1]).unwrap(),
        );
        same_on_device(
            &format!("bmm permuted batch {d}"),
            vec![rand(&[5, 3, 7], d, 17), bb.clone()],
            k,
            |t| kx::bmm(&t[0].permute(&[1, 0, 2]).unwrap(), &t[1]).unwrap(),
        );
        same_on_device(
            &format!("bmm transposed batch {d}"),
            vec![ba.clone(), rand(&[3, 4, 7], d, 18)],
            k,
            |t| kx::bmm(&t[0], &t[1].transpose(1, 2).unwrap()).unwrap(),
        );
        same_on_device(
            &format!("mm broadcast row {d}"),
            vec![rand(&[1, 7], d, 19), bm.clone()],
            k,
            |t| kx::mm(&t[0].expand([5, 7]).unwrap(), &t[1]).unwrap(),
        );
        same_on_device(
            &format!("addmm k=0 {d}"),
            vec![c.clone(), rand(&[5, 0], d, 20), rand(&[0, 3], d, 21)],
            1.0,
            |t| kx::addmm(&t[0], &t[1], &t[2], 0.5, 2.0).unwrap(),
        );
        let mut nan_in = c.to_vec_f64();
        nan_in[1] = f64::NAN;
        let nan_in = Tensor::from_vec(nan_in, [3]).unwrap().to_dtype(d).unwrap();
        same_on_device(
            &format!("addmm beta 0 {d}"),
            vec![nan_in, a.clone(), bm.clone()],
            k,
            |t| kx::addmm(&t[0], &t[1], &t[2], 0.0, 1.5).unwrap(),
        );
        checked += 19;
        // clamp with number and tensor bounds (NaN elements stay NaN), cat and stack.
        let mut xn = x.to_vec_f64();
        xn[3] = f64::NAN;
        let xn = Tensor::from_vec(xn, [7, 33]).unwrap().to_dtype(d).unwrap();
        same_on_device(&format!("clamp {d}"), vec![xn.clone()], 1.0, |t| {
            kx::clamp(&t[0], Some(-0.5), Some(0.75)).unwrap()
        });
        same_on_device(&format!("clamp min {d}"), vec![xn.clone()], 1.0, |t| {
            kx::clamp(&t[0], Some(0.1), None).unwrap()
        });
        same_on_device(
            &format!("clamp nan bound {d}"),
            vec![xn.clone()],
            1.0,
            |t| kx::clamp(&t[0], Some(f64::NAN), Some(1.0)).unwrap(),
        );
        same_on_device(
            &format!("clamp tensors {d}"),
            vec![xn.clone(), row.clone(), y.clone()],
            1.0,
            |t| kx::clamp_tensor(&t[0], Some(&t[1]), Some(&t[2])).unwrap(),
        );
        same_on_device(
            &format!("cat {d}"),
            vec![x.clone(), y.t().unwrap(), rand(&[7, 0], d, 4)],
            1.0,
            |t| {
                let yt = t[1].t().unwrap();
                kx::cat(&[t[0].clone(), yt, t[2].clone()], 1).unwrap()
            },
        );
        // Seven parts: two `copy_many` launches for the six of the output's dtype (one
        // strided, one empty, one buffer three times), the bool part converted alone.
        let flags =
            Tensor::from_vec((0..28).map(|i| i % 3 == 0).collect::<Vec<_>>(), [7, 4]).unwrap();
        same_on_device(
            &format!("cat of seven {d}"),
            vec![x.clone(), y.clone(), flags, rand(&[7, 0], d, 5)],
            1.0,
            |t| {
                let strided = t[1].narrow(1, 3, 10).unwrap();
                let parts = [
                    t[0].clone(),
                    strided,
                    t[0].clone(),
                    t[3].clone(),
                    t[1].clone(),
                    t[2].clone(),
                    t[0].clone(),
                ];
                kx::cat(&parts, 1).unwrap()
            },
        );
        same_on_device(
            &format!("stack {d}"),
            vec![x.clone(), y.clone()],
            1.0,
            |t| kx::stack(&[t[0].clone(), t[1].clone()], 0).unwrap(),
        );
        checked += 7;
    }
    eprintln!("tensor_entries_route_to_the_device: {checked} entries matched the host");
}

/// A 16-bit sum on the device is one reduction in its dtype (float32 sums, one
/// rounding): the same bits as the float32 sum of the widened input cast down, over
/// column chunks, row blocks and split rows.
#[test]
fn sixteen_bit_sums_round_a_float32_sum_once() {
    use amp_kernels as kx;
    if !device_or_skip() {
        return;
    }
    for d in [DType::F16, DType::BF16] {
        for (dims, axes) in [
            (vec![300, 200], vec![0i64]),
            (vec![4, 75, 200], vec![0, 1]),
            (vec![300, 200], vec![1]),
            (vec![3, 70001], vec![-1]),
            (vec![30, 20, 10], vec![0, 2]),
        ] {
            let x = dev(&rand(&dims, d, 11));
            let direct = kx::sum(&x, &axes, false, None).unwrap();
            let wide = kx::sum(&x.to_dtype(DType::F32).unwrap(), &axes, false, None)
                .unwrap()
                .to_dtype(d)
                .unwrap();
            assert_eq!(direct.dtype(), d);
            assert_eq!(bits(&direct), bits(&wide), "{d} {dims:?} over {axes:?}");
        }
    }
}

#[test]
fn device_errors_are_typed_with_pytorch_texts() {
    if !device_or_skip() {
        return;
    }
    let h = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let d = dev(&h);
    // An op with no device kernel names itself and the device; nothing runs on the host.
    let e = amp_kernels::cumsum(&d, 0, None).unwrap_err();
    assert!(
        matches!(e, amp_tensor::Error::NoDeviceKernel { device: DEV, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("'CUDA' backend"), "{e}");
    // The tanh GELU shares `gelu`'s name but has no device kernel: an error, not the
    // erf kernel.
    let e = amp_kernels::unary(UnaryOp::GeluTanh, &d).unwrap_err();
    assert!(
        matches!(e, amp_tensor::Error::NoDeviceKernel { op: "gelu", .. }),
        "{e}"
    );
    // Mixed devices: PyTorch's message.
    let e = amp_kernels::binary(amp_kernels::BinaryOp::Add, &d, &h).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (in add)"
    );
    // A host 0-dim tensor meets a device tensor as a scalar, as in PyTorch.
    let s = Tensor::from_vec(vec![2.0f32], ()).unwrap();
    let r = amp_kernels::binary(amp_kernels::BinaryOp::Mul, &d, &s).unwrap();
    assert_eq!(r.device(), DEV);
    assert_eq!(r.to_vec_f64(), [2.0, 4.0, 6.0]);
    // Copies in place across devices, fills, and views of device tensors.
    let z = Tensor::zeros_on([2, 3], DType::BF16, DEV).unwrap();
    z.narrow(0, 1, 1)
        .unwrap()
        .copy_(&h.reshape([1, 3]).unwrap())
        .unwrap();
    assert_eq!(z.to_vec_f64(), [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
    z.fill_(0.5).unwrap();
    assert_eq!(
        z.t().unwrap().try_contiguous().unwrap().to_vec_f64(),
        [0.5; 6]
    );
}

#[test]
fn convolutions_on_cudnn_match_the_host() {
    use amp_kernels::{self as kx, ConvParams};
    if !device_or_skip() {
        return;
    }
    // (input dims, weight dims, stride, padding, dilation, groups): 1-d, 2-d and 3-d,
    // strides, dilations, groups, a 1x1 kernel.
    type Case<'a> = (
        &'a [usize],
        &'a [usize],
        &'a [usize],
        &'a [usize],
        &'a [usize],
        usize,
    );
    let cases: [Case; 6] = [
        (&[2, 4, 11], &[6, 2, 3], &[2], &[1], &[1], 2),
        (&[2, 3, 9, 8], &[5, 3, 3, 3], &[1], &[1], &[1], 1),
        (&[1, 4, 10, 7], &[4, 1, 3, 2], &[2, 1], &[0, 1], &[2, 1], 4),
        (&[3, 8, 5, 5], &[16, 8, 1, 1], &[1], &[0], &[1], 1),
        (
            &[1, 2, 5, 6, 4],
            &[3, 2, 2, 3, 2],
            &[1, 2, 1],
            &[1, 0, 1],
            &[1],
            1,
        ),
        (&[2, 6, 7, 7], &[6, 3, 3, 3], &[2], &[1], &[1], 2),
    ];
    let mut checked = 0;
    for d in FLOATS {
        for (i, &(x, w, s, p, dl, g)) in cases.iter().enumerate() {
            let params = ConvParams::new(s, p, dl, g);
            let xs = rand(x, d, 10 + i as u64);
            let ws = rand(w, d, 20 + i as u64);
            let b = rand(&[w[0]], d, 30 + i as u64);
            let k = (w[1..].iter().product::<usize>() as f64).sqrt() * 2.0;
            let what = format!("conv case {i} {d}");
            same_on_device(&what, vec![xs.clone(), ws.clone(), b.clone()], k, |t| {
                kx::conv(&t[0], &t[1], Some(&t[2]), &params).unwrap()
            });
            let y = kx::conv(&xs, &ws, None, &params).unwrap();
            let gy = rand(y.dims(), d, 40 + i as u64);
            same_on_device(
                &format!("{what} input grad"),
                vec![gy.clone(), ws.clone()],
                k,
                |t| kx::conv_input_grad(&t[0], &t[1], x, &params).unwrap(),
            );
            let kw = (y.elem_count() as f64 / w[0] as f64).sqrt() * 2.0;
            same_on_device(
                &format!("{what} weight grad"),
                vec![xs.clone(), gy.clone()],
                kw,
                |t| kx::conv_weight_grad(&t[0], &t[1], w, &params).unwrap(),
            );
            same_on_device(&format!("{what} bias grad"), vec![gy.clone()], kw, |t| {
                kx::conv_bias_grad(&t[0]).unwrap()
            });
            // The transposed convolution (with an output padding where the stride
            // allows one), and a non-contiguous input view.
            let op: Vec<usize> = s.iter().map(|&v| usize::from(v > 1)).collect();
            let tp = ConvParams::new(s, p, dl, g).with_output_padding(&op);
            let tb = rand(&[w[1] * g], d, 50 + i as u64);
            same_on_device(
                &format!("{what} transposed"),
                vec![y.clone(), ws.clone(), tb],
                k,
                |t| kx::conv_transpose(&t[0], &t[1], Some(&t[2]), &tp).unwrap(),
            );
            let wide = rand(
                &[x[0], x[1] * 2]
                    .iter()
                    .chain(&x[2..])
                    .copied()
                    .collect::<Vec<_>>(),
                d,
                60,
            );
            same_on_device(
                &format!("{what} strided input"),
                vec![wide, ws.clone()],
                k,
                |t| {
                    let view = t[0].narrow(1, x[1], x[1]).unwrap();
                    kx::conv(&view, &t[1], None, &params).unwrap()
                },
            );
            checked += 6;
        }
    }
    eprintln!("convolutions_on_cudnn_match_the_host: {checked} convolutions matched the host");
}
