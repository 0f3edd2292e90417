//! The running node: shared handles (`NodeInner`), the write path that forwards to the leader,
//! and the background tasks (lease renewer, commit batcher, assignment loop).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, Raft, ServerState};
use replicator_model::{CommitOutcome, NodeId, ProgressCommit};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::admin;
use crate::assign;
use crate::command::{ControlCommand, ControlResponse, Rejection};
use crate::data_dir::StopMark;
use crate::error::{Error, Result};
use crate::fence::{FenceTopology, Fencing};
use crate::fence_ops::{self, FenceNode, FenceTracker};
use crate::format;
use crate::lease::{owner_lease_until, LeaderView};
use crate::network::auth::{InboundGuard, Signer};
use crate::network::client::{PeerClient, PEER_WARM_INTERVAL};
use crate::network::server::RpcNode;
use crate::network::{
    paths, FaultSwitch, ManageRequest, PingReply, TakeOver, TakeOverReply, WriteReply,
};
use crate::params::ControlTiming;
use crate::retention::Retention;
use crate::state_machine::Shared;
use crate::{ClusterStatus, MemberNode, TypeConfig};

/// Monotonic counters exported as metrics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) lease_renewals: AtomicU64,
    pub(crate) fenced_commits: AtomicU64,
    pub(crate) commit_batches: AtomicU64,
}

/// One call waiting for the next batch entry: the batcher writes every commit and release
/// queued within `commit_batch_interval` as one Raft entry.
pub(crate) enum BatchRequest {
    /// `Control::commit`: offsets of one caller, answered with one outcome per commit.
    Commits {
        commits: Vec<ProgressCommit>,
        reply: oneshot::Sender<Result<Vec<CommitOutcome>>>,
    },
    /// One more command of this node, answered with its own response: `Control::release` (a
    /// unit handed back: a drain of hundreds of units releases them in a few entries instead
    /// of one entry, and one round trip, each) and `Control::record_start` (every unit that
    /// starts for the first time records where, which must not cost an entry per unit either).
    Command {
        command: ControlCommand,
        reply: oneshot::Sender<Result<ControlResponse>>,
    },
}

impl BatchRequest {
    /// Commands it adds to the entry (commits count one each).
    fn size(&self) -> usize {
        match self {
            BatchRequest::Commits { commits, .. } => commits.len(),
            BatchRequest::Command { .. } => 1,
        }
    }
}

/// What every task and RPC handler of a node shares.
pub(crate) struct NodeInner {
    /// This node.
    pub(crate) id: NodeId,
    /// The Raft handle.
    pub(crate) raft: Raft<TypeConfig>,
    /// Applied state, assignments watch.
    pub(crate) shared: Arc<Shared>,
    /// Outbound authenticated client.
    pub(crate) peers: PeerClient,
    /// Test seam cutting the node off the network.
    pub(crate) fault: Arc<FaultSwitch>,
    /// Verifies the signature of inbound RPCs (keyed with the cluster secret).
    pub(crate) signer: Signer,
    /// This run of the RPC server (node id, boot id) and its nonce record: refuses inbound
    /// RPCs signed for another node or run, and replays within the signature's validity.
    pub(crate) inbound: InboundGuard,
    /// Timing values.
    pub(crate) timing: ControlTiming,
    /// Advertised Raft address.
    pub(crate) raft_addr: String,
    /// Advertised admin API address.
    pub(crate) api_addr: String,
    /// The configured initial members (bootstrap).
    pub(crate) initial_members: BTreeMap<NodeId, String>,
    /// Until when this node may write (see the crate docs); `None` before the first renewal.
    pub(crate) lease: Mutex<Option<std::time::Instant>>,
    /// The leader's lease view, published by the assignment loop for status.
    pub(crate) leader_view: Mutex<Option<LeaderView>>,
    /// Set by `leave` and `begin_leaving`: never re-register as active.
    pub(crate) leaving: AtomicBool,
    /// Set at start when this node's previous process stopped gracefully and marked it
    /// `Leaving` ([`crate::data_dir::StopMark`]); cleared once this process's registration
    /// committed, after which a `Leaving` mark is an operator's removal and stays.
    pub(crate) left_at_stop: AtomicBool,
    /// Set by `Control::begin_drain`: writes give up after `drain_write_timeout`.
    pub(crate) draining: AtomicBool,
    /// Set while this leader hands its leadership over (`handover`): it writes nothing more.
    pub(crate) handing_over: AtomicBool,
    /// Metrics counters.
    pub(crate) counters: Counters,
    /// How this cluster fences failed members on the target clusters (`None`: leases only).
    pub(crate) fence: Option<Fencing>,
    /// The leader's fencing operations in progress.
    pub(crate) fencing: FenceTracker,
    /// Which flows write to which fenced target: this node's config, replaced on reload.
    pub(crate) fence_topology: Mutex<FenceTopology>,
    /// The commit index the log store last saved, plus one (0: none), for metrics.
    pub(crate) committed: Arc<AtomicU64>,
    /// Stops every task.
    pub(crate) cancel: CancellationToken,
}

