//! Every documented GradScaler pattern as a real training loop on a small model, each
//! compared with a float32 control the way PyTorch's own tests do: init scale 128,
//! growth 2, interval 1, an inf injected at one iteration; the final scale is
//! 128 · 2^unskipped · 0.5^skipped and the parameters equal a control that skips the
//! same step.

use amp_autograd::{grad, ops, GradOptions, Reduction, Tensor};
use amp_nn::{Linear, Module, ReLU, Sequential};
use amp_optim::{clip_grad_norm_, Optimizer, Sgd, SgdOptions};
use amp_scaler::{GradScaler, GradScalerOptions, StepOutcome};
use amp_tensor::{DType, Generator};

const ITERS: usize = 6;
const INF_AT: usize = 3;

fn model(seed: u64) -> Sequential {
    let mut g = Generator::new(seed);
    Sequential::new()
        .add(Linear::new(6, 8, &mut g).unwrap())
        .add(ReLU)
        .add(Linear::new(8, 3, &mut g).unwrap())
}

fn data(n: usize) -> Vec<(Tensor, Tensor)> {
    let mut g = Generator::new(99);
    (0..n)
        .map(|_| {
            (
                Tensor::randn([4, 6], DType::F32, &mut g).unwrap(),
                Tensor::randn([4, 3], DType::F32, &mut g).unwrap(),
            )
        })
        .collect()
}

fn scaler() -> GradScaler {
    GradScaler::with_options(
        GradScalerOptions::default()
            .init_scale(128.0)
            .growth_factor(2.0)
            .growth_interval(1),
    )
    .unwrap()
}

fn sgd(m: &Sequential) -> Sgd {
    Sgd::new(
        m.parameters(),
        0.1,
        SgdOptions {
            momentum: 0.5,
            ..Default::default()
        },
    )
    .unwrap()
}

fn loss_of(m: &Sequential, x: &Tensor, y: &Tensor) -> Tensor {
    ops::mse_loss(&m.forward(x).unwrap(), y, Reduction::Mean).unwrap()
}

fn inject_inf(m: &Sequential) {
    let p = &m.parameters()[0];
    p.grad().unwrap().data().fill_(f64::INFINITY).unwrap();
}

fn assert_params_eq(a: &Sequential, b: &Sequential, tol: f64) {
    for ((na, pa), (_, pb)) in a.named_parameters().iter().zip(b.named_parameters()) {
        for (x, y) in pa.to_vec_f64().iter().zip(pb.to_vec_f64()) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{na}: {x} vs {y}");
        }
    }
}

/// The scaled model's half of iteration `i`: zeroed grads, the scaled `loss`'s backward,
/// and an inf in the grads at `INF_AT`.
fn scaled_backward(
    i: usize,
    s: &mut GradScaler,
    m: &Sequential,
    opt: &mut Sgd,
    loss: impl FnOnce(&mut GradScaler) -> Tensor,
) {
    opt.zero_grad();
    let l = loss(s);
    s.scale(&l).unwrap().backward().unwrap();
    if i == INF_AT {
        inject_inf(m);
    }
}

/// The control's iteration `i`: zeroed grads, `loss`'s backward, `before_step`, and the
/// step skipped where the scaled one is (`INF_AT`).
fn control_step(i: usize, copt: &mut Sgd, loss: Tensor, before_step: impl FnOnce()) {
    copt.zero_grad();
    loss.backward().unwrap();
    before_step();
    if i != INF_AT {
        copt.step().unwrap();
    }
}

fn expected_scale(skipped: usize) -> f64 {
    128.0 * 2f64.powi((ITERS - skipped) as i32) * 0.5f64.powi(skipped as i32)
}

#[test]
fn typical_use() {
    let (m, c) = (model(1), model(1));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    for (i, (x, y)) in data(ITERS).iter().enumerate() {
        scaled_backward(i, &mut s, &m, &mut opt, |_| loss_of(&m, x, y));
        let out = s.step(&mut opt).unwrap();
        assert_eq!(out.is_skipped(), i == INF_AT);
        s.update().unwrap();
        control_step(i, &mut copt, loss_of(&c, x, y), || ());
    }
    assert_eq!(s.get_scale(), expected_scale(1));
    assert_params_eq(&m, &c, 0.0);
    assert_eq!(s.stats().steps_skipped, 1);
    assert_eq!(s.stats().steps_taken, (ITERS - 1) as u64);
}

