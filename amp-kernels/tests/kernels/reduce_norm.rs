//! layer_norm (+ backward checked by the workspace's gradient checker in f64),
//! group_norm and normalize against references written here.

use amp_kernels::*;
use amp_tensor::{DType, Tensor};
use amp_testing::gradcheck::numeric_grad;
use amp_testing::tensors::{assert_close_within, tolerance as tol};

/// Deterministic pseudo-random values in `[-2, 2)`.
fn values(n: usize, seed: u64) -> Vec<f64> {
    amp_testing::tensors::uniform(n, seed, 2.0)
}

fn t(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn check(got: &Tensor, want: &[f64], shape: &[usize], dtype: DType, rtol: f64, what: &str) {
    assert_eq!(got.dims(), shape, "{what}: shape");
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_close_within(&got.to_vec_f64(), want, rtol, what);
}

/// Reference layer norm over rows of `n`: (out, mean, rstd).
fn ref_ln(
    x: &[f64],
    n: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut out, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(n) {
        let m = row.iter().sum::<f64>() / n as f64;
        let v = row.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        let r = 1.0 / (v + eps).sqrt();
        for (j, &x) in row.iter().enumerate() {
            out.push((x - m) * r * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]));
        }
        means.push(m);
        rstds.push(r);
    }
    (out, means, rstds)
}

#[test]
fn layer_norm_forward() {
    for dtype in DType::FLOATS {
        for (ns, affine) in [(vec![8usize], true), (vec![3, 8], true), (vec![8], false)] {
            let base = t(&values(2 * 8 * 3, 1), &[2, 8, 3], dtype);
            let x = base.transpose(1usize, 2usize).unwrap(); // [2, 3, 8], strided
            let xv = x.to_vec_f64();
            let n: usize = ns.iter().product();
            let w = t(&values(n, 2), &ns, DType::F32);
            let b = t(&values(n, 3), &ns, dtype);
            let (wv, bv) = (w.to_vec_f64(), b.to_vec_f64());
            let (wo, bo) = if affine {
                (Some(&w), Some(&b))
            } else {
                (None, None)
            };
            let (out, mean, rstd) = layer_norm(&x, &ns, wo, bo, 1e-5).unwrap();
            let (ro, rm, rr) = ref_ln(
                &xv,
                n,
                affine.then_some(&wv[..]),
                affine.then_some(&bv[..]),
                1e-5,
            );
            let what = format!("{dtype} {ns:?} affine={affine}");
            check(&out, &ro, &[2, 3, 8], dtype, tol(dtype), &what);
            let stat_shape: Vec<usize> = if ns.len() == 1 {
                vec![2, 3, 1]
            } else {
                vec![2, 1, 1]
            };
            let acc = dtype.accumulation_dtype();
            check(&mean, &rm, &stat_shape, acc, 1e-6, &what);
            check(&rstd, &rr, &stat_shape, acc, 1e-5, &what);
        }
    }
    // parallel rows
    let x = t(&values(512 * 256, 4), &[512, 256], DType::F32);
    let (out, _, _) = layer_norm(&x, &[256], None, None, 1e-5).unwrap();
    let (ro, _, _) = ref_ln(&x.to_vec_f64(), 256, None, None, 1e-5);
    check(&out, &ro, &[512, 256], DType::F32, 1e-5, "large");
}

