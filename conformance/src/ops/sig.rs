//! Binding a call's arguments to its PyTorch signature, and reading them typed.
//!
//! A signature is written as Python writes it, defaults included:
//! `"input, dim, index, src, *, !out=None"`. Parameters before `*` may be given by position
//! or by keyword, those after it only by keyword. A parameter written `!name=default` is one
//! the workspace does not support: the case fails unless it is absent or given its default
//! (`out=`, `size_average=`, `driver=`, ...), and the entry never sees it.
//!
//! [`Bound::call`] then hands the other parameters, in order, to a function whose
//! parameter types say how each is read ([`FromArg`]): `&Tensor`, `Option<&Tensor>`, `i64`,
//! `f64`, `bool`, `&str`, `Vec<i64>`, a [`Reduction`], ... A default from the signature
//! stands in for an absent (or `None`) argument, so most entries are one line:
//!
//! ```text
//! t.op("torch.scatter_add", "input, dim, index, src, *, !out=None", |b| b.call(ops::scatter_add));
//! ```

use amp::autograd::ops::{CdistMode, KlDivReduction, QrMode};
use amp::autograd::{Reduction, Tensor};
use amp::kernels::{GridMode, GridPadding};
use amp::tensor::{DType, Scalar};

use super::{A, K, R};
use crate::args::{Arg, Output};

/// One parameter of a [`Signature`].
#[derive(Debug, Clone)]
struct Param {
    name: String,
    /// The default (`None` also for a required parameter: neither may be read as a value).
    default: A,
    /// `!name=default`: only the default is supported.
    fixed: bool,
}

/// A PyTorch signature, written as Python writes it (`"input, dim=0, *, !out=None"`).
#[derive(Debug, Clone)]
pub struct Signature {
    params: Vec<Param>,
    /// How many parameters (the first ones) may be given by position.
    positional: usize,
}

/// A Python literal of a default: `None`, `True`, `False`, an int, a float or a quoted
/// string.
fn literal(s: &str) -> Option<A> {
    Some(match s {
        "None" => Arg::None,
        "True" => Arg::Bool(true),
        "False" => Arg::Bool(false),
        _ if s.len() >= 2 && (s.starts_with('\'') && s.ends_with('\'')) => {
            Arg::Str(s[1..s.len() - 1].to_owned())
        }
        _ => match s.parse::<i64>() {
            Ok(i) => Arg::Int(i),
            Err(_) => Arg::Float(s.parse().ok()?),
        },
    })
}

impl Signature {
    /// Parses `text` (`"input, p=2.0, *, !out=None"`); panics on a malformed one, which is
    /// a mistake in the table.
    pub fn parse(text: &str) -> Signature {
        let mut params = Vec::new();
        let mut positional = None;
        for word in text.split(',').map(str::trim) {
            if word == "*" {
                positional = Some(params.len());
                continue;
            }
            let (fixed, word) = match word.strip_prefix('!') {
                Some(w) => (true, w),
                None => (false, word),
            };
            let (name, default) = match word.split_once('=') {
                Some((n, d)) => (n.trim(), literal(d.trim())),
                None => (word, Some(Arg::None)),
            };
            let default = default.unwrap_or_else(|| panic!("bad default in `{text}`"));
            params.push(Param {
                name: name.to_owned(),
                default,
                fixed,
            });
        }
        let positional = positional.unwrap_or(params.len());
        Signature { params, positional }
    }

