//! Linear algebra (the CPU float32 list), quantiles and fake quantization.
//!
//! The factorisations (`inv`, `solve`, `solve_triangular`, `cholesky`, `eigh`, `svd`,
//! `qr`, `lu`, `pinverse`, `cholesky_solve`, `cholesky_inverse`) run a `faer` kernel and
//! record PyTorch's backward formula written in differentiable ops; inside a backward
//! built with `create_graph` the factorisation is recomputed differentiably from its
//! input, so double backward differentiates through it as PyTorch does through the
//! saved result. Ops written here from others (`linalg_matrix_norm`, `linalg_cond`,
//! `linalg_lstsq`, `linalg_tensorinv`, `linalg_tensorsolve`, `lu_solve`, `trace`, the
//! Householder products) enter the dispatch point once under their own name as opaque ops
//! ([`OpName::opaque`]): their body runs with the dispatch layer excluded, so their own
//! policy alone decides their dtypes (as autocast excludes itself inside an op in PyTorch).

use amp_kernels::QuantileInterpolation;
use amp_tensor::{broadcast_shapes, DType, Tensor as Raw};

use super::matmul::matmul;
use super::names::{
    CHOLESKY, CHOLESKY_INVERSE, CHOLESKY_SOLVE, FAKE_QUANTIZE, GEQRF, INVERSE, LINALG_CHOLESKY,
    LINALG_CHOLESKY_EX, LINALG_COND, LINALG_EIGH, LINALG_EIGVALSH, LINALG_HOUSEHOLDER_PRODUCT,
    LINALG_INV, LINALG_INV_EX, LINALG_LSTSQ, LINALG_MATRIX_NORM, LINALG_MATRIX_RANK, LINALG_QR,
    LINALG_SOLVE, LINALG_SOLVE_TRIANGULAR, LINALG_SVD, LINALG_SVDVALS, LINALG_TENSORINV,
    LINALG_TENSORSOLVE, LSTSQ, LU_SOLVE, LU_WITH_INFO, NANQUANTILE, ORGQR, ORMQR, PINVERSE, QR,
    QUANTILE, SOLVE, SVD, SYMEIG, TRACE, TRIANGULAR_SOLVE,
};
use super::pointwise::{add, div, mul, mul_scalar, neg, sub, where_};
use super::reduce::{amax, amin, sum};
use super::shape::{expand, narrow, permute, reshape, scatter_add, squeeze, transpose, unsqueeze};
use super::{cat, enter, enter_vec};
use crate::dispatch::OpName;
use crate::grad_mode::is_grad_enabled;
use crate::graph::{grad_if, needs_grad, record, record_multi, BackwardFn};
use crate::{Error, Result, Tensor};

// ----- helpers ---------------------------------------------------------------------------

/// The transpose of the last two dims.
fn mt(x: &Tensor) -> Result<Tensor> {
    transpose(x, -2, -1)
}

fn last2(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    let r = x.rank();
    if r < 2 {
        return Err(Error::invalid(
            op,
            format!("The input tensor A must have at least 2 dimensions. Got {r} dimensions"),
        ));
    }
    Ok((x.dims()[r - 2], x.dims()[r - 1]))
}

/// A constant `[m, n]` mask of `dtype`: ones where `keep(i, j)`.
/// An `m × n` mask of `like`'s dtype on `like`'s device.
fn mask(m: usize, n: usize, like: &Tensor, keep: impl Fn(i64, i64) -> bool) -> Result<Tensor> {
    let mut v = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            if keep(i as i64, j as i64) {
                v[i * n + j] = 1.0;
            }
        }
    }
    Ok(Tensor::from_raw(
        Raw::from_vec(v, [m, n])?
            .to_dtype(like.dtype())?
            .to_device(like.device())?,
    ))
}

/// `torch.tril(x, k)` (differentiable: a product with a constant mask).
fn tril(x: &Tensor, k: i64) -> Result<Tensor> {
    let r = x.rank();
    let (m, n) = (x.dims()[r - 2], x.dims()[r - 1]);
    mul(x, &mask(m, n, x, |i, j| j <= i + k)?)
}

/// `torch.triu(x, k)`.
fn triu(x: &Tensor, k: i64) -> Result<Tensor> {
    let r = x.rank();
    let (m, n) = (x.dims()[r - 2], x.dims()[r - 1]);
    mul(x, &mask(m, n, x, |i, j| j >= i + k)?)
}

/// The `n × n` identity of `like`'s dtype on `like`'s device.
fn eye(n: usize, like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_raw(
        Raw::eye(n, like.dtype()).to_device(like.device())?,
    ))
}

/// `[..., n]` → `[..., n, n]` with `v` on the diagonal.
fn diag_embed(v: &Tensor) -> Result<Tensor> {
    let n = *v.dims().last().expect("rank >= 1");
    mul(&unsqueeze(v, -1)?, &eye(n, v)?)
}

/// `x` expanded to batch shape `batch` (its last two dims kept).
fn expand_batch(x: &Tensor, batch: &[usize]) -> Result<Tensor> {
    let r = x.rank();
    let mut dims = batch.to_vec();
    dims.extend_from_slice(&x.dims()[r - 2..]);
    if x.dims() == dims.as_slice() {
        return Ok(x.clone());
    }
    let mut x = x.clone();
    while x.rank() < dims.len() {
        x = unsqueeze(&x, 0)?;
    }
    expand(&x, &dims)
}

/// Broadcasts the batch dims of two `[..., r, c]` tensors.
fn broadcast_batch(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let batch = broadcast_shapes(op, &a.dims()[..a.rank() - 2], &b.dims()[..b.rank() - 2])?;
    Ok((expand_batch(a, &batch)?, expand_batch(b, &batch)?))
}

/// Fails with PyTorch's message when an `info` tensor has a nonzero entry.
fn check_info(info: &Raw, msg: impl Fn(i64) -> String) -> Result<()> {
    let v = info.to_vec_as::<i64>();
    let batched = info.rank() > 0;
    if let Some((b, &i)) = v.iter().enumerate().find(|(_, &i)| i != 0) {
        let m = msg(i);
        return Err(Error::Tensor(amp_tensor::Error::InvalidArgument {
            op: "linalg",
            msg: if batched {
                format!("(Batch element {b}): {m}")
            } else {
                m
            },
        }));
    }
    Ok(())
}

/// The output inside a backward closure: `saved` when no graph is being built, the op
/// recomputed differentiably otherwise (so double backward sees its dependency on the
/// input).
fn again<T>(saved: T, recompute: impl FnOnce() -> Result<T>) -> Result<T> {
    if is_grad_enabled() {
        recompute()
    } else {
        Ok(saved)
    }
}

fn raw(t: &Raw) -> Tensor {
    Tensor::from_raw(t.clone())
}

// ----- trace -----------------------------------------------------------------------------

/// Sum of the main diagonal of a 2-D tensor.
pub fn trace(x: &Tensor) -> Result<Tensor> {
    let ([x], _body) = enter(&TRACE, [x])?;
    if x.dtype() == amp_tensor::DType::Bool {
        return Err(amp_tensor::Error::UnsupportedDType {
            op: "trace",
            dtype: x.dtype(),
        }
        .into());
    }
    if x.rank() != 2 {
        return Err(Error::invalid(
            "trace",
            format!("expected a matrix, but got tensor with dim {}", x.rank()),
        ));
    }
    let (m, n) = (x.dims()[0], x.dims()[1]);
    let d = mul(&x, &mask(m, n, &x, |i, j| i == j)?)?;
    sum(&d, &[], false, None)
}

// ----- inverse and solve --------------------------------------------------------------------

fn inv_core(a: &Tensor) -> Result<(Tensor, Raw)> {
    last2("linalg.inv", a)?;
    let (inv, info) = amp_kernels::linalg_inv_ex(a.data())?;
    let (saved, sa) = (inv.clone(), a.clone());
    let out = record(inv, "LinalgInvExBackward0", &[a], move |g| {
        let ai = again(raw(&saved), || Ok(inv_core(&sa)?.0))?;
        let ait = mt(&ai)?;
        Ok(vec![Some(neg(&matmul(&ait, &matmul(g, &ait)?)?)?)])
    });
    Ok((out, info))
}

fn inv_checked(a: &Tensor, op: &'static str) -> Result<Tensor> {
    let (out, info) = inv_core(a)?;
    check_info(&info, |i| {
        format!("{op}: The diagonal element {i} is zero, the inversion could not be completed because the input matrix is singular.")
    })?;
    Ok(out)
}

/// `torch.linalg.inv`: the inverse of each square matrix (`[..., n, n]`); a singular
/// matrix is an error.
pub fn linalg_inv(a: &Tensor) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_INV, [a])?;
    inv_checked(&a, "linalg.inv")
}

/// `torch.inverse` (the same as [`linalg_inv`] under its own op name).
pub fn inverse(a: &Tensor) -> Result<Tensor> {
    let ([a], _body) = enter(&INVERSE, [a])?;
    inv_checked(&a, "inverse")
}

