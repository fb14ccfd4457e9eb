//! N-d convolution (1d/2d/3d) and transposed convolution, with stride, padding,
//! dilation, groups and an optional bias, and the three backward pieces (input,
//! weight and bias gradients).
//!
//! Every operation is one of three primitives over a common geometry ("input side"
//! `[N, G·C, in...]`, weight `[G·O, C, k...]`, "output side" `[N, G·O, out...]`):
//!
//! - [`conv`]: `out = W ⋆ x` — im2col of a tile of output positions (`K = C·k...` rows,
//!   at most a few hundred columns, so the column buffer stays in cache) multiplied by
//!   the group's weight with `gemm`;
//! - [`conv_input_grad`] (the adjoint in the input, which is also [`conv_transpose`]):
//!   `cols = Wᵀ @ g` per tile, then col2im accumulates the columns into the input side;
//! - [`conv_weight_grad`] (the adjoint in the weight): `dW += g @ colsᵀ` per tile,
//!   accumulated per fixed piece of the batch, the pieces summed in order at the end.
//!
//! Samples are spread over the threads in fixed pieces ([`amp_tensor::parallel`]; each
//! `gemm` then runs single-threaded); a batch smaller than the thread count lets `gemm`
//! use the threads instead. A 1×1 convolution with stride 1 and no padding multiplies
//! the input in place (no im2col).
//! float16 and bfloat16 are widened to float32, computed with float32 accumulation
//! and rounded once; float64 computes in float64. A 16-bit 2-d 3×3 stride-1
//! convolution with enough channels goes through Winograd F(2×2, 3×3) in float32
//! instead, forward and both gradients ([`winograd`]).

use amp_tensor::pool::{try_recycled_vec, try_with_capacity, try_zeroed};
use amp_tensor::{cast_into, DType, Element, Error, Result, Tensor};
use gemm::Parallelism;

use crate::compute::{ensure_same_device, FirstError, Real};
use crate::reduce::{as_same, as_same_mut};

mod winograd;

/// Stride, padding, dilation, output padding (transposed convolutions only) and groups
/// of a convolution. A list of one value applies to every spatial dim, as PyTorch's
/// `int` form does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvParams {
    /// Step between output positions, per spatial dim.
    pub stride: Vec<usize>,
    /// Implicit zero padding on both sides, per spatial dim.
    pub padding: Vec<usize>,
    /// Spacing between kernel taps, per spatial dim.
    pub dilation: Vec<usize>,
    /// Extra size added to one side of a transposed convolution's output.
    pub output_padding: Vec<usize>,
    /// Number of channel groups.
    pub groups: usize,
}

impl Default for ConvParams {
    fn default() -> Self {
        ConvParams {
            stride: vec![1],
            padding: vec![0],
            dilation: vec![1],
            output_padding: vec![0],
            groups: 1,
        }
    }
}

