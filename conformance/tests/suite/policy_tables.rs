//! Golden snapshots of what the documentation pins: the documented policy table of each
//! device, op → policy in documented order.

use amp::policy::{DeviceType, Profile};
use serde_json::{Map, Value};

/// The docs table of `device`: every listed op with its policy, in list order.
fn table(device: DeviceType) -> Value {
    let mut map = Map::new();
    for e in Profile::docs().entries(device) {
        map.insert(e.op().to_owned(), Value::from(e.policy().as_str()));
    }
    Value::Object(map)
}

#[test]
fn docs_policy_table_cuda() {
    insta::assert_json_snapshot!("docs_policy_table_cuda", table(DeviceType::Cuda));
}

#[test]
fn docs_policy_table_cpu() {
    insta::assert_json_snapshot!("docs_policy_table_cpu", table(DeviceType::Cpu));
}

/// The policy vectors list exactly the documented ops (plus `none` cases): the snapshot and
/// the vectors agree.
#[test]
fn policy_vectors_cover_every_documented_op() {
    let files = conformance::builtin_files();
    let cases = files
        .iter()
        .find_map(|f| match &f.cases {
            conformance::vectors::Cases::Policy(c) => Some(c),
            _ => None,
        })
        .expect("a built-in policy file");
    for device in DeviceType::ALL {
        for e in Profile::docs().entries(device) {
            assert!(
                cases
                    .iter()
                    .any(|c| c.device == device && c.op == e.op() && c.policy == e.policy()),
                "{device} {} ({}) has no policy vector",
                e.op(),
                e.policy()
            );
        }
    }
}

/// What autocast does to each documented op of `device` under the device's default
/// lower-precision dtype, for three typical argument lists: the decision table a user
/// reads off the docs, computed by the pure decision function (so cuda needs no GPU).
fn decision_table(device: DeviceType) -> Value {
    use amp::autocast::{decide, default_dtype, ArgInfo, CallFlags};
    use amp::tensor::DType;
    let low = default_dtype(device);
    let scenarios: [(&str, [DType; 2]); 3] = [
        ("float32,float32", [DType::F32, DType::F32]),
        ("lower,float32", [low, DType::F32]),
        ("float64,float32", [DType::F64, DType::F32]),
    ];
    let flags = CallFlags {
        accepts_dtype: true,
        ..CallFlags::default()
    };
    let mut map = Map::new();
    for e in Profile::docs().entries(device) {
        let mut row = Map::new();
        for (name, dtypes) in scenarios {
            let args = dtypes.map(|dtype| ArgInfo { dtype, device });
            let cell = match decide(e.policy(), e.message(), device, low, &args, flags) {
                Ok(plan) => {
                    let after: Vec<String> = args
                        .iter()
                        .zip(&plan.casts)
                        .map(|(a, c)| c.unwrap_or(a.dtype).to_string())
                        .collect();
                    match plan.set_dtype {
                        Some(d) => format!("{} (dtype={d})", after.join(",")),
                        None => after.join(","),
                    }
                }
                Err(err) => format!("error: {err}"),
            };
            row.insert(name.to_owned(), Value::from(cell));
        }
        map.insert(e.op().to_owned(), Value::Object(row));
    }
    Value::Object(map)
}

#[test]
fn autocast_decision_table_cpu() {
    insta::assert_json_snapshot!(
        "autocast_decision_table_cpu",
        decision_table(DeviceType::Cpu)
    );
}

#[test]
fn autocast_decision_table_cuda() {
    insta::assert_json_snapshot!(
        "autocast_decision_table_cuda",
        decision_table(DeviceType::Cuda)
    );
}
