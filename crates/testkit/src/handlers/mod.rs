//! One function per command: decode the payload (failing like `iggy_binary_protocol`), check the
//! session is logged in, resolve what it names, check the user's permission for it, apply the
//! command to [`State`], encode the answer. The order of these steps per command follows the
//! server-0.8.0 handlers, because it decides which status a doubly-wrong request gets (e.g. a
//! missing stream answers 1009 before a missing right answers 41, but a CREATE_USER without
//! `manage_users` answers 41 before its username length is judged).
//!
//! Permissions are checked on every request against the users as they are at that moment (the
//! session holds only a user id), so a change made by UPDATE_PERMISSIONS applies to the very next
//! request of an already open session.
//!
//! This module dispatches by command code and keeps what every group shares (the session, the
//! [`Request`] with its decode → auth → lock skeleton, stream/topic resolution and the checks
//! that come with it); the commands live by group:
//! * `system`: ping, login and logout, clients, stats, cluster metadata;
//! * `users`: user accounts and their permissions;
//! * `streams`, `topics`: their CRUD and purge, and the stream/topic/partition records;
//! * `partitions`: partitions, segments and FLUSH_UNSAVED_BUFFER;
//! * `messages`: SEND_MESSAGES (batch validation, partitioning, the check/append split the
//!   send hold uses) and POLL_MESSAGES;
//! * `offsets`: consumer offsets and how a consumer resolves to a partition and a storage key;
//! * `groups`: consumer groups, membership and revocations.

mod groups;
mod messages;
mod offsets;
mod partitions;
mod streams;
mod system;
mod topics;
mod users;

pub(crate) use groups::sync_consumer_group;
pub(crate) use messages::{append_messages, send_destination};

use crate::config::TestServerConfig;
use crate::state::{read, write, Meta, State, Stream, Topic};
use crate::users::Action;
use crate::wire::{command, status, DecodeError, Ident, Reader};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most partitions one CREATE_TOPIC / CREATE_PARTITIONS may ask for.
const MAX_PARTITIONS_PER_REQUEST: u32 = 1000;

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

fn decode<'a, T>(
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
    shared: &'r Shared,
    /// The connection's session.
    session: &'r Session,
    /// The payload after the command code.
    payload: &'r [u8],
}

