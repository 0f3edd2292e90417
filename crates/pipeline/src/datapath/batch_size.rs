//! How many messages a unit's reader asks for in its next poll: `batch_size`, grown while the
//! partition is behind, up to `max_batch_bytes` when its source or target is far
//! (`clients::distance`) and up to [`NEAR_BATCH_BYTES`] when both are near; and whether the
//! reader keeps the next range's poll in flight meanwhile (behind a far source).
//!
//! Why: a unit's requests wait for their answers (the SDK runs one request at a time per
//! connection; sends spread over connections could land out of order), so a partition copies
//! about one batch per round trip. Between regions that is the limit: 1,000 messages per 80 ms
//! is 12,500 messages a second whatever the link carries. A batch that holds a round trip's
//! worth of the partition's rate keeps the link busy instead, and a second poll in flight (on
//! another connection; polls at explicit offsets can be answered in any order and are taken in
//! order) hides the source's round trip behind the transfer. On loopback the round trips are
//! short and one poll stays in flight, but a partition behind still grows its batches a little
//! ([`NEAR_BATCH_BYTES`]): a real Iggy 0.8 server spends less per message on fewer, larger
//! requests. A caught-up partition polls `batch_size` (latency and memory as before). A
//! catching-up unit holds at most `max_batch_bytes` per batch: two being polled (three
//! for a moment after an answer sent ahead is dropped and polled again), `max_in_flight_batches`
//! queued, and the send: one batch, or behind a far target up to `max_in_flight_batches` + 1
//! joined (`writer::join`; README "Across regions" gives the bound).

/// What a grown batch holds while both the source and the target are near (or
/// `max_batch_bytes`, if less): about twice a poll of 1,000 messages of 256 B. On a loopback pair
/// of real Iggy 0.8 servers (BENCHMARKS.md section 53) batches grown to this took 40 % fewer
/// requests and less CPU per message in the copier and the target than batches of 1,000, and
/// the catch-up was 6 to 29 % faster; grown to 640 KiB, 768 KiB or 1 MiB it gained less or
/// nothing (the source answered a poll of 1 MiB three to eight times slower than one of 1,000
/// messages).
pub(crate) const NEAR_BATCH_BYTES: u64 = 512 << 10;

/// The batch size of one unit's polls.
#[derive(Debug, Clone)]
pub(crate) struct BatchSizer {
    /// `batch_size`: the size of every batch of a caught-up partition, and the least.
    base: u32,
    /// `max_batch_bytes`: what one grown batch may hold.
    max_bytes: u64,
    /// The size of the next poll.
    current: u32,
    /// The latest poll came back full from a far source.
    far_behind: bool,
}

/// Which of the unit's clusters count as far ([`crate::clients::distance`]) when a poll's
/// answer is taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Far {
    /// The source, whose connections the reader polls on.
    pub(crate) source: bool,
    /// The target, as the connections of the writer's latest send saw it.
    pub(crate) target: bool,
}

/// What one poll brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PollOutcome {
    /// Messages asked for.
    pub(crate) asked: u32,
    /// Messages the answer held from the asked offset on.
    pub(crate) got: u32,
}

impl BatchSizer {
    /// A sizer of `base` messages per batch that grows up to `max_bytes` per batch.
    pub(crate) fn new(base: u32, max_bytes: u64) -> Self {
        let base = base.max(1);
        Self {
            base,
            max_bytes,
            current: base,
            far_behind: false,
        }
    }

    /// Messages to ask for in the next poll.
    pub(crate) fn next(&self) -> u32 {
        self.current
    }

    /// Whether the reader should keep the poll of the next range in flight while it waits
    /// for the current one: the latest poll came back full from a far source (a far target
    /// gains nothing from it: its sends are the bottleneck).
    pub(crate) fn reads_ahead(&self) -> bool {
        self.far_behind
    }

