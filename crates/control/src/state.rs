//! The replicated state and its deterministic `apply`: members, units with owners and epochs,
//! and confirmed progress. No clock, no RNG, no IO: the result depends only on the state, the
//! command and its log index.

use std::collections::{BTreeMap, BTreeSet};

use replicator_model::{
    Assignment, CommitCounters, CommitOutcome, Epoch, MetadataChange, MetadataKey, MetadataRecord,
    NodeId, Offset, OffsetCommit, OffsetReset, ProgressCommit, SessionCounters, UnitProgress,
    UnitStart, WorkUnit, WriterLogin,
};
use serde::{Deserialize, Serialize};

use crate::command::{ControlCommand, ControlResponse, Rejection};
use crate::identity::WriterPasswords;

/// Whether a member takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Takes units.
    Active,
    /// Drains: gets no new units, its units are requested back.
    Leaving,
}

/// One replicator instance as the replicated state knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberRecord {
    /// Advertised Raft address.
    pub(crate) raft_addr: String,
    /// Advertised admin API address.
    pub(crate) api_addr: String,
    /// Active or leaving.
    pub(crate) state: MemberState,
    /// Log index of its latest applied lease renewal (or of its registration).
    pub(crate) last_renewal_index: u64,
    /// Log index of the latest revoke of one of its units (0 if never).
    pub(crate) last_revoke_index: u64,
}

/// Ownership and progress of one unit.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct UnitRecord {
    /// Current owner, if granted.
    pub(crate) owner: Option<NodeId>,
    /// Epoch of the latest grant (kept after release/revoke; 0 before the first grant).
    pub(crate) epoch: Epoch,
    /// The leader asked the owner to hand the unit back.
    pub(crate) release_requested: bool,
    /// Discovery no longer reports the unit; it is never granted while retired.
    pub(crate) retired: bool,
    /// Confirmed progress (kept across owners and retirement).
    pub(crate) progress: UnitProgress,
}

/// A member's current writer identity on the fenced target clusters (see [`WriterLogin`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IdentityRecord {
    /// The incarnation; the next one the leader provisions is one higher.
    pub(crate) incarnation: u64,
    /// Empty: the password is derived (`WriterPasswords`). An identity committed by a leader
    /// of an earlier version holds the random password that leader chose.
    pub(crate) password: String,
    /// Fenced (`FenceMember`): the node no longer writes as it.
    pub(crate) fenced: bool,
    /// Every fenced target acknowledged that its rights are gone (`IdentityRevoked`, or
    /// `FenceAcknowledged` of an earlier version): the node may get a new identity.
    pub(crate) revoked: bool,
}

impl std::fmt::Debug for IdentityRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityRecord")
            .field("incarnation", &self.incarnation)
            .field("fenced", &self.fenced)
            .field("revoked", &self.revoked)
            .finish_non_exhaustive()
    }
}

/// The whole replicated application state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct ControlState {
    /// Members by id.
    pub(crate) members: BTreeMap<NodeId, MemberRecord>,
    /// Units ever reported, by unit.
    pub(crate) units: BTreeMap<WorkUnit, UnitRecord>,
    /// Each member's current writer identity (only with fencing on).
    pub(crate) identities: BTreeMap<NodeId, IdentityRecord>,
    /// Replaced or removed identities whose users may still have rights on a target: the
    /// leader makes sure each is revoked, then moves it to `forgotten_incarnations`.
    pub(crate) stale_identities: BTreeSet<(NodeId, u64)>,
    /// Per node, the highest incarnation forgotten: its user stays on the targets (revoked and
    /// inactive, never deleted), so no new identity may take its name again.
    pub(crate) forgotten_incarnations: BTreeMap<NodeId, u64>,
    /// Flows an operator paused, by name: their units are asked back and granted to nobody.
    pub(crate) paused_flows: BTreeMap<String, PauseRecord>,
    /// Offset resets not yet taken up, by unit: the unit's next owner starts there, and its
    /// first commit clears the entry.
    pub(crate) pending_resets: BTreeMap<WorkUnit, ResetRecord>,
    /// Each node's config digest per flow (`PublishConfig`), the latest it published.
    pub(crate) config_digests: BTreeMap<NodeId, BTreeMap<String, String>>,
    /// Where units that never committed in their current history start (`RecordStart`), until
    /// their first commit.
    pub(crate) recorded_starts: BTreeMap<WorkUnit, UnitStart>,
    /// The upstream topic (creation time, µs) each pending reset was decided for, when the
    /// reset named it (`ResetTopicOffsets`); cleared with the reset.
    pub(crate) reset_topics: BTreeMap<WorkUnit, u64>,
    /// Per fenced identity (node, incarnation): the target clusters that acknowledged its
    /// revoke (`FenceTarget`). Dropped when the node gets its next identity or is removed.
    pub(crate) target_revokes: BTreeMap<(NodeId, u64), BTreeSet<String>>,
    /// Fenced identities replaced (`ReplaceFencedIdentity`) before every fenced target
    /// acknowledged their revoke: the leader goes on revoking them target by target
    /// (`FenceTarget`), then `IdentityRevoked` moves them to `stale_identities`.
    pub(crate) revoke_pending: BTreeSet<(NodeId, u64)>,
    /// Units a replaced identity (node, incarnation) held on a target that did not
    /// acknowledge its revoke yet: owned by nobody and granted to nobody until that target's
    /// `FenceTarget` for the identity frees them, since a stale writer may still reach it.
    pub(crate) held_units: BTreeMap<WorkUnit, (NodeId, u64)>,
    /// The cluster's feature level (`RaiseFeatureLevel`); 0 before the first raise, which
    /// counts as `format::BASELINE_LEVEL`.
    pub(crate) feature_level: u32,
    /// The highest feature level each member's build supports (`PublishFeatures`).
    pub(crate) member_levels: BTreeMap<NodeId, u32>,
    /// Per unit, the totals its current grant's writer sessions committed
    /// (`CommitCounters::Totals`). With `metadata`, one of the last two fields, in this order:
    /// older snapshot formats are the current one without them (see
    /// `format::snapshot_payload`).
    pub(crate) session_counters: BTreeMap<WorkUnit, SessionCounters>,
    /// What the control plane remembers of the objects each two-way pair syncs
    /// (`RecordMetadata`, feature level 3). Must stay the last field (see
    /// `format::snapshot_payload`).
    pub(crate) metadata: BTreeMap<MetadataKey, MetadataRecord>,
}

