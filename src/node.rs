//! One running replicator node: its admin API, control plane and pipeline, started in that
//! order and stopped in reverse order. `run` runs one; `demo` runs three in-process.
//!
//! The admin API serves from the moment the listeners are bound, so that an operator can see a
//! node that waits (for a quorum, for Iggy) and stop it: [`RunningNode::start_until`] gives up
//! the start when asked to stop, shutting down whatever already started.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use replicator_config::{flow_digests, Config};
use replicator_control::tls::{ServerTls, ServerTlsFiles};
use replicator_control::Control;
use replicator_model::NodeId;
use replicator_pipeline::{check_generations, Pipeline, TargetFence, PROBE_TIMEOUT};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::{self, AdminState, NodeParts, PipelineView};
use crate::exit::{generation_failure, Failure};
use crate::metrics::Metrics;
use crate::reload::{needs_restart, ConfigPublisher, ReloadReport, ReloadSender};
use crate::wiring::{
    control_params, fence_topology, fenced_targets, fencing, pipeline_params, RaftControl,
};

/// How long a start or a reload waits for the fenced targets to confirm the credential may
/// manage users.
const RIGHTS_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

const FENCE_RIGHTS_HINT: &str = "give the configured user the global manage_users permission, or set fencing = \"off\" for that cluster (README, \"Writer users\")";

/// Checks that the credential of each fenced target of `targets` may manage users. A target
/// that does not answer within [`RIGHTS_CHECK_TIMEOUT`] is let through with a warning: the
/// leader's fencing operations retry until it does, and say why in status and metrics.
async fn check_fence_rights(
    fence: &TargetFence,
    targets: &BTreeSet<String>,
) -> Result<(), replicator_pipeline::FenceSetupError> {
    match tokio::time::timeout(RIGHTS_CHECK_TIMEOUT, fence.check_rights(targets)).await {
        Ok(checked) => checked,
        Err(_) => {
            warn!("fenced target clusters did not answer the credential check in time; going on");
            Ok(())
        }
    }
}

/// How long the admin API may take to finish the requests in flight when it stops, before
/// its task is aborted (a `/status` forwarded to an unreachable leader must not hold a stop).
const ADMIN_STOP_GRACE: Duration = Duration::from_secs(5);

/// How long a reload waits for its new config digests to be committed before it answers.
const PUBLISH_WAIT: Duration = Duration::from_secs(10);

/// How long a start given up (a stop during start) may take to end before it is abandoned.
const ABANDON_GRACE: Duration = Duration::from_secs(1);

/// Listeners bound before the node starts (port 0 in tests and the demo).
pub(crate) struct NodeListeners {
    /// Raft RPC listener.
    pub(crate) raft: std::net::TcpListener,
    /// Admin API listener.
    pub(crate) api: tokio::net::TcpListener,
}

impl NodeListeners {
    /// Binds `node.raft_addr` and `node.api_addr` of `config` (DNS names are resolved).
    pub(crate) async fn bind(config: &Config) -> Result<Self, Failure> {
        let api = tokio::net::TcpListener::bind(&config.node.api_addr)
            .await
            .map_err(|e| {
                Failure::runtime(
                    format!("cannot bind the admin API on {}: {e}", config.node.api_addr),
                    "choose a free node.api_addr",
                )
            })?;
        let raft_addr = resolve(&config.node.raft_addr, "node.raft_addr").await?;
        let raft = std::net::TcpListener::bind(raft_addr).map_err(|e| {
            Failure::runtime(
                format!("cannot bind the Raft listener on {raft_addr}: {e}"),
                "choose a free node.raft_addr",
            )
        })?;
        Ok(Self { raft, api })
    }
}

