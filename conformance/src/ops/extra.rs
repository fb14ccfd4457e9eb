//! Op-table entries: Recurrent cells, the remaining losses, distances, norms and promote-list ops.

use amp::autograd::ops::{self, CdistMode, KlDivReduction, TensordotDims};
use amp::autograd::Tensor;

use super::{bind, err, legacy_reduction, one, Bound, BuiltinTensor, A, K, R};
use crate::args::{Arg, Output};
use crate::optable::OpTable;

type Cell = fn(
    &Tensor,
    &Tensor,
    &Tensor,
    &Tensor,
    Option<&Tensor>,
    Option<&Tensor>,
) -> amp::autograd::Result<Tensor>;

/// The parameters of `torch.rnn_tanh_cell`-style calls.
const CELL: [&str; 6] = ["input", "hx", "w_ih", "w_hh", "b_ih", "b_hh"];

/// `torch.rnn_tanh_cell` / `rnn_relu_cell` / `gru_cell`:
/// `(input, hx, w_ih, w_hh, b_ih=None, b_hh=None)`.
fn cell(f: Cell) -> impl Fn(&[A], &K) -> R + Send + Sync + 'static {
    move |args, kwargs| {
        let b = bind(args, kwargs, &CELL, &[])?;
        one(f(
            b.tensor("input")?,
            b.tensor("hx")?,
            b.tensor("w_ih")?,
            b.tensor("w_hh")?,
            b.opt_tensor("b_ih")?,
            b.opt_tensor("b_hh")?,
        ))
    }
}

/// A list of ints given as a list, a tuple, one int, or an integer tensor
/// (`input_lengths` of `ctc_loss`).
fn lengths(b: &Bound<'_>, name: &str) -> Result<Vec<usize>, String> {
    let v: Vec<i64> = match b.req(name)? {
        Arg::Tensor(t) => {
            if t.dtype().is_floating_point() {
                return Err(format!("`{name}`: expected an integer tensor"));
            }
            t.to_vec_f64().into_iter().map(|x| x as i64).collect()
        }
        a => a.ints().map_err(|e| format!("`{name}`: {e}"))?,
    };
    v.into_iter()
        .map(|x| usize::try_from(x).map_err(|_| format!("`{name}`: negative length {x}")))
        .collect()
}

/// The standard tail of a loss signature, after its own parameters.
const LEGACY: [&str; 3] = ["size_average", "reduce", "reduction"];

