//! The op table: which vector `call` runs which workspace function. **Adding an op is
//! adding one entry here.**
//!
//! An entry takes the vector's arguments as the workspace's public API would be called by a
//! user (`amp::autograd::ops::mm(a, b)`, a layer's functional form, ...), never a private
//! shortcut, so ops reached through the dispatch point get autocast applied.
//!
//! Arguments are bound to the call's PyTorch signature first ([`bind`]: which parameters
//! may be given positionally, which only by keyword), so too many positional arguments, an
//! unknown keyword or a parameter given twice fail the case, as they fail in Python. An
//! entry then reads every parameter of the signature: a parameter the workspace does not
//! support (`rounding_mode`, `approximate="tanh"`, `padding_idx`, ...) fails the case when
//! it is given a value other than PyTorch's default, never silently ignored:
//!
//! ```text
//! t.insert("torch.mm", |args, kwargs| {
//!     let b = bind(args, kwargs, &["input", "mat2"], &["out"])?;
//!     b.unsupported_unless_none("out")?;
//!     one(ops::mm(b.tensor("input")?, b.tensor("mat2")?))
//! });
//! ```
//!
//! Calls the workspace does not implement (the complex-dtype ops: `fft_*`, `stft`, `polar`,
//! `view_as_complex`, `linalg_eig`/`eigvals`) have no entry: their
//! cases are skipped, counted and listed as "op `NAME` not implemented yet".

mod conv;
mod extra;
mod linalg;
mod pool;

use amp::autograd::{ops, Reduction, Tensor};
use amp::tensor::{DType, Scalar};

use crate::args::{Arg, Kwargs, Output};
use crate::optable::OpTable;

/// The tensor type of the built-in backend's ops ([`crate::backend::Builtin`]).
pub type BuiltinTensor = Tensor;

type A = Arg<Tensor>;
type K = Kwargs<Tensor>;
type R = Result<Output<Tensor>, String>;

fn err(e: amp::autograd::Error) -> String {
    e.to_string()
}

/// One output tensor.
fn one(r: amp::autograd::Result<Tensor>) -> R {
    r.map(Output::Tensor).map_err(err)
}

/// The arguments of one call bound to the parameters of its PyTorch signature.
pub struct Bound<'a> {
    names: Vec<&'static str>,
    values: Vec<Option<&'a A>>,
}

/// Binds positional `args` and `kwargs` to a PyTorch signature: `positional` are the
/// parameters that may be given by position (in order; also by keyword), `keyword_only`
/// those after `*`. Too many positional arguments, an unknown keyword or a parameter given
/// twice is an error, as in Python.
pub fn bind<'a>(
    args: &'a [A],
    kwargs: &'a K,
    positional: &[&'static str],
    keyword_only: &[&'static str],
) -> Result<Bound<'a>, String> {
    if args.len() > positional.len() {
        return Err(format!(
            "takes at most {} positional arguments ({}), but {} were given",
            positional.len(),
            positional.join(", "),
            args.len()
        ));
    }
    let names: Vec<&'static str> = positional.iter().chain(keyword_only).copied().collect();
    let mut values: Vec<Option<&A>> = vec![None; names.len()];
    for (slot, a) in values.iter_mut().zip(args) {
        *slot = Some(a);
    }
    for (k, v) in kwargs.iter() {
        let i = names
            .iter()
            .position(|n| *n == k)
            .ok_or_else(|| format!("unexpected keyword argument `{k}`"))?;
        if values[i].is_some() {
            return Err(format!("got multiple values for argument `{k}`"));
        }
        values[i] = Some(v);
    }
    Ok(Bound { names, values })
}

