//! One partition's messages: contiguous encoded bytes plus an offset → byte-position index, so a
//! poll is a `memcpy` of a byte range and an append stamps the received bytes and copies them once.
//! Also the partition's consumer offsets and the logical segment bookkeeping the real server
//! reports (`segments_count`) and cleans by.

use crate::wire::{le_u32, le_u64, MESSAGE_HEADER_SIZE};
use std::collections::{HashMap, VecDeque};
use twox_hash::XxHash3_64;

/// Bytes after which a storage chunk is closed and a new one started. Chunks grow by doubling up
/// to this size, so memory stays proportional to the stored data and a poll never has to look at
/// more than a handful of chunks.
const CHUNK_BYTES: usize = 8 * 1024 * 1024;

/// A run of consecutive messages stored back to back.
#[derive(Debug)]
struct Chunk {
    /// Offset of the first message in `data`.
    base_offset: u64,
    /// The encoded messages (64-byte header + payload + user headers each), as served by POLL.
    data: Vec<u8>,
    /// Start of message `i` (offset `base_offset + i`) inside `data`.
    positions: Vec<u32>,
}

impl Chunk {
    fn len(&self) -> u64 {
        self.positions.len() as u64
    }

    fn end_offset(&self) -> u64 {
        self.base_offset + self.len()
    }

    /// Byte range of messages `from..to` (indexes into `positions`).
    fn byte_range(&self, from: usize, to: usize) -> std::ops::Range<usize> {
        let start = self.positions[from] as usize;
        let end = self
            .positions
            .get(to)
            .map_or(self.data.len(), |p| *p as usize);
        start..end
    }

    fn timestamp_at(&self, index: usize) -> u64 {
        le_u64(&self.data, self.positions[index] as usize + 32)
    }
}

/// What the real server calls a segment: the unit of retention and of `segments_count`. Only
/// bookkeeping; the bytes live in chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentMeta {
    /// First offset the segment holds (or will hold, when empty).
    pub(crate) start_offset: u64,
    /// Messages currently in the segment.
    pub(crate) messages: u64,
    /// Encoded bytes currently in the segment.
    pub(crate) size_bytes: u64,
    /// Server timestamp (µs) of the newest message, 0 when empty.
    pub(crate) max_timestamp: u64,
}

impl SegmentMeta {
    fn empty(start_offset: u64) -> Self {
        Self {
            start_offset,
            messages: 0,
            size_bytes: 0,
            max_timestamp: 0,
        }
    }
}

/// A partition's log and offsets. Guarded by one `std::sync::Mutex` per partition; every method is
/// synchronous and short, so the lock is never held across an `.await`.
#[derive(Debug)]
pub(crate) struct PartitionLog {
    /// Stored bytes, oldest first; offsets are contiguous across chunks.
    chunks: VecDeque<Chunk>,
    /// Logical segments, oldest first; the last one is active.
    segments: VecDeque<SegmentMeta>,
    /// Offset of the newest message ever appended (the server's `current_offset`).
    last_offset: u64,
    /// False until the first append (and again after a purge): the server's
    /// `should_increment_offset`, which makes the first message get offset 0.
    has_messages: bool,
    /// Retained messages.
    messages_count: u64,
    /// Retained encoded bytes.
    size_bytes: u64,
    /// Newest batch timestamp, to keep timestamps monotonic.
    last_timestamp: u64,
    /// Stored offsets of plain consumers, keyed like the server (`PollingConsumer::consumer`).
    pub(crate) consumer_offsets: HashMap<u64, u64>,
    /// Stored offsets of consumer groups, keyed by group id.
    pub(crate) group_offsets: HashMap<u32, u64>,
    /// Last offset each consumer group polled (decides when a partition may change owner).
    pub(crate) group_last_polled: HashMap<u32, u64>,
}

impl Default for PartitionLog {
    fn default() -> Self {
        Self::new()
    }
}

