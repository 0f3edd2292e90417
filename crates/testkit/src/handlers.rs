//! One function per command: decode the payload (failing like `iggy_binary_protocol`), check the
//! session is logged in, apply the command to [`State`], encode the answer. The order of these
//! steps per command follows the server-0.8.0 handlers, because it decides which status a
//! doubly-wrong request gets.

use crate::config::TestServerConfig;
use crate::group;
use crate::state::{lock, read, write, Group, Meta, Partition, State, Stream, Topic};
use crate::wire::{
    command, le_u32, le_u64, send_ident, send_partitioning, status, ConsumerKind, DecodeError,
    Ident, Partitioning, Put, Reader, Strategy, WireConsumer, INDEX_SIZE, MAX_PAYLOAD_SIZE,
    MAX_USER_HEADERS_SIZE, MESSAGE_HEADER_SIZE,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use twox_hash::XxHash32;

/// Most partitions one CREATE_TOPIC / CREATE_PARTITIONS may ask for.
const MAX_PARTITIONS_PER_REQUEST: u32 = 1000;
/// Username length bounds of LOGIN_USER.
const USERNAME_LEN: std::ops::RangeInclusive<usize> = 3..=50;
/// Password length bounds of LOGIN_USER.
const PASSWORD_LEN: std::ops::RangeInclusive<usize> = 3..=100;

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
        command::GET_STATS => {
            auth(session)?;
            get_stats(shared, out)
        }
        command::GET_CLUSTER_METADATA => {
            auth(session)?;
            get_cluster_metadata(shared, out)
        }
        command::GET_ME => {
            auth(session)?;
            let clients = lock(&shared.state.clients);
            match clients.get(&session.client_id) {
                Some(info) => {
                    client_record(out, session.client_id, info, true);
                    Ok(())
                }
                None => Err(status::INVALID_COMMAND),
            }
        }
        command::GET_CLIENT => {
            let id = decode(payload, |r| r.u32())?;
            auth(session)?;
            if id == 0 {
                return Err(status::INVALID_CLIENT_ID);
            }
            if let Some(info) = lock(&shared.state.clients).get(&id) {
                client_record(out, id, info, true);
            }
            Ok(())
        }
        command::GET_CLIENTS => {
            auth(session)?;
            let clients = lock(&shared.state.clients);
            let mut ids: Vec<&u32> = clients.keys().collect();
            ids.sort_unstable();
            for id in ids {
                client_record(out, *id, &clients[id], false);
            }
            Ok(())
        }
        command::LOGIN_USER => login_user(shared, session, payload, out),
        command::LOGOUT_USER => {
            auth(session)?;
            session.user_id = None;
            set_client_user(shared, session);
            Ok(())
        }
        command::LOGIN_WITH_PERSONAL_ACCESS_TOKEN => {
            let token = decode(payload, |r| r.name())?;
            match &shared.config.personal_access_token {
                Some(t) if t == token => {
                    session.user_id = Some(0);
                    set_client_user(shared, session);
                    out.put_u32(0);
                    Ok(())
                }
                _ => Err(status::RESOURCE_NOT_FOUND),
            }
        }
        command::GET_SNAPSHOT_FILE
        | command::GET_USER..=command::CHANGE_PASSWORD
        | command::GET_PERSONAL_ACCESS_TOKENS..=command::DELETE_PERSONAL_ACCESS_TOKEN => {
            auth(session)?;
            Err(status::FEATURE_UNAVAILABLE)
        }
        command::GET_STREAM => get_stream(shared, session, payload, out),
        command::GET_STREAMS => get_streams(shared, session, out),
        command::CREATE_STREAM => create_stream(shared, session, payload, out),
        command::DELETE_STREAM => delete_stream(shared, session, payload),
        command::UPDATE_STREAM => update_stream(shared, session, payload),
        command::PURGE_STREAM => purge_stream(shared, session, payload),
        command::GET_TOPIC => get_topic(shared, session, payload, out),
        command::GET_TOPICS => get_topics(shared, session, payload, out),
        command::CREATE_TOPIC => create_topic(shared, session, payload, out),
        command::DELETE_TOPIC => delete_topic(shared, session, payload),
        command::UPDATE_TOPIC => update_topic(shared, session, payload),
        command::PURGE_TOPIC => purge_topic(shared, session, payload),
        command::CREATE_PARTITIONS => create_partitions(shared, session, payload),
        command::DELETE_PARTITIONS => delete_partitions(shared, session, payload),
        command::DELETE_SEGMENTS => delete_segments(shared, session, payload),
        command::SEND_MESSAGES => send_messages(shared, session, payload),
        command::POLL_MESSAGES => poll_messages(shared, session, payload, out),
        command::FLUSH_UNSAVED_BUFFER => flush_unsaved_buffer(shared, session, payload),
        command::GET_CONSUMER_OFFSET => get_consumer_offset(shared, session, payload, out),
        command::STORE_CONSUMER_OFFSET => store_consumer_offset(shared, session, payload),
        command::DELETE_CONSUMER_OFFSET => delete_consumer_offset(shared, session, payload),
        command::GET_CONSUMER_GROUP => get_consumer_group(shared, session, payload, out),
        command::GET_CONSUMER_GROUPS => get_consumer_groups(shared, session, payload, out),
        command::CREATE_CONSUMER_GROUP => create_consumer_group(shared, session, payload, out),
        command::DELETE_CONSUMER_GROUP => delete_consumer_group(shared, session, payload),
        command::JOIN_CONSUMER_GROUP => join_consumer_group(shared, session, payload),
        command::LEAVE_CONSUMER_GROUP => leave_consumer_group(shared, session, payload),
        _ => Err(status::INVALID_COMMAND),
    }
}

