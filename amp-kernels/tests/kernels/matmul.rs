//! The matmul family against an f64 reference computed here with naive loops, for
//! every floating dtype, strided operands, PyTorch's broadcasting cases and messages.

use amp_kernels::{
    addbmm, addmm, addmv, addr, baddbmm, bmm, bmm_as, dot, kernel16, matmul, mm, mm_as, mv, outer,
    with_kernel16, Kernel16,
};
use amp_tensor::{DType, Generator, Tensor};
use amp_testing::tensors::bits;

const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

fn randn(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut g = Generator::new(seed);
    Tensor::randn(dims.to_vec(), dtype, &mut g).unwrap()
}

/// (rounding, accumulation) tolerances: the result is within
/// `round * |ref| + acc * Σ|a·b|` of the exact value.
fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (2f64.powi(-11), 1e-6),
        DType::BF16 => (2f64.powi(-8), 1e-6),
        DType::F32 => (0.0, 2e-6),
        DType::F64 => (0.0, 1e-14),
        _ => (0.0, 0.0),
    }
}

/// A reference result: exact values and the magnitude sums bounding accumulation error.
struct Ref {
    dims: Vec<usize>,
    val: Vec<f64>,
    mag: Vec<f64>,
}

/// `addmm(input, a, b, beta, alpha)` against `beta·input + alpha·prod` (`prod` the
/// reference `a @ b`).
fn check_addmm(
    input: &Tensor,
    (a, b): (&Tensor, &Tensor),
    prod: &Ref,
    (beta, alpha): (f64, f64),
    dtype: DType,
    what: &str,
) {
    let got = addmm(input, a, b, beta, alpha).unwrap();
    assert_close(&got, &with_input(prod, input, beta, alpha), dtype, what);
}

/// `f(a, b)` (a product kernel) against the float64 reference product.
fn check_product(
    f: fn(&Tensor, &Tensor) -> amp_tensor::Result<Tensor>,
    a: &Tensor,
    b: &Tensor,
    dtype: DType,
    what: &str,
) {
    assert_close(&f(a, b).unwrap(), &ref_matmul(a, b), dtype, what);
}

fn assert_close(got: &Tensor, r: &Ref, dtype: DType, what: &str) {
    assert_eq!(got.dims(), &r.dims[..], "{what}: shape");
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let (round, acc) = tol(dtype);
    let g = got.to_vec_f64();
    for (i, ((&x, &v), &m)) in g.iter().zip(&r.val).zip(&r.mag).enumerate() {
        let bound = round * v.abs() + acc * m + 1e-300;
        assert!(
            (x - v).abs() <= bound,
            "{what} [{dtype}] element {i}: got {x}, expected {v} (bound {bound})"
        );
    }
}

/// `beta * input + alpha * a @ b` on explicit row-major matrices.
fn ref_mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut val = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for q in 0..k {
                val[i * n + j] += a[i * k + q] * b[q * n + j];
                mag[i * n + j] += (a[i * k + q] * b[q * n + j]).abs();
            }
        }
    }
    (val, mag)
}

/// PyTorch's matmul semantics, written independently: 1-D operands promoted and the
/// added dims removed, batch dims broadcast.
fn ref_matmul(a: &Tensor, b: &Tensor) -> Ref {
    let (av, bv) = (a.to_vec_f64(), b.to_vec_f64());
    let mut ad = a.dims().to_vec();
    let mut bd = b.dims().to_vec();
    let (a1, b1) = (ad.len() == 1, bd.len() == 1);
    if a1 {
        ad.insert(0, 1);
    }
    if b1 {
        bd.push(1);
    }
    let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (k2, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    assert_eq!(k, k2);
    let ab = &ad[..ad.len() - 2];
    let bb = &bd[..bd.len() - 2];
    let nb = ab.len().max(bb.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; nb - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (pa, pb) = (pad(ab), pad(bb));
    let batch: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    let count: usize = batch.iter().product();
    let (mut val, mut mag) = (Vec::new(), Vec::new());
    for lin in 0..count {
        // batch index → offsets in a and b (size-1 dims broadcast)
        let mut rem = lin;
        let (mut ia, mut ib) = (0, 0);
        let (mut sa, mut sb) = (1, 1);
        for d in (0..nb).rev() {
            let idx = rem % batch[d];
            rem /= batch[d];
            ia += if pa[d] == 1 { 0 } else { idx * sa };
            ib += if pb[d] == 1 { 0 } else { idx * sb };
            sa *= pa[d];
            sb *= pb[d];
        }
        let am = &av[ia * m * k..(ia + 1) * m * k];
        let bm = &bv[ib * k * n..(ib + 1) * k * n];
        let (v, g) = ref_mm(am, bm, m, k, n);
        val.extend(v);
        mag.extend(g);
    }
    let mut dims = batch;
    if !a1 {
        dims.push(m);
    }
    if !b1 {
        dims.push(n);
    }
    Ref { dims, val, mag }
}

#[test]
fn mm_every_dtype_and_size() {
    for dtype in FLOATS {
        for (i, &(m, k, n)) in [
            (1, 1, 1),
            (5, 7, 3),
            (8, 8, 8),
            // small products wider than one 64-column block of the direct loop
            (2, 3, 150),
            (1, 2, 1000),
            (64, 65, 33),
            (130, 257, 70),
        ]
        .iter()
        .enumerate()
        {
            let a = randn(&[m, k], dtype, 10 + i as u64);
            let b = randn(&[k, n], dtype, 20 + i as u64);
            let r = ref_matmul(&a, &b);
            assert_close(&mm(&a, &b).unwrap(), &r, dtype, "mm");
            assert_close(&matmul(&a, &b).unwrap(), &r, dtype, "matmul 2x2");
        }
    }
}

#[test]
fn mm_large_parallel_path() {
    for dtype in [DType::F32, DType::BF16] {
        let a = randn(&[300, 260], dtype, 1);
        let b = randn(&[260, 210], dtype, 2);
        let r = ref_matmul(&a, &b);
        assert_close(&mm(&a, &b).unwrap(), &r, dtype, "mm large");
    }
}

#[test]
fn half_types_round_once_from_f32_accumulation() {
    // The 16-bit result is exactly the f32 product of the widened operands, rounded once.
    for dtype in [DType::F16, DType::BF16] {
        let a = randn(&[40, 600], dtype, 3);
        let b = randn(&[600, 24], dtype, 4);
        let wide = mm(
            &a.to_dtype(DType::F32).unwrap(),
            &b.to_dtype(DType::F32).unwrap(),
        )
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
        // On the widened kernel, bit for bit (the same float32 kernel, the same sums).
        let got = with_kernel16(Kernel16::Widened, || mm(&a, &b).unwrap()).unwrap();
        assert_eq!(got.to_vec_f64(), wide.to_vec_f64(), "{dtype}");
        // On every kernel, each element is within one 16-bit step of the exact value,
        // give or take the float32 sums' own error (sums rounded once; a 16-bit
        // accumulator or a second rounding would be off by more).
        let exact = ref_matmul(&a, &b);
        let mantissa = if dtype == DType::BF16 { 7 } else { 10 };
        for kernel in Kernel16::ALL.into_iter().filter(|k| k.supports(dtype)) {
            let got = with_kernel16(kernel, || mm(&a, &b).unwrap()).unwrap();
            let want = exact.val.iter().zip(&exact.mag);
            for (i, (&g, (&x, &mag))) in got.to_vec_f64().iter().zip(want).enumerate() {
                let ulp = 2f64.powi(x.abs().log2().floor() as i32 - mantissa);
                assert!(
                    (g - x).abs() < ulp + 1e-6 * mag,
                    "{dtype} on {}: element {i} is {g}, exact {x}",
                    kernel.name()
                );
            }
        }
    }
}

#[test]
fn transposed_sliced_and_offset_operands() {
    for dtype in FLOATS {
        // transposes
        let at = randn(&[7, 5], dtype, 5).t().unwrap();
        let bt = randn(&[6, 7], dtype, 6).t().unwrap();
        assert!(!at.is_contiguous() && !bt.is_contiguous());
        let r = ref_matmul(&at, &bt);
        assert_close(&mm(&at, &bt).unwrap(), &r, dtype, "mm(t, t)");
        // step-2 columns, an offset row window
        let big = randn(&[12, 20], dtype, 7);
        let a = big
            .narrow(0usize, 3, 5)
            .unwrap()
            .slice(1usize, 1, 15, 2)
            .unwrap();
        let b = randn(&[7, 30], dtype, 8).slice(1usize, 0, 30, 3).unwrap();
        let r = ref_matmul(&a, &b);
        assert_close(&mm(&a, &b).unwrap(), &r, dtype, "mm(sliced)");
        // a sparse view (span much larger than the elements): gathered
        let huge = randn(&[64, 400], dtype, 9);
        let s = huge
            .slice(0usize, 0, 64, 16)
            .unwrap()
            .narrow(1usize, 3, 5)
            .unwrap();
        let c = randn(&[5, 4], dtype, 10);
        check_product(mm, &s, &c, dtype, "mm(sparse)");
        // the same storage on both sides
        let x = randn(&[9, 6], dtype, 11);
        let xt = x.t().unwrap();
        check_product(mm, &x, &xt, dtype, "x @ x.T");
    }
}

#[test]
fn bmm_and_batched_paths() {
    for dtype in FLOATS {
        for &(bsz, m, k, n) in &[(3, 4, 5, 6), (16, 8, 9, 7), (2, 200, 210, 190)] {
            if dtype == DType::F64 && m > 100 {
                continue;
            }
            let a = randn(&[bsz, m, k], dtype, 12);
            let b = randn(&[bsz, k, n], dtype, 13);
            let r = ref_matmul(&a, &b);
            assert_close(&bmm(&a, &b).unwrap(), &r, dtype, "bmm");
            assert_close(&matmul(&a, &b).unwrap(), &r, dtype, "matmul 3x3");
        }
        // permuted batch operands
        let a = randn(&[4, 3, 5], dtype, 14)
            .permute(&[1usize, 0, 2])
            .unwrap(); // [3,4,5]
        let b = randn(&[5, 3, 2], dtype, 15)
            .permute(&[1usize, 0, 2])
            .unwrap(); // [3,5,2]
        check_product(bmm, &a, &b, dtype, "bmm permuted");
    }
}

#[test]
fn matmul_broadcasting_cases() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[4], &[4]),
        (&[3, 4], &[4]),
        (&[4], &[4, 5]),
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[2, 4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[1, 3, 4], &[6, 4, 2]),
        (&[2, 3, 3, 4], &[3, 4, 1]),
        (&[2, 3, 4], &[1, 4, 5]),
        (&[3, 0, 4], &[4, 5]),
        (&[2, 3, 0], &[0, 5]),
    ];
    for dtype in FLOATS {
        for (i, (da, db)) in cases.iter().enumerate() {
            let a = randn(da, dtype, 100 + i as u64);
            let b = randn(db, dtype, 200 + i as u64);
            let r = ref_matmul(&a, &b);
            let got = matmul(&a, &b).unwrap();
            assert_close(&got, &r, dtype, &format!("matmul {da:?} @ {db:?}"));
        }
        // a non-foldable N-D operand (transposed batch dims) with a matrix
        let a = randn(&[3, 2, 4], dtype, 300)
            .transpose(0usize, 1usize)
            .unwrap();
        let b = randn(&[4, 5], dtype, 301);
        check_product(matmul, &a, &b, dtype, "unfoldable");
        let v = randn(&[4], dtype, 302);
        check_product(matmul, &a, &v, dtype, "unfoldable mv");
    }
}

