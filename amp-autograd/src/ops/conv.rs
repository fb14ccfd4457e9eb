//! Convolutions: `conv1d`, `conv2d`, `conv3d`, `conv_transpose1d/2d/3d` and the
//! common `_convolution` entry ([`convolution`]).
//!
//! Each public function enters the dispatch point once, under its documented name, and
//! then runs one of three differentiable primitives (never re-entering dispatch, so a
//! `conv_transpose2d` that autocast keeps in float32 is not cast again by the
//! lower-precision `_convolution` policy):
//!
//! - `conv_prim(x, w, b)`: the convolution;
//! - `input_grad_prim(g, w, b)`: its adjoint in the input (the transposed convolution);
//! - `weight_grad_prim(x, g)`: its adjoint in the weight.
//!
//! The backward of each is written in the three primitives (and `sum` for the bias), so
//! `create_graph` gives gradients of any order: for `y = conv(x, w) + b`,
//! `dx = input_grad(g, w)`, `dw = weight_grad(x, g)`, `db = Σ g`; `input_grad(g, w)` is
//! linear in `g` and `w` with `d/dg = conv(G, w)` and `d/dw = weight_grad(G, g)`;
//! `weight_grad(x, g)` has `d/dx = input_grad(g, G)` and `d/dg = conv(x, G)`. When no
//! graph is being built the backward calls the kernels directly.

use amp_kernels::ConvParams;

use super::enter_vec;
use super::names::{
    CONV1D, CONV2D, CONV3D, CONVOLUTION, CONV_TRANSPOSE1D, CONV_TRANSPOSE2D, CONV_TRANSPOSE3D,
};
use super::reduce::sum;
use super::shape::contiguous;
use crate::dispatch::{BodyGuard, OpName};
use crate::grad_mode::is_grad_enabled;
use crate::graph::{grad_if, record, Kept};
use crate::{Error, Result, Tensor};

fn check_rank(op: &'static str, x: &Tensor, w: &Tensor, spatial: usize) -> Result<()> {
    if w.rank() != spatial + 2 {
        return Err(Error::invalid(
            op,
            format!(
                "expected a {}-D weight, but got weight of size {:?}",
                spatial + 2,
                w.dims()
            ),
        ));
    }
    if x.rank() != spatial + 2 {
        return Err(Error::invalid(
            op,
            format!(
                "Expected {}D (batched) input to {op}, but got input of size: {:?}",
                spatial + 2,
                x.dims()
            ),
        ));
    }
    Ok(())
}

/// Dispatches `[input, weight, bias?]` under `op`; returns the (possibly cast) tensors
/// and the guard the op's body runs under.
fn enter_conv(
    op: &'static OpName,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Option<Tensor>, BodyGuard)> {
    let mut args = vec![input, weight];
    args.extend(bias);
    let (a, body) = enter_vec(op, &args)?;
    let mut a = a.into_iter();
    let x = a.next().expect("input");
    let w = a.next().expect("weight");
    Ok((x, w, a.next(), body))
}

