//! The scaler keeps per-optimizer state by the optimizer's identity, not by where the
//! optimizer value happens to lie in memory: an optimizer that moves between
//! `unscale_` and `step` (popped from a `Vec`, a `Vec` that reallocates) is unscaled
//! once, and a new optimizer that lands where an old one was starts fresh.

use amp_autograd::Tensor;
use amp_optim::{Optimizer, Sgd, SgdOptions};
use amp_scaler::{GradScaler, GradScalerOptions, Stage, StepOutcome};

const SCALE: f64 = 1024.0;

fn param(v: f32) -> Tensor {
    Tensor::parameter(amp_tensor::Tensor::from_slice(&[v], [1]).unwrap()).unwrap()
}

/// A scaler that has scaled once (so it has a scale), and an SGD optimizer (lr 1) of
/// one parameter at 10 whose gradient is `2 * SCALE`, as `scale(loss).backward()`
/// would leave a true gradient of 2.
fn setup() -> (GradScaler, Sgd, Tensor) {
    let mut scaler =
        GradScaler::with_options(GradScalerOptions::default().init_scale(SCALE)).unwrap();
    scaler.scale(&Tensor::scalar(1.0f32)).unwrap();
    let (opt, p) = optimizer();
    (scaler, opt, p)
}

fn optimizer() -> (Sgd, Tensor) {
    let p = param(10.0);
    p.set_grad(Some(
        Tensor::from_slice(&[(2.0 * SCALE) as f32], [1]).unwrap(),
    ))
    .unwrap();
    let opt = Sgd::new(vec![p.clone()], 1.0, SgdOptions::default()).unwrap();
    (opt, p)
}

/// [`setup`] with a second optimizer: the scaler, both optimizers in a `Vec` (the one
/// of [`setup`] first) and their parameters.
fn setup_two() -> (GradScaler, Vec<Sgd>, [Tensor; 2]) {
    let (scaler, a, pa) = setup();
    let (b, pb) = optimizer();
    (scaler, vec![a, b], [pa, pb])
}

fn value(p: &Tensor) -> f32 {
    p.to_vec::<f32>().unwrap()[0]
}

fn address<T>(v: &T) -> usize {
    v as *const T as usize
}

#[test]
fn optimizer_moved_out_of_a_vec_is_unscaled_once() {
    let (mut scaler, mut opts, [_, p]) = setup_two();
    // The second optimizer, the last in the `Vec`, is the one unscaled and moved.
    scaler.unscale_(&mut opts[1]);
    let before = address(&opts[1]);
    let mut opt = opts.pop().unwrap();
    assert_ne!(before, address(&opt), "the optimizer did not move");
    assert_eq!(scaler.stage(&opt), Stage::Unscaled);
    assert_eq!(scaler.step(&mut opt).unwrap(), StepOutcome::Stepped);
    // gradient 2 (unscaled once), lr 1: 10 - 2. Unscaled twice it would be 10 - 2/1024.
    assert_eq!(value(&p), 8.0);
    assert_eq!(scaler.stage(&opt), Stage::Stepped);
    scaler.update().unwrap();
}

#[test]
fn optimizer_in_a_reallocated_vec_is_unscaled_once() {
    let (mut scaler, opt, p) = setup();
    let mut opts = Vec::with_capacity(1);
    opts.push(opt);
    scaler.unscale_(&mut opts[0]);
    let before = address(&opts[0]);
    let mut grown = 0;
    while address(&opts[0]) == before {
        // Pushing past the capacity moves the buffer; loop in case the allocator
        // grows it in place.
        opts.push(optimizer().0);
        opts.shrink_to_fit();
        grown += 1;
        assert!(grown < 64, "the vector never moved");
    }
    assert_eq!(scaler.stage(&opts[0]), Stage::Unscaled);
    assert_eq!(scaler.step(&mut opts[0]).unwrap(), StepOutcome::Stepped);
    assert_eq!(value(&p), 8.0);
    scaler.update().unwrap();
}

#[test]
fn a_new_optimizer_at_an_old_address_starts_fresh() {
    let (mut scaler, opt, _) = setup();
    let mut slot = opt;
    scaler.unscale_(&mut slot);
    let before = address(&slot);
    let (fresh, q) = optimizer();
    slot = fresh; // the old optimizer is dropped; the new one lies where it lay
    assert_eq!(before, address(&slot));
    assert_eq!(scaler.stage(&slot), Stage::Ready);
    scaler.try_unscale_(&mut slot).unwrap();
    assert_eq!(scaler.step(&mut slot).unwrap(), StepOutcome::Stepped);
    assert_eq!(value(&q), 8.0);
    scaler.update().unwrap();
}

#[test]
fn two_optimizers_keep_separate_stages() {
    let (mut scaler, mut opts, [pa, pb]) = setup_two();
    scaler.unscale_(&mut opts[0]);
    assert_eq!(scaler.stage(&opts[0]), Stage::Unscaled);
    assert_eq!(scaler.stage(&opts[1]), Stage::Ready);
    let mut b = opts.pop().unwrap();
    let mut a = opts.pop().unwrap();
    scaler.step(&mut b).unwrap();
    scaler.step(&mut a).unwrap();
    assert_eq!((value(&pa), value(&pb)), (8.0, 8.0));
    scaler.update().unwrap();
    assert_eq!(scaler.stage(&a), Stage::Ready);
}

#[test]
fn identity_survives_boxing_and_differs_between_optimizers() {
    let (mut scaler, opt, p) = setup();
    let (other, _) = optimizer();
    assert_ne!(opt.id(), other.id());
    let id = opt.id();
    let mut opt = opt;
    scaler.unscale_(&mut opt);
    let mut boxed: Box<dyn Optimizer> = Box::new(opt);
    assert_eq!(boxed.id(), id);
    assert_eq!(scaler.stage(boxed.as_ref()), Stage::Unscaled);
    assert_eq!(scaler.stage(&other), Stage::Ready);
    assert_eq!(scaler.step(boxed.as_mut()).unwrap(), StepOutcome::Stepped);
    assert_eq!(value(&p), 8.0);
}
