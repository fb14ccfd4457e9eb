//! The host-side plans of the CUDA kernels, checked without a device (CI runs them with
//! the `cuda` feature): which operands cuBLAS reads in place ([`MatrixView::of`]), how
//! a reduction cuts its rows ([`split_count`]) and how a strided view is collapsed for
//! the elementwise kernels ([`StridedArg::of`]).
#![cfg(feature = "cuda")]

use amp_kernels::cuda::{column_chunk, multi_tensor_chunk, split_count, MatrixView};
use amp_tensor::cuda::launch::StridedArg;
use amp_tensor::Layout;

fn view(offset: usize, batch_stride: usize, ld: usize, column_major: bool) -> Option<MatrixView> {
    Some(MatrixView {
        offset,
        batch_stride,
        ld,
        column_major,
    })
}

#[test]
fn row_major_and_transposed_operands_are_read_in_place() {
    // [5, 7] contiguous; its transpose [7, 5]; a [5, 7] column slice of [5, 9] at column 1.
    assert_eq!(MatrixView::of(&[0], (5, 7), (7, 1)), view(0, 0, 7, false));
    assert_eq!(MatrixView::of(&[0], (7, 5), (1, 7)), view(0, 0, 7, true));
    assert_eq!(MatrixView::of(&[1], (5, 7), (9, 1)), view(1, 0, 9, false));
    // Vectors: a row with a column stride is a column-major 1 x 7; a column is row-major.
    assert_eq!(MatrixView::of(&[0], (1, 7), (0, 1)), view(0, 0, 7, false));
    assert_eq!(MatrixView::of(&[2], (1, 7), (0, 3)), view(2, 0, 3, true));
    assert_eq!(MatrixView::of(&[0], (7, 1), (1, 0)), view(0, 0, 1, false));
    // A batch in arithmetic progression, or one matrix for every entry.
    assert_eq!(
        MatrixView::of(&[0, 35, 70], (5, 7), (7, 1)),
        view(0, 35, 7, false)
    );
    assert_eq!(
        MatrixView::of(&[4, 4, 4], (7, 5), (1, 7)),
        view(4, 0, 7, true)
    );
}

#[test]
fn layouts_cublas_cannot_read_are_gathered() {
    // A broadcast row (row stride 0), overlapping rows, no unit stride.
    assert_eq!(MatrixView::of(&[0], (5, 7), (0, 1)), None);
    assert_eq!(MatrixView::of(&[0], (5, 7), (3, 1)), None);
    assert_eq!(MatrixView::of(&[0], (5, 7), (14, 2)), None);
    // A transposed view whose columns overlap.
    assert_eq!(MatrixView::of(&[0], (7, 5), (1, 4)), None);
    // Uneven or decreasing batch offsets, and no batch at all.
    assert_eq!(MatrixView::of(&[0, 35, 80], (5, 7), (7, 1)), None);
    assert_eq!(MatrixView::of(&[70, 35, 0], (5, 7), (7, 1)), None);
    assert_eq!(MatrixView::of(&[], (5, 7), (7, 1)), None);
}

#[test]
fn reductions_split_only_few_long_rows_into_large_chunks() {
    // The conv step's `sum` of [32, 64, 56, 56], the MLP's mean loss, a conv bias grad.
    assert_eq!(split_count(1, 32 * 64 * 56 * 56), 1024);
    assert_eq!(split_count(1, 512 * 1024), 128);
    assert_eq!(split_count(64, 32 * 56 * 56), 16);
    // Short rows, or rows enough to fill the device: one block per row.
    assert_eq!(split_count(7, 1000), 1);
    assert_eq!(split_count(1, 8191), 1);
    assert_eq!(split_count(4096, 1 << 20), 1);
    for rows in [1, 2, 3, 7, 64, 500, 1023, 1024, 5000] {
        for n in [0, 1, 4095, 4096, 8192, 100_000, 1 << 20, 1 << 26] {
            let s = split_count(rows, n);
            assert!(s >= 1, "{rows}x{n}");
            assert!(s == 1 || n / s >= 4096, "{rows}x{n}: chunks of {}", n / s);
            assert!(rows * s < 2048 || s == 1, "{rows}x{n}: {} blocks", rows * s);
        }
    }
}

