//! Recurrent cells as PyTorch defines them: `rnn_tanh_cell` / `rnn_relu_cell` (listed as
//! `RNNCell`), `gru_cell` (`GRUCell`) and `lstm_cell` (`LSTMCell`).
//!
//! Each cell enters the dispatch point once under its listed name (so autocast casts the
//! cell's inputs as the policy says) and then runs its body, built from differentiable
//! ops (`linear`, `sigmoid`, `tanh`, `narrow`). The cells are transparent ops
//! ([`OpName::new`]): where a list gives the cell a policy (the CUDA lists), the body runs
//! with the dispatch layer excluded, in the dtypes the cell was entered with, as
//! PyTorch's autocast wrapper does; where none does (CPU), the body's ops are dispatched
//! again, so autocast casts its `linear`s, as it does inside PyTorch's CPU cells, which
//! are composites.

use super::check::{refused, size};
use super::enter_vec;
use super::matmul::linear;
use super::names::{GRU_CELL, LSTM_CELL, RNN_CELL};
use super::pointwise::{add, mul, relu, sigmoid, sub, tanh};
use super::shape::narrow;
use crate::dispatch::{BodyGuard, OpName};
use crate::{Result, Tensor};

/// The nonlinearity of a plain RNN cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RnnNonlinearity {
    /// `tanh` (`torch.rnn_tanh_cell`, the default of `nn.RNNCell`).
    #[default]
    Tanh,
    /// `relu` (`torch.rnn_relu_cell`).
    Relu,
}

/// A cell's arguments after the dispatch point: input, hidden states, weights, biases.
struct CellArgs {
    input: Tensor,
    hx: Vec<Tensor>,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Option<Tensor>,
    b_hh: Option<Tensor>,
    /// Keeps the cell's body out of the dispatch layer until the arguments drop.
    _body: BodyGuard,
}

/// Enters the dispatch point under `op` with every tensor argument of the cell, and
/// checks the shapes (`gates` gate blocks of `hidden` rows in the weights).
#[allow(clippy::too_many_arguments)]
fn enter_cell(
    op: &'static OpName,
    input: &Tensor,
    hx: &[&Tensor],
    w_ih: &Tensor,
    w_hh: &Tensor,
    b_ih: Option<&Tensor>,
    b_hh: Option<&Tensor>,
    gates: usize,
) -> Result<CellArgs> {
    let name = op.name();
    let mut args: Vec<&Tensor> = vec![input];
    args.extend_from_slice(hx);
    args.push(w_ih);
    args.push(w_hh);
    args.extend(b_ih);
    args.extend(b_hh);
    let (a, body) = enter_vec(op, &args)?;
    let mut a = a.into_iter();
    let mut next = || a.next().expect("as many tensors as entered");
    let input = next();
    let hx: Vec<Tensor> = hx.iter().map(|_| next()).collect();
    let w_ih = next();
    let w_hh = next();
    let b_ih = b_ih.map(|_| next());
    let b_hh = b_hh.map(|_| next());

    check_cell(name, &input, &hx, &w_ih, &w_hh, gates)?;
    Ok(CellArgs {
        input,
        hx,
        w_ih,
        w_hh,
        b_ih,
        b_hh,
        _body: body,
    })
}

