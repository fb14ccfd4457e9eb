//! The elementwise kernels (unary, binary, ternary) against f64 references computed
//! here: every unary op on every float dtype, integer and bool rules, special values,
//! strided / transposed / broadcast inputs, PyTorch's scalar rules, errors, and a
//! property test of broadcasting + promotion against a hand-written model.

use amp_kernels::*;
use amp_tensor::half::bf16;
use amp_tensor::{DType, Tensor};
use proptest::prelude::*;

// ----- helpers ------------------------------------------------------------------

/// Relative tolerance for results of `dtype` (absolute near zero: `tol * 1e-3`).
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 1e-3,
        DType::F32 => 2e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() || tol == 0.0 {
        return got == want;
    }
    (got - want).abs() <= tol * want.abs() + tol * 1e-3
}

/// Assert `got` has `dtype`, the shape `dims` and values close to `want`.
#[track_caller]
fn check(what: &str, got: &Tensor, dtype: DType, dims: &[usize], want: &[f64]) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(got.dims(), dims, "{what}: shape");
    assert!(got.is_contiguous(), "{what}: output must be contiguous");
    let g = got.to_vec_f64();
    assert_eq!(g.len(), want.len(), "{what}: length");
    let t = tol(dtype);
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(
            close(a, b, t),
            "{what}[{i}]: got {a:e}, want {b:e} ({dtype})"
        );
    }
}

/// Assert bit-identical values (NaN matches NaN; the sign of zero counts).
#[track_caller]
fn check_exact(what: &str, got: &Tensor, dtype: DType, want: &[f64]) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let g = got.to_vec_f64();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
        assert!(same, "{what}[{i}]: got {a:?}, want {b:?}");
    }
}

/// A tensor of `dtype` holding `v` (cast with PyTorch's rules).
fn tensor(v: &[f64], dims: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims.to_vec())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// `v` as it reads back from a `dtype` tensor (the rounded inputs references use).
fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
    tensor(v, &[v.len()], dtype).to_vec_f64()
}

#[track_caller]
fn err_contains(r: amp_tensor::Result<Tensor>, needle: &str) {
    match r {
        Ok(t) => panic!("expected an error containing {needle:?}, got {t}"),
        Err(e) => assert!(e.to_string().contains(needle), "error {e} lacks {needle:?}"),
    }
}

