//! The mutating calls the admin API serves itself, each authorised by `auth.rs` first:
//! membership changes (`cluster add|remove`), flow pause and resume (the control plane's side
//! is in `flow.rs`) and config reload. `flow promote` and `flow reset` are routed to `flow.rs`
//! and `reset.rs`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use replicator_model::NodeId;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::state::AdminState;
use crate::reload::ReloadRequest;

/// Body of `POST /cluster/members`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AddMember {
    /// The new node's id.
    pub(crate) id: NodeId,
    /// Its Raft `host:port`.
    pub(crate) raft_addr: String,
    /// Its admin API `host:port`.
    pub(crate) api_addr: String,
}

/// The answer to a membership change of node `id`: `member <id> <done>`, or 409 with
/// `cannot <verb> member <id>: <error>`.
fn membership_answer(
    id: NodeId,
    (verb, done): (&str, &str),
    result: Result<(), replicator_control::Error>,
) -> Response {
    match result {
        Ok(()) => (StatusCode::OK, format!("member {id} {done}\n")).into_response(),
        Err(e) => (
            StatusCode::CONFLICT,
            format!("cannot {verb} member {id}: {e}\n"),
        )
            .into_response(),
    }
}

/// `POST /config/reload`: the node re-reads its config file and applies it (see `reload.rs`);
/// 200 with what changed, 422 with the reasons the running config stays.
pub(super) async fn reload_config(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    if let Err(answer) = state.authorise(&headers, "config reload") {
        return *answer;
    }
    let Some(reloads) = &state.reloads else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            "this node was not started from a config file (iggy-replicator run --config)\n",
        )
            .into_response();
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    if reloads.send(ReloadRequest { reply }).await.is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "the node is stopping\n").into_response();
    }
    match answer.await {
        Ok(Ok(report)) => (StatusCode::OK, format!("{}\n", report.summary())).into_response(),
        Ok(Err(reason)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("config reload refused; the running config stays: {reason}\n"),
        )
            .into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the node is stopping\n").into_response(),
    }
}

/// `POST /flows/{name}/pause`: pauses the flow cluster-wide.
pub(super) async fn pause_flow(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    crate::flow::set_paused(&state, &headers, &name, true).await
}

/// `POST /flows/{name}/resume`: resumes a paused flow.
pub(super) async fn resume_flow(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    crate::flow::set_paused(&state, &headers, &name, false).await
}

/// `POST /cluster/members`: adds a node (learner, then voter).
pub(super) async fn add_member(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Json(body): Json<AddMember>,
) -> Response {
    let control = match state.control_for(&headers, "add_member") {
        Ok(control) => control,
        Err(answer) => return *answer,
    };
    info!(member = body.id, raft = %body.raft_addr, "adding member");
    let added = control
        .add_member(body.id, body.raft_addr, body.api_addr)
        .await;
    membership_answer(body.id, ("add", "added"), added)
}

/// `DELETE /cluster/members/{id}`: drains the node's units, then removes it.
pub(super) async fn remove_member(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(id): Path<NodeId>,
) -> Response {
    let control = match state.control_for(&headers, "remove_member") {
        Ok(control) => control,
        Err(answer) => return *answer,
    };
    info!(member = id, "removing member");
    let removed = control.remove_member(id).await;
    membership_answer(id, ("remove", "removed"), removed)
}
