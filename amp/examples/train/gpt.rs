//! The model of the main job: a small decoder-only (GPT-style) character-level
//! transformer. Token and learned position embeddings, pre-norm
//! `TransformerEncoderLayer`s with GELU and causal self-attention, a final layer norm
//! and a linear head onto the vocabulary, trained with cross-entropy on the next
//! character.
//!
//! `cargo xtask bench` times one training step of `GptConfig::default()` from this file
//! (`gpt_step_*_ms`), and `xtask/torch/torch_baseline.py` builds the same model in
//! PyTorch.

use amp::autograd::{ops, Error, Reduction, Result, Tensor};
use amp::nn::{
    prefix_names, Activation, Embedding, LayerNorm, Linear, Module, TransformerEncoderLayer,
    TransformerEncoderLayerOptions,
};
use amp::tensor::{DType, Generator, Tensor as Raw};

/// The model's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptConfig {
    /// Characters in the vocabulary.
    pub vocab: usize,
    /// The longest context (positions with an embedding).
    pub context: usize,
    /// The width of the residual stream.
    pub d_model: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Attention heads per layer.
    pub heads: usize,
    /// The hidden width of each feed-forward block.
    pub feedforward: usize,
    /// Dropout probability in the layers (training mode only).
    pub dropout: f64,
}

impl Default for GptConfig {
    /// The main job's model: 4 layers of width 128 (4 heads, feed-forward 512) over a
    /// context of 128 characters; the vocabulary is the text's (96 here, the benchmark's).
    fn default() -> Self {
        GptConfig {
            vocab: 96,
            context: 128,
            d_model: 128,
            layers: 4,
            heads: 4,
            feedforward: 512,
            dropout: 0.0,
        }
    }
}

/// The model: `head(ln_f(layers(tok_emb[x] + pos_emb[0..T])))`.
pub struct Gpt {
    /// The shape it was made with.
    pub config: GptConfig,
    /// `[vocab, d_model]`.
    pub tok_emb: Embedding,
    /// `[context, d_model]`.
    pub pos_emb: Tensor,
    /// The pre-norm causal layers.
    pub layers: Vec<TransformerEncoderLayer>,
    /// The final layer norm.
    pub ln_f: LayerNorm,
    /// `d_model → vocab`.
    pub head: Linear,
    training: bool,
}

impl Gpt {
    /// A model initialised from `gen`: embeddings N(0, 0.02²) as GPT-2's, the layers and
    /// the head with PyTorch's defaults.
    pub fn new(config: GptConfig, gen: &mut Generator) -> Result<Self> {
        let c = config;
        let normal = |dims: [usize; 2], gen: &mut Generator| -> Result<Tensor> {
            let w = Raw::randn(dims, DType::F64, gen)?;
            let w: Vec<f32> = w.to_vec_f64().iter().map(|v| (v * 0.02) as f32).collect();
            Tensor::parameter(Raw::from_vec(w, dims)?)
        };
        let tok_emb = Embedding::from_pretrained(normal([c.vocab, c.d_model], gen)?, None);
        let pos_emb = normal([c.context, c.d_model], gen)?;
        let layer = TransformerEncoderLayerOptions {
            dim_feedforward: c.feedforward,
            dropout: c.dropout,
            activation: Activation::Gelu,
            batch_first: true,
            norm_first: true,
            ..TransformerEncoderLayerOptions::new(c.d_model, c.heads)
        };
        let layers = (0..c.layers)
            .map(|_| TransformerEncoderLayer::new(layer, gen))
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            config,
            tok_emb,
            pos_emb,
            layers,
            ln_f: LayerNorm::new(&[c.d_model])?,
            head: Linear::new(c.d_model, c.vocab, gen)?,
            training: true,
        })
    }

    /// The logits `[B, T, vocab]` of the next character after each position of the
    /// `[B, T]` int64 tokens (`T` at most the context).
    pub fn logits(&self, tokens: &Tensor) -> Result<Tensor> {
        let t = *tokens.dims().last().unwrap_or(&0);
        if tokens.rank() != 2 || t == 0 || t > self.config.context {
            return Err(Error::invalid(
                "Gpt",
                format!(
                    "tokens must be [batch, 1..={}], got {:?}",
                    self.config.context,
                    tokens.dims()
                ),
            ));
        }
        let pos = ops::narrow(&self.pos_emb, 0, 0, t)?;
        let mut h = ops::add(&self.tok_emb.forward(tokens)?, &pos)?;
        for layer in &self.layers {
            h = layer.forward_with(&h, None, true)?;
        }
        self.head.forward(&self.ln_f.forward(&h)?)
    }

    /// The mean cross-entropy of predicting `targets` (`[B, T]` int64) from `tokens`.
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> Result<Tensor> {
        token_loss(&self.logits(tokens)?, targets)
    }
}

/// The mean cross-entropy of `logits` (`[B, T, vocab]`) against `targets` (`[B, T]`).
pub fn token_loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let v = logits.dims()[logits.rank() - 1] as i64;
    ops::cross_entropy(
        &ops::reshape(logits, [-1, v])?,
        &ops::reshape(targets, [-1i64])?,
        None,
        -100,
        Reduction::Mean,
        0.0,
    )
}

impl Module for Gpt {
    /// [`Gpt::logits`].
    fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        self.logits(tokens)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = prefix_names("tok_emb", self.tok_emb.named_parameters());
        v.push(("pos_emb".to_string(), self.pos_emb.clone()));
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(prefix_names(&format!("layers.{i}"), l.named_parameters()));
        }
        v.extend(prefix_names("ln_f", self.ln_f.named_parameters()));
        v.extend(prefix_names("head", self.head.named_parameters()));
        v
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.layers.iter_mut().for_each(|l| l.train(mode));
    }
    fn is_training(&self) -> bool {
        self.training
    }
}
