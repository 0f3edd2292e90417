//! The supervision tree of one instance (drawn in ARCHITECTURE.md, "Concurrency", and checked
//! against the running tree by an e2e test): the root `Supervisor` (`supervisor.rs`) over this
//! file's `Coordinator` and the task supervisor `Tasks` (`tasks.rs`); under the coordinator one
//! `Flow` actor per flow (`flow.rs`), under which each unit's reader and writer run as
//! `LoopActor`s (`loop_actor.rs`, paired in `pair.rs`); under `Tasks` the long-running tasks,
//! also `LoopActor`s.
//!
//! Every child is spawned linked (`spawn_linked`): how it ended reaches its parent as a
//! ractor supervision event, and the parent decides what follows. A reader or writer that
//! ended by itself is restarted with its pair after a backoff (`decide`); a flow actor that
//! failed is restarted by the coordinator after a backoff, and picks its units up again from
//! the assignments (its pairs died with it, as in a crash: writers resume from the target's
//! tail); a failed coordinator is restarted by the supervisor. Each parent counts a child's
//! restarts (`ChildRestarts`) and escalates when it keeps dying. When an actor dies, ractor
//! kills everything under it.
//!
//! The coordinator follows the assignments and splits them by flow, for the flow actors and
//! for the flows' other tasks ([`FlowAssignments`]); it also carries the
//! drain of `Pipeline::shutdown` to every flow actor and the recreated topics discovery
//! reports. Its mailbox is the one the liveness watchdog checks (`crate::liveness`). No
//! handler in the tree waits on the network: pairs run their loops as tasks of their own
//! (see `pair`), hand-backs run as release tasks (see `release`), and what to do with a unit is
//! decided by pure functions (`decide`, `release`). What every actor and task of the tree shares
//! is in `child`, below all of them; [`draw_tree`] (`tree`) is above them all.

mod child;
mod decide;
mod flow;
mod loop_actor;
mod pair;
mod release;
mod supervisor;
mod tasks;
mod tree;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort, SupervisionEvent,
};
use replicator_model::{Assignment, NodeId};
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use self::child::{AbortOnDrop, Alive, ChildEnd, ChildRestarts};
use self::flow::{Flow, FlowArgs, FlowMsg};
pub(crate) use self::supervisor::{CoordinatorHandle, Supervisor, SupervisorArgs, SupervisorMsg};
pub(crate) use self::tasks::{Stage, TaskRegistry, TaskSpec, TasksArgs, TasksMsg};
pub use self::tasks::{TaskKind, TaskStats};
pub(crate) use self::tree::draw_tree;
use crate::backoff::{MAX_RESTARTS, RESTART_WINDOW};
use crate::clients::Cluster;
use crate::control::ControlPlane;
use crate::datapath::target::TargetDoor;
use crate::datapath::unit::UnitTuning;
use crate::liveness::Liveness;
use crate::params::FlowParams;
use crate::stats::MeterRegistry;

/// This node's assignments split by flow, as the coordinator (their one consumer) publishes
/// them: what every per-flow task (throttle, heartbeats, consumer-group sync, metadata sync)
/// reads to know which of the flow's units this node owns, instead of each interpreting the
/// control plane's whole list. (A writer's check before each send asks the control plane
/// itself: that check must see a revoke as soon as it is applied.)
#[derive(Clone)]
pub(crate) struct FlowAssignments(Arc<BTreeMap<String, watch::Sender<Arc<Vec<Assignment>>>>>);

impl FlowAssignments {
    /// Empty views of `flows`, until the coordinator publishes.
    pub(crate) fn new<'a>(flows: impl IntoIterator<Item = &'a str>) -> Self {
        let views = flows
            .into_iter()
            .map(|f| (f.to_owned(), watch::channel(Arc::default()).0))
            .collect();
        Self(Arc::new(views))
    }

    /// The assignments of `flow` on this node, as they change (none, ever, for a flow the
    /// node does not run).
    pub(crate) fn subscribe(&self, flow: &str) -> watch::Receiver<Arc<Vec<Assignment>>> {
        self.0.get(flow).map_or_else(
            || watch::channel(Arc::default()).1,
            watch::Sender::subscribe,
        )
    }

    /// Publishes the assignments of `flow` (shared, not copied); its readers wake only if
    /// they changed.
    fn publish(&self, flow: &str, units: &Arc<Vec<Assignment>>) {
        if let Some(view) = self.0.get(flow) {
            view.send_if_modified(|current| {
                let changed = **current != **units;
                if changed {
                    *current = units.clone();
                }
                changed
            });
        }
    }
}

