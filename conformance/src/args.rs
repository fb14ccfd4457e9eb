//! The arguments an op receives from a vector, and what it returns.
//!
//! A vector's `args` and `kwargs` follow the PyTorch signature of its `call`: numbers,
//! booleans, strings, `null`, lists, and tensors. [`Arg<T>`] is one such argument with its
//! tensors of type `T`: [`TensorLit`] as read from the file, the
//! backend's tensor type when an op runs. The accessors return `Err(String)` with a message
//! naming what was expected, so an op entry reads its arguments with `?`.

use std::fmt;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::Value;

use crate::value::TensorLit;

/// One positional or keyword argument.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg<T> {
    /// JSON `null` (Python `None`).
    None,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (`"mean"`, `"reflect"`, ...).
    Str(String),
    /// A tensor.
    Tensor(T),
    /// A list (of ints, of tensors, ...), possibly nested.
    List(Vec<Arg<T>>),
}

impl<T> Arg<T> {
    /// The same argument with every tensor converted by `f`, visited depth-first in order
    /// (the tensors inside a list come in list order), the order the grad suite uses for
    /// `grads`.
    pub fn try_map<U, E>(&self, f: &mut impl FnMut(&T) -> Result<U, E>) -> Result<Arg<U>, E> {
        Ok(match self {
            Arg::None => Arg::None,
            Arg::Bool(b) => Arg::Bool(*b),
            Arg::Int(i) => Arg::Int(*i),
            Arg::Float(x) => Arg::Float(*x),
            Arg::Str(s) => Arg::Str(s.clone()),
            Arg::Tensor(t) => Arg::Tensor(f(t)?),
            Arg::List(items) => Arg::List(
                items
                    .iter()
                    .map(|a| a.try_map(f))
                    .collect::<Result<_, E>>()?,
            ),
        })
    }

    /// What kind of value this is, for messages: `None`, `bool`, `int`, `float`, `str`,
    /// `tensor`, `list`.
    pub fn kind(&self) -> &'static str {
        match self {
            Arg::None => "None",
            Arg::Bool(_) => "bool",
            Arg::Int(_) => "int",
            Arg::Float(_) => "float",
            Arg::Str(_) => "str",
            Arg::Tensor(_) => "tensor",
            Arg::List(_) => "list",
        }
    }

    fn expected(&self, what: &str) -> String {
        format!("expected {what}, got {}", self.kind())
    }

    /// `true` for `None`.
    pub fn is_none(&self) -> bool {
        matches!(self, Arg::None)
    }

    /// The tensor.
    pub fn tensor(&self) -> Result<&T, String> {
        match self {
            Arg::Tensor(t) => Ok(t),
            other => Err(other.expected("a tensor")),
        }
    }

    /// The tensor, or `None` for `None` (an optional tensor such as a bias).
    pub fn opt_tensor(&self) -> Result<Option<&T>, String> {
        match self {
            Arg::None => Ok(None),
            Arg::Tensor(t) => Ok(Some(t)),
            other => Err(other.expected("a tensor or None")),
        }
    }

    /// The tensors of a list of tensors.
    pub fn tensors(&self) -> Result<Vec<&T>, String> {
        match self {
            Arg::List(items) => items.iter().map(Arg::tensor).collect(),
            other => Err(other.expected("a list of tensors")),
        }
    }

    /// The integer.
    pub fn int(&self) -> Result<i64, String> {
        match self {
            Arg::Int(i) => Ok(*i),
            other => Err(other.expected("an int")),
        }
    }

    /// The number as `f64` (an int is accepted where Python accepts it for a float).
    pub fn float(&self) -> Result<f64, String> {
        match self {
            Arg::Float(x) => Ok(*x),
            Arg::Int(i) => Ok(*i as f64),
            other => Err(other.expected("a number")),
        }
    }

    /// The boolean.
    pub fn bool(&self) -> Result<bool, String> {
        match self {
            Arg::Bool(b) => Ok(*b),
            other => Err(other.expected("a bool")),
        }
    }

    /// The string.
    pub fn str(&self) -> Result<&str, String> {
        match self {
            Arg::Str(s) => Ok(s),
            other => Err(other.expected("a str")),
        }
    }

    /// A list of ints, or a single int as a one-element list (PyTorch's `int[]` arguments
    /// such as `kernel_size` accept both).
    pub fn ints(&self) -> Result<Vec<i64>, String> {
        match self {
            Arg::Int(i) => Ok(vec![*i]),
            Arg::List(items) => items.iter().map(Arg::int).collect(),
            other => Err(other.expected("an int or a list of ints")),
        }
    }
}

