//! Guards dropped in any order: each drop restores the state saved when that guard was
//! entered (PyTorch's `autocast.__exit__`), and `is_autocast_enabled` always agrees with
//! what ops actually do. Every test runs on a fresh thread, so the state a test leaves
//! behind on purpose (out-of-order drops can leave autocast on) ends with it.

use amp_autocast::*;
use amp_autograd::{ops, Tensor};
use amp_policy::{CastPolicy, DeviceType, Profile};
use amp_tensor::DType;

const CPU: DeviceType = DeviceType::Cpu;
const CUDA: DeviceType = DeviceType::Cuda;

fn fresh_thread(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(f)
        .join()
        .expect("the test thread finished without panicking");
}

/// The dtype `mm` of two float32 matrices gives now: what autocast does on cpu.
fn mm_dtype() -> DType {
    let a = Tensor::ones([2, 2], DType::F32);
    ops::mm(&a, &a).unwrap().dtype()
}

/// Checks that the flag and the behaviour agree, and that both are `expected`
/// (`Some(dtype)`: autocast on in that dtype; `None`: off).
#[track_caller]
fn assert_cpu_autocast(expected: Option<DType>) {
    let flag = is_autocast_enabled(CPU);
    let ran = mm_dtype();
    assert_eq!(
        flag,
        ran != DType::F32,
        "is_autocast_enabled says {flag} but mm ran in {ran}"
    );
    assert_eq!(
        ran,
        expected.unwrap_or(DType::F32),
        "mm ran in {ran}, expected {expected:?}"
    );
    if let Some(d) = expected {
        assert_eq!(get_autocast_dtype(CPU), d);
    }
}

/// Enters `region` and checks that autocast is then `expected`.
#[track_caller]
fn enter_expecting(region: Autocast, expected: Option<DType>) -> AutocastGuard {
    let g = region.enter().unwrap();
    assert_cpu_autocast(expected);
    g
}

/// Drops `guard` (a guard, or something holding guards) and checks that autocast is
/// then `expected`.
#[track_caller]
fn drop_expecting<G>(guard: G, expected: Option<DType>) {
    drop(guard);
    assert_cpu_autocast(expected);
}

#[test]
fn outer_guard_dropped_before_inner_restores_each_saved_state() {
    fresh_thread(|| {
        assert_cpu_autocast(None);
        let a = enter_expecting(Autocast::new(CPU).dtype(DType::BF16), Some(DType::BF16));
        let b = enter_expecting(Autocast::new(CPU).enabled(false), None);
        assert_eq!(autocast_depth(), 2);

        // `a` saved "off": dropping it first restores that.
        drop_expecting(a, None);
        assert_eq!(autocast_depth(), 1);

        // `b` saved "on, bfloat16" (the state `a` had set): dropping it restores that,
        // and ops follow the flag (before, the flag said on while ops ran in float32).
        drop(b);
        assert_eq!(autocast_depth(), 0);
        assert_cpu_autocast(Some(DType::BF16));
        assert_eq!(
            cache_len(),
            0,
            "the cache clears when the depth drops to zero"
        );

        // A later region nests over the restored state and gives it back.
        {
            let _off = enter_expecting(Autocast::new(CPU).enabled(false), None);
        }
        assert_cpu_autocast(Some(DType::BF16));
    });
}

#[test]
fn out_of_order_drops_between_two_enabled_regions() {
    fresh_thread(|| {
        let a = Autocast::new(CPU).dtype(DType::BF16).enter().unwrap();
        let b = enter_expecting(Autocast::new(CPU).dtype(DType::F16), Some(DType::F16));
        drop_expecting(a, None); // restores the state before `a`: off
        drop_expecting(b, Some(DType::BF16)); // restores the state before `b`: bfloat16
    });
}

#[test]
fn three_guards_dropped_in_entry_order() {
    fresh_thread(|| {
        let a = Autocast::new(CPU).enter().unwrap();
        let b = Autocast::new(CPU).enabled(false).enter().unwrap();
        let c = enter_expecting(Autocast::new(CPU).dtype(DType::F16), Some(DType::F16));
        drop_expecting(a, None);
        drop_expecting(b, Some(DType::BF16));
        drop_expecting(c, None);
        assert_eq!(autocast_depth(), 0);
    });
}