impl ConvParams {
    /// Stride, padding and dilation (one value or one per spatial dim) and groups;
    /// no output padding.
    pub fn new(stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> Self {
        ConvParams {
            stride: stride.to_vec(),
            padding: padding.to_vec(),
            dilation: dilation.to_vec(),
            output_padding: vec![0],
            groups,
        }
    }

    /// The same with an output padding (for transposed convolutions).
    pub fn with_output_padding(mut self, output_padding: &[usize]) -> Self {
        self.output_padding = output_padding.to_vec();
        self
    }
}

const OP: &str = "convolution";

fn err(msg: impl Into<String>) -> Error {
    Error::invalid(OP, msg)
}

/// A per-dim parameter expanded to `[d, h, w]` (leading dims of lower-rank convs get
/// `fill`).
fn expand3(name: &str, v: &[usize], rank: usize, fill: usize) -> Result<[usize; 3]> {
    let mut out = [fill; 3];
    match v.len() {
        1 => out[3 - rank..].fill(v[0]),
        n if n == rank => out[3 - rank..].copy_from_slice(v),
        n => {
            return Err(err(format!(
                "expected {name} to be a single integer value or a list of {rank} values to \
                 match the convolution dimensions, but got {name}={v:?} ({n} values)"
            )))
        }
    }
    Ok(out)
}

/// The shape of one convolution: the input side, the weight and the output side.
#[derive(Debug, Clone)]
struct Geo {
    n: usize,
    groups: usize,
    /// Input-side channels per group.
    c: usize,
    /// Output-side channels per group.
    o: usize,
    is: [usize; 3],
    os: [usize; 3],
    k: [usize; 3],
    s: [usize; 3],
    p: [usize; 3],
    d: [usize; 3],
}

impl Geo {
    fn il(&self) -> usize {
        self.is.iter().product()
    }
    fn ol(&self) -> usize {
        self.os.iter().product()
    }
    fn kk(&self) -> usize {
        self.c * self.k.iter().product::<usize>()
    }
    /// A 1×1 convolution with stride 1 and no padding: the input is its own im2col.
    fn pointwise(&self) -> bool {
        self.k == [1; 3] && self.s == [1; 3] && self.p == [0; 3]
    }
    /// Stride 1 in height and width and an output as wide as the input ("same"
    /// padding, the common case): output rows are input rows shifted by a constant, so
    /// every row of an im2col tile is, within one depth plane, a single contiguous run
    /// of the input plus padding (see [`for_each_run`]).
    fn rows_contiguous(&self) -> bool {
        self.s[1] == 1 && self.s[2] == 1 && self.os[2] == self.is[2] && !self.pointwise()
    }
    /// Output positions per tile: the column buffer (`kk × tile`) stays near 768 KB.
    fn tile<C>(&self) -> usize {
        let per = (768 * 1024 / std::mem::size_of::<C>()) / self.kk().max(1);
        per.max(16).min(self.ol().max(1))
    }
}

/// Output size of a convolution along one dim, or `None` when it would be empty.
fn out_size(i: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d * (k - 1) + 1;
    (i + 2 * p).checked_sub(span).map(|r| r / s + 1)
}

/// Checks the parameters of a convolution whose input side has dims `x` and weight
/// `w` (`[G·O, C, k...]`), returning the geometry with the output side computed.
fn geometry(x: &[usize], w: &[usize], p: &ConvParams) -> Result<Geo> {
    let rank = w.len().checked_sub(2).filter(|r| (1..=3).contains(r));
    let Some(r) = rank else {
        return Err(err(format!(
            "expected a 3-D, 4-D or 5-D weight, but got weight of size {w:?}"
        )));
    };
    if x.len() != r + 2 {
        return Err(err(format!(
            "Expected {}D (batched) input to conv{r}d, but got input of size: {x:?}",
            r + 2
        )));
    }
    let s = expand3("stride", &p.stride, r, 1)?;
    let pad = expand3("padding", &p.padding, r, 0)?;
    let d = expand3("dilation", &p.dilation, r, 1)?;
    if s.contains(&0) {
        return Err(err("non-positive stride is not supported"));
    }
    if d.contains(&0) {
        return Err(err("dilation should be greater than zero"));
    }
    if p.groups == 0 {
        return Err(err("non-positive groups is not supported"));
    }
    let mut is = [1; 3];
    is[3 - r..].copy_from_slice(&x[2..]);
    let mut k = [1; 3];
    k[3 - r..].copy_from_slice(&w[2..]);
    if k.contains(&0) {
        return Err(err(format!("weight of size {w:?} has an empty kernel")));
    }
    let g = p.groups;
    if !w[0].is_multiple_of(g) {
        return Err(err(format!(
            "Given groups={g}, expected weight to be divisible by {g} at dimension 0, but got \
             weight of size {w:?} instead"
        )));
    }
    if x[1] != w[1] * g {
        return Err(err(format!(
            "Given groups={g}, weight of size {w:?}, expected input{x:?} to have {} channels, \
             but got {} channels instead",
            w[1] * g,
            x[1]
        )));
    }
    let mut os = [1; 3];
    for (i, o) in os.iter_mut().enumerate() {
        *o = out_size(is[i], k[i], s[i], pad[i], d[i])
            .filter(|&o| o > 0)
            .ok_or_else(|| {
                err(format!(
                    "Calculated padded input size per channel: ({}). Kernel size: ({}). Kernel \
                     size can't be greater than actual input size",
                    (0..r)
                        .map(|j| (x[2 + j] + 2 * pad[3 - r + j]).to_string())
                        .collect::<Vec<_>>()
                        .join(" x "),
                    (0..r)
                        .map(|j| (d[3 - r + j] * (w[2 + j] - 1) + 1).to_string())
                        .collect::<Vec<_>>()
                        .join(" x ")
                ))
            })?;
    }
    Ok(Geo {
        n: x[0],
        groups: g,
        c: w[1],
        o: w[0] / g,
        is,
        os,
        k,
        s,
        p: pad,
        d,
    })
}

fn out_dims(g: &Geo, channels: usize, sizes: &[usize; 3], rank: usize) -> Vec<usize> {
    let mut v = vec![g.n, channels];
    v.extend_from_slice(&sizes[3 - rank..]);
    v
}

fn check_dtypes(ts: &[(&str, &Tensor)]) -> Result<DType> {
    let dev: Vec<&Tensor> = ts.iter().map(|(_, t)| *t).collect();
    ensure_same_device(OP, &dev)?;
    let (n0, t0) = ts[0];
    let dtype = t0.dtype();
    if !dtype.is_floating_point() {
        return Err(Error::UnsupportedDType { op: OP, dtype });
    }
    for (n, t) in &ts[1..] {
        if t.dtype() != dtype {
            return Err(err(format!(
                "{n0} type ({dtype}) and {n} type ({}) should be the same",
                t.dtype()
            )));
        }
    }
    Ok(dtype)
}

/// The output dims of a convolution (`transposed = false`) or a transposed convolution
/// of an input of dims `input` with a weight of dims `weight`.
pub fn conv_output_dims(
    input: &[usize],
    weight: &[usize],
    p: &ConvParams,
    transposed: bool,
) -> Result<Vec<usize>> {
    let r = weight.len().saturating_sub(2);
    if !transposed {
        let g = geometry(input, weight, p)?;
        return Ok(out_dims(&g, g.groups * g.o, &g.os, r));
    }
    if !(1..=3).contains(&r) || input.len() != r + 2 {
        return Err(err(format!(
            "Expected {}D (batched) input to conv_transpose{r}d with weight of size {weight:?}, \
             but got input of size: {input:?}",
            r + 2
        )));
    }
    let s = expand3("stride", &p.stride, r, 1)?;
    let pad = expand3("padding", &p.padding, r, 0)?;
    let d = expand3("dilation", &p.dilation, r, 1)?;
    let op = expand3("output_padding", &p.output_padding, r, 0)?;
    if p.groups == 0 {
        return Err(err("non-positive groups is not supported"));
    }
    if input[1] != weight[0] {
        return Err(err(format!(
            "Given transposed=1, weight of size {weight:?}, expected input{input:?} to have {} \
             channels, but got {} channels instead",
            weight[0], input[1]
        )));
    }
    let mut dims = vec![input[0], weight[1] * p.groups];
    for j in 0..r {
        let i = 3 - r + j;
        if op[i] >= s[i] && op[i] >= d[i] {
            return Err(err(
                "output padding must be smaller than either stride or dilation",
            ));
        }
        let full = (input[2 + j].max(1) - 1) * s[i] + d[i] * (weight[2 + j].max(1) - 1) + op[i] + 1;
        let size = full
            .checked_sub(2 * pad[i])
            .filter(|&v| v > 0)
            .ok_or_else(|| {
                err(format!(
                "Given input size per channel {:?} and padding {:?}, the calculated output size \
                 is not positive",
                &input[2..],
                &p.padding
            ))
            })?;
        dims.push(size);
    }
    Ok(dims)
}

// ----- public API -----------------------------------------------------------------------

/// Convolution of `input` `[N, C_in, spatial...]` with `weight`
/// `[C_out, C_in / groups, kernel...]` (1, 2 or 3 spatial dims), plus `bias` `[C_out]`.
pub fn conv(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
) -> Result<Tensor> {
    let mut ts = vec![("Input", input), ("weight", weight)];
    ts.extend(bias.map(|b| ("bias", b)));
    let dtype = check_dtypes(&ts)?;
    let g = geometry(input.dims(), weight.dims(), p)?;
    check_bias(bias, g.groups * g.o)?;
    let r = weight.rank() - 2;
    let dims = out_dims(&g, g.groups * g.o, &g.os, r);
    crate::compute::on_device!(OP, [input, weight], {
        crate::cuda::route::conv(input, weight, bias, &cudnn_spec(&g, r)?, &dims)
    });
    crate::float_kernel!(dtype, OP, |T, C| forward::<T, C>(
        &g, input, weight, bias, dims
    ))
}

/// Transposed convolution of `input` `[N, C_in, spatial...]` with `weight`
/// `[C_in, C_out / groups, kernel...]`, plus `bias` `[C_out]`: the adjoint of [`conv`]
/// in its input, with the output size made exact by `output_padding`.
pub fn conv_transpose(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
) -> Result<Tensor> {
    let mut ts = vec![("Input", input), ("weight", weight)];
    ts.extend(bias.map(|b| ("bias", b)));
    check_dtypes(&ts)?;
    let dims = conv_output_dims(input.dims(), weight.dims(), p, true)?;
    check_bias(bias, dims[1])?;
    input_grad_impl(input, weight, bias, &dims, p)
}

/// The gradient of [`conv`] in its input: `grad_output` `[N, C_out, out...]` taken back
/// through `weight` to an input of dims `input_dims` (a transposed convolution).
pub fn conv_input_grad(
    grad_output: &Tensor,
    weight: &Tensor,
    input_dims: &[usize],
    p: &ConvParams,
) -> Result<Tensor> {
    check_dtypes(&[("grad_output", grad_output), ("weight", weight)])?;
    input_grad_impl(grad_output, weight, None, input_dims, p)
}

/// The gradient of [`conv`] in its weight: `input` `[N, C_in, in...]` correlated with
/// `grad_output` `[N, C_out, out...]`, giving a weight gradient of dims `weight_dims`.
pub fn conv_weight_grad(
    input: &Tensor,
    grad_output: &Tensor,
    weight_dims: &[usize],
    p: &ConvParams,
) -> Result<Tensor> {
    let dtype = check_dtypes(&[("Input", input), ("grad_output", grad_output)])?;
    let g = geometry(input.dims(), weight_dims, p)?;
    let r = weight_dims.len() - 2;
    let expect = out_dims(&g, g.groups * g.o, &g.os, r);
    if grad_output.dims() != expect.as_slice() {
        return Err(Error::shape_mismatch(OP, grad_output.dims(), &expect));
    }
    let dims = weight_dims.to_vec();
    crate::compute::on_device!(OP, [input, grad_output], {
        crate::cuda::route::conv_backward_filter(input, grad_output, &cudnn_spec(&g, r)?, &dims)
    });
    crate::float_kernel!(dtype, OP, |T, C| weight_grad::<T, C>(
        &g,
        input,
        grad_output,
        dims,
        dtype
    ))
}

/// The gradient of a convolution's bias: `grad_output` summed over every dim but the
/// channel dim (float32 accumulation for 16-bit types).
pub fn conv_bias_grad(grad_output: &Tensor) -> Result<Tensor> {
    if grad_output.rank() < 2 {
        return Err(err(format!(
            "expected a batched output gradient, got size {:?}",
            grad_output.dims()
        )));
    }
    // Two passes, each over contiguous rows: the spatial dims per (sample, channel),
    // then the batch. The partial sums stay in the compute type (float32 for 16-bit
    // types) and are rounded once. One pass over dims (0, 2, ...) would permute the
    // whole gradient into a copy first.
    let dtype = grad_output.dtype();
    let spatial: Vec<i64> = (2..grad_output.rank() as i64).collect();
    let partial = if spatial.is_empty() {
        grad_output.clone()
    } else {
        crate::reduce::sum_accumulated(grad_output, &spatial, false)?
    };
    crate::sum(&partial, &[0], false, None)?.to_dtype(dtype)
}

/// `g`'s geometry (`r` spatial dims) for cuDNN.
#[cfg(feature = "cuda")]
fn cudnn_spec(g: &Geo, r: usize) -> Result<crate::cuda::cudnn::ConvSpec> {
    let sp = 3 - r;
    crate::cuda::cudnn::ConvSpec::new(
        &out_dims(g, g.groups * g.c, &g.is, r),
        &out_dims(
            &Geo {
                n: g.groups * g.o,
                ..g.clone()
            },
            g.c,
            &g.k,
            r,
        ),
        &out_dims(g, g.groups * g.o, &g.os, r),
        &g.p[sp..],
        &g.s[sp..],
        &g.d[sp..],
        g.groups,
    )
}

fn check_bias(bias: Option<&Tensor>, channels: usize) -> Result<()> {
    match bias {
        Some(b) if b.dims() != [channels] => Err(err(format!(
            "Given weight with {channels} output channels, expected bias to be 1-D with \
             {channels} elements, but got bias of size {:?} instead",
            b.dims()
        ))),
        _ => Ok(()),
    }
}

fn input_grad_impl(
    grad: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    input_dims: &[usize],
    p: &ConvParams,
) -> Result<Tensor> {
    let dtype = grad.dtype();
    let g = geometry(input_dims, weight.dims(), p)?;
    let r = weight.rank() - 2;
    let expect = out_dims(&g, g.groups * g.o, &g.os, r);
    if grad.dims() != expect.as_slice() {
        return Err(Error::shape_mismatch(OP, grad.dims(), &expect));
    }
    let dims = input_dims.to_vec();
    crate::compute::on_device!(OP, [grad, weight], {
        crate::cuda::route::conv_backward_data(grad, weight, bias, &cudnn_spec(&g, r)?, &dims)
    });
    crate::float_kernel!(dtype, OP, |T, C| backward_data::<T, C>(
        &g, grad, weight, bias, dims
    ))
}

// ----- execution ------------------------------------------------------------------------

/// Calls `f` with `t`'s elements as a contiguous slice of its own type `T`.
fn with_storage<T: Element, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    let t = t.try_contiguous()?;
    let st = t.storage();
    let all = T::slice(st.cpu()?).ok_or(Error::UnsupportedDType {
        op: OP,
        dtype: t.dtype(),
    })?;
    let r = t.layout().contiguous_range().expect("contiguous");
    Ok(f(&all[r]))
}

