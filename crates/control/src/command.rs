//! `ControlCommand`, the only application payload written to the Raft log, and its response.
//!
//! The log is encoded with bincode, which writes enum variants *by index*: variants are only
//! ever appended at the end, never reordered or removed, and `tests::golden_bytes` pins the
//! encoding of every variant so that an accidental change fails the build's tests.

use std::collections::BTreeMap;

use replicator_model::{
    CommitOutcome, Epoch, MetadataChange, NodeId, Offset, OffsetCommit, ProgressCommit, UnitStart,
    WorkUnit,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One replicated state change. Applied deterministically by `ControlState::apply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ControlCommand {
    /// Sent by a node for itself (lease renewer): add it as an `Active` member or refresh its
    /// addresses. Re-registering a `Leaving` member makes it `Active` again.
    RegisterMember {
        /// The node registering.
        node: NodeId,
        /// Its advertised Raft address, e.g. `10.0.0.1:7100`.
        raft_addr: String,
        /// Its advertised admin API address, e.g. `10.0.0.1:7200`.
        api_addr: String,
    },
    /// Marks a member `Leaving`: it gets no new units and the leader asks for its units back.
    LeaveMember {
        /// The member that leaves.
        node: NodeId,
    },
    /// Sent by every node every `lease_renew_interval`: one small entry per node, independent
    /// of how many units it owns.
    RenewLease {
        /// The renewing member.
        node: NodeId,
    },
    /// The full current set of units of one flow (from upstream discovery). Units of the flow
    /// that are not listed are retired (unassigned, progress kept).
    ReportUnits {
        /// The flow the set belongs to; units naming another flow are ignored.
        flow: String,
        /// Every unit the flow has now.
        units: Vec<WorkUnit>,
    },
    /// Leader only: gives an unowned unit to an active member; the epoch becomes the entry's
    /// log index.
    Grant {
        /// The unit to grant.
        unit: WorkUnit,
        /// The new owner.
        node: NodeId,
    },
    /// Leader only: asks the owner (under `epoch`) to hand the unit back.
    RequestRelease {
        /// The unit wanted back.
        unit: WorkUnit,
        /// The grant the request is about; ignored if the unit moved since.
        epoch: Epoch,
    },
    /// Sent by the owner: it stopped writing the unit and hands it back.
    Release {
        /// The unit handed back.
        unit: WorkUnit,
        /// The owner's epoch; ignored if it is not current.
        epoch: Epoch,
        /// The owner.
        node: NodeId,
    },
    /// Leader only: takes a unit from an owner whose lease expired. Applies only if the
    /// owner's last renewal is still the one the leader judged expired (`renewal_index`), so a
    /// renewal that raced the decision wins deterministically.
    Revoke {
        /// The unit taken away.
        unit: WorkUnit,
        /// The grant being revoked.
        epoch: Epoch,
        /// The owner's `last_renewal_index` the leader saw expire.
        renewal_index: u64,
    },
    /// Sent by an owner's commit batcher: many units' confirmed offsets in one entry.
    CommitOffsets {
        /// The committing node; must own every unit under the given epochs.
        node: NodeId,
        /// The commits, each answered by one `CommitOutcome` in the same order.
        commits: Vec<OffsetCommit>,
    },
    /// Removes a member record; only applies when it owns no unit any more.
    RemoveMember {
        /// The member to forget.
        node: NodeId,
    },
    /// Several commands applied in order at the same log index (one assignment round).
    /// Batches do not nest.
    Batch(Vec<ControlCommand>),
    /// Leader only, with fencing on: `node` writes as its identity `incarnation` from now on.
    /// Applies only over no identity or a revoked one, and only to a higher incarnation. The
    /// leader then makes sure the identity's user exists on every fenced target before it
    /// grants the node a unit writing there (see `fence`).
    SetWriterIdentity {
        /// The member.
        node: NodeId,
        /// The new incarnation (one above the previous one).
        incarnation: u64,
        /// Empty since passwords are derived from the cluster secret (`WriterPasswords`); an
        /// identity of an older leader carries the random password it chose.
        password: String,
    },
    /// With fencing on: the leader decided to fence `node`'s identity `incarnation`, or the
    /// node itself gave it up (a target refused its login: it gets the next one instead). The
    /// leader revokes the user's rights on the targets only after this entry is committed (so
    /// a leader cut off from the majority revokes nobody). The node stops writing as that
    /// identity; its units stay with it until each target acknowledged (`FenceTarget`).
    FenceMember {
        /// The member fenced.
        node: NodeId,
        /// The identity to revoke.
        incarnation: u64,
    },
    /// Leader only: the user of a stale identity is revoked and inactive on every target cluster
    /// (it stays there: see `WriterFence::revoke`); its incarnation is remembered as forgotten.
    ForgetIdentity {
        /// The member the identity belonged to.
        node: NodeId,
        /// The stale incarnation.
        incarnation: u64,
    },
    /// Written by leaders of earlier versions, after `FenceMember`: every fenced target
    /// cluster acknowledged the revoke of the identity's rights. Takes all the member's units
    /// at once, also those writing to unfenced targets (which must wait for the lease): the
    /// leader now writes `FenceTarget` and `IdentityRevoked` instead; still applied as it was.
    FenceAcknowledged {
        /// The member fenced.
        node: NodeId,
        /// The identity whose rights are gone.
        incarnation: u64,
    },
    /// An operator paused or resumed a flow cluster-wide (`flow pause|resume`, `flow
    /// promote`). A paused flow's units are asked back from their owners (who finish the batch
    /// in flight, commit and release) and granted to nobody until it is resumed; resuming
    /// grants them again, and each resumes after its confirmed offset and the downstream tail.
    SetFlowPaused {
        /// The flow.
        flow: String,
        /// Paused (`true`) or running.
        paused: bool,
        /// Who asked, for the record (e.g. `admin-api@10.0.0.5:51234`).
        requested_by: String,
        /// When the node that took the request received it, Unix milliseconds (carried in the
        /// entry: `apply` reads no clock).
        at_unix_ms: u64,
    },
    /// An operator moved where units of a paused flow resume (`flow reset`). All or nothing:
    /// refused unless the flow is paused, every unit is known, current and owned by nobody
    /// (an owner's final commit would undo it), and, without `allow_duplicates`, every new
    /// start is past the unit's confirmed offset.
    ResetOffsets {
        /// The flow; every unit must belong to it.
        flow: String,
        /// Each unit and the first upstream offset its next owner copies.
        resets: Vec<(WorkUnit, Offset)>,
        /// Allow starts at or below confirmed offsets (messages the target holds are copied
        /// again).
        allow_duplicates: bool,
        /// Who asked, for the record.
        requested_by: String,
        /// When, Unix milliseconds.
        at_unix_ms: u64,
    },
    /// Sent by a node at start and after every config reload: a digest of each of its flows'
    /// config (the flow, its two clusters, the residency policies). Units of a flow are granted
    /// only to members whose digest for it equals the leader's (see `assign`).
    PublishConfig {
        /// The node.
        node: NodeId,
        /// Digest per flow name, every flow of its config.
        digests: BTreeMap<String, String>,
    },
    /// Sent by a unit's owner before its first poll when nothing is confirmed for the history
    /// it copies: where that copy starts, resolved from the flow's initial offset. Applies only
    /// from the owner under its current epoch, and only when no start is recorded for that
    /// history yet (the first owner's start stands); the unit's first commit clears it.
    RecordStart {
        /// The owner.
        node: NodeId,
        /// The unit.
        unit: WorkUnit,
        /// The owner's epoch.
        epoch: Epoch,
        /// The start.
        start: UnitStart,
    },
    /// `ResetOffsets` that names, for each unit, the upstream topic it was decided for (its
    /// creation time, µs): a writer that finds the topic recreated since drops the reset
    /// (its offsets were about the old topic). What `flow reset` writes.
    ResetTopicOffsets {
        /// The flow; every unit must belong to it.
        flow: String,
        /// Each unit, the first upstream offset its next owner copies, and the creation time
        /// of the upstream topic those offsets are about.
        resets: Vec<(WorkUnit, Offset, u64)>,
        /// As in `ResetOffsets`.
        allow_duplicates: bool,
        /// Who asked, for the record.
        requested_by: String,
        /// When, Unix milliseconds.
        at_unix_ms: u64,
    },
    /// Leader only, after `FenceMember`: the target cluster `target` acknowledged that the
    /// identity's user has no rights left there. Takes the member's units of `flows` (the
    /// flows that write to `target` in the leader's config): whatever the member still sends
    /// there is refused. Its units writing elsewhere stay until their own target acknowledged,
    /// or, for an unfenced target, until its lease expired (`Revoke`).
    FenceTarget {
        /// The member fenced.
        node: NodeId,
        /// The identity whose rights on `target` are gone.
        incarnation: u64,
        /// The target cluster alias.
        target: String,
        /// The flows writing to `target`.
        flows: Vec<String>,
    },
    /// Leader only: every fenced target acknowledged the revoke of the identity (each with a
    /// `FenceTarget`). Takes no unit; the member may get its next identity.
    IdentityRevoked {
        /// The member fenced.
        node: NodeId,
        /// The identity revoked everywhere.
        incarnation: u64,
    },
    /// Leader only: the member, fenced and live again, gets its next identity before every
    /// fenced target acknowledged the old one's revoke (a target may be down for hours; the
    /// member works on the others meanwhile). The old identity's revoke goes on, target by
    /// target; its units of `held_flows` (those writing to a target that did not acknowledge
    /// yet) are held, granted to nobody, until that target's `FenceTarget` for the old
    /// identity frees them.
    ReplaceFencedIdentity {
        /// The member.
        node: NodeId,
        /// The fenced identity replaced (its revoke is still pending somewhere).
        fenced: u64,
        /// The next incarnation (one above every incarnation the member ever had).
        incarnation: u64,
        /// Flows writing to a fenced target that did not acknowledge `fenced`'s revoke yet.
        held_flows: Vec<String>,
    },
    /// Sent by a node for itself, once registered and whenever the state names another
    /// level for it: the highest feature level its build supports (see `format`).
    PublishFeatures {
        /// The node.
        node: NodeId,
        /// The highest feature level it reads and writes.
        level: u32,
    },
    /// Leader only: the cluster runs at feature level `level` from now on. Applies only above
    /// the current level and when every member published a level at or above it.
    RaiseFeatureLevel {
        /// The new level.
        level: u32,
    },
    /// `CommitOffsets` whose counters may be a writer session's totals, which count once
    /// however often the entry is applied (feature level 2).
    CommitProgress {
        /// The committing node; must own every unit under the given epochs.
        node: NodeId,
        /// The commits, each answered by one `CommitOutcome` in the same order.
        commits: Vec<ProgressCommit>,
    },
    /// Leader only: the units leave the state (feature level 2). Applies to each unit that is
    /// retired, owned by nobody and not held, and drops what the state kept about it: a unit
    /// of a deleted topic or of a flow no member runs any more. A unit reported again later
    /// starts like a new one (its resume point then comes from the downstream tail).
    ForgetUnits {
        /// The units.
        units: Vec<WorkUnit>,
    },
    /// Sent by the node running a two-way flow's metadata sync: what the control plane
    /// remembers of the objects the pair syncs (feature level 3). Each change applies only if
    /// the current record of its key equals its `expected` one (`None`: there is none), in
    /// order, so a later change sees what the earlier ones did; answered by
    /// `ControlResponse::MetadataRecorded`.
    RecordMetadata {
        /// The compare-and-set changes, each answered by one flag in the same order.
        changes: Vec<MetadataChange>,
    },
}

