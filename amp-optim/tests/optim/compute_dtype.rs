//! Updates run in the parameter's compute type: float64 parameters in float64 (state
//! too), float32 ones in float32, each against a reference written here.

use amp_autograd::Tensor;
use amp_optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use amp_tensor::{DType, Tensor as Raw};

fn param<T: amp_tensor::Element>(v: Vec<T>) -> Tensor {
    let n = v.len();
    Tensor::parameter(Raw::from_vec(v, [n]).unwrap()).unwrap()
}

fn set_grad<T: amp_tensor::Element>(p: &Tensor, g: Vec<T>) {
    let n = g.len();
    p.set_grad(Some(Tensor::from_vec(g, [n]).unwrap())).unwrap();
}

const P0: [f64; 3] = [0.1, -0.7, 1.3];
const G: [[f64; 3]; 3] = [[0.3, -0.2, 0.05], [1e-3, 0.4, -0.9], [0.25, 0.25, -1e-4]];

#[test]
fn sgd_with_momentum_in_float64() {
    let p = param(P0.to_vec());
    let o = SgdOptions {
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 0.01,
        nesterov: false,
        maximize: false,
    };
    let mut opt = Sgd::new(vec![p.clone()], 0.1, o).unwrap();
    let (mut want, mut buf) = (P0.to_vec(), None::<Vec<f64>>);
    for g in G {
        set_grad(&p, g.to_vec());
        opt.step().unwrap();
        // PyTorch's roundings: each `x.add(y, alpha=a)` is one fused multiply-add.
        let d: Vec<f64> = g
            .iter()
            .zip(&want)
            .map(|(g, p)| p.mul_add(0.01, *g))
            .collect();
        let b = match buf {
            None => d,
            Some(b) => b
                .iter()
                .zip(&d)
                .map(|(b, d)| d.mul_add(1.0 - 0.1, b * 0.9))
                .collect(),
        };
        want.iter_mut()
            .zip(&b)
            .for_each(|(p, b)| *p = b.mul_add(-0.1, *p));
        buf = Some(b);
        assert_eq!(p.dtype(), DType::F64);
        assert_eq!(p.to_vec::<f64>().unwrap(), want);
    }
}

/// Adam's update as the optimizer writes it, in the compute type `F`.
fn adam_reference<F: num_traits::Float + std::ops::AddAssign>(lr: f64, of: fn(f64) -> F) -> Vec<F> {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
    let mut p: Vec<F> = P0.iter().map(|&v| of(v)).collect();
    let (mut m, mut v) = (vec![F::zero(); 3], vec![F::zero(); 3]);
    for (k, g) in G.iter().enumerate() {
        let step = (k + 1) as f64;
        for i in 0..3 {
            let g = of(g[i]);
            // PyTorch's roundings: lerp_ and addcmul_ are fused multiply-adds, each scalar
            // is computed in float64 and rounded once.
            m[i] = (g - m[i]).mul_add(of(1.0 - b1), m[i]);
            v[i] = (of(1.0 - b2) * g).mul_add(g, v[i] * of(b2));
            let neg_step = of(-(lr / (1.0 - b1.powf(step))));
            let bc2_sqrt = of((1.0 - b2.powf(step)).sqrt());
            p[i] += (neg_step * m[i]) / (v[i].sqrt() / bc2_sqrt + of(eps));
        }
    }
    p
}

#[test]
fn adam_in_float64_and_float32() {
    let p64 = param(P0.to_vec());
    let p32 = param(P0.iter().map(|&v| v as f32).collect());
    let mut opt = Adam::new(vec![p64.clone(), p32.clone()], 1e-2, AdamOptions::default()).unwrap();
    for g in G {
        set_grad(&p64, g.to_vec());
        set_grad(&p32, g.iter().map(|&v| v as f32).collect());
        opt.step().unwrap();
    }
    assert_eq!(
        p64.to_vec::<f64>().unwrap(),
        adam_reference::<f64>(1e-2, |v| v)
    );
    assert_eq!(
        p32.to_vec::<f32>().unwrap(),
        adam_reference::<f32>(1e-2, |v| v as f32)
    );
    // float64 state for the float64 parameter, float32 for the float32 one
    let sd = opt.state_dict();
    let dtypes: Vec<String> = sd
        .state
        .values()
        .map(|m| match m.get("exp_avg") {
            Some(amp_optim::StateValue::Tensor(t)) => t.to_raw().unwrap().dtype().to_string(),
            other => panic!("exp_avg missing: {other:?}"),
        })
        .collect();
    assert_eq!(dtypes, ["float64", "float32"]);
}

