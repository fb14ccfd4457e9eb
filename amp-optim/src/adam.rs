//! Adam and AdamW (decoupled weight decay), optional AMSGrad, float32 state (float64 for
//! float64 parameters), and a
//! fused scaling-aware step that unscales, checks and skips inside the update.
//!
//! The moments round as PyTorch's CPU step does (its `lerp_` and `addcmul_` are fused
//! multiply-adds, its scalars computed in float64 and rounded once: [`Coefficients`]), so
//! a float32 step's `exp_avg` and `exp_avg_sq` are PyTorch's bits. The parameter can
//! still differ in its last bit: PyTorch's float32 `sqrt` on the CPU is MKL's, which is
//! not correctly rounded (it differed from the correctly rounded square root on 21% of
//! 1000 random values), where this one is.

use std::collections::BTreeMap;

use amp_autograd::Tensor;
use amp_tensor::Tensor as Raw;
use serde_json::json;

use crate::groups::{
    group_optimizer_methods, grouped_optimizer, read_state_dict, write_state_dict, Loaded,
};
use crate::json_float::to_json;
use crate::optimizer::{check_lr, IdSlot, ParamGroup};
use crate::state_dict::GroupReader;
use crate::update::{
    computes_in_f64, in_place, read, update, with_fma, with_slice, with_slice_mut, zeros_state,
    zip4, Real, Step4,
};
use crate::{Error, Optimizer, OptimizerStateDict, Result, StateValue, TensorData};

/// Adam options (PyTorch's defaults via `Default`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamOptions {
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub amsgrad: bool,
    pub maximize: bool,
    /// Decoupled weight decay (AdamW).
    pub decoupled: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        AdamOptions {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
            decoupled: false,
        }
    }
}

impl AdamOptions {
    /// AdamW's defaults (weight decay 0.01, decoupled).
    pub fn adamw() -> Self {
        AdamOptions {
            weight_decay: 0.01,
            decoupled: true,
            ..Default::default()
        }
    }
}

impl AdamOptions {
    /// PyTorch's checks of `Adam(lr, betas, eps, weight_decay)` (and AdamW's), in its
    /// order; each is `not 0.0 <= x`, so NaN is refused too.
    pub fn validate(&self, lr: f64) -> Result<()> {
        check_lr(lr)?;
        if self.eps.is_nan() || self.eps < 0.0 {
            return Err(Error::InvalidEpsilon(self.eps));
        }
        for (index, value) in [self.betas.0, self.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&value) {
                return Err(Error::InvalidBeta { index, value });
            }
        }
        if self.weight_decay.is_nan() || self.weight_decay < 0.0 {
            return Err(Error::InvalidWeightDecay(self.weight_decay));
        }
        Ok(())
    }
}

struct ParamState {
    step: f64,
    exp_avg: Raw,
    exp_avg_sq: Raw,
    max_exp_avg_sq: Option<Raw>,
}

/// `torch.optim.Adam` / `torch.optim.AdamW` (with `AdamOptions::adamw()`).
pub struct Adam {
    groups: Vec<ParamGroup<AdamOptions>>,
    /// Each parameter's state, `[group][position]`.
    state: Vec<Vec<Option<ParamState>>>,
    id: IdSlot,
}

/// `torch.optim.AdamW`: [`Adam`] with decoupled weight decay.
pub fn adamw(params: Vec<Tensor>, lr: f64) -> Result<Adam> {
    Adam::new(params, lr, AdamOptions::adamw())
}

grouped_optimizer!(Adam, AdamOptions);