#[test]
fn mv_dot_outer() {
    for dtype in FLOATS {
        let m = randn(&[6, 9], dtype, 30);
        let v = randn(&[9], dtype, 31);
        check_product(mv, &m, &v, dtype, "mv");
        let mt = randn(&[9, 6], dtype, 32).t().unwrap();
        let vs = randn(&[18], dtype, 33).slice(0usize, 0, 18, 2).unwrap();
        check_product(mv, &mt, &vs, dtype, "mv strided");

        let x = randn(&[1000], dtype, 34);
        let y = randn(&[2000], dtype, 35).slice(0usize, 1, 2000, 2).unwrap();
        let d = dot(&x, &y).unwrap();
        assert_eq!(d.rank(), 0);
        assert_close(&d, &ref_matmul(&x, &y), dtype, "dot");

        let a = randn(&[5], dtype, 36);
        let b = randn(&[14], dtype, 37).slice(0usize, 0, 14, 2).unwrap();
        let o = outer(&a, &b).unwrap();
        let (av, bv) = (a.to_vec_f64(), b.to_vec_f64());
        let val: Vec<f64> = av
            .iter()
            .flat_map(|x| bv.iter().map(move |y| x * y))
            .collect();
        let r = Ref {
            dims: vec![5, 7],
            mag: val.iter().map(|v| v.abs()).collect(),
            val,
        };
        assert_close(&o, &r, dtype, "outer");
    }
    // outer promotes like `a[:, None] * b`
    let a = randn(&[3], DType::BF16, 38);
    let b = randn(&[2], DType::F32, 39);
    assert_eq!(outer(&a, &b).unwrap().dtype(), DType::F32);
}

/// `beta * input(broadcast) + alpha * product`, with `beta == 0` ignoring the input.
fn with_input(r: &Ref, input: &Tensor, beta: f64, alpha: f64) -> Ref {
    let inp = input.broadcast_to(r.dims.clone()).unwrap().to_vec_f64();
    let val = r
        .val
        .iter()
        .zip(&inp)
        .map(|(&p, &i)| {
            if beta == 0.0 {
                alpha * p
            } else {
                beta * i + alpha * p
            }
        })
        .collect();
    let mag = r
        .mag
        .iter()
        .zip(&inp)
        .map(|(&p, &i)| {
            let term = if beta == 0.0 { 0.0 } else { (beta * i).abs() };
            alpha.abs() * p + term
        })
        .collect();
    Ref {
        dims: r.dims.clone(),
        val,
        mag,
    }
}

#[test]
fn fused_ops() {
    for dtype in FLOATS {
        let (beta, alpha) = (0.5, -1.5);
        let m1 = randn(&[5, 7], dtype, 40);
        let m2 = randn(&[3, 7], dtype, 41).t().unwrap();
        let prod = ref_matmul(&m1, &m2);
        for input in [
            randn(&[5, 3], dtype, 42),
            randn(&[3], dtype, 43),
            randn(&[5, 1], dtype, 44),
        ] {
            check_addmm(&input, (&m1, &m2), &prod, (beta, alpha), dtype, "addmm");
            check_addmm(&input, (&m1, &m2), &prod, (1.0, 1.0), dtype, "addmm 1,1");
        }
        // beta == 0 ignores the input, NaN and inf included
        let nan = Tensor::full([5, 3], f64::NAN, dtype);
        check_addmm(&nan, (&m1, &m2), &prod, (0.0, 2.0), dtype, "addmm beta=0");
        let inf = Tensor::full([3], f64::INFINITY, dtype);
        assert!(addmm(&inf, &m1, &m2, 0.0, 1.0)
            .unwrap()
            .to_vec_f64()
            .iter()
            .all(|v| v.is_finite()));

        // addmv
        let mat = randn(&[6, 4], dtype, 45);
        let vec = randn(&[4], dtype, 46);
        let input = randn(&[6], dtype, 47);
        let r = with_input(&ref_matmul(&mat, &vec), &input, beta, alpha);
        assert_close(
            &addmv(&input, &mat, &vec, beta, alpha).unwrap(),
            &r,
            dtype,
            "addmv",
        );
        let scalar_in = Tensor::scalar_of(2.0, dtype);
        let r = with_input(&ref_matmul(&mat, &vec), &scalar_in, beta, alpha);
        assert_close(
            &addmv(&scalar_in, &mat, &vec, beta, alpha).unwrap(),
            &r,
            dtype,
            "addmv 0-d",
        );

        // addr
        let v1 = randn(&[4], dtype, 48);
        let v2 = randn(&[3], dtype, 49);
        let input = randn(&[4, 3], dtype, 50);
        let prod = ref_matmul(
            &v1.unsqueeze(1usize).unwrap(),
            &v2.unsqueeze(0usize).unwrap(),
        );
        let r = with_input(&prod, &input, beta, alpha);
        assert_close(
            &addr(&input, &v1, &v2, beta, alpha).unwrap(),
            &r,
            dtype,
            "addr",
        );

        // baddbmm / addbmm
        let b1 = randn(&[3, 4, 5], dtype, 51);
        let b2 = randn(&[3, 5, 2], dtype, 52);
        let prod = ref_matmul(&b1, &b2);
        let input = randn(&[4, 2], dtype, 53);
        let r = with_input(&prod, &input, beta, alpha);
        assert_close(
            &baddbmm(&input, &b1, &b2, beta, alpha).unwrap(),
            &r,
            dtype,
            "baddbmm",
        );
        // addbmm: sum over the batch
        let mut val = vec![0.0; 8];
        let mut mag = vec![0.0; 8];
        for bi in 0..3 {
            for j in 0..8 {
                val[j] += prod.val[bi * 8 + j];
                mag[j] += prod.mag[bi * 8 + j];
            }
        }
        let summed = Ref {
            dims: vec![4, 2],
            val,
            mag,
        };
        let input = randn(&[2], dtype, 54);
        let r = with_input(&summed, &input, beta, alpha);
        assert_close(
            &addbmm(&input, &b1, &b2, beta, alpha).unwrap(),
            &r,
            dtype,
            "addbmm",
        );
        let nan = Tensor::full([4, 2], f64::NAN, dtype);
        let r = with_input(&summed, &nan, 0.0, alpha);
        assert_close(
            &addbmm(&nan, &b1, &b2, 0.0, alpha).unwrap(),
            &r,
            dtype,
            "addbmm beta=0",
        );
    }
}

