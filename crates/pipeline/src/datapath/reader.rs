//! The partition reader of one unit: a task that polls one upstream partition at explicit
//! offsets and hands batches to its writer through a bounded channel (a full channel holds the
//! reader: backpressure).
//!
//! A caught-up reader polls again after `poll_interval`, then ever more slowly (see
//! [`idle_wait`]); once its partition counts as idle it stops polling on a timer and waits for
//! its stream's activity watcher (`activity`), which wakes it when metadata shows a message it
//! has not read, with a slow safety-net poll in case the metadata is wrong.
//!
//! Behind a far source a message waits for the next poll to reach the source: up to a round
//! trip with one poll in flight. With `far_source_polls` above 1 a caught-up reader keeps that
//! many polls in flight, each on a connection nobody else is using then (if one is free), sent
//! a round trip's share apart, and takes from each answer what follows what it already has
//! ([`Staggered`]).
//!
//! A poll answer whose partition end (`current_offset`) is below what the reader already read
//! means the partition was reset (purged, or the topic deleted and recreated with fewer
//! messages): the reader stops polling, its writer drains what was read before, and the pair
//! ends; the next pair's writer finds out what happened (new creation time, new history) before
//! it sends anything (`writer::resume`), so that nothing of the new history is skipped or
//! copied under the old one's label.
//!
//! The pair's stop token ends every wait of the reader (for the writer's start signal, for
//! room in the channel, for its next poll, for a retry) at once; a poll in progress is finished
//! first. The reader ending closes the channel, which is the writer's signal to drain.

use std::collections::VecDeque;
use std::future::Future as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use replicator_sdk::types::{Consumer, Identifier, PollingStrategy};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{with_jitter, Backoff};
use crate::clients::activity::{self, Idle, StreamActivity, WatchParams};
use crate::clients::{polled_bytes, Pick};
use crate::control::ControlPlane;
use crate::datapath::batch_size::{BatchSizer, Far, PollOutcome};
use crate::datapath::offsets::{detect_gap, ReadFrom};
use crate::datapath::unit::{named, Batch, UnitShared};
use crate::error::{Error, Result};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::Message;

/// What the coordinator starts a reader with.
pub(crate) struct ReaderArgs<C> {
    /// The unit's shared context.
    pub(crate) shared: Arc<UnitShared<C>>,
    /// Sending side of the bounded channel to the writer.
    pub(crate) tx: mpsc::Sender<Box<Batch>>,
    /// Where to start, sent by the writer once it found the resume point.
    pub(crate) start: oneshot::Receiver<ReadFrom>,
    /// The pair's stop token.
    pub(crate) stop: CancellationToken,
}

/// Runs the reader of one unit until it is stopped or its writer is gone; returns why, or the
/// error it gave up on.
pub(crate) async fn run<C: ControlPlane>(args: ReaderArgs<C>) -> Result<&'static str> {
    let ReaderArgs {
        shared,
        tx,
        start,
        stop,
    } = args;
    let (stream, topic) = shared.upstream_ids()?;
    let consumer = Consumer::new(named(
        &format!("iggy-replicator.{}", shared.unit.flow),
        &shared.unit,
    )?);
    let next = tokio::select! {
        biased;
        () = stop.cancelled() => return Ok("stopped before start"),
        from = start => match from {
            Ok(from) => from,
            Err(_) => return Ok("writer gone before start"),
        },
    };
    let mut reader = Reader {
        sizer: BatchSizer::new(shared.flow.batch_size, shared.flow.max_batch_bytes),
        ahead: None,
        staggered: VecDeque::new(),
        stagger_misses: 0,
        stagger_slot: 0,
        round_trip: Duration::ZERO,
        backoff: Backoff::new(shared.tuning.backoff, shared.seed),
        rng: SmallRng::seed_from_u64(shared.seed.rotate_left(17)),
        ids: (stream, topic, consumer),
        shared,
        tx,
        stop,
        next,
        empty_polls: 0,
        activity: None,
        listed_before_poll: None,
    };
    reader.run().await
}

