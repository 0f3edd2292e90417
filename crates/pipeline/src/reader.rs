//! `PartitionReader`: polls one upstream partition at explicit offsets and hands batches to its
//! writer through a bounded channel (a full channel stops polling: backpressure).
//!
//! A caught-up reader polls again after `poll_interval`, then ever more slowly (see
//! [`idle_wait`]); once its partition counts as idle it stops polling on a timer and waits for
//! its topic's activity watcher (`activity`), which wakes it when metadata shows a message it
//! has not read, with a slow safety-net poll in case the metadata is wrong.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iggy::prelude::{Consumer, Identifier, MessageClient, PollingStrategy};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::activity::{self, Ticket, TopicActivity, WatchParams};
use crate::backoff::{with_jitter, Backoff};
use crate::control::ControlPlane;
use crate::error::{Error, Result};
use crate::offsets::{detect_gap, ReadFrom};
use crate::unit::{Batch, UnitShared};

/// The reader actor of one unit.
pub(crate) struct PartitionReader<C>(PhantomData<fn() -> C>);

impl<C> PartitionReader<C> {
    /// The actor value (all state lives in [`ReaderState`]).
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

/// Messages of the reader.
pub(crate) enum ReaderMsg {
    /// Sent by the reader to itself (directly or from its timer), and by its topic's activity
    /// watcher when the partition holds a message the reader has not read: poll once more. No
    /// reply. The coordinator stops a reader with `stop`, which takes priority over queued polls.
    Poll,
}

/// Start-up inputs, from the coordinator.
pub(crate) struct ReaderArgs<C> {
    /// The unit's shared context.
    pub(crate) shared: Arc<UnitShared<C>>,
    /// Sending side of the bounded channel to the writer.
    pub(crate) tx: mpsc::Sender<Batch>,
    /// Where to start, sent by the writer once it found the resume point.
    pub(crate) start: oneshot::Receiver<ReadFrom>,
}

/// Runtime state of the reader.
pub(crate) struct ReaderState<C> {
    /// Shared context.
    shared: Arc<UnitShared<C>>,
    /// Channel to the writer.
    tx: mpsc::Sender<Batch>,
    /// Resume point not yet received from the writer.
    start: Option<oneshot::Receiver<ReadFrom>>,
    /// Next offset to poll (known after the writer's start signal).
    next: Option<ReadFrom>,
    /// Upstream stream and topic ids, and the plain consumer.
    ids: (Identifier, Identifier, Consumer),
    /// Retry backoff for transient poll failures.
    backoff: Backoff,
    /// Empty polls in a row (they set how the reader waits for its next poll, see [`idle_wait`]).
    empty_polls: u32,
    /// Pending delayed `Poll` (caught up, backing off, or the safety net while subscribed to the
    /// activity watcher); aborted by the next `Poll` and when the reader stops.
    timer: Option<JoinHandle<std::result::Result<(), ractor::MessagingErr<ReaderMsg>>>>,
    /// The activity watcher of the unit's topic, fetched from the source cluster's registry the
    /// first time the partition goes idle.
    activity: Option<Arc<TopicActivity>>,
    /// The subscription to `activity` while idle; withdrawn by the next `Poll` and at stop.
    watching: Option<Ticket>,
    /// Jitter of the safety-net polls, seeded from the pair's seed.
    rng: StdRng,
}

/// Outcome of one poll.
enum Step {
    /// A batch went to the writer: poll again at once.
    Forwarded,
    /// Nothing new upstream: wait as [`idle_wait`] says, then poll again.
    CaughtUp,
    /// The writer is gone: stop.
    WriterGone,
}

impl<C: ControlPlane> Actor for PartitionReader<C> {
    type Msg = ReaderMsg;
    type State = ReaderState<C>;
    type Arguments = ReaderArgs<C>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> std::result::Result<Self::State, ActorProcessingErr> {
        let (stream, topic) = args.shared.upstream_ids()?;
        let consumer_name = format!("iggy-replicator.{}", args.shared.unit.flow);
        let consumer = Consumer::new(Identifier::named(&consumer_name)?);
        myself.send_message(ReaderMsg::Poll)?;
        Ok(ReaderState {
            backoff: Backoff::new(args.shared.tuning.backoff, args.shared.seed),
            empty_polls: 0,
            tx: args.tx,
            start: Some(args.start),
            next: None,
            ids: (stream, topic, consumer),
            timer: None,
            activity: None,
            watching: None,
            rng: StdRng::seed_from_u64(args.shared.seed.rotate_left(17)),
            shared: args.shared,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        settle(state);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let ReaderMsg::Poll = msg;
        // Whoever sent this poll (timer or watcher), the other one is no longer needed.
        settle(state);
        let span = state.shared.span.clone();
        async {
            if state.next.is_none() {
                // Never block the mailbox on the writer: a stop must be able to get through.
                let Some(mut start) = state.start.take() else {
                    return Ok(());
                };
                match start.try_recv() {
                    Ok(from) => state.next = Some(from),
                    Err(oneshot::error::TryRecvError::Empty) => {
                        state.start = Some(start);
                        let delay = state.shared.flow.poll_interval;
                        state.timer = Some(myself.send_after(delay, || ReaderMsg::Poll));
                        return Ok(());
                    }
                    Err(oneshot::error::TryRecvError::Closed) => {
                        myself.stop(Some("writer gone before start".into()));
                        return Ok(());
                    }
                }
            }
            match poll_once(state).await {
                Ok(Step::Forwarded) => {
                    state.backoff.reset();
                    state.empty_polls = 0;
                    myself.send_message(ReaderMsg::Poll)?;
                }
                Ok(Step::CaughtUp) => {
                    state.backoff.reset();
                    state.empty_polls = state.empty_polls.saturating_add(1);
                    wait_idle(&myself, state);
                }
                Ok(Step::WriterGone) => myself.stop(Some("writer gone".into())),
                Err(err) if err.is_transient() => {
                    state.shared.meters.error(err.kind());
                    let budget = state.shared.tuning.retry_budget;
                    match state.backoff.on_failure(Instant::now(), budget) {
                        Some(delay) => {
                            tracing::warn!(error = %err, backoff = ?delay, "poll failed, retrying");
                            state.timer = Some(myself.send_after(delay, || ReaderMsg::Poll));
                        }
                        None => return Err(err.into()),
                    }
                }
                Err(err) => return Err(err.into()),
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
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
    /// Subscribe to the topic's activity watcher and poll when it wakes the reader, or after
    /// this safety-net delay at the latest.
    Watch(Duration),
}

/// The safety-net poll of a watched partition comes after 50–100 % of this many
/// `idle_poll_interval`s (5–10 s with the default 100 ms). The watcher is the normal way to
/// notice a new message; this bounds the delay when its metadata is wrong or late: Iggy builds
/// these figures from statistics it calls "inconsistent" (eventually consistent), and a topic
/// recreated before the watcher first listed it, with lower offsets, does not look like growth
/// (discovery restarts its units within a `discovery_interval` anyway). At 1,000 idle
/// partitions it costs 100–200 polls per second across the cluster instead of the 10,000 of one
/// poll per `idle_poll_interval`. The jitter keeps partitions that went idle together from
/// polling together.
const WATCHED_POLL_FACTOR: u32 = 100;

/// How a caught-up reader waits after its `empty_polls`-th empty poll in a row: pauses as in
/// [`idle_pause`] while they are shorter than `idle_poll_interval` (a partition that drained for
/// a moment keeps its latency), then the activity watcher, with a safety-net poll after
/// `WATCHED_POLL_FACTOR` × `idle_poll_interval` scaled by `jitter` (in `[0, 1)`, to 50–100 %).
/// While the watcher's metadata requests fail (`degraded`) the safety net is one
/// `idle_poll_interval`: per-partition polling as before, until metadata is back. A flow whose
/// `idle_poll_interval` is not above `poll_interval` asked for every partition to be polled at
/// the same pace and never uses the watcher.
fn idle_wait(
    flow: &crate::params::FlowParams,
    empty_polls: u32,
    degraded: bool,
    jitter: f64,
) -> IdleWait {
    let pause = idle_pause(flow, empty_polls);
    if flow.idle_poll_interval <= flow.poll_interval || pause < flow.idle_poll_interval {
        return IdleWait::Pause(pause);
    }
    if degraded {
        return IdleWait::Watch(flow.idle_poll_interval);
    }
    let cap = flow.idle_poll_interval.saturating_mul(WATCHED_POLL_FACTOR);
    IdleWait::Watch(with_jitter(cap, jitter))
}

/// Schedules the next poll of a caught-up reader (see [`idle_wait`]): a timer, or a
/// subscription to the topic's activity watcher plus the safety-net timer. Nothing here waits:
/// the timer and the watcher send `ReaderMsg::Poll` from their own tasks.
fn wait_idle<C>(myself: &ActorRef<ReaderMsg>, state: &mut ReaderState<C>) {
    let degraded = state.activity.as_ref().is_some_and(|a| a.degraded());
    let jitter = state.rng.gen::<f64>();
    let delay = match idle_wait(&state.shared.flow, state.empty_polls, degraded, jitter) {
        IdleWait::Pause(delay) => delay,
        IdleWait::Watch(cap) => {
            let shared = &state.shared;
            let activity = state.activity.get_or_insert_with(|| {
                activity::watch(
                    &shared.source,
                    WatchParams {
                        flow: shared.unit.flow.clone(),
                        stream: shared.unit.stream.clone(),
                        topic: shared.unit.topic.clone(),
                        ids: (state.ids.0.clone(), state.ids.1.clone()),
                        interval: shared.flow.idle_poll_interval,
                        observer: shared.tuning.observer.clone(),
                    },
                )
            });
            let next = state.next.map_or(0, |n| n.offset);
            let ticket = activity.subscribe(shared.unit.partition, next, myself.clone());
            state.watching = Some(ticket);
            cap
        }
    };
    state.timer = Some(myself.send_after(delay, || ReaderMsg::Poll));
}

/// Withdraws whatever was to send the next `Poll` (timer, watcher subscription): on every poll,
/// since the other one is then stale, and when the reader stops.
fn settle<C>(state: &mut ReaderState<C>) {
    if let Some(timer) = state.timer.take() {
        timer.abort();
    }
    if let (Some(ticket), Some(activity)) = (state.watching.take(), &state.activity) {
        activity.unsubscribe(ticket);
    }
}

/// Polls once from `state.next` and forwards a non-empty batch (waiting while the channel is full).
async fn poll_once<C: ControlPlane>(state: &mut ReaderState<C>) -> Result<Step> {
    let Some(from) = state.next else {
        return Ok(Step::CaughtUp);
    };
    let shared = &state.shared;
    let (stream, topic, consumer) = state.ids.clone();
    let partition = shared.unit.partition;
    let count = shared.flow.batch_size;
    let started = Instant::now();
    let polled = shared
        .source
        .call(shared.slot(), "poll_messages", |c| async move {
            c.poll_messages(
                &stream,
                &topic,
                Some(partition),
                &consumer,
                &PollingStrategy::offset(from.offset),
                count,
                false,
            )
            .await
        })
        .await;
    shared.meters.polled(started.elapsed());
    let polled = polled.map_err(|e| match e {
        Error::Iggy { ref source, .. } if crate::error::is_missing(source) => {
            Error::UpstreamTopicGone {
                unit: shared.unit.clone(),
            }
        }
        other => other,
    })?;
    let mut messages = polled.messages;
    messages.retain(|m| m.header.offset >= from.offset);
    let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
        shared.meters.upstream_end(from.offset);
        return Ok(Step::CaughtUp);
    };
    let (first, last) = (first.header.offset, last.header.offset);
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
    state.next = Some(ReadFrom {
        offset: last.saturating_add(1),
        contiguous: true,
    });
    let Some(batch) = Batch::new(messages, gap) else {
        return Ok(Step::CaughtUp);
    };
    match state.tx.send(batch).await {
        Ok(()) => Ok(Step::Forwarded),
        Err(_) => Ok(Step::WriterGone),
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

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
        // A partition that drains for a moment keeps the pauses of before (latency under load);
        // 5, 10, 20, 40, 80 ms are still timed polls.
        let pauses: Vec<IdleWait> = (QUIET_POLLS..QUIET_POLLS + 5)
            .map(|n| idle_wait(&flow, n, false, 0.5))
            .collect();
        check!(pauses == [5, 10, 20, 40, 80].map(|ms| IdleWait::Pause(Duration::from_millis(ms))));
        check!((1..QUIET_POLLS)
            .all(|n| idle_wait(&flow, n, false, 0.5) == IdleWait::Pause(flow.poll_interval)));
        // Where the pause would reach `idle_poll_interval`, the watcher takes over; the safety
        // net is 5–10 s (100 × 100 ms, jittered to 50–100 %).
        let idle = QUIET_POLLS + 5;
        check!(idle_wait(&flow, idle, false, 0.0) == IdleWait::Watch(Duration::from_secs(5)));
        check!(idle_wait(&flow, idle, false, 1.0) == IdleWait::Watch(Duration::from_secs(10)));
        check!(idle_wait(&flow, u32::MAX, false, 1.0) == IdleWait::Watch(Duration::from_secs(10)));
        // Metadata failing: poll every idle interval, as before the watcher.
        check!(idle_wait(&flow, idle, true, 1.0) == IdleWait::Watch(flow.idle_poll_interval));
        // An idle interval not above the poll interval means: always poll at that pace.
        flow.idle_poll_interval = flow.poll_interval;
        check!(idle_wait(&flow, u32::MAX, false, 1.0) == IdleWait::Pause(flow.poll_interval));
    }
}
