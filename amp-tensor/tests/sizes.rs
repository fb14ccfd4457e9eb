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
