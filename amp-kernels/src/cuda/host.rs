//! Host side: the launchers of every kernel family (compiled, loaded and launched with
//! `amp_tensor::cuda::launch`), plus matmul on cuBLAS.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use amp_tensor::cuda::cudarc::cublas::{result as blas, sys as blas_sys};
use amp_tensor::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use amp_tensor::cuda::launch::{
    check_len, float_suffix, function, grid_for, rows_grid, StridedArg, THREADS,
};
use amp_tensor::cuda::{device_context, driver_error, CudaStorage, DeviceContext, Library};
use amp_tensor::{ensure, CpuStorage, DType, Device, Error, Layout, Result, SharedError};

pub use amp_tensor::cuda::launch::{cast, cast_into, compile_module};

use super::sources::{Module, BINARY_OPS, REDUCE_OPS, UNARY_OPS};

/// The module of this crate named `name`.
fn module(name: &str) -> &'static Module {
    super::sources::module(name).expect("the module list names every family")
}
/// Elements per chunk of a multi-tensor table (the unscale's, Adam's) over `total`
/// elements: a block walks one chunk at a time, so the chunks aim at about
/// [`SPLIT_BLOCKS`] blocks, a power of two from 2048 to 65536. A function of the total
/// alone (the updates are elementwise: the chunking never changes a result). Measured
/// on an H200: with 65536 always, the main job's ~830k parameters made ~60 blocks, the
/// unscale took 32.6 µs and Adam 264 µs; with 2048, 4.5 µs and 13.4 µs, but the unscale
/// of one 256 MiB buffer fell from 3269 to 1222 GB/s (a 1 MiB table).
pub fn multi_tensor_chunk(total: usize) -> usize {
    (total / SPLIT_BLOCKS)
        .next_power_of_two()
        .clamp(1 << 11, 1 << 16)
}

/// The multi-tensor table entry (`AmpChunk` in the sources).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AmpChunk {
    ptr: u64,
    len: i64,
    dtype: i64,
    pad: i64,
}

/// `out = op(x)` elementwise for a strided view `x` of a float buffer; `op` one of
/// [`UNARY_OPS`]. Returns a contiguous buffer of the view's element count.
///
/// # Errors
/// Unknown op, non-float dtype, a layout outside the buffer, device errors.
pub fn unary(op: &str, x: &CudaStorage, layout: &Layout) -> Result<CudaStorage> {
    const OP: &str = "cuda unary";
    ensure!(
        UNARY_OPS.contains(&op),
        invalid(OP, "unknown unary op '{op}'")
    );
    check_len(OP, x, layout)?;
    let dc = x.context().clone();
    let n = layout.elem_count();
    let out = CudaStorage::uninit(dc.device, x.dtype(), n)?;
    if n > 0 {
        let f = function(
            &dc,
            module("unary"),
            &format!("unary_{op}_{}", float_suffix(OP, x.dtype())?),
        )?;
        let (xp, xs, op_, n64) = (
            x.device_ptr(),
            StridedArg::of(OP, layout)?,
            out.device_ptr(),
            n as i64,
        );
        amp_tensor::cuda_launch!(dc, f, grid_for(n), &xp, &xs, &op_, &n64);
    }
    Ok(out)
}

/// `out = op(a, b)` elementwise over `out_dims`; `la`/`lb` are the operands' layouts
/// already broadcast to `out_dims` (stride 0 on broadcast dims). Both operands have the
/// same float dtype (cast first with [`cast`]); `op` one of [`BINARY_OPS`].
///
/// # Errors
/// Unknown op, dtype mismatch, layouts that disagree with `out_dims`, device errors.
pub fn binary(
    op: &str,
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    const OP: &str = "cuda binary";
    ensure!(
        BINARY_OPS.contains(&op),
        invalid(OP, "unknown binary op '{op}'")
    );
    b.expect_dtype(OP, a.dtype())?;
    if la.dims() != lb.dims() {
        return Err(Error::shape_mismatch(OP, la.dims(), lb.dims()));
    }
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op: OP,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    check_len(OP, a, la)?;
    check_len(OP, b, lb)?;
    let dc = a.context().clone();
    let n = la.elem_count();
    let out = CudaStorage::uninit(dc.device, a.dtype(), n)?;
    if n > 0 {
        let f = function(
            &dc,
            module("binary"),
            &format!("binary_{op}_{}", float_suffix(OP, a.dtype())?),
        )?;
        let (ap, as_, bp, bs) = (
            a.device_ptr(),
            StridedArg::of(OP, la)?,
            b.device_ptr(),
            StridedArg::of(OP, lb)?,
        );
        let (op_, n64) = (out.device_ptr(), n as i64);
        amp_tensor::cuda_launch!(dc, f, grid_for(n), &ap, &as_, &bp, &bs, &op_, &n64);
    }
    Ok(out)
}

