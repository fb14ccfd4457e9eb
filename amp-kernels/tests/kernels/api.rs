//! The AMP kernels against scalar references written here: bit-exact unscale per
//! dtype, non-finite detection anywhere, layouts, and the scale-update rule.

use amp_kernels::{non_finite_check_and_unscale_, update_scale_};
use amp_tensor::half::{bf16, f16};
use amp_tensor::{DType, Layout, Tensor};
use proptest::prelude::*;

fn scalar_f32(v: f32) -> Tensor {
    Tensor::from_vec(vec![v], [1]).unwrap()
}

fn found(t: &Tensor) -> f32 {
    t.item::<f32>().unwrap()
}

/// A small deterministic generator for bit patterns (xorshift).
struct Bits(u64);
impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn finite_f32s(n: usize, seed: u64) -> Vec<f32> {
    let mut g = Bits(seed);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let x = f32::from_bits(g.next() as u32);
        if x.is_finite() {
            v.push(x);
        }
    }
    v
}

fn finite_f64s(n: usize, seed: u64) -> Vec<f64> {
    let mut g = Bits(seed);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        // mix wide-range random patterns with moderate values that do not flush to 0
        let x = if v.len() % 2 == 0 {
            f64::from_bits(g.next())
        } else {
            (g.next() as i64 as f64) * 1e-12
        };
        if x.is_finite() {
            v.push(x);
        }
    }
    v
}

/// Every finite 16-bit pattern of a format whose exponent-all-ones mask is `inf`.
fn all_finite_16(inf: u16) -> Vec<u16> {
    (0..=u16::MAX).filter(|b| b & inf != inf).collect()
}

const INVS: [f32; 5] = [1.0 / 65536.0, 0.3, 1.7, 3.0, 1.0];

fn ref_f32(v: f32, inv: f32) -> f32 {
    if inv == 1.0 {
        v
    } else {
        v * inv
    }
}

fn ref_f64(v: f64, inv: f32) -> f64 {
    if inv == 1.0 {
        v
    } else {
        v * inv as f64
    }
}

fn ref_f16(v: f16, inv: f32) -> f16 {
    if inv == 1.0 {
        v
    } else {
        f16::from_f32(v.to_f32() * inv)
    }
}

fn ref_bf16(v: bf16, inv: f32) -> bf16 {
    if inv == 1.0 {
        v
    } else {
        bf16::from_f32(v.to_f32() * inv)
    }
}

#[test]
fn unscale_is_bit_exact_for_every_dtype() {
    for inv in INVS {
        let a32 = finite_f32s(300_001, 1);
        let a64 = finite_f64s(70_003, 2);
        let a16: Vec<f16> = all_finite_16(0x7C00)
            .into_iter()
            .map(f16::from_bits)
            .collect();
        let ab16: Vec<bf16> = all_finite_16(0x7F80)
            .into_iter()
            .map(bf16::from_bits)
            .collect();
        let grads = [
            Tensor::from_slice(&a32, [a32.len()]).unwrap(),
            Tensor::from_slice(&a64, [a64.len()]).unwrap(),
            Tensor::from_slice(&a16, [a16.len()]).unwrap(),
            Tensor::from_slice(&ab16, [ab16.len()]).unwrap(),
        ];
        let fi = scalar_f32(0.0);
        non_finite_check_and_unscale_(&grads, &fi, &scalar_f32(inv)).unwrap();
        assert_eq!(found(&fi), 0.0, "inv {inv}: all inputs finite");
        let g32 = grads[0].to_vec::<f32>().unwrap();
        for (i, (&x, &g)) in a32.iter().zip(&g32).enumerate() {
            assert_eq!(
                ref_f32(x, inv).to_bits(),
                g.to_bits(),
                "f32 #{i} {x:e} * {inv}"
            );
        }
        let g64 = grads[1].to_vec::<f64>().unwrap();
        for (i, (&x, &g)) in a64.iter().zip(&g64).enumerate() {
            assert_eq!(
                ref_f64(x, inv).to_bits(),
                g.to_bits(),
                "f64 #{i} {x:e} * {inv}"
            );
        }
        let g16 = grads[2].to_vec::<f16>().unwrap();
        for (&x, &g) in a16.iter().zip(&g16) {
            assert_eq!(ref_f16(x, inv).to_bits(), g.to_bits(), "f16 {x} * {inv}");
        }
        let gb = grads[3].to_vec::<bf16>().unwrap();
        for (&x, &g) in ab16.iter().zip(&gb) {
            assert_eq!(ref_bf16(x, inv).to_bits(), g.to_bits(), "bf16 {x} * {inv}");
        }
    }
}

