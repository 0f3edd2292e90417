//! Which of the batches queued behind the one a writer is about to send go out with it, in the
//! same send.
//!
//! Why: a partition has one send in flight (order and the writer's tail logic depend on it),
//! so it copies at most one send's worth per round trip to its target. Behind a far target
//! that is the bound: one 4 MiB batch per 80 ms round trip is about a third of what one
//! partition copies on loopback. The reader keeps polling while the send is out, and what it
//! queued meanwhile (at most `max_in_flight_batches` batches, each at most `max_batch_bytes`)
//! goes in the next send instead of one send each: the send grows with what the round trip let
//! pile up, and memory stays bounded by the queue, which already held those batches.
//!
//! Only behind a far target (`clients::distance`). A near target's sends take milliseconds;
//! joined, a busy loopback server takes long enough over them that the distance verdict, which
//! follows the shortest call of a window, turned far (seen in a three-instance catch-up on real
//! Iggy 0.8 servers): batches then grew for nothing and the copy ran at half its rate.
//!
//! A batch that starts after a gap (offsets lost to upstream retention) is never joined to the
//! one before it: the gap is reported with the batch it precedes.

use replicator_model::MAX_BATCH_SIZE;

use crate::datapath::unit::Batch;

/// Most message bytes one joined send holds: half of Iggy 0.9's 64 MiB frame limit, leaving
/// room for the message headers and provenance a send adds. A single batch larger than this
/// (a `max_batch_bytes` set above it) still goes, alone.
pub(crate) const MAX_JOINED_BYTES: u64 = 32 << 20;

/// Most messages one joined send holds: as many as the largest poll.
pub(crate) const MAX_JOINED_MESSAGES: usize = MAX_BATCH_SIZE as usize;

/// The size of a send being put together from queued batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JoinedSend {
    /// Whether batches join at all: the target is far.
    joins: bool,
    messages: usize,
    bytes: u64,
}

impl JoinedSend {
    /// A send of `first`, to a target that counts as far (`target_far`) or not.
    pub(crate) fn of(first: &Batch, target_far: bool) -> Self {
        Self {
            joins: target_far,
            messages: first.messages.len(),
            bytes: if target_far { bytes(first) } else { 0 },
        }
    }

    /// Whether `next`, the batch queued right behind what the send holds, joins it; if so,
    /// counts it in.
    pub(crate) fn admits(&mut self, next: &Batch) -> bool {
        if !self.joins || next.gap.is_some() {
            return false;
        }
        let messages = self.messages + next.messages.len();
        let bytes = self.bytes + self::bytes(next);
        if messages > MAX_JOINED_MESSAGES || bytes > MAX_JOINED_BYTES {
            return false;
        }
        (self.messages, self.bytes) = (messages, bytes);
        true
    }
}

/// A batch's messages as a send counts them (header, payload, user headers).
fn bytes(batch: &Batch) -> u64 {
    batch.messages.iter().map(|m| m.wire_bytes()).sum()
}

#[cfg(test)]
mod tests {
    use assert2::check;
    use bytes::Bytes;
    use replicator_sdk::Message;

    use crate::stats::Gap;

    use super::*;

    /// A batch of `count` messages of `payload` bytes each from `first` on.
    fn batch(first: u64, count: u64, payload: usize) -> Batch {
        let messages = (first..first + count)
            .map(|offset| {
                let mut m = Message::new(u128::from(offset), 0, Bytes::from(vec![0; payload]));
                m.offset = offset;
                m
            })
            .collect();
        Batch::new(messages, None).expect("a batch with messages")
    }

    #[test]
    fn queued_batches_join_until_the_bytes_or_the_messages_would_be_too_many() {
        let per_message = Message::HEADER_BYTES + 1_000;
        // Batches just under 4 MiB: eight fit in 32 MiB, a ninth does not.
        let count = (4 << 20) / per_message;
        let mut send = JoinedSend::of(&batch(0, count, 1_000), true);
        let mut joined = 1;
        while send.admits(&batch(joined * count, count, 1_000)) {
            joined += 1;
        }
        check!(joined == 8);
        check!(joined == MAX_JOINED_BYTES / (count * per_message));
        check!(send.bytes <= MAX_JOINED_BYTES);

        // Tiny messages: the message count binds first.
        let mut send = JoinedSend::of(&batch(0, 60_000, 1), true);
        check!(!send.admits(&batch(60_000, 40_001, 1)));
        check!(send.admits(&batch(60_000, 40_000, 1)));
        check!(send.messages == MAX_JOINED_MESSAGES);
    }

    #[test]
    fn behind_a_near_target_every_batch_is_a_send_of_its_own() {
        let mut send = JoinedSend::of(&batch(0, 10, 10), false);
        check!(!send.admits(&batch(10, 10, 10)));
        let mut far = JoinedSend::of(&batch(0, 10, 10), true);
        check!(far.admits(&batch(10, 10, 10)));
    }

    #[test]
    fn a_batch_after_a_gap_is_never_joined_to_the_one_before() {
        let mut send = JoinedSend::of(&batch(0, 10, 10), true);
        let mut after_gap = batch(20, 10, 10);
        after_gap.gap = Some(Gap { from: 10, to: 19 });
        check!(!send.admits(&after_gap));
        check!(send == JoinedSend::of(&batch(0, 10, 10), true));
    }

    #[test]
    fn a_batch_above_the_limit_alone_is_still_a_send_of_its_own() {
        let huge = batch(0, 40, 1 << 20);
        let mut send = JoinedSend::of(&huge, true);
        check!(send.bytes > MAX_JOINED_BYTES);
        check!(!send.admits(&batch(40, 1, 1)));
    }
}
