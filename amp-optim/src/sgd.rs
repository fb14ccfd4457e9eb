//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.
//!
//! Each step rounds where PyTorch's CPU step does: its `x.add(y, alpha=a)` is one fused
//! multiply-add (`fmadd(y, a, x)`), so the weight decay, the momentum update (after
//! `buf * momentum`, rounded), Nesterov's term and the parameter update are `mul_add`s
//! here, and a float32 step gives PyTorch's bits.

use std::collections::BTreeMap;

use amp_autograd::Tensor;
use amp_tensor::{DType, Tensor as Raw};
use serde_json::json;

use crate::groups::{
    group_optimizer_methods, grouped_optimizer, read_state_dict, write_state_dict, Loaded,
};
use crate::json_float::to_json;
use crate::optimizer::{check_lr, IdSlot, ParamGroup};
use crate::state_dict::{GroupReader, StateEntry};
use crate::update::{
    axpy, computes_in_f64, in_place, read, update, with_fma, with_slice, with_slice_mut, zip3, Real,
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
    /// Each parameter's momentum buffer, `[group][position]`.
    state: Vec<Vec<Option<Raw>>>,
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

grouped_optimizer!(Sgd, SgdOptions);

/// One parameter's update: the parameter, its gradient, and the group's options and
/// learning rate.
#[derive(Clone, Copy)]
struct ParamStep<'a> {
    p: &'a Tensor,
    g: &'a Raw,
    o: SgdOptions,
    lr: f64,
}

/// One parameter's SGD update, with its momentum buffer, in the compute type `F`.
fn sgd_update<F: Real>(step: ParamStep<'_>, buf: &mut Option<Raw>) -> Result<()> {
    if !step.p.device().is_cpu() {
        return sgd_on_device(step, buf, F::DTYPE);
    }
    let ParamStep { p, g, o, lr } = step;
    let lr = F::of(lr);
    let plain = !o.maximize && o.weight_decay == 0.0 && o.momentum == 0.0;
    if plain && p.dtype().is_reduced_float() && g.dtype() == p.dtype() {
        return plain16(p.data(), g, step.lr);
    }
    if plain && in_place::<F>(g) && !p.data().same_storage(g) {
        // Plain SGD reads the gradient where it lies: no copy of it.
        return with_slice(g, |gv| update::<F>(p.data(), |pv| axpy(pv, gv, -lr)));
    }
    if let Some(done) = fused::<F>(step, buf) {
        return done;
    }
    let mut d = read::<F>(g);
    if o.maximize {
        d.iter_mut().for_each(|v| *v = -*v);
    }
    if o.weight_decay != 0.0 {
        let wd = F::of(o.weight_decay);
        let pv = read::<F>(p.data());
        with_fma(|| {
            d.iter_mut()
                .zip(&pv)
                .for_each(|(d, &p)| *d = p.mul_add(wd, *d))
        });
    }
    if o.momentum != 0.0 {
        let (m, damp) = (F::of(o.momentum), F::of(1.0 - o.dampening));
        match buf {
            None => *buf = Some(Raw::from_vec(d.clone(), p.dims())?),
            Some(b) => update::<F>(b, |b| {
                with_fma(|| {
                    b.iter_mut()
                        .zip(&d)
                        .for_each(|(b, &d)| *b = d.mul_add(damp, *b * m))
                })
            })?,
        }
        let bv = read::<F>(buf.as_ref().expect("set above"));
        if o.nesterov {
            with_fma(|| {
                d.iter_mut()
                    .zip(&bv)
                    .for_each(|(d, &b)| *d = b.mul_add(m, *d))
            });
        } else {
            d = bv;
        }
    }
    update::<F>(p.data(), |pv| axpy(pv, &d, -lr))
}

/// Elements PyTorch's CPU kernels take a vector at a time for bfloat16 and float16
/// (`Vectorized<BFloat16>` on AVX-512, the width its CPU capability picks on the
/// machines the vectors come from); the last `n % VEC16` go through its scalar loop.
const VEC16: usize = 32;

/// Plain SGD on a bfloat16 or float16 parameter with a gradient of its dtype, rounded as
/// PyTorch's `p.add_(g, alpha=-lr)` is: `alpha` rounded to the parameter's dtype; the
/// elements of its vector loop (whole groups of [`VEC16`] from the start) one fused
/// multiply-add in float32, rounded once; the others as its scalar loop does 16-bit
/// arithmetic, the product rounded to 16 bits, then the sum. (Past one thread's grain,
/// 32768 elements, PyTorch splits the loop by its thread count; the split here stays
/// whole.)
fn plain16(p: &Raw, g: &Raw, lr: f64) -> Result<()> {
    use amp_tensor::half::f16;
    let round: fn(f32) -> f32 = match p.dtype() {
        DType::BF16 => |x| amp_tensor::round_to_bf16(x).to_f32(),
        _ => |x| f16::from_f32(x).to_f32(),
    };
    let a = round(-lr as f32);
    let gv = read::<f32>(g);
    let vec_end = gv.len() - gv.len() % VEC16;
    update::<f32>(p, |pv| {
        with_fma(|| {
            for (i, (p, &g)) in pv.iter_mut().zip(&gv).enumerate() {
                *p = if i < vec_end {
                    round(g.mul_add(a, *p))
                } else {
                    round(*p + round(a * g))
                };
            }
        })
    })
}

