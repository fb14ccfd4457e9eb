//! Op-table entries: Linear algebra (the cpu fp32 list) and quantiles.
//!
//! Not here (no entry, so listed as not executable): the complex-valued ops
//! (`linalg_eig`, `linalg_eigvals`, `eig`).

use amp::autograd::ops::{self, MatrixNormOrd, QuantileQ};
use amp::autograd::Tensor;

use super::{Bound, BuiltinTensor, FromArg, IntoOutput, A};
use crate::args::Arg;
use crate::optable::OpTable;

/// `ord` / `p` of a matrix norm: `'fro'`, `'nuc'` or a number (`inf` as a float).
fn norm_ord(a: &A) -> Result<MatrixNormOrd, String> {
    match a {
        Arg::Str(s) if s == "fro" => Ok(MatrixNormOrd::Fro),
        Arg::Str(s) if s == "nuc" => Ok(MatrixNormOrd::Nuc),
        Arg::Str(s) if s == "inf" => Ok(MatrixNormOrd::P(f64::INFINITY)),
        Arg::Str(s) if s == "-inf" => Ok(MatrixNormOrd::P(f64::NEG_INFINITY)),
        other => Ok(MatrixNormOrd::P(
            other.float().map_err(|e| format!("`ord`: {e}"))?,
        )),
    }
}

/// `q` of a quantile: a number, or a tensor of quantiles.
impl<'a> FromArg<'a> for QuantileQ<'a> {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        match arg {
            Some(Arg::Tensor(t)) => Ok(QuantileQ::Tensor(t)),
            a => f64::from_arg(name, a).map(QuantileQ::Scalar),
        }
    }
}

/// A Python number, or the value of a one-element tensor (`scale` and `zero_point` of
/// fake quantization).
fn item<'a, T: FromArg<'a>>(b: &Bound<'a>, name: &str, of: fn(f64) -> T) -> Result<T, String> {
    match b.req(name)? {
        Arg::Tensor(t) => Ok(of(t
            .data()
            .item_f64()
            .map_err(|e| crate::device::tensor_error_text(&e))?)),
        _ => b.arg(name),
    }
}

