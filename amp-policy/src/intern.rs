//! The op-name interner: a small, process-stable [`OpId`] per op name.
//!
//! The dispatch hot path looks an op's policy up by `OpId` (an array index) rather than by
//! hashing its name. Names are interned into one global, thread-safe table; an id never
//! changes for the life of the process, and the same name always gets the same id, whichever
//! thread asks first. Interned names are leaked (`&'static str`): there is one per distinct op
//! name, so the table stays small.

use std::collections::HashMap;
use std::fmt;
use std::sync::{LazyLock, OnceLock, RwLock};

/// The interned id of an op name. Cheap to copy, compare and hash; usable as an array index.
///
/// Ids only come from the interner, so every `OpId` has a name:
///
/// ```
/// use amp_policy::OpId;
/// let mm = OpId::intern("mm");
/// assert_eq!(OpId::intern("mm"), mm);
/// assert_eq!(mm.name(), "mm");
/// assert_eq!(OpId::lookup("mm"), Some(mm));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(u32);

struct Interner {
    ids: HashMap<&'static str, OpId>,
    names: Vec<&'static str>,
}

static INTERNER: LazyLock<RwLock<Interner>> = LazyLock::new(|| {
    RwLock::new(Interner {
        ids: HashMap::new(),
        names: Vec::new(),
    })
});

fn read() -> std::sync::RwLockReadGuard<'static, Interner> {
    // The interner's invariants hold between statements, so a poisoned lock is still usable.
    INTERNER.read().unwrap_or_else(|e| e.into_inner())
}

impl OpId {
    /// The id of `name`, interning it first if this process has not seen it.
    pub fn intern(name: &str) -> OpId {
        if let Some(id) = read().ids.get(name) {
            return *id;
        }
        let mut w = INTERNER.write().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = w.ids.get(name) {
            return *id; // another thread interned it between the two locks
        }
        let index = u32::try_from(w.names.len()).expect("more than u32::MAX op names interned");
        let id = OpId(index);
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        w.names.push(name);
        w.ids.insert(name, id);
        id
    }

    /// The id of `name` if it has been interned, without interning it.
    pub fn lookup(name: &str) -> Option<OpId> {
        read().ids.get(name).copied()
    }

    /// The interned name.
    pub fn name(self) -> &'static str {
        read().names[self.index()]
    }

    /// The id as a number (ids are dense, from 0, in interning order).
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self.0
    }

    /// The id with number `v` (the inverse of [`OpId::as_u32`]), for callers that cache
    /// ids as plain integers. A number never handed out by [`OpId::intern`] names no op:
    /// policy lookups give [`crate::CastPolicy::None`] and [`OpId::name`] panics.
    #[inline]
    pub const fn from_u32(v: u32) -> OpId {
        OpId(v)
    }

    /// The id as an array index.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// How many names this process has interned so far.
    pub fn interned_count() -> usize {
        read().names.len()
    }
}

impl fmt::Debug for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpId({}, {:?})", self.0, self.name())
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An op's name as the documented op lists spell it, with a lazily interned id, for a
/// `static` at a dispatch point: the first call to [`OpName::id`] interns the name, every
/// later call is one atomic load. This is the workspace's one op-name type: the
/// differentiable ops declare theirs in one table (`amp_autograd::ops::names`) and a
/// dispatch layer reads the id from it.
///
/// An op is *transparent* ([`OpName::new`]) or *opaque* ([`OpName::opaque`]). The ops a
/// transparent op's body calls are dispatched to a layer again whenever the layer left
/// the op itself alone, as PyTorch re-dispatches the ops of a composite that has no
/// autocast policy (`tensordot` on CPU inherits the casts of its products). An opaque op
/// stands for one PyTorch kernel that happens to be written from other ops
/// (`cosine_similarity`, `lu_solve`, ...): a layer never sees its body, whatever it did
/// with the op itself. (PyTorch's recurrent cells are composites: transparent.)
///
/// ```
/// use amp_policy::{CastPolicy, DeviceType, OpName, Profile};
///
/// static MM: OpName = OpName::new("mm");
///
/// let profile = Profile::docs();
/// assert_eq!(profile.policy(DeviceType::Cuda, MM.id()), CastPolicy::LowerPrecisionFp);
/// assert_eq!(MM.name(), "mm");
/// assert!(!MM.is_opaque());
/// ```
pub struct OpName {
    name: &'static str,
    opaque: bool,
    id: OnceLock<OpId>,
}

impl OpName {
    /// A transparent op's name, its id interned on first use.
    pub const fn new(name: &'static str) -> Self {
        OpName {
            name,
            opaque: false,
            id: OnceLock::new(),
        }
    }

    /// An opaque op's name (see the type's documentation), its id interned on first use.
    pub const fn opaque(name: &'static str) -> Self {
        OpName {
            name,
            opaque: true,
            id: OnceLock::new(),
        }
    }

    /// The op name.
    #[inline]
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Whether the op's body is hidden from a dispatch layer even when the layer left the
    /// op alone.
    #[inline]
    pub const fn is_opaque(&self) -> bool {
        self.opaque
    }

    /// The interned id (interned on the first call).
    #[inline]
    pub fn id(&self) -> OpId {
        match self.id.get() {
            Some(id) => *id,
            None => *self.id.get_or_init(|| OpId::intern(self.name)),
        }
    }
}

impl fmt::Debug for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpName")
            .field("name", &self.name)
            .field("opaque", &self.opaque)
            .field("id", &self.id.get().map(|id| id.0))
            .finish()
    }
}

impl From<&OpName> for OpId {
    fn from(name: &OpName) -> OpId {
        name.id()
    }
}
