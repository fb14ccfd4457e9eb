//! Op-table entries: pooling (max, average, adaptive, fractional, unpooling), padding
//! (`torch.nn.functional.pad`) and grid sampling.

use amp::autograd::{ops, Tensor};
use amp::kernels::{GridMode, GridPadding};
use amp::tensor::Generator;

use super::{bind, one, Bound, BuiltinTensor, A, K, R};
use crate::args::{Arg, Output};
use crate::optable::OpTable;

/// Non-negative ints (an int or a list of ints); `None`/absent gives `default`.
fn sizes(b: &Bound<'_>, name: &str, default: &[usize]) -> Result<Vec<usize>, String> {
    match b.get(name) {
        None => Ok(default.to_vec()),
        Some(a) => a
            .ints()
            .map_err(|e| format!("`{name}`: {e}"))?
            .into_iter()
            .map(|v| usize::try_from(v).map_err(|_| format!("`{name}`: negative value {v}")))
            .collect(),
    }
}

/// An adaptive `output_size`: an int, or a list of ints and `None`s (keep the input size).
fn adaptive_size(b: &Bound<'_>) -> Result<Vec<Option<usize>>, String> {
    let one_size = |a: &A| -> Result<Option<usize>, String> {
        if a.is_none() {
            return Ok(None);
        }
        let v = a.int().map_err(|e| format!("`output_size`: {e}"))?;
        usize::try_from(v)
            .map(Some)
            .map_err(|_| format!("`output_size`: negative value {v}"))
    };
    match b.req("output_size")? {
        Arg::List(items) => items.iter().map(one_size).collect(),
        a => Ok(vec![one_size(a)?]),
    }
}

fn pair(r: amp::autograd::Result<(Tensor, Tensor)>, with_indices: bool) -> R {
    let (v, i) = r.map_err(|e| e.to_string())?;
    Ok(if with_indices {
        Output::Tensors(vec![v, i])
    } else {
        Output::Tensor(v)
    })
}

fn max_pool(n: usize) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "kernel_size",
                "stride",
                "padding",
                "dilation",
                "ceil_mode",
                "return_indices",
            ],
            &[],
        )?;
        pair(
            ops::max_pool_nd_with_indices(
                b.tensor("input")?,
                n,
                &sizes(&b, "kernel_size", &[])?,
                &sizes(&b, "stride", &[])?,
                &sizes(&b, "padding", &[0])?,
                &sizes(&b, "dilation", &[1])?,
                b.bool_or("ceil_mode", false)?,
            ),
            b.bool_or("return_indices", false)?,
        )
    }
}

fn avg_pool(n: usize) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let mut names = vec![
            "input",
            "kernel_size",
            "stride",
            "padding",
            "ceil_mode",
            "count_include_pad",
        ];
        if n > 1 {
            names.push("divisor_override");
        }
        let b = bind(args, kwargs, &names, &[])?;
        let div = if n > 1 {
            b.get("divisor_override")
                .map(|a| a.int().map_err(|e| format!("`divisor_override`: {e}")))
                .transpose()?
        } else {
            None
        };
        one(ops::avg_pool_nd(
            b.tensor("input")?,
            n,
            &sizes(&b, "kernel_size", &[])?,
            &sizes(&b, "stride", &[])?,
            &sizes(&b, "padding", &[0])?,
            b.bool_or("ceil_mode", false)?,
            b.bool_or("count_include_pad", true)?,
            div,
        ))
    }
}

fn adaptive_avg(n: usize) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &["input", "output_size"], &[])?;
        one(ops::adaptive_avg_pool_nd(
            b.tensor("input")?,
            n,
            &adaptive_size(&b)?,
        ))
    }
}

fn adaptive_max(n: usize) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "output_size", "return_indices"],
            &[],
        )?;
        pair(
            ops::adaptive_max_pool_nd(b.tensor("input")?, n, &adaptive_size(&b)?),
            b.bool_or("return_indices", false)?,
        )
    }
}

fn max_unpool(n: usize) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "indices",
                "kernel_size",
                "stride",
                "padding",
                "output_size",
            ],
            &[],
        )?;
        let out = match b.get("output_size") {
            None => None,
            Some(_) => Some(sizes(&b, "output_size", &[])?),
        };
        one(ops::max_unpool_nd(
            b.tensor("input")?,
            b.tensor("indices")?,
            n,
            &sizes(&b, "kernel_size", &[])?,
            &sizes(&b, "stride", &[])?,
            &sizes(&b, "padding", &[0])?,
            out.as_deref(),
        ))
    }
}

fn fractional(n: usize) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "kernel_size",
                "output_size",
                "output_ratio",
                "return_indices",
                "_random_samples",
            ],
            &[],
        )?;
        let out = match b.get("output_size") {
            None => None,
            Some(_) => Some(sizes(&b, "output_size", &[])?),
        };
        let ratio = match b.get("output_ratio") {
            None => None,
            Some(Arg::List(items)) => Some(
                items
                    .iter()
                    .map(|a| a.float().map_err(|e| format!("`output_ratio`: {e}")))
                    .collect::<Result<Vec<f64>, String>>()?,
            ),
            Some(a) => Some(vec![a
                .float()
                .map_err(|e| format!("`output_ratio`: {e}"))?]),
        };
        // Without `_random_samples` the windows come from the workspace's seeded generator.
        let mut gen = Generator::new(0);
        pair(
            ops::fractional_max_pool_nd(
                b.tensor("input")?,
                n,
                &sizes(&b, "kernel_size", &[])?,
                out.as_deref(),
                ratio.as_deref(),
                b.opt_tensor("_random_samples")?,
                &mut gen,
            ),
            b.bool_or("return_indices", false)?,
        )
    }
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    for n in 1..=3 {
        t.insert(&format!("torch.nn.functional.max_pool{n}d"), max_pool(n));
        t.insert(&format!("torch.nn.functional.avg_pool{n}d"), avg_pool(n));
        t.insert(
            &format!("torch.nn.functional.adaptive_avg_pool{n}d"),
            adaptive_avg(n),
        );
        t.insert(
            &format!("torch.nn.functional.adaptive_max_pool{n}d"),
            adaptive_max(n),
        );
        t.insert(
            &format!("torch.nn.functional.max_unpool{n}d"),
            max_unpool(n),
        );
    }
    for n in 2..=3 {
        t.insert(
            &format!("torch.nn.functional.fractional_max_pool{n}d"),
            fractional(n),
        );
    }
    t.insert("torch.nn.functional.pad", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "pad", "mode", "value"], &[])?;
        let pad = b.req("pad")?.ints().map_err(|e| format!("`pad`: {e}"))?;
        let value = b
            .get("value")
            .map(|a| a.float().map_err(|e| format!("`value`: {e}")))
            .transpose()?;
        one(ops::pad(
            b.tensor("input")?,
            &pad,
            b.str_or("mode", "constant")?,
            value,
        ))
    });
    t.insert("torch.nn.functional.grid_sample", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "grid", "mode", "padding_mode", "align_corners"],
            &[],
        )?;
        let mode: GridMode = b
            .str_or("mode", "bilinear")?
            .parse()
            .map_err(|e: amp::tensor::Error| e.to_string())?;
        let padding: GridPadding = b
            .str_or("padding_mode", "zeros")?
            .parse()
            .map_err(|e: amp::tensor::Error| e.to_string())?;
        one(ops::grid_sample(
            b.tensor("input")?,
            b.tensor("grid")?,
            mode,
            padding,
            b.bool_or("align_corners", false)?,
        ))
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
