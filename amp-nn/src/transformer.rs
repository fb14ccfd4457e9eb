//! `nn.TransformerEncoderLayer`: self-attention and a feed-forward block, each with a
//! residual connection and a layer norm (after, or with `norm_first` before), built on
//! [`MultiheadAttention`], [`Linear`], [`LayerNorm`] and [`Dropout`].

use std::sync::Mutex;

use amp_autograd::{ops, Error, Result, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};

use crate::extra::MultiheadAttention;
use crate::layers::{Dropout, LayerNorm, Linear};
use crate::module::{prefix_names, Module};

/// The activation of the feed-forward block (PyTorch's `activation="relu" | "gelu"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// `max(x, 0)` (PyTorch's default).
    #[default]
    Relu,
    /// Exact GELU (`F.gelu`, `approximate="none"`).
    Gelu,
}

impl Activation {
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => ops::relu(x),
            Activation::Gelu => ops::gelu(x),
        }
    }
}

/// The settings of a [`TransformerEncoderLayer`]; `Default` gives PyTorch's
/// (`d_model` 512, `nhead` 8, `dim_feedforward` 2048, `dropout` 0.1, ReLU,
/// `layer_norm_eps` 1e-5, sequence first, norm after).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerEncoderLayerOptions {
    /// The embedding size `E` of inputs and outputs.
    pub d_model: usize,
    /// Attention heads (`d_model` must be a multiple).
    pub nhead: usize,
    /// The hidden size of the feed-forward block.
    pub dim_feedforward: usize,
    /// The dropout probability of the attention weights, of the hidden feed-forward
    /// activations and of both residual branches (training mode only).
    pub dropout: f64,
    /// The feed-forward activation.
    pub activation: Activation,
    /// The `eps` of both layer norms.
    pub layer_norm_eps: f64,
    /// `[N, L, E]` inputs and outputs instead of `[L, N, E]`.
    pub batch_first: bool,
    /// Pre-norm (`x + sa(norm1(x))`, then `x + ff(norm2(x))`) instead of post-norm
    /// (`norm1(x + sa(x))`, then `norm2(x + ff(x))`).
    pub norm_first: bool,
}

impl Default for TransformerEncoderLayerOptions {
    fn default() -> Self {
        TransformerEncoderLayerOptions {
            d_model: 512,
            nhead: 8,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
        }
    }
}

impl TransformerEncoderLayerOptions {
    /// `d_model` split over `nhead` heads, PyTorch's defaults for the rest.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        TransformerEncoderLayerOptions {
            d_model,
            nhead,
            ..Default::default()
        }
    }
}

/// `nn.TransformerEncoderLayer`, with PyTorch's parameters, names and initialisation:
/// `self_attn.in_proj_weight`, `self_attn.in_proj_bias`, `self_attn.out_proj.weight`,
/// `self_attn.out_proj.bias`, `linear1.weight`, `linear1.bias`, `linear2.weight`,
/// `linear2.bias`, `norm1.weight`, `norm1.bias`, `norm2.weight`, `norm2.bias`.
///
/// Dropout (on the attention weights, the hidden activations and both residual
/// branches) acts in training mode only ([`Module::train`] / [`Module::eval`]); its
/// masks come from generators seeded from the one the layer was made with.
///
/// ```
/// use amp_nn::{square_subsequent_mask, Activation, Module, TransformerEncoderLayer,
///     TransformerEncoderLayerOptions};
/// use amp_autograd::Tensor;
/// use amp_tensor::{DType, Generator};
/// # fn main() -> amp_autograd::Result<()> {
/// let opts = TransformerEncoderLayerOptions {
///     dim_feedforward: 32,
///     activation: Activation::Gelu,
///     batch_first: true,
///     norm_first: true,
///     ..TransformerEncoderLayerOptions::new(16, 4)
/// };
/// let layer = TransformerEncoderLayer::new(opts, &mut Generator::new(0))?;
/// let x = Tensor::ones([2, 5, 16], DType::F32); // [N, L, E]
/// let mask = square_subsequent_mask(5, DType::F32)?;
/// let y = layer.forward_with(&x, Some(&mask), true)?;
/// assert_eq!(y.dims(), [2, 5, 16]);
/// assert_eq!(layer.named_parameters()[0].0, "self_attn.in_proj_weight");
/// # Ok(())
/// # }
/// ```
pub struct TransformerEncoderLayer {
    /// The self-attention.
    pub self_attn: MultiheadAttention,
    /// `d_model → dim_feedforward`.
    pub linear1: Linear,
    /// On the hidden feed-forward activations.
    pub dropout: Dropout,
    /// `dim_feedforward → d_model`.
    pub linear2: Linear,
    /// Around the self-attention block.
    pub norm1: LayerNorm,
    /// Around the feed-forward block.
    pub norm2: LayerNorm,
    /// On the self-attention branch.
    pub dropout1: Dropout,
    /// On the feed-forward branch.
    pub dropout2: Dropout,
    /// The settings the layer was made with.
    pub options: TransformerEncoderLayerOptions,
    /// The generator of the dropout on the attention weights (`self_attn`'s dropout in
    /// PyTorch).
    attn_dropout: Mutex<Generator>,
    training: bool,
}

