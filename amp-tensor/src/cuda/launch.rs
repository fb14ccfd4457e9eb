//! Compiling and launching device code: NVRTC compilation with a per-process cache,
//! module loading per device, the strided-view kernel argument, launch shapes, and the
//! conversion kernel every device copy, cast and fill goes through ([`cast_into`]).
//! The kernel crate launches its families with the same helpers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{self, CompileOptions, Ptx};

use super::sources::{Module, CAST_MODULE};
use super::{driver_error, CudaStorage, DeviceContext, Library};
use crate::{ensure, DType, Device, Error, Layout, Result, SharedError};

/// Threads per block of every launch.
pub const THREADS: u32 = 256;

/// Compile `module` with NVRTC for the virtual architecture `arch` (`"compute_80"`)
/// and return the PTX text.
///
/// # Errors
/// [`Error::DeviceUnavailable`] when libnvrtc cannot be opened; [`Error::DeviceFailure`]
/// with NVRTC's log when the source does not compile.
pub fn compile_module(module: &Module, arch: &str) -> Result<String> {
    Library::Nvrtc.ensure(Device::Cuda(0))?;
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(format!("{}.cu", module.name)),
        ..Default::default()
    };
    let ptx = nvrtc::compile_ptx_with_opts(module.source(), opts).map_err(|e| {
        let log = match &e {
            nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            _ => String::new(),
        };
        Error::DeviceFailure {
            op: "nvrtcCompileProgram",
            device: Device::Cuda(0),
            source: SharedError::new(CompileFailure { log, source: e }),
        }
    })?;
    Ok(ptx.to_src())
}

/// An NVRTC compile error with the compiler's log (the error alone does not show it).
#[derive(Debug, thiserror::Error)]
#[error("{source:?}\n{log}")]
struct CompileFailure {
    log: String,
    source: nvrtc::CompileError,
}

/// The PTX of `module` for `arch`, compiled once per process.
fn ptx_cached(module: &Module, arch: &str) -> Result<String> {
    static PTX: Mutex<Vec<((&'static str, String), String)>> = Mutex::new(Vec::new());
    let key = (module.name, arch.to_string());
    if let Some((_, p)) = PTX
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(p.clone());
    }
    let p = compile_module(module, arch)?;
    PTX.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((key, p.clone()));
    Ok(p)
}

/// The virtual architecture of a device (`compute_90` for an H100).
pub fn arch_of(dc: &DeviceContext) -> Result<String> {
    let (major, minor) = dc
        .ctx
        .compute_capability()
        .map_err(driver_error("cuDeviceGetAttribute", dc.device))?;
    Ok(format!("compute_{major}{minor}"))
}

/// The kernel `name` of `module` loaded on `dc`'s device (compiled and loaded once per
/// process and device).
///
/// # Errors
/// As [`compile_module`], or a driver error loading the module.
pub fn function(dc: &DeviceContext, module: &Module, name: &str) -> Result<CudaFunction> {
    // The functions already looked up (one driver call saved per launch).
    type Found = HashMap<(Device, &'static str, String), CudaFunction>;
    static FOUND: OnceLock<Mutex<Found>> = OnceLock::new();
    let found = FOUND.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (dc.device, module.name, name.to_string());
    if let Some(f) = found.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(f.clone());
    }
    let f = load_function(dc, module, name)?;
    found
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, f.clone());
    Ok(f)
}

/// [`function`] without the per-name cache: the module loaded once per device, the
/// function looked up.
fn load_function(dc: &DeviceContext, module: &Module, name: &str) -> Result<CudaFunction> {
    type Loaded = HashMap<(Device, &'static str), Arc<CudaModule>>;
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    let existing = loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(dc.device, module.name))
        .cloned();
    let cm = match existing {
        Some(cm) => cm,
        None => {
            let ptx = ptx_cached(module, &arch_of(dc)?)?;
            let cm = dc
                .ctx
                .load_module(Ptx::from_src(ptx))
                .map_err(driver_error("cuModuleLoadData", dc.device))?;
            loaded
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((dc.device, module.name), cm.clone());
            cm
        }
    };
    cm.load_function(name)
        .map_err(driver_error("cuModuleGetFunction", dc.device))
}

/// The device type suffix of a dtype in kernel names.
pub fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::Bool => "bool",
    }
}

pub fn float_suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    if !dtype.is_floating_point() {
        return Err(Error::UnsupportedDType { op, dtype });
    }
    Ok(suffix(dtype))
}

