//! Linear algebra, quantiles and fake quantization: reconstruction properties of the
//! factorisations, finite-difference checks of first- and second-order gradients in
//! float64, and the dtype rules.

use amp_autograd::ops::{self, MatrixNormOrd, QrMode, QuantileQ};
use amp_autograd::Tensor;
use amp_tensor::DType;
use amp_testing::gradcheck::{assert_near as assert_close, GradCheck, SecondOrder};
use amp_testing::tensors::{leaf, randn_vec as randn};
use proptest::prelude::*;

/// A function under check (it may borrow locals).
type Checked<'a> = &'a dyn Fn(&Tensor) -> amp_autograd::Result<Tensor>;
/// A function, its input's values and shape, and the directions to check it along.
type Case<'a> = (Checked<'a>, &'a [f64], [usize; 2], Vec<Vec<f64>>);

fn vals(t: &Tensor) -> Vec<f64> {
    t.data().to_vec_f64()
}

/// A well-conditioned square matrix: random plus `n` on the diagonal.
fn well_conditioned(n: usize, batch: usize, seed: u64) -> Vec<f64> {
    let mut v = randn(&[batch, n, n], seed);
    for b in 0..batch {
        for i in 0..n {
            v[b * n * n + i * n + i] += n as f64 + 1.0;
        }
    }
    v
}

/// A symmetric positive-definite matrix `M Mᵀ + n I`.
fn spd(n: usize, seed: u64) -> Vec<f64> {
    let m = randn(&[n, n], seed);
    let mut a = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            a[i * n + j] = (0..n).map(|k| m[i * n + k] * m[j * n + k]).sum::<f64>();
        }
        a[i * n + i] += n as f64;
    }
    a
}

fn symmetric(v: &[f64], n: usize) -> Vec<f64> {
    let mut s = v.to_vec();
    for i in 0..n {
        for j in 0..n {
            s[i * n + j] = 0.5 * (v[i * n + j] + v[j * n + i]);
        }
    }
    s
}

