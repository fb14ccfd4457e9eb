//! The op-name interner: stable ids, across threads.

use std::collections::HashMap;
use std::sync::Barrier;

use amp_policy::{CastPolicy, DeviceType, OpId, OpName, Profile};

#[test]
fn same_name_same_id() {
    let a = OpId::intern("intern_test_same");
    assert_eq!(OpId::intern("intern_test_same"), a);
    assert_eq!(OpId::intern(&String::from("intern_test_same")), a);
    assert_ne!(OpId::intern("intern_test_other"), a);
    assert_eq!(a.name(), "intern_test_same");
    assert_eq!(a.to_string(), "intern_test_same");
    assert!(format!("{a:?}").contains("intern_test_same"));
    assert!(a.index() < OpId::interned_count());
    assert_eq!(a.as_u32() as usize, a.index());
}

#[test]
fn lookup_does_not_intern() {
    assert_eq!(OpId::lookup("intern_test_never_interned"), None);
    let docs = Profile::docs();
    assert_eq!(
        docs.policy_by_name(DeviceType::Cuda, "intern_test_never_interned"),
        CastPolicy::None
    );
    assert!(docs
        .entry(DeviceType::Cuda, "intern_test_never_interned")
        .is_none());
    assert_eq!(OpId::lookup("intern_test_never_interned"), None);
}

#[test]
fn ids_interned_after_a_profile_was_built_are_unlisted() {
    let docs = Profile::docs();
    let late = OpId::intern("intern_test_late_op");
    assert_eq!(docs.policy(DeviceType::Cpu, late), CastPolicy::None);
    assert_eq!(docs.policy(DeviceType::Cuda, late), CastPolicy::None);
}

#[test]
fn stable_across_threads() {
    const THREADS: usize = 8;
    let names: Vec<String> = (0..300)
        .map(|i| format!("intern_test_thread_op_{i}"))
        .collect();
    let barrier = Barrier::new(THREADS);
    let maps: Vec<HashMap<String, OpId>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let names = &names;
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    // Each thread walks the names from a different start, so they race on
                    // interning different names first.
                    let n = names.len();
                    (0..n)
                        .map(|i| {
                            let name = &names[(i + t * 37) % n];
                            (name.clone(), OpId::intern(name))
                        })
                        .collect::<HashMap<_, _>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for m in &maps[1..] {
        assert_eq!(m, &maps[0]);
    }
    let mut ids: Vec<OpId> = maps[0].values().copied().collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), names.len(), "distinct names get distinct ids");
    for (name, id) in &maps[0] {
        assert_eq!(id.name(), name);
        assert_eq!(OpId::lookup(name), Some(*id));
    }
}

static CONV2D: OpName = OpName::new("conv2d");

#[test]
fn op_name_in_a_static() {
    let ids: Vec<OpId> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|_| s.spawn(|| CONV2D.id())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|&id| id == OpId::intern("conv2d")));
    assert_eq!(CONV2D.name(), "conv2d");
    assert_eq!(OpId::from(&CONV2D), CONV2D.id());
    let docs = Profile::docs();
    assert_eq!(
        docs.policy(DeviceType::Cpu, CONV2D.id()),
        CastPolicy::LowerPrecisionFp
    );
    assert_eq!(
        docs.policy(DeviceType::Cuda, CONV2D.id()),
        CastPolicy::LowerPrecisionFp
    );
}

#[test]
fn policy_by_id_matches_policy_by_name() {
    for profile in [Profile::docs(), Profile::torch_2_15()] {
        for (device, e) in profile.iter() {
            assert_eq!(
                profile.policy(device, e.id()),
                e.policy(),
                "{} {device}",
                e.op()
            );
            assert_eq!(profile.policy_by_name(device, e.op()), e.policy());
        }
    }
}
