//! `GET /health` (liveness) and `GET /ready` (readiness), and the readiness verdict the
//! `ready` metric shares with `/ready`.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use replicator_control::{Control, ControlMetrics};
use replicator_model::NodeId;
use tracing::warn;

use super::parts::{NodeParts, Stage};
use super::state::AdminState;

/// `GET /health` (liveness): 200 whenever the process can answer and the pipeline's
/// coordinator handles its mailbox, whatever the node waits for; 503 once a heartbeat to the
/// coordinator has waited [`WEDGED_AFTER`]. The handler itself touches no actor and no lock
/// held across an await. The body says where the node stands: `ok`, or `starting: control
/// plane`, `starting: pipeline`, `stopping`, each with how long it has lasted, then one line per
/// long-running task that ended unexpectedly since the pipeline started (its supervisor
/// restarted it; one that keeps dying stops the pipeline, and the process exits). A node that
/// waits for its peers is alive: restarting it would not make them come.
pub(super) async fn health(State(state): State<AdminState>) -> Response {
    let wedged = state
        .parts
        .pipeline()
        .and_then(|p| p.liveness.wedged_for(Instant::now(), WEDGED_AFTER));
    match wedged {
        Some(waited) => {
            warn!(waited = ?waited, "pipeline coordinator does not handle its mailbox; reporting unhealthy");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "unhealthy: the pipeline's coordinator has not handled a heartbeat for {}s\n",
                    waited.as_secs()
                ),
            )
                .into_response()
        }
        None => {
            let mut body = format!("{}\n", state.parts.describe());
            for task in state.parts.tasks().iter().filter(|t| t.restarts > 0) {
                body.push_str(&task_line(task));
            }
            body.into_response()
        }
    }
}

/// One line of `/health` about a task that ended unexpectedly.
fn task_line(task: &replicator_pipeline::TaskStats) -> String {
    let of = task
        .flow
        .as_ref()
        .map_or_else(|| " of the node".to_owned(), |f| format!(" of flow {f}"));
    let last = task
        .last_failure
        .as_ref()
        .map(|(how, ago)| format!("; last {how}, {}s ago", ago.as_secs()))
        .unwrap_or_default();
    format!(
        "task {}{of}: restarted {} time(s), {} panic(s){last}; {}\n",
        task.task,
        task.restarts,
        task.panics,
        if task.running {
            "running"
        } else {
            "waiting to restart"
        }
    )
}

/// How long the coordinator may leave a heartbeat unanswered before `/health` fails. Its
/// handlers never wait, so seconds of silence already mean something is wedged; the margin
/// keeps a briefly starved runtime on a loaded machine from being restarted.
const WEDGED_AFTER: Duration = Duration::from_secs(30);

/// `GET /ready`: a running member of a cluster that has a leader, with its assignments known;
/// 503 with the reason otherwise (also while starting or stopping).
pub(super) async fn ready(State(state): State<AdminState>) -> Response {
    match node_readiness(&state.parts) {
        Ok(leader) => (StatusCode::OK, format!("ready (leader {leader})\n")).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

/// Whether the node is ready (`GET /ready` and the `ready` metric): the leader it knows, or
/// why not.
pub(super) fn node_readiness(parts: &NodeParts) -> Result<NodeId, String> {
    let control = parts.control.get();
    let leader = readiness(parts, control.map(Control::metrics).as_ref())?;
    let disagreeing = control
        .map(Control::config_disagreements)
        .unwrap_or_default();
    if disagreeing.is_empty() {
        Ok(leader)
    } else {
        Err(format!(
            "the config of flow(s) {} differs from the leader's (node {leader}): this node \
             gets none of their partitions; make the configs equal and reload (SIGHUP or \
             POST /config/reload)",
            disagreeing.join(", ")
        ))
    }
}

/// Whether the node's stage and its control plane's metrics make it ready: the leader it
/// knows, or why not.
fn readiness(parts: &NodeParts, control: Option<&ControlMetrics>) -> Result<NodeId, String> {
    let (Stage::Running, Some(metrics)) = (parts.stage(), control) else {
        return Err(parts.describe());
    };
    match (metrics.leader, metrics.last_applied) {
        (Some(leader), Some(_)) => Ok(leader),
        (None, _) => Err("no leader".to_owned()),
        (Some(_), None) => Err("state not applied yet".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use replicator_pipeline::{TaskKind, TaskStats};

    use super::task_line;

    #[test]
    fn a_restarted_task_says_which_how_often_and_how_it_last_ended() {
        let task = TaskStats {
            task: TaskKind::MetadataSync,
            flow: Some("us-to-eu".to_owned()),
            restarts: 2,
            panics: 1,
            last_failure: Some(("panicked".to_owned(), Duration::from_secs(12))),
            running: false,
        };
        assert_eq!(
            task_line(&task),
            "task metadata_sync of flow us-to-eu: restarted 2 time(s), 1 panic(s); last \
             panicked, 12s ago; waiting to restart\n"
        );
        let node = TaskStats {
            task: TaskKind::Watchdog,
            flow: None,
            last_failure: None,
            running: true,
            ..task
        };
        assert_eq!(
            task_line(&node),
            "task watchdog of the node: restarted 2 time(s), 1 panic(s); running\n"
        );
    }
}
