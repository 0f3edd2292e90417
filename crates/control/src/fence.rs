//! Fencing at the target clusters: the leader's side.
//!
//! A lease is a promise an instance makes to itself; a fence has to be enforced by the party
//! that stores the data. Iggy checks a user's permissions on every request of a live session,
//! so with fencing on every node writes to the target clusters as a user of its own (one per
//! *incarnation*, see [`WriterLogin`]) and the leader, before it hands a failed node's units to
//! others, takes that user's rights away on every fenced target and waits for the
//! acknowledgement. The order `FenceMember` (the decision, committed first so that a leader cut
//! off from the majority revokes nobody) → revoke → `FenceAcknowledged` (which frees the units)
//! → grant → the new owner's tail scan → its first send is what makes a stale write impossible
//! whatever the old owner does (ARCHITECTURE.md, "Never two owners").
//!
//! The Iggy side is behind [`WriterFence`] (the binary implements it with the SDK); this module
//! runs the operations [`crate::assign::fence_work`] asks for, one task per operation, retried
//! with backoff until acknowledged or this node stops leading, and commits their outcome.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use replicator_model::{NodeId, WriterLogin};
use tokio::sync::Notify;

use crate::assign::FenceWork;
use crate::command::{ControlCommand, ControlResponse};
use crate::node::NodeInner;

/// The future every [`WriterFence`] operation returns; the error is a one-line reason.
pub type FenceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// What the leader does to the writer users on the fenced target clusters. Every operation is
/// idempotent and covers every fenced target; it succeeds only once all of them acknowledged.
pub trait WriterFence: Send + Sync + 'static {
    /// Creates `login`'s user with writing rights only (send, poll, read), replacing a user of
    /// the same name that no session uses (left behind by a leader that failed before it
    /// committed the identity).
    fn provision<'a>(&'a self, login: &'a WriterLogin) -> FenceFuture<'a, ()>;

    /// Takes every right of `node`'s `incarnation` user away and stops it from logging in. Its
    /// open sessions are refused on their next request.
    fn revoke(&self, node: NodeId, incarnation: u64) -> FenceFuture<'_, ()>;

    /// Makes sure the user of a stale identity has no rights and cannot log in on every target.
    /// The user is never deleted: Iggy reuses user ids, so a session of a deleted user could
    /// inherit a later user's rights, and whether a user still has sessions cannot be known
    /// (on a server with several shards `GET_CLIENTS` lists only the sessions of the shard
    /// that answers).
    fn retire(&self, node: NodeId, incarnation: u64) -> FenceFuture<'_, ()>;
}

/// How the control plane fences (`ControlParams::fencing`).
#[derive(Clone)]
pub struct Fencing {
    /// The target clusters' side.
    pub fence: Arc<dyn WriterFence>,
    /// Whether every target cluster a flow writes to is fenced. Only then may a failed
    /// member's units move before its lease ran out (`ControlTiming::fence_after`); otherwise
    /// the unfenced targets still rely on the lease, and the leader waits for it too.
    pub every_target_fenced: bool,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("every_target_fenced", &self.every_target_fenced)
            .finish_non_exhaustive()
    }
}

/// One operation on the targets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum FenceOp {
    Fence { node: NodeId, incarnation: u64 },
    Provision { node: NodeId, incarnation: u64 },
    Retire { node: NodeId, incarnation: u64 },
}

/// The leader's fencing operations in progress, and their metrics.
#[derive(Default)]
pub(crate) struct FenceTracker {
    /// Operations with a task running (never two tasks for one operation).
    in_flight: Mutex<BTreeSet<FenceOp>>,
    /// Fences acknowledged by every target and committed.
    pub(crate) fences: AtomicU64,
    /// Failed attempts of any operation (each is retried).
    pub(crate) failures: AtomicU64,
    /// The latest failure, for status.
    pub(crate) last_error: Mutex<Option<String>>,
    /// Wakes the assignment loop when an operation committed (its grants can follow at once).
    pub(crate) done: Notify,
}

