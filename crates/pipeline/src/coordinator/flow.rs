//! The actor of one flow: runs a reader actor and a writer actor per unit of the flow this
//! node is assigned, stops them cleanly when the unit is revoked or released, and restarts a
//! pair that ended by itself with bounded exponential backoff plus jitter.
//!
//! It supervises the pairs' actors (`spawn_linked`, see `pair`): how each ended reaches it as
//! a supervision event. Its mailbox carries its flow's assignments and recreated topics (from
//! the coordinator), its own timers, and the ends of its release tasks. Its handlers never
//! wait on the network: a unit is handed back by a release task of its own, at most one per
//! unit, which reports as [`FlowMsg::Released`] (see `release`). What to do with a unit is
//! decided by pure functions (`decide`, and `release` for hand-backs).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort, SupervisionEvent,
};
use replicator_model::{Assignment, Epoch, NodeId, WorkUnit};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::child::{unit_span, AbortOnDrop, Alive, ChildEnd, UnitTaskKind};
use super::decide::{after_pair_gone, decide, Action, AfterPair, Ended, PhaseKind};
use super::loop_actor::{Child, LoopActor, LoopActorArgs};
use super::pair::{Pair, Role};
use super::release::{keep_release, plan_release, release_finished, retry_release};
use super::release::{ReleaseFollowUp, ReleasePlan, ReleaseState, RetryPlan};
use crate::backoff::{Backoff, RestartBudget, MAX_RESTARTS, RESTART_WINDOW};
use crate::clients::Cluster;
use crate::control::{ControlError, ControlPlane};
use crate::datapath::reader::{self, ReaderArgs};
use crate::datapath::target::TargetDoor;
use crate::datapath::unit::{UnitShared, UnitTuning};
use crate::datapath::writer::{self, WriterArgs};
use crate::fencing::handover::Handover;
use crate::params::FlowParams;
use crate::selection::mapping::downstream_stream;
use crate::stats::{MeterRegistry, UnitMeters};

/// The actor of one flow (all state lives in [`FlowState`]).
pub(super) struct Flow<C>(std::marker::PhantomData<fn() -> C>);