impl<'r> Request<'r> {
    /// Decodes the payload with `fields` (a malformed payload fails first, as in the server's
    /// dispatch), then requires a login: the decoded fields and the session's user id.
    fn open<R>(
        &self,
        fields: impl FnOnce(&mut Reader<'r>) -> Result<R, DecodeError>,
    ) -> Result<(R, u32), u32> {
        let fields = decode(self.payload, fields)?;
        Ok((fields, auth(self.session)?))
    }

    /// Runs a read-only command the way the server's query handlers do: [`Request::open`],
    /// then `answer` with the metadata read-locked and the user id.
    fn query<R>(
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
    fn change<R>(
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
fn no_fields(_: &mut Reader<'_>) -> Result<(), DecodeError> {
    Ok(())
}

/// The stream and topic ids that start most topic-level requests.
fn topic_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>), DecodeError> {
    Ok((r.ident()?, r.ident()?))
}

/// The session's user id, or 40 before login.
fn auth(session: &Session) -> Result<u32, u32> {
    session.user_id.ok_or(status::UNAUTHENTICATED)
}

/// Dispatches one request. `payload` is mutable so SEND_MESSAGES can stamp it in place.
pub(crate) fn handle(
    shared: &Shared,
    session: &mut Session,
    code: u32,
    payload: &mut [u8],
    out: &mut Vec<u8>,
) -> Reply {
    match code {
        command::LOGIN_USER => return system::login_user(shared, session, payload, out),
        command::LOGOUT_USER => return system::logout_user(shared, session),
        command::LOGIN_WITH_PERSONAL_ACCESS_TOKEN => {
            return system::login_with_personal_access_token(shared, session, payload, out)
        }
        command::SEND_MESSAGES => return messages::send_messages(shared, session, payload),
        _ => {}
    }
    let req = Request {
        shared,
        session,
        payload,
    };
    match code {
        command::PING => Ok(()),
        command::GET_STATS => system::get_stats(req, out),
        command::GET_CLUSTER_METADATA => system::get_cluster_metadata(req, out),
        command::GET_ME => system::get_me(req, out),
        command::GET_CLIENT => system::get_client(req, out),
        command::GET_CLIENTS => system::get_clients(req, out),
        command::GET_USER => users::get_user(req, out),
        command::GET_USERS => users::get_users(req, out),
        command::CREATE_USER => users::create_user(req, out),
        command::DELETE_USER => users::delete_user(req),
        command::UPDATE_USER => users::update_user(req),
        command::UPDATE_PERMISSIONS => users::update_permissions(req),
        command::CHANGE_PASSWORD => users::change_password(req),
        command::GET_SNAPSHOT_FILE
        | command::GET_PERSONAL_ACCESS_TOKENS..=command::DELETE_PERSONAL_ACCESS_TOKEN => {
            auth(session)?;
            Err(status::FEATURE_UNAVAILABLE)
        }
        command::GET_STREAM => streams::get_stream(req, out),
        command::GET_STREAMS => streams::get_streams(req, out),
        command::CREATE_STREAM => streams::create_stream(req, out),
        command::DELETE_STREAM => streams::delete_stream(req),
        command::UPDATE_STREAM => streams::update_stream(req),
        command::PURGE_STREAM => streams::purge_stream(req),
        command::GET_TOPIC => topics::get_topic(req, out),
        command::GET_TOPICS => topics::get_topics(req, out),
        command::CREATE_TOPIC => topics::create_topic(req, out),
        command::DELETE_TOPIC => topics::delete_topic(req),
        command::UPDATE_TOPIC => topics::update_topic(req),
        command::PURGE_TOPIC => topics::purge_topic(req),
        command::CREATE_PARTITIONS => partitions::create_partitions(req),
        command::DELETE_PARTITIONS => partitions::delete_partitions(req),
        command::DELETE_SEGMENTS => partitions::delete_segments(req),
        command::FLUSH_UNSAVED_BUFFER => partitions::flush_unsaved_buffer(req),
        command::POLL_MESSAGES => messages::poll_messages(req, out),
        command::GET_CONSUMER_OFFSET => offsets::get_consumer_offset(req, out),
        command::STORE_CONSUMER_OFFSET => offsets::store_consumer_offset(req),
        command::DELETE_CONSUMER_OFFSET => offsets::delete_consumer_offset(req),
        command::GET_CONSUMER_GROUP => groups::get_consumer_group(req, out),
        command::GET_CONSUMER_GROUPS => groups::get_consumer_groups(req, out),
        command::CREATE_CONSUMER_GROUP => groups::create_consumer_group(req, out),
        command::DELETE_CONSUMER_GROUP => groups::delete_consumer_group(req),
        command::JOIN_CONSUMER_GROUP => groups::join_consumer_group(req),
        command::LEAVE_CONSUMER_GROUP => groups::leave_consumer_group(req),
        _ => Err(status::INVALID_COMMAND),
    }
}

/// Rewrites the metadata file after a change to streams, topics, partitions, groups or users,
/// when a data directory is configured.
pub(crate) fn persist_meta(shared: &Shared) {
    if let Some(store) = &shared.store {
        store.metadata_changed(&shared.state);
    }
}

fn resolve_stream(meta: &Meta, id: Ident<'_>) -> Result<usize, u32> {
    meta.find_stream(id).ok_or(status::STREAM_ID_NOT_FOUND)
}

/// Stream and topic slot ids, or 1009 / 2010.
fn resolve_topic(meta: &Meta, s: Ident<'_>, t: Ident<'_>) -> Result<(usize, usize), u32> {
    let sid = resolve_stream(meta, s)?;
    let stream = meta.streams.get(sid).ok_or(status::STREAM_ID_NOT_FOUND)?;
    let tid = stream.find_topic(t).ok_or(status::TOPIC_ID_NOT_FOUND)?;
    Ok((sid, tid))
}

/// [`resolve_stream`], then 41 unless `user` may do `action` on it: the server resolves before
/// it judges, so a missing stream answers 1009 whatever the rights.
fn stream_for(
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
fn topic_for(
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
fn query_stream<'m>(
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
fn query_topic<'m>(
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

fn topic_ref(meta: &Meta, sid: usize, tid: usize) -> Result<&Topic, u32> {
    meta.streams
        .get(sid)
        .and_then(|s| s.topics.get(tid))
        .ok_or(status::TOPIC_ID_NOT_FOUND)
}

fn topic_mut(meta: &mut Meta, sid: usize, tid: usize) -> Result<&mut Topic, u32> {
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
