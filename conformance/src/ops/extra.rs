//! Op-table entries: Recurrent cells, the remaining losses, distances, norms and promote-list ops.

use amp::autograd::ops::{self, TensordotDims};
use amp::autograd::{Reduction, Tensor};

use super::{Bound, BuiltinTensor, FromArg, IntoOutput, Out, A, R};
use crate::args::Arg;
use crate::optable::OpTable;

/// `torch.rnn_tanh_cell`-style calls.
const CELL: &str = "input, hx, w_ih, w_hh, b_ih=None, b_hh=None";

/// `torch.lstm`/`torch.gru` (the input-first overload).
const SEQ: &str = "input, hx, params, has_biases=True, num_layers, dropout=0.0, train=False, \
                   bidirectional=False, batch_first=False";

/// Lengths given as a list, a tuple, one int, or an integer tensor (`input_lengths` of
/// `ctc_loss`).
struct Lengths(Vec<usize>);

impl<'a> FromArg<'a> for Lengths {
    fn from_arg(name: &str, arg: Option<&'a A>) -> Result<Self, String> {
        let v: Vec<i64> = match arg {
            Some(Arg::Tensor(t)) if t.dtype().is_floating_point() => {
                return Err(format!("`{name}`: expected an integer tensor"))
            }
            Some(Arg::Tensor(t)) => t.to_vec_f64().into_iter().map(|x| x as i64).collect(),
            a => Vec::from_arg(name, a)?,
        };
        v.into_iter()
            .map(|x| usize::try_from(x).map_err(|_| format!("`{name}`: negative length {x}")))
            .collect::<Result<_, _>>()
            .map(Lengths)
    }
}

/// `ctc_loss` with its lengths read as [`Lengths`].
fn ctc_loss(
    lp: &Tensor,
    tg: &Tensor,
    il: Lengths,
    tl: Lengths,
    blank: usize,
    r: Reduction,
    z: bool,
) -> Out {
    ops::ctc_loss(lp, tg, &il.0, &tl.0, blank, r, z)
}

fn index_put(x: &Tensor, indices: Vec<Tensor>, values: &Tensor, accumulate: bool) -> Out {
    ops::index_put(x, &indices, values, accumulate)
}

/// The two hidden states `(h, c)` of an LSTM, given as a list.
fn hidden_pair<'t>(hx: &'t [Tensor], op: &str) -> Result<(&'t Tensor, &'t Tensor), String> {
    match hx {
        [h, c] => Ok((h, c)),
        _ => Err(format!(
            "`hx`: {op} expects two hidden states (h, c), got {}",
            hx.len()
        )),
    }
}

/// The layer shape of a bound `torch.lstm`/`torch.gru` call (dropout only when it is
/// not random: 0, or not training).
fn recurrent<'a>(b: &Bound<'_>) -> Result<ops::Recurrent<'a>, String> {
    let layers: i64 = b.arg("num_layers")?;
    let o = ops::Recurrent {
        has_biases: b.arg("has_biases")?,
        num_layers: usize::try_from(layers).map_err(|_| format!("`num_layers`: {layers}"))?,
        dropout: b.arg("dropout")?,
        train: b.arg("train")?,
        bidirectional: b.arg("bidirectional")?,
        batch_first: b.arg("batch_first")?,
        generator: None,
    };
    if o.train && o.dropout > 0.0 && o.num_layers > 1 {
        return Err("dropout between layers in training is random in PyTorch".to_string());
    }
    Ok(o)
}

/// `dims` of `torch.tensordot`: a count, or a pair of dim lists.
fn tensordot_dims(b: &Bound<'_>) -> Result<TensordotDims, String> {
    Ok(match b.get("dims") {
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
    })
}

/// `torch.nn.functional.multi_head_attention_forward`, with the parameters the workspace
/// does not support marked `!`.
const MHA: &str = "query, key, value, embed_dim_to_check, num_heads, in_proj_weight, \
                   in_proj_bias, !bias_k, !bias_v, add_zero_attn=False, dropout_p=0.0, \
                   out_proj_weight, out_proj_bias, training=True, !key_padding_mask=None, \
                   need_weights=True, attn_mask=None, use_separate_proj_weight=False, \
                   !q_proj_weight=None, !k_proj_weight=None, !v_proj_weight=None, \
                   !static_k=None, !static_v=None, average_attn_weights=True, is_causal=False";

/// `torch.nn.functional.scaled_dot_product_attention`.
const SDPA: &str = "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None";

fn attention(b: &Bound<'_>) -> R {
    if b.arg::<f64>("dropout_p")? != 0.0 {
        return Err("dropout_p other than 0 is random in PyTorch".to_string());
    }
    let attention = ops::Attention {
        attn_mask: b.arg("attn_mask")?,
        is_causal: b.arg("is_causal")?,
        scale: b.arg("scale")?,
        ..Default::default()
    };
    let (q, k, v) = (b.arg("query")?, b.arg("key")?, b.arg("value")?);
    ops::scaled_dot_product_attention(q, k, v, attention).into_output()
}

