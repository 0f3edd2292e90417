//! The Raft state machine: the replicated `ControlState` in memory, persisted through snapshots.
//!
//! Persistence model: every snapshot is written to sled and flushed before it is reported
//! built or installed; `apply` only changes memory. On restart the state is the persisted
//! snapshot, and openraft re-applies the committed log after it (the log store saves the
//! committed id, and log purging never passes the snapshot), so a restarted node comes back
//! with exactly the state it had applied.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, StorageError, StorageIOError,
    StoredMembership,
};
use replicator_model::{Assignment, NodeId, WriterLogin};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::command::{decode, encode, ControlResponse};
use crate::data_dir::{self, KEY_SNAPSHOT, TREE_SNAPSHOT};
use crate::error::{Error, Result};
use crate::format;
use crate::identity::{Inheritance, WriterPasswords};
use crate::state::ControlState;
use crate::{MemberNode, TypeConfig};

type StorageResult<T> = std::result::Result<T, StorageError<NodeId>>;

fn any(e: impl ToString) -> AnyError {
    AnyError::error(e.to_string())
}

/// Everything the state machine holds; also the snapshot's content.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SmData {
    /// Last applied log id.
    pub(crate) last_applied: Option<LogId<NodeId>>,
    /// Last applied membership.
    pub(crate) last_membership: StoredMembership<NodeId, MemberNode>,
    /// The application state.
    pub(crate) state: ControlState,
}

impl SmData {
    /// Encodes the state for a snapshot, in the format of the cluster's feature level (which
    /// every member reads).
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let format = self.state.feature_level();
        let lacks_counters = format < 2 && !self.state.session_counters.is_empty();
        let lacks_metadata = format < 3 && !self.state.metadata.is_empty();
        let payload = if lacks_counters || lacks_metadata {
            // Only commands of the fields' levels fill them, so this does not happen; if it
            // did, the format could not carry them. Without `session_counters`, the counters'
            // dedup only loses its memory (a retried commit may count twice, as it did at
            // level 1); without `metadata`, two-way pairs only forget their records, which
            // nothing reads below level 3.
            let mut without = self.clone();
            if format < 2 {
                without.state.session_counters.clear();
            }
            if format < 3 {
                without.state.metadata.clear();
            }
            encode("snapshot data", &without)?
        } else {
            encode("snapshot data", self)?
        };
        Ok(format::seal(
            format,
            &format::snapshot_payload(format, payload),
        ))
    }

    /// Decodes snapshot data of any format this build reads (see `format`).
    pub(crate) fn decode(bytes: &[u8]) -> Result<SmData> {
        match format::open("snapshot data", bytes)? {
            (0, legacy) => Self::decode_unversioned(legacy),
            (format, payload) => decode::<SmData>(
                "snapshot data",
                &format::current_snapshot_payload(format, payload),
            ),
        }
    }

    /// Decodes snapshot data written before formats were versioned. Every field
    /// `ControlState` gained since then is at its end (the end of `SmData` too) and encodes
    /// as one zero byte when empty (a collection) or zero (a number): data of an older shape
    /// is the current shape with those fields empty, once a zero byte per missing field is
    /// appended.
    fn decode_unversioned(bytes: &[u8]) -> Result<SmData> {
        let current = decode::<SmData>("snapshot data", bytes);
        if current.is_ok() {
            return current;
        }
        (1..=FIELDS_ADDED_SINCE_UNVERSIONED)
            .find_map(|missing| {
                let mut padded = bytes.to_vec();
                padded.resize(bytes.len() + missing, 0);
                decode::<SmData>("snapshot data", &padded).ok()
            })
            .map_or(current, Ok)
    }
}

/// `ControlState` fields added while snapshots had no format header, all at its end:
/// `identities`, `stale_identities`, `forgotten_incarnations`, `paused_flows`, `pending_resets`,
/// `config_digests`, `recorded_starts`, `reset_topics`, `target_revokes`, `revoke_pending`,
/// `held_units`, and, with the header, `feature_level`, `member_levels`, `session_counters`
/// and `metadata`.
const FIELDS_ADDED_SINCE_UNVERSIONED: usize = 15;

/// A snapshot as stored in sled.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, MemberNode>,
    data: Vec<u8>,
}

