//! The op table: which vector `call` runs which workspace function. **Adding an op is
//! adding one entry here.**
//!
//! An entry takes the vector's arguments as the workspace's public API would be called by a
//! user (`amp::autograd::ops::mm(a, b)`, a layer's functional form, ...), never a private
//! shortcut, so ops reached through the dispatch point get autocast applied.
//!
//! Each entry names the call's PyTorch signature, defaults included ([`Signature`]):
//! arguments are bound to it first, so too many positional arguments, an unknown keyword or
//! a parameter given twice fail the case, as they fail in Python. A parameter the workspace
//! does not support (`out`, `rounding_mode`, `approximate="tanh"`, `max_norm`, ...) is
//! written `!name=default`: the case fails when it is given a value other than PyTorch's
//! default, never silently ignored. [`Bound::call`] then passes the other parameters, in
//! order, to the workspace function, each read as the type that function takes
//! ([`FromArg`]):
//!
//! ```text
//! calls! { t;
//!     "torch.mm": "input, mat2, *, !out=None" => ops::mm;
//!     "torch.cat": "tensors, dim=0, *, !out=None" => on_list(ops::cat);
//! }
//! ```
//!
//! (`calls!` writes `t.op(CALL, SIGNATURE, |b| b.call(FUNCTION))` for each line.) Where
//! the workspace function takes a slice, or its parameters in another order, a small
//! adapter below stands in for it. Entries whose arguments need more than a typed read (a
//! tensor or a Python number, a list of two hidden states, ...) are `t.op` with a closure
//! reading them one by one with [`Bound::arg`] and [`Bound::get`].
//!
//! Calls the workspace does not implement (the complex-dtype ops: `fft_*`, `stft`, `polar`,
//! `view_as_complex`, `linalg_eig`/`eigvals`) have no entry: their
//! cases are skipped, counted and listed as "op `NAME` not implemented yet".

/// Registers entries that pass their signature's parameters straight to a function
/// ([`Bound::call`]), one a line: `"CALL": SIGNATURE => FUNCTION;`.
macro_rules! calls {
    ($t:ident; $($call:literal: $sig:expr => $f:expr;)*) => {
        $($t.op($call, $sig, move |b| b.call($f));)*
    };
}

/// A loss's signature: its own parameters, the deprecated `size_average` and `reduce`
/// (which must be `None`) and `reduction`, then the parameters after `; `.
macro_rules! loss {
    ($($own:literal),* $(; $($after:literal),*)?) => {
        concat!(
            $($own, ", ",)*
            "!size_average=None, !reduce=None, reduction='mean'"
            $($(, ", ", $after)*)?
        )
    };
}

mod conv;
mod extra;
mod linalg;
mod pool;
mod sig;

use amp::autograd::{ops, Reduction, Tensor};
use amp::tensor::{DType, Scalar};

use sig::required;
pub use sig::{Bound, Callable, FromArg, IntoOutput, Signature};

use crate::args::{Arg, Kwargs, Output};
use crate::optable::OpTable;

/// The tensor type of the built-in backend's ops ([`crate::backend::Builtin`]).
pub type BuiltinTensor = Tensor;

type A = Arg<Tensor>;
type K = Kwargs<Tensor>;
type R = Result<Output<Tensor>, String>;
/// What a workspace function returns.
type Out = amp::autograd::Result<Tensor>;

/// An error's message (a missing device kernel is noted for [`crate::device`]).
fn err(e: amp::autograd::Error) -> String {
    crate::device::error_text(&e)
}