/// `torch.linalg.inv_ex`: `(inverse, info)`; `info` (`int32`, batch shape) is nonzero
/// where a matrix is singular; with `check_errors` that is an error.
pub fn linalg_inv_ex(a: &Tensor, check_errors: bool) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&LINALG_INV_EX, [a])?;
    if check_errors {
        let out = inv_checked(&a, "linalg.inv_ex")?;
        let info = Raw::zeros(a.dims()[..a.rank() - 2].to_vec(), DType::I32);
        return Ok((out, Tensor::from_raw(info)));
    }
    let (out, info) = inv_core(&a)?;
    Ok((out, Tensor::from_raw(info)))
}

/// `X` with `A X = B` for same-batch `A` `[..., n, n]`, `B` `[..., n, k]`.
fn solve_core(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (x, info) = amp_kernels::linalg_solve_ex(a.data(), b.data())?;
    check_info(&info, |_| {
        "linalg.solve: The solver failed because the input matrix is singular.".to_string()
    })?;
    let (saved, sa, sb) = (x.clone(), a.clone(), b.clone());
    Ok(record(x, "LinalgSolveExBackward0", &[a, b], move |g| {
        let gb = solve_core(&mt(&sa)?, g)?;
        let ga = grad_if(sa.requires_grad(), || {
            let x = again(raw(&saved), || solve_core(&sa, &sb))?;
            neg(&matmul(&gb, &mt(&x)?)?)
        })?;
        Ok(vec![ga, sb.requires_grad().then_some(gb)])
    }))
}

fn solve_impl(a: &Tensor, b: &Tensor, left: bool) -> Result<Tensor> {
    const OP: &str = "linalg.solve";
    let (m, n) = last2(OP, a)?;
    if m != n {
        return Err(Error::invalid(
            OP,
            format!("A must be batches of square matrices, but they are {m} by {n} matrices"),
        ));
    }
    let vector =
        b.rank() == 1 || (b.rank() + 1 == a.rank() && b.dims() == &a.dims()[..a.rank() - 1]);
    if !left {
        if vector {
            return Err(Error::invalid(
                OP,
                "left=False needs B to be a batch of matrices",
            ));
        }
        return mt(&solve_impl(&mt(a)?, &mt(b)?, true)?);
    }
    let b2 = if vector { unsqueeze(b, -1)? } else { b.clone() };
    if b2.rank() < 2 || b2.dims()[b2.rank() - 2] != n {
        return Err(Error::invalid(
            OP,
            format!(
                "Incompatible shapes of A and B for the equation AX = B ({:?} and {:?})",
                a.dims(),
                b.dims()
            ),
        ));
    }
    let (ae, be) = broadcast_batch(OP, a, &b2)?;
    let x = solve_core(&ae, &be)?;
    if vector {
        squeeze(&x, -1)
    } else {
        Ok(x)
    }
}

/// `torch.linalg.solve(A, B, left=True)`: `X` with `A X = B` (`left`) or `X A = B`;
/// `B` may be a (batch of) vector(s); batch dims broadcast.
pub fn linalg_solve(a: &Tensor, b: &Tensor, left: bool) -> Result<Tensor> {
    let ([a, b], _body) = enter(&LINALG_SOLVE, [a, b])?;
    solve_impl(&a, &b, left)
}

/// The removed `torch.solve(input, A)` (PyTorch 1.x): `(solution, LU)` of `A X = input`,
/// `LU` the packed LU factorisation of `A` (not differentiable).
pub fn solve(input: &Tensor, a: &Tensor) -> Result<(Tensor, Tensor)> {
    let ([input, a], _body) = enter(&SOLVE, [input, a])?;
    let (ae, be) = broadcast_batch("solve", &a, &input)?;
    let x = solve_core(&ae, &be)?;
    let (lu, _, _) = amp_kernels::linalg_lu_factor_ex(ae.data())?;
    Ok((x, Tensor::from_raw(lu)))
}

/// `X` with `A X = B`, `A` triangular, same batch.
fn tri_core(a: &Tensor, b: &Tensor, upper: bool, unit: bool) -> Result<Tensor> {
    let x = amp_kernels::linalg_solve_triangular(a.data(), b.data(), upper, unit)?;
    let (saved, sa, sb) = (x.clone(), a.clone(), b.clone());
    Ok(record(
        x,
        "LinalgSolveTriangularBackward0",
        &[a, b],
        move |g| {
            let gb = tri_core(&mt(&sa)?, g, !upper, unit)?;
            let ga = grad_if(sa.requires_grad(), || {
                let x = again(raw(&saved), || tri_core(&sa, &sb, upper, unit))?;
                let p = neg(&matmul(&gb, &mt(&x)?)?)?;
                let k = i64::from(unit);
                Ok(if upper { triu(&p, k)? } else { tril(&p, -k)? })
            })?;
            Ok(vec![ga, sb.requires_grad().then_some(gb)])
        },
    ))
}

fn tri_impl(a: &Tensor, b: &Tensor, upper: bool, left: bool, unit: bool) -> Result<Tensor> {
    const OP: &str = "linalg.solve_triangular";
    last2(OP, a)?;
    last2(OP, b)?;
    if !left {
        return mt(&tri_impl(&mt(a)?, &mt(b)?, !upper, true, unit)?);
    }
    let (ae, be) = broadcast_batch(OP, a, b)?;
    tri_core(&ae, &be, upper, unit)
}

/// `torch.linalg.solve_triangular(A, B, *, upper, left=True, unitriangular=False)`.
pub fn linalg_solve_triangular(
    a: &Tensor,
    b: &Tensor,
    upper: bool,
    left: bool,
    unitriangular: bool,
) -> Result<Tensor> {
    let ([a, b], _body) = enter(&LINALG_SOLVE_TRIANGULAR, [a, b])?;
    tri_impl(&a, &b, upper, left, unitriangular)
}

/// `torch.triangular_solve(b, A, upper=True, transpose=False, unitriangular=False)`:
/// `(solution of op(A) X = b, copy of A)`.
pub fn triangular_solve(
    b: &Tensor,
    a: &Tensor,
    upper: bool,
    transpose_a: bool,
    unitriangular: bool,
) -> Result<(Tensor, Tensor)> {
    let ([b, a], _body) = enter(&TRIANGULAR_SOLVE, [b, a])?;
    let x = if transpose_a {
        tri_impl(&mt(&a)?, &b, !upper, true, unitriangular)?
    } else {
        tri_impl(&a, &b, upper, true, unitriangular)?
    };
    let (ae, _) = broadcast_batch("triangular_solve", &a, &b)?;
    let copy = Tensor::from_raw(ae.data().try_contiguous()?.try_copy()?);
    Ok((x, copy))
}

// ----- Cholesky --------------------------------------------------------------------------

/// Lower Cholesky factor (reads the lower triangle) and `info`.
fn chol_core(a: &Tensor) -> Result<(Tensor, Raw)> {
    let (l, info) = amp_kernels::linalg_cholesky_ex(a.data())?;
    let (saved, sa) = (l.clone(), a.clone());
    let out = record(l, "LinalgCholeskyExBackward0", &[a], move |gl| {
        let l = again(raw(&saved), || Ok(chol_core(&sa)?.0))?;
        let lt = mt(&l)?;
        let mut ga = tril(&matmul(&lt, gl)?, 0)?;
        ga = mul_scalar(&add(&ga, &mt(&tril(&ga, -1)?)?)?, 0.5)?;
        ga = tri_core(&lt, &ga, true, false)?;
        ga = mt(&tri_core(&lt, &mt(&ga)?, true, false)?)?;
        Ok(vec![Some(ga)])
    });
    Ok((out, info))
}

fn chol_impl(a: &Tensor, upper: bool) -> Result<(Tensor, Raw)> {
    let (m, n) = last2("linalg.cholesky", a)?;
    if m != n {
        return Err(Error::invalid(
            "linalg.cholesky",
            format!("A must be batches of square matrices, but they are {m} by {n} matrices"),
        ));
    }
    if upper {
        // Reads the upper triangle: the lower one of Aᵀ; U = Lᵀ.
        let (l, info) = chol_core(&mt(a)?)?;
        Ok((mt(&l)?, info))
    } else {
        chol_core(a)
    }
}

fn chol_checked(a: &Tensor, upper: bool, op: &'static str) -> Result<Tensor> {
    let (l, info) = chol_impl(a, upper)?;
    check_info(&info, |i| {
        format!("{op}: The factorization could not be completed because the input is not positive-definite (the leading minor of order {i} is not positive-definite).")
    })?;
    Ok(l)
}

/// `torch.linalg.cholesky(A, *, upper=False)`: `L` with `A = L Lᵀ` (or `U` with
/// `A = Uᵀ U`); a matrix that is not positive-definite is an error.
pub fn linalg_cholesky(a: &Tensor, upper: bool) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_CHOLESKY, [a])?;
    chol_checked(&a, upper, "linalg.cholesky")
}

