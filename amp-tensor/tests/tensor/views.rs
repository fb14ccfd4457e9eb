//! Views, construction, extraction and errors, with a `check` helper per concept.

use amp_tensor::{DType, Error, Generator, Tensor};
use proptest::prelude::*;

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape).unwrap()
}

fn check(x: &Tensor, dims: &[usize], expect: &[f64]) {
    assert_eq!(x.dims(), dims);
    assert_eq!(x.to_vec_f64(), expect);
}

#[test]
fn views_share_storage() {
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32)
        .unwrap()
        .reshape([2, 3])
        .unwrap();
    check(
        &x.transpose(0, 1).unwrap(),
        &[3, 2],
        &[0., 3., 1., 4., 2., 5.],
    );
    check(
        &x.permute(&[1usize, 0]).unwrap(),
        &[3, 2],
        &[0., 3., 1., 4., 2., 5.],
    );
    check(&x.narrow(1, 1, 2).unwrap(), &[2, 2], &[1., 2., 4., 5.]);
    check(&x.select(1, -1).unwrap(), &[2], &[2., 5.]);
    check(&x.get(1).unwrap(), &[3], &[3., 4., 5.]);
    check(
        &x.unsqueeze(0).unwrap(),
        &[1, 2, 3],
        &[0., 1., 2., 3., 4., 5.],
    );
    check(
        &x.unsqueeze(-1).unwrap().squeeze(-1).unwrap(),
        &[2, 3],
        &[0., 1., 2., 3., 4., 5.],
    );
    check(&x.slice(1, 0, 3, 2).unwrap(), &[2, 2], &[0., 2., 3., 5.]);
    check(
        &x.select(0, 0).unwrap().expand([2, -1]).unwrap(),
        &[2, 3],
        &[0., 1., 2., 0., 1., 2.],
    );
    check(&x.flatten(0, -1).unwrap(), &[6], &[0., 1., 2., 3., 4., 5.]);
    check(&x.reshape([-1]).unwrap(), &[6], &[0., 1., 2., 3., 4., 5.]);
    let v = x.transpose(0, 1).unwrap();
    assert!(v.is_view() && v.same_storage(&x) && !v.is_contiguous());
    assert!(v.view([6]).is_err());
    let r = v.reshape([6]).unwrap();
    assert!(!r.same_storage(&x));
    check(&r, &[6], &[0., 3., 1., 4., 2., 5.]);
    assert!(v.contiguous().is_contiguous());
    assert!(
        x.is_view(),
        "reshape of a contiguous tensor is a view, as in PyTorch"
    );
    assert!(!Tensor::zeros([2], DType::F32).is_view());
}

#[test]
fn writes_through_views() {
    let x = Tensor::zeros([2, 3], DType::F32);
    x.select(1, 1)
        .unwrap()
        .copy_(&Tensor::scalar(7.0f32))
        .unwrap();
    check(&x, &[2, 3], &[0., 7., 0., 0., 7., 0.]);
    // broadcast + cast copy into a transposed view
    let y = Tensor::zeros([3, 2], DType::BF16);
    y.transpose(0, 1)
        .unwrap()
        .copy_(&t(&[1., 2., 3.], &[3]))
        .unwrap();
    check(&y, &[3, 2], &[1., 1., 2., 2., 3., 3.]);
    // aliasing copy: shift within the same storage
    let z = Tensor::arange(0.0, 4.0, 1.0, DType::F64).unwrap();
    z.narrow(0, 1, 3)
        .unwrap()
        .copy_(&z.narrow(0, 0, 3).unwrap())
        .unwrap();
    check(&z, &[4], &[0., 0., 1., 2.]);
    z.fill_(2.5).unwrap();
    check(&z, &[4], &[2.5; 4]);
}

