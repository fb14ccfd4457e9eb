//! CPU kernels for the amp workspace: elementwise ops with broadcasting and type
//! promotion, reductions, softmax and friends, the matmul family (via `gemm`, f32
//! accumulation for 16-bit types), and the two AMP kernels (fused non-finite check +
//! unscale, and the scale update).
//!
//! Every function takes raw [`amp_tensor::Tensor`]s and returns a new tensor or an
//! error; nothing here knows about gradients or autocast.

pub use amp_tensor;

#[macro_use]
pub mod compute;

pub use compute::{ensure_float, ensure_same_device, with_slice, Real};

mod amp;
mod attention;
mod binary;
mod conv;
pub mod cuda;
mod half16;
mod index;
mod linalg;
mod matmul;
mod norm;
mod pad;
mod pool;
mod quantile;
mod reduce;
#[cfg(target_arch = "x86_64")]
mod rows512;
mod sample;
mod softmax;
mod ternary;
mod unary;
mod vmath;

pub use amp::*;
pub use attention::{flash_attention, flash_attention_backward, FlashOptions};
pub use binary::*;
pub use conv::*;
pub use index::*;
pub use linalg::*;
pub use matmul::*;
pub use norm::*;
pub use pad::*;
pub use pool::*;
pub use quantile::*;
pub use reduce::*;
pub use sample::*;
pub use softmax::*;
pub use ternary::*;
pub use unary::*;
