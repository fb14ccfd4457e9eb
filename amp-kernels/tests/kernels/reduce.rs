//! Reductions against f64 references computed here: every float dtype, contiguous,
//! transposed, permuted and sliced inputs, keepdim on/off, negative dims, NaN
//! propagation, integer rules and error messages.

use amp_kernels::*;
use amp_tensor::{DType, Tensor};

// Shape, dtype, contiguity, and the values rounded to the dtype within a tolerance.
use amp_testing::tensors::{assert_tensor_close as check, Tolerances};

/// Deterministic pseudo-random values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f64> {
    amp_testing::tensors::uniform(n, seed, 1.0)
}

/// Relative tolerances of one result rounded to its dtype (plus accumulation slack).
pub(super) const TOL: Tolerances = Tolerances {
    f16: 2e-3,
    bf16: 1.6e-2,
    f32: 2e-5,
    f64: 1e-11,
};

fn tol(dtype: DType) -> f64 {
    TOL.of(dtype)
}

/// Reference reduction of row-major `x` of `shape` over the `mask`ed dims: each output
/// sees its reduced elements in row-major order.
pub(super) fn reference(
    x: &[f64],
    shape: &[usize],
    mask: &[bool],
    keepdim: bool,
    f: &dyn Fn(&[f64]) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let full: Vec<usize> = shape
        .iter()
        .zip(mask)
        .map(|(&d, &m)| if m { 1 } else { d })
        .collect();
    let mut groups = vec![Vec::new(); full.iter().product()];
    for (flat, &v) in x.iter().enumerate() {
        let (mut rem, mut o, mut mult) = (flat, 0, 1);
        for a in (0..shape.len()).rev() {
            let i = rem % shape[a];
            rem /= shape[a];
            if !mask[a] {
                o += i * mult;
                mult *= shape[a];
            }
        }
        groups[o].push(v);
    }
    let out = groups.iter().map(|g| f(g)).collect();
    let shape = if keepdim {
        full
    } else {
        shape
            .iter()
            .zip(mask)
            .filter(|(_, &m)| !m)
            .map(|(&d, _)| d)
            .collect()
    };
    (out, shape)
}

fn mask_of(rank: usize, dims: &[i64]) -> Vec<bool> {
    if dims.is_empty() {
        return vec![true; rank];
    }
    let mut m = vec![false; rank];
    for &d in dims {
        m[(if d < 0 { d + rank as i64 } else { d }) as usize] = true;
    }
    m
}

/// The layouts every reduction is checked on: the same logical `[4, 5, 6]`-ish values
/// stored contiguously, transposed, permuted, and sliced (not contiguous at all).
fn layouts(dtype: DType, seed: u64) -> Vec<(&'static str, Tensor)> {
    let base = |shape: &[usize]| {
        let n = shape.iter().product();
        Tensor::from_vec(values(n, seed), shape.to_vec())
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    vec![
        ("contiguous", base(&[4, 5, 6])),
        (
            "transposed",
            base(&[6, 5, 4]).permute(&[2usize, 1, 0]).unwrap(),
        ),
        (
            "permuted",
            base(&[5, 4, 6]).permute(&[1usize, 0, 2]).unwrap(),
        ),
        (
            "sliced",
            base(&[4, 7, 6])
                .narrow(1usize, 1, 5)
                .unwrap()
                .slice(2usize, 0, 12, 1)
                .unwrap(),
        ),
        (
            "strided",
            base(&[4, 5, 12]).slice(2usize, 1, 12, 2).unwrap(),
        ),
        ("matrix_t", base(&[33, 40]).t().unwrap()),
        ("vector", base(&[37])),
        ("expanded", base(&[4, 1, 6]).expand([4i64, 5, 6]).unwrap()),
    ]
}

const DIM_SETS: [&[i64]; 9] = [
    &[],
    &[0],
    &[-1],
    &[1],
    &[0, 2],
    &[-1, 0],
    &[1, 2],
    &[0, 1],
    &[2, 0, 1],
];

type Kernel = fn(&Tensor, &[i64], bool) -> amp_tensor::Result<Tensor>;

/// Run `kernel` over every dtype, layout, dim set and keepdim against `f`.
fn sweep(name: &str, kernel: Kernel, f: &dyn Fn(&[f64]) -> f64, rtol_scale: f64) {
    for dtype in DType::FLOATS {
        for (label, x) in layouts(dtype, 7) {
            let xv = x.to_vec_f64();
            for dims in DIM_SETS {
                let r = x.rank() as i64;
                let mut wrapped: Vec<i64> = dims
                    .iter()
                    .map(|&d| if d < 0 { d + r } else { d })
                    .collect();
                wrapped.sort_unstable();
                wrapped.dedup();
                if wrapped.len() != dims.len() || wrapped.iter().any(|&d| d < 0 || d >= r) {
                    continue;
                }
                for keepdim in [false, true] {
                    let mask = mask_of(x.rank(), dims);
                    let (want, shape) = reference(&xv, x.dims(), &mask, keepdim, f);
                    let got = kernel(&x, dims, keepdim).unwrap();
                    let what = format!("{name} {dtype} {label} dims={dims:?} keepdim={keepdim}");
                    check(&got, &want, &shape, dtype, tol(dtype) * rtol_scale, &what);
                }
            }
        }
    }
}

fn ref_sum(v: &[f64]) -> f64 {
    v.iter().sum()
}

fn ref_mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn ref_var(v: &[f64], correction: f64) -> f64 {
    let m = ref_mean(v);
    v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - correction).max(0.0)
}

