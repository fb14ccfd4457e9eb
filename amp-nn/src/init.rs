//! Parameter initialisation (PyTorch's defaults), from a seeded generator.

use amp_autograd::{Result, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};

/// A parameter with values uniform in `[-bound, bound)`.
pub fn uniform(dims: &[usize], bound: f64, gen: &mut Generator) -> Result<Tensor> {
    Tensor::parameter(Raw::uniform(dims, -bound, bound, DType::F32, gen)?)
}

/// Kaiming-uniform with `a = sqrt(5)` (PyTorch's default for Linear/Conv weights):
/// bound `1 / sqrt(fan_in)`.
pub fn kaiming_uniform_default(
    dims: &[usize],
    fan_in: usize,
    gen: &mut Generator,
) -> Result<Tensor> {
    let gain = (2.0 / (1.0 + 5.0f64)).sqrt();
    let bound = gain * (3.0 / fan_in.max(1) as f64).sqrt();
    uniform(dims, bound, gen)
}

/// Kaiming-normal (He) for ReLU networks: std `sqrt(2 / fan_in)`.
pub fn kaiming_normal(dims: &[usize], fan_in: usize, gen: &mut Generator) -> Result<Tensor> {
    let std = (2.0 / fan_in.max(1) as f64).sqrt();
    let v = Raw::randn(dims, DType::F64, gen)?;
    let scaled = scale(&v, std)?;
    Tensor::parameter(scaled.to_dtype(DType::F32)?)
}

fn scale(v: &Raw, s: f64) -> Result<Raw> {
    let data: Vec<f64> = v.to_vec_f64().into_iter().map(|x| x * s).collect();
    Ok(Raw::from_vec(data, v.dims())?)
}

/// Xavier/Glorot-uniform: bound `sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform(
    dims: &[usize],
    fan_in: usize,
    fan_out: usize,
    gen: &mut Generator,
) -> Result<Tensor> {
    uniform(dims, (6.0 / (fan_in + fan_out).max(1) as f64).sqrt(), gen)
}
