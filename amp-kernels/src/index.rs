//! Joining and indexing: `cat`, `stack`, `index_select`, `gather`, the scatter family
//! (`scatter`, `scatter_add`, `index_add`, `index_copy`, `index_put`), `masked_fill`,
//! `embedding` (+ its dense backward) and `one_hot`.
//!
//! Inputs may have any strides; every result is a new contiguous tensor (the in-place
//! PyTorch ops are out of place here). Indices are validated before anything is
//! written and errors use PyTorch's wording. Accumulating ops (`scatter_add`,
//! `index_add`, `index_put` with `accumulate`, `embedding_backward`) add in the compute
//! type (f32 for f16/bf16) and round once.

use std::sync::RwLockReadGuard;

use amp_tensor::{
    broadcast_shapes, cast_slice, ensure, promote_types, with_dtype, wrap_dim, DType, Element,
    Error, Layout, Result, Storage, Tensor,
};

use amp_tensor::pool::{try_collect, try_with_capacity, try_zeroed};

use crate::reduce::{line_geometry, num_kernel, Num};

/// The elements of an int64 (or, with `allow_int32`, int32) index tensor as i64.
///
/// A device index is read back to the host (one synchronisation): the checks (range,
/// PyTorch's messages) and the offsets the device kernels take are computed here.
fn index_values(op: &'static str, index: &Tensor, allow_int32: bool) -> Result<Vec<i64>> {
    match index.dtype() {
        DType::I64 => index.try_to_vec_as(),
        DType::I32 if allow_int32 => index.try_to_vec_as(),
        d => Err(Error::invalid(
            op,
            format!(
                "{op}(): Expected dtype {} for index (got {d})",
                if allow_int32 { "int32/int64" } else { "int64" }
            ),
        )),
    }
}

/// The contiguous elements of `t` (whose storage `guard` is) as `T`.
fn contiguous_slice<'a, T: Element>(
    guard: &'a RwLockReadGuard<'_, Storage>,
    t: &Tensor,
) -> Result<&'a [T]> {
    let all = T::slice(guard.cpu()?).expect("dtype matches storage");
    Ok(&all[t.layout().contiguous_range().expect("contiguous tensor")])
}

/// `out` (widened to `N`) as a tensor of `x`'s dtype and shape.
fn narrow_like<N: Element, T: Element>(acc: &[N], x: &Tensor) -> Result<Tensor> {
    Tensor::from_vec(cast_slice::<N, T>(acc)?, x.dims())
}

/// The number of elements of `dims`, saturating: a count that does not fit makes the
/// allocation sized by it fail ([`Error::OutOfMemory`]) instead of wrapping.
fn count(dims: &[usize]) -> usize {
    dims.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}

fn out_of_range(op: &'static str) -> Error {
    Error::invalid(op, "index out of range in self")
}

// ----- cat / stack ------------------------------------------------------------------------