#[test]
fn sum_mean_all_layouts() {
    sweep("sum", |x, d, k| sum(x, d, k, None), &ref_sum, 1.0);
    sweep("mean", |x, d, k| mean(x, d, k, None), &ref_mean, 1.0);
}

#[test]
fn prod_all_layouts() {
    // prod over one dim (or all); values are scaled away from 0 to keep products sane
    for dtype in DType::FLOATS {
        for (label, x) in layouts(dtype, 11) {
            let x = amp_kernels::amp_tensor::Tensor::from_vec(
                x.to_vec_f64()
                    .iter()
                    .map(|v| 1.0 + v * 0.5)
                    .collect::<Vec<_>>(),
                x.dims().to_vec(),
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
            let xv = x.to_vec_f64();
            for dim in [None, Some(0), Some(-1)] {
                for keepdim in [false, true] {
                    let dims: Vec<i64> = dim.into_iter().collect();
                    let mask = mask_of(x.rank(), &dims);
                    let (want, shape) =
                        reference(&xv, x.dims(), &mask, keepdim, &|v| v.iter().product());
                    let got = prod(&x, dim, keepdim, None).unwrap();
                    check(
                        &got,
                        &want,
                        &shape,
                        dtype,
                        tol(dtype) * 4.0,
                        &format!("prod {dtype} {label} {dim:?}"),
                    );
                }
            }
        }
    }
}

#[test]
fn amax_amin_all_layouts() {
    let max = |v: &[f64]| v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let min = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    sweep("amax", amax, &max, 0.0);
    sweep("amin", amin, &min, 0.0);
}

#[test]
fn norms_all_layouts() {
    let p2 = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let p1 = |v: &[f64]| v.iter().map(|x| x.abs()).sum::<f64>();
    let p0 = |v: &[f64]| v.iter().filter(|&&x| x != 0.0).count() as f64;
    let pinf = |v: &[f64]| v.iter().fold(0f64, |a, x| a.max(x.abs()));
    let pninf = |v: &[f64]| v.iter().fold(f64::INFINITY, |a, x| a.min(x.abs()));
    let p3 = |v: &[f64]| v.iter().map(|x| x.abs().powi(3)).sum::<f64>().cbrt();
    let pm = |v: &[f64]| v.iter().map(|x| x.abs().powf(0.5)).sum::<f64>().powi(2);
    sweep("norm2", |x, d, k| norm(x, 2.0, d, k), &p2, 1.0);
    sweep("norm1", |x, d, k| norm(x, 1.0, d, k), &p1, 1.0);
    sweep("norm0", |x, d, k| norm(x, 0.0, d, k), &p0, 1.0);
    sweep(
        "norminf",
        |x, d, k| norm(x, f64::INFINITY, d, k),
        &pinf,
        0.0,
    );
    sweep(
        "normninf",
        |x, d, k| norm(x, f64::NEG_INFINITY, d, k),
        &pninf,
        0.0,
    );
    sweep("norm3", |x, d, k| norm(x, 3.0, d, k), &p3, 2.0);
    sweep("norm0.5", |x, d, k| norm(x, 0.5, d, k), &pm, 4.0);
}

#[test]
fn logsumexp_var_std_all_layouts() {
    let lse = |v: &[f64]| {
        let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    };
    sweep("logsumexp", logsumexp, &lse, 1.0);
    sweep(
        "var",
        |x, d, k| var(x, d, 1.0, k),
        &|v| ref_var(v, 1.0),
        2.0,
    );
    sweep(
        "var0",
        |x, d, k| var(x, d, 0.0, k),
        &|v| ref_var(v, 0.0),
        2.0,
    );
    sweep(
        "std",
        |x, d, k| std(x, d, 1.0, k),
        &|v| ref_var(v, 1.0).sqrt(),
        2.0,
    );
}

#[test]
fn max_min_dim_and_arg() {
    type Pick = fn(&Tensor, i64, bool) -> amp_tensor::Result<(Tensor, Tensor)>;
    type Arg = fn(&Tensor, Option<i64>, bool) -> amp_tensor::Result<Tensor>;
    type All = fn(&Tensor) -> amp_tensor::Result<Tensor>;
    type Fold = fn(f64, f64) -> f64;
    let cases: [(&str, Pick, Arg, All, f64, Fold); 2] = [
        ("max", max_dim, argmax, max_all, f64::NEG_INFINITY, f64::max),
        ("min", min_dim, argmin, min_all, f64::INFINITY, f64::min),
    ];
    for dtype in DType::FLOATS {
        for (label, x) in layouts(dtype, 3) {
            let xv = x.to_vec_f64();
            for dim in [0i64, -1, 1] {
                if dim >= x.rank() as i64 {
                    continue;
                }
                for keepdim in [false, true] {
                    let mask = mask_of(x.rank(), &[dim]);
                    let what = format!("{dtype} {label} dim={dim} keepdim={keepdim}");
                    for (name, pick, arg, _, start, better) in cases {
                        let best = |v: &[f64]| v.iter().cloned().fold(start, better);
                        let at_best = |v: &[f64]| {
                            let m = best(v);
                            v.iter().position(|&x| x == m).unwrap() as f64
                        };
                        let (v, i) = pick(&x, dim, keepdim).unwrap();
                        let (wv, shape) = reference(&xv, x.dims(), &mask, keepdim, &best);
                        let (wi, _) = reference(&xv, x.dims(), &mask, keepdim, &at_best);
                        let values = format!("{name}_dim values {what}");
                        check(&v, &wv, &shape, dtype, 0.0, &values);
                        let indices = format!("{name}_dim indices {what}");
                        check(&i, &wi, &shape, DType::I64, 0.0, &indices);
                        let a = arg(&x, Some(dim), keepdim).unwrap();
                        check(&a, &wi, &shape, DType::I64, 0.0, &what);
                    }
                }
            }
            // flattened argmax/argmin index into the logical row-major order, and the
            // value of the whole-tensor reduction
            let ones = vec![1; x.rank()];
            for (_, _, arg, all, start, better) in cases {
                let m = xv.iter().cloned().fold(start, better);
                let am = xv.iter().position(|&v| v == m).unwrap() as f64;
                let flat = arg(&x, None, false).unwrap();
                check(&flat, &[am], &[], DType::I64, 0.0, label);
                let kept = arg(&x, None, true).unwrap();
                check(&kept, &[am], &ones, DType::I64, 0.0, label);
                check(&all(&x).unwrap(), &[m], &[], dtype, 0.0, label);
            }
        }
    }
}

#[test]
fn ties_take_first_index() {
    let x = Tensor::from_vec(vec![1.0f32, 3.0, 3.0, 0.0, 3.0, 2.0, 2.0, 2.0], [2, 4]).unwrap();
    let (v, i) = max_dim(&x, 1, false).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 0]);
    let i = argmin(&x, Some(0), false).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 1, 1, 0]);
    // column path (non-trailing dim) keeps the first too
    let i = argmax(
        &Tensor::from_vec(vec![5i64, 1, 5, 7, 5, 7], [3, 2]).unwrap(),
        Some(0),
        false,
    )
    .unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 1]);
}

