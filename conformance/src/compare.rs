//! The comparison rule of the format.
//!
//! A result `x` matches an expected tensor `y` when the dtypes and shapes are equal and then,
//! element by element, `|x - y| <= atol + rtol * |y|`, where NaN matches only NaN and an
//! infinity only the same infinity. Without `rtol`/`atol` the comparison is exact: bitwise
//! equal in the dtype (so `-0.0` differs from `0.0`), any NaN matching any NaN.
//!
//! ```
//! use amp::tensor::{DType, Tensor};
//! use conformance::compare::{compare, Tolerance};
//!
//! let got = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap().to_dtype(DType::BF16).unwrap();
//! let want = Tensor::from_vec(vec![1.0f32, 2.015625], [2]).unwrap().to_dtype(DType::BF16).unwrap();
//! let m = compare("output", &got, &want, None).unwrap_err();
//! assert_eq!(m.to_string(), "element 1 of output: got 2.0 (bfloat16), expected 2.015625 (exact)");
//! assert!(compare("output", &got, &want, Some(Tolerance::new(0.01, 0.0))).is_ok());
//! ```

use std::fmt;

use amp::tensor::{DType, Tensor};

use crate::value::format_float;

/// `rtol` and `atol` of a comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance (times `|expected|`).
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Tolerance {
    /// A tolerance.
    pub const fn new(rtol: f64, atol: f64) -> Tolerance {
        Tolerance { rtol, atol }
    }

    /// The tolerance of a case that gives `rtol` and/or `atol` (a missing one is 0);
    /// `None`, exact comparison, when it gives neither.
    pub fn from_options(rtol: Option<f64>, atol: Option<f64>) -> Option<Tolerance> {
        match (rtol, atol) {
            (None, None) => None,
            (r, a) => Some(Tolerance::new(r.unwrap_or(0.0), a.unwrap_or(0.0))),
        }
    }
}

/// One element value, for messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Elem {
    /// A floating-point element (exact as `f64`).
    Float(f64),
    /// An integer element.
    Int(i64),
    /// A boolean element.
    Bool(bool),
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Elem::Float(x) => f.write_str(&format_float(x)),
            Elem::Int(i) => write!(f, "{i}"),
            Elem::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// The first difference between a result and its expectation.
#[derive(Debug, Clone, PartialEq)]
pub enum Mismatch {
    /// Different dtypes.
    DType {
        /// What was compared (`output`, `grads[1]`).
        what: String,
        /// The result's dtype.
        got: DType,
        /// The expected dtype.
        expected: DType,
    },
    /// Different shapes.
    Shape {
        /// What was compared.
        what: String,
        /// The result's shape.
        got: Vec<usize>,
        /// The expected shape.
        expected: Vec<usize>,
    },
    /// The first element outside the tolerance.
    Element {
        /// What was compared.
        what: String,
        /// Flat row-major index.
        index: usize,
        /// The result's element.
        got: Elem,
        /// The expected element.
        expected: Elem,
        /// The dtype of both.
        dtype: DType,
        /// The tolerance used (`None`: exact).
        tolerance: Option<Tolerance>,
    },
    /// A different number of tensors (an op returning one tensor where a tuple is expected).
    Count {
        /// What was compared.
        what: String,
        /// Tensors returned.
        got: usize,
        /// Tensors expected.
        expected: usize,
    },
    /// No tensor (no gradient) where one is expected.
    Missing {
        /// What was compared.
        what: String,
    },
    /// A nonzero tensor where the vector expects none (`null`: no gradient; zeros pass).
    Unexpected {
        /// What was compared.
        what: String,
        /// The first nonzero element.
        index: usize,
        /// Its value.
        got: Elem,
    },
}

fn of(what: &str) -> String {
    if what.is_empty() {
        String::new()
    } else {
        format!(" of {what}")
    }
}

fn fmt_tol(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:?}")
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::DType {
                what,
                got,
                expected,
            } => write!(f, "dtype{}: got {got}, expected {expected}", of(what)),
            Mismatch::Shape {
                what,
                got,
                expected,
            } => write!(f, "shape{}: got {got:?}, expected {expected:?}", of(what)),
            Mismatch::Element {
                what,
                index,
                got,
                expected,
                dtype,
                tolerance,
            } => {
                write!(
                    f,
                    "element {index}{}: got {got} ({dtype}), expected {expected} (",
                    of(what)
                )?;
                match tolerance {
                    Some(t) => write!(f, "atol {}, rtol {})", fmt_tol(t.atol), fmt_tol(t.rtol)),
                    None => f.write_str("exact)"),
                }
            }
            Mismatch::Count {
                what,
                got,
                expected,
            } => write!(
                f,
                "number of tensors{}: got {got}, expected {expected}",
                of(what)
            ),
            Mismatch::Missing { what } => {
                write!(f, "{}: missing, expected a tensor", label(what))
            }
            Mismatch::Unexpected { what, index, got } => write!(
                f,
                "{}: expected no gradient (null or zeros), got {got} at element {index}",
                label(what)
            ),
        }
    }
}

