//! SEND_MESSAGES (batch validation, permission, partitioning, append) and POLL_MESSAGES
//! (strategies, auto-commit, group bookkeeping).

use super::common::{
    auth, now_micros, random_uuid, resolve_topic, topic_for, topic_ref, Reply, Request, Session,
    Shared,
};
use super::groups::complete_group_revocations;
use super::offsets::resolve_consumer;
use crate::faults::SendDestination;
use crate::state::{lock, read, Partition};
use crate::users::Action;
use crate::wire::{
    le_u32, le_u64, send_ident, send_partitioning, status, Partitioning, Put, Strategy, INDEX_SIZE,
    MAX_PAYLOAD_SIZE, MAX_USER_HEADERS_SIZE, MESSAGE_HEADER_SIZE,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use twox_hash::XxHash32;

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

/// A SEND_MESSAGES request that passed every check of the server (auth, framing, batch
/// validation, stream and topic, the user's right to send, partition): what is left is the
/// append.
struct SendPlan<'a> {
    /// Stream slot id.
    sid: usize,
    /// Topic slot id.
    tid: usize,
    /// Partition id.
    partition_id: usize,
    /// The partition, resolved at check time.
    partition: Arc<Partition>,
    /// The batch's messages, stamped in place by the append.
    messages: &'a mut [u8],
    /// Messages in the batch.
    count: u32,
}

/// Checks a SEND_MESSAGES request in the server's order and returns what to append.
fn prepare_send<'a>(
    shared: &Shared,
    session: &Session,
    payload: &'a mut [u8],
) -> Result<SendPlan<'a>, u32> {
    let user = auth(session)?;
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
    let (sid, tid) = topic_for(&meta, user, stream_id, topic_id, Action::Send)?;
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
    Ok(SendPlan {
        sid,
        tid,
        partition_id,
        partition,
        messages,
        count,
    })
}

impl SendPlan<'_> {
    /// Appends the batch: sequential offsets, one server timestamp, ids for id 0. Returns where
    /// it went.
    fn apply(self, shared: &Shared) -> Result<Appended, u32> {
        let mut log = lock(&self.partition.log);
        let first_offset = log.next_offset();
        log.append(
            self.messages,
            self.count,
            now_micros(),
            shared.config.segment_size,
            &mut random_uuid,
        );
        if let Some(store) = &shared.store {
            store.appended(
                self.sid,
                self.tid,
                self.partition_id,
                first_offset,
                self.messages,
            );
        }
        Ok(Appended {
            stream_id: self.sid as u32,
            topic_id: self.tid as u32,
            partition_id: self.partition_id as u32,
            base_offset: first_offset,
        })
    }
}

/// Where an appended batch went (what a 0.9 send confirms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Appended {
    /// Stream id.
    pub(crate) stream_id: u32,
    /// Topic id.
    pub(crate) topic_id: u32,
    /// Partition id.
    pub(crate) partition_id: u32,
    /// Offset of the batch's first message.
    pub(crate) base_offset: u64,
}

pub(super) fn send_messages(shared: &Shared, session: &Session, payload: &mut [u8]) -> Reply {
    append_messages(shared, session, payload).map(drop)
}

/// SEND_MESSAGES with a 0.8 `payload`, answering where the batch went.
pub(crate) fn append_messages(
    shared: &Shared,
    session: &Session,
    payload: &mut [u8],
) -> Result<Appended, u32> {
    prepare_send(shared, session, payload)?.apply(shared)
}

/// Where a SEND_MESSAGES request goes, when it names an existing stream and topic and an
/// explicit partition; read without any check, for [`crate::SendHold`].
pub(crate) fn send_destination(shared: &Shared, payload: &[u8]) -> Option<SendDestination> {
    let metadata_len = le_u32(payload.get(..4)?, 0) as usize;
    let metadata = payload.get(4..4usize.checked_add(metadata_len)?)?;
    let (stream_id, n1) = send_ident(metadata).ok()?;
    let (topic_id, n2) = send_ident(metadata.get(n1..)?).ok()?;
    let (partitioning, _) = send_partitioning(metadata.get(n1 + n2..)?).ok()?;
    let Partitioning::PartitionId(partition) = partitioning else {
        return None;
    };
    let meta = read(&shared.state.meta);
    let (sid, tid) = resolve_topic(&meta, stream_id, topic_id).ok()?;
    let stream = meta.streams.get(sid)?;
    Some(SendDestination {
        stream: stream.name.clone(),
        topic: topic_ref(&meta, sid, tid).ok()?.name.clone(),
        partition,
    })
}

pub(super) fn poll_messages(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    let Request {
        shared, session, ..
    } = req;
    let ((consumer, s, t, partition, strategy, count, auto_commit), user) = req.open(|r| {
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
    let meta = read(&shared.state.meta);
    let (sid, tid) = topic_for(&meta, user, s, t, Action::Poll)?;
    let topic = topic_ref(&meta, sid, tid)?;
    let Some(resolved) = resolve_consumer(topic, consumer, session.client_id, partition, true)?
    else {
        out.put_u32(0);
        out.put_u64(0);
        out.put_u32(0);
        return Ok(());
    };
    let pid = resolved.partition();
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
        Strategy::Next => Some(
            resolved
                .stored_offset(&log)
                .map_or_else(|| log.first_offset(), |o| o + 1),
        ),
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
    if let Some(group) = resolved.group() {
        log.group_last_polled.insert(group, last);
    }
    if !auto_commit {
        return Ok(());
    }
    resolved.store_offset(&mut log, last);
    if let Some(store) = &shared.store {
        store.offsets_changed(sid, tid, pid as usize, &log);
    }
    drop(log);
    if let Some(group) = resolved.group() {
        complete_group_revocations(shared, sid, tid, group as usize);
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
}
