//! Partition and segment commands: adding and removing partitions (which rebalances the topic's
//! consumer groups), deleting sealed segments, and FLUSH_UNSAVED_BUFFER.

use super::common::{
    now_micros, resolve_topic, topic_for, topic_mut, topic_ref, Reply, Request,
    MAX_PARTITIONS_PER_REQUEST,
};
use crate::group;
use crate::state::{lock, read, Partition, Topic};
use crate::users::Action;
use crate::wire::{status, DecodeError, Ident, Reader};

fn partitions_request<'a>(r: &mut Reader<'a>) -> Result<(Ident<'a>, Ident<'a>, u32), DecodeError> {
    Ok((r.ident()?, r.ident()?, r.u32()?))
}

pub(super) fn create_partitions(req: Request<'_>) -> Reply {
    req.change(partitions_request, |meta, user, (s, t, count)| {
        if !(1..=MAX_PARTITIONS_PER_REQUEST).contains(&count) {
            return Err(status::TOO_MANY_PARTITIONS);
        }
        let (sid, tid) = topic_for(meta, user, s, t, Action::ManageTopic)?;
        let topic = topic_mut(meta, sid, tid)?;
        let now = now_micros();
        topic
            .partitions
            .extend((0..count).map(|_| Partition::new(now)));
        rebalance_topic_groups(topic);
        Ok(())
    })
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

pub(super) fn delete_partitions(req: Request<'_>) -> Reply {
    req.change(partitions_request, |meta, user, (s, t, count)| {
        if count == 0 {
            return Err(status::TOO_MANY_PARTITIONS);
        }
        let (sid, tid) = topic_for(meta, user, s, t, Action::ManageTopic)?;
        let topic = topic_mut(meta, sid, tid)?;
        if count as usize > topic.partitions.len() {
            return Err(status::INVALID_PARTITIONS_COUNT);
        }
        let keep = topic.partitions.len() - count as usize;
        topic.partitions.truncate(keep);
        rebalance_topic_groups(topic);
        // Partition data first, metadata after: see `delete_stream`.
        if let Some(store) = &req.shared.store {
            store.partitions_truncated(sid, tid, keep);
        }
        Ok(())
    })
}

pub(super) fn delete_segments(req: Request<'_>) -> Reply {
    let ((s, t, partition, count), user) =
        req.open(|r| Ok((r.ident()?, r.ident()?, r.u32()?, r.u32()?)))?;
    let meta = read(&req.shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, s, t)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let p = topic
        .partitions
        .get(partition as usize)
        .ok_or(status::PARTITION_NOT_FOUND)?;
    // `resolve_for_delete_segments` judges the right after the partition was found.
    meta.users
        .check(user, Action::ManageTopic(sid as u32, tid as u32))?;
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
        if let Some(store) = &req.shared.store {
            store.partition_rewritten(sid, tid, partition as usize, &log);
        }
    }
    Ok(())
}

pub(super) fn flush_unsaved_buffer(req: Request<'_>) -> Reply {
    let ((s, t, partition, _fsync), user) =
        req.open(|r| Ok((r.ident()?, r.ident()?, r.u32()?, r.u8()?)))?;
    let meta = read(&req.shared.state.meta);
    // Flushing needs the right to send; the partition is looked up after the check.
    let (sid, tid) = topic_for(&meta, user, s, t, Action::Send)?;
    let topic = topic_ref(&meta, sid, tid)?;
    if topic.partitions.get(partition as usize).is_none() {
        return Err(status::PARTITION_NOT_FOUND);
    }
    Ok(())
}