    /// Binds positional `args` and `kwargs` to the parameters, as Python does: too many
    /// positional arguments, an unknown keyword or a parameter given twice is an error;
    /// so is a value other than the default for a `!` parameter.
    pub fn bind<'a>(&'a self, args: &'a [A], kwargs: &'a K) -> Result<Bound<'a>, String> {
        if args.len() > self.positional {
            let names: Vec<&str> = self.params[..self.positional]
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            return Err(format!(
                "takes at most {} positional arguments ({}), but {} were given",
                self.positional,
                names.join(", "),
                args.len()
            ));
        }
        let mut values: Vec<Option<&A>> = vec![None; self.params.len()];
        for (slot, a) in values.iter_mut().zip(args) {
            *slot = Some(a);
        }
        for (k, v) in kwargs.iter() {
            let i = self
                .params
                .iter()
                .position(|p| p.name == k)
                .ok_or_else(|| format!("unexpected keyword argument `{k}`"))?;
            if values[i].is_some() {
                return Err(format!("got multiple values for argument `{k}`"));
            }
            values[i] = Some(v);
        }
        let b = Bound { sig: self, values };
        for p in self.params.iter().filter(|p| p.fixed) {
            match b.get(&p.name) {
                Some(a) if !same_value(a, &p.default) => {
                    return Err(format!("`{}={a}` is not supported", p.name))
                }
                _ => {}
            }
        }
        Ok(b)
    }

    /// The parameters an entry reads (all but the `!` ones), in order.
    fn taken(&self) -> impl Iterator<Item = &str> {
        self.params
            .iter()
            .filter(|p| !p.fixed)
            .map(|p| p.name.as_str())
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

/// The arguments of one call bound to the parameters of its [`Signature`].
pub struct Bound<'a> {
    sig: &'a Signature,
    values: Vec<Option<&'a A>>,
}

impl<'a> Bound<'a> {
    fn index(&self, name: &str) -> usize {
        self.sig
            .params
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("`{name}` is not a parameter of this signature"))
    }

    /// The argument as given, `None` when absent or given as `None`.
    pub fn get(&self, name: &str) -> Option<&'a A> {
        self.values[self.index(name)].filter(|a| !a.is_none())
    }

    /// A required argument as given.
    pub fn req(&self, name: &str) -> Result<&'a A, String> {
        self.get(name)
            .ok_or_else(|| format!("missing required argument `{name}`"))
    }

    /// The argument read as a `T`: as given, or the signature's default when absent or
    /// `None`.
    pub fn arg<T: FromArg<'a>>(&self, name: &str) -> Result<T, String> {
        let given = self.get(name);
        let default = &self.sig.params[self.index(name)].default;
        T::from_arg(name, given.or((!default.is_none()).then_some(default)))
    }

    /// Calls `f` with the signature's parameters (all but the `!` ones), in order, each
    /// read as the type `f` takes ([`Bound::arg`]).
    pub fn call<Args, F: Callable<'a, Args>>(&self, f: F) -> R {
        f.call_bound(self)
    }
}

/// How an argument is read as a Rust value, with the error messages of the op table
/// (`` `dim`: expected an int, got tensor ``).
pub trait FromArg<'a>: Sized {
    /// The value of parameter `name`: `arg` is the argument, or the default, or `None`
    /// when neither is there (or either is Python's `None`).
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String>;
}

/// The argument of a parameter that must have one.
pub(super) fn required<'a>(name: &str, arg: Option<&'a A>) -> Result<&'a A, String> {
    arg.ok_or_else(|| format!("missing required argument `{name}`"))
}

/// `FromArg` for types read by one of [`Arg`]'s accessors.
macro_rules! from_arg {
    ($($t:ty => $read:expr;)*) => {$(
        impl<'a> FromArg<'a> for $t {
            fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
                let read: fn(&'a A) -> Result<$t, String> = $read;
                read(required(name, arg)?).map_err(|e| format!("`{name}`: {e}"))
            }
        }
    )*};
}

from_arg! {
    &'a Tensor => Arg::tensor;
    i64 => Arg::int;
    f64 => Arg::float;
    bool => Arg::bool;
    &'a str => Arg::str;
    Vec<i64> => Arg::ints;
    Vec<f64> => |a| match a {
        Arg::List(items) => items.iter().map(Arg::float).collect(),
        a => Ok(vec![a.float()?]),
    };
    Vec<Tensor> => |a| Ok(a.tensors()?.into_iter().cloned().collect());
    Scalar => scalar;
}

