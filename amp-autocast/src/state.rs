//! The thread-local autocast state: per device type (enabled, dtype, cache_enabled),
//! the nesting depth, the weight-cast cache, the active policy profile and the trace.
//!
//! The state is the one source of truth: the autocast layer is installed at the dispatch
//! point exactly while some device type has autocast enabled (`State::sync_layer`, run
//! after every change), and the layer reads the same state for each op, so what
//! [`is_autocast_enabled`] reports is what ops do, whatever order guards are dropped in.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::RwLock;

use amp_autograd::{install_layer, is_layer_excluded, LayerGuard, Tensor};
use amp_policy::{DeviceType, Profile};
use amp_tensor::DType;

use crate::decision::default_dtype;
use crate::layer::AutocastLayer;
use crate::trace::TraceEvent;

/// One device type's autocast settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceState {
    /// Whether autocast is on for the device type.
    pub enabled: bool,
    /// The lower-precision dtype.
    pub dtype: DType,
    /// Whether the weight-cast cache is on.
    pub cache_enabled: bool,
}

pub(crate) struct State {
    pub devices: [DeviceState; 2],
    pub depth: usize,
    pub cache: HashMap<(u64, DType), Tensor>,
    pub profile: Profile,
    pub trace: Option<Vec<TraceEvent>>,
    /// The autocast layer at the dispatch point: present exactly while some device type
    /// has autocast enabled.
    layer: Option<LayerGuard>,
}

static GLOBAL_PROFILE: RwLock<Option<Profile>> = RwLock::new(None);

/// Set the policy profile threads use outside any region-scoped profile (the process
/// default is `docs`). Threads pick it up when they first use autocast, and every
/// region entered afterwards on any thread without its own profile uses it.
pub fn set_global_profile(profile: Profile) {
    *GLOBAL_PROFILE.write().unwrap_or_else(|e| e.into_inner()) = Some(profile);
}

/// The process-wide default profile.
pub fn global_profile() -> Profile {
    GLOBAL_PROFILE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(Profile::docs)
}

impl State {
    fn new() -> Self {
        let d = |t| DeviceState {
            enabled: false,
            dtype: default_dtype(t),
            cache_enabled: true,
        };
        State {
            devices: [d(DeviceType::Cpu), d(DeviceType::Cuda)],
            depth: 0,
            cache: HashMap::new(),
            profile: global_profile(),
            trace: None,
            layer: None,
        }
    }

    /// Installs or removes the autocast layer so that it is present exactly while some
    /// device type has autocast enabled. Run after every change of `devices`.
    pub(crate) fn sync_layer(&mut self) {
        let wanted = self.devices.iter().any(|d| d.enabled);
        if wanted && self.layer.is_none() {
            self.layer = Some(install_layer(Some(Rc::new(AutocastLayer))));
        } else if !wanted {
            self.layer = None;
        }
    }
}

thread_local! {
    pub(crate) static STATE: RefCell<State> = RefCell::new(State::new());
}

/// Whether autocast is enabled for `device` on this thread: exactly when ops on `device`
/// get autocast's policies.
///
/// As in PyTorch, this is `false` inside the body of an op autocast applied a policy to
/// (its body runs with autocast excluded); [`device_state`] gives the region's settings.
pub fn is_autocast_enabled(device: DeviceType) -> bool {
    STATE.with(|s| s.borrow().devices[device.index()].enabled) && !is_layer_excluded()
}

/// The lower-precision dtype autocast uses for `device` on this thread.
pub fn get_autocast_dtype(device: DeviceType) -> DType {
    STATE.with(|s| s.borrow().devices[device.index()].dtype)
}

/// Whether the weight-cast cache is on for `device` on this thread.
pub fn is_autocast_cache_enabled(device: DeviceType) -> bool {
    STATE.with(|s| s.borrow().devices[device.index()].cache_enabled)
}

/// The settings of `device` on this thread (as the innermost region set them, also inside
/// an op's body, where [`is_autocast_enabled`] reports autocast excluded).
pub fn device_state(device: DeviceType) -> DeviceState {
    STATE.with(|s| s.borrow().devices[device.index()])
}

/// How many autocast regions (enabled or not) are open on this thread.
pub fn autocast_depth() -> usize {
    STATE.with(|s| s.borrow().depth)
}

/// Number of cached casts (weights cast once per outermost region).
pub fn cache_len() -> usize {
    STATE.with(|s| s.borrow().cache.len())
}

/// Drop every cached cast now (PyTorch's `clear_autocast_cache`).
pub fn clear_autocast_cache() {
    STATE.with(|s| s.borrow_mut().cache.clear());
}

/// The profile in force on this thread.
pub fn current_profile() -> Profile {
    STATE.with(|s| s.borrow().profile.clone())
}