#[test]
fn strided_args_collapse_and_address_the_layouts_elements() {
    let conv = Layout::contiguous(vec![32, 64, 56, 56]);
    let bias = Layout::contiguous(vec![64, 1, 1])
        .broadcast_as(&[32, 64, 56, 56])
        .unwrap();
    let cases = [
        // (layout, dims the device walks)
        (conv.clone(), 1),
        (bias, 3),
        (Layout::contiguous(vec![5, 1, 7]), 1),
        (Layout::contiguous_with_offset(vec![4, 6], 9), 1),
        (Layout::contiguous(vec![5, 7]).transpose(0, 1).unwrap(), 2),
        (Layout::contiguous(vec![5, 9]).narrow(1, 2, 6).unwrap(), 2),
        (Layout::contiguous(vec![5, 9]).narrow(0, 1, 3).unwrap(), 1),
        (
            Layout::contiguous(vec![3, 4, 5])
                .permute(&[1, 0, 2])
                .unwrap(),
            3,
        ),
        (
            Layout::contiguous(vec![2, 1, 6])
                .broadcast_as(&[2, 4, 6])
                .unwrap(),
            3,
        ),
        (
            Layout::contiguous(vec![1]).broadcast_as(&[3, 4]).unwrap(),
            1,
        ),
        (Layout::contiguous(Vec::<usize>::new()), 1),
    ];
    for (l, ndim) in cases {
        let a = StridedArg::of("test", &l).unwrap();
        assert_eq!(a.ndim(), ndim, "{l:?}");
        for (i, off) in l.offsets().enumerate().step_by(97) {
            assert_eq!(a.element_offset(i), off, "{l:?} element {i}");
        }
    }
}

#[test]
fn multi_tensor_tables_aim_at_a_thousand_blocks_and_column_sums_at_512_chunks() {
    // A model's parameters (the main job's ~830k) get the smallest chunks: hundreds
    // of blocks; one large buffer (64M elements) the largest: a small table.
    assert_eq!(multi_tensor_chunk(0), 2048);
    assert_eq!(multi_tensor_chunk(830_000), 2048);
    assert_eq!(multi_tensor_chunk(4 << 20), 4096);
    assert_eq!(multi_tensor_chunk(64 << 20), 65536);
    assert_eq!(multi_tensor_chunk(usize::MAX / 2), 65536);
    let mut last = 0;
    for total in (0..28).map(|p| 3usize << p) {
        let c = multi_tensor_chunk(total);
        assert!(c.is_power_of_two() && c >= last, "{total}: {c}");
        last = c;
    }
    // Column sums: at least 64 rows per chunk, at most 512 chunks.
    assert_eq!(column_chunk(2048), 64);
    assert_eq!(column_chunk(1 << 20), 2048);
    assert!((1usize..100_000)
        .step_by(997)
        .all(|r| r.div_ceil(column_chunk(r)) <= 512));
}

#[test]
fn a_parameter_overlapping_an_earlier_ones_written_memory_waits() {
    use amp_kernels::cuda::optim::{later_overlaps, MemSpan};
    let span = |start: u64, end: u64, param: usize, written: bool| MemSpan {
        bytes: (start, end),
        param,
        written,
    };
    // 0 and 1 disjoint; 2 reads 0's parameter (its gradient aliases it): 2 waits; 3
    // reads what 2 reads (both only read): free; 4 writes into 1's moments: waits;
    // an empty span touches nothing.
    let spans = vec![
        span(150, 250, 4, true),
        span(0, 10, 0, true),
        span(10, 20, 0, false),
        span(50, 60, 1, true),
        span(200, 300, 1, true),
        span(5, 6, 2, false),
        span(30, 40, 2, true),
        span(12, 14, 3, false),
        span(40, 45, 3, true),
        span(55, 55, 3, true),
    ];
    assert_eq!(later_overlaps(spans, 5), [false, false, true, false, true]);
    assert_eq!(later_overlaps(Vec::new(), 2), [false, false]);
}
