//! The handlers' shared [`AdminState`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use replicator_config::Config;
use replicator_control::Control;
use replicator_model::{NodeId, WorkUnit};
use replicator_pipeline::Cutover;

use super::auth::authorise;
use super::parts::NodeParts;
use crate::metrics::Metrics;
use crate::reload::ReloadSender;

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The node's id (known before anything started).
    pub(super) node: NodeId,
    /// The node's control plane and pipeline, as far as they are up.
    pub(super) parts: Arc<NodeParts>,
    /// The bearer token that authorises mutating calls (`cluster.admin_token`; none: they are
    /// refused). Never the cluster secret: that one signs Raft RPCs and must not be usable to
    /// drive the admin API too.
    pub(super) admin_token: Option<Arc<str>>,
    /// Prometheus families, fed at every scrape.
    pub(super) metrics: Arc<Metrics>,
    /// The run loop's reload requests (`POST /config/reload`); `None` for a node not run from
    /// a config file (demo, tests).
    pub(super) reloads: Option<ReloadSender>,
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

    /// [`authorise`]s a mutating call `action`.
    pub(super) fn authorise(&self, headers: &HeaderMap, action: &str) -> Result<(), Box<Response>> {
        authorise(self.admin_token.as_deref(), headers, action)
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
        self.authorise(headers, action)?;
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

/// The control plane, or the 503 answer of a node whose control plane has not started yet.
pub(super) fn started_control(state: &AdminState) -> Result<&Control, Box<Response>> {
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