fn matmul_vals(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// The workspace's gradient checker on `sum(f(x) * w)` (weights from seed 7) along
/// `dirs`, step 1e-6 within 1e-5, and with `second` the gradient of `sum(g * g)` (g the
/// first-order gradient, built with `create_graph`) the same way, step 1e-5 within 1e-4:
/// double backward. Directions keep constrained inputs (symmetric, triangular) inside
/// their subspace.
fn check_grads(f: Checked<'_>, x: &[f64], shape: &[usize], dirs: &[Vec<f64>], second: bool) {
    let g = |v: &[Tensor]| f(&v[0]);
    let dirs: Vec<Vec<Vec<f64>>> = dirs.iter().map(|d| vec![d.clone()]).collect();
    let x = leaf(x.to_vec(), shape);
    let check = GradCheck::new(&g).seed(7).along(&dirs);
    check.tol(1e-5).first(std::slice::from_ref(&x));
    if second {
        check.eps(1e-5).tol(1e-4).second(&[x], SecondOrder::Squares);
    }
}

fn random_dirs(len: usize, count: usize, seed: u64) -> Vec<Vec<f64>> {
    (0..count)
        .map(|i| randn(&[len], seed + 100 + i as u64))
        .collect()
}

fn symmetric_dirs(n: usize, count: usize, seed: u64) -> Vec<Vec<f64>> {
    random_dirs(n * n, count, seed)
        .into_iter()
        .map(|d| symmetric(&d, n))
        .collect()
}

fn lower_dirs(n: usize, count: usize, seed: u64) -> Vec<Vec<f64>> {
    random_dirs(n * n, count, seed)
        .into_iter()
        .map(|mut d| {
            for i in 0..n {
                for j in i + 1..n {
                    d[i * n + j] = 0.0;
                }
            }
            d
        })
        .collect()
}

fn eye_vals(n: usize) -> Vec<f64> {
    let mut v = vec![0.0; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    v
}

// ----- inverse / solve -------------------------------------------------------------------

proptest! {
    #![proptest_config(amp_testing::proptest_config(16))]

    #[test]
    fn inverse_times_matrix_is_identity(n in 1usize..7, batch in 1usize..4, seed in 0u64..1000) {
        let a = well_conditioned(n, batch, seed);
        let t = Tensor::from_vec(a.clone(), [batch, n, n]).unwrap();
        let inv = vals(&ops::linalg_inv(&t).unwrap());
        for b in 0..batch {
            let s = b * n * n;
            let p = matmul_vals(&a[s..s + n * n], &inv[s..s + n * n], n, n, n);
            assert_close(&p, &eye_vals(n), 1e-10, "A inv(A)");
        }
    }

    #[test]
    fn solve_satisfies_the_equation(n in 1usize..6, k in 1usize..4, seed in 0u64..1000) {
        let a = well_conditioned(n, 1, seed);
        let b = randn(&[n, k], seed + 1);
        let x = ops::linalg_solve(
            &Tensor::from_vec(a.clone(), [n, n]).unwrap(),
            &Tensor::from_vec(b.clone(), [n, k]).unwrap(),
            true,
        )
        .unwrap();
        assert_close(&matmul_vals(&a, &vals(&x), n, n, k), &b, 1e-10, "A X");
    }

    #[test]
    fn cholesky_reconstructs(n in 1usize..7, seed in 0u64..1000) {
        let a = spd(n, seed);
        let l = vals(&ops::linalg_cholesky(&Tensor::from_vec(a.clone(), [n, n]).unwrap(), false).unwrap());
        let mut lt = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                lt[j * n + i] = l[i * n + j];
                if j > i {
                    assert_eq!(l[i * n + j], 0.0);
                }
            }
        }
        assert_close(&matmul_vals(&l, &lt, n, n, n), &a, 1e-10, "L Lt");
    }

    #[test]
    fn qr_reconstructs(m in 1usize..7, n in 1usize..7, seed in 0u64..1000) {
        let a = randn(&[m, n], seed);
        let t = Tensor::from_vec(a.clone(), [m, n]).unwrap();
        for mode in [QrMode::Reduced, QrMode::Complete] {
            let (q, r) = ops::linalg_qr(&t, mode).unwrap();
            let kq = q.dims()[1];
            let (qv, rv) = (vals(&q), vals(&r));
            assert_close(&matmul_vals(&qv, &rv, m, kq, n), &a, 1e-10, "Q R");
            let mut qt = vec![0.0; kq * m];
            for i in 0..m { for j in 0..kq { qt[j * m + i] = qv[i * kq + j]; } }
            assert_close(&matmul_vals(&qt, &qv, kq, m, kq), &eye_vals(kq), 1e-10, "Qt Q");
            for i in 0..r.dims()[0] { for j in 0..i.min(n) { assert_eq!(rv[i * n + j], 0.0); } }
        }
    }

    #[test]
    fn svd_reconstructs(m in 1usize..7, n in 1usize..7, seed in 0u64..1000) {
        let a = randn(&[m, n], seed);
        let t = Tensor::from_vec(a.clone(), [m, n]).unwrap();
        let k = m.min(n);
        let (u, s, vh) = ops::linalg_svd(&t, false).unwrap();
        let (uv, sv, vhv) = (vals(&u), vals(&s), vals(&vh));
        let mut us = uv.clone();
        for i in 0..m { for j in 0..k { us[i * k + j] *= sv[j]; } }
        assert_close(&matmul_vals(&us, &vhv, m, k, n), &a, 1e-10, "U S Vh");
        assert!(sv.windows(2).all(|w| w[0] >= w[1]));
        assert_close(&vals(&ops::linalg_svdvals(&t).unwrap()), &sv, 1e-10, "svdvals");
        let (uf, _, vf) = ops::linalg_svd(&t, true).unwrap();
        assert_eq!(uf.dims(), &[m, m]);
        assert_eq!(vf.dims(), &[n, n]);
    }

    #[test]
    fn eigh_diagonalises(n in 1usize..7, seed in 0u64..1000) {
        let a = symmetric(&randn(&[n, n], seed), n);
        let t = Tensor::from_vec(a.clone(), [n, n]).unwrap();
        let (w, v) = ops::linalg_eigh(&t, "L").unwrap();
        let (wv, vv) = (vals(&w), vals(&v));
        let av = matmul_vals(&a, &vv, n, n, n);
        let mut vw = vv.clone();
        for i in 0..n { for j in 0..n { vw[i * n + j] *= wv[j]; } }
        assert_close(&av, &vw, 1e-9, "A V = V diag(w)");
        assert!(wv.windows(2).all(|p| p[0] <= p[1]));
        assert_close(&vals(&ops::linalg_eigvalsh(&t, "U").unwrap()), &wv, 1e-10, "eigvalsh");
    }

    #[test]
    fn pinverse_is_a_generalised_inverse(m in 1usize..6, n in 1usize..6, seed in 0u64..1000) {
        let a = randn(&[m, n], seed);
        let p = vals(&ops::pinverse(&Tensor::from_vec(a.clone(), [m, n]).unwrap(), 1e-15).unwrap());
        let apa = matmul_vals(&matmul_vals(&a, &p, m, n, m), &a, m, m, n);
        assert_close(&apa, &a, 1e-9, "A pinv(A) A");
    }

    #[test]
    fn lu_reconstructs_and_solves(n in 1usize..6, seed in 0u64..1000) {
        let a = randn(&[n, n], seed);
        let t = Tensor::from_vec(a.clone(), [n, n]).unwrap();
        let out = ops::lu(&t, true, true).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].dtype(), DType::I32);
        let p = amp_kernels::lu_pivots_to_permutation(out[1].data(), n, DType::F64).unwrap().to_vec_f64();
        let lu = vals(&out[0]);
        let (mut l, mut u) = (vec![0.0; n * n], vec![0.0; n * n]);
        for i in 0..n {
            for j in 0..n {
                if i > j { l[i * n + j] = lu[i * n + j]; } else { u[i * n + j] = lu[i * n + j]; }
            }
            l[i * n + i] = 1.0;
        }
        let plu = matmul_vals(&p, &matmul_vals(&l, &u, n, n, n), n, n, n);
        assert_close(&plu, &a, 1e-10, "P L U");
        let b = randn(&[n, 2], seed + 3);
        let x = ops::lu_solve(&Tensor::from_vec(b.clone(), [n, 2]).unwrap(), &out[0], &out[1]).unwrap();
        // Only meaningful for a non-singular A; random Gaussian matrices are.
        assert_close(&matmul_vals(&a, &vals(&x), n, n, 2), &b, 1e-6, "A lu_solve");
    }
}