/// An operator's offset reset of one unit (see `ControlCommand::ResetOffsets`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResetRecord {
    /// Where the next owner starts.
    pub(crate) reset: OffsetReset,
    /// Who asked.
    pub(crate) requested_by: String,
    /// When, Unix milliseconds.
    pub(crate) at_unix_ms: u64,
    /// Log index of the reset.
    pub(crate) index: u64,
}

/// Who paused a flow, and when (see `ControlCommand::SetFlowPaused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PauseRecord {
    /// Who asked.
    pub(crate) requested_by: String,
    /// When, Unix milliseconds.
    pub(crate) at_unix_ms: u64,
    /// Log index of the pause.
    pub(crate) index: u64,
}

impl ControlState {
    /// Applies `cmd`, written at log `index`, and says what happened.
    pub(crate) fn apply(&mut self, index: u64, cmd: &ControlCommand) -> ControlResponse {
        match cmd {
            ControlCommand::Batch(cmds) => ControlResponse::Batch(
                cmds.iter()
                    .map(|c| match c {
                        ControlCommand::Batch(_) => {
                            ControlResponse::Ignored(Rejection::NestedBatch)
                        }
                        other => self.apply_one(index, other),
                    })
                    .collect(),
            ),
            other => self.apply_one(index, other),
        }
    }

