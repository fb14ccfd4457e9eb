//! Profiles: immutable, cheaply clonable sets of per-device policy tables.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::data::{self, DOCS_CPU, DOCS_CUDA, TORCH_2_15};
use crate::table::Table;
use crate::{Alias, CastPolicy, DeviceType, Entry, OpId, PolicyError, Source};

/// A complete autocast policy: one table per device type.
///
/// A `Profile` is an immutable value behind an [`Arc`]: cloning it is a reference-count
/// increment, and it can be shared freely between threads. Changing it
/// ([`with_override`](Profile::with_override), [`with_ban`](Profile::with_ban),
/// [`with_changes_json`](Profile::with_changes_json)) returns a new profile and leaves the
/// original alone. Every entry records its [`Source`].
///
/// Built-in profiles:
/// - `docs` ([`Profile::docs`], the default): the lists of the torch.amp documentation.
/// - `torch-2.15` ([`Profile::torch_2_15`]): what PyTorch 2.15 does, as changes over `docs`.
///
/// ```
/// use amp_policy::{CastPolicy, DeviceType, Profile};
///
/// let docs = Profile::docs();
/// let mine = docs.with_override(DeviceType::Cuda, "mm", CastPolicy::Fp32);
/// assert_eq!(mine.policy_by_name(DeviceType::Cuda, "mm"), CastPolicy::Fp32);
/// assert_eq!(docs.policy_by_name(DeviceType::Cuda, "mm"), CastPolicy::LowerPrecisionFp);
/// ```
#[derive(Clone)]
pub struct Profile {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    tables: [Table; 2],
}

