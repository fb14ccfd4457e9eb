//! Losses as modules.

use amp_autograd::{ops, Reduction, Result, Tensor};

/// `nn.MSELoss`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MSELoss {
    pub reduction: Reduction,
}

impl MSELoss {
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::mse_loss(input, target, self.reduction)
    }
}

/// `nn.CrossEntropyLoss`.
#[derive(Debug, Clone, Default)]
pub struct CrossEntropyLoss {
    pub weight: Option<Tensor>,
    pub ignore_index: Option<i64>,
    pub reduction: Reduction,
    pub label_smoothing: f64,
}

impl CrossEntropyLoss {
    /// The loss of logits `input` against class indices `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::cross_entropy(
            input,
            target,
            self.weight.as_ref(),
            self.ignore_index.unwrap_or(-100),
            self.reduction,
            self.label_smoothing,
        )
    }
}

/// `nn.BCEWithLogitsLoss`.
#[derive(Debug, Clone, Default)]
pub struct BCEWithLogitsLoss {
    pub weight: Option<Tensor>,
    pub pos_weight: Option<Tensor>,
    pub reduction: Reduction,
}

impl BCEWithLogitsLoss {
    /// The loss of logits `input` against targets in `[0, 1]`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        ops::binary_cross_entropy_with_logits(
            input,
            target,
            self.weight.as_ref(),
            self.pos_weight.as_ref(),
            self.reduction,
        )
    }
}