    fn apply_one(&mut self, index: u64, cmd: &ControlCommand) -> ControlResponse {
        use ControlResponse::{Done, Ignored};
        match cmd {
            ControlCommand::RegisterMember {
                node,
                raft_addr,
                api_addr,
            } => {
                let record = self.members.entry(*node).or_insert_with(|| MemberRecord {
                    raft_addr: String::new(),
                    api_addr: String::new(),
                    state: MemberState::Active,
                    last_renewal_index: index,
                    last_revoke_index: 0,
                });
                record.raft_addr.clone_from(raft_addr);
                record.api_addr.clone_from(api_addr);
                record.state = MemberState::Active;
                record.last_renewal_index = index;
                Done
            }
            ControlCommand::LeaveMember { node } => match self.members.get_mut(node) {
                Some(m) => {
                    m.state = MemberState::Leaving;
                    Done
                }
                None => Ignored(Rejection::UnknownMember),
            },
            ControlCommand::RenewLease { node } => match self.members.get_mut(node) {
                Some(m) => {
                    let revoked_since_previous = m.last_revoke_index > m.last_renewal_index;
                    m.last_renewal_index = index;
                    ControlResponse::Renewed {
                        revoked_since_previous,
                    }
                }
                None => Ignored(Rejection::UnknownMember),
            },
            ControlCommand::ReportUnits { flow, units } => self.report_units(flow, units),
            ControlCommand::Grant { unit, node } => {
                match self.members.get(node).map(|m| m.state) {
                    None => return Ignored(Rejection::UnknownMember),
                    Some(MemberState::Leaving) => return Ignored(Rejection::MemberLeaving),
                    Some(MemberState::Active) => {}
                }
                let Some(rec) = self.units.get_mut(unit) else {
                    return Ignored(Rejection::UnknownUnit);
                };
                if rec.retired {
                    return Ignored(Rejection::Retired);
                }
                if self.paused_flows.contains_key(&unit.flow) {
                    return Ignored(Rejection::FlowPaused);
                }
                if rec.owner.is_some() {
                    return Ignored(Rejection::AlreadyOwned);
                }
                if self.held_units.contains_key(unit) {
                    return Ignored(Rejection::HeldForRevoke);
                }
                // Every grant is at a later index than the unit's previous grant (a batch holds
                // at most one successful grant per unit because the second finds it owned).
                rec.owner = Some(*node);
                rec.epoch = Epoch(index);
                rec.release_requested = false;
                ControlResponse::Granted { epoch: rec.epoch }
            }
            ControlCommand::RequestRelease { unit, epoch } => match self.units.get_mut(unit) {
                Some(rec) if rec.owner.is_some() && rec.epoch == *epoch => {
                    rec.release_requested = true;
                    Done
                }
                Some(_) => Ignored(Rejection::StaleEpoch),
                None => Ignored(Rejection::UnknownUnit),
            },
            ControlCommand::Release { unit, epoch, node } => match self.units.get_mut(unit) {
                Some(rec) if rec.owner == Some(*node) && rec.epoch == *epoch => {
                    rec.owner = None;
                    rec.release_requested = false;
                    Done
                }
                Some(_) => Ignored(Rejection::StaleEpoch),
                None => Ignored(Rejection::UnknownUnit),
            },
            ControlCommand::Revoke {
                unit,
                epoch,
                renewal_index,
            } => {
                let Some(rec) = self.units.get_mut(unit) else {
                    return Ignored(Rejection::UnknownUnit);
                };
                let Some(owner) = rec.owner.filter(|_| rec.epoch == *epoch) else {
                    return Ignored(Rejection::StaleEpoch);
                };
                if let Some(m) = self.members.get_mut(&owner) {
                    if m.last_renewal_index != *renewal_index {
                        return Ignored(Rejection::LeaseRenewed);
                    }
                    m.last_revoke_index = index;
                }
                rec.owner = None;
                rec.release_requested = false;
                Done
            }
            ControlCommand::CommitOffsets { node, commits } => ControlResponse::Commits(
                commits
                    .iter()
                    .map(|c| self.commit_one(*node, &progress_commit(c)))
                    .collect(),
            ),
            ControlCommand::CommitProgress { node, commits } => ControlResponse::Commits(
                commits.iter().map(|c| self.commit_one(*node, c)).collect(),
            ),
            ControlCommand::ForgetUnits { units } => {
                for unit in units {
                    self.forget_unit(unit);
                }
                Done
            }
            ControlCommand::RecordMetadata { changes } => ControlResponse::MetadataRecorded(
                changes.iter().map(|c| self.record_metadata(c)).collect(),
            ),
            ControlCommand::RemoveMember { node } => {
                if !self.members.contains_key(node) {
                    return Ignored(Rejection::UnknownMember);
                }
                if self.units.values().any(|u| u.owner == Some(*node)) {
                    return Ignored(Rejection::StillOwnsUnits);
                }
                self.members.remove(node);
                self.config_digests.remove(node);
                self.member_levels.remove(node);
                if let Some(identity) = self.identities.remove(node) {
                    self.stale_identities.insert((*node, identity.incarnation));
                    self.target_revokes.remove(&(*node, identity.incarnation));
                }
                Done
            }
            ControlCommand::SetWriterIdentity {
                node,
                incarnation,
                password,
            } => self.set_identity(*node, *incarnation, password),
            ControlCommand::FenceMember { node, incarnation } => {
                match self.identities.get_mut(node) {
                    Some(identity) if identity.incarnation == *incarnation => {
                        identity.fenced = true;
                        Done
                    }
                    _ => Ignored(Rejection::StaleIncarnation),
                }
            }
            ControlCommand::FenceAcknowledged { node, incarnation } => {
                self.fence_acknowledged(index, *node, *incarnation)
            }
            ControlCommand::FenceTarget {
                node,
                incarnation,
                target,
                flows,
            } => self.fence_target(index, *node, *incarnation, target, flows),
            ControlCommand::PublishFeatures { node, level } => {
                if !self.members.contains_key(node) {
                    return Ignored(Rejection::UnknownMember);
                }
                self.member_levels.insert(*node, *level);
                Done
            }
            ControlCommand::RaiseFeatureLevel { level } => {
                // A member that published a lower level since the leader decided (a node
                // rolled back to an older release) keeps the level where it is.
                if self.level_to_raise().is_some_and(|most| *level <= most) {
                    self.feature_level = *level;
                    Done
                } else {
                    Ignored(Rejection::FeatureLevel)
                }
            }
            ControlCommand::IdentityRevoked { node, incarnation } => {
                if self.revoke_pending.remove(&(*node, *incarnation)) {
                    // Replaced earlier: it goes the way of any replaced identity, and
                    // whatever it still held (a flow the config dropped meanwhile) is free.
                    self.stale_identities.insert((*node, *incarnation));
                    self.target_revokes.remove(&(*node, *incarnation));
                    self.held_units
                        .retain(|_, held| *held != (*node, *incarnation));
                    return Done;
                }
                match self.identities.get_mut(node) {
                    Some(identity) if identity.incarnation == *incarnation && identity.fenced => {
                        identity.revoked = true;
                        Done
                    }
                    _ => Ignored(Rejection::StaleIncarnation),
                }
            }
            ControlCommand::ReplaceFencedIdentity {
                node,
                fenced,
                incarnation,
                held_flows,
            } => self.replace_fenced_identity(*node, *fenced, *incarnation, held_flows),
            ControlCommand::ForgetIdentity { node, incarnation } => {
                if self.stale_identities.remove(&(*node, *incarnation)) {
                    let highest = self.forgotten_incarnations.entry(*node).or_insert(0);
                    *highest = (*highest).max(*incarnation);
                    Done
                } else {
                    Ignored(Rejection::UnknownIdentity)
                }
            }
            ControlCommand::SetFlowPaused {
                flow,
                paused,
                requested_by,
                at_unix_ms,
            } => self.set_flow_paused(index, flow, *paused, requested_by, *at_unix_ms),
            ControlCommand::ResetOffsets {
                flow,
                resets,
                allow_duplicates,
                requested_by,
                at_unix_ms,
            } => {
                let resets: Vec<_> = resets.iter().map(|(u, n)| (u, *n, None)).collect();
                let by = (requested_by.as_str(), *at_unix_ms);
                self.reset_offsets(index, flow, &resets, *allow_duplicates, by)
            }
            ControlCommand::ResetTopicOffsets {
                flow,
                resets,
                allow_duplicates,
                requested_by,
                at_unix_ms,
            } => {
                let resets: Vec<_> = resets.iter().map(|(u, n, t)| (u, *n, Some(*t))).collect();
                let by = (requested_by.as_str(), *at_unix_ms);
                self.reset_offsets(index, flow, &resets, *allow_duplicates, by)
            }
            ControlCommand::PublishConfig { node, digests } => {
                self.config_digests.insert(*node, digests.clone());
                Done
            }
            ControlCommand::RecordStart {
                node,
                unit,
                epoch,
                start,
            } => self.record_start(*node, unit, *epoch, *start),
            ControlCommand::Batch(_) => Ignored(Rejection::NestedBatch),
        }
    }

