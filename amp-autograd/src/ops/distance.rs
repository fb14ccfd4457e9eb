//! Norms and distances: normalize, renorm, cosine_similarity, pairwise_distance, cdist,
//! pdist, dist.
//!
//! Each enters the dispatch point once under its documented name and computes its value
//! from differentiable ops; they are [opaque](crate::OpName::opaque) ops, so the body runs with
//! the layer excluded. 16-bit inputs are computed in float32 and the result rounded once
//! (PyTorch accumulates norms in float32).

use amp_tensor::{broadcast_shapes, promote_types, wrap_dim};

use super::loss_extra::{acc, back};
use super::matmul::matmul;
use super::names::{CDIST, COSINE_SIMILARITY, DIST, NORMALIZE, PAIRWISE_DISTANCE, PDIST, RENORM};
use super::pointwise::*;
use super::reduce::{norm, sum};
use super::shape::{cat, expand, index_select, transpose, unsqueeze};
use super::{enter, sum_to};
use crate::graph::{grad_if, record, SavedOutput};
use crate::{Error, Result, Tensor};

/// `x / max(‖x‖_p, eps)` with the norm taken along `dim` (`F.normalize`).
pub fn normalize(x: &Tensor, p: f64, dim: i64, eps: f64) -> Result<Tensor> {
    let ([x], _body) = enter(&NORMALIZE, [x])?;
    let dt = x.dtype();
    let xa = acc(&x)?;
    let n = clamp(&norm(&xa, p, &[dim], true)?, Some(eps), None)?;
    back(div(&xa, &n)?, dt)
}

/// `torch.renorm`: each slice `x.select(dim, i)` whose `p`-norm exceeds `maxnorm` is
/// scaled to norm `maxnorm` (by `maxnorm / (norm + 1e-7)`, as PyTorch).
pub fn renorm(x: &Tensor, p: f64, dim: i64, maxnorm: f64) -> Result<Tensor> {
    const OP: &str = "renorm";
    let ([x], _body) = enter(&RENORM, [x])?;
    if p <= 0.0 {
        return Err(Error::invalid(OP, "non-positive-norm not supported"));
    }
    if maxnorm < 0.0 {
        return Err(Error::invalid(
            OP,
            format!("expected maxnorm to be >= 0 but got {maxnorm}"),
        ));
    }
    if x.rank() <= 1 {
        return Err(Error::invalid(
            OP,
            format!(
                "input needs at least 2 dimensions, got {} dimensions",
                x.rank()
            ),
        ));
    }
    let d = wrap_dim(dim, x.rank())?;
    let dt = x.dtype();
    let xa = acc(&x)?;
    let others: Vec<i64> = (0..x.rank())
        .filter(|&i| i != d)
        .map(|i| i as i64)
        .collect();
    let n = norm(&xa, p, &others, true)?;
    let scale = rdiv_scalar(&add_scalar(&n, 1e-7)?, maxnorm)?;
    let factor = where_(&gt_scalar(&n, maxnorm)?, &scale, &ones_like(&n))?;
    back(mul(&xa, &factor)?, dt)
}

/// Cosine similarity of `x1` and `x2` (broadcast together) along `dim`: each is
/// divided by its norm clamped below at `eps` (the clamp carries no gradient, as in
/// PyTorch), then the products are summed.
pub fn cosine_similarity(x1: &Tensor, x2: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
    let ([x1, x2], _body) = enter(&COSINE_SIMILARITY, [x1, x2])?;
    let shape = broadcast_shapes("cosine_similarity", x1.dims(), x2.dims())?;
    // Each input over its norm in its own dtype, as PyTorch (a 16-bit norm and quotient
    // computed in float32 and rounded to it), so that with mixed dtypes the 16-bit side
    // is rounded where PyTorch's is; the product and sum in the promoted dtype.
    let unit = |x: &Tensor| -> Result<Tensor> {
        let dt = x.dtype();
        let xa = acc(&expand(x, &shape)?)?;
        let n = back(clamped_norm(&xa, dim, eps)?, dt)?;
        back(div(&xa, &acc(&n)?)?, dt)
    };
    sum(&mul(&unit(&x1)?, &unit(&x2)?)?, &[dim], false, None)
}

