//! Pooling layers (max, average, adaptive average / max) and `Embedding`.

use amp_autograd::{ops, Result, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};

use crate::module::Module;

/// `torch.nn.{Name}1d`/`2d`/`3d` as aliases of the layer generic over its rank.
macro_rules! rank_aliases {
    ($base:ident: $one:ident, $two:ident, $three:ident) => {
        #[doc = concat!("`torch.nn.", stringify!($one), "`.")]
        pub type $one = $base<1>;
        #[doc = concat!("`torch.nn.", stringify!($two), "`.")]
        pub type $two = $base<2>;
        #[doc = concat!("`torch.nn.", stringify!($three), "`.")]
        pub type $three = $base<3>;
    };
}

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
}

rank_aliases!(MaxPool: MaxPool1d, MaxPool2d, MaxPool3d);

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
}

rank_aliases!(AvgPool: AvgPool1d, AvgPool2d, AvgPool3d);

/// An adaptive pooling layer `$name` generic over its rank: its output size (`None`
/// keeps the input size), its constructor, and its rank aliases.
macro_rules! adaptive_pool {
    ($(#[$doc:meta])* $name:ident: $one:ident, $two:ident, $three:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name<const N: usize> {
            /// Output size per dim.
            pub output_size: [Option<usize>; N],
        }

        impl<const N: usize> $name<N> {
            /// Pool to `output_size`.
            pub fn new(output_size: [usize; N]) -> Self {
                $name {
                    output_size: output_size.map(Some),
                }
            }
        }

        rank_aliases!($name: $one, $two, $three);
    };
}

adaptive_pool!(
    /// Adaptive average pooling to a fixed output size (`None` keeps the input size).
    AdaptiveAvgPool: AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d
);

impl<const N: usize> Module for AdaptiveAvgPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::adaptive_avg_pool_nd(x, N, &self.output_size)
    }
}

adaptive_pool!(
    /// Adaptive max pooling to a fixed output size (`None` keeps the input size).
    AdaptiveMaxPool: AdaptiveMaxPool1d, AdaptiveMaxPool2d, AdaptiveMaxPool3d
);

impl<const N: usize> AdaptiveMaxPool<N> {
    /// The values and the flat argmax positions.
    pub fn forward_with_indices(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        ops::adaptive_max_pool_nd(x, N, &self.output_size)
    }
}

impl<const N: usize> Module for AdaptiveMaxPool<N> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_indices(x)?.0)
    }
}

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
