//! Autocast with the recurrent cells, losses, distances and promote-list ops: each enters
//! the dispatch point once under its documented name; listed (or documented-unlisted)
//! ops keep their bodies out of the layer, while bilinear and tensordot inherit the casts
//! of the products they are made of, as in PyTorch on CPU.

use amp_autocast::*;
use amp_autograd::ops::{self, CdistMode, KlDivReduction, TensordotDims};
use amp_autograd::Tensor;
use amp_policy::{CastPolicy, DeviceType};
use amp_tensor::{DType, Generator};

const CPU: DeviceType = DeviceType::Cpu;

fn randn(dims: &[usize], g: &mut Generator) -> Tensor {
    Tensor::randn(dims.to_vec(), DType::F32, g).unwrap()
}

fn bf(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap()
}

/// `f` in a CPU bfloat16 autocast region.
fn in_bf16<R>(f: impl FnOnce() -> R) -> R {
    autocast(CPU, DType::BF16, f).unwrap()
}

/// `f` in a CPU autocast region, with the trace of its dispatches.
fn traced_cpu<R>(f: impl FnOnce() -> R) -> (R, Trace) {
    traced(Autocast::new(CPU), f).unwrap()
}

/// The recurrent cells are on no CPU list, and PyTorch's are composites: autocast casts
/// the linears inside them (checked against PyTorch 2.15: `rnn_tanh_cell` of float32
/// inputs under bfloat16 autocast is bfloat16, `lstm_cell`'s outputs float32, from its
/// float32 cell state).
#[test]
fn cells_on_no_list_have_their_linears_cast() {
    let mut g = Generator::new(0);
    let (x, h, c) = (
        randn(&[2, 4], &mut g),
        randn(&[2, 3], &mut g),
        randn(&[2, 3], &mut g),
    );
    let (wi, wh) = (randn(&[12, 4], &mut g), randn(&[12, 3], &mut g));
    let (bi, bh) = (randn(&[12], &mut g), randn(&[12], &mut g));
    let ((hy, cy), t) =
        traced_cpu(|| ops::lstm_cell(&x, (&h, &c), &wi, &wh, Some(&bi), Some(&bh)).unwrap());
    assert_eq!((hy.dtype(), cy.dtype()), (DType::F32, DType::F32));
    assert_eq!(t.events[0].op, "LSTMCell");
    assert_eq!(t.events[0].policy, CastPolicy::None);
    let linears: Vec<_> = t.events.iter().filter(|e| e.op == "linear").collect();
    assert_eq!(linears.len(), 2, "{:?}", t.events);
    assert!(linears
        .iter()
        .all(|e| e.policy == CastPolicy::LowerPrecisionFp && e.dtypes_out[0] == DType::BF16));
    let y = in_bf16(|| {
        ops::rnn_cell(
            &x,
            &h,
            &wi.narrow(0, 0, 3).unwrap(),
            &wh.narrow(0, 0, 3).unwrap(),
            None,
            None,
            ops::RnnNonlinearity::Tanh,
        )
        .unwrap()
    });
    assert_eq!(y.dtype(), DType::BF16);
    // bfloat16 in, bfloat16 out.
    let y = in_bf16(|| {
        ops::gru_cell(
            &bf(&x),
            &bf(&h),
            &bf(&wi.narrow(0, 0, 9).unwrap()),
            &bf(&wh.narrow(0, 0, 9).unwrap()),
            None,
            None,
        )
        .unwrap()
    });
    assert_eq!(y.dtype(), DType::BF16);
}