impl<C> Flow<C> {
    pub(super) fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// Messages of a flow actor.
pub(crate) enum FlowMsg {
    /// From the coordinator: this node's current assignments of the flow's units (shared
    /// with the flow's published view). No reply.
    Assignments(Arc<Vec<Assignment>>),
    /// From a backoff timer of the flow actor: restart the unit's pair if still assigned under
    /// `epoch`. No reply.
    RestartDue {
        unit: WorkUnit,
        /// The epoch the ended pair ran under.
        epoch: Epoch,
    },
    /// From the coordinator (told by discovery): the upstream topic was deleted and
    /// recreated; restart its running units (they resume from the initial offset). No reply.
    TopicRecreated { stream: String, topic: String },
    /// From the coordinator: stop every unit cleanly (final commit), then hand it back unless
    /// `keep` (a config reload keeps the flow: its units stay this node's, and the next
    /// pipeline starts them again under the same epoch). Replies when every unit is stopped
    /// and every release was attempted.
    Drain { keep: bool, reply: RpcReplyPort<()> },
    /// From a release task of the flow actor: handing `unit` back under `epoch` finished with
    /// `result`. No reply.
    Released {
        unit: WorkUnit,
        epoch: Epoch,
        result: Result<(), ControlError>,
    },
    /// From a retry timer of the flow actor: try the failed release of `unit` under `epoch`
    /// again if the leader still asks for it. No reply.
    ReleaseRetryDue { unit: WorkUnit, epoch: Epoch },
    /// From the flow actor's timer: the earlier writers' sends have landed, units may be taken
    /// up and handed back (see `fencing::handover`). No reply.
    HandoverDue,
}

/// Everything a flow actor needs to start pairs (built by the coordinator for each flow).
pub(super) struct FlowArgs<C> {
    pub(super) node_id: NodeId,
    pub(super) control: C,
    pub(super) flow: Arc<FlowParams>,
    /// The flow's source cluster.
    pub(super) source: Arc<Cluster>,
    pub(super) tuning: UnitTuning,
    /// Where the meters of every started unit are registered (shared with `Pipeline::stats`).
    pub(super) meters: MeterRegistry,
    /// Cloned into every task the flow actor starts (see [`Alive`]).
    pub(super) alive: Alive,
    /// The writers' offset maps (read by the consumer-group sync).
    pub(super) offset_maps: crate::datapath::offset_maps::OffsetMaps,
    /// The door to the flow's target (its connection, throttle, lease and epoch checks).
    pub(super) door: Arc<TargetDoor<C>>,
    /// The flow's residency: no pair starts for a topic it blocks.
    pub(super) residency: Option<Arc<crate::selection::residency::Residency>>,
    /// Seed of the flow's jitter (differs per node and flow, and per restart of the actor).
    pub(super) seed: u64,
}

/// What runs for a unit this node works on.
enum Phase {
    /// The pair runs, or stops once asked (see [`Pair::ending`]).
    Running(Pair),
    /// The pair ended by itself and restarts when the timer fires.
    Waiting {
        /// Held for its drop: dropping the run (a cancelled restart) aborts the timer.
        _timer: AbortOnDrop<Result<(), MessagingErr<FlowMsg>>>,
    },
}

/// A unit this node is working on.
struct UnitRun {
    /// Epoch of the pair.
    epoch: Epoch,
    phase: Phase,
    /// Restart backoff (kept across restarts of the same epoch).
    backoff: Backoff,
    /// The pair's recent panics (kept across restarts of the same epoch): a unit whose pair
    /// keeps panicking fails this flow actor instead of restarting for ever (a bug, not an
    /// outage: pairs that end on errors restart as long as the unit is assigned).
    panics: RestartBudget,
    /// When the current pair started (a pair that ran long enough resets the backoff).
    started: Instant,
}

impl UnitRun {
    /// The phase without its handles, for [`decide()`].
    fn kind(&self) -> PhaseKind {
        match &self.phase {
            Phase::Running(pair) if pair.ending == Ended::ByItself => PhaseKind::Running,
            Phase::Running(_) => PhaseKind::Stopping,
            Phase::Waiting { .. } => PhaseKind::Waiting,
        }
    }
}

/// Whether the coordinator asked the flow actor to drain.
pub(super) enum Drain {
    /// Not asked: pairs follow the assignments.
    Off,
    /// Draining: nothing starts, everything stops (and is released unless kept); the reply
    /// goes out once no pair runs and no release is in flight.
    Pending(RpcReplyPort<()>),
    /// Draining, and the reply went out.
    Done,
}

impl Drain {
    pub(super) fn is_on(&self) -> bool {
        !matches!(self, Drain::Off)
    }

