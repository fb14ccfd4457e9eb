//! The integration tests of `amp-kernels`, one module per subject, in one test binary
//! (one link instead of one per file; `cargo test -p amp-kernels --release --test kernels <module>::`
//! runs one subject).

mod api;
mod conv;
mod cuda_device;
mod cuda_plans;
mod elementwise;
mod elementwise_perf;
mod index;
mod matmul;
mod nvrtc_compile;
mod pool;
mod reduce;
mod reduce_norm;
mod reduce_prop;
mod reduce_timing;
mod softmax;
