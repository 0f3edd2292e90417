//! The task supervisor: the long-running tasks beside the data path, each a [`LoopActor`]
//! child of this actor (which is itself a child of the root, beside the coordinator):
//!
//! * per node: the writer identity follower and the coordinator's liveness watchdog;
//! * per flow: discovery, the metadata sync, the consumer-group sync (flows that sync groups)
//!   and the heartbeats (flows with heartbeats on).
//!
//! A task that ends while it should run (it panicked, or its loop returned) is started again
//! after a backoff, from the same shared state (its meters, its sync's records), as the flow
//! actor restarts a pair. One that dies more than [`MAX_RESTARTS`] times within
//! [`RESTART_WINDOW`] is not started again: this actor fails, and the root then stops the
//! pipeline (see `supervisor`). Every end is logged, counted in the task's [`TaskStats`]
//! (`task_restarts_total`, `/health`), and never silent.
//!
//! Tasks stop in two stages at shutdown ([`Stage`]): the per-flow tasks and the watchdog before
//! the drain, the identity follower after it (the writers' final sends need its connections).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::child::{AbortOnDrop, Alive, ChildEnd, ChildRestarts};
use super::loop_actor::{ActorLoop, Child, LoopActor, LoopActorArgs};
use crate::backoff::{MAX_RESTARTS, RESTART_WINDOW};
use crate::params::BackoffParams;

/// Which long-running task (the `task` label of `task_restarts_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskKind {
    /// Follows this node's writer identity (one per node).
    IdentityFollower,
    /// Checks that the coordinator handles its mailbox (one per node, see `crate::liveness`).
    Watchdog,
    /// Finds the flow's partitions upstream (one per flow).
    Discovery,
    /// Syncs the flow's users and topic settings (one per flow).
    MetadataSync,
    /// Syncs the flow's consumer-group offsets (flows with `consumer_groups`).
    GroupSync,
    /// Writes the flow's heartbeats (flows with heartbeats on).
    Heartbeats,
}

impl TaskKind {
    /// Every kind, in the order the tree lists them.
    pub const ALL: [Self; 6] = [
        Self::IdentityFollower,
        Self::Watchdog,
        Self::Discovery,
        Self::MetadataSync,
        Self::GroupSync,
        Self::Heartbeats,
    ];

    /// The name in metrics, logs and `/health`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::IdentityFollower => "identity_follower",
            Self::Watchdog => "watchdog",
            Self::Discovery => "discovery",
            Self::MetadataSync => "metadata_sync",
            Self::GroupSync => "group_sync",
            Self::Heartbeats => "heartbeats",
        }
    }
}

impl std::fmt::Display for TaskKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// When a task stops at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Before the drain: nothing new is discovered, synced or heartbeaten while units stop.
    BeforeDrain,
    /// After the drain: the writers' final sends use what it maintains.
    AfterDrain,
}

/// Starts one run of a task: its loop, which returns once the token is cancelled. Called again
/// for every restart.
pub(crate) type StartTask =
    Arc<dyn Fn(CancellationToken) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One long-running task as its supervisor knows it.
pub(crate) struct TaskSpec {
    pub(crate) kind: TaskKind,
    /// Its flow; `None` for a task of the node.
    pub(crate) flow: Option<String>,
    pub(crate) stage: Stage,
    pub(crate) start: StartTask,
}

/// How one long-running task has fared since the pipeline started (`/health`,
/// `task_restarts_total`, `task_panics_total`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStats {
    /// Which task.
    pub task: TaskKind,
    /// Its flow; `None` for a task of the node.
    pub flow: Option<String>,
    /// Times it ended while it should have run (and was started again, or given up on).
    pub restarts: u64,
    /// How many of those ends were panics.
    pub panics: u64,
    /// How it last ended unexpectedly, and how long ago.
    pub last_failure: Option<(String, Duration)>,
    /// Whether it runs now (false while it waits for its restart, and once stopped).
    pub running: bool,
}

/// The shared meters of one task, and the trigger of a test's injected panic.
#[derive(Default)]
struct TaskMeter {
    restarts: AtomicU64,
    panics: AtomicU64,
    running: AtomicBool,
    last_failure: Mutex<Option<(String, Instant)>>,
    inject_panic: Notify,
}

