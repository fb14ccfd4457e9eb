//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

use std::collections::BTreeMap;

use amp_autograd::Tensor;
use amp_tensor::Tensor as Raw;
use serde_json::json;

use crate::json_float::to_json;
use crate::optimizer::{check_lr, check_param_groups, IdSlot, OptimizerId, ParamGroup};
use crate::state_dict::{group_indices, place_state, GroupReader};
use crate::update::{
    axpy, computes_in_f64, in_place, read, update, with_slice, with_slice_mut, zip3, Real,
};
use crate::{Error, Optimizer, OptimizerStateDict, Result, StateValue, TensorData};

/// SGD options (PyTorch's defaults: all zero / false).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SgdOptions {
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
}

/// `torch.optim.SGD`.
pub struct Sgd {
    groups: Vec<ParamGroup<SgdOptions>>,
    momentum_buffers: Vec<Vec<Option<Raw>>>,
    id: IdSlot,
}

impl SgdOptions {
    /// PyTorch's checks of `SGD(lr, momentum, dampening, weight_decay, nesterov)`, in
    /// its order. NaN is refused wherever a range is checked (PyTorch's `lr < 0.0`
    /// lets a NaN through and it turns every parameter into NaN; a NaN dampening too).
    pub fn validate(&self, lr: f64) -> Result<()> {
        check_lr(lr)?;
        if self.momentum.is_nan() || self.momentum < 0.0 {
            return Err(Error::InvalidMomentum(self.momentum));
        }
        if self.dampening.is_nan() {
            return Err(Error::InvalidDampening(self.dampening));
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return Err(Error::InvalidWeightDecay(self.weight_decay));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::NesterovRequiresMomentum);
        }
        Ok(())
    }
}

impl Sgd {
    /// One group of `params` with learning rate `lr`. The options are checked first
    /// ([`SgdOptions::validate`]), then the parameters: not empty, leaves only.
    pub fn new(params: Vec<Tensor>, lr: f64, options: SgdOptions) -> Result<Self> {
        options.validate(lr)?;
        if params.is_empty() {
            return Err(Error::EmptyParameterList);
        }
        Self::with_groups(vec![ParamGroup {
            params,
            lr,
            options,
        }])
    }

    /// Several groups, each with its own learning rate and options (each checked as
    /// in [`Sgd::new`]); at least one group, no parameter in two groups.
    pub fn with_groups(groups: Vec<ParamGroup<SgdOptions>>) -> Result<Self> {
        for g in &groups {
            g.options.validate(g.lr)?;
        }
        check_param_groups(&groups)?;
        let momentum_buffers = groups.iter().map(|g| vec![None; g.params.len()]).collect();
        Ok(Sgd {
            groups,
            momentum_buffers,
            id: IdSlot::new(),
        })
    }

    /// The parameter groups.
    pub fn param_groups(&self) -> &[ParamGroup<SgdOptions>] {
        &self.groups
    }

    /// The parameter groups, to change learning rates or options.
    pub fn param_groups_mut(&mut self) -> &mut [ParamGroup<SgdOptions>] {
        &mut self.groups
    }
}

/// One parameter's SGD update in the compute type `F`.
fn sgd_update<F: Real>(
    p: &Tensor,
    g: &Raw,
    buf: &mut Option<Raw>,
    o: SgdOptions,
    lr: f64,
) -> Result<()> {
    let lr = F::of(lr);
    let plain = !o.maximize && o.weight_decay == 0.0 && o.momentum == 0.0;
    if plain && in_place::<F>(g) && !p.data().same_storage(g) {
        // Plain SGD reads the gradient where it lies: no copy of it.
        return with_slice(g, |gv| update::<F>(p.data(), |pv| axpy(pv, gv, -lr)));
    }
    if let Some(done) = fused::<F>(p, g, buf, o, lr) {
        return done;
    }
    let mut d = read::<F>(g);
    if o.maximize {
        d.iter_mut().for_each(|v| *v = -*v);
    }
    if o.weight_decay != 0.0 {
        let wd = F::of(o.weight_decay);
        let pv = read::<F>(p.data());
        d.iter_mut().zip(&pv).for_each(|(d, p)| *d += wd * *p);
    }
    if o.momentum != 0.0 {
        let (m, damp) = (F::of(o.momentum), F::of(1.0 - o.dampening));
        match buf {
            None => *buf = Some(Raw::from_vec(d.clone(), p.dims())?),
            Some(b) => update::<F>(b, |b| {
                b.iter_mut()
                    .zip(&d)
                    .for_each(|(b, d)| *b = *b * m + damp * *d)
            })?,
        }
        let bv = read::<F>(buf.as_ref().expect("set above"));
        if o.nesterov {
            d.iter_mut().zip(&bv).for_each(|(d, b)| *d += m * *b);
        } else {
            d = bv;
        }
    }
    update::<F>(p.data(), |pv| axpy(pv, &d, -lr))
}

