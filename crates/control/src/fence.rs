//! Fencing at the target clusters: the leader's side.
//!
//! A lease is a promise an instance makes to itself; a fence has to be enforced by the party
//! that stores the data. Iggy checks a user's permissions on every request of a live session,
//! so with fencing on every node writes to each fenced target as a user of its own (one per
//! *incarnation*, see [`WriterLogin`]), and the leader, before it hands a failed node's units
//! writing to target T to others, takes that user's rights away on T and waits for T's
//! acknowledgement. Fencing is per (member, target): the order `FenceMember` (the decision,
//! committed first so that a leader cut off from the majority revokes nobody) → revoke on T →
//! `FenceTarget` (which frees the member's units writing to T) → grant → the new owner's tail
//! scan → its first send is what makes a stale write to T impossible whatever the old owner
//! does (ARCHITECTURE.md, "Never two owners"). A target that does not answer holds back only
//! the units that write to it.
//!
//! The Iggy side is behind [`WriterFence`] (the binary implements it with the SDK); this module
//! runs the operations [`crate::assign::fence_work`] asks for, one task per operation, retried
//! with backoff until acknowledged or this node stops leading, and commits their outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use replicator_model::{NodeId, WriterLogin};
use tokio::sync::Notify;

use crate::assign::FenceWork;
use crate::command::ControlCommand;
use crate::node::NodeInner;
use crate::state::ControlState;

/// The future every [`WriterFence`] operation returns; the error is a one-line reason.
pub type FenceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// What the leader does to the writer users on one fenced target cluster. Every operation is
/// idempotent and succeeds only once the target acknowledged it.
pub trait WriterFence: Send + Sync + 'static {
    /// Makes sure `login`'s user exists on `target`: creates it with writing rights only
    /// (send, poll, read) unless a user of that name exists, which stays as it is. An
    /// existing one is either this identity's (created by an earlier attempt, with the same
    /// derived password) or revoked, and a revoked user never gets rights back.
    fn ensure<'a>(&'a self, target: &'a str, login: &'a WriterLogin) -> FenceFuture<'a, ()>;

    /// Takes every right of `node`'s `incarnation` user on `target` away and stops it from
    /// logging in; its open sessions are refused on their next request. A missing user is
    /// created that way (no rights, inactive), so that an `ensure` of a deposed leader that
    /// arrives later finds the name taken instead of creating a user with rights. The user
    /// is never deleted: Iggy reuses user ids, so a session of a deleted user could inherit a
    /// later user's rights, and whether a user still has sessions cannot be known (on a server
    /// with several shards `GET_CLIENTS` lists only the sessions of the shard that answers).
    fn revoke<'a>(&'a self, target: &'a str, node: NodeId, incarnation: u64)
        -> FenceFuture<'a, ()>;
}

/// How the control plane fences (`ControlParams::fencing`).
#[derive(Clone)]
pub struct Fencing {
    /// The target clusters' side.
    pub fence: Arc<dyn WriterFence>,
    /// Which flows write to which fenced target at start; `Control::set_fence_topology`
    /// replaces it after a reload.
    pub topology: FenceTopology,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("topology", &self.topology)
            .finish_non_exhaustive()
    }
}

/// Where each flow writes, as far as fencing goes: from this node's config, so it follows
/// reloads and restarts. On the leader it decides which targets a fence must reach, which
/// units each acknowledgement frees, and where every identity needs a user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceTopology {
    /// Flow name → its target's alias when that target is fenced (`None`: unfenced).
    flows: BTreeMap<String, Option<String>>,
}

impl FenceTopology {
    /// From (flow name, the alias of its target if that target has fencing on).
    pub fn new(flows: impl IntoIterator<Item = (String, Option<String>)>) -> Self {
        Self {
            flows: flows.into_iter().collect(),
        }
    }

    /// The fenced target `flow` writes to. `None` for an unfenced target and for a flow this
    /// config does not have: their units move on the lease alone.
    pub(crate) fn fenced_target(&self, flow: &str) -> Option<&str> {
        self.flows.get(flow).and_then(|t| t.as_deref())
    }

