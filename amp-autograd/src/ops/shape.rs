//! Views and data movement: reshape, transpose, permute, expand, narrow, select,
//! (un)squeeze, flatten, cat, stack, gather/scatter, index_select/index_add/index_copy,
//! embedding.

use amp_tensor::{wrap_dim, Tensor as Raw};

use super::names::{
    CAT, CONTIGUOUS, EMBEDDING, EXPAND, GATHER, INDEX_ADD, INDEX_COPY, INDEX_SELECT, NARROW,
    PERMUTE, RESHAPE, SCATTER_ADD, SELECT, SPLIT, SQUEEZE, STACK, TRANSPOSE, UNSQUEEZE, VIEW,
};
use super::{enter, enter_vec, sum_to};
use crate::graph::{grad_if, record, record_multi};
use crate::{Result, Tensor};

fn same_shape_back(out: Raw, name: &'static str, x: &Tensor) -> Tensor {
    let dims = x.dims().to_vec();
    record(out, name, &[x], move |g| Ok(vec![Some(reshape(g, &dims)?)]))
}

/// Another shape over the same elements (`-1` infers one size): a view when the
/// strides allow it, else a copy.
pub fn reshape(x: &Tensor, shape: impl amp_tensor::IntoDims) -> Result<Tensor> {
    let ([x], _body) = enter(&RESHAPE, [x])?;
    if x.dims() == shape.resolve("reshape", x.elem_count())?.as_slice() {
        return Ok(x);
    }
    let out = x.data().reshape(shape)?;
    Ok(same_shape_back(out, "ViewBackward0", &x))
}

/// A view with another shape (fails when the strides do not allow one).
pub fn view(x: &Tensor, shape: impl amp_tensor::IntoDims) -> Result<Tensor> {
    let ([x], _body) = enter(&VIEW, [x])?;
    let out = x.data().view(shape)?;
    Ok(same_shape_back(out, "ViewBackward0", &x))
}

/// Swap two dims (a view).
pub fn transpose(x: &Tensor, d0: i64, d1: i64) -> Result<Tensor> {
    let ([x], _body) = enter(&TRANSPOSE, [x])?;
    let out = x.data().transpose(d0, d1)?;
    Ok(record(out, "TransposeBackward0", &[&x], move |g| {
        Ok(vec![Some(transpose(g, d0, d1)?)])
    }))
}

/// Transpose of a ≤2-D tensor.
pub fn t(x: &Tensor) -> Result<Tensor> {
    if x.rank() < 2 {
        return Ok(x.clone());
    }
    transpose(x, 0, 1)
}

/// Reorder dims (a view).
pub fn permute(x: &Tensor, perm: &[i64]) -> Result<Tensor> {
    let ([x], _body) = enter(&PERMUTE, [x])?;
    let out = x.data().permute(perm)?;
    let n = x.rank();
    let mut inv = vec![0i64; n];
    for (i, &p) in perm.iter().enumerate() {
        inv[wrap_dim(p, n)?] = i as i64;
    }
    Ok(record(out, "PermuteBackward0", &[&x], move |g| {
        Ok(vec![Some(permute(g, &inv)?)])
    }))
}

/// Broadcast to `dims` without copying.
pub fn expand(x: &Tensor, dims: &[usize]) -> Result<Tensor> {
    if x.dims() == dims {
        return Ok(x.clone());
    }
    let ([x], _body) = enter(&EXPAND, [x])?;
    let out = x.data().broadcast_to(dims)?;
    let xd = x.dims().to_vec();
    Ok(record(out, "ExpandBackward0", &[&x], move |g| {
        Ok(vec![Some(sum_to(g, &xd)?)])
    }))
}

/// `len` entries of `dim` from `start` (a view).
pub fn narrow(x: &Tensor, dim: i64, start: usize, len: usize) -> Result<Tensor> {
    let ([x], _body) = enter(&NARROW, [x])?;
    let out = x.data().narrow(dim, start, len)?;
    let xd = x.dims().to_vec();
    Ok(record(out, "NarrowBackward0", &[&x], move |g| {
        Ok(vec![Some(narrow_scatter(g, &xd, dim, start)?)])
    }))
}

