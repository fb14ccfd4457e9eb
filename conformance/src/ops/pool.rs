//! Op-table entries: pooling (max, average, adaptive, fractional, unpooling), padding
//! (`torch.nn.functional.pad`) and grid sampling.

use std::ops::Deref;

use amp::autograd::{ops, Tensor};
use amp::tensor::Generator;

use super::{required, Bound, BuiltinTensor, FromArg, IntoOutput, A, R};
use crate::args::{Arg, Output};
use crate::optable::OpTable;

/// Pooling sizes: an int or a list of ints, none negative; empty when absent or `None`
/// (after the signature's default: `padding=0`, `dilation=1`).
struct Sizes(Vec<usize>);

impl Deref for Sizes {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.0
    }
}

fn size(name: &str, v: i64) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("`{name}`: negative value {v}"))
}

impl<'a> FromArg<'a> for Sizes {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        let ints = arg.map_or(Ok(Vec::new()), |a| Vec::<i64>::from_arg(name, Some(a)))?;
        let sizes = ints.into_iter().map(|v| size(name, v));
        sizes.collect::<Result<_, _>>().map(Sizes)
    }
}

/// An adaptive `output_size`: an int, or a list of ints and `None`s (keep the input size).
struct OutputSize(Vec<Option<usize>>);

impl<'a> FromArg<'a> for OutputSize {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        let one_size = |a: &'a A| match a {
            Arg::None => Ok(None),
            a => size(name, i64::from_arg(name, Some(a))?).map(Some),
        };
        match required(name, arg)? {
            Arg::List(items) => items.iter().map(one_size).collect(),
            a => Ok(vec![one_size(a)?]),
        }
        .map(OutputSize)
    }
}

/// The values of a pooling, with the indices of the maxima when `with_indices`.
fn pair(r: amp::autograd::Result<(Tensor, Tensor)>, with_indices: bool) -> R {
    let (v, i) = r.map_err(super::err)?;
    Ok(if with_indices {
        Output::Tensors(vec![v, i])
    } else {
        Output::Tensor(v)
    })
}

const MAX_POOL: &str = "input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, \
                        return_indices=False";

fn max_pool(b: &Bound<'_>, n: usize) -> R {
    b.call(
        |x: &Tensor, k: Sizes, s: Sizes, p: Sizes, d: Sizes, ceil: bool, indices: bool| {
            pair(
                ops::max_pool_nd_with_indices(x, n, &k, &s, &p, &d, ceil),
                indices,
            )
        },
    )
}

/// `avg_pool1d`'s signature; 2-d and 3-d add `divisor_override=None`.
const AVG_POOL: &str = "input, kernel_size, stride=None, padding=0, ceil_mode=False, \
                        count_include_pad=True";

fn avg_pool(b: &Bound<'_>, n: usize) -> R {
    let x = b.arg("input")?;
    let divisor = if n > 1 {
        b.arg("divisor_override")?
    } else {
        None
    };
    let sizes: [Sizes; 3] = [b.arg("kernel_size")?, b.arg("stride")?, b.arg("padding")?];
    let (ceil, count_pad) = (b.arg("ceil_mode")?, b.arg("count_include_pad")?);
    let [k, s, p] = &sizes;
    ops::avg_pool_nd(x, n, k, s, p, ceil, count_pad, divisor).into_output()
}

const MAX_UNPOOL: &str = "input, indices, kernel_size, stride=None, padding=0, output_size=None";

fn max_unpool(b: &Bound<'_>, n: usize) -> R {
    b.call(
        |x: &Tensor, i: &Tensor, k: Sizes, s: Sizes, p: Sizes, out: Option<Sizes>| {
            ops::max_unpool_nd(x, i, n, &k, &s, &p, out.as_deref())
        },
    )
}

const FRACTIONAL: &str = "input, kernel_size, output_size=None, output_ratio=None, \
                          return_indices=False, _random_samples=None";