fn erfinv_ref(y: f64) -> f64 {
    if y.abs() > 1.0 || y.is_nan() {
        return f64::NAN;
    }
    if y.abs() == 1.0 {
        return f64::INFINITY.copysign(y);
    }
    let (mut lo, mut hi) = (-7.0f64, 7.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if libm::erf(mid) < y {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The f64 reference of each unary op.
fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    use std::f64::consts::*;
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Log2 => x.log2(),
        UnaryOp::Log10 => x.log10(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tan => x.tan(),
        UnaryOp::Asin => x.asin(),
        UnaryOp::Acos => x.acos(),
        UnaryOp::Atan => x.atan(),
        UnaryOp::Sinh => x.sinh(),
        UnaryOp::Cosh => x.cosh(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid_ref(x),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x * FRAC_1_SQRT_2)),
        UnaryOp::GeluTanh => {
            let k = (2.0 / PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Erfinv => erfinv_ref(x),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Square => x * x,
    }
}

/// Inputs inside each op's domain, away from poles and cancellation.
fn unary_inputs(op: UnaryOp) -> Vec<f64> {
    match op {
        UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Log10 | UnaryOp::Sqrt | UnaryOp::Rsqrt => {
            vec![0.01, 0.3, 0.5, 1.0, 2.0, 7.5, 100.0, 1e4]
        }
        UnaryOp::Log1p => vec![-0.5, -0.01, 0.0, 0.001, 0.3, 2.0, 100.0],
        UnaryOp::Asin | UnaryOp::Acos => vec![-0.9, -0.5, -0.1, 0.0, 0.2, 0.6, 0.95],
        UnaryOp::Erfinv => vec![
            -0.99, -0.8, -0.7, -0.3, 0.0, 0.05, 0.5, 0.69, 0.71, 0.9, 0.98,
        ],
        UnaryOp::Tan => vec![-1.2, -0.7, -0.1, 0.0, 0.3, 0.9, 1.3],
        UnaryOp::Gelu | UnaryOp::GeluTanh => vec![-1.5, -0.75, -0.3, 0.0, 0.3, 1.0, 2.0, 4.0],
        UnaryOp::Reciprocal => vec![-8.0, -0.3, 0.01, 0.5, 3.0, 100.0],
        UnaryOp::Round => vec![
            -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.75, 0.3, 2.7, 1000.5,
        ],
        UnaryOp::Floor | UnaryOp::Ceil => vec![-2.5, -1.0, -0.3, 0.0, 0.3, 1.0, 2.7],
        UnaryOp::Exp | UnaryOp::Sinh | UnaryOp::Cosh | UnaryOp::Expm1 => {
            vec![-5.0, -1.0, -0.01, 0.0, 0.001, 0.5, 2.0, 8.0]
        }
        UnaryOp::Sigmoid => vec![-30.0, -5.0, -0.5, 0.0, 0.5, 5.0, 30.0],
        _ => vec![
            -3.0, -1.5, -0.75, -0.3, -0.01, 0.0, 0.01, 0.3, 0.75, 1.5, 3.0,
        ],
    }
}

// ----- unary ----------------------------------------------------------------------

#[test]
fn every_unary_op_on_every_float_dtype() {
    let mut cases = 0;
    for op in UnaryOp::ALL {
        for dtype in DType::FLOATS {
            let xs = rounded(&unary_inputs(op), dtype);
            let x = tensor(&xs, &[xs.len()], dtype);
            let want: Vec<f64> = xs.iter().map(|&v| unary_ref(op, v)).collect();
            let got = unary(op, &x).unwrap();
            check(
                &format!("{}({dtype})", op.name()),
                &got,
                dtype,
                &[xs.len()],
                &want,
            );
            cases += 1;
        }
    }
    assert_eq!(cases, 31 * 4);
}

/// A unary wrapper such as [`exp`].
type UnaryFn = fn(&Tensor) -> amp_tensor::Result<Tensor>;

/// An f64 reference of a binary op.
type RefFn = fn(f64, f64) -> f64;

#[test]
fn wrappers_call_their_op() {
    let x = tensor(&[0.25, 0.5], &[2], DType::F64);
    let fns: [(UnaryFn, UnaryOp); 31] = [
        (neg, UnaryOp::Neg),
        (abs, UnaryOp::Abs),
        (exp, UnaryOp::Exp),
        (expm1, UnaryOp::Expm1),
        (log, UnaryOp::Log),
        (log1p, UnaryOp::Log1p),
        (log2, UnaryOp::Log2),
        (log10, UnaryOp::Log10),
        (sqrt, UnaryOp::Sqrt),
        (rsqrt, UnaryOp::Rsqrt),
        (reciprocal, UnaryOp::Reciprocal),
        (sin, UnaryOp::Sin),
        (cos, UnaryOp::Cos),
        (tan, UnaryOp::Tan),
        (asin, UnaryOp::Asin),
        (acos, UnaryOp::Acos),
        (atan, UnaryOp::Atan),
        (sinh, UnaryOp::Sinh),
        (cosh, UnaryOp::Cosh),
        (tanh, UnaryOp::Tanh),
        (sigmoid, UnaryOp::Sigmoid),
        (relu, UnaryOp::Relu),
        (gelu, UnaryOp::Gelu),
        (gelu_tanh, UnaryOp::GeluTanh),
        (erf, UnaryOp::Erf),
        (erfinv, UnaryOp::Erfinv),
        (sign, UnaryOp::Sign),
        (floor, UnaryOp::Floor),
        (ceil, UnaryOp::Ceil),
        (round, UnaryOp::Round),
        (square, UnaryOp::Square),
    ];
    for (f, op) in fns {
        assert_eq!(
            f(&x).unwrap().to_vec_f64(),
            unary(op, &x).unwrap().to_vec_f64(),
            "{}",
            op.name()
        );
    }
    assert_eq!(UnaryOp::GeluTanh.name(), "gelu");
    assert_eq!(UnaryOp::Reciprocal.name(), "reciprocal");
}

#[test]
fn sixteen_bit_types_round_once_from_f32() {
    // The f16/bf16 result is the f32 result rounded once (compute in f32).
    let xs: Vec<f64> = (0..2000).map(|i| -4.0 + i as f64 * 0.00437).collect();
    for dtype in [DType::F16, DType::BF16] {
        let x = tensor(&xs, &[xs.len()], dtype);
        let x32 = x.to_dtype(DType::F32).unwrap();
        for op in [
            UnaryOp::Exp,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Gelu,
            UnaryOp::Erf,
        ] {
            let got = unary(op, &x).unwrap();
            let want = unary(op, &x32).unwrap().to_dtype(dtype).unwrap();
            check_exact(op.name(), &got, dtype, &want.to_vec_f64());
        }
    }
}

#[test]
fn special_values() {
    let inf = f64::INFINITY;
    let nan = f64::NAN;
    let cases: &[(UnaryOp, f64, f64)] = &[
        (UnaryOp::Exp, inf, inf),
        (UnaryOp::Exp, -inf, 0.0),
        (UnaryOp::Exp, nan, nan),
        (UnaryOp::Log, 0.0, -inf),
        (UnaryOp::Log, -1.0, nan),
        (UnaryOp::Log, inf, inf),
        (UnaryOp::Sqrt, -1.0, nan),
        (UnaryOp::Sqrt, -0.0, -0.0),
        (UnaryOp::Neg, 0.0, -0.0),
        (UnaryOp::Abs, -0.0, 0.0),
        (UnaryOp::Abs, -inf, inf),
        (UnaryOp::Relu, nan, nan),
        (UnaryOp::Relu, -inf, 0.0),
        (UnaryOp::Sigmoid, inf, 1.0),
        (UnaryOp::Sigmoid, -inf, 0.0),
        (UnaryOp::Sigmoid, -1000.0, 0.0),
        (UnaryOp::Sigmoid, nan, nan),
        (UnaryOp::Tanh, inf, 1.0),
        (UnaryOp::Tanh, -inf, -1.0),
        (UnaryOp::Erf, -inf, -1.0),
        (UnaryOp::Erfinv, 1.0, inf),
        (UnaryOp::Erfinv, -1.0, -inf),
        (UnaryOp::Erfinv, 1.5, nan),
        (UnaryOp::Erfinv, -2.0, nan),
        (UnaryOp::Erfinv, nan, nan),
        (UnaryOp::Erfinv, 0.0, 0.0),
        (UnaryOp::Erfinv, -0.0, -0.0),
        (UnaryOp::Sign, nan, 0.0),
        (UnaryOp::Sign, -0.0, 0.0),
        (UnaryOp::Sign, -inf, -1.0),
        (UnaryOp::Round, 2.5, 2.0),
        (UnaryOp::Round, 3.5, 4.0),
        (UnaryOp::Round, -0.5, -0.0),
        (UnaryOp::Round, 0.5, 0.0),
        (UnaryOp::Round, nan, nan),
        (UnaryOp::Floor, -0.5, -1.0),
        (UnaryOp::Ceil, -0.5, -0.0),
        (UnaryOp::Reciprocal, 0.0, inf),
        (UnaryOp::Reciprocal, -0.0, -inf),
        (UnaryOp::Rsqrt, 0.0, inf),
        (UnaryOp::Rsqrt, -1.0, nan),
        (UnaryOp::Gelu, -inf, nan),
        (UnaryOp::Gelu, inf, inf),
        (UnaryOp::Square, -inf, inf),
        (UnaryOp::Expm1, -0.0, -0.0),
        (UnaryOp::Log1p, -1.0, -inf),
        (UnaryOp::Sin, inf, nan),
        (UnaryOp::Asin, 2.0, nan),
    ];
    for dtype in DType::FLOATS {
        for &(op, x, want) in cases {
            let got = unary(op, &tensor(&[x], &[1], dtype)).unwrap();
            check_exact(&format!("{}({x}) {dtype}", op.name()), &got, dtype, &[want]);
        }
    }
    // Overflow of the 16-bit result.
    check_exact(
        "exp f16 overflow",
        &exp(&tensor(&[12.0], &[1], DType::F16)).unwrap(),
        DType::F16,
        &[inf],
    );
    check_exact(
        "exp bf16 keeps range",
        &exp(&tensor(&[80.0], &[1], DType::BF16)).unwrap(),
        DType::BF16,
        &rounded(&[80f64.exp()], DType::BF16),
    );
}

#[test]
fn finiteness_tests() {
    let v = [1.0, f64::NAN, f64::INFINITY, -f64::INFINITY, -0.0];
    for dtype in DType::FLOATS {
        let x = tensor(&v, &[5], dtype);
        check_exact(
            "isfinite",
            &isfinite(&x).unwrap(),
            DType::Bool,
            &[1.0, 0.0, 0.0, 0.0, 1.0],
        );
        check_exact(
            "isnan",
            &isnan(&x).unwrap(),
            DType::Bool,
            &[0.0, 1.0, 0.0, 0.0, 0.0],
        );
        check_exact(
            "isinf",
            &isinf(&x).unwrap(),
            DType::Bool,
            &[0.0, 0.0, 1.0, 1.0, 0.0],
        );
    }
    for dtype in [DType::I32, DType::I64, DType::Bool] {
        let x = tensor(&[1.0, 0.0], &[2], dtype);
        check_exact(
            "isfinite int",
            &isfinite(&x).unwrap(),
            DType::Bool,
            &[1.0, 1.0],
        );
        check_exact("isnan int", &isnan(&x).unwrap(), DType::Bool, &[0.0, 0.0]);
        check_exact("isinf int", &isinf(&x).unwrap(), DType::Bool, &[0.0, 0.0]);
    }
}

#[test]
fn integer_unary_rules() {
    for dtype in [DType::I32, DType::I64] {
        let x = tensor(&[-3.0, 0.0, 5.0, -1.0], &[4], dtype);
        check(
            "neg",
            &neg(&x).unwrap(),
            dtype,
            &[4],
            &[3.0, 0.0, -5.0, 1.0],
        );
        check("abs", &abs(&x).unwrap(), dtype, &[4], &[3.0, 0.0, 5.0, 1.0]);
        check(
            "sign",
            &sign(&x).unwrap(),
            dtype,
            &[4],
            &[-1.0, 0.0, 1.0, -1.0],
        );
        check(
            "square",
            &square(&x).unwrap(),
            dtype,
            &[4],
            &[9.0, 0.0, 25.0, 1.0],
        );
        check(
            "relu",
            &relu(&x).unwrap(),
            dtype,
            &[4],
            &[0.0, 0.0, 5.0, 0.0],
        );
        for op in [UnaryOp::Floor, UnaryOp::Ceil, UnaryOp::Round] {
            check(
                op.name(),
                &unary(op, &x).unwrap(),
                dtype,
                &[4],
                &[-3.0, 0.0, 5.0, -1.0],
            );
        }
        // float functions give float32
        let e = exp(&x).unwrap();
        let want: Vec<f64> = [-3.0f64, 0.0, 5.0, -1.0].iter().map(|v| v.exp()).collect();
        check("exp(int)", &e, DType::F32, &[4], &want);
        check(
            "sqrt(int)",
            &sqrt(&x).unwrap(),
            DType::F32,
            &[4],
            &[f64::NAN, 0.0, 5f64.sqrt(), f64::NAN],
        );
        check(
            "sigmoid(int)",
            &sigmoid(&x).unwrap(),
            DType::F32,
            &[4],
            &[sigmoid_ref(-3.0), 0.5, sigmoid_ref(5.0), sigmoid_ref(-1.0)],
        );
        check(
            "reciprocal(int)",
            &reciprocal(&x).unwrap(),
            DType::F32,
            &[4],
            &[-1.0 / 3.0, f64::INFINITY, 0.2, -1.0],
        );
        err_contains(gelu(&x), "not implemented for");
        err_contains(softplus(&x, 1.0, 20.0), "not implemented for");
    }
    // wrapping at the edges, as PyTorch's CPU kernels
    let m = Tensor::from_vec(vec![i32::MIN, i32::MAX], [2]).unwrap();
    assert_eq!(
        neg(&m).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MIN, -i32::MAX]
    );
    assert_eq!(
        abs(&m).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MIN, i32::MAX]
    );
    assert_eq!(square(&m).unwrap().to_vec::<i32>().unwrap(), vec![0, 1]);
}

#[test]
fn bool_unary_rules() {
    let b = Tensor::from_vec(vec![true, false, true], [3]).unwrap();
    err_contains(neg(&b), "on a bool tensor is not supported");
    err_contains(abs(&b), "not implemented for 'Bool'");
    err_contains(relu(&b), "Boolean inputs not supported for relu");
    err_contains(floor(&b), "not implemented for 'Bool'");
    assert_eq!(
        sign(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true]
    );
    let sq = square(&b).unwrap();
    assert_eq!(sq.to_vec::<i64>().unwrap(), vec![1, 0, 1]);
    check(
        "exp(bool)",
        &exp(&b).unwrap(),
        DType::F32,
        &[3],
        &[1f64.exp(), 1.0, 1f64.exp()],
    );
}

#[test]
fn softplus_matches_pytorch_formula() {
    let xs = [-30.0, -2.0, 0.0, 0.5, 3.0, 9.0, 11.0, 40.0];
    for dtype in DType::FLOATS {
        let r = rounded(&xs, dtype);
        let x = tensor(&r, &[r.len()], dtype);
        for (beta, th) in [(1.0, 20.0), (2.0, 20.0), (0.5, 4.0)] {
            let want: Vec<f64> = r
                .iter()
                .map(|&v| {
                    if v * beta > th {
                        v
                    } else {
                        (v * beta).exp().ln_1p() / beta
                    }
                })
                .collect();
            check(
                "softplus",
                &softplus(&x, beta, th).unwrap(),
                dtype,
                &[r.len()],
                &want,
            );
        }
    }
}

#[test]
fn unary_on_strided_transposed_and_broadcast_views() {
    let base: Vec<f64> = (0..60).map(|i| (i as f64) * 0.1 - 3.0).collect();
    for dtype in DType::FLOATS {
        let x = tensor(&base, &[3, 4, 5], dtype);
        let views = [
            x.transpose(0, 2).unwrap(),
            x.permute(&[1usize, 2, 0]).unwrap(),
            x.narrow(1, 1, 2).unwrap(),
            x.slice(2, 0, 5, 2).unwrap(),
            x.select(0, 1).unwrap().t().unwrap(),
            x.narrow(0, 2, 1).unwrap().expand([4i64, 4, 5]).unwrap(),
            x.get(1).unwrap().get(2).unwrap().get(3).unwrap(),
        ];
        for v in &views {
            for op in [UnaryOp::Tanh, UnaryOp::Neg, UnaryOp::Square, UnaryOp::Relu] {
                let got = unary(op, v).unwrap();
                let want = unary(op, &v.contiguous()).unwrap();
                check_exact(op.name(), &got, dtype, &want.to_vec_f64());
                assert_eq!(got.dims(), v.dims());
                assert!(got.is_contiguous());
            }
        }
    }
}

#[test]
fn large_unary_is_parallel_and_exact() {
    let n = 100_003;
    let xs: Vec<f64> = (0..n).map(|i| ((i % 977) as f64) * 0.01 - 4.0).collect();
    for dtype in DType::FLOATS {
        let x = tensor(&xs, &[n], dtype);
        let got = sigmoid(&x).unwrap();
        // reference: the same kernel on small slices (single-threaded path)
        let mut want = Vec::with_capacity(n);
        for c in 0..n.div_ceil(1000) {
            let len = 1000.min(n - c * 1000);
            want.extend(
                sigmoid(&x.narrow(0, c * 1000, len).unwrap())
                    .unwrap()
                    .to_vec_f64(),
            );
        }
        check_exact("sigmoid large", &got, dtype, &want);
        // and a transposed large input
        let t = tensor(&xs[..300 * 300], &[300, 300], dtype).t().unwrap();
        let got = exp(&t).unwrap();
        check_exact(
            "exp large transposed",
            &got,
            dtype,
            &exp(&t.contiguous()).unwrap().to_vec_f64(),
        );
    }
}

#[test]
fn erfinv_inverts_erf() {
    for dtype in [DType::F32, DType::F64] {
        let ys: Vec<f64> = (1..200).map(|i| -0.995 + i as f64 * 0.00995).collect();
        let y = tensor(&ys, &[ys.len()], dtype);
        let x = erfinv(&y).unwrap();
        let back = erf(&x).unwrap();
        let want = y.to_vec_f64();
        check("erf(erfinv(y))", &back, dtype, &[ys.len()], &want);
    }
}

// ----- binary ---------------------------------------------------------------------

#[test]
fn binary_float_ops_against_reference() {
    let a = [1.5, -2.0, 0.25, 7.0, -3.5, 0.0];
    let b = [0.5, 3.0, -4.0, 2.0, -1.25, 2.0];
    for dtype in DType::FLOATS {
        let (ra, rb) = (rounded(&a, dtype), rounded(&b, dtype));
        let (ta, tb) = (tensor(&ra, &[2, 3], dtype), tensor(&rb, &[2, 3], dtype));
        let refs: [(BinaryOp, RefFn); 9] = [
            (BinaryOp::Add, |x, y| x + y),
            (BinaryOp::Sub, |x, y| x - y),
            (BinaryOp::Mul, |x, y| x * y),
            (BinaryOp::Div, |x, y| x / y),
            (BinaryOp::Pow, |x, y| x.powf(y)),
            (BinaryOp::Atan2, f64::atan2),
            (BinaryOp::Maximum, f64::max),
            (BinaryOp::Minimum, f64::min),
            (BinaryOp::Remainder, |x, y| x - y * (x / y).floor()),
        ];
        for (op, f) in refs {
            let want: Vec<f64> = ra.iter().zip(&rb).map(|(&x, &y)| f(x, y)).collect();
            check(
                &format!("{} {dtype}", op.name()),
                &binary(op, &ta, &tb).unwrap(),
                dtype,
                &[2, 3],
                &want,
            );
        }
    }
}

#[test]
fn nan_propagation_and_python_modulo() {
    let nan = f64::NAN;
    for dtype in DType::FLOATS {
        let a = tensor(&[nan, 1.0, nan, 2.0], &[4], dtype);
        let b = tensor(&[1.0, nan, nan, -0.0], &[4], dtype);
        check_exact(
            "maximum",
            &maximum(&a, &b).unwrap(),
            dtype,
            &[nan, nan, nan, 2.0],
        );
        check_exact(
            "minimum",
            &minimum(&a, &b).unwrap(),
            dtype,
            &[nan, nan, nan, -0.0],
        );
        let x = tensor(&[-3.0, 3.0, -3.0, 3.0, 5.0, -0.0], &[6], dtype);
        let y = tensor(&[2.0, 2.0, -2.0, -2.0, 0.0, 2.0], &[6], dtype);
        check_exact(
            "remainder",
            &remainder(&x, &y).unwrap(),
            dtype,
            &[1.0, 1.0, -1.0, -1.0, nan, -0.0],
        );
    }
    for dtype in [DType::I32, DType::I64] {
        let x = tensor(&[-3.0, 3.0, -3.0, 3.0, 7.0], &[5], dtype);
        let y = tensor(&[2.0, 2.0, -2.0, -2.0, 7.0], &[5], dtype);
        check(
            "int remainder",
            &remainder(&x, &y).unwrap(),
            dtype,
            &[5],
            &[1.0, 1.0, -1.0, -1.0, 0.0],
        );
        let z = tensor(&[1.0, 0.0, 2.0, 1.0, 1.0], &[5], dtype);
        err_contains(remainder(&x, &z), "ZeroDivisionError");
        err_contains(
            binary_scalar(BinaryOp::Remainder, &x, 0),
            "ZeroDivisionError",
        );
    }
}

#[test]
fn promotion_rules() {
    use DType::*;
    let dims = [2usize, 2];
    let v = [1.0, 2.0, 3.0, 4.0];
    let cases = [
        (F16, BF16, F32),
        (I64, F16, F16),
        (I32, I64, I64),
        (Bool, I32, I32),
        (BF16, F32, F32),
        (F32, F64, F64),
        (Bool, F16, F16),
    ];
    for (x, y, want) in cases {
        let r = add(&tensor(&v, &dims, x), &tensor(&v, &dims, y)).unwrap();
        let sum: Vec<f64> = rounded(&v, x)
            .iter()
            .zip(rounded(&v, y))
            .map(|(p, q)| p + q)
            .collect();
        check(&format!("{x}+{y}"), &r, want, &dims, &sum);
    }
    // 0-dim tensors rank below dimensioned ones (same category)
    let bf = tensor(&v, &dims, BF16);
    let s32 = Tensor::scalar(0.5f32);
    check(
        "bf16 * f32 0-dim",
        &mul(&bf, &s32).unwrap(),
        BF16,
        &dims,
        &[0.5, 1.0, 1.5, 2.0],
    );
    check(
        "f32 0-dim * bf16",
        &mul(&s32, &bf).unwrap(),
        BF16,
        &dims,
        &[0.5, 1.0, 1.5, 2.0],
    );
    // ... but a higher category wins
    let i = tensor(&v, &dims, I32);
    check(
        "i32 + f64 0-dim",
        &add(&i, &Tensor::scalar(0.5f64)).unwrap(),
        F64,
        &dims,
        &[1.5, 2.5, 3.5, 4.5],
    );
    check(
        "two 0-dim",
        &add(
            &Tensor::scalar(bf16::from_f32(1.0)),
            &Tensor::scalar(2.0f32),
        )
        .unwrap(),
        F32,
        &[],
        &[3.0],
    );
    // true division and atan2 of integers give float32
    let a = tensor(&[7.0, -7.0], &[2], I64);
    let b = tensor(&[2.0, 2.0], &[2], I32);
    check("int / int", &div(&a, &b).unwrap(), F32, &[2], &[3.5, -3.5]);
    check(
        "atan2 int",
        &atan2(&a, &b).unwrap(),
        F32,
        &[2],
        &[7f64.atan2(2.0), (-7f64).atan2(2.0)],
    );
    let t = Tensor::from_vec(vec![true, false], [2]).unwrap();
    check(
        "bool / bool",
        &div(&t, &t).unwrap(),
        F32,
        &[2],
        &[1.0, f64::NAN],
    );
    // integer arithmetic wraps
    let big = Tensor::from_vec(vec![i32::MAX, i32::MIN], [2]).unwrap();
    let one = Tensor::from_vec(vec![1i32, 1], [2]).unwrap();
    assert_eq!(
        add(&big, &one).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MIN, i32::MIN + 1]
    );
    assert_eq!(
        sub(&big, &one).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MAX - 1, i32::MAX]
    );
    assert_eq!(
        mul(&big, &big).unwrap().to_vec::<i32>().unwrap(),
        vec![1, 0]
    );
}

