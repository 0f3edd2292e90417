//! What a flow actor does with one unit: the pure decisions behind `reconcile` (start,
//! stop, cancel a restart, release) and behind the end of a pair (forget, release, restart).

use std::time::Duration;

use replicator_model::{Assignment, Epoch};

/// A pair that ran at least this long before ending restarts from the initial backoff.
pub(super) const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);

/// The phase without its handles, for decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PhaseKind {
    /// Pair running.
    Running,
    /// Pair stopping.
    Stopping,
    /// Waiting for a restart.
    Waiting,
}

/// What to do with one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Leave it as it is.
    Nothing,
    /// Start a pair under this epoch.
    Start(Epoch),
    /// Stop the running pair cleanly; release the unit afterwards if asked.
    Stop {
        /// Release after the final commit.
        release: bool,
    },
    /// Cancel a pending restart; release the unit if asked.
    Cancel {
        /// Release now.
        release: bool,
    },
    /// Nothing runs but the unit is assigned and must be handed back.
    Release(Epoch),
}

/// Decides what to do with a unit given what runs (`run`) and what is assigned (`desired`).
pub(super) fn decide(
    run: Option<(Epoch, PhaseKind)>,
    desired: Option<&Assignment>,
    draining: bool,
) -> Action {
    let Some((epoch, phase)) = run else {
        return match desired {
            None => Action::Nothing,
            Some(a) if draining || a.release_requested => Action::Release(a.epoch),
            Some(a) => Action::Start(a.epoch),
        };
    };
    let same = desired.is_some_and(|a| a.epoch == epoch);
    let release = draining || desired.is_some_and(|a| a.release_requested);
    match phase {
        PhaseKind::Stopping => Action::Nothing,
        PhaseKind::Running if !same => Action::Stop { release: false },
        PhaseKind::Running if release => Action::Stop { release: true },
        PhaseKind::Waiting if !same => Action::Cancel { release: false },
        PhaseKind::Waiting if release => Action::Cancel { release: true },
        PhaseKind::Running | PhaseKind::Waiting => Action::Nothing,
    }
}

/// How a unit's pair ended, once both of its tasks are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The pair stopped by itself (a task failed, or stopped on a fence or a stale epoch).
    ByItself,
    /// The flow actor stopped it; `release` hands the unit back afterwards.
    Stopped {
        /// Release after the final commit.
        release: bool,
    },
}

/// What follows the end of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterPair {
    /// Forget the run; `reconcile` decides what comes next from the assignments.
    Remove,
    /// Forget the run and hand the unit back under this epoch (the final commit is done).
    Release(Epoch),
    /// The unit is still ours: restart the pair after a backoff, reset first when the pair
    /// had run for at least [`BACKOFF_RESET_AFTER`].
    Restart {
        /// Start the backoff again from its initial delay.
        reset_backoff: bool,
    },
}

