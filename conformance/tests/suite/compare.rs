//! The comparison rule of the format (README "Values"), case by case.

use amp::tensor::{DType, Tensor};
use conformance::compare::{all_zero, compare, Tolerance};
use conformance::value::{parse_dtype, Number, TensorLit};

/// A tensor of `dtype` (by its format name) and `shape` from exact values.
fn t(dtype: &str, shape: &[usize], data: &[f64]) -> Tensor {
    let data = data.iter().map(|&x| Number::Float(x)).collect();
    TensorLit::new(parse_dtype(dtype).unwrap(), shape.to_vec(), data)
        .unwrap()
        .to_tensor()
}

fn ints(dtype: &str, data: &[i64]) -> Tensor {
    let data: Vec<Number> = data.iter().map(|&x| Number::Int(x)).collect();
    TensorLit::new(parse_dtype(dtype).unwrap(), vec![data.len()], data)
        .unwrap()
        .to_tensor()
}

/// Compares `got` with `expect` (a tensor and its tolerance, `None` for exact) and checks
/// the result: `Ok(())`, or `Err` with the mismatch as printed.
fn check(got: Tensor, expect: (Tensor, Option<Tolerance>), expect_result: Result<(), &str>) {
    let (want, tol) = expect;
    let result = compare("output", &got, &want, tol).map_err(|m| m.to_string());
    assert_eq!(
        result.as_ref().map(|_| ()).map_err(String::as_str),
        expect_result
    );
}

/// [`check`] of two 1-D tensors of `dtype`.
fn check_values(
    dtype: &str,
    got: &[f64],
    want: &[f64],
    tol: Option<Tolerance>,
    expect_result: Result<(), &str>,
) {
    let expect = (t(dtype, &[want.len()], want), tol);
    check(t(dtype, &[got.len()], got), expect, expect_result);
}

const EXACT: Option<Tolerance> = None;

fn tol(rtol: f64, atol: f64) -> Option<Tolerance> {
    Some(Tolerance::new(rtol, atol))
}

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

#[test]
fn exact_equal_values_pass() {
    check(
        t(
            "float32",
            &[2, 2],
            &[1.0, -2.5, 0.1f32 as f64, 3e-40f32 as f64],
        ),
        (
            t(
                "float32",
                &[2, 2],
                &[1.0, -2.5, 0.1f32 as f64, 3e-40f32 as f64],
            ),
            EXACT,
        ),
        Ok(()),
    );
    check(
        t("bfloat16", &[], &[1.0078125]),
        (t("bfloat16", &[], &[1.0078125]), EXACT),
        Ok(()),
    );
}

#[test]
fn exact_is_bitwise_in_the_dtype() {
    check_values(
        "bfloat16",
        &[1.0, 1.0078125],
        &[1.0, 1.0],
        EXACT,
        Err("element 1 of output: got 1.0078125 (bfloat16), expected 1.0 (exact)"),
    );
    // The sign of zero is part of the bits.
    check_values(
        "float32",
        &[-0.0],
        &[0.0],
        EXACT,
        Err("element 0 of output: got -0.0 (float32), expected 0.0 (exact)"),
    );
    // ... but within a tolerance -0.0 is 0.0.
    check_values("float32", &[-0.0], &[0.0], tol(0.0, 0.0), Ok(()));
}

#[test]
fn dtype_is_checked_first() {
    check(
        t("float32", &[2], &[1.0, 2.0]),
        (t("bfloat16", &[2], &[1.0, 2.0]), tol(1.0, 1.0)),
        Err("dtype of output: got float32, expected bfloat16"),
    );
}

#[test]
fn shape_is_checked_before_values() {
    check(
        t("float32", &[2], &[1.0, 2.0]),
        (t("float32", &[1, 2], &[1.0, 2.0]), EXACT),
        Err("shape of output: got [2], expected [1, 2]"),
    );
    // A 0-dim tensor is not a 1-element 1-d tensor.
    check(
        t("float64", &[], &[1.0]),
        (t("float64", &[1], &[1.0]), EXACT),
        Err("shape of output: got [], expected [1]"),
    );
}