/// Zeros of shape `dims` with `src` written at `start..` along `dim` (the backward of
/// [`narrow`]; its own backward is `narrow`).
pub fn narrow_scatter(src: &Tensor, dims: &[usize], dim: i64, start: usize) -> Result<Tensor> {
    let z = Raw::zeros_on(dims, src.dtype(), src.device())?;
    let len = src.dims()[wrap_dim(dim, src.rank())?];
    z.narrow(dim, start, len)?.copy_(src.data())?;
    Ok(record(z, "NarrowScatterBackward", &[src], move |g| {
        Ok(vec![Some(narrow(g, dim, start, len)?)])
    }))
}

/// Entry `index` of `dim`, dropping it (a view).
pub fn select(x: &Tensor, dim: i64, index: i64) -> Result<Tensor> {
    let ([x], _body) = enter(&SELECT, [x])?;
    let out = x.data().select(dim, index)?;
    let xd = x.dims().to_vec();
    let d = wrap_dim(dim, x.rank())?;
    let i = if index < 0 {
        index + xd[d] as i64
    } else {
        index
    } as usize;
    Ok(record(out, "SelectBackward0", &[&x], move |g| {
        Ok(vec![Some(narrow_scatter(
            &unsqueeze(g, d as i64)?,
            &xd,
            d as i64,
            i,
        )?)])
    }))
}

/// Insert a size-1 dim (a view).
pub fn unsqueeze(x: &Tensor, dim: i64) -> Result<Tensor> {
    let ([x], _body) = enter(&UNSQUEEZE, [x])?;
    let out = x.data().unsqueeze(dim)?;
    Ok(same_shape_back(out, "UnsqueezeBackward0", &x))
}

/// Drop `dim` if its size is 1 (a view).
pub fn squeeze(x: &Tensor, dim: i64) -> Result<Tensor> {
    let ([x], _body) = enter(&SQUEEZE, [x])?;
    let out = x.data().squeeze(dim)?;
    Ok(same_shape_back(out, "SqueezeBackward1", &x))
}

/// Merge dims `start..=end`.
pub fn flatten(x: &Tensor, start: i64, end: i64) -> Result<Tensor> {
    let dims = x.data().flatten(start, end)?.dims().to_vec();
    reshape(x, dims)
}

/// A contiguous tensor with the same values.
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        return Ok(x.clone());
    }
    let ([x], _body) = enter(&CONTIGUOUS, [x])?;
    let out = x.data().try_contiguous()?;
    Ok(record(out, "CloneBackward0", &[&x], move |g| {
        Ok(vec![Some(g.clone())])
    }))
}

/// Concatenate along `dim` (promoting to a common dtype).
pub fn cat(ts: &[Tensor], dim: i64) -> Result<Tensor> {
    let refs: Vec<&Tensor> = ts.iter().collect();
    let (ts, _body) = enter_vec(&CAT, &refs)?;
    let raws: Vec<Raw> = ts.iter().map(|t| t.data().clone()).collect();
    let out = amp_kernels::cat(&raws, dim)?;
    let d = wrap_dim(dim, out.rank())? as i64;
    let sizes: Vec<Option<usize>> = ts
        .iter()
        .map(|t| {
            (t.rank() > 0 && t.elem_count() > 0 || t.rank() == out.rank())
                .then(|| t.dims().get(d as usize).copied().unwrap_or(0))
        })
        .collect();
    let refs: Vec<&Tensor> = ts.iter().collect();
    Ok(record(out, "CatBackward0", &refs, move |g| {
        let mut off = 0;
        let mut v = Vec::with_capacity(sizes.len());
        for s in &sizes {
            match s {
                Some(n) => {
                    v.push(Some(narrow(g, d, off, *n)?));
                    off += n;
                }
                None => v.push(None),
            }
        }
        Ok(v)
    }))
}