/// `torch.linalg.cholesky_ex(A, *, upper=False, check_errors=False)`: `(L, info)`.
pub fn linalg_cholesky_ex(a: &Tensor, upper: bool, check_errors: bool) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&LINALG_CHOLESKY_EX, [a])?;
    if check_errors {
        let l = chol_checked(&a, upper, "linalg.cholesky_ex")?;
        let info = Raw::zeros(a.dims()[..a.rank() - 2].to_vec(), DType::I32);
        return Ok((l, Tensor::from_raw(info)));
    }
    let (l, info) = chol_impl(&a, upper)?;
    Ok((l, Tensor::from_raw(info)))
}

/// The deprecated `torch.cholesky(input, upper=False)`.
pub fn cholesky(a: &Tensor, upper: bool) -> Result<Tensor> {
    let ([a], _body) = enter(&CHOLESKY, [a])?;
    chol_checked(&a, upper, "cholesky")
}

/// `(L Lᵀ)⁻¹ B` (or `(Uᵀ U)⁻¹ B`) for same-batch inputs.
fn chol_solve_core(b: &Tensor, l: &Tensor, upper: bool) -> Result<Tensor> {
    let lower = if upper {
        mt(l)?.data().try_contiguous()?
    } else {
        l.data().clone()
    };
    let y = amp_kernels::linalg_solve_triangular(&lower, b.data(), false, false)?;
    let x = amp_kernels::linalg_solve_triangular(&lower.transpose(-2, -1)?, &y, true, false)?;
    let (saved, sb, sl) = (x.clone(), b.clone(), l.clone());
    Ok(record(x, "CholeskySolveBackward0", &[b, l], move |g| {
        let gb = chol_solve_core(g, &sl, upper)?;
        let gl = grad_if(sl.requires_grad(), || {
            let x = again(raw(&saved), || chol_solve_core(&sb, &sl, upper))?;
            let c = matmul(&gb, &mt(&x)?)?;
            let c = add(&c, &mt(&c)?)?;
            neg(&if upper {
                matmul(&sl, &c)?
            } else {
                matmul(&c, &sl)?
            })
        })?;
        Ok(vec![sb.requires_grad().then_some(gb), gl])
    }))
}

/// `torch.cholesky_solve(B, L, upper=False)`: `X` with `L Lᵀ X = B` (or `Uᵀ U X = B`).
pub fn cholesky_solve(b: &Tensor, l: &Tensor, upper: bool) -> Result<Tensor> {
    let ([b, l], _body) = enter(&CHOLESKY_SOLVE, [b, l])?;
    last2("cholesky_solve", &b)?;
    let (m, n) = last2("cholesky_solve", &l)?;
    if m != n {
        return Err(Error::invalid(
            "cholesky_solve",
            "A must be batches of square matrices",
        ));
    }
    let (le, be) = broadcast_batch("cholesky_solve", &l, &b)?;
    chol_solve_core(&be, &le, upper)
}

fn chol_inverse_core(l: &Tensor, upper: bool) -> Result<Tensor> {
    let n = l.dims()[l.rank() - 1];
    let id = Raw::eye(n, l.dtype())
        .broadcast_to(l.dims().to_vec())?
        .try_contiguous()?;
    let lower = if upper {
        l.data().transpose(-2, -1)?.try_contiguous()?
    } else {
        l.data().clone()
    };
    let y = amp_kernels::linalg_solve_triangular(&lower, &id, false, false)?;
    let x = amp_kernels::linalg_solve_triangular(&lower.transpose(-2, -1)?, &y, true, false)?;
    let (saved, sl) = (x.clone(), l.clone());
    Ok(record(x, "CholeskyInverseBackward0", &[l], move |g| {
        let inv = again(raw(&saved), || chol_inverse_core(&sl, upper))?;
        let c = add(g, &mt(g)?)?;
        let c = matmul(&inv, &matmul(&c, &inv)?)?;
        Ok(vec![Some(neg(&if upper {
            matmul(&sl, &c)?
        } else {
            matmul(&c, &sl)?
        })?)])
    }))
}

/// `torch.cholesky_inverse(L, upper=False)`: `(L Lᵀ)⁻¹` (or `(Uᵀ U)⁻¹`).
pub fn cholesky_inverse(l: &Tensor, upper: bool) -> Result<Tensor> {
    let ([l], _body) = enter(&CHOLESKY_INVERSE, [l])?;
    let (m, n) = last2("cholesky_inverse", &l)?;
    if m != n {
        return Err(Error::invalid(
            "cholesky_inverse",
            "A must be batches of square matrices",
        ));
    }
    chol_inverse_core(&l, upper)
}

// ----- symmetric eigendecomposition ----------------------------------------------------------

fn eigh_core(a: &Tensor, upper: bool) -> Result<(Tensor, Tensor)> {
    let (m, n) = last2("linalg.eigh", a)?;
    if m != n {
        return Err(Error::invalid(
            "linalg.eigh",
            format!("A must be batches of square matrices, but they are {m} by {n} matrices"),
        ));
    }
    let (w, v) = amp_kernels::linalg_eigh(a.data(), upper, true)?;
    let v = v.expect("vectors computed");
    let (sw, sv, sa) = (w.clone(), v.clone(), a.clone());
    let bw: BackwardFn = Box::new(move |gs: &[Option<Tensor>]| {
        let (gw, gv) = (gs[0].as_ref(), gs[1].as_ref());
        if gw.is_none() && gv.is_none() {
            return Ok(vec![None]);
        }
        let (w, v) = again((raw(&sw), raw(&sv)), || eigh_core(&sa, upper))?;
        let Some(gv) = gv else {
            let gw = gw.expect("checked");
            return Ok(vec![Some(matmul(
                &mul(&v, &unsqueeze(gw, -2)?)?,
                &mt(&v)?,
            )?)]);
        };
        let n = *w.dims().last().expect("rank >= 1");
        let vhgv = matmul(&mt(&v)?, gv)?;
        let vhgv = mul_scalar(&sub(&vhgv, &mt(&vhgv)?)?, 0.5)?;
        let e = add(
            &sub(&unsqueeze(&w, -2)?, &unsqueeze(&w, -1)?)?,
            &eye(n, &w)?,
        )?;
        let mut ga = div(&vhgv, &e)?;
        if let Some(gw) = gw {
            ga = add(&ga, &diag_embed(gw)?)?;
        }
        Ok(vec![Some(matmul(&v, &matmul(&ga, &mt(&v)?)?)?)])
    });
    let mut outs = record_multi(vec![w, v], &[true, true], "LinalgEighBackward0", &[a], bw);
    let v = outs.pop().expect("two outputs");
    let w = outs.pop().expect("two outputs");
    Ok((w, v))
}

fn uplo_upper(uplo: &str) -> Result<bool> {
    match uplo {
        "L" | "l" => Ok(false),
        "U" | "u" => Ok(true),
        other => Err(Error::invalid(
            "linalg.eigh",
            format!("Expected UPLO argument to be 'L' or 'U', but got {other}"),
        )),
    }
}

/// `torch.linalg.eigh(A, UPLO='L')`: eigenvalues (ascending) and eigenvectors (columns)
/// of symmetric matrices, reading the `UPLO` triangle.
pub fn linalg_eigh(a: &Tensor, uplo: &str) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&LINALG_EIGH, [a])?;
    eigh_core(&a, uplo_upper(uplo)?)
}

/// `torch.linalg.eigvalsh(A, UPLO='L')`: the eigenvalues of [`linalg_eigh`] (computed
/// with the eigenvectors when a gradient is needed, as PyTorch does).
pub fn linalg_eigvalsh(a: &Tensor, uplo: &str) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_EIGVALSH, [a])?;
    let upper = uplo_upper(uplo)?;
    if needs_grad(&[&a]) {
        return Ok(eigh_core(&a, upper)?.0);
    }
    let (m, n) = last2("linalg.eigvalsh", &a)?;
    if m != n {
        return Err(Error::invalid(
            "linalg.eigvalsh",
            "A must be batches of square matrices",
        ));
    }
    Ok(Tensor::from_raw(
        amp_kernels::linalg_eigh(a.data(), upper, false)?.0,
    ))
}

/// The removed `torch.symeig(input, eigenvectors=False, upper=True)` (PyTorch 1.x):
/// `(eigenvalues, eigenvectors)`, the eigenvectors an empty tensor unless asked for.
pub fn symeig(a: &Tensor, eigenvectors: bool, upper: bool) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&SYMEIG, [a])?;
    let (w, v) = eigh_core(&a, upper)?;
    if eigenvectors {
        Ok((w, v))
    } else {
        Ok((w, Tensor::zeros([0], a.dtype())))
    }
}

// ----- SVD --------------------------------------------------------------------------------