/// `out = x op s` (`s op x` when `rev`) elementwise for a strided view `x` of a float
/// buffer and a scalar passed by value (converted to the compute type in the kernel:
/// float32 for 16-bit and float32, float64 for float64); `op` one of [`BINARY_OPS`].
/// Returns a contiguous buffer of the view's element count.
///
/// # Errors
/// Unknown op, non-float dtype, a layout outside the buffer, device errors.
pub fn binary_scalar(
    op: &str,
    x: &CudaStorage,
    layout: &Layout,
    s: f64,
    rev: bool,
) -> Result<CudaStorage> {
    const OP: &str = "cuda binary";
    ensure!(
        BINARY_OPS.contains(&op),
        invalid(OP, "unknown binary op '{op}'")
    );
    check_len(OP, x, layout)?;
    let dc = x.context().clone();
    let n = layout.elem_count();
    let out = CudaStorage::uninit(dc.device, x.dtype(), n)?;
    if n > 0 {
        let f = function(
            &dc,
            module("binary"),
            &format!("binary_s_{op}_{}", float_suffix(OP, x.dtype())?),
        )?;
        let (xp, xs, op_, n64, r) = (
            x.device_ptr(),
            StridedArg::of(OP, layout)?,
            out.device_ptr(),
            n as i64,
            i32::from(rev),
        );
        amp_tensor::cuda_launch!(dc, f, grid_for(n), &xp, &xs, &s, &op_, &n64, &r);
    }
    Ok(out)
}

fn check_rows(op: &'static str, x: &CudaStorage, rows: usize, n: usize) -> Result<()> {
    if rows.checked_mul(n) != Some(x.len()) {
        return Err(Error::InvalidShape {
            op,
            shape: vec![rows, n],
            msg: format!("the buffer has {} elements", x.len()),
        });
    }
    Ok(())
}

/// The checks of a reduction `op` over a `[rows, n]` buffer `x` that folds `reduced`
/// elements into each result: a known op, the buffer's length, and PyTorch's error for
/// `max`/`min` over nothing.
fn check_reduce(
    op: &str,
    x: &CudaStorage,
    (rows, n): (usize, usize),
    reduced: usize,
) -> Result<()> {
    const OP: &str = "cuda reduce";
    ensure!(
        REDUCE_OPS.contains(&op),
        invalid(OP, "unknown reduction '{op}'")
    );
    check_rows(OP, x, rows, n)?;
    ensure!(
        !(reduced == 0 && (op == "max" || op == "min")),
        invalid(
            OP,
            "Expected reduction dim to be specified for input.numel() == 0."
        )
    );
    Ok(())
}

/// Reduce each row of a contiguous `[rows, n]` float buffer: `op` one of
/// [`REDUCE_OPS`] (`sum`, `mean` accumulate in float32 for 16-bit dtypes).
///
/// # Errors
/// Unknown op, non-float dtype, `rows * n` not the buffer length, `max`/`min` of an
/// empty row (PyTorch's error), device errors.
pub fn reduce_rows(op: &str, x: &CudaStorage, rows: usize, n: usize) -> Result<CudaStorage> {
    const OP: &str = "cuda reduce";
    check_reduce(op, x, (rows, n), n)?;
    let dc = x.context().clone();
    let out = CudaStorage::uninit(dc.device, x.dtype(), rows)?;
    if rows == 0 {
        return Ok(out);
    }
    let suffix = float_suffix(OP, x.dtype())?;
    let (xp, op_, r64, n64) = (x.device_ptr(), out.device_ptr(), rows as i64, n as i64);
    let splits = split_count(rows, n);
    if splits == 1 {
        let f = function(&dc, module("reduce"), &format!("reduce_{op}_{suffix}"))?;
        amp_tensor::cuda_launch!(dc, f, rows_grid(rows), &xp, &op_, &r64, &n64);
        return Ok(out);
    }
    let acc = super::route::compute_dtype(x.dtype());
    let part = CudaStorage::uninit(dc.device, acc, rows * splits)?;
    let (pp, s64) = (part.device_ptr(), splits as i64);
    let f = function(&dc, module("reduce"), &format!("reduce_part_{op}_{suffix}"))?;
    amp_tensor::cuda_launch!(dc, f, rows_grid(rows * splits), &xp, &pp, &r64, &n64, &s64);
    let f = function(&dc, module("reduce"), &format!("reduce_fin_{op}_{suffix}"))?;
    amp_tensor::cuda_launch!(dc, f, rows_grid(rows), &pp, &op_, &r64, &n64, &s64);
    Ok(out)
}

