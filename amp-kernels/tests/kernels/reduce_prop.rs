//! Property test: `sum` and `mean` over random dim subsets (negative or not, any
//! order) of random shapes, dtypes and storage orders equal an f64 reference.

use amp_kernels::{mean, sum};
use amp_tensor::{DType, Tensor};
use proptest::prelude::*;

/// Deterministic pseudo-random values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f64> {
    amp_testing::tensors::uniform(n, seed, 1.0)
}

/// `sum` (or with `avg` `mean`) over the `mask`ed dims: the reduction module's reference.
fn reference(
    x: &[f64],
    shape: &[usize],
    mask: &[bool],
    keepdim: bool,
    avg: bool,
) -> (Vec<f64>, Vec<usize>) {
    super::reduce::reference(x, shape, mask, keepdim, &|g| {
        let s = g.iter().fold(0.0, |a, v| a + v);
        if avg {
            s / g.len() as f64
        } else {
            s
        }
    })
}

#[derive(Debug, Clone)]
struct Case {
    shape: Vec<usize>,
    perm: Vec<usize>,
    dims: Vec<i64>,
    keepdim: bool,
    dtype: DType,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=4)
        .prop_flat_map(|rank| {
            (
                proptest::collection::vec(1usize..=5, rank),
                Just((0..rank).collect::<Vec<_>>()).prop_shuffle(),
                proptest::collection::vec((any::<bool>(), any::<bool>()), rank),
                any::<bool>(),
                prop_oneof![
                    Just(DType::F16),
                    Just(DType::BF16),
                    Just(DType::F32),
                    Just(DType::F64)
                ],
                any::<u64>(),
            )
        })
        .prop_map(|(shape, perm, picks, keepdim, dtype, seed)| {
            let rank = shape.len() as i64;
            let dims = picks
                .iter()
                .enumerate()
                .filter(|(_, (take, _))| *take)
                .map(|(d, (_, neg))| if *neg { d as i64 - rank } else { d as i64 })
                .rev()
                .collect();
            Case {
                shape,
                perm,
                dims,
                keepdim,
                dtype,
                seed,
            }
        })
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(64))]

    #[test]
    fn sum_and_mean_match_reference(c in case()) {
        // store the data in a permuted order, then view it with the logical shape
        let stored: Vec<usize> = c.perm.iter().map(|&p| c.shape[p]).collect();
        let n: usize = c.shape.iter().product();
        let base = Tensor::from_vec(values(n, c.seed), stored).unwrap().to_dtype(c.dtype).unwrap();
        let mut inv = vec![0usize; c.perm.len()];
        for (i, &p) in c.perm.iter().enumerate() {
            inv[p] = i;
        }
        let x = base.permute(&inv).unwrap();
        prop_assert_eq!(x.dims(), &c.shape[..]);
        let xv = x.to_vec_f64();
        let rank = c.shape.len();
        let mut mask = vec![c.dims.is_empty(); rank];
        for &d in &c.dims {
            mask[(if d < 0 { d + rank as i64 } else { d }) as usize] = true;
        }
        let rtol = match c.dtype { DType::F16 => 2e-3, DType::BF16 => 1.6e-2, DType::F32 => 1e-5, _ => 1e-12 };
        for avg in [false, true] {
            let (want, shape) = reference(&xv, &c.shape, &mask, c.keepdim, avg);
            let got = if avg { mean(&x, &c.dims, c.keepdim, None) } else { sum(&x, &c.dims, c.keepdim, None) }.unwrap();
            prop_assert_eq!(got.dims(), &shape[..]);
            prop_assert_eq!(got.dtype(), c.dtype);
            for (a, b) in got.to_vec_f64().iter().zip(&want) {
                prop_assert!((a - b).abs() <= rtol * b.abs().max(1.0), "{:?}: got {} want {}", c, a, b);
            }
        }
    }
}
