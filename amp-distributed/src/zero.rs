//! ZeRO stage 1 (`torch.distributed.optim.ZeroRedundancyOptimizer`): the optimizer
//! state is sharded over the ranks; each rank steps its own parameters and hands them
//! to the others.

use std::collections::BTreeMap;
use std::sync::Arc;

use amp_autograd::Tensor;
use amp_optim::{IdSlot, Optimizer, OptimizerId, OptimizerStateDict};
use amp_tensor::{DType, Device, Tensor as Raw};
use serde_json::Value;

use crate::{Error, ProcessGroup, Result, Work};

/// The owner rank of each parameter, given the parameters' element counts: PyTorch's
/// `_partition_parameters`. The parameters are taken largest first (ties in parameter
/// order) and each goes to the rank with the fewest elements so far (ties: the lowest
/// rank), so the shards are about equal in size. Deterministic: every rank computes the
/// same assignment from the same sizes.
pub fn partition_parameters(sizes: &[usize], world: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    // A stable sort: equal sizes keep parameter order.
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]));
    let mut load = vec![0usize; world.max(1)];
    let mut owner = vec![0; sizes.len()];
    for i in order {
        let r = (0..load.len())
            .min_by_key(|&r| (load[r], r))
            .expect("at least one rank");
        owner[i] = r;
        load[r] += sizes[i];
    }
    owner
}

/// The parameters one broadcast carries: one owner, one dtype, one device.
#[derive(Debug)]
struct FlatGroup {
    owner: usize,
    dtype: DType,
    device: Device,
    /// Global parameter indices, in parameter order.
    params: Vec<usize>,
    numel: usize,
}

/// ZeRO-1 (PyTorch's `ZeroRedundancyOptimizer(params, optimizer_class)`): every rank
/// holds all the parameters but keeps optimizer state only for its own shard of them.
///
/// - The parameters are assigned to the ranks by [`partition_parameters`]; `make`
///   builds the inner optimizer over this rank's shard (in parameter order), so Adam's
///   moments exist for a `1/world` share of the model on each rank.
/// - [`step`](Optimizer::step) steps the inner optimizer (this rank's parameters only),
///   then every parameter is broadcast from its owner (one broadcast per owner, dtype
///   and device, all in flight together), so every rank ends the step with identical
///   parameters. The broadcast copies exactly: the result is bit for bit the one
///   of a replicated optimizer whose update of a parameter depends on that parameter
///   alone (SGD, Adam).
/// - [`params`](Optimizer::params) is every parameter; [`zero_grad`](Optimizer::zero_grad)
///   clears every gradient; the learning rates are the inner optimizer's.
/// - With a `GradScaler`: the scaler unscales and checks the gradients of
///   [`params`](Optimizer::params), i.e. all of them on every rank (the gradients of the
///   parameters other ranks own are unscaled too, so `.grad` means the same everywhere
///   and `clip_grad_norm_` over all parameters works). Use
///   [`crate::sharded_grad_scaler`]: it all-reduces the inf flag with MAX, so every rank
///   skips the same steps even when the ranks' gradients differ (without DDP). When the
///   inner optimizer steps with scaling itself (Adam's fused path) the parameters are
///   broadcast after a skipped step too, so the collectives match on every rank
///   whatever each one decided.
/// - Checkpoints: [`state_dict`](Optimizer::state_dict) is this rank's shard: the inner
///   state dict with its indices turned into global parameter indices (the groups'
///   `params` lists say which parameters this rank owns); it loads back on the same rank
///   of a group of the same size. [`consolidated_state_dict`](Self::consolidated_state_dict)
///   gathers every shard into the state dict a replicated optimizer would have (PyTorch's
///   `consolidate_state_dict(to)` + `state_dict()`), which
///   [`load_consolidated_state_dict`](Self::load_consolidated_state_dict) loads on any
///   number of ranks.
///
/// Gradients are still all-reduced in full by [`crate::DistributedDataParallel`] (a
/// reduce-scatter would suffice for the owned shard; the all-reduce keeps every `.grad`
/// usable).
pub struct ShardedOptimizer<O: Optimizer> {
    id: IdSlot,
    group: Arc<dyn ProcessGroup>,
    params: Vec<Tensor>,
    owner: Vec<usize>,
    /// This rank's parameters (global indices, ascending): the inner optimizer's
    /// parameter `k` is `params[shard[k]]`.
    shard: Vec<usize>,
    flat: Vec<FlatGroup>,
    inner: O,
}

impl<O: Optimizer> std::fmt::Debug for ShardedOptimizer<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedOptimizer")
            .field("rank", &self.group.rank())
            .field("size", &self.group.size())
            .field("params", &self.params.len())
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