/// `op` (one of [`REDUCE_OPS`]) over the rows of a contiguous `[rows, n]` float buffer,
/// one result per column (the reduced dims leading, as in a bias gradient's sum): the
/// column sums of chunks of [`column_chunk`] rows, then each column's chunks in order,
/// in the accumulation type; no transposing copy.
///
/// # Errors
/// Unknown op, non-float dtype, `rows * n` not the buffer length, `max`/`min` over no
/// rows, device errors.
pub fn reduce_cols(op: &str, x: &CudaStorage, rows: usize, n: usize) -> Result<CudaStorage> {
    const OP: &str = "cuda reduce";
    check_reduce(op, x, (rows, n), rows)?;
    let dc = x.context().clone();
    let out = CudaStorage::uninit(dc.device, x.dtype(), n)?;
    if n == 0 {
        return Ok(out);
    }
    let suffix = float_suffix(OP, x.dtype())?;
    let acc = super::route::compute_dtype(x.dtype());
    let chunk = column_chunk(rows);
    let chunks = rows.div_ceil(chunk).max(1);
    let part = CudaStorage::uninit(dc.device, acc, chunks * n)?;
    let (xp, pp, op_) = (x.device_ptr(), part.device_ptr(), out.device_ptr());
    let (r64, n64, c64, k64) = (rows as i64, n as i64, chunk as i64, chunks as i64);
    let f = function(
        &dc,
        module("reduce"),
        &format!("reduce_col_part_{op}_{suffix}"),
    )?;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(32) as u32, chunks as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    amp_tensor::cuda_launch!(dc, f, cfg, &xp, &pp, &r64, &n64, &c64);
    let f = function(
        &dc,
        module("reduce"),
        &format!("reduce_col_fin_{op}_{suffix}"),
    )?;
    amp_tensor::cuda_launch!(dc, f, grid_for(n), &pp, &op_, &r64, &n64, &k64);
    Ok(out)
}

/// Rows per chunk of a column reduction ([`reduce_cols`], the layer norm backward's
/// parameter sums): at least 64, and at most 512 chunks. A function of the shape only.
pub fn column_chunk(rows: usize) -> usize {
    rows.div_ceil(512).max(64)
}

/// Blocks a split reduction aims at: enough to keep every multiprocessor of a large GPU
/// (132 on an H100) streaming with several blocks each.
pub const SPLIT_BLOCKS: usize = 1024;
/// The fewest elements a block of a split reduction folds (below, the second launch
/// costs more than the parallelism gains).
pub const SPLIT_MIN: usize = 4096;

/// Into how many chunks [`reduce_rows`] cuts each of `rows` rows of `n` elements: 1
/// (one block per row) when the rows alone fill the device or are short, else enough
/// chunks for about [`SPLIT_BLOCKS`] blocks of at least [`SPLIT_MIN`] elements. A
/// function of the shape only, so results are the same on every device.
pub fn split_count(rows: usize, n: usize) -> usize {
    if rows >= SPLIT_BLOCKS {
        return 1;
    }
    SPLIT_BLOCKS.div_ceil(rows).min(n / SPLIT_MIN).max(1)
}

/// Softmax (or log-softmax with `log`) over each row of a contiguous `[rows, n]`
/// float buffer of `scale` times the input; with `causal > 0` the buffer is a stack of
/// `[causal, n]` matrices and row `i` of each keeps columns `0..=i` only (attention's
/// causal mask: probability 0, log-probability -inf, past them).
///
/// # Errors
/// Shape or dtype mismatches, device errors.
pub fn softmax_rows(
    x: &CudaStorage,
    rows: usize,
    n: usize,
    log: bool,
    (scale, causal): (f64, usize),
) -> Result<CudaStorage> {
    const OP: &str = "cuda softmax";
    check_rows(OP, x, rows, n)?;
    let dc = x.context().clone();
    let out = CudaStorage::uninit(dc.device, x.dtype(), rows * n)?;
    if rows > 0 && n > 0 {
        let name = if log {
            "log_softmax_fwd"
        } else {
            "softmax_fwd"
        };
        let f = function(
            &dc,
            module("softmax"),
            &format!("{name}_{}", float_suffix(OP, x.dtype())?),
        )?;
        let (xp, op_, r64, n64) = (x.device_ptr(), out.device_ptr(), rows as i64, n as i64);
        let c64 = causal as i64;
        amp_tensor::cuda_launch!(dc, f, rows_grid(rows), &xp, &op_, &r64, &n64, &scale, &c64);
    }
    Ok(out)
}

