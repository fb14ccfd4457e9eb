//! The autocast layer at the autograd dispatch point: looks up the op's policy in the
//! active profile, decides with [`crate::decide`], casts the arguments (differentiably,
//! so the casts are on the tape before the op), and keeps the weight-cast cache.
//!
//! An op that can read float32 arguments as a 16-bit dtype itself (`mm`, `bmm`,
//! `matmul`, `@`: [`OpCall::can_read_as`]) is asked to instead of given casts when no
//! argument needs a gradient or goes through the cache ([`OpCall::read_as`]): the same
//! dtype and bits, without the cast tensors (forward passes under `no_grad`, inference).
//! Measured on a
//! Zen 4 EPYC, 2 threads, `amp-bench --sweep --filter mm/`, speed against our float32:
//! `mm` of 8² 0.35 → 0.52, 96² 0.50 → 1.16; `bmm` `[32, 16, 64] × [32, 64, 16]` 0.52 →
//! 0.73.
//!
//! The nesting rule: when a policy other than `none` applies to a functional call, the
//! layer answers [`BodyMode::Excluded`] and the op's body runs with autocast excluded
//! (PyTorch's autocast wrappers run their body under an `ExcludeDispatchKeyGuard`), so a
//! composite such as `addbmm` = `bmm` + `sum` is decided once, by its own policy. In-place
//! and `out=` calls are not wrapped in PyTorch and keep their bodies dispatched.

use amp_autograd::{BodyMode, CallKind, DispatchLayer, OpCall, Tensor};
use amp_policy::CastPolicy;
use amp_tensor::DType;

use crate::decision::{decide, ArgInfo, CallFlags};
use crate::state::STATE;
use crate::trace::TraceEvent;

pub(crate) struct AutocastLayer;

/// Whether a cast of `t` to `to` may be cached: a float32 leaf that requires grad and
/// is not a view, cast down to a lower-precision dtype.
fn cacheable(t: &Tensor, to: DType) -> bool {
    t.dtype() == DType::F32
        && to.is_reduced_float()
        && t.is_leaf()
        && t.requires_grad()
        && !t.is_view()
}

/// The dtype `call`'s op may read its arguments as instead of their casts
/// ([`OpCall::read_as`]): the op can ([`OpCall::can_read_as`]), every argument is a
/// float32 tensor cast to the same 16-bit dtype, none needs a gradient (so no cast
/// would be on the tape), and none would go through the cast cache (so the cache and
/// its hits are as without this).
fn read_as(call: &OpCall<'_>, casts: &[Option<DType>], cache_enabled: bool) -> Option<DType> {
    let to = (*casts.first()?)?;
    let ok = call.can_read_as
        && to.is_reduced_float()
        && casts.len() == call.args.len()
        && casts.iter().all(|&c| c == Some(to))
        && call.args.iter().all(|t| t.dtype() == DType::F32)
        && !(amp_autograd::is_grad_enabled() && call.args.iter().any(Tensor::requires_grad))
        && !(cache_enabled && call.args.iter().any(|t| cacheable(t, to)));
    ok.then_some(to)
}

impl DispatchLayer for AutocastLayer {
    fn on_call(&self, call: &mut OpCall<'_>) -> amp_autograd::Result<BodyMode> {
        let Some(first) = call.args.first() else {
            return Ok(BodyMode::Layered);
        };
        let device = first.device().device_type();
        STATE.with(|s| {
            let mut st = s.borrow_mut();
            let ds = st.devices[device.index()];
            if !ds.enabled {
                return Ok(BodyMode::Layered);
            }
            let id = call.op.id();
            let policy = st.profile.policy(device, id);
            let flags = CallFlags {
                inplace: call.kind == CallKind::InPlace,
                out: call.kind == CallKind::Out,
                explicit_dtype: call.explicit_dtype,
                accepts_dtype: call.accepts_dtype,
            };
            let tracing = st.trace.is_some();
            if policy == CastPolicy::None && !tracing {
                return Ok(BodyMode::Layered);
            }
            let args: Vec<ArgInfo> = call
                .args
                .iter()
                .map(|t| ArgInfo {
                    dtype: t.dtype(),
                    device: t.device().device_type(),
                })
                .collect();
            let banned = if policy == CastPolicy::Banned {
                st.profile.banned_message_by_id(device, id)
            } else {
                None
            };
            let plan = decide(policy, banned, device, ds.dtype, &args, flags)?;
            let (mut casts, mut hits) = (0, 0);
            // The op may read its float32 arguments as the cast dtype itself: the bits of
            // the op on the casts, with no cast tensor (`mm`, `bmm`).
            call.read_as = read_as(call, &plan.casts, ds.cache_enabled);
            let pending = if call.read_as.is_some() {
                casts = call.args.len();
                &[][..]
            } else {
                &plan.casts[..]
            };
            for (arg, to) in call.args.iter_mut().zip(pending) {
                let Some(to) = *to else { continue };
                if ds.cache_enabled && cacheable(arg, to) {
                    let key = (arg.id(), to);
                    if let Some(c) = st.cache.get(&key) {
                        *arg = c.clone();
                        hits += 1;
                        continue;
                    }
                    let c = arg.to_dtype(to)?;
                    st.cache.insert(key, c.clone());
                    *arg = c;
                } else {
                    *arg = arg.to_dtype(to)?;
                }
                casts += 1;
            }
            if plan.set_dtype.is_some() {
                call.dtype = plan.set_dtype;
            }
            if let Some(trace) = st.trace.as_mut() {
                let skipped = if flags.inplace {
                    Some("in place")
                } else if flags.out {
                    Some("out=")
                } else if flags.explicit_dtype {
                    Some("explicit dtype")
                } else {
                    None
                };
                trace.push(TraceEvent {
                    op: call.op.name(),
                    device,
                    policy,
                    dtypes_in: args.iter().map(|a| a.dtype).collect(),
                    dtypes_out: call
                        .args
                        .iter()
                        .map(|t| call.read_as.unwrap_or(t.dtype()))
                        .collect(),
                    set_dtype: plan.set_dtype,
                    casts,
                    cache_hits: hits,
                    skipped,
                });
            }
            Ok(
                if policy != CastPolicy::None && call.kind == CallKind::Functional {
                    BodyMode::Excluded
                } else {
                    BodyMode::Layered
                },
            )
        })
    }
}
