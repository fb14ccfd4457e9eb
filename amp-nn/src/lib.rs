//! Layers and losses for the amp workspace, with a `Module` trait (named parameters,
//! train/eval, state dicts named like PyTorch's) and PyTorch's default initialisation.
//!
//! ```
//! use amp_nn::{Linear, Module, ReLU, Sequential};
//! use amp_tensor::{DType, Generator};
//!
//! # fn main() -> amp_autograd::Result<()> {
//! let mut gen = Generator::new(0);
//! let model = Sequential::new()
//!     .add(Linear::new(4, 8, &mut gen)?)
//!     .add(ReLU)
//!     .add(Linear::new(8, 2, &mut gen)?);
//! let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
//! let x = amp_autograd::Tensor::randn([3, 4], DType::F32, &mut gen)?;
//! assert_eq!(model.forward(&x)?.dims(), &[3, 2]);
//! # Ok(())
//! # }
//! ```

mod conv;
mod extra;
mod init;
mod layers;
mod loss;
mod module;
mod norm;
mod pool;
mod rnn;
mod transformer;

pub use conv::{
    Conv1d, Conv2d, Conv3d, ConvOptions, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
};
pub use extra::{
    Bilinear, CTCLoss, CosineEmbeddingLoss, GroupNorm, HingeEmbeddingLoss, KLDivLoss,
    MarginRankingLoss, MultiLabelMarginLoss, MultiMarginLoss, MultiheadAttention, PReLU,
    PoissonNLLLoss, SoftMarginLoss, TripletMarginLoss,
};
pub use init::{kaiming_normal, kaiming_uniform_default, uniform, xavier_uniform};
pub use layers::{Dropout, LayerNorm, Linear, ReLU, Sequential, Sigmoid, Tanh, GELU};
pub use loss::{BCEWithLogitsLoss, CrossEntropyLoss, MSELoss};
pub use module::{named_present, prefix_names, prefixed, Module};
pub use norm::{BatchNorm1d, BatchNorm2d, BatchNorm3d};
pub use pool::*;
pub use rnn::{CellParams, GRUCell, LSTMCell, RNNCell, RecurrentConfig, GRU, LSTM};
pub use transformer::{
    square_subsequent_mask, Activation, TransformerEncoderLayer, TransformerEncoderLayerOptions,
};
