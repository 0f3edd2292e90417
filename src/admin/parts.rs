//! What the node publishes to the admin API as it comes up ([`NodeParts`]): the control
//! plane, the running pipeline's readers, the flows of the config it runs, and the stage its
//! life is in. Handlers read these and never wait for an actor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use replicator_control::Control;
use replicator_pipeline::{ConnectionState, Cutover, Liveness, UnitStats};
use replicator_pipeline::{FlowResidency, HeartbeatStats, TaskStats};
use tracing::warn;

/// Reads the pipeline's per-unit statistics (shared meters; never waits for an actor).
pub(crate) type StatsReader = Arc<dyn Fn() -> Vec<UnitStats> + Send + Sync>;
/// Reads the pipeline's connection state to every Iggy cluster.
pub(crate) type ConnectionsReader = Arc<dyn Fn() -> Vec<ConnectionState> + Send + Sync>;
/// Reads the pipeline's heartbeat counts of every flow.
pub(crate) type HeartbeatsReader = Arc<dyn Fn() -> Vec<HeartbeatStats> + Send + Sync>;
/// Reads the topics residency policies keep from every flow's target.
pub(crate) type ResidencyReader = Arc<dyn Fn() -> Vec<FlowResidency> + Send + Sync>;
/// Reads how the pipeline's long-running tasks fared.
pub(crate) type TasksReader = Arc<dyn Fn() -> Vec<TaskStats> + Send + Sync>;

/// The parts of a node the admin API reads, published by the node as they come up.
pub(crate) struct NodeParts {
    /// The control plane, once started.
    pub(super) control: OnceLock<Control>,
    /// What the admin API reads of the running pipeline; `None` until it started, and while a
    /// config reload replaces it.
    pipeline: RwLock<Option<PipelineView>>,
    /// Names of the flows in the config the node runs (replaced by a reload).
    flows: RwLock<Arc<[String]>>,
    /// Set when the node begins to stop (drain, then control plane).
    stopping: AtomicBool,
    /// When the current stage began (a start stuck in one stage shows how long it has been).
    stage_since: Mutex<Instant>,
}

/// The readers of one running pipeline (see [`NodeParts::publish_pipeline`]).
#[derive(Clone)]
pub(crate) struct PipelineView {
    /// Per-unit statistics (shared meters).
    pub(crate) stats: StatsReader,
    /// Heartbeats of the coordinator's mailbox.
    pub(crate) liveness: Arc<Liveness>,
    /// Connections to each Iggy cluster.
    pub(crate) connections: ConnectionsReader,
    /// The handle for `flow promote` / `flow reset` and the consumer-group sync state.
    pub(crate) cutover: Cutover,
    /// Heartbeat counts per flow.
    pub(crate) heartbeats: HeartbeatsReader,
    /// The topics residency policies keep from each flow's target.
    pub(crate) residency: ResidencyReader,
    /// How the long-running tasks beside the data path fared (restarts, panics).
    pub(crate) tasks: TasksReader,
}

impl NodeParts {
    /// Nothing started yet; `flows` are the config's flow names.
    pub(crate) fn new(flows: Arc<[String]>) -> Self {
        Self {
            control: OnceLock::new(),
            pipeline: RwLock::new(None),
            flows: RwLock::new(flows),
            stopping: AtomicBool::new(false),
            stage_since: Mutex::new(Instant::now()),
        }
    }

    /// Publishes the started control plane.
    pub(crate) fn publish_control(&self, control: Control) {
        if self.control.set(control).is_err() {
            warn!("control plane published twice; keeping the first");
        }
        self.next_stage();
    }

    /// Publishes the started pipeline's readers (replacing those of a pipeline a reload
    /// stopped) and the names of the flows it runs.
    pub(crate) fn publish_pipeline(&self, view: PipelineView, flows: Arc<[String]>) {
        *self.pipeline.write().unwrap_or_else(|p| p.into_inner()) = Some(view);
        *self.flows.write().unwrap_or_else(|p| p.into_inner()) = flows;
        self.next_stage();
    }

    /// A reload stopped the pipeline; the next one is not started yet.
    pub(crate) fn withdraw_pipeline(&self) {
        *self.pipeline.write().unwrap_or_else(|p| p.into_inner()) = None;
        self.next_stage();
    }

    /// The running pipeline's readers, if one runs.
    pub(super) fn pipeline(&self) -> Option<PipelineView> {
        self.pipeline
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The flow names of the config the node runs.
    pub(crate) fn flows(&self) -> Arc<[String]> {
        self.flows.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Marks the node as stopping: it is no longer ready.
    pub(crate) fn begin_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.next_stage();
    }

    fn next_stage(&self) {
        *self
            .stage_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Instant::now();
    }

    /// One line on where the node stands: `ok`, or the stage with how long it has lasted
    /// (`starting: control plane (for 12s)`).
    pub(super) fn describe(&self) -> String {
        let stage = self.stage();
        if stage == Stage::Running {
            return stage.describe().to_owned();
        }
        let since = *self
            .stage_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        format!("{} (for {}s)", stage.describe(), since.elapsed().as_secs())
    }

    /// Where the node's life stands.
    pub(super) fn stage(&self) -> Stage {
        if self.stopping.load(Ordering::SeqCst) {
            Stage::Stopping
        } else if self.control.get().is_none() {
            Stage::StartingControl
        } else if self.pipeline().is_none() {
            Stage::StartingPipeline
        } else {
            Stage::Running
        }
    }

    /// The pipeline's statistics; empty while it has not started.
    pub(super) fn local_stats(&self) -> Vec<UnitStats> {
        self.pipeline().map(|p| (p.stats)()).unwrap_or_default()
    }

    /// How the pipeline's long-running tasks fared; empty until the pipeline started.
    pub(super) fn tasks(&self) -> Vec<TaskStats> {
        self.pipeline().map(|p| (p.tasks)()).unwrap_or_default()
    }

    /// This node's heartbeat counts per flow; empty until the pipeline started.
    pub(super) fn heartbeats(&self) -> Vec<HeartbeatStats> {
        self.pipeline()
            .map(|p| (p.heartbeats)())
            .unwrap_or_default()
    }

    /// This node's blocked topics per flow; empty until the pipeline started.
    pub(super) fn residency(&self) -> Vec<FlowResidency> {
        self.pipeline().map(|p| (p.residency)()).unwrap_or_default()
    }
}

/// Where a node's life stands, as the admin API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The control plane is starting (opening its data dir, starting Raft).
    StartingControl,
    /// The control plane runs; the pipeline is starting.
    StartingPipeline,
    /// Both run.
    Running,
    /// The node drains and stops.
    Stopping,
}

impl Stage {
    /// One line for `/health` and `/ready`.
    fn describe(self) -> &'static str {
        match self {
            Self::StartingControl => "starting: control plane",
            Self::StartingPipeline => "starting: pipeline",
            Self::Running => "ok",
            Self::Stopping => "stopping",
        }
    }
}
