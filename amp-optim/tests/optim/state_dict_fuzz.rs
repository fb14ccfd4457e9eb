//! Optimizer state dicts are outside data (files, checkpoints): whatever bytes or JSON
//! arrive, loading never panics; it either fails and changes nothing, or succeeds and
//! leaves an optimizer that steps. Also: the state dict round-trips NaN and infinities,
//! and the typed errors of the checks.

use amp_autograd::Tensor;
use amp_optim::{
    Adam, AdamOptions, Error, Optimizer, OptimizerStateDict, Sgd, SgdOptions, StateProblem,
    TensorData,
};
use amp_testing::json::{json_value, mutated_json};
use amp_testing::proptest_config;
use proptest::prelude::*;
use serde_json::{json, Value};

/// The names the loaders look for, so that arbitrary documents often reach them.
const KEYS: &[&str] = &[
    "state",
    "param_groups",
    "params",
    "lr",
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "maximize",
    "betas",
    "eps",
    "amsgrad",
    "decoupled_weight_decay",
    "step",
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
    "momentum_buffer",
    "dtype",
    "shape",
    "data",
    "0",
    "1",
    "2",
];

fn params() -> Vec<Tensor> {
    let a = Tensor::parameter(
        amp_tensor::Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75], [2, 3]).unwrap(),
    )
    .unwrap();
    let b = Tensor::parameter(amp_tensor::Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3]).unwrap())
        .unwrap();
    vec![a, b]
}

fn grads(opt: &dyn Optimizer) {
    for p in opt.params() {
        let g = amp_tensor::Tensor::ones(p.dims(), p.dtype());
        p.set_grad(Some(Tensor::from_raw(g))).unwrap();
    }
}

fn sgd() -> Sgd {
    let o = SgdOptions {
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 0.01,
        ..SgdOptions::default()
    };
    let mut opt = Sgd::new(params(), 0.1, o).unwrap();
    grads(&opt);
    opt.step().unwrap();
    opt
}

fn adam(amsgrad: bool) -> Adam {
    let o = AdamOptions {
        amsgrad,
        ..AdamOptions::adamw()
    };
    let mut opt = Adam::new(params(), 1e-3, o).unwrap();
    grads(&opt);
    opt.step().unwrap();
    opt
}

fn doc(opt: &dyn Optimizer) -> Value {
    serde_json::to_value(opt.state_dict()).unwrap()
}

fn text(opt: &dyn Optimizer) -> String {
    serde_json::to_string(&opt.state_dict()).unwrap()
}

/// Load `sd` into `opt`: a failure changes nothing and is what `validate_state_dict`
/// predicted; a success leaves an optimizer that steps and whose state dict loads back.
fn check_load(opt: &mut dyn Optimizer, sd: &OptimizerStateDict) -> Result<(), TestCaseError> {
    let before = text(opt);
    let predicted = opt.validate_state_dict(sd);
    match opt.load_state_dict(sd) {
        Err(e) => {
            prop_assert_eq!(predicted.err(), Some(e));
            prop_assert_eq!(text(opt), before);
        }
        Ok(()) => {
            prop_assert!(predicted.is_ok());
            grads(opt);
            opt.step().unwrap();
            let again: OptimizerStateDict = serde_json::from_str(&text(opt)).unwrap();
            opt.load_state_dict(&again).unwrap();
        }
    }
    Ok(())
}

/// Parse `v` as a state dict (never panicking) and, if it parses, load it into each
/// kind of optimizer.
fn check_all(v: Value) -> Result<(), TestCaseError> {
    let Ok(sd) = serde_json::from_value::<OptimizerStateDict>(v) else {
        return Ok(());
    };
    check_load(&mut sgd(), &sd)?;
    check_load(&mut adam(false), &sd)?;
    check_load(&mut adam(true), &sd)
}

proptest! {
    #![proptest_config(proptest_config(128))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(sd) = serde_json::from_slice::<OptimizerStateDict>(&bytes) {
            check_load(&mut sgd(), &sd)?;
            check_load(&mut adam(true), &sd)?;
        }
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value(KEYS, 4)) {
        check_all(v)?;
    }

    #[test]
    fn arbitrary_tensor_data_is_refused_or_exact(
        dtype in prop_oneof![
            proptest::sample::select(&["float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"][..])
                .prop_map(str::to_owned),
            ".{0,8}",
        ],
        shape in proptest::collection::vec(
            prop_oneof![0usize..4, Just(usize::MAX), Just(1usize << 62), any::<usize>()],
            0..4,
        ),
        data in proptest::collection::vec(any::<f64>(), 0..12),
    ) {
        let t = TensorData { dtype, shape, data };
        if let Ok(raw) = t.to_raw() {
            prop_assert_eq!(raw.dims(), &t.shape[..]);
            prop_assert_eq!(raw.elem_count(), t.data.len());
        }
    }
}

proptest! {
    #![proptest_config(proptest_config(256))]

    #[test]
    fn mutated_sgd_state_dicts_never_panic(v in mutated_json(doc(&sgd()), KEYS)) {
        check_all(v)?;
    }

    #[test]
    fn mutated_adam_state_dicts_never_panic(v in mutated_json(doc(&adam(true)), KEYS)) {
        check_all(v)?;
    }
}