impl PartitionLog {
    /// An empty partition with one empty segment at offset 0, like a freshly created one.
    pub(crate) fn new() -> Self {
        Self {
            chunks: VecDeque::new(),
            segments: VecDeque::from([SegmentMeta::empty(0)]),
            last_offset: 0,
            has_messages: false,
            messages_count: 0,
            size_bytes: 0,
            last_timestamp: 0,
            consumer_offsets: HashMap::new(),
            group_offsets: HashMap::new(),
            group_last_polled: HashMap::new(),
        }
    }

    /// The server's `current_offset`: offset of the newest message, 0 when none was ever stored.
    pub(crate) fn current_offset(&self) -> u64 {
        self.last_offset
    }

    /// Whether any message was ever appended since creation or the last purge.
    pub(crate) fn has_messages(&self) -> bool {
        self.has_messages
    }

    /// Offset the next appended message gets.
    pub(crate) fn next_offset(&self) -> u64 {
        if self.has_messages {
            self.last_offset + 1
        } else {
            0
        }
    }

    /// Start offset of the oldest retained segment (`PollingStrategy::first()`).
    pub(crate) fn first_offset(&self) -> u64 {
        self.segments.front().map_or(0, |s| s.start_offset)
    }

    /// Retained messages.
    pub(crate) fn messages_count(&self) -> u64 {
        self.messages_count
    }

    /// Retained encoded bytes (64-byte header + payload + user headers per message).
    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Logical segments (never 0: the active segment always exists).
    pub(crate) fn segments(&self) -> &VecDeque<SegmentMeta> {
        &self.segments
    }

    /// Stamps and stores a validated batch: `messages` holds exactly `count` well-formed messages
    /// back to back. Assigns sequential offsets, one server timestamp for the batch (kept
    /// monotonic per partition), a random id where the id is 0, and the XXH3-64 checksum over
    /// bytes 8..end of each message, all in place, then copies the bytes into the log once.
    pub(crate) fn append(
        &mut self,
        messages: &mut [u8],
        count: u32,
        now_micros: u64,
        segment_size: u64,
        new_id: &mut dyn FnMut() -> u128,
    ) {
        if count == 0 || messages.is_empty() {
            return;
        }
        let timestamp = now_micros.max(self.last_timestamp);
        let first = self.next_offset();
        let need_new_chunk = match self.chunks.back() {
            None => true,
            Some(c) => !c.data.is_empty() && c.data.len() + messages.len() > CHUNK_BYTES,
        };
        if need_new_chunk {
            self.chunks.push_back(Chunk {
                base_offset: first,
                data: Vec::with_capacity(messages.len()),
                positions: Vec::with_capacity(count as usize),
            });
        }
        let Some(chunk) = self.chunks.back_mut() else {
            return;
        };
        if chunk.positions.is_empty() {
            chunk.base_offset = first;
        }
        let base_position = chunk.data.len();
        let mut pos = 0usize;
        let mut offset = first;
        while pos + MESSAGE_HEADER_SIZE <= messages.len() {
            let payload_len = le_u32(messages, pos + 52) as usize;
            let headers_len = le_u32(messages, pos + 48) as usize;
            let size = MESSAGE_HEADER_SIZE + payload_len + headers_len;
            let msg = &mut messages[pos..pos + size];
            msg[24..32].copy_from_slice(&offset.to_le_bytes());
            msg[32..40].copy_from_slice(&timestamp.to_le_bytes());
            if le_u64(msg, 8) == 0 && le_u64(msg, 16) == 0 {
                msg[8..24].copy_from_slice(&new_id().to_le_bytes());
            }
            let checksum = XxHash3_64::oneshot(&msg[8..]);
            msg[0..8].copy_from_slice(&checksum.to_le_bytes());
            chunk.positions.push((base_position + pos) as u32);
            pos += size;
            offset += 1;
        }
        chunk.data.extend_from_slice(&messages[..pos]);
        let stored = offset - first;
        let bytes = pos as u64;

        if self
            .segments
            .back()
            .is_none_or(|s| s.size_bytes >= segment_size)
        {
            self.segments.push_back(SegmentMeta::empty(first));
        }
        if let Some(segment) = self.segments.back_mut() {
            if segment.messages == 0 {
                segment.start_offset = first;
            }
            segment.messages += stored;
            segment.size_bytes += bytes;
            segment.max_timestamp = timestamp;
        }
        self.last_offset = offset - 1;
        self.has_messages = true;
        self.messages_count += stored;
        self.size_bytes += bytes;
        self.last_timestamp = timestamp;
    }