/// The coordinator actor (all state lives in [`CoordinatorState`]).
pub(crate) struct Coordinator<C>(PhantomData<fn() -> C>);

impl<C> Coordinator<C> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

/// Messages of the coordinator.
pub(crate) enum CoordinatorMsg {
    /// From the coordinator's assignment watcher: this node's current assignments. No reply.
    Assignments(Vec<Assignment>),
    /// From discovery: the upstream topic was deleted and recreated; restart its running units
    /// (they resume from the initial offset). No reply.
    TopicRecreated {
        flow: String,
        stream: String,
        topic: String,
    },
    /// From `Pipeline::shutdown`: stop every unit cleanly (final commit, then release); replies
    /// when every flow actor drained. Units of the flows in the set (a config reload keeps
    /// them) stop after their final commit without a release: the node keeps them, and the
    /// next pipeline starts them again under the same epoch.
    Drain(BTreeSet<String>, RpcReplyPort<()>),
    /// From a backoff timer of the coordinator: start the flow actor of `flow` again (it
    /// failed). No reply.
    FlowRestartDue { flow: String },
    /// From the pipeline's watchdog: proves the mailbox is being handled. No reply.
    Heartbeat,
}

/// Everything the coordinator needs to start its flow actors (kept by the supervisor, which
/// starts a new coordinator with the same).
#[derive(Clone)]
pub(crate) struct CoordinatorArgs<C> {
    pub(crate) node_id: NodeId,
    pub(crate) control: C,
    /// Flows by name.
    pub(crate) flows: BTreeMap<String, Arc<FlowParams>>,
    /// Clusters by alias.
    pub(crate) clusters: BTreeMap<String, Arc<Cluster>>,
    /// The connections writers send with (per target: the node's writer identity when fenced).
    pub(crate) writers: Arc<crate::fencing::identity::WriterTargets>,
    pub(crate) tuning: UnitTuning,
    /// Where the meters of every started unit are registered (shared with `Pipeline::stats`).
    pub(crate) meters: MeterRegistry,
    /// Cloned into every task the tree starts (see [`Alive`]).
    pub(crate) alive: Alive,
    /// Marked on every heartbeat handled (see [`crate::liveness`]).
    pub(crate) liveness: Arc<Liveness>,
    /// The writers' offset maps (read by the consumer-group sync).
    pub(crate) offset_maps: crate::datapath::offset_maps::OffsetMaps,
    /// The door to each flow's target, by flow name.
    pub(crate) doors: BTreeMap<String, Arc<TargetDoor<C>>>,
    /// Each flow's residency, by flow name: no pair starts for a topic it blocks.
    pub(crate) residency: BTreeMap<String, Arc<crate::selection::residency::Residency>>,
    /// Where the coordinator publishes each flow's assignments.
    pub(crate) flow_assignments: FlowAssignments,
}

/// One flow's actor as the coordinator supervises it.
struct FlowChild {
    /// The running actor; `None` while its restart waits for the timer.
    actor: Option<ActorRef<FlowMsg>>,
    /// Its restarts: a flow actor that keeps dying fails the coordinator (escalates).
    restarts: ChildRestarts,
    /// The restart timer while waiting (dropping it cancels the restart).
    restart_timer: Option<AbortOnDrop<Result<(), MessagingErr<CoordinatorMsg>>>>,
}

