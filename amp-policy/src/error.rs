//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong in this crate: parsing a name (device type, cast policy,
/// profile) or loading a policy data file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A device type name other than `cpu` or `cuda`.
    #[error("unknown device type `{0}` (expected `cpu` or `cuda`)")]
    UnknownDevice(String),

    /// A cast policy name other than the six of [`CastPolicy`](crate::CastPolicy).
    #[error(
        "unknown cast policy `{0}` (expected one of lower_precision_fp, fp32, fp32_set_opt_dtype, promote, banned, none)"
    )]
    UnknownPolicy(String),

    /// A profile name that is not built in.
    #[error("unknown policy profile `{name}` (known profiles: {known})")]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },

    /// A policy data file (device table or profile) that does not parse or is inconsistent.
    #[error("bad policy data file `{file}`: {reason}")]
    BadData {
        /// Which file (its path inside the crate, or the label the caller gave it).
        file: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl PolicyError {
    pub(crate) fn bad_data(file: &str, reason: impl Into<String>) -> Self {
        PolicyError::BadData {
            file: file.to_owned(),
            reason: reason.into(),
        }
    }
}
