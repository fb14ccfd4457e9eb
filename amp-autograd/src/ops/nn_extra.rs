//! prelu, bilinear, group_norm, and the promote-list ops cross (`torch.linalg.cross`),
//! index_put and tensordot.
//!
//! Each enters the dispatch point once under its documented name. prelu, group_norm,
//! cross and index_put are [opaque](crate::OpName::opaque) ops: their body runs with the layer
//! excluded (their own policy alone decides their dtypes); bilinear and tensordot are composites of `mm`/`bmm`,
//! whose casts they inherit, as PyTorch's `_trilinear` and `tensordot` do on CPU.

use amp_tensor::{broadcast_shapes, promote_types, wrap_dim, DType};

use super::loss_extra::{acc, back};
use super::matmul::{bmm, mm};
use super::names::{BILINEAR, CROSS, GROUP_NORM, INDEX_PUT, PRELU, TENSORDOT};
use super::pointwise::*;
use super::reduce::{mean, sum};
use super::shape::{expand, index_add, index_copy, index_select, permute, reshape};
use super::{check, enter, enter_vec};
use crate::grad_mode::{is_grad_enabled, no_grad};
use crate::graph::record_multi;
use crate::{Error, Result, Tensor};

/// Parametric ReLU: `x` where `x > 0`, `weight * x` elsewhere; `weight` has one element
/// or one per channel (dim 1 of `x`).
pub fn prelu(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    const OP: &str = "prelu";
    let ([x, weight], _body) = enter(&PRELU, [x, weight])?;
    check::prelu(&x, &weight)?;
    let wn = weight.elem_count();
    if weight.rank() > 1 {
        return Err(Error::invalid(
            OP,
            "prelu: Expected `weight` to be a scalar or 1D tensor",
        ));
    }
    let w = if wn == 1 {
        reshape(&weight, Vec::<usize>::new())?
    } else {
        let channels = if x.rank() >= 2 { x.dims()[1] } else { 1 };
        if x.rank() == 0 || channels != wn {
            return Err(Error::invalid(
                OP,
                format!(
                    "Mismatch of parameter numbers and input channel size. Found parameter \
                     numbers = {wn} and channel size = {channels}."
                ),
            ));
        }
        let mut shape = vec![1usize; x.rank() - 1];
        shape[0] = wn;
        reshape(&weight, shape)?
    };
    where_(&gt_scalar(&x, 0.0)?, &x, &mul(&w, &x)?)
}

/// Bilinear map `y[..., o] = x1[..., :] · weight[o] · x2[..., :] + bias[o]` with
/// `weight` `[out, in1, in2]` (`F.bilinear`).
pub fn bilinear(
    x1: &Tensor,
    x2: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    const OP: &str = "bilinear";
    let mut args = vec![x1, x2, weight];
    args.extend(bias);
    let (a, _body) = enter_vec(&BILINEAR, &args)?;
    let (x1, x2, w, b) = (&a[0], &a[1], &a[2], bias.map(|_| &a[3]));
    check::bilinear(x1, x2, w, b)?;
    if w.rank() != 3 {
        return Err(Error::invalid(
            OP,
            format!("bilinear(): weight must be 3-D, got {}-D", w.rank()),
        ));
    }
    let (o, i1, i2) = (w.dims()[0], w.dims()[1], w.dims()[2]);
    if x1.rank() == 0
        || x1.rank() != x2.rank()
        || x1.dims()[..x1.rank() - 1] != x2.dims()[..x2.rank() - 1]
    {
        return Err(Error::invalid(
            OP,
            format!(
                "bilinear(): input batch dimensions do not match: got {:?} and {:?}",
                x1.dims(),
                x2.dims()
            ),
        ));
    }
    if x1.dims()[x1.rank() - 1] != i1 || x2.dims()[x2.rank() - 1] != i2 {
        return Err(Error::invalid(
            OP,
            format!(
                "bilinear(): input sizes {:?} and {:?} do not match weight {:?}",
                x1.dims(),
                x2.dims(),
                w.dims()
            ),
        ));
    }
    if let Some(b) = b {
        if b.dims() != [o] {
            return Err(Error::invalid(
                OP,
                format!("bilinear(): bias size {:?} does not match [{o}]", b.dims()),
            ));
        }
    }
    // A transparent op: where no policy covers bilinear (CPU), its products go through the
    // dispatch point as `mm` and `bmm` and inherit their casts, as PyTorch's `_trilinear`
    // does; the result keeps the inputs' promoted dtype. Where a policy covers it (CUDA's
    // promote list), the body runs with the layer excluded.
    let dt = promote_types(promote_types(x1.dtype(), x2.dtype()), w.dtype());
    let lead = x1.dims()[..x1.rank() - 1].to_vec();
    let n: usize = lead.iter().product();
    let a1 = reshape(x1, [n, i1])?;
    let a2 = reshape(x2, [n, i2, 1])?;
    // t[n, o, j] = sum_i x1[n, i] w[o, i, j]
    let wr = reshape(&permute(w, &[1, 0, 2])?, [i1, o * i2])?;
    let t = reshape(&mm(&a1, &wr)?, [n, o, i2])?;
    let y = back(reshape(&bmm(&t, &a2)?, [n, o])?, dt)?;
    let y = match b {
        Some(b) => add(&y, b)?,
        None => y,
    };
    let mut dims = lead;
    dims.push(o);
    reshape(&y, dims)
}

