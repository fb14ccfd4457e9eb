//! Vector files are outside data: whatever text arrives, `VectorFile::parse` never
//! panics; it returns an error naming the file, or a file whose every tensor literal
//! builds its tensor.

use amp_testing::json::{json_value, mutated_json};
use amp_testing::proptest_config;
use conformance::value::{TensorLit, ValueError};
use conformance::{VectorFile, BUILTIN};
use proptest::prelude::*;
use serde_json::Value;

/// The names the format uses, so that arbitrary documents often reach the parsers.
const KEYS: &[&str] = &[
    "format",
    "suite",
    "source",
    "notes",
    "cases",
    "id",
    "op",
    "call",
    "args",
    "kwargs",
    "expect",
    "dtype",
    "shape",
    "data",
    "requires_grad",
    "init",
    "optimizers",
    "actions",
    "action",
    "input",
    "name",
    "lr",
    "params",
    "tol",
    "rtol",
    "atol",
    "policy",
    "device",
    "grad",
    "error",
];

/// A built-in file cut down to its header and first three cases (so a case mutates
/// one small document, not a 300 KB one).
fn reduced(i: usize) -> Value {
    let mut v: Value = serde_json::from_str(BUILTIN[i].1).unwrap();
    if let Some(cases) = v.get_mut("cases").and_then(Value::as_array_mut) {
        cases.truncate(3);
    }
    v
}

fn mutated_builtin() -> impl Strategy<Value = Value> {
    (0..BUILTIN.len()).prop_flat_map(|i| mutated_json(reduced(i), KEYS))
}

/// Parse `text`: no panic; an error names the file.
fn check(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = VectorFile::parse("fuzz.json", text) {
        prop_assert!(e.to_string().contains("fuzz.json"), "{}", e);
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config(128))]

    #[test]
    fn arbitrary_text_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value(KEYS, 4)) {
        check(&v.to_string())?;
    }

    #[test]
    fn mutated_vector_files_never_panic(v in mutated_builtin()) {
        check(&v.to_string())?;
    }

    #[test]
    fn tensor_literals_are_refused_or_build_their_tensor(
        v in mutated_json(
            serde_json::json!({"dtype": "float32", "shape": [2, 2], "data": [1.0, 2.0, 3.0, 4.0]}),
            KEYS,
        )
    ) {
        if let Ok(lit) = serde_json::from_value::<TensorLit>(v) {
            let t = lit.to_tensor();
            prop_assert_eq!(t.dims(), lit.shape());
            prop_assert_eq!(t.dtype(), lit.dtype());
        }
    }
}

#[test]
fn a_shape_whose_element_count_overflows_is_refused() {
    // 2^63 * 2 wraps to 0 elements, which an empty `data` would have matched.
    let text = r#"{"dtype": "float32", "shape": [9223372036854775808, 2], "data": []}"#;
    let e = serde_json::from_str::<TensorLit>(text).unwrap_err();
    assert!(
        e.to_string().contains("more elements than memory can hold"),
        "{e}"
    );
    assert_eq!(
        TensorLit::new(amp::tensor::DType::F32, vec![usize::MAX, 2], vec![]).unwrap_err(),
        ValueError::ShapeOverflow(vec![usize::MAX, 2])
    );
    // A zero dimension beside a huge one is an empty tensor, still within bounds.
    assert!(TensorLit::new(amp::tensor::DType::F32, vec![0, 1 << 40], vec![]).is_ok());
}