#[test]
fn nan_propagation() {
    let nan = f64::NAN;
    for dtype in DType::FLOATS {
        let x = Tensor::from_vec(vec![1.0, nan, 5.0, nan, 2.0, 3.0, -1.0, 0.5, 4.0], [3, 3])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let what = format!("{dtype}");
        let amax_rows = amax(&x, &[1], false).unwrap();
        check(&amax_rows, &[nan, nan, 4.0], &[3], dtype, 0.0, &what);
        let amin_cols = amin(&x, &[0], false).unwrap();
        check(&amin_cols, &[nan, nan, 3.0], &[3], dtype, 0.0, &what);
        check(&max_all(&x).unwrap(), &[nan], &[], dtype, 0.0, &what);
        check(&min_all(&x).unwrap(), &[nan], &[], dtype, 0.0, &what);
        let (v, i) = max_dim(&x, 1, false).unwrap();
        check(&v, &[nan, nan, 4.0], &[3], dtype, 0.0, &what);
        check(&i, &[1.0, 0.0, 2.0], &[3], DType::I64, 0.0, &what);
        let (v, i) = min_dim(&x, 0, true).unwrap();
        check(&v, &[nan, nan, 3.0], &[1, 3], dtype, 0.0, &what);
        check(&i, &[1.0, 0.0, 1.0], &[1, 3], DType::I64, 0.0, &what);
        check(
            &argmax(&x, None, false).unwrap(),
            &[1.0],
            &[],
            DType::I64,
            0.0,
            &what,
        );
        check(
            &sum(&x, &[1], false, None).unwrap(),
            &[nan, nan, 3.5],
            &[3],
            dtype,
            tol(dtype),
            &what,
        );
        check(
            &norm(&x, 2.0, &[1], false).unwrap(),
            &[nan, nan, 4.153311931459037],
            &[3],
            dtype,
            tol(dtype),
            &what,
        );
        check(
            &norm(&x, f64::INFINITY, &[1], false).unwrap(),
            &[nan, nan, 4.0],
            &[3],
            dtype,
            0.0,
            &what,
        );
        // the first two rows (the ones holding a NaN) of logsumexp and var
        for r in [
            logsumexp(&x, &[1], false).unwrap(),
            var(&x, &[1], 1.0, false).unwrap(),
        ] {
            let rows = r.narrow(0usize, 0, 2).unwrap().contiguous();
            check(&rows, &[nan, nan], &[2], dtype, 0.0, &what);
        }
        // long rows (lane kernels) and long columns (column kernels) too
        let mut big = values(5000, 1);
        big[3777] = nan;
        let b = Tensor::from_vec(big.clone(), [5000])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert!(amax(&b, &[], false).unwrap().item_f64().unwrap().is_nan());
        assert_eq!(
            argmax(&b, Some(0), false).unwrap().item::<i64>().unwrap(),
            3777
        );
        assert_eq!(
            argmin(&b, None, false).unwrap().item::<i64>().unwrap(),
            3777
        );
        let col = b.reshape([1000usize, 5]).unwrap();
        let (v, i) = max_dim(&col, 0, false).unwrap();
        assert!(v.to_vec_f64()[2].is_nan());
        assert_eq!(i.to_vec::<i64>().unwrap()[2], 755);
    }
}