/// Concatenate along `dim` (negative wraps) as PyTorch's `torch.cat`: the result has
/// the promoted dtype of all inputs; sizes must match except along `dim`; 1-D empty
/// tensors are skipped (legacy behaviour).
pub fn cat(ts: &[Tensor], dim: i64) -> Result<Tensor> {
    let dtype = ts
        .iter()
        .map(|t| t.dtype())
        .reduce(promote_types)
        .ok_or_else(|| {
            Error::invalid("cat", "torch.cat(): expected a non-empty list of Tensors")
        })?;
    if let Some(i) = ts.iter().position(|t| t.rank() == 0) {
        return Err(Error::invalid(
            "cat",
            format!("zero-dimensional tensor (at position {i}) cannot be concatenated"),
        ));
    }
    let parts: Vec<(usize, &Tensor)> = ts
        .iter()
        .enumerate()
        .filter(|(_, t)| !(t.rank() == 1 && t.elem_count() == 0))
        .collect();
    let Some(&(_, first)) = parts.first() else {
        return Ok(Tensor::zeros([0usize], dtype));
    };
    let rank = first.rank();
    let d = wrap_dim(dim, rank)?;
    for &(k, t) in &parts {
        ensure!(
            t.rank() == rank,
            invalid(
                "cat",
                "Tensors must have same number of dimensions: got {rank} and {}",
                t.rank()
            )
        );
        if let Some(a) = (0..rank).find(|&a| a != d && t.dims()[a] != first.dims()[a]) {
            return Err(Error::invalid(
                "cat",
                format!(
                    "Sizes of tensors must match except in dimension {d}. Expected size {} but got size {} for tensor number {k} in the list.",
                    first.dims()[a],
                    t.dims()[a]
                ),
            ));
        }
    }
    let mut shape = first.dims().to_vec();
    shape[d] = parts.iter().map(|(_, t)| t.dims()[d]).sum();
    #[cfg(feature = "cuda")]
    {
        let refs: Vec<&Tensor> = parts.iter().map(|(_, t)| *t).collect();
        if crate::compute::device_of("cat", &refs)?.is_some() {
            return crate::cuda::route::cat(&refs, d, &shape, dtype);
        }
    }
    let outer: usize = shape[..d].iter().product();
    let inner: usize = shape[d + 1..].iter().product();
    let srcs: Vec<Tensor> = parts
        .iter()
        .map(|(_, t)| t.to_dtype(dtype)?.try_contiguous())
        .collect::<Result<_>>()?;
    let guards: Vec<_> = srcs.iter().map(|t| t.storage()).collect();
    with_dtype!(dtype, T => {
        let slices: Vec<&[T]> = guards.iter().zip(&srcs).map(|(g, t)| contiguous_slice::<T>(g, t)).collect::<Result<_>>()?;
        let lens: Vec<usize> = srcs.iter().map(|t| t.dims()[d] * inner).collect();
        let mut out = try_with_capacity(count(&shape))?;
        for o in 0..outer {
            for (s, &len) in slices.iter().zip(&lens) {
                out.extend_from_slice(&s[o * len..(o + 1) * len]);
            }
        }
        Tensor::from_vec(out, shape)
    })
}

/// Join equally shaped tensors along a new dim `dim` (in `0..=rank`; negative wraps).
pub fn stack(ts: &[Tensor], dim: i64) -> Result<Tensor> {
    let first = ts
        .first()
        .ok_or_else(|| Error::invalid("stack", "stack expects a non-empty TensorList"))?;
    if let Some((k, t)) = ts
        .iter()
        .enumerate()
        .find(|(_, t)| t.dims() != first.dims())
    {
        return Err(Error::invalid(
            "stack",
            format!(
                "stack expects each tensor to be equal size, but got {:?} at entry 0 and {:?} at entry {k}",
                first.dims(),
                t.dims()
            ),
        ));
    }
    let d = wrap_dim(dim, first.rank() + 1)?;
    let us: Vec<Tensor> = ts.iter().map(|t| t.unsqueeze(d)).collect::<Result<_>>()?;
    cat(&us, d as i64)
}

// ----- selection --------------------------------------------------------------------------

/// Entries `idx` of dim `dim` of `x`, as a tensor of `shape` (same element count).
fn take(op: &'static str, x: &Tensor, dim: i64, idx: &[i64], shape: Vec<usize>) -> Result<Tensor> {
    let (outer, n, inner) = line_geometry(x, dim)?;
    if idx.iter().any(|&i| i < 0 || i as usize >= n) {
        return Err(out_of_range(op));
    }
    crate::compute::on_device!(
        op,
        [x],
        crate::cuda::route::take_rows(x, (outer, n, inner), idx, shape)
    );
    let xc = x.try_contiguous()?;
    let guard = xc.storage();
    with_dtype!(x.dtype(), T => {
        let s = contiguous_slice::<T>(&guard, &xc)?;
        let mut out = try_with_capacity(count(&[outer, idx.len(), inner]))?;
        for o in 0..outer {
            for &i in idx {
                out.extend_from_slice(&s[(o * n + i as usize) * inner..][..inner]);
            }
        }
        Tensor::from_vec(out, shape)
    })
}

