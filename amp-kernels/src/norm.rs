//! Normalisation layers: `layer_norm` (PyTorch's `native_layer_norm`, returning the
//! saved mean and reciprocal standard deviation) and its backward, `group_norm`, and
//! `normalize` (`F.normalize`).
//!
//! Statistics are computed per row in the compute type (f32 for f16/bf16/f32, f64 for
//! f64) with an exact two-pass mean and biased variance; outputs are rounded once.
//! The saved statistics keep the compute type (float32 for 16-bit inputs, as PyTorch's
//! accumulation type). Rows run in parallel when large.

use amp_tensor::{cast_into, ensure, Element, Error, Result, Tensor};

use crate::compute::{with_slice, Real};
use crate::reduce::{
    as_same, as_same_mut, check_norm, lane_reduce, lane_sum, line_geometry, map_lines,
    rows_per_task, vector_norm, Num, LINE_PAR_MIN, PAR_MIN, TASK,
};
use crate::vmath::{self, Level};

#[cfg(target_arch = "x86_64")]
mod rows_avx2;

/// `(outer rows, normalized elements)` of a layer norm over the trailing
/// `normalized_shape`, with PyTorch's checks.
fn ln_geometry(x: &Tensor, ns: &[usize]) -> Result<(usize, usize)> {
    let op = "layer_norm";
    ensure!(!ns.is_empty(), invalid(op, "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = []"));
    let (r, k) = (x.rank(), ns.len());
    if k > r || x.dims()[r - k..] != *ns {
        let inner: Vec<String> = ns.iter().map(|d| d.to_string()).collect();
        return Err(Error::invalid(
            op,
            format!(
                "Given normalized_shape={ns:?}, expected input with shape [*, {}], but got input of size{:?}",
                inner.join(", "),
                x.dims()
            ),
        ));
    }
    if !x.dtype().is_floating_point() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype(),
        });
    }
    Ok((x.dims()[..r - k].iter().product(), ns.iter().product()))
}

/// Check an optional affine parameter has `shape` and a floating dtype.
fn check_param(
    op: &'static str,
    name: &str,
    p: Option<&Tensor>,
    shape: &[usize],
    what: &str,
) -> Result<()> {
    if let Some(p) = p {
        ensure!(p.dims() == shape, invalid(op, "Expected {name} to be of same shape as {what}, but got {name} of shape {:?} and {what} = {shape:?}", p.dims()));
        if !p.dtype().is_floating_point() {
            return Err(Error::UnsupportedDType {
                op,
                dtype: p.dtype(),
            });
        }
    }
    Ok(())
}

/// `sum(g(x))` over a row: in [`lane_reduce`]'s lanes for short rows, else in 64
/// independent lanes (four vector registers of f32 under AVX-512, so the additions do
/// not wait on each other) folded into those lanes.
#[inline(always)]
fn wide_sum<C: Num>(xs: &[C], g: impl Fn(C) -> C) -> C {
    const W: usize = 64;
    if xs.len() < 4 * W {
        return lane_reduce(xs, C::ZERO, C::nadd, g);
    }
    // Lane `8j + i` is `acc[j][i]`: eight blocks of eight with constant indices, which
    // the compiler adds in registers (one flat array of 64 it reloaded from the stack
    // for every chunk). Float32 layer norm of `[n, n]` on an AVX2 EPYC, old time over
    // new (medians of four alternations): 1.11–1.33 for n = 256–1024.
    let mut acc = [[C::ZERO; 8]; W / 8];
    let mut chunks = xs.chunks_exact(W);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c.chunks_exact(8)) {
            let x: &[C; 8] = x.try_into().expect("chunks of 8");
            *a = std::array::from_fn(|i| a[i].nadd(g(x[i])));
        }
    }
    let flat = acc.as_flattened_mut();
    for (a, &x) in flat.iter_mut().zip(chunks.remainder()) {
        *a = a.nadd(g(x));
    }
    lane_sum(flat)
}