#[test]
fn infinities() {
    let inf = f64::INFINITY;
    let x = Tensor::from_vec(
        vec![-inf, -inf, -inf, 1.0, -inf, 2.0, inf, 0.0, 1.0],
        [3, 3],
    )
    .unwrap();
    let lse = logsumexp(&x, &[1], false).unwrap().to_vec_f64();
    assert_eq!(lse[0], -inf);
    assert!((lse[1] - (1f64.exp() + 2f64.exp()).ln()).abs() < 1e-6);
    assert_eq!(lse[2], inf);
    assert_eq!(
        logsumexp(&Tensor::zeros([0usize], DType::F32), &[], false)
            .unwrap()
            .item_f64()
            .unwrap(),
        -inf
    );
    let big = Tensor::from_vec(vec![1000.0f32, 1000.0], [2]).unwrap();
    let v = logsumexp(&big, &[0], false).unwrap().item_f64().unwrap();
    assert!((v - (1000.0 + 2f64.ln())).abs() < 1e-3);
    assert_eq!(norm(&x, 2.0, &[], false).unwrap().item_f64().unwrap(), inf);
    assert_eq!(amax(&x, &[], false).unwrap().item_f64().unwrap(), inf);
}

#[test]
fn l2_norm_is_scaling_safe() {
    // squares overflow / underflow f32 (and bf16, whose range is f32's)
    for dtype in [DType::BF16, DType::F32] {
        for scale in [1e30, 1e-30, 1e-40] {
            let v: Vec<f64> = (0..3000).map(|i| scale * (1.0 + (i % 7) as f64)).collect();
            let x = Tensor::from_vec(v, [3000])
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let xv = x.to_vec_f64();
            let want = xv.iter().map(|v| v * v).sum::<f64>().sqrt();
            let got = norm(&x, 2.0, &[], false).unwrap().item_f64().unwrap();
            assert!(
                ((got - want) / want).abs() < tol(dtype),
                "{dtype} {scale}: {got} vs {want}"
            );
            // the same through the column kernel
            let got = norm(&x.reshape([1000usize, 3]).unwrap(), 2.0, &[0], false)
                .unwrap()
                .to_vec_f64();
            assert!(
                got.iter().all(|g| g.is_finite() && *g > 0.0),
                "{dtype} {scale}: {got:?}"
            );
        }
    }
    let x = Tensor::from_vec(vec![3e200f64, 4e200, 0.0], [3]).unwrap();
    assert!((norm(&x, 2.0, &[], false).unwrap().item_f64().unwrap() / 5e200 - 1.0).abs() < 1e-15);
    let x = Tensor::from_vec(vec![3e-200f64, 4e-200], [2]).unwrap();
    assert!((norm(&x, 2.0, &[], false).unwrap().item_f64().unwrap() / 5e-200 - 1.0).abs() < 1e-15);
    let mixed = Tensor::from_vec(vec![1e-25f32, 1.0, 1e25], [3]).unwrap();
    assert!((norm(&mixed, 2.0, &[], false).unwrap().item_f64().unwrap() / 1e25 - 1.0).abs() < 1e-6);
}

