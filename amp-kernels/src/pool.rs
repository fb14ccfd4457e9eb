//! Pooling kernels: max / average pooling with PyTorch's geometry (kernel, stride,
//! padding, dilation, `ceil_mode`, `count_include_pad`, `divisor_override`), adaptive
//! average / max pooling, fractional max pooling, and the plane gather / scatter that
//! max-pool backward, max-unpool and the pads are built from.
//!
//! Every op works on `[..., S_1, ..., S_n]` inputs: the trailing `n` (1 to 3) dims are the
//! spatial ones and every leading index is an independent *plane* (`N * C` of them for
//! `[N, C, ...]`). Planes run in parallel ([`amp_tensor::parallel`]); f16/bf16 compute in
//! f32 and round once.
//! Max-pool indices are flat positions inside an input plane (int64), as PyTorch's.

use amp_tensor::parallel::{for_each_chunk_mut, SendPtr};
use amp_tensor::pool::{try_collect, try_filled, try_with_capacity, try_zeroed};
use amp_tensor::{cast_into, cast_slice, ensure, Error, Result, Tensor};
use num_traits::{Float, Zero};

use crate::compute::{with_slice, Real};

/// The valid input positions of one window along one dim:
/// `start + j * step` for `j < count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// First valid input position.
    pub start: usize,
    /// Number of valid positions.
    pub count: usize,
    /// Distance between positions (the dilation).
    pub step: usize,
}

/// The windows of one spatial dim (one per output position) and, per output position,
/// the factor it contributes to an average's divisor.
#[derive(Clone, Debug, PartialEq)]
pub struct DimWindows {
    /// One window per output position.
    pub windows: Vec<Window>,
    /// Divisor factor per output position (the divisor is the product over dims).
    pub divisors: Vec<f64>,
}

impl DimWindows {
    fn trivial() -> DimWindows {
        DimWindows {
            windows: vec![Window {
                start: 0,
                count: 1,
                step: 1,
            }],
            divisors: vec![1.0],
        }
    }

    /// Number of output positions.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether there is no output position.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

/// Split `x`'s dims into (leading, spatial) for an `n`-d spatial op that accepts
/// `n + 1` (unbatched) or `n + 2` dims, checking that the non-batch dims are non-empty.
pub fn split_spatial(
    op: &'static str,
    dims: &[usize],
    n: usize,
) -> Result<(Vec<usize>, Vec<usize>)> {
    ensure!(
        !(dims.len() != n + 1 && dims.len() != n + 2),
        invalid(
            op,
            "{op}: Expected {}D or {}D input, but got input of size: {dims:?}",
            n + 1,
            n + 2
        )
    );
    let k = dims.len() - n;
    ensure!(!dims[dims.len() - n - 1..].contains(&0), invalid(op, "{op}: Expected input's non-batch dimensions to have positive length, but input has a shape of {dims:?}"));
    Ok((dims[..k].to_vec(), dims[k..].to_vec()))
}

fn prod(v: &[usize]) -> usize {
    v.iter().product()
}

/// `a * b`, saturating: a buffer sized by a product that does not fit fails to
/// allocate ([`Error::OutOfMemory`]) instead of wrapping.
fn times(a: usize, b: usize) -> usize {
    a.saturating_mul(b)
}

/// PyTorch's `pooling_output_shape`.
pub fn pool_output_size(
    input: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    ceil_mode: bool,
) -> i64 {
    let (i, k, s, p, d) = (
        input as i64,
        kernel as i64,
        stride as i64,
        pad as i64,
        dilation as i64,
    );
    let num = i + 2 * p - d * (k - 1) - 1 + if ceil_mode { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    if ceil_mode && (out - 1) * s >= i + p {
        out -= 1;
    }
    out
}

/// The parameters of a (max or average) pooling window along each spatial dim.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolParams {
    /// Window size per dim.
    pub kernel: Vec<usize>,
    /// Step per dim.
    pub stride: Vec<usize>,
    /// Implicit padding per dim (both sides).
    pub padding: Vec<usize>,
    /// Dilation per dim (1 for average pooling).
    pub dilation: Vec<usize>,
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
}

impl PoolParams {
    fn check(&self, op: &'static str, n: usize) -> Result<()> {
        let all = [&self.kernel, &self.stride, &self.padding, &self.dilation];
        ensure!(
            all.iter().all(|v| v.len() == n),
            invalid(
                op,
                "{op}: kernel_size, stride, padding and dilation must have {n} elements"
            )
        );
        ensure!(
            !self.kernel.contains(&0),
            invalid(op, "kernel size should be greater than zero")
        );
        ensure!(
            !self.stride.contains(&0),
            invalid(op, "stride should be greater than zero")
        );
        ensure!(
            !self.dilation.contains(&0),
            invalid(op, "dilation should be greater than zero")
        );
        for (k, p) in self.kernel.iter().zip(&self.padding) {
            ensure!(*p <= k / 2, invalid(op, "pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k}"));
        }
        Ok(())
    }

