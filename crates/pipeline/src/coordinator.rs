//! `Coordinator`: follows this node's assignments, runs one reader/writer pair per assigned
//! unit, stops pairs cleanly when units are revoked or released, and restarts failed pairs with
//! bounded exponential backoff plus jitter.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use replicator_model::{Assignment, Epoch, NodeId, WorkUnit};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::clients::Cluster;
use crate::control::ControlPlane;
use crate::mapping::downstream_stream;
use crate::params::FlowParams;
use crate::reader::{PartitionReader, ReaderArgs, ReaderMsg};
use crate::stats::{UnitMeters, UnitStats};
use crate::unit::{actor_name, UnitShared, UnitTuning};
use crate::writer::{DownstreamWriter, WriterArgs, WriterMsg};

/// The coordinator actor of one pipeline instance.
pub(crate) struct Coordinator<C>(PhantomData<fn() -> C>);

impl<C> Coordinator<C> {
    /// The actor value (all state lives in [`CoordinatorState`]).
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
        /// The unit.
        unit: WorkUnit,
        /// The epoch the failed pair ran under.
        epoch: Epoch,
    },
    /// From discovery: the upstream topic was deleted and recreated; restart its running units
    /// (they resume from the initial offset). No reply.
    TopicRecreated {
        /// Flow name.
        flow: String,
        /// Upstream stream.
        stream: String,
        /// Upstream topic.
        topic: String,
    },
    /// From `Pipeline::shutdown`: stop every unit cleanly (final commit, release); replies when
    /// all are stopped.
    Drain(RpcReplyPort<()>),
    /// From `Pipeline::stats`: replies with every unit's statistics.
    Stats(RpcReplyPort<Vec<UnitStats>>),
}

/// Everything the coordinator needs to start pairs.
pub(crate) struct CoordinatorArgs<C> {
    /// This node's id.
    pub(crate) node_id: NodeId,
    /// Control plane handle.
    pub(crate) control: C,
    /// Flows by name.
    pub(crate) flows: BTreeMap<String, Arc<FlowParams>>,
    /// Clusters by alias.
    pub(crate) clusters: BTreeMap<String, Arc<Cluster>>,
    /// Tunables for units.
    pub(crate) tuning: UnitTuning,
}

/// Which actor of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The `PartitionReader`.
    Reader,
    /// The `DownstreamWriter`.
    Writer,
}

/// Lifecycle of a unit on this node.
enum Phase {
    /// The pair runs.
    Running {
        /// The reader, until it terminates.
        reader: Option<ActorRef<ReaderMsg>>,
        /// The writer, until it terminates.
        writer: Option<ActorRef<WriterMsg>>,
        /// Whether either actor failed (as opposed to stopping by itself).
        failed: bool,
    },
    /// The pair was asked to stop; when both are gone the slot is removed.
    Stopping {
        /// The reader, until it terminates.
        reader: Option<ActorRef<ReaderMsg>>,
        /// The writer, until it terminates.
        writer: Option<ActorRef<WriterMsg>>,
        /// Hand the unit back to the control plane afterwards.
        release: bool,
    },
    /// The pair failed and restarts when the timer fires.
    Waiting {
        /// The backoff timer.
        timer: JoinHandle<Result<(), ractor::MessagingErr<CoordinatorMsg>>>,
    },
}

/// A unit this node is working on.
struct Slot {
    /// Epoch of the pair.
    epoch: Epoch,
    /// Lifecycle.
    phase: Phase,
    /// Restart backoff (kept across restarts of the same epoch).
    backoff: Backoff,
    /// When the current pair started (a pair that ran long enough resets the backoff).
    started: Instant,
}

/// The phase without its handles, for decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PhaseKind {
    /// Pair running.
    Running,
    /// Pair stopping.
    Stopping,
    /// Waiting for a restart.
    Waiting,
}

