//! Recurrent cells: RNNCell, GRUCell, LSTMCell (PyTorch's parameters, names and default
//! initialisation: every parameter uniform in `[-1/sqrt(hidden), 1/sqrt(hidden))`).

use std::borrow::Cow;

use amp_autograd::ops::{self, RnnNonlinearity};
use amp_autograd::{Result, Tensor};
use amp_tensor::Generator;

use crate::init::uniform;
use crate::module::{named_present, Module};

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

    /// `hx`, or zeros for the hidden state of `x` when `None`.
    fn hidden<'h>(&self, x: &Tensor, hx: Option<&'h Tensor>) -> Cow<'h, Tensor> {
        hx.map_or_else(|| Cow::Owned(self.zeros_for(x)), Cow::Borrowed)
    }

    /// `(weight_ih, weight_hh, bias_ih, bias_hh)`, as the cell ops take them.
    fn weights(&self) -> (&Tensor, &Tensor, Option<&Tensor>, Option<&Tensor>) {
        let (b_ih, b_hh) = (self.bias_ih.as_ref(), self.bias_hh.as_ref());
        (&self.weight_ih, &self.weight_hh, b_ih, b_hh)
    }

    fn named(&self) -> Vec<(String, Tensor)> {
        named_present([
            ("weight_ih", Some(&self.weight_ih)),
            ("weight_hh", Some(&self.weight_hh)),
            ("bias_ih", self.bias_ih.as_ref()),
            ("bias_hh", self.bias_hh.as_ref()),
        ])
    }
}

/// `new` and `with_bias` of the cell `$cell` with `$gates` gates.
macro_rules! gated_cell_constructors {
    ($cell:ident, $gates:literal) => {
        impl $cell {
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
                Ok($cell {
                    params: CellParams::new(input_size, hidden_size, $gates, bias, gen)?,
                })
            }
        }
    };
}

/// `Module` for the cell `$cell`: a step from zero states (its result matched by `$out`,
/// giving the output), and the cell's parameters.
macro_rules! cell_module {
    ($cell:ident, $doc:literal, |$out:pat_param| $y:expr) => {
        impl Module for $cell {
            #[doc = $doc]
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let $out = self.step(x, None)?;
                Ok($y)
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                self.params.named()
            }
        }
    };
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
        let h = self.params.hidden(x, hx);
        let (w_ih, w_hh, b_ih, b_hh) = self.params.weights();
        ops::rnn_cell(x, &h, w_ih, w_hh, b_ih, b_hh, self.nonlinearity)
    }
}

cell_module!(RNNCell, "One step from a zero hidden state.", |h| h);

/// `nn.GRUCell` (gates r, z, n; see [`ops::gru_cell`]).
pub struct GRUCell {
    /// The cell's parameters (`3 * hidden` rows).
    pub params: CellParams,
}

gated_cell_constructors!(GRUCell, 3);

impl GRUCell {
    /// One step from hidden state `hx` (zeros when `None`).
    pub fn step(&self, x: &Tensor, hx: Option<&Tensor>) -> Result<Tensor> {
        let h = self.params.hidden(x, hx);
        let (w_ih, w_hh, b_ih, b_hh) = self.params.weights();
        ops::gru_cell(x, &h, w_ih, w_hh, b_ih, b_hh)
    }
}

cell_module!(GRUCell, "One step from a zero hidden state.", |h| h);

/// `nn.LSTMCell` (gates i, f, g, o; see [`ops::lstm_cell`]).
pub struct LSTMCell {
    /// The cell's parameters (`4 * hidden` rows).
    pub params: CellParams,
}

gated_cell_constructors!(LSTMCell, 4);

impl LSTMCell {
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
        let (w_ih, w_hh, b_ih, b_hh) = self.params.weights();
        ops::lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)
    }
}

cell_module!(
    LSTMCell,
    "One step from a zero state; the new hidden state `h'`.",
    |(h, _c)| h
);

