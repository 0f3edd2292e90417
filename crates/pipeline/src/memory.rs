//! A single-node, in-memory control plane with the same fencing rules as the Raft one.
//!
//! It owns every unit it is told about: `report_units` grants new (or released) units to this
//! node under a fresh epoch, commits are fenced by epoch and never move an offset backwards within
//! one upstream history, and `release` hands a unit back until the next report grants it again.
//! Tests use it directly; the binary uses it to run one instance without Raft.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use replicator_model::{
    Assignment, ClusterPair, CommitCounters, CommitOutcome, Epoch, MetadataChange, MetadataKey,
    MetadataObject, MetadataRecord, ProgressCommit, SessionCounters, UnitProgress, UnitReset,
    UnitStart, WorkUnit,
};
use tokio::sync::watch;

use crate::control::{ControlError, ControlPlane, UnitReport};

/// How long the lease of an in-memory control plane is reported valid ahead of "now".
const LEASE_AHEAD: Duration = Duration::from_secs(3600);

/// State of one unit.
#[derive(Debug, Clone, Default)]
struct UnitEntry {
    /// Epoch of the current grant, `None` when unassigned.
    owner: Option<Epoch>,
    /// The owner is asked to hand the unit back.
    release_requested: bool,
    /// Whether the last report of its flow contained it.
    present: bool,
    /// Held back by a test (`revoke`): not granted by reports until `grant`.
    held: bool,
    /// Confirmed progress; `confirmed: None` before the first commit.
    progress: UnitProgress,
    /// An operator's reset no commit took up yet (see [`InMemoryControl::reset`]).
    reset: Option<UnitReset>,
    /// The start its first owner recorded, until the first commit.
    start: Option<UnitStart>,
    /// The totals its current grant's writer sessions committed.
    sessions: SessionCounters,
}

/// Everything behind the lock.
#[derive(Debug, Default)]
struct State {
    /// Last epoch handed out; epochs only grow.
    last_epoch: u64,
    /// Every unit ever reported, keyed by identity.
    units: BTreeMap<WorkUnit, UnitEntry>,
    /// The lease as tests set it.
    lease: InMemoryLease,
    /// Two-way pairs' metadata records, as the Raft state keeps them.
    metadata: BTreeMap<MetadataKey, MetadataRecord>,
    /// Writers stamp format-1 provenance (as a cluster below feature level 4), set by tests.
    entries_provenance: bool,
}

/// The lease an [`InMemoryControl`] reports (tests take it away to see writers hold off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InMemoryLease {
    /// Always valid: until an hour from now, whenever asked (the default).
    #[default]
    Held,
    /// No valid lease.
    Missing,
    /// Valid until the given instant.
    Until(Instant),
}

impl State {
    /// Grants `unit` under a fresh epoch.
    fn grant(&mut self, unit: &WorkUnit) {
        self.last_epoch += 1;
        let epoch = Epoch(self.last_epoch);
        let entry = self.units.entry(unit.clone()).or_default();
        entry.owner = Some(epoch);
        entry.release_requested = false;
        entry.held = false;
    }

    /// Until when the lease is valid, as of now.
    fn lease_valid_until(&self) -> Option<Instant> {
        match self.lease {
            InMemoryLease::Held => Some(Instant::now() + LEASE_AHEAD),
            InMemoryLease::Missing => None,
            InMemoryLease::Until(until) => Some(until),
        }
    }

    /// The assignments of this node.
    fn assignments(&self) -> Vec<Assignment> {
        self.units
            .iter()
            .filter_map(|(unit, e)| {
                e.owner.map(|epoch| Assignment {
                    unit: unit.clone(),
                    epoch,
                    release_requested: e.release_requested,
                })
            })
            .collect()
    }

