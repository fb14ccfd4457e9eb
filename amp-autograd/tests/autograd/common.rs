//! The gradient checker of this test binary: autograd's first- and second-order
//! gradients against central finite differences in float64 (every module checks its
//! differentiable ops with these two functions).

use amp_autograd::amp_tensor::{DType, Generator, Tensor as Raw};
use amp_autograd::ops;
use amp_autograd::{grad, GradOptions, Result, Tensor};

fn with_values(t: &Tensor, v: Vec<f64>) -> Tensor {
    let n = Tensor::from_vec(v, t.dims().to_vec()).unwrap();
    n.requires_grad_(true).unwrap();
    n
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    a.to_vec_f64()
        .iter()
        .zip(b.to_vec_f64())
        .map(|(x, y)| x * y)
        .sum()
}

/// Compare the gradient of `sum(f(inputs) * w)` with central differences for every
/// input element.
pub fn check_grad(inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>, tol: f64) {
    let out = f(inputs).unwrap();
    let w = Tensor::from_raw(
        Raw::randn(out.dims().to_vec(), DType::F64, &mut Generator::new(99)).unwrap(),
    );
    let gs = grad(
        &[out],
        inputs,
        &[Some(w.clone())],
        GradOptions {
            allow_unused: true,
            ..Default::default()
        },
    )
    .unwrap();
    compare(inputs, &gs, 1e-6, tol, "first order", |ins| {
        dot(&f(ins).unwrap(), &w)
    });
}

/// The gradient of `P(x) = sum_k sum(g_k * g_k)` (g the create_graph first-order grads
/// of `sum(f * w)`) against central differences of `P`.
pub fn check_second_order(inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>, tol: f64) {
    let penalty = |ins: &[Tensor], create: bool| -> (Tensor, f64) {
        let out = f(ins).unwrap();
        let w = Tensor::from_raw(
            Raw::randn(out.dims().to_vec(), DType::F64, &mut Generator::new(98)).unwrap(),
        );
        let gs = grad(
            &[out],
            ins,
            &[Some(w)],
            GradOptions {
                create_graph: create,
                allow_unused: true,
                ..Default::default()
            },
        )
        .unwrap();
        let mut p: Option<Tensor> = None;
        for g in gs.into_iter().flatten() {
            let s = ops::sum(&ops::mul(&g, &g).unwrap(), &[], false, None).unwrap();
            p = Some(match p {
                None => s,
                Some(q) => ops::add(&q, &s).unwrap(),
            });
        }
        let p = p.unwrap();
        let v = p.item_f64().unwrap();
        (p, v)
    };
    let (p, _) = penalty(inputs, true);
    let g2 = grad(
        &[p],
        inputs,
        &[None],
        GradOptions {
            allow_unused: true,
            ..Default::default()
        },
    )
    .unwrap();
    compare(inputs, &g2, 1e-5, tol, "second order", |ins| {
        penalty(ins, false).1
    });
}

/// Each element of `analytic` (the gradients of `value` with respect to `inputs`; `None`
/// for zero) against the central difference of `value` with step `eps`, within
/// `tol · (1 + |numeric|)`.
fn compare(
    inputs: &[Tensor],
    analytic: &[Option<Tensor>],
    eps: f64,
    tol: f64,
    what: &str,
    value: impl Fn(&[Tensor]) -> f64,
) {
    for (k, x) in inputs.iter().enumerate() {
        let base = x.to_vec_f64();
        let g = analytic[k]
            .as_ref()
            .map(|g| g.to_vec_f64())
            .unwrap_or(vec![0.0; base.len()]);
        for i in 0..base.len() {
            let at = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                let mut ins = inputs.to_vec();
                ins[k] = with_values(x, v);
                value(&ins)
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (fd - g[i]).abs() <= tol * (1.0 + fd.abs()),
                "{what}, input {k} element {i}: analytic {} vs numeric {fd}",
                g[i]
            );
        }
    }
}