/// `matrix_rank(A, *, atol=None, rtol=None, hermitian=False, out=None)` and the older
/// overload `matrix_rank(A, tol=None, hermitian=False, *, out=None)`.
fn matrix_rank(b: &Bound<'_>) -> Result<crate::args::Output<Tensor>, String> {
    let tol: Option<f64> = b.arg("tol")?;
    let (atol, rtol): (Option<f64>, Option<f64>) = (b.arg("atol")?, b.arg("rtol")?);
    let (atol, rtol) = match tol {
        Some(t) if atol.is_some() || rtol.is_some() => {
            return Err(format!(
                "`tol={t}` cannot be given together with `atol` or `rtol`"
            ))
        }
        Some(t) => (Some(t), Some(0.0)),
        None => (atol, rtol),
    };
    ops::linalg_matrix_rank(b.arg("A")?, atol, rtol, b.arg("hermitian")?).into_output()
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    let quantile = "input, q, dim=None, keepdim=False, *, interpolation='linear', !out=None";
    calls! { t;
        "torch.trace": "input" => ops::trace;
        "torch.inverse": "input, *, !out=None" => ops::inverse;
        "torch.linalg.inv": "A, *, !out=None" => ops::linalg_inv;
        "torch.linalg.inv_ex": "A, *, check_errors=False, !out=None" => ops::linalg_inv_ex;
        "torch.linalg.solve": "A, B, *, left=True, !out=None" => ops::linalg_solve;
        // Removed in PyTorch 2: torch.solve(input, A, *, out=None) -> (solution, LU).
        "torch.solve": "input, A, *, !out=None" => ops::solve;
        "torch.triangular_solve": "b, A, upper=True, transpose=False, unitriangular=False, *, \
                                   !out=None" => ops::triangular_solve;
        "torch.linalg.cholesky": "A, *, upper=False, !out=None" => ops::linalg_cholesky;
        "torch.linalg.cholesky_ex": "A, *, upper=False, check_errors=False, !out=None"
            => ops::linalg_cholesky_ex;
        "torch.cholesky": "input, upper=False, *, !out=None" => ops::cholesky;
        "torch.cholesky_solve": "B, L, upper=False, *, !out=None" => ops::cholesky_solve;
        "torch.cholesky_inverse": "L, upper=False, *, !out=None" => ops::cholesky_inverse;
        "torch.linalg.eigh": "A, UPLO='L', *, !out=None" => ops::linalg_eigh;
        "torch.linalg.eigvalsh": "A, UPLO='L', *, !out=None" => ops::linalg_eigvalsh;
        // Removed in PyTorch 2.
        "torch.symeig": "input, eigenvectors=False, upper=True, *, !out=None" => ops::symeig;
        // `driver=` is for CUDA (cuSOLVER) only.
        "torch.linalg.svd": "A, full_matrices=True, *, !driver=None, !out=None" => ops::linalg_svd;
        "torch.linalg.svdvals": "A, *, !driver=None, !out=None" => ops::linalg_svdvals;
        "torch.svd": "input, some=True, compute_uv=True, *, !out=None" => ops::svd;
        "torch.pinverse": "input, rcond=1e-15" => ops::pinverse;
        "torch.linalg.qr": "A, mode='reduced', *, !out=None" => ops::linalg_qr;
        "torch.qr": "input, some=True, *, !out=None" => ops::qr;
        "torch.lu": "A, pivot=True, get_infos=False, !out=None" => ops::lu;
        "torch.lu_solve": "b, LU_data, LU_pivots, *, !out=None" => ops::lu_solve;
        "torch.linalg.lstsq": "A, B, rcond=None, *, driver=None" => ops::linalg_lstsq;
        "torch.lstsq": "input, A, *, !out=None" => ops::lstsq;
        "torch.geqrf": "input, *, !out=None" => ops::geqrf;
        "torch.linalg.householder_product": "A, tau, *, !out=None"
            => ops::linalg_householder_product;
        "torch.orgqr": "input, tau" => ops::orgqr;
        "torch.ormqr": "input, tau, other, left=True, transpose=False, *, !out=None" => ops::ormqr;
        "torch.quantile": quantile => ops::quantile;
        "torch.nanquantile": quantile => ops::nanquantile;
    }
    let matrix_norm = "A, ord='fro', dim=None, keepdim=False, *, dtype=None, !out=None";
    t.op("torch.linalg.matrix_norm", matrix_norm, |b| {
        let ord = b.get("ord").map_or(Ok(MatrixNormOrd::Fro), norm_ord)?;
        let dims = match b.arg::<Option<Vec<i64>>>("dim")? {
            None => [-2, -1],
            Some(v) => <[i64; 2]>::try_from(v.as_slice())
                .map_err(|_| "`dim` must be a 2-tuple of ints".to_string())?,
        };
        let (a, keepdim, dtype) = (b.arg("A")?, b.arg("keepdim")?, b.arg("dtype")?);
        ops::linalg_matrix_norm(a, ord, dims, keepdim, dtype).into_output()
    });
    t.op("torch.linalg.cond", "A, p=None, *, !out=None", |b| {
        let p = b.get("p").map(norm_ord).transpose()?;
        ops::linalg_cond(b.arg("A")?, p).into_output()
    });
    let matrix_rank_sig = "A, tol=None, hermitian=False, *, atol=None, rtol=None, !out=None";
    t.op("torch.linalg.matrix_rank", matrix_rank_sig, matrix_rank);
    t.op("torch.linalg.tensorinv", "A, ind=2, *, !out=None", |b| {
        let ind: i64 = b.arg("ind")?;
        let ind = usize::try_from(ind)
            .map_err(|_| "Expected a strictly positive integer for 'ind'".to_string())?;
        ops::linalg_tensorinv(b.arg("A")?, ind).into_output()
    });
    t.op(
        "torch.linalg.tensorsolve",
        "A, B, dims=None, *, !out=None",
        |b| {
            let dims = b.get("dims").map(|a| a.ints()).transpose()?;
            ops::linalg_tensorsolve(b.arg("A")?, b.arg("B")?, dims.as_deref()).into_output()
        },
    );
    // fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max),
    // with `scale` / `zero_point` Python numbers or 0-D tensors.
    let fake_quantize = "input, scale, zero_point, quant_min, quant_max";
    t.op(
        "torch.fake_quantize_per_tensor_affine",
        fake_quantize,
        |b| {
            let scale = item(b, "scale", |x| x)?;
            let zero_point = item(b, "zero_point", |x| x as i64)?;
            let (x, min, max) = (b.arg("input")?, b.arg("quant_min")?, b.arg("quant_max")?);
            ops::fake_quantize_per_tensor_affine(x, scale, zero_point, min, max).into_output()
        },
    );
}