#[test]
fn empty_inner_dimension() {
    for dtype in FLOATS {
        let a = Tensor::zeros([3, 0], dtype);
        let b = Tensor::zeros([0, 4], dtype);
        let z = mm(&a, &b).unwrap();
        assert_eq!(z.dims(), &[3, 4]);
        assert!(z.to_vec_f64().iter().all(|&v| v == 0.0));
        let input = Tensor::full([4], 3.0, dtype);
        let r = addmm(&input, &a, &b, 2.0, 1.0).unwrap();
        assert!(r.to_vec_f64().iter().all(|&v| v == 6.0));
        let e = mm(&Tensor::zeros([0, 5], dtype), &Tensor::zeros([5, 2], dtype)).unwrap();
        assert_eq!(e.dims(), &[0, 2]);
    }
}

#[test]
fn integer_matmul_is_exact() {
    for dtype in [DType::I32, DType::I64] {
        let a = Tensor::arange(-6.0, 6.0, 1.0, dtype)
            .unwrap()
            .reshape([3i64, 4])
            .unwrap();
        let b = Tensor::arange(0.0, 8.0, 1.0, dtype)
            .unwrap()
            .reshape([2i64, 4])
            .unwrap()
            .t()
            .unwrap();
        let r = ref_matmul(&a, &b);
        let got = mm(&a, &b).unwrap();
        assert_eq!(got.dtype(), dtype);
        assert_eq!(got.to_vec_f64(), r.val);
        let input = Tensor::ones([2], dtype);
        let got = addmm(&input, &a, &b, 2.0, 3.0).unwrap();
        let want: Vec<f64> = r.val.iter().map(|v| 2.0 + 3.0 * v).collect();
        assert_eq!(got.to_vec_f64(), want);
        assert!(addmm(&input, &a, &b, 0.5, 1.0)
            .unwrap_err()
            .to_string()
            .contains("argument beta must not be a floating point number"));
    }
}

fn err_text(r: amp_tensor::Result<Tensor>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn error_messages() {
    let f = |d: &[usize]| Tensor::zeros(d.to_vec(), DType::F32);
    let h = |d: &[usize]| Tensor::zeros(d.to_vec(), DType::BF16);
    let e = err_text(mm(&f(&[2, 3]), &f(&[4, 5])));
    assert!(
        e.contains("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
        "{e}"
    );
    let e = err_text(mm(&f(&[2, 3]), &h(&[3, 5])));
    assert!(
        e.contains("expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16"),
        "{e}"
    );
    assert!(err_text(mm(&f(&[3]), &f(&[3, 2]))).contains("self must be a matrix"));
    assert!(err_text(mm(&f(&[2, 3]), &f(&[3]))).contains("mat2 must be a matrix"));
    assert!(err_text(bmm(&f(&[2, 3]), &f(&[2, 3, 4]))).contains("batch1 must be a 3D tensor"));
    let e = err_text(bmm(&f(&[2, 3, 4]), &f(&[2, 5, 6])));
    assert!(
        e.contains("Expected size for first two dimensions of batch2 tensor to be: [2, 4] but got: [2, 5]."),
        "{e}"
    );
    let e = err_text(matmul(&f(&[]), &f(&[2, 2])));
    assert!(
        e.contains("both arguments to matmul need to be at least 1D, but they are 0D and 2D"),
        "{e}"
    );
    let e = err_text(matmul(&f(&[2, 3, 4]), &f(&[5, 6])));
    assert!(
        e.contains("mat1 and mat2 shapes cannot be multiplied (6x4 and 5x6)"),
        "{e}"
    );
    let e = err_text(matmul(&f(&[2, 3, 4]), &f(&[3, 4, 6])));
    assert!(
        e.contains("The size of tensor a (2) must match the size of tensor b (3)"),
        "{e}"
    );
    let e = err_text(matmul(&f(&[3]), &f(&[4])));
    assert!(
        e.contains("inconsistent tensor size, expected tensor [3] and src [4]"),
        "{e}"
    );
    let e = err_text(mv(&f(&[2, 3]), &f(&[4])));
    assert!(
        e.contains("size mismatch, got input (2), mat (2x3), vec (4)"),
        "{e}"
    );
    let e = err_text(mv(&f(&[2, 3]), &f(&[3, 1])));
    assert!(
        e.contains("vector + matrix @ vector expected, got 1, 2, 2"),
        "{e}"
    );
    let e = err_text(dot(&f(&[3]), &h(&[3])));
    assert!(
        e.contains(
            "dot : expected both vectors to have same dtype, but found float32 and bfloat16"
        ),
        "{e}"
    );
    let e = err_text(dot(&f(&[3, 1]), &f(&[3])));
    assert!(
        e.contains("1D tensors expected, but got 2D and 1D tensors"),
        "{e}"
    );
    let e = err_text(outer(&f(&[3, 1]), &f(&[3])));
    assert!(
        e.contains("outer: Expected 1-D argument self, but got 2-D"),
        "{e}"
    );
    let e = err_text(addmm(&f(&[3]), &f(&[2, 3]), &f(&[3, 5]), 1.0, 1.0));
    assert!(
        e.contains("The expanded size of the tensor (5) must match the existing size (3) at non-singleton dimension 1"),
        "{e}"
    );
    let e = err_text(addmm(&h(&[5]), &f(&[2, 3]), &f(&[3, 5]), 1.0, 1.0));
    assert!(e.contains("must have the same dtype"), "{e}");
    let e = err_text(addr(&f(&[2, 2]), &f(&[2, 1]), &f(&[2]), 1.0, 1.0));
    assert!(
        e.contains("addr: Expected 1-D argument vec1, but got 2-D"),
        "{e}"
    );
    let b = Tensor::zeros([2, 2], DType::Bool);
    assert!(err_text(mm(&b, &b)).contains("not implemented for 'Bool'"));
}

#[test]
fn concurrent_half_products_share_nothing() {
    // The 16-bit path reuses per-thread f32 buffers: products running on several
    // threads at once (and repeatedly on one) must not see each other's data.
    let a = randn(&[70, 90], DType::BF16, 60);
    let b = randn(&[90, 50], DType::BF16, 61);
    let small = randn(&[3, 4], DType::BF16, 62);
    let want = mm(&a, &b).unwrap().to_vec_f64();
    let want_small = mm(&small, &small.t().unwrap()).unwrap().to_vec_f64();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20 {
                    assert_eq!(mm(&a, &b).unwrap().to_vec_f64(), want);
                    let st = small.t().unwrap();
                    assert_eq!(mm(&small, &st).unwrap().to_vec_f64(), want_small);
                }
            });
        }
    });
}

