//! One function per command: decode the payload (failing like `iggy_binary_protocol`), check the
//! session is logged in, apply the command to [`State`], encode the answer. The order of these
//! steps per command follows the server-0.8.0 handlers, because it decides which status a
//! doubly-wrong request gets.
//!
//! This module dispatches by command code and keeps what every group shares (the session, the
//! decode and auth steps, stream/topic resolution); the commands live by group:
//! * `system`: ping, login and logout, clients, stats, cluster metadata;
//! * `streams`, `topics`: their CRUD and purge, and the stream/topic/partition records;
//! * `partitions`: partitions, segments and FLUSH_UNSAVED_BUFFER;
//! * `messages`: SEND_MESSAGES (batch validation, partitioning) and POLL_MESSAGES;
//! * `offsets`: consumer offsets and how a consumer resolves to a partition and a storage key;
//! * `groups`: consumer groups, membership and revocations.

mod groups;
mod messages;
mod offsets;
mod partitions;
mod streams;
mod system;
mod topics;

use crate::config::TestServerConfig;
use crate::state::{Meta, State, Topic};
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
    /// The bound TCP port (reported by GET_CLUSTER_METADATA).
    pub(crate) port: u16,
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

/// The stream and topic ids that start most topic-level requests.
fn topic_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>), DecodeError> {
    Ok((r.ident()?, r.ident()?))
}

fn auth(session: &Session) -> Reply {
    if session.user_id.is_some() {
        Ok(())
    } else {
        Err(status::UNAUTHENTICATED)
    }
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
        command::PING => Ok(()),
        command::GET_STATS => system::get_stats(shared, session, out),
        command::GET_CLUSTER_METADATA => system::get_cluster_metadata(shared, session, out),
        command::GET_ME => system::get_me(shared, session, out),
        command::GET_CLIENT => system::get_client(shared, session, payload, out),
        command::GET_CLIENTS => system::get_clients(shared, session, out),
        command::LOGIN_USER => system::login_user(shared, session, payload, out),
        command::LOGOUT_USER => system::logout_user(shared, session),
        command::LOGIN_WITH_PERSONAL_ACCESS_TOKEN => {
            system::login_with_personal_access_token(shared, session, payload, out)
        }
        command::GET_SNAPSHOT_FILE
        | command::GET_USER..=command::CHANGE_PASSWORD
        | command::GET_PERSONAL_ACCESS_TOKENS..=command::DELETE_PERSONAL_ACCESS_TOKEN => {
            auth(session)?;
            Err(status::FEATURE_UNAVAILABLE)
        }
        command::GET_STREAM => streams::get_stream(shared, session, payload, out),
        command::GET_STREAMS => streams::get_streams(shared, session, out),
        command::CREATE_STREAM => streams::create_stream(shared, session, payload, out),
        command::DELETE_STREAM => streams::delete_stream(shared, session, payload),
        command::UPDATE_STREAM => streams::update_stream(shared, session, payload),
        command::PURGE_STREAM => streams::purge_stream(shared, session, payload),
        command::GET_TOPIC => topics::get_topic(shared, session, payload, out),
        command::GET_TOPICS => topics::get_topics(shared, session, payload, out),
        command::CREATE_TOPIC => topics::create_topic(shared, session, payload, out),
        command::DELETE_TOPIC => topics::delete_topic(shared, session, payload),
        command::UPDATE_TOPIC => topics::update_topic(shared, session, payload),
        command::PURGE_TOPIC => topics::purge_topic(shared, session, payload),
        command::CREATE_PARTITIONS => partitions::create_partitions(shared, session, payload),
        command::DELETE_PARTITIONS => partitions::delete_partitions(shared, session, payload),
        command::DELETE_SEGMENTS => partitions::delete_segments(shared, session, payload),
        command::FLUSH_UNSAVED_BUFFER => partitions::flush_unsaved_buffer(shared, session, payload),
        command::SEND_MESSAGES => messages::send_messages(shared, session, payload),
        command::POLL_MESSAGES => messages::poll_messages(shared, session, payload, out),
        command::GET_CONSUMER_OFFSET => offsets::get_consumer_offset(shared, session, payload, out),
        command::STORE_CONSUMER_OFFSET => offsets::store_consumer_offset(shared, session, payload),
        command::DELETE_CONSUMER_OFFSET => {
            offsets::delete_consumer_offset(shared, session, payload)
        }
        command::GET_CONSUMER_GROUP => groups::get_consumer_group(shared, session, payload, out),
        command::GET_CONSUMER_GROUPS => groups::get_consumer_groups(shared, session, payload, out),
        command::CREATE_CONSUMER_GROUP => {
            groups::create_consumer_group(shared, session, payload, out)
        }
        command::DELETE_CONSUMER_GROUP => groups::delete_consumer_group(shared, session, payload),
        command::JOIN_CONSUMER_GROUP => groups::join_consumer_group(shared, session, payload),
        command::LEAVE_CONSUMER_GROUP => groups::leave_consumer_group(shared, session, payload),
        _ => Err(status::INVALID_COMMAND),
    }
}

/// Rewrites the metadata file after a change to streams, topics, partitions or groups, when a
/// data directory is configured.
fn persist_meta(shared: &Shared) {
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

/// The topic of a query that answers empty when the stream or topic is missing: its slot id
/// and the topic.
fn find_topic<'m>(meta: &'m Meta, s: Ident<'_>, t: Ident<'_>) -> Option<(usize, &'m Topic)> {
    let (sid, tid) = resolve_topic(meta, s, t).ok()?;
    Some((tid, topic_ref(meta, sid, tid).ok()?))
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