#[test]
fn layer_norm_errors() {
    let x = Tensor::zeros([2usize, 4], DType::F32);
    let e = layer_norm(&x, &[3], None, None, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Given normalized_shape=[3], expected input with shape [*, 3], but got input of size[2, 4]"), "{e}");
    assert!(layer_norm(&x, &[], None, None, 1e-5).is_err());
    assert!(layer_norm(&x, &[2, 2, 4], None, None, 1e-5).is_err());
    let w = Tensor::ones([3usize], DType::F32);
    let e = layer_norm(&x, &[4], Some(&w), None, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Expected weight to be of same shape as normalized_shape"),
        "{e}"
    );
    assert!(layer_norm(
        &Tensor::zeros([2usize, 4], DType::I64),
        &[4],
        None,
        None,
        1e-5
    )
    .is_err());
    let (m, r) = (
        Tensor::zeros([2usize, 1], DType::F32),
        Tensor::ones([2usize, 1], DType::F32),
    );
    assert!(layer_norm_backward(
        &Tensor::zeros([4usize, 2], DType::F32),
        &x,
        &[4],
        &m,
        &r,
        None
    )
    .is_err());
    assert!(
        layer_norm_backward(&x, &x, &[4], &Tensor::zeros([3usize], DType::F32), &r, None).is_err()
    );
}

/// `sum(layer_norm(x, w, b) * r)`, the scalar whose gradients the backward gives.
fn loss(x: &[f64], w: &[f64], b: &[f64], r: &[f64], shape: &[usize], ns: &[usize]) -> f64 {
    let (out, _, _) = layer_norm(
        &t(x, shape, DType::F64),
        ns,
        Some(&t(w, ns, DType::F64)),
        Some(&t(b, ns, DType::F64)),
        1e-5,
    )
    .unwrap();
    out.to_vec_f64().iter().zip(r).map(|(o, r)| o * r).sum()
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    for (shape, ns) in [
        (vec![3usize, 5], vec![5usize]),
        (vec![2, 3, 4], vec![3, 4]),
        (vec![4, 1, 6], vec![6]),
    ] {
        let n: usize = ns.iter().product();
        let numel: usize = shape.iter().product();
        let (x, w, b, r) = (
            values(numel, 11),
            values(n, 12),
            values(n, 13),
            values(numel, 14),
        );
        let xt = t(&x, &shape, DType::F64);
        let (_, mean, rstd) = layer_norm(&xt, &ns, None, None, 1e-5).unwrap();
        let (gi, gw, gb) = layer_norm_backward(
            &t(&r, &shape, DType::F64),
            &xt,
            &ns,
            &mean,
            &rstd,
            Some(&t(&w, &ns, DType::F64)),
        )
        .unwrap();
        let h = 1e-6;
        let xwb = [x.clone(), w, b];
        let fd = |which: usize| {
            numeric_grad(&xwb, which, h, |v| {
                loss(&v[0], &v[1], &v[2], &r, &shape, &ns)
            })
        };
        let (want_gi, want_gw, want_gb) = (fd(0), fd(1), fd(2));
        check(&gi, &want_gi, &shape, DType::F64, 1e-6, "grad_input");
        check(
            gw.as_ref().unwrap(),
            &want_gw,
            &ns,
            DType::F64,
            1e-6,
            "grad_weight",
        );
        check(
            gb.as_ref().unwrap(),
            &want_gb,
            &ns,
            DType::F64,
            1e-6,
            "grad_bias",
        );
        // without a weight: no grad_weight, grad_input of the unscaled normalisation
        let (gi, gw, gb) =
            layer_norm_backward(&t(&r, &shape, DType::F64), &xt, &ns, &mean, &rstd, None).unwrap();
        assert!(gw.is_none() && gb.is_some());
        let want = numeric_grad(&[x, vec![1.0; n], vec![0.0; n]], 0, h, |v| {
            loss(&v[0], &v[1], &v[2], &r, &shape, &ns)
        });
        check(
            &gi,
            &want,
            &shape,
            DType::F64,
            1e-6,
            "grad_input without weight",
        );
    }
}

#[test]
fn layer_norm_backward_low_precision() {
    // 16-bit and f32 inputs give the f64 result within their tolerance
    let shape = [6usize, 16];
    let (x, w, g) = (values(96, 21), values(16, 22), values(96, 23));
    let x64 = t(&x, &shape, DType::F64);
    let (_, m64, r64) = layer_norm(&x64, &[16], None, None, 1e-5).unwrap();
    let (gi64, gw64, gb64) = layer_norm_backward(
        &t(&g, &shape, DType::F64),
        &x64,
        &[16],
        &m64,
        &r64,
        Some(&t(&w, &[16], DType::F64)),
    )
    .unwrap();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        let xd = t(&x, &shape, dtype);
        let (_, m, r) = layer_norm(&xd, &[16], None, None, 1e-5).unwrap();
        let wd = t(&w, &[16], DType::F32);
        let (gi, gw, gb) =
            layer_norm_backward(&t(&g, &shape, dtype), &xd, &[16], &m, &r, Some(&wd)).unwrap();
        let scale = 20.0;
        check(
            &gi,
            &gi64.to_vec_f64(),
            &shape,
            dtype,
            tol(dtype) * scale,
            &format!("{dtype} gi"),
        );
        // The affine gradients are float32 whatever the input's dtype.
        for (name, got, want) in [("gw", &gw, &gw64), ("gb", &gb, &gb64)] {
            let want = want.as_ref().unwrap().to_vec_f64();
            let what = format!("{dtype} {name}");
            check(
                got.as_ref().unwrap(),
                &want,
                &[16],
                DType::F32,
                tol(dtype) * scale,
                &what,
            );
        }
    }
}