/// Below `FAER_WORK`, products whose output is at least `FAER_MIN_SIDE` on both sides,
/// or whose right operand is column-major, run on faer's kernel and the rest on gemm's:
/// both keep the contract (the fused input term, batches, a sliced operand).
#[test]
fn mid_size_products_on_either_kernel() {
    use amp_kernels::{FAER_MIN_SIDE, FAER_WORK};
    // (m, k, n, B column-major): faer by size, faer by layout, gemm (a row-major `B`
    // above the direct kernel's size), gemm (a column-major one).
    let cases = [
        (40, 20, 36, false),
        (16, 40, 20, true),
        (16, 180, 24, false),
        (20, 24, 12, true),
    ];
    for &(m, k, n, _) in &cases {
        assert!(m * k * n > amp_kernels::SMALL_WORK && m * k * n < FAER_WORK);
    }
    const { assert!(16 * 180 * 24 > amp_kernels::DIRECT_WORK) };
    assert!(cases[0].0.min(cases[0].2) >= FAER_MIN_SIDE && cases[2].0 < FAER_MIN_SIDE);
    for dtype in [DType::F32, DType::F64] {
        for (c, &(m, k, n, b_cols)) in cases.iter().enumerate() {
            let seed = 200 + 10 * c as u64;
            let a = randn(&[m, k], dtype, seed);
            let b = if b_cols {
                randn(&[n, k], dtype, seed + 1).t().unwrap()
            } else {
                randn(&[k, n], dtype, seed + 1)
            };
            let what = format!("{m}x{k}x{n} b_cols={b_cols}");
            let prod = ref_matmul(&a, &b);
            assert_close(&mm(&a, &b).unwrap(), &prod, dtype, &what);
            let input = randn(&[n], dtype, seed + 2);
            let got = addmm(&input, &a, &b, 0.5, -1.5).unwrap();
            assert_close(&got, &with_input(&prod, &input, 0.5, -1.5), dtype, &what);
            let sliced = randn(&[k, 2 * n], dtype, seed + 3)
                .slice(1usize, 0, 2 * n, 2)
                .unwrap();
            assert_close(
                &mm(&a, &sliced).unwrap(),
                &ref_matmul(&a, &sliced),
                dtype,
                &what,
            );
            let ba = randn(&[3, m, k], dtype, seed + 4);
            let bb = if b_cols {
                randn(&[3, n, k], dtype, seed + 5)
                    .transpose(1usize, 2usize)
                    .unwrap()
            } else {
                randn(&[3, k, n], dtype, seed + 5)
            };
            assert_close(&bmm(&ba, &bb).unwrap(), &ref_matmul(&ba, &bb), dtype, &what);
        }
    }
}

/// Products of at least `FAER_WORK` multiply-adds take the other kernel: the same
/// contract there (transposed and sliced operands, `beta`/`alpha`, `beta == 0` ignoring
/// a NaN input, batched and batch-summed products).
#[test]
fn large_products_on_the_faer_path() {
    const { assert!(70 * 80 * 90 >= amp_kernels::FAER_WORK && 64 * 70 * 60 >= amp_kernels::FAER_WORK) };
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let m1 = randn(&[70, 90], dtype, 50);
        let m2 = randn(&[80, 90], dtype, 51).t().unwrap();
        let prod = ref_matmul(&m1, &m2);
        assert_close(&mm(&m1, &m2).unwrap(), &prod, dtype, "mm transposed");
        let sliced = randn(&[90, 160], dtype, 52)
            .slice(1usize, 0, 160, 2)
            .unwrap();
        let r = ref_matmul(&m1, &sliced);
        assert_close(&mm(&m1, &sliced).unwrap(), &r, dtype, "mm sliced");
        let input = randn(&[80], dtype, 53);
        let got = addmm(&input, &m1, &m2, 0.5, -1.5).unwrap();
        assert_close(&got, &with_input(&prod, &input, 0.5, -1.5), dtype, "addmm");
        let nan = Tensor::full([70, 80], f64::NAN, dtype);
        check_addmm(&nan, (&m1, &m2), &prod, (0.0, 2.0), dtype, "addmm beta=0");

        let b1 = randn(&[2, 64, 60], dtype, 54);
        let b2 = randn(&[2, 70, 60], dtype, 55)
            .transpose(1usize, 2usize)
            .unwrap();
        let bprod = ref_matmul(&b1, &b2);
        assert_close(&bmm(&b1, &b2).unwrap(), &bprod, dtype, "bmm");
        let binput = randn(&[64, 70], dtype, 56);
        let got = baddbmm(&binput, &b1, &b2, 0.25, 2.0).unwrap();
        assert_close(
            &got,
            &with_input(&bprod, &binput, 0.25, 2.0),
            dtype,
            "baddbmm",
        );
        let (mn, half) = (64 * 70, bprod.val.len() / 2);
        let summed = Ref {
            dims: vec![64, 70],
            val: (0..mn)
                .map(|i| bprod.val[i] + bprod.val[half + i])
                .collect(),
            mag: (0..mn)
                .map(|i| bprod.mag[i] + bprod.mag[half + i])
                .collect(),
        };
        let got = addbmm(&binput, &b1, &b2, 0.25, 2.0).unwrap();
        assert_close(
            &got,
            &with_input(&summed, &binput, 0.25, 2.0),
            dtype,
            "addbmm",
        );
    }
}

/// float32 products of at least `LHS_COPY_WORK` multiply-adds copy a column-major left
/// operand row-major (a linear layer's weight gradient, `g.t() @ x`), block by block
/// or whole: single and
/// batched, with a sliced (non-dense) column stride, the fused input term, and a batch
/// that broadcasts the left operand (not copied); each equals the float64 product.
#[test]
fn large_products_with_a_column_major_left_operand() {
    const { assert!(520 * 530 * 500 >= amp_kernels::LHS_COPY_WORK) };
    for dtype in [DType::F32, DType::F64] {
        let g = randn(&[530, 520], dtype, 90).t().unwrap();
        let x = randn(&[530, 500], dtype, 91);
        check_product(mm, &g, &x, dtype, "mm(g.t(), x)");
        let input = randn(&[500], dtype, 92);
        let prod = ref_matmul(&g, &x);
        check_addmm(
            &input,
            (&g, &x),
            &prod,
            (0.5, 2.0),
            dtype,
            "addmm(g.t(), x)",
        );
        // A column stride longer than the rows (every other row of a wider matrix).
        let wide = randn(&[530, 1040], dtype, 93)
            .slice(1usize, 0, 1040, 2)
            .unwrap()
            .t()
            .unwrap();
        check_product(mm, &wide, &x, dtype, "mm(sliced.t(), x)");
        // Batched, and broadcast over a batch by `matmul`.
        let gb = randn(&[2, 530, 520], dtype, 94)
            .transpose(1usize, 2usize)
            .unwrap();
        let xb = randn(&[2, 530, 500], dtype, 95);
        check_product(bmm, &gb, &xb, dtype, "bmm(g.mT, x)");
        check_product(matmul, &g, &xb, dtype, "matmul(g.t(), x[2])");
        // Just above the threshold: two blocks, the copy by row blocks of 64.
        const { assert!(130 * 120 * 140 >= amp_kernels::LHS_COPY_WORK) };
        let g = randn(&[120, 130], dtype, 96).t().unwrap();
        let x = randn(&[120, 140], dtype, 97);
        check_product(mm, &g, &x, dtype, "mm(g.t(), x) at 130×120×140");
    }
    // From `WHOLE_COPY_WORK` on the operand is copied whole, over the threads, with a
    // last block of rows shorter than the others.
    const { assert!(780 * 770 * 760 >= amp_kernels::WHOLE_COPY_WORK) };
    let g = randn(&[770, 780], DType::F32, 98).t().unwrap();
    let x = randn(&[770, 760], DType::F32, 99);
    check_product(mm, &g, &x, DType::F32, "mm(g.t(), x) at 780×770×760");
}

/// Large single products are cut into blocks of output columns (or rows, when the
/// output is taller than wide), one per rayon task; 16-bit operands are widened block
/// by block. Every layout a block meets: transposed and sliced operands, a
/// column-major left operand cut by rows, the input term broadcast from a row, a
/// column or a transposed matrix, `beta == 0` with a NaN input, and `mv`.
#[test]
fn large_products_in_blocks() {
    for dtype in FLOATS {
        // Wider than tall: column blocks. B is a transposed weight, as in `linear`.
        let x = randn(&[96, 200], dtype, 70);
        let w = randn(&[300, 200], dtype, 71);
        let wt = w.t().unwrap();
        let prod = ref_matmul(&x, &wt);
        assert_close(&mm(&x, &wt).unwrap(), &prod, dtype, "blocks: x @ w.T");
        let bias = randn(&[300], dtype, 72);
        check_addmm(
            &bias,
            (&x, &wt),
            &prod,
            (1.0, 1.0),
            dtype,
            "blocks: addmm row bias",
        );
        let col = randn(&[96, 1], dtype, 73);
        check_addmm(
            &col,
            (&x, &wt),
            &prod,
            (-0.5, 2.0),
            dtype,
            "blocks: column input",
        );
        let full_t = randn(&[300, 96], dtype, 74).t().unwrap();
        check_addmm(
            &full_t,
            (&x, &wt),
            &prod,
            (0.25, 1.0),
            dtype,
            "blocks: transposed input",
        );
        let nan = Tensor::full([96, 300], f64::NAN, dtype);
        check_addmm(&nan, (&x, &wt), &prod, (0.0, 1.0), dtype, "blocks: beta=0");
        // A row-major, sliced right operand (its column blocks are strided).
        let b = randn(&[200, 620], dtype, 75)
            .slice(1usize, 0, 620, 2)
            .unwrap();
        check_product(mm, &x, &b, dtype, "blocks: sliced rhs");
        // Taller than wide: row blocks of a column-major left operand (a weight
        // gradient's `g.T @ x`).
        let g = randn(&[80, 330], dtype, 76);
        let h = randn(&[80, 150], dtype, 77);
        let gt = g.t().unwrap();
        check_product(mm, &gt, &h, dtype, "blocks: g.T @ h");
        // A tall matrix-vector product: row blocks, one column.
        let a = randn(&[700, 400], dtype, 78);
        let v = randn(&[400], dtype, 79);
        let r = ref_matmul(&a, &v);
        assert_close(&mv(&a, &v).unwrap(), &r, dtype, "blocks: mv");
        let inp = randn(&[1], dtype, 80);
        let got = addmv(&inp, &a, &v, 0.5, 1.0).unwrap();
        assert_close(
            &got,
            &with_input(&r, &inp, 0.5, 1.0),
            dtype,
            "blocks: addmv",
        );
    }
}

