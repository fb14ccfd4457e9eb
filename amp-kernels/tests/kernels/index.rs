//! cat/stack and the indexing family against references written here: every dtype
//! where it matters, strided inputs, negative dims, PyTorch's rules and messages.

use amp_kernels::*;
use amp_tensor::{DType, Tensor};

fn t(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn ints(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap()
}

fn arange(n: usize, shape: &[usize], dtype: DType) -> Tensor {
    t(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), shape, dtype)
}

/// Assert shape, dtype and exact values.
fn check(got: &Tensor, want: &[f64], shape: &[usize], dtype: DType) {
    assert_eq!(got.dims(), shape, "shape");
    assert_eq!(got.dtype(), dtype, "dtype");
    assert!(got.is_contiguous());
    assert_eq!(got.to_vec_f64(), want);
}

fn err(r: amp_tensor::Result<Tensor>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn cat_rules() {
    let a = arange(6, &[2, 3], DType::F16);
    let b = arange(4, &[2, 2], DType::F32).t().unwrap(); // strided, [2, 2]
    let r = cat(&[a.clone(), b.clone()], 1).unwrap();
    check(
        &r,
        &[0., 1., 2., 0., 2., 3., 4., 5., 1., 3.],
        &[2, 5],
        DType::F32,
    );
    // An empty part along the cat dim (any dtype) adds nothing, as in PyTorch.
    for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let empty = Tensor::from_vec(Vec::<f64>::new(), [2, 0])
            .unwrap()
            .to_dtype(d)
            .unwrap();
        let r = cat(&[a.clone(), empty, b.clone()], 1).unwrap();
        // ... but takes part in the promotion (float64 wins).
        let want = if d == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        check(&r, &[0., 1., 2., 0., 2., 3., 4., 5., 1., 3.], &[2, 5], want);
    }
    let b2 = arange(4, &[2, 2], DType::F32);
    let r = cat(&[a.clone(), b2.clone()], -1).unwrap();
    check(
        &r,
        &[0., 1., 2., 0., 1., 3., 4., 5., 2., 3.],
        &[2, 5],
        DType::F32,
    );
    let bt = arange(6, &[3, 2], DType::BF16).t().unwrap();
    let r = cat(&[a.clone(), bt], 0).unwrap();
    // f16 with bf16 promotes to f32
    check(
        &r,
        &[0., 1., 2., 3., 4., 5., 0., 2., 4., 1., 3., 5.],
        &[4, 3],
        DType::F32,
    );
    // legacy: 1-D empty tensors are skipped (but count in the dtype)
    let e = Tensor::zeros([0usize], DType::F64);
    let r = cat(&[e.clone(), a.clone(), e.clone()], 0).unwrap();
    check(&r, &[0., 1., 2., 3., 4., 5.], &[2, 3], DType::F64);
    let r = cat(&[e.clone(), e.clone()], 0).unwrap();
    check(&r, &[], &[0], DType::F64);
    let ints_cat = cat(
        &[
            ints(&[1, 2], &[2]),
            Tensor::from_vec(vec![true], [1]).unwrap(),
        ],
        0,
    )
    .unwrap();
    check(&ints_cat, &[1., 2., 1.], &[3], DType::I64);
    let m = err(cat(&[a.clone(), arange(4, &[2, 2], DType::F16)], 0));
    assert!(m.contains("Sizes of tensors must match except in dimension 0. Expected size 3 but got size 2 for tensor number 1 in the list."), "{m}");
    let m = err(cat(&[a.clone(), arange(3, &[3], DType::F16)], 0));
    assert!(
        m.contains("Tensors must have same number of dimensions: got 2 and 1"),
        "{m}"
    );
    assert!(err(cat(&[], 0)).contains("expected a non-empty list of Tensors"));
    assert!(err(cat(&[Tensor::scalar(1.0f32)], 0))
        .contains("zero-dimensional tensor (at position 0) cannot be concatenated"));
    assert!(cat(std::slice::from_ref(&a), 2).is_err());
    // a 3-D middle-dim cat against a reference
    let x = arange(24, &[2, 3, 4], DType::F32);
    let y = arange(16, &[2, 2, 4], DType::F32);
    let r = cat(&[x.clone(), y.clone()], 1).unwrap();
    let mut want = Vec::new();
    for o in 0..2 {
        want.extend((0..12).map(|k| (o * 12 + k) as f64));
        want.extend((0..8).map(|k| (o * 8 + k) as f64));
    }
    check(&r, &want, &[2, 5, 4], DType::F32);
}

