//! The narrow view of the control plane the pipeline needs, and its error.
//!
//! The Raft control crate implements this through an adapter in the binary;
//! [`InMemoryControl`](crate::InMemoryControl) implements it for one node without Raft.

use std::future::Future;
use std::time::Instant;

use std::collections::BTreeMap;

use replicator_model::{
    Assignment, ClusterPair, CommitOutcome, Epoch, MetadataChange, MetadataObject, MetadataRecord,
    ProgressCommit, UnitProgress, UnitReset, UnitStart, WorkUnit, WriterLogin,
};
use tokio::sync::watch;

/// A control-plane failure as the pipeline sees it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct ControlError {
    /// Rendered error of the implementation (its type belongs to another crate).
    pub reason: String,
    /// Whether retrying later can succeed (leader change, timeout), as the implementation knows.
    pub transient: bool,
}

/// What became of a unit report ([`ControlPlane::report_units`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitReport {
    /// The control plane has the set (written now, or it held it already).
    Reported,
    /// Not reported: the control plane cannot take it yet (a cluster that is starting has no
    /// leader yet, or has not applied the leader's config of the flow). Discovery reports again
    /// soon instead of a whole discovery interval later: until a report is taken, a new cluster
    /// has nothing to assign.
    Deferred,
}

/// What the pipeline asks of the control plane. Implementations are cheap to clone (a handle).
pub trait ControlPlane: Clone + Send + Sync + 'static {
    /// This node's assignments, updated whenever they change.
    fn assignments(&self) -> watch::Receiver<Vec<Assignment>>;

    /// Until when this node's ownership lease is valid; `None` when it holds no valid lease.
    fn lease_valid_until(&self) -> Option<Instant>;

    /// Like [`ControlPlane::lease_valid_until`], but `None` also when this node no longer owns
    /// `unit` under `epoch`. Writers check this one call before every send.
    ///
    /// The lease must be read *before* the ownership: a lease extended by a renewal that
    /// followed a revoke is then never paired with the revoked grant (the renewal was applied
    /// after the revoke, so the ownership read after it shows the revoke). The default follows
    /// that order over [`ControlPlane::assignments`]; implementations whose assignments watch
    /// may lag their applied state override it to read the state itself.
    fn lease_valid_for(&self, unit: &WorkUnit, epoch: Epoch) -> Option<Instant> {
        let lease = self.lease_valid_until()?;
        let owned = self
            .assignments()
            .borrow()
            .iter()
            .any(|a| a.epoch == epoch && a.unit == *unit);
        owned.then_some(lease)
    }

    /// This node's writer identity for the fenced target clusters (`None`: none yet, or
    /// fenced). The default never has one: for control planes without fencing, whose
    /// pipelines have no fenced targets.
    fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        watch::channel(None).1
    }

    /// Gives up this node's writer identity `incarnation` after a fenced target refused its
    /// login: the control plane fences it and provisions the next one. `Ok(false)`: it is not
    /// the current identity any more. The default has nothing to give up (control planes
    /// without fencing).
    fn abandon_writer_identity(
        &self,
        incarnation: u64,
    ) -> impl Future<Output = Result<bool, ControlError>> + Send {
        let _ = incarnation;
        async { Ok(false) }
    }

    /// Confirmed progress of a unit from the local state, `None` if it was never committed.
    fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress>;

    /// Where an operator reset the unit (`flow reset`), and for which upstream topic, until
    /// its next owner's first commit.
    fn pending_reset(&self, unit: &WorkUnit) -> Option<UnitReset>;

    /// Where an earlier owner's copy of the unit started ([`ControlPlane::record_start`]),
    /// until the unit's first commit.
    fn recorded_start(&self, unit: &WorkUnit) -> Option<UnitStart>;

    /// Records, before the first poll, where this node's copy of `unit` (owned under `epoch`)
    /// starts when nothing is confirmed for the history it copies, so that a later owner
    /// starts there too. `Ok(false)`: a start of that history was recorded already, or it has
    /// confirmed progress (read them again). Fails when the node does not own the unit under
    /// `epoch` any more.
    fn record_start(
        &self,
        unit: &WorkUnit,
        epoch: Epoch,
        start: UnitStart,
    ) -> impl Future<Output = Result<bool, ControlError>> + Send;

    /// Whether a writer starting now sends its session's totals
    /// ([`CommitCounters::Totals`](replicator_model::CommitCounters), which count once however
    /// often a commit is applied) rather than what it copied since its previous commit. Once
    /// true, never false again. The default never does.
    fn counts_totals(&self) -> bool {
        false
    }

    /// Whether writers stamp the compact provenance format (`provenance::Format::Compact`):
    /// only once every member of the cluster reads it (feature level 4), since a member of an
    /// older release resumes from a downstream tail it must be able to read. Once true, never
    /// false again. The default never does.
    fn stamps_compact_provenance(&self) -> bool {
        false
    }

    /// Commits offsets (the implementation may batch them with other callers'); one outcome per
    /// commit, in order.
    fn commit(
        &self,
        commits: Vec<ProgressCommit>,
    ) -> impl Future<Output = Result<Vec<CommitOutcome>, ControlError>> + Send;

    /// Reports the full set of units discovered for a flow; units no longer present are retired
    /// (unassigned, progress kept). [`UnitReport::Deferred`] when the control plane cannot take
    /// it yet.
    fn report_units(
        &self,
        flow: &str,
        units: Vec<WorkUnit>,
    ) -> impl Future<Output = Result<UnitReport, ControlError>> + Send;

    /// What the control plane remembers of the objects the two-way pair `pair` syncs (see
    /// `replicator_model::MetadataRecord`), from the local state; `None` when it cannot keep
    /// such records (yet): a cluster below the feature level that stores them, or a control
    /// plane without them (the default). The metadata sync then leaves the pair's objects
    /// alone rather than guess where they were authored.
    fn metadata_records(
        &self,
        pair: &ClusterPair,
    ) -> Option<BTreeMap<MetadataObject, MetadataRecord>> {
        let _ = pair;
        None
    }

    /// Applies each change whose `expected` record is the current one (a compare-and-set per
    /// object); one answer per change, in order: `true` when it was applied.
    fn record_metadata(
        &self,
        changes: Vec<MetadataChange>,
    ) -> impl Future<Output = Result<Vec<bool>, ControlError>> + Send {
        let _ = changes;
        async {
            Err(ControlError {
                reason: "this control plane keeps no metadata records".into(),
                transient: false,
            })
        }
    }

    /// Hands a unit back after its final commit (graceful stop or requested release).
    fn release(
        &self,
        unit: WorkUnit,
        epoch: Epoch,
    ) -> impl Future<Output = Result<(), ControlError>> + Send;
}
