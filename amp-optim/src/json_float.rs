//! Floats in JSON that keep NaN and the infinities.
//!
//! JSON numbers cannot be NaN or infinite, and `serde_json` writes such a value as
//! `null`, which does not read back as a float: a checkpoint of a run whose scale or
//! state went non-finite could not be loaded. Here a finite value is a JSON number as
//! before, and a non-finite one is the string `"NaN"`, `"Infinity"` or `"-Infinity"`
//! (Python's `json` spellings of the three). Reading accepts a number or one of those
//! strings, and refuses everything else.
//!
//! Use as `#[serde(with = "amp_optim::json_float")]` on an `f64` field, or
//! `#[serde(with = "amp_optim::json_float::vec")]` on a `Vec<f64>`.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

const NAN: &str = "NaN";
const INF: &str = "Infinity";
const NEG_INF: &str = "-Infinity";

/// `v` as a JSON value: a number, or a string for NaN and the infinities.
pub fn to_json(v: f64) -> Value {
    match serde_json::Number::from_f64(v) {
        Some(n) => Value::Number(n),
        None => Value::String(non_finite_name(v).to_owned()),
    }
}

/// The float a JSON value holds ([`to_json`]'s encoding), or `None` for anything else.
pub fn from_json(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => from_name(s),
        _ => None,
    }
}

fn non_finite_name(v: f64) -> &'static str {
    if v.is_nan() {
        NAN
    } else if v > 0.0 {
        INF
    } else {
        NEG_INF
    }
}

fn from_name(s: &str) -> Option<f64> {
    match s {
        NAN => Some(f64::NAN),
        INF => Some(f64::INFINITY),
        NEG_INF => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// An `f64` with this module's JSON encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JsonF64(pub f64);

impl Serialize for JsonF64 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else {
            s.serialize_str(non_finite_name(self.0))
        }
    }
}

struct F64Visitor;

impl Visitor<'_> for F64Visitor {
    type Value = f64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number, \"NaN\", \"Infinity\" or \"-Infinity\"")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        from_name(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

impl<'de> Deserialize<'de> for JsonF64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(F64Visitor).map(JsonF64)
    }
}

/// Serialize an `f64` field (`#[serde(with = "amp_optim::json_float")]`).
pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    JsonF64(*v).serialize(s)
}

/// Deserialize an `f64` field (`#[serde(with = "amp_optim::json_float")]`).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    JsonF64::deserialize(d).map(|v| v.0)
}

/// The same encoding for a `Vec<f64>` field
/// (`#[serde(with = "amp_optim::json_float::vec")]`).
pub mod vec {
    use super::JsonF64;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialize every element with [`JsonF64`]'s encoding.
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| JsonF64(*x)))
    }

    /// Deserialize a sequence of [`JsonF64`]s.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<JsonF64>::deserialize(d)?
            .into_iter()
            .map(|v| v.0)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct S {
        #[serde(with = "super")]
        x: f64,
        #[serde(with = "super::vec")]
        v: Vec<f64>,
    }

    #[test]
    fn non_finite_values_round_trip() {
        let s = S {
            x: f64::NAN,
            v: vec![1.5, f64::INFINITY, f64::NEG_INFINITY, -0.0, 3.0],
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(
            text,
            r#"{"x":"NaN","v":[1.5,"Infinity","-Infinity",-0.0,3.0]}"#
        );
        let back: S = serde_json::from_str(&text).unwrap();
        assert!(back.x.is_nan());
        assert_eq!(back.v[..3], s.v[..3]);
        assert!(back.v[3] == 0.0 && back.v[3].is_sign_negative());
        let ints: S = serde_json::from_str(r#"{"x":2,"v":[-1,18446744073709551615]}"#).unwrap();
        assert_eq!((ints.x, ints.v), (2.0, vec![-1.0, u64::MAX as f64]));
        for bad in [
            r#"{"x":null,"v":[]}"#,
            r#"{"x":"nan","v":[]}"#,
            r#"{"x":true,"v":[]}"#,
            r#"{"x":1,"v":[null]}"#,
        ] {
            assert!(serde_json::from_str::<S>(bad).is_err(), "{bad}");
        }
        assert_eq!(to_json(f64::NAN), Value::String("NaN".into()));
        assert!(from_json(&to_json(f64::NAN)).unwrap().is_nan());
        assert_eq!(from_json(&to_json(-2.5)), Some(-2.5));
        assert_eq!(from_json(&Value::Null), None);
    }
}
