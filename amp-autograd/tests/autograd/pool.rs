//! Gradients of the pooling, padding, unpooling, grid-sampling and embedding ops checked
//! by the workspace's gradient checker (`amp_testing::gradcheck`) in f64, first and
//! second order.

use amp_autograd::amp_tensor::{DType, Generator, Tensor as Raw};
use amp_autograd::ops::{self, GridMode, GridPadding};
use amp_autograd::{grad, GradOptions, Tensor};

use amp_testing::gradcheck::{check_grad, check_second_order};
use amp_testing::tensors::uniform_leaf;
use proptest::prelude::*;

#[test]
fn max_pool_gradients() {
    let x = uniform_leaf(&[2, 2, 5, 6], 1, -1.0, 1.0);
    check_grad(
        std::slice::from_ref(&x),
        &|v| ops::max_pool2d(&v[0], &[3, 2], &[2, 1], &[1, 1], &[1, 2], true),
        1e-6,
    );
    let x3 = uniform_leaf(&[1, 1, 4, 3, 5], 2, -1.0, 1.0);
    check_grad(
        &[x3],
        &|v| ops::max_pool3d(&v[0], &[2], &[], &[1], &[1], false),
        1e-6,
    );
    let x1 = uniform_leaf(&[3, 7], 3, -1.0, 1.0);
    check_grad(
        &[x1],
        &|v| ops::max_pool1d(&v[0], &[3], &[2], &[1], &[1], true),
        1e-6,
    );
    // Double backward: zeros, and the first-order grad is on the graph.
    check_second_order(
        &[x],
        &|v| ops::max_pool2d(&v[0], &[2], &[], &[0], &[1], false),
        1e-5,
    );
}

#[test]
fn avg_and_adaptive_pool_gradients() {
    let x = uniform_leaf(&[1, 2, 5, 4], 4, -1.0, 1.0);
    check_grad(
        std::slice::from_ref(&x),
        &|v| ops::avg_pool2d(&v[0], &[3, 2], &[2, 2], &[1, 1], true, false, None),
        1e-6,
    );
    check_grad(
        std::slice::from_ref(&x),
        &|v| ops::avg_pool2d(&v[0], &[2], &[1], &[1], false, true, Some(3)),
        1e-6,
    );
    let x3 = uniform_leaf(&[2, 3, 4, 5], 5, -1.0, 1.0);
    check_grad(
        std::slice::from_ref(&x3),
        &|v| ops::avg_pool3d(&v[0], &[2, 3, 2], &[1, 2, 2], &[1, 1, 0], true, true, None),
        1e-6,
    );
    check_grad(
        std::slice::from_ref(&x3),
        &|v| ops::adaptive_avg_pool_nd(&v[0], 3, &[Some(2), None, Some(3)]),
        1e-6,
    );
    check_grad(
        &[x3],
        &|v| Ok(ops::adaptive_max_pool_nd(&v[0], 3, &[Some(2), Some(3), Some(2)])?.0),
        1e-6,
    );
    check_second_order(
        &[x],
        &|v| ops::adaptive_avg_pool_nd(&v[0], 2, &[Some(3), Some(2)]),
        1e-5,
    );
}

#[test]
fn pad_gradients_every_mode() {
    let x = uniform_leaf(&[2, 4, 5], 6, -1.0, 1.0);
    for mode in ["constant", "reflect", "replicate", "circular"] {
        check_grad(
            std::slice::from_ref(&x),
            &|v| ops::pad(&v[0], &[2, -1, 3, 1], mode, None),
            1e-6,
        );
    }
    let x3 = uniform_leaf(&[1, 2, 3, 3, 3], 7, -1.0, 1.0);
    check_grad(
        std::slice::from_ref(&x3),
        &|v| ops::pad(&v[0], &[1, 1, 0, 2, 1, 0], "replicate", None),
        1e-6,
    );
    check_second_order(
        &[x3],
        &|v| ops::pad(&v[0], &[1, 1, 0, 2, 1, 0], "reflect", None),
        1e-5,
    );
    // Constant padding with a value; a value with another mode is an error.
    let y = ops::pad(&x, &[1, 0], "constant", Some(2.5)).unwrap();
    assert_eq!(y.to_vec_f64()[0], 2.5);
    assert!(ops::pad(&x, &[1, 0], "reflect", Some(2.5)).is_err());
    assert!(ops::pad(&x, &[5, 0], "reflect", None).is_err());
    assert!(ops::pad(&x, &[1, 0], "wrap", None).is_err());
}