/// A mixed list of grads (every dtype, sizes across the task boundary) of ones.
fn mixed_list() -> Vec<Tensor> {
    vec![
        Tensor::ones([3], DType::F32),
        Tensor::ones([300_000], DType::F32),
        Tensor::ones([257], DType::F16),
        Tensor::ones([66_000], DType::BF16),
        Tensor::ones([5, 7], DType::F64),
        Tensor::ones([0], DType::F32),
        Tensor::ones([1], DType::BF16),
    ]
}

fn set_elem(t: &Tensor, flat: usize, v: f64) {
    let view = t.reshape([-1i64]).unwrap().narrow(0usize, flat, 1).unwrap();
    view.copy_(&Tensor::scalar_of(v, DType::F64)).unwrap();
}

#[test]
fn non_finite_found_in_any_position_of_any_tensor() {
    for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
        let n_tensors = mixed_list().len();
        for ti in 0..n_tensors {
            let n = mixed_list()[ti].elem_count();
            let mut positions = vec![0, n / 2, n.saturating_sub(1)];
            positions.extend([262_143, 262_144].iter().filter(|&&p| p < n));
            for &pos in &positions {
                if n == 0 {
                    continue;
                }
                let grads = mixed_list();
                set_elem(&grads[ti], pos, bad);
                let fi = scalar_f32(0.0);
                non_finite_check_and_unscale_(&grads, &fi, &scalar_f32(0.5)).unwrap();
                assert_eq!(found(&fi), 1.0, "{bad} in tensor {ti} at {pos}");
                // the others were still unscaled
                let v = grads[(ti + 1) % n_tensors].to_vec_f64();
                assert!(
                    v.iter().all(|&x| x == 0.5),
                    "tensor {} unscaled",
                    (ti + 1) % n_tensors
                );
                // the bad element stays non-finite
                let got = grads[ti].to_vec_f64()[pos];
                assert!(!got.is_finite());
            }
        }
    }
    // and with inv_scale == 1.0 too
    let grads = mixed_list();
    set_elem(&grads[3], 65_999, f64::NAN);
    let fi = scalar_f32(0.0);
    non_finite_check_and_unscale_(&grads, &fi, &scalar_f32(1.0)).unwrap();
    assert_eq!(found(&fi), 1.0);
}

#[test]
fn found_inf_is_never_cleared() {
    let grads = mixed_list();
    let fi = scalar_f32(1.0);
    non_finite_check_and_unscale_(&grads, &fi, &scalar_f32(0.25)).unwrap();
    assert_eq!(found(&fi), 1.0);
    assert!(grads[1].to_vec_f64().iter().all(|&x| x == 0.25));
    // an empty list changes nothing
    let fi = scalar_f32(0.0);
    non_finite_check_and_unscale_(&[], &fi, &scalar_f32(0.25)).unwrap();
    assert_eq!(found(&fi), 0.0);
}