/// The admin API task of a node.
struct AdminServer {
    /// Asks the server to stop accepting and finish its requests.
    stop: CancellationToken,
    /// The server task.
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Serves `state` on `listener` from now on, over HTTPS when `tls` is given, on `runtime`
    /// (the control plane's: health checks and status answer while the data plane is busy).
    fn start(
        listener: std::net::TcpListener,
        state: AdminState,
        tls: Option<ServerTls>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = runtime.spawn(async move {
            // Registered with the runtime that serves it (not the one that bound it).
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => admin::serve(listener, state, stopped, tls).await,
                Err(e) => tracing::error!(error = %e, "admin API cannot listen"),
            }
        });
        Self { stop, task }
    }

    /// Stops serving; requests in flight get [`ADMIN_STOP_GRACE`] to finish.
    async fn shutdown(mut self) {
        self.stop.cancel();
        match tokio::time::timeout(ADMIN_STOP_GRACE, &mut self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "admin API task failed"),
            Err(_) => {
                warn!(grace = ?ADMIN_STOP_GRACE, "admin API requests still running; aborting them");
                self.task.abort();
                let _ = self.task.await;
            }
        }
    }

    /// Stops serving at once.
    #[cfg(any(test, feature = "dev-tools"))]
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// A started node.
pub(crate) struct RunningNode {
    /// The node id.
    pub(crate) id: NodeId,
    /// Its control-plane handle.
    pub(crate) control: Control,
    /// The runtime the control plane and the admin API run on (stopped after both).
    control_thread: ControlThread,
    /// Its pipeline (the admin API reads its statistics through a shared reader); `None` only
    /// when a reload could start neither the new config's pipeline nor the previous one's.
    pipeline: Option<Pipeline>,
    /// The config it runs (replaced by a reload).
    config: Config,
    /// Its Prometheus families (the pipeline's observer feeds them).
    metrics: Arc<Metrics>,
    /// Publishes its flows' config digests to the control plane.
    publisher: ConfigPublisher,
    /// The clusters with fencing on, with their managing credential (`None`: none is).
    fence: Option<Arc<TargetFence>>,
    /// Where its admin API listens (the demo and tests dial it).
    #[cfg(any(test, feature = "dev-tools"))]
    pub(crate) api_addr: SocketAddr,
    /// What the admin API reads; told when the node stops.
    parts: Arc<NodeParts>,
    /// The admin API.
    admin: AdminServer,
}

impl RunningNode {
    /// Starts admin API, control plane and pipeline and waits until all run; binds the
    /// configured addresses unless `listeners` are given. For in-process nodes (demo, tests),
    /// which are never asked to stop while they start.
    #[cfg(any(test, feature = "dev-tools"))]
    pub(crate) async fn start(
        config: &Config,
        listeners: Option<NodeListeners>,
    ) -> Result<Self, Failure> {
        let listeners = match listeners {
            Some(listeners) => listeners,
            None => NodeListeners::bind(config).await?,
        };
        let never = CancellationToken::new();
        Self::start_until(config, listeners, &never, None)
            .await?
            .ok_or_else(|| Failure::runtime("the node start was interrupted", "report a bug"))
    }