#[test]
fn unpool_and_fractional_gradients() {
    let x = uniform_leaf(&[1, 2, 6, 5], 8, -1.0, 1.0);
    let (v, idx) = ops::max_pool2d_with_indices(&x, &[2], &[], &[0], &[1], false).unwrap();
    // The default unpooled size (6, 4) cannot hold indices of a 6x5 plane.
    assert!(ops::max_unpool_nd(&v, &idx, 2, &[2], &[], &[0], None).is_err());
    // Unpooling the pooled values puts each maximum back where it was.
    let u = ops::max_unpool_nd(&v, &idx, 2, &[2], &[], &[0], Some(&[6, 5])).unwrap();
    assert_eq!(u.dims(), &[1, 2, 6, 5]);
    let uv = u.to_vec_f64();
    let xv = x.to_vec_f64();
    for (i, &m) in v.to_vec_f64().iter().enumerate() {
        let at = idx.to_vec::<i64>().unwrap()[i] as usize + (i / 6) * 30;
        assert_eq!(uv[at], m);
        assert_eq!(xv[at], m);
    }
    let vleaf = uniform_leaf(v.dims(), 9, -1.0, 1.0);
    check_grad(
        std::slice::from_ref(&vleaf),
        &|t| ops::max_unpool_nd(&t[0], &idx, 2, &[2], &[], &[0], Some(&[6, 5])),
        1e-6,
    );
    // Double backward through the grad output: unpool(gather) is linear in it.
    let w = uniform_leaf(&[1, 2, 6, 5], 15, -1.0, 1.0);
    check_grad(
        &[w],
        &|t| {
            let u = ops::max_unpool_nd(&vleaf, &idx, 2, &[2], &[], &[0], Some(&[6, 5]))?;
            let g = grad(
                &[u],
                std::slice::from_ref(&vleaf),
                &[Some(t[0].clone())],
                GradOptions {
                    create_graph: true,
                    ..Default::default()
                },
            )?;
            Ok(g[0].clone().expect("a gradient"))
        },
        1e-6,
    );
    let samples = Tensor::from_vec(vec![0.3f64, 0.7, 0.1, 0.9], [1, 2, 2]).unwrap();
    let mut gen = Generator::new(0);
    check_grad(
        std::slice::from_ref(&x),
        &|t| {
            Ok(ops::fractional_max_pool_nd(
                &t[0],
                2,
                &[2],
                Some(&[3, 3]),
                None,
                Some(&samples),
                &mut Generator::new(0),
            )?
            .0)
        },
        1e-6,
    );
    // Without samples the windows are drawn from the generator, reproducibly.
    let a = ops::fractional_max_pool_nd(&x, 2, &[2], None, Some(&[0.5]), None, &mut gen).unwrap();
    let b = ops::fractional_max_pool_nd(
        &x,
        2,
        &[2],
        None,
        Some(&[0.5]),
        None,
        &mut Generator::new(0),
    )
    .unwrap();
    assert_eq!(a.0.dims(), &[1, 2, 3, 2]);
    assert_eq!(a.1.to_vec::<i64>().unwrap(), b.1.to_vec::<i64>().unwrap());
}

#[test]
fn fractional_intervals_follow_pytorch() {
    // PyTorch: alpha = (in - pool) / (out - 1); start_i = int((i + u) * alpha) - int(u * alpha);
    // the last start is in - pool. input 10, pool 2, out 4, u = 0.5: alpha = 8/3.
    let x = Tensor::from_vec((0..10).map(f64::from).collect::<Vec<_>>(), [1, 1, 1, 10]).unwrap();
    let s = Tensor::from_vec(vec![0.5f64, 0.5], [1, 1, 2]).unwrap();
    let (v, i) = ops::fractional_max_pool_nd(
        &x,
        2,
        &[1, 2],
        Some(&[1, 4]),
        None,
        Some(&s),
        &mut Generator::new(0),
    )
    .unwrap();
    // starts int(4/3) - 1 = 0, int(4) - 1 = 3, int(20/3) - 1 = 5, 8 → maxima at 1, 4, 6, 9.
    assert_eq!(i.to_vec::<i64>().unwrap(), [1, 4, 6, 9]);
    assert_eq!(v.to_vec_f64(), [1.0, 4.0, 6.0, 9.0]);
}