#[test]
fn inv_scale_one_leaves_bits_untouched_including_nan_payloads() {
    let f32_bits = [
        0x7FA0_0001u32,
        0xFFC1_2345,
        0x7F80_0000,
        0x0000_0001,
        0x8000_0000,
    ];
    let f64_bits = [
        0x7FF0_0000_0000_0001u64,
        0xFFF8_DEAD_BEEF_0000,
        0x3FF0_0000_0000_0000,
    ];
    let f16_bits = [0x7D01u16, 0xFE55, 0x7C00, 0x0001];
    let bf16_bits = [0x7F81u16, 0xFFA5, 0xFF80, 0x0001];
    let grads = [
        Tensor::from_vec(f32_bits.map(f32::from_bits).to_vec(), [5]).unwrap(),
        Tensor::from_vec(f64_bits.map(f64::from_bits).to_vec(), [3]).unwrap(),
        Tensor::from_vec(f16_bits.map(f16::from_bits).to_vec(), [4]).unwrap(),
        Tensor::from_vec(bf16_bits.map(bf16::from_bits).to_vec(), [4]).unwrap(),
    ];
    let fi = scalar_f32(0.0);
    non_finite_check_and_unscale_(&grads, &fi, &scalar_f32(1.0)).unwrap();
    assert_eq!(found(&fi), 1.0);
    let g: Vec<u32> = grads[0]
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(g, f32_bits);
    let g: Vec<u64> = grads[1]
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(g, f64_bits);
    let g: Vec<u16> = grads[2]
        .to_vec::<f16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(g, f16_bits);
    let g: Vec<u16> = grads[3]
        .to_vec::<bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(g, bf16_bits);
}

#[test]
fn nan_is_unscaled_to_nan_and_bf16_nan_is_canonical() {
    let g = Tensor::from_vec(vec![bf16::from_bits(0x7F81), bf16::from_f32(2.0)], [2]).unwrap();
    let fi = scalar_f32(0.0);
    non_finite_check_and_unscale_(std::slice::from_ref(&g), &fi, &scalar_f32(0.5)).unwrap();
    let v = g.to_vec::<bf16>().unwrap();
    // PyTorch's c10::BFloat16 rounding gives the canonical 0x7FC0 for every NaN
    assert_eq!(v[0].to_bits(), 0x7FC0);
    assert_eq!(v[1].to_f32(), 1.0);
    assert_eq!(found(&fi), 1.0);
}

#[test]
fn strided_layouts_are_respected() {
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let base: Vec<f64> = (0..3000).map(|i| (i as f64 - 1500.0) * 0.37).collect();
        let storage = Tensor::from_vec(base.clone(), [3000])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let orig = storage.to_vec_f64();
        // a transposed [60, 50] view of the first 3000 elements, and a step-3 slice of
        // another tensor
        let mat = storage.reshape([50i64, 60]).unwrap().t().unwrap();
        assert!(!mat.is_contiguous());
        let other = Tensor::from_vec(base.clone(), [3000])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let sliced = other.slice(0usize, 1, 3000, 3).unwrap();
        let fi = scalar_f32(0.0);
        non_finite_check_and_unscale_(&[mat, sliced], &fi, &scalar_f32(0.3)).unwrap();
        assert_eq!(found(&fi), 0.0);
        let round = |x: f64| {
            Tensor::scalar_of(x, DType::F64)
                .to_dtype(dtype)
                .unwrap()
                .item_f64()
                .unwrap()
        };
        let scaled = |x: f64| match dtype {
            DType::F64 => x * 0.3f32 as f64,
            _ => round((x as f32 * 0.3f32) as f64),
        };
        // every element of the transposed view is the whole storage
        let got = storage.to_vec_f64();
        for (i, (&o, &g)) in orig.iter().zip(&got).enumerate() {
            assert_eq!(scaled(o), g, "{dtype} transposed element {i}");
        }
        let got = other.to_vec_f64();
        for (i, (&o, &g)) in orig.iter().zip(&got).enumerate() {
            let want = if i % 3 == 1 { scaled(o) } else { o };
            assert_eq!(want, g, "{dtype} sliced element {i}");
        }
    }
}

#[test]
fn views_of_one_storage() {
    // disjoint halves: both unscaled once; overlapping views: the overlap twice, as
    // PyTorch's loop over the list would do
    let flat = Tensor::ones([200_000], DType::F32);
    let a = flat.narrow(0usize, 0, 100_000).unwrap();
    let b = flat.narrow(0usize, 100_000, 100_000).unwrap();
    let fi = scalar_f32(0.0);
    non_finite_check_and_unscale_(&[b, a], &fi, &scalar_f32(0.5)).unwrap();
    assert!(flat.to_vec_f64().iter().all(|&x| x == 0.5));

    let flat = Tensor::ones([10], DType::F32);
    let a = flat.narrow(0usize, 0, 6).unwrap();
    let b = flat.narrow(0usize, 4, 6).unwrap();
    non_finite_check_and_unscale_(&[a, b], &fi, &scalar_f32(0.5)).unwrap();
    assert_eq!(
        flat.to_vec_f64(),
        vec![0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.5, 0.5, 0.5, 0.5]
    );
    assert_eq!(found(&fi), 0.0);
}

