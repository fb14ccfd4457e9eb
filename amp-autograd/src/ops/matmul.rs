//! The matmul family: mm, bmm, matmul (every broadcasting case), mv, dot, outer,
//! addmm, addbmm, baddbmm, addmv, addr, linear, chain_matmul / multi_dot.

use amp_tensor::Tensor as Raw;

use super::names::{
    ADDBMM, ADDMM, ADDMV, ADDR, BADDBMM, BMM, CHAIN_MATMUL, DOT, DUNDER_MATMUL, LINEAR, MATMUL, MM,
    MULTI_DOT, MV, OUTER,
};
use super::pointwise::{add, mul, mul_scalar};
use super::reduce::sum;
use super::shape::{expand, reshape, squeeze, transpose, unsqueeze};
use super::{check, enter, enter_read_as, enter_vec, promoted, sum_to};
use crate::graph::{grad_if, record, Kept};
use crate::{Error, Result, Tensor};

fn tr(x: &Tensor) -> Result<Tensor> {
    transpose(x, -2, -1)
}

/// `true` for a column-major matrix (strides `[1, rows]`, as `w.t()` of a contiguous
/// `w`): PyTorch's test in `mm_mat1_backward` / `mm_mat2_backward`.
fn column_major(t: &Tensor) -> bool {
    let l = t.data().layout();
    l.rank() == 2 && l.strides()[0] == 1 && l.strides()[1] == l.dims()[0]
}

/// `t * s`, or `t` itself when `s == 1` (PyTorch's `maybe_multiply`).
fn maybe_mul(t: Tensor, s: f64) -> Result<Tensor> {
    if s == 1.0 {
        Ok(t)
    } else {
        mul_scalar(&t, s)
    }
}

/// Gradient of `mat1 @ mat2` for `mat1`: `g @ mat2ᵀ`, computed as `(mat2 @ gᵀ)ᵀ` when
/// mat1 is column-major (`mat1_col`) so that the gradient has mat1's strides (PyTorch's
/// `mm_mat1_backward`, which likewise keeps only mat1's layout, not mat1).
fn mm_mat1_grad(g: &Tensor, mat1_col: bool, mat2: &Tensor) -> Result<Tensor> {
    if mat1_col {
        tr(&mm(mat2, &tr(g)?)?)
    } else {
        mm(g, &tr(mat2)?)
    }
}

/// Gradient of `mat1 @ mat2` for `mat2`: `mat1ᵀ @ g`, computed as `(gᵀ @ mat1)ᵀ` when
/// mat2 is column-major (`mat2_col`: `linear`'s `weight.t()`): the weight's gradient then
/// comes out contiguous, with no transposing copy (PyTorch's `mm_mat2_backward`).
fn mm_mat2_grad(g: &Tensor, mat1: &Tensor, mat2_col: bool) -> Result<Tensor> {
    if mat2_col {
        tr(&mm(&tr(g)?, mat1)?)
    } else {
        mm(&tr(mat1)?, g)
    }
}

/// Records a product of `a` and `b` whose gradient for each side reads only the other
/// side (every product here): `a` is kept only when `b` needs a gradient and `b` only
/// when `a` does, so a weight cast by autocast is not held by the graph of a first layer
/// whose input needs no gradient. `ga(g, b)` and `gb(g, a)` are the two gradients.
fn product(
    out: Raw,
    name: &'static str,
    a: &Tensor,
    b: &Tensor,
    ga: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
    gb: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
) -> Tensor {
    let (ra, rb) = (a.requires_grad(), b.requires_grad());
    let (ka, kb) = (Kept::new(a, rb), Kept::new(b, ra));
    record(out, name, &[a, b], move |g| {
        Ok(vec![
            grad_if(ra, || ga(g, kb.get()))?,
            grad_if(rb, || gb(g, ka.get()))?,
        ])
    })
}

