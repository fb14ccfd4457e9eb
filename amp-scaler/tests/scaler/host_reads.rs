//! At most one host read per scaler step: `scale`, `unscale_`, `step` and `update` keep
//! the scale, the inverse scale and the inf flags on the tensors' device, and read one
//! flag back (the skip decision), whether the step is taken or skipped, with `unscale_`
//! called by hand (gradient clipping) or not, for SGD (which steps through the general
//! path) and Adam (which takes the gradient scale into its fused update).

use amp_autograd::{ops, Reduction, Tensor};
use amp_nn::{Linear, Module};
use amp_optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use amp_scaler::GradScaler;
use amp_tensor::{host_reads, DType, Generator};

/// The host reads of one scaled step of `opt` on `model`, with an inf planted in the
/// first parameter's gradient when `overflow`, unscaling first when `unscale_first`.
fn reads_of_one_step(
    model: &Linear,
    opt: &mut dyn Optimizer,
    overflow: bool,
    unscale_first: bool,
) -> u64 {
    let mut g = Generator::new(5);
    let x = Tensor::randn([4, 3], DType::F32, &mut g).unwrap();
    let y = Tensor::randn([4, 2], DType::F32, &mut g).unwrap();
    let mut scaler = GradScaler::new();
    let loss = ops::mse_loss(&model.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
    opt.zero_grad();
    scaler.scale(&loss).unwrap().backward().unwrap();
    if overflow {
        let w = &model.parameters()[0];
        w.grad().unwrap().data().fill_(f64::INFINITY).unwrap();
    }
    let before = host_reads();
    if unscale_first {
        scaler.unscale_(opt);
    }
    let outcome = scaler.step(opt).unwrap();
    scaler.update().unwrap();
    let reads = host_reads() - before;
    assert_eq!(outcome.is_skipped(), overflow);
    assert_eq!(scaler.get_scale(), if overflow { 32768.0 } else { 65536.0 });
    reads
}

#[test]
fn a_scaler_step_reads_one_value_from_the_device() {
    for overflow in [false, true] {
        for unscale_first in [false, true] {
            let model = Linear::new(3, 2, &mut Generator::new(1)).unwrap();
            let mut sgd = Sgd::new(model.parameters(), 0.1, SgdOptions::default()).unwrap();
            let reads = reads_of_one_step(&model, &mut sgd, overflow, unscale_first);
            assert_eq!(
                reads, 1,
                "sgd, overflow {overflow}, unscale_ {unscale_first}"
            );
            let model = Linear::new(3, 2, &mut Generator::new(1)).unwrap();
            let mut adam = Adam::new(model.parameters(), 1e-3, AdamOptions::default()).unwrap();
            let reads = reads_of_one_step(&model, &mut adam, overflow, unscale_first);
            assert_eq!(
                reads, 1,
                "adam, overflow {overflow}, unscale_ {unscale_first}"
            );
        }
    }
}
