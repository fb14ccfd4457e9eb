//! The one dispatch point every differentiable op enters, and the layer hook on it.
//!
//! An op calls [`dispatch`] with its name, its tensor arguments and how it was called
//! (functional, in place, into an `out=` tensor, with an explicit `dtype=`). When a
//! [`DispatchLayer`] is installed on the thread (autocast is one), it may rewrite the
//! arguments (cast them) or the dtype, or refuse the op, before the op runs. While the
//! layer runs it is excluded, so the ops it calls (casts) are not dispatched to it
//! again. With no layer installed the cost is one thread-local flag read.
//!
//! **The nesting rule.** [`dispatch`] returns a [`BodyGuard`] that the op keeps alive
//! while its body runs. When the layer applied something to the call
//! ([`BodyMode::Excluded`]), or the op is [opaque](OpName::opaque), the guard excludes
//! the layer until it drops (restored on error and on panic too), so the ops a composite
//! is built from (`addbmm` = `bmm` + `sum`) are not dispatched to the layer again: PyTorch's
//! autocast wrappers run their body under an `ExcludeDispatchKeyGuard` in the same way.
//! Otherwise (an op the layer left alone, such as one on no autocast list) the body's ops
//! are dispatched as usual and get their own policies.
//!
//! **Reading arguments as another dtype.** An op that can read float32 arguments as a
//! 16-bit dtype with the bits of its casts (`mm`, `bmm`, `matmul`, `@`) enters through
//! [`dispatch_read_as`]; the layer may then set [`OpCall::read_as`] instead of casting,
//! and the op reads [`BodyGuard::read_as`]. Other ops never see it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use amp_tensor::DType;

use crate::{Result, Tensor};

/// An op's name (and whether it is opaque), as the documented op lists spell it: the
/// workspace's one op-name type, from `amp-policy`'s interner, so a layer reads the op's
/// interned id straight from it. Every op of this crate declares its name once, in
/// [`crate::ops::names`].
pub use amp_policy::OpName;

/// How an op was called: autocast leaves in-place and `out=` calls alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallKind {
    /// Returns a new tensor.
    #[default]
    Functional,
    /// Modifies its first argument (`add_`).
    InPlace,
    /// Writes into a given output tensor (`out=`).
    Out,
}

/// One op call as a layer sees it.
pub struct OpCall<'a> {
    /// The op.
    pub op: &'static OpName,
    /// Its tensor arguments in order (lists flattened in order). A layer may replace them.
    pub args: &'a mut [Tensor],
    /// The `dtype=` argument: `Some` when given explicitly by the caller, or set by a
    /// layer for an op that accepts one (`accepts_dtype`).
    pub dtype: Option<DType>,
    /// Whether the caller gave `dtype=` explicitly.
    pub explicit_dtype: bool,
    /// Whether the op has a `dtype=` parameter at all.
    pub accepts_dtype: bool,
    /// How the op was called.
    pub kind: CallKind,
    /// Whether the op can read float32 arguments as a 16-bit dtype itself, with the bits
    /// of the op on the arguments cast to it (`mm`, `bmm`: the kernels round each value
    /// as they read it), so that a layer may ask for that instead of casting
    /// ([`OpCall::read_as`]).
    pub can_read_as: bool,
    /// Set by a layer instead of casting the arguments (only when [`OpCall::can_read_as`]
    /// and no argument needs a gradient): the op reads its float32 arguments as this
    /// dtype ([`BodyGuard::read_as`]).
    pub read_as: Option<DType>,
}

/// What a layer did with a call, which decides how the op's body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// The layer left the op alone: the ops its body calls are dispatched to the layer
    /// as usual (unless the op is [opaque](OpName::opaque)).
    Layered,
    /// The layer applied something to the op (autocast: a policy other than `none`): its
    /// body runs with the layer excluded.
    Excluded,
}

