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
        let out = run(
            "torch.nn.functional.max_pool2d",
            "max_pool2d",
            &[x.clone(), Arg::Int(2)],
            &kw(vec![("return_indices", Arg::Bool(true))]),
        )
        .unwrap()
        .into_tensors();
        assert_eq!(out[0].to_vec_f64(), [5.0, 7.0, 13.0, 15.0]);
        assert_eq!(out[1].to_vec::<i64>().unwrap(), [5, 7, 13, 15]);
        let un = run(
            "torch.nn.functional.max_unpool2d",
            "max_unpool2d",
            &[
                Arg::Tensor(out[0].clone()),
                Arg::Tensor(out[1].clone()),
                Arg::Int(2),
            ],
            &K::default(),
        )
        .unwrap()
        .into_tensors();
        let mut want = vec![0.0; 16];
        for i in [5, 7, 13, 15] {
            want[i] = i as f64;
        }
        assert_eq!(un[0].to_vec_f64(), want);
        // fractional_max_pool2d with explicit samples: deterministic windows.
        let samples = t(&[0.5, 0.5], &[1, 1, 2]);
        let fr = run(
            "torch.nn.functional.fractional_max_pool2d",
            "fractional_max_pool2d",
            &[x.clone(), Arg::Int(2)],
            &kw(vec![
                ("output_size", Arg::Int(2)),
                ("return_indices", Arg::Bool(true)),
                ("_random_samples", samples),
            ]),
        )
        .unwrap()
        .into_tensors();
        // alpha = 2, starts int((i + .5) * 2) - 1 = 0 and the last 2 → windows at 0 and 2.
        assert_eq!(fr[0].to_vec_f64(), [5.0, 7.0, 13.0, 15.0]);
        let fr3 = run(
            "torch.nn.functional.fractional_max_pool3d",
            "fractional_max_pool3d",
            &[t(&[1.0; 27], &[1, 1, 3, 3, 3]), Arg::Int(2)],
            &kw(vec![("output_ratio", Arg::Float(0.5))]),
        )
        .unwrap()
        .into_tensors();
        assert_eq!(fr3[0].dims(), &[1, 1, 1, 1, 1]);
        let am = run(
            "torch.nn.functional.adaptive_max_pool3d",
            "adaptive_max_pool3d",
            &[t(&(0..8).map(f64::from).collect::<Vec<_>>(), &[1, 2, 2, 2])],
            &kw(vec![(
                "output_size",
                Arg::List(vec![Arg::Int(1), Arg::None, Arg::Int(1)]),
            )]),
        )
        .unwrap()
        .into_tensors();
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
        for mode in ["bilinear", "nearest"] {
            let g = run(
                "torch.nn.functional.grid_sample",
                "grid_sampler_2d",
                &[img.clone(), grid.clone()],
                &kw(vec![
                    ("mode", Arg::Str(mode.into())),
                    ("padding_mode", Arg::Str("border".into())),
                    ("align_corners", Arg::Bool(true)),
                ]),
            )
            .unwrap()
            .into_tensors();
            assert_eq!(g[0].to_vec_f64(), [1.0, 2.0, 3.0, 4.0]);
        }
        let e = run(
            "torch.nn.functional.grid_sample",
            "grid_sample",
            &[img.clone(), grid],
            &kw(vec![("mode", Arg::Str("bicubic".into()))]),
        )
        .unwrap_err();
        assert!(e.contains("bicubic"), "{e}");
        // Constant pad with a value.
        let p = run(
            "torch.nn.functional.pad",
            "constant_pad_nd",
            &[img, Arg::List(vec![Arg::Int(1), Arg::Int(0)])],
            &kw(vec![("value", Arg::Float(9.0))]),
        )
        .unwrap()
        .into_tensors();
        assert_eq!(p[0].to_vec_f64(), [9.0, 1.0, 2.0, 9.0, 3.0, 4.0]);
    }
}