/// Matrix product of two 2-D tensors.
pub fn mm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ([a, b], body) = enter_read_as(&MM, [a, b])?;
    // Read as the layer's dtype (autocast, nothing needing a gradient): the bits of the
    // product of the cast arguments, without the casts.
    let out = match body.read_as() {
        Some(dtype) => amp_kernels::mm_as(a.data(), b.data(), dtype)?,
        None => amp_kernels::mm(a.data(), b.data())?,
    };
    let (a_col, b_col) = (column_major(&a), column_major(&b));
    Ok(product(
        out,
        "MmBackward0",
        &a,
        &b,
        move |g, b| mm_mat1_grad(g, a_col, b),
        move |g, a| mm_mat2_grad(g, a, b_col),
    ))
}

macro_rules! products {
    ($($(#[$doc:meta])* $fname:ident = $op:ident, $node:literal, |$g:ident, $a:ident, $b:ident| $ga:expr, $gb:expr;)*) => {$(
        $(#[$doc])*
        pub fn $fname(a: &Tensor, b: &Tensor) -> Result<Tensor> {
            let ([a, b], _body) = enter(&$op, [a, b])?;
            let out = amp_kernels::$fname(a.data(), b.data())?;
            Ok(product(out, $node, &a, &b, |$g, $b| $ga, |$g, $a| $gb))
        }
    )*};
}

/// Batched matrix product of two 3-D tensors.
pub fn bmm(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ([a, b], body) = enter_read_as(&BMM, [a, b])?;
    // As `mm`: read as the layer's dtype when it asks.
    let out = match body.read_as() {
        Some(dtype) => amp_kernels::bmm_as(a.data(), b.data(), dtype)?,
        None => amp_kernels::bmm(a.data(), b.data())?,
    };
    Ok(product(
        out,
        "BmmBackward0",
        &a,
        &b,
        |g, b| bmm(g, &tr(b)?),
        |g, a| bmm(&tr(a)?, g),
    ))
}

products! {
    /// Matrix × vector.
    mv = MV, "MvBackward0", |g, m, v| outer(g, v), mv(&tr(m)?, g);
    /// Inner product of two 1-D tensors.
    dot = DOT, "DotBackward0", |g, a, b| mul(g, b), mul(g, a);
    /// Outer product of two 1-D tensors.
    outer = OUTER, "OuterBackward0", |g, a, b| mv(g, b), mv(&tr(g)?, a);
}

/// `beta * input + alpha * (m1 @ m2)`; with `beta == 0` the input is ignored (NaN too).
/// Keeps `m1` only when `m2` needs a gradient and `m2` only when `m1` does; never `input`.
pub fn addmm(input: &Tensor, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let ([input, m1, m2], _body) = enter(&ADDMM, [input, m1, m2])?;
    let out = amp_kernels::addmm(input.data(), m1.data(), m2.data(), beta, alpha)?;
    let (ri, r1, r2) = (
        input.requires_grad(),
        m1.requires_grad(),
        m2.requires_grad(),
    );
    let (k1, k2) = (Kept::new(&m1, r2), Kept::new(&m2, r1));
    let (c1, c2) = (column_major(&m1), column_major(&m2));
    let di = input.dims().to_vec();
    Ok(record(
        out,
        "AddmmBackward0",
        &[&input, &m1, &m2],
        move |g| {
            Ok(vec![
                // beta = 0 ignores the input's value but not its gradient: grad · 0, as
                // PyTorch's `maybe_multiply(grad, beta)`.
                grad_if(ri, || sum_to(&maybe_mul(g.clone(), beta)?, &di))?,
                grad_if(r1, || maybe_mul(mm_mat1_grad(g, c1, k2.get())?, alpha))?,
                grad_if(r2, || maybe_mul(mm_mat2_grad(g, k1.get(), c2)?, alpha))?,
            ])
        },
    ))
}

/// `p`, recorded as also depending on `input` through `0 · input`: with `beta = 0` the
/// input's value is ignored (NaN too), but its gradient is PyTorch's `grad · 0` (zeros,
/// NaN where `grad` is not finite) summed to its shape, not none.
fn ignoring(input: &Tensor, p: Tensor) -> Tensor {
    if !crate::grad_mode::is_grad_enabled() || !input.requires_grad() {
        return p;
    }
    let di = input.dims().to_vec();
    record(p.data().clone(), "AddBackward0", &[&p, input], move |g| {
        Ok(vec![
            Some(g.clone()),
            Some(sum_to(&mul_scalar(g, 0.0)?, &di)?),
        ])
    })
}

fn scaled_sum(input: &Tensor, beta: f64, prod: Tensor, alpha: f64) -> Result<Tensor> {
    let p = if alpha == 1.0 {
        prod
    } else {
        mul_scalar(&prod, alpha)?
    };
    if beta == 0.0 {
        let z = Tensor::zeros_on(input.dims().to_vec(), input.dtype(), input.device())?;
        return Ok(ignoring(input, add(&z, &p)?));
    }
    let i = if beta == 1.0 {
        input.clone()
    } else {
        mul_scalar(input, beta)?
    };
    add(&i, &p)
}

/// `beta * input + alpha * sum_b(b1[b] @ b2[b])`.
pub fn addbmm(input: &Tensor, b1: &Tensor, b2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let ([input, b1, b2], _body) = enter(&ADDBMM, [input, b1, b2])?;
    check::addbmm(&input, &b1, &b2)?;
    scaled_sum(
        &input,
        beta,
        sum(&bmm(&b1, &b2)?, &[0], false, None)?,
        alpha,
    )
}

/// `beta * input + alpha * (b1 @ b2)` batched.
pub fn baddbmm(input: &Tensor, b1: &Tensor, b2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let ([input, b1, b2], _body) = enter(&BADDBMM, [input, b1, b2])?;
    check::baddbmm(&input, &b1, &b2)?;
    scaled_sum(&input, beta, bmm(&b1, &b2)?, alpha)
}

/// `beta * input + alpha * (m @ v)`.
pub fn addmv(input: &Tensor, m: &Tensor, v: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let ([input, m, v], _body) = enter(&ADDMV, [input, m, v])?;
    check::addmv(&input, &m, &v)?;
    scaled_sum(&input, beta, mv(&m, &v)?, alpha)
}

/// `beta * input + alpha * outer(v1, v2)`.
pub fn addr(input: &Tensor, v1: &Tensor, v2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let ([input, v1, v2], _body) = enter(&ADDR, [input, v1, v2])?;
    check::addr(&input, &v1, &v2)?;
    let [input, v1, v2] = promoted([&input, &v1, &v2])?;
    scaled_sum(&input, beta, outer(&v1, &v2)?, alpha)
}

/// `torch.matmul`: dot, mv, mm, or batched with broadcasting of the batch dims
/// (1-D operands are promoted to matrices and the added dim removed).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ([a, b], body) = enter_read_as(&MATMUL, [a, b])?;
    match body.read_as() {
        Some(dtype) => matmul_read_as(&a, &b, dtype),
        None => matmul_impl(&a, &b),
    }
}

/// `a @ b` (`Tensor.__matmul__`).
pub fn dunder_matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ([a, b], body) = enter_read_as(&DUNDER_MATMUL, [a, b])?;
    match body.read_as() {
        Some(dtype) => matmul_read_as(&a, &b, dtype),
        None => matmul(&a, &b),
    }
}

