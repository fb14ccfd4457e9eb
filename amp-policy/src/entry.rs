//! One op's entry in a device table, where it came from, and op-name aliases.

use serde::Serialize;

use crate::{CastPolicy, OpId};

/// Where an [`Entry`]'s policy came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Source {
    /// A list of the torch.amp documentation (the `docs` profile's data files).
    Documented {
        /// The list's title, e.g. `CUDA Ops that can autocast to float16`.
        list: String,
    },
    /// A change made by a named profile over its base (e.g. `torch-2.15` over `docs`).
    Profile {
        /// The profile that made the change.
        profile: String,
        /// Why, as the profile's data file says.
        note: String,
    },
    /// A user override ([`Profile::with_override`](crate::Profile::with_override),
    /// [`Profile::with_ban`](crate::Profile::with_ban)).
    Override,
}

/// An op's policy on one device type, with its ban message and its source.
///
/// When a profile or an override changes an op that already had an entry, the new entry
/// keeps the one it replaces ([`Entry::replaces`]), so the history of a decision is visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    op: &'static str,
    #[serde(skip)]
    id: OpId,
    policy: CastPolicy,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    source: Source,
    #[serde(skip_serializing_if = "Option::is_none")]
    replaces: Option<Box<Entry>>,
}

impl Entry {
    pub(crate) fn new(
        id: OpId,
        policy: CastPolicy,
        message: Option<String>,
        source: Source,
    ) -> Self {
        Entry {
            op: id.name(),
            id,
            policy,
            message,
            source,
            replaces: None,
        }
    }

    pub(crate) fn replacing(mut self, old: Entry) -> Self {
        self.replaces = Some(Box::new(old));
        self
    }

    /// The op name, as its list writes it.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The op's interned id.
    pub fn id(&self) -> OpId {
        self.id
    }

    /// The op's policy.
    pub fn policy(&self) -> CastPolicy {
        self.policy
    }

    /// The error message of a [`CastPolicy::Banned`] op (`None` for every other policy).
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// Where the policy came from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The entry this one replaced (a profile change or a user override of a listed op).
    pub fn replaces(&self) -> Option<&Entry> {
        self.replaces.as_deref()
    }
}

/// A second name of an op on one device type: a lookup of `name` that finds no entry of its
/// own takes the entry of `of`.
///
/// The documentation names some ops differently per device: the CUDA list has
/// `grid_sample` (the `torch.nn.functional` name), the CPU list `grid_sampler` (the ATen op
/// it calls). Dispatch ([`Profile::policy`](crate::Profile::policy)) follows aliases; the
/// literal lists ([`Profile::listed_policy`](crate::Profile::listed_policy)) do not.
/// Aliases are not transitive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alias {
    name: &'static str,
    #[serde(skip)]
    id: OpId,
    of: &'static str,
    #[serde(skip)]
    of_id: OpId,
    why: String,
}

impl Alias {
    pub(crate) fn new(id: OpId, of_id: OpId, why: String) -> Self {
        Alias {
            name: id.name(),
            id,
            of: of_id.name(),
            of_id,
            why,
        }
    }

    /// The second name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The second name's id.
    pub fn id(&self) -> OpId {
        self.id
    }

    /// The name the list documents.
    pub fn of(&self) -> &'static str {
        self.of
    }

    /// The documented name's id.
    pub fn of_id(&self) -> OpId {
        self.of_id
    }

    /// Why the two names are the same op.
    pub fn why(&self) -> &str {
        &self.why
    }
}
