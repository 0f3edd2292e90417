//! What every actor and task of the tree shares, below all of them: how a child ended
//! ([`ChildEnd`], [`LoopPanicked`]), how a parent restarts it ([`ChildRestarts`]), the handle
//! that aborts a task with its owner ([`AbortOnDrop`]), the [`Alive`] token every task holds,
//! and the spans of a unit's tasks.

use std::time::{Duration, Instant};

use ractor::{ActorId, SupervisionEvent};
use replicator_model::{Epoch, NodeId, WorkUnit};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::decide::BACKOFF_RESET_AFTER;
use crate::backoff::{Backoff, RestartBudget};
use crate::params::BackoffParams;

/// Held by every task the tree starts (reader and writer loops, release tasks). Nothing is
/// ever sent on it: `Pipeline` waits until the last clone is dropped, so that `shutdown` and
/// `crash` return only once none of those tasks runs any more.
pub(crate) type Alive = mpsc::Sender<()>;

/// The error a loop actor fails with when its loop panicked.
#[derive(Debug, thiserror::Error)]
#[error("the loop panicked")]
pub(super) struct LoopPanicked;

/// How a child of the tree ended, as its parent learns it from ractor.
#[derive(Debug)]
pub(crate) enum ChildEnd {
    /// It stopped, with its reason (a unit loop that returned: asked to stop, writer gone,
    /// drained, fenced, …).
    Stopped(String),
    /// It failed with an error (a unit loop that gave up on an error that is not transient or
    /// outlasted the retry budget).
    Failed(String),
    /// Its loop panicked, or it was killed before its loop returned.
    Panicked,
}

impl ChildEnd {
    /// The child and how it ended, if `event` is the end of a child.
    pub(super) fn of(event: SupervisionEvent) -> Option<(ActorId, Self)> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => Some((
                cell.get_id(),
                Self::Stopped(reason.unwrap_or_else(|| "stopped".to_owned())),
            )),
            SupervisionEvent::ActorFailed(cell, err) => {
                let end = if err.downcast_ref::<LoopPanicked>().is_some() {
                    Self::Panicked
                } else {
                    Self::Failed(err.to_string())
                };
                Some((cell.get_id(), end))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stopped(reason) => write!(f, "stopped ({reason})"),
            Self::Failed(err) => write!(f, "failed: {err}"),
            Self::Panicked => f.write_str("panicked"),
        }
    }
}

/// How a parent restarts one child (the coordinator under the root, a flow actor, a
/// long-running task): after a backoff, which starts again from its initial delay once the child
/// had run for [`BACKOFF_RESET_AFTER`], and at most [`MAX_RESTARTS`](crate::backoff::MAX_RESTARTS)
/// times within [`RESTART_WINDOW`](crate::backoff::RESTART_WINDOW): beyond that the parent
/// escalates.
#[derive(Debug)]
pub(super) struct ChildRestarts {
    backoff: Backoff,
    budget: RestartBudget,
    /// When the child last started.
    started: Instant,
}

impl ChildRestarts {
    /// A child starting now.
    pub(super) fn new(params: BackoffParams, seed: u64) -> Self {
        Self {
            backoff: Backoff::new(params, seed),
            budget: RestartBudget::default(),
            started: Instant::now(),
        }
    }

    /// The child (re)started at `now`.
    pub(super) fn started(&mut self, now: Instant) {
        self.started = now;
    }

    /// The child ended at `now`: how long to wait before starting it again, or `None` when it
    /// died too often lately (the parent escalates).
    pub(super) fn after_end(&mut self, now: Instant) -> Option<Duration> {
        if !self.budget.admit(now) {
            return None;
        }
        if now.saturating_duration_since(self.started) >= BACKOFF_RESET_AFTER {
            self.backoff.reset();
        }
        Some(self.backoff.next_delay())
    }
}

/// A task handle that aborts its task when dropped (also when an actor of the tree is killed
/// and its state dropped without `post_stop`).
pub(super) struct AbortOnDrop<T>(pub(super) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a span of [`unit_span`] covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UnitTaskKind {
    /// The unit's reader and writer (span `unit`).
    Pair,
    /// Handing the unit back (span `release`).
    Release,
}

/// The root span of a task of `unit` under `epoch` on `node`, with the fields every
/// long-running task carries (node, flow, stream, topic, partition, epoch).
pub(super) fn unit_span(
    task: UnitTaskKind,
    node: NodeId,
    unit: &WorkUnit,
    epoch: Epoch,
) -> tracing::Span {
    // A span's name is part of its static metadata, hence one macro call per name.
    macro_rules! span {
        ($name:literal) => {
            tracing::info_span!(
                parent: None,
                $name,
                node = %node,
                flow = %unit.flow,
                stream = %unit.stream,
                topic = %unit.topic,
                partition = unit.partition,
                epoch = %epoch,
            )
        };
    }
    match task {
        UnitTaskKind::Pair => span!("unit"),
        UnitTaskKind::Release => span!("release"),
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use crate::backoff::MAX_RESTARTS;

    fn params() -> BackoffParams {
        BackoffParams {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }

    #[test]
    fn a_child_that_keeps_dying_backs_off_further_each_time_then_is_given_up() {
        let mut restarts = ChildRestarts::new(params(), 1);
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..MAX_RESTARTS as u64)
            .map(|i| {
                let at = t0 + Duration::from_secs(i);
                let delay = restarts.after_end(at).expect("within the budget");
                restarts.started(at + delay);
                delay
            })
            .collect();
        // Jitter spreads each over [d/2, d] of 100, 200, 400, ... ms.
        check!(delays[0] <= Duration::from_millis(100));
        check!(delays[MAX_RESTARTS - 1] >= Duration::from_millis(800));
        check!(restarts.after_end(t0 + Duration::from_secs(10)).is_none());
    }

    #[test]
    fn a_child_that_ran_long_restarts_after_the_initial_delay_again() {
        let mut restarts = ChildRestarts::new(params(), 1);
        let t0 = Instant::now();
        for i in 0..3 {
            let _ = restarts.after_end(t0 + Duration::from_millis(i));
        }
        restarts.started(t0);
        let after_long = restarts.after_end(t0 + BACKOFF_RESET_AFTER);
        check!(after_long.is_some_and(|d| d <= Duration::from_millis(100)));
    }
}