/// `torch.split(x, split_size, dim)`: views of `split_size` entries of `dim` each, the
/// last one shorter when the size does not divide. The backward is one [`cat`] of the
/// pieces' gradients (zeros for a piece that has none), not one zero-filled scatter per
/// piece as separate [`narrow`]s would take.
pub fn split(x: &Tensor, split_size: usize, dim: i64) -> Result<Vec<Tensor>> {
    let ([x], _body) = enter(&SPLIT, [x])?;
    if x.rank() == 0 {
        return Err(crate::Error::invalid(
            "split",
            "split expects at least a 1-dimensional tensor",
        ));
    }
    let d = wrap_dim(dim, x.rank())?;
    let size = x.dims()[d];
    if split_size == 0 && size != 0 {
        return Err(crate::Error::invalid(
            "split",
            format!(
                "split_size can only be 0 if dimension size is 0, but got dimension size of {size}"
            ),
        ));
    }
    let pieces: Vec<(usize, usize)> = if split_size == 0 {
        vec![(0, 0)]
    } else {
        (0..size.div_ceil(split_size).max(1))
            .map(|i| (i * split_size, split_size.min(size - i * split_size)))
            .collect()
    };
    let outs = pieces
        .iter()
        .map(|&(start, len)| x.data().narrow(d as i64, start, len))
        .collect::<amp_tensor::Result<Vec<Raw>>>()?;
    let (xd, dtype, device) = (x.dims().to_vec(), x.dtype(), x.device());
    let diff = vec![true; pieces.len()];
    Ok(record_multi(
        outs,
        &diff,
        "SplitBackward0",
        &[&x],
        Box::new(move |gs| {
            let parts = gs
                .iter()
                .zip(&pieces)
                .map(|(g, &(_, len))| match g {
                    Some(g) => Ok(g.clone()),
                    None => {
                        let mut dims = xd.clone();
                        dims[d] = len;
                        Tensor::zeros_on(dims, dtype, device)
                    }
                })
                .collect::<Result<Vec<Tensor>>>()?;
            Ok(vec![Some(cat(&parts, d as i64)?)])
        }),
    ))
}

/// Stack along a new dim `dim`.
pub fn stack(ts: &[Tensor], dim: i64) -> Result<Tensor> {
    let refs: Vec<&Tensor> = ts.iter().collect();
    let (ts, _body) = enter_vec(&STACK, &refs)?;
    let Some(first) = ts.first() else {
        return Err(crate::Error::invalid(
            "stack",
            "stack expects a non-empty TensorList",
        ));
    };
    let d = wrap_dim(dim, first.rank() + 1)? as i64;
    let us = ts
        .iter()
        .map(|t| unsqueeze(t, d))
        .collect::<Result<Vec<_>>>()?;
    cat(&us, d)
}

/// `out[i][j] = x[index[i][j]][j]` for `dim = 0` (PyTorch's `gather`).
pub fn gather(x: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    let ([x, index], _body) = enter(&GATHER, [x, index])?;
    let out = amp_kernels::gather(x.data(), dim, index.data())?;
    let xd = x.dims().to_vec();
    let xs = x.clone();
    Ok(record(out, "GatherBackward0", &[&x], move |g| {
        let z = Tensor::zeros_on(xd.clone(), g.dtype(), g.device())?;
        Ok(vec![Some(super::pointwise::link_zero(
            scatter_add(&z, dim, &index, g)?,
            &xs,
        ))])
    }))
}

/// `x` with `src` added at `index` along `dim` (out of place).
pub fn scatter_add(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    let ([x, index, src], _body) = enter(&SCATTER_ADD, [x, index, src])?;
    let out = amp_kernels::scatter_add(x.data(), dim, index.data(), src.data())?;
    let (rx, rs) = (x.requires_grad(), src.requires_grad());
    Ok(record(out, "ScatterAddBackward0", &[&x, &src], move |g| {
        Ok(vec![
            grad_if(rx, || Ok(g.clone()))?,
            grad_if(rs, || gather(g, dim, &index))?,
        ])
    }))
}