impl Adam {
    /// The update of every parameter; each gradient is first divided by `grad_scale`
    /// (read back once, only if a parameter is on the host: device updates take it by
    /// pointer).
    fn update(&mut self, grad_scale: Option<&Raw>) -> Result<()> {
        let mut host_scale = None;
        // Device parameters (group, position, gradient) wait for one multi-tensor
        // launch (see `on_device`).
        let mut on_dev: Vec<(usize, usize, Tensor)> = Vec::new();
        for (gi, (group, states)) in self.groups.iter().zip(self.state.iter_mut()).enumerate() {
            let o = group.options;
            for (pi, (p, st)) in group.params.iter().zip(states.iter_mut()).enumerate() {
                let Some(g) = p.grad() else { continue };
                let s = st.get_or_insert_with(|| ParamState {
                    step: 0.0,
                    exp_avg: zeros_state(p),
                    exp_avg_sq: zeros_state(p),
                    max_exp_avg_sq: o.amsgrad.then(|| zeros_state(p)),
                });
                s.step += 1.0;
                if !p.device().is_cpu() {
                    on_dev.push((gi, pi, g));
                    continue;
                }
                let grad_scale = match grad_scale {
                    None => None,
                    Some(t) => Some(GradScale::Host(match host_scale {
                        Some(v) => v,
                        None => *host_scale.insert(t.operand::<f64>()?),
                    })),
                };
                let step = ParamStep {
                    p,
                    g: g.data(),
                    s,
                    o,
                    lr: group.lr,
                    grad_scale,
                };
                if computes_in_f64(p.dtype()) {
                    adam_update::<f64>(step)?;
                } else {
                    adam_update::<f32>(step)?;
                }
            }
        }
        let steps: Vec<ParamStep<'_>> = on_dev
            .iter()
            .filter_map(|(gi, pi, g)| {
                let group = &self.groups[*gi];
                Some(ParamStep {
                    p: &group.params[*pi],
                    g: g.data(),
                    s: self.state[*gi][*pi].as_ref()?,
                    o: group.options,
                    lr: group.lr,
                    grad_scale: grad_scale.map(GradScale::Tensor),
                })
            })
            .collect();
        on_device(&steps)
    }
}

/// The updates of device parameters: one multi-tensor launch for every parameter the
/// fused kernel takes (`amp_kernels::cuda::optim::adam_steps`, with the `cuda`
/// feature), then the op-by-op path for the others, in their order.
fn on_device(steps: &[ParamStep<'_>]) -> Result<()> {
    #[cfg(feature = "cuda")]
    let done = {
        use amp_kernels::cuda::optim::{adam_steps, AdamStep, AdamTensors};
        let scale_t = match (steps.first(), steps.first().and_then(|s| s.grad_scale)) {
            (Some(first), Some(scale)) => Some(scale.on(first.p.device())?),
            _ => None,
        };
        let tensors: Vec<AdamTensors<'_>> = steps
            .iter()
            .map(|st| {
                let (o, lr) = (st.o, st.lr);
                let (b1, b2) = o.betas;
                AdamTensors {
                    p: st.p.data(),
                    g: st.g,
                    m: &st.s.exp_avg,
                    v: &st.s.exp_avg_sq,
                    vmax: st.s.max_exp_avg_sq.as_ref(),
                    step: AdamStep {
                        step_size: lr / (1.0 - b1.powf(st.s.step)),
                        bc2_sqrt: (1.0 - b2.powf(st.s.step)).sqrt(),
                        beta1: b1,
                        beta2: b2,
                        eps: o.eps,
                        weight_decay: o.weight_decay,
                        decay: 1.0 - lr * o.weight_decay,
                        maximize: o.maximize,
                        decoupled: o.decoupled,
                    },
                }
            })
            .collect();
        adam_steps(&tensors, scale_t.as_ref())?
    };
    #[cfg(not(feature = "cuda"))]
    let done = vec![false; steps.len()];
    for (step, done) in steps.iter().zip(done) {
        if !done {
            let cd = if computes_in_f64(step.p.dtype()) {
                amp_tensor::DType::F64
            } else {
                amp_tensor::DType::F32
            };
            adam_on_device(*step, cd)?;
        }
    }
    Ok(())
}

/// One parameter's update: the parameter, its gradient and state, the group's options
/// and learning rate, and the scaler's gradient scale when it fuses the unscale.
#[derive(Clone, Copy)]
struct ParamStep<'a> {
    p: &'a Tensor,
    g: &'a Raw,
    s: &'a ParamState,
    o: AdamOptions,
    lr: f64,
    grad_scale: Option<GradScale<'a>>,
}

/// The loss scale a fused scaling-aware step divides the gradients by: its value (host
/// parameters) or the scaler's tensor (device parameters, whose kernel reads it).
#[derive(Clone, Copy)]
enum GradScale<'a> {
    Host(f64),
    Tensor(&'a Raw),
}

impl GradScale<'_> {
    /// The scale as a 1-element float32 tensor on `device`, for the device paths.
    fn on(self, device: amp_tensor::Device) -> Result<Raw> {
        Ok(match self {
            GradScale::Tensor(t) => t.to_device(device)?,
            GradScale::Host(v) => {
                Raw::full([1usize], v, amp_tensor::DType::F32).to_device(device)?
            }
        })
    }

    /// The value, for the host paths (a device tensor is read back: a device
    /// parameter's update never asks).
    fn value(self) -> Result<f64> {
        match self {
            GradScale::Host(v) => Ok(v),
            GradScale::Tensor(t) => Ok(t.operand::<f64>()?),
        }
    }
}