#[test]
fn fp32_listed_ops_run_in_float32_throughout() {
    let mut g = Generator::new(1);
    // More than 25 rows: cdist takes its matrix-product path, which stays float32.
    let (a, b) = (randn(&[30, 5], &mut g), randn(&[27, 5], &mut g));
    let (y, t) =
        traced_cpu(|| ops::cdist(&bf(&a), &bf(&b), 2.0, CdistMode::MmIfNecessary).unwrap());
    assert_eq!(y.dtype(), DType::F32);
    assert!(t.events.iter().all(|e| e.op != "matmul"));
    // From bfloat16-rounded inputs, so compare loosely; but no bfloat16 product inside.
    let (a32, b32) = (bf(&a).float().unwrap(), bf(&b).float().unwrap());
    let want = ops::cdist(&a32, &b32, 2.0, CdistMode::Direct)
        .unwrap()
        .to_vec_f64();
    for (x, w) in y.to_vec_f64().iter().zip(&want) {
        assert!((x - w).abs() <= 1e-4 * (1.0 + w.abs()), "{x} vs {w}");
    }

    let p = ops::log_softmax(&randn(&[3, 4], &mut g), 1, None).unwrap();
    let q = ops::softmax(&randn(&[3, 4], &mut g), 1, None).unwrap();
    let l = in_bf16(|| ops::kl_div(&bf(&p), &bf(&q), KlDivReduction::BatchMean, false).unwrap());
    assert_eq!(l.dtype(), DType::F32);
    let idx = Tensor::from_vec(vec![0i64, 1, -1, -1, 2, -1], [2, 3]).unwrap();
    let l = in_bf16(|| {
        ops::multilabel_margin_loss(
            &bf(&p.narrow(0, 0, 2).unwrap().narrow(1, 0, 3).unwrap()),
            &idx,
            Default::default(),
        )
        .unwrap()
    });
    assert_eq!(l.dtype(), DType::F32);
}

#[test]
fn composites_inherit_the_casts_of_their_products() {
    let mut g = Generator::new(2);
    // tensordot: float32 in, bfloat16 out (its mm is on the CPU list).
    let (a, b) = (randn(&[2, 3, 4], &mut g), randn(&[3, 4, 5], &mut g));
    let y = in_bf16(|| ops::tensordot(&a, &b, &TensordotDims::Count(2)).unwrap());
    assert_eq!(y.dtype(), DType::BF16);
    // bilinear: float32 out, with its products computed in bfloat16.
    let (x1, x2) = (randn(&[2, 3], &mut g), randn(&[2, 4], &mut g));
    let (w, bias) = (randn(&[5, 3, 4], &mut g), randn(&[5], &mut g));
    let exact = ops::bilinear(&x1, &x2, &w, Some(&bias))
        .unwrap()
        .to_vec_f64();
    let (y, t) = traced_cpu(|| ops::bilinear(&x1, &x2, &w, Some(&bias)).unwrap());
    assert_eq!(y.dtype(), DType::F32);
    let mm = t.events.iter().find(|e| e.op == "mm").unwrap();
    assert_eq!(mm.dtypes_out, vec![DType::BF16, DType::BF16]);
    for (x, w) in y.to_vec_f64().iter().zip(&exact) {
        assert!((x - w).abs() <= 0.05 * (1.0 + w.abs()), "{x} vs {w}");
    }
    // Outside autocast a bilinear of float32 is exact float32.
    let again = ops::bilinear(&x1, &x2, &w, Some(&bias))
        .unwrap()
        .to_vec_f64();
    assert_eq!(again, exact);
}

#[test]
fn float32_leaves_of_the_new_ops_get_float32_grads() {
    let mut g = Generator::new(3);
    let x = randn(&[2, 4, 3], &mut g);
    x.requires_grad_(true).unwrap();
    let w = Tensor::ones([4], DType::F32);
    w.requires_grad_(true).unwrap();
    let y = in_bf16(|| {
        let n = ops::group_norm(&bf(&x), 2, Some(&w), None, 1e-5).unwrap();
        assert_eq!(n.dtype(), DType::BF16);
        ops::sum_all(&ops::square(&n).unwrap()).unwrap()
    });
    y.backward().unwrap();
    crate::assert_f32_grads(&[&x, &w]);
}
