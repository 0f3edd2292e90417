//! The 0.9 generation of the protocol (Iggy server 0.9, "server-ng", spoken by SDK 0.11) over
//! the same state, storage and command semantics as the 0.8 codec.
//!
//! A 0.9 server is a consensus replica; a single test server stands for a cluster of one, so
//! every operation commits at once and there is no view change to survive. What a client sees
//! of the generation is its framing and its bodies, and that is what this module owns:
//! * `frame`: the 256-byte headers, result sections and evictions (pure);
//! * `login`: the register handshake (version check, credentials or token) and logout;
//! * `translate`: each command's 0.9 body turned into the 0.8 body the shared handler
//!   (`crate::handlers`) judges and applies, and the handler's answer turned into the 0.9
//!   answer. Where both generations encode a command alike the body passes unchanged; where they
//!   differ (options blocks, message batches, the ack byte of offset writes) the two crates'
//!   typed codecs convert it field by field.
//!
//! Requests on a connection are strictly sequential, as with the 0.8 codec, and each frame is
//! read whole before it is judged.

mod frame;
mod login;
mod messages;
mod translate;

use crate::connection::{fill, respond};
use crate::faults::FaultState;
use crate::handlers::{send_destination, Session, Shared};
use crate::wire::{command, status};
use bytes::{Buf, BytesMut};
use frame::{HeaderError, HEADER};
use iggy09_binary_protocol::codes::{LOGIN_USER_CODE, LOGIN_WITH_PERSONAL_ACCESS_TOKEN_CODE};
use iggy09_binary_protocol::consensus::{EvictionReason, Operation, RequestHeader};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// PING: the one command served before a login.
const PING: u32 = 1;

/// One connection's session: the 0.8 session the handlers judge requests by, and the consensus
/// session number the register handshake handed out.
pub(crate) struct NgSession {
    /// Client id and logged-in user, as the shared handlers know them.
    pub(crate) inner: Session,
    /// The session bound by the last successful register, if any.
    pub(crate) bound: Option<u64>,
}

/// What the server does with one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A reply with a header status (0 = the body is the answer).
    Reply {
        /// Header status.
        status: u32,
        /// The body, result section included where the operation has one.
        body: Vec<u8>,
    },
    /// The session ends with this reason.
    Evict(EvictionReason),
    /// No answer at all (a frame the server drops).
    Drop,
}

impl Answer {
    /// A reply with status 0 and `body`.
    fn ok(body: Vec<u8>) -> Self {
        Self::Reply { status: 0, body }
    }

    /// A denial in the header status, with an empty body.
    fn deny(status: u32) -> Self {
        Self::Reply {
            status,
            body: Vec::new(),
        }
    }
}

/// Serves `stream` with the 0.9 codec until the peer closes it, an I/O error occurs or `cancel`
/// fires.
pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    faults: Arc<FaultState>,
    cancel: CancellationToken,
) {
    let client_id = shared.state.add_client(peer);
    let mut session = NgSession {
        inner: Session {
            client_id,
            user_id: None,
            port: stream.local_addr().map_or(0, |a| a.port()),
        },
        bound: None,
    };
    if let Err(e) = run(&mut stream, &mut session, &shared, &faults, &cancel).await {
        tracing::debug!(peer = %peer, error = %e, "0.9 connection closed with error");
    }
    shared.state.remove_client(client_id);
}