#[test]
fn integer_and_bool_rules() {
    let x = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    let s = sum(&x, &[1], false, None).unwrap();
    assert_eq!(s.dtype(), DType::I64);
    assert_eq!(s.to_vec::<i64>().unwrap(), vec![6, 15]);
    let s = sum(&x, &[0], true, Some(DType::I32)).unwrap();
    assert_eq!((s.dtype(), s.dims()), (DType::I32, &[1usize, 3][..]));
    assert_eq!(s.to_vec::<i32>().unwrap(), vec![5, 7, 9]);
    let s = sum(&x, &[], false, Some(DType::F16)).unwrap();
    assert_eq!((s.dtype(), s.item_f64().unwrap()), (DType::F16, 21.0));
    let p = prod(&x, Some(-1), false, None).unwrap();
    assert_eq!(
        (p.dtype(), p.to_vec::<i64>().unwrap()),
        (DType::I64, vec![6, 120])
    );
    let b = Tensor::from_vec(vec![true, false, true, true], [4]).unwrap();
    let s = sum(&b, &[], false, None).unwrap();
    assert_eq!((s.dtype(), s.item::<i64>().unwrap()), (DType::I64, 3));
    let m = amax(&b, &[], false).unwrap();
    assert_eq!((m.dtype(), m.item::<bool>().unwrap()), (DType::Bool, true));
    let big = Tensor::from_vec(vec![i64::MAX - 1, 5, i64::MIN + 3], [3]).unwrap();
    assert_eq!(
        amax(&big, &[0], false).unwrap().item::<i64>().unwrap(),
        i64::MAX - 1
    );
    assert_eq!(
        argmin(&big, Some(0), false).unwrap().item::<i64>().unwrap(),
        2
    );
    assert_eq!(
        cumsum(&x, 1, None).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 3, 6, 4, 9, 15]
    );
    let e = mean(&x.to_dtype(DType::I64).unwrap(), &[], false, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: Long"),
        "{e}"
    );
    let e = mean(&x, &[], false, Some(DType::I64))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Optional dtype must be either a floating point or complex dtype. Got: Long"),
        "{e}"
    );
    let m = mean(&x, &[1], false, Some(DType::F64)).unwrap();
    assert_eq!(
        (m.dtype(), m.to_vec::<f64>().unwrap()),
        (DType::F64, vec![2.0, 5.0])
    );
    assert!(norm(&x, 2.0, &[], false)
        .unwrap_err()
        .to_string()
        .contains("Expected a floating point"));
    assert!(var(&x, &[], 1.0, false).is_err());
    let l = logsumexp(&x, &[1], false).unwrap();
    assert_eq!(l.dtype(), DType::F32);
}

