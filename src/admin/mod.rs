//! The admin HTTP API on `node.api_addr`: health, readiness, status as JSON, Prometheus
//! metrics, and the authenticated membership calls behind `iggy-replicator cluster`.
//!
//! It serves from the moment the node's listeners are bound, before the control plane and the
//! pipeline start (they can wait a long time for peers or Iggy), and until they stopped. The
//! node publishes each part into [`NodeParts`] as it comes up; handlers answer with what is
//! known and never wait for an actor.
//!
//! The files, by concern:
//! * this one: the handlers' shared [`AdminState`], the routes and the (optionally TLS)
//!   server;
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
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use replicator_config::Config;
use replicator_control::tls::{serve_tls, ServerTls};
use replicator_control::Control;
use replicator_model::{NodeId, WorkUnit};
use replicator_pipeline::Cutover;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::metrics::Metrics;
use crate::reload::ReloadSender;

use auth::authorise;
pub(crate) use mutations::AddMember;
pub(crate) use parts::{NodeParts, PipelineView};
pub(crate) use views::{BlockedTopicView, FlowGroupsView, FlowMetadataView, LiveView, StatusView};

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The node's id (known before anything started).
    node: NodeId,
    /// The node's control plane and pipeline, as far as they are up.
    parts: Arc<NodeParts>,
    /// The bearer token that authorises mutating calls (`cluster.admin_token`; none: they are
    /// refused). Never the cluster secret: that one signs Raft RPCs and must not be usable to
    /// drive the admin API too.
    admin_token: Option<Arc<str>>,
    /// Prometheus families, fed at every scrape.
    metrics: Arc<Metrics>,
    /// The run loop's reload requests (`POST /config/reload`); `None` for a node not run from
    /// a config file (demo, tests).
    reloads: Option<ReloadSender>,
}

impl AdminState {
    /// State for a node built from `config`, reading its parts from `parts`.
    pub(crate) fn new(
        parts: Arc<NodeParts>,
        metrics: Arc<Metrics>,
        config: &Config,
        reloads: Option<ReloadSender>,
    ) -> Self {
        Self {
            node: config.node.id,
            parts,
            admin_token: config
                .cluster
                .admin_token
                .as_ref()
                .map(|t| Arc::from(t.expose())),
            metrics,
            reloads,
        }
    }

    /// Names of the flows in the config the node runs now.
    pub(crate) fn flows(&self) -> Arc<[String]> {
        self.parts.flows()
    }

    /// The control plane for the mutating call `action`: [`authorise`]d first, then 503
    /// until the control plane started.
    pub(crate) fn control_for(
        &self,
        headers: &HeaderMap,
        action: &str,
    ) -> Result<&Control, Box<Response>> {
        authorise(self, headers, action)?;
        started_control(self)
    }

    /// The upstream end each unit's reader on this node last saw (for `flow promote` when the
    /// source cannot be read).
    pub(crate) fn last_seen_upstream_ends(&self) -> BTreeMap<WorkUnit, u64> {
        self.parts
            .local_stats()
            .into_iter()
            .filter_map(|s| Some((s.unit, s.upstream_end?)))
            .collect()
    }

    /// The pipeline's cutover handle, once the pipeline started.
    pub(crate) fn cutover(&self) -> Option<Cutover> {
        self.parts.pipeline().map(|p| p.cutover)
    }
}

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

/// The control plane, or the 503 answer of a node whose control plane has not started yet.
fn started_control(state: &AdminState) -> Result<&Control, Box<Response>> {
    state.parts.control.get().ok_or_else(|| {
        Box::new(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "node {} is {}; retry when /ready answers 200\n",
                    state.node,
                    state.parts.describe()
                ),
            )
                .into_response(),
        )
    })
}

#[cfg(test)]
mod tests;
