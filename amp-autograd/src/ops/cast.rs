//! Differentiable dtype conversion: backward casts the gradient back.

use amp_tensor::DType;

use super::names::TO;
use crate::graph::record;
use crate::{Result, Tensor};

/// `x.to(dtype)`: a copy in `dtype` (or `x` itself if it has it). Differentiable: the
/// gradient is cast back to `x`'s dtype, so a float32 leaf gets a float32 grad.
pub fn to_dtype(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    let ([x], _body) = super::enter(&TO, [x])?;
    let out = x.data().to_dtype(dtype)?;
    let from = x.dtype();
    Ok(record(out, "ToCopyBackward0", &[&x], move |g| {
        Ok(vec![Some(to_dtype(g, from)?)])
    }))
}

/// Differentiable copy to `device` (PyTorch's `x.to(device)`; the gradient goes back
/// to `x`'s device). `x` itself when it is already there.
pub fn to_device(x: &Tensor, device: amp_tensor::Device) -> Result<Tensor> {
    if x.device() == device {
        return Ok(x.clone());
    }
    let ([x], _body) = super::enter(&TO, [x])?;
    let out = x.data().to_device(device)?;
    let from = x.device();
    Ok(record(out, "ToCopyBackward0", &[&x], move |g| {
        Ok(vec![Some(to_device(g, from)?)])
    }))
}

impl Tensor {
    /// Differentiable copy to `device` (see [`to_device`]).
    pub fn to_device(&self, device: amp_tensor::Device) -> Result<Tensor> {
        to_device(self, device)
    }
    /// Differentiable cast (see [`to_dtype`]).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        to_dtype(self, dtype)
    }
    /// Cast to float32.
    pub fn float(&self) -> Result<Tensor> {
        to_dtype(self, DType::F32)
    }
    /// Cast to float16.
    pub fn half(&self) -> Result<Tensor> {
        to_dtype(self, DType::F16)
    }
    /// Cast to bfloat16.
    pub fn bfloat16(&self) -> Result<Tensor> {
        to_dtype(self, DType::BF16)
    }
    /// Cast to float64.
    pub fn double(&self) -> Result<Tensor> {
        to_dtype(self, DType::F64)
    }
}