    /// Applies one commit.
    fn commit(&mut self, c: &ProgressCommit) -> CommitOutcome {
        let Some(entry) = self.units.get_mut(&c.unit) else {
            return CommitOutcome::Fenced { current: None };
        };
        if entry.owner != Some(c.epoch) {
            return CommitOutcome::Fenced {
                current: entry.owner,
            };
        }
        let p = &mut entry.progress;
        if p.history_label != c.history_label {
            // A new history (topic recreated or partition reset) may have lower offsets.
            p.confirmed = Some(c.offset);
            p.history_label = c.history_label;
        } else {
            p.confirmed = Some(p.confirmed.map_or(c.offset, |old| old.max(c.offset)));
        }
        let copied = match &c.counters {
            CommitCounters::Since(since) => *since,
            CommitCounters::Totals { session, totals } => {
                entry.sessions.record(c.epoch, *session, totals)
            }
        };
        p.counters.add(&copied);
        entry.reset = None;
        entry.start = None;
        CommitOutcome::Committed
    }
}

/// Shared part of the handle.
#[derive(Debug)]
struct Inner {
    /// The state.
    state: Mutex<State>,
    /// Publishes this node's assignments after every change.
    assignments: watch::Sender<Vec<Assignment>>,
}

/// Handle to the in-memory control plane; clones share state.
#[derive(Debug, Clone)]
pub struct InMemoryControl {
    /// Shared state.
    inner: Arc<Inner>,
}

impl Default for InMemoryControl {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryControl {
    /// An empty control plane: no units, a lease that is always valid.
    pub fn new() -> Self {
        let (tx, _rx) = watch::channel(Vec::new());
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                assignments: tx,
            }),
        }
    }

    /// Locks the state; a poisoned lock is taken over (the state has no invariants a panic
    /// half-way could break: every mutation is a single field write).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the state and publishes the assignments afterwards.
    fn mutate<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.lock();
        let out = f(&mut state);
        let assignments = state.assignments();
        drop(state);
        self.inner.assignments.send_if_modified(|current| {
            let changed = *current != assignments;
            if changed {
                *current = assignments;
            }
            changed
        });
        out
    }

    /// Current epoch of a unit, `None` if unassigned.
    pub fn epoch(&self, unit: &WorkUnit) -> Option<Epoch> {
        self.lock().units.get(unit).and_then(|e| e.owner)
    }

    /// Every unit currently assigned, with its epoch.
    pub fn assigned(&self) -> Vec<Assignment> {
        self.lock().assignments()
    }

    /// Every unit ever reported (assigned or not).
    pub fn known_units(&self) -> Vec<WorkUnit> {
        self.lock().units.keys().cloned().collect()
    }

    /// Whether the last report of the unit's flow contained it.
    pub fn is_present(&self, unit: &WorkUnit) -> bool {
        self.lock().units.get(unit).is_some_and(|e| e.present)
    }

    /// Asks the owner to hand the unit back (what a rebalancing leader does).
    pub fn request_release(&self, unit: &WorkUnit) {
        self.mutate(|s| {
            if let Some(e) = s.units.get_mut(unit) {
                e.release_requested = e.owner.is_some();
            }
        });
    }

    /// Takes the unit away at once and keeps it unassigned until [`grant`](Self::grant) (what
    /// happens when the leader moves it to another node).
    pub fn revoke(&self, unit: &WorkUnit) {
        self.mutate(|s| {
            if let Some(e) = s.units.get_mut(unit) {
                e.owner = None;
                e.release_requested = false;
                e.held = true;
            }
        });
    }

    /// Grants the unit to this node under a fresh epoch (also after `revoke`).
    pub fn grant(&self, unit: &WorkUnit) {
        self.mutate(|s| s.grant(unit));
    }

    /// Resets where the unit resumes, as `flow reset` does on the replicated state (which also
    /// checks the flow is paused and the unit unowned: tests `revoke` it first): the confirmed
    /// offset moves to just before `reset.reset.next`, and the next owner starts there (unless
    /// the reset names another upstream topic than the one it finds).
    pub fn reset(&self, unit: &WorkUnit, reset: UnitReset) {
        self.mutate(|s| {
            let e = s.units.entry(unit.clone()).or_default();
            if e.progress.confirmed.is_some() {
                e.progress.confirmed = reset.reset.next.checked_sub(1);
            }
            e.reset = Some(reset);
            e.start = None;
        });
    }

    /// Whether writers stamp the compact provenance format from now on (the default), or format
    /// 1, as in a cluster whose feature level is below 4.
    pub fn set_compact_provenance(&self, compact: bool) {
        self.lock().entries_provenance = !compact;
    }

    /// Sets the lease this control plane reports from now on.
    pub fn set_lease(&self, lease: InMemoryLease) {
        self.lock().lease = lease;
    }
}

