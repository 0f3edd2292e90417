//! What `Control::status` and `Control::metrics` report; serialisable for the admin API.

use std::time::{Duration, Instant};

use openraft::RaftMetrics;
use replicator_model::{Epoch, NodeId, OffsetReset, UnitProgress, WorkUnit};
use serde::{Deserialize, Serialize};

use crate::lease::LeaderView;
use crate::state::{ControlState, MemberState};
use crate::MemberNode;

/// The cluster as one node (preferably the leader) sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The node that answered.
    pub reported_by: NodeId,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// Its current Raft term.
    pub term: u64,
    /// Index of its last log entry.
    pub last_log_index: Option<u64>,
    /// Index of its last applied entry.
    pub applied_index: Option<u64>,
    /// Every member (state members and Raft members, merged).
    pub members: Vec<MemberStatus>,
    /// Every known unit.
    pub units: Vec<UnitStatus>,
    /// Fences of failed members waiting for the target clusters' acknowledgement (their units
    /// wait too); reported by the leader only.
    #[serde(default)]
    pub fences_pending: usize,
    /// The latest failure of a fencing operation on the targets (leader only).
    #[serde(default)]
    pub fence_error: Option<String>,
    /// Flows an operator paused (`flow pause`, `flow promote`), by name.
    #[serde(default)]
    pub paused_flows: Vec<PausedFlow>,
    /// The cluster's feature level: what every member may write (README, "Upgrading").
    #[serde(default)]
    pub feature_level: u32,
}

/// A paused flow in [`ClusterStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedFlow {
    /// The flow.
    pub flow: String,
    /// Who paused it.
    pub requested_by: String,
    /// When, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// One member in [`ClusterStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Node id.
    pub id: NodeId,
    /// Raft address.
    pub raft_addr: String,
    /// Admin API address (empty until the member registered).
    pub api_addr: String,
    /// `Active`/`Leaving`; `None` if it is a Raft member that has not registered.
    pub state: Option<MemberState>,
    /// Raft voter (false: learner or not in the Raft membership).
    pub voter: bool,
    /// Whether its lease is alive; known only when reported by the leader.
    pub lease_alive: Option<bool>,
    /// Units it owns.
    pub units_owned: usize,
    /// Incarnation of its writer identity on the fenced target clusters (fencing only).
    #[serde(default)]
    pub writer_incarnation: Option<u64>,
    /// Whether that identity was fenced (its rights revoked); a new one follows once the
    /// member renews again.
    #[serde(default)]
    pub fenced: bool,
    /// Flows whose config on this member differs from the leader's (or that only one of them
    /// has): it gets no unit of them (see `flows_disagreeing`).
    #[serde(default)]
    pub config_disagrees: Vec<String>,
    /// The highest feature level its build supports, once it published it.
    #[serde(default)]
    pub supported_level: Option<u32>,
}

/// One unit in [`ClusterStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitStatus {
    /// The unit.
    pub unit: WorkUnit,
    /// Owner, if granted.
    pub owner: Option<NodeId>,
    /// Epoch of the latest grant.
    pub epoch: Epoch,
    /// The leader asked the owner to hand it back.
    pub release_requested: bool,
    /// No longer reported by discovery.
    pub retired: bool,
    /// Confirmed progress.
    pub progress: UnitProgress,
    /// An operator's offset reset its next owner has not taken up yet.
    #[serde(default)]
    pub pending_reset: Option<PendingReset>,
}

/// An offset reset in [`UnitStatus`] (`flow reset`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReset {
    /// Where the next owner starts, and whether it may copy again what the target holds.
    pub reset: OffsetReset,
    /// Who asked.
    pub requested_by: String,
    /// When, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// A snapshot of the node's control-plane metrics (for Prometheus).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlMetrics {
    /// This node.
    pub node: NodeId,
    /// Current Raft term.
    pub term: u64,
    /// Known leader.
    pub leader: Option<NodeId>,
    /// Whether this node is the leader.
    pub is_leader: bool,
    /// Index of the last log entry.
    pub last_log_index: Option<u64>,
    /// Index of the last applied entry.
    pub last_applied: Option<u64>,
    /// Commit index as this node knows it (entries up to it are durable on a quorum).
    pub commit_index: Option<u64>,
    /// Last log index included in the node's latest snapshot.
    pub snapshot_index: Option<u64>,
    /// Last purged log index (entries up to it exist only in the snapshot).
    pub purged_index: Option<u64>,
    /// Encoded size of this node's latest snapshot (built, installed or loaded at start).
    pub snapshot_bytes: Option<u64>,
    /// How long this node took to build its latest snapshot (none built since start: `None`).
    pub snapshot_build: Option<std::time::Duration>,
    /// How long this node took to install the latest snapshot the leader sent it, after the
    /// transfer (none installed since start: `None`).
    pub snapshot_install: Option<std::time::Duration>,
    /// Successful lease renewals since start.
    pub lease_renewals: u64,
    /// Commits answered `Fenced` since start.
    pub fenced_commits: u64,
    /// Commit batches written since start.
    pub commit_batches: u64,
    /// Requests this node sent to other members since start (Raft replication, votes and
    /// snapshots, writes forwarded to the leader, status and membership calls; retries
    /// included): the cost of the control plane on the network.
    pub requests_sent: u64,
    /// Units this node owns now.
    pub units_owned: usize,
    /// Units discovery reports that nobody owns, in this node's applied state (meaningful
    /// on the leader and on any follower that is up to date).
    pub units_unowned: usize,
    /// Revokes of a member's identity on one target that this node (as leader) had
    /// acknowledged and committed since start.
    pub fences: u64,
    /// Failed attempts of fencing operations on the targets since start (each is retried).
    pub fence_failures: u64,
    /// Revokes (member, target) waiting for the target's acknowledgement now.
    pub fences_pending: usize,
}