fn set_client_user(shared: &Shared, session: &Session) {
    if let Some(info) = lock(&shared.state.clients).get_mut(&session.client_id) {
        info.user_id = session.user_id;
    }
}

fn persist_meta(shared: &Shared) {
    if let Some(store) = &shared.store {
        store.metadata_changed(&shared.state);
    }
}

// ---------------------------------------------------------------------------------------------
// System

fn login_user(shared: &Shared, session: &mut Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let (username, password) = decode(payload, |r| {
        let username = r.name()?;
        let password = r.short_str()?;
        let _version = r.long_str()?;
        let _context = r.long_str()?;
        Ok((username, password))
    })?;
    if !USERNAME_LEN.contains(&username.len()) {
        return Err(status::INVALID_USERNAME);
    }
    if !PASSWORD_LEN.contains(&password.len()) {
        return Err(status::INVALID_PASSWORD);
    }
    if username != shared.config.root_username || password != shared.config.root_password {
        return Err(status::INVALID_CREDENTIALS);
    }
    session.user_id = Some(0);
    set_client_user(shared, session);
    out.put_u32(0);
    Ok(())
}

fn get_cluster_metadata(shared: &Shared, out: &mut Vec<u8>) -> Reply {
    out.put_long_str("single-node");
    out.put_u32(1);
    out.put_long_str("iggy-node");
    out.put_long_str(&shared.config.bind.ip().to_string());
    out.put_u16(shared.port);
    // Default ports of the transports this server does not run; the real server reports the
    // configured ports of disabled transports too.
    out.put_u16(8080);
    out.put_u16(3000);
    out.put_u16(8092);
    out.put_u8(0); // leader
    out.put_u8(0); // healthy
    Ok(())
}

fn client_record(out: &mut Vec<u8>, id: u32, info: &crate::state::ClientInfo, groups: bool) {
    out.put_u32(id);
    out.put_u32(info.user_id.unwrap_or(u32::MAX));
    out.put_u8(1); // TCP
    out.put_long_str(&info.address.to_string());
    out.put_u32(info.groups.len() as u32);
    if groups {
        for (s, t, g) in &info.groups {
            out.put_u32(*s);
            out.put_u32(*t);
            out.put_u32(*g);
        }
    }
}

