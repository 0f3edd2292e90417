//! Fencing at the target clusters: the leader's side.
//!
//! A lease is a promise an instance makes to itself; a fence has to be enforced by the party
//! that stores the data. Iggy checks a user's permissions on every request of a live session,
//! so with fencing on every node writes to each fenced target as a user of its own (one per
//! *incarnation*, see [`WriterLogin`](replicator_model::WriterLogin)), and the leader, before
//! it hands a failed node's units writing to target T to others, takes that user's rights away
//! on T and waits for T's acknowledgement. Fencing is per (member, target): the order
//! `FenceMember` (the decision, committed first so that a leader cut off from the majority
//! revokes nobody) → revoke on T → `FenceTarget` (which frees the member's units writing to T)
//! → grant → the new owner's tail scan → its first send is what makes a stale write to T
//! impossible whatever the old owner does (ARCHITECTURE.md, "Never two owners"). A target that
//! does not answer holds back only the units that write to it.
//!
//! The Iggy side is behind [`WriterFence`] (the binary implements it with the SDK, `fence`);
//! this module runs the operations [`crate::assign::fence_work`] asks for, one task per
//! operation, retried with backoff until acknowledged or this node stops leading, and commits
//! their outcome. The node hands itself in as a [`FenceNode`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use replicator_model::NodeId;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::assign::FenceWork;
use crate::command::{ControlCommand, ControlResponse};
use crate::error::Result;
use crate::fence::{EnsuredUsers, FenceTopology, Fencing, WriterFence};
use crate::state::ControlState;
use crate::state_machine::Shared;

/// What the fencing tasks need of the node that runs them (`node::NodeInner` implements it):
/// the node hands itself to [`start`] through this, and nothing here reaches into it.
pub(crate) trait FenceNode: Send + Sync + 'static {
    /// This node.
    fn id(&self) -> NodeId;
    /// The leader's fencing operations in progress, what it ensured, and the metrics.
    fn tracker(&self) -> &FenceTracker;
    /// Cancelled when the node stops.
    fn stopping(&self) -> &CancellationToken;
    /// Whether this node leads `term` now.
    fn leads(&self, term: u64) -> bool;
    /// Writes `cmd` through Raft (on the leader, or forwarded to it).
    fn write(
        &self,
        cmd: &ControlCommand,
    ) -> impl Future<Output = Result<(u64, ControlResponse)>> + Send;
    /// The applied state and the writer passwords.
    fn shared(&self) -> &Shared;
    /// Which flows write to which fenced target now.
    fn fence_topology(&self) -> FenceTopology;
}

/// One operation on a target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum FenceOp {
    /// Take the identity's rights on `target` away (create its user without rights if it is
    /// missing), then commit `FenceTarget`.
    Revoke {
        /// The member.
        node: NodeId,
        /// Its fenced identity.
        incarnation: u64,
        /// The target cluster.
        target: String,
    },
    /// Make sure the identity's user exists on `target` (never change an existing one).
    Ensure {
        /// The member.
        node: NodeId,
        /// Its identity.
        incarnation: u64,
        /// The target cluster.
        target: String,
    },
    /// Revoke the stale identity on every fenced target, then commit `ForgetIdentity`.
    Forget {
        /// The member.
        node: NodeId,
        /// The stale identity.
        incarnation: u64,
    },
}

/// The leader's fencing operations in progress, what it ensured, and the metrics.
#[derive(Default)]
pub(crate) struct FenceTracker {
    /// Operations with a task running (never two tasks for one operation), each with whether
    /// an attempt of it failed (it is retrying).
    in_flight: Mutex<BTreeMap<FenceOp, bool>>,
    /// The term and the identities (target, node, incarnation) whose user this node made sure
    /// exists on the target while leading it. A new term starts empty: another leader may
    /// have acted in between.
    ensured: Mutex<(u64, EnsuredUsers)>,
    /// Revokes acknowledged by a target and committed (a member fenced on one target).
    pub(crate) fences: AtomicU64,
    /// Failed attempts of any operation (each is retried).
    pub(crate) failures: AtomicU64,
    /// The latest failure, for status.
    pub(crate) last_error: Mutex<Option<String>>,
    /// Wakes the assignment loop when an operation finished (its grants can follow at once).
    pub(crate) done: Notify,
    /// The term, and the revokes whose target acknowledged, handed to the assignment loop
    /// with the `FenceTarget` to commit: its next round writes them ahead of its own commands
    /// (see [`hand_to_round`]); each leaves once written.
    handed: Mutex<(u64, BTreeMap<FenceOp, ControlCommand>)>,
    /// Counts the rounds that wrote handed acknowledgements (their tasks wait on it).
    rounds_written: watch::Sender<u64>,
}