/// `matmul` of float32 `a` and `b` read as `dtype` (the layer asked: nothing needs a
/// gradient): a product of two matrices or of two equal batches of them reads its
/// arguments as `dtype` in the kernel (`mm_as`, `bmm_as`: the bits of the casts'
/// product); other shapes cast first and take `matmul`'s path.
fn matmul_read_as(a: &Tensor, b: &Tensor, dtype: amp_tensor::DType) -> Result<Tensor> {
    let same_batch = a.rank() == 3 && b.rank() == 3 && a.dims()[0] == b.dims()[0];
    if a.rank() == 2 && b.rank() == 2 {
        Ok(Tensor::from_raw(amp_kernels::mm_as(
            a.data(),
            b.data(),
            dtype,
        )?))
    } else if same_batch {
        Ok(Tensor::from_raw(amp_kernels::bmm_as(
            a.data(),
            b.data(),
            dtype,
        )?))
    } else {
        matmul_impl(&a.to_dtype(dtype)?, &b.to_dtype(dtype)?)
    }
}

fn matmul_impl(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match (a.rank(), b.rank()) {
        (ra, rb @ 0) | (ra @ 0, rb) => Err(Error::Tensor(amp_tensor::Error::refused(
            "matmul",
            format!(
                "both arguments to matmul need to be at least 1D, but they are {ra}D and {rb}D"
            ),
        ))),
        (1, 1) => dot(a, b),
        (2, 1) => mv(a, b),
        (1, 2) => squeeze(&mm(&unsqueeze(a, 0)?, b)?, 0),
        (2, 2) => mm(a, b),
        (ra, 1) => {
            // fold the batch into rows: [..., n, k] @ [k]
            let lead = &a.dims()[..ra - 1];
            let k = a.dims()[ra - 1];
            let rows: usize = lead.iter().product();
            let out = mv(&reshape(a, [rows, k])?, b)?;
            reshape(&out, lead.to_vec())
        }
        (ra, 2) => {
            let (n, k) = (a.dims()[ra - 2], a.dims()[ra - 1]);
            let batch = &a.dims()[..ra - 2];
            let rows: usize = batch.iter().product::<usize>() * n;
            let out = mm(&reshape(a, [rows, k])?, b)?;
            let mut dims = a.dims()[..ra - 1].to_vec();
            dims.push(b.dims()[1]);
            reshape(&out, dims)
        }
        (ra, rb) => {
            let a2 = if ra == 1 { unsqueeze(a, 0)? } else { a.clone() };
            let b2 = if rb == 1 { unsqueeze(b, 1)? } else { b.clone() };
            let (n, k) = (a2.dims()[a2.rank() - 2], a2.dims()[a2.rank() - 1]);
            let (k2, p) = (b2.dims()[b2.rank() - 2], b2.dims()[b2.rank() - 1]);
            let batch = amp_tensor::broadcast_shapes(
                "matmul",
                &a2.dims()[..a2.rank() - 2],
                &b2.dims()[..b2.rank() - 2],
            )?;
            let nb: usize = batch.iter().product();
            let ea = expand(&a2, &[batch.clone(), vec![n, k]].concat())?;
            let eb = expand(&b2, &[batch.clone(), vec![k2, p]].concat())?;
            let out = bmm(&reshape(&ea, [nb, n, k])?, &reshape(&eb, [nb, k2, p])?)?;
            let mut dims = batch;
            if ra > 1 {
                dims.push(n);
            }
            if rb > 1 {
                dims.push(p);
            }
            reshape(&out, dims)
        }
    }
}

