//! The coordinator of one pipeline instance: follows this node's assignments, runs one
//! reader/writer pair per assigned unit, stops pairs cleanly when units are revoked or
//! released, and restarts pairs that ended by themselves with bounded exponential backoff plus
//! jitter.
//!
//! It is the data plane's one actor, because its mailbox really carries intents from several
//! senders: the assignment watcher, discovery, `Pipeline::shutdown`, its own timers, release
//! tasks, and the ends of the unit tasks it supervises. Readers and writers are plain tokio
//! tasks (see `pair`): each runs one loop under its pair's `CancellationToken`, a child of the
//! coordinator's, and reports how it ended as [`CoordinatorMsg::UnitTaskEnded`].
//!
//! Its handlers never wait: a unit is handed back by a release task of its own, at most one per
//! unit, which reports as [`CoordinatorMsg::Released`] (see `release`); statistics are read from
//! the shared [`MeterRegistry`], not through the mailbox. What to do with a unit is decided by
//! pure functions (`decide`, and `release` for hand-backs).

mod decide;
mod pair;
mod release;

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort};
use replicator_model::{Assignment, Epoch, NodeId, WorkUnit};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::decide::{after_pair_gone, decide, Action, AfterPair, Ended, PhaseKind};
use self::pair::{Pair, Report, Role, TaskEnd};
use self::release::{keep_release, request_release, retry_release, spawn_release};
use self::release::{released, ReleaseSlot, ReleaseState, RetryPlan};
use crate::backoff::Backoff;
use crate::clients::Cluster;
use crate::control::{ControlError, ControlPlane};
use crate::liveness::Liveness;
use crate::mapping::downstream_stream;
use crate::params::FlowParams;
use crate::reader::{self, ReaderArgs};
use crate::stats::{MeterRegistry, UnitMeters};
use crate::unit::{UnitShared, UnitTuning};
use crate::writer::{self, WriterArgs};

/// Held by every task the coordinator spawns (unit tasks, release tasks). Nothing is ever sent
/// on it: `Pipeline` waits until the last clone is dropped, so that `shutdown` and `crash`
/// return only once none of those tasks runs any more.
pub(crate) type Alive = mpsc::Sender<()>;

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
    /// From a backoff timer of the coordinator: restart the unit's pair if still assigned under
    /// `epoch`. No reply.
    RestartDue {
        unit: WorkUnit,
        /// The epoch the ended pair ran under.
        epoch: Epoch,
    },
    /// From discovery: the upstream topic was deleted and recreated; restart its running units
    /// (they resume from the initial offset). No reply.
    TopicRecreated {
        flow: String,
        stream: String,
        topic: String,
    },
    /// From `Pipeline::shutdown`: stop every unit cleanly (final commit, then release); replies
    /// when every unit is stopped and every release was attempted. Units of the flows in the
    /// set (a config reload keeps them) stop after their final commit without a release: the
    /// node keeps them, and the next pipeline starts them again under the same epoch.
    Drain(BTreeSet<String>, RpcReplyPort<()>),
    /// From a release task of the coordinator: handing `unit` back under `epoch` finished with
    /// `result`. No reply.
    Released {
        unit: WorkUnit,
        epoch: Epoch,
        result: Result<(), ControlError>,
    },
    /// From a retry timer of the coordinator: try the failed release of `unit` under `epoch`
    /// again if the leader still asks for it. No reply.
    ReleaseRetryDue { unit: WorkUnit, epoch: Epoch },
    /// From a reader or writer task of pair `pair` of `unit`, as it ends (also when it
    /// panicked): how it ended. No reply.
    UnitTaskEnded {
        unit: WorkUnit,
        pair: u64,
        role: Role,
        end: TaskEnd,
    },
    /// From the pipeline's watchdog: proves the mailbox is being handled. No reply.
    Heartbeat,
}