impl ControlCommand {
    /// Whether applying it can change which units a node owns, under which epoch, or whether
    /// their release is requested. Lease renewals and commits (nearly every entry of a busy
    /// cluster) cannot, so the state machine skips republishing assignments after them and
    /// an apply costs the same with 10 or 10,000 units.
    pub(crate) fn changes_assignments(&self) -> bool {
        match self {
            ControlCommand::ReportUnits { .. }
            | ControlCommand::Grant { .. }
            | ControlCommand::RequestRelease { .. }
            | ControlCommand::Release { .. }
            | ControlCommand::Revoke { .. }
            | ControlCommand::FenceAcknowledged { .. }
            | ControlCommand::FenceTarget { .. }
            | ControlCommand::ReplaceFencedIdentity { .. }
            | ControlCommand::SetFlowPaused { .. } => true,
            // Only units without an owner are reset.
            ControlCommand::ResetOffsets { .. } => false,
            // A config changes who may get units, which the next assignment round acts on, and
            // which of its units a node runs (`ControlState::assignments_running`).
            ControlCommand::PublishConfig { .. } => true,
            ControlCommand::RecordStart { .. } | ControlCommand::ResetTopicOffsets { .. } => false,
            ControlCommand::SetWriterIdentity { .. }
            | ControlCommand::FenceMember { .. }
            | ControlCommand::IdentityRevoked { .. }
            | ControlCommand::ForgetIdentity { .. } => false,
            ControlCommand::RegisterMember { .. }
            | ControlCommand::LeaveMember { .. }
            | ControlCommand::RenewLease { .. }
            | ControlCommand::CommitOffsets { .. }
            | ControlCommand::CommitProgress { .. }
            | ControlCommand::RemoveMember { .. } => false,
            // Only units nobody owns leave.
            ControlCommand::ForgetUnits { .. } => false,
            // Records of two-way pairs' metadata, no unit.
            ControlCommand::RecordMetadata { .. } => false,
            ControlCommand::PublishFeatures { .. } | ControlCommand::RaiseFeatureLevel { .. } => {
                false
            }
            ControlCommand::Batch(cmds) => cmds.iter().any(ControlCommand::changes_assignments),
        }
    }

