//! Temporary profiling driver (removed before hand-off).
use amp_kernels::add;
use amp_tensor::Tensor;
#[test]
#[ignore = "profiling"]
fn small_add_loop() {
    let a = Tensor::from_vec(vec![1f32; 64], [8, 8]).unwrap();
    let b = Tensor::from_vec(vec![2f32; 64], [8, 8]).unwrap();
    for _ in 0..3_000_000 {
        std::hint::black_box(add(std::hint::black_box(&a), &b).unwrap());
    }
}
