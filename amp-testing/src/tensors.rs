//! Seeded test data and per-dtype tolerances.
//!
//! `uniform` needs nothing; with the `tensor` feature come seeded standard-normal values
//! and raw tensors, `bits` (a result's values for comparing bit for bit) (the workspace's ChaCha8 generator, so a seed names the same values
//! everywhere), `tolerance`, `Tolerances` and `assert_close_as` (one tolerance per
//! floating dtype; `DType::FLOATS` lists the dtypes) and the dtype type of
//! `each_dtype!`; with the `autograd` feature the leaves of autograd tests (`leaf`,
//! `randn_leaf`, `uniform_leaf`).

/// `n` deterministic pseudo-random values, uniform in `[-w, w)`: a 64-bit LCG from
/// `seed`, its top 53 bits as the fraction (no generator crate, the same on every
/// machine).
///
/// ```
/// let v = amp_testing::tensors::uniform(4, 7, 2.0);
/// assert_eq!(v, amp_testing::tensors::uniform(4, 7, 2.0));
/// assert!(v.iter().all(|x| (-2.0..2.0).contains(x)));
/// ```
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

#[cfg(feature = "tensor")]
pub use raw::*;

#[cfg(feature = "tensor")]
mod raw {
    use amp_tensor::Tensor as Raw;
    pub use amp_tensor::{DType, Generator};

    /// A standard-normal raw tensor of `dtype` from `seed`.
    pub fn raw_randn(dims: &[usize], dtype: DType, seed: u64) -> Raw {
        Raw::randn(dims.to_vec(), dtype, &mut Generator::new(seed)).unwrap()
    }

    /// Standard-normal float64 values from `seed` (the values of
    /// `raw_randn(dims, F64, seed)`).
    pub fn randn_vec(dims: &[usize], seed: u64) -> Vec<f64> {
        raw_randn(dims, DType::F64, seed).to_vec_f64()
    }

    /// The bits of `t`'s values widened to float64 (exact from every floating dtype), for
    /// tests that compare two results bit for bit.
    ///
    /// ```
    /// use amp_testing::tensors::{bits, raw_randn, DType};
    /// let t = raw_randn(&[3], DType::BF16, 1);
    /// assert_eq!(bits(&t), bits(&t.clone()));
    /// ```
    pub fn bits(t: &Raw) -> Vec<u64> {
        t.to_vec_f64().iter().map(|v| v.to_bits()).collect()
    }

    /// One tolerance per floating dtype: a test's own table where [`tolerance`]'s does
    /// not fit (a longer computation, a tighter kernel).
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct Tolerances {
        /// float16.
        pub f16: f64,
        /// bfloat16.
        pub bf16: f64,
        /// float32.
        pub f32: f64,
        /// float64 (and any other dtype).
        pub f64: f64,
    }

    impl Tolerances {
        /// The tolerance of `dtype`.
        pub fn of(&self, dtype: DType) -> f64 {
            match dtype {
                DType::F16 => self.f16,
                DType::BF16 => self.bf16,
                DType::F32 => self.f32,
                _ => self.f64,
            }
        }
    }

    /// The kit's default table: a few roundings of each type's epsilon (bf16 2⁻⁸, f16
    /// 2⁻¹¹, f32 2⁻²⁴), for a short computation against a float64 (or, for the 16-bit
    /// types, float32) reference.
    pub const TOLERANCES: Tolerances = Tolerances {
        f16: 4e-3,
        bf16: 3e-2,
        f32: 1e-5,
        f64: 1e-12,
    };

    /// The relative tolerance of a result computed in `dtype`: [`TOLERANCES`]`.of(dtype)`.
    pub fn tolerance(dtype: DType) -> f64 {
        TOLERANCES.of(dtype)
    }

    /// Assert `|got - want| <= tolerance(dtype)·max(|want|, 1)` elementwise (a NaN
    /// wants a NaN), naming `what` and the first element at fault.
    ///
    /// # Panics
    /// When the lengths differ or an element is out of tolerance.
    pub fn assert_close_as(got: &[f64], want: &[f64], dtype: DType, what: &str) {
        assert_close_within(got, want, tolerance(dtype), what);
    }

