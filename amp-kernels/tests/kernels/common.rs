//! Helpers shared by the modules of this test binary.

/// `n` deterministic pseudo-random values, uniform in `[-w, w)`: a 64-bit LCG from
/// `seed`, its top 53 bits as the fraction.
pub fn uniform(n: usize, seed: u64, w: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * (2.0 * w) - w
        })
        .collect()
}