impl FenceTracker {
    /// Fences waiting for the targets' acknowledgement now.
    pub(crate) fn pending_fences(&self) -> usize {
        lock(&self.in_flight)
            .iter()
            .filter(|op| matches!(op, FenceOp::Fence { .. }))
            .count()
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts a task for every operation of `work` not already running (leader, term `term`).
pub(crate) fn start(node: &Arc<NodeInner>, fencing: &Fencing, term: u64, work: FenceWork) {
    let ops = work
        .fence
        .into_iter()
        .map(|(node, incarnation)| FenceOp::Fence { node, incarnation })
        .chain(
            work.provision
                .into_iter()
                .map(|(node, incarnation)| FenceOp::Provision { node, incarnation }),
        )
        .chain(
            work.retire
                .into_iter()
                .map(|(node, incarnation)| FenceOp::Retire { node, incarnation }),
        );
    for op in ops {
        if !lock(&node.fencing.in_flight).insert(op.clone()) {
            continue;
        }
        let span = tracing::info_span!("fence_op", node = %node.id, term, op = ?op);
        let task = run(node.clone(), fencing.fence.clone(), op, term);
        tokio::spawn(tracing::Instrument::instrument(task, span));
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

/// Drives `op` until its outcome is committed, this node stops leading `term`, or the node
/// stops.
async fn drive(node: &NodeInner, fence: &dyn WriterFence, op: &FenceOp, term: u64) {
    if let FenceOp::Fence {
        node: member,
        incarnation,
    } = *op
    {
        // Nothing is revoked on the targets before the decision is in the log: a leader that
        // lost its majority cannot commit it, so it cannot take rights from members that the
        // majority still counts as owners (they would stall, fenced by nobody's decision).
        let decide = ControlCommand::FenceMember {
            node: member,
            incarnation,
        };
        match node.write(&decide).await {
            Ok((_, ControlResponse::Done)) => {}
            Ok((_, other)) => return tracing::info!(outcome = ?other, "fence not decided"),
            Err(e) => return tracing::warn!(error = %e, "fence decision not committed"),
        }
    }
    let mut pause = FIRST_RETRY;
    while !node.cancel.is_cancelled() && node.leads(term) {
        let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, attempt(fence, op));
        let reason = match attempt.await {
            Ok(Ok(cmd)) => {
                match node.write(&cmd).await {
                    Ok(_) => {
                        if matches!(op, FenceOp::Fence { .. }) {
                            node.fencing.fences.fetch_add(1, Ordering::Relaxed);
                            tracing::info!("member fenced on every target: its units move");
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
            Ok(Err(reason)) => reason,
            Err(_) => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
        };
        node.fencing.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %reason, retry_in = ?pause, "target clusters did not acknowledge");
        *lock(&node.fencing.last_error) = Some(format!("{op:?}: {reason}"));
        tokio::select! {
            () = node.cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_RETRY);
    }
}

/// One attempt at `op` on the targets; the command to commit when it succeeded.
async fn attempt(fence: &dyn WriterFence, op: &FenceOp) -> Result<ControlCommand, String> {
    match *op {
        FenceOp::Fence { node, incarnation } => {
            fence.revoke(node, incarnation).await?;
            Ok(ControlCommand::FenceAcknowledged { node, incarnation })
        }
        FenceOp::Provision { node, incarnation } => {
            let login = WriterLogin {
                node,
                incarnation,
                password: new_password()?,
            };
            fence.provision(&login).await?;
            Ok(ControlCommand::SetWriterIdentity {
                node,
                incarnation,
                password: login.password,
            })
        }
        FenceOp::Retire { node, incarnation } => {
            fence.retire(node, incarnation).await?;
            Ok(ControlCommand::ForgetIdentity { node, incarnation })
        }
    }
}

/// 32 random hex digits (Iggy takes passwords of 3 to 100 characters).
fn new_password() -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system's random source failed".to_owned())?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