/// Decides what follows the end of the pair of a unit that ran under `epoch` for `ran_for`.
pub(super) fn after_pair_gone(
    ended: Ended,
    epoch: Epoch,
    desired: Option<&Assignment>,
    draining: bool,
    ran_for: Duration,
) -> AfterPair {
    match ended {
        Ended::Stopped { release: true } => AfterPair::Release(epoch),
        Ended::Stopped { release: false } => AfterPair::Remove,
        // Ownership moved on (or the node drains): nothing to restart.
        Ended::ByItself
            if draining || desired.is_none_or(|a| a.epoch != epoch || a.release_requested) =>
        {
            AfterPair::Remove
        }
        Ended::ByItself => AfterPair::Restart {
            reset_backoff: ran_for >= BACKOFF_RESET_AFTER,
        },
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use crate::coordinator::tests::assignment as a;

    #[test]
    fn unassigned_and_idle_does_nothing() {
        check!(decide(None, None, false) == Action::Nothing);
    }

    #[test]
    fn new_assignment_starts_a_pair() {
        check!(decide(None, Some(&a(3, false)), false) == Action::Start(Epoch(3)));
    }

    #[test]
    fn release_request_or_drain_without_pair_releases_at_once() {
        check!(decide(None, Some(&a(3, true)), false) == Action::Release(Epoch(3)));
        check!(decide(None, Some(&a(3, false)), true) == Action::Release(Epoch(3)));
    }

    #[test]
    fn running_pair_stops_without_release_when_revoked_or_regranted() {
        let running = Some((Epoch(3), PhaseKind::Running));
        check!(decide(running, None, false) == Action::Stop { release: false });
        check!(decide(running, Some(&a(4, false)), false) == Action::Stop { release: false });
        check!(decide(running, Some(&a(3, false)), false) == Action::Nothing);
    }

    #[test]
    fn running_pair_drains_and_releases_on_request_or_shutdown() {
        let running = Some((Epoch(3), PhaseKind::Running));
        check!(decide(running, Some(&a(3, true)), false) == Action::Stop { release: true });
        check!(decide(running, Some(&a(3, false)), true) == Action::Stop { release: true });
    }

    #[test]
    fn waiting_restart_is_cancelled_when_assignment_changes() {
        let waiting = Some((Epoch(3), PhaseKind::Waiting));
        check!(decide(waiting, Some(&a(3, false)), false) == Action::Nothing);
        check!(decide(waiting, None, false) == Action::Cancel { release: false });
        check!(decide(waiting, Some(&a(3, true)), false) == Action::Cancel { release: true });
    }

    #[test]
    fn stopping_pair_is_left_alone() {
        let stopping = Some((Epoch(3), PhaseKind::Stopping));
        check!(decide(stopping, Some(&a(9, false)), true) == Action::Nothing);
    }

    const SHORT: Duration = Duration::from_secs(1);

    #[test]
    fn pair_stopped_for_release_is_released_under_its_own_epoch() {
        let stopped = Ended::Stopped { release: true };
        // Also when the assignments already moved on: the final commit was made under it.
        check!(
            after_pair_gone(stopped, Epoch(3), Some(&a(3, true)), false, SHORT)
                == AfterPair::Release(Epoch(3))
        );
        check!(
            after_pair_gone(stopped, Epoch(3), None, true, SHORT) == AfterPair::Release(Epoch(3))
        );
    }

    #[test]
    fn pair_stopped_without_release_is_removed() {
        let stopped = Ended::Stopped { release: false };
        check!(
            after_pair_gone(stopped, Epoch(3), Some(&a(3, false)), false, SHORT)
                == AfterPair::Remove
        );
        check!(after_pair_gone(stopped, Epoch(3), None, false, SHORT) == AfterPair::Remove);
    }

    #[test]
    fn pair_that_ended_by_itself_restarts_while_still_owned() {
        let after_running_for = |ran_for| {
            after_pair_gone(
                Ended::ByItself,
                Epoch(3),
                Some(&a(3, false)),
                false,
                ran_for,
            )
        };
        let restart = |reset_backoff| AfterPair::Restart { reset_backoff };
        check!(after_running_for(SHORT) == restart(false));
        // Exactly the reset threshold resets (`>=` → `>` would keep growing the backoff).
        check!(after_running_for(BACKOFF_RESET_AFTER) == restart(true));
        check!(after_running_for(BACKOFF_RESET_AFTER - SHORT) == restart(false));
    }

    #[test]
    fn pair_that_ended_by_itself_is_removed_once_ownership_moved_on() {
        let ended = Ended::ByItself;
        // Revoked, re-granted under another epoch, release requested, or the node drains.
        check!(after_pair_gone(ended, Epoch(3), None, false, SHORT) == AfterPair::Remove);
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(4, false)), false, SHORT) == AfterPair::Remove
        );
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(3, true)), false, SHORT) == AfterPair::Remove
        );
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(3, false)), true, SHORT) == AfterPair::Remove
        );
    }
}
