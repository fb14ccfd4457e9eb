//! The serialisable optimizer state dict, and the checked reading of one: a state dict
//! is outside data (a file, a checkpoint), so every entry is checked against the
//! optimizer before anything is changed.

use std::collections::{BTreeMap, HashMap};

use amp_autograd::Tensor;
use amp_tensor::{DType, Tensor as Raw};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::json_float::{self, from_json};
use crate::update::state_dtype;
use crate::{Error, Result};

/// A tensor in a state dict: dtype name, shape and row-major values. Values keep NaN
/// and the infinities in JSON (see [`json_float`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorData {
    /// The dtype's name (`float32`).
    pub dtype: String,
    /// The dimensions.
    pub shape: Vec<usize>,
    /// The values, row-major, as `f64` (exact for every dtype but the 64-bit ints).
    #[serde(with = "json_float::vec")]
    pub data: Vec<f64>,
}

/// Why a state-dict entry cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateProblem {
    /// A required entry is absent.
    #[error("missing")]
    Missing,
    /// The entry has the wrong kind of value.
    #[error("must be {0}")]
    Expected(&'static str),
    /// The dtype name is not one of this workspace's dtypes.
    #[error("unknown dtype `{0}`")]
    UnknownDtype(String),
    /// The shape's element count overflows.
    #[error("shape {0:?} has more elements than memory can hold")]
    ShapeOverflow(Vec<usize>),
    /// The data does not have the shape's element count.
    #[error("shape {shape:?} holds {expected} values, the data has {found}")]
    DataLength {
        /// The shape given.
        shape: Vec<usize>,
        /// Its element count.
        expected: usize,
        /// The number of values given.
        found: usize,
    },
    /// A tensor whose shape is not its parameter's.
    #[error("shape {found:?} differs from the parameter's {expected:?}")]
    Shape {
        /// The shape in the state dict.
        found: Vec<usize>,
        /// The parameter's shape.
        expected: Vec<usize>,
    },
    /// Building the tensor failed.
    #[error(transparent)]
    Tensor(#[from] amp_tensor::Error),
}

impl TensorData {
    /// Capture a raw tensor (values exact: every f32 is an f64).
    pub fn from_raw(t: &Raw) -> Self {
        TensorData {
            dtype: t.dtype().to_string(),
            shape: t.dims().to_vec(),
            data: t.to_vec_f64(),
        }
    }

    /// Rebuild the tensor, checking the dtype name and that the data has the shape's
    /// element count (with no overflow, so no later stride computation can overflow).
    pub fn to_raw(&self) -> std::result::Result<Raw, StateProblem> {
        let dtype: DType = self
            .dtype
            .parse()
            .map_err(|_| StateProblem::UnknownDtype(self.dtype.clone()))?;
        let overflow = || StateProblem::ShapeOverflow(self.shape.clone());
        // Strides multiply the non-zero dimensions, so their product must fit too.
        let span = self
            .shape
            .iter()
            .filter(|&&d| d != 0)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(overflow)?;
        let expected = if self.shape.contains(&0) { 0 } else { span };
        if self.data.len() != expected {
            return Err(StateProblem::DataLength {
                shape: self.shape.clone(),
                expected,
                found: self.data.len(),
            });
        }
        Ok(Raw::from_vec(self.data.clone(), self.shape.clone())?.to_dtype(dtype)?)
    }
}

/// One value of a parameter's optimizer state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StateValue {
    /// A number (a step count); NaN and the infinities survive JSON.
    Number(#[serde(with = "json_float")] f64),
    /// A tensor (a moment, a momentum buffer).
    Tensor(TensorData),
}

/// PyTorch's optimizer state dict: per-parameter state keyed by the parameter's index
/// (in group order), and the groups' hyper-parameters with `params` index lists.
/// Hyper-parameters that are not finite are written as in [`json_float`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OptimizerStateDict {
    /// Per-parameter state, keyed by the indices the groups' `params` lists hold.
    pub state: BTreeMap<usize, BTreeMap<String, StateValue>>,
    /// Each group's hyper-parameters and its `params` index list.
    pub param_groups: Vec<Map<String, Value>>,
}

/// The `params` index list of each group, counting across groups.
pub(crate) fn group_indices(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut next = 0;
    sizes
        .iter()
        .map(|&n| {
            let v = (next..next + n).collect();
            next += n;
            v
        })
        .collect()
}

