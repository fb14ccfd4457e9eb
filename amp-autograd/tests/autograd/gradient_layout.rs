//! Gradients are laid out as PyTorch lays them out (`mm_mat1_backward` /
//! `mm_mat2_backward`): the product's backward gives a column-major operand a
//! column-major gradient and a row-major operand a row-major one, so `linear`'s weight
//! (used as `weight.t()`) gets a contiguous gradient without a transposing copy.

use amp_autograd::{grad, ops, GradOptions, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};

fn leaf(raw: Raw) -> Tensor {
    let t = Tensor::from_raw(raw);
    t.requires_grad_(true).unwrap();
    t
}

fn strides(t: &Tensor) -> Vec<usize> {
    t.grad().expect("a gradient").data().strides().to_vec()
}

#[test]
fn linear_weight_gradient_is_contiguous() {
    let mut g = Generator::new(3);
    let x = leaf(Raw::randn([4, 3], DType::F32, &mut g).unwrap());
    let w = leaf(Raw::randn([5, 3], DType::F32, &mut g).unwrap());
    let b = leaf(Raw::randn([5], DType::F32, &mut g).unwrap());
    let y = ops::linear(&x, &w, Some(&b)).unwrap();
    ops::sum(&y, &[], false, None).unwrap().backward().unwrap();
    assert_eq!(strides(&w), [3, 1], "weight [5, 3]");
    assert_eq!(strides(&x), [3, 1], "input [4, 3]");
}

#[test]
fn a_column_major_operand_gets_a_column_major_gradient() {
    let mut g = Generator::new(4);
    for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
        // `a` is [4, 3] and `b` [3, 5]; a transposed one is a column-major leaf.
        let make = |rows: usize, cols: usize, t: bool, g: &mut Generator| {
            if t {
                let r = Raw::randn([cols, rows], DType::F32, g).unwrap();
                leaf(r.transpose(0, 1).unwrap())
            } else {
                leaf(Raw::randn([rows, cols], DType::F32, g).unwrap())
            }
        };
        let a = make(4, 3, a_t, &mut g);
        let b = make(3, 5, b_t, &mut g);
        let y = ops::sum(&ops::mm(&a, &b).unwrap(), &[], false, None).unwrap();
        let gs = grad(&[y], &[a, b], &[None], GradOptions::default()).unwrap();
        let s = |i: usize| gs[i].as_ref().unwrap().data().strides().to_vec();
        let want =
            |rows: usize, cols: usize, t: bool| if t { vec![1, rows] } else { vec![cols, 1] };
        assert_eq!(s(0), want(4, 3, a_t), "a transposed: {a_t}");
        assert_eq!(s(1), want(3, 5, b_t), "b transposed: {b_t}");
    }
}