    /// Whether applying it can change what the leader's next round decides (see
    /// `assign::Quiet`). Every command can, except a lease renewal: it only moves the member's
    /// renewal index, which a round reads through the leases it judges, and those are part of
    /// the round's inputs on their own. An idle cluster applies nothing but renewals, so its
    /// leader decides nothing round after round without walking every unit.
    pub(crate) fn can_change_rounds(&self) -> bool {
        match self {
            ControlCommand::RenewLease { .. } => false,
            ControlCommand::Batch(cmds) => cmds.iter().any(ControlCommand::can_change_rounds),
            _ => true,
        }
    }
}

#[cfg(test)]
impl ControlCommand {
    /// `FenceTarget` of `node`'s identity `incarnation` on `target`, taking `flows`' units.
    pub(crate) fn fence_target(
        node: NodeId,
        incarnation: u64,
        target: &str,
        flows: &[&str],
    ) -> Self {
        ControlCommand::FenceTarget {
            node,
            incarnation,
            target: target.into(),
            flows: flows.iter().map(|f| (*f).to_owned()).collect(),
        }
    }
}

/// Why an applied command changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Rejection {
    /// The node is not a member.
    UnknownMember,
    /// The unit is not known (never reported).
    UnknownUnit,
    /// The unit is retired (no longer reported by discovery).
    Retired,
    /// A grant for a unit that already has an owner.
    AlreadyOwned,
    /// The epoch in the command is not the unit's current one (or the node is not the owner).
    StaleEpoch,
    /// The target member is leaving and takes no new work.
    MemberLeaving,
    /// A revoke raced a lease renewal of the owner, which wins.
    LeaseRenewed,
    /// The member still owns units.
    StillOwnsUnits,
    /// A batch inside a batch.
    NestedBatch,
    /// The flow's name is empty or a unit names another flow.
    InvalidFlow,
    /// A writer identity at or below the member's current incarnation.
    StaleIncarnation,
    /// A new writer identity over one that was never fenced.
    IdentityInUse,
    /// No such stale writer identity.
    UnknownIdentity,
    /// The unit's flow is paused: nothing of it is granted.
    FlowPaused,
    /// An offset reset of a flow that is not paused.
    FlowRunning,
    /// An offset reset of a unit that still has an owner.
    StillOwned,
    /// An offset reset at or below a confirmed offset without `allow_duplicates`.
    WouldDuplicate,
    /// A start recorded for a history that a start is recorded for already, or that has
    /// confirmed progress.
    StartKnown,
    /// The unit is held for a replaced identity's revoke (`ReplaceFencedIdentity`).
    HeldForRevoke,
    /// A feature level at or below the cluster's, or above what a member supports.
    FeatureLevel,
}

