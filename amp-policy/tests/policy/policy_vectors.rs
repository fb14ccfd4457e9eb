//! The `policy` conformance suite (`vectors/policy.json`, copied to `tests/data/`): every
//! case's documented policy, and nothing listed that the suite does not know.

use std::collections::{HashMap, HashSet};

use amp_policy::{CastPolicy, DeviceType, Profile};
use serde::Deserialize;

#[derive(Deserialize)]
struct Suite {
    format: String,
    suite: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    id: String,
    device: String,
    op: String,
    policy: String,
}

fn suite() -> Suite {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/policy.json");
    let text = std::fs::read_to_string(path).expect("tests/data/policy.json");
    let suite: Suite = serde_json::from_str(&text).expect("policy.json parses");
    assert_eq!(suite.format, "amp-vectors/1");
    assert_eq!(suite.suite, "policy");
    suite
}

/// Checks one case against the docs profile: the listed policy must be the expected one; the
/// dispatch policy too, except where an alias of the device's table redirects the name.
fn check(profile: &Profile, device: &str, op: &str, expect: &str) -> Result<(), String> {
    let device: DeviceType = device.parse().map_err(|e| format!("{e}"))?;
    let expect: CastPolicy = expect.parse().map_err(|e| format!("{e}"))?;
    let listed = profile.listed_policy(device, op);
    if listed != expect {
        return Err(format!(
            "{op} on {device}: listed {listed}, expected {expect}"
        ));
    }
    let dispatch = profile.policy_by_name(device, op);
    match profile.alias(device, op) {
        Some(alias) if profile.listed_entry(device, op).is_none() => {
            let target = profile.listed_policy(device, alias.of());
            if dispatch != target {
                return Err(format!(
                    "{op} on {device}: alias of {} dispatches as {dispatch}, expected {target}",
                    alias.of()
                ));
            }
        }
        _ if dispatch != expect => {
            return Err(format!(
                "{op} on {device}: dispatches as {dispatch}, expected {expect}"
            ));
        }
        _ => {}
    }
    if expect == CastPolicy::Banned && profile.banned_message(device, op).is_none() {
        return Err(format!("{op} on {device}: banned without a message"));
    }
    Ok(())
}

#[test]
fn every_case_of_the_policy_suite() {
    let suite = suite();
    let docs = Profile::docs();
    let mut failures = Vec::new();
    let mut ids = HashSet::new();
    for case in &suite.cases {
        assert!(ids.insert(case.id.as_str()), "duplicate id {}", case.id);
        if let Err(e) = check(&docs, &case.device, &case.op, &case.policy) {
            failures.push(format!("{}: {e}", case.id));
        }
    }
    assert_eq!(suite.cases.len(), 374);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_tables_list_nothing_the_suite_does_not_know() {
    let suite = suite();
    let expected: HashMap<(String, String), String> = suite
        .cases
        .iter()
        .filter(|c| c.policy != "none")
        .map(|c| ((c.device.clone(), c.op.clone()), c.policy.clone()))
        .collect();
    let docs = Profile::docs();
    let listed: HashMap<(String, String), String> = docs
        .iter()
        .map(|(d, e)| ((d.to_string(), e.op().to_owned()), e.policy().to_string()))
        .collect();
    assert_eq!(listed, expected);
}

#[test]
fn policy_counts_per_device() {
    let docs = Profile::docs();
    let count = |d, p| docs.ops(d, p).len();
    assert_eq!(count(DeviceType::Cuda, CastPolicy::LowerPrecisionFp), 23);
    assert_eq!(count(DeviceType::Cuda, CastPolicy::Fp32), 51);
    assert_eq!(count(DeviceType::Cuda, CastPolicy::Promote), 10);
    assert_eq!(count(DeviceType::Cuda, CastPolicy::Banned), 1);
    assert_eq!(count(DeviceType::Cpu, CastPolicy::LowerPrecisionFp), 11);
    assert_eq!(count(DeviceType::Cpu, CastPolicy::Fp32), 85);
    assert_eq!(count(DeviceType::Cpu, CastPolicy::Promote), 3);
    assert_eq!(count(DeviceType::Cpu, CastPolicy::Banned), 0);
    for d in DeviceType::ALL {
        assert_eq!(count(d, CastPolicy::Fp32SetOptDtype), 0);
        assert_eq!(count(d, CastPolicy::None), 0);
    }
}

#[test]
fn grid_sample_aliases_follow_the_other_devices_name() {
    // policy.json (the literal lists): cpu grid_sample and cuda grid_sampler are unlisted.
    // At dispatch they are the same op as the listed name (autocast_cpu.json runs
    // grid_sample in float32 on cpu).
    let docs = Profile::docs();
    // (device, name, its listed policy, its policy at dispatch)
    for (device, name, listed, at_dispatch) in [
        (
            DeviceType::Cpu,
            "grid_sample",
            CastPolicy::None,
            CastPolicy::Fp32,
        ),
        (
            DeviceType::Cuda,
            "grid_sampler",
            CastPolicy::None,
            CastPolicy::Promote,
        ),
    ] {
        assert_eq!(
            docs.listed_policy(device, name),
            listed,
            "{device:?} {name}"
        );
        assert_eq!(
            docs.policy_by_name(device, name),
            at_dispatch,
            "{device:?} {name}"
        );
    }
    // The lower-level CPU names are not aliased on CUDA.
    assert_eq!(
        docs.policy_by_name(DeviceType::Cuda, "grid_sampler_2d"),
        CastPolicy::None
    );
    assert_eq!(docs.aliases(DeviceType::Cpu).len(), 1);
    assert_eq!(docs.aliases(DeviceType::Cuda).len(), 1);
}

#[test]
fn documented_order_is_kept() {
    let docs = Profile::docs();
    let lpf = docs.ops(DeviceType::Cuda, CastPolicy::LowerPrecisionFp);
    assert_eq!(&lpf[..3], ["__matmul__", "addbmm", "addmm"]);
    assert_eq!(lpf.last(), Some(&"RNNCell"));
    let cpu_lpf = docs.ops(DeviceType::Cpu, CastPolicy::LowerPrecisionFp);
    assert_eq!(cpu_lpf.last(), Some(&"_convolution"));
    let cpu_fp32 = docs.ops(DeviceType::Cpu, CastPolicy::Fp32);
    assert_eq!(cpu_fp32.first(), Some(&"conv_transpose1d"));
    assert_eq!(cpu_fp32.last(), Some(&"linalg_inv_ex"));
    assert_eq!(cpu_fp32.iter().filter(|o| **o == "inverse").count(), 1);
}

#[test]
fn binary_cross_entropy_is_banned_on_cuda_only() {
    let docs = Profile::docs();
    assert_eq!(
        docs.banned_message(DeviceType::Cuda, "binary_cross_entropy"),
        Some(
            "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n\
             Many models use a sigmoid layer right before the binary cross entropy layer.\n\
             In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n\
             or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n\
             safe to autocast."
        )
    );
    assert_eq!(
        docs.policy_by_name(DeviceType::Cpu, "binary_cross_entropy"),
        CastPolicy::Fp32
    );
    assert_eq!(
        docs.banned_message(DeviceType::Cpu, "binary_cross_entropy"),
        None
    );
    assert_eq!(
        docs.policy_by_name(DeviceType::Cuda, "binary_cross_entropy_with_logits"),
        CastPolicy::Fp32
    );
}
