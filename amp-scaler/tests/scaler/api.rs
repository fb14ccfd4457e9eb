//! The scaler's contract: messages, panics and their `try_` forms, state dict, the
//! update rule against a reference model, extras.

use amp_autograd::{ops, Tensor};
use amp_optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use amp_scaler::*;
use amp_tensor::DType;
use proptest::prelude::*;

fn param(v: &[f32]) -> Tensor {
    Tensor::parameter(amp_tensor::Tensor::from_slice(v, [v.len()]).unwrap()).unwrap()
}

fn set_grad(p: &Tensor, g: &[f32]) {
    p.set_grad(Some(Tensor::from_slice(g, [g.len()]).unwrap()))
        .unwrap();
}

#[test]
fn constructor_validation_messages() {
    let e = GradScaler::with_options(GradScalerOptions::default().growth_factor(1.0)).unwrap_err();
    assert_eq!(e.to_string(), "The growth factor must be > 1.0.");
    let e = GradScaler::with_options(GradScalerOptions::default().backoff_factor(1.0)).unwrap_err();
    assert_eq!(e.to_string(), "The backoff factor must be < 1.0.");
    assert!(GradScaler::with_options(
        GradScalerOptions::default()
            .enabled(false)
            .growth_factor(0.1)
    )
    .is_ok());
}

#[test]
fn messages_are_pytorchs() {
    let p = param(&[1.0]);
    let mut opt = Sgd::new(vec![p.clone()], 1.0, SgdOptions::default()).unwrap();
    let mut s = GradScaler::new();
    insta::assert_snapshot!(
        "unscale_before_scale",
        s.try_unscale_(&mut opt).unwrap_err().to_string()
    );
    insta::assert_snapshot!(
        "step_before_scale",
        s.step(&mut opt).unwrap_err().to_string()
    );
    insta::assert_snapshot!("update_before_scale", s.update().unwrap_err().to_string());
    s.scale(&Tensor::scalar(1.0f32)).unwrap();
    insta::assert_snapshot!("update_without_checks", s.update().unwrap_err().to_string());
    set_grad(&p, &[1.0]);
    s.try_unscale_(&mut opt).unwrap();
    insta::assert_snapshot!(
        "unscale_twice",
        s.try_unscale_(&mut opt).unwrap_err().to_string()
    );
    s.step(&mut opt).unwrap();
    insta::assert_snapshot!(
        "unscale_after_step",
        s.try_unscale_(&mut opt).unwrap_err().to_string()
    );
    insta::assert_snapshot!("step_twice", s.step(&mut opt).unwrap_err().to_string());
    s.update().unwrap();
    p.set_grad(Some(
        Tensor::from_vec(vec![amp_tensor::half::f16::ONE], [1])
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap(),
    ))
    .ok();
    let h = Tensor::parameter(amp_tensor::Tensor::ones([1], DType::F16)).unwrap();
    h.set_grad(Some(Tensor::ones([1], DType::F16))).unwrap();
    let mut hopt = Sgd::new(vec![h], 1.0, SgdOptions::default()).unwrap();
    insta::assert_snapshot!(
        "fp16_grads",
        s.try_unscale_(&mut hopt).unwrap_err().to_string()
    );
    insta::assert_snapshot!(
        "closure",
        s.step_with_closure(&mut opt, || Ok(Tensor::scalar(0.0f32)))
            .unwrap_err()
            .to_string()
    );
    insta::assert_snapshot!(
        "empty_state_dict",
        s.load_state_dict(None).unwrap_err().to_string()
    );
    insta::assert_snapshot!("no_checks_for_optimizer", {
        let q = param(&[1.0]);
        let mut o = Sgd::new(vec![q], 1.0, SgdOptions::default()).unwrap();
        s.step(&mut o).unwrap_err().to_string()
    });
    insta::assert_snapshot!(
        "bad_new_scale",
        s.update_with(NewScale::Tensor(Tensor::ones([2], DType::F32)))
            .unwrap_err()
            .to_string()
    );
    insta::assert_snapshot!("not_a_tensor", ScalerError::NotATensor.to_string());
}

#[test]
#[should_panic(
    expected = "unscale_() has already been called on this optimizer since the last update()."
)]
fn second_unscale_panics() {
    let p = param(&[1.0]);
    let mut opt = Sgd::new(vec![p.clone()], 1.0, SgdOptions::default()).unwrap();
    let mut s = GradScaler::new();
    s.scale(&Tensor::scalar(1.0f32)).unwrap();
    set_grad(&p, &[1.0]);
    s.unscale_(&mut opt);
    s.unscale_(&mut opt);
}

#[test]
fn state_dict_json_exact() {
    let mut s = GradScaler::with_options(
        GradScalerOptions::default()
            .init_scale(3.0)
            .growth_factor(1.1)
            .growth_interval(1),
    )
    .unwrap();
    insta::assert_snapshot!("state_dict_before_scale", s.state_dict_json().to_string());
    let p = param(&[1.0]);
    let mut opt = Sgd::new(vec![p.clone()], 1.0, SgdOptions::default()).unwrap();
    s.scale(&Tensor::scalar(1.0f32)).unwrap();
    set_grad(&p, &[1.0]);
    s.step(&mut opt).unwrap();
    s.update().unwrap();
    assert_eq!(s.get_scale(), 3.299999952316284, "f32(f64(3.0) * 1.1)");
    insta::assert_snapshot!("state_dict_after_growth", s.state_dict_json().to_string());
    let disabled = GradScaler::with_options(GradScalerOptions::default().enabled(false)).unwrap();
    insta::assert_snapshot!(
        "state_dict_disabled",
        disabled.state_dict_json().to_string()
    );
    // JSON round trip and loading a PyTorch-produced dict
    let torch = r#"{"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 17}"#;
    let mut t = GradScaler::new();
    t.load_state_dict_json(&serde_json::from_str(torch).unwrap())
        .unwrap();
    assert_eq!(t.get_scale(), 32768.0);
    assert_eq!(t.get_growth_tracker(), 17);
    let back: ScalerStateDict = serde_json::from_str(&t.state_dict_json().to_string()).unwrap();
    assert_eq!(back, t.state_dict().unwrap());
}

