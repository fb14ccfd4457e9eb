//! Op-table entries: `torch.nn.functional.conv{1,2,3}d` and `conv_transpose{1,2,3}d`.

use amp::autograd::{ops, Tensor};

use super::{usizes, Bound, BuiltinTensor, IntoOutput, Out, R};
use crate::args::Arg;
use crate::optable::OpTable;

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
        _ => b.arg("padding"),
    }
}

/// `groups`: an int, not negative.
fn groups(b: &Bound<'_>) -> Result<usize, String> {
    Ok(usizes(vec![b.arg("groups")?], "groups")?[0])
}

type ConvFn = fn(&Tensor, &Tensor, Option<&Tensor>, &[usize], &[usize], &[usize], usize) -> Out;
/// As [`ConvFn`], with `output_padding` after `padding` and `dilation` last.
type ConvTFn =
    fn(&Tensor, &Tensor, Option<&Tensor>, &[usize], &[usize], &[usize], usize, &[usize]) -> Out;

/// `conv{N}d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)`.
fn conv(b: &Bound<'_>, f: ConvFn) -> R {
    let w: &Tensor = b.arg("weight")?;
    let stride: Vec<usize> = b.arg("stride")?;
    let dilation: Vec<usize> = b.arg("dilation")?;
    let padding = conv_padding(b, w.dims(), &stride, &dilation)?;
    let (x, bias, groups) = (b.arg("input")?, b.arg("bias")?, groups(b)?);
    f(x, w, bias, &stride, &padding, &dilation, groups).into_output()
}

/// `conv_transpose{N}d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
/// groups=1, dilation=1)`.
fn conv_t(b: &Bound<'_>, f: ConvTFn) -> R {
    let groups = groups(b)?;
    let sizes: [Vec<usize>; 4] = [
        b.arg("stride")?,
        b.arg("padding")?,
        b.arg("output_padding")?,
        b.arg("dilation")?,
    ];
    let [stride, padding, output_padding, dilation] = &sizes;
    let (x, w, bias) = (b.arg("input")?, b.arg("weight")?, b.arg("bias")?);
    f(
        x,
        w,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
    )
    .into_output()
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    let convs: [(usize, ConvFn, ConvTFn); 3] = [
        (1, ops::conv1d, ops::conv_transpose1d),
        (2, ops::conv2d, ops::conv_transpose2d),
        (3, ops::conv3d, ops::conv_transpose3d),
    ];
    for (n, f, f_t) in convs {
        let sig = "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1";
        t.op(&format!("torch.nn.functional.conv{n}d"), sig, move |b| {
            conv(b, f)
        });
        let sig = "input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, \
                   dilation=1";
        t.op(
            &format!("torch.nn.functional.conv_transpose{n}d"),
            sig,
            move |b| conv_t(b, f_t),
        );
    }
}