/// One parameter's Adam update (its `step` already counted) in the compute type `F`.
fn adam_update<F: Real>(step: ParamStep<'_>) -> Result<()> {
    if let Some(done) = fused::<F>(step) {
        return done;
    }
    let ParamStep {
        p,
        g,
        s,
        o,
        lr,
        grad_scale,
    } = step;
    let mut g = read::<F>(g);
    if let Some(scale) = grad_scale {
        let scale = F::of(scale.value()?);
        g.iter_mut().for_each(|v| *v /= scale);
    }
    if o.maximize {
        g.iter_mut().for_each(|v| *v = -*v);
    }
    let wd = o.weight_decay;
    if wd != 0.0 {
        if o.decoupled {
            let f = F::of(1.0 - lr * wd);
            update::<F>(p.data(), |pv| pv.iter_mut().for_each(|v| *v *= f))?;
        } else {
            let pv = read::<F>(p.data());
            let wd = F::of(wd);
            with_fma(|| {
                g.iter_mut()
                    .zip(&pv)
                    .for_each(|(g, &p)| *g = p.mul_add(wd, *g))
            });
        }
    }
    let k = Coefficients::<F>::new(o, lr, s.step);
    update::<F>(&s.exp_avg, |m| {
        with_fma(|| m.iter_mut().zip(&g).for_each(|(m, &g)| *m = k.lerp(*m, g)))
    })?;
    update::<F>(&s.exp_avg_sq, |v| {
        with_fma(|| {
            v.iter_mut()
                .zip(&g)
                .for_each(|(v, &g)| *v = k.second(*v, g))
        })
    })?;
    let m = read::<F>(&s.exp_avg);
    let mut v = read::<F>(&s.exp_avg_sq);
    if let Some(vmax) = &s.max_exp_avg_sq {
        update::<F>(vmax, |mx| {
            mx.iter_mut()
                .zip(&v)
                .for_each(|(mx, &v)| *mx = maximum(*mx, v))
        })?;
        v = read::<F>(vmax);
    }
    update::<F>(p.data(), |pv| {
        for ((p, &m), &v) in pv.iter_mut().zip(&m).zip(&v) {
            *p = k.param(*p, m, v);
        }
    })
}

/// The fused path's step of one element (a [`Step4`], inlined into the loop [`zip4`]
/// compiles with FMA, where its `mul_add`s are one instruction each).
#[derive(Clone, Copy)]
struct Element1<F> {
    k: Coefficients<F>,
    /// The gradient's divisor (the fused scaling-aware step).
    scale: Option<F>,
    maximize: bool,
    /// AdamW's factor `1 - lr·wd`.
    decay: Option<F>,
    /// Adam's coupled weight decay.
    coupled: Option<F>,
}

impl<F: Real> Step4<F> for Element1<F> {
    #[inline(always)]
    fn step(&self, p: &mut F, g: F, m: &mut F, v: &mut F) {
        let mut g = g;
        if let Some(scale) = self.scale {
            g /= scale;
        }
        if self.maximize {
            g = -g;
        }
        if let Some(decay) = self.decay {
            *p *= decay;
        }
        if let Some(wd) = self.coupled {
            g = p.mul_add(wd, g);
        }
        *m = self.k.lerp(*m, g);
        *v = self.k.second(*v, g);
        *p = self.k.param(*p, *m, *v);
    }
}

/// `torch.maximum`: NaN if either is.
fn maximum<F: Real>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        F::nan()
    } else {
        a.max(b)
    }
}

/// One step's scalars, each rounded to the compute type from the float64 PyTorch's
/// Python computes it in, and the element formulas with PyTorch's roundings (its CPU
/// kernels): `exp_avg.lerp_(g, 1 - β1)` is `fmadd(w, g - m, m)` (for `|w| < 0.5`, else
/// `fmadd(w - 1, g - m, g)`); `exp_avg_sq.mul_(β2).addcmul_(g, g, 1 - β2)` is
/// `fmadd((1 - β2)·g, g, v·β2)`; `param.addcdiv_(m, denom, -step_size)` is
/// `p + (-step_size·m) / denom` with `denom = sqrt(v) / sqrt(bc2) + eps`.
#[derive(Clone, Copy)]
struct Coefficients<F> {
    w1: F,
    b2: F,
    w2: F,
    neg_step: F,
    bc2_sqrt: F,
    eps: F,
}

