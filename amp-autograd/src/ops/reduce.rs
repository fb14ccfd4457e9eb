//! Reductions: sum, mean, prod, amax/amin, max/min along a dim, norm, logsumexp,
//! var/std, cumsum, cumprod.

use amp_tensor::{wrap_dim, DType, Tensor as Raw};

use super::names::{
    AMAX, AMIN, CUMPROD, CUMSUM, LOGSUMEXP, MAX, MEAN, MIN, NORM, PROD, STD, SUM, VAR,
};
use super::pointwise::*;
use super::shape::{expand, scatter_add, unsqueeze};
use super::{enter, enter_cast, enter_dtype};
use crate::graph::{record, record_multi, SavedOutput};
use crate::{Result, Tensor};

/// The reduced dims, wrapped and sorted (empty `dims` means all).
fn reduced_dims(rank: usize, dims: &[i64]) -> Result<Vec<usize>> {
    if dims.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut v = dims
        .iter()
        .map(|&d| wrap_dim(d, rank))
        .collect::<amp_tensor::Result<Vec<_>>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Re-insert reduced dims into a reduction result (if `keepdim` was false) and
/// broadcast it back to `dims`.
pub(crate) fn expand_back(
    g: &Tensor,
    dims: &[usize],
    reduced: &[usize],
    keepdim: bool,
) -> Result<Tensor> {
    let mut g = g.clone();
    if !keepdim && !dims.is_empty() {
        for &d in reduced {
            g = unsqueeze(&g, d as i64)?;
        }
    }
    expand(&g, dims)
}

/// Number of elements a reduction over `reduced` combines.
fn count(dims: &[usize], reduced: &[usize]) -> usize {
    reduced.iter().map(|&d| dims[d]).product()
}

/// Sum over `dims` (all when empty), optionally keeping them as size 1, optionally in
/// `dtype` (the input is cast first, as PyTorch does).
pub fn sum(x: &Tensor, dims: &[i64], keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    let ([x], dtype, _body) = enter_dtype(&SUM, [x], dtype)?;
    sum_impl(&x, dims, keepdim, dtype)
}

/// Sum of every element (a 0-dim tensor).
pub fn sum_all(x: &Tensor) -> Result<Tensor> {
    sum(x, &[], false, None)
}

pub(crate) fn sum_impl(
    x: &Tensor,
    dims: &[i64],
    keepdim: bool,
    dtype: Option<DType>,
) -> Result<Tensor> {
    let x = match dtype {
        Some(d) => x.to_dtype(d)?,
        None => x.clone(),
    };
    let out = amp_kernels::sum(x.data(), dims, keepdim, None)?;
    let shape = x.dims().to_vec();
    let reduced = reduced_dims(x.rank(), dims)?;
    Ok(record(out, "SumBackward1", &[&x], move |g| {
        Ok(vec![Some(expand_back(g, &shape, &reduced, keepdim)?)])
    }))
}

/// Mean over `dims` (all when empty).
pub fn mean(x: &Tensor, dims: &[i64], keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&MEAN, x, dtype)?;
    let out = amp_kernels::mean(x.data(), dims, keepdim, None)?;
    let shape = x.dims().to_vec();
    let reduced = reduced_dims(x.rank(), dims)?;
    let n = count(&shape, &reduced).max(1) as f64;
    Ok(record(out, "MeanBackward1", &[&x], move |g| {
        Ok(vec![Some(expand_back(
            &div_scalar(g, n)?,
            &shape,
            &reduced,
            keepdim,
        )?)])
    }))
}

/// Mean of every element.
pub fn mean_all(x: &Tensor) -> Result<Tensor> {
    mean(x, &[], false, None)
}

/// Product over one dim (or all when `None`).
pub fn prod(x: &Tensor, dim: Option<i64>, keepdim: bool, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&PROD, x, dtype)?;
    let out = amp_kernels::prod(x.data(), dim, keepdim, None)?;
    let xs = x.clone();
    let shape = x.dims().to_vec();
    let reduced = match dim {
        Some(d) => vec![wrap_dim(d, x.rank())?],
        None => (0..x.rank()).collect(),
    };
    let dims_i: Vec<i64> = reduced.iter().map(|&d| d as i64).collect();
    Ok(record(out, "ProdBackward0", &[&x], move |g| {
        // Zero-safe: the product of the others where x is zero and it is the only zero.
        let is_zero = eq_scalar(&xs, 0.0)?;
        let zeros_in = sum(&is_zero.to_dtype(xs.dtype())?, &dims_i, true, None)?;
        let x_nz = where_(&is_zero, &ones_like(&xs), &xs)?;
        let p_nz = expand(&prod_keep(&x_nz, &dims_i)?, &shape)?;
        let zc = expand(&zeros_in, &shape)?;
        let none = eq_scalar(&zc, 0.0)?;
        let one = eq_scalar(&zc, 1.0)?;
        let zero = zeros_like(&xs);
        let at_nonzero = where_(&none, &div(&p_nz, &x_nz)?, &zero)?;
        let at_zero = where_(&one, &p_nz, &zero)?;
        let local = where_(&is_zero, &at_zero, &at_nonzero)?;
        Ok(vec![Some(mul(
            &expand_back(g, &shape, &reduced, keepdim)?,
            &local,
        )?)])
    }))
}

