//! The scaler and train runners catch wrong expectations: each test changes one
//! expectation of a real vector (or the vector's program) and checks the case fails with
//! the first mismatch named, while the untouched vector passes.

use conformance::{backend, run_files, Suite, VectorFile, BUILTIN};
use serde_json::{json, Value};

fn builtin_json(name: &str) -> Value {
    let (_, text) = BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a built-in vector file");
    serde_json::from_str(text).unwrap()
}

/// The built-in file `name` reduced to the case `id`, changed by `edit`.
fn one_case(name: &str, id: &str, edit: impl FnOnce(&mut Value)) -> VectorFile {
    let mut file = builtin_json(name);
    let cases = file["cases"].as_array_mut().unwrap();
    cases.retain(|c| c["id"] == id);
    assert_eq!(cases.len(), 1, "{id}");
    edit(&mut cases[0]);
    VectorFile::parse(name, &file.to_string()).unwrap()
}

/// `Ok(())` when the case passed, else its failure message.
fn outcome(file: VectorFile, suite: Suite) -> Result<(), String> {
    let report = run_files(&backend::builtin(), &[file]);
    let s = report.suite(suite);
    assert_eq!(s.total(), 1);
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    match s.failures.first() {
        None => Ok(()),
        Some(f) => Err(f.message.clone()),
    }
}

fn scaler(id: &str, edit: impl FnOnce(&mut Value)) -> Result<(), String> {
    outcome(one_case("scaler.json", id, edit), Suite::Scaler)
}

fn train(id: &str, edit: impl FnOnce(&mut Value)) -> Result<(), String> {
    outcome(one_case("train.json", id, edit), Suite::Train)
}

/// Asserts that `msg` begins with `prefix`.
fn assert_starts(msg: &str, prefix: &str) {
    assert!(msg.starts_with(prefix), "{msg}");
}

/// The failure of scaler case `id` with `edit` applied to its first action named `action`.
fn scaler_action(id: &str, action: &str, edit: impl FnOnce(&mut Value)) -> String {
    scaler(id, |c| {
        let actions = c["actions"].as_array_mut().unwrap();
        let a = actions.iter_mut().find(|a| a["action"] == action).unwrap();
        edit(a)
    })
    .unwrap_err()
}

#[test]
fn untouched_scaler_and_train_vectors_pass() {
    assert_eq!(scaler("manual_update/1", |_| {}), Ok(()));
    assert_eq!(train("scaler_only/1", |_| {}), Ok(()));
}

#[test]
fn a_wrong_scale_after_update_fails() {
    let msg = scaler_action("manual_update/1", "update", |a| {
        a["expect_scale"] = json!(1024.0)
    });
    assert_eq!(
        msg,
        "action 3 (update): scale: got 512.0, expected 1024.0 (exact)"
    );
}

#[test]
fn a_wrong_growth_tracker_fails() {
    let msg = scaler_action("manual_update/1", "update", |a| {
        a["expect_growth_tracker"] = json!(0)
    });
    assert_eq!(msg, "action 3 (update): growth tracker: got 1, expected 0");
}

#[test]
fn a_wrong_skip_or_param_fails() {
    let msg = scaler_action("manual_update/1", "step", |a| {
        a["expect_skipped"] = json!(true)
    });
    assert_eq!(msg, "action 2 (step): skipped: got false, expected true");
    let msg = scaler_action("manual_update/1", "step", |a| {
        a["expect_params"][0]["data"][1] = json!(0.5)
    });
    assert_starts(
        &msg,
        "action 2 (step): element 1 of params[0]: got 0.3629664480686188 (float32), expected 0.5",
    );
}

#[test]
fn a_wrong_scaled_value_or_unscaled_grad_fails() {
    let msg = scaler("trajectory/0/1", |c| {
        c["actions"][0]["expect"]["data"][0] = json!(1.0);
    })
    .unwrap_err();
    assert_starts(&msg, "action 0 (scale): element 0 of scaled: got -16447.876953125 (float32), expected 1.0 (exact)");
    let msg = scaler_action("trajectory/0/1", "unscale_", |a| {
        a["expect_grads"][1] = Value::Null
    });
    assert_starts(&msg, "action 2 (unscale_): grads[1]: expected no gradient");
}

