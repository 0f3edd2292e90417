//! The JSON documents of `GET /status` and the handler that builds them. The `status` and
//! `cluster` commands (`status.rs`) deserialise the same types, so that server and client
//! cannot drift apart.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use replicator_control::{ClusterStatus, MemberStatus, PausedFlow, PendingReset};
use replicator_model::{Epoch, NodeId, UnitCounters, WorkUnit};
use replicator_pipeline::{FlowResidency, HeartbeatStats, UnitStats};
use serde::{Deserialize, Serialize};

use super::state::{started_control, AdminState};

/// The JSON document of `GET /status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StatusView {
    /// The node that answered.
    pub(crate) node: NodeId,
    /// The leader it knows.
    pub(crate) leader: Option<NodeId>,
    /// Its Raft term.
    pub(crate) term: u64,
    /// Last applied log index.
    pub(crate) applied_index: Option<u64>,
    /// The cluster's feature level (README, "Upgrading").
    #[serde(default)]
    pub(crate) feature_level: u32,
    /// Members with liveness and writer identity.
    pub(crate) members: Vec<MemberStatus>,
    /// Writer fences the leader is waiting for (their members' units wait); 0 on followers.
    #[serde(default)]
    pub(crate) fences_pending: usize,
    /// The last error of a fence, provision or removal of a writer user (leader only).
    #[serde(default)]
    pub(crate) fence_error: Option<String>,
    /// Every unit with owner, epoch and confirmed offset; runtime figures for units this node runs.
    pub(crate) units: Vec<UnitView>,
    /// Flows an operator paused (`flow pause`, `flow promote`).
    #[serde(default)]
    pub(crate) paused_flows: Vec<PausedFlow>,
    /// This node's consumer-group sync, per flow that syncs groups.
    #[serde(default)]
    pub(crate) consumer_groups: Vec<FlowGroupsView>,
    /// This node's user and topic-settings sync, per flow whose rounds ran here.
    #[serde(default)]
    pub(crate) metadata_sync: Vec<FlowMetadataView>,
    /// This node's heartbeats per flow (flows with heartbeats on).
    #[serde(default)]
    pub(crate) heartbeats: Vec<HeartbeatView>,
    /// The topics residency policies keep from each flow's target on this node.
    #[serde(default)]
    pub(crate) blocked_topics: Vec<BlockedTopicView>,
}

/// A topic a residency policy keeps from a flow's target, as the answering node found it, in
/// [`StatusView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BlockedTopicView {
    /// The node.
    pub(crate) node: NodeId,
    /// The flow.
    pub(crate) flow: String,
    /// The flow's target cluster alias.
    pub(crate) target: String,
    /// Upstream stream (the heartbeat topic's stream on the target for a heartbeat topic).
    pub(crate) stream: String,
    /// Topic.
    pub(crate) topic: String,
    /// The policy that forbids it.
    pub(crate) policy: String,
    /// Whether it is the flow's heartbeat topic (no heartbeats written), not a topic it copies.
    pub(crate) heartbeat: bool,
}

impl BlockedTopicView {
    /// Every blocked topic of `flows` on `node`.
    fn of(node: NodeId, flows: &[FlowResidency]) -> Vec<Self> {
        flows
            .iter()
            .flat_map(|f| {
                f.blocked.iter().map(|b| Self {
                    node,
                    flow: f.flow.clone(),
                    target: f.target.clone(),
                    stream: b.stream.clone(),
                    topic: b.topic.clone(),
                    policy: b.policy.clone(),
                    heartbeat: b.heartbeat,
                })
            })
            .collect()
    }
}

/// One flow's consumer-group sync on the answering node, in [`StatusView`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FlowGroupsView {
    /// The node.
    pub(crate) node: NodeId,
    /// The flow.
    pub(crate) flow: String,
    /// Rounds since the node started.
    pub(crate) runs: u64,
    /// Rounds with an error.
    pub(crate) failed_runs: u64,
    /// Offsets stored on the target since the node started.
    pub(crate) stored: u64,
    /// When the latest round ended, Unix milliseconds.
    pub(crate) last_run_unix_ms: u64,
    /// The groups' offsets on the target after the latest round.
    pub(crate) offsets: Vec<crate::flow::GroupView>,
    /// Groups the latest round left alone.
    pub(crate) skipped: Vec<crate::flow::GroupSkipView>,
    /// Errors of the latest round.
    pub(crate) errors: Vec<String>,
}