#[test]
fn nested_enable_and_disable_in_order() {
    fresh_thread(|| {
        assert_cpu_autocast(None);
        {
            let _on = enter_expecting(Autocast::new(CPU), Some(DType::BF16));
            {
                let _off = enter_expecting(Autocast::new(CPU).enabled(false), None);
                {
                    let _f16 =
                        enter_expecting(Autocast::new(CPU).dtype(DType::F16), Some(DType::F16));
                    {
                        let _off2 = enter_expecting(Autocast::new(CPU).enabled(false), None);
                        assert_eq!(autocast_depth(), 4);
                    }
                    assert_cpu_autocast(Some(DType::F16));
                }
                assert_cpu_autocast(None);
                // The dtype the disabled region kept is the outer one.
                assert_eq!(get_autocast_dtype(CPU), DType::BF16);
            }
            assert_cpu_autocast(Some(DType::BF16));
        }
        assert_cpu_autocast(None);
        assert_eq!(autocast_depth(), 0);
    });
}

#[test]
fn a_disabled_region_alone_changes_nothing() {
    fresh_thread(|| {
        let g = enter_expecting(Autocast::new(CPU).enabled(false), None);
        assert_eq!(autocast_depth(), 1);
        drop_expecting(g, None);
    });
}

/// Enters a region in a helper and hands the guard to the caller.
fn enter_bf16() -> AutocastGuard {
    Autocast::new(CPU).dtype(DType::BF16).enter().unwrap()
}

struct Holder {
    _guard: AutocastGuard,
}

#[test]
fn guards_moved_to_other_scopes() {
    fresh_thread(|| {
        // Returned from a function: the region stays open in the caller.
        let g = enter_bf16();
        assert_cpu_autocast(Some(DType::BF16));

        // Moved into a struct and into a vector, then dropped from there.
        let holder = Holder { _guard: g };
        let mut guards = vec![Autocast::new(CPU).enabled(false).enter().unwrap()];
        assert_cpu_autocast(None);
        guards.push(Autocast::new(CPU).dtype(DType::F16).enter().unwrap());
        assert_cpu_autocast(Some(DType::F16));

        // Dropping the holder first is out of order: off (the state before it).
        drop_expecting(holder, None);
        // Take the float16 guard out of the vector, drop the vector (the disabled region:
        // its saved state was bfloat16, on), then the float16 guard (saved: off).
        let last = guards.pop().unwrap();
        drop_expecting(guards, Some(DType::BF16));
        drop_expecting(last, None);

        // Moved into a closure that outlives the scope that entered it.
        let release = {
            let g = enter_bf16();
            move || drop(g)
        };
        assert_cpu_autocast(Some(DType::BF16));
        release();
        assert_cpu_autocast(None);
        assert_eq!(autocast_depth(), 0);
    });
}

#[test]
fn guards_of_two_device_types_dropped_out_of_order() {
    fresh_thread(|| {
        let cpu = Autocast::new(CPU).enter().unwrap();
        let cuda = Autocast::new(CUDA).enter().unwrap();
        assert!(is_autocast_enabled(CUDA));
        // Each guard restores its own device type's settings.
        drop_expecting(cpu, None);
        assert!(is_autocast_enabled(CUDA));
        drop(cuda);
        assert!(!is_autocast_enabled(CUDA));
        assert_cpu_autocast(None);
    });
}

#[test]
fn profiles_are_restored_per_guard() {
    fresh_thread(|| {
        let fp32_mm = Profile::docs().with_override(CPU, "mm", CastPolicy::Fp32);
        let a = Autocast::new(CPU).enter().unwrap();
        let b = Autocast::new(CPU).profile(fp32_mm.clone()).enter().unwrap();
        assert!(current_profile().ptr_eq(&fp32_mm));
        assert_eq!(
            mm_dtype(),
            DType::F32,
            "the override puts mm on the fp32 list"
        );
        assert!(is_autocast_enabled(CPU));
        drop_expecting(a, None);
        assert!(
            current_profile().ptr_eq(&fp32_mm),
            "`a` did not set a profile"
        );
        drop(b);
        assert!(!current_profile().ptr_eq(&fp32_mm));
        assert_cpu_autocast(Some(DType::BF16));
    });
}

#[test]
fn a_thread_may_end_with_autocast_left_on() {
    // Out-of-order drops can leave autocast on; the thread's state (and the layer it
    // installed) is torn down with the thread without a panic.
    fresh_thread(|| {
        let a = Autocast::new(CPU).enter().unwrap();
        let b = Autocast::new(CPU).enabled(false).enter().unwrap();
        drop(a);
        drop_expecting(b, Some(DType::BF16));
    });
    // A new thread starts with autocast off.
    fresh_thread(|| assert_cpu_autocast(None));
}

#[test]
fn unwinding_through_out_of_order_guards_restores_their_states() {
    fresh_thread(|| {
        let outer = Autocast::new(CPU).enter().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _inner = enter_expecting(Autocast::new(CPU).dtype(DType::F16), Some(DType::F16));
            panic!("boom");
        }));
        assert!(r.is_err());
        assert_cpu_autocast(Some(DType::BF16));
        drop_expecting(outer, None);
    });
}