/// The shape of an [`LSTM`] or [`GRU`] stack, PyTorch's constructor arguments (its
/// defaults by [`RecurrentConfig::new`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecurrentConfig {
    /// Features of the input.
    pub input_size: usize,
    /// Features of the hidden state.
    pub hidden_size: usize,
    /// Stacked layers (default 1).
    pub num_layers: usize,
    /// Biases `b_ih`, `b_hh` (default true).
    pub bias: bool,
    /// `[N, T, I]` input and output (default false: `[T, N, I]`).
    pub batch_first: bool,
    /// Dropout on every layer's output but the last's, in training (default 0).
    pub dropout: f64,
    /// A reverse pass too, its outputs concatenated (default false).
    pub bidirectional: bool,
}

impl RecurrentConfig {
    /// One unidirectional layer with biases, sequence first, no dropout.
    pub fn new(input_size: usize, hidden_size: usize) -> Self {
        RecurrentConfig {
            input_size,
            hidden_size,
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
        }
    }

    fn directions(&self) -> usize {
        if self.bidirectional {
            2
        } else {
            1
        }
    }
}

/// The parameters of a recurrent stack, named and ordered as PyTorch's
/// `_flat_weights_names` (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`,
/// `weight_ih_l0_reverse`, ...), uniform in `[-1/sqrt(hidden), 1/sqrt(hidden))`.
struct StackParams {
    named: Vec<(String, Tensor)>,
}

impl StackParams {
    fn new(cfg: &RecurrentConfig, gates: usize, gen: &mut Generator) -> Result<Self> {
        let k = 1.0 / (cfg.hidden_size.max(1) as f64).sqrt();
        let rows = gates * cfg.hidden_size;
        let mut named = Vec::new();
        for layer in 0..cfg.num_layers {
            let input = if layer == 0 {
                cfg.input_size
            } else {
                cfg.hidden_size * cfg.directions()
            };
            for d in 0..cfg.directions() {
                let sfx = if d == 1 { "_reverse" } else { "" };
                named.push((
                    format!("weight_ih_l{layer}{sfx}"),
                    uniform(&[rows, input], k, gen)?,
                ));
                named.push((
                    format!("weight_hh_l{layer}{sfx}"),
                    uniform(&[rows, cfg.hidden_size], k, gen)?,
                ));
                if cfg.bias {
                    named.push((format!("bias_ih_l{layer}{sfx}"), uniform(&[rows], k, gen)?));
                    named.push((format!("bias_hh_l{layer}{sfx}"), uniform(&[rows], k, gen)?));
                }
            }
        }
        Ok(StackParams { named })
    }

    fn flat(&self) -> Vec<Tensor> {
        self.named.iter().map(|(_, t)| t.clone()).collect()
    }
}

/// What a stack's forward needs beyond its parameters: training mode and the dropout's
/// generator.
struct StackState {
    cfg: RecurrentConfig,
    params: StackParams,
    training: bool,
    gen: std::sync::Mutex<Generator>,
}

impl StackState {
    fn new(cfg: RecurrentConfig, gates: usize, gen: &mut Generator) -> Result<Self> {
        let params = StackParams::new(&cfg, gates, gen)?;
        // The dropout's own stream, drawn from the initialising generator.
        let seed = gen.int_range(0, i64::MAX) as u64;
        Ok(StackState {
            cfg,
            params,
            training: true,
            gen: std::sync::Mutex::new(Generator::new(seed)),
        })
    }

    /// Zeros `[layers·directions, N, H]` for the batch of `x` (a 3-D input; other ranks
    /// get a placeholder, and the op refuses the input itself).
    fn zeros_for(&self, x: &Tensor) -> Tensor {
        let n = if x.rank() == 3 {
            x.dims()[if self.cfg.batch_first { 0 } else { 1 }]
        } else {
            0
        };
        let layers = self.cfg.num_layers * self.cfg.directions();
        Tensor::zeros([layers, n, self.cfg.hidden_size], x.dtype())
    }