#[test]
fn state_dicts_compare_keys_in_order_and_value_types() {
    let swapped = scaler_action("manual_update/1", "state_dict", |a| {
        let e = a["expect"].as_object().unwrap().clone();
        let mut keys: Vec<&String> = e.keys().collect();
        keys.swap(1, 2);
        let reordered: serde_json::Map<String, Value> = keys
            .into_iter()
            .map(|k| (k.clone(), e[k].clone()))
            .collect();
        a["expect"] = Value::Object(reordered);
    });
    assert_starts(&swapped, "action 23 (state_dict): state dict keys: got [\"scale\", \"growth_factor\", \"backoff_factor\"");
    // growth_interval is an int in PyTorch's dict; a float is a different value type.
    let float = scaler_action("manual_update/1", "state_dict", |a| {
        a["expect"]["growth_interval"] = json!(1.0)
    });
    assert_eq!(
        float,
        "action 23 (state_dict): state dict `growth_interval`: got 1, expected 1.0"
    );
}

#[test]
fn expected_errors_must_match_and_must_happen() {
    let msg = scaler("error/step_twice/1", |c| {
        c["actions"][3]["expect_error"] = json!("something else");
    })
    .unwrap_err();
    assert_eq!(
        msg,
        "action 3 (step): error `step() has already been called since the last update().`, \
         expected one containing `something else`"
    );
    // An error where none is expected.
    let msg = scaler("error/step_twice/1", |c| {
        c["actions"][3]
            .as_object_mut()
            .unwrap()
            .remove("expect_error");
    })
    .unwrap_err();
    assert_eq!(
        msg,
        "action 3 (step): unexpected error: step() has already been called since the last update()."
    );
    // No error where one is expected.
    let msg = scaler("manual_update/1", |c| {
        c["actions"][2]["expect_error"] = json!("boom");
    })
    .unwrap_err();
    assert_eq!(
        msg,
        "action 2 (step): no error, expected one containing `boom`"
    );
    let msg = scaler("error/growth_factor_le_1/1", |c| {
        c["init"]["growth_factor"] = json!(1.5);
    })
    .unwrap_err();
    assert_eq!(
        msg,
        "init: construction did not fail, expected an error containing `The growth factor must be > 1.0.`"
    );
}

#[test]
fn a_wrong_train_expectation_fails() {
    let msg = train("scaler_only/1", |c| {
        c["expect"]["scales"][0] = json!(128.0);
    })
    .unwrap_err();
    assert_starts(&msg, "scales: got [256.0, 512.0, 256.0");
    let msg = train("scaler_only/1", |c| {
        c["expect"]["skipped"][2] = json!(false);
    })
    .unwrap_err();
    assert_starts(&msg, "skipped: got [false, false, true");
    let msg = train("scaler_only/1", |c| {
        c["expect"]["losses"][4] = json!(1.5);
    })
    .unwrap_err();
    assert_starts(&msg, "loss 4: got 1.762");
    let msg = train("scaler_only/1", |c| {
        c["expect"]["final_params"][3]["data"][0] = json!(10.0);
    })
    .unwrap_err();
    assert_starts(&msg, "element 0 of final_params[3]: got");
}

#[test]
fn train_inject_inf_and_accumulate_change_the_run() {
    // Without the injected inf, step 2 is not skipped: the next loss differs (it is the
    // loss of the fp32 control run, which has the same data and no inf).
    let msg = train("scaler_only/1", |c| {
        c["inject_inf"] = json!([]);
    })
    .unwrap_err();
    assert_starts(
        &msg,
        "loss 3: got 1.0090829133987427, expected 1.0007716417312622",
    );
    // Another accumulation count gives another number of optimizer steps.
    let msg = train("autocast_bf16_accumulate/1", |c| {
        c["accumulate"] = json!(1);
    })
    .unwrap_err();
    assert!(
        msg.starts_with("loss ") || msg.starts_with("scales: "),
        "{msg}"
    );
}