#[test]
fn bool_binary_rules() {
    let a = Tensor::from_vec(vec![true, true, false, false], [4]).unwrap();
    let b = Tensor::from_vec(vec![true, false, true, false], [4]).unwrap();
    assert_eq!(
        add(&a, &b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    assert_eq!(
        mul(&a, &b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false, false]
    );
    assert_eq!(
        maximum(&a, &b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    assert_eq!(
        minimum(&a, &b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false, false]
    );
    err_contains(sub(&a, &b), "with two bool tensors is not supported");
    err_contains(
        sub(&a, &tensor(&[1.0; 4], &[4], DType::F32)),
        "with a bool tensor is not supported",
    );
    err_contains(
        sub_scalar(&tensor(&[1.0; 4], &[4], DType::F32), true),
        "bool tensor is not supported",
    );
    err_contains(pow(&a, &b), "not implemented for 'Bool'");
    err_contains(remainder(&a, &b), "not implemented for 'Bool'");
    let i = add_scalar(&a, 1).unwrap();
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![2, 2, 1, 1]);
    assert_eq!(
        pow_scalar(&a, true).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, false, false]
    );
    assert_eq!(
        pow_scalar(&a, false).unwrap().to_vec::<bool>().unwrap(),
        vec![true; 4]
    );
}

#[test]
fn integer_pow() {
    for dtype in [DType::I32, DType::I64] {
        let base = tensor(&[2.0, 1.0, -1.0, -1.0, 3.0, 0.0, -2.0], &[7], dtype);
        let e = tensor(&[-1.0, -3.0, -3.0, -2.0, 4.0, 0.0, 3.0], &[7], dtype);
        check(
            "int pow",
            &pow(&base, &e).unwrap(),
            dtype,
            &[7],
            &[0.0, 1.0, -1.0, 1.0, 81.0, 1.0, -8.0],
        );
        err_contains(
            pow_scalar(&base, -2),
            "Integers to negative integer powers are not allowed.",
        );
        check(
            "int ** 2",
            &pow_scalar(&base, 2).unwrap(),
            dtype,
            &[7],
            &[4.0, 1.0, 1.0, 1.0, 9.0, 0.0, 4.0],
        );
        let h = pow_scalar(&base, 0.5).unwrap();
        assert_eq!(h.dtype(), DType::F32);
        check(
            "rpow int",
            &scalar_binary(BinaryOp::Pow, 2, &e).unwrap(),
            dtype,
            &[7],
            &[0.0, 0.0, 0.0, 0.0, 16.0, 1.0, 8.0],
        );
    }
}

#[test]
fn scalar_operands_follow_pytorch() {
    // bf16 x * 0.1 multiplies by 0.1f32 (opmath); bf16 x + 0.1 adds bf16(0.1).
    let xs: Vec<f64> = (1..400).map(|i| i as f64 * 0.173).collect();
    let x = tensor(&xs, &[xs.len()], DType::BF16);
    let x32: Vec<f32> = x.to_vec_as();
    let b01 = bf16::from_f32(0.1).to_f32();
    let mul_got: Vec<bf16> = mul_scalar(&x, 0.1).unwrap().to_vec().unwrap();
    let mut differs = 0;
    for (i, &v) in x32.iter().enumerate() {
        assert_eq!(mul_got[i], bf16::from_f32(v * 0.1f32), "mul at {v}");
        differs += (bf16::from_f32(v * 0.1f32) != bf16::from_f32(v * b01)) as usize;
    }
    assert!(differs > 0, "the test data must tell the two rules apart");
    let add_got: Vec<bf16> = add_scalar(&x, 0.1).unwrap().to_vec().unwrap();
    let div_got: Vec<bf16> = div_scalar(&x, 0.3).unwrap().to_vec().unwrap();
    let sub_got: Vec<bf16> = sub_scalar(&x, 0.1).unwrap().to_vec().unwrap();
    let rsub_got: Vec<bf16> = scalar_binary(BinaryOp::Sub, 0.1, &x)
        .unwrap()
        .to_vec()
        .unwrap();
    let rdiv_got: Vec<bf16> = scalar_binary(BinaryOp::Div, 3.0, &x)
        .unwrap()
        .to_vec()
        .unwrap();
    let rmul_got: Vec<bf16> = scalar_binary(BinaryOp::Mul, 0.1, &x)
        .unwrap()
        .to_vec()
        .unwrap();
    for (i, &v) in x32.iter().enumerate() {
        assert_eq!(add_got[i], bf16::from_f32(v + b01), "add at {v}");
        assert_eq!(sub_got[i], bf16::from_f32(v - b01), "sub at {v}");
        assert_eq!(rsub_got[i], bf16::from_f32(b01 - v), "rsub at {v}");
        assert_eq!(div_got[i], bf16::from_f32(v / 0.3f32), "div at {v}");
        assert_eq!(rmul_got[i], bf16::from_f32(v * 0.1f32), "rmul at {v}");
        // `3 / x` is `reciprocal(x) * 3`
        let recip = bf16::from_f32(1.0 / v).to_f32();
        assert_eq!(rdiv_got[i], bf16::from_f32(recip * 3.0), "rdiv at {v}");
    }
    // the same rule for a one-element second tensor of mul/div
    let s = Tensor::scalar(0.1f32);
    let m: Vec<bf16> = mul(&x, &s).unwrap().to_vec().unwrap();
    for (i, &v) in x32.iter().enumerate() {
        assert_eq!(m[i], bf16::from_f32(v * 0.1f32));
    }
    // dtypes
    use DType::*;
    let i = tensor(&[1.0, 2.0], &[2], I64);
    check(
        "int + float scalar",
        &add_scalar(&i, 2.5).unwrap(),
        F32,
        &[2],
        &[3.5, 4.5],
    );
    check(
        "int * int scalar",
        &mul_scalar(&i, 3).unwrap(),
        I64,
        &[2],
        &[3.0, 6.0],
    );
    check(
        "int / int scalar",
        &div_scalar(&i, 4).unwrap(),
        F32,
        &[2],
        &[0.25, 0.5],
    );
    let h = tensor(&[1.0, 2.0], &[2], F16);
    check(
        "f16 + float scalar",
        &add_scalar(&h, 2.5).unwrap(),
        F16,
        &[2],
        &[3.5, 4.5],
    );
    let i32t = tensor(&[1.0, 2.0], &[2], I32);
    check(
        "i32 + int scalar",
        &add_scalar(&i32t, 3).unwrap(),
        I32,
        &[2],
        &[4.0, 5.0],
    );
    check(
        "rsub",
        &scalar_binary(BinaryOp::Sub, 1, &i32t).unwrap(),
        I32,
        &[2],
        &[0.0, -1.0],
    );
    // pow with a scalar exponent: the special cases agree with powf
    let xs = [0.5, 1.5, 2.0, 3.0, 10.0];
    for dtype in [F32, F64] {
        let x = tensor(&xs, &[5], dtype);
        for e in [2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7, 0.0, 1.0] {
            let want: Vec<f64> = xs.iter().map(|v| v.powf(e)).collect();
            check(
                &format!("x ** {e}"),
                &pow_scalar(&x, e).unwrap(),
                dtype,
                &[5],
                &want,
            );
        }
    }
}

#[test]
fn add_and_sub_with_alpha() {
    for dtype in DType::FLOATS {
        let a = tensor(&[1.0, 2.0, 3.0], &[3], dtype);
        let b = tensor(&[0.5, -1.0, 4.0], &[3], dtype);
        check(
            "a + 2b",
            &add_scaled(&a, &b, 2.0).unwrap(),
            dtype,
            &[3],
            &[2.0, 0.0, 11.0],
        );
        check(
            "a - 0.5b",
            &sub_scaled(&a, &b, 0.5).unwrap(),
            dtype,
            &[3],
            &[0.75, 2.5, 1.0],
        );
        check(
            "a + 1b",
            &add_scaled(&a, &b, 1.0).unwrap(),
            dtype,
            &[3],
            &[1.5, 1.0, 7.0],
        );
    }
    let a = tensor(&[1.0, 2.0], &[2], DType::I64);
    check(
        "int alpha",
        &add_scaled(&a, &a, 3.0).unwrap(),
        DType::I64,
        &[2],
        &[4.0, 8.0],
    );
    err_contains(
        add_scaled(&a, &a, 0.5),
        "alpha must not be a floating point number",
    );
}

#[test]
fn comparisons_and_logical_ops() {
    let nan = f64::NAN;
    for dtype in DType::FLOATS {
        let a = tensor(&[1.0, 2.0, nan, 3.0], &[4], dtype);
        let b = tensor(&[1.0, 3.0, nan, 2.0], &[4], dtype);
        let expect: [(CmpOp, [f64; 4]); 6] = [
            (CmpOp::Eq, [1.0, 0.0, 0.0, 0.0]),
            (CmpOp::Ne, [0.0, 1.0, 1.0, 1.0]),
            (CmpOp::Lt, [0.0, 1.0, 0.0, 0.0]),
            (CmpOp::Le, [1.0, 1.0, 0.0, 0.0]),
            (CmpOp::Gt, [0.0, 0.0, 0.0, 1.0]),
            (CmpOp::Ge, [1.0, 0.0, 0.0, 1.0]),
        ];
        for (op, want) in expect {
            check_exact(op.name(), &compare(op, &a, &b).unwrap(), DType::Bool, &want);
        }
    }
    // promoted compare: int64 vs float32
    let i = tensor(&[1.0, 2.0, 3.0], &[3], DType::I64);
    let f = tensor(&[1.5, 2.0, 2.5], &[3], DType::F32);
    check_exact(
        "i64 < f32",
        &compare(CmpOp::Lt, &i, &f).unwrap(),
        DType::Bool,
        &[1.0, 0.0, 0.0],
    );
    check_exact(
        "int < 2.5",
        &compare_scalar(CmpOp::Lt, &i, 2.5).unwrap(),
        DType::Bool,
        &[1.0, 1.0, 0.0],
    );
    // the scalar is cast to the tensor's dtype first: f16(0.1) < 0.1 is false
    let h = tensor(&[0.1], &[1], DType::F16);
    check_exact(
        "f16 < 0.1",
        &compare_scalar(CmpOp::Lt, &h, 0.1).unwrap(),
        DType::Bool,
        &[0.0],
    );
    check_exact(
        "f16 == 0.1",
        &compare_scalar(CmpOp::Eq, &h, 0.1).unwrap(),
        DType::Bool,
        &[1.0],
    );
    // broadcasting
    let c = compare(
        CmpOp::Gt,
        &tensor(&[1.0, 5.0], &[2, 1], DType::F32),
        &tensor(&[0.0, 2.0, 9.0], &[3], DType::I32),
    )
    .unwrap();
    assert_eq!(c.dims(), &[2, 3]);
    check_exact(
        "broadcast gt",
        &c,
        DType::Bool,
        &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0],
    );
    // logical ops take any dtype; NaN is true
    let x = tensor(&[0.0, 1.0, nan, 0.0], &[4], DType::F32);
    let y = Tensor::from_vec(vec![true, true, false, false], [4]).unwrap();
    check_exact(
        "and",
        &logical_and(&x, &y).unwrap(),
        DType::Bool,
        &[0.0, 1.0, 0.0, 0.0],
    );
    check_exact(
        "or",
        &logical_or(&x, &y).unwrap(),
        DType::Bool,
        &[1.0, 1.0, 1.0, 0.0],
    );
    check_exact(
        "not",
        &logical_not(&x).unwrap(),
        DType::Bool,
        &[1.0, 0.0, 0.0, 1.0],
    );
}

#[test]
fn broadcasting_and_views() {
    for dtype in DType::FLOATS {
        // [3,1] + [4] -> [3,4]
        let a = tensor(&[1.0, 2.0, 3.0], &[3, 1], dtype);
        let b = tensor(&[10.0, 20.0, 30.0, 40.0], &[4], dtype);
        let r = add(&a, &b).unwrap();
        let want: Vec<f64> = (0..12)
            .map(|i| (1 + i / 4) as f64 + 10.0 * (1 + i % 4) as f64)
            .collect();
        check("outer add", &r, dtype, &[3, 4], &want);
        // bias add [N, M] + [M]
        let m: Vec<f64> = (0..15).map(|i| i as f64).collect();
        let x = tensor(&m, &[5, 3], dtype);
        let bias = tensor(&[0.5, -1.0, 2.0], &[3], dtype);
        let want: Vec<f64> = (0..15)
            .map(|i| i as f64 + [0.5, -1.0, 2.0][i % 3])
            .collect();
        check("bias add", &add(&x, &bias).unwrap(), dtype, &[5, 3], &want);
        // 0-dim + tensor, both orders
        let s = tensor(&[2.0], &[], dtype);
        check(
            "0-dim * t",
            &mul(&s, &x).unwrap(),
            dtype,
            &[5, 3],
            &m.iter().map(|v| v * 2.0).collect::<Vec<_>>(),
        );
        check(
            "t - 0-dim",
            &sub(&x, &s).unwrap(),
            dtype,
            &[5, 3],
            &m.iter().map(|v| v - 2.0).collect::<Vec<_>>(),
        );
        // transposed + contiguous, narrowed (offset) views, expanded operands
        let xt = x.t().unwrap(); // [3, 5]
        let y = tensor(&m, &[3, 5], dtype);
        let want: Vec<f64> = (0..15).map(|k| m[(k % 5) * 3 + k / 5] + m[k]).collect();
        check(
            "transposed + contiguous",
            &add(&xt, &y).unwrap(),
            dtype,
            &[3, 5],
            &want,
        );
        let nr = x.narrow(0, 2, 3).unwrap().narrow(1, 1, 2).unwrap(); // [3, 2] at offset 7
        let want: Vec<f64> = [7.0, 8.0, 10.0, 11.0, 13.0, 14.0]
            .iter()
            .map(|v| v * 10.0)
            .collect();
        check(
            "narrowed * scalar",
            &mul_scalar(&nr, 10.0).unwrap(),
            dtype,
            &[3, 2],
            &want,
        );
        let e = bias.expand([4i64, 3]).unwrap();
        let want: Vec<f64> = (0..12).map(|i| [0.5, -1.0, 2.0][i % 3] * 2.0).collect();
        check(
            "expanded + expanded",
            &add(&e, &e).unwrap(),
            dtype,
            &[4, 3],
            &want,
        );
        // empty
        let z = add(&Tensor::zeros([0, 3], dtype), &bias).unwrap();
        assert_eq!(z.dims(), &[0, 3]);
    }
}

#[test]
fn shape_and_dtype_errors() {
    let a = tensor(&[1.0, 2.0, 3.0], &[3], DType::F32);
    let b = tensor(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32);
    err_contains(add(&a, &b), "must match the size of tensor b");
    err_contains(
        add(&a, &b),
        "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0",
    );
    err_contains(
        compare(CmpOp::Eq, &a, &b),
        "must match the size of tensor b",
    );
    err_contains(
        where_cond(&Tensor::from_vec(vec![true; 3], [3]).unwrap(), &a, &b),
        "must match the size of tensor b",
    );
    err_contains(addcmul(&a, &a, &b, 1.0), "must match the size of tensor b");
    err_contains(
        lerp(&a, &tensor(&[1.0; 3], &[3], DType::F64), 0.5),
        "expected dtype float32 for `end` but got dtype float64",
    );
    err_contains(
        lerp(
            &tensor(&[1.0], &[1], DType::I64),
            &tensor(&[1.0], &[1], DType::I64),
            0.5,
        ),
        "not implemented for 'Long'",
    );
}

#[test]
fn large_binary_paths_match_small_ones() {
    // same-shape contiguous, bias broadcast, scalar and transposed operands above the
    // parallel threshold against the single-threaded kernel on small pieces.
    let (r, c) = (300usize, 257usize);
    let data: Vec<f64> = (0..r * c)
        .map(|i| ((i * 7919) % 1013) as f64 * 0.01 - 5.0)
        .collect();
    for dtype in DType::FLOATS {
        let x = tensor(&data, &[r, c], dtype);
        let y = x.flip_rows();
        let bias = tensor(&data[..c], &[c], dtype);
        let xt = tensor(&data, &[c, r], dtype).t().unwrap();
        for (name, a, b) in [
            ("same", &x, &y),
            ("bias", &x, &bias),
            ("transposed", &xt, &x),
        ] {
            let got = add(a, b).unwrap();
            let mut want = Vec::new();
            for i in 0..r {
                let ai = a.get(i as i64).unwrap();
                let bi = if b.rank() == 2 {
                    b.get(i as i64).unwrap()
                } else {
                    b.clone()
                };
                want.extend(add(&ai, &bi).unwrap().to_vec_f64());
            }
            check_exact(name, &got, dtype, &want);
        }
        let got = mul_scalar(&x, 0.37).unwrap();
        let want: Vec<f64> = (0..r)
            .flat_map(|i| {
                mul_scalar(&x.get(i as i64).unwrap(), 0.37)
                    .unwrap()
                    .to_vec_f64()
            })
            .collect();
        check_exact("scalar", &got, dtype, &want);
    }
}

#[test]
fn large_ternary_with_transposed_and_3d_operands() {
    // tiles over three operands, rows split across parallel tasks, 3-D outer dims
    let (d0, r, c) = (3usize, 150usize, 97usize);
    let n = d0 * r * c;
    let data: Vec<f64> = (0..n)
        .map(|i| ((i * 31) % 211) as f64 * 0.05 - 5.0)
        .collect();
    for dtype in [DType::F32, DType::BF16] {
        let x = tensor(&data, &[d0, r, c], dtype);
        let t = tensor(&data, &[d0, c, r], dtype).transpose(1, 2).unwrap();
        let w = tensor(&data[..c], &[c], dtype);
        let got = addcmul(&x, &t, &w, 0.5).unwrap();
        let cond = compare_scalar(CmpOp::Gt, &t, 0.0).unwrap();
        let sel = where_cond(&cond, &t, &x).unwrap();
        let mut want = Vec::new();
        let mut want_sel = Vec::new();
        for i in 0..d0 {
            for j in 0..r {
                let (xi, ti) = (
                    x.get(i as i64).unwrap().get(j as i64).unwrap(),
                    t.get(i as i64).unwrap().get(j as i64).unwrap(),
                );
                want.extend(addcmul(&xi, &ti, &w, 0.5).unwrap().to_vec_f64());
                let ci = cond.get(i as i64).unwrap().get(j as i64).unwrap();
                want_sel.extend(where_cond(&ci, &ti, &xi).unwrap().to_vec_f64());
            }
        }
        check_exact("addcmul 3-d transposed", &got, dtype, &want);
        check_exact("where 3-d transposed", &sel, dtype, &want_sel);
    }
}

/// Reverse the rows of a 2-D tensor (a fresh contiguous tensor with other values).
trait FlipRows {
    fn flip_rows(&self) -> Tensor;
}
impl FlipRows for Tensor {
    fn flip_rows(&self) -> Tensor {
        let n = self.dims()[0];
        let rows: Vec<Tensor> = (0..n).rev().map(|i| self.get(i as i64).unwrap()).collect();
        let mut v = Vec::new();
        for r in &rows {
            v.extend(r.to_vec_f64());
        }
        tensor(&v, self.dims(), self.dtype())
    }
}

#[test]
fn aliasing_operands_share_one_lock() {
    let x = tensor(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32);
    check(
        "x + x",
        &add(&x, &x).unwrap(),
        DType::F32,
        &[2, 2],
        &[2.0, 4.0, 6.0, 8.0],
    );
    check(
        "x * x.t()",
        &mul(&x, &x.t().unwrap()).unwrap(),
        DType::F32,
        &[2, 2],
        &[1.0, 6.0, 6.0, 16.0],
    );
    let c = compare(CmpOp::Eq, &x, &x.t().unwrap()).unwrap();
    check_exact("x == x.t()", &c, DType::Bool, &[1.0, 0.0, 0.0, 1.0]);
    let w = where_cond(
        &compare_scalar(CmpOp::Gt, &x, 2).unwrap(),
        &x,
        &x.t().unwrap(),
    )
    .unwrap();
    check(
        "where aliasing",
        &w,
        DType::F32,
        &[2, 2],
        &[1.0, 3.0, 3.0, 4.0],
    );
}

// ----- ternary ---------------------------------------------------------------------

#[test]
fn where_broadcasts_and_promotes() {
    let cond = Tensor::from_vec(vec![true, false, true], [3, 1]).unwrap();
    let a = tensor(&[1.0, 2.0], &[2], DType::I32);
    let b = tensor(&[0.5], &[], DType::F64);
    let r = where_cond(&cond, &a, &b).unwrap();
    // result_type(i32 [2], f64 0-dim) = f64
    check(
        "where",
        &r,
        DType::F64,
        &[3, 2],
        &[1.0, 2.0, 0.5, 0.5, 1.0, 2.0],
    );
    let h = tensor(&[1.0, 2.0], &[2], DType::F16);
    let bf = tensor(&[3.0, 4.0], &[2], DType::BF16);
    let c2 = Tensor::from_vec(vec![false, true], [2]).unwrap();
    check(
        "where f16/bf16",
        &where_cond(&c2, &h, &bf).unwrap(),
        DType::F32,
        &[2],
        &[3.0, 2.0],
    );
    err_contains(
        where_cond(&h, &h, &h),
        "where expected condition to be a boolean tensor, but got a tensor with dtype float16",
    );
}

#[test]
fn clamp_rules() {
    let nan = f64::NAN;
    for dtype in DType::FLOATS {
        let x = tensor(&[-2.0, 0.5, 3.0, nan], &[4], dtype);
        check_exact(
            "clamp",
            &clamp(&x, Some(-1.0), Some(1.0)).unwrap(),
            dtype,
            &[-1.0, 0.5, 1.0, nan],
        );
        check_exact(
            "clamp min",
            &clamp(&x, Some(0.0), None).unwrap(),
            dtype,
            &[0.0, 0.5, 3.0, nan],
        );
        check_exact(
            "clamp max",
            &clamp(&x, None, Some(0.0)).unwrap(),
            dtype,
            &[-2.0, 0.0, 0.0, nan],
        );
        check_exact(
            "min > max",
            &clamp(&x, Some(2.0), Some(1.0)).unwrap(),
            dtype,
            &[1.0, 1.0, 1.0, nan],
        );
        check_exact(
            "nan bound",
            &clamp(&x, Some(nan), Some(1.0)).unwrap(),
            dtype,
            &[nan; 4],
        );
        let lo = tensor(&[-1.0, nan, 0.0, 0.0], &[4], dtype);
        let hi = tensor(&[1.0], &[1], dtype);
        check_exact(
            "clamp tensor",
            &clamp_tensor(&x, Some(&lo), Some(&hi)).unwrap(),
            dtype,
            &[-1.0, nan, 1.0, nan],
        );
        check_exact(
            "clamp tensor min",
            &clamp_tensor(&x, Some(&lo), None).unwrap(),
            dtype,
            &[-1.0, nan, 3.0, nan],
        );
        check_exact(
            "clamp tensor max",
            &clamp_tensor(&x, None, Some(&hi)).unwrap(),
            dtype,
            &[-2.0, 0.5, 1.0, nan],
        );
    }
    err_contains(
        clamp(&tensor(&[1.0], &[1], DType::F32), None, None),
        "At least one of 'min' or 'max' must not be None",
    );
    err_contains(
        clamp_tensor(&tensor(&[1.0], &[1], DType::F32), None, None),
        "At least one of 'min' or 'max' must not be None",
    );
    let i = tensor(&[-5.0, 0.0, 5.0], &[3], DType::I32);
    check(
        "int clamp",
        &clamp(&i, Some(-1.0), Some(2.0)).unwrap(),
        DType::I32,
        &[3],
        &[-1.0, 0.0, 2.0],
    );
    check(
        "int clamp float bound",
        &clamp(&i, Some(-0.5), None).unwrap(),
        DType::F32,
        &[3],
        &[-0.5, 0.0, 5.0],
    );
    let bounds = tensor(&[0.0, 0.0, 3.0], &[3], DType::I64);
    check(
        "int clamp tensor",
        &clamp_tensor(&i, Some(&bounds), None).unwrap(),
        DType::I64,
        &[3],
        &[0.0, 0.0, 5.0],
    );
}

#[test]
fn addcmul_addcdiv_lerp() {
    for dtype in DType::FLOATS {
        let s = tensor(&[1.0, 2.0, 3.0], &[3], dtype);
        let p = tensor(&[2.0, 4.0, -1.0], &[3], dtype);
        let q = tensor(&[0.5], &[1], dtype);
        check(
            "addcmul",
            &addcmul(&s, &p, &q, 2.0).unwrap(),
            dtype,
            &[3],
            &[3.0, 6.0, 2.0],
        );
        check(
            "addcdiv",
            &addcdiv(&s, &p, &q, 0.5).unwrap(),
            dtype,
            &[3],
            &[3.0, 6.0, 2.0],
        );
        let e = tensor(&[5.0, -2.0, 3.0], &[3], dtype);
        for w in [0.0, 0.25, 0.5, 0.75, 1.0, -0.5, 1.5] {
            let want: Vec<f64> = [1.0, 2.0, 3.0]
                .iter()
                .zip([5.0, -2.0, 3.0])
                .map(|(a, b)| a + w * (b - a))
                .collect();
            check(
                &format!("lerp {w}"),
                &lerp(&s, &e, w).unwrap(),
                dtype,
                &[3],
                &want,
            );
        }
        check_exact(
            "lerp endpoints",
            &lerp(&s, &e, 1.0).unwrap(),
            dtype,
            &[5.0, -2.0, 3.0],
        );
    }
    // promotion across the three operands
    let i = tensor(&[1.0, 2.0], &[2], DType::I64);
    let f = tensor(&[0.5, 0.25], &[2], DType::BF16);
    check(
        "addcmul promoted",
        &addcmul(&i, &f, &f, 4.0).unwrap(),
        DType::BF16,
        &[2],
        &[2.0, 2.25],
    );
    check(
        "addcmul int",
        &addcmul(&i, &i, &i, 2.0).unwrap(),
        DType::I64,
        &[2],
        &[3.0, 10.0],
    );
    err_contains(
        addcdiv(&i, &i, &i, 1.0),
        "Integer division with addcdiv is no longer supported",
    );
    err_contains(
        addcmul(&i, &i, &i, 0.5),
        "must not be a floating point number",
    );
}

// ----- property test: broadcasting + promotion of `binary` ------------------------------

const DTYPES: [DType; 7] = DType::ALL;

/// PyTorch's promotion table, written out (order: b, i32, i64, f16, bf16, f32, f64).
fn promote(a: DType, b: DType) -> DType {
    const T: [[usize; 7]; 7] = [
        [0, 1, 2, 3, 4, 5, 6],
        [1, 1, 2, 3, 4, 5, 6],
        [2, 2, 2, 3, 4, 5, 6],
        [3, 3, 3, 3, 5, 5, 6],
        [4, 4, 4, 5, 4, 5, 6],
        [5, 5, 5, 5, 5, 5, 6],
        [6, 6, 6, 6, 6, 6, 6],
    ];
    let ix = |d: DType| DTYPES.iter().position(|&x| x == d).unwrap();
    DTYPES[T[ix(a)][ix(b)]]
}

fn category(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        DType::I32 | DType::I64 => 1,
        _ => 2,
    }
}

