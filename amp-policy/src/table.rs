//! One device type's table: entries in list order, aliases, and the dense lookup arrays.

use std::collections::HashMap;

use crate::{Alias, CastPolicy, DeviceType, Entry, OpId};

const NO_ENTRY: u32 = u32::MAX;

/// A device type's policy table. Entries keep their documented order; an entry that is
/// changed keeps its place, a new op goes to the end. `policies` and `slots` are indexed by
/// [`OpId`] and hold the effective decision (own entry, else the alias target's entry);
/// ids beyond their length are ops this table does not know (`none`).
#[derive(Debug, Clone)]
pub(crate) struct Table {
    device: DeviceType,
    entries: Vec<Entry>,
    aliases: Vec<Alias>,
    own: HashMap<OpId, usize>,
    policies: Box<[CastPolicy]>,
    slots: Box<[u32]>,
}

impl Table {
    pub(crate) fn new(device: DeviceType) -> Self {
        Table {
            device,
            entries: Vec::new(),
            aliases: Vec::new(),
            own: HashMap::new(),
            policies: Box::new([]),
            slots: Box::new([]),
        }
    }

    pub(crate) fn device(&self) -> DeviceType {
        self.device
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn aliases(&self) -> &[Alias] {
        &self.aliases
    }

    /// The entry listed under this very name (aliases not followed).
    pub(crate) fn own(&self, id: OpId) -> Option<&Entry> {
        self.own.get(&id).map(|&i| &self.entries[i])
    }

    /// The entry that decides the op's policy: its own, else its alias target's.
    pub(crate) fn effective(&self, id: OpId) -> Option<&Entry> {
        match self.slots.get(id.index()) {
            Some(&slot) if slot != NO_ENTRY => Some(&self.entries[slot as usize]),
            _ => None,
        }
    }

    /// The alias declared for this name, if any.
    pub(crate) fn alias(&self, id: OpId) -> Option<&Alias> {
        self.aliases.iter().find(|a| a.id() == id)
    }

    /// The hot path: one bounds-checked array read.
    #[inline]
    pub(crate) fn policy(&self, id: OpId) -> CastPolicy {
        match self.policies.get(id.index()) {
            Some(p) => *p,
            None => CastPolicy::None,
        }
    }

    /// Whether the table has its own entry for `id`.
    pub(crate) fn contains(&self, id: OpId) -> bool {
        self.own.contains_key(&id)
    }

    /// Sets an op's entry without rebuilding the lookup arrays: a new op is appended, an
    /// existing one is replaced in place and kept as [`Entry::replaces`].
    pub(crate) fn set_deferred(&mut self, entry: Entry) {
        match self.own.get(&entry.id()) {
            Some(&i) => {
                let old = self.entries[i].clone();
                self.entries[i] = entry.replacing(old);
            }
            None => {
                self.own.insert(entry.id(), self.entries.len());
                self.entries.push(entry);
            }
        }
    }

    /// Sets an op's entry and rebuilds the lookup arrays.
    pub(crate) fn set(&mut self, entry: Entry) {
        self.set_deferred(entry);
        self.rebuild();
    }

    pub(crate) fn push_alias_deferred(&mut self, alias: Alias) {
        self.aliases.retain(|a| a.id() != alias.id());
        self.aliases.push(alias);
    }

    /// Recomputes the dense arrays from the entries and aliases.
    pub(crate) fn rebuild(&mut self) {
        let len = self
            .entries
            .iter()
            .map(|e| e.id().index() + 1)
            .chain(self.aliases.iter().map(|a| a.id().index() + 1))
            .max()
            .unwrap_or(0);
        let mut slots = vec![NO_ENTRY; len];
        for (i, e) in self.entries.iter().enumerate() {
            slots[e.id().index()] = u32::try_from(i).expect("table too large");
        }
        for a in &self.aliases {
            if slots[a.id().index()] == NO_ENTRY {
                if let Some(&target) = self.own.get(&a.of_id()) {
                    slots[a.id().index()] = u32::try_from(target).expect("table too large");
                }
            }
        }
        let policies = slots
            .iter()
            .map(|&s| {
                if s == NO_ENTRY {
                    CastPolicy::None
                } else {
                    self.entries[s as usize].policy()
                }
            })
            .collect();
        self.slots = slots.into_boxed_slice();
        self.policies = policies;
    }
}
