//! The `amp-vectors/1` file format: one file is one suite of cases (see the format's
//! README, `conformance/data/README.md`).
//!
//! ```json
//! {"format": "amp-vectors/1", "suite": "grad", "source": "torch 2.15.0 (cpu)", "notes": "...", "cases": [...]}
//! ```
//!
//! [`VectorFile::parse`] checks the header (an unknown `format` or `suite` is an error naming
//! the file), then reads every case into the typed struct of its suite, and checks that the
//! case ids are unique.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use amp::policy::{CastPolicy, DeviceType};
use amp::tensor::DType;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::args::{Arg, Kwargs, Output};
use crate::compare::Tolerance;
use crate::value::{parse_dtype, Number, TensorLit};
use crate::ConformanceError;

/// The format name every file must declare.
pub const FORMAT: &str = "amp-vectors/1";

/// The six suites of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Suite {
    /// The documented cast policy of one op on one device.
    Policy,
    /// The output of one op run under a CPU autocast state.
    Autocast,
    /// Forward values, input gradients and second-order gradients of one op.
    Grad,
    /// A GradScaler program.
    Scaler,
    /// A small MLP trained with autocast + GradScaler.
    Train,
    /// A call PyTorch refuses: the implementation must return an error.
    Errors,
}

impl Suite {
    /// Every suite, in report order.
    pub const ALL: [Suite; 6] = [
        Suite::Policy,
        Suite::Autocast,
        Suite::Grad,
        Suite::Scaler,
        Suite::Train,
        Suite::Errors,
    ];

    /// The suite's name in the files: `policy`, `autocast`, `grad`, `scaler`, `train`,
    /// `errors`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Suite::Policy => "policy",
            Suite::Autocast => "autocast",
            Suite::Grad => "grad",
            Suite::Scaler => "scaler",
            Suite::Train => "train",
            Suite::Errors => "errors",
        }
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Suite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Suite::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| s.to_owned())
    }
}

/// One parsed vector file.
#[derive(Debug, Clone)]
pub struct VectorFile {
    /// The file name (`grad_f64.json`), as reports show it.
    pub name: String,
    /// Where the expectations come from (`torch 2.15.0 (cpu)`).
    pub source: Option<String>,
    /// Free-form notes of the file.
    pub notes: Option<Value>,
    /// The cases, typed by suite.
    pub cases: Cases,
}

/// The cases of a file, typed by its suite.
#[derive(Debug, Clone)]
pub enum Cases {
    /// `suite: policy`.
    Policy(Vec<PolicyCase>),
    /// `suite: autocast`.
    Autocast(Vec<AutocastCase>),
    /// `suite: grad`.
    Grad(Vec<GradCase>),
    /// `suite: scaler`.
    Scaler(Vec<ScalerCase>),
    /// `suite: train`.
    Train(Vec<TrainCase>),
    /// `suite: errors`.
    Errors(Vec<ErrorCase>),
}

impl Cases {
    /// The suite these cases belong to.
    pub fn suite(&self) -> Suite {
        match self {
            Cases::Policy(_) => Suite::Policy,
            Cases::Autocast(_) => Suite::Autocast,
            Cases::Grad(_) => Suite::Grad,
            Cases::Scaler(_) => Suite::Scaler,
            Cases::Train(_) => Suite::Train,
            Cases::Errors(_) => Suite::Errors,
        }
    }

    /// Number of cases.
    pub fn len(&self) -> usize {
        self.ids().len()
    }

    /// `true` for a file without cases.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every case id, in file order.
    pub fn ids(&self) -> Vec<&str> {
        fn ids<C>(cases: &[C], id: impl Fn(&C) -> &str) -> Vec<&str> {
            cases.iter().map(id).collect()
        }
        match self {
            Cases::Policy(c) => ids(c, |c| &c.id),
            Cases::Autocast(c) => ids(c, |c| &c.id),
            Cases::Grad(c) => ids(c, |c| &c.id),
            Cases::Scaler(c) => ids(c, |c| &c.id),
            Cases::Train(c) => ids(c, |c| &c.id),
            Cases::Errors(c) => ids(c, |c| &c.id),
        }
    }

