//! The recurrent cells, PReLU, Bilinear, GroupNorm and the new loss modules: parameter
//! names and shapes as PyTorch's, default initialisation, and forward passes that agree
//! with the functional ops.

use amp_autograd::ops::{self, KlDivReduction};
use amp_autograd::{Reduction, Tensor};
use amp_nn::*;
use amp_tensor::{DType, Generator};

fn names(m: &dyn Module) -> Vec<String> {
    m.named_parameters().into_iter().map(|(n, _)| n).collect()
}

/// A cell's parameters in the order the cell ops take them.
fn weights(p: &CellParams) -> (&Tensor, &Tensor, Option<&Tensor>, Option<&Tensor>) {
    (
        &p.weight_ih,
        &p.weight_hh,
        p.bias_ih.as_ref(),
        p.bias_hh.as_ref(),
    )
}

fn within(t: &Tensor, bound: f64) -> bool {
    t.to_vec_f64().iter().all(|v| v.abs() <= bound)
}

#[test]
fn cells_have_pytorch_parameters_and_init() {
    let mut g = Generator::new(0);
    let rnn = RNNCell::new(4, 3, &mut g).unwrap();
    let gru = GRUCell::new(4, 3, &mut g).unwrap();
    let lstm = LSTMCell::new(4, 3, &mut g).unwrap();
    let want = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"];
    for (m, gates) in [
        (&rnn as &dyn Module, 1usize),
        (&gru as &dyn Module, 3),
        (&lstm as &dyn Module, 4),
    ] {
        assert_eq!(names(m), want);
        let p = m.named_parameters();
        assert_eq!(p[0].1.dims(), &[gates * 3, 4]);
        assert_eq!(p[1].1.dims(), &[gates * 3, 3]);
        assert_eq!(p[2].1.dims(), &[gates * 3]);
        let k = 1.0 / 3f64.sqrt();
        assert!(p.iter().all(|(_, t)| within(t, k) && t.requires_grad()));
        assert!(p.iter().all(|(_, t)| t.dtype() == DType::F32));
    }
    let nb = GRUCell::with_bias(4, 3, false, &mut g).unwrap();
    assert_eq!(names(&nb), ["weight_ih", "weight_hh"]);
}

#[test]
fn cells_step_like_the_functional_ops() {
    let mut g = Generator::new(1);
    let x = Tensor::randn([2, 4], DType::F32, &mut g).unwrap();
    let h = Tensor::randn([2, 3], DType::F32, &mut g).unwrap();
    let lstm = LSTMCell::new(4, 3, &mut g).unwrap();
    let (w_ih, w_hh, b_ih, b_hh) = weights(&lstm.params);
    let z = Tensor::zeros([2, 3], DType::F32);
    let (h1, c1) = lstm.step(&x, None).unwrap();
    let (h2, c2) = ops::lstm_cell(&x, (&z, &z), w_ih, w_hh, b_ih, b_hh).unwrap();
    assert_eq!(h1.to_vec_f64(), h2.to_vec_f64());
    assert_eq!(c1.to_vec_f64(), c2.to_vec_f64());
    assert_eq!(lstm.forward(&x).unwrap().to_vec_f64(), h1.to_vec_f64());

    let gru = GRUCell::new(4, 3, &mut g).unwrap();
    let (w_ih, w_hh, b_ih, b_hh) = weights(&gru.params);
    let y = gru.step(&x, Some(&h)).unwrap();
    let want = ops::gru_cell(&x, &h, w_ih, w_hh, b_ih, b_hh).unwrap();
    assert_eq!(y.to_vec_f64(), want.to_vec_f64());

    // Unbatched input gets an unbatched zero state; gradients reach the parameters.
    let rnn = RNNCell::new(4, 3, &mut g).unwrap();
    let y = rnn.forward(&x.select(0, 0).unwrap()).unwrap();
    assert_eq!(y.dims(), &[3]);
    ops::sum_all(&y).unwrap().backward().unwrap();
    assert!(rnn.parameters().iter().all(|p| p.grad().is_some()));
}