impl<'a> Bound<'a> {
    fn slot(&self, name: &str) -> Option<&'a A> {
        let i = self
            .names
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("`{name}` is not a parameter of this signature"));
        self.values[i]
    }

    /// The argument, `None` when absent or given as `None`.
    pub fn get(&self, name: &str) -> Option<&'a A> {
        self.slot(name).filter(|a| !a.is_none())
    }

    /// A required argument.
    pub fn req(&self, name: &str) -> Result<&'a A, String> {
        self.get(name)
            .ok_or_else(|| format!("missing required argument `{name}`"))
    }

    /// A required tensor.
    pub fn tensor(&self, name: &str) -> Result<&'a Tensor, String> {
        self.req(name)?
            .tensor()
            .map_err(|e| format!("`{name}`: {e}"))
    }

    /// An optional tensor (absent or `None`: `None`).
    pub fn opt_tensor(&self, name: &str) -> Result<Option<&'a Tensor>, String> {
        self.get(name)
            .map(|a| a.tensor().map_err(|e| format!("`{name}`: {e}")))
            .transpose()
    }

    /// A list of tensors.
    pub fn tensors(&self, name: &str) -> Result<Vec<Tensor>, String> {
        let ts = self
            .req(name)?
            .tensors()
            .map_err(|e| format!("`{name}`: {e}"))?;
        Ok(ts.into_iter().cloned().collect())
    }

    /// A required int.
    pub fn int(&self, name: &str) -> Result<i64, String> {
        self.req(name)?.int().map_err(|e| format!("`{name}`: {e}"))
    }

    /// An int, `default` when absent.
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, String> {
        self.get(name).map_or(Ok(default), |a| {
            a.int().map_err(|e| format!("`{name}`: {e}"))
        })
    }

    /// A number, `default` when absent.
    pub fn f64_or(&self, name: &str, default: f64) -> Result<f64, String> {
        self.get(name).map_or(Ok(default), |a| {
            a.float().map_err(|e| format!("`{name}`: {e}"))
        })
    }

    /// A bool, `default` when absent.
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, String> {
        self.get(name).map_or(Ok(default), |a| {
            a.bool().map_err(|e| format!("`{name}`: {e}"))
        })
    }

    /// A string, `default` when absent.
    pub fn str_or(&self, name: &str, default: &'static str) -> Result<&'a str, String> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => a.str().map_err(|e| format!("`{name}`: {e}")),
        }
    }

    /// A Python number as a [`Scalar`] (int, float or bool).
    pub fn scalar(&self, name: &str) -> Result<Scalar, String> {
        scalar(self.req(name)?).map_err(|e| format!("`{name}`: {e}"))
    }

    /// An optional `dtype=` (`"float32"` or `"torch.float32"`).
    pub fn dtype(&self, name: &str) -> Result<Option<DType>, String> {
        self.get(name)
            .map(|a| {
                let s = a.str().map_err(|e| format!("`{name}`: {e}"))?;
                s.parse::<DType>().map_err(|e| e.to_string())
            })
            .transpose()
    }

    /// Dims of a reduction (`int`, `int[]` or `None`: all, as the empty list).
    pub fn dims(&self, name: &str) -> Result<Vec<i64>, String> {
        self.get(name).map_or(Ok(Vec::new()), |a| {
            a.ints().map_err(|e| format!("`{name}`: {e}"))
        })
    }

    /// `reduction=` of a loss (`'mean'` when absent).
    pub fn reduction(&self, name: &str) -> Result<Reduction, String> {
        self.str_or(name, "mean")?.parse::<Reduction>().map_err(err)
    }

    /// Fails unless the parameter is absent or `None` (a parameter the workspace does not
    /// support, or a deprecated one such as `size_average`).
    pub fn unsupported_unless_none(&self, name: &str) -> Result<(), String> {
        match self.get(name) {
            None => Ok(()),
            Some(a) => Err(format!("`{name}={a}` is not supported")),
        }
    }

    /// Fails unless the parameter is absent, `None`, or equal to `default` (a parameter
    /// whose only supported value is PyTorch's default).
    pub fn unsupported_unless(&self, name: &str, default: &A) -> Result<(), String> {
        match self.get(name) {
            Some(a) if !same_value(a, default) => Err(format!("`{name}={a}` is not supported")),
            _ => Ok(()),
        }
    }
}

/// Equal as Python values (`2 == 2.0`; no tensors).
fn same_value(a: &A, b: &A) -> bool {
    match (a, b) {
        (Arg::Bool(x), Arg::Bool(y)) => x == y,
        (Arg::Str(x), Arg::Str(y)) => x == y,
        (Arg::Int(_) | Arg::Float(_), Arg::Int(_) | Arg::Float(_)) => {
            a.float().ok() == b.float().ok()
        }
        (Arg::None, Arg::None) => true,
        _ => false,
    }
}