/// The entries `index` (a 1-D or 0-dim int64/int32 tensor) of dim `dim`; an index
/// outside `0..size` fails with PyTorch's "index out of range in self".
pub fn index_select(x: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    let op = "index_select";
    let idx = index_values(op, index, true)?;
    ensure!(
        index.rank() <= 1,
        invalid(op, "index_select(): Index is supposed to be a vector")
    );
    let mut shape = x.dims().to_vec();
    if x.rank() == 0 {
        ensure!(
            idx.len() == 1,
            invalid(
                op,
                "index_select(): Index to scalar can have only 1 value, got {} value(s)",
                idx.len()
            )
        );
    } else {
        shape[wrap_dim(dim, x.rank())?] = idx.len();
    }
    take(op, x, dim, &idx, shape)
}

/// Check the rank and size rules of `gather`/`scatter`: `index` has `x`'s rank, and is
/// no larger than `x` except along `d` (nor than `src`, when given, anywhere).
fn check_scatter_shapes(
    op: &'static str,
    x: &Tensor,
    d: usize,
    index: &Tensor,
    src: Option<&Tensor>,
) -> Result<()> {
    let rank = x.rank().max(1);
    let irank = index.rank().max(1);
    ensure!(
        irank == rank,
        invalid(
            op,
            "Index tensor must have the same number of dimensions as self tensor"
        )
    );
    if let Some(s) = src {
        ensure!(
            s.rank().max(1) == rank,
            invalid(
                op,
                "Index tensor must have the same number of dimensions as src tensor"
            )
        );
    }
    let dims = |t: &Tensor| {
        if t.rank() == 0 {
            vec![1]
        } else {
            t.dims().to_vec()
        }
    };
    let (xd, id) = (dims(x), dims(index));
    let bad_self = (0..rank).any(|a| a != d && id[a] > xd[a]);
    let bad_src = src.is_some_and(|s| {
        let sd = dims(s);
        (0..rank).any(|a| id[a] > sd[a])
    });
    if bad_self || bad_src {
        let msg = match src {
            Some(s) => format!(
                "Expected index {id:?} to be smaller than self {xd:?} apart from dimension {d} and to be smaller size than src {:?}",
                dims(s)
            ),
            None => format!(
                "Size does not match at dimension {d} expected index {id:?} to be smaller than self {xd:?} apart from dimension {d}"
            ),
        };
        return Err(Error::invalid(op, msg));
    }
    Ok(())
}

/// `(x strides with dim d zeroed, stride of d)` for offsets of positions of `index`.
fn strides_without(strides: &[usize], d: usize) -> (Vec<usize>, usize) {
    let mut s = strides.to_vec();
    let sd = s.get(d).copied().unwrap_or(0);
    if let Some(v) = s.get_mut(d) {
        *v = 0;
    }
    (s, sd)
}

/// Check every index lies in `0..size` (PyTorch's gather/scatter wording otherwise).
fn check_bounds(op: &'static str, idx: &[i64], d: usize, size: usize) -> Result<()> {
    match idx.iter().find(|&&i| i < 0 || i as usize >= size) {
        Some(&index) => Err(Error::IndexOutOfRange {
            op,
            index,
            dim: d,
            size,
        }),
        None => Ok(()),
    }
}

/// `out[p] = x[p with dim d replaced by index[p]]` over every position `p` of the
/// int64 `index` (same rank as `x`, no larger than it except along `dim`).
pub fn gather(x: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    let op = "gather";
    let idx = index_values(op, index, false)?;
    let d = wrap_dim(dim, x.rank())?;
    check_scatter_shapes(op, x, d, index, None)?;
    let size = if x.rank() == 0 { 1 } else { x.dims()[d] };
    check_bounds(op, &idx, d, size)?;
    let (strides, sd) = strides_without(x.strides(), d);
    let base = if x.rank() == 0 {
        Layout::new(
            index.dims().to_vec(),
            vec![0; index.rank()],
            x.layout().offset(),
        )
    } else {
        Layout::new(index.dims().to_vec(), strides, x.layout().offset())
    };
    crate::compute::on_device!(op, [x], {
        let offsets = base
            .offsets()
            .zip(&idx)
            .map(|(b, &i)| (b + i as usize * sd) as i64)
            .collect();
        crate::cuda::route::take(x, offsets, index.dims())
    });
    let guard = x.storage();
    with_dtype!(x.dtype(), T => {
        let s = T::slice(guard.cpu()?).expect("dtype matches storage");
        let out: Vec<T> = try_collect(idx.len(), base.offsets().zip(&idx).map(|(b, &i)| s[b + i as usize * sd]))?;
        Tensor::from_vec(out, index.dims())
    })
}