#[allow(clippy::too_many_arguments)]
fn conv_nd(
    op: &'static OpName,
    spatial: usize,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<Tensor> {
    let (x, w, b, _body) = enter_conv(op, input, weight, bias)?;
    check_rank(op.name(), &x, &w, spatial)?;
    let p = ConvParams::new(stride, padding, dilation, groups);
    conv_prim(&x, &w, b.as_ref(), &p)
}

fn conv_transpose_nd(
    op: &'static OpName,
    spatial: usize,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    p: &ConvParams,
) -> Result<Tensor> {
    let (x, w, b, _body) = enter_conv(op, input, weight, bias)?;
    check_rank(op.name(), &x, &w, spatial)?;
    conv_transpose_prim(&x, &w, b.as_ref(), p)
}

/// `pub fn $name(input, weight, bias, stride, padding, dilation, groups)`: a
/// convolution entering dispatch as `$op`.
macro_rules! conv_fn {
    ($(#[$doc:meta])* $name:ident, $op:ident, $rank:literal) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name(
            input: &Tensor,
            weight: &Tensor,
            bias: Option<&Tensor>,
            stride: &[usize],
            padding: &[usize],
            dilation: &[usize],
            groups: usize,
        ) -> Result<Tensor> {
            conv_nd(&$op, $rank, input, weight, bias, stride, padding, dilation, groups)
        }
    };
}

/// `pub fn $name(input, weight, bias, stride, padding, output_padding, groups,
/// dilation)` (PyTorch's argument order): a transposed convolution entering dispatch as
/// `$op`.
macro_rules! conv_transpose_fn {
    ($(#[$doc:meta])* $name:ident, $op:ident, $rank:literal) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name(
            input: &Tensor,
            weight: &Tensor,
            bias: Option<&Tensor>,
            stride: &[usize],
            padding: &[usize],
            output_padding: &[usize],
            groups: usize,
            dilation: &[usize],
        ) -> Result<Tensor> {
            let p = ConvParams::new(stride, padding, dilation, groups)
                .with_output_padding(output_padding);
            conv_transpose_nd(&$op, $rank, input, weight, bias, &p)
        }
    };
}

conv_fn!(
    /// 1-D convolution (`torch.nn.functional.conv1d`): `input` `[N, C_in, L]`, `weight`
    /// `[C_out, C_in / groups, k]`, optional `bias` `[C_out]`; `stride`, `padding` and
    /// `dilation` take one value per spatial dim or a single value for all.
    conv1d, CONV1D, 1
);
conv_fn!(
    /// 2-D convolution (`torch.nn.functional.conv2d`): `input` `[N, C_in, H, W]`,
    /// `weight` `[C_out, C_in / groups, kH, kW]`, optional `bias` `[C_out]`.
    conv2d, CONV2D, 2
);
conv_fn!(
    /// 3-D convolution (`torch.nn.functional.conv3d`): `input` `[N, C_in, D, H, W]`,
    /// `weight` `[C_out, C_in / groups, kD, kH, kW]`, optional `bias` `[C_out]`.
    conv3d, CONV3D, 3
);
conv_transpose_fn!(
    /// 1-D transposed convolution (`torch.nn.functional.conv_transpose1d`, same argument
    /// order): `input` `[N, C_in, L]`, `weight` `[C_in, C_out / groups, k]`.
    conv_transpose1d, CONV_TRANSPOSE1D, 1
);
conv_transpose_fn!(
    /// 2-D transposed convolution (`torch.nn.functional.conv_transpose2d`): `input`
    /// `[N, C_in, H, W]`, `weight` `[C_in, C_out / groups, kH, kW]`.
    conv_transpose2d, CONV_TRANSPOSE2D, 2
);
conv_transpose_fn!(
    /// 3-D transposed convolution (`torch.nn.functional.conv_transpose3d`): `input`
    /// `[N, C_in, D, H, W]`, `weight` `[C_in, C_out / groups, kD, kH, kW]`.
    conv_transpose3d, CONV_TRANSPOSE3D, 3
);

/// ATen's `_convolution` (under that name at the dispatch point): a convolution of any
/// spatial rank (1 to 3, from the weight), transposed or not.
#[allow(clippy::too_many_arguments)]
pub fn convolution(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    transposed: bool,
    output_padding: &[usize],
    groups: usize,
) -> Result<Tensor> {
    let (x, w, b, _body) = enter_conv(&CONVOLUTION, input, weight, bias)?;
    let p = ConvParams::new(stride, padding, dilation, groups).with_output_padding(output_padding);
    if transposed {
        conv_transpose_prim(&x, &w, b.as_ref(), &p)
    } else {
        conv_prim(&x, &w, b.as_ref(), &p)
    }
}

// ----- the differentiable primitives ----------------------------------------------------

/// The dims a convolution's bias gradient sums over (all but the channel dim).
fn bias_dims(rank: usize) -> Vec<i64> {
    (0..rank as i64).filter(|&d| d != 1).collect()
}

fn bias_grad(g: &Tensor) -> Result<Tensor> {
    if is_grad_enabled() {
        sum(g, &bias_dims(g.rank()), false, None)
    } else {
        Ok(Tensor::from_raw(amp_kernels::conv_bias_grad(g.data())?))
    }
}

fn inputs_of<'a>(a: &'a Tensor, b: &'a Tensor, c: Option<&'a Tensor>) -> Vec<&'a Tensor> {
    let mut v = vec![a, b];
    v.extend(c);
    v
}