/// `x @ weight.T + bias` (PyTorch's `F.linear`).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (x, weight, bias, _body) = match bias {
        Some(b) => {
            let ([x, w, b], body) = enter(&LINEAR, [x, weight, b])?;
            (x, w, Some(b), body)
        }
        None => {
            let ([x, w], body) = enter(&LINEAR, [x, weight])?;
            (x, w, None, body)
        }
    };
    if x.rank() == 0 || weight.rank() == 0 {
        return Err(Error::Tensor(amp_tensor::Error::refused(
            "linear",
            format!(
                "both arguments to linear need to be at least 1D, but they are {}D and {}D",
                x.rank(),
                weight.rank()
            ),
        )));
    }
    if weight.rank() > 2 {
        return Err(Error::Tensor(amp_tensor::Error::refused(
            "linear",
            format!(
                "t() expects a tensor with <= 2 dimensions, but self is {}D",
                weight.rank()
            ),
        )));
    }
    let wt = if weight.rank() == 2 {
        transpose(&weight, 0, 1)?
    } else {
        weight.clone()
    };
    match (x.rank(), &bias) {
        (2, Some(b)) => addmm(b, &x, &wt, 1.0, 1.0),
        (_, Some(b)) => add(&matmul(&x, &wt)?, b),
        (_, None) => matmul(&x, &wt),
    }
}