fn get_stats(shared: &Shared, out: &mut Vec<u8>) -> Reply {
    let meta = read(&shared.state.meta);
    let (mut topics, mut partitions, mut segments, mut messages, mut size, mut groups) =
        (0u32, 0u32, 0u32, 0u64, 0u64, 0u32);
    for (_, s) in meta.streams.iter() {
        for (_, t) in s.topics.iter() {
            topics += 1;
            groups += t.groups.len() as u32;
            for p in &t.partitions {
                partitions += 1;
                let log = lock(&p.log);
                segments += log.segments().len() as u32;
                messages += log.messages_count();
                size += log.size_bytes();
            }
        }
    }
    let streams = meta.streams.len() as u32;
    drop(meta);
    let clients = lock(&shared.state.clients).len() as u32;
    let now = now_micros();
    out.put_u32(std::process::id());
    out.put_f32(0.0);
    out.put_f32(0.0);
    out.put_u64(0); // memory usage
    out.put_u64(0); // total memory
    out.put_u64(0); // available memory
    out.put_u64(now.saturating_sub(shared.started_at)); // run time µs
    out.put_u64(shared.started_at);
    out.put_u64(0); // read bytes
    out.put_u64(0); // written bytes
    out.put_u64(size);
    out.put_u32(streams);
    out.put_u32(topics);
    out.put_u32(partitions);
    out.put_u32(segments);
    out.put_u64(messages);
    out.put_u32(clients);
    out.put_u32(groups);
    out.put_long_str("localhost");
    out.put_long_str(std::env::consts::OS);
    out.put_long_str("");
    out.put_long_str("");
    out.put_long_str("0.8.0");
    out.put_u32(8000); // semver 0.8.0 as major|minor:03|patch:03
    out.put_u32(0); // cache metrics
    out.put_u32(1); // threads
    out.put_u64(0); // free disk
    out.put_u64(0); // total disk
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Records and stats

fn partition_stats(p: &Partition) -> (u64, u64) {
    let log = lock(&p.log);
    (log.size_bytes(), log.messages_count())
}

fn topic_stats(t: &Topic) -> (u64, u64) {
    t.partitions
        .iter()
        .map(|p| partition_stats(p))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

fn stream_stats(s: &Stream) -> (u64, u64) {
    s.topics
        .iter()
        .map(|(_, t)| topic_stats(t))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

fn stream_record(out: &mut Vec<u8>, id: usize, s: &Stream, stats: (u64, u64)) {
    out.put_u32(id as u32);
    out.put_u64(s.created_at);
    out.put_u32(s.topics.len() as u32);
    out.put_u64(stats.0);
    out.put_u64(stats.1);
    out.put_name(&s.name);
}

fn topic_record(out: &mut Vec<u8>, id: usize, t: &Topic, stats: (u64, u64)) {
    out.put_u32(id as u32);
    out.put_u64(t.created_at);
    out.put_u32(t.partitions.len() as u32);
    out.put_u64(t.message_expiry);
    out.put_u8(t.compression);
    out.put_u64(t.max_topic_size);
    out.put_u8(t.replication_factor);
    out.put_u64(stats.0);
    out.put_u64(stats.1);
    out.put_name(&t.name);
}

fn partition_records(out: &mut Vec<u8>, t: &Topic, fresh: bool) {
    for (id, p) in t.partitions.iter().enumerate() {
        out.put_u32(id as u32);
        out.put_u64(p.created_at);
        if fresh {
            // CREATE_TOPIC answers with zeroed partition stats, segments_count included.
            out.put_u32(0);
            out.put_u64(0);
            out.put_u64(0);
            out.put_u64(0);
        } else {
            let log = lock(&p.log);
            out.put_u32(log.segments().len() as u32);
            out.put_u64(log.current_offset());
            out.put_u64(log.size_bytes());
            out.put_u64(log.messages_count());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Resolution

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

/// Offset-storage key of a plain consumer: its numeric id, or `XxHash32(name)`.
fn consumer_key(id: Ident<'_>) -> u64 {
    match id {
        Ident::Numeric(n) => u64::from(n),
        Ident::Name(name) => u64::from(XxHash32::oneshot(0, name.as_bytes())),
    }
}

// ---------------------------------------------------------------------------------------------
// Streams

fn get_streams(shared: &Shared, session: &Session, out: &mut Vec<u8>) -> Reply {
    auth(session)?;
    let meta = read(&shared.state.meta);
    for (id, s) in meta.streams.iter() {
        stream_record(out, id, s, stream_stats(s));
    }
    Ok(())
}

fn get_stream(shared: &Shared, session: &Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let id = decode(payload, |r| r.ident())?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let Some(sid) = meta.find_stream(id) else {
        return Ok(());
    };
    let Some(s) = meta.streams.get(sid) else {
        return Ok(());
    };
    let topic_stats: Vec<(usize, &Topic, (u64, u64))> = s
        .topics
        .iter()
        .map(|(tid, t)| (tid, t, topic_stats(t)))
        .collect();
    let total = topic_stats
        .iter()
        .fold((0, 0), |a, (_, _, b)| (a.0 + b.0, a.1 + b.1));
    stream_record(out, sid, s, total);
    for (tid, t, stats) in topic_stats {
        topic_record(out, tid, t, stats);
    }
    Ok(())
}

fn create_stream(shared: &Shared, session: &Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let name = decode(payload, |r| r.name())?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    if meta.stream_by_name(name).is_some() {
        return Err(status::STREAM_NAME_ALREADY_EXISTS);
    }
    let stream = Stream {
        name: name.to_owned(),
        created_at: now_micros(),
        topics: Default::default(),
    };
    let id = meta.streams.insert(stream);
    if let Some(s) = meta.streams.get(id) {
        stream_record(out, id, s, (0, 0));
    }
    drop(meta);
    persist_meta(shared);
    Ok(())
}

fn update_stream(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (id, name) = decode(payload, |r| Ok((r.ident()?, r.name()?)))?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    let sid = resolve_stream(&meta, id)?;
    if let Some((other, _)) = meta.stream_by_name(name) {
        if other == sid {
            return Ok(());
        }
        return Err(status::STREAM_NAME_ALREADY_EXISTS);
    }
    if let Some(s) = meta.streams.get_mut(sid) {
        s.name = name.to_owned();
    }
    drop(meta);
    persist_meta(shared);
    Ok(())
}

fn delete_stream(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let id = decode(payload, |r| r.ident())?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    let sid = resolve_stream(&meta, id)?;
    meta.streams.remove(sid);
    drop(meta);
    for info in lock(&shared.state.clients).values_mut() {
        info.groups.retain(|(s, _, _)| *s as usize != sid);
    }
    if let Some(store) = &shared.store {
        store.stream_deleted(sid);
    }
    persist_meta(shared);
    Ok(())
}

fn purge_stream(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let id = decode(payload, |r| r.ident())?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let sid = resolve_stream(&meta, id)?;
    if let Some(s) = meta.streams.get(sid) {
        for (tid, t) in s.topics.iter() {
            purge_partitions(shared, sid, tid, t);
        }
    }
    Ok(())
}

fn purge_partitions(shared: &Shared, sid: usize, tid: usize, t: &Topic) {
    for (pid, p) in t.partitions.iter().enumerate() {
        let mut log = lock(&p.log);
        log.purge();
        if let Some(store) = &shared.store {
            store.partition_rewritten(sid, tid, pid, &log);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Topics

fn get_topics(shared: &Shared, session: &Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let id = decode(payload, |r| r.ident())?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let Some(s) = meta.find_stream(id).and_then(|sid| meta.streams.get(sid)) else {
        return Ok(());
    };
    for (tid, t) in s.topics.iter() {
        topic_record(out, tid, t, topic_stats(t));
    }
    Ok(())
}

fn get_topic(shared: &Shared, session: &Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let (s, t) = decode(payload, |r| Ok((r.ident()?, r.ident()?)))?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let Ok((sid, tid)) = resolve_topic(&meta, s, t) else {
        return Ok(());
    };
    let topic = topic_ref(&meta, sid, tid)?;
    topic_record(out, tid, topic, topic_stats(topic));
    partition_records(out, topic, false);
    Ok(())
}

/// Decoded CREATE_TOPIC / UPDATE_TOPIC settings.
struct TopicSettings<'a> {
    /// Compression code (1 none, 2 gzip).
    compression: u8,
    /// Expiry in µs (0 = server default, `u64::MAX` = never).
    message_expiry: u64,
    /// Size limit in bytes (0 = server default, `u64::MAX` = unlimited).
    max_topic_size: u64,
    /// Replication factor (0 = unset, stored as 1).
    replication_factor: u8,
    /// Topic name.
    name: &'a str,
}

fn topic_settings<'a>(r: &mut Reader<'a>) -> Result<TopicSettings<'a>, DecodeError> {
    Ok(TopicSettings {
        compression: r.u8()?,
        message_expiry: r.u64()?,
        max_topic_size: r.u64()?,
        replication_factor: r.u8()?,
        name: r.name()?,
    })
}

fn create_topic(shared: &Shared, session: &Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let (stream_id, partitions_count, settings) = decode(payload, |r| {
        let stream_id = r.ident()?;
        let partitions_count = r.u32()?;
        Ok((stream_id, partitions_count, topic_settings(r)?))
    })?;
    auth(session)?;
    if partitions_count > MAX_PARTITIONS_PER_REQUEST {
        return Err(status::TOO_MANY_PARTITIONS);
    }
    if !(1..=2).contains(&settings.compression) {
        return Err(status::INVALID_COMMAND);
    }
    // ServerDefault (0) resolves to the default config: expiry "none", size "unlimited".
    let message_expiry = match settings.message_expiry {
        0 => u64::MAX,
        v => v,
    };
    let max_topic_size = match settings.max_topic_size {
        0 => u64::MAX,
        v => v,
    };
    let mut meta = write(&shared.state.meta);
    let sid = resolve_stream(&meta, stream_id)?;
    if max_topic_size < shared.config.segment_size {
        return Err(status::INVALID_TOPIC_SIZE);
    }
    let stream = meta
        .streams
        .get_mut(sid)
        .ok_or(status::STREAM_ID_NOT_FOUND)?;
    if stream.topics.iter().any(|(_, t)| t.name == settings.name) {
        return Err(status::TOPIC_NAME_ALREADY_EXISTS);
    }
    let now = now_micros();
    let topic = Topic {
        name: settings.name.to_owned(),
        created_at: now,
        message_expiry,
        compression: settings.compression,
        max_topic_size,
        replication_factor: settings.replication_factor.max(1),
        partitions: (0..partitions_count).map(|_| Partition::new(now)).collect(),
        groups: Default::default(),
        round_robin: AtomicUsize::new(0),
    };
    let tid = stream.topics.insert(topic);
    let topic = topic_ref(&meta, sid, tid)?;
    topic_record(out, tid, topic, (0, 0));
    partition_records(out, topic, true);
    drop(meta);
    persist_meta(shared);
    Ok(())
}

fn update_topic(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, settings) = decode(payload, |r| {
        Ok((r.ident()?, r.ident()?, topic_settings(r)?))
    })?;
    auth(session)?;
    if !(1..=2).contains(&settings.compression) {
        return Err(status::INVALID_COMMAND);
    }
    let mut meta = write(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let stream = meta
        .streams
        .get_mut(sid)
        .ok_or(status::STREAM_ID_NOT_FOUND)?;
    if stream
        .topics
        .iter()
        .any(|(id, t)| id != tid && t.name == settings.name)
    {
        return Err(status::TOPIC_NAME_ALREADY_EXISTS);
    }
    let topic = stream
        .topics
        .get_mut(tid)
        .ok_or(status::TOPIC_ID_NOT_FOUND)?;
    topic.name = settings.name.to_owned();
    topic.compression = settings.compression;
    topic.message_expiry = settings.message_expiry;
    topic.max_topic_size = settings.max_topic_size;
    topic.replication_factor = settings.replication_factor.max(1);
    drop(meta);
    persist_meta(shared);
    Ok(())
}

fn delete_topic(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t) = decode(payload, |r| Ok((r.ident()?, r.ident()?)))?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    if let Some(stream) = meta.streams.get_mut(sid) {
        stream.topics.remove(tid);
    }
    drop(meta);
    for info in lock(&shared.state.clients).values_mut() {
        info.groups
            .retain(|(s, t, _)| !(*s as usize == sid && *t as usize == tid));
    }
    if let Some(store) = &shared.store {
        store.topic_deleted(sid, tid);
    }
    persist_meta(shared);
    Ok(())
}

fn purge_topic(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t) = decode(payload, |r| Ok((r.ident()?, r.ident()?)))?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    purge_partitions(shared, sid, tid, topic);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Partitions and segments

fn partitions_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>, u32), DecodeError> {
    Ok((r.ident()?, r.ident()?, r.u32()?))
}

fn create_partitions(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, count) = decode(payload, partitions_request)?;
    auth(session)?;
    if !(1..=MAX_PARTITIONS_PER_REQUEST).contains(&count) {
        return Err(status::TOO_MANY_PARTITIONS);
    }
    let mut meta = write(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    let now = now_micros();
    topic
        .partitions
        .extend((0..count).map(|_| Partition::new(now)));
    rebalance_topic_groups(topic);
    drop(meta);
    persist_meta(shared);
    Ok(())
}

fn rebalance_topic_groups(topic: &mut Topic) {
    let count = topic.partitions.len() as u32;
    let group_ids: Vec<usize> = topic.groups.iter().map(|(k, _)| k).collect();
    for gid in group_ids {
        if let Some(g) = topic.groups.get_mut(gid) {
            group::set_partitions(g, count);
        }
        for p in &topic.partitions {
            lock(&p.log).group_last_polled.remove(&(gid as u32));
        }
    }
}

fn delete_partitions(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, count) = decode(payload, partitions_request)?;
    auth(session)?;
    if count == 0 {
        return Err(status::TOO_MANY_PARTITIONS);
    }
    let mut meta = write(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    if count as usize > topic.partitions.len() {
        return Err(status::INVALID_PARTITIONS_COUNT);
    }
    let keep = topic.partitions.len() - count as usize;
    topic.partitions.truncate(keep);
    rebalance_topic_groups(topic);
    drop(meta);
    if let Some(store) = &shared.store {
        store.partitions_truncated(sid, tid, keep);
    }
    persist_meta(shared);
    Ok(())
}

fn delete_segments(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, partition, count) = decode(payload, |r| {
        Ok((r.ident()?, r.ident()?, r.u32()?, r.u32()?))
    })?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let p = topic
        .partitions
        .get(partition as usize)
        .ok_or(status::PARTITION_NOT_FOUND)?;
    let mut log = lock(&p.log);
    // Oldest sealed segments first; never the active one, never one above the lowest stored
    // consumer offset (the server's barrier).
    let mut freed = 0;
    for _ in 0..count {
        let bytes = log.drop_oldest_sealed();
        if bytes == 0 {
            break;
        }
        freed += bytes;
    }
    if freed > 0 {
        if let Some(store) = &shared.store {
            store.partition_rewritten(sid, tid, partition as usize, &log);
        }
    }
    Ok(())
}

fn flush_unsaved_buffer(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, partition, _fsync) =
        decode(payload, |r| Ok((r.ident()?, r.ident()?, r.u32()?, r.u8()?)))?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    if topic.partitions.get(partition as usize).is_none() {
        return Err(status::PARTITION_NOT_FOUND);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Messages

/// Validates the messages area of a SEND_MESSAGES batch like `IggyMessagesBatchMut::validate`.
fn validate_batch(indexes: &[u8], messages: &[u8], count: u32) -> Reply {
    if count == 0 {
        return Err(status::INVALID_MESSAGES_COUNT);
    }
    // `indexes` is exactly `count` entries (the caller cut it so), which is what the server's
    // InvalidIndexesByteSize / InvalidIndexesCount checks establish.
    debug_assert_eq!(indexes.len(), count as usize * INDEX_SIZE);
    let count = count as usize;
    let mut prev_position = 0u32;
    let mut prev_offset = 0u64;
    let mut total = 0usize;
    for i in 0..count {
        let entry = &indexes[i * INDEX_SIZE..(i + 1) * INDEX_SIZE];
        if le_u32(entry, 0) != 0 {
            return Err(status::NON_ZERO_OFFSET);
        }
        if le_u64(entry, 8) != 0 {
            return Err(status::NON_ZERO_TIMESTAMP);
        }
        // Message boundaries come from the index: start = previous entry's position, end = this
        // entry's position (the last message ends at the end of the buffer).
        let start = if i == 0 {
            0
        } else {
            le_u32(indexes, (i - 1) * INDEX_SIZE + 4) as usize
        };
        let end = if i + 1 == count {
            messages.len()
        } else {
            le_u32(entry, 4) as usize
        };
        if start > messages.len() || end > messages.len() || start > end {
            return Err(status::MISSING_INDEX);
        }
        if end - start < MESSAGE_HEADER_SIZE {
            return Err(status::MISSING_INDEX);
        }
        let msg = &messages[start..end];
        let payload_len = le_u32(msg, 52) as usize;
        let headers_len = le_u32(msg, 48) as usize;
        let size = MESSAGE_HEADER_SIZE
            .checked_add(payload_len)
            .and_then(|s| s.checked_add(headers_len))
            .ok_or(status::MISSING_INDEX)?;
        if msg.len() < size {
            return Err(status::MISSING_INDEX);
        }
        if payload_len > MAX_PAYLOAD_SIZE {
            return Err(status::TOO_BIG_MESSAGE_PAYLOAD);
        }
        if headers_len > MAX_USER_HEADERS_SIZE {
            return Err(status::TOO_BIG_USER_HEADERS);
        }
        let offset = le_u64(msg, 24);
        if offset < prev_offset {
            return Err(status::INVALID_OFFSET);
        }
        prev_offset = offset;
        let position = le_u32(entry, 4);
        if position < prev_position {
            return Err(status::CANNOT_READ_INDEX_POSITION);
        }
        prev_position = position;
        total += size;
    }
    if total != messages.len() {
        return Err(status::INVALID_MESSAGES_SIZE);
    }
    Ok(())
}

fn send_messages(shared: &Shared, session: &Session, payload: &mut [u8]) -> Reply {
    auth(session)?;
    let total = payload.len();
    if total < 4 {
        return Err(status::INVALID_COMMAND);
    }
    let metadata_len = le_u32(payload, 0) as usize;
    if metadata_len > total || 4 + metadata_len > total {
        return Err(status::INVALID_COMMAND);
    }
    let (head, rest) = payload.split_at_mut(4 + metadata_len);
    let metadata = &head[4..];
    let (stream_id, n1) = send_ident(metadata)?;
    let (topic_id, n2) = send_ident(metadata.get(n1..).ok_or(status::INVALID_COMMAND)?)?;
    let (partitioning, n3) =
        send_partitioning(metadata.get(n1 + n2..).ok_or(status::INVALID_COMMAND)?)?;
    let at = n1 + n2 + n3;
    let count_bytes = metadata.get(at..at + 4).ok_or(status::INVALID_COMMAND)?;
    let count = le_u32(count_bytes, 0);
    let indexes_size = (count as usize)
        .checked_mul(INDEX_SIZE)
        .ok_or(status::INVALID_COMMAND)?;
    if indexes_size > total || indexes_size > rest.len() {
        return Err(status::INVALID_COMMAND);
    }
    let (indexes, messages) = rest.split_at_mut(indexes_size);
    validate_batch(indexes, messages, count)?;

    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, stream_id, topic_id)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let partitions_count = topic.partitions.len();
    let partition_id = match partitioning {
        Partitioning::Balanced => {
            if partitions_count == 0 {
                return Err(status::TOPIC_ID_NOT_FOUND);
            }
            let current = topic
                .round_robin
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    Some((c + 1) % partitions_count)
                })
                .unwrap_or(0);
            current % partitions_count
        }
        Partitioning::PartitionId(id) => id as usize,
        Partitioning::MessagesKey(key) => {
            if partitions_count == 0 {
                // The real server divides by zero here and loses the connection task.
                return Err(status::PARTITION_NOT_FOUND);
            }
            XxHash32::oneshot(0, key) as usize % partitions_count
        }
    };
    let partition = Arc::clone(
        topic
            .partitions
            .get(partition_id)
            .ok_or(status::PARTITION_NOT_FOUND)?,
    );
    drop(meta);
    let mut log = lock(&partition.log);
    let first_offset = log.next_offset();
    log.append(
        messages,
        count,
        now_micros(),
        shared.config.segment_size,
        &mut random_uuid,
    );
    if let Some(store) = &shared.store {
        store.appended(sid, tid, partition_id, first_offset, messages);
    }
    Ok(())
}

/// Consumer resolution shared by POLL and STORE/DELETE_CONSUMER_OFFSET: the partition to use
/// and the offset-storage key, or `None` when a group member has nothing to read.
enum Resolved {
    Consumer { key: u64, partition: u32 },
    Group { group: u32, partition: u32 },
}

fn resolve_consumer(
    topic: &Topic,
    consumer: WireConsumer<'_>,
    client_id: u32,
    partition: Option<u32>,
    advance: bool,
) -> Result<Option<Resolved>, u32> {
    match consumer.kind {
        ConsumerKind::Consumer => Ok(Some(Resolved::Consumer {
            key: consumer_key(consumer.id),
            partition: partition.unwrap_or(0),
        })),
        ConsumerKind::Group => {
            let gid = topic
                .find_group(consumer.id)
                .ok_or(status::CONSUMER_GROUP_ID_NOT_FOUND)?;
            let g = topic
                .groups
                .get(gid)
                .ok_or(status::CONSUMER_GROUP_ID_NOT_FOUND)?;
            Ok(
                group::resolve_partition(g, client_id, partition, advance)?.map(|p| {
                    Resolved::Group {
                        group: gid as u32,
                        partition: p,
                    }
                }),
            )
        }
    }
}

fn poll_messages(shared: &Shared, session: &Session, payload: &[u8], out: &mut Vec<u8>) -> Reply {
    let (consumer, s, t, partition, strategy, count, auto_commit) = decode(payload, |r| {
        Ok((
            r.consumer()?,
            r.ident()?,
            r.ident()?,
            r.optional_partition()?,
            r.strategy()?,
            r.u32()?,
            r.u8()? != 0,
        ))
    })?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let Some(resolved) = resolve_consumer(topic, consumer, session.client_id, partition, true)?
    else {
        out.put_u32(0);
        out.put_u64(0);
        out.put_u32(0);
        return Ok(());
    };
    let pid = match resolved {
        Resolved::Consumer { partition, .. } | Resolved::Group { partition, .. } => partition,
    };
    let p = Arc::clone(
        topic
            .partitions
            .get(pid as usize)
            .ok_or(status::PARTITION_NOT_FOUND)?,
    );
    drop(meta);

    let mut log = lock(&p.log);
    let current = log.current_offset();
    out.put_u32(pid);
    out.put_u64(current);
    let count_at = out.len();
    out.put_u32(0);
    if count == 0 {
        return Ok(());
    }
    let start = match strategy {
        Strategy::Offset(o) => (o <= current).then_some(o),
        Strategy::Timestamp(ts) => log.offset_at_timestamp(ts),
        Strategy::First => Some(log.first_offset()),
        Strategy::Last => {
            let n = u64::from(count).min(current + 1);
            Some(current + 1 - n)
        }
        Strategy::Next => {
            let stored = match resolved {
                Resolved::Consumer { key, .. } => log.consumer_offsets.get(&key).copied(),
                Resolved::Group { group, .. } => log.group_offsets.get(&group).copied(),
            };
            Some(stored.map_or_else(|| log.first_offset(), |o| o + 1))
        }
    };
    let Some(start) = start.filter(|s| *s <= current) else {
        return Ok(());
    };
    let messages_at = out.len();
    let read = log.read(start, count, out);
    out[count_at..count_at + 4].copy_from_slice(&read.to_le_bytes());
    if read == 0 {
        return Ok(());
    }
    // Offset of the last returned message, for auto-commit and group bookkeeping.
    let mut pos = messages_at;
    let mut last = 0;
    for _ in 0..read {
        last = le_u64(out, pos + 24);
        pos +=
            MESSAGE_HEADER_SIZE + le_u32(out, pos + 52) as usize + le_u32(out, pos + 48) as usize;
    }
    match resolved {
        Resolved::Consumer { key, .. } => {
            if auto_commit {
                log.consumer_offsets.insert(key, last);
            }
        }
        Resolved::Group { group, .. } => {
            log.group_last_polled.insert(group, last);
            if auto_commit {
                log.group_offsets.insert(group, last);
            }
        }
    }
    if auto_commit {
        if let Some(store) = &shared.store {
            store.offsets_changed(sid, tid, pid as usize, &log);
        }
    }
    drop(log);
    if auto_commit {
        if let Resolved::Group { group, .. } = resolved {
            complete_group_revocations(shared, sid, tid, group as usize);
        }
    }
    Ok(())
}

/// After a group commit: moves partitions whose revocation can now complete.
fn complete_group_revocations(shared: &Shared, sid: usize, tid: usize, gid: usize) {
    let mut meta = write(&shared.state.meta);
    let Ok(topic) = topic_mut(&mut meta, sid, tid) else {
        return;
    };
    let partitions = topic.partitions.clone();
    if let Some(g) = topic.groups.get_mut(gid) {
        group::complete_revocations(g, &|p| can_complete(&partitions, gid as u32, p));
    }
}

/// A revocation can complete when the group never polled the partition or committed at least
/// the last polled offset.
fn can_complete(partitions: &[Arc<Partition>], gid: u32, partition: u32) -> bool {
    let Some(p) = partitions.get(partition as usize) else {
        return true;
    };
    let log = lock(&p.log);
    match log.group_last_polled.get(&gid) {
        None => true,
        Some(polled) => log.group_offsets.get(&gid).is_some_and(|c| c >= polled),
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer offsets

type OffsetRequest<'a> = (WireConsumer<'a>, Ident<'a>, Ident<'a>, Option<u32>);

fn offset_request<'a>(r: &mut Reader<'a>) -> Result<OffsetRequest<'a>, DecodeError> {
    Ok((
        r.consumer()?,
        r.ident()?,
        r.ident()?,
        r.optional_partition()?,
    ))
}