/// The whole update in one pass over parameter, gradient and momentum buffer, in place
/// (no copies), when all three are contiguous tensors of the compute type `F` with
/// separate storage; `None` otherwise (the general path above then runs). Each element
/// goes through exactly the operations of the general path, in the same order, so the
/// results are the same bits.
fn fused<F: Real>(
    p: &Tensor,
    g: &Raw,
    buf: &mut Option<Raw>,
    o: SgdOptions,
    lr: F,
) -> Option<Result<()>> {
    let fits = in_place::<F>;
    let separate = |t: &Raw| !t.same_storage(g) && !t.same_storage(p.data());
    if o.momentum == 0.0 || !fits(g) || !fits(p.data()) || p.data().same_storage(g) {
        return None;
    }
    if buf.as_ref().is_some_and(|b| !fits(b) || !separate(b)) {
        return None;
    }
    let (m, damp, wd) = (
        F::of(o.momentum),
        F::of(1.0 - o.dampening),
        F::of(o.weight_decay),
    );
    let first = buf.is_none();
    let elem = move |p: &mut F, g: F, b: &mut F| {
        let mut d = if o.maximize { -g } else { g };
        if o.weight_decay != 0.0 {
            d += wd * *p;
        }
        *b = if first { d } else { *b * m + damp * d };
        if o.nesterov {
            d += m * *b;
        } else {
            d = *b;
        }
        *p += -lr * d;
    };
    let mut run = || -> Result<()> {
        let fresh;
        let b = match buf.as_ref() {
            Some(b) => b,
            None => {
                fresh = Raw::zeros(p.dims().to_vec(), F::DTYPE);
                &fresh
            }
        };
        with_slice(g, |gv| {
            with_slice_mut(b, |bv| update::<F>(p.data(), |pv| zip3(pv, gv, bv, elem)))
        })?;
        if first {
            *buf = Some(b.clone());
        }
        Ok(())
    };
    Some(run())
}

impl Optimizer for Sgd {
    fn id(&self) -> OptimizerId {
        self.id.get()
    }

    fn step(&mut self) -> Result<()> {
        for (group, bufs) in self.groups.iter().zip(self.momentum_buffers.iter_mut()) {
            for (p, buf) in group.params.iter().zip(bufs.iter_mut()) {
                let Some(g) = p.grad() else { continue };
                if computes_in_f64(p.dtype()) {
                    sgd_update::<f64>(p, g.data(), buf, group.options, group.lr)?;
                } else {
                    sgd_update::<f32>(p, g.data(), buf, group.options, group.lr)?;
                }
            }
        }
        Ok(())
    }

    fn params(&self) -> Vec<Tensor> {
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

    fn state_dict(&self) -> OptimizerStateDict {
        let sizes: Vec<usize> = self.groups.iter().map(|g| g.params.len()).collect();
        let idx = group_indices(&sizes);
        let mut state = BTreeMap::new();
        for (gi, bufs) in self.momentum_buffers.iter().enumerate() {
            for (pi, b) in bufs.iter().enumerate() {
                if let Some(b) = b {
                    let mut m = BTreeMap::new();
                    m.insert(
                        "momentum_buffer".to_string(),
                        StateValue::Tensor(TensorData::from_raw(b)),
                    );
                    state.insert(idx[gi][pi], m);
                }
            }
        }
        let param_groups = self
            .groups
            .iter()
            .zip(idx)
            .map(|(g, ids)| {
                let o = g.options;
                let v = json!({"lr": to_json(g.lr), "momentum": to_json(o.momentum),
                    "dampening": to_json(o.dampening), "weight_decay": to_json(o.weight_decay),
                    "nesterov": o.nesterov, "maximize": o.maximize, "params": ids});
                v.as_object().cloned().expect("object")
            })
            .collect();
        OptimizerStateDict {
            state,
            param_groups,
        }
    }

    fn load_state_dict(&mut self, sd: &OptimizerStateDict) -> Result<()> {
        let loaded = self.read_state_dict(sd)?;
        for (g, (lr, options)) in self.groups.iter_mut().zip(loaded.hyper) {
            g.lr = lr;
            g.options = options;
        }
        self.momentum_buffers = loaded.buffers;
        Ok(())
    }

    fn validate_state_dict(&self, sd: &OptimizerStateDict) -> Result<()> {
        self.read_state_dict(sd).map(|_| ())
    }
}

/// A state dict read and checked against an [`Sgd`], ready to be put in place.
struct Loaded {
    hyper: Vec<(f64, SgdOptions)>,
    buffers: Vec<Vec<Option<Raw>>>,
}

impl Sgd {
    /// Everything [`Optimizer::load_state_dict`] needs, read from `sd` and checked,
    /// without changing `self`: the groups' hyper-parameters (the constructor's checks)
    /// and each momentum buffer (its parameter's shape).
    fn read_state_dict(&self, sd: &OptimizerStateDict) -> Result<Loaded> {
        let sizes: Vec<usize> = self.groups.iter().map(|g| g.params.len()).collect();
        let placed = place_state(sd, &sizes)?;
        let mut hyper = Vec::with_capacity(self.groups.len());
        let mut buffers = Vec::with_capacity(self.groups.len());
        for (gi, (g, pg)) in self.groups.iter().zip(&sd.param_groups).enumerate() {
            let r = GroupReader::new(gi, pg);
            let lr = r.number("lr")?;
            let o = SgdOptions {
                momentum: r.number("momentum")?,
                dampening: r.number("dampening")?,
                weight_decay: r.number("weight_decay")?,
                nesterov: r.flag("nesterov", false)?,
                maximize: r.flag("maximize", false)?,
            };
            o.validate(lr)?;
            hyper.push((lr, o));
            let bufs = g
                .params
                .iter()
                .zip(&placed[gi])
                .map(|(p, entry)| match entry {
                    None => Ok(None),
                    Some(e) => e.tensor("momentum_buffer", p),
                })
                .collect::<Result<Vec<_>>>()?;
            buffers.push(bufs);
        }
        Ok(Loaded { hyper, buffers })
    }
}
