//! What the command handlers of every group share: the server's [`Shared`] state, the
//! connection's [`Session`], the [`Request`] with its decode → auth → lock skeleton, and the
//! stream/topic resolution and the permission checks that come with it. `handlers` dispatches
//! to the groups; they and it import from here, never from each other's parent.

use crate::config::TestServerConfig;
use crate::state::{read, write, Meta, State, Stream, Topic};
use crate::users::Action;
use crate::wire::{status, DecodeError, Ident, Reader};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most partitions one CREATE_TOPIC / CREATE_PARTITIONS may ask for.
pub(super) const MAX_PARTITIONS_PER_REQUEST: u32 = 1000;

/// A handler's outcome: `Ok` with the answer payload appended to the output buffer, or the
/// error status to send with an empty body.
pub(crate) type Reply = Result<(), u32>;

/// What every connection of one server shares. Created once per [`crate::TestServer`] and kept
/// across restarts.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Streams, topics, partitions, groups and clients.
    pub(crate) state: Arc<State>,
    /// Credentials and retention settings.
    pub(crate) config: TestServerConfig,
    /// Server start, µs since the epoch (GET_STATS).
    pub(crate) started_at: u64,
    /// Durable storage, when a data directory is configured.
    pub(crate) store: Option<crate::persist::Store>,
}

/// Per-connection session.
#[derive(Debug)]
pub(crate) struct Session {
    /// Server-assigned client id (1, 2, ...).
    pub(crate) client_id: u32,
    /// Logged-in user (root = 0), if any.
    pub(crate) user_id: Option<u32>,
    /// The server port the connection came in on (GET_CLUSTER_METADATA names it, so a client
    /// that checks where the leader is stays where it is).
    pub(crate) port: u16,
}

impl Session {
    /// The session of a new connection from `peer` on `stream`, registered as a client (the
    /// connection removes it when it ends).
    pub(crate) fn open(
        shared: &Shared,
        stream: &tokio::net::TcpStream,
        peer: std::net::SocketAddr,
    ) -> Self {
        Self {
            client_id: shared.state.add_client(peer),
            user_id: None,
            port: stream.local_addr().map_or(0, |a| a.port()),
        }
    }
}

/// Current time in µs since the Unix epoch.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A random id shaped like the server's UUID v4 (`Uuid::new_v4().to_u128_le()`).
pub(crate) fn random_uuid() -> u128 {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    u128::from_le_bytes(bytes)
}

pub(super) fn decode<'a, T>(
    payload: &'a [u8],
    f: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<T, u32> {
    let mut r = Reader::new(payload);
    f(&mut r).map_err(DecodeError::status)
}

/// What a handler gets of one request (every command but the login/logout ones, which change
/// the session, and SEND_MESSAGES, which stamps its payload in place).
#[derive(Clone, Copy)]
pub(crate) struct Request<'r> {
    /// State, config and storage.
    pub(super) shared: &'r Shared,
    /// The connection's session.
    pub(super) session: &'r Session,
    /// The payload after the command code.
    pub(super) payload: &'r [u8],
}