fn scalar(a: &A) -> Result<Scalar, String> {
    match a {
        Arg::Int(i) => Ok(Scalar::Int(*i)),
        Arg::Float(x) => Ok(Scalar::Float(*x)),
        Arg::Bool(b) => Ok(Scalar::Bool(*b)),
        other => Err(format!("expected a number, got {}", other.kind())),
    }
}

/// `s * alpha` as Python computes it (int times int stays an int).
fn times(s: Scalar, alpha: &A) -> Result<Scalar, String> {
    Ok(match (s, scalar(alpha)?) {
        (Scalar::Int(x), Scalar::Int(a)) => Scalar::Int(x * a),
        (x, a) => Scalar::Float(x.to_f64() * a.to_f64()),
    })
}

fn usizes(v: Vec<i64>, name: &str) -> Result<Vec<usize>, String> {
    v.into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("`{name}`: negative size {d}")))
        .collect()
}

type Unary = fn(&Tensor) -> amp::autograd::Result<Tensor>;

/// `torch.NAME(input, *, out=None)`.
fn unary(f: Unary) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &["input"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(f(b.tensor("input")?))
    }
}

type Binary = fn(&Tensor, &Tensor) -> amp::autograd::Result<Tensor>;

/// A method dunder with a Python number `other` (`torch.Tensor.__rpow__(self, other)`).
fn dunder_scalar(
    f: fn(&Tensor, Scalar) -> amp::autograd::Result<Tensor>,
) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &["self", "other"], &[])?;
        let x = b.tensor("self")?;
        match b.req("other")? {
            Arg::Tensor(_) => {
                Err("`other` as a tensor is not supported (only a Python number)".into())
            }
            _ => one(f(x, b.scalar("other")?)),
        }
    }
}

/// `torch.NAME(a, b, *, out=None)` of two tensors named `names`.
fn binary(f: Binary, names: [&'static str; 2]) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &names, &["out"])?;
        b.unsupported_unless_none("out")?;
        one(f(b.tensor(names[0])?, b.tensor(names[1])?))
    }
}

type Addmm = fn(&Tensor, &Tensor, &Tensor, f64, f64) -> amp::autograd::Result<Tensor>;

/// `torch.addmm`-style: `(input, m1, m2, *, beta=1, alpha=1, out=None)`.
fn beta_alpha(
    f: Addmm,
    names: [&'static str; 3],
) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &names, &["beta", "alpha", "out"])?;
        b.unsupported_unless_none("out")?;
        one(f(
            b.tensor(names[0])?,
            b.tensor(names[1])?,
            b.tensor(names[2])?,
            b.f64_or("beta", 1.0)?,
            b.f64_or("alpha", 1.0)?,
        ))
    }
}

/// `torch.add` / `torch.sub`: `(input, other, *, alpha=1, out=None)` with a tensor or
/// number `other`.
fn add_sub(sub: bool) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &["input", "other"], &["alpha", "out"])?;
        b.unsupported_unless_none("out")?;
        let x = b.tensor("input")?;
        let alpha = b.get("alpha");
        match (b.req("other")?, alpha) {
            (Arg::Tensor(o), None) if sub => one(ops::sub(x, o)),
            (Arg::Tensor(o), None) => one(ops::add(x, o)),
            (Arg::Tensor(o), Some(a)) => {
                let a = a.float().map_err(|e| format!("`alpha`: {e}"))?;
                if sub {
                    one(ops::sub_scaled(x, o, a))
                } else {
                    one(ops::add_scaled(x, o, a))
                }
            }
            (_, alpha) => {
                let s = b.scalar("other")?;
                let s = match alpha {
                    Some(a) => times(s, a)?,
                    None => s,
                };
                if sub {
                    one(ops::sub_scalar(x, s))
                } else {
                    one(ops::add_scalar(x, s))
                }
            }
        }
    }
}

