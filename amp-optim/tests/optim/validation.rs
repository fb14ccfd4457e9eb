//! Constructor misuse gets PyTorch's `ValueError` texts (torch/optim/optimizer.py,
//! sgd.py, adam.py, adamw.py), with values written as Python writes them; NaN is
//! refused wherever a range is checked; clipping never panics on its argument.

use amp_autograd::{ops, Tensor};
use amp_optim::{adamw, clip_grad_value_, Adam, AdamOptions, Error, ParamGroup, Sgd, SgdOptions};

fn param(v: &[f32]) -> Tensor {
    Tensor::parameter(amp_tensor::Tensor::from_slice(v, [v.len()]).unwrap()).unwrap()
}

fn sgd_err(lr: f64, o: SgdOptions) -> String {
    Sgd::new(vec![param(&[1.0])], lr, o)
        .err()
        .expect("refused")
        .to_string()
}

fn adam_err(lr: f64, o: AdamOptions) -> String {
    Adam::new(vec![param(&[1.0])], lr, o)
        .err()
        .expect("refused")
        .to_string()
}

#[test]
fn empty_parameter_lists_are_refused() {
    let e = Sgd::new(vec![], 0.1, SgdOptions::default()).err().unwrap();
    assert_eq!(e, Error::EmptyParameterList);
    assert_eq!(e.to_string(), "optimizer got an empty parameter list");
    let e = Adam::new(vec![], 0.1, AdamOptions::default())
        .err()
        .unwrap();
    assert_eq!(e, Error::EmptyParameterList);
    assert_eq!(adamw(vec![], 0.1).err(), Some(Error::EmptyParameterList));
    assert_eq!(
        Sgd::with_groups(vec![]).err(),
        Some(Error::EmptyParameterList)
    );
    assert_eq!(
        Adam::with_groups(vec![]).err(),
        Some(Error::EmptyParameterList)
    );
    // As PyTorch: the hyper-parameters are checked before the parameter list.
    assert_eq!(
        Sgd::new(vec![], -1.0, SgdOptions::default()).err(),
        Some(Error::InvalidLearningRate(-1.0))
    );
    // A group with no parameters is allowed, as `SGD([{"params": []}], lr=0.1)` is.
    assert!(Sgd::with_groups(vec![ParamGroup {
        params: vec![],
        lr: 0.1,
        options: SgdOptions::default(),
    }])
    .is_ok());
}

#[test]
fn learning_rates_negative_or_nan_are_refused() {
    for (lr, text) in [
        (-1.0, "Invalid learning rate: -1.0"),
        (-0.001, "Invalid learning rate: -0.001"),
        (-1e-5, "Invalid learning rate: -1e-05"),
        (f64::NAN, "Invalid learning rate: nan"),
        (f64::NEG_INFINITY, "Invalid learning rate: -inf"),
    ] {
        assert_eq!(sgd_err(lr, SgdOptions::default()), text);
        assert_eq!(adam_err(lr, AdamOptions::default()), text);
        assert_eq!(adam_err(lr, AdamOptions::adamw()), text);
    }
    assert!(Sgd::new(vec![param(&[1.0])], 0.0, SgdOptions::default()).is_ok());
}

#[test]
fn sgd_options_get_pytorchs_texts() {
    let o = SgdOptions::default();
    let with = |f: fn(&mut SgdOptions)| {
        let mut o = o;
        f(&mut o);
        o
    };
    type Set = fn(&mut SgdOptions);
    let cases: [(Set, &str); 5] = [
        (|o| o.momentum = -0.5, "Invalid momentum value: -0.5"),
        (|o| o.momentum = f64::NAN, "Invalid momentum value: nan"),
        (
            |o| o.weight_decay = -1.0,
            "Invalid weight_decay value: -1.0",
        ),
        (
            |o| o.weight_decay = f64::NAN,
            "Invalid weight_decay value: nan",
        ),
        (|o| o.dampening = f64::NAN, "Invalid dampening value: nan"),
    ];
    for (set, text) in cases {
        assert_eq!(sgd_err(0.1, with(set)), text);
    }
    let nesterov = "Nesterov momentum requires a momentum and zero dampening";
    assert_eq!(sgd_err(0.1, with(|o| o.nesterov = true)), nesterov);
    assert_eq!(
        sgd_err(
            0.1,
            with(|o| {
                o.nesterov = true;
                o.momentum = 0.9;
                o.dampening = 0.1;
            })
        ),
        nesterov
    );
    assert_eq!(
        Sgd::new(vec![param(&[1.0])], 0.1, with(|o| o.nesterov = true)).err(),
        Some(Error::NesterovRequiresMomentum)
    );
    // Allowed as in PyTorch: a negative dampening, momentum >= 1, nesterov done right.
    for o in [
        with(|o| o.dampening = -0.5),
        with(|o| o.momentum = 1.5),
        with(|o| {
            o.nesterov = true;
            o.momentum = 0.9;
        }),
    ] {
        assert!(Sgd::new(vec![param(&[1.0])], 0.1, o).is_ok(), "{o:?}");
    }
    // The first failing check is reported, in PyTorch's order.
    assert_eq!(
        sgd_err(
            -1.0,
            with(|o| {
                o.momentum = -1.0;
                o.weight_decay = -1.0;
            })
        ),
        "Invalid learning rate: -1.0"
    );
}