/// A strided view as a kernel argument (`StridedArg` in the sources): its dims
/// coalesced ([`Layout::coalesced`]: size-1 dims dropped, adjacent dims merged where the
/// outer one steps exactly over the inner one, so a contiguous view is one dim), so that the device's
/// `amp_offset` divides as little as it can; `narrow` when every linear index fits in
/// 32 bits (the device then divides in 32-bit arithmetic).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StridedArg {
    ndim: i64,
    offset: i64,
    narrow: i64,
    dims: [i64; 8],
    strides: [i64; 8],
}
// SAFETY: plain `repr(C)` data matching the device struct.
unsafe impl DeviceRepr for StridedArg {}

impl StridedArg {
    /// The argument for the view `l`.
    ///
    /// # Errors
    /// A view that keeps more than 8 dims after coalescing.
    pub fn of(op: &'static str, l: &Layout) -> Result<StridedArg> {
        let (dims, strides) = l.coalesced();
        let kept: Vec<(usize, usize)> = dims.into_iter().zip(strides).collect();
        ensure!(
            kept.len() <= 8,
            invalid(
                op,
                "CUDA kernels take at most 8 non-trivial dims, got {}",
                kept.len()
            )
        );
        let mut a = StridedArg {
            ndim: kept.len() as i64,
            offset: l.offset() as i64,
            narrow: i64::from(l.elem_count() <= u32::MAX as usize),
            dims: [1; 8],
            strides: [0; 8],
        };
        for (i, (d, s)) in kept.into_iter().enumerate() {
            a.dims[i] = d as i64;
            a.strides[i] = s as i64;
        }
        Ok(a)
    }

    /// The number of dims the device walks (after coalescing; at least 1).
    pub fn ndim(&self) -> usize {
        self.ndim as usize
    }

    /// The buffer offset of the view's element `linear` (row-major order), computed as
    /// the device's `amp_offset` computes it from this argument: the host twin that
    /// tests hold against the layout's own offsets.
    pub fn element_offset(&self, linear: usize) -> usize {
        let mut rest = linear as i64;
        let mut off = self.offset;
        for d in (0..self.ndim as usize).rev() {
            off += rest % self.dims[d] * self.strides[d];
            rest /= self.dims[d];
        }
        off as usize
    }
}

pub fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 65535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub fn rows_grid(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, 65535 * 8) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub fn check_len(op: &'static str, s: &CudaStorage, l: &Layout) -> Result<()> {
    let n = l.elem_count();
    let need = if n == 0 {
        0
    } else {
        l.offset()
            + l.dims()
                .iter()
                .zip(l.strides())
                .map(|(&d, &st)| (d - 1) * st)
                .sum::<usize>()
            + 1
    };
    ensure!(
        need <= s.len(),
        invalid(
            op,
            "layout needs {need} elements, the buffer has {}",
            s.len()
        )
    );
    Ok(())
}

#[doc(hidden)]
#[macro_export]
macro_rules! cuda_launch {
    ($dc:expr, $f:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let mut b = $dc.stream.launch_builder(&$f);
        $( b.arg($arg); )+
        // SAFETY: the arguments match the kernel's C signature in `sources`, every
        // pointer is a live buffer of the launch's device checked to be large enough,
        // and all work is ordered on the device's one stream.
        unsafe { b.launch($cfg) }.map_err($crate::cuda::driver_error("cuLaunchKernel", $dc.device))?;
    }};
}

/// Write the view `src` of `x`, converted to `out`'s dtype, into the view `dst` of
/// `out` (same element count; `dst` must not overlap `src` in the same buffer unless
/// they are equal). A contiguous `dst` makes a conversion or a copy, a stride-0 `src`
/// a fill.
///
/// # Errors
/// Element counts that differ, views outside their buffers, device errors.
pub fn cast_into(x: &CudaStorage, src: &Layout, out: &CudaStorage, dst: &Layout) -> Result<()> {
    const OP: &str = "cuda copy";
    check_len(OP, x, src)?;
    check_len(OP, out, dst)?;
    ensure!(
        src.elem_count() == dst.elem_count(),
        invalid(
            OP,
            "source of {} elements, destination of {}",
            src.elem_count(),
            dst.elem_count()
        )
    );
    if x.device() != out.device() {
        return Err(Error::DeviceMismatch {
            op: OP,
            lhs: x.device(),
            rhs: out.device(),
        });
    }
    let n = dst.elem_count();
    if n == 0 {
        return Ok(());
    }
    let dc = out.context().clone();
    let f = function(
        &dc,
        &CAST_MODULE,
        &format!("cast_{}_{}", suffix(x.dtype()), suffix(out.dtype())),
    )?;
    let (xp, xs, op_, os, n64) = (
        x.device_ptr(),
        StridedArg::of(OP, src)?,
        out.device_ptr(),
        StridedArg::of(OP, dst)?,
        n as i64,
    );
    crate::cuda_launch!(dc, f, grid_for(n), &xp, &xs, &op_, &os, &n64);
    Ok(())
}