/// Group normalisation: the channels (dim 1) of `x` (`[N, C, *]`) split in `num_groups`
/// groups, each normalised over its channels and spatial positions, then the optional
/// per-channel affine `weight`, `bias`.
pub fn group_norm(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "group_norm";
    let mut args = vec![x];
    args.extend(weight);
    args.extend(bias);
    let (a, _body) = enter_vec(&GROUP_NORM, &args)?;
    let x = &a[0];
    let w = weight.map(|_| &a[1]);
    let b = bias.map(|_| &a[1 + weight.is_some() as usize]);
    check::norm_parameters(OP, x, w, b)?;
    if x.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected at least 2 dimensions for input tensor but received {}",
                x.rank()
            ),
        ));
    }
    let c = x.dims()[1];
    if num_groups == 0 || c % num_groups != 0 {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected number of channels in input to be divisible by num_groups, but got \
                 input of shape {:?} and num_groups={num_groups}",
                x.dims()
            ),
        ));
    }
    for (name, t) in [("weight", w), ("bias", b)] {
        if let Some(t) = t {
            if t.elem_count() != c {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "Expected {name} to be a vector of size equal to the number of channels \
                         in input, but got {name} of shape {:?} and input of shape {:?}",
                        t.dims(),
                        x.dims()
                    ),
                ));
            }
        }
    }
    let dt = x.dtype();
    let y = group_norm_node(
        &acc(x)?,
        num_groups,
        w.map(acc).transpose()?,
        b.map(acc).transpose()?,
        eps,
    )?;
    back(y, dt)
}

/// `[1, C, 1, ...]` for a per-channel parameter of a rank-`rank` input.
fn channel_shape(rank: usize, c: usize) -> Vec<usize> {
    let mut s = vec![1usize; rank - 1];
    s[0] = c;
    s
}

