//! Pooling, padding, unpooling and grid sampling.
//!
//! Every op is linear in its input once its windows (or indices, or sampling plan) are
//! fixed, so each backward is the adjoint map, itself a differentiable op whose backward
//! is the forward map again: max pooling scatters the gradient to the saved argmax
//! positions (and gathers for the double backward), average pooling spreads it over the
//! windows, a pad sums it back onto the source positions. `grid_sample` with gradients is
//! built from differentiable gathers weighted by differentiable functions of the grid, so
//! both the input and the grid get first- and second-order gradients.

use amp_kernels::{DimWindows, PadMode, PoolParams};

pub use amp_kernels::{GridMode, GridPadding};
use amp_tensor::{DType, Generator, Tensor as Raw};

use super::enter;
use super::names::{
    ADAPTIVE_AVG_POOL, ADAPTIVE_MAX_POOL, AVG_POOL, CIRCULAR_PAD, CONSTANT_PAD, EMBEDDING,
    FRACTIONAL_MAX_POOL, GRID_SAMPLE, MAX_POOL, MAX_UNPOOL, REFLECTION_PAD, REPLICATION_PAD,
};
use super::pointwise::{add, link_zero, mul, sub};
use super::shape::{select, unsqueeze};
use crate::dispatch::{BodyGuard, OpName};
use crate::graph::{needs_grad, record};
use crate::{Error, Result, Tensor};

// ----- differentiable building blocks ----------------------------------------------------

/// Gather within planes by `idx` (see [`amp_kernels::plane_gather`]); its backward is
/// [`plane_scatter_add`] and vice versa, so every order of gradient exists.
fn plane_gather(x: &Tensor, n: usize, idx: &Raw) -> Result<Tensor> {
    let out = amp_kernels::plane_gather(x.data(), n, idx, 0.0)?;
    let input = x.dims()[x.rank() - n..].to_vec();
    let idx = idx.clone();
    Ok(record(out, "GatherBackward0", &[x], move |g| {
        Ok(vec![Some(plane_scatter_add(g, &idx, &input)?)])
    }))
}

/// The adjoint of [`plane_gather`]: `g` added at `idx` into zeros with spatial `input`.
fn plane_scatter_add(g: &Tensor, idx: &Raw, input: &[usize]) -> Result<Tensor> {
    let out = amp_kernels::plane_scatter(g.data(), idx, input, true)?;
    let n = input.len();
    let idx = idx.clone();
    Ok(record(out, "ScatterAddBackward0", &[g], move |gg| {
        Ok(vec![Some(plane_gather(gg, n, &idx)?)])
    }))
}

/// Average over `geo`'s windows; backward: [`avg_windows_t`]. With `link`, the gradient
/// is recorded as depending on `x` with a zero derivative (PyTorch's
/// `avg_pool2d_backward(grad, self, ...)` takes `self`), so double backward gives zeros.
fn avg_windows(
    x: &Tensor,
    geo: &[DimWindows],
    div: Option<f64>,
    name: &'static str,
    link: bool,
) -> Result<Tensor> {
    let out = amp_kernels::avg_pool_windows(name, x.data(), geo, div)?;
    let n = geo.len();
    let input = x.dims()[x.rank() - n..].to_vec();
    let geo = geo.to_vec();
    let xs = link.then(|| x.clone());
    Ok(record(out, "AvgPoolBackward0", &[x], move |g| {
        let gi = avg_windows_t(g, &input, &geo, div, name)?;
        Ok(vec![Some(match &xs {
            Some(x) => link_zero(gi, x),
            None => gi,
        })])
    }))
}

/// The adjoint of [`avg_windows`]; backward: [`avg_windows`].
fn avg_windows_t(
    g: &Tensor,
    input: &[usize],
    geo: &[DimWindows],
    div: Option<f64>,
    name: &'static str,
) -> Result<Tensor> {
    let out = amp_kernels::avg_pool_windows_backward(name, g.data(), input, geo, div)?;
    let geo = geo.to_vec();
    Ok(record(out, "AvgPoolBackwardBackward0", &[g], move |gg| {
        Ok(vec![Some(avg_windows(gg, &geo, div, name, false)?)])
    }))
}