impl Arg<TensorLit> {
    /// An argument from its JSON form: an object is a tensor literal (it must have `dtype`,
    /// `shape` and `data`), an array a list, an integer an `Int`, any other number a `Float`.
    pub fn from_json(v: &Value) -> Result<Arg<TensorLit>, String> {
        Ok(match v {
            Value::Null => Arg::None,
            Value::Bool(b) => Arg::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Arg::Int(i),
                (None, _) if n.is_u64() => return Err(format!("integer {n} does not fit int64")),
                (None, Some(x)) => Arg::Float(x),
                (None, None) => return Err(format!("number {n} is not representable")),
            },
            Value::String(s) => Arg::Str(s.clone()),
            Value::Array(items) => Arg::List(
                items
                    .iter()
                    .map(Arg::from_json)
                    .collect::<Result<_, String>>()?,
            ),
            Value::Object(map) => {
                if !["dtype", "shape", "data"]
                    .iter()
                    .all(|k| map.contains_key(*k))
                {
                    return Err(
                        "an object argument must be a tensor literal (dtype, shape, data)".into(),
                    );
                }
                Arg::Tensor(TensorLit::deserialize(v).map_err(|e| e.to_string())?)
            }
        })
    }

    /// Every tensor literal, depth-first in argument order.
    pub fn literals(&self) -> Vec<&TensorLit> {
        let mut out = Vec::new();
        fn walk<'a>(a: &'a Arg<TensorLit>, out: &mut Vec<&'a TensorLit>) {
            match a {
                Arg::Tensor(t) => out.push(t),
                Arg::List(items) => items.iter().for_each(|i| walk(i, out)),
                _ => {}
            }
        }
        walk(self, &mut out);
        out
    }
}

impl<'de> Deserialize<'de> for Arg<TensorLit> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Arg::from_json(&v).map_err(de::Error::custom)
    }
}

/// Keyword arguments, in the order the vector lists them.
#[derive(Debug, Clone, PartialEq)]
pub struct Kwargs<T> {
    entries: Vec<(String, Arg<T>)>,
}

impl<T> Default for Kwargs<T> {
    fn default() -> Self {
        Kwargs {
            entries: Vec::new(),
        }
    }
}

impl<T> Kwargs<T> {
    /// Keyword arguments from `(name, value)` pairs.
    pub fn new(entries: Vec<(String, Arg<T>)>) -> Kwargs<T> {
        Kwargs { entries }
    }

    /// The argument called `name`.
    pub fn get(&self, name: &str) -> Option<&Arg<T>> {
        self.entries.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Every `(name, value)`, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arg<T>)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keyword arguments.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `Err` naming the first keyword not in `known`: an op entry calls this so that a
    /// keyword it does not handle fails the case instead of being ignored.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self
            .entries
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(format!("unexpected keyword argument `{k}`")),
            None => Ok(()),
        }
    }

    /// The same keywords with every tensor converted by `f` (see [`Arg::try_map`]).
    pub fn try_map<U, E>(&self, f: &mut impl FnMut(&T) -> Result<U, E>) -> Result<Kwargs<U>, E> {
        Ok(Kwargs {
            entries: self
                .entries
                .iter()
                .map(|(k, v)| Ok((k.clone(), v.try_map(f)?)))
                .collect::<Result<_, E>>()?,
        })
    }
}

impl<'de> Deserialize<'de> for Kwargs<TensorLit> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // serde_json's `preserve_order` (on in this workspace) keeps the file's order.
        let map = serde_json::Map::<String, Value>::deserialize(d)?;
        let entries = map
            .iter()
            .map(|(k, v)| {
                Arg::from_json(v)
                    .map(|a| (k.clone(), a))
                    .map_err(|e| de::Error::custom(format!("kwarg `{k}`: {e}")))
            })
            .collect::<Result<_, D::Error>>()?;
        Ok(Kwargs { entries })
    }
}

/// The parameter at positional `index` or keyword `name` (PyTorch lets most parameters be
/// given either way), or `None` when absent.
///
/// ```
/// use conformance::args::{param, Arg, Kwargs};
/// let args: Vec<Arg<()>> = vec![Arg::Int(1)];
/// let kwargs = Kwargs::new(vec![("dim".to_owned(), Arg::Int(0))]);
/// assert_eq!(param(&args, &kwargs, 1, "dim"), Some(&Arg::Int(0)));
/// assert_eq!(param(&args, &kwargs, 0, "input"), Some(&Arg::Int(1)));
/// assert_eq!(param(&args, &kwargs, 2, "keepdim"), None);
/// ```
pub fn param<'a, T>(
    args: &'a [Arg<T>],
    kwargs: &'a Kwargs<T>,
    index: usize,
    name: &str,
) -> Option<&'a Arg<T>> {
    args.get(index).or_else(|| kwargs.get(name))
}