#[test]
fn dtype_argument_casts_input_first() {
    // ±70000 overflow f16: after the cast the sum is inf - inf = NaN, as in PyTorch
    let x = Tensor::from_vec(vec![70000.0f32, -70000.0], [2]).unwrap();
    assert!(sum(&x, &[], false, Some(DType::F16))
        .unwrap()
        .item_f64()
        .unwrap()
        .is_nan());
    let h = Tensor::from_vec(vec![60000.0f32, 60000.0], [2])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    // f16 accumulates in f32, rounds once: the mean is representable
    assert_eq!(
        mean(&h, &[], false, None).unwrap().item_f64().unwrap(),
        60000.0
    );
    let s = sum(&h, &[], false, Some(DType::F32)).unwrap();
    assert_eq!((s.dtype(), s.item_f64().unwrap()), (DType::F32, 120000.0));
    // many small f16 values: accumulating in f16 would stall at 2048
    let ones = Tensor::ones([10000usize], DType::F16);
    assert_eq!(
        sum(&ones, &[], false, None).unwrap().item_f64().unwrap(),
        10000.0
    );
    let c = cumsum(&ones, 0, None).unwrap().to_vec_f64();
    assert_eq!(c[4095], 4096.0);
    let c = cumsum(&ones, 0, Some(DType::F32)).unwrap();
    assert_eq!((c.dtype(), c.to_vec_f64()[9999]), (DType::F32, 10000.0));
}

#[test]
fn scans_all_layouts() {
    for dtype in DType::FLOATS {
        for (label, x) in layouts(dtype, 5) {
            let xv = x.to_vec_f64();
            let shape = x.dims().to_vec();
            for dim in [0i64, -1, 1] {
                if dim >= x.rank() as i64 {
                    continue;
                }
                let d = if dim < 0 { dim + x.rank() as i64 } else { dim } as usize;
                let stride: usize = shape[d + 1..].iter().product();
                let n = shape[d];
                let mut want_s = xv.clone();
                let mut want_p = xv.iter().map(|v| 1.0 + v * 0.1).collect::<Vec<_>>();
                let xp = Tensor::from_vec(want_p.clone(), shape.clone())
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                want_p = xp.to_vec_f64();
                for base in 0..xv.len() {
                    if !(base / stride).is_multiple_of(n) {
                        continue;
                    }
                    for k in 1..n {
                        want_s[base + k * stride] += want_s[base + (k - 1) * stride];
                        want_p[base + k * stride] *= want_p[base + (k - 1) * stride];
                    }
                }
                let what = format!("{dtype} {label} dim={dim}");
                check(
                    &cumsum(&x, dim, None).unwrap(),
                    &want_s,
                    &shape,
                    dtype,
                    tol(dtype) * 4.0,
                    &format!("cumsum {what}"),
                );
                check(
                    &cumprod(&xp, dim, None).unwrap(),
                    &want_p,
                    &shape,
                    dtype,
                    tol(dtype) * 4.0,
                    &format!("cumprod {what}"),
                );
            }
        }
    }
    let s = Tensor::scalar(2.5f32);
    assert_eq!(cumsum(&s, -1, None).unwrap().item_f64().unwrap(), 2.5);
    assert!(cumsum(&s, 1, None).is_err());
}

