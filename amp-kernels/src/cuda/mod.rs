//! CUDA kernels (behind the `cuda` feature): the device sources ([`sources`]), their
//! NVRTC compilation (once per process and module, cached), and the host-side
//! launchers on `amp_tensor::cuda::CudaStorage` buffers, plus matmul on cuBLAS and
//! convolutions on cuDNN (`cudnn`), all behind the feature.
//!
//! Every entry point checks the libraries it needs first (see `amp_tensor::cuda`) and
//! returns [`amp_tensor::Error::DeviceUnavailable`] when one is missing, so nothing panics on a
//! machine without a driver.

pub mod sources;

#[cfg(feature = "cuda")]
pub mod cudnn;
#[cfg(feature = "cuda")]
mod host;
#[cfg(feature = "cuda")]
pub mod optim;
#[cfg(feature = "cuda")]
pub mod route;
#[cfg(feature = "cuda")]
pub use host::*;