/// [`sgd_update`] for a parameter on a device: the general path's operations, in its
/// order, as device kernels over tensors of the compute type `cd`.
fn sgd_on_device(step: ParamStep<'_>, buf: &mut Option<Raw>, cd: DType) -> Result<()> {
    use crate::update::dev;
    let ParamStep { p, g, o, lr } = step;
    #[cfg(feature = "cuda")]
    {
        // One fused kernel when the tensors allow it (contiguous, separate buffers).
        let first = buf.is_none() && o.momentum != 0.0;
        if first {
            *buf = Some(Raw::zeros_on(p.dims().to_vec(), cd, p.device())?);
        }
        let h = amp_kernels::cuda::optim::SgdStep {
            lr,
            momentum: o.momentum,
            dampening: o.dampening,
            weight_decay: o.weight_decay,
            maximize: o.maximize,
            nesterov: o.nesterov,
        };
        if amp_kernels::cuda::optim::sgd_step(p.data(), g, buf.as_ref(), first, &h)? {
            return Ok(());
        }
        if first {
            *buf = None;
        }
    }
    let pv = p.data().to_dtype(cd)?;
    let mut d = g.to_dtype(cd)?;
    if o.maximize {
        d = dev::neg(&d)?;
    }
    if o.weight_decay != 0.0 {
        d = dev::axpy(&d, &pv, o.weight_decay)?;
    }
    if o.momentum != 0.0 {
        let b = match buf.take() {
            None => d.try_copy()?,
            Some(b) => {
                let next = dev::axpy(&dev::scale(&b, o.momentum)?, &d, 1.0 - o.dampening)?;
                b.copy_(&next)?;
                b
            }
        };
        d = if o.nesterov {
            dev::axpy(&d, &b, o.momentum)?
        } else {
            b.clone()
        };
        *buf = Some(b);
    }
    p.data().copy_(&dev::axpy(&pv, &d, -lr)?)?;
    Ok(())
}

/// The whole update in one pass over parameter, gradient and momentum buffer, in place
/// (no copies), when all three are contiguous tensors of the compute type `F` with
/// separate storage; `None` otherwise (the general path above then runs). Each element
/// goes through exactly the operations of the general path, in the same order, so the
/// results are the same bits.
fn fused<F: Real>(step: ParamStep<'_>, buf: &mut Option<Raw>) -> Option<Result<()>> {
    let ParamStep { p, g, o, lr } = step;
    let lr = F::of(lr);
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
            d = p.mul_add(wd, d);
        }
        *b = if first { d } else { d.mul_add(damp, *b * m) };
        if o.nesterov {
            d = b.mul_add(m, d);
        } else {
            d = *b;
        }
        *p = d.mul_add(-lr, *p);
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
    group_optimizer_methods!();

    fn step(&mut self) -> Result<()> {
        for (group, bufs) in self.groups.iter().zip(self.state.iter_mut()) {
            for (p, buf) in group.params.iter().zip(bufs.iter_mut()) {
                let Some(g) = p.grad() else { continue };
                let step = ParamStep {
                    p,
                    g: g.data(),
                    o: group.options,
                    lr: group.lr,
                };
                if computes_in_f64(p.dtype()) {
                    sgd_update::<f64>(step, buf)?;
                } else {
                    sgd_update::<f32>(step, buf)?;
                }
            }
        }
        Ok(())
    }

    fn state_dict(&self) -> OptimizerStateDict {
        let entries = |b: &Raw| {
            BTreeMap::from([(
                "momentum_buffer".to_string(),
                StateValue::Tensor(TensorData::from_raw(b)),
            )])
        };
        write_state_dict(&self.groups, &self.state, entries, |lr, o| {
            json!({"lr": to_json(lr), "momentum": to_json(o.momentum),
                "dampening": to_json(o.dampening), "weight_decay": to_json(o.weight_decay),
                "nesterov": o.nesterov, "maximize": o.maximize})
        })
    }
}

impl Sgd {
    /// Everything [`Optimizer::load_state_dict`] needs, read from `sd` and checked,
    /// without changing `self`: the groups' hyper-parameters (the constructor's checks)
    /// and each momentum buffer (its parameter's shape).
    fn read_state_dict(&self, sd: &OptimizerStateDict) -> Result<Loaded<SgdOptions, Raw>> {
        let buffer =
            |e: &StateEntry<'_>, p: &Tensor, _: &SgdOptions| e.tensor("momentum_buffer", p);
        let options = |r: &GroupReader<'_>, _: &SgdOptions| {
            let [momentum, dampening, weight_decay] =
                r.numbers(["momentum", "dampening", "weight_decay"])?;
            let (nesterov, maximize) = (r.flag("nesterov", false)?, r.flag("maximize", false)?);
            Ok(SgdOptions {
                momentum,
                dampening,
                weight_decay,
                nesterov,
                maximize,
            })
        };
        read_state_dict(&self.groups, sd, options, buffer)
    }
}
