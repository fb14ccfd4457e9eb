//! Shapes whose size overflows and buffers that cannot be allocated are errors (PyTorch's
//! "Storage size calculation overflowed"; the CPU allocator's "not enough memory"), never a
//! wrapped element count or an aborted process.

use amp_tensor::{DType, Error, Shape, Tensor};

const HUGE: usize = (1 << 62) + 1;

fn overflowed(e: &Error) -> bool {
    e.to_string()
        .starts_with("Storage size calculation overflowed with sizes=")
}

#[test]
fn an_overflowing_shape_is_refused_by_every_constructor() {
    // [2^62 + 1, 4] has 2^64 + 4 elements: the wrapped count (4) must not be accepted.
    let e = Tensor::from_vec(vec![0f32; 4], [HUGE, 4]).unwrap_err();
    assert!(overflowed(&e), "{e}");
    assert!(overflowed(
        &Tensor::try_zeros([HUGE, 4], DType::F32).unwrap_err()
    ));
    assert!(overflowed(
        &Tensor::try_full([HUGE, 4], 2.0, DType::BF16).unwrap_err()
    ));
    assert!(overflowed(
        &Tensor::try_ones([HUGE, 4], DType::I64).unwrap_err()
    ));
    // Fits in elements, not in bytes.
    assert!(overflowed(
        &Tensor::try_zeros([1usize << 62], DType::F64).unwrap_err()
    ));
    assert_eq!(Shape::from([HUGE, 4]).checked_elem_count(), None);
}

#[test]
fn views_to_an_overflowing_shape_are_refused() {
    let t = Tensor::zeros([4], DType::F32);
    let e = t.reshape(vec![HUGE as i64, 4]).unwrap_err();
    assert!(overflowed(&e), "{e}");
    assert!(t.view(vec![-1, HUGE as i64, 4]).is_err());
    let one = Tensor::zeros([1, 4], DType::F32);
    let e = one.expand(vec![HUGE as i64, 4]).unwrap_err();
    assert!(overflowed(&e), "{e}");
    assert!(overflowed(&one.broadcast_to([HUGE, 4]).unwrap_err()));
}

#[test]
#[should_panic(
    expected = "Storage size calculation overflowed with sizes=[4611686018427387905, 4]"
)]
fn the_infallible_constructor_panics_with_the_message() {
    let _ = Tensor::zeros([HUGE, 4], DType::F32);
}

#[test]
fn a_failed_allocation_is_an_error() {
    // 2^55 bytes is beyond any machine's address space: try_reserve fails, nothing aborts.
    let e = Tensor::try_zeros([1usize << 53], DType::F32).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { bytes } if bytes == 1 << 55),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "DefaultCPUAllocator: not enough memory: you tried to allocate 36028797018963968 bytes."
    );
    // The process goes on: a normal allocation still works.
    assert_eq!(
        Tensor::try_zeros([3], DType::F32).unwrap().to_vec_f64(),
        [0.0; 3]
    );
}

#[test]
fn the_pool_helpers_refuse_what_cannot_be_allocated() {
    use amp_tensor::pool;
    let oom = |bytes| Error::OutOfMemory { bytes };
    // 2^51 bytes (in any element type) and a count whose bytes overflow (saturated).
    let n = 1usize << 48;
    assert_eq!(pool::try_with_capacity::<f64>(n).unwrap_err(), oom(n * 8));
    assert_eq!(pool::try_filled(n, 1.5f64).unwrap_err(), oom(n * 8));
    assert_eq!(pool::try_zeroed::<f64>(n).unwrap_err(), oom(n * 8));
    assert_eq!(
        pool::try_collect(n, (0..n).map(|i| i as f64)).unwrap_err(),
        oom(n * 8)
    );
    assert_eq!(pool::try_recycled_vec::<f64>(n).unwrap_err(), oom(n * 8));
    assert_eq!(
        pool::try_vec_with_capacity::<f64>(n).unwrap_err(),
        oom(n * 8)
    );
    let mut v = vec![1.0f64; 3];
    assert_eq!(pool::try_resize(&mut v, n, 0.0).unwrap_err(), oom(n * 8));
    assert_eq!(v, [1.0; 3]);
    assert_eq!(
        pool::try_zeroed::<u64>(usize::MAX).unwrap_err(),
        oom(usize::MAX)
    );
    assert_eq!(
        pool::try_with_capacity::<u32>(usize::MAX / 2).unwrap_err(),
        oom(usize::MAX)
    );
    // What can be had is what the infallible forms give.
    assert_eq!(pool::try_zeroed::<f32>(5).unwrap(), [0.0f32; 5]);
    assert_eq!(pool::try_zeroed::<bool>(2).unwrap(), [false; 2]);
    assert!(pool::try_zeroed::<amp_tensor::half::bf16>(0)
        .unwrap()
        .is_empty());
    assert_eq!(pool::try_filled(3, 7i64).unwrap(), [7; 3]);
    assert_eq!(pool::try_collect(4, 1..5).unwrap(), [1, 2, 3, 4]);
    let mut w = vec![2u8];
    pool::try_resize(&mut w, 3, 9).unwrap();
    assert_eq!(w, [2, 9, 9]);
    let v = pool::try_vec_with_capacity::<f32>(100).unwrap();
    assert!(v.is_empty() && v.capacity() >= 100);
}