#[test]
fn large_inputs_take_parallel_paths() {
    // one long row (segments across threads), many rows, tall columns, wide columns
    let n = 1 << 20;
    let v = values(n, 99);
    let want: f64 = v.iter().sum();
    for dtype in DType::FLOATS {
        let x = Tensor::from_vec(v.clone(), [n])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let xv = x.to_vec_f64();
        let want_r: f64 = xv.iter().sum();
        let got = sum(&x, &[], false, None).unwrap().item_f64().unwrap();
        let scale = xv.iter().map(|v| v.abs()).sum::<f64>();
        assert!(
            (got - want_r).abs() <= scale * 1e-6 + want_r.abs() * tol(dtype),
            "{dtype}: {got} vs {want_r}"
        );
        let m = mean(&x, &[0], false, None).unwrap().item_f64().unwrap();
        assert!(
            (m - want_r / n as f64).abs() < 1e-6 + tol(dtype) * (want_r / n as f64).abs(),
            "{dtype}"
        );
        for shape in [[1024usize, 1024], [n / 3, 3], [4, n / 4]] {
            if shape[0] * shape[1] != n {
                continue;
            }
            let m2 = x.reshape(shape).unwrap();
            for dim in [0i64, 1] {
                let mask = mask_of(2, &[dim]);
                let (w, s) = reference(&xv, &shape, &mask, false, &ref_sum);
                let got = sum(&m2, &[dim], false, None).unwrap();
                check(
                    &got,
                    &w,
                    &s,
                    dtype,
                    tol(dtype) * 2.0,
                    &format!("{dtype} {shape:?} dim {dim}"),
                );
                let (w, s) = reference(&xv, &shape, &mask, false, &|g| {
                    g.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                });
                check(
                    &amax(&m2, &[dim], false).unwrap(),
                    &w,
                    &s,
                    dtype,
                    0.0,
                    "amax",
                );
            }
        }
    }
    let _ = want;
    let x = Tensor::from_vec(values(3 * 1000 * 700, 5), [3, 1000, 700]).unwrap();
    let xv = x.to_vec_f64();
    let (w, s) = reference(
        &xv,
        &[3, 1000, 700],
        &[false, true, false],
        true,
        &ref_var_1,
    );
    check(
        &var(&x, &[1], 1.0, true).unwrap(),
        &w,
        &s,
        DType::F64,
        1e-11,
        "var middle",
    );
}

fn ref_var_1(v: &[f64]) -> f64 {
    ref_var(v, 1.0)
}