fn get_consumer_offset(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let (consumer, s, t, partition) = decode(payload, offset_request)?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    // Every lookup failure is an empty answer (`Ok(None)` on the client).
    let Ok((sid, tid)) = resolve_topic(&meta, s, t) else {
        return Ok(());
    };
    let topic = topic_ref(&meta, sid, tid)?;
    let pid = partition.unwrap_or(0);
    let key = match consumer.kind {
        ConsumerKind::Consumer => Resolved::Consumer {
            key: consumer_key(consumer.id),
            partition: pid,
        },
        ConsumerKind::Group => match topic.find_group(consumer.id) {
            Some(g) => Resolved::Group {
                group: g as u32,
                partition: pid,
            },
            None => return Ok(()),
        },
    };
    let Some(p) = topic.partitions.get(pid as usize) else {
        return Ok(());
    };
    let log = lock(&p.log);
    let stored = match key {
        Resolved::Consumer { key, .. } => log.consumer_offsets.get(&key).copied(),
        Resolved::Group { group, .. } => log.group_offsets.get(&group).copied(),
    };
    if let Some(stored) = stored {
        out.put_u32(pid);
        out.put_u64(log.current_offset());
        out.put_u64(stored);
    }
    Ok(())
}

fn store_consumer_offset(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (consumer, s, t, partition, offset) = decode(payload, |r| {
        let (c, s, t, p) = offset_request(r)?;
        Ok((c, s, t, p, r.u64()?))
    })?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let resolved = resolve_consumer(topic, consumer, session.client_id, partition, false)?
        .ok_or(status::NOT_RESOLVED_CONSUMER)?;
    let pid = match resolved {
        Resolved::Consumer { partition, .. } | Resolved::Group { partition, .. } => partition,
    };
    let p = topic
        .partitions
        .get(pid as usize)
        .ok_or(status::PARTITION_NOT_FOUND)?;
    let mut log = lock(&p.log);
    if (log.messages_count() == 0 && log.current_offset() == 0) || offset > log.current_offset() {
        return Err(status::INVALID_OFFSET);
    }
    let group = match resolved {
        Resolved::Consumer { key, .. } => {
            log.consumer_offsets.insert(key, offset);
            None
        }
        Resolved::Group { group, .. } => {
            log.group_offsets.insert(group, offset);
            Some(group)
        }
    };
    if let Some(store) = &shared.store {
        store.offsets_changed(sid, tid, pid as usize, &log);
    }
    drop(log);
    drop(meta);
    if let Some(g) = group {
        complete_group_revocations(shared, sid, tid, g as usize);
    }
    Ok(())
}