    /// The windows along each dim of an input with spatial sizes `input`; `avg` uses
    /// average pooling's divisor rule (`count_include_pad`).
    pub fn windows(
        &self,
        op: &'static str,
        input: &[usize],
        avg: Option<bool>,
    ) -> Result<Vec<DimWindows>> {
        self.check(op, input.len())?;
        let mut out = Vec::with_capacity(input.len());
        for (d, &size) in input.iter().enumerate() {
            let (k, s, p, dil) = (
                self.kernel[d] as i64,
                self.stride[d] as i64,
                self.padding[d] as i64,
                self.dilation[d] as i64,
            );
            let o = pool_output_size(
                size,
                k as usize,
                s as usize,
                p as usize,
                dil as usize,
                self.ceil_mode,
            );
            ensure!(o > 0, invalid(op, "Given input size {input:?}, calculated output size is too small (non-positive)"));
            let n = size as i64;
            let mut dw = DimWindows {
                windows: try_with_capacity(o as usize)?,
                divisors: try_with_capacity(o as usize)?,
            };
            for i in 0..o {
                let start = i * s - p;
                match avg {
                    Some(include_pad) => {
                        let end = (start + k).min(n + p);
                        let pool = end - start;
                        let (lo, hi) = (start.max(0), end.min(n));
                        let count = (hi - lo).max(0);
                        dw.windows.push(Window {
                            start: lo as usize,
                            count: count as usize,
                            step: 1,
                        });
                        dw.divisors.push(if include_pad {
                            pool as f64
                        } else {
                            count as f64
                        });
                    }
                    None => {
                        // First j with start + j * dil >= 0, last with < n.
                        let j0 = if start < 0 {
                            (-start + dil - 1) / dil
                        } else {
                            0
                        };
                        let mut count = 0;
                        let mut j = j0;
                        while j < k && start + j * dil < n {
                            count += 1;
                            j += 1;
                        }
                        dw.windows.push(Window {
                            start: (start + j0 * dil).max(0) as usize,
                            count: count as usize,
                            step: dil as usize,
                        });
                        dw.divisors.push(count as f64);
                    }
                }
            }
            out.push(dw);
        }
        Ok(out)
    }
}

/// The windows of adaptive pooling from `input` to `output` positions along one dim:
/// `[floor(o * in / out), ceil((o + 1) * in / out))`; [`Error::OutOfMemory`] when the
/// windows cannot be allocated.
pub fn adaptive_windows(input: usize, output: usize) -> Result<DimWindows> {
    let mut dw = DimWindows {
        windows: try_with_capacity(output)?,
        divisors: try_with_capacity(output)?,
    };
    for o in 0..output {
        let start = (o * input) / output;
        let end = ((o + 1) * input).div_ceil(output);
        dw.windows.push(Window {
            start,
            count: end - start,
            step: 1,
        });
        dw.divisors.push((end - start) as f64);
    }
    Ok(dw)
}

/// PyTorch's fractional max-pool interval starts for one dim and one `sample` in `[0, 1)`;
/// [`Error::OutOfMemory`] when the windows cannot be allocated.
pub fn fractional_windows<C: Real>(
    sample: C,
    input: usize,
    output: usize,
    pool: usize,
) -> Result<DimWindows> {
    let mut seq = try_zeroed::<usize>(output)?;
    if output > 1 {
        let alpha = C::from_f64c((input - pool) as f64) / C::from_f64c((output - 1) as f64);
        for (i, s) in seq.iter_mut().enumerate().take(output - 1) {
            let a = ((C::from_f64c(i as f64) + sample) * alpha).to_f64c() as i64;
            let b = (sample * alpha).to_f64c() as i64;
            *s = (a - b).max(0) as usize;
        }
    }
    if output > 0 {
        seq[output - 1] = input - pool;
    }
    Ok(DimWindows {
        windows: try_collect(
            output,
            seq.into_iter().map(|start| Window {
                start,
                count: pool,
                step: 1,
            }),
        )?,
        divisors: try_filled(output, pool as f64)?,
    })
}

/// Pad the per-dim geometry to three dims (leading trivial dims).
fn to3(geo: &[DimWindows], spatial: &[usize]) -> ([DimWindows; 3], [usize; 3]) {
    let pad = 3 - geo.len();
    let g: [DimWindows; 3] = std::array::from_fn(|i| {
        if i < pad {
            DimWindows::trivial()
        } else {
            geo[i - pad].clone()
        }
    });
    let s: [usize; 3] = std::array::from_fn(|i| if i < pad { 1 } else { spatial[i - pad] });
    (g, s)
}

/// Visit every output position of a 3-d geometry with its flat index and window.
#[inline]
fn for_each_window(g: &[DimWindows; 3], mut f: impl FnMut(usize, [Window; 3], f64)) {
    let mut o = 0;
    for (a, da) in g[0].windows.iter().zip(&g[0].divisors) {
        for (b, db) in g[1].windows.iter().zip(&g[1].divisors) {
            for (c, dc) in g[2].windows.iter().zip(&g[2].divisors) {
                f(o, [*a, *b, *c], da * db * dc);
                o += 1;
            }
        }
    }
}

#[inline]
fn window_positions(w: [Window; 3], s: [usize; 3], mut f: impl FnMut(usize)) {
    for i in 0..w[0].count {
        let p0 = (w[0].start + i * w[0].step) * s[1];
        for j in 0..w[1].count {
            let p1 = (p0 + w[1].start + j * w[1].step) * s[2];
            for k in 0..w[2].count {
                f(p1 + w[2].start + k * w[2].step);
            }
        }
    }
}

fn check_geo(op: &'static str, geos: &[Vec<DimWindows>], planes: usize, n: usize) -> Result<()> {
    ensure!(
        !(geos.is_empty() || (geos.len() != 1 && geos.len() != planes)),
        invalid(op, "one geometry, or one per plane, is needed")
    );
    ensure!(
        geos.iter().all(|g| g.len() == n),
        invalid(op, "the geometry must have one entry per spatial dim")
    );
    let out: Vec<usize> = geos[0].iter().map(DimWindows::len).collect();
    if geos
        .iter()
        .any(|g| g.iter().map(DimWindows::len).ne(out.iter().copied()))
    {
        return Err(Error::invalid(
            op,
            "every plane must have the same output size",
        ));
    }
    Ok(())
}

/// Max pooling of the trailing `geos[0].len()` dims of `x` over windows `geos` (one
/// geometry shared by all planes, or one per plane): `(values, flat indices)`. NaN
/// propagates (the last NaN of a window wins), as PyTorch's CPU kernels.
pub fn max_pool_windows(
    op: &'static str,
    x: &Tensor,
    geos: &[Vec<DimWindows>],
) -> Result<(Tensor, Tensor)> {
    crate::ensure_float(op, x)?;
    let n = geos.first().map_or(0, Vec::len);
    ensure!(
        !(n == 0 || n > 3 || x.rank() < n),
        invalid(op, "1 to 3 spatial dims are supported")
    );
    let split = x.rank() - n;
    let (lead, spatial) = (x.dims()[..split].to_vec(), x.dims()[split..].to_vec());
    let planes = prod(&lead);
    check_geo(op, geos, planes, n)?;
    let in_len = prod(&spatial);
    let out_sp: Vec<usize> = geos[0].iter().map(DimWindows::len).collect();
    let out_len = prod(&out_sp);
    let mut out_dims = lead.clone();
    out_dims.extend(&out_sp);
    let g3: Vec<([DimWindows; 3], [usize; 3])> = geos.iter().map(|g| to3(g, &spatial)).collect();
    float_kernel!(x.dtype(), op, |T, C| {
        with_slice::<T, _>(x, |xs| {
            let mut vals = try_zeroed::<C>(times(planes, out_len))?;
            let mut idx = try_zeroed::<i64>(times(planes, out_len))?;
            if out_len > 0 && in_len > 0 {
                let idx_at = SendPtr(idx.as_mut_ptr());
                for_each_chunk_mut(&mut vals, out_len, &|p, ov| {
                    // SAFETY: plane `p`'s indices, elements `p * out_len..` of `idx`
                    // (as long as `vals`), which no other plane's task touches; `idx`
                    // is not used otherwise until the loop returns.
                    let oi =
                        unsafe { std::slice::from_raw_parts_mut(idx_at.at(p * out_len), out_len) };
                    let mut buf = vec![C::zero(); in_len];
                    cast_into(&xs[p * in_len..][..in_len], &mut buf);
                    let (g, s) = &g3[if g3.len() == 1 { 0 } else { p }];
                    for_each_window(g, |o, w, _| {
                        let mut best = C::neg_infinity();
                        let mut at = ((w[0].start * s[1]) + w[1].start) * s[2] + w[2].start;
                        window_positions(w, *s, |q| {
                            let v = buf[q];
                            if v > best || v.is_nan() {
                                best = v;
                                at = q;
                            }
                        });
                        ov[o] = best;
                        oi[o] = at as i64;
                    });
                });
            }
            Ok((
                Tensor::from_vec(cast_slice::<C, T>(&vals)?, &out_dims)?,
                Tensor::from_vec(idx, &out_dims)?,
            ))
        })?
    })
}

/// Average pooling of the trailing dims of `x` over windows `geo`: each output is the
/// window's sum divided by the product of the per-dim divisors, or `divisor_override`.
pub fn avg_pool_windows(
    op: &'static str,
    x: &Tensor,
    geo: &[DimWindows],
    divisor_override: Option<f64>,
) -> Result<Tensor> {
    crate::ensure_float(op, x)?;
    let n = geo.len();
    ensure!(
        !(n == 0 || n > 3 || x.rank() < n),
        invalid(op, "1 to 3 spatial dims are supported")
    );
    let split = x.rank() - n;
    let (lead, spatial) = (x.dims()[..split].to_vec(), x.dims()[split..].to_vec());
    let planes = prod(&lead);
    let in_len = prod(&spatial);
    let out_sp: Vec<usize> = geo.iter().map(DimWindows::len).collect();
    let out_len = prod(&out_sp);
    let mut out_dims = lead;
    out_dims.extend(&out_sp);
    let (g, s) = to3(geo, &spatial);
    float_kernel!(x.dtype(), op, |T, C| {
        with_slice::<T, _>(x, |xs| {
            let mut vals = try_zeroed::<C>(times(planes, out_len))?;
            if out_len > 0 && in_len > 0 {
                for_each_chunk_mut(&mut vals, out_len, &|p, ov| {
                    let mut buf = vec![C::zero(); in_len];
                    cast_into(&xs[p * in_len..][..in_len], &mut buf);
                    for_each_window(&g, |o, w, div| {
                        let mut acc = C::zero();
                        window_positions(w, s, |q| acc += buf[q]);
                        let div = divisor_override.unwrap_or(div);
                        ov[o] = acc / C::from_f64c(div);
                    });
                });
            }
            Tensor::from_vec(cast_slice::<C, T>(&vals)?, &out_dims)
        })?
    })
}

/// The adjoint of [`avg_pool_windows`] (its gradient): `g` has the pooled shape; the
/// result has the trailing spatial sizes `input`.
pub fn avg_pool_windows_backward(
    op: &'static str,
    g: &Tensor,
    input: &[usize],
    geo: &[DimWindows],
    divisor_override: Option<f64>,
) -> Result<Tensor> {
    crate::ensure_float(op, g)?;
    let n = geo.len();
    let out_sp: Vec<usize> = geo.iter().map(DimWindows::len).collect();
    if n == 0 || n > 3 || input.len() != n || g.rank() < n || g.dims()[g.rank() - n..] != out_sp[..]
    {
        return Err(Error::shape_mismatch(op, g.dims(), &out_sp));
    }
    let lead = g.dims()[..g.rank() - n].to_vec();
    let planes = prod(&lead);
    let in_len = prod(input);
    let out_len = prod(&out_sp);
    let mut in_dims = lead;
    in_dims.extend(input);
    let (g3, s) = to3(geo, input);
    float_kernel!(g.dtype(), op, |T, C| {
        with_slice::<T, _>(g, |gs| {
            let mut gi = try_zeroed::<C>(times(planes, in_len))?;
            if out_len > 0 && in_len > 0 {
                for_each_chunk_mut(&mut gi, in_len, &|p, gp| {
                    let mut buf = vec![C::zero(); out_len];
                    cast_into(&gs[p * out_len..][..out_len], &mut buf);
                    for_each_window(&g3, |o, w, div| {
                        let div = divisor_override.unwrap_or(div);
                        let v = buf[o] / C::from_f64c(div);
                        window_positions(w, s, |q| gp[q] += v);
                    });
                });
            }
            Tensor::from_vec(cast_slice::<C, T>(&gi)?, in_dims.clone())
        })?
    })
}

/// The row of the index tensor plane `p` of `planes` uses, given `rows` index rows.
fn check_rows(op: &'static str, planes: usize, rows: usize) -> Result<usize> {
    ensure!(
        rows != 0 && planes.is_multiple_of(rows),
        invalid(
            op,
            "{op}: {rows} index planes do not divide {planes} planes"
        )
    );
    Ok(planes / rows)
}

fn index_vec(op: &'static str, idx: &Tensor) -> Result<Vec<i64>> {
    match idx.dtype() {
        amp_tensor::DType::I64 => idx.host_vec_as(),
        d => Err(Error::invalid(
            op,
            format!("{op}: expected int64 indices, got {d}"),
        )),
    }
}

/// Gather within planes: `x` is `[lead..., S_in...]` (`spatial_rank` trailing dims),
/// `idx` int64 `[rows..., S_out...]` with flat positions inside an input plane; plane `p`
/// uses index row `p / (planes / rows)` (so one row serves every plane, `N` rows serve
/// `[N, C]` planes per batch). A negative index reads `fill`. Result: `[lead..., S_out...]`.
pub fn plane_gather(x: &Tensor, spatial_rank: usize, idx: &Tensor, fill: f64) -> Result<Tensor> {
    let op = "plane_gather";
    crate::ensure_float(op, x)?;
    ensure!(
        !(x.rank() < spatial_rank || idx.rank() < spatial_rank),
        invalid(op, "too few dims for the spatial rank")
    );
    let lead = &x.dims()[..x.rank() - spatial_rank];
    let in_len = prod(&x.dims()[x.rank() - spatial_rank..]);
    let out_sp = &idx.dims()[idx.rank() - spatial_rank..];
    let out_len = prod(out_sp);
    let rows = prod(&idx.dims()[..idx.rank() - spatial_rank]);
    let planes = prod(lead);
    let per = check_rows(op, planes, rows)?;
    let iv = index_vec(op, idx)?;
    ensure!(
        iv.iter().all(|&i| i < in_len as i64),
        invalid(op, "index out of range in self")
    );
    let mut out_dims = lead.to_vec();
    out_dims.extend(out_sp);
    float_kernel!(x.dtype(), op, |T, C| {
        with_slice::<T, _>(x, |xs| {
            let fillv: T = amp_tensor::Element::cast(<C as Real>::from_f64c(fill));
            let mut out = try_filled(times(planes, out_len), fillv)?;
            if out_len > 0 {
                for_each_chunk_mut(&mut out, out_len, &|p, op_| {
                    let row = &iv[(p / per) * out_len..][..out_len];
                    let src = &xs[p * in_len..][..in_len];
                    for (d, &i) in op_.iter_mut().zip(row) {
                        if i >= 0 {
                            *d = src[i as usize];
                        }
                    }
                });
            }
            Tensor::from_vec(out, &out_dims)
        })?
    })
}

/// The adjoint of [`plane_gather`]: `g` is `[lead..., S_out...]`; values are added (or,
/// with `accumulate = false`, written: the last write wins) at their index into zeros of
/// `[lead..., input...]`; negative indices are skipped.
pub fn plane_scatter(
    g: &Tensor,
    idx: &Tensor,
    input: &[usize],
    accumulate: bool,
) -> Result<Tensor> {
    let op = if accumulate {
        "plane_scatter_add"
    } else {
        "plane_scatter"
    };
    crate::ensure_float(op, g)?;
    let n = input.len();
    if g.rank() < n || idx.rank() < n || g.dims()[g.rank() - n..] != idx.dims()[idx.rank() - n..] {
        return Err(Error::shape_mismatch(op, g.dims(), idx.dims()));
    }
    let lead = &g.dims()[..g.rank() - n];
    let in_len = prod(input);
    let out_len = prod(&g.dims()[g.rank() - n..]);
    let rows = prod(&idx.dims()[..idx.rank() - n]);
    let planes = prod(lead);
    let per = check_rows(op, planes, rows)?;
    let iv = index_vec(op, idx)?;
    ensure!(
        iv.iter().all(|&i| i < in_len as i64),
        invalid(
            op,
            "Found an invalid max index (output volumes are of size {input:?})"
        )
    );
    let mut in_dims = lead.to_vec();
    in_dims.extend(input);
    float_kernel!(g.dtype(), op, |T, C| {
        with_slice::<T, _>(g, |gs| {
            let mut acc = try_zeroed::<C>(times(planes, in_len))?;
            if in_len > 0 && out_len > 0 {
                for_each_chunk_mut(&mut acc, in_len, &|p, a| {
                    let row = &iv[(p / per) * out_len..][..out_len];
                    let mut buf = vec![C::zero(); out_len];
                    cast_into(&gs[p * out_len..][..out_len], &mut buf);
                    for (&v, &i) in buf.iter().zip(row) {
                        if i >= 0 {
                            if accumulate {
                                a[i as usize] += v;
                            } else {
                                a[i as usize] = v;
                            }
                        }
                    }
                });
            }
            Tensor::from_vec(cast_slice::<C, T>(&acc)?, in_dims.clone())
        })?
    })
}
