//! PReLU, Bilinear, GroupNorm and the remaining losses as modules.

use amp_autograd::ops::{self, KlDivReduction};
use amp_autograd::{Error, Reduction, Result, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};

use crate::init::uniform;
use crate::module::{weight_and_bias, Module};

/// `nn.PReLU`: `x` where positive, `weight * x` elsewhere, one weight shared or one per
/// channel, initialised to `0.25`.
pub struct PReLU {
    /// `[num_parameters]`.
    pub weight: Tensor,
}

impl PReLU {
    /// `num_parameters` weights (1, or the channel count) set to `init` (PyTorch: 0.25).
    pub fn new(num_parameters: usize, init: f64) -> Result<Self> {
        Ok(PReLU {
            weight: Tensor::parameter(Raw::full([num_parameters], init, DType::F32))?,
        })
    }
}

impl Default for PReLU {
    /// One shared weight of 0.25.
    fn default() -> Self {
        PReLU::new(1, 0.25).expect("a fresh tensor can require grad")
    }
}

impl Module for PReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::prelu(x, &self.weight)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}

/// `nn.Bilinear`: `y = x1ᵀ A x2 + b` with weight `[out, in1, in2]`, weight and bias
/// uniform in `[-1/sqrt(in1), 1/sqrt(in1))`. It takes two inputs: use
/// [`Bilinear::forward2`] (the one-input [`Module::forward`] is an error).
pub struct Bilinear {
    /// `[out, in1, in2]`.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Option<Tensor>,
}

impl Bilinear {
    /// `in1 × in2 → out` with a bias, initialised from `gen`.
    pub fn new(in1: usize, in2: usize, out: usize, gen: &mut Generator) -> Result<Self> {
        Self::with_bias(in1, in2, out, true, gen)
    }
    /// With or without a bias.
    pub fn with_bias(
        in1: usize,
        in2: usize,
        out: usize,
        bias: bool,
        gen: &mut Generator,
    ) -> Result<Self> {
        let bound = 1.0 / (in1.max(1) as f64).sqrt();
        let weight = uniform(&[out, in1, in2], bound, gen)?;
        let bias = if bias {
            Some(uniform(&[out], bound, gen)?)
        } else {
            None
        };
        Ok(Bilinear { weight, bias })
    }
    /// The map of the two inputs.
    pub fn forward2(&self, x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
        ops::bilinear(x1, x2, &self.weight, self.bias.as_ref())
    }
}

impl Module for Bilinear {
    /// An error: Bilinear takes two inputs ([`Bilinear::forward2`]).
    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::invalid(
            "Bilinear",
            "forward() missing 1 required positional argument: 'input2' (use forward2)",
        ))
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(Some(&self.weight), self.bias.as_ref())
    }
}

/// `nn.GroupNorm`: group normalisation with per-channel affine weight (ones) and bias
/// (zeros).
pub struct GroupNorm {
    /// Number of channel groups.
    pub num_groups: usize,
    /// Added to the variance.
    pub eps: f64,
    /// `[channels]`, when affine.
    pub weight: Option<Tensor>,
    /// `[channels]`, when affine.
    pub bias: Option<Tensor>,
}

impl GroupNorm {
    /// PyTorch's defaults: eps 1e-5, affine.
    pub fn new(num_groups: usize, num_channels: usize) -> Result<Self> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::invalid(
                "GroupNorm",
                "num_channels must be divisible by num_groups",
            ));
        }
        Ok(GroupNorm {
            num_groups,
            eps: 1e-5,
            weight: Some(Tensor::parameter(Raw::ones([num_channels], DType::F32))?),
            bias: Some(Tensor::parameter(Raw::zeros([num_channels], DType::F32))?),
        })
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::group_norm(
            x,
            self.num_groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(self.weight.as_ref(), self.bias.as_ref())
    }
}

/// `nn.KLDivLoss` (input: log-probabilities).
#[derive(Debug, Clone, Copy, Default)]
pub struct KLDivLoss {
    /// Reduction (`batchmean` is the true KL divergence).
    pub reduction: KlDivReduction,
    /// Whether the target is given as log-probabilities.
    pub log_target: bool,
}

impl KLDivLoss {
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::kl_div(input, target, self.reduction, self.log_target)
    }
}

/// `nn.PoissonNLLLoss`.
#[derive(Debug, Clone, Copy)]
pub struct PoissonNLLLoss {
    /// Whether the input is the log of the rate (default true).
    pub log_input: bool,
    /// Whether to add the Stirling term.
    pub full: bool,
    /// Added inside the log when `!log_input` (default 1e-8).
    pub eps: f64,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for PoissonNLLLoss {
    fn default() -> Self {
        PoissonNLLLoss {
            log_input: true,
            full: false,
            eps: 1e-8,
            reduction: Reduction::Mean,
        }
    }
}

impl PoissonNLLLoss {
    /// The loss of `input` against counts `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::poisson_nll_loss(
            input,
            target,
            self.log_input,
            self.full,
            self.eps,
            self.reduction,
        )
    }
}