    fn run<R>(&self, f: impl FnOnce(&[Tensor], ops::Recurrent<'_>) -> Result<R>) -> Result<R> {
        let mut gen = self.gen.lock().unwrap_or_else(|e| e.into_inner());
        let c = &self.cfg;
        f(
            &self.params.flat(),
            ops::Recurrent {
                has_biases: c.bias,
                num_layers: c.num_layers,
                dropout: c.dropout,
                train: self.training,
                bidirectional: c.bidirectional,
                batch_first: c.batch_first,
                generator: Some(&mut gen),
            },
        )
    }
}

/// `Module` for a recurrent stack: the output sequence from zero states, the stack's
/// parameters, training mode.
macro_rules! stack_module {
    ($t:ident) => {
        impl Module for $t {
            /// The output sequence from zero initial states.
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(self.forward_with(x, None)?.0)
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                self.state.params.named.clone()
            }
            fn train(&mut self, mode: bool) {
                self.state.training = mode;
            }
            fn is_training(&self) -> bool {
                self.state.training
            }
        }
    };
}

/// `nn.LSTM`: a stack of LSTM layers over whole sequences (see [`ops::lstm`]).
///
/// ```
/// use amp_nn::{Module, RecurrentConfig, LSTM};
/// use amp_autograd::Tensor;
/// use amp_tensor::{DType, Generator};
/// # fn main() -> amp_autograd::Result<()> {
/// let mut gen = Generator::new(0);
/// let cfg = RecurrentConfig { num_layers: 2, bidirectional: true, batch_first: true, ..RecurrentConfig::new(3, 4) };
/// let lstm = LSTM::new(cfg, &mut gen)?;
/// assert_eq!(lstm.named_parameters()[4].0, "weight_ih_l0_reverse");
/// let y = lstm.forward(&Tensor::ones([2, 5, 3], DType::F32))?;
/// assert_eq!(y.dims(), [2, 5, 8]);
/// # Ok(())
/// # }
/// ```
pub struct LSTM {
    state: StackState,
}

impl LSTM {
    /// A stack initialised from `gen` as PyTorch initialises it.
    pub fn new(cfg: RecurrentConfig, gen: &mut Generator) -> Result<Self> {
        Ok(LSTM {
            state: StackState::new(cfg, 4, gen)?,
        })
    }
    /// The configuration.
    pub fn config(&self) -> &RecurrentConfig {
        &self.state.cfg
    }
    /// From states `(h0, c0)` (zeros when `None`): `(output, (h_n, c_n))`.
    pub fn forward_with(
        &self,
        x: &Tensor,
        hx: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let zeros = self.state.zeros_for(x);
        let (h0, c0) = hx.unwrap_or((&zeros, &zeros));
        self.state.run(|params, o| {
            let (y, h, c) = ops::lstm(x, (h0, c0), params, o)?;
            Ok((y, (h, c)))
        })
    }
}

stack_module!(LSTM);

/// `nn.GRU`: a stack of GRU layers over whole sequences (see [`ops::gru`]).
pub struct GRU {
    state: StackState,
}

impl GRU {
    /// A stack initialised from `gen` as PyTorch initialises it.
    pub fn new(cfg: RecurrentConfig, gen: &mut Generator) -> Result<Self> {
        Ok(GRU {
            state: StackState::new(cfg, 3, gen)?,
        })
    }
    /// The configuration.
    pub fn config(&self) -> &RecurrentConfig {
        &self.state.cfg
    }
    /// From state `h0` (zeros when `None`): `(output, h_n)`.
    pub fn forward_with(&self, x: &Tensor, hx: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let zeros = self.state.zeros_for(x);
        let h0 = hx.unwrap_or(&zeros);
        self.state.run(|params, o| ops::gru(x, h0, params, o))
    }
}

stack_module!(GRU);