#[test]
fn fused_adam_equals_ordinary_path() {
    let run = |fused: bool| {
        let p = param(&[1.0, -2.0, 0.5]);
        let mut opt = Adam::new(vec![p.clone()], 0.01, AdamOptions::default()).unwrap();
        let mut s = GradScaler::new();
        for i in 0..5 {
            opt.zero_grad();
            let loss = ops::sum_all(&ops::square(&p).unwrap()).unwrap();
            s.scale(&loss).unwrap().backward().unwrap();
            if i == 2 {
                p.grad().unwrap().data().fill_(f64::NAN).unwrap();
            }
            if fused {
                s.step(&mut opt).unwrap();
            } else {
                s.unscale_(&mut opt);
                if !p
                    .grad()
                    .unwrap()
                    .to_vec_f64()
                    .iter()
                    .any(|v| !v.is_finite())
                {
                    opt.step().unwrap();
                }
            }
            s.update().unwrap();
        }
        (p.to_vec_f64(), s.get_scale())
    };
    assert!(Adam::new(vec![param(&[0.0])], 0.01, AdamOptions::default())
        .unwrap()
        .supports_amp_scaling());
    assert_eq!(run(true), run(false));
}

#[test]
fn extras_min_max_hysteresis() {
    let p = param(&[1.0]);
    let mut opt = Sgd::new(vec![p.clone()], 0.0, SgdOptions::default()).unwrap();
    let mut s = GradScaler::with_options(
        GradScalerOptions::default()
            .init_scale(4.0)
            .hysteresis(2)
            .min_scale(1.0)
            .max_scale(8.0)
            .growth_interval(1),
    )
    .unwrap();
    let mut step = |g: f32, s: &mut GradScaler| {
        s.scale(&Tensor::scalar(1.0f32)).unwrap();
        set_grad(&p, &[g]);
        s.step(&mut opt).unwrap();
        s.update().unwrap();
        s.get_scale()
    };
    assert_eq!(step(f32::INFINITY, &mut s), 4.0, "first overflow tolerated");
    assert_eq!(
        step(f32::INFINITY, &mut s),
        2.0,
        "second consecutive backs off"
    );
    assert_eq!(step(f32::INFINITY, &mut s), 2.0);
    assert_eq!(step(f32::INFINITY, &mut s), 1.0);
    assert_eq!(step(f32::INFINITY, &mut s), 1.0);
    assert_eq!(step(f32::INFINITY, &mut s), 1.0, "floor");
    for _ in 0..6 {
        step(1.0, &mut s);
    }
    assert_eq!(s.get_scale(), 8.0, "ceiling");
    assert_eq!(s.stats().steps_skipped, 6);
    assert!(!s.stats().last_found_inf);
}

/// The update rule, written independently: f64 arithmetic rounded to f32.
fn reference(scale: f32, tracker: i32, found: bool, gf: f64, bf: f64, interval: i32) -> (f32, i32) {
    if found {
        ((scale as f64 * bf) as f32, 0)
    } else if tracker + 1 == interval {
        let s = (scale as f64 * gf) as f32;
        (if s.is_finite() { s } else { scale }, 0)
    } else {
        (scale, tracker + 1)
    }
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(48))]
    #[test]
    fn update_rule_matches_reference(
        init in prop_oneof![Just(65536.0f64), Just(3.0), Just(1e38), Just(1e-40)],
        gf in prop_oneof![Just(2.0f64), Just(1.1), Just(3.0)],
        bf in prop_oneof![Just(0.5f64), Just(0.25), Just(0.9)],
        interval in 1i64..4,
        events in proptest::collection::vec(0u8..5, 1..24),
    ) {
        let p = param(&[1.0]);
        let mut opt = Sgd::new(vec![p.clone()], 0.0, SgdOptions::default()).unwrap();
        let mut s = GradScaler::with_options(GradScalerOptions::default().init_scale(init).growth_factor(gf).backoff_factor(bf).growth_interval(interval)).unwrap();
        let (mut rs, mut rt) = (init as f32, 0i32);
        for e in events {
            s.scale(&Tensor::scalar(1.0f32)).unwrap();
            match e {
                4 => {
                    // a manual update: the scale is set, the tracker left alone
                    let v = (rs as f64) * 0.75;
                    s.update_with(NewScale::Value(v)).unwrap();
                    rs = v as f32;
                }
                _ => {
                    let g = [1.0f32, f32::INFINITY, f32::NAN, -f32::INFINITY][e as usize];
                    set_grad(&p, &[g]);
                    let out = s.step(&mut opt).unwrap();
                    prop_assert_eq!(out.is_skipped(), !g.is_finite());
                    s.update().unwrap();
                    let r = reference(rs, rt, !g.is_finite(), gf, bf, interval as i32);
                    rs = r.0;
                    rt = r.1;
                }
            }
            prop_assert_eq!(s.get_scale().to_bits(), (rs as f64).to_bits());
            prop_assert_eq!(s.get_growth_tracker(), rt as i64);
        }
    }
}
