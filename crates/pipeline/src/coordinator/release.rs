//! Handing units back to the control plane (`release`), the decisions: one task per unit at
//! most, a newer epoch queued behind the one in flight, failed releases retried after a
//! backoff while the leader still asks for them; pure functions over [`ReleaseState`]. The
//! flow actor runs them (`flow`: the tasks, which report with `FlowMsg::Released`).

use replicator_model::{Assignment, Epoch};

/// Where the hand-back of a unit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReleaseState {
    /// A release task runs for `epoch`; `queued` is a newer epoch to release after it.
    InFlight {
        /// The epoch being released.
        epoch: Epoch,
        /// A newer epoch to release once this one is done.
        queued: Option<Epoch>,
    },
    /// `epoch` was released (the assignments may still show it until they catch up).
    Released {
        /// The epoch released.
        epoch: Epoch,
    },
    /// Releasing `epoch` failed; a timer retries it unless the node drains.
    Failed {
        /// The epoch whose release failed.
        epoch: Epoch,
    },
}

impl ReleaseState {
    /// Whether `epoch` is being or has been handed back (no pair may start under it).
    pub(super) fn covers(self, epoch: Epoch) -> bool {
        match self {
            Self::InFlight { epoch: e, queued } => e == epoch || queued == Some(epoch),
            Self::Released { epoch: e } => e == epoch,
            Self::Failed { .. } => false,
        }
    }
}

/// What to do when a unit is to be handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReleasePlan {
    /// Start a release task for this epoch.
    Spawn(Epoch),
    /// Release this epoch once the release in flight is done (one task per unit at most).
    Queue(Epoch),
    /// Nothing to do: this epoch (or a newer one) is released, being released, or failed and
    /// waits for its retry timer.
    Skip,
}

/// Decides how to hand `unit` back under `epoch`, given where its hand-back stands.
pub(super) fn plan_release(current: Option<ReleaseState>, epoch: Epoch) -> ReleasePlan {
    match current {
        None => ReleasePlan::Spawn(epoch),
        Some(ReleaseState::InFlight {
            epoch: running,
            queued,
        }) => {
            if epoch <= running || queued.is_some_and(|q| q >= epoch) {
                ReleasePlan::Skip
            } else {
                ReleasePlan::Queue(epoch)
            }
        }
        Some(ReleaseState::Released { epoch: done } | ReleaseState::Failed { epoch: done })
            if epoch <= done =>
        {
            ReleasePlan::Skip
        }
        Some(ReleaseState::Released { .. } | ReleaseState::Failed { .. }) => {
            ReleasePlan::Spawn(epoch)
        }
    }
}

/// What follows a finished release task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReleaseFollowUp {
    /// Nothing.
    Nothing,
    /// Start the release of the queued epoch.
    Spawn(Epoch),
    /// Arm the retry timer of the failed release.
    RetryLater,
}

/// The new hand-back state after the release of `epoch` finished (`ok`: it succeeded), and
/// what to do next. A drain attempts each release once, so a failure while draining is not
/// retried; a report that matches no release in flight (a forgotten one) changes nothing.
pub(super) fn release_finished(
    current: Option<ReleaseState>,
    epoch: Epoch,
    ok: bool,
    draining: bool,
) -> (Option<ReleaseState>, ReleaseFollowUp) {
    match current {
        Some(ReleaseState::InFlight {
            epoch: running,
            queued,
        }) if running == epoch => match queued {
            Some(next) => (
                Some(ReleaseState::InFlight {
                    epoch: next,
                    queued: None,
                }),
                ReleaseFollowUp::Spawn(next),
            ),
            None if ok => (
                Some(ReleaseState::Released { epoch }),
                ReleaseFollowUp::Nothing,
            ),
            None if draining => (
                Some(ReleaseState::Failed { epoch }),
                ReleaseFollowUp::Nothing,
            ),
            None => (
                Some(ReleaseState::Failed { epoch }),
                ReleaseFollowUp::RetryLater,
            ),
        },
        other => (other, ReleaseFollowUp::Nothing),
    }
}

/// What a release retry timer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RetryPlan {
    /// Release again.
    Spawn,
    /// The leader no longer asks for it: forget the failure.
    Forget,
    /// A stale timer, or the node drains (the drain made its own attempt).
    Nothing,
}

/// Decides what the retry timer of the failed release of `epoch` does.
pub(super) fn retry_release(
    current: Option<ReleaseState>,
    epoch: Epoch,
    desired: Option<&Assignment>,
    draining: bool,
) -> RetryPlan {
    if current != Some(ReleaseState::Failed { epoch }) || draining {
        return RetryPlan::Nothing;
    }
    if desired.is_some_and(|a| a.epoch == epoch && a.release_requested) {
        RetryPlan::Spawn
    } else {
        RetryPlan::Forget
    }
}

