//! Autocast regions: an RAII guard, a closure form, and a wrapper for a model's
//! forward (the decorator form).

use std::marker::PhantomData;

use amp_policy::{DeviceType, Profile};
use amp_tensor::DType;

use crate::decision::check_dtype;
use crate::state::{DeviceState, STATE};
use crate::trace::{Trace, TraceEvent};
use crate::AutocastError;

/// The settings of an autocast region (`torch.autocast(device_type, dtype, enabled,
/// cache_enabled)`), plus a policy profile and an opt-in decision trace.
#[derive(Debug, Clone)]
pub struct Autocast {
    device: DeviceType,
    dtype: Option<DType>,
    enabled: bool,
    cache_enabled: Option<bool>,
    profile: Option<Profile>,
    trace: bool,
}

impl Autocast {
    /// An enabled region for `device` with the thread's current dtype for it (float16
    /// on cuda, bfloat16 on cpu unless an outer region set another).
    pub fn new(device: DeviceType) -> Self {
        Autocast {
            device,
            dtype: None,
            enabled: true,
            cache_enabled: None,
            profile: None,
            trace: false,
        }
    }
    amp_tensor::setters! {
        /// The lower-precision dtype.
        dtype: DType => Some;
        /// Enable or disable autocast in the region (disabled regions nest in enabled ones).
        enabled: bool;
        /// Turn the weight-cast cache on or off in the region.
        cache_enabled: bool => Some;
        /// Use another policy profile (or one with overrides) for the region.
        profile: Profile => Some;
        /// Record every decision made in the region (read it with [`AutocastGuard::trace`]).
        trace: bool;
    }

    /// Enter the region until the guard drops. Fails for a dtype the device type cannot
    /// autocast to.
    pub fn enter(&self) -> Result<AutocastGuard, AutocastError> {
        STATE.with(|s| {
            let mut st = s.borrow_mut();
            let prev = st.devices[self.device.index()];
            let dtype = self.dtype.unwrap_or(prev.dtype);
            if self.enabled {
                check_dtype(self.device, dtype)?;
            }
            st.devices[self.device.index()] = DeviceState {
                enabled: self.enabled,
                dtype,
                cache_enabled: self.cache_enabled.unwrap_or(prev.cache_enabled),
            };
            st.depth += 1;
            let prev_profile = self
                .profile
                .as_ref()
                .map(|p| std::mem::replace(&mut st.profile, p.clone()));
            let prev_trace = if self.trace {
                Some(st.trace.replace(Vec::new()))
            } else {
                None
            };
            st.sync_layer();
            Ok(AutocastGuard {
                device: self.device,
                prev,
                prev_profile,
                prev_trace,
                _not_send: PhantomData,
            })
        })
    }

    /// Run `f` inside the region.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> Result<R, AutocastError> {
        let _g = self.enter()?;
        Ok(f())
    }

    /// Run `f`, whose own errors and the region's share one type: the
    /// `Result`-returning form of [`Autocast::run`] (one `?` instead of two).
    ///
    /// # Errors
    /// The region's refusal (converted into `E`), or `f`'s error.
    pub fn try_run<T, E: From<AutocastError>>(
        &self,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let _g = self.enter()?;
        f()
    }

    /// Wrap a function (a model's forward) so every call runs inside the region: the
    /// decorator form, `@torch.autocast(...) def forward(...)`.
    pub fn wrap<A, R>(self, f: impl Fn(A) -> R) -> impl Fn(A) -> Result<R, AutocastError> {
        move |a| self.run(|| f(a))
    }
}