/// This crate's error carried through an optimizer method (as a hook error of
/// `amp_optim::Error::Autograd`; `Error::from` recovers it).
fn to_optim(e: Error) -> amp_optim::Error {
    amp_optim::Error::Autograd(e.into())
}

impl<O: Optimizer> ShardedOptimizer<O> {
    /// Shard `params` over `group`'s ranks and build this rank's optimizer with `make`
    /// over its shard. Every rank must pass the same parameters (same order and sizes;
    /// [`crate::DistributedDataParallel`]'s `parameters()` are). Fails with
    /// [`Error::EmptyShard`] when a rank would get no parameter (more ranks than
    /// parameters), and with [`Error::Optim`] when `make` fails.
    pub fn new<F>(params: Vec<Tensor>, group: Arc<dyn ProcessGroup>, make: F) -> Result<Self>
    where
        F: FnOnce(Vec<Tensor>) -> amp_optim::Result<O>,
    {
        let (rank, world) = (group.rank(), group.size());
        let sizes: Vec<usize> = params.iter().map(Tensor::elem_count).collect();
        let owner = partition_parameters(&sizes, world);
        for r in 0..world {
            if !owner.contains(&r) {
                return Err(Error::EmptyShard {
                    rank: r,
                    world,
                    params: params.len(),
                });
            }
        }
        let shard: Vec<usize> = (0..params.len()).filter(|&i| owner[i] == rank).collect();
        let inner = make(shard.iter().map(|&i| params[i].clone()).collect())?;
        let mut flat: Vec<FlatGroup> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let (dtype, device) = (p.dtype(), p.device());
            let at = flat
                .iter()
                .position(|f| f.owner == owner[i] && f.dtype == dtype && f.device == device);
            let f = match at {
                Some(at) => &mut flat[at],
                None => {
                    flat.push(FlatGroup {
                        owner: owner[i],
                        dtype,
                        device,
                        params: Vec::new(),
                        numel: 0,
                    });
                    flat.last_mut().expect("pushed")
                }
            };
            f.params.push(i);
            f.numel += sizes[i];
        }
        Ok(ShardedOptimizer {
            id: IdSlot::new(),
            group,
            params,
            owner,
            shard,
            flat,
            inner,
        })
    }

    /// The inner optimizer (over this rank's shard).
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// The owner rank of every parameter.
    pub fn owners(&self) -> &[usize] {
        &self.owner
    }

    /// The global indices of the parameters this rank owns, ascending.
    pub fn shard(&self) -> &[usize] {
        &self.shard
    }

    /// The process group.
    pub fn group(&self) -> Arc<dyn ProcessGroup> {
        self.group.clone()
    }

    /// Broadcast every parameter from its owner (collective: every rank calls it at the
    /// same point). [`step`](Optimizer::step) calls it; call it yourself after changing
    /// owned parameters outside the optimizer.
    pub fn sync_params(&self) -> Result<()> {
        let rank = self.group.rank();
        let mut pending: Vec<(&FlatGroup, Raw, Work)> = Vec::with_capacity(self.flat.len());
        for f in &self.flat {
            let buf = Raw::zeros_on([f.numel], f.dtype, f.device)?;
            if f.owner == rank {
                let mut off = 0;
                for &i in &f.params {
                    let d = self.params[i].data();
                    let n = d.elem_count();
                    buf.narrow(0, off, n)?.copy_(&d.reshape([n])?)?;
                    off += n;
                }
            }
            let work = self.group.broadcast_async(&buf, f.owner)?;
            pending.push((f, buf, work));
        }
        for (f, buf, work) in pending {
            work.wait()?;
            if f.owner == rank {
                continue;
            }
            let mut off = 0;
            for &i in &f.params {
                let d = self.params[i].data();
                let n = d.elem_count();
                d.copy_(&buf.narrow(0, off, n)?.reshape(d.dims())?)?;
                off += n;
            }
        }
        Ok(())
    }

    /// `sd` (global indices, as [`Optimizer::state_dict`] writes) with the inner
    /// optimizer's indices; an index this rank does not own is [`Error::ShardMismatch`].
    fn to_local(&self, sd: &OptimizerStateDict) -> Result<OptimizerStateDict> {
        let rank = self.group.rank();
        let local = |g: usize| -> Result<usize> {
            self.shard
                .binary_search(&g)
                .map_err(|_| Error::ShardMismatch { rank, index: g })
        };
        let mut state = BTreeMap::new();
        for (&g, v) in &sd.state {
            state.insert(local(g)?, v.clone());
        }
        let mut param_groups = Vec::with_capacity(sd.param_groups.len());
        for group in &sd.param_groups {
            let mut group = group.clone();
            if let Some(Value::Array(ids)) = group.get("params") {
                let mapped = ids
                    .iter()
                    .map(|v| match v.as_u64() {
                        Some(g) => Ok(Value::from(local(g as usize)?)),
                        // Not an index: the inner optimizer's checks reject it.
                        None => Ok(v.clone()),
                    })
                    .collect::<Result<Vec<Value>>>()?;
                group.insert("params".into(), Value::Array(mapped));
            }
            param_groups.push(group);
        }
        Ok(OptimizerStateDict {
            state,
            param_groups,
        })
    }

    /// Gather every rank's shard into the state dict of one optimizer over all the
    /// parameters (collective): state keyed by global parameter index, and group `g`
    /// listing every rank's parameters of its group `g` (with rank 0's hyper-parameters;
    /// [`set_learning_rate`](Optimizer::set_learning_rate) keeps them equal). `Some` on
    /// rank `to`, `None` on the others (PyTorch's `consolidate_state_dict(to)`). The
    /// shards travel as JSON bytes by two all-gathers (their lengths, then the bytes).
    pub fn consolidated_state_dict(&self, to: usize) -> Result<Option<OptimizerStateDict>> {
        crate::group::check_rank("consolidated_state_dict", to, self.group.size())?;
        let mine = serde_json::to_vec(&self.state_dict()).map_err(|e| Error::StateTransfer {
            rank: self.group.rank(),
            reason: e.to_string(),
        })?;
        let shards = all_gather_bytes(&*self.group, &mine)?;
        if self.group.rank() != to {
            return Ok(None);
        }
        let mut full = OptimizerStateDict::default();
        for (r, bytes) in shards.iter().enumerate() {
            let sd: OptimizerStateDict =
                serde_json::from_slice(bytes).map_err(|e| Error::StateTransfer {
                    rank: r,
                    reason: e.to_string(),
                })?;
            if r == 0 {
                full.param_groups = sd.param_groups.clone();
                full.param_groups.iter_mut().for_each(|g| {
                    g.insert("params".into(), Value::Array(Vec::new()));
                });
            }
            if sd.param_groups.len() != full.param_groups.len() {
                return Err(Error::StateTransfer {
                    rank: r,
                    reason: format!(
                        "{} parameter groups where rank 0 has {}",
                        sd.param_groups.len(),
                        full.param_groups.len()
                    ),
                });
            }
            for (into, from) in full.param_groups.iter_mut().zip(&sd.param_groups) {
                if let (Some(Value::Array(all)), Some(Value::Array(ids))) =
                    (into.get_mut("params"), from.get("params"))
                {
                    all.extend(ids.iter().cloned());
                }
            }
            full.state.extend(sd.state);
        }
        for g in &mut full.param_groups {
            if let Some(Value::Array(ids)) = g.get_mut("params") {
                ids.sort_by_key(|v| v.as_u64());
            }
        }
        Ok(Some(full))
    }

    /// Load a consolidated state dict (from
    /// [`consolidated_state_dict`](Self::consolidated_state_dict), saved with any number
    /// of ranks): this rank takes its own parameters' entries, with the groups'
    /// hyper-parameters. Not collective. All or nothing, as
    /// [`Optimizer::load_state_dict`].
    pub fn load_consolidated_state_dict(&mut self, full: &OptimizerStateDict) -> Result<()> {
        // This rank's group structure: which of its parameters each group holds.
        let mine = self.state_dict();
        if mine.param_groups.len() != full.param_groups.len() {
            return Err(amp_optim::Error::GroupCountMismatch.into());
        }
        let mut sd = OptimizerStateDict::default();
        for (own, saved) in mine.param_groups.iter().zip(&full.param_groups) {
            let mut g = saved.clone();
            g.insert(
                "params".into(),
                own.get("params")
                    .cloned()
                    .unwrap_or(Value::Array(Vec::new())),
            );
            sd.param_groups.push(g);
        }
        for &g in &self.shard {
            if let Some(v) = full.state.get(&g) {
                sd.state.insert(g, v.clone());
            }
        }
        self.load_state_dict(&sd).map_err(Error::from)
    }
}

