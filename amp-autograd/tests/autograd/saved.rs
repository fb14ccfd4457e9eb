//! What a recorded op keeps for its backward: only the tensors a formula reads, and
//! only for the sides that need a gradient (an input no formula reads is not held by
//! the graph); a formula that reads the op's output gets the output itself under
//! `create_graph`, so second derivatives go through the op's own node.

use amp_autograd::amp_tensor::{DType, Tensor as Raw};
use amp_autograd::{ops, Tensor};
use amp_testing::gradcheck::check_second_order;
use amp_testing::tensors::{leaf, randn_vec};

/// An input of `f`: plain data, or the output of a recorded op (so that the only other
/// holder of its buffer can be the graph `f` builds).
#[derive(Clone, Copy)]
enum Input {
    Data,
    Grad,
}

fn make(kind: Input, dims: &[usize], seed: u64) -> Tensor {
    let x = leaf(randn_vec(dims, seed), dims);
    match kind {
        Input::Data => x.detach(),
        Input::Grad => ops::mul_scalar(&x, 1.0).unwrap(),
    }
}

/// Whether the graph of `f(a, b)` holds the buffer of `a` once the caller has let go of
/// `a` (`b` is made as `b_kind`).
fn keeps_first(a_kind: Input, b_kind: Input, f: fn(&Tensor, &Tensor) -> Tensor) -> bool {
    let (a, b) = (make(a_kind, &[3, 3], 1), make(b_kind, &[3, 3], 2));
    let buffer: Raw = a.data().clone();
    let y = f(&a, &b);
    drop(a);
    let kept = !buffer.is_exclusive();
    drop(y);
    kept
}

#[test]
fn a_product_keeps_a_side_only_for_the_other_sides_gradient() {
    use Input::{Data, Grad};
    let mul = |a: &Tensor, b: &Tensor| ops::mul(a, b).unwrap();
    let mm = |a: &Tensor, b: &Tensor| ops::mm(a, b).unwrap();
    let add = |a: &Tensor, b: &Tensor| ops::add(a, b).unwrap();
    for (name, f) in [("mul", mul as fn(&Tensor, &Tensor) -> Tensor), ("mm", mm)] {
        assert!(keeps_first(Data, Grad, f), "{name}: b's gradient reads a");
        assert!(keeps_first(Grad, Grad, f), "{name}: b's gradient reads a");
        assert!(
            !keeps_first(Grad, Data, f),
            "{name}: only a's gradient, which reads b"
        );
    }
    assert!(
        !keeps_first(Grad, Grad, add),
        "add's gradients read neither side"
    );
    let bmm = |a: &Tensor, b: &Tensor| {
        ops::bmm(
            &ops::unsqueeze(a, 0).unwrap(),
            &ops::unsqueeze(b, 0).unwrap(),
        )
        .unwrap()
    };
    assert!(!keeps_first(Grad, Data, bmm));
    assert!(keeps_first(Data, Grad, bmm));
}

#[test]
fn a_first_layer_does_not_keep_its_weight_cast() {
    // x (data) @ w16ᵀ with w16 = w.to(bf16): w's gradient reads x, x needs none, so the
    // bfloat16 copy of the weight is not held until backward.
    let x = make(Input::Data, &[4, 3], 3).to_dtype(DType::BF16).unwrap();
    let w = leaf(randn_vec(&[5, 3], 4), &[5, 3]);
    let w16 = ops::to_dtype(&w, DType::BF16).unwrap();
    let buffer = w16.data().clone();
    let y = ops::linear(&x, &w16, None).unwrap();
    drop(w16);
    assert!(
        buffer.is_exclusive(),
        "the cast weight is held by the graph"
    );
    ops::sum_all(&y).unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().dims(), &[5, 3]);
}

#[test]
fn an_op_reading_its_output_keeps_neither_input() {
    for (name, f) in [
        (
            "exp",
            ops::exp as fn(&Tensor) -> amp_autograd::Result<Tensor>,
        ),
        ("tanh", ops::tanh),
        ("sigmoid", ops::sigmoid),
        ("sqrt", ops::sqrt),
    ] {
        let x = ops::add_scalar(&make(Input::Grad, &[8], 5).abs().unwrap(), 0.5).unwrap();
        let buffer = x.data().clone();
        let y = f(&x).unwrap();
        drop(x);
        assert!(buffer.is_exclusive(), "{name} holds its input");
        drop(y);
    }
    // sin reads its input.
    let x = make(Input::Grad, &[8], 6);
    let buffer = x.data().clone();
    let y = ops::sin(&x).unwrap();
    drop(x);
    assert!(!buffer.is_exclusive(), "sin's gradient reads x");
    drop(y);
}

/// Second derivatives of the ops whose formula reads their output: the output is handed
/// to the formula as itself, its `grad_fn` the op's node.
#[test]
fn second_order_through_a_kept_output() {
    type F = fn(&[Tensor]) -> amp_autograd::Result<Tensor>;
    let cases: [(&str, F); 11] = [
        ("exp", |v| ops::exp(&v[0])),
        ("expm1", |v| ops::expm1(&v[0])),
        ("sqrt", |v| ops::sqrt(&v[0])),
        ("rsqrt", |v| ops::rsqrt(&v[0])),
        ("reciprocal", |v| ops::reciprocal(&v[0])),
        ("tan", |v| ops::tan(&v[0])),
        ("tanh", |v| ops::tanh(&v[0])),
        ("sigmoid", |v| ops::sigmoid(&v[0])),
        ("erfinv", |v| ops::erfinv(&ops::mul_scalar(&v[0], 0.3)?)),
        ("pow", |v| ops::pow(&v[0], &v[1])),
        ("rpow_scalar", |v| ops::rpow_scalar(&v[0], 1.7)),
    ];
    for (name, f) in cases {
        let x: Vec<f64> = randn_vec(&[5], 11)
            .iter()
            .map(|v| 0.6 + v.abs() * 0.5)
            .collect();
        let e = randn_vec(&[5], 12);
        let inputs = [leaf(x, &[5]), leaf(e, &[5])];
        eprintln!("{name}");
        check_second_order(&inputs, &f, 1e-4);
    }
}
