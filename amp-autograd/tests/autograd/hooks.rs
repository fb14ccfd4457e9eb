//! `register_post_accumulate_grad_hook`: a leaf's hooks run once per backward, after its
//! last contribution was accumulated, in the order backward finishes the leaves; not for
//! `grad()`; a removed hook stays silent; a hook's error stops the backward.

use std::sync::{Arc, Mutex};

use amp_autograd::{grad, ops, Error, GradOptions, Tensor};

fn leaf(v: &[f64]) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), [v.len()]).unwrap();
    t.requires_grad_(true).unwrap();
    t
}

type Log = Arc<Mutex<Vec<(&'static str, Vec<f64>)>>>;

/// Register a hook on `t` that logs `name` and the `.grad` it sees.
fn log_hook(t: &Tensor, name: &'static str, log: &Log) -> amp_autograd::HookHandle {
    let log = log.clone();
    t.register_post_accumulate_grad_hook(move |p| {
        let g = p.grad().expect("accumulated before the hook").to_vec_f64();
        log.lock().unwrap().push((name, g));
        Ok(())
    })
    .unwrap()
}

#[test]
fn runs_once_after_every_contribution_with_the_final_grad() {
    let w = leaf(&[2.0, 3.0]);
    let log = Log::default();
    log_hook(&w, "w", &log);
    // w reaches the loss through three paths: d/dw (w*w + 3w) = 2w + 3.
    let y = ops::add(&ops::mul(&w, &w).unwrap(), &w.mul_scalar(3.0).unwrap()).unwrap();
    ops::sum_all(&y).unwrap().backward().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![("w", vec![7.0, 9.0])]);
    // A second backward accumulates, and the hook sees the sum.
    ops::sum_all(&w).unwrap().backward().unwrap();
    assert_eq!(log.lock().unwrap()[1], ("w", vec![8.0, 10.0]));
}

#[test]
fn leaves_finish_in_backward_order() {
    // x -> (*w1) -> (*w2) -> sum: w2's gradient is ready before w1's.
    let x = Tensor::from_vec(vec![1.0f64, 2.0], [2]).unwrap();
    let (w1, w2) = (leaf(&[3.0, 4.0]), leaf(&[5.0, 6.0]));
    let log = Log::default();
    log_hook(&w1, "w1", &log);
    log_hook(&w2, "w2", &log);
    let h = ops::mul(&x, &w1).unwrap();
    ops::sum_all(&ops::mul(&h, &w2).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let names: Vec<_> = log.lock().unwrap().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["w2", "w1"]);
    assert_eq!(log.lock().unwrap()[1].1, vec![5.0, 12.0]);
}

#[test]
fn a_root_leaf_and_an_unreached_leaf() {
    let (w, unused) = (leaf(&[1.0]), leaf(&[1.0]));
    let log = Log::default();
    log_hook(&w, "w", &log);
    log_hook(&unused, "unused", &log);
    w.backward().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![("w", vec![1.0])]);
}

#[test]
fn grad_does_not_run_hooks_and_removed_hooks_stay_silent() {
    let w = leaf(&[2.0]);
    let log = Log::default();
    let handle = log_hook(&w, "w", &log);
    let y = ops::sum_all(&ops::mul(&w, &w).unwrap()).unwrap();
    let g = grad(&[y], std::slice::from_ref(&w), &[], GradOptions::default()).unwrap();
    assert_eq!(g[0].as_ref().unwrap().to_vec_f64(), vec![4.0]);
    assert!(log.lock().unwrap().is_empty());
    handle.remove();
    ops::sum_all(&w).unwrap().backward().unwrap();
    assert!(log.lock().unwrap().is_empty());
    assert_eq!(w.grad().unwrap().to_vec_f64(), vec![1.0]);
}

#[derive(Debug, thiserror::Error)]
#[error("peer gone")]
struct PeerGone;

#[test]
fn a_hook_error_stops_backward_and_keeps_its_type() {
    let w = leaf(&[2.0]);
    w.register_post_accumulate_grad_hook(|_| {
        Err(Error::Hook(amp_tensor::SharedError::new(PeerGone)))
    })
    .unwrap();
    let e = ops::sum_all(&w).unwrap().backward().unwrap_err();
    let Error::Hook(inner) = &e else {
        panic!("{e:?}")
    };
    assert!(inner.downcast_ref::<PeerGone>().is_some());
}

#[test]
fn refused_on_non_leaves_and_on_tensors_without_grad() {
    let w = leaf(&[2.0]);
    let y = ops::mul(&w, &w).unwrap();
    let e = y
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .unwrap_err();
    assert!(e.to_string().contains("non-leaf"), "{e}");
    let c = Tensor::from_vec(vec![1.0f64], [1]).unwrap();
    let e = c
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .unwrap_err();
    assert!(e.to_string().contains("doesn't require gradient"), "{e}");
}
