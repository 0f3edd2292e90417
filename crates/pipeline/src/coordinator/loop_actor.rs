//! An actor that owns one long-running loop and runs it as a task of its own: the readers and
//! writers of pairs (`pair`) and the long-running tasks beside the data path (`tasks`).
//!
//! The loop awaits the network for as long as it runs, and an actor's handler never awaits that
//! long, so the actor only starts the loop and learns its end through its mailbox. It then ends
//! the same way (it stops with the loop's reason, or fails with its error or panic), and ractor
//! reports that to its parent as a supervision event: the parent decides what follows.

use std::future::Future;
use std::pin::Pin;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::child::{AbortOnDrop, Alive, LoopPanicked};
use crate::error::Result;

/// The work of one actor: a unit's reader or writer loop, or a long-running task (see
/// `tasks`); it returns why it stopped, or the error it gave up on.
pub(super) type ActorLoop = Pin<Box<dyn Future<Output = Result<&'static str>> + Send>>;

/// An actor that owns one loop (all state lives in [`LoopActorState`]).
pub(super) struct LoopActor;

/// What a loop actor starts with.
pub(super) struct LoopActorArgs {
    /// The loop's span (`reader` or `writer` under the unit's, or the task's).
    pub(super) span: tracing::Span,
    /// Held by the loop until it is gone (see [`Alive`]).
    pub(super) alive: Alive,
    pub(super) work: ActorLoop,
}

/// Messages of a loop actor.
pub(super) enum LoopMsg {
    /// From its own loop, as the loop ends (also when it panicked). No reply.
    Ended(LoopEnd),
}

/// How the loop ended, as its actor learns it.
pub(super) enum LoopEnd {
    Returned(Result<&'static str>),
    Panicked,
}

/// State of a loop actor.
pub(super) struct LoopActorState {
    /// The loop; aborted when the actor goes away first (killed with its parent).
    _task: AbortOnDrop<()>,
}

/// Sends the loop's end to its actor on drop unless the loop returned and sent it itself.
struct EndGuard(Option<ActorRef<LoopMsg>>);

impl EndGuard {
    fn send(&mut self, end: LoopEnd) {
        if let Some(actor) = self.0.take() {
            // Nobody to tell once the actor is gone (killed with its parent).
            let _ = actor.send_message(LoopMsg::Ended(end));
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.send(LoopEnd::Panicked);
    }
}

impl Actor for LoopActor {
    type Msg = LoopMsg;
    type State = LoopActorState;
    type Arguments = LoopActorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let LoopActorArgs { span, alive, work } = args;
        let mut guard = EndGuard(Some(myself));
        let task = tokio::spawn(
            async move {
                let _alive = alive;
                let end = work.await;
                guard.send(LoopEnd::Returned(end));
            }
            .instrument(span),
        );
        Ok(LoopActorState {
            _task: AbortOnDrop(task),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LoopMsg::Ended(LoopEnd::Returned(Ok(reason))) => {
                myself.stop(Some(reason.to_owned()));
                Ok(())
            }
            LoopMsg::Ended(LoopEnd::Returned(Err(err))) => Err(Box::new(err)),
            LoopMsg::Ended(LoopEnd::Panicked) => Err(Box::new(LoopPanicked)),
        }
    }
}

/// A loop actor, killed when dropped (a pair dropped without ending, with its flow actor's
/// state, takes its actors along; so does a task supervisor's state).
pub(super) struct Child(pub(super) ActorRef<LoopMsg>);

impl Drop for Child {
    fn drop(&mut self) {
        self.0.kill();
    }
}
