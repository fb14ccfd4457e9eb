//! The nesting rule at the dispatch point, with a recording layer: the body of an op the
//! layer applied something to (or of an opaque op) runs with the layer excluded; the body
//! of an op the layer left alone is dispatched as usual; the exclusion ends with the op,
//! also on an error and while unwinding.

use std::cell::RefCell;
use std::rc::Rc;

use amp_autograd::{
    dispatch, install_layer, is_layer_excluded, ops, BodyMode, CallKind, DispatchLayer, OpCall,
    OpName, Tensor,
};
use amp_tensor::DType;

/// Records every op it sees; answers `Excluded` for the ops in `apply`.
struct Recorder {
    seen: RefCell<Vec<&'static str>>,
    apply: Vec<&'static str>,
}

impl DispatchLayer for Recorder {
    fn on_call(&self, call: &mut OpCall<'_>) -> amp_autograd::Result<BodyMode> {
        assert!(is_layer_excluded(), "the layer runs with itself excluded");
        self.seen.borrow_mut().push(call.op.name());
        Ok(if self.apply.contains(&call.op.name()) {
            BodyMode::Excluded
        } else {
            BodyMode::Layered
        })
    }
}

fn recorder(apply: &[&'static str]) -> Rc<Recorder> {
    Rc::new(Recorder {
        seen: RefCell::new(Vec::new()),
        apply: apply.to_vec(),
    })
}

fn seen_with(apply: &[&'static str], f: impl FnOnce()) -> Vec<&'static str> {
    let layer = recorder(apply);
    let _g = install_layer(Some(layer.clone()));
    f();
    let seen = layer.seen.borrow().clone();
    seen
}

fn ones(dims: &[usize]) -> Tensor {
    Tensor::ones(dims.to_vec(), DType::F32)
}

fn addbmm() -> Tensor {
    ops::addbmm(
        &ones(&[2, 2]),
        &ones(&[3, 2, 4]),
        &ones(&[3, 4, 2]),
        1.0,
        1.0,
    )
    .unwrap()
}

#[test]
fn a_composite_the_layer_applied_to_is_seen_once() {
    let seen = seen_with(&["addbmm"], || {
        addbmm();
    });
    assert_eq!(seen, ["addbmm"]);
    assert!(!is_layer_excluded());
}

#[test]
fn a_composite_the_layer_left_alone_dispatches_its_body() {
    let seen = seen_with(&[], || {
        addbmm();
    });
    assert_eq!(seen[0], "addbmm");
    assert!(seen.contains(&"bmm"), "{seen:?}");
    assert!(seen.contains(&"sum"), "{seen:?}");
}

#[test]
fn an_opaque_op_hides_its_body_even_when_left_alone() {
    let x = ones(&[2, 3]);
    let seen = seen_with(&[], || {
        ops::cosine_similarity(&x, &x, 1, 1e-8).unwrap();
    });
    assert_eq!(seen, ["cosine_similarity"]);
}

#[test]
fn the_exclusion_ends_with_the_op() {
    // `linear` (3-D input) = matmul + add: with the layer applying to `linear`, neither
    // inner op is seen; the ops after it are.
    let (x, w, b) = (ones(&[2, 3, 4]), ones(&[5, 4]), ones(&[5]));
    let seen = seen_with(&["linear"], || {
        let y = ops::linear(&x, &w, Some(&b)).unwrap();
        ops::relu(&y).unwrap();
    });
    assert_eq!(seen, ["linear", "relu"]);
}

static FAILING: OpName = OpName::new("failing_op");

/// An op whose body fails after the dispatch point.
fn failing_op(x: &Tensor) -> amp_autograd::Result<Tensor> {
    let mut args = [x.clone()];
    let (_, body) = dispatch(&FAILING, &mut args, None, false, CallKind::Functional)?;
    assert!(body.excludes() && is_layer_excluded());
    Err(amp_autograd::Error::invalid(
        "failing_op",
        "fails in its body",
    ))
}

#[test]
fn the_exclusion_ends_on_an_error() {
    let seen = seen_with(&["failing_op", "addbmm"], || {
        assert!(failing_op(&ones(&[1])).is_err());
        assert!(!is_layer_excluded());
        ops::mm(&ones(&[2, 2]), &ones(&[2, 2])).unwrap();
        // Batch sizes differ: addbmm fails (in its body's `bmm`, or before).
        let r = ops::addbmm(
            &ones(&[2, 2]),
            &ones(&[3, 2, 4]),
            &ones(&[2, 4, 2]),
            1.0,
            1.0,
        );
        assert!(r.is_err());
        assert!(!is_layer_excluded());
        ops::relu(&ones(&[2])).unwrap();
    });
    assert_eq!(seen[..2], ["failing_op", "mm"]);
    assert_eq!(seen.last(), Some(&"relu"));
    assert!(!seen.contains(&"bmm") && !seen.contains(&"sum"), "{seen:?}");
}

static PANICKY: OpName = OpName::new("panicky_op");

#[test]
fn the_exclusion_ends_while_unwinding() {
    let layer = recorder(&["panicky_op"]);
    let _g = install_layer(Some(layer.clone()));
    let r = std::panic::catch_unwind(|| {
        let mut args = [ones(&[1])];
        let (_, body) = dispatch(&PANICKY, &mut args, None, false, CallKind::Functional).unwrap();
        assert!(body.excludes());
        assert!(is_layer_excluded());
        panic!("the op's body panics");
    });
    assert!(r.is_err());
    assert!(!is_layer_excluded());
    ops::mm(&ones(&[2, 2]), &ones(&[2, 2])).unwrap();
    assert_eq!(*layer.seen.borrow(), ["panicky_op", "mm"]);
}

#[test]
fn nested_exclusions_restore_in_order() {
    // `dunder_matmul` (applied) calls `matmul`, which is not dispatched to the layer: the
    // outer exclusion stays in force until the outer op ends.
    let (a, b) = (ones(&[2, 3]), ones(&[3, 2]));
    let seen = seen_with(&["__matmul__", "matmul", "mm"], || {
        ops::dunder_matmul(&a, &b).unwrap();
        assert!(!is_layer_excluded());
        ops::matmul(&a, &b).unwrap();
    });
    assert_eq!(seen, ["__matmul__", "matmul"]);
}

#[test]
fn without_a_layer_nothing_is_excluded() {
    let mut args = [ones(&[1])];
    let (dtype, body) = dispatch(&PANICKY, &mut args, None, false, CallKind::Functional).unwrap();
    assert_eq!(dtype, None);
    assert!(!body.excludes());
    assert!(!is_layer_excluded());
}

/// Asks every op to read its float32 arguments as bfloat16, and records which ops said
/// they can.
struct ReadAs {
    can: RefCell<Vec<&'static str>>,
}

impl DispatchLayer for ReadAs {
    fn on_call(&self, call: &mut OpCall<'_>) -> amp_autograd::Result<BodyMode> {
        if call.can_read_as {
            self.can.borrow_mut().push(call.op.name());
        }
        call.read_as = Some(DType::BF16);
        Ok(BodyMode::Excluded)
    }
}

/// `mm`, `bmm`, `matmul` and `@` honour a layer's `read_as` (a bfloat16 product of their
/// float32 arguments, with the bits of the casts written by hand; `matmul` of shapes
/// other than two matrices or two equal batches casts first); ops that cannot read
/// their arguments so (`add`) are never asked, and a `read_as` set for them anyway is
/// ignored.
#[test]
fn products_read_their_arguments_as_the_layer_asks() {
    let mut g = amp_tensor::Generator::new(3);
    let a = Tensor::randn([5, 7], DType::F32, &mut g).unwrap();
    let b = Tensor::randn([7, 3], DType::F32, &mut g).unwrap();
    let cast = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let want = ops::mm(&cast(&a), &cast(&b)).unwrap();
    let (a3, b3) = (
        ops::unsqueeze(&a, 0).unwrap(),
        ops::unsqueeze(&b, 0).unwrap(),
    );
    let want3 = ops::bmm(&cast(&a3), &cast(&b3)).unwrap();
    let layer = Rc::new(ReadAs {
        can: RefCell::new(Vec::new()),
    });
    // `matmul` of a batch by a matrix casts first and takes its own path.
    let want_folded = ops::matmul(&cast(&a3), &cast(&b)).unwrap();
    let (got, got3, sum, via_matmul, folded) = {
        let _g = install_layer(Some(layer.clone()));
        (
            ops::mm(&a, &b).unwrap(),
            ops::bmm(&a3, &b3).unwrap(),
            ops::add(&a, &a).unwrap(),
            [
                ops::matmul(&a, &b).unwrap(),
                ops::dunder_matmul(&a, &b).unwrap(),
                ops::matmul(&a3, &b3).unwrap(),
            ],
            ops::matmul(&a3, &b).unwrap(),
        )
    };
    assert_eq!(
        *layer.can.borrow(),
        ["mm", "bmm", "matmul", "__matmul__", "matmul", "matmul"]
    );
    assert_eq!(got.dtype(), DType::BF16);
    let values = |t: &Tensor| t.data().to_vec_f64();
    assert_eq!(values(&got), values(&want));
    assert_eq!(values(&got3), values(&want3));
    assert_eq!(sum.dtype(), DType::F32);
    for (t, w) in via_matmul.iter().zip([&want, &want, &want3]) {
        assert_eq!(t.dtype(), DType::BF16);
        assert_eq!(values(t), values(w));
    }
    assert_eq!(folded.dtype(), DType::BF16);
    assert_eq!(values(&folded), values(&want_folded));
}
