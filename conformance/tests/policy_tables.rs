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