/// The input of [`norm_rows`] every block of rows reads: rows of `n` elements of `s`,
/// `eps`, a per-element weight and bias applied as each row is normalised, and the
/// affine step applied to each normalised row after.
struct NormInput<'a, T, C> {
    s: &'a [T],
    n: usize,
    eps: C,
    wb: Params<'a, C>,
    /// None for layer norm, whose float32 and 16-bit rows may then take the AVX2 row
    /// kernel (`rows_avx2`).
    affine: Option<Affine<'a, C>>,
}

/// The weight and bias of each element of a row (`n` each), if any.
type Params<'a, C> = (Option<&'a [C]>, Option<&'a [C]>);

/// A step applied to each normalised row in place (`affine(row, y)`), after the weight
/// and bias.
type Affine<'a, C> = &'a (dyn Fn(usize, &mut [C]) + Sync);

/// Normalise rows `r0..` (`out.len() / n` of them) of the input into `out`, writing
/// their statistics to `mean` and `rstd` (see [`norm_rows`]). Always inlined, so it
/// takes the SIMD level of its caller.
#[inline(always)]
fn norm_block<T: Element, C: Real + Num>(
    input: &NormInput<'_, T, C>,
    r0: usize,
    out: &mut [T],
    mean: &mut [C],
    rstd: &mut [C],
) {
    let NormInput {
        s,
        n,
        eps,
        wb,
        affine,
    } = *input;
    let nc = C::from_f64c(n as f64);
    let same = as_same::<T, C>(&[]).is_some();
    let scratch = if same { 0 } else { n };
    let (mut xb, mut yb) = (vec![C::ZERO; scratch], vec![C::ZERO; scratch]);
    for (k, orow) in out.chunks_mut(n).enumerate() {
        let r = r0 + k;
        let src = &s[r * n..(r + 1) * n];
        let xr: &[C] = match as_same::<T, C>(src) {
            Some(v) => v,
            None => {
                cast_into(src, &mut xb);
                &xb
            }
        };
        let mu = wide_sum(xr, |v| v) / nc;
        let var = wide_sum(xr, |v: C| (v - mu) * (v - mu)) / nc;
        let rs = C::ONE / (var + eps).sqrt();
        (mean[k], rstd[k]) = (mu, rs);
        // Into the output itself, or into the compute-type buffer cast into it after.
        let y: &mut [C] = match as_same_mut::<T, C>(orow) {
            Some(o) => o,
            None => &mut yb,
        };
        write_row(y, xr, wb, mu, rs);
        if let Some(f) = affine {
            f(r, y);
        }
        if !same {
            cast_into(&yb, orow);
        }
    }
}

/// `y = (x - mu) · rs`, times the weight plus the bias of each element when given
/// (`y · w + b`, rounded as two steps), in one pass. Always inlined, so it takes the
/// SIMD level of its caller. A function, not a closure: a closure is compiled on its
/// own at the baseline ISA (not its caller's AVX2 / AVX-512) unless it is inlined, and
/// the one that wrote the rows before, called twice, was not: float32 layer norm wrote
/// its rows 4 lanes wide (SSE).
#[inline(always)]
fn write_row<C: Real + Num>(y: &mut [C], xr: &[C], wb: Params<'_, C>, mu: C, rs: C) {
    let it = y.iter_mut().zip(xr);
    match wb {
        (Some(w), Some(b)) => it
            .zip(w)
            .zip(b)
            .for_each(|(((y, &v), &w), &b)| *y = (v - mu) * rs * w + b),
        (Some(w), None) => it.zip(w).for_each(|((y, &v), &w)| *y = (v - mu) * rs * w),
        (None, Some(b)) => it.zip(b).for_each(|((y, &v), &b)| *y = (v - mu) * rs + b),
        (None, None) => it.for_each(|(y, &v)| *y = (v - mu) * rs),
    }
}