/// The 2-norm along `dim` (kept), its value clamped below at `eps` without changing its
/// gradient.
fn clamped_norm(x: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
    let n = norm(x, 2.0, &[dim], true)?;
    let nd = n.detach();
    let shift = sub(&clamp(&nd, Some(eps), None)?, &nd)?;
    add(&n, &shift)
}

/// `‖x1 - x2 + eps‖_p` along the last dim (`F.pairwise_distance`), optionally keeping it.
pub fn pairwise_distance(
    x1: &Tensor,
    x2: &Tensor,
    p: f64,
    eps: f64,
    keepdim: bool,
) -> Result<Tensor> {
    let ([x1, x2], _body) = enter(&PAIRWISE_DISTANCE, [x1, x2])?;
    let dt = promote_types(x1.dtype(), x2.dtype());
    let d = add_scalar(&sub(&acc(&x1)?, &acc(&x2)?)?, eps)?;
    let dims: Vec<i64> = if d.rank() == 0 { vec![] } else { vec![-1] };
    back(norm(&d, p, &dims, keepdim && d.rank() > 0)?, dt)
}

amp_kernels::named_mode! {
    /// How [`cdist`] computes Euclidean (`p = 2`) distances.
    #[derive(Default)]
    pub enum CdistMode {
        /// Through a matrix product when either set has more than 25 rows (PyTorch's default
        /// `use_mm_for_euclid_dist_if_necessary`).
        #[default]
        MmIfNecessary = "use_mm_for_euclid_dist_if_necessary",
        /// Always through a matrix product (`use_mm_for_euclid_dist`): faster, less exact.
        Mm = "use_mm_for_euclid_dist",
        /// Never through a matrix product (`donot_use_mm_for_euclid_dist`).
        Direct = "donot_use_mm_for_euclid_dist",
    }
    else |other| -> Error { Error::invalid("cdist", format!("{other} is not a valid value for compute_mode")) }
}

/// `p`-norm distances between each row of `x1` (`[..., P, M]`) and each row of `x2`
/// (`[..., R, M]`): `[..., P, R]`, batch dims broadcast.
pub fn cdist(x1: &Tensor, x2: &Tensor, p: f64, mode: CdistMode) -> Result<Tensor> {
    const OP: &str = "cdist";
    let ([x1, x2], _body) = enter(&CDIST, [x1, x2])?;
    super::check::cdist(&x1, &x2)?;
    if x1.rank() < 2 || x2.rank() < 2 {
        return Err(Error::invalid(
            OP,
            format!(
                "cdist only supports at least 2D tensors, X1 got: {}D, X2 got: {}D",
                x1.rank(),
                x2.rank()
            ),
        ));
    }
    let (m1, m2) = (x1.dims()[x1.rank() - 1], x2.dims()[x2.rank() - 1]);
    if m1 != m2 {
        return Err(Error::invalid(
            OP,
            format!("X1 and X2 must have the same number of columns. X1: {m1} X2: {m2}"),
        ));
    }
    if p.is_nan() || p < 0.0 {
        return Err(Error::invalid(
            OP,
            "cdist only supports non-negative p values",
        ));
    }
    let (rows1, rows2) = (x1.dims()[x1.rank() - 2], x2.dims()[x2.rank() - 2]);
    let use_mm = p == 2.0
        && match mode {
            CdistMode::Mm => true,
            CdistMode::MmIfNecessary => rows1 > 25 || rows2 > 25,
            CdistMode::Direct => false,
        };
    let dt = promote_types(x1.dtype(), x2.dtype());
    let (a, b) = (acc(&x1)?, acc(&x2)?);
    let out = if use_mm {
        euclidean_dist(&a, &b)?
    } else {
        let diff = sub(&unsqueeze(&a, -2)?, &unsqueeze(&b, -3)?)?;
        norm(&diff, p, &[-1], false)?
    };
    back(out, dt)
}