impl TransformerEncoderLayer {
    /// A layer with PyTorch's initialisation drawn from `gen` (the attention, then
    /// `linear1`, then `linear2`; layer norms at ones and zeros), then the seeds of the
    /// four dropout generators. Refused: `d_model` not a multiple of `nhead`, a dropout
    /// probability outside `[0, 1]`.
    pub fn new(options: TransformerEncoderLayerOptions, gen: &mut Generator) -> Result<Self> {
        let o = options;
        if !(0.0..=1.0).contains(&o.dropout) {
            return Err(Error::invalid(
                "TransformerEncoderLayer",
                format!(
                    "dropout probability has to be between 0 and 1, but got {}",
                    o.dropout
                ),
            ));
        }
        let self_attn = MultiheadAttention::new(o.d_model, o.nhead, o.batch_first, gen)?;
        let linear1 = Linear::new(o.d_model, o.dim_feedforward, gen)?;
        let linear2 = Linear::new(o.dim_feedforward, o.d_model, gen)?;
        let norm = || -> Result<LayerNorm> {
            let mut n = LayerNorm::new(&[o.d_model])?;
            n.eps = o.layer_norm_eps;
            Ok(n)
        };
        let mut seed = || gen.int_range(0, i64::MAX) as u64;
        Ok(TransformerEncoderLayer {
            self_attn,
            linear1,
            dropout: Dropout::new(o.dropout, seed()),
            linear2,
            norm1: norm()?,
            norm2: norm()?,
            dropout1: Dropout::new(o.dropout, seed()),
            dropout2: Dropout::new(o.dropout, seed()),
            attn_dropout: Mutex::new(Generator::new(seed())),
            options,
            training: true,
        })
    }

    /// The layer applied to `src` (`[N, L, E]` batch first, `[L, N, E]` otherwise, or
    /// unbatched `[L, E]`), as PyTorch's `forward(src, src_mask, is_causal=...)`.
    ///
    /// `src_mask` is `[L, L]` or `[N·nhead, L, L]`, boolean (`true`: may not attend) or
    /// float (added to the attention scores), as [`MultiheadAttention::attend`] takes it.
    /// `is_causal` is PyTorch's hint that the mask is the causal one
    /// ([`square_subsequent_mask`]): position `i` then attends to `0..=i` and the mask
    /// itself is not read (as PyTorch's attention does when there is no key padding
    /// mask); unlike PyTorch, the hint may also come without a mask, as
    /// [`MultiheadAttention::attend`] allows.
    pub fn forward_with(
        &self,
        src: &Tensor,
        src_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        if src.rank() == 2 {
            let batch_dim: i64 = if self.options.batch_first { 0 } else { 1 };
            let y = self.forward_with(&src.unsqueeze(batch_dim)?, src_mask, is_causal)?;
            return y.squeeze(batch_dim);
        }
        let mask = if is_causal { None } else { src_mask };
        let o = &self.options;
        let x = src;
        if o.norm_first {
            let x = ops::add(x, &self.sa_block(&self.norm1.forward(x)?, mask, is_causal)?)?;
            ops::add(&x, &self.ff_block(&self.norm2.forward(&x)?)?)
        } else {
            let x = self
                .norm1
                .forward(&ops::add(x, &self.sa_block(x, mask, is_causal)?)?)?;
            self.norm2.forward(&ops::add(&x, &self.ff_block(&x)?)?)
        }
    }

    /// `dropout1(self_attn(x, x, x))`.
    fn sa_block(&self, x: &Tensor, mask: Option<&Tensor>, is_causal: bool) -> Result<Tensor> {
        let p = if self.training {
            self.options.dropout
        } else {
            0.0
        };
        let mut gen = self.attn_dropout.lock().unwrap_or_else(|e| e.into_inner());
        let a = self.self_attn.attend_with(
            x,
            x,
            x,
            ops::Attention {
                attn_mask: mask,
                is_causal,
                dropout_p: p,
                generator: (p > 0.0).then_some(&mut *gen),
                ..Default::default()
            },
        )?;
        drop(gen);
        self.dropout1.forward(&a)
    }

    /// `dropout2(linear2(dropout(activation(linear1(x)))))`.
    fn ff_block(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.options.activation.apply(&self.linear1.forward(x)?)?;
        let h = self.linear2.forward(&self.dropout.forward(&h)?)?;
        self.dropout2.forward(&h)
    }
}

impl Module for TransformerEncoderLayer {
    /// The layer without a mask (every position attends to every other).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None, false)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let children: [(&str, &dyn Module); 5] = [
            ("self_attn", &self.self_attn),
            ("linear1", &self.linear1),
            ("linear2", &self.linear2),
            ("norm1", &self.norm1),
            ("norm2", &self.norm2),
        ];
        children
            .into_iter()
            .flat_map(|(name, m)| prefix_names(name, m.named_parameters()))
            .collect()
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
        for d in [&mut self.dropout, &mut self.dropout1, &mut self.dropout2] {
            d.train(mode);
        }
    }
    fn is_training(&self) -> bool {
        self.training
    }
}

/// PyTorch's `nn.Transformer.generate_square_subsequent_mask(size)`: a `[size, size]`
/// float mask, `0` on and below the diagonal and `-inf` above it (position `i` may
/// attend to `0..=i`), of the floating dtype given (others are refused).
pub fn square_subsequent_mask(size: usize, dtype: DType) -> Result<Tensor> {
    if !dtype.is_floating_point() {
        return Err(Error::invalid(
            "generate_square_subsequent_mask",
            format!("the mask holds -inf: a floating dtype is needed, got {dtype}"),
        ));
    }
    let v: Vec<f64> = (0..size)
        .flat_map(|i| (0..size).map(move |j| if j > i { f64::NEG_INFINITY } else { 0.0 }))
        .collect();
    Ok(Tensor::from_raw(
        Raw::from_vec(v, [size, size])?.to_dtype(dtype)?,
    ))
}
