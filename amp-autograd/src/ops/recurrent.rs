//! Recurrent layers over whole sequences, as `torch.lstm` and `torch.gru` run them:
//! several layers, one or two directions, sequence-first or batch-first, built from the
//! cells of [`super::rnn`] (so autocast treats every step as it treats the cells, and
//! the first and second derivatives are the cells' own).
//!
//! Parameters are PyTorch's flat list: for each layer, for each direction, `w_ih`,
//! `w_hh` and (with biases) `b_ih`, `b_hh`; a second layer's input size is
//! `hidden * directions`.

use amp_tensor::Generator;

use super::check::refused;
use super::nn::dropout;
use super::rnn::{gru_cell, lstm_cell};
use super::shape::{cat, select, stack, transpose};
use crate::{Error, Result, Tensor};

/// The shape of a recurrent layer stack (`torch.lstm`/`torch.gru`'s arguments after the
/// parameters); `Default` is one unidirectional, sequence-first layer with biases and no
/// dropout.
pub struct Recurrent<'a> {
    /// Whether `params` holds `b_ih`, `b_hh` for each layer and direction.
    pub has_biases: bool,
    /// Stacked layers.
    pub num_layers: usize,
    /// Dropout on the outputs of every layer but the last, when `train`.
    pub dropout: f64,
    /// Training mode (the dropout applies).
    pub train: bool,
    /// A second pass over the sequence in reverse, its outputs concatenated.
    pub bidirectional: bool,
    /// `[N, T, I]` input and output instead of `[T, N, I]`.
    pub batch_first: bool,
    /// The random generator of the dropout (needed when it applies).
    pub generator: Option<&'a mut Generator>,
}

impl Default for Recurrent<'_> {
    fn default() -> Self {
        Recurrent {
            has_biases: true,
            num_layers: 1,
            dropout: 0.0,
            train: false,
            bidirectional: false,
            batch_first: false,
            generator: None,
        }
    }
}

/// One step of a cell: the input `[N, I]`, the state (`h` first), the layer's weights;
/// returns the new state.
type Step<'s> = dyn Fn(&Tensor, &[Tensor], &[Tensor]) -> Result<Vec<Tensor>> + 's;

/// Runs the layers; `hx` are the initial states, each `[layers·directions, N, H]`.
/// Returns the last layer's outputs and the final states, stacked as `hx`.
fn run_layers(
    op: &'static str,
    input: &Tensor,
    hx: &[&Tensor],
    params: &[Tensor],
    o: Recurrent<'_>,
    step: &Step<'_>,
) -> Result<(Tensor, Vec<Tensor>)> {
    if input.rank() != 3 {
        return Err(refused(
            op,
            format!(
                "{op}: Expected input to be 3-D (batched), got {}-D",
                input.rank()
            ),
        ));
    }
    let dirs = if o.bidirectional { 2 } else { 1 };
    let per = if o.has_biases { 4 } else { 2 };
    if o.num_layers == 0 || params.len() != o.num_layers * dirs * per {
        return Err(refused(
            op,
            format!(
                "{op}: expected {} parameter tensors for {} layers, {dirs} direction(s){}, got {}",
                o.num_layers * dirs * per,
                o.num_layers,
                if o.has_biases { " with biases" } else { "" },
                params.len()
            ),
        ));
    }
    for h in hx {
        if h.rank() != 3 || h.dims()[0] != o.num_layers * dirs {
            return Err(refused(
                op,
                format!(
                    "{op}: Expected hidden size ({}, N, H), got {:?}",
                    o.num_layers * dirs,
                    h.dims()
                ),
            ));
        }
    }
    let mut x = if o.batch_first {
        transpose(input, 0, 1)?
    } else {
        input.clone()
    };
    let t_len = x.dims()[0];
    let mut finals: Vec<Vec<Tensor>> = vec![Vec::new(); hx.len()];
    let mut generator = o.generator;
    for layer in 0..o.num_layers {
        let mut outs = Vec::with_capacity(dirs);
        for d in 0..dirs {
            let idx = layer * dirs + d;
            let w = &params[idx * per..(idx + 1) * per];
            let mut state: Vec<Tensor> = hx
                .iter()
                .map(|h| select(h, 0, idx as i64))
                .collect::<Result<_>>()?;
            let mut ys: Vec<Option<Tensor>> = vec![None; t_len];
            for s in 0..t_len {
                // The reverse direction reads the sequence from its end.
                let t = if d == 0 { s } else { t_len - 1 - s };
                state = step(&select(&x, 0, t as i64)?, &state, w)?;
                ys[t] = Some(state[0].clone());
            }
            let ys: Vec<Tensor> = ys.into_iter().flatten().collect();
            outs.push(stack(&ys, 0)?);
            for (f, s) in finals.iter_mut().zip(state) {
                f.push(s);
            }
        }
        x = if dirs == 2 {
            cat(&outs, 2)?
        } else {
            outs.remove(0)
        };
        if layer + 1 < o.num_layers && o.train && o.dropout > 0.0 {
            let Some(gen) = generator.as_deref_mut() else {
                return Err(Error::invalid(
                    op,
                    "dropout between layers in training needs a generator (Recurrent::generator)",
                ));
            };
            x = dropout(&x, o.dropout, true, gen)?;
        }
    }
    let out = if o.batch_first {
        transpose(&x, 0, 1)?
    } else {
        x
    };
    let finals = finals.iter().map(|f| stack(f, 0)).collect::<Result<_>>()?;
    Ok((out, finals))
}