/// The backward of softmax (`log` false: `y (g - Σ g y)`) or log-softmax
/// (`g - e^y Σ g`), times `scale` (the forward's input scale), over each row of
/// contiguous `[rows, n]` buffers `g` and `y` (the forward's output) of one float
/// dtype, in one launch (a block per row, computed in the accumulation type, rounded
/// once).
///
/// # Errors
/// Shape or dtype mismatches, device errors.
pub fn softmax_backward_rows(
    g: &CudaStorage,
    y: &CudaStorage,
    rows: usize,
    n: usize,
    log: bool,
    scale: f64,
) -> Result<CudaStorage> {
    const OP: &str = "cuda softmax_backward";
    check_rows(OP, g, rows, n)?;
    check_rows(OP, y, rows, n)?;
    y.expect_dtype(OP, g.dtype())?;
    let dc = g.context().clone();
    let out = CudaStorage::uninit(dc.device, g.dtype(), rows * n)?;
    if rows > 0 && n > 0 {
        let name = if log {
            "log_softmax_bwd"
        } else {
            "softmax_bwd"
        };
        let f = function(
            &dc,
            module("softmax"),
            &format!("{name}_{}", float_suffix(OP, g.dtype())?),
        )?;
        let (gp, yp, op_) = (g.device_ptr(), y.device_ptr(), out.device_ptr());
        let (r64, n64) = (rows as i64, n as i64);
        amp_tensor::cuda_launch!(dc, f, rows_grid(rows), &gp, &yp, &op_, &r64, &n64, &scale);
    }
    Ok(out)
}

/// Layer norm forward over each row of a contiguous `[rows, n]` float buffer with
/// optional `[n]` weight and bias of the same dtype. Returns `(out, mean, rstd)`, the
/// statistics in float32 for 16-bit inputs (float64 for float64).
///
/// # Errors
/// Shape or dtype mismatches, device errors.
pub fn layer_norm_rows(
    x: &CudaStorage,
    weight: Option<&CudaStorage>,
    bias: Option<&CudaStorage>,
    rows: usize,
    n: usize,
    eps: f64,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    const OP: &str = "cuda layer_norm";
    check_rows(OP, x, rows, n)?;
    for p in [weight, bias].into_iter().flatten() {
        p.expect_dtype(OP, x.dtype())?;
        if p.len() != n {
            return Err(Error::shape_mismatch(OP, &[p.len()], &[n]));
        }
    }
    let sfx = float_suffix(OP, x.dtype())?;
    let stat = super::route::compute_dtype(x.dtype());
    let dc = x.context().clone();
    let out = CudaStorage::uninit(dc.device, x.dtype(), rows * n)?;
    let mean = CudaStorage::uninit(dc.device, stat, rows)?;
    let rstd = CudaStorage::uninit(dc.device, stat, rows)?;
    if rows > 0 && n > 0 {
        let f = function(&dc, module("layer_norm"), &format!("layer_norm_fwd_{sfx}"))?;
        let wp = weight.map_or(0u64, |w| w.device_ptr());
        let bp = bias.map_or(0u64, |b| b.device_ptr());
        let (xp, op_, mp, rp) = (
            x.device_ptr(),
            out.device_ptr(),
            mean.device_ptr(),
            rstd.device_ptr(),
        );
        let (r64, n64) = (rows as i64, n as i64);
        amp_tensor::cuda_launch!(
            dc,
            f,
            rows_grid(rows),
            &xp,
            &wp,
            &bp,
            &eps,
            &op_,
            &mp,
            &rp,
            &r64,
            &n64
        );
    }
    Ok((out, mean, rstd))
}