async fn run(
    stream: &mut TcpStream,
    session: &mut NgSession,
    shared: &Shared,
    faults: &FaultState,
    cancel: &CancellationToken,
) -> io::Result<()> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        if !fill(stream, &mut buf, HEADER, cancel).await? {
            return Ok(());
        }
        let mut raw = [0u8; HEADER];
        raw.copy_from_slice(&buf[..HEADER]);
        let Ok(size) = frame::frame_size(&raw) else {
            tracing::debug!("0.9 frame with an impossible size; closing the connection");
            return Ok(());
        };
        if !fill(stream, &mut buf, size, cancel).await? {
            return Ok(());
        }
        buf.advance(HEADER);
        let body = &mut buf[..size - HEADER];
        let header = frame::request_header(&raw);
        if !faults.wait_stall(cancel).await {
            return Ok(());
        }
        let answer = match header {
            Err(HeaderError::Invalid | HeaderError::BadSize) => Answer::Drop,
            Ok(header) => {
                let code = frame::command_code(&header);
                if let Some(code) = code {
                    faults.count_request(code);
                }
                match code.and_then(|code| faults.take_failure(code)) {
                    Some(injected) => Answer::deny(injected),
                    None if code == Some(command::SEND_MESSAGES) && faults.holds_sends() => {
                        // The routing section reads like a 0.8 send's metadata.
                        let destination = send_destination(shared, body);
                        let ticket =
                            faults.hold_send(session.inner.client_id, destination.as_ref());
                        if let Some(ticket) = &ticket {
                            if !ticket.wait(cancel).await {
                                return Ok(());
                            }
                        }
                        dispatch(shared, session, &header, body)
                    }
                    None => dispatch(shared, session, &header, body),
                }
            }
        };
        buf.advance(size - HEADER);

        out.clear();
        let evicted = match (&header, answer) {
            (_, Answer::Drop) | (Err(_), _) => continue,
            (Ok(header), Answer::Reply { status, body }) => {
                out.extend_from_slice(&frame::reply(header, status, body.len()));
                out.extend_from_slice(&body);
                false
            }
            (Ok(header), Answer::Evict(reason)) => {
                out.extend_from_slice(&frame::eviction(header.client, reason));
                true
            }
        };
        if !respond(stream, &out, faults, cancel).await? {
            return Ok(());
        }
        if evicted {
            // The session is over; a client must connect and register again.
            session.bound = None;
            if session.inner.user_id.take().is_some() {
                // A registry entry removed meanwhile (the user was deleted) is no error here.
                let _ = shared.state.set_client_user(session.inner.client_id, None);
            }
        }
    }
}

/// Decides the answer to one request, in the server's order: logins first (a legacy login code
/// is refused as malformed), then PING, which needs no session, then the session gate (reads
/// answer 40 in the status, replicated operations evict the stale session), then the command.
fn dispatch(
    shared: &Shared,
    session: &mut NgSession,
    header: &RequestHeader,
    body: &mut [u8],
) -> Answer {
    if !frame::body_matches(header, body) {
        return Answer::deny(status::INVALID_FORMAT);
    }
    match header.operation {
        Operation::Register => return login::register(shared, session, body),
        Operation::Logout => return login::logout(shared, session),
        _ => {}
    }
    let Some(code) = frame::command_code(header) else {
        // An internal operation a client may not send.
        return Answer::Evict(EvictionReason::InvalidRequestOperation);
    };
    if matches!(
        code,
        LOGIN_USER_CODE | LOGIN_WITH_PERSONAL_ACCESS_TOKEN_CODE
    ) {
        return Answer::Evict(EvictionReason::MalformedLogin);
    }
    let read = header.operation == Operation::NonReplicated;
    if session.bound.is_none() {
        if read && code == PING {
            return Answer::ok(Vec::new());
        }
        return if read {
            Answer::deny(status::UNAUTHENTICATED)
        } else {
            Answer::Evict(EvictionReason::NoSession)
        };
    }
    let mut answer = Vec::new();
    let framed = frame::result_framed(header);
    if framed {
        frame::result_ok(&mut answer);
    }
    match translate::execute(shared, &mut session.inner, code, body, &mut answer) {
        Ok(()) => Answer::ok(answer),
        // A missing right is judged before the command runs: the header status says so.
        Err(code) if !framed || code == status::UNAUTHORIZED => Answer::deny(code),
        Err(code) => {
            answer.clear();
            frame::result_rejected(&mut answer, code);
            Answer::ok(answer)
        }
    }
}