/// `src` in compute type `C`: itself when `T` is `C`, else widened into `buf`
/// (one sample's plane set at a time, so the copy stays in cache).
fn widened<'a, T: Element, C: Element>(src: &'a [T], buf: &'a mut [C]) -> &'a [C] {
    match as_same::<T, C>(src) {
        Some(s) => s,
        None => {
            let buf = &mut buf[..src.len()];
            cast_into(src, buf);
            buf
        }
    }
}

/// Calls `f` with `t`'s elements in compute type `C`, contiguous (borrowed when `t`
/// already is a contiguous `C` tensor, widened otherwise).
fn with_compute<C: Real, R>(t: &Tensor, f: impl FnOnce(&[C]) -> R) -> Result<R> {
    let t = if t.dtype() == C::DTYPE {
        t.try_contiguous()?
    } else {
        t.to_dtype(C::DTYPE)?.try_contiguous()?
    };
    let st = t.storage();
    let all = C::slice(st.cpu()?).ok_or(Error::UnsupportedDType {
        op: OP,
        dtype: t.dtype(),
    })?;
    let r = t.layout().contiguous_range().expect("contiguous");
    Ok(f(&all[r]))
}

/// A result computed in `C`, rounded once to `dtype`.
fn finish<C: Real>(buf: Vec<C>, dims: Vec<usize>, dtype: DType) -> Result<Tensor> {
    let t = Tensor::from_vec(buf, dims)?;
    if dtype == C::DTYPE {
        Ok(t)
    } else {
        t.to_dtype(dtype)
    }
}