/// [`norm_block`] compiled for AVX-512 (identical results: no fused or reordered
/// arithmetic, only wider registers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
unsafe fn norm_block_avx512<T: Element, C: Real + Num>(
    input: &NormInput<'_, T, C>,
    r0: usize,
    out: &mut [T],
    mean: &mut [C],
    rstd: &mut [C],
) {
    norm_block(input, r0, out, mean, rstd)
}

/// [`norm_block`] compiled for AVX2 (identical results, as [`norm_block_avx512`]): on
/// CPUs without AVX-512 the baseline build ran it 4 lanes wide, and layer norm over
/// `[512, 512]` float32 took 1.3× PyTorch's time on an AVX2-only EPYC. Layer norm of
/// float32, bfloat16 and float16 rows (float32 statistics and parameters) runs on
/// [`rows_avx2::rows`] where the CPU has F16C, with the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn norm_block_avx2<T: Element, C: Real + Num>(
    input: &NormInput<'_, T, C>,
    r0: usize,
    out: &mut [T],
    mean: &mut [C],
    rstd: &mut [C],
) {
    if input.affine.is_none() && std::arch::is_x86_feature_detected!("f16c") {
        let n = input.n;
        let eps = as_same::<C, f32>(std::slice::from_ref(&input.eps));
        let stats = (as_same_mut::<C, f32>(mean), as_same_mut::<C, f32>(rstd));
        if let (Some(&[eps]), (Some(m), Some(r))) = (eps, stats) {
            let (w, b) = input.wb;
            let wb = (w.and_then(as_same::<C, f32>), b.and_then(as_same::<C, f32>));
            let s = &input.s[r0 * n..r0 * n + out.len()];
            macro_rules! typed {
                ($($S:ty),*) => {$(
                    if let (Some(s), Some(o)) = (as_same::<T, $S>(s), as_same_mut::<T, $S>(out)) {
                        // SAFETY: the CPU has AVX2 and FMA (this function's features)
                        // and F16C (checked above).
                        unsafe { rows_avx2::rows::<$S>(s, n, eps, wb, o, (m, r)) };
                        return;
                    }
                )*};
            }
            typed!(f32, amp_tensor::half::bf16, amp_tensor::half::f16);
        }
    }
    norm_block(input, r0, out, mean, rstd)
}

/// Normalise each of the `rows` contiguous rows of `n` elements of `s` to zero mean and
/// unit variance (`rstd = 1 / sqrt(var + eps)`), times `wb`'s weight plus its bias
/// element by element in the same pass, then let `affine(row, y)` (when given) scale and
/// shift row `row` in place. Returns the output and the per-row mean and rstd
/// ([`amp_tensor::Error::OutOfMemory`] when they cannot be allocated). Large inputs
/// split into blocks of rows ([`rows_per_task`]) taken by the threads as they come.
fn norm_rows<T: Element, C: Real + Num>(
    s: &[T],
    rows: usize,
    n: usize,
    eps: f64,
    wb: Params<'_, C>,
    affine: Option<Affine<'_, C>>,
) -> Result<(Vec<T>, Vec<C>, Vec<C>)> {
    use amp_tensor::pool::{try_filled, try_recycled_vec, try_zeroed};
    if n == 0 {
        return Ok((
            Vec::new(),
            try_filled(rows, C::nan())?,
            try_filled(rows, C::nan())?,
        ));
    }
    // Every element is written, so a recycled buffer (already mapped pages) serves.
    let mut out = try_recycled_vec::<T>(rows * n)?;
    let mut mean = try_zeroed::<C>(rows)?;
    let mut rstd = try_zeroed::<C>(rows)?;
    let input = NormInput {
        s,
        n,
        eps: C::from_f64c(eps),
        wb,
        affine,
    };
    let level = vmath::level();
    let body = |r0: usize, out: &mut [T], mean: &mut [C], rstd: &mut [C]| {
        #[cfg(target_arch = "x86_64")]
        match level {
            // SAFETY: the CPU has AVX-512F/DQ/VL and FMA (checked by `vmath::level`).
            Some(Level::Avx512) => unsafe { norm_block_avx512(&input, r0, out, mean, rstd) },
            // SAFETY: the CPU has AVX2 and FMA (checked by `vmath::level`).
            Some(Level::Avx2) => unsafe { norm_block_avx2(&input, r0, out, mean, rstd) },
            None => norm_block(&input, r0, out, mean, rstd),
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = level;
            norm_block(&input, r0, out, mean, rstd)
        }
    };
    if rows > 1 && rows * n >= LINE_PAR_MIN {
        // Blocks of rows taken as the threads come.
        let per = rows_per_task(rows, n);
        let parts: Vec<_> = out
            .chunks_mut(per * n)
            .zip(mean.chunks_mut(per))
            .zip(rstd.chunks_mut(per))
            .map(|((o, m), r)| std::sync::Mutex::new((o, m, r)))
            .collect();
        amp_tensor::parallel::for_each(parts.len(), &|c| {
            let mut part = parts[c].lock().unwrap_or_else(|e| e.into_inner());
            let (o, m, r) = &mut *part;
            body(c * per, o, m, r)
        });
    } else {
        body(0, &mut out, &mut mean, &mut rstd);
    }
    Ok((out, mean, rstd))
}

