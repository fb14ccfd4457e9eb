//! Seed 001, section 4 ("Gradient penalty"), without the scaler: the loop runs and every
//! gradient and parameter matches the closed form derived by hand.

use amp::autograd::{grad, ops, GradOptions, Reduction, Tensor};
use amp::optim::{Optimizer, Sgd, SgdOptions};

/// The penalty is the norm of the loss's parameter gradients, taken with `create_graph`,
/// added to the loss before the backward; SGD then steps. On `y = w·x + b` with loss
/// `(y - t)²` everything has a closed form: with `r = y - t`, `g_w = 2 r x`, `g_b = 2 r`,
/// `‖g‖ = 2 |r| √(x² + 1)`, so `d(loss + ‖g‖)/dw = 2 r x + 2 sign(r) x √(x² + 1)` and
/// `d(loss + ‖g‖)/db = 2 r + 2 sign(r) √(x² + 1)`.
#[test]
fn gradient_penalty_loop_matches_the_hand_derived_gradient() {
    let (x, t, lr) = (1.5f64, -0.25f64, 0.05f64);
    let param =
        |v: f64| Tensor::parameter(amp::tensor::Tensor::from_vec(vec![v], [1]).unwrap()).unwrap();
    let (w, b) = (param(0.8), param(0.3));
    let mut opt = Sgd::new(vec![w.clone(), b.clone()], lr, SgdOptions::default()).unwrap();
    let (mut w_ref, mut b_ref) = (0.8f64, 0.3f64);
    let xs = Tensor::from_vec(vec![x], [1]).unwrap();
    let ts = Tensor::from_vec(vec![t], [1]).unwrap();
    for step in 0..4 {
        opt.zero_grad();
        let y = ops::add(&ops::mul(&w, &xs).unwrap(), &b).unwrap();
        let loss = ops::mse_loss(&y, &ts, Reduction::Mean).unwrap();
        let gp = grad(
            std::slice::from_ref(&loss),
            &[w.clone(), b.clone()],
            &[None],
            GradOptions {
                create_graph: true,
                ..GradOptions::default()
            },
        )
        .unwrap();
        let mut norm2 = Tensor::scalar(0.0f64);
        for g in gp.iter().flatten() {
            norm2 = ops::add(&norm2, &ops::sum_all(&ops::square(g).unwrap()).unwrap()).unwrap();
        }
        let total = ops::add(&loss, &ops::sqrt(&norm2).unwrap()).unwrap();
        total.backward().unwrap();

        let r = w_ref * x + b_ref - t;
        let root = (x * x + 1.0).sqrt();
        let gw = 2.0 * r * x + 2.0 * r.signum() * x * root;
        let gb = 2.0 * r + 2.0 * r.signum() * root;
        let got_gw = w.grad().unwrap().to_vec_f64()[0];
        let got_gb = b.grad().unwrap().to_vec_f64()[0];
        assert!(
            (got_gw - gw).abs() < 1e-12,
            "step {step}: dw {got_gw} vs {gw}"
        );
        assert!(
            (got_gb - gb).abs() < 1e-12,
            "step {step}: db {got_gb} vs {gb}"
        );
        let want_total = r * r + 2.0 * r.abs() * root;
        assert!((total.item_f64().unwrap() - want_total).abs() < 1e-12);

        opt.step().unwrap();
        w_ref -= lr * gw;
        b_ref -= lr * gb;
        assert!(
            (w.to_vec_f64()[0] - w_ref).abs() < 1e-12,
            "step {step}: w {} vs {w_ref}",
            w.to_vec_f64()[0]
        );
        assert!((b.to_vec_f64()[0] - b_ref).abs() < 1e-12, "step {step}: b");
    }
}
