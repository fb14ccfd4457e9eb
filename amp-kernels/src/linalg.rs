//! Dense linear algebra on batches of matrices (`[..., m, n]`), computed by `faer`:
//! LU (inverse, solve, the packed LAPACK-style factorisation with 1-based pivots),
//! Cholesky, triangular solves, the symmetric eigendecomposition, the SVD and QR.
//!
//! float32 and float64 compute in their own type; float16 and bfloat16 are rejected with
//! [`Error::UnsupportedDType`], as PyTorch's CPU linear algebra rejects them (under CPU
//! autocast these ops are on the float32 list, so they see float32). Batches run in
//! parallel over the matrices ([`amp_tensor::parallel`]) when the work is large.

use crate::compute::Real;
use amp_tensor::pool::{try_collect, try_with_capacity, try_zeroed};
use amp_tensor::{ensure, DType, Element, Error, Result, Tensor};
use faer::linalg::solvers::{DenseSolveCore, Solve};
use faer::{Mat, MatRef, Side};

/// Batches whose total work (matrices × n³) is below this run on the calling thread.
const PARALLEL_WORK: usize = 64 * 64 * 64;

/// The element types the factorisations compute in (f32, f64): the kernels' compute
/// type that `faer` also factorises.
pub trait LaReal: Real + faer::traits::RealField + Copy {}
impl<T: Real + faer::traits::RealField + Copy> LaReal for T {}

/// Bind `$C` to the compute type of a float32 / float64 `$dtype`, or fail naming `$op`.
macro_rules! la_kernel {
    ($dtype:expr, $op:expr, |$C:ident| $body:expr) => {
        amp_tensor::bind_dtypes!($dtype, $body, [F32 => {$C = f32} F64 => {$C = f64}],
            _ => return Err(Error::UnsupportedDType { op: $op, dtype: $dtype }))
    };
}

/// A batch of row-major matrices read from a tensor `[..., m, n]`.
struct Batch<C> {
    data: Vec<C>,
    batch: Vec<usize>,
    m: usize,
    n: usize,
}

impl<C: LaReal> Batch<C> {
    fn of(op: &'static str, t: &Tensor) -> Result<Self> {
        ensure!(
            t.rank() >= 2,
            invalid(
                op,
                "The input tensor A must have at least 2 dimensions. Got {} dimensions",
                t.rank()
            )
        );
        let r = t.rank();
        let (m, n) = (t.dims()[r - 2], t.dims()[r - 1]);
        Ok(Batch {
            data: t.try_contiguous()?.host_vec::<C>()?,
            batch: t.dims()[..r - 2].to_vec(),
            m,
            n,
        })
    }

    fn count(&self) -> usize {
        self.batch.iter().product()
    }

    fn mat(&self, i: usize) -> MatRef<'_, C> {
        let s = self.m * self.n;
        MatRef::from_row_major_slice(&self.data[i * s..(i + 1) * s], self.m, self.n)
    }

    fn square(&self, op: &'static str) -> Result<()> {
        ensure!(
            self.m == self.n,
            invalid(
                op,
                "A must be batches of square matrices, but they are {} by {} matrices",
                self.m,
                self.n
            )
        );
        Ok(())
    }

    /// The square `A` and the right-hand sides `B` of `A X = B`: one batch shape, as
    /// many rows in `B` as `A` has columns.
    fn system(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(Self, Self)> {
        let ab = Batch::of(op, a)?;
        ab.square(op)?;
        let bb = Batch::of(op, b)?;
        ensure!(
            ab.batch == bb.batch && bb.m == ab.n,
            invalid(
                op,
                "Incompatible shapes of A and B for the equation AX = B ({:?} and {:?})",
                a.dims(),
                b.dims()
            )
        );
        Ok((ab, bb))
    }
}

/// Fail unless `a` and `b` have one dtype.
fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() == b.dtype() {
        return Ok(());
    }
    Err(Error::DTypeMismatch {
        op,
        expected: a.dtype(),
        got: b.dtype(),
    })
}

