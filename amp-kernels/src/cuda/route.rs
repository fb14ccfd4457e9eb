//! The device side of each op family: what a public kernel entry runs when its tensors
//! are on a CUDA device. Each family's entry calls `compute::on_device!` first, which
//! lands here; nothing here falls back to the host.
//!
//! Ops are built from the launchers in `cuda::host` (elementwise, row reductions,
//! softmax, layer norm, cuBLAS products, the AMP kernels) and from each other: a
//! reduction over any dims is a permutation plus a row reduction, a softmax backward is
//! a product, a row sum and a difference. A composite over 16-bit tensors computes in
//! float32 and rounds once at the end, as the host kernels and PyTorch's do. An op or a
//! dtype that has no device kernel returns [`Error::NoDeviceKernel`] naming the op.

use amp_tensor::cuda::CudaStorage;
use amp_tensor::{result_type, DType, Device, Error, Layout, Operand, Result, Scalar, Tensor};

use super::host;
use super::sources::BINARY_OPS;
use crate::{BinaryOp, UnaryOp};

/// The device buffer of a device tensor, handed to `f` under the storage's read lock.
fn with_buf<R>(t: &Tensor, f: impl FnOnce(&CudaStorage) -> Result<R>) -> Result<R> {
    let st = t.storage();
    f(st.cuda()?)
}

/// A fresh contiguous device tensor of `dims` over `s`.
fn wrap(s: CudaStorage, dims: &[usize]) -> Result<Tensor> {
    Tensor::from_cuda(s, Layout::contiguous(dims.to_vec()))
}

/// The device of the first device tensor among `ts`.
fn device(ts: &[&Tensor]) -> Device {
    ts.iter()
        .map(|t| t.device())
        .find(|d| !d.is_cpu())
        .unwrap_or(Device::Cpu)
}

/// `t` on `device` (host 0-dim tensors, which PyTorch lets meet device tensors as
/// scalars, are copied there).
fn on(t: &Tensor, device: Device) -> Result<Tensor> {
    t.to_device(device)
}

fn floating(op: &'static str, dtype: DType, device: Device) -> Result<()> {
    if dtype.is_floating_point() {
        Ok(())
    } else {
        Err(Error::no_device_kernel(op, device))
    }
}

/// The compute dtype of a composite over `dtype`: float32 for 16-bit, else itself.
pub(crate) fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// `x` contiguous with the dims `order` first-to-last (a permuted copy on the device).
fn permuted(x: &Tensor, order: &[usize]) -> Result<Tensor> {
    x.permute(order)?.try_contiguous()
}

// ----- elementwise -----------------------------------------------------------------

/// `op(x)` for a unary op with a device kernel.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    let dev = x.device();
    let Some(kernel) = op.cuda_kernel() else {
        return Err(Error::no_device_kernel(op.name(), dev));
    };
    floating(op.name(), x.dtype(), dev)?;
    let out = with_buf(x, |b| host::unary(kernel, b, x.layout()))?;
    wrap(out, x.dims())
}

/// A device op of [`super::sources::BINARY`] on two tensors already of one float dtype,
/// broadcast to each other.
fn raw_binary(name: &'static str, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let dims = amp_tensor::broadcast_shapes(name, a.dims(), b.dims())?;
    let la = a.layout().broadcast_as(&dims)?;
    let lb = b.layout().broadcast_as(&dims)?;
    let sa = a.storage();
    let out = if a.same_storage(b) {
        host::binary(name, sa.cuda()?, &la, sa.cuda()?, &lb)?
    } else {
        let sb = b.storage();
        host::binary(name, sa.cuda()?, &la, sb.cuda()?, &lb)?
    };
    wrap(out, &dims)
}

/// The device name of a binary op, when it has a kernel.
fn binary_name(op: BinaryOp, device: Device) -> Result<&'static str> {
    let name = op.name();
    BINARY_OPS
        .iter()
        .find(|n| **n == name)
        .copied()
        .ok_or_else(|| Error::no_device_kernel(name, device))
}

/// `a op b` (`a + alpha * b` for add/sub with `alpha`), with PyTorch's promotion and
/// broadcasting.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, alpha: Option<f64>) -> Result<Tensor> {
    let dev = device(&[a, b]);
    let name = binary_name(op, dev)?;
    let promoted = result_type(&[meta(a), meta(b)]).unwrap_or(a.dtype());
    let od = op.out_dtype(promoted);
    floating(name, od, dev)?;
    let cd = if alpha.is_some() {
        compute_dtype(od)
    } else {
        od
    };
    let (a, b) = (on(a, dev)?.to_dtype(cd)?, on(b, dev)?.to_dtype(cd)?);
    let b = match alpha {
        Some(s) if s != 1.0 => scalar_op("mul", &b, s, false)?,
        _ => b,
    };
    raw_binary(name, &a, &b)?.to_dtype(od)
}

fn meta(t: &Tensor) -> Operand {
    Operand::Tensor {
        dtype: t.dtype(),
        ndim: t.rank(),
    }
}

/// A 0-dim device tensor holding `s` as `dtype`.
fn scalar(s: impl Into<Scalar>, dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::scalar_of(s, dtype).to_device(device)
}