/// `result_type` of two tensors: a 0-dim tensor only counts when it is of a higher
/// category than a dimensioned one.
fn model_result_type(a: DType, a_rank: usize, b: DType, b_rank: usize) -> DType {
    match (a_rank == 0, b_rank == 0) {
        (true, false) if category(a) <= category(b) => b,
        (false, true) if category(b) <= category(a) => a,
        _ => promote(a, b),
    }
}

/// The shape and values of one operand: `dims` is a suffix-aligned broadcastable
/// shape, `vals` its row-major values, `transposed` lays it out non-contiguously.
#[derive(Debug, Clone)]
struct Operand {
    dims: Vec<usize>,
    vals: Vec<f64>,
    dtype: DType,
    transposed: bool,
}

impl Operand {
    fn tensor(&self) -> Tensor {
        let t = tensor(&self.vals, &self.dims, self.dtype);
        if self.transposed && self.dims.len() >= 2 {
            t.transpose(-1i64, -2i64)
                .unwrap()
                .contiguous()
                .transpose(-1i64, -2i64)
                .unwrap()
        } else {
            t
        }
    }

    /// The value at output multi-index `idx` (broadcast by hand).
    fn at(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.dims.len();
        let mut flat = 0;
        for (d, &size) in self.dims.iter().enumerate() {
            let i = if size == 1 { 0 } else { idx[lead + d] };
            flat = flat * size + i;
        }
        self.vals[flat]
    }
}