    /// Pauses (every owned unit of the flow is asked back at once, without waiting for an
    /// assignment round) or resumes `flow`. Pausing a paused flow keeps the first record.
    fn set_flow_paused(
        &mut self,
        index: u64,
        flow: &str,
        paused: bool,
        requested_by: &str,
        at_unix_ms: u64,
    ) -> ControlResponse {
        if flow.is_empty() {
            return ControlResponse::Ignored(Rejection::InvalidFlow);
        }
        if !paused {
            self.paused_flows.remove(flow);
            return ControlResponse::Done;
        }
        self.paused_flows
            .entry(flow.to_owned())
            .or_insert_with(|| PauseRecord {
                requested_by: requested_by.to_owned(),
                at_unix_ms,
                index,
            });
        for (_, rec) in self.units.iter_mut().filter(|(u, _)| u.flow == flow) {
            if rec.owner.is_some() {
                rec.release_requested = true;
            }
        }
        ControlResponse::Done
    }

    /// Applies a reset of `flow`'s units (each: the unit, its next offset and the upstream
    /// topic it was decided for, when known), all or nothing; `by` is who asked and when.
    fn reset_offsets(
        &mut self,
        index: u64,
        flow: &str,
        resets: &[(&WorkUnit, Offset, Option<u64>)],
        allow_duplicates: bool,
        (requested_by, at_unix_ms): (&str, u64),
    ) -> ControlResponse {
        if let Err(rejection) = self.check_reset(flow, resets, allow_duplicates) {
            return ControlResponse::Ignored(rejection);
        }
        for &(unit, next, topic) in resets {
            self.reset_offset(
                index,
                unit,
                next,
                allow_duplicates,
                requested_by,
                at_unix_ms,
            );
            match topic {
                Some(created_at) => self.reset_topics.insert(unit.clone(), created_at),
                None => self.reset_topics.remove(unit),
            };
        }
        ControlResponse::Done
    }

