//! `Pipeline`: the running data plane of one instance (discovery loops plus the coordinator and
//! the unit tasks it supervises), with `start`, `shutdown`, `crash` and `stats`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{call_t, Actor, ActorRef};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clients::{Cluster, ConnectionState};
use crate::control::ControlPlane;
use crate::coordinator::{CoordinatorArgs, CoordinatorHandle, CoordinatorMsg, FlowAssignments};
use crate::coordinator::{Stage, TaskRegistry, TaskSpec, TasksArgs, TasksMsg};
use crate::coordinator::{Supervisor, SupervisorArgs, SupervisorMsg, TaskKind, TaskStats};
use crate::datapath::offset_maps::OffsetMaps;
use crate::datapath::target::TargetDoor;
use crate::datapath::throttle::FlowThrottle;
use crate::datapath::unit::UnitTuning;
use crate::discovery::heartbeat::{self, HeartbeatMeters, HeartbeatParams, HeartbeatStats};
use crate::discovery::{self, DiscoveryParams};
use crate::error::{Error, Result};
use crate::liveness::{Liveness, HEARTBEAT_INTERVAL};
use crate::params::{FlowParams, PipelineParams};
use crate::selection::mapping::Selector;
use crate::selection::residency::{BlockedTopics, FlowResidency, Residency};
use crate::stats::{MeterRegistry, UnitStats};
use crate::sync::cutover::Cutover;
use crate::sync::groups::{GroupSync, GroupSyncRegistry, SyncFn};
use crate::sync::metadata::{MetadataSync, MetadataSyncRegistry};

/// A running pipeline instance.
pub struct Pipeline {
    /// The root of the data path's actor tree (see `crate::coordinator`).
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_task: JoinHandle<()>,
    /// The coordinator running now, under the supervisor.
    coordinator: CoordinatorHandle,
    /// Cancelled when the supervisor gave up on the coordinator or a long-running task.
    gave_up: CancellationToken,
    /// The supervisor of the long-running tasks beside the data path (see
    /// `crate::coordinator::tasks`), which stops them in stages at shutdown.
    tasks: ActorRef<TasksMsg>,
    /// How those tasks fared.
    task_registry: TaskRegistry,
    /// Yields `None` once every task the actor tree started is gone (nothing is ever sent).
    tasks_gone: mpsc::Receiver<()>,
    /// Connections, closed at the end.
    clusters: Vec<Arc<Cluster>>,
    /// Bound of the graceful drain.
    shutdown_timeout: Duration,
    /// Meters of every unit started, shared with the coordinator (which registers them).
    meters: MeterRegistry,
    /// Heartbeats of the coordinator's mailbox.
    liveness: Arc<Liveness>,
    /// What `flow promote` asks of this pipeline.
    cutover: Cutover,
    /// The meters of each flow's heartbeat task, in flow order.
    heartbeats: Vec<Arc<HeartbeatMeters>>,
    /// The topics residency policies keep from each flow's target.
    blocked: BlockedTopics,
}

/// A long-running task of the node, started (and restarted) by `start`.
fn node_task<F>(
    kind: TaskKind,
    stage: Stage,
    start: impl Fn(CancellationToken) -> F + Send + Sync + 'static,
) -> TaskSpec
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    TaskSpec {
        kind,
        flow: None,
        stage,
        start: Arc::new(move |stop| Box::pin(start(stop))),
    }
}

/// A long-running task of `flow`, started (and restarted) by `start`; it stops before the
/// drain.
fn flow_task<F>(
    kind: TaskKind,
    flow: &str,
    start: impl Fn(CancellationToken) -> F + Send + Sync + 'static,
) -> TaskSpec
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    TaskSpec {
        flow: Some(flow.to_owned()),
        ..node_task(kind, Stage::BeforeDrain, start)
    }
}