impl FlowGroupsView {
    fn new(node: NodeId, flow: &str, s: &replicator_pipeline::FlowSyncState) -> Self {
        Self {
            node,
            flow: flow.to_owned(),
            runs: s.runs,
            failed_runs: s.failed_runs,
            stored: s.stored,
            last_run_unix_ms: s.last.at_unix_ms,
            offsets: s.last.offsets.iter().map(Into::into).collect(),
            skipped: s.last.skipped.iter().map(Into::into).collect(),
            errors: s.last.errors.clone(),
        }
    }
}

/// One flow's metadata sync (users, topic settings) on the answering node, in
/// [`StatusView`]: the node that owns the flow's first partition runs the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FlowMetadataView {
    /// The node.
    pub(crate) node: NodeId,
    /// The flow.
    pub(crate) flow: String,
    /// Rounds this node ran since it started.
    pub(crate) runs: u64,
    /// Rounds with an error.
    pub(crate) failed_runs: u64,
    /// Users created, changed or deleted on the target since the node started.
    pub(crate) users_changed: u64,
    /// Topic updates applied on the target since the node started.
    pub(crate) settings_applied: u64,
    /// When the latest round ended, Unix milliseconds.
    pub(crate) last_run_unix_ms: u64,
    /// The users the latest round checked.
    pub(crate) users: Vec<replicator_pipeline::UserReport>,
    /// The topics' settings on the target after the latest round, with what still differs.
    pub(crate) topics: Vec<replicator_pipeline::TopicSettingsReport>,
    /// Errors of the latest round.
    pub(crate) errors: Vec<String>,
}

impl FlowMetadataView {
    fn new(node: NodeId, flow: &str, s: &replicator_pipeline::MetadataSyncState) -> Self {
        Self {
            node,
            flow: flow.to_owned(),
            runs: s.runs,
            failed_runs: s.failed_runs,
            users_changed: s.users_changed,
            settings_applied: s.settings_applied,
            last_run_unix_ms: s.last.at_unix_ms,
            users: s.last.users.clone(),
            topics: s.last.topics.clone(),
            errors: s.last.errors.clone(),
        }
    }
}

/// One flow's heartbeats on the answering node, in [`StatusView`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HeartbeatView {
    /// The flow.
    pub(crate) flow: String,
    /// Heartbeats the target acknowledged since the process started.
    pub(crate) sent: u64,
    /// Heartbeats that failed since the process started.
    pub(crate) failures: u64,
    /// Milliseconds since the newest acknowledged heartbeat; absent before the first.
    pub(crate) last_sent_age_ms: Option<u64>,
    /// The error of the latest failed heartbeat, if any failed.
    pub(crate) last_error: Option<String>,
}

impl From<HeartbeatStats> for HeartbeatView {
    fn from(h: HeartbeatStats) -> Self {
        Self {
            flow: h.flow,
            sent: h.sent,
            failures: h.failures,
            last_sent_age_ms: h
                .last_sent_age
                .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            last_error: h.last_error,
        }
    }
}

/// One unit in [`StatusView`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UnitView {
    /// The unit.
    pub(crate) unit: WorkUnit,
    /// Owner node, if granted.
    pub(crate) owner: Option<NodeId>,
    /// Epoch of the latest grant.
    pub(crate) epoch: Epoch,
    /// Last upstream offset confirmed written downstream.
    pub(crate) confirmed_offset: Option<u64>,
    /// Totals over the unit's life (messages, bytes, errors, gaps).
    pub(crate) counters: UnitCounters,
    /// The leader asked the owner to hand the unit back.
    pub(crate) release_requested: bool,
    /// Discovery no longer sees the upstream partition.
    pub(crate) retired: bool,
    /// An operator's offset reset its next owner has not taken up yet (`flow reset`).
    #[serde(default)]
    pub(crate) pending_reset: Option<PendingReset>,
    /// Runtime figures from the owner (present when the answering node owns the unit).
    pub(crate) live: Option<LiveView>,
}

