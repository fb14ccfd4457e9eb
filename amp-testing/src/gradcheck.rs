//! The gradient checker: gradients against central finite differences.
//!
//! A test evaluates its function in float64 at perturbed copies of its inputs (held as
//! plain `Vec<f64>`s, one per input, so the checker needs no tensor type) and compares
//! the autograd gradient with [`numeric_grad`] through [`assert_close`].
//!
//! ```
//! use amp_testing::gradcheck::{assert_close, numeric_grad};
//!
//! // f(x, y) = sum(x² y): df/dx = 2 x y.
//! let f = |v: &[Vec<f64>]| v[0].iter().zip(&v[1]).map(|(x, y)| x * x * y).sum::<f64>();
//! let vals = vec![vec![1.0, -2.0], vec![3.0, 0.5]];
//! let want = numeric_grad(&vals, 0, 1e-6, f);
//! assert_close(&[6.0, -2.0], &want, 1e-6, 1e-8, "d/dx");
//! ```

/// Central finite differences of the scalar `g` with respect to every element of the
/// input `which` of `vals`: `(g(v + eps·e_i) - g(v - eps·e_i)) / (2 eps)`.
pub fn numeric_grad(
    vals: &[Vec<f64>],
    which: usize,
    eps: f64,
    mut g: impl FnMut(&[Vec<f64>]) -> f64,
) -> Vec<f64> {
    let mut v = vals.to_vec();
    (0..vals[which].len())
        .map(|i| {
            let x = vals[which][i];
            v[which][i] = x + eps;
            let plus = g(&v);
            v[which][i] = x - eps;
            let minus = g(&v);
            v[which][i] = x;
            (plus - minus) / (2.0 * eps)
        })
        .collect()
}

/// Assert `|got - want| <= atol + rtol·|want|` elementwise (same lengths), naming
/// `what`, the first element at fault and both vectors on failure.
///
/// # Panics
/// When the lengths differ or an element is out of tolerance.
pub fn assert_close(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "{what}[{i}]: autograd {g} vs finite differences {w}\n got  {got:?}\n want {want:?}"
        );
    }
}
