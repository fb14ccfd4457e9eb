//! The gradient checker: gradients against central finite differences, in float64.
//!
//! One implementation serves every test of the workspace: [`central_difference`] is the
//! only finite difference; [`numeric_grad`] (every element of one input) and
//! [`numeric_dir`] (along a direction through every input) apply it to a float64
//! function of plain vectors, and with the `autograd` feature `GradCheck` (with its
//! shorthands `check_grad` and `check_second_order`) applies them to autograd tensors,
//! first and second order, at every element or along chosen directions.
//!
//! ```
//! use amp_testing::gradcheck::{assert_close, numeric_dir, numeric_grad};
//!
//! // f(x, y) = sum(x² y): df/dx = 2 x y.
//! let f = |v: &[Vec<f64>]| v[0].iter().zip(&v[1]).map(|(x, y)| x * x * y).sum::<f64>();
//! let vals = vec![vec![1.0, -2.0], vec![3.0, 0.5]];
//! let want = numeric_grad(&vals, 0, 1e-6, f);
//! assert_close(&[6.0, -2.0], &want, 1e-6, 1e-8, "d/dx");
//! // Along x = (1, 1), y fixed: 6 - 2.
//! let d = numeric_dir(&vals, &[vec![1.0, 1.0], vec![0.0, 0.0]], 1e-6, f);
//! assert!((d - 4.0).abs() < 1e-6);
//! ```

/// The central difference `(g(eps) - g(-eps)) / (2 eps)` of `g`, a function of the step.
pub fn central_difference(eps: f64, mut g: impl FnMut(f64) -> f64) -> f64 {
    let plus = g(eps);
    let minus = g(-eps);
    (plus - minus) / (2.0 * eps)
}

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
            let d = central_difference(eps, |h| {
                v[which][i] = x + h;
                g(&v)
            });
            v[which][i] = x;
            d
        })
        .collect()
}

/// The derivative of the scalar `g` at `vals` along `dir` (one vector per input, each
/// as long as its input), by central differences: `(g(v + eps·d) - g(v - eps·d)) / (2
/// eps)`. For inputs confined to a subspace (symmetric or triangular matrices), the
/// directions stay inside it.
pub fn numeric_dir(
    vals: &[Vec<f64>],
    dir: &[Vec<f64>],
    eps: f64,
    mut g: impl FnMut(&[Vec<f64>]) -> f64,
) -> f64 {
    assert_eq!(vals.len(), dir.len(), "one direction per input");
    central_difference(eps, |h| {
        let moved: Vec<Vec<f64>> = vals
            .iter()
            .zip(dir)
            .map(|(x, d)| x.iter().zip(d).map(|(a, b)| a + h * b).collect())
            .collect();
        g(&moved)
    })
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
            "{what}[{i}]: got {g} vs want {w}\n got  {got:?}\n want {want:?}"
        );
    }
}

/// Assert `|got - want| <= tol·(1 + |want|)` elementwise: the checker's own criterion
/// (absolute near zero, relative for large values).
///
/// # Panics
/// When the lengths differ or an element is out of tolerance.
pub fn assert_near(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g} vs want {w}"
        );
    }
}

#[cfg(feature = "autograd")]
pub use tensors::*;

#[cfg(feature = "autograd")]
mod tensors {
    use super::{assert_near, numeric_dir, numeric_grad};
    use amp_autograd::amp_tensor::{DType, Generator, Tensor as Raw};
    use amp_autograd::{grad, ops, GradOptions, Result, Tensor};

    /// A differentiable function of the inputs under check.
    pub type Func<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;

    /// Where derivatives are compared: at every element of every input, or along given
    /// directions (each one vector per input).
    #[derive(Debug, Clone, Copy)]
    pub enum Along<'d> {
        /// Every element of every input (the full gradient).
        Elements,
        /// The directional derivatives along these directions.
        Directions(&'d [Vec<Vec<f64>>]),
    }

    /// What the second-order check differentiates: `P = Σ_k sum(g_k · v_k)` over the
    /// first-order gradients `g_k`.
    #[derive(Debug, Clone, Copy)]
    pub enum SecondOrder<'v> {
        /// `v_k = g_k`: the squared norm of the gradient (a Hessian-gradient product).
        Squares,
        /// Fixed `v_k` (Hessian-vector products).
        Vectors(&'v [Tensor]),
    }