    /// `(op, call)` of every case that runs an op with values to check (autocast and grad),
    /// for the coverage report.
    pub fn op_calls(&self) -> Vec<(&str, &str)> {
        match self {
            Cases::Autocast(c) => c.iter().map(|c| c.op_call.names()).collect(),
            Cases::Grad(c) => c.iter().map(|c| c.op_call.names()).collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Deserialize)]
struct RawFile {
    format: String,
    suite: String,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    notes: Option<Value>,
    cases: Vec<Value>,
}

fn typed<C: for<'de> Deserialize<'de>>(
    file: &str,
    cases: Vec<Value>,
) -> Result<Vec<C>, ConformanceError> {
    cases
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let id = v
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or("(no id)")
                .to_owned();
            C::deserialize(v).map_err(|e| ConformanceError::BadCase {
                file: file.to_owned(),
                index,
                id,
                message: e.to_string(),
            })
        })
        .collect()
}

impl VectorFile {
    /// Parses the text of the file called `name` (a path or a file name, used in errors).
    pub fn parse(name: &str, text: &str) -> Result<VectorFile, ConformanceError> {
        let raw: RawFile = serde_json::from_str(text).map_err(|source| ConformanceError::Json {
            file: name.to_owned(),
            source,
        })?;
        if raw.format != FORMAT {
            return Err(ConformanceError::UnknownFormat {
                file: name.to_owned(),
                format: raw.format,
            });
        }
        let suite: Suite = raw
            .suite
            .parse()
            .map_err(|suite| ConformanceError::UnknownSuite {
                file: name.to_owned(),
                suite,
            })?;
        let cases = match suite {
            Suite::Policy => Cases::Policy(typed(name, raw.cases)?),
            Suite::Autocast => Cases::Autocast(typed(name, raw.cases)?),
            Suite::Grad => Cases::Grad(typed(name, raw.cases)?),
            Suite::Scaler => Cases::Scaler(typed(name, raw.cases)?),
            Suite::Train => Cases::Train(typed(name, raw.cases)?),
            Suite::Errors => Cases::Errors(typed(name, raw.cases)?),
        };
        let mut seen = HashMap::new();
        for (index, id) in cases.ids().into_iter().enumerate() {
            if let Some(first) = seen.insert(id, index) {
                return Err(ConformanceError::DuplicateId {
                    file: name.to_owned(),
                    id: id.to_owned(),
                    first,
                    second: index,
                });
            }
        }
        let short = std::path::Path::new(name)
            .file_name()
            .map_or_else(|| name.to_owned(), |n| n.to_string_lossy().into_owned());
        Ok(VectorFile {
            name: short,
            source: raw.source,
            notes: raw.notes,
            cases,
        })
    }

    /// The file's suite.
    pub fn suite(&self) -> Suite {
        self.cases.suite()
    }
}

impl OpCall {
    /// `(op, call)`.
    pub fn names(&self) -> (&str, &str) {
        (&self.op, &self.call)
    }
}

// ----- cases ---------------------------------------------------------------------------

/// `{"id", "device": "cuda"|"cpu", "op", "policy"}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PolicyCase {
    /// Unique case id.
    pub id: String,
    /// The device type whose lists are checked.
    pub device: DeviceType,
    /// The op name as the documented lists write it.
    pub op: String,
    /// The documented policy (`none`: on no list of that device).
    pub policy: CastPolicy,
}

/// The comparison tolerance of an expectation: `rtol`/`atol`, both absent for exact.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
pub struct Tolerances {
    /// Relative tolerance.
    #[serde(default)]
    pub rtol: Option<f64>,
    /// Absolute tolerance.
    #[serde(default)]
    pub atol: Option<f64>,
}

impl Tolerances {
    /// The tolerance to compare with; `None` (exact) when the case gives neither.
    pub fn tolerance(&self) -> Option<Tolerance> {
        Tolerance::from_options(self.rtol, self.atol)
    }
}

/// One autocast region of a case's stack: `{"enabled": bool, "dtype": "bfloat16"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutocastRegion {
    /// Whether the region enables autocast.
    pub enabled: bool,
    /// The region's lower-precision dtype (absent when disabled; `None` otherwise means the
    /// device's default).
    pub dtype: Option<DType>,
}