/// Runtime figures of a unit on the node that runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LiveView {
    /// The node that runs the unit.
    pub(crate) node: NodeId,
    /// Next offset of the upstream partition as last seen.
    pub(crate) upstream_end_offset: Option<u64>,
    /// Messages not yet copied.
    pub(crate) lag: Option<u64>,
    /// Messages per second copied.
    pub(crate) rate: f64,
    /// Median replication latency of recent batches, in milliseconds.
    pub(crate) latency_p50_ms: Option<f64>,
    /// 99th percentile replication latency of recent batches, in milliseconds.
    pub(crate) latency_p99_ms: Option<f64>,
    /// Reader/writer restarts after failures.
    pub(crate) restarts: u64,
    /// Messages the unit's next poll asks for: `batch_size`, or more while it catches up
    /// (README, `flows[].max_batch_bytes`).
    #[serde(default)]
    pub(crate) batch_size: u32,
}

/// Builds the status document from the control plane's view and this node's pipeline stats.
fn status_view(
    node: NodeId,
    cluster: ClusterStatus,
    local: &[UnitStats],
    groups: &BTreeMap<String, replicator_pipeline::FlowSyncState>,
) -> StatusView {
    // By unit: the cluster's units times this node's would be 3.3 billion comparisons at
    // 100,000 partitions (a status request then held a control-plane thread for seconds).
    let local: HashMap<&WorkUnit, &UnitStats> = local.iter().map(|s| (&s.unit, s)).collect();
    let units = cluster
        .units
        .into_iter()
        .map(|unit| {
            let live = (unit.owner == Some(node))
                .then(|| local.get(&unit.unit))
                .flatten()
                .map(|s| live_view(node, s));
            UnitView {
                owner: unit.owner,
                epoch: unit.epoch,
                confirmed_offset: unit.progress.confirmed,
                counters: unit.progress.counters,
                release_requested: unit.release_requested,
                retired: unit.retired,
                pending_reset: unit.pending_reset,
                unit: unit.unit,
                live,
            }
        })
        .collect();
    StatusView {
        node,
        leader: cluster.leader,
        term: cluster.term,
        applied_index: cluster.applied_index,
        feature_level: cluster.feature_level,
        members: cluster.members,
        fences_pending: cluster.fences_pending,
        fence_error: cluster.fence_error,
        units,
        paused_flows: cluster.paused_flows,
        consumer_groups: groups
            .iter()
            .map(|(flow, s)| FlowGroupsView::new(node, flow, s))
            .collect(),
        metadata_sync: Vec::new(),
        heartbeats: Vec::new(),
        blocked_topics: Vec::new(),
    }
}

fn live_view(node: NodeId, stats: &UnitStats) -> LiveView {
    let millis = |d: Duration| d.as_secs_f64() * 1000.0;
    LiveView {
        node,
        upstream_end_offset: stats.upstream_end,
        lag: stats.lag,
        rate: stats.messages_per_second,
        latency_p50_ms: stats.latency.map(|q| millis(q.p50)),
        latency_p99_ms: stats.latency.map(|q| millis(q.p99)),
        restarts: stats.restarts,
        batch_size: stats.batch_size,
    }
}

/// `GET /status`: the cluster as this node's control plane knows it (from the leader when
/// reachable) with this node's live unit figures; 503 while the control plane has not started.
pub(super) async fn status(State(state): State<AdminState>) -> Response {
    let control = match started_control(&state) {
        Ok(control) => control,
        Err(answer) => return *answer,
    };
    match control.status().await {
        Ok(cluster) => {
            let local = state.parts.local_stats();
            let groups = state
                .cutover()
                .map(|c| c.group_sync_state())
                .unwrap_or_default();
            let mut view = status_view(control.node_id(), cluster, &local, &groups);
            view.metadata_sync = state
                .cutover()
                .map(|c| c.metadata_sync_state())
                .unwrap_or_default()
                .iter()
                .map(|(flow, s)| FlowMetadataView::new(view.node, flow, s))
                .collect();
            view.heartbeats = state
                .parts
                .heartbeats()
                .into_iter()
                .map(HeartbeatView::from)
                .collect();
            view.blocked_topics = BlockedTopicView::of(view.node, &state.parts.residency());
            Json(view).into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cluster status unavailable: {e}\n"),
        )
            .into_response(),
    }
}