fn scatter_impl(
    op: &'static str,
    x: &Tensor,
    dim: i64,
    index: &Tensor,
    src: &Tensor,
    accumulate: bool,
) -> Result<Tensor> {
    let idx = index_values(op, index, false)?;
    ensure!(
        src.dtype() == x.dtype(),
        invalid(
            op,
            "{op}(): Expected self.dtype to be equal to src.dtype (got {} and {})",
            x.dtype(),
            src.dtype()
        )
    );
    let d = wrap_dim(dim, x.rank())?;
    check_scatter_shapes(op, x, d, index, Some(src))?;
    let size = if x.rank() == 0 { 1 } else { x.dims()[d] };
    check_bounds(op, &idx, d, size)?;
    let contiguous = Layout::contiguous(x.dims());
    let (strides, sd) = strides_without(contiguous.strides(), d);
    let irank = index.rank();
    let fit = |s: Vec<usize>| if x.rank() == 0 { vec![0; irank] } else { s };
    let base = Layout::new(index.dims().to_vec(), fit(strides), 0);
    let src_layout = Layout::new(
        index.dims().to_vec(),
        fit(src.strides().to_vec()),
        src.layout().offset(),
    );
    crate::compute::on_device!(op, [x, src], {
        if !accumulate {
            return Err(Error::no_device_kernel(op, x.device()));
        }
        let offsets = base
            .offsets()
            .zip(&idx)
            .map(|(b, &i)| (b + i as usize * sd) as i64)
            .collect();
        crate::cuda::route::put_add(op, x, (src, &src_layout), offsets)
    });
    let guard = src.storage();
    num_kernel!(x.dtype(), |T, N| {
        let mut acc: Vec<N> = x.host_vec_as()?;
        let s = T::slice(guard.cpu()?).expect("dtype matches storage");
        for ((b, so), &i) in base.offsets().zip(src_layout.offsets()).zip(&idx) {
            let v: N = s[so].cast();
            let p = b + i as usize * sd;
            acc[p] = if accumulate { acc[p].nadd(v) } else { v };
        }
        narrow_like::<N, T>(&acc, x)
    })
}

/// `x` with `src[p]` added at `p with dim d replaced by index[p]` for every position
/// `p` of the int64 `index` (out of place; duplicates accumulate in the compute type).
pub fn scatter_add(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    scatter_impl("scatter_add", x, dim, index, src, true)
}

/// `x` with `src[p]` written at `p with dim d replaced by index[p]` (out of place; for
/// duplicate targets the last write in row-major order wins).
pub fn scatter(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    scatter_impl("scatter", x, dim, index, src, false)
}

