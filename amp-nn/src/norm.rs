//! Batch normalisation layers: `BatchNorm1d`, `BatchNorm2d`, `BatchNorm3d` (PyTorch's
//! parameters `weight` (ones), `bias` (zeros) and buffers `running_mean` (zeros),
//! `running_var` (ones), `num_batches_tracked` (int64), in its `state_dict` order).
//!
//! In training the batch's statistics normalise and the running ones are updated in
//! place (see [`ops::batch_norm`]); in evaluation the running statistics normalise.

use amp_autograd::{ops, Error, Result, Tensor};
use amp_tensor::{DType, Tensor as Raw};

use crate::module::Module;

/// The layer shared by the three batch-norm modules.
struct BatchNorm {
    name: &'static str,
    /// Input ranks accepted (`BatchNorm1d`: 2 or 3).
    ranks: &'static [usize],
    eps: f64,
    momentum: f64,
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    num_batches_tracked: Tensor,
    training: bool,
}

impl BatchNorm {
    fn new(name: &'static str, ranks: &'static [usize], num_features: usize) -> Result<Self> {
        let f32s = |v: f64| Raw::full([num_features], v, DType::F32);
        Ok(BatchNorm {
            name,
            ranks,
            eps: 1e-5,
            momentum: 0.1,
            weight: Tensor::parameter(f32s(1.0))?,
            bias: Tensor::parameter(f32s(0.0))?,
            running_mean: Tensor::from_raw(f32s(0.0)),
            running_var: Tensor::from_raw(f32s(1.0)),
            num_batches_tracked: Tensor::scalar(0i64),
            training: true,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.ranks.contains(&x.rank()) {
            let want = match self.ranks {
                [a, b] => format!("{a}D or {b}D"),
                [a] => format!("{a}D"),
                _ => unreachable!("one or two ranks"),
            };
            return Err(Error::invalid(
                self.name,
                format!("expected {want} input (got {}D input)", x.rank()),
            ));
        }
        if self.training {
            let n = self.num_batches_tracked.item::<i64>()?;
            self.num_batches_tracked
                .data()
                .copy_(Tensor::scalar(n + 1).data())?;
        }
        ops::batch_norm(
            x,
            Some(&self.running_mean),
            Some(&self.running_var),
            Some(&self.weight),
            Some(&self.bias),
            self.training,
            self.momentum,
            self.eps,
        )
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".to_string(), self.weight.clone()),
            ("bias".to_string(), self.bias.clone()),
        ]
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".to_string(), self.running_mean.clone()),
            ("running_var".to_string(), self.running_var.clone()),
            (
                "num_batches_tracked".to_string(),
                self.num_batches_tracked.clone(),
            ),
        ]
    }
}

macro_rules! batch_norm_module {
    ($(#[$doc:meta])* $name:ident, $ranks:expr) => {
        $(#[$doc])*
        pub struct $name(BatchNorm);

        impl $name {
            /// `num_features` channels (dim 1 of the input), PyTorch's defaults (eps 1e-5,
            /// momentum 0.1, affine, tracking running statistics), in training mode.
            pub fn new(num_features: usize) -> Result<Self> {
                Ok($name(BatchNorm::new(stringify!($name), $ranks, num_features)?))
            }
            /// With `eps` and `momentum`.
            pub fn with_options(num_features: usize, eps: f64, momentum: f64) -> Result<Self> {
                let mut b = BatchNorm::new(stringify!($name), $ranks, num_features)?;
                b.eps = eps;
                b.momentum = momentum;
                Ok($name(b))
            }
            /// The running mean (a buffer, updated in training).
            pub fn running_mean(&self) -> &Tensor {
                &self.0.running_mean
            }
            /// The running variance (a buffer, updated in training).
            pub fn running_var(&self) -> &Tensor {
                &self.0.running_var
            }
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.0.forward(x)
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                self.0.named_parameters()
            }
            fn named_buffers(&self) -> Vec<(String, Tensor)> {
                self.0.named_buffers()
            }
            fn train(&mut self, mode: bool) {
                self.0.training = mode;
            }
            fn is_training(&self) -> bool {
                self.0.training
            }
        }
    };
}

batch_norm_module!(
    /// `nn.BatchNorm1d`: `[N, C]` or `[N, C, L]` inputs.
    ///
    /// ```
    /// use amp_nn::{BatchNorm1d, Module};
    /// use amp_autograd::Tensor;
    /// # fn main() -> amp_autograd::Result<()> {
    /// let mut bn = BatchNorm1d::new(2)?;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 6.0], [2, 2])?;
    /// bn.forward(&x)?; // training: batch statistics, running ones updated
    /// assert!((bn.running_mean().to_vec_f64()[0] - 0.2).abs() < 1e-6); // 0.1 * 2
    /// let keys: Vec<String> = bn.state_dict().into_iter().map(|(k, _)| k).collect();
    /// assert_eq!(keys, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
    /// bn.eval();
    /// assert_eq!(bn.forward(&x)?.dims(), [2, 2]);
    /// # Ok(())
    /// # }
    /// ```
    BatchNorm1d,
    &[2, 3]
);
batch_norm_module!(
    /// `nn.BatchNorm2d`: `[N, C, H, W]` inputs.
    BatchNorm2d,
    &[4]
);
batch_norm_module!(
    /// `nn.BatchNorm3d`: `[N, C, D, H, W]` inputs.
    BatchNorm3d,
    &[5]
);