/// A hook at the dispatch point.
pub trait DispatchLayer {
    /// Inspect and possibly rewrite a call before the op runs; an error refuses it. The
    /// answer says whether the op's body may see the layer.
    fn on_call(&self, call: &mut OpCall<'_>) -> Result<BodyMode>;
}

thread_local! {
    static LAYER: RefCell<Option<Rc<dyn DispatchLayer>>> = const { RefCell::new(None) };
    /// A layer is installed.
    static INSTALLED: Cell<bool> = const { Cell::new(false) };
    /// The layer is excluded (inside the layer itself, or inside an op's body).
    static EXCLUDED: Cell<bool> = const { Cell::new(false) };
    /// `INSTALLED && !EXCLUDED`: the one flag the fast path reads.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

fn set_state(installed: bool, excluded: bool) {
    INSTALLED.set(installed);
    EXCLUDED.set(excluded);
    ACTIVE.set(installed && !excluded);
}

/// Restores the previously installed layer when dropped.
#[must_use = "the layer is uninstalled when the guard drops"]
pub struct LayerGuard {
    prev: Option<Rc<dyn DispatchLayer>>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for LayerGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        set_state(prev.is_some(), EXCLUDED.get());
        // `try_with`: a guard kept in another thread-local may drop while this thread's
        // locals are being destroyed.
        let _ = LAYER.try_with(|l| *l.borrow_mut() = prev);
    }
}

/// Install `layer` on this thread (replacing any other) until the guard drops.
pub fn install_layer(layer: Option<Rc<dyn DispatchLayer>>) -> LayerGuard {
    set_state(layer.is_some(), EXCLUDED.get());
    let prev = LAYER.with(|l| std::mem::replace(&mut *l.borrow_mut(), layer));
    LayerGuard {
        prev,
        _not_send: std::marker::PhantomData,
    }
}

/// The layer installed on this thread, if any.
pub fn current_layer() -> Option<Rc<dyn DispatchLayer>> {
    LAYER.with(|l| l.borrow().clone())
}

/// `true` while the layer is excluded on this thread: inside the layer itself, or inside
/// the body of an op the layer applied something to (or an opaque op).
pub fn is_layer_excluded() -> bool {
    EXCLUDED.get()
}

/// Keeps the layer excluded while an op's body runs (the nesting rule, see the module
/// documentation); does nothing when the op's body may see the layer. Dropping it
/// restores the previous exclusion, also on an early error return and while unwinding.
#[must_use = "the op's body is excluded from the layer only while the guard lives"]
pub struct BodyGuard {
    /// The exclusion to restore, when this guard set one.
    restore: Option<bool>,
    /// The dtype the layer asked the op to read its float32 arguments as.
    read_as: Option<DType>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl BodyGuard {
    /// A guard that changes nothing.
    const fn none() -> Self {
        BodyGuard {
            restore: None,
            read_as: None,
            _not_send: std::marker::PhantomData,
        }
    }
    /// Exclude the layer until the guard drops.
    fn exclude() -> Self {
        let prev = EXCLUDED.get();
        set_state(INSTALLED.get(), true);
        BodyGuard {
            restore: Some(prev),
            read_as: None,
            _not_send: std::marker::PhantomData,
        }
    }
    /// Whether this guard excludes the layer.
    pub fn excludes(&self) -> bool {
        self.restore.is_some()
    }
    /// The dtype the op reads its float32 arguments as, when the layer asked for that
    /// instead of casting them ([`OpCall::read_as`]; never without
    /// [`dispatch_read_as`]).
    pub fn read_as(&self) -> Option<DType> {
        self.read_as
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            set_state(INSTALLED.get(), prev);
        }
    }
}

/// The dispatch point. Lets the installed layer see (and rewrite) the call; returns the
/// dtype the op should use for its `dtype=` argument and the guard the op keeps alive
/// while its body runs (see the nesting rule in the module documentation):
///
/// ```text
/// let (dtype, _body) = dispatch(&SUM, &mut args, dtype, true, CallKind::Functional)?;
/// // ... the op's body, excluded from the layer when the layer applied a policy ...
/// ```
#[inline]
pub fn dispatch(
    op: &'static OpName,
    args: &mut [Tensor],
    dtype: Option<DType>,
    accepts_dtype: bool,
    kind: CallKind,
) -> Result<(Option<DType>, BodyGuard)> {
    if !ACTIVE.get() {
        return Ok((dtype, BodyGuard::none()));
    }
    dispatch_slow(OpCall {
        op,
        args,
        dtype,
        explicit_dtype: dtype.is_some(),
        accepts_dtype,
        kind,
        can_read_as: false,
        read_as: None,
    })
}

/// [`dispatch`] for a functional op without a `dtype=` argument that can read float32
/// arguments as a 16-bit dtype itself ([`OpCall::can_read_as`]): the layer may answer
/// with [`BodyGuard::read_as`] instead of casting the arguments, and the op then reads
/// them so.
#[inline]
pub fn dispatch_read_as(op: &'static OpName, args: &mut [Tensor]) -> Result<BodyGuard> {
    if !ACTIVE.get() {
        return Ok(BodyGuard::none());
    }
    dispatch_slow(OpCall {
        op,
        args,
        dtype: None,
        explicit_dtype: false,
        accepts_dtype: false,
        kind: CallKind::Functional,
        can_read_as: true,
        read_as: None,
    })
    .map(|(_, body)| body)
}

#[inline(never)]
fn dispatch_slow(mut call: OpCall<'_>) -> Result<(Option<DType>, BodyGuard)> {
    let Some(layer) = current_layer() else {
        return Ok((call.dtype, BodyGuard::none()));
    };
    let mode = {
        // The layer's own ops (casts) are not dispatched to it again.
        let _layer = BodyGuard::exclude();
        layer.on_call(&mut call)?
    };
    let mut body = if mode == BodyMode::Excluded || call.op.is_opaque() {
        BodyGuard::exclude()
    } else {
        BodyGuard::none()
    };
    body.read_as = call.read_as.filter(|_| call.can_read_as);
    Ok((call.dtype, body))
}