    /// [`assert_close_as`] with an explicit relative tolerance `rtol`.
    ///
    /// # Panics
    /// When the lengths differ or an element is out of tolerance.
    pub fn assert_close_within(got: &[f64], want: &[f64], rtol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            let ok = if b.is_nan() {
                a.is_nan()
            } else if b.is_infinite() {
                a == b
            } else {
                (a - b).abs() <= rtol * b.abs().max(1.0)
            };
            assert!(ok, "{what}: element {i}: got {a}, want {b}");
        }
    }

    /// Assert that the raw tensor `got` is contiguous with `shape` and `dtype`, and holds
    /// `want` (exact float64 values) rounded to `dtype`, as [`assert_close_within`]
    /// compares: a NaN wants a NaN, an infinity (an overflow of the rounding included)
    /// the same infinity, anything else `rtol`·max(|want|, 1).
    ///
    /// # Panics
    /// When any of these differs.
    pub fn assert_tensor_close(
        got: &Raw,
        want: &[f64],
        shape: &[usize],
        dtype: DType,
        rtol: f64,
        what: &str,
    ) {
        assert_eq!(got.dims(), shape, "{what}: shape");
        assert_eq!(got.dtype(), dtype, "{what}: dtype");
        assert!(got.is_contiguous(), "{what}: contiguous");
        let rounded = Raw::from_vec(want.to_vec(), [want.len()])
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_vec_f64();
        assert_close_within(&got.to_vec_f64(), &rounded, rtol, what);
    }
}

#[cfg(feature = "autograd")]
pub use leaves::*;

#[cfg(feature = "autograd")]
mod leaves {
    use amp_autograd::amp_tensor::{DType, Generator, Tensor as Raw};
    use amp_autograd::Tensor;

    fn requiring_grad(t: Tensor) -> Tensor {
        t.requires_grad_(true).unwrap();
        t
    }

    /// A float64 leaf that requires grad, holding `values` in `dims`.
    pub fn leaf(values: Vec<f64>, dims: &[usize]) -> Tensor {
        requiring_grad(Tensor::from_vec(values, dims.to_vec()).unwrap())
    }

    /// A standard-normal float64 leaf that requires grad, drawn from `gen`.
    pub fn randn_leaf(dims: &[usize], gen: &mut Generator) -> Tensor {
        requiring_grad(Tensor::from_raw(
            Raw::randn(dims.to_vec(), DType::F64, gen).unwrap(),
        ))
    }

    /// A float64 leaf that requires grad, uniform in `[lo, hi)` from `seed`.
    pub fn uniform_leaf(dims: &[usize], seed: u64, lo: f64, hi: f64) -> Tensor {
        let r = Raw::uniform(dims.to_vec(), lo, hi, DType::F64, &mut Generator::new(seed));
        requiring_grad(Tensor::from_raw(r.unwrap()))
    }
}

/// Defines a test module `$name` whose body runs once per dtype, one `#[test]` each
/// (`$name::F64`, `$name::F32`, `$name::BF16`, `$name::F16`, named after the variants),
/// the dtype bound to `$d` (an `amp_tensor::DType`; needs the `tensor` feature). With
/// `in [F32, BF16]` the tests are only those dtypes'. The module sees its parent's
/// items (`use super::*`).
///
/// ```ignore
/// amp_testing::each_dtype! {
///     fn zeros_are_zero(d) {
///         let t = amp_tensor::Tensor::zeros([3], d);
///         assert_eq!(t.to_vec_f64(), [0.0; 3]);
///     }
/// }
/// amp_testing::each_dtype! {
///     fn halves_only(d in [BF16, F16]) {
///         assert_eq!(d.size_in_bytes(), 2);
///     }
/// }
/// ```
#[macro_export]
macro_rules! each_dtype {
    ($(#[$meta:meta])* fn $name:ident($d:ident) $body:block) => {
        $crate::each_dtype! {
            $(#[$meta])* fn $name($d in [F64, F32, BF16, F16]) $body
        }
    };
    ($(#[$meta:meta])* fn $name:ident($d:ident in [$($dt:ident),+ $(,)?]) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($d: $crate::tensors::DType) $body

            $(
                #[test]
                #[allow(non_snake_case)]
                fn $dt() {
                    body($crate::tensors::DType::$dt)
                }
            )+
        }
    };
}