#[test]
fn batched_and_broadcast_solve() {
    let a = well_conditioned(3, 2, 11);
    let b = randn(&[3], 12);
    let at = Tensor::from_vec(a.clone(), [2, 3, 3]).unwrap();
    let x = ops::linalg_solve(&at, &Tensor::from_vec(b.clone(), [3]).unwrap(), true).unwrap();
    assert_eq!(x.dims(), &[2, 3]);
    let xv = vals(&x);
    for k in 0..2 {
        let ax = matmul_vals(&a[k * 9..k * 9 + 9], &xv[k * 3..k * 3 + 3], 3, 3, 1);
        assert_close(&ax, &b, 1e-10, "batched A x = b");
    }
    // left=False: X A = B.
    let bm = randn(&[2, 3], 13);
    let x = ops::linalg_solve(
        &Tensor::from_vec(a[..9].to_vec(), [3, 3]).unwrap(),
        &Tensor::from_vec(bm.clone(), [2, 3]).unwrap(),
        false,
    )
    .unwrap();
    assert_close(
        &matmul_vals(&vals(&x), &a[..9], 2, 3, 3),
        &bm,
        1e-10,
        "X A = B",
    );
}

#[test]
fn singular_and_not_positive_definite_are_errors() {
    let s = Tensor::from_vec(vec![1.0, 2.0, 2.0, 4.0], [2, 2]).unwrap();
    let e = ops::linalg_inv(&s).unwrap_err().to_string();
    assert!(e.contains("singular"), "{e}");
    let (_, info) = ops::linalg_inv_ex(&s, false).unwrap();
    assert_eq!(info.data().to_vec_as::<i64>(), vec![2]);
    let np = Tensor::from_vec(vec![1.0, 2.0, 2.0, 1.0], [2, 2]).unwrap();
    let e = ops::linalg_cholesky(&np, false).unwrap_err().to_string();
    assert!(e.contains("leading minor of order 2"), "{e}");
    let (_, info) = ops::linalg_cholesky_ex(&np, false, false).unwrap();
    assert_eq!(info.data().to_vec_as::<i64>(), vec![2]);
}

#[test]
fn half_precision_is_rejected_but_trace_accepts_it() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    let b = x.to_dtype(DType::BF16).unwrap();
    for r in [
        ops::linalg_inv(&b).map(|_| ()),
        ops::linalg_cholesky(&b, false).map(|_| ()),
        ops::linalg_svdvals(&b).map(|_| ()),
        ops::linalg_eigvalsh(&b, "L").map(|_| ()),
        ops::quantile(&b, QuantileQ::Scalar(0.5), None, false, "linear").map(|_| ()),
    ] {
        assert!(r.is_err());
    }
    let tr = ops::trace(&b).unwrap();
    assert_eq!(tr.dtype(), DType::BF16);
    assert_eq!(tr.data().to_vec_f64(), vec![5.0]);
    let t32 = ops::trace(&x).unwrap();
    assert_eq!(t32.dtype(), DType::F32);
    assert_eq!(vals(&t32), vec![5.0]);
    // Non-square: the first min(m, n) diagonal entries.
    let r = Tensor::from_vec((0..6).map(f64::from).collect::<Vec<_>>(), [2, 3]).unwrap();
    assert_eq!(vals(&ops::trace(&r).unwrap()), vec![4.0]);
}

#[test]
fn float32_matches_float64() {
    let a = well_conditioned(4, 1, 5);
    let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
    let i64_ = vals(&ops::linalg_inv(&Tensor::from_vec(a.clone(), [4, 4]).unwrap()).unwrap());
    let i32_ = ops::linalg_inv(&Tensor::from_vec(a32, [4, 4]).unwrap()).unwrap();
    assert_eq!(i32_.dtype(), DType::F32);
    assert_close(&vals(&i32_), &i64_, 1e-5, "f32 inverse");
}

// ----- gradients ---------------------------------------------------------------------------

#[test]
fn inverse_and_solve_gradients() {
    let n = 3;
    let a = well_conditioned(n, 1, 21);
    let b = Tensor::from_vec(randn(&[n, 2], 22), [n, 2]).unwrap();
    let at = Tensor::from_vec(a.clone(), [n, n]).unwrap();
    let bv = randn(&[n, 2], 23);
    let cases: [Case<'_>; 4] = [
        (&|x| ops::linalg_inv(x), &a, [n, n], random_dirs(9, 3, 1)),
        (&|x| ops::inverse(x), &a, [n, n], random_dirs(9, 2, 2)),
        (
            &|x| ops::linalg_solve(x, &b, true),
            &a,
            [n, n],
            random_dirs(9, 3, 3),
        ),
        (
            &|x| ops::linalg_solve(&at, x, true),
            &bv,
            [n, 2],
            random_dirs(6, 2, 4),
        ),
    ];
    for (f, x, shape, dirs) in cases {
        check_grads(f, x, &shape, &dirs, true);
    }
}