/// The raw `sqrt(max(‖a‖² + ‖b‖² - 2 a·b, 0))` distances through one matrix product.
fn euclidean_dist_values(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let na = sum(&square(a)?, &[-1], true, None)?;
    let nb = sum(&square(b)?, &[-1], true, None)?;
    let a_ = cat(&[mul_scalar(a, -2.0)?, na.clone(), ones_like(&na)], -1)?;
    let b_ = cat(&[b.clone(), ones_like(&nb), nb], -1)?;
    let d2 = matmul(&a_, &transpose(&b_, -2, -1)?)?;
    sqrt(&clamp(&d2, Some(0.0), None)?)
}

/// Euclidean distances through a matrix product, with PyTorch's backward (zero where a
/// distance is zero, instead of the square root's infinite slope).
fn euclidean_dist(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = crate::grad_mode::no_grad(|| euclidean_dist_values(a, b))?;
    let saved = SavedOutput::new(out.data(), 0);
    let (sa, sb) = (a.clone(), b.clone());
    let (da, db) = (a.dims().to_vec(), b.dims().to_vec());
    Ok(record(
        out.data().clone(),
        "EuclideanDistBackward0",
        &[a, b],
        move |g| {
            let res = saved.get();
            let zero = eq_scalar(&res, 0.0)?;
            let ratio = where_(&zero, &zeros_like(g), &div(g, &res)?)?;
            let ga = grad_if(sa.requires_grad(), || {
                let ga = sub(
                    &mul(&sa, &sum(&ratio, &[-1], true, None)?)?,
                    &matmul(&ratio, &sb)?,
                )?;
                sum_to(&ga, &da)
            })?;
            let gb = grad_if(sb.requires_grad(), || {
                let gb = sub(
                    &mul(&sb, &unsqueeze(&sum(&ratio, &[-2], false, None)?, -1)?)?,
                    &matmul(&transpose(&ratio, -2, -1)?, &sa)?,
                )?;
                sum_to(&gb, &db)
            })?;
            Ok(vec![ga, gb])
        },
    ))
}

/// `p`-norm distances between every pair of rows `i < j` of `x` (`[N, M]`), in row-major
/// pair order: `N (N - 1) / 2` values.
pub fn pdist(x: &Tensor, p: f64) -> Result<Tensor> {
    const OP: &str = "pdist";
    let ([x], _body) = enter(&PDIST, [x])?;
    super::check::float32_or_64("pdist", &x)?;
    if x.rank() != 2 {
        return Err(Error::invalid(
            OP,
            format!("pdist only supports 2D tensors, got: {}D", x.rank()),
        ));
    }
    if p.is_nan() || p < 0.0 {
        return Err(Error::invalid(
            OP,
            "pdist only supports non-negative p values",
        ));
    }
    let n = x.dims()[0];
    let (mut ii, mut jj) = (Vec::new(), Vec::new());
    for i in 0..n {
        for j in i + 1..n {
            ii.push(i as i64);
            jj.push(j as i64);
        }
    }
    let pairs = ii.len();
    let dt = x.dtype();
    let xa = acc(&x)?;
    if pairs == 0 {
        return back(Tensor::zeros([0usize], xa.dtype()), dt);
    }
    let a = index_select(&xa, 0, &Tensor::from_vec(ii, [pairs])?)?;
    let b = index_select(&xa, 0, &Tensor::from_vec(jj, [pairs])?)?;
    back(norm(&sub(&a, &b)?, p, &[1], false)?, dt)
}

/// `‖x - other‖_p` over every element (broadcast), a 0-dim tensor (`torch.dist`).
pub fn dist(x: &Tensor, other: &Tensor, p: f64) -> Result<Tensor> {
    let ([x, other], _body) = enter(&DIST, [x, other])?;
    let dt = promote_types(x.dtype(), other.dtype());
    back(norm(&sub(&acc(&x)?, &acc(&other)?)?, p, &[], false)?, dt)
}
