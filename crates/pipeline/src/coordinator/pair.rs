//! A unit's reader actor and writer actor, children of their flow's actor (`spawn_linked`).
//!
//! Each is a [`LoopActor`](super::loop_actor::LoopActor) owning one loop (`reader::run` or
//! `writer::run`), which awaits polls, sends and retries for as long as the unit runs. How the
//! loop ended reaches the flow actor as a supervision event, which decides what follows (see
//! `decide::after_pair_gone`). Batches go from the reader to the writer over the bounded
//! channel the flow actor hands both when it starts the pair, never through a mailbox.
//!
//! A clean stop goes through the pair's `CancellationToken` (the writer must send what is
//! queued and make its final commit first); killing the actor, or dropping its state, aborts
//! the loop at once.

use tokio_util::sync::CancellationToken;

use super::decide::Ended;
use super::loop_actor::Child;

/// Which actor of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Reader,
    Writer,
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
    /// Whether an actor panicked (counted against the unit's restart budget).
    pub(super) panicked: bool,
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