#[test]
fn construction_and_extraction() {
    check(&Tensor::eye(2, DType::BF16), &[2, 2], &[1., 0., 0., 1.]);
    check(
        &Tensor::arange(1.0, 2.0, 0.25, DType::F16).unwrap(),
        &[4],
        &[1., 1.25, 1.5, 1.75],
    );
    check(&Tensor::full([2], 3i64, DType::I32), &[2], &[3., 3.]);
    check(&Tensor::ones([], DType::F64), &[], &[1.]);
    assert_eq!(Tensor::scalar(2.5f32).item::<f32>().unwrap(), 2.5);
    let e = Tensor::zeros([2], DType::F32).item_f64().unwrap_err();
    assert_eq!(
        e.to_string(),
        "item: a Tensor with 2 elements cannot be converted to Scalar"
    );
    assert!(matches!(
        Tensor::zeros([2], DType::F32).to_vec::<f64>(),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(Tensor::from_vec(vec![1.0f32; 5], [2, 3]).is_err());
    let mut g = Generator::new(7);
    let a = Tensor::randn([1000], DType::F32, &mut g)
        .unwrap()
        .to_vec_f64();
    let mut g2 = Generator::new(7);
    let b = Tensor::randn([1000], DType::F32, &mut g2)
        .unwrap()
        .to_vec_f64();
    assert_eq!(a, b, "seeded generator is reproducible");
    let mean = a.iter().sum::<f64>() / 1000.0;
    assert!(mean.abs() < 0.15, "{mean}");
    let u = Tensor::rand([1000], DType::BF16, &mut g)
        .unwrap()
        .to_vec_f64();
    assert!(u.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert!(Tensor::randn([2], DType::I64, &mut g).is_err());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let x = Tensor::zeros([2, 3], DType::F32);
    assert!(matches!(
        x.transpose(0, 2),
        Err(Error::DimOutOfRange { dim: 2, ndim: 2 })
    ));
    assert!(x.narrow(1, 2, 2).is_err());
    assert!(x.select(0, 2).is_err());
    assert!(x.reshape([4, -1]).is_err());
    assert!(x.reshape([-1, -1]).is_err());
    assert!(x.expand([3, 3]).is_err());
    assert!(x.permute(&[0usize, 0]).is_err());
    assert!(x.flatten(1, 0).is_err());
    assert!(x.to_device(amp_tensor::Device::Cuda(0)).is_err());
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(64))]

    /// reshape/permute/narrow compositions agree with a reference model on flat indices.
    #[test]
    fn permute_matches_reference(d0 in 1usize..4, d1 in 1usize..4, d2 in 1usize..4, p in 0usize..6) {
        let perms = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
        let perm = perms[p];
        let dims = [d0, d1, d2];
        let n = d0 * d1 * d2;
        let x = Tensor::arange(0.0, n as f64, 1.0, DType::F64).unwrap().reshape(dims).unwrap();
        let y = x.permute(&perm).unwrap();
        let got = y.to_vec_f64();
        let nd = [dims[perm[0]], dims[perm[1]], dims[perm[2]]];
        let mut k = 0;
        for i in 0..nd[0] { for j in 0..nd[1] { for l in 0..nd[2] {
            let mut idx = [0; 3];
            idx[perm[0]] = i; idx[perm[1]] = j; idx[perm[2]] = l;
            let flat = idx[0] * d1 * d2 + idx[1] * d2 + idx[2];
            prop_assert_eq!(got[k], flat as f64);
            k += 1;
        }}}
        // a permuted tensor reshaped back through a copy keeps its values
        let r = y.reshape([-1]).unwrap();
        prop_assert_eq!(r.to_vec_f64(), got);
    }

    #[test]
    fn broadcasting_matches_reference(a in proptest::collection::vec(1usize..4, 0..4), mask in proptest::collection::vec(any::<bool>(), 4)) {
        // b: a with some dims set to 1 and possibly fewer leading dims
        let b: Vec<usize> = a.iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect();
        let lead = if mask[0] && !b.is_empty() { 1 } else { 0 };
        let b = b[lead..].to_vec();
        let out = amp_tensor::broadcast_shapes("t", &a, &b).unwrap();
        prop_assert_eq!(&out, &a);
        let n: usize = b.iter().product();
        let tb = Tensor::arange(0.0, n as f64, 1.0, DType::F32).unwrap().reshape(b.clone()).unwrap();
        let e = tb.broadcast_to(a.clone()).unwrap();
        let got = e.to_vec_f64();
        // reference: index each output position back into b
        let total: usize = a.iter().product();
        for (k, &g) in got.iter().enumerate().take(total) {
            let mut rem = k;
            let mut idx = vec![0; a.len()];
            for d in (0..a.len()).rev() { idx[d] = rem % a[d]; rem /= a[d]; }
            let mut flat = 0;
            for (j, &bd) in b.iter().enumerate() {
                let i = idx[j + a.len() - b.len()];
                flat = flat * bd + if bd == 1 { 0 } else { i };
            }
            prop_assert_eq!(g, flat as f64);
        }
    }
}