/// State shared between the state machine (writer) and the node's API (readers).
pub(crate) struct Shared {
    /// This node, whose assignments are published.
    node: NodeId,
    /// The applied state. A std lock: held only for short, non-async sections.
    data: RwLock<SmData>,
    /// This node's assignments, re-published whenever an apply changes them.
    assignments: watch::Sender<Vec<Assignment>>,
    /// Index of the last applied entry (0 before any).
    applied: watch::Sender<u64>,
    /// This node's usable writer identity (fencing), re-published when it changes.
    writer_login: watch::Sender<Option<WriterLogin>>,
    /// Which identity this process inherited from an earlier one and must not write as.
    inheritance: std::sync::Mutex<Inheritance>,
    /// Derives the identities' passwords (never in the state).
    pub(crate) passwords: WriterPasswords,
    /// Size and durations of this node's latest snapshots, for metrics.
    snapshot_figures: std::sync::Mutex<SnapshotFigures>,
    /// How many times the applied state changed in a way a leader's round can see (see
    /// `ControlCommand::can_change_rounds`); bumped under the state's write lock, never reset,
    /// so that a round that reads it under the read lock knows whether it saw this state.
    round_changes: std::sync::atomic::AtomicU64,
    /// The config digests this process runs (see [`Shared::set_running_config`]); `None`
    /// until it says, and then no unit waits for them. Shared, not copied: writers read it
    /// before every send (`Control::lease_valid_for`).
    running_config: std::sync::Mutex<Option<Arc<BTreeMap<String, String>>>>,
    /// By when the last sends of this node's earlier processes can have landed (see
    /// [`Shared::inherited_to_abandon`]); `None`: not said, no wait.
    earlier_sends_landed_by: std::sync::Mutex<Option<std::time::Instant>>,
}

/// What this node knows about its latest snapshots (metrics: how large the state has grown and
/// what a snapshot costs the leader that builds it and the follower that installs it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SnapshotFigures {
    /// Encoded size of the latest snapshot built, installed or loaded at start.
    pub(crate) bytes: Option<u64>,
    /// How long building the latest snapshot here took (encoding under the state's read lock,
    /// which holds back applies, then persisting).
    pub(crate) build: Option<std::time::Duration>,
    /// How long installing the latest snapshot received from the leader took (decoding,
    /// persisting, swapping the state); its transfer comes before and is not included.
    pub(crate) install: Option<std::time::Duration>,
}

impl Shared {
    /// The shared state of a process whose log ended at `start_index` when it started.
    pub(crate) fn new(node: NodeId, passwords: WriterPasswords, start_index: u64) -> Arc<Self> {
        Arc::new(Self {
            node,
            passwords,
            inheritance: std::sync::Mutex::new(Inheritance::new(start_index)),
            data: RwLock::new(SmData::default()),
            assignments: watch::channel(Vec::new()).0,
            applied: watch::channel(0).0,
            writer_login: watch::channel(None).0,
            snapshot_figures: std::sync::Mutex::default(),
            round_changes: std::sync::atomic::AtomicU64::new(0),
            running_config: std::sync::Mutex::new(None),
            earlier_sends_landed_by: std::sync::Mutex::new(None),
        })
    }

