//! The one-rank group and `DistributedDataParallel` on it: arguments are checked as on
//! MPI, gradients come back unchanged, the iteration rules (`no_sync`, a gradient
//! marked twice, unused parameters) hold without any launcher.

use amp_autograd::{ops, BackwardOptions, Tensor};
use amp_distributed::{
    sharded_grad_scaler, DdpOptions, DistributedDataParallel, Error, ProcessGroup, ReduceOp,
    SingleProcess,
};
use amp_nn::{Linear, Module, ReLU, Sequential};
use amp_optim::{Sgd, SgdOptions};
use amp_scaler::{GradScalerOptions, StepOutcome};
use amp_tensor::{DType, Generator, Tensor as Raw};

use crate::group;

#[test]
fn collectives_of_one_rank() {
    let g = SingleProcess;
    assert_eq!((g.rank(), g.size()), (0, 1));
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let t = Raw::from_vec(vec![1.5f64, -2.0], [2])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            g.all_reduce(&t, op).unwrap();
        }
        g.broadcast(&t, 0).unwrap();
        assert_eq!(t.to_vec_f64(), vec![1.5, -2.0]);
        let out = [Raw::zeros([2], dtype)];
        g.all_gather(&out, &t).unwrap();
        assert_eq!(out[0].to_vec_f64(), vec![1.5, -2.0]);
    }
    let mut w = g.barrier_async().unwrap();
    assert!(w.is_completed().unwrap());

    let ints = Raw::zeros([2], DType::I32);
    let e = g.all_reduce(&ints, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(
            e,
            Error::UnsupportedDtype {
                op: "all_reduce",
                dtype: DType::I32
            }
        ),
        "{e}"
    );
    let f = Raw::zeros([2], DType::F32);
    let e = g.broadcast(&f, 1).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidRank {
            op: "broadcast",
            rank: 1,
            size: 1
        }
    );
    let e = g.all_gather(&[f.clone(), f.clone()], &f).unwrap_err();
    assert!(e.to_string().contains("expected 1 output tensors"), "{e}");
    let e = g
        .all_gather(&[Raw::zeros([3], DType::F32)], &f)
        .unwrap_err();
    assert!(e.to_string().contains("output 0 is [3]"), "{e}");
}

fn mlp(seed: u64) -> Sequential {
    let mut gen = Generator::new(seed);
    Sequential::new()
        .add(Linear::new(3, 8, &mut gen).unwrap())
        .add(ReLU)
        .add(Linear::new(8, 2, &mut gen).unwrap())
}

fn batch() -> (Tensor, Tensor) {
    let mut gen = Generator::new(9);
    (
        Tensor::randn([6, 3], DType::F32, &mut gen).unwrap(),
        Tensor::randn([6, 2], DType::F32, &mut gen).unwrap(),
    )
}

fn loss(m: &dyn Module) -> Tensor {
    let (x, y) = batch();
    ops::mse_loss(&m.forward(&x).unwrap(), &y, Default::default()).unwrap()
}

fn grads(m: &dyn Module) -> Vec<Vec<f64>> {
    m.parameters()
        .iter()
        .map(|p| p.grad().expect("a gradient").to_vec_f64())
        .collect()
}

#[test]
fn one_rank_keeps_the_gradients_of_plain_training_in_several_buckets() {
    let plain = mlp(1);
    loss(&plain).backward().unwrap();
    // 64 bytes per bucket: each parameter but the 2 biases alone.
    let opts = DdpOptions {
        bucket_cap_bytes: 64,
        ..Default::default()
    };
    let ddp = DistributedDataParallel::with_options(mlp(1), group(), opts).unwrap();
    assert_eq!(ddp.num_buckets(), 4);
    loss(&ddp).backward().unwrap();
    assert_eq!(grads(&ddp), grads(&plain));
    let names: Vec<String> = ddp.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "module.0.weight",
            "module.0.bias",
            "module.2.weight",
            "module.2.bias"
        ]
    );
    assert_eq!(
        DistributedDataParallel::new(mlp(1), group())
            .unwrap()
            .num_buckets(),
        1
    );
}

#[test]
fn the_first_bucket_is_small_so_communication_starts_early() {
    // Reverse order: the bias (2 KB) opens the first bucket, capped at 1 MiB as in
    // PyTorch; the 2 MiB weight goes to the next one. With the first cap as large as
    // the others, both share one bucket.
    let model = |gen: &mut Generator| Linear::new(1024, 512, gen).unwrap();
    let default = DistributedDataParallel::new(model(&mut Generator::new(0)), group()).unwrap();
    assert_eq!(default.num_buckets(), 2);
    let one = DdpOptions {
        first_bucket_cap_bytes: amp_distributed::DEFAULT_BUCKET_CAP_BYTES,
        ..Default::default()
    };
    let single =
        DistributedDataParallel::with_options(model(&mut Generator::new(0)), group(), one).unwrap();
    assert_eq!(single.num_buckets(), 1);
    // Both reduce to the same gradients (one rank: the local ones).
    let x = Tensor::from_raw(Raw::randn([4, 1024], DType::F32, &mut Generator::new(1)).unwrap());
    for m in [&default, &single] {
        ops::sum_all(&m.forward(&x).unwrap())
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(m.last_comm_stats().unwrap().buckets, m.num_buckets());
    }
    let g = |m: &DistributedDataParallel<Linear>| grads(m);
    assert_eq!(g(&default), g(&single));
}

