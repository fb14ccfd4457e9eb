//! Recurrent cells, the remaining losses, norms/distances and promote-list ops: forward
//! values against references written here (plain loops in f64), first-order gradients
//! by the workspace's gradient checker, and second-order gradients (of `sum(g * g)` over
//! the first-order grads) by the same checker on the first-order grads.

use amp_autograd::ops::{self, CdistMode, KlDivReduction, RnnNonlinearity, TensordotDims};
use amp_autograd::{grad, GradOptions, Reduction, Result, Tensor};
use amp_tensor::{DType, Generator};
use proptest::prelude::*;

use amp_testing::gradcheck::{assert_near, check_grad, check_second_order};
use amp_testing::tensors::{leaf, randn_leaf};

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64()
}

/// Checks the gradients (and, with `second`, the second-order gradients) of
/// `sum(f(inputs) * w)` against central differences (the binary's one checker).
fn check_grads(f: &dyn Fn(&[Tensor]) -> Result<Tensor>, inputs: &[Tensor], second: bool) {
    check_grad(inputs, f, 1e-5);
    if second {
        check_second_order(inputs, f, 1e-4);
    }
}

// ----- references -----------------------------------------------------------------------

fn sigm(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x W^T + b` for row-major `x` `[n, k]`, `w` `[m, k]`.
fn lin(x: &[f64], n: usize, k: usize, w: &[f64], m: usize, b: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for r in 0..n {
        for c in 0..m {
            let mut s = b[c];
            for j in 0..k {
                s += x[r * k + j] * w[c * k + j];
            }
            out[r * m + c] = s;
        }
    }
    out
}

struct CellCase {
    n: usize,
    input: usize,
    hidden: usize,
    x: Tensor,
    h: Tensor,
    c: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
}

fn cell_case(n: usize, input: usize, hidden: usize, gates: usize, seed: u64) -> CellCase {
    let mut g = Generator::new(seed);
    CellCase {
        n,
        input,
        hidden,
        x: randn_leaf(&[n, input], &mut g),
        h: randn_leaf(&[n, hidden], &mut g),
        c: randn_leaf(&[n, hidden], &mut g),
        w_ih: randn_leaf(&[gates * hidden, input], &mut g),
        w_hh: randn_leaf(&[gates * hidden, hidden], &mut g),
        b_ih: randn_leaf(&[gates * hidden], &mut g),
        b_hh: randn_leaf(&[gates * hidden], &mut g),
    }
}

impl CellCase {
    fn gates(&self, rows: usize) -> (Vec<f64>, Vec<f64>) {
        (
            lin(
                &vals(&self.x),
                self.n,
                self.input,
                &vals(&self.w_ih),
                rows,
                &vals(&self.b_ih),
            ),
            lin(
                &vals(&self.h),
                self.n,
                self.hidden,
                &vals(&self.w_hh),
                rows,
                &vals(&self.b_hh),
            ),
        )
    }
    fn inputs(&self, with_c: bool) -> Vec<Tensor> {
        let mut v = vec![self.x.clone(), self.h.clone()];
        if with_c {
            v.push(self.c.clone());
        }
        v.extend([
            self.w_ih.clone(),
            self.w_hh.clone(),
            self.b_ih.clone(),
            self.b_hh.clone(),
        ]);
        v
    }
}

#[test]
fn rnn_cells_match_references() {
    let c = cell_case(2, 4, 3, 1, 1);
    let (gi, gh) = c.gates(3);
    let want: Vec<f64> = gi.iter().zip(&gh).map(|(a, b)| (a + b).tanh()).collect();
    let got =
        ops::rnn_tanh_cell(&c.x, &c.h, &c.w_ih, &c.w_hh, Some(&c.b_ih), Some(&c.b_hh)).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "rnn_tanh_cell");
    let want: Vec<f64> = gi.iter().zip(&gh).map(|(a, b)| (a + b).max(0.0)).collect();
    let got =
        ops::rnn_relu_cell(&c.x, &c.h, &c.w_ih, &c.w_hh, Some(&c.b_ih), Some(&c.b_hh)).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "rnn_relu_cell");

    let c = cell_case(2, 4, 3, 3, 2);
    let (gi, gh) = c.gates(9);
    let hv = vals(&c.h);
    let mut want = vec![0.0; 6];
    for r in 0..2 {
        for j in 0..3 {
            let at = |g: &[f64], k: usize| g[r * 9 + k * 3 + j];
            let rg = sigm(at(&gi, 0) + at(&gh, 0));
            let z = sigm(at(&gi, 1) + at(&gh, 1));
            let nn = (at(&gi, 2) + rg * at(&gh, 2)).tanh();
            want[r * 3 + j] = (1.0 - z) * nn + z * hv[r * 3 + j];
        }
    }
    let got = ops::gru_cell(&c.x, &c.h, &c.w_ih, &c.w_hh, Some(&c.b_ih), Some(&c.b_hh)).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "gru_cell");

    let c = cell_case(2, 4, 3, 4, 3);
    let (gi, gh) = c.gates(12);
    let cv = vals(&c.c);
    let (mut wh, mut wc) = (vec![0.0; 6], vec![0.0; 6]);
    for r in 0..2 {
        for j in 0..3 {
            let at = |k: usize| gi[r * 12 + k * 3 + j] + gh[r * 12 + k * 3 + j];
            let cy = sigm(at(1)) * cv[r * 3 + j] + sigm(at(0)) * at(2).tanh();
            wc[r * 3 + j] = cy;
            wh[r * 3 + j] = sigm(at(3)) * cy.tanh();
        }
    }
    let (h, cy) = ops::lstm_cell(
        &c.x,
        (&c.h, &c.c),
        &c.w_ih,
        &c.w_hh,
        Some(&c.b_ih),
        Some(&c.b_hh),
    )
    .unwrap();
    assert_near(&vals(&h), &wh, 1e-12, "lstm_cell h");
    assert_near(&vals(&cy), &wc, 1e-12, "lstm_cell c");
}

#[test]
fn cells_check_shapes_and_keep_dtypes() {
    let c = cell_case(2, 4, 3, 3, 4);
    // A GRU cell needs 3 * hidden rows.
    assert!(ops::gru_cell(&c.x, &c.h, &c.w_hh, &c.w_hh, None, None).is_err());
    assert!(ops::lstm_cell(&c.x, (&c.h, &c.c), &c.w_ih, &c.w_hh, None, None).is_err());
    // Unbatched input.
    let x1 = ops::select(&c.x, 0, 0).unwrap();
    let h1 = ops::select(&c.h, 0, 0).unwrap();
    let y = ops::gru_cell(&x1, &h1, &c.w_ih, &c.w_hh, Some(&c.b_ih), None).unwrap();
    assert_eq!(y.dims(), &[3]);
    // bf16 in, bf16 out.
    let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let y = ops::rnn_cell(
        &b(&c.x),
        &b(&c.h),
        &b(&ops::narrow(&c.w_ih, 0, 0, 3).unwrap()),
        &b(&ops::narrow(&c.w_hh, 0, 0, 3).unwrap()),
        None,
        None,
        RnnNonlinearity::Tanh,
    )
    .unwrap();
    assert_eq!(y.dtype(), DType::BF16);
}

#[test]
fn cell_gradients_and_double_gradients() {
    let c = cell_case(2, 3, 2, 1, 5);
    check_grads(
        &|v| ops::rnn_tanh_cell(&v[0], &v[1], &v[2], &v[3], Some(&v[4]), Some(&v[5])),
        &c.inputs(false),
        true,
    );
    let c = cell_case(2, 3, 2, 3, 6);
    check_grads(
        &|v| ops::gru_cell(&v[0], &v[1], &v[2], &v[3], Some(&v[4]), Some(&v[5])),
        &c.inputs(false),
        true,
    );
    let c = cell_case(2, 3, 2, 4, 7);
    check_grads(
        &|v| {
            let (h, cy) = ops::lstm_cell(
                &v[0],
                (&v[1], &v[2]),
                &v[3],
                &v[4],
                Some(&v[5]),
                Some(&v[6]),
            )?;
            ops::cat(&[h, cy], 0)
        },
        &c.inputs(true),
        true,
    );
}

proptest! {
    #![proptest_config(amp_testing::proptest_config(16))]
    #[test]
    fn gru_and_lstm_gradients_on_random_shapes(
        n in 1usize..3, input in 1usize..4, hidden in 1usize..3, seed in 0u64..1000
    ) {
        let c = cell_case(n, input, hidden, 3, seed);
        check_grads(
            &|v| ops::gru_cell(&v[0], &v[1], &v[2], &v[3], Some(&v[4]), Some(&v[5])),
            &c.inputs(false),
            false);
        let c = cell_case(n, input, hidden, 4, seed + 1);
        check_grads(
            &|v| Ok(ops::lstm_cell(&v[0], (&v[1], &v[2]), &v[3], &v[4], Some(&v[5]), Some(&v[6]))?.1),
            &c.inputs(true),
            false);
    }
}

// ----- losses ----------------------------------------------------------------------------

fn probs(n: usize, c: usize, seed: u64) -> Tensor {
    let mut g = Generator::new(seed);
    let x = Tensor::randn([n, c], DType::F64, &mut g).unwrap();
    let p = ops::softmax(&x, 1, None).unwrap().detach();
    p.requires_grad_(true).unwrap();
    p
}

#[test]
fn kl_div_values_and_gradients() {
    let mut g = Generator::new(20);
    let x = ops::log_softmax(&randn_leaf(&[3, 4], &mut g), 1, None)
        .unwrap()
        .detach();
    x.requires_grad_(true).unwrap();
    let t = probs(3, 4, 21);
    let (xv, tv) = (vals(&x), vals(&t));
    let pointwise: Vec<f64> = xv.iter().zip(&tv).map(|(x, t)| t * (t.ln() - x)).collect();
    let total: f64 = pointwise.iter().sum();
    let got = ops::kl_div(&x, &t, KlDivReduction::BatchMean, false).unwrap();
    assert_near(&vals(&got), &[total / 3.0], 1e-12, "kl_div batchmean");
    let got = ops::kl_div(&x, &t, KlDivReduction::Mean, false).unwrap();
    assert_near(&vals(&got), &[total / 12.0], 1e-12, "kl_div mean");
    let lt = ops::log(&t).unwrap();
    let got = ops::kl_div(&x, &lt, KlDivReduction::None, true).unwrap();
    assert_near(&vals(&got), &pointwise, 1e-12, "kl_div log_target");
    // A zero target contributes 0, not NaN.
    let z = Tensor::from_vec(vec![0.0f64, 1.0], [2]).unwrap();
    let xz = Tensor::from_vec(vec![-1.0f64, -2.0], [2]).unwrap();
    let got = ops::kl_div(&xz, &z, KlDivReduction::None, false).unwrap();
    assert_near(&vals(&got), &[0.0, 2.0], 1e-12, "kl_div zero target");
    check_grads(
        &|v| ops::kl_div(&v[0], &v[1], KlDivReduction::BatchMean, false),
        &[x, t],
        true,
    );
}

#[test]
fn pointwise_losses_match_references() {
    let mut g = Generator::new(30);
    let x = randn_leaf(&[3, 4], &mut g);
    let xv = vals(&x);
    let sign: Vec<f64> = (0..12)
        .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    let y = Tensor::from_vec(sign.clone(), [3, 4]).unwrap();
    let counts: Vec<f64> = (0..12).map(|i| (i % 4) as f64).collect();
    let cnt = Tensor::from_vec(counts.clone(), [3, 4]).unwrap();

    // poisson_nll_loss, log_input and full
    let want: Vec<f64> = xv
        .iter()
        .zip(&counts)
        .map(|(x, t)| x.exp() - t * x)
        .collect();
    let got = ops::poisson_nll_loss(&x, &cnt, true, false, 1e-8, Reduction::None).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "poisson_nll_loss");
    let full: Vec<f64> = want
        .iter()
        .zip(&counts)
        .map(|(l, &t)| {
            if t > 1.0 {
                l + t * t.ln() - t + 0.5 * (2.0 * std::f64::consts::PI * t).ln()
            } else {
                *l
            }
        })
        .collect();
    let got = ops::poisson_nll_loss(&x, &cnt, true, true, 1e-8, Reduction::None).unwrap();
    assert_near(&vals(&got), &full, 1e-12, "poisson_nll_loss full");
    let pos = ops::exp(&x).unwrap();
    let pv = vals(&pos);
    let want: Vec<f64> = pv
        .iter()
        .zip(&counts)
        .map(|(x, t)| x - t * (x + 1e-8).ln())
        .collect();
    let got = ops::poisson_nll_loss(&pos, &cnt, false, false, 1e-8, Reduction::None).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "poisson_nll_loss rate input");

    // hinge_embedding_loss
    let want: Vec<f64> = xv
        .iter()
        .zip(&sign)
        .map(|(x, &t)| if t == 1.0 { *x } else { (1.5 - x).max(0.0) })
        .collect();
    let got = ops::hinge_embedding_loss(&x, &y, 1.5, Reduction::None).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "hinge_embedding_loss");

    // soft_margin_loss
    let want: f64 = xv
        .iter()
        .zip(&sign)
        .map(|(x, t)| (1.0 + (-t * x).exp()).ln())
        .sum::<f64>()
        / 12.0;
    let got = ops::soft_margin_loss(&x, &y, Reduction::Mean).unwrap();
    assert_near(&vals(&got), &[want], 1e-12, "soft_margin_loss");

    // margin_ranking_loss
    let a = randn_leaf(&[5], &mut g);
    let b = randn_leaf(&[5], &mut g);
    let t = Tensor::from_vec(vec![1.0f64, -1.0, 1.0, -1.0, 1.0], [5]).unwrap();
    let want: f64 = vals(&a)
        .iter()
        .zip(vals(&b))
        .zip(vals(&t))
        .map(|((a, b), t)| (-t * (a - b) + 0.1).max(0.0))
        .sum();
    let got = ops::margin_ranking_loss(&a, &b, &t, 0.1, Reduction::Sum).unwrap();
    assert_near(&vals(&got), &[want], 1e-12, "margin_ranking_loss");

    check_grads(
        &|v| ops::poisson_nll_loss(&v[0], &cnt, true, true, 1e-8, Reduction::Mean),
        std::slice::from_ref(&x),
        true,
    );
    check_grads(
        &|v| ops::soft_margin_loss(&v[0], &y, Reduction::Mean),
        std::slice::from_ref(&x),
        true,
    );
    check_grads(
        &|v| ops::margin_ranking_loss(&v[0], &v[1], &t, 0.1, Reduction::Mean),
        &[a, b],
        false,
    );
}

/// soft_margin_loss's second derivative in `x` is PyTorch's closed form
/// `t² z / ((1 + z)(1 + z))`, `z = exp(-x t)`: 0 once `(1 + z)²` overflows (`x t = -400`
/// here), where autograd of `log1p(exp(v))` left a term of about `t²`; and it still
/// matches the closed form where nothing overflows.
#[test]
fn soft_margin_second_derivative_is_the_closed_form() {
    let x = leaf(vec![-10.0, 0.3], &[2]);
    let t = Tensor::from_vec(vec![40.0f64, -1.5], [2]).unwrap();
    let l = ops::soft_margin_loss(&x, &t, Reduction::Sum).unwrap();
    let opts = GradOptions {
        create_graph: true,
        ..Default::default()
    };
    let g1 = grad(&[l], std::slice::from_ref(&x), &[None], opts).unwrap()[0]
        .clone()
        .unwrap();
    let g2 = grad(
        &[ops::sum(&g1, &[], false, None).unwrap()],
        std::slice::from_ref(&x),
        &[None],
        GradOptions::default(),
    )
    .unwrap()[0]
        .clone()
        .unwrap();
    let g2 = vals(&g2);
    assert_eq!(g2[0], 0.0, "{g2:?}");
    let z = (0.3f64 * 1.5).exp();
    assert_near(
        &g2[1..],
        &[1.5 * 1.5 * z / ((1.0 + z) * (1.0 + z))],
        1e-15,
        "x t = -0.45",
    );
}

#[test]
fn margin_losses_match_loops() {
    let mut g = Generator::new(40);
    let x = randn_leaf(&[2, 4], &mut g);
    let xv = vals(&x);
    // multilabel: sample 0 targets {3, 0}, sample 1 targets {1, 2, 3}
    let tgt = Tensor::from_vec(vec![3i64, 0, -1, 1, 1, 2, 3, -1], [2, 4]).unwrap();
    let sets: [&[usize]; 2] = [&[3, 0], &[1, 2, 3]];
    let mut want = [0.0; 2];
    for (s, set) in sets.iter().enumerate() {
        for &j in *set {
            for i in 0..4 {
                if !set.contains(&i) {
                    want[s] += (1.0 - (xv[s * 4 + j] - xv[s * 4 + i])).max(0.0);
                }
            }
        }
        want[s] /= 4.0;
    }
    let got = ops::multilabel_margin_loss(&x, &tgt, Reduction::None).unwrap();
    assert_near(&vals(&got), &want, 1e-12, "multilabel_margin_loss");
    let (_, is_t) = ops::multilabel_margin_loss_forward(&x, &tgt, Reduction::Mean).unwrap();
    assert_eq!(vals(&is_t), [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
    check_grads(
        &|v| ops::multilabel_margin_loss(&v[0], &tgt, Reduction::Mean),
        std::slice::from_ref(&x),
        false,
    );

    // multi_margin, p = 1 and 2, with weights
    let x = randn_leaf(&[3, 4], &mut g);
    let xv = vals(&x);
    let y = [1usize, 3, 0];
    let yt = Tensor::from_vec(y.iter().map(|&v| v as i64).collect::<Vec<_>>(), [3]).unwrap();
    let w = Tensor::from_vec(vec![0.5f64, 1.0, 2.0, 1.5], [4]).unwrap();
    let wv = vals(&w);
    for p in [1i64, 2] {
        let mut total = 0.0;
        for s in 0..3 {
            let mut l = 0.0;
            for i in 0..4 {
                if i != y[s] {
                    let z: f64 = 0.7 - xv[s * 4 + y[s]] + xv[s * 4 + i];
                    if z > 0.0 {
                        l += z.powi(p as i32) * wv[y[s]];
                    }
                }
            }
            total += l / 4.0;
        }
        let got = ops::multi_margin_loss(&x, &yt, p, 0.7, Some(&w), Reduction::Mean).unwrap();
        assert_near(&vals(&got), &[total / 3.0], 1e-12, "multi_margin_loss");
        check_grads(
            &|v| ops::multi_margin_loss(&v[0], &yt, p, 0.7, Some(&w), Reduction::Sum),
            std::slice::from_ref(&x),
            false,
        );
    }
    assert!(ops::multi_margin_loss(&x, &yt, 3, 1.0, None, Reduction::Mean).is_err());
}

#[test]
fn embedding_losses_match_references() {
    let mut g = Generator::new(50);
    let a = randn_leaf(&[3, 4], &mut g);
    let b = randn_leaf(&[3, 4], &mut g);
    let n = randn_leaf(&[3, 4], &mut g);
    let t = Tensor::from_vec(vec![1.0f64, -1.0, -1.0], [3]).unwrap();
    let (av, bv, nv) = (vals(&a), vals(&b), vals(&n));
    let mut want = 0.0;
    for r in 0..3 {
        let (mut d, mut na, mut nb) = (0.0, 1e-12, 1e-12);
        for k in 0..4 {
            d += av[r * 4 + k] * bv[r * 4 + k];
            na += av[r * 4 + k] * av[r * 4 + k];
            nb += bv[r * 4 + k] * bv[r * 4 + k];
        }
        let cos = d / (na * nb).sqrt();
        want += if r == 0 {
            1.0 - cos
        } else {
            (cos - 0.1f64).max(0.0)
        };
    }
    let got = ops::cosine_embedding_loss(&a, &b, &t, 0.1, Reduction::Sum).unwrap();
    assert_near(&vals(&got), &[want], 1e-12, "cosine_embedding_loss");
    check_grads(
        &|v| ops::cosine_embedding_loss(&v[0], &v[1], &t, -0.5, Reduction::Mean),
        &[a.clone(), b.clone()],
        true,
    );

    let dist = |x: &[f64], y: &[f64], r: usize| -> f64 {
        (0..4)
            .map(|k| (x[r * 4 + k] - y[r * 4 + k] + 1e-6).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    for swap in [false, true] {
        let mut want = 0.0;
        for r in 0..3 {
            let mut dn = dist(&av, &nv, r);
            if swap {
                dn = dn.min(dist(&bv, &nv, r));
            }
            want += (2.0 + dist(&av, &bv, r) - dn).max(0.0);
        }
        let got =
            ops::triplet_margin_loss(&a, &b, &n, 2.0, 2.0, 1e-6, swap, Reduction::Mean).unwrap();
        assert_near(&vals(&got), &[want / 3.0], 1e-12, "triplet_margin_loss");
    }
    check_grads(
        &|v| ops::triplet_margin_loss(&v[0], &v[1], &v[2], 2.0, 2.0, 1e-6, false, Reduction::Mean),
        &[a, b, n],
        true,
    );
}

/// Brute-force CTC: the probability of every alignment of length `t` that collapses to
/// `target`.
fn ctc_brute(lp: &[f64], t: usize, c: usize, target: &[usize], blank: usize) -> f64 {
    let mut total = 0.0;
    let count = c.pow(t as u32);
    for code in 0..count {
        let mut path = Vec::with_capacity(t);
        let mut rem = code;
        for _ in 0..t {
            path.push(rem % c);
            rem /= c;
        }
        let mut collapsed = Vec::new();
        let mut prev = None;
        for &s in &path {
            if Some(s) != prev && s != blank {
                collapsed.push(s);
            }
            prev = Some(s);
        }
        if collapsed == target {
            total += path
                .iter()
                .enumerate()
                .map(|(i, &s)| lp[i * c + s])
                .sum::<f64>()
                .exp();
        }
    }
    -total.ln()
}

#[test]
fn ctc_loss_matches_brute_force() {
    let mut g = Generator::new(60);
    let (t, n, c) = (4usize, 2usize, 3usize);
    let logits = randn_leaf(&[t, n, c], &mut g);
    let lp = ops::log_softmax(&logits, 2, None).unwrap();
    let targets = Tensor::from_vec(vec![1i64, 2, 1, 1], [2, 2]).unwrap();
    let (il, tl) = ([4usize, 3], [2usize, 2]);
    let got = ops::ctc_loss(&lp, &targets, &il, &tl, 0, Reduction::None, false).unwrap();
    let lv = vals(&lp);
    let sample = |s: usize, len: usize| -> Vec<f64> {
        (0..len)
            .flat_map(|ti| (0..c).map(move |k| (ti, k)))
            .map(|(ti, k)| lv[ti * n * c + s * c + k])
            .collect()
    };
    let want = [
        ctc_brute(&sample(0, 4), 4, c, &[1, 2], 0),
        ctc_brute(&sample(1, 3), 3, c, &[1, 1], 0),
    ];
    assert_near(&vals(&got), &want, 1e-10, "ctc_loss");
    // Through log_softmax the gradient is the exact one.
    check_grads(
        &|v| {
            let lp = ops::log_softmax(&v[0], 2, None)?;
            ops::ctc_loss(&lp, &targets, &il, &tl, 0, Reduction::Mean, false)
        },
        &[logits],
        false,
    );
    // Concatenated targets give the same losses; an impossible alignment is inf (or 0).
    let flat = Tensor::from_vec(vec![1i64, 2, 1, 1], [4]).unwrap();
    let got2 = ops::ctc_loss(&lp, &flat, &il, &tl, 0, Reduction::None, false).unwrap();
    assert_near(&vals(&got2), &want, 1e-10, "ctc_loss concatenated");
    let got3 = ops::ctc_loss(&lp, &flat, &[4, 2], &tl, 0, Reduction::None, true).unwrap();
    assert_eq!(vals(&got3)[1], 0.0);
}

// ----- norms, distances, others -----------------------------------------------------------

#[test]
fn distances_match_references() {
    let mut g = Generator::new(70);
    let a = randn_leaf(&[3, 4], &mut g);
    let b = randn_leaf(&[2, 4], &mut g);
    let (av, bv) = (vals(&a), vals(&b));
    let pn = |x: &[f64], p: f64| -> f64 {
        if p.is_infinite() {
            x.iter().fold(0.0f64, |m, v| m.max(v.abs()))
        } else {
            x.iter().map(|v| v.abs().powf(p)).sum::<f64>().powf(1.0 / p)
        }
    };
    for p in [1.0, 2.0, 3.0, f64::INFINITY] {
        let mut want = Vec::new();
        for i in 0..3 {
            for j in 0..2 {
                let d: Vec<f64> = (0..4).map(|k| av[i * 4 + k] - bv[j * 4 + k]).collect();
                want.push(pn(&d, p));
            }
        }
        for mode in [CdistMode::MmIfNecessary, CdistMode::Mm, CdistMode::Direct] {
            if mode == CdistMode::Mm && p != 2.0 {
                continue;
            }
            let got = ops::cdist(&a, &b, p, mode).unwrap();
            assert_near(&vals(&got), &want, 1e-10, "cdist");
        }
    }
    check_grads(
        &|v| ops::cdist(&v[0], &v[1], 2.0, CdistMode::Direct),
        &[a.clone(), b.clone()],
        true,
    );
    check_grads(
        &|v| ops::cdist(&v[0], &v[1], 2.0, CdistMode::Mm),
        &[a.clone(), b.clone()],
        true,
    );
    // pdist: rows (0,1), (0,2), (1,2)
    let want: Vec<f64> = [(0, 1), (0, 2), (1, 2)]
        .iter()
        .map(|&(i, j)| {
            pn(
                &(0..4)
                    .map(|k| av[i * 4 + k] - av[j * 4 + k])
                    .collect::<Vec<_>>(),
                2.0,
            )
        })
        .collect();
    assert_near(&vals(&ops::pdist(&a, 2.0).unwrap()), &want, 1e-12, "pdist");
    check_grads(&|v| ops::pdist(&v[0], 2.0), std::slice::from_ref(&a), true);
    // dist
    let c = randn_leaf(&[3, 4], &mut g);
    let d: Vec<f64> = av.iter().zip(vals(&c)).map(|(x, y)| x - y).collect();
    assert_near(
        &vals(&ops::dist(&a, &c, 3.0).unwrap()),
        &[pn(&d, 3.0)],
        1e-12,
        "dist",
    );
    check_grads(
        &|v| ops::dist(&v[0], &v[1], 2.0),
        &[a.clone(), c.clone()],
        true,
    );
    // cosine_similarity and normalize along dim 1
    let cv = vals(&c);
    let want: Vec<f64> = (0..3)
        .map(|r| {
            let x = &av[r * 4..r * 4 + 4];
            let y = &cv[r * 4..r * 4 + 4];
            let dot: f64 = x.iter().zip(y).map(|(a, b)| a * b).sum();
            dot / (pn(x, 2.0) * pn(y, 2.0))
        })
        .collect();
    assert_near(
        &vals(&ops::cosine_similarity(&a, &c, 1, 1e-8).unwrap()),
        &want,
        1e-12,
        "cosine_similarity",
    );
    check_grads(
        &|v| ops::cosine_similarity(&v[0], &v[1], 1, 1e-8),
        &[a.clone(), c],
        true,
    );
    let want: Vec<f64> = (0..12)
        .map(|i| av[i] / pn(&av[(i / 4) * 4..(i / 4) * 4 + 4], 2.0))
        .collect();
    assert_near(
        &vals(&ops::normalize(&a, 2.0, 1, 1e-12).unwrap()),
        &want,
        1e-12,
        "normalize",
    );
    check_grads(
        &|v| ops::normalize(&v[0], 3.0, 1, 1e-12),
        std::slice::from_ref(&a),
        true,
    );
    // renorm along dim 0: rows with norm above 1.5 scaled to 1.5
    let want: Vec<f64> = (0..12)
        .map(|i| {
            let n = pn(&av[(i / 4) * 4..(i / 4) * 4 + 4], 2.0);
            if n > 1.5 {
                av[i] * 1.5 / (n + 1e-7)
            } else {
                av[i]
            }
        })
        .collect();
    assert_near(
        &vals(&ops::renorm(&a, 2.0, 0, 1.5).unwrap()),
        &want,
        1e-12,
        "renorm",
    );
    check_grads(
        &|v| ops::renorm(&v[0], 2.0, 0, 1.5),
        std::slice::from_ref(&a),
        true,
    );
}

#[test]
fn prelu_bilinear_group_norm_match_references() {
    let mut g = Generator::new(80);
    let x = randn_leaf(&[2, 3, 4], &mut g);
    let w = leaf(vec![0.25, -0.5, 2.0], &[3]);
    let (xv, wv) = (vals(&x), vals(&w));
    let want: Vec<f64> = (0..24)
        .map(|i| {
            if xv[i] > 0.0 {
                xv[i]
            } else {
                wv[(i / 4) % 3] * xv[i]
            }
        })
        .collect();
    assert_near(&vals(&ops::prelu(&x, &w).unwrap()), &want, 1e-15, "prelu");
    check_grads(&|v| ops::prelu(&v[0], &v[1]), &[x.clone(), w], true);

    let x1 = randn_leaf(&[2, 3], &mut g);
    let x2 = randn_leaf(&[2, 4], &mut g);
    let bw = randn_leaf(&[5, 3, 4], &mut g);
    let bb = randn_leaf(&[5], &mut g);
    let (v1, v2, vw, vb) = (vals(&x1), vals(&x2), vals(&bw), vals(&bb));
    let mut want = vec![0.0; 10];
    for n in 0..2 {
        for o in 0..5 {
            let mut s = vb[o];
            for i in 0..3 {
                for j in 0..4 {
                    s += v1[n * 3 + i] * vw[o * 12 + i * 4 + j] * v2[n * 4 + j];
                }
            }
            want[n * 5 + o] = s;
        }
    }
    assert_near(
        &vals(&ops::bilinear(&x1, &x2, &bw, Some(&bb)).unwrap()),
        &want,
        1e-12,
        "bilinear",
    );
    check_grads(
        &|v| ops::bilinear(&v[0], &v[1], &v[2], Some(&v[3])),
        &[x1, x2, bw, bb],
        true,
    );

    let gw = randn_leaf(&[4], &mut g);
    let gb = randn_leaf(&[4], &mut g);
    let x = randn_leaf(&[2, 4, 3], &mut g);
    let (xv, gwv, gbv) = (vals(&x), vals(&gw), vals(&gb));
    let mut want = vec![0.0; 24];
    for n in 0..2 {
        for grp in 0..2 {
            let idx: Vec<usize> = (0..6).map(|k| n * 12 + grp * 6 + k).collect();
            let m: f64 = idx.iter().map(|&i| xv[i]).sum::<f64>() / 6.0;
            let var: f64 = idx.iter().map(|&i| (xv[i] - m).powi(2)).sum::<f64>() / 6.0;
            for &i in &idx {
                let ch = (i / 3) % 4;
                want[i] = (xv[i] - m) / (var + 1e-5).sqrt() * gwv[ch] + gbv[ch];
            }
        }
    }
    assert_near(
        &vals(&ops::group_norm(&x, 2, Some(&gw), Some(&gb), 1e-5).unwrap()),
        &want,
        1e-10,
        "group_norm",
    );
    check_grads(
        &|v| ops::group_norm(&v[0], 2, Some(&v[1]), Some(&v[2]), 1e-5),
        &[x, gw, gb],
        true,
    );
}

#[test]
fn cross_index_put_tensordot_match_references() {
    let mut g = Generator::new(90);
    let a = randn_leaf(&[2, 3], &mut g);
    let b = randn_leaf(&[2, 3], &mut g);
    let (av, bv) = (vals(&a), vals(&b));
    let mut want = vec![0.0; 6];
    for r in 0..2 {
        let (x, y) = (&av[r * 3..r * 3 + 3], &bv[r * 3..r * 3 + 3]);
        want[r * 3] = x[1] * y[2] - x[2] * y[1];
        want[r * 3 + 1] = x[2] * y[0] - x[0] * y[2];
        want[r * 3 + 2] = x[0] * y[1] - x[1] * y[0];
    }
    assert_near(
        &vals(&ops::cross(&a, &b, 1).unwrap()),
        &want,
        1e-15,
        "cross",
    );
    assert_near(
        &vals(&ops::cross_default(&a, &b, None).unwrap()),
        &want,
        1e-15,
        "cross default dim",
    );
    check_grads(&|v| ops::cross(&v[0], &v[1], -1), &[a, b], true);

    let x = randn_leaf(&[5, 3], &mut g);
    let v = randn_leaf(&[2, 3], &mut g);
    let idx = Tensor::from_vec(vec![4i64, -4], [2]).unwrap();
    let (xv, vv) = (vals(&x), vals(&v));
    let mut want = xv.clone();
    let mut acc = xv.clone();
    for (r, row) in [4usize, 1].iter().enumerate() {
        for k in 0..3 {
            want[row * 3 + k] = vv[r * 3 + k];
            acc[row * 3 + k] += vv[r * 3 + k];
        }
    }
    let idxs = [idx.clone()];
    assert_near(
        &vals(&ops::index_put(&x, &idxs, &v, false).unwrap()),
        &want,
        0.0,
        "index_put",
    );
    assert_near(
        &vals(&ops::index_put(&x, &idxs, &v, true).unwrap()),
        &acc,
        1e-15,
        "index_put acc",
    );
    // Two index tensors pick elements; a bool mask picks rows.
    let rows = Tensor::from_vec(vec![0i64, 2], [2]).unwrap();
    let cols = Tensor::from_vec(vec![1i64, 0], [2]).unwrap();
    let pts = Tensor::from_vec(vec![10.0f64, 20.0], [2]).unwrap();
    let got = vals(&ops::index_put(&x, &[rows, cols], &pts, false).unwrap());
    assert_eq!((got[1], got[6]), (10.0, 20.0));
    let mask = Tensor::from_vec(vec![true, false, false, true, false], [5]).unwrap();
    let got = vals(&ops::index_put(&x, &[mask], &Tensor::scalar(7.0f64), false).unwrap());
    assert_eq!(&got[0..3], &[7.0, 7.0, 7.0]);
    assert_eq!(&got[9..12], &[7.0, 7.0, 7.0]);
    assert!(ops::index_put(&x, &[Tensor::from_vec(vec![5i64], [1]).unwrap()], &v, false).is_err());
    check_grads(
        &|t| ops::index_put(&t[0], &idxs, &t[1], false),
        &[x.clone(), v.clone()],
        false,
    );
    check_grads(
        &|t| ops::index_put(&t[0], &idxs, &t[1], true),
        &[x, v],
        false,
    );

    let a = randn_leaf(&[2, 3, 4], &mut g);
    let b = randn_leaf(&[3, 4, 5], &mut g);
    let (av, bv) = (vals(&a), vals(&b));
    let mut want = vec![0.0; 10];
    for i in 0..2 {
        for l in 0..5 {
            for j in 0..3 {
                for k in 0..4 {
                    want[i * 5 + l] += av[i * 12 + j * 4 + k] * bv[j * 20 + k * 5 + l];
                }
            }
        }
    }
    assert_near(
        &vals(&ops::tensordot(&a, &b, &TensordotDims::Count(2)).unwrap()),
        &want,
        1e-12,
        "tensordot",
    );
    let pairs = TensordotDims::Pairs(vec![1, 2], vec![0, 1]);
    assert_near(
        &vals(&ops::tensordot(&a, &b, &pairs).unwrap()),
        &want,
        1e-12,
        "tensordot pairs",
    );
    check_grads(&|v| ops::tensordot(&v[0], &v[1], &pairs), &[a, b], true);
}

/// Every op in every float dtype (16-bit ones refused where PyTorch's CPU kernel has no
/// 16-bit instantiation): the output keeps the input dtype (the losses and
/// distances computed in float32 for 16-bit inputs, rounded once) and agrees with the
/// float64 result to the dtype's precision; gradients come back in the input dtype.
#[test]
fn every_float_dtype() {
    type Op = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;
    let mut g = Generator::new(100);
    let a = randn_leaf(&[3, 4], &mut g);
    let b = randn_leaf(&[3, 4], &mut g);
    let p = probs(3, 4, 101);
    let sign = Tensor::from_vec(vec![1.0f64, -1.0, 1.0], [3]).unwrap();
    let cls = Tensor::from_vec(vec![1i64, 0, 3], [3]).unwrap();
    let cases: Vec<(&str, Vec<Tensor>, Op)> = vec![
        (
            "kl_div",
            vec![a.clone(), p.clone()],
            Box::new(|v| ops::kl_div(&v[0], &v[1], KlDivReduction::BatchMean, false)),
        ),
        (
            "soft_margin",
            vec![a.clone(), ops::sign(&b).unwrap()],
            Box::new(|v| ops::soft_margin_loss(&v[0], &v[1], Reduction::Mean)),
        ),
        (
            "multi_margin",
            vec![a.clone()],
            Box::new(move |v| ops::multi_margin_loss(&v[0], &cls, 2, 1.0, None, Reduction::Mean)),
        ),
        (
            "cosine_embedding",
            vec![a.clone(), b.clone()],
            Box::new(move |v| {
                ops::cosine_embedding_loss(
                    &v[0],
                    &v[1],
                    &sign.to_dtype(v[0].dtype())?,
                    0.0,
                    Reduction::Mean,
                )
            }),
        ),
        (
            "cdist",
            vec![a.clone(), b.clone()],
            Box::new(|v| ops::cdist(&v[0], &v[1], 2.0, CdistMode::Direct)),
        ),
        (
            "pdist",
            vec![a.clone()],
            Box::new(|v| ops::pdist(&v[0], 2.0)),
        ),
        (
            "cosine_similarity",
            vec![a.clone(), b.clone()],
            Box::new(|v| ops::cosine_similarity(&v[0], &v[1], 1, 1e-8)),
        ),
        (
            "renorm",
            vec![a.clone()],
            Box::new(|v| ops::renorm(&v[0], 2.0, 0, 1.0)),
        ),
        (
            "group_norm",
            vec![ops::reshape(&a, [1, 4, 3]).unwrap()],
            Box::new(|v| ops::group_norm(&v[0], 2, None, None, 1e-5)),
        ),
        (
            "prelu",
            vec![a.clone(), Tensor::from_vec(vec![0.25f64], [1]).unwrap()],
            Box::new(|v| ops::prelu(&v[0], &v[1])),
        ),
        (
            "cross",
            vec![
                ops::narrow(&a, 1, 0, 3).unwrap(),
                ops::narrow(&b, 1, 0, 3).unwrap(),
            ],
            Box::new(|v| ops::cross(&v[0], &v[1], 1)),
        ),
        (
            "rnn_cell",
            vec![
                a.clone(),
                ops::narrow(&b, 1, 0, 3).unwrap(),
                randn_leaf(&[3, 4], &mut g),
                randn_leaf(&[3, 3], &mut g),
            ],
            Box::new(|v| ops::rnn_tanh_cell(&v[0], &v[1], &v[2], &v[3], None, None)),
        ),
    ];
    // PyTorch's CPU kernels of these ops have no 16-bit instantiation: they refuse.
    let float32_or_64 = ["multi_margin", "cdist", "pdist"];
    for (name, inputs, f) in &cases {
        let want = vals(&f(inputs).unwrap());
        for (dt, tol) in [(DType::F32, 1e-5), (DType::BF16, 4e-2), (DType::F16, 5e-3)] {
            let xs: Vec<Tensor> = inputs
                .iter()
                .map(|t| {
                    let c = t.detach().to_dtype(dt).unwrap();
                    c.requires_grad_(true).unwrap();
                    c
                })
                .collect();
            if dt.is_reduced_float() && float32_or_64.contains(name) {
                let e = f(&xs).unwrap_err().to_string();
                assert!(e.contains("not implemented for"), "{name} {dt}: {e}");
                continue;
            }
            let y = f(&xs).unwrap();
            assert_eq!(y.dtype(), dt, "{name} {dt}");
            assert_near(&vals(&y), &want, tol, &format!("{name} {dt}"));
            ops::sum_all(&y).unwrap().backward().unwrap();
            assert_eq!(xs[0].grad().unwrap().dtype(), dt, "{name} {dt} grad");
        }
    }
}

/// (channel, value) of each element of the batch-norm test input `[2, 2, 2]`.
const X_BY_CHANNEL: [(usize, f64); 8] = [
    (0, 1.0),
    (0, 2.0),
    (1, 0.0),
    (1, 0.0),
    (0, 3.0),
    (0, 6.0),
    (1, 4.0),
    (1, 4.0),
];

/// `batch_norm`'s running statistics (PyTorch's update: momentum, unbiased variance),
/// evaluation with them, 16-bit inputs normalised in float32 and cast back, and the
/// refusals PyTorch makes.
#[test]
fn batch_norm_running_statistics_eval_and_refusals() {
    // Two channels of [N=2, C=2, L=2]: channel 0 holds 1, 2, 3, 6; channel 1 holds 0, 0, 4, 4.
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 0.0, 0.0, 3.0, 6.0, 4.0, 4.0], [2, 2, 2]).unwrap();
    let rm = Tensor::from_vec(vec![1.0f64, -1.0], [2]).unwrap();
    let rv = Tensor::from_vec(vec![2.0f64, 0.5], [2]).unwrap();
    let y = ops::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.25, 1e-5).unwrap();
    // Batch means 3 and 2; biased variances 3.5 and 4; unbiased 14/3 and 16/3.
    let m = [3.0f64, 2.0];
    let v = [3.5f64, 4.0];
    let want: Vec<f64> = X_BY_CHANNEL
        .iter()
        .map(|&(c, x): &(usize, f64)| (x - m[c]) / (v[c] + 1e-5).sqrt())
        .collect();
    assert_near(&vals(&y), &want, 1e-12, "training output");
    assert_near(
        &vals(&rm),
        &[0.75 * 1.0 + 0.25 * 3.0, -0.75 + 0.25 * 2.0],
        1e-12,
        "running_mean",
    );
    assert_near(
        &vals(&rv),
        &[
            0.75 * 2.0 + 0.25 * 14.0 / 3.0,
            0.75 * 0.5 + 0.25 * 16.0 / 3.0,
        ],
        1e-12,
        "running_var",
    );
    // Evaluation: the running statistics, which do not change.
    let (w, b) = (leaf(vec![2.0, 3.0], &[2]), leaf(vec![0.5, -0.5], &[2]));
    let (rm0, rv0) = (vals(&rm), vals(&rv));
    let y = ops::batch_norm(
        &x,
        Some(&rm),
        Some(&rv),
        Some(&w),
        Some(&b),
        false,
        0.25,
        1e-5,
    )
    .unwrap();
    let want: Vec<f64> = X_BY_CHANNEL
        .iter()
        .map(|&(c, x): &(usize, f64)| {
            (x - rm0[c]) / (rv0[c] + 1e-5).sqrt() * [2.0, 3.0][c] + [0.5, -0.5][c]
        })
        .collect();
    assert_near(&vals(&y), &want, 1e-12, "eval output");
    assert_eq!(
        (vals(&rm), vals(&rv)),
        (rm0, rv0),
        "eval leaves the statistics alone"
    );
    // bfloat16 in, bfloat16 out, normalised in float32.
    let xb = x.to_dtype(DType::BF16).unwrap();
    let yb = ops::batch_norm(&xb, None, None, None, None, true, 0.1, 1e-5).unwrap();
    assert_eq!(yb.dtype(), DType::BF16);
    // PyTorch's refusals.
    let one = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [1, 3]).unwrap();
    let e = ops::batch_norm(&one, None, None, None, None, true, 0.1, 1e-5).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Expected more than 1 value per channel when training, got input size torch.Size([1, 3])"
    );
    assert!(ops::batch_norm(&x, None, None, None, None, false, 0.1, 1e-5).is_err());
    let short = Tensor::from_vec(vec![0.0f64], [1]).unwrap();
    assert!(ops::batch_norm(&x, Some(&short), None, None, None, true, 0.1, 1e-5).is_err());
}

/// Attention against a reference written here (plain loops, f64), with a boolean mask,
/// and the argument refusals.
#[test]
fn attention_matches_a_reference_and_refuses_bad_options() {
    let mut gen = Generator::new(7);
    let (l, s, e, ev) = (3, 4, 2, 3);
    let (q, k, v) = (
        randn_leaf(&[l, e], &mut gen),
        randn_leaf(&[s, e], &mut gen),
        randn_leaf(&[s, ev], &mut gen),
    );
    // Key 1 is hidden from query 0.
    let mask: Vec<bool> = (0..l * s).map(|i| i != 1).collect();
    let mask = Tensor::from_vec(mask, [l, s]).unwrap();
    let opts = ops::Attention {
        attn_mask: Some(&mask),
        scale: Some(0.7),
        ..Default::default()
    };
    let y = ops::scaled_dot_product_attention(&q, &k, &v, opts).unwrap();
    let (qv, kv, vv) = (vals(&q), vals(&k), vals(&v));
    let mut want = Vec::new();
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                if i == 0 && j == 1 {
                    f64::NEG_INFINITY
                } else {
                    0.7 * (0..e).map(|t| qv[i * e + t] * kv[j * e + t]).sum::<f64>()
                }
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for c in 0..ev {
            want.push((0..s).map(|j| w[j] / z * vv[j * ev + c]).sum::<f64>());
        }
    }
    assert_near(&vals(&y), &want, 1e-12, "attention");
    let both = ops::Attention {
        attn_mask: Some(&mask),
        is_causal: true,
        ..Default::default()
    };
    let e = ops::scaled_dot_product_attention(&q, &k, &v, both).unwrap_err();
    assert!(
        e.to_string()
            .contains("attn_mask should not be set when is_causal=True"),
        "{e}"
    );
    let drop = ops::Attention {
        dropout_p: 0.5,
        ..Default::default()
    };
    assert!(ops::scaled_dot_product_attention(&q, &k, &v, drop).is_err());
    let mut gen = Generator::new(1);
    let flash_drop = ops::Attention {
        dropout_p: 0.5,
        generator: Some(&mut gen),
        backend: ops::SdpBackend::Flash,
        ..Default::default()
    };
    let e = ops::scaled_dot_product_attention(&q, &k, &v, flash_drop).unwrap_err();
    assert!(e.to_string().contains("No available kernel"), "{e}");
}

/// A query row whose keys are all masked (a boolean row of `false`, a float row of
/// `-inf`) gives zeros and no gradient on both paths, as PyTorch's attention does (its
/// `_safe_softmax`; `softmax` alone gives NaN there); the other rows are the attention
/// of their keys, and second derivatives stay finite. A NaN in a query still makes its
/// row NaN on both paths (the blocked loop's maximum used to skip NaN scores).
#[test]
fn attention_rows_with_every_key_masked_are_zero() {
    let mut gen = Generator::new(5);
    let (l, s, e, ev) = (4, 70, 3, 2);
    let (q, k, v) = (
        randn_leaf(&[2, l, e], &mut gen),
        randn_leaf(&[2, s, e], &mut gen),
        randn_leaf(&[2, s, ev], &mut gen),
    );
    // Row 1 sees no key; the others every key but those divisible by 3.
    let keep: Vec<bool> = (0..l * s).map(|i| i / s != 1 && (i % s) % 3 != 0).collect();
    let bias: Vec<f64> = keep
        .iter()
        .map(|&t| if t { 0.0 } else { f64::NEG_INFINITY })
        .collect();
    let keep = Tensor::from_vec(keep, [l, s]).unwrap();
    let bias = Tensor::from_vec(bias, [l, s]).unwrap();
    let run = |q: &Tensor, mask: &Tensor, backend| {
        let opts = ops::Attention {
            attn_mask: Some(mask),
            backend,
            ..Default::default()
        };
        ops::scaled_dot_product_attention(q, &k, &v, opts).unwrap()
    };
    let paths = [ops::SdpBackend::Math, ops::SdpBackend::Flash];
    let mut outs = Vec::new();
    for mask in [&keep, &bias] {
        for backend in paths {
            let what = format!("{:?} mask, {backend:?}", mask.dtype());
            let y = run(&q, mask, backend);
            let yv = vals(&y);
            for b in 0..2 {
                let row = &yv[(b * l + 1) * ev..(b * l + 2) * ev];
                assert!(row.iter().all(|&x| x == 0.0), "{what}: {row:?}");
            }
            // Row 0 against the attention of its visible keys alone.
            let (qv, kv, vv) = (vals(&q), vals(&k), vals(&v));
            let js: Vec<usize> = (0..s).filter(|j| j % 3 != 0).collect();
            let sc: Vec<f64> = js
                .iter()
                .map(|&j| (0..e).map(|t| qv[t] * kv[j * e + t]).sum::<f64>() / (e as f64).sqrt())
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            let want: Vec<f64> = (0..ev)
                .map(|c| {
                    js.iter()
                        .zip(&sc)
                        .map(|(&j, x)| (x - m).exp() / z * vv[j * ev + c])
                        .sum()
                })
                .collect();
            assert_near(&yv[..ev], &want, 1e-12, &what);
            let g = grad(
                &[ops::sum(&ops::mul(&y, &y).unwrap(), &[], false, None).unwrap()],
                &[q.clone(), k.clone(), v.clone()],
                &[None],
                GradOptions::default(),
            )
            .unwrap();
            let g: Vec<Vec<f64>> = g.iter().map(|t| vals(t.as_ref().unwrap())).collect();
            assert!(g.iter().flatten().all(|x| x.is_finite()), "{what}");
            for b in 0..2 {
                let dq_row = &g[0][(b * l + 1) * e..(b * l + 2) * e];
                assert!(dq_row.iter().all(|&x| x == 0.0), "{what}: {dq_row:?}");
            }
            outs.push((what, yv, g));
        }
    }
    for (what, y, g) in &outs[1..] {
        assert_near(y, &outs[0].1, 1e-12, what);
        for (a, b) in g.iter().zip(&outs[0].2) {
            assert_near(a, b, 1e-12, what);
        }
    }
    // Second derivatives through the dead row: finite, by the gradient checker.
    for backend in paths {
        let small = [
            randn_leaf(&[l, e], &mut gen),
            randn_leaf(&[5, e], &mut gen),
            randn_leaf(&[5, ev], &mut gen),
        ];
        let keep5: Vec<bool> = (0..l * 5).map(|i| i / 5 != 1 && i % 5 != 2).collect();
        let keep5 = Tensor::from_vec(keep5, [l, 5]).unwrap();
        let f5 = |x: &[Tensor]| -> Result<Tensor> {
            let opts = ops::Attention {
                attn_mask: Some(&keep5),
                backend,
                ..Default::default()
            };
            ops::scaled_dot_product_attention(&x[0], &x[1], &x[2], opts)
        };
        check_grads(&f5, &small, true);
    }
    // A NaN query: its row is NaN, the others are not, on both paths.
    let mut qn = vals(&q);
    qn[2 * e] = f64::NAN;
    let qn = Tensor::from_vec(qn, [2, l, e]).unwrap();
    for backend in paths {
        let y = vals(&run(&qn, &keep, backend));
        assert!(y[2 * ev..3 * ev].iter().all(|x| x.is_nan()), "{backend:?}");
        assert!(y[..ev].iter().all(|x| x.is_finite()), "{backend:?}");
    }
}

/// The block-at-a-time attention (the flash path: no dropout) against the same formula
/// written with the differentiable ops (matmul, softmax), forward and gradients, in
/// float64 and float32 (bfloat16: within its rounding): several key and query blocks
/// (L = 70, S = 130 against blocks of 32 queries and 64 keys), broadcast batch dims, a
/// boolean `[L, S]` mask, a batched float bias and the causal mask; and under
/// `create_graph` the gradients are differentiable again.
#[test]
fn blocked_attention_matches_the_composite_formula() {
    let mut gen = Generator::new(11);
    let (l, s, e, ev) = (70, 130, 8, 5);
    for dtype in [DType::F64, DType::F32, DType::BF16] {
        let mk = |dims: &[usize], gen: &mut Generator| {
            let t = randn_leaf(dims, gen).to_dtype(dtype).unwrap().detach();
            t.requires_grad_(true).unwrap();
            t
        };
        let (q, k, v) = (
            mk(&[2, 3, l, e], &mut gen),
            mk(&[1, 3, s, e], &mut gen),
            mk(&[2, 1, s, ev], &mut gen),
        );
        let keep: Vec<bool> = (0..l * s).map(|i| (i * 7919) % 5 != 0).collect();
        let keep = Tensor::from_vec(keep, [l, s]).unwrap();
        let bias = randn_leaf(&[2, 3, l, s], &mut gen)
            .to_dtype(dtype)
            .unwrap()
            .detach();
        let cases: [(Option<&Tensor>, bool); 4] = [
            (None, false),
            (Some(&keep), false),
            (Some(&bias), false),
            (None, true),
        ];
        for (mask, causal) in cases {
            let scale = 0.3;
            let opts = ops::Attention {
                attn_mask: mask,
                is_causal: causal,
                scale: Some(scale),
                backend: ops::SdpBackend::Flash,
                ..Default::default()
            };
            let y = ops::scaled_dot_product_attention(&q, &k, &v, opts).unwrap();
            assert_eq!(
                y.grad_fn_name(),
                Some("ScaledDotProductFlashAttentionForCpuBackward0")
            );
            // The reference, in float64 from the same (rounded) inputs.
            let [q64, k64, v64] = [&q, &k, &v].map(|t| {
                let t = t.to_dtype(DType::F64).unwrap().detach();
                t.requires_grad_(true).unwrap();
                t
            });
            let mut w = ops::mul_scalar(
                &ops::matmul(&q64, &ops::transpose(&k64, -2, -1).unwrap()).unwrap(),
                scale,
            )
            .unwrap();
            let ninf = Tensor::scalar(f64::NEG_INFINITY);
            if causal {
                let tril: Vec<bool> = (0..l).flat_map(|i| (0..s).map(move |j| j <= i)).collect();
                w = ops::where_(&Tensor::from_vec(tril, [l, s]).unwrap(), &w, &ninf).unwrap();
            }
            match mask {
                Some(m) if m.dtype() == DType::Bool => w = ops::where_(m, &w, &ninf).unwrap(),
                Some(m) => w = ops::add(&w, &m.to_dtype(DType::F64).unwrap()).unwrap(),
                None => {}
            }
            let want = ops::matmul(&ops::softmax(&w, -1, None).unwrap(), &v64).unwrap();
            let tol = match dtype {
                DType::F64 => 1e-12,
                DType::F32 => 2e-5,
                _ => 2e-2,
            };
            let what = format!(
                "{dtype:?} mask {:?} causal {causal}",
                mask.map(|m| m.dtype())
            );
            assert_near(&vals(&y), &vals(&want), tol, &format!("forward, {what}"));
            let g = randn_leaf(y.dims(), &mut gen)
                .to_dtype(dtype)
                .unwrap()
                .detach();
            let got = grad(
                std::slice::from_ref(&y),
                &[q.clone(), k.clone(), v.clone()],
                &[Some(g.clone())],
                GradOptions::default(),
            )
            .unwrap();
            let g64 = g.to_dtype(DType::F64).unwrap();
            let exp = grad(
                &[want],
                &[q64.clone(), k64.clone(), v64.clone()],
                &[Some(g64)],
                GradOptions::default(),
            )
            .unwrap();
            for (n, (a, b)) in got.iter().zip(&exp).enumerate() {
                let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
                assert_eq!(a.dims(), b.dims(), "gradient {n} shape, {what}");
                assert_eq!(a.dtype(), dtype, "gradient {n} dtype, {what}");
                let scale_tol = vals(b).iter().fold(1.0f64, |m, x| m.max(x.abs()));
                assert_near(
                    &vals(a),
                    &vals(b),
                    tol * scale_tol * 4.0,
                    &format!("gradient {n}, {what}"),
                );
            }
        }
    }
    // Double backward through the blocked path: d/dq of sum(dL/dq * c) exists and
    // matches the composite's.
    let (q, k, v) = (
        randn_leaf(&[1, 6, 4], &mut gen),
        randn_leaf(&[1, 9, 4], &mut gen),
        randn_leaf(&[1, 9, 3], &mut gen),
    );
    let y = ops::scaled_dot_product_attention(
        &q,
        &k,
        &v,
        ops::Attention {
            is_causal: true,
            backend: ops::SdpBackend::Flash,
            ..Default::default()
        },
    )
    .unwrap();
    let first = grad(
        &[ops::sum(&ops::mul(&y, &y).unwrap(), &[], false, None).unwrap()],
        std::slice::from_ref(&q),
        &[None],
        GradOptions {
            create_graph: true,
            ..Default::default()
        },
    )
    .unwrap();
    let second = grad(
        &[ops::sum(&first[0].clone().unwrap(), &[], false, None).unwrap()],
        std::slice::from_ref(&k),
        &[None],
        GradOptions::default(),
    )
    .unwrap();
    assert!(second[0]
        .as_ref()
        .unwrap()
        .to_vec_f64()
        .iter()
        .all(|x| x.is_finite()));
    assert!(second[0]
        .as_ref()
        .unwrap()
        .to_vec_f64()
        .iter()
        .any(|&x| x != 0.0));
}

/// GELU's one-pass backward (`amp_kernels::gelu_backward`, taken without
/// `create_graph`) against its formula in float64, per dtype; and the same gradient as
/// the differentiable formula that runs under `create_graph`.
#[test]
fn gelu_backward_in_one_pass_matches_the_formula() {
    let xs: Vec<f64> = (0..4001)
        .map(|i| -10.0 + i as f64 * 0.005)
        .chain([0.0, -0.0, 1e-30, 40.0, -40.0])
        .collect();
    let n = xs.len();
    let gs: Vec<f64> = (0..n)
        .map(|i| ((i * 7919) % 13) as f64 / 4.0 - 1.5)
        .collect();
    let exact = |g: f64, x: f64| {
        let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
        let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        g * (cdf + x * pdf)
    };
    for (dtype, tol) in [
        (DType::F64, 1e-14),
        (DType::F32, 4e-7),
        (DType::BF16, 8e-3),
        (DType::F16, 1e-3),
    ] {
        let x = Tensor::from_vec(xs.clone(), [n])
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .detach();
        x.requires_grad_(true).unwrap();
        let g = Tensor::from_vec(gs.clone(), [n])
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .detach();
        let y = ops::gelu(&x).unwrap();
        let one = grad(
            std::slice::from_ref(&y),
            std::slice::from_ref(&x),
            &[Some(g.clone())],
            GradOptions {
                retain_graph: Some(true),
                ..Default::default()
            },
        )
        .unwrap();
        let twice = grad(
            std::slice::from_ref(&y),
            std::slice::from_ref(&x),
            &[Some(g.clone())],
            GradOptions {
                create_graph: true,
                ..Default::default()
            },
        )
        .unwrap();
        let (one, twice) = (one[0].clone().unwrap(), twice[0].clone().unwrap());
        assert_eq!(one.dtype(), dtype);
        let (xr, gr) = (vals(&x), vals(&g));
        let want: Vec<f64> = xr.iter().zip(&gr).map(|(&x, &g)| exact(g, x)).collect();
        let got = vals(&one);
        for i in 0..n {
            let scale = gr[i].abs().max(1.0);
            assert!(
                (got[i] - want[i]).abs() <= tol * scale,
                "{dtype:?} x = {}: {} vs {}",
                xr[i],
                got[i],
                want[i]
            );
        }
        assert_near(
            &got,
            &vals(&twice),
            tol * 4.0,
            &format!("{dtype:?} one pass vs create_graph"),
        );
    }
}

/// `addcmul`, `addcdiv` and `addr` of a float32 (or bfloat16) input with float16
/// operands compute in their common dtype, float32, as PyTorch's TensorIterator does:
/// the float16 product or quotient is not rounded to float16 on the way (it was, by
/// 1e-4 relative, which float32's tolerance caught in PyTorch-computed variants). The
/// gradients come back in each argument's own dtype.
#[test]
fn pointwise_composites_of_mixed_dtypes_compute_in_the_common_dtype() {
    let mut g = Generator::new(11);
    let input = Tensor::randn([3, 4], DType::BF16, &mut g).unwrap();
    let t1 = Tensor::randn([3, 4], DType::F16, &mut g).unwrap();
    let t2 = Tensor::randn([3, 4], DType::F16, &mut g).unwrap();
    let (v1, v2) = (
        Tensor::randn([3], DType::F16, &mut g).unwrap(),
        Tensor::randn([4], DType::F16, &mut g).unwrap(),
    );
    let (x, a, b) = (vals(&input), vals(&t1), vals(&t2));
    let (p, q) = (vals(&v1), vals(&v2));
    let cases: [(&str, Tensor, Vec<f64>); 3] = [
        (
            "addcmul",
            ops::addcmul(&input, &t1, &t2, 0.5).unwrap(),
            (0..12).map(|i| x[i] + 0.5 * a[i] * b[i]).collect(),
        ),
        (
            "addcdiv",
            ops::addcdiv(&input, &t1, &t2, 0.5).unwrap(),
            (0..12).map(|i| x[i] + 0.5 * a[i] / b[i]).collect(),
        ),
        (
            "addr",
            ops::addr(&input, &v1, &v2, 1.0, 1.0).unwrap(),
            (0..12).map(|i| x[i] + p[i / 4] * q[i % 4]).collect(),
        ),
    ];
    for (what, got, want) in cases {
        assert_eq!(got.dtype(), DType::F32, "{what}");
        for (i, (&g, &w)) in vals(&got).iter().zip(&want).enumerate() {
            // float32 arithmetic on the exact values: a few float32 roundings.
            assert!(
                (g - w).abs() <= 4e-7 * w.abs().max(1.0),
                "{what} [{i}]: {g} vs {w}"
            );
        }
    }
    // Gradients in each argument's dtype.
    let t1 = t1.detach();
    t1.requires_grad_(true).unwrap();
    let y = ops::addcmul(&input, &t1, &t2, 0.5).unwrap();
    ops::sum_all(&y).unwrap().backward().unwrap();
    assert_eq!(t1.grad().unwrap().dtype(), DType::F16);
}

/// `multi_dot` and `chain_matmul` multiply in PyTorch's order, which shows in bfloat16
/// (each product is rounded): three matrices as `A(BC)` only when that costs strictly
/// fewer multiply-adds, four or more in the order of fewest (the first best split).
#[test]
fn matrix_chains_multiply_in_pytorchs_order() {
    let mut g = Generator::new(12);
    let mut m = |r: usize, c: usize| Tensor::randn([r, c], DType::BF16, &mut g).unwrap();
    let bits = |t: &Tensor| amp_testing::tensors::bits(t.data());
    let mm = |a: &Tensor, b: &Tensor| ops::mm(a, b).unwrap();
    // [3, 2] [2, 4] [4, 3]: (AB)C costs 60, A(BC) 42.
    let (a, b, c) = (m(3, 2), m(2, 4), m(4, 3));
    let want = bits(&mm(&a, &mm(&b, &c)));
    assert_ne!(want, bits(&mm(&mm(&a, &b), &c)), "the orders differ");
    assert_eq!(
        bits(&ops::multi_dot(&[a.clone(), b.clone(), c.clone()]).unwrap()),
        want
    );
    assert_eq!(bits(&ops::chain_matmul(&[a, b, c]).unwrap()), want);
    // [2, 3] [3, 3] [3, 2]: a tie (30 each), left to right (the orders round apart).
    let (a, b, c) = (m(2, 3), m(3, 3), m(3, 2));
    let want = bits(&mm(&mm(&a, &b), &c));
    assert_ne!(want, bits(&mm(&a, &mm(&b, &c))), "the orders differ");
    assert_eq!(bits(&ops::multi_dot(&[a, b, c]).unwrap()), want);
    // [2, 8] [8, 3] [3, 8] [8, 2]: ((AB)C)D and A(B(CD)) cost 128, (AB)(CD) 108, the
    // orders through BC (192 alone) more: the split after B.
    let (a, b, c, d) = (m(2, 8), m(8, 3), m(3, 8), m(8, 2));
    let want = bits(&mm(&mm(&a, &b), &mm(&c, &d)));
    assert_ne!(
        want,
        bits(&mm(&mm(&mm(&a, &b), &c), &d)),
        "the orders differ"
    );
    assert_eq!(bits(&ops::multi_dot(&[a, b, c, d]).unwrap()), want);
}