/// `A = U diag(S) Vh` (reduced, or `full` matrices), recorded with PyTorch's
/// `svd_backward` (the extra columns of full matrices get no gradient).
fn svd_core(a: &Tensor, full: bool) -> Result<(Tensor, Tensor, Tensor)> {
    let (u, s, vh) = amp_kernels::linalg_svd(a.data(), full, true)?;
    let (u, vh) = (u.expect("computed"), vh.expect("computed"));
    let (su, ss, svh, sa) = (u.clone(), s.clone(), vh.clone(), a.clone());
    let bw: BackwardFn = Box::new(move |gs: &[Option<Tensor>]| {
        let (gu, gsv, gvh) = (gs[0].clone(), gs[1].clone(), gs[2].clone());
        if gu.is_none() && gsv.is_none() && gvh.is_none() {
            return Ok(vec![None]);
        }
        let (mut u, s, mut vh) = again((raw(&su), raw(&ss), raw(&svh)), || svd_core(&sa, full))?;
        let k = *s.dims().last().expect("rank >= 1");
        let (mut gu, mut gvh) = (gu, gvh);
        if full {
            u = narrow(&u, -1, 0, k)?;
            vh = narrow(&vh, -2, 0, k)?;
            gu = gu.map(|g| narrow(&g, -1, 0, k)).transpose()?;
            gvh = gvh.map(|g| narrow(&g, -2, 0, k)).transpose()?;
        }
        Ok(vec![Some(svd_backward(
            gu.as_ref(),
            gsv.as_ref(),
            gvh.as_ref(),
            &u,
            &s,
            &vh,
        )?)])
    });
    let mut outs = record_multi(
        vec![u, s, vh],
        &[true, true, true],
        "LinalgSvdBackward0",
        &[a],
        bw,
    );
    let vh = outs.pop().expect("three outputs");
    let s = outs.pop().expect("three outputs");
    let u = outs.pop().expect("three outputs");
    Ok((u, s, vh))
}

/// PyTorch's `svd_backward` for the reduced SVD (real case).
fn svd_backward(
    gu: Option<&Tensor>,
    gs: Option<&Tensor>,
    gvh: Option<&Tensor>,
    u: &Tensor,
    s: &Tensor,
    vh: &Tensor,
) -> Result<Tensor> {
    let m = u.dims()[u.rank() - 2];
    let n = vh.dims()[vh.rank() - 1];
    let k = *s.dims().last().expect("rank >= 1");
    if gu.is_none() && gvh.is_none() {
        let gs = gs.expect("some gradient");
        return if m >= n {
            matmul(u, &mul(&unsqueeze(gs, -1)?, vh)?)
        } else {
            matmul(&mul(u, &unsqueeze(gs, -2)?)?, vh)
        };
    }
    let skew = |x: Tensor| -> Result<Tensor> { sub(&x, &mt(&x)?) };
    let uhgu = gu.map(|g| skew(matmul(&mt(u)?, g)?)).transpose()?;
    let vhgv = gvh.map(|g| skew(matmul(vh, &mt(g)?)?)).transpose()?;
    let s2 = mul(s, s)?;
    let e = add(
        &sub(&unsqueeze(&s2, -2)?, &unsqueeze(&s2, -1)?)?,
        &eye(k, s)?,
    )?;
    let s_row = unsqueeze(s, -2)?;
    let s_col = unsqueeze(s, -1)?;
    let mut ret = match (&uhgu, &vhgv) {
        (Some(a), Some(b)) => div(&add(&mul(a, &s_row)?, &mul(&s_col, b)?)?, &e)?,
        (Some(a), None) => div(&mul(a, &s_row)?, &e)?,
        (None, Some(b)) => div(&mul(&s_col, b)?, &e)?,
        (None, None) => unreachable!("one of gU, gVh is defined"),
    };
    if let Some(gs) = gs {
        ret = add(&ret, &diag_embed(gs)?)?;
    }
    match (gu, gvh) {
        (Some(gu), _) if m > n => {
            let mut ga = matmul(u, &ret)?;
            let gusinv = div(gu, &s_row)?;
            ga = sub(&add(&ga, &gusinv)?, &matmul(u, &matmul(&mt(u)?, &gusinv)?)?)?;
            matmul(&ga, vh)
        }
        (_, Some(gvh)) if m < n => {
            let mut ga = matmul(&ret, vh)?;
            let sinvgvh = div(gvh, &s_col)?;
            ga = sub(
                &add(&ga, &sinvgvh)?,
                &matmul(&matmul(&sinvgvh, &mt(vh)?)?, vh)?,
            )?;
            matmul(u, &ga)
        }
        _ if m >= n => matmul(u, &matmul(&ret, vh)?),
        _ => matmul(&matmul(u, &ret)?, vh),
    }
}

/// `torch.linalg.svd(A, full_matrices=True)`: `(U, S, Vh)`, singular values descending.
pub fn linalg_svd(a: &Tensor, full_matrices: bool) -> Result<(Tensor, Tensor, Tensor)> {
    let ([a], _body) = enter(&LINALG_SVD, [a])?;
    last2("linalg.svd", &a)?;
    svd_core(&a, full_matrices)
}

fn svdvals_impl(a: &Tensor) -> Result<Tensor> {
    last2("linalg.svdvals", a)?;
    if needs_grad(&[a]) {
        return Ok(svd_core(a, false)?.1);
    }
    Ok(Tensor::from_raw(
        amp_kernels::linalg_svd(a.data(), false, false)?.1,
    ))
}

/// `torch.linalg.svdvals(A)`: the singular values, descending.
pub fn linalg_svdvals(a: &Tensor) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_SVDVALS, [a])?;
    svdvals_impl(&a)
}

/// `torch.svd(input, some=True, compute_uv=True)`: `(U, S, V)` (`V`, not `Vh`); without
/// `compute_uv`, `U` and `V` are zero-filled `[..., m, m]` and `[..., n, n]`.
pub fn svd(a: &Tensor, some: bool, compute_uv: bool) -> Result<(Tensor, Tensor, Tensor)> {
    let ([a], _body) = enter(&SVD, [a])?;
    let (m, n) = last2("svd", &a)?;
    if !compute_uv {
        let s = svdvals_impl(&a)?;
        let batch = &a.dims()[..a.rank() - 2];
        let dims = |r: usize| [batch, &[r, r][..]].concat();
        return Ok((
            Tensor::zeros(dims(m), a.dtype()),
            s,
            Tensor::zeros(dims(n), a.dtype()),
        ));
    }
    let (u, s, vh) = svd_core(&a, !some)?;
    Ok((u, s, mt(&vh)?))
}

fn pinv_core(a: &Tensor, rcond: f64) -> Result<Tensor> {
    let (u, s, vh) = amp_kernels::linalg_svd(a.data(), false, true)?;
    let (u, vh) = (u.expect("computed"), vh.expect("computed"));
    let k = *s.dims().last().expect("rank >= 1");
    let sv = s.to_vec_f64();
    let mut sinv = vec![0f64; sv.len()];
    if k > 0 {
        for (chunk, out) in sv.chunks(k).zip(sinv.chunks_mut(k)) {
            let tol = rcond * chunk.iter().copied().fold(0.0f64, f64::max);
            for (x, o) in chunk.iter().zip(out.iter_mut()) {
                *o = if *x > tol { 1.0 / x } else { 0.0 };
            }
        }
    }
    let sinv = Raw::from_vec(sinv, s.dims().to_vec())?.to_dtype(a.dtype())?;
    let v_scaled = amp_kernels::binary(
        amp_kernels::BinaryOp::Mul,
        &vh.transpose(-2, -1)?,
        &sinv.unsqueeze(-2)?,
    )?;
    let out = amp_kernels::matmul(&v_scaled, &u.transpose(-2, -1)?)?;
    let (saved, sa) = (out.clone(), a.clone());
    Ok(record(out, "PinverseBackward0", &[a], move |g| {
        let p = again(raw(&saved), || pinv_core(&sa, rcond))?;
        Ok(vec![Some(pinv_backward(g, &p, &sa)?)])
    }))
}

/// PyTorch's `pinv_backward` (real case).
fn pinv_backward(g: &Tensor, p: &Tensor, a: &Tensor) -> Result<Tensor> {
    let (m, n) = (a.dims()[a.rank() - 2], a.dims()[a.rank() - 1]);
    let ph = mt(p)?;
    let gh = mt(g)?;
    if m <= n {
        let k = matmul(&gh, p)?;
        let kph = matmul(&k, &ph)?;
        let t1 = neg(&mt(&matmul(p, &k)?)?)?;
        let t3 = matmul(&matmul(a, p)?, &kph)?;
        let t4 = matmul(&matmul(&ph, p)?, &sub(&gh, &matmul(&k, a)?)?)?;
        add(&sub(&add(&t1, &kph)?, &t3)?, &t4)
    } else {
        let k = matmul(p, &gh)?;
        let phk = matmul(&ph, &k)?;
        let t1 = neg(&mt(&matmul(&k, p)?)?)?;
        let t2 = matmul(&matmul(&sub(&gh, &matmul(a, &k)?)?, p)?, &ph)?;
        let t4 = matmul(&matmul(&phk, p)?, a)?;
        sub(&add(&add(&t1, &t2)?, &phk)?, &t4)
    }
}

/// `torch.pinverse(input, rcond=1e-15)`: the Moore–Penrose pseudo-inverse (singular
/// values at most `rcond` times the largest are treated as zero).
pub fn pinverse(a: &Tensor, rcond: f64) -> Result<Tensor> {
    let ([a], _body) = enter(&PINVERSE, [a])?;
    last2("pinverse", &a)?;
    pinv_core(&a, rcond)
}

// ----- QR ---------------------------------------------------------------------------------