    /// Serves the admin API on `listeners.api` at once, then starts the control plane and the
    /// pipeline, publishing each to the admin API as it comes up. When `stop` is cancelled
    /// first, whatever already started is shut down in reverse order and the answer is
    /// `Ok(None)`; a failure to start shuts it down likewise and is returned.
    pub(crate) async fn start_until(
        config: &Config,
        listeners: NodeListeners,
        stop: &CancellationToken,
        reloads: Option<ReloadSender>,
    ) -> Result<Option<Self>, Failure> {
        let NodeListeners { raft, api } = listeners;
        let raft_addr = raft.local_addr().map_err(bind_failure)?;
        let api_addr = api.local_addr().map_err(bind_failure)?;
        let api = api.into_std().map_err(|e| {
            Failure::runtime(
                format!("cannot hand the admin API listener over: {e}"),
                "retry",
            )
        })?;
        let control_thread = ControlThread::start()?;
        let metrics = Arc::new(Metrics::new());
        let parts = Arc::new(NodeParts::new(flow_names(config)));
        let tls = match &config.node.api_tls {
            Some(t) => Some(
                ServerTls::open(ServerTlsFiles {
                    cert_file: t.cert_file.clone(),
                    key_file: t.key_file.clone(),
                    client_ca_file: t.client_ca_file.clone(),
                })
                .map_err(|e| Failure::config(format!("node.api_tls: {e}")))?,
            ),
            // Only a listener others can reach is worth a warning: on loopback (the demo, a
            // node behind a local proxy) nobody else sees the traffic.
            None if api_addr.ip().is_loopback() => None,
            None => {
                warn!(api = %api_addr, "admin API serves plain http: configure [node.api_tls] for https");
                None
            }
        };
        let admin = AdminServer::start(
            api,
            AdminState::new(parts.clone(), metrics.clone(), config, reloads),
            tls,
            control_thread.handle(),
        );
        info!(node = config.node.id, raft = %raft_addr, api = %api_addr, "starting node; admin API serving");

        let fence = match TargetFence::new(&pipeline_params(config)) {
            Ok(fence) => fence.map(Arc::new),
            Err(e) => {
                admin.shutdown().await;
                return Err(Failure::config(format!("clusters: {e}")));
            }
        };
        // Two checks of the clusters, at once (a frozen cluster costs each its timeout; one
        // after the other they held the start for both): a cluster that answers in the other
        // Iggy generation would only ever time out, so say so now, naming the key; and the
        // fenced targets' users must have the rights the fence needs. A target that does not
        // answer soon is checked by the leader's first fence instead (its failures show in
        // status and metrics). A stop request wins.
        let clusters = pipeline_params(config).clusters;
        let probe = check_generations(&clusters, PROBE_TIMEOUT);
        let targets = fenced_targets(&pipeline_params(config));
        let rights = async {
            match &fence {
                Some(fence) => check_fence_rights(fence, &targets).await,
                None => Ok(()),
            }
        };
        let (mismatches, checked) = tokio::select! {
            () = stop.cancelled() => {
                admin.shutdown().await;
                return Ok(None);
            }
            both = async { tokio::join!(probe, rights) } => both,
        };
        if let Some(failure) = generation_failure(&mismatches) {
            admin.shutdown().await;
            return Err(failure);
        }
        if let Err(e) = checked {
            admin.shutdown().await;
            return Err(Failure::config(e.to_string()).with_hint(FENCE_RIGHTS_HINT));
        }
        let fencing = fencing(fence.clone(), &pipeline_params(config));
        let params = control_params(config, raft_addr, Some(raft), fencing);
        let outcome = start_unless_stopped(
            "control plane",
            control_thread.handle(),
            Control::start(params),
            stop,
        )
        .await;
        let hint = "check node.data_dir (readable, this node's own) and node.raft_addr (free)";
        let control = match outcome.or_give_up(&parts, hint, Control::shutdown).await {
            Ok(control) => control,
            Err(failure) => {
                admin.shutdown().await;
                return failure.map_or(Ok(None), Err);
            }
        };
        parts.publish_control(control.clone());
        // Before the pipeline starts: it works on no unit the leader decided on by the config
        // an earlier process of this node ran.
        control.set_running_config(flow_digests(config));
        // The previous process's sends with the configured credential are not stopped by the
        // fence of its identity: that identity is given up once they can have landed.
        let margin = pipeline_params(config).send_lease_margin;
        control.earlier_sends_land_by(std::time::Instant::now() + margin);
        let publisher = ConfigPublisher::start(control.clone(), flow_digests(config));

        let start = start_pipeline(config, &control, &metrics);
        let here = tokio::runtime::Handle::current();
        let outcome = start_unless_stopped("pipeline", &here, start, stop).await;
        let hint = "check [clusters] and [[flows]]";
        let pipeline = match outcome.or_give_up(&parts, hint, Pipeline::shutdown).await {
            Ok(pipeline) => pipeline,
            Err(failure) => {
                control.shutdown().await;
                admin.shutdown().await;
                return failure.map_or(Ok(None), Err);
            }
        };
        publish_pipeline(&parts, &pipeline, config);
        info!(node = config.node.id, "node started");
        Ok(Some(Self {
            id: config.node.id,
            control,
            control_thread,
            pipeline: Some(pipeline),
            config: config.clone(),
            metrics,
            publisher,
            fence,
            #[cfg(any(test, feature = "dev-tools"))]
            api_addr,
            parts,
            admin,
        }))
    }

