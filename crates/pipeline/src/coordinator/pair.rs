//! A unit's reader and writer as supervised tasks. Each runs under its pair's stop token and
//! reports its end to the coordinator exactly once, with its outcome, as
//! [`CoordinatorMsg::UnitTaskEnded`]: when it returns, and also when it panics (the report then
//! goes out as the task's future is dropped).

use std::future::Future;

use ractor::ActorRef;
use replicator_model::WorkUnit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::decide::Ended;
use super::{AbortOnDrop, Alive, CoordinatorMsg};
use crate::error::{Error, Result};

/// Which task of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Reader,
    Writer,
}

/// How a unit task ended.
#[derive(Debug)]
pub(crate) enum TaskEnd {
    /// It returned; the reason (asked to stop, writer gone, drained, fenced, …).
    Stopped(&'static str),
    /// It gave up on an error that is not transient or outlasted the retry budget.
    Failed(Error),
    /// It ended without returning: it panicked. (An aborted task reports this too, but the
    /// coordinator aborts unit tasks only when it stops itself, and then reads no report.)
    Panicked,
}

/// A running reader/writer pair, until both of its tasks reported their end.
pub(super) struct Pair {
    /// Tells reports of this pair from those of an earlier pair of the same unit.
    pub(super) id: u64,
    /// Cancelled to stop the pair (a child of the coordinator's token).
    pub(super) stop: CancellationToken,
    /// The reader task, until it reported its end.
    pub(super) reader: Option<AbortOnDrop<()>>,
    /// The writer task, until it reported its end.
    pub(super) writer: Option<AbortOnDrop<()>>,
    /// Whether a task failed or panicked (as opposed to stopping), for the restart log.
    pub(super) failed: bool,
    /// How the pair will have ended once both tasks are gone: by itself, unless the
    /// coordinator asked it to stop (and whether to release the unit afterwards).
    pub(super) ending: Ended,
}

/// Where one unit task reports its end.
pub(super) struct Report {
    pub(super) coordinator: ActorRef<CoordinatorMsg>,
    pub(super) unit: WorkUnit,
    pub(super) pair: u64,
    pub(super) role: Role,
}

/// Sends the report on drop unless the task returned and sent it itself.
struct ReportGuard(Option<Report>);

impl ReportGuard {
    fn send(&mut self, end: TaskEnd) {
        if let Some(report) = self.0.take() {
            // Nobody to tell once the coordinator is gone (crash, or a drain that timed out).
            let _ = report
                .coordinator
                .send_message(CoordinatorMsg::UnitTaskEnded {
                    unit: report.unit,
                    pair: report.pair,
                    role: report.role,
                    end,
                });
        }
    }
}

impl Drop for ReportGuard {
    fn drop(&mut self) {
        self.send(TaskEnd::Panicked);
    }
}

/// Spawns one task of a pair in `span`. `alive` is held until the task is gone, so that
/// `Pipeline::shutdown` and `Pipeline::crash` return only once it no longer runs.
pub(super) fn spawn<F>(
    report: Report,
    alive: Alive,
    span: tracing::Span,
    task: F,
) -> AbortOnDrop<()>
where
    F: Future<Output = Result<&'static str>> + Send + 'static,
{
    let mut guard = ReportGuard(Some(report));
    AbortOnDrop(tokio::spawn(
        async move {
            let _alive = alive;
            let end = match task.await {
                Ok(reason) => TaskEnd::Stopped(reason),
                Err(err) => TaskEnd::Failed(err),
            };
            guard.send(end);
        }
        .instrument(span),
    ))
}
