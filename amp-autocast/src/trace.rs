//! A record of autocast decisions, switched on per region: "why did this run in
//! float16?".

use std::fmt;

use amp_policy::{CastPolicy, DeviceType};
use amp_tensor::DType;

/// One op seen by autocast.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    pub op: &'static str,
    pub device: DeviceType,
    pub policy: CastPolicy,
    /// Argument dtypes as called.
    pub dtypes_in: Vec<DType>,
    /// Argument dtypes after autocast.
    pub dtypes_out: Vec<DType>,
    /// `dtype=` the op was told to use (`fp32_set_opt_dtype`).
    pub set_dtype: Option<DType>,
    pub casts: usize,
    pub cache_hits: usize,
    /// Why nothing was done, if so (in place, `out=`, explicit dtype, region off).
    pub skipped: Option<&'static str>,
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[DType]| {
            v.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "{:<24} {:<5} {:<20} [{}] -> [{}]",
            self.op,
            self.device.as_str(),
            self.policy.as_str(),
            list(&self.dtypes_in),
            list(&self.dtypes_out)
        )?;
        if let Some(d) = self.set_dtype {
            write!(f, " dtype={d}")?;
        }
        write!(f, " casts={} cache_hits={}", self.casts, self.cache_hits)?;
        if let Some(why) = self.skipped {
            write!(f, " (not eligible: {why})")?;
        }
        Ok(())
    }
}

/// The events of a traced region, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Total casts made.
    pub fn casts(&self) -> usize {
        self.events.iter().map(|e| e.casts).sum()
    }
    /// Total cache hits.
    pub fn cache_hits(&self) -> usize {
        self.events.iter().map(|e| e.cache_hits).sum()
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<24} {:<5} {:<20} args in -> args out",
            "op", "dev", "policy"
        )?;
        for e in &self.events {
            writeln!(f, "{e}")?;
        }
        write!(
            f,
            "{} ops, {} casts, {} cache hits",
            self.events.len(),
            self.casts(),
            self.cache_hits()
        )
    }
}