fn delete_consumer_offset(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (consumer, s, t, partition) = decode(payload, offset_request)?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let resolved = resolve_consumer(topic, consumer, session.client_id, partition, false)?
        .ok_or(status::NOT_RESOLVED_CONSUMER)?;
    let pid = match resolved {
        Resolved::Consumer { partition, .. } | Resolved::Group { partition, .. } => partition,
    };
    let p = topic
        .partitions
        .get(pid as usize)
        .ok_or(status::PARTITION_NOT_FOUND)?;
    let mut log = lock(&p.log);
    let removed = match resolved {
        Resolved::Consumer { key, .. } => log.consumer_offsets.remove(&key),
        Resolved::Group { group, .. } => log.group_offsets.remove(&group),
    };
    if removed.is_none() {
        return Err(status::CONSUMER_OFFSET_NOT_FOUND);
    }
    if let Some(store) = &shared.store {
        store.offsets_changed(sid, tid, pid as usize, &log);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Consumer groups

fn group_record(out: &mut Vec<u8>, id: usize, g: &Group) {
    out.put_u32(id as u32);
    out.put_u32(g.partitions.len() as u32);
    out.put_u32(g.members.len() as u32);
    out.put_name(&g.name);
}

fn group_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>, Ident<'a>), DecodeError> {
    Ok((r.ident()?, r.ident()?, r.ident()?))
}

fn get_consumer_group(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let (s, t, g) = decode(payload, group_request)?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let Ok((sid, tid)) = resolve_topic(&meta, s, t) else {
        return Ok(());
    };
    let topic = topic_ref(&meta, sid, tid)?;
    let Some((gid, group)) = topic
        .find_group(g)
        .and_then(|gid| topic.groups.get(gid).map(|g| (gid, g)))
    else {
        return Ok(());
    };
    group_record(out, gid, group);
    for (_, m) in group.members.iter() {
        out.put_u32(m.id as u32);
        out.put_u32(m.partitions.len() as u32);
        for p in &m.partitions {
            out.put_u32(*p);
        }
    }
    Ok(())
}

fn get_consumer_groups(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let (s, t) = decode(payload, |r| Ok((r.ident()?, r.ident()?)))?;
    auth(session)?;
    let meta = read(&shared.state.meta);
    let Ok((sid, tid)) = resolve_topic(&meta, s, t) else {
        return Ok(());
    };
    let topic = topic_ref(&meta, sid, tid)?;
    for (gid, g) in topic.groups.iter() {
        group_record(out, gid, g);
    }
    Ok(())
}

fn create_consumer_group(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let (s, t, name) = decode(payload, |r| Ok((r.ident()?, r.ident()?, r.name()?)))?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    if topic.groups.iter().any(|(_, g)| g.name == name) {
        return Err(status::CONSUMER_GROUP_NAME_ALREADY_EXISTS);
    }
    let group = Group {
        name: name.to_owned(),
        partitions: (0..topic.partitions.len() as u32).collect(),
        members: Default::default(),
    };
    let gid = topic.groups.insert(group);
    if let Some(g) = topic.groups.get(gid) {
        group_record(out, gid, g);
    }
    drop(meta);
    persist_meta(shared);
    Ok(())
}

/// Resolves stream, topic and group, or 1009 / 2010 / 5000.
fn resolve_group(
    meta: &Meta,
    s: Ident<'_>,
    t: Ident<'_>,
    g: Ident<'_>,
) -> Result<(usize, usize, usize), u32> {
    let (sid, tid) = resolve_topic(meta, s, t)?;
    let gid = topic_ref(meta, sid, tid)?
        .find_group(g)
        .ok_or(status::CONSUMER_GROUP_ID_NOT_FOUND)?;
    Ok((sid, tid, gid))
}

fn delete_consumer_group(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, g) = decode(payload, group_request)?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    let (sid, tid, gid) = resolve_group(&meta, s, t, g)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    topic.groups.remove(gid);
    for (pid, p) in topic.partitions.iter().enumerate() {
        let mut log = lock(&p.log);
        let had = log.group_offsets.remove(&(gid as u32)).is_some();
        log.group_last_polled.remove(&(gid as u32));
        if had {
            if let Some(store) = &shared.store {
                store.offsets_changed(sid, tid, pid, &log);
            }
        }
    }
    drop(meta);
    for info in lock(&shared.state.clients).values_mut() {
        info.groups
            .retain(|x| *x != (sid as u32, tid as u32, gid as u32));
    }
    persist_meta(shared);
    Ok(())
}