fn with_legacy(own: &[&'static str]) -> Vec<&'static str> {
    own.iter().chain(&LEGACY).copied().collect()
}

/// `torch.lstm`/`torch.gru`'s signature (the input-first overload).
const SEQ: [&str; 9] = [
    "input",
    "hx",
    "params",
    "has_biases",
    "num_layers",
    "dropout",
    "train",
    "bidirectional",
    "batch_first",
];

/// The layer shape of a bound `torch.lstm`/`torch.gru` call (dropout only when it is
/// not random: 0, or not training).
fn recurrent<'a>(b: &Bound<'_>) -> Result<ops::Recurrent<'a>, String> {
    let layers = b.int("num_layers")?;
    let o = ops::Recurrent {
        has_biases: b.bool_or("has_biases", true)?,
        num_layers: usize::try_from(layers).map_err(|_| format!("`num_layers`: {layers}"))?,
        dropout: b.f64_or("dropout", 0.0)?,
        train: b.bool_or("train", false)?,
        bidirectional: b.bool_or("bidirectional", false)?,
        batch_first: b.bool_or("batch_first", false)?,
        generator: None,
    };
    if o.train && o.dropout > 0.0 && o.num_layers > 1 {
        return Err("dropout between layers in training is random in PyTorch".to_string());
    }
    Ok(o)
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    // ----- recurrent cells ------------------------------------------------------------------
    t.insert("torch.rnn_tanh_cell", cell(ops::rnn_tanh_cell));
    t.insert("torch.rnn_relu_cell", cell(ops::rnn_relu_cell));
    t.insert("torch.gru_cell", cell(ops::gru_cell));
    t.insert("torch.lstm_cell", |args, kwargs| {
        let b = bind(args, kwargs, &CELL, &[])?;
        let hx = b.tensors("hx")?;
        if hx.len() != 2 {
            return Err(format!(
                "`hx`: lstm_cell expects two hidden states (h, c), got {}",
                hx.len()
            ));
        }
        let (h, c) = ops::lstm_cell(
            b.tensor("input")?,
            (&hx[0], &hx[1]),
            b.tensor("w_ih")?,
            b.tensor("w_hh")?,
            b.opt_tensor("b_ih")?,
            b.opt_tensor("b_hh")?,
        )
        .map_err(err)?;
        Ok(Output::Tensors(vec![h, c]))
    });

    // ----- recurrent layers over sequences ---------------------------------------------------
    t.insert("torch.lstm", |args, kwargs| {
        let b = bind(args, kwargs, &SEQ, &[])?;
        let hx = b.tensors("hx")?;
        if hx.len() != 2 {
            return Err(format!(
                "`hx`: lstm expects two hidden states (h, c), got {}",
                hx.len()
            ));
        }
        let params = b.tensors("params")?;
        let (y, h, c) = ops::lstm(
            b.tensor("input")?,
            (&hx[0], &hx[1]),
            &params,
            recurrent(&b)?,
        )
        .map_err(err)?;
        Ok(Output::Tensors(vec![y, h, c]))
    });
    t.insert("torch.gru", |args, kwargs| {
        let b = bind(args, kwargs, &SEQ, &[])?;
        let params = b.tensors("params")?;
        let (y, h) =
            ops::gru(b.tensor("input")?, b.tensor("hx")?, &params, recurrent(&b)?).map_err(err)?;
        Ok(Output::Tensors(vec![y, h]))
    });

    // ----- losses -------------------------------------------------------------------------
    t.insert("torch.nn.functional.kl_div", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "target",
                "size_average",
                "reduce",
                "reduction",
                "log_target",
            ],
            &[],
        )?;
        legacy_reduction(&b)?;
        let reduction: KlDivReduction = b.str_or("reduction", "mean")?.parse().map_err(err)?;
        one(ops::kl_div(
            b.tensor("input")?,
            b.tensor("target")?,
            reduction,
            b.bool_or("log_target", false)?,
        ))
    });
    t.insert("torch.nn.functional.poisson_nll_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "target",
                "log_input",
                "full",
                "size_average",
                "eps",
                "reduce",
                "reduction",
            ],
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::poisson_nll_loss(
            b.tensor("input")?,
            b.tensor("target")?,
            b.bool_or("log_input", true)?,
            b.bool_or("full", false)?,
            b.f64_or("eps", 1e-8)?,
            b.reduction("reduction")?,
        ))
    });
    t.insert(
        "torch.nn.functional.hinge_embedding_loss",
        |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &with_legacy(&["input", "target", "margin"]),
                &[],
            )?;
            legacy_reduction(&b)?;
            one(ops::hinge_embedding_loss(
                b.tensor("input")?,
                b.tensor("target")?,
                b.f64_or("margin", 1.0)?,
                b.reduction("reduction")?,
            ))
        },
    );
    t.insert("torch.nn.functional.margin_ranking_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &with_legacy(&["input1", "input2", "target", "margin"]),
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::margin_ranking_loss(
            b.tensor("input1")?,
            b.tensor("input2")?,
            b.tensor("target")?,
            b.f64_or("margin", 0.0)?,
            b.reduction("reduction")?,
        ))
    });
    t.insert("torch.nn.functional.soft_margin_loss", |args, kwargs| {
        let b = bind(args, kwargs, &with_legacy(&["input", "target"]), &[])?;
        legacy_reduction(&b)?;
        one(ops::soft_margin_loss(
            b.tensor("input")?,
            b.tensor("target")?,
            b.reduction("reduction")?,
        ))
    });
    // Serves `multilabel_margin_loss` and the ATen op behind it,
    // `multilabel_margin_loss_forward`.
    t.insert(
        "torch.nn.functional.multilabel_margin_loss",
        |args, kwargs| {
            let b = bind(args, kwargs, &with_legacy(&["input", "target"]), &[])?;
            legacy_reduction(&b)?;
            one(ops::multilabel_margin_loss(
                b.tensor("input")?,
                b.tensor("target")?,
                b.reduction("reduction")?,
            ))
        },
    );
    t.insert("torch.nn.functional.multi_margin_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &with_legacy(&["input", "target", "p", "margin", "weight"]),
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::multi_margin_loss(
            b.tensor("input")?,
            b.tensor("target")?,
            b.int_or("p", 1)?,
            b.f64_or("margin", 1.0)?,
            b.opt_tensor("weight")?,
            b.reduction("reduction")?,
        ))
    });
    t.insert(
        "torch.nn.functional.cosine_embedding_loss",
        |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &with_legacy(&["input1", "input2", "target", "margin"]),
                &[],
            )?;
            legacy_reduction(&b)?;
            one(ops::cosine_embedding_loss(
                b.tensor("input1")?,
                b.tensor("input2")?,
                b.tensor("target")?,
                b.f64_or("margin", 0.0)?,
                b.reduction("reduction")?,
            ))
        },
    );
    t.insert("torch.nn.functional.triplet_margin_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &with_legacy(&[
                "anchor", "positive", "negative", "margin", "p", "eps", "swap",
            ]),
            &[],
        )?;
        legacy_reduction(&b)?;
        one(ops::triplet_margin_loss(
            b.tensor("anchor")?,
            b.tensor("positive")?,
            b.tensor("negative")?,
            b.f64_or("margin", 1.0)?,
            b.f64_or("p", 2.0)?,
            b.f64_or("eps", 1e-6)?,
            b.bool_or("swap", false)?,
            b.reduction("reduction")?,
        ))
    });
    t.insert("torch.nn.functional.ctc_loss", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "log_probs",
                "targets",
                "input_lengths",
                "target_lengths",
                "blank",
                "reduction",
                "zero_infinity",
            ],
            &[],
        )?;
        let blank = b.int_or("blank", 0)?;
        let blank = usize::try_from(blank).map_err(|_| format!("`blank`: negative {blank}"))?;
        one(ops::ctc_loss(
            b.tensor("log_probs")?,
            b.tensor("targets")?,
            &lengths(&b, "input_lengths")?,
            &lengths(&b, "target_lengths")?,
            blank,
            b.reduction("reduction")?,
            b.bool_or("zero_infinity", false)?,
        ))
    });

    // ----- norms, distances, other nn functions ---------------------------------------------
    t.insert("torch.nn.functional.prelu", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "weight"], &[])?;
        one(ops::prelu(b.tensor("input")?, b.tensor("weight")?))
    });
    t.insert("torch.nn.functional.bilinear", |args, kwargs| {
        let b = bind(args, kwargs, &["input1", "input2", "weight", "bias"], &[])?;
        one(ops::bilinear(
            b.tensor("input1")?,
            b.tensor("input2")?,
            b.tensor("weight")?,
            b.opt_tensor("bias")?,
        ))
    });
    t.insert("torch.nn.functional.group_norm", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "num_groups", "weight", "bias", "eps"],
            &[],
        )?;
        let g = b.int("num_groups")?;
        let g = usize::try_from(g).map_err(|_| format!("`num_groups`: negative {g}"))?;
        one(ops::group_norm(
            b.tensor("input")?,
            g,
            b.opt_tensor("weight")?,
            b.opt_tensor("bias")?,
            b.f64_or("eps", 1e-5)?,
        ))
    });
    t.insert(
        "torch.nn.functional.scaled_dot_product_attention",
        |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "query",
                    "key",
                    "value",
                    "attn_mask",
                    "dropout_p",
                    "is_causal",
                    "scale",
                ],
                &[],
            )?;
            let dropout_p = b.f64_or("dropout_p", 0.0)?;
            if dropout_p != 0.0 {
                return Err("dropout_p other than 0 is random in PyTorch".to_string());
            }
            one(ops::scaled_dot_product_attention(
                b.tensor("query")?,
                b.tensor("key")?,
                b.tensor("value")?,
                ops::Attention {
                    attn_mask: b.opt_tensor("attn_mask")?,
                    is_causal: b.bool_or("is_causal", false)?,
                    scale: b
                        .get("scale")
                        .map(|a| a.float().map_err(|e| format!("`scale`: {e}")))
                        .transpose()?,
                    ..Default::default()
                },
            ))
        },
    );
    t.insert(
        "torch.nn.functional.multi_head_attention_forward",
        |args, kwargs| {
            let b = bind(
                args,
                kwargs,
                &[
                    "query",
                    "key",
                    "value",
                    "embed_dim_to_check",
                    "num_heads",
                    "in_proj_weight",
                    "in_proj_bias",
                    "bias_k",
                    "bias_v",
                    "add_zero_attn",
                    "dropout_p",
                    "out_proj_weight",
                    "out_proj_bias",
                    "training",
                    "key_padding_mask",
                    "need_weights",
                    "attn_mask",
                    "use_separate_proj_weight",
                    "q_proj_weight",
                    "k_proj_weight",
                    "v_proj_weight",
                    "static_k",
                    "static_v",
                    "average_attn_weights",
                    "is_causal",
                ],
                &[],
            )?;
            for name in [
                "bias_k",
                "bias_v",
                "key_padding_mask",
                "q_proj_weight",
                "k_proj_weight",
                "v_proj_weight",
                "static_k",
                "static_v",
            ] {
                b.unsupported_unless_none(name)?;
            }
            if b.bool_or("add_zero_attn", false)?
                || b.bool_or("need_weights", true)?
                || b.bool_or("use_separate_proj_weight", false)?
            {
                return Err(
                    "add_zero_attn, need_weights and separate projections are not supported"
                        .to_string(),
                );
            }
            let dropout_p = b.f64_or("dropout_p", 0.0)?;
            if dropout_p != 0.0 && b.bool_or("training", true)? {
                return Err("dropout in training is random in PyTorch".to_string());
            }
            let query = b.tensor("query")?;
            let e = b.int("embed_dim_to_check")?;
            if usize::try_from(e).ok() != query.dims().last().copied() {
                return Err(format!(
                    "`embed_dim_to_check` {e} is not the query's embedding size"
                ));
            }
            let heads = b.int("num_heads")?;
            let heads = usize::try_from(heads).map_err(|_| format!("`num_heads`: {heads}"))?;
            let out = ops::multi_head_attention_forward(
                query,
                b.tensor("key")?,
                b.tensor("value")?,
                heads,
                ops::MultiHeadWeights {
                    in_proj_weight: b.tensor("in_proj_weight")?,
                    in_proj_bias: b.opt_tensor("in_proj_bias")?,
                    out_proj_weight: b.tensor("out_proj_weight")?,
                    out_proj_bias: b.opt_tensor("out_proj_bias")?,
                },
                ops::Attention {
                    attn_mask: b.opt_tensor("attn_mask")?,
                    is_causal: b.bool_or("is_causal", false)?,
                    ..Default::default()
                },
            )
            .map_err(err)?;
            Ok(Output::Tensors(vec![out]))
        },
    );
    t.insert("torch.nn.functional.batch_norm", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &[
                "input",
                "running_mean",
                "running_var",
                "weight",
                "bias",
                "training",
                "momentum",
                "eps",
            ],
            &[],
        )?;
        one(ops::batch_norm(
            b.tensor("input")?,
            b.opt_tensor("running_mean")?,
            b.opt_tensor("running_var")?,
            b.opt_tensor("weight")?,
            b.opt_tensor("bias")?,
            b.bool_or("training", false)?,
            b.f64_or("momentum", 0.1)?,
            b.f64_or("eps", 1e-5)?,
        ))
    });
    t.insert("torch.nn.functional.normalize", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "p", "dim", "eps", "out"], &[])?;
        b.unsupported_unless_none("out")?;
        one(ops::normalize(
            b.tensor("input")?,
            b.f64_or("p", 2.0)?,
            b.int_or("dim", 1)?,
            b.f64_or("eps", 1e-12)?,
        ))
    });
    t.insert("torch.nn.functional.cosine_similarity", |args, kwargs| {
        let b = bind(args, kwargs, &["x1", "x2", "dim", "eps"], &[])?;
        one(ops::cosine_similarity(
            b.tensor("x1")?,
            b.tensor("x2")?,
            b.int_or("dim", 1)?,
            b.f64_or("eps", 1e-8)?,
        ))
    });
    t.insert("torch.nn.functional.pairwise_distance", |args, kwargs| {
        let b = bind(args, kwargs, &["x1", "x2", "p", "eps", "keepdim"], &[])?;
        one(ops::pairwise_distance(
            b.tensor("x1")?,
            b.tensor("x2")?,
            b.f64_or("p", 2.0)?,
            b.f64_or("eps", 1e-6)?,
            b.bool_or("keepdim", false)?,
        ))
    });
    t.insert("torch.cdist", |args, kwargs| {
        let b = bind(args, kwargs, &["x1", "x2", "p", "compute_mode"], &[])?;
        let mode: CdistMode = b
            .str_or("compute_mode", "use_mm_for_euclid_dist_if_necessary")?
            .parse()
            .map_err(err)?;
        one(ops::cdist(
            b.tensor("x1")?,
            b.tensor("x2")?,
            b.f64_or("p", 2.0)?,
            mode,
        ))
    });
    t.insert("torch.nn.functional.pdist", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "p"], &[])?;
        one(ops::pdist(b.tensor("input")?, b.f64_or("p", 2.0)?))
    });
    t.insert("torch.dist", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "other", "p"], &[])?;
        one(ops::dist(
            b.tensor("input")?,
            b.tensor("other")?,
            b.f64_or("p", 2.0)?,
        ))
    });
    t.insert("torch.renorm", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "p", "dim", "maxnorm"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let p = b.req("p")?.float().map_err(|e| format!("`p`: {e}"))?;
        let maxnorm = b
            .req("maxnorm")?
            .float()
            .map_err(|e| format!("`maxnorm`: {e}"))?;
        one(ops::renorm(b.tensor("input")?, p, b.int("dim")?, maxnorm))
    });

    // ----- promote-list ops ------------------------------------------------------------------
    t.insert("torch.linalg.cross", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "other"], &["dim", "out"])?;
        b.unsupported_unless_none("out")?;
        one(ops::cross(
            b.tensor("input")?,
            b.tensor("other")?,
            b.int_or("dim", -1)?,
        ))
    });
    t.insert("torch.cross", |args, kwargs| {
        let b = bind(args, kwargs, &["input", "other", "dim"], &["out"])?;
        b.unsupported_unless_none("out")?;
        let dim = b
            .get("dim")
            .map(|d| d.int().map_err(|e| format!("`dim`: {e}")))
            .transpose()?;
        one(ops::cross_default(
            b.tensor("input")?,
            b.tensor("other")?,
            dim,
        ))
    });
    t.insert("torch.index_put", |args, kwargs| {
        let b = bind(
            args,
            kwargs,
            &["input", "indices", "values", "accumulate"],
            &[],
        )?;
        one(ops::index_put(
            b.tensor("input")?,
            &b.tensors("indices")?,
            b.tensor("values")?,
            b.bool_or("accumulate", false)?,
        ))
    });
    t.insert("torch.tensordot", |args, kwargs| {
        let b = bind(args, kwargs, &["a", "b", "dims", "out"], &[])?;
        b.unsupported_unless_none("out")?;
        let dims = match b.get("dims") {
            None => TensordotDims::Count(2),
            Some(Arg::Int(n)) => TensordotDims::Count(
                usize::try_from(*n)
                    .map_err(|_| format!("tensordot expects dims >= 0, but got dims={n}"))?,
            ),
            Some(Arg::List(pair)) if pair.len() == 2 => {
                let x = pair[0].ints().map_err(|e| format!("`dims`: {e}"))?;
                let y = pair[1].ints().map_err(|e| format!("`dims`: {e}"))?;
                TensordotDims::Pairs(x, y)
            }
            Some(other) => {
                return Err(format!(
                    "`dims={other}` is not supported (an int or a pair of dim lists)"
                ))
            }
        };
        one(ops::tensordot(b.tensor("a")?, b.tensor("b")?, &dims))
    });
}