#[test]
fn group_norm_forward() {
    for dtype in DType::FLOATS {
        let (nb, c, hw, g) = (2usize, 6usize, 5usize, 3usize);
        let x = t(&values(nb * c * hw, 31), &[nb, c, hw], dtype);
        let xv = x.to_vec_f64();
        let (w, b) = (
            t(&values(c, 32), &[c], dtype),
            t(&values(c, 33), &[c], dtype),
        );
        let (wv, bv) = (w.to_vec_f64(), b.to_vec_f64());
        let (out, mean, rstd) = group_norm(&x, g, Some(&w), Some(&b), 1e-5).unwrap();
        let gl = c / g * hw;
        let (ro, rm, rr) = ref_ln(&xv, gl, None, None, 1e-5);
        let want: Vec<f64> = ro
            .iter()
            .enumerate()
            .map(|(k, v)| {
                let ch = (k / hw) % c;
                v * wv[ch] + bv[ch]
            })
            .collect();
        check(
            &out,
            &want,
            &[nb, c, hw],
            dtype,
            tol(dtype),
            &format!("group_norm {dtype}"),
        );
        check(
            &mean,
            &rm,
            &[nb, g],
            dtype.accumulation_dtype(),
            1e-6,
            "mean",
        );
        check(
            &rstd,
            &rr,
            &[nb, g],
            dtype.accumulation_dtype(),
            1e-5,
            "rstd",
        );
        let (out, _, _) = group_norm(&x, 1, None, None, 1e-5).unwrap();
        check(
            &out,
            &ref_ln(&xv, c * hw, None, None, 1e-5).0,
            &[nb, c, hw],
            dtype,
            tol(dtype),
            "one group",
        );
    }
    let x = Tensor::zeros([2usize, 6, 4], DType::F32);
    let e = group_norm(&x, 4, None, None, 1e-5).unwrap_err().to_string();
    assert!(e.contains("Expected number of channels in input to be divisible by num_groups, but got input of shape [2, 6, 4] and num_groups=4"), "{e}");
    assert!(group_norm(&Tensor::zeros([6usize], DType::F32), 3, None, None, 1e-5).is_err());
    assert!(group_norm(&x, 3, Some(&Tensor::ones([3usize], DType::F32)), None, 1e-5).is_err());
    // [N, C] input (no spatial dims)
    let (out, _, _) =
        group_norm(&t(&values(12, 3), &[2, 6], DType::F64), 2, None, None, 0.0).unwrap();
    assert_eq!(out.dims(), &[2, 6]);
}

#[test]
fn normalize_lines() {
    for dtype in DType::FLOATS {
        let base = t(&values(4 * 7, 41), &[7, 4], dtype);
        let x = base.t().unwrap(); // [4, 7] strided
        let xv = x.to_vec_f64();
        for (p, dim) in [(2.0, -1i64), (1.0, 0), (f64::INFINITY, 1), (3.0, 0)] {
            let mut want = xv.clone();
            let (outer, n, inner) = if dim == 0 { (1, 4, 7) } else { (4, 7, 1) };
            for o in 0..outer {
                for j in 0..inner {
                    let idx: Vec<usize> = (0..n).map(|i| (o * n + i) * inner + j).collect();
                    let nrm = if p.is_infinite() {
                        idx.iter().fold(0f64, |a, &k| a.max(xv[k].abs()))
                    } else {
                        idx.iter()
                            .map(|&k| xv[k].abs().powf(p))
                            .sum::<f64>()
                            .powf(1.0 / p)
                    };
                    for &k in &idx {
                        want[k] = xv[k] / nrm.max(1e-12);
                    }
                }
            }
            check(
                &normalize(&x, p, dim, 1e-12).unwrap(),
                &want,
                &[4, 7],
                dtype,
                tol(dtype),
                &format!("normalize {dtype} p={p} dim={dim}"),
            );
        }
    }
    let z = Tensor::from_vec(vec![0.0f32, 0.0, 3.0, 4.0], [2, 2]).unwrap();
    assert_eq!(
        normalize(&z, 2.0, 1, 1e-12)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![0.0, 0.0, 0.6, 0.8]
    );
    let small = Tensor::from_vec(vec![1e-3f64, 0.0], [2]).unwrap();
    assert_eq!(
        normalize(&small, 2.0, 0, 0.1).unwrap().to_vec_f64(),
        vec![1e-2, 0.0]
    );
    assert!(normalize(&Tensor::ones([2usize], DType::I64), 2.0, 0, 1e-12).is_err());
    assert!(normalize(&z, 2.0, 2, 1e-12).is_err());
}
