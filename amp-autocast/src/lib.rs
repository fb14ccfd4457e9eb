//! Autocast for the amp workspace: thread-local regions in which each op runs in the
//! precision its documented policy asks for, applied as one layer at the autograd
//! dispatch point.
//!
//! ```
//! use amp_autocast::{try_autocast, Autocast};
//! use amp_autograd::{ops, Tensor};
//! use amp_policy::DeviceType;
//! use amp_tensor::DType;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
//! let w = Tensor::from_vec(vec![0.5f32, 0.25, -1.0, 2.0], [2, 2])?;
//! w.requires_grad_(true)?;
//! let (y, loss) = try_autocast(DeviceType::Cpu, DType::BF16, || -> amp_autograd::Result<_> {
//!     let y = ops::mm(&a, &w)?;               // on the cpu lower-precision list: bfloat16
//!     let loss = ops::mse_loss(&y, &a, Default::default())?; // fp32 list: float32
//!     Ok((y, loss))
//! })?;
//! assert_eq!(y.dtype(), DType::BF16);
//! assert_eq!(loss.dtype(), DType::F32);
//! loss.backward()?;
//! assert_eq!(w.grad().unwrap().dtype(), DType::F32); // float32 leaf, float32 grad
//!
//! // Nested regions: disabled inside enabled.
//! let _outer = Autocast::new(DeviceType::Cpu).enter()?;
//! {
//!     let _inner = Autocast::new(DeviceType::Cpu).enabled(false).enter()?;
//!     assert_eq!(ops::mm(&a, &w)?.dtype(), DType::F32);
//! }
//! assert_eq!(ops::mm(&a, &w)?.dtype(), DType::BF16);
//! # Ok(())
//! # }
//! ```

mod custom;
mod decision;
mod error;
mod layer;
mod region;
mod state;
mod trace;

pub use custom::{custom_fwd, CustomFwd};
pub use decision::{
    check_dtype, decide, default_dtype, is_eligible, supported_dtypes, ArgInfo, CallFlags, CastPlan,
};
pub use error::AutocastError;
pub use region::{autocast, traced, try_autocast, Autocast, AutocastGuard};
pub use state::{
    autocast_depth, cache_len, clear_autocast_cache, current_profile, device_state,
    get_autocast_dtype, global_profile, is_autocast_cache_enabled, is_autocast_enabled,
    set_global_profile, DeviceState,
};
pub use trace::{Trace, TraceEvent};