/// `torch.mul` / `torch.div`: `(input, other, *, out=None)` with a tensor or number
/// `other` (`div` also `rounding_mode=None`).
fn mul_div(div: bool) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let kw: &[&'static str] = if div {
            &["rounding_mode", "out"]
        } else {
            &["out"]
        };
        let b = bind(args, kwargs, &["input", "other"], kw)?;
        b.unsupported_unless_none("out")?;
        if div {
            b.unsupported_unless_none("rounding_mode")?;
        }
        let x = b.tensor("input")?;
        match (b.req("other")?, div) {
            (Arg::Tensor(o), true) => one(ops::div(x, o)),
            (Arg::Tensor(o), false) => one(ops::mul(x, o)),
            (_, true) => one(ops::div_scalar(x, b.scalar("other")?)),
            (_, false) => one(ops::mul_scalar(x, b.scalar("other")?)),
        }
    }
}

type Reduce = fn(&Tensor, &[i64], bool, Option<DType>) -> amp::autograd::Result<Tensor>;

/// `torch.sum` / `torch.mean`: `(input, dim=None, keepdim=False, *, dtype=None, out=None)`.
fn reduce_dims(f: Reduce) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "dim", "keepdim"],
            &["dtype", "out"],
        )?;
        b.unsupported_unless_none("out")?;
        one(f(
            b.tensor("input")?,
            &b.dims("dim")?,
            b.bool_or("keepdim", false)?,
            b.dtype("dtype")?,
        ))
    }
}

type Scan = fn(&Tensor, i64, Option<DType>) -> amp::autograd::Result<Tensor>;

/// `torch.cumsum` / `torch.cumprod`: `(input, dim, *, dtype=None, out=None)`.
fn scan(f: Scan) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &["input", "dim"], &["dtype", "out"])?;
        b.unsupported_unless_none("out")?;
        one(f(b.tensor("input")?, b.int("dim")?, b.dtype("dtype")?))
    }
}

type Softmax = fn(&Tensor, i64, Option<DType>) -> amp::autograd::Result<Tensor>;

/// `torch.softmax(input, dim, dtype=None)` and friends; `functional` adds
/// `torch.nn.functional`'s `_stacklevel` and its optional (implicit) `dim`, which the
/// workspace does not choose: it must be given.
fn softmax_like(f: Softmax, functional: bool) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = if functional {
            bind(args, kwargs, &["input", "dim", "_stacklevel", "dtype"], &[])?
        } else {
            bind(args, kwargs, &["input", "dim", "dtype"], &[])?
        };
        let dim = match b.get("dim") {
            Some(d) => d.int().map_err(|e| format!("`dim`: {e}"))?,
            None => return Err("`dim=None` (the implicit dim) is not supported".into()),
        };
        one(f(b.tensor("input")?, dim, b.dtype("dtype")?))
    }
}

