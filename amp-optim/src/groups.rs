//! What SGD and Adam share around their updates: the checked construction of their
//! parameter groups, one optional state per parameter (absent until its first step),
//! and the state dict's writing and checked reading.

use std::collections::BTreeMap;

use amp_autograd::Tensor;
use serde_json::Value;

use crate::optimizer::{check_param_groups, ParamGroup};
use crate::state_dict::{group_indices, place_state, GroupReader, StateEntry};
use crate::{Error, OptimizerStateDict, Result, StateValue};

/// An optimizer's per-group options, with PyTorch's constructor checks.
pub(crate) trait GroupOptions: Copy {
    /// PyTorch's checks of the options and the learning rate `lr`, in its order.
    fn check(&self, lr: f64) -> Result<()>;
}

/// The one group of a constructor's `params`, after its checks: the options first,
/// then a parameter list that is not empty.
pub(crate) fn one_group<O: GroupOptions>(
    params: Vec<Tensor>,
    lr: f64,
    options: O,
) -> Result<Vec<ParamGroup<O>>> {
    options.check(lr)?;
    if params.is_empty() {
        return Err(Error::EmptyParameterList);
    }
    Ok(vec![ParamGroup {
        params,
        lr,
        options,
    }])
}

/// The state of every parameter of `groups`, `[group][position]`, all absent, after
/// the checks: each group's options, then the groups together ([`check_param_groups`]).
pub(crate) fn fresh_state<O: GroupOptions, S>(
    groups: &[ParamGroup<O>],
) -> Result<Vec<Vec<Option<S>>>> {
    for g in groups {
        g.options.check(g.lr)?;
    }
    check_param_groups(groups)?;
    Ok(groups
        .iter()
        .map(|g| g.params.iter().map(|_| None).collect())
        .collect())
}

/// The state dict of `groups` and their `state`: each present state as `entries` writes
/// it, and each group's hyper-parameters as `hyper` writes them (a JSON object, from the
/// learning rate and the options) followed by the group's `params` index list.
pub(crate) fn write_state_dict<O, S>(
    groups: &[ParamGroup<O>],
    state: &[Vec<Option<S>>],
    entries: impl Fn(&S) -> BTreeMap<String, StateValue>,
    hyper: impl Fn(f64, &O) -> Value,
) -> OptimizerStateDict {
    let sizes: Vec<usize> = groups.iter().map(|g| g.params.len()).collect();
    let idx = group_indices(&sizes);
    let state = state
        .iter()
        .zip(&idx)
        .flat_map(|(sts, ids)| sts.iter().zip(ids))
        .filter_map(|(s, &i)| s.as_ref().map(|s| (i, entries(s))))
        .collect();
    let param_groups = groups
        .iter()
        .zip(idx)
        .map(|(g, ids)| {
            let Value::Object(mut m) = hyper(g.lr, &g.options) else {
                panic!("hyper-parameters are written as a JSON object")
            };
            m.insert("params".to_string(), ids.into());
            m
        })
        .collect();
    OptimizerStateDict {
        state,
        param_groups,
    }
}

/// A state dict read and checked against an optimizer, ready to be put in place.
pub(crate) struct Loaded<O, S> {
    hyper: Vec<(f64, O)>,
    state: Vec<Vec<Option<S>>>,
}

impl<O, S> Loaded<O, S> {
    /// Puts the hyper-parameters and the state read in place of `groups`' and `state`.
    pub(crate) fn apply(self, groups: &mut [ParamGroup<O>], state: &mut Vec<Vec<Option<S>>>) {
        for (g, (lr, options)) in groups.iter_mut().zip(self.hyper) {
            g.lr = lr;
            g.options = options;
        }
        *state = self.state;
    }
}