/// Layer normalisation over the trailing `normalized_shape` dims, as PyTorch's
/// `native_layer_norm`: returns `(output, mean, rstd)` where the output has `x`'s
/// dtype and shape, and `mean`/`rstd` (`1 / sqrt(var + eps)`, biased variance) have
/// shape `x.shape[..outer] + [1; normalized_shape.len()]` in the accumulation dtype
/// (float32 for f16/bf16 inputs). `weight` and `bias` (any floating dtype) must have
/// `normalized_shape`.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    layer_norm_with(x, normalized_shape, weight, bias, eps, true)
}

/// [`layer_norm`] on the portable path only (the AVX-512 kernels' reference in tests).
#[cfg(test)]
pub(crate) fn layer_norm_portable(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    layer_norm_with(x, normalized_shape, weight, bias, eps, false)
}

/// [`layer_norm`], with the AVX-512 row kernels when `fast` (and the CPU has them).
fn layer_norm_with(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    fast: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "layer_norm";
    let (m, n) = ln_geometry(x, normalized_shape)?;
    check_param(op, "weight", weight, normalized_shape, "normalized_shape")?;
    check_param(op, "bias", bias, normalized_shape, "normalized_shape")?;
    let mut stat_shape = x.dims()[..x.rank() - normalized_shape.len()].to_vec();
    stat_shape.extend(std::iter::repeat_n(1, normalized_shape.len()));
    crate::compute::on_device!(op, [x], {
        let (out, mean, rstd) = crate::cuda::route::layer_norm(x, m, n, weight, bias, eps)?;
        Ok((
            out,
            mean.reshape(stat_shape.clone())?,
            rstd.reshape(stat_shape)?,
        ))
    });
    let xc = x.try_contiguous()?;
    float_kernel!(x.dtype(), op, |T, C| {
        let w: Option<Vec<C>> = weight.map(|t| t.host_vec_as()).transpose()?;
        let b: Option<Vec<C>> = bias.map(|t| t.host_vec_as()).transpose()?;
        #[cfg(target_arch = "x86_64")]
        {
            // float32, bfloat16 and float16 rows straight from the storage type.
            let (wf, bf) = (
                w.as_deref().and_then(|v| as_same::<C, f32>(v)),
                b.as_deref().and_then(|v| as_same::<C, f32>(v)),
            );
            if fast && wf.is_some() == w.is_some() && bf.is_some() == b.is_some() {
                let done = with_slice::<T, _>(&xc, |s| {
                    crate::rows512::layer_norm::<T>(s, m, n, eps as f32, wf, bf)
                })?;
                if let Some(res) = done {
                    let (out, mean, rstd) = res?;
                    return Ok((
                        Tensor::from_vec(out, x.dims())?,
                        Tensor::from_vec(mean, stat_shape.clone())?,
                        Tensor::from_vec(rstd, stat_shape)?,
                    ));
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = fast;
        let wb = (w.as_deref(), b.as_deref());
        let (out, mean, rstd) =
            with_slice::<T, _>(&xc, |s| norm_rows::<T, C>(s, m, n, eps, wb, None))??;
        Ok((
            Tensor::from_vec(out, x.dims())?,
            Tensor::from_vec(mean, stat_shape.clone())?,
            Tensor::from_vec(rstd, stat_shape)?,
        ))
    })
}

/// Per-row backward of layer norm over `g`, `x` (rows of `n`, compute type) with the
/// saved statistics: `(grad_input, grad_weight, grad_bias)`, the last two summed over
/// rows (partial sums per task, added in order). [`amp_tensor::Error::OutOfMemory`]
/// when the gradients cannot be allocated.
fn ln_backward_rows<C: Real + Num>(
    g: &[C],
    x: &[C],
    (mean, rstd): (&[C], &[C]),
    w: Option<&[C]>,
    n: usize,
) -> Result<(Vec<C>, Vec<C>, Vec<C>)> {
    let rows = mean.len();
    let mut gi = amp_tensor::pool::try_zeroed::<C>(rows * n)?;
    if n == 0 {
        return Ok((gi, Vec::new(), Vec::new()));
    }
    let per = (TASK / n).max(1);
    let body = |(c, chunk): (usize, &mut [C])| {
        let rows = LnRows {
            g,
            x,
            mean,
            rstd,
            w,
            n,
            first: c * per,
        };
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above).
                return unsafe { ln_backward_chunk_avx512(&rows, chunk) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { ln_backward_chunk_avx2(&rows, chunk) };
            }
        }
        ln_backward_chunk(&rows, chunk)
    };
    let partials: Vec<(Vec<C>, Vec<C>)> = if rows * n >= PAR_MIN {
        amp_tensor::parallel::map_chunks_mut(&mut gi, per * n, &|i, c| body((i, c)))
    } else {
        gi.chunks_mut(per * n).enumerate().map(body).collect()
    };
    let (mut gw, mut gb) = (
        amp_tensor::pool::try_zeroed::<C>(n)?,
        amp_tensor::pool::try_zeroed::<C>(n)?,
    );
    for (pw, pb) in &partials {
        gw.iter_mut().zip(pw).for_each(|(a, &b)| *a = *a + b);
        gb.iter_mut().zip(pb).for_each(|(a, &b)| *a = *a + b);
    }
    Ok((gi, gw, gb))
}

/// The rows a task of [`ln_backward_rows`] works on: its inputs, and the index of its
/// first row.
struct LnRows<'a, C> {
    g: &'a [C],
    x: &'a [C],
    mean: &'a [C],
    rstd: &'a [C],
    w: Option<&'a [C]>,
    n: usize,
    first: usize,
}

