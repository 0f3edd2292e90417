//! When a starting pipeline may take up a unit this node already owns, or hand it back: not
//! while the last sends of an earlier writer of this node (a killed process, or the previous
//! pipeline of a config reload) can still land on the target.
//!
//! A restart keeps the node's units: the lease is the node's, not the process's. Without a
//! wait, the new process resumes from the downstream tail (or hands the unit to a new owner,
//! who does) while a send of its predecessor is still on its way, and that send lands behind
//! the resume: a duplicate, or a copy out of order. Found by the simulator (issue 51: 33
//! seeds a kill -9 or a rolling restart with a slow target, one a rebalance on a fenced
//! target).
//!
//! - With the configured credential nothing refuses the late sends. They are bounded in time
//!   instead: every send is checked to have `send_lease_margin` of lease left and must land
//!   within it (the same bound that keeps a failed owner's sends before the next owner's). The
//!   earlier writers ended before this pipeline was built, so their sends have landed by its
//!   start plus the margin.
//! - On a fenced target the bound is the fence: an identity an earlier process may have
//!   written with is never this process's (control plane, `Inheritance`), and once it is
//!   given up the units it held move only after the target revoked it. Until this process
//!   has an identity of its own (`WriterTargets::current`), the earlier one may still be the
//!   node's: a unit handed back then would reach its next owner by `Release`, around the
//!   fence. Such a unit is kept, and moves through the fence or once the identity arrives.

use std::time::Instant;

/// Whether a unit of a target may be taken up or handed back now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handover {
    /// Nothing an earlier writer of this node sent can land any more.
    Now,
    /// The configured credential's sends of an earlier writer can land until then.
    After(Instant),
    /// A fenced target, and this process has no identity of its own yet.
    WithoutIdentity,
}

impl Handover {
    /// Decides at `now` for a target whose earlier sends have landed by `landed_by`; `identity`
    /// is `None` for a target written with the configured credential, and for a fenced one
    /// whether this process has a usable identity of its own.
    pub(crate) fn at(now: Instant, landed_by: Instant, identity: Option<bool>) -> Self {
        if now < landed_by {
            // Also on a fenced target: a member that wrote there with the configured
            // credential before a rolling restart turned fencing on.
            Self::After(landed_by)
        } else if identity == Some(false) {
            Self::WithoutIdentity
        } else {
            Self::Now
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use assert2::check;

    use super::*;

    #[test]
    fn nothing_is_taken_over_before_earlier_sends_have_landed() {
        let start = Instant::now();
        let landed_by = start + Duration::from_millis(500);
        check!(Handover::at(start, landed_by, None) == Handover::After(landed_by));
        // A fenced target waits as well (its earlier writes may have used the credential).
        check!(Handover::at(start, landed_by, Some(true)) == Handover::After(landed_by));
        check!(Handover::at(landed_by, landed_by, None) == Handover::Now);
    }

    #[test]
    fn a_fenced_target_waits_for_an_identity_of_this_process() {
        let start = Instant::now();
        check!(Handover::at(start, start, Some(false)) == Handover::WithoutIdentity);
        check!(Handover::at(start, start, Some(true)) == Handover::Now);
    }
}