#[test]
fn unscale_argument_errors() {
    let g = [Tensor::ones([4], DType::F32)];
    let e = non_finite_check_and_unscale_(&g, &Tensor::zeros([1], DType::F64), &scalar_f32(1.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("found_inf must be a float tensor."), "{e}");
    let e = non_finite_check_and_unscale_(&g, &scalar_f32(0.0), &Tensor::ones([2], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("inv_scale must be a 1-element tensor."), "{e}");
    // an integer grad fails before anything is touched
    let grads = [Tensor::ones([4], DType::F32), Tensor::ones([4], DType::I64)];
    let e = non_finite_check_and_unscale_(&grads, &scalar_f32(0.0), &scalar_f32(0.5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not implemented for 'Long'"), "{e}");
    assert!(grads[0].to_vec_f64().iter().all(|&x| x == 1.0));
    // a broadcast (self-overlapping) grad is refused
    let exp = Tensor::ones([1], DType::F32).expand([4i64]).unwrap();
    assert!(non_finite_check_and_unscale_(&[exp], &scalar_f32(0.0), &scalar_f32(0.5)).is_err());
}

// ----- update_scale_ ----------------------------------------------------------------------

struct State {
    scale: Tensor,
    tracker: Tensor,
}

impl State {
    fn new(scale: f32, tracker: i32) -> Self {
        State {
            scale: Tensor::from_vec(vec![scale], ()).unwrap(),
            tracker: Tensor::from_vec(vec![tracker], ()).unwrap(),
        }
    }
    fn step(&self, found_inf: f32, growth: f64, backoff: f64, interval: i64) {
        update_scale_(
            &self.scale,
            &self.tracker,
            &Tensor::from_vec(vec![found_inf], ()).unwrap(),
            growth,
            backoff,
            interval,
        )
        .unwrap();
    }
    fn get(&self) -> (f32, i32) {
        (
            self.scale.item::<f32>().unwrap(),
            self.tracker.item::<i32>().unwrap(),
        )
    }
}

#[test]
fn growth_is_computed_in_double_then_rounded() {
    let s = State::new(3.0, 0);
    s.step(0.0, 1.1, 0.5, 1);
    let (scale, tracker) = s.get();
    assert_eq!(scale as f64, 3.299999952316284);
    assert_ne!(scale, 3.0f32 * 1.1f32);
    assert_eq!(tracker, 0);
}

#[test]
fn backoff_walks_through_subnormals_to_zero() {
    let s = State::new(1e-37, 5);
    let mut want = 1e-37f32;
    let mut saw_subnormal = false;
    for _ in 0..200 {
        s.step(1.0, 2.0, 0.5, 100);
        want = (want as f64 * 0.5) as f32;
        let (scale, tracker) = s.get();
        assert_eq!(scale.to_bits(), want.to_bits());
        assert_eq!(tracker, 0);
        saw_subnormal |= scale != 0.0 && !scale.is_normal();
    }
    assert!(saw_subnormal);
    assert_eq!(s.get().0, 0.0);
}

#[test]
fn growth_that_would_overflow_is_dropped_and_tracker_reset() {
    let s = State::new(f32::MAX / 1.5, 1);
    s.step(0.0, 2.0, 0.5, 2);
    assert_eq!(s.get(), (f32::MAX / 1.5, 0));
}

#[test]
fn tracker_counts_and_resets() {
    let s = State::new(65536.0, 0);
    s.step(0.0, 2.0, 0.5, 3);
    assert_eq!(s.get(), (65536.0, 1));
    s.step(0.0, 2.0, 0.5, 3);
    assert_eq!(s.get(), (65536.0, 2));
    s.step(0.0, 2.0, 0.5, 3);
    assert_eq!(s.get(), (131072.0, 0));
    s.step(0.0, 2.0, 0.5, 3);
    assert_eq!(s.get(), (131072.0, 1));
    s.step(1.0, 2.0, 0.5, 3);
    assert_eq!(s.get(), (65536.0, 0));
    // any non-zero found_inf (a sum over optimizers, NaN) backs off
    s.step(2.0, 2.0, 0.5, 3);
    assert_eq!(s.get(), (32768.0, 0));
    s.step(f32::NAN, 2.0, 0.5, 3);
    assert_eq!(s.get(), (16384.0, 0));
}

#[test]
fn update_argument_errors() {
    let s = State::new(1.0, 0);
    let fi = Tensor::from_vec(vec![0f32], ()).unwrap();
    let bad_tracker = Tensor::from_vec(vec![0i64], ()).unwrap();
    let e = update_scale_(&s.scale, &bad_tracker, &fi, 2.0, 0.5, 10)
        .unwrap_err()
        .to_string();
    assert!(e.contains("growth_tracker must be an int tensor."), "{e}");
    let bad_scale = Tensor::from_vec(vec![1f64], ()).unwrap();
    let e = update_scale_(&bad_scale, &s.tracker, &fi, 2.0, 0.5, 10)
        .unwrap_err()
        .to_string();
    assert!(e.contains("current_scale must be a float tensor."), "{e}");
}

/// The reference model of the update rule (PyTorch's `_amp_update_scale_`), on plain values.
fn model(scale: f32, tracker: i32, found_inf: f32, g: f64, b: f64, interval: i64) -> (f32, i32) {
    if found_inf != 0.0 {
        ((scale as f64 * b) as f32, 0)
    } else {
        let t = tracker + 1;
        if t as i64 == interval {
            let s = (scale as f64 * g) as f32;
            (if s.is_finite() { s } else { scale }, 0)
        } else {
            (scale, t)
        }
    }
}

fn found_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => Just(0.0f32),
        2 => Just(1.0f32),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NAN),
        1 => Just(3.0f32),
    ]
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(64))]

    #[test]
    fn update_rule_matches_the_model(
        init in prop_oneof![Just(65536.0f32), Just(3.0f32), Just(1e-40f32), Just(3.0e38f32), 1e-3f32..1e6f32],
        growth in prop_oneof![Just(2.0f64), Just(1.1f64), 1.0001f64..8.0],
        backoff in prop_oneof![Just(0.5f64), Just(0.3f64), 0.01f64..0.9999],
        interval in 1i64..6,
        seq in proptest::collection::vec(found_value(), 1..80),
    ) {
        let s = State::new(init, 0);
        let (mut ms, mut mt) = (init, 0i32);
        for f in seq {
            s.step(f, growth, backoff, interval);
            let next = model(ms, mt, f, growth, backoff, interval);
            ms = next.0;
            mt = next.1;
            let (gs, gt) = s.get();
            prop_assert_eq!(gs.to_bits(), ms.to_bits());
            prop_assert_eq!(gt, mt);
        }
    }
}

#[test]
fn non_contiguous_one_element_state_tensors() {
    // 1-element views with an offset into larger storage
    let big = Tensor::from_vec(vec![0f32, 0.0, 8.0, 0.0], [4]).unwrap();
    let scale = Tensor::from_storage(
        amp_tensor::CpuStorage::F32(vec![0.0, 0.0, 8.0]),
        Layout::new(vec![1], vec![1], 2),
    )
    .unwrap();
    let tracker = Tensor::from_vec(vec![0i32], [1]).unwrap();
    update_scale_(&scale, &tracker, &scalar_f32(1.0), 2.0, 0.5, 10).unwrap();
    assert_eq!(scale.item::<f32>().unwrap(), 4.0);
    let fi = big.narrow(0usize, 1, 1).unwrap();
    let g = [Tensor::from_vec(vec![f32::INFINITY], [1]).unwrap()];
    non_finite_check_and_unscale_(&g, &fi, &scalar_f32(0.5)).unwrap();
    assert_eq!(big.to_vec_f64(), vec![0.0, 1.0, 8.0, 0.0]);
}