/// Group norm as one recorded node: the forward through the layer-norm kernel on
/// `[N, G, K]`, the backward in differentiable ops under `create_graph` (else the fused
/// layer-norm backward kernel). As in PyTorch, the input's gradient is linked to the bias
/// (with a zero derivative), so a second-order gradient reaches the bias as zeros.
fn group_norm_node(
    x: &Tensor,
    groups: usize,
    w: Option<Tensor>,
    b: Option<Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (n, c) = (dims[0], dims[1]);
    let k = x.elem_count() / (n * groups).max(1);
    let xg = x.data().reshape([n, groups, k])?;
    let (normed, mean_, rstd) = amp_kernels::layer_norm(&xg, &[k], None, None, eps)?;
    let cs = channel_shape(dims.len(), c);
    let out = no_grad(|| -> Result<Tensor> {
        let mut y = reshape(&Tensor::from_raw(normed), dims.clone())?;
        if let Some(w) = &w {
            y = mul(&y, &reshape(w, cs.clone())?)?;
        }
        if let Some(b) = &b {
            y = add(&y, &reshape(b, cs.clone())?)?;
        }
        Ok(y)
    })?;
    let mut inputs = vec![x];
    inputs.extend(w.as_ref());
    inputs.extend(b.as_ref());
    let (xs, ws, bs) = (x.clone(), w.clone(), b.clone());
    let f = move |grads: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let count = 1 + ws.is_some() as usize + bs.is_some() as usize;
        let Some(g) = &grads[0] else {
            return Ok(vec![None; count]);
        };
        let dims = xs.dims().to_vec();
        let cs = channel_shape(dims.len(), c);
        let outer: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != 1).collect();
        let gxhat = match &ws {
            Some(w) => mul(g, &reshape(w, cs.clone())?)?,
            None => g.clone(),
        };
        let need_xhat = ws.is_some() || is_grad_enabled();
        let xhat = if need_xhat {
            let xg = reshape(&xs, [n, groups, k])?;
            let mu = mean(&xg, &[2], true, None)?;
            let d = sub(&xg, &mu)?;
            let var = mean(&square(&d)?, &[2], true, None)?;
            let r = rsqrt(&add_scalar(&var, eps)?)?;
            Some((mul(&d, &r)?, r))
        } else {
            None
        };
        let gx = match (&xhat, is_grad_enabled()) {
            (Some((xh, r)), true) => {
                let gg = reshape(&gxhat, [n, groups, k])?;
                let m1 = mean(&gg, &[2], true, None)?;
                let m2 = mean(&mul(&gg, xh)?, &[2], true, None)?;
                let gi = mul(r, &sub(&sub(&gg, &m1)?, &mul(xh, &m2)?)?)?;
                reshape(&gi, dims.clone())?
            }
            _ => {
                let gg = gxhat.data().try_contiguous()?.reshape([n, groups, k])?;
                let xg = xs.data().try_contiguous()?.reshape([n, groups, k])?;
                let (gi, _, _) =
                    amp_kernels::layer_norm_backward(&gg, &xg, &[k], &mean_, &rstd, None)?;
                Tensor::from_raw(gi.reshape(dims.clone())?)
            }
        };
        let gx = match &bs {
            Some(b) => link_zero(gx, b),
            None => gx,
        };
        let mut v = vec![Some(gx)];
        if ws.is_some() {
            let (xh, _) = xhat.as_ref().expect("computed when there is a weight");
            let xh = reshape(xh, dims.clone())?;
            v.push(Some(sum(&mul(g, &xh)?, &outer, false, None)?));
        }
        if bs.is_some() {
            v.push(Some(sum(g, &outer, false, None)?));
        }
        Ok(v)
    };
    Ok(record_multi(
        vec![out.data().clone()],
        &[true],
        "NativeGroupNormBackward0",
        &inputs,
        Box::new(f),
    )
    .pop()
    .expect("one output"))
}

/// Cross product of 3-vectors along `dim` of `input` and `other` (broadcast together),
/// `torch.linalg.cross`.
pub fn cross(input: &Tensor, other: &Tensor, dim: i64) -> Result<Tensor> {
    const OP: &str = "linalg.cross";
    let ([a, b], _body) = enter(&CROSS, [input, other])?;
    check::cross(&a, &b)?;
    if a.rank() != b.rank() {
        return Err(Error::invalid(
            OP,
            format!(
                "inputs must have the same number of dimensions, got {} and {}",
                a.rank(),
                b.rank()
            ),
        ));
    }
    let shape = broadcast_shapes(OP, a.dims(), b.dims())?;
    let d = wrap_dim(dim, shape.len())?;
    if a.dims()[d] != 3 || b.dims()[d] != 3 {
        return Err(Error::invalid(
            OP,
            format!(
                "dimension {dim} does not have size 3 (input {:?}, other {:?})",
                a.dims(),
                b.dims()
            ),
        ));
    }
    let (a, b) = (expand(&a, &shape)?, expand(&b, &shape)?);
    let d = d as i64;
    let yzx = Tensor::from_vec(vec![1i64, 2, 0], [3])?;
    let zxy = Tensor::from_vec(vec![2i64, 0, 1], [3])?;
    let a1 = index_select(&a, d, &yzx)?;
    let a2 = index_select(&a, d, &zxy)?;
    let b1 = index_select(&b, d, &yzx)?;
    let b2 = index_select(&b, d, &zxy)?;
    sub(&mul(&a1, &b2)?, &mul(&a2, &b1)?)
}