/// `n` pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(seed)
                >> 40;
            (x as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The row-major `rows x cols` values `g`, stored transposed: a non-contiguous tensor
/// (its optimizer update takes the general path).
fn transposed(g: &[f32], rows: usize, cols: usize) -> Tensor {
    let gt: Vec<f32> = (0..g.len())
        .map(|j| g[(j % rows) * cols + j / rows])
        .collect();
    Tensor::from_vec(gt, [cols, rows]).unwrap().t().unwrap()
}

/// The same gradient values for both: contiguous for `fused`, transposed for `general`.
fn set_grads(fused: &Tensor, general: &Tensor, g: &[f32], rows: usize, cols: usize) {
    let contiguous = Tensor::from_vec(g.to_vec(), [rows, cols]).unwrap();
    fused.set_grad(Some(contiguous)).unwrap();
    general.set_grad(Some(transposed(g, rows, cols))).unwrap();
    assert!(!general.grad().unwrap().is_contiguous());
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// SGD with momentum takes a fused in-place pass when parameter, gradient and buffer are
/// contiguous; it must give the bits of the general path (taken here by a transposed
/// gradient) for every option, over several steps, on a tensor large enough to be
/// split over threads.
#[test]
fn fused_sgd_matches_the_general_path() {
    let (rows, cols) = (300, 1100);
    let n = rows * cols;
    let options = [
        (0.9, 0.0, 0.0, false, false),
        (0.9, 0.1, 0.01, false, false),
        (0.8, 0.0, 0.001, true, false),
        (0.5, 0.3, 0.0, false, true),
    ];
    for (momentum, dampening, weight_decay, nesterov, maximize) in options {
        let o = SgdOptions {
            momentum,
            dampening,
            weight_decay,
            nesterov,
            maximize,
        };
        let p0 = values(n, 1);
        let mk = || Tensor::parameter(Raw::from_vec(p0.clone(), [rows, cols]).unwrap()).unwrap();
        let (fused, general) = (mk(), mk());
        let mut opt_f = Sgd::new(vec![fused.clone()], 0.05, o).unwrap();
        let mut opt_g = Sgd::new(vec![general.clone()], 0.05, o).unwrap();
        for step in 0..3u64 {
            set_grads(&fused, &general, &values(n, 7 + step), rows, cols);
            opt_f.step().unwrap();
            opt_g.step().unwrap();
            assert!(bits(&fused) == bits(&general), "{o:?} step {step}");
        }
    }
}

/// Adam/AdamW take a fused in-place pass when parameter, gradient and moments are
/// contiguous (amsgrad off); it must give the bits of the general path (taken here by a
/// transposed gradient) for plain, coupled and decoupled weight decay, maximize, and the
/// scaler's fused step (`grad_scale` divided inside the update).
#[test]
fn fused_adam_matches_the_general_path() {
    let (rows, cols) = (300, 1100);
    let n = rows * cols;
    let adamw = AdamOptions::adamw();
    let cases = [
        (AdamOptions::default(), None),
        (
            AdamOptions {
                weight_decay: 0.01,
                ..AdamOptions::default()
            },
            None,
        ),
        (adamw, Some(1024.0)),
        (
            AdamOptions {
                maximize: true,
                betas: (0.8, 0.99),
                ..adamw
            },
            None,
        ),
    ];
    for (o, scale) in cases {
        let p0 = values(n, 1);
        let mk = || Tensor::parameter(Raw::from_vec(p0.clone(), [rows, cols]).unwrap()).unwrap();
        let (fused, general) = (mk(), mk());
        let mut opt_f = Adam::new(vec![fused.clone()], 1e-3, o).unwrap();
        let mut opt_g = Adam::new(vec![general.clone()], 1e-3, o).unwrap();
        for step in 0..3u64 {
            set_grads(&fused, &general, &values(n, 7 + step), rows, cols);
            match scale {
                Some(s) => {
                    let (s, inf) = (Raw::full([1], s, DType::F32), Raw::zeros([1], DType::F32));
                    opt_f.step_with_scaling(Some(&s), &inf).unwrap();
                    opt_g.step_with_scaling(Some(&s), &inf).unwrap();
                }
                None => {
                    opt_f.step().unwrap();
                    opt_g.step().unwrap();
                }
            }
            assert!(bits(&fused) == bits(&general), "{o:?} step {step}");
        }
    }
}