/// A max-pool style result: values with a backward scattering to the argmax `idx`.
fn max_by_indices(
    x: &Tensor,
    vals: Raw,
    idx: Raw,
    n: usize,
    name: &'static str,
) -> (Tensor, Tensor) {
    let input = x.dims()[x.rank() - n..].to_vec();
    let saved = idx.clone();
    let xs = x.clone();
    // PyTorch's backward takes `self`: link it (zero derivative) for double backward.
    let out = record(vals, name, &[x], move |g| {
        Ok(vec![Some(link_zero(
            plane_scatter_add(g, &saved, &input)?,
            &xs,
        ))])
    });
    (out, Tensor::from_raw(idx))
}

/// `v` (one value or `n` values) as `n` values; `name` for the error.
fn per_dim(op: &'static str, v: &[usize], n: usize, name: &str) -> Result<Vec<usize>> {
    match v.len() {
        1 => Ok(vec![v[0]; n]),
        l if l == n => Ok(v.to_vec()),
        l => Err(Error::invalid(
            op,
            format!("{op}: {name} must either be a single int, or a tuple of {n} ints (got {l})"),
        )),
    }
}

/// The validated spatial sizes of `x` for an `n`-d op.
fn spatial(op: &'static str, x: &Tensor, n: usize) -> Result<Vec<usize>> {
    Ok(amp_kernels::split_spatial(op, x.dims(), n)?.1)
}

/// The pooling parameters of an `n`-d op (an empty `stride` means `kernel_size`).
fn params(
    op: &'static str,
    n: usize,
    kernel_size: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    ceil_mode: bool,
) -> Result<PoolParams> {
    let kernel = per_dim(op, kernel_size, n, "kernel_size")?;
    let stride = if stride.is_empty() {
        kernel.clone()
    } else {
        per_dim(op, stride, n, "stride")?
    };
    Ok(PoolParams {
        kernel,
        stride,
        padding: per_dim(op, padding, n, "padding")?,
        dilation: per_dim(op, dilation, n, "dilation")?,
        ceil_mode,
    })
}

// ----- max pooling -----------------------------------------------------------------------

/// `max_pool{n}d` returning `(values, indices)` (flat positions in each input plane).
/// `stride` empty means `kernel_size`; one value serves every dim.
pub fn max_pool_nd_with_indices(
    x: &Tensor,
    n: usize,
    kernel_size: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    ceil_mode: bool,
) -> Result<(Tensor, Tensor)> {
    let op = of_rank(&MAX_POOL, n)?.name();
    let ([x], _body) = enter(&MAX_POOL[n - 1], [x])?;
    let sp = spatial(op, &x, n)?;
    let p = params(op, n, kernel_size, stride, padding, dilation, ceil_mode)?;
    let geo = p.windows(op, &sp, None)?;
    let (vals, idx) = amp_kernels::max_pool_windows(op, x.data(), &[geo])?;
    Ok(max_by_indices(
        &x,
        vals,
        idx,
        n,
        "MaxPoolWithIndicesBackward0",
    ))
}

macro_rules! max_pool_fns {
    ($($n:literal => $f:ident, $fi:ident;)*) => {$(
        #[doc = concat!("`torch.nn.functional.max_pool", stringify!($n), "d` (values only); see [`max_pool_nd_with_indices`].")]
        pub fn $f(
            x: &Tensor,
            kernel_size: &[usize],
            stride: &[usize],
            padding: &[usize],
            dilation: &[usize],
            ceil_mode: bool,
        ) -> Result<Tensor> {
            Ok(max_pool_nd_with_indices(x, $n, kernel_size, stride, padding, dilation, ceil_mode)?.0)
        }
        #[doc = concat!("`max_pool", stringify!($n), "d(..., return_indices=True)`: `(values, indices)`.")]
        pub fn $fi(
            x: &Tensor,
            kernel_size: &[usize],
            stride: &[usize],
            padding: &[usize],
            dilation: &[usize],
            ceil_mode: bool,
        ) -> Result<(Tensor, Tensor)> {
            max_pool_nd_with_indices(x, $n, kernel_size, stride, padding, dilation, ceil_mode)
        }
    )*};
}

