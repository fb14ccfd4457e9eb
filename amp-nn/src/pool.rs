//! Pooling layers (max, average, adaptive average / max) and `Embedding`.

use amp_autograd::{ops, Result, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};

use crate::module::Module;

/// Max pooling over `N` spatial dims (`MaxPool1d`/`2d`/`3d`), as `torch.nn.MaxPoolNd`.
#[derive(Clone, Debug)]
pub struct MaxPool<const N: usize> {
    /// Window size per dim.
    pub kernel_size: [usize; N],
    /// Step per dim (PyTorch's default: the kernel size).
    pub stride: [usize; N],
    /// Implicit `-inf` padding per dim.
    pub padding: [usize; N],
    /// Spacing between window elements.
    pub dilation: [usize; N],
    /// Round the output size up.
    pub ceil_mode: bool,
}

impl<const N: usize> MaxPool<N> {
    /// A window of `kernel_size` with stride `kernel_size`, no padding, no dilation.
    pub fn new(kernel_size: [usize; N]) -> Self {
        MaxPool {
            kernel_size,
            stride: kernel_size,
            padding: [0; N],
            dilation: [1; N],
            ceil_mode: false,
        }
    }
    /// The values and the flat argmax positions (what `return_indices=True` gives).
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        ops::max_pool_nd_with_indices(
            x,
            N,
            &self.kernel_size,
            &self.stride,
            &self.padding,
            &self.dilation,
            self.ceil_mode,
        )
    }
}

impl<const N: usize> Module for MaxPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_indices(x)?.0)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `torch.nn.MaxPool1d`.
pub type MaxPool1d = MaxPool<1>;
/// `torch.nn.MaxPool2d`.
pub type MaxPool2d = MaxPool<2>;
/// `torch.nn.MaxPool3d`.
pub type MaxPool3d = MaxPool<3>;

/// Average pooling over `N` spatial dims (`AvgPool1d`/`2d`/`3d`), as `torch.nn.AvgPoolNd`.
#[derive(Clone, Debug)]
pub struct AvgPool<const N: usize> {
    /// Window size per dim.
    pub kernel_size: [usize; N],
    /// Step per dim (PyTorch's default: the kernel size).
    pub stride: [usize; N],
    /// Implicit zero padding per dim.
    pub padding: [usize; N],
    /// Round the output size up.
    pub ceil_mode: bool,
    /// Count the zero padding in the divisor.
    pub count_include_pad: bool,
    /// A fixed divisor instead of the window size.
    pub divisor_override: Option<i64>,
}

impl<const N: usize> AvgPool<N> {
    /// A window of `kernel_size` with stride `kernel_size` and PyTorch's defaults.
    pub fn new(kernel_size: [usize; N]) -> Self {
        AvgPool {
            kernel_size,
            stride: kernel_size,
            padding: [0; N],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
}

impl<const N: usize> Module for AvgPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::avg_pool_nd(
            x,
            N,
            &self.kernel_size,
            &self.stride,
            &self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `torch.nn.AvgPool1d`.
pub type AvgPool1d = AvgPool<1>;
/// `torch.nn.AvgPool2d`.
pub type AvgPool2d = AvgPool<2>;
/// `torch.nn.AvgPool3d`.
pub type AvgPool3d = AvgPool<3>;

/// Adaptive average pooling to a fixed output size (`None` keeps the input size).
#[derive(Clone, Debug)]
pub struct AdaptiveAvgPool<const N: usize> {
    /// Output size per dim.
    pub output_size: [Option<usize>; N],
}

impl<const N: usize> AdaptiveAvgPool<N> {
    /// Pool to `output_size`.
    pub fn new(output_size: [usize; N]) -> Self {
        AdaptiveAvgPool {
            output_size: output_size.map(Some),
        }
    }
}

impl<const N: usize> Module for AdaptiveAvgPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::adaptive_avg_pool_nd(x, N, &self.output_size)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `torch.nn.AdaptiveAvgPool1d`.
pub type AdaptiveAvgPool1d = AdaptiveAvgPool<1>;
/// `torch.nn.AdaptiveAvgPool2d`.
pub type AdaptiveAvgPool2d = AdaptiveAvgPool<2>;
/// `torch.nn.AdaptiveAvgPool3d`.
pub type AdaptiveAvgPool3d = AdaptiveAvgPool<3>;

/// Adaptive max pooling to a fixed output size (`None` keeps the input size).
#[derive(Clone, Debug)]
pub struct AdaptiveMaxPool<const N: usize> {
    /// Output size per dim.
    pub output_size: [Option<usize>; N],
}

impl<const N: usize> AdaptiveMaxPool<N> {
    /// Pool to `output_size`.
    pub fn new(output_size: [usize; N]) -> Self {
        AdaptiveMaxPool {
            output_size: output_size.map(Some),
        }
    }
    /// The values and the flat argmax positions.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        ops::adaptive_max_pool_nd(x, N, &self.output_size)
    }
}

impl<const N: usize> Module for AdaptiveMaxPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_indices(x)?.0)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// `torch.nn.AdaptiveMaxPool1d`.
pub type AdaptiveMaxPool1d = AdaptiveMaxPool<1>;
/// `torch.nn.AdaptiveMaxPool2d`.
pub type AdaptiveMaxPool2d = AdaptiveMaxPool<2>;
/// `torch.nn.AdaptiveMaxPool3d`.
pub type AdaptiveMaxPool3d = AdaptiveMaxPool<3>;

/// A lookup table of `num_embeddings` vectors of size `embedding_dim`
/// (`torch.nn.Embedding`): `weight` starts N(0, 1), the `padding_idx` row at zero and
/// without gradient.
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
    /// The row that gets no gradient (negative values count from the end).
    pub padding_idx: Option<i64>,
}

impl Embedding {
    /// A table initialised N(0, 1) from `gen` (the `padding_idx` row zeroed).
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: Option<i64>,
        gen: &mut Generator,
    ) -> Result<Self> {
        let w = Raw::randn([num_embeddings, embedding_dim], DType::F32, gen)?;
        if let Some(p) = padding_idx {
            let n = num_embeddings as i64;
            if p >= n || p < -n {
                return Err(amp_autograd::Error::invalid(
                    "Embedding",
                    "Padding_idx must be within num_embeddings",
                ));
            }
            let row = if p < 0 { p + n } else { p };
            w.select(0, row)?.fill_(0.0)?;
        }
        Ok(Embedding {
            weight: Tensor::parameter(w)?,
            padding_idx,
        })
    }
    /// From an existing weight.
    pub fn from_pretrained(weight: Tensor, padding_idx: Option<i64>) -> Self {
        Embedding {
            weight,
            padding_idx,
        }
    }
}

impl Module for Embedding {
    /// `x`: integer indices of any shape; the result has shape `x.shape + [embedding_dim]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::embedding_padded(&self.weight, x, self.padding_idx)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
