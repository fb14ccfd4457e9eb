//! The policy suite: each case is one op on one device's documented lists.

use amp::policy::Profile;

use super::Outcome;
use crate::vectors::PolicyCase;

/// Checks `case` against the policy `profile`'s lists give the op's very name
/// ([`Profile::listed_policy`]: aliases meant for dispatch are not followed).
pub fn run(profile: &Profile, case: &PolicyCase) -> Outcome {
    let got = profile.listed_policy(case.device, &case.op);
    if got == case.policy {
        Outcome::Passed
    } else {
        Outcome::Failed(format!(
            "policy of `{}` on {}: got {got}, expected {}",
            case.op, case.device, case.policy
        ))
    }
}