/// Whether samples go to separate workers (else each `gemm` uses the threads).
fn per_sample(n: usize) -> bool {
    let threads = rayon::current_num_threads();
    threads > 1 && n >= threads
}

/// The fewest samples a worker takes when samples go to separate workers: about two
/// pieces per thread, so each worker's scratch (up to a few MiB, zeroed when made) is
/// made a few times per call, not once per sample, with pieces left to balance the load.
fn samples_per_piece(n: usize) -> usize {
    (n / (2 * rayon::current_num_threads())).max(1)
}

fn gemm_par(work: usize, batch_parallel: bool) -> Parallelism {
    if batch_parallel || work < 32 * 32 * 32 || rayon::current_num_threads() <= 1 {
        Parallelism::None
    } else {
        Parallelism::Rayon(0)
    }
}

/// A strided matrix operand: `(slice, row stride, column stride)`.
pub(crate) type Mat<'a, C> = (&'a [C], usize, usize);

/// `dst = (accumulate ? dst : 0) + a @ b` for an `m×k` `a` and a `k×n` `b`, `dst` being
/// `m×n` with row stride `dst_rs` (column stride 1).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_into<C: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [C],
    dst_rs: usize,
    accumulate: bool,
    a: Mat<'_, C>,
    b: Mat<'_, C>,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    let need = |rs: usize, cs: usize, rows: usize, cols: usize| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * rs + (cols - 1) * cs + 1
        }
    };
    assert!(dst.len() >= need(dst_rs, 1, m, n), "conv gemm: dst");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                dst[i * dst_rs..i * dst_rs + n].fill(C::zero());
            }
        }
        return;
    }
    assert!(a.0.len() >= need(a.1, a.2, m, k), "conv gemm: lhs");
    assert!(b.0.len() >= need(b.1, b.2, k, n), "conv gemm: rhs");
    // SAFETY: the asserts above keep every access of the three strided matrices inside
    // their slices; `dst` is exclusively borrowed and the product writes each of its m×n
    // elements once (reading them only when `accumulate`). `C` is f32 or f64 (the only
    // compute types), so the pointer casts below reinterpret a type as itself.
    unsafe {
        let d = dst.as_mut_ptr();
        let (pa, pb) = (a.0.as_ptr(), b.0.as_ptr());
        let shape = (m, n, k, dst_rs, accumulate, (a.1, a.2), (b.1, b.2), par);
        if C::DTYPE == DType::F32 {
            faer_gemm::<f32>(d.cast(), pa.cast(), pb.cast(), shape);
        } else {
            faer_gemm::<f64>(d.cast(), pa.cast(), pb.cast(), shape);
        }
    }
}

/// `(m, n, k, dst row stride, accumulate, lhs strides, rhs strides, parallelism)`.
type GemmShape = (
    usize,
    usize,
    usize,
    usize,
    bool,
    (usize, usize),
    (usize, usize),
    Parallelism,
);

/// `faer`'s product (AVX-512 kernels where the CPU has them) on raw strided matrices,
/// through the matmul module's [`crate::matmul::faer_matmul`] (its block split when
/// `par` asks for threads).
///
/// # Safety
/// The three matrices must lie in valid allocations; `d` exclusively borrowed.
unsafe fn faer_gemm<F: crate::matmul::GemmFloat>(
    d: *mut F,
    a: *const F,
    b: *const F,
    (m, n, k, dst_rs, accumulate, (ars, acs), (brs, bcs), par): GemmShape,
) {
    use faer::{Accum, MatMut, MatRef};
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    // SAFETY: as the caller guarantees.
    unsafe {
        let lhs = MatRef::from_raw_parts(a, m, k, ars as isize, acs as isize);
        let rhs = MatRef::from_raw_parts(b, k, n, brs as isize, bcs as isize);
        let dst = MatMut::from_raw_parts_mut(d, m, n, dst_rs as isize, 1);
        crate::matmul::faer_matmul(dst, accum, lhs, rhs, F::one(), par);
    }
}

/// The rows of one input-side row that tap `(k_off)` reads for output columns
/// `x0 .. x0 + len`: `q` in `lo..hi` reads `row[(x0 + q)·s + k_off − p]`, the others read
/// padding.
#[inline]
fn valid_range(
    x0: usize,
    len: usize,
    s: usize,
    k_off: usize,
    p: usize,
    width: usize,
) -> (usize, usize) {
    let lo_abs = if k_off >= p {
        0
    } else {
        (p - k_off).div_ceil(s)
    };
    let hi_abs = if width + p > k_off {
        (width + p - k_off).div_ceil(s)
    } else {
        0
    };
    let lo = lo_abs.saturating_sub(x0).min(len);
    let hi = hi_abs.saturating_sub(x0).clamp(lo, len);
    (lo, hi)
}

