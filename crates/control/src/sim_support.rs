//! What the deterministic simulator (`crates/sim`) drives. **Not a stable API**: it exists only
//! so that the simulator runs this crate's real protocol code (the state machine's `apply`, the
//! leader's assignment round with its lease judgement and fence decisions, the fence
//! operations' outcomes) under simulated time, network and failures. It wraps crate-private
//! types without changing their behaviour and may change or disappear with any commit.
//!
//! What is not here is what the simulator stands in for: openraft (a committed log that every
//! member applies in order) and the IO around the leader's tasks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use replicator_model::{
    Assignment, CommitOutcome, Epoch, NodeId, ProgressCommit, UnitProgress, WorkUnit,
};

use crate::assign::{self, Quiet, RoundContext};
use crate::command::{ControlCommand, ControlResponse};
use crate::fence::{EnsuredUsers, FenceTopology};
use crate::lease::{owner_lease_until, LeaderView};
use crate::params::ControlTiming;
use crate::retention::Retention;
use crate::state::ControlState;

/// One command of the replicated log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command(ControlCommand);

impl Command {
    /// `node` registers itself as an active member (its first write).
    pub fn register(node: NodeId) -> Self {
        Self(ControlCommand::RegisterMember {
            node,
            raft_addr: format!("sim-{node}:raft"),
            api_addr: format!("sim-{node}:api"),
        })
    }

    /// `node` publishes the highest feature level its build supports.
    pub fn publish_features(node: NodeId) -> Self {
        Self(ControlCommand::PublishFeatures {
            node,
            level: crate::format::SUPPORTED_LEVEL,
        })
    }

    /// `node` publishes its config digest per flow (at start, as the node does after it
    /// registered): units of a flow go only to members whose digest equals the leader's.
    pub fn publish_config(node: NodeId, digests: BTreeMap<String, String>) -> Self {
        Self(ControlCommand::PublishConfig { node, digests })
    }

    /// `node` renews its lease.
    pub fn renew(node: NodeId) -> Self {
        Self(ControlCommand::RenewLease { node })
    }

    /// Discovery's full unit set of `flow`.
    pub fn report_units(flow: &str, units: Vec<WorkUnit>) -> Self {
        Self(ControlCommand::ReportUnits {
            flow: flow.to_owned(),
            units,
        })
    }

    /// `node`'s commits, in the form the cluster's feature `level` takes (as the node's commit
    /// batcher writes them).
    pub fn commit(node: NodeId, commits: Vec<ProgressCommit>, level: u32) -> Self {
        Self(crate::node::commit_command(node, commits, level))
    }

    /// `node` hands `unit` (granted under `epoch`) back.
    pub fn release(node: NodeId, unit: WorkUnit, epoch: Epoch) -> Self {
        Self(ControlCommand::Release { unit, epoch, node })
    }

    /// `node` gives its writer identity `incarnation` up (fenced like a failed member's).
    pub fn fence_member(node: NodeId, incarnation: u64) -> Self {
        Self(ControlCommand::FenceMember { node, incarnation })
    }

    /// An assignment round's commands as the one entry the leader writes.
    fn batch(cmds: Vec<ControlCommand>) -> Self {
        Self(ControlCommand::Batch(cmds))
    }
}

/// What applying a command answered, as far as a member's tasks look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A lease renewal was recorded; `revoked_since_previous`: do not extend on it.
    Renewed {
        /// A revoke of the node's units was applied since its previous renewal.
        revoked_since_previous: bool,
    },
    /// One outcome per commit.
    Commits(Vec<CommitOutcome>),
    /// Anything else (applied or ignored).
    Other,
}

/// The replicated state of one member: the real `ControlState` and its `apply`, with the count
/// of changes a leader's round can see (as the node's state machine keeps it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State(ControlState, u64);

impl State {
    /// Applies `cmd` written at log `index`.
    pub fn apply(&mut self, index: u64, cmd: &Command) -> Answer {
        if cmd.0.can_change_rounds() {
            self.1 += 1;
        }
        match self.0.apply(index, &cmd.0) {
            ControlResponse::Renewed {
                revoked_since_previous,
            } => Answer::Renewed {
                revoked_since_previous,
            },
            ControlResponse::Commits(outcomes) => Answer::Commits(outcomes),
            _ => Answer::Other,
        }
    }