fn label(what: &str) -> &str {
    if what.is_empty() {
        "value"
    } else {
        what
    }
}

impl std::error::Error for Mismatch {}

/// Whether `got` matches `expected` under the format's rule (`tolerance: None` is exact).
///
/// ```
/// use conformance::compare::{element_matches, Tolerance};
/// let t = Some(Tolerance::new(0.0, 0.5));
/// assert!(element_matches(1.25, 1.0, t));
/// assert!(!element_matches(f64::NAN, 1.0, t));
/// assert!(element_matches(f64::NAN, f64::NAN, None));
/// assert!(!element_matches(f64::INFINITY, f64::NEG_INFINITY, t));
/// assert!(!element_matches(-0.0, 0.0, None));
/// ```
pub fn element_matches(got: f64, expected: f64, tolerance: Option<Tolerance>) -> bool {
    if expected.is_nan() {
        return got.is_nan();
    }
    match tolerance {
        // Every dtype's values are exact in f64 and the conversion is injective (it keeps
        // the sign of zero), so equal f64 bits are equal bits in the dtype.
        None => got.to_bits() == expected.to_bits(),
        Some(_) if expected.is_infinite() => got == expected,
        Some(t) => (got - expected).abs() <= t.atol + t.rtol * expected.abs(),
    }
}

/// Compares a result with its expectation; `what` names it in the mismatch (`output`,
/// `grads[0]`). Checks dtype, then shape, then every element in row-major order.
pub fn compare(
    what: &str,
    got: &Tensor,
    expected: &Tensor,
    tolerance: Option<Tolerance>,
) -> Result<(), Mismatch> {
    if got.dtype() != expected.dtype() {
        return Err(Mismatch::DType {
            what: what.to_owned(),
            got: got.dtype(),
            expected: expected.dtype(),
        });
    }
    if got.dims() != expected.dims() {
        return Err(Mismatch::Shape {
            what: what.to_owned(),
            got: got.dims().to_vec(),
            expected: expected.dims().to_vec(),
        });
    }
    let dtype = got.dtype();
    let element = |index, g, e| Mismatch::Element {
        what: what.to_owned(),
        index,
        got: g,
        expected: e,
        dtype,
        tolerance,
    };
    match dtype {
        DType::Bool => {
            let (g, e) = (got.to_vec_as::<bool>(), expected.to_vec_as::<bool>());
            match g.iter().zip(&e).position(|(a, b)| a != b) {
                Some(i) => Err(element(i, Elem::Bool(g[i]), Elem::Bool(e[i]))),
                None => Ok(()),
            }
        }
        DType::I32 | DType::I64 => {
            let (g, e) = (got.to_vec_as::<i64>(), expected.to_vec_as::<i64>());
            let ok = |a: i64, b: i64| match tolerance {
                None => a == b,
                Some(_) => element_matches(a as f64, b as f64, tolerance),
            };
            match g.iter().zip(&e).position(|(&a, &b)| !ok(a, b)) {
                Some(i) => Err(element(i, Elem::Int(g[i]), Elem::Int(e[i]))),
                None => Ok(()),
            }
        }
        _ => {
            let (g, e) = (got.to_vec_f64(), expected.to_vec_f64());
            match g
                .iter()
                .zip(&e)
                .position(|(&a, &b)| !element_matches(a, b, tolerance))
            {
                Some(i) => Err(element(i, Elem::Float(g[i]), Elem::Float(e[i]))),
                None => Ok(()),
            }
        }
    }
}

/// `Ok` when every element of `t` is zero (NaN is not zero); else the first nonzero one, as
/// a [`Mismatch::Unexpected`] naming `what`.
pub fn all_zero(what: &str, t: &Tensor) -> Result<(), Mismatch> {
    let v = t.to_vec_f64();
    match v.iter().position(|&x| x != 0.0) {
        None => Ok(()),
        Some(index) => Err(Mismatch::Unexpected {
            what: what.to_owned(),
            index,
            got: match t.dtype() {
                DType::Bool => Elem::Bool(true),
                DType::I32 | DType::I64 => Elem::Int(t.to_vec_as::<i64>()[index]),
                _ => Elem::Float(v[index]),
            },
        }),
    }
}
