//! The train suite: a small MLP trained a few steps with autocast + GradScaler, on the
//! workspace's training pieces: `amp::nn` layers (`Linear::from_parts` over the case's
//! weights, activation modules), `amp::autograd::ops::mse_loss`, `amp::autocast` for the
//! forward pass, `amp::scaler::GradScaler`, `amp::optim::Sgd` and `clip_grad_norm_`.
//!
//! The loop is the one of `train.json`'s notes (and `torch_runner.py`):
//! for each micro-batch `i`, `loss = mse_loss(model(input), target)` (inside autocast when
//! the case has it), record `loss` (unscaled, undivided), backward
//! `scaler.scale(loss / accumulate)`; every `accumulate` micro-batches: fill the grads named
//! by `inject_inf` for this step with `+inf` (parameters in flat order: each linear layer's
//! weight, then its bias), `unscale_` + `clip_grad_norm_` when the case clips, then
//! `scaler.step(sgd)` (skipped: no parameter changed), `scaler.update()`, record the scale,
//! `zero_grad`. Losses and final parameters are compared with the case's tolerance, scales
//! and skips exactly.

use std::fmt::Display;

use amp::autocast::Autocast;
use amp::autograd::{ops, Reduction, Tensor};
use amp::nn::{Linear, Module, ReLU, Sequential, Sigmoid, Tanh, GELU};
use amp::optim::{clip_grad_norm_, Optimizer, Sgd, SgdOptions};
use amp::scaler::GradScaler;

use super::Outcome;
use crate::compare::{compare, element_matches};
use crate::value::format_float;
use crate::vectors::{Layer, TrainCase};

/// Runs `case`.
pub fn run(case: &TrainCase) -> Outcome {
    Outcome::from_result(check(case))
}

fn ctx<E: Display>(what: impl Display) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The model of `case` and its parameters in flat order.
fn build(case: &TrainCase) -> Result<(Sequential, Vec<Tensor>), String> {
    let mut model = Sequential::new();
    let mut params = Vec::new();
    for (i, layer) in case.model.iter().enumerate() {
        model = match layer {
            Layer::Linear { weight, bias } => {
                let w = Tensor::parameter(weight.to_tensor()).map_err(ctx(format!("layer {i}")))?;
                let b = Tensor::parameter(bias.to_tensor()).map_err(ctx(format!("layer {i}")))?;
                params.push(w.clone());
                params.push(b.clone());
                model.add(Linear::from_parts(w, Some(b)))
            }
            Layer::Relu => model.add(ReLU),
            Layer::Tanh => model.add(Tanh),
            Layer::Gelu => model.add(GELU),
            Layer::Sigmoid => model.add(Sigmoid),
        };
    }
    Ok((model, params))
}