amp_kernels::named_mode! {
    /// The modes of `torch.linalg.qr`.
    pub enum QrMode {
        /// `Q` `[m, k]`, `R` `[k, n]`.
        Reduced = "reduced",
        /// `Q` `[m, m]`, `R` `[m, n]`.
        Complete = "complete",
        /// Only `R` (`Q` is empty); not differentiable.
        R = "r",
    }
    else |other| -> Error { Error::invalid("linalg.qr", format!("qr received unrecognized mode '{other}' but expected one of 'reduced' (default), 'r', or 'complete'")) }
}

fn qr_core(a: &Tensor, mode: QrMode) -> Result<(Tensor, Tensor)> {
    let (m, n) = last2("linalg.qr", a)?;
    let (q, r) = amp_kernels::linalg_qr(a.data(), mode == QrMode::Complete)?;
    let q = if mode == QrMode::R {
        Raw::zeros([0], a.dtype())
    } else {
        q
    };
    let (sq, sr, sa) = (q.clone(), r.clone(), a.clone());
    let bw: BackwardFn = Box::new(move |gs: &[Option<Tensor>]| {
        let (gq, gr) = (gs[0].as_ref(), gs[1].as_ref());
        if gq.is_none() && gr.is_none() {
            return Ok(vec![None]);
        }
        if mode == QrMode::R {
            return Err(Error::invalid("linalg.qr", "The derivative of linalg.qr depends on Q, which is not computed when mode='r'. Please use linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr."));
        }
        if mode == QrMode::Complete && m > n {
            return Err(Error::invalid("linalg.qr", "The QR decomposition is not differentiable when mode='complete' and nrows > ncols."));
        }
        let (q, r) = again((raw(&sq), raw(&sr)), || qr_core(&sa, mode))?;
        if m >= n {
            return Ok(vec![Some(qr_backward_tall(gq, gr, &q, &r)?)]);
        }
        // A = [X | Y], R = [U | V]: X = Q U, Y = Q V.
        let y = narrow(&sa, -1, m, n - m)?;
        let (gu, gv) = match gr {
            Some(g) => (Some(narrow(g, -1, 0, m)?), Some(narrow(g, -1, m, n - m)?)),
            None => (None, None),
        };
        let u = narrow(&r, -1, 0, m)?;
        let gq2 = match (&gv, gq) {
            (Some(gv), Some(gq)) => Some(add(gq, &matmul(&y, &mt(gv)?)?)?),
            (Some(gv), None) => Some(matmul(&y, &mt(gv)?)?),
            (None, gq) => gq.cloned(),
        };
        let gx = qr_backward_tall(gq2.as_ref(), gu.as_ref(), &q, &u)?;
        let gy = match &gv {
            Some(gv) => matmul(&q, gv)?,
            None => Tensor::zeros(y.dims().to_vec(), y.dtype()),
        };
        Ok(vec![Some(cat(&[gx, gy], -1)?)])
    });
    let mut outs = record_multi(
        vec![q, r],
        &[mode != QrMode::R, true],
        "LinalgQrBackward0",
        &[a],
        bw,
    );
    let r = outs.pop().expect("two outputs");
    let q = outs.pop().expect("two outputs");
    Ok((q, r))
}

/// `gA = (gQ + Q copyltu(M)) R⁻ᵀ` with `M = R gRᵀ - gQᵀ Q` (`m >= n`, `R` square).
fn qr_backward_tall(
    gq: Option<&Tensor>,
    gr: Option<&Tensor>,
    q: &Tensor,
    r: &Tensor,
) -> Result<Tensor> {
    let m = match (gr, gq) {
        (Some(gr), Some(gq)) => sub(&matmul(r, &mt(gr)?)?, &matmul(&mt(gq)?, q)?)?,
        (Some(gr), None) => matmul(r, &mt(gr)?)?,
        (None, Some(gq)) => neg(&matmul(&mt(gq)?, q)?)?,
        (None, None) => unreachable!("some gradient"),
    };
    let sym = add(&tril(&m, 0)?, &mt(&tril(&m, -1)?)?)?;
    let mut b = matmul(q, &sym)?;
    if let Some(gq) = gq {
        b = add(&b, gq)?;
    }
    // X Rᵀ = B  ⇔  R Xᵀ = Bᵀ.
    mt(&tri_core(r, &mt(&b)?, true, false)?)
}

/// `torch.linalg.qr(A, mode='reduced')`: `(Q, R)`.
pub fn linalg_qr(a: &Tensor, mode: QrMode) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&LINALG_QR, [a])?;
    qr_core(&a, mode)
}

/// `torch.qr(input, some=True)`: `(Q, R)`, reduced when `some`.
pub fn qr(a: &Tensor, some: bool) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&QR, [a])?;
    qr_core(
        &a,
        if some {
            QrMode::Reduced
        } else {
            QrMode::Complete
        },
    )
}

// ----- Householder representation ---------------------------------------------------------

/// `torch.geqrf(input)`: LAPACK's packed Householder QR `(a, tau)` (not differentiable,
/// as in PyTorch).
pub fn geqrf(a: &Tensor) -> Result<(Tensor, Tensor)> {
    let ([a], _body) = enter(&GEQRF, [a])?;
    last2("geqrf", &a)?;
    if needs_grad(&[&a]) {
        return Err(Error::invalid(
            "geqrf",
            "the derivative for 'geqrf' is not implemented.",
        ));
    }
    let (qr, tau) = amp_kernels::geqrf(a.data())?;
    Ok((Tensor::from_raw(qr), Tensor::from_raw(tau)))
}

/// Reflector `i` of a packed Householder matrix `a` `[..., m, n]`: `[..., m, 1]` with
/// zeros above row `i`, a one at row `i` and `a`'s column `i` below (differentiable).
fn reflector(a: &Tensor, i: usize) -> Result<Tensor> {
    let m = a.dims()[a.rank() - 2];
    let col = narrow(a, -1, i, 1)?;
    let below = mask(m, 1, a, |r, _| r > i as i64)?;
    let unit = mask(m, 1, a, |r, _| r == i as i64)?;
    add(&mul(&col, &below)?, &unit)
}

/// `c` multiplied by reflector `i` (`H = I - tau v vᵀ`) on the left or the right.
fn apply_reflector(a: &Tensor, tau: &Tensor, i: usize, c: &Tensor, left: bool) -> Result<Tensor> {
    let v = reflector(a, i)?;
    let t = unsqueeze(&narrow(tau, -1, i, 1)?, -1)?;
    if left {
        sub(c, &mul(&t, &matmul(&v, &matmul(&mt(&v)?, c)?)?)?)
    } else {
        sub(c, &mul(&t, &matmul(&matmul(c, &v)?, &mt(&v)?)?)?)
    }
}

fn check_householder(op: &'static str, a: &Tensor, tau: &Tensor) -> Result<(usize, usize, usize)> {
    let (m, n) = last2(op, a)?;
    let k = *tau.dims().last().unwrap_or(&0);
    if tau.rank() + 1 != a.rank() || tau.dims()[..tau.rank() - 1] != a.dims()[..a.rank() - 2] {
        return Err(Error::invalid(
            op,
            format!(
                "expected tau of shape {:?}[..., k], got {:?}",
                &a.dims()[..a.rank() - 2],
                tau.dims()
            ),
        ));
    }
    if k > n || n > m {
        return Err(Error::invalid(
            op,
            format!("expected m >= n >= k, got A {m} x {n} and {k} reflectors"),
        ));
    }
    if a.dtype() != tau.dtype() {
        return Err(Error::invalid(op, "tau dtype should match the input dtype"));
    }
    Ok((m, n, k))
}

fn householder_impl(op: &'static str, a: &Tensor, tau: &Tensor) -> Result<Tensor> {
    if !matches!(a.dtype(), DType::F32 | DType::F64) {
        return Err(Error::Tensor(amp_tensor::Error::UnsupportedDType {
            op,
            dtype: a.dtype(),
        }));
    }
    let (m, n, k) = check_householder(op, a, tau)?;
    let batch = &a.dims()[..a.rank() - 2];
    let id = mask(m, n, a, |i, j| i == j)?;
    let mut q = expand_batch(&id, batch)?;
    for i in (0..k).rev() {
        q = apply_reflector(a, tau, i, &q, true)?;
    }
    Ok(q)
}

/// `torch.linalg.householder_product(A, tau)`: the first `n` columns of
/// `H_1 ⋯ H_k`, `H_i = I - tau_i v_i v_iᵀ` with `v_i` column `i` of `A` below the
/// diagonal (and a one on it), as [`geqrf`] returns them. Built from differentiable ops.
pub fn linalg_householder_product(a: &Tensor, tau: &Tensor) -> Result<Tensor> {
    let ([a, tau], _body) = enter(&LINALG_HOUSEHOLDER_PRODUCT, [a, tau])?;
    householder_impl("linalg.householder_product", &a, &tau)
}

/// `torch.orgqr(input, tau)`: the same as [`linalg_householder_product`].
pub fn orgqr(a: &Tensor, tau: &Tensor) -> Result<Tensor> {
    let ([a, tau], _body) = enter(&ORGQR, [a, tau])?;
    householder_impl("orgqr", &a, &tau)
}