/// Sends the coordinator a heartbeat every [`HEARTBEAT_INTERVAL`] until `cancel`.
/// (While the coordinator is being restarted nobody answers: the heartbeat stays outstanding
/// until the next coordinator answers one.)
async fn watchdog(
    coordinator: CoordinatorHandle,
    liveness: Arc<Liveness>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        liveness.sent(Instant::now());
        coordinator.send(CoordinatorMsg::Heartbeat);
    }
}

impl Pipeline {
    /// Validates `params`, prepares the connections (lazily connected, so an unavailable
    /// cluster only delays its flows), starts the coordinator and one discovery loop per flow.
    #[tracing::instrument(skip_all, fields(node = %params.node_id), err)]
    pub async fn start<C: ControlPlane>(params: PipelineParams, control: C) -> Result<Self> {
        params.validate()?;
        let mut clusters = BTreeMap::new();
        for (alias, cluster) in &params.clusters {
            let c = Cluster::new(
                alias,
                cluster.iggy_version,
                &cluster.connection_string,
                cluster.connections,
                params.operation_timeout,
            )?
            .with_far_connections(cluster.far_connections);
            clusters.insert(alias.clone(), Arc::new(c));
        }
        let flows: BTreeMap<_, _> = params
            .flows
            .iter()
            .map(|f| (f.name.clone(), Arc::new(f.clone())))
            .collect();
        // Each flow's residency, compiled once and shared by everything that writes downstream.
        let residency = flows
            .values()
            .map(|f| {
                let residency = params
                    .residency(f)
                    .map_err(|(field, reason)| Error::InvalidParams { field, reason })?;
                Ok((f.name.clone(), Arc::new(residency)))
            })
            .collect::<Result<BTreeMap<String, Arc<Residency>>>>()?;
        let blocked =
            BlockedTopics::new(flows.values().map(|f| (f.name.as_str(), f.target.as_str())));
        let tuning = UnitTuning {
            backoff: params.backoff,
            retry_budget: params.retry_budget,
            tail_scan_window: params.tail_scan_window,
            commit_interval: params.commit_interval,
            observer: params.observer.clone(),
        };
        let writers = Arc::new(crate::fencing::identity::WriterTargets::new(
            &params.clusters,
            &clusters,
            params.operation_timeout,
            params.send_lease_margin,
        ));
        let meters = MeterRegistry::default();
        let meters_registry = meters.clone();
        let liveness = Arc::new(Liveness::new());
        let offset_maps = OffsetMaps::default();
        // Each flow's unit count as discovery last saw it, and its throttle (if limited).
        let units_seen: BTreeMap<String, Arc<std::sync::atomic::AtomicUsize>> = flows
            .keys()
            .map(|name| (name.clone(), Arc::default()))
            .collect();
        let flow_assignments = FlowAssignments::new(flows.keys().map(String::as_str));
        // The one door to each flow's target (see `datapath::target`).
        let doors: BTreeMap<String, Arc<TargetDoor<C>>> = flows
            .values()
            .map(|f| {
                let throttle = FlowThrottle::new(
                    &f.name,
                    f.max_messages_per_second,
                    f.max_bytes_per_second,
                    flow_assignments.subscribe(&f.name),
                    units_seen.get(&f.name).cloned().unwrap_or_default(),
                );
                let door = TargetDoor::new(
                    &f.target,
                    writers.clone(),
                    control.clone(),
                    throttle,
                    params.send_lease_margin,
                );
                (f.name.clone(), Arc::new(door))
            })
            .collect();
        let (alive, tasks_gone) = mpsc::channel(1);
        let alive_tasks = alive.clone();
        let coordinator = CoordinatorHandle::default();
        let gave_up = CancellationToken::new();
        let coordinator_args = CoordinatorArgs {
            node_id: params.node_id,
            control: control.clone(),
            flows: flows.clone(),
            clusters: clusters.clone(),
            writers: writers.clone(),
            tuning,
            meters: meters.clone(),
            alive,
            liveness: liveness.clone(),
            offset_maps: offset_maps.clone(),
            doors: doors.clone(),
            residency: residency.clone(),
            flow_assignments: flow_assignments.clone(),
        };
        // The long-running tasks beside the data path, started by the task supervisor.
        let mut tasks = Vec::new();
        {
            let (writers, control) = (writers.clone(), control.clone());
            // After the drain: the writers' connections must outlive the drain's final sends.
            tasks.push(node_task(
                TaskKind::IdentityFollower,
                Stage::AfterDrain,
                move |stop| {
                    crate::fencing::identity::follow(writers.clone(), control.clone(), stop)
                },
            ));
        }
        let group_registry = GroupSyncRegistry::default();
        let mut group_syncs: BTreeMap<String, SyncFn> = BTreeMap::new();
        let dance = Arc::new(tokio::sync::Mutex::new(()));
        for flow in flows
            .values()
            .filter(|f| crate::datapath::offset_maps::enabled(f))
        {
            let (Some(source), Some(door), Ok(groups)) = (
                clusters.get(&flow.source),
                doors.get(&flow.name),
                crate::sync::groups::group_selector(&flow.consumer_groups),
            ) else {
                continue;
            };
            let sync = Arc::new(GroupSync {
                flow: flow.clone(),
                residency: residency.get(&flow.name).cloned().unwrap_or_default(),
                groups,
                source: source.clone(),
                door: door.clone(),
                control: control.clone(),
                assignments: flow_assignments.subscribe(&flow.name),
                maps: offset_maps.clone(),
                dance: dance.clone(),
                registry: group_registry.clone(),
                found: std::sync::Mutex::default(),
                tail_scan_window: params.tail_scan_window,
            });
            let seed = (params.node_id << 32) ^ flow.name.len() as u64;
            let run = sync.clone();
            tasks.push(flow_task(TaskKind::GroupSync, &flow.name, move |stop| {
                crate::sync::groups::run(run.clone(), seed, stop)
            }));
            let run_once: SyncFn = Arc::new(move |units| {
                let sync = sync.clone();
                Box::pin(async move {
                    let report = sync.sync(units).await;
                    sync.registry
                        .update(&sync.flow.name, |s| s.add(report.clone()));
                    report
                })
            });
            group_syncs.insert(flow.name.clone(), run_once);
        }
        let mut selectors = BTreeMap::new();
        for flow in flows.values() {
            let selector = Selector::new(&flow.include, &flow.exclude)
                .map_err(|(field, reason)| Error::InvalidParams { field, reason })?
                .reserving(params.heartbeat_topics())
                .under(residency.get(&flow.name).cloned().unwrap_or_default());
            selectors.insert(flow.name.clone(), selector);
        }
        let metadata_registry = MetadataSyncRegistry::default();
        let mut metadata_syncs = BTreeMap::new();
        for flow in flows.values() {
            let (Some(selector), Some(source), Some(target)) = (
                selectors.get(&flow.name),
                clusters.get(&flow.source),
                clusters.get(&flow.target),
            ) else {
                continue;
            };
            let first_unit = crate::discovery::FirstUnit::default();
            let sync = Arc::new(MetadataSync::new(
                flow,
                &flows,
                &selectors,
                &params,
                (source.clone(), target.clone()),
                metadata_registry.clone(),
                Arc::new(control.clone()),
            )?);
            {
                let (run, control) = (sync.clone(), control.clone());
                let (assignments, first_unit) = (flow_assignments.clone(), first_unit.clone());
                let name = flow.name.clone();
                tasks.push(flow_task(TaskKind::MetadataSync, &flow.name, move |stop| {
                    crate::sync::metadata::run(
                        run.clone(),
                        control.clone(),
                        assignments.subscribe(&name),
                        first_unit.clone(),
                        stop,
                    )
                }));
            }
            let pairing = sync.pair.clone();
            metadata_syncs.insert(flow.name.clone(), sync);
            let discovery = DiscoveryParams {
                flow: flow.clone(),
                selector: selector.clone(),
                blocked: blocked.clone(),
                source: source.clone(),
                target: target.clone(),
                control: control.clone(),
                coordinator: coordinator.clone(),
                interval: params.discovery_interval,
                cancel: CancellationToken::new(),
                units_seen: units_seen.get(&flow.name).cloned().unwrap_or_default(),
                first_unit,
                assignments: flow_assignments.subscribe(&flow.name),
                pairing,
            };
            tasks.push(flow_task(TaskKind::Discovery, &flow.name, move |stop| {
                discovery::run(DiscoveryParams {
                    cancel: stop,
                    ..discovery.clone()
                })
            }));
        }
        let mut heartbeats = Vec::new();
        for flow in flows.values() {
            let (Some(admin), Some(door)) =
                (clusters.get(&flow.target), doors.get(&flow.name).cloned())
            else {
                continue;
            };
            if flow.heartbeat_interval.is_zero() {
                continue;
            }
            // The config refuses this; params built elsewhere get no heartbeats rather than a
            // write the policy forbids.
            let forbidden = flow.heartbeat_address().and_then(|(stream, topic)| {
                let policy = residency.get(&flow.name)?.blocked_by(stream, topic)?;
                Some((stream, topic, policy))
            });
            if let Some((stream, topic, policy)) = forbidden {
                blocked.heartbeat_blocked(&flow.name, stream, topic, policy);
                continue;
            }
            let meters = Arc::new(HeartbeatMeters::new(&flow.name));
            heartbeats.push(meters.clone());
            let beats = HeartbeatParams {
                flow: flow.clone(),
                node: params.node_id,
                control: control.clone(),
                assignments: flow_assignments.subscribe(&flow.name),
                admin: admin.clone(),
                door,
                units: meters_registry.clone(),
                observer: params.observer.clone(),
                meters,
                cancel: CancellationToken::new(),
            };
            tasks.push(flow_task(TaskKind::Heartbeats, &flow.name, move |stop| {
                heartbeat::run(HeartbeatParams {
                    cancel: stop,
                    ..beats.clone()
                })
            }));
        }
        {
            let (coordinator, liveness) = (coordinator.clone(), liveness.clone());
            tasks.push(node_task(
                TaskKind::Watchdog,
                Stage::BeforeDrain,
                move |stop| watchdog(coordinator.clone(), liveness.clone(), stop),
            ));
        }
        let task_registry = TaskRegistry::new(&tasks);
        let (tasks_ref, tasks_started) = tokio::sync::oneshot::channel();
        let (supervisor, supervisor_task) = Actor::spawn(
            None,
            Supervisor::<C>::new(),
            SupervisorArgs {
                coordinator: coordinator_args,
                handle: coordinator.clone(),
                gave_up: gave_up.clone(),
                tasks: TasksArgs {
                    node_id: params.node_id,
                    specs: tasks,
                    registry: task_registry.clone(),
                    backoff: params.backoff,
                    alive: alive_tasks,
                },
                tasks_ref,
            },
        )
        .await
        .map_err(|e| Error::Actor {
            name: format!("supervisor/n{}", params.node_id),
            reason: e.to_string(),
        })?;
        let tasks = tasks_started.await.map_err(|_| Error::Actor {
            name: format!("tasks/n{}", params.node_id),
            reason: "the task supervisor did not start".to_owned(),
        })?;
        tracing::info!(flows = flows.len(), "pipeline started");
        let cutover_clusters = clusters.clone();
        Ok(Self {
            supervisor,
            supervisor_task,
            coordinator,
            gave_up,
            tasks,
            task_registry,
            tasks_gone,
            clusters: clusters.values().cloned().collect(),
            shutdown_timeout: params.shutdown_timeout,
            meters,
            liveness,
            heartbeats,
            blocked,
            cutover: Cutover {
                flows,
                clusters: cutover_clusters,
                syncs: group_syncs,
                registry: group_registry,
                metadata: metadata_syncs,
                metadata_registry,
            },
        })
    }