fn prod_keep(x: &Tensor, dims: &[i64]) -> Result<Tensor> {
    let mut p = x.clone();
    for &d in dims {
        p = prod(&p, Some(d), true, None)?;
    }
    Ok(p)
}

fn extreme(x: &Tensor, dims: &[i64], keepdim: bool, max: bool) -> Result<Tensor> {
    let out = if max {
        amp_kernels::amax(x.data(), dims, keepdim)?
    } else {
        amp_kernels::amin(x.data(), dims, keepdim)?
    };
    let xs = x.clone();
    let saved = out.clone();
    let shape = x.dims().to_vec();
    let reduced = reduced_dims(x.rank(), dims)?;
    Ok(record(
        out,
        if max {
            "AmaxBackward0"
        } else {
            "AminBackward0"
        },
        &[x],
        move |g| {
            let o = expand_back(&Tensor::from_raw(saved.clone()), &shape, &reduced, keepdim)?;
            let hit = eq(&xs, &o)?.to_dtype(g.dtype())?;
            let dims_i: Vec<i64> = reduced.iter().map(|&d| d as i64).collect();
            let n = expand(&sum(&hit, &dims_i, true, None)?, &shape)?;
            Ok(vec![Some(div(
                &mul(&expand_back(g, &shape, &reduced, keepdim)?, &hit)?,
                &n,
            )?)])
        },
    ))
}

/// Maximum over `dims` (gradient split evenly between ties).
pub fn amax(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    let ([x], _body) = enter(&AMAX, [x])?;
    extreme(&x, dims, keepdim, true)
}

/// Minimum over `dims`.
pub fn amin(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    let ([x], _body) = enter(&AMIN, [x])?;
    extreme(&x, dims, keepdim, false)
}

fn extreme_dim(x: &Tensor, dim: i64, keepdim: bool, max: bool) -> Result<(Tensor, Tensor)> {
    let (v, i) = if max {
        amp_kernels::max_dim(x.data(), dim, keepdim)?
    } else {
        amp_kernels::min_dim(x.data(), dim, keepdim)?
    };
    let idx = Tensor::from_raw(i.clone());
    let shape = x.dims().to_vec();
    let d = wrap_dim(dim, x.rank())? as i64;
    let mut outs = record_multi(
        vec![v, i],
        &[true, false],
        if max { "MaxBackward0" } else { "MinBackward0" },
        &[x],
        Box::new(move |grads| {
            let Some(g) = &grads[0] else {
                return Ok(vec![None]);
            };
            let (g, ix) = if keepdim {
                (g.clone(), idx.clone())
            } else {
                (unsqueeze(g, d)?, unsqueeze(&idx, d)?)
            };
            let z = Tensor::zeros_on(shape.clone(), g.dtype(), g.device())?;
            Ok(vec![Some(scatter_add(&z, d, &ix, &g)?)])
        }),
    );
    let i = outs.pop().expect("two outputs");
    let v = outs.pop().expect("two outputs");
    Ok((v, i))
}

/// `(values, indices)` of the maximum along `dim`.
pub fn max_dim(x: &Tensor, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    let ([x], _body) = enter(&MAX, [x])?;
    extreme_dim(&x, dim, keepdim, true)
}

/// `(values, indices)` of the minimum along `dim`.
pub fn min_dim(x: &Tensor, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
    let ([x], _body) = enter(&MIN, [x])?;
    extreme_dim(&x, dim, keepdim, false)
}

/// Index of the maximum (flattened when `dim` is `None`); not differentiable.
pub fn argmax(x: &Tensor, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
    Ok(Tensor::from_raw(amp_kernels::argmax(
        x.data(),
        dim,
        keepdim,
    )?))
}

/// Records `out`, a reduction of `x` over `dims`, whose gradient is `g · local(x, o,
/// reduced)` with `g` and the output `o` expanded back to `x`'s shape (`reduced`: the
/// reduced dims). Keeps `x` and the output.
fn reduction_by_local(
    out: Raw,
    name: &'static str,
    x: &Tensor,
    dims: &[i64],
    keepdim: bool,
    local: impl Fn(&Tensor, &Tensor, &[usize]) -> Result<Tensor> + Send + Sync + 'static,
) -> Result<Tensor> {
    let xs = x.clone();
    let shape = x.dims().to_vec();
    let reduced = reduced_dims(x.rank(), dims)?;
    let saved = SavedOutput::new(&out, 0);
    Ok(record(out, name, &[x], move |g| {
        let o = expand_back(&saved.get(), &shape, &reduced, keepdim)?;
        let g = expand_back(g, &shape, &reduced, keepdim)?;
        Ok(vec![Some(mul(&g, &local(&xs, &o, &reduced)?)?)])
    }))
}