// ----- every 16-bit kernel ---------------------------------------------------------------

/// The form of a random product case.
#[derive(Debug, Clone, Copy)]
enum Form {
    Mm,
    Addmm,
    Bmm,
    Baddbmm,
    Addbmm,
    /// `matmul` of a batch with a single (broadcast) right operand.
    MatmulBroadcast,
}

/// One random product: sizes, operand orientations, batch, form and fused factors.
#[derive(Debug, Clone)]
struct Case {
    form: Form,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    ta: bool,
    tb: bool,
    /// `b` read with a column step of 2 (a non-unit stride on both sides of a pair).
    step_b: bool,
    beta: f64,
    alpha: f64,
    seed: u64,
}

fn case() -> impl proptest::strategy::Strategy<Value = Case> {
    use proptest::prelude::*;
    let size = prop_oneof![1usize..20, 20usize..80, Just(12), Just(32), Just(33)];
    let forms = prop::sample::select(vec![
        Form::Mm,
        Form::Addmm,
        Form::Bmm,
        Form::Baddbmm,
        Form::Addbmm,
        Form::MatmulBroadcast,
    ]);
    (
        forms,
        (
            size.clone(),
            size.clone(),
            prop_oneof![1usize..8, 8usize..140],
        ),
        1usize..4,
        (any::<bool>(), any::<bool>(), any::<bool>()),
        prop::sample::select(vec![(1.0, 1.0), (0.5, -1.5), (0.0, 2.0)]),
        any::<u64>(),
    )
        .prop_map(
            |(form, (m, n, k), batch, (ta, tb, step_b), (beta, alpha), seed)| Case {
                form,
                m,
                n,
                k,
                batch,
                ta,
                tb,
                step_b,
                beta,
                alpha,
                seed,
            },
        )
}

/// A `[batch.., rows, cols]` operand of `dt`, stored transposed when `t`.
fn operand(dt: DType, batch: &[usize], rows: usize, cols: usize, t: bool, seed: u64) -> Tensor {
    let r = batch.len();
    let mut dims = batch.to_vec();
    if t {
        dims.extend([cols, rows]);
        randn(&dims, dt, seed).transpose(r, r + 1).unwrap()
    } else {
        dims.extend([rows, cols]);
        randn(&dims, dt, seed)
    }
}

/// Run `c` in `dt` on `kernel` and compare with the f64 reference.
fn check_case(c: &Case, dt: DType, kernel: Kernel16) {
    let what = format!("{dt} {c:?} on {}", kernel.name());
    let batched = !matches!(c.form, Form::Mm | Form::Addmm);
    let bdims: &[usize] = if batched { &[c.batch] } else { &[] };
    let a = operand(dt, bdims, c.m, c.k, c.ta, c.seed);
    let b = if c.step_b {
        let wide = operand(dt, bdims, c.k, 2 * c.n, c.tb, c.seed ^ 1);
        wide.slice(bdims.len() + 1, 0, 2 * c.n, 2).unwrap()
    } else {
        operand(dt, bdims, c.k, c.n, c.tb, c.seed ^ 1)
    };
    let run = |f: &dyn Fn() -> Tensor| with_kernel16(kernel, f).unwrap();
    match c.form {
        Form::Mm => assert_close(
            &run(&|| mm(&a, &b).unwrap()),
            &ref_matmul(&a, &b),
            dt,
            &what,
        ),
        Form::Addmm => {
            let input = randn(&[c.n], dt, c.seed ^ 2);
            let got = run(&|| addmm(&input, &a, &b, c.beta, c.alpha).unwrap());
            let want = with_input(&ref_matmul(&a, &b), &input, c.beta, c.alpha);
            assert_close(&got, &want, dt, &what);
        }
        Form::Bmm => assert_close(
            &run(&|| bmm(&a, &b).unwrap()),
            &ref_matmul(&a, &b),
            dt,
            &what,
        ),
        Form::Baddbmm => {
            let input = randn(&[c.batch, 1, c.n], dt, c.seed ^ 2);
            let got = run(&|| baddbmm(&input, &a, &b, c.beta, c.alpha).unwrap());
            let want = with_input(&ref_matmul(&a, &b), &input, c.beta, c.alpha);
            assert_close(&got, &want, dt, &what);
        }
        Form::Addbmm => {
            let input = randn(&[c.m, c.n], dt, c.seed ^ 2);
            let got = run(&|| addbmm(&input, &a, &b, c.beta, c.alpha).unwrap());
            // The batch's products summed, as one reference of `m×n` sums.
            let per = ref_matmul(&a, &b);
            let mn = c.m * c.n;
            let sum = |v: &[f64]| -> Vec<f64> {
                (0..mn)
                    .map(|i| (0..c.batch).map(|bi| v[bi * mn + i]).sum())
                    .collect()
            };
            let summed = Ref {
                dims: vec![c.m, c.n],
                val: sum(&per.val),
                mag: sum(&per.mag),
            };
            assert_close(
                &got,
                &with_input(&summed, &input, c.beta, c.alpha),
                dt,
                &what,
            );
        }
        Form::MatmulBroadcast => {
            let b1 = operand(dt, &[], c.k, c.n, c.tb, c.seed ^ 3);
            let got = run(&|| matmul(&a, &b1).unwrap());
            assert_close(&got, &ref_matmul(&a, &b1), dt, &what);
        }
    }
}

/// Whether `kernel` runs `dt` products here; a kernel made for `dt` that this CPU lacks
/// is reported as skipped (the bfloat16-only kernels are simply not run on float16, nor
/// any but the AVX2 tiles and the float32 kernel on float32).
fn applicable(dt: DType, kernel: Kernel16, test: &str) -> bool {
    let bf16_only = matches!(kernel, Kernel16::Amx | Kernel16::Avx512Bf16);
    let made_for = match dt {
        DType::F16 => !bf16_only,
        DType::F32 => matches!(kernel, Kernel16::Avx2Fma | Kernel16::Widened),
        _ => true,
    };
    let ok = kernel.supports(dt);
    if made_for && !ok {
        amp_testing::report_skip(
            test,
            &format!("{} {dt}", kernel.name()),
            "this CPU lacks it",
        );
    }
    ok
}

/// The dtypes the packing kernels run.
const PACKED: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// Every product kernel this CPU has, forced in turn for each dtype it runs (float32 on
/// the AVX2 tiles too), against the f64 reference on random shapes: odd sizes, `m` or
/// `n` below a tile, `k` odd and not a multiple of 16 or 32, transposed and strided
/// operands, batches, a broadcast operand, the fused forms. A kernel the CPU lacks is
/// reported as skipped in the test output.
#[test]
fn every_product_kernel_on_random_shapes() {
    use proptest::test_runner::TestRunner;
    let runs: Vec<(DType, Kernel16)> = PACKED
        .into_iter()
        .flat_map(|dt| Kernel16::ALL.map(|k| (dt, k)))
        .filter(|&(dt, k)| applicable(dt, k, "every_product_kernel_on_random_shapes"))
        .collect();
    for dt in PACKED {
        assert!(
            runs.contains(&(dt, Kernel16::Widened)),
            "the widened path runs everywhere"
        );
    }
    let mut runner = TestRunner::new(amp_testing::proptest_config(64));
    runner
        .run(&case(), |c| {
            for &(dt, kernel) in &runs {
                check_case(&c, dt, kernel);
            }
            Ok(())
        })
        .unwrap();
}

