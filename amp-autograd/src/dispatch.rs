//! The one dispatch point every differentiable op enters, and the layer hook on it.
//!
//! An op calls [`dispatch`] with its name, its tensor arguments and how it was called
//! (functional, in place, into an `out=` tensor, with an explicit `dtype=`). When a
//! [`DispatchLayer`] is installed on the thread (autocast is one), it may rewrite the
//! arguments (cast them) or the dtype, or refuse the op, before the op runs. While the
//! layer runs it is bypassed, so the ops it calls (casts) are not dispatched to it
//! again. With no layer installed the cost is one thread-local flag read.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

use amp_tensor::DType;

use crate::{Result, Tensor};

/// An op's name as the documented op lists spell it, with a slot a layer may use to
/// cache its own numeric id for the name (so lookups need no string hashing).
#[derive(Debug)]
pub struct OpName {
    name: &'static str,
    slot: AtomicU32,
}

impl OpName {
    /// A name for a `static`.
    pub const fn new(name: &'static str) -> Self {
        OpName {
            name,
            slot: AtomicU32::new(u32::MAX),
        }
    }
    /// The name.
    #[inline]
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The id a layer associated with this name, computing it once with `init`.
    /// (Only one layer kind uses the slot in a process; autocast does.)
    #[inline]
    pub fn cached_id(&self, init: impl FnOnce(&'static str) -> u32) -> u32 {
        let v = self.slot.load(Ordering::Relaxed);
        if v != u32::MAX {
            return v;
        }
        let id = init(self.name);
        self.slot.store(id, Ordering::Relaxed);
        id
    }
}

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
}

/// A hook at the dispatch point.
pub trait DispatchLayer {
    /// Inspect and possibly rewrite a call before the op runs; an error refuses it.
    fn on_call(&self, call: &mut OpCall<'_>) -> Result<()>;
}

thread_local! {
    static LAYER: RefCell<Option<Rc<dyn DispatchLayer>>> = const { RefCell::new(None) };
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
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
        ACTIVE.with(|a| a.set(prev.is_some()));
        LAYER.with(|l| *l.borrow_mut() = prev);
    }
}

/// Install `layer` on this thread (replacing any other) until the guard drops.
pub fn install_layer(layer: Option<Rc<dyn DispatchLayer>>) -> LayerGuard {
    ACTIVE.with(|a| a.set(layer.is_some()));
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

/// Runs `f` with the layer bypassed (the layer's own ops, or code that must see the
/// raw op, such as a custom function body with autocast off).
pub fn bypass<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(self.0));
        }
    }
    let _r = Restore(ACTIVE.with(|a| a.replace(false)));
    f()
}

/// The dispatch point. Lets the installed layer see (and rewrite) the call; returns
/// the dtype the op should use for its `dtype=` argument.
#[inline]
pub fn dispatch(
    op: &'static OpName,
    args: &mut [Tensor],
    dtype: Option<DType>,
    accepts_dtype: bool,
    kind: CallKind,
) -> Result<Option<DType>> {
    if !ACTIVE.with(|a| a.get()) {
        return Ok(dtype);
    }
    dispatch_slow(op, args, dtype, accepts_dtype, kind)
}

#[inline(never)]
fn dispatch_slow(
    op: &'static OpName,
    args: &mut [Tensor],
    dtype: Option<DType>,
    accepts_dtype: bool,
    kind: CallKind,
) -> Result<Option<DType>> {
    let Some(layer) = current_layer() else {
        return Ok(dtype);
    };
    let mut call = OpCall {
        op,
        args,
        dtype,
        explicit_dtype: dtype.is_some(),
        accepts_dtype,
        kind,
    };
    bypass(|| layer.on_call(&mut call))?;
    Ok(call.dtype)
}

/// Declare a `static` [`OpName`] and dispatch a functional call through it.
#[macro_export]
macro_rules! op_name {
    ($vis:vis $id:ident = $name:literal) => {
        $vis static $id: $crate::OpName = $crate::OpName::new($name);
    };
}