/// The saved state of each parameter, `[group][position]`, found through the saved
/// groups' `params` lists as PyTorch's `load_state_dict` maps them: the k-th index of
/// saved group g names the state of group g's k-th parameter. Checks PyTorch's two
/// shape conditions (with its texts), that every index is a distinct non-negative
/// integer, and that no state belongs to an index no group lists.
pub(crate) fn place_state<'a>(
    sd: &'a OptimizerStateDict,
    sizes: &[usize],
) -> Result<Vec<Vec<Option<StateEntry<'a>>>>> {
    if sd.param_groups.len() != sizes.len() {
        return Err(Error::GroupCountMismatch);
    }
    let lists = sd
        .param_groups
        .iter()
        .enumerate()
        .map(|(group, g)| {
            g.get("params")
                .and_then(Value::as_array)
                .ok_or(Error::GroupEntry {
                    group,
                    key: "params",
                    expected: "a list of parameter indices",
                })
        })
        .collect::<Result<Vec<_>>>()?;
    if lists.iter().zip(sizes).any(|(l, &n)| l.len() != n) {
        return Err(Error::GroupSizeMismatch);
    }
    let mut at: HashMap<usize, (usize, usize)> = HashMap::new();
    for (group, list) in lists.iter().enumerate() {
        for (pos, v) in list.iter().enumerate() {
            let bad = Error::GroupEntry {
                group,
                key: "params",
                expected: "a list of distinct non-negative integer indices",
            };
            let k = v
                .as_u64()
                .and_then(|k| usize::try_from(k).ok())
                .ok_or(bad.clone())?;
            if at.insert(k, (group, pos)).is_some() {
                return Err(bad);
            }
        }
    }
    let mut placed: Vec<Vec<Option<StateEntry<'a>>>> = sizes
        .iter()
        .map(|&n| (0..n).map(|_| None).collect())
        .collect();
    for (&index, map) in &sd.state {
        let &(g, p) = at.get(&index).ok_or(Error::UnknownStateIndex(index))?;
        placed[g][p] = Some(StateEntry { index, map });
    }
    Ok(placed)
}

/// Reads one saved group's hyper-parameters, each checked for its type.
pub(crate) struct GroupReader<'a> {
    group: usize,
    map: &'a Map<String, Value>,
}

impl<'a> GroupReader<'a> {
    /// The reader of saved group `group`.
    pub(crate) fn new(group: usize, map: &'a Map<String, Value>) -> Self {
        GroupReader { group, map }
    }

    fn wrong(&self, key: &'static str, expected: &'static str) -> Error {
        Error::GroupEntry {
            group: self.group,
            key,
            expected,
        }
    }

    /// A required number (NaN and the infinities as [`json_float`] writes them).
    pub(crate) fn number(&self, key: &'static str) -> Result<f64> {
        self.map
            .get(key)
            .and_then(from_json)
            .ok_or_else(|| self.wrong(key, "a number"))
    }

    /// Required numbers, read in the order of `keys` (the first missing one is the error).
    pub(crate) fn numbers<const N: usize>(&self, keys: [&'static str; N]) -> Result<[f64; N]> {
        let mut out = [0.0; N];
        for (v, key) in out.iter_mut().zip(keys) {
            *v = self.number(key)?;
        }
        Ok(out)
    }

    /// A flag, `default` when absent (as PyTorch's `__setstate__` fills it in).
    pub(crate) fn flag(&self, key: &'static str, default: bool) -> Result<bool> {
        match self.map.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.wrong(key, "true or false")),
        }
    }

    /// A required pair of numbers (`betas`).
    pub(crate) fn pair(&self, key: &'static str) -> Result<(f64, f64)> {
        match self
            .map
            .get(key)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([a, b]) => from_json(a)
                .zip(from_json(b))
                .ok_or_else(|| self.wrong(key, "a pair of numbers")),
            _ => Err(self.wrong(key, "a pair of numbers")),
        }
    }
}

/// One parameter's saved state, with the index it was saved under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StateEntry<'a> {
    index: usize,
    map: &'a BTreeMap<String, StateValue>,
}

impl StateEntry<'_> {
    fn problem(&self, key: &str, problem: StateProblem) -> Error {
        Error::StateEntry {
            index: self.index,
            key: key.to_owned(),
            problem,
        }
    }

    /// The tensor under `key` (`None` when absent), checked to have `param`'s shape and
    /// converted to its state dtype (float32, float64 for a float64 parameter) on its
    /// device, as PyTorch casts loaded state to its parameter's.
    pub(crate) fn tensor(&self, key: &str, param: &Tensor) -> Result<Option<Raw>> {
        let t = match self.map.get(key) {
            None => return Ok(None),
            Some(StateValue::Number(_)) => {
                return Err(self.problem(key, StateProblem::Expected("a tensor")))
            }
            Some(StateValue::Tensor(t)) => t,
        };
        if t.shape != param.dims() {
            return Err(self.problem(
                key,
                StateProblem::Shape {
                    found: t.shape.clone(),
                    expected: param.dims().to_vec(),
                },
            ));
        }
        let raw = t.to_raw().map_err(|p| self.problem(key, p))?;
        let raw = raw
            .to_dtype(state_dtype(param.dtype()))
            .and_then(|r| r.to_device(param.device()))
            .map_err(|e| self.problem(key, e.into()))?;
        Ok(Some(raw))
    }

    /// The tensor under `key`, which must be there.
    pub(crate) fn required_tensor(&self, key: &str, param: &Tensor) -> Result<Raw> {
        self.tensor(key, param)?
            .ok_or_else(|| self.problem(key, StateProblem::Missing))
    }

    /// The step count under `key`: a finite number `>= 0`.
    pub(crate) fn step(&self, key: &str) -> Result<f64> {
        match self.map.get(key) {
            None => Err(self.problem(key, StateProblem::Missing)),
            Some(StateValue::Number(n)) if n.is_finite() && *n >= 0.0 => Ok(*n),
            Some(_) => Err(self.problem(key, StateProblem::Expected("a finite number >= 0"))),
        }
    }
}
