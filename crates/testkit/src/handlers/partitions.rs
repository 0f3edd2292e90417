//! Partition and segment commands: adding and removing partitions (which rebalances the topic's
//! consumer groups), deleting sealed segments, and FLUSH_UNSAVED_BUFFER.

use super::{
    auth, decode, now_micros, persist_meta, resolve_topic, topic_mut, topic_ref, Reply, Session,
    Shared, MAX_PARTITIONS_PER_REQUEST,
};
use crate::group;
use crate::state::{lock, read, write, Partition, Topic};
use crate::wire::{status, DecodeError, Ident, Reader};

fn partitions_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>, u32), DecodeError> {
    Ok((r.ident()?, r.ident()?, r.u32()?))
}

pub(super) fn create_partitions(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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

/// After the partition count changed: deals every group's partitions afresh (no pending
/// revocations) and forgets what the groups last polled.
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

pub(super) fn delete_partitions(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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

pub(super) fn delete_segments(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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

pub(super) fn flush_unsaved_buffer(shared: &Shared, session: &Session, payload: &[u8]) -> Reply {
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