/// A running reader.
struct Reader<C> {
    shared: Arc<UnitShared<C>>,
    tx: mpsc::Sender<Box<Batch>>,
    stop: CancellationToken,
    /// Next offset to poll.
    next: ReadFrom,
    /// Upstream stream and topic ids, and the plain consumer.
    ids: (Identifier, Identifier, Consumer),
    /// Retry backoff for transient poll failures.
    backoff: Backoff,
    /// Empty polls in a row (they set how the reader waits for its next poll, see [`idle_wait`]).
    empty_polls: u32,
    /// The activity watcher of the unit's stream, fetched from the source cluster's registry the
    /// first time the partition goes idle.
    activity: Option<Arc<StreamActivity>>,
    /// The watcher's [`StreamActivity::listed`] as read right before the latest poll was sent
    /// (`None` before the reader had a watcher): what the reader subscribes with when that poll
    /// found nothing, so that the watcher knows which listings came too early to show what the
    /// poll missed.
    listed_before_poll: Option<u64>,
    /// Jitter of the safety-net polls, seeded from the pair's seed.
    rng: SmallRng,
    /// How many messages the next poll asks for.
    sizer: BatchSizer,
    /// The poll of the range after the current one, sent before its answer came.
    ahead: Option<Ahead>,
    /// The polls a caught-up reader behind a far source keeps in flight, oldest first.
    staggered: VecDeque<Staggered>,
    /// Answers of staggered polls in a row that brought nothing after what the reader has.
    stagger_misses: u32,
    /// Which of its connections (relative to the unit's slot) the next staggered poll takes.
    stagger_slot: usize,
    /// The latest poll's round trip: what the staggered polls are spread over.
    round_trip: Duration,
}

