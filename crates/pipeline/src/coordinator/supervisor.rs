//! The root of the data path's tree: starts the coordinator linked to itself and starts a new
//! one when it dies, after a backoff. A coordinator that keeps dying (more than
//! [`MAX_RESTARTS`] within [`RESTART_WINDOW`]) is not started again: the supervisor stops and
//! says so ([`SupervisorArgs::gave_up`]); `iggy-replicator run` then exits with an error, so
//! that systemd or Kubernetes restarts the process (and `/health` fails meanwhile: no
//! coordinator answers the liveness watchdog any more, see `crate::liveness`).

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, SupervisionEvent};

use super::{AbortOnDrop, ChildEnd, Coordinator, CoordinatorArgs, CoordinatorMsg};
use crate::backoff::Backoff;
use crate::control::ControlPlane;

/// Most coordinator restarts within [`RESTART_WINDOW`] before the supervisor gives up.
pub(crate) const MAX_RESTARTS: usize = 5;

/// The window [`MAX_RESTARTS`] counts in.
pub(crate) const RESTART_WINDOW: Duration = Duration::from_secs(60);

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
    args: SupervisorArgs<C>,
    /// When the coordinator was restarted, within the last [`RESTART_WINDOW`].
    restarts: VecDeque<Instant>,
    backoff: Backoff,
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
        let backoff = Backoff::new(args.coordinator.tuning.backoff, args.coordinator.node_id);
        let state = SupervisorState {
            args,
            restarts: VecDeque::new(),
            backoff,
            _timer: None,
        };
        start_coordinator(&myself, &state).await?;
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.args.handle.set(None);
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
        let Some((_, outcome)) = ChildEnd::of(event) else {
            return Ok(());
        };
        state.args.handle.set(None);
        let node = state.args.coordinator.node_id;
        let now = Instant::now();
        match restart_after(&mut state.restarts, now) {
            Restart::GiveUp => {
                tracing::error!(
                    node, outcome = %outcome, restarts = MAX_RESTARTS, window = ?RESTART_WINDOW,
                    "coordinator keeps dying; not restarted again (/health fails from now on)"
                );
                state.args.gave_up.cancel();
                myself.stop(Some("coordinator keeps dying".to_owned()));
            }
            Restart::After => {
                let delay = state.backoff.next_delay();
                tracing::error!(
                    node, outcome = %outcome, backoff = ?delay,
                    "coordinator ended unexpectedly (the units stopped with it); restarting it"
                );
                let timer = myself.send_after(delay, || SupervisorMsg::RestartDue);
                state._timer = Some(AbortOnDrop(timer));
            }
        }
        Ok(())
    }
}

/// Whether a coordinator that died at `now` is started again.
#[derive(Debug, PartialEq, Eq)]
enum Restart {
    After,
    GiveUp,
}

/// Records a restart at `now` unless [`MAX_RESTARTS`] happened within [`RESTART_WINDOW`].
fn restart_after(restarts: &mut VecDeque<Instant>, now: Instant) -> Restart {
    while restarts
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) > RESTART_WINDOW)
    {
        restarts.pop_front();
    }
    if restarts.len() >= MAX_RESTARTS {
        return Restart::GiveUp;
    }
    restarts.push_back(now);
    Restart::After
}

/// Starts a coordinator linked to the supervisor and publishes it.
async fn start_coordinator<C: ControlPlane>(
    myself: &ActorRef<SupervisorMsg>,
    state: &SupervisorState<C>,
) -> Result<(), ActorProcessingErr> {
    let args = state.args.coordinator.clone();
    let (coordinator, _) =
        Actor::spawn_linked(None, Coordinator::new(), args, myself.get_cell()).await?;
    state.args.handle.set(Some(coordinator));
    Ok(())
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn a_burst_of_deaths_is_restarted_up_to_the_budget_then_given_up() {
        let mut restarts = VecDeque::new();
        let t0 = Instant::now();
        for i in 0..MAX_RESTARTS {
            check!(
                restart_after(&mut restarts, t0 + Duration::from_secs(i as u64)) == Restart::After
            );
        }
        check!(restart_after(&mut restarts, t0 + Duration::from_secs(10)) == Restart::GiveUp);
    }

    #[test]
    fn deaths_spread_wider_than_the_window_are_always_restarted() {
        let mut restarts = VecDeque::new();
        let t0 = Instant::now();
        for i in 0..(3 * MAX_RESTARTS) as u64 {
            let at = t0 + RESTART_WINDOW / 2 * u32::try_from(i).unwrap_or(0);
            check!(restart_after(&mut restarts, at) == Restart::After);
        }
    }
}