#[test]
fn empty_inputs() {
    let e = Tensor::zeros([0usize, 3], DType::F32);
    check(
        &sum(&e, &[0], false, None).unwrap(),
        &[0.0; 3],
        &[3],
        DType::F32,
        0.0,
        "sum empty",
    );
    check(
        &prod(&e, Some(0), false, None).unwrap(),
        &[1.0; 3],
        &[3],
        DType::F32,
        0.0,
        "prod empty",
    );
    check(
        &sum(&e, &[1], true, None).unwrap(),
        &[],
        &[0, 1],
        DType::F32,
        0.0,
        "sum empty kept",
    );
    assert!(mean(&e, &[0], false, None)
        .unwrap()
        .to_vec_f64()
        .iter()
        .all(|v| v.is_nan()));
    check(
        &amax(&e, &[1], false).unwrap(),
        &[],
        &[0],
        DType::F32,
        0.0,
        "amax to empty",
    );
    let msg = max_all(&e).unwrap_err().to_string();
    assert!(
        msg.contains("max(): Expected reduction dim to be specified for input.numel() == 0"),
        "{msg}"
    );
    let msg = amax(&e, &[0], false).unwrap_err().to_string();
    assert!(
        msg.contains("amax(): Expected reduction dim 0 to have non-zero size."),
        "{msg}"
    );
    let msg = max_dim(&e, 0, false).unwrap_err().to_string();
    assert!(
        msg.contains("max(): Expected reduction dim 0 to have non-zero size."),
        "{msg}"
    );
    assert!(min_all(&e).is_err() && argmax(&e, None, false).is_err());
    assert!(norm(&e, f64::INFINITY, &[0], false).is_err());
    check(
        &norm(&e, 2.0, &[0], false).unwrap(),
        &[0.0; 3],
        &[3],
        DType::F32,
        0.0,
        "norm empty",
    );
}

#[test]
fn zero_dim_inputs() {
    let s = Tensor::scalar(-3.0f32);
    check(
        &sum(&s, &[], false, None).unwrap(),
        &[-3.0],
        &[],
        DType::F32,
        0.0,
        "sum",
    );
    check(
        &sum(&s, &[0], true, None).unwrap(),
        &[-3.0],
        &[],
        DType::F32,
        0.0,
        "sum dim 0",
    );
    check(
        &amax(&s, &[-1], false).unwrap(),
        &[-3.0],
        &[],
        DType::F32,
        0.0,
        "amax",
    );
    let (v, i) = max_dim(&s, 0, false).unwrap();
    assert_eq!((v.item_f64().unwrap(), i.item::<i64>().unwrap()), (-3.0, 0));
    check(
        &norm(&s, 1.0, &[], false).unwrap(),
        &[3.0],
        &[],
        DType::F32,
        0.0,
        "norm",
    );
    assert!(sum(&s, &[1], false, None).is_err());
}

#[test]
fn bad_dims_are_errors() {
    let x = Tensor::zeros([2usize, 3], DType::F32);
    let e = sum(&x, &[2], false, None).unwrap_err().to_string();
    assert_eq!(
        e,
        "Dimension out of range (expected to be in range of [-2, 1], but got 2)"
    );
    assert!(sum(&x, &[-3], false, None).is_err());
    let e = sum(&x, &[1, -1], false, None).unwrap_err().to_string();
    assert!(
        e.contains("dim 1 appears multiple times in the list of dims"),
        "{e}"
    );
    assert!(max_dim(&x, 5, false).is_err());
    assert!(argmax(&x, Some(-3), false).is_err());
    assert!(cumsum(&x, 2, None).is_err());
    assert!(var(&x, &[0, 0], 1.0, false).is_err());
    assert!(norm(&x, f64::NAN, &[], false).is_err());
}

#[test]
fn var_degenerate_counts() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 4.0], [3, 1]).unwrap();
    let v = var(&x, &[1], 1.0, false).unwrap().to_vec_f64();
    assert!(v.iter().all(|v| v.is_nan()), "{v:?}");
    let v = var(&x, &[0], 1.0, false).unwrap().item_f64().unwrap();
    assert!((v - 7.0 / 3.0).abs() < 1e-12);
    let v = var(&x, &[], 3.0, false).unwrap().item_f64().unwrap();
    assert!(v.is_infinite());
    // a large offset does not destroy the variance (two-pass / Welford, not E[x^2]-E[x]^2)
    let x = Tensor::from_vec(
        (0..4096).map(|i| 1e4 + (i % 2) as f32).collect::<Vec<_>>(),
        [4096],
    )
    .unwrap();
    let v = var(&x, &[], 0.0, false).unwrap().item_f64().unwrap();
    assert!((v - 0.25).abs() < 1e-4, "{v}");
}
