//! Scaler state dicts are outside data: whatever bytes or JSON arrive, loading never
//! panics; it either fails and changes nothing, or succeeds and leaves a scaler that
//! scales, steps and updates. NaN and infinite scales round-trip.

use amp_autograd::Tensor;
use amp_optim::{Sgd, SgdOptions};
use amp_scaler::{
    GradScaler, GradScalerOptions, NewScale, ScalerError, ScalerStateDict, StateDictProblem,
};
use amp_testing::json::{json_value, mutated_json};
use amp_testing::proptest_config;
use proptest::prelude::*;
use serde_json::{json, Value};

const KEYS: &[&str] = &[
    "scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "_growth_tracker",
];

/// A scaler that has scaled and updated once (so its tensors exist), or a fresh one.
fn scaler(used: bool) -> GradScaler {
    let mut s = GradScaler::with_options(GradScalerOptions::default().init_scale(512.0)).unwrap();
    if used {
        run_step(&mut s);
    }
    s
}

/// One scale / step / update cycle.
fn run_step(s: &mut GradScaler) {
    let p = Tensor::parameter(amp_tensor::Tensor::from_slice(&[1.0f32], [1]).unwrap()).unwrap();
    let mut opt = Sgd::new(vec![p.clone()], 0.1, SgdOptions::default()).unwrap();
    s.scale(&Tensor::scalar(1.0f32)).unwrap();
    p.set_grad(Some(Tensor::from_slice(&[3.0f32], [1]).unwrap()))
        .unwrap();
    s.step(&mut opt).unwrap();
    s.update().unwrap();
}

fn check(v: &Value) -> Result<(), TestCaseError> {
    // The serde path must not panic either.
    let _ = serde_json::from_value::<ScalerStateDict>(v.clone());
    for used in [false, true] {
        let mut s = scaler(used);
        let before = s.state_dict_json();
        match s.load_state_dict_json(v) {
            Err(_) => prop_assert_eq!(s.state_dict_json(), before),
            Ok(()) => {
                let sd = ScalerStateDict::from_json(v).unwrap();
                prop_assert_eq!(s.get_growth_tracker(), sd.growth_tracker);
                run_step(&mut s);
                // What it saves now loads back.
                let again = s.state_dict_json();
                scaler(true).load_state_dict_json(&again).unwrap();
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config(128))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            check(&v)?;
        }
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value(KEYS, 3)) {
        check(&v)?;
    }
}

proptest! {
    #![proptest_config(proptest_config(256))]

    #[test]
    fn mutated_state_dicts_never_panic(v in mutated_json(scaler(true).state_dict_json(), KEYS)) {
        check(&v)?;
    }
}

#[test]
fn non_finite_scales_round_trip() {
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut s = scaler(true);
        s.update_with(NewScale::Value(v)).unwrap();
        let j = s.state_dict_json();
        assert!(!j.to_string().contains("null"), "{j}");
        let mut t = scaler(false);
        t.load_state_dict_json(&j).unwrap();
        let got = t.get_scale();
        assert!(got == v || (got.is_nan() && v.is_nan()), "{got}");
        // Through text too, as a file would carry it.
        let back: ScalerStateDict = serde_json::from_str(&j.to_string()).unwrap();
        assert_eq!(back.to_json(), j);
    }
}

#[test]
fn bad_state_dicts_get_typed_errors() {
    let good = scaler(true).state_dict_json();
    let mut s = scaler(true);
    let before = s.state_dict_json();
    let with = |k: &str, v: Value| {
        let mut d = good.clone();
        d[k] = v;
        d
    };
    let cases = [
        (
            json!([1, 2]),
            ScalerError::BadStateDict(StateDictProblem::NotAnObject),
        ),
        (json!({}), ScalerError::EmptyStateDict),
        (
            with("scale", json!(null)),
            ScalerError::BadStateDict(StateDictProblem::Entry {
                key: "scale",
                expected: "a number",
            }),
        ),
        (
            with("growth_interval", json!(2000.5)),
            ScalerError::BadStateDict(StateDictProblem::Entry {
                key: "growth_interval",
                expected: "an integer",
            }),
        ),
        (
            {
                let mut d = good.clone();
                d.as_object_mut().unwrap().remove("_growth_tracker");
                d
            },
            ScalerError::BadStateDict(StateDictProblem::Entry {
                key: "_growth_tracker",
                expected: "an integer",
            }),
        ),
        (
            with("_growth_tracker", json!(1i64 << 31)),
            ScalerError::BadStateDict(StateDictProblem::Entry {
                key: "_growth_tracker",
                expected: "an integer within int32's range",
            }),
        ),
    ];
    for (v, want) in cases {
        let e = s.load_state_dict_json(&v).unwrap_err();
        assert_eq!(e, want);
        assert_eq!(s.state_dict_json(), before);
    }
    assert_eq!(
        ScalerError::BadStateDict(StateDictProblem::Entry {
            key: "scale",
            expected: "a number"
        })
        .to_string(),
        "GradScaler state dict: `scale` must be a number"
    );
    // Extra keys are ignored, as PyTorch ignores them.
    s.load_state_dict_json(&with("extra", json!("x"))).unwrap();
}