/// Everything `load_state_dict` needs, read from `sd` and checked against `groups`
/// without changing anything: each group's learning rate and the options `options`
/// reads (given the group's present options), with the constructor's checks, and each
/// saved parameter state as `param_state` reads it (given the saved entry, its
/// parameter and the group's options as read).
pub(crate) fn read_state_dict<O: GroupOptions, S>(
    groups: &[ParamGroup<O>],
    sd: &OptimizerStateDict,
    options: impl Fn(&GroupReader<'_>, &O) -> Result<O>,
    param_state: impl Fn(&StateEntry<'_>, &Tensor, &O) -> Result<Option<S>>,
) -> Result<Loaded<O, S>> {
    let sizes: Vec<usize> = groups.iter().map(|g| g.params.len()).collect();
    let placed = place_state(sd, &sizes)?;
    let mut hyper = Vec::with_capacity(groups.len());
    let mut state = Vec::with_capacity(groups.len());
    for (gi, (g, pg)) in groups.iter().zip(&sd.param_groups).enumerate() {
        let r = GroupReader::new(gi, pg);
        let lr = r.number("lr")?;
        let o = options(&r, &g.options)?;
        o.check(lr)?;
        hyper.push((lr, o));
        let sts = g
            .params
            .iter()
            .zip(&placed[gi])
            .map(|(p, entry)| match entry {
                None => Ok(None),
                Some(e) => param_state(e, p, &o),
            })
            .collect::<Result<Vec<_>>>()?;
        state.push(sts);
    }
    Ok(Loaded { hyper, state })
}

/// The public constructors and `param_groups` accessors of optimizer `$opt`, with
/// fields `groups` (of options `$options`), `state` (per parameter, as [`fresh_state`]
/// makes it) and `id` (an [`IdSlot`](crate::IdSlot)); and the [`GroupOptions`] of
/// `$options`, its `validate`.
macro_rules! grouped_optimizer {
    ($opt:ident, $options:ident) => {
        impl $crate::groups::GroupOptions for $options {
            fn check(&self, lr: f64) -> $crate::Result<()> {
                self.validate(lr)
            }
        }

        impl $opt {
            #[doc = concat!("One group of `params` with learning rate `lr`. The options are checked first ([`", stringify!($options), "::validate`]), then the parameters: not empty, leaves only.")]
            pub fn new(
                params: Vec<amp_autograd::Tensor>,
                lr: f64,
                options: $options,
            ) -> $crate::Result<Self> {
                Self::with_groups($crate::groups::one_group(params, lr, options)?)
            }

            #[doc = concat!("Several groups, each with its own learning rate and options (each checked as in [`", stringify!($opt), "::new`]); at least one group, no parameter in two groups.")]
            pub fn with_groups(groups: Vec<$crate::ParamGroup<$options>>) -> $crate::Result<Self> {
                Ok($opt {
                    state: $crate::groups::fresh_state(&groups)?,
                    groups,
                    id: $crate::IdSlot::new(),
                })
            }

            /// The parameter groups.
            pub fn param_groups(&self) -> &[$crate::ParamGroup<$options>] {
                &self.groups
            }

            /// The parameter groups, to change learning rates or options.
            pub fn param_groups_mut(&mut self) -> &mut [$crate::ParamGroup<$options>] {
                &mut self.groups
            }
        }
    };
}

/// The [`Optimizer`](crate::Optimizer) methods that come from an optimizer's fields
/// alone: `id` (an [`IdSlot`](crate::IdSlot)), `groups`, and `state` (per parameter, as
/// [`fresh_state`] makes it), with its `read_state_dict` (returning a [`Loaded`]).
/// Goes inside the `impl Optimizer` block.
macro_rules! group_optimizer_methods {
    () => {
        fn id(&self) -> $crate::OptimizerId {
            self.id.get()
        }

        fn params(&self) -> Vec<amp_autograd::Tensor> {
            self.groups
                .iter()
                .flat_map(|g| g.params.iter().cloned())
                .collect()
        }

        fn learning_rates(&self) -> Vec<f64> {
            self.groups.iter().map(|g| g.lr).collect()
        }

        fn set_learning_rate(&mut self, lr: f64) {
            self.groups.iter_mut().for_each(|g| g.lr = lr);
        }

        fn load_state_dict(&mut self, sd: &$crate::OptimizerStateDict) -> $crate::Result<()> {
            let loaded = self.read_state_dict(sd)?;
            loaded.apply(&mut self.groups, &mut self.state);
            Ok(())
        }

        fn validate_state_dict(&self, sd: &$crate::OptimizerStateDict) -> $crate::Result<()> {
            self.read_state_dict(sd).map(|_| ())
        }
    };
}

pub(crate) use {group_optimizer_methods, grouped_optimizer};