    /// Resolves when its pipeline gave up (see `Pipeline::gave_up`); never while it has none.
    pub(crate) fn pipeline_gave_up(&self) -> impl Future<Output = ()> + Send + 'static {
        let gave_up = self.pipeline.as_ref().map(Pipeline::gave_up);
        async move {
            match gave_up {
                Some(gave_up) => gave_up.await,
                None => std::future::pending().await,
            }
        }
    }

    /// Its pipeline (see the field).
    #[cfg(any(test, feature = "dev-tools"))]
    pub(crate) fn pipeline(&self) -> Option<&Pipeline> {
        self.pipeline.as_ref()
    }

    /// Applies `new` without a restart (see `reload.rs`), or says why the running config
    /// stays.
    pub(crate) async fn reload(&mut self, new: Config) -> Result<ReloadReport, String> {
        let blocked = needs_restart(&self.config, &new);
        if !blocked.is_empty() {
            return Err(format!(
                "{}: only a restart applies these; reload applies [[flows]], [[policies]] and [pipeline]",
                blocked.join("; ")
            ));
        }
        // A flow into a fenced target no flow wrote to before: its credential must be able to
        // create the writer users, or the flow would never copy anything.
        if let Some(fence) = &self.fence {
            let before = fenced_targets(&pipeline_params(&self.config));
            let added: BTreeSet<String> = fenced_targets(&pipeline_params(&new))
                .difference(&before)
                .cloned()
                .collect();
            if let Err(e) = check_fence_rights(fence, &added).await {
                return Err(format!("{e}; {FENCE_RIGHTS_HINT}"));
            }
        }
        let (old_digests, new_digests) = (flow_digests(&self.config), flow_digests(&new));
        let pipeline_changed = self.config.pipeline != new.pipeline;
        let report = ReloadReport::between(&old_digests, &new_digests, pipeline_changed);
        if report.is_noop() {
            return Ok(report);
        }
        info!(kept = ?report.kept(), "reloading: replacing the pipeline");
        self.parts.withdraw_pipeline();
        if let Some(old) = self.pipeline.take() {
            old.shutdown_keeping(report.kept()).await;
        }
        // The changed flows' units wait until the leader decided on the new digests.
        self.control.set_running_config(new_digests.clone());
        match start_pipeline(&new, &self.control, &self.metrics).await {
            Ok(pipeline) => {
                publish_pipeline(&self.parts, &pipeline, &new);
                self.pipeline = Some(pipeline);
                // Before the digests: the leader grants the new flows' units only once its
                // own config has them, and fences with the targets they write to.
                self.control
                    .set_fence_topology(fence_topology(&pipeline_params(&new)));
                self.config = new;
                // Answer once the leader knows (the publisher keeps trying if it does not yet).
                if !self.publisher.publish(new_digests, PUBLISH_WAIT).await {
                    warn!(
                        "the new config digests are not published yet; retrying in the background"
                    );
                }
                Ok(report)
            }
            Err(e) => {
                // Back to what ran: its units of unchanged flows are still this node's.
                self.control.set_running_config(old_digests);
                let again = start_pipeline(&self.config, &self.control, &self.metrics).await;
                let tail = match again {
                    Ok(pipeline) => {
                        publish_pipeline(&self.parts, &pipeline, &self.config);
                        self.pipeline = Some(pipeline);
                        "the previous config runs again".to_owned()
                    }
                    Err(e) => format!("nor did the previous config's ({e}); the node copies nothing until restarted"),
                };
                Err(format!(
                    "the new config's pipeline did not start ({e}); {tail}"
                ))
            }
        }
    }

    /// Graceful stop: the pipeline drains (final commits, units released), then the control
    /// plane stops, then the admin API.
    pub(crate) async fn shutdown(self) {
        self.drain().await.shutdown().await;
    }

    /// First half of a graceful stop: the node reports itself stopping (not ready) and drains
    /// the pipeline (final commits, units released) while the control plane and the admin API
    /// keep running. Stopping several nodes of one cluster drains them all before any control
    /// plane stops, so the drains never lose their quorum.
    pub(crate) async fn drain(self) -> DrainedNode {
        self.parts.begin_stop();
        // Without a quorum the drain's commits and releases cannot succeed: give each up after
        // two election timeouts instead of the full write timeout (successors resume from the
        // confirmed offsets and the downstream tails once this node's lease expires).
        self.control.begin_drain();
        match self.control.begin_leaving().await {
            Ok(true) => info!(
                node = self.id,
                "marked leaving: the leader grants this node nothing more"
            ),
            Ok(false) => {}
            // The drain goes on: its releases hand the units over all the same, only a unit
            // released may be granted back once before the node is gone.
            Err(e) => {
                warn!(node = self.id, error = %e, "could not mark this node leaving before its drain")
            }
        }
        if let Some(pipeline) = self.pipeline {
            pipeline.shutdown().await;
        }
        DrainedNode {
            id: self.id,
            control: self.control,
            control_thread: self.control_thread,
            admin: self.admin,
        }
    }

    /// Stops everything at once without draining, as `kill -9` would (the demo's fault).
    #[cfg(any(test, feature = "dev-tools"))]
    pub(crate) async fn crash(self) {
        self.admin.crash().await;
        if let Some(pipeline) = self.pipeline {
            pipeline.crash().await;
        }
        self.control.crash().await;
    }
}

