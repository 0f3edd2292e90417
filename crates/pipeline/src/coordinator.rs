//! `Coordinator`: follows this node's assignments, runs one reader/writer pair per assigned
//! unit, stops pairs cleanly when units are revoked or released, and restarts failed pairs with
//! bounded exponential backoff plus jitter.
//!
//! Its handlers never wait for the control plane: a unit is handed back (`release`) by a task
//! of its own, at most one per unit, which reports the outcome as [`CoordinatorMsg::Released`].
//! Statistics are read from the shared [`MeterRegistry`], not through the mailbox.

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
use crate::control::{ControlError, ControlPlane};
use crate::mapping::downstream_stream;
use crate::params::FlowParams;
use crate::reader::{PartitionReader, ReaderArgs, ReaderMsg};
use crate::stats::{MeterRegistry, UnitMeters};
use crate::unit::{actor_name, UnitShared, UnitTuning};
use crate::writer::{DownstreamWriter, WriterArgs, WriterMsg};

/// A pair that ran at least this long before ending restarts from the initial backoff.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);

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
    /// From `Pipeline::shutdown`: stop every unit cleanly (final commit, then release); replies
    /// when every unit is stopped and every release was attempted.
    Drain(RpcReplyPort<()>),
    /// From a release task of the coordinator: handing `unit` back under `epoch` finished with
    /// `result`. No reply.
    Released {
        /// The unit.
        unit: WorkUnit,
        /// The epoch released.
        epoch: Epoch,
        /// What the control plane answered.
        result: Result<(), ControlError>,
    },
    /// From a retry timer of the coordinator: try the failed release of `unit` under `epoch`
    /// again if the leader still asks for it. No reply.
    ReleaseRetryDue {
        /// The unit.
        unit: WorkUnit,
        /// The epoch whose release failed.
        epoch: Epoch,
    },
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
    /// Where the meters of every started unit are registered (shared with `Pipeline::stats`).
    pub(crate) meters: MeterRegistry,
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

/// How a unit's pair ended, once both of its actors are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The pair stopped by itself (an actor failed, or stopped on a fence or a stale epoch).
    ByItself,
    /// The coordinator stopped it; `release` hands the unit back afterwards.
    Stopped {
        /// Release after the final commit.
        release: bool,
    },
}

/// What follows the end of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterPair {
    /// Forget the slot; `reconcile` decides what comes next from the assignments.
    Remove,
    /// Forget the slot and hand the unit back under this epoch (the final commit is done).
    Release(Epoch),
    /// The unit is still ours: restart the pair after a backoff, reset first when the pair
    /// had run for at least [`BACKOFF_RESET_AFTER`].
    Restart {
        /// Start the backoff again from its initial delay.
        reset_backoff: bool,
    },
}

/// Decides what follows the end of the pair of a unit that ran under `epoch` for `ran_for`.
pub(crate) fn after_pair_gone(
    ended: Ended,
    epoch: Epoch,
    desired: Option<&Assignment>,
    draining: bool,
    ran_for: Duration,
) -> AfterPair {
    match ended {
        Ended::Stopped { release: true } => AfterPair::Release(epoch),
        Ended::Stopped { release: false } => AfterPair::Remove,
        // Ownership moved on (or the node drains): nothing to restart.
        Ended::ByItself
            if draining || desired.is_none_or(|a| a.epoch != epoch || a.release_requested) =>
        {
            AfterPair::Remove
        }
        Ended::ByItself => AfterPair::Restart {
            reset_backoff: ran_for >= BACKOFF_RESET_AFTER,
        },
    }
}

/// Where the hand-back of a unit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseState {
    /// A release task runs for `epoch`; `queued` is a newer epoch to release after it.
    InFlight {
        /// The epoch being released.
        epoch: Epoch,
        /// A newer epoch to release once this one is done.
        queued: Option<Epoch>,
    },
    /// `epoch` was released (the assignments may still show it until they catch up).
    Released {
        /// The epoch released.
        epoch: Epoch,
    },
    /// Releasing `epoch` failed; a timer retries it unless the node drains.
    Failed {
        /// The epoch whose release failed.
        epoch: Epoch,
    },
}

impl ReleaseState {
    /// Whether `epoch` is being or has been handed back (no pair may start under it).
    fn covers(self, epoch: Epoch) -> bool {
        match self {
            Self::InFlight { epoch: e, queued } => e == epoch || queued == Some(epoch),
            Self::Released { epoch: e } => e == epoch,
            Self::Failed { .. } => false,
        }
    }
}