    /// Copies up to `count` messages starting at `start` (or at the oldest retained offset when
    /// `start` is below it) into `out`; returns how many were copied.
    pub(crate) fn read(&self, start: u64, count: u32, out: &mut Vec<u8>) -> u32 {
        let mut remaining = count as u64;
        let mut copied = 0u32;
        let mut idx = self.chunks.partition_point(|c| c.end_offset() <= start);
        while remaining > 0 && idx < self.chunks.len() {
            let chunk = &self.chunks[idx];
            let from = start.saturating_sub(chunk.base_offset).min(chunk.len()) as usize;
            let to = (from as u64 + remaining).min(chunk.len()) as usize;
            if from < to {
                out.extend_from_slice(&chunk.data[chunk.byte_range(from, to)]);
                let n = (to - from) as u64;
                remaining -= n;
                copied += n as u32;
            }
            idx += 1;
        }
        copied
    }

    /// Offset of the first retained message whose server timestamp is ≥ `timestamp`.
    pub(crate) fn offset_at_timestamp(&self, timestamp: u64) -> Option<u64> {
        let idx = self
            .chunks
            .partition_point(|c| c.len() == 0 || c.timestamp_at(c.positions.len() - 1) < timestamp);
        let chunk = self.chunks.get(idx)?;
        let (mut lo, mut hi) = (0usize, chunk.positions.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if chunk.timestamp_at(mid) < timestamp {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo < chunk.positions.len()).then(|| chunk.base_offset + lo as u64)
    }

    /// Drops every retained message with an offset below `offset` (what a retention cleaner does
    /// to old segments). `current_offset` and stored consumer offsets stay. Returns the number of
    /// messages dropped.
    pub(crate) fn drop_before(&mut self, offset: u64) -> u64 {
        let offset = offset.min(self.next_offset());
        let mut dropped = 0u64;
        let mut dropped_bytes = 0u64;
        while let Some(front) = self.chunks.front_mut() {
            if front.end_offset() <= offset {
                dropped += front.len();
                dropped_bytes += front.data.len() as u64;
                self.chunks.pop_front();
                continue;
            }
            if front.base_offset < offset {
                let k = (offset - front.base_offset) as usize;
                let cut = front.positions[k];
                front.data.drain(..cut as usize);
                front.positions.drain(..k);
                for p in &mut front.positions {
                    *p -= cut;
                }
                front.base_offset = offset;
                dropped += k as u64;
                dropped_bytes += u64::from(cut);
            }
            break;
        }
        if dropped == 0 {
            if self.first_offset() < offset && self.messages_count == 0 {
                self.reset_segments_at(offset);
            }
            return 0;
        }
        // Apply the drop to the segment bookkeeping, oldest first; the active segment stays.
        let mut left_msgs = dropped;
        let mut left_bytes = dropped_bytes;
        while left_msgs > 0 {
            let several = self.segments.len() > 1;
            let Some(front) = self.segments.front_mut() else {
                break;
            };
            if front.messages <= left_msgs && several {
                left_msgs -= front.messages;
                left_bytes = left_bytes.saturating_sub(front.size_bytes);
                self.segments.pop_front();
            } else {
                front.messages -= left_msgs.min(front.messages);
                front.size_bytes = front.size_bytes.saturating_sub(left_bytes);
                left_msgs = 0;
            }
        }
        if let Some(front) = self.segments.front_mut() {
            front.start_offset = front.start_offset.max(offset);
        }
        self.messages_count -= dropped;
        self.size_bytes -= dropped_bytes;
        dropped
    }

    fn reset_segments_at(&mut self, offset: u64) {
        self.segments.clear();
        self.segments.push_back(SegmentMeta::empty(offset));
    }

    /// Drops the oldest `count` sealed segments (never the active one); returns messages dropped.
    pub(crate) fn drop_oldest_segments(&mut self, count: usize) -> u64 {
        let sealed = self.segments.len().saturating_sub(1);
        let n = count.min(sealed);
        if n == 0 {
            return 0;
        }
        let until = self.segments[n].start_offset;
        self.drop_before(until)
    }

    /// Removes every message and stored offset and restarts offsets at 0 (PURGE_TOPIC/STREAM).
    pub(crate) fn purge(&mut self) {
        self.chunks.clear();
        self.reset_segments_at(0);
        self.last_offset = 0;
        self.has_messages = false;
        self.messages_count = 0;
        self.size_bytes = 0;
        self.consumer_offsets.clear();
        self.group_offsets.clear();
        self.group_last_polled.clear();
    }

    /// Lowest offset stored by any consumer or group: segments above it are kept by the cleaner.
    fn lowest_stored_offset(&self) -> Option<u64> {
        self.consumer_offsets
            .values()
            .chain(self.group_offsets.values())
            .copied()
            .min()
    }

    /// Whether the oldest sealed segment may be deleted by the cleaner: it exists, is not the
    /// active segment, and no stored consumer offset is below its end.
    pub(crate) fn oldest_sealed_deletable(&self) -> Option<&SegmentMeta> {
        if self.segments.len() < 2 {
            return None;
        }
        let oldest = self.segments.front()?;
        let end = (oldest.start_offset + oldest.messages).saturating_sub(1);
        match self.lowest_stored_offset() {
            Some(lowest) if end > lowest => None,
            _ => Some(oldest),
        }
    }

    /// Deletes sealed segments whose newest message is older than `expiry_micros` at `now`,
    /// oldest first. Returns messages dropped.
    pub(crate) fn expire_segments(&mut self, now_micros: u64, expiry_micros: u64) -> u64 {
        let mut dropped = 0;
        while let Some(oldest) = self.oldest_sealed_deletable() {
            if oldest.max_timestamp.saturating_add(expiry_micros) > now_micros {
                break;
            }
            dropped += self.drop_oldest_segments(1);
        }
        dropped
    }

    /// Deletes the oldest deletable sealed segment; returns the bytes freed (0 when none).
    pub(crate) fn drop_oldest_sealed(&mut self) -> u64 {
        if self.oldest_sealed_deletable().is_none() {
            return 0;
        }
        let before = self.size_bytes;
        self.drop_oldest_segments(1);
        before - self.size_bytes
    }

    /// Every retained message as one contiguous byte vector (persistence snapshots).
    pub(crate) fn encoded_messages(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks.iter().map(|c| c.data.as_slice())
    }

    /// Restores the non-message state of a partition from persisted metadata.
    pub(crate) fn restore_counters(&mut self, last_offset: u64, has_messages: bool) {
        self.last_offset = last_offset;
        self.has_messages = has_messages;
        if self.messages_count == 0 {
            self.reset_segments_at(self.next_offset());
        }
    }

    /// Appends already stamped messages (loaded from disk) without touching their headers.
    pub(crate) fn load_stamped(&mut self, messages: &[u8], segment_size: u64) -> Result<(), u64> {
        let mut pos = 0usize;
        while pos < messages.len() {
            if pos + MESSAGE_HEADER_SIZE > messages.len() {
                return Err(pos as u64);
            }
            let payload_len = le_u32(messages, pos + 52) as usize;
            let headers_len = le_u32(messages, pos + 48) as usize;
            let size = MESSAGE_HEADER_SIZE + payload_len + headers_len;
            if pos + size > messages.len() {
                return Err(pos as u64);
            }
            let msg = &messages[pos..pos + size];
            let offset = le_u64(msg, 24);
            let timestamp = le_u64(msg, 32);
            if self.has_messages && offset != self.last_offset + 1 {
                return Err(pos as u64);
            }
            let need_new_chunk = match self.chunks.back() {
                None => true,
                Some(c) => c.data.len() + size > CHUNK_BYTES || c.end_offset() != offset,
            };
            if need_new_chunk {
                self.chunks.push_back(Chunk {
                    base_offset: offset,
                    data: Vec::new(),
                    positions: Vec::new(),
                });
            }
            if let Some(chunk) = self.chunks.back_mut() {
                chunk.positions.push(chunk.data.len() as u32);
                chunk.data.extend_from_slice(msg);
            }
            if self.messages_count == 0 {
                self.reset_segments_at(offset);
            } else if self
                .segments
                .back()
                .is_none_or(|s| s.size_bytes >= segment_size)
            {
                self.segments.push_back(SegmentMeta::empty(offset));
            }
            if let Some(segment) = self.segments.back_mut() {
                segment.messages += 1;
                segment.size_bytes += size as u64;
                segment.max_timestamp = timestamp;
            }
            self.last_offset = offset;
            self.has_messages = true;
            self.messages_count += 1;
            self.size_bytes += size as u64;
            self.last_timestamp = self.last_timestamp.max(timestamp);
            pos += size;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::{assert, check};

    /// Encodes messages the way the SDK does: zero checksum/offset/timestamp/reserved.
    fn batch(payloads: &[&[u8]], ids: &[u128]) -> Vec<u8> {
        let mut out = Vec::new();
        for (p, id) in payloads.iter().zip(ids) {
            out.extend_from_slice(&0u64.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
            out.extend_from_slice(&7u64.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(&0u64.to_le_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    fn append(log: &mut PartitionLog, payloads: &[&[u8]], now: u64) {
        let ids: Vec<u128> = payloads.iter().map(|_| 0).collect();
        let mut b = batch(payloads, &ids);
        let mut next = 1000u128;
        log.append(&mut b, payloads.len() as u32, now, 1 << 30, &mut || {
            next += 1;
            next
        });
    }

    fn offsets(buf: &[u8]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < buf.len() {
            out.push(le_u64(buf, pos + 24));
            pos += 64 + le_u32(buf, pos + 52) as usize + le_u32(buf, pos + 48) as usize;
        }
        out
    }

    #[test]
    fn first_message_gets_offset_zero_and_current_offset_is_last() {
        let mut log = PartitionLog::new();
        check!(log.current_offset() == 0);
        check!(!log.has_messages());
        append(&mut log, &[b"a", b"b", b"c"], 10);
        check!(log.current_offset() == 2);
        check!(log.next_offset() == 3);
        check!(log.messages_count() == 3);
        check!(log.size_bytes() == 3 * 65);
    }

    #[test]
    fn append_stamps_offsets_timestamp_ids_and_checksum() {
        let mut log = PartitionLog::new();
        let mut b = batch(&[b"x", b"y"], &[5, 0]);
        log.append(&mut b, 2, 99, 1 << 30, &mut || 42);
        let mut out = Vec::new();
        check!(log.read(0, 10, &mut out) == 2);
        check!(offsets(&out) == vec![0, 1]);
        check!(le_u64(&out, 32) == 99);
        check!(le_u64(&out, 65 + 32) == 99);
        let id0 = u128::from_le_bytes(out[8..24].try_into().unwrap());
        let id1 = u128::from_le_bytes(out[65 + 8..65 + 24].try_into().unwrap());
        check!(id0 == 5);
        check!(id1 == 42);
        check!(le_u64(&out, 0) == XxHash3_64::oneshot(&out[8..65]));
        check!(le_u64(&out, 40) == 7, "origin timestamp kept");
    }

    #[test]
    fn read_respects_start_and_count_across_chunks() {
        let mut log = PartitionLog::new();
        let big = vec![1u8; CHUNK_BYTES / 2];
        append(&mut log, &[&big], 1);
        append(&mut log, &[&big], 2);
        append(&mut log, &[b"z"], 3);
        check!(log.chunks.len() == 2);
        let mut out = Vec::new();
        check!(log.read(1, 2, &mut out) == 2);
        check!(offsets(&out) == vec![1, 2]);
        out.clear();
        check!(log.read(3, 5, &mut out) == 0);
    }

    #[test]
    fn drop_before_keeps_current_offset_and_clamps_reads() {
        let mut log = PartitionLog::new();
        append(&mut log, &[b"a", b"b", b"c", b"d"], 1);
        check!(log.drop_before(2) == 2);
        check!(log.current_offset() == 3);
        check!(log.messages_count() == 2);
        check!(log.size_bytes() == 2 * 65);
        check!(log.first_offset() == 2);
        let mut out = Vec::new();
        check!(log.read(0, 10, &mut out) == 2);
        check!(offsets(&out) == vec![2, 3]);
        check!(log.drop_before(1) == 0, "already dropped");
        check!(log.drop_before(100) == 2, "clamped to the end");
        check!(log.messages_count() == 0);
        check!(log.first_offset() == 4);
        append(&mut log, &[b"e"], 2);
        out.clear();
        check!(log.read(0, 10, &mut out) == 1);
        check!(offsets(&out) == vec![4]);
    }

    #[test]
    fn timestamps_are_one_per_batch_and_searchable() {
        let mut log = PartitionLog::new();
        append(&mut log, &[b"a", b"b"], 100);
        append(&mut log, &[b"c"], 200);
        append(&mut log, &[b"d"], 150);
        check!(log.offset_at_timestamp(0) == Some(0));
        check!(log.offset_at_timestamp(101) == Some(2));
        check!(log.offset_at_timestamp(200) == Some(2));
        check!(log.offset_at_timestamp(201) == None);
    }

    #[test]
    fn purge_restarts_offsets_at_zero() {
        let mut log = PartitionLog::new();
        append(&mut log, &[b"a"], 1);
        log.consumer_offsets.insert(1, 0);
        log.purge();
        check!(log.consumer_offsets.is_empty());
        check!(!log.has_messages());
        append(&mut log, &[b"b"], 2);
        check!(log.current_offset() == 0);
    }

    #[test]
    fn segments_roll_when_full_and_oldest_can_be_dropped() {
        let mut log = PartitionLog::new();
        let mut next = 0u128;
        for _ in 0..4 {
            let mut b = batch(&[b"0123456789"], &[1]);
            log.append(&mut b, 1, 1, 100, &mut || {
                next += 1;
                next
            });
        }
        // each message is 74 bytes: a segment is full after 2 messages.
        assert!(log.segments().len() == 2);
        check!(log.segments()[1].start_offset == 2);
        check!(log.drop_oldest_segments(5) == 2);
        check!(log.segments().len() == 1);
        check!(log.first_offset() == 2);
        check!(
            log.drop_oldest_segments(1) == 0,
            "the active segment is never dropped"
        );
    }

    #[test]
    fn load_stamped_round_trips_encoded_messages() {
        let mut log = PartitionLog::new();
        append(&mut log, &[b"a", b"bb"], 5);
        let bytes: Vec<u8> = log.encoded_messages().flatten().copied().collect();
        let mut copy = PartitionLog::new();
        assert!(copy.load_stamped(&bytes, 1 << 30).is_ok());
        check!(copy.current_offset() == 1);
        check!(copy.messages_count() == 2);
        let mut out = Vec::new();
        copy.read(0, 10, &mut out);
        check!(out == bytes);
    }
}
