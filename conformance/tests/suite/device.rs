//! `--device`: the command line, and a device run where no device can be used (no `cuda`
//! feature, or no GPU), which is the device-unavailable error, not a panic.

use amp::tensor::{Device, Error};
use conformance::cli::Options;
use conformance::{run_on, ConformanceError};

#[test]
fn device_option_parses() {
    let o = Options::parse(["--device", "cuda"]).unwrap();
    assert_eq!(o.device, Device::Cuda(0));
    let o = Options::parse(["--texts", "--device", "cuda:1", "--vectors", "dir"]).unwrap();
    assert_eq!(
        (o.device, o.texts, o.vectors.as_deref()),
        (Device::Cuda(1), true, Some(std::path::Path::new("dir")))
    );
    assert_eq!(
        Options::parse(["--device", "cpu"]).unwrap(),
        Options::default()
    );
    assert_eq!(Options::default().device, Device::Cpu);
    assert!(Options::parse(["--device", "tpu"])
        .unwrap_err()
        .contains("unknown device 'tpu'"));
    assert_eq!(
        Options::parse(["--device"]).unwrap_err(),
        "`--device` needs a value"
    );
    assert_eq!(
        Options::parse(["--device", "cuda", "--device", "cpu"]).unwrap_err(),
        "`--device` is given twice"
    );
    assert_eq!(
        Options::parse(["--gpu"]).unwrap_err(),
        "unknown argument `--gpu`"
    );
}

#[test]
fn a_device_run_without_a_device_is_device_unavailable() {
    if amp::tensor::cuda::is_available() {
        return; // a GPU machine with the `cuda` feature: the device run is real
    }
    let options = Options::parse(["--device", "cuda"]).unwrap();
    let e = options.run().unwrap_err();
    assert!(
        matches!(
            e,
            ConformanceError::Device(Error::DeviceUnavailable {
                device: Device::Cuda(0),
                ..
            })
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().starts_with("device cuda:0 is unavailable: "),
        "{e}"
    );
    // Checked before the vector directory is read.
    let e = run_on(Device::Cuda(0), Some(std::path::Path::new("/nonexistent"))).unwrap_err();
    assert!(matches!(e, ConformanceError::Device(_)), "{e:?}");
}

#[test]
fn the_cpu_device_is_the_builtin_run() {
    assert_eq!(
        run_on(Device::Cpu, None).unwrap(),
        conformance::run_builtin()
    );
}
