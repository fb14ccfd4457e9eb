//! The device types autocast distinguishes.

use serde::{Deserialize, Serialize};

use crate::PolicyError;

/// A device type with its own autocast op lists: `cpu` or `cuda`.
///
/// ```
/// use amp_policy::DeviceType;
/// let d: DeviceType = "cuda".parse().unwrap();
/// assert_eq!(d, DeviceType::Cuda);
/// assert_eq!(d.to_string(), "cuda");
/// assert!("tpu".parse::<DeviceType>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// CPU autocast (default lower-precision dtype bfloat16).
    Cpu,
    /// CUDA autocast (default lower-precision dtype float16).
    Cuda,
}

impl DeviceType {
    /// Every device type, in table order.
    pub const ALL: [DeviceType; 2] = [DeviceType::Cpu, DeviceType::Cuda];

    /// The lower-case name: `cpu` or `cuda`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
        }
    }

    /// The name as the documentation writes it in list titles: `CPU` or `CUDA`.
    pub const fn title(self) -> &'static str {
        match self {
            DeviceType::Cpu => "CPU",
            DeviceType::Cuda => "CUDA",
        }
    }

    /// A dense index (0 for cpu, 1 for cuda), for per-device arrays.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }
}

named_by_as_str!(DeviceType, PolicyError::UnknownDevice);