    /// `node`'s units, with their epochs and whether the leader wants them back.
    pub fn assignments_of(&self, node: NodeId) -> Vec<Assignment> {
        self.0.assignments_of(node)
    }

    /// Whether the config digests applied for `node` are `running`.
    pub fn config_applied(&self, node: NodeId, running: &BTreeMap<String, String>) -> bool {
        self.0.config_applied(node, Some(running))
    }

    /// `node`'s units of the flows whose applied config digest is `running`'s (the node's
    /// `Shared` publishes these to its pipeline).
    pub fn assignments_running(
        &self,
        node: NodeId,
        running: &BTreeMap<String, String>,
    ) -> Vec<Assignment> {
        self.0.assignments_running(node, Some(running))
    }

    /// Every unit's owner and epoch.
    pub fn owners(&self) -> Vec<(WorkUnit, Option<NodeId>, Epoch)> {
        self.0
            .units
            .iter()
            .map(|(u, r)| (u.clone(), r.owner, r.epoch))
            .collect()
    }

    /// A unit's confirmed progress.
    pub fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
        self.0.units.get(unit).map(|r| r.progress)
    }

    /// `node`'s current writer identity: (incarnation, fenced).
    pub fn identity(&self, node: NodeId) -> Option<(u64, bool)> {
        self.0.identity_of(node)
    }

    /// The cluster's feature level.
    pub fn feature_level(&self) -> u32 {
        self.0.feature_level()
    }

    /// Whether `node` is a member.
    pub fn is_member(&self, node: NodeId) -> bool {
        self.0.members.contains_key(&node)
    }
}

/// Which writer identity a process may write as (`identity::Inheritance`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inheritance(crate::identity::Inheritance);

impl Inheritance {
    /// A process whose log ended at `start_index` when it started.
    pub fn new(start_index: u64) -> Self {
        Self(crate::identity::Inheritance::new(start_index))
    }

    /// An entry this process wrote was committed at `index`.
    pub fn wrote(&mut self, index: u64) {
        self.0.wrote(index);
    }

    /// After applying up to `applied` (the process's state is `state`).
    pub fn observe(&mut self, applied: u64, state: &State, node: NodeId) {
        self.0.observe(applied, state.0.identity_of(node));
    }

    /// The incarnation the process may write as.
    pub fn usable(&self, state: &State, node: NodeId) -> Option<u64> {
        self.0.usable(state.0.identity_of(node))
    }

    /// The inherited identity to give up.
    pub fn to_abandon(&self, state: &State, node: NodeId) -> Option<u64> {
        self.0.to_abandon(state.0.identity_of(node))
    }
}

/// A member's record of when it saw each member's renewal applied (what a new leader carries
/// on from), kept while it follows.
#[derive(Debug, Clone)]
pub struct Observer(LeaderView);

impl Default for Observer {
    fn default() -> Self {
        Self(LeaderView::new(0))
    }
}

impl Observer {
    /// Records the renewals in `state` at `now`.
    pub fn observe(&mut self, state: &State, now: Instant) {
        self.0.observe(&state.0.members, now);
    }
}

/// One operation on a target the leader's fence tracker runs.
pub use crate::fence_ops::FenceOp as TargetOp;

/// What the leader `leader`, whose applied state is `state`, commits once the targets
/// acknowledged `op`.
pub fn acknowledged(
    op: &TargetOp,
    topology: &FenceTopology,
    state: &State,
    leader: NodeId,
) -> Option<Command> {
    op.acknowledged(topology, &state.0, Some(leader))
        .map(Command)
}

/// The leader's memory over one term: its lease view, what it saw become forgettable, and the
/// identities it ensured on the targets.
#[derive(Debug)]
pub struct Leader {
    view: LeaderView,
    retention: Retention,
    quiet: Quiet,
    ensured: EnsuredUsers,
    /// The identities whose user a target operation is ensuring now (see `ensuring`).
    ensuring: EnsuredUsers,
    /// The identities one of whose ensures failed in this term (see `ensure_failed`).
    ensure_failed: EnsuredUsers,
    /// Revokes the targets acknowledged, written with the next round (see `write_with_round`).
    acknowledged: Vec<ControlCommand>,
    /// The members the network shows gone (see `peers_gone`).
    gone: BTreeSet<NodeId>,
    /// The leading node.
    pub node: NodeId,
}