#[cfg(test)]
mod tests {
    use super::super::table;
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn every_area_op_and_aten_name_is_served() {
        let table = table();
        for (op, call) in [
            ("RNNCell", "torch.rnn_tanh_cell"),
            ("RNNCell", "torch.rnn_relu_cell"),
            ("GRUCell", "torch.gru_cell"),
            ("LSTMCell", "torch.lstm_cell"),
            (
                "multilabel_margin_loss",
                "torch.nn.functional.multilabel_margin_loss",
            ),
            (
                "multilabel_margin_loss_forward",
                "torch.nn.functional.multilabel_margin_loss",
            ),
            ("ctc_loss", "torch.nn.functional.ctc_loss"),
            ("cross", "torch.linalg.cross"),
            ("tensordot", "torch.tensordot"),
        ] {
            assert!(table.supports(op, call), "{op} via {call}");
        }
    }

    #[test]
    fn loss_signatures_follow_python() {
        let x = t(&[-1.0, -2.0], &[2]);
        let p = t(&[0.5, 0.5], &[2]);
        let e = run(
            "torch.nn.functional.kl_div",
            "kl_div",
            &[x.clone(), p.clone()],
            &kw(vec![("reduce", Arg::Bool(false))]),
        )
        .unwrap_err();
        assert_eq!(e, "`reduce=false` is not supported");
        // batchmean of a 1-D input divides by its first size.
        let y = flat_values(run(
            "torch.nn.functional.kl_div",
            "kl_div",
            &[x.clone(), p.clone()],
            &kw(vec![("reduction", Arg::Str("batchmean".into()))]),
        ));
        let want = (0.5 * (0.5f64.ln() + 1.0) + 0.5 * (0.5f64.ln() + 2.0)) / 2.0;
        assert!((y[0] - want).abs() < 1e-12);
        let e = run(
            "torch.nn.functional.kl_div",
            "kl_div",
            &[x.clone(), p.clone()],
            &kw(vec![("reduction", Arg::Str("avg".into()))]),
        )
        .unwrap_err();
        assert!(e.contains("avg is not a valid value for reduction"), "{e}");
        // margin is the third positional parameter of hinge_embedding_loss.
        let s = t(&[1.0, -1.0], &[2]);
        let y = flat_values(run(
            "torch.nn.functional.hinge_embedding_loss",
            "hinge_embedding_loss",
            &[x.clone(), s, Arg::Float(0.5)],
            &kw(vec![("reduction", Arg::Str("none".into()))]),
        ));
        assert_eq!(y, [-1.0, 2.5]);
    }

