//! Op-table entries: Convolutions, pooling, padding and grid sampling.

use super::BuiltinTensor;
use crate::optable::OpTable;

/// Adds this area's entries to the table.
pub(super) fn register(_t: &mut OpTable<BuiltinTensor>) {}
