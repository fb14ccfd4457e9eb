//! The grad and autocast runners against a tiny reference autograd (four ops, double
//! backward), on a real PyTorch vector (`dot`) and on hand-computed cases for the rules:
//! depth-first input order, null-or-zeros, second-order grads, skips vs failures, and the
//! bookkeeping of a device run (the tape pretending its tensors are on `cuda:0`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use amp::policy::DeviceType;
use amp::tensor::{DType, Device, Tensor};
use conformance::args::Output;
use conformance::backend::{AutocastBackend, Backend, GradBackend};
use conformance::coverage::{Coverage, OpCalls};
use conformance::optable::OpTable;
use conformance::vectors::{AutocastRegion, Suite};
use conformance::{builtin_files, run_files, VectorFile};
use serde_json::json;

// ----- a minimal tape ------------------------------------------------------------------

#[derive(Clone)]
struct Var(Rc<Node>);

struct Node {
    value: Vec<f64>,
    shape: Vec<usize>,
    dtype: DType,
    requires_grad: bool,
    op: Op,
}

enum Op {
    Leaf,
    Mul(Var, Var),
    Add(Var, Var),
    Sum(Var),
    /// A 0-dim tensor broadcast to a shape.
    Expand(Var),
}

fn round(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

impl Var {
    fn leaf(value: Vec<f64>, shape: Vec<usize>, dtype: DType, requires_grad: bool) -> Var {
        Var(Rc::new(Node {
            value,
            shape,
            dtype,
            requires_grad,
            op: Op::Leaf,
        }))
    }

    fn derived(value: Vec<f64>, shape: Vec<usize>, dtype: DType, op: Op) -> Var {
        let requires_grad = match &op {
            Op::Leaf => false,
            Op::Mul(a, b) | Op::Add(a, b) => a.0.requires_grad || b.0.requires_grad,
            Op::Sum(a) | Op::Expand(a) => a.0.requires_grad,
        };
        let value = value.into_iter().map(|v| round(dtype, v)).collect();
        Var(Rc::new(Node {
            value,
            shape,
            dtype,
            requires_grad,
            op,
        }))
    }

    fn detach(&self) -> Var {
        Var::leaf(
            self.0.value.clone(),
            self.0.shape.clone(),
            self.0.dtype,
            false,
        )
    }

    fn key(&self) -> *const Node {
        Rc::as_ptr(&self.0)
    }
}

fn same(a: &Var, b: &Var) -> Result<(), String> {
    if a.0.shape != b.0.shape || a.0.dtype != b.0.dtype {
        return Err(format!(
            "shapes/dtypes differ: {:?} {:?} vs {:?} {:?}",
            a.0.shape, a.0.dtype, b.0.shape, b.0.dtype
        ));
    }
    Ok(())
}

/// The elementwise `f` of two same-shaped variables, recorded as `op`.
fn elementwise(a: &Var, b: &Var, f: fn(f64, f64) -> f64, op: Op) -> Result<Var, String> {
    same(a, b)?;
    let v = a.0.value.iter().zip(&b.0.value).map(|(x, y)| f(*x, *y));
    Ok(Var::derived(v.collect(), a.0.shape.clone(), a.0.dtype, op))
}

fn mul(a: &Var, b: &Var) -> Result<Var, String> {
    elementwise(a, b, |x, y| x * y, Op::Mul(a.clone(), b.clone()))
}

fn add(a: &Var, b: &Var) -> Result<Var, String> {
    elementwise(a, b, |x, y| x + y, Op::Add(a.clone(), b.clone()))
}

fn sum(a: &Var) -> Var {
    let s = a.0.value.iter().sum();
    Var::derived(vec![s], vec![], a.0.dtype, Op::Sum(a.clone()))
}

fn expand(a: &Var, shape: &[usize]) -> Var {
    let n = shape.iter().product();
    Var::derived(
        vec![a.0.value[0]; n],
        shape.to_vec(),
        a.0.dtype,
        Op::Expand(a.clone()),
    )
}

/// Reverse mode over the recorded ops; backward formulas are themselves recorded, so
/// `create_graph` gives differentiable gradients.
fn grad(
    outputs: &[Var],
    inputs: &[Var],
    grad_outputs: &[Var],
    create_graph: bool,
) -> Result<Vec<Option<Var>>, String> {
    fn visit(v: &Var, seen: &mut HashMap<*const Node, ()>, order: &mut Vec<Var>) {
        if seen.insert(v.key(), ()).is_some() || !v.0.requires_grad {
            return;
        }
        match &v.0.op {
            Op::Leaf => {}
            Op::Mul(a, b) | Op::Add(a, b) => {
                visit(a, seen, order);
                visit(b, seen, order);
            }
            Op::Sum(a) | Op::Expand(a) => visit(a, seen, order),
        }
        order.push(v.clone());
    }
    let mut order = Vec::new();
    let mut seen = HashMap::new();
    for o in outputs {
        visit(o, &mut seen, &mut order);
    }
    let grads: RefCell<HashMap<*const Node, Var>> = RefCell::new(HashMap::new());
    let accumulate = |v: &Var, g: Var| -> Result<(), String> {
        if !v.0.requires_grad {
            return Ok(());
        }
        let mut m = grads.borrow_mut();
        let new = match m.remove(&v.key()) {
            Some(prev) => add(&prev, &g)?,
            None => g,
        };
        m.insert(v.key(), new);
        Ok(())
    };
    for (o, g) in outputs.iter().zip(grad_outputs) {
        accumulate(o, g.clone())?;
    }
    for v in order.iter().rev() {
        let Some(g) = grads.borrow().get(&v.key()).cloned() else {
            continue;
        };
        match &v.0.op {
            Op::Leaf => {}
            Op::Mul(a, b) => {
                accumulate(a, mul(&g, b)?)?;
                accumulate(b, mul(&g, a)?)?;
            }
            Op::Add(a, b) => {
                accumulate(a, g.clone())?;
                accumulate(b, g)?;
            }
            Op::Sum(a) => accumulate(a, expand(&g, &a.0.shape))?,
            Op::Expand(a) => accumulate(a, sum(&g))?,
        }
    }
    let m = grads.borrow();
    Ok(inputs
        .iter()
        .map(|i| {
            m.get(&i.key())
                .map(|g| if create_graph { g.clone() } else { g.detach() })
        })
        .collect())
}

// ----- the backend -----------------------------------------------------------------------

struct Tape {
    ops: OpTable<Var>,
    /// The device the tape says its tensors are on (they stay host values).
    device: Device,
}

fn table() -> OpTable<Var> {
    let mut t: OpTable<Var> = OpTable::new();
    t.insert("torch.dot", |args, kwargs| {
        kwargs.only(&[])?;
        Ok(Output::Tensor(sum(&mul(
            args[0].tensor()?,
            args[1].tensor()?,
        )?)))
    });
    // dot of a list argument: its tensors are inputs in list order.
    t.insert("test.dot_list", |args, _| {
        let ts = args[0].tensors()?;
        Ok(Output::Tensor(sum(&mul(ts[0], ts[1])?)))
    });
    // Returns its first argument: the second does not influence the output.
    t.insert("test.first", |args, _| {
        Ok(Output::Tensor(args[0].tensor()?.clone()))
    });
    // a + 0 * b: b gets an all-zero gradient.
    t.insert("test.first_plus_zero_b", |args, _| {
        let (a, b) = (args[0].tensor()?, args[1].tensor()?);
        let zero = Var::leaf(
            vec![0.0; b.0.value.len()],
            b.0.shape.clone(),
            b.0.dtype,
            false,
        );
        Ok(Output::Tensor(add(a, &mul(b, &zero)?)?))
    });
    // A tuple output.
    t.insert("test.pair", |args, _| {
        Ok(Output::Tensors(vec![
            args[0].tensor()?.clone(),
            args[1].tensor()?.clone(),
        ]))
    });
    t.insert("test.fails", |_, _| Err("boom".into()));
    // What an op without a CUDA kernel returns, as a message.
    t.insert("test.no_kernel", |_, _| {
        Err(amp::tensor::Error::no_device_kernel("frob", Device::Cuda(0)).to_string())
    });
    t.insert("test.panics", |_, _| panic!("kaboom"));
    t
}

impl Backend for Tape {
    type Tensor = Var;
    fn name(&self) -> &str {
        "test tape"
    }
    fn ops(&self) -> &OpTable<Var> {
        &self.ops
    }
    fn device(&self) -> Device {
        self.device
    }
    fn tensor(&self, value: &Tensor, requires_grad: bool) -> Result<Var, String> {
        Ok(Var::leaf(
            value.to_vec_f64(),
            value.dims().to_vec(),
            value.dtype(),
            requires_grad,
        ))
    }
    fn value(&self, t: &Var) -> Tensor {
        Tensor::from_vec(t.0.value.clone(), t.0.shape.clone())
            .and_then(|x| x.to_dtype(t.0.dtype))
            .unwrap()
    }
}

impl GradBackend for Tape {
    fn requires_grad(&self, t: &Var) -> bool {
        t.0.requires_grad
    }
    fn grad(
        &self,
        outputs: &[Var],
        inputs: &[Var],
        grad_outputs: &[Var],
        create_graph: bool,
    ) -> Result<Vec<Option<Var>>, String> {
        grad(outputs, inputs, grad_outputs, create_graph)
    }
    fn mul(&self, a: &Var, b: &Var) -> Result<Var, String> {
        mul(a, b)
    }
    fn sum(&self, a: &Var) -> Result<Var, String> {
        Ok(sum(a))
    }
    fn add(&self, a: &Var, b: &Var) -> Result<Var, String> {
        add(a, b)
    }
}

impl AutocastBackend for Tape {
    fn with_autocast(
        &self,
        _: DeviceType,
        regions: &[AutocastRegion],
        body: &mut dyn FnMut() -> Result<Output<Var>, String>,
    ) -> Result<Output<Var>, String> {
        if regions.iter().any(|r| r.enabled) {
            return Err("the test tape has no autocast".into());
        }
        body()
    }
}

fn tape() -> Tape {
    Tape {
        ops: table(),
        device: Device::Cpu,
    }
}

// ----- helpers ---------------------------------------------------------------------------

fn f64s(data: &[f64]) -> serde_json::Value {
    json!({"dtype": "float64", "shape": [data.len()], "data": data})
}

fn scalar(x: f64) -> serde_json::Value {
    json!({"dtype": "float64", "shape": [], "data": [x]})
}

fn input(data: &[f64]) -> serde_json::Value {
    json!({"dtype": "float64", "shape": [data.len()], "data": data, "requires_grad": true})
}

fn grad_file(cases: serde_json::Value) -> VectorFile {
    let file = json!({"format": "amp-vectors/1", "suite": "grad", "cases": cases});
    VectorFile::parse("synthetic_grad.json", &file.to_string()).unwrap()
}

/// Runs the cases and returns the outcome of each: `"pass"`, `"skip: ..."` or `"fail: ..."`.
/// Asserts the failed and skipped grad cases of `file`, as [`outcomes`] lists them.
fn assert_outcomes(file: VectorFile, expected: &[(&str, &str)]) {
    let got = outcomes(file);
    let got: Vec<(&str, &str)> = got.iter().map(|(i, m)| (i.as_str(), m.as_str())).collect();
    assert_eq!(got, expected);
}

fn outcomes(file: VectorFile) -> Vec<(String, String)> {
    let report = run_files(&tape(), &[file]);
    let grad = report.suite(Suite::Grad);
    let mut out: Vec<(String, String)> = Vec::new();
    for f in &grad.failures {
        out.push((f.id.clone(), format!("fail: {}", f.message)));
    }
    for s in &grad.skipped {
        out.push((s.id.clone(), format!("skip: {}", s.reason)));
    }
    assert_eq!(grad.passed + out.len(), grad.total());
    out
}

/// a = [1, 2, 3], b = [4, 5, 6], dot = 32, grad_output 2: grads 2b, 2a; the penalty
/// sum((2b)^2) + sum((2a)^2) has gradients 8a, 8b.
fn dot_case(id: &str) -> serde_json::Value {
    json!({
        "id": id, "op": "dot", "call": "torch.dot",
        "args": [input(&[1.0, 2.0, 3.0]), input(&[4.0, 5.0, 6.0])], "kwargs": {},
        "grad_output": scalar(2.0),
        "expect": {
            "output": scalar(32.0),
            "grads": [f64s(&[8.0, 10.0, 12.0]), f64s(&[2.0, 4.0, 6.0])],
            "second_order_grads": [f64s(&[8.0, 16.0, 24.0]), f64s(&[32.0, 40.0, 48.0])]
        }
    })
}

// ----- tests -----------------------------------------------------------------------------

#[test]
fn real_torch_dot_vectors_pass_and_the_rest_is_skipped() {
    let grad_files: Vec<VectorFile> = builtin_files()
        .iter()
        .filter(|f| f.suite() == Suite::Grad)
        .cloned()
        .collect();
    let report = run_files(&tape(), &grad_files);
    let grad = report.suite(Suite::Grad);
    assert!(report.passed(), "{report}");
    // dot/float64/1 (with second-order grads) and dot/float32/2, their value variants,
    // and dot/float64/1 with either input not requiring grad.
    assert_eq!(grad.passed, 6, "{report}");
    // Every other grad case (all the embedded grad files) is skipped, none hidden.
    let cases: usize = grad_files.iter().map(|f| f.cases.len()).sum();
    assert_eq!(grad.skipped.len(), cases - 6, "{report}");
    assert!(grad
        .skipped
        .iter()
        .all(|s| s.reason.starts_with("op `") && !s.reason.contains("`dot`")));
    // Coverage: dot is on the cuda promote list and now executable.
    let promote = &report.coverage.lists[2];
    assert_eq!(promote.title(), "cuda promote");
    assert_eq!(promote.executable, ["dot"]);
}

#[test]
fn hand_computed_dot_passes_with_second_order_grads() {
    assert_outcomes(grad_file(json!([dot_case("dot/1")])), &[]);
}

#[test]
fn wrong_values_fail_with_the_first_mismatch() {
    let mut c = dot_case("dot/wrong-output");
    c["expect"]["output"] = scalar(31.0);
    let mut g = dot_case("dot/wrong-grad");
    g["expect"]["grads"][1] = f64s(&[2.0, 4.0, 7.0]);
    let mut s = dot_case("dot/wrong-second");
    s["expect"]["second_order_grads"][0] = f64s(&[8.0, 16.0, 25.0]);
    let mut t = dot_case("dot/within-tolerance");
    t["expect"]["second_order_grads"][0] = f64s(&[8.0, 16.0, 25.0]);
    t["expect"]["rtol"] = json!(0.05);
    t["expect"]["atol"] = json!(0.0);
    assert_outcomes(grad_file(json!([c, g, s, t])), &[
            ("dot/wrong-output", "fail: element 0 of output: got 32.0 (float64), expected 31.0 (exact)"),
            ("dot/wrong-grad", "fail: element 2 of grads[1]: got 6.0 (float64), expected 7.0 (exact)"),
            (
                "dot/wrong-second",
                "fail: element 2 of second_order_grads[0]: got 24.0 (float64), expected 25.0 (exact)"
            ),
        ]);
}

#[test]
fn list_arguments_give_inputs_in_depth_first_order() {
    let case = |id: &str, grads: [serde_json::Value; 2]| {
        json!({
            "id": id, "op": "dot_list", "call": "test.dot_list",
            "args": [[input(&[1.0, 2.0]), input(&[3.0, 4.0])]], "kwargs": {},
            "grad_output": scalar(1.0),
            "expect": {"output": scalar(11.0), "grads": grads}
        })
    };
    let ok = case("list/in-order", [f64s(&[3.0, 4.0]), f64s(&[1.0, 2.0])]);
    let swapped = case("list/swapped", [f64s(&[1.0, 2.0]), f64s(&[3.0, 4.0])]);
    assert_outcomes(
        grad_file(json!([ok, swapped])),
        &[(
            "list/swapped",
            "fail: element 0 of grads[0]: got 3.0 (float64), expected 1.0 (exact)",
        )],
    );
}

#[test]
fn null_gradients_accept_none_or_zeros_but_not_values() {
    let case = |id: &str, call: &str, grads: serde_json::Value| {
        json!({
            "id": id, "op": "first", "call": call,
            "args": [input(&[1.0, 2.0]), input(&[3.0, 4.0])], "kwargs": {},
            "grad_output": f64s(&[1.0, 1.0]),
            "expect": {"output": f64s(&[1.0, 2.0]), "grads": grads}
        })
    };
    let cases = json!([
        case("null/none", "test.first", json!([f64s(&[1.0, 1.0]), null])),
        case(
            "null/zeros",
            "test.first_plus_zero_b",
            json!([f64s(&[1.0, 1.0]), null])
        ),
        case(
            "null/expected-but-none",
            "test.first",
            json!([f64s(&[1.0, 1.0]), f64s(&[0.0, 0.0])])
        ),
        case("null/but-nonzero", "test.first", json!([null, null])),
    ]);
    assert_outcomes(
        grad_file(cases),
        &[
            (
                "null/expected-but-none",
                "fail: grads[1]: missing, expected a tensor",
            ),
            (
                "null/but-nonzero",
                "fail: grads[0]: expected no gradient (null or zeros), got 1.0 at element 0",
            ),
        ],
    );
}

/// Where no first-order gradient depends on an input, every second-order gradient is
/// zero: expectations of null or zeros pass (PyTorch's graph can link a gradient to an
/// input its value does not depend on, and then records them), a nonzero one fails.
#[test]
fn second_order_grads_are_zero_where_no_first_order_grad_depends_on_an_input() {
    // d(a)/da = grad_output: a constant, so every second-order gradient is 0.
    let base = json!({
        "id": "identity/absent", "op": "first", "call": "test.first",
        "args": [input(&[1.0, 2.0]), input(&[3.0, 4.0])], "kwargs": {},
        "grad_output": f64s(&[1.0, 1.0]),
        "expect": {"output": f64s(&[1.0, 2.0]), "grads": [f64s(&[1.0, 1.0]), null]}
    });
    let with = |id: &str, second: serde_json::Value| {
        let mut c = base.clone();
        c["id"] = json!(id);
        c["expect"]["second_order_grads"] = second;
        c
    };
    let cases = json!([
        base.clone(),
        with("identity/nulls", json!([null, null])),
        with("identity/zeros", json!([f64s(&[0.0, 0.0]), null])),
        with("identity/nonzero", json!([f64s(&[0.0, 2.0]), null])),
    ]);
    assert_outcomes(
        grad_file(cases),
        &[(
            "identity/nonzero",
            "fail: element 1 of second_order_grads[0]: got 0.0 (float64), expected 2.0 (exact)",
        )],
    );
}

#[test]
fn tuple_outputs_take_a_list_of_grad_outputs() {
    let case = json!({
        "id": "pair/1", "op": "pair", "call": "test.pair",
        "args": [input(&[1.0]), input(&[2.0])], "kwargs": {},
        "grad_output": [f64s(&[5.0]), f64s(&[7.0])],
        "expect": {"output": [f64s(&[1.0]), f64s(&[2.0])], "grads": [f64s(&[5.0]), f64s(&[7.0])]}
    });
    let mut one = case.clone();
    one["id"] = json!("pair/expects-one");
    one["expect"]["output"] = f64s(&[1.0]);
    one["grad_output"] = f64s(&[5.0]);
    assert_outcomes(
        grad_file(json!([case, one])),
        &[(
            "pair/expects-one",
            "fail: number of tensors of output: got 2, expected 1",
        )],
    );
}

/// A one-input case of `op` (called as `call`) whose output and gradient are the input's.
fn identity_case(id: &str, op: &str, call: &str) -> serde_json::Value {
    json!({
        "id": id, "op": op, "call": call,
        "args": [input(&[1.0])], "kwargs": {},
        "grad_output": f64s(&[1.0]),
        "expect": {"output": f64s(&[1.0]), "grads": [f64s(&[1.0])]}
    })
}

#[test]
fn an_existing_op_that_errs_or_panics_fails_and_a_missing_op_is_skipped() {
    let case = identity_case;
    let cases = json!([
        case("errs/1", "fails", "test.fails"),
        case("panics/1", "panics", "test.panics"),
        case("missing/1", "erfinv", "torch.erfinv"),
    ]);
    assert_outcomes(
        grad_file(cases),
        &[
            ("errs/1", "fail: test.fails failed: boom"),
            ("panics/1", "fail: panicked: kaboom"),
            ("missing/1", "skip: op `erfinv` not implemented yet"),
        ],
    );
}

#[test]
fn a_keyword_the_op_does_not_handle_fails_the_case() {
    let mut c = dot_case("dot/extra-kwarg");
    c["kwargs"] = json!({"out": null});
    assert_outcomes(
        grad_file(json!([c])),
        &[(
            "dot/extra-kwarg",
            "fail: torch.dot failed: unexpected keyword argument `out`",
        )],
    );
}

#[test]
fn autocast_cases_run_inside_their_regions() {
    let case = |id: &str, regions: serde_json::Value| {
        json!({
            "id": id, "device": "cpu", "op": "dot", "call": "torch.dot", "policy": "none",
            "autocast": regions,
            "args": [f64s(&[1.0, 2.0]), f64s(&[3.0, 4.0])], "kwargs": {},
            "expect": {"output": scalar(11.0), "rtol": 0.0, "atol": 0.0}
        })
    };
    let file = json!({"format": "amp-vectors/1", "suite": "autocast", "cases": [
        case("none/1", json!([])),
        case("disabled/1", json!([{"enabled": false}])),
        case("enabled/1", json!([{"enabled": true, "dtype": "bfloat16"}])),
        case("missing/1", json!([])).as_object().map(|o| {
            let mut o = o.clone();
            o.insert("op".into(), json!("mv"));
            o.insert("call".into(), json!("torch.mv"));
            serde_json::Value::Object(o)
        }).unwrap(),
    ]});
    let file = VectorFile::parse("synthetic_autocast.json", &file.to_string()).unwrap();
    let report = run_files(&tape(), &[file]);
    let s = report.suite(Suite::Autocast);
    assert_eq!(s.passed, 2);
    assert_eq!(s.failures.len(), 1);
    assert_eq!(s.failures[0].id, "enabled/1");
    assert_eq!(
        s.failures[0].message,
        "torch.dot failed: the test tape has no autocast"
    );
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(s.skipped[0].reason, "op `mv` not implemented yet");
}

#[test]
fn a_device_run_skips_missing_kernels_and_host_only_suites_and_counts_them() {
    use conformance::report::SkipCause;

    let case = identity_case;
    let grad = grad_file(json!([
        dot_case("dot/1"),
        case("frob/1", "frob", "test.no_kernel"),
        case("missing/1", "erfinv", "torch.erfinv"),
    ]));
    let refused = |id: &str, call: &str| {
        json!({"id": id, "op": "frob", "call": call, "args": [f64s(&[1.0])], "kwargs": {},
               "expect_error": {"type": "RuntimeError", "message": "no"}})
    };
    let errors = json!({"format": "amp-vectors/1", "suite": "errors", "cases": [
        refused("frob/refused", "test.no_kernel"),
        refused("fails/refused", "test.fails"),
    ]});
    let errors = VectorFile::parse("synthetic_errors.json", &errors.to_string()).unwrap();
    // The built-in host-only and cpu-autocast files: not run on the device.
    let mut files: Vec<VectorFile> = builtin_files()
        .iter()
        .filter(|f| {
            [Suite::Policy, Suite::Autocast, Suite::Scaler, Suite::Train].contains(&f.suite())
        })
        .cloned()
        .collect();
    files.extend([grad, errors]);
    let on_device = Tape {
        ops: table(),
        device: Device::Cuda(0),
    };
    let report = run_files(&on_device, &files);
    assert!(report.passed(), "{report}");
    assert_eq!(report.device, Device::Cuda(0));

    let g = report.suite(Suite::Grad);
    assert_eq!((g.passed, g.ran()), (1, 1), "{report}");
    assert_eq!(g.skipped_for(SkipCause::NoDeviceKernel), 1);
    assert_eq!(g.skipped_for(SkipCause::NotImplemented), 1);
    let frob = g.skipped.iter().find(|s| s.id == "frob/1").unwrap();
    assert_eq!(frob.reason, "op `frob` has no CUDA kernel");

    // A missing kernel is not the refusal an errors case expects: skipped, not passed.
    let e = report.suite(Suite::Errors);
    assert_eq!((e.passed, e.skipped_for(SkipCause::NoDeviceKernel)), (1, 1));
    assert_eq!(e.texts.compared, 1);

    for suite in [Suite::Policy, Suite::Autocast, Suite::Scaler, Suite::Train] {
        let s = report.suite(suite);
        assert!(s.total() > 0 && s.not_on_device(), "{suite}: {report}");
        assert_eq!(s.ran(), 0);
    }
    assert_eq!(
        report.suite(Suite::Autocast).skipped[0].reason,
        "autocast(cpu) does not apply to cuda tensors"
    );

    // The table's device columns, and one line per wholly skipped suite.
    let text = report.to_string();
    let row = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(text.contains("on cuda:0  no kernel  files"), "{text}");
    assert!(
        text.contains(
            "\non cuda:0: 2 cases ran, 2 skipped for lack of a device kernel, 2001 not run there\n"
        ),
        "{text}"
    );
    assert_eq!(
        row("grad ")[..7],
        ["grad", "1", "0", "2", "3", "1", "1"],
        "{text}"
    );
    assert_eq!(row("scaler ")[5..7], ["-", "-"], "{text}");
    assert!(
        text.contains("  grad: op `frob` has no CUDA kernel (1): frob/1\n"),
        "{text}"
    );
    assert!(
        text.contains(concat!(
            "  scaler: host-only: the GradScaler programs build cpu tensors ",
            "(the cpu run checks them) (134): every case of scaler.json, scaler_programs.json, ",
            "scaler_values.json\n"
        )),
        "{text}"
    );
}

#[test]
fn coverage_knows_a_call_for_every_documented_op() {
    let calls = conformance::op_calls(&[]);
    let cov = Coverage::compute(&amp::policy::Profile::docs(), &OpTable::<()>::new(), &calls);
    for l in &cov.lists {
        assert!(
            l.no_call.is_empty(),
            "{}: no call known for {:?}",
            l.title(),
            l.no_call
        );
        assert!(l.executable.is_empty());
    }
    // A call shared by several ops counts only for the ops its entry serves.
    let mut t: OpTable<()> = OpTable::new();
    t.insert_for("torch.nn.functional.pad", &["reflection_pad1d"], |_, _| {
        Err("unused".into())
    });
    let cov = Coverage::compute(&amp::policy::Profile::docs(), &t, &calls);
    let cpu_fp32 = &cov.lists[4];
    assert_eq!(cpu_fp32.title(), "cpu fp32");
    assert_eq!(cpu_fp32.executable, ["reflection_pad1d"]);
    let mut manual = OpCalls::new();
    manual.add("mm", "torch.mm");
    assert_eq!(manual.calls("mm").collect::<Vec<_>>(), ["torch.mm"]);
}