    /// The config digests this process runs from now on (before its pipeline starts on them,
    /// and before they are published): the node works only on units of flows whose applied
    /// digest is the running one (`ControlState::assignments_running`), and as the leader
    /// decides nothing until its own are applied (`assign::round`).
    pub(crate) fn set_running_config(&self, digests: BTreeMap<String, String>) {
        *self
            .running_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(digests));
        self.publish();
    }

    /// The config digests this process runs, if it said.
    pub(crate) fn running_config(&self) -> Option<Arc<BTreeMap<String, String>>> {
        self.running_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many changes a leader's round can see the applied state has had; read it with the
    /// state's read lock held (see `Shared::round_changes`).
    pub(crate) fn round_changes(&self) -> u64 {
        self.round_changes
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts a change a round can see; called with the state's write lock held.
    fn note_round_change(&self) {
        self.round_changes
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// Size and durations of this node's latest snapshots.
    pub(crate) fn snapshot_figures(&self) -> SnapshotFigures {
        *self
            .snapshot_figures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Updates the snapshot figures.
    fn note_snapshot(&self, update: impl FnOnce(&mut SnapshotFigures)) {
        update(
            &mut self
                .snapshot_figures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    /// Reads the applied state.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, SmData> {
        // A panic while holding the lock leaves consistent data (apply mutates in place
        // per command); recovering the guard keeps the node serving.
        self.data
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, SmData> {
        self.data
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_inheritance(&self) -> std::sync::MutexGuard<'_, Inheritance> {
        self.inheritance
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An entry this process wrote was committed at `index`: the bound of what an earlier
    /// process of this node can have applied (see [`Inheritance`]).
    pub(crate) fn note_own_write(&self, index: u64) {
        self.lock_inheritance().wrote(index);
    }

    /// The identity an earlier process of this node held that this one must give up (see
    /// [`Inheritance`]), while it is still current and unfenced, once the earlier processes'
    /// last sends can have landed: giving it up moves the node's units of the fenced targets
    /// to others through its fence, which does not stop what an earlier process sent with the
    /// configured credential (a rolling restart that turned fencing on for the target).
    pub(crate) fn inherited_to_abandon(&self) -> Option<u64> {
        let landed_by = *self
            .earlier_sends_landed_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if landed_by.is_some_and(|at| std::time::Instant::now() < at) {
            return None;
        }
        let current = self.read().state.identity_of(self.node);
        self.lock_inheritance().to_abandon(current)
    }

    /// Sets by when the last sends of this node's earlier processes can have landed.
    pub(crate) fn set_earlier_sends_landed_by(&self, at: std::time::Instant) {
        *self
            .earlier_sends_landed_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(at);
    }

    pub(crate) fn subscribe_assignments(&self) -> watch::Receiver<Vec<Assignment>> {
        self.assignments.subscribe()
    }

    pub(crate) fn subscribe_writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        self.writer_login.subscribe()
    }

    pub(crate) fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Publishes the current assignments and applied index after the state changed.
    fn publish(&self) {
        self.publish_applied(true);
    }

    /// Publishes the applied index, and this node's assignments when `assignments_may_differ`
    /// (computing them walks every unit, so it is skipped after entries that cannot change
    /// them, see `ControlCommand::changes_assignments`).
    fn publish_applied(&self, assignments_may_differ: bool) {
        let (mine, applied, login) = {
            let data = self.read();
            let applied = data.last_applied.map_or(0, |l| l.index);
            let current = data.state.identity_of(self.node);
            let mut inheritance = self.lock_inheritance();
            inheritance.observe(applied, current);
            let usable = inheritance.usable(current);
            (
                assignments_may_differ.then(|| {
                    let running = self.running_config();
                    data.state
                        .assignments_running(self.node, running.as_deref())
                }),
                applied,
                data.state
                    .writer_login(self.node, &self.passwords)
                    .filter(|l| Some(l.incarnation) == usable),
            )
        };
        // Before the assignments: a grant made under a new identity must never reach the
        // pipeline ahead of the identity it writes with.
        self.writer_login.send_if_modified(|current| {
            if *current == login {
                false
            } else {
                *current = login;
                true
            }
        });
        if let Some(mine) = mine {
            self.assignments.send_if_modified(|current| {
                if *current == mine {
                    false
                } else {
                    *current = mine;
                    true
                }
            });
        }
        self.applied.send_replace(applied);
    }
}

/// The state machine handle given to openraft; also its snapshot builder.
#[derive(Clone)]
pub(crate) struct StateMachineStore {
    shared: Arc<Shared>,
    db: sled::Db,
    snapshots: sled::Tree,
}

impl StateMachineStore {
    /// Opens the snapshot tree and loads the persisted snapshot (if any) into `shared`.
    pub(crate) fn open(db: &sled::Db, dir: &Path, shared: Arc<Shared>) -> Result<Self> {
        let snapshots = data_dir::tree(db, dir, TREE_SNAPSHOT)?;
        let sm = Self {
            shared,
            db: db.clone(),
            snapshots,
        };
        let corrupt = |e: &dyn std::fmt::Display| Error::DataDir {
            path: PathBuf::from(dir),
            reason: format!("corrupt snapshot: {e}"),
        };
        if let Some(stored) = sm.read_stored().map_err(|e| corrupt(&e))? {
            let data = SmData::decode(&stored.data).map_err(|e| corrupt(&e))?;
            let bytes = stored.data.len() as u64;
            sm.shared.note_snapshot(|f| f.bytes = Some(bytes));
            *sm.shared.write() = data;
            sm.shared.note_round_change();
            sm.shared.publish();
        }
        Ok(sm)
    }

    fn read_stored(&self) -> Result<Option<StoredSnapshot>> {
        match self.snapshots.get(KEY_SNAPSHOT).map_err(|e| Error::Codec {
            what: "snapshot",
            reason: e.to_string(),
        })? {
            Some(v) => Ok(Some(decode("snapshot", &v)?)),
            None => Ok(None),
        }
    }

    async fn persist(&self, stored: &StoredSnapshot) -> std::result::Result<(), AnyError> {
        let bytes = encode("snapshot", stored).map_err(any)?;
        self.snapshots.insert(KEY_SNAPSHOT, bytes).map_err(any)?;
        data_dir::flush(&self.db).await.map_err(any)?;
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let started = std::time::Instant::now();
        let (data, last_applied, last_membership) = {
            let sm = self.shared.read();
            let bytes = sm
                .encode()
                .map_err(|e| StorageIOError::read_state_machine(any(e)))?;
            (bytes, sm.last_applied, sm.last_membership.clone())
        };
        let unique = self
            .db
            .generate_id()
            .map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{unique}", l.leader_id, l.index),
            None => format!("empty-{unique}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership,
            snapshot_id,
        };
        let stored = StoredSnapshot { meta, data };
        self.persist(&stored)
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(stored.meta.signature()), e))?;
        let (bytes, took) = (stored.data.len() as u64, started.elapsed());
        self.shared.note_snapshot(|f| {
            f.bytes = Some(bytes);
            f.build = Some(took);
        });
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, MemberNode>)> {
        let sm = self.shared.read();
        Ok((sm.last_applied, sm.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<ControlResponse>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let mut assignments_may_differ = false;
        {
            let mut sm = self.shared.write();
            for entry in entries {
                sm.last_applied = Some(entry.log_id);
                out.push(match entry.payload {
                    EntryPayload::Blank => ControlResponse::Empty,
                    EntryPayload::Normal(cmd) => {
                        assignments_may_differ |= cmd.changes_assignments();
                        if cmd.can_change_rounds() {
                            self.shared.note_round_change();
                        }
                        let response = sm.state.apply(entry.log_id.index, &cmd);
                        // Entry by entry: which identity appeared at which index (see
                        // `Inheritance::observe`).
                        self.shared
                            .lock_inheritance()
                            .observe(entry.log_id.index, sm.state.identity_of(self.shared.node));
                        response
                    }
                    EntryPayload::Membership(m) => {
                        sm.last_membership = StoredMembership::new(Some(entry.log_id), m);
                        ControlResponse::Empty
                    }
                });
            }
        }
        self.shared.publish_applied(assignments_may_differ);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, MemberNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let started = std::time::Instant::now();
        let bytes = snapshot.into_inner();
        let data = SmData::decode(&bytes)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), any(e)))?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: bytes,
        };
        self.persist(&stored)
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), e))?;
        {
            let mut sm = self.shared.write();
            *sm = SmData {
                last_applied: meta.last_log_id,
                last_membership: meta.last_membership.clone(),
                state: data.state,
            };
            self.shared.note_round_change();
        }
        self.shared.publish();
        let (bytes, took) = (stored.data.len() as u64, started.elapsed());
        self.shared.note_snapshot(|f| {
            f.bytes = Some(bytes);
            f.install = Some(took);
        });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored = self
            .read_stored()
            .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use assert2::check;

    use super::*;
    use crate::state::{MemberRecord, MemberState};

    #[test]
    fn a_snapshot_from_before_writer_identities_still_loads() {
        #[derive(Serialize)]
        struct OldState {
            members: BTreeMap<NodeId, MemberRecord>,
            units: BTreeMap<replicator_model::WorkUnit, crate::state::UnitRecord>,
        }
        #[derive(Serialize)]
        struct OldData {
            last_applied: Option<LogId<NodeId>>,
            last_membership: StoredMembership<NodeId, MemberNode>,
            state: OldState,
        }
        let member = MemberRecord {
            raft_addr: "r".into(),
            api_addr: "a".into(),
            state: MemberState::Active,
            last_renewal_index: 7,
            last_revoke_index: 0,
        };
        let old = OldData {
            last_applied: None,
            last_membership: StoredMembership::default(),
            state: OldState {
                members: BTreeMap::from([(1, member.clone())]),
                units: BTreeMap::new(),
            },
        };
        let bytes = encode("snapshot data", &old).expect("encodes");
        let data = SmData::decode(&bytes).expect("the old shape decodes");
        assert2::check!(data.state.members.get(&1) == Some(&member));
        assert2::check!(data.state.identities.is_empty());
        // And the current shape round-trips.
        let again = encode("snapshot data", &data).expect("encodes");
        assert2::check!(SmData::decode(&again).expect("decodes").state == data.state);
        let sealed = data.encode().expect("encodes");
        assert2::check!(SmData::decode(&sealed).expect("decodes").state == data.state);
    }

    #[test]
    fn a_snapshot_from_before_paused_flows_still_loads() {
        #[derive(Serialize)]
        struct OldState {
            members: BTreeMap<NodeId, MemberRecord>,
            units: BTreeMap<replicator_model::WorkUnit, crate::state::UnitRecord>,
            identities: BTreeMap<NodeId, crate::state::IdentityRecord>,
            stale_identities: std::collections::BTreeSet<(NodeId, u64)>,
            forgotten_incarnations: BTreeMap<NodeId, u64>,
        }
        #[derive(Serialize)]
        struct OldData {
            last_applied: Option<LogId<NodeId>>,
            last_membership: StoredMembership<NodeId, MemberNode>,
            state: OldState,
        }
        let old = OldData {
            last_applied: None,
            last_membership: StoredMembership::default(),
            state: OldState {
                members: BTreeMap::new(),
                units: BTreeMap::new(),
                identities: BTreeMap::new(),
                stale_identities: [(3, 4)].into(),
                forgotten_incarnations: BTreeMap::from([(1, 2)]),
            },
        };
        let bytes = encode("snapshot data", &old).expect("encodes");
        let data = SmData::decode(&bytes).expect("the old shape decodes");
        assert2::check!(data.state.forgotten_incarnations.get(&1) == Some(&2));
        assert2::check!(data.state.stale_identities.contains(&(3, 4)));
        assert2::check!(data.state.paused_flows.is_empty());
    }

    #[test]
    fn a_snapshot_from_before_offset_resets_still_loads() {
        #[derive(Serialize)]
        struct OldState {
            members: BTreeMap<NodeId, MemberRecord>,
            units: BTreeMap<replicator_model::WorkUnit, crate::state::UnitRecord>,
            identities: BTreeMap<NodeId, crate::state::IdentityRecord>,
            stale_identities: std::collections::BTreeSet<(NodeId, u64)>,
            forgotten_incarnations: BTreeMap<NodeId, u64>,
            paused_flows: BTreeMap<String, crate::state::PauseRecord>,
        }
        #[derive(Serialize)]
        struct OldData {
            last_applied: Option<LogId<NodeId>>,
            last_membership: StoredMembership<NodeId, MemberNode>,
            state: OldState,
        }
        let pause = crate::state::PauseRecord {
            requested_by: "op".into(),
            at_unix_ms: 5,
            index: 6,
        };
        let old = OldData {
            last_applied: None,
            last_membership: StoredMembership::default(),
            state: OldState {
                members: BTreeMap::new(),
                units: BTreeMap::new(),
                identities: BTreeMap::new(),
                stale_identities: [(3, 4)].into(),
                forgotten_incarnations: BTreeMap::new(),
                paused_flows: BTreeMap::from([("f".to_owned(), pause.clone())]),
            },
        };
        let bytes = encode("snapshot data", &old).expect("encodes");
        let data = SmData::decode(&bytes).expect("the old shape decodes");
        assert2::check!(data.state.paused_flows.get("f") == Some(&pause));
        assert2::check!(data.state.stale_identities.contains(&(3, 4)));
        assert2::check!(data.state.pending_resets.is_empty());
    }

    #[test]
    fn corrupt_snapshot_data_is_an_error() {
        // An invalid option tag where `last_applied` starts: no padding makes it decode.
        assert!(SmData::decode(&[0xff; 3]).is_err());
    }

    /// A state machine on its own sled data dir under `dir`.
    /// A store on `dir`, which a dropped store may have held a moment ago.
    fn store(dir: &Path) -> Result<StateMachineStore> {
        let db = crate::data_dir::reopen(dir)?;
        let shared = Shared::new(1, crate::identity::test_passwords(), 0);
        StateMachineStore::open(&db, dir, shared)
    }

    #[tokio::test]
    async fn snapshot_figures_follow_the_latest_build_install_and_load(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let mut leader = store(a.path())?;
        check!(leader.shared.snapshot_figures() == SnapshotFigures::default());
        let built = leader.build_snapshot().await?;
        let sealed = built.snapshot.into_inner();
        let figures = leader.shared.snapshot_figures();
        check!(
            figures.bytes == Some(sealed.len() as u64),
            "the sealed size"
        );
        check!(figures.build.is_some());
        check!(figures.install.is_none());

        let mut follower = store(b.path())?;
        let transferred = Box::new(Cursor::new(sealed.clone()));
        follower.install_snapshot(&built.meta, transferred).await?;
        let figures = follower.shared.snapshot_figures();
        check!(figures.bytes == Some(sealed.len() as u64));
        check!(figures.install.is_some());
        check!(figures.build.is_none());
        drop(follower);

        // A restart knows the size of the snapshot it loaded, and no durations yet.
        let restarted = store(b.path())?;
        let figures = restarted.shared.snapshot_figures();
        check!(figures.bytes == Some(sealed.len() as u64));
        check!(figures.build.is_none() && figures.install.is_none());
        Ok(())
    }
}
