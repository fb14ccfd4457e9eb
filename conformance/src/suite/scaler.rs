//! The scaler suite: GradScaler programs run on `amp::scaler::GradScaler` with plain SGD
//! optimizers (`amp::optim::Sgd`, `p -= lr * grad`), as `torch_runner.py` runs them on
//! `torch.amp.GradScaler("cpu")`.
//!
//! Every action is checked as the format's table says (`scale` and `unscale_` exactly,
//! `step` params with rtol 1e-6, `update` scale and growth tracker exactly, `state_dict`
//! key by key in order, values with their JSON types). An action with `expect_error` must
//! fail with a message containing that text (`unscale_` runs as `try_unscale_`, the
//! `Result` form of the panicking `unscale_`, whose message is the same); the program ends
//! there. A case with `expect_init_error` checks the constructor's error.

use amp::autograd::Tensor;
use amp::optim::{Optimizer, Sgd, SgdOptions};
use amp::scaler::{GradScaler, GradScalerOptions, NewScale, Outputs};

use super::Outcome;
use crate::args::Output;
use crate::compare::{all_zero, compare, Tolerance};
use crate::value::{Number, TensorLit};
use crate::vectors::{ScalerAction, ScalerCase, ScalerInit};

/// The tolerance of `step`'s `expect_params`.
pub const STEP_RTOL: f64 = 1e-6;

/// Runs `case`.
pub fn run(case: &ScalerCase) -> Outcome {
    Outcome::from_result(check(case))
}

/// The GradScaler options of `init` (PyTorch's defaults for the absent ones).
pub fn options(init: &ScalerInit) -> GradScalerOptions {
    let mut o = GradScalerOptions::default();
    if let Some(v) = init.init_scale {
        o = o.init_scale(v);
    }
    if let Some(v) = init.growth_factor {
        o = o.growth_factor(v);
    }
    if let Some(v) = init.backoff_factor {
        o = o.backoff_factor(v);
    }
    if let Some(v) = init.growth_interval {
        o = o.growth_interval(v);
    }
    if let Some(v) = init.enabled {
        o = o.enabled(v);
    }
    o
}

/// Why an action did not go as expected.
enum Fail {
    /// The API returned an error (which an `expect_error` may expect).
    Api(String),
    /// A result differs from its expectation, or the vector is malformed.
    Mismatch(String),
}

fn api(e: impl std::fmt::Display) -> Fail {
    Fail::Api(e.to_string())
}

fn mismatch(m: impl std::fmt::Display) -> Fail {
    Fail::Mismatch(m.to_string())
}

fn leaf(lit: &TensorLit) -> Tensor {
    Tensor::from_raw(lit.to_tensor())
}

/// The case's optimizers: distinct `Sgd` objects (the scaler tells optimizers apart by
/// identity), and the parameters of each.
struct Optimizers {
    names: Vec<String>,
    params: Vec<Vec<Tensor>>,
    opts: Vec<Sgd>,
}

impl Optimizers {
    fn index(&self, name: &str) -> Result<usize, Fail> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| mismatch(format!("bad vector: no optimizer named `{name}`")))
    }
}