#[test]
fn clipping_after_unscale() {
    let (m, c) = (model(2), model(2));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    for (i, (x, y)) in data(ITERS).iter().enumerate() {
        scaled_backward(i, &mut s, &m, &mut opt, |_| loss_of(&m, x, y));
        s.unscale_(&mut opt);
        clip_grad_norm_(&m.parameters(), 0.1, Default::default()).unwrap();
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        control_step(i, &mut copt, loss_of(&c, x, y), || {
            clip_grad_norm_(&c.parameters(), 0.1, Default::default()).unwrap();
        });
    }
    assert_eq!(s.get_scale(), expected_scale(1));
    assert_params_eq(&m, &c, 1e-6);
}

#[test]
fn clipping_scaled_gradients() {
    let (m, c) = (model(3), model(3));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    for (i, (x, y)) in data(ITERS).iter().enumerate() {
        scaled_backward(i, &mut s, &m, &mut opt, |_| loss_of(&m, x, y));
        clip_grad_norm_(&m.parameters(), 0.1 * s.get_scale(), Default::default()).unwrap();
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        control_step(i, &mut copt, loss_of(&c, x, y), || {
            clip_grad_norm_(&c.parameters(), 0.1, Default::default()).unwrap();
        });
    }
    assert_eq!(s.get_scale(), expected_scale(1));
    assert_params_eq(&m, &c, 1e-5);
}

#[test]
fn gradient_accumulation() {
    let (m, c) = (model(4), model(4));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    let d = data(ITERS * 2);
    for (i, pair) in d.chunks(2).enumerate() {
        for (x, y) in pair {
            let l = ops::div_scalar(&loss_of(&m, x, y), 2.0).unwrap();
            s.scale(&l).unwrap().backward().unwrap();
            let lc = ops::div_scalar(&loss_of(&c, x, y), 2.0).unwrap();
            lc.backward().unwrap();
        }
        if i == INF_AT {
            inject_inf(&m);
        }
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        opt.zero_grad();
        if i != INF_AT {
            copt.step().unwrap();
        }
        copt.zero_grad();
    }
    assert_eq!(s.get_scale(), expected_scale(1));
    assert_params_eq(&m, &c, 0.0);
}

#[test]
fn gradient_penalty() {
    let (m, c) = (model(5), model(5));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    let penalty_loss =
        |net: &Sequential, x: &Tensor, y: &Tensor, scaled: Option<&mut GradScaler>| -> Tensor {
            let loss = loss_of(net, x, y);
            let params = net.parameters();
            let opts = GradOptions {
                create_graph: true,
                ..Default::default()
            };
            let grads: Vec<Tensor> = match scaled {
                Some(s) => {
                    let sg = grad(&[s.scale(&loss).unwrap()], &params, &[], opts).unwrap();
                    let inv = 1.0 / s.get_scale();
                    sg.into_iter()
                        .map(|g| ops::mul_scalar(&g.unwrap(), inv).unwrap())
                        .collect()
                }
                None => grad(std::slice::from_ref(&loss), &params, &[], opts)
                    .unwrap()
                    .into_iter()
                    .map(Option::unwrap)
                    .collect(),
            };
            let norm = grads
                .iter()
                .map(|g| ops::sum_all(&ops::square(g).unwrap()).unwrap())
                .reduce(|a, b| ops::add(&a, &b).unwrap())
                .unwrap();
            ops::add(&loss, &ops::sqrt(&norm).unwrap()).unwrap()
        };
    for (i, (x, y)) in data(ITERS).iter().enumerate() {
        scaled_backward(i, &mut s, &m, &mut opt, |s| penalty_loss(&m, x, y, Some(s)));
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        control_step(i, &mut copt, penalty_loss(&c, x, y, None), || ());
    }
    assert_eq!(s.get_scale(), expected_scale(1));
    assert_params_eq(&m, &c, 1e-5);
}