impl<F: Real> Coefficients<F> {
    fn new(o: AdamOptions, lr: f64, step: f64) -> Self {
        let bc1 = 1.0 - o.betas.0.powf(step);
        let bc2 = 1.0 - o.betas.1.powf(step);
        Coefficients {
            w1: F::of(1.0 - o.betas.0),
            b2: F::of(o.betas.1),
            w2: F::of(1.0 - o.betas.1),
            neg_step: F::of(-(lr / bc1)),
            bc2_sqrt: F::of(bc2.sqrt()),
            eps: F::of(o.eps),
        }
    }

    /// The first moment: `lerp(m, g, 1 - β1)`.
    #[inline(always)]
    fn lerp(&self, m: F, g: F) -> F {
        if self.w1.abs() < F::of(0.5) {
            (g - m).mul_add(self.w1, m)
        } else {
            (g - m).mul_add(self.w1 - F::one(), g)
        }
    }

    /// The second moment: `v·β2 + (1 - β2)·g·g`.
    #[inline(always)]
    fn second(&self, v: F, g: F) -> F {
        (self.w2 * g).mul_add(g, v * self.b2)
    }

    /// The parameter after its step, from the moments (`v` the maximum under AMSGrad).
    #[inline(always)]
    fn param(&self, p: F, m: F, v: F) -> F {
        p + (self.neg_step * m) / (v.sqrt() / self.bc2_sqrt + self.eps)
    }
}

/// [`adam_update`] for a parameter on a device that the fused kernel does not take: the
/// general path's operations, in its order, as device kernels over tensors of the
/// compute type `cd`.
fn adam_on_device(step: ParamStep<'_>, cd: amp_tensor::DType) -> Result<()> {
    use crate::update::dev;
    use amp_kernels::BinaryOp;
    let ParamStep {
        p,
        g,
        s,
        o,
        lr,
        grad_scale,
    } = step;
    let (b1, b2) = o.betas;
    let bc1 = 1.0 - b1.powf(s.step);
    let bc2 = 1.0 - b2.powf(s.step);
    let scale_t = grad_scale.map(|s| s.on(p.device())).transpose()?;
    // Views, shared buffers: the same operations one kernel at a time.
    let mut g = g.to_dtype(cd)?;
    if let Some(scale) = &scale_t {
        g = dev::op(BinaryOp::Div, &g, &scale.to_dtype(cd)?)?;
    }
    if o.maximize {
        g = dev::neg(&g)?;
    }
    let mut pv = p.data().to_dtype(cd)?;
    let wd = o.weight_decay;
    if wd != 0.0 {
        if o.decoupled {
            pv = dev::scale(&pv, 1.0 - lr * wd)?;
        } else {
            g = dev::axpy(&g, &pv, wd)?;
        }
    }
    // m += (g - m) * (1 - b1); v = v * b2 + (1 - b2) * g * g, with `1 - b` taken in
    // the compute type, as the host update takes it.
    let one_minus = |b: f64| {
        if cd == amp_tensor::DType::F32 {
            f64::from(1.0f32 - b as f32)
        } else {
            1.0 - b
        }
    };
    let m = dev::op(
        BinaryOp::Add,
        &s.exp_avg,
        &dev::scale(&dev::op(BinaryOp::Sub, &g, &s.exp_avg)?, one_minus(b1))?,
    )?;
    s.exp_avg.copy_(&m)?;
    let gg = dev::op(BinaryOp::Mul, &dev::scale(&g, one_minus(b2))?, &g)?;
    let v = dev::op(BinaryOp::Add, &dev::scale(&s.exp_avg_sq, b2)?, &gg)?;
    s.exp_avg_sq.copy_(&v)?;
    let v = match &s.max_exp_avg_sq {
        Some(vmax) => {
            vmax.copy_(&dev::op(BinaryOp::Maximum, vmax, &v)?)?;
            vmax.clone()
        }
        None => v,
    };
    let den = dev::add(&dev::div(&dev::sqrt(&v)?, bc2.sqrt())?, o.eps)?;
    let upd = dev::op(BinaryOp::Div, &dev::scale(&m, lr / bc1)?, &den)?;
    p.data().copy_(&dev::op(BinaryOp::Sub, &pv, &upd)?)?;
    Ok(())
}

