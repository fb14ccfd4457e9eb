//! Op-table entries: Convolutions, pooling, padding and grid sampling.

use super::BuiltinTensor;
use crate::optable::OpTable;

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    convolutions::register(t);
}

/// `torch.nn.functional.conv{1,2,3}d` and `conv_transpose{1,2,3}d`.
mod convolutions {
    use super::super::{bind, one, usizes, Bound, A, K, R};
    use super::BuiltinTensor;
    use crate::args::Arg;
    use crate::optable::OpTable;
    use amp::autograd::ops;

    /// An `int` or `int[]` size parameter, `default` when absent.
    fn sizes(b: &Bound<'_>, name: &str, default: usize) -> Result<Vec<usize>, String> {
        match b.get(name) {
            None => Ok(vec![default]),
            Some(a) => usizes(a.ints().map_err(|e| format!("`{name}`: {e}"))?, name),
        }
    }

    /// `padding` of a forward convolution: ints, `'valid'`, or `'same'` (symmetric
    /// padding; PyTorch pads one extra element on the right when the total is odd,
    /// which is not supported here).
    fn conv_padding(
        b: &Bound<'_>,
        weight_dims: &[usize],
        stride: &[usize],
        dilation: &[usize],
    ) -> Result<Vec<usize>, String> {
        match b.get("padding") {
            Some(Arg::Str(s)) if s == "valid" => Ok(vec![0]),
            Some(Arg::Str(s)) if s == "same" => {
                if stride.iter().any(|&s| s != 1) {
                    return Err("padding='same' is not supported for strided convolutions".into());
                }
                let k = &weight_dims[2..];
                let d = |i: usize| {
                    if dilation.len() == 1 {
                        dilation[0]
                    } else {
                        dilation[i]
                    }
                };
                k.iter()
                    .enumerate()
                    .map(|(i, &k)| {
                        let total = d(i) * (k.max(1) - 1);
                        if total % 2 == 0 {
                            Ok(total / 2)
                        } else {
                            Err("`padding='same'` with an even kernel extent (asymmetric padding) is not supported".to_string())
                        }
                    })
                    .collect()
            }
            Some(Arg::Str(s)) => Err(format!("Invalid padding string '{s}'")),
            _ => sizes(b, "padding", 0),
        }
    }

    type ConvFn = fn(
        &BuiltinTensor,
        &BuiltinTensor,
        Option<&BuiltinTensor>,
        &[usize],
        &[usize],
        &[usize],
        usize,
    ) -> amp::autograd::Result<BuiltinTensor>;

    type ConvTFn = fn(
        &BuiltinTensor,
        &BuiltinTensor,
        Option<&BuiltinTensor>,
        &[usize],
        &[usize],
        &[usize],
        usize,
        &[usize],
    ) -> amp::autograd::Result<BuiltinTensor>;

    /// `conv{N}d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)`.
    fn conv(f: ConvFn) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
        move |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "input", "weight", "bias", "stride", "padding", "dilation", "groups",
                ],
                &[],
            )?;
            let w = b.tensor("weight")?;
            let stride = sizes(&b, "stride", 1)?;
            let dilation = sizes(&b, "dilation", 1)?;
            let padding = conv_padding(&b, w.dims(), &stride, &dilation)?;
            let groups = usizes(vec![b.int_or("groups", 1)?], "groups")?[0];
            one(f(
                b.tensor("input")?,
                w,
                b.opt_tensor("bias")?,
                &stride,
                &padding,
                &dilation,
                groups,
            ))
        }
    }

    /// `conv_transpose{N}d(input, weight, bias=None, stride=1, padding=0,
    /// output_padding=0, groups=1, dilation=1)`.
    fn conv_t(f: ConvTFn) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
        move |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "input",
                    "weight",
                    "bias",
                    "stride",
                    "padding",
                    "output_padding",
                    "groups",
                    "dilation",
                ],
                &[],
            )?;
            let groups = usizes(vec![b.int_or("groups", 1)?], "groups")?[0];
            one(f(
                b.tensor("input")?,
                b.tensor("weight")?,
                b.opt_tensor("bias")?,
                &sizes(&b, "stride", 1)?,
                &sizes(&b, "padding", 0)?,
                &sizes(&b, "output_padding", 0)?,
                groups,
                &sizes(&b, "dilation", 1)?,
            ))
        }
    }

    pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
        t.insert("torch.nn.functional.conv1d", conv(ops::conv1d));
        t.insert("torch.nn.functional.conv2d", conv(ops::conv2d));
        t.insert("torch.nn.functional.conv3d", conv(ops::conv3d));
        t.insert(
            "torch.nn.functional.conv_transpose1d",
            conv_t(ops::conv_transpose1d),
        );
        t.insert(
            "torch.nn.functional.conv_transpose2d",
            conv_t(ops::conv_transpose2d),
        );
        t.insert(
            "torch.nn.functional.conv_transpose3d",
            conv_t(ops::conv_transpose3d),
        );
    }
}