fn check(case: &ScalerCase) -> Result<(), String> {
    let made = GradScaler::with_options(options(&case.init));
    if let Some(want) = &case.expect_init_error {
        return match made {
            Err(e) if e.to_string().contains(want.as_str()) => Ok(()),
            Err(e) => Err(format!(
                "init: error `{e}`, expected one containing `{want}`"
            )),
            Ok(_) => Err(format!(
                "init: construction did not fail, expected an error containing `{want}`"
            )),
        };
    }
    let mut scaler = made.map_err(|e| format!("init: unexpected error: {e}"))?;

    let mut o = Optimizers {
        names: Vec::new(),
        params: Vec::new(),
        opts: Vec::new(),
    };
    for spec in &case.optimizers {
        let params = spec
            .params
            .iter()
            .map(|lit| {
                let p = leaf(lit);
                p.requires_grad_(true).map(|_| p.clone())
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("optimizer `{}`: {e}", spec.name))?;
        let sgd = Sgd::new(params.clone(), spec.lr, SgdOptions::default())
            .map_err(|e| format!("optimizer `{}`: {e}", spec.name))?;
        o.names.push(spec.name.clone());
        o.params.push(params);
        o.opts.push(sgd);
    }

    for (k, a) in case.actions.iter().enumerate() {
        let at = format!("action {k} ({})", a.name());
        match (act(&mut scaler, &mut o, a), a.expect_error()) {
            (Ok(()), None) => {}
            (Ok(()), Some(want)) => {
                return Err(format!("{at}: no error, expected one containing `{want}`"))
            }
            (Err(Fail::Api(e)), Some(want)) if e.contains(want) => return Ok(()),
            (Err(Fail::Api(e)), Some(want)) => {
                return Err(format!(
                    "{at}: error `{e}`, expected one containing `{want}`"
                ))
            }
            (Err(Fail::Api(e)), None) => return Err(format!("{at}: unexpected error: {e}")),
            (Err(Fail::Mismatch(m)), _) => return Err(format!("{at}: {m}")),
        }
    }
    Ok(())
}

/// Compares `got` gradients with `want` exactly: `null` accepts no gradient or zeros.
fn check_grads(params: &[Tensor], want: &[Option<TensorLit>], what: &str) -> Result<(), Fail> {
    if params.len() != want.len() {
        return Err(mismatch(format!(
            "bad vector: {} {what} for {} parameters",
            want.len(),
            params.len()
        )));
    }
    for (i, (p, w)) in params.iter().zip(want).enumerate() {
        let label = format!("{what}[{i}]");
        match (p.grad(), w) {
            (None, None) => {}
            (Some(g), None) => all_zero(&label, g.data()).map_err(mismatch)?,
            (None, Some(_)) => {
                return Err(mismatch(format!("{label}: missing, expected a tensor")))
            }
            (Some(g), Some(w)) => {
                compare(&label, &g.data().contiguous(), &w.to_tensor(), None).map_err(mismatch)?
            }
        }
    }
    Ok(())
}

fn act(scaler: &mut GradScaler, o: &mut Optimizers, a: &ScalerAction) -> Result<(), Fail> {
    match a {
        ScalerAction::Scale { input, expect } => {
            let got: Vec<Tensor> = match input {
                Output::Tensor(lit) => vec![scaler.scale(&leaf(lit)).map_err(api)?],
                Output::Tensors(lits) => {
                    let list =
                        Outputs::List(lits.iter().map(|l| Outputs::Tensor(leaf(l))).collect());
                    match scaler.scale_outputs(&list).map_err(api)? {
                        Outputs::List(items) => items
                            .into_iter()
                            .map(|i| match i {
                                Outputs::Tensor(t) => Ok(t),
                                Outputs::List(_) => Err(mismatch(
                                    "scaled: a nested list where a tensor is expected",
                                )),
                            })
                            .collect::<Result<_, _>>()?,
                        Outputs::Tensor(_) => {
                            return Err(mismatch("scaled: a tensor where a list is expected"))
                        }
                    }
                }
            };
            let want = expect.tensors();
            if got.len() != want.len() || input.is_list() != expect.is_list() {
                return Err(mismatch(format!(
                    "scaled: {} tensors, expected {}",
                    got.len(),
                    want.len()
                )));
            }
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                let label = if expect.is_list() {
                    format!("scaled[{i}]")
                } else {
                    "scaled".to_owned()
                };
                compare(&label, &g.data().contiguous(), &w.to_tensor(), None).map_err(mismatch)?;
            }
            Ok(())
        }
        ScalerAction::SetGrads { optimizer, grads } => {
            let i = o.index(optimizer)?;
            let params = &o.params[i];
            if params.len() != grads.len() {
                return Err(mismatch(format!(
                    "bad vector: {} grads for {} parameters",
                    grads.len(),
                    params.len()
                )));
            }
            for (p, g) in params.iter().zip(grads) {
                p.set_grad(g.as_ref().map(leaf)).map_err(api)?;
            }
            Ok(())
        }
        ScalerAction::Unscale {
            optimizer,
            expect_grads,
            ..
        } => {
            let i = o.index(optimizer)?;
            scaler.try_unscale_(&mut o.opts[i]).map_err(api)?;
            match expect_grads {
                Some(want) => check_grads(&o.params[i], want, "grads"),
                None => Ok(()),
            }
        }
        ScalerAction::Step {
            optimizer,
            expect_skipped,
            expect_params,
            ..
        } => {
            let i = o.index(optimizer)?;
            let before: Vec<_> = o.params[i].iter().map(|p| p.data().copy()).collect();
            let outcome = scaler.step(&mut o.opts[i]).map_err(api)?;
            let skipped = outcome.is_skipped();
            if let Some(want) = expect_skipped {
                if skipped != *want {
                    return Err(mismatch(format!("skipped: got {skipped}, expected {want}")));
                }
            }
            if skipped {
                for (j, (b, p)) in before.iter().zip(&o.params[i]).enumerate() {
                    compare(&format!("params[{j}]"), &p.data().contiguous(), b, None).map_err(
                        |m| mismatch(format!("a skipped step changed a parameter: {m}")),
                    )?;
                }
            }
            if let Some(want) = expect_params {
                if want.len() != o.params[i].len() {
                    return Err(mismatch(format!(
                        "bad vector: {} expect_params for {} parameters",
                        want.len(),
                        o.params[i].len()
                    )));
                }
                let tol = Some(Tolerance::new(STEP_RTOL, 0.0));
                for (j, (p, w)) in o.params[i].iter().zip(want).enumerate() {
                    compare(
                        &format!("params[{j}]"),
                        &p.data().contiguous(),
                        &w.to_tensor(),
                        tol,
                    )
                    .map_err(mismatch)?;
                }
            }
            Ok(())
        }
        ScalerAction::Update {
            new_scale,
            expect_scale,
            expect_growth_tracker,
            ..
        } => {
            match new_scale {
                Some(v) => scaler.update_with(NewScale::Value(*v)),
                None => scaler.update(),
            }
            .map_err(api)?;
            let (scale, tracker) = (scaler.get_scale(), scaler.get_growth_tracker());
            if let Some(want) = expect_scale {
                if scale.to_bits() != want.to_bits() {
                    return Err(mismatch(format!(
                        "scale: got {scale:?}, expected {want:?} (exact)"
                    )));
                }
            }
            if let Some(want) = expect_growth_tracker {
                if tracker != *want {
                    return Err(mismatch(format!(
                        "growth tracker: got {tracker}, expected {want}"
                    )));
                }
            }
            Ok(())
        }
        ScalerAction::ZeroGrad { optimizer } => {
            let i = o.index(optimizer)?;
            o.opts[i].zero_grad();
            Ok(())
        }
        ScalerAction::GetScale { expect } => {
            let scale = scaler.get_scale();
            if scale.to_bits() != expect.to_bits() {
                return Err(mismatch(format!(
                    "scale: got {scale:?}, expected {expect:?} (exact)"
                )));
            }
            Ok(())
        }
        ScalerAction::StateDict { expect } => {
            let got = scaler.state_dict_json();
            let got = got
                .as_object()
                .ok_or_else(|| mismatch(format!("state dict: got {got}, not an object")))?;
            let (gk, wk): (Vec<&String>, Vec<&String>) =
                (got.keys().collect(), expect.keys().collect());
            if gk != wk {
                return Err(mismatch(format!(
                    "state dict keys: got {gk:?}, expected {wk:?}"
                )));
            }
            for (k, w) in expect {
                let g = &got[k];
                // serde_json numbers compare with their kind: 2000 (int) != 2000.0 (float).
                if g != w {
                    return Err(mismatch(format!("state dict `{k}`: got {g}, expected {w}")));
                }
            }
            Ok(())
        }
        ScalerAction::LoadStateDict { state, .. } => scaler
            .load_state_dict_json(&serde_json::Value::Object(state.clone()))
            .map_err(api),
        ScalerAction::NewScaler { init } => {
            *scaler = GradScaler::with_options(options(init)).map_err(api)?;
            Ok(())
        }
        ScalerAction::Set { field, value } => {
            match (field.as_str(), *value) {
                ("growth_factor", v) => scaler.set_growth_factor(v.to_f64()),
                ("backoff_factor", v) => scaler.set_backoff_factor(v.to_f64()),
                ("growth_interval", Number::Int(v)) => scaler.set_growth_interval(v),
                ("growth_interval", v) => {
                    return Err(mismatch(format!(
                        "bad vector: growth_interval must be an int, got {v}"
                    )))
                }
                (other, _) => return Err(mismatch(format!("bad vector: unknown field `{other}`"))),
            }
            Ok(())
        }
    }
}
