//! Every differentiable op of `amp_autograd::ops`, one table row each: its gradient
//! checked by the workspace's gradient checker in float64 (first order, at every input
//! element), and its forward run again in bfloat16 and float16 against the float32 result
//! on the same (rounded) inputs, within the dtype's tolerance.
//!
//! Adding an op is one row of [`table`]. An input is drawn by its [`In`] kind (normal,
//! positive, inside (-1, 1)); arguments that are not differentiated (indices, targets,
//! masks) are built inside the row's function, floats in the dtype of its first input.
//! Constrained inputs are made inside the function too: a symmetric matrix as `(x +
//! xᵀ)/2`, a positive-definite one as `x xᵀ + n I`, so the checker's perturbations stay
//! valid (`embedding_padded`'s padding row gets no gradient by definition, so its row
//! looks up other rows; `pool::embedding_padding_idx_gets_no_gradient` checks the
//! padding). Not in the table, having no gradient (as in PyTorch): the comparisons
//! (`eq`, `ne`, `lt`, `le`, `gt`, `ge` and their `_scalar` forms), `argmax`,
//! `zeros_like`, `ones_like`, `linalg_matrix_rank`, `geqrf`, `lstsq` ("the derivative for
//! 'lstsq' is not implemented"), `fake_quantize_per_tensor_affine` (a straight-through
//! gradient of 1 by definition, not the derivative: `linalg::fake_quantize_*` checks
//! it); `sum_to` (the broadcasting binary rows reduce through it); and `split_outputs`
//! (graph plumbing, not an op).

use amp_autograd::ops::{
    self, Attention, CdistMode, GridMode, GridPadding, KlDivReduction, MatrixNormOrd,
    MultiHeadWeights, QrMode, QuantileQ, Recurrent, RnnNonlinearity, TensordotDims,
};
use amp_autograd::{grad, GradOptions, Reduction, Result, Tensor};
use amp_tensor::{DType, Generator};
use amp_testing::gradcheck::check_grad;
use amp_testing::tensors::{assert_close_within, leaf, randn_vec, tolerance, uniform};

type F = fn(&[Tensor]) -> Result<Tensor>;