    /// Why `resets` cannot apply, if they cannot (see `ControlCommand::ResetOffsets`).
    fn check_reset(
        &self,
        flow: &str,
        resets: &[(&WorkUnit, Offset, Option<u64>)],
        allow_duplicates: bool,
    ) -> Result<(), Rejection> {
        if flow.is_empty() || resets.is_empty() || resets.iter().any(|(u, ..)| u.flow != flow) {
            return Err(Rejection::InvalidFlow);
        }
        if !self.paused_flows.contains_key(flow) {
            return Err(Rejection::FlowRunning);
        }
        for &(unit, next, _) in resets {
            let rec = match self.units.get(unit) {
                Some(rec) if !rec.retired => rec,
                Some(_) => return Err(Rejection::Retired),
                None => return Err(Rejection::UnknownUnit),
            };
            if rec.owner.is_some() {
                return Err(Rejection::StillOwned);
            }
            if !allow_duplicates && rec.progress.confirmed.is_some_and(|c| next <= c) {
                return Err(Rejection::WouldDuplicate);
            }
        }
        Ok(())
    }

    /// Records where the copy of `start`'s history begins for `unit` (see
    /// `ControlCommand::RecordStart`).
    fn record_start(
        &mut self,
        node: NodeId,
        unit: &WorkUnit,
        epoch: Epoch,
        start: UnitStart,
    ) -> ControlResponse {
        let Some(rec) = self.units.get(unit) else {
            return ControlResponse::Ignored(Rejection::UnknownUnit);
        };
        if rec.owner != Some(node) || rec.epoch != epoch {
            return ControlResponse::Ignored(Rejection::StaleEpoch);
        }
        let confirmed =
            rec.progress.confirmed.is_some() && rec.progress.history_label == start.history_label;
        let recorded = self
            .recorded_starts
            .get(unit)
            .is_some_and(|r| r.history_label == start.history_label);
        if confirmed || recorded {
            return ControlResponse::Ignored(Rejection::StartKnown);
        }
        self.recorded_starts.insert(unit.clone(), start);
        ControlResponse::Done
    }

    /// Records where `unit`'s next owner starts. The confirmed offset moves to just before it
    /// (back over what is copied again, or forward over what is skipped, so lag and `flow
    /// promote` count from there); a unit that never committed keeps none.
    fn reset_offset(
        &mut self,
        index: u64,
        unit: &WorkUnit,
        next: Offset,
        allow_duplicates: bool,
        requested_by: &str,
        at_unix_ms: u64,
    ) {
        if let Some(rec) = self.units.get_mut(unit) {
            if rec.progress.confirmed.is_some() {
                rec.progress.confirmed = next.checked_sub(1);
            }
        }
        // The operator's start replaces the one its first owner recorded.
        self.recorded_starts.remove(unit);
        self.pending_resets.insert(
            unit.clone(),
            ResetRecord {
                reset: OffsetReset {
                    next,
                    allow_duplicates,
                },
                requested_by: requested_by.to_owned(),
                at_unix_ms,
                index,
            },
        );
    }