fn check(case: &TrainCase) -> Result<(), String> {
    if case.loss != "mse_loss" {
        return Err(format!("loss `{}` is not supported", case.loss));
    }
    if case.optimizer.kind != "sgd" {
        return Err(format!(
            "optimizer `{}` is not supported",
            case.optimizer.kind
        ));
    }
    if case.accumulate == 0 {
        return Err("bad vector: accumulate is 0".into());
    }
    let (model, params) = build(case)?;
    let sgd = SgdOptions {
        momentum: case.optimizer.momentum,
        ..SgdOptions::default()
    };
    let mut opt = Sgd::new(params.clone(), case.optimizer.lr, sgd).map_err(ctx("optimizer"))?;
    let mut scaler =
        GradScaler::with_options(super::scaler::options(&case.scaler)).map_err(ctx("scaler"))?;
    let acc = case.accumulate;

    let (mut losses, mut scales, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    let mut step = 0;
    for (i, batch) in case.batches.iter().enumerate() {
        let x = Tensor::from_raw(batch.input.to_tensor());
        let y = Tensor::from_raw(batch.target.to_tensor());
        let forward = || -> amp::autograd::Result<Tensor> {
            ops::mse_loss(&model.forward(&x)?, &y, Reduction::Mean)
        };
        let loss = match case.autocast {
            Some(ac) => {
                let _region = Autocast::new(ac.device)
                    .dtype(ac.dtype)
                    .enter()
                    .map_err(ctx(format!("batch {i}: autocast")))?;
                forward()
            }
            None => forward(),
        }
        .map_err(ctx(format!("batch {i}: forward")))?;
        losses.push(loss.item_f64().map_err(ctx(format!("batch {i}: loss")))?);
        let divided = ops::div_scalar(&loss, acc as i64)
            .map_err(ctx(format!("batch {i}: loss / accumulate")))?;
        scaler
            .scale(&divided)
            .map_err(ctx(format!("batch {i}: scale")))?
            .backward()
            .map_err(ctx(format!("batch {i}: backward")))?;
        if (i + 1) % acc != 0 {
            continue;
        }

        let at = format!("step {step}");
        for inj in case.inject_inf.iter().filter(|inj| inj.step == step) {
            let p = params.get(inj.param).ok_or_else(|| {
                format!(
                    "bad vector: inject_inf names parameter {} of {}",
                    inj.param,
                    params.len()
                )
            })?;
            let g = p.grad().ok_or_else(|| {
                format!(
                    "{at}: parameter {} has no grad to inject inf into",
                    inj.param
                )
            })?;
            g.data()
                .fill_(f64::INFINITY)
                .map_err(ctx(format!("{at}: inject inf")))?;
        }
        if let Some(max_norm) = case.clip_grad_norm {
            scaler
                .try_unscale_(&mut opt)
                .map_err(ctx(format!("{at}: unscale_")))?;
            clip_grad_norm_(&params, max_norm, Default::default())
                .map_err(ctx(format!("{at}: clip_grad_norm_")))?;
        }
        let before: Vec<_> = params.iter().map(|p| p.data().copy()).collect();
        let outcome = scaler.step(&mut opt).map_err(ctx(format!("{at}: step")))?;
        // As torch_runner.py: a step is skipped when no parameter changed.
        let unchanged = params
            .iter()
            .zip(&before)
            .all(|(p, b)| compare("", &p.data().contiguous(), b, None).is_ok());
        if outcome.is_skipped() != unchanged {
            return Err(format!(
                "{at}: step returned {outcome:?}, but the parameters {}",
                if unchanged {
                    "did not change"
                } else {
                    "changed"
                }
            ));
        }
        skipped.push(unchanged);
        scaler.update().map_err(ctx(format!("{at}: update")))?;
        scales.push(scaler.get_scale());
        opt.zero_grad();
        step += 1;
    }

    let e = &case.expect;
    let tol = e.tol.tolerance();
    if losses.len() != e.losses.len() {
        return Err(format!(
            "losses: {} recorded, expected {}",
            losses.len(),
            e.losses.len()
        ));
    }
    for (i, (&got, &want)) in losses.iter().zip(&e.losses).enumerate() {
        if !element_matches(got, want, tol) {
            return Err(format!(
                "loss {i}: got {}, expected {}{}",
                format_float(got),
                format_float(want),
                tol.map_or(" (exact)".to_owned(), |t| format!(
                    " (rtol {}, atol {})",
                    t.rtol, t.atol
                ))
            ));
        }
    }
    if scales != e.scales {
        return Err(format!("scales: got {scales:?}, expected {:?}", e.scales));
    }
    if skipped != e.skipped {
        return Err(format!(
            "skipped: got {skipped:?}, expected {:?}",
            e.skipped
        ));
    }
    if params.len() != e.final_params.len() {
        return Err(format!(
            "final_params: {} parameters, expected {}",
            params.len(),
            e.final_params.len()
        ));
    }
    for (i, (p, w)) in params.iter().zip(&e.final_params).enumerate() {
        compare(
            &format!("final_params[{i}]"),
            &p.data().contiguous(),
            &w.to_tensor(),
            tol,
        )
        .map_err(|m| m.to_string())?;
    }
    Ok(())
}