/// What to do with one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Leave it as it is.
    Nothing,
    /// Start a pair under this epoch.
    Start(Epoch),
    /// Stop the running pair cleanly; release the unit afterwards if asked.
    Stop {
        /// Release after the final commit.
        release: bool,
    },
    /// Cancel a pending restart; release the unit if asked.
    Cancel {
        /// Release now.
        release: bool,
    },
    /// Nothing runs but the unit is assigned and must be handed back.
    Release(Epoch),
}

/// Decides what to do with a unit given what runs (`slot`) and what is assigned (`desired`).
pub(crate) fn decide(
    slot: Option<(Epoch, PhaseKind)>,
    desired: Option<&Assignment>,
    draining: bool,
) -> Action {
    let Some((epoch, phase)) = slot else {
        return match desired {
            None => Action::Nothing,
            Some(a) if draining || a.release_requested => Action::Release(a.epoch),
            Some(a) => Action::Start(a.epoch),
        };
    };
    let same = desired.is_some_and(|a| a.epoch == epoch);
    let release = draining || desired.is_some_and(|a| a.release_requested);
    match phase {
        PhaseKind::Stopping => Action::Nothing,
        PhaseKind::Running if !same => Action::Stop { release: false },
        PhaseKind::Running if release => Action::Stop { release: true },
        PhaseKind::Waiting if !same => Action::Cancel { release: false },
        PhaseKind::Waiting if release => Action::Cancel { release: true },
        PhaseKind::Running | PhaseKind::Waiting => Action::Nothing,
    }
}