impl Profile {
    /// The name of the default profile, the documented lists.
    pub const DOCS: &'static str = "docs";
    /// The name of the PyTorch 2.15 profile.
    pub const TORCH_2_15: &'static str = "torch-2.15";
    /// The names of the built-in profiles, default first.
    pub const NAMES: [&'static str; 2] = [Profile::DOCS, Profile::TORCH_2_15];

    fn new(name: String, tables: [Table; 2]) -> Profile {
        debug_assert!(tables
            .iter()
            .zip(DeviceType::ALL)
            .all(|(t, d)| t.device() == d));
        Profile {
            inner: Arc::new(Inner { name, tables }),
        }
    }

    /// The documented lists of the torch.amp documentation (the default profile).
    ///
    /// Loaded once per process from the crate's data files; later calls clone an `Arc`.
    pub fn docs() -> Profile {
        static DOCS: OnceLock<Profile> = OnceLock::new();
        DOCS.get_or_init(|| {
            Profile::from_tables(Profile::DOCS, DOCS_CPU, DOCS_CUDA)
                .expect("the embedded documented lists are valid (checked by the crate's tests)")
        })
        .clone()
    }

    /// PyTorch 2.15's behaviour: `docs` with the changes of `data/profiles/torch-2.15.json`
    /// (read from PyTorch 2.15's `autocast_mode.cpp`; each change carries its note).
    pub fn torch_2_15() -> Profile {
        static TORCH: OnceLock<Profile> = OnceLock::new();
        TORCH
            .get_or_init(|| {
                Profile::docs()
                    .apply_changes(TORCH_2_15.0, TORCH_2_15.1)
                    .expect(
                        "the embedded torch-2.15 profile is valid (checked by the crate's tests)",
                    )
            })
            .clone()
    }

    /// A built-in profile by name: `docs` or `torch-2.15`.
    ///
    /// ```
    /// use amp_policy::{PolicyError, Profile};
    /// assert_eq!(Profile::by_name("torch-2.15").unwrap().name(), "torch-2.15");
    /// assert!(matches!(Profile::by_name("torch-1.0"), Err(PolicyError::UnknownProfile { .. })));
    /// ```
    pub fn by_name(name: &str) -> Result<Profile, PolicyError> {
        match name {
            Profile::DOCS => Ok(Profile::docs()),
            Profile::TORCH_2_15 => Ok(Profile::torch_2_15()),
            other => Err(PolicyError::UnknownProfile {
                name: other.to_owned(),
                known: Profile::NAMES.join(", "),
            }),
        }
    }

    fn from_tables(
        name: &str,
        cpu: (&str, &str),
        cuda: (&str, &str),
    ) -> Result<Profile, PolicyError> {
        let cpu = data::parse_table(cpu.0, cpu.1, DeviceType::Cpu)?;
        let cuda = data::parse_table(cuda.0, cuda.1, DeviceType::Cuda)?;
        Ok(Profile::new(name.to_owned(), [cpu, cuda]))
    }

    /// A profile built from two device-table data files (format `amp-policy-table/1`, the
    /// format of the crate's `data/docs/*.json`):
    ///
    /// ```json
    /// {
    ///   "format": "amp-policy-table/1",
    ///   "device": "cuda",
    ///   "source": "where the lists come from",
    ///   "notes": ["optional remarks for readers"],
    ///   "lists": [
    ///     {"title": "CUDA Ops that can autocast to float16", "policy": "lower_precision_fp",
    ///      "ops": ["__matmul__", "addbmm"]},
    ///     {"title": "...", "policy": "banned", "ops": ["binary_cross_entropy"],
    ///      "message": ["first line", "second line"]}
    ///   ],
    ///   "aliases": [{"name": "grid_sampler", "of": "grid_sample", "why": "..."}]
    /// }
    /// ```
    ///
    /// Entries keep the order of the lists. A `banned` list needs a `message` (a string, or
    /// lines joined with `\n`); no other list may have one; `none` is not a list policy.
    ///
    /// Errors with [`PolicyError::BadData`] when a file does not parse, is for the other
    /// device, lists an op twice, or has a banned list without a message.
    pub fn from_json(name: &str, cpu_json: &str, cuda_json: &str) -> Result<Profile, PolicyError> {
        let cpu_label = format!("{name}: cpu table");
        let cuda_label = format!("{name}: cuda table");
        Profile::from_tables(name, (&cpu_label, cpu_json), (&cuda_label, cuda_json))
    }

    /// Applies a profile data file (format `amp-policy-profile/1`, the format of the crate's
    /// `data/profiles/torch-2.15.json`) to this profile, giving a profile named after the file:
    ///
    /// ```json
    /// {
    ///   "format": "amp-policy-profile/1",
    ///   "profile": "torch-2.15",
    ///   "base": "docs",
    ///   "source": "where the changes come from",
    ///   "notes": ["optional remarks for readers"],
    ///   "changes": [
    ///     {"device": "cpu", "policy": "lower_precision_fp", "ops": ["conv_transpose1d"],
    ///      "note": "why (shown by explain)"}
    ///   ]
    /// }
    /// ```
    ///
    /// Changes apply in order; a changed op keeps its place and records the entry it
    /// replaces, a new op is appended; `none` takes an op off the lists. An op may be changed
    /// once per device, and only to a policy it does not already have.
    ///
    /// The file's `base` must be this profile's name. Errors with [`PolicyError::BadData`].
    pub fn with_changes_json(&self, json: &str) -> Result<Profile, PolicyError> {
        self.apply_changes("profile changes", json)
    }

    fn apply_changes(&self, file: &str, json: &str) -> Result<Profile, PolicyError> {
        let applied = data::apply_profile(file, json, self.name(), &self.inner.tables)?;
        Ok(Profile::new(applied.name, applied.tables))
    }

    /// The profile's name (`docs`, `torch-2.15`, ...). Overrides keep the name; their entries
    /// say they come from an override.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    #[inline]
    pub(crate) fn table(&self, device: DeviceType) -> &Table {
        &self.inner.tables[device.index()]
    }

    /// The policy autocast applies to `op` on `device`: the hot path, one array read.
    ///
    /// Follows aliases (see [`Alias`]); an op this profile does not know is
    /// [`CastPolicy::None`].
    #[inline]
    pub fn policy(&self, device: DeviceType, op: OpId) -> CastPolicy {
        self.table(device).policy(op)
    }

    /// [`Profile::policy`] by name. Does not intern `name`: a name never interned cannot be on
    /// any list, and is [`CastPolicy::None`].
    pub fn policy_by_name(&self, device: DeviceType, op: &str) -> CastPolicy {
        OpId::lookup(op).map_or(CastPolicy::None, |id| self.policy(device, id))
    }

    /// The policy the lists give this very name, without following aliases: what the
    /// documentation's lists say (the `policy` conformance suite checks this).
    pub fn listed_policy(&self, device: DeviceType, op: &str) -> CastPolicy {
        self.listed_entry(device, op)
            .map_or(CastPolicy::None, Entry::policy)
    }

    /// The entry that decides `op`'s policy on `device`: its own, or its alias target's.
    pub fn entry(&self, device: DeviceType, op: &str) -> Option<&Entry> {
        OpId::lookup(op).and_then(|id| self.entry_by_id(device, id))
    }

    /// [`Profile::entry`] by id.
    pub fn entry_by_id(&self, device: DeviceType, op: OpId) -> Option<&Entry> {
        self.table(device).effective(op)
    }

    /// The entry listed under this very name (aliases not followed).
    pub fn listed_entry(&self, device: DeviceType, op: &str) -> Option<&Entry> {
        OpId::lookup(op).and_then(|id| self.table(device).own(id))
    }

    /// The alias declared for `op` on `device`, if any (active only while `op` has no entry
    /// of its own).
    pub fn alias(&self, device: DeviceType, op: &str) -> Option<&Alias> {
        OpId::lookup(op).and_then(|id| self.table(device).alias(id))
    }

    /// Every alias declared on `device`.
    pub fn aliases(&self, device: DeviceType) -> &[Alias] {
        self.table(device).aliases()
    }

    /// The error message when `op` is banned on `device`, else `None`.
    ///
    /// ```
    /// use amp_policy::{DeviceType, Profile};
    /// let p = Profile::docs();
    /// assert!(p.banned_message(DeviceType::Cuda, "binary_cross_entropy").unwrap()
    ///     .starts_with("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe"));
    /// assert_eq!(p.banned_message(DeviceType::Cpu, "binary_cross_entropy"), None);
    /// ```
    pub fn banned_message(&self, device: DeviceType, op: &str) -> Option<&str> {
        self.entry(device, op)
            .filter(|e| e.policy() == CastPolicy::Banned)
            .and_then(Entry::message)
    }

    /// [`Profile::banned_message`] by id.
    pub fn banned_message_by_id(&self, device: DeviceType, op: OpId) -> Option<&str> {
        self.entry_by_id(device, op)
            .filter(|e| e.policy() == CastPolicy::Banned)
            .and_then(Entry::message)
    }

    /// The ops listed with `policy` on `device`, in list order (documented order, then ops
    /// added by the profile or by overrides). Aliases are not included.
    pub fn ops(&self, device: DeviceType, policy: CastPolicy) -> Vec<&'static str> {
        self.entries(device)
            .filter(|e| e.policy() == policy)
            .map(Entry::op)
            .collect()
    }

