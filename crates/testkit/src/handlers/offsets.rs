//! Consumer-offset commands, and how a consumer (plain or group member) resolves to the
//! partition it reads and the key its offset is stored under.

use super::common::{query_topic, topic_for, topic_ref, Reply, Request};
use super::groups::complete_group_revocations;
use crate::group;
use crate::log::PartitionLog;
use crate::state::{lock, read, Meta, Partition, Topic};
use crate::users::Action;
use crate::wire::{status, ConsumerKind, DecodeError, Ident, Put, Reader, WireConsumer};
use twox_hash::XxHash32;

/// Offset-storage key of a plain consumer: its numeric id, or `XxHash32(name)`.
fn consumer_key(id: Ident<'_>) -> u64 {
    match id {
        Ident::Numeric(n) => u64::from(n),
        Ident::Name(name) => u64::from(XxHash32::oneshot(0, name.as_bytes())),
    }
}

/// A consumer resolved for POLL and STORE/DELETE_CONSUMER_OFFSET: the partition to use and the
/// offset-storage key.
#[derive(Clone, Copy)]
pub(super) enum Resolved {
    /// A plain consumer; `key` is its [`consumer_key`].
    Consumer { key: u64, partition: u32 },
    /// A consumer-group member; offsets are stored per group slot id.
    Group { group: u32, partition: u32 },
}

impl Resolved {
    pub(super) fn partition(self) -> u32 {
        match self {
            Resolved::Consumer { partition, .. } | Resolved::Group { partition, .. } => partition,
        }
    }

    /// The offset stored for this consumer in `log`, if any.
    pub(super) fn stored_offset(self, log: &PartitionLog) -> Option<u64> {
        match self {
            Resolved::Consumer { key, .. } => log.consumer_offsets.get(&key).copied(),
            Resolved::Group { group, .. } => log.group_offsets.get(&group).copied(),
        }
    }

    /// Stores `offset` for this consumer in `log`.
    pub(super) fn store_offset(self, log: &mut PartitionLog, offset: u64) {
        match self {
            Resolved::Consumer { key, .. } => {
                log.consumer_offsets.insert(key, offset);
            }
            Resolved::Group { group, .. } => {
                log.group_offsets.insert(group, offset);
            }
        }
    }

    /// The group slot id, for a group member.
    pub(super) fn group(self) -> Option<u32> {
        match self {
            Resolved::Consumer { .. } => None,
            Resolved::Group { group, .. } => Some(group),
        }
    }
}

/// Resolves `consumer` on `topic`; `None` when a group member has nothing to read. `advance`
/// moves a member's round-robin cursor (POLL does, offset commands do not).
pub(super) fn resolve_consumer(
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

type OffsetRequest<'a> = (WireConsumer<'a>, Ident<'a>, Ident<'a>, Option<u32>);

fn offset_request<'a>(r: &mut Reader<'a>) -> Result<OffsetRequest<'a>, DecodeError> {
    Ok((
        r.consumer()?,
        r.ident()?,
        r.ident()?,
        r.optional_partition()?,
    ))
}

pub(super) fn get_consumer_offset(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    let ((consumer, s, t, partition), user) = req.open(offset_request)?;
    let meta = read(&req.shared.state.meta);
    // Every lookup failure is an empty answer (`Ok(None)` on the client); a missing right is 41.
    let Some((_, _, topic)) = query_topic(&meta, user, s, t, Action::Poll)? else {
        return Ok(());
    };
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
    if let Some(stored) = key.stored_offset(&log) {
        out.put_u32(pid);
        out.put_u64(log.current_offset());
        out.put_u64(stored);
    }
    Ok(())
}

/// Where STORE/DELETE_CONSUMER_OFFSET act: stream and topic slot ids, the resolved consumer and
/// its partition; or 1009 / 2010 / 41 (no right to poll) / 5000 / NOT_RESOLVED_CONSUMER /
/// PARTITION_NOT_FOUND.
fn offset_target<'m>(
    meta: &'m Meta,
    client_id: u32,
    user: u32,
    (consumer, s, t, partition): OffsetRequest<'_>,
) -> Result<(usize, usize, Resolved, &'m Partition), u32> {
    let (sid, tid) = topic_for(meta, user, s, t, Action::Poll)?;
    let topic = topic_ref(meta, sid, tid)?;
    let resolved = resolve_consumer(topic, consumer, client_id, partition, false)?
        .ok_or(status::NOT_RESOLVED_CONSUMER)?;
    let p = topic
        .partitions
        .get(resolved.partition() as usize)
        .ok_or(status::PARTITION_NOT_FOUND)?;
    Ok((sid, tid, resolved, p))
}

pub(super) fn store_consumer_offset(req: Request<'_>) -> Reply {
    let shared = req.shared;
    let ((request, offset), user) = req.open(|r| Ok((offset_request(r)?, r.u64()?)))?;
    let meta = read(&shared.state.meta);
    let (sid, tid, resolved, p) = offset_target(&meta, req.session.client_id, user, request)?;
    let mut log = lock(&p.log);
    if (log.messages_count() == 0 && log.current_offset() == 0) || offset > log.current_offset() {
        return Err(status::INVALID_OFFSET);
    }
    resolved.store_offset(&mut log, offset);
    if let Some(store) = &shared.store {
        store.offsets_changed(sid, tid, resolved.partition() as usize, &log);
    }
    drop(log);
    drop(meta);
    if let Some(g) = resolved.group() {
        complete_group_revocations(shared, sid, tid, g as usize);
    }
    Ok(())
}

pub(super) fn delete_consumer_offset(req: Request<'_>) -> Reply {
    let (request, user) = req.open(offset_request)?;
    let meta = read(&req.shared.state.meta);
    let (sid, tid, resolved, p) = offset_target(&meta, req.session.client_id, user, request)?;
    let mut log = lock(&p.log);
    let removed = match resolved {
        Resolved::Consumer { key, .. } => log.consumer_offsets.remove(&key),
        Resolved::Group { group, .. } => log.group_offsets.remove(&group),
    };
    if removed.is_none() {
        return Err(status::CONSUMER_OFFSET_NOT_FOUND);
    }
    if let Some(store) = &req.shared.store {
        store.offsets_changed(sid, tid, resolved.partition() as usize, &log);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn named_consumer_key_is_xxhash32_of_name() {
        check!(consumer_key(Ident::Numeric(7)) == 7);
        check!(consumer_key(Ident::Name("c")) == u64::from(XxHash32::oneshot(0, b"c")));
    }
}
