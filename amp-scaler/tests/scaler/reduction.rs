//! `with_found_inf_reduction`: the inf check is combined with the other processes'
//! before the skip decision, on both step paths (unscale then step; Adam's fused step),
//! and a failing reduction is an error that keeps its type.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use amp_autograd::{ops, Tensor};
use amp_optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use amp_scaler::{FoundInfReduction, GradScaler, GradScalerOptions, ScalerError, StepOutcome};
use amp_tensor::{SharedError, Tensor as Raw};

/// The other processes' flag, MAX-combined with ours; counts its calls.
#[derive(Debug, Default)]
struct Others {
    found_inf: f32,
    calls: AtomicUsize,
}

impl FoundInfReduction for Others {
    fn all_reduce_max(&self, found_inf: &Raw) -> Result<(), SharedError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        assert_eq!(found_inf.dims(), [1]);
        let mine = found_inf.item_f64().expect("one element") as f32;
        found_inf
            .fill_(mine.max(self.found_inf))
            .map_err(SharedError::new)
    }
}

fn setup(opt: fn(Vec<Tensor>) -> Box<dyn Optimizer>) -> (Tensor, Box<dyn Optimizer>) {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    w.requires_grad_(true).unwrap();
    let o = opt(vec![w.clone()]);
    (w, o)
}

fn sgd(p: Vec<Tensor>) -> Box<dyn Optimizer> {
    Box::new(Sgd::new(p, 0.5, SgdOptions::default()).unwrap())
}

fn adam(p: Vec<Tensor>) -> Box<dyn Optimizer> {
    Box::new(Adam::new(p, 0.1, AdamOptions::default()).unwrap())
}

/// One scaled step on finite gradients.
fn step(scaler: &mut GradScaler, w: &Tensor, opt: &mut dyn Optimizer) -> StepOutcome {
    w.zero_grad();
    let l = ops::sum_all(&ops::square(w).unwrap()).unwrap();
    scaler.scale(&l).unwrap().backward().unwrap();
    let out = scaler.step(opt).unwrap();
    scaler.update().unwrap();
    out
}

#[test]
fn another_process_inf_makes_this_one_skip_and_back_off() {
    for make in [sgd as fn(_) -> _, adam] {
        let (w, mut opt) = setup(make);
        let others = Arc::new(Others {
            found_inf: 1.0,
            ..Default::default()
        });
        let opts = GradScalerOptions::default().init_scale(64.0);
        let mut scaler = GradScaler::with_options(opts)
            .unwrap()
            .with_found_inf_reduction(others.clone());
        assert_eq!(step(&mut scaler, &w, &mut *opt), StepOutcome::Skipped);
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert_eq!(scaler.get_scale(), 32.0);
        assert_eq!(scaler.get_growth_tracker(), 0);
        assert_eq!(others.calls.load(Ordering::Relaxed), 1);
    }
}

#[test]
fn all_finite_everywhere_steps_as_without_a_reduction() {
    let others = Arc::new(Others::default());
    let (w, mut opt) = setup(sgd);
    let mut scaler = GradScaler::new().with_found_inf_reduction(others.clone());
    w.zero_grad();
    let l = ops::sum_all(&ops::square(&w).unwrap()).unwrap();
    scaler.scale(&l).unwrap().backward().unwrap();
    scaler.unscale_(&mut *opt); // the reduction runs here, once
    assert_eq!(scaler.step(&mut *opt).unwrap(), StepOutcome::Stepped);
    scaler.update().unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    assert_eq!(scaler.get_growth_tracker(), 1);
    assert_eq!(others.calls.load(Ordering::Relaxed), 1);
}

#[derive(Debug, thiserror::Error)]
#[error("peer 1 is gone")]
struct PeerGone;

#[derive(Debug)]
struct Failing;

impl FoundInfReduction for Failing {
    fn all_reduce_max(&self, _: &Raw) -> Result<(), SharedError> {
        Err(SharedError::new(PeerGone))
    }
}

#[test]
fn a_failed_reduction_is_an_error_of_its_own_type() {
    let (w, mut opt) = setup(sgd);
    let mut scaler = GradScaler::new().with_found_inf_reduction(Arc::new(Failing));
    let l = ops::sum_all(&ops::square(&w).unwrap()).unwrap();
    scaler.scale(&l).unwrap().backward().unwrap();
    let e = scaler.step(&mut *opt).unwrap_err();
    assert_eq!(
        e.to_string(),
        "combining found_inf across processes failed: peer 1 is gone"
    );
    let ScalerError::FoundInfReduction(inner) = &e else {
        panic!("{e:?}")
    };
    assert!(inner.downcast_ref::<PeerGone>().is_some());
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}