/// A node whose pipeline has drained; its control plane and admin API still run.
pub(crate) struct DrainedNode {
    id: NodeId,
    control: Control,
    control_thread: ControlThread,
    admin: AdminServer,
}

impl DrainedNode {
    /// Hands the Raft leadership over if this node leads, then stops the control plane and
    /// the admin API.
    pub(crate) async fn shutdown(self) {
        self.control.hand_over_leadership().await;
        self.control.shutdown().await;
        self.admin.shutdown().await;
        drop(self.control_thread);
        info!(node = self.id, "node stopped");
    }
}

/// How a part of the node came out of [`start_unless_stopped`].
enum Outcome<T> {
    /// It runs.
    Started(T),
    /// Its start failed: the part (e.g. `"pipeline"`) and the error.
    Failed(&'static str, String),
    /// A stop came first; the start was given up (`Some` if it had finished meanwhile and
    /// must be shut down).
    Stopped(Option<T>),
}

impl<T> Outcome<T> {
    /// The started part; otherwise the node's start is given up: `Err(None)` after a stop (the
    /// node reports itself stopping, and a part that started meanwhile is stopped with
    /// `shutdown`), `Err(Some(failure))` with `hint` after a failure. The caller then shuts down
    /// the parts started before.
    async fn or_give_up<S>(
        self,
        parts: &NodeParts,
        hint: &str,
        shutdown: impl FnOnce(T) -> S,
    ) -> Result<T, Option<Failure>>
    where
        S: Future<Output = ()>,
    {
        match self {
            Outcome::Started(part) => Ok(part),
            Outcome::Stopped(started) => {
                parts.begin_stop();
                if let Some(part) = started {
                    shutdown(part).await;
                }
                Err(None)
            }
            Outcome::Failed(part, e) => Err(Some(Failure::runtime(
                format!("cannot start the {part}: {e}"),
                hint,
            ))),
        }
    }
}

/// Runs `start` as a task of its own on `runtime` (so that a start stuck even in blocking code
/// cannot hold the node's reaction to `stop`; the tasks it spawns run there too) until it
/// finishes or `stop` is cancelled. A start given up is aborted and waited for at most
/// [`ABANDON_GRACE`].
async fn start_unless_stopped<T, E, F>(
    part: &'static str,
    runtime: &tokio::runtime::Handle,
    start: F,
    stop: &CancellationToken,
) -> Outcome<T>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
    F: Future<Output = Result<T, E>> + Send + 'static,
{
    let mut task = runtime.spawn(start);
    tokio::select! {
        biased;
        () = stop.cancelled() => {
            info!(part, "stop requested while starting; giving the start up");
            task.abort();
            match tokio::time::timeout(ABANDON_GRACE, task).await {
                Ok(Ok(Ok(started))) => Outcome::Stopped(Some(started)),
                Ok(_) => Outcome::Stopped(None),
                Err(_) => {
                    warn!(part, grace = ?ABANDON_GRACE, "start did not give up in time; abandoned");
                    Outcome::Stopped(None)
                }
            }
        }
        joined = &mut task => match joined {
            Ok(Ok(started)) => Outcome::Started(started),
            Ok(Err(e)) => Outcome::Failed(part, e.to_string()),
            Err(e) => Outcome::Failed(part, format!("its start task failed: {e}")),
        },
    }
}

/// The runtime of the control plane and the admin API. Their Raft RPCs, lease renewals,
/// assignment rounds and health checks never queue behind the data plane's tasks: when tens
/// of thousands of units start at once, the data plane's runtime has seconds of work queued,
/// renewals late by more than `fence_after` would fence a member that is alive (which
/// restarts all its units, and so on), and an orchestrator would find the node unhealthy.
/// Threads of their own are scheduled by the OS beside the data plane's, whatever its queue.
struct ControlThread {
    handle: tokio::runtime::Handle,
    /// Taken only by `drop`.
    runtime: Option<tokio::runtime::Runtime>,
}

impl ControlThread {
    /// Threads of the control plane's runtime: one may wait in the database's blocking IO
    /// while the other serves Raft.
    const WORKERS: usize = 2;