/// The backward of [`layer_norm_rows`] over a contiguous `[rows, n]` float buffer `x`
/// and its gradient `g` (the same dtype), from the forward's per-row `mean` and `rstd`
/// (the accumulation type: float32, float64 for float64): the input gradient (`x`'s
/// dtype), and with a `weight` (`n` values of the accumulation type) the weight's and
/// bias's gradients (`n` each, the accumulation type). Three launches: the input
/// gradient one block per row, the parameter sums over chunks of
/// [`column_chunk`] rows, then over the chunks in order.
///
/// # Errors
/// Buffers of other lengths or dtypes, device errors.
pub fn layer_norm_backward_rows(
    g: &CudaStorage,
    x: &CudaStorage,
    weight: Option<&CudaStorage>,
    (mean, rstd): (&CudaStorage, &CudaStorage),
    rows: usize,
    n: usize,
) -> Result<(CudaStorage, Option<(CudaStorage, CudaStorage)>)> {
    const OP: &str = "cuda layer_norm_backward";
    check_rows(OP, x, rows, n)?;
    check_rows(OP, g, rows, n)?;
    g.expect_dtype(OP, x.dtype())?;
    let sfx = float_suffix(OP, x.dtype())?;
    let stat = super::route::compute_dtype(x.dtype());
    for (s, len) in [(Some(mean), rows), (Some(rstd), rows), (weight, n)] {
        if let Some(s) = s {
            s.expect_dtype(OP, stat)?;
            if s.len() != len {
                return Err(Error::shape_mismatch(OP, &[s.len()], &[len]));
            }
        }
    }
    let dc = x.context().clone();
    let gi = CudaStorage::uninit(dc.device, x.dtype(), rows * n)?;
    let empty = rows == 0 || n == 0;
    // The kernels write every parameter gradient; an empty sum is zeros.
    let alloc = if empty {
        CudaStorage::zeros
    } else {
        CudaStorage::uninit
    };
    let params = match weight {
        Some(_) => Some((alloc(dc.device, stat, n)?, alloc(dc.device, stat, n)?)),
        None => None,
    };
    if empty {
        return Ok((gi, params));
    }
    let (gp, xp, mp, rp, ip) = (
        g.device_ptr(),
        x.device_ptr(),
        mean.device_ptr(),
        rstd.device_ptr(),
        gi.device_ptr(),
    );
    let wp = weight.map_or(0u64, |w| w.device_ptr());
    let (r64, n64) = (rows as i64, n as i64);
    let f = function(&dc, module("layer_norm"), &format!("layer_norm_bwd_{sfx}"))?;
    amp_tensor::cuda_launch!(
        dc,
        f,
        rows_grid(rows),
        &gp,
        &xp,
        &wp,
        &mp,
        &rp,
        &ip,
        &r64,
        &n64
    );
    if let Some((gw, gb)) = &params {
        let chunk = column_chunk(rows);
        let chunks = rows.div_ceil(chunk);
        let pw = CudaStorage::uninit(dc.device, stat, chunks * n)?;
        let pb = CudaStorage::uninit(dc.device, stat, chunks * n)?;
        let (pwp, pbp, c64) = (pw.device_ptr(), pb.device_ptr(), chunk as i64);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(32) as u32, chunks as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let f = function(
            &dc,
            module("layer_norm"),
            &format!("layer_norm_bwd_part_{sfx}"),
        )?;
        amp_tensor::cuda_launch!(dc, f, cfg, &gp, &xp, &mp, &rp, &pwp, &pbp, &r64, &n64, &c64);
        let fin = if stat == DType::F64 { "f64" } else { "f32" };
        let f = function(
            &dc,
            module("layer_norm"),
            &format!("layer_norm_bwd_fin_{fin}"),
        )?;
        let (gwp, gbp, k64) = (gw.device_ptr(), gb.device_ptr(), chunks as i64);
        amp_tensor::cuda_launch!(dc, f, grid_for(n), &pwp, &pbp, &gwp, &gbp, &k64, &n64);
        // The partials go back to the caching allocator; their reuse is ordered after
        // the last kernel by the one stream.
        drop((pw, pb));
    }
    Ok((gi, params))
}

/// One gradient for [`non_finite_check_and_unscale_`]: `len` contiguous elements from
/// element `offset` of a float buffer.
#[derive(Debug, Clone, Copy)]
pub struct GradRange<'a> {
    /// The gradient's buffer.
    pub storage: &'a CudaStorage,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

fn check_scalar(op: &'static str, s: &CudaStorage, name: &str, dtype: DType) -> Result<()> {
    if s.len() != 1 || s.dtype() != dtype {
        let kind = if dtype == DType::I32 {
            "an int"
        } else {
            "a float"
        };
        return Err(Error::invalid(
            op,
            format!("{name} must be a 1-element {kind} tensor."),
        ));
    }
    Ok(())
}