/// Everything the coordinator needs to start pairs.
pub(crate) struct CoordinatorArgs<C> {
    pub(crate) node_id: NodeId,
    pub(crate) control: C,
    /// Flows by name.
    pub(crate) flows: BTreeMap<String, Arc<FlowParams>>,
    /// Clusters by alias.
    pub(crate) clusters: BTreeMap<String, Arc<Cluster>>,
    /// The connections writers send with (per target: the node's writer identity when fenced).
    pub(crate) writers: Arc<crate::identity::WriterTargets>,
    pub(crate) tuning: UnitTuning,
    /// Where the meters of every started unit are registered (shared with `Pipeline::stats`).
    pub(crate) meters: MeterRegistry,
    /// Cloned into every task the coordinator spawns (see [`Alive`]).
    pub(crate) alive: Alive,
    /// Marked on every heartbeat handled (see [`crate::liveness`]).
    pub(crate) liveness: Arc<Liveness>,
    /// The writers' offset maps (read by the consumer-group sync).
    pub(crate) offset_maps: crate::groups::OffsetMaps,
    /// Throttles of the flows that have limits, by flow name.
    pub(crate) throttles: BTreeMap<String, Arc<crate::throttle::FlowThrottle>>,
    /// Each flow's residency, by flow name: no pair starts for a topic it blocks.
    pub(crate) residency: BTreeMap<String, Arc<crate::residency::Residency>>,
}

/// What runs for a unit this node works on.
enum Phase {
    /// The pair runs, or stops once asked (see [`Pair::ending`]).
    Running(Pair),
    /// The pair ended by itself and restarts when the timer fires.
    Waiting {
        /// Held for its drop: dropping the slot (a cancelled restart) aborts the timer.
        _timer: AbortOnDrop<Result<(), MessagingErr<CoordinatorMsg>>>,
    },
}

/// A unit this node is working on.
struct Slot {
    /// Epoch of the pair.
    epoch: Epoch,
    phase: Phase,
    /// Restart backoff (kept across restarts of the same epoch).
    backoff: Backoff,
    /// When the current pair started (a pair that ran long enough resets the backoff).
    started: Instant,
}

impl Slot {
    /// The phase without its handles, for [`decide()`].
    fn kind(&self) -> PhaseKind {
        match &self.phase {
            Phase::Running(pair) if pair.ending == Ended::ByItself => PhaseKind::Running,
            Phase::Running(_) => PhaseKind::Stopping,
            Phase::Waiting { .. } => PhaseKind::Waiting,
        }
    }
}

/// Whether `Pipeline::shutdown` asked the coordinator to drain.
enum Drain {
    /// Not asked: pairs follow the assignments.
    Off,
    /// Draining: nothing starts, everything stops and is released; the reply goes out once no
    /// pair runs and no release is in flight.
    Pending(RpcReplyPort<()>),
    /// Draining, and the reply went out.
    Done,
}