/// Runtime state of the coordinator.
pub(crate) struct CoordinatorState<C> {
    args: CoordinatorArgs<C>,
    /// The flow actors, by flow name.
    flows: BTreeMap<String, FlowChild>,
    /// Flow names by actor id, for supervision events.
    by_id: HashMap<ActorId, String>,
    /// Latest assignments of this node, by flow (every flow present, maybe with none), as
    /// handed to the flow actors and published.
    desired: BTreeMap<String, Arc<Vec<Assignment>>>,
    /// Whether `Pipeline::shutdown` asked for a drain (no flow actor restarts then).
    draining: bool,
    /// Waits for every flow actor's drain, then answers the drain.
    _drain: Option<AbortOnDrop<()>>,
    /// Forwards assignment changes into the mailbox (held for its drop, which ends it).
    _watcher: AbortOnDrop<()>,
    /// Flows already warned about as unknown.
    warned_flows: BTreeSet<String>,
    /// Counter mixed into jitter seeds.
    seeds: u64,
    /// The coordinator's span (node).
    span: tracing::Span,
}

impl<C: ControlPlane> Actor for Coordinator<C> {
    type Msg = CoordinatorMsg;
    type State = CoordinatorState<C>;
    type Arguments = CoordinatorArgs<C>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let span = tracing::info_span!("coordinator", node = %args.node_id);
        let mut rx = args.control.assignments();
        // A unit granted before this node's writer identity arrived waits for it: a swap of
        // the writers' connections re-sends the assignments, which starts it.
        let mut writers = args.writers.subscribe();
        let me = myself.clone();
        let watcher = tokio::spawn(
            async move {
                loop {
                    let current = rx.borrow_and_update().clone();
                    writers.borrow_and_update();
                    if me
                        .send_message(CoordinatorMsg::Assignments(current))
                        .is_err()
                    {
                        return;
                    }
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { return },
                        changed = writers.changed() => if changed.is_err() { return },
                    }
                }
            }
            .instrument(span.clone()),
        );
        let mut state = CoordinatorState {
            seeds: args.node_id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            desired: args
                .flows
                .keys()
                .map(|f| (f.clone(), Arc::default()))
                .collect(),
            args,
            flows: BTreeMap::new(),
            by_id: HashMap::new(),
            draining: false,
            _drain: None,
            _watcher: AbortOnDrop(watcher),
            warned_flows: BTreeSet::new(),
            span,
        };
        let names: Vec<String> = state.args.flows.keys().cloned().collect();
        for name in names {
            spawn_flow(&myself, &mut state, &name).await?;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        dispatch(&myself, state, msg).instrument(span).await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((id, failure)) = ChildEnd::of(event) else {
            return Ok(());
        };
        let Some(name) = state.by_id.remove(&id) else {
            return Ok(());
        };
        let span = state.span.clone();
        let _entered = span.enter();
        let Some(child) = state.flows.get_mut(&name) else {
            return Ok(());
        };
        child.actor = None;
        if state.draining {
            // Its drain reply went with it; the drain goes on without it.
            tracing::warn!(flow = %name, outcome = %failure, "flow actor ended while draining");
            return Ok(());
        }
        let Some(delay) = child.restarts.after_end(Instant::now()) else {
            tracing::error!(
                flow = %name, outcome = %failure, restarts = MAX_RESTARTS,
                window = ?RESTART_WINDOW,
                "flow actor keeps dying; failing the coordinator (escalating)"
            );
            return Err(format!("the flow actor of {name} keeps dying").into());
        };
        tracing::error!(
            flow = %name, outcome = %failure, backoff = ?delay,
            "flow actor ended unexpectedly (its units stopped with it); restarting it after backoff"
        );
        let flow = name.clone();
        let timer = myself.send_after(delay, move || CoordinatorMsg::FlowRestartDue { flow });
        child.restart_timer = Some(AbortOnDrop(timer));
        Ok(())
    }
}