impl FenceTracker {
    /// Revokes waiting for a target's acknowledgement now.
    pub(crate) fn pending_fences(&self) -> usize {
        lock(&self.in_flight)
            .keys()
            .filter(|op| matches!(op, FenceOp::Revoke { .. }))
            .count()
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// What this node ensured while leading `term`.
    pub(crate) fn ensured(&self, term: u64) -> EnsuredUsers {
        let ensured = lock(&self.ensured);
        if ensured.0 == term {
            ensured.1.clone()
        } else {
            BTreeSet::new()
        }
    }

    /// The identities whose user this node is making sure of now, none of their attempts
    /// failed (`assign::FencingView::ensuring`): a task runs for them while this node leads.
    pub(crate) fn ensuring(&self) -> EnsuredUsers {
        lock(&self.in_flight)
            .iter()
            .filter(|(_, failed)| !**failed)
            .filter_map(|(op, _)| op.ensured_user())
            .collect()
    }

    /// The acknowledgements handed to the assignment loop in `term`, not written yet.
    pub(crate) fn handed(&self, term: u64) -> Vec<(FenceOp, ControlCommand)> {
        let handed = lock(&self.handed);
        if handed.0 != term {
            return Vec::new();
        }
        handed
            .1
            .iter()
            .map(|(op, cmd)| (op.clone(), cmd.clone()))
            .collect()
    }

    /// The round of `term` that carried `ops`' acknowledgements was written.
    pub(crate) fn written_with_round(&self, term: u64, ops: impl IntoIterator<Item = FenceOp>) {
        {
            let mut handed = lock(&self.handed);
            if handed.0 == term {
                for op in ops {
                    handed.1.remove(&op);
                }
            }
        }
        self.rounds_written.send_modify(|n| *n += 1);
    }

    fn hand_over(&self, term: u64, op: FenceOp, cmd: ControlCommand) {
        let mut handed = lock(&self.handed);
        if handed.0 != term {
            *handed = (term, BTreeMap::new());
        }
        handed.1.insert(op, cmd);
    }

    /// Whether `op`'s acknowledgement waits to be written with a round of `term`.
    fn is_handed(&self, term: u64, op: &FenceOp) -> bool {
        let handed = lock(&self.handed);
        handed.0 == term && handed.1.contains_key(op)
    }

    /// Takes `op`'s acknowledgement back from the assignment loop; whether it was still there
    /// (not written).
    fn take_back(&self, term: u64, op: &FenceOp) -> bool {
        let mut handed = lock(&self.handed);
        handed.0 == term && handed.1.remove(op).is_some()
    }

    fn record_ensured(&self, term: u64, entry: (String, NodeId, u64)) {
        let mut ensured = lock(&self.ensured);
        if ensured.0 != term {
            *ensured = (term, BTreeSet::new());
        }
        ensured.1.insert(entry);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts a task for every target operation of `work` not already running (leader, term
/// `term`); its commands are written by the caller with the round.
pub(crate) fn start<N: FenceNode>(node: &Arc<N>, fencing: &Fencing, term: u64, work: FenceWork) {
    for op in work.ops() {
        if lock(&node.tracker().in_flight)
            .insert(op.clone(), false)
            .is_some()
        {
            continue;
        }
        let span = tracing::info_span!("fence_op", node = %node.id(), term, op = ?op);
        let task = run(node.clone(), fencing.fence.clone(), op, term);
        tokio::spawn(tracing::Instrument::instrument(task, span));
    }
}

impl FenceWork {
    /// The operations on the targets, revokes first.
    pub(crate) fn ops(self) -> impl Iterator<Item = FenceOp> {
        let revokes = self
            .revoke
            .into_iter()
            .map(|(node, incarnation, target)| FenceOp::Revoke {
                node,
                incarnation,
                target,
            });
        let ensures = self
            .ensure
            .into_iter()
            .map(|(node, incarnation, target)| FenceOp::Ensure {
                node,
                incarnation,
                target,
            });
        let forgets = self
            .forget
            .into_iter()
            .map(|(node, incarnation)| FenceOp::Forget { node, incarnation });
        revokes.chain(ensures).chain(forgets)
    }
}

impl FenceOp {
    /// The identity an ensure makes sure of, as (target, node, incarnation); `None` for the
    /// other operations.
    pub fn ensured_user(&self) -> Option<(String, NodeId, u64)> {
        match self {
            FenceOp::Ensure {
                node,
                incarnation,
                target,
            } => Some((target.clone(), *node, *incarnation)),
            _ => None,
        }
    }

    /// What the leader commits once the targets acknowledged this operation (`None` for an
    /// ensure, which only this leader's memory records). The flows of a revoked target are
    /// the ones writing there now: a reload between the decision and this commit changes
    /// which units the acknowledgement frees, never which target it is about.
    ///
    /// Only the flows `node` runs as the leader (`reference`) does: a member whose config of
    /// a flow differs may write there with the cluster's configured credential, which the
    /// revoke does not stop, so its units of that flow move on the lease alone (see
    /// `assign::MemberLeases::fenced_for`).
    pub(crate) fn acknowledged(
        &self,
        topology: &FenceTopology,
        state: &ControlState,
        reference: Option<NodeId>,
    ) -> Option<ControlCommand> {
        match self {
            FenceOp::Revoke {
                node,
                incarnation,
                target,
            } => Some(ControlCommand::FenceTarget {
                node: *node,
                incarnation: *incarnation,
                target: target.clone(),
                flows: topology
                    .flows_into(target)
                    .into_iter()
                    .filter(|flow| crate::assign::config_agrees(state, reference, *node, flow))
                    .collect(),
            }),
            FenceOp::Ensure { .. } => None,
            FenceOp::Forget { node, incarnation } => Some(ControlCommand::ForgetIdentity {
                node: *node,
                incarnation: *incarnation,
            }),
        }
    }
}

/// How long one attempt may take (every target, one request each or a few).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before retrying a failed attempt; doubles up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// Runs `op` (see [`drive`]) and then lets the next round start it again if still needed.
async fn run<N: FenceNode>(node: Arc<N>, fence: Arc<dyn WriterFence>, op: FenceOp, term: u64) {
    drive(&*node, &*fence, &op, term).await;
    lock(&node.tracker().in_flight).remove(&op);
}

/// Drives `op` until it is done (its outcome committed or recorded), this node stops leading
/// `term`, or the node stops.
async fn drive<N: FenceNode>(node: &N, fence: &dyn WriterFence, op: &FenceOp, term: u64) {
    let mut pause = FIRST_RETRY;
    while !node.stopping().is_cancelled() && node.leads(term) {
        tracing::debug!("asking the target");
        let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, attempt(node, fence, op));
        let reason = match attempt.await {
            Ok(Ok(Some(cmd))) => {
                let with_round = matches!(op, FenceOp::Revoke { .. })
                    && hand_to_round(node, op, &cmd, term).await;
                let written = if with_round {
                    Ok(())
                } else {
                    node.write(&cmd).await.map(drop)
                };
                match written {
                    Ok(()) => {
                        if matches!(op, FenceOp::Revoke { .. }) {
                            node.tracker().fences.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(
                                "member fenced on this target: its units writing there move"
                            );
                        } else {
                            tracing::info!("done");
                        }
                        node.tracker().done.notify_one();
                    }
                    // The next round asks again if it still needs it.
                    Err(e) => tracing::warn!(error = %e, "outcome not committed"),
                }
                return;
            }
            Ok(Ok(None)) => {
                if let FenceOp::Ensure {
                    node: member,
                    incarnation,
                    target,
                } = op
                {
                    node.tracker()
                        .record_ensured(term, (target.clone(), *member, *incarnation));
                    tracing::debug!("writer user exists on the target");
                }
                node.tracker().done.notify_one();
                return;
            }
            Ok(Err(reason)) => reason,
            Err(_) => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
        };
        node.tracker().failures.fetch_add(1, Ordering::Relaxed);
        let first_failure = lock(&node.tracker().in_flight)
            .get_mut(op)
            .is_some_and(|failed| !std::mem::replace(failed, true));
        if first_failure {
            // A failed ensure no longer holds its member's share of units back.
            node.tracker().done.notify_one();
        }
        tracing::warn!(error = %reason, retry_in = ?pause, "target cluster did not acknowledge");
        *lock(&node.tracker().last_error) = Some(format!("{op:?}: {reason}"));
        tokio::select! {
            () = node.stopping().cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_RETRY);
    }
}

/// How long a revoke's acknowledgement waits for a round to write it before its task writes
/// it alone: the loop writes one round at a time, each one Raft write (a round trip or two
/// between regions), and retries a failed one on its next tick.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(3);

/// Hands a revoke's acknowledgement (`cmd`, a `FenceTarget`) to the assignment loop, which
/// writes it ahead of its next round's commands: the units it frees are granted in the same
/// Raft entry, one write fewer on every failover. True once a round wrote it; false when none
/// did within [`HANDOVER_TIMEOUT`] (it is taken back, for the caller to write alone) or the
/// node stops.
async fn hand_to_round<N: FenceNode>(
    node: &N,
    op: &FenceOp,
    cmd: &ControlCommand,
    term: u64,
) -> bool {
    let tracker = node.tracker();
    let mut rounds = tracker.rounds_written.subscribe();
    tracker.hand_over(term, op.clone(), cmd.clone());
    tracker.done.notify_one();
    let deadline = tokio::time::Instant::now() + HANDOVER_TIMEOUT;
    loop {
        if !tracker.is_handed(term, op) {
            return true;
        }
        tokio::select! {
            changed = rounds.changed() => {
                if changed.is_err() {
                    return !tracker.take_back(term, op);
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                let taken_back = tracker.take_back(term, op);
                if taken_back {
                    tracing::warn!("no assignment round wrote the acknowledgement in time; writing it alone");
                }
                return !taken_back;
            }
            () = node.stopping().cancelled() => return !tracker.take_back(term, op),
        }
    }
}

/// One attempt at `op` on the targets; the command to commit when it succeeded (`None`: an
/// ensure, which commits nothing).
async fn attempt<N: FenceNode>(
    node: &N,
    fence: &dyn WriterFence,
    op: &FenceOp,
) -> Result<Option<ControlCommand>, String> {
    match op {
        FenceOp::Revoke {
            node: member,
            incarnation,
            target,
        } => fence.revoke(target, *member, *incarnation).await?,
        FenceOp::Ensure {
            node: member,
            incarnation,
            target,
        } => {
            // The identity as committed (an older leader's stored its password): a login
            // that is no longer current needs nothing.
            let login = {
                let data = node.shared().read();
                match data.state.identities.get(member) {
                    Some(i) if i.incarnation == *incarnation && !i.fenced => node
                        .shared()
                        .passwords
                        .login(*member, *incarnation, &i.password),
                    _ => return Ok(None),
                }
            };
            fence.ensure(target, &login).await?;
        }
        FenceOp::Forget {
            node: member,
            incarnation,
        } => {
            let targets: Vec<String> = node
                .fence_topology()
                .fenced_targets()
                .into_iter()
                .map(str::to_owned)
                .collect();
            for target in &targets {
                fence.revoke(target, *member, *incarnation).await?;
            }
        }
    }
    let topology = node.fence_topology();
    let data = node.shared().read();
    Ok(op.acknowledged(&topology, &data.state, Some(node.id())))
}