fn operand(out: Vec<usize>) -> impl Strategy<Value = Operand> {
    let rank = out.len();
    (
        0..=rank,
        proptest::collection::vec(any::<bool>(), rank),
        0..7usize,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(move |(r, ones, dt, transposed, seed)| {
            let dims: Vec<usize> = (rank - r..rank)
                .map(|d| if ones[d] { 1 } else { out[d] })
                .collect();
            let n: usize = dims.iter().product();
            let dtype = DTYPES[dt];
            let mut s = seed | 1;
            let vals = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    if dtype == DType::Bool {
                        (s % 2) as f64
                    } else {
                        (s % 17) as f64 - 8.0
                    }
                })
                .collect();
            Operand {
                dims,
                vals,
                dtype,
                transposed,
            }
        })
}

fn case() -> impl Strategy<Value = (Operand, Operand, usize)> {
    proptest::collection::vec(1..=4usize, 0..=4)
        .prop_flat_map(|out| (operand(out.clone()), operand(out), 0..6usize))
}

const PROP_OPS: [BinaryOp; 6] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];

fn model_op(op: BinaryOp, dtype: DType, x: f64, y: f64) -> f64 {
    let b = |v: f64| v != 0.0;
    if dtype == DType::Bool {
        return match op {
            BinaryOp::Add | BinaryOp::Maximum => (b(x) || b(y)) as u8 as f64,
            _ => (b(x) && b(y)) as u8 as f64,
        };
    }
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Maximum => x.max(y),
        _ => x.min(y),
    }
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(64))]

    #[test]
    fn binary_matches_broadcasting_promotion_model((a, b, k) in case()) {
        let op = PROP_OPS[k];
        let (ta, tb) = (a.tensor(), b.tensor());
        let got = binary(op, &ta, &tb);
        if op == BinaryOp::Sub && (a.dtype == DType::Bool || b.dtype == DType::Bool) {
            prop_assert!(got.is_err());
            return Ok(());
        }
        let got = got.unwrap();
        let rt = model_result_type(a.dtype, a.dims.len(), b.dtype, b.dims.len());
        let want_dtype = if op == BinaryOp::Div && category(rt) < 2 { DType::F32 } else { rt };
        prop_assert_eq!(got.dtype(), want_dtype);
        let rank = a.dims.len().max(b.dims.len());
        let pad = |d: &[usize]| { let mut v = vec![1; rank - d.len()]; v.extend_from_slice(d); v };
        let (pa, pb) = (pad(&a.dims), pad(&b.dims));
        let out: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
        prop_assert_eq!(got.dims(), &out[..]);
        let vals = got.to_vec_f64();
        let n: usize = out.iter().product();
        let mut idx = vec![0usize; rank];
        for (i, &g) in vals.iter().enumerate().take(n) {
            let mut rem = i;
            for d in (0..rank).rev() {
                idx[d] = rem % out[d];
                rem /= out[d];
            }
            // small integers are exact in every dtype, so promotion is exact too
            let want = model_op(op, want_dtype, a.at(&idx), b.at(&idx));
            let want = rounded(&[want], want_dtype)[0];
            prop_assert!(close(g, want, tol(want_dtype)), "{:?} {:?} at {:?}: {} vs {}", op, want_dtype, idx, g, want);
        }
    }
}

#[test]
fn model_promotion_table_agrees_with_amp_tensor() {
    for a in DTYPES {
        for b in DTYPES {
            assert_eq!(promote(a, b), amp_tensor::promote_types(a, b), "{a} {b}");
        }
    }
}