/// The result of applying one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ControlResponse {
    /// A membership or blank entry (no application payload).
    Empty,
    /// The command changed the state as asked.
    Done,
    /// The command was valid but changed nothing, and why.
    Ignored(Rejection),
    /// A lease renewal was recorded. `revoked_since_previous` is true when one of the node's
    /// units was revoked since its previous renewal: the renewer must not extend its lease on
    /// this one (see the lease argument in the crate docs).
    Renewed {
        /// A revoke of this node's units was applied since its previous renewal.
        revoked_since_previous: bool,
    },
    /// A grant succeeded under this epoch.
    Granted {
        /// The new epoch (the entry's log index).
        epoch: Epoch,
    },
    /// One outcome per commit, in order.
    Commits(Vec<CommitOutcome>),
    /// One response per batched command, in order.
    Batch(Vec<ControlResponse>),
    /// One flag per change of a `RecordMetadata`, in order: `true` when it was applied.
    MetadataRecorded(Vec<bool>),
}

/// The bincode configuration of everything this crate stores or sends.
pub(crate) fn codec() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes a value with the crate's bincode configuration.
pub(crate) fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, codec()).map_err(|e| Error::Codec {
        what,
        reason: e.to_string(),
    })
}

/// Decodes a value written by [`encode`]; trailing bytes are an error.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T> {
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, codec()).map_err(|e| Error::Codec {
            what,
            reason: e.to_string(),
        })?;
    if used != bytes.len() {
        return Err(Error::Codec {
            what,
            reason: format!("{} trailing bytes", bytes.len() - used),
        });
    }
    Ok(value)
}

