//! Where a tensor lives.

use std::fmt;
use std::str::FromStr;

pub use amp_policy::DeviceType;

use crate::Error;

/// A concrete device: the host, or one CUDA GPU by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl Device {
    /// The device type autocast keys its state by.
    pub const fn device_type(self) -> DeviceType {
        match self {
            Device::Cpu => DeviceType::Cpu,
            Device::Cuda(_) => DeviceType::Cuda,
        }
    }
    /// PyTorch's backend name of the device (`CPU`, `CUDA`), as its dispatch errors say.
    pub const fn backend_name(self) -> &'static str {
        match self {
            Device::Cpu => "CPU",
            Device::Cuda(_) => "CUDA",
        }
    }

    /// `true` for [`Device::Cpu`].
    pub const fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;
    /// `cpu`, `cuda` (ordinal 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    Error::invalid(
                        "device",
                        format!("unknown device '{s}' (expected cpu, cuda or cuda:N)"),
                    )
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
        assert_eq!("cuda".parse::<Device>().unwrap().to_string(), "cuda:0");
        assert_eq!(Device::Cpu.device_type(), DeviceType::Cpu);
        assert!("tpu".parse::<Device>().is_err());
    }
}
