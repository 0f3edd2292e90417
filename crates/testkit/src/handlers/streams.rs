//! Stream commands, and the stream record GET_STREAM(S) and CREATE_STREAM answer with.

use super::topics::{purge_partitions, sum_stats, topic_record, topic_stats};
use super::{auth, decode, now_micros, persist_meta, resolve_stream, Reply, Session, Shared};
use crate::state::{lock, read, write, Stream, Topic};
use crate::wire::{status, Put};

fn stream_stats(s: &Stream) -> (u64, u64) {
    sum_stats(s.topics.iter().map(|(_, t)| topic_stats(t)))
}

fn stream_record(out: &mut Vec<u8>, id: usize, s: &Stream, stats: (u64, u64)) {
    out.put_u32(id as u32);
    out.put_u64(s.created_at);
    out.put_u32(s.topics.len() as u32);
    out.put_u64(stats.0);
    out.put_u64(stats.1);
    out.put_name(&s.name);
}

pub(super) fn get_streams(shared: &Shared, session: &Session, out: &mut Vec<u8>) -> Reply {
    auth(session)?;
    let meta = read(&shared.state.meta);
    for (id, s) in meta.streams.iter() {
        stream_record(out, id, s, stream_stats(s));
    }
    Ok(())
}

pub(super) fn get_stream(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
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
    let total = sum_stats(topic_stats.iter().map(|(_, _, stats)| *stats));
    stream_record(out, sid, s, total);
    for (tid, t, stats) in topic_stats {
        topic_record(out, tid, t, stats);
    }
    Ok(())
}

pub(super) fn create_stream(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
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

pub(super) fn update_stream(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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

pub(super) fn delete_stream(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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

pub(super) fn purge_stream(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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
