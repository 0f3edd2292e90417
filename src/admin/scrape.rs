//! `GET /metrics`: at each scrape, the [`Snapshot`] of this node's local state that
//! `crate::metrics` renders as Prometheus text (the families themselves live there).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use replicator_control::Control;

use super::health::node_readiness;
use super::state::AdminState;
use crate::metrics::Snapshot;

/// `GET /metrics`: Prometheus text format, from the first moment: the data-path families
/// always, the control plane's once it started, the units' once the pipeline started. Every
/// value is read here, from local state (never from another node).
///
/// On the blocking pool: at tens of thousands of units a scrape reads every unit's meters and
/// renders hundreds of thousands of samples (BENCHMARKS.md section 22 times it), CPU work that
/// must not hold a thread of the control runtime, which serves Raft and renews the lease.
pub(super) async fn metrics(State(state): State<AdminState>) -> Response {
    match tokio::task::spawn_blocking(move || scrape(&state)).await {
        Ok(response) => response,
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

/// Reads the snapshot and renders it.
fn scrape(state: &AdminState) -> Response {
    let units = state.parts.local_stats();
    let control_plane = state.parts.control.get();
    let owned = control_plane
        .map(|c| {
            c.assignments()
                .borrow()
                .iter()
                .map(|a| a.unit.clone())
                .collect()
        })
        .unwrap_or_default();
    let control = control_plane.map(Control::metrics);
    let snapshot = Snapshot {
        ready: node_readiness(&state.parts).is_ok(),
        control,
        owned,
        units,
        connections: state
            .parts
            .pipeline()
            .map(|p| (p.connections)())
            .unwrap_or_default(),
        groups: state
            .cutover()
            .map(|c| c.group_sync_state())
            .unwrap_or_default(),
        metadata: state
            .cutover()
            .map(|c| c.metadata_sync_state())
            .unwrap_or_default(),
        paused: control_plane.map_or_else(Vec::new, |c| {
            state
                .flows()
                .iter()
                .map(|f| (f.clone(), c.is_flow_paused(f)))
                .collect()
        }),
        heartbeats: state.parts.heartbeats(),
        residency: state.parts.residency(),
        tasks: state.parts.tasks(),
    };
    match state.metrics.render(snapshot) {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