/// `torch.cross(input, other, dim=None)`: [`cross`] along `dim`, or (deprecated
/// default) along the first dim of size 3.
pub fn cross_default(input: &Tensor, other: &Tensor, dim: Option<i64>) -> Result<Tensor> {
    let dim = match dim {
        Some(d) => d,
        None => {
            let shape = broadcast_shapes("cross", input.dims(), other.dims())?;
            shape
                .iter()
                .position(|&s| s == 3)
                .ok_or_else(|| Error::invalid("cross", "no dimension of size 3 in input"))?
                as i64
        }
    };
    cross(input, other, dim)
}

/// `input` with `values` written (or, with `accumulate`, added) at the positions the
/// index tensors `indices` pick in its leading dims (`input[indices] = values`, out of
/// place). Each index is an integer tensor (all broadcast together; negative entries
/// count from the end) or a bool mask covering as many dims as it has.
pub fn index_put(
    input: &Tensor,
    indices: &[Tensor],
    values: &Tensor,
    accumulate: bool,
) -> Result<Tensor> {
    const OP: &str = "index_put";
    let mut args: Vec<&Tensor> = vec![input];
    args.extend(indices.iter());
    args.push(values);
    let (a, _body) = enter_vec(&INDEX_PUT, &args)?;
    let x = &a[0];
    let values = &a[a.len() - 1];
    if values.dtype() != x.dtype() {
        return Err(Error::invalid(
            OP,
            format!(
                "Index put requires the source and destination dtypes match, got {} for the \
                 destination and {} for the source.",
                x.dtype(),
                values.dtype()
            ),
        ));
    }
    // Integer index tensors, one per indexed dim (bool masks expanded to their nonzeros).
    let mut idx: Vec<(Vec<usize>, Vec<i64>)> = Vec::new();
    for t in &a[1..a.len() - 1] {
        if t.dtype() == DType::Bool {
            let first = idx.len();
            let mdims = t.dims().to_vec();
            if first + mdims.len() > x.rank() || x.dims()[first..first + mdims.len()] != mdims[..] {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "The shape of the mask {:?} does not match the shape of the indexed tensor {:?}",
                        mdims,
                        x.dims()
                    ),
                ));
            }
            let mask = t.to_vec_f64();
            let hits: Vec<usize> = (0..mask.len()).filter(|&i| mask[i] != 0.0).collect();
            for k in 0..mdims.len() {
                let stride: usize = mdims[k + 1..].iter().product();
                let v = hits
                    .iter()
                    .map(|&h| ((h / stride) % mdims[k]) as i64)
                    .collect();
                idx.push((vec![hits.len()], v));
            }
        } else if t.dtype().is_floating_point() {
            return Err(Error::invalid(
                OP,
                "tensors used as indices must be long, int, byte or bool tensors",
            ));
        } else {
            idx.push((
                t.dims().to_vec(),
                t.to_vec_f64().into_iter().map(|v| v as i64).collect(),
            ));
        }
    }
    let k = idx.len();
    if k > x.rank() {
        return Err(Error::invalid(
            OP,
            format!("too many indices for tensor of dimension {}", x.rank()),
        ));
    }
    // Broadcast the index tensors together and linearise them over the first k dims.
    let mut bshape: Vec<usize> = Vec::new();
    for (dims, _) in &idx {
        bshape = broadcast_shapes(OP, &bshape, dims)?;
    }
    let count: usize = bshape.iter().product();
    let mut lin = vec![0i64; count];
    let mut stride = 1i64;
    for d in (0..k).rev() {
        let (dims, vals) = &idx[d];
        let size = x.dims()[d] as i64;
        for (pos, l) in lin.iter_mut().enumerate() {
            let v = vals[broadcast_source(pos, &bshape, dims)];
            let w = if v < 0 { v + size } else { v };
            if !(0..size).contains(&w) {
                return Err(Error::invalid(
                    OP,
                    format!("index {v} is out of bounds for dimension {d} with size {size}"),
                ));
            }
            *l += w * stride;
        }
        stride *= size;
    }
    let rest = x.dims()[k..].to_vec();
    let lead: usize = x.dims()[..k].iter().product();
    let mut flat_dims = vec![lead];
    flat_dims.extend(&rest);
    let xr = reshape(x, flat_dims)?;
    let mut vdims = bshape.clone();
    vdims.extend(&rest);
    let v = expand(values, &vdims)?;
    let mut src_dims = vec![count];
    src_dims.extend(&rest);
    let v = reshape(&v, src_dims)?;
    let lin = Tensor::from_vec(lin, [count])?;
    let out = if accumulate {
        index_add(&xr, 0, &lin, &v, 1.0)?
    } else {
        index_copy(&xr, 0, &lin, &v)?
    };
    reshape(&out, x.dims().to_vec())
}