    /// Every entry of `device`, in list order.
    pub fn entries(&self, device: DeviceType) -> std::slice::Iter<'_, Entry> {
        self.table(device).entries().iter()
    }

    /// Every entry of every device type (cpu first), in list order.
    pub fn iter(&self) -> impl Iterator<Item = (DeviceType, &Entry)> + '_ {
        DeviceType::ALL
            .into_iter()
            .flat_map(move |d| self.entries(d).map(move |e| (d, e)))
    }

    /// A new profile where `op` has `policy` on `device` (a user override; PyTorch has no
    /// equivalent). `op` may be a listed op (it keeps its place, and the entry it replaces is
    /// kept as [`Entry::replaces`]) or a new one (appended). Moving an op to
    /// [`CastPolicy::None`] takes it off autocast's lists.
    ///
    /// [`CastPolicy::Banned`] gets a generic message; use [`Profile::with_ban`] to give one.
    pub fn with_override(&self, device: DeviceType, op: &str, policy: CastPolicy) -> Profile {
        let message = (policy == CastPolicy::Banned)
            .then(|| format!("{op} is banned under {device} autocast by a user override"));
        self.with_entry(device, op, policy, message)
    }

    /// A new profile where `op` is banned on `device` with `message`.
    ///
    /// ```
    /// use amp_policy::{CastPolicy, DeviceType, Profile};
    /// let p = Profile::docs().with_ban(DeviceType::Cpu, "my_op", "my_op is unstable in bfloat16");
    /// assert_eq!(p.policy_by_name(DeviceType::Cpu, "my_op"), CastPolicy::Banned);
    /// assert_eq!(p.banned_message(DeviceType::Cpu, "my_op"), Some("my_op is unstable in bfloat16"));
    /// ```
    pub fn with_ban(&self, device: DeviceType, op: &str, message: impl Into<String>) -> Profile {
        self.with_entry(device, op, CastPolicy::Banned, Some(message.into()))
    }

    fn with_entry(
        &self,
        device: DeviceType,
        op: &str,
        policy: CastPolicy,
        message: Option<String>,
    ) -> Profile {
        let mut tables = self.inner.tables.clone();
        let entry = Entry::new(OpId::intern(op), policy, message, Source::Override);
        tables[device.index()].set(entry);
        Profile::new(self.inner.name.clone(), tables)
    }

    /// Whether two handles share one profile value (cloned from each other).
    pub fn ptr_eq(&self, other: &Profile) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Default for Profile {
    /// The `docs` profile.
    fn default() -> Self {
        Profile::docs()
    }
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Profile");
        s.field("name", &self.name());
        for d in DeviceType::ALL {
            s.field(d.as_str(), &self.table(d).entries().len());
        }
        s.finish()
    }
}
