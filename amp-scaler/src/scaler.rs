//! `GradScaler`: dynamic loss scaling with PyTorch's exact semantics (`torch.amp.GradScaler`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use amp_autograd::{ops, Tensor};
use amp_optim::{Optimizer, OptimizerId};
use amp_tensor::{DType, Device, Tensor as Raw};

use crate::options::GradScalerOptions;
use crate::reduction::FoundInfReduction;
use crate::state_dict::ScalerStateDict;
use crate::stats::ScalerStats;
use crate::{Result, ScalerError};

/// Where an optimizer is in the scale → unscale → step → update cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Ready,
    Unscaled,
    Stepped,
}

#[derive(Debug)]
struct OptState {
    stage: Stage,
    found_inf_per_device: BTreeMap<DeviceKey, Raw>,
    /// Whether `step` skipped: the flag it read, so that `update` need not read it again.
    skipped: Option<bool>,
}

impl Default for OptState {
    fn default() -> Self {
        OptState {
            stage: Stage::Ready,
            found_inf_per_device: BTreeMap::new(),
            skipped: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct DeviceKey(u8, usize);

impl From<Device> for DeviceKey {
    fn from(d: Device) -> Self {
        match d {
            Device::Cpu => DeviceKey(0, 0),
            Device::Cuda(i) => DeviceKey(1, i),
        }
    }
}

/// What [`GradScaler::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// The optimizer stepped.
    Stepped,
    /// An inf/NaN gradient was found: the step was skipped, nothing changed.
    Skipped,
}

impl StepOutcome {
    /// `true` for [`StepOutcome::Skipped`].
    pub fn is_skipped(self) -> bool {
        self == StepOutcome::Skipped
    }
}

/// What to scale: a tensor or (nested) lists of tensors.
#[derive(Debug, Clone)]
pub enum Outputs {
    Tensor(Tensor),
    List(Vec<Outputs>),
}

/// `update(new_scale=...)`.
#[derive(Debug, Clone)]
pub enum NewScale {
    Value(f64),
    Tensor(Tensor),
}

/// Dynamic loss scaling for mixed-precision training (`torch.amp.GradScaler`).
///
/// The scale (a 0-dim float32 tensor) and the growth tracker (a 0-dim int32 tensor)
/// live beside the gradients and are created by the first [`GradScaler::scale`]. The
/// one value read back to the host is the skip decision in [`GradScaler::step`].
#[derive(Debug)]
pub struct GradScaler {
    opts: GradScalerOptions,
    init_growth_tracker: i64,
    scale: Option<Raw>,
    growth_tracker: Option<Raw>,
    /// Keyed by [`Optimizer::id`], which survives moves (an address would not).
    per_optimizer: HashMap<OptimizerId, OptState>,
    consecutive_overflows: u32,
    stats: ScalerStats,
    /// Combines the inf checks of all processes (data-parallel training), if set.
    found_inf_reduction: Option<Arc<dyn FoundInfReduction>>,
}

impl GradScaler {
    /// A scaler with PyTorch's defaults.
    pub fn new() -> Self {
        Self::with_options(GradScalerOptions::default()).expect("defaults are valid")
    }

    /// A scaler with these options (validated only when enabled, as PyTorch).
    pub fn with_options(opts: GradScalerOptions) -> Result<Self> {
        if opts.enabled {
            if opts.growth_factor <= 1.0 {
                return Err(ScalerError::GrowthFactor);
            }
            if opts.backoff_factor >= 1.0 {
                return Err(ScalerError::BackoffFactor);
            }
        }
        Ok(GradScaler {
            opts,
            init_growth_tracker: 0,
            scale: None,
            growth_tracker: None,
            per_optimizer: HashMap::new(),
            consecutive_overflows: 0,
            stats: ScalerStats::default(),
            found_inf_reduction: None,
        })
    }

    /// This scaler, combining each inf check with the other processes' through
    /// `reduction` before the skip decision (PyTorch's `ShardedGradScaler`): the flags of
    /// all devices are summed into one host flag, reduced with MAX, and that flag stands
    /// for every device, so a process whose gradients are all finite still skips when
    /// another found an inf, and the scale backs off alike everywhere. It costs a host
    /// read of the flag and one all-reduce per inf check.
    pub fn with_found_inf_reduction(mut self, reduction: Arc<dyn FoundInfReduction>) -> Self {
        self.found_inf_reduction = Some(reduction);
        self
    }

    /// Unscale (or only check) `opt`'s gradients, then combine the flags across
    /// processes when a reduction is set.
    fn check_grads(
        &self,
        opt: &dyn Optimizer,
        inv_scale: &Raw,
        allow_fp16: bool,
    ) -> Result<BTreeMap<DeviceKey, Raw>> {
        let mut found = unscale_grads(opt, inv_scale, allow_fp16)?;
        let Some(reduction) = &self.found_inf_reduction else {
            return Ok(found);
        };
        let mut flag = Raw::zeros([1usize], DType::F32);
        for f in found.values() {
            flag = amp_kernels::add(&flag, &f.to_device(Device::Cpu)?)?;
        }
        reduction
            .all_reduce_max(&flag)
            .map_err(ScalerError::FoundInfReduction)?;
        if found.is_empty() {
            // No gradient here, but the decision must be the one every process takes.
            found.insert(Device::Cpu.into(), flag);
        } else {
            for f in found.values() {
                f.copy_(&flag.to_device(f.device())?)?;
            }
        }
        Ok(found)
    }

    /// Whether scaling is on.
    pub fn is_enabled(&self) -> bool {
        self.opts.enabled
    }

    fn lazy_init(&mut self, device: Device) -> Result<()> {
        if self.scale.is_none() {
            self.scale = Some(Raw::full((), self.opts.init_scale, DType::F32).to_device(device)?);
            self.growth_tracker =
                Some(Raw::full((), self.init_growth_tracker, DType::I32).to_device(device)?);
        }
        Ok(())
    }

    /// `outputs * scale` with ordinary type promotion (a 0-dim bfloat16 loss gives a
    /// float32 result; a 1-D bfloat16 tensor stays bfloat16). Disabled: the input.
    pub fn scale(&mut self, outputs: &Tensor) -> Result<Tensor> {
        if !self.opts.enabled {
            return Ok(outputs.clone());
        }
        self.lazy_init(outputs.device())?;
        let s = Tensor::from_raw(
            self.scale
                .clone()
                .expect("initialised")
                .to_device(outputs.device())?,
        );
        Ok(ops::mul(outputs, &s)?)
    }

    /// [`GradScaler::scale`] over a (nested) list of tensors.
    pub fn scale_outputs(&mut self, outputs: &Outputs) -> Result<Outputs> {
        match outputs {
            Outputs::Tensor(t) => Ok(Outputs::Tensor(self.scale(t)?)),
            Outputs::List(v) => Ok(Outputs::List(
                v.iter()
                    .map(|o| self.scale_outputs(o))
                    .collect::<Result<_>>()?,
            )),
        }
    }

    /// [`GradScaler::scale`] over a list of tensors.
    pub fn scale_all(&mut self, outputs: &[Tensor]) -> Result<Vec<Tensor>> {
        outputs.iter().map(|t| self.scale(t)).collect()
    }

    fn opt_state(&mut self, opt: &dyn Optimizer) -> &mut OptState {
        self.per_optimizer.entry(opt.id()).or_default()
    }

    /// Divide the optimizer's gradients by the scale in place and record whether any is
    /// inf/NaN. Panics (PyTorch's text) when called twice before `update`, after
    /// `step`, before any `scale`, or with float16 gradients; see
    /// [`GradScaler::try_unscale_`] for the `Result` form.
    pub fn unscale_(&mut self, opt: &mut dyn Optimizer) {
        if let Err(e) = self.try_unscale_(opt) {
            panic!("{e}");
        }
    }

    /// [`GradScaler::unscale_`] returning the error instead of panicking.
    pub fn try_unscale_(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        if !self.opts.enabled {
            return Ok(());
        }
        let Some(scale) = self.scale.clone() else {
            return Err(ScalerError::ScaleIsNone("unscale_"));
        };
        match self.opt_state(opt).stage {
            Stage::Unscaled => return Err(ScalerError::AlreadyUnscaled),
            Stage::Stepped => return Err(ScalerError::UnscaleAfterStep),
            Stage::Ready => {}
        }
        // PyTorch's `self._scale.double().reciprocal().float()`, on the scale's device
        // (no host read).
        let inv_scale =
            amp_kernels::reciprocal(&scale.to_dtype(DType::F64)?)?.to_dtype(DType::F32)?;
        let found = self.check_grads(opt, &inv_scale, false)?;
        let st = self.opt_state(opt);
        st.found_inf_per_device = found;
        st.stage = Stage::Unscaled;
        Ok(())
    }

    /// Unscale if not done yet, then step the optimizer unless an inf/NaN gradient was
    /// found. Disabled: just `opt.step()`.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<StepOutcome> {
        if !self.opts.enabled {
            opt.step()?;
            return Ok(StepOutcome::Stepped);
        }
        let Some(scale) = self.scale.clone() else {
            return Err(ScalerError::ScaleIsNone("step"));
        };
        if self.opt_state(opt).stage == Stage::Stepped {
            return Err(ScalerError::AlreadyStepped);
        }
        let outcome = if opt.supports_amp_scaling() {
            let stage = self.opt_state(opt).stage;
            if stage == Stage::Ready {
                let one = Raw::full([1usize], 1.0f64, DType::F32);
                let found = self.check_grads(opt, &one, true)?;
                self.opt_state(opt).found_inf_per_device = found;
            }
            let found_inf = sum_found(&self.opt_state(opt).found_inf_per_device, scale.device())?;
            let grad_scale = (stage != Stage::Unscaled).then_some(&scale);
            // The optimizer reads the flag once (the one host sync) and reports it.
            if opt.step_with_scaling(grad_scale, &found_inf)? {
                StepOutcome::Stepped
            } else {
                StepOutcome::Skipped
            }
        } else {
            if self.opt_state(opt).stage == Stage::Ready {
                self.try_unscale_(opt)?;
            }
            let st = self.opt_state(opt);
            if st.found_inf_per_device.is_empty() {
                return Err(ScalerError::NoInfChecksForOptimizer);
            }
            // The one host sync: the skip decision.
            let mut any = false;
            for f in st.found_inf_per_device.values() {
                any |= f.item_f64()? != 0.0;
            }
            if any {
                StepOutcome::Skipped
            } else {
                opt.step()?;
                StepOutcome::Stepped
            }
        };
        let st = self.opt_state(opt);
        st.stage = Stage::Stepped;
        st.skipped = Some(outcome.is_skipped());
        self.stats.record_step(outcome.is_skipped());
        Ok(outcome)
    }

    /// `step(optimizer, closure)`: PyTorch refuses closures while enabled; disabled, the
    /// closure runs and the optimizer steps.
    pub fn step_with_closure<F: FnMut() -> amp_autograd::Result<Tensor>>(
        &mut self,
        opt: &mut dyn Optimizer,
        mut closure: F,
    ) -> Result<StepOutcome> {
        if self.opts.enabled {
            return Err(ScalerError::Closure);
        }
        closure()?;
        opt.step()?;
        Ok(StepOutcome::Stepped)
    }

    /// Update the scale from the inf checks of every optimizer stepped since the last
    /// update (the exact `_amp_update_scale_` kernel), and reset their stages.
    pub fn update(&mut self) -> Result<()> {
        self.update_impl(None)
    }

    /// Set the scale to `new_scale` (the growth tracker is left alone), and reset the
    /// optimizers' stages.
    pub fn update_with(&mut self, new_scale: NewScale) -> Result<()> {
        self.update_impl(Some(new_scale))
    }

    fn update_impl(&mut self, new_scale: Option<NewScale>) -> Result<()> {
        if !self.opts.enabled {
            return Ok(());
        }
        let Some(scale) = self.scale.clone() else {
            return Err(ScalerError::ScaleIsNone("update"));
        };
        let tracker = self
            .growth_tracker
            .clone()
            .expect("initialised with the scale");
        match new_scale {
            Some(NewScale::Value(v)) => scale.fill_(v)?,
            Some(NewScale::Tensor(t)) => {
                if t.elem_count() != 1 || t.requires_grad() {
                    return Err(ScalerError::BadNewScale);
                }
                scale.copy_(&t.data().reshape(())?)?;
            }
            None => {
                let founds: Vec<Raw> = self
                    .per_optimizer
                    .values()
                    .flat_map(|s| s.found_inf_per_device.values().cloned())
                    .collect();
                if founds.is_empty() {
                    return Err(ScalerError::NoInfChecks);
                }
                let mut combined = founds[0].clone();
                for f in &founds[1..] {
                    combined = amp_kernels::add(&combined, f)?;
                }
                // The step already read each optimizer's flag; read the sum only when an
                // optimizer was unscaled but not stepped.
                let stepped: Option<Vec<bool>> =
                    self.per_optimizer.values().map(|s| s.skipped).collect();
                let overflow = match stepped {
                    Some(skipped) => skipped.contains(&true),
                    None => combined.item_f64()? != 0.0,
                };
                self.stats.last_found_inf = overflow;
                let effective = if overflow {
                    self.consecutive_overflows += 1;
                    if self.consecutive_overflows >= self.opts.hysteresis {
                        self.consecutive_overflows = 0;
                        combined
                    } else {
                        // tolerated overflow (hysteresis): no backoff, growth restarts
                        tracker.fill_(0i64)?;
                        self.per_optimizer.clear();
                        return Ok(());
                    }
                } else {
                    self.consecutive_overflows = 0;
                    combined
                };
                amp_kernels::update_scale_(
                    &scale,
                    &tracker,
                    &effective,
                    self.opts.growth_factor,
                    self.opts.backoff_factor,
                    self.opts.growth_interval,
                )?;
                self.clamp_scale(&scale)?;
            }
        }
        self.per_optimizer.clear();
        Ok(())
    }

    fn clamp_scale(&self, scale: &Raw) -> Result<()> {
        if self.opts.min_scale.is_none() && self.opts.max_scale.is_none() {
            return Ok(());
        }
        let v = scale.item_f64()?;
        let mut c = v;
        if let Some(lo) = self.opts.min_scale {
            c = c.max(lo);
        }
        if let Some(hi) = self.opts.max_scale {
            c = c.min(hi);
        }
        if c != v {
            scale.fill_(c)?;
        }
        Ok(())
    }

    /// The current scale (1.0 when disabled; `init_scale` before the first `scale`).
    pub fn get_scale(&self) -> f64 {
        if !self.opts.enabled {
            return 1.0;
        }
        match &self.scale {
            None => self.opts.init_scale,
            Some(s) => s.item_f64().expect("one element"),
        }
    }

    /// The scale tensor (0-dim float32), once created.
    pub fn scale_tensor(&self) -> Option<&Raw> {
        self.scale.as_ref()
    }

    /// The growth tracker (clean steps since the last growth or backoff).
    pub fn get_growth_tracker(&self) -> i64 {
        match &self.growth_tracker {
            None => self.init_growth_tracker,
            Some(t) => t.item_f64().expect("one element") as i64,
        }
    }

    pub fn get_growth_factor(&self) -> f64 {
        self.opts.growth_factor
    }
    pub fn set_growth_factor(&mut self, v: f64) {
        self.opts.growth_factor = v;
    }
    pub fn get_backoff_factor(&self) -> f64 {
        self.opts.backoff_factor
    }
    pub fn set_backoff_factor(&mut self, v: f64) {
        self.opts.backoff_factor = v;
    }
    pub fn get_growth_interval(&self) -> i64 {
        self.opts.growth_interval
    }
    pub fn set_growth_interval(&mut self, v: i64) {
        self.opts.growth_interval = v;
    }

    /// The stage of `opt` in the current iteration.
    pub fn stage(&self, opt: &dyn Optimizer) -> Stage {
        self.per_optimizer
            .get(&opt.id())
            .map_or(Stage::Ready, |s| s.stage)
    }

    /// Statistics beyond PyTorch: steps taken and skipped, and the last inf check.
    pub fn stats(&self) -> &ScalerStats {
        &self.stats
    }

    /// The state dict (`None` when disabled, which PyTorch returns as `{}`).
    pub fn state_dict(&self) -> Option<ScalerStateDict> {
        self.opts.enabled.then(|| ScalerStateDict {
            scale: self.get_scale(),
            growth_factor: self.opts.growth_factor,
            backoff_factor: self.opts.backoff_factor,
            growth_interval: self.opts.growth_interval,
            growth_tracker: self.get_growth_tracker(),
        })
    }

    /// The state dict as JSON (`{}` when disabled).
    pub fn state_dict_json(&self) -> serde_json::Value {
        match self.state_dict() {
            Some(sd) => sd.to_json(),
            None => serde_json::Value::Object(Default::default()),
        }
    }

    /// Restore from a state dict (`None` is an empty dict: an error). No-op when
    /// disabled. Nothing is validated, as in PyTorch.
    pub fn load_state_dict(&mut self, sd: Option<&ScalerStateDict>) -> Result<()> {
        if !self.opts.enabled {
            return Ok(());
        }
        let sd = sd.ok_or(ScalerError::EmptyStateDict)?;
        self.opts.init_scale = sd.scale;
        if let Some(s) = &self.scale {
            s.fill_(sd.scale)?;
        }
        self.opts.growth_factor = sd.growth_factor;
        self.opts.backoff_factor = sd.backoff_factor;
        self.opts.growth_interval = sd.growth_interval;
        self.init_growth_tracker = sd.growth_tracker;
        if let Some(t) = &self.growth_tracker {
            t.fill_(sd.growth_tracker)?;
        }
        Ok(())
    }

    /// [`GradScaler::load_state_dict`] from JSON (as PyTorch's dict, e.g. saved by
    /// `json.dumps(scaler.state_dict())`, read by [`ScalerStateDict::from_json`]). No-op
    /// when disabled; on an error nothing has changed.
    pub fn load_state_dict_json(&mut self, v: &serde_json::Value) -> Result<()> {
        if !self.opts.enabled {
            return Ok(());
        }
        self.load_state_dict(Some(&ScalerStateDict::from_json(v)?))
    }
}

impl Default for GradScaler {
    fn default() -> Self {
        Self::new()
    }
}

/// Unscale (or, with `inv_scale == 1`, only check) every gradient of `opt` with the
/// fused kernel, grouped by device; float16 gradients are refused unless `allow_fp16`.
fn unscale_grads(
    opt: &dyn Optimizer,
    inv_scale: &Raw,
    allow_fp16: bool,
) -> Result<BTreeMap<DeviceKey, Raw>> {
    let grads: Vec<Raw> = opt
        .params()
        .iter()
        .filter_map(|p| p.grad())
        .map(|g| g.data().clone())
        .collect();
    if !allow_fp16 && grads.iter().any(|g| g.dtype() == DType::F16) {
        return Err(ScalerError::Fp16Gradients);
    }
    let mut by_device: BTreeMap<DeviceKey, (Device, Vec<Raw>)> = BTreeMap::new();
    for g in grads {
        by_device
            .entry(g.device().into())
            .or_insert_with(|| (g.device(), Vec::new()))
            .1
            .push(g);
    }
    let mut out = BTreeMap::new();
    for (k, (dev, gs)) in by_device {
        let found = Raw::zeros([1usize], DType::F32).to_device(dev)?;
        amp_kernels::non_finite_check_and_unscale_(&gs, &found, &inv_scale.to_device(dev)?)?;
        out.insert(k, found);
    }
    Ok(out)
}

/// The flags of every device summed on `device` (the scale's), as PyTorch's
/// `sum(t.to(scaler.device) for t in found_inf_per_device.values())`.
fn sum_found(found: &BTreeMap<DeviceKey, Raw>, device: Device) -> Result<Raw> {
    let mut acc = Raw::zeros_on([1usize], DType::F32, device)?;
    for f in found.values() {
        acc = amp_kernels::add(&acc, &f.to_device(device)?)?;
    }
    Ok(acc)
}