fn multi_head_attention(b: &Bound<'_>) -> R {
    if b.arg("add_zero_attn")? || b.arg("need_weights")? || b.arg("use_separate_proj_weight")? {
        return Err(
            "add_zero_attn, need_weights and separate projections are not supported".to_string(),
        );
    }
    if b.arg::<f64>("dropout_p")? != 0.0 && b.arg("training")? {
        return Err("dropout in training is random in PyTorch".to_string());
    }
    let query: &Tensor = b.arg("query")?;
    let e: i64 = b.arg("embed_dim_to_check")?;
    if usize::try_from(e).ok() != query.dims().last().copied() {
        return Err(format!(
            "`embed_dim_to_check` {e} is not the query's embedding size"
        ));
    }
    let heads: i64 = b.arg("num_heads")?;
    let heads = usize::try_from(heads).map_err(|_| format!("`num_heads`: {heads}"))?;
    let out = ops::multi_head_attention_forward(
        query,
        b.arg("key")?,
        b.arg("value")?,
        heads,
        ops::MultiHeadWeights {
            in_proj_weight: b.arg("in_proj_weight")?,
            in_proj_bias: b.arg("in_proj_bias")?,
            out_proj_weight: b.arg("out_proj_weight")?,
            out_proj_bias: b.arg("out_proj_bias")?,
        },
        ops::Attention {
            attn_mask: b.arg("attn_mask")?,
            is_causal: b.arg("is_causal")?,
            ..Default::default()
        },
    );
    out.map(|t| vec![t]).into_output()
}