/// `_amp_foreach_non_finite_check_and_unscale_` on the device, in one launch for every
/// gradient (mixed float dtypes): sets `found_inf` to 1.0 if any element is not finite
/// and multiplies every element by `inv_scale` unless it is 1.0 (see
/// [`super::sources::AMP`] for the exact arithmetic). Nothing is read back to the host.
///
/// # Errors
/// `found_inf`/`inv_scale` not 1-element float32 buffers, a non-float gradient, ranges
/// outside their buffers, gradients on another device, device errors.
pub fn non_finite_check_and_unscale_(
    grads: &[GradRange<'_>],
    found_inf: &CudaStorage,
    inv_scale: &CudaStorage,
) -> Result<()> {
    const OP: &str = "_amp_foreach_non_finite_check_and_unscale_";
    check_scalar(OP, found_inf, "found_inf", DType::F32)?;
    check_scalar(OP, inv_scale, "inv_scale", DType::F32)?;
    let device = found_inf.device();
    let mut table: Vec<AmpChunk> = Vec::new();
    let chunk = multi_tensor_chunk(grads.iter().map(|g| g.len).sum());
    for g in grads {
        let s = g.storage;
        if s.device() != device || inv_scale.device() != device {
            return Err(Error::DeviceMismatch {
                op: OP,
                lhs: device,
                rhs: s.device(),
            });
        }
        let code = match s.dtype() {
            DType::F16 => 0,
            DType::BF16 => 1,
            DType::F32 => 2,
            DType::F64 => 3,
            dtype => return Err(Error::UnsupportedDType { op: OP, dtype }),
        };
        ensure!(
            g.offset
                .checked_add(g.len)
                .is_some_and(|end| end <= s.len()),
            invalid(
                OP,
                "range {}..+{} outside a buffer of {}",
                g.offset,
                g.len,
                s.len()
            )
        );
        let size = s.dtype().size_in_bytes() as u64;
        let base = s.device_ptr() + g.offset as u64 * size;
        let mut start = 0;
        while start < g.len {
            let len = chunk.min(g.len - start);
            table.push(AmpChunk {
                ptr: base + start as u64 * size,
                len: len as i64,
                dtype: code,
                pad: 0,
            });
            start += len;
        }
    }
    if table.is_empty() {
        return Ok(());
    }
    // The table goes up as int64 words; the copy is queued on the same stream as the
    // launch, so the (cached) buffer may be dropped right after.
    let words: Vec<i64> = table
        .iter()
        .flat_map(|c| [c.ptr as i64, c.len, c.dtype, c.pad])
        .collect();
    let dev_table = CudaStorage::from_cpu(&CpuStorage::I64(words), device)?;
    let dc = found_inf.context().clone();
    let f = function(&dc, module("amp"), "amp_non_finite_check_and_unscale")?;
    let blocks = table.len().clamp(1, 65535 * 8) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (tp, nc, fp, ip) = (
        dev_table.device_ptr(),
        table.len() as i64,
        found_inf.device_ptr(),
        inv_scale.device_ptr(),
    );
    amp_tensor::cuda_launch!(dc, f, cfg, &tp, &nc, &fp, &ip);
    Ok(())
}

/// `_amp_update_scale_` on the device (one thread): backoff on `found_inf`, growth after
/// `growth_interval` clean steps (dropped if not finite), exactly as PyTorch's `_amp_update_scale_`.
///
/// # Errors
/// `scale`/`found_inf` not 1-element float32, `growth_tracker` not 1-element int32,
/// buffers on different devices, device errors.
pub fn update_scale_(
    scale: &CudaStorage,
    growth_tracker: &CudaStorage,
    found_inf: &CudaStorage,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: i64,
) -> Result<()> {
    const OP: &str = "_amp_update_scale_";
    check_scalar(OP, growth_tracker, "growth_tracker", DType::I32)?;
    check_scalar(OP, scale, "current_scale", DType::F32)?;
    check_scalar(OP, found_inf, "found_inf", DType::F32)?;
    for other in [growth_tracker, found_inf] {
        if other.device() != scale.device() {
            return Err(Error::DeviceMismatch {
                op: OP,
                lhs: scale.device(),
                rhs: other.device(),
            });
        }
    }
    let dc = scale.context().clone();
    let f = function(&dc, module("amp"), "amp_update_scale")?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let (sp, tp, fp) = (
        scale.device_ptr(),
        growth_tracker.device_ptr(),
        found_inf.device_ptr(),
    );
    amp_tensor::cuda_launch!(
        dc,
        f,
        cfg,
        &sp,
        &tp,
        &fp,
        &growth_factor,
        &backoff_factor,
        &growth_interval
    );
    Ok(())
}

/// A library's handle (cuBLAS, cuDNN), kept per device in a static table.
pub(super) struct Handle<T>(T);
// SAFETY: cuBLAS and cuDNN handles may move between threads; every call on one is made
// by `with_handle` under the lock of the table it is kept in.
unsafe impl<T> Send for Handle<T> {}

/// A table of per-device handles for [`with_handle`].
pub(super) type Handles<T> = OnceLock<Mutex<HashMap<Device, Handle<T>>>>;

/// Run `f` with `dc`'s handle from `table` (made by `create` on first use, with the
/// device's context current), holding the table's lock, which serialises the calls on
/// its handles.
pub(super) fn with_handle<T: Copy, R>(
    table: &'static Handles<T>,
    dc: &DeviceContext,
    create: impl FnOnce() -> Result<T>,
    f: impl FnOnce(T) -> Result<R>,
) -> Result<R> {
    let mut all = table
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    dc.ctx
        .bind_to_thread()
        .map_err(driver_error("cuCtxSetCurrent", dc.device))?;
    let handle = match all.entry(dc.device) {
        std::collections::hash_map::Entry::Occupied(e) => e.get().0,
        std::collections::hash_map::Entry::Vacant(v) => v.insert(Handle(create()?)).0,
    };
    f(handle)
}

fn with_blas<R>(
    dc: &DeviceContext,
    f: impl FnOnce(blas_sys::cublasHandle_t) -> Result<R>,
) -> Result<R> {
    static HANDLES: Handles<blas_sys::cublasHandle_t> = OnceLock::new();
    Library::Cublas.ensure(dc.device)?;
    Library::CublasLt.ensure(dc.device)?;
    let blas_err = |op: &'static str| {
        move |e: blas::CublasError| Error::DeviceFailure {
            op,
            device: dc.device,
            source: SharedError::new(e),
        }
    };
    let create = || {
        let h = blas::create_handle().map_err(blas_err("cublasCreate"))?;
        // SAFETY: `h` is a fresh handle and the stream lives as long as the context.
        unsafe { blas::set_stream(h, dc.stream.cu_stream() as blas_sys::cudaStream_t) }
            .map_err(blas_err("cublasSetStream"))?;
        Ok(h)
    };
    with_handle(&HANDLES, dc, create, f)
}

