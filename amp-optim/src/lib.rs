//! Optimizers for the amp workspace: SGD (momentum, dampening, Nesterov, weight
//! decay), Adam and AdamW (optional AMSGrad) with float32 state, gradient clipping,
//! and the scaling-aware step contract a `GradScaler` uses (PyTorch's AMP RFC, "Interaction
//! with New Custom Optimizers").
//!
//! ```
//! use amp_autograd::{ops, Tensor};
//! use amp_optim::{Optimizer, Sgd, SgdOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let w = Tensor::from_vec(vec![1.0f32, -2.0], [2])?;
//! w.requires_grad_(true)?;
//! let mut opt = Sgd::new(vec![w.clone()], 0.1, SgdOptions::default())?;
//! ops::sum_all(&ops::square(&w)?)?.backward()?; // grad = 2w
//! opt.step()?;
//! assert_eq!(w.to_vec::<f32>()?, vec![0.8, -1.6]);
//! opt.zero_grad();
//! assert!(w.grad().is_none());
//! # Ok(())
//! # }
//! ```

mod adam;
mod clip;
mod error;
mod groups;
pub mod json_float;
mod optimizer;
mod pyfloat;
mod schedule;
mod sgd;
mod state_dict;
mod update;

pub use adam::{adamw, Adam, AdamOptions};
pub use clip::{clip_grad_norm_, clip_grad_value_, ClipGradNormOptions};
pub use error::{Error, Result};
pub use optimizer::{IdSlot, Optimizer, OptimizerId, ParamGroup};
pub use pyfloat::PyFloat;
pub use schedule::WarmupCosine;
pub use sgd::{Sgd, SgdOptions};
pub use state_dict::{OptimizerStateDict, StateProblem, StateValue, TensorData};
