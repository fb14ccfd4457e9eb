//! `TransformerEncoderLayer`: PyTorch's parameters, names and defaults; the layer equal
//! to a hand composition of the functional ops (pre- and post-norm, ReLU and GELU,
//! both layouts); causality; dropout in training mode only; gradients against finite
//! differences; and PyTorch's own float64 forward and backward
//! (`tests/data/transformer_encoder_layer.json`, written by `tests/data/gen_transformer.py`).

use amp_autograd::{ops, Tensor};
use amp_nn::*;
use amp_tensor::{DType, Generator, Tensor as Raw};
use amp_testing::gradcheck::{assert_close, numeric_grad};
use serde_json::Value;

const NAMES: [&str; 12] = [
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
    "norm1.weight",
    "norm1.bias",
    "norm2.weight",
    "norm2.bias",
];

fn opts(d: usize, heads: usize, ff: usize) -> TransformerEncoderLayerOptions {
    TransformerEncoderLayerOptions {
        dim_feedforward: ff,
        dropout: 0.0,
        ..TransformerEncoderLayerOptions::new(d, heads)
    }
}

/// Replace every parameter of `layer` with `get(name)` (float64 parameters, say).
fn set_params(layer: &mut TransformerEncoderLayer, get: impl Fn(&str) -> Tensor) {
    let a = &mut layer.self_attn;
    a.in_proj_weight = get(NAMES[0]);
    a.in_proj_bias = get(NAMES[1]);
    a.out_proj_weight = get(NAMES[2]);
    a.out_proj_bias = get(NAMES[3]);
    layer.linear1 = Linear::from_parts(get(NAMES[4]), Some(get(NAMES[5])));
    layer.linear2 = Linear::from_parts(get(NAMES[6]), Some(get(NAMES[7])));
    layer.norm1.weight = Some(get(NAMES[8]));
    layer.norm1.bias = Some(get(NAMES[9]));
    layer.norm2.weight = Some(get(NAMES[10]));
    layer.norm2.bias = Some(get(NAMES[11]));
}

fn param(v: Vec<f64>, dims: &[usize]) -> Tensor {
    Tensor::parameter(Raw::from_vec(v, dims.to_vec()).unwrap()).unwrap()
}

#[test]
fn encoder_layer_has_pytorch_parameters_defaults_and_init() {
    let d = TransformerEncoderLayerOptions::default();
    assert_eq!(
        (d.d_model, d.nhead, d.dim_feedforward, d.dropout),
        (512, 8, 2048, 0.1)
    );
    assert_eq!(d.activation, Activation::Relu);
    assert_eq!(d.layer_norm_eps, 1e-5);
    assert!(!d.batch_first && !d.norm_first);

    let layer = TransformerEncoderLayer::new(
        TransformerEncoderLayerOptions {
            layer_norm_eps: 1e-6,
            ..TransformerEncoderLayerOptions::new(8, 2)
        },
        &mut Generator::new(0),
    )
    .unwrap();
    let named = layer.named_parameters();
    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, NAMES);
    let shapes: Vec<Vec<usize>> = named.iter().map(|(_, p)| p.dims().to_vec()).collect();
    let want: [&[usize]; 12] = [
        &[24, 8],
        &[24],
        &[8, 8],
        &[8],
        &[2048, 8],
        &[2048],
        &[8, 2048],
        &[8],
        &[8],
        &[8],
        &[8],
        &[8],
    ];
    assert_eq!(shapes, want);
    assert!(named
        .iter()
        .all(|(_, p)| p.requires_grad() && p.dtype() == DType::F32));
    assert_eq!(layer.norm1.eps, 1e-6);
    assert_eq!(layer.norm2.eps, 1e-6);
    // Layer norms start at ones and zeros, the attention biases at zeros; linear1's
    // weight is uniform within 1/sqrt(d_model).
    assert!(named[8].1.to_vec_f64().iter().all(|&v| v == 1.0));
    assert!(named[9].1.to_vec_f64().iter().all(|&v| v == 0.0));
    assert!(named[1].1.to_vec_f64().iter().all(|&v| v == 0.0));
    let bound = 1.0 / 8f64.sqrt();
    assert!(named[4].1.to_vec_f64().iter().all(|v| v.abs() <= bound));
    assert_eq!(
        layer.num_parameters(),
        24 * 8 + 24 + 72 + 2 * 8 * 2048 + 2048 + 8 + 32
    );

    assert!(TransformerEncoderLayer::new(opts(8, 3, 4), &mut Generator::new(0)).is_err());
    let bad_p = TransformerEncoderLayerOptions {
        dropout: 1.5,
        ..opts(8, 2, 4)
    };
    assert!(TransformerEncoderLayer::new(bad_p, &mut Generator::new(0)).is_err());
    assert!(square_subsequent_mask(3, DType::I64).is_err());
    assert_eq!(
        square_subsequent_mask(3, DType::F32).unwrap().to_vec_f64(),
        [
            0.0,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            0.0,
            0.0,
            f64::NEG_INFINITY,
            0.0,
            0.0,
            0.0
        ]
    );
}

