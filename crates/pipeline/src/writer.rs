//! `DownstreamWriter`: finds where its unit resumes, then sends the reader's batches to the same
//! partition downstream, stamps provenance, and confirms offsets to the control plane.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iggy::prelude::{
    Consumer, Identifier, IggyMessage, IggyTimestamp, MessageClient, Partitioning, PollingStrategy,
    TopicClient,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use replicator_model::{Assignment, CommitOutcome, Offset, OffsetCommit, UnitCounters};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::control::{ControlError, ControlPlane};
use crate::error::{Error, Result};
use crate::offsets::{
    epoch_is_current, may_send, plan_resume, PartitionExtent, ReadFrom, SendVeto,
};
use crate::provenance;
use crate::unit::{Batch, UnitShared};

/// How long a failed commit keeps its slot before the next commit is tried.
const COMMIT_RETRY_DELAY: Duration = Duration::from_millis(250);
/// How long a writer whose lease is not valid long enough waits before looking again.
const LEASE_RECHECK: Duration = Duration::from_millis(20);
/// Messages per poll while scanning the downstream tail.
const TAIL_CHUNK: u32 = 1000;

/// The writer actor of one unit.
pub(crate) struct DownstreamWriter<C>(PhantomData<fn() -> C>);

impl<C> DownstreamWriter<C> {
    /// The actor value (all state lives in [`WriterState`]).
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

/// Messages of the writer; all are sent by the writer to itself (the coordinator only stops it).
pub(crate) enum WriterMsg {
    /// Find the resume point (confirmed offset, downstream tail, initial offset) and release
    /// the reader. Retried after a backoff on transient failures.
    Resume,
    /// Take the next batch (or retry the held one), send it, move commits along.
    Next,
}

/// Start-up inputs, from the coordinator.
pub(crate) struct WriterArgs<C> {
    /// The unit's shared context.
    pub(crate) shared: Arc<UnitShared<C>>,
    /// Receiving side of the bounded channel from the reader.
    pub(crate) rx: mpsc::Receiver<Batch>,
    /// Tells the reader where to start.
    pub(crate) start: oneshot::Sender<ReadFrom>,
}

/// A commit in flight: resolves to the committed offset, its counters and the outcome.
type InflightCommit = Pin<
    Box<
        dyn Future<
                Output = (
                    Offset,
                    UnitCounters,
                    std::result::Result<Vec<CommitOutcome>, ControlError>,
                ),
            > + Send,
    >,
>;

/// Runtime state of the writer.
pub(crate) struct WriterState<C> {
    /// Shared context.
    shared: Arc<UnitShared<C>>,
    /// Channel from the reader.
    rx: mpsc::Receiver<Batch>,
    /// Start signal for the reader, until resumed.
    start: Option<oneshot::Sender<ReadFrom>>,
    /// This node's assignments (to check the epoch before every send).
    assignments: watch::Receiver<Vec<Assignment>>,
    /// Creation time (µs) of the upstream topic incarnation being copied.
    topic_created_at: u64,
    /// Last upstream offset known to be downstream.
    last_written: Option<Offset>,
    /// Last offset the control plane confirmed.
    last_committed: Option<Offset>,
    /// Counters not yet committed.
    pending: UnitCounters,
    /// The commit in flight, if any (at most one).
    inflight: Option<InflightCommit>,
    /// No commit starts before this (see `commit_interval`), except the final one.
    next_commit_at: Instant,
    /// A batch taken from the channel but not yet written (retried after failures).
    held: Option<Batch>,
    /// A send failed in a way that may have appended it: re-read the tail before sending again.
    resync: bool,
    /// Backoff for transient failures.
    backoff: Backoff,
    /// Pending delayed message; aborted when the writer stops.
    timer: Option<JoinHandle<std::result::Result<(), ractor::MessagingErr<WriterMsg>>>>,
}

impl<C: ControlPlane> Actor for DownstreamWriter<C> {
    type Msg = WriterMsg;
    type State = WriterState<C>;
    type Arguments = WriterArgs<C>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> std::result::Result<Self::State, ActorProcessingErr> {
        myself.send_message(WriterMsg::Resume)?;
        Ok(WriterState {
            assignments: args.shared.control.assignments(),
            backoff: Backoff::new(args.shared.tuning.backoff, args.shared.seed ^ 0x5eed),
            shared: args.shared,
            rx: args.rx,
            start: Some(args.start),
            topic_created_at: 0,
            last_written: None,
            last_committed: None,
            pending: UnitCounters::default(),
            inflight: None,
            next_commit_at: Instant::now(),
            held: None,
            resync: false,
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
        let span = state.shared.span.clone();
        async {
            let reader_gone = state.start.as_ref().is_some_and(|s| s.is_closed());
            let result = match msg {
                WriterMsg::Resume if reader_gone => Ok(Flow::Stop("reader gone before start")),
                WriterMsg::Resume => resume(state).await.map(|()| Flow::Continue),
                WriterMsg::Next => next(state).await,
            };
            match result {
                Ok(Flow::Continue) => {
                    state.backoff.reset();
                    myself.send_message(WriterMsg::Next)?;
                }
                Ok(Flow::WaitForLease) => {
                    tracing::debug!("lease not valid long enough to send; holding the batch");
                    state.timer = Some(myself.send_after(LEASE_RECHECK, || WriterMsg::Next));
                }
                Ok(Flow::Stop(reason)) => {
                    tracing::info!(reason, "writer stops");
                    myself.stop(Some(reason.to_owned()));
                }
                Err(err) if err.is_transient() => {
                    state.pending.errors += 1;
                    state.shared.meters.error(err.kind());
                    let budget = state.shared.tuning.retry_budget;
                    match state.backoff.on_failure(Instant::now(), budget) {
                        Some(delay) => {
                            tracing::warn!(error = %err, backoff = ?delay, "write path failed, retrying");
                            let resuming = state.start.is_some();
                            state.timer = Some(myself.send_after(delay, move || {
                                if resuming {
                                    WriterMsg::Resume
                                } else {
                                    WriterMsg::Next
                                }
                            }));
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

/// What the writer does after a step.
enum Flow {
    /// Keep going.
    Continue,
    /// The lease is not valid long enough to send: keep the held batch and retry after
    /// [`LEASE_RECHECK`].
    WaitForLease,
    /// Stop with this reason.
    Stop(&'static str),
}

/// Works out where the unit resumes and tells the reader.
async fn resume<C: ControlPlane>(state: &mut WriterState<C>) -> Result<()> {
    let shared = state.shared.clone();
    let unit = &shared.unit;
    let (up_stream, up_topic) = shared.upstream_ids()?;
    let topic = shared
        .source
        .call(shared.slot(), "get_topic", |c| async move {
            c.get_topic(&up_stream, &up_topic).await
        })
        .await?
        .ok_or_else(|| Error::UpstreamTopicGone { unit: unit.clone() })?;
    let partition = topic
        .partitions
        .iter()
        .find(|p| p.id == unit.partition)
        .ok_or_else(|| Error::UpstreamTopicGone { unit: unit.clone() })?;
    let extent = PartitionExtent {
        messages_count: partition.messages_count,
        current_offset: partition.current_offset,
    };
    let created_at = topic.created_at.as_micros();
    let progress = shared.control.progress(unit);
    let confirmed = match progress {
        Some(p) if p.topic_created_at == created_at => p.confirmed,
        // A unit that never confirmed anything has no history to lose: nothing to warn about.
        Some(p) if p.confirmed.is_some() => {
            tracing::warn!(
                confirmed = ?p.confirmed,
                old_created_at = p.topic_created_at,
                created_at,
                "upstream topic was recreated; starting it from the initial offset"
            );
            None
        }
        _ => None,
    };
    let (down_stream, down_topic) = shared.downstream_ids()?;
    let down = shared
        .target
        .call(shared.slot(), "get_topic", |c| async move {
            c.get_topic(&down_stream, &down_topic).await
        })
        .await?;
    let missing = || Error::DownstreamMissing {
        stream: shared.downstream_stream.clone(),
        topic: unit.topic.clone(),
        partition: unit.partition,
    };
    let down = down.ok_or_else(missing)?;
    if !down.partitions.iter().any(|p| p.id == unit.partition) {
        return Err(missing());
    }
    let tail = if shared.flow.provenance {
        scan_tail(&shared, created_at).await?
    } else {
        None
    };
    let from = plan_resume(confirmed, tail, shared.flow.initial_offset, extent);
    state.topic_created_at = created_at;
    state.last_written = confirmed.max(tail);
    state.last_committed = confirmed;
    shared.meters.resumed_after(state.last_written);
    shared.meters.set_epoch(shared.epoch);
    tracing::info!(
        offset = from.offset,
        confirmed = ?confirmed,
        tail = ?tail,
        "unit resumes"
    );
    if let Some(start) = state.start.take() {
        // The reader may already be gone; the writer then drains an empty, closed channel.
        let _ = start.send(from);
    }
    Ok(())
}

/// The upstream offset of the last message this flow wrote to the downstream partition for the
/// current topic incarnation, scanning back at most `tail_scan_window` messages.
async fn scan_tail<C>(shared: &UnitShared<C>, created_at: u64) -> Result<Option<Offset>> {
    let (stream, topic) = shared.downstream_ids()?;
    let partition = shared.unit.partition;
    let consumer = Consumer::new(Identifier::named("iggy-replicator.tail").map_err(|source| {
        Error::Message {
            unit: shared.unit.clone(),
            offset: 0,
            source: Box::new(source),
        }
    })?);
    let source_alias = shared.source.alias();
    let matches = |m: &IggyMessage| {
        let found = provenance::find(m.user_headers.as_deref());
        (found.source == Some(source_alias) && found.topic_created_at == Some(created_at))
            .then_some(found.offset)
            .flatten()
    };
    let window = shared.tuning.tail_scan_window;
    let chunk = window.min(TAIL_CHUNK);
    let (s, t, c) = (stream.clone(), topic.clone(), consumer.clone());
    let last = shared
        .target
        .call(shared.slot(), "poll_messages (tail)", |cl| async move {
            cl.poll_messages(
                &s,
                &t,
                Some(partition),
                &c,
                &PollingStrategy::last(),
                chunk,
                false,
            )
            .await
        })
        .await?;
    if let Some(found) = last.messages.iter().rev().find_map(matches) {
        return Ok(Some(found));
    }
    let Some(mut end) = last.messages.first().map(|m| m.header.offset) else {
        return Ok(None);
    };
    let mut scanned = last.messages.len() as u64;
    while end > 0 && scanned < u64::from(window) {
        let start = end.saturating_sub(u64::from(chunk));
        let mut batch: Vec<IggyMessage> = Vec::new();
        let mut at = start;
        while at < end {
            let (s, t, c) = (stream.clone(), topic.clone(), consumer.clone());
            let count = u32::try_from(end - at).unwrap_or(chunk);
            let polled = shared
                .target
                .call(shared.slot(), "poll_messages (tail)", |cl| async move {
                    cl.poll_messages(
                        &s,
                        &t,
                        Some(partition),
                        &c,
                        &PollingStrategy::offset(at),
                        count,
                        false,
                    )
                    .await
                })
                .await?;
            let before = batch.len();
            batch.extend(
                polled
                    .messages
                    .into_iter()
                    .filter(|m| m.header.offset >= at && m.header.offset < end),
            );
            match batch.last() {
                Some(m) if batch.len() > before => at = m.header.offset + 1,
                _ => break,
            }
        }
        if let Some(found) = batch.iter().rev().find_map(matches) {
            return Ok(Some(found));
        }
        scanned += batch.len() as u64;
        match batch.first() {
            Some(m) if m.header.offset < end => end = m.header.offset,
            _ => break,
        }
        if batch.first().is_some_and(|m| m.header.offset > start) {
            // Retention removed everything below: nothing older to scan.
            break;
        }
    }
    Ok(None)
}

/// What [`prepare`] found out about a batch, besides the messages it left in it to send.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// Bytes of the messages to send (64-byte header + payload + user headers).
    pub(crate) bytes: u64,
    /// Upstream append time (µs) of the newest message to send.
    pub(crate) newest_timestamp: u64,
}

/// What [`prepare`] needs besides the batch.
pub(crate) struct PrepareParams<'a> {
    /// Last upstream offset already downstream (messages up to it are dropped).
    pub(crate) last_written: Option<Offset>,
    /// Flow's source alias (stamped as provenance source).
    pub(crate) source: &'a str,
    /// Flow's target alias (messages originating there are skipped).
    pub(crate) target: &'a str,
    /// Whether to stamp provenance and apply loop prevention.
    pub(crate) provenance: bool,
    /// Creation time (µs) of the upstream topic.
    pub(crate) topic_created_at: u64,
}

/// Turns a batch into its downstream messages, in place: drops what is already downstream,
/// drops (and counts in `batch.skipped`) messages that originated in the target cluster, keeps
/// id, origin timestamp, payload and user headers byte for byte and appends provenance.
/// In place, because the payloads need not be copied or even reference-counted again: the batch
/// is what gets sent. Preparing a prepared batch again (a retry after a failed send) gives the
/// same messages: provenance is replaced, not added twice. `Err(offset)` if a message's headers
/// would exceed Iggy's limit with provenance added.
pub(crate) fn prepare(
    batch: &mut Batch,
    p: &PrepareParams<'_>,
) -> std::result::Result<Prepared, Offset> {
    let mut out = Prepared {
        bytes: 0,
        newest_timestamp: 0,
    };
    if let Some(last) = p.last_written {
        // Offsets are ascending: what is already downstream is a prefix.
        let done = batch.messages.partition_point(|m| m.header.offset <= last);
        batch.messages.drain(..done);
    }
    if p.provenance {
        let before = batch.messages.len();
        batch.messages.retain(|m| {
            m.user_headers
                .as_deref()
                .is_none_or(|h| provenance::find(Some(h)).origin_cluster() != Some(p.target))
        });
        batch.skipped += (before - batch.messages.len()) as u64;
        // One allocation for the provenance of the whole batch (each message's headers are
        // split off it).
        let mut arena =
            bytes::BytesMut::with_capacity(batch.messages.len() * (128 + p.source.len()));
        let stamper = provenance::Stamper::new(p.source, p.topic_created_at);
        for m in &mut batch.messages {
            let offset = m.header.offset;
            let stamped = stamper
                .stamp_into(&mut arena, m.user_headers.as_deref(), offset)
                .ok_or(offset)?;
            m.header.user_headers_length = stamped.len() as u32;
            m.user_headers = Some(stamped);
        }
    }
    for m in &batch.messages {
        out.bytes += 64 + m.payload.len() as u64 + u64::from(m.header.user_headers_length);
        out.newest_timestamp = out.newest_timestamp.max(m.header.timestamp);
    }
    Ok(out)
}

/// One writer step: settle a finished commit, take or retry a batch, send it, start a commit.
async fn next<C: ControlPlane>(state: &mut WriterState<C>) -> Result<Flow> {
    if state.held.is_none() {
        // Progress held back by the commit interval is committed when it ends, also when no
        // batch comes meanwhile.
        let due =
            (state.inflight.is_none() && has_uncommitted(state)).then_some(state.next_commit_at);
        let WriterState { inflight, rx, .. } = state;
        tokio::select! {
            biased;
            done = async { match inflight.as_mut() { Some(f) => f.await, None => std::future::pending().await } } => {
                state.inflight = None;
                if let Some(stop) = settle_commit(state, done) {
                    return Ok(stop);
                }
                start_commit(state, false);
                return Ok(Flow::Continue);
            }
            () = async { match due { Some(at) => tokio::time::sleep_until(at.into()).await, None => std::future::pending().await } } => {
                start_commit(state, false);
                return Ok(Flow::Continue);
            }
            batch = rx.recv() => match batch {
                Some(batch) => state.held = Some(batch),
                None => return drain(state).await,
            }
        }
    }
    if let Some(stop) = send_held(state).await? {
        return Ok(stop);
    }
    start_commit(state, false);
    Ok(Flow::Continue)
}

/// Sends the held batch (after a tail re-read if the previous attempt may have landed).
async fn send_held<C: ControlPlane>(state: &mut WriterState<C>) -> Result<Option<Flow>> {
    let shared = state.shared.clone();
    if state.resync {
        let tail = scan_tail(&shared, state.topic_created_at).await?;
        state.last_written = state.last_written.max(tail);
        state.resync = false;
    }
    let Some(batch) = state.held.as_mut() else {
        return Ok(None);
    };
    let prepared = prepare(
        batch,
        &PrepareParams {
            last_written: state.last_written,
            source: shared.source.alias(),
            target: shared.target.alias(),
            provenance: shared.flow.provenance,
            topic_created_at: state.topic_created_at,
        },
    )
    .map_err(|offset| Error::Message {
        unit: shared.unit.clone(),
        offset,
        source: Box::new(iggy::prelude::IggyError::TooBigUserHeaders),
    })?;
    let gap = batch.gap;
    let last_offset = batch.last_offset;
    if !batch.messages.is_empty() {
        match send_check(&shared, &state.assignments) {
            Ok(()) => {}
            Err(SendVeto::EpochNotCurrent) => {
                return Ok(Some(Flow::Stop("epoch no longer current")))
            }
            // Hold the batch and look again shortly: a lease that is not valid yet (the first
            // renewal after start) or that lapsed under load comes back with the next renewal,
            // and a unit that moved away shows up as a stale epoch. Nothing is sent meanwhile.
            Err(SendVeto::LeaseExpiring) => return Ok(Some(Flow::WaitForLease)),
        }
        let (stream, topic) = shared.downstream_ids()?;
        let partitioning = Partitioning::partition_id(shared.unit.partition);
        let messages = &mut batch.messages;
        let count = messages.len() as u64;
        let started = Instant::now();
        // Checked again once the connection is ours, right before the request is written.
        let assignments = state.assignments.clone();
        let recheck = || send_check(&shared, &assignments);
        let sent = shared
            .target
            .call_checked(shared.slot(), "send_messages", recheck, |c| async move {
                c.send_messages(&stream, &topic, &partitioning, messages)
                    .await
            })
            .await;
        shared.meters.sent(started.elapsed());
        let sent = match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(SendVeto::EpochNotCurrent)) => {
                return Ok(Some(Flow::Stop("epoch no longer current")))
            }
            Ok(Err(SendVeto::LeaseExpiring)) => return Ok(Some(Flow::WaitForLease)),
            Err(e) => Err(e),
        };
        if let Err(err) = sent {
            // The batch may have been appended even though the call failed.
            state.resync = true;
            return Err(match err {
                Error::Iggy { ref source, .. } if crate::error::is_missing(source) => {
                    Error::DownstreamMissing {
                        stream: shared.downstream_stream.clone(),
                        topic: shared.unit.topic.clone(),
                        partition: shared.unit.partition,
                    }
                }
                other => other,
            });
        }
        let now_us = IggyTimestamp::now().as_micros();
        shared.meters.latency(Duration::from_micros(
            now_us.saturating_sub(prepared.newest_timestamp),
        ));
        shared.meters.written(last_offset, count, prepared.bytes);
        state.pending.messages += count;
        state.pending.bytes += prepared.bytes;
        tracing::debug!(offset = last_offset, count, "sent");
    }
    if let Some(done) = state.held.take() {
        if done.skipped > 0 {
            shared.meters.skipped(done.skipped);
        }
    }
    if gap.is_some() {
        state.pending.gaps += 1;
    }
    state.last_written = state.last_written.max(Some(last_offset));
    Ok(None)
}

/// Whether the writer may send now, asked of the control plane in one call that reads the
/// lease before the grant ([`ControlPlane::lease_valid_for`]), so that a lease extended after a
/// revoke is never paired with the revoked grant.
fn send_check<C: ControlPlane>(
    shared: &UnitShared<C>,
    assignments: &watch::Receiver<Vec<Assignment>>,
) -> std::result::Result<(), SendVeto> {
    send_verdict(
        Instant::now(),
        shared.control.lease_valid_for(&shared.unit, shared.epoch),
        shared.tuning.lease_safety_margin,
        || epoch_is_current(&assignments.borrow(), &shared.unit, shared.epoch),
    )
}

/// The send decision from `lease_for_epoch` (the lease, `None` when it is not valid or the
/// epoch no longer ours). Only that value lets a send through; when it vetoes, this node's
/// assignments (`epoch_current`, read afterwards) tell a unit that moved away (stop) from a
/// lease not valid long enough (hold the batch and look again).
fn send_verdict(
    now: Instant,
    lease_for_epoch: Option<Instant>,
    margin: Duration,
    epoch_current: impl FnOnce() -> bool,
) -> std::result::Result<(), SendVeto> {
    match may_send(now, lease_for_epoch, margin, true) {
        Ok(()) => Ok(()),
        Err(_) if !epoch_current() => Err(SendVeto::EpochNotCurrent),
        Err(veto) => Err(veto),
    }
}

/// Whether there is progress or counters the control plane has not confirmed yet.
fn has_uncommitted<C>(state: &WriterState<C>) -> bool {
    state.last_written.is_some()
        && (state.last_committed < state.last_written || state.pending != UnitCounters::default())
}

/// Starts a commit if none is in flight and there is something to confirm, at most once per
/// `commit_interval` unless `now` (the final commit of a stopping writer).
fn start_commit<C: ControlPlane>(state: &mut WriterState<C>, now: bool) {
    if state.inflight.is_some() || !has_uncommitted(state) {
        return;
    }
    let Some(offset) = state.last_written else {
        return;
    };
    let started = Instant::now();
    if !now && started < state.next_commit_at {
        return;
    }
    state.next_commit_at = started + state.shared.tuning.commit_interval;
    let counters = std::mem::take(&mut state.pending);
    let commit = OffsetCommit {
        unit: state.shared.unit.clone(),
        epoch: state.shared.epoch,
        offset,
        topic_created_at: state.topic_created_at,
        counters,
    };
    let control = state.shared.control.clone();
    state.inflight = Some(Box::pin(async move {
        let result = control.commit(vec![commit]).await;
        if result.is_err() {
            tokio::time::sleep(COMMIT_RETRY_DELAY).await;
        }
        (offset, counters, result)
    }));
}

/// Applies a finished commit; returns a stop when fenced.
fn settle_commit<C>(
    state: &mut WriterState<C>,
    (offset, counters, result): (
        Offset,
        UnitCounters,
        std::result::Result<Vec<CommitOutcome>, ControlError>,
    ),
) -> Option<Flow> {
    match result.as_deref() {
        Ok([CommitOutcome::Committed, ..]) => {
            state.last_committed = state.last_committed.max(Some(offset));
            None
        }
        Ok([CommitOutcome::Fenced { current }, ..]) => {
            tracing::warn!(current = ?current, "commit fenced");
            Some(Flow::Stop("fenced"))
        }
        Ok([]) | Err(_) => {
            if let Err(err) = &result {
                tracing::warn!(error = %err, "commit failed, will retry");
            }
            state.pending.add(&counters);
            None
        }
    }
}

/// The reader is gone: finish the in-flight commit, make a final one, stop.
async fn drain<C: ControlPlane>(state: &mut WriterState<C>) -> Result<Flow> {
    if let Some(inflight) = state.inflight.take() {
        if let Some(stop) = settle_commit(state, inflight.await) {
            return Ok(stop);
        }
    }
    start_commit(state, true);
    if let Some(inflight) = state.inflight.take() {
        if let Some(stop) = settle_commit(state, inflight.await) {
            return Ok(stop);
        }
    }
    Ok(Flow::Stop("drained"))
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};
    use bytes::Bytes;

    use super::*;

    fn msg(offset: u64, headers: Option<Bytes>) -> IggyMessage {
        let mut m = IggyMessage::builder()
            .id(u128::from(offset) + 1000)
            .payload(Bytes::from(format!("payload-{offset}")))
            .build()
            .expect("valid");
        m.header.offset = offset;
        m.header.timestamp = 10 + offset;
        m.header.origin_timestamp = 5 + offset;
        m.user_headers = headers;
        m
    }

    fn params(last_written: Option<Offset>) -> PrepareParams<'static> {
        PrepareParams {
            last_written,
            source: "us",
            target: "eu",
            provenance: true,
            topic_created_at: 9,
        }
    }

    fn batch(messages: Vec<IggyMessage>) -> Batch {
        Batch::new(messages, None).expect("not empty")
    }

    fn offsets(batch: &Batch) -> Vec<u64> {
        batch.messages.iter().map(|m| m.header.offset).collect()
    }

    #[test]
    fn send_verdict_sends_only_on_a_lease_valid_past_the_margin() {
        let now = Instant::now();
        let margin = Duration::from_millis(500);
        let long = Some(now + Duration::from_secs(1));
        check!(send_verdict(now, long, margin, || true) == Ok(()));
        // The assignments are not even consulted when the one call says yes.
        check!(send_verdict(now, long, margin, || false) == Ok(()));
        check!(
            send_verdict(now, Some(now + margin), margin, || true) == Err(SendVeto::LeaseExpiring)
        );
    }

    #[test]
    fn send_verdict_tells_a_moved_unit_from_a_lease_too_short() {
        let now = Instant::now();
        let margin = Duration::from_millis(500);
        check!(send_verdict(now, None, margin, || true) == Err(SendVeto::LeaseExpiring));
        check!(send_verdict(now, None, margin, || false) == Err(SendVeto::EpochNotCurrent));
        let short = Some(now + Duration::from_millis(100));
        check!(send_verdict(now, short, margin, || false) == Err(SendVeto::EpochNotCurrent));
    }

    #[test]
    fn prepare_drops_what_is_already_downstream() {
        let mut b = batch((10..15).map(|o| msg(o, None)).collect());
        let p = prepare(&mut b, &params(Some(12))).expect("fits");
        check!(offsets(&b) == vec![13, 14]);
        check!(b.last_offset == 14);
        check!(p.newest_timestamp == 24);
    }

    #[test]
    fn prepare_preserves_message_and_stamps_provenance() {
        let original = msg(3, None);
        let mut b = batch(vec![msg(3, None)]);
        let p = prepare(&mut b, &params(None)).expect("fits");
        assert!(b.messages.len() == 1);
        let out = &b.messages[0];
        check!(out.header.id == 1003);
        check!(out.header.origin_timestamp == 8);
        check!(out.payload == original.payload);
        let found = provenance::find(out.user_headers.as_deref());
        check!(found.source == Some("us"));
        check!(found.offset == Some(3));
        check!(found.topic_created_at == Some(9));
        let headers_len = out.user_headers.as_ref().map_or(0, |h| h.len());
        check!(out.header.user_headers_length as usize == headers_len);
        check!(p.bytes == (64 + original.payload.len() + headers_len) as u64);
    }

    #[test]
    fn preparing_a_prepared_batch_again_changes_nothing() {
        let user = provenance::stamp(
            None,
            &provenance::Stamp {
                source: "ap",
                offset: 77,
                topic_created_at: 1,
            },
        );
        let mut b = batch(vec![msg(1, None), msg(2, user)]);
        let fields = |b: &Batch| -> Vec<(u64, u128, u32, Bytes, Option<Bytes>)> {
            b.messages
                .iter()
                .map(|m| {
                    let h = &m.header;
                    (
                        h.offset,
                        h.id,
                        h.user_headers_length,
                        m.payload.clone(),
                        m.user_headers.clone(),
                    )
                })
                .collect()
        };
        prepare(&mut b, &params(None)).expect("fits");
        let once = fields(&b);
        prepare(&mut b, &params(None)).expect("fits");
        check!(fields(&b) == once);
        check!(provenance::find(b.messages[1].user_headers.as_deref()).origin == Some("ap"));
    }

    #[test]
    fn prepare_skips_messages_that_originated_in_the_target() {
        let from_eu = provenance::stamp(
            None,
            &provenance::Stamp {
                source: "eu",
                offset: 1,
                topic_created_at: 1,
            },
        );
        let mut b = batch(vec![msg(0, from_eu), msg(1, None)]);
        prepare(&mut b, &params(None)).expect("fits");
        check!(b.skipped == 1);
        check!(offsets(&b) == vec![1]);
        check!(b.last_offset == 1);
    }

    #[test]
    fn prepare_without_provenance_forwards_headers_unchanged() {
        let raw = Bytes::from_static(&[2, 1, 0, 0, 0, b'k', 2, 1, 0, 0, 0, b'v']);
        let mut b = batch(vec![msg(0, Some(raw.clone()))]);
        let mut p = params(None);
        p.provenance = false;
        prepare(&mut b, &p).expect("fits");
        check!(b.messages[0].user_headers == Some(raw));
    }
}
