//! Casts whose output reaches `STREAM_BYTES` take the streaming-store path: the values
//! must be those of the ordinary element conversion, bit for bit (ties to even,
//! NaN -> 0x7FC0 for bfloat16, overflow to inf, subnormals), at every alignment.

use amp_tensor::half::{bf16, f16};
use amp_tensor::{cast_into, cast_slice, STREAM_BYTES};

/// Values that exercise rounding, specials and subnormals, then a pseudo-random tail.
fn source(n: usize) -> Vec<f32> {
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        f32::from_bits(0x3F80_8000), // bf16 tie, rounds to even (down)
        f32::from_bits(0x3F81_8000), // bf16 tie, rounds to even (up)
        f32::from_bits(0x3F80_7FFF),
        65504.0,
        65520.0, // f16 overflow to inf
        1e-8,    // f16 subnormal / underflow
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),           // f32 subnormal, rounds to 0 in bf16
        f32::from_bits(0x007F_0000), // f32 subnormal kept as a bf16 subnormal
        f32::from_bits(0x8001_8000), // negative subnormal on a bf16 tie
        f32::from_bits(0x007F_FFFF), // largest subnormal: rounds up to MIN_POSITIVE
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0xFFC0_0001), // negative NaN with payload
        f32::from_bits(0x7F80_0001), // signalling NaN
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| {
            if i % 97 < specials.len() {
                specials[i % 97]
            } else {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                f32::from_bits(state as u32)
            }
        })
        .collect()
}

fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        0x7FC0
    } else {
        bf16::from_f32(x).to_bits()
    }
}

#[test]
fn streaming_casts_match_the_element_conversion() {
    let n = STREAM_BYTES / 2 + 1000;
    let src = source(n);
    // Offsets 0..3 shift the source against the output's alignment.
    for off in [0usize, 1, 3] {
        let s = &src[off..];
        let got: Vec<bf16> = cast_slice(s).unwrap();
        let bad = got
            .iter()
            .zip(s)
            .position(|(g, &x)| g.to_bits() != bf16_bits(x));
        assert_eq!(bad, None, "bf16 offset {off}: first mismatch at {bad:?}");
        // float16: the same bits as the ordinary (non-streaming) conversion, NaN
        // payloads included; and the value `half` gives for every non-NaN.
        let got: Vec<f16> = cast_slice(s).unwrap();
        let mut want = vec![f16::ZERO; s.len()];
        cast_into(s, &mut want);
        let bad = got.iter().zip(&want).zip(s).position(|((g, w), &x)| {
            g.to_bits() != w.to_bits() || (!x.is_nan() && g.to_bits() != f16::from_f32(x).to_bits())
        });
        assert_eq!(bad, None, "f16 offset {off}: first mismatch at {bad:?}");
    }
}
