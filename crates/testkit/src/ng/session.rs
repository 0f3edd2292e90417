//! What a 0.9 connection's steps share: its [`NgSession`] and the [`Answer`] each request gets.

use crate::handlers::Session;
use crate::replica::Seat;
use iggy09_binary_protocol::consensus::EvictionReason;

/// One connection's session: the 0.8 session the handlers judge requests by, and the consensus
/// session number the register handshake handed out.
pub(crate) struct NgSession {
    /// Client id and logged-in user, as the shared handlers know them.
    pub(crate) inner: Session,
    /// The session bound by the last successful register, if any.
    pub(crate) bound: Option<u64>,
    /// The replica this connection reached, when the server is one of a test cluster.
    pub(crate) seat: Option<Seat>,
}

/// What the server does with one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A reply with this header status. With status 0 the body is what the request wrote after
    /// the header's place in the output (result section included where the operation has
    /// one); any other status goes with an empty body.
    Reply(u32),
    /// The session ends with this reason.
    Evict(EvictionReason),
    /// No answer at all (a frame the server drops).
    Drop,
}

/// A reply whose body is what was written to the output.
pub(crate) const OK: Answer = Answer::Reply(0);
