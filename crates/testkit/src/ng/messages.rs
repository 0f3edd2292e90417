//! Messages in the 0.9 generation. A send is one batch: the routing section (the same bytes as a
//! 0.8 send's metadata), then a 256-byte batch header and one 48-byte frame per message
//! (checksum, id, offset delta, origin-timestamp delta in µs as a u32, lengths), payload before
//! user headers. The producer computes every checksum (XXH3-64) and the server verifies them
//! before anything is appended; the answer confirms where the batch went. A poll answers the
//! 0.8 16-byte prefix followed by batch records whose header carries the stored base offset and
//! the server's append time, each frame its deltas.
//!
//! Storage keeps 0.8 messages, so a send is rebuilt as the 0.8 batch the shared handler
//! validates and appends, and a poll answer is cut into records: one per run of messages that
//! share their append time (one send) and whose origin timestamps fit one record's span. The
//! frames' checksums are computed for the frames served.

use crate::handlers::{append_messages, handle, Reply, Session, Shared};
use crate::wire::{command, status, INDEX_SIZE, MESSAGE_HEADER_SIZE};
use iggy09_binary_protocol::batch::{
    calculate_batch_checksum, decode_batch_slice, BatchHeader, BATCH_HEADER_SIZE,
    BATCH_MESSAGE_HEADER_SIZE, MAX_TIMESTAMP_DELTA_MICROS,
};
use iggy09_binary_protocol::responses::messages::{
    SendMessagesConfirmationResponse, SendMessagesResponse,
};
use iggy09_binary_protocol::{WireEncode, WireError};
use iggy09_common::IggyError;
use twox_hash::XxHash3_64;

/// The poll answer's prefix: partition id, current offset, messages count.
const POLL_PREFIX: usize = 16;

/// SEND_MESSAGES and POLL_MESSAGES.
pub(super) fn execute(
    shared: &Shared,
    session: &mut Session,
    code: u32,
    body: &mut [u8],
    out: &mut Vec<u8>,
) -> Reply {
    if code == command::SEND_MESSAGES {
        let mut payload = send_payload(body)?;
        let appended = append_messages(shared, session, &mut payload)?;
        let answer = SendMessagesResponse {
            confirmations: vec![SendMessagesConfirmationResponse {
                stream_id: appended.stream_id,
                topic_id: appended.topic_id,
                partition_id: appended.partition_id,
                base_offset: appended.base_offset,
            }],
        };
        out.extend_from_slice(&answer.to_bytes());
        return Ok(());
    }
    let mut answer = Vec::new();
    handle(shared, session, code, body, &mut answer)?;
    poll_answer(&answer, out);
    Ok(())
}

/// The error code of a batch the server refuses.
fn batch_error(error: &WireError) -> u32 {
    match error {
        WireError::InvalidBatchChecksum { .. } => {
            IggyError::InvalidBatchChecksum(0, 0, 0).as_code()
        }
        WireError::InvalidMessageChecksum { .. } => {
            IggyError::InvalidMessageChecksum(0, 0, 0).as_code()
        }
        _ => status::INVALID_FORMAT,
    }
}