impl OpTable<BuiltinTensor> {
    /// Registers `f` for `call`, its arguments bound to the PyTorch signature `sig` first.
    fn op(
        &mut self,
        call: &str,
        sig: &str,
        f: impl Fn(&Bound<'_>) -> R + Send + Sync + 'static,
    ) -> &mut Self {
        let sig = Signature::parse(sig);
        self.insert(call, move |args, kwargs| f(&sig.bind(args, kwargs)?))
    }

    /// [`op`](Self::op) for a call that serves only the documented ops `ops`.
    fn op_for(
        &mut self,
        call: &str,
        ops: &[&str],
        sig: &str,
        f: impl Fn(&Bound<'_>) -> R + Send + Sync + 'static,
    ) -> &mut Self {
        let sig = Signature::parse(sig);
        self.insert_for(call, ops, move |args, kwargs| f(&sig.bind(args, kwargs)?))
    }
}

/// `s * alpha` as Python computes it (int times int stays an int).
fn times(s: Scalar, alpha: &A) -> Result<Scalar, String> {
    Ok(match (s, sig::scalar(alpha)?) {
        (Scalar::Int(x), Scalar::Int(a)) => Scalar::Int(x * a),
        (x, a) => Scalar::Float(x.to_f64() * a.to_f64()),
    })
}

/// Sizes from ints, or an error naming the parameter.
fn usizes(v: Vec<i64>, name: &str) -> Result<Vec<usize>, String> {
    v.into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("`{name}`: negative size {d}")))
        .collect()
}

type Unary = fn(&Tensor) -> Out;
type ScalarFn = fn(&Tensor, Scalar) -> Out;
type Chain = fn(&[Tensor]) -> Out;
type Reduce = fn(&Tensor, &[i64], bool, Option<DType>) -> Out;
type Softmax = fn(&Tensor, i64, Option<DType>) -> Out;

/// A method dunder with a Python number `other` (`torch.Tensor.__rpow__(self, other)`).
fn dunder_scalar(b: &Bound<'_>, f: ScalarFn) -> R {
    let x = b.arg("self")?;
    match b.req("other")? {
        Arg::Tensor(_) => Err("`other` as a tensor is not supported (only a Python number)".into()),
        _ => f(x, b.arg("other")?).into_output(),
    }
}

/// `torch.add` / `torch.sub`: a tensor or number `other`, and `alpha` when given.
fn add_sub(b: &Bound<'_>, sub: bool) -> R {
    let x = b.arg("input")?;
    match (b.req("other")?, b.get("alpha")) {
        (Arg::Tensor(o), None) if sub => ops::sub(x, o).into_output(),
        (Arg::Tensor(o), None) => ops::add(x, o).into_output(),
        (Arg::Tensor(o), Some(_)) => {
            let a = b.arg("alpha")?;
            if sub {
                ops::sub_scaled(x, o, a).into_output()
            } else {
                ops::add_scaled(x, o, a).into_output()
            }
        }
        (_, alpha) => {
            let s = b.arg("other")?;
            let s = match alpha {
                Some(a) => times(s, a)?,
                None => s,
            };
            if sub {
                ops::sub_scalar(x, s).into_output()
            } else {
                ops::add_scalar(x, s).into_output()
            }
        }
    }
}

/// `torch.mul` / `torch.div`: a tensor or number `other`.
fn mul_div(b: &Bound<'_>, div: bool) -> R {
    let x = b.arg("input")?;
    match (b.req("other")?, div) {
        (Arg::Tensor(o), true) => ops::div(x, o).into_output(),
        (Arg::Tensor(o), false) => ops::mul(x, o).into_output(),
        (_, true) => ops::div_scalar(x, b.arg::<Scalar>("other")?).into_output(),
        (_, false) => ops::mul_scalar(x, b.arg::<Scalar>("other")?).into_output(),
    }
}