/// Shared checks of `index_add` / `index_copy`: 1-D index whose length is `src`'s size
/// along `dim`, `src` shaped like `x` elsewhere, same dtypes, indices in range.
fn check_index_src(
    op: &'static str,
    x: &Tensor,
    dim: i64,
    index: &Tensor,
    src: &Tensor,
) -> Result<Vec<i64>> {
    let idx = index_values(op, index, true)?;
    ensure!(
        index.rank() <= 1,
        invalid(op, "{op}(): Index is supposed to be a vector")
    );
    ensure!(
        src.dtype() == x.dtype(),
        invalid(
            op,
            "{op}(): self ({}) and source ({}) must have the same scalar type",
            x.dtype().scalar_type_name(),
            src.dtype().scalar_type_name()
        )
    );
    let d = wrap_dim(dim, x.rank())?;
    let mut want = x.dims().to_vec();
    if x.rank() > 0 {
        want[d] = idx.len();
    }
    let same = if x.rank() == 0 {
        src.elem_count() == 1 && idx.len() == 1
    } else {
        src.dims() == want.as_slice()
    };
    if !same {
        return Err(Error::ShapeMismatch {
            op,
            lhs: src.dims().to_vec(),
            rhs: want,
            hint: Some("source tensor shape must match self tensor shape, excluding the specified dimension, whose size must be the number of indices".into()),
        });
    }
    let n = if x.rank() == 0 { 1 } else { x.dims()[d] };
    if idx.iter().any(|&i| i < 0 || i as usize >= n) {
        return Err(out_of_range(op));
    }
    Ok(idx)
}

fn index_update(
    op: &'static str,
    x: &Tensor,
    dim: i64,
    index: &Tensor,
    src: &Tensor,
    alpha: Option<f64>,
) -> Result<Tensor> {
    let idx = check_index_src(op, x, dim, index, src)?;
    if let Some(a) = alpha {
        ensure!(
            x.dtype().is_floating_point() || a.fract() == 0.0,
            invalid(
                op,
                "For integral input tensors, argument alpha must not be a floating point number."
            )
        );
    }
    let (outer, n, inner) = line_geometry(x, dim)?;
    let k = idx.len();
    crate::compute::on_device!(
        op,
        [x, src],
        match alpha {
            Some(a) =>
                crate::cuda::route::index_add(op, x, (outer, n, inner), &idx, src, (a, None)),
            None => Err(Error::no_device_kernel(op, x.device())),
        }
    );
    num_kernel!(x.dtype(), |T, N| {
        let mut acc: Vec<N> = x.host_vec_as()?;
        let sv: Vec<N> = src.host_vec_as()?;
        let a: Option<N> = alpha.map(|a| a.cast());
        for o in 0..outer {
            for (j, &i) in idx.iter().enumerate() {
                let dst = &mut acc[(o * n + i as usize) * inner..][..inner];
                let s = &sv[(o * k + j) * inner..][..inner];
                match a {
                    Some(a) => dst
                        .iter_mut()
                        .zip(s)
                        .for_each(|(d, &v)| *d = d.nadd(a.nmul(v))),
                    None => dst.copy_from_slice(s),
                }
            }
        }
        narrow_like::<N, T>(&acc, x)
    })
}

/// `x` with `alpha * src[.., j, ..]` added to entry `index[j]` of `dim` (out of place;
/// `index` 1-D int64/int32, `src` shaped like `x` with `index.len()` along `dim`).
pub fn index_add(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor, alpha: f64) -> Result<Tensor> {
    index_update("index_add", x, dim, index, src, Some(alpha))
}

/// `x` with entry `index[j]` of `dim` replaced by `src[.., j, ..]` (out of place).
pub fn index_copy(x: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
    index_update("index_copy", x, dim, index, src, None)
}

