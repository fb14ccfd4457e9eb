//! Convolutions on cuDNN (cudarc's `cudnn` bindings, loaded at run time): the forward
//! product and its two adjoints, in the N-d legacy API PyTorch's `cudnn_convolution`
//! uses (`cudnnConvolutionForward`, `...BackwardData`, `...BackwardFilter`).
//!
//! One handle per device, bound to the device's one stream and kept under a mutex (a
//! cuDNN handle is not thread-safe). Descriptors live for one call. The algorithm is
//! cuDNN's heuristic choice (`cudnnGet...Algorithm_v7`, as PyTorch with
//! `benchmark=False`), skipping an algorithm whose workspace cannot be allocated; the
//! ranking is asked once per geometry, dtype and pass and kept (as PyTorch's algorithm
//! cache does: the query costs more than a small convolution).
//!
//! Numerics: float16/bfloat16 data computes in float32 on Tensor Cores
//! (`CUDNN_TENSOR_OP_MATH`); float32 computes in exact float32 (`CUDNN_FMA_MATH`: no
//! TF32, the choice PyTorch makes with `allow_tf32 = False`, and the one its matmul
//! makes by default); float64 in float64. A 1-d convolution runs as a 2-d one over a
//! unit height, as PyTorch does.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};

use amp_tensor::cuda::cudarc::cudnn::{result as dnn, sys};
use amp_tensor::cuda::{device_context, CudaStorage, DeviceContext, Library};

use super::host::{with_handle, Handles};
use amp_tensor::{DType, Device, Error, Result, SharedError};

/// One convolution's geometry in cuDNN's terms: the input side `x` `[N, G·C, in...]`,
/// the weight `w` `[G·O, C, k...]`, the output side `y` `[N, G·O, out...]` (2 or 3
/// spatial dims), and per spatial dim the padding, stride and dilation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvSpec {
    x: Vec<c_int>,
    w: Vec<c_int>,
    y: Vec<c_int>,
    pad: Vec<c_int>,
    stride: Vec<c_int>,
    dilation: Vec<c_int>,
    groups: c_int,
}

impl ConvSpec {
    /// The geometry of a convolution with 1, 2 or 3 spatial dims (`pad`, `stride`,
    /// `dilation`: one value per spatial dim). A 1-d convolution becomes a 2-d one of
    /// height 1.
    ///
    /// # Errors
    /// A size beyond cuDNN's `int`, or lists of inconsistent lengths.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        x: &[usize],
        w: &[usize],
        y: &[usize],
        pad: &[usize],
        stride: &[usize],
        dilation: &[usize],
        groups: usize,
    ) -> Result<ConvSpec> {
        let r = x.len().saturating_sub(2);
        if !(1..=3).contains(&r)
            || w.len() != r + 2
            || y.len() != r + 2
            || [pad.len(), stride.len(), dilation.len()] != [r; 3]
        {
            return Err(Error::invalid(
                OP,
                format!("inconsistent geometry x {x:?}, w {w:?}, y {y:?}"),
            ));
        }
        let int = |v: &[usize], lift: usize| -> Result<Vec<c_int>> {
            let mut out = Vec::with_capacity(v.len() + 1);
            for (i, &e) in v.iter().enumerate() {
                if r == 1 && i == v.len() - 1 {
                    out.push(lift as c_int);
                }
                out.push(
                    c_int::try_from(e)
                        .map_err(|_| Error::invalid(OP, format!("size {e} exceeds cuDNN's int")))?,
                );
            }
            Ok(out)
        };
        Ok(ConvSpec {
            x: int(x, 1)?,
            w: int(w, 1)?,
            y: int(y, 1)?,
            pad: int(pad, 0)?,
            stride: int(stride, 1)?,
            dilation: int(dilation, 1)?,
            groups: c_int::try_from(groups)
                .map_err(|_| Error::invalid(OP, "groups exceed cuDNN's int"))?,
        })
    }

    fn numel(dims: &[c_int]) -> usize {
        dims.iter().map(|&d| d as usize).product()
    }
}

const OP: &str = "cudnn_convolution";

/// Which of the three products a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pass {
    /// `y = w ⋆ x`.
    Forward,
    /// `dx` from `dy` and `w` (also a transposed convolution's forward).
    BackwardData,
    /// `dw` from `x` and `dy`.
    BackwardFilter,
}

/// `y` of `spec.y`'s dims: the convolution of the contiguous `x` with the contiguous
/// weight `w`.
///
/// # Errors
/// Dtype or length mismatches, cuDNN missing ([`Error::DeviceUnavailable`]) or failing
/// ([`Error::DeviceFailure`] with cuDNN's status as the source).
pub fn conv_forward(x: &CudaStorage, w: &CudaStorage, spec: &ConvSpec) -> Result<CudaStorage> {
    run(Pass::Forward, x, w, spec)
}