max_pool_fns! {
    1 => max_pool1d, max_pool1d_with_indices;
    2 => max_pool2d, max_pool2d_with_indices;
    3 => max_pool3d, max_pool3d_with_indices;
}

// ----- average pooling -------------------------------------------------------------------

/// `avg_pool{n}d`: window means; `count_include_pad` counts the implicit zero padding in
/// the divisor; `divisor_override` replaces the divisor.
#[allow(clippy::too_many_arguments)]
pub fn avg_pool_nd(
    x: &Tensor,
    n: usize,
    kernel_size: &[usize],
    stride: &[usize],
    padding: &[usize],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> Result<Tensor> {
    let op = of_rank(&AVG_POOL, n)?.name();
    if divisor_override == Some(0) {
        return Err(Error::invalid(op, "divisor must be not zero"));
    }
    let ([x], _body) = enter(&AVG_POOL[n - 1], [x])?;
    if n == 3 {
        // PyTorch's CPU kernel has no 16-bit instantiation in three dimensions.
        super::check::float32_or_64("avg_pool3d_out_frame", &x)?;
    }
    let sp = spatial(op, &x, n)?;
    let p = params(op, n, kernel_size, stride, padding, &[1], ceil_mode)?;
    let geo = p.windows(op, &sp, Some(count_include_pad))?;
    avg_windows(&x, &geo, divisor_override.map(|d| d as f64), op, true)
}

/// `torch.nn.functional.avg_pool1d`.
pub fn avg_pool1d(
    x: &Tensor,
    kernel_size: &[usize],
    stride: &[usize],
    padding: &[usize],
    ceil_mode: bool,
    count_include_pad: bool,
) -> Result<Tensor> {
    avg_pool_nd(
        x,
        1,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        None,
    )
}

/// The 2-d and 3-d average poolings: [`avg_pool_nd`] in a fixed number of dimensions.
macro_rules! avg_pool_fns {
    ($($(#[$doc:meta])* $fname:ident = $n:literal;)*) => {$(
        $(#[$doc])*
        pub fn $fname(
            x: &Tensor, kernel_size: &[usize], stride: &[usize], padding: &[usize],
            ceil_mode: bool, count_include_pad: bool, divisor_override: Option<i64>,
        ) -> Result<Tensor> {
            let (k, s, p, d) = (kernel_size, stride, padding, divisor_override);
            avg_pool_nd(x, $n, k, s, p, ceil_mode, count_include_pad, d)
        }
    )*};
}

avg_pool_fns! {
    /// `torch.nn.functional.avg_pool2d`.
    avg_pool2d = 2;
    /// `torch.nn.functional.avg_pool3d`.
    avg_pool3d = 3;
}

// ----- adaptive pooling ------------------------------------------------------------------

/// The adaptive output sizes: `None` keeps the input size.
fn adaptive_sizes(
    op: &'static str,
    sp: &[usize],
    output_size: &[Option<usize>],
) -> Result<Vec<usize>> {
    let n = sp.len();
    let os: Vec<Option<usize>> = match output_size.len() {
        1 => vec![output_size[0]; n],
        l if l == n => output_size.to_vec(),
        l => {
            return Err(Error::invalid(
                op,
                format!("{op}: output_size must have {n} elements (got {l})"),
            ))
        }
    };
    Ok(os.iter().zip(sp).map(|(o, s)| o.unwrap_or(*s)).collect())
}

/// The op of `ops` (its 1-d, 2-d and 3-d forms) for `n` spatial dims.
fn of_rank(ops: &'static [OpName; 3], n: usize) -> Result<&'static OpName> {
    match n {
        1..=3 => Ok(&ops[n - 1]),
        _ => Err(Error::invalid(
            ops[0].name().trim_end_matches("1d"),
            "1 to 3 spatial dims are supported",
        )),
    }
}

/// What adaptive pooling of `x` over `n` spatial dims enters dispatch as (`ops[n - 1]`)
/// and its windows per dim; the guard lives as long as the caller's op.
fn adaptive(
    ops: &'static [OpName; 3],
    x: &Tensor,
    n: usize,
    output_size: &[Option<usize>],
) -> Result<(Tensor, &'static str, Vec<DimWindows>, BodyGuard)> {
    let op = of_rank(ops, n)?.name();
    let ([x], body) = enter(&ops[n - 1], [x])?;
    let sp = spatial(op, &x, n)?;
    let os = adaptive_sizes(op, &sp, output_size)?;
    let geo: Vec<DimWindows> = sp
        .iter()
        .zip(&os)
        .map(|(&i, &o)| amp_kernels::adaptive_windows(i, o))
        .collect::<amp_tensor::Result<_>>()?;
    Ok((x, op, geo, body))
}

/// `adaptive_avg_pool{n}d`: `output_size` (one value, or one per dim; `None` keeps the
/// input size) windows `[floor(i*in/out), ceil((i+1)*in/out))`.
pub fn adaptive_avg_pool_nd(x: &Tensor, n: usize, output_size: &[Option<usize>]) -> Result<Tensor> {
    let (x, op, geo, _body) = adaptive(&ADAPTIVE_AVG_POOL, x, n, output_size)?;
    avg_windows(&x, &geo, None, op, true)
}

/// `adaptive_max_pool{n}d`: `(values, indices)` over the adaptive windows.
pub fn adaptive_max_pool_nd(
    x: &Tensor,
    n: usize,
    output_size: &[Option<usize>],
) -> Result<(Tensor, Tensor)> {
    let (x, op, geo, _body) = adaptive(&ADAPTIVE_MAX_POOL, x, n, output_size)?;
    let (vals, idx) = amp_kernels::max_pool_windows(op, x.data(), &[geo])?;
    Ok(max_by_indices(&x, vals, idx, n, "AdaptiveMaxPoolBackward0"))
}

// ----- fractional max pooling -----------------------------------------------------------

/// `fractional_max_pool{n}d` (`n` = 2 or 3): `(values, indices)`. The output size is
/// `output_size`, or `floor(input * output_ratio)`. `random_samples` (`[N, C, n]`, values
/// in `[0, 1)`, PyTorch's `_random_samples`) places the windows; without it they are
/// drawn from `gen`.
pub fn fractional_max_pool_nd(
    x: &Tensor,
    n: usize,
    kernel_size: &[usize],
    output_size: Option<&[usize]>,
    output_ratio: Option<&[f64]>,
    random_samples: Option<&Tensor>,
    gen: &mut Generator,
) -> Result<(Tensor, Tensor)> {
    if !(2..=3).contains(&n) {
        return Err(Error::invalid(
            "fractional_max_pool",
            "2 or 3 spatial dims are supported",
        ));
    }
    let name = &FRACTIONAL_MAX_POOL[n - 2];
    let op = name.name();
    let owned;
    let samples = match random_samples {
        Some(s) => s,
        None => {
            let batch = if x.rank() == n + 2 { x.dims()[0] } else { 1 };
            let ch = x
                .dims()
                .get(x.rank().wrapping_sub(n + 1))
                .copied()
                .unwrap_or(0);
            owned = Tensor::from_raw(Raw::rand([batch, ch, n], x.dtype(), gen)?);
            &owned
        }
    };
    let ([x, samples], _body) = enter(name, [x, samples])?;
    let sp = spatial(op, &x, n)?;
    let kernel = per_dim(op, kernel_size, n, "kernel_size")?;
    let out: Vec<usize> = match (output_size, output_ratio) {
        (Some(o), None) => per_dim(op, o, n, "output_size")?,
        (None, Some(r)) => {
            let r: Vec<f64> = match r.len() {
                1 => vec![r[0]; n],
                l if l == n => r.to_vec(),
                _ => return Err(Error::invalid(op, "output_ratio must have one value per dim")),
            };
            if r.iter().any(|v| !(*v > 0.0 && *v < 1.0)) {
                return Err(Error::invalid(
                    op,
                    format!("output_ratio must be between 0 and 1 (got {r:?})"),
                ));
            }
            sp.iter().zip(&r).map(|(&s, &q)| (s as f64 * q) as usize).collect()
        }
        _ => {
            return Err(Error::invalid(
                op,
                "fractional_max_pool requires specifying either an output_size or an output_ratio (exactly one)",
            ))
        }
    };
    for d in 0..n {
        if out[d] + kernel[d] - 1 > sp[d] || kernel[d] == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "{op}(): pool size {} and output size {} are too large for input size {}",
                    kernel[d], out[d], sp[d]
                ),
            ));
        }
    }
    let planes: usize = x.dims()[..x.rank() - n].iter().product();
    if samples.elem_count() != planes * n || samples.rank() != 3 || samples.dims()[2] != n {
        return Err(Error::invalid(
            op,
            format!("{op}(): expected _random_samples of shape [N, C, {n}] with N * C = {planes}, got {:?}", samples.dims()),
        ));
    }
    let sv: Vec<f64> = samples.data().to_vec_f64();
    let compute_f64 = x.dtype() == DType::F64;
    let geos: Vec<Vec<DimWindows>> = (0..planes)
        .map(|p| {
            let s = &sv[p * n..][..n];
            // 2-d: sample 0 places the width (last dim), 1 the height; 3-d: in dim order.
            (0..n)
                .map(|d| {
                    let si = if n == 2 { 1 - d } else { d };
                    if compute_f64 {
                        amp_kernels::fractional_windows(s[si], sp[d], out[d], kernel[d])
                    } else {
                        amp_kernels::fractional_windows(s[si] as f32, sp[d], out[d], kernel[d])
                    }
                })
                .collect::<amp_tensor::Result<Vec<_>>>()
        })
        .collect::<amp_tensor::Result<_>>()?;
    let (vals, idx) = amp_kernels::max_pool_windows(op, x.data(), &geos)?;
    Ok(max_by_indices(
        &x,
        vals,
        idx,
        n,
        "FractionalMaxPoolBackward0",
    ))
}