#[test]
fn stack_rules() {
    let a = arange(6, &[2, 3], DType::F32);
    let b = arange(6, &[3, 2], DType::F32).t().unwrap();
    let r = stack(&[a.clone(), b.clone()], 0).unwrap();
    check(
        &r,
        &[0., 1., 2., 3., 4., 5., 0., 2., 4., 1., 3., 5.],
        &[2, 2, 3],
        DType::F32,
    );
    let r = stack(&[a.clone(), b.clone()], -1).unwrap();
    check(
        &r,
        &[0., 0., 1., 2., 2., 4., 3., 1., 4., 3., 5., 5.],
        &[2, 3, 2],
        DType::F32,
    );
    let r = stack(&[Tensor::scalar(1.0f32), Tensor::scalar(2.0f32)], 0).unwrap();
    check(&r, &[1., 2.], &[2], DType::F32);
    let m = err(stack(&[a.clone(), arange(3, &[3], DType::F32)], 0));
    assert!(m.contains("stack expects each tensor to be equal size, but got [2, 3] at entry 0 and [3] at entry 1"), "{m}");
    assert!(stack(&[], 0).is_err());
    assert!(stack(std::slice::from_ref(&a), 3).is_err());
}

#[test]
fn index_select_and_embedding() {
    for dtype in DType::ALL {
        let x = arange(12, &[4, 3], dtype);
        let i = ints(&[3, 0, 3], &[3]);
        check(
            &index_select(&x, 0, &i).unwrap(),
            &[9., 10., 11., 0., 1., 2., 9., 10., 11.].map(|v| cast(v, dtype)),
            &[3, 3],
            dtype,
        );
    }
    let x = arange(12, &[3, 4], DType::F32).t().unwrap(); // [4, 3], strided
    let i = Tensor::from_vec(vec![2i32, 0], [2]).unwrap();
    check(
        &index_select(&x, -1, &i).unwrap(),
        &[8., 0., 9., 1., 10., 2., 11., 3.],
        &[4, 2],
        DType::F32,
    );
    check(
        &index_select(&x, 0, &ints(&[1], &[])).unwrap(),
        &[1., 5., 9.],
        &[1, 3],
        DType::F32,
    );
    let m = err(index_select(&x, 0, &ints(&[4], &[1])));
    assert!(m.contains("index out of range in self"), "{m}");
    assert!(err(index_select(&x, 0, &ints(&[-1], &[1]))).contains("index out of range in self"));
    assert!(index_select(&x, 0, &t(&[0.0], &[1], DType::F32)).is_err());
    assert!(index_select(&x, 0, &ints(&[0, 1], &[1, 2])).is_err());
    assert!(index_select(&x, 2, &ints(&[0], &[1])).is_err());
    let s = Tensor::scalar(7.0f32);
    check(
        &index_select(&s, 0, &ints(&[0], &[1])).unwrap(),
        &[7.],
        &[],
        DType::F32,
    );

    let w = arange(10, &[5, 2], DType::BF16);
    let idx = ints(&[4, 0, 1, 4, 2, 2], &[2, 3]);
    let e = embedding(&w, &idx).unwrap();
    check(
        &e,
        &[8., 9., 0., 1., 2., 3., 8., 9., 4., 5., 4., 5.],
        &[2, 3, 2],
        DType::BF16,
    );
    assert!(err(embedding(&w, &ints(&[5], &[1]))).contains("index out of range in self"));
    assert!(embedding(&arange(5, &[5], DType::F32), &idx).is_err());

    let g = t(
        &(0..12).map(|v| v as f64).collect::<Vec<_>>(),
        &[2, 3, 2],
        DType::F16,
    );
    let gw = embedding_backward(&g, &idx, 5, None).unwrap();
    check(
        &gw,
        &[2., 3., 4., 5., 18., 20., 0., 0., 6., 8.],
        &[5, 2],
        DType::F16,
    );
    let gw = embedding_backward(&g, &idx, 5, Some(-1)).unwrap();
    check(
        &gw,
        &[2., 3., 4., 5., 18., 20., 0., 0., 0., 0.],
        &[5, 2],
        DType::F16,
    );
    assert!(embedding_backward(&g, &idx, 4, None).is_err());
    assert!(embedding_backward(&g.reshape([6usize, 2]).unwrap(), &idx, 5, None).is_err());
    // f16 gradients accumulate in f32: 3000 ones per row would stall in f16 at 2048
    let many = ints(&vec![1; 3000], &[3000]);
    let gw = embedding_backward(&Tensor::ones([3000usize, 1], DType::F16), &many, 2, None).unwrap();
    check(&gw, &[0., 3000.], &[2, 1], DType::F16);
}