/// `torch.ormqr(input, tau, other, left=True, transpose=False)`: `other` multiplied by
/// the full `Q = H_1 ⋯ H_k` of ([`geqrf`]'s) `input, tau`: `op(Q) other` (`left`) or
/// `other op(Q)`, `op` the transpose when `transpose`.
pub fn ormqr(
    a: &Tensor,
    tau: &Tensor,
    other: &Tensor,
    left: bool,
    transpose_q: bool,
) -> Result<Tensor> {
    const OP: &str = "ormqr";
    let ([a, tau, other], _body) = enter(&ORMQR, [a, tau, other])?;
    if !matches!(a.dtype(), DType::F32 | DType::F64) {
        return Err(Error::Tensor(amp_tensor::Error::UnsupportedDType {
            op: OP,
            dtype: a.dtype(),
        }));
    }
    let (m, _, k) = {
        let (m, n) = last2(OP, &a)?;
        let k = *tau.dims().last().unwrap_or(&0);
        if k > n.min(m) || tau.dims()[..tau.rank() - 1] != a.dims()[..a.rank() - 2] {
            return Err(Error::invalid(
                OP,
                "tau must have shape [..., k] with k <= min(m, n)",
            ));
        }
        (m, n, k)
    };
    let (r, c) = last2(OP, &other)?;
    if (left && r != m) || (!left && c != m) {
        return Err(Error::invalid(
            OP,
            format!(
                "other must have {m} {}",
                if left { "rows" } else { "columns" }
            ),
        ));
    }
    let mut out = other.clone();
    // Q C = H_1 (⋯ (H_k C)); Qᵀ C = H_k ⋯ H_1 C; C Q = C H_1 ⋯ H_k; C Qᵀ = C H_k ⋯ H_1.
    let forward = left == transpose_q;
    let order: Vec<usize> = if forward {
        (0..k).collect()
    } else {
        (0..k).rev().collect()
    };
    for i in order {
        out = apply_reflector(&a, &tau, i, &out, left)?;
    }
    Ok(out)
}

// ----- LU ---------------------------------------------------------------------------------

/// Unpacks `(L, U)` from a packed square LU factorisation (differentiable).
fn lu_unpack_lu(lu: &Tensor) -> Result<(Tensor, Tensor)> {
    let n = lu.dims()[lu.rank() - 1];
    let l = add(&tril(lu, -1)?, &eye(n, lu)?)?;
    Ok((l, triu(lu, 0)?))
}

fn lu_core(a: &Tensor) -> Result<(Tensor, Raw, Raw)> {
    let (lu, piv, info) = amp_kernels::linalg_lu_factor_ex(a.data())?;
    let (m, n) = last2("torch.lu", a)?;
    let (slu, spiv, sa) = (lu.clone(), piv.clone(), a.clone());
    let out = record(lu, "LinalgLuFactorExBackward0", &[a], move |g| {
        if m != n {
            return Err(Error::invalid(
                "torch.lu",
                "the backward of the LU factorisation is implemented for square matrices only",
            ));
        }
        let lu = again(raw(&slu), || Ok(lu_core(&sa)?.0))?;
        let (l, u) = lu_unpack_lu(&lu)?;
        let gl = tril(g, -1)?;
        let gu = triu(g, 0)?;
        let phi = add(
            &tril(&matmul(&mt(&l)?, &gl)?, -1)?,
            &triu(&matmul(&gu, &mt(&u)?)?, 0)?,
        )?;
        let y = tri_core(&mt(&l)?, &phi, true, true)?;
        let z = mt(&tri_core(&u, &mt(&y)?, true, false)?)?;
        let p = Tensor::from_raw(amp_kernels::lu_pivots_to_permutation(&spiv, m, g.dtype())?);
        Ok(vec![Some(matmul(&p, &z)?)])
    });
    Ok((out, piv, info))
}

/// `torch.lu(A, pivot=True, get_infos=False)` (`_lu_with_info`): the packed LU
/// factorisation with partial pivoting and its 1-based `int32` pivots, plus the `int32`
/// infos with `get_infos` (a singular matrix is not an error: its info is nonzero).
/// `pivot=False` is not available on the CPU, as in PyTorch.
pub fn lu(a: &Tensor, pivot: bool, get_infos: bool) -> Result<Vec<Tensor>> {
    let ([a], _body) = enter(&LU_WITH_INFO, [a])?;
    if !pivot {
        return Err(Error::invalid(
            "torch.lu",
            "LU without pivoting is not implemented on the CPU",
        ));
    }
    let (lu, piv, info) = lu_core(&a)?;
    let mut out = vec![lu, Tensor::from_raw(piv)];
    if get_infos {
        out.push(Tensor::from_raw(info));
    }
    Ok(out)
}

/// `torch.lu_solve(b, LU_data, LU_pivots)`: `X` with `A X = b`, `A = P L U` given by
/// [`lu`]'s outputs.
pub fn lu_solve(b: &Tensor, lu_data: &Tensor, lu_pivots: &Tensor) -> Result<Tensor> {
    let ([b, lu_data, lu_pivots], _body) = enter(&LU_SOLVE, [b, lu_data, lu_pivots])?;
    let (m, n) = last2("lu_solve", &lu_data)?;
    if m != n {
        return Err(Error::invalid(
            "lu_solve",
            "LU_data must be batches of square matrices",
        ));
    }
    last2("lu_solve", &b)?;
    let p = Tensor::from_raw(amp_kernels::lu_pivots_to_permutation(
        lu_pivots.data(),
        n,
        lu_data.dtype(),
    )?);
    let (l, u) = lu_unpack_lu(&lu_data)?;
    let pb = matmul(&mt(&p)?, &b)?;
    let y = tri_impl(&l, &pb, false, true, true)?;
    tri_impl(&u, &y, true, true, false)
}

// ----- least squares -------------------------------------------------------------------------

/// `torch.lstsq(input, A)` (PyTorch ≤ 1.12; removed since, in favour of
/// [`linalg_lstsq`]): LAPACK `gels` on a 2-D `A` `[m, n]` and `input` `[m, k]` (or
/// `[m]`). Returns `(solution, QR)` as `gels` leaves its arrays:
/// - `m >= n`: `QR` is the packed Householder QR of `A` ([`geqrf`]'s first output);
///   `solution` is `[m, k]`: the least-squares solution in its first `n` rows and the
///   rest of `Qᵀ input` below (their squared column norms are the residuals);
/// - `m < n`: `QR` is the packed LQ of `A` (the transpose of `geqrf(Aᵀ)`); `solution` is
///   the minimum-norm solution `[n, k]`.
///
/// Full rank is assumed, as `gels` does. Not differentiable (as in PyTorch).
pub fn lstsq(input: &Tensor, a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "lstsq";
    let ([b, a], _body) = enter(&LSTSQ, [input, a])?;
    if a.rank() != 2 {
        return Err(Error::invalid(OP, "A should have 2 dimensions"));
    }
    if b.rank() == 0 || b.rank() > 2 {
        return Err(Error::invalid(OP, "input should have 1 or 2 dimensions"));
    }
    if needs_grad(&[&a, &b]) {
        return Err(Error::invalid(
            OP,
            "the derivative for 'lstsq' is not implemented.",
        ));
    }
    let (m, n) = (a.dims()[0], a.dims()[1]);
    if b.dims()[0] != m {
        return Err(Error::invalid(
            OP,
            format!(
                "Expected input and A to have the same number of rows, got {} and {m}",
                b.dims()[0]
            ),
        ));
    }
    let b2 = if b.rank() == 1 {
        unsqueeze(&b, 1)?
    } else {
        b.clone()
    };
    let k = b2.dims()[1];
    if m >= n {
        let (qr, tau) = geqrf(&a)?;
        let qtb = ormqr(&qr, &tau, &b2, true, true)?;
        let r = triu(&narrow(&qr, 0, 0, n)?, 0)?;
        let (x, _) = triangular_solve(&narrow(&qtb, 0, 0, n)?, &r, true, false, false)?;
        let sol = cat(&[x, narrow(&qtb, 0, n, m - n)?], 0)?;
        Ok((sol, qr))
    } else {
        let (qrt, tau) = geqrf(&transpose(&a, 0, 1)?)?;
        let lq = Tensor::from_raw(transpose(&qrt, 0, 1)?.data().try_contiguous()?);
        let l = tril(&narrow(&lq, 1, 0, m)?, 0)?;
        let (y, _) = triangular_solve(&b2, &l, false, false, false)?;
        let pad = Tensor::zeros([n - m, k], a.dtype());
        let x = ormqr(&qrt, &tau, &cat(&[y, pad], 0)?, true, false)?;
        Ok((x, lq))
    }
}