/// The weights of one layer and direction, as the cells take them.
fn weights(w: &[Tensor]) -> (&Tensor, &Tensor, Option<&Tensor>, Option<&Tensor>) {
    (&w[0], &w[1], w.get(2), w.get(3))
}

/// `torch.lstm`: returns `(output, h_n, c_n)`; `output` is `[T, N, H·directions]`
/// (`[N, T, ..]` batch-first), `h_n`/`c_n` are `[layers·directions, N, H]`.
///
/// ```
/// use amp_autograd::{ops, Tensor};
/// use amp_tensor::DType;
/// # fn main() -> amp_autograd::Result<()> {
/// let (t, n, i, h) = (3, 2, 4, 5);
/// let x = Tensor::ones([t, n, i], DType::F32);
/// let h0 = Tensor::zeros([1, n, h], DType::F32);
/// let params = vec![
///     Tensor::full([4 * h, i], 0.1, DType::F32),
///     Tensor::full([4 * h, h], 0.1, DType::F32),
/// ];
/// let no_bias = ops::Recurrent { has_biases: false, ..Default::default() };
/// let (y, hn, cn) = ops::lstm(&x, (&h0, &h0), &params, no_bias)?;
/// assert_eq!((y.dims(), hn.dims(), cn.dims()), (&[3, 2, 5][..], &[1, 2, 5][..], &[1, 2, 5][..]));
/// # Ok(())
/// # }
/// ```
pub fn lstm(
    input: &Tensor,
    hx: (&Tensor, &Tensor),
    params: &[Tensor],
    opts: Recurrent<'_>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let step = |x: &Tensor, s: &[Tensor], w: &[Tensor]| -> Result<Vec<Tensor>> {
        let (w_ih, w_hh, b_ih, b_hh) = weights(w);
        let (h, c) = lstm_cell(x, (&s[0], &s[1]), w_ih, w_hh, b_ih, b_hh)?;
        Ok(vec![h, c])
    };
    let (out, mut f) = run_layers("lstm", input, &[hx.0, hx.1], params, opts, &step)?;
    let c = f.pop().expect("two states");
    let h = f.pop().expect("two states");
    Ok((out, h, c))
}

/// `torch.gru`: returns `(output, h_n)`, shaped as [`lstm`]'s.
pub fn gru(
    input: &Tensor,
    hx: &Tensor,
    params: &[Tensor],
    opts: Recurrent<'_>,
) -> Result<(Tensor, Tensor)> {
    let step = |x: &Tensor, s: &[Tensor], w: &[Tensor]| -> Result<Vec<Tensor>> {
        let (w_ih, w_hh, b_ih, b_hh) = weights(w);
        Ok(vec![gru_cell(x, &s[0], w_ih, w_hh, b_ih, b_hh)?])
    };
    let (out, mut f) = run_layers("gru", input, &[hx], params, opts, &step)?;
    Ok((out, f.pop().expect("one state")))
}
