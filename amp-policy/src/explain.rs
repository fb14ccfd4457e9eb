//! Human-readable explanations of a profile's decisions.

use crate::{CastPolicy, DeviceType, Entry, OpId, Profile, Source};

impl Profile {
    /// A sentence saying what autocast does with `op` on `device` under this profile, and why.
    ///
    /// ```
    /// use amp_policy::{DeviceType, Profile};
    /// let p = Profile::docs();
    /// assert_eq!(
    ///     p.explain(DeviceType::Cuda, "mm"),
    ///     "mm on cuda: lower_precision_fp (autocast to the lower-precision dtype) \
    ///      — from the documented CUDA list `CUDA Ops that can autocast to float16` (profile docs)"
    /// );
    /// assert_eq!(
    ///     p.explain(DeviceType::Cuda, "add"),
    ///     "add on cuda: none (runs in its input types) — on no CUDA list of profile docs, \
    ///      so autocast does not cast it"
    /// );
    /// ```
    pub fn explain(&self, device: DeviceType, op: &str) -> String {
        let id = OpId::lookup(op);
        let entry = id.and_then(|id| self.entry_by_id(device, id));
        let Some(entry) = entry else {
            let p = CastPolicy::None;
            return format!(
                "{op} on {device}: {p} ({}) — on no {} list of profile {}, so autocast does not cast it",
                p.description(),
                device.title(),
                self.name()
            );
        };
        let p = entry.policy();
        let mut s = format!("{op} on {device}: {p} ({}) — ", p.description());
        if entry.op() != op {
            // Reached through an alias.
            if let Some(alias) = self.alias(device, op) {
                s.push_str(&format!("as `{}` ({}), ", alias.of(), alias.why()));
            }
        }
        s.push_str(&self.source_phrase(device, entry));
        if let Some(old) = entry.replaces() {
            s.push_str(&format!(
                "; replaces {} {}",
                old.policy(),
                short_source_phrase(device, old)
            ));
        }
        if let Some(message) = entry.message() {
            s.push_str(". Error message:\n");
            s.push_str(message);
        }
        s
    }

    fn source_phrase(&self, device: DeviceType, entry: &Entry) -> String {
        match entry.source() {
            Source::Documented { list } => format!(
                "from the documented {} list `{list}` (profile {})",
                device.title(),
                self.name()
            ),
            Source::Profile { profile, note } => format!("from profile {profile}: {note}"),
            Source::Override => format!("from a user override (profile {})", self.name()),
        }
    }
}

fn short_source_phrase(device: DeviceType, entry: &Entry) -> String {
    match entry.source() {
        Source::Documented { list } => {
            format!("from the documented {} list `{list}`", device.title())
        }
        Source::Profile { profile, .. } => format!("from profile {profile}"),
        Source::Override => "from an earlier user override".to_owned(),
    }
}