#[test]
fn multiple_models_losses_optimizers() {
    let (m0, m1, c0, c1) = (model(6), model(7), model(6), model(7));
    let (mut o0, mut o1, mut p0, mut p1) = (sgd(&m0), sgd(&m1), sgd(&c0), sgd(&c1));
    let mut s = scaler();
    for (i, (x, y)) in data(ITERS).iter().enumerate() {
        let run = |a: &Sequential, b: &Sequential| {
            let (oa, ob) = (a.forward(x).unwrap(), b.forward(x).unwrap());
            let l0 = ops::mse_loss(
                &ops::add(&ops::mul_scalar(&oa, 2.0).unwrap(), &ob).unwrap(),
                y,
                Reduction::Mean,
            )
            .unwrap();
            let l1 = ops::mse_loss(
                &ops::add(&ops::mul_scalar(&ob, 3.0).unwrap(), &oa).unwrap(),
                y,
                Reduction::Mean,
            )
            .unwrap();
            (l0, l1)
        };
        o0.zero_grad();
        o1.zero_grad();
        let (l0, l1) = run(&m0, &m1);
        s.scale(&l0)
            .unwrap()
            .backward_with(amp_autograd::BackwardOptions {
                retain_graph: Some(true),
                ..Default::default()
            })
            .unwrap();
        s.scale(&l1).unwrap().backward().unwrap();
        if i == INF_AT {
            inject_inf(&m1); // only optimizer 1 sees the inf
        }
        assert_eq!(s.step(&mut o0).unwrap(), StepOutcome::Stepped);
        assert_eq!(s.step(&mut o1).unwrap().is_skipped(), i == INF_AT);
        s.update().unwrap();
        p0.zero_grad();
        p1.zero_grad();
        let (k0, k1) = run(&c0, &c1);
        k0.backward_with(amp_autograd::BackwardOptions {
            retain_graph: Some(true),
            ..Default::default()
        })
        .unwrap();
        k1.backward().unwrap();
        p0.step().unwrap();
        if i != INF_AT {
            p1.step().unwrap();
        }
    }
    assert_eq!(
        s.get_scale(),
        expected_scale(1),
        "one inf backs the shared scale off once"
    );
    assert_params_eq(&m0, &c0, 0.0);
    assert_params_eq(&m1, &c1, 0.0);
}

#[test]
fn batch_replay_after_a_skipped_step() {
    let (m, c) = (model(8), model(8));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    let d = data(ITERS);
    let mut injected = false;
    let mut i = 0;
    while i < d.len() {
        let (x, y) = &d[i];
        opt.zero_grad();
        s.scale(&loss_of(&m, x, y)).unwrap().backward().unwrap();
        if i == INF_AT && !injected {
            inject_inf(&m);
            injected = true;
        }
        let out = s.step(&mut opt).unwrap();
        s.update().unwrap();
        if out.is_skipped() {
            continue; // replay the same batch
        }
        copt.zero_grad();
        loss_of(&c, x, y).backward().unwrap();
        copt.step().unwrap();
        i += 1;
    }
    assert_eq!(s.get_scale(), 128.0 * 2f64.powi(ITERS as i32) * 0.5);
    assert_params_eq(&m, &c, 0.0);
}

#[test]
fn disabled_scaler_is_a_pass_through() {
    let (m, c) = (model(9), model(9));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = GradScaler::with_options(
        GradScalerOptions::default()
            .enabled(false)
            .growth_factor(0.5),
    )
    .unwrap();
    for (x, y) in data(ITERS) {
        opt.zero_grad();
        let l = loss_of(&m, &x, &y);
        let sl = s.scale(&l).unwrap();
        assert_eq!(sl.id(), l.id(), "scale returns its input");
        sl.backward().unwrap();
        s.unscale_(&mut opt);
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        copt.zero_grad();
        loss_of(&c, &x, &y).backward().unwrap();
        copt.step().unwrap();
    }
    assert_eq!(s.get_scale(), 1.0);
    assert!(s.state_dict().is_none());
    assert_params_eq(&m, &c, 0.0);
}

#[test]
fn autocast_training_keeps_float32_params_and_skips_cleanly() {
    use amp_autocast::autocast;
    use amp_policy::DeviceType;
    let (m, c) = (model(10), model(10));
    let (mut opt, mut copt) = (sgd(&m), sgd(&c));
    let mut s = scaler();
    for (i, (x, y)) in data(ITERS).iter().enumerate() {
        scaled_backward(i, &mut s, &m, &mut opt, |_| {
            autocast(DeviceType::Cpu, DType::BF16, || loss_of(&m, x, y)).unwrap()
        });
        let before: Vec<Vec<f64>> = m.parameters().iter().map(|p| p.to_vec_f64()).collect();
        let out = s.step(&mut opt).unwrap();
        if out.is_skipped() {
            let after: Vec<Vec<f64>> = m.parameters().iter().map(|p| p.to_vec_f64()).collect();
            assert_eq!(before, after, "a skipped step leaves parameters untouched");
        }
        s.update().unwrap();
        let lc = autocast(DeviceType::Cpu, DType::BF16, || loss_of(&c, x, y)).unwrap();
        control_step(i, &mut copt, lc, || ());
    }
    assert!(m.parameters().iter().all(|p| p.dtype() == DType::F32));
    assert_eq!(s.get_scale(), expected_scale(1));
    assert_params_eq(&m, &c, 0.0);
}