/// `dx` of `spec.x`'s dims: `dy` taken back through the weight `w` (the adjoint of
/// [`conv_forward`] in its input, which is also the transposed convolution).
///
/// # Errors
/// As [`conv_forward`].
pub fn conv_backward_data(
    dy: &CudaStorage,
    w: &CudaStorage,
    spec: &ConvSpec,
) -> Result<CudaStorage> {
    run(Pass::BackwardData, dy, w, spec)
}

/// `dw` of `spec.w`'s dims: the input `x` correlated with `dy` (the adjoint of
/// [`conv_forward`] in its weight).
///
/// # Errors
/// As [`conv_forward`].
pub fn conv_backward_filter(
    x: &CudaStorage,
    dy: &CudaStorage,
    spec: &ConvSpec,
) -> Result<CudaStorage> {
    run(Pass::BackwardFilter, x, dy, spec)
}

fn data_type(dtype: DType) -> Result<(sys::cudnnDataType_t, sys::cudnnDataType_t)> {
    use sys::cudnnDataType_t as D;
    Ok(match dtype {
        DType::F16 => (D::CUDNN_DATA_HALF, D::CUDNN_DATA_FLOAT),
        DType::BF16 => (D::CUDNN_DATA_BFLOAT16, D::CUDNN_DATA_FLOAT),
        DType::F32 => (D::CUDNN_DATA_FLOAT, D::CUDNN_DATA_FLOAT),
        DType::F64 => (D::CUDNN_DATA_DOUBLE, D::CUDNN_DATA_DOUBLE),
        dtype => return Err(Error::UnsupportedDType { op: OP, dtype }),
    })
}

/// A cuDNN status as [`Error::DeviceFailure`] of `op` on `device`.
fn failure(op: &'static str, device: Device) -> impl Fn(dnn::CudnnError) -> Error {
    move |e| Error::DeviceFailure {
        op,
        device,
        source: SharedError::new(e),
    }
}