/// One task of [`ln_backward_rows`]: the input gradient of `chunk.len() / n` rows into
/// `chunk`, and their partial weight and bias gradients.
#[inline(always)]
fn ln_backward_chunk<C: Real + Num>(rows: &LnRows<'_, C>, chunk: &mut [C]) -> (Vec<C>, Vec<C>) {
    let LnRows {
        g,
        x,
        mean,
        rstd,
        w,
        n,
        first,
    } = *rows;
    let nc = C::from_f64c(n as f64);
    let (mut gw, mut gb) = (vec![C::ZERO; n], vec![C::ZERO; n]);
    let (mut gx, mut xh, mut t) = (vec![C::ZERO; n], vec![C::ZERO; n], vec![C::ZERO; n]);
    for (k, out) in chunk.chunks_mut(n).enumerate() {
        let r = first + k;
        let (gr, xr) = (&g[r * n..(r + 1) * n], &x[r * n..(r + 1) * n]);
        let (mu, rs) = (mean[r], rstd[r]);
        // Every slice cut to `n` first: with the bounds the compiler can see, the loop is
        // vectorised (indexing the vectors themselves left it scalar, 60% of the
        // kernel's time on a Zen 4 at [2048, 128]).
        let (xh, gx, t) = (&mut xh[..n], &mut gx[..n], &mut t[..n]);
        let (gw, gb) = (&mut gw[..n], &mut gb[..n]);
        match w.map(|w| &w[..n]) {
            Some(w) => {
                for j in 0..n {
                    xh[j] = (xr[j] - mu) * rs;
                    gx[j] = gr[j] * w[j];
                    gw[j] = gw[j] + gr[j] * xh[j];
                    gb[j] = gb[j] + gr[j];
                    t[j] = gx[j] * xh[j];
                }
            }
            None => {
                for j in 0..n {
                    xh[j] = (xr[j] - mu) * rs;
                    gx[j] = gr[j];
                    gw[j] = gw[j] + gr[j] * xh[j];
                    gb[j] = gb[j] + gr[j];
                    t[j] = gx[j] * xh[j];
                }
            }
        }
        let (a, b) = (lane_sum(gx) / nc, lane_sum(t) / nc);
        for ((o, &gxj), &xhj) in out.iter_mut().zip(gx.iter()).zip(xh.iter()) {
            *o = rs * (gxj - a - xhj * b);
        }
    }
    (gw, gb)
}