/// The deprecated `size_average` and `reduce` of the losses must be `None`.
fn legacy_reduction(b: &Bound<'_>) -> Result<(), String> {
    b.unsupported_unless_none("size_average")?;
    b.unsupported_unless_none("reduce")
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
        t.insert(call, unary(f));
    }

    // ----- pointwise, binary ------------------------------------------------------------
    t.insert("torch.add", add_sub(false));
    t.insert("torch.sub", add_sub(true));
    t.insert("torch.mul", mul_div(false));
    t.insert("torch.div", mul_div(true));
    t.insert("torch.atan2", binary(ops::atan2, ["input", "other"]));
    t.insert("torch.pow", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "exponent"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let x = match b.req("input")? {
            Arg::Tensor(x) => x,
            _ => return Err("`input` as a Python number is not supported (only a tensor)".into()),
        };
        match b.req("exponent")? {
            Arg::Tensor(e) => one(ops::pow(x, e)),
            _ => one(ops::pow_scalar(x, b.scalar("exponent")?)),
        }
    });
    for (call, f) in [
        ("torch.addcmul", ops::addcmul as Addcx),
        ("torch.addcdiv", ops::addcdiv as Addcx),
    ] {
        t.insert(call, move |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &["input", "tensor1", "tensor2"],
                &["value", "out"],
            )?;
            b.unsupported_unless_none("out")?;
            one(f(
                b.tensor("input")?,
                b.tensor("tensor1")?,
                b.tensor("tensor2")?,
                b.f64_or("value", 1.0)?,
            ))
        });
    }
    t.insert("torch.Tensor.__pow__", dunder_scalar(ops::dunder_pow));
    t.insert("torch.Tensor.__rpow__", dunder_scalar(ops::rpow_scalar));
    t.insert("torch.Tensor.__rdiv__", dunder_scalar(ops::rdiv_scalar));
    t.insert(
        "torch.Tensor.__rtruediv__",
        dunder_scalar(ops::rtruediv_scalar),
    );

    // ----- matmul family ------------------------------------------------------------------
    t.insert("torch.mm", binary(ops::mm, ["input", "mat2"]));
    t.insert("torch.bmm", binary(ops::bmm, ["input", "mat2"]));
    t.insert("torch.matmul", binary(ops::matmul, ["input", "other"]));
    t.insert("torch.mv", binary(ops::mv, ["input", "vec"]));
    t.insert("torch.dot", binary(ops::dot, ["input", "tensor"]));
    t.insert("torch.Tensor.__matmul__", |args, kwargs| {
        let b = bind(args, kwargs, &["self", "other"], &[])?;
        one(ops::dunder_matmul(b.tensor("self")?, b.tensor("other")?))
    });
    t.insert(
        "torch.addmm",
        beta_alpha(ops::addmm, ["input", "mat1", "mat2"]),
    );
    t.insert(
        "torch.addbmm",
        beta_alpha(ops::addbmm, ["input", "batch1", "batch2"]),
    );
    t.insert(
        "torch.baddbmm",
        beta_alpha(ops::baddbmm, ["input", "batch1", "batch2"]),
    );
    t.insert(
        "torch.addmv",
        beta_alpha(ops::addmv, ["input", "mat", "vec"]),
    );
    t.insert(
        "torch.addr",
        beta_alpha(ops::addr, ["input", "vec1", "vec2"]),
    );
    t.insert("torch.nn.functional.linear", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "weight", "bias"], &[])?;
        one(ops::linear(
            b.tensor("input")?,
            b.tensor("weight")?,
            b.opt_tensor("bias")?,
        ))
    });
    // The vectors reach both documented ops through `torch.linalg.multi_dot(tensors)`
    // (`torch.chain_matmul(*matrices)` is its deprecated varargs form); each op runs the
    // workspace function of its own name on the same list of matrices.
    t.insert_for(
        "torch.linalg.multi_dot",
        &["chain_matmul"],
        |args, kwargs| {
            let b = bind(args, kwargs, &["tensors"], &["out"])?;
            b.unsupported_unless_none("out")?;
            one(ops::chain_matmul(&b.tensors("tensors")?))
        },
    );
    t.insert_for("torch.linalg.multi_dot", &["multi_dot"], |args, kwargs| {
        let b = bind(args, kwargs, &["tensors"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::multi_dot(&b.tensors("tensors")?))
    });

    // ----- reductions ---------------------------------------------------------------------
    t.insert("torch.sum", reduce_dims(ops::sum));
    t.insert("torch.mean", reduce_dims(ops::mean));
    t.insert("torch.prod", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "dim", "keepdim"],
            &["dtype", "out"],
        )?;
        b.unsupported_unless_none("out")?;
        let dim = b
            .get("dim")
            .map(|d| d.int().map_err(|e| format!("`dim`: {e}")))
            .transpose()?;
        one(ops::prod(
            b.tensor("input")?,
            dim,
            b.bool_or("keepdim", false)?,
            b.dtype("dtype")?,
        ))
    });
    t.insert("torch.cumsum", scan(ops::cumsum));
    t.insert("torch.cumprod", scan(ops::cumprod));
    // torch.norm(input, p='fro', dim=None, keepdim=False, out=None, dtype=None): a number
    // `p` (or 'fro' over at most two dims) is the vector norm over `dim`.
    t.insert("torch.norm", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "p", "dim", "keepdim", "out", "dtype"],
            &[],
        )?;
        b.unsupported_unless_none("out")?;
        b.unsupported_unless_none("dtype")?;
        let dims = b.dims("dim")?;
        let p = match b.get("p") {
            None => 2.0,
            Some(Arg::Str(s)) if s == "fro" && dims.len() <= 2 => 2.0,
            Some(Arg::Str(s)) => return Err(format!("`p={s:?}` is not supported")),
            Some(a) => a.float().map_err(|e| format!("`p`: {e}"))?,
        };
        one(ops::norm(
            b.tensor("input")?,
            p,
            &dims,
            b.bool_or("keepdim", false)?,
        ))
    });

    // ----- softmax, normalisation -----------------------------------------------------------
    t.insert("torch.softmax", softmax_like(ops::softmax, false));
    t.insert("torch.log_softmax", softmax_like(ops::log_softmax, false));
    t.insert(
        "torch.nn.functional.softmin",
        softmax_like(ops::softmin, true),
    );
    t.insert("torch.nn.functional.layer_norm", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "normalized_shape", "weight", "bias", "eps"],
            &[],
        )?;
        let shape = b
            .req("normalized_shape")?
            .ints()
            .map_err(|e| format!("`normalized_shape`: {e}"))?;
        one(ops::layer_norm(
            b.tensor("input")?,
            &usizes(shape, "normalized_shape")?,
            b.opt_tensor("weight")?,
            b.opt_tensor("bias")?,
            b.f64_or("eps", 1e-5)?,
        ))
    });

    // ----- views and data movement ------------------------------------------------------------
    t.insert("torch.reshape", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "shape"], &[])?;
        let shape = b
            .req("shape")?
            .ints()
            .map_err(|e| format!("`shape`: {e}"))?;
        one(ops::reshape(b.tensor("input")?, shape))
    });
    t.insert("torch.transpose", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "dim0", "dim1"], &[])?;
        one(ops::transpose(
            b.tensor("input")?,
            b.int("dim0")?,
            b.int("dim1")?,
        ))
    });
    t.insert("torch.cat", |args, kwargs| {
        let b = bind(args, kwargs, &["tensors", "dim"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::cat(&b.tensors("tensors")?, b.int_or("dim", 0)?))
    });
    t.insert("torch.stack", |args, kwargs| {
        let b = bind(args, kwargs, &["tensors", "dim"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::stack(&b.tensors("tensors")?, b.int_or("dim", 0)?))
    });
    t.insert("torch.index_copy", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "dim", "index", "source"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::index_copy(
            b.tensor("input")?,
            b.int("dim")?,
            b.tensor("index")?,
            b.tensor("source")?,
        ))
    });
    t.insert("torch.scatter_add", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "dim", "index", "src"], &["out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::scatter_add(
            b.tensor("input")?,
            b.int("dim")?,
            b.tensor("index")?,
            b.tensor("src")?,
        ))
    });
    t.insert("torch.nn.functional.embedding", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "weight",
                "padding_idx",
                "max_norm",
                "norm_type",
                "scale_grad_by_freq",
                "sparse",
            ],
            &[],
        )?;
        b.unsupported_unless_none("max_norm")?;
        b.unsupported_unless("norm_type", &Arg::Float(2.0))?;
        b.unsupported_unless("scale_grad_by_freq", &Arg::Bool(false))?;
        b.unsupported_unless("sparse", &Arg::Bool(false))?;
        let padding_idx = b
            .get("padding_idx")
            .map(|a| a.int().map_err(|e| format!("`padding_idx`: {e}")))
            .transpose()?;
        one(ops::embedding_padded(
            b.tensor("weight")?,
            b.tensor("input")?,
            padding_idx,
        ))
    });

    // ----- activations ------------------------------------------------------------------------
    t.insert("torch.nn.functional.gelu", |args, kwargs| {
        let b = bind(args, kwargs, &["input"], &["approximate"])?;
        match b.str_or("approximate", "none")? {
            "none" => one(ops::gelu(b.tensor("input")?)),
            other => Err(format!("`approximate={other:?}` is not supported")),
        }
    });
    t.insert("torch.nn.functional.softplus", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "beta", "threshold"], &[])?;
        one(ops::softplus(
            b.tensor("input")?,
            b.f64_or("beta", 1.0)?,
            b.f64_or("threshold", 20.0)?,
        ))
    });

    // ----- losses -------------------------------------------------------------------------------
    type Pair = fn(&Tensor, &Tensor, Reduction) -> amp::autograd::Result<Tensor>;
    for (call, f) in [
        ("torch.nn.functional.mse_loss", ops::mse_loss as Pair),
        ("torch.nn.functional.l1_loss", ops::l1_loss as Pair),
    ] {
        t.insert(call, move |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "input",
                    "target",
                    "size_average",
                    "reduce",
                    "reduction",
                    "weight",
                ],
                &[],
            )?;
            legacy_reduction(&b)?;
            b.unsupported_unless_none("weight")?;
            one(f(
                b.tensor("input")?,
                b.tensor("target")?,
                b.reduction("reduction")?,
            ))
        });
    }
    t.insert("torch.nn.functional.smooth_l1_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "target",
                "size_average",
                "reduce",
                "reduction",
                "beta",
            ],
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::smooth_l1_loss(
            b.tensor("input")?,
            b.tensor("target")?,
            b.reduction("reduction")?,
            b.f64_or("beta", 1.0)?,
        ))
    });
    t.insert("torch.nn.functional.nll_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "target",
                "weight",
                "size_average",
                "ignore_index",
                "reduce",
                "reduction",
            ],
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::nll_loss(
            b.tensor("input")?,
            b.tensor("target")?,
            b.opt_tensor("weight")?,
            b.int_or("ignore_index", -100)?,
            b.reduction("reduction")?,
        ))
    });
    t.insert("torch.nn.functional.cross_entropy", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "target",
                "weight",
                "size_average",
                "ignore_index",
                "reduce",
                "reduction",
                "label_smoothing",
            ],
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::cross_entropy(
            b.tensor("input")?,
            b.tensor("target")?,
            b.opt_tensor("weight")?,
            b.int_or("ignore_index", -100)?,
            b.reduction("reduction")?,
            b.f64_or("label_smoothing", 0.0)?,
        ))
    });
    t.insert(
        "torch.nn.functional.binary_cross_entropy",
        |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "input",
                    "target",
                    "weight",
                    "size_average",
                    "reduce",
                    "reduction",
                ],
                &[],
            )?;
            legacy_reduction(&b)?;
            one(ops::binary_cross_entropy(
                b.tensor("input")?,
                b.tensor("target")?,
                b.opt_tensor("weight")?,
                b.reduction("reduction")?,
            ))
        },
    );
    t.insert(
        "torch.nn.functional.binary_cross_entropy_with_logits",
        |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "input",
                    "target",
                    "weight",
                    "size_average",
                    "reduce",
                    "reduction",
                    "pos_weight",
                ],
                &[],
            )?;
            legacy_reduction(&b)?;
            one(ops::binary_cross_entropy_with_logits(
                b.tensor("input")?,
                b.tensor("target")?,
                b.opt_tensor("weight")?,
                b.opt_tensor("pos_weight")?,
                b.reduction("reduction")?,
            ))
        },
    );

    conv::register(&mut t);
    extra::register(&mut t);
    linalg::register(&mut t);
    pool::register(&mut t);
    t
}