    /// What `flow promote` asks of this pipeline (partition extents, a consumer-group sync
    /// round now), and the consumer-group sync state for status and metrics; a cheap handle
    /// that outlives a borrow of the pipeline.
    #[must_use]
    pub fn cutover(&self) -> Cutover {
        self.cutover.clone()
    }

    /// A reader of every flow's heartbeat counts on this node (flows with heartbeats on), like
    /// [`Pipeline::stats_reader`].
    pub fn heartbeats_reader(
        &self,
    ) -> impl Fn() -> Vec<HeartbeatStats> + Clone + Send + Sync + 'static {
        let heartbeats = self.heartbeats.clone();
        move || {
            let now = Instant::now();
            heartbeats.iter().map(|h| h.snapshot(now)).collect()
        }
    }

    /// A reader of every flow's topics that residency policies keep from its target (flows
    /// with none included), like [`Pipeline::stats_reader`].
    pub fn residency_reader(
        &self,
    ) -> impl Fn() -> Vec<FlowResidency> + Clone + Send + Sync + 'static {
        let blocked = self.blocked.clone();
        move || blocked.snapshot()
    }

    /// A reader of the connection state to every cluster, like [`Pipeline::stats_reader`].
    pub fn connections_reader(
        &self,
    ) -> impl Fn() -> Vec<ConnectionState> + Clone + Send + Sync + 'static {
        let clusters = self.clusters.clone();
        move || clusters.iter().map(|c| c.connection_state()).collect()
    }

    /// Resolves when the pipeline can no longer run: its coordinator died more often than its
    /// supervisor restarts it (see `crate::coordinator`). The process should then exit, so
    /// that its own supervisor (systemd, Kubernetes) starts it afresh.
    pub fn gave_up(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let gave_up = self.gave_up.clone();
        async move { gave_up.cancelled().await }
    }

    /// Whether the coordinator still handles its mailbox (for a liveness probe).
    #[must_use]
    pub fn liveness(&self) -> Arc<Liveness> {
        self.liveness.clone()
    }

    /// Statistics of every unit this instance has worked on since it started, in unit order.
    ///
    /// Read from the units' shared meters, never through the coordinator's mailbox, so it
    /// answers at once however busy the coordinator is. Never fails; it keeps its `Result` so
    /// that callers written for the actor query still compile.
    pub async fn stats(&self) -> Result<Vec<UnitStats>> {
        Ok(self.meters.snapshot(Instant::now()))
    }

    /// A cheap, cloneable reader of [`Pipeline::stats`] that outlives a borrow of the pipeline
    /// (the admin API keeps one while the node owns the pipeline for its shutdown). It reads
    /// the same shared meters, synchronously.
    pub fn stats_reader(&self) -> impl Fn() -> Vec<UnitStats> + Clone + Send + Sync + 'static {
        let meters = self.meters.clone();
        move || meters.snapshot(Instant::now())
    }

    /// How each long-running task beside the data path fared (restarts, panics, whether it
    /// runs), like [`Pipeline::stats_reader`].
    pub fn tasks_reader(&self) -> impl Fn() -> Vec<TaskStats> + Clone + Send + Sync + 'static {
        let registry = self.task_registry.clone();
        move || registry.snapshot(Instant::now())
    }

    /// Makes the long-running task `kind` of `flow` (`None`: of the node) panic, as a bug in
    /// it would; false if this pipeline runs no such task. For tests of the supervision.
    #[doc(hidden)]
    pub fn inject_task_panic_for_tests(&self, kind: TaskKind, flow: Option<&str>) -> bool {
        self.task_registry.inject_panic(kind, flow)
    }

    /// The shape of the actor tree as it runs now (see ARCHITECTURE.md, "Concurrency"), for
    /// the test that keeps that drawing true.
    #[doc(hidden)]
    pub fn draw_tree_for_tests(&self) -> String {
        crate::coordinator::draw_tree(&self.supervisor.get_cell())
    }

    /// Kills every actor `depth` levels under the root of the data path's actor tree (0: the
    /// root, 1: the coordinator, 2: the flow actors, 3: the units' readers and writers), as a
    /// crash of that part would, and returns how many it killed. For tests of the supervision.
    #[doc(hidden)]
    pub fn kill_actors_for_tests(&self, depth: usize) -> usize {
        if depth == 0 {
            self.supervisor.kill();
            return 1;
        }
        // The coordinator's branch only (the task supervisor beside it has its own test hook,
        // `inject_task_panic_for_tests`).
        let mut level: Vec<_> = self
            .coordinator
            .current()
            .map(|c| c.get_cell())
            .into_iter()
            .collect();
        for _ in 1..depth {
            level = level
                .iter()
                .flat_map(ractor::ActorCell::get_children)
                .collect();
        }
        for actor in &level {
            actor.kill();
        }
        level.len()
    }

    /// Graceful stop (SIGTERM): stop discovery, stop reading, finish in-flight writes, commit,
    /// release every unit, then close the connections. Bounded by the shutdown timeout, after
    /// which whatever still runs is aborted (the coordinator aborts its tasks as it stops).
    pub async fn shutdown(self) {
        self.shutdown_keeping(BTreeSet::new()).await;
    }

    /// Like [`Pipeline::shutdown`], except that the units of the flows in `keep` are not handed
    /// back: they stop after their final commit and stay this node's, so that a pipeline
    /// started next (a config reload that left those flows unchanged) resumes them at once
    /// under the same epochs, without an assignment round.
    #[tracing::instrument(skip_all, fields(kept = keep.len()))]
    pub async fn shutdown_keeping(mut self, keep: BTreeSet<String>) {
        self.stop_tasks(Stage::BeforeDrain).await;
        // No coordinator runs while it is being restarted: its units stopped with it.
        if let Some(coordinator) = self.coordinator.current() {
            let drained = call_t!(
                coordinator,
                CoordinatorMsg::Drain,
                self.shutdown_timeout.as_millis() as u64,
                keep
            );
            if let Err(err) = drained {
                tracing::warn!(error = %err, "drain did not finish in time; aborting the rest");
            }
        }
        self.stop_tasks(Stage::AfterDrain).await;
        // Stopping the root kills what is left of the tree under it.
        self.supervisor.stop(Some("shutdown".into()));
        let _ = self.supervisor_task.await;
        let _ = self.tasks_gone.recv().await;
        for cluster in &self.clusters {
            cluster.close().await;
        }
        tracing::info!("pipeline stopped");
    }

    /// Stops the long-running tasks of `stage` and waits for them, within the shutdown
    /// timeout (what still runs then is killed with the tree).
    async fn stop_tasks(&self, stage: Stage) {
        let stopped = call_t!(
            self.tasks,
            TasksMsg::Stop,
            self.shutdown_timeout.as_millis() as u64,
            stage
        );
        // The task supervisor is gone only if the tree gave up, which stopped the tasks.
        if let Err(err) = stopped {
            tracing::warn!(?stage, error = %err, "long-running tasks did not stop in time");
        }
    }

    /// Abrupt stop for tests (`kill -9`): aborts every task at once, without draining,
    /// committing or releasing anything, and returns once none of them runs any more.
    pub async fn crash(mut self) {
        // Killing the root kills the whole tree; the dropped states abort the unit loops,
        // release tasks and long-running tasks.
        self.supervisor.kill();
        let _ = self.supervisor_task.await;
        let _ = self.tasks_gone.recv().await;
        for cluster in &self.clusters {
            cluster.close().await;
        }
    }
}