#[cfg(test)]
pub(crate) mod tests {
    use replicator_model::{
        ClusterPair, CommitCounters, MetadataKey, MetadataObject, MetadataRecord, UnitCounters,
    };

    use super::*;

    fn unit() -> WorkUnit {
        WorkUnit::new("f", "s", "t", 1)
    }

    /// Every variant, in declaration order, with its pinned encoding. A failure here means the
    /// log format changed: existing data dirs would decode differently.
    pub(crate) fn golden() -> Vec<(ControlCommand, &'static str)> {
        vec![
            (
                ControlCommand::RegisterMember {
                    node: 1,
                    raft_addr: "a".into(),
                    api_addr: "b".into(),
                },
                "000101610162",
            ),
            (ControlCommand::LeaveMember { node: 2 }, "0102"),
            (ControlCommand::RenewLease { node: 3 }, "0203"),
            (
                ControlCommand::ReportUnits {
                    flow: "f".into(),
                    units: vec![unit()],
                },
                "0301660101660173017401",
            ),
            (
                ControlCommand::Grant {
                    unit: unit(),
                    node: 4,
                },
                "040166017301740104",
            ),
            (
                ControlCommand::RequestRelease {
                    unit: unit(),
                    epoch: Epoch(5),
                },
                "050166017301740105",
            ),
            (
                ControlCommand::Release {
                    unit: unit(),
                    epoch: Epoch(6),
                    node: 7,
                },
                "06016601730174010607",
            ),
            (
                ControlCommand::Revoke {
                    unit: unit(),
                    epoch: Epoch(8),
                    renewal_index: 300,
                },
                "070166017301740108fb2c01",
            ),
            (
                ControlCommand::CommitOffsets {
                    node: 9,
                    commits: vec![OffsetCommit {
                        unit: unit(),
                        epoch: Epoch(10),
                        offset: 11,
                        history_label: 12,
                        counters: UnitCounters {
                            messages: 1,
                            bytes: 2,
                            errors: 3,
                            gaps: 4,
                        },
                    }],
                },
                "080901016601730174010a0b0c01020304",
            ),
            (ControlCommand::RemoveMember { node: 13 }, "090d"),
            (
                ControlCommand::Batch(vec![ControlCommand::RenewLease { node: 1 }]),
                "0a010201",
            ),
            (
                ControlCommand::SetWriterIdentity {
                    node: 2,
                    incarnation: 3,
                    password: "pw".into(),
                },
                "0b0203027077",
            ),
            (
                ControlCommand::FenceMember {
                    node: 4,
                    incarnation: 5,
                },
                "0c0405",
            ),
            (
                ControlCommand::ForgetIdentity {
                    node: 6,
                    incarnation: 7,
                },
                "0d0607",
            ),
            (
                ControlCommand::FenceAcknowledged {
                    node: 8,
                    incarnation: 9,
                },
                "0e0809",
            ),
            (
                ControlCommand::SetFlowPaused {
                    flow: "f".into(),
                    paused: true,
                    requested_by: "o".into(),
                    at_unix_ms: 2,
                },
                "0f016601016f02",
            ),
            (
                ControlCommand::ResetOffsets {
                    flow: "f".into(),
                    resets: vec![(unit(), 3)],
                    allow_duplicates: true,
                    requested_by: "o".into(),
                    at_unix_ms: 4,
                },
                "10016601016601730174010301016f04",
            ),
            (
                ControlCommand::PublishConfig {
                    node: 5,
                    digests: BTreeMap::from([("f".to_owned(), "d".to_owned())]),
                },
                "11050101660164",
            ),
            (
                ControlCommand::RecordStart {
                    node: 1,
                    unit: unit(),
                    epoch: Epoch(2),
                    start: UnitStart {
                        next: 3,
                        history_label: 4,
                    },
                },
                "120101660173017401020304",
            ),
            (
                ControlCommand::ResetTopicOffsets {
                    flow: "f".into(),
                    resets: vec![(unit(), 3, 9)],
                    allow_duplicates: false,
                    requested_by: "o".into(),
                    at_unix_ms: 4,
                },
                "1301660101660173017401030900016f04",
            ),
            (
                ControlCommand::FenceTarget {
                    node: 1,
                    incarnation: 2,
                    target: "t".into(),
                    flows: vec!["f".into()],
                },
                "1401020174010166",
            ),
            (
                ControlCommand::IdentityRevoked {
                    node: 3,
                    incarnation: 4,
                },
                "150304",
            ),
            (
                ControlCommand::ReplaceFencedIdentity {
                    node: 3,
                    fenced: 4,
                    incarnation: 5,
                    held_flows: vec!["b".into()],
                },
                "16030405010162",
            ),
            (
                ControlCommand::PublishFeatures { node: 2, level: 1 },
                "170201",
            ),
            (ControlCommand::RaiseFeatureLevel { level: 1 }, "1801"),
            (
                ControlCommand::CommitProgress {
                    node: 9,
                    commits: vec![
                        ProgressCommit {
                            unit: unit(),
                            epoch: Epoch(10),
                            offset: 11,
                            history_label: 12,
                            counters: CommitCounters::Totals {
                                session: 13,
                                totals: UnitCounters {
                                    messages: 1,
                                    bytes: 2,
                                    errors: 3,
                                    gaps: 4,
                                },
                            },
                        },
                        ProgressCommit {
                            unit: unit(),
                            epoch: Epoch(10),
                            offset: 14,
                            history_label: 12,
                            counters: CommitCounters::Since(UnitCounters::default()),
                        },
                    ],
                },
                "190902016601730174010a0b0c010d01020304016601730174010a0e0c0000000000",
            ),
            (
                ControlCommand::ForgetUnits {
                    units: vec![unit()],
                },
                "1a0101660173017401",
            ),
            (
                ControlCommand::RecordMetadata {
                    changes: vec![MetadataChange {
                        key: MetadataKey {
                            pair: ClusterPair::new("b", "a"),
                            object: MetadataObject::Topic {
                                stream: "s".into(),
                                topic: "t".into(),
                            },
                        },
                        expected: None,
                        record: Some(MetadataRecord {
                            home: "a".into(),
                            agreed: BTreeMap::from([("c".to_owned(), 2)]),
                        }),
                    }],
                },
                "1b010161016201017301740001016101016302",
            ),
        ]
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn golden_bytes() {
        for (cmd, expected) in golden() {
            let bytes = encode("command", &cmd).expect("commands always encode");
            assert2::check!(hex(&bytes) == expected, "variant {cmd:?}");
            let back: ControlCommand = decode("command", &bytes).expect("own encoding decodes");
            assert2::check!(back == cmd);
        }
    }

    #[test]
    fn golden_covers_every_variant() {
        // Adding a variant without a golden entry fails here: the match below is exhaustive
        // and the count must equal the golden list's length.
        let count = |c: &ControlCommand| match c {
            ControlCommand::RegisterMember { .. } => 0,
            ControlCommand::LeaveMember { .. } => 1,
            ControlCommand::RenewLease { .. } => 2,
            ControlCommand::ReportUnits { .. } => 3,
            ControlCommand::Grant { .. } => 4,
            ControlCommand::RequestRelease { .. } => 5,
            ControlCommand::Release { .. } => 6,
            ControlCommand::Revoke { .. } => 7,
            ControlCommand::CommitOffsets { .. } => 8,
            ControlCommand::RemoveMember { .. } => 9,
            ControlCommand::Batch(_) => 10,
            ControlCommand::SetWriterIdentity { .. } => 11,
            ControlCommand::FenceMember { .. } => 12,
            ControlCommand::ForgetIdentity { .. } => 13,
            ControlCommand::FenceAcknowledged { .. } => 14,
            ControlCommand::SetFlowPaused { .. } => 15,
            ControlCommand::ResetOffsets { .. } => 16,
            ControlCommand::PublishConfig { .. } => 17,
            ControlCommand::RecordStart { .. } => 18,
            ControlCommand::ResetTopicOffsets { .. } => 19,
            ControlCommand::FenceTarget { .. } => 20,
            ControlCommand::IdentityRevoked { .. } => 21,
            ControlCommand::ReplaceFencedIdentity { .. } => 22,
            ControlCommand::PublishFeatures { .. } => 23,
            ControlCommand::RaiseFeatureLevel { .. } => 24,
            ControlCommand::CommitProgress { .. } => 25,
            ControlCommand::ForgetUnits { .. } => 26,
            ControlCommand::RecordMetadata { .. } => 27,
        };
        let indexes: Vec<usize> = golden().iter().map(|(c, _)| count(c)).collect();
        assert2::check!(indexes == (0..=27).collect::<Vec<_>>());
    }

    #[test]
    fn only_ownership_commands_change_assignments() {
        check_changes(&ControlCommand::RenewLease { node: 1 }, false);
        check_changes(
            &ControlCommand::CommitOffsets {
                node: 1,
                commits: Vec::new(),
            },
            false,
        );
        check_changes(
            &ControlCommand::Grant {
                unit: unit(),
                node: 1,
            },
            true,
        );
        check_changes(
            &ControlCommand::Batch(vec![
                ControlCommand::RenewLease { node: 1 },
                ControlCommand::Release {
                    unit: unit(),
                    epoch: Epoch(2),
                    node: 1,
                },
            ]),
            true,
        );
        check_changes(
            &ControlCommand::Batch(vec![ControlCommand::RenewLease { node: 1 }]),
            false,
        );
        check_changes(
            &ControlCommand::RecordMetadata {
                changes: Vec::new(),
            },
            false,
        );
    }

    fn check_changes(cmd: &ControlCommand, expected: bool) {
        assert2::check!(cmd.changes_assignments() == expected, "{cmd:?}");
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode("command", &ControlCommand::RenewLease { node: 1 })
            .expect("commands always encode");
        bytes.push(0);
        assert!(decode::<ControlCommand>("command", &bytes).is_err());
    }
}