/// The flat position in a tensor of shape `dims` that position `pos` of its broadcast
/// to `bshape` reads.
fn broadcast_source(pos: usize, bshape: &[usize], dims: &[usize]) -> usize {
    let lead = bshape.len() - dims.len();
    let (mut rem, mut src, mut stride) = (pos, 0usize, 1usize);
    for i in (0..bshape.len()).rev() {
        let coord = rem % bshape[i];
        rem /= bshape[i];
        if i >= lead {
            let s = dims[i - lead];
            if s != 1 {
                src += coord * stride;
            }
            stride *= s;
        }
    }
    src
}

/// Which dims [`tensordot`] contracts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensordotDims {
    /// The last `n` dims of `a` with the first `n` of `b`.
    Count(usize),
    /// These dims of `a` with these dims of `b`, pairwise.
    Pairs(Vec<i64>, Vec<i64>),
}

/// Contraction of `a` and `b` over the dims `dims` names: the free dims of `a`, then
/// those of `b` (`torch.tensordot`), through one `mm`.
pub fn tensordot(a: &Tensor, b: &Tensor, dims: &TensordotDims) -> Result<Tensor> {
    const OP: &str = "tensordot";
    let ([a, b], _body) = enter(&TENSORDOT, [a, b])?;
    let (da, db): (Vec<usize>, Vec<usize>) = match dims {
        TensordotDims::Count(n) => {
            if *n > a.rank() || *n > b.rank() {
                return Err(Error::invalid(
                    OP,
                    format!("tensordot expects dims <= the ranks, got {n}"),
                ));
            }
            ((a.rank() - n..a.rank()).collect(), (0..*n).collect())
        }
        TensordotDims::Pairs(x, y) => {
            if x.len() != y.len() {
                return Err(Error::invalid(
                    OP,
                    "both dimension lists should have same length",
                ));
            }
            (
                x.iter()
                    .map(|&d| wrap_dim(d, a.rank()))
                    .collect::<amp_tensor::Result<_>>()?,
                y.iter()
                    .map(|&d| wrap_dim(d, b.rank()))
                    .collect::<amp_tensor::Result<_>>()?,
            )
        }
    };
    let (mut a, mut b) = (a, b);
    let mut k = 1usize;
    for (&i, &j) in da.iter().zip(&db) {
        let (s1, s2) = (a.dims()[i], b.dims()[j]);
        if s2 == 1 {
            a = sum(&a, &[i as i64], true, None)?;
        } else if s1 == 1 {
            b = sum(&b, &[j as i64], true, None)?;
        } else if s1 != s2 {
            return Err(Error::invalid(
                OP,
                format!(
                    "contracted dimensions need to match, but first has size {s1} in dim {i} \
                     and second has size {s2} in dim {j}"
                ),
            ));
        } else {
            k *= s1;
        }
    }
    let free_a: Vec<usize> = (0..a.rank()).filter(|d| !da.contains(d)).collect();
    let free_b: Vec<usize> = (0..b.rank()).filter(|d| !db.contains(d)).collect();
    let fa: usize = free_a.iter().map(|&d| a.dims()[d]).product();
    let fb: usize = free_b.iter().map(|&d| b.dims()[d]).product();
    let perm_a: Vec<i64> = free_a.iter().chain(&da).map(|&d| d as i64).collect();
    let perm_b: Vec<i64> = db.iter().chain(&free_b).map(|&d| d as i64).collect();
    let pa = reshape(&permute(&a, &perm_a)?, [fa, k])?;
    let pb = reshape(&permute(&b, &perm_b)?, [k, fb])?;
    let mut out_dims: Vec<usize> = free_a.iter().map(|&d| a.dims()[d]).collect();
    out_dims.extend(free_b.iter().map(|&d| b.dims()[d]));
    reshape(&mm(&pa, &pb)?, out_dims)
}