#[test]
fn adam_options_get_pytorchs_texts() {
    let with = |f: fn(&mut AdamOptions)| {
        let mut o = AdamOptions::default();
        f(&mut o);
        o
    };
    assert_eq!(
        adam_err(1e-3, with(|o| o.eps = -1e-8)),
        "Invalid epsilon value: -1e-08"
    );
    assert_eq!(
        adam_err(1e-3, with(|o| o.eps = f64::NAN)),
        "Invalid epsilon value: nan"
    );
    assert_eq!(
        adam_err(1e-3, with(|o| o.betas.0 = 1.0)),
        "Invalid beta parameter at index 0: 1.0"
    );
    assert_eq!(
        adam_err(1e-3, with(|o| o.betas.0 = -0.1)),
        "Invalid beta parameter at index 0: -0.1"
    );
    assert_eq!(
        adam_err(1e-3, with(|o| o.betas.1 = 1.5)),
        "Invalid beta parameter at index 1: 1.5"
    );
    assert_eq!(
        adam_err(1e-3, with(|o| o.betas.1 = f64::NAN)),
        "Invalid beta parameter at index 1: nan"
    );
    assert_eq!(
        Adam::new(vec![param(&[1.0])], 1e-3, with(|o| o.betas.1 = 1.0)).err(),
        Some(Error::InvalidBeta {
            index: 1,
            value: 1.0
        })
    );
    assert_eq!(
        adam_err(1e-3, with(|o| o.weight_decay = -0.01)),
        "Invalid weight_decay value: -0.01"
    );
    let mut w = AdamOptions::adamw();
    w.weight_decay = f64::NAN;
    assert_eq!(adam_err(1e-3, w), "Invalid weight_decay value: nan");
    // PyTorch's order: lr, eps, betas, weight_decay.
    assert_eq!(
        adam_err(
            1e-3,
            with(|o| {
                o.eps = -1.0;
                o.betas.0 = 2.0;
            })
        ),
        "Invalid epsilon value: -1.0"
    );
    assert!(Adam::new(vec![param(&[1.0])], 1e-3, with(|o| o.betas = (0.0, 0.0))).is_ok());
}

#[test]
fn groups_are_checked_each_and_across() {
    let p = param(&[1.0]);
    let group = |params: Vec<Tensor>, lr: f64| ParamGroup {
        params,
        lr,
        options: SgdOptions::default(),
    };
    let e = Sgd::with_groups(vec![
        group(vec![p.clone()], 0.1),
        group(vec![param(&[2.0])], -2.0),
    ])
    .err()
    .unwrap();
    assert_eq!(e.to_string(), "Invalid learning rate: -2.0");
    let e = Sgd::with_groups(vec![
        group(vec![p.clone()], 0.1),
        group(vec![p.clone()], 0.2),
    ])
    .err()
    .unwrap();
    assert_eq!(
        e.to_string(),
        "some parameters appear in more than one parameter group"
    );
    let e = Adam::with_groups(vec![
        ParamGroup {
            params: vec![p.clone()],
            lr: 0.1,
            options: AdamOptions::default(),
        },
        ParamGroup {
            params: vec![p.clone()],
            lr: 0.1,
            options: AdamOptions::default(),
        },
    ])
    .err()
    .unwrap();
    assert_eq!(e, Error::DuplicateParameter);
}

#[test]
fn non_leaf_parameters_are_refused() {
    let p = param(&[1.0, 2.0]);
    let y = ops::mul(&p, &p).unwrap();
    assert!(!y.is_leaf());
    let e = Sgd::new(vec![y.clone()], 0.1, SgdOptions::default())
        .err()
        .unwrap();
    assert_eq!(e.to_string(), "can't optimize a non-leaf Tensor");
    assert_eq!(
        Adam::new(vec![y], 0.1, AdamOptions::default()).err(),
        Some(Error::NonLeafParameter)
    );
}

#[test]
fn clip_grad_value_never_panics_on_its_argument() {
    let p = param(&[0.0, 0.0, 0.0]);
    let set = || {
        p.set_grad(Some(Tensor::from_slice(&[-3.0f32, 0.5, 4.0], [3]).unwrap()))
            .unwrap()
    };
    set();
    clip_grad_value_(std::slice::from_ref(&p), 1.0).unwrap();
    assert_eq!(
        p.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![-1.0, 0.5, 1.0]
    );
    // torch.clamp with min > max gives max everywhere.
    set();
    clip_grad_value_(std::slice::from_ref(&p), -1.0).unwrap();
    assert_eq!(p.grad().unwrap().to_vec::<f32>().unwrap(), vec![-1.0; 3]);
    set();
    clip_grad_value_(std::slice::from_ref(&p), f64::NAN).unwrap();
    assert!(p
        .grad()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|v| v.is_nan()));
}