/// `x[indices] = values` (or `+=` when `accumulate`) out of place, with PyTorch's
/// advanced indexing: `indices[k]` (an int64/int32 tensor, or `None` for a full slice)
/// indexes dim `k`; the index tensors broadcast together and negative indices wrap.
/// The indexed dims are replaced by the broadcast shape (in place when they are
/// adjacent, else in front), and `values` (same dtype as `x`) broadcasts to that
/// result shape.
pub fn index_put(
    x: &Tensor,
    indices: &[Option<Tensor>],
    values: &Tensor,
    accumulate: bool,
) -> Result<Tensor> {
    let op = "index_put";
    let rank = x.rank();
    ensure!(
        indices.len() <= rank,
        invalid(
            op,
            "too many indices for tensor of dimension {rank} (got {})",
            indices.len()
        )
    );
    ensure!(values.dtype() == x.dtype(), invalid(op, "Index put requires the source and destination dtypes match, got {} for the destination and {} for the source.", x.dtype().scalar_type_name(), values.dtype().scalar_type_name()));
    let adv: Vec<usize> = (0..indices.len())
        .filter(|&k| indices[k].is_some())
        .collect();
    let mut bshape: Vec<usize> = Vec::new();
    for t in indices.iter().flatten() {
        ensure!(
            matches!(t.dtype(), DType::I64 | DType::I32),
            invalid(
                op,
                "tensors used as indices must be long or int tensors (got {})",
                t.dtype()
            )
        );
        bshape = broadcast_shapes(op, &bshape, t.dims())?;
    }
    let xs = Layout::contiguous(x.dims()).strides().to_vec();
    let mut adv_off = try_zeroed::<usize>(count(&bshape))?;
    for &a in &adv {
        let t = indices[a]
            .as_ref()
            .expect("advanced index")
            .broadcast_to(bshape.clone())?;
        let size = x.dims()[a];
        for (o, &i) in adv_off.iter_mut().zip(&t.host_vec_as::<i64>()?) {
            let j = if i < 0 { i + size as i64 } else { i };
            if j < 0 || j >= size as i64 {
                return Err(Error::IndexOutOfRange {
                    op,
                    index: i,
                    dim: a,
                    size,
                });
            }
            *o += j as usize * xs[a];
        }
    }
    let adjacent = adv.windows(2).all(|w| w[1] == w[0] + 1);
    let (pre, post): (Vec<usize>, Vec<usize>) = match (adv.first(), adv.last()) {
        (Some(&f), Some(&l)) if adjacent => ((0..f).collect(), (l + 1..rank).collect()),
        _ => (Vec::new(), (0..rank).filter(|a| !adv.contains(a)).collect()),
    };
    let part = |ds: &[usize]| {
        Layout::new(
            ds.iter().map(|&a| x.dims()[a]).collect::<Vec<_>>(),
            ds.iter().map(|&a| xs[a]).collect(),
            0,
        )
    };
    let (pre_l, post_l) = (part(&pre), part(&post));
    let mut shape: Vec<usize> = pre_l.dims().to_vec();
    shape.extend_from_slice(&bshape);
    shape.extend_from_slice(post_l.dims());
    let vl = values.layout().broadcast_as(&shape).map_err(|_| {
        Error::invalid(
            op,
            format!(
                "shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result of shape {shape:?}",
                values.dims()
            ),
        )
    })?;
    let post_offs: Vec<usize> = try_collect(post_l.elem_count(), post_l.offsets())?;
    let guard = values.storage();
    num_kernel!(x.dtype(), |T, N| {
        let mut acc: Vec<N> = x.host_vec_as()?;
        let vs = T::slice(guard.cpu()?).expect("dtype matches storage");
        let mut voffs = vl.offsets();
        if shape.iter().product::<usize>() > 0 {
            for p in pre_l.offsets() {
                for &a in &adv_off {
                    for &q in &post_offs {
                        let v: N = vs[voffs.next().expect("one value per position")].cast();
                        let pos = p + a + q;
                        acc[pos] = if accumulate { acc[pos].nadd(v) } else { v };
                    }
                }
            }
        }
        narrow_like::<N, T>(&acc, x)
    })
}

/// `x` with `value` (cast to `x`'s dtype) wherever the bool `mask` (broadcast to `x`'s
/// shape) is true.
pub fn masked_fill(x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
    let op = "masked_fill";
    ensure!(
        mask.dtype() == DType::Bool,
        invalid(
            op,
            "masked_fill_ only supports boolean masks, but got mask with dtype {}",
            mask.dtype()
        )
    );
    let ml = mask.layout().broadcast_as(x.dims())?;
    let guard = mask.storage();
    let ms = bool::slice(guard.cpu()?).expect("bool storage");
    with_dtype!(x.dtype(), T => {
        let v: T = value.cast();
        let mut out: Vec<T> = x.host_vec_as()?;
        for (o, m) in out.iter_mut().zip(ml.offsets()) {
            if ms[m] {
                *o = v;
            }
        }
        Tensor::from_vec(out, x.dims())
    })
}

