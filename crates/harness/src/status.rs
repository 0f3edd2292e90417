//! A node's `GET /status`: the fields the tests and benchmarks read, and questions about
//! ownership asked of it.

use std::collections::{BTreeMap, BTreeSet};

use replicator_model::{NodeId, WorkUnit};
use serde::Deserialize;

use crate::Topic;

/// `GET /status` of a node.
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    /// The leader it knows.
    pub leader: Option<NodeId>,
    /// Its Raft term.
    pub term: u64,
    /// The members, as the control state lists them.
    pub members: Vec<MemberView>,
    /// Every unit the control state knows.
    pub units: Vec<UnitView>,
    /// Flows paused by `flow pause` or `flow promote`.
    #[serde(default)]
    pub paused_flows: Vec<PausedView>,
    /// The cluster's feature level (0 from a release before levels).
    #[serde(default)]
    pub feature_level: u32,
}

/// A paused flow in [`Status`].
#[derive(Debug, Clone, Deserialize)]
pub struct PausedView {
    /// The flow.
    pub flow: String,
}

/// A member in [`Status`].
#[derive(Debug, Clone, Deserialize)]
pub struct MemberView {
    /// Node id.
    pub id: NodeId,
    /// Units it owns.
    pub units_owned: usize,
    /// Flows whose config on it differs from the leader's.
    #[serde(default)]
    pub config_disagrees: Vec<String>,
    /// Whether its lease is alive; known only when reported by the leader.
    #[serde(default)]
    pub lease_alive: Option<bool>,
    /// Incarnation of its writer identity on the fenced targets (fencing only).
    #[serde(default)]
    pub writer_incarnation: Option<u64>,
    /// Whether the leader decided to fence that identity.
    #[serde(default)]
    pub fenced: bool,
    /// The highest feature level its release supports, once it published it.
    #[serde(default)]
    pub supported_level: Option<u32>,
}

/// A unit in [`Status`].
#[derive(Debug, Clone, Deserialize)]
pub struct UnitView {
    /// The unit.
    pub unit: WorkUnit,
    /// Its owner.
    pub owner: Option<NodeId>,
    /// Epoch of the latest grant (compared, never interpreted).
    pub epoch: serde_json::Value,
    /// Confirmed offset.
    pub confirmed_offset: Option<u64>,
    /// Release requested by the leader.
    pub release_requested: bool,
    /// No longer seen upstream.
    pub retired: bool,
    /// An offset reset (`flow reset`) its next owner has not taken up yet.
    #[serde(default)]
    pub pending_reset: Option<PendingResetView>,
}

/// A pending offset reset in [`UnitView`].
#[derive(Debug, Clone, Deserialize)]
pub struct PendingResetView {
    /// Where the next owner starts, and whether duplicates are allowed.
    pub reset: replicator_model::OffsetReset,
}

impl Status {
    /// Owner of every live unit of `topic`, by partition.
    #[must_use]
    pub fn owners(&self, topic: &Topic) -> BTreeMap<u32, Option<NodeId>> {
        self.units
            .iter()
            .filter(|u| !u.retired && u.unit.stream == topic.stream && u.unit.topic == topic.name)
            .map(|u| (u.unit.partition, u.owner))
            .collect()
    }

    /// Partitions of `topic` owned by `node`.
    #[must_use]
    pub fn owned_by(&self, topic: &Topic, node: NodeId) -> BTreeSet<u32> {
        self.owners(topic)
            .into_iter()
            .filter(|(_, owner)| *owner == Some(node))
            .map(|(p, _)| p)
            .collect()
    }

    /// Whether there are `units` live units (any flow, stream, topic), each owned by one of
    /// `nodes`.
    #[must_use]
    pub fn all_units_owned_by_any_of(&self, nodes: &[NodeId], units: usize) -> bool {
        let live: Vec<&UnitView> = self.units.iter().filter(|u| !u.retired).collect();
        live.len() == units
            && live
                .iter()
                .all(|u| u.owner.is_some_and(|o| nodes.contains(&o)))
    }

    /// Units `node` owns, as the leader counts them (0 for a non-member).
    #[must_use]
    pub fn units_owned(&self, node: NodeId) -> usize {
        self.member(node).map_or(0, |m| m.units_owned)
    }

    /// Whether the units are spread evenly over `nodes` (counts differ by at most one) with no
    /// release pending: the steady state after a start, a join or a drain.
    #[must_use]
    pub fn balanced_over(&self, nodes: &[NodeId]) -> bool {
        let owned: Vec<usize> = nodes.iter().map(|n| self.units_owned(*n)).collect();
        let (min, max) = (owned.iter().min(), owned.iter().max());
        let handing_over = self.units.iter().any(|u| u.release_requested);
        matches!((min, max), (Some(min), Some(max)) if max - min <= 1) && !handing_over
    }

    /// Whether `flow` is paused.
    #[must_use]
    pub fn is_paused(&self, flow: &str) -> bool {
        self.paused_flows.iter().any(|p| p.flow == flow)
    }

    /// Units of `flow` with an owner.
    #[must_use]
    pub fn owned_units_of(&self, flow: &str) -> usize {
        self.units
            .iter()
            .filter(|u| u.unit.flow == flow && u.owner.is_some())
            .count()
    }

    /// The offset resets of `flow` not taken up yet, by partition: where each starts.
    #[must_use]
    pub fn pending_resets_of(&self, flow: &str) -> BTreeMap<u32, u64> {
        self.units
            .iter()
            .filter(|u| u.unit.flow == flow)
            .filter_map(|u| Some((u.unit.partition, u.pending_reset.as_ref()?.reset.next)))
            .collect()
    }

    /// A member by id.
    #[must_use]
    pub fn member(&self, node: NodeId) -> Option<&MemberView> {
        self.members.iter().find(|m| m.id == node)
    }

    /// Owner and grant epoch of every live unit of `flow` (a unit that moved, or was granted
    /// again, shows another epoch).
    #[must_use]
    pub fn grants_of(&self, flow: &str) -> BTreeMap<WorkUnit, (Option<NodeId>, serde_json::Value)> {
        self.units
            .iter()
            .filter(|u| !u.retired && u.unit.flow == flow)
            .map(|u| (u.unit.clone(), (u.owner, u.epoch.clone())))
            .collect()
    }

    /// Member ids.
    #[must_use]
    pub fn member_ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }
}