#[test]
fn grid_sample_gradients_input_and_grid_first_and_second_order() {
    let x = uniform_leaf(&[1, 2, 3, 4], 10, -1.0, 1.0);
    let g = uniform_leaf(&[1, 2, 3, 2], 11, -1.2, 1.2);
    for mode in [GridMode::Bilinear, GridMode::Bicubic] {
        for pm in [
            GridPadding::Zeros,
            GridPadding::Border,
            GridPadding::Reflection,
        ] {
            for align in [false, true] {
                check_grad(
                    &[x.clone(), g.clone()],
                    &|v| ops::grid_sample(&v[0], &v[1], mode, pm, align),
                    1e-5,
                );
            }
        }
    }
    check_second_order(
        &[x.clone(), g.clone()],
        &|v| ops::grid_sample(&v[0], &v[1], GridMode::Bilinear, GridPadding::Zeros, false),
        1e-4,
    );
    check_grad(
        std::slice::from_ref(&x),
        &|v| ops::grid_sample(&v[0], &g, GridMode::Nearest, GridPadding::Border, false),
        1e-6,
    );
    check_second_order(
        &[x.clone(), g.clone()],
        &|v| ops::grid_sample(&v[0], &v[1], GridMode::Bicubic, GridPadding::Border, false),
        1e-4,
    );
    let x3 = uniform_leaf(&[1, 2, 3, 2, 3], 12, -1.0, 1.0);
    let g3 = uniform_leaf(&[1, 2, 2, 1, 3], 13, -1.0, 1.0);
    check_grad(
        &[x3.clone(), g3.clone()],
        &|v| {
            ops::grid_sample(
                &v[0],
                &v[1],
                GridMode::Bilinear,
                GridPadding::Reflection,
                true,
            )
        },
        1e-5,
    );
    // With gradients the result equals the fused (no-grad) kernel's.
    let fused = amp_autograd::no_grad(|| {
        ops::grid_sample(&x3, &g3, GridMode::Bilinear, GridPadding::Zeros, false)
    })
    .unwrap();
    let diff = ops::grid_sample(&x3, &g3, GridMode::Bilinear, GridPadding::Zeros, false).unwrap();
    for (a, b) in fused.to_vec_f64().iter().zip(diff.to_vec_f64()) {
        assert!((a - b).abs() < 1e-12);
    }
}

#[test]
fn embedding_padding_idx_gets_no_gradient() {
    let w = uniform_leaf(&[5, 3], 14, -1.0, 1.0);
    let idx = Tensor::from_vec(vec![0i64, 2, 4, 2, 0, 1], [2, 3]).unwrap();
    let out = ops::embedding_padded(&w, &idx, Some(-5)).unwrap();
    assert_eq!(out.dims(), &[2, 3, 3]);
    let gs = grad(
        &[out],
        std::slice::from_ref(&w),
        &[Some(Tensor::ones([2, 3, 3], DType::F64))],
        GradOptions::default(),
    )
    .unwrap();
    let g = gs[0].as_ref().unwrap().to_vec_f64();
    assert_eq!(
        g,
        [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    );
    assert!(ops::embedding_padded(&w, &idx, Some(5)).is_err());
}

#[test]
fn sixteen_bit_pooling_keeps_dtype_and_grads() {
    let x = Tensor::from_raw(
        Raw::randn([1, 1, 4, 4], DType::F32, &mut Generator::new(3))
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap(),
    );
    x.requires_grad_(true).unwrap();
    let y = ops::avg_pool2d(&x, &[2], &[], &[0], false, true, None).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    let gs = grad(
        &[y],
        std::slice::from_ref(&x),
        &[Some(Tensor::ones([1, 1, 2, 2], DType::BF16))],
        GradOptions::default(),
    )
    .unwrap();
    let g = gs[0].as_ref().unwrap();
    assert_eq!(g.dtype(), DType::BF16);
    assert!(g.to_vec_f64().iter().all(|&v| v == 0.25));
    let gr = Tensor::from_raw(Raw::zeros([1, 2, 2, 2], DType::F16));
    gr.requires_grad_(true).unwrap();
    let xh = Tensor::from_raw(x.data().to_dtype(DType::F16).unwrap());
    let s = ops::grid_sample(&xh, &gr, GridMode::Bilinear, GridPadding::Zeros, false).unwrap();
    assert_eq!(s.dtype(), DType::F16);
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(16))]

    #[test]
    fn avg_pool1d_gradient_random_geometry(
        l in 3usize..9, k in 1usize..4, s in 1usize..3, ceil in any::<bool>(),
        inc in any::<bool>(), seed in 0u64..1000,
    ) {
        let p = k / 2;
        let x = uniform_leaf(&[2, l], seed, -1.0, 1.0);
        check_grad(&[x], &|v| ops::avg_pool1d(&v[0], &[k], &[s], &[p], ceil, inc), 1e-6);
    }

    #[test]
    fn grid_sample_grid_gradient_random(seed in 0u64..1000, align in any::<bool>()) {
        let x = uniform_leaf(&[1, 1, 3, 3], seed, -1.0, 1.0);
        let g = uniform_leaf(&[1, 2, 2, 2], seed + 1, -0.95, 0.95);
        check_grad(
            &[x, g],
            &|v| ops::grid_sample(&v[0], &v[1], GridMode::Bilinear, GridPadding::Border, align),
            1e-5,
        );
    }
}
