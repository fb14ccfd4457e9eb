//! Finite-difference checks (float64) of the convolution ops' first- and second-order
//! gradients, for random strides, padding, dilation, groups, transposed or not.

use amp_autograd::{ops, Tensor};
use amp_tensor::{DType, Generator, Tensor as Raw};
use amp_testing::gradcheck::{GradCheck, SecondOrder};
use amp_testing::tensors::randn_leaf;
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

proptest! {
    #![proptest_config(amp_testing::proptest_config(16))]

    #[test]
    fn conv_gradients_match_finite_differences(c in case(), seed in 0u64..1000) {
        let mut gen = Generator::new(seed);
        let (xd, wd) = c.dims();
        let x = randn_leaf(&xd, &mut gen);
        let w = randn_leaf(&wd, &mut gen);
        let mut params = vec![x, w];
        if c.bias {
            let outc = c.groups * c.og;
            params.push(randn_leaf(&[outc], &mut gen));
        }
        let y = c.run(&params[0], &params[1], params.get(2)).unwrap();
        let r = Tensor::from_raw(Raw::randn(y.dims().to_vec(), DType::F64, &mut gen).unwrap());
        let v: Vec<Tensor> = params
            .iter()
            .map(|p| Tensor::from_raw(Raw::randn(p.dims().to_vec(), DType::F64, &mut gen).unwrap()))
            .collect();
        // First order: d sum(y · r) / d p; second order: d/dp Σ sum(g_k · v_k) over the
        // first-order grads g_k, both by central differences (step 1e-5, within 1e-6).
        let f = |p: &[Tensor]| c.run(&p[0], &p[1], p.get(2));
        let check = GradCheck::new(&f).weights(&r).eps(1e-5).tol(1e-6);
        check.first(&params);
        check.second(&params, SecondOrder::Vectors(&v));
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
    let w = randn_leaf(&[64, 64, 3, 3], &mut gen)
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