/// `torch.linalg.lstsq(A, B, rcond=None, *, driver=None)`: `(solution, residuals, rank,
/// singular_values)`. The solution is `pinv(A) B` (PyTorch's gradient of the solution
/// is that of this expression); `rank` is given for every driver but `gels`, the
/// singular values for `gelsd` / `gelss`, and the squared residuals when `m > n`, the
/// driver is not `gelsy` (the CPU default) and every matrix has full rank; an output
/// not given is an empty tensor. Only the solution is differentiable.
pub fn linalg_lstsq(
    a: &Tensor,
    b: &Tensor,
    rcond: Option<f64>,
    driver: Option<&str>,
) -> Result<Vec<Tensor>> {
    let ([a, b], _body) = enter(&LINALG_LSTSQ, [a, b])?;
    let driver = driver.unwrap_or("gelsy");
    if !["gels", "gelsy", "gelsd", "gelss"].contains(&driver) {
        return Err(Error::invalid(
            "torch.linalg.lstsq",
            format!(
                "parameter `driver` should be one of (gels, gelsy, gelsd, gelss), but got {driver}"
            ),
        ));
    }
    let (m, n) = last2("torch.linalg.lstsq", &a)?;
    let vector = b.rank() + 1 == a.rank();
    let b2 = if vector {
        unsqueeze(&b, -1)?
    } else {
        b.clone()
    };
    let eps = if a.dtype() == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let rcond = rcond.filter(|r| *r > 0.0).unwrap_or(eps * m.max(n) as f64);
    let p = pinv_core(&a, rcond)?;
    let (pe, be) = broadcast_batch("torch.linalg.lstsq", &p, &b2)?;
    let mut x = matmul(&pe, &be)?;
    let empty = || Tensor::zeros([0], a.dtype());
    let rank = if driver == "gels" {
        Tensor::zeros([0], DType::I64)
    } else {
        Tensor::from_raw(amp_kernels::linalg_matrix_rank(
            a.data(),
            None,
            Some(rcond),
            false,
        )?)
    };
    let full_rank = amp_kernels::linalg_matrix_rank(a.data(), None, Some(rcond), false)?
        .to_vec_as::<i64>()
        .iter()
        .all(|&r| r as usize == n);
    let residuals = if m > n && driver != "gelsy" && (driver == "gels" || full_rank) {
        let r = sub(
            &matmul(&expand_batch(&a, &be.dims()[..be.rank() - 2])?, &x)?,
            &be,
        )?;
        let r = Tensor::from_raw(r.data().clone());
        sum(&mul(&r, &r)?, &[-2], false, None)?
    } else {
        empty()
    };
    let sv = if driver == "gelsd" || driver == "gelss" {
        Tensor::from_raw(amp_kernels::linalg_svd(a.data(), false, false)?.1)
    } else {
        empty()
    };
    if vector {
        x = squeeze(&x, -1)?;
    }
    Ok(vec![x, residuals, rank, sv])
}

// ----- norms, condition number, rank -----------------------------------------------------------

/// The `ord` of a matrix norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MatrixNormOrd {
    /// Frobenius norm.
    Fro,
    /// Nuclear norm (sum of singular values).
    Nuc,
    /// `2`, `-2` (largest / smallest singular value), `1`, `-1` (max / min column
    /// abs-sum), `inf`, `-inf` (max / min row abs-sum).
    P(f64),
}

fn matrix_norm_impl(
    a: &Tensor,
    ord: MatrixNormOrd,
    dims: [i64; 2],
    keepdim: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_norm";
    let r = a.rank() as i64;
    if r < 2 {
        return Err(Error::invalid(
            OP,
            "The input tensor A must have at least 2 dimensions.",
        ));
    }
    let wrap = |d: i64| -> Result<i64> {
        let w = if d < 0 { d + r } else { d };
        if !(0..r).contains(&w) {
            return Err(Error::Tensor(amp_tensor::Error::DimOutOfRange {
                dim: d,
                ndim: r as usize,
            }));
        }
        Ok(w)
    };
    let (d0, d1) = (wrap(dims[0])?, wrap(dims[1])?);
    if d0 == d1 {
        return Err(Error::invalid(OP, "dims must be different"));
    }
    let svd_based = |reduce: &dyn Fn(&Tensor) -> Result<Tensor>| -> Result<Tensor> {
        let mut perm: Vec<i64> = (0..r).filter(|&d| d != d0 && d != d1).collect();
        perm.extend([d0, d1]);
        let s = svdvals_impl(&permute(a, &perm)?)?;
        let mut out = reduce(&s)?;
        if keepdim {
            let (lo, hi) = (d0.min(d1), d0.max(d1));
            out = unsqueeze(&unsqueeze(&out, lo)?, hi)?;
        }
        Ok(out)
    };
    match ord {
        MatrixNormOrd::Fro => super::reduce::norm(a, 2.0, &[d0, d1], keepdim),
        MatrixNormOrd::Nuc => svd_based(&|s| sum(s, &[-1], false, None)),
        MatrixNormOrd::P(2.0) => svd_based(&|s| amax(s, &[-1], false)),
        MatrixNormOrd::P(-2.0) => svd_based(&|s| amin(s, &[-1], false)),
        MatrixNormOrd::P(p) if p.abs() == 1.0 || p.is_infinite() => {
            // 1: max over columns of the abs-sum down dim0; inf: over rows.
            let (sum_dim, red_dim) = if p.abs() == 1.0 { (d0, d1) } else { (d1, d0) };
            let s = sum(&super::pointwise::abs(a)?, &[sum_dim], true, None)?;
            let out = if p > 0.0 {
                amax(&s, &[red_dim], true)?
            } else {
                amin(&s, &[red_dim], true)?
            };
            if keepdim {
                Ok(out)
            } else {
                let (lo, hi) = (d0.min(d1), d0.max(d1));
                squeeze(&squeeze(&out, hi)?, lo)
            }
        }
        MatrixNormOrd::P(p) => Err(Error::invalid(OP, format!("Order {p} not supported."))),
    }
}

/// `torch.linalg.matrix_norm(A, ord='fro', dim=(-2, -1), keepdim=False, *, dtype=None)`.
pub fn linalg_matrix_norm(
    a: &Tensor,
    ord: MatrixNormOrd,
    dims: [i64; 2],
    keepdim: bool,
    dtype: Option<DType>,
) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_MATRIX_NORM, [a])?;
    let a = match dtype {
        Some(d) => super::cast::to_dtype(&a, d)?,
        None => a.clone(),
    };
    matrix_norm_impl(&a, ord, dims, keepdim)
}

/// `torch.linalg.cond(A, p=None)`: the condition number; `None`, `2`, `-2` from the
/// singular values, other orders as `norm(A) * norm(inv(A))` (infinite for a singular
/// matrix).
pub fn linalg_cond(a: &Tensor, p: Option<MatrixNormOrd>) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_COND, [a])?;
    let (m, n) = last2("linalg.cond", &a)?;
    match p {
        None | Some(MatrixNormOrd::P(2.0)) | Some(MatrixNormOrd::P(-2.0)) => {
            let s = svdvals_impl(&a)?;
            let k = m.min(n);
            let big = narrow(&s, -1, 0, 1)?;
            let small = narrow(&s, -1, k - 1, 1)?;
            let c = if p == Some(MatrixNormOrd::P(-2.0)) {
                div(&small, &big)?
            } else {
                div(&big, &small)?
            };
            squeeze(&c, -1)
        }
        Some(ord) => {
            if m != n {
                return Err(Error::invalid(
                    "linalg.cond",
                    "A must be batches of square matrices for this norm order",
                ));
            }
            let (inv, info) = inv_core(&a)?;
            let na = matrix_norm_impl(&a, ord, [-2, -1], false)?;
            let ni = matrix_norm_impl(&inv, ord, [-2, -1], false)?;
            let c = mul(&na, &ni)?;
            let singular = Tensor::from_raw(Raw::from_vec(
                info.to_vec_as::<i64>()
                    .iter()
                    .map(|&i| i != 0)
                    .collect::<Vec<_>>(),
                info.dims().to_vec(),
            )?);
            let inf = Tensor::full(c.dims().to_vec(), f64::INFINITY, c.dtype());
            where_(&singular, &inf, &c)
        }
    }
}

/// `torch.linalg.matrix_rank(A, *, atol=None, rtol=None, hermitian=False)`: `int64`;
/// `rtol = None` is `eps * max(m, n)` unless `atol > 0` is given (then 0).
pub fn linalg_matrix_rank(
    a: &Tensor,
    atol: Option<f64>,
    rtol: Option<f64>,
    hermitian: bool,
) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_MATRIX_RANK, [a])?;
    // An `atol` of zero does not turn the default `rtol` off (only one above zero does).
    let atol = atol.filter(|v| *v > 0.0 || rtol.is_some());
    Ok(Tensor::from_raw(amp_kernels::linalg_matrix_rank(
        a.data(),
        atol,
        rtol,
        hermitian,
    )?))
}