/// A Python number as a [`Scalar`] (int, float or bool).
pub(super) fn scalar(a: &A) -> Result<Scalar, String> {
    match a {
        Arg::Int(i) => Ok(Scalar::Int(*i)),
        Arg::Float(x) => Ok(Scalar::Float(*x)),
        Arg::Bool(b) => Ok(Scalar::Bool(*b)),
        other => Err(format!("expected a number, got {}", other.kind())),
    }
}

/// Absent or `None`: `None`.
impl<'a, T: FromArg<'a>> FromArg<'a> for Option<T> {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        arg.map(|a| T::from_arg(name, Some(a))).transpose()
    }
}

/// A size: a non-negative int.
impl<'a> FromArg<'a> for usize {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        let v = i64::from_arg(name, arg)?;
        usize::try_from(v).map_err(|_| format!("`{name}`: negative {v}"))
    }
}

/// Sizes: an int or a list of ints, none negative.
impl<'a> FromArg<'a> for Vec<usize> {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        super::usizes(Vec::<i64>::from_arg(name, arg)?, name)
    }
}

/// A string parsed as `T`: the dtype of `dtype=` (`"float32"` or `"torch.float32"`) and
/// the modes (`reduction=`, `compute_mode=`, ...). The parse error is PyTorch's message.
macro_rules! parsed {
    ($($t:ty),*) => {$(
        impl<'a> FromArg<'a> for $t {
            fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
                <&str>::from_arg(name, arg)?.parse().map_err(|e| format!("{e}"))
            }
        }
    )*};
}

parsed!(
    DType,
    Reduction,
    KlDivReduction,
    CdistMode,
    QrMode,
    GridMode,
    GridPadding
);

/// What a workspace function returns, as an op's output.
pub trait IntoOutput {
    /// The output, or the error's message.
    fn into_output(self) -> R;
}

impl IntoOutput for R {
    fn into_output(self) -> R {
        self
    }
}

impl IntoOutput for amp::autograd::Result<Tensor> {
    fn into_output(self) -> R {
        self.map(Output::Tensor).map_err(super::err)
    }
}

impl IntoOutput for amp::autograd::Result<Vec<Tensor>> {
    fn into_output(self) -> R {
        self.map(Output::Tensors).map_err(super::err)
    }
}

impl IntoOutput for amp::autograd::Result<(Tensor, Tensor)> {
    fn into_output(self) -> R {
        self.map(|(a, b)| vec![a, b]).into_output()
    }
}

impl IntoOutput for amp::autograd::Result<(Tensor, Tensor, Tensor)> {
    fn into_output(self) -> R {
        self.map(|(a, b, c)| vec![a, b, c]).into_output()
    }
}

/// A function [`Bound::call`] can call: `Args` is the tuple of its parameter types, each
/// [`FromArg`], and it returns something [`IntoOutput`].
pub trait Callable<'a, Args> {
    /// Reads the arguments of `b` and calls the function.
    fn call_bound(&self, b: &Bound<'a>) -> R;
}

macro_rules! callable {
    ($($t:ident)*) => {
        impl<'a, F, X, $($t),*> Callable<'a, ($($t,)*)> for F
        where
            F: Fn($($t),*) -> X,
            X: IntoOutput,
            $($t: FromArg<'a>,)*
        {
            #[allow(non_snake_case)]
            fn call_bound(&self, b: &Bound<'a>) -> R {
                let arity = [$(stringify!($t)),*].len();
                let names: Vec<&str> = b.sig.taken().collect();
                assert_eq!(names.len(), arity, "{names:?} do not fit the function");
                let mut names = names.into_iter();
                $(let $t = b.arg::<$t>(names.next().unwrap_or_default())?;)*
                self($($t),*).into_output()
            }
        }
    };
}

callable!(T1);
callable!(T1 T2);
callable!(T1 T2 T3);
callable!(T1 T2 T3 T4);
callable!(T1 T2 T3 T4 T5);
callable!(T1 T2 T3 T4 T5 T6);
callable!(T1 T2 T3 T4 T5 T6 T7);
callable!(T1 T2 T3 T4 T5 T6 T7 T8);
