//! Automatic mixed precision for Rust: PyTorch's `autocast` + `GradScaler`, as a
//! facade over the amp microcrates. `use amp::prelude::*;` brings tensors, autograd
//! ops, autocast, the scaler, optimizers and layers.
//!
//! The typical mixed-precision training step (the "Typical Mixed Precision Training" loop of PyTorch's AMP examples):
//!
//! ```
//! use amp::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut gen = Generator::new(0);
//! let model = Sequential::new().add(Linear::new(8, 16, &mut gen)?).add(ReLU).add(Linear::new(16, 4, &mut gen)?);
//! let mut opt = Sgd::new(model.parameters(), 0.05, SgdOptions::default())?;
//! let mut scaler = GradScaler::new();
//! let x = Tensor::randn([32, 8], DType::F32, &mut gen)?;
//! let y = Tensor::randn([32, 4], DType::F32, &mut gen)?;
//! for _ in 0..3 {
//!     opt.zero_grad();
//!     // forward (and the loss) under autocast: linear runs in bfloat16 on the CPU
//!     let loss = try_autocast(DeviceType::Cpu, DType::BF16, || {
//!         let out = model.forward(&x)?;
//!         ops::mse_loss(&out, &y, Reduction::Mean)
//!     })?;
//!     // backward outside autocast, on the scaled loss
//!     scaler.scale(&loss)?.backward()?;
//!     scaler.step(&mut opt)?;   // unscales, skips the step on inf/NaN
//!     scaler.update()?;
//! }
//! assert!(model.parameters().iter().all(|p| p.dtype() == DType::F32));
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "checkpoint")]
pub use amp_checkpoint as checkpoint;
#[cfg(feature = "distributed")]
pub use amp_distributed as distributed;

pub use amp_autocast as autocast;
pub use amp_autograd as autograd;
pub use amp_kernels as kernels;
pub use amp_nn as nn;
pub use amp_optim as optim;
pub use amp_policy as policy;
pub use amp_scaler as scaler;
pub use amp_tensor as tensor;

/// Everything a training loop needs.
pub mod prelude {
    pub use amp_autocast::{autocast, custom_fwd, traced, try_autocast, Autocast, AutocastGuard};
    pub use amp_autograd::{
        apply, grad, no_grad, ops, BackwardOptions, Ctx, Function, GradOptions, Reduction, Tensor,
    };
    pub use amp_nn::{
        square_subsequent_mask, Activation, BatchNorm1d, BatchNorm2d, CrossEntropyLoss, Dropout,
        Embedding, LayerNorm, Linear, MSELoss, Module, MultiheadAttention, ReLU, RecurrentConfig,
        Sequential, Sigmoid, Tanh, TransformerEncoderLayer, TransformerEncoderLayerOptions, GELU,
        GRU, LSTM,
    };
    pub use amp_optim::{
        adamw, clip_grad_norm_, clip_grad_value_, Adam, AdamOptions, ClipGradNormOptions,
        Optimizer, Sgd, SgdOptions, WarmupCosine,
    };
    pub use amp_policy::{CastPolicy, DeviceType, Profile};
    pub use amp_scaler::{GradScaler, GradScalerOptions, StepOutcome};
    pub use amp_tensor::{DType, Device, Generator};
}