    /// Sends the reply if it is still due.
    fn answer(&mut self) {
        match std::mem::replace(self, Drain::Done) {
            Drain::Pending(reply) => {
                let _ = reply.send(());
            }
            other => *self = other,
        }
    }
}

/// Which pair and role a reader or writer actor is, by actor id.
struct PairActor {
    unit: WorkUnit,
    pair: u64,
    role: Role,
}

/// Runtime state of a flow actor.
pub(super) struct FlowState<C> {
    pub(super) args: FlowArgs<C>,
    /// Latest assignments of this node in the flow, by unit.
    desired: BTreeMap<WorkUnit, Assignment>,
    /// Units being worked on.
    runs: BTreeMap<WorkUnit, UnitRun>,
    /// The pairs' actors, by id.
    pair_actors: HashMap<ActorId, PairActor>,
    /// Hand-backs in flight, done (until the assignments catch up) or waiting for a retry.
    pub(super) releases: BTreeMap<WorkUnit, Handback>,
    pub(super) drain: Drain,
    /// Whether the drain keeps the flow's units (stops them without handing back).
    keep: bool,
    /// Parent of every pair's stop token; cancelled when the flow actor stops.
    units: CancellationToken,
    /// Counter mixed into jitter seeds.
    pub(super) seeds: u64,
    /// The last pair id handed out.
    pairs: u64,
    /// The flow actor's span (node, flow).
    span: tracing::Span,
    /// The timer of [`FlowMsg::HandoverDue`], while units wait for it.
    handover_due: Option<AbortOnDrop<Result<(), MessagingErr<FlowMsg>>>>,
}

impl<C: ControlPlane> Actor for Flow<C> {
    type Msg = FlowMsg;
    type State = FlowState<C>;
    type Arguments = FlowArgs<C>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let span = tracing::info_span!("flow", node = %args.node_id, flow = %args.flow.name);
        Ok(FlowState {
            seeds: args.seed,
            args,
            desired: BTreeMap::new(),
            runs: BTreeMap::new(),
            pair_actors: HashMap::new(),
            releases: BTreeMap::new(),
            drain: Drain::Off,
            keep: false,
            units: CancellationToken::new(),
            pairs: 0,
            span,
            handover_due: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Only after a drain that ran out of time is anything left: aborted, not drained.
        state.units.cancel();
        state.runs.clear();
        state.releases.clear();
        Ok(())
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
        let Some((id, end)) = ChildEnd::of(event) else {
            return Ok(());
        };
        let Some(actor) = state.pair_actors.remove(&id) else {
            return Ok(());
        };
        let span = state.span.clone();
        pair_actor_ended(&myself, state, actor, end)
            .instrument(span)
            .await
    }
}

/// Handles one message; never waits on the network (see the module doc). Fails only when a
/// unit's actor cannot be spawned (the runtime is going away): the coordinator then restarts
/// the flow actor.
async fn dispatch<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    msg: FlowMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        FlowMsg::Assignments(list) => {
            state.desired = list.iter().map(|a| (a.unit.clone(), a.clone())).collect();
            let desired = &state.desired;
            state
                .releases
                .retain(|unit, r| keep_release(r.state, desired.get(unit)));
            reconcile(myself, state).await?;
        }
        FlowMsg::RestartDue { unit, epoch } => {
            let due = state
                .runs
                .get(&unit)
                .is_some_and(|s| s.epoch == epoch && matches!(s.phase, Phase::Waiting { .. }));
            if due {
                let still_assigned = !state.drain.is_on()
                    && state
                        .desired
                        .get(&unit)
                        .is_some_and(|a| a.epoch == epoch && !a.release_requested);
                let carried = state.runs.remove(&unit).map(|s| (s.backoff, s.panics));
                if still_assigned {
                    start_pair(myself, state, &unit, epoch, carried).await?;
                }
                reconcile_units(myself, state, [unit]).await?;
            }
        }
        FlowMsg::TopicRecreated { stream, topic } => {
            for (unit, run) in state.runs.iter_mut() {
                if unit.stream == stream && unit.topic == topic {
                    stop_pair(run, false);
                }
            }
        }
        FlowMsg::Drain { keep, reply } => {
            state.drain = Drain::Pending(reply);
            state.keep = keep;
            // A drain attempts every release once more, also those that failed before.
            state
                .releases
                .retain(|_, r| !matches!(r.state, ReleaseState::Failed { .. }));
            reconcile(myself, state).await?;
        }
        FlowMsg::Released {
            unit,
            epoch,
            result,
        } => {
            released(myself, state, unit, epoch, result);
            finish_drain_if_done(state);
        }
        FlowMsg::HandoverDue => {
            state.handover_due = None;
            reconcile(myself, state).await?;
        }
        FlowMsg::ReleaseRetryDue { unit, epoch } => {
            let current = state.releases.get(&unit).map(|r| r.state);
            let draining = state.drain.is_on();
            match retry_release(current, epoch, state.desired.get(&unit), draining) {
                RetryPlan::Spawn => spawn_release(myself, state, &unit, epoch),
                RetryPlan::Forget => {
                    state.releases.remove(&unit);
                }
                RetryPlan::Nothing => {}
            }
        }
    }
    Ok(())
}

