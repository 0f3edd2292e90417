//! Whether a write may go now: the one home of the lease and epoch rule that runs before every
//! send of copies, once when the batch is ready and once more after the writer got its turn on
//! the connection (`Cluster::call_checked`), right before the request goes out; the door to
//! the target (`datapath::target`) applies it, also to the node's other writes there.

use std::time::{Duration, Instant};

use replicator_model::{Assignment, Epoch, WorkUnit};

/// Why a writer may not send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendVeto {
    /// The unit is no longer assigned to this node under the writer's epoch: stop.
    EpochNotCurrent,
    /// The node's lease is missing or ends within the safety margin: hold the batch and look
    /// again shortly (the first renewal after start, or one that lapsed under load, comes back).
    LeaseExpiring,
}

/// The send decision from `lease_for_epoch`: the lease as the control plane reports it for the
/// writer's unit and epoch in one call (`ControlPlane::lease_valid_for`, which reads the lease
/// before the grant, so that a lease extended after a revoke is never paired with the revoked
/// grant); `None` when there is no valid lease or the grant is gone. Only that value lets a
/// send through, and only with more than `margin` left (a send must land before the lease
/// ends). When it vetoes, this node's assignments (`epoch_current`, read afterwards) tell a
/// unit that moved away from a lease not valid long enough.
pub(crate) fn send_verdict(
    now: Instant,
    lease_for_epoch: Option<Instant>,
    margin: Duration,
    epoch_current: impl FnOnce() -> bool,
) -> Result<(), SendVeto> {
    match lease_for_epoch {
        Some(until) if until > now + margin => Ok(()),
        _ if !epoch_current() => Err(SendVeto::EpochNotCurrent),
        _ => Err(SendVeto::LeaseExpiring),
    }
}

/// Whether `unit` is assigned under `epoch` in `assignments`.
pub(crate) fn epoch_is_current(assignments: &[Assignment], unit: &WorkUnit, epoch: Epoch) -> bool {
    assignments
        .iter()
        .any(|a| a.epoch == epoch && a.unit == *unit)
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    const MARGIN: Duration = Duration::from_millis(500);

    #[test]
    fn sends_only_on_a_lease_valid_past_the_margin() {
        let now = Instant::now();
        let long = Some(now + Duration::from_secs(1));
        check!(send_verdict(now, long, MARGIN, || true) == Ok(()));
        // The assignments are not even consulted when the one call says yes.
        check!(send_verdict(now, long, MARGIN, || false) == Ok(()));
        // Exactly the margin left is not enough (`>` → `>=` would send into the margin).
        check!(
            send_verdict(now, Some(now + MARGIN), MARGIN, || true) == Err(SendVeto::LeaseExpiring)
        );
        let short = Some(now + Duration::from_millis(400));
        check!(send_verdict(now, short, MARGIN, || true) == Err(SendVeto::LeaseExpiring));
    }

    #[test]
    fn a_moved_unit_is_told_from_a_lease_too_short() {
        let now = Instant::now();
        check!(send_verdict(now, None, MARGIN, || true) == Err(SendVeto::LeaseExpiring));
        check!(send_verdict(now, None, MARGIN, || false) == Err(SendVeto::EpochNotCurrent));
        let short = Some(now + Duration::from_millis(100));
        check!(send_verdict(now, short, MARGIN, || false) == Err(SendVeto::EpochNotCurrent));
    }

    #[test]
    fn lease_in_the_past_vetoes() {
        let now = Instant::now();
        let past = now.checked_sub(Duration::from_secs(1));
        check!(send_verdict(now, past, MARGIN, || true) == Err(SendVeto::LeaseExpiring));
    }

    #[test]
    fn epoch_is_current_matches_unit_and_epoch() {
        let u = WorkUnit::new("f", "s", "t", 1);
        let a = vec![Assignment {
            unit: u.clone(),
            epoch: Epoch(4),
            release_requested: true,
        }];
        check!(epoch_is_current(&a, &u, Epoch(4)));
        check!(!epoch_is_current(&a, &u, Epoch(3)));
        check!(!epoch_is_current(
            &a,
            &WorkUnit::new("f", "s", "t", 2),
            Epoch(4)
        ));
    }
}
