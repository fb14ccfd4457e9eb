//! Tensors for automatic mixed precision: float16, bfloat16, float32 and float64 (plus
//! int32, int64 and bool), strided views over shared storage, and PyTorch's dtype rules.
//!
//! ```
//! use amp_tensor::{promote_types, DType, Tensor};
//!
//! # fn main() -> amp_tensor::Result<()> {
//! let x = Tensor::from_vec(vec![1.0f32, 2.5, -3.0, 65520.0], [2, 2])?;
//! // Round-to-nearest-even into float16: 65520 overflows to inf, as in PyTorch.
//! let h = x.to_dtype(DType::F16)?;
//! assert_eq!(h.to_vec_f64(), vec![1.0, 2.5, -3.0, f64::INFINITY]);
//!
//! // Views share storage: a transpose is not contiguous and copies nothing.
//! let t = x.transpose(0, 1)?;
//! assert!(t.is_view() && !t.is_contiguous());
//! assert_eq!(t.to_vec::<f32>()?, vec![1.0, -3.0, 2.5, 65520.0]);
//!
//! assert_eq!(promote_types(DType::F16, DType::BF16), DType::F32);
//! assert_eq!(DType::BF16.to_string(), "bfloat16");
//! # Ok(())
//! # }
//! ```
//!
//! Compute (elementwise ops, reductions, matmul) lives in `amp-kernels`; gradients in
//! `amp-autograd`. This crate owns the value type and host-side conversion.

mod convert;
pub mod cuda;
mod device;
mod dtype;
mod element;
mod error;
mod layout;
pub mod parallel;
pub mod pool;
mod random;
mod shape;
mod storage;
mod tensor;
mod transpose;

#[cfg(target_arch = "x86_64")]
pub use convert::simd;
pub use convert::{
    cast_into, cast_into_uninit, cast_slice, copy_cast, gather_cast, round_to_bf16, scatter_cast,
    transpose_into, PARALLEL_THRESHOLD, STREAM_BYTES,
};
pub use device::{Device, DeviceType};
pub use dtype::{promote_types, result_type, Category, DType, Operand, Scalar};
pub use element::{Element, Kind, ZeroBits};
pub use error::{Error, Result, SharedError};
pub use layout::{Layout, StridedOffsets};
pub use random::Generator;
pub use shape::{broadcast_shapes, wrap_dim, Dim, Shape};
pub use storage::{CpuStorage, Storage};
pub use tensor::{host_reads, IntoDims, Tensor};

/// Re-exported so users and the macros name the same 16-bit types.
pub use half;