impl<C: ControlPlane> Reader<C> {
    async fn run(&mut self) -> Result<&'static str> {
        loop {
            if self.stop.is_cancelled() {
                return Ok("stopped");
            }
            // Boxed: an idle reader waits in `wait_idle` for most of its life, and its future
            // would otherwise be as large as the poll's (see `Writer::run`).
            let woken = match Box::pin(self.poll_once()).await {
                Ok(Polled::Batch(batch)) => {
                    self.backoff.reset();
                    self.empty_polls = 0;
                    tokio::select! {
                        biased;
                        () = self.stop.cancelled() => return Ok("stopped"),
                        sent = self.tx.send(Box::new(batch)) => match sent {
                            Ok(()) => continue,
                            Err(_) => return Ok("writer gone"),
                        },
                    }
                }
                Ok(Polled::Reset { current_offset }) => {
                    tracing::warn!(
                        next = self.next.offset,
                        current_offset,
                        "upstream partition went back below what was read (purged or \
                         recreated); the unit restarts to copy its new history"
                    );
                    return Ok("upstream partition reset");
                }
                Ok(Polled::Empty) => {
                    self.backoff.reset();
                    self.empty_polls = self.empty_polls.saturating_add(1);
                    self.wait_idle().await
                }
                Err(err) if err.is_transient() => {
                    self.shared.meters.error(err.kind());
                    let budget = self.shared.tuning.retry_budget;
                    let Some(delay) = self.backoff.on_failure(Instant::now(), budget) else {
                        return Err(err);
                    };
                    tracing::warn!(error = %err, backoff = ?delay, "poll failed, retrying");
                    self.pause(delay).await
                }
                Err(err) => return Err(err),
            };
            if !woken {
                return Ok("stopped");
            }
        }
    }

    /// Waits for `delay`; `false` when the pair was stopped meanwhile.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// Waits as [`idle_wait`] says after an empty poll: a pause, or the stream's activity
    /// watcher with a safety-net timer; `false` when the pair was stopped meanwhile.
    async fn wait_idle(&mut self) -> bool {
        let watcher = Watcher {
            degraded: self.activity.as_ref().is_some_and(|a| a.degraded()),
            // Counting this reader, about to subscribe.
            watched: self.activity.as_ref().map_or(0, |a| a.watched()) + 1,
        };
        let jitter = self.rng.gen::<f64>();
        let cap = match idle_wait(&self.shared.flow, self.empty_polls, watcher, jitter) {
            IdleWait::Pause(delay) => return self.pause(delay).await,
            IdleWait::Watch(cap) => cap,
        };
        let shared = &self.shared;
        let ids = &self.ids;
        let activity = self.activity.get_or_insert_with(|| {
            activity::watch(
                &shared.source,
                WatchParams {
                    flow: shared.unit.flow.clone(),
                    stream: shared.unit.stream.clone(),
                    stream_id: ids.0.clone(),
                    interval: shared.flow.idle_poll_interval,
                    observer: shared.tuning.observer.clone(),
                },
            )
        });
        // Withdrawn when dropped, whichever of the three comes first.
        let mut subscription = activity.subscribe(Idle {
            topic: &shared.unit.topic,
            topic_id: &ids.1,
            partition: shared.unit.partition,
            next: self.next.offset,
            listed_before_poll: self.listed_before_poll,
        });
        tokio::select! {
            biased;
            () = self.stop.cancelled() => false,
            () = subscription.woken() => true,
            () = tokio::time::sleep(cap) => true,
        }
    }

    /// Polls once from `next`: a batch when the partition held something from there on.
    ///
    /// While the partition is behind a far source ([`BatchSizer::reads_ahead`]) the poll of
    /// the range after this one goes out before this one's answer arrives, on the next
    /// connection slot, so that two polls are in flight. Its answer is used only if it is full
    /// and starts exactly where the reader then is (the same messages a poll sent then would
    /// have brought, as messages never change); anything else is dropped and the range
    /// polled again, so an answer sent ahead never decides a gap, a reset or an idle wait.
    async fn poll_once(&mut self) -> Result<Polled> {
        if self.staggers() {
            if let Some(polled) = self.poll_staggered().await? {
                return Ok(polled);
            }
        } else {
            self.stop_staggering();
        }
        let from = self.next;
        // Before the request goes out: a listing counted here saw the partition no later than
        // this poll does (see `activity`).
        self.listed_before_poll = self.activity.as_ref().map(|a| a.listed());
        if let Some(ahead) = self.ahead.take().filter(|a| a.from == from.offset) {
            if self.sizer.reads_ahead() {
                // On the other slot: the one of the answer awaited next is busy until then.
                let next = ahead.from.saturating_add(u64::from(ahead.count));
                self.send_ahead(next, 1 - ahead.slot_offset);
            }
            let answer = ahead.answer.await;
            if let Ok((Ok(polled), round_trip)) = answer {
                if starts_full(&polled, ahead.from, ahead.count) {
                    self.shared.meters.set_batch_size(ahead.count);
                    return self.take_in(from, from.offset, ahead.count, Ok(polled), round_trip);
                }
            }
            // Dropped: what was sent after it assumed it full, so that goes too.
            self.ahead = None;
        }
        let count = self.sizer.next();
        self.shared.meters.set_batch_size(count);
        if self.sizer.reads_ahead() {
            self.send_ahead(from.offset.saturating_add(u64::from(count)), 1);
        }
        let started = Instant::now();
        let via = (self.shared.slot(), Pick::AroundPings);
        let polled = poll(&self.shared, &self.ids, via, from.offset, count).await;
        self.take_in(from, from.offset, count, polled, started.elapsed())
    }

    /// Whether the reader keeps staggered polls in flight: `far_source_polls` above 1, its
    /// source far, its partition caught up (behind, it reads ahead instead), and its staggered
    /// polls not missing [`QUIET_POLLS`] times in a row (then the partition is quiet, and the
    /// reader goes back to one poll at a time, whose empty answers lead to its idle waits).
    fn staggers(&self) -> bool {
        self.shared.flow.far_source_polls > 1
            && self.shared.source.far()
            && !self.sizer.reads_ahead()
            && self.empty_polls == 0
            && self.stagger_misses < QUIET_POLLS
    }

    /// Drops the staggered polls in flight (their answers would come too late to matter).
    fn stop_staggering(&mut self) {
        for poll in self.staggered.drain(..) {
            poll.answer.abort();
        }
        self.stagger_misses = 0;
    }

    /// Awaits the staggered polls, keeping `far_source_polls` in flight: `Some` with the batch
    /// of the first answer (whichever poll it answers: one held up behind another request on
    /// its connection does not hold the others back) that brings messages from the reader's
    /// next offset on;
    /// `None` once [`QUIET_POLLS`] answers in a row brought none (or failed), when the reader
    /// polls once more the usual way. Only a useful answer is taken in: an answer that starts
    /// before what the reader has is a poll sent before the previous answer came, so it never
    /// decides a gap, a reset or an idle wait (a usual poll does).
    async fn poll_staggered(&mut self) -> Result<Option<Polled>> {
        loop {
            self.top_up_staggered();
            if self.staggered.is_empty() {
                return Ok(None);
            }
            let staggered = &mut self.staggered;
            let first = std::future::poll_fn(|cx| {
                for (index, poll) in staggered.iter_mut().enumerate() {
                    if let std::task::Poll::Ready(answer) =
                        std::pin::Pin::new(&mut poll.answer).poll(cx)
                    {
                        return std::task::Poll::Ready((index, answer));
                    }
                }
                std::task::Poll::Pending
            });
            let (index, answer) = tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    self.stop_staggering();
                    // The run loop sees the stop in its idle wait.
                    return Ok(Some(Polled::Empty));
                }
                first = first => first,
            };
            let poll = self
                .staggered
                .remove(index)
                .expect("the index of a poll in flight");
            if let Ok((polled, round_trip)) = answer {
                self.round_trip = round_trip;
                if let Ok(polled) = polled {
                    let next = self.next;
                    if starts_at(&polled, next.offset) {
                        self.stagger_misses = 0;
                        self.shared.meters.set_batch_size(poll.count);
                        return self
                            .take_in(next, poll.from, poll.count, Ok(polled), round_trip)
                            .map(Some);
                    }
                }
            }
            self.stagger_misses += 1;
            if self.stagger_misses >= QUIET_POLLS {
                self.stop_staggering();
                self.stagger_misses = QUIET_POLLS;
                return Ok(None);
            }
        }
    }

    /// Sends staggered polls from the reader's next offset until `far_source_polls` are in
    /// flight, each a round trip's share after the one before, on the unit's connections in
    /// turn.
    fn top_up_staggered(&mut self) {
        let polls = self.shared.flow.far_source_polls as usize;
        let spacing = self.round_trip / polls as u32;
        while self.staggered.len() < polls {
            let now = tokio::time::Instant::now();
            let at = self
                .staggered
                .back()
                .map_or(now, |newest| (newest.at + spacing).max(now));
            let count = self.sizer.next();
            let offset = self.next.offset;
            let slot_offset = self.stagger_slot;
            self.stagger_slot = (self.stagger_slot + 1) % polls;
            let answer = self.spawn_poll(Some(at), slot_offset, offset, count);
            self.staggered.push_back(Staggered {
                from: offset,
                count,
                at,
                answer,
            });
        }
    }

    /// Sends the poll of the next batch from `offset` ahead, on the unit's slot plus
    /// `slot_offset` (0 or 1: the two polls in flight alternate between two connections).
    fn send_ahead(&mut self, offset: u64, slot_offset: usize) {
        let count = self.sizer.next();
        let answer = self.spawn_poll(None, slot_offset, offset, count);
        self.ahead = Some(Ahead {
            from: offset,
            count,
            slot_offset,
            answer,
        });
    }

    /// A task that polls `count` messages from `offset` on the unit's slot plus `slot_offset`,
    /// or on another connection if that one is busy then ([`Pick::AnyFree`]), at `at` or at
    /// once, and answers with the poll's outcome and the time it took.
    fn spawn_poll(
        &self,
        at: Option<tokio::time::Instant>,
        slot_offset: usize,
        offset: u64,
        count: u32,
    ) -> PollTask {
        let shared = self.shared.clone();
        let ids = self.ids.clone();
        tokio::spawn(
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at).await;
                }
                let started = Instant::now();
                let via = (shared.slot() + slot_offset, Pick::AnyFree);
                let polled = poll(&shared, &ids, via, offset, count).await;
                (polled, started.elapsed())
            }
            .instrument(tracing::Span::current()),
        )
    }

    /// Takes in the answer `polled` to a poll of `count` messages from `asked_from` that took
    /// `round_trip`, the reader being at `from` (`asked_from` is earlier for a staggered poll
    /// sent before the previous answer came).
    fn take_in(
        &mut self,
        from: ReadFrom,
        asked_from: u64,
        count: u32,
        polled: Result<replicator_sdk::Polled>,
        round_trip: Duration,
    ) -> Result<Polled> {
        let shared = &self.shared;
        shared.meters.polled(round_trip);
        self.round_trip = round_trip;
        shared.source.open_far_slots();
        let polled = polled?;
        let mut messages = polled.messages;
        // Whether the poll came back full counts from where it asked.
        let answered = messages.len() - messages.partition_point(|m| m.offset < asked_from);
        messages.retain(|m| m.offset >= from.offset);
        let got = u32::try_from(answered).unwrap_or(u32::MAX);
        self.sizer.polled(
            PollOutcome { asked: count, got },
            Far {
                source: shared.source.far(),
                target: shared.meters.target_far(),
            },
            || messages.iter().map(Message::wire_bytes).sum(),
        );
        let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
            if went_back(from, polled.current_offset) {
                return Ok(Polled::Reset {
                    current_offset: polled.current_offset,
                });
            }
            shared.meters.upstream_end(from.offset);
            return Ok(Polled::Empty);
        };
        let (first, last) = (first.offset, last.offset);
        shared
            .meters
            .upstream_end(polled.current_offset.max(last).saturating_add(1));
        let gap = detect_gap(from, first);
        if let Some(gap) = gap {
            shared.meters.gap(gap);
            tracing::warn!(
                from = gap.from,
                to = gap.to,
                lost = gap.len(),
                "upstream retention removed messages before they were copied"
            );
        }
        tracing::debug!(offset = first, count = messages.len(), "polled");
        self.next = ReadFrom {
            offset: last.saturating_add(1),
            contiguous: true,
        };
        Ok(Batch::new(messages, gap).map_or(Polled::Empty, Polled::Batch))
    }
}