/// The positional argument at `index`, or an error naming it.
pub fn positional<'a, T>(
    args: &'a [Arg<T>],
    index: usize,
    name: &str,
) -> Result<&'a Arg<T>, String> {
    args.get(index)
        .ok_or_else(|| format!("missing positional argument {index} (`{name}`)"))
}

/// What an op returns: one tensor, or several (PyTorch returns a tuple for `LSTMCell`).
#[derive(Debug, Clone, PartialEq)]
pub enum Output<T> {
    /// A single tensor.
    Tensor(T),
    /// A tuple or list of tensors.
    Tensors(Vec<T>),
}

impl<T> Output<T> {
    /// The tensors, in order (one for [`Output::Tensor`]).
    pub fn tensors(&self) -> Vec<&T> {
        match self {
            Output::Tensor(t) => vec![t],
            Output::Tensors(ts) => ts.iter().collect(),
        }
    }

    /// The tensors, by value.
    pub fn into_tensors(self) -> Vec<T> {
        match self {
            Output::Tensor(t) => vec![t],
            Output::Tensors(ts) => ts,
        }
    }

    /// `true` for [`Output::Tensors`].
    pub fn is_list(&self) -> bool {
        matches!(self, Output::Tensors(_))
    }

    /// The same structure with every tensor converted by `f`.
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&T) -> Result<U, E>) -> Result<Output<U>, E> {
        Ok(match self {
            Output::Tensor(t) => Output::Tensor(f(t)?),
            Output::Tensors(ts) => Output::Tensors(ts.iter().map(f).collect::<Result<_, E>>()?),
        })
    }
}

impl<'de> Deserialize<'de> for Output<TensorLit> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let lit = |v: &Value| TensorLit::deserialize(v).map_err(de::Error::custom);
        match &v {
            Value::Array(items) => Ok(Output::Tensors(
                items.iter().map(lit).collect::<Result<_, _>>()?,
            )),
            _ => Ok(Output::Tensor(lit(&v)?)),
        }
    }
}

impl<T> fmt::Display for Arg<T> {
    /// A short description (`tensor`, `2`, `"mean"`, `[int, int]`), for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::None => f.write_str("None"),
            Arg::Bool(b) => write!(f, "{b}"),
            Arg::Int(i) => write!(f, "{i}"),
            Arg::Float(x) => write!(f, "{x:?}"),
            Arg::Str(s) => write!(f, "{s:?}"),
            Arg::Tensor(_) => f.write_str("tensor"),
            Arg::List(items) => {
                f.write_str("[")?;
                for (i, a) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_argument_kind() {
        let v: Vec<Arg<TensorLit>> = serde_json::from_str(
            r#"[null, true, 2, 2.5, "mean", [1, 2],
                [{"dtype": "float32", "shape": [1], "data": [1.0], "requires_grad": true},
                 [{"dtype": "int64", "shape": [], "data": [3]}]]]"#,
        )
        .unwrap();
        assert!(v[0].is_none());
        assert!(v[1].bool().unwrap());
        assert_eq!(v[2].int().unwrap(), 2);
        assert_eq!(v[3].float().unwrap(), 2.5);
        assert_eq!(v[4].str().unwrap(), "mean");
        assert_eq!(v[5].ints().unwrap(), vec![1, 2]);
        let lits = v[6].literals();
        assert_eq!(lits.len(), 2);
        assert!(lits[0].requires_grad() && !lits[1].requires_grad());
        assert!(v[2]
            .tensor()
            .unwrap_err()
            .contains("expected a tensor, got int"));
        assert!(serde_json::from_str::<Arg<TensorLit>>(r#"{"a": 1}"#).is_err());
    }

    #[test]
    fn kwargs_keep_order_and_reject_unknown() {
        let k: Kwargs<TensorLit> =
            serde_json::from_str(r#"{"stride": 2, "padding": 1, "dim": 0}"#).unwrap();
        let names: Vec<&str> = k.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["stride", "padding", "dim"]);
        assert!(k.only(&["stride", "padding", "dim"]).is_ok());
        assert_eq!(
            k.only(&["stride"]).unwrap_err(),
            "unexpected keyword argument `padding`"
        );
    }

    #[test]
    fn try_map_is_depth_first() {
        let a: Arg<i32> = Arg::List(vec![
            Arg::Tensor(1),
            Arg::List(vec![Arg::Tensor(2)]),
            Arg::Tensor(3),
        ]);
        let mut seen = Vec::new();
        let b = a
            .try_map(&mut |t| {
                seen.push(*t);
                Ok::<_, ()>(t * 10)
            })
            .unwrap();
        assert_eq!(seen, [1, 2, 3]);
        assert_eq!(b.to_string(), "[tensor, [tensor], tensor]");
    }
}