/// PyTorch's checks of a cell's arguments, with its texts, in the order each cell makes
/// them (the plain cell checks the weights first, the LSTM cell the input first, the GRU
/// cell the hidden state before the weights). Biases are not checked here: the gate
/// projections refuse a bias that does not expand to their output, as PyTorch's do.
/// Unlike ATen's cells, an unbatched (1-D) input with 1-D states is accepted, as the
/// `nn` modules accept it.
fn check_cell(
    name: &'static str,
    input: &Tensor,
    hx: &[Tensor],
    w_ih: &Tensor,
    w_hh: &Tensor,
    gates: usize,
) -> Result<()> {
    let unbatched = input.rank() == 1 && hx.iter().all(|h| h.rank() == 1);
    if input.rank() != 2 && !unbatched {
        return Err(refused(
            name,
            format!(
                "Expected 2D input (batch x feature), but got {}D input",
                input.rank()
            ),
        ));
    }
    let want_rank = input.rank();
    for (i, h) in hx.iter().enumerate() {
        if h.rank() != want_rank {
            return Err(refused(
                name,
                format!(
                    "Expected {want_rank}D hidden{i} (batch x hidden_size), but got {}D tensor",
                    h.rank()
                ),
            ));
        }
    }
    let last = want_rank - 1;
    let check_input = || -> Result<()> {
        let expected = size(w_ih, 1)?;
        let got = input.dims()[last];
        if got != expected {
            return Err(refused(
                name,
                format!("input has inconsistent input_size: got {got} expected {expected}"),
            ));
        }
        Ok(())
    };
    let check_hidden = || -> Result<()> {
        let hidden = size(w_hh, 1)?;
        for (i, h) in hx.iter().enumerate() {
            if want_rank == 2 && h.dims()[0] != input.dims()[0] {
                return Err(refused(
                    name,
                    format!(
                        "Input batch size {} doesn't match hidden{i} batch size {}",
                        input.dims()[0],
                        h.dims()[0]
                    ),
                ));
            }
            if h.dims()[last] != hidden {
                return Err(refused(
                    name,
                    format!(
                        "hidden{i} has inconsistent hidden_size: got {}, expected {hidden}",
                        h.dims()[last]
                    ),
                ));
            }
        }
        Ok(())
    };
    let check_weights = || -> Result<()> {
        let hidden = size(w_hh, 1)?;
        for (w, label) in [(w_ih, "weight_ih"), (w_hh, "weight_hh")] {
            let rows = size(w, 0)?;
            if rows != gates * hidden {
                return Err(refused(
                    name,
                    format!(
                        "{label} first dim must be {gates} * hidden_size = {}, but got {rows}",
                        gates * hidden
                    ),
                ));
            }
        }
        if w_ih.rank() != 2 || w_hh.rank() != 2 {
            return Err(refused(name, format!("{name}: weights must be 2-D")));
        }
        Ok(())
    };
    match gates {
        1 => {
            check_weights()?;
            check_input()?;
            check_hidden()
        }
        4 => {
            check_input()?;
            check_weights()?;
            check_hidden()
        }
        _ => {
            check_input()?;
            check_hidden()?;
            check_weights()
        }
    }
}

/// The two gate projections `input @ w_ih.T + b_ih` and `hx @ w_hh.T + b_hh`.
fn projections(a: &CellArgs, h: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok((
        linear(&a.input, &a.w_ih, a.b_ih.as_ref())?,
        linear(h, &a.w_hh, a.b_hh.as_ref())?,
    ))
}

/// Gate block `k` (of `hidden` columns) of `gates` along the last dim.
fn chunk(gates: &Tensor, k: usize, hidden: usize) -> Result<Tensor> {
    narrow(gates, gates.rank() as i64 - 1, k * hidden, hidden)
}

/// One step of an Elman RNN: `act(input @ w_ih.T + b_ih + hx @ w_hh.T + b_hh)` with
/// `act` tanh or relu (`torch.rnn_tanh_cell` / `torch.rnn_relu_cell`, listed as
/// `RNNCell`). `input` is `[batch, input_size]` or `[input_size]`, `hx` the matching
/// `[batch, hidden]`, `w_ih` `[hidden, input_size]`, `w_hh` `[hidden, hidden]`.
pub fn rnn_cell(
    input: &Tensor,
    hx: &Tensor,
    w_ih: &Tensor,
    w_hh: &Tensor,
    b_ih: Option<&Tensor>,
    b_hh: Option<&Tensor>,
    nonlinearity: RnnNonlinearity,
) -> Result<Tensor> {
    let a = enter_cell(&RNN_CELL, input, &[hx], w_ih, w_hh, b_ih, b_hh, 1)?;
    let (gi, gh) = projections(&a, &a.hx[0])?;
    let pre = add(&gi, &gh)?;
    match nonlinearity {
        RnnNonlinearity::Tanh => tanh(&pre),
        RnnNonlinearity::Relu => relu(&pre),
    }
}