/// Runtime state of the coordinator.
pub(crate) struct CoordinatorState<C> {
    /// Inputs.
    args: CoordinatorArgs<C>,
    /// Latest assignments of this node, by unit.
    desired: BTreeMap<WorkUnit, Assignment>,
    /// Units being worked on.
    slots: BTreeMap<WorkUnit, Slot>,
    /// Which unit and role each live child actor is.
    children: HashMap<ActorId, (WorkUnit, Role)>,
    /// Meters by unit, kept after a unit stops so its statistics stay readable.
    meters: BTreeMap<WorkUnit, Arc<UnitMeters>>,
    /// Set by `Drain`: stop everything, start nothing, answer when done.
    draining: Option<Option<RpcReplyPort<()>>>,
    /// Forwards assignment changes into the mailbox; aborted when the coordinator stops.
    watcher: JoinHandle<()>,
    /// Flows already warned about as unknown.
    warned_flows: std::collections::BTreeSet<String>,
    /// Counter mixed into jitter seeds.
    seeds: u64,
    /// The coordinator's span.
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
        let mut rx = args.control.assignments();
        let me = myself.clone();
        let watcher = tokio::spawn(async move {
            loop {
                let current = rx.borrow_and_update().clone();
                if me
                    .send_message(CoordinatorMsg::Assignments(current))
                    .is_err()
                {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        let span = tracing::info_span!("coordinator", node = %args.node_id);
        Ok(CoordinatorState {
            seeds: args.node_id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            args,
            desired: BTreeMap::new(),
            slots: BTreeMap::new(),
            children: HashMap::new(),
            meters: BTreeMap::new(),
            draining: None,
            watcher,
            warned_flows: Default::default(),
            span,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.watcher.abort();
        for slot in state.slots.values() {
            if let Phase::Waiting { timer } = &slot.phase {
                timer.abort();
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        async {
            match msg {
                CoordinatorMsg::Assignments(list) => {
                    state.desired = list.into_iter().map(|a| (a.unit.clone(), a)).collect();
                    reconcile(&myself, state).await;
                }
                CoordinatorMsg::RestartDue { unit, epoch } => {
                    let due = state.slots.get(&unit).is_some_and(|s| {
                        s.epoch == epoch && matches!(s.phase, Phase::Waiting { .. })
                    });
                    if due {
                        let still_assigned = state.draining.is_none()
                            && state
                                .desired
                                .get(&unit)
                                .is_some_and(|a| a.epoch == epoch && !a.release_requested);
                        let backoff = state.slots.remove(&unit).map(|s| s.backoff);
                        if still_assigned {
                            start_pair(&myself, state, &unit, epoch, backoff).await;
                        }
                        reconcile(&myself, state).await;
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
                CoordinatorMsg::Drain(reply) => {
                    state.draining = Some(Some(reply));
                    reconcile(&myself, state).await;
                }
                CoordinatorMsg::Stats(reply) => {
                    let now = Instant::now();
                    let stats = state
                        .meters
                        .iter()
                        .map(|(unit, m)| m.snapshot(unit, now))
                        .collect();
                    let _ = reply.send(stats);
                }
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (id, failure) = match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                tracing::debug!(actor = ?cell.get_name(), reason = ?reason, "child stopped");
                (cell.get_id(), None)
            }
            SupervisionEvent::ActorFailed(cell, err) => (cell.get_id(), Some(err.to_string())),
            _ => return Ok(()),
        };
        let span = state.span.clone();
        async {
            let Some((unit, role)) = state.children.remove(&id) else {
                return Ok(());
            };
            if let Some(err) = &failure {
                tracing::warn!(
                    flow = %unit.flow, stream = %unit.stream, topic = %unit.topic,
                    partition = unit.partition, role = ?role, error = %err,
                    "unit actor failed"
                );
            }
            child_gone(&myself, state, &unit, role, failure.is_some()).await;
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// Clears a terminated child from its slot and acts when the pair is fully gone.
async fn child_gone<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    unit: &WorkUnit,
    role: Role,
    failed_now: bool,
) {
    let Some(slot) = state.slots.get_mut(unit) else {
        return;
    };
    let (reader, writer) = match &mut slot.phase {
        Phase::Running {
            reader,
            writer,
            failed,
        } => {
            *failed |= failed_now;
            (reader, writer)
        }
        Phase::Stopping { reader, writer, .. } => (reader, writer),
        Phase::Waiting { .. } => return,
    };
    match role {
        Role::Reader => *reader = None,
        Role::Writer => *writer = None,
    }
    // A writer that stopped leaves its reader without a consumer: stop it too. A reader that
    // stopped closes the channel, so its writer drains, commits and stops by itself.
    if role == Role::Writer {
        if let Some(r) = reader.take() {
            r.stop(Some("writer stopped".into()));
            *reader = Some(r);
        }
    }
    if reader.is_some() || writer.is_some() {
        return;
    }
    let epoch = slot.epoch;
    match &slot.phase {
        Phase::Running { .. }
            if state.draining.is_some()
                || state
                    .desired
                    .get(unit)
                    .is_none_or(|a| a.epoch != epoch || a.release_requested) =>
        {
            // The pair ended on its own because ownership moved on; nothing to restart.
            state.slots.remove(unit);
            reconcile(myself, state).await;
        }
        Phase::Running { failed, .. } => {
            let failed = *failed;
            if slot.started.elapsed() >= slot.backoff_reset_after() {
                slot.backoff.reset();
            }
            let delay = slot.backoff.next_delay();
            if let Some(m) = state.meters.get(unit) {
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
            slot.phase = Phase::Waiting { timer };
        }
        Phase::Stopping { release, .. } => {
            let release = *release;
            state.slots.remove(unit);
            if release {
                release_unit(state, unit, epoch).await;
            }
            reconcile(myself, state).await;
        }
        Phase::Waiting { .. } => {}
    }
}

impl Slot {
    /// A pair that ran at least this long before ending restarts from the initial backoff.
    fn backoff_reset_after(&self) -> Duration {
        Duration::from_secs(30)
    }
}

/// Hands a unit back to the control plane (logged, not retried: the lease expiry frees it anyway).
async fn release_unit<C: ControlPlane>(state: &CoordinatorState<C>, unit: &WorkUnit, epoch: Epoch) {
    match state.args.control.release(unit.clone(), epoch).await {
        Ok(()) => tracing::info!(%unit, epoch = %epoch, "unit released"),
        Err(err) => tracing::warn!(%unit, epoch = %epoch, error = %err, "release failed"),
    }
}

/// Asks a running pair to stop cleanly: the reader stops polling, the writer drains and commits.
fn stop_pair(slot: &mut Slot, release: bool) {
    if let Phase::Running { reader, writer, .. } = &mut slot.phase {
        let (reader, writer) = (reader.take(), writer.take());
        match (&reader, &writer) {
            (Some(r), _) => r.stop(Some("unit stopping".into())),
            (None, Some(w)) => w.stop(Some("unit stopping".into())),
            (None, None) => {}
        }
        slot.phase = Phase::Stopping {
            reader,
            writer,
            release,
        };
    }
}

/// Brings the running pairs in line with the assignments.
async fn reconcile<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
) {
    let draining = state.draining.is_some();
    let units: std::collections::BTreeSet<WorkUnit> = state
        .desired
        .keys()
        .chain(state.slots.keys())
        .cloned()
        .collect();
    for unit in units {
        let view = state.slots.get(&unit).map(|s| {
            let kind = match s.phase {
                Phase::Running { .. } => PhaseKind::Running,
                Phase::Stopping { .. } => PhaseKind::Stopping,
                Phase::Waiting { .. } => PhaseKind::Waiting,
            };
            (s.epoch, kind)
        });
        match decide(view, state.desired.get(&unit), draining) {
            Action::Nothing => {}
            Action::Start(epoch) => start_pair(myself, state, &unit, epoch, None).await,
            Action::Stop { release } => {
                if let Some(slot) = state.slots.get_mut(&unit) {
                    tracing::info!(%unit, epoch = %slot.epoch, release, "stopping unit");
                    stop_pair(slot, release);
                }
            }
            Action::Cancel { release } => {
                if let Some(slot) = state.slots.remove(&unit) {
                    if let Phase::Waiting { timer } = slot.phase {
                        timer.abort();
                    }
                    if release {
                        release_unit(state, &unit, slot.epoch).await;
                    }
                }
            }
            Action::Release(epoch) => release_unit(state, &unit, epoch).await,
        }
    }
    // A new epoch for a unit whose old pair just went away starts on the next pass.
    let startable: Vec<(WorkUnit, Epoch)> = state
        .desired
        .values()
        .filter(|a| !draining && !a.release_requested && !state.slots.contains_key(&a.unit))
        .map(|a| (a.unit.clone(), a.epoch))
        .collect();
    for (unit, epoch) in startable {
        start_pair(myself, state, &unit, epoch, None).await;
    }
    if state.slots.is_empty() {
        if let Some(reply) = state.draining.as_mut().and_then(Option::take) {
            let _ = reply.send(());
        }
    }
}

/// Spawns the reader/writer pair of a unit under `epoch`.
async fn start_pair<C: ControlPlane>(
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
    let (Some(source), Some(target)) = (
        state.args.clusters.get(&flow.source).cloned(),
        state.args.clusters.get(&flow.target).cloned(),
    ) else {
        return;
    };
    state.seeds = state.seeds.wrapping_add(1);
    let meters = state
        .meters
        .entry(unit.clone())
        .or_insert_with(|| {
            Arc::new(UnitMeters::new(
                &unit.flow,
                state.args.tuning.observer.clone(),
            ))
        })
        .clone();
    let span = tracing::info_span!(
        parent: None,
        "unit",
        node = %state.args.node_id,
        flow = %unit.flow,
        stream = %unit.stream,
        topic = %unit.topic,
        partition = unit.partition,
        epoch = %epoch,
    );
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
        span,
        seed: state.seeds,
    });
    let (tx, rx) = mpsc::channel(flow.channel_capacity);
    let (start_tx, start_rx) = oneshot::channel();
    let node = state.args.node_id;
    let mut slot = Slot {
        epoch,
        phase: Phase::Running {
            reader: None,
            writer: None,
            failed: false,
        },
        backoff: backoff.unwrap_or_else(|| Backoff::new(state.args.tuning.backoff, state.seeds)),
        started: Instant::now(),
    };
    let writer = DownstreamWriter::<C>::spawn_linked(
        Some(actor_name("writer", node, unit)),
        DownstreamWriter::new(),
        WriterArgs {
            shared: shared.clone(),
            rx,
            start: start_tx,
        },
        myself.get_cell(),
    )
    .await;
    let reader = match &writer {
        Ok(_) => Some(
            PartitionReader::<C>::spawn_linked(
                Some(actor_name("reader", node, unit)),
                PartitionReader::new(),
                ReaderArgs {
                    shared,
                    tx,
                    start: start_rx,
                },
                myself.get_cell(),
            )
            .await,
        ),
        Err(_) => None,
    };
    match (writer, reader) {
        (Ok((w, _)), Some(Ok((r, _)))) => {
            state
                .children
                .insert(w.get_id(), (unit.clone(), Role::Writer));
            state
                .children
                .insert(r.get_id(), (unit.clone(), Role::Reader));
            slot.phase = Phase::Running {
                reader: Some(r),
                writer: Some(w),
                failed: false,
            };
            tracing::info!(%unit, epoch = %epoch, "unit started");
            state.slots.insert(unit.clone(), slot);
        }
        (writer, reader) => {
            let err = match (&writer, &reader) {
                (Err(e), _) | (_, Some(Err(e))) => e.to_string(),
                _ => "unknown".into(),
            };
            if let Ok((w, _)) = writer {
                // The writer drains its (closed) channel and stops by itself; track it.
                state
                    .children
                    .insert(w.get_id(), (unit.clone(), Role::Writer));
                w.stop(Some("reader failed to start".into()));
                slot.phase = Phase::Running {
                    reader: None,
                    writer: Some(w),
                    failed: true,
                };
                state.slots.insert(unit.clone(), slot);
            } else {
                let delay = slot.backoff.next_delay();
                let (u, e) = (unit.clone(), epoch);
                let timer = myself.send_after(delay, move || CoordinatorMsg::RestartDue {
                    unit: u,
                    epoch: e,
                });
                slot.phase = Phase::Waiting { timer };
                state.slots.insert(unit.clone(), slot);
            }
            tracing::warn!(%unit, epoch = %epoch, error = %err, "could not start unit actors");
        }
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    fn a(epoch: u64, release_requested: bool) -> Assignment {
        Assignment {
            unit: WorkUnit::new("f", "s", "t", 0),
            epoch: Epoch(epoch),
            release_requested,
        }
    }

    #[test]
    fn unassigned_and_idle_does_nothing() {
        check!(decide(None, None, false) == Action::Nothing);
    }

    #[test]
    fn new_assignment_starts_a_pair() {
        check!(decide(None, Some(&a(3, false)), false) == Action::Start(Epoch(3)));
    }

    #[test]
    fn release_request_or_drain_without_pair_releases_at_once() {
        check!(decide(None, Some(&a(3, true)), false) == Action::Release(Epoch(3)));
        check!(decide(None, Some(&a(3, false)), true) == Action::Release(Epoch(3)));
    }

    #[test]
    fn running_pair_stops_without_release_when_revoked_or_regranted() {
        let running = Some((Epoch(3), PhaseKind::Running));
        check!(decide(running, None, false) == Action::Stop { release: false });
        check!(decide(running, Some(&a(4, false)), false) == Action::Stop { release: false });
        check!(decide(running, Some(&a(3, false)), false) == Action::Nothing);
    }

    #[test]
    fn running_pair_drains_and_releases_on_request_or_shutdown() {
        let running = Some((Epoch(3), PhaseKind::Running));
        check!(decide(running, Some(&a(3, true)), false) == Action::Stop { release: true });
        check!(decide(running, Some(&a(3, false)), true) == Action::Stop { release: true });
    }

    #[test]
    fn waiting_restart_is_cancelled_when_assignment_changes() {
        let waiting = Some((Epoch(3), PhaseKind::Waiting));
        check!(decide(waiting, Some(&a(3, false)), false) == Action::Nothing);
        check!(decide(waiting, None, false) == Action::Cancel { release: false });
        check!(decide(waiting, Some(&a(3, true)), false) == Action::Cancel { release: true });
    }

    #[test]
    fn stopping_pair_is_left_alone() {
        let stopping = Some((Epoch(3), PhaseKind::Stopping));
        check!(decide(stopping, Some(&a(9, false)), true) == Action::Nothing);
    }
}