impl ControlPlane for InMemoryControl {
    fn assignments(&self) -> watch::Receiver<Vec<Assignment>> {
        self.inner.assignments.subscribe()
    }

    fn lease_valid_until(&self) -> Option<Instant> {
        self.lock().lease_valid_until()
    }

    /// The lease and the ownership are read under one lock, so they always belong together.
    fn lease_valid_for(&self, unit: &WorkUnit, epoch: Epoch) -> Option<Instant> {
        let state = self.lock();
        let lease = state.lease_valid_until()?;
        let owned = state.units.get(unit).and_then(|e| e.owner) == Some(epoch);
        owned.then_some(lease)
    }

    fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
        self.lock()
            .units
            .get(unit)
            .map(|e| e.progress)
            .filter(|p| p.confirmed.is_some())
    }

    fn pending_reset(&self, unit: &WorkUnit) -> Option<UnitReset> {
        self.lock().units.get(unit).and_then(|e| e.reset)
    }

    fn recorded_start(&self, unit: &WorkUnit) -> Option<UnitStart> {
        self.lock().units.get(unit).and_then(|e| e.start)
    }

    /// As the Raft state machine applies `RecordStart`: from the owner only, the first start
    /// of a history stands.
    async fn record_start(
        &self,
        unit: &WorkUnit,
        epoch: Epoch,
        start: UnitStart,
    ) -> Result<bool, ControlError> {
        self.mutate(|s| {
            let e = s.units.get_mut(unit).filter(|e| e.owner == Some(epoch));
            let Some(e) = e else {
                return Err(ControlError {
                    reason: format!("record start of {unit}: not owned under epoch {}", epoch.0),
                    transient: false,
                });
            };
            let label = start.history_label;
            let known = (e.progress.confirmed.is_some() && e.progress.history_label == label)
                || e.start.is_some_and(|s| s.history_label == label);
            if !known {
                e.start = Some(start);
            }
            Ok(!known)
        })
    }

    fn counts_totals(&self) -> bool {
        true
    }

    fn stamps_compact_provenance(&self) -> bool {
        !self.lock().entries_provenance
    }

    fn metadata_records(
        &self,
        pair: &ClusterPair,
    ) -> Option<BTreeMap<MetadataObject, MetadataRecord>> {
        Some(
            self.lock()
                .metadata
                .iter()
                .filter(|(key, _)| key.pair == *pair)
                .map(|(key, record)| (key.object.clone(), record.clone()))
                .collect(),
        )
    }

    /// As the Raft state machine applies `RecordMetadata`: a compare-and-set per change.
    async fn record_metadata(
        &self,
        changes: Vec<MetadataChange>,
    ) -> Result<Vec<bool>, ControlError> {
        Ok(self.mutate(|s| {
            changes
                .into_iter()
                .map(|change| {
                    let applies = s.metadata.get(&change.key) == change.expected.as_ref();
                    if applies {
                        match change.record {
                            Some(record) => s.metadata.insert(change.key, record),
                            None => s.metadata.remove(&change.key),
                        };
                    }
                    applies
                })
                .collect()
        }))
    }

    async fn commit(
        &self,
        commits: Vec<ProgressCommit>,
    ) -> Result<Vec<CommitOutcome>, ControlError> {
        Ok(self.mutate(|s| commits.iter().map(|c| s.commit(c)).collect()))
    }

    async fn report_units(
        &self,
        flow: &str,
        units: Vec<WorkUnit>,
    ) -> Result<UnitReport, ControlError> {
        self.mutate(|s| {
            for (unit, e) in s.units.iter_mut().filter(|(u, _)| u.flow == flow) {
                if !units.contains(unit) {
                    e.present = false;
                    e.owner = None;
                    e.release_requested = false;
                }
            }
            for unit in &units {
                let entry = s.units.entry(unit.clone()).or_default();
                entry.present = true;
                if entry.owner.is_none() && !entry.held {
                    s.grant(unit);
                }
            }
        });
        Ok(UnitReport::Reported)
    }

    async fn release(&self, unit: WorkUnit, epoch: Epoch) -> Result<(), ControlError> {
        self.mutate(|s| {
            if let Some(e) = s.units.get_mut(&unit) {
                if e.owner == Some(epoch) {
                    e.owner = None;
                    e.release_requested = false;
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};
    use replicator_model::UnitCounters;

    use super::*;

    fn unit(p: u32) -> WorkUnit {
        WorkUnit::new("f", "s", "t", p)
    }

    fn commit(u: &WorkUnit, epoch: Epoch, offset: u64, created: u64) -> ProgressCommit {
        ProgressCommit {
            unit: u.clone(),
            epoch,
            offset,
            history_label: created,
            counters: CommitCounters::Since(UnitCounters {
                messages: 1,
                ..Default::default()
            }),
        }
    }

    #[tokio::test]
    async fn report_grants_new_units_with_growing_epochs() {
        let c = InMemoryControl::new();
        c.report_units("f", vec![unit(0), unit(1)])
            .await
            .expect("ok");
        let a = c.assigned();
        assert!(a.len() == 2);
        check!(a[0].epoch < a[1].epoch);
        check!(*c.assignments().borrow() == a);
    }

    #[tokio::test]
    async fn commits_are_fenced_by_epoch_and_never_go_backwards() {
        let c = InMemoryControl::new();
        let u = unit(0);
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        let e = c.epoch(&u).expect("assigned");
        let out = c
            .commit(vec![
                commit(&u, e, 10, 1),
                commit(&u, Epoch(e.0 + 5), 20, 1),
            ])
            .await
            .expect("ok");
        check!(out[0] == CommitOutcome::Committed);
        check!(out[1] == CommitOutcome::Fenced { current: Some(e) });
        c.commit(vec![commit(&u, e, 4, 1)]).await.expect("ok");
        let p = c.progress(&u).expect("committed");
        check!(p.confirmed == Some(10));
        check!(p.counters.messages == 2);
    }

    #[tokio::test]
    async fn a_new_history_label_restarts_the_offsets() {
        let c = InMemoryControl::new();
        let u = unit(0);
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        let e = c.epoch(&u).expect("assigned");
        c.commit(vec![commit(&u, e, 10, 1)]).await.expect("ok");
        c.commit(vec![commit(&u, e, 3, 2)]).await.expect("ok");
        let p = c.progress(&u).expect("committed");
        check!(p.confirmed == Some(3));
        check!(p.history_label == 2);
    }

    #[tokio::test]
    async fn retired_units_keep_progress_and_return_with_a_new_epoch() {
        let c = InMemoryControl::new();
        let u = unit(0);
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        let e1 = c.epoch(&u).expect("assigned");
        c.commit(vec![commit(&u, e1, 7, 1)]).await.expect("ok");
        c.report_units("f", vec![]).await.expect("ok");
        check!(c.epoch(&u).is_none());
        check!(c.progress(&u).and_then(|p| p.confirmed) == Some(7));
        let out = c.commit(vec![commit(&u, e1, 8, 1)]).await.expect("ok");
        check!(out[0] == CommitOutcome::Fenced { current: None });
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        check!(c.epoch(&u) > Some(e1));
    }

    #[tokio::test]
    async fn release_and_revoke_unassign_until_granted_again() {
        let c = InMemoryControl::new();
        let u = unit(0);
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        let e1 = c.epoch(&u).expect("assigned");
        c.request_release(&u);
        check!(c.assigned()[0].release_requested);
        c.release(u.clone(), Epoch(e1.0 + 1)).await.expect("ok");
        check!(c.epoch(&u) == Some(e1));
        c.release(u.clone(), e1).await.expect("ok");
        check!(c.epoch(&u).is_none());
        c.revoke(&u);
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        check!(c.epoch(&u).is_none());
        c.grant(&u);
        check!(c.epoch(&u) > Some(e1));
    }

    #[tokio::test]
    async fn lease_valid_for_needs_both_the_lease_and_the_grant() {
        let c = InMemoryControl::new();
        let u = unit(0);
        check!(c.lease_valid_for(&u, Epoch(1)).is_none());
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        let e = c.epoch(&u).expect("assigned");
        check!(c.lease_valid_for(&u, e).is_some_and(|t| t > Instant::now()));
        // Another epoch of the same unit, or another unit: not ours.
        check!(c.lease_valid_for(&u, Epoch(e.0 + 1)).is_none());
        check!(c.lease_valid_for(&unit(1), e).is_none());
        // No lease: nothing, whatever the grant.
        c.set_lease(InMemoryLease::Missing);
        check!(c.lease_valid_for(&u, e).is_none());
        let until = Instant::now() + Duration::from_secs(5);
        c.set_lease(InMemoryLease::Until(until));
        check!(c.lease_valid_for(&u, e) == Some(until));
        // Revoked: nothing, whatever the lease.
        c.revoke(&u);
        check!(c.lease_valid_for(&u, e).is_none());
    }

    #[tokio::test]
    async fn default_lease_valid_for_agrees_with_the_in_memory_one() {
        /// Uses the trait's default `lease_valid_for` over the in-memory control plane.
        #[derive(Clone)]
        struct Defaulted(InMemoryControl);
        impl ControlPlane for Defaulted {
            fn assignments(&self) -> watch::Receiver<Vec<Assignment>> {
                self.0.assignments()
            }
            fn lease_valid_until(&self) -> Option<Instant> {
                self.0.lease_valid_until()
            }
            fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
                self.0.progress(unit)
            }
            fn pending_reset(&self, unit: &WorkUnit) -> Option<UnitReset> {
                self.0.pending_reset(unit)
            }
            fn recorded_start(&self, unit: &WorkUnit) -> Option<UnitStart> {
                self.0.recorded_start(unit)
            }
            async fn record_start(
                &self,
                unit: &WorkUnit,
                epoch: Epoch,
                start: UnitStart,
            ) -> Result<bool, ControlError> {
                self.0.record_start(unit, epoch, start).await
            }
            async fn commit(
                &self,
                commits: Vec<ProgressCommit>,
            ) -> Result<Vec<CommitOutcome>, ControlError> {
                self.0.commit(commits).await
            }
            async fn report_units(
                &self,
                flow: &str,
                units: Vec<WorkUnit>,
            ) -> Result<UnitReport, ControlError> {
                self.0.report_units(flow, units).await
            }
            async fn release(&self, unit: WorkUnit, epoch: Epoch) -> Result<(), ControlError> {
                self.0.release(unit, epoch).await
            }
        }
        let c = InMemoryControl::new();
        let d = Defaulted(c.clone());
        let u = unit(0);
        c.report_units("f", vec![u.clone()]).await.expect("ok");
        let e = c.epoch(&u).expect("assigned");
        check!(d.lease_valid_for(&u, e).is_some());
        check!(d.lease_valid_for(&u, Epoch(e.0 + 1)).is_none());
        c.set_lease(InMemoryLease::Missing);
        check!(d.lease_valid_for(&u, e).is_none());
        c.set_lease(InMemoryLease::Held);
        c.revoke(&u);
        check!(d.lease_valid_for(&u, e).is_none());
    }

    #[test]
    fn lease_can_be_overridden_and_restored() {
        let c = InMemoryControl::new();
        check!(c.lease_valid_until().is_some_and(|t| t > Instant::now()));
        c.set_lease(InMemoryLease::Missing);
        check!(c.lease_valid_until().is_none());
        c.set_lease(InMemoryLease::Held);
        check!(c.lease_valid_until().is_some());
    }
}
