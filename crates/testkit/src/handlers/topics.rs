//! Topic commands, and the topic and partition records that topic and stream answers carry.

use super::common::{
    now_micros, query_stream, query_topic, stream_for, topic_for, topic_ref, topic_request, Reply,
    Request, Shared, MAX_PARTITIONS_PER_REQUEST,
};
use crate::state::{lock, Partition, Topic};
use crate::users::Action;
use crate::wire::{status, DecodeError, Put, Reader};
use std::sync::atomic::AtomicUsize;

/// `(size in bytes, messages count)` of a partition, as stream and topic records carry them.
fn partition_stats(p: &Partition) -> (u64, u64) {
    let log = lock(&p.log);
    (log.size_bytes(), log.messages_count())
}

/// Adds up `(size, messages)` pairs.
pub(super) fn sum_stats(stats: impl IntoIterator<Item = (u64, u64)>) -> (u64, u64) {
    stats
        .into_iter()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

pub(super) fn topic_stats(t: &Topic) -> (u64, u64) {
    sum_stats(t.partitions.iter().map(|p| partition_stats(p)))
}

pub(super) fn topic_record(out: &mut Vec<u8>, id: usize, t: &Topic, stats: (u64, u64)) {
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

pub(super) fn get_topics(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(
        |r| r.ident(),
        |meta, user, id| {
            if let Some((_, s)) = query_stream(meta, user, id, Action::ReadTopics)? {
                for (tid, t) in s.topics.iter() {
                    topic_record(out, tid, t, topic_stats(t));
                }
            }
            Ok(())
        },
    )
}

pub(super) fn get_topic(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(topic_request, |meta, user, (s, t)| {
        if let Some((_, tid, topic)) = query_topic(meta, user, s, t, Action::ReadTopic)? {
            topic_record(out, tid, topic, topic_stats(topic));
            partition_records(out, topic, false);
        }
        Ok(())
    })
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

/// `CompressionAlgorithm::from_code`: 1 none, 2 gzip, anything else 3.
fn check_compression(code: u8) -> Reply {
    if (1..=2).contains(&code) {
        Ok(())
    } else {
        Err(status::INVALID_COMMAND)
    }
}

pub(super) fn create_topic(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.change(
        |r| {
            let stream_id = r.ident()?;
            let partitions_count = r.u32()?;
            Ok((stream_id, partitions_count, topic_settings(r)?))
        },
        |meta, user, request| {
            let (stream_id, partitions_count, settings) = request;
            if partitions_count > MAX_PARTITIONS_PER_REQUEST {
                return Err(status::TOO_MANY_PARTITIONS);
            }
            check_compression(settings.compression)?;
            // ServerDefault (0) resolves to the default config: expiry "none", size "unlimited".
            let message_expiry = match settings.message_expiry {
                0 => u64::MAX,
                v => v,
            };
            let max_topic_size = match settings.max_topic_size {
                0 => u64::MAX,
                v => v,
            };
            let sid = stream_for(meta, user, stream_id, Action::CreateTopic)?;
            if max_topic_size < req.shared.config.segment_size {
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
                options: Vec::new(),
            };
            let tid = stream.topics.insert(topic);
            let topic = topic_ref(meta, sid, tid)?;
            topic_record(out, tid, topic, (0, 0));
            partition_records(out, topic, true);
            Ok(())
        },
    )
}

pub(super) fn update_topic(req: Request<'_>) -> Reply {
    req.change(
        |r| Ok((r.ident()?, r.ident()?, topic_settings(r)?)),
        |meta, user, (s, t, settings)| {
            check_compression(settings.compression)?;
            let (sid, tid) = topic_for(meta, user, s, t, Action::ManageTopic)?;
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
            Ok(())
        },
    )
}

pub(super) fn delete_topic(req: Request<'_>) -> Reply {
    req.change(topic_request, |meta, user, (s, t)| {
        let (sid, tid) = topic_for(meta, user, s, t, Action::ManageTopic)?;
        if let Some(stream) = meta.streams.get_mut(sid) {
            stream.topics.remove(tid);
        }
        req.shared
            .state
            .forget_groups(|s, t, _| s == sid && t == tid);
        // Partition data first, metadata after: see `delete_stream`.
        if let Some(store) = &req.shared.store {
            store.topic_deleted(sid, tid);
        }
        Ok(())
    })
}

pub(super) fn purge_topic(req: Request<'_>) -> Reply {
    req.query(topic_request, |meta, user, (s, t)| {
        let (sid, tid) = topic_for(meta, user, s, t, Action::ManageTopic)?;
        purge_partitions(req.shared, sid, tid, topic_ref(meta, sid, tid)?);
        Ok(())
    })
}

pub(super) fn purge_partitions(shared: &Shared, sid: usize, tid: usize, t: &Topic) {
    for (pid, p) in t.partitions.iter().enumerate() {
        let mut log = lock(&p.log);
        log.purge();
        if let Some(store) = &shared.store {
            store.partition_rewritten(sid, tid, pid, &log);
        }
    }
}