/// A run of output columns whose input row exists: column `q` in `lo..hi` reads input
/// element `start + q·s − p`; the others read padding.
#[derive(Clone, Copy)]
struct Segment {
    start: usize,
    lo: usize,
    hi: usize,
    s: usize,
}

/// Walks the rows of a `kk × t` column tile for output positions `l0 .. l0 + t`,
/// calling `f(tile_row, col_start, len, segment)` for every run of columns in one
/// output row (`segment` is `None` when the input row is padding).
#[inline]
fn for_each_segment(
    g: &Geo,
    l0: usize,
    t: usize,
    mut f: impl FnMut(usize, usize, usize, Option<Segment>),
) {
    let [_, oh, ow] = g.os;
    let [id, ih, iw] = g.is;
    let [kd, kh, kw] = g.k;
    let il = g.il();
    let mut r = 0;
    for ci in 0..g.c {
        for a in 0..kd {
            for b in 0..kh {
                for e in 0..kw {
                    let mut l = l0;
                    let end = l0 + t;
                    let mut j = 0;
                    while l < end {
                        let xw = l % ow;
                        let rest = l / ow;
                        let yh = rest % oh;
                        let zd = rest / oh;
                        let len = (ow - xw).min(end - l);
                        let zi = (zd * g.s[0] + a * g.d[0]) as isize - g.p[0] as isize;
                        let yi = (yh * g.s[1] + b * g.d[1]) as isize - g.p[1] as isize;
                        if zi < 0 || zi >= id as isize || yi < 0 || yi >= ih as isize {
                            f(r, j, len, None);
                        } else {
                            let base = ci * il + (zi as usize * ih + yi as usize) * iw;
                            let koff = e * g.d[2];
                            let range = valid_range(xw, len, g.s[2], koff, g.p[2], iw);
                            let seg = Segment {
                                start: base + xw * g.s[2] + koff,
                                lo: range.0,
                                hi: range.1,
                                s: g.s[2],
                            };
                            f(r, j, len, Some(seg));
                        }
                        l += len;
                        j += len;
                    }
                    r += 1;
                }
            }
        }
    }
}

/// im2col of output positions `l0 .. l0 + t` of one (sample, group) input plane set
/// `x` (`c × il`) into `cols` (`kk × t`).
fn im2col<C: Real>(x: &[C], g: &Geo, l0: usize, t: usize, cols: &mut [C]) {
    let p = g.p[2];
    for_each_segment(g, l0, t, |r, j, len, seg| {
        let dst = &mut cols[r * t + j..r * t + j + len];
        let Some(Segment { start, lo, hi, s }) = seg else {
            dst.fill(C::zero());
            return;
        };
        dst[..lo].fill(C::zero());
        dst[hi..].fill(C::zero());
        if hi > lo {
            let first = start + lo * s - p;
            if s == 1 {
                dst[lo..hi].copy_from_slice(&x[first..first + hi - lo]);
            } else {
                for (q, v) in dst[lo..hi].iter_mut().enumerate() {
                    *v = x[first + q * s];
                }
            }
        }
    });
}

/// One piece of a tile row in the [`Geo::rows_contiguous`] walk.
#[derive(Clone, Copy)]
enum Piece {
    /// Tile columns `j .. j + len` read padding rows (or planes).
    Zero { j: usize, len: usize },
    /// Tile columns `j .. j + len` read input elements `src ..` one for one, except
    /// the padding columns at the ends of each output row ([`Run::pads`]).
    Run(Run),
}

#[derive(Clone, Copy)]
struct Run {
    j: usize,
    len: usize,
    src: usize,
    /// Position in the output plane of the run's first column.
    q: usize,
    /// Output (= input) width.
    ow: usize,
    /// Horizontal shift of the tap: output column `xw` reads input column `xw + dx`.
    dx: isize,
}

impl Run {
    /// Calls `f(j, len)` for the run's tile columns that read padding: the first `-dx`
    /// (or last `dx`) columns of each output row it covers.
    fn pads(&self, mut f: impl FnMut(usize, usize)) {
        let ow = self.ow;
        let w = self.dx.unsigned_abs().min(ow);
        let (c0, c1) = if self.dx < 0 { (0, w) } else { (ow - w, ow) };
        if c0 == c1 {
            return;
        }
        let (qa, qb) = (self.q, self.q + self.len);
        let mut row = qa / ow * ow;
        while row < qb {
            let (a, b) = ((row + c0).max(qa), (row + c1).min(qb));
            if a < b {
                f(self.j + a - qa, b - a);
            }
            row += ow;
        }
    }
}

/// The [`Geo::rows_contiguous`] walk of a `kk × t` tile for output positions
/// `l0 .. l0 + t`: `f(tile_row, piece)` for every piece of every row, at most one
/// [`Piece::Run`] per row and depth plane, so the copies are long (whole rows of
/// output rows) instead of one per output row.
fn for_each_run(g: &Geo, l0: usize, t: usize, mut f: impl FnMut(usize, Piece)) {
    let [_, oh, ow] = g.os;
    let [id, ih, iw] = g.is;
    let [kd, kh, kw] = g.k;
    let (il, plane_in, plane) = (g.il(), ih * iw, oh * ow);
    let end = l0 + t;
    let mut r = 0;
    for ci in 0..g.c {
        for a in 0..kd {
            for b in 0..kh {
                let dy = (b * g.d[1]) as isize - g.p[1] as isize;
                for e in 0..kw {
                    let dx = (e * g.d[2]) as isize - g.p[2] as isize;
                    let shift = dy * iw as isize + dx;
                    // Plane positions whose input row exists and whose input element
                    // lies inside the plane (the others are padding).
                    let lo =
                        ((-dy).clamp(0, oh as isize) as usize * ow).max((-shift).max(0) as usize);
                    let hi = ((ih as isize - dy).clamp(0, oh as isize) as usize * ow)
                        .min((plane_in as isize - shift).max(0) as usize);
                    let mut l = l0;
                    while l < end {
                        let zd = l / plane;
                        let q0 = l - zd * plane;
                        let len = (plane - q0).min(end - l);
                        let j = l - l0;
                        let zi = (zd * g.s[0] + a * g.d[0]) as isize - g.p[0] as isize;
                        if zi < 0 || zi >= id as isize {
                            f(r, Piece::Zero { j, len });
                        } else {
                            let qa = lo.clamp(q0, q0 + len);
                            let qb = hi.clamp(qa, q0 + len);
                            if qa > q0 {
                                f(r, Piece::Zero { j, len: qa - q0 });
                            }
                            if qb > qa {
                                let src = ci * il + zi as usize * plane_in;
                                let run = Run {
                                    j: j + qa - q0,
                                    len: qb - qa,
                                    src: (src as isize + qa as isize + shift) as usize,
                                    q: qa,
                                    ow,
                                    dx,
                                };
                                f(r, Piece::Run(run));
                            }
                            if q0 + len > qb {
                                f(
                                    r,
                                    Piece::Zero {
                                        j: j + qb - q0,
                                        len: q0 + len - qb,
                                    },
                                );
                            }
                        }
                        l += len;
                    }
                    r += 1;
                }
            }
        }
    }
}

