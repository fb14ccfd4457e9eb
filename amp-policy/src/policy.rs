//! The cast policies an op can have under autocast.

use serde::{Deserialize, Serialize};

use crate::PolicyError;

/// What autocast does with an op's floating-point arguments (PyTorch's autocast `CastPolicy`).
///
/// The names are PyTorch's (`at::autocast::CastPolicy`), plus `banned` for an op that fails
/// under autocast and `none` for an op on no list, which runs in its input types.
///
/// ```
/// use amp_policy::CastPolicy;
/// assert_eq!(CastPolicy::LowerPrecisionFp.as_str(), "lower_precision_fp");
/// assert_eq!("fp32_set_opt_dtype".parse::<CastPolicy>().unwrap(), CastPolicy::Fp32SetOptDtype);
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum CastPolicy {
    /// Cast every eligible tensor argument to the region's lower-precision dtype.
    #[serde(rename = "lower_precision_fp")]
    LowerPrecisionFp,
    /// Cast every eligible tensor argument to float32.
    #[serde(rename = "fp32")]
    Fp32,
    /// Cast nothing, but run with `dtype=float32` when the first argument is eligible and no
    /// explicit dtype was given.
    #[serde(rename = "fp32_set_opt_dtype")]
    Fp32SetOptDtype,
    /// Cast every eligible argument to the widest floating type among them.
    #[serde(rename = "promote")]
    Promote,
    /// Fail with the op's message.
    #[serde(rename = "banned")]
    Banned,
    /// Not on any list: autocast leaves the op alone and it runs in its input types.
    #[default]
    #[serde(rename = "none")]
    None,
}

impl CastPolicy {
    /// Every policy, listed policies first.
    pub const ALL: [CastPolicy; 6] = [
        CastPolicy::LowerPrecisionFp,
        CastPolicy::Fp32,
        CastPolicy::Fp32SetOptDtype,
        CastPolicy::Promote,
        CastPolicy::Banned,
        CastPolicy::None,
    ];

    /// The policy's name: `lower_precision_fp`, `fp32`, `fp32_set_opt_dtype`, `promote`,
    /// `banned` or `none`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CastPolicy::LowerPrecisionFp => "lower_precision_fp",
            CastPolicy::Fp32 => "fp32",
            CastPolicy::Fp32SetOptDtype => "fp32_set_opt_dtype",
            CastPolicy::Promote => "promote",
            CastPolicy::Banned => "banned",
            CastPolicy::None => "none",
        }
    }

    /// A short phrase saying what the policy does, used by [`Profile::explain`](crate::Profile::explain).
    pub const fn description(self) -> &'static str {
        match self {
            CastPolicy::LowerPrecisionFp => "autocast to the lower-precision dtype",
            CastPolicy::Fp32 => "autocast to float32",
            CastPolicy::Fp32SetOptDtype => {
                "inputs not cast; runs with dtype=float32 unless an explicit dtype is given"
            }
            CastPolicy::Promote => "inputs cast to the widest floating type among them",
            CastPolicy::Banned => "fails under autocast",
            CastPolicy::None => "runs in its input types",
        }
    }

    /// Whether autocast touches the op at all (every policy but [`CastPolicy::None`]).
    #[inline]
    pub const fn is_autocast(self) -> bool {
        !matches!(self, CastPolicy::None)
    }
}

named_by_as_str!(CastPolicy, PolicyError::UnknownPolicy);