#[test]
fn prelu_bilinear_group_norm_modules() {
    let mut g = Generator::new(2);
    let pr = PReLU::default();
    assert_eq!(names(&pr), ["weight"]);
    assert_eq!(pr.weight.to_vec_f64(), [0.25]);
    let x = Tensor::from_vec(vec![-2.0f32, 3.0], [2]).unwrap();
    assert_eq!(pr.forward(&x).unwrap().to_vec_f64(), [-0.5, 3.0]);
    let per_channel = PReLU::new(3, 0.25).unwrap();
    assert_eq!(per_channel.weight.dims(), &[3]);

    let bl = Bilinear::new(3, 4, 5, &mut g).unwrap();
    assert_eq!(names(&bl), ["weight", "bias"]);
    assert_eq!(bl.weight.dims(), &[5, 3, 4]);
    assert!(within(&bl.weight, 1.0 / 3f64.sqrt()));
    let (x1, x2) = (
        Tensor::randn([2, 3], DType::F32, &mut g).unwrap(),
        Tensor::randn([2, 4], DType::F32, &mut g).unwrap(),
    );
    assert_eq!(bl.forward2(&x1, &x2).unwrap().dims(), &[2, 5]);
    assert!(bl.forward(&x1).is_err());

    let gn = GroupNorm::new(2, 4).unwrap();
    assert_eq!(names(&gn), ["weight", "bias"]);
    assert_eq!(gn.weight.as_ref().unwrap().to_vec_f64(), [1.0; 4]);
    assert_eq!(gn.bias.as_ref().unwrap().to_vec_f64(), [0.0; 4]);
    let x = Tensor::randn([2, 4, 3], DType::F32, &mut g).unwrap();
    let y = gn.forward(&x).unwrap();
    // Each group of 2 channels x 3 positions has mean 0 and variance ~1.
    let v = y.to_vec_f64();
    for grp in v.chunks(6) {
        let m: f64 = grp.iter().sum::<f64>() / 6.0;
        let var: f64 = grp.iter().map(|a| (a - m).powi(2)).sum::<f64>() / 6.0;
        assert!(m.abs() < 1e-5 && (var - 1.0).abs() < 1e-3, "{m} {var}");
    }
    assert!(GroupNorm::new(3, 4).is_err());
}

#[test]
fn loss_modules_call_their_ops_with_pytorch_defaults() {
    let mut g = Generator::new(3);
    let x = Tensor::randn([3, 4], DType::F64, &mut g).unwrap();
    let y = Tensor::randn([3, 4], DType::F64, &mut g).unwrap();
    let sign = Tensor::from_vec(vec![1.0f64, -1.0, 1.0], [3]).unwrap();
    let pm = ops::sign(&y).unwrap();
    let same = |a: Tensor, b: Tensor| assert_eq!(a.to_vec_f64(), b.to_vec_f64());

    let lp = ops::log_softmax(&x, 1, None).unwrap();
    let p = ops::softmax(&y, 1, None).unwrap();
    let kl = KLDivLoss {
        reduction: KlDivReduction::BatchMean,
        ..Default::default()
    };
    same(
        kl.forward(&lp, &p).unwrap(),
        ops::kl_div(&lp, &p, KlDivReduction::BatchMean, false).unwrap(),
    );
    let counts = ops::abs(&y).unwrap();
    same(
        PoissonNLLLoss::default().forward(&x, &counts).unwrap(),
        ops::poisson_nll_loss(&x, &counts, true, false, 1e-8, Reduction::Mean).unwrap(),
    );
    same(
        HingeEmbeddingLoss::default().forward(&x, &pm).unwrap(),
        ops::hinge_embedding_loss(&x, &pm, 1.0, Reduction::Mean).unwrap(),
    );
    same(
        SoftMarginLoss::default().forward(&x, &pm).unwrap(),
        ops::soft_margin_loss(&x, &pm, Reduction::Mean).unwrap(),
    );
    let (a, b) = (x.select(1, 0).unwrap(), y.select(1, 0).unwrap());
    same(
        MarginRankingLoss::default().forward(&a, &b, &sign).unwrap(),
        ops::margin_ranking_loss(&a, &b, &sign, 0.0, Reduction::Mean).unwrap(),
    );
    let cls = Tensor::from_vec(vec![0i64, 3, 2], [3]).unwrap();
    same(
        MultiMarginLoss::default().forward(&x, &cls).unwrap(),
        ops::multi_margin_loss(&x, &cls, 1, 1.0, None, Reduction::Mean).unwrap(),
    );
    let ml = Tensor::from_vec(vec![0i64, -1, 0, 0, 1, 2, -1, 0, 3, 2, 1, 0], [3, 4]).unwrap();
    same(
        MultiLabelMarginLoss::default().forward(&x, &ml).unwrap(),
        ops::multilabel_margin_loss(&x, &ml, Reduction::Mean).unwrap(),
    );
    same(
        CosineEmbeddingLoss::default()
            .forward(&x, &y, &sign)
            .unwrap(),
        ops::cosine_embedding_loss(&x, &y, &sign, 0.0, Reduction::Mean).unwrap(),
    );
    same(
        TripletMarginLoss::default().forward(&x, &y, &lp).unwrap(),
        ops::triplet_margin_loss(&x, &y, &lp, 1.0, 2.0, 1e-6, false, Reduction::Mean).unwrap(),
    );
    let logp = ops::log_softmax(
        &Tensor::randn([5, 2, 3], DType::F64, &mut g).unwrap(),
        2,
        None,
    )
    .unwrap();
    let tg = Tensor::from_vec(vec![1i64, 2, 2, 1], [2, 2]).unwrap();
    same(
        CTCLoss::default()
            .forward(&logp, &tg, &[5, 4], &[2, 2])
            .unwrap(),
        ops::ctc_loss(&logp, &tg, &[5, 4], &[2, 2], 0, Reduction::Mean, false).unwrap(),
    );
}