#[test]
fn triangular_and_cholesky_solve_gradients() {
    let n = 3;
    let l = {
        let mut v = well_conditioned(n, 1, 31);
        for i in 0..n {
            for j in i + 1..n {
                v[i * n + j] = 0.0;
            }
        }
        v
    };
    let b = Tensor::from_vec(randn(&[n, 2], 32), [n, 2]).unwrap();
    let cases: [(Checked<'_>, Vec<Vec<f64>>); 4] = [
        (
            &|x| ops::linalg_solve_triangular(x, &b, false, true, false),
            lower_dirs(n, 3, 5),
        ),
        (
            &|x| Ok(ops::triangular_solve(&b, x, false, true, false)?.0),
            lower_dirs(n, 2, 6),
        ),
        (&|x| ops::cholesky_solve(&b, x, false), lower_dirs(n, 3, 7)),
        (&|x| ops::cholesky_inverse(x, false), lower_dirs(n, 3, 8)),
    ];
    for (f, dirs) in cases {
        check_grads(f, &l, &[n, n], &dirs, true);
    }
    // Values: cholesky_solve(B, L) = (L Lᵀ)⁻¹ B.
    let lt = Tensor::from_vec(l.clone(), [n, n]).unwrap();
    let a = ops::matmul(&lt, &lt.t().unwrap()).unwrap();
    let x1 = ops::cholesky_solve(&b, &lt, false).unwrap();
    let x2 = ops::linalg_solve(&a, &b, true).unwrap();
    assert_close(&vals(&x1), &vals(&x2), 1e-10, "cholesky_solve");
    let ci = ops::cholesky_inverse(&lt, false).unwrap();
    assert_close(
        &vals(&ci),
        &vals(&ops::linalg_inv(&a).unwrap()),
        1e-10,
        "cholesky_inverse",
    );
    let u = lt.t().unwrap();
    assert_close(
        &vals(&ops::cholesky_inverse(&u, true).unwrap()),
        &vals(&ci),
        1e-10,
        "upper",
    );
}

#[test]
fn cholesky_gradients_along_symmetric_directions() {
    let n = 3;
    let a = spd(n, 41);
    check_grads(
        &|x| ops::linalg_cholesky(x, false),
        &a,
        &[n, n],
        &symmetric_dirs(n, 3, 9),
        true,
    );
    check_grads(
        &|x| ops::linalg_cholesky(x, true),
        &a,
        &[n, n],
        &symmetric_dirs(n, 2, 10),
        true,
    );
}

#[test]
fn eigh_gradients_along_symmetric_directions() {
    let n = 3;
    let a = symmetric(&randn(&[n, n], 51), n);
    check_grads(
        &|x| ops::linalg_eigvalsh(x, "L"),
        &a,
        &[n, n],
        &symmetric_dirs(n, 3, 11),
        true,
    );
    // Eigenvectors up to sign: a loss on V ∘ V.
    check_grads(
        &|x| {
            let (w, v) = ops::linalg_eigh(x, "L")?;
            ops::add(&ops::mul(&v, &v)?, &ops::unsqueeze(&w, 0)?)
        },
        &a,
        &[n, n],
        &symmetric_dirs(n, 3, 12),
        true,
    );
}

#[test]
fn svd_and_pinverse_gradients() {
    for (m, n) in [(3, 4), (4, 3), (3, 3)] {
        let a = randn(&[m, n], 61 + m as u64);
        let len = m * n;
        check_grads(
            &|x| ops::linalg_svdvals(x),
            &a,
            &[m, n],
            &random_dirs(len, 3, 13),
            true,
        );
        check_grads(
            &|x| ops::pinverse(x, 1e-15),
            &a,
            &[m, n],
            &random_dirs(len, 3, 14),
            true,
        );
        // U and Vh up to a common sign per singular pair: losses on U∘U and Vh∘Vh.
        check_grads(
            &|x| {
                let (u, _, vh) = ops::linalg_svd(x, false)?;
                let uu = ops::sum(&ops::mul(&u, &u)?, &[0], false, None)?;
                let vv = ops::sum(&ops::mul(&vh, &vh)?, &[0], false, None)?;
                ops::cat(
                    &[ops::mul_scalar(&uu, 0.3)?, vv, ops::linalg_svdvals(x)?],
                    0,
                )
            },
            &a,
            &[m, n],
            &random_dirs(len, 3, 15),
            false,
        );
        check_grads(
            &|x| {
                let (u, s, vh) = ops::linalg_svd(x, false)?;
                // u_i v_iᵀ is sign-free: U diag(S²) Vh.
                ops::matmul(&ops::mul(&u, &ops::unsqueeze(&ops::mul(&s, &s)?, 0)?)?, &vh)
            },
            &a,
            &[m, n],
            &random_dirs(len, 2, 16),
            true,
        );
    }
}

#[test]
fn qr_gradients() {
    for (m, n) in [(4, 3), (3, 3), (3, 5)] {
        let a = randn(&[m, n], 71 + n as u64);
        check_grads(
            &|x| {
                let (q, r) = ops::linalg_qr(x, QrMode::Reduced)?;
                ops::cat(&[ops::flatten(&q, 0, -1)?, ops::flatten(&r, 0, -1)?], 0)
            },
            &a,
            &[m, n],
            &random_dirs(m * n, 3, 17),
            true,
        );
    }
    let a = Tensor::from_vec(randn(&[3, 2], 5), [3, 2]).unwrap();
    a.requires_grad_(true).unwrap();
    let (_, r) = ops::linalg_qr(&a, QrMode::R).unwrap();
    assert!(ops::sum_all(&r).unwrap().backward().is_err());
}

#[test]
fn lu_gradients() {
    let n = 3;
    let a = well_conditioned(n, 1, 81);
    check_grads(
        &|x| Ok(ops::lu(x, true, false)?[0].clone()),
        &a,
        &[n, n],
        &random_dirs(9, 3, 18),
        true,
    );
    let at = Tensor::from_vec(a.clone(), [n, n]).unwrap();
    let out = ops::lu(&at, true, false).unwrap();
    let (lu, piv) = (out[0].clone(), out[1].clone());
    let (lu2, piv2) = (lu.clone(), piv.clone());
    check_grads(
        &move |b| ops::lu_solve(b, &lu2, &piv2),
        &randn(&[n, 2], 82),
        &[n, 2],
        &random_dirs(6, 2, 19),
        true,
    );
    let b = Tensor::from_vec(randn(&[n, 2], 83), [n, 2]).unwrap();
    check_grads(
        &move |l| ops::lu_solve(&b, l, &piv),
        &vals(&lu),
        &[n, n],
        &random_dirs(9, 3, 20),
        true,
    );
}

#[test]
fn norms_condition_rank_and_tensor_ops() {
    let a = randn(&[3, 4], 91);
    let t = Tensor::from_vec(a.clone(), [3, 4]).unwrap();
    let fro =
        vals(&ops::linalg_matrix_norm(&t, MatrixNormOrd::Fro, [-2, -1], false, None).unwrap());
    assert_close(
        &fro,
        &[a.iter().map(|v| v * v).sum::<f64>().sqrt()],
        1e-12,
        "fro",
    );
    let s = vals(&ops::linalg_svdvals(&t).unwrap());
    let nuc =
        vals(&ops::linalg_matrix_norm(&t, MatrixNormOrd::Nuc, [-2, -1], false, None).unwrap());
    assert_close(&nuc, &[s.iter().sum()], 1e-12, "nuc");
    let two =
        vals(&ops::linalg_matrix_norm(&t, MatrixNormOrd::P(2.0), [-2, -1], true, None).unwrap());
    assert_close(&two, &[s[0]], 1e-12, "2");
    let one =
        vals(&ops::linalg_matrix_norm(&t, MatrixNormOrd::P(1.0), [-2, -1], false, None).unwrap());
    let col_max = (0..4)
        .map(|j| (0..3).map(|i| a[i * 4 + j].abs()).sum::<f64>())
        .fold(0.0, f64::max);
    assert_close(&one, &[col_max], 1e-12, "1");
    let inf = vals(
        &ops::linalg_matrix_norm(&t, MatrixNormOrd::P(f64::INFINITY), [-2, -1], false, None)
            .unwrap(),
    );
    let row_max = (0..3)
        .map(|i| (0..4).map(|j| a[i * 4 + j].abs()).sum::<f64>())
        .fold(0.0, f64::max);
    assert_close(&inf, &[row_max], 1e-12, "inf");
    check_grads(
        &|x| ops::linalg_matrix_norm(x, MatrixNormOrd::Nuc, [-2, -1], false, None),
        &a,
        &[3, 4],
        &random_dirs(12, 2, 21),
        true,
    );
    // cond
    let c = vals(&ops::linalg_cond(&t, None).unwrap());
    assert_close(&c, &[s[0] / s[2]], 1e-10, "cond");
    let sq = Tensor::from_vec(well_conditioned(3, 1, 92), [3, 3]).unwrap();
    let c1 = vals(&ops::linalg_cond(&sq, Some(MatrixNormOrd::Fro)).unwrap());
    let inv = ops::linalg_inv(&sq).unwrap();
    let f = |x: &Tensor| vals(x).iter().map(|v| v * v).sum::<f64>().sqrt();
    assert_close(&c1, &[f(&sq) * f(&inv)], 1e-10, "cond fro");
    let sing = Tensor::from_vec(vec![1.0, 2.0, 2.0, 4.0], [2, 2]).unwrap();
    assert_eq!(
        vals(&ops::linalg_cond(&sing, Some(MatrixNormOrd::P(1.0))).unwrap()),
        vec![f64::INFINITY]
    );
    // rank
    let r = ops::linalg_matrix_rank(&sing, None, None, false).unwrap();
    assert_eq!(r.dtype(), DType::I64);
    assert_eq!(r.data().to_vec_as::<i64>(), vec![1]);
    assert_eq!(
        ops::linalg_matrix_rank(&t, None, None, false)
            .unwrap()
            .data()
            .to_vec_as::<i64>(),
        vec![3]
    );
    assert_eq!(
        ops::linalg_matrix_rank(&sing, None, None, true)
            .unwrap()
            .data()
            .to_vec_as::<i64>(),
        vec![1]
    );
    assert_eq!(
        ops::linalg_matrix_rank(&t, Some(1e9), None, false)
            .unwrap()
            .data()
            .to_vec_as::<i64>(),
        vec![0]
    );
    // A zero atol keeps the default rtol; rtol = 0 counts every nonzero singular value.
    let tiny = Tensor::from_vec(vec![1.0, 0.0, 0.0, 1e-20], [2, 2]).unwrap();
    let rank = |atol, rtol| {
        ops::linalg_matrix_rank(&tiny, atol, rtol, false)
            .unwrap()
            .data()
            .to_vec_as::<i64>()
    };
    assert_eq!(rank(Some(0.0), None), vec![1]);
    assert_eq!(rank(None, Some(0.0)), vec![2]);
    assert_eq!(rank(Some(0.5), None), vec![1]);
    // tensorinv / tensorsolve
    let a4 = Tensor::from_vec(well_conditioned(6, 1, 93), [6, 6])
        .unwrap()
        .reshape([2, 3, 6])
        .unwrap();
    let ainv = ops::linalg_tensorinv(&a4, 2).unwrap();
    assert_eq!(ainv.dims(), &[6, 2, 3]);
    let prod = ops::matmul(&a4.reshape([6, 6]).unwrap(), &ainv.reshape([6, 6]).unwrap()).unwrap();
    assert_close(&vals(&prod), &eye_vals(6), 1e-10, "tensorinv");
    let a3 = Tensor::from_vec(well_conditioned(6, 1, 94), [6, 6])
        .unwrap()
        .reshape([2, 3, 2, 3])
        .unwrap();
    let b = Tensor::from_vec(randn(&[2, 3], 95), [2, 3]).unwrap();
    let x = ops::linalg_tensorsolve(&a3, &b, None).unwrap();
    assert_eq!(x.dims(), &[2, 3]);
    let ax = ops::matmul(&a3.reshape([6, 6]).unwrap(), &x.reshape([6, 1]).unwrap()).unwrap();
    assert_close(&vals(&ax), &vals(&b), 1e-10, "tensorsolve");
}

#[test]
fn lstsq_solves_the_normal_equations() {
    let (m, n) = (5, 3);
    let a = randn(&[m, n], 101);
    let b = randn(&[m, 2], 102);
    let at = Tensor::from_vec(a.clone(), [m, n]).unwrap();
    let bt = Tensor::from_vec(b.clone(), [m, 2]).unwrap();
    for driver in [None, Some("gelsd"), Some("gels")] {
        let out = ops::linalg_lstsq(&at, &bt, None, driver).unwrap();
        let x = vals(&out[0]);
        // Aᵀ (A X - B) = 0.
        let mut atr = vec![0.0; n * m];
        for i in 0..m {
            for j in 0..n {
                atr[j * m + i] = a[i * n + j];
            }
        }
        let ax = matmul_vals(&a, &x, m, n, 2);
        let r: Vec<f64> = ax.iter().zip(&b).map(|(p, q)| p - q).collect();
        assert_close(
            &matmul_vals(&atr, &r, n, m, 2),
            &[0.0; 6],
            1e-10,
            "normal equations",
        );
        match driver {
            None => {
                assert_eq!(out[1].elem_count(), 0);
                assert_eq!(out[2].data().to_vec_as::<i64>(), vec![3]);
                assert_eq!(out[3].elem_count(), 0);
            }
            Some("gelsd") => {
                let res: Vec<f64> = (0..2)
                    .map(|c| (0..m).map(|i| r[i * 2 + c].powi(2)).sum())
                    .collect();
                assert_close(&vals(&out[1]), &res, 1e-10, "residuals");
                assert_eq!(out[3].elem_count(), 3);
            }
            _ => assert_eq!(out[2].elem_count(), 0),
        }
    }
    let bt2 = bt.clone();
    check_grads(
        &move |x| Ok(ops::linalg_lstsq(x, &bt2, None, None)?[0].clone()),
        &a,
        &[m, n],
        &random_dirs(15, 2, 22),
        true,
    );
}

// ----- quantiles and fake quantization ----------------------------------------------------------

fn reference_quantile(row: &[f64], q: f64, interp: &str, ignore_nan: bool) -> f64 {
    let mut v: Vec<f64> = row.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.len() < row.len() && !ignore_nan || v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = q * (v.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    match interp {
        "linear" => v[lo] + (rank - lo as f64) * (v[hi] - v[lo]),
        "lower" => v[lo],
        "higher" => v[hi],
        "midpoint" => 0.5 * (v[lo] + v[hi]),
        _ => v[rank.round_ties_even() as usize],
    }
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(24))]

    #[test]
    fn quantile_matches_sorting(rows in 1usize..4, n in 1usize..9, q in 0.0f64..=1.0, seed in 0u64..1000, nan_at in proptest::option::of(0usize..8)) {
        let mut x = randn(&[rows, n], seed);
        if let Some(p) = nan_at { if p < x.len() { x[p] = f64::NAN; } }
        let t = Tensor::from_vec(x.clone(), [rows, n]).unwrap();
        for interp in ["linear", "lower", "higher", "midpoint", "nearest"] {
            for ignore_nan in [false, true] {
                let got = if ignore_nan {
                    ops::nanquantile(&t, QuantileQ::Scalar(q), Some(1), false, interp)
                } else {
                    ops::quantile(&t, QuantileQ::Scalar(q), Some(1), false, interp)
                }
                .unwrap();
                prop_assert_eq!(got.dims(), &[rows]);
                for r in 0..rows {
                    let want = reference_quantile(&x[r * n..(r + 1) * n], q, interp, ignore_nan);
                    let g = vals(&got)[r];
                    prop_assert!(g == want || (g.is_nan() && want.is_nan()) || (g - want).abs() < 1e-12, "{} {} {}", interp, g, want);
                }
            }
        }
    }
}