/// A poll sent ahead: the range after the one in flight, and the task awaiting its answer
/// with the time it took.
struct Ahead {
    from: u64,
    count: u32,
    /// Its slot, relative to the unit's.
    slot_offset: usize,
    answer: PollTask,
}

/// A poll sent on a task of its own: its outcome and the time it took.
type PollTask = tokio::task::JoinHandle<(Result<replicator_sdk::Polled>, Duration)>;

/// A staggered poll in flight (see the module docs): where it asked from, how many, when it
/// goes out, and the task awaiting its answer with the time it took.
struct Staggered {
    from: u64,
    count: u32,
    at: tokio::time::Instant,
    answer: PollTask,
}

/// Polls `count` messages of the unit's partition from `offset` on the connection of `slot`, or
/// another one as `pick` allows (a poll is a read at an explicit offset: which connection
/// answers it does not matter).
async fn poll<C>(
    shared: &UnitShared<C>,
    ids: &(Identifier, Identifier, Consumer),
    (slot, pick): (usize, Pick),
    offset: u64,
    count: u32,
) -> Result<replicator_sdk::Polled> {
    let (stream, topic, consumer) = ids.clone();
    let partition = shared.unit.partition;
    let request = |c: std::sync::Arc<replicator_sdk::Client>| async move {
        c.poll_messages(
            &stream,
            &topic,
            Some(partition),
            &consumer,
            &PollingStrategy::offset(offset),
            count,
            false,
        )
        .await
    };
    let polled = shared
        .source
        .call_picked((slot, pick), "poll_messages", request, polled_bytes)
        .await;
    polled.map_err(|e| match e {
        Error::Iggy { ref source, .. } if crate::error::is_missing(source) => {
            Error::UpstreamTopicGone {
                unit: shared.unit.clone(),
            }
        }
        other => other,
    })
}