/// `dst = src` in `dst`'s type (a copy, or a vectorised widening cast).
fn copy_into<T: Element, C: Real>(src: &[T], dst: &mut [C]) {
    match as_same::<T, C>(src) {
        Some(s) => dst.copy_from_slice(s),
        None => cast_into(src, dst),
    }
}

/// im2col for [`Geo::rows_contiguous`] convolutions, straight from the input's own
/// dtype `T` (16-bit inputs are widened run by run, with no plane copy).
fn im2col_rows<T: Element, C: Real>(x: &[T], g: &Geo, l0: usize, t: usize, cols: &mut [C]) {
    for_each_run(g, l0, t, |r, piece| {
        let row = &mut cols[r * t..(r + 1) * t];
        match piece {
            Piece::Zero { j, len } => row[j..j + len].fill(C::zero()),
            Piece::Run(run) => {
                copy_into(
                    &x[run.src..run.src + run.len],
                    &mut row[run.j..run.j + run.len],
                );
                run.pads(|j, len| row[j..j + len].fill(C::zero()));
            }
        }
    });
}

/// col2im for [`Geo::rows_contiguous`] convolutions: each run's padding columns are
/// cleared in the (scratch) tile, then the run is added to the input planes at once.
fn col2im_rows<C: Real>(cols: &mut [C], g: &Geo, l0: usize, t: usize, x: &mut [C]) {
    for_each_run(g, l0, t, |r, piece| {
        if let Piece::Run(run) = piece {
            let row = &mut cols[r * t..(r + 1) * t];
            run.pads(|j, len| row[j..j + len].fill(C::zero()));
            let src = &row[run.j..run.j + run.len];
            for (d, &v) in x[run.src..run.src + run.len].iter_mut().zip(src) {
                *d = *d + v;
            }
        }
    });
}

/// col2im: add a `kk × t` column tile back into the input planes `x` (`c × il`).
fn col2im<C: Real>(cols: &[C], g: &Geo, l0: usize, t: usize, x: &mut [C]) {
    let p = g.p[2];
    for_each_segment(g, l0, t, |r, j, _len, seg| {
        let Some(Segment { start, lo, hi, s }) = seg else {
            return;
        };
        if hi > lo {
            let src = &cols[r * t + j + lo..r * t + j + hi];
            let first = start + lo * s - p;
            if s == 1 {
                for (d, &v) in x[first..first + hi - lo].iter_mut().zip(src) {
                    *d = *d + v;
                }
            } else {
                for (q, &v) in src.iter().enumerate() {
                    x[first + q * s] = x[first + q * s] + v;
                }
            }
        }
    });
}

/// Runs `f(sample, out, cols, extra, par)` for every sample, in parallel over samples
/// when [`per_sample`] says so. `out` is the sample's `per` outputs in `C`: the output
/// chunk itself when `T` is `C`, else a scratch tile rounded once into the chunk after
/// `f`. `cols` is a `cols_len` column tile; `extra` is `extra_len` more `C` scratch for
/// widening 16-bit operands (empty when `T` is `C`, where [`widened`] needs none).
/// [`Error::OutOfMemory`] when the scratch cannot be allocated.
fn for_samples<T: Element, C: Real>(
    out: &mut [T],
    per: usize,
    n: usize,
    (cols_len, extra_len): (usize, usize),
    f: impl Fn(usize, &mut [C], &mut [C], &mut [C], Parallelism) + Send + Sync,
) -> Result<()> {
    if per == 0 {
        return Ok(());
    }
    let convert = T::DTYPE != C::DTYPE;
    let scratch_len = cols_len + if convert { per + extra_len } else { 0 };
    let run = |i: usize, o: &mut [T], scratch: &mut Vec<C>, par: Parallelism| {
        let (cols, rest) = scratch.split_at_mut(cols_len);
        match as_same_mut::<T, C>(o) {
            Some(y) => f(i, y, cols, rest, par),
            None => {
                let (y, extra) = rest.split_at_mut(per);
                f(i, y, cols, extra, par);
                cast_into(y, o);
            }
        }
    };
    if per_sample(n) {
        // One task per piece of `m` samples, each with its own scratch; a piece whose
        // scratch cannot be had skips its samples and the error is returned.
        let m = samples_per_piece(n);
        let failed = FirstError::new();
        amp_tensor::parallel::for_each_chunk_mut(out, m * per, &|k, piece| {
            let mut scratch = match try_zeroed::<C>(scratch_len) {
                Ok(s) => s,
                Err(e) => return failed.record(Err(e)),
            };
            for (j, o) in piece.chunks_mut(per).enumerate() {
                run(k * m + j, o, &mut scratch, Parallelism::None);
            }
        });
        failed.into_result()
    } else {
        let mut scratch = try_zeroed::<C>(scratch_len)?;
        for (i, o) in out.chunks_mut(per).enumerate() {
            run(i, o, &mut scratch, Parallelism::Rayon(0));
        }
        Ok(())
    }
}