/// [`ln_backward_chunk`] compiled for AVX-512: the same operations in the same order
/// (Rust never fuses a multiply and an add by itself), so the same bits, 16 lanes at a
/// time instead of the baseline's 4. At 7% of a transformer training step it was the
/// largest kernel left at the baseline width.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
unsafe fn ln_backward_chunk_avx512<C: Real + Num>(
    rows: &LnRows<'_, C>,
    chunk: &mut [C],
) -> (Vec<C>, Vec<C>) {
    ln_backward_chunk(rows, chunk)
}

/// [`ln_backward_chunk`] compiled for AVX2 (the same bits, as
/// [`ln_backward_chunk_avx512`]), for CPUs without AVX-512.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn ln_backward_chunk_avx2<C: Real + Num>(
    rows: &LnRows<'_, C>,
    chunk: &mut [C],
) -> (Vec<C>, Vec<C>) {
    ln_backward_chunk(rows, chunk)
}

/// The backward of [`layer_norm`] given the saved `mean` and `rstd`:
/// `(grad_input, grad_weight, grad_bias)`. `grad_input` has `x`'s dtype; `grad_weight`
/// (`sum(g * xhat)` over the outer dims, only when `weight` is given) and `grad_bias`
/// (`sum(g)` over the outer dims, always computed) have `normalized_shape` and the
/// weight's dtype (`x`'s without a weight).
pub fn layer_norm_backward(
    grad_out: &Tensor,
    x: &Tensor,
    normalized_shape: &[usize],
    mean: &Tensor,
    rstd: &Tensor,
    weight: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    let op = "layer_norm_backward";
    let (m, n) = ln_geometry(x, normalized_shape)?;
    check_param(op, "weight", weight, normalized_shape, "normalized_shape")?;
    if grad_out.dims() != x.dims() {
        return Err(Error::shape_mismatch(op, grad_out.dims(), x.dims()));
    }
    for (name, t) in [("mean", mean), ("rstd", rstd)] {
        ensure!(
            t.elem_count() == m,
            invalid(
                op,
                "{name} must hold one value per normalized row ({m}), got shape {:?}",
                t.dims()
            )
        );
    }
    let param_dtype = weight.map_or(x.dtype(), |w| w.dtype());
    crate::compute::on_device!(
        op,
        [grad_out, x, mean, rstd],
        crate::cuda::route::layer_norm_backward(
            grad_out,
            x,
            m,
            n,
            (mean, rstd),
            weight,
            param_dtype
        )
    );
    float_kernel!(x.dtype(), op, |_T, C| {
        let g: Vec<C> = grad_out.host_vec_as()?;
        let xv: Vec<C> = x.host_vec_as()?;
        let (mu, rs): (Vec<C>, Vec<C>) = (mean.host_vec_as()?, rstd.host_vec_as()?);
        let w: Option<Vec<C>> = weight.map(|t| t.host_vec_as()).transpose()?;
        let (gi, gw, gb) = ln_backward_rows::<C>(&g, &xv, (&mu, &rs), w.as_deref(), n)?;
        let gi = Tensor::from_vec(gi, x.dims())?.to_dtype(x.dtype())?;
        let param =
            |v: Vec<C>| Tensor::from_vec(v, normalized_shape.to_vec())?.to_dtype(param_dtype);
        let gw = match weight {
            Some(_) => Some(param(gw)?),
            None => None,
        };
        Ok((gi, gw, Some(param(gb)?)))
    })
}

