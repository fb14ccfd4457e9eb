//! Strategies for fuzzing loaders of outside data: arbitrary JSON values, and valid
//! documents with one part changed, removed or added (which reach much deeper into a
//! loader than random bytes do).

use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Strings a loader may treat specially: NaN and the infinities as this workspace
/// writes them, dtype names, empty and odd text.
const SPECIAL_STRINGS: &[&str] = &[
    "",
    "NaN",
    "Infinity",
    "-Infinity",
    "nan",
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "bool",
    "amp-vectors/1",
    "\u{0}",
    "é",
];

/// Numbers at the edges: zero, signs, fractions, the extremes of each JSON number kind.
fn edge_numbers() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::from(0)),
        Just(Value::from(1)),
        Just(Value::from(-1)),
        Just(Value::from(2)),
        Just(Value::from(0.5)),
        Just(Value::from(-0.0)),
        Just(Value::from(1e308)),
        Just(Value::from(-1e308)),
        Just(Value::from(5e-324)),
        Just(Value::from(i64::MIN)),
        Just(Value::from(i64::MAX)),
        Just(Value::from(u64::MAX)),
        Just(Value::from(u32::MAX)),
        Just(Value::from(1u64 << 62)),
    ]
}

/// A JSON scalar: null, a bool, a number (edges, any integer, any finite float) or a
/// string (special, or arbitrary).
pub fn json_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        edge_numbers(),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        proptest::sample::select(SPECIAL_STRINGS).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

/// Any JSON value up to `depth` levels of nesting, object keys drawn from `keys` (the
/// names a loader looks for) or arbitrary.
pub fn json_value(keys: &'static [&'static str], depth: u32) -> BoxedStrategy<Value> {
    let key = prop_oneof![
        3 => proptest::sample::select(keys).prop_map(str::to_owned),
        1 => "[a-z_0-9]{0,8}",
    ];
    json_scalar()
        .prop_recursive(depth, 64, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
            ]
        })
        .boxed()
}

/// One change to a document.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Replace the value reached by the path with this one.
    Replace(Value),
    /// Remove the value reached by the path from its parent.
    Remove,
    /// Add this key and value to the object reached by the path (or push the value onto
    /// the array).
    Insert(String, Value),
}

/// `base` with one edit at a random place: the path is a list of child choices, each
/// taken modulo the number of children, walked until it ends or reaches a scalar.
pub fn mutated_json(base: Value, keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let edit = prop_oneof![
        3 => json_value(keys, 2).prop_map(Edit::Replace),
        1 => Just(Edit::Remove),
        1 => (proptest::sample::select(keys), json_value(keys, 2))
            .prop_map(|(k, v)| Edit::Insert(k.to_owned(), v)),
    ];
    (proptest::collection::vec(any::<usize>(), 0..8), edit).prop_map(move |(path, edit)| {
        let mut doc = base.clone();
        apply(&mut doc, &path, edit);
        doc
    })
}

/// Apply `edit` at `path` in `doc` (see [`mutated_json`]).
pub fn apply(doc: &mut Value, path: &[usize], edit: Edit) {
    let children = match doc {
        Value::Array(a) => a.len(),
        Value::Object(m) => m.len(),
        _ => 0,
    };
    if let (Some((&first, rest)), true) = (path.split_first(), children > 0) {
        let i = first % children;
        // Remove one level up, so that the parent loses the child.
        if rest.is_empty() && matches!(edit, Edit::Remove) {
            match doc {
                Value::Array(a) => {
                    a.remove(i);
                }
                Value::Object(m) => {
                    let k = m.keys().nth(i).cloned().expect("i < len");
                    m.remove(&k);
                }
                _ => unreachable!("children > 0"),
            }
            return;
        }
        let child = match doc {
            Value::Array(a) => &mut a[i],
            Value::Object(m) => m.values_mut().nth(i).expect("i < len"),
            _ => unreachable!("children > 0"),
        };
        return apply(child, rest, edit);
    }
    match edit {
        Edit::Replace(v) => *doc = v,
        Edit::Remove => *doc = Value::Null,
        Edit::Insert(k, v) => match doc {
            Value::Object(m) => {
                m.insert(k, v);
            }
            Value::Array(a) => a.push(v),
            other => *other = v,
        },
    }
}

/// Bytes: arbitrary, or `base` cut short, or `base` with a few bytes overwritten.
pub fn damaged_bytes(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len().max(1);
    let a = base.clone();
    let b = base;
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        (0..len).prop_map(move |n| a[..n.min(a.len())].to_vec()),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6).prop_map(move |flips| {
            let mut v = b.clone();
            if !v.is_empty() {
                for (i, x) in flips {
                    let n = v.len();
                    v[i % n] = x;
                }
            }
            v
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn edits_land_where_the_path_leads() {
        let base = json!({"a": [1, 2, {"b": true}], "c": "x"});
        let mut d = base.clone();
        apply(&mut d, &[0, 2, 0], Edit::Replace(json!(5)));
        assert_eq!(d, json!({"a": [1, 2, {"b": 5}], "c": "x"}));
        let mut d = base.clone();
        apply(&mut d, &[1], Edit::Remove);
        assert_eq!(d, json!({"a": [1, 2, {"b": true}]}));
        let mut d = base.clone();
        apply(&mut d, &[0, 4], Edit::Remove);
        assert_eq!(d, json!({"a": [1, {"b": true}], "c": "x"}));
        let mut d = base.clone();
        apply(&mut d, &[], Edit::Insert("z".into(), json!(null)));
        assert_eq!(d, json!({"a": [1, 2, {"b": true}], "c": "x", "z": null}));
        let mut d = base;
        apply(&mut d, &[1, 7, 7], Edit::Replace(json!([])));
        assert_eq!(d, json!({"a": [1, 2, {"b": true}], "c": []}));
    }
}
