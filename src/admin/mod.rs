//! The admin HTTP API on `node.api_addr`: health, readiness, status as JSON, Prometheus
//! metrics, and the authenticated membership calls behind `iggy-replicator cluster`.
//!
//! It serves from the moment the node's listeners are bound, before the control plane and the
//! pipeline start (they can wait a long time for peers or Iggy), and until they stopped. The
//! node publishes each part into [`NodeParts`] as it comes up; handlers answer with what is
//! known and never wait for an actor.
//!
//! The files, by concern:
//! * this one: the routes and the (optionally TLS) server;
//! * `state.rs`: the handlers' shared [`AdminState`] (below the handlers, which import it from
//!   there, as `flow.rs` and `reset.rs` do through this module);
//! * `parts.rs`: [`NodeParts`], what the node publishes as it comes up, and the stage its life
//!   is in;
//! * `health.rs`: `GET /health` and `GET /ready`, and the readiness the `ready` metric shares;
//! * `views.rs`: the JSON documents of `GET /status` (also what the `status` command reads)
//!   and the handler that builds them;
//! * `scrape.rs`: `GET /metrics`, the snapshot of local state each scrape renders;
//! * `auth.rs`: the bearer token check of every mutating call;
//! * `mutations.rs`: the mutating calls served here (membership, flow pause/resume, config
//!   reload); `flow promote` and `flow reset` are served by `flow.rs` and `reset.rs`.

mod auth;
mod health;
mod mutations;
mod parts;
mod scrape;
mod state;
mod views;

use axum::routing::{delete, get, post};
use axum::Router;
use replicator_control::tls::{serve_tls, ServerTls};
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub(crate) use mutations::AddMember;
pub(crate) use parts::{NodeParts, PipelineView};
pub(crate) use state::AdminState;
pub(crate) use views::{BlockedTopicView, FlowGroupsView, FlowMetadataView, LiveView, StatusView};

/// The routes.
fn router(state: AdminState) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/status", get(views::status))
        .route("/metrics", get(scrape::metrics))
        .route("/cluster/members", post(mutations::add_member))
        .route("/cluster/members/{id}", delete(mutations::remove_member))
        .route("/flows/{name}/pause", post(mutations::pause_flow))
        .route("/flows/{name}/resume", post(mutations::resume_flow))
        .route("/flows/{name}/promote", post(crate::flow::promote))
        .route("/flows/{name}/reset", post(crate::reset::reset))
        .route("/config/reload", post(mutations::reload_config))
        .with_state(state)
}

/// Serves the API on `listener` until `stop` is cancelled.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    stop: CancellationToken,
    tls: Option<ServerTls>,
) {
    let app = router(state);
    if let Some(tls) = tls {
        let watcher = tls.watch(stop.clone());
        serve_tls(listener, app, stop, &tls).await;
        let _ = watcher.await;
        return;
    }
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    if let Err(e) = result {
        warn!(error = %e, "admin API stopped with an error");
    }
}

#[cfg(test)]
mod tests;