/// Whether to keep a finished hand-back record when the assignments change: a release in
/// flight always, a finished one while the assignments still show its epoch (so that a stale
/// view does not release it again).
pub(super) fn keep_release(state: ReleaseState, desired: Option<&Assignment>) -> bool {
    match state {
        ReleaseState::InFlight { .. } => true,
        ReleaseState::Released { epoch } | ReleaseState::Failed { epoch } => {
            desired.is_some_and(|a| a.epoch == epoch)
        }
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use crate::coordinator::tests::assignment as a;

    fn in_flight(epoch: u64, queued: Option<u64>) -> Option<ReleaseState> {
        Some(ReleaseState::InFlight {
            epoch: Epoch(epoch),
            queued: queued.map(Epoch),
        })
    }

    fn released(epoch: u64) -> Option<ReleaseState> {
        Some(ReleaseState::Released {
            epoch: Epoch(epoch),
        })
    }

    fn failed(epoch: u64) -> Option<ReleaseState> {
        Some(ReleaseState::Failed {
            epoch: Epoch(epoch),
        })
    }

    #[test]
    fn first_release_of_a_unit_spawns_a_task() {
        check!(plan_release(None, Epoch(3)) == ReleasePlan::Spawn(Epoch(3)));
    }

    #[test]
    fn at_most_one_release_per_unit_is_in_flight() {
        // The same (or an older) epoch again: already on its way.
        check!(plan_release(in_flight(3, None), Epoch(3)) == ReleasePlan::Skip);
        check!(plan_release(in_flight(3, None), Epoch(2)) == ReleasePlan::Skip);
        // A newer epoch waits for the one in flight; a second request for it changes nothing.
        check!(plan_release(in_flight(3, None), Epoch(5)) == ReleasePlan::Queue(Epoch(5)));
        check!(plan_release(in_flight(3, Some(5)), Epoch(5)) == ReleasePlan::Skip);
        check!(plan_release(in_flight(3, Some(5)), Epoch(4)) == ReleasePlan::Skip);
        check!(plan_release(in_flight(3, Some(5)), Epoch(6)) == ReleasePlan::Queue(Epoch(6)));
    }

    #[test]
    fn a_finished_release_is_not_repeated_for_a_stale_view() {
        check!(plan_release(released(3), Epoch(3)) == ReleasePlan::Skip);
        // A failed one waits for its retry timer rather than looping on every reconcile.
        check!(plan_release(failed(3), Epoch(3)) == ReleasePlan::Skip);
        check!(plan_release(released(3), Epoch(4)) == ReleasePlan::Spawn(Epoch(4)));
        check!(plan_release(failed(3), Epoch(4)) == ReleasePlan::Spawn(Epoch(4)));
    }

    #[test]
    fn finished_release_starts_the_queued_one_or_records_the_outcome() {
        check!(
            release_finished(in_flight(3, Some(5)), Epoch(3), true, false)
                == (in_flight(5, None), ReleaseFollowUp::Spawn(Epoch(5)))
        );
        check!(
            release_finished(in_flight(3, None), Epoch(3), true, false)
                == (released(3), ReleaseFollowUp::Nothing)
        );
        check!(
            release_finished(in_flight(3, None), Epoch(3), false, false)
                == (failed(3), ReleaseFollowUp::RetryLater)
        );
    }

    #[test]
    fn failed_release_during_a_drain_is_not_retried() {
        check!(
            release_finished(in_flight(3, None), Epoch(3), false, true)
                == (failed(3), ReleaseFollowUp::Nothing)
        );
    }

    #[test]
    fn report_of_a_forgotten_release_changes_nothing() {
        check!(release_finished(None, Epoch(3), true, false) == (None, ReleaseFollowUp::Nothing));
        check!(
            release_finished(in_flight(5, None), Epoch(3), false, false)
                == (in_flight(5, None), ReleaseFollowUp::Nothing)
        );
    }

    #[test]
    fn retry_releases_again_only_while_the_leader_still_asks() {
        let failed = failed(3);
        check!(retry_release(failed, Epoch(3), Some(&a(3, true)), false) == RetryPlan::Spawn);
        check!(retry_release(failed, Epoch(3), Some(&a(3, false)), false) == RetryPlan::Forget);
        check!(retry_release(failed, Epoch(3), Some(&a(4, true)), false) == RetryPlan::Forget);
        check!(retry_release(failed, Epoch(3), None, false) == RetryPlan::Forget);
        // Draining: the drain made its own attempt. Stale timers do nothing.
        check!(retry_release(failed, Epoch(3), Some(&a(3, true)), true) == RetryPlan::Nothing);
        check!(
            retry_release(in_flight(3, None), Epoch(3), Some(&a(3, true)), false)
                == RetryPlan::Nothing
        );
        check!(retry_release(failed, Epoch(2), Some(&a(2, true)), false) == RetryPlan::Nothing);
    }

    #[test]
    fn release_records_are_kept_while_the_assignments_show_their_epoch() {
        let released = ReleaseState::Released { epoch: Epoch(3) };
        check!(keep_release(released, Some(&a(3, true))));
        check!(!keep_release(released, None));
        check!(!keep_release(released, Some(&a(4, false))));
        let running = ReleaseState::InFlight {
            epoch: Epoch(3),
            queued: None,
        };
        check!(keep_release(running, None));
    }

    #[test]
    fn no_pair_starts_under_an_epoch_being_handed_back() {
        let queued = in_flight(3, Some(5)).expect("in flight");
        check!(queued.covers(Epoch(3)));
        check!(queued.covers(Epoch(5)));
        check!(!queued.covers(Epoch(4)));
        let released = ReleaseState::Released { epoch: Epoch(3) };
        let failed = ReleaseState::Failed { epoch: Epoch(3) };
        check!(released.covers(Epoch(3)));
        check!(!failed.covers(Epoch(3)));
    }
}