/// A request that must run on the leader.
enum Routed<'a> {
    Write(&'a ControlCommand),
    Manage(&'a ManageRequest),
}

impl NodeInner {
    /// Whether this node leads `term` now.
    pub(crate) fn leads(&self, term: u64) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.state == ServerState::Leader
            && m.current_leader == Some(self.id)
            && m.current_term == term
    }

    /// Which flows write to which fenced target now.
    pub(crate) fn fence_topology(&self) -> FenceTopology {
        self.fence_topology
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The leader this node knows of and its Raft address.
    pub(crate) fn leader(&self) -> (Option<NodeId>, Option<String>) {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let leader = m.current_leader;
        let addr = leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.raft_addr.clone())
        });
        (leader, addr)
    }

    /// While this leader hands over (`handover`) its log must not grow: a write is answered
    /// "retry", and the writer's next attempt finds the new leader.
    fn refuse_while_handing_over(&self) -> Option<WriteReply> {
        self.handing_over
            .load(Ordering::SeqCst)
            .then(|| WriteReply::Failed {
                reason: "the leader is handing its leadership over".into(),
                transient: true,
            })
    }

    fn write_reply(
        r: std::result::Result<
            openraft::raft::ClientWriteResponse<TypeConfig>,
            RaftError<NodeId, ClientWriteError<NodeId, MemberNode>>,
        >,
    ) -> WriteReply {
        match r {
            Ok(resp) => WriteReply::Applied {
                index: resp.log_id.index,
                response: resp.data,
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                WriteReply::ForwardToLeader {
                    leader: f.leader_id,
                }
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                WriteReply::Failed {
                    reason: e.to_string(),
                    transient: true,
                }
            }
            Err(RaftError::Fatal(e)) => WriteReply::Failed {
                reason: e.to_string(),
                transient: false,
            },
        }
    }

    /// Writes `cmd` through this node's Raft (which must be the leader), bounded in time.
    pub(crate) async fn local_write(&self, cmd: ControlCommand) -> WriteReply {
        if let Some(refused) = self.refuse_while_handing_over() {
            return refused;
        }
        match tokio::time::timeout(self.timing.write_timeout, self.raft.client_write(cmd)).await {
            Ok(r) => Self::write_reply(r),
            Err(_) => WriteReply::Failed {
                reason: "write not committed in time".into(),
                transient: true,
            },
        }
    }

    /// Executes a membership change on this node (which must be the leader).
    pub(crate) async fn local_manage(&self, req: ManageRequest) -> WriteReply {
        if let Some(refused) = self.refuse_while_handing_over() {
            return refused;
        }
        let deadline = self.timing.drain_timeout;
        let run = async {
            match req {
                ManageRequest::AddVoter { id, raft_addr } => {
                    let added = self
                        .raft
                        .add_learner(id, MemberNode { raft_addr }, true)
                        .await;
                    if let reply
                    @ (WriteReply::ForwardToLeader { .. } | WriteReply::Failed { .. }) =
                        Self::write_reply(added)
                    {
                        return reply;
                    }
                    let voters = std::collections::BTreeSet::from([id]);
                    Self::write_reply(
                        self.raft
                            .change_membership(ChangeMembers::AddVoterIds(voters), false)
                            .await,
                    )
                }
                ManageRequest::RemoveNode { id } => {
                    let (is_voter, is_node) = {
                        let metrics = self.raft.metrics();
                        let m = metrics.borrow();
                        let membership = m.membership_config.membership();
                        (
                            membership.voter_ids().any(|v| v == id),
                            membership.get_node(&id).is_some(),
                        )
                    };
                    let set = std::collections::BTreeSet::from([id]);
                    let change = if is_voter {
                        ChangeMembers::RemoveVoters(set)
                    } else if is_node {
                        ChangeMembers::RemoveNodes(set)
                    } else {
                        return WriteReply::Applied {
                            index: 0,
                            response: ControlResponse::Ignored(Rejection::UnknownMember),
                        };
                    };
                    Self::write_reply(self.raft.change_membership(change, false).await)
                }
            }
        };
        tokio::time::timeout(deadline, run)
            .await
            .unwrap_or(WriteReply::Failed {
                reason: "membership change not committed in time".into(),
                transient: true,
            })
    }

    async fn route(&self, req: Routed<'_>, within: Duration) -> Result<(u64, ControlResponse)> {
        let within = if self.draining.load(Ordering::SeqCst) {
            within.min(self.timing.drain_write_timeout())
        } else {
            within
        };
        let started = Instant::now();
        let deadline = started + within;
        let mut backoff = Duration::from_millis(5);
        let mut last = String::from("no leader known");
        loop {
            if self.cancel.is_cancelled() {
                return Err(Error::ShuttingDown);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::NoLeader {
                    waited: started.elapsed(),
                    last,
                });
            }
            let (leader, addr) = self.leader();
            let reply = match (leader, addr) {
                (Some(l), _) if l == self.id => {
                    let local = async {
                        match &req {
                            Routed::Write(cmd) => self.local_write((*cmd).clone()).await,
                            Routed::Manage(m) => self.local_manage((*m).clone()).await,
                        }
                    };
                    tokio::time::timeout(remaining, local)
                        .await
                        .unwrap_or(WriteReply::Failed {
                            reason: "leader did not commit in time".into(),
                            transient: true,
                        })
                }
                (Some(l), Some(addr)) => {
                    let sent = match &req {
                        // One attempt gets one RPC timeout, not the whole remaining time: a
                        // leader that died or lost its quorum after accepting the request
                        // must not hold the write until its deadline, when another leader
                        // may already answer. Every command is safe to send twice (epoch-
                        // and index-guarded, or idempotent).
                        Routed::Write(cmd) => {
                            let attempt = remaining.min(self.timing.rpc_timeout);
                            self.peers.call(l, &addr, paths::WRITE, cmd, attempt).await
                        }
                        Routed::Manage(m) => {
                            self.peers.call(l, &addr, paths::MANAGE, m, remaining).await
                        }
                    };
                    sent.unwrap_or_else(|e| WriteReply::Failed {
                        reason: format!("forward to leader {l}: {e}"),
                        transient: e.is_transient(),
                    })
                }
                (Some(l), None) => WriteReply::Failed {
                    reason: format!("address of leader {l} unknown"),
                    transient: true,
                },
                (None, _) => WriteReply::Failed {
                    reason: "no leader known".into(),
                    transient: true,
                },
            };
            match reply {
                WriteReply::Applied { index, response } => return Ok((index, response)),
                WriteReply::ForwardToLeader { leader } => {
                    last = format!("not the leader; leader is {leader:?}");
                }
                WriteReply::Failed {
                    reason,
                    transient: false,
                } => {
                    return Err(Error::Rpc {
                        peer: leader.unwrap_or(self.id),
                        reason,
                        transient: false,
                    })
                }
                WriteReply::Failed { reason, .. } => last = reason,
            }
            tokio::select! {
                () = self.cancel.cancelled() => return Err(Error::ShuttingDown),
                () = tokio::time::sleep(backoff.min(remaining)) => {}
            }
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
    }

    /// Writes `cmd` at the leader, forwarding and retrying across leader changes for `within`.
    pub(crate) async fn write_within(
        &self,
        cmd: &ControlCommand,
        within: Duration,
    ) -> Result<(u64, ControlResponse)> {
        Self::check_entry_size(cmd)?;
        self.check_feature_level(cmd)?;
        let written = self.route(Routed::Write(cmd), within).await?;
        self.shared.note_own_write(written.0);
        Ok(written)
    }

    /// [`Self::write_within`] with the configured `write_timeout`.
    pub(crate) async fn write(&self, cmd: &ControlCommand) -> Result<(u64, ControlResponse)> {
        self.write_within(cmd, self.timing.write_timeout).await
    }

    /// Refuses a command too large to be replicated (see `MAX_ENTRY_BYTES`).
    fn check_entry_size(cmd: &ControlCommand) -> Result<()> {
        let bytes = crate::command::encode("command", cmd)?.len();
        if bytes > crate::network::MAX_ENTRY_BYTES {
            return Err(Error::InvalidParams(format!(
                "a control-plane entry of {bytes} bytes is above the limit of {} (too many units in one flow?)",
                crate::network::MAX_ENTRY_BYTES
            )));
        }
        Ok(())
    }

    /// Refuses a command the cluster's feature level does not allow yet: a member of an
    /// older release could not read it (callers pick the command by the level first).
    fn check_feature_level(&self, cmd: &ControlCommand) -> Result<()> {
        let (needed, cluster) = (cmd.level(), self.shared.read().state.feature_level());
        if needed > cluster {
            return Err(Error::InvalidParams(format!(
                "this command needs feature level {needed}, the cluster runs at {cluster} \
                 until every member supports it"
            )));
        }
        Ok(())
    }

    /// Runs a membership change at the leader.
    pub(crate) async fn manage(&self, req: &ManageRequest) -> Result<ControlResponse> {
        let (_, resp) = self
            .route(Routed::Manage(req), self.timing.drain_timeout)
            .await?;
        Ok(resp)
    }

    /// Status as this node sees it; lease liveness only when it is the leader.
    pub(crate) fn local_status(&self) -> ClusterStatus {
        let view = self
            .leader_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let metrics = self.raft.metrics().borrow().clone();
        let data = self.shared.read();
        admin::build_status(admin::StatusInputs {
            node: self.id,
            metrics: &metrics,
            state: &data.state,
            view: view.as_ref(),
            now: std::time::Instant::now(),
            lease_expiry: self.timing.lease_expiry,
            fencing: if view.is_some() {
                (self.fencing.pending_fences(), self.fencing.last_error())
            } else {
                (0, None)
            },
        })
    }

    /// Whether this node should (re-)register itself: it is a Raft member and the state
    /// does not know it or knows other addresses, or its previous process stopped gracefully
    /// (marking it `Leaving`, `Control::begin_leaving`) and this one has not registered yet.
    fn needs_registration(&self) -> bool {
        if self.leaving.load(Ordering::SeqCst) {
            return false;
        }
        let in_membership = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .get_node(&self.id)
                .is_some()
        };
        if !in_membership {
            return false;
        }
        if self.left_at_stop.load(Ordering::SeqCst) {
            return true;
        }
        let data = self.shared.read();
        data.state
            .members
            .get(&self.id)
            .is_none_or(|m| m.raft_addr != self.raft_addr || m.api_addr != self.api_addr)
    }

    /// Whether this member's published feature level is missing or not this build's (the
    /// node was upgraded or rolled back since it last published).
    fn needs_feature_publication(&self) -> bool {
        let data = self.shared.read();
        data.state.members.contains_key(&self.id)
            && data.state.member_levels.get(&self.id) != Some(&format::SUPPORTED_LEVEL)
    }

    fn extend_lease(&self, until: std::time::Instant) {
        let mut lease = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lease.is_none_or(|l| l < until) {
            *lease = Some(until);
        }
    }
}