/// Clears an ended reader or writer from its pair and acts once the pair is gone.
async fn pair_actor_ended<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    actor: PairActor,
    end: ChildEnd,
) -> Result<(), ActorProcessingErr> {
    let PairActor {
        unit,
        pair: pair_id,
        role,
    } = actor;
    let unit = &unit;
    let Some(run) = state.runs.get_mut(unit) else {
        return Ok(());
    };
    let Phase::Running(pair) = &mut run.phase else {
        return Ok(());
    };
    if pair.id != pair_id {
        return Ok(());
    }
    match &end {
        ChildEnd::Stopped(reason) => {
            tracing::debug!(%unit, role = ?role, reason, "unit actor ended");
        }
        ChildEnd::Failed(err) => tracing::warn!(
            flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
            partition = unit.partition, epoch = %run.epoch, role = ?role, error = %err,
            "unit actor failed"
        ),
        ChildEnd::Panicked => tracing::error!(
            flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
            partition = unit.partition, epoch = %run.epoch, role = ?role,
            "unit actor panicked"
        ),
    }
    pair.failed |= !matches!(end, ChildEnd::Stopped(_));
    pair.panicked |= matches!(end, ChildEnd::Panicked);
    pair.ended(role);
    if role == Role::Writer {
        // A writer that ended leaves its reader without a consumer: stop it too. A reader
        // that ended closes the channel, so its writer drains, commits and ends by itself.
        pair.stop.cancel();
    }
    if pair.reader.is_some() || pair.writer.is_some() {
        return Ok(());
    }
    let (epoch, ending, failed, panicked) = (run.epoch, pair.ending, pair.failed, pair.panicked);
    let next = after_pair_gone(
        ending,
        epoch,
        state.desired.get(unit),
        state.drain.is_on(),
        run.started.elapsed(),
    );
    match next {
        AfterPair::Remove => {
            state.runs.remove(unit);
            reconcile_units(myself, state, [unit.clone()]).await?;
        }
        AfterPair::Release(epoch) => {
            state.runs.remove(unit);
            request_release(myself, state, unit, epoch);
            reconcile_units(myself, state, [unit.clone()]).await?;
        }
        AfterPair::Restart { reset_backoff } => {
            if panicked && !run.panics.admit(Instant::now()) {
                tracing::error!(
                    flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
                    partition = unit.partition, epoch = %epoch, panics = MAX_RESTARTS,
                    window = ?RESTART_WINDOW,
                    "unit pair keeps panicking; failing the flow actor (escalating)"
                );
                return Err(format!("the pair of unit {unit} keeps panicking").into());
            }
            if reset_backoff {
                run.backoff.reset();
            }
            let delay = run.backoff.next_delay();
            if let Some(m) = state.args.meters.get(unit) {
                m.restarted();
            }
            tracing::warn!(
                flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
                partition = unit.partition, epoch = %epoch, failed, backoff = ?delay,
                "unit pair ended unexpectedly, restarting after backoff"
            );
            let (u, e) = (unit.clone(), epoch);
            let timer = myself.send_after(delay, move || FlowMsg::RestartDue { unit: u, epoch: e });
            run.phase = Phase::Waiting {
                _timer: AbortOnDrop(timer),
            };
        }
    }
    Ok(())
}

/// Answers a pending drain once no pair runs and no release is in flight.
fn finish_drain_if_done<C>(state: &mut FlowState<C>) {
    let releasing = state
        .releases
        .values()
        .any(|r| matches!(r.state, ReleaseState::InFlight { .. }));
    if state.runs.is_empty() && !releasing {
        state.drain.answer();
    }
}

/// Whether a unit this node owns may be taken up or handed back now: not while an earlier
/// writer's sends can still land (`fencing::handover`). When the wait has an end, one timer
/// reconciles the flow then; a wait for an identity ends with its arrival, which the
/// coordinator passes on as new assignments.
pub(super) fn may_take_over<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    unit: &WorkUnit,
) -> bool {
    match state.args.door.handover() {
        Handover::Now => true,
        Handover::After(at) => {
            if state.handover_due.is_none() {
                let delay = at.saturating_duration_since(Instant::now());
                tracing::info!(%unit, wait = ?delay, "units wait until an earlier writer's last sends can have landed");
                let timer = myself.send_after(delay, || FlowMsg::HandoverDue);
                state.handover_due = Some(AbortOnDrop(timer));
            }
            false
        }
        Handover::WithoutIdentity => {
            tracing::debug!(%unit, "no writer identity of this process yet: the unit is neither started nor handed back");
            false
        }
    }
}

/// Whether `epoch` of `unit` is being or has been handed back: no pair starts under it.
fn handing_back<C>(state: &FlowState<C>, unit: &WorkUnit, epoch: Epoch) -> bool {
    state
        .releases
        .get(unit)
        .is_some_and(|r| r.state.covers(epoch))
}

