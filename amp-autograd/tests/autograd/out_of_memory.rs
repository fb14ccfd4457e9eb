//! An op whose output cannot be allocated returns PyTorch's "not enough memory" error
//! (a `RuntimeError` there) and the process goes on, instead of aborting. The inputs
//! are tiny: a one-element tensor expanded (a view, no storage) to 2^47 elements, which
//! the ops materialise. Every size passes the shape check (`Shape::storage_bytes`), so
//! the allocator is what refuses: 2^48 bytes and more exceed the 47-bit address space
//! of a 64-bit Linux process and any machine's memory.

use amp_autograd::amp_tensor::{DType, Error as TensorError};
use amp_autograd::{ops, Error, Tensor};

/// 2^47 elements as `[2^17, 2^30]`.
const DIMS: [usize; 2] = [1 << 17, 1 << 30];
const ELEMS: usize = 1 << 47;

/// The expanded view: 2^47 elements over one stored `1.0`.
fn huge() -> Tensor {
    let one = Tensor::from_vec(vec![1.0f32], [1, 1]).unwrap();
    let x = ops::expand(&one, &DIMS).unwrap();
    assert_eq!(x.dims(), DIMS);
    x
}

/// Whether this machine's allocator refuses `bytes` (never touched when it grants them).
/// A machine that would grant them cannot run these tests (the kernel would then write
/// the pages): reported as a skip, never passed silently.
fn refused_here(test: &str, bytes: usize) -> bool {
    let refused = Vec::<u8>::new().try_reserve_exact(bytes).is_err();
    if !refused {
        amp_testing::report_skip(
            test,
            "the out-of-memory checks",
            &format!("this machine's allocator grants {bytes} bytes"),
        );
    }
    refused
}

/// `r` is PyTorch's out-of-memory error for a buffer of exactly `bytes`.
#[track_caller]
fn assert_oom(r: Result<Tensor, Error>, bytes: usize) {
    let e = match r {
        Ok(t) => panic!(
            "expected an out-of-memory error, got a tensor of {:?}",
            t.dims()
        ),
        Err(e) => e,
    };
    assert!(
        matches!(&e, Error::Tensor(TensorError::OutOfMemory { bytes: b }) if *b == bytes),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("DefaultCPUAllocator: not enough memory: you tried to allocate {bytes} bytes.")
    );
}

/// After a refusal, ordinary ops still run (nothing aborted, nothing left locked).
fn still_works() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let b = ops::add(&a, &a).unwrap();
    assert_eq!(b.to_vec_f64(), [2.0, 4.0, 6.0]);
}

/// The body of test `test`, given [`huge`], where this machine refuses `bytes` (else
/// reported as a skip); ordinary ops are checked to run after it ([`still_works`]).
fn where_refused(test: &str, bytes: usize, body: impl FnOnce(Tensor)) {
    if !refused_here(test, bytes) {
        return;
    }
    body(huge());
    still_works();
}

#[test]
fn an_elementwise_output_that_cannot_be_allocated_is_an_error() {
    where_refused(
        "an_elementwise_output_that_cannot_be_allocated_is_an_error",
        ELEMS * 4,
        |x| {
            assert_oom(ops::add(&x, &x), ELEMS * 4);
            assert_oom(ops::relu(&x), ELEMS * 4);
            // A broadcast of a small tensor against the huge one.
            let row = Tensor::from_vec(vec![0.5f32; 4], [4, 1]).unwrap();
            let wide =
                ops::expand(&Tensor::from_vec(vec![2.0f32], [1]).unwrap(), &[1 << 45]).unwrap();
            assert_oom(ops::mul(&row, &wide), (4usize << 45) * 4);
        },
    );
}

#[test]
fn a_copy_or_cast_that_cannot_be_allocated_is_an_error() {
    where_refused(
        "a_copy_or_cast_that_cannot_be_allocated_is_an_error",
        ELEMS * 2,
        |x| {
            assert_oom(ops::contiguous(&x), ELEMS * 4);
            assert_oom(ops::to_dtype(&x, DType::BF16), ELEMS * 2);
            assert_oom(ops::to_dtype(&x, DType::F64), ELEMS * 8);
            // The raw tensor's fallible forms say the same.
            let e = x.data().try_contiguous().unwrap_err();
            assert_eq!(e, TensorError::OutOfMemory { bytes: ELEMS * 4 });
            let e = x.data().try_to_vec_as::<f32>().unwrap_err();
            assert_eq!(e, TensorError::OutOfMemory { bytes: ELEMS * 4 });
        },
    );
}

#[test]
fn a_product_that_cannot_be_allocated_is_an_error() {
    where_refused(
        "a_product_that_cannot_be_allocated_is_an_error",
        ELEMS * 4,
        |_| {
            // [2^45, 1, 4] @ [4, 4]: the batch folds into one `mm` of a [2^45, 4] view
            // (as in PyTorch), whose [2^45, 4] output (2^47 float32) cannot be had.
            let one = Tensor::from_vec(vec![1.0f32; 4], [1, 1, 4]).unwrap();
            let a = ops::expand(&one, &[1 << 45, 1, 4]).unwrap();
            let b = Tensor::from_vec(vec![1.0f32; 16], [4, 4]).unwrap();
            assert_oom(ops::matmul(&a, &b), ELEMS * 4);
            // An outer product of two expanded vectors: [2^24] ⊗ [2^23].
            let v = Tensor::from_vec(vec![3.0f32], [1]).unwrap();
            let (p, q) = (
                ops::expand(&v, &[1 << 24]).unwrap(),
                ops::expand(&v, &[1 << 23]).unwrap(),
            );
            assert_oom(ops::outer(&p, &q), ELEMS * 4);
        },
    );
}