#[test]
fn quantile_shapes_and_gradients() {
    let x = randn(&[3, 5], 111);
    let t = Tensor::from_vec(x.clone(), [3, 5]).unwrap();
    let qt = Tensor::from_vec(vec![0.1, 0.5, 0.9], [3]).unwrap();
    assert_eq!(
        ops::quantile(&t, QuantileQ::Tensor(&qt), Some(0), true, "linear")
            .unwrap()
            .dims(),
        &[3, 1, 5]
    );
    assert_eq!(
        ops::quantile(&t, QuantileQ::Tensor(&qt), None, false, "linear")
            .unwrap()
            .dims(),
        &[3]
    );
    assert_eq!(
        ops::quantile(&t, QuantileQ::Scalar(0.5), None, true, "linear")
            .unwrap()
            .dims(),
        &[1, 1]
    );
    assert!(ops::quantile(&t, QuantileQ::Scalar(1.5), None, false, "linear").is_err());
    assert!(ops::quantile(&t, QuantileQ::Scalar(0.5), None, false, "cubic").is_err());
    check_grads(
        &|x| ops::quantile(x, QuantileQ::Scalar(0.3), Some(1), false, "linear"),
        &x,
        &[3, 5],
        &random_dirs(15, 3, 23),
        false,
    );
    let qt2 = qt.clone();
    check_grads(
        &move |x| ops::nanquantile(x, QuantileQ::Tensor(&qt2), Some(0), false, "midpoint"),
        &x,
        &[3, 5],
        &random_dirs(15, 3, 24),
        false,
    );
}