/// What to do when a unit is to be handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleasePlan {
    /// Start a release task for this epoch.
    Spawn(Epoch),
    /// Release this epoch once the release in flight is done (one task per unit at most).
    Queue(Epoch),
    /// Nothing to do: this epoch (or a newer one) is released, being released, or failed and
    /// waits for its retry timer.
    Skip,
}

/// Decides how to hand `unit` back under `epoch`, given where its hand-back stands.
pub(crate) fn plan_release(current: Option<ReleaseState>, epoch: Epoch) -> ReleasePlan {
    match current {
        None => ReleasePlan::Spawn(epoch),
        Some(ReleaseState::InFlight {
            epoch: running,
            queued,
        }) => {
            if epoch <= running || queued.is_some_and(|q| q >= epoch) {
                ReleasePlan::Skip
            } else {
                ReleasePlan::Queue(epoch)
            }
        }
        Some(ReleaseState::Released { epoch: done } | ReleaseState::Failed { epoch: done })
            if epoch <= done =>
        {
            ReleasePlan::Skip
        }
        Some(ReleaseState::Released { .. } | ReleaseState::Failed { .. }) => {
            ReleasePlan::Spawn(epoch)
        }
    }
}

/// What follows a finished release task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseFollowUp {
    /// Nothing.
    Nothing,
    /// Start the release of the queued epoch.
    Spawn(Epoch),
    /// Arm the retry timer of the failed release.
    RetryLater,
}

/// The new hand-back state after the release of `epoch` finished (`ok`: it succeeded), and
/// what to do next. A drain attempts each release once, so a failure while draining is not
/// retried; a report that matches no release in flight (a forgotten one) changes nothing.
pub(crate) fn release_finished(
    current: Option<ReleaseState>,
    epoch: Epoch,
    ok: bool,
    draining: bool,
) -> (Option<ReleaseState>, ReleaseFollowUp) {
    match current {
        Some(ReleaseState::InFlight {
            epoch: running,
            queued,
        }) if running == epoch => match queued {
            Some(next) => (
                Some(ReleaseState::InFlight {
                    epoch: next,
                    queued: None,
                }),
                ReleaseFollowUp::Spawn(next),
            ),
            None if ok => (
                Some(ReleaseState::Released { epoch }),
                ReleaseFollowUp::Nothing,
            ),
            None if draining => (
                Some(ReleaseState::Failed { epoch }),
                ReleaseFollowUp::Nothing,
            ),
            None => (
                Some(ReleaseState::Failed { epoch }),
                ReleaseFollowUp::RetryLater,
            ),
        },
        other => (other, ReleaseFollowUp::Nothing),
    }
}

/// What a release retry timer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryPlan {
    /// Release again.
    Spawn,
    /// The leader no longer asks for it: forget the failure.
    Forget,
    /// A stale timer, or the node drains (the drain made its own attempt).
    Nothing,
}

/// Decides what the retry timer of the failed release of `epoch` does.
pub(crate) fn retry_release(
    current: Option<ReleaseState>,
    epoch: Epoch,
    desired: Option<&Assignment>,
    draining: bool,
) -> RetryPlan {
    if current != Some(ReleaseState::Failed { epoch }) || draining {
        return RetryPlan::Nothing;
    }
    if desired.is_some_and(|a| a.epoch == epoch && a.release_requested) {
        RetryPlan::Spawn
    } else {
        RetryPlan::Forget
    }
}