/// `nn.HingeEmbeddingLoss`.
#[derive(Debug, Clone, Copy)]
pub struct HingeEmbeddingLoss {
    /// Margin (default 1).
    pub margin: f64,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for HingeEmbeddingLoss {
    fn default() -> Self {
        HingeEmbeddingLoss {
            margin: 1.0,
            reduction: Reduction::Mean,
        }
    }
}

impl HingeEmbeddingLoss {
    /// The loss of `input` against `target` in {1, -1}.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::hinge_embedding_loss(input, target, self.margin, self.reduction)
    }
}

/// `nn.MarginRankingLoss`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MarginRankingLoss {
    /// Margin (default 0).
    pub margin: f64,
    /// Reduction.
    pub reduction: Reduction,
}

impl MarginRankingLoss {
    /// The loss of ranking `input1` above `input2` where `target` is 1 (below where -1).
    pub fn forward(&self, input1: &Tensor, input2: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::margin_ranking_loss(input1, input2, target, self.margin, self.reduction)
    }
}

/// `nn.SoftMarginLoss`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoftMarginLoss {
    /// Reduction.
    pub reduction: Reduction,
}

impl SoftMarginLoss {
    /// The loss of `input` against `target` in {1, -1}.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::soft_margin_loss(input, target, self.reduction)
    }
}

/// `nn.MultiLabelMarginLoss`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MultiLabelMarginLoss {
    /// Reduction.
    pub reduction: Reduction,
}

impl MultiLabelMarginLoss {
    /// The loss of `input` against target class lists (each ended by -1).
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::multilabel_margin_loss(input, target, self.reduction)
    }
}

/// `nn.MultiMarginLoss`.
#[derive(Debug, Clone)]
pub struct MultiMarginLoss {
    /// 1 or 2 (default 1).
    pub p: i64,
    /// Margin (default 1).
    pub margin: f64,
    /// Optional per-class weight.
    pub weight: Option<Tensor>,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for MultiMarginLoss {
    fn default() -> Self {
        MultiMarginLoss {
            p: 1,
            margin: 1.0,
            weight: None,
            reduction: Reduction::Mean,
        }
    }
}

impl MultiMarginLoss {
    /// The loss of scores `input` against class indices `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::multi_margin_loss(
            input,
            target,
            self.p,
            self.margin,
            self.weight.as_ref(),
            self.reduction,
        )
    }
}

/// `nn.CosineEmbeddingLoss`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CosineEmbeddingLoss {
    /// Margin (default 0).
    pub margin: f64,
    /// Reduction.
    pub reduction: Reduction,
}

impl CosineEmbeddingLoss {
    /// The loss of the pair `(input1, input2)` against `target` in {1, -1}.
    pub fn forward(&self, input1: &Tensor, input2: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::cosine_embedding_loss(input1, input2, target, self.margin, self.reduction)
    }
}

/// `nn.TripletMarginLoss`.
#[derive(Debug, Clone, Copy)]
pub struct TripletMarginLoss {
    /// Margin (default 1).
    pub margin: f64,
    /// Norm degree (default 2).
    pub p: f64,
    /// Added to differences (default 1e-6).
    pub eps: f64,
    /// Distance swap.
    pub swap: bool,
    /// Reduction.
    pub reduction: Reduction,
}

impl Default for TripletMarginLoss {
    fn default() -> Self {
        TripletMarginLoss {
            margin: 1.0,
            p: 2.0,
            eps: 1e-6,
            swap: false,
            reduction: Reduction::Mean,
        }
    }
}

impl TripletMarginLoss {
    /// The loss of the triplet.
    pub fn forward(&self, anchor: &Tensor, positive: &Tensor, negative: &Tensor) -> Result<Tensor> {
        ops::triplet_margin_loss(
            anchor,
            positive,
            negative,
            self.margin,
            self.p,
            self.eps,
            self.swap,
            self.reduction,
        )
    }
}

/// `nn.CTCLoss`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CTCLoss {
    /// The blank class (default 0).
    pub blank: usize,
    /// Reduction (mean divides by target lengths first).
    pub reduction: Reduction,
    /// Zero infinite losses and their gradients.
    pub zero_infinity: bool,
}

impl CTCLoss {
    /// The loss of `log_probs` (`[T, N, C]`) against `targets`.
    pub fn forward(
        &self,
        log_probs: &Tensor,
        targets: &Tensor,
        input_lengths: &[usize],
        target_lengths: &[usize],
    ) -> Result<Tensor> {
        ops::ctc_loss(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            self.blank,
            self.reduction,
            self.zero_infinity,
        )
    }
}