fn cast(v: f64, dtype: DType) -> f64 {
    if dtype == DType::Bool {
        (v != 0.0) as u8 as f64
    } else {
        v
    }
}

#[test]
fn gather_scatter() {
    let x = arange(12, &[3, 4], DType::F32);
    let idx = ints(&[2, 0, 1, 1, 0, 0], &[2, 3]);
    // dim 0: out[i][j] = x[idx[i][j]][j]
    check(
        &gather(&x, 0, &idx).unwrap(),
        &[8., 1., 6., 4., 1., 2.],
        &[2, 3],
        DType::F32,
    );
    // dim 1 (negative), transposed input
    let xt = arange(12, &[4, 3], DType::F64).t().unwrap(); // [3, 4]: xt[i][j] = 3j + i
    check(
        &gather(&xt, -1, &idx).unwrap(),
        &[6., 0., 3., 4., 1., 1.],
        &[2, 3],
        DType::F64,
    );
    let m = err(gather(&x, 0, &ints(&[3], &[1, 1])));
    assert!(
        m.contains("index 3 is out of bounds for dimension 0 with size 3"),
        "{m}"
    );
    assert!(gather(&x, 0, &ints(&[0, 0, 0, 0, 0], &[1, 5])).is_err());
    assert!(gather(&x, 0, &ints(&[0], &[1])).is_err());
    assert!(gather(&x, 0, &Tensor::from_vec(vec![0i32], [1, 1]).unwrap()).is_err());

    for dtype in DType::FLOATS.into_iter().chain([DType::I32, DType::I64]) {
        let z = Tensor::zeros([3usize, 4], dtype);
        let src = arange(6, &[2, 3], dtype);
        let r = scatter_add(&z, 0, &idx, &src).unwrap();
        // out[idx[i][j]][j] += src[i][j]; both writes to out[0][1] accumulate
        check(
            &r,
            &[0., 5., 5., 0., 3., 0., 2., 0., 0., 0., 0., 0.],
            &[3, 4],
            dtype,
        );
        let r = scatter(&z, 0, &ints(&[2, 0, 1], &[1, 3]), &src).unwrap();
        check(
            &r,
            &[0., 1., 0., 0., 0., 0., 2., 0., 0., 0., 0., 0.],
            &[3, 4],
            dtype,
        );
    }
    let r = scatter_add(
        &x,
        1,
        &ints(&[3, 3, 0], &[1, 3]),
        &t(&[1., 2., 10., 20.], &[2, 2], DType::F32)
            .narrow(0usize, 0, 1)
            .unwrap()
            .reshape([1usize, 2])
            .unwrap(),
    );
    assert!(r.is_err()); // index larger than src along dim 1
    let r = scatter_add(
        &x,
        1,
        &ints(&[3, 3, 0], &[1, 3]),
        &t(&[1., 2., 10.], &[1, 3], DType::F32),
    )
    .unwrap();
    check(
        &r,
        &[10., 1., 2., 6., 4., 5., 6., 7., 8., 9., 10., 11.],
        &[3, 4],
        DType::F32,
    );
    assert!(scatter_add(&x, 0, &idx, &arange(6, &[2, 3], DType::F64)).is_err());
    let m = err(scatter(&x, 0, &ints(&[-1], &[1, 1]), &x));
    assert!(m.contains("out of bounds"), "{m}");
    // f16 accumulation happens in f32 and rounds once
    let many = ints(&vec![0; 4000], &[4000]);
    let r = scatter_add(
        &Tensor::zeros([1usize], DType::F16),
        0,
        &many,
        &Tensor::ones([4000usize], DType::F16),
    )
    .unwrap();
    assert_eq!(r.to_vec_f64(), vec![4000.0]);
}