/// Runs `f` for every matrix index, in parallel when `count * work` is large
/// ([`Error::OutOfMemory`] when the results cannot be allocated).
fn per_matrix<R: Send>(
    count: usize,
    work: usize,
    f: impl Fn(usize) -> R + Sync + Send,
) -> Result<Vec<R>> {
    let mut out = try_with_capacity(count)?;
    // faer's kernels leave the upper register halves dirty (see `faer_seq` in the
    // matmul module): each thread clears them after its matrix.
    let f = |i| {
        let r = f(i);
        crate::matmul::clear_upper_registers();
        r
    };
    if count > 1 && count.saturating_mul(work) >= PARALLEL_WORK {
        out.extend(amp_tensor::parallel::map(count, &f));
    } else {
        out.extend((0..count).map(f));
    }
    Ok(out)
}

/// The pairs of `v` as two vectors, or [`Error::OutOfMemory`].
fn try_unzip<A, B>(v: Vec<(A, B)>) -> Result<(Vec<A>, Vec<B>)> {
    let mut out = (try_with_capacity(v.len())?, try_with_capacity(v.len())?);
    out.extend(v);
    Ok(out)
}

/// Appends `mat` to `out` in row-major order.
fn push_mat<C: LaReal>(out: &mut Vec<C>, mat: MatRef<'_, C>) {
    for i in 0..mat.nrows() {
        for j in 0..mat.ncols() {
            out.push(mat[(i, j)]);
        }
    }
}

fn row_major<C: LaReal>(mat: MatRef<'_, C>) -> Vec<C> {
    let mut v = Vec::with_capacity(mat.nrows() * mat.ncols());
    push_mat(&mut v, mat);
    v
}

/// A tensor `[batch..., tail...]` from per-matrix row-major pieces
/// ([`Error::OutOfMemory`] when it cannot be allocated).
fn assemble<C: LaReal>(pieces: Vec<Vec<C>>, batch: &[usize], tail: &[usize]) -> Result<Tensor> {
    let mut dims = batch.to_vec();
    dims.extend_from_slice(tail);
    let mut data: Vec<C> = try_with_capacity(pieces.iter().map(Vec::len).sum())?;
    for p in &pieces {
        data.extend_from_slice(p);
    }
    Tensor::from_vec(data, dims)
}

fn info_tensor(info: Vec<i32>, batch: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(info, batch.to_vec())
}

fn work(m: usize, n: usize) -> usize {
    m.max(1) * n.max(1) * m.min(n).max(1)
}

/// LAPACK's `info` of an LU factorisation: the 1-based index of the first exactly zero
/// pivot of `U`, or 0.
fn lu_info<C: LaReal>(u: MatRef<'_, C>) -> i32 {
    let k = u.nrows().min(u.ncols());
    (0..k)
        .find(|&i| u[(i, i)] == C::from_f64c(0.0))
        .map_or(0, |i| i as i32 + 1)
}

/// The inverse of each square matrix and LAPACK's `info` (`int32`, batch shape): nonzero
/// where the matrix is singular (its inverse is then not finite).
pub fn linalg_inv_ex(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.inv";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        b.square(OP)?;
        let n = b.n;
        let res = per_matrix(b.count(), work(n, n), |i| {
            let lu = b.mat(i).partial_piv_lu();
            (row_major(lu.inverse().as_ref()), lu_info(lu.U()))
        })?;
        let (inv, info) = try_unzip(res)?;
        Ok((
            assemble(inv, &b.batch, &[n, n])?,
            info_tensor(info, &b.batch)?,
        ))
    })
}

