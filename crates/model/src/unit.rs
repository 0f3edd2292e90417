//! Work units, ownership fences and confirmed progress.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Identity of a replicator instance, unique in its Raft group (the `[node] id` of its config).
pub type NodeId = u64;

/// An upstream partition offset (Iggy's `u64` offset, 0-based, assigned by the server).
pub type Offset = u64;

/// The ownership fence of a work unit.
///
/// Every grant of a unit gets a new, strictly larger epoch (the control plane uses
/// the Raft log index of the grant). A writer presents its epoch with every offset
/// commit; a commit carrying an epoch other than the unit's current one is
/// rejected, so an owner that lost its unit can no longer move its offset.
/// Distinct from the Raft `term`, which fences leaders, not partition owners.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One upstream partition of one flow: the unit of ownership and of progress.
///
/// Streams and topics are named, never numbered, because Iggy reuses numeric ids
/// after deletion and the ids differ between clusters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkUnit {
    /// The flow this unit belongs to (`[[flows]] name`), e.g. `"us-to-eu"`.
    pub flow: String,
    /// Upstream stream name, e.g. `"orders"`.
    pub stream: String,
    /// Upstream topic name, e.g. `"created"`.
    pub topic: String,
    /// Upstream partition id (0-based, as Iggy 0.8 numbers them); the same id is written downstream.
    pub partition: u32,
}

impl WorkUnit {
    /// Builds a unit from its four parts.
    pub fn new(
        flow: impl Into<String>,
        stream: impl Into<String>,
        topic: impl Into<String>,
        partition: u32,
    ) -> Self {
        Self {
            flow: flow.into(),
            stream: stream.into(),
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for WorkUnit {
    /// `flow:stream/topic/partition`, the form used in logs and the admin API.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}/{}/{}",
            self.flow, self.stream, self.topic, self.partition
        )
    }
}

/// A unit granted to a node under an epoch, as the node's coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assignment {
    /// The unit that was granted.
    pub unit: WorkUnit,
    /// The fence of this grant; commits must carry it.
    pub epoch: Epoch,
    /// Set when the leader wants the unit back (rebalance or drain): the owner
    /// should finish in-flight writes, commit, and release it.
    pub release_requested: bool,
}

/// Counters that travel with a commit and accumulate per unit in the control state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UnitCounters {
    /// Messages written downstream since the previous commit of this unit.
    pub messages: u64,
    /// Message bytes (header + payload + user headers) written since the previous commit.
    pub bytes: u64,
    /// Errors seen since the previous commit (failed polls or sends that were retried).
    pub errors: u64,
    /// Gap events (upstream retention removed offsets before they were copied) since the previous commit.
    pub gaps: u64,
}

impl UnitCounters {
    /// Adds another set of counters into this one (saturating, so a counter never wraps).
    pub fn add(&mut self, other: &UnitCounters) {
        self.messages = self.messages.saturating_add(other.messages);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.errors = self.errors.saturating_add(other.errors);
        self.gaps = self.gaps.saturating_add(other.gaps);
    }

    /// Raises each counter to `other`'s where that is higher; returns by how much they rose.
    fn raise_to(&mut self, other: &UnitCounters) -> UnitCounters {
        let rise = |mine: &mut u64, theirs: u64| {
            let by = theirs.saturating_sub(*mine);
            *mine = (*mine).max(theirs);
            by
        };
        UnitCounters {
            messages: rise(&mut self.messages, other.messages),
            bytes: rise(&mut self.bytes, other.bytes),
            errors: rise(&mut self.errors, other.errors),
            gaps: rise(&mut self.gaps, other.gaps),
        }
    }
}

/// How the counters of one commit count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitCounters {
    /// What the writer copied since its previous confirmed commit: added as they are, so a
    /// commit applied twice (a retried write) counts twice. What writer sessions that started
    /// below feature level 2 send.
    Since(UnitCounters),
    /// Everything one writer session copied so far: each counter is raised to it (see
    /// [`SessionCounters`]), so a commit applied twice, or late, counts once.
    Totals {
        /// The writer session (a random number each writer start draws).
        session: u64,
        /// Its totals since it started.
        totals: UnitCounters,
    },
}