// ----- max unpooling ---------------------------------------------------------------------

/// `max_unpool{n}d`: zeros of the unpooled size with `x`'s values written at `indices`
/// (flat positions in each output plane). The output size is `output_size` (the trailing
/// `n` values are used) or `(in - 1) * stride - 2 * padding + kernel_size`.
pub fn max_unpool_nd(
    x: &Tensor,
    indices: &Tensor,
    n: usize,
    kernel_size: &[usize],
    stride: &[usize],
    padding: &[usize],
    output_size: Option<&[usize]>,
) -> Result<Tensor> {
    let op = of_rank(&MAX_UNPOOL, n)?.name();
    let ([x, indices], _body) = enter(&MAX_UNPOOL[n - 1], [x, indices])?;
    let sp = spatial(op, &x, n)?;
    if indices.dims() != x.dims() {
        return Err(Error::invalid(
            op,
            format!("Expected shape of indices to be same as that of the input tensor ({:?}) but got indices tensor with shape: {:?}", x.dims(), indices.dims()),
        ));
    }
    let p = params(op, n, kernel_size, stride, padding, &[1], false)?;
    let out: Vec<usize> = match output_size {
        Some(o) if o.len() >= n => o[o.len() - n..].to_vec(),
        Some(o) => {
            return Err(Error::invalid(
                op,
                format!(
                    "output_size should have at least {n} elements (got {})",
                    o.len()
                ),
            ))
        }
        None => (0..n)
            .map(|d| {
                let v = (sp[d] as i64 - 1) * p.stride[d] as i64 - 2 * p.padding[d] as i64
                    + p.kernel[d] as i64;
                usize::try_from(v).map_err(|_| Error::invalid(op, "the unpooled size is negative"))
            })
            .collect::<Result<_>>()?,
    };
    let idx = indices.data().clone();
    if idx.to_vec_as::<i64>().iter().any(|&i| i < 0) {
        return Err(Error::invalid(
            op,
            format!("Found an invalid max index (output volumes are of size {out:?})"),
        ));
    }
    let vals = amp_kernels::plane_scatter(x.data(), &idx, &out, false)?;
    Ok(record(vals, "MaxUnpoolBackward0", &[&x], move |g| {
        Ok(vec![Some(plane_gather(g, n, &idx)?)])
    }))
}

