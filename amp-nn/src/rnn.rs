//! Recurrent cells: RNNCell, GRUCell, LSTMCell (PyTorch's parameters, names and default
//! initialisation: every parameter uniform in `[-1/sqrt(hidden), 1/sqrt(hidden))`).

use amp_autograd::ops::{self, RnnNonlinearity};
use amp_autograd::{Result, Tensor};
use amp_tensor::Generator;

use crate::init::uniform;
use crate::module::Module;

/// The parameters every cell has: `weight_ih` `[gates * hidden, input]`, `weight_hh`
/// `[gates * hidden, hidden]` and optional `bias_ih`, `bias_hh` `[gates * hidden]`.
pub struct CellParams {
    /// Input-to-hidden weights.
    pub weight_ih: Tensor,
    /// Hidden-to-hidden weights.
    pub weight_hh: Tensor,
    /// Input-to-hidden bias.
    pub bias_ih: Option<Tensor>,
    /// Hidden-to-hidden bias.
    pub bias_hh: Option<Tensor>,
}

impl CellParams {
    fn new(
        input_size: usize,
        hidden_size: usize,
        gates: usize,
        bias: bool,
        gen: &mut Generator,
    ) -> Result<Self> {
        let k = 1.0 / (hidden_size.max(1) as f64).sqrt();
        let rows = gates * hidden_size;
        let weight_ih = uniform(&[rows, input_size], k, gen)?;
        let weight_hh = uniform(&[rows, hidden_size], k, gen)?;
        let (bias_ih, bias_hh) = if bias {
            (
                Some(uniform(&[rows], k, gen)?),
                Some(uniform(&[rows], k, gen)?),
            )
        } else {
            (None, None)
        };
        Ok(CellParams {
            weight_ih,
            weight_hh,
            bias_ih,
            bias_hh,
        })
    }

    fn hidden_size(&self) -> usize {
        self.weight_hh.dims()[1]
    }

    /// Zeros for the hidden state of `x` (`[batch, hidden]`, or `[hidden]` unbatched).
    fn zeros_for(&self, x: &Tensor) -> Tensor {
        let mut dims = x.dims()[..x.rank().saturating_sub(1)].to_vec();
        dims.push(self.hidden_size());
        Tensor::zeros(dims, x.dtype())
    }

    fn named(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![
            ("weight_ih".to_string(), self.weight_ih.clone()),
            ("weight_hh".to_string(), self.weight_hh.clone()),
        ];
        if let Some(b) = &self.bias_ih {
            v.push(("bias_ih".to_string(), b.clone()));
        }
        if let Some(b) = &self.bias_hh {
            v.push(("bias_hh".to_string(), b.clone()));
        }
        v
    }
}

/// `nn.RNNCell`: `h' = act(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)`, act tanh or relu.
pub struct RNNCell {
    /// The cell's parameters.
    pub params: CellParams,
    /// tanh (default) or relu.
    pub nonlinearity: RnnNonlinearity,
}

impl RNNCell {
    /// A tanh cell with biases, initialised from `gen`.
    pub fn new(input_size: usize, hidden_size: usize, gen: &mut Generator) -> Result<Self> {
        Self::with_options(input_size, hidden_size, true, RnnNonlinearity::Tanh, gen)
    }
    /// With or without biases, tanh or relu.
    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        nonlinearity: RnnNonlinearity,
        gen: &mut Generator,
    ) -> Result<Self> {
        Ok(RNNCell {
            params: CellParams::new(input_size, hidden_size, 1, bias, gen)?,
            nonlinearity,
        })
    }
    /// One step from hidden state `hx` (zeros when `None`).
    pub fn step(&self, x: &Tensor, hx: Option<&Tensor>) -> Result<Tensor> {
        let zeros;
        let h = match hx {
            Some(h) => h,
            None => {
                zeros = self.params.zeros_for(x);
                &zeros
            }
        };
        let p = &self.params;
        ops::rnn_cell(
            x,
            h,
            &p.weight_ih,
            &p.weight_hh,
            p.bias_ih.as_ref(),
            p.bias_hh.as_ref(),
            self.nonlinearity,
        )
    }
}

impl Module for RNNCell {
    /// One step from a zero hidden state.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.step(x, None)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.params.named()
    }
}

/// `nn.GRUCell` (gates r, z, n; see [`ops::gru_cell`]).
pub struct GRUCell {
    /// The cell's parameters (`3 * hidden` rows).
    pub params: CellParams,
}

impl GRUCell {
    /// A cell with biases, initialised from `gen`.
    pub fn new(input_size: usize, hidden_size: usize, gen: &mut Generator) -> Result<Self> {
        Self::with_bias(input_size, hidden_size, true, gen)
    }
    /// With or without biases.
    pub fn with_bias(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        gen: &mut Generator,
    ) -> Result<Self> {
        Ok(GRUCell {
            params: CellParams::new(input_size, hidden_size, 3, bias, gen)?,
        })
    }
    /// One step from hidden state `hx` (zeros when `None`).
    pub fn step(&self, x: &Tensor, hx: Option<&Tensor>) -> Result<Tensor> {
        let zeros;
        let h = match hx {
            Some(h) => h,
            None => {
                zeros = self.params.zeros_for(x);
                &zeros
            }
        };
        let p = &self.params;
        ops::gru_cell(
            x,
            h,
            &p.weight_ih,
            &p.weight_hh,
            p.bias_ih.as_ref(),
            p.bias_hh.as_ref(),
        )
    }
}

impl Module for GRUCell {
    /// One step from a zero hidden state.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.step(x, None)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.params.named()
    }
}

/// `nn.LSTMCell` (gates i, f, g, o; see [`ops::lstm_cell`]).
pub struct LSTMCell {
    /// The cell's parameters (`4 * hidden` rows).
    pub params: CellParams,
}

impl LSTMCell {
    /// A cell with biases, initialised from `gen`.
    pub fn new(input_size: usize, hidden_size: usize, gen: &mut Generator) -> Result<Self> {
        Self::with_bias(input_size, hidden_size, true, gen)
    }
    /// With or without biases.
    pub fn with_bias(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        gen: &mut Generator,
    ) -> Result<Self> {
        Ok(LSTMCell {
            params: CellParams::new(input_size, hidden_size, 4, bias, gen)?,
        })
    }
    /// One step from `(h, c)` (zeros when `None`); returns `(h', c')`.
    pub fn step(&self, x: &Tensor, state: Option<(&Tensor, &Tensor)>) -> Result<(Tensor, Tensor)> {
        let zeros;
        let (h, c) = match state {
            Some(s) => s,
            None => {
                zeros = self.params.zeros_for(x);
                (&zeros, &zeros)
            }
        };
        let p = &self.params;
        ops::lstm_cell(
            x,
            (h, c),
            &p.weight_ih,
            &p.weight_hh,
            p.bias_ih.as_ref(),
            p.bias_hh.as_ref(),
        )
    }
}

impl Module for LSTMCell {
    /// One step from a zero state; the new hidden state `h'`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.step(x, None)?.0)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.params.named()
    }
}