/// The meters of every task of a pipeline, in the order of its specs: a cheap handle for the
/// readers outside the tree.
#[derive(Clone, Default)]
pub(crate) struct TaskRegistry(Arc<Vec<RegisteredTask>>);

/// A task's kind, its flow (`None`: the node's) and its meters.
type RegisteredTask = (TaskKind, Option<String>, Arc<TaskMeter>);

impl TaskRegistry {
    /// Meters for `specs`, in their order.
    pub(crate) fn new(specs: &[TaskSpec]) -> Self {
        Self(Arc::new(
            specs
                .iter()
                .map(|s| (s.kind, s.flow.clone(), Arc::default()))
                .collect(),
        ))
    }

    /// Every task's stats, in spec order.
    pub(crate) fn snapshot(&self, now: Instant) -> Vec<TaskStats> {
        self.0
            .iter()
            .map(|(kind, flow, m)| TaskStats {
                task: *kind,
                flow: flow.clone(),
                restarts: m.restarts.load(Ordering::Relaxed),
                panics: m.panics.load(Ordering::Relaxed),
                last_failure: m
                    .last_failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_ref()
                    .map(|(how, at)| (how.clone(), now.saturating_duration_since(*at))),
                running: m.running.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Makes the running task `kind` (of `flow`) panic, as a bug in it would; false if there
    /// is no such task. For tests of the supervision.
    pub(crate) fn inject_panic(&self, kind: TaskKind, flow: Option<&str>) -> bool {
        let found = self
            .0
            .iter()
            .find(|(k, f, _)| *k == kind && f.as_deref() == flow);
        if let Some((_, _, meter)) = found {
            meter.inject_panic.notify_one();
        }
        found.is_some()
    }

    fn meter(&self, index: usize) -> Option<&Arc<TaskMeter>> {
        self.0.get(index).map(|(_, _, m)| m)
    }
}

/// The task supervisor actor (all state lives in [`TasksState`]).
pub(crate) struct Tasks;

/// What the task supervisor starts with.
pub(crate) struct TasksArgs {
    pub(crate) node_id: replicator_model::NodeId,
    pub(crate) specs: Vec<TaskSpec>,
    /// Built from `specs` (same order).
    pub(crate) registry: TaskRegistry,
    pub(crate) backoff: BackoffParams,
    /// Cloned into every task (see [`Alive`]).
    pub(crate) alive: Alive,
}

/// Messages of the task supervisor.
pub(crate) enum TasksMsg {
    /// From a backoff timer: start task `index` again. No reply.
    RestartDue(usize),
    /// From `Pipeline`'s shutdown: stop the tasks of a stage; replies once none of them runs.
    Stop(Stage, RpcReplyPort<()>),
}

/// One task under the supervisor.
struct TaskChild {
    /// The running actor; `None` while its restart waits, and once stopped.
    actor: Option<(ActorId, Child)>,
    restarts: ChildRestarts,
    /// The restart timer while waiting (dropping it cancels the restart).
    timer: Option<AbortOnDrop<Result<(), MessagingErr<TasksMsg>>>>,
}

/// Runtime state of the task supervisor.
pub(crate) struct TasksState {
    args: TasksArgs,
    children: Vec<TaskChild>,
    /// Cancelled to stop the tasks of each stage (`BeforeDrain`, `AfterDrain`).
    stops: [CancellationToken; 2],
    /// Stop requests waiting for their stage's last task to end.
    waiting: Vec<(Stage, RpcReplyPort<()>)>,
}

impl TasksState {
    fn stop_token(&self, stage: Stage) -> &CancellationToken {
        &self.stops[stage as usize]
    }

    /// Answers the stop requests whose stage has no task running any more.
    fn answer_stops(&mut self) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(stage, _)| {
                self.args
                    .specs
                    .iter()
                    .zip(&self.children)
                    .all(|(spec, child)| spec.stage != *stage || child.actor.is_none())
            });
        self.waiting = waiting;
        for (_, reply) in done {
            let _ = reply.send(());
        }
    }
}

impl Actor for Tasks {
    type Msg = TasksMsg;
    type State = TasksState;
    type Arguments = TasksArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let children = (0..args.specs.len())
            .map(|i| TaskChild {
                actor: None,
                restarts: ChildRestarts::new(args.backoff, args.node_id ^ (i as u64) << 40),
                timer: None,
            })
            .collect();
        let mut state = TasksState {
            args,
            children,
            stops: [CancellationToken::new(), CancellationToken::new()],
            waiting: Vec::new(),
        };
        for index in 0..state.children.len() {
            start_task(&myself, &mut state, index).await?;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TasksMsg::RestartDue(index) => {
                let Some(spec) = state.args.specs.get(index) else {
                    return Ok(());
                };
                let due = state.children[index].timer.take().is_some();
                if due && !state.stop_token(spec.stage).is_cancelled() {
                    start_task(&myself, state, index).await?;
                }
            }
            TasksMsg::Stop(stage, reply) => {
                state.stop_token(stage).cancel();
                for (spec, child) in state.args.specs.iter().zip(&mut state.children) {
                    if spec.stage == stage {
                        child.timer = None;
                    }
                }
                state.waiting.push((stage, reply));
                state.answer_stops();
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((id, end)) = ChildEnd::of(event) else {
            return Ok(());
        };
        let Some(index) = state
            .children
            .iter()
            .position(|c| c.actor.as_ref().is_some_and(|(a, _)| *a == id))
        else {
            return Ok(());
        };
        let spec = &state.args.specs[index];
        let child = &mut state.children[index];
        child.actor = None;
        let meter = state
            .args
            .registry
            .meter(index)
            .cloned()
            .unwrap_or_default();
        meter.running.store(false, Ordering::Relaxed);
        let stopping = state.stops[spec.stage as usize].is_cancelled();
        if stopping {
            state.answer_stops();
            return Ok(());
        }
        let (kind, flow) = (spec.kind, spec.flow.clone().unwrap_or_default());
        meter.restarts.fetch_add(1, Ordering::Relaxed);
        if matches!(end, ChildEnd::Panicked) {
            meter.panics.fetch_add(1, Ordering::Relaxed);
        }
        *meter
            .last_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((end.to_string(), Instant::now()));
        let Some(delay) = child.restarts.after_end(Instant::now()) else {
            tracing::error!(
                node = state.args.node_id, task = %kind, flow, outcome = %end,
                restarts = MAX_RESTARTS, window = ?RESTART_WINDOW,
                "long-running task keeps dying; not restarted again (the pipeline stops)"
            );
            return Err(format!("the {kind} task of flow {flow:?} keeps dying").into());
        };
        tracing::error!(
            node = state.args.node_id, task = %kind, flow, outcome = %end, backoff = ?delay,
            "long-running task ended unexpectedly; restarting it after backoff"
        );
        let timer = myself.send_after(delay, move || TasksMsg::RestartDue(index));
        child.timer = Some(AbortOnDrop(timer));
        Ok(())
    }
}

/// Starts task `index` as a loop actor linked to the supervisor.
async fn start_task(
    myself: &ActorRef<TasksMsg>,
    state: &mut TasksState,
    index: usize,
) -> Result<(), ActorProcessingErr> {
    let spec = &state.args.specs[index];
    let Some(meter) = state.args.registry.meter(index).cloned() else {
        return Ok(());
    };
    let stop = state.stop_token(spec.stage).child_token();
    let kind = spec.kind;
    let run = (spec.start)(stop.clone());
    let work: ActorLoop = Box::pin(async move {
        let injected = meter.inject_panic.notified();
        tokio::select! {
            () = run => {}
            () = injected => panic!("a panic injected into the {kind} task by a test"),
        }
        if stop.is_cancelled() {
            Ok("stopped")
        } else {
            Err(crate::error::Error::Actor {
                name: kind.name().to_owned(),
                reason: "its loop returned while it should run".to_owned(),
            })
        }
    });
    let span = tracing::info_span!(
        parent: None,
        "task",
        node = %state.args.node_id,
        task = %kind,
        flow = spec.flow.as_deref().unwrap_or(""),
    );
    let args = LoopActorArgs {
        span,
        alive: state.args.alive.clone(),
        work,
    };
    let (actor, _) = Actor::spawn_linked(None, LoopActor, args, myself.get_cell()).await?;
    if let Some(meter) = state.args.registry.meter(index) {
        meter.running.store(true, Ordering::Relaxed);
    }
    let child = &mut state.children[index];
    child.actor = Some((actor.get_id(), Child(actor)));
    child.restarts.started(Instant::now());
    Ok(())
}