/// Whether an answer holds a message at `offset` (then everything after it up to its end).
fn starts_at(polled: &replicator_sdk::Polled, offset: u64) -> bool {
    polled
        .messages
        .binary_search_by_key(&offset, |m| m.offset)
        .is_ok()
}

/// Whether an answer to a poll of `count` from `from` holds exactly `count` messages from
/// `from` on.
fn starts_full(polled: &replicator_sdk::Polled, from: u64, count: u32) -> bool {
    // Polled messages come in offset order.
    let held = &polled.messages[polled.messages.partition_point(|m| m.offset < from)..];
    held.len() == count as usize && held.first().is_some_and(|m| m.offset == from)
}

/// What one poll found.
enum Polled {
    /// Messages from the reader's next offset on.
    Batch(Batch),
    /// Nothing new.
    Empty,
    /// The partition ends below what the reader already read.
    Reset {
        /// The partition's last offset in the poll answer.
        current_offset: u64,
    },
}

/// Whether a poll from `from` that found nothing, answered with the partition's last offset
/// `current_offset`, shows that the partition went back: the reader read up to `from.offset -
/// 1` before, so the end must be at least there. Only after copied data (`contiguous`): an
/// initial offset beyond the end just waits for it. A partition reset to exactly the reader's
/// position cannot be told from one that did not grow (the writer's resume still checks the
/// partition whenever the unit restarts).
fn went_back(from: ReadFrom, current_offset: u64) -> bool {
    from.contiguous && current_offset.saturating_add(1) < from.offset
}