impl FenceNode for NodeInner {
    fn id(&self) -> NodeId {
        self.id
    }

    fn tracker(&self) -> &FenceTracker {
        &self.fencing
    }

    fn stopping(&self) -> &CancellationToken {
        &self.cancel
    }

    fn leads(&self, term: u64) -> bool {
        NodeInner::leads(self, term)
    }

    fn write(
        &self,
        cmd: &ControlCommand,
    ) -> impl Future<Output = Result<(u64, ControlResponse)>> + Send {
        NodeInner::write(self, cmd)
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn fence_topology(&self) -> FenceTopology {
        NodeInner::fence_topology(self)
    }
}

impl RpcNode for NodeInner {
    fn id(&self) -> NodeId {
        self.id
    }

    fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    fn fault(&self) -> &FaultSwitch {
        &self.fault
    }

    fn signer(&self) -> &Signer {
        &self.signer
    }

    fn inbound(&self) -> &InboundGuard {
        &self.inbound
    }

    fn local_write(&self, cmd: ControlCommand) -> impl Future<Output = WriteReply> + Send {
        NodeInner::local_write(self, cmd)
    }

    fn take_over(&self, req: TakeOver) -> impl Future<Output = TakeOverReply> + Send {
        NodeInner::take_over(self, req)
    }