/// The solution `X` of `A X = B` for square `A` `[..., n, n]` and `B` `[..., n, k]` with
/// the same batch shape, and LAPACK's `info` of the LU factorisation of `A`.
pub fn linalg_solve_ex(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.solve";
    same_dtype(OP, a, b)?;
    la_kernel!(a.dtype(), OP, |C| {
        let (ab, bb) = Batch::<C>::system(OP, a, b)?;
        let (n, k) = (ab.n, bb.n);
        let res = per_matrix(ab.count(), work(n, n) + n * n * k, |i| {
            let lu = ab.mat(i).partial_piv_lu();
            let mut x = bb.mat(i).to_owned();
            lu.solve_in_place(x.as_mut());
            (row_major(x.as_ref()), lu_info(lu.U()))
        })?;
        let (x, info) = try_unzip(res)?;
        Ok((
            assemble(x, &ab.batch, &[n, k])?,
            info_tensor(info, &ab.batch)?,
        ))
    })
}

/// The solution `X` of `A X = B` for triangular `A` `[..., n, n]` (only its `upper` or
/// lower triangle is read; with `unitriangular` its diagonal is taken as ones) and `B`
/// `[..., n, k]` with the same batch shape.
pub fn linalg_solve_triangular(
    a: &Tensor,
    b: &Tensor,
    upper: bool,
    unitriangular: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.solve_triangular";
    same_dtype(OP, a, b)?;
    la_kernel!(a.dtype(), OP, |C| {
        let (ab, bb) = Batch::<C>::system(OP, a, b)?;
        let (n, k) = (ab.n, bb.n);
        let res = per_matrix(ab.count(), n * n * k, |i| {
            let t = ab.mat(i);
            let mut x = bb.mat(i).to_owned();
            match (upper, unitriangular) {
                (true, false) => t.solve_upper_triangular_in_place(x.as_mut()),
                (true, true) => t.solve_unit_upper_triangular_in_place(x.as_mut()),
                (false, false) => t.solve_lower_triangular_in_place(x.as_mut()),
                (false, true) => t.solve_unit_lower_triangular_in_place(x.as_mut()),
            }
            row_major(x.as_ref())
        })?;
        assemble(res, &ab.batch, &[n, k])
    })
}

/// The lower Cholesky factor `L` (`A = L Lᵀ`) of each matrix, reading only the lower
/// triangle, and LAPACK's `info` (`int32`): the order of the first leading minor that is
/// not positive-definite, or 0. Where `info > 0` the factor is not meaningful (NaN).
pub fn linalg_cholesky_ex(a: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.cholesky";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        b.square(OP)?;
        let n = b.n;
        let res = per_matrix(b.count(), work(n, n), |i| match b.mat(i).llt(Side::Lower) {
            Ok(llt) => {
                let l = llt.L();
                let mut v = row_major(l);
                // Only the lower triangle is the factor.
                for r in 0..n {
                    for c in r + 1..n {
                        v[r * n + c] = C::from_f64c(0.0);
                    }
                }
                (v, 0)
            }
            Err(faer::linalg::cholesky::llt::factor::LltError::NonPositivePivot { index }) => {
                (vec![C::from_f64c(f64::NAN); n * n], index as i32 + 1)
            }
        })?;
        let (l, info) = try_unzip(res)?;
        Ok((
            assemble(l, &b.batch, &[n, n])?,
            info_tensor(info, &b.batch)?,
        ))
    })
}

/// Eigenvalues (ascending, `[..., n]`) and, with `vectors`, orthonormal eigenvectors
/// (columns, `[..., n, n]`) of symmetric matrices, reading only the lower triangle
/// (`upper`: the upper one).
pub fn linalg_eigh(a: &Tensor, upper: bool, vectors: bool) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "linalg.eigh";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        b.square(OP)?;
        let n = b.n;
        let side = if upper { Side::Upper } else { Side::Lower };
        let res = per_matrix(b.count(), work(n, n), |i| -> Result<(Vec<C>, Vec<C>)> {
            let fail = |_| Error::invalid(OP, "the algorithm failed to converge");
            if vectors {
                let e = b.mat(i).self_adjoint_eigen(side).map_err(fail)?;
                let w: Vec<C> = e.S().column_vector().iter().copied().collect();
                Ok((w, row_major(e.U())))
            } else {
                let w = b.mat(i).self_adjoint_eigenvalues(side).map_err(fail)?;
                Ok((w, Vec::new()))
            }
        })?;
        let (mut w, mut v) = (try_with_capacity(res.len())?, try_with_capacity(res.len())?);
        for r in res {
            let (a, b) = r?;
            w.push(a);
            v.push(b);
        }
        let w = assemble(w, &b.batch, &[n])?;
        let v = if vectors {
            Some(assemble(v, &b.batch, &[n, n])?)
        } else {
            None
        };
        Ok((w, v))
    })
}