/// A large product on every kernel (the parallel split, many strips and panels), and
/// one whose packed `B` spans several of the AVX2 tiles' column blocks (a long inner
/// dimension: 13 strips of 4100 words per line, 7 to a block, split 6 and 7), with a
/// partial last strip, an input term and `alpha`, and a parallel one of few strips
/// (four, the last partial: each task packs its own copy of each, on two threads or
/// more): the kernels agree with each other to float32 summation order.
#[test]
fn every_product_kernel_on_a_large_product() {
    for dt in PACKED {
        let a = randn(&[300, 257], dt, 90);
        let b = randn(&[190, 257], dt, 91).t().unwrap();
        let want = ref_matmul(&a, &b);
        let (long_a, long_b) = (randn(&[30, 4100], dt, 92), randn(&[4100, 400], dt, 93));
        let input = randn(&[400], dt, 94);
        let long = with_input(&ref_matmul(&long_a, &long_b), &input, 0.5, 2.0);
        let (few_a, few_b) = (randn(&[250, 130], dt, 95), randn(&[130, 100], dt, 96));
        let few = ref_matmul(&few_a, &few_b);
        for kernel in Kernel16::ALL {
            if !applicable(dt, kernel, "every_product_kernel_on_a_large_product") {
                continue;
            }
            let what = format!("{dt} on {}", kernel.name());
            let got = with_kernel16(kernel, || mm(&a, &b).unwrap()).unwrap();
            assert_close(&got, &want, dt, &what);
            let got = with_kernel16(kernel, || {
                addmm(&input, &long_a, &long_b, 0.5, 2.0).unwrap()
            })
            .unwrap();
            assert_close(&got, &long, dt, &format!("{what}, column blocks"));
            let got = with_kernel16(kernel, || mm(&few_a, &few_b).unwrap()).unwrap();
            assert_close(&got, &few, dt, &format!("{what}, own strips"));
        }
    }
}

/// Small 16-bit products (the direct kernel, reading 16-bit operands in place where
/// the CPU has AVX2, FMA and F16C) give the bits of the float32 product of the widened
/// operands rounded once, which takes the same direct kernel in the same order: a
/// transposed `A`, a `B` with strided rows (staged on the stack), edge columns, rows of
/// `A` widened in several chunks (`m·k` over the 4096-value stack buffer), an inner
/// dimension longer than that buffer (widened elsewhere), and a batch spread over the
/// threads. The widened rung is forced so that every CPU takes the direct kernel up to
/// `DIRECT_WORK` (with AMX or AVX-512 BF16 it stops at `DIRECT16_WORK`, and both sum
/// in pairs).
#[test]
fn small_16bit_products_round_the_float32_sums_once() {
    // (batch, m, k, n, A transposed, B transposed)
    let cases = [
        (1, 8, 8, 8, false, false),
        (1, 5, 13, 11, true, false),
        (1, 6, 9, 10, false, true),
        (1, 100, 60, 10, false, false),
        (1, 100, 60, 10, true, false),
        (1, 2, 6000, 4, false, false),
        (40, 16, 32, 16, false, false),
        (40, 16, 32, 16, true, false),
    ];
    for dt in [DType::BF16, DType::F16] {
        for (i, &(batch, m, k, n, ta, tb)) in cases.iter().enumerate() {
            let bdims: &[usize] = if batch > 1 { &[batch] } else { &[] };
            let seed = 700 + i as u64;
            let a = operand(dt, bdims, m, k, ta, seed);
            let b = operand(dt, bdims, k, n, tb, seed ^ 1);
            let prod = |a: &Tensor, b: &Tensor| {
                if batch > 1 {
                    bmm(a, b).unwrap()
                } else {
                    mm(a, b).unwrap()
                }
            };
            let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = prod(&wide(&a), &wide(&b)).to_dtype(dt).unwrap();
            let got = with_kernel16(Kernel16::Widened, || prod(&a, &b)).unwrap();
            let what = format!("{dt} case {i}: [{batch}] {m}x{k}x{n}, transposed {ta}/{tb}");
            assert_eq!(got.dims(), want.dims(), "{what}");
            assert_eq!(bits(&got), bits(&want), "{what}");
            assert_close(&got, &ref_matmul(&a, &b), dt, &what);
        }
    }
}

/// Widened 16-bit batches run one product per task, widened a block of rows at a time
/// when a product's float32 sums would not fit the cache (here 43 of 100 rows per
/// block): every block, the short last one included, and a transposed `A` read per
/// block from its own rows.
#[test]
fn widened_batches_in_blocks_of_rows() {
    for dt in [DType::BF16, DType::F16] {
        for ta in [false, true] {
            let a = operand(dt, &[3], 100, 9, ta, 92);
            let b = operand(dt, &[3], 9, 1500, false, 93);
            let got = with_kernel16(Kernel16::Widened, || bmm(&a, &b).unwrap()).unwrap();
            assert_close(
                &got,
                &ref_matmul(&a, &b),
                dt,
                &format!("{dt}, A transposed: {ta}"),
            );
        }
    }
}

#[test]
fn forcing_a_kernel_is_scoped_and_checked() {
    let before = kernel16(DType::BF16);
    with_kernel16(Kernel16::Widened, || {
        assert_eq!(kernel16(DType::BF16), Some(Kernel16::Widened));
        assert_eq!(kernel16(DType::F16), Some(Kernel16::Widened));
    })
    .unwrap();
    // Forcing a bfloat16-only kernel leaves float16 products to their own choice.
    if Kernel16::Avx512Bf16.supports(DType::BF16) {
        with_kernel16(Kernel16::Avx512Bf16, || {
            assert_eq!(kernel16(DType::F16), Kernel16::best(DType::F16));
        })
        .unwrap();
    }
    assert_eq!(kernel16(DType::BF16), before);
    // float32 products take the AVX2 tiles where they are the CPU's best vector
    // kernel, faer's float32 kernel elsewhere; float64 products never a packing kernel.
    let tiles = Kernel16::Avx2Fma.supports(DType::F32) && !Kernel16::Avx512Fma.supports(DType::F16);
    let f32_kernel = if tiles {
        Kernel16::Avx2Fma
    } else {
        Kernel16::Widened
    };
    assert_eq!(kernel16(DType::F32), Some(f32_kernel));
    assert_eq!(kernel16(DType::F64), None);
    if !Kernel16::Avx512Bf16.supports(DType::BF16) {
        let e = with_kernel16(Kernel16::Avx512Bf16, || ()).unwrap_err();
        assert!(e.to_string().contains("avx512_bf16"), "{e}");
    }
}

/// Many workers (16, as on a 16-core machine) cut a thin product into more groups of
/// strips than divide the strips evenly (5 panels, 16 strips, 7 groups): every group
/// gets its strips. Rounding each group's share up once sent the last group past the
/// end (an out-of-bounds strip index on a 16-core Xeon).
#[test]
fn many_workers_split_a_thin_product() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(16)
        .build()
        .unwrap();
    for dt in [DType::BF16, DType::F16] {
        let a = randn(&[40, 64], dt, 92);
        let b = randn(&[64, 512], dt, 93);
        let want = ref_matmul(&a, &b);
        for kernel in Kernel16::ALL {
            if !applicable(dt, kernel, "many_workers_split_a_thin_product") {
                continue;
            }
            let got = pool.install(|| with_kernel16(kernel, || mm(&a, &b).unwrap()).unwrap());
            assert_close(
                &got,
                &want,
                dt,
                &format!("{dt} on {} with 16 workers", kernel.name()),
            );
        }
    }
}