fn fractional(b: &Bound<'_>, n: usize) -> R {
    b.call(
        |x: &Tensor,
         k: Sizes,
         out: Option<Sizes>,
         ratio: Option<Vec<f64>>,
         indices: bool,
         samples: Option<&Tensor>| {
            // Without `_random_samples` the windows come from the workspace's seeded generator.
            let mut gen = Generator::new(0);
            let (out, ratio) = (out.as_deref(), ratio.as_deref());
            pair(
                ops::fractional_max_pool_nd(x, n, &k, out, ratio, samples, &mut gen),
                indices,
            )
        },
    )
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    for n in 1..=3 {
        let call = |name: &str| format!("torch.nn.functional.{name}{n}d");
        t.op(&call("max_pool"), MAX_POOL, move |b| max_pool(b, n));
        let avg = match n {
            1 => AVG_POOL.to_owned(),
            _ => format!("{AVG_POOL}, divisor_override=None"),
        };
        t.op(&call("avg_pool"), &avg, move |b| avg_pool(b, n));
        t.op(&call("adaptive_avg_pool"), "input, output_size", move |b| {
            b.call(|x: &Tensor, size: OutputSize| ops::adaptive_avg_pool_nd(x, n, &size.0))
        });
        let adaptive_max = "input, output_size, return_indices=False";
        t.op(&call("adaptive_max_pool"), adaptive_max, move |b| {
            b.call(|x: &Tensor, size: OutputSize, indices: bool| {
                pair(ops::adaptive_max_pool_nd(x, n, &size.0), indices)
            })
        });
        t.op(&call("max_unpool"), MAX_UNPOOL, move |b| max_unpool(b, n));
        if n > 1 {
            t.op(&call("fractional_max_pool"), FRACTIONAL, move |b| {
                fractional(b, n)
            });
        }
    }
    t.op(
        "torch.nn.functional.pad",
        "input, pad, mode='constant', value=None",
        |b| {
            b.call(
                |x: &Tensor, pad: Vec<i64>, mode: &str, value: Option<f64>| {
                    ops::pad(x, &pad, mode, value)
                },
            )
        },
    );
    let grid_sample = "input, grid, mode='bilinear', padding_mode='zeros', align_corners=False";
    t.op("torch.nn.functional.grid_sample", grid_sample, |b| {
        b.call(ops::grid_sample)
    });
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn ops_without_vectors_run_through_their_calls() {
        let x = t(&(0..16).map(f64::from).collect::<Vec<_>>(), &[1, 1, 4, 4]);
        // max_pool2d with indices, then max_unpool2d puts the maxima back.
        let max_pool = call("torch.nn.functional.max_pool2d").arg(&x).arg(2);
        let out = max_pool.kw("return_indices", true).tensors();
        assert_eq!(out[0].to_vec_f64(), [5.0, 7.0, 13.0, 15.0]);
        assert_eq!(out[1].to_vec::<i64>().unwrap(), [5, 7, 13, 15]);
        let [v, i] = [0, 1].map(|k| Arg::Tensor(out[k].clone()));
        let un = call("torch.nn.functional.max_unpool2d")
            .arg(v)
            .arg(i)
            .arg(2)
            .values();
        let mut want = vec![0.0; 16];
        for i in [5, 7, 13, 15] {
            want[i] = i as f64;
        }
        assert_eq!(un, want);
        // fractional_max_pool2d with explicit samples: deterministic windows.
        let fractional = call("torch.nn.functional.fractional_max_pool2d")
            .arg(&x)
            .arg(2);
        let fractional = fractional.kw("output_size", 2).kw("return_indices", true);
        let fr = fractional
            .kw("_random_samples", t(&[0.5, 0.5], &[1, 1, 2]))
            .tensors();
        // alpha = 2, starts int((i + .5) * 2) - 1 = 0 and the last 2 → windows at 0 and 2.
        assert_eq!(fr[0].to_vec_f64(), [5.0, 7.0, 13.0, 15.0]);
        let cube = t(&[1.0; 27], &[1, 1, 3, 3, 3]);
        let fractional = call("torch.nn.functional.fractional_max_pool3d")
            .arg(cube)
            .arg(2);
        let fr3 = fractional.kw("output_ratio", 0.5).tensors();
        assert_eq!(fr3[0].dims(), &[1, 1, 1, 1, 1]);
        let keep_middle = Arg::List(vec![Arg::Int(1), Arg::None, Arg::Int(1)]);
        let input = t(&(0..8).map(f64::from).collect::<Vec<_>>(), &[1, 2, 2, 2]);
        let adaptive = call("torch.nn.functional.adaptive_max_pool3d").arg(input);
        let am = adaptive.kw("output_size", keep_middle).tensors();
        assert_eq!(am[0].to_vec_f64(), [5.0, 7.0]);
        // grid_sample: the identity grid with align_corners reproduces the input.
        let grid = t(
            &[
                -1.0, -1.0, 1.0, -1.0, //
                -1.0, 1.0, 1.0, 1.0,
            ],
            &[1, 2, 2, 2],
        );
        let img = t(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
        let grid_sample = || call("torch.nn.functional.grid_sample").arg(&img).arg(&grid);
        for mode in ["bilinear", "nearest", "bicubic"] {
            let g = grid_sample().op("grid_sampler_2d").kw("mode", mode);
            let g = g.kw("padding_mode", "border").kw("align_corners", true);
            assert_eq!(g.values(), [1.0, 2.0, 3.0, 4.0]);
        }
        let e = grid_sample().kw("mode", "bicubical").err();
        assert!(e.contains("bicubical"), "{e}");
        // Constant pad with a value.
        let pad = call("torch.nn.functional.pad")
            .op("constant_pad_nd")
            .arg(&img)
            .arg(ints(&[1, 0]));
        let p = pad.kw("value", 9.0).values();
        assert_eq!(p, [9.0, 1.0, 2.0, 9.0, 3.0, 4.0]);
    }
}