    /// Every fenced target some flow writes to.
    pub(crate) fn fenced_targets(&self) -> BTreeSet<&str> {
        self.flows.values().filter_map(|t| t.as_deref()).collect()
    }

    /// The flows writing to `target`.
    pub(crate) fn flows_into(&self, target: &str) -> Vec<String> {
        self.flows
            .iter()
            .filter(|(_, t)| t.as_deref() == Some(target))
            .map(|(flow, _)| flow.clone())
            .collect()
    }
}

/// Identities whose user exists on a target, as (target, node, incarnation).
pub(crate) type EnsuredUsers = BTreeSet<(String, NodeId, u64)>;

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
    /// Operations with a task running (never two tasks for one operation).
    in_flight: Mutex<BTreeSet<FenceOp>>,
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
}

impl FenceTracker {
    /// Revokes waiting for a target's acknowledgement now.
    pub(crate) fn pending_fences(&self) -> usize {
        lock(&self.in_flight)
            .iter()
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
pub(crate) fn start(node: &Arc<NodeInner>, fencing: &Fencing, term: u64, work: FenceWork) {
    for op in work.ops() {
        if !lock(&node.fencing.in_flight).insert(op.clone()) {
            continue;
        }
        let span = tracing::info_span!("fence_op", node = %node.id, term, op = ?op);
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
async fn run(node: Arc<NodeInner>, fence: Arc<dyn WriterFence>, op: FenceOp, term: u64) {
    drive(&node, &*fence, &op, term).await;
    lock(&node.fencing.in_flight).remove(&op);
}

/// Drives `op` until it is done (its outcome committed or recorded), this node stops leading
/// `term`, or the node stops.
async fn drive(node: &NodeInner, fence: &dyn WriterFence, op: &FenceOp, term: u64) {
    let mut pause = FIRST_RETRY;
    while !node.cancel.is_cancelled() && node.leads(term) {
        let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, attempt(node, fence, op));
        let reason = match attempt.await {
            Ok(Ok(Some(cmd))) => {
                match node.write(&cmd).await {
                    Ok(_) => {
                        if matches!(op, FenceOp::Revoke { .. }) {
                            node.fencing.fences.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(
                                "member fenced on this target: its units writing there move"
                            );
                        } else {
                            tracing::info!("done");
                        }
                        node.fencing.done.notify_one();
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
                    node.fencing
                        .record_ensured(term, (target.clone(), *member, *incarnation));
                    tracing::debug!("writer user exists on the target");
                }
                node.fencing.done.notify_one();
                return;
            }
            Ok(Err(reason)) => reason,
            Err(_) => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
        };
        node.fencing.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %reason, retry_in = ?pause, "target cluster did not acknowledge");
        *lock(&node.fencing.last_error) = Some(format!("{op:?}: {reason}"));
        tokio::select! {
            () = node.cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_RETRY);
    }
}

/// One attempt at `op` on the targets; the command to commit when it succeeded (`None`: an
/// ensure, which commits nothing).
async fn attempt(
    node: &NodeInner,
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
                let data = node.shared.read();
                match data.state.identities.get(member) {
                    Some(i) if i.incarnation == *incarnation && !i.fenced => node
                        .shared
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
    let data = node.shared.read();
    Ok(op.acknowledged(&topology, &data.state, Some(node.id)))
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn the_topology_says_where_each_flow_writes() {
        let t = FenceTopology::new([
            ("a".to_owned(), Some("eu".to_owned())),
            ("b".to_owned(), Some("ap".to_owned())),
            ("c".to_owned(), Some("eu".to_owned())),
            ("d".to_owned(), None),
        ]);
        check!(t.fenced_target("a") == Some("eu"));
        check!(t.fenced_target("d") == None);
        check!(t.fenced_target("unknown") == None);
        check!(t.fenced_targets() == BTreeSet::from(["ap", "eu"]));
        check!(t.flows_into("eu") == vec!["a".to_owned(), "c".to_owned()]);
        check!(t.flows_into("nowhere").is_empty());
    }
}