/// Whether to keep a finished hand-back record when the assignments change: a release in
/// flight always, a finished one while the assignments still show its epoch (so that a stale
/// view does not release it again).
fn keep_release(state: ReleaseState, desired: Option<&Assignment>) -> bool {
    match state {
        ReleaseState::InFlight { .. } => true,
        ReleaseState::Released { epoch } | ReleaseState::Failed { epoch } => {
            desired.is_some_and(|a| a.epoch == epoch)
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

/// The hand-back of one unit.
struct ReleaseSlot {
    /// Where it stands.
    state: ReleaseState,
    /// The release task in flight; it reports with [`CoordinatorMsg::Released`].
    task: Option<AbortOnDrop<()>>,
    /// The retry timer of a failed release.
    retry: Option<AbortOnDrop<Result<(), ractor::MessagingErr<CoordinatorMsg>>>>,
    /// Retry backoff (reset by a success).
    backoff: Backoff,
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
    /// Hand-backs in flight, done (until the assignments catch up) or waiting for a retry.
    releases: BTreeMap<WorkUnit, ReleaseSlot>,
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
            releases: BTreeMap::new(),
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
        // Aborts releases still in flight (only after a drain that ran out of time).
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
        async {
            match msg {
                CoordinatorMsg::Assignments(list) => {
                    state.desired = list.into_iter().map(|a| (a.unit.clone(), a)).collect();
                    let desired = &state.desired;
                    state
                        .releases
                        .retain(|unit, r| keep_release(r.state, desired.get(unit)));
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
                    // A drain attempts every release once more, also those that failed before.
                    state
                        .releases
                        .retain(|_, r| !matches!(r.state, ReleaseState::Failed { .. }));
                    reconcile(&myself, state).await;
                }
                CoordinatorMsg::Released {
                    unit,
                    epoch,
                    result,
                } => {
                    released(&myself, state, unit, epoch, result);
                    finish_drain_if_done(state);
                }
                CoordinatorMsg::ReleaseRetryDue { unit, epoch } => {
                    let current = state.releases.get(&unit).map(|r| r.state);
                    let draining = state.draining.is_some();
                    match retry_release(current, epoch, state.desired.get(&unit), draining) {
                        RetryPlan::Spawn => spawn_release(&myself, state, &unit, epoch),
                        RetryPlan::Forget => {
                            state.releases.remove(&unit);
                        }
                        RetryPlan::Nothing => {}
                    }
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
    let (reader, writer, ended) = match &mut slot.phase {
        Phase::Running {
            reader,
            writer,
            failed,
        } => {
            *failed |= failed_now;
            (reader, writer, Ended::ByItself)
        }
        Phase::Stopping {
            reader,
            writer,
            release,
        } => {
            let ended = Ended::Stopped { release: *release };
            (reader, writer, ended)
        }
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
    let failed = matches!(slot.phase, Phase::Running { failed: true, .. });
    match after_pair_gone(
        ended,
        epoch,
        state.desired.get(unit),
        state.draining.is_some(),
        slot.started.elapsed(),
    ) {
        AfterPair::Remove => {
            state.slots.remove(unit);
            reconcile(myself, state).await;
        }
        AfterPair::Release(epoch) => {
            state.slots.remove(unit);
            request_release(myself, state, unit, epoch);
            reconcile(myself, state).await;
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
            slot.phase = Phase::Waiting { timer };
        }
    }
}

/// Hands `unit` back under `epoch` by a task of its own (at most one per unit; a newer epoch
/// waits for the one in flight). The handler never waits for the control plane.
fn request_release<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    unit: &WorkUnit,
    epoch: Epoch,
) {
    let current = state.releases.get(unit).map(|r| r.state);
    match plan_release(current, epoch) {
        ReleasePlan::Spawn(epoch) => spawn_release(myself, state, unit, epoch),
        ReleasePlan::Queue(epoch) => {
            if let Some(ReleaseSlot {
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

/// Starts the release task of `unit` under `epoch`; it reports with [`CoordinatorMsg::Released`].
fn spawn_release<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    unit: &WorkUnit,
    epoch: Epoch,
) {
    let control = state.args.control.clone();
    let me = myself.clone();
    let (u, span) = (unit.clone(), state.span.clone());
    let task = tokio::spawn(
        async move {
            let result = control.release(u.clone(), epoch).await;
            // The coordinator may be gone (a drain that ran out of time); nobody to tell then.
            let _ = me.send_message(CoordinatorMsg::Released {
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
        .or_insert_with(|| ReleaseSlot {
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
fn released<C: ControlPlane>(
    myself: &ActorRef<CoordinatorMsg>,
    state: &mut CoordinatorState<C>,
    unit: WorkUnit,
    epoch: Epoch,
    result: Result<(), ControlError>,
) {
    match &result {
        Ok(()) => tracing::info!(%unit, epoch = %epoch, "unit released"),
        Err(err) => tracing::warn!(%unit, epoch = %epoch, error = %err, "release failed"),
    }
    let current = state.releases.get(&unit).map(|r| r.state);
    let draining = state.draining.is_some();
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
                let timer = myself.send_after(delay, move || CoordinatorMsg::ReleaseRetryDue {
                    unit: u,
                    epoch,
                });
                slot.retry = Some(AbortOnDrop(timer));
            }
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
        if let Some(reply) = state.draining.as_mut().and_then(Option::take) {
            let _ = reply.send(());
        }
    }
}

/// Whether `epoch` of `unit` is being or has been handed back: no pair starts under it.
fn handing_back<C>(state: &CoordinatorState<C>, unit: &WorkUnit, epoch: Epoch) -> bool {
    state
        .releases
        .get(unit)
        .is_some_and(|r| r.state.covers(epoch))
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
            Action::Start(epoch) if handing_back(state, &unit, epoch) => {}
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
                        request_release(myself, state, &unit, slot.epoch);
                    }
                }
            }
            Action::Release(epoch) => request_release(myself, state, &unit, epoch),
        }
    }
    // A new epoch for a unit whose old pair just went away starts on the next pass.
    let startable: Vec<(WorkUnit, Epoch)> = state
        .desired
        .values()
        .filter(|a| {
            !draining
                && !a.release_requested
                && !state.slots.contains_key(&a.unit)
                && !handing_back(state, &a.unit, a.epoch)
        })
        .map(|a| (a.unit.clone(), a.epoch))
        .collect();
    for (unit, epoch) in startable {
        start_pair(myself, state, &unit, epoch, None).await;
    }
    finish_drain_if_done(state);
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
    let observer = state.args.tuning.observer.clone();
    let meters = state
        .args
        .meters
        .get_or_insert(unit, || UnitMeters::new(&unit.flow, observer));
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

    const SHORT: Duration = Duration::from_secs(1);

    #[test]
    fn pair_stopped_for_release_is_released_under_its_own_epoch() {
        let stopped = Ended::Stopped { release: true };
        // Also when the assignments already moved on: the final commit was made under it.
        check!(
            after_pair_gone(stopped, Epoch(3), Some(&a(3, true)), false, SHORT)
                == AfterPair::Release(Epoch(3))
        );
        check!(
            after_pair_gone(stopped, Epoch(3), None, true, SHORT) == AfterPair::Release(Epoch(3))
        );
    }

    #[test]
    fn pair_stopped_without_release_is_removed() {
        let stopped = Ended::Stopped { release: false };
        check!(
            after_pair_gone(stopped, Epoch(3), Some(&a(3, false)), false, SHORT)
                == AfterPair::Remove
        );
        check!(after_pair_gone(stopped, Epoch(3), None, false, SHORT) == AfterPair::Remove);
    }

    #[test]
    fn pair_that_ended_by_itself_restarts_while_still_owned() {
        let ended = Ended::ByItself;
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(3, false)), false, SHORT)
                == (AfterPair::Restart {
                    reset_backoff: false
                })
        );
        // Exactly the reset threshold resets (`>=` → `>` would keep growing the backoff).
        check!(
            after_pair_gone(
                ended,
                Epoch(3),
                Some(&a(3, false)),
                false,
                BACKOFF_RESET_AFTER
            ) == (AfterPair::Restart {
                reset_backoff: true
            })
        );
        check!(
            after_pair_gone(
                ended,
                Epoch(3),
                Some(&a(3, false)),
                false,
                BACKOFF_RESET_AFTER - SHORT
            ) == (AfterPair::Restart {
                reset_backoff: false
            })
        );
    }

    #[test]
    fn pair_that_ended_by_itself_is_removed_once_ownership_moved_on() {
        let ended = Ended::ByItself;
        // Revoked, re-granted under another epoch, release requested, or the node drains.
        check!(after_pair_gone(ended, Epoch(3), None, false, SHORT) == AfterPair::Remove);
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(4, false)), false, SHORT) == AfterPair::Remove
        );
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(3, true)), false, SHORT) == AfterPair::Remove
        );
        check!(
            after_pair_gone(ended, Epoch(3), Some(&a(3, false)), true, SHORT) == AfterPair::Remove
        );
    }

    fn in_flight(epoch: u64, queued: Option<u64>) -> Option<ReleaseState> {
        Some(ReleaseState::InFlight {
            epoch: Epoch(epoch),
            queued: queued.map(Epoch),
        })
    }

    #[test]
    fn first_release_of_a_unit_spawns_a_task() {
        check!(plan_release(None, Epoch(3)) == ReleasePlan::Spawn(Epoch(3)));
    }

    #[test]
    fn at_most_one_release_per_unit_is_in_flight() {
        // The same (or an older) epoch again: already on its way.
        check!(plan_release(in_flight(3, None), Epoch(3)) == ReleasePlan::Skip);
        check!(plan_release(in_flight(3, None), Epoch(2)) == ReleasePlan::Skip);
        // A newer epoch waits for the one in flight; a second request for it changes nothing.
        check!(plan_release(in_flight(3, None), Epoch(5)) == ReleasePlan::Queue(Epoch(5)));
        check!(plan_release(in_flight(3, Some(5)), Epoch(5)) == ReleasePlan::Skip);
        check!(plan_release(in_flight(3, Some(5)), Epoch(4)) == ReleasePlan::Skip);
        check!(plan_release(in_flight(3, Some(5)), Epoch(6)) == ReleasePlan::Queue(Epoch(6)));
    }

    #[test]
    fn a_finished_release_is_not_repeated_for_a_stale_view() {
        let released = Some(ReleaseState::Released { epoch: Epoch(3) });
        let failed = Some(ReleaseState::Failed { epoch: Epoch(3) });
        check!(plan_release(released, Epoch(3)) == ReleasePlan::Skip);
        // A failed one waits for its retry timer rather than looping on every reconcile.
        check!(plan_release(failed, Epoch(3)) == ReleasePlan::Skip);
        check!(plan_release(released, Epoch(4)) == ReleasePlan::Spawn(Epoch(4)));
        check!(plan_release(failed, Epoch(4)) == ReleasePlan::Spawn(Epoch(4)));
    }

    #[test]
    fn finished_release_starts_the_queued_one_or_records_the_outcome() {
        check!(
            release_finished(in_flight(3, Some(5)), Epoch(3), true, false)
                == (in_flight(5, None), ReleaseFollowUp::Spawn(Epoch(5)))
        );
        check!(
            release_finished(in_flight(3, None), Epoch(3), true, false)
                == (
                    Some(ReleaseState::Released { epoch: Epoch(3) }),
                    ReleaseFollowUp::Nothing
                )
        );
        check!(
            release_finished(in_flight(3, None), Epoch(3), false, false)
                == (
                    Some(ReleaseState::Failed { epoch: Epoch(3) }),
                    ReleaseFollowUp::RetryLater
                )
        );
    }

    #[test]
    fn failed_release_during_a_drain_is_not_retried() {
        check!(
            release_finished(in_flight(3, None), Epoch(3), false, true)
                == (
                    Some(ReleaseState::Failed { epoch: Epoch(3) }),
                    ReleaseFollowUp::Nothing
                )
        );
    }

    #[test]
    fn report_of_a_forgotten_release_changes_nothing() {
        check!(release_finished(None, Epoch(3), true, false) == (None, ReleaseFollowUp::Nothing));
        check!(
            release_finished(in_flight(5, None), Epoch(3), false, false)
                == (in_flight(5, None), ReleaseFollowUp::Nothing)
        );
    }

    #[test]
    fn retry_releases_again_only_while_the_leader_still_asks() {
        let failed = Some(ReleaseState::Failed { epoch: Epoch(3) });
        check!(retry_release(failed, Epoch(3), Some(&a(3, true)), false) == RetryPlan::Spawn);
        check!(retry_release(failed, Epoch(3), Some(&a(3, false)), false) == RetryPlan::Forget);
        check!(retry_release(failed, Epoch(3), Some(&a(4, true)), false) == RetryPlan::Forget);
        check!(retry_release(failed, Epoch(3), None, false) == RetryPlan::Forget);
        // Draining: the drain made its own attempt. Stale timers do nothing.
        check!(retry_release(failed, Epoch(3), Some(&a(3, true)), true) == RetryPlan::Nothing);
        check!(
            retry_release(in_flight(3, None), Epoch(3), Some(&a(3, true)), false)
                == RetryPlan::Nothing
        );
        check!(retry_release(failed, Epoch(2), Some(&a(2, true)), false) == RetryPlan::Nothing);
    }

    #[test]
    fn release_records_are_kept_while_the_assignments_show_their_epoch() {
        let released = ReleaseState::Released { epoch: Epoch(3) };
        check!(keep_release(released, Some(&a(3, true))));
        check!(!keep_release(released, None));
        check!(!keep_release(released, Some(&a(4, false))));
        let running = ReleaseState::InFlight {
            epoch: Epoch(3),
            queued: None,
        };
        check!(keep_release(running, None));
    }

    #[test]
    fn no_pair_starts_under_an_epoch_being_handed_back() {
        let queued = in_flight(3, Some(5)).expect("in flight");
        check!(queued.covers(Epoch(3)));
        check!(queued.covers(Epoch(5)));
        check!(!queued.covers(Epoch(4)));
        let released = ReleaseState::Released { epoch: Epoch(3) };
        let failed = ReleaseState::Failed { epoch: Epoch(3) };
        check!(released.covers(Epoch(3)));
        check!(!failed.covers(Epoch(3)));
    }
}