/// The SVD `A = U diag(S) Vh`: singular values descending (`[..., k]`, `k = min(m, n)`)
/// and, with `compute_uv`, `U` (`[..., m, k]`, or `[..., m, m]` with `full_matrices`)
/// and `Vh` (`[..., k, n]`, or `[..., n, n]`).
pub fn linalg_svd(
    a: &Tensor,
    full_matrices: bool,
    compute_uv: bool,
) -> Result<(Option<Tensor>, Tensor, Option<Tensor>)> {
    const OP: &str = "linalg.svd";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        let (m, n) = (b.m, b.n);
        let k = m.min(n);
        type Parts<C> = (Vec<C>, Vec<C>, Vec<C>);
        let res = per_matrix(b.count(), work(m, n), |i| -> Result<Parts<C>> {
            let fail = |_| Error::invalid(OP, "the algorithm failed to converge");
            let x = b.mat(i);
            if !compute_uv {
                return Ok((Vec::new(), x.singular_values().map_err(fail)?, Vec::new()));
            }
            let svd = if full_matrices { x.svd() } else { x.thin_svd() }.map_err(fail)?;
            let s: Vec<C> = svd.S().column_vector().iter().copied().collect();
            Ok((row_major(svd.U()), s, row_major(svd.V().transpose())))
        })?;
        let mut us = try_with_capacity(res.len())?;
        let mut ss = try_with_capacity(res.len())?;
        let mut vs = try_with_capacity(res.len())?;
        for r in res {
            let (u, s, v) = r?;
            us.push(u);
            ss.push(s);
            vs.push(v);
        }
        let s = assemble(ss, &b.batch, &[k])?;
        if !compute_uv {
            return Ok((None, s, None));
        }
        let (uc, vr) = if full_matrices { (m, n) } else { (k, k) };
        Ok((
            Some(assemble(us, &b.batch, &[m, uc])?),
            s,
            Some(assemble(vs, &b.batch, &[vr, n])?),
        ))
    })
}

/// The QR decomposition by Householder reflections: `complete` gives `Q` `[..., m, m]`
/// and `R` `[..., m, n]`, otherwise `Q` `[..., m, k]` and `R` `[..., k, n]`.
pub fn linalg_qr(a: &Tensor, complete: bool) -> Result<(Tensor, Tensor)> {
    const OP: &str = "linalg.qr";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        let (m, n) = (b.m, b.n);
        let k = m.min(n);
        let res = per_matrix(b.count(), work(m, n), |i| {
            let qr = b.mat(i).qr();
            if complete {
                let mut r = Mat::<C>::zeros(m, n);
                let tr = qr.thin_R();
                for p in 0..tr.nrows() {
                    for c in p..n {
                        r[(p, c)] = tr[(p, c)];
                    }
                }
                (row_major(qr.compute_Q().as_ref()), row_major(r.as_ref()))
            } else {
                let mut r = row_major(qr.thin_R());
                for p in 0..k {
                    for c in 0..p.min(n) {
                        r[p * n + c] = C::from_f64c(0.0);
                    }
                }
                (row_major(qr.compute_thin_Q().as_ref()), r)
            }
        })?;
        let (q, r) = try_unzip(res)?;
        let (qc, rr) = if complete { (m, m) } else { (k, k) };
        Ok((
            assemble(q, &b.batch, &[m, qc])?,
            assemble(r, &b.batch, &[rr, n])?,
        ))
    })
}

