//! One client connection: read a frame, apply faults, dispatch, write the answer in one write.
//! Requests on a connection are strictly sequential, like the real server. Every frame is read
//! whole before it is judged, so a rejected frame never leaves unread bytes behind (the real
//! server, by contrast, desynchronises on an oversized control frame or an unauthenticated
//! SEND_MESSAGES, whose payload it leaves in the socket).

use crate::faults::FaultState;
use crate::handlers::{handle, send_destination, Session, Shared};
use crate::wire::{command, status, MAX_CONTROL_FRAME_PAYLOAD};
use bytes::{Buf, BytesMut};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Largest read-ahead reserved at once while a big frame arrives; memory grows with the bytes
/// actually received, never with a claimed length.
const MAX_RESERVE: usize = 16 * 1024 * 1024;
/// Buffers above this capacity are released once idle, so one huge batch does not pin memory.
const KEEP_CAPACITY: usize = 4 * 1024 * 1024;
/// What a connection's input and output buffers start with.
const START_CAPACITY: usize = 64 * 1024;

/// A connection's input and output buffers, as both codecs keep them between requests.
pub(crate) fn buffers() -> (BytesMut, Vec<u8>) {
    (
        BytesMut::with_capacity(START_CAPACITY),
        Vec::with_capacity(START_CAPACITY),
    )
}

/// Before the next request: releases a buffer that grew past [`KEEP_CAPACITY`] for one large
/// frame (the input only once it holds nothing unread).
pub(crate) fn release_large(buf: &mut BytesMut, out: &mut Vec<u8>) {
    if buf.is_empty() && buf.capacity() > KEEP_CAPACITY {
        *buf = BytesMut::with_capacity(START_CAPACITY);
    }
    if out.capacity() > KEEP_CAPACITY {
        *out = Vec::with_capacity(START_CAPACITY);
    }
}

/// Serves `stream` until the peer closes it, an I/O error occurs or `cancel` fires.
pub(crate) async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    faults: Arc<FaultState>,
    cancel: CancellationToken,
) {
    let mut session = Session::open(&shared, &stream, peer);
    let result = run(&mut stream, &mut session, &shared, &faults, &cancel).await;
    if let Err(e) = result {
        tracing::debug!(peer = %peer, error = %e, "connection closed with error");
    }
    shared.state.remove_client(session.client_id);
}

async fn run(
    stream: &mut TcpStream,
    session: &mut Session,
    shared: &Shared,
    faults: &FaultState,
    cancel: &CancellationToken,
) -> io::Result<()> {
    let (mut buf, mut out) = buffers();
    let mut seen = crate::faults::SeenOnConnection::new();
    loop {
        release_large(&mut buf, &mut out);
        if !fill(stream, &mut buf, 8, cancel).await? {
            return Ok(());
        }
        let length = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let code = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
        buf.advance(8);
        out.clear();
        out.extend_from_slice(&[0u8; 8]);

        let reply = if length < 4 {
            Err(status::INVALID_COMMAND)
        } else {
            let payload_len = (length - 4) as usize;
            if code != command::SEND_MESSAGES && payload_len > MAX_CONTROL_FRAME_PAYLOAD as usize {
                if !discard(stream, &mut buf, payload_len, cancel).await? {
                    return Ok(());
                }
                Err(status::INVALID_COMMAND)
            } else {
                if !fill(stream, &mut buf, payload_len, cancel).await? {
                    return Ok(());
                }
                if !faults.wait_stall(cancel).await {
                    return Ok(());
                }
                faults.count_request(code);
                if !faults.wait_delay(code, &mut seen, cancel).await {
                    return Ok(());
                }
                let payload = &mut buf[..payload_len];
                let reply = match faults.take_failure(code) {
                    Some(injected) => Err(injected),
                    None if code == command::SEND_MESSAGES && faults.holds_sends() => {
                        let destination = send_destination(shared, payload);
                        let ticket = faults.hold_send(session.client_id, destination.as_ref());
                        if let Some(ticket) = &ticket {
                            if !ticket.wait(cancel).await {
                                // Closed while held: the request never reached the server.
                                return Ok(());
                            }
                        }
                        // Dropping the ticket after the append lets the next held request in.
                        handle(shared, session, code, payload, &mut out)
                    }
                    None => handle(shared, session, code, payload, &mut out),
                };
                buf.advance(payload_len);
                reply
            }
        };

        // The server ends a session that is no longer in its client registry (its user was
        // deleted, or a heartbeat timeout removed it) after answering: the client has to
        // connect and log in again.
        let ends_session = matches!(reply, Err(code) if code == status::CLIENT_NOT_FOUND);
        match reply {
            Ok(()) => {
                let len = (out.len() - 8) as u32;
                // The SDK treats an OK body of length ≤ 1 as empty without reading it; every
                // non-empty answer of this server is longer than that.
                out[4..8].copy_from_slice(&len.to_le_bytes());
            }
            Err(code) => {
                out.truncate(8);
                out[0..4].copy_from_slice(&code.to_le_bytes());
            }
        }
        if !respond(stream, &out, faults, cancel).await? || ends_session {
            return Ok(());
        }
    }
}

/// Writes one answer in one write, after the injected latency if any. Returns false when the
/// connection was cancelled meanwhile.
pub(crate) async fn respond(
    stream: &mut TcpStream,
    out: &[u8],
    faults: &FaultState,
    cancel: &CancellationToken,
) -> io::Result<bool> {
    if let Some(latency) = faults.latency() {
        tokio::select! {
            () = cancel.cancelled() => return Ok(false),
            () = tokio::time::sleep(latency) => {}
        }
    }
    tokio::select! {
        () = cancel.cancelled() => Ok(false),
        r = stream.write_all(out) => r.map(|()| true),
    }
}

/// Reads until `buf` holds at least `n` bytes. Returns false on a clean EOF or cancellation.
pub(crate) async fn fill(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    n: usize,
    cancel: &CancellationToken,
) -> io::Result<bool> {
    while buf.len() < n {
        let missing = n - buf.len();
        if buf.capacity() - buf.len() < missing {
            buf.reserve(missing.min(MAX_RESERVE));
        }
        let read = tokio::select! {
            () = cancel.cancelled() => return Ok(false),
            r = stream.read_buf(buf) => r?,
        };
        if read == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Consumes and drops `n` payload bytes of a rejected frame.
async fn discard(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    mut n: usize,
    cancel: &CancellationToken,
) -> io::Result<bool> {
    let have = buf.len().min(n);
    buf.advance(have);
    n -= have;
    let mut scratch = vec![0u8; 64 * 1024];
    while n > 0 {
        let want = n.min(scratch.len());
        let read = tokio::select! {
            () = cancel.cancelled() => return Ok(false),
            r = stream.read(&mut scratch[..want]) => r?,
        };
        if read == 0 {
            return Ok(false);
        }
        n -= read;
    }
    Ok(true)
}