impl Drain {
    fn is_on(&self) -> bool {
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

/// A task handle that aborts its task when dropped (also when the coordinator is killed and
/// its state dropped without `post_stop`).
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runtime state of the coordinator.
pub(crate) struct CoordinatorState<C> {
    args: CoordinatorArgs<C>,
    /// Latest assignments of this node, by unit.
    desired: BTreeMap<WorkUnit, Assignment>,
    /// Units being worked on.
    slots: BTreeMap<WorkUnit, Slot>,
    /// Hand-backs in flight, done (until the assignments catch up) or waiting for a retry.
    releases: BTreeMap<WorkUnit, ReleaseSlot>,
    drain: Drain,
    /// Flows whose units the drain keeps (stops without handing back).
    kept_flows: BTreeSet<String>,
    /// Parent of every pair's stop token; cancelled when the coordinator stops.
    units: CancellationToken,
    /// Forwards assignment changes into the mailbox (held for its drop, which ends it).
    _watcher: AbortOnDrop<()>,
    /// Flows already warned about as unknown.
    warned_flows: BTreeSet<String>,
    /// Counter mixed into jitter seeds.
    seeds: u64,
    /// The last pair id handed out.
    pairs: u64,
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
        let watcher = tokio::spawn(
            async move {
                loop {
                    let current = rx.borrow_and_update().clone();
                    writers.borrow_and_update();
                    if myself
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
        Ok(CoordinatorState {
            seeds: args.node_id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            args,
            desired: BTreeMap::new(),
            slots: BTreeMap::new(),
            releases: BTreeMap::new(),
            drain: Drain::Off,
            kept_flows: BTreeSet::new(),
            units: CancellationToken::new(),
            _watcher: AbortOnDrop(watcher),
            warned_flows: BTreeSet::new(),
            pairs: 0,
            span,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Only after a drain that ran out of time is anything left: aborted, not drained.
        state.units.cancel();
        state.slots.clear();
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
        span.in_scope(|| dispatch(&myself, state, msg));
        Ok(())
    }
}

/// Handles one message; never waits (see the module doc).
fn dispatch<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    msg: CoordinatorMsg,
) {
    match msg {
        CoordinatorMsg::Heartbeat => state.args.liveness.answered(),
        CoordinatorMsg::Assignments(list) => {
            state.desired = list.into_iter().map(|a| (a.unit.clone(), a)).collect();
            let desired = &state.desired;
            state
                .releases
                .retain(|unit, r| keep_release(r.state, desired.get(unit)));
            reconcile(myself, state);
        }
        CoordinatorMsg::RestartDue { unit, epoch } => {
            let due = state
                .slots
                .get(&unit)
                .is_some_and(|s| s.epoch == epoch && matches!(s.phase, Phase::Waiting { .. }));
            if due {
                let still_assigned = !state.drain.is_on()
                    && state
                        .desired
                        .get(&unit)
                        .is_some_and(|a| a.epoch == epoch && !a.release_requested);
                let backoff = state.slots.remove(&unit).map(|s| s.backoff);
                if still_assigned {
                    start_pair(myself, state, &unit, epoch, backoff);
                }
                reconcile_units(myself, state, [unit]);
            }
        }
        CoordinatorMsg::TopicRecreated {
            flow,
            stream,
            topic,
        } => {
            for (unit, slot) in state.slots.iter_mut() {
                if unit.flow == flow && unit.stream == stream && unit.topic == topic {
                    stop_pair(slot, false);
                }
            }
        }
        CoordinatorMsg::Drain(keep, reply) => {
            state.drain = Drain::Pending(reply);
            state.kept_flows = keep;
            // A drain attempts every release once more, also those that failed before.
            state
                .releases
                .retain(|_, r| !matches!(r.state, ReleaseState::Failed { .. }));
            reconcile(myself, state);
        }
        CoordinatorMsg::Released {
            unit,
            epoch,
            result,
        } => {
            released(myself, state, unit, epoch, result);
            finish_drain_if_done(state);
        }
        CoordinatorMsg::ReleaseRetryDue { unit, epoch } => {
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
        CoordinatorMsg::UnitTaskEnded {
            unit,
            pair,
            role,
            end,
        } => task_ended(myself, state, &unit, pair, role, end),
    }
}

/// Clears an ended task from its pair and acts once the pair is gone.
fn task_ended<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    unit: &WorkUnit,
    pair_id: u64,
    role: Role,
    end: TaskEnd,
) {
    let Some(slot) = state.slots.get_mut(unit) else {
        return;
    };
    let Phase::Running(pair) = &mut slot.phase else {
        return;
    };
    if pair.id != pair_id {
        return;
    }
    match &end {
        TaskEnd::Stopped(reason) => {
            tracing::debug!(%unit, role = ?role, reason, "unit task ended");
        }
        TaskEnd::Failed(err) => tracing::warn!(
            flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
            partition = unit.partition, epoch = %slot.epoch, role = ?role, error = %err,
            "unit task failed"
        ),
        TaskEnd::Panicked => tracing::error!(
            flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
            partition = unit.partition, epoch = %slot.epoch, role = ?role,
            "unit task panicked"
        ),
    }
    pair.failed |= !matches!(end, TaskEnd::Stopped(_));
    match role {
        Role::Reader => pair.reader = None,
        Role::Writer => {
            pair.writer = None;
            // A writer that ended leaves its reader without a consumer: stop it too. A reader
            // that ended closes the channel, so its writer drains, commits and ends by itself.
            pair.stop.cancel();
        }
    }
    if pair.reader.is_some() || pair.writer.is_some() {
        return;
    }
    let (epoch, ending, failed) = (slot.epoch, pair.ending, pair.failed);
    let next = after_pair_gone(
        ending,
        epoch,
        state.desired.get(unit),
        state.drain.is_on(),
        slot.started.elapsed(),
    );
    match next {
        AfterPair::Remove => {
            state.slots.remove(unit);
            reconcile_units(myself, state, [unit.clone()]);
        }
        AfterPair::Release(epoch) => {
            state.slots.remove(unit);
            request_release(myself, state, unit, epoch);
            reconcile_units(myself, state, [unit.clone()]);
        }
        AfterPair::Restart { reset_backoff } => {
            if reset_backoff {
                slot.backoff.reset();
            }
            let delay = slot.backoff.next_delay();
            if let Some(m) = state.args.meters.get(unit) {
                m.restarted();
            }
            tracing::warn!(
                flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
                partition = unit.partition, epoch = %epoch, failed, backoff = ?delay,
                "unit pair ended unexpectedly, restarting after backoff"
            );
            let (u, e) = (unit.clone(), epoch);
            let timer = myself.send_after(delay, move || CoordinatorMsg::RestartDue {
                unit: u,
                epoch: e,
            });
            slot.phase = Phase::Waiting {
                _timer: AbortOnDrop(timer),
            };
        }
    }
}

/// Answers a pending drain once no pair runs and no release is in flight.
fn finish_drain_if_done<C>(state: &mut CoordinatorState<C>) {
    let releasing = state
        .releases
        .values()
        .any(|r| matches!(r.state, ReleaseState::InFlight { .. }));
    if state.slots.is_empty() && !releasing {
        state.drain.answer();
    }
}

/// Whether `epoch` of `unit` is being or has been handed back: no pair starts under it.
fn handing_back<C>(state: &CoordinatorState<C>, unit: &WorkUnit, epoch: Epoch) -> bool {
    state
        .releases
        .get(unit)
        .is_some_and(|r| r.state.covers(epoch))
}

/// Asks a running pair to stop cleanly: the reader stops at once, the writer sends what is
/// queued, makes its final commit and ends.
fn stop_pair(slot: &mut Slot, release: bool) {
    if let Phase::Running(pair) = &mut slot.phase {
        if pair.ending == Ended::ByItself {
            pair.ending = Ended::Stopped { release };
            pair.stop.cancel();
        }
    }
}

/// Brings the running pairs in line with the assignments: after a message that may change any
/// unit's (new assignments, a drain).
fn reconcile<C: ControlPlane>(myself: &ActorRef<CoordinatorMsg>, state: &mut CoordinatorState<C>) {
    let units: BTreeSet<WorkUnit> = state
        .desired
        .keys()
        .chain(state.slots.keys())
        .cloned()
        .collect();
    reconcile_units(myself, state, units);
}

/// Brings the pairs of `units` in line with the assignments, and leaves the others as they
/// are: a message about one unit's pair (it ended, its restart is due) reconciles that unit
/// only. Every other unit is where the last [`reconcile`] put it, since nothing else changes
/// what is decided for it; a full pass per pair end made a start, or a restart storm, at tens
/// of thousands of units quadratic (the coordinator then spent most of a core cloning and
/// comparing unit names).
fn reconcile_units<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    units: impl IntoIterator<Item = WorkUnit>,
) {
    let draining = state.drain.is_on();
    let mut seen = Vec::new();
    for unit in units {
        let view = state.slots.get(&unit).map(|s| (s.epoch, s.kind()));
        // A unit the drain keeps is stopped as if it were no longer ours, and not released.
        let desired = state
            .desired
            .get(&unit)
            .filter(|_| !(draining && state.kept_flows.contains(&unit.flow)));
        match decide(view, desired, draining) {
            Action::Nothing => {}
            Action::Start(epoch) if handing_back(state, &unit, epoch) => {}
            Action::Start(epoch) => start_pair(myself, state, &unit, epoch, None),
            Action::Stop { release } => {
                if let Some(slot) = state.slots.get_mut(&unit) {
                    tracing::info!(%unit, epoch = %slot.epoch, release, "stopping unit");
                    stop_pair(slot, release);
                }
            }
            Action::Cancel { release } => {
                // Dropping the slot aborts its restart timer.
                if let Some(slot) = state.slots.remove(&unit) {
                    if release {
                        request_release(myself, state, &unit, slot.epoch);
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
                && !state.slots.contains_key(&a.unit)
                && !handing_back(state, &a.unit, a.epoch)
        });
        if let Some(epoch) = startable.map(|a| a.epoch) {
            start_pair(myself, state, &unit, epoch, None);
        }
    }
    finish_drain_if_done(state);
}

/// Spawns the reader and writer tasks of a unit under `epoch`.
fn start_pair<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    unit: &WorkUnit,
    epoch: Epoch,
    backoff: Option<Backoff>,
) {
    if state.slots.contains_key(unit) {
        return;
    }
    let Some(flow) = state.args.flows.get(&unit.flow).cloned() else {
        if state.warned_flows.insert(unit.flow.clone()) {
            tracing::warn!(flow = %unit.flow, "assigned a unit of a flow this node does not run");
        }
        return;
    };
    // A unit of a topic a residency policy keeps from the target (granted before the policy
    // existed; discovery no longer reports it, so it is retired and handed back when asked)
    // never runs. Discovery records and logs the topic.
    let blocked = state
        .args
        .residency
        .get(&unit.flow)
        .and_then(|r| r.blocked_by(&unit.stream, &unit.topic));
    if let Some(policy) = blocked {
        tracing::debug!(%unit, policy, "unit of a topic a residency policy blocks: not started");
        return;
    }
    let Some(source) = state.args.clusters.get(&flow.source).cloned() else {
        return;
    };
    let Some(target) = state.args.writers.current(&flow.target) else {
        tracing::debug!(%unit, "no writer identity for the target yet: the unit waits");
        return;
    };
    state.seeds = state.seeds.wrapping_add(1);
    let observer = state.args.tuning.observer.clone();
    let meters = state
        .args
        .meters
        .get_or_insert(unit, || UnitMeters::new(&unit.flow, observer));
    let span = unit_span(UnitTask::Pair, state.args.node_id, unit, epoch);
    let shared = Arc::new(UnitShared {
        unit: unit.clone(),
        epoch,
        downstream_stream: downstream_stream(flow.naming, &flow.source, &unit.stream),
        flow: flow.clone(),
        source,
        target,
        control: state.args.control.clone(),
        meters,
        tuning: state.args.tuning.clone(),
        seed: state.seeds,
        offset_maps: state.args.offset_maps.clone(),
        throttle: state.args.throttles.get(&unit.flow).cloned(),
    });
    let (tx, rx) = mpsc::channel(flow.max_in_flight_batches);
    let (start_tx, start_rx) = oneshot::channel();
    state.pairs += 1;
    let id = state.pairs;
    let stop = state.units.child_token();
    let report = |role| Report {
        coordinator: myself.clone(),
        unit: unit.clone(),
        pair: id,
        role,
    };
    let writer = pair::spawn(
        report(Role::Writer),
        state.args.alive.clone(),
        tracing::info_span!(parent: &span, "writer"),
        writer::run(WriterArgs {
            shared: shared.clone(),
            rx,
            start: start_tx,
            stop: stop.clone(),
        }),
    );
    let reader = pair::spawn(
        report(Role::Reader),
        state.args.alive.clone(),
        tracing::info_span!(parent: &span, "reader"),
        reader::run(ReaderArgs {
            shared,
            tx,
            start: start_rx,
            stop: stop.clone(),
        }),
    );
    let pair = Pair {
        id,
        stop,
        reader: Some(reader),
        writer: Some(writer),
        failed: false,
        ending: Ended::ByItself,
    };
    let backoff = backoff.unwrap_or_else(|| Backoff::new(state.args.tuning.backoff, state.seeds));
    state.slots.insert(
        unit.clone(),
        Slot {
            epoch,
            phase: Phase::Running(pair),
            backoff,
            started: Instant::now(),
        },
    );
    tracing::info!(%unit, epoch = %epoch, "unit started");
}

/// What a span of [`unit_span`] covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnitTask {
    /// The unit's reader and writer (span `unit`).
    Pair,
    /// Handing the unit back (span `release`).
    Release,
}

/// The root span of a task of `unit` under `epoch` on `node`, with the fields every
/// long-running task carries (node, flow, stream, topic, partition, epoch).
fn unit_span(task: UnitTask, node: NodeId, unit: &WorkUnit, epoch: Epoch) -> tracing::Span {
    // A span's name is part of its static metadata, hence one macro call per name.
    macro_rules! span {
        ($name:literal) => {
            tracing::info_span!(
                parent: None,
                $name,
                node = %node,
                flow = %unit.flow,
                stream = %unit.stream,
                topic = %unit.topic,
                partition = unit.partition,
                epoch = %epoch,
            )
        };
    }
    match task {
        UnitTask::Pair => span!("unit"),
        UnitTask::Release => span!("release"),
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    /// An assignment of unit `f/s/t/0` under `epoch`, for the decision tests.
    pub(super) fn assignment(epoch: u64, release_requested: bool) -> Assignment {
        Assignment {
            unit: WorkUnit::new("f", "s", "t", 0),
            epoch: Epoch(epoch),
            release_requested,
        }
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