/// Group normalisation of `x` (`[N, C, *]`) with `num_groups` groups of channels, as
/// PyTorch's `native_group_norm`: returns `(output, mean, rstd)` with the statistics
/// shaped `[N, num_groups]` in the accumulation dtype. `weight` and `bias` are
/// per-channel (`[C]`).
pub fn group_norm(
    x: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "group_norm";
    ensure!(
        x.rank() >= 2,
        invalid(
            op,
            "Expected at least 2 dimensions for input tensor but received {}",
            x.rank()
        )
    );
    let (nb, c) = (x.dims()[0], x.dims()[1]);
    ensure!(!(num_groups == 0 || c % num_groups != 0), invalid(op, "Expected number of channels in input to be divisible by num_groups, but got input of shape {:?} and num_groups={num_groups}", x.dims()));
    if !x.dtype().is_floating_point() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype(),
        });
    }
    check_param(op, "weight", weight, &[c], "the number of channels")?;
    check_param(op, "bias", bias, &[c], "the number of channels")?;
    let hw: usize = x.dims()[2..].iter().product();
    let cg = c / num_groups;
    let xc = x.try_contiguous()?;
    float_kernel!(x.dtype(), op, |T, C| {
        let w: Option<Vec<C>> = weight.map(|t| t.host_vec_as()).transpose()?;
        let b: Option<Vec<C>> = bias.map(|t| t.host_vec_as()).transpose()?;
        let affine = |row: usize, y: &mut [C]| {
            if hw == 0 {
                return;
            }
            let c0 = (row % num_groups) * cg;
            for (cc, ys) in y.chunks_mut(hw).enumerate() {
                let wv = w.as_ref().map_or(1.0, |w| w[c0 + cc]);
                let bv = b.as_ref().map_or(0.0, |b| b[c0 + cc]);
                ys.iter_mut().for_each(|v| *v = *v * wv + bv);
            }
        };
        let (out, mean, rstd) = with_slice::<T, _>(&xc, |s| {
            norm_rows::<T, C>(
                s,
                nb * num_groups,
                cg * hw,
                eps,
                (None, None),
                Some(&affine),
            )
        })??;
        Ok((
            Tensor::from_vec(out, x.dims())?,
            Tensor::from_vec(mean, [nb, num_groups])?,
            Tensor::from_vec(rstd, [nb, num_groups])?,
        ))
    })
}