/// Every rank's `bytes` (of any length), on every rank: the lengths by one all-gather,
/// then the bytes, padded to the longest, six to a float64 (exact: below 2^48).
fn all_gather_bytes(g: &dyn ProcessGroup, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let size = g.size();
    let len = Raw::from_vec(vec![bytes.len() as f64], [1])?;
    let lens: Vec<Raw> = (0..size).map(|_| len.zeros_like()).collect();
    g.all_gather(&lens, &len)?;
    let lens: Vec<usize> = lens.iter().map(|t| t.to_vec_f64()[0] as usize).collect();
    let words = lens.iter().max().copied().unwrap_or(0).div_ceil(6);
    let mut packed = vec![0f64; words];
    for (w, chunk) in packed.iter_mut().zip(bytes.chunks(6)) {
        let mut v = 0u64;
        for (k, &b) in chunk.iter().enumerate() {
            v |= u64::from(b) << (8 * k);
        }
        *w = v as f64;
    }
    let input = Raw::from_vec(packed, [words])?;
    let outs: Vec<Raw> = (0..size).map(|_| input.zeros_like()).collect();
    g.all_gather(&outs, &input)?;
    Ok(outs
        .iter()
        .zip(lens)
        .map(|(t, n)| {
            let mut out = Vec::with_capacity(words * 6);
            for w in t.to_vec_f64() {
                let v = w as u64;
                out.extend((0..6).map(|k| (v >> (8 * k)) as u8));
            }
            out.truncate(n);
            out
        })
        .collect())
}

