//! Casts against `half`'s scalar conversions, for every 16-bit pattern.

use amp_tensor::half::{bf16, f16};
use amp_tensor::{DType, Tensor};

fn all_f16() -> Vec<f16> {
    (0..=u16::MAX).map(f16::from_bits).collect()
}
fn all_bf16() -> Vec<bf16> {
    (0..=u16::MAX).map(bf16::from_bits).collect()
}

#[test]
fn every_f16_pattern_widens_exactly_and_round_trips() {
    let h = Tensor::from_vec(all_f16(), [1 << 16]).unwrap();
    let f = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    for (i, &v) in f.iter().enumerate() {
        let want = f16::from_bits(i as u16).to_f32();
        assert!(
            v == want || (v.is_nan() && want.is_nan()),
            "pattern {i:#06x}"
        );
    }
    let back = Tensor::from_vec(f, [1 << 16])
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap()
        .to_vec::<f16>()
        .unwrap();
    for (i, b) in back.iter().enumerate() {
        let orig = f16::from_bits(i as u16);
        if orig.is_nan() {
            assert!(b.is_nan());
        } else {
            assert_eq!(b.to_bits(), orig.to_bits(), "pattern {i:#06x}");
        }
    }
}

#[test]
fn every_bf16_pattern_widens_exactly_and_round_trips() {
    let h = Tensor::from_vec(all_bf16(), [1 << 16]).unwrap();
    let f = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    for (i, &v) in f.iter().enumerate() {
        assert_eq!(v.to_bits(), (i as u32) << 16, "pattern {i:#06x}");
    }
    let back = Tensor::from_vec(f, [1 << 16])
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    for (i, b) in back.iter().enumerate() {
        let orig = bf16::from_bits(i as u16);
        if orig.is_nan() {
            assert_eq!(b.to_bits(), 0x7FC0, "NaN is PyTorch's canonical NaN");
        } else {
            assert_eq!(b.to_bits(), orig.to_bits(), "pattern {i:#06x}");
        }
    }
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
