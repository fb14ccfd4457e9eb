//! Convolution layers: `Conv1d/2d/3d` and `ConvTranspose1d/2d/3d`, with PyTorch's
//! default initialisation (kaiming-uniform `a = sqrt(5)` weights, bias uniform in
//! `±1/sqrt(fan_in)`, `fan_in = weight.size(1) · prod(kernel)`), seeded.

use amp_autograd::{ops, Error, Result, Tensor};
use amp_tensor::Generator;

use crate::init::{kaiming_uniform_default, uniform};
use crate::module::{weight_and_bias, Module};

/// Shape and hyper-parameters shared by the convolution layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvOptions {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel size, per spatial dim (or one value for all).
    pub kernel_size: Vec<usize>,
    /// Stride (one value or one per spatial dim).
    pub stride: Vec<usize>,
    /// Zero padding (one value or one per spatial dim).
    pub padding: Vec<usize>,
    /// Output padding of transposed layers (one value or one per spatial dim).
    pub output_padding: Vec<usize>,
    /// Dilation (one value or one per spatial dim).
    pub dilation: Vec<usize>,
    /// Channel groups.
    pub groups: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl ConvOptions {
    /// `in_channels → out_channels` with `kernel_size`, stride 1, no padding, dilation
    /// 1, one group, with a bias (PyTorch's defaults).
    pub fn new(in_channels: usize, out_channels: usize, kernel_size: &[usize]) -> Self {
        ConvOptions {
            in_channels,
            out_channels,
            kernel_size: kernel_size.to_vec(),
            stride: vec![1],
            padding: vec![0],
            output_padding: vec![0],
            dilation: vec![1],
            groups: 1,
            bias: true,
        }
    }
    amp_tensor::setters! {
        /// With a stride.
        stride: &[usize] => <[usize]>::to_vec;
        /// With zero padding.
        padding: &[usize] => <[usize]>::to_vec;
        /// With an output padding (transposed layers).
        output_padding: &[usize] => <[usize]>::to_vec;
        /// With a dilation.
        dilation: &[usize] => <[usize]>::to_vec;
        /// With channel groups.
        groups: usize;
        /// With or without a bias.
        bias: bool;
    }

    fn kernel(&self, rank: usize) -> Result<Vec<usize>> {
        match self.kernel_size.len() {
            1 => Ok(vec![self.kernel_size[0]; rank]),
            n if n == rank => Ok(self.kernel_size.clone()),
            _ => Err(Error::invalid(
                "conv",
                format!(
                    "kernel_size {:?} does not match {rank} spatial dims",
                    self.kernel_size
                ),
            )),
        }
    }

    /// Weight and bias, initialised as PyTorch does. `transposed` layers store the
    /// weight as `[in, out / groups, k...]`, the others as `[out, in / groups, k...]`.
    fn parameters(
        &self,
        rank: usize,
        transposed: bool,
        gen: &mut Generator,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let g = self.groups;
        if g == 0 || !self.in_channels.is_multiple_of(g) || !self.out_channels.is_multiple_of(g) {
            return Err(Error::invalid(
                "conv",
                format!(
                    "in_channels ({}) and out_channels ({}) must be divisible by groups ({g})",
                    self.in_channels, self.out_channels
                ),
            ));
        }
        let k = self.kernel(rank)?;
        let mut dims = if transposed {
            vec![self.in_channels, self.out_channels / g]
        } else {
            vec![self.out_channels, self.in_channels / g]
        };
        let fan_in = dims[1] * k.iter().product::<usize>();
        dims.extend(k);
        let weight = kaiming_uniform_default(&dims, fan_in, gen)?;
        let bias = if self.bias {
            Some(uniform(
                &[self.out_channels],
                1.0 / (fan_in.max(1) as f64).sqrt(),
                gen,
            )?)
        } else {
            None
        };
        Ok((weight, bias))
    }
}

/// A convolution layer `$name` of spatial rank `$rank`: weight and bias created by
/// `ConvOptions::parameters` (transposed or not), `forward` calling `$call` with the
/// input, the parameters and the options bound to the four names given.
macro_rules! conv_layer {
    (
        $(#[$doc:meta])* $name:ident, $rank:expr, transposed: $t:expr, weight: $wdoc:literal,
        |$x:ident, $w:ident, $b:ident, $o:ident| $call:expr
    ) => {
        $(#[$doc])*
        pub struct $name {
            #[doc = $wdoc]
            pub weight: Tensor,
            /// `[out]`, when the layer has a bias.
            pub bias: Option<Tensor>,
            /// The layer's hyper-parameters.
            pub options: ConvOptions,
        }

        impl $name {
            /// `in_channels → out_channels` with `kernel_size` and PyTorch's defaults
            /// otherwise, initialised from `gen`.
            pub fn new(
                in_channels: usize,
                out_channels: usize,
                kernel_size: &[usize],
                gen: &mut Generator,
            ) -> Result<Self> {
                Self::with_options(ConvOptions::new(in_channels, out_channels, kernel_size), gen)
            }
            /// With all hyper-parameters.
            pub fn with_options(options: ConvOptions, gen: &mut Generator) -> Result<Self> {
                let (weight, bias) = options.parameters($rank, $t, gen)?;
                Ok($name { weight, bias, options })
            }
        }

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let ($w, $b, $o) = (&self.weight, self.bias.as_ref(), &self.options);
                $call
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                weight_and_bias(Some(&self.weight), self.bias.as_ref())
            }
        }
    };
}