    #[test]
    fn cells_tensordot_and_cdist_arguments() {
        let x = t(&[1.0, 2.0], &[1, 2]);
        let h = t(&[0.5], &[1, 1]);
        let e = run(
            "torch.lstm_cell",
            "LSTMCell",
            &[
                x.clone(),
                Arg::List(vec![h.clone()]),
                t(&[0.0; 8], &[4, 2]),
                t(&[0.0; 4], &[4, 1]),
            ],
            &K::default(),
        )
        .unwrap_err();
        assert!(e.contains("two hidden states"), "{e}");
        let out = run(
            "torch.lstm_cell",
            "LSTMCell",
            &[
                x,
                Arg::List(vec![h.clone(), h]),
                t(&[0.0; 8], &[4, 2]),
                t(&[0.0; 4], &[4, 1]),
            ],
            &K::default(),
        )
        .unwrap();
        assert!(out.is_list());

        let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
        let pairs = Arg::List(vec![
            Arg::List(vec![Arg::Int(1)]),
            Arg::List(vec![Arg::Int(0)]),
        ]);
        let y1 = flat_values(run(
            "torch.tensordot",
            "tensordot",
            &[a.clone(), b.clone()],
            &kw(vec![("dims", Arg::Int(1))]),
        ));
        let y2 = flat_values(run(
            "torch.tensordot",
            "tensordot",
            &[a.clone(), b.clone()],
            &kw(vec![("dims", pairs)]),
        ));
        assert_eq!(y1, [4.0, 5.0, 10.0, 11.0]);
        assert_eq!(y1, y2);

        let e = run(
            "torch.cdist",
            "cdist",
            &[a.clone(), a],
            &kw(vec![("compute_mode", Arg::Str("fast".into()))]),
        )
        .unwrap_err();
        assert!(e.contains("not a valid value for compute_mode"), "{e}");
    }
}