/// `torch.linalg.tensorinv(A, ind=2)`: the inverse with respect to `tensordot` over the
/// first `ind` dims.
pub fn linalg_tensorinv(a: &Tensor, ind: usize) -> Result<Tensor> {
    let ([a], _body) = enter(&LINALG_TENSORINV, [a])?;
    if ind == 0 || ind > a.rank() {
        return Err(Error::invalid(
            "linalg.tensorinv",
            "Expected a strictly positive integer for 'ind'",
        ));
    }
    let (lead, rest) = a.dims().split_at(ind);
    let (p, q): (usize, usize) = (lead.iter().product(), rest.iter().product());
    if p != q {
        return Err(Error::invalid(
            "linalg.tensorinv",
            "Expected self to satisfy the requirement prod(self.shape[ind:]) == prod(self.shape[:ind])",
        ));
    }
    let inv = inv_checked(&reshape(&a, [p, q].as_slice())?, "linalg.tensorinv")?;
    let shape: Vec<usize> = rest.iter().chain(lead).copied().collect();
    reshape(&inv, shape.as_slice())
}

/// `torch.linalg.tensorsolve(A, B, dims=None)`: `X` with `tensordot(A, X, X.ndim) = B`.
pub fn linalg_tensorsolve(a: &Tensor, b: &Tensor, dims: Option<&[i64]>) -> Result<Tensor> {
    let ([a, b], _body) = enter(&LINALG_TENSORSOLVE, [a, b])?;
    let r = a.rank() as i64;
    let a = match dims {
        Some(ds) if !ds.is_empty() => {
            let moved: Vec<i64> = ds.iter().map(|&d| if d < 0 { d + r } else { d }).collect();
            let mut perm: Vec<i64> = (0..r).filter(|d| !moved.contains(d)).collect();
            perm.extend(&moved);
            permute(&a, &perm)?
        }
        _ => a.clone(),
    };
    if b.rank() > a.rank() || a.dims()[..b.rank()] != *b.dims() {
        return Err(Error::invalid(
            "linalg.tensorsolve",
            "Expected A.shape[:B.ndim] to equal B.shape",
        ));
    }
    let out_shape = a.dims()[b.rank()..].to_vec();
    let (p, q): (usize, usize) = (b.elem_count(), out_shape.iter().product());
    if p != q {
        return Err(Error::invalid(
            "linalg.tensorsolve",
            "Expected self to satisfy the requirement prod(self.shape[other.ndim:]) == prod(self.shape[:other.ndim])",
        ));
    }
    let x = solve_impl(
        &reshape(&a, [p, q].as_slice())?,
        &reshape(&b, [p].as_slice())?,
        true,
    )?;
    reshape(&x, out_shape.as_slice())
}

// ----- quantiles -----------------------------------------------------------------------------

/// The `q` of a quantile: a Python number or a 0-D / 1-D tensor of the input's dtype.
#[derive(Debug, Clone, Copy)]
pub enum QuantileQ<'a> {
    /// One quantile: the dim is reduced.
    Scalar(f64),
    /// Quantiles as a tensor: a 1-D `q` adds a leading dim of its length.
    Tensor(&'a Tensor),
}

/// `[rows, n]` → `[rows, nq]`, recording the routing of gradients.
fn quantile_rows_op(
    x: &Tensor,
    q: &[f64],
    interp: QuantileInterpolation,
    ignore_nan: bool,
) -> Result<Tensor> {
    let parts = amp_kernels::quantile_rows(x.data(), q, interp, ignore_nan)?;
    let (rows, n) = (x.dims()[0], x.dims()[1]);
    let (lo, hi, w) = (parts.lo, parts.hi, parts.weight);
    Ok(record(parts.values, "QuantileBackward0", &[x], move |g| {
        let w = raw(&w);
        let one_minus = super::pointwise::rsub_scalar(&w, 1.0)?;
        let z = Tensor::zeros([rows, n], g.dtype());
        let gx = scatter_add(&z, 1, &raw(&lo), &mul(g, &one_minus)?)?;
        Ok(vec![Some(scatter_add(&gx, 1, &raw(&hi), &mul(g, &w)?)?)])
    }))
}

fn quantile_impl(
    x: &Tensor,
    q: QuantileQ<'_>,
    dim: Option<i64>,
    keepdim: bool,
    interpolation: &str,
    ignore_nan: bool,
) -> Result<Tensor> {
    let interp: QuantileInterpolation = interpolation.parse()?;
    let op = if ignore_nan {
        "nanquantile"
    } else {
        "quantile"
    };
    if !matches!(x.dtype(), DType::F32 | DType::F64) {
        return Err(Error::invalid(
            op,
            format!(
                "quantile() input tensor must be either float or double dtype, but got {}",
                x.dtype()
            ),
        ));
    }
    let (qs, q_dim) = match q {
        QuantileQ::Scalar(v) => (vec![v], None),
        QuantileQ::Tensor(t) => {
            if t.rank() > 1 {
                return Err(Error::invalid(
                    op,
                    "quantile() q must be a scalar or 1D tensor",
                ));
            }
            if t.dtype() != x.dtype() {
                return Err(Error::invalid(
                    op,
                    "quantile() q tensor must be same dtype as the input tensor",
                ));
            }
            (
                t.data().to_vec_f64(),
                (t.rank() == 1).then(|| t.elem_count()),
            )
        }
    };
    let r = x.rank() as i64;
    let (rows_t, out_dims) = match dim {
        None => {
            let n = x.elem_count();
            let out_dims = if keepdim {
                vec![1; x.rank()]
            } else {
                Vec::new()
            };
            (reshape(x, [1, n].as_slice())?, out_dims)
        }
        Some(d) => {
            let rr = r.max(1);
            let w = if d < 0 { d + rr } else { d };
            if !(0..rr).contains(&w) {
                return Err(Error::Tensor(amp_tensor::Error::DimOutOfRange {
                    dim: d,
                    ndim: x.rank(),
                }));
            }
            let xx = if x.rank() == 0 {
                reshape(x, [1].as_slice())?
            } else {
                x.clone()
            };
            let mut perm: Vec<i64> = (0..rr).filter(|&k| k != w).collect();
            perm.push(w);
            let moved = permute(&xx, &perm)?;
            let n = xx.dims()[w as usize];
            let rows = xx.elem_count() / n.max(1);
            let mut out_dims: Vec<usize> = xx.dims().to_vec();
            if keepdim {
                out_dims[w as usize] = 1;
            } else {
                out_dims.remove(w as usize);
            }
            if x.rank() == 0 {
                out_dims.clear();
            }
            (reshape(&moved, [rows, n].as_slice())?, out_dims)
        }
    };
    let vals = quantile_rows_op(&rows_t, &qs, interp, ignore_nan)?;
    let vals = mt(&vals)?;
    match q_dim {
        None => reshape(&vals, out_dims.as_slice()),
        Some(nq) => {
            let mut dims = vec![nq];
            dims.extend(out_dims);
            reshape(&vals, dims.as_slice())
        }
    }
}

/// `torch.quantile(input, q, dim=None, keepdim=False, *, interpolation='linear')`.
pub fn quantile(
    x: &Tensor,
    q: QuantileQ<'_>,
    dim: Option<i64>,
    keepdim: bool,
    interpolation: &str,
) -> Result<Tensor> {
    quantile_entry(&QUANTILE, x, q, dim, keepdim, interpolation, false)
}

/// `torch.nanquantile(...)`: [`quantile`] ignoring NaNs.
pub fn nanquantile(
    x: &Tensor,
    q: QuantileQ<'_>,
    dim: Option<i64>,
    keepdim: bool,
    interpolation: &str,
) -> Result<Tensor> {
    quantile_entry(&NANQUANTILE, x, q, dim, keepdim, interpolation, true)
}

fn quantile_entry(
    op: &'static OpName,
    x: &Tensor,
    q: QuantileQ<'_>,
    dim: Option<i64>,
    keepdim: bool,
    interpolation: &str,
    ignore_nan: bool,
) -> Result<Tensor> {
    match q {
        QuantileQ::Scalar(_) => {
            let ([x], _body) = enter(op, [x])?;
            quantile_impl(&x, q, dim, keepdim, interpolation, ignore_nan)
        }
        QuantileQ::Tensor(t) => {
            let (a, _body) = enter_vec(op, &[x, t])?;
            quantile_impl(
                &a[0],
                QuantileQ::Tensor(&a[1]),
                dim,
                keepdim,
                interpolation,
                ignore_nan,
            )
        }
    }
}

// ----- fake quantization ----------------------------------------------------------------------

/// `torch.fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min,
/// quant_max)`: quantize-dequantize; the gradient passes straight through where the
/// rounded value lies within `[quant_min, quant_max]` and is zero elsewhere.
pub fn fake_quantize_per_tensor_affine(
    x: &Tensor,
    scale: f64,
    zero_point: i64,
    quant_min: i64,
    quant_max: i64,
) -> Result<Tensor> {
    let ([x], _body) = enter(&FAKE_QUANTIZE, [x])?;
    let (out, m) = amp_kernels::fake_quantize_per_tensor_affine(
        x.data(),
        scale,
        zero_point,
        quant_min,
        quant_max,
    )?;
    Ok(record(
        out,
        "FakeQuantizePerTensorAffineCachemaskBackward0",
        &[&x],
        move |g| {
            Ok(vec![Some(mul(
                g,
                &Tensor::from_raw(m.to_dtype(g.dtype())?),
            )?)])
        },
    ))
}
