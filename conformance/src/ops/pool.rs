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
        t.insert(&format!("torch.nn.functional.max_unpool{n}d"), max_unpool(n));
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
        let mode: GridMode = b.str_or("mode", "bilinear")?.parse().map_err(|e: amp::tensor::Error| e.to_string())?;
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
