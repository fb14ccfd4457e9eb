//! Op-table entries: Linear algebra (the cpu fp32 list) and quantiles.

use super::BuiltinTensor;
use crate::optable::OpTable;

/// Adds this area's entries to the table.
pub(super) fn register(_t: &mut OpTable<BuiltinTensor>) {}