    /// Takes in a poll's `outcome`, which of the unit's clusters are `far` and the messages'
    /// `bytes` as the target counts them (header, payload, user headers; summed only after a
    /// full poll): a poll that came back short means the partition is caught up, and the batch
    /// goes back to `batch_size`; a full one makes it what the bound holds of messages this
    /// size (at most [`replicator_model::MAX_BATCH_SIZE`], never less than `batch_size`) at
    /// once: `max_bytes` with either cluster far, [`NEAR_BATCH_BYTES`] (or `max_bytes`, if
    /// less) with both near. At once, because doubling took five round trips, a second at
    /// 200 ms, and a poll bigger than what is there just comes back short.
    ///
    /// Distance is the clusters' verdict, not this unit's round trips: a unit's calls also
    /// wait for their connection's turn and for a busy server, which bigger batches do not
    /// cure (on a loopback pair of real Iggy 0.8 servers, growing on the sends' times made a
    /// catch-up two and a half times slower; BENCHMARKS.md section 28).
    pub(crate) fn polled(&mut self, outcome: PollOutcome, far: Far, bytes: impl FnOnce() -> u64) {
        let full = outcome.got >= outcome.asked && outcome.got > 0;
        self.far_behind = full && far.source;
        if !full {
            self.current = self.base;
            return;
        }
        let bound = if far.source || far.target {
            self.max_bytes
        } else {
            self.max_bytes.min(NEAR_BATCH_BYTES)
        };
        let per_message = (bytes() / u64::from(outcome.got)).max(1);
        let fits = (bound / per_message).min(u64::from(replicator_model::MAX_BATCH_SIZE));
        let cap = u32::try_from(fits).unwrap_or(u32::MAX).max(self.base);
        self.current = cap;
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    /// A far source (the target near).
    const FAR: Far = Far {
        source: true,
        target: false,
    };
    const NEAR: Far = Far {
        source: false,
        target: false,
    };

    /// A poll's outcome and its bytes.
    type Poll = (PollOutcome, u64);

    fn full(asked: u32, per_message: u64) -> Poll {
        (
            PollOutcome { asked, got: asked },
            u64::from(asked) * per_message,
        )
    }

    /// A poll of `got` messages of `bytes` in all where `asked` were asked for.
    fn short(asked: u32, got: u32, bytes: u64) -> Poll {
        (PollOutcome { asked, got }, bytes)
    }

    fn take(sizer: &mut BatchSizer, (outcome, bytes): Poll, far: Far) {
        sizer.polled(outcome, far, || bytes);
    }

    /// A full poll of the size the sizer asks for next.
    fn take_next(sizer: &mut BatchSizer, per_message: u64, far: Far) {
        let poll = full(sizer.next(), per_message);
        take(sizer, poll, far);
    }

    #[test]
    fn a_near_partition_behind_grows_to_the_near_bound_only() {
        let mut sizer = BatchSizer::new(1000, 4 << 20);
        let mut seen = Vec::new();
        for _ in 0..4 {
            take_next(&mut sizer, 256, NEAR);
            seen.push(sizer.next());
        }
        // 512 KiB of 256-byte messages is 2,048, at once; nothing is read ahead.
        check!(seen == [2_048; 4]);
        check!(!sizer.reads_ahead());
        // A `max_batch_bytes` below the near bound is the bound.
        let mut sizer = BatchSizer::new(100, 128 << 10);
        take(&mut sizer, full(100, 256), NEAR);
        check!(sizer.next() == 512);
        // Caught up: back to `batch_size`.
        take(&mut sizer, short(512, 10, 2_560), NEAR);
        check!(sizer.next() == 100);
    }

    #[test]
    fn a_near_partition_of_large_messages_keeps_its_batch_size() {
        // 1,000 messages of 1 KiB already hold more than the near bound.
        let mut sizer = BatchSizer::new(1000, 4 << 20);
        take_next(&mut sizer, 1 << 10, NEAR);
        check!(sizer.next() == 1000);
    }

    #[test]
    fn a_far_partition_behind_grows_to_the_byte_bound() {
        let mut sizer = BatchSizer::new(1000, 4 << 20);
        let mut seen = Vec::new();
        for _ in 0..6 {
            take_next(&mut sizer, 256, FAR);
            seen.push(sizer.next());
        }
        // 4 MiB of 256-byte messages is 16,384, at once.
        check!(seen == [16_384; 6]);
        check!(sizer.reads_ahead());
        // Near again (the link got better): the batch shrinks to the near bound.
        take(&mut sizer, full(16_384, 256), NEAR);
        check!(sizer.next() == 2_048);
        check!(!sizer.reads_ahead());
    }

    #[test]
    fn a_far_target_grows_the_batches_but_reads_nothing_ahead() {
        let mut sizer = BatchSizer::new(1000, 4 << 20);
        let far_target = Far {
            source: false,
            target: true,
        };
        take(&mut sizer, full(1000, 256), far_target);
        check!(sizer.next() == 16_384);
        check!(!sizer.reads_ahead());
    }

    #[test]
    fn a_short_poll_goes_back_to_the_batch_size() {
        let mut sizer = BatchSizer::new(1000, 4 << 20);
        take(&mut sizer, full(1000, 256), FAR);
        check!(sizer.next() == 16_384);
        take(&mut sizer, short(16_384, 3999, 3999 * 256), FAR);
        check!(sizer.next() == 1000);
        check!(!sizer.reads_ahead());
        // Nothing at all is short too.
        take(&mut sizer, full(1000, 256), FAR);
        take(&mut sizer, short(2000, 0, 0), FAR);
        check!(sizer.next() == 1000);
    }

    #[test]
    fn the_bounds_hold_for_tiny_huge_and_odd_messages() {
        // Tiny messages stop at the largest batch Iggy's flows allow.
        let mut sizer = BatchSizer::new(1000, 64 << 20);
        take_next(&mut sizer, 1, FAR);
        check!(sizer.next() == replicator_model::MAX_BATCH_SIZE);
        // Messages so large that `batch_size` of them exceed the bound: never below it.
        let mut sizer = BatchSizer::new(100, 1 << 20);
        take(&mut sizer, full(100, 1 << 20), FAR);
        check!(sizer.next() == 100);
        // A zero base is one message; zero bytes count as one byte each.
        let mut sizer = BatchSizer::new(0, 1000);
        check!(sizer.next() == 1);
        take(&mut sizer, short(1, 1, 0), FAR);
        check!(sizer.next() == 1000);
    }
}
