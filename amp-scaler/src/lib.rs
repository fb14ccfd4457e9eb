//! `GradScaler` for the amp workspace: dynamic loss scaling with PyTorch's exact
//! semantics — the same scale arithmetic bit for bit, the same state dict, the same
//! messages — plus opt-in extras (scale floor/ceiling, hysteresis, statistics).
//!
//! ```
//! use amp_autograd::{ops, Tensor};
//! use amp_optim::{Optimizer, Sgd, SgdOptions};
//! use amp_scaler::{GradScaler, GradScalerOptions, StepOutcome};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let w = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
//! w.requires_grad_(true)?;
//! let mut opt = Sgd::new(vec![w.clone()], 0.5, SgdOptions::default())?;
//! let mut scaler = GradScaler::with_options(GradScalerOptions::default().init_scale(1024.0))?;
//!
//! let loss = ops::sum_all(&ops::square(&w)?)?;     // grad = 2w
//! scaler.scale(&loss)?.backward()?;              // grads are 1024 * 2w
//! assert_eq!(scaler.step(&mut opt)?, StepOutcome::Stepped); // unscaled, then stepped
//! scaler.update()?;
//! assert_eq!(w.to_vec::<f32>()?, vec![0.0, 0.0]);
//! assert_eq!(scaler.state_dict().unwrap().to_json().to_string(),
//!     r#"{"scale":1024.0,"growth_factor":2.0,"backoff_factor":0.5,"growth_interval":2000,"_growth_tracker":1}"#);
//! # Ok(())
//! # }
//! ```

mod error;
mod options;
mod reduction;
mod scaler;
mod state_dict;
mod stats;

pub use error::{Result, ScalerError};
pub use options::GradScalerOptions;
pub use reduction::FoundInfReduction;
pub use scaler::{GradScaler, NewScale, Outputs, Stage, StepOutcome};
pub use state_dict::{ScalerStateDict, StateDictProblem};
pub use stats::ScalerStats;