/// The owned descriptors of one call, destroyed on drop.
struct Descriptors {
    x: sys::cudnnTensorDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Descriptors::new` and is destroyed
        // once, here; a null one (creation failed part-way) is skipped.
        unsafe {
            if !self.x.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = dnn::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = dnn::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

fn contiguous_strides(dims: &[c_int]) -> Vec<c_int> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1].max(1);
    }
    s
}

impl Descriptors {
    fn new(spec: &ConvSpec, dtype: DType, device: Device) -> Result<Descriptors> {
        let (data, compute) = data_type(dtype)?;
        let fail = |op| failure(op, device);
        let mut d = Descriptors {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
        };
        d.x = dnn::create_tensor_descriptor().map_err(fail("cudnnCreateTensorDescriptor"))?;
        d.y = dnn::create_tensor_descriptor().map_err(fail("cudnnCreateTensorDescriptor"))?;
        d.w = dnn::create_filter_descriptor().map_err(fail("cudnnCreateFilterDescriptor"))?;
        d.conv = dnn::create_convolution_descriptor()
            .map_err(fail("cudnnCreateConvolutionDescriptor"))?;
        let math = match dtype {
            DType::F16 | DType::BF16 => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            DType::F32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
            _ => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        };
        let (xs, ys) = (contiguous_strides(&spec.x), contiguous_strides(&spec.y));
        // SAFETY: the descriptors are live; every array holds `len` ints as passed.
        unsafe {
            dnn::set_tensornd_descriptor(
                d.x,
                data,
                spec.x.len() as c_int,
                spec.x.as_ptr(),
                xs.as_ptr(),
            )
            .map_err(fail("cudnnSetTensorNdDescriptor"))?;
            dnn::set_tensornd_descriptor(
                d.y,
                data,
                spec.y.len() as c_int,
                spec.y.as_ptr(),
                ys.as_ptr(),
            )
            .map_err(fail("cudnnSetTensorNdDescriptor"))?;
            dnn::set_filternd_descriptor(
                d.w,
                data,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                spec.w.len() as c_int,
                spec.w.as_ptr(),
            )
            .map_err(fail("cudnnSetFilterNdDescriptor"))?;
            dnn::set_convolutionnd_descriptor(
                d.conv,
                spec.pad.len() as c_int,
                spec.pad.as_ptr(),
                spec.stride.as_ptr(),
                spec.dilation.as_ptr(),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                compute,
            )
            .map_err(fail("cudnnSetConvolutionNdDescriptor"))?;
            dnn::set_convolution_group_count(d.conv, spec.groups)
                .map_err(fail("cudnnSetConvolutionGroupCount"))?;
            dnn::set_convolution_math_type(d.conv, math)
                .map_err(fail("cudnnSetConvolutionMathType"))?;
        }
        Ok(d)
    }
}

/// Run `f` with `dc`'s cuDNN handle (created on first use, on the device's stream),
/// holding the lock that serialises calls on it.
fn with_cudnn<R>(dc: &DeviceContext, f: impl FnOnce(sys::cudnnHandle_t) -> Result<R>) -> Result<R> {
    static HANDLES: Handles<sys::cudnnHandle_t> = OnceLock::new();
    Library::Cudnn.ensure(dc.device)?;
    let create = || {
        let h = dnn::create_handle().map_err(failure("cudnnCreate", dc.device))?;
        // SAFETY: `h` is a fresh handle and the stream lives as long as the context.
        unsafe { dnn::set_stream(h, dc.stream.cu_stream() as sys::cudaStream_t) }
            .map_err(failure("cudnnSetStream", dc.device))?;
        Ok(h)
    };
    with_handle(&HANDLES, dc, create, f)
}

/// An algorithm of one pass as the heuristics rank it: its id (as the pass's enum),
/// the workspace it needs and the math type it was ranked with.
#[derive(Clone, Copy)]
enum Algo {
    Fwd(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// The heuristics' candidates for `pass`, best first: `(algo, workspace bytes, math)`,
/// only those cuDNN reports as supported, and for float32/float64 only those without
/// Tensor Core math (which would round float32 operands to TF32).
fn candidates(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    pass: Pass,
    dtype: DType,
    device: Device,
) -> Result<Vec<(Algo, usize, sys::cudnnMathType_t)>> {
    const MAX: usize = 8;
    let fail = failure("cudnnGetConvolutionAlgorithm_v7", device);
    // One pass's query: its perf struct, its `result` call with the descriptors in that
    // call's order, and the `Algo` variant of its algorithm id.
    macro_rules! ranked {
        ($perf:ty, $query:path, [$($desc:ident),+], $variant:path) => {{
            let mut n: c_int = 0;
            // SAFETY: a zeroed perf struct is a valid value (plain C data).
            let mut perf = [unsafe { std::mem::zeroed::<$perf>() }; MAX];
            // SAFETY: the descriptors are live and describe this call; the perf array
            // holds MAX entries and cuDNN writes at most the requested count.
            unsafe { $query(h, $(d.$desc),+, MAX as c_int, &mut n, perf.as_mut_ptr()) }
                .map_err(fail)?;
            perf[..(n.max(0) as usize).min(MAX)]
                .iter()
                .filter(|p| p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
                .map(|p| ($variant(p.algo), p.memory, p.mathType))
                .collect::<Vec<_>>()
        }};
    }
    let mut out = match pass {
        Pass::Forward => ranked!(
            sys::cudnnConvolutionFwdAlgoPerf_t,
            dnn::get_convolution_forward_algorithm,
            [x, w, conv, y],
            Algo::Fwd
        ),
        Pass::BackwardData => ranked!(
            sys::cudnnConvolutionBwdDataAlgoPerf_t,
            dnn::get_convolution_backward_data_algorithm,
            [w, y, conv, x],
            Algo::Data
        ),
        Pass::BackwardFilter => ranked!(
            sys::cudnnConvolutionBwdFilterAlgoPerf_t,
            dnn::get_convolution_backward_filter_algorithm,
            [x, y, conv, w],
            Algo::Filter
        ),
    };
    if matches!(dtype, DType::F32 | DType::F64) {
        out.retain(|&(_, _, m)| {
            !matches!(
                m,
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                    | sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
            )
        });
    }
    Ok(out)
}

/// `pass` of the two contiguous operands `a`, `b` (forward: x, w; backward data: dy,
/// w; backward filter: x, dy), giving a fresh contiguous result.
fn run(pass: Pass, a: &CudaStorage, b: &CudaStorage, spec: &ConvSpec) -> Result<CudaStorage> {
    let dtype = a.dtype();
    b.expect_dtype(OP, dtype)?;
    let (a_dims, b_dims, out_dims) = match pass {
        Pass::Forward => (&spec.x, &spec.w, &spec.y),
        Pass::BackwardData => (&spec.y, &spec.w, &spec.x),
        Pass::BackwardFilter => (&spec.x, &spec.y, &spec.w),
    };
    if a.len() != ConvSpec::numel(a_dims) || b.len() != ConvSpec::numel(b_dims) {
        return Err(Error::invalid(
            OP,
            format!(
                "buffers of {} and {} elements for operands of sizes {a_dims:?} and {b_dims:?}",
                a.len(),
                b.len()
            ),
        ));
    }
    let dc = device_context(a.device())?;
    let len = ConvSpec::numel(out_dims);
    if a.is_empty() || b.is_empty() || len == 0 {
        // An empty sum (or nothing to write): zeros.
        return CudaStorage::zeros(dc.device, dtype, len);
    }
    // beta = 0: cuDNN writes every element without reading the output.
    let out = CudaStorage::uninit(dc.device, dtype, len)?;
    let desc = Descriptors::new(spec, dtype, dc.device)?;
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    with_cudnn(&dc, |h| {
        type Key = (Device, DType, Pass, ConvSpec);
        type Ranked = Vec<(Algo, usize, sys::cudnnMathType_t)>;
        static RANKED: OnceLock<Mutex<HashMap<Key, Ranked>>> = OnceLock::new();
        let key = (dc.device, dtype, pass, spec.clone());
        let all = match RANKED
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
        {
            std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
            std::collections::hash_map::Entry::Vacant(v) => v
                .insert(candidates(h, &desc, pass, dtype, dc.device)?)
                .clone(),
        };
        // The first candidate whose workspace can be allocated (an out-of-memory on a
        // large workspace moves on to the next, as PyTorch does).
        let mut chosen = None;
        let mut last_err = None;
        for (algo, bytes, math) in all {
            match CudaStorage::uninit(dc.device, DType::F32, bytes.div_ceil(4)) {
                Ok(ws) => {
                    chosen = Some((algo, bytes, math, ws));
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let Some((algo, bytes, math, ws)) = chosen else {
            return Err(last_err.unwrap_or_else(|| {
                Error::invalid(OP, "cuDNN offers no algorithm for this convolution")
            }));
        };
        let fail = |op| failure(op, dc.device);
        let (ap, bp, op, wp) = (
            a.device_ptr() as *const c_void,
            b.device_ptr() as *const c_void,
            out.device_ptr() as *mut c_void,
            if bytes == 0 {
                std::ptr::null_mut()
            } else {
                ws.device_ptr() as *mut c_void
            },
        );
        // SAFETY: the descriptors describe the three live, contiguous device buffers
        // of the checked sizes on this handle's device and stream; the workspace holds
        // at least `bytes`; alpha/beta are host scalars of the compute type.
        unsafe {
            // The heuristics ranked the algorithm with this math type (PyTorch sets it
            // the same way before the call).
            dnn::set_convolution_math_type(desc.conv, math)
                .map_err(fail("cudnnSetConvolutionMathType"))?;
            match algo {
                Algo::Fwd(al) => dnn::convolution_forward(
                    h, alpha, desc.x, ap, desc.w, bp, desc.conv, al, wp, bytes, beta, desc.y, op,
                )
                .map_err(fail("cudnnConvolutionForward")),
                Algo::Data(al) => dnn::convolution_backward_data(
                    h, alpha, desc.w, bp, desc.y, ap, desc.conv, al, wp, bytes, beta, desc.x, op,
                )
                .map_err(fail("cudnnConvolutionBackwardData")),
                Algo::Filter(al) => dnn::convolution_backward_filter(
                    h, alpha, desc.x, ap, desc.y, bp, desc.conv, al, wp, bytes, beta, desc.w, op,
                )
                .map_err(fail("cudnnConvolutionBackwardFilter")),
            }
        }?;
        // The workspace returns to the caching allocator now; its reuse is ordered
        // after this call by the one stream.
        drop(ws);
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_1d_geometry_becomes_2d_of_unit_height() {
        let s = ConvSpec::new(&[2, 4, 9], &[6, 2, 3], &[2, 6, 4], &[1], &[2], &[1], 2).unwrap();
        assert_eq!(s.x, vec![2, 4, 1, 9]);
        assert_eq!(s.w, vec![6, 2, 1, 3]);
        assert_eq!(s.y, vec![2, 6, 1, 4]);
        assert_eq!(
            (s.pad, s.stride, s.dilation),
            (vec![0, 1], vec![1, 2], vec![1, 1])
        );
        assert_eq!(s.groups, 2);
        let s3 = ConvSpec::new(
            &[1, 1, 4, 5, 6],
            &[1, 1, 2, 2, 2],
            &[1, 1, 3, 4, 5],
            &[0, 0, 0],
            &[1, 1, 1],
            &[1, 1, 1],
            1,
        )
        .unwrap();
        assert_eq!(s3.x.len(), 5);
        assert_eq!(contiguous_strides(&s3.x), vec![120, 120, 30, 6, 1]);
        assert!(ConvSpec::new(&[1, 1, 4], &[1, 1, 2, 2], &[1, 1, 3], &[0], &[1], &[1], 1).is_err());
    }
}