/// The checks of [`PipelineParams`] that compile the flows' selections, here rather than in
/// `params` because the selections' compilers (`selection`, `sync`) sit above `params`.
impl PipelineParams {
    /// The residency of `flow`: the policies that forbid its target, compiled. On error returns
    /// the field (`policies[0].select[1]`) and the reason.
    pub(crate) fn residency(
        &self,
        flow: &FlowParams,
    ) -> std::result::Result<crate::selection::residency::Residency, (String, String)> {
        let zones = self
            .clusters
            .get(&flow.target)
            .map(|c| c.zones.as_slice())
            .unwrap_or_default();
        crate::selection::residency::Residency::new(&self.policies, zones)
    }

    /// Checks cross-references and bounds; returns the first problem with its field path.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: String, reason: &str| Error::InvalidParams {
            field,
            reason: reason.to_owned(),
        };
        for (alias, cluster) in &self.clusters {
            if cluster.connections == 0 {
                return Err(invalid(
                    format!("clusters.{alias}.connections"),
                    "must be at least 1",
                ));
            }
        }
        if let Err((a, b)) =
            crate::provenance::distinct_cluster_ids(self.clusters.keys().map(String::as_str))
        {
            return Err(Error::InvalidParams {
                field: format!("clusters.{b}"),
                reason: format!(
                    "the aliases {a} and {b} have the same provenance id (compact provenance \
                     names a cluster by a 32-bit hash of its alias): rename one"
                ),
            });
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, flow) in self.flows.iter().enumerate() {
            if flow.name.is_empty() || flow.name.contains('/') {
                return Err(invalid(
                    format!("flows[{i}].name"),
                    "must be non-empty without '/'",
                ));
            }
            if !names.insert(flow.name.as_str()) {
                return Err(invalid(format!("flows[{i}].name"), "duplicate flow name"));
            }
            for (field, alias) in [("source", &flow.source), ("target", &flow.target)] {
                if !self.clusters.contains_key(alias) {
                    return Err(invalid(
                        format!("flows[{i}].{field}"),
                        "unknown cluster alias",
                    ));
                }
            }
            if flow.source == flow.target {
                return Err(invalid(
                    format!("flows[{i}].target"),
                    "must differ from source",
                ));
            }
            if flow.batch_size == 0 {
                return Err(invalid(
                    format!("flows[{i}].batch_size"),
                    "must be at least 1",
                ));
            }
            if flow.max_batch_bytes == 0 {
                return Err(invalid(
                    format!("flows[{i}].max_batch_bytes"),
                    "must be at least 1",
                ));
            }
            if flow.max_in_flight_batches == 0 {
                return Err(invalid(
                    format!("flows[{i}].max_in_flight_batches"),
                    "must be at least 1",
                ));
            }
            crate::selection::mapping::Selector::new(&flow.include, &flow.exclude)
                .map_err(|(field, reason)| invalid(format!("flows[{i}].{field}"), &reason))?;
            crate::sync::groups::group_selector(&flow.consumer_groups)
                .map_err(|(field, reason)| invalid(format!("flows[{i}].{field}"), &reason))?;
            for (field, limit) in [
                ("max_messages_per_second", flow.max_messages_per_second),
                ("max_bytes_per_second", flow.max_bytes_per_second),
            ] {
                if limit == Some(0) {
                    return Err(invalid(format!("flows[{i}].{field}"), "must be at least 1"));
                }
            }
            crate::sync::metadata::user_selector(&flow.users)
                .map_err(|(field, reason)| invalid(format!("flows[{i}].{field}"), &reason))?;
            if flow.metadata_sync_interval.is_zero() {
                return Err(invalid(
                    format!("flows[{i}].metadata_sync_interval"),
                    "must be above zero",
                ));
            }
            if !flow.consumer_groups.is_empty() && flow.consumer_group_sync_interval.is_zero() {
                return Err(invalid(
                    format!("flows[{i}].consumer_group_sync_interval"),
                    "must be above zero",
                ));
            }
            replicator_model::heartbeat_topic_parts(&flow.heartbeat_topic)
                .map_err(|reason| invalid(format!("flows[{i}].heartbeat_topic"), reason))?;
        }
        crate::selection::residency::Residency::new(&self.policies, &[])
            .map_err(|(field, reason)| invalid(field, &reason))?;
        if self.tail_scan_window == 0 {
            return Err(invalid("tail_scan_window".into(), "must be at least 1"));
        }
        Ok(())
    }
}
