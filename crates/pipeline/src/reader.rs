//! `PartitionReader`: polls one upstream partition at explicit offsets and hands batches to its
//! writer through a bounded channel (a full channel stops polling: backpressure).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iggy::prelude::{Consumer, Identifier, MessageClient, PollingStrategy};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::backoff::Backoff;
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
    /// Sent by the reader to itself (directly or from its timer): poll once more. No reply.
    /// The coordinator stops a reader with `stop`, which takes priority over queued polls.
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
    /// Empty polls in a row (they set the pause before the next poll, see [`idle_pause`]).
    empty_polls: u32,
    /// Pending delayed `Poll` (caught up or backing off); aborted when the reader stops.
    timer: Option<JoinHandle<std::result::Result<(), ractor::MessagingErr<ReaderMsg>>>>,
}

/// Outcome of one poll.
enum Step {
    /// A batch went to the writer: poll again at once.
    Forwarded,
    /// Nothing new upstream: poll again after the flow's poll interval.
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
            shared: args.shared,
            tx: args.tx,
            start: Some(args.start),
            next: None,
            ids: (stream, topic, consumer),
            timer: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        if let Some(timer) = state.timer.take() {
            timer.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let ReaderMsg::Poll = msg;
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
                    let delay = idle_pause(&state.shared.flow, state.empty_polls);
                    state.timer = Some(myself.send_after(delay, || ReaderMsg::Poll));
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
}