/// A writer's commit: every upstream message of `unit` up to `offset` is downstream (as
/// [`OffsetCommit`]), and what it copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressCommit {
    /// The unit whose progress moves.
    pub unit: WorkUnit,
    /// The epoch of the writer's grant; a commit under any other epoch is fenced.
    pub epoch: Epoch,
    /// Last upstream offset written downstream.
    pub offset: Offset,
    /// The upstream history the offset belongs to (see [`OffsetCommit::history_label`]).
    pub history_label: u64,
    /// What was copied.
    pub counters: CommitCounters,
}

impl ProgressCommit {
    /// The same commit as an [`OffsetCommit`], the form of feature level 1. Totals have no
    /// such form: they count nothing there (they are only sent at level 2 and above).
    #[must_use]
    pub fn to_offset_commit(&self) -> OffsetCommit {
        OffsetCommit {
            unit: self.unit.clone(),
            epoch: self.epoch,
            offset: self.offset,
            history_label: self.history_label,
            counters: match self.counters {
                CommitCounters::Since(c) => c,
                CommitCounters::Totals { .. } => UnitCounters::default(),
            },
        }
    }
}

/// The totals of the writer sessions of a unit's current grant, each as far as its commits
/// confirmed it: what makes [`CommitCounters::Totals`] count once however often a commit is
/// applied.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionCounters {
    /// The grant the sessions write under; a commit of another grant starts over.
    pub epoch: Epoch,
    /// Sessions, oldest first, at most [`SessionCounters::MAX_SESSIONS`].
    pub sessions: Vec<(u64, UnitCounters)>,
}

impl SessionCounters {
    /// Sessions kept per grant. A writer restarts under the same grant after a failed pair or
    /// a config reload; a session's commit is in flight for a few seconds at most, so only a
    /// session older than this many restarts of one grant could count a late commit again.
    pub const MAX_SESSIONS: usize = 8;

    /// Records that `session` of the grant `epoch` copied `totals` so far; returns what that
    /// adds to the unit's counters (nothing for a commit applied before, or overtaken).
    pub fn record(&mut self, epoch: Epoch, session: u64, totals: &UnitCounters) -> UnitCounters {
        if self.epoch != epoch {
            self.epoch = epoch;
            self.sessions.clear();
        }
        let at = match self.sessions.iter().position(|(s, _)| *s == session) {
            Some(at) => at,
            None => {
                if self.sessions.len() == Self::MAX_SESSIONS {
                    self.sessions.remove(0);
                }
                self.sessions.push((session, UnitCounters::default()));
                self.sessions.len() - 1
            }
        };
        self.sessions[at].1.raise_to(totals)
    }
}

/// A writer's claim that every upstream message of `unit` up to and including
/// `offset` has been acknowledged downstream, made under `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommit {
    /// The unit whose progress moves.
    pub unit: WorkUnit,
    /// The epoch of the writer's grant; a commit under any other epoch is fenced.
    pub epoch: Epoch,
    /// Last upstream offset written downstream.
    pub offset: Offset,
    /// The label of the upstream history the offset belongs to: the upstream topic's creation
    /// time (µs since the Unix epoch) with, in its top bits, how many times the partition was
    /// reset since (`provenance::History::label` in the pipeline; the label of a history
    /// never reset is the creation time itself). A different value than the stored one starts
    /// a new history (the topic was recreated or the partition purged). Called
    /// `topic_created_at` before it held resets too; the encoding is positional, so the name
    /// is not in the log or the snapshots.
    pub history_label: u64,
    /// What was copied since this unit's previous commit.
    pub counters: UnitCounters,
}

/// What happened to one [`OffsetCommit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitOutcome {
    /// The offset was stored (or was already at or beyond it: offsets never move backwards).
    Committed,
    /// The unit is owned under another epoch (or by nobody): the writer must stop at once.
    Fenced {
        /// The unit's epoch at the time of the commit, if it is owned at all.
        current: Option<Epoch>,
    },
}