#[test]
fn index_add_and_copy() {
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I64] {
        let x = Tensor::ones([3usize, 4], dtype);
        let src = arange(8, &[4, 2], dtype).t().unwrap(); // [2, 4] strided
        let i = ints(&[2, 2], &[2]);
        let r = index_add(&x, 0, &i, &src, 2.0).unwrap();
        let mut want = vec![1.0; 12];
        for j in 0..4 {
            want[8 + j] += 2.0 * ((2 * j) as f64 + (2 * j + 1) as f64);
        }
        check(&r, &want, &[3, 4], dtype);
        let r = index_copy(&x, -2, &ints(&[0, 2], &[2]), &src).unwrap();
        check(
            &r,
            &[0., 2., 4., 6., 1., 1., 1., 1., 1., 3., 5., 7.],
            &[3, 4],
            dtype,
        );
    }
    let x = Tensor::zeros([2usize, 3], DType::F32);
    let src = arange(4, &[2, 2], DType::F32);
    let r = index_add(
        &x,
        1,
        &Tensor::from_vec(vec![2i32, 0], [2]).unwrap(),
        &src,
        1.0,
    )
    .unwrap();
    check(&r, &[1., 0., 0., 3., 0., 2.], &[2, 3], DType::F32);
    assert!(err(index_add(&x, 1, &ints(&[3, 0], &[2]), &src, 1.0))
        .contains("index out of range in self"));
    assert!(index_add(&x, 1, &ints(&[0], &[1]), &src, 1.0).is_err());
    assert!(index_add(
        &x,
        1,
        &ints(&[0, 1], &[2]),
        &src.to_dtype(DType::F64).unwrap(),
        1.0
    )
    .is_err());
    let xi = Tensor::zeros([2usize], DType::I64);
    let m = err(index_add(&xi, 0, &ints(&[0], &[1]), &ints(&[1], &[1]), 0.5));
    assert!(
        m.contains("alpha must not be a floating point number"),
        "{m}"
    );
    assert!(index_copy(&x, 0, &ints(&[0, 1, 1], &[3]), &src).is_err());
}

