//! Casts against `half`'s scalar conversions, for every 16-bit pattern.

use amp_tensor::half::{bf16, f16};
use amp_tensor::{DType, Tensor};

/// Every 16-bit pattern of `T` widened to float32 (checked by `widened`) and narrowed
/// back: the same bits, NaN as `nan` says.
fn round_trip<T: amp_tensor::Element>(
    dtype: DType,
    from_bits: fn(u16) -> T,
    to_bits: fn(T) -> u16,
    widened: impl Fn(u16, f32),
    nan: impl Fn(u16, T),
) {
    let all: Vec<T> = (0..=u16::MAX).map(from_bits).collect();
    let h = Tensor::from_vec(all, [1 << 16]).unwrap();
    let f = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    for (i, &v) in f.iter().enumerate() {
        widened(i as u16, v);
    }
    let back = Tensor::from_vec(f, [1 << 16])
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    for (i, &b) in back.to_vec::<T>().unwrap().iter().enumerate() {
        let orig = from_bits(i as u16);
        if orig.to_f64().is_nan() {
            nan(i as u16, b);
        } else {
            assert_eq!(to_bits(b), to_bits(orig), "pattern {i:#06x}");
        }
    }
}

#[test]
fn every_f16_pattern_widens_exactly_and_round_trips() {
    round_trip(
        DType::F16,
        f16::from_bits,
        f16::to_bits,
        |i, v| {
            let want = f16::from_bits(i).to_f32();
            assert!(
                v == want || (v.is_nan() && want.is_nan()),
                "pattern {i:#06x}"
            );
        },
        |_, b| assert!(b.is_nan()),
    );
}

#[test]
fn every_bf16_pattern_widens_exactly_and_round_trips() {
    round_trip(
        DType::BF16,
        bf16::from_bits,
        bf16::to_bits,
        |i, v| assert_eq!(v.to_bits(), (i as u32) << 16, "pattern {i:#06x}"),
        |_, b| assert_eq!(b.to_bits(), 0x7FC0, "NaN is PyTorch's canonical NaN"),
    );
}

/// Every f32 whose upper 16 bits are any pattern and whose lower bits sit at and around
/// the rounding boundary: narrowing must match `half` (round to nearest even).
#[test]
fn narrowing_rounds_to_nearest_even_like_half() {
    let mut src = Vec::with_capacity(1 << 19);
    for hi in 0..=u16::MAX as u32 {
        for lo in [
            0x0000u32, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1000, 0xF000,
        ] {
            src.push(f32::from_bits(hi << 16 | lo));
        }
    }
    let n = src.len();
    let t = Tensor::from_vec(src.clone(), [n]).unwrap();
    let b = t.to_dtype(DType::BF16).unwrap().to_vec::<bf16>().unwrap();
    let h = t.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap();
    for i in 0..n {
        let x = src[i];
        if x.is_nan() {
            assert!(b[i].is_nan() && h[i].is_nan());
            continue;
        }
        assert_eq!(b[i].to_bits(), bf16::from_f32(x).to_bits(), "bf16 of {x:e}");
        assert_eq!(h[i].to_bits(), f16::from_f32(x).to_bits(), "f16 of {x:e}");
    }
}

#[test]
fn every_pair_of_dtypes_converts() {
    let vals = [0.0, 1.0, -2.5, 3.75, 1e5, -0.0];
    for from in DType::ALL {
        let t = Tensor::from_vec(vals.to_vec(), [6])
            .unwrap()
            .to_dtype(from)
            .unwrap();
        for to in DType::ALL {
            let u = t.to_dtype(to).unwrap();
            assert_eq!(u.dtype(), to);
            assert_eq!(u.dims(), &[6]);
            // converting to f64 and back agrees with a direct conversion for exact values
            let via = u.to_vec_f64();
            assert_eq!(via.len(), 6);
        }
    }
    let i = Tensor::from_vec(vec![2.9f32, -2.9, f32::NAN], [3])
        .unwrap()
        .to_dtype(DType::I64)
        .unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![2, -2, i64::MIN]);
    let b = Tensor::from_vec(vec![0.0f32, 0.5, f32::NAN], [3])
        .unwrap()
        .to_dtype(DType::Bool)
        .unwrap();
    assert_eq!(b.to_vec::<bool>().unwrap(), vec![false, true, true]);
}

#[test]
fn strided_source_casts() {
    let t = Tensor::from_vec((0..12).map(|v| v as f32 + 0.5).collect::<Vec<_>>(), [3, 4]).unwrap();
    let tt = t.transpose(0, 1).unwrap().to_dtype(DType::BF16).unwrap();
    assert_eq!(tt.dims(), &[4, 3]);
    assert_eq!(tt.to_vec_f64()[..3], [0.5, 4.5, 8.5]);
}

/// The float16 conversions run on the CPU's conversion instructions (16 or 8 lanes) with
/// a scalar tail. Against `half`'s software (const) conversions: every f32 around each float16 rounding boundary (the low 13 bits at
/// and beside the halfway point, both parities), plus pseudo-random low bits, must give
/// the same bits, NaN payloads included, at every slice length's tail position.
#[test]
fn float16_conversions_match_half_bit_for_bit() {
    let mut src = Vec::with_capacity(1 << 20);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for hi in 0..=u16::MAX as u32 {
        for lo in [
            0x0000u32, 0x0FFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x3001, 0xFFFF,
        ] {
            src.push(f32::from_bits(hi << 16 | lo));
        }
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        src.push(f32::from_bits(hi << 16 | (state >> 48) as u32));
    }
    for len in [src.len(), 1, 7, 8, 15, 16, 17, 33] {
        let s = &src[src.len() - len..];
        let mut h = vec![f16::ZERO; len];
        amp_tensor::cast_into(s, &mut h);
        for (x, got) in s.iter().zip(&h) {
            let want = f16::from_f32_const(*x);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "f16 of {:#010x}",
                x.to_bits()
            );
        }
    }
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for len in [all.len(), 1, 9, 16, 31] {
        let s = &all[all.len() - len..];
        let mut f = vec![0f32; len];
        amp_tensor::cast_into(s, &mut f);
        for (h, got) in s.iter().zip(&f) {
            let want = h.to_f32_const();
            assert_eq!(got.to_bits(), want.to_bits(), "f32 of {:#06x}", h.to_bits());
        }
    }
}