type Addcx = fn(&Tensor, &Tensor, &Tensor, f64) -> amp::autograd::Result<Tensor>;

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
        let e = run("torch.exp", "exp", &[x.clone(), x.clone()], &K::default()).unwrap_err();
        assert_eq!(
            e,
            "takes at most 1 positional arguments (input), but 2 were given"
        );
        let e = run(
            "torch.exp",
            "exp",
            std::slice::from_ref(&x),
            &kw(vec![("alpha", Arg::Int(1))]),
        )
        .unwrap_err();
        assert_eq!(e, "unexpected keyword argument `alpha`");
        let e = run(
            "torch.exp",
            "exp",
            std::slice::from_ref(&x),
            &kw(vec![("input", x.clone())]),
        )
        .unwrap_err();
        assert_eq!(e, "got multiple values for argument `input`");
        // Keyword form of a positional parameter.
        let y = values(run(
            "torch.neg",
            "neg",
            &[],
            &kw(vec![("input", x.clone())]),
        ));
        assert_eq!(y, [-1.0, -2.0]);
        let e = run("torch.neg", "neg", &[], &K::default()).unwrap_err();
        assert_eq!(e, "missing required argument `input`");
    }

    #[test]
    fn unsupported_values_fail_and_defaults_pass() {
        let x = t(&[1.0, -2.0], &[2]);
        let e = run(
            "torch.nn.functional.gelu",
            "gelu",
            std::slice::from_ref(&x),
            &kw(vec![("approximate", Arg::Str("tanh".into()))]),
        )
        .unwrap_err();
        assert_eq!(e, "`approximate=\"tanh\"` is not supported");
        assert!(run(
            "torch.nn.functional.gelu",
            "gelu",
            std::slice::from_ref(&x),
            &kw(vec![("approximate", Arg::Str("none".into()))]),
        )
        .is_ok());
        let e = run(
            "torch.div",
            "div",
            &[x.clone(), x.clone()],
            &kw(vec![("rounding_mode", Arg::Str("floor".into()))]),
        )
        .unwrap_err();
        assert_eq!(e, "`rounding_mode=\"floor\"` is not supported");
        let idx = Arg::Tensor(Tensor::from_vec(vec![0i64, 1], [2]).unwrap());
        let w = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let e = run(
            "torch.nn.functional.embedding",
            "embedding",
            &[idx.clone(), w.clone(), Arg::Int(0), Arg::Float(1.0)],
            &K::default(),
        )
        .unwrap_err();
        assert_eq!(e, "`max_norm=1.0` is not supported");
        let padded = run(
            "torch.nn.functional.embedding",
            "embedding",
            &[idx.clone(), w.clone(), Arg::Int(0)],
            &K::default(),
        );
        assert_eq!(values(padded), [1.0, 2.0, 3.0, 4.0]);
        let ok = run(
            "torch.nn.functional.embedding",
            "embedding",
            &[idx, w],
            &kw(vec![
                ("norm_type", Arg::Int(2)),
                ("sparse", Arg::Bool(false)),
            ]),
        );
        assert_eq!(values(ok), [1.0, 2.0, 3.0, 4.0]);
        let e = run(
            "torch.nn.functional.mse_loss",
            "mse_loss",
            &[x.clone(), x.clone()],
            &kw(vec![("size_average", Arg::Bool(true))]),
        )
        .unwrap_err();
        assert_eq!(e, "`size_average=true` is not supported");
    }

    #[test]
    fn scalars_alpha_and_dtype() {
        let x = t(&[1.0, 2.0], &[2]);
        let y = values(run(
            "torch.add",
            "add",
            &[x.clone(), Arg::Int(2)],
            &kw(vec![("alpha", Arg::Int(3))]),
        ));
        assert_eq!(y, [7.0, 8.0]);
        let y = values(run(
            "torch.sub",
            "sub",
            &[x.clone(), x.clone()],
            &kw(vec![("alpha", Arg::Float(0.5))]),
        ));
        assert_eq!(y, [0.5, 1.0]);
        let out = run(
            "torch.sum",
            "sum",
            std::slice::from_ref(&x),
            &kw(vec![("dtype", Arg::Str("float32".into()))]),
        )
        .unwrap();
        let Output::Tensor(s) = out else { panic!() };
        assert_eq!(s.dtype(), DType::F32);
        assert_eq!(s.to_vec_f64(), [3.0]);
        let y = values(run(
            "torch.norm",
            "norm",
            &[t(&[3.0, 4.0], &[2])],
            &kw(vec![("p", Arg::Str("fro".into()))]),
        ));
        assert_eq!(y, [5.0]);
        let e = run(
            "torch.norm",
            "norm",
            &[x],
            &kw(vec![("p", Arg::Str("nuc".into()))]),
        )
        .unwrap_err();
        assert_eq!(e, "`p=\"nuc\"` is not supported");
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
        let y = values(run(
            "torch.linalg.multi_dot",
            "multi_dot",
            std::slice::from_ref(&list),
            &K::default(),
        ));
        assert_eq!(y, [5.0]);
        assert!(run(
            "torch.linalg.multi_dot",
            "chain_matmul",
            &[list],
            &K::default()
        )
        .is_err());
    }
}