/// The LU factorisation with partial pivoting in LAPACK's packed form (`getrf`): `LU`
/// `[..., m, n]` (unit lower `L` below the diagonal, `U` on and above), the 1-based row
/// interchanges `pivots` (`int32`, `[..., k]`) and `info` (`int32`, the first exactly
/// zero pivot, 1-based, or 0). `A = P L U` with `P` from [`lu_pivots_to_permutation`].
pub fn linalg_lu_factor_ex(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "linalg.lu_factor";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        let (m, n) = (b.m, b.n);
        let k = m.min(n);
        let res = per_matrix(b.count(), work(m, n), |i| {
            let lu = b.mat(i).partial_piv_lu();
            let (l, u) = (lu.L(), lu.U());
            let mut packed = vec![C::from_f64c(0.0); m * n];
            for r in 0..m {
                for c in 0..n {
                    packed[r * n + c] = if r > c { l[(r, c)] } else { u[(r, c)] };
                }
            }
            // Row `r` of L U is row `fwd[r]` of A; turn the permutation into the
            // sequence of interchanges LAPACK reports.
            let (fwd, _) = lu.P().arrays();
            let mut cur: Vec<usize> = (0..m).collect();
            let mut pos: Vec<usize> = (0..m).collect();
            let mut piv = Vec::with_capacity(k);
            for r in 0..k {
                let j = pos[fwd[r]];
                let (a_, b_) = (cur[r], cur[j]);
                cur.swap(r, j);
                pos[a_] = j;
                pos[b_] = r;
                piv.push(j as i32 + 1);
            }
            (packed, piv, lu_info(u))
        })?;
        let mut lus = try_with_capacity(res.len())?;
        let mut pivs: Vec<i32> = try_with_capacity(res.len().saturating_mul(k))?;
        let mut infos = try_with_capacity(res.len())?;
        for (lu, p, info) in res {
            lus.push(lu);
            pivs.extend_from_slice(&p);
            infos.push(info);
        }
        Ok((
            assemble(lus, &b.batch, &[m, n])?,
            Tensor::from_vec(pivs, {
                let mut d = b.batch.clone();
                d.push(k);
                d
            })?,
            info_tensor(infos, &b.batch)?,
        ))
    })
}

/// The permutation matrices `P` (`[..., m, m]`, of `dtype`) of LAPACK row interchanges
/// `pivots` (1-based, `[..., k]`), so that `A = P L U`.
pub fn lu_pivots_to_permutation(pivots: &Tensor, m: usize, dtype: DType) -> Result<Tensor> {
    const OP: &str = "lu_unpack";
    ensure!(
        !(pivots.dtype().is_floating_point() || pivots.rank() < 1),
        invalid(OP, "pivots must be an integer tensor of rank >= 1")
    );
    let r = pivots.rank();
    let k = pivots.dims()[r - 1];
    let batch = pivots.dims()[..r - 1].to_vec();
    let count: usize = batch.iter().product();
    let piv = pivots.try_contiguous()?.host_vec_as::<i64>()?;
    let mut out = try_zeroed::<f64>(count.saturating_mul(m).saturating_mul(m))?;
    for bi in 0..count {
        let mut perm: Vec<usize> = try_collect(m, 0..m)?;
        for i in 0..k {
            let p = piv[bi * k + i];
            ensure!(
                !(p < 1 || p as usize > m),
                invalid(OP, "pivot {p} is out of range [1, {m}]")
            );
            perm.swap(i, p as usize - 1);
        }
        // (Pᵀ A)[i] = A[perm[i]], so P[perm[i], i] = 1.
        for (i, &p) in perm.iter().enumerate() {
            out[bi * m * m + p * m + i] = 1.0;
        }
    }
    let mut dims = batch;
    dims.extend([m, m]);
    Tensor::from_vec(out, dims)?.to_dtype(dtype)
}