/// A convolution layer (`conv_layer!` with PyTorch's `conv{rank}d` call).
macro_rules! conv {
    ($($(#[$doc:meta])* $name:ident, $rank:expr, $f:path;)*) => {$(
        conv_layer!(
            $(#[$doc])* $name, $rank, transposed: false, weight: "`[out, in / groups, k...]`.",
            |x, w, b, o| $f(x, w, b, &o.stride, &o.padding, &o.dilation, o.groups)
        );
    )*};
}

/// A transposed convolution layer (`conv_layer!` with `conv_transpose{rank}d`).
macro_rules! conv_transpose {
    ($($(#[$doc:meta])* $name:ident, $rank:expr, $f:path;)*) => {$(
        conv_layer!(
            $(#[$doc])* $name, $rank, transposed: true, weight: "`[in, out / groups, k...]`.",
            |x, w, b, o| $f(
                x, w, b, &o.stride, &o.padding, &o.output_padding, o.groups, &o.dilation
            )
        );
    )*};
}

conv! {
    /// 1-D convolution layer (`nn.Conv1d`): input `[N, C_in, L]`.
    Conv1d, 1, ops::conv1d;
    /// 2-D convolution layer (`nn.Conv2d`): input `[N, C_in, H, W]`.
    Conv2d, 2, ops::conv2d;
    /// 3-D convolution layer (`nn.Conv3d`): input `[N, C_in, D, H, W]`.
    Conv3d, 3, ops::conv3d;
}
conv_transpose! {
    /// 1-D transposed convolution layer (`nn.ConvTranspose1d`).
    ConvTranspose1d, 1, ops::conv_transpose1d;
    /// 2-D transposed convolution layer (`nn.ConvTranspose2d`).
    ConvTranspose2d, 2, ops::conv_transpose2d;
    /// 3-D transposed convolution layer (`nn.ConvTranspose3d`).
    ConvTranspose3d, 3, ops::conv_transpose3d;
}

#[cfg(test)]
mod tests {
    use super::*;
    use amp_tensor::DType;

    #[test]
    fn shapes_names_and_init_bounds() -> Result<()> {
        let mut gen = Generator::new(0);
        let c = Conv2d::with_options(
            ConvOptions::new(4, 6, &[3]).padding(&[1]).groups(2),
            &mut gen,
        )?;
        assert_eq!(c.weight.dims(), &[6, 2, 3, 3]);
        let names: Vec<String> = c.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "bias"]);
        let bound = 1.0 / 18f64.sqrt();
        assert!(c.weight.to_vec_f64().iter().all(|v| v.abs() <= bound));
        assert!(c
            .bias
            .as_ref()
            .unwrap()
            .to_vec_f64()
            .iter()
            .all(|v| v.abs() <= bound));
        let x = Tensor::randn([2, 4, 5, 5], DType::F32, &mut gen)?;
        assert_eq!(c.forward(&x)?.dims(), &[2, 6, 5, 5]);
        let t = ConvTranspose2d::with_options(
            ConvOptions::new(4, 6, &[3])
                .stride(&[2])
                .output_padding(&[1])
                .bias(false),
            &mut gen,
        )?;
        assert_eq!(t.weight.dims(), &[4, 6, 3, 3]);
        assert!(t.bias.is_none());
        assert_eq!(t.forward(&x)?.dims(), &[2, 6, 12, 12]);
        let c1 = Conv1d::new(3, 2, &[2], &mut gen)?;
        let x1 = Tensor::randn([1, 3, 4], DType::F32, &mut gen)?;
        assert_eq!(c1.forward(&x1)?.dims(), &[1, 2, 3]);
        let c3 = ConvTranspose3d::new(2, 2, &[2], &mut gen)?;
        let x3 = Tensor::randn([1, 2, 2, 2, 2], DType::F32, &mut gen)?;
        assert_eq!(c3.forward(&x3)?.dims(), &[1, 2, 3, 3, 3]);
        assert!(Conv3d::new(3, 4, &[1, 2], &mut gen).is_err());
        Ok(())
    }
}
