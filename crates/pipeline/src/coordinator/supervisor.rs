//! The root of the tree: starts the coordinator and the task supervisor (`tasks`) linked to
//! itself, and starts a new coordinator when it dies, after a backoff. A coordinator that keeps
//! dying (more than [`MAX_RESTARTS`] within [`RESTART_WINDOW`]), or a task supervisor that
//! escalates (one of its tasks kept dying), ends the tree: the supervisor stops and says so
//! ([`SupervisorArgs::gave_up`]); `iggy-replicator run` then exits with an error, so that
//! systemd or Kubernetes restarts the process (and `/health` fails meanwhile: no coordinator
//! answers the liveness watchdog any more, see `crate::liveness`).

use std::sync::{Arc, RwLock};
use std::time::Instant;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, MessagingErr, SupervisionEvent};

use super::child::{AbortOnDrop, ChildEnd, ChildRestarts};
use super::tasks::{Tasks, TasksArgs, TasksMsg};
use super::{Coordinator, CoordinatorArgs, CoordinatorMsg};
use crate::backoff::{MAX_RESTARTS, RESTART_WINDOW};
use crate::control::ControlPlane;

/// The coordinator currently running, for those that talk to it from outside the tree
/// (`Pipeline`, discovery, the watchdog): the supervisor replaces it on every restart.
#[derive(Clone, Default)]
pub(crate) struct CoordinatorHandle(Arc<RwLock<Option<ActorRef<CoordinatorMsg>>>>);

impl CoordinatorHandle {
    /// The coordinator now, if one runs.
    pub(crate) fn current(&self) -> Option<ActorRef<CoordinatorMsg>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sends `msg` to the coordinator now; false if none runs (it is being restarted).
    pub(crate) fn send(&self, msg: CoordinatorMsg) -> bool {
        self.current().is_some_and(|c| c.send_message(msg).is_ok())
    }

    fn set(&self, coordinator: Option<ActorRef<CoordinatorMsg>>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = coordinator;
    }
}

/// The supervisor actor (all state lives in [`SupervisorState`]).
pub(crate) struct Supervisor<C>(std::marker::PhantomData<fn() -> C>);

impl<C> Supervisor<C> {
    pub(crate) fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// What the supervisor starts with.
pub(crate) struct SupervisorArgs<C> {
    /// What every coordinator it starts gets.
    pub(crate) coordinator: CoordinatorArgs<C>,
    /// Where it publishes the coordinator running now.
    pub(crate) handle: CoordinatorHandle,
    /// What its task supervisor starts with.
    pub(crate) tasks: TasksArgs,
    /// Where it hands the task supervisor over, once started (for `Pipeline`'s shutdown).
    pub(crate) tasks_ref: tokio::sync::oneshot::Sender<ActorRef<TasksMsg>>,
    /// Cancelled when it gives up on the coordinator.
    pub(crate) gave_up: tokio_util::sync::CancellationToken,
}

/// Messages of the supervisor.
pub(crate) enum SupervisorMsg {
    /// From its backoff timer: start a new coordinator. No reply.
    RestartDue,
}

/// Runtime state of the supervisor.
pub(crate) struct SupervisorState<C> {
    /// What every coordinator it starts gets.
    coordinator: CoordinatorArgs<C>,
    handle: CoordinatorHandle,
    gave_up: tokio_util::sync::CancellationToken,
    /// The coordinator running now (its supervision events are told from the task
    /// supervisor's by this).
    running: Option<ActorId>,
    /// The coordinator's recent restarts.
    restarts: ChildRestarts,
    /// The restart timer while waiting.
    _timer: Option<AbortOnDrop<Result<(), MessagingErr<SupervisorMsg>>>>,
}

impl<C: ControlPlane> Actor for Supervisor<C> {
    type Msg = SupervisorMsg;
    type State = SupervisorState<C>;
    type Arguments = SupervisorArgs<C>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let SupervisorArgs {
            coordinator,
            handle,
            gave_up,
            tasks,
            tasks_ref,
        } = args;
        let restarts = ChildRestarts::new(coordinator.tuning.backoff, coordinator.node_id);
        let mut state = SupervisorState {
            coordinator,
            handle,
            gave_up,
            running: None,
            restarts,
            _timer: None,
        };
        start_coordinator(&myself, &mut state).await?;
        let (tasks, _) = Actor::spawn_linked(None, Tasks, tasks, myself.get_cell()).await?;
        // `Pipeline::start` waits for it; gone only if the start was abandoned.
        let _ = tasks_ref.send(tasks);
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.handle.set(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::RestartDue => {
                state._timer = None;
                start_coordinator(&myself, state).await
            }
        }
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((id, outcome)) = ChildEnd::of(event) else {
            return Ok(());
        };
        let node = state.coordinator.node_id;
        if state.running != Some(id) {
            // The task supervisor: it ends by itself only when it escalates.
            tracing::error!(
                node, outcome = %outcome,
                "the task supervisor gave up (a long-running task kept dying); stopping the \
                 pipeline (/health fails from now on)"
            );
            state.gave_up.cancel();
            myself.stop(Some("a long-running task keeps dying".to_owned()));
            return Ok(());
        }
        state.running = None;
        state.handle.set(None);
        let Some(delay) = state.restarts.after_end(Instant::now()) else {
            tracing::error!(
                node, outcome = %outcome, restarts = MAX_RESTARTS, window = ?RESTART_WINDOW,
                "coordinator keeps dying; not restarted again (/health fails from now on)"
            );
            state.gave_up.cancel();
            myself.stop(Some("coordinator keeps dying".to_owned()));
            return Ok(());
        };
        tracing::error!(
            node, outcome = %outcome, backoff = ?delay,
            "coordinator ended unexpectedly (the units stopped with it); restarting it"
        );
        let timer = myself.send_after(delay, || SupervisorMsg::RestartDue);
        state._timer = Some(AbortOnDrop(timer));
        Ok(())
    }
}

/// Starts a coordinator linked to the supervisor and publishes it.
async fn start_coordinator<C: ControlPlane>(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState<C>,
) -> Result<(), ActorProcessingErr> {
    let args = state.coordinator.clone();
    let (coordinator, _) =
        Actor::spawn_linked(None, Coordinator::new(), args, myself.get_cell()).await?;
    state.running = Some(coordinator.get_id());
    state.restarts.started(Instant::now());
    state.handle.set(Some(coordinator));
    Ok(())
}