/// How cuBLAS reads one operand of a batched product where it lies: matrix `i` of the
/// batch starts `offset + i * batch_stride` elements into the buffer, and `ld` is the
/// stride between its rows (row-major) or, when `column_major`, between its columns (a
/// transposed view, passed to cuBLAS as a transpose instead of being copied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixView {
    /// Element offset of matrix 0 in the buffer.
    pub offset: usize,
    /// Elements between consecutive matrices (0: one matrix for the whole batch).
    pub batch_stride: usize,
    /// Stride of the major dimension.
    pub ld: usize,
    /// Element `(i, j)` at `i + j * ld` instead of `i * ld + j`.
    pub column_major: bool,
}

impl MatrixView {
    /// A contiguous row-major batch of `rows x cols` matrices.
    pub fn contiguous(rows: usize, cols: usize) -> MatrixView {
        MatrixView {
            offset: 0,
            batch_stride: rows * cols,
            ld: cols.max(1),
            column_major: false,
        }
    }

    /// The `rows x cols` matrices starting at `offsets` (one per batch entry) with row
    /// stride `rs` and column stride `cs`, when cuBLAS can read them in place: the
    /// offsets in a non-decreasing arithmetic progression, one stride 1 (or its
    /// dimension 1) and the other at least the extent it steps over. `None` otherwise
    /// (gather a contiguous copy first).
    pub fn of(
        offsets: &[usize],
        (rows, cols): (usize, usize),
        (rs, cs): (usize, usize),
    ) -> Option<MatrixView> {
        let (&offset, rest) = offsets.split_first()?;
        let batch_stride = match rest.first() {
            None => 0,
            Some(o1) => {
                let step = o1.checked_sub(offset)?;
                let even = offsets
                    .windows(2)
                    .all(|w| w[1].checked_sub(w[0]) == Some(step));
                if !even {
                    return None;
                }
                step
            }
        };
        let (ld, column_major) = if (cs == 1 || cols <= 1) && (rows <= 1 || rs >= cols.max(1)) {
            (if rows <= 1 { cols.max(1) } else { rs }, false)
        } else if (rs == 1 || rows <= 1) && (cols <= 1 || cs >= rows.max(1)) {
            (if cols <= 1 { rows.max(1) } else { cs }, true)
        } else {
            return None;
        };
        Some(MatrixView {
            offset,
            batch_stride,
            ld,
            column_major,
        })
    }

