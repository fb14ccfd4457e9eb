//! Property tests: overrides change exactly one decision; the interner round-trips.

use amp_policy::{CastPolicy, DeviceType, OpId, Profile};
use proptest::prelude::*;

fn device() -> impl Strategy<Value = DeviceType> {
    prop::sample::select(DeviceType::ALL.to_vec())
}

fn policy() -> impl Strategy<Value = CastPolicy> {
    prop::sample::select(CastPolicy::ALL.to_vec())
}

/// Either a documented op name or a fresh one.
fn op() -> impl Strategy<Value = String> {
    let listed: Vec<String> = Profile::docs()
        .iter()
        .map(|(_, e)| e.op().to_owned())
        .collect();
    prop_oneof![
        prop::sample::select(listed),
        "[a-z_][a-z0-9_]{0,24}".prop_map(|s| format!("prop_{s}")),
    ]
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(64))]

    #[test]
    fn an_override_changes_exactly_one_decision(d in device(), op in op(), p in policy()) {
        let docs = Profile::docs();
        let mine = docs.with_override(d, &op, p);
        prop_assert_eq!(mine.policy_by_name(d, &op), p);
        prop_assert_eq!(mine.listed_policy(d, &op), p);
        prop_assert_eq!(mine.policy(d, OpId::intern(&op)), p);
        prop_assert_eq!(mine.banned_message(d, &op).is_some(), p == CastPolicy::Banned);
        for dev in DeviceType::ALL {
            for e in docs.entries(dev) {
                if dev == d && e.op() == op {
                    continue;
                }
                prop_assert_eq!(mine.listed_policy(dev, e.op()), e.policy());
            }
        }
        let changes = docs.diff(&mine);
        let expect_changes = usize::from(docs.listed_policy(d, &op) != p);
        prop_assert_eq!(changes.len(), expect_changes);
    }

    #[test]
    fn interning_round_trips(name in "\\PC{1,40}") {
        let id = OpId::intern(&name);
        prop_assert_eq!(id.name(), name.as_str());
        prop_assert_eq!(OpId::lookup(&name), Some(id));
        prop_assert_eq!(OpId::intern(&name), id);
    }
}
