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
/// Elements per chunk of the multi-tensor unscale table.
pub const UNSCALE_CHUNK: usize = 1 << 16;

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

/// Reduce each row of a contiguous `[rows, n]` float buffer: `op` one of
/// [`REDUCE_OPS`] (`sum`, `mean` accumulate in float32 for 16-bit dtypes).
///
/// # Errors
/// Unknown op, non-float dtype, `rows * n` not the buffer length, `max`/`min` of an
/// empty row (PyTorch's error), device errors.
pub fn reduce_rows(op: &str, x: &CudaStorage, rows: usize, n: usize) -> Result<CudaStorage> {
    const OP: &str = "cuda reduce";
    ensure!(
        REDUCE_OPS.contains(&op),
        invalid(OP, "unknown reduction '{op}'")
    );
    check_rows(OP, x, rows, n)?;
    ensure!(
        !(n == 0 && (op == "max" || op == "min")),
        invalid(
            OP,
            "Expected reduction dim to be specified for input.numel() == 0."
        )
    );
    let dc = x.context().clone();
    let out = CudaStorage::uninit(dc.device, x.dtype(), rows)?;
    if rows > 0 {
        let f = function(
            &dc,
            module("reduce"),
            &format!("reduce_{op}_{}", float_suffix(OP, x.dtype())?),
        )?;
        let (xp, op_, r64, n64) = (x.device_ptr(), out.device_ptr(), rows as i64, n as i64);
        amp_tensor::cuda_launch!(dc, f, rows_grid(rows), &xp, &op_, &r64, &n64);
    }
    Ok(out)
}

/// Softmax (or log-softmax with `log`) over each row of a contiguous `[rows, n]`
/// float buffer.
///
/// # Errors
/// Non-float dtype, `rows * n` not the buffer length, device errors.
pub fn softmax_rows(x: &CudaStorage, rows: usize, n: usize, log: bool) -> Result<CudaStorage> {
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
        amp_tensor::cuda_launch!(dc, f, rows_grid(rows), &xp, &op_, &r64, &n64);
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
    let stat = if x.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
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
            let len = UNSCALE_CHUNK.min(g.len - start);
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
    let dc = device_context(a.device())?;
    let dtype = a.dtype();
    let out = CudaStorage::zeros(dc.device, dtype, batch * m * n)?;
    if batch == 0 || m == 0 || n == 0 || k == 0 {
        return Ok(out);
    }
    let int = |v: usize| {
        i32::try_from(v).map_err(|_| Error::invalid(OP, format!("size {v} exceeds cuBLAS int")))
    };
    let (mi, ki, ni, bi) = (int(m)?, int(k)?, int(n)?, int(batch)?);
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
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    let (ap, bp, cp) = (a.device_ptr(), b.device_ptr(), out.device_ptr());
    with_blas(&dc, |h| {
        // Row-major C = A B is column-major C^T = B^T A^T: pass B first, n x m result.
        // SAFETY: the pointers are live device buffers of the sizes checked above on
        // this handle's device; alpha/beta are host scalars of the compute type.
        unsafe {
            blas::gemm_strided_batched_ex(
                h,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                alpha,
                bp as *const c_void,
                dt,
                ni,
                (k * n) as i64,
                ap as *const c_void,
                dt,
                ki,
                (m * k) as i64,
                beta,
                cp as *mut c_void,
                dt,
                ni,
                (m * n) as i64,
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
    })?;
    Ok(out)
}