#[test]
fn index_put_advanced() {
    let x = arange(24, &[2, 3, 4], DType::F32);
    let xv = x.to_vec_f64();
    let at = |i: usize, j: usize, k: usize| i * 12 + j * 4 + k;
    // x[[1, 0], [2, -1]] = 100 + arange(4)   (adjacent leading dims; result [2, 4])
    let i0 = ints(&[1, 0], &[2]);
    let i1 = ints(&[2, -1], &[2]);
    let v = arange(4, &[4], DType::F32);
    let r = index_put(&x, &[Some(i0.clone()), Some(i1.clone())], &v, false).unwrap();
    let mut want = xv.clone();
    for k in 0..4 {
        want[at(1, 2, k)] = k as f64;
        want[at(0, 2, k)] = k as f64;
    }
    check(&r, &want, &[2, 3, 4], DType::F32);
    // accumulate with duplicates, index tensors broadcasting ([2, 1] with [3])
    let r = index_put(
        &x,
        &[Some(ints(&[0, 0], &[2, 1])), Some(ints(&[1, 1, 0], &[3]))],
        &Tensor::ones([1usize], DType::F32),
        true,
    )
    .unwrap();
    let mut want = xv.clone();
    for j in [1, 1, 0, 1, 1, 0] {
        for k in 0..4 {
            want[at(0, j, k)] += 1.0;
        }
    }
    check(&r, &want, &[2, 3, 4], DType::F32);
    // x[:, idx] with a full slice first: result [2, 2, 4]
    let vals = arange(16, &[2, 2, 4], DType::F32);
    let r = index_put(&x, &[None, Some(ints(&[2, 0], &[2]))], &vals, false).unwrap();
    let mut want = xv.clone();
    for i in 0..2 {
        for (n, j) in [2, 0].into_iter().enumerate() {
            for k in 0..4 {
                want[at(i, j, k)] = (i * 8 + n * 4 + k) as f64;
            }
        }
    }
    check(&r, &want, &[2, 3, 4], DType::F32);
    // non-adjacent advanced indices go first: x[[0, 1], :, [3, 1]] has shape [2, 3]
    let vals = arange(6, &[2, 3], DType::F32);
    let r = index_put(
        &x,
        &[Some(ints(&[0, 1], &[2])), None, Some(ints(&[3, 1], &[2]))],
        &vals,
        false,
    )
    .unwrap();
    let mut want = xv.clone();
    for (b, (i, k)) in [(0, 3), (1, 1)].into_iter().enumerate() {
        for j in 0..3 {
            want[at(i, j, k)] = (b * 3 + j) as f64;
        }
    }
    check(&r, &want, &[2, 3, 4], DType::F32);
    // f16 accumulation in f32
    let h = Tensor::zeros([2usize], DType::F16);
    let r = index_put(
        &h,
        &[Some(ints(&vec![1; 3000], &[3000]))],
        &Tensor::ones([1usize], DType::F16),
        true,
    )
    .unwrap();
    assert_eq!(r.to_vec_f64(), vec![0.0, 3000.0]);
    // errors
    assert!(err(index_put(&x, &[Some(ints(&[2], &[1]))], &v, false))
        .contains("index 2 is out of bounds for dimension 0 with size 2"));
    assert!(index_put(&x, &[None, None, None, None], &v, false).is_err());
    assert!(index_put(
        &x,
        &[Some(i0.clone())],
        &v.to_dtype(DType::F64).unwrap(),
        false
    )
    .unwrap_err()
    .to_string()
    .contains("Index put requires the source and destination dtypes match"));
    let m = err(index_put(
        &x,
        &[Some(i0.clone())],
        &arange(5, &[5], DType::F32),
        false,
    ));
    assert!(m.contains("shape mismatch: value tensor of shape [5] cannot be broadcast to indexing result of shape [2, 3, 4]"), "{m}");
    assert!(index_put(&x, &[Some(i0), Some(ints(&[0, 1, 2], &[3]))], &v, false).is_err());
    assert!(index_put(&x, &[Some(t(&[0.0], &[1], DType::F32))], &v, false).is_err());
}

#[test]
fn masked_fill_and_one_hot() {
    for dtype in DType::ALL {
        let x = arange(6, &[2, 3], dtype);
        let mask = Tensor::from_vec(vec![true, false, true], [3]).unwrap();
        let r = masked_fill(&x, &mask, 1.0).unwrap();
        let want: Vec<f64> = [1., 1., 1., 1., 4., 1.]
            .iter()
            .enumerate()
            .map(|(k, &v)| if k % 3 == 1 { cast(k as f64, dtype) } else { v })
            .collect();
        check(&r, &want, &[2, 3], dtype);
    }
    let x = arange(6, &[3, 2], DType::F32).t().unwrap();
    let mask = Tensor::from_vec(vec![false, true], [2, 1]).unwrap();
    check(
        &masked_fill(&x, &mask, f64::NEG_INFINITY).unwrap(),
        &[
            0.,
            2.,
            4.,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
        ],
        &[2, 3],
        DType::F32,
    );
    assert!(masked_fill(&x, &ints(&[1], &[1]), 0.0)
        .unwrap_err()
        .to_string()
        .contains("only supports boolean masks"));
    assert!(masked_fill(&x, &Tensor::from_vec(vec![true; 4], [4]).unwrap(), 0.0).is_err());

    let i = ints(&[2, 0, 1, 2], &[2, 2]);
    check(
        &one_hot(&i, -1).unwrap(),
        &[0., 0., 1., 1., 0., 0., 0., 1., 0., 0., 0., 1.],
        &[2, 2, 3],
        DType::I64,
    );
    check(
        &one_hot(&ints(&[1], &[1]), 4).unwrap(),
        &[0., 1., 0., 0.],
        &[1, 4],
        DType::I64,
    );
    assert!(err(one_hot(&i, 2)).contains("Class values must be smaller than num_classes."));
    assert!(err(one_hot(&ints(&[-1], &[1]), 3)).contains("Class values must be non-negative."));
    assert!(err(one_hot(&ints(&[], &[0]), -1))
        .contains("Can not infer total number of classes from empty tensor."));
    assert!(one_hot(&Tensor::from_vec(vec![0i32], [1]).unwrap(), 2).is_err());
}