/// Handles one message; never waits on the network (see the module doc). Fails only when a
/// flow actor cannot be spawned (the runtime is going away): the supervisor then decides.
async fn dispatch<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    msg: CoordinatorMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        CoordinatorMsg::Heartbeat => state.args.liveness.answered(),
        CoordinatorMsg::Assignments(list) => {
            let mut by_flow: BTreeMap<String, Vec<Assignment>> = state
                .args
                .flows
                .keys()
                .map(|f| (f.clone(), Vec::new()))
                .collect();
            for a in list {
                match by_flow.get_mut(&a.unit.flow) {
                    Some(units) => units.push(a),
                    None => {
                        if state.warned_flows.insert(a.unit.flow.clone()) {
                            tracing::warn!(
                                flow = %a.unit.flow,
                                "assigned a unit of a flow this node does not run"
                            );
                        }
                    }
                }
            }
            for (name, units) in by_flow {
                let units = Arc::new(units);
                state.args.flow_assignments.publish(&name, &units);
                if let Some(actor) = state.flows.get(&name).and_then(|c| c.actor.as_ref()) {
                    // A flow actor that is gone restarts with the latest assignments.
                    let _ = actor.send_message(FlowMsg::Assignments(units.clone()));
                }
                state.desired.insert(name, units);
            }
        }
        CoordinatorMsg::TopicRecreated {
            flow,
            stream,
            topic,
        } => {
            if let Some(actor) = state.flows.get(&flow).and_then(|c| c.actor.as_ref()) {
                let _ = actor.send_message(FlowMsg::TopicRecreated { stream, topic });
            }
        }
        CoordinatorMsg::Drain(keep, reply) => {
            state.draining = true;
            let mut drained = Vec::new();
            for (name, child) in &mut state.flows {
                // A restart still waiting is cancelled: nothing of that flow runs.
                child.restart_timer = None;
                if let Some(actor) = &child.actor {
                    let (tx, rx) = oneshot::channel();
                    let drain = FlowMsg::Drain {
                        keep: keep.contains(name),
                        reply: tx.into(),
                    };
                    if actor.send_message(drain).is_ok() {
                        drained.push(rx);
                    }
                }
            }
            // A flow actor that dies while draining drops its reply: it is done too.
            let task = tokio::spawn(async move {
                for rx in drained {
                    let _ = rx.await;
                }
                let _ = reply.send(());
            });
            state._drain = Some(AbortOnDrop(task));
        }
        CoordinatorMsg::FlowRestartDue { flow } => {
            let waiting = state
                .flows
                .get(&flow)
                .is_some_and(|c| c.actor.is_none() && c.restart_timer.is_some());
            if waiting && !state.draining {
                spawn_flow(myself, state, &flow).await?;
            }
        }
    }
    Ok(())
}

/// Starts the actor of flow `name`, linked to the coordinator, and hands it the flow's
/// latest assignments.
async fn spawn_flow<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    name: &str,
) -> Result<(), ActorProcessingErr> {
    let Some(flow) = state.args.flows.get(name).cloned() else {
        return Ok(());
    };
    // `Pipeline::start` checked every flow's clusters; params built otherwise run nothing.
    let (Some(source), Some(door)) = (
        state.args.clusters.get(&flow.source).cloned(),
        state.args.doors.get(name).cloned(),
    ) else {
        tracing::error!(flow = %name, source = %flow.source, "flow of an unknown cluster");
        return Ok(());
    };
    state.seeds = state.seeds.wrapping_add(0x1000_0000);
    let args = &state.args;
    let flow_args = FlowArgs {
        node_id: args.node_id,
        control: args.control.clone(),
        source,
        door,
        tuning: args.tuning.clone(),
        meters: args.meters.clone(),
        alive: args.alive.clone(),
        offset_maps: args.offset_maps.clone(),
        residency: args.residency.get(name).cloned(),
        seed: state.seeds,
        flow,
    };
    let (actor, _) = Actor::spawn_linked(None, Flow::new(), flow_args, myself.get_cell()).await?;
    state.by_id.insert(actor.get_id(), name.to_owned());
    if let Some(units) = state.desired.get(name) {
        let _ = actor.send_message(FlowMsg::Assignments(units.clone()));
    }
    let restarts = ChildRestarts::new(state.args.tuning.backoff, state.seeds);
    let child = state.flows.entry(name.to_owned()).or_insert(FlowChild {
        actor: None,
        restarts,
        restart_timer: None,
    });
    child.actor = Some(actor);
    child.restarts.started(Instant::now());
    child.restart_timer = None;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use replicator_model::{Epoch, WorkUnit};

    /// An assignment of unit `f/s/t/0` under `epoch`, for the decision tests.
    pub(super) fn assignment(epoch: u64, release_requested: bool) -> Assignment {
        Assignment {
            unit: WorkUnit::new("f", "s", "t", 0),
            epoch: Epoch(epoch),
            release_requested,
        }
    }
}
