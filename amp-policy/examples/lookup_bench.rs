//! Times policy lookups: by interned `OpId` (the dispatch hot path), through a `static OpName`,
//! and by name (hashing under the interner's read lock).
//!
//! `cargo run --release -p amp-policy --example lookup_bench`

use std::hint::black_box;
use std::time::Instant;

use amp_policy::{CastPolicy, DeviceType, OpId, OpName, Profile};

const N: usize = 10_000_000;

static MM: OpName = OpName::new("mm");

fn main() {
    let profile = Profile::docs();
    // A mix of listed and unlisted ops on both device types, as a forward pass would see.
    let names = [
        "mm",
        "add",
        "conv2d",
        "relu",
        "softmax",
        "layer_norm",
        "cat",
        "mul",
        "linear",
        "sum",
        "gelu",
        "binary_cross_entropy_with_logits",
        "grid_sample",
        "dropout",
        "matmul",
        "exp",
    ];
    let ids: Vec<OpId> = names.iter().map(|n| OpId::intern(n)).collect();
    let devices = [DeviceType::Cuda, DeviceType::Cpu];

    let mut tally = [0usize; 6];
    let bump = |tally: &mut [usize; 6], p: CastPolicy| tally[p as usize] += 1;

    // Warm up.
    for i in 0..N / 10 {
        bump(
            &mut tally,
            profile.policy(devices[i & 1], ids[i % ids.len()]),
        );
    }

    let t = Instant::now();
    for i in 0..N {
        let p = profile.policy(black_box(devices[i & 1]), black_box(ids[i % ids.len()]));
        bump(&mut tally, p);
    }
    let by_id = t.elapsed();

    let t = Instant::now();
    for i in 0..N {
        let p = profile.policy(black_box(devices[i & 1]), black_box(&MM).id());
        bump(&mut tally, p);
    }
    let by_static = t.elapsed();

    let t = Instant::now();
    for i in 0..N {
        let p =
            profile.policy_by_name(black_box(devices[i & 1]), black_box(names[i % names.len()]));
        bump(&mut tally, p);
    }
    let by_name = t.elapsed();

    let ns = |d: std::time::Duration| d.as_secs_f64() * 1e9 / N as f64;
    println!("{N} lookups each (profile {}):", profile.name());
    println!("  by OpId               {:7.2} ns/lookup", ns(by_id));
    println!("  by static OpName      {:7.2} ns/lookup", ns(by_static));
    println!("  by name (&str)        {:7.2} ns/lookup", ns(by_name));
    println!("  (policy tally, to keep the work alive: {tally:?})");
}