    fn local_manage(&self, req: ManageRequest) -> impl Future<Output = WriteReply> + Send {
        NodeInner::local_manage(self, req)
    }

    fn local_status(&self) -> ClusterStatus {
        NodeInner::local_status(self)
    }
}

/// Renews this node's lease every `lease_renew_interval`; registers it first when needed.
pub(crate) async fn run_lease_renewer(node: Arc<NodeInner>, stop_mark: StopMark) {
    // Stopped wherever it is: a renewal written or waited for while the node stops (its Raft
    // peers already gone) would otherwise hold the stop for up to `lease_expiry`.
    let cancel = node.cancel.clone();
    tokio::select! {
        () = cancel.cancelled() => {}
        () = renew_leases(node, stop_mark) => {}
    }
}

async fn renew_leases(node: Arc<NodeInner>, stop_mark: StopMark) {
    let timing = node.timing.clone();
    let mut tick = tokio::time::interval(timing.lease_renew_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut attempt = 0u64;
    let mut applied = node.shared.subscribe_applied();
    let mut extensions = crate::lease::PendingExtensions::default();
    // Set when the leader refused a renewal from an unknown member while this node did not
    // see itself in the Raft membership yet: in a new cluster the first tick comes before
    // the leader's first entries tell a member that it is one. It registers as soon as it
    // does, not a `lease_renew_interval` later (every cluster's start waited that long
    // before its first grant; BENCHMARKS.md section 43).
    let mut unregistered = false;
    let mut raft_metrics = node.raft.metrics();
    loop {
        tokio::select! {
            () = node.cancel.cancelled() => return,
            _ = tick.tick() => {}
            changed = raft_metrics.changed(), if unregistered => {
                if changed.is_err() {
                    return;
                }
                if !node.needs_registration() {
                    continue;
                }
            }
            changed = applied.changed(), if !extensions.is_empty() => {
                if changed.is_err() {
                    return;
                }
                let index = *applied.borrow_and_update();
                if let Some(until) = extensions.applied(index, std::time::Instant::now()) {
                    tracing::debug!(
                        node = %node.id,
                        index,
                        valid_ms = until.saturating_duration_since(std::time::Instant::now()).as_millis() as u64,
                        "lease extended once applied here"
                    );
                    node.extend_lease(until);
                    node.counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
        }
        // Whether this round registers the node: its state may not have applied the
        // registration yet, which the leader's log orders before what follows.
        let registering = node.needs_registration();
        if registering {
            let cmd = ControlCommand::RegisterMember {
                node: node.id,
                raft_addr: node.raft_addr.clone(),
                api_addr: node.api_addr.clone(),
            };
            match node.write_within(&cmd, timing.lease_expiry).await {
                // On to the feature level and the first renewal at once: the round that
                // raises the cluster's level waits for every member's.
                Ok(_) => {
                    unregistered = false;
                    tracing::info!(node = %node.id, "registered as member");
                    // A `LeaveMember` of the previous process's stop committed before this
                    // registration, or never will: the mark has done its work.
                    if node.left_at_stop.swap(false, Ordering::SeqCst) {
                        if let Err(e) = stop_mark.set(false).await {
                            tracing::warn!(node = %node.id, error = %e, "clearing the stop mark failed; the next start registers once more");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %node.id, error = %e, "registration failed");
                    continue;
                }
            }
        }
        if registering || node.needs_feature_publication() {
            let cmd = ControlCommand::PublishFeatures {
                node: node.id,
                level: format::SUPPORTED_LEVEL,
            };
            match node.write_within(&cmd, timing.lease_expiry).await {
                Ok(_) => tracing::info!(
                    node = %node.id,
                    level = format::SUPPORTED_LEVEL,
                    "published the highest feature level this build supports"
                ),
                Err(e) => {
                    tracing::warn!(node = %node.id, error = %e, "publishing the feature level failed")
                }
            }
        }
        if let Some(incarnation) = node.shared.inherited_to_abandon() {
            // The identity an earlier process of this node wrote with: fenced before this
            // process writes (see `identity::Inheritance`); the next one follows at once.
            let cmd = ControlCommand::FenceMember {
                node: node.id,
                incarnation,
            };
            match node.write_within(&cmd, timing.lease_expiry).await {
                Ok(_) => tracing::info!(
                    node = %node.id,
                    incarnation,
                    "gave up the writer identity of this node's previous process"
                ),
                Err(e) => tracing::warn!(
                    node = %node.id,
                    incarnation,
                    error = %e,
                    "giving up the previous process's writer identity failed"
                ),
            }
        }
        let sent = std::time::Instant::now();
        let cmd = ControlCommand::RenewLease { node: node.id };
        match node.write_within(&cmd, timing.lease_expiry).await {
            Ok((
                index,
                ControlResponse::Renewed {
                    revoked_since_previous: false,
                },
            )) => {
                attempt = 0;
                // Extended once the local state has applied everything up to the renewal (see
                // `PendingExtensions`), without holding up the next renewal.
                extensions.push(
                    index,
                    owner_lease_until(sent, timing.lease_expiry, timing.lease_drift_margin),
                );
                let index = *applied.borrow_and_update();
                tracing::debug!(
                    node = %node.id,
                    index,
                    took_ms = sent.elapsed().as_millis() as u64,
                    "lease renewal committed"
                );
                if let Some(until) = extensions.applied(index, std::time::Instant::now()) {
                    node.extend_lease(until);
                    node.counters.lease_renewals.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok((_, ControlResponse::Renewed { .. })) => {
                tracing::info!(node = %node.id, "units were revoked since the previous renewal; lease not extended");
            }
            Ok((_, other)) => {
                unregistered = other == ControlResponse::Ignored(Rejection::UnknownMember)
                    && !node.leaving.load(Ordering::SeqCst);
                tracing::debug!(node = %node.id, response = ?other, "lease renewal not recorded");
            }
            Err(e) => {
                attempt += 1;
                tracing::warn!(node = %node.id, attempt, error = %e, "lease renewal failed");
            }
        }
    }
}

fn copy_error(e: &Error) -> Error {
    match e {
        Error::NoLeader { waited, last } => Error::NoLeader {
            waited: *waited,
            last: last.clone(),
        },
        Error::Rpc {
            peer,
            reason,
            transient,
        } => Error::Rpc {
            peer: *peer,
            reason: reason.clone(),
            transient: *transient,
        },
        Error::ShuttingDown => Error::ShuttingDown,
        other => Error::Raft(other.to_string()),
    }
}

/// Collects commit and release calls for `commit_batch_interval` and writes them as one entry;
/// keeps up to `commit_max_in_flight` entries in flight so a slow write does not hold the next.
pub(crate) async fn run_commit_batcher(node: Arc<NodeInner>, mut rx: mpsc::Receiver<BatchRequest>) {
    let timing = node.timing.clone();
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        while in_flight.len() >= timing.commit_max_in_flight.max(1) {
            in_flight.join_next().await;
        }
        let first = tokio::select! {
            () = node.cancel.cancelled() => break,
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => continue,
            r = rx.recv() => match r { Some(r) => r, None => break },
        };
        let mut count = first.size();
        let mut requests = vec![first];
        let deadline = Instant::now() + timing.commit_batch_interval;
        while count < timing.commit_batch_max {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                r = rx.recv() => match r {
                    Some(r) => {
                        count += r.size();
                        requests.push(r);
                    }
                    None => break,
                },
            }
        }
        in_flight.spawn(write_batch(node.clone(), requests));
    }
    // Pending callers learn `ShuttingDown` when their reply senders drop with the tasks.
    in_flight.abort_all();
    while in_flight.join_next().await.is_some() {}
}

/// The callers of one batch entry, in the order of their commands.
enum Waiting {
    Commits(usize, oneshot::Sender<Result<Vec<CommitOutcome>>>),
    Command(oneshot::Sender<Result<ControlResponse>>),
}

/// The commit command of `commits` at the cluster's feature `level`: `CommitProgress` from
/// level 2, `CommitOffsets` below (whose counters are only ever `Since`: writers send totals
/// only at level 2, see `Control::counts_totals`).
pub(crate) fn commit_command(
    node: NodeId,
    commits: Vec<ProgressCommit>,
    level: u32,
) -> ControlCommand {
    if level >= 2 {
        ControlCommand::CommitProgress { node, commits }
    } else {
        ControlCommand::CommitOffsets {
            node,
            commits: commits
                .iter()
                .map(ProgressCommit::to_offset_commit)
                .collect(),
        }
    }
}

/// The entry for `commits` and `commands`: a plain commit command when there is no other
/// command (the common case), otherwise a `Batch` with the commits first.
fn batch_command(
    node: NodeId,
    commits: Vec<ProgressCommit>,
    commands: Vec<ControlCommand>,
    level: u32,
) -> ControlCommand {
    if commands.is_empty() {
        return commit_command(node, commits, level);
    }
    let mut cmds = Vec::with_capacity(commands.len() + 1);
    if !commits.is_empty() {
        cmds.push(commit_command(node, commits, level));
    }
    cmds.extend(commands);
    ControlCommand::Batch(cmds)
}

/// Splits the response of [`batch_command`] into the commit outcomes and one response per
/// command.
fn split_response(
    response: ControlResponse,
    commits: usize,
    commands: usize,
) -> Option<(Vec<CommitOutcome>, Vec<ControlResponse>)> {
    match response {
        ControlResponse::Commits(outcomes) if commands == 0 && outcomes.len() == commits => {
            Some((outcomes, Vec::new()))
        }
        ControlResponse::Batch(mut answers) => {
            let outcomes = if commits > 0 {
                if answers.is_empty() {
                    return None;
                }
                match answers.remove(0) {
                    ControlResponse::Commits(o) if o.len() == commits => o,
                    _ => return None,
                }
            } else {
                Vec::new()
            };
            (answers.len() == commands).then_some((outcomes, answers))
        }
        _ => None,
    }
}

/// What a release's response means to its caller: done, also when it was released before (a
/// retry after a timeout) or revoked; anything else is refused.
pub(crate) fn release_answer(response: ControlResponse) -> Result<()> {
    match response {
        ControlResponse::Done | ControlResponse::Ignored(Rejection::StaleEpoch) => Ok(()),
        other => Err(Error::Rejected(format!("release: {other:?}"))),
    }
}

async fn write_batch(node: Arc<NodeInner>, requests: Vec<BatchRequest>) {
    let mut waiting = Vec::with_capacity(requests.len());
    let mut commits = Vec::new();
    let mut commands = Vec::new();
    for r in requests {
        match r {
            BatchRequest::Commits { commits: c, reply } => {
                waiting.push(Waiting::Commits(c.len(), reply));
                commits.extend(c);
            }
            BatchRequest::Command { command, reply } => {
                waiting.push(Waiting::Command(reply));
                commands.push(command);
            }
        }
    }
    let (commit_count, command_count) = (commits.len(), commands.len());
    let level = node.shared.read().state.feature_level();
    let result = node
        .write(&batch_command(node.id, commits, commands, level))
        .await;
    node.counters.commit_batches.fetch_add(1, Ordering::Relaxed);
    let split = match result {
        Ok((_, response)) => split_response(response.clone(), commit_count, command_count)
            .ok_or_else(|| Error::Raft(format!("unexpected batch response {response:?}"))),
        Err(e) => {
            tracing::warn!(node = %node.id, error = %e, commits = commit_count, commands = command_count, "commit batch failed");
            Err(e)
        }
    };
    match split {
        Ok((outcomes, answers)) => {
            let fenced = outcomes
                .iter()
                .filter(|o| matches!(o, CommitOutcome::Fenced { .. }))
                .count();
            node.counters
                .fenced_commits
                .fetch_add(fenced as u64, Ordering::Relaxed);
            let mut outcomes = outcomes.into_iter();
            let mut answers = answers.into_iter();
            for w in waiting {
                // A caller that gave up is not an error.
                match w {
                    Waiting::Commits(size, reply) => {
                        let _ = reply.send(Ok(outcomes.by_ref().take(size).collect()));
                    }
                    Waiting::Command(reply) => {
                        let answer = answers
                            .next()
                            .ok_or_else(|| Error::Raft("command not answered".into()));
                        let _ = reply.send(answer);
                    }
                }
            }
        }
        Err(e) => {
            for w in waiting {
                match w {
                    Waiting::Commits(_, reply) => {
                        let _ = reply.send(Err(copy_error(&e)));
                    }
                    Waiting::Command(reply) => {
                        let _ = reply.send(Err(copy_error(&e)));
                    }
                }
            }
        }
    }
}

/// The leader-only assignment loop: every `assignment_interval`, while this node leads, it
/// observes renewals, computes a round with `assign::plan` and writes it as one batch.
pub(crate) async fn run_assigner(node: Arc<NodeInner>) {
    let timing = node.timing.clone();
    let mut tick = tokio::time::interval(timing.assignment_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut view: Option<LeaderView> = None;
    // Every node, leading or not, keeps timing the renewals it sees applied, so that once it
    // leads it can carry on from them (see `LeaderView::carry_on`).
    let mut observed = LeaderView::new(0);
    // The leader this node last knew, for one log line per change (openraft's own election
    // lines are below the default level).
    let mut known_leader: Option<(Option<NodeId>, u64)> = None;
    // The last leader other than this node, which a new view spares no grace.
    let mut previous_leader: Option<NodeId> = None;
    // What this node, while it leads, saw become forgettable when.
    let mut retention = Retention::default();
    let mut quiet = assign::Quiet::default();
    // The election this follower called because its leader's process is gone (once per term).
    let mut called = ElectionCall::new(&timing);
    // When this node learnt of the leader it knows now.
    let mut leader_since = std::time::Instant::now();
    loop {
        tokio::select! {
            () = node.cancel.cancelled() => return,
            _ = tick.tick() => {}
            // A fence or a new identity was committed: its grants need not wait for the tick.
            () = node.fencing.done.notified() => {}
            // A member's process was just shown gone: its fence need not wait either.
            () = node.peers.peer_gone.notified() => {}
            // A voter answered this node's election: a split is answered at once.
            () = node.peers.vote_answered.notified() => {}
        }
        observed.observe(&node.shared.read().state.members, std::time::Instant::now());
        let (leading, term, applied_in_term, leader) = {
            let metrics = node.raft.metrics();
            let m = metrics.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(node.id),
                m.current_term,
                m.last_applied
                    .is_some_and(|l| l.leader_id.get_term() == m.current_term),
                m.current_leader,
            )
        };
        if known_leader.is_none_or(|(l, _)| l != leader) {
            match leader {
                Some(leader) => {
                    tracing::info!(node = %node.id, leader = %leader, term, "raft leader known")
                }
                None => tracing::info!(node = %node.id, term, "no raft leader known"),
            }
            known_leader = Some((leader, term));
            leader_since = std::time::Instant::now();
        }
        if let Some(l) = leader.filter(|l| *l != node.id) {
            previous_leader = Some(l);
        }
        if !leading {
            let gone = leader.and_then(|l| node.peers.gone_peers().get(&l).map(|g| g.since));
            if called.due(gone, leader_since, std::time::Instant::now()) {
                tracing::info!(node = %node.id, term, leader = ?leader, "the leader's process is gone: calling an election");
                if let Err(e) = node.raft.trigger().elect().await {
                    tracing::warn!(node = %node.id, error = %e, "election not called");
                }
            } else if split_vote_is_ours(&node, term, leader) {
                tracing::info!(node = %node.id, term, "the vote split; no voter that answered has a longer log: calling the next election at once");
                if let Err(e) = node.raft.trigger().elect().await {
                    tracing::warn!(node = %node.id, error = %e, "election not called");
                }
            }
            if view.take().is_some() {
                retention = Retention::default();
                quiet = assign::Quiet::default();
                tracing::info!(node = %node.id, term, "assignment loop stops: not the leader");
                *node
                    .leader_view
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            }
            continue;
        }
        let current = match view.take() {
            Some(v) if v.term == term => v,
            // Until the new leader applied an entry of its term, renewals committed before the
            // election may be missing from its applied state: no round yet.
            _ if !applied_in_term => continue,
            _ => {
                tracing::Span::current().record("term", term);
                tracing::info!(node = %node.id, term, "assignment loop starts as leader");
                LeaderView::carry_on(term, &observed, std::time::Instant::now(), previous_leader)
            }
        };
        let mut current = current;
        if node.handing_over.load(Ordering::SeqCst) {
            // A stopping leader's log must not grow while it hands over (`handover`).
            view = Some(current);
            continue;
        }
        // Targets' acknowledgements of revokes, written ahead of this round's commands.
        let handed = node.fencing.handed(term);
        let acknowledged: Vec<ControlCommand> = handed.iter().map(|(_, c)| c.clone()).collect();
        let (cmds, fence_work) = {
            let data = node.shared.read();
            // Read the clock only once the state is locked: a renewal applied while this task
            // waited for the lock must not be stamped earlier than it was seen, or the leader
            // could count its lease out before the owner does.
            let now = std::time::Instant::now();
            let fencing = node.fence.as_ref().map(|_| assign::FencingView {
                topology: node.fence_topology(),
                ensured: node.fencing.ensured(term),
                ensuring: node.fencing.ensuring(),
            });
            let own_config = node.shared.running_config();
            assign::round(
                &data.state,
                &mut current,
                &mut retention,
                &mut quiet,
                assign::RoundContext {
                    now,
                    timing: &timing,
                    leader: node.id,
                    fencing,
                    changes: node.shared.round_changes(),
                    own_config: own_config.as_deref(),
                    gone: node.peers.gone_peers().into_keys().collect(),
                    acknowledged: &acknowledged,
                },
            )
        };
        // Fence decisions go first: a round's grants never depend on them, and a revoke
        // starts only once its decision is applied (the next round, woken at once).
        let decided = !fence_work.commands.is_empty();
        if let Some(fencing) = &node.fence {
            fence_ops::start(&node, fencing, term, fence_work);
        }
        *node
            .leader_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(current.clone());
        view = Some(current);
        if cmds.is_empty() {
            continue;
        }
        tracing::debug!(node = %node.id, term, commands = cmds.len(), "assignment round");
        let started = std::time::Instant::now();
        if let Err(e) = node.write(&ControlCommand::Batch(cmds)).await {
            tracing::warn!(node = %node.id, term, error = %e, "assignment round not written");
        } else {
            tracing::debug!(
                node = %node.id,
                term,
                took_ms = started.elapsed().as_millis() as u64,
                "assignment round written"
            );
            if !handed.is_empty() {
                node.fencing
                    .written_with_round(term, handed.into_iter().map(|(op, _)| op));
            }
            if decided {
                node.fencing.done.notify_one();
            }
        }
    }
}

/// Whether this node, knowing `leader` in `term`, calls the next election at once because the
/// one it called in `term` split and it can win the next (`network::ballot`): no leader, and
/// every other voter whose process is not shown gone answered, none with a longer log.
fn split_vote_is_ours(node: &NodeInner, term: u64, leader: Option<NodeId>) -> bool {
    let gone = node.peers.gone_peers();
    let voters: std::collections::BTreeSet<NodeId> = {
        let metrics = node.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .voter_ids()
            .filter(|id| *id != node.id && !gone.contains_key(id))
            .collect()
    };
    node.peers
        .ballots_lock()
        .retry_at_once(node.id, term, leader, &voters)
}

/// A follower's election call when its leader's process is gone (`network::gone`). openraft
/// 0.9 calls an election `election_timeout_max` (its leader lease) plus a random
/// `election_timeout_min`..`_max` after the last heartbeat; the voters refuse every candidate
/// until the lease has run out since the last heartbeat they got. A dead leader sent its last
/// heartbeat before the first failure that showed it gone, so an election called a lease
/// after that failure can win at once: on average half the random part sooner, a third of a
/// leader's failover. A small random delay on top keeps two followers that saw it at the same
/// moment from splitting the vote. Being wrong costs an election (the voters refuse it while
/// the leader's heartbeats reach them).
#[derive(Debug)]
struct ElectionCall {
    lease: std::time::Duration,
    jitter: std::time::Duration,
    /// The evidence (its first failure) an election was called on: one call per leader lost.
    /// If it does not win, openraft's own timers go on as ever; calling again at once could
    /// split the vote with another follower calling too, round after round.
    called_for: Option<std::time::Instant>,
}

impl ElectionCall {
    fn new(timing: &ControlTiming) -> Self {
        let spread = timing.heartbeat_interval.as_millis().max(1) as u64;
        Self {
            lease: timing.election_timeout_max,
            jitter: std::time::Duration::from_millis(rand::random::<u64>() % spread),
            called_for: None,
        }
    }

    /// Whether to call an election now, the leader gone `since` (`None`: not shown gone),
    /// the leader known since `known`: failures from before (of the same node in an earlier
    /// run, before it restarted and won an election) say nothing about the leader now. True
    /// once per loss.
    fn due(
        &mut self,
        since: Option<std::time::Instant>,
        known: std::time::Instant,
        now: std::time::Instant,
    ) -> bool {
        let Some(since) = since.filter(|s| *s > known && self.called_for != Some(*s)) else {
            return false;
        };
        let due = now >= since + self.lease + self.jitter;
        if due {
            self.called_for = Some(since);
        }
        due
    }
}

/// Calls every other member of the Raft membership every [`PEER_WARM_INTERVAL`] (a ping), so
/// that any member can reach any other in one round trip when it must. Followers otherwise
/// never talk to each other until their leader dies, and then the first vote request between
/// them paid for a new connection (with TLS, its handshakes too) and for learning the peer's
/// boot id (`auth`: one more round trip). Across regions that delay let the other follower
/// call its own election meanwhile, and the split vote cost the failover another election
/// timeout. A ping that meets a dead process counts as any call does (`gone`).
pub(crate) async fn run_peer_warmer(node: Arc<NodeInner>) {
    let mut tick = tokio::time::interval(PEER_WARM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = node.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let peers: Vec<(NodeId, String)> = {
            let metrics = node.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != node.id)
                .map(|(id, n)| (*id, n.raft_addr.clone()))
                .collect()
        };
        let mut pings = tokio::task::JoinSet::new();
        for (id, addr) in peers {
            let node = node.clone();
            pings.spawn(
                async move {
                    let answer = node
                        .peers
                        .call::<(), PingReply>(id, &addr, paths::PING, &(), node.timing.rpc_timeout)
                        .await;
                    if let Err(e) = answer {
                        tracing::debug!(node = %node.id, peer = %id, error = %e, "peer not reached");
                    }
                }
                .in_current_span(),
            );
        }
        while pings.join_next().await.is_some() {}
    }
}

/// Spawns `fut` under a span naming the task and the node.
pub(crate) fn spawn_task<F>(name: &'static str, node: NodeId, fut: F) -> tokio::task::JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(fut.instrument(tracing::info_span!(
        "control",
        task = name,
        node = %node,
        term = tracing::field::Empty
    )))
}

#[cfg(test)]
mod tests {
    use assert2::check;
    use replicator_model::{Epoch, WorkUnit};