/// `nn.MultiheadAttention` (`need_weights=False`, packed projections, biases): PyTorch's
/// parameters `in_proj_weight` `[3E, E]` (Xavier-uniform), `in_proj_bias` `[3E]` (zeros),
/// `out_proj.weight` `[E, E]` (Linear's init), `out_proj.bias` `[E]` (zeros); see
/// [`ops::multi_head_attention_forward`].
///
/// ```
/// use amp_nn::{Module, MultiheadAttention};
/// use amp_autograd::Tensor;
/// use amp_tensor::{DType, Generator};
/// # fn main() -> amp_autograd::Result<()> {
/// let mha = MultiheadAttention::new(8, 2, true, &mut Generator::new(0))?;
/// let x = Tensor::ones([3, 5, 8], DType::F32); // batch first: [N, L, E]
/// assert_eq!(mha.forward(&x)?.dims(), [3, 5, 8]);
/// let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
/// # Ok(())
/// # }
/// ```
pub struct MultiheadAttention {
    /// `E`.
    pub embed_dim: usize,
    /// Heads (`E` is a multiple).
    pub num_heads: usize,
    /// `[N, L, E]` inputs and output instead of `[L, N, E]`.
    pub batch_first: bool,
    /// `[3E, E]`.
    pub in_proj_weight: Tensor,
    /// `[3E]`.
    pub in_proj_bias: Tensor,
    /// `[E, E]`.
    pub out_proj_weight: Tensor,
    /// `[E]`.
    pub out_proj_bias: Tensor,
}

impl MultiheadAttention {
    /// `embed_dim` split over `num_heads`, initialised from `gen` as PyTorch does.
    pub fn new(
        embed_dim: usize,
        num_heads: usize,
        batch_first: bool,
        gen: &mut Generator,
    ) -> Result<Self> {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::invalid(
                "MultiheadAttention",
                "embed_dim must be divisible by num_heads",
            ));
        }
        let e = embed_dim;
        Ok(MultiheadAttention {
            embed_dim,
            num_heads,
            batch_first,
            in_proj_weight: crate::init::xavier_uniform(&[3 * e, e], e, 3 * e, gen)?,
            in_proj_bias: Tensor::parameter(Raw::zeros([3 * e], DType::F32))?,
            out_proj_weight: crate::init::kaiming_uniform_default(&[e, e], e, gen)?,
            out_proj_bias: Tensor::parameter(Raw::zeros([e], DType::F32))?,
        })
    }

    /// Attention of `query` over `key`/`value` (`attn_mask`: `[L, S]` or
    /// `[N·heads, L, S]`, boolean (`true`: not attended, PyTorch's convention) or float
    /// (added to the scores)), in the module's layout.
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        self.attend_with(
            query,
            key,
            value,
            ops::Attention {
                attn_mask,
                is_causal,
                ..Default::default()
            },
        )
    }

    /// [`MultiheadAttention::attend`] with every option of the attention op: the mask,
    /// causality and the dropout on the attention weights (`dropout_p` with its
    /// `generator`; PyTorch's `dropout` argument, applied in training mode only, is the
    /// caller's to pass or not).
    pub fn attend_with(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        opts: ops::Attention<'_>,
    ) -> Result<Tensor> {
        let seq_first = |t: &Tensor| -> Result<Tensor> {
            if self.batch_first {
                ops::transpose(t, 0, 1)
            } else {
                Ok(t.clone())
            }
        };
        // Self-attention keeps one tensor for all three (the op's packed projection
        // tests `query is key is value`, as PyTorch's does).
        let same = query.id() == key.id() && key.id() == value.id();
        let q = seq_first(query)?;
        let (k, v) = if same {
            (q.clone(), q.clone())
        } else {
            (seq_first(key)?, seq_first(value)?)
        };
        let out = ops::multi_head_attention_forward(
            &q,
            &k,
            &v,
            self.num_heads,
            ops::MultiHeadWeights {
                in_proj_weight: &self.in_proj_weight,
                in_proj_bias: Some(&self.in_proj_bias),
                out_proj_weight: &self.out_proj_weight,
                out_proj_bias: Some(&self.out_proj_bias),
            },
            opts,
        )?;
        seq_first(&out)
    }
}

impl Module for MultiheadAttention {
    /// Self-attention of `x` without a mask.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None, false)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("in_proj_weight".to_string(), self.in_proj_weight.clone()),
            ("in_proj_bias".to_string(), self.in_proj_bias.clone()),
            ("out_proj.weight".to_string(), self.out_proj_weight.clone()),
            ("out_proj.bias".to_string(), self.out_proj_bias.clone()),
        ]
    }
}