/// Asks a running pair to stop cleanly: the reader stops at once, the writer sends what is
/// queued, makes its final commit and ends.
fn stop_pair(run: &mut UnitRun, release: bool) {
    if let Phase::Running(pair) = &mut run.phase {
        if pair.ending == Ended::ByItself {
            pair.ending = Ended::Stopped { release };
            pair.stop.cancel();
        }
    }
}

/// Brings the running pairs in line with the assignments: after a message that may change any
/// unit's (new assignments, a drain).
async fn reconcile<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
) -> Result<(), ActorProcessingErr> {
    let units: BTreeSet<WorkUnit> = state
        .desired
        .keys()
        .chain(state.runs.keys())
        .cloned()
        .collect();
    reconcile_units(myself, state, units).await
}

/// Brings the pairs of `units` in line with the assignments, and leaves the others as they
/// are: a message about one unit's pair (it ended, its restart is due) reconciles that unit
/// only. Every other unit is where the last [`reconcile`] put it, since nothing else changes
/// what is decided for it; a full pass per pair end made a start, or a restart storm, at tens
/// of thousands of units quadratic (the actor then spent most of a core cloning and
/// comparing unit names).
async fn reconcile_units<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    units: impl IntoIterator<Item = WorkUnit>,
) -> Result<(), ActorProcessingErr> {
    let draining = state.drain.is_on();
    let mut seen = Vec::new();
    for unit in units {
        let view = state.runs.get(&unit).map(|s| (s.epoch, s.kind()));
        // A unit the drain keeps is stopped as if it were no longer ours, and not released.
        let desired = state
            .desired
            .get(&unit)
            .filter(|_| !(draining && state.keep));
        match decide(view, desired, draining) {
            Action::Nothing => {}
            Action::Start(epoch) if handing_back(state, &unit, epoch) => {}
            Action::Start(epoch) => start_pair(myself, state, &unit, epoch, None).await?,
            Action::Stop { release } => {
                if let Some(run) = state.runs.get_mut(&unit) {
                    tracing::info!(%unit, epoch = %run.epoch, release, "stopping unit");
                    stop_pair(run, release);
                }
            }
            Action::Cancel { release } => {
                // Dropping the run aborts its restart timer.
                if let Some(run) = state.runs.remove(&unit) {
                    if release {
                        request_release(myself, state, &unit, run.epoch);
                    }
                }
            }
            Action::Release(epoch) => request_release(myself, state, &unit, epoch),
        }
        seen.push(unit);
    }
    // A new epoch for a unit whose old pair just went away starts on the next pass.
    for unit in seen {
        let startable = state.desired.get(&unit).filter(|a| {
            !draining
                && !a.release_requested
                && !state.runs.contains_key(&a.unit)
                && !handing_back(state, &a.unit, a.epoch)
        });
        if let Some(epoch) = startable.map(|a| a.epoch) {
            start_pair(myself, state, &unit, epoch, None).await?;
        }
    }
    finish_drain_if_done(state);
    Ok(())
}

