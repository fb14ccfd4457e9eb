//! Tensor literals of the `amp-vectors/1` format and their conversion to
//! [`amp::tensor::Tensor`].
//!
//! A literal is `{"dtype": "float32", "shape": [2, 3], "data": [...], "requires_grad": true}`
//! with `data` flat and row-major. Floats are JSON numbers or the strings `"inf"`, `"-inf"`,
//! `"nan"`. Every number is exactly representable in its dtype (the vectors printed it from
//! that dtype), so the conversion is bit-exact: each number is read as an `f64` (integers as
//! `i64`) and converted with the dtype's cast.

use std::fmt;

use amp::tensor::{DType, Element, Tensor};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// One element of a tensor literal's `data`, as written in the file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A JSON integer (`3`), kept exactly.
    Int(i64),
    /// A JSON float (`3.0`, `1e-5`) or one of the strings `"inf"`, `"-inf"`, `"nan"`.
    Float(f64),
    /// A JSON boolean (the data of a `bool` tensor).
    Bool(bool),
}

impl Number {
    /// The value cast to the element type `T` with PyTorch's cast semantics.
    pub fn cast<T: Element>(self) -> T {
        match self {
            Number::Int(i) => <i64 as Element>::cast::<T>(i),
            Number::Float(f) => <f64 as Element>::cast::<T>(f),
            Number::Bool(b) => <bool as Element>::cast::<T>(b),
        }
    }

    /// The value as `f64` (booleans are 0 and 1).
    pub fn to_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
            Number::Bool(b) => u8::from(b) as f64,
        }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) => f.write_str(&format_float(x)),
            Number::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A float as the vectors write it: shortest round-trip digits (`1.0`, `0.1`, `1e-40`), or