/// The layer written out with the functional ops, sequence first.
fn by_hand(layer: &TransformerEncoderLayer, x: &Tensor, mask: Option<&Tensor>) -> Tensor {
    let o = layer.options;
    let p: Vec<Tensor> = layer.parameters();
    let ln = |x: &Tensor, w: &Tensor, b: &Tensor| {
        ops::layer_norm(x, &[o.d_model], Some(w), Some(b), o.layer_norm_eps).unwrap()
    };
    let sa = |x: &Tensor| {
        ops::multi_head_attention_forward(
            x,
            x,
            x,
            o.nhead,
            ops::MultiHeadWeights {
                in_proj_weight: &p[0],
                in_proj_bias: Some(&p[1]),
                out_proj_weight: &p[2],
                out_proj_bias: Some(&p[3]),
            },
            ops::Attention {
                attn_mask: mask,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let ff = |x: &Tensor| {
        let h = ops::linear(x, &p[4], Some(&p[5])).unwrap();
        let h = match o.activation {
            Activation::Relu => ops::relu(&h),
            Activation::Gelu => ops::gelu(&h),
        }
        .unwrap();
        ops::linear(&h, &p[6], Some(&p[7])).unwrap()
    };
    let add = |a: &Tensor, b: &Tensor| ops::add(a, b).unwrap();
    if o.norm_first {
        let x = add(x, &sa(&ln(x, &p[8], &p[9])));
        add(&x, &ff(&ln(&x, &p[10], &p[11])))
    } else {
        let x = ln(&add(x, &sa(x)), &p[8], &p[9]);
        ln(&add(&x, &ff(&x)), &p[10], &p[11])
    }
}

#[test]
fn encoder_layer_is_the_composition_of_the_functional_ops() {
    let mut gen = Generator::new(3);
    let x = Tensor::randn([6, 2, 8], DType::F32, &mut gen).unwrap(); // [L, N, E]
    let causal = square_subsequent_mask(6, DType::F32).unwrap();
    for norm_first in [false, true] {
        for activation in [Activation::Relu, Activation::Gelu] {
            let o = TransformerEncoderLayerOptions {
                norm_first,
                activation,
                ..opts(8, 2, 12)
            };
            let layer = TransformerEncoderLayer::new(o, &mut gen).unwrap();
            let what = format!("norm_first {norm_first}, {activation:?}");
            let want = by_hand(&layer, &x, None).to_vec_f64();
            assert_eq!(layer.forward(&x).unwrap().to_vec_f64(), want, "{what}");
            let masked = by_hand(&layer, &x, Some(&causal)).to_vec_f64();
            let got = layer.forward_with(&x, Some(&causal), false).unwrap();
            assert_eq!(got.to_vec_f64(), masked, "{what}, float mask");
            // The causal hint gives the same values as the causal mask it stands for.
            let hinted = layer.forward_with(&x, Some(&causal), true).unwrap();
            assert_eq!(hinted.to_vec_f64(), masked, "{what}, is_causal");
            let hint_only = layer.forward_with(&x, None, true).unwrap();
            assert_eq!(hint_only.to_vec_f64(), masked, "{what}, is_causal alone");
            assert_ne!(masked, want);

            // Batch first: the same layer on the transposed input, transposed back.
            let mut bf = TransformerEncoderLayer::new(
                TransformerEncoderLayerOptions {
                    batch_first: true,
                    ..o
                },
                &mut Generator::new(0),
            )
            .unwrap();
            set_params(&mut bf, |n| {
                let (_, p) = layer
                    .named_parameters()
                    .into_iter()
                    .find(|(m, _)| m == n)
                    .unwrap();
                p
            });
            let xt = ops::transpose(&x, 0, 1).unwrap();
            let yt = bf.forward(&xt).unwrap();
            assert_eq!(yt.dims(), &[2, 6, 8]);
            assert_eq!(
                ops::transpose(&yt, 0, 1).unwrap().to_vec_f64(),
                want,
                "{what}, batch first"
            );
            // Unbatched [L, E]: the batch of one.
            let one = x.select(1, 0).unwrap();
            let y1 = layer.forward(&one).unwrap();
            assert_eq!(y1.dims(), &[6, 8]);
            let y = layer.forward(&x).unwrap().select(1, 0).unwrap();
            assert_close(&y1.to_vec_f64(), &y.to_vec_f64(), 1e-6, 1e-6, &what);
        }
    }
}

#[test]
fn a_boolean_mask_hides_where_it_is_true() {
    let mut gen = Generator::new(4);
    let layer = TransformerEncoderLayer::new(opts(8, 2, 12), &mut gen).unwrap();
    let x = Tensor::randn([4, 3, 8], DType::F32, &mut gen).unwrap();
    let hide: Vec<bool> = (0..4).flat_map(|i| (0..4).map(move |j| j > i)).collect();
    let bool_mask = Tensor::from_vec(hide, [4, 4]).unwrap();
    let float_mask = square_subsequent_mask(4, DType::F32).unwrap();
    assert_eq!(
        layer
            .forward_with(&x, Some(&bool_mask), false)
            .unwrap()
            .to_vec_f64(),
        layer
            .forward_with(&x, Some(&float_mask), false)
            .unwrap()
            .to_vec_f64()
    );
}

#[test]
fn a_causal_layer_does_not_look_ahead() {
    let mut gen = Generator::new(5);
    let o = TransformerEncoderLayerOptions {
        activation: Activation::Gelu,
        batch_first: true,
        norm_first: true,
        ..opts(8, 2, 16)
    };
    let layer = TransformerEncoderLayer::new(o, &mut gen).unwrap();
    let (n, l, e) = (2, 7, 8);
    let x = Tensor::randn([n, l, e], DType::F32, &mut gen).unwrap();
    let mask = square_subsequent_mask(l, DType::F32).unwrap();
    let run = |x: &Tensor| {
        layer
            .forward_with(x, Some(&mask), true)
            .unwrap()
            .to_vec_f64()
    };
    let before = run(&x);
    for changed in [2usize, 6] {
        let mut v = x.to_vec::<f32>().unwrap();
        for b in 0..n {
            v[(b * l + changed) * e + 3] += 1.5;
        }
        let after = run(&Tensor::from_vec(v, [n, l, e]).unwrap());
        for b in 0..n {
            let row = |t: usize| (b * l + t) * e..(b * l + t + 1) * e;
            for t in 0..l {
                if t < changed {
                    assert_eq!(before[row(t)], after[row(t)], "batch {b}, position {t}");
                } else {
                    assert_ne!(before[row(t)], after[row(t)], "batch {b}, position {t}");
                }
            }
        }
    }
    // Without the mask every position sees the change at the end.
    let full = layer.forward(&x).unwrap().to_vec_f64();
    let mut v = x.to_vec::<f32>().unwrap();
    v[(l - 1) * e] += 1.5;
    let changed = layer
        .forward(&Tensor::from_vec(v, [n, l, e]).unwrap())
        .unwrap()
        .to_vec_f64();
    assert_ne!(full[..e], changed[..e]);
}

#[test]
fn dropout_acts_in_training_mode_only() {
    let o = TransformerEncoderLayerOptions {
        dropout: 0.5,
        ..opts(8, 2, 16)
    };
    let mut layer = TransformerEncoderLayer::new(o, &mut Generator::new(6)).unwrap();
    // The same seed and no dropout: the same parameters (the dropout seeds are drawn
    // after them).
    let plain = TransformerEncoderLayer::new(opts(8, 2, 16), &mut Generator::new(6)).unwrap();
    let x = Tensor::randn([5, 2, 8], DType::F32, &mut Generator::new(7)).unwrap();
    let want = plain.forward(&x).unwrap().to_vec_f64();
    assert!(layer.is_training());
    let a = layer.forward(&x).unwrap().to_vec_f64();
    let b = layer.forward(&x).unwrap().to_vec_f64();
    assert_ne!(a, want);
    assert_ne!(a, b, "each call draws new masks");
    // The attention-weight dropout alone (a causal layer) changes the output too.
    let causal = layer.forward_with(&x, None, true).unwrap().to_vec_f64();
    assert_ne!(
        causal,
        plain.forward_with(&x, None, true).unwrap().to_vec_f64()
    );
    layer.eval();
    assert!(!layer.is_training());
    assert!(!layer.dropout.is_training() && !layer.dropout2.is_training());
    assert_eq!(layer.forward(&x).unwrap().to_vec_f64(), want);
    layer.train(true);
    assert_ne!(layer.forward(&x).unwrap().to_vec_f64(), want);
}

/// Float64 leaves of the given shapes holding `vals`.
fn leaves(dims: &[Vec<usize>], vals: &[Vec<f64>]) -> Vec<Tensor> {
    vals.iter()
        .zip(dims)
        .map(|(v, d)| param(v.clone(), d))
        .collect()
}

#[test]
fn encoder_layer_gradients_match_finite_differences() {
    let (d, heads, ff, n, l) = (4, 2, 6, 2, 3);
    for (norm_first, activation, causal) in [
        (true, Activation::Gelu, true),
        (false, Activation::Relu, false),
    ] {
        let o = TransformerEncoderLayerOptions {
            norm_first,
            activation,
            batch_first: true,
            ..opts(d, heads, ff)
        };
        let mut gen = Generator::new(8);
        let layer = TransformerEncoderLayer::new(o, &mut gen).unwrap();
        let mut dims = vec![vec![n, l, d]];
        dims.extend(layer.parameters().iter().map(|p| p.dims().to_vec()));
        let mut vals: Vec<Vec<f64>> = dims
            .iter()
            .map(|d| {
                let k: usize = d.iter().product();
                (0..k).map(|_| gen.uniform_range(-0.8, 0.8)).collect()
            })
            .collect();
        // Layer-norm weights near one keep the function well scaled.
        for i in [9, 11] {
            vals[i].iter_mut().for_each(|v| *v += 1.0);
        }
        let go: Vec<f64> = (0..n * l * d).map(|_| gen.normal()).collect();
        let go = Tensor::from_vec(go, [n, l, d]).unwrap();
        let mut layer = layer;
        let f = |vals: &[Vec<f64>], layer: &mut TransformerEncoderLayer| -> (Vec<Tensor>, Tensor) {
            let t = leaves(&dims, vals);
            set_params(layer, |name| {
                t[1 + NAMES.iter().position(|m| *m == name).unwrap()].clone()
            });
            let y = layer.forward_with(&t[0], None, causal).unwrap();
            let s = ops::sum_all(&ops::mul(&y, &go).unwrap()).unwrap();
            (t, s)
        };
        let (t, s) = f(&vals, &mut layer);
        s.backward().unwrap();
        let grads: Vec<Vec<f64>> = t.iter().map(|x| x.grad().unwrap().to_vec_f64()).collect();
        let what = format!("norm_first {norm_first}, {activation:?}");
        for (which, g) in grads.iter().enumerate() {
            let want = numeric_grad(&vals, which, 1e-6, |v| {
                f(v, &mut layer).1.item_f64().unwrap()
            });
            let name = if which == 0 {
                "input"
            } else {
                NAMES[which - 1]
            };
            assert_close(g, &want, 1e-5, 1e-7, &format!("{what}: d/d{name}"));
        }
    }
}

fn values(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn tensor(v: &Value) -> Tensor {
    Tensor::from_vec(values(v), dims(v)).unwrap()
}

/// PyTorch's `nn.TransformerEncoderLayer` in float64 (forward and backward), replayed.
#[test]
fn encoder_layer_matches_pytorch() {
    let doc: Value =
        serde_json::from_str(include_str!("../data/transformer_encoder_layer.json")).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let so = &c["options"];
        let o = TransformerEncoderLayerOptions {
            d_model: so["d_model"].as_u64().unwrap() as usize,
            nhead: so["nhead"].as_u64().unwrap() as usize,
            dim_feedforward: so["dim_feedforward"].as_u64().unwrap() as usize,
            dropout: so["dropout"].as_f64().unwrap(),
            activation: match so["activation"].as_str().unwrap() {
                "relu" => Activation::Relu,
                "gelu" => Activation::Gelu,
                other => panic!("{name}: activation {other}"),
            },
            layer_norm_eps: so["layer_norm_eps"].as_f64().unwrap(),
            batch_first: so["batch_first"].as_bool().unwrap(),
            norm_first: so["norm_first"].as_bool().unwrap(),
        };
        let mut layer = TransformerEncoderLayer::new(o, &mut Generator::new(0)).unwrap();
        let keys: Vec<&str> = c["params"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, NAMES, "{name}: PyTorch's state_dict names and order");
        set_params(&mut layer, |n| {
            let p = &c["params"][n];
            param(values(p), &dims(p))
        });
        let m = &c["mask"];
        let hidden: Vec<bool> = m["masked"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_bool().unwrap())
            .collect();
        let mask = match m["dtype"].as_str().unwrap() {
            "bool" => Tensor::from_vec(hidden, dims(m)).unwrap(),
            _ => {
                let mask = square_subsequent_mask(dims(m)[0], DType::F64).unwrap();
                let inf: Vec<bool> = mask.to_vec_f64().iter().map(|v| *v != 0.0).collect();
                assert_eq!(inf, hidden, "{name}: the causal mask");
                mask
            }
        };
        let x = tensor(&c["input"]);
        x.requires_grad_(true).unwrap();
        let y = layer
            .forward_with(&x, Some(&mask), c["is_causal"].as_bool().unwrap())
            .unwrap();
        assert_close(
            &y.to_vec_f64(),
            &values(&c["output"]),
            1e-12,
            1e-12,
            &format!("{name}: output"),
        );
        let go = tensor(&c["grad_output"]);
        ops::sum_all(&ops::mul(&y, &go).unwrap())
            .unwrap()
            .backward()
            .unwrap();
        assert_close(
            &x.grad().unwrap().to_vec_f64(),
            &values(&c["input_grad"]),
            1e-11,
            1e-12,
            &format!("{name}: input gradient"),
        );
        for (n, p) in layer.named_parameters() {
            assert_close(
                &p.grad().unwrap().to_vec_f64(),
                &values(&c["param_grads"][&n]),
                1e-11,
                1e-12,
                &format!("{name}: gradient of {n}"),
            );
        }
    }
}