/// Starts the reader and writer actors of a unit under `epoch`, linked to this flow actor.
/// Fails only when an actor cannot be spawned.
async fn start_pair<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    unit: &WorkUnit,
    epoch: Epoch,
    carried: Option<(Backoff, RestartBudget)>,
) -> Result<(), ActorProcessingErr> {
    if state.runs.contains_key(unit) {
        return Ok(());
    }
    let flow = state.args.flow.clone();
    // A unit of a topic a residency policy keeps from the target (granted before the policy
    // existed; discovery no longer reports it, so it is retired and handed back when asked)
    // never runs. Discovery records and logs the topic.
    let blocked = state
        .args
        .residency
        .as_ref()
        .and_then(|r| r.blocked_by(&unit.stream, &unit.topic));
    if let Some(policy) = blocked {
        tracing::debug!(%unit, policy, "unit of a topic a residency policy blocks: not started");
        return Ok(());
    }
    if !may_take_over(myself, state, unit) {
        return Ok(());
    }
    let Some(target) = state.args.door.connection() else {
        tracing::debug!(%unit, "no writer identity for the target yet: the unit waits");
        return Ok(());
    };
    state.seeds = state.seeds.wrapping_add(1);
    let observer = state.args.tuning.observer.clone();
    let meters = state
        .args
        .meters
        .get_or_insert(unit, || UnitMeters::new(&unit.flow, observer));
    let span = unit_span(UnitTaskKind::Pair, state.args.node_id, unit, epoch);
    let shared = Arc::new(UnitShared {
        unit: unit.clone(),
        epoch,
        downstream_stream: downstream_stream(flow.naming, &flow.source, &unit.stream),
        flow: flow.clone(),
        source: state.args.source.clone(),
        target,
        control: state.args.control.clone(),
        meters,
        tuning: state.args.tuning.clone(),
        seed: state.seeds,
        offset_maps: state.args.offset_maps.clone(),
        door: state.args.door.clone(),
    });
    // The pair's one bounded queue: the reader waits for room, so at most this many batches
    // are read ahead of the writer. Its batches are boxed because a tokio channel allocates
    // room for 32 items up front whatever its bound: 32 pointers per pair at rest instead of
    // 32 batches (1.5 KiB, times every unit of an instance).
    let (tx, rx) = mpsc::channel(flow.max_in_flight_batches);
    let (start_tx, start_rx) = oneshot::channel();
    state.pairs += 1;
    let id = state.pairs;
    let stop = state.units.child_token();
    let (backoff, panics) = carried.unwrap_or_else(|| {
        let backoff = Backoff::new(state.args.tuning.backoff, state.seeds);
        (backoff, RestartBudget::default())
    });
    let writer = LoopActorArgs {
        span: tracing::info_span!(parent: &span, "writer"),
        alive: state.args.alive.clone(),
        work: Box::pin(writer::run(WriterArgs {
            shared: shared.clone(),
            rx,
            start: start_tx,
            stop: stop.clone(),
        })),
    };
    let reader = LoopActorArgs {
        span: tracing::info_span!(parent: &span, "reader"),
        alive: state.args.alive.clone(),
        work: Box::pin(reader::run(ReaderArgs {
            shared,
            tx,
            start: start_rx,
            stop: stop.clone(),
        })),
    };
    let mut pair = Pair {
        id,
        stop,
        reader: None,
        writer: None,
        failed: false,
        panicked: false,
        ending: Ended::ByItself,
    };
    // The writer first: the reader waits for its start offset. A spawn fails only when the
    // runtime goes away; the flow actor then fails, and the coordinator's restart decides.
    for (role, args) in [(Role::Writer, writer), (Role::Reader, reader)] {
        let (actor, _) = Actor::spawn_linked(None, LoopActor, args, myself.get_cell()).await?;
        state.pair_actors.insert(
            actor.get_id(),
            PairActor {
                unit: unit.clone(),
                pair: id,
                role,
            },
        );
        match role {
            Role::Reader => pair.reader = Some(Child(actor)),
            Role::Writer => pair.writer = Some(Child(actor)),
        }
    }
    state.runs.insert(
        unit.clone(),
        UnitRun {
            epoch,
            phase: Phase::Running(pair),
            backoff,
            panics,
            started: Instant::now(),
        },
    );
    tracing::info!(%unit, epoch = %epoch, "unit started");
    Ok(())
}

/// The hand-back of one unit.
pub(super) struct Handback {
    pub(super) state: ReleaseState,
    /// The release task in flight; it reports with [`FlowMsg::Released`].
    task: Option<AbortOnDrop<()>>,
    /// The retry timer of a failed release.
    retry: Option<AbortOnDrop<Result<(), ractor::MessagingErr<FlowMsg>>>>,
    /// Retry backoff (reset by a success).
    backoff: Backoff,
}

/// Hands `unit` back under `epoch` by a task of its own (at most one per unit; a newer epoch
/// waits for the one in flight). The handler never waits for the control plane.
pub(super) fn request_release<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    unit: &WorkUnit,
    epoch: Epoch,
) {
    if !may_take_over(myself, state, unit) {
        return;
    }
    let current = state.releases.get(unit).map(|r| r.state);
    match plan_release(current, epoch) {
        ReleasePlan::Spawn(epoch) => spawn_release(myself, state, unit, epoch),
        ReleasePlan::Queue(epoch) => {
            if let Some(Handback {
                state: ReleaseState::InFlight { queued, .. },
                ..
            }) = state.releases.get_mut(unit)
            {
                *queued = Some(epoch);
            }
        }
        ReleasePlan::Skip => {}
    }
}