/// `torch.sum` / `torch.mean`: `dim=None` reduces every dim (the empty list).
fn reduce_dims(f: Reduce) -> impl Fn(&Bound<'_>) -> R + Send + Sync + 'static {
    move |b| {
        b.call(
            |x: &Tensor, dim: Option<Vec<i64>>, keepdim: bool, dtype: Option<DType>| {
                f(x, &dim.unwrap_or_default(), keepdim, dtype)
            },
        )
    }
}

/// `torch.softmax` and friends: the workspace does not choose the implicit dim of
/// `torch.nn.functional`'s optional `dim`: it must be given.
fn softmax_like(b: &Bound<'_>, f: Softmax) -> R {
    if b.get("dim").is_none() {
        return Err("`dim=None` (the implicit dim) is not supported".into());
    }
    f(b.arg("input")?, b.arg("dim")?, b.arg("dtype")?).into_output()
}

// ----- adapters: workspace functions that take a slice, or PyTorch's parameters in
// another order --------------------------------------------------------------------------------

/// A function of a list of tensors and a dim (`cat`, `stack`), the list read as a `Vec`.
fn on_list(f: fn(&[Tensor], i64) -> Out) -> impl Fn(Vec<Tensor>, i64) -> Out {
    move |ts, dim| f(&ts, dim)
}

fn layer_norm(x: &Tensor, s: Vec<usize>, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64) -> Out {
    ops::layer_norm(x, &s, w, b, eps)
}

fn reshape(x: &Tensor, shape: Vec<i64>) -> Out {
    ops::reshape(x, shape)
}

/// `embedding(input, weight, padding_idx)`: the workspace takes the weight first.
fn embedding(input: &Tensor, weight: &Tensor, padding_idx: Option<i64>) -> Out {
    ops::embedding_padded(weight, input, padding_idx)
}

/// PyTorch's `pos_weight` comes after `reduction`.
fn bce_with_logits(
    x: &Tensor,
    y: &Tensor,
    w: Option<&Tensor>,
    r: Reduction,
    pw: Option<&Tensor>,
) -> Out {
    ops::binary_cross_entropy_with_logits(x, y, w, pw, r)
}

/// The op table of the built-in backend.
pub fn table() -> OpTable<BuiltinTensor> {
    let mut t = OpTable::new();

    // ----- pointwise, unary -------------------------------------------------------------
    let unaries: [(&str, Unary); 20] = [
        ("torch.abs", ops::abs),
        ("torch.acos", ops::acos),
        ("torch.asin", ops::asin),
        ("torch.cosh", ops::cosh),
        ("torch.erfinv", ops::erfinv),
        ("torch.exp", ops::exp),
        ("torch.expm1", ops::expm1),
        ("torch.log", ops::log),
        ("torch.log10", ops::log10),
        ("torch.log1p", ops::log1p),
        ("torch.log2", ops::log2),
        ("torch.neg", ops::neg),
        ("torch.reciprocal", ops::reciprocal),
        ("torch.relu", ops::relu),
        ("torch.rsqrt", ops::rsqrt),
        ("torch.sigmoid", ops::sigmoid),
        ("torch.sinh", ops::sinh),
        ("torch.sqrt", ops::sqrt),
        ("torch.tan", ops::tan),
        ("torch.tanh", ops::tanh),
    ];
    for (call, f) in unaries {
        t.op(call, "input, *, !out=None", move |b| b.call(f));
    }

    // ----- pointwise, binary ------------------------------------------------------------
    let add = "input, other, *, alpha=1, !out=None";
    let mul = "input, other, *, !out=None";
    let div = "input, other, *, !rounding_mode=None, !out=None";
    t.op("torch.add", add, |b| add_sub(b, false));
    t.op("torch.sub", add, |b| add_sub(b, true));
    t.op("torch.mul", mul, |b| mul_div(b, false));
    t.op("torch.div", div, |b| mul_div(b, true));
    t.op("torch.pow", "input, exponent, *, !out=None", |b| {
        let Arg::Tensor(x) = b.req("input")? else {
            return Err("`input` as a Python number is not supported (only a tensor)".into());
        };
        match b.req("exponent")? {
            Arg::Tensor(e) => ops::pow(x, e).into_output(),
            _ => ops::pow_scalar(x, b.arg::<Scalar>("exponent")?).into_output(),
        }
    });
    let dunders: [(&str, ScalarFn); 4] = [
        ("torch.Tensor.__pow__", ops::dunder_pow),
        ("torch.Tensor.__rpow__", ops::rpow_scalar),
        ("torch.Tensor.__rdiv__", ops::rdiv_scalar),
        ("torch.Tensor.__rtruediv__", ops::rtruediv_scalar),
    ];
    for (call, f) in dunders {
        t.op(call, "self, other", move |b| dunder_scalar(b, f));
    }
    let addcx = "input, tensor1, tensor2, *, value=1, !out=None";
    calls! { t;
        "torch.atan2": "input, other, *, !out=None" => ops::atan2;
        "torch.addcmul": addcx => ops::addcmul;
        "torch.addcdiv": addcx => ops::addcdiv;
    }

    // ----- matmul family ------------------------------------------------------------------
    let addmm = |tensors: &str| format!("{tensors}, *, beta=1, alpha=1, !out=None");
    calls! { t;
        "torch.addmm": &addmm("input, mat1, mat2") => ops::addmm;
        "torch.addbmm": &addmm("input, batch1, batch2") => ops::addbmm;
        "torch.baddbmm": &addmm("input, batch1, batch2") => ops::baddbmm;
        "torch.addmv": &addmm("input, mat, vec") => ops::addmv;
        "torch.addr": &addmm("input, vec1, vec2") => ops::addr;
        "torch.mm": "input, mat2, *, !out=None" => ops::mm;
        "torch.bmm": "input, mat2, *, !out=None" => ops::bmm;
        "torch.matmul": "input, other, *, !out=None" => ops::matmul;
        "torch.mv": "input, vec, *, !out=None" => ops::mv;
        "torch.dot": "input, tensor, *, !out=None" => ops::dot;
        "torch.Tensor.__matmul__": "self, other" => ops::dunder_matmul;
        "torch.nn.functional.linear": "input, weight, bias=None" => ops::linear;
    }
    // The vectors reach both documented ops through `torch.linalg.multi_dot(tensors)`
    // (`torch.chain_matmul(*matrices)` is its deprecated varargs form); each op runs the
    // workspace function of its own name on the same list of matrices.
    let chains: [(&str, Chain); 2] = [
        ("chain_matmul", ops::chain_matmul),
        ("multi_dot", ops::multi_dot),
    ];
    for (op, f) in chains {
        let sig = "tensors, *, !out=None";
        t.op_for("torch.linalg.multi_dot", &[op], sig, move |b| {
            b.call(|ms: Vec<Tensor>| f(&ms))
        });
    }

    // ----- reductions ---------------------------------------------------------------------
    let reduce = "input, dim=None, keepdim=False, *, dtype=None, !out=None";
    t.op("torch.sum", reduce, reduce_dims(ops::sum));
    t.op("torch.mean", reduce, reduce_dims(ops::mean));
    calls! { t;
        "torch.prod": reduce => ops::prod;
        "torch.cumsum": "input, dim, *, dtype=None, !out=None" => ops::cumsum;
        "torch.cumprod": "input, dim, *, dtype=None, !out=None" => ops::cumprod;
    }
    // A number `p` (or 'fro' over at most two dims) is the vector norm over `dim`.
    let norm = "input, p='fro', dim=None, keepdim=False, !out=None, !dtype=None";
    t.op("torch.norm", norm, |b| {
        let dims = b.arg::<Option<Vec<i64>>>("dim")?.unwrap_or_default();
        let p = match b.get("p") {
            None => 2.0,
            Some(Arg::Str(s)) if s == "fro" && dims.len() <= 2 => 2.0,
            Some(Arg::Str(s)) => return Err(format!("`p={s:?}` is not supported")),
            Some(_) => b.arg("p")?,
        };
        ops::norm(b.arg("input")?, p, &dims, b.arg("keepdim")?).into_output()
    });

    // ----- softmax, normalisation -----------------------------------------------------------
    let softmaxes: [(&str, &str, Softmax); 3] = [
        ("torch.softmax", "input, dim, dtype=None", ops::softmax),
        (
            "torch.log_softmax",
            "input, dim, dtype=None",
            ops::log_softmax,
        ),
        (
            "torch.nn.functional.softmin",
            "input, dim=None, _stacklevel=3, dtype=None",
            ops::softmin,
        ),
    ];
    for (call, sig, f) in softmaxes {
        t.op(call, sig, move |b| softmax_like(b, f));
    }

    // ----- views and data movement, activations ---------------------------------------------
    let layer_norm_sig = "input, normalized_shape, weight=None, bias=None, eps=1e-5";
    let embedding_sig = "input, weight, padding_idx=None, !max_norm=None, !norm_type=2.0, \
                         !scale_grad_by_freq=False, !sparse=False";
    calls! { t;
        "torch.nn.functional.layer_norm": layer_norm_sig => layer_norm;
        "torch.reshape": "input, shape" => reshape;
        "torch.transpose": "input, dim0, dim1" => ops::transpose;
        "torch.cat": "tensors, dim=0, *, !out=None" => on_list(ops::cat);
        "torch.stack": "tensors, dim=0, *, !out=None" => on_list(ops::stack);
        "torch.index_copy": "input, dim, index, source, *, !out=None" => ops::index_copy;
        "torch.scatter_add": "input, dim, index, src, *, !out=None" => ops::scatter_add;
        "torch.nn.functional.embedding": embedding_sig => embedding;
        "torch.nn.functional.gelu": "input, *, !approximate='none'" => ops::gelu;
        "torch.nn.functional.softplus": "input, beta=1, threshold=20" => ops::softplus;
    }

    // ----- losses -------------------------------------------------------------------------------
    let nll = "input, target, weight=None, !size_average=None, ignore_index=-100, !reduce=None, \
               reduction='mean'";
    let cross_entropy = &format!("{nll}, label_smoothing=0.0");
    let pointwise = loss!("input", "target"; "!weight=None");
    let smooth_l1 = loss!("input", "target"; "beta=1.0");
    let bce = loss!("input", "target", "weight=None");
    let bce_logits = loss!("input", "target", "weight=None"; "pos_weight=None");
    calls! { t;
        "torch.nn.functional.mse_loss": pointwise => ops::mse_loss;
        "torch.nn.functional.l1_loss": pointwise => ops::l1_loss;
        "torch.nn.functional.smooth_l1_loss": smooth_l1 => ops::smooth_l1_loss;
        "torch.nn.functional.nll_loss": nll => ops::nll_loss;
        "torch.nn.functional.cross_entropy": cross_entropy => ops::cross_entropy;
        "torch.nn.functional.binary_cross_entropy": bce => ops::binary_cross_entropy;
        "torch.nn.functional.binary_cross_entropy_with_logits": bce_logits => bce_with_logits;
    }

    conv::register(&mut t);
    extra::register(&mut t);
    linalg::register(&mut t);
    pool::register(&mut t);
    t
}

/// The call that reaches each op of the documented lists that no vector exercises, for the
/// coverage report (ops with vectors take their call from the vectors). aten-internal names
/// map to the public function a user calls to reach them.
pub const CALLS_WITHOUT_VECTORS: &[(&str, &str)] = &[
    ("_convolution", "torch.nn.functional.conv2d"),
    ("grid_sampler", "torch.nn.functional.grid_sample"),
    ("grid_sampler_2d", "torch.nn.functional.grid_sample"),
    (
        "_grid_sampler_2d_cpu_fallback",
        "torch.nn.functional.grid_sample",
    ),
    ("grid_sampler_3d", "torch.nn.functional.grid_sample"),
    ("polar", "torch.polar"),
    ("stft", "torch.stft"),
    ("view_as_complex", "torch.view_as_complex"),
    ("cholesky", "torch.cholesky"),
    ("cholesky_inverse", "torch.cholesky_inverse"),
    ("cholesky_solve", "torch.cholesky_solve"),
    ("lu_solve", "torch.lu_solve"),
    ("orgqr", "torch.orgqr"),
    ("ormqr", "torch.ormqr"),
    ("max_unpool2d", "torch.nn.functional.max_unpool2d"),
    ("max_unpool3d", "torch.nn.functional.max_unpool3d"),
    ("ctc_loss", "torch.nn.functional.ctc_loss"),
    ("fft_fft", "torch.fft.fft"),
    ("fft_ifft", "torch.fft.ifft"),
    ("fft_fft2", "torch.fft.fft2"),
    ("fft_ifft2", "torch.fft.ifft2"),
    ("fft_fftn", "torch.fft.fftn"),
    ("fft_ifftn", "torch.fft.ifftn"),
    ("fft_rfft", "torch.fft.rfft"),
    ("fft_irfft", "torch.fft.irfft"),
    ("fft_rfft2", "torch.fft.rfft2"),
    ("fft_irfft2", "torch.fft.irfft2"),
    ("fft_rfftn", "torch.fft.rfftn"),
    ("fft_irfftn", "torch.fft.irfftn"),
    ("fft_hfft", "torch.fft.hfft"),
    ("fft_ihfft", "torch.fft.ihfft"),
    ("linalg_matrix_norm", "torch.linalg.matrix_norm"),
    ("linalg_cond", "torch.linalg.cond"),
    ("linalg_matrix_rank", "torch.linalg.matrix_rank"),
    ("linalg_eigvals", "torch.linalg.eigvals"),
    (
        "linalg_householder_product",
        "torch.linalg.householder_product",
    ),
    ("linalg_tensorinv", "torch.linalg.tensorinv"),
    ("linalg_tensorsolve", "torch.linalg.tensorsolve"),
    (
        "fake_quantize_per_tensor_affine",
        "torch.fake_quantize_per_tensor_affine",
    ),
    ("eig", "torch.eig"),
    ("geqrf", "torch.geqrf"),
    ("lstsq", "torch.lstsq"),
    ("_lu_with_info", "torch.lu"),
    ("qr", "torch.qr"),
    ("solve", "torch.solve"),
    ("svd", "torch.svd"),
    ("symeig", "torch.symeig"),
    ("triangular_solve", "torch.triangular_solve"),
    (
        "fractional_max_pool2d",
        "torch.nn.functional.fractional_max_pool2d",
    ),
    (
        "fractional_max_pool3d",
        "torch.nn.functional.fractional_max_pool3d",
    ),
    (
        "adaptive_max_pool3d",
        "torch.nn.functional.adaptive_max_pool3d",
    ),
    (
        "multilabel_margin_loss_forward",
        "torch.nn.functional.multilabel_margin_loss",
    ),
    ("linalg_qr", "torch.linalg.qr"),
    ("linalg_cholesky_ex", "torch.linalg.cholesky_ex"),
    ("linalg_svd", "torch.linalg.svd"),
    ("linalg_eig", "torch.linalg.eig"),
    ("linalg_eigh", "torch.linalg.eigh"),
    ("linalg_lstsq", "torch.linalg.lstsq"),
    ("linalg_inv_ex", "torch.linalg.inv_ex"),
];

#[cfg(test)]
mod test_util;

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;

    #[test]
    fn binding_follows_python() {
        let x = t(&[1.0, 2.0], &[2]);
        // Too many positional arguments, an unknown keyword, a parameter given twice.
        assert_eq!(
            call("torch.exp").arg(&x).arg(&x).err(),
            "takes at most 1 positional arguments (input), but 2 were given"
        );
        let e = call("torch.exp").arg(&x).kw("alpha", 1).err();
        assert_eq!(e, "unexpected keyword argument `alpha`");
        let e = call("torch.exp").arg(&x).kw("input", &x).err();
        assert_eq!(e, "got multiple values for argument `input`");
        // Keyword form of a positional parameter.
        assert_eq!(call("torch.neg").kw("input", &x).values(), [-1.0, -2.0]);
        assert_eq!(call("torch.neg").err(), "missing required argument `input`");
    }

    #[test]
    fn unsupported_values_fail_and_defaults_pass() {
        let x = t(&[1.0, -2.0], &[2]);
        let gelu = |approximate| {
            call("torch.nn.functional.gelu")
                .arg(&x)
                .kw("approximate", approximate)
        };
        assert_eq!(
            gelu("tanh").err(),
            "`approximate=\"tanh\"` is not supported"
        );
        assert!(gelu("none").run().is_ok());
        let e = call("torch.div")
            .arg(&x)
            .arg(&x)
            .kw("rounding_mode", "floor")
            .err();
        assert_eq!(e, "`rounding_mode=\"floor\"` is not supported");
        let e = call("torch.nn.functional.mse_loss")
            .arg(&x)
            .arg(&x)
            .kw("size_average", true)
            .err();
        assert_eq!(e, "`size_average=true` is not supported");

        let idx = Arg::Tensor(Tensor::from_vec(vec![0i64, 1], [2]).unwrap());
        let w = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let embedding = || call("torch.nn.functional.embedding").arg(&idx).arg(&w);
        let e = embedding().arg(0).arg(1.0).err();
        assert_eq!(e, "`max_norm=1.0` is not supported");
        assert_eq!(embedding().arg(0).values(), [1.0, 2.0, 3.0, 4.0]);
        let defaults = embedding().kw("norm_type", 2).kw("sparse", false);
        assert_eq!(defaults.values(), [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn scalars_alpha_and_dtype() {
        let x = t(&[1.0, 2.0], &[2]);
        let y = call("torch.add").arg(&x).arg(2).kw("alpha", 3).values();
        assert_eq!(y, [7.0, 8.0]);
        let y = call("torch.sub").arg(&x).arg(&x).kw("alpha", 0.5).values();
        assert_eq!(y, [0.5, 1.0]);
        let s = call("torch.sum").arg(&x).kw("dtype", "float32").tensors();
        assert_eq!(s[0].dtype(), DType::F32);
        assert_eq!(s[0].to_vec_f64(), [3.0]);
        let y = call("torch.norm")
            .arg(t(&[3.0, 4.0], &[2]))
            .kw("p", "fro")
            .values();
        assert_eq!(y, [5.0]);
        let e = call("torch.norm").arg(&x).kw("p", "nuc").err();
        assert_eq!(e, "`p=\"nuc\"` is not supported");
    }

    #[test]
    fn every_signature_fits_its_function() {
        // Without arguments every entry fails on its first required parameter; an entry
        // whose signature passes more or fewer parameters than its function takes panics.
        let table = table();
        let files = crate::builtin_files();
        let mut pairs: Vec<(&str, &str)> = files.iter().flat_map(|f| f.cases.op_calls()).collect();
        pairs.extend(CALLS_WITHOUT_VECTORS.iter().copied());
        for (op, call) in pairs {
            if let Some(r) = table.call(op, call, &[], &K::default()) {
                assert!(r.is_err(), "{op} via {call}");
            }
        }
    }

    #[test]
    fn multi_dot_serves_both_ops_with_their_own_functions() {
        let table = table();
        assert!(table.supports("chain_matmul", "torch.linalg.multi_dot"));
        assert!(table.supports("multi_dot", "torch.linalg.multi_dot"));
        assert!(!table.supports("linalg_inv", "torch.linalg.multi_dot"));
        // multi_dot accepts 1-D ends; chain_matmul needs matrices.
        let v = t(&[1.0, 2.0], &[2]);
        let m = t(&[1.0, 0.0, 0.0, 1.0], &[2, 2]);
        let list = Arg::List(vec![v.clone(), m, v]);
        let multi_dot = call("torch.linalg.multi_dot").arg(&list);
        assert_eq!(multi_dot.values(), [5.0]);
        assert!(multi_dot.op("chain_matmul").run().is_err());
    }
}