/// Vector p-norm over `dims` (all when empty); `p` may be `f64::INFINITY`.
pub fn norm(x: &Tensor, p: f64, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    let ([x], _body) = enter(&NORM, [x])?;
    let out = amp_kernels::norm(x.data(), p, dims, keepdim)?;
    reduction_by_local(
        out,
        "NormBackward1",
        &x,
        dims,
        keepdim,
        move |xs, o, reduced| {
            let zero = zeros_like(xs);
            Ok(if p == 0.0 {
                zero
            } else if p == 1.0 {
                sign(xs)?
            } else if p.is_infinite() {
                let hit = eq(&abs(xs)?, o)?.to_dtype(xs.dtype())?;
                let dims_i: Vec<i64> = reduced.iter().map(|&d| d as i64).collect();
                let n = expand(&sum(&hit, &dims_i, true, None)?, xs.dims())?;
                div(&mul(&sign(xs)?, &hit)?, &n)?
            } else if p == 2.0 {
                let nz = ne_scalar(o, 0.0)?;
                where_(&nz, &div(xs, o)?, &zero)?
            } else {
                let nz = ne_scalar(o, 0.0)?;
                let num = mul(xs, &pow_scalar(&abs(xs)?, p - 2.0)?)?;
                where_(&nz, &div(&num, &pow_scalar(o, p - 1.0)?)?, &zero)?
            })
        },
    )
}

/// `log(sum(exp(x)))` over `dims`, computed stably.
pub fn logsumexp(x: &Tensor, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    let ([x], _body) = enter(&LOGSUMEXP, [x])?;
    let out = amp_kernels::logsumexp(x.data(), dims, keepdim)?;
    let local = |xs: &Tensor, o: &Tensor, _: &[usize]| exp(&sub(xs, o)?);
    reduction_by_local(out, "LogsumexpBackward0", &x, dims, keepdim, local)
}

/// Variance over `dims` with Bessel-style `correction` (PyTorch's default is 1).
pub fn var(x: &Tensor, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
    let ([x], _body) = enter(&VAR, [x])?;
    let reduced = reduced_dims(x.rank(), dims)?;
    let n = count(x.dims(), &reduced) as f64;
    let dims_i: Vec<i64> = reduced.iter().map(|&d| d as i64).collect();
    let m = mean(&x, &dims_i, true, None)?;
    let d = sub(&x, &m)?;
    div_scalar(
        &sum(&square(&d)?, &dims_i, keepdim, None)?,
        (n - correction).max(0.0),
    )
}

/// Standard deviation (the square root of [`var`]).
pub fn std(x: &Tensor, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
    let ([x], _body) = enter(&STD, [x])?;
    sqrt(&var(&x, dims, correction, keepdim)?)
}

/// Running sum along `dim`.
pub fn cumsum(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&CUMSUM, x, dtype)?;
    let out = amp_kernels::cumsum(x.data(), dim, None)?;
    Ok(record(out, "CumsumBackward0", &[&x], move |g| {
        Ok(vec![Some(reverse_cumsum(g, dim)?)])
    }))
}

/// `sum_{j >= i} g_j` along `dim`.
fn reverse_cumsum(g: &Tensor, dim: i64) -> Result<Tensor> {
    let total = sum(g, &[dim], true, None)?;
    add(&sub(&expand(&total, g.dims())?, &cumsum(g, dim, None)?)?, g)
}

/// Running product along `dim`.
pub fn cumprod(x: &Tensor, dim: i64, dtype: Option<DType>) -> Result<Tensor> {
    let (x, _body) = enter_cast(&CUMPROD, x, dtype)?;
    let out = amp_kernels::cumprod(x.data(), dim, None)?;
    let xs = x.clone();
    let saved = SavedOutput::new(&out, 0);
    Ok(record(out, "CumprodBackward0", &[&x], move |g| {
        let o = saved.get();
        Ok(vec![Some(div(&reverse_cumsum(&mul(g, &o)?, dim)?, &xs)?)])
    }))
}

impl Tensor {
    /// Sum of all elements.
    pub fn sum_all(&self) -> Result<Tensor> {
        sum_all(self)
    }
    /// Mean of all elements.
    pub fn mean_all(&self) -> Result<Tensor> {
        mean_all(self)
    }
    /// Sum over `dims`.
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        sum(self, dims, keepdim, None)
    }
    /// Mean over `dims`.
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        mean(self, dims, keepdim, None)
    }
}