/// `torch.rnn_tanh_cell` and `torch.rnn_relu_cell`: [`rnn_cell`] with one nonlinearity.
macro_rules! rnn_cell_fns {
    ($($(#[$doc:meta])* $fname:ident = $nonlinearity:ident;)*) => {$(
        $(#[$doc])*
        pub fn $fname(
            input: &Tensor, hx: &Tensor, w_ih: &Tensor, w_hh: &Tensor,
            b_ih: Option<&Tensor>, b_hh: Option<&Tensor>,
        ) -> Result<Tensor> {
            rnn_cell(input, hx, w_ih, w_hh, b_ih, b_hh, RnnNonlinearity::$nonlinearity)
        }
    )*};
}

rnn_cell_fns! {
    /// `torch.rnn_tanh_cell`: [`rnn_cell`] with tanh.
    rnn_tanh_cell = Tanh;
    /// `torch.rnn_relu_cell`: [`rnn_cell`] with relu.
    rnn_relu_cell = Relu;
}

/// One GRU step (`torch.gru_cell`, listed as `GRUCell`), gates ordered r, z, n as in
/// PyTorch's weights (`w_ih` `[3 * hidden, input_size]`, `w_hh` `[3 * hidden, hidden]`):
///
/// ```text
/// r = σ(x W_ir + b_ir + h W_hr + b_hr)
/// z = σ(x W_iz + b_iz + h W_hz + b_hz)
/// n = tanh(x W_in + b_in + r ⊙ (h W_hn + b_hn))
/// h' = n + z ⊙ (h - n)
/// ```
pub fn gru_cell(
    input: &Tensor,
    hx: &Tensor,
    w_ih: &Tensor,
    w_hh: &Tensor,
    b_ih: Option<&Tensor>,
    b_hh: Option<&Tensor>,
) -> Result<Tensor> {
    let a = enter_cell(&GRU_CELL, input, &[hx], w_ih, w_hh, b_ih, b_hh, 3)?;
    let h = &a.hx[0];
    let hidden = a.w_hh.dims()[1];
    let (gi, gh) = projections(&a, h)?;
    let r = sigmoid(&add(&chunk(&gi, 0, hidden)?, &chunk(&gh, 0, hidden)?)?)?;
    let z = sigmoid(&add(&chunk(&gi, 1, hidden)?, &chunk(&gh, 1, hidden)?)?)?;
    let n = tanh(&add(
        &chunk(&gi, 2, hidden)?,
        &mul(&r, &chunk(&gh, 2, hidden)?)?,
    )?)?;
    add(&n, &mul(&z, &sub(h, &n)?)?)
}

/// One LSTM step (`torch.lstm_cell`, listed as `LSTMCell`) from `(hx, cx)`, gates
/// ordered i, f, g, o as in PyTorch's weights (`[4 * hidden, ...]`); returns `(h', c')`:
///
/// ```text
/// i, f, g, o = σ, σ, tanh, σ of (x W_ih^T + b_ih + h W_hh^T + b_hh) split in 4
/// c' = f ⊙ c + i ⊙ g,   h' = o ⊙ tanh(c')
/// ```
pub fn lstm_cell(
    input: &Tensor,
    hx: (&Tensor, &Tensor),
    w_ih: &Tensor,
    w_hh: &Tensor,
    b_ih: Option<&Tensor>,
    b_hh: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let a = enter_cell(&LSTM_CELL, input, &[hx.0, hx.1], w_ih, w_hh, b_ih, b_hh, 4)?;
    let (h, c) = (&a.hx[0], &a.hx[1]);
    let hidden = a.w_hh.dims()[1];
    let (gi, gh) = projections(&a, h)?;
    let gates = add(&gi, &gh)?;
    let i = sigmoid(&chunk(&gates, 0, hidden)?)?;
    let f = sigmoid(&chunk(&gates, 1, hidden)?)?;
    let g = tanh(&chunk(&gates, 2, hidden)?)?;
    let o = sigmoid(&chunk(&gates, 3, hidden)?)?;
    let cy = add(&mul(&f, c)?, &mul(&i, &g)?)?;
    let hy = mul(&o, &tanh(&cy)?)?;
    Ok((hy, cy))
}
