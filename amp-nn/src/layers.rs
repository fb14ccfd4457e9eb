//! Layers: Linear, Sequential, activations, LayerNorm, Dropout.

use std::sync::Mutex;

use amp_autograd::{ops, Result, Tensor};
use amp_tensor::Generator;

use crate::init::{kaiming_uniform_default, uniform};
use crate::module::{prefix_names, weight_and_bias, Module};

/// `y = x Wᵀ + b` with PyTorch's default initialisation.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// `in_features → out_features`, with a bias, initialised from `gen`.
    pub fn new(in_features: usize, out_features: usize, gen: &mut Generator) -> Result<Self> {
        Self::with_bias(in_features, out_features, true, gen)
    }
    /// With or without a bias.
    pub fn with_bias(
        in_features: usize,
        out_features: usize,
        bias: bool,
        gen: &mut Generator,
    ) -> Result<Self> {
        let weight = kaiming_uniform_default(&[out_features, in_features], in_features, gen)?;
        let bias = if bias {
            Some(uniform(
                &[out_features],
                1.0 / (in_features.max(1) as f64).sqrt(),
                gen,
            )?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
    /// From existing parameters.
    pub fn from_parts(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear { weight, bias }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.weight, self.bias.as_ref())
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(Some(&self.weight), self.bias.as_ref())
    }
}

/// Modules applied in order; parameters are named `0.weight`, `1.bias`, ...
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: bool,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Self {
        Sequential {
            layers: Vec::new(),
            training: true,
        }
    }
    /// Append a module.
    #[allow(clippy::should_implement_trait)] // builder style, as `nn.Sequential(...)`
    pub fn add(mut self, m: impl Module + 'static) -> Self {
        self.layers.push(Box::new(m));
        self
    }
    /// Append a boxed module.
    pub fn push(&mut self, m: Box<dyn Module>) {
        self.layers.push(m);
    }
    /// The modules.
    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }
    /// `named(layer)` of every layer, named `i.name`, in order.
    fn children(
        &self,
        named: impl Fn(&dyn Module) -> Vec<(String, Tensor)>,
    ) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefix_names(&i.to_string(), named(l.as_ref())))
            .collect()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.children(|l| l.named_parameters())
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.children(|l| l.named_buffers())
    }
    fn named_state(&self) -> Vec<(String, Tensor)> {
        self.children(|l| l.named_state())
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
        for l in &mut self.layers {
            l.train(mode);
        }
    }
    fn is_training(&self) -> bool {
        self.training
    }
}

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => $f:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;
        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                $f(x)
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)`.
    ReLU => ops::relu;
    /// Exact GELU.
    GELU => ops::gelu;
    /// Hyperbolic tangent.
    Tanh => ops::tanh;
    /// Logistic sigmoid.
    Sigmoid => ops::sigmoid;
}

/// Layer normalisation over the trailing dims, with affine weight (ones) and bias
/// (zeros).
pub struct LayerNorm {
    pub normalized_shape: Vec<usize>,
    pub eps: f64,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
}

impl LayerNorm {
    /// PyTorch's defaults: eps 1e-5, elementwise affine.
    pub fn new(normalized_shape: &[usize]) -> Result<Self> {
        let w = Tensor::parameter(amp_tensor::Tensor::ones(
            normalized_shape,
            amp_tensor::DType::F32,
        ))?;
        let b = Tensor::parameter(amp_tensor::Tensor::zeros(
            normalized_shape,
            amp_tensor::DType::F32,
        ))?;
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps: 1e-5,
            weight: Some(w),
            bias: Some(b),
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        weight_and_bias(self.weight.as_ref(), self.bias.as_ref())
    }
}

/// Zero elements with probability `p` in training mode (seeded).
pub struct Dropout {
    pub p: f64,
    training: bool,
    gen: Mutex<Generator>,
}

impl Dropout {
    /// Dropout with probability `p`, masks drawn from a generator seeded with `seed`.
    pub fn new(p: f64, seed: u64) -> Self {
        Dropout {
            p,
            training: true,
            gen: Mutex::new(Generator::new(seed)),
        }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut g = self.gen.lock().unwrap_or_else(|e| e.into_inner());
        ops::dropout(x, self.p, self.training, &mut g)
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
    fn is_training(&self) -> bool {
        self.training
    }
}