    /// Whether `node` runs `flow` with the config `reference` (the leader) runs it with: both
    /// published the same digest for it. Always true while `reference` never published any
    /// (a leader of a version before config agreement, or one that has not published yet:
    /// nodes publish right after they start, and the assignment waits for nothing else).
    pub(crate) fn config_agrees(&self, reference: NodeId, node: NodeId, flow: &str) -> bool {
        let Some(leader) = self.config_digests.get(&reference) else {
            return true;
        };
        match (
            leader.get(flow),
            self.config_digests.get(&node).and_then(|d| d.get(flow)),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// Whether the config digests applied for `node` are `own`, the ones its process runs
    /// now (`None`: not known, no check). After a restart onto another config the state holds
    /// the previous process's digests until the new ones are applied, and every decision that
    /// compares configs would compare the wrong one.
    pub(crate) fn config_applied(
        &self,
        node: NodeId,
        own: Option<&BTreeMap<String, String>>,
    ) -> bool {
        own.is_none_or(|own| self.config_digests.get(&node) == Some(own))
    }

    /// Like [`ControlState::config_applied`] for one flow: whether the leader judged `node`'s
    /// units of `flow` on the config of it that `node` runs now.
    pub(crate) fn flow_config_applied(
        &self,
        node: NodeId,
        flow: &str,
        own: Option<&BTreeMap<String, String>>,
    ) -> bool {
        own.is_none_or(|own| {
            self.config_digests.get(&node).and_then(|d| d.get(flow)) == own.get(flow)
        })
    }

    /// `node`'s assignments of the flows whose config as `node` runs it (`own`) is applied
    /// ([`ControlState::flow_config_applied`]): the units it may work on. The others wait until
    /// the leader decided on its current config of their flow.
    pub(crate) fn assignments_running(
        &self,
        node: NodeId,
        own: Option<&BTreeMap<String, String>>,
    ) -> Vec<Assignment> {
        let mut mine = self.assignments_of(node);
        mine.retain(|a| self.flow_config_applied(node, &a.unit.flow, own));
        mine
    }

    /// Whether `unit` belongs to a paused flow.
    pub(crate) fn is_paused(&self, unit: &WorkUnit) -> bool {
        self.paused_flows.contains_key(&unit.flow)
    }

    /// Gives `node` a new writer identity. Only over a revoked one (or none): an identity whose
    /// rights were never revoked must not be replaced, or its user would keep writing rights
    /// nobody tracks as current.
    fn set_identity(&mut self, node: NodeId, incarnation: u64, password: &str) -> ControlResponse {
        if !self.members.contains_key(&node) {
            return ControlResponse::Ignored(Rejection::UnknownMember);
        }
        if let Some(current) = self.identities.get(&node) {
            if current.incarnation >= incarnation {
                return ControlResponse::Ignored(Rejection::StaleIncarnation);
            }
            if !current.revoked {
                return ControlResponse::Ignored(Rejection::IdentityInUse);
            }
            self.stale_identities.insert((node, current.incarnation));
            self.target_revokes.remove(&(node, current.incarnation));
        }
        self.identities.insert(
            node,
            IdentityRecord {
                incarnation,
                password: password.to_owned(),
                fenced: false,
                revoked: false,
            },
        );
        ControlResponse::Done
    }

    /// `ControlCommand::ReplaceFencedIdentity`: `node`'s identity `fenced` (fenced, not revoked
    /// everywhere) gives way to `incarnation`; its units of `held_flows` are held until their
    /// target acknowledges `fenced`'s revoke. Its other units stay with the node: those of
    /// unfenced targets are safe with the node's new run as with any restart (the lease
    /// guards them), and those of acknowledged targets were already taken.
    fn replace_fenced_identity(
        &mut self,
        node: NodeId,
        fenced: u64,
        incarnation: u64,
        held_flows: &[String],
    ) -> ControlResponse {
        if !self.members.contains_key(&node) {
            return ControlResponse::Ignored(Rejection::UnknownMember);
        }
        match self.identities.get(&node) {
            Some(i) if i.incarnation == fenced && i.fenced && !i.revoked => {}
            _ => return ControlResponse::Ignored(Rejection::StaleIncarnation),
        }
        if incarnation <= fenced {
            return ControlResponse::Ignored(Rejection::StaleIncarnation);
        }
        self.revoke_pending.insert((node, fenced));
        for unit in self.take_units(node, held_flows) {
            self.held_units.insert(unit, (node, fenced));
        }
        self.identities.insert(
            node,
            IdentityRecord {
                incarnation,
                password: String::new(),
                fenced: false,
                revoked: false,
            },
        );
        ControlResponse::Done
    }

    /// Records that `target` acknowledged the revoke of `node`'s identity `incarnation`
    /// (fenced before), and takes the node's units of `flows` (those writing to `target`):
    /// whatever the node still has in flight there is refused, so they can go to others at
    /// once. Unconditional (unlike `Revoke`): the revoke on the target already happened, a
    /// renewal of the node cannot undo it. Units writing elsewhere stay.
    fn fence_target(
        &mut self,
        index: u64,
        node: NodeId,
        incarnation: u64,
        target: &str,
        flows: &[String],
    ) -> ControlResponse {
        let current = match self.identities.get(&node) {
            Some(identity) if identity.incarnation == incarnation && identity.fenced => true,
            _ if self.revoke_pending.contains(&(node, incarnation)) => false,
            _ => return ControlResponse::Ignored(Rejection::StaleIncarnation),
        };
        self.target_revokes
            .entry((node, incarnation))
            .or_default()
            .insert(target.to_owned());
        if !current {
            // Replaced: the node's units now are its new identity's; only what the old one
            // held there is freed.
            self.held_units
                .retain(|unit, held| *held != (node, incarnation) || !flows.contains(&unit.flow));
            return ControlResponse::Done;
        }
        if !self.take_units(node, flows).is_empty() {
            if let Some(member) = self.members.get_mut(&node) {
                member.last_revoke_index = index;
            }
        }
        ControlResponse::Done
    }

    /// Takes `node`'s units of `flows` from it (unowned, no release pending); returns them.
    fn take_units(&mut self, node: NodeId, flows: &[String]) -> Vec<WorkUnit> {
        self.units
            .iter_mut()
            .filter(|(u, r)| r.owner == Some(node) && flows.contains(&u.flow))
            .map(|(unit, rec)| {
                rec.owner = None;
                rec.release_requested = false;
                unit.clone()
            })
            .collect()
    }

    /// As leaders of earlier versions wrote it (`ControlCommand::FenceAcknowledged`): records
    /// that `node`'s identity `incarnation`, fenced before, lost its rights on every fenced
    /// target, and takes all its units. Kept so that their log entries apply as they did.
    fn fence_acknowledged(
        &mut self,
        index: u64,
        node: NodeId,
        incarnation: u64,
    ) -> ControlResponse {
        match self.identities.get_mut(&node) {
            Some(identity) if identity.incarnation == incarnation && identity.fenced => {
                identity.revoked = true;
            }
            _ => return ControlResponse::Ignored(Rejection::StaleIncarnation),
        }
        if let Some(member) = self.members.get_mut(&node) {
            member.last_revoke_index = index;
        }
        for rec in self.units.values_mut().filter(|r| r.owner == Some(node)) {
            rec.owner = None;
            rec.release_requested = false;
        }
        ControlResponse::Done
    }

    /// `node`'s writer identity, while it may write (provisioned and not fenced).
    pub(crate) fn writer_login(
        &self,
        node: NodeId,
        passwords: &WriterPasswords,
    ) -> Option<WriterLogin> {
        self.identities
            .get(&node)
            .filter(|i| !i.fenced)
            .map(|i| passwords.login(node, i.incarnation, &i.password))
    }

    /// `node`'s current writer identity: (incarnation, fenced).
    pub(crate) fn identity_of(&self, node: NodeId) -> Option<(u64, bool)> {
        self.identities
            .get(&node)
            .map(|i| (i.incarnation, i.fenced))
    }

    /// Whether `node`'s current identity may still have rights on the target cluster `target`:
    /// it has one, not revoked everywhere, and `target` did not acknowledge its revoke.
    pub(crate) fn unrevoked_on(&self, node: NodeId, target: &str) -> bool {
        self.identities.get(&node).is_some_and(|i| {
            !i.revoked
                && !self
                    .target_revokes
                    .get(&(node, i.incarnation))
                    .is_some_and(|t| t.contains(target))
        })
    }

    /// The replaced identities whose revoke is still pending, with the targets that
    /// acknowledged it so far.
    pub(crate) fn pending_revokes(&self) -> impl Iterator<Item = ((NodeId, u64), BTreeSet<&str>)> {
        self.revoke_pending
            .iter()
            .map(|(node, inc)| ((*node, *inc), self.revoked_targets(*node, *inc)))
    }

    /// Whether `unit` is held for a replaced identity's revoke (granted to nobody).
    pub(crate) fn is_held(&self, unit: &WorkUnit) -> bool {
        self.held_units.contains_key(unit)
    }

    /// The targets that acknowledged the revoke of `node`'s identity `incarnation`.
    pub(crate) fn revoked_targets(&self, node: NodeId, incarnation: u64) -> BTreeSet<&str> {
        self.target_revokes
            .get(&(node, incarnation))
            .map(|t| t.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Whether `node` holds a writer identity it may write with.
    pub(crate) fn has_writer_identity(&self, node: NodeId) -> bool {
        self.identities.get(&node).is_some_and(|i| !i.fenced)
    }

    /// Whether `node` holds a writer identity whose rights were not revoked on the targets
    /// (usable, or fenced and its revoke not yet acknowledged).
    pub(crate) fn has_unrevoked_identity(&self, node: NodeId) -> bool {
        self.identities.get(&node).is_some_and(|i| !i.revoked)
    }

    fn report_units(&mut self, flow: &str, units: &[WorkUnit]) -> ControlResponse {
        if flow.is_empty() || units.iter().any(|u| u.flow != flow) {
            return ControlResponse::Ignored(Rejection::InvalidFlow);
        }
        let listed: std::collections::BTreeSet<&WorkUnit> = units.iter().collect();
        for (unit, rec) in self.units.iter_mut().filter(|(u, _)| u.flow == flow) {
            let retire = !listed.contains(unit);
            if retire && !rec.retired && rec.owner.is_some() {
                // The owner keeps the unit until it hands it back (or its lease expires and the
                // leader revokes it): clearing the owner here would let the next report (from
                // a node whose discovery sees the topic) grant it to a second node while the
                // first is still writing.
                rec.release_requested = true;
            }
            rec.retired = retire;
        }
        for unit in units {
            self.units.entry(unit.clone()).or_default();
        }
        ControlResponse::Done
    }

    /// Drops `unit` from the state if it is retired, unowned and not held
    /// (`ControlCommand::ForgetUnits`).
    fn forget_unit(&mut self, unit: &WorkUnit) {
        let forgettable = self
            .units
            .get(unit)
            .is_some_and(|r| r.retired && r.owner.is_none())
            && !self.held_units.contains_key(unit);
        if forgettable {
            self.units.remove(unit);
            self.pending_resets.remove(unit);
            self.reset_topics.remove(unit);
            self.recorded_starts.remove(unit);
            self.session_counters.remove(unit);
        }
    }

    /// Applies `change` if the current record of its key is the one it expects (see
    /// `ControlCommand::RecordMetadata`); whether it did.
    fn record_metadata(&mut self, change: &MetadataChange) -> bool {
        if self.metadata.get(&change.key) != change.expected.as_ref() {
            return false;
        }
        match &change.record {
            Some(record) => self.metadata.insert(change.key.clone(), record.clone()),
            None => self.metadata.remove(&change.key),
        };
        true
    }

    /// Units that may leave the state (`ControlCommand::ForgetUnits`): retired, owned by
    /// nobody, not held.
    pub(crate) fn forgettable_units(&self) -> impl Iterator<Item = &WorkUnit> {
        self.units
            .iter()
            .filter(|(u, r)| r.retired && r.owner.is_none() && !self.held_units.contains_key(*u))
            .map(|(u, _)| u)
    }

    /// Flows whose units are not all retired although no member runs them: every member
    /// published its config (`PublishConfig`) and none has the flow (it was removed by a
    /// reload everywhere). The leader reports them empty, which retires their units.
    pub(crate) fn flows_nobody_runs(&self) -> BTreeSet<&str> {
        let all_published = !self.members.is_empty()
            && self
                .members
                .keys()
                .all(|n| self.config_digests.contains_key(n));
        if !all_published {
            return BTreeSet::new();
        }
        self.units
            .iter()
            .filter(|(_, r)| !r.retired)
            .map(|(u, _)| u.flow.as_str())
            .filter(|flow| {
                !self
                    .config_digests
                    .values()
                    .any(|digests| digests.contains_key(*flow))
            })
            .collect()
    }

    fn commit_one(&mut self, node: NodeId, c: &ProgressCommit) -> CommitOutcome {
        let Some(rec) = self.units.get_mut(&c.unit) else {
            return CommitOutcome::Fenced { current: None };
        };
        let current = rec.owner.map(|_| rec.epoch);
        // A retired unit's owner still holds it until it releases it: its final commit counts.
        if rec.owner != Some(node) || rec.epoch != c.epoch {
            return CommitOutcome::Fenced { current };
        }
        let p = &mut rec.progress;
        if p.confirmed.is_none() || p.history_label != c.history_label {
            // First commit, or the topic was recreated: a new history starts here.
            p.confirmed = Some(c.offset);
            p.history_label = c.history_label;
        } else {
            // Offsets never move backwards within one upstream history.
            p.confirmed = p.confirmed.max(Some(c.offset));
        }
        let copied = match &c.counters {
            CommitCounters::Since(since) => *since,
            CommitCounters::Totals { session, totals } => self
                .session_counters
                .entry(c.unit.clone())
                .or_default()
                .record(c.epoch, *session, totals),
        };
        p.counters.add(&copied);
        // The owner started where the reset (or the recorded start) said (units are reset only
        // while unowned): its commits are the unit's progress from now on.
        self.pending_resets.remove(&c.unit);
        self.reset_topics.remove(&c.unit);
        self.recorded_starts.remove(&c.unit);
        CommitOutcome::Committed
    }

    /// The units `node` owns now, in unit order. A retired unit it still owns is listed with
    /// `release_requested`, so that its pair stops and hands it back.
    pub(crate) fn assignments_of(&self, node: NodeId) -> Vec<Assignment> {
        self.units
            .iter()
            .filter(|(_, r)| r.owner == Some(node))
            .map(|(unit, r)| Assignment {
                unit: unit.clone(),
                epoch: r.epoch,
                release_requested: r.release_requested || r.retired || self.is_paused(unit),
            })
            .collect()
    }

    /// Units that are reported (not retired), not paused and have no owner (held ones too).
    pub(crate) fn unowned_units(&self) -> usize {
        self.units
            .iter()
            .filter(|(u, r)| !r.retired && r.owner.is_none() && !self.is_paused(u))
            .count()
    }

    /// Whether `node` owns `unit` under `epoch` right now.
    pub(crate) fn holds(&self, node: NodeId, unit: &WorkUnit, epoch: Epoch) -> bool {
        self.units
            .get(unit)
            .is_some_and(|r| r.owner == Some(node) && r.epoch == epoch)
    }
}

/// A level-1 commit as the level-2 one it amounts to.
fn progress_commit(c: &OffsetCommit) -> ProgressCommit {
    ProgressCommit {
        unit: c.unit.clone(),
        epoch: c.epoch,
        offset: c.offset,
        history_label: c.history_label,
        counters: CommitCounters::Since(c.counters),
    }
}

#[cfg(test)]
mod tests;