/// Starts the release task of `unit` under `epoch`; it reports with [`FlowMsg::Released`].
pub(super) fn spawn_release<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    unit: &WorkUnit,
    epoch: Epoch,
) {
    let control = state.args.control.clone();
    let me = myself.clone();
    let alive = state.args.alive.clone();
    let span = unit_span(UnitTaskKind::Release, state.args.node_id, unit, epoch);
    let u = unit.clone();
    let task = tokio::spawn(
        async move {
            let _alive = alive;
            let result = control.release(u.clone(), epoch).await;
            // The flow actor may be gone (a drain that ran out of time); nobody to tell then.
            let _ = me.send_message(FlowMsg::Released {
                unit: u,
                epoch,
                result,
            });
        }
        .instrument(span),
    );
    state.seeds = state.seeds.wrapping_add(1);
    let backoff_params = state.args.tuning.backoff;
    let seed = state.seeds;
    let slot = state
        .releases
        .entry(unit.clone())
        .or_insert_with(|| Handback {
            state: ReleaseState::InFlight {
                epoch,
                queued: None,
            },
            task: None,
            retry: None,
            backoff: Backoff::new(backoff_params, seed),
        });
    slot.state = ReleaseState::InFlight {
        epoch,
        queued: None,
    };
    slot.task = Some(AbortOnDrop(task));
    slot.retry = None;
}

/// Applies the outcome of a release task: logs it, starts a queued release, arms a retry.
pub(super) fn released<C: ControlPlane>(
    myself: &ActorRef<FlowMsg>,
    state: &mut FlowState<C>,
    unit: WorkUnit,
    epoch: Epoch,
    result: Result<(), ControlError>,
) {
    match &result {
        Ok(()) => tracing::info!(%unit, epoch = %epoch, "unit released"),
        Err(err) => tracing::warn!(%unit, epoch = %epoch, error = %err, "release failed"),
    }
    let current = state.releases.get(&unit).map(|r| r.state);
    let draining = state.drain.is_on();
    let (next, follow_up) = release_finished(current, epoch, result.is_ok(), draining);
    if let (Some(slot), Some(next)) = (state.releases.get_mut(&unit), next) {
        if Some(next) != current {
            // The task that reported has finished.
            slot.task = None;
            slot.state = next;
            if matches!(next, ReleaseState::Released { .. }) {
                slot.backoff.reset();
            }
        }
    }
    match follow_up {
        ReleaseFollowUp::Nothing => {}
        ReleaseFollowUp::Spawn(next) => spawn_release(myself, state, &unit, next),
        ReleaseFollowUp::RetryLater => {
            if let Some(slot) = state.releases.get_mut(&unit) {
                let delay = slot.backoff.next_delay();
                tracing::debug!(%unit, epoch = %epoch, backoff = ?delay, "release retried after backoff");
                let u = unit.clone();
                let timer =
                    myself.send_after(delay, move || FlowMsg::ReleaseRetryDue { unit: u, epoch });
                slot.retry = Some(AbortOnDrop(timer));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    /// The size of the future `f` returns, without making one.
    fn future_size<A, F>(_: fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every unit of an instance holds its reader's and writer's loop for as long as it runs
    /// (tens of thousands per instance): the paths they take once per batch or once per
    /// start are boxed where awaited, so that what stays resident is the idle wait. 2,432 and
    /// 4,608 bytes before that; the bounds leave room for compiler changes.
    #[test]
    fn a_units_loops_stay_small_while_they_wait() {
        use crate::datapath::{reader, writer};
        use crate::memory::InMemoryControl;
        let reader = future_size(reader::run::<InMemoryControl>);
        let writer = future_size(writer::run::<InMemoryControl>);
        check!(reader <= 1280, "reader loop: {reader} bytes");
        check!(writer <= 2048, "writer loop: {writer} bytes");
    }

    #[test]
    fn a_drain_is_answered_once_and_only_when_asked() {
        let mut off = Drain::Off;
        off.answer();
        check!(!off.is_on());
        let (tx, mut rx) = oneshot::channel();
        let mut drain = Drain::Pending(tx.into());
        check!(drain.is_on());
        drain.answer();
        check!(rx.try_recv().is_ok());
        check!(matches!(drain, Drain::Done));
        drain.answer();
        check!(drain.is_on());
    }
}
