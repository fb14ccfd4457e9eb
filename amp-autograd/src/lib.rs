//! Reverse-mode automatic differentiation for the amp workspace: a tape of recorded
//! ops with double backward, and the one dispatch point every op enters (where
//! autocast plugs in as a layer).
//!
//! ```
//! use amp_autograd::{grad, ops, GradOptions, Tensor};
//! use amp_tensor::DType;
//!
//! # fn main() -> amp_autograd::Result<()> {
//! let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3])?;
//! w.requires_grad_(true)?;
//! let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3])?;
//! // y = sum((w * x)^2); dy/dw = 2 * w * x^2
//! let y = ops::sum_all(&ops::square(&ops::mul(&w, &x)?)?)?;
//! y.backward()?;
//! assert_eq!(w.grad().unwrap().to_vec::<f32>()?, vec![0.5, 4.0, 24.0]);
//!
//! // A bfloat16 cast on the way keeps the leaf's gradient float32.
//! w.zero_grad();
//! let y = ops::sum_all(&w.to_dtype(DType::BF16)?)?;
//! y.backward()?;
//! assert_eq!(w.grad().unwrap().dtype(), DType::F32);
//!
//! // Gradients of gradients (create_graph), as a gradient penalty needs.
//! let y = ops::sum_all(&ops::pow_scalar(&w, 3.0)?)?;
//! let g = grad(&[y], &[w.clone()], &[], GradOptions { create_graph: true, ..Default::default() })?;
//! let gg = grad(&[ops::sum_all(&g[0].clone().unwrap())?], &[w.clone()], &[], GradOptions::default())?;
//! assert_eq!(gg[0].as_ref().unwrap().to_vec::<f32>()?, vec![6.0, 12.0, 18.0]);
//! # Ok(())
//! # }
//! ```

mod dispatch;
mod engine;
mod error;
mod function;
mod grad_mode;
mod graph;
mod operators;
pub mod ops;
mod tensor;

pub use dispatch::{
    current_layer, dispatch, dispatch_read_as, install_layer, is_layer_excluded, BodyGuard,
    BodyMode, CallKind, DispatchLayer, LayerGuard, OpCall, OpName,
};
pub use engine::{backward, grad, GradOptions};
pub use error::{Error, Result};
pub use function::{apply, Ctx, Function};
pub use grad_mode::{enable_grad, is_grad_enabled, no_grad, no_grad_guard, GradModeGuard};
pub use graph::{needs_grad, record, record_multi, BackwardFn};
pub use ops::Reduction;
pub use tensor::{BackwardOptions, HookHandle, PostAccumulateGradHook, Tensor};

pub use amp_tensor;
