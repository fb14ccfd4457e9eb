//! Pooling modules and `Embedding`.

use amp_autograd::{ops, Tensor};
use amp_nn::{
    AdaptiveAvgPool2d, AdaptiveMaxPool3d, AvgPool1d, AvgPool2d, Embedding, MaxPool2d, MaxPool3d,
    Module,
};
use amp_tensor::{DType, Generator};

#[test]
fn pooling_modules_follow_their_functional_forms() {
    let mut gen = Generator::new(0);
    let x = Tensor::randn([2, 3, 6, 8], DType::F32, &mut gen).unwrap();
    let m = MaxPool2d::new([2, 2]);
    assert!(m.named_parameters().is_empty());
    let y = m.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 3, 3, 4]);
    let f = ops::max_pool2d(&x, &[2], &[], &[0], &[1], false).unwrap();
    assert_eq!(y.to_vec_f64(), f.to_vec_f64());
    let (_, idx) = m.forward_with_indices(&x).unwrap();
    assert_eq!(idx.dtype(), DType::I64);

    let mut a = AvgPool2d::new([3, 3]);
    a.stride = [2, 2];
    a.padding = [1, 1];
    a.count_include_pad = false;
    assert_eq!(a.forward(&x).unwrap().dims(), &[2, 3, 3, 4]);
    assert_eq!(
        AvgPool1d::new([2])
            .forward(&Tensor::ones([1, 4], DType::F32))
            .unwrap()
            .to_vec_f64(),
        [1.0, 1.0]
    );
    let ad = AdaptiveAvgPool2d::new([1, 1]).forward(&x).unwrap();
    assert_eq!(ad.dims(), &[2, 3, 1, 1]);
    let mean = ops::mean(&x, &[2, 3], true, None).unwrap();
    for (p, q) in ad.to_vec_f64().iter().zip(mean.to_vec_f64()) {
        assert!((p - q).abs() < 1e-5);
    }
    let x3 = Tensor::randn([1, 2, 4, 4, 4], DType::F32, &mut gen).unwrap();
    assert_eq!(
        MaxPool3d::new([2, 2, 2]).forward(&x3).unwrap().dims(),
        &[1, 2, 2, 2, 2]
    );
    assert_eq!(
        AdaptiveMaxPool3d::new([1, 2, 3])
            .forward(&x3)
            .unwrap()
            .dims(),
        &[1, 2, 1, 2, 3]
    );
}

#[test]
fn embedding_initialises_normal_and_zeroes_padding_row() {
    let mut gen = Generator::new(1);
    let e = Embedding::new(200, 50, Some(3), &mut gen).unwrap();
    let names: Vec<String> = e.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
    assert!(e.weight.requires_grad());
    assert_eq!(e.weight.dtype(), DType::F32);
    let w = e.weight.to_vec_f64();
    assert!(w[3 * 50..4 * 50].iter().all(|&v| v == 0.0));
    let n = w.len() as f64;
    let mean = w.iter().sum::<f64>() / n;
    let var = w.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((var.sqrt() - 1.0).abs() < 0.05, "std {}", var.sqrt());

    let idx = Tensor::from_vec(vec![3i64, 7, 3], [3]).unwrap();
    let y = e.forward(&idx).unwrap();
    assert_eq!(y.dims(), &[3, 50]);
    ops::sum(&y, &[], false, None).unwrap().backward().unwrap();
    let g = e.weight.grad().unwrap().to_vec_f64();
    assert!(g[3 * 50..4 * 50].iter().all(|&v| v == 0.0));
    assert!(g[7 * 50..8 * 50].iter().all(|&v| v == 1.0));
    assert!(Embedding::new(4, 2, Some(4), &mut gen).is_err());
}