/// A bias in compute type `C`.
fn bias_in<C: Real>(bias: Option<&Tensor>) -> Result<Option<Vec<C>>> {
    bias.map(|b| {
        with_compute::<C, _>(b, |s| -> Result<Vec<C>> {
            let mut v = try_with_capacity(s.len())?;
            v.extend_from_slice(s);
            Ok(v)
        })?
    })
    .transpose()
}

/// Forward: per sample, im2col straight from the input's own dtype into `C` columns,
/// `gemm` into a `C` output tile, rounded once into the `T` output (for float32 and
/// float64 the output is written in place).
fn forward<T: Element, C: Real>(
    g: &Geo,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    dims: Vec<usize>,
) -> Result<Tensor> {
    let (il, ol, kk) = (g.il(), g.ol(), g.kk());
    let per = g.groups * g.o * ol;
    let mut out = try_recycled_vec::<T>(g.n.saturating_mul(per))?;
    let bias = bias_in::<C>(bias)?;
    let t = g.tile::<C>();
    let pointwise = g.pointwise();
    let rows = g.rows_contiguous();
    // 16-bit 3×3 convolutions: Winograd in float32 (see `winograd`).
    let wino = (T::DTYPE != C::DTYPE && winograd::applies(g)).then(|| winograd::Plan::new(g));
    let cols_len = match &wino {
        Some(plan) => plan.scratch_len(g),
        None if pointwise => 0,
        None => kk * t,
    };
    // 16-bit inputs: the contiguous-rows im2col widens as it copies; otherwise one
    // group's input planes are widened once, in cache, and im2col copies as for float32.
    let scratch = (cols_len, if rows || wino.is_some() { 0 } else { g.c * il });
    with_storage::<T, _>(input, |x| {
        with_compute::<C, _>(weight, |w| {
            let u = wino
                .as_ref()
                .and_then(|_| as_same::<C, f32>(w).map(|w| winograd::weights(w, g)))
                .transpose()?;
            for_samples(&mut out, per, g.n, scratch, |i, y, cols, xbuf, par| {
                let par = gemm_par(g.o * kk * ol, matches!(par, Parallelism::None));
                if let Some(b) = &bias {
                    for (row, &bv) in y.chunks_mut(ol).zip(b) {
                        row.fill(bv);
                    }
                }
                if let (Some(plan), Some(u), Some(y), Some(s)) = (
                    &wino,
                    &u,
                    as_same_mut::<C, f32>(&mut *y),
                    as_same_mut::<C, f32>(&mut *cols),
                ) {
                    let xs = &x[i * g.groups * g.c * il..][..g.groups * g.c * il];
                    let job = winograd::Sample {
                        x: xs,
                        u,
                        y,
                        bias: bias.is_some(),
                        scratch: s,
                        par,
                    };
                    return winograd::run(g, plan, job);
                }
                for gi in 0..g.groups {
                    let xg = &x[(i * g.groups + gi) * g.c * il..][..g.c * il];
                    let wg: Mat<'_, C> = (&w[gi * g.o * kk..][..g.o * kk], kk, 1);
                    let yg = &mut y[gi * g.o * ol..][..g.o * ol];
                    let xc: &[C] = if rows { &[] } else { widened(xg, &mut *xbuf) };
                    let mut l0 = 0;
                    while l0 < ol {
                        let tt = t.min(ol - l0);
                        let b: Mat<'_, C> = if pointwise {
                            (&xc[l0..], il, 1)
                        } else {
                            if rows {
                                im2col_rows(xg, g, l0, tt, cols);
                            } else {
                                im2col(xc, g, l0, tt, cols);
                            }
                            (&cols[..kk * tt], tt, 1)
                        };
                        gemm_into(g.o, tt, kk, &mut yg[l0..], ol, bias.is_some(), wg, b, par);
                        l0 += tt;
                    }
                }
            })
        })
    })???;
    Tensor::from_vec(out, dims)
}

/// Input gradient (transposed convolution): per sample, the output gradient widened
/// to `C` in cache, `gemm` + col2im into a `C` tile, rounded once into the `T` result.
fn backward_data<T: Element, C: Real>(
    g: &Geo,
    grad: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    dims: Vec<usize>,
) -> Result<Tensor> {
    // 16-bit 3×3 convolutions: the input gradient is the forward convolution of
    // `data_grad`'s geometry with the kernel turned by 180°, which goes through
    // Winograd in float32 like any forward.
    if T::DTYPE != C::DTYPE {
        if let Some(tg) = winograd::data_grad(g) {
            let flipped = with_storage::<T, _>(weight, |w| winograd::flipped(w, g))??;
            let mut wdims = weight.dims().to_vec();
            (wdims[0], wdims[1]) = (g.groups * g.c, g.o);
            let flipped = Tensor::from_vec(flipped, wdims)?;
            return forward::<T, C>(&tg, grad, &flipped, bias, dims);
        }
    }
    let (il, ol, kk) = (g.il(), g.ol(), g.kk());
    let per = g.groups * g.c * il;
    let mut out = try_recycled_vec::<T>(g.n.saturating_mul(per))?;
    let bias = bias_in::<C>(bias)?;
    let t = g.tile::<C>();
    let pointwise = g.pointwise();
    let rows = g.rows_contiguous();
    let cols_len = if pointwise { 0 } else { kk * t };
    // 16-bit gradients: one group's output gradient widened in cache.
    let scratch = (cols_len, g.o * ol);
    with_storage::<T, _>(grad, |gy| {
        with_compute::<C, _>(weight, |w| {
            for_samples(&mut out, per, g.n, scratch, |i, x, cols, gbuf, par| {
                let par = gemm_par(g.o * kk * ol, matches!(par, Parallelism::None));
                x.fill(C::zero());
                for gi in 0..g.groups {
                    let gyt = &gy[(i * g.groups + gi) * g.o * ol..][..g.o * ol];
                    let gyg = widened(gyt, &mut *gbuf);
                    // Wᵀ: kk × o, element (r, o) at o*kk + r.
                    let wt: Mat<'_, C> = (&w[gi * g.o * kk..][..g.o * kk], 1, kk);
                    let xg = &mut x[gi * g.c * il..][..g.c * il];
                    let mut l0 = 0;
                    while l0 < ol {
                        let tt = t.min(ol - l0);
                        let b: Mat<'_, C> = (&gyg[l0..], ol, 1);
                        if pointwise {
                            gemm_into(kk, tt, g.o, &mut xg[l0..], il, false, wt, b, par);
                        } else {
                            gemm_into(kk, tt, g.o, cols, tt, false, wt, b, par);
                            if rows {
                                col2im_rows(&mut cols[..kk * tt], g, l0, tt, xg);
                            } else {
                                col2im(&cols[..kk * tt], g, l0, tt, xg);
                            }
                        }
                        l0 += tt;
                    }
                }
                if let Some(b) = &bias {
                    for (row, &bv) in x.chunks_mut(il).zip(b) {
                        row.iter_mut().for_each(|v| *v = *v + bv);
                    }
                }
            })
        })
    })???;
    Tensor::from_vec(out, dims)
}