impl<'de> Deserialize<'de> for AutocastRegion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            enabled: bool,
            #[serde(default)]
            dtype: Option<String>,
        }
        let raw = Raw::deserialize(d)?;
        let dtype = raw
            .dtype
            .map(|s| parse_dtype(&s))
            .transpose()
            .map_err(serde::de::Error::custom)?;
        Ok(AutocastRegion {
            enabled: raw.enabled,
            dtype,
        })
    }
}

/// What an autocast, grad or errors case calls: `{"op", "call", "args", "kwargs"}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OpCall {
    /// The documented op name.
    pub op: String,
    /// The PyTorch function whose signature `args`/`kwargs` follow.
    pub call: String,
    /// Positional arguments.
    pub args: Vec<Arg<TensorLit>>,
    /// Keyword arguments.
    #[serde(default)]
    pub kwargs: Kwargs<TensorLit>,
}

/// Expected output of an autocast case.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AutocastExpect {
    /// The op's output (a list for ops returning a tuple).
    pub output: Output<TensorLit>,
    /// Comparison tolerance.
    #[serde(flatten)]
    pub tol: Tolerances,
}

/// `{"id", "device", "op", "call", "policy", "autocast": [state, ...], "args", "kwargs", "expect"}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AutocastCase {
    /// Unique case id.
    pub id: String,
    /// The autocast device type (`cpu`).
    pub device: DeviceType,
    /// Informative: the op's policy (`composite` marks ops built from matmul).
    pub policy: String,
    /// The nested autocast regions, outermost first (empty: no autocast).
    pub autocast: Vec<AutocastRegion>,
    /// The op and its arguments.
    #[serde(flatten)]
    pub op_call: OpCall,
    /// What the op must return.
    pub expect: AutocastExpect,
}

/// The refusal PyTorch gave for an errors case.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExpectError {
    /// PyTorch's exception class (`RuntimeError`, `ValueError`, `IndexError`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The first line of PyTorch's message.
    pub message: String,
}

/// `{"id", "op", "call", "args", "kwargs", "expect_error": {"type", "message"}}`: a call
/// PyTorch refuses. It passes when the implementation returns an error (not a value, not a
/// panic); the message is compared for the report's count of matching texts only.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ErrorCase {
    /// Unique case id.
    pub id: String,
    /// The op and its arguments.
    #[serde(flatten)]
    pub op_call: OpCall,
    /// What PyTorch raised.
    pub expect_error: ExpectError,
}

/// Expectations of a grad case.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GradExpect {
    /// The forward output.
    pub output: Output<TensorLit>,
    /// The gradient of every `requires_grad` argument tensor, depth-first in argument order;
    /// `None` where the input does not influence the output (zeros pass too).
    pub grads: Vec<Option<TensorLit>>,
    /// f64 files: gradients of `sum over first-order grads g of sum(g * g)`; absent where no
    /// first-order gradient depends on any input.
    #[serde(default)]
    pub second_order_grads: Option<Vec<Option<TensorLit>>>,
    /// Comparison tolerance.
    #[serde(flatten)]
    pub tol: Tolerances,
}

/// `{"id", "op", "call", "args", "kwargs", "grad_output", "expect"}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GradCase {
    /// Unique case id.
    pub id: String,
    /// The op and its arguments (tensors marked `requires_grad` are differentiated).
    #[serde(flatten)]
    pub op_call: OpCall,
    /// The gradient backpropagated from the output (same structure as the output).
    pub grad_output: Output<TensorLit>,
    /// What forward and backward must give.
    pub expect: GradExpect,
}

/// GradScaler constructor arguments; absent ones take PyTorch's defaults
/// (65536.0, 2.0, 0.5, 2000, true).
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerInit {
    /// `init_scale`.
    pub init_scale: Option<f64>,
    /// `growth_factor`.
    pub growth_factor: Option<f64>,
    /// `backoff_factor`.
    pub backoff_factor: Option<f64>,
    /// `growth_interval`.
    pub growth_interval: Option<i64>,
    /// `enabled`.
    pub enabled: Option<bool>,
}

