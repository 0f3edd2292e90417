//! The 0.9 generation of the protocol (Iggy server 0.9, "server-ng", spoken by SDK 0.11) over
//! the same state, storage and command semantics as the 0.8 codec.
//!
//! A 0.9 server is a consensus replica; a single test server stands for a cluster of one, so
//! every operation commits at once and there is no view change to survive. What a client sees
//! of the generation is its framing and its bodies, and that is what this module owns:
//! * `frame`: the 256-byte headers, result sections and evictions (pure);
//! * `session`: a connection's session and the answer each request gets;
//! * `login`: the register handshake (version check, credentials or token) and logout;
//! * `translate`: each command's 0.9 body turned into the 0.8 body the shared handler
//!   (`crate::handlers`) judges and applies, and the handler's answer turned into the 0.9
//!   answer. Where both generations encode a command alike the body passes unchanged; where they
//!   differ (options blocks, message batches, the ack byte of offset writes) the two crates'
//!   typed codecs convert it field by field.
//!
//! A connection to one replica of a [`crate::TestCluster`] carries that replica's `Seat`: after
//! the session gate it decides whether the replica serves a request, refuses it as a backup, or
//! answers the roster (`crate::replica`).
//!
//! Requests on a connection are strictly sequential, as with the 0.8 codec, and each frame is
//! read whole before it is judged.

mod frame;
mod login;
mod messages;
mod session;
mod translate;

use crate::connection::{buffers, fill, release_large, respond};
use crate::faults::FaultState;
use crate::handlers::{send_destination, Session, Shared};
use crate::replica::{ReplicaAnswer, Seat};
use crate::wire::{command, status};
use bytes::Buf;
use frame::{HeaderError, HEADER};
use iggy09_binary_protocol::codes::{LOGIN_USER_CODE, LOGIN_WITH_PERSONAL_ACCESS_TOKEN_CODE};
use iggy09_binary_protocol::consensus::{EvictionReason, Operation, RequestHeader};
use session::{Answer, NgSession, OK};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// PING: the one command served before a login.
const PING: u32 = 1;

/// Serves `stream` with the 0.9 codec until the peer closes it, an I/O error occurs or `cancel`
/// fires.
pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    faults: Arc<FaultState>,
    seat: Option<Seat>,
    cancel: CancellationToken,
) {
    let mut session = NgSession {
        inner: Session::open(&shared, &stream, peer),
        bound: None,
        seat,
    };
    if let Err(e) = run(&mut stream, &mut session, &shared, &faults, &cancel).await {
        tracing::debug!(peer = %peer, error = %e, "0.9 connection closed with error");
    }
    shared.state.remove_client(session.inner.client_id);
}

async fn run(
    stream: &mut TcpStream,
    session: &mut NgSession,
    shared: &Shared,
    faults: &FaultState,
    cancel: &CancellationToken,
) -> io::Result<()> {
    let (mut buf, mut out) = buffers();
    let mut seen = crate::faults::SeenOnConnection::new();
    loop {
        release_large(&mut buf, &mut out);
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
        // The answer's header is written in front of its body once the body is known.
        out.clear();
        out.resize(HEADER, 0);
        let answer = match header {
            Err(HeaderError::Invalid | HeaderError::BadSize) => Answer::Drop,
            Ok(header) => {
                let code = frame::command_code(&header);
                if let Some(code) = code {
                    faults.count_request(code);
                    if !faults.wait_delay(code, &mut seen, cancel).await {
                        return Ok(());
                    }
                }
                match code.and_then(|code| faults.take_failure(code)) {
                    Some(injected) => Answer::Reply(injected),
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
                        dispatch(shared, session, &header, code, body, &mut out)
                    }
                    None => dispatch(shared, session, &header, code, body, &mut out),
                }
            }
        };
        buf.advance(size - HEADER);

        let evicted = match (&header, answer) {
            (_, Answer::Drop) | (Err(_), _) => continue,
            (Ok(header), Answer::Reply(status)) => {
                if status != 0 {
                    out.truncate(HEADER);
                }
                let reply = frame::reply(header, status, out.len() - HEADER);
                out[..HEADER].copy_from_slice(&reply);
                false
            }
            (Ok(header), Answer::Evict(reason)) => {
                out.clear();
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
    code: Option<u32>,
    body: &mut [u8],
    out: &mut Vec<u8>,
) -> Answer {
    if !frame::body_matches(header, body) {
        return Answer::Reply(status::INVALID_FORMAT);
    }
    match header.operation {
        Operation::Register => return login::register(shared, session, body, out),
        Operation::Logout => return login::logout(shared, session),
        _ => {}
    }
    let Some(code) = code else {
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
            return OK;
        }
        return if read {
            Answer::Reply(status::UNAUTHENTICATED)
        } else {
            Answer::Evict(EvictionReason::NoSession)
        };
    }
    if let Some(seat) = &session.seat {
        match seat.answer(header.operation, Some(code)) {
            ReplicaAnswer::Serve => {}
            ReplicaAnswer::Roster => {
                out.extend_from_slice(&seat.roster_answer());
                return OK;
            }
            ReplicaAnswer::Status(code) => return Answer::Reply(code),
            ReplicaAnswer::Rejected(code) => {
                frame::result_rejected(out, code);
                return OK;
            }
        }
    }
    let framed = frame::result_framed(header);
    if framed {
        frame::result_ok(out);
    }
    match translate::execute(shared, &mut session.inner, code, body, out) {
        Ok(()) => OK,
        // A missing right is judged before the command runs: the header status says so.
        Err(code) if !framed || code == status::UNAUTHORIZED => Answer::Reply(code),
        Err(code) => {
            out.truncate(HEADER);
            frame::result_rejected(out, code);
            OK
        }
    }
}
