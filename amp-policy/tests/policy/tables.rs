//! Snapshots of the policy tables: a change to the data files shows up here, for review.

use std::fmt::Write;

use amp_policy::{DeviceType, Profile, Source};

fn render(profile: &Profile, device: DeviceType) -> String {
    let mut s = String::new();
    writeln!(
        s,
        "profile {} / {device}: {} entries",
        profile.name(),
        profile.entries(device).len()
    )
    .unwrap();
    for e in profile.entries(device) {
        let source = match e.source() {
            Source::Documented { list } => format!("docs: {list}"),
            Source::Profile { profile, .. } => format!("profile {profile}"),
            Source::Override => "override".to_owned(),
            other => format!("{other:?}"),
        };
        writeln!(s, "{:<20} {:<34} [{source}]", e.policy().as_str(), e.op()).unwrap();
        if let Some(m) = e.message() {
            for line in m.lines() {
                writeln!(s, "{:<20} | {line}", "").unwrap();
            }
        }
    }
    for a in profile.aliases(device) {
        writeln!(s, "alias {} -> {} ({})", a.name(), a.of(), a.why()).unwrap();
    }
    s
}

#[test]
fn docs_cuda_table() {
    insta::assert_snapshot!("docs_cuda", render(&Profile::docs(), DeviceType::Cuda));
}

#[test]
fn docs_cpu_table() {
    insta::assert_snapshot!("docs_cpu", render(&Profile::docs(), DeviceType::Cpu));
}

#[test]
fn torch_2_15_differences() {
    let changes = Profile::docs().diff(&Profile::torch_2_15());
    insta::assert_json_snapshot!("torch_2_15_differences", changes);
}

#[test]
fn torch_2_15_changed_entries_explained() {
    let torch = Profile::torch_2_15();
    let mut s = String::new();
    for change in Profile::docs().diff(&torch) {
        writeln!(s, "{}", torch.explain(change.device, change.op)).unwrap();
    }
    insta::assert_snapshot!("torch_2_15_explained", s);
}

#[test]
fn docs_entries_as_json() {
    let docs = Profile::docs();
    let banned: Vec<_> = docs
        .iter()
        .filter(|(_, e)| e.message().is_some())
        .map(|(d, e)| (d, e.clone()))
        .collect();
    insta::assert_json_snapshot!("docs_banned_entries", banned);
}