impl Leader {
    /// A leader of `term` carrying on from what `observed` recorded while it followed.
    pub fn carry_on(
        node: NodeId,
        term: u64,
        observed: &Observer,
        now: Instant,
        previous_leader: Option<NodeId>,
    ) -> Self {
        Self {
            view: LeaderView::carry_on(term, &observed.0, now, previous_leader),
            retention: Retention::default(),
            quiet: Quiet::default(),
            ensured: EnsuredUsers::default(),
            ensuring: EnsuredUsers::default(),
            ensure_failed: EnsuredUsers::default(),
            acknowledged: Vec::new(),
            gone: BTreeSet::new(),
            node,
        }
    }

    /// A target's acknowledgement of a revoke (`cmd`, from [`acknowledged`]) goes ahead of the
    /// next round's commands, which then grant the units it frees in the same entry, as the
    /// node's fence tasks hand it to its assignment loop. Handed over once: if that entry is
    /// lost, the next rounds ask for the revoke again.
    pub fn write_with_round(&mut self, cmd: Command) {
        self.acknowledged.push(cmd.0);
    }

    /// What the network shows of the members' processes now: each member whose calls were
    /// refused (its process is down) (`LeaderView::peers_gone`).
    pub fn peers_gone(&mut self, gone: BTreeSet<NodeId>) {
        self.gone = gone;
    }

    /// The target acknowledged that `node`'s identity `incarnation` exists there.
    pub fn ensured(&mut self, target: &str, node: NodeId, incarnation: u64) {
        self.ensured.insert((target.to_owned(), node, incarnation));
    }

    /// The ensures among the target operations in flight now (`in_flight`), as the node's
    /// tracker shows them to its rounds: those of an identity one of whose attempts failed in
    /// this term are left out (`ensure_failed`), as the node leaves out an ensure retrying.
    pub fn ensuring<'a>(&mut self, in_flight: impl IntoIterator<Item = &'a TargetOp>) {
        self.ensuring = in_flight
            .into_iter()
            .filter_map(TargetOp::ensured_user)
            .filter(|key| !self.ensure_failed.contains(key))
            .collect();
    }

    /// An attempt to ensure `node`'s identity `incarnation` on `target` failed.
    pub fn ensure_failed(&mut self, target: &str, node: NodeId, incarnation: u64) {
        self.ensure_failed
            .insert((target.to_owned(), node, incarnation));
    }

    /// One assignment round (the node's `run_assigner` runs the same function): the entry to
    /// write (if any) and the target operations to run. `topology`: the leader's fence
    /// topology, `None` when its config has fencing on for no cluster (the node then runs
    /// without fencing). `own_config`: the config digests the leader's process runs.
    pub fn round(
        &mut self,
        state: &State,
        now: Instant,
        timing: &ControlTiming,
        topology: Option<&FenceTopology>,
        own_config: Option<&BTreeMap<String, String>>,
    ) -> (Option<Command>, Vec<TargetOp>) {
        let acknowledged = std::mem::take(&mut self.acknowledged);
        let (cmds, work) = assign::round(
            &state.0,
            &mut self.view,
            &mut self.retention,
            &mut self.quiet,
            RoundContext {
                now,
                timing,
                leader: self.node,
                fencing: topology.map(|t| assign::FencingView {
                    topology: t.clone(),
                    ensured: self.ensured.clone(),
                    ensuring: self.ensuring.clone(),
                }),
                changes: state.1,
                own_config,
                gone: self.gone.clone(),
                acknowledged: &acknowledged,
            },
        );
        let ops = work.ops().collect();
        ((!cmds.is_empty()).then(|| Command::batch(cmds)), ops)
    }
}

/// Until when an owner may write after a renewal it sent at `sent` was committed and applied.
pub fn lease_until(sent: Instant, timing: &ControlTiming) -> Instant {
    owner_lease_until(sent, timing.lease_expiry, timing.lease_drift_margin)
}

/// The default timings (the one home of the defaults is `ControlTiming::default`).
pub fn default_timing() -> ControlTiming {
    ControlTiming::default()
}