    use super::*;

    #[test]
    fn a_follower_calls_one_election_a_lease_after_its_leader_was_shown_gone() {
        let ms = std::time::Duration::from_millis;
        let timing = ControlTiming::default();
        let mut call = ElectionCall::new(&timing);
        check!(call.jitter < timing.heartbeat_interval);
        let t0 = std::time::Instant::now() + ms(20_000);
        let known = t0 - ms(10_000);
        check!(!call.due(None, known, t0 + ms(5000)), "not shown gone");
        check!(
            !call.due(Some(t0), known, t0 + ms(599)),
            "the voters' leases still run"
        );
        let due = t0 + timing.election_timeout_max + call.jitter;
        check!(call.due(Some(t0), known, due));
        check!(
            !call.due(Some(t0), known, due + ms(500)),
            "once per leader lost"
        );
        // The next leader lost: new evidence, a new call.
        let t1 = due + ms(5000);
        check!(call.due(Some(t1), known, t1 + ms(1000)));
        // Evidence older than the leader: its node was down before it led.
        let t2 = t1 + ms(5000);
        check!(!call.due(Some(t2), t2 + ms(1), t2 + ms(5000)));
    }

    fn release(p: u32) -> ControlCommand {
        ControlCommand::Release {
            unit: WorkUnit::new("f", "s", "t", p),
            epoch: Epoch(3),
            node: 1,
        }
    }