/// A plain SGD optimizer of a scaler case (`p -= lr * grad`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ScalerOptimizer {
    /// The name actions refer to.
    pub name: String,
    /// Learning rate.
    pub lr: f64,
    /// The parameters' initial values.
    pub params: Vec<TensorLit>,
}

/// One action of a scaler program (see the format's table).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "action")]
pub enum ScalerAction {
    /// `scaler.scale(input)` equals `expect` exactly.
    #[serde(rename = "scale")]
    Scale {
        /// A tensor or a list of tensors.
        input: Output<TensorLit>,
        /// The scaled value(s).
        expect: Output<TensorLit>,
    },
    /// Sets each parameter's grad (`None`: no grad).
    #[serde(rename = "set_grads")]
    SetGrads {
        /// Optimizer name.
        optimizer: String,
        /// One per parameter.
        grads: Vec<Option<TensorLit>>,
    },
    /// `scaler.unscale_(optimizer)`; grads after it, exact.
    #[serde(rename = "unscale_")]
    Unscale {
        /// Optimizer name.
        optimizer: String,
        /// Grads after unscaling (absent when the action must fail).
        #[serde(default)]
        expect_grads: Option<Vec<Option<TensorLit>>>,
        /// The action must fail with a message containing this.
        #[serde(default)]
        expect_error: Option<String>,
    },
    /// `scaler.step(optimizer)`; params compared with rtol 1e-6.
    #[serde(rename = "step")]
    Step {
        /// Optimizer name.
        optimizer: String,
        /// Whether the step is skipped.
        #[serde(default)]
        expect_skipped: Option<bool>,
        /// Params after the step.
        #[serde(default)]
        expect_params: Option<Vec<TensorLit>>,
        /// The action must fail with a message containing this.
        #[serde(default)]
        expect_error: Option<String>,
    },
    /// `scaler.update(new_scale)`; scale exact.
    #[serde(rename = "update")]
    Update {
        /// Explicit new scale.
        #[serde(default)]
        new_scale: Option<f64>,
        /// Scale after the update.
        #[serde(default)]
        expect_scale: Option<f64>,
        /// Growth tracker after the update.
        #[serde(default)]
        expect_growth_tracker: Option<i64>,
        /// The action must fail with a message containing this.
        #[serde(default)]
        expect_error: Option<String>,
    },
    /// The optimizer's grads become absent.
    #[serde(rename = "zero_grad")]
    ZeroGrad {
        /// Optimizer name.
        optimizer: String,
    },
    /// `scaler.get_scale()`, exact.
    #[serde(rename = "get_scale")]
    GetScale {
        /// Expected scale.
        expect: f64,
    },
    /// `scaler.state_dict()`: exactly these keys, in this order, with these values and types.
    #[serde(rename = "state_dict")]
    StateDict {
        /// Expected state dict.
        expect: Map<String, Value>,
    },
    /// `scaler.load_state_dict(state)`.
    #[serde(rename = "load_state_dict")]
    LoadStateDict {
        /// The state to load.
        state: Map<String, Value>,
        /// The action must fail with a message containing this.
        #[serde(default)]
        expect_error: Option<String>,
    },
    /// Replaces the scaler (the optimizers stay).
    #[serde(rename = "new_scaler")]
    NewScaler {
        /// Constructor arguments.
        init: ScalerInit,
    },
    /// `set_growth_factor` / `set_backoff_factor` / `set_growth_interval`.
    #[serde(rename = "set")]
    Set {
        /// `growth_factor`, `backoff_factor` or `growth_interval`.
        field: String,
        /// The new value.
        value: Number,
    },
}

impl ScalerAction {
    /// The action's name as the file writes it.
    pub fn name(&self) -> &'static str {
        match self {
            ScalerAction::Scale { .. } => "scale",
            ScalerAction::SetGrads { .. } => "set_grads",
            ScalerAction::Unscale { .. } => "unscale_",
            ScalerAction::Step { .. } => "step",
            ScalerAction::Update { .. } => "update",
            ScalerAction::ZeroGrad { .. } => "zero_grad",
            ScalerAction::GetScale { .. } => "get_scale",
            ScalerAction::StateDict { .. } => "state_dict",
            ScalerAction::LoadStateDict { .. } => "load_state_dict",
            ScalerAction::NewScaler { .. } => "new_scaler",
            ScalerAction::Set { .. } => "set",
        }
    }

    /// The error text the action must fail with, if any.
    pub fn expect_error(&self) -> Option<&str> {
        match self {
            ScalerAction::Unscale { expect_error, .. }
            | ScalerAction::Step { expect_error, .. }
            | ScalerAction::Update { expect_error, .. }
            | ScalerAction::LoadStateDict { expect_error, .. } => expect_error.as_deref(),
            _ => None,
        }
    }
}