pub(crate) struct StatusInputs<'a> {
    pub(crate) node: NodeId,
    pub(crate) metrics: &'a RaftMetrics<NodeId, MemberNode>,
    pub(crate) state: &'a ControlState,
    pub(crate) view: Option<&'a LeaderView>,
    pub(crate) now: Instant,
    pub(crate) lease_expiry: Duration,
    /// Pending fences and the latest fencing failure (leader only).
    pub(crate) fencing: (usize, Option<String>),
}

pub(crate) fn build_status(i: StatusInputs<'_>) -> ClusterStatus {
    let membership = i.metrics.membership_config.membership();
    let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
    let mut ids: std::collections::BTreeSet<NodeId> = i.state.members.keys().copied().collect();
    ids.extend(membership.nodes().map(|(id, _)| *id));
    let members = ids
        .into_iter()
        .map(|id| {
            let record = i.state.members.get(&id);
            MemberStatus {
                id,
                raft_addr: record
                    .map(|m| m.raft_addr.clone())
                    .or_else(|| membership.get_node(&id).map(|n| n.raft_addr.clone()))
                    .unwrap_or_default(),
                api_addr: record.map(|m| m.api_addr.clone()).unwrap_or_default(),
                state: record.map(|m| m.state),
                voter: voters.contains(&id),
                lease_alive: i.view.and_then(|v| v.is_live(id, i.now, i.lease_expiry)),
                units_owned: i
                    .state
                    .units
                    .values()
                    .filter(|u| u.owner == Some(id))
                    .count(),
                writer_incarnation: i.state.identities.get(&id).map(|w| w.incarnation),
                fenced: i.state.identities.get(&id).is_some_and(|w| w.fenced),
                config_disagrees: i
                    .metrics
                    .current_leader
                    .map(|leader| flows_disagreeing(i.state, leader, id))
                    .unwrap_or_default(),
                supported_level: i.state.member_levels.get(&id).copied(),
            }
        })
        .collect();
    let units = i
        .state
        .units
        .iter()
        .map(|(unit, r)| UnitStatus {
            unit: unit.clone(),
            owner: r.owner,
            epoch: r.epoch,
            release_requested: r.release_requested,
            retired: r.retired,
            progress: r.progress,
            pending_reset: i.state.pending_resets.get(unit).map(|p| PendingReset {
                reset: p.reset,
                requested_by: p.requested_by.clone(),
                at_unix_ms: p.at_unix_ms,
            }),
        })
        .collect();
    ClusterStatus {
        reported_by: i.node,
        leader: i.metrics.current_leader,
        term: i.metrics.current_term,
        last_log_index: i.metrics.last_log_index,
        applied_index: i.metrics.last_applied.map(|l| l.index),
        members,
        units,
        fences_pending: i.fencing.0,
        fence_error: i.fencing.1,
        paused_flows: i
            .state
            .paused_flows
            .iter()
            .map(|(flow, p)| PausedFlow {
                flow: flow.clone(),
                requested_by: p.requested_by.clone(),
                at_unix_ms: p.at_unix_ms,
            })
            .collect(),
        feature_level: i.state.feature_level(),
    }
}

/// The flows `node` does not run as `leader` does: every flow either of them published, whose
/// digests differ or that one of them lacks. Empty while the leader published nothing (no
/// agreement is checked then, see `ControlState::config_agrees`).
pub(crate) fn flows_disagreeing(state: &ControlState, leader: NodeId, node: NodeId) -> Vec<String> {
    if !state.config_digests.contains_key(&leader) {
        return Vec::new();
    }
    let flows: std::collections::BTreeSet<&String> = [leader, node]
        .iter()
        .filter_map(|n| state.config_digests.get(n))
        .flat_map(|d| d.keys())
        .collect();
    flows
        .into_iter()
        .filter(|flow| !state.config_agrees(leader, node, flow))
        .cloned()
        .collect()
}
