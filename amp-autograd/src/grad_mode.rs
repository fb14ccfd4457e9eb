//! Whether ops record a graph: thread-local, like PyTorch's grad mode.

use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// `true` while ops record the graph on this thread (the default).
#[inline]
pub fn is_grad_enabled() -> bool {
    ENABLED.with(|c| c.get())
}

/// Restores the previous grad mode when dropped (also while unwinding).
#[must_use = "grad mode is restored when the guard drops"]
pub struct GradModeGuard {
    prev: bool,
}

impl GradModeGuard {
    /// Set grad mode to `enabled` until the guard drops.
    pub fn new(enabled: bool) -> Self {
        let prev = ENABLED.with(|c| c.replace(enabled));
        GradModeGuard { prev }
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        ENABLED.with(|c| c.set(self.prev));
    }
}

/// Disable graph recording until the guard drops (`with torch.no_grad():`).
pub fn no_grad_guard() -> GradModeGuard {
    GradModeGuard::new(false)
}

/// Run `f` without recording a graph.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = no_grad_guard();
    f()
}

/// Run `f` with graph recording on (inside a `no_grad` region, too).
pub fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = GradModeGuard::new(true);
    f()
}
