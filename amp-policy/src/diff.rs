//! Differences between two profiles' lists.

use serde::Serialize;

use crate::{CastPolicy, DeviceType, Profile};

/// One op whose listed policy differs between two profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PolicyChange {
    /// The device type.
    pub device: DeviceType,
    /// The op name.
    pub op: &'static str,
    /// Its policy in the first profile (`none` when not listed there).
    pub from: CastPolicy,
    /// Its policy in the second profile.
    pub to: CastPolicy,
}

impl Profile {
    /// The ops whose listed policy (aliases not followed) differs from `self` to `other`:
    /// per device (cpu first), in `self`'s list order, then the ops only `other` lists, in
    /// its order. Ban messages are not compared.
    ///
    /// ```
    /// use amp_policy::{CastPolicy, DeviceType, Profile};
    /// let changes = Profile::docs().diff(&Profile::torch_2_15());
    /// assert!(changes.iter().any(|c| c.device == DeviceType::Cpu
    ///     && c.op == "prelu"
    ///     && c.from == CastPolicy::None
    ///     && c.to == CastPolicy::LowerPrecisionFp));
    /// ```
    pub fn diff(&self, other: &Profile) -> Vec<PolicyChange> {
        let mut out = Vec::new();
        for device in DeviceType::ALL {
            let (a, b) = (self.table(device), other.table(device));
            for e in a.entries() {
                let to = b.own(e.id()).map_or(CastPolicy::None, |o| o.policy());
                if to != e.policy() {
                    out.push(PolicyChange {
                        device,
                        op: e.op(),
                        from: e.policy(),
                        to,
                    });
                }
            }
            for e in b.entries() {
                if a.own(e.id()).is_none() && e.policy() != CastPolicy::None {
                    out.push(PolicyChange {
                        device,
                        op: e.op(),
                        from: CastPolicy::None,
                        to: e.policy(),
                    });
                }
            }
        }
        out
    }
}