    fn start() -> Result<Self, Failure> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(Self::WORKERS)
            .thread_name("control")
            .enable_all()
            .build()
            .map_err(|e| {
                Failure::runtime(
                    format!("cannot start the control plane's runtime: {e}"),
                    "check the process's thread limit",
                )
            })?;
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for ControlThread {
    /// Without waiting (a drop may happen on an async task, where a runtime must not block):
    /// the control plane was shut down or crashed before, and whatever task is left ends with
    /// the runtime.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts the pipeline of `config` (its observer feeding `metrics`).
fn start_pipeline(
    config: &Config,
    control: &Control,
    metrics: &Metrics,
) -> impl Future<Output = Result<Pipeline, replicator_pipeline::Error>> + Send + 'static {
    let mut params = pipeline_params(config);
    params.observer = metrics.observer();
    Pipeline::start(params, RaftControl(control.clone()))
}

/// Hands the admin API the readers of `pipeline`, which runs `config`'s flows.
fn publish_pipeline(parts: &NodeParts, pipeline: &Pipeline, config: &Config) {
    parts.publish_pipeline(
        PipelineView {
            stats: Arc::new(pipeline.stats_reader()),
            liveness: pipeline.liveness(),
            connections: Arc::new(pipeline.connections_reader()),
            cutover: pipeline.cutover(),
            heartbeats: Arc::new(pipeline.heartbeats_reader()),
            residency: Arc::new(pipeline.residency_reader()),
            tasks: Arc::new(pipeline.tasks_reader()),
        },
        flow_names(config),
    );
}

fn flow_names(config: &Config) -> Arc<[String]> {
    config.flows.iter().map(|f| f.name.clone()).collect()
}

fn bind_failure(e: std::io::Error) -> Failure {
    Failure::runtime(format!("listener has no local address: {e}"), "retry")
}

/// Resolves a `host:port` from the config (DNS names are allowed, e.g. in Kubernetes).
async fn resolve(address: &str, key: &str) -> Result<SocketAddr, Failure> {
    let hint = "use an IP address or a name this host can resolve";
    let mut addrs = tokio::net::lookup_host(address)
        .await
        .map_err(|e| Failure::runtime(format!("cannot resolve {key} {address:?}: {e}"), hint))?;
    addrs
        .next()
        .ok_or_else(|| Failure::runtime(format!("{key} {address:?} resolves to no address"), hint))
}

#[cfg(test)]
mod tests {
    use replicator_config::testing::MinimalConfig;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    #[tokio::test]
    async fn stop_before_the_control_plane_starts_leaves_nothing_running() -> TestResult {
        let dir = tempfile::tempdir()?;
        let raft = std::net::TcpListener::bind("127.0.0.1:0")?;
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let api_addr = api.local_addr()?;
        let data = dir.path().join("node");
        let config = MinimalConfig {
            data_dir: data.display().to_string(),
            raft_addr: raft.local_addr()?.to_string(),
            api_addr: api_addr.to_string(),
            secret: "node-test-secret-0123456789".to_owned(),
            ..MinimalConfig::default()
        }
        .parse()?;
        let stop = CancellationToken::new();
        stop.cancel();
        let started = RunningNode::start_until(&config, NodeListeners { raft, api }, &stop, None)
            .await
            .map_err(|e| format!("{e:?}"))?;
        assert!(started.is_none(), "a stopped start returns no node");
        // The control plane never opened its data dir, and the admin API stopped serving.
        assert!(!data.exists());
        assert!(tokio::net::TcpStream::connect(api_addr).await.is_err());
        Ok(())
    }
}