/// The whole update in one pass over parameter, gradient and the two moment buffers, in
/// place (no copies), when all are contiguous tensors of the compute type `F` with
/// separate storage and `amsgrad` is off; `None` otherwise (the general path above then
/// runs). Each element goes through exactly the operations of the general path, in the
/// same order, so the results are the same bits.
fn fused<F: Real>(step: ParamStep<'_>) -> Option<Result<()>> {
    let ParamStep {
        p,
        g,
        s,
        o,
        lr,
        grad_scale,
    } = step;
    let fits = in_place::<F>;
    let separate = |t: &Raw| !t.same_storage(g) && !t.same_storage(p.data());
    let (m, v) = (&s.exp_avg, &s.exp_avg_sq);
    if s.max_exp_avg_sq.is_some()
        || !fits(g)
        || !fits(p.data())
        || p.data().same_storage(g)
        || !fits(m)
        || !fits(v)
        || !separate(m)
        || !separate(v)
        || m.same_storage(v)
    {
        return None;
    }
    let wd = o.weight_decay;
    let (decay, coupled) = (F::of(1.0 - lr * wd), F::of(wd));
    let scale = match grad_scale {
        Some(s) => match s.value() {
            Ok(v) => Some(F::of(v)),
            Err(e) => return Some(Err(e)),
        },
        None => None,
    };
    let k = Coefficients::<F>::new(o, lr, s.step);
    let one = Element1 {
        k,
        scale,
        maximize: o.maximize,
        decay: (wd != 0.0 && o.decoupled).then_some(decay),
        coupled: (wd != 0.0 && !o.decoupled).then_some(coupled),
    };
    Some(with_slice(g, |gv| {
        with_slice_mut(m, |mv| {
            with_slice_mut(v, |vv| {
                update::<F>(p.data(), |pv| zip4(pv, gv, mv, vv, one))
            })
        })
    }))
}

impl Optimizer for Adam {
    group_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        self.update(None)
    }

    fn supports_amp_scaling(&self) -> bool {
        true
    }

    /// The fused path: skipped entirely (parameters and state untouched) when
    /// `found_inf != 0`, else each gradient is divided by `grad_scale` inside the
    /// update (the `.grad` tensors are left as they are).
    fn step_with_scaling(&mut self, grad_scale: Option<&Raw>, found_inf: &Raw) -> Result<bool> {
        // The skip decision: the one read of the step (the step counts live on the
        // host, for the bias corrections).
        if found_inf.item_f64()? != 0.0 {
            return Ok(false);
        }
        self.update(grad_scale)?;
        Ok(true)
    }

    fn state_dict(&self) -> OptimizerStateDict {
        let tensor = |t: &Raw| StateValue::Tensor(TensorData::from_raw(t));
        let entries = |s: &ParamState| {
            let mut m = BTreeMap::new();
            m.insert("step".to_string(), StateValue::Number(s.step));
            m.insert("exp_avg".to_string(), tensor(&s.exp_avg));
            m.insert("exp_avg_sq".to_string(), tensor(&s.exp_avg_sq));
            if let Some(v) = &s.max_exp_avg_sq {
                m.insert("max_exp_avg_sq".to_string(), tensor(v));
            }
            m
        };
        write_state_dict(&self.groups, &self.state, entries, |lr, o| {
            json!({"lr": to_json(lr), "betas": [to_json(o.betas.0), to_json(o.betas.1)],
                "eps": to_json(o.eps), "weight_decay": to_json(o.weight_decay),
                "amsgrad": o.amsgrad, "maximize": o.maximize, "decoupled_weight_decay": o.decoupled})
        })
    }
}

impl Adam {
    /// Everything [`Optimizer::load_state_dict`] needs, read from `sd` and checked,
    /// without changing `self`: the groups' hyper-parameters (the constructor's checks)
    /// and each parameter's state (a finite step count >= 0, both moments, and the
    /// running maximum when `amsgrad` is on, each of its parameter's shape).
    fn read_state_dict(&self, sd: &OptimizerStateDict) -> Result<Loaded<AdamOptions, ParamState>> {
        let options = |r: &GroupReader<'_>, d: &AdamOptions| {
            let betas = r.pair("betas")?;
            let [eps, weight_decay] = r.numbers(["eps", "weight_decay"])?;
            Ok(AdamOptions {
                betas,
                eps,
                weight_decay,
                amsgrad: r.flag("amsgrad", false)?,
                maximize: r.flag("maximize", false)?,
                decoupled: r.flag("decoupled_weight_decay", d.decoupled)?,
            })
        };
        read_state_dict(&self.groups, sd, options, |e, p, o| {
            Ok(Some(ParamState {
                step: e.step("step")?,
                exp_avg: e.required_tensor("exp_avg", p)?,
                exp_avg_sq: e.required_tensor("exp_avg_sq", p)?,
                // Without amsgrad PyTorch never reads a saved maximum.
                max_exp_avg_sq: if o.amsgrad {
                    Some(e.required_tensor("max_exp_avg_sq", p)?)
                } else {
                    None
                },
            }))
        })
    }
}