/// `F.normalize`: `x / max(||x||_p, eps)` with the `p`-norm taken along `dim` (NaN
/// norms propagate). Floating inputs only; 16-bit inputs compute in f32.
pub fn normalize(x: &Tensor, p: f64, dim: i64, eps: f64) -> Result<Tensor> {
    let op = "normalize";
    check_norm(op, x, p)?;
    let geom = line_geometry(x, dim)?;
    let xc = x.try_contiguous()?;
    float_kernel!(x.dtype(), op, |T, C| {
        let epsc = eps as C;
        let out = with_slice::<T, _>(&xc, |s| {
            map_lines::<T, C>(&[s], geom, |ins, out| {
                let nrm = vector_norm::<C>(ins[0], p);
                let d = if nrm < epsc { epsc } else { nrm };
                for (o, &v) in out.iter_mut().zip(ins[0]) {
                    *o = v / d;
                }
            })
        })??;
        Tensor::from_vec(out, x.dims())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wide_sum` adds element `i` of a long row into lane `i mod 64`, in order, then
    /// folds the lanes as `lane_sum` does: the order the AVX-512 row kernels share with
    /// it, which keeps layer norm's bits the same at every width.
    #[test]
    fn wide_sum_adds_each_lane_in_order() {
        for n in [256usize, 300, 1000, 4103] {
            let xs: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1.0e-3 + (i as f32).sin() * 1.0e3)
                .collect();
            let mut lanes = [0f32; 64];
            for (i, &x) in xs.iter().enumerate() {
                lanes[i % 64] += x * x;
            }
            let got = wide_sum(&xs, |v| v * v);
            assert_eq!(got.to_bits(), lane_sum(&lanes).to_bits(), "n = {n}");
        }
    }

    /// The layer-norm backward's vector forms (AVX-512 and AVX2, as the CPU has them)
    /// give the bits of the baseline form: the input gradient and the partial weight
    /// and bias gradients, with a weight and without, on rows with a vector tail.
    #[test]
    fn ln_backward_forms_give_the_baseline_bits() {
        let (rows, n) = (7usize, 75usize);
        let val = |i: usize, k: usize| ((i * k % 997) as f32 - 498.0) * 3.1e-3 + (i as f32).cos();
        let g: Vec<f32> = (0..rows * n).map(|i| val(i, 31)).collect();
        let x: Vec<f32> = (0..rows * n).map(|i| val(i, 17)).collect();
        let w: Vec<f32> = (0..n).map(|i| 0.5 + val(i, 7) * 0.1).collect();
        let mean: Vec<f32> = (0..rows).map(|r| val(r, 3) * 0.1).collect();
        let rstd: Vec<f32> = (0..rows).map(|r| 1.0 + val(r, 5).abs()).collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for w in [Some(&w[..]), None] {
            let lr = LnRows {
                g: &g,
                x: &x,
                mean: &mean,
                rstd: &rstd,
                w,
                n,
                first: 0,
            };
            let mut want = vec![0f32; rows * n];
            let (ww, wb) = ln_backward_chunk(&lr, &mut want);
            #[allow(clippy::type_complexity)]
            let mut forms: Vec<(
                &str,
                unsafe fn(&LnRows<'_, f32>, &mut [f32]) -> (Vec<f32>, Vec<f32>),
            )> = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    forms.push(("avx512", ln_backward_chunk_avx512::<f32>));
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    forms.push(("avx2", ln_backward_chunk_avx2::<f32>));
                }
            }
            for (name, form) in forms {
                let mut got = vec![0f32; rows * n];
                // SAFETY: the CPU has the form's features (checked above).
                let (gw, gb) = unsafe { form(&lr, &mut got) };
                let what = format!("{name}, weight {}", w.is_some());
                assert_eq!(bits(&got), bits(&want), "input gradient, {what}");
                assert_eq!(bits(&gw), bits(&ww), "weight gradient, {what}");
                assert_eq!(bits(&gb), bits(&wb), "bias gradient, {what}");
            }
        }
    }
}