#[test]
fn no_sync_accumulates_and_the_next_synced_backward_reduces_the_sum() {
    let keep = BackwardOptions {
        retain_graph: Some(true),
        ..Default::default()
    };
    // Accumulating twice locally is what no_sync is for; the next synced backward
    // reduces the sum.
    let plain = mlp(2);
    for _ in 0..3 {
        loss(&plain).backward().unwrap();
    }
    let ddp = DistributedDataParallel::new(mlp(2), group()).unwrap();
    {
        let _local = ddp.no_sync();
        let l = loss(&ddp);
        l.backward_with(keep).unwrap();
        l.backward().unwrap();
    }
    loss(&ddp).backward().unwrap();
    assert_eq!(grads(&ddp), grads(&plain));
}

/// `w` is used by forward, `unused` never.
struct WithUnused {
    w: Tensor,
    unused: Tensor,
}

impl Module for WithUnused {
    fn forward(&self, x: &Tensor) -> amp_autograd::Result<Tensor> {
        ops::mul(x, &self.w)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("w".into(), self.w.clone()),
            ("unused".into(), self.unused.clone()),
        ]
    }
}

#[test]
fn unused_parameters_need_finish_gradient_sync() {
    let m = WithUnused {
        w: Tensor::from_vec(vec![2.0f32], [1]).unwrap(),
        unused: Tensor::from_vec(vec![1.0f32], [1]).unwrap(),
    };
    m.w.requires_grad_(true).unwrap();
    m.unused.requires_grad_(true).unwrap();
    // Two buckets, `unused` alone in the first: nothing can be launched by `w`.
    let ddp = DistributedDataParallel::with_options(
        m,
        group(),
        DdpOptions {
            bucket_cap_bytes: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let x = Tensor::from_vec(vec![3.0f32], [1]).unwrap();
    ops::sum_all(&ddp.forward(&x).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let e = Error::from(ddp.forward(&x).unwrap_err());
    assert!(e.to_string().contains("finish_gradient_sync"), "{e}");
    ddp.finish_gradient_sync().unwrap();
    assert_eq!(ddp.module().w.grad().unwrap().to_vec_f64(), vec![3.0]);
    assert_eq!(ddp.module().unused.grad().unwrap().to_vec_f64(), vec![0.0]);
    ddp.finish_gradient_sync().unwrap(); // nothing left to do

    // A backward that marks `w` again before the iteration was finished is refused.
    let l = ops::sum_all(&ddp.forward(&x).unwrap()).unwrap();
    l.backward_with(BackwardOptions {
        retain_graph: Some(true),
        ..Default::default()
    })
    .unwrap();
    let e = Error::from(l.backward().unwrap_err());
    assert!(
        e.to_string()
            .contains("Expected to mark a variable ready only once"),
        "{e}"
    );
}

#[test]
fn a_sharded_scaler_on_one_rank_decides_as_a_plain_one() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    w.requires_grad_(true).unwrap();
    let mut opt = Sgd::new(vec![w.clone()], 0.5, SgdOptions::default()).unwrap();
    let opts = GradScalerOptions::default().init_scale(8.0);
    let mut scaler = sharded_grad_scaler(opts, group()).unwrap();
    let l = ops::sum_all(&ops::square(&w).unwrap()).unwrap();
    scaler.scale(&l).unwrap().backward().unwrap();
    assert_eq!(scaler.step(&mut opt).unwrap(), StepOutcome::Stepped);
    scaler.update().unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    w.zero_grad();
    let l = ops::sum_all(&w.mul_scalar(f32::INFINITY).unwrap()).unwrap();
    scaler.scale(&l).unwrap().backward().unwrap();
    assert_eq!(scaler.step(&mut opt).unwrap(), StepOutcome::Skipped);
    scaler.update().unwrap();
    assert_eq!(scaler.get_scale(), 4.0);
}

#[test]
fn errors_cross_backward_whole() {
    let e = Error::Timeout {
        op: "all_reduce",
        after: std::time::Duration::from_secs(3),
    };
    let through: amp_autograd::Error = e.clone().into();
    assert!(matches!(through, amp_autograd::Error::Hook(_)));
    assert_eq!(Error::from(through), e);
    let other = amp_autograd::Error::NoGradFn;
    assert_eq!(Error::from(other.clone()), Error::Autograd(other));
}