/// `a op s` (`s op a` when `rev`) for a Python-style scalar: the result dtype of
/// `result_type([a, s])`; `mul`, `div` and `pow` use the scalar unrounded in the compute
/// type, the others round it to the result dtype first (the host kernels' rule).
pub fn binary_scalar(op: BinaryOp, a: &Tensor, s: Scalar, rev: bool) -> Result<Tensor> {
    let dev = a.device();
    let name = binary_name(op, dev)?;
    let promoted = result_type(&[meta(a), Operand::Scalar(s)]).unwrap_or(a.dtype());
    let od = op.out_dtype(promoted);
    floating(name, od, dev)?;
    // The kernel takes the scalar by value and converts it to the compute type;
    // the ops that round it to the result dtype first get it rounded here.
    let s = if matches!(op, BinaryOp::Mul | BinaryOp::Div | BinaryOp::Pow) {
        s.to_f64()
    } else {
        // A host value: no device read (`operand` is not a counted host read).
        Tensor::scalar_of(s, od).operand::<f64>()?
    };
    scalar_op(name, &a.to_dtype(od)?, s, rev)
}

/// `a op s` (`s op a` when `rev`) for a float device tensor and a scalar passed to the
/// kernel by value (computed in float32 for 16-bit, float64 for float64).
fn scalar_op(name: &'static str, a: &Tensor, s: f64, rev: bool) -> Result<Tensor> {
    let out = with_buf(a, |b| host::binary_scalar(name, b, a.layout(), s, rev))?;
    wrap(out, a.dims())
}

/// PyTorch's `threshold_backward`: `grad` where `x > threshold`, else 0.
pub fn threshold_backward(grad: &Tensor, x: &Tensor, threshold: f64) -> Result<Tensor> {
    let dev = device(&[grad, x]);
    floating("threshold_backward", x.dtype(), dev)?;
    if threshold == 0.0 {
        return raw_binary("threshold_bwd", grad, &x.to_dtype(grad.dtype())?);
    }
    // In float64, x - t > 0 exactly when x > t (a float difference keeps its sign), and
    // the gradient passes through unchanged.
    let x = binary_scalar(
        BinaryOp::Sub,
        &x.to_dtype(DType::F64)?,
        Scalar::Float(threshold),
        false,
    )?;
    raw_binary("threshold_bwd", &grad.to_dtype(DType::F64)?, &x)?.to_dtype(grad.dtype())
}

/// The exact GELU's backward, `grad * (Φ(x) + x φ(x))`.
pub fn gelu_backward(grad: &Tensor, x: &Tensor) -> Result<Tensor> {
    let dev = device(&[grad, x]);
    floating("gelu_backward", x.dtype(), dev)?;
    raw_binary("gelu_bwd", grad, &x.to_dtype(grad.dtype())?)
}

// ----- reductions ------------------------------------------------------------------