    /// The gradient checker on autograd tensors: the gradient of `sum(f(inputs) · w)`
    /// (`w` fixed random weights) against [`numeric_grad`] / [`numeric_dir`], and the
    /// gradient of a function of the `create_graph` first-order gradients against central
    /// differences of first-order gradients computed without a graph. Every comparison is
    /// `|analytic - numeric| <= tol·(1 + |numeric|)`.
    ///
    /// ```
    /// use amp_autograd::{ops, Tensor};
    /// use amp_testing::gradcheck::{GradCheck, SecondOrder};
    ///
    /// let x = amp_testing::tensors::leaf(vec![0.5, -1.0, 2.0], &[3]);
    /// let f = |v: &[Tensor]| ops::mul(&ops::tanh(&v[0])?, &v[0]);
    /// let check = GradCheck::new(&f).tol(1e-6);
    /// check.first(std::slice::from_ref(&x));
    /// check.eps(1e-5).tol(1e-5).second(&[x], SecondOrder::Squares);
    /// ```
    #[derive(Clone, Copy)]
    pub struct GradCheck<'a> {
        f: Func<'a>,
        weights: Option<&'a Tensor>,
        seed: u64,
        eps: f64,
        tol: f64,
        along: Along<'a>,
    }

    impl<'a> GradCheck<'a> {
        /// A check of `f` with step `1e-6`, tolerance `1e-6`, weights drawn from seed 99,
        /// at every element.
        pub fn new(f: Func<'a>) -> Self {
            GradCheck {
                f,
                weights: None,
                seed: 99,
                eps: 1e-6,
                tol: 1e-6,
                along: Along::Elements,
            }
        }

        /// The finite-difference step.
        pub fn eps(self, eps: f64) -> Self {
            GradCheck { eps, ..self }
        }

        /// The tolerance of every comparison.
        pub fn tol(self, tol: f64) -> Self {
            GradCheck { tol, ..self }
        }

        /// The seed of the output weights `w` (standard normal, float64).
        pub fn seed(self, seed: u64) -> Self {
            GradCheck { seed, ..self }
        }

        /// Fixed output weights `w` instead of seeded ones.
        pub fn weights(self, w: &'a Tensor) -> Self {
            GradCheck {
                weights: Some(w),
                ..self
            }
        }

        /// Compare along `dirs` (each one vector per input) instead of every element.
        pub fn along(self, dirs: &'a [Vec<Vec<f64>>]) -> Self {
            GradCheck {
                along: Along::Directions(dirs),
                ..self
            }
        }

        fn weights_for(&self, out: &Tensor) -> Tensor {
            match self.weights {
                Some(w) => w.clone(),
                None => Tensor::from_raw(
                    Raw::randn(
                        out.dims().to_vec(),
                        DType::F64,
                        &mut Generator::new(self.seed),
                    )
                    .unwrap(),
                ),
            }
        }

        /// The gradients of `sum(f(inputs) · w)` (built with `create_graph` when
        /// `create`), `None` where an input is unused.
        fn first_grads(&self, inputs: &[Tensor], create: bool) -> Vec<Option<Tensor>> {
            let out = (self.f)(inputs).unwrap();
            let w = self.weights_for(&out);
            grad(
                &[out],
                inputs,
                &[Some(w)],
                GradOptions {
                    create_graph: create,
                    allow_unused: true,
                    ..Default::default()
                },
            )
            .unwrap()
        }

        /// First order: the gradient of `sum(f(inputs) · w)` against central
        /// differences of that sum.
        ///
        /// # Panics
        /// When `f` fails or a derivative is out of tolerance.
        pub fn first(&self, inputs: &[Tensor]) {
            let gs = self.first_grads(inputs, false);
            self.compare(inputs, &gs, "first order", |ins| {
                let out = (self.f)(ins).unwrap();
                let w = self.weights_for(&out);
                dot(&out.to_vec_f64(), &w.to_vec_f64())
            });
        }

        /// Second order: the gradient of `P = Σ_k sum(g_k · v_k)` (`g_k` the first-order
        /// gradients, built with `create_graph`) against central differences of `P`
        /// computed from first-order gradients alone.
        ///
        /// # Panics
        /// When `f` fails or a derivative is out of tolerance.
        pub fn second(&self, inputs: &[Tensor], form: SecondOrder<'_>) {
            let v = |k: usize, g: &Tensor| match form {
                SecondOrder::Squares => g.clone(),
                SecondOrder::Vectors(v) => v[k].clone(),
            };
            let gs = self.first_grads(inputs, true);
            let mut p: Option<Tensor> = None;
            for (k, g) in gs.iter().enumerate() {
                let Some(g) = g else { continue };
                let s = ops::sum_all(&ops::mul(g, &v(k, g)).unwrap()).unwrap();
                p = Some(match p {
                    None => s,
                    Some(q) => ops::add(&q, &s).unwrap(),
                });
            }
            // A first-order gradient that does not depend on the inputs has no graph:
            // the second-order gradient is zero.
            let g2 = match p {
                Some(p) if p.requires_grad() => grad(
                    &[p],
                    inputs,
                    &[None],
                    GradOptions {
                        allow_unused: true,
                        ..Default::default()
                    },
                )
                .unwrap(),
                _ => vec![None; inputs.len()],
            };
            self.compare(inputs, &g2, "second order", |ins| {
                let gs = self.first_grads(ins, false);
                gs.iter()
                    .enumerate()
                    .filter_map(|(k, g)| g.as_ref().map(|g| (k, g)))
                    .map(|(k, g)| dot(&g.to_vec_f64(), &v(k, g).to_vec_f64()))
                    .sum()
            });
        }

        /// `analytic` (the gradients of `value` at `inputs`; `None` for zero) against
        /// central differences of `value`, elementwise or along the directions.
        fn compare(
            &self,
            inputs: &[Tensor],
            analytic: &[Option<Tensor>],
            what: &str,
            value: impl Fn(&[Tensor]) -> f64,
        ) {
            let vals: Vec<Vec<f64>> = inputs.iter().map(Tensor::to_vec_f64).collect();
            let ana: Vec<Vec<f64>> = analytic
                .iter()
                .zip(&vals)
                .map(|(g, v)| g.as_ref().map_or(vec![0.0; v.len()], Tensor::to_vec_f64))
                .collect();
            let at = |v: &[Vec<f64>]| {
                let ins: Vec<Tensor> = inputs
                    .iter()
                    .zip(v)
                    .map(|(x, v)| leaf_like(x, v.clone()))
                    .collect();
                value(&ins)
            };
            match self.along {
                Along::Elements => {
                    for (k, a) in ana.iter().enumerate() {
                        let num = numeric_grad(&vals, k, self.eps, at);
                        assert_within(a, &num, self.tol, &format!("{what}, input {k}"));
                    }
                }
                Along::Directions(dirs) => {
                    for (j, d) in dirs.iter().enumerate() {
                        let num = numeric_dir(&vals, d, self.eps, at);
                        let a: f64 = ana.iter().zip(d).map(|(g, d)| dot(g, d)).sum();
                        assert_within(&[a], &[num], self.tol, &format!("{what}, direction {j}"));
                    }
                }
            }
        }
    }

    fn assert_within(analytic: &[f64], numeric: &[f64], tol: f64, what: &str) {
        assert_near(
            analytic,
            numeric,
            tol,
            &format!("{what} (analytic vs numeric)"),
        );
    }

    fn leaf_like(t: &Tensor, v: Vec<f64>) -> Tensor {
        let n = Tensor::from_vec(v, t.dims().to_vec()).unwrap();
        n.requires_grad_(true).unwrap();
        n
    }

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// First order at every element, step `1e-6`, weights from seed 99: the gradient of
    /// `sum(f(inputs) · w)` within `tol·(1 + |numeric|)`.
    ///
    /// # Panics
    /// When `f` fails or a derivative is out of tolerance.
    pub fn check_grad(inputs: &[Tensor], f: Func<'_>, tol: f64) {
        GradCheck::new(f).tol(tol).first(inputs);
    }

    /// Second order at every element, step `1e-5`, weights from seed 98: the gradient of
    /// `Σ_k sum(g_k · g_k)` over the first-order gradients.
    ///
    /// # Panics
    /// When `f` fails or a derivative is out of tolerance.
    pub fn check_second_order(inputs: &[Tensor], f: Func<'_>, tol: f64) {
        GradCheck::new(f)
            .seed(98)
            .eps(1e-5)
            .tol(tol)
            .second(inputs, SecondOrder::Squares);
    }
}
