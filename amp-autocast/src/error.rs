//! Errors of autocast.

use amp_policy::DeviceType;
use amp_tensor::DType;

/// What autocast refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AutocastError {
    /// A region asked for a dtype the device type cannot autocast to.
    #[error("In {} autocast, but the target dtype {dtype} is not supported. {} Autocast only supports dtypes of {supported} currently.", .device.title(), .device.title())]
    UnsupportedDType {
        device: DeviceType,
        dtype: DType,
        supported: &'static str,
    },
    /// The op is banned under autocast on this device (the message is PyTorch's).
    #[error("{0}")]
    Banned(String),
}

impl From<AutocastError> for amp_autograd::Error {
    fn from(e: AutocastError) -> Self {
        amp_autograd::Error::Layer(amp_tensor::SharedError::new(e))
    }
}
