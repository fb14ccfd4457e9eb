//! `copy_` between distinct tensors (the direct paths) and between views of one storage,
//! against an element-by-element reference; the host buffer cache never changes a value.

use amp_tensor::{pool, DType, Tensor};

/// `dst.copy_(src)` must leave `dst` equal to `src` cast to `dst`'s dtype, element by element.
fn check(src: &Tensor, dst: &Tensor) {
    dst.copy_(src).unwrap();
    let want: Vec<f64> = src
        .to_dtype(dst.dtype())
        .unwrap()
        .broadcast_to(dst.dims().to_vec())
        .unwrap()
        .to_vec_f64();
    assert_eq!(
        dst.to_vec_f64(),
        want,
        "src {:?} -> dst {:?}",
        src.layout(),
        dst.layout()
    );
}

fn arange(n: usize, dtype: DType) -> Tensor {
    Tensor::arange(0.0, n as f64, 1.0, dtype).unwrap()
}

#[test]
fn copy_between_distinct_tensors_every_layout_pair() {
    for n in [6 * 8, 600 * 512] {
        let (r, c) = (n / 8, 8);
        let src_c = arange(n, DType::F32).reshape([r, c]).unwrap();
        let src_t = arange(n, DType::F32).reshape([c, r]).unwrap().t().unwrap();
        for src in [&src_c, &src_t] {
            for dtype in [DType::F32, DType::BF16, DType::F64, DType::I64] {
                let dst_c = Tensor::zeros([r, c], dtype);
                check(src, &dst_c);
                let dst_t = Tensor::zeros([c, r], dtype).t().unwrap();
                check(src, &dst_t);
            }
        }
    }
}

#[test]
fn copy_broadcasts_and_writes_through_views() {
    let base = Tensor::zeros([4, 6], DType::F32);
    let window = base.narrow(1, 2, 3).unwrap();
    let row = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    check(&row, &window);
    let b = base.to_vec::<f32>().unwrap();
    assert_eq!(&b[..6], &[0.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
}

#[test]
fn copy_within_one_storage_reads_before_it_writes() {
    // dst and src overlap: x[1:] = x[:-1] must shift, not smear.
    let x = arange(8, DType::F32);
    let (dst, src) = (x.narrow(0, 1, 7).unwrap(), x.narrow(0, 0, 7).unwrap());
    dst.copy_(&src).unwrap();
    assert_eq!(
        x.to_vec::<f32>().unwrap(),
        vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
}

#[test]
fn recycled_buffers_never_leak_old_values() {
    let n = 1 << 20; // 4 MB of f32, 2 MB of bf16: pooled sizes
    for round in 0..3 {
        let garbage = Tensor::full([n], f64::NAN, DType::BF16);
        drop(garbage);
        let x = arange(n, DType::F32);
        let y = x.to_dtype(DType::BF16).unwrap();
        let back = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for (i, v) in back.iter().enumerate().step_by(4099) {
            assert_eq!(
                *v,
                half::bf16::from_f32(i as f32).to_f32(),
                "round {round} at {i}"
            );
        }
        // A strided source goes through the gather path, also recycled.
        let t = x.reshape([1024, 1024]).unwrap().t().unwrap().contiguous();
        assert_eq!(t.to_vec::<f32>().unwrap()[1], 1024.0);
    }
    assert!(pool::stats().cached_bytes <= pool::cache_limit());
}

#[test]
fn cache_limit_bounds_what_is_kept() {
    let before = pool::cache_limit();
    pool::set_cache_limit(0);
    drop(Tensor::zeros([1 << 20], DType::F32));
    assert_eq!(pool::stats().cached_bytes, 0);
    pool::set_cache_limit(before);
}