/// A product gives the same bits however many threads split it: each output element
/// sums its whole inner dimension in one tile, so row blocks, tasks that pack their own
/// strips, and one task per thread that packs all of `A` and its share of the strips
/// (256³ and the wide 64×256×1024 on 2 and 4 threads; 3 threads share 8 strips
/// unevenly and take row blocks) only change which thread computes a tile.
#[test]
fn every_split_of_a_product_gives_the_serial_bits() {
    let pools: Vec<rayon::ThreadPool> = [1, 2, 3, 4]
        .into_iter()
        .map(|t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    let shapes = [
        (256, 256, 256),
        (64, 256, 1024),
        (96, 96, 96),
        (250, 130, 100),
        (1024, 64, 128),
    ];
    for dt in [DType::BF16, DType::F16] {
        let kernels: Vec<Kernel16> = Kernel16::ALL
            .into_iter()
            .filter(|&k| applicable(dt, k, "every_split_of_a_product_gives_the_serial_bits"))
            .collect();
        for (m, k, n) in shapes {
            let (a, b) = (randn(&[m, k], dt, 97), randn(&[k, n], dt, 98));
            for &kernel in &kernels {
                let on = |pool: &rayon::ThreadPool| {
                    bits(&pool.install(|| with_kernel16(kernel, || mm(&a, &b).unwrap()).unwrap()))
                };
                let serial = on(&pools[0]);
                for pool in &pools[1..] {
                    assert!(
                        on(pool) == serial,
                        "{dt} {m}x{k}x{n} on {} with {} threads",
                        kernel.name(),
                        pool.current_num_threads()
                    );
                }
            }
        }
    }
}

/// Sums that round to a NaN with a payload or to a bfloat16 subnormal (an `addmm` input
/// passed through by zero rows of `A`, or added to a product) come out of every 16-bit
/// kernel with the bits of the integer rounding PyTorch uses (NaN as `0x7FC0`,
/// subnormals kept), which `vcvtne2ps2bf16` alone would not give; the other sums are
/// small integers, exact on every kernel.
#[test]
fn every_16bit_kernel_rounds_nan_and_subnormal_sums_as_pytorch() {
    use amp_tensor::half::bf16;
    let (m, n, k) = (40, 36, 20);
    // Rows 0..8 of `A` are zero: those outputs are the input itself.
    let a: Vec<bf16> = (0..m * k)
        .map(|i| bf16::from_f32(if i / k < 8 { 0.0 } else { (i % 5) as f32 - 2.0 }))
        .collect();
    let b: Vec<bf16> = (0..k * n)
        .map(|i| bf16::from_f32((i % 3) as f32 - 1.0))
        .collect();
    let specials = [0x7F81u16, 0xFFA5, 0x0001, 0x8003, 0x007F, 0x3F80];
    let input: Vec<bf16> = (0..m * n)
        .map(|i| bf16::from_bits(specials[i % specials.len()]))
        .collect();
    let a = Tensor::from_vec(a, [m, k]).unwrap();
    let b = Tensor::from_vec(b, [k, n]).unwrap();
    let input = Tensor::from_vec(input, [m, n]).unwrap();
    let bits = |t: Tensor| -> Vec<u16> {
        t.host_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(bf16::to_bits)
            .collect()
    };
    let want = bits(
        with_kernel16(Kernel16::Widened, || {
            addmm(&input, &a, &b, 1.0, 1.0).unwrap()
        })
        .unwrap(),
    );
    assert_eq!(want[0], 0x7FC0, "the integer rounding's NaN");
    assert_eq!(want[2], 0x0001, "a subnormal input passed through");
    for kernel in Kernel16::ALL {
        if !applicable(
            DType::BF16,
            kernel,
            "every_16bit_kernel_rounds_nan_and_subnormal_sums_as_pytorch",
        ) {
            continue;
        }
        let got = bits(with_kernel16(kernel, || addmm(&input, &a, &b, 1.0, 1.0).unwrap()).unwrap());
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "element {i} on {}: bits {:#06x}, want {:#06x}",
                kernel.name(),
                got[i],
                want[i]
            );
        }
    }
}

/// The AVX state components a thread has in use (`XINUSE`, `xgetbv` with `ecx = 1`).
///
/// # Safety
/// The CPU must have XSAVE and report `XGETBV` with `ecx = 1`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xinuse() -> u64 {
    // SAFETY: as the caller guarantees.
    unsafe { std::arch::x86_64::_xgetbv(1) }
}

/// faer's hand-written kernels return without `vzeroupper`; a product of any float
/// dtype (on any kernel: faer's, gemm's, the direct loop, the 16-bit kernels) and a
/// convolution (whose im2col product is faer's too) clear the upper halves of the vector
/// registers before they return, or every legacy-SSE instruction after them would wait
/// on those halves. Checked through `XINUSE` bit 2 (YMM upper halves) and bit 6 (ZMM upper halves);
/// skipped where the CPU cannot report it.
#[test]
#[cfg(target_arch = "x86_64")]
fn products_return_with_clean_upper_registers() {
    // CPUID.(EAX=0DH, ECX=1):EAX bit 2: XGETBV with ECX = 1.
    let leaf = std::arch::x86_64::__cpuid_count(0xd, 1);
    if !std::arch::is_x86_feature_detected!("avx") || leaf.eax & 4 == 0 {
        eprintln!("SKIPPED products_return_with_clean_upper_registers: no XINUSE");
        return;
    }
    // The message is formatted only on failure: nothing runs between the op and the read.
    let assert_clean = |what: std::fmt::Arguments<'_>| {
        const UPPER: u64 = 1 << 2 | 1 << 6;
        // SAFETY: the CPU reports `XINUSE` (checked above).
        let state = unsafe { xinuse() };
        assert_eq!(state & UPPER, 0, "{what}: XINUSE {state:#x}");
    };
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        for (m, k, n) in [
            (64, 64, 64),
            (40, 20, 36),
            (16, 40, 20),
            (8, 8, 8),
            (256, 256, 256),
        ] {
            let a = randn(&[m, k], dtype, 300);
            let b = randn(&[k, n], dtype, 301);
            let out = mm(&a, &b).unwrap();
            assert_clean(format_args!("{dtype:?} {m}x{k}x{n}"));
            drop(out);
        }
        let x = randn(&[2, 8, 16, 16], dtype, 302);
        let w = randn(&[16, 8, 3, 3], dtype, 303);
        let p = amp_kernels::ConvParams::new(&[1, 1], &[1, 1], &[1, 1], 1);
        let y = amp_kernels::conv(&x, &w, None, &p).unwrap();
        assert_clean(format_args!("{dtype:?} conv2d"));
        drop(y);
    }
}

/// `beta * input + alpha * Σ_p a[i,p]·b[p,j]` as the direct kernel computes it, in
/// float32 (`single`) or float64: one multiply-add per step of the inner dim, in order,
/// fused where `fused`; then `alpha *` the sum, plus `beta * input` (two roundings).
#[allow(clippy::too_many_arguments)]
fn in_order(
    a: &[f64],
    b: &[f64],
    input: &[f64],
    (m, k, n): (usize, usize, usize),
    (beta, alpha): (f64, f64),
    single: bool,
    fused: bool,
) -> Vec<f64> {
    let r = |x: f64| if single { x as f32 as f64 } else { x };
    let madd = |x: f64, y: f64, s: f64| match (single, fused) {
        (true, true) => (x as f32).mul_add(y as f32, s as f32) as f64,
        (true, false) => (s as f32 + x as f32 * y as f32) as f64,
        (false, true) => x.mul_add(y, s),
        (false, false) => s + x * y,
    };
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let s = (0..k).fold(0.0, |s, p| madd(a[i * k + p], b[p * n + j], s));
            let v = r(alpha * s);
            out[i * n + j] = if beta == 0.0 {
                v
            } else {
                r(r(beta * input[i * n + j]) + v)
            };
        }
    }
    out
}

/// Three `m×k` and three `k×n` matrices (`[3, m, k]`, `[3, k, n]`), each a transposed
/// view (column-major) where asked.
fn three(
    (m, k, n): (usize, usize, usize),
    (a_cols, b_cols): (bool, bool),
    dtype: DType,
    seed: u64,
) -> (Tensor, Tensor) {
    let side = |rows: usize, cols: usize, col_major: bool, seed: u64| {
        if col_major {
            let t = randn(&[3, cols, rows], dtype, seed);
            t.transpose(1usize, 2usize).unwrap()
        } else {
            randn(&[3, rows, cols], dtype, seed)
        }
    };
    (side(m, k, a_cols, seed), side(k, n, b_cols, seed + 1))
}

/// [`in_order`] for each of the three products of `a` and `b` (see [`three`]).
fn in_order_three(
    a: &Tensor,
    b: &Tensor,
    (m, k, n): (usize, usize, usize),
    single: bool,
    fused: bool,
) -> Vec<f64> {
    let (av, bv) = (a.to_vec_f64(), b.to_vec_f64());
    (0..3)
        .flat_map(|i| {
            let (x, y) = (&av[i * m * k..][..m * k], &bv[i * k * n..][..k * n]);
            in_order(x, y, &[], (m, k, n), (0.0, 1.0), single, fused)
        })
        .collect()
}

