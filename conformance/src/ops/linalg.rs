//! Op-table entries: Linear algebra (the cpu fp32 list) and quantiles.
//!
//! Not here (no entry, so listed as not executable): the complex-valued ops
//! (`linalg_eig`, `linalg_eigvals`, `eig`).

use amp::autograd::ops::{self, MatrixNormOrd, QrMode, QuantileQ};
use amp::autograd::Tensor;

use super::{bind, err, one, Bound, BuiltinTensor, R};
use crate::args::{Arg, Output};
use crate::optable::OpTable;

fn pair(r: amp::autograd::Result<(Tensor, Tensor)>) -> R {
    r.map(|(a, b)| Output::Tensors(vec![a, b])).map_err(err)
}

fn triple(r: amp::autograd::Result<(Tensor, Tensor, Tensor)>) -> R {
    r.map(|(a, b, c)| Output::Tensors(vec![a, b, c]))
        .map_err(err)
}

fn many(r: amp::autograd::Result<Vec<Tensor>>) -> R {
    r.map(Output::Tensors).map_err(err)
}

/// `ord` / `p` of a matrix norm: `'fro'`, `'nuc'` or a number (`inf` as a float).
fn norm_ord(a: &Arg<Tensor>) -> Result<MatrixNormOrd, String> {
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

fn opt_f64(b: &Bound<'_>, name: &str) -> Result<Option<f64>, String> {
    b.get(name)
        .map(|a| a.float().map_err(|e| format!("`{name}`: {e}")))
        .transpose()
}

fn quantile_entry(
    nan: bool,
) -> impl Fn(&[Arg<Tensor>], &crate::args::Kwargs<Tensor>) -> R + Send + Sync {
    move |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "q", "dim", "keepdim"],
            &["interpolation", "out"],
        )?;
        b.unsupported_unless_none("out")?;
        let x = b.tensor("input")?;
        let q = match b.req("q")? {
            Arg::Tensor(t) => QuantileQ::Tensor(t),
            a => QuantileQ::Scalar(a.float().map_err(|e| format!("`q`: {e}"))?),
        };
        let dim = b
            .get("dim")
            .map(|d| d.int().map_err(|e| format!("`dim`: {e}")))
            .transpose()?;
        let keepdim = b.bool_or("keepdim", false)?;
        let interp = b.str_or("interpolation", "linear")?;
        if nan {
            one(ops::nanquantile(x, q, dim, keepdim, interp))
        } else {
            one(ops::quantile(x, q, dim, keepdim, interp))
        }
    }
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    t.insert("torch.trace", |args, kwargs| {
        let b = bind(args, kwargs, &["input"], &[])?;
        one(ops::trace(b.tensor("input")?))
    });
    t.insert("torch.inverse", |args, kwargs| {
        let b = bind(args, kwargs, &["input"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::inverse(b.tensor("input")?))
    });
    t.insert("torch.linalg.inv", |args, kwargs| {
        let b = bind(args, kwargs, &["A"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::linalg_inv(b.tensor("A")?))
    });
    t.insert("torch.linalg.inv_ex", |args, kwargs| {
        let b = bind(args, kwargs, &["A"], &["check_errors", "out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::linalg_inv_ex(
            b.tensor("A")?,
            b.bool_or("check_errors", false)?,
        ))
    });
    t.insert("torch.linalg.solve", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "B"], &["left", "out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::linalg_solve(
            b.tensor("A")?,
            b.tensor("B")?,
            b.bool_or("left", true)?,
        ))
    });
    // Removed in PyTorch 2: torch.solve(input, A, *, out=None) -> (solution, LU).
    t.insert("torch.solve", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "A"], &["out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::solve(b.tensor("input")?, b.tensor("A")?))
    });
    t.insert("torch.triangular_solve", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["b", "A", "upper", "transpose", "unitriangular"],
            &["out"],
        )?;
        b.unsupported_unless_none("out")?;
        pair(ops::triangular_solve(
            b.tensor("b")?,
            b.tensor("A")?,
            b.bool_or("upper", true)?,
            b.bool_or("transpose", false)?,
            b.bool_or("unitriangular", false)?,
        ))
    });
    t.insert("torch.linalg.cholesky", |args, kwargs| {
        let b = bind(args, kwargs, &["A"], &["upper", "out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::linalg_cholesky(
            b.tensor("A")?,
            b.bool_or("upper", false)?,
        ))
    });
    t.insert("torch.linalg.cholesky_ex", |args, kwargs| {
        let b = bind(args, kwargs, &["A"], &["upper", "check_errors", "out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::linalg_cholesky_ex(
            b.tensor("A")?,
            b.bool_or("upper", false)?,
            b.bool_or("check_errors", false)?,
        ))
    });
    t.insert("torch.cholesky", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "upper"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::cholesky(
            b.tensor("input")?,
            b.bool_or("upper", false)?,
        ))
    });
    t.insert("torch.cholesky_solve", |args, kwargs| {
        let b = bind(args, kwargs, &["B", "L", "upper"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::cholesky_solve(
            b.tensor("B")?,
            b.tensor("L")?,
            b.bool_or("upper", false)?,
        ))
    });
    t.insert("torch.cholesky_inverse", |args, kwargs| {
        let b = bind(args, kwargs, &["L", "upper"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::cholesky_inverse(
            b.tensor("L")?,
            b.bool_or("upper", false)?,
        ))
    });
    t.insert("torch.linalg.eigh", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "UPLO"], &["out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::linalg_eigh(b.tensor("A")?, b.str_or("UPLO", "L")?))
    });
    t.insert("torch.linalg.eigvalsh", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "UPLO"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::linalg_eigvalsh(b.tensor("A")?, b.str_or("UPLO", "L")?))
    });
    // Removed in PyTorch 2: torch.symeig(input, eigenvectors=False, upper=True, *, out=None).
    t.insert("torch.symeig", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "eigenvectors", "upper"], &["out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::symeig(
            b.tensor("input")?,
            b.bool_or("eigenvectors", false)?,
            b.bool_or("upper", true)?,
        ))
    });
    t.insert("torch.linalg.svd", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "full_matrices"], &["driver", "out"])?;
        b.unsupported_unless_none("out")?;
        // `driver=` is for CUDA (cuSOLVER) only.
        b.unsupported_unless_none("driver")?;
        triple(ops::linalg_svd(
            b.tensor("A")?,
            b.bool_or("full_matrices", true)?,
        ))
    });
    t.insert("torch.linalg.svdvals", |args, kwargs| {
        let b = bind(args, kwargs, &["A"], &["driver", "out"])?;
        b.unsupported_unless_none("out")?;
        b.unsupported_unless_none("driver")?;
        one(ops::linalg_svdvals(b.tensor("A")?))
    });
    t.insert("torch.svd", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "some", "compute_uv"], &["out"])?;
        b.unsupported_unless_none("out")?;
        triple(ops::svd(
            b.tensor("input")?,
            b.bool_or("some", true)?,
            b.bool_or("compute_uv", true)?,
        ))
    });
    t.insert("torch.pinverse", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "rcond"], &[])?;
        one(ops::pinverse(b.tensor("input")?, b.f64_or("rcond", 1e-15)?))
    });
    t.insert("torch.linalg.qr", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "mode"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let mode: QrMode = b.str_or("mode", "reduced")?.parse().map_err(err)?;
        pair(ops::linalg_qr(b.tensor("A")?, mode))
    });
    t.insert("torch.qr", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "some"], &["out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::qr(b.tensor("input")?, b.bool_or("some", true)?))
    });
    t.insert("torch.lu", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "pivot", "get_infos", "out"], &[])?;
        b.unsupported_unless_none("out")?;
        many(ops::lu(
            b.tensor("A")?,
            b.bool_or("pivot", true)?,
            b.bool_or("get_infos", false)?,
        ))
    });
    t.insert("torch.lu_solve", |args, kwargs| {
        let b = bind(args, kwargs, &["b", "LU_data", "LU_pivots"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::lu_solve(
            b.tensor("b")?,
            b.tensor("LU_data")?,
            b.tensor("LU_pivots")?,
        ))
    });
    t.insert("torch.linalg.lstsq", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "B", "rcond"], &["driver"])?;
        let driver = match b.get("driver") {
            Some(d) => Some(d.str().map_err(|e| format!("`driver`: {e}"))?),
            None => None,
        };
        many(ops::linalg_lstsq(
            b.tensor("A")?,
            b.tensor("B")?,
            opt_f64(&b, "rcond")?,
            driver,
        ))
    });
    t.insert("torch.linalg.matrix_norm", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["A", "ord", "dim", "keepdim"],
            &["dtype", "out"],
        )?;
        b.unsupported_unless_none("out")?;
        let ord = match b.get("ord") {
            None => MatrixNormOrd::Fro,
            Some(a) => norm_ord(a)?,
        };
        let dims = match b.get("dim") {
            None => [-2, -1],
            Some(a) => {
                let v = a.ints().map_err(|e| format!("`dim`: {e}"))?;
                <[i64; 2]>::try_from(v.as_slice())
                    .map_err(|_| "`dim` must be a 2-tuple of ints".to_string())?
            }
        };
        one(ops::linalg_matrix_norm(
            b.tensor("A")?,
            ord,
            dims,
            b.bool_or("keepdim", false)?,
            b.dtype("dtype")?,
        ))
    });
    t.insert("torch.linalg.cond", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "p"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let p = b.get("p").map(norm_ord).transpose()?;
        one(ops::linalg_cond(b.tensor("A")?, p))
    });
    // matrix_rank(A, *, atol=None, rtol=None, hermitian=False, out=None) and the older
    // overload matrix_rank(A, tol=None, hermitian=False, *, out=None).
    t.insert("torch.linalg.matrix_rank", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["A", "tol", "hermitian"],
            &["atol", "rtol", "out"],
        )?;
        b.unsupported_unless_none("out")?;
        let tol = opt_f64(&b, "tol")?;
        let (atol, rtol) = (opt_f64(&b, "atol")?, opt_f64(&b, "rtol")?);
        let (atol, rtol) = match tol {
            Some(t) if atol.is_some() || rtol.is_some() => {
                return Err(format!(
                    "`tol={t}` cannot be given together with `atol` or `rtol`"
                ))
            }
            Some(t) => (Some(t), Some(0.0)),
            None => (atol, rtol),
        };
        one(ops::linalg_matrix_rank(
            b.tensor("A")?,
            atol,
            rtol,
            b.bool_or("hermitian", false)?,
        ))
    });
    t.insert("torch.linalg.tensorinv", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "ind"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let ind = b.int_or("ind", 2)?;
        let ind = usize::try_from(ind)
            .map_err(|_| "Expected a strictly positive integer for 'ind'".to_string())?;
        one(ops::linalg_tensorinv(b.tensor("A")?, ind))
    });
    t.insert("torch.linalg.tensorsolve", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "B", "dims"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let dims = b.get("dims").map(|a| a.ints()).transpose()?;
        one(ops::linalg_tensorsolve(
            b.tensor("A")?,
            b.tensor("B")?,
            dims.as_deref(),
        ))
    });
    t.insert("torch.lstsq", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "A"], &["out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::lstsq(b.tensor("input")?, b.tensor("A")?))
    });
    t.insert("torch.geqrf", |args, kwargs| {
        let b = bind(args, kwargs, &["input"], &["out"])?;
        b.unsupported_unless_none("out")?;
        pair(ops::geqrf(b.tensor("input")?))
    });
    t.insert("torch.linalg.householder_product", |args, kwargs| {
        let b = bind(args, kwargs, &["A", "tau"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::linalg_householder_product(
            b.tensor("A")?,
            b.tensor("tau")?,
        ))
    });
    t.insert("torch.orgqr", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "tau"], &[])?;
        one(ops::orgqr(b.tensor("input")?, b.tensor("tau")?))
    });
    t.insert("torch.ormqr", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "tau", "other", "left", "transpose"],
            &["out"],
        )?;
        b.unsupported_unless_none("out")?;
        one(ops::ormqr(
            b.tensor("input")?,
            b.tensor("tau")?,
            b.tensor("other")?,
            b.bool_or("left", true)?,
            b.bool_or("transpose", false)?,
        ))
    });
    t.insert("torch.quantile", quantile_entry(false));
    t.insert("torch.nanquantile", quantile_entry(true));
    // fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max),
    // with `scale` / `zero_point` Python numbers or 0-D tensors.
    t.insert("torch.fake_quantize_per_tensor_affine", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "scale", "zero_point", "quant_min", "quant_max"],
            &[],
        )?;
        let scale = match b.req("scale")? {
            Arg::Tensor(t) => t.data().item_f64().map_err(|e| e.to_string())?,
            a => a.float().map_err(|e| format!("`scale`: {e}"))?,
        };
        let zp = match b.req("zero_point")? {
            Arg::Tensor(t) => t.data().item_f64().map_err(|e| e.to_string())? as i64,
            a => a.int().map_err(|e| format!("`zero_point`: {e}"))?,
        };
        one(ops::fake_quantize_per_tensor_affine(
            b.tensor("input")?,
            scale,
            zp,
            b.int("quant_min")?,
            b.int("quant_max")?,
        ))
    });
}