/// The 0.8 SEND_MESSAGES payload a 0.9 send body stands for, once the batch proved whole and
/// its checksums matched.
fn send_payload(body: &[u8]) -> Result<Vec<u8>, u32> {
    let metadata_len = body
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or(status::INVALID_FORMAT)?;
    let routing_end = 4usize
        .checked_add(metadata_len)
        .filter(|end| *end <= body.len() && metadata_len >= 4)
        .ok_or(status::INVALID_FORMAT)?;
    let count = u32::from_le_bytes(
        body[routing_end - 4..routing_end]
            .try_into()
            .map_err(|_| status::INVALID_FORMAT)?,
    );
    let batch_bytes = &body[routing_end..];
    let batch = decode_batch_slice(batch_bytes).map_err(|e| batch_error(&e))?;
    if batch.header.total_size() != batch_bytes.len() || batch.message_count() != count {
        return Err(status::INVALID_FORMAT);
    }
    if count == 0 {
        return Err(status::INVALID_MESSAGES_COUNT);
    }
    let origin = batch.header.origin_timestamp;
    let messages_len: usize = batch
        .iter()
        .map(|m| MESSAGE_HEADER_SIZE + m.payload.len() + m.user_headers.len())
        .sum();
    let mut payload = Vec::with_capacity(routing_end + count as usize * INDEX_SIZE + messages_len);
    // The routing section encodes alike in both generations.
    payload.extend_from_slice(&body[..routing_end]);
    let mut end = 0u32;
    for message in batch.iter() {
        end += (MESSAGE_HEADER_SIZE + message.payload.len() + message.user_headers.len()) as u32;
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.extend_from_slice(&end.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
    }
    for message in batch.iter() {
        let header = &message.header;
        payload.extend_from_slice(&0u64.to_le_bytes()); // checksum: stamped at append
        payload.extend_from_slice(&header.id.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes()); // offset
        payload.extend_from_slice(&0u64.to_le_bytes()); // timestamp
        let origin_timestamp = origin + u64::from(header.timestamp_delta);
        payload.extend_from_slice(&origin_timestamp.to_le_bytes());
        payload.extend_from_slice(&header.user_headers_length.to_le_bytes());
        payload.extend_from_slice(&header.payload_length.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.extend_from_slice(message.payload);
        payload.extend_from_slice(message.user_headers);
    }
    Ok(payload)
}

/// One stored 0.8 message as the poll answer holds it.
struct Stored<'a> {
    id: u128,
    offset: u64,
    timestamp: u64,
    origin_timestamp: u64,
    payload: &'a [u8],
    user_headers: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// The messages of a 0.8 poll answer (after its prefix), as the shared handler wrote them.
fn stored_messages(mut rest: &[u8]) -> Vec<Stored<'_>> {
    let mut messages = Vec::new();
    while rest.len() >= MESSAGE_HEADER_SIZE {
        let headers_len = u32_at(rest, 48) as usize;
        let payload_len = u32_at(rest, 52) as usize;
        let end = MESSAGE_HEADER_SIZE + payload_len + headers_len;
        if rest.len() < end {
            break;
        }
        messages.push(Stored {
            id: u128::from_le_bytes(rest[8..24].try_into().unwrap_or_default()),
            offset: u64_at(rest, 24),
            timestamp: u64_at(rest, 32),
            origin_timestamp: u64_at(rest, 40),
            payload: &rest[MESSAGE_HEADER_SIZE..MESSAGE_HEADER_SIZE + payload_len],
            user_headers: &rest[MESSAGE_HEADER_SIZE + payload_len..end],
        });
        rest = &rest[end..];
    }
    messages
}

/// How many of `messages` (at least one) go into one record: those with the first one's append
/// time and consecutive offsets, whose origin timestamps span at most what a record can carry.
fn record_len(messages: &[Stored<'_>]) -> usize {
    let first = &messages[0];
    let (mut low, mut high) = (first.origin_timestamp, first.origin_timestamp);
    let mut n = 1;
    for (i, m) in messages.iter().enumerate().skip(1) {
        low = low.min(m.origin_timestamp);
        high = high.max(m.origin_timestamp);
        let consecutive = m.offset == first.offset + i as u64;
        if m.timestamp != first.timestamp || !consecutive || high - low > MAX_TIMESTAMP_DELTA_MICROS
        {
            break;
        }
        n += 1;
    }
    n
}

/// Appends one batch record holding `messages` of `partition_id`.
fn put_record(out: &mut Vec<u8>, partition_id: u32, messages: &[Stored<'_>]) {
    let origin = messages
        .iter()
        .map(|m| m.origin_timestamp)
        .min()
        .unwrap_or(0);
    let base_offset = messages[0].offset;
    let header_at = out.len();
    out.resize(header_at + BATCH_HEADER_SIZE, 0);
    let blob_at = out.len();
    for m in messages {
        let frame_at = out.len();
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&m.id.to_le_bytes());
        out.extend_from_slice(&((m.offset - base_offset) as u32).to_le_bytes());
        out.extend_from_slice(&((m.origin_timestamp - origin) as u32).to_le_bytes());
        out.extend_from_slice(&(m.user_headers.len() as u32).to_le_bytes());
        out.extend_from_slice(&(m.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(m.payload);
        out.extend_from_slice(m.user_headers);
        let checksum = XxHash3_64::oneshot(&out[frame_at + 8..]);
        out[frame_at..frame_at + 8].copy_from_slice(&checksum.to_le_bytes());
    }
    debug_assert!(out.len() - blob_at >= messages.len() * BATCH_MESSAGE_HEADER_SIZE);
    let mut header = BatchHeader::new(
        u64::from(partition_id),
        origin,
        (out.len() - header_at) as u64,
        messages.len() as u32,
    );
    header.base_offset = base_offset;
    header.base_timestamp = messages[0].timestamp;
    header.batch_checksum = calculate_batch_checksum(&header, &out[blob_at..]);
    header.encode_into(&mut out[header_at..blob_at]);
}

/// The 0.9 answer of a poll the shared handler answered with `answer` (0.8 layout).
fn poll_answer(answer: &[u8], out: &mut Vec<u8>) {
    let Some(prefix) = answer.get(..POLL_PREFIX) else {
        out.extend_from_slice(answer);
        return;
    };
    out.extend_from_slice(prefix);
    let partition_id = u32_at(prefix, 0);
    let messages = stored_messages(&answer[POLL_PREFIX..]);
    let mut rest = &messages[..];
    while !rest.is_empty() {
        let n = record_len(rest);
        put_record(out, partition_id, &rest[..n]);
        rest = &rest[n..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;
    use iggy09_binary_protocol::requests::messages::{RawMessage, SendMessagesEncoder};
    use iggy09_binary_protocol::responses::messages::poll_messages::PolledBatchesIterator;
    use iggy09_binary_protocol::{WireIdentifier, WirePartitioning};

    fn stored(offset: u64, timestamp: u64, origin: u64, payload: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; MESSAGE_HEADER_SIZE];
        m[8..24].copy_from_slice(&(u128::from(offset) + 100).to_le_bytes());
        m[24..32].copy_from_slice(&offset.to_le_bytes());
        m[32..40].copy_from_slice(&timestamp.to_le_bytes());
        m[40..48].copy_from_slice(&origin.to_le_bytes());
        m[48..52].copy_from_slice(&2u32.to_le_bytes());
        m[52..56].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        m.extend_from_slice(b"hh");
        m
    }

    #[test]
    fn a_poll_answer_reads_back_with_every_timestamp() {
        let mut answer = Vec::new();
        answer.extend_from_slice(&3u32.to_le_bytes());
        answer.extend_from_slice(&9u64.to_le_bytes());
        answer.extend_from_slice(&4u32.to_le_bytes());
        // Two sends (append times 1000 and 2000); the second spans more than one record can.
        answer.extend(stored(5, 1000, 50, b"a"));
        answer.extend(stored(6, 1000, 40, b"bb"));
        answer.extend(stored(7, 2000, 10, b"c"));
        answer.extend(stored(8, 2000, 10 + MAX_TIMESTAMP_DELTA_MICROS + 1, b"d"));
        let mut out = Vec::new();
        poll_answer(&answer, &mut out);
        check!(out[..16] == answer[..16]);
        let polled: Vec<_> = PolledBatchesIterator::new(&out[16..])
            .map(Result::unwrap)
            .map(|m| {
                (
                    m.offset,
                    m.timestamp,
                    m.origin_timestamp,
                    m.payload.to_vec(),
                    m.id,
                )
            })
            .collect();
        check!(
            polled
                == vec![
                    (5, 1000, 50, b"a".to_vec(), 105),
                    (6, 1000, 40, b"bb".to_vec(), 106),
                    (7, 2000, 10, b"c".to_vec(), 107),
                    (
                        8,
                        2000,
                        10 + MAX_TIMESTAMP_DELTA_MICROS + 1,
                        b"d".to_vec(),
                        108
                    ),
                ]
        );
        // Three records: the second send had to be split.
        let records = decode_batch_slice(&out[16..]).unwrap();
        check!(records.message_count() == 2);
    }

    fn send_body(messages: &[RawMessage<'_>]) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        SendMessagesEncoder::encode(
            &mut buf,
            &WireIdentifier::Numeric(1),
            &WireIdentifier::Numeric(2),
            &WirePartitioning::PartitionId(0),
            messages,
        )
        .unwrap();
        buf.to_vec()
    }

    #[test]
    fn a_send_becomes_the_08_batch_with_origin_timestamps() {
        let body = send_body(&[
            RawMessage {
                id: 7,
                origin_timestamp: 500,
                headers: Some(b"hdr"),
                payload: b"one",
            },
            RawMessage {
                id: 8,
                origin_timestamp: 400,
                headers: None,
                payload: b"two!",
            },
        ]);
        let payload = send_payload(&body).unwrap();
        let routing_end = 4 + u32_at(&payload, 0) as usize;
        let messages = &payload[routing_end + 2 * INDEX_SIZE..];
        let parsed = stored_messages(messages);
        check!(parsed.len() == 2);
        check!(parsed[0].id == 7);
        check!(parsed[0].origin_timestamp == 500);
        check!(parsed[0].payload == b"one");
        check!(parsed[0].user_headers == b"hdr");
        check!(parsed[1].origin_timestamp == 400);
        check!(parsed[1].payload == b"two!");
        // The index ends each message where the next starts.
        check!(u32_at(&payload, routing_end + 4) as usize == MESSAGE_HEADER_SIZE + 6);
    }

    #[test]
    fn a_send_with_a_wrong_checksum_is_refused() {
        let mut body = send_body(&[RawMessage {
            id: 1,
            origin_timestamp: 1,
            headers: None,
            payload: b"x",
        }]);
        let last = body.len() - 1;
        body[last] ^= 1;
        check!(send_payload(&body).is_err());
    }
}