/// `conv(x, w) + b`.
fn conv_prim(x: &Tensor, w: &Tensor, b: Option<&Tensor>, p: &ConvParams) -> Result<Tensor> {
    let out = amp_kernels::conv(x.data(), w.data(), b.map(|t| t.data()), p)?;
    // Each of x and w is read only by the other's gradient.
    let (rx, rw) = (x.requires_grad(), w.requires_grad());
    let (kx, kw) = (Kept::new(x, rw), Kept::new(w, rx));
    let (x_dims, w_dims, has_b, p) = (x.dims().to_vec(), w.dims().to_vec(), b.is_some(), p.clone());
    Ok(record(
        out,
        "ConvolutionBackward0",
        &inputs_of(x, w, b),
        move |g| {
            // One contiguous copy shared by the three gradients (as PyTorch's
            // `convolution_backward` does), not one per kernel.
            let g = &contiguous(g)?;
            let gx = grad_if(rx, || input_grad_prim(g, kw.get(), None, &x_dims, &p))?;
            let gw = grad_if(rw, || weight_grad_prim(kx.get(), g, &w_dims, &p))?;
            let mut v = vec![gx, gw];
            if has_b {
                v.push(Some(bias_grad(g)?));
            }
            Ok(v)
        },
    ))
}

/// The transposed convolution `conv_transpose(x, w) + b` (output size from `p`).
fn conv_transpose_prim(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    p: &ConvParams,
) -> Result<Tensor> {
    let dims = amp_kernels::conv_output_dims(x.dims(), w.dims(), p, true)?;
    input_grad_prim(x, w, b, &dims, p)
}

/// The adjoint of `conv(·, w)` applied to `g`, to an input of dims `x_dims`, plus `b`.
fn input_grad_prim(
    g: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    x_dims: &[usize],
    p: &ConvParams,
) -> Result<Tensor> {
    let out = match b {
        Some(b) => amp_kernels::conv_transpose(g.data(), w.data(), Some(b.data()), p)
            .and_then(|t| check_dims(t, x_dims))?,
        None => amp_kernels::conv_input_grad(g.data(), w.data(), x_dims, p)?,
    };
    let (rg, rw) = (g.requires_grad(), w.requires_grad());
    let (kg, kw) = (Kept::new(g, rw), Kept::new(w, rg));
    let (w_dims, has_b, p) = (w.dims().to_vec(), b.is_some(), p.clone());
    Ok(record(
        out,
        "ConvolutionBackward0",
        &inputs_of(g, w, b),
        move |up| {
            let up = &contiguous(up)?;
            let dg = grad_if(rg, || conv_prim(up, kw.get(), None, &p))?;
            let dw = grad_if(rw, || weight_grad_prim(up, kg.get(), &w_dims, &p))?;
            let mut v = vec![dg, dw];
            if has_b {
                v.push(Some(bias_grad(up)?));
            }
            Ok(v)
        },
    ))
}

fn check_dims(t: amp_tensor::Tensor, dims: &[usize]) -> amp_tensor::Result<amp_tensor::Tensor> {
    if t.dims() == dims {
        Ok(t)
    } else {
        Err(amp_tensor::Error::shape_mismatch(
            "convolution",
            t.dims(),
            dims,
        ))
    }
}

/// The adjoint of `conv(x, ·)` applied to `g`: a weight gradient of dims `w_dims`.
fn weight_grad_prim(x: &Tensor, g: &Tensor, w_dims: &[usize], p: &ConvParams) -> Result<Tensor> {
    let out = amp_kernels::conv_weight_grad(x.data(), g.data(), w_dims, p)?;
    let (rx, rg) = (x.requires_grad(), g.requires_grad());
    let (kx, kg) = (Kept::new(x, rg), Kept::new(g, rx));
    let (x_dims, p) = (x.dims().to_vec(), p.clone());
    Ok(record(
        out,
        "ConvolutionBackwardBackward0",
        &[x, g],
        move |up| {
            let dx = grad_if(rx, || input_grad_prim(kg.get(), up, None, &x_dims, &p))?;
            let dg = grad_if(rg, || conv_prim(kx.get(), up, None, &p))?;
            Ok(vec![dx, dg])
        },
    ))
}