/// Empty polls in a row after which a partition counts as idle and its polls slow down. A
/// partition with traffic finds data within a few polls and keeps the `poll_interval` pace
/// (latency); one that stayed empty this long backs off (CPU with thousands of partitions).
const QUIET_POLLS: u32 = 20;

/// The pause after the `empty_polls`-th empty poll in a row: `poll_interval` up to
/// [`QUIET_POLLS`], then doubled with every further empty poll, at most `idle_poll_interval`.
fn idle_pause(flow: &crate::params::FlowParams, empty_polls: u32) -> Duration {
    let cap = flow.idle_poll_interval.max(flow.poll_interval);
    let doublings = empty_polls.saturating_sub(QUIET_POLLS);
    let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
    flow.poll_interval.saturating_mul(factor).min(cap)
}

/// How a caught-up reader waits for its next poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdleWait {
    /// Poll again after this pause.
    Pause(Duration),
    /// Subscribe to the stream's activity watcher and poll when it wakes the reader, or after
    /// this safety-net delay at the latest.
    Watch(Duration),
}

/// The safety-net poll of a watched partition comes after 50–100 % of this many
/// `idle_poll_interval`s (5–10 s with the default 100 ms) at the least; see
/// [`SAFETY_NET_POLLS_PER_SECOND`] for more watched partitions. The watcher is the normal way to
/// notice a new message, and its periodic sweep (`activity`) catches a topic whose totals came
/// back to the previous listing's values; this bounds the delay when the metadata itself is
/// wrong: Iggy builds these figures from statistics it calls "inconsistent" (eventually
/// consistent), and a topic recreated before the watcher first listed it, with lower offsets,
/// does not look like growth (discovery restarts its units within a `discovery_interval`
/// anyway). The jitter keeps partitions that went idle together from polling together.
const WATCHED_POLL_FACTOR: u32 = 100;

/// About how many safety-net polls per second the watched partitions of one instance make to
/// one source cluster, at most: with more watched partitions than this many per
/// `WATCHED_POLL_FACTOR` × `idle_poll_interval`, each one's safety net is stretched (3,300
/// watched partitions: 82–165 s; 33,000: 14–28 min). Without the bound the safety net alone
/// grew with the partitions: 440 polls per second per instance at 10,000 idle partitions over
/// three instances, more than the watchers and everything else idle together. At 50 a second
/// the safety net was still two thirds of an idle instance's requests at 10,000 partitions
/// (BENCHMARKS.md section 23). What it guards against is narrow: the watcher's sweep reads
/// every watched partition's offsets every `SWEEP_ROUNDS` listings, so only figures that
/// stay wrong are left to it.
const SAFETY_NET_POLLS_PER_SECOND: f64 = 20.0;

/// What a reader knows of its stream's watcher when it goes idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watcher {
    /// Its metadata requests are failing (`StreamActivity::degraded`).
    degraded: bool,
    /// Readers of this instance waiting for a watcher of the source cluster, this one included
    /// (`StreamActivity::watched`).
    watched: usize,
}