/// `nan`, `inf`, `-inf`.
pub fn format_float(x: f64) -> String {
    if x.is_nan() {
        "nan".to_owned()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else {
        format!("{x:?}")
    }
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a number, a boolean, or one of "inf", "-inf", "nan""#)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Number, E> {
                Ok(Number::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                Ok(Number::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                i64::try_from(v)
                    .map(Number::Int)
                    .map_err(|_| E::custom(format!("integer {v} does not fit int64")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                Ok(Number::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Number, E> {
                match v {
                    "inf" => Ok(Number::Float(f64::INFINITY)),
                    "-inf" => Ok(Number::Float(f64::NEG_INFINITY)),
                    "nan" => Ok(Number::Float(f64::NAN)),
                    other => Err(E::custom(format!(
                        r#"unknown float string "{other}" (expected "inf", "-inf" or "nan")"#
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a tensor literal is not valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// `dtype` is not one of the seven names of the format.
    #[error(
        "unknown dtype `{0}` (expected float16, bfloat16, float32, float64, int64, int32 or bool)"
    )]
    UnknownDType(String),
    /// `data` does not hold `shape`'s element count.
    #[error("shape {shape:?} holds {expected} elements, but data has {got}")]
    Length {
        /// The literal's shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements in `data`.
        got: usize,
    },
    /// A shape whose element count (or a stride) overflows.
    #[error("shape {0:?} has more elements than memory can hold")]
    ShapeOverflow(Vec<usize>),
    /// An element that the dtype cannot hold exactly.
    #[error("element {index} ({value}) is not a valid {dtype} value")]
    Element {
        /// Flat index of the element.
        index: usize,
        /// The element as written.
        value: String,
        /// The literal's dtype.
        dtype: DType,
    },
}

/// A tensor literal: dtype, shape, flat row-major data, and the `requires_grad` mark.
///
/// Constructed only valid (known dtype, `data` matching `shape`, every element exact in the
/// dtype), so [`TensorLit::to_tensor`] cannot fail.
///
/// ```
/// use amp::tensor::DType;
/// use conformance::value::{Number, TensorLit};
///
/// let lit: TensorLit = serde_json::from_str(
///     r#"{"dtype": "bfloat16", "shape": [3], "data": [1.0, "inf", -0.5]}"#,
/// ).unwrap();
/// let t = lit.to_tensor();
/// assert_eq!(t.dtype(), DType::BF16);
/// assert_eq!(t.to_vec_f64(), vec![1.0, f64::INFINITY, -0.5]);
/// assert!(TensorLit::new(DType::I32, vec![1], vec![Number::Float(0.5)]).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawTensorLit")]
pub struct TensorLit {
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<Number>,
    requires_grad: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensorLit {
    dtype: String,
    shape: Vec<usize>,
    data: Vec<Number>,
    #[serde(default)]
    requires_grad: bool,
}

impl TryFrom<RawTensorLit> for TensorLit {
    type Error = ValueError;
    fn try_from(raw: RawTensorLit) -> Result<Self, ValueError> {
        let dtype = parse_dtype(&raw.dtype)?;
        Ok(TensorLit::new(dtype, raw.shape, raw.data)?.with_requires_grad(raw.requires_grad))
    }
}

/// The dtype named exactly as the format writes it (`float32`, not `float` or `torch.float32`).
pub fn parse_dtype(name: &str) -> Result<DType, ValueError> {
    DType::ALL
        .into_iter()
        .find(|d| d.as_str() == name)
        .ok_or_else(|| ValueError::UnknownDType(name.to_owned()))
}

fn valid_element(dtype: DType, n: Number) -> bool {
    match (dtype, n) {
        (DType::Bool, Number::Bool(_)) => true,
        (DType::I64, Number::Int(_)) => true,
        (DType::I32, Number::Int(i)) => i32::try_from(i).is_ok(),
        (DType::F64, Number::Float(_)) => true,
        // An integer written for a float dtype: exact in f64 and in the dtype.
        (_, Number::Int(i)) if dtype.is_floating_point() => {
            i.unsigned_abs() <= 1 << 53 && round_trips(dtype, i as f64)
        }
        (_, Number::Float(f)) if dtype.is_floating_point() => round_trips(dtype, f),
        _ => false,
    }
}

/// Whether `v` survives a cast to `dtype` and back unchanged (NaN counts as surviving).
fn round_trips(dtype: DType, v: f64) -> bool {
    let back = amp::tensor::with_dtype!(dtype, T => <f64 as Element>::cast::<T>(v).to_f64());
    back == v || (v.is_nan() && back.is_nan())
}

impl TensorLit {
    /// A literal, checked: `data` must hold `shape`'s element count and every element must be
    /// exactly representable in `dtype` (integers for int dtypes, booleans for `bool`).
    pub fn new(
        dtype: DType,
        shape: Vec<usize>,
        data: Vec<Number>,
    ) -> Result<TensorLit, ValueError> {
        // Strides multiply the non-zero dimensions: their product must fit as well.
        let span = shape
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= isize::MAX as usize);
        let Some(span) = span else {
            return Err(ValueError::ShapeOverflow(shape));
        };
        let expected = if shape.contains(&0) { 0 } else { span };
        if expected != data.len() {
            return Err(ValueError::Length {
                shape,
                expected,
                got: data.len(),
            });
        }
        if let Some(index) = data.iter().position(|&n| !valid_element(dtype, n)) {
            return Err(ValueError::Element {
                index,
                value: data[index].to_string(),
                dtype,
            });
        }
        Ok(TensorLit {
            dtype,
            shape,
            data,
            requires_grad: false,
        })
    }

    /// The same literal with the `requires_grad` mark set to `requires_grad`.
    pub fn with_requires_grad(mut self, requires_grad: bool) -> TensorLit {
        self.requires_grad = requires_grad;
        self
    }

    /// The literal's dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The literal's shape (`[]` is a 0-dim tensor with one element).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The flat, row-major elements.
    pub fn data(&self) -> &[Number] {
        &self.data
    }

    /// Whether the argument is marked `requires_grad` (the grad suite differentiates it).
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// The tensor of exactly this dtype, shape and values (bit-exact).
    pub fn to_tensor(&self) -> Tensor {
        let shape = self.shape.clone();
        amp::tensor::with_dtype!(self.dtype, T => {
            let v: Vec<T> = self.data.iter().map(|n| n.cast::<T>()).collect();
            Tensor::from_vec(v, shape)
        })
        .expect("a checked literal's data matches its shape")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amp::tensor::half::{bf16, f16};

    fn lit(json: &str) -> Result<TensorLit, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn specials_and_exact_values() {
        let t = lit(
            r#"{"dtype": "float16", "shape": [2, 2], "data": ["inf", "-inf", "nan", 65504.0]}"#,
        )
        .unwrap()
        .to_tensor();
        let v = t.to_vec::<f16>().unwrap();
        assert_eq!(v[0], f16::INFINITY);
        assert_eq!(v[1], f16::NEG_INFINITY);
        assert!(v[2].is_nan());
        assert_eq!(v[3], f16::MAX);
        let b = lit(r#"{"dtype": "bfloat16", "shape": [], "data": [1.0078125]}"#).unwrap();
        assert_eq!(
            b.to_tensor().to_vec::<bf16>().unwrap(),
            vec![bf16::from_f32(1.0078125)]
        );
    }

    #[test]
    fn int64_is_exact() {
        let t = lit(
            r#"{"dtype": "int64", "shape": [2], "data": [9007199254740993, -9223372036854775808]}"#,
        )
        .unwrap()
        .to_tensor();
        assert_eq!(
            t.to_vec::<i64>().unwrap(),
            vec![9_007_199_254_740_993, i64::MIN]
        );
    }

    #[test]
    fn rejects_bad_literals() {
        assert!(lit(r#"{"dtype": "float", "shape": [1], "data": [1.0]}"#).is_err());
        assert!(lit(r#"{"dtype": "float32", "shape": [2], "data": [1.0]}"#).is_err());
        assert!(lit(r#"{"dtype": "int32", "shape": [1], "data": [3000000000]}"#).is_err());
        assert!(lit(r#"{"dtype": "int64", "shape": [1], "data": [1.5]}"#).is_err());
        // 0.1 is not a bfloat16 value: the file must have printed it from that dtype.
        assert!(lit(r#"{"dtype": "bfloat16", "shape": [1], "data": [0.1]}"#).is_err());
        assert!(lit(r#"{"dtype": "float32", "shape": [1], "data": ["Infinity"]}"#).is_err());
        assert!(lit(r#"{"dtype": "float32", "shape": [1], "data": [1.0], "grad": true}"#).is_err());
    }

    #[test]
    fn formats_like_the_vectors() {
        assert_eq!(format_float(1.0), "1.0");
        assert_eq!(format_float(1.0009765625), "1.0009765625");
        assert_eq!(format_float(-0.0), "-0.0");
        assert_eq!(format_float(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_float(f64::NAN), "nan");
    }
}
