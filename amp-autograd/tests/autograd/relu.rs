//! `relu`'s backward is PyTorch's `threshold_backward(grad, x, 0)`: a masked element's
//! gradient is exactly 0 whatever flows in (inf, NaN), a NaN input lets the gradient
//! through, and under `create_graph` the gradient is differentiable in the incoming
//! gradient (`ThresholdBackwardBackward0`) with a zero derivative in `x`.

use amp_autograd::{grad, ops, GradOptions, Tensor};
use amp_tensor::DType;

fn leaf(v: &[f64], dtype: DType) -> Tensor {
    let t = Tensor::from_vec(v.to_vec(), [v.len()])
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    t.requires_grad_(true).unwrap();
    t
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn masked_gradients_are_exact_zeros() {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let x = leaf(&[-1.0, 0.0, 2.0, nan, -0.0, 3.0], dtype);
        let g = Tensor::from_vec(vec![inf, nan, 3.0, 5.0, -inf, inf], [6])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        ops::relu(&x)
            .unwrap()
            .backward_with(amp_autograd::BackwardOptions {
                gradient: Some(&g),
                ..Default::default()
            })
            .unwrap();
        let got = x.grad().expect("grad");
        assert_eq!(got.dtype(), dtype);
        let want = Tensor::from_vec(vec![0.0, 0.0, 3.0, 5.0, 0.0, inf], [6]).unwrap();
        assert_eq!(bits(&got), bits(&want), "{dtype}");
    }
}

#[test]
fn double_backward_goes_through_the_incoming_gradient() {
    let x = leaf(&[-1.5, 0.5, 2.0, -0.25], DType::F64);
    let v = leaf(&[1.0, 2.0, 3.0, 4.0], DType::F64);
    // g(x, v) = d/dx sum(relu(x) * v) = v * (x > 0); sum(g²) depends on v, not on x.
    let y = ops::sum_all(&ops::mul(&ops::relu(&x).unwrap(), &v).unwrap()).unwrap();
    let opts = GradOptions {
        create_graph: true,
        ..Default::default()
    };
    let gx = grad(&[y], std::slice::from_ref(&x), &[None], opts).unwrap()[0]
        .clone()
        .expect("dx");
    assert_eq!(gx.to_vec::<f64>().unwrap(), vec![0.0, 2.0, 3.0, 0.0]);
    let penalty = ops::sum_all(&ops::mul(&gx, &gx).unwrap()).unwrap();
    let opts = GradOptions {
        allow_unused: true,
        ..Default::default()
    };
    let second = grad(&[penalty], &[x.clone(), v.clone()], &[None], opts).unwrap();
    let dx = second[0]
        .as_ref()
        .expect("x is reached (with a zero derivative)");
    assert_eq!(dx.to_vec::<f64>().unwrap(), vec![0.0; 4]);
    let dv = second[1].as_ref().expect("dv");
    assert_eq!(dv.to_vec::<f64>().unwrap(), vec![0.0, 4.0, 6.0, 0.0]);
}