// ----- padding ---------------------------------------------------------------------------

/// `torch.nn.functional.pad(x, pad, mode, value)`: `pad` lists `(before, after)` pairs
/// starting from the last dim (negative values crop). `reflect` / `replicate` /
/// `circular` pad 1 to 3 trailing dims of an `(n+1)`- or `(n+2)`-d input, and enter the
/// dispatch point as `reflection_pad{n}d` / `replication_pad{n}d`; `constant` pads any
/// dims (`constant_pad_nd`) with `value`.
pub fn pad(x: &Tensor, pad: &[i64], mode: &str, value: Option<f64>) -> Result<Tensor> {
    let mode: PadMode = mode.parse()?;
    if !pad.len().is_multiple_of(2) {
        return Err(Error::invalid(
            "pad",
            "Padding length must be divisible by 2",
        ));
    }
    let n = pad.len() / 2;
    if n > x.rank() {
        return Err(Error::invalid("pad", "Padding length too large"));
    }
    if mode != PadMode::Constant {
        if value.is_some_and(|v| v != 0.0) {
            return Err(Error::invalid(
                "pad",
                format!("Padding mode \"{mode:?}\" doesn't take in value argument"),
            ));
        }
        if !(1..=3).contains(&n) || !(x.rank() == n + 1 || x.rank() == n + 2) {
            return Err(Error::invalid(
                "pad",
                format!("Only 2D, 3D, 4D, 5D padding with non-constant padding are supported for now (got a {}-d input with {} padded dims)", x.rank(), n),
            ));
        }
    }
    let name = match mode {
        PadMode::Constant => &CONSTANT_PAD,
        PadMode::Reflect => &REFLECTION_PAD[n - 1],
        PadMode::Replicate => &REPLICATION_PAD[n - 1],
        PadMode::Circular => &CIRCULAR_PAD,
    };
    let ([x], _body) = enter(name, [x])?;
    if n == 0 {
        return Ok(x);
    }
    // pad pairs run from the last dim backwards; the kernel wants the first padded dim first.
    let pairs: Vec<(i64, i64)> = (0..n).rev().map(|d| (pad[2 * d], pad[2 * d + 1])).collect();
    let input = x.dims()[x.rank() - n..].to_vec();
    let idx = amp_kernels::pad_indices(&input, &pairs, mode)?;
    let out = amp_kernels::plane_gather(x.data(), n, &idx, value.unwrap_or(0.0))?;
    let bw = match mode {
        PadMode::Constant => "ConstantPadNdBackward0",
        PadMode::Reflect => "ReflectionPadBackward0",
        PadMode::Replicate => "ReplicationPadBackward0",
        PadMode::Circular => "CircularPadBackward0",
    };
    // reflection / replication backward take `self` in PyTorch: link it (zero derivative).
    let xs = matches!(mode, PadMode::Reflect | PadMode::Replicate).then(|| x.clone());
    Ok(record(out, bw, &[&x], move |g| {
        let gi = plane_scatter_add(g, &idx, &input)?;
        Ok(vec![Some(match &xs {
            Some(x) => link_zero(gi, x),
            None => gi,
        })])
    }))
}

