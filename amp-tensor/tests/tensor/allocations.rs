//! A tensor's shape and strides are held inline up to rank 4 (`Shape`, `Layout`): making
//! a tensor from its data, or a view of one, allocates only the tensor and, for new
//! data, its storage (`reshape` and `view` also build the sizes asked for, in the
//! vectors of the public `IntoDims`). Counted per thread, so the other tests running beside these do
//! not disturb the counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use amp_tensor::{DType, Tensor};

/// The system allocator, counting the allocations each thread makes.
struct Counting;

thread_local! {
    static MADE: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the count is a thread-local
// `Cell` with a constant initialiser and no destructor, which itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        MADE.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        MADE.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The allocations `f` makes on this thread.
fn allocations<R>(f: impl FnOnce() -> R) -> usize {
    let before = MADE.with(Cell::get);
    std::hint::black_box(f());
    MADE.with(Cell::get) - before
}

#[test]
fn shapes_and_strides_of_up_to_four_dims_allocate_nothing() {
    let data = vec![1f32; 2 * 3 * 4 * 5];
    let t = Tensor::from_vec(data.clone(), [2, 3, 4, 5]).unwrap();
    // The storage and the tensor; the data came in allocated.
    let made = allocations(|| Tensor::from_vec(data.clone(), [2, 3, 4, 5]).unwrap());
    assert_eq!(
        made,
        1 + 2,
        "from_vec (the clone of the data, the storage, the tensor)"
    );
    assert_eq!(allocations(|| t.transpose(0, 3).unwrap()), 1, "transpose");
    assert_eq!(
        allocations(|| t.permute(&[0, 2, 1, 3]).unwrap()),
        1,
        "permute"
    );
    // `reshape` and `view` also build the sizes asked for (`IntoDims`'s vectors).
    assert_eq!(allocations(|| t.reshape([6, 4, 5]).unwrap()), 3, "reshape");
    assert_eq!(allocations(|| t.narrow(1, 1, 2).unwrap()), 1, "narrow");
    assert_eq!(allocations(|| t.slice(2, 0, 4, 2).unwrap()), 1, "slice");
    assert_eq!(allocations(|| t.select(0, 1).unwrap()), 1, "select");
    let three = t.select(0, 1).unwrap();
    assert_eq!(allocations(|| three.unsqueeze(1).unwrap()), 1, "unsqueeze");
    // A cast makes new data: its buffer, the storage and the tensor.
    assert_eq!(
        allocations(|| t.to_dtype(DType::BF16).unwrap()),
        3,
        "to_dtype"
    );
}