/// An open autocast region; leaving it (drop, also while unwinding) restores the
/// previous state. Leaving the outermost region clears the weight-cast cache.
///
/// # Dropping guards out of order
///
/// As PyTorch's `autocast.__exit__`, dropping a guard restores exactly the state saved
/// when *it* was entered (the device type's settings, and the profile and trace if the
/// region set them): the saved states form a stack of values, not a counter. Guards
/// dropped in the reverse order of entry (the scoped, usual case) give back the state
/// before the outermost region. Dropped out of order, each drop still restores its own
/// saved state: after `a = enter(bf16)`, `b = enter(disabled)`, dropping `a` turns
/// autocast off (the state before `a`), and dropping `b` afterwards turns it back on in
/// bfloat16 (the state before `b`), where it stays until changed, as it does in PyTorch.
/// At every point [`is_autocast_enabled`](crate::is_autocast_enabled) and what ops do
/// agree: both read the one thread-local state. The nesting depth counts open guards
/// whatever their order, and the weight-cast cache is cleared when it drops to zero.
///
/// A guard belongs to the thread that entered it (the state is thread-local):
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// let g = amp_autocast::Autocast::new(amp_policy::DeviceType::Cpu).enter().unwrap();
/// send(g);
/// ```
#[must_use = "the region ends when the guard drops"]
pub struct AutocastGuard {
    device: DeviceType,
    prev: DeviceState,
    prev_profile: Option<Profile>,
    prev_trace: Option<Option<Vec<TraceEvent>>>,
    _not_send: PhantomData<*const ()>,
}

impl AutocastGuard {
    /// The decisions recorded so far in this region (empty unless it traces).
    pub fn trace(&self) -> Trace {
        STATE.with(|s| Trace {
            events: s.borrow().trace.clone().unwrap_or_default(),
        })
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        STATE.with(|s| {
            let mut st = s.borrow_mut();
            st.devices[self.device.index()] = self.prev;
            if let Some(p) = self.prev_profile.take() {
                st.profile = p;
            }
            if let Some(prev) = self.prev_trace.take() {
                let mine = std::mem::replace(&mut st.trace, prev);
                if let (Some(outer), Some(mine)) = (st.trace.as_mut(), mine) {
                    outer.extend(mine);
                }
            }
            st.depth -= 1;
            if st.depth == 0 {
                st.cache.clear();
            }
            st.sync_layer();
        });
    }
}

/// Run `f` with autocast on for `device` in `dtype` (`with torch.autocast(device, dtype):`).
pub fn autocast<R>(
    device: DeviceType,
    dtype: DType,
    f: impl FnOnce() -> R,
) -> Result<R, AutocastError> {
    Autocast::new(device).dtype(dtype).run(f)
}

/// [`autocast`] for a closure that returns a `Result`: the region's refusal and the
/// closure's error come back as one error type (`amp_autograd::Error` takes both), so
/// one `?` does.
///
/// ```
/// use amp_autocast::try_autocast;
/// use amp_autograd::{ops, Tensor};
/// use amp_policy::DeviceType;
/// use amp_tensor::DType;
///
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
/// let y = try_autocast(DeviceType::Cpu, DType::BF16, || ops::mm(&a, &a))?;
/// assert_eq!(y.dtype(), DType::BF16);
/// // A dtype the device cannot autocast to is the same error type as the ops' own.
/// let e = try_autocast(DeviceType::Cpu, DType::F64, || ops::mm(&a, &a)).unwrap_err();
/// assert!(matches!(e, amp_autograd::Error::Layer(_)));
/// # Ok::<(), amp_autograd::Error>(())
/// ```
///
/// # Errors
/// The region's refusal (converted into `E`), or `f`'s error.
pub fn try_autocast<T, E: From<AutocastError>>(
    device: DeviceType,
    dtype: DType,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    Autocast::new(device).dtype(dtype).try_run(f)
}

/// Run `f` and return what autocast decided in it.
pub fn traced<R>(region: Autocast, f: impl FnOnce() -> R) -> Result<(R, Trace), AutocastError> {
    let g = region.trace(true).enter()?;
    let r = f();
    let t = g.trace();
    drop(g);
    Ok((r, t))
}