/// Weight gradient: per sample, im2col straight from the input's dtype and the output
/// gradient widened in cache, accumulated in `C` and rounded once.
fn weight_grad<T: Element, C: Real>(
    g: &Geo,
    input: &Tensor,
    grad: &Tensor,
    dims: Vec<usize>,
    dtype: DType,
) -> Result<Tensor> {
    let (il, ol, kk) = (g.il(), g.ol(), g.kk());
    let wlen = g.groups * g.o * kk;
    let t = g.tile::<C>();
    let pointwise = g.pointwise();
    let rows = g.rows_contiguous();
    let convert = T::DTYPE != C::DTYPE;
    let cols_len = if pointwise { 0 } else { kk * t };
    // Scratch: the column tile, then (16-bit types) one group's output gradient and
    // (unless the contiguous-rows im2col widens as it copies) its input planes in C.
    let extra = match (convert, rows) {
        (false, _) => 0,
        (true, true) => g.o * ol,
        (true, false) => g.o * ol + g.c * il,
    };
    // 16-bit 3×3 convolutions: Winograd in float32, summed in the transformed domain.
    let wino = (convert && winograd::applies(g)).then(|| winograd::Plan::new(g));
    let (wlen, scratch_len) = match &wino {
        Some(plan) => (g.groups * 16 * g.o * g.c, plan.scratch_len(g)),
        None => (wlen, cols_len + extra),
    };
    let acc = with_storage::<T, _>(input, |x| {
        with_storage::<T, _>(grad, |gy| {
            let one = |i: usize, acc: &mut [C], scratch: &mut [C], par: Parallelism| {
                if let (Some(plan), Some(acc), Some(scratch)) = (
                    &wino,
                    as_same_mut::<C, f32>(&mut *acc),
                    as_same_mut::<C, f32>(&mut *scratch),
                ) {
                    let (xl, yl) = (g.groups * g.c * il, g.groups * g.o * ol);
                    let job = winograd::Grad {
                        x: &x[i * xl..][..xl],
                        gy: &gy[i * yl..][..yl],
                        acc,
                        scratch,
                        par,
                    };
                    return winograd::run(g, plan, job);
                }
                let (cols, rest) = scratch.split_at_mut(cols_len);
                let (gbuf, xbuf) = rest.split_at_mut(if convert { g.o * ol } else { 0 });
                for gi in 0..g.groups {
                    let xg = &x[(i * g.groups + gi) * g.c * il..][..g.c * il];
                    let gyt = &gy[(i * g.groups + gi) * g.o * ol..][..g.o * ol];
                    let gyg = widened(gyt, &mut *gbuf);
                    let xc: &[C] = if rows { &[] } else { widened(xg, &mut *xbuf) };
                    let ag = &mut acc[gi * g.o * kk..][..g.o * kk];
                    let mut l0 = 0;
                    while l0 < ol {
                        let tt = t.min(ol - l0);
                        let a: Mat<'_, C> = (&gyg[l0..], ol, 1);
                        // colsᵀ: tt × kk, element (l, r) at r*rs + l.
                        let b: Mat<'_, C> = if pointwise {
                            (&xc[l0..], 1, il)
                        } else {
                            if rows {
                                im2col_rows(xg, g, l0, tt, cols);
                            } else {
                                im2col(xc, g, l0, tt, cols);
                            }
                            (&cols[..kk * tt], 1, tt)
                        };
                        gemm_into(g.o, kk, tt, ag, kk, true, a, b, par);
                        l0 += tt;
                    }
                }
            };
            if per_sample(g.n) {
                // Fixed pieces of `m` samples, each summed from zero into its own
                // buffer, then added in piece order: the sums do not depend on which
                // thread ran which piece, or when (rayon's `try_fold` cut its pieces
                // where work was stolen, so the grouping of the sums varied).
                let m = samples_per_piece(g.n);
                let pieces = amp_tensor::parallel::map(g.n.div_ceil(m), &|k| -> Result<Vec<C>> {
                    let (mut acc, mut cols) =
                        (try_zeroed::<C>(wlen)?, try_zeroed::<C>(scratch_len)?);
                    for i in k * m..((k + 1) * m).min(g.n) {
                        one(i, &mut acc, &mut cols, Parallelism::None);
                    }
                    Ok(acc)
                });
                let mut pieces = pieces.into_iter();
                let mut acc = pieces.next().expect("per_sample: at least one sample")?;
                for p in pieces {
                    acc.iter_mut().zip(&p?).for_each(|(x, y)| *x = *x + *y);
                }
                Ok(acc)
            } else {
                let mut acc = try_zeroed::<C>(wlen)?;
                let mut cols = try_zeroed::<C>(scratch_len)?;
                let par = gemm_par(g.o * kk * ol, false);
                for i in 0..g.n {
                    one(i, &mut acc, &mut cols, par);
                }
                Ok(acc)
            }
        })
    })???;
    let mut acc = acc;
    if let (Some(_), Some(sums)) = (&wino, as_same_mut::<C, f32>(&mut acc)) {
        // Turned into the gradient, which takes the front of the (larger) buffer.
        let w = winograd::weight_grad(sums, g)?;
        sums[..w.len()].copy_from_slice(&w);
        acc.truncate(w.len());
    }
    finish(acc, dims, dtype)
}