/// `{"id", "init", "optimizers", "actions"}`, or `{"id", "init", "expect_init_error"}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ScalerCase {
    /// Unique case id.
    pub id: String,
    /// Constructor arguments.
    pub init: ScalerInit,
    /// Construction must fail with a message containing this (then there are no actions).
    #[serde(default)]
    pub expect_init_error: Option<String>,
    /// The SGD optimizers the actions refer to.
    #[serde(default)]
    pub optimizers: Vec<ScalerOptimizer>,
    /// The program, in order.
    #[serde(default)]
    pub actions: Vec<ScalerAction>,
}

/// One layer of a train case's model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Layer {
    /// `linear(x, weight, bias)` with `weight` `[out, in]`.
    Linear {
        /// `[out, in]`.
        weight: TensorLit,
        /// `[out]`.
        bias: TensorLit,
    },
    /// ReLU.
    Relu,
    /// tanh.
    Tanh,
    /// GELU (exact erf form).
    Gelu,
    /// Sigmoid.
    Sigmoid,
}

/// The optimizer of a train case: SGD with momentum.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TrainOptimizer {
    /// `sgd`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Learning rate.
    pub lr: f64,
    /// Momentum.
    pub momentum: f64,
}

/// The autocast region of a train case's forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainAutocast {
    /// The device type (`cpu`).
    pub device: DeviceType,
    /// The lower-precision dtype.
    pub dtype: DType,
}

impl<'de> Deserialize<'de> for TrainAutocast {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            device: DeviceType,
            dtype: String,
        }
        let raw = Raw::deserialize(d)?;
        Ok(TrainAutocast {
            device: raw.device,
            dtype: parse_dtype(&raw.dtype).map_err(serde::de::Error::custom)?,
        })
    }
}

/// `+inf` injected into one parameter's grad before an optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct InjectInf {
    /// The optimizer step (0-based).
    pub step: usize,
    /// The parameter, in flat order: each linear layer's weight, then its bias.
    pub param: usize,
}

/// One micro-batch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Batch {
    /// Model input.
    pub input: TensorLit,
    /// Regression target.
    pub target: TensorLit,
}

/// Expectations of a train case.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TrainExpect {
    /// Loss per micro-batch (unscaled, undivided), with the case's tolerance.
    pub losses: Vec<f64>,
    /// Scale after each optimizer step, exact.
    pub scales: Vec<f64>,
    /// Whether each optimizer step was skipped, exact.
    pub skipped: Vec<bool>,
    /// Parameters after training.
    pub final_params: Vec<TensorLit>,
    /// Comparison tolerance.
    #[serde(flatten)]
    pub tol: Tolerances,
}

/// A small MLP trained a few steps (see the `notes` of `train.json` for the loop).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TrainCase {
    /// Unique case id.
    pub id: String,
    /// Layers, applied in order.
    pub model: Vec<Layer>,
    /// The loss (`mse_loss`).
    pub loss: String,
    /// The optimizer.
    pub optimizer: TrainOptimizer,
    /// Autocast for the forward pass (`None`: none).
    pub autocast: Option<TrainAutocast>,
    /// GradScaler constructor arguments.
    pub scaler: ScalerInit,
    /// Micro-batches per optimizer step.
    pub accumulate: usize,
    /// `clip_grad_norm_` max norm after an explicit `unscale_`, if set.
    pub clip_grad_norm: Option<f64>,
    /// Infinities injected into grads.
    pub inject_inf: Vec<InjectInf>,
    /// The micro-batches.
    pub batches: Vec<Batch>,
    /// What training must give.
    pub expect: TrainExpect,
}
