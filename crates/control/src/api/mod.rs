//! The public handle of a running control-plane node.

pub(crate) mod admin;
pub(crate) mod management;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::Raft;
use replicator_model::{
    Assignment, ClusterPair, CommitOutcome, Epoch, MetadataChange, MetadataObject, MetadataRecord,
    NodeId, Offset, ProgressCommit, UnitProgress, UnitReset, UnitStart, WorkUnit, WriterLogin,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use admin::{
    ClusterStatus, ControlMetrics, MemberStatus, PausedFlow, PendingReset, UnitStatus,
};

use crate::command::{ControlCommand, ControlResponse, Rejection};
use crate::error::{Error, Result};
use crate::identity::WriterPasswords;
use crate::log_store::LogStore;
use crate::network::auth::{InboundGuard, Signer};
use crate::network::client::{NetworkFactory, PeerClient};
use crate::network::{paths, FaultSwitch, ManageRequest};
use crate::node::{self, BatchRequest, Counters, NodeInner};
use crate::params::{raft_config, ControlParams};
use crate::state_machine::{Shared, StateMachineStore};
use crate::tls::TlsState;
use crate::{data_dir, format};

/// Handle to a running control-plane node. Cheap to clone; `shutdown`/`crash` stop it.
#[derive(Clone)]
pub struct Control {
    inner: Arc<NodeInner>,
    runtime: Arc<Runtime>,
}

/// What only the owner of the node's lifetime touches (never the RPC handlers, so that the
/// database is closed once the node stops even if a connection task lingers).
struct Runtime {
    /// The node's database, flushed on shutdown.
    db: sled::Db,
    /// Whether a graceful stop marked this node `Leaving` (see [`Control::begin_leaving`]).
    stop_mark: data_dir::StopMark,
    /// Commits and releases into the batcher (bounded: callers wait when it is full).
    commit_tx: mpsc::Sender<BatchRequest>,
    /// Every task the node spawned, aborted or awaited on stop.
    tasks: Mutex<Vec<(&'static str, JoinHandle<()>)>>,
    /// The Raft server task, stopped last.
    server: Mutex<Option<JoinHandle<()>>>,
}

impl Control {
    /// Opens and validates the data dir, serves Raft RPC, starts Raft, bootstraps or waits to
    /// be added, and starts the lease renewer, commit batcher and assignment loop.
    #[tracing::instrument(skip_all, fields(node = %params.node_id), err)]
    pub async fn start(params: ControlParams) -> Result<Control> {
        let ControlParams {
            node_id,
            data_dir,
            raft_addr,
            raft_listener,
            api_addr,
            secret,
            initial_members,
            timing,
            tls,
            fencing,
        } = params;
        if initial_members.is_empty() {
            return Err(Error::InvalidParams("initial_members is empty".into()));
        }
        let config = raft_config(&timing)?;
        let db = data_dir::open(&data_dir)?;
        let stop_mark = data_dir::StopMark::open(&db, &data_dir)?;
        let left_at_stop = stop_mark.is_set()?;
        let log_store = LogStore::open(&db, &data_dir)?;
        if log_store.forget_own_leadership(node_id).await? {
            tracing::info!(node = %node_id, "was the leader before the restart; rejoining as a follower");
        }
        // Whatever an earlier process of this node applied is in the log now: its identity
        // is given up before this process writes (see `identity::Inheritance`).
        let start_index = log_store.last_index()?;
        let shared = Shared::new(node_id, WriterPasswords::new(&secret), start_index);
        let state_machine = StateMachineStore::open(&db, &data_dir, shared.clone())?;

        let listen_err = |source| Error::Listen {
            addr: raft_addr.to_string(),
            source,
        };
        let listener = match raft_listener {
            Some(l) => l,
            None => std::net::TcpListener::bind(raft_addr).map_err(listen_err)?,
        };
        listener.set_nonblocking(true).map_err(listen_err)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(listen_err)?;

        let tls = tls.map(TlsState::for_member).transpose()?.map(Arc::new);
        // Only a listener others can reach is worth a warning: on loopback (the demo, a cluster
        // on one host) nobody else sees the traffic.
        let reachable = listener
            .local_addr()
            .map_or(true, |a| !a.ip().is_loopback());
        if tls.is_none() && reachable {
            tracing::warn!(node = %node_id, raft_addr = %raft_addr, "raft rpc listener serves plain http: configure [cluster.tls] for mutual tls");
        }
        let fault = Arc::new(FaultSwitch::default());
        let peers = PeerClient::new(
            &secret,
            fault.clone(),
            tls.as_ref().map(|t| t.get()).as_ref(),
        )?;
        let network = NetworkFactory {
            client: peers.clone(),
            default_timeout: timing.rpc_timeout,
            first_retry: timing.heartbeat_interval,
        };
        let committed = log_store.committed_index();
        let raft = Raft::new(node_id, Arc::new(config), network, log_store, state_machine)
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;

        let cancel = CancellationToken::new();
        let inner = Arc::new(NodeInner {
            id: node_id,
            raft,
            shared,
            peers,
            fault,
            signer: Signer::new(&secret),
            inbound: InboundGuard::new(node_id),
            timing: timing.clone(),
            raft_addr: raft_addr.to_string(),
            api_addr,
            initial_members,
            lease: Mutex::new(None),
            leader_view: Mutex::new(None),
            leaving: AtomicBool::new(false),
            left_at_stop: AtomicBool::new(left_at_stop),
            draining: AtomicBool::new(false),
            handing_over: AtomicBool::new(false),
            counters: Counters::default(),
            fence_topology: Mutex::new(
                fencing
                    .as_ref()
                    .map(|f| f.topology.clone())
                    .unwrap_or_default(),
            ),
            fence: fencing,
            fencing: crate::fence_ops::FenceTracker::default(),
            committed,
            cancel: cancel.clone(),
        });

        let server = {
            let inner = inner.clone();
            let cancel = cancel.clone();
            let tls = tls.clone();
            node::spawn_task("raft_server", node_id, async move {
                if let Err(e) = crate::network::server::serve(listener, inner, cancel, tls).await {
                    tracing::error!(error = %e, "raft rpc server stopped");
                }
            })
        };
        let (commit_tx, commit_rx) = mpsc::channel(timing.commit_queue.max(1));
        let mut tasks = vec![
            (
                "commit_batcher",
                node::spawn_task(
                    "commit_batcher",
                    node_id,
                    node::run_commit_batcher(inner.clone(), commit_rx),
                ),
            ),
            (
                "lease_renewer",
                node::spawn_task(
                    "lease_renewer",
                    node_id,
                    node::run_lease_renewer(inner.clone(), stop_mark.clone()),
                ),
            ),
            (
                "assigner",
                node::spawn_task("assigner", node_id, node::run_assigner(inner.clone())),
            ),
            (
                "peer_warmer",
                node::spawn_task("peer_warmer", node_id, node::run_peer_warmer(inner.clone())),
            ),
            (
                "bootstrap",
                node::spawn_task(
                    "bootstrap",
                    node_id,
                    management::run_bootstrap(inner.clone()),
                ),
            ),
        ];
        if let Some(tls) = tls {
            let peers = inner.peers.clone();
            let cancel = cancel.clone();
            tasks.push((
                "tls_reloader",
                node::spawn_task("tls_reloader", node_id, async move {
                    let mut tick = tokio::time::interval(crate::tls::RELOAD_CHECK_INTERVAL);
                    loop {
                        tokio::select! {
                            () = cancel.cancelled() => return,
                            _ = tick.tick() => {}
                        }
                        if let Some(configs) = tls.reload_if_changed() {
                            peers.use_tls(&configs);
                        }
                    }
                }),
            ));
        }
        tracing::info!(node = %node_id, raft_addr = %raft_addr, "control plane started");
        Ok(Control {
            inner,
            runtime: Arc::new(Runtime {
                db,
                stop_mark,
                commit_tx,
                tasks: Mutex::new(tasks),
                server: Mutex::new(Some(server)),
            }),
        })
    }

    /// This node's id.
    #[must_use]
    pub fn node_id(&self) -> NodeId {
        self.inner.id
    }

    /// This node's units with their epochs, from the local applied state; a new value is
    /// published on every apply that changes them.
    #[must_use]
    pub fn assignments(&self) -> watch::Receiver<Vec<Assignment>> {
        self.inner.shared.subscribe_assignments()
    }

    /// This node's writer identity on the fenced target clusters, while it may write with it:
    /// `None` before the leader provisioned one and from the moment it was fenced (the node
    /// then drops its writer connections; a new incarnation follows once it is back).
    #[must_use]
    pub fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        self.inner.shared.subscribe_writer_login()
    }

    /// Replaces which flows write to which fenced target (after a reload): as leader, this
    /// node then fences on, and makes sure every identity has a user on, the new targets.
    pub fn set_fence_topology(&self, topology: crate::FenceTopology) {
        *self
            .inner
            .fence_topology
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = topology;
        self.inner.fencing.done.notify_one();
    }

    /// Gives up this node's writer identity `incarnation` after a target refused its login
    /// (a user missing, or created under another cluster secret): it is fenced like a failed
    /// member's, so that its units writing to fenced targets move, and the leader provisions
    /// the next incarnation, whose user it creates on every fenced target. `Ok(false)`: that
    /// identity is not this node's current one any more (nothing to do).
    pub async fn abandon_writer_identity(&self, incarnation: u64) -> Result<bool> {
        let current = self
            .inner
            .shared
            .read()
            .state
            .identities
            .get(&self.inner.id)
            .is_some_and(|i| i.incarnation == incarnation && !i.fenced);
        if !current {
            return Ok(false);
        }
        let cmd = ControlCommand::FenceMember {
            node: self.inner.id,
            incarnation,
        };
        let (_, response) = self.inner.write(&cmd).await?;
        Ok(matches!(response, ControlResponse::Done))
    }

    /// Until when this node may write downstream; `None` when it holds no valid lease. Check
    /// it before every send (see "Never two owners" in ARCHITECTURE.md).
    #[must_use]
    pub fn lease_valid_until(&self) -> Option<std::time::Instant> {
        let lease = *self
            .inner
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        lease.filter(|l| *l > std::time::Instant::now())
    }

    /// Like [`Control::lease_valid_until`], but `None` also when the local state no longer
    /// shows `unit` owned by this node under `epoch`. Reads the lease before the state, so a
    /// lease extended by a renewal that followed a revoke is never paired with the old grant.
    #[must_use]
    pub fn lease_valid_for(&self, unit: &WorkUnit, epoch: Epoch) -> Option<std::time::Instant> {
        let lease = self.lease_valid_until()?;
        let running = self.inner.shared.running_config();
        let state = &self.inner.shared.read().state;
        (state.holds(self.inner.id, unit, epoch)
            && state.flow_config_applied(self.inner.id, &unit.flow, running.as_deref()))
        .then_some(lease)
    }

    /// Commits offsets; batched with other callers into one Raft entry per batch interval and
    /// forwarded to the leader. One outcome per commit, in order.
    pub async fn commit(&self, commits: Vec<ProgressCommit>) -> Result<Vec<CommitOutcome>> {
        if commits.is_empty() {
            return Ok(Vec::new());
        }
        self.batched(|reply| BatchRequest::Commits { commits, reply })
            .await
    }

    /// Whether writers stamp the compact provenance format: from feature level 4 on, when
    /// every member reads it (a member of an earlier release resumes from downstream tails
    /// holding it). Never lowered, so once true, true for good.
    #[must_use]
    pub fn stamps_compact_provenance(&self) -> bool {
        self.inner.shared.read().state.feature_level() >= format::COMPACT_PROVENANCE_LEVEL.0
    }

    /// Whether a writer session starting now commits its totals (`CommitCounters::Totals`,
    /// which count once however often a commit is applied): from feature level 2 on, which
    /// is never lowered. A session keeps the form it started with.
    #[must_use]
    pub fn counts_totals(&self) -> bool {
        self.inner.shared.read().state.feature_level() >= 2
    }

    /// Queues a request for the commit batcher and waits for its answer.
    async fn batched<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T>>) -> BatchRequest,
    ) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        self.runtime
            .commit_tx
            .send(request(reply))
            .await
            .map_err(|_| Error::ShuttingDown)?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Where the copy of `unit` starts as its first owner recorded it (`record_start`), until
    /// the unit's first commit (local applied state).
    #[must_use]
    pub fn recorded_start(&self, unit: &WorkUnit) -> Option<UnitStart> {
        self.inner
            .shared
            .read()
            .state
            .recorded_starts
            .get(unit)
            .copied()
    }

    /// Records where the copy of `unit` that this node owns under `epoch` starts, before its
    /// first poll (see `ControlCommand::RecordStart`). `Ok(false)`: a start was recorded for
    /// that history already, or it has confirmed progress (read them again); an error when
    /// the node does not own the unit under `epoch`.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id, unit = %unit, epoch = %epoch.0), err)]
    pub async fn record_start(
        &self,
        unit: &WorkUnit,
        epoch: Epoch,
        start: UnitStart,
    ) -> Result<bool> {
        let cmd = ControlCommand::RecordStart {
            node: self.inner.id,
            unit: unit.clone(),
            epoch,
            start,
        };
        // Through the commit batcher: every unit that starts for the first time records its
        // start, which must not cost a Raft entry per unit.
        match self
            .batched(|reply| BatchRequest::Command {
                command: cmd,
                reply,
            })
            .await?
        {
            ControlResponse::Done => Ok(true),
            ControlResponse::Ignored(Rejection::StartKnown) => Ok(false),
            other => Err(Error::Rejected(format!(
                "record start of {unit}: {other:?}"
            ))),
        }
    }

    /// What the control plane remembers of the objects the two-way pair `pair` syncs, by
    /// object (local applied state). `None` while the cluster is below the feature level that
    /// keeps these records (3): they cannot be written yet.
    #[must_use]
    pub fn metadata_records(
        &self,
        pair: &ClusterPair,
    ) -> Option<BTreeMap<MetadataObject, MetadataRecord>> {
        let data = self.inner.shared.read();
        if data.state.feature_level() < format::METADATA_LEVEL.0 {
            return None;
        }
        Some(
            data.state
                .metadata
                .iter()
                .filter(|(key, _)| key.pair == *pair)
                .map(|(key, record)| (key.object.clone(), record.clone()))
                .collect(),
        )
    }

    /// Applies each change whose `expected` record is the current one, in order (see
    /// `ControlCommand::RecordMetadata`): one flag per change, `true` when it was applied.
    /// Returns once this node applied the entry too (or `write_timeout` passed), so that its
    /// [`Control::metadata_records`] shows it. A transient error while the cluster is below
    /// feature level 3 (it is raised once every member runs a release that supports it).
    ///
    /// A write retried after its answer was lost (a leader change or a timeout) is answered
    /// by the retry: a change the first attempt applied is then `false` (its `expected` is
    /// gone), so read the records again after a `false`.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id, changes = changes.len()), err)]
    pub async fn record_metadata(&self, changes: Vec<MetadataChange>) -> Result<Vec<bool>> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let (needed, release) = format::METADATA_LEVEL;
        let cluster = self.inner.shared.read().state.feature_level();
        if cluster < needed {
            return Err(Error::FeatureLevel {
                what: "metadata records",
                cluster,
                needed,
                release,
            });
        }
        let count = changes.len();
        let cmd = ControlCommand::RecordMetadata { changes };
        match self.inner.write(&cmd).await? {
            (index, ControlResponse::MetadataRecorded(applied)) if applied.len() == count => {
                // Read your writes: what the caller decides next from `metadata_records` (a
                // promote moving the homes right after its last round recorded them) must see
                // this entry. A timeout only means a later decision may fail its compare-and-set.
                let _ = self
                    .inner
                    .raft
                    .wait(Some(self.inner.timing.write_timeout))
                    .applied_index_at_least(Some(index), "metadata records applied here")
                    .await;
                Ok(applied)
            }
            (_, other) => Err(Error::Rejected(format!("record metadata: {other:?}"))),
        }
    }

    /// The offset reset `unit`'s next owner starts at, if an operator made one that no commit
    /// has taken up yet (local applied state).
    #[must_use]
    pub fn pending_reset(&self, unit: &WorkUnit) -> Option<UnitReset> {
        let data = self.inner.shared.read();
        data.state.pending_resets.get(unit).map(|r| UnitReset {
            reset: r.reset,
            topic_created_at: data.state.reset_topics.get(unit).copied(),
        })
    }

    /// Confirmed progress of `unit` in the local applied state.
    #[must_use]
    pub fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
        self.inner
            .shared
            .read()
            .state
            .units
            .get(unit)
            .map(|r| r.progress)
    }

    /// Reports the full current set of units of `flow` (from discovery). Writes only if it
    /// differs from the replicated state; units not listed any more are retired.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id, flow = %flow), err)]
    pub async fn report_units(&self, flow: &str, units: Vec<WorkUnit>) -> Result<()> {
        if let Some(bad) = units.iter().find(|u| u.flow != flow) {
            return Err(Error::Rejected(format!("unit {bad} is not in flow {flow}")));
        }
        let wanted: std::collections::BTreeSet<&WorkUnit> = units.iter().collect();
        let unchanged = {
            let data = self.inner.shared.read();
            let current: std::collections::BTreeSet<&WorkUnit> = data
                .state
                .units
                .iter()
                .filter(|(u, r)| u.flow == flow && !r.retired)
                .map(|(u, _)| u)
                .collect();
            current == wanted
        };
        if unchanged {
            return Ok(());
        }
        let cmd = ControlCommand::ReportUnits {
            flow: flow.to_owned(),
            units,
        };
        match self.inner.write(&cmd).await? {
            (_, ControlResponse::Done) => Ok(()),
            (_, other) => Err(Error::Rejected(format!("report units: {other:?}"))),
        }
    }

    /// Hands `unit` (owned under `epoch`) back. Succeeds also when it is no longer owned under
    /// that epoch (a retry after a timeout). Batched with other releases and commits into one
    /// Raft entry per batch interval.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id, unit = %unit, epoch = %epoch), err)]
    pub async fn release(&self, unit: WorkUnit, epoch: Epoch) -> Result<()> {
        let release = ControlCommand::Release {
            unit,
            epoch,
            node: self.inner.id,
        };
        node::release_answer(
            self.batched(|reply| BatchRequest::Command {
                command: release,
                reply,
            })
            .await?,
        )
    }

    /// Marks the start of a graceful stop: from now on every write gives up after
    /// `ControlTiming::drain_write_timeout` instead of `write_timeout`, so a drain without a
    /// quorum ends promptly (its commits and releases fail; the units move once this node's
    /// lease expires, as after a crash).
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// The start of a graceful stop's drain: marks this node `Leaving`, so that the leader
    /// grants it nothing more and hands each unit the drain releases to another member at
    /// once. Without it a released unit could be granted back to the draining node, which
    /// then left it owned by nobody running until a fence or its lease expired (seen across
    /// regions, where a release and the next round's grant are Raft writes of their own).
    /// The node's next process registers anew and is `Active` again (a mark in the data dir
    /// tells it to; a `Leaving` set by an operator's removal stays). Written only from
    /// feature level 2 on (every member registers a `Leaving` self anew at its start);
    /// returns whether it was written.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id), err)]
    pub async fn begin_leaving(&self) -> Result<bool> {
        if self.inner.shared.read().state.feature_level() < format::LEAVING_AT_DRAIN_LEVEL.0 {
            return Ok(false);
        }
        // The renewer must not register this node anew while it drains; its next process
        // must, and knows it from the mark, set before the write can commit.
        self.inner.leaving.store(true, Ordering::SeqCst);
        self.runtime.stop_mark.set(true).await?;
        self.inner
            .write(&ControlCommand::LeaveMember {
                node: self.inner.id,
            })
            .await?;
        Ok(true)
    }

    /// A graceful stop's last step before [`Self::shutdown`]: if this node leads, hands the
    /// leadership to a follower whose log holds all of its own, so that the cluster has a
    /// leader again within a few round trips instead of after its election timers
    /// (`handover`). Returns the new leader, or `None` when this node did not lead or the
    /// handover did not succeed (logged; the stop goes on as before). From the call on, this
    /// node writes nothing more.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id))]
    pub async fn hand_over_leadership(&self) -> Option<NodeId> {
        let started = std::time::Instant::now();
        match crate::handover::hand_over(&self.inner).await {
            crate::handover::Handover::NotLeader => None,
            crate::handover::Handover::HandedTo { to } => {
                tracing::info!(
                    to = %to,
                    took_ms = started.elapsed().as_millis() as u64,
                    "leadership handed over"
                );
                Some(to)
            }
            crate::handover::Handover::NotHanded { reason } => {
                tracing::info!(
                    %reason,
                    took_ms = started.elapsed().as_millis() as u64,
                    "leadership not handed over: the followers elect a leader when their timers run out"
                );
                None
            }
        }
    }

    /// Leaves the cluster's work: marks this node `Leaving` and releases every unit it owns
    /// (call after the pipeline drained them). The node stays a Raft member.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id), err)]
    pub async fn leave(&self) -> Result<()> {
        self.inner.leaving.store(true, Ordering::SeqCst);
        let mut cmds = vec![ControlCommand::LeaveMember {
            node: self.inner.id,
        }];
        cmds.extend(
            self.inner
                .shared
                .read()
                .state
                .assignments_of(self.inner.id)
                .into_iter()
                .map(|a| ControlCommand::Release {
                    unit: a.unit,
                    epoch: a.epoch,
                    node: self.inner.id,
                }),
        );
        self.inner.write(&ControlCommand::Batch(cmds)).await?;
        Ok(())
    }

    /// Cluster status, from the leader when it is reachable (lease liveness is known only
    /// there), otherwise from this node's local state.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id), err)]
    pub async fn status(&self) -> Result<ClusterStatus> {
        let (leader, addr) = self.inner.leader();
        if let (Some(l), Some(addr)) = (leader, addr) {
            if l != self.inner.id {
                match self
                    .inner
                    .peers
                    .call::<(), ClusterStatus>(
                        l,
                        &addr,
                        paths::STATUS,
                        &(),
                        self.inner.timing.rpc_timeout,
                    )
                    .await
                {
                    Ok(status) => return Ok(status),
                    Err(e) => {
                        tracing::debug!(peer = %l, error = %e, "status from leader failed; answering locally")
                    }
                }
            }
        }
        Ok(self.inner.local_status())
    }

    /// Adds a node: as learner, then as voter. The node registers its own addresses as a
    /// work member once it sees itself in the membership; `api_addr` is only logged here.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id, peer = %id), err)]
    pub async fn add_member(&self, id: NodeId, raft_addr: String, api_addr: String) -> Result<()> {
        let resp = self
            .inner
            .manage(&ManageRequest::AddVoter { id, raft_addr })
            .await?;
        tracing::info!(peer = %id, api_addr = %api_addr, response = ?resp, "member added as voter");
        Ok(())
    }

    /// Removes a node: marks it leaving, waits (up to `drain_timeout`) until its units were
    /// released or revoked after its lease expired, then removes it from Raft and the state.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id, peer = %id), err)]
    pub async fn remove_member(&self, id: NodeId) -> Result<()> {
        self.inner
            .write(&ControlCommand::LeaveMember { node: id })
            .await?;
        let deadline = tokio::time::Instant::now() + self.inner.timing.drain_timeout;
        loop {
            let owned = self
                .inner
                .shared
                .read()
                .state
                .units
                .values()
                .filter(|u| u.owner == Some(id))
                .count();
            if owned == 0 {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Rejected(format!(
                    "node {id} still owns {owned} units after the drain timeout"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.inner.manage(&ManageRequest::RemoveNode { id }).await?;
        match self
            .inner
            .write(&ControlCommand::RemoveMember { node: id })
            .await?
        {
            (_, ControlResponse::Done | ControlResponse::Ignored(Rejection::UnknownMember)) => {
                Ok(())
            }
            (_, other) => Err(Error::Rejected(format!("remove member: {other:?}"))),
        }
    }

    /// Pauses (`paused`) or resumes `flow` cluster-wide; see `ControlCommand::SetFlowPaused`.
    /// Returns once the entry is applied. Pausing does not wait for the units to be handed
    /// back: [`Control::owned_units_of`] tells when none is owned any more.
    #[tracing::instrument(skip(self, requested_by), fields(node = %self.inner.id), err)]
    pub async fn set_flow_paused(
        &self,
        flow: &str,
        paused: bool,
        requested_by: String,
    ) -> Result<()> {
        let cmd = ControlCommand::SetFlowPaused {
            flow: flow.to_owned(),
            paused,
            requested_by,
            at_unix_ms: unix_ms_now(),
        };
        match self.inner.write(&cmd).await? {
            (_, ControlResponse::Done) => Ok(()),
            (_, other) => Err(Error::Rejected(format!(
                "{} flow {flow}: {other:?}",
                if paused { "pause" } else { "resume" }
            ))),
        }
    }

    /// Moves where units of the paused `flow` resume (see `flow reset`): each unit's next
    /// owner starts copying at the given offset, unless the upstream topic is not the one the
    /// reset was decided for (its creation time, µs, the third item) any more. All or nothing;
    /// the refusal says why.
    pub async fn reset_offsets(
        &self,
        flow: &str,
        resets: Vec<(WorkUnit, Offset, u64)>,
        allow_duplicates: bool,
        requested_by: String,
    ) -> std::result::Result<(), ResetRefusal> {
        let cmd = ControlCommand::ResetTopicOffsets {
            flow: flow.to_owned(),
            resets,
            allow_duplicates,
            requested_by,
            at_unix_ms: unix_ms_now(),
        };
        match self.inner.write(&cmd).await {
            Ok((_, ControlResponse::Done)) => Ok(()),
            Ok((_, ControlResponse::Ignored(rejection))) => Err(match rejection {
                Rejection::FlowRunning => ResetRefusal::FlowRunning,
                Rejection::StillOwned => ResetRefusal::StillOwned,
                Rejection::WouldDuplicate => ResetRefusal::WouldDuplicate,
                Rejection::UnknownUnit | Rejection::Retired => ResetRefusal::UnknownPartition,
                other => ResetRefusal::Failed(format!("{other:?}")),
            }),
            Ok((_, other)) => Err(ResetRefusal::Failed(format!("{other:?}"))),
            Err(e) => Err(ResetRefusal::Failed(e.to_string())),
        }
    }

    /// Tells the control plane which config digests per flow this process runs from now on,
    /// before its pipeline starts on them and before [`Control::publish_config`]: until the
    /// digest of a flow is applied as published by this process, its units are not this
    /// node's to work on (the leader granted or kept them on the config it ran before), and as
    /// the leader it decides nothing until all of them are applied.
    pub fn set_running_config(&self, digests: BTreeMap<String, String>) {
        self.inner.shared.set_running_config(digests);
    }

    /// Whether the config digests applied for this node are the ones it runs (see
    /// [`Control::set_running_config`]; true while it said none).
    #[must_use]
    pub fn running_config_applied(&self) -> bool {
        let running = self.inner.shared.running_config();
        self.inner
            .shared
            .read()
            .state
            .config_applied(self.inner.id, running.as_deref())
    }

    /// Tells the control plane by when the last sends of this node's earlier processes can
    /// have landed (the pipeline's `send_lease_margin` after this process started): the
    /// identity an earlier process wrote with is given up, and the node's units of the fenced
    /// targets moved through its fence, only then. Until said, it is given up at once.
    pub fn earlier_sends_land_by(&self, at: std::time::Instant) {
        self.inner.shared.set_earlier_sends_landed_by(at);
    }

    /// Publishes this node's config digest per flow (at start and after every reload); units
    /// of a flow go only to members whose digest for it equals the leader's.
    pub async fn publish_config(&self, digests: BTreeMap<String, String>) -> Result<()> {
        let cmd = ControlCommand::PublishConfig {
            node: self.inner.id,
            digests,
        };
        match self.inner.write(&cmd).await? {
            (_, ControlResponse::Done) => Ok(()),
            (_, other) => Err(Error::Rejected(format!("publish config: {other:?}"))),
        }
    }

    /// The flows this node does not run as the leader does, in this node's applied state
    /// (empty without a leader, or while it published nothing).
    #[must_use]
    pub fn config_disagreements(&self) -> Vec<String> {
        let Some(leader) = self.inner.leader().0 else {
            return Vec::new();
        };
        admin::flows_disagreeing(&self.inner.shared.read().state, leader, self.inner.id)
    }

    /// Whether this node runs `flow` as the leader does (known leader, same digest): only
    /// then does its discovery report the flow's units, so that nodes with another selection
    /// of topics do not retire each other's units.
    #[must_use]
    pub fn config_agrees_with_leader(&self, flow: &str) -> bool {
        let Some(leader) = self.inner.leader().0 else {
            return false;
        };
        self.inner
            .shared
            .read()
            .state
            .config_agrees(leader, self.inner.id, flow)
    }

    /// Whether `flow` is paused, in this node's applied state.
    #[must_use]
    pub fn is_flow_paused(&self, flow: &str) -> bool {
        self.inner
            .shared
            .read()
            .state
            .paused_flows
            .contains_key(flow)
    }

    /// The units of `flow` that have an owner, in this node's applied state.
    #[must_use]
    pub fn owned_units_of(&self, flow: &str) -> Vec<WorkUnit> {
        self.inner
            .shared
            .read()
            .state
            .units
            .iter()
            .filter(|(u, r)| u.flow == flow && r.owner.is_some())
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// A snapshot of this node's control-plane metrics.
    #[must_use]
    pub fn metrics(&self) -> ControlMetrics {
        let m = self.inner.raft.metrics().borrow().clone();
        // One read guard for both counts, dropped before anything else: a second `read()`
        // while the first guard lives (temporaries of a struct literal live to its end) can
        // deadlock behind a writer that queued in between (std's RwLock prefers writers).
        let (units_owned, units_unowned) = {
            let data = self.inner.shared.read();
            (
                data.state.assignments_of(self.inner.id).len(),
                data.state.unowned_units(),
            )
        };
        let c = &self.inner.counters;
        let snapshot = self.inner.shared.snapshot_figures();
        ControlMetrics {
            node: self.inner.id,
            term: m.current_term,
            leader: m.current_leader,
            is_leader: m.current_leader == Some(self.inner.id),
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            commit_index: self.inner.committed.load(Ordering::Relaxed).checked_sub(1),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            snapshot_bytes: snapshot.bytes,
            snapshot_build: snapshot.build,
            snapshot_install: snapshot.install,
            lease_renewals: c.lease_renewals.load(Ordering::Relaxed),
            fenced_commits: c.fenced_commits.load(Ordering::Relaxed),
            commit_batches: c.commit_batches.load(Ordering::Relaxed),
            requests_sent: self.inner.peers.requests_sent(),
            units_owned,
            units_unowned,
            fences: self.inner.fencing.fences.load(Ordering::Relaxed),
            fence_failures: self.inner.fencing.failures.load(Ordering::Relaxed),
            fences_pending: self.inner.fencing.pending_fences(),
        }
    }

    /// Test seam: cuts this node off the network in both directions (or reconnects it).
    #[doc(hidden)]
    pub fn set_isolated(&self, isolated: bool) {
        self.inner.fault.set_isolated(isolated);
    }

    /// Graceful stop: stops the loops (pending commits fail with `ShuttingDown`), shuts Raft
    /// down, stops serving RPC and flushes the database.
    #[tracing::instrument(skip_all, fields(node = %self.inner.id))]
    pub async fn shutdown(self) {
        self.inner.cancel.cancel();
        let tasks = self.take_tasks();
        for (name, task) in tasks {
            if let Err(e) = task.await {
                tracing::warn!(task = name, error = %e, "control task ended abnormally");
            }
        }
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown failed");
        }
        self.stop_server(Duration::from_secs(2)).await;
        if let Err(e) = crate::data_dir::flush(&self.runtime.db).await {
            tracing::error!(error = %e, "final database flush failed");
        }
        tracing::info!("control plane stopped");
    }

    /// The node's background tasks, taken out to be awaited or aborted (once, at a stop).
    fn take_tasks(&self) -> Vec<(&'static str, JoinHandle<()>)> {
        std::mem::take(
            &mut *self
                .runtime
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Abrupt stop, like `kill -9` in-process: cuts the network, aborts every task and stops
    /// Raft without draining anything.
    pub async fn crash(self) {
        self.inner.fault.set_isolated(true);
        self.inner.cancel.cancel();
        let tasks = self.take_tasks();
        for (_, task) in &tasks {
            task.abort();
        }
        for (_, task) in tasks {
            let _ = task.await;
        }
        let _ = self.inner.raft.shutdown().await;
        self.stop_server(Duration::from_millis(200)).await;
    }

    async fn stop_server(&self, grace: Duration) {
        let server = self
            .runtime
            .server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut server) = server {
            if tokio::time::timeout(grace, &mut server).await.is_err() {
                server.abort();
                let _ = server.await;
            }
        }
    }
}

/// Why an offset reset was refused (see [`Control::reset_offsets`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetRefusal {
    /// The flow is not paused.
    #[error("the flow is running: pause it first (flow pause)")]
    FlowRunning,
    /// A unit still has an owner (its writer has not handed it back yet).
    #[error("a partition of the flow is still owned: its writer has not handed it back yet")]
    StillOwned,
    /// A start at or below a confirmed offset without `allow_duplicates`.
    #[error("the reset would copy again messages the target already holds")]
    WouldDuplicate,
    /// A partition the control plane does not know (or no longer reported).
    #[error("a partition is not (or no longer) part of the flow")]
    UnknownPartition,
    /// The write failed (no leader, shutting down, ...).
    #[error("{0}")]
    Failed(String),
}

/// Now, in Unix milliseconds: the time an operator's request is recorded with (`apply` reads no
/// clock, so it travels in the entry).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