/// `nn.LSTM`/`nn.GRU`: PyTorch's parameter names, order and shapes, the stack's output
/// equal to the cells stepped by hand, eval/train, and a refused input.
#[test]
fn recurrent_stacks_follow_pytorch() {
    use amp_nn::{RecurrentConfig, GRU, LSTM};
    let mut gen = Generator::new(3);
    let cfg = RecurrentConfig {
        num_layers: 2,
        bidirectional: true,
        ..RecurrentConfig::new(3, 4)
    };
    let lstm = LSTM::new(cfg, &mut gen).unwrap();
    let names: Vec<(String, Vec<usize>)> = lstm
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.dims().to_vec()))
        .collect();
    // Per layer and direction (`_reverse`): weight_ih [4·4, input], where the second
    // layer's input is both directions' hidden state (8), then weight_hh [16, 4] and the
    // two biases [16].
    let mut want: Vec<(String, Vec<usize>)> = Vec::new();
    for (layer, input) in [(0, 3), (1, 8)] {
        for sfx in ["", "_reverse"] {
            want.push((format!("weight_ih_l{layer}{sfx}"), vec![16, input]));
            want.push((format!("weight_hh_l{layer}{sfx}"), vec![16, 4]));
            want.push((format!("bias_ih_l{layer}{sfx}"), vec![16]));
            want.push((format!("bias_hh_l{layer}{sfx}"), vec![16]));
        }
    }
    assert_eq!(names, want);
    let x = Tensor::randn(vec![5, 2, 3], DType::F32, &mut gen).unwrap();
    let (y, (h, c)) = lstm.forward_with(&x, None).unwrap();
    assert_eq!(
        (y.dims(), h.dims(), c.dims()),
        (&[5, 2, 8][..], &[4, 2, 4][..], &[4, 2, 4][..])
    );
    // One unidirectional GRU layer against its cell stepped by hand.
    let gru = GRU::new(RecurrentConfig::new(3, 4), &mut gen).unwrap();
    let p: Vec<Tensor> = gru.parameters();
    let (y, hn) = gru.forward_with(&x, None).unwrap();
    let mut h = Tensor::zeros([2, 4], DType::F32);
    let mut steps = Vec::new();
    for t in 0..5 {
        let xt = ops::select(&x, 0, t).unwrap();
        h = ops::gru_cell(&xt, &h, &p[0], &p[1], Some(&p[2]), Some(&p[3])).unwrap();
        steps.extend(h.to_vec_f64());
    }
    assert_eq!(y.to_vec_f64(), steps);
    assert_eq!(hn.to_vec_f64(), h.to_vec_f64());
    // Modes, and a 2-D input refused with an error (no panic).
    let mut gru = gru;
    gru.eval();
    assert!(!gru.is_training());
    assert!(gru.forward(&Tensor::ones([5, 3], DType::F32)).is_err());
}

/// `nn.MultiheadAttention`: PyTorch's parameters and init, the module equal to the
/// functional op, batch-first as sequence-first transposed, and a causal mask.
#[test]
fn multihead_attention_follows_pytorch() {
    let mut gen = Generator::new(5);
    let mha = MultiheadAttention::new(8, 2, false, &mut gen).unwrap();
    let shapes: Vec<Vec<usize>> = mha.parameters().iter().map(|p| p.dims().to_vec()).collect();
    assert_eq!(shapes, [vec![24, 8], vec![24], vec![8, 8], vec![8]]);
    // Xavier-uniform bound sqrt(6 / (8 + 24)); zero biases.
    assert!(within(&mha.in_proj_weight, (6.0f64 / 32.0).sqrt()));
    assert!(mha.in_proj_bias.to_vec_f64().iter().all(|&v| v == 0.0));
    let x = Tensor::randn(vec![5, 3, 8], DType::F32, &mut gen).unwrap();
    let y = mha.forward(&x).unwrap();
    let p = mha.parameters();
    let want = ops::multi_head_attention_forward(
        &x,
        &x,
        &x,
        2,
        ops::MultiHeadWeights {
            in_proj_weight: &p[0],
            in_proj_bias: Some(&p[1]),
            out_proj_weight: &p[2],
            out_proj_bias: Some(&p[3]),
        },
        ops::Attention::default(),
    )
    .unwrap();
    assert_eq!(y.to_vec_f64(), want.to_vec_f64());
    let bf = MultiheadAttention {
        batch_first: true,
        ..mha
    };
    let xt = ops::transpose(&x, 0, 1).unwrap();
    let yt = bf.forward(&xt).unwrap();
    assert_eq!(
        ops::transpose(&yt, 0, 1).unwrap().to_vec_f64(),
        y.to_vec_f64()
    );
    // Causal: the first position's output does not depend on later positions.
    let causal = |x: &Tensor| bf.attend(x, x, x, None, true).unwrap();
    let a = causal(&xt);
    let mut v = xt.to_vec::<f32>().unwrap();
    v[8 * 4] += 1.0; // batch 0, position 4
    let b = causal(&Tensor::from_vec(v, [3, 5, 8]).unwrap());
    assert_eq!(&a.to_vec_f64()[..8], &b.to_vec_f64()[..8]);
    assert_ne!(&a.to_vec_f64()[32..40], &b.to_vec_f64()[32..40]);
}