impl<'r> Request<'r> {
    /// Decodes the payload with `fields` (a malformed payload fails first, as in the server's
    /// dispatch), then requires a login: the decoded fields and the session's user id.
    pub(super) fn open<R>(
        &self,
        fields: impl FnOnce(&mut Reader<'r>) -> Result<R, DecodeError>,
    ) -> Result<(R, u32), u32> {
        let fields = decode(self.payload, fields)?;
        Ok((fields, auth(self.session)?))
    }

    /// Runs a read-only command the way the server's query handlers do: [`Request::open`],
    /// then `answer` with the metadata read-locked and the user id.
    pub(super) fn query<R>(
        self,
        fields: impl FnOnce(&mut Reader<'r>) -> Result<R, DecodeError>,
        answer: impl FnOnce(&Meta, u32, R) -> Reply,
    ) -> Reply {
        let (fields, user) = self.open(fields)?;
        answer(&read(&self.shared.state.meta), user, fields)
    }

    /// Runs a command that changes streams, topics, groups or users: [`Request::open`], then
    /// `apply` with the metadata write-locked; when it succeeds, the metadata file is rewritten
    /// once the lock is released.
    pub(super) fn change<R>(
        self,
        fields: impl FnOnce(&mut Reader<'r>) -> Result<R, DecodeError>,
        apply: impl FnOnce(&mut Meta, u32, R) -> Reply,
    ) -> Reply {
        let (fields, user) = self.open(fields)?;
        apply(&mut write(&self.shared.state.meta), user, fields)?;
        persist_meta(self.shared);
        Ok(())
    }
}

/// A request without payload fields (the server ignores whatever bytes it carries).
pub(super) fn no_fields(_: &mut Reader<'_>) -> Result<(), DecodeError> {
    Ok(())
}

/// The stream and topic ids that start most topic-level requests.
pub(super) fn topic_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>), DecodeError> {
    Ok((r.ident()?, r.ident()?))
}

/// The session's user id, or 40 before login.
pub(super) fn auth(session: &Session) -> Result<u32, u32> {
    session.user_id.ok_or(status::UNAUTHENTICATED)
}

/// Rewrites the metadata file after a change to streams, topics, partitions, groups or users,
/// when a data directory is configured.
pub(crate) fn persist_meta(shared: &Shared) {
    if let Some(store) = &shared.store {
        store.metadata_changed(&shared.state);
    }
}

pub(super) fn resolve_stream(meta: &Meta, id: Ident<'_>) -> Result<usize, u32> {
    meta.find_stream(id).ok_or(status::STREAM_ID_NOT_FOUND)
}

/// Stream and topic slot ids, or 1009 / 2010.
pub(super) fn resolve_topic(
    meta: &Meta,
    s: Ident<'_>,
    t: Ident<'_>,
) -> Result<(usize, usize), u32> {
    let sid = resolve_stream(meta, s)?;
    let stream = meta.streams.get(sid).ok_or(status::STREAM_ID_NOT_FOUND)?;
    let tid = stream.find_topic(t).ok_or(status::TOPIC_ID_NOT_FOUND)?;
    Ok((sid, tid))
}

/// [`resolve_stream`], then 41 unless `user` may do `action` on it: the server resolves before
/// it judges, so a missing stream answers 1009 whatever the rights.
pub(super) fn stream_for(
    meta: &Meta,
    user: u32,
    id: Ident<'_>,
    action: fn(u32) -> Action,
) -> Result<usize, u32> {
    let sid = resolve_stream(meta, id)?;
    meta.users.check(user, action(sid as u32))?;
    Ok(sid)
}

/// [`resolve_topic`], then 41 unless `user` may do `action` on the topic.
pub(super) fn topic_for(
    meta: &Meta,
    user: u32,
    s: Ident<'_>,
    t: Ident<'_>,
    action: fn(u32, u32) -> Action,
) -> Result<(usize, usize), u32> {
    let (sid, tid) = resolve_topic(meta, s, t)?;
    meta.users.check(user, action(sid as u32, tid as u32))?;
    Ok((sid, tid))
}

/// The stream of a query that answers empty when the stream is missing, once `user` is found to
/// have `action` on it: `Ok(None)` when missing, 41 when not allowed.
pub(super) fn query_stream<'m>(
    meta: &'m Meta,
    user: u32,
    id: Ident<'_>,
    action: fn(u32) -> Action,
) -> Result<Option<(usize, &'m Stream)>, u32> {
    let Some((sid, stream)) = meta.stream(id) else {
        return Ok(None);
    };
    meta.users.check(user, action(sid as u32))?;
    Ok(Some((sid, stream)))
}

/// The topic of a query that answers empty when the stream or topic is missing, once `user` is
/// found to have `action` on it (the server's `query_*`: resolve, answer empty if missing, then
/// judge): `Ok(None)` when missing, 41 when not allowed, else the ids and the topic.
pub(super) fn query_topic<'m>(
    meta: &'m Meta,
    user: u32,
    s: Ident<'_>,
    t: Ident<'_>,
    action: fn(u32, u32) -> Action,
) -> Result<Option<(usize, usize, &'m Topic)>, u32> {
    let Ok((sid, tid)) = resolve_topic(meta, s, t) else {
        return Ok(None);
    };
    meta.users.check(user, action(sid as u32, tid as u32))?;
    Ok(Some((sid, tid, topic_ref(meta, sid, tid)?)))
}

pub(super) fn topic_ref(meta: &Meta, sid: usize, tid: usize) -> Result<&Topic, u32> {
    meta.streams
        .get(sid)
        .and_then(|s| s.topics.get(tid))
        .ok_or(status::TOPIC_ID_NOT_FOUND)
}

pub(super) fn topic_mut(meta: &mut Meta, sid: usize, tid: usize) -> Result<&mut Topic, u32> {
    meta.streams
        .get_mut(sid)
        .and_then(|s| s.topics.get_mut(tid))
        .ok_or(status::TOPIC_ID_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn uuid_has_version_4_bits() {
        let id = random_uuid().to_le_bytes();
        check!(id[6] >> 4 == 4);
        check!(id[8] >> 6 == 2);
    }
}
