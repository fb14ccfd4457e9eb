//! softmax / log_softmax and their backward helpers against f64 references: every
//! float dtype, every dim (negative too), transposed and sliced inputs, the dtype
//! argument, masking with -inf, stability on large inputs, and errors.

use amp_kernels::*;
use amp_tensor::{DType, Tensor};

// Shape, dtype, contiguity, and the values rounded to the dtype within a tolerance.
use amp_testing::tensors::{assert_tensor_close as check, bits, uniform, Tolerances};

/// The reductions' tolerances for the 16-bit types, tighter ones for float32 and float64.
fn tol(dtype: DType) -> f64 {
    let tol = Tolerances {
        f32: 1e-6,
        f64: 1e-13,
        ..super::reduce::TOL
    };
    tol.of(dtype)
}

/// Apply `f` to every line along `dim` of row-major `x` of `shape`.
fn along(x: &[f64], shape: &[usize], dim: usize, f: &dyn Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let n = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for j in 0..inner {
            let idx: Vec<usize> = (0..n).map(|i| (o * n + i) * inner + j).collect();
            let line: Vec<f64> = idx.iter().map(|&k| x[k]).collect();
            for (&k, v) in idx.iter().zip(f(&line)) {
                out[k] = v;
            }
        }
    }
    out
}

fn ref_softmax(v: &[f64]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = v.iter().map(|x| (x - m).exp()).sum();
    v.iter().map(|x| (x - m).exp() / s).collect()
}

fn ref_log_softmax(v: &[f64]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = v.iter().map(|x| (x - m).exp()).sum();
    v.iter().map(|x| x - m - s.ln()).collect()
}