/// Confirmed progress of one unit, as stored in the replicated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UnitProgress {
    /// Last upstream offset confirmed written downstream; `None` before the first commit.
    pub confirmed: Option<Offset>,
    /// The upstream history `confirmed` belongs to (see [`OffsetCommit::history_label`]).
    pub history_label: u64,
    /// Totals over the unit's life.
    pub counters: UnitCounters,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_displays_as_flow_stream_topic_partition() {
        let unit = WorkUnit::new("us-eu", "orders", "created", 3);
        assert_eq!(unit.to_string(), "us-eu:orders/created/3");
    }

    #[test]
    fn counters_add_saturates_instead_of_wrapping() {
        let mut total = UnitCounters {
            messages: u64::MAX - 1,
            ..Default::default()
        };
        total.add(&UnitCounters {
            messages: 5,
            bytes: 7,
            errors: 1,
            gaps: 2,
        });
        assert_eq!(total.messages, u64::MAX);
        assert_eq!((total.bytes, total.errors, total.gaps), (7, 1, 2));
    }

    #[test]
    fn session_totals_count_once_however_often_and_late_they_arrive() {
        let totals = |messages| UnitCounters {
            messages,
            ..Default::default()
        };
        let mut s = SessionCounters::default();
        assert_eq!(s.record(Epoch(5), 1, &totals(10)).messages, 10);
        assert_eq!(
            s.record(Epoch(5), 1, &totals(10)).messages,
            0,
            "applied twice"
        );
        assert_eq!(s.record(Epoch(5), 1, &totals(25)).messages, 15);
        assert_eq!(
            s.record(Epoch(5), 1, &totals(20)).messages,
            0,
            "late, overtaken"
        );
        // A restarted writer of the same grant counts from zero, beside the first.
        assert_eq!(s.record(Epoch(5), 2, &totals(4)).messages, 4);
        assert_eq!(s.record(Epoch(5), 1, &totals(25)).messages, 0);
        // A new grant starts over.
        assert_eq!(s.record(Epoch(9), 1, &totals(3)).messages, 3);
        assert_eq!(s.sessions.len(), 1);
    }

    #[test]
    fn sessions_of_one_grant_are_bounded() {
        let mut s = SessionCounters::default();
        for session in 0..20 {
            s.record(Epoch(1), session, &UnitCounters::default());
        }
        assert_eq!(s.sessions.len(), SessionCounters::MAX_SESSIONS);
        assert_eq!(s.sessions[0].0, 20 - SessionCounters::MAX_SESSIONS as u64);
    }

    #[test]
    fn epochs_order_by_number() {
        assert!(Epoch(9) < Epoch(10));
    }
}

/// Where a unit's copy of one upstream history starts, as its first owner resolved it from the
/// flow's initial offset (`latest` is the partition's end at that moment). Recorded in the
/// control plane before the first poll, so that a later owner starts at the same place until
/// the unit's first commit, whoever started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitStart {
    /// The first upstream offset to copy.
    pub next: Offset,
    /// The upstream history it was resolved for (see [`OffsetCommit::history_label`]).
    pub history_label: u64,
}

/// A pending [`OffsetReset`] and the upstream topic it was decided for: its creation time (µs),
/// unknown for resets written by versions that did not record it. A writer that finds another
/// topic of the same name upstream (recreated since) drops the reset: its offsets were about
/// the old topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitReset {
    /// Where the next owner starts.
    pub reset: OffsetReset,
    /// Creation time (µs) of the upstream topic the reset was decided for.
    pub topic_created_at: Option<u64>,
}

/// Where an operator reset a unit (`flow reset`): its next owner starts copying at `next`
/// instead of after its confirmed offset. Pending until that owner's first commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetReset {
    /// The first upstream offset to copy.
    pub next: Offset,
    /// Copy from `next` even if the target already holds copies at or after it. Without it
    /// the writer starts after the last copy of ours it finds downstream when that is past
    /// `next` (the usual tail scan), so a reset never writes a message twice.
    pub allow_duplicates: bool,
}