fn join_consumer_group(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, g) = decode(payload, group_request)?;
    auth(session)?;
    let live = shared.state.live_client_ids();
    let mut meta = write(&shared.state.meta);
    let (sid, tid, gid) = resolve_group(&meta, s, t, g)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    let partitions = topic.partitions.clone();
    if let Some(group) = topic.groups.get_mut(gid) {
        group::join(group, session.client_id, &live, &|p| {
            can_complete(&partitions, gid as u32, p)
        });
    }
    drop(meta);
    let key = (sid as u32, tid as u32, gid as u32);
    if let Some(info) = lock(&shared.state.clients).get_mut(&session.client_id) {
        if !info.groups.contains(&key) {
            info.groups.push(key);
        }
    }
    Ok(())
}

fn leave_consumer_group(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
    let (s, t, g) = decode(payload, group_request)?;
    auth(session)?;
    let mut meta = write(&shared.state.meta);
    let (sid, tid, gid) = resolve_group(&meta, s, t, g)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    let left = topic
        .groups
        .get_mut(gid)
        .and_then(|group| group::leave(group, session.client_id))
        .ok_or(status::CONSUMER_GROUP_MEMBER_NOT_FOUND)?;
    for p in left {
        if let Some(part) = topic.partitions.get(p as usize) {
            lock(&part.log).group_last_polled.remove(&(gid as u32));
        }
    }
    drop(meta);
    let key = (sid as u32, tid as u32, gid as u32);
    if let Some(info) = lock(&shared.state.clients).get_mut(&session.client_id) {
        info.groups.retain(|x| *x != key);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    fn message(payload: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; MESSAGE_HEADER_SIZE];
        m[52..56].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        m
    }

    fn index(positions: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in positions {
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
        }
        out
    }

    #[test]
    fn valid_batch_passes() {
        let mut msgs = message(b"a");
        msgs.extend(message(b"bc"));
        check!(validate_batch(&index(&[65, 131]), &msgs, 2) == Ok(()));
    }

    #[test]
    fn batch_checks_follow_the_server() {
        let msgs = message(b"a");
        check!(validate_batch(&[], &[], 0) == Err(status::INVALID_MESSAGES_COUNT));
        let mut bad = index(&[65]);
        bad[0] = 1;
        check!(validate_batch(&bad, &msgs, 1) == Err(status::NON_ZERO_OFFSET));
        let mut bad = index(&[65]);
        bad[8] = 1;
        check!(validate_batch(&bad, &msgs, 1) == Err(status::NON_ZERO_TIMESTAMP));
        check!(validate_batch(&index(&[65]), &msgs[..60], 1) == Err(status::MISSING_INDEX));
        let mut longer = msgs.clone();
        longer.push(0);
        check!(validate_batch(&index(&[66]), &longer, 1) == Err(status::INVALID_MESSAGES_SIZE));
        let mut two = message(b"a");
        two.extend(message(b"b"));
        check!(validate_batch(&index(&[70, 130]), &two, 2) == Err(status::MISSING_INDEX));
    }

    #[test]
    fn uuid_has_version_4_bits() {
        let id = random_uuid().to_le_bytes();
        check!(id[6] >> 4 == 4);
        check!(id[8] >> 6 == 2);
    }

    #[test]
    fn named_consumer_key_is_xxhash32_of_name() {
        check!(consumer_key(Ident::Numeric(7)) == 7);
        check!(consumer_key(Ident::Name("c")) == u64::from(XxHash32::oneshot(0, b"c")));
    }
}