    fn commit(p: u32) -> ProgressCommit {
        ProgressCommit {
            unit: WorkUnit::new("f", "s", "t", p),
            epoch: Epoch(3),
            offset: 9,
            history_label: 1,
            counters: replicator_model::CommitCounters::Totals {
                session: 7,
                totals: replicator_model::UnitCounters::default(),
            },
        }
    }

    #[test]
    fn an_entry_too_large_to_replicate_is_refused_with_its_size() {
        let report = |units: u32| ControlCommand::ReportUnits {
            flow: "f".into(),
            units: (0..units)
                .map(|p| WorkUnit::new("f", "s".repeat(1000), "t", p))
                .collect(),
        };
        check!(NodeInner::check_entry_size(&report(1_000)).is_ok());
        // About 1 KiB per unit: 40,000 units are above the 32 MiB limit.
        let err = NodeInner::check_entry_size(&report(40_000)).unwrap_err();
        check!(matches!(err, Error::InvalidParams(_)));
        check!(err.to_string().contains("above the limit"));
    }

    #[test]
    fn commits_alone_stay_one_commit_entry() {
        let cmd = batch_command(1, vec![commit(0), commit(1)], Vec::new(), 2);
        check!(
            matches!(cmd, ControlCommand::CommitProgress { node: 1, ref commits } if commits.len() == 2)
        );
        // Below level 2 the same commits take the level-1 form.
        let cmd = batch_command(1, vec![commit(0), commit(1)], Vec::new(), 1);
        check!(
            matches!(cmd, ControlCommand::CommitOffsets { node: 1, ref commits } if commits.len() == 2)
        );
        check!(cmd.level() == 1);
        let split = split_response(
            ControlResponse::Commits(vec![CommitOutcome::Committed; 2]),
            2,
            0,
        );
        check!(split.map(|(o, r)| (o.len(), r.len())) == Some((2, 0)));
    }