/// Adds this area's entries to the table.
pub(super) fn register(t: &mut OpTable<BuiltinTensor>) {
    // ----- recurrent cells ------------------------------------------------------------------
    calls! { t;
        "torch.rnn_tanh_cell": CELL => ops::rnn_tanh_cell;
        "torch.rnn_relu_cell": CELL => ops::rnn_relu_cell;
        "torch.gru_cell": CELL => ops::gru_cell;
    }
    t.op("torch.lstm_cell", CELL, |b| {
        let hx: Vec<Tensor> = b.arg("hx")?;
        let hx = hidden_pair(&hx, "lstm_cell")?;
        let (input, w_ih, w_hh) = (b.arg("input")?, b.arg("w_ih")?, b.arg("w_hh")?);
        ops::lstm_cell(input, hx, w_ih, w_hh, b.arg("b_ih")?, b.arg("b_hh")?).into_output()
    });

    // ----- recurrent layers over sequences ---------------------------------------------------
    t.op("torch.lstm", SEQ, |b| {
        let hx: Vec<Tensor> = b.arg("hx")?;
        let hx = hidden_pair(&hx, "lstm")?;
        let params: Vec<Tensor> = b.arg("params")?;
        ops::lstm(b.arg("input")?, hx, &params, recurrent(b)?).into_output()
    });
    t.op("torch.gru", SEQ, |b| {
        let params: Vec<Tensor> = b.arg("params")?;
        ops::gru(b.arg("input")?, b.arg("hx")?, &params, recurrent(b)?).into_output()
    });

    // ----- losses -------------------------------------------------------------------------
    let poisson = "input, target, log_input=True, full=False, !size_average=None, eps=1e-8, \
                   !reduce=None, reduction='mean'";
    let ctc = "log_probs, targets, input_lengths, target_lengths, blank=0, reduction='mean', \
               zero_infinity=False";
    let kl_div = loss!("input", "target"; "log_target=False");
    let hinge = loss!("input", "target", "margin=1.0");
    let margin = loss!("input", "target");
    let multi_margin = loss!("input", "target", "p=1", "margin=1.0", "weight=None");
    let ranking = loss!("input1", "input2", "target", "margin=0.0");
    let triplet = loss!(
        "anchor",
        "positive",
        "negative",
        "margin=1.0",
        "p=2.0",
        "eps=1e-6",
        "swap=False"
    );
    calls! { t;
        "torch.nn.functional.kl_div": kl_div => ops::kl_div;
        "torch.nn.functional.poisson_nll_loss": poisson => ops::poisson_nll_loss;
        "torch.nn.functional.hinge_embedding_loss": hinge => ops::hinge_embedding_loss;
        "torch.nn.functional.margin_ranking_loss": ranking => ops::margin_ranking_loss;
        "torch.nn.functional.soft_margin_loss": margin => ops::soft_margin_loss;
        // Serves `multilabel_margin_loss` and the ATen op behind it,
        // `multilabel_margin_loss_forward`.
        "torch.nn.functional.multilabel_margin_loss": margin => ops::multilabel_margin_loss;
        "torch.nn.functional.multi_margin_loss": multi_margin => ops::multi_margin_loss;
        "torch.nn.functional.cosine_embedding_loss": ranking => ops::cosine_embedding_loss;
        "torch.nn.functional.triplet_margin_loss": triplet => ops::triplet_margin_loss;
        "torch.nn.functional.ctc_loss": ctc => ctc_loss;
    }

    // ----- norms, distances, other nn functions ---------------------------------------------
    t.op(
        "torch.nn.functional.scaled_dot_product_attention",
        SDPA,
        attention,
    );
    t.op(
        "torch.nn.functional.multi_head_attention_forward",
        MHA,
        multi_head_attention,
    );
    let batch_norm = "input, running_mean, running_var, weight=None, bias=None, training=False, \
                      momentum=0.1, eps=1e-5";
    let group_norm = "input, num_groups, weight=None, bias=None, eps=1e-5";
    let cdist = "x1, x2, p=2.0, compute_mode='use_mm_for_euclid_dist_if_necessary'";
    let normalize = "input, p=2.0, dim=1, eps=1e-12, !out=None";
    let pairwise = "x1, x2, p=2.0, eps=1e-6, keepdim=False";
    calls! { t;
        "torch.nn.functional.prelu": "input, weight" => ops::prelu;
        "torch.nn.functional.bilinear": "input1, input2, weight, bias=None" => ops::bilinear;
        "torch.nn.functional.group_norm": group_norm => ops::group_norm;
        "torch.nn.functional.batch_norm": batch_norm => ops::batch_norm;
        "torch.nn.functional.normalize": normalize => ops::normalize;
        "torch.nn.functional.cosine_similarity": "x1, x2, dim=1, eps=1e-8"
            => ops::cosine_similarity;
        "torch.nn.functional.pairwise_distance": pairwise => ops::pairwise_distance;
        "torch.cdist": cdist => ops::cdist;
        "torch.nn.functional.pdist": "input, p=2" => ops::pdist;
        "torch.dist": "input, other, p=2" => ops::dist;
        "torch.renorm": "input, p, dim, maxnorm, *, !out=None" => ops::renorm;
        // ----- promote-list ops --------------------------------------------------------------
        "torch.linalg.cross": "input, other, *, dim=-1, !out=None" => ops::cross;
        "torch.cross": "input, other, dim=None, *, !out=None" => ops::cross_default;
        "torch.index_put": "input, indices, values, accumulate=False" => index_put;
    }
    t.op("torch.tensordot", "a, b, dims=2, !out=None", |b| {
        ops::tensordot(b.arg("a")?, b.arg("b")?, &tensordot_dims(b)?).into_output()
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
        let kl_div = || call("torch.nn.functional.kl_div").arg(&x).arg(&p);
        let e = kl_div().kw("reduce", false).err();
        assert_eq!(e, "`reduce=false` is not supported");
        // batchmean of a 1-D input divides by its first size.
        let y = kl_div().kw("reduction", "batchmean").flat_values();
        let want = (0.5 * (0.5f64.ln() + 1.0) + 0.5 * (0.5f64.ln() + 2.0)) / 2.0;
        assert!((y[0] - want).abs() < 1e-12);
        let e = kl_div().kw("reduction", "avg").err();
        assert!(e.contains("avg is not a valid value for reduction"), "{e}");
        // margin is the third positional parameter of hinge_embedding_loss.
        let hinge = call("torch.nn.functional.hinge_embedding_loss");
        let s = t(&[1.0, -1.0], &[2]);
        let y = hinge
            .arg(&x)
            .arg(s)
            .arg(0.5)
            .kw("reduction", "none")
            .flat_values();
        assert_eq!(y, [-1.0, 2.5]);
    }

    #[test]
    fn cells_tensordot_and_cdist_arguments() {
        let x = t(&[1.0, 2.0], &[1, 2]);
        let h = t(&[0.5], &[1, 1]);
        let cell = |hx: Vec<A>| {
            let (w_ih, w_hh) = (t(&[0.0; 8], &[4, 2]), t(&[0.0; 4], &[4, 1]));
            call("torch.lstm_cell")
                .op("LSTMCell")
                .arg(&x)
                .arg(Arg::List(hx))
                .arg(w_ih)
                .arg(w_hh)
        };
        let e = cell(vec![h.clone()]).err();
        assert!(e.contains("two hidden states"), "{e}");
        assert!(cell(vec![h.clone(), h]).run().unwrap().is_list());

        let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let b = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
        let tensordot = || call("torch.tensordot").arg(&a).arg(&b);
        let y1 = tensordot().kw("dims", 1).flat_values();
        let y2 = tensordot()
            .kw("dims", Arg::List(vec![ints(&[1]), ints(&[0])]))
            .flat_values();
        assert_eq!(y1, [4.0, 5.0, 10.0, 11.0]);
        assert_eq!(y1, y2);

        let e = call("torch.cdist")
            .arg(&a)
            .arg(&a)
            .kw("compute_mode", "fast")
            .err();
        assert!(e.contains("not a valid value for compute_mode"), "{e}");
    }
}