/// The entries `index` (1-D ints) of `dim`.
pub fn index_select(x: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    let ([x, index], _body) = enter(&INDEX_SELECT, [x, index])?;
    let out = amp_kernels::index_select(x.data(), dim, index.data())?;
    let xd = x.dims().to_vec();
    Ok(record(out, "IndexSelectBackward0", &[&x], move |g| {
        let z = Tensor::zeros_on(xd.clone(), g.dtype(), g.device())?;
        Ok(vec![Some(index_add(&z, dim, &index, g, 1.0)?)])
    }))
}

/// `x` with `alpha * src` added at entries `index` of `dim` (out of place).
pub fn index_add(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor, alpha: f64) -> Result<Tensor> {
    let ([x, index, src], _body) = enter(&INDEX_ADD, [x, index, src])?;
    let out = amp_kernels::index_add(x.data(), dim, index.data(), src.data(), alpha)?;
    let (rx, rs) = (x.requires_grad(), src.requires_grad());
    Ok(record(out, "IndexAddBackward0", &[&x, &src], move |g| {
        Ok(vec![
            grad_if(rx, || Ok(g.clone()))?,
            grad_if(rs, || {
                super::pointwise::mul_scalar(&index_select(g, dim, &index)?, alpha)
            })?,
        ])
    }))
}

/// `x` with entries `index` of `dim` replaced by `src` (out of place).
pub fn index_copy(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    let ([x, index, src], _body) = enter(&INDEX_COPY, [x, index, src])?;
    let out = amp_kernels::index_copy(x.data(), dim, index.data(), src.data())?;
    let (rx, rs) = (x.requires_grad(), src.requires_grad());
    let sd = src.dims().to_vec();
    Ok(record(out, "IndexCopyBackward0", &[&x, &src], move |g| {
        Ok(vec![
            grad_if(rx, || {
                index_copy(
                    g,
                    dim,
                    &index,
                    &Tensor::zeros_on(sd.clone(), g.dtype(), g.device())?,
                )
            })?,
            grad_if(rs, || index_select(g, dim, &index))?,
        ])
    }))
}

/// Rows of `weight` picked by integer `indices` (shape `indices.shape + [dim]`).
pub fn embedding(weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    let ([weight, indices], _body) = enter(&EMBEDDING, [weight, indices])?;
    let flat = reshape(&indices, [-1i64])?;
    let rows = index_select(&weight, 0, &flat)?;
    let mut dims = indices.dims().to_vec();
    dims.push(weight.dims()[1]);
    reshape(&rows, dims)
}

/// Split into the outputs of a multi-output op (helper for ops returning tuples).
pub fn split_outputs(
    outs: Vec<Raw>,
    name: &'static str,
    inputs: &[&Tensor],
    backward: crate::graph::BackwardFn,
) -> Vec<Tensor> {
    let diff = vec![true; outs.len()];
    record_multi(outs, &diff, name, inputs, backward)
}

impl Tensor {
    /// See [`reshape`].
    pub fn reshape(&self, shape: impl amp_tensor::IntoDims) -> Result<Tensor> {
        reshape(self, shape)
    }
    /// See [`transpose`].
    pub fn transpose(&self, d0: i64, d1: i64) -> Result<Tensor> {
        transpose(self, d0, d1)
    }
    /// See [`t`].
    pub fn t(&self) -> Result<Tensor> {
        t(self)
    }
    /// See [`permute`].
    pub fn permute(&self, perm: &[i64]) -> Result<Tensor> {
        permute(self, perm)
    }
    /// See [`unsqueeze`].
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        unsqueeze(self, dim)
    }
    /// See [`squeeze`].
    pub fn squeeze(&self, dim: i64) -> Result<Tensor> {
        squeeze(self, dim)
    }
    /// See [`narrow`].
    pub fn narrow(&self, dim: i64, start: usize, len: usize) -> Result<Tensor> {
        narrow(self, dim, start, len)
    }
    /// See [`select`].
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        select(self, dim, index)
    }
    /// See [`expand`].
    pub fn expand(&self, dims: &[usize]) -> Result<Tensor> {
        expand(self, dims)
    }
    /// See [`flatten`].
    pub fn flatten(&self, start: i64, end: i64) -> Result<Tensor> {
        flatten(self, start, end)
    }
}
