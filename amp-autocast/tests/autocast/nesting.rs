//! The nesting rule: an op autocast applies a policy to runs its body with autocast
//! excluded, so a composite's output dtype is the one its own policy gives, whatever the
//! lists say about the ops it is built from (PyTorch's autocast wrappers exclude the
//! autocast key for their body).
//!
//! Every composite op (an op whose body calls other dispatched ops) is run under each
//! device type's lists: the CPU tables as they are, the CUDA tables evaluated on CPU
//! tensors by a profile whose CPU table is the CUDA one (the policy decision is data and
//! does not depend on the device; only the kernels do).

use amp_autocast::*;
use amp_autograd::ops::{
    self, CdistMode, GridMode, GridPadding, KlDivReduction, MatrixNormOrd, QrMode, RnnNonlinearity,
    TensordotDims,
};
use amp_autograd::{Reduction, Tensor};
use amp_policy::{CastPolicy, DeviceType, Profile};
use amp_tensor::{promote_types, DType, Generator};

const CPU: DeviceType = DeviceType::Cpu;
const CUDA: DeviceType = DeviceType::Cuda;

type Res = amp_autograd::Result<Vec<Tensor>>;

// ----- inputs -----------------------------------------------------------------------------

fn randn(g: &mut Generator, dt: DType, dims: &[usize]) -> Tensor {
    Tensor::randn(dims.to_vec(), DType::F32, g)
        .unwrap()
        .to_dtype(dt)
        .unwrap()
}

/// One [`randn`] tensor per shape.
fn randn_all(g: &mut Generator, dt: DType, shapes: &[&[usize]]) -> Vec<Tensor> {
    shapes.iter().map(|s| randn(g, dt, s)).collect()
}

/// Uniform in `[lo, lo + width)`.
fn uniform(g: &mut Generator, dt: DType, dims: &[usize], lo: f64, width: f64) -> Tensor {
    let u = Tensor::rand(dims.to_vec(), DType::F32, g).unwrap();
    ops::add_scalar(&ops::mul_scalar(&u, width).unwrap(), lo)
        .unwrap()
        .to_dtype(dt)
        .unwrap()
}

fn consts(dt: DType, vals: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(vals, dims.to_vec())
        .unwrap()
        .to_dtype(dt)
        .unwrap()
}

fn ints(vals: &[i64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(vals, dims.to_vec()).unwrap()
}

/// `±1` targets.
fn signs(dt: DType, n: usize) -> Tensor {
    let v: Vec<f32> = (0..n)
        .map(|i| if i % 3 == 1 { -1.0 } else { 1.0 })
        .collect();
    consts(dt, &v, &[n])
}

/// A symmetric positive definite `n × n` matrix, exact in 16 bits.
fn spd(dt: DType, n: usize) -> Tensor {
    let mut v = vec![0.0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            v[i * n + j] = if i == j {
                n as f32 + 1.0
            } else {
                0.5 / ((i + j) % 3 + 1) as f32
            };
        }
    }
    consts(dt, &v, &[n, n])
}

/// A lower-triangular `3 × 3` matrix with a positive diagonal.
fn lower3(dt: DType) -> Tensor {
    consts(dt, &[2.0, 0.0, 0.0, 0.5, 2.0, 0.0, 0.25, 0.5, 2.0], &[3, 3])
}

fn one(r: amp_autograd::Result<Tensor>) -> Res {
    r.map(|t| vec![t])
}

fn two(r: amp_autograd::Result<(Tensor, Tensor)>) -> Res {
    r.map(|(a, b)| vec![a, b])
}

// ----- the composite ops -------------------------------------------------------------------

/// One call of a composite op: `op` is its name on the lists (the name it enters the
/// dispatch point under); `inputs` makes its tensor arguments with floating ones in the
/// given dtype; `run` calls it.
struct Case {
    op: &'static str,
    /// Whether the op has a `dtype=` parameter (what `fp32_set_opt_dtype` sets).
    dtype_param: bool,
    inputs: fn(&mut Generator, DType) -> Vec<Tensor>,
    run: fn(&[Tensor]) -> Res,
}

const fn case(
    op: &'static str,
    inputs: fn(&mut Generator, DType) -> Vec<Tensor>,
    run: fn(&[Tensor]) -> Res,
) -> Case {
    Case {
        op,
        dtype_param: false,
        inputs,
        run,
    }
}