#[test]
fn state_dicts_round_trip_nan_and_infinities() {
    let mut opt = adam(false);
    let p = opt.params()[0].clone();
    let nan =
        amp_tensor::Tensor::from_vec(vec![f32::NAN, f32::INFINITY, 1.0, 0.0, -1.0, 2.0], [2, 3]);
    p.set_grad(Some(Tensor::from_raw(nan.unwrap()))).unwrap();
    opt.step().unwrap();
    opt.set_learning_rate(f64::INFINITY);
    let text = text(&opt);
    assert!(
        text.contains("\"NaN\"") && text.contains("\"Infinity\""),
        "{text}"
    );
    assert!(!text.contains("null"), "{text}");
    let sd: OptimizerStateDict = serde_json::from_str(&text).unwrap();
    let mut other = adam(false);
    other.load_state_dict(&sd).unwrap();
    assert_eq!(serde_json::to_string(&other.state_dict()).unwrap(), text);
}

#[test]
fn each_refusal_is_typed_and_changes_nothing() {
    let base = doc(&adam(true));
    let cases: Vec<(Value, Error)> = vec![
        (
            json!({"state": {}, "param_groups": []}),
            Error::GroupCountMismatch,
        ),
        (
            {
                let mut d = base.clone();
                d["param_groups"][0]["params"] = json!([0]);
                d
            },
            Error::GroupSizeMismatch,
        ),
        (
            {
                let mut d = base.clone();
                d["param_groups"][0]["params"] = json!([0, 0]);
                d
            },
            Error::GroupEntry {
                group: 0,
                key: "params",
                expected: "a list of distinct non-negative integer indices",
            },
        ),
        (
            {
                let mut d = base.clone();
                d["param_groups"][0]["lr"] = json!(null);
                d
            },
            Error::GroupEntry {
                group: 0,
                key: "lr",
                expected: "a number",
            },
        ),
        (
            {
                let mut d = base.clone();
                d["param_groups"][0]["lr"] = json!(-1.0);
                d
            },
            Error::InvalidLearningRate(-1.0),
        ),
        (
            {
                let mut d = base.clone();
                d["param_groups"][0]["betas"] = json!([0.9, 1.0]);
                d
            },
            Error::InvalidBeta {
                index: 1,
                value: 1.0,
            },
        ),
        (
            {
                let mut d = base.clone();
                d["state"]["7"] = d["state"]["0"].clone();
                d
            },
            Error::UnknownStateIndex(7),
        ),
        (
            {
                let mut d = base.clone();
                d["state"]["0"]["exp_avg"]["shape"] = json!([3, 2]);
                d
            },
            Error::StateEntry {
                index: 0,
                key: "exp_avg".into(),
                problem: StateProblem::Shape {
                    found: vec![3, 2],
                    expected: vec![2, 3],
                },
            },
        ),
        (
            {
                let mut d = base.clone();
                d["state"]["1"]["exp_avg_sq"]["data"] = json!([1.0]);
                d
            },
            Error::StateEntry {
                index: 1,
                key: "exp_avg_sq".into(),
                problem: StateProblem::DataLength {
                    shape: vec![3],
                    expected: 3,
                    found: 1,
                },
            },
        ),
        (
            {
                let mut d = base.clone();
                d["state"]["1"]["exp_avg"]["dtype"] = json!("complex64");
                d
            },
            Error::StateEntry {
                index: 1,
                key: "exp_avg".into(),
                problem: StateProblem::UnknownDtype("complex64".into()),
            },
        ),
        (
            {
                let mut d = base.clone();
                d["state"]["0"]
                    .as_object_mut()
                    .unwrap()
                    .remove("max_exp_avg_sq");
                d
            },
            Error::StateEntry {
                index: 0,
                key: "max_exp_avg_sq".into(),
                problem: StateProblem::Missing,
            },
        ),
        (
            {
                let mut d = base.clone();
                d["state"]["0"]["step"] = json!("NaN");
                d
            },
            Error::StateEntry {
                index: 0,
                key: "step".into(),
                problem: StateProblem::Expected("a finite number >= 0"),
            },
        ),
    ];
    for (v, want) in cases {
        let sd: OptimizerStateDict = serde_json::from_value(v).unwrap();
        let mut opt = adam(true);
        let before = text(&opt);
        let e = opt.load_state_dict(&sd).unwrap_err();
        assert_eq!(e, want, "{e}");
        assert_eq!(text(&opt), before, "{e}");
    }
    let e = Error::StateEntry {
        index: 0,
        key: "exp_avg".into(),
        problem: StateProblem::Shape {
            found: vec![3, 2],
            expected: vec![2, 3],
        },
    };
    assert_eq!(
        e.to_string(),
        "loaded state dict: state[0][\"exp_avg\"] shape [3, 2] differs from the parameter's [2, 3]"
    );
    assert_eq!(
        Error::GroupSizeMismatch.to_string(),
        "loaded state dict contains a parameter group that doesn't match the size of optimizer's group"
    );
}