fn inputs(dtype: DType) -> Vec<(&'static str, Tensor)> {
    let mk = |shape: &[usize], seed| {
        Tensor::from_vec(uniform(shape.iter().product(), seed, 4.0), shape.to_vec())
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    vec![
        ("contiguous", mk(&[3, 5, 7], 1)),
        (
            "transposed",
            mk(&[7, 5, 3], 2).permute(&[2usize, 1, 0]).unwrap(),
        ),
        (
            "sliced",
            mk(&[3, 9, 7], 3)
                .slice(1usize, 1, 9, 2)
                .unwrap()
                .narrow(2usize, 0, 7)
                .unwrap(),
        ),
        ("wide", mk(&[2, 40, 33], 4)),
        ("vector", mk(&[300], 5)),
    ]
}

/// `softmax` or `log_softmax`.
type Op = fn(&Tensor, i64, Option<DType>) -> amp_tensor::Result<Tensor>;

/// The reference of an [`Op`] on one line.
type Reference = fn(&[f64]) -> Vec<f64>;

/// The two ops with their references and the factor on their tolerances.
const OPS: [(&str, Op, Reference, f64); 2] = [
    ("softmax", softmax, ref_softmax, 1.0),
    ("log_softmax", log_softmax, ref_log_softmax, 4.0),
];

#[test]
fn softmax_and_log_softmax_match_reference() {
    for dtype in DType::FLOATS {
        for (label, x) in inputs(dtype) {
            let xv = x.to_vec_f64();
            for dim in -(x.rank() as i64)..x.rank() as i64 {
                let d = if dim < 0 { dim + x.rank() as i64 } else { dim } as usize;
                let what = format!("{dtype} {label} dim={dim}");
                for (name, op, reference, factor) in OPS {
                    check(
                        &op(&x, dim, None).unwrap(),
                        &along(&xv, x.dims(), d, &reference),
                        x.dims(),
                        dtype,
                        tol(dtype) * factor,
                        &format!("{name} {what}"),
                    );
                }
            }
        }
    }
}

#[test]
fn dtype_argument_casts_first() {
    let x = Tensor::from_vec(uniform(24, 9, 4.0), [4, 6])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    let xv = x.to_vec_f64();
    let y = softmax(&x, -1, Some(DType::F32)).unwrap();
    check(
        &y,
        &along(&xv, &[4, 6], 1, &ref_softmax),
        &[4, 6],
        DType::F32,
        1e-6,
        "softmax f16->f32",
    );
    let y = log_softmax(&x, 0, Some(DType::F64)).unwrap();
    check(
        &y,
        &along(&xv, &[4, 6], 0, &ref_log_softmax),
        &[4, 6],
        DType::F64,
        1e-12,
        "log_softmax f16->f64",
    );
    let i = Tensor::from_vec(vec![1i64, 2, 3], [3]).unwrap();
    let y = softmax(&i, 0, Some(DType::F32)).unwrap();
    check(
        &y,
        &ref_softmax(&[1.0, 2.0, 3.0]),
        &[3],
        DType::F32,
        1e-6,
        "int with dtype",
    );
    let e = softmax(&i, 0, None).unwrap_err().to_string();
    assert!(e.contains("softmax") && e.contains("Long"), "{e}");
    assert!(log_softmax(&i, 0, None).is_err());
}

#[test]
fn masking_stability_and_specials() {
    let ninf = f64::NEG_INFINITY;
    for dtype in DType::FLOATS {
        let x = Tensor::from_vec(
            vec![0.5, ninf, 2.0, ninf, ninf, ninf, 1e4, 1e4 - 1.0, ninf],
            [3, 3],
        )
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
        let y = softmax(&x, 1, None).unwrap().to_vec_f64();
        // masked entries are exactly 0; an all -inf row is NaN (as PyTorch)
        assert_eq!(y[1], 0.0, "{dtype}");
        assert!(y[3..6].iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
        assert_eq!(y[8], 0.0);
        let xv = x.to_vec_f64();
        let big = ref_softmax(&xv[6..8]);
        assert!(
            (y[6] - big[0]).abs() < tol(dtype) * 4.0 && (y[7] - big[1]).abs() < tol(dtype) * 4.0,
            "{dtype}: {y:?}"
        );
        let l = log_softmax(&x, 1, None).unwrap().to_vec_f64();
        assert_eq!(l[1], ninf);
        assert!(l[3..6].iter().all(|v| v.is_nan()));
        assert!(
            (l[6] - (xv[6] - xv[6] - (1.0 + (xv[7] - xv[6]).exp()).ln())).abs() < tol(dtype) * 10.0
        );
        let nan = Tensor::from_vec(vec![1.0, f64::NAN, 2.0], [3])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert!(softmax(&nan, 0, None)
            .unwrap()
            .to_vec_f64()
            .iter()
            .all(|v| v.is_nan()));
    }
    // rows summing to one, long rows through the parallel path
    let x = Tensor::from_vec(uniform(256 * 1024, 17, 4.0), [256, 1024])
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let xv = x.to_vec_f64();
    let cases: [(Op, i64, Reference, f64, &str); 3] = [
        (softmax, -1, ref_softmax, 1e-6, "big softmax"),
        (softmax, 0, ref_softmax, 1e-6, "big softmax dim 0"),
        (log_softmax, 1, ref_log_softmax, 4e-6, "big log_softmax"),
    ];
    for (op, dim, reference, tol, what) in cases {
        let d = if dim < 0 { dim + 2 } else { dim } as usize;
        let want = along(&xv, &[256, 1024], d, &reference);
        check(
            &op(&x, dim, None).unwrap(),
            &want,
            &[256, 1024],
            DType::F32,
            tol,
            what,
        );
    }
}

#[test]
fn backward_helpers_match_formulas() {
    for dtype in DType::FLOATS {
        for (label, x) in inputs(dtype) {
            let g = Tensor::from_vec(uniform(x.elem_count(), 77, 4.0), x.dims().to_vec())
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let gv = g.to_vec_f64();
            for dim in [0i64, -1] {
                let d = if dim < 0 { dim + x.rank() as i64 } else { dim } as usize;
                let what = format!("{dtype} {label} dim={dim}");
                let y = softmax(&x, dim, None).unwrap();
                let yv = y.to_vec_f64();
                // out * (g - sum(g * out))
                let gy: Vec<f64> = gv.iter().zip(&yv).map(|(a, b)| a * b).collect();
                let s = along(&gy, x.dims(), d, &|l| vec![l.iter().sum::<f64>(); l.len()]);
                let want: Vec<f64> = yv
                    .iter()
                    .zip(&gv)
                    .zip(&s)
                    .map(|((y, g), s)| y * (g - s))
                    .collect();
                let got = softmax_backward(&g, &y, dim).unwrap();
                check(
                    &got,
                    &want,
                    x.dims(),
                    dtype,
                    tol(dtype) * 4.0,
                    &format!("softmax_backward {what}"),
                );
                // g - exp(out) * sum(g)
                let ly = log_softmax(&x, dim, None).unwrap();
                let lyv = ly.to_vec_f64();
                let s = along(&gv, x.dims(), d, &|l| vec![l.iter().sum::<f64>(); l.len()]);
                let want: Vec<f64> = gv
                    .iter()
                    .zip(&lyv)
                    .zip(&s)
                    .map(|((g, y), s)| g - y.exp() * s)
                    .collect();
                let got = log_softmax_backward(&g, &ly, dim).unwrap();
                let scale = s.iter().fold(1f64, |a, b| a.max(b.abs()));
                check(
                    &got,
                    &want,
                    x.dims(),
                    dtype,
                    tol(dtype) * 4.0 * scale,
                    &format!("log_softmax_backward {what}"),
                );
            }
        }
    }
    // mixed dtypes promote; mismatched shapes are errors
    let y = softmax(
        &Tensor::from_vec(uniform(6, 1, 4.0), [2, 3]).unwrap(),
        1,
        None,
    )
    .unwrap();
    let g = Tensor::ones([2usize, 3], DType::F32);
    let r = softmax_backward(&g, &y, 1).unwrap();
    assert_eq!(r.dtype(), DType::F64);
    assert!(r.to_vec_f64().iter().all(|v| v.abs() < 1e-12));
    assert!(softmax_backward(&Tensor::ones([3usize, 2], DType::F64), &y, 1).is_err());
    assert!(log_softmax_backward(&g, &y, 2).is_err());
}

#[test]
fn dims_and_shapes() {
    let x = Tensor::from_vec(uniform(6, 3, 4.0), [2, 3]).unwrap();
    let e = softmax(&x, 2, None).unwrap_err().to_string();
    assert_eq!(
        e,
        "Dimension out of range (expected to be in range of [-2, 1], but got 2)"
    );
    assert!(log_softmax(&x, -3, None).is_err());
    let s = Tensor::scalar(3.0f32);
    assert_eq!(softmax(&s, 0, None).unwrap().item_f64().unwrap(), 1.0);
    assert_eq!(log_softmax(&s, -1, None).unwrap().item_f64().unwrap(), 0.0);
    let e = Tensor::zeros([0usize, 4], DType::F32);
    assert_eq!(softmax(&e, 1, None).unwrap().dims(), &[0, 4]);
    assert_eq!(softmax(&e, 0, None).unwrap().dims(), &[0, 4]);
}

/// `scaled_softmax` and its backward on the host against the math path's ops in turn
/// (scalar product, `where` with -inf, softmax; softmax backward, scalar product):
/// float32 bit for bit, 16-bit within a rounding of the products. Rows past the fast
/// kernel's length take the ops themselves; the [4, 8, 64, 64] case is cut into row
/// blocks that start inside a causal matrix.
#[test]
fn scaled_softmax_is_the_math_path_in_one_pass() {
    for dims in [
        vec![2usize, 3, 37, 37],
        vec![3, 5, 40],
        vec![2, 7, 19],
        vec![4, 8, 64, 64],
        vec![2, 3, 300],
    ] {
        let count: usize = dims.iter().product();
        let (l, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let x = Tensor::from_vec(uniform(count, 3, 4.0), dims.clone()).unwrap();
        let g = Tensor::from_vec(uniform(count, 5, 1.0), dims.clone()).unwrap();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let (x, g) = (x.to_dtype(dtype).unwrap(), g.to_dtype(dtype).unwrap());
            for (scale, causal) in [(0.125, true), (0.3, false), (1.0, true)] {
                let what = format!("{dtype} {dims:?} scale {scale} causal {causal}");
                let fused = scaled_softmax(&x, scale, causal).unwrap();
                let w = binary_scalar(BinaryOp::Mul, &x, scale).unwrap();
                let w = if causal {
                    let keep: Vec<bool> =
                        (0..l).flat_map(|i| (0..s).map(move |j| j <= i)).collect();
                    let keep = Tensor::from_vec(keep, [l, s]).unwrap();
                    let inf = Tensor::scalar(f32::NEG_INFINITY).to_dtype(dtype).unwrap();
                    where_cond(&keep, &w, &inf).unwrap()
                } else {
                    w
                };
                let ops = softmax(&w, -1, None).unwrap();
                let fused_back = scaled_softmax_backward(&g, &fused, scale).unwrap();
                let ops_back = binary_scalar(
                    BinaryOp::Mul,
                    &softmax_backward(&g, &fused, -1).unwrap(),
                    scale,
                )
                .unwrap();
                if dtype == DType::F32 {
                    assert_eq!(bits(&fused), bits(&ops), "{what}");
                    assert_eq!(bits(&fused_back), bits(&ops_back), "{what} backward");
                } else {
                    let near = |got: &Tensor, want: &Tensor, k: f64, what: &str| {
                        check(got, &want.to_vec_f64(), &dims, dtype, k * tol(dtype), what)
                    };
                    near(&fused, &ops, 2.0, &what);
                    near(&fused_back, &ops_back, 4.0, &format!("{what} backward"));
                }
            }
        }
    }
}
