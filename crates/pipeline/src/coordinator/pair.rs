//! A unit's reader actor and writer actor, children of their flow's actor (`spawn_linked`).
//!
//! Each actor owns one loop (`reader::run` or `writer::run`) and runs it as a task of its own:
//! the loop awaits polls, sends and retries for as long as the unit runs, and an actor's
//! handler never awaits that long. The actor's mailbox carries the loop's end; the actor then
//! ends the same way (it stops with the loop's reason, or fails with its error or panic), and
//! ractor reports that to the flow actor as a supervision event, which decides what follows
//! (see `decide::after_pair_gone`). Batches go from the reader to the writer over the bounded
//! channel the flow actor hands both when it starts the pair, never through a mailbox.
//!
//! A clean stop goes through the pair's `CancellationToken` (the writer must send what is
//! queued and make its final commit first); killing the actor, or dropping its state, aborts
//! the loop at once.

use std::future::Future;
use std::pin::Pin;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::decide::Ended;
use super::{AbortOnDrop, Alive};
use crate::error::Result;

/// Which actor of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Reader,
    Writer,
}

/// The work of one actor: the unit's reader or writer loop.
pub(super) type UnitLoop = Pin<Box<dyn Future<Output = Result<&'static str>> + Send>>;

/// The reader or writer actor of one unit (all state lives in [`UnitTaskState`]).
pub(super) struct UnitTask;

/// What a reader or writer actor starts with.
pub(super) struct UnitTaskArgs {
    /// The loop's span (`reader` or `writer` under the unit's).
    pub(super) span: tracing::Span,
    /// Held by the loop until it is gone (see [`Alive`]).
    pub(super) alive: Alive,
    pub(super) work: UnitLoop,
}

/// Messages of a reader or writer actor.
pub(super) enum UnitTaskMsg {
    /// From its own loop, as the loop ends (also when it panicked). No reply.
    Ended(LoopEnd),
}

/// How the loop ended, as its actor learns it.
pub(super) enum LoopEnd {
    Returned(Result<&'static str>),
    Panicked,
}

/// The error a reader or writer actor fails with when its loop panicked.
#[derive(Debug, thiserror::Error)]
#[error("the loop panicked")]
pub(super) struct LoopPanicked;

/// State of a reader or writer actor.
pub(super) struct UnitTaskState {
    /// The loop; aborted when the actor goes away first (killed with its flow actor).
    _task: AbortOnDrop<()>,
}

/// Sends the loop's end to its actor on drop unless the loop returned and sent it itself.
struct EndGuard(Option<ActorRef<UnitTaskMsg>>);

impl EndGuard {
    fn send(&mut self, end: LoopEnd) {
        if let Some(actor) = self.0.take() {
            // Nobody to tell once the actor is gone (killed with its flow actor).
            let _ = actor.send_message(UnitTaskMsg::Ended(end));
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.send(LoopEnd::Panicked);
    }
}

impl Actor for UnitTask {
    type Msg = UnitTaskMsg;
    type State = UnitTaskState;
    type Arguments = UnitTaskArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let UnitTaskArgs { span, alive, work } = args;
        let mut guard = EndGuard(Some(myself));
        let task = tokio::spawn(
            async move {
                let _alive = alive;
                let end = work.await;
                guard.send(LoopEnd::Returned(end));
            }
            .instrument(span),
        );
        Ok(UnitTaskState {
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
            UnitTaskMsg::Ended(LoopEnd::Returned(Ok(reason))) => {
                myself.stop(Some(reason.to_owned()));
                Ok(())
            }
            UnitTaskMsg::Ended(LoopEnd::Returned(Err(err))) => Err(Box::new(err)),
            UnitTaskMsg::Ended(LoopEnd::Panicked) => Err(Box::new(LoopPanicked)),
        }
    }
}

/// A reader or writer actor, killed when dropped (a pair dropped without ending, with its
/// flow actor's state, takes its actors along).
pub(super) struct Child(pub(super) ActorRef<UnitTaskMsg>);

impl Drop for Child {
    fn drop(&mut self) {
        self.0.kill();
    }
}

/// A running reader/writer pair, until both of its actors ended.
pub(super) struct Pair {
    /// Tells the ends of this pair's actors from those of an earlier pair of the same unit.
    pub(super) id: u64,
    /// Cancelled to stop the pair cleanly.
    pub(super) stop: CancellationToken,
    /// The reader actor, until it ended.
    pub(super) reader: Option<Child>,
    /// The writer actor, until it ended.
    pub(super) writer: Option<Child>,
    /// Whether an actor failed or panicked (as opposed to stopping), for the restart log.
    pub(super) failed: bool,
    /// How the pair will have ended once both actors are gone: by itself, unless the flow
    /// actor asked it to stop (and whether to release the unit afterwards).
    pub(super) ending: Ended,
}

impl Pair {
    /// Forgets the actor of `role`, which ended (killing it again on drop is harmless).
    pub(super) fn ended(&mut self, role: Role) {
        match role {
            Role::Reader => self.reader = None,
            Role::Writer => self.writer = None,
        }
    }
}