    /// One past the largest element index read for `batch` matrices of `rows x cols`
    /// (all at least 1), `None` on overflow.
    fn end(&self, batch: usize, rows: usize, cols: usize) -> Option<usize> {
        let (major, minor) = if self.column_major {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let last = (major - 1).checked_mul(self.ld)?.checked_add(minor - 1)?;
        (batch - 1)
            .checked_mul(self.batch_stride)?
            .checked_add(self.offset)?
            .checked_add(last)?
            .checked_add(1)
    }
}

/// Batched row-major matmul on cuBLAS: `c[i] = a[i] @ b[i]` for `batch` contiguous
/// `[m, k]` and `[k, n]` matrices of one float dtype, giving contiguous `[batch, m, n]`.
/// float16/bfloat16 inputs compute in float32 (`CUBLAS_COMPUTE_32F`, no TF32), float32 in
/// float32, float64 in float64.
///
/// # Errors
/// Dtype or size mismatches, sizes beyond cuBLAS's `int`, missing cuBLAS, device errors.
pub fn matmul(
    a: &CudaStorage,
    b: &CudaStorage,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
) -> Result<CudaStorage> {
    const OP: &str = "cuda matmul";
    b.expect_dtype(OP, a.dtype())?;
    ensure!(
        !(a.len() != batch * m * k || b.len() != batch * k * n),
        invalid(
            OP,
            "buffers of {} and {} elements for batch {batch} of [{m}, {k}] @ [{k}, {n}]",
            a.len(),
            b.len()
        )
    );
    if k == 0 {
        return CudaStorage::zeros(a.device(), a.dtype(), batch * m * n);
    }
    let out = CudaStorage::uninit(a.device(), a.dtype(), batch * m * n)?;
    let (va, vb) = (MatrixView::contiguous(m, k), MatrixView::contiguous(k, n));
    matmul_views(a, va, b, vb, &out, (batch, m, k, n), 1.0, 0.0)?;
    Ok(out)
}

/// `c[i] = alpha * a[i] @ b[i] + beta * c[i]` on cuBLAS for `batch` products of
/// `[m, k] @ [k, n]`, the operands read in place through their views (no copy for
/// transposed or batch-strided operands), `c` a contiguous `[batch, m, n]` buffer of
/// the same dtype. The sum is computed in float32 for 16-bit dtypes (`c` read, scaled
/// and added in float32, rounded once: PyTorch's `addmm` on CUDA), float64 for float64,
/// no TF32. With `beta == 0`, `c` is not read (it may be uninitialised).
///
/// # Errors
/// Dtype mismatches, `k == 0` (nothing for cuBLAS to do: the caller fills `c`), views
/// reaching outside their buffers, sizes beyond cuBLAS's `int`, missing cuBLAS, device
/// errors.
#[allow(clippy::too_many_arguments)]
pub fn matmul_views(
    a: &CudaStorage,
    va: MatrixView,
    b: &CudaStorage,
    vb: MatrixView,
    c: &CudaStorage,
    (batch, m, k, n): (usize, usize, usize, usize),
    alpha: f64,
    beta: f64,
) -> Result<()> {
    const OP: &str = "cuda matmul";
    b.expect_dtype(OP, a.dtype())?;
    c.expect_dtype(OP, a.dtype())?;
    ensure!(
        k > 0,
        invalid(OP, "a product over k = 0 has no cuBLAS call")
    );
    ensure!(
        c.len() == batch * m * n,
        invalid(
            OP,
            "an output of {} elements for batch {batch} of [{m}, {n}]",
            c.len()
        )
    );
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    for (s, v, (rows, cols), what) in [(a, va, (m, k), "left"), (b, vb, (k, n), "right")] {
        ensure!(
            v.end(batch, rows, cols).is_some_and(|end| end <= s.len()),
            invalid(
                OP,
                "the {what} operand's view {v:?} of {batch} x [{rows}, {cols}] reaches past its {} elements",
                s.len()
            )
        );
    }
    let dc = device_context(a.device())?;
    let dtype = a.dtype();
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| Error::invalid(OP, format!("size {v} exceeds cuBLAS int")))
    };
    let long = |v: usize| {
        i64::try_from(v).map_err(|_| Error::invalid(OP, format!("stride {v} exceeds cuBLAS int64")))
    };
    let (mi, ki, ni, bi) = (int(m)?, int(k)?, int(n)?, int(batch)?);
    let (lda, ldb) = (int(va.ld)?, int(vb.ld)?);
    let (sa, sb, sc) = (long(va.batch_stride)?, long(vb.batch_stride)?, long(m * n)?);
    use blas_sys::cudaDataType_t as Dt;
    let (dt, compute) = match dtype {
        DType::F16 => (
            Dt::CUDA_R_16F,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::BF16 => (
            Dt::CUDA_R_16BF,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F32 => (
            Dt::CUDA_R_32F,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F64 => (
            Dt::CUDA_R_64F,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        ),
        dtype => return Err(Error::UnsupportedDType { op: OP, dtype }),
    };
    let (alpha32, beta32) = (alpha as f32, beta as f32);
    let (alpha_p, beta_p): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&alpha as *const f64 as _, &beta as *const f64 as _)
    } else {
        (&alpha32 as *const f32 as _, &beta32 as *const f32 as _)
    };
    let elem = dtype.size_in_bytes() as u64;
    let ap = a.device_ptr() + va.offset as u64 * elem;
    let bp = b.device_ptr() + vb.offset as u64 * elem;
    let cp = c.device_ptr();
    let op = |v: MatrixView| {
        if v.column_major {
            blas_sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas_sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    with_blas(&dc, |h| {
        // Row-major C = A B is column-major C^T = B^T A^T: B first, an n x m result. A
        // row-major operand is its column-major transpose as it lies (OP_N); a
        // column-major one is passed transposed (OP_T), with its own leading dimension.
        // SAFETY: the pointers are live device buffers on this handle's device, and
        // every element the views reach lies inside them (checked above); alpha/beta
        // are host scalars of the compute type that outlive the call.
        unsafe {
            blas::gemm_strided_batched_ex(
                h,
                op(vb),
                op(va),
                ni,
                mi,
                ki,
                alpha_p,
                bp as *const c_void,
                dt,
                ldb,
                sb,
                ap as *const c_void,
                dt,
                lda,
                sa,
                beta_p,
                cp as *mut c_void,
                dt,
                ni,
                sc,
                bi,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::DeviceFailure {
            op: "cublasGemmStridedBatchedEx",
            device: dc.device,
            source: SharedError::new(e),
        })
    })
}