const fn with_dtype(
    op: &'static str,
    inputs: fn(&mut Generator, DType) -> Vec<Tensor>,
    run: fn(&[Tensor]) -> Res,
) -> Case {
    Case {
        op,
        dtype_param: true,
        inputs,
        run,
    }
}

fn cases() -> Vec<Case> {
    vec![
        // Attention (lower_precision_fp in torch-2.15's lists): matmul, softmax and the
        // mask inside keep the autocast dtype.
        case(
            "scaled_dot_product_attention",
            |g, d| randn_all(g, d, &[&[2, 3, 4], &[2, 5, 4], &[2, 5, 6]]),
            |t| {
                let causal = ops::Attention {
                    is_causal: true,
                    ..Default::default()
                };
                one(ops::scaled_dot_product_attention(
                    &t[0], &t[1], &t[2], causal,
                ))
            },
        ),
        // The matmul family.
        case(
            "addbmm",
            |g, d| randn_all(g, d, &[&[2, 3], &[4, 2, 5], &[4, 5, 3]]),
            |t| one(ops::addbmm(&t[0], &t[1], &t[2], 0.5, 2.0)),
        ),
        case(
            "baddbmm",
            |g, d| randn_all(g, d, &[&[4, 2, 3], &[4, 2, 5], &[4, 5, 3]]),
            |t| one(ops::baddbmm(&t[0], &t[1], &t[2], 0.5, 2.0)),
        ),
        case(
            "addmv",
            |g, d| vec![randn(g, d, &[2]), randn(g, d, &[2, 3]), randn(g, d, &[3])],
            |t| one(ops::addmv(&t[0], &t[1], &t[2], 0.5, 2.0)),
        ),
        case(
            "addr",
            |g, d| vec![randn(g, d, &[2, 3]), randn(g, d, &[2]), randn(g, d, &[3])],
            |t| one(ops::addr(&t[0], &t[1], &t[2], 0.5, 2.0)),
        ),
        case(
            "chain_matmul",
            |g, d| randn_all(g, d, &[&[2, 3], &[3, 4], &[4, 2]]),
            |t| one(ops::chain_matmul(t)),
        ),
        case(
            "multi_dot",
            |g, d| vec![randn(g, d, &[3]), randn(g, d, &[3, 4]), randn(g, d, &[4])],
            |t| one(ops::multi_dot(t)),
        ),
        case(
            "__matmul__",
            |g, d| vec![randn(g, d, &[2, 2, 3]), randn(g, d, &[3, 4])],
            |t| one(ops::dunder_matmul(&t[0], &t[1])),
        ),
        case(
            "matmul",
            |g, d| vec![randn(g, d, &[2, 1, 2, 3]), randn(g, d, &[3, 3, 4])],
            |t| one(ops::matmul(&t[0], &t[1])),
        ),
        case(
            "matmul",
            |g, d| vec![randn(g, d, &[3]), randn(g, d, &[3])],
            |t| one(ops::matmul(&t[0], &t[1])),
        ),
        case(
            "linear",
            |g, d| randn_all(g, d, &[&[2, 3, 4], &[5, 4], &[5]]),
            |t| one(ops::linear(&t[0], &t[1], Some(&t[2]))),
        ),
        case(
            "linear",
            |g, d| randn_all(g, d, &[&[2, 4], &[5, 4], &[5]]),
            |t| one(ops::linear(&t[0], &t[1], Some(&t[2]))),
        ),
        case(
            "tensordot",
            |g, d| vec![randn(g, d, &[2, 3, 4]), randn(g, d, &[4, 3, 5])],
            |t| {
                one(ops::tensordot(
                    &t[0],
                    &t[1],
                    &TensordotDims::Pairs(vec![1, 2], vec![1, 0]),
                ))
            },
        ),
        case(
            "bilinear",
            |g, d| randn_all(g, d, &[&[2, 3], &[2, 4], &[5, 3, 4], &[5]]),
            |t| one(ops::bilinear(&t[0], &t[1], &t[2], Some(&t[3]))),
        ),
        // Recurrent cells.
        case(
            "RNNCell",
            |g, d| randn_all(g, d, &[&[2, 4], &[2, 3], &[3, 4], &[3, 3], &[3], &[3]]),
            |t| {
                one(ops::rnn_cell(
                    &t[0],
                    &t[1],
                    &t[2],
                    &t[3],
                    Some(&t[4]),
                    Some(&t[5]),
                    RnnNonlinearity::Tanh,
                ))
            },
        ),
        case(
            "GRUCell",
            |g, d| randn_all(g, d, &[&[2, 4], &[2, 3], &[9, 4], &[9, 3]]),
            |t| one(ops::gru_cell(&t[0], &t[1], &t[2], &t[3], None, None)),
        ),
        case(
            "LSTMCell",
            |g, d| {
                randn_all(
                    g,
                    d,
                    &[&[2, 4], &[2, 3], &[2, 3], &[12, 4], &[12, 3], &[12], &[12]],
                )
            },
            |t| {
                two(ops::lstm_cell(
                    &t[0],
                    (&t[1], &t[2]),
                    &t[3],
                    &t[4],
                    Some(&t[5]),
                    Some(&t[6]),
                ))
            },
        ),
        // Convolutions.
        case(
            "conv2d",
            |g, d| randn_all(g, d, &[&[1, 2, 5, 5], &[3, 2, 3, 3], &[3]]),
            |t| one(ops::conv2d(&t[0], &t[1], Some(&t[2]), &[1], &[1], &[1], 1)),
        ),
        case(
            "conv_transpose2d",
            |g, d| randn_all(g, d, &[&[1, 2, 4, 4], &[2, 3, 3, 3], &[3]]),
            |t| {
                one(ops::conv_transpose2d(
                    &t[0],
                    &t[1],
                    Some(&t[2]),
                    &[2],
                    &[1],
                    &[1],
                    1,
                    &[1],
                ))
            },
        ),
        // Normalisation, activations, pointwise composites.
        case(
            "layer_norm",
            |g, d| randn_all(g, d, &[&[2, 3, 4], &[4], &[4]]),
            |t| one(ops::layer_norm(&t[0], &[4], Some(&t[1]), Some(&t[2]), 1e-5)),
        ),
        case(
            "group_norm",
            |g, d| randn_all(g, d, &[&[2, 4, 3], &[4], &[4]]),
            |t| one(ops::group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5)),
        ),
        case(
            "prelu",
            |g, d| vec![randn(g, d, &[2, 3, 4]), uniform(g, d, &[3], 0.1, 0.2)],
            |t| one(ops::prelu(&t[0], &t[1])),
        ),
        with_dtype(
            "softmax",
            |g, d| vec![randn(g, d, &[2, 5])],
            |t| one(ops::softmax(&t[0], 1, None)),
        ),
        with_dtype(
            "log_softmax",
            |g, d| vec![randn(g, d, &[2, 5])],
            |t| one(ops::log_softmax(&t[0], 1, None)),
        ),
        with_dtype(
            "softmin",
            |g, d| vec![randn(g, d, &[2, 5])],
            |t| one(ops::softmin(&t[0], 1, None)),
        ),
        case(
            "cross",
            |g, d| vec![randn(g, d, &[2, 3]), randn(g, d, &[2, 3])],
            |t| one(ops::cross(&t[0], &t[1], 1)),
        ),
        case(
            "index_put",
            |g, d| {
                vec![
                    randn(g, d, &[4, 3]),
                    ints(&[2, 0], &[2]),
                    randn(g, d, &[2, 3]),
                ]
            },
            |t| one(ops::index_put(&t[0], &t[1..2], &t[2], true)),
        ),
        case(
            "addcmul",
            |g, d| randn_all(g, d, &[&[2, 3], &[2, 3], &[3]]),
            |t| one(ops::addcmul(&t[0], &t[1], &t[2], 0.5)),
        ),
        case(
            "addcdiv",
            |g, d| {
                vec![
                    randn(g, d, &[2, 3]),
                    randn(g, d, &[2, 3]),
                    uniform(g, d, &[3], 0.5, 1.0),
                ]
            },
            |t| one(ops::addcdiv(&t[0], &t[1], &t[2], 0.5)),
        ),
        case(
            "__pow__",
            |g, d| vec![uniform(g, d, &[2, 3], 0.5, 1.0)],
            |t| one(ops::dunder_pow(&t[0], 2.5)),
        ),
        case(
            "__rtruediv__",
            |g, d| vec![uniform(g, d, &[2, 3], 0.5, 1.0)],
            |t| one(ops::rtruediv_scalar(&t[0], 2.0)),
        ),
        // Reductions with a `dtype=` (their body casts when it is set).
        with_dtype(
            "sum",
            |g, d| vec![randn(g, d, &[2, 3])],
            |t| one(ops::sum(&t[0], &[1], false, None)),
        ),
        with_dtype(
            "prod",
            |g, d| vec![uniform(g, d, &[2, 3], 0.5, 1.0)],
            |t| one(ops::prod(&t[0], Some(1), false, None)),
        ),
        with_dtype(
            "cumsum",
            |g, d| vec![randn(g, d, &[2, 3])],
            |t| one(ops::cumsum(&t[0], 1, None)),
        ),
        with_dtype(
            "cumprod",
            |g, d| vec![uniform(g, d, &[2, 3], 0.5, 1.0)],
            |t| one(ops::cumprod(&t[0], 1, None)),
        ),
        case(
            "stack",
            |g, d| vec![randn(g, d, &[2, 3]), randn(g, d, &[2, 3])],
            |t| one(ops::stack(t, 1)),
        ),
        case(
            "grid_sample",
            |g, d| {
                vec![
                    randn(g, d, &[1, 2, 3, 3]),
                    uniform(g, d, &[1, 2, 2, 2], -0.9, 1.8),
                ]
            },
            |t| {
                one(ops::grid_sample(
                    &t[0],
                    &t[1],
                    GridMode::Bilinear,
                    GridPadding::Zeros,
                    false,
                ))
            },
        ),
        // Distances.
        case(
            "cdist",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[30, 4])],
            |t| one(ops::cdist(&t[0], &t[1], 2.0, CdistMode::MmIfNecessary)),
        ),
        case(
            "cosine_similarity",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4])],
            |t| one(ops::cosine_similarity(&t[0], &t[1], 1, 1e-8)),
        ),
        case(
            "dist",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4])],
            |t| one(ops::dist(&t[0], &t[1], 2.0)),
        ),
        case(
            "normalize",
            |g, d| vec![randn(g, d, &[3, 4])],
            |t| one(ops::normalize(&t[0], 2.0, 1, 1e-12)),
        ),
        case(
            "pdist",
            |g, d| vec![randn(g, d, &[4, 3])],
            |t| one(ops::pdist(&t[0], 2.0)),
        ),
        case(
            "renorm",
            |g, d| vec![randn(g, d, &[3, 4])],
            |t| one(ops::renorm(&t[0], 2.0, 0, 1.0)),
        ),
        // Losses.
        case(
            "mse_loss",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4])],
            |t| one(ops::mse_loss(&t[0], &t[1], Reduction::Mean)),
        ),
        case(
            "l1_loss",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4])],
            |t| one(ops::l1_loss(&t[0], &t[1], Reduction::Sum)),
        ),
        case(
            "smooth_l1_loss",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4])],
            |t| one(ops::smooth_l1_loss(&t[0], &t[1], Reduction::Mean, 1.0)),
        ),
        case(
            "huber_loss",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4])],
            |t| one(ops::huber_loss(&t[0], &t[1], Reduction::Mean, 1.0)),
        ),
        case(
            "nll_loss",
            |g, d| vec![randn(g, d, &[3, 4]), ints(&[0, 3, 1], &[3])],
            |t| one(ops::nll_loss(&t[0], &t[1], None, -100, Reduction::Mean)),
        ),
        case(
            "cross_entropy",
            |g, d| vec![randn(g, d, &[3, 4]), ints(&[0, 3, 1], &[3])],
            |t| {
                one(ops::cross_entropy(
                    &t[0],
                    &t[1],
                    None,
                    -100,
                    Reduction::Mean,
                    0.1,
                ))
            },
        ),
        case(
            "binary_cross_entropy",
            |g, d| {
                vec![
                    uniform(g, d, &[3, 4], 0.1, 0.8),
                    uniform(g, d, &[3, 4], 0.0, 1.0),
                ]
            },
            |t| {
                one(ops::binary_cross_entropy(
                    &t[0],
                    &t[1],
                    None,
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "binary_cross_entropy_with_logits",
            |g, d| {
                vec![
                    randn(g, d, &[3, 4]),
                    uniform(g, d, &[3, 4], 0.0, 1.0),
                    uniform(g, d, &[4], 0.5, 1.0),
                ]
            },
            |t| {
                one(ops::binary_cross_entropy_with_logits(
                    &t[0],
                    &t[1],
                    None,
                    Some(&t[2]),
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "kl_div",
            |g, d| vec![randn(g, d, &[3, 4]), uniform(g, d, &[3, 4], 0.1, 0.8)],
            |t| one(ops::kl_div(&t[0], &t[1], KlDivReduction::BatchMean, false)),
        ),
        case(
            "poisson_nll_loss",
            |g, d| vec![randn(g, d, &[3, 4]), uniform(g, d, &[3, 4], 0.0, 3.0)],
            |t| {
                one(ops::poisson_nll_loss(
                    &t[0],
                    &t[1],
                    true,
                    true,
                    1e-8,
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "hinge_embedding_loss",
            |g, d| vec![randn(g, d, &[6]), signs(d, 6)],
            |t| {
                one(ops::hinge_embedding_loss(
                    &t[0],
                    &t[1],
                    1.0,
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "margin_ranking_loss",
            |g, d| vec![randn(g, d, &[6]), randn(g, d, &[6]), signs(d, 6)],
            |t| {
                one(ops::margin_ranking_loss(
                    &t[0],
                    &t[1],
                    &t[2],
                    0.1,
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "soft_margin_loss",
            |g, d| vec![randn(g, d, &[6]), signs(d, 6)],
            |t| one(ops::soft_margin_loss(&t[0], &t[1], Reduction::Mean)),
        ),
        case(
            "multilabel_margin_loss",
            |g, d| {
                vec![
                    randn(g, d, &[2, 4]),
                    ints(&[3, 0, -1, 1, 1, 2, 3, -1], &[2, 4]),
                ]
            },
            |t| one(ops::multilabel_margin_loss(&t[0], &t[1], Reduction::Mean)),
        ),
        case(
            "multi_margin_loss",
            |g, d| {
                vec![
                    randn(g, d, &[3, 4]),
                    ints(&[0, 3, 1], &[3]),
                    uniform(g, d, &[4], 0.5, 1.0),
                ]
            },
            |t| {
                one(ops::multi_margin_loss(
                    &t[0],
                    &t[1],
                    2,
                    1.0,
                    Some(&t[2]),
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "cosine_embedding_loss",
            |g, d| vec![randn(g, d, &[3, 4]), randn(g, d, &[3, 4]), signs(d, 3)],
            |t| {
                one(ops::cosine_embedding_loss(
                    &t[0],
                    &t[1],
                    &t[2],
                    0.1,
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "triplet_margin_loss",
            |g, d| randn_all(g, d, &[&[3, 4], &[3, 4], &[3, 4]]),
            |t| {
                one(ops::triplet_margin_loss(
                    &t[0],
                    &t[1],
                    &t[2],
                    1.0,
                    2.0,
                    1e-6,
                    true,
                    Reduction::Mean,
                ))
            },
        ),
        case(
            "ctc_loss",
            |g, d| {
                let x = randn(g, DType::F32, &[6, 1, 4]);
                vec![
                    ops::log_softmax(&x, 2, None).unwrap().to_dtype(d).unwrap(),
                    ints(&[1, 2], &[1, 2]),
                ]
            },
            |t| {
                one(ops::ctc_loss(
                    &t[0],
                    &t[1],
                    &[6],
                    &[2],
                    0,
                    Reduction::Mean,
                    false,
                ))
            },
        ),
        // Linear algebra (CPU's float32 list).
        case(
            "trace",
            |g, d| vec![randn(g, d, &[3, 3])],
            |t| one(ops::trace(&t[0])),
        ),
        case(
            "cholesky",
            |_, d| vec![spd(d, 3)],
            |t| one(ops::cholesky(&t[0], false)),
        ),
        case(
            "linalg_cholesky",
            |_, d| vec![spd(d, 3)],
            |t| one(ops::linalg_cholesky(&t[0], false)),
        ),
        case(
            "linalg_cholesky_ex",
            |_, d| vec![spd(d, 3)],
            |t| two(ops::linalg_cholesky_ex(&t[0], false, false)),
        ),
        case(
            "cholesky_inverse",
            |_, d| vec![lower3(d)],
            |t| one(ops::cholesky_inverse(&t[0], false)),
        ),
        case(
            "cholesky_solve",
            |g, d| vec![randn(g, d, &[3, 2]), lower3(d)],
            |t| one(ops::cholesky_solve(&t[0], &t[1], false)),
        ),
        case(
            "triangular_solve",
            |g, d| vec![randn(g, d, &[3, 2]), lower3(d)],
            |t| two(ops::triangular_solve(&t[0], &t[1], false, false, false)),
        ),
        case(
            "linalg_solve",
            |g, d| vec![spd(d, 3), randn(g, d, &[3, 2])],
            |t| one(ops::linalg_solve(&t[0], &t[1], true)),
        ),
        case(
            "solve",
            |g, d| vec![randn(g, d, &[3, 2]), spd(d, 3)],
            |t| two(ops::solve(&t[0], &t[1])),
        ),
        case(
            "lu_solve",
            |g, d| {
                let lu = ops::lu(&spd(DType::F32, 3), true, false).unwrap();
                vec![
                    randn(g, d, &[3, 2]),
                    lu[0].to_dtype(d).unwrap(),
                    lu[1].clone(),
                ]
            },
            |t| one(ops::lu_solve(&t[0], &t[1], &t[2])),
        ),
        case(
            "linalg_lstsq",
            |g, d| vec![randn(g, d, &[4, 3]), randn(g, d, &[4, 2])],
            |t| ops::linalg_lstsq(&t[0], &t[1], None, None),
        ),
        case(
            "lstsq",
            |g, d| vec![randn(g, d, &[4, 2]), randn(g, d, &[4, 3])],
            |t| two(ops::lstsq(&t[0], &t[1])),
        ),
        case(
            "linalg_householder_product",
            |g, d| vec![randn(g, d, &[4, 3]), uniform(g, d, &[3], 0.5, 1.0)],
            |t| one(ops::linalg_householder_product(&t[0], &t[1])),
        ),
        case(
            "orgqr",
            |g, d| vec![randn(g, d, &[4, 3]), uniform(g, d, &[3], 0.5, 1.0)],
            |t| one(ops::orgqr(&t[0], &t[1])),
        ),
        case(
            "ormqr",
            |g, d| {
                vec![
                    randn(g, d, &[4, 3]),
                    uniform(g, d, &[3], 0.5, 1.0),
                    randn(g, d, &[4, 2]),
                ]
            },
            |t| one(ops::ormqr(&t[0], &t[1], &t[2], true, false)),
        ),
        with_dtype(
            "linalg_matrix_norm",
            |g, d| vec![randn(g, d, &[3, 3])],
            |t| {
                one(ops::linalg_matrix_norm(
                    &t[0],
                    MatrixNormOrd::Nuc,
                    [-2, -1],
                    false,
                    None,
                ))
            },
        ),
        case(
            "linalg_cond",
            |_, d| vec![spd(d, 3)],
            |t| one(ops::linalg_cond(&t[0], None)),
        ),
        case(
            "linalg_eigh",
            |_, d| vec![spd(d, 3)],
            |t| two(ops::linalg_eigh(&t[0], "L")),
        ),
        case(
            "linalg_eigvalsh",
            |_, d| vec![spd(d, 3)],
            |t| one(ops::linalg_eigvalsh(&t[0], "L")),
        ),
        case(
            "symeig",
            |_, d| vec![spd(d, 3)],
            |t| two(ops::symeig(&t[0], true, false)),
        ),
        case(
            "linalg_svd",
            |g, d| vec![randn(g, d, &[3, 4])],
            |t| ops::linalg_svd(&t[0], false).map(|(u, s, v)| vec![u, s, v]),
        ),
        case(
            "linalg_svdvals",
            |g, d| vec![randn(g, d, &[3, 4])],
            |t| one(ops::linalg_svdvals(&t[0])),
        ),
        case(
            "svd",
            |g, d| vec![randn(g, d, &[3, 4])],
            |t| ops::svd(&t[0], true, true).map(|(u, s, v)| vec![u, s, v]),
        ),
        case(
            "linalg_qr",
            |g, d| vec![randn(g, d, &[4, 3])],
            |t| two(ops::linalg_qr(&t[0], QrMode::Reduced)),
        ),
        case(
            "qr",
            |g, d| vec![randn(g, d, &[4, 3])],
            |t| two(ops::qr(&t[0], true)),
        ),
        case(
            "pinverse",
            |g, d| vec![randn(g, d, &[3, 4])],
            |t| one(ops::pinverse(&t[0], 1e-15)),
        ),
        case(
            "linalg_tensorinv",
            |_, d| vec![ops::reshape(&spd(d, 4), [4, 2, 2]).unwrap()],
            |t| one(ops::linalg_tensorinv(&t[0], 1)),
        ),
        case(
            "linalg_tensorsolve",
            |g, d| {
                vec![
                    ops::reshape(&spd(d, 4), [4, 2, 2]).unwrap(),
                    randn(g, d, &[4]),
                ]
            },
            |t| one(ops::linalg_tensorsolve(&t[0], &t[1], None)),
        ),
    ]
}

// ----- the device types' lists -------------------------------------------------------------

/// `profile` with its CUDA table in the CPU slot, so that CPU tensors are decided by the
/// CUDA lists.
fn cuda_lists_on_cpu(profile: &Profile) -> Profile {
    let mut p = profile.clone();
    for e in profile.entries(CPU) {
        p = p.with_override(CPU, e.op(), CastPolicy::None);
    }
    for e in profile.entries(CUDA) {
        p = match e.policy() {
            CastPolicy::Banned => p.with_ban(CPU, e.op(), e.message().unwrap_or_default()),
            policy => p.with_override(CPU, e.op(), policy),
        };
    }
    p
}

/// (name, profile deciding CPU tensors, autocast dtype) per device type's lists.
fn lists() -> Vec<(&'static str, Profile, DType)> {
    vec![
        ("docs cpu", Profile::docs(), DType::BF16),
        ("docs cuda", cuda_lists_on_cpu(&Profile::docs()), DType::F16),
        ("torch-2.15 cpu", Profile::torch_2_15(), DType::BF16),
        (
            "torch-2.15 cuda",
            cuda_lists_on_cpu(&Profile::torch_2_15()),
            DType::F16,
        ),
    ]
}

/// The dtype the op's own policy gives its floating outputs (`None`: the op is refused).
fn expected(
    policy: CastPolicy,
    autocast: DType,
    inputs: &[Tensor],
    dtype_param: bool,
) -> Option<DType> {
    let floats = || {
        inputs
            .iter()
            .map(Tensor::dtype)
            .filter(|d| d.is_floating_point())
    };
    match policy {
        CastPolicy::LowerPrecisionFp => Some(autocast),
        CastPolicy::Fp32 => Some(DType::F32),
        CastPolicy::Fp32SetOptDtype if dtype_param => Some(DType::F32),
        CastPolicy::Fp32SetOptDtype => floats().reduce(promote_types),
        CastPolicy::Promote => Some(floats().fold(autocast, promote_types)),
        CastPolicy::Banned => None,
        CastPolicy::None => unreachable!("ops without a policy are not checked"),
    }
}

#[test]
fn every_composite_keeps_its_own_policy_on_every_devices_lists() {
    let cases = cases();
    let mut failures = Vec::new();
    let mut checked_anywhere = vec![false; cases.len()];
    for (lists_name, profile, autocast) in lists() {
        let mut checked = 0;
        for (k, c) in cases.iter().enumerate() {
            let policy = profile.policy_by_name(CPU, c.op);
            if policy == CastPolicy::None {
                continue;
            }
            checked_anywhere[k] = true;
            for input_dtype in [DType::F32, autocast] {
                let mut g = Generator::new(k as u64);
                let inputs = (c.inputs)(&mut g, input_dtype);
                let want = expected(policy, autocast, &inputs, c.dtype_param);
                let got = Autocast::new(CPU)
                    .dtype(autocast)
                    .profile(profile.clone())
                    .run(|| (c.run)(&inputs))
                    .unwrap();
                let what = format!(
                    "{lists_name}: {} ({policy}) with {input_dtype} inputs",
                    c.op
                );
                match (want, got) {
                    (None, Err(e)) => {
                        assert!(e.to_string().contains("unsafe to autocast"), "{what}: {e}")
                    }
                    (None, Ok(_)) => failures.push(format!("{what}: ran, but is banned")),
                    (Some(_), Err(e)) => failures.push(format!("{what}: failed: {e}")),
                    (Some(want), Ok(outs)) => {
                        let dtypes: Vec<DType> = outs
                            .iter()
                            .map(Tensor::dtype)
                            .filter(|d| d.is_floating_point())
                            .collect();
                        if dtypes.is_empty() || dtypes.iter().any(|d| *d != want) {
                            failures.push(format!("{what}: outputs {dtypes:?}, expected {want}"));
                        }
                    }
                }
                checked += 1;
            }
        }
        assert!(checked >= 20, "{lists_name}: only {checked} calls checked");
    }
    assert!(
        failures.is_empty(),
        "{} composite calls got a dtype their own policy does not give:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for (c, seen) in cases.iter().zip(checked_anywhere) {
        assert!(
            seen,
            "{} has no policy on any list: not a case for this test",
            c.op
        );
    }
}

fn addbmm_inputs(dt: DType) -> [Tensor; 3] {
    let mut g = Generator::new(7);
    [
        randn(&mut g, dt, &[2, 3]),
        randn(&mut g, dt, &[4, 2, 5]),
        randn(&mut g, dt, &[4, 5, 3]),
    ]
}

#[test]
fn addbmm_keeps_its_policy_when_an_override_lists_sum_as_fp32() {
    let fp32_sum = Profile::docs().with_override(CPU, "sum", CastPolicy::Fp32);
    let [i, b1, b2] = addbmm_inputs(DType::F32);
    let region = Autocast::new(CPU).dtype(DType::BF16).profile(fp32_sum);
    let (y, s) = region
        .run(|| {
            let y = ops::addbmm(&i, &b1, &b2, 1.0, 1.0).unwrap();
            // `sum` on its own does follow the override.
            let s = ops::sum(&y, &[0], false, None).unwrap();
            (y, s)
        })
        .unwrap();
    assert_eq!(
        y.dtype(),
        DType::BF16,
        "addbmm is on the cpu lower-precision list"
    );
    assert_eq!(
        s.dtype(),
        DType::F32,
        "the override puts sum on the fp32 list"
    );
}

#[test]
fn addbmm_under_the_cuda_lists_where_sum_is_fp32() {
    let [i, b1, b2] = addbmm_inputs(DType::F32);
    let y = Autocast::new(CPU)
        .dtype(DType::F16)
        .profile(cuda_lists_on_cpu(&Profile::docs()))
        .run(|| ops::addbmm(&i, &b1, &b2, 1.0, 1.0).unwrap())
        .unwrap();
    assert_eq!(y.dtype(), DType::F16);
}

#[test]
fn a_composite_is_traced_once_and_its_body_not_at_all() {
    let [i, b1, b2] = addbmm_inputs(DType::F32);
    let fp32_sum = Profile::docs().with_override(CPU, "sum", CastPolicy::Fp32);
    let (_, t) = traced(Autocast::new(CPU).profile(fp32_sum), || {
        ops::addbmm(&i, &b1, &b2, 1.0, 1.0).unwrap()
    })
    .unwrap();
    let seen: Vec<&str> = t.events.iter().map(|e| e.op).collect();
    assert_eq!(seen, ["addbmm"]);
}

static MY_OP: amp_autograd::OpName = amp_autograd::OpName::new("my_fp32_op");

#[test]
fn autocast_reports_itself_off_inside_a_body_it_excluded() {
    // An op entering the dispatch point by hand, put on the fp32 list by an override:
    // while its body runs, autocast is excluded and says so (as PyTorch's
    // `is_autocast_enabled` does inside an autocast wrapper); a neighbour op with no
    // policy leaves it on.
    let p = Profile::docs().with_override(CPU, "my_fp32_op", CastPolicy::Fp32);
    let _g = Autocast::new(CPU).profile(p).enter().unwrap();
    let x = Tensor::ones([2], DType::BF16);
    {
        let mut args = [x.clone()];
        let (_, body) = amp_autograd::dispatch(
            &MY_OP,
            &mut args,
            None,
            false,
            amp_autograd::CallKind::Functional,
        )
        .unwrap();
        assert_eq!(args[0].dtype(), DType::F32, "the fp32 policy applied");
        assert!(body.excludes());
        assert!(!is_autocast_enabled(CPU));
        // An op in the body runs as it is: mm of float32 stays float32.
        let a = Tensor::ones([2, 2], DType::F32);
        assert_eq!(ops::mm(&a, &a).unwrap().dtype(), DType::F32);
    }
    assert!(
        is_autocast_enabled(CPU),
        "the exclusion ended with the body"
    );
    let a = Tensor::ones([2, 2], DType::F32);
    assert_eq!(ops::mm(&a, &a).unwrap().dtype(), DType::BF16);
}