impl<O: Optimizer> Optimizer for ShardedOptimizer<O> {
    fn id(&self) -> OptimizerId {
        self.id.get()
    }

    /// Step this rank's shard, then broadcast every parameter from its owner.
    fn step(&mut self) -> amp_optim::Result<()> {
        self.inner.step()?;
        self.sync_params().map_err(to_optim)
    }

    fn params(&self) -> Vec<Tensor> {
        self.params.clone()
    }

    fn learning_rates(&self) -> Vec<f64> {
        self.inner.learning_rates()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.inner.set_learning_rate(lr)
    }

    /// This rank's shard, with global parameter indices (see the type's docs).
    fn state_dict(&self) -> OptimizerStateDict {
        let sd = self.inner.state_dict();
        let state = sd
            .state
            .into_iter()
            .map(|(k, v)| (self.shard[k], v))
            .collect();
        let param_groups = sd
            .param_groups
            .into_iter()
            .map(|mut g| {
                if let Some(Value::Array(ids)) = g.get("params") {
                    let ids: Vec<Value> = ids
                        .iter()
                        .map(|v| match v.as_u64() {
                            Some(k) => Value::from(self.shard[k as usize]),
                            None => v.clone(),
                        })
                        .collect();
                    g.insert("params".into(), Value::Array(ids));
                }
                g
            })
            .collect();
        OptimizerStateDict {
            state,
            param_groups,
        }
    }

    fn load_state_dict(&mut self, sd: &OptimizerStateDict) -> amp_optim::Result<()> {
        let local = self.to_local(sd).map_err(to_optim)?;
        self.inner.load_state_dict(&local)
    }

    fn validate_state_dict(&self, sd: &OptimizerStateDict) -> amp_optim::Result<()> {
        let local = self.to_local(sd).map_err(to_optim)?;
        self.inner.validate_state_dict(&local)
    }

    fn supports_amp_scaling(&self) -> bool {
        self.inner.supports_amp_scaling()
    }

    /// The inner optimizer's scaled step over this rank's shard, then the broadcast of
    /// every parameter (after a skipped step too: the collectives stay matched).
    fn step_with_scaling(
        &mut self,
        grad_scale: Option<&Raw>,
        found_inf: &Raw,
    ) -> amp_optim::Result<bool> {
        let stepped = self.inner.step_with_scaling(grad_scale, found_inf)?;
        self.sync_params().map_err(to_optim)?;
        Ok(stepped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_is_greedy_largest_first() {
        // Largest first, to the lighter rank: 10 -> r0 (loads 10, 0), 8 -> r1 (10, 8),
        // 5 -> r1 (10, 13), 3 -> r0 (13, 13), 1 -> r0 on the tie (14, 13).
        let owners = partition_parameters(&[3, 10, 5, 8, 1], 2);
        assert_eq!(owners, vec![0, 0, 1, 1, 0]);
        assert_eq!(partition_parameters(&[4, 4, 4], 3), vec![0, 1, 2]);
        assert_eq!(partition_parameters(&[4, 4], 1), vec![0, 0]);
    }

    #[test]
    fn bytes_pack_six_to_a_float() {
        let g = crate::SingleProcess;
        for n in [0, 1, 5, 6, 7, 13, 300] {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            let got = all_gather_bytes(&g, &bytes).unwrap();
            assert_eq!(got, vec![bytes]);
        }
    }
}