#[test]
fn fake_quantize_values_and_straight_through_gradient() {
    let xv = vec![-1.0f32, -0.26, 0.0, 0.1, 0.25, 0.3, 0.75, 2.0];
    let x = Tensor::from_vec(xv.clone(), [8]).unwrap();
    x.requires_grad_(true).unwrap();
    let (scale, zp, qmin, qmax) = (0.1, 2i64, 0i64, 10i64);
    let y = ops::fake_quantize_per_tensor_affine(&x, scale, zp, qmin, qmax).unwrap();
    let inv = 1.0f32 / scale as f32;
    let want: Vec<f64> = xv
        .iter()
        .map(|&v| {
            let q = (zp as f32 + (v * inv).round_ties_even()).clamp(qmin as f32, qmax as f32);
            ((q - zp as f32) * scale as f32) as f64
        })
        .collect();
    assert_eq!(vals(&y), want);
    ops::sum_all(&y).unwrap().backward().unwrap();
    let g = vals(&x.grad().unwrap());
    let mask: Vec<f64> = xv
        .iter()
        .map(|&v| {
            let q = zp as f32 + (v * inv).round_ties_even();
            if q >= qmin as f32 && q <= qmax as f32 {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(g, mask);
    assert!(ops::fake_quantize_per_tensor_affine(&x, 0.1, 20, 0, 10).is_err());
}

#[test]
fn householder_representation_round_trips() {
    for (m, n) in [(4, 3), (3, 3), (3, 4)] {
        let a = randn(&[m, n], 121 + m as u64 * 7 + n as u64);
        let t = Tensor::from_vec(a.clone(), [m, n]).unwrap();
        let (qr, tau) = ops::geqrf(&t).unwrap();
        let k = m.min(n);
        assert_eq!(tau.dims(), &[k]);
        // Q from the reflectors (first k columns), R from the upper triangle.
        let qa = ops::narrow(&qr, -1, 0, k).unwrap();
        let qa = if m < k {
            qa
        } else {
            ops::narrow(&qa, -2, 0, m).unwrap()
        };
        let q = ops::linalg_householder_product(&qa, &tau).unwrap();
        assert_eq!(q.dims(), &[m, k]);
        let qrv = vals(&qr);
        let mut r = vec![0.0; k * n];
        for i in 0..k {
            for j in i..n {
                r[i * n + j] = qrv[i * n + j];
            }
        }
        assert_close(&matmul_vals(&vals(&q), &r, m, k, n), &a, 1e-10, "geqrf Q R");
        // The same R as linalg.qr (LAPACK's sign convention in both).
        let (_, r2) = ops::linalg_qr(&t, QrMode::Reduced).unwrap();
        assert_close(&r, &vals(&r2), 1e-10, "R");
        assert_close(
            &vals(&ops::orgqr(&qa, &tau).unwrap()),
            &vals(&q),
            1e-12,
            "orgqr",
        );
        // ormqr against explicit products with the full Q.
        let qfull = {
            let (qf, _) = ops::linalg_qr(&t, QrMode::Complete).unwrap();
            vals(&qf)
        };
        let c = randn(&[m, 2], 5);
        let ct = Tensor::from_vec(c.clone(), [m, 2]).unwrap();
        let qc = vals(&ops::ormqr(&qa, &tau, &ct, true, false).unwrap());
        assert_close(&qc, &matmul_vals(&qfull, &c, m, m, 2), 1e-10, "Q C");
        let mut qt = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                qt[j * m + i] = qfull[i * m + j];
            }
        }
        let qtc = vals(&ops::ormqr(&qa, &tau, &ct, true, true).unwrap());
        assert_close(&qtc, &matmul_vals(&qt, &c, m, m, 2), 1e-10, "Qt C");
        let d = randn(&[2, m], 6);
        let dt = Tensor::from_vec(d.clone(), [2, m]).unwrap();
        let dq = vals(&ops::ormqr(&qa, &tau, &dt, false, false).unwrap());
        assert_close(&dq, &matmul_vals(&d, &qfull, 2, m, m), 1e-10, "C Q");
        let dqt = vals(&ops::ormqr(&qa, &tau, &dt, false, true).unwrap());
        assert_close(&dqt, &matmul_vals(&d, &qt, 2, m, m), 1e-10, "C Qt");
    }
    // Gradients of the product of reflectors, first and second order.
    let (m, n) = (4, 3);
    let a = randn(&[m, n], 131);
    let tau = Tensor::from_vec(vec![1.2, 0.7, 1.5], [3]).unwrap();
    check_grads(
        &move |x| ops::linalg_householder_product(x, &tau),
        &a,
        &[m, n],
        &random_dirs(12, 3, 25),
        true,
    );
}

/// `torch.lstsq` (LAPACK `gels`): for a tall `A`, the first `n` rows solve the
/// least-squares problem (as `linalg_lstsq`), the rest carry the residual (their squared
/// norm is `|A x - b|²`) and `QR` is `geqrf`'s; for a wide `A`, the minimum-norm solution
/// (as `pinverse(A) b`) and `QR` is the transposed `geqrf(Aᵀ)`.
#[test]
fn lstsq_is_lapack_gels() {
    let t = |v: Vec<f64>, s: &[usize]| Tensor::from_vec(v, s.to_vec()).unwrap();
    for (m, n, k) in [(6usize, 3usize, 2usize), (5, 5, 1), (3, 6, 2)] {
        let a = t(randn(&[m, n], 40 + m as u64), &[m, n]);
        let b = t(randn(&[m, k], 50 + n as u64), &[m, k]);
        let (sol, qr) = ops::lstsq(&b, &a).unwrap();
        let want = ops::linalg_lstsq(&a, &b, None, Some("gelsd")).unwrap();
        let x = ops::narrow(&sol, 0, 0, n).unwrap();
        assert_close(&vals(&x), &vals(&want[0]), 1e-10, "solution");
        if m >= n {
            assert_eq!(sol.dims(), [m, k]);
            assert_eq!(vals(&qr), vals(&ops::geqrf(&a).unwrap().0), "QR is geqrf's");
            let r = ops::sub(&ops::matmul(&a, &x).unwrap(), &b).unwrap();
            for c in 0..k {
                let col = |t: &Tensor| vals(&ops::narrow(t, 1, c, 1).unwrap());
                let want: f64 = col(&r).iter().map(|v| v * v).sum();
                let tail = ops::narrow(&sol, 0, n, m - n).unwrap();
                let got: f64 = col(&tail).iter().map(|v| v * v).sum();
                assert!(
                    (got - want).abs() <= 1e-10 * (1.0 + want),
                    "residual {got} {want}"
                );
            }
        } else {
            assert_eq!(sol.dims(), [n, k]);
            let at = ops::transpose(&a, 0, 1).unwrap();
            let packed = ops::transpose(&ops::geqrf(&at).unwrap().0, 0, 1).unwrap();
            assert_eq!(vals(&qr), vals(&packed), "QR is the packed LQ");
        }
    }
    let v = t(vec![1.0, 2.0, 3.0], &[3]);
    let a = t(randn(&[3, 2], 7), &[3, 2]);
    assert_eq!(ops::lstsq(&v, &a).unwrap().0.dims(), [3, 1]);
    assert!(ops::lstsq(&v, &t(vec![1.0; 3], &[3])).is_err());
    assert!(ops::lstsq(&t(vec![1.0; 2], &[2]), &a).is_err());
}
