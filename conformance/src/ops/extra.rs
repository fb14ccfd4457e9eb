//! Op-table entries: Recurrent cells, the remaining losses, distances, norms and promote-list ops.

use super::BuiltinTensor;
use crate::optable::OpTable;

/// Adds this area's entries to the table.
pub(super) fn register(_t: &mut OpTable<BuiltinTensor>) {}
