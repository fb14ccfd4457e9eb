//! Every CUDA kernel source compiles with NVRTC and defines every kernel the launchers
//! name (no GPU needed): `cargo test --release -p amp-kernels --features cuda --test
//! kernels nvrtc_compile`. Runs where libnvrtc can be opened: from the system search
//! path, or from the file named by `AMP_NVRTC_LIB` (e.g. the `nvidia-cuda-nvrtc-cu12`
//! wheel's `nvidia/cuda_nvrtc/lib/libnvrtc.so.12`, as `.ci/run` installs it); elsewhere
//! it prints why it skips.

#[cfg(feature = "cuda")]
#[test]
fn every_module_compiles_with_nvrtc() {
    use amp_kernels::cuda::{compile_module, sources::MODULES};
    use amp_tensor::cuda::Library;

    if let Ok(path) = std::env::var("AMP_NVRTC_LIB") {
        // SAFETY: loading libnvrtc runs only its own initialisers. Kept loaded so the
        // probe and cudarc, which open it by its soname, find this copy.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => std::mem::forget(lib),
            Err(e) => {
                eprintln!("SKIPPED nvrtc_compile: AMP_NVRTC_LIB={path} could not be opened: {e}");
                return;
            }
        }
    }
    if let Err(e) = Library::Nvrtc.ensure(amp_tensor::Device::Cuda(0)) {
        eprintln!("SKIPPED nvrtc_compile: {e}");
        return;
    }
    let mut kernels = 0;
    for arch in ["compute_70", "compute_90"] {
        for m in MODULES {
            let ptx = compile_module(&m, arch)
                .unwrap_or_else(|e| panic!("module {} for {arch}: {e}", m.name));
            for name in m.kernel_names() {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "module {} ({arch}) lacks kernel {name}",
                    m.name
                );
                kernels += 1;
            }
        }
    }
    eprintln!("nvrtc_compile: {kernels} kernel entries checked over 2 architectures");
    // Per architecture: unary, binary (+ scalar), cast (+ copy_many per element width), reduce (one pass, split part and
    // fin, column part and fin), softmax (forward and backward, plain and log), layer norm (forward, backward,
    // its parameter sums' part per float dtype, and their fin for float32 and float64),
    // index, optim (SGD per float dtype, one multi-tensor Adam), amp.
    assert_eq!(
        kernels,
        2 * (30 * 4
            + 2 * 9 * 4
            + (49 + 4)
            + 5 * 4 * 4
            + 4 * 4
            + (3 * 4 + 2)
            + (3 * 7 + 6 * 7 + 4)
            + (4 + 1)
            + 2)
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn every_module_compiles_with_nvrtc() {
    eprintln!("SKIPPED nvrtc_compile: built without the `cuda` feature");
}
