//! The autocast op policy registry: which op runs in which precision, per device type.
//!
//! Autocast (see the `amp-autocast` crate) asks this crate, for every op it dispatches, what
//! to do with the op's floating-point arguments: cast them to the lower-precision dtype, to
//! float32, promote them to the widest type, fail, or leave them alone. The answer is
//! **data**: the lists of the torch.amp documentation live in JSON files inside the crate
//! (`data/docs/cpu.json`, `data/docs/cuda.json`), one table per device type, and a profile
//! such as `torch-2.15` is a data file of changes over them (`data/profiles/`). Adding an op
//! to a list is a data change. This crate knows nothing of tensors or threads.
//!
//! - [`Profile`]: an immutable, cheaply clonable set of tables. [`Profile::docs`] (the
//!   default), [`Profile::torch_2_15`], [`Profile::by_name`]; user overrides with
//!   [`Profile::with_override`] and [`Profile::with_ban`], each returning a new profile.
//! - [`OpId`] / [`OpName`]: interned op names, so the per-op lookup
//!   [`Profile::policy`] is an array index. A dispatch point keeps its op's name in a
//!   `static OpName` and pays one atomic load for the id.
//! - [`Profile::explain`]: the decision and its source, in a sentence.
//! - [`Profile::ops`], [`Profile::entries`], [`Profile::iter`], [`Profile::diff`]: listings
//!   for coverage reports.
//!
//! # Example
//!
//! ```
//! use amp_policy::{CastPolicy, DeviceType, OpName, Profile};
//!
//! // At a dispatch point: intern once, then every lookup is an array index.
//! static MM: OpName = OpName::new("mm");
//! let docs = Profile::docs();
//! assert_eq!(docs.policy(DeviceType::Cuda, MM.id()), CastPolicy::LowerPrecisionFp);
//! assert_eq!(docs.policy_by_name(DeviceType::Cpu, "conv_transpose2d"), CastPolicy::Fp32);
//! assert_eq!(docs.policy_by_name(DeviceType::Cpu, "add"), CastPolicy::None);
//!
//! // binary_cross_entropy is banned on CUDA only.
//! assert_eq!(docs.policy_by_name(DeviceType::Cuda, "binary_cross_entropy"), CastPolicy::Banned);
//! assert_eq!(docs.policy_by_name(DeviceType::Cpu, "binary_cross_entropy"), CastPolicy::Fp32);
//!
//! // PyTorch 2.15 runs conv_transpose in bfloat16 on CPU.
//! let torch = Profile::by_name("torch-2.15").unwrap();
//! assert_eq!(
//!     torch.policy_by_name(DeviceType::Cpu, "conv_transpose2d"),
//!     CastPolicy::LowerPrecisionFp
//! );
//!
//! // A user override: a new profile value; the original is unchanged.
//! let mine = docs
//!     .with_override(DeviceType::Cuda, "my_attention", CastPolicy::LowerPrecisionFp)
//!     .with_ban(DeviceType::Cpu, "my_unstable_op", "my_unstable_op needs float64");
//! assert_eq!(mine.policy_by_name(DeviceType::Cuda, "my_attention"), CastPolicy::LowerPrecisionFp);
//! assert_eq!(docs.policy_by_name(DeviceType::Cuda, "my_attention"), CastPolicy::None);
//! assert!(mine.explain(DeviceType::Cpu, "my_unstable_op").contains("user override"));
//! ```

#![deny(missing_docs)]

/// `Display` and `FromStr` for an enum named by its `as_str`, over its `ALL` list: the
/// name prints padded as a string does (`{:>8}` works), and any other string is the
/// error `$unknown(string)`.
macro_rules! named_by_as_str {
    ($t:ty, $unknown:path) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl std::str::FromStr for $t {
            type Err = PolicyError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $unknown(s.to_owned()))
            }
        }
    };
}

mod data;
mod device;
mod diff;
mod entry;
mod error;
mod explain;
mod intern;
mod policy;
mod profile;
mod table;

pub use device::DeviceType;
pub use diff::PolicyChange;
pub use entry::{Alias, Entry, Source};
pub use error::PolicyError;
pub use intern::{OpId, OpName};
pub use policy::CastPolicy;
pub use profile::Profile;