    #[test]
    fn releases_ride_in_one_batch_after_the_commits() {
        let cmd = batch_command(1, vec![commit(0)], vec![release(1), release(2)], 2);
        let ControlCommand::Batch(cmds) = cmd else {
            panic!("expected a batch");
        };
        check!(cmds.len() == 3);
        check!(matches!(cmds[0], ControlCommand::CommitProgress { .. }));
        let response = ControlResponse::Batch(vec![
            ControlResponse::Commits(vec![CommitOutcome::Committed]),
            ControlResponse::Done,
            // Released before (a retry after a timeout) or revoked: nothing left to do.
            ControlResponse::Ignored(Rejection::StaleEpoch),
        ]);
        let (outcomes, answers) = split_response(response, 1, 2).expect("well-formed");
        check!(outcomes == vec![CommitOutcome::Committed]);
        check!(answers.len() == 2);
        // Releases without commits.
        let ControlCommand::Batch(cmds) = batch_command(1, Vec::new(), vec![release(1)], 2) else {
            panic!("expected a batch");
        };
        check!(cmds.len() == 1);
        let (o, a) = split_response(ControlResponse::Batch(vec![ControlResponse::Done]), 0, 1)
            .expect("well-formed");
        check!(o.is_empty() && a.len() == 1);
    }

    #[test]
    fn a_refused_release_and_a_malformed_response_are_errors() {
        check!(release_answer(ControlResponse::Ignored(Rejection::UnknownUnit)).is_err());
        check!(release_answer(ControlResponse::Ignored(Rejection::StaleEpoch)).is_ok());
        check!(split_response(ControlResponse::Done, 1, 0).is_none());
        check!(split_response(ControlResponse::Batch(Vec::new()), 1, 1).is_none());
    }
}
