//! Coverage of the documented op lists: for each list, which ops run end to end.
//!
//! An op is *executable* when the op table has an entry for the call that reaches it. The
//! call of an op comes from the vectors that exercise it (`op` → `call`), or, for a listed
//! op no vector exercises, from [`ops::CALLS_WITHOUT_VECTORS`](crate::ops::CALLS_WITHOUT_VECTORS).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use amp::policy::{CastPolicy, DeviceType, Profile};

use crate::optable::OpTable;

/// The six documented lists the report covers, in report order.
pub const LISTS: [(DeviceType, CastPolicy); 6] = [
    (DeviceType::Cuda, CastPolicy::LowerPrecisionFp),
    (DeviceType::Cuda, CastPolicy::Fp32),
    (DeviceType::Cuda, CastPolicy::Promote),
    (DeviceType::Cpu, CastPolicy::LowerPrecisionFp),
    (DeviceType::Cpu, CastPolicy::Fp32),
    (DeviceType::Cpu, CastPolicy::Promote),
];

/// Which calls reach each documented op.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpCalls {
    calls: BTreeMap<String, BTreeSet<String>>,
}

impl OpCalls {
    /// An empty map.
    pub fn new() -> OpCalls {
        OpCalls::default()
    }

    /// Records that `op` is reached through `call`.
    pub fn add(&mut self, op: &str, call: &str) {
        self.calls
            .entry(op.to_owned())
            .or_default()
            .insert(call.to_owned());
    }

    /// The calls of `op` (empty when unknown).
    pub fn calls(&self, op: &str) -> impl Iterator<Item = &str> {
        self.calls.get(op).into_iter().flatten().map(String::as_str)
    }

    /// Whether any call of `op` is known.
    pub fn knows(&self, op: &str) -> bool {
        self.calls.get(op).is_some_and(|c| !c.is_empty())
    }
}

/// One documented list's coverage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCoverage {
    /// The list's device type.
    pub device: DeviceType,
    /// The list's policy.
    pub policy: CastPolicy,
    /// Ops of the list that run end to end, in documented order.
    pub executable: Vec<String>,
    /// Ops that do not, in documented order.
    pub missing: Vec<String>,
    /// Ops among `missing` with no known call (neither a vector nor the explicit map).
    pub no_call: Vec<String>,
}

impl ListCoverage {
    /// `cuda lower_precision_fp`.
    pub fn title(&self) -> String {
        format!("{} {}", self.device, self.policy)
    }

    /// Number of ops on the list.
    pub fn total(&self) -> usize {
        self.executable.len() + self.missing.len()
    }
}

/// The coverage of all six lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// One entry per list of [`LISTS`], in that order.
    pub lists: Vec<ListCoverage>,
}

impl Coverage {
    /// Coverage of `profile`'s lists by `table`, with `calls` mapping op names to calls.
    /// An op is executable when it has a known call and the table serves every call of it.
    pub fn compute<T>(profile: &Profile, table: &OpTable<T>, calls: &OpCalls) -> Coverage {
        let lists = LISTS
            .iter()
            .map(|&(device, policy)| {
                let mut list = ListCoverage {
                    device,
                    policy,
                    executable: Vec::new(),
                    missing: Vec::new(),
                    no_call: Vec::new(),
                };
                for op in profile.ops(device, policy) {
                    let known = calls.knows(op);
                    if known && calls.calls(op).all(|c| table.supports(op, c)) {
                        list.executable.push(op.to_owned());
                    } else {
                        list.missing.push(op.to_owned());
                        if !known {
                            list.no_call.push(op.to_owned());
                        }
                    }
                }
                list
            })
            .collect();
        Coverage { lists }
    }
}

impl fmt::Display for Coverage {
    /// A table of executable / total per list, then the ops that are not executable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "coverage of the documented op lists (ops executable end to end):"
        )?;
        writeln!(f, "  {:<26}{:>10}{:>7}", "list", "executable", "total")?;
        for l in &self.lists {
            writeln!(
                f,
                "  {:<26}{:>10}{:>7}",
                l.title(),
                l.executable.len(),
                l.total()
            )?;
        }
        if self.lists.iter().all(|l| l.missing.is_empty()) {
            return writeln!(f, "every listed op is executable");
        }
        writeln!(f, "not executable:")?;
        for l in self.lists.iter().filter(|l| !l.missing.is_empty()) {
            let head = format!("  {} ({}): ", l.title(), l.missing.len());
            crate::report::write_wrapped(f, &head, &l.missing)?;
            if !l.no_call.is_empty() {
                let head = format!("    of which no call is known ({}): ", l.no_call.len());
                crate::report::write_wrapped(f, &head, &l.no_call)?;
            }
        }
        Ok(())
    }
}