// ----- embeddings -------------------------------------------------------------------------

/// Rows `indices` of the 2-D `weight`: shape `indices.shape + [weight.size(1)]`.
pub fn embedding(weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    let op = "embedding";
    ensure!(weight.rank() == 2, invalid(op, "'weight' must be 2-D"));
    let idx = index_values(op, indices, true)?;
    let mut shape = indices.dims().to_vec();
    shape.push(weight.dims()[1]);
    take(op, weight, 0, &idx, shape)
}

/// The dense gradient of [`embedding`]: a `[num_weights, dim]` tensor (the dtype of
/// `grad`, whose shape is `indices.shape + [dim]`) where row `i` sums the gradient
/// rows of every occurrence of `i` in `indices`, except `padding_idx` (negative wraps).
pub fn embedding_backward(
    grad: &Tensor,
    indices: &Tensor,
    num_weights: usize,
    padding_idx: Option<i64>,
) -> Result<Tensor> {
    let op = "embedding_backward";
    let idx = index_values(op, indices, true)?;
    let dim = match grad.dims().split_last() {
        Some((&dim, lead)) if lead == indices.dims() => dim,
        _ => {
            return Err(Error::ShapeMismatch {
                op,
                lhs: grad.dims().to_vec(),
                rhs: indices.dims().to_vec(),
                hint: Some("grad must have shape indices.shape + [embedding_dim]".into()),
            })
        }
    };
    let pad = padding_idx.map(|p| if p < 0 { p + num_weights as i64 } else { p });
    if idx.iter().any(|&i| i < 0 || i as usize >= num_weights) {
        return Err(out_of_range(op));
    }
    crate::compute::on_device!(op, [grad], {
        let z = Tensor::zeros_on([num_weights, dim], grad.dtype(), grad.device())?;
        crate::cuda::route::index_add(op, &z, (1, num_weights, dim), &idx, grad, (1.0, pad))
    });
    float_kernel!(grad.dtype(), op, |T, C| {
        let g: Vec<C> = grad.host_vec_as()?;
        let mut acc = try_zeroed::<C>(count(&[num_weights, dim]))?;
        for (k, &i) in idx.iter().enumerate() {
            if Some(i) == pad {
                continue;
            }
            let dst = &mut acc[i as usize * dim..][..dim];
            for (a, &v) in dst.iter_mut().zip(&g[k * dim..][..dim]) {
                *a += v;
            }
        }
        Tensor::from_vec(cast_slice::<C, T>(&acc)?, [num_weights, dim])
    })
}

/// One-hot encoding of the int64 `indices`: int64 of shape
/// `indices.shape + [num_classes]`; `num_classes = -1` infers `max + 1`.
pub fn one_hot(indices: &Tensor, num_classes: i64) -> Result<Tensor> {
    let op = "one_hot";
    ensure!(
        indices.dtype() == DType::I64,
        invalid(
            op,
            "one_hot is only applicable to index tensor of type LongTensor."
        )
    );
    let idx: Vec<i64> = indices.host_vec_as()?;
    let nc = match (num_classes, idx.iter().max()) {
        (-1, Some(&m)) => m + 1,
        (-1, None) => {
            return Err(Error::invalid(
                op,
                "Can not infer total number of classes from empty tensor.",
            ))
        }
        (c, _) if c < 0 => return Err(Error::invalid(op, "num_classes should be positive")),
        (c, _) => c,
    };
    ensure!(
        idx.iter().all(|&i| i >= 0),
        invalid(op, "Class values must be non-negative.")
    );
    ensure!(
        idx.iter().all(|&i| i < nc),
        invalid(op, "Class values must be smaller than num_classes.")
    );
    let nc = nc as usize;
    let mut out = try_zeroed::<i64>(count(&[idx.len(), nc]))?;
    for (k, &i) in idx.iter().enumerate() {
        out[k * nc + i as usize] = 1;
    }
    let mut shape = indices.dims().to_vec();
    shape.push(nc);
    Tensor::from_vec(out, shape)
}
