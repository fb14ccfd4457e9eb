//! Opening the CUDA shared libraries ourselves before `cudarc` does.

use crate::{Device, Error, Result};

/// The reason given when the crate was built without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) const NOT_BUILT: &str =
    "this build of amp-tensor has no CUDA backend (enable the `cuda` feature)";

/// A shared library the CUDA backend loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// The driver API, `libcuda`.
    Driver,
    /// The run-time compiler, `libnvrtc`.
    Nvrtc,
    /// cuBLAS, `libcublas`.
    Cublas,
    /// cuBLASLt, `libcublasLt`.
    CublasLt,
    /// cuDNN, `libcudnn` (convolutions).
    Cudnn,
    /// NCCL, `libnccl` (the collectives of `amp-distributed`'s NCCL backend).
    Nccl,
}

impl Library {
    /// The library's base name as `cudarc` searches for it (`cuda`, `nvrtc`, ...).
    pub const fn base_name(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Nvrtc => "nvrtc",
            Library::Cublas => "cublas",
            Library::CublasLt => "cublasLt",
            Library::Cudnn => "cudnn",
            Library::Nccl => "nccl",
        }
    }

    /// Whether the library can be opened (the answer is cached for the process).
    pub fn is_present(self) -> bool {
        self.ensure(Device::Cuda(0)).is_ok()
    }

    /// `Ok` when the library can be opened, else [`Error::DeviceUnavailable`] for
    /// `device` with a reason naming the library and the file names tried.
    ///
    /// A library found once stays loaded for the life of the process, so the later
    /// load by `cudarc` (same names, same search order) finds it.
    pub fn ensure(self, device: Device) -> Result<()> {
        imp::probe(self).map_err(|reason| Error::DeviceUnavailable { device, reason })
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::*;

    pub(super) fn probe(_lib: Library) -> std::result::Result<(), String> {
        Err(NOT_BUILT.into())
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use std::sync::OnceLock;

    fn slot(lib: Library) -> &'static OnceLock<std::result::Result<(), String>> {
        type Slot = OnceLock<std::result::Result<(), String>>;
        static SLOTS: [Slot; 6] = [const { OnceLock::new() }; 6];
        &SLOTS[lib as usize]
    }

    pub(super) fn probe(lib: Library) -> std::result::Result<(), String> {
        slot(lib)
            .get_or_init(|| {
                let mut names = cudarc::get_lib_name_candidates(lib.base_name());
                if lib == Library::Driver {
                    names.extend(cudarc::get_lib_name_candidates("nvcuda"));
                }
                let mut seen = std::collections::HashSet::new();
                names.retain(|n| seen.insert(n.clone()));
                for name in &names {
                    // SAFETY: opening a CUDA library runs its initialisers, which is
                    // exactly what `cudarc` would do with the same name.
                    if let Ok(l) = unsafe { libloading::Library::new(name) } {
                        // Keep it loaded: cudarc opens the same name later.
                        std::mem::forget(l);
                        return Ok(());
                    }
                }
                Err(format!(
                    "the shared library lib{} could not be opened (tried {}); install the CUDA driver/toolkit or add its directory to LD_LIBRARY_PATH",
                    lib.base_name(),
                    names.join(", ")
                ))
            })
            .clone()
    }
}