/// Reduce `x` over the dims `mask` marks with `op` (`sum`, `mean`, `max`, `min`; the
/// column kernels when the reduced dims lead a contiguous `x`, else the row kernels),
/// keeping them as size 1 when `keepdim`.
pub fn reduce(op: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
    floating(op, x.dtype(), x.device())?;
    let kept: Vec<usize> = (0..x.rank()).filter(|&d| !mask[d]).collect();
    let red: Vec<usize> = (0..x.rank()).filter(|&d| mask[d]).collect();
    let rows: usize = kept.iter().map(|&d| x.dims()[d]).product();
    let n: usize = red.iter().map(|&d| x.dims()[d]).product();
    // Reduced dims leading a contiguous input (a bias gradient's sum over the batch):
    // column reductions in place; otherwise the reduced dims moved last, row reductions.
    let leading =
        !red.is_empty() && !kept.is_empty() && red.iter().enumerate().all(|(i, &d)| i == d);
    let out = if leading && x.is_contiguous() {
        let xc = dense(x)?;
        with_buf(&xc, |b| host::reduce_cols(op, b, n, rows))?
    } else {
        let order: Vec<usize> = kept.iter().chain(&red).copied().collect();
        let xc = permuted(x, &order)?;
        with_buf(&xc, |b| host::reduce_rows(op, b, rows, n))?
    };
    let dims: Vec<usize> = (0..x.rank())
        .filter_map(|d| match (mask[d], keepdim) {
            (false, _) => Some(x.dims()[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    wrap(out, &dims)
}

/// Softmax or log-softmax over `dim` (wrapped), in `dtype` when given.
pub fn softmax(x: &Tensor, dim: usize, dtype: Option<DType>, log: bool) -> Result<Tensor> {
    let name = if log { "log_softmax" } else { "softmax" };
    let x = match dtype {
        Some(d) => x.to_dtype(d)?,
        None => x.clone(),
    };
    floating(name, x.dtype(), x.device())?;
    let last = x.rank().saturating_sub(1);
    let rank = x.rank().max(1);
    let n = if x.rank() == 0 { 1 } else { x.dims()[dim] };
    let rows = x.elem_count() / n.max(1);
    let xt = if x.rank() == 0 {
        x.clone()
    } else {
        x.transpose(dim, last)?.try_contiguous()?
    };
    let out = with_buf(&xt, |b| host::softmax_rows(b, rows, n, log, (1.0, 0)))?;
    let out = wrap(out, xt.dims())?;
    if rank == 1 || dim == last {
        return Ok(out);
    }
    out.transpose(dim, last)?.try_contiguous()
}

/// The backward of softmax (`log` false: `y (g - Σ g y)`) or log-softmax (`g - e^y Σ g`)
/// over `dim`, from the forward's output `y`, in one launch
/// ([`host::softmax_backward_rows`]; float32 arithmetic for 16-bit, one rounding).
pub fn softmax_backward(g: &Tensor, y: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    let name = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    floating(name, g.dtype(), g.device())?;
    let y = y.to_dtype(g.dtype())?;
    let last = g.rank().saturating_sub(1);
    let n = if g.rank() == 0 { 1 } else { g.dims()[dim] };
    let rows = g.elem_count() / n.max(1);
    let moved = g.rank() > 1 && dim != last;
    let rows_of = |t: &Tensor| -> Result<Tensor> {
        if moved {
            dense(&t.transpose(dim, last)?)
        } else {
            dense(t)
        }
    };
    let (gt, yt) = (rows_of(g)?, rows_of(&y)?);
    let out = {
        let (sg, sy) = (gt.storage(), yt.storage());
        host::softmax_backward_rows(sg.cuda()?, sy.cuda()?, rows, n, log, 1.0)?
    };
    let out = wrap(out, gt.dims())?;
    if moved {
        out.transpose(dim, last)?.try_contiguous()
    } else {
        Ok(out)
    }
}

/// `softmax(scale · x)` over the last dim, `causal`: each trailing `[L, S]` matrix
/// masked above its diagonal (attention's probabilities), in one launch.
pub fn scaled_softmax(x: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    floating("softmax", x.dtype(), x.device())?;
    let n = x.dims().last().copied().unwrap_or(1);
    let rows = x.elem_count() / n.max(1);
    let period = if causal { x.dims()[x.rank() - 2] } else { 0 };
    let xc = dense(x)?;
    let out = with_buf(&xc, |b| {
        host::softmax_rows(b, rows, n, false, (scale, period))
    })?;
    wrap(out, x.dims())
}

/// The backward of [`scaled_softmax`] from its output `y`: `scale · y (g - Σ g y)`
/// over the last dim, in one launch.
pub fn scaled_softmax_backward(g: &Tensor, y: &Tensor, scale: f64) -> Result<Tensor> {
    floating("softmax_backward", g.dtype(), g.device())?;
    let n = g.dims().last().copied().unwrap_or(1);
    let rows = g.elem_count() / n.max(1);
    let (gc, yc) = (dense(g)?, dense(&y.to_dtype(g.dtype())?)?);
    let out = {
        let (sg, sy) = (gc.storage(), yc.storage());
        host::softmax_backward_rows(sg.cuda()?, sy.cuda()?, rows, n, false, scale)?
    };
    wrap(out, g.dims())
}

// ----- layer norm ------------------------------------------------------------------

/// Layer norm over the last `n` elements of each of `rows` rows: the output and the
/// per-row mean and reciprocal standard deviation (float32, float64 for float64).
pub fn layer_norm(
    x: &Tensor,
    rows: usize,
    n: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    floating("layer_norm", x.dtype(), x.device())?;
    let xc = x.try_contiguous()?;
    let param = |p: Option<&Tensor>| -> Result<Option<Tensor>> {
        p.map(|p| on(p, x.device())?.to_dtype(x.dtype())?.try_contiguous())
            .transpose()
    };
    let (w, b) = (param(weight)?, param(bias)?);
    let (ws, bs) = (
        w.as_ref().map(|t| t.storage()),
        b.as_ref().map(|t| t.storage()),
    );
    let wb = ws.as_ref().map(|s| s.cuda()).transpose()?;
    let bb = bs.as_ref().map(|s| s.cuda()).transpose()?;
    let (out, mean, rstd) = with_buf(&xc, |xb| host::layer_norm_rows(xb, wb, bb, rows, n, eps))?;
    Ok((
        wrap(out, x.dims())?,
        wrap(mean, &[rows])?,
        wrap(rstd, &[rows])?,
    ))
}

/// The backward of [`layer_norm`] from its saved `mean` and `rstd` (`rows` values
/// each), in float32 for 16-bit: the input gradient and, with a weight, the weight and
/// bias gradients (in `param_dtype`).
pub fn layer_norm_backward(
    g: &Tensor,
    x: &Tensor,
    rows: usize,
    n: usize,
    stats: (&Tensor, &Tensor),
    weight: Option<&Tensor>,
    param_dtype: DType,
) -> Result<(Tensor, Option<Tensor>, Option<Tensor>)> {
    floating("layer_norm_backward", x.dtype(), x.device())?;
    let cd = compute_dtype(x.dtype());
    let (gc, xc) = (
        g.to_dtype(x.dtype())?.try_contiguous()?,
        x.try_contiguous()?,
    );
    let stat = |t: &Tensor| on(t, x.device())?.to_dtype(cd)?.try_contiguous();
    let (mu, rs) = (stat(stats.0)?, stat(stats.1)?);
    let w = weight.map(stat).transpose()?;
    let (gs, xs, ms, rss) = (gc.storage(), xc.storage(), mu.storage(), rs.storage());
    let ws = w.as_ref().map(|t| t.storage());
    let wb = ws.as_ref().map(|s| s.cuda()).transpose()?;
    let (gi, params) = host::layer_norm_backward_rows(
        gs.cuda()?,
        xs.cuda()?,
        wb,
        (ms.cuda()?, rss.cuda()?),
        rows,
        n,
    )?;
    let gi = wrap(gi, x.dims())?;
    match params {
        None => Ok((gi, None, None)),
        Some((gw, gb)) => Ok((
            gi,
            Some(wrap(gw, &[n])?.to_dtype(param_dtype)?),
            Some(wrap(gb, &[n])?.to_dtype(param_dtype)?),
        )),
    }
}

// ----- products --------------------------------------------------------------------

/// `[batch, rows, cols]` contiguous device copy of a batch of matrices whose matrix `i`
/// starts at `offsets[i]` with row stride `rs` and column stride `cs` in `t`'s buffer.
pub(crate) fn gather_matrices(
    t: &Tensor,
    offsets: &[usize],
    (rows, cols): (usize, usize),
    (rs, cs): (usize, usize),
) -> Result<Tensor> {
    let out = Tensor::zeros_on([offsets.len(), rows, cols], t.dtype(), t.device())?;
    let step = offsets.get(1).map_or(0, |o1| o1.wrapping_sub(offsets[0]));
    let arithmetic = offsets.len() < 2
        || offsets.windows(2).all(|w| w[1].wrapping_sub(w[0]) == step) && offsets[1] >= offsets[0];
    let st = t.storage();
    let src = st.cuda()?;
    let dst_guard = out.storage();
    let dst = dst_guard.cuda()?;
    if arithmetic {
        let l = Layout::new(
            vec![offsets.len(), rows, cols],
            vec![step, rs, cs],
            offsets.first().copied().unwrap_or(0),
        );
        amp_tensor::cuda::launch::cast_into(
            src,
            &l,
            dst,
            &Layout::contiguous(vec![offsets.len(), rows, cols]),
        )?;
    } else {
        for (i, &o) in offsets.iter().enumerate() {
            let l = Layout::new(vec![rows, cols], vec![rs, cs], o);
            let d = Layout::new(vec![rows, cols], vec![cols, 1], i * rows * cols);
            amp_tensor::cuda::launch::cast_into(src, &l, dst, &d)?;
        }
    }
    drop(dst_guard);
    Ok(out)
}

/// One operand of a device product as cuBLAS will read it: the tensor itself with its
/// matrices' [`host::MatrixView`] when cuBLAS can read them in place (row-major or
/// transposed, batch in arithmetic progression), else a gathered contiguous copy.
pub(crate) fn product_operand(
    t: &Tensor,
    offsets: &[usize],
    (rows, cols): (usize, usize),
    (rs, cs): (usize, usize),
) -> Result<(Tensor, host::MatrixView)> {
    match host::MatrixView::of(offsets, (rows, cols), (rs, cs)) {
        Some(v) => Ok((t.clone(), v)),
        None => Ok((
            gather_matrices(t, offsets, (rows, cols), (rs, cs))?,
            host::MatrixView::contiguous(rows, cols),
        )),
    }
}

/// `alpha * a @ b + beta * input` for `batch` products `[m, k] @ [k, n]` on cuBLAS, as
/// a contiguous `[batch, m, n]` device tensor: the operands read through their views,
/// `input` (already broadcast to `[batch, m, n]` by its layout, in the operands' dtype)
/// copied into the output for cuBLAS to scale and add in the compute type, rounded
/// once. Without `input` (or `beta == 0`) the product alone, scaled by `alpha`.
pub(crate) fn product(
    (a, va): (&Tensor, host::MatrixView),
    (b, vb): (&Tensor, host::MatrixView),
    (batch, m, k, n): (usize, usize, usize, usize),
    input: Option<(&Tensor, &Layout)>,
    alpha: f64,
    beta: f64,
) -> Result<Tensor> {
    floating("mm", a.dtype(), a.device())?;
    let dt = a.dtype();
    if k == 0 {
        // An empty sum (no cuBLAS call): the product is zero, the output `beta * input`
        // (`alpha` scales nothing).
        let zeros = wrap(
            CudaStorage::zeros(a.device(), dt, batch * m * n)?,
            &[batch, m, n],
        )?;
        return blend(&zeros, input, beta, 1.0);
    }
    let input = input.filter(|_| beta != 0.0);
    let c = match input {
        Some((t, layout)) => {
            let st = t.storage();
            amp_tensor::cuda::launch::cast(st.cuda()?, layout, dt)?
        }
        None => CudaStorage::uninit(a.device(), dt, batch * m * n)?,
    };
    let beta = if input.is_some() { beta } else { 0.0 };
    let (sa, sb) = (a.storage(), b.storage());
    host::matmul_views(
        sa.cuda()?,
        va,
        sb.cuda()?,
        vb,
        &c,
        (batch, m, k, n),
        alpha,
        beta,
    )?;
    wrap(c, &[batch, m, n])
}

/// `beta * input + alpha * product` (float32 for 16-bit, one rounding), `input`
/// already broadcast to the product's shape by `layout`.
pub(crate) fn blend(
    product: &Tensor,
    input: Option<(&Tensor, &Layout)>,
    beta: f64,
    alpha: f64,
) -> Result<Tensor> {
    let od = product.dtype();
    let input = input.filter(|_| beta != 0.0);
    if input.is_none() && alpha == 1.0 {
        return Ok(product.clone());
    }
    let cd = compute_dtype(od);
    let mut acc = product.to_dtype(cd)?;
    if alpha != 1.0 {
        acc = scalar_op("mul", &acc, alpha, false)?;
    }
    if let Some((t, layout)) = input {
        let i = view_as(t, layout)?.to_dtype(cd)?;
        let i = if beta != 1.0 {
            scalar_op("mul", &i, beta, false)?
        } else {
            i
        };
        acc = raw_binary("add", &i, &acc)?;
    }
    acc.to_dtype(od)
}

/// A contiguous device copy of the view `layout` of `t`'s buffer.
fn view_as(t: &Tensor, layout: &Layout) -> Result<Tensor> {
    let st = t.storage();
    let out = amp_tensor::cuda::launch::cast(st.cuda()?, layout, t.dtype())?;
    wrap(out, layout.dims())
}

// ----- clamp, cat --------------------------------------------------------------------

/// `clamp(x, min, max)` with number bounds: `maximum` with the lower bound, then
/// `minimum` with the upper (both NaN-propagating, so a NaN element stays NaN, as on the
/// host); a NaN bound when both are given makes every element NaN, as in PyTorch.
pub fn clamp(x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
    let dev = x.device();
    floating("clamp", x.dtype(), dev)?;
    if let (Some(l), Some(h)) = (min, max) {
        if l.is_nan() || h.is_nan() {
            return Tensor::full_on(x.dims().to_vec(), f64::NAN, x.dtype(), dev);
        }
    }
    let mut y = x.clone();
    if let Some(l) = min {
        y = binary_scalar(BinaryOp::Maximum, &y, Scalar::Float(l), false)?;
    }
    if let Some(h) = max {
        y = binary_scalar(BinaryOp::Minimum, &y, Scalar::Float(h), false)?;
    }
    Ok(y)
}

/// `clamp(x, min, max)` with tensor bounds: broadcast `maximum` then `minimum` (a NaN
/// in any operand gives NaN, as on the host).
pub fn clamp_tensor(x: &Tensor, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
    let mut y = x.clone();
    if let Some(l) = min {
        y = binary(BinaryOp::Maximum, &y, l, None)?;
    }
    if let Some(h) = max {
        y = binary(BinaryOp::Minimum, &y, h, None)?;
    }
    Ok(y)
}

/// `cat` of `parts` (checked by the caller) along `dim` into a fresh `dims` tensor of
/// `dtype`: each part is copied (converted) into its slice of the output, which the
/// parts cover (nothing is zeroed first). Parts of the output's dtype are copied
/// together, one launch per [`COPY_PIECES`](amp_tensor::cuda::launch::COPY_PIECES) of
/// them (`copy_many`); the others one by one.
pub fn cat(parts: &[&Tensor], dim: usize, dims: &[usize], dtype: DType) -> Result<Tensor> {
    use amp_tensor::cuda::launch::{copy_many, CopyPiece};
    let n: usize = dims.iter().product();
    let out = wrap(CudaStorage::uninit(device(parts), dtype, n)?, dims)?;
    let mut slices = Vec::with_capacity(parts.len());
    let mut at = 0;
    for t in parts {
        let len = t.dims()[dim];
        slices.push(out.narrow(dim, at, len)?);
        at += len;
    }
    let (same, other): (Vec<_>, Vec<_>) = parts
        .iter()
        .zip(&slices)
        .partition(|(t, _)| t.dtype() == dtype && t.device() == out.device());
    {
        let st = out.storage();
        let out_buf = st.cuda()?;
        // One read guard per distinct buffer (a part may repeat, `cat([x, x])`).
        let mut owners: Vec<&Tensor> = Vec::new();
        let which: Vec<usize> = same
            .iter()
            .map(
                |(t, _)| match owners.iter().position(|o| o.same_storage(t)) {
                    Some(i) => i,
                    None => {
                        owners.push(t);
                        owners.len() - 1
                    }
                },
            )
            .collect();
        let srcs: Vec<_> = owners.iter().map(|t| t.storage()).collect();
        let pieces = same
            .iter()
            .zip(&which)
            .map(|((t, slice), &i)| {
                Ok(CopyPiece {
                    x: srcs[i].cuda()?,
                    src: t.layout(),
                    out: out_buf,
                    dst: slice.layout(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        copy_many(&pieces)?;
    }
    for (t, slice) in other {
        if t.elem_count() > 0 {
            slice.copy_(t)?;
        }
    }
    Ok(out)
}

// ----- convolutions (cuDNN) ----------------------------------------------------------

/// The convolution of `x` with `w` (one float dtype, geometry `spec`, output of dims
/// `dims`), plus `bias` over the channel dim, added afterwards as PyTorch's cuDNN path
/// does.
pub fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    spec: &super::cudnn::ConvSpec,
    dims: &[usize],
) -> Result<Tensor> {
    let (x, w) = (dense(x)?, dense(w)?);
    let y = with_buf(&x, |xb| {
        with_buf(&w, |wb| super::cudnn::conv_forward(xb, wb, spec))
    })?;
    add_channel_bias(wrap(y, dims)?, bias)
}

/// The adjoint of [`conv`] in its input: `dy` taken back through `w` to an input side
/// of dims `dims` (also a transposed convolution, whose `bias` is added afterwards).
pub fn conv_backward_data(
    dy: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    spec: &super::cudnn::ConvSpec,
    dims: &[usize],
) -> Result<Tensor> {
    let (dy, w) = (dense(dy)?, dense(w)?);
    let dx = with_buf(&dy, |gb| {
        with_buf(&w, |wb| super::cudnn::conv_backward_data(gb, wb, spec))
    })?;
    add_channel_bias(wrap(dx, dims)?, bias)
}

/// The adjoint of [`conv`] in its weight, of dims `dims`.
pub fn conv_backward_filter(
    x: &Tensor,
    dy: &Tensor,
    spec: &super::cudnn::ConvSpec,
    dims: &[usize],
) -> Result<Tensor> {
    let (x, dy) = (dense(x)?, dense(dy)?);
    let dw = with_buf(&x, |xb| {
        with_buf(&dy, |gb| super::cudnn::conv_backward_filter(xb, gb, spec))
    })?;
    wrap(dw, dims)
}

/// `t` as the whole of a contiguous buffer (cuDNN takes buffers, not views): itself
/// when it is one, else a copy (a view with an offset, a strided view).
fn dense(t: &Tensor) -> Result<Tensor> {
    let whole = t.is_contiguous()
        && t.layout().offset() == 0
        && with_buf(t, |b| Ok(b.len() == t.elem_count()))?;
    if whole {
        Ok(t.clone())
    } else {
        t.try_copy()
    }
}

/// `y + bias` with `bias` `[C]` over dim 1 of `y` `[N, C, ...]`.
fn add_channel_bias(y: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let Some(b) = bias else { return Ok(y) };
    let mut dims = vec![1; y.rank()];
    dims[1] = b.elem_count();
    binary(BinaryOp::Add, &y, &b.reshape(dims)?, None)
}

// ----- AMP ---------------------------------------------------------------------------

/// `_amp_foreach_non_finite_check_and_unscale_` on device gradients (argument checks
/// done by the caller).
pub fn non_finite_check_and_unscale_(
    grads: &[Tensor],
    found_inf: &Tensor,
    inv_scale: &Tensor,
) -> Result<()> {
    // Non-contiguous gradients are unscaled in a contiguous copy written back after.
    let mut staged: Vec<(Tensor, Option<Tensor>)> = Vec::with_capacity(grads.len());
    for g in grads {
        if g.is_contiguous() {
            staged.push((g.clone(), None));
        } else {
            staged.push((g.try_copy()?, Some(g.clone())));
        }
    }
    {
        let guards: Vec<_> = staged.iter().map(|(t, _)| t.storage()).collect();
        let mut ranges = Vec::with_capacity(staged.len());
        for ((t, _), st) in staged.iter().zip(&guards) {
            let range = t.layout().contiguous_range().expect("contiguous");
            ranges.push(host::GradRange {
                storage: st.cuda()?,
                offset: range.start,
                len: range.len(),
            });
        }
        let fi = found_inf.storage();
        let inv = inv_scale.storage();
        host::non_finite_check_and_unscale_(&ranges, fi.cuda()?, inv.cuda()?)?;
    }
    for (copy, original) in staged {
        if let Some(o) = original {
            o.copy_(&copy)?;
        }
    }
    Ok(())
}

/// `_amp_update_scale_` on device tensors (argument checks done by the caller).
pub fn update_scale_(
    scale: &Tensor,
    growth_tracker: &Tensor,
    found_inf: &Tensor,
    (growth_factor, backoff_factor, growth_interval): (f64, f64, i64),
) -> Result<()> {
    let (s, t, f) = (
        scale.storage(),
        growth_tracker.storage(),
        found_inf.storage(),
    );
    host::update_scale_(
        s.cuda()?,
        t.cuda()?,
        f.cuda()?,
        growth_factor,
        backoff_factor,
        growth_interval,
    )
}

// ----- selection, comparison, indexing ------------------------------------------------

use amp_tensor::cuda::cudarc::driver::PushKernelArg;
use amp_tensor::cuda::launch::{function, grid_for, suffix, StridedArg};

/// The index module's kernel `name` on `t`'s device.
fn index_kernel(
    t: &Tensor,
    name: &str,
) -> Result<(
    std::sync::Arc<amp_tensor::cuda::DeviceContext>,
    amp_tensor::cuda::cudarc::driver::CudaFunction,
)> {
    let dc = amp_tensor::cuda::device_context(t.device())?;
    let m = super::sources::module("index").expect("the module list names the index family");
    let f = function(&dc, m, name)?;
    Ok((dc, f))
}

/// A device tensor of `values` (int64) on `device`.
fn upload(values: Vec<i64>, device: Device) -> Result<Tensor> {
    let n = values.len();
    Tensor::from_vec(values, [n])?.to_device(device)
}

/// The device address of a contiguous device tensor's first element.
pub(super) fn addr(st: &amp_tensor::Storage, t: &Tensor) -> Result<u64> {
    let s = st.cuda()?;
    Ok(s.device_ptr() + (t.layout().offset() * t.dtype().size_in_bytes()) as u64)
}

/// `where(cond, a, b)` with broadcasting; `a` and `b` already of one dtype.
pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "where";
    let dev = device(&[cond, a, b]);
    let (cond, a, b) = (on(cond, dev)?, on(a, dev)?, on(b, dev)?);
    let dims = amp_tensor::broadcast_shapes(
        OP,
        &amp_tensor::broadcast_shapes(OP, cond.dims(), a.dims())?,
        b.dims(),
    )?;
    let n: usize = dims.iter().product();
    let out = Tensor::zeros_on(dims.clone(), a.dtype(), dev)?;
    if n == 0 {
        return Ok(out);
    }
    let (dc, f) = index_kernel(&out, &format!("where_{}", suffix(a.dtype())))?;
    let (sc, sa, sb, so) = (cond.storage(), a.storage(), b.storage(), out.storage());
    let (cp, ap, bp, op) = (
        sc.cuda()?.device_ptr(),
        sa.cuda()?.device_ptr(),
        sb.cuda()?.device_ptr(),
        so.cuda()?.device_ptr(),
    );
    let (cs, as_, bs) = (
        StridedArg::of(OP, &cond.layout().broadcast_as(&dims)?)?,
        StridedArg::of(OP, &a.layout().broadcast_as(&dims)?)?,
        StridedArg::of(OP, &b.layout().broadcast_as(&dims)?)?,
    );
    let n64 = n as i64;
    amp_tensor::cuda_launch!(dc, f, grid_for(n), &cp, &cs, &ap, &as_, &bp, &bs, &op, &n64);
    drop((sc, sa, sb, so));
    Ok(out)
}

/// `a op b` for a comparison (`eq`, `ne`, `lt`, `le`, `gt`, `ge`) with broadcasting, in
/// the promoted dtype `dt`; bool result.
pub fn compare(name: &'static str, a: &Tensor, b: &Tensor, dt: DType) -> Result<Tensor> {
    let dev = device(&[a, b]);
    let (a, b) = (on(a, dev)?.to_dtype(dt)?, on(b, dev)?.to_dtype(dt)?);
    let dims = amp_tensor::broadcast_shapes(name, a.dims(), b.dims())?;
    let n: usize = dims.iter().product();
    let out = Tensor::zeros_on(dims.clone(), DType::Bool, dev)?;
    if n == 0 {
        return Ok(out);
    }
    let (dc, f) = index_kernel(&out, &format!("cmp_{name}_{}", suffix(dt)))?;
    let (sa, sb, so) = (a.storage(), b.storage(), out.storage());
    let (ap, bp, op) = (
        sa.cuda()?.device_ptr(),
        sb.cuda()?.device_ptr(),
        so.cuda()?.device_ptr(),
    );
    let (as_, bs) = (
        StridedArg::of(name, &a.layout().broadcast_as(&dims)?)?,
        StridedArg::of(name, &b.layout().broadcast_as(&dims)?)?,
    );
    let n64 = n as i64;
    amp_tensor::cuda_launch!(dc, f, grid_for(n), &ap, &as_, &bp, &bs, &op, &n64);
    drop((sa, sb, so));
    Ok(out)
}

/// `a op s` for a scalar `s` in the promoted dtype `dt`; bool result.
pub fn compare_scalar(name: &'static str, a: &Tensor, s: Scalar, dt: DType) -> Result<Tensor> {
    compare(name, a, &scalar(s, dt, a.device())?, dt)
}

/// Rows `idx` (validated) of `x` seen as `[outer, n, inner]` along the indexed dim:
/// `index_select` and `embedding`, giving `shape`.
pub fn take_rows(
    x: &Tensor,
    (outer, n, inner): (usize, usize, usize),
    idx: &[i64],
    shape: Vec<usize>,
) -> Result<Tensor> {
    let dev = x.device();
    let total = outer * idx.len() * inner;
    let out = Tensor::zeros_on(shape, x.dtype(), dev)?;
    if total == 0 {
        return Ok(out);
    }
    let xc = x.try_contiguous()?;
    let it = upload(idx.to_vec(), dev)?;
    let (dc, f) = index_kernel(&out, &format!("take_rows_{}", suffix(x.dtype())))?;
    let (sx, si, so) = (xc.storage(), it.storage(), out.storage());
    let (xp, ip, op) = (addr(&sx, &xc)?, addr(&si, &it)?, addr(&so, &out)?);
    let (ni, n64, inn, tot) = (idx.len() as i64, n as i64, inner as i64, total as i64);
    amp_tensor::cuda_launch!(dc, f, grid_for(total), &xp, &ip, &op, &ni, &n64, &inn, &tot);
    drop((sx, si, so));
    Ok(out)
}

/// The elements of `x`'s buffer at `offsets` (computed and validated on the host):
/// `gather`, giving `dims`.
pub fn take(x: &Tensor, offsets: Vec<i64>, dims: &[usize]) -> Result<Tensor> {
    let dev = x.device();
    let n = offsets.len();
    let out = Tensor::zeros_on(dims.to_vec(), x.dtype(), dev)?;
    if n == 0 {
        return Ok(out);
    }
    let it = upload(offsets, dev)?;
    let (dc, f) = index_kernel(&out, &format!("take_{}", suffix(x.dtype())))?;
    let (sx, si, so) = (x.storage(), it.storage(), out.storage());
    let (xp, ip, op) = (sx.cuda()?.device_ptr(), addr(&si, &it)?, addr(&so, &out)?);
    let n64 = n as i64;
    amp_tensor::cuda_launch!(dc, f, grid_for(n), &xp, &ip, &op, &n64);
    drop((sx, si, so));
    Ok(out)
}

/// The accumulation dtype of the atomic kernels: float64 for float64, else float32.
fn atomic_dtype(op: &'static str, dtype: DType, device: Device) -> Result<DType> {
    match dtype {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        _ => Err(Error::no_device_kernel(op, device)),
    }
}

/// `x` (contiguous copy) with the elements of `src` (in `offsets`' order) added at
/// `offsets` into its contiguous layout: `scatter_add`. Accumulates in float32 for
/// 16-bit and rounds once.
pub fn put_add(
    op: &'static str,
    x: &Tensor,
    (src, src_layout): (&Tensor, &Layout),
    offsets: Vec<i64>,
) -> Result<Tensor> {
    let dev = x.device();
    let acc_dt = atomic_dtype(op, x.dtype(), dev)?;
    let acc = x.to_dtype(acc_dt)?.try_copy()?;
    let n = offsets.len();
    if n > 0 {
        let s = view_as(src, src_layout)?.to_dtype(acc_dt)?;
        let it = upload(offsets, dev)?;
        let (dc, f) = index_kernel(&acc, &format!("put_add_{}", suffix(acc_dt)))?;
        let (ss, si, so) = (s.storage(), it.storage(), acc.storage());
        let (sp, ip, op_) = (addr(&ss, &s)?, addr(&si, &it)?, addr(&so, &acc)?);
        let n64 = n as i64;
        amp_tensor::cuda_launch!(dc, f, grid_for(n), &sp, &ip, &op_, &n64);
        drop((ss, si, so));
    }
    acc.to_dtype(x.dtype())
}

/// `x` seen as `[outer, n, inner]` with `alpha * src[o, k, i]` (`src` contiguous as
/// `[outer, idx.len(), inner]`) added at `[o, idx[k], i]`, except where `idx[k]` is
/// `skip`: `index_add` and the embedding backward. Accumulates in float32 for 16-bit
/// (float64 for float64) and rounds once.
pub fn index_add(
    op: &'static str,
    x: &Tensor,
    (outer, n, inner): (usize, usize, usize),
    idx: &[i64],
    src: &Tensor,
    (alpha, skip): (f64, Option<i64>),
) -> Result<Tensor> {
    let dev = x.device();
    let acc_dt = atomic_dtype(op, x.dtype(), dev)?;
    let acc = x.to_dtype(acc_dt)?.try_copy()?;
    let total = outer * idx.len() * inner;
    if total > 0 {
        let mut s = on(src, dev)?.to_dtype(acc_dt)?.try_contiguous()?;
        if alpha != 1.0 {
            s = scalar_op("mul", &s, alpha, false)?;
        }
        let it = upload(idx.to_vec(), dev)?;
        let (dc, f) = index_kernel(&acc, &format!("add_rows_{}", suffix(acc_dt)))?;
        let (ss, si, so) = (s.storage(), it.storage(), acc.storage());
        let (sp, ip, op_) = (addr(&ss, &s)?, addr(&si, &it)?, addr(&so, &acc)?);
        let (ni, n64, inn, tot, sk) = (
            idx.len() as i64,
            n as i64,
            inner as i64,
            total as i64,
            skip.unwrap_or(-1),
        );
        amp_tensor::cuda_launch!(
            dc,
            f,
            grid_for(total),
            &sp,
            &ip,
            &op_,
            &ni,
            &n64,
            &inn,
            &tot,
            &sk
        );
        drop((ss, si, so));
    }
    acc.to_dtype(x.dtype())
}

/// The vector `p`-norm over the dims `mask` marks, accumulated in float32 for 16-bit:
/// `p` = 2 as `sqrt(Σ x²)`, 1 as `Σ |x|`, ±∞ as the largest / smallest `|x|`, any
/// other positive `p` as `(Σ |x|^p)^(1/p)`; `p` = 0 (a count) has no device kernel.
pub fn norm(x: &Tensor, p: f64, mask: &[bool], keepdim: bool) -> Result<Tensor> {
    let dev = x.device();
    floating("norm", x.dtype(), dev)?;
    let cd = compute_dtype(x.dtype());
    let a = unary(UnaryOp::Abs, &x.to_dtype(cd)?)?;
    let out = if p == 2.0 {
        unary(
            UnaryOp::Sqrt,
            &reduce("sum", &raw_binary("mul", &a, &a)?, mask, keepdim)?,
        )?
    } else if p == 1.0 {
        reduce("sum", &a, mask, keepdim)?
    } else if p == f64::INFINITY {
        reduce("max", &a, mask, keepdim)?
    } else if p == f64::NEG_INFINITY {
        reduce("min", &a, mask, keepdim)?
    } else if p > 0.0 {
        let powed = scalar_op("pow", &a, p, false)?;
        scalar_op(
            "pow",
            &reduce("sum", &powed, mask, keepdim)?,
            1.0 / p,
            false,
        )?
    } else {
        return Err(Error::no_device_kernel("norm", dev));
    };
    out.to_dtype(x.dtype())
}