/// The direct kernel (products up to `SMALL_WORK` multiply-adds, and up to
/// `DIRECT_WORK` with a row-major `B`) gives the bits of the in-order sum on every tile
/// shape: 8, 4, 2 and 1 rows, one to eight vectors of columns, masked last columns, a
/// column-major `A`, a column-major `B` (copied first), `beta`/`alpha`, and a batch; in
/// bfloat16 and float16 (up to `DIRECT16_WORK`), the same float32 sums rounded once,
/// with an input term too (`addmm` of a bias row).
#[test]
fn direct_kernel_sums_in_order() {
    use amp_kernels::{DIRECT_WORK, SMALL_WORK};
    #[cfg(target_arch = "x86_64")]
    let fused = is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let fused = false;
    // (m, k, n, A column-major, B column-major)
    let cases = [
        (1, 30, 130, false, false),
        (2, 9, 70, false, false),
        (3, 5, 33, true, false),
        (5, 17, 9, false, true),
        (8, 64, 8, false, true),
        (8, 64, 8, true, false),
        (13, 11, 17, false, false),
        (16, 64, 16, false, false),
        (9, 7, 1, false, true),
        (32, 64, 32, false, false),
        (12, 3, 40, true, true),
    ];
    for &(m, k, n, _, b_cols) in &cases {
        let limit = if b_cols { SMALL_WORK } else { DIRECT_WORK };
        assert!(m * k * n <= limit, "{m}x{k}x{n} is not a direct product");
    }
    for dtype in [DType::F32, DType::F64] {
        let single = dtype == DType::F32;
        for (c, &(m, k, n, a_cols, b_cols)) in cases.iter().enumerate() {
            let seed = 400 + 10 * c as u64;
            let a = if a_cols {
                randn(&[k, m], dtype, seed).t().unwrap()
            } else {
                randn(&[m, k], dtype, seed)
            };
            let b = if b_cols {
                randn(&[n, k], dtype, seed + 1).t().unwrap()
            } else {
                randn(&[k, n], dtype, seed + 1)
            };
            let input = randn(&[m, n], dtype, seed + 2);
            let (av, bv, iv) = (a.to_vec_f64(), b.to_vec_f64(), input.to_vec_f64());
            let what = format!("{dtype} {m}x{k}x{n} a_cols={a_cols} b_cols={b_cols}");
            let shape = (m, k, n);
            let want = in_order(&av, &bv, &iv, shape, (0.0, 1.0), single, fused);
            assert_eq!(mm(&a, &b).unwrap().to_vec_f64(), want, "mm {what}");
            let want = in_order(&av, &bv, &iv, shape, (0.5, -1.5), single, fused);
            let got = addmm(&input, &a, &b, 0.5, -1.5).unwrap();
            assert_eq!(got.to_vec_f64(), want, "addmm {what}");
            let (ba, bb) = three((m, k, n), (a_cols, b_cols), dtype, seed + 3);
            let want = in_order_three(&ba, &bb, shape, single, fused);
            assert_eq!(bmm(&ba, &bb).unwrap().to_vec_f64(), want, "bmm {what}");
        }
    }
    // 16-bit products up to `DIRECT16_WORK`: widened, the same float32 sums, rounded once.
    for dtype in [DType::BF16, DType::F16] {
        for (c, &(m, k, n, a_cols, b_cols)) in cases.iter().enumerate() {
            if m * k * n > amp_kernels::DIRECT16_WORK {
                continue;
            }
            let seed = 500 + 10 * c as u64;
            let (a, b) = three((m, k, n), (a_cols, b_cols), dtype, seed);
            let sums: Vec<f32> = in_order_three(&a, &b, (m, k, n), true, fused)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            let want = Tensor::from_vec(sums, [3, m, n])
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .to_vec_f64();
            let what = format!("{dtype} {m}x{k}x{n} a_cols={a_cols} b_cols={b_cols}");
            assert_eq!(bmm(&a, &b).unwrap().to_vec_f64(), want, "bmm {what}");
            // With an input term (a bias row, broadcast down the rows, as a linear
            // layer's): `beta · input + alpha · sum` in float32, rounded once.
            let (a0, b0) = (a.select(0, 0).unwrap(), b.select(0, 0).unwrap());
            let bias = randn(&[n], dtype, seed + 2);
            let iv: Vec<f64> = (0..m).flat_map(|_| bias.to_vec_f64()).collect();
            let (av, bv) = (a0.to_vec_f64(), b0.to_vec_f64());
            let sums = in_order(&av, &bv, &iv, (m, k, n), (0.5, -1.5), true, fused);
            let sums: Vec<f32> = sums.into_iter().map(|v| v as f32).collect();
            let want = Tensor::from_vec(sums, [m, n])
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let got = addmm(&bias, &a0, &b0, 0.5, -1.5).unwrap();
            assert_eq!(bits(&got), bits(&want), "addmm {what}");
        }
    }
}

/// float32 values of `dims` that round to 16 bits every way: random ones, and among
/// them (every seventh) ties to even, values that overflow to inf, subnormals, inf and
/// NaN with a payload.
fn rounding_cases(dims: &[usize], seed: u64) -> Tensor {
    let special = [
        f32::from_bits(0x3F80_8000), // a bfloat16 tie (rounds down to even)
        f32::from_bits(0x3F81_8000), // a bfloat16 tie (rounds up to even)
        1.000_488_3,                 // a float16 tie
        f32::MAX,
        1e-40,
        -3e-39,
        f32::INFINITY,
        f32::from_bits(0x7FC0_1234),
        f32::from_bits(0xFF80_0001),
    ];
    let mut v = randn(dims, DType::F32, seed).to_vec_f64();
    for (i, x) in v.iter_mut().enumerate().filter(|(i, _)| i % 7 == 3) {
        *x = special[(i / 7) % special.len()] as f64;
    }
    let v: Vec<f32> = v.into_iter().map(|x| x as f32).collect();
    Tensor::from_vec(v, dims.to_vec()).unwrap()
}

/// `mm_as` and `bmm_as` (float32 operands read as bfloat16 or float16: rounded as the
/// kernels read them where they can, else cast first) give the bits of the product of
/// the cast operands, on every kernel the CPU has, for the direct kernel's sizes and
/// the packing kernels', row- and column-major operands, a batch and a broadcast one,
/// with values that round every way (ties, overflow, subnormals, NaN).
#[test]
fn products_read_as_16_bit_give_the_bits_of_the_cast_operands() {
    let shapes = [
        (8, 8, 8),
        (5, 17, 9),
        (16, 16, 16),
        (16, 64, 16),
        (32, 32, 32),
        (40, 31, 70),
        (96, 96, 96),
        (64, 130, 72),
        (200, 64, 150),
        (1, 300, 7),
    ];
    let operand = |rows: usize, cols: usize, col_major: bool, seed: u64| {
        if col_major {
            rounding_cases(&[cols, rows], seed).t().unwrap()
        } else {
            rounding_cases(&[rows, cols], seed)
        }
    };
    let test = "products_read_as_16_bit_give_the_bits_of_the_cast_operands";
    for dt in [DType::BF16, DType::F16] {
        for kernel in Kernel16::ALL
            .into_iter()
            .filter(|&k| applicable(dt, k, test))
        {
            for (c, &(m, k, n)) in shapes.iter().enumerate() {
                for (a_cols, b_cols) in [(false, false), (true, false), (false, true), (true, true)]
                {
                    let seed = 700 + 10 * c as u64;
                    let (a, b) = (operand(m, k, a_cols, seed), operand(k, n, b_cols, seed + 1));
                    let what = format!(
                        "{dt} {m}x{k}x{n} a_cols={a_cols} b_cols={b_cols} on {}",
                        kernel.name()
                    );
                    let (got, want) = with_kernel16(kernel, || {
                        let want = mm(&a.to_dtype(dt).unwrap(), &b.to_dtype(dt).unwrap()).unwrap();
                        (mm_as(&a, &b, dt).unwrap(), want)
                    })
                    .unwrap();
                    assert_eq!(got.dtype(), dt, "mm_as {what}");
                    assert!(bits(&got) == bits(&want), "mm_as {what}");
                }
                // A batch of three.
                let seed = 800 + 10 * c as u64;
                let a = rounding_cases(&[3, m, k], seed);
                // `B` column-major (each matrix transposed), or one matrix expanded.
                let b = rounding_cases(&[3, n, k], seed + 1)
                    .transpose(1usize, 2usize)
                    .unwrap();
                let one = rounding_cases(&[1, k, n], seed + 2)
                    .expand(vec![3, k, n])
                    .unwrap();
                for b in [b, one] {
                    let what = format!("{dt} 3x{m}x{k}x{n} on {}", kernel.name());
                    let (got, want) = with_kernel16(kernel, || {
                        let want = bmm(&a.to_dtype(dt).unwrap(), &b.to_dtype(dt).unwrap()).unwrap();
                        (bmm_as(&a, &b, dt).unwrap(), want)
                    })
                    .unwrap();
                    assert!(bits(&got) == bits(&want), "bmm_as {what}");
                }
            }
        }
    }
    // Operands that are not float32 are cast first: the same bits again.
    let (a, b) = (
        randn(&[20, 30], DType::F64, 900),
        randn(&[30, 10], DType::F64, 901),
    );
    let want = mm(
        &a.to_dtype(DType::BF16).unwrap(),
        &b.to_dtype(DType::BF16).unwrap(),
    )
    .unwrap();
    assert!(
        bits(&mm_as(&a, &b, DType::BF16).unwrap()) == bits(&want),
        "float64 operands"
    );
}
