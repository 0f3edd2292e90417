//! What every actor and task of the tree shares, below all of them: how a child ended
//! ([`ChildEnd`], [`LoopPanicked`]), the handle that aborts a task with its owner
//! ([`AbortOnDrop`]), the [`Alive`] token every task holds, and the spans of a unit's tasks.

use ractor::{ActorId, SupervisionEvent};
use replicator_model::{Epoch, NodeId, WorkUnit};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

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