// ----- grid sampling ---------------------------------------------------------------------

/// `torch.nn.functional.grid_sample(input, grid, mode, padding_mode, align_corners)` for
/// 4-d (`grid` `[N, H, W, 2]`) and 5-d (`grid` `[N, D, H, W, 3]`) inputs. Differentiable
/// in `input` and in `grid` (bilinear and bicubic; nearest gives the grid a zero gradient, as PyTorch),
/// to any order.
pub fn grid_sample(
    input: &Tensor,
    grid: &Tensor,
    mode: GridMode,
    padding_mode: GridPadding,
    align_corners: bool,
) -> Result<Tensor> {
    let ([x, grid], _body) = enter(&GRID_SAMPLE, [input, grid])?;
    if !needs_grad(&[&x, &grid]) {
        return Ok(Tensor::from_raw(amp_kernels::grid_sample(
            x.data(),
            grid.data(),
            mode,
            padding_mode,
            align_corners,
        )?));
    }
    if x.dtype() != grid.dtype() {
        return Err(Error::invalid(
            "grid_sample",
            format!("grid_sampler(): expected input and grid to have the same dtype, but input has {} and grid has {}", x.dtype(), grid.dtype()),
        ));
    }
    // Differentiable form, in the compute type (f32 for 16-bit inputs).
    let dtype = x.dtype();
    let cd = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let (xc, gc) = (x.to_dtype(cd)?, grid.to_dtype(cd)?);
    let plan =
        amp_kernels::grid_sample_plan(x.dims(), gc.data(), mode, padding_mode, align_corners)?;
    let n = grid.rank() - 2;
    let k = plan.index.dims()[1];
    let corner_index = |c: usize| -> Result<Raw> {
        // [N, 1, out...]: one index row per batch, shared by the channels.
        Ok(plan.index.narrow(1, c, 1)?.try_contiguous()?)
    };
    let out = match mode {
        // The grid's gradient is zeros, as PyTorch's grid_sampler backward gives it.
        GridMode::Nearest => link_zero(plane_gather(&xc, n, &corner_index(0)?)?, &gc),
        GridMode::Bilinear | GridMode::Bicubic => {
            // t_d = coord_d - floor_d as a differentiable function of the grid:
            // coord_d = grid_d * mult_d + (coord_d - grid_d * mult_d) (piecewise linear).
            let mut t = Vec::with_capacity(n);
            for d in 0..n {
                let gd = select(&gc, -1, d as i64)?; // [N, out...]
                let pick = |r: &Raw| -> Result<Tensor> {
                    Ok(Tensor::from_raw(
                        r.narrow(1, d, 1)?.squeeze(1)?.try_contiguous()?,
                    ))
                };
                let (coord, mult, base) =
                    (pick(&plan.coord)?, pick(&plan.mult)?, pick(&plan.base)?);
                let gdv = gd.detach();
                let offset = sub(&sub(&coord, &mul(&gdv, &mult)?)?, &base)?;
                t.push(add(&mul(&gd, &mult)?, &offset)?);
            }
            // Per tap, the product over dims of its weight along each: bilinear `t` or
            // `1 - t` by the corner's bit; bicubic the cubic coefficient of its offset.
            let cubic = if mode == GridMode::Bicubic {
                t.iter().map(cubic_weights).collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            let mut acc: Option<Tensor> = None;
            for c in 0..k {
                let mut w: Option<Tensor> = None;
                for (d, td) in t.iter().enumerate() {
                    let f = if mode == GridMode::Bicubic {
                        // Tap `4·i + j`: column offset `j` along x (d = 0), row `i` along y.
                        cubic[d][if d == 0 { c % 4 } else { c / 4 }].clone()
                    } else if (c >> d) & 1 == 1 {
                        td.clone()
                    } else {
                        super::pointwise::rsub_scalar(td, 1.0)?
                    };
                    w = Some(match w {
                        None => f,
                        Some(w) => mul(&w, &f)?,
                    });
                }
                let w = unsqueeze(&w.expect("n >= 2"), 1)?;
                let v = plane_gather(&xc, n, &corner_index(c)?)?;
                let term = mul(&v, &w)?;
                acc = Some(match acc {
                    None => term,
                    Some(a) => add(&a, &term)?,
                });
            }
            acc.expect("k >= 1")
        }
    };
    let out = out.to_dtype(dtype)?;
    Ok(out)
}

/// PyTorch's bicubic coefficients of the taps at offsets -1, 0, 1, 2 for the fractions
/// `t` (the plan's weights in `amp_kernels`' `sample.rs`, `A = -0.75`), differentiable in `t`.
fn cubic_weights(t: &Tensor) -> Result<[Tensor; 4]> {
    use super::pointwise::{add_scalar, mul_scalar, rsub_scalar};
    const A: f64 = -0.75;
    // |x| <= 1: ((A + 2) x - (A + 3)) x x + 1; 1 < |x| < 2: ((A x - 5A) x + 8A) x - 4A.
    let near = |x: &Tensor| -> Result<Tensor> {
        let p = add_scalar(&mul_scalar(x, A + 2.0)?, -(A + 3.0))?;
        add_scalar(&mul(&mul(&p, x)?, x)?, 1.0)
    };
    let far = |x: &Tensor| -> Result<Tensor> {
        let p = add_scalar(&mul_scalar(x, A)?, -5.0 * A)?;
        let p = add_scalar(&mul(&p, x)?, 8.0 * A)?;
        add_scalar(&mul(&p, x)?, -4.0 * A)
    };
    Ok([
        far(&add_scalar(t, 1.0)?)?,
        near(t)?,
        near(&rsub_scalar(t, 1.0)?)?,
        far(&rsub_scalar(t, 2.0)?)?,
    ])
}

// ----- embedding with padding_idx ---------------------------------------------------------

/// `torch.nn.functional.embedding(indices, weight, padding_idx)`: rows of `weight`; the
/// `padding_idx` row (negative counts from the end) gets no gradient.
pub fn embedding_padded(
    weight: &Tensor,
    indices: &Tensor,
    padding_idx: Option<i64>,
) -> Result<Tensor> {
    let Some(p) = padding_idx else {
        return super::shape::embedding(weight, indices);
    };
    let ([weight, indices], _body) = enter(&EMBEDDING, [weight, indices])?;
    if weight.rank() != 2 {
        return Err(Error::invalid("embedding", "'weight' must be 2-D"));
    }
    let (num, dim) = (weight.dims()[0], weight.dims()[1]);
    let n = num as i64;
    if p >= n || p < -n {
        return Err(Error::invalid(
            "embedding",
            "Padding_idx must be within num_embeddings",
        ));
    }
    let pad = if p < 0 { p + n } else { p };
    let out = amp_kernels::embedding(weight.data(), indices.data())?;
    let flat = indices.data().reshape([-1i64])?.try_contiguous()?;
    Ok(record(out, "EmbeddingBackward0", &[&weight], move |g| {
        let len = flat.elem_count();
        let keep = amp_kernels::compare_scalar(amp_kernels::CmpOp::Ne, &flat, pad)?
            .to_dtype(g.dtype())?
            .reshape([len, 1])?;
        let gf = super::shape::reshape(g, [len, dim])?;
        let masked = mul(&gf, &Tensor::from_raw(keep))?;
        let z = Tensor::zeros_on([num, dim], g.dtype(), g.device())?;
        Ok(vec![Some(super::shape::index_add(
            &z,
            0,
            &Tensor::from_raw(flat.clone()),
            &masked,
            1.0,
        )?)])
    }))
}
