//! What `benches/state_machine.rs` drives. **Not a stable API**: it exists only for the criterion
//! benches of this crate, wraps crate-private types without changing their behaviour, and may
//! change or disappear with any commit.

use std::collections::BTreeMap;
use std::path::Path;

use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use replicator_model::{Assignment, CommitOutcome, NodeId, OffsetCommit, WorkUnit};

use crate::command::{decode, encode, ControlCommand, ControlResponse};
use crate::error::{Error, Result};
use crate::identity::test_passwords;
use crate::state_machine::{Shared, StateMachineStore};
use crate::{data_dir, TypeConfig};

/// The node whose state machine is driven (member 1).
const NODE: NodeId = 1;

/// A Raft log entry (term 1) whose payload is one `CommitOffsets` command.
#[derive(Debug, Clone)]
pub struct CommitEntry(Entry<TypeConfig>);

impl CommitEntry {
    /// The entry at log `index` carrying `commits` from member 1, as the commit batcher
    /// writes it.
    pub fn new(index: u64, commits: Vec<OffsetCommit>) -> Self {
        let cmd = ControlCommand::CommitOffsets {
            node: NODE,
            commits,
        };
        Self(entry(index, cmd))
    }

    /// The entry encoded as the log store and the Raft network encode it (bincode).
    pub fn encode(&self) -> Result<Vec<u8>> {
        encode("log entry", &self.0)
    }

    /// Decodes bytes written by [`CommitEntry::encode`] (trailing bytes are an error).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        decode("log entry", bytes).map(Self)
    }
}

/// A normal entry of term 1 led by member 1.
fn entry(index: u64, cmd: ControlCommand) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, NODE), index),
        payload: EntryPayload::Normal(cmd),
    }
}

/// The crate's state machine on a sled data dir, as `Control::start` opens it, publishing
/// for member 1.
pub struct StateMachine {
    /// The store openraft would drive.
    sm: StateMachineStore,
    /// Shared with `sm`: the applied state.
    shared: std::sync::Arc<Shared>,
}

impl StateMachine {
    /// Opens a fresh data dir at `dir`, then applies: `RegisterMember` for members
    /// `1..=members`, one `ReportUnits` per flow of `units`, and one `Batch` granting unit
    /// `i` of `units` to member `i % members + 1`.
    pub fn open(dir: &Path, members: u64, units: &[WorkUnit]) -> Result<Self> {
        let db = data_dir::open(dir)?;
        let shared = Shared::new(NODE, test_passwords(), 0);
        let sm = StateMachineStore::open(&db, dir, shared.clone())?;
        let mut this = Self { sm, shared };
        let members = members.max(1);
        let mut setup: Vec<ControlCommand> = (1..=members)
            .map(|node| ControlCommand::RegisterMember {
                node,
                raft_addr: format!("10.0.0.{node}:7100"),
                api_addr: format!("10.0.0.{node}:7200"),
            })
            .collect();
        let mut flows: BTreeMap<&str, Vec<WorkUnit>> = BTreeMap::new();
        for unit in units {
            flows.entry(&unit.flow).or_default().push(unit.clone());
        }
        setup.extend(
            flows
                .into_iter()
                .map(|(flow, units)| ControlCommand::ReportUnits {
                    flow: flow.to_owned(),
                    units,
                }),
        );
        setup.push(ControlCommand::Batch(
            (0u64..)
                .zip(units)
                .map(|(i, unit)| ControlCommand::Grant {
                    unit: unit.clone(),
                    node: i % members + 1,
                })
                .collect(),
        ));
        let entries = (1u64..).zip(setup).map(|(i, c)| entry(i, c)).collect();
        this.apply_entries(entries)?;
        Ok(this)
    }

    /// Index of the last applied entry (later entries should use larger indexes).
    pub fn last_applied(&self) -> u64 {
        self.shared.read().last_applied.map_or(0, |l| l.index)
    }

    /// The units member 1 owns, with the epochs its commits must carry.
    pub fn assignments(&self) -> Vec<Assignment> {
        self.shared.read().state.assignments_of(NODE)
    }

    /// Applies `entries` in one call, as openraft does with the entries it found committed,
    /// and returns how many of their commits were `Committed`. The state machine's `apply`
    /// never waits on IO, so it is run to completion on the calling thread.
    pub fn apply(&mut self, entries: Vec<CommitEntry>) -> Result<usize> {
        let responses = self.apply_entries(entries.into_iter().map(|e| e.0).collect())?;
        Ok(responses
            .iter()
            .map(|r| match r {
                ControlResponse::Commits(outcomes) => outcomes
                    .iter()
                    .filter(|o| matches!(o, CommitOutcome::Committed))
                    .count(),
                _ => 0,
            })
            .sum())
    }

    fn apply_entries(&mut self, entries: Vec<Entry<TypeConfig>>) -> Result<Vec<ControlResponse>> {
        futures::executor::block_on(self.sm.apply(entries)).map_err(|e| Error::Raft(e.to_string()))
    }
}