/// How an input is drawn (float64, from a seed of the row's name and the input's place).
#[derive(Clone, Copy, Debug)]
enum In {
    /// Standard normal.
    N(&'static [usize]),
    /// Uniform in `[0.5, 2)`: positive and away from 0 (logs, roots, divisors).
    P(&'static [usize]),
    /// Uniform in `[-0.8, 0.8)`: inside `(-1, 1)` (asin, acos, erfinv).
    U(&'static [usize]),
}

/// The 16-bit forward check of a row.
#[derive(Clone, Copy, Debug)]
enum Half {
    /// bf16/f16 against float32 within `factor · tolerance(dtype)`.
    Within(f64),
    /// The op refuses 16-bit inputs, as PyTorch's CPU kernel does (checked: an error).
    Refused(&'static str),
}

struct Op {
    name: &'static str,
    inputs: &'static [In],
    f: F,
    /// The gradient checker's tolerance.
    tol: f64,
    half: Half,
}

fn op(name: &'static str, inputs: &'static [In], f: F) -> Op {
    Op {
        name,
        inputs,
        f,
        tol: 1e-6,
        half: Half::Within(1.0),
    }
}

impl Op {
    fn tol(self, tol: f64) -> Op {
        Op { tol, ..self }
    }
    fn half(self, factor: f64) -> Op {
        Op {
            half: Half::Within(factor),
            ..self
        }
    }
    fn refuses_half(self, why: &'static str) -> Op {
        Op {
            half: Half::Refused(why),
            ..self
        }
    }
}

use In::{N, P, U};

/// A float constant in the dtype of `like`.
fn c(v: &[f64], dims: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::from_vec(v.to_vec(), dims.to_vec())?.to_dtype(like.dtype())
}

/// An index tensor.
fn idx(v: &[i64], dims: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims.to_vec()).unwrap()
}

/// `(x + xᵀ) / 2` of the last two dims.
fn sym(x: &Tensor) -> Result<Tensor> {
    ops::mul_scalar(&ops::add(x, &ops::transpose(x, -1, -2)?)?, 0.5)
}

/// `x xᵀ + n I` of an `n × n` matrix: symmetric positive definite.
fn spd(x: &Tensor) -> Result<Tensor> {
    let n = x.dims()[0];
    let eye: Vec<f64> = (0..n * n)
        .map(|i| if i % (n + 1) == 0 { n as f64 } else { 0.0 })
        .collect();
    ops::add(&ops::matmul(x, &ops::t(x)?)?, &c(&eye, &[n, n], x)?)
}

/// `x` plus `n + 1` on the diagonal: well conditioned.
fn wc(x: &Tensor) -> Result<Tensor> {
    let n = x.dims()[x.rank() - 1];
    let eye: Vec<f64> = (0..n * n)
        .map(|i| {
            if i % (n + 1) == 0 {
                n as f64 + 1.0
            } else {
                0.0
            }
        })
        .collect();
    ops::add(x, &c(&eye, &[n, n], x)?)
}

/// The lower triangle of a well-conditioned `n × n` matrix.
fn lower(x: &Tensor) -> Result<Tensor> {
    let n = x.dims()[0];
    let mask: Vec<f64> = (0..n * n)
        .map(|i| if i % n <= i / n { 1.0 } else { 0.0 })
        .collect();
    ops::mul(&wc(x)?, &c(&mask, &[n, n], x)?)
}

/// The sum of several outputs (each reduced to a scalar), one loss over a tuple.
fn total(parts: &[Tensor]) -> Result<Tensor> {
    let mut acc = ops::sum_all(&parts[0])?;
    for p in &parts[1..] {
        acc = ops::add(&acc, &ops::sum_all(p)?)?;
    }
    Ok(acc)
}

/// A value and its square: a loss on factors defined up to sign.
fn squared(x: &Tensor) -> Result<Tensor> {
    ops::mul(x, x)
}

fn cell_params(v: &[Tensor]) -> (&Tensor, &Tensor, &Tensor, &Tensor) {
    (&v[0], &v[1], &v[2], &v[3])
}

/// Every differentiable op, with small shapes.
fn table() -> Vec<Op> {
    const A: &[In] = &[N(&[2, 3])];
    const AB: &[In] = &[N(&[2, 3]), N(&[3])];
    const POS: &[In] = &[P(&[2, 3])];
    const UNIT: &[In] = &[U(&[2, 3])];
    const SQ: &[In] = &[N(&[3, 3])];
    // input, w_ih, w_hh, b_ih, b_hh, initial state
    const SEQ: In = N(&[3, 1, 2]);
    const H0: In = N(&[1, 1, 2]);
    const LSTM: &[In] = &[SEQ, N(&[8, 2]), N(&[8, 2]), N(&[8]), N(&[8]), H0];
    const GRU: &[In] = &[SEQ, N(&[6, 2]), N(&[6, 2]), N(&[6]), N(&[6]), H0];
    vec![
        // ----- unary pointwise
        op("neg", A, |v| ops::neg(&v[0])),
        op("abs", A, |v| ops::abs(&v[0])),
        op("exp", A, |v| ops::exp(&v[0])),
        op("expm1", A, |v| ops::expm1(&v[0])),
        op("log", POS, |v| ops::log(&v[0])),
        op("log1p", POS, |v| ops::log1p(&v[0])),
        op("log2", POS, |v| ops::log2(&v[0])),
        op("log10", POS, |v| ops::log10(&v[0])),
        op("sqrt", POS, |v| ops::sqrt(&v[0])),
        op("rsqrt", POS, |v| ops::rsqrt(&v[0])),
        op("reciprocal", POS, |v| ops::reciprocal(&v[0])),
        op("sin", A, |v| ops::sin(&v[0])),
        op("cos", A, |v| ops::cos(&v[0])),
        op("tan", UNIT, |v| ops::tan(&v[0])),
        op("asin", UNIT, |v| ops::asin(&v[0])),
        op("acos", UNIT, |v| ops::acos(&v[0])),
        op("atan", A, |v| ops::atan(&v[0])),
        op("sinh", A, |v| ops::sinh(&v[0])),
        op("cosh", A, |v| ops::cosh(&v[0])),
        op("tanh", A, |v| ops::tanh(&v[0])),
        op("sigmoid", A, |v| ops::sigmoid(&v[0])),
        op("relu", A, |v| ops::relu(&v[0])),
        op("gelu", A, |v| ops::gelu(&v[0])),
        op("erf", A, |v| ops::erf(&v[0])),
        op("erfinv", UNIT, |v| ops::erfinv(&v[0])).half(2.0),
        op("square", A, |v| ops::square(&v[0])),
        op("sign", A, |v| ops::sign(&v[0])),
        op("floor", A, |v| ops::floor(&v[0])),
        op("ceil", A, |v| ops::ceil(&v[0])),
        op("round", A, |v| ops::round(&v[0])),
        op("softplus", A, |v| ops::softplus(&v[0], 1.5, 20.0)),
        op("clamp", A, |v| ops::clamp(&v[0], Some(-0.5), Some(0.5))),
        op("to_dtype", A, |v| ops::to_dtype(&v[0], DType::F64)),
        // ----- binary (broadcasting) and scalar
        op("add", AB, |v| ops::add(&v[0], &v[1])),
        op("sub", AB, |v| ops::sub(&v[0], &v[1])),
        op("mul", AB, |v| ops::mul(&v[0], &v[1])),
        op("div", &[N(&[2, 3]), P(&[3])], |v| ops::div(&v[0], &v[1])),
        op("pow", &[P(&[2, 3]), N(&[3])], |v| ops::pow(&v[0], &v[1])),
        op("atan2", AB, |v| ops::atan2(&v[0], &v[1])),
        op("maximum", AB, |v| ops::maximum(&v[0], &v[1])),
        op("minimum", AB, |v| ops::minimum(&v[0], &v[1])),
        op("add_scaled", AB, |v| ops::add_scaled(&v[0], &v[1], 0.5)),
        op("sub_scaled", AB, |v| ops::sub_scaled(&v[0], &v[1], 0.5)),
        op("add_scalar", A, |v| ops::add_scalar(&v[0], 1.5)),
        op("sub_scalar", A, |v| ops::sub_scalar(&v[0], 1.5)),
        op("rsub_scalar", A, |v| ops::rsub_scalar(&v[0], 1.5)),
        op("mul_scalar", A, |v| ops::mul_scalar(&v[0], 1.5)),
        op("div_scalar", A, |v| ops::div_scalar(&v[0], 1.5)),
        op("rdiv_scalar", POS, |v| ops::rdiv_scalar(&v[0], 1.5)),
        op("rtruediv_scalar", POS, |v| ops::rtruediv_scalar(&v[0], 1.5)),
        op("pow_scalar", POS, |v| ops::pow_scalar(&v[0], 2.5)),
        op("dunder_pow", POS, |v| ops::dunder_pow(&v[0], 2.5)),
        op("rpow_scalar", A, |v| ops::rpow_scalar(&v[0], 1.5)),
        op("where_", &[N(&[2, 3]), N(&[2, 3])], |v| {
            let cond = Tensor::from_vec(vec![true, false, true, false, false, true], [2, 3])?;
            ops::where_(&cond, &v[0], &v[1])
        }),
        op("addcmul", &[N(&[2, 3]), N(&[2, 3]), N(&[3])], |v| {
            ops::addcmul(&v[0], &v[1], &v[2], 0.5)
        }),
        op("addcdiv", &[N(&[2, 3]), N(&[2, 3]), P(&[3])], |v| {
            ops::addcdiv(&v[0], &v[1], &v[2], 0.5)
        }),
        // ----- products
        op("mm", &[N(&[2, 3]), N(&[3, 2])], |v| ops::mm(&v[0], &v[1])),
        op("bmm", &[N(&[2, 2, 3]), N(&[2, 3, 2])], |v| {
            ops::bmm(&v[0], &v[1])
        }),
        op("mv", &[N(&[2, 3]), N(&[3])], |v| ops::mv(&v[0], &v[1])),
        op("dot", &[N(&[3]), N(&[3])], |v| ops::dot(&v[0], &v[1])),
        op("outer", &[N(&[2]), N(&[3])], |v| ops::outer(&v[0], &v[1])),
        op("addmm", &[N(&[2, 2]), N(&[2, 3]), N(&[3, 2])], |v| {
            ops::addmm(&v[0], &v[1], &v[2], 0.5, 1.5)
        }),
        op("addbmm", &[N(&[2, 2]), N(&[2, 2, 3]), N(&[2, 3, 2])], |v| {
            ops::addbmm(&v[0], &v[1], &v[2], 0.5, 1.5)
        }),
        op(
            "baddbmm",
            &[N(&[2, 2, 2]), N(&[2, 2, 3]), N(&[2, 3, 2])],
            |v| ops::baddbmm(&v[0], &v[1], &v[2], 0.5, 1.5),
        ),
        op("addmv", &[N(&[2]), N(&[2, 3]), N(&[3])], |v| {
            ops::addmv(&v[0], &v[1], &v[2], 0.5, 1.5)
        }),
        op("addr", &[N(&[2, 3]), N(&[2]), N(&[3])], |v| {
            ops::addr(&v[0], &v[1], &v[2], 0.5, 1.5)
        }),
        op("matmul", &[N(&[2, 2, 3]), N(&[3, 2])], |v| {
            ops::matmul(&v[0], &v[1])
        }),
        op("dunder_matmul", &[N(&[2, 3]), N(&[3])], |v| {
            ops::dunder_matmul(&v[0], &v[1])
        }),
        op("linear", &[N(&[2, 3]), N(&[4, 3]), N(&[4])], |v| {
            ops::linear(&v[0], &v[1], Some(&v[2]))
        }),
        op("chain_matmul", &[N(&[2, 3]), N(&[3, 2]), N(&[2, 2])], |v| {
            ops::chain_matmul(v)
        }),
        op("multi_dot", &[N(&[2, 3]), N(&[3, 2]), N(&[2])], |v| {
            ops::multi_dot(v)
        }),
        op("tensordot", &[N(&[2, 3]), N(&[3, 2])], |v| {
            ops::tensordot(&v[0], &v[1], &TensordotDims::Count(1))
        }),
        op(
            "bilinear",
            &[N(&[2, 3]), N(&[2, 2]), N(&[2, 3, 2]), N(&[2])],
            |v| ops::bilinear(&v[0], &v[1], &v[2], Some(&v[3])),
        ),
        // ----- reductions and scans
        op("sum", A, |v| ops::sum(&v[0], &[1], true, None)),
        op("sum_all", A, |v| ops::sum_all(&v[0])),
        op("mean", A, |v| ops::mean(&v[0], &[0], false, None)),
        op("mean_all", A, |v| ops::mean_all(&v[0])),
        op("prod", A, |v| ops::prod(&v[0], Some(1), false, None)),
        op("amax", A, |v| ops::amax(&v[0], &[1], false)),
        op("amin", A, |v| ops::amin(&v[0], &[0], true)),
        op("max_dim", A, |v| Ok(ops::max_dim(&v[0], 1, false)?.0)),
        op("min_dim", A, |v| Ok(ops::min_dim(&v[0], 0, false)?.0)),
        op("norm", A, |v| ops::norm(&v[0], 3.0, &[1], false)),
        op("logsumexp", A, |v| ops::logsumexp(&v[0], &[1], false)),
        op("var", A, |v| ops::var(&v[0], &[1], 1.0, false)),
        op("std", A, |v| ops::std(&v[0], &[1], 1.0, false)),
        op("cumsum", A, |v| ops::cumsum(&v[0], 1, None)),
        op("cumprod", A, |v| ops::cumprod(&v[0], 1, None)),
        op("quantile", A, |v| {
            ops::quantile(&v[0], QuantileQ::Scalar(0.3), Some(1), false, "linear")
        })
        .refuses_half(QUANTILE),
        op("nanquantile", A, |v| {
            ops::nanquantile(&v[0], QuantileQ::Scalar(0.6), Some(1), false, "midpoint")
        })
        .refuses_half(QUANTILE),
        // ----- shapes, views, indexing
        op("reshape", A, |v| ops::reshape(&v[0], [3, 2])),
        op("view", A, |v| ops::view(&v[0], [6])),
        op("transpose", A, |v| ops::transpose(&v[0], 0, 1)),
        op("t", A, |v| ops::t(&v[0])),
        op("permute", &[N(&[2, 3, 2])], |v| {
            ops::permute(&v[0], &[2, 0, 1])
        }),
        op("expand", &[N(&[1, 3])], |v| ops::expand(&v[0], &[2, 3])),
        op("narrow", A, |v| ops::narrow(&v[0], 1, 1, 2)),
        op("narrow_scatter", A, |v| {
            ops::narrow_scatter(&v[0], &[2, 5], 1, 1)
        }),
        op("select", A, |v| ops::select(&v[0], 1, -1)),
        op("unsqueeze", A, |v| ops::unsqueeze(&v[0], 1)),
        op("squeeze", &[N(&[2, 1, 3])], |v| ops::squeeze(&v[0], 1)),
        op("flatten", &[N(&[2, 3, 2])], |v| ops::flatten(&v[0], 1, 2)),
        op("contiguous", A, |v| ops::contiguous(&ops::t(&v[0])?)),
        op("cat", &[N(&[2, 3]), N(&[1, 3])], |v| ops::cat(v, 0)),
        // The last piece is shorter and unused: its gradient is the backward's zeros.
        op("split", &[N(&[2, 5])], |v| {
            let p = ops::split(&v[0], 2, 1)?;
            ops::add(&ops::mul_scalar(&p[0], 2.0)?, &ops::exp(&p[1])?)
        }),
        op("stack", &[N(&[2, 3]), N(&[2, 3])], |v| ops::stack(v, 1)),
        op("gather", A, |v| {
            ops::gather(&v[0], 1, &idx(&[2, 0, 1, 1], &[2, 2]))
        }),
        op("scatter_add", &[N(&[2, 3]), N(&[2, 2])], |v| {
            ops::scatter_add(&v[0], 1, &idx(&[2, 0, 1, 1], &[2, 2]), &v[1])
        }),
        op("index_select", A, |v| {
            ops::index_select(&v[0], 1, &idx(&[2, 0, 2], &[3]))
        }),
        op("index_add", &[N(&[2, 3]), N(&[2, 2])], |v| {
            ops::index_add(&v[0], 1, &idx(&[2, 0], &[2]), &v[1], 0.5)
        }),
        op("index_copy", &[N(&[2, 3]), N(&[2, 2])], |v| {
            ops::index_copy(&v[0], 1, &idx(&[2, 0], &[2]), &v[1])
        }),
        op("index_put", &[N(&[3, 2]), N(&[2, 2])], |v| {
            ops::index_put(&v[0], &[idx(&[2, 0], &[2])], &v[1], true)
        }),
        op("embedding", &[N(&[4, 3])], |v| {
            ops::embedding(&v[0], &idx(&[3, 0, 3], &[3]))
        }),
        op("embedding_padded", &[N(&[4, 3])], |v| {
            ops::embedding_padded(&v[0], &idx(&[3, 0, 3], &[3]), Some(1))
        }),
        op("cross", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::cross(&v[0], &v[1], 1)
        }),
        op("cross_default", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::cross_default(&v[0], &v[1], None)
        }),
        // ----- softmax family and normalisation
        op("softmax", A, |v| ops::softmax(&v[0], 1, None)),
        op("log_softmax", A, |v| ops::log_softmax(&v[0], 1, None)),
        op("softmin", A, |v| ops::softmin(&v[0], 0, None)),
        op("layer_norm", &[N(&[2, 4]), N(&[4]), N(&[4])], |v| {
            ops::layer_norm(&v[0], &[4], Some(&v[1]), Some(&v[2]), 1e-5)
        })
        .tol(1e-5),
        op("group_norm", &[N(&[2, 4, 2]), N(&[4]), N(&[4])], |v| {
            ops::group_norm(&v[0], 2, Some(&v[1]), Some(&v[2]), 1e-5)
        })
        .tol(1e-5),
        op("batch_norm", &[N(&[3, 2, 2]), N(&[2]), N(&[2])], |v| {
            ops::batch_norm(&v[0], None, None, Some(&v[1]), Some(&v[2]), true, 0.1, 1e-5)
        })
        .tol(1e-5),
        op("dropout", A, |v| {
            ops::dropout(&v[0], 0.4, true, &mut Generator::new(3))
        }),
        op("prelu", &[N(&[2, 3]), P(&[1])], |v| {
            ops::prelu(&v[0], &v[1])
        }),
        op("normalize", A, |v| ops::normalize(&v[0], 2.0, 1, 1e-12)),
        op("renorm", A, |v| ops::renorm(&v[0], 2.0, 0, 1.0)),
        // ----- distances
        op("cosine_similarity", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::cosine_similarity(&v[0], &v[1], 1, 1e-8)
        }),
        op("pairwise_distance", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::pairwise_distance(&v[0], &v[1], 2.0, 1e-6, false)
        }),
        op("cdist", &[N(&[2, 3]), N(&[3, 3])], |v| {
            ops::cdist(&v[0], &v[1], 2.0, CdistMode::Direct)
        })
        .refuses_half("PyTorch's CPU cdist has no 16-bit kernel"),
        op("pdist", &[N(&[3, 3])], |v| ops::pdist(&v[0], 2.0))
            .refuses_half("PyTorch's CPU pdist has no 16-bit kernel"),
        op("dist", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::dist(&v[0], &v[1], 3.0)
        }),
        // ----- losses
        op("mse_loss", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::mse_loss(&v[0], &v[1], Reduction::Mean)
        }),
        op("l1_loss", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::l1_loss(&v[0], &v[1], Reduction::Sum)
        }),
        op("smooth_l1_loss", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::smooth_l1_loss(&v[0], &v[1], Reduction::None, 0.5)
        }),
        op("huber_loss", &[N(&[2, 3]), N(&[2, 3])], |v| {
            ops::huber_loss(&v[0], &v[1], Reduction::Mean, 0.5)
        }),
        op("nll_loss", &[N(&[3, 4]), P(&[4])], |v| {
            let t = idx(&[1, 3, 0], &[3]);
            ops::nll_loss(&v[0], &t, Some(&v[1]), -100, Reduction::Mean)
        }),
        op("cross_entropy", &[N(&[3, 4]), P(&[4])], |v| {
            let t = idx(&[1, 3, 0], &[3]);
            let weighted = ops::cross_entropy(&v[0], &t, Some(&v[1]), -100, Reduction::Mean, 0.0)?;
            let smoothed = ops::cross_entropy(&v[0], &t, None, 1, Reduction::Sum, 0.1)?;
            ops::add(&weighted, &smoothed)
        }),
        op("binary_cross_entropy", &[N(&[2, 3]), P(&[2, 3])], |v| {
            let t = c(&[0.0, 1.0, 0.3, 0.9, 1.0, 0.0], &[2, 3], &v[0])?;
            ops::binary_cross_entropy(&ops::sigmoid(&v[0])?, &t, Some(&v[1]), Reduction::Mean)
        }),
        op(
            "binary_cross_entropy_with_logits",
            &[N(&[2, 3]), P(&[3])],
            |v| {
                let t = c(&[0.0, 1.0, 0.3, 0.9, 1.0, 0.0], &[2, 3], &v[0])?;
                ops::binary_cross_entropy_with_logits(&v[0], &t, None, Some(&v[1]), Reduction::Sum)
            },
        ),
        op("kl_div", &[N(&[2, 3]), P(&[2, 3])], |v| {
            ops::kl_div(&v[0], &v[1], KlDivReduction::BatchMean, false)
        }),
        op("poisson_nll_loss", A, |v| {
            let t = c(&[0.0, 1.0, 3.0, 2.0, 1.0, 0.0], &[2, 3], &v[0])?;
            ops::poisson_nll_loss(&v[0], &t, true, true, 1e-8, Reduction::Mean)
        }),
        op("hinge_embedding_loss", A, |v| {
            let t = c(&[1.0, -1.0, 1.0, -1.0, -1.0, 1.0], &[2, 3], &v[0])?;
            ops::hinge_embedding_loss(&v[0], &t, 1.5, Reduction::Mean)
        }),
        op("margin_ranking_loss", &[N(&[4]), N(&[4])], |v| {
            let t = c(&[1.0, -1.0, 1.0, -1.0], &[4], &v[0])?;
            ops::margin_ranking_loss(&v[0], &v[1], &t, 0.1, Reduction::Mean)
        }),
        op("soft_margin_loss", A, |v| {
            let t = c(&[1.0, -1.0, 1.0, -1.0, -1.0, 1.0], &[2, 3], &v[0])?;
            ops::soft_margin_loss(&v[0], &t, Reduction::Mean)
        }),
        op("multilabel_margin_loss", &[N(&[2, 4])], |v| {
            let t = idx(&[3, 0, -1, 1, 1, 2, 0, -1], &[2, 4]);
            ops::multilabel_margin_loss(&v[0], &t, Reduction::Mean)
        })
        .refuses_half("PyTorch's CPU multilabel_margin_loss has no 16-bit kernel"),
        op("multilabel_margin_loss_forward", &[N(&[2, 4])], |v| {
            let t = idx(&[3, 0, -1, 1, 1, 2, 0, -1], &[2, 4]);
            Ok(ops::multilabel_margin_loss_forward(&v[0], &t, Reduction::Sum)?.0)
        }),
        op("multi_margin_loss", &[N(&[3, 4]), P(&[4])], |v| {
            let t = idx(&[1, 3, 0], &[3]);
            ops::multi_margin_loss(&v[0], &t, 2, 0.7, Some(&v[1]), Reduction::Mean)
        })
        .refuses_half("PyTorch's CPU multi_margin_loss has no 16-bit kernel"),
        op("cosine_embedding_loss", &[N(&[2, 3]), N(&[2, 3])], |v| {
            let t = c(&[1.0, -1.0], &[2], &v[0])?;
            ops::cosine_embedding_loss(&v[0], &v[1], &t, -0.5, Reduction::Mean)
        }),
        op(
            "triplet_margin_loss",
            &[N(&[2, 3]), N(&[2, 3]), N(&[2, 3])],
            |v| {
                ops::triplet_margin_loss(&v[0], &v[1], &v[2], 2.0, 2.0, 1e-6, true, Reduction::Mean)
            },
        ),
        op("ctc_loss", &[N(&[4, 2, 3])], |v| {
            let lp = ops::log_softmax(&v[0], 2, None)?;
            let t = idx(&[1, 2, 1, 0], &[2, 2]);
            ops::ctc_loss(&lp, &t, &[4, 3], &[2, 1], 0, Reduction::Mean, false)
        })
        .tol(1e-5),
        // ----- convolutions
        op(
            "convolution",
            &[N(&[1, 2, 4]), N(&[2, 1, 2]), N(&[2])],
            |v| ops::convolution(&v[0], &v[1], Some(&v[2]), &[2], &[1], &[1], false, &[0], 2),
        ),
        op("conv1d", &[N(&[1, 2, 5]), N(&[3, 2, 2]), N(&[3])], |v| {
            ops::conv1d(&v[0], &v[1], Some(&v[2]), &[1], &[1], &[2], 1)
        }),
        op("conv2d", &[N(&[1, 2, 3, 3]), N(&[2, 2, 2, 2])], |v| {
            ops::conv2d(&v[0], &v[1], None, &[1], &[0], &[1], 1)
        }),
        op("conv3d", &[N(&[1, 1, 3, 2, 2]), N(&[2, 1, 2, 1, 2])], |v| {
            ops::conv3d(&v[0], &v[1], None, &[1], &[0], &[1], 1)
        }),
        op(
            "conv_transpose1d",
            &[N(&[1, 2, 3]), N(&[2, 2, 2]), N(&[2])],
            |v| ops::conv_transpose1d(&v[0], &v[1], Some(&v[2]), &[2], &[0], &[1], 1, &[1]),
        ),
        op(
            "conv_transpose2d",
            &[N(&[1, 2, 2, 2]), N(&[2, 1, 2, 2])],
            |v| ops::conv_transpose2d(&v[0], &v[1], None, &[1], &[0], &[0], 2, &[1]),
        ),
        op(
            "conv_transpose3d",
            &[N(&[1, 1, 2, 2, 1]), N(&[1, 2, 2, 1, 2])],
            |v| ops::conv_transpose3d(&v[0], &v[1], None, &[1], &[0], &[0], 1, &[1]),
        ),
        // ----- pooling, padding, sampling
        op("max_pool1d", &[N(&[1, 2, 5])], |v| {
            ops::max_pool1d(&v[0], &[2], &[2], &[1], &[1], true)
        }),
        op("max_pool2d", &[N(&[1, 1, 4, 4])], |v| {
            ops::max_pool2d(&v[0], &[2], &[], &[0], &[1], false)
        }),
        op("max_pool3d", &[N(&[1, 1, 2, 3, 3])], |v| {
            ops::max_pool3d(&v[0], &[2], &[1], &[0], &[1], false)
        }),
        op("max_pool1d_with_indices", &[N(&[1, 2, 5])], |v| {
            Ok(ops::max_pool1d_with_indices(&v[0], &[3], &[2], &[0], &[1], false)?.0)
        }),
        op("max_pool2d_with_indices", &[N(&[1, 1, 4, 3])], |v| {
            Ok(ops::max_pool2d_with_indices(&v[0], &[2], &[1], &[0], &[1], false)?.0)
        }),
        op("max_pool3d_with_indices", &[N(&[1, 1, 2, 2, 3])], |v| {
            Ok(ops::max_pool3d_with_indices(&v[0], &[2], &[1], &[0], &[1], true)?.0)
        }),
        op("max_pool_nd_with_indices", &[N(&[1, 1, 4, 4])], |v| {
            Ok(ops::max_pool_nd_with_indices(&v[0], 2, &[3], &[2], &[1], &[1], false)?.0)
        }),
        op("avg_pool_nd", &[N(&[1, 1, 4, 4])], |v| {
            ops::avg_pool_nd(&v[0], 2, &[3], &[2], &[1], false, true, None)
        }),
        op("avg_pool1d", &[N(&[1, 2, 5])], |v| {
            ops::avg_pool1d(&v[0], &[2], &[2], &[1], true, false)
        }),
        op("avg_pool2d", &[N(&[1, 1, 4, 4])], |v| {
            ops::avg_pool2d(&v[0], &[2], &[2], &[0], false, true, Some(3))
        }),
        op("avg_pool3d", &[N(&[1, 1, 2, 3, 3])], |v| {
            ops::avg_pool3d(&v[0], &[2], &[1], &[1], false, false, None)
        })
        .refuses_half("PyTorch's CPU avg_pool3d has no 16-bit kernel"),
        op("adaptive_avg_pool_nd", &[N(&[1, 2, 3, 4])], |v| {
            ops::adaptive_avg_pool_nd(&v[0], 2, &[Some(2), Some(3)])
        }),
        op("adaptive_max_pool_nd", &[N(&[1, 2, 3, 4])], |v| {
            Ok(ops::adaptive_max_pool_nd(&v[0], 2, &[Some(2), None])?.0)
        }),
        op("fractional_max_pool_nd", &[N(&[1, 1, 5, 5])], |v| {
            let s = c(&[0.3, 0.7], &[1, 1, 2], &v[0])?;
            let mut g = Generator::new(0);
            Ok(
                ops::fractional_max_pool_nd(&v[0], 2, &[2], Some(&[3, 3]), None, Some(&s), &mut g)?
                    .0,
            )
        }),
        op("max_unpool_nd", &[N(&[1, 1, 2, 2])], |v| {
            let i = idx(&[0, 3, 9, 14], &[1, 1, 2, 2]);
            ops::max_unpool_nd(&v[0], &i, 2, &[2], &[], &[0], Some(&[4, 4]))
        }),
        op("pad", &[N(&[1, 2, 3])], |v| {
            ops::pad(&v[0], &[2, 1], "reflect", None)
        }),
        op("grid_sample", &[N(&[1, 1, 3, 3]), U(&[1, 2, 2, 2])], |v| {
            ops::grid_sample(&v[0], &v[1], GridMode::Bilinear, GridPadding::Zeros, false)
        })
        .tol(1e-5),
        // ----- recurrent cells and layers, attention
        op(
            "rnn_cell",
            &[N(&[2, 3]), N(&[2, 2]), N(&[2, 3]), N(&[2, 2])],
            |v| {
                let (x, h, wi, wh) = cell_params(v);
                ops::rnn_cell(x, h, wi, wh, None, None, RnnNonlinearity::Tanh)
            },
        ),
        op(
            "rnn_tanh_cell",
            &[N(&[2, 3]), N(&[2, 2]), N(&[2, 3]), N(&[2, 2]), N(&[2])],
            |v| {
                let (x, h, wi, wh) = cell_params(v);
                ops::rnn_tanh_cell(x, h, wi, wh, Some(&v[4]), None)
            },
        ),
        op(
            "rnn_relu_cell",
            &[N(&[2, 3]), N(&[2, 2]), N(&[2, 3]), N(&[2, 2]), N(&[2])],
            |v| {
                let (x, h, wi, wh) = cell_params(v);
                ops::rnn_relu_cell(x, h, wi, wh, None, Some(&v[4]))
            },
        ),
        op(
            "gru_cell",
            &[N(&[2, 3]), N(&[2, 2]), N(&[6, 3]), N(&[6, 2]), N(&[6])],
            |v| {
                let (x, h, wi, wh) = cell_params(v);
                ops::gru_cell(x, h, wi, wh, Some(&v[4]), Some(&v[4]))
            },
        ),
        op(
            "lstm_cell",
            &[N(&[2, 3]), N(&[2, 2]), N(&[8, 3]), N(&[8, 2]), N(&[2, 2])],
            |v| {
                let (x, h, wi, wh) = cell_params(v);
                let (h1, c1) = ops::lstm_cell(x, (h, &v[4]), wi, wh, None, None)?;
                total(&[h1, c1])
            },
        ),
        op("lstm", LSTM, |v| {
            let (y, h, c) = ops::lstm(&v[0], (&v[5], &v[5]), &v[1..5], Recurrent::default())?;
            total(&[y, h, c])
        })
        .tol(1e-5),
        op("gru", GRU, |v| {
            let (y, h) = ops::gru(&v[0], &v[5], &v[1..5], Recurrent::default())?;
            total(&[y, h])
        })
        .tol(1e-5),
        op(
            "scaled_dot_product_attention",
            &[N(&[1, 2, 3]), N(&[1, 3, 3]), N(&[1, 3, 2])],
            |v| {
                let opts = Attention {
                    is_causal: false,
                    scale: Some(0.7),
                    ..Default::default()
                };
                ops::scaled_dot_product_attention(&v[0], &v[1], &v[2], opts)
            },
        ),
        op(
            "multi_head_attention_forward",
            &[N(&[2, 1, 4]), N(&[12, 4]), N(&[4, 4]), N(&[4])],
            |v| {
                let w = MultiHeadWeights {
                    in_proj_weight: &v[1],
                    in_proj_bias: None,
                    out_proj_weight: &v[2],
                    out_proj_bias: Some(&v[3]),
                };
                ops::multi_head_attention_forward(&v[0], &v[0], &v[0], 2, w, Attention::default())
            },
        )
        .tol(1e-5),
        // Self-attention over a batch-first input (a transposed view): the packed
        // projection taken batch-major.
        op(
            "multi_head_attention_forward_batch_major",
            &[N(&[2, 3, 4]), N(&[12, 4]), N(&[12]), N(&[4, 4])],
            |v| {
                let w = MultiHeadWeights {
                    in_proj_weight: &v[1],
                    in_proj_bias: Some(&v[2]),
                    out_proj_weight: &v[3],
                    out_proj_bias: None,
                };
                let x = ops::transpose(&v[0], 0, 1)?;
                let causal = Attention {
                    is_causal: true,
                    ..Default::default()
                };
                ops::multi_head_attention_forward(&x, &x, &x, 2, w, causal)
            },
        )
        .tol(1e-5),
        // Cross-attention: three projections of their own.
        op(
            "multi_head_attention_forward_cross",
            &[
                N(&[2, 2, 4]),
                N(&[3, 2, 4]),
                N(&[12, 4]),
                N(&[12]),
                N(&[4, 4]),
            ],
            |v| {
                let w = MultiHeadWeights {
                    in_proj_weight: &v[2],
                    in_proj_bias: Some(&v[3]),
                    out_proj_weight: &v[4],
                    out_proj_bias: None,
                };
                ops::multi_head_attention_forward(&v[0], &v[1], &v[1], 2, w, Attention::default())
            },
        )
        .tol(1e-5),
        // ----- linear algebra (PyTorch's CPU kernels refuse 16-bit inputs; trace and the
        // Frobenius norm are composites that take them)
        op("trace", SQ, |v| ops::trace(&v[0])),
        op("linalg_inv", SQ, |v| ops::linalg_inv(&wc(&v[0])?)).refuses_half(LINALG),
        op("inverse", SQ, |v| ops::inverse(&wc(&v[0])?)).refuses_half(LINALG),
        op("linalg_inv_ex", SQ, |v| {
            Ok(ops::linalg_inv_ex(&wc(&v[0])?, false)?.0)
        })
        .refuses_half(LINALG),
        op("linalg_solve", &[N(&[3, 3]), N(&[3, 2])], |v| {
            ops::linalg_solve(&wc(&v[0])?, &v[1], true)
        })
        .refuses_half(LINALG),
        op("solve", &[N(&[3, 2]), N(&[3, 3])], |v| {
            Ok(ops::solve(&v[0], &wc(&v[1])?)?.0)
        })
        .refuses_half(LINALG),
        op("linalg_solve_triangular", &[N(&[3, 3]), N(&[3, 2])], |v| {
            ops::linalg_solve_triangular(&lower(&v[0])?, &v[1], false, true, false)
        })
        .refuses_half(LINALG),
        op("triangular_solve", &[N(&[3, 2]), N(&[3, 3])], |v| {
            Ok(ops::triangular_solve(&v[0], &lower(&v[1])?, false, false, false)?.0)
        })
        .refuses_half(LINALG),
        op("linalg_cholesky", SQ, |v| {
            ops::linalg_cholesky(&spd(&v[0])?, false)
        })
        .refuses_half(LINALG),
        op("linalg_cholesky_ex", SQ, |v| {
            Ok(ops::linalg_cholesky_ex(&spd(&v[0])?, true, false)?.0)
        })
        .refuses_half(LINALG),
        op("cholesky", SQ, |v| ops::cholesky(&spd(&v[0])?, false)).refuses_half(LINALG),
        op("cholesky_solve", &[N(&[3, 2]), N(&[3, 3])], |v| {
            ops::cholesky_solve(&v[0], &lower(&v[1])?, false)
        })
        .refuses_half(LINALG),
        op("cholesky_inverse", SQ, |v| {
            ops::cholesky_inverse(&lower(&v[0])?, false)
        })
        .refuses_half(LINALG),
        op("linalg_eigh", SQ, |v| {
            let (w, q) = ops::linalg_eigh(&sym(&v[0])?, "L")?;
            total(&[w, squared(&q)?])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("linalg_eigvalsh", SQ, |v| {
            ops::linalg_eigvalsh(&sym(&v[0])?, "U")
        })
        .refuses_half(LINALG),
        op("symeig", SQ, |v| {
            let (w, q) = ops::symeig(&sym(&v[0])?, true, false)?;
            total(&[w, squared(&q)?])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("linalg_svd", &[N(&[3, 2])], |v| {
            let (u, s, vh) = ops::linalg_svd(&v[0], false)?;
            total(&[squared(&u)?, s, squared(&vh)?])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("linalg_svdvals", &[N(&[2, 3])], |v| {
            ops::linalg_svdvals(&v[0])
        })
        .refuses_half(LINALG),
        op("svd", &[N(&[2, 3])], |v| {
            let (u, s, vv) = ops::svd(&v[0], true, true)?;
            total(&[squared(&u)?, s, squared(&vv)?])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("pinverse", &[N(&[3, 2])], |v| ops::pinverse(&v[0], 1e-15))
            .tol(1e-5)
            .refuses_half(LINALG),
        op("linalg_qr", &[N(&[3, 2])], |v| {
            let (q, r) = ops::linalg_qr(&v[0], QrMode::Reduced)?;
            total(&[q, r])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("qr", SQ, |v| {
            let (q, r) = ops::qr(&v[0], true)?;
            total(&[q, r])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("linalg_householder_product", &[N(&[3, 2]), U(&[2])], |v| {
            ops::linalg_householder_product(&v[0], &v[1])
        })
        .refuses_half(LINALG),
        op("orgqr", &[N(&[3, 2]), U(&[2])], |v| {
            ops::orgqr(&v[0], &v[1])
        })
        .refuses_half(LINALG),
        op("ormqr", &[N(&[3, 2]), U(&[2]), N(&[3, 2])], |v| {
            ops::ormqr(&v[0], &v[1], &v[2], true, false)
        })
        .refuses_half(LINALG),
        op("lu", SQ, |v| {
            Ok(ops::lu(&wc(&v[0])?, true, false)?[0].clone())
        })
        .refuses_half(LINALG),
        op("lu_solve", &[N(&[3, 2]), N(&[3, 3])], |v| {
            let f = ops::lu(&wc(&v[1])?, true, false)?;
            ops::lu_solve(&v[0], &f[0], &f[1])
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("linalg_lstsq", &[N(&[3, 2]), N(&[3, 1])], |v| {
            Ok(ops::linalg_lstsq(&v[0], &v[1], None, None)?[0].clone())
        })
        .tol(1e-5)
        .refuses_half(LINALG),
        op("linalg_matrix_norm", &[N(&[2, 3])], |v| {
            ops::linalg_matrix_norm(&v[0], MatrixNormOrd::Fro, [0, 1], false, None)
        }),
        op("linalg_cond", SQ, |v| ops::linalg_cond(&wc(&v[0])?, None))
            .tol(1e-5)
            .refuses_half(LINALG),
        op("linalg_tensorinv", &[N(&[2, 2, 4])], |v| {
            ops::linalg_tensorinv(
                &ops::reshape(&wc(&ops::reshape(&v[0], [4, 4])?)?, [2, 2, 4])?,
                2,
            )
        })
        .refuses_half(LINALG),
        op("linalg_tensorsolve", &[N(&[2, 2, 4]), N(&[2, 2])], |v| {
            let a = ops::reshape(&wc(&ops::reshape(&v[0], [4, 4])?)?, [2, 2, 4])?;
            ops::linalg_tensorsolve(&a, &v[1], None)
        })
        .refuses_half(LINALG),
    ]
}

const LINALG: &str = "PyTorch's CPU linear algebra has no 16-bit kernels";
const QUANTILE: &str = "PyTorch's quantile takes float or double only";

/// The inputs of a row: float64 leaves drawn by their kinds, seeded by the row's name.
fn inputs(op: &Op) -> Vec<Tensor> {
    let base = op
        .name
        .bytes()
        .fold(17u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    op.inputs
        .iter()
        .enumerate()
        .map(|(j, kind)| {
            let seed = base.wrapping_add(j as u64);
            let (dims, v) = match *kind {
                N(d) => (d, randn_vec(d, seed)),
                P(d) => (
                    d,
                    uniform(d.iter().product(), seed, 0.75)
                        .iter()
                        .map(|x| x + 1.25)
                        .collect(),
                ),
                U(d) => (d, uniform(d.iter().product(), seed, 0.8)),
            };
            leaf(v, dims)
        })
        .collect()
}

/// Runs `check` for every row, then fails naming every row that failed (each failure's
/// own message is printed as it happens).
fn for_each_op(check: impl Fn(&Op)) {
    let failed: Vec<&str> = table()
        .iter()
        .filter(|op| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(op))).is_err())
        .map(|op| op.name)
        .collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}

#[test]
fn names_are_unique() {
    let t = table();
    let mut names: Vec<&str> = t.iter().map(|o| o.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), t.len());
}

#[test]
fn gradients_in_f64() {
    for_each_op(|op| check_grad(&inputs(op), &op.f, op.tol));
}

/// The gradient of `sum(f(inputs) · w)` for every input at once.
fn all_grads(xs: &[Tensor], f: F) -> Vec<Option<Tensor>> {
    let out = f(xs).unwrap();
    let w = Tensor::from_vec(randn_vec(out.dims(), 97), out.dims().to_vec()).unwrap();
    let wanted: Vec<Tensor> = xs.iter().filter(|x| x.requires_grad()).cloned().collect();
    let p = ops::sum_all(&ops::mul(&out, &w).unwrap()).unwrap();
    let opts = GradOptions {
        allow_unused: true,
        ..Default::default()
    };
    let mut got = grad(&[p], &wanted, &[None], opts).unwrap().into_iter();
    xs.iter()
        .map(|x| {
            if x.requires_grad() {
                got.next().unwrap()
            } else {
                None
            }
        })
        .collect()
}

/// With only input `k` requiring grad, its gradient is the one computed with every input
/// requiring grad: an op keeps what a formula reads only when that formula's input needs
/// a gradient (`Kept`), so this runs every formula with each other input's saved tensors
/// left out, and would fail (a panic naming the unkept read) where an op keeps too little.
#[test]
fn gradient_of_each_input_alone() {
    for_each_op(|op| {
        let xs = inputs(op);
        if xs.len() < 2 {
            return;
        }
        let full = all_grads(&xs, op.f);
        for k in 0..xs.len() {
            let alone: Vec<Tensor> = xs
                .iter()
                .enumerate()
                .map(|(j, x)| {
                    let d = x.detach();
                    d.requires_grad_(j == k).unwrap();
                    d
                })
                .collect();
            let got = all_grads(&alone, op.f);
            let (got, want) = (got[k].as_ref(), full[k].as_ref());
            match (got, want) {
                (Some(g), Some(w)) => assert_close_within(
                    &g.to_vec_f64(),
                    &w.to_vec_f64(),
                    1e-12,
                    &format!("{} input {k} alone", op.name),
                ),
                (g, w) => assert_eq!(
                    g.is_some(),
                    w.is_some(),
                    "{} input {k}: a gradient alone but none with the others (or the reverse)",
                    op.name
                ),
            }
        }
    });
}

amp_testing::each_dtype! {
    /// The forward in a 16-bit dtype against float32 on the same rounded inputs.
    fn forward_against_f32(d in [BF16, F16]) {
        for_each_op(|op| {
            let xs: Vec<Tensor> = inputs(op)
                .iter()
                .map(|t| t.detach().to_dtype(d).unwrap())
                .collect();
            match op.half {
                Half::Refused(why) => {
                    assert!((op.f)(&xs).is_err(), "{} {d}: {why}, yet it ran", op.name);
                }
                Half::Within(factor) => {
                    let x32: Vec<Tensor> =
                        xs.iter().map(|t| t.to_dtype(DType::F32).unwrap()).collect();
                    let got = (op.f)(&xs).unwrap();
                    let want = (op.f)(&x32).unwrap();
                    assert_close_within(
                        &got.to_vec_f64(),
                        &want.to_vec_f64(),
                        factor * tolerance(d),
                        &format!("{} {d}", op.name),
                    );
                }
            }
        });
    }
}