fn chain(ms: &[Tensor], op: &'static str) -> Result<Tensor> {
    if ms.len() > 2 && ms.iter().any(|m| m.rank() != 2) {
        // Not a chain of matrices: `mm`'s error, from the first product that has one.
        let mut acc = ms[0].clone();
        for m in &ms[1..] {
            acc = mm(&acc, m)?;
        }
        return Ok(acc);
    }
    match ms {
        [] => Err(Error::invalid(op, "expects at least one tensor")),
        [m] => Ok(m.clone()),
        [a, b] => mm(a, b),
        [x, y, z] => {
            // PyTorch's rule for three: `(a×b)(b×c)(c×d)` as `A(BC)` only when that
            // costs strictly less (a tie multiplies left to right).
            let (a, b, c, d) = (x.dims()[0], y.dims()[0], z.dims()[0], z.dims()[1]);
            if (a * c) * (b + d) > (b * d) * (a + c) {
                mm(x, &mm(y, z)?)
            } else {
                mm(&mm(x, y)?, z)
            }
        }
        _ => {
            let split = chain_order(ms);
            chain_split(ms, &split, 0, ms.len() - 1)
        }
    }
}

/// The order of fewest multiply-adds for a chain of four or more matrices, as PyTorch's
/// `matrix_chain_order` finds it (the textbook dynamic program, the first best split
/// kept): `split[i][j]` is where the product of matrices `i..=j` is cut. The order
/// matters to the result beyond float32: each product is rounded to the chain's dtype.
fn chain_order(ms: &[Tensor]) -> Vec<Vec<usize>> {
    let n = ms.len();
    // Matrix `i` is `p[i] × p[i + 1]`.
    let mut p: Vec<usize> = ms.iter().map(|m| m.dims()[0]).collect();
    p.push(ms[n - 1].dims()[1]);
    let mut cost = vec![vec![0usize; n]; n];
    let mut split = vec![vec![0usize; n]; n];
    for l in 1..n {
        for i in 0..n - l {
            let j = i + l;
            cost[i][j] = usize::MAX;
            for k in i..j {
                let q = cost[i][k]
                    .saturating_add(cost[k + 1][j])
                    .saturating_add(p[i] * p[k + 1] * p[j + 1]);
                if q < cost[i][j] {
                    cost[i][j] = q;
                    split[i][j] = k;
                }
            }
        }
    }
    split
}

/// The product of matrices `i..=j` of `ms` in the order `split` gives.
fn chain_split(ms: &[Tensor], split: &[Vec<usize>], i: usize, j: usize) -> Result<Tensor> {
    if i == j {
        return Ok(ms[i].clone());
    }
    let k = split[i][j];
    mm(
        &chain_split(ms, split, i, k)?,
        &chain_split(ms, split, k + 1, j)?,
    )
}

/// Product of a chain of matrices, in the order of fewest multiply-adds (PyTorch's
/// `chain_matmul` is `linalg.multi_dot`).
pub fn chain_matmul(ms: &[Tensor]) -> Result<Tensor> {
    let refs: Vec<&Tensor> = ms.iter().collect();
    let (ms, _body) = enter_vec(&CHAIN_MATMUL, &refs)?;
    chain(&ms, "chain_matmul")
}

/// `torch.linalg.multi_dot`: like [`chain_matmul`], the first and last may be 1-D.
pub fn multi_dot(ms: &[Tensor]) -> Result<Tensor> {
    let refs: Vec<&Tensor> = ms.iter().collect();
    let (mut ms, _body) = enter_vec(&MULTI_DOT, &refs)?;
    if ms.len() < 2 {
        return Err(Error::invalid(
            "multi_dot",
            "expected at least 2 tensors but got fewer",
        ));
    }
    let n = ms.len();
    let first_1d = ms[0].rank() == 1;
    let last_1d = ms[n - 1].rank() == 1;
    if first_1d {
        ms[0] = unsqueeze(&ms[0], 0)?;
    }
    if last_1d {
        ms[n - 1] = unsqueeze(&ms[n - 1], 1)?;
    }
    let mut out = chain(&ms, "multi_dot")?;
    if last_1d {
        out = squeeze(&out, 1)?;
    }
    if first_1d {
        out = squeeze(&out, 0)?;
    }
    Ok(out)
}

impl Tensor {
    /// See [`matmul`].
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        matmul(self, other)
    }
    /// See [`mm`].
    pub fn mm(&self, other: &Tensor) -> Result<Tensor> {
        mm(self, other)
    }
}
