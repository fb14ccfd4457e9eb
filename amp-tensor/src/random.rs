//! A seeded, reproducible random generator (ChaCha8: the same stream on every platform).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// The source of randomness for `rand`, `randn`, initialisers and dropout.
///
/// The same seed gives the same numbers on every machine and every run. (The stream
/// is not PyTorch's mt19937/Philox stream: seeds do not reproduce PyTorch's values.)
#[derive(Debug, Clone)]
pub struct Generator {
    rng: ChaCha8Rng,
    seed: u64,
}

impl Generator {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Generator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
        }
    }
    /// The seed it was created (or last re-seeded) with.
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }
    /// Restart from `seed` (PyTorch's `manual_seed`).
    pub fn manual_seed(&mut self, seed: u64) {
        *self = Generator::new(seed);
    }
    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform_range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        StandardNormal.sample(&mut self.rng)
    }
    /// Uniform integer in `[lo, hi)`.
    pub fn int_range(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.random_range(lo..hi)
    }
    /// `true` with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }
}

impl Default for Generator {
    /// Seed 0.
    fn default() -> Self {
        Generator::new(0)
    }
}