/// Numerical rank: the number of singular values (or, `hermitian`, absolute
/// eigenvalues) above `max(atol, rtol * largest)`; `rtol = None` is
/// `eps(dtype) * max(m, n)` when `atol` is `None` too, else 0. `int64`, batch shape.
pub fn linalg_matrix_rank(
    a: &Tensor,
    atol: Option<f64>,
    rtol: Option<f64>,
    hermitian: bool,
) -> Result<Tensor> {
    const OP: &str = "linalg.matrix_rank";
    let r = a.rank();
    ensure!(
        r >= 2,
        invalid(OP, "The input tensor A must have at least 2 dimensions.")
    );
    let (m, n) = (a.dims()[r - 2], a.dims()[r - 1]);
    let s = if hermitian {
        let (w, _) = linalg_eigh(a, false, false)?;
        let mut w = w.host_vec_as::<f64>()?;
        w.iter_mut().for_each(|x| *x = x.abs());
        w
    } else {
        linalg_svd(a, false, false)?.1.host_vec_as::<f64>()?
    };
    let eps = match a.dtype() {
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    };
    let rtol = rtol.unwrap_or(if atol.is_none() {
        eps * m.max(n) as f64
    } else {
        0.0
    });
    let atol = atol.unwrap_or(0.0);
    let k = m.min(n);
    let batch = a.dims()[..r - 2].to_vec();
    let ranks: Vec<i64> = match s.len().checked_div(k) {
        None => try_zeroed(batch.iter().fold(1usize, |a, &d| a.saturating_mul(d)))?,
        Some(count) => try_collect(
            count,
            s.chunks(k).map(|sv| {
                let big = sv.iter().copied().fold(0.0f64, f64::max);
                let tol = atol.max(rtol * big);
                sv.iter().filter(|&&x| x > tol).count() as i64
            }),
        )?,
    };
    Tensor::from_vec(ranks, batch)
}

/// LAPACK's `geqrf`: the QR factorisation by Householder reflections in packed form:
/// `R` on and above the diagonal, the essential parts of the reflectors `v_i` (with an
/// implicit leading 1) below it, and `tau` (`[..., k]`) with `H_i = I - tau_i v_i v_iᵀ`
/// and `Q = H_1 ⋯ H_k` (LAPACK's sign convention: `beta = -sign(alpha) ‖x‖`).
pub fn geqrf(a: &Tensor) -> Result<(Tensor, Tensor)> {
    use faer::dyn_stack::{MemBuffer, MemStack};
    use faer::linalg::qr::no_pivoting::factor::{qr_in_place, qr_in_place_scratch};
    const OP: &str = "geqrf";
    la_kernel!(a.dtype(), OP, |C| {
        let b = Batch::<C>::of(OP, a)?;
        let (m, n) = (b.m, b.n);
        let k = m.min(n);
        let res = per_matrix(b.count(), work(m, n), |i| {
            let mut qr = b.mat(i).to_owned();
            if k == 0 {
                return (row_major(qr.as_ref()), Vec::new());
            }
            // Block size 1: each block factor is the reflector's own (faer) tau, with
            // H = I - v vᵀ / tau; LAPACK's tau is its reciprocal (0 for no reflection).
            let mut coeff = Mat::<C>::zeros(1, k);
            let par = faer::Par::Seq;
            let mut mem =
                MemBuffer::new(qr_in_place_scratch::<C>(m, n, 1, par, Default::default()));
            qr_in_place(
                qr.as_mut(),
                coeff.as_mut(),
                par,
                MemStack::new(&mut mem),
                Default::default(),
            );
            let tau: Vec<C> = (0..k)
                .map(|j| {
                    let t = 1.0 / Element::to_f64(coeff[(0, j)]);
                    C::from_f64c(if t.is_finite() { t } else { 0.0 })
                })
                .collect();
            (row_major(qr.as_ref()), tau)
        })?;
        let (qr, tau): (Vec<_>, Vec<_>) = res.into_iter().unzip();
        Ok((
            assemble(qr, &b.batch, &[m, n])?,
            assemble(tau, &b.batch, &[k])?,
        ))
    })
}
