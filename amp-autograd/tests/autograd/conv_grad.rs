//! Finite-difference checks (float64) of the convolution ops' first- and second-order
//! gradients, for random strides, padding, dilation, groups, transposed or not.

use amp_autograd::{grad, ops, GradOptions, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    rank: usize,
    transposed: bool,
    n: usize,
    groups: usize,
    cg: usize,
    og: usize,
    input: Vec<usize>,
    kernel: Vec<usize>,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
    bias: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=2, any::<bool>()).prop_flat_map(|(rank, transposed)| {
        (
            Just(rank),
            Just(transposed),
            1usize..=2,
            1usize..=2,
            1usize..=2,
            1usize..=2,
            proptest::collection::vec(
                (2usize..=5, 1usize..=3, 1usize..=2, 0usize..=1, 1usize..=2),
                rank,
            ),
            any::<bool>(),
        )
            .prop_filter_map("empty", |(rank, transposed, n, groups, cg, og, d, bias)| {
                let c = Case {
                    rank,
                    transposed,
                    n,
                    groups,
                    cg,
                    og,
                    input: d.iter().map(|v| v.0).collect(),
                    kernel: d.iter().map(|v| v.1).collect(),
                    stride: d.iter().map(|v| v.2).collect(),
                    padding: d.iter().map(|v| v.3).collect(),
                    dilation: d.iter().map(|v| v.4).collect(),
                    bias,
                };
                let ok = (0..rank).all(|i| {
                    if transposed {
                        (c.input[i] - 1) * c.stride[i] + c.dilation[i] * (c.kernel[i] - 1) + 1
                            > 2 * c.padding[i]
                    } else {
                        c.input[i] + 2 * c.padding[i] > c.dilation[i] * (c.kernel[i] - 1)
                    }
                });
                ok.then_some(c)
            })
    })
}

impl Case {
    fn dims(&self) -> (Vec<usize>, Vec<usize>) {
        let mut x = vec![self.n, self.groups * self.cg];
        x.extend(&self.input);
        let mut w = if self.transposed {
            vec![self.groups * self.cg, self.og]
        } else {
            vec![self.groups * self.og, self.cg]
        };
        w.extend(&self.kernel);
        (x, w)
    }

