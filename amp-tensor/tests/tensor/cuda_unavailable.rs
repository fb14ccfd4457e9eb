//! Without a driver (or without the `cuda` feature) every CUDA entry point returns the
//! typed `DeviceUnavailable` error and nothing panics.

use amp_tensor::cuda::{self, Library};
use amp_tensor::{DType, Device, Error, Tensor};

fn unavailable<T: std::fmt::Debug>(r: amp_tensor::Result<T>, what: &str) {
    match r {
        Err(Error::DeviceUnavailable { device, reason }) => {
            assert!(matches!(device, Device::Cuda(_)), "{what}: {device}");
            assert!(!reason.is_empty(), "{what}: empty reason");
            eprintln!("{what}: {reason}");
        }
        other => panic!("{what}: expected DeviceUnavailable, got {other:?}"),
    }
}

#[test]
fn every_entry_point_reports_unavailable_without_a_driver() {
    if Library::Driver.is_present() {
        eprintln!(
            "SKIPPED: libcuda is present on this machine; this test is for machines without one"
        );
        return;
    }
    assert!(!cuda::is_available());
    unavailable(cuda::device_count(), "device_count");
    unavailable(cuda::ensure_device(Device::Cuda(0), &[]), "ensure_device");
    unavailable(
        cuda::ensure_device(Device::Cuda(3), &[Library::Driver]),
        "ensure_device(3)",
    );
    unavailable(Library::Driver.ensure(Device::Cuda(1)), "Library::Driver");
    let t = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    unavailable(t.to_device(Device::Cuda(0)), "to_device");
    unavailable(
        t.to_dtype(DType::F16)
            .unwrap()
            .to_device("cuda:1".parse().unwrap()),
        "to_device(cuda:1)",
    );
    // The host path is untouched.
    assert_eq!(
        t.to_device(Device::Cpu).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0]
    );
    // A CUDA entry point asked for the host is an argument error, not a panic.
    assert!(matches!(
        cuda::ensure_device(Device::Cpu, &[]),
        Err(Error::InvalidArgument { .. })
    ));
    #[cfg(feature = "cuda")]
    {
        unavailable(cuda::device_context(Device::Cuda(0)), "device_context");
        unavailable(cuda::Block::alloc(Device::Cuda(0), 1024), "Block::alloc");
        unavailable(
            cuda::CudaStorage::zeros(Device::Cuda(0), DType::BF16, 8),
            "CudaStorage::zeros",
        );
        let host = amp_tensor::CpuStorage::F32(vec![1.0, 2.0]);
        unavailable(
            cuda::CudaStorage::from_cpu(&host, Device::Cuda(0)),
            "CudaStorage::from_cpu",
        );
        assert_eq!(
            cuda::memory_stats(Device::Cuda(0)),
            cuda::MemoryStats::default()
        );
        cuda::empty_cache(Device::Cuda(0));
    }
}

#[test]
fn missing_libraries_are_named() {
    for lib in [Library::Nvrtc, Library::Cublas, Library::CublasLt] {
        match lib.ensure(Device::Cuda(0)) {
            Ok(()) => eprintln!("{lib:?} is present here"),
            Err(Error::DeviceUnavailable { reason, .. }) => {
                if cfg!(feature = "cuda") {
                    assert!(reason.contains(lib.base_name()), "{reason}");
                }
            }
            Err(e) => panic!("{lib:?}: unexpected {e:?}"),
        }
    }
}

/// The error of an op without a kernel for a tensor's device, in PyTorch's words; and the
/// host-kernel reads give a host tensor's values as the plain reads do.
#[test]
fn no_device_kernel_speaks_pytorch() {
    let e = Error::no_device_kernel("cumsum", Device::Cuda(0));
    assert_eq!(
        e.to_string(),
        "Could not run 'cumsum' with arguments from the 'CUDA' backend: it has no kernel for cuda:0 yet"
    );
    let t = Tensor::from_vec(vec![1.5f32, -2.0], [2]).unwrap();
    assert_eq!(t.host_vec_as::<f64>().unwrap(), t.to_vec_as::<f64>());
    assert_eq!(t.host_vec::<f32>().unwrap(), vec![1.5, -2.0]);
    assert!(
        t.host_vec::<f64>().is_err(),
        "host_vec checks the dtype as to_vec does"
    );
}
