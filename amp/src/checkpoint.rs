//! Checkpoints: model parameters as safetensors, optimizer and scaler state as JSON,
//! saved together in one directory and restored exactly, so a resumed run continues
//! bit for bit.

use std::path::Path;

use amp_nn::Module;
use amp_optim::{Optimizer, OptimizerStateDict};
use amp_scaler::GradScaler;
use amp_tensor::{with_dtype, DType, Element, Tensor as Raw};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// What can go wrong saving or loading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("checkpoint format: {0}")]
    Format(String),
    #[error(transparent)]
    Autograd(#[from] amp_autograd::Error),
    #[error(transparent)]
    Optim(#[from] amp_optim::Error),
    #[error(transparent)]
    Scaler(#[from] amp_scaler::ScalerError),
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_st_dtype(d: Dtype) -> Result<DType, CheckpointError> {
    Ok(match d {
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::BOOL => DType::Bool,
        other => {
            return Err(CheckpointError::Format(format!(
                "unsupported safetensors dtype {other:?}"
            )))
        }
    })
}

/// Encode a model's parameters as a safetensors buffer.
pub fn model_to_safetensors(model: &dyn Module) -> Result<Vec<u8>, CheckpointError> {
    let sd = model.state_dict();
    let bytes: Vec<(String, DType, Vec<usize>, Vec<u8>)> = sd
        .iter()
        .map(|(n, t)| (n.clone(), t.dtype(), t.dims().to_vec(), raw_bytes(t)))
        .collect();
    let views = bytes
        .iter()
        .map(|(n, d, s, b)| {
            Ok((
                n.clone(),
                TensorView::new(st_dtype(*d), s.clone(), b)
                    .map_err(|e| CheckpointError::Format(e.to_string()))?,
            ))
        })
        .collect::<Result<Vec<_>, CheckpointError>>()?;
    safetensors::serialize(views, &None).map_err(|e| CheckpointError::Format(e.to_string()))
}

/// Restore a model's parameters from a safetensors buffer (names and shapes must match).
pub fn model_from_safetensors(model: &dyn Module, bytes: &[u8]) -> Result<(), CheckpointError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| CheckpointError::Format(e.to_string()))?;
    let mut sd = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = from_st_dtype(view.dtype())?;
        sd.push((name, from_bytes(dtype, view.shape(), view.data())?));
    }
    model.load_state_dict(&sd)?;
    Ok(())
}

fn raw_bytes(t: &Raw) -> Vec<u8> {
    let t = t.contiguous();
    let n = t.elem_count();
    with_dtype!(t.dtype(), T => {
        let v = t.to_vec::<T>().expect("own dtype");
        let size = std::mem::size_of::<T>();
        let mut out = vec![0u8; n * size];
        // SAFETY: T is plain old data (floats, ints, bool) and `out` is n * size bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, out.as_mut_ptr(), n * size) };
        if cfg!(target_endian = "big") {
            out.chunks_mut(size).for_each(|c| c.reverse());
        }
        out
    })
}

fn from_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Raw, CheckpointError> {
    let n: usize = shape.iter().product();
    with_dtype!(dtype, T => {
        let size = std::mem::size_of::<T>();
        if data.len() != n * size {
            return Err(CheckpointError::Format(format!("tensor data has {} bytes, expected {}", data.len(), n * size)));
        }
        if T::DTYPE == DType::Bool && data.iter().any(|&b| b > 1) {
            return Err(CheckpointError::Format("bool tensor holds a byte other than 0 or 1".into()));
        }
        let mut v: Vec<T> = vec![T::default(); n];
        let mut bytes = data.to_vec();
        if cfg!(target_endian = "big") {
            bytes.chunks_mut(size).for_each(|c| c.reverse());
        }
        // SAFETY: `v` holds n * size bytes; every bit pattern is valid for the float and
        // int types, and bool bytes were checked to be 0 or 1 above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, n * size) };
        Ok(Raw::from_vec(v, shape)?)
    })
}

/// Save model, optimizer and scaler into `dir` (`model.safetensors`,
/// `optimizer.json`, `scaler.json`).
pub fn save(
    dir: &Path,
    model: &dyn Module,
    opt: &dyn Optimizer,
    scaler: &GradScaler,
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("model.safetensors"), model_to_safetensors(model)?)?;
    let o = serde_json::to_string(&opt.state_dict())
        .map_err(|e| CheckpointError::Format(e.to_string()))?;
    std::fs::write(dir.join("optimizer.json"), o)?;
    std::fs::write(
        dir.join("scaler.json"),
        scaler.state_dict_json().to_string(),
    )?;
    Ok(())
}

/// Restore what [`save`] wrote into existing model, optimizer and scaler objects.
pub fn load(
    dir: &Path,
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    scaler: &mut GradScaler,
) -> Result<(), CheckpointError> {
    model_from_safetensors(model, &std::fs::read(dir.join("model.safetensors"))?)?;
    let o: OptimizerStateDict = serde_json::from_slice(&std::fs::read(dir.join("optimizer.json"))?)
        .map_err(|e| CheckpointError::Format(e.to_string()))?;
    opt.load_state_dict(&o)?;
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("scaler.json"))?)
        .map_err(|e| CheckpointError::Format(e.to_string()))?;
    if scaler.is_enabled() {
        scaler.load_state_dict_json(&s)?;
    }
    Ok(())
}