/// Most pieces one `copy_many` launch takes (`AMP_COPY_PIECES` in the sources).
pub const COPY_PIECES: usize = 4;

/// The pieces of one `copy_many` launch (`CopyPieces` in the sources): unused slots
/// are never read (`count`).
#[repr(C)]
#[derive(Clone, Copy)]
struct CopyPieces {
    count: i64,
    start: [i64; COPY_PIECES + 1],
    src: [u64; COPY_PIECES],
    dst: [u64; COPY_PIECES],
    xs: [StridedArg; COPY_PIECES],
    os: [StridedArg; COPY_PIECES],
}
// SAFETY: plain `repr(C)` data matching the device struct (8-byte fields only).
unsafe impl DeviceRepr for CopyPieces {}

/// One copy of [`copy_many`]: the view `src` of `x` into the view `dst` of `out`.
#[derive(Debug, Clone, Copy)]
pub struct CopyPiece<'a> {
    /// The source buffer.
    pub x: &'a CudaStorage,
    /// The source view.
    pub src: &'a Layout,
    /// The destination buffer.
    pub out: &'a CudaStorage,
    /// The destination view (as many elements as `src`).
    pub dst: &'a Layout,
}

/// Several copies of one dtype in one launch per [`COPY_PIECES`] pieces (a `cat`'s
/// parts, the heads of attention): each as [`cast_into`] without the conversion. No
/// piece's destination may overlap another piece's source or destination.
///
/// # Errors
/// Pieces of different dtypes or devices, element counts that differ, views outside
/// their buffers, device errors.
pub fn copy_many(pieces: &[CopyPiece<'_>]) -> Result<()> {
    const OP: &str = "cuda copy";
    let Some(first) = pieces.first() else {
        return Ok(());
    };
    let (dtype, device) = (first.x.dtype(), first.x.device());
    for p in pieces {
        check_len(OP, p.x, p.src)?;
        check_len(OP, p.out, p.dst)?;
        ensure!(
            p.src.elem_count() == p.dst.elem_count(),
            invalid(
                OP,
                "source of {} elements, destination of {}",
                p.src.elem_count(),
                p.dst.elem_count()
            )
        );
        ensure!(
            p.x.dtype() == dtype && p.out.dtype() == dtype,
            invalid(
                OP,
                "copy_many copies one dtype: {dtype:?}, got {:?} into {:?}",
                p.x.dtype(),
                p.out.dtype()
            )
        );
        for d in [p.x.device(), p.out.device()] {
            if d != device {
                return Err(Error::DeviceMismatch {
                    op: OP,
                    lhs: device,
                    rhs: d,
                });
            }
        }
    }
    let dc = first.x.context().clone();
    let f = function(
        &dc,
        &CAST_MODULE,
        &format!("copy_many_{}", dtype.size_in_bytes()),
    )?;
    let nonempty: Vec<&CopyPiece<'_>> = pieces.iter().filter(|p| p.src.elem_count() > 0).collect();
    for group in nonempty.chunks(COPY_PIECES) {
        let blank = StridedArg {
            ndim: 1,
            offset: 0,
            narrow: 1,
            dims: [1; 8],
            strides: [0; 8],
        };
        let mut arg = CopyPieces {
            count: group.len() as i64,
            start: [0; COPY_PIECES + 1],
            src: [0; COPY_PIECES],
            dst: [0; COPY_PIECES],
            xs: [blank; COPY_PIECES],
            os: [blank; COPY_PIECES],
        };
        for (j, p) in group.iter().enumerate() {
            arg.start[j + 1] = arg.start[j] + p.src.elem_count() as i64;
            arg.src[j] = p.x.device_ptr();
            arg.dst[j] = p.out.device_ptr();
            arg.xs[j] = StridedArg::of(OP, p.src)?;
            arg.os[j] = StridedArg::of(OP, p.dst)?;
        }
        let n = arg.start[group.len()] as usize;
        crate::cuda_launch!(dc, f, grid_for(n), &arg);
    }
    Ok(())
}

/// A contiguous copy of the view `layout` of `x` converted to `dtype`.
///
/// # Errors
/// As [`cast_into`].
pub fn cast(x: &CudaStorage, layout: &Layout, dtype: DType) -> Result<CudaStorage> {
    let out = CudaStorage::uninit(x.device(), dtype, layout.elem_count())?;
    cast_into(x, layout, &out, &Layout::contiguous(layout.dims().to_vec()))?;
    Ok(out)
}