    fn run(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> amp_autograd::Result<Tensor> {
        let (s, p, d, g) = (&self.stride, &self.padding, &self.dilation, self.groups);
        match (self.rank, self.transposed) {
            (1, false) => ops::conv1d(x, w, b, s, p, d, g),
            (2, false) => ops::conv2d(x, w, b, s, p, d, g),
            (1, true) => ops::conv_transpose1d(x, w, b, s, p, &[0], g, d),
            _ => ops::conv_transpose2d(x, w, b, s, p, &[0], g, d),
        }
    }
}

fn leaf(dims: &[usize], gen: &mut Generator) -> Tensor {
    let t = Tensor::from_raw(Raw::randn(dims.to_vec(), DType::F64, gen).unwrap());
    t.requires_grad_(true).unwrap();
    t
}

fn with_delta(t: &Tensor, i: usize, h: f64) -> Tensor {
    let mut v = t.to_vec_f64();
    v[i] += h;
    let n = Tensor::from_vec(v, t.dims().to_vec()).unwrap();
    n.requires_grad_(true).unwrap();
    n
}

/// `sum(conv(params) * r)` and its gradients in every parameter (with `create_graph`).
fn first_order(c: &Case, params: &[Tensor], r: &Tensor, create: bool) -> (Tensor, Vec<Tensor>) {
    let y = c.run(&params[0], &params[1], params.get(2)).unwrap();
    let loss = ops::sum_all(&ops::mul(&y, r).unwrap()).unwrap();
    let g = grad(
        std::slice::from_ref(&loss),
        params,
        &[None],
        GradOptions {
            create_graph: create,
            ..Default::default()
        },
    )
    .unwrap();
    (loss, g.into_iter().map(|g| g.unwrap()).collect())
}

/// `Σ_k sum(g_k * v_k)` over the first-order gradients.
fn second_loss(
    c: &Case,
    params: &[Tensor],
    r: &Tensor,
    v: &[Tensor],
    create: bool,
) -> (Tensor, Vec<Tensor>) {
    let (_, g) = first_order(c, params, r, true);
    let mut total: Option<Tensor> = None;
    for (gk, vk) in g.iter().zip(v) {
        let s = ops::sum_all(&ops::mul(gk, vk).unwrap()).unwrap();
        total = Some(match total {
            None => s,
            Some(t) => ops::add(&t, &s).unwrap(),
        });
    }
    let l2 = total.unwrap();
    let opts = GradOptions {
        create_graph: create,
        allow_unused: true,
        ..Default::default()
    };
    let g2 = grad(std::slice::from_ref(&l2), params, &[None], opts).unwrap();
    let g2 = g2
        .into_iter()
        .zip(params)
        .map(|(g, p)| g.unwrap_or_else(|| Tensor::zeros(p.dims().to_vec(), DType::F64)))
        .collect();
    (l2, g2)
}

fn check(got: &[f64], num: &[f64], what: &str) {
    for (i, (a, b)) in got.iter().zip(num).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
            "{what}[{i}]: analytic {a}, numeric {b}"
        );
    }
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(16))]

    #[test]
    fn conv_gradients_match_finite_differences(c in case(), seed in 0u64..1000) {
        let mut gen = Generator::new(seed);
        let (xd, wd) = c.dims();
        let x = leaf(&xd, &mut gen);
        let w = leaf(&wd, &mut gen);
        let mut params = vec![x, w];
        if c.bias {
            let outc = c.groups * c.og;
            params.push(leaf(&[outc], &mut gen));
        }
        let y = c.run(&params[0], &params[1], params.get(2)).unwrap();
        let r = Tensor::from_raw(Raw::randn(y.dims().to_vec(), DType::F64, &mut gen).unwrap());
        let v: Vec<Tensor> = params
            .iter()
            .map(|p| Tensor::from_raw(Raw::randn(p.dims().to_vec(), DType::F64, &mut gen).unwrap()))
            .collect();
        let h = 1e-5;
        // First order: d loss / d p by central differences.
        let (_, g1) = first_order(&c, &params, &r, false);
        for k in 0..params.len() {
            let mut num = Vec::new();
            for i in 0..params[k].elem_count() {
                let f = |s: f64| {
                    let mut ps = params.clone();
                    ps[k] = with_delta(&params[k], i, s * h);
                    let y = c.run(&ps[0], &ps[1], ps.get(2)).unwrap();
                    ops::sum_all(&ops::mul(&y, &r).unwrap()).unwrap().item_f64().unwrap()
                };
                num.push((f(1.0) - f(-1.0)) / (2.0 * h));
            }
            check(&g1[k].to_vec_f64(), &num, "first order");
        }
        // Second order: d/dp Σ sum(g_k · v_k), against differences of the first-order grads.
        let (_, g2) = second_loss(&c, &params, &r, &v, false);
        for k in 0..params.len() {
            let mut num = Vec::new();
            for i in 0..params[k].elem_count() {
                let f = |s: f64| {
                    let mut ps = params.clone();
                    ps[k] = with_delta(&params[k], i, s * h);
                    let (_, g) = first_order(&c, &ps, &r, false);
                    g.iter()
                        .zip(&v)
                        .map(|(g, v)| g.to_vec_f64().iter().zip(v.to_vec_f64()).map(|(a, b)| a * b).sum::<f64>())
                        .sum::<f64>()
                };
                num.push((f(1.0) - f(-1.0)) / (2.0 * h));
            }
            check(&g2[k].to_vec_f64(), &num, "second order");
        }
    }
}

/// The benchmark workload: Conv2d 64→64, 3×3, padding 1, input 32×64×32×32, forward
/// and backward of `.sum()`, in float32 and with bfloat16 casts (what cpu autocast
/// does). `cargo test -p amp-autograd --release --test autograd conv_grad:: -- --ignored --nocapture`
#[test]
#[ignore]
fn timing_conv2d_forward_backward() {
    let mut gen = Generator::new(0);
    let x = Tensor::from_raw(Raw::randn([32, 64, 32, 32], DType::F32, &mut gen).unwrap());
    let w = leaf(&[64, 64, 3, 3], &mut gen)
        .to_dtype(DType::F32)
        .unwrap()
        .detach();
    w.requires_grad_(true).unwrap();
    let b = Tensor::from_raw(Raw::randn([64], DType::F32, &mut gen).unwrap());
    b.requires_grad_(true).unwrap();
    for (label, dtype) in [("f32", DType::F32), ("bf16 casts", DType::BF16)] {
        let mut best = f64::MAX;
        for _ in 0..5 {
            w.zero_grad();
            b.zero_grad();
            let t = std::time::Instant::now();
            let (xc, wc, bc) = (
                x.to_dtype(dtype).unwrap(),
                w.to_dtype(dtype).unwrap(),
                b.to_dtype(dtype).unwrap(),
            );
            let y = ops::conv2d(&xc, &wc, Some(&bc), &[1], &[1], &[1], 1).unwrap();
            ops::sum_all(&y).unwrap().backward().unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            assert_eq!(w.grad().unwrap().dtype(), DType::F32);
        }
        println!("conv2d forward+backward ({label}): {:.1} ms", best * 1e3);
    }
}