/// How a caught-up reader waits after its `empty_polls`-th empty poll in a row: pauses as in
/// [`idle_pause`] while they are shorter than `idle_poll_interval` (a partition that drained for
/// a moment keeps its latency), then the activity watcher, with a safety-net poll after
/// `WATCHED_POLL_FACTOR` × `idle_poll_interval`, or after the time that spreads the `watched`
/// readers' safety nets to [`SAFETY_NET_POLLS_PER_SECOND`] if that is longer, scaled by
/// `jitter` (in `[0, 1)`, to 50–100 %). While the watcher's metadata requests fail
/// (`degraded`) the safety net is one `idle_poll_interval`: per-partition polling as before,
/// until metadata is back. A flow whose `idle_poll_interval` is not above `poll_interval` asked
/// for every partition to be polled at the same pace and never uses the watcher.
fn idle_wait(
    flow: &crate::params::FlowParams,
    empty_polls: u32,
    watcher: Watcher,
    jitter: f64,
) -> IdleWait {
    let pause = idle_pause(flow, empty_polls);
    if flow.idle_poll_interval <= flow.poll_interval || pause < flow.idle_poll_interval {
        return IdleWait::Pause(pause);
    }
    if watcher.degraded {
        return IdleWait::Watch(flow.idle_poll_interval);
    }
    let least = flow.idle_poll_interval.saturating_mul(WATCHED_POLL_FACTOR);
    // The mean wait of 75 % of `spread` makes the polls come a third above the rate: a bound,
    // not a target.
    let spread = Duration::from_secs_f64(watcher.watched as f64 / SAFETY_NET_POLLS_PER_SECOND);
    IdleWait::Watch(with_jitter(least.max(spread), jitter))
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn a_partition_end_below_what_was_read_is_a_reset() {
        let after = |offset| ReadFrom {
            offset,
            contiguous: true,
        };
        // Read up to 99: an end at 99 is no news, one below it went back.
        check!(!went_back(after(100), 99));
        check!(went_back(after(100), 98));
        check!(went_back(after(100), 0));
        // Nothing read yet below 0 and 1 (a purge to one message at 0 looks the same).
        check!(!went_back(after(0), 0));
        check!(!went_back(after(1), 0));
        // An initial offset beyond the end waits for it.
        let initial = ReadFrom {
            offset: 100,
            contiguous: false,
        };
        check!(!went_back(initial, 5));
    }

    /// An answer to a poll sent ahead holding `offsets`.
    fn answer(offsets: impl IntoIterator<Item = u64>) -> replicator_sdk::Polled {
        let messages: Vec<Message> = offsets
            .into_iter()
            .map(|o| {
                let mut m = Message::new(u128::from(o), 0, bytes::Bytes::from_static(b"x"));
                m.offset = o;
                m
            })
            .collect();
        replicator_sdk::Polled {
            partition: 0,
            current_offset: messages.last().map_or(0, |m| m.offset),
            messages,
        }
    }

    #[test]
    fn an_answer_sent_ahead_is_used_only_full_and_from_where_the_copy_is() {
        // Asked 100 from 1,000: exactly 1,000..1,100 is used.
        check!(starts_full(&answer(1000..1100), 1000, 100));
        // Messages before `from` (the server answers from an earlier offset) do not count.
        check!(starts_full(&answer(990..1100), 1000, 100));
        // Dropped, and polled again: the partition's end (a short answer), an empty one, a gap
        // (retention removed 1,000: the answer starts later, and only the regular poll may
        // decide a gap), and an answer for a range the copy is not at.
        check!(!starts_full(&answer(1000..1050), 1000, 100));
        check!(!starts_full(&answer([]), 1000, 100));
        check!(!starts_full(&answer(1001..1101), 1000, 100));
        check!(!starts_full(&answer(2000..2100), 1000, 100));
    }

    #[test]
    fn idle_pause_doubles_up_to_the_idle_interval() {
        let mut flow = crate::params::FlowParams::new("f", "a", "b", vec!["*/*".into()]);
        flow.poll_interval = Duration::from_millis(5);
        flow.idle_poll_interval = Duration::from_millis(100);
        // A partition with traffic now and then keeps the poll interval.
        check!((1..=QUIET_POLLS).all(|n| idle_pause(&flow, n) == flow.poll_interval));
        let seen: Vec<u128> = (QUIET_POLLS..QUIET_POLLS + 7)
            .map(|n| idle_pause(&flow, n).as_millis())
            .collect();
        check!(seen == vec![5, 10, 20, 40, 80, 100, 100]);
        check!(idle_pause(&flow, u32::MAX) == flow.idle_poll_interval);
        // An idle interval below the poll interval means: always the poll interval.
        flow.idle_poll_interval = Duration::from_millis(1);
        check!(idle_pause(&flow, QUIET_POLLS + 1) == flow.poll_interval);
    }

    #[test]
    fn idle_wait_keeps_short_pauses_then_waits_for_the_watcher_with_a_safety_net() {
        let mut flow = crate::params::FlowParams::new("f", "a", "b", vec!["*/*".into()]);
        flow.poll_interval = Duration::from_millis(5);
        flow.idle_poll_interval = Duration::from_millis(100);
        let few = Watcher {
            degraded: false,
            watched: 16,
        };
        // A partition that drains for a moment keeps the pauses of before (latency under load);
        // 5, 10, 20, 40, 80 ms are still timed polls.
        let pauses: Vec<IdleWait> = (QUIET_POLLS..QUIET_POLLS + 5)
            .map(|n| idle_wait(&flow, n, few, 0.5))
            .collect();
        check!(pauses == [5, 10, 20, 40, 80].map(|ms| IdleWait::Pause(Duration::from_millis(ms))));
        check!((1..QUIET_POLLS)
            .all(|n| idle_wait(&flow, n, few, 0.5) == IdleWait::Pause(flow.poll_interval)));
        // Where the pause would reach `idle_poll_interval`, the watcher takes over; the safety
        // net is 5–10 s (100 × 100 ms, jittered to 50–100 %).
        let idle = QUIET_POLLS + 5;
        check!(idle_wait(&flow, idle, few, 0.0) == IdleWait::Watch(Duration::from_secs(5)));
        check!(idle_wait(&flow, idle, few, 1.0) == IdleWait::Watch(Duration::from_secs(10)));
        check!(idle_wait(&flow, u32::MAX, few, 1.0) == IdleWait::Watch(Duration::from_secs(10)));
        // Metadata failing: poll every idle interval, as before the watcher.
        let degraded = Watcher {
            degraded: true,
            ..few
        };
        check!(idle_wait(&flow, idle, degraded, 1.0) == IdleWait::Watch(flow.idle_poll_interval));
        // An idle interval not above the poll interval means: always poll at that pace.
        let mut each = flow.clone();
        each.idle_poll_interval = flow.poll_interval;
        check!(idle_wait(&each, u32::MAX, few, 1.0) == IdleWait::Pause(flow.poll_interval));
    }

    #[test]
    fn many_watched_partitions_stretch_their_safety_nets_to_a_bounded_poll_rate() {
        let mut flow = crate::params::FlowParams::new("f", "a", "b", vec!["*/*".into()]);
        flow.poll_interval = Duration::from_millis(5);
        flow.idle_poll_interval = Duration::from_millis(100);
        let idle = QUIET_POLLS + 5;
        let watched = |watched| Watcher {
            degraded: false,
            watched,
        };
        // Up to 200 watched partitions (20 per second over the 10 s least) keep 5–10 s.
        check!(
            idle_wait(&flow, idle, watched(200), 1.0) == IdleWait::Watch(Duration::from_secs(10))
        );
        // 3,300: 165 s at most, so that they poll about 20 times a second, not 440.
        check!(
            idle_wait(&flow, idle, watched(3_300), 1.0)
                == IdleWait::Watch(Duration::from_secs(165))
        );
        check!(
            idle_wait(&flow, idle, watched(3_300), 0.0)
                == IdleWait::Watch(Duration::from_millis(82_500))
        );
        // Failing metadata still polls every idle interval, however many wait.
        let degraded = Watcher {
            degraded: true,
            watched: 3_300,
        };
        check!(idle_wait(&flow, idle, degraded, 1.0) == IdleWait::Watch(flow.idle_poll_interval));
    }
}