#[test]
fn tolerance_is_atol_plus_rtol_times_expected() {
    // |x - y| <= atol + rtol * |y|, inclusive.
    check_values("float64", &[1.5], &[1.0], tol(0.25, 0.25), Ok(()));
    check_values(
        "float64",
        &[1.5000000001],
        &[1.0],
        tol(0.25, 0.25),
        Err("element 0 of output: got 1.5000000001 (float64), expected 1.0 (atol 0.25, rtol 0.25)"),
    );
    // rtol scales with the expected value, not the result.
    check_values("float64", &[0.0], &[100.0], tol(1.0, 0.0), Ok(()));
    check_values(
        "float64",
        &[100.0],
        &[0.0],
        tol(1.0, 0.0),
        Err("element 0 of output: got 100.0 (float64), expected 0.0 (atol 0, rtol 1)"),
    );
    check_values(
        "float16",
        &[0.0, 0.0, 0.0, 1.0009765625],
        &[0.0, 0.0, 0.0, 1.0],
        tol(0.0, 0.0),
        Err("element 3 of output: got 1.0009765625 (float16), expected 1.0 (atol 0, rtol 0)"),
    );
    check_values(
        "float32",
        &[1.0],
        &[1.5],
        tol(1e-5, 1e-6),
        Err("element 0 of output: got 1.0 (float32), expected 1.5 (atol 1e-6, rtol 1e-5)"),
    );
}

#[test]
fn the_first_mismatch_is_reported() {
    check(
        t("float32", &[2, 2], &[1.0, 9.0, 2.0, 9.0]),
        (t("float32", &[2, 2], &[1.0, 2.0, 3.0, 4.0]), tol(0.0, 0.5)),
        Err("element 1 of output: got 9.0 (float32), expected 2.0 (atol 0.5, rtol 0)"),
    );
}

#[test]
fn nan_matches_only_nan() {
    check_values("float32", &[NAN], &[NAN], EXACT, Ok(()));
    check_values("float32", &[NAN], &[NAN], tol(0.1, 0.1), Ok(()));
    check_values("float32", &[1.0], &[NAN], tol(1e9, 1e9), Err("element 0 of output: got 1.0 (float32), expected nan (atol 1000000000, rtol 1000000000)"));
    check_values("float32", &[NAN], &[1.0], tol(1e9, 1e9), Err("element 0 of output: got nan (float32), expected 1.0 (atol 1000000000, rtol 1000000000)"));
    check_values(
        "bfloat16",
        &[INF],
        &[NAN],
        EXACT,
        Err("element 0 of output: got inf (bfloat16), expected nan (exact)"),
    );
}

#[test]
fn infinity_matches_only_the_same_infinity() {
    check_values("float16", &[INF, -INF], &[INF, -INF], tol(0.1, 0.1), Ok(()));
    check_values(
        "float16",
        &[-INF],
        &[INF],
        tol(0.1, 0.1),
        Err("element 0 of output: got -inf (float16), expected inf (atol 0.1, rtol 0.1)"),
    );
    // No tolerance makes a finite value equal to an infinity, nor the reverse.
    check_values("float32", &[3e38f32 as f64], &[INF], tol(1e9, 1e9), Err("element 0 of output: got 3.0000000054977558e38 (float32), expected inf (atol 1000000000, rtol 1000000000)"));
    check_values("float32", &[INF], &[1.0], tol(1e9, 1e9), Err("element 0 of output: got inf (float32), expected 1.0 (atol 1000000000, rtol 1000000000)"));
}

#[test]
fn integers_compare_exactly() {
    let big = (1i64 << 53) + 1;
    check(
        ints("int64", &[big, i64::MIN]),
        (ints("int64", &[big, i64::MIN]), EXACT),
        Ok(()),
    );
    check(
        ints("int64", &[1 << 53]),
        (ints("int64", &[big]), EXACT),
        Err("element 0 of output: got 9007199254740992 (int64), expected 9007199254740993 (exact)"),
    );
    check(
        ints("int32", &[3]),
        (ints("int64", &[3]), EXACT),
        Err("dtype of output: got int32, expected int64"),
    );
}

#[test]
fn booleans_compare_exactly() {
    let b = |v: &[bool]| {
        TensorLit::new(
            DType::Bool,
            vec![v.len()],
            v.iter().map(|&x| Number::Bool(x)).collect(),
        )
        .unwrap()
        .to_tensor()
    };
    check(b(&[true, false]), (b(&[true, false]), EXACT), Ok(()));
    check(
        b(&[true, true]),
        (b(&[true, false]), EXACT),
        Err("element 1 of output: got true (bool), expected false (exact)"),
    );
}

#[test]
fn tolerance_from_the_case() {
    assert_eq!(Tolerance::from_options(None, None), None);
    assert_eq!(Tolerance::from_options(Some(1e-5), None), tol(1e-5, 0.0));
    assert_eq!(Tolerance::from_options(None, Some(1e-6)), tol(0.0, 1e-6));
}

#[test]
fn null_gradients_accept_zeros_only() {
    assert!(all_zero("grads[1]", &t("float32", &[3], &[0.0, -0.0, 0.0])).is_ok());
    assert_eq!(
        all_zero("grads[1]", &t("float32", &[3], &[0.0, NAN, 1.0]))
            .unwrap_err()
            .to_string(),
        "grads[1]: expected no gradient (null or zeros), got nan at element 1"
    );
}
