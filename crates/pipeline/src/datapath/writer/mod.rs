//! The downstream writer of one unit: a task that finds where the unit resumes, then sends the
//! reader's batches to the same partition downstream, stamped with provenance, and confirms
//! offsets to the control plane.
//!
//! The task is IO around pure cores: [`resume`] decides the resume point and how far back to
//! scan the downstream tail, [`core`](mod@core) holds the writer's state between IO calls and
//! decides on their answers (the deterministic simulator drives the same core), [`join`] which
//! queued batches go out together in one send, [`prepare`](mod@prepare) turns a batch into the
//! downstream messages, [`send`] decides whether
//! it may go out (lease and epoch, checked before every send and again once the connection is
//! ours), and [`commit`] keeps the commit bookkeeping.
//!
//! How a writer ends:
//! - the reader ended (the coordinator stopped the pair, or the reader failed) and closed the
//!   channel: the writer sends what is still queued, makes its final commit and ends;
//! - the pair's stop token fires while the writer waits (for a lease, or to retry a failure):
//!   it makes the final commit of what is downstream and ends, leaving the batch it held to the
//!   next owner (nothing of it is confirmed);
//! - a commit is fenced or its epoch is no longer current: it ends at once;
//! - a failure is not transient or outlasts the retry budget: it ends with the error, and the
//!   coordinator restarts the pair after a backoff.
//!
//! A send in progress is never abandoned half-way (only `crash` aborts the task).

pub(crate) mod commit;
pub(crate) mod core;
pub(crate) mod join;
pub(crate) mod landed;
mod prepare;
pub(crate) mod resume;
pub(crate) mod send;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use replicator_model::{CommitOutcome, Offset, ProgressCommit, UnitProgress, UnitStart};
use replicator_sdk::types::PollingStrategy;
use replicator_sdk::types::{Consumer, Identifier, IggyTimestamp};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::{HeadersTail, Message};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use self::commit::{CommitTracker, Settled};
use self::core::{Handled, Lost, Recopied, WriterCore};
use self::join::JoinedSend;
pub(crate) use self::prepare::{prepare, PrepareParams};
pub(crate) use self::resume::{reference as confirmed_position, TailStep};
use self::resume::{PartitionExtent, ResumeFacts, ResumePlan, TailCheck, TailHit};
pub(crate) use self::resume::{Position, ScanEnd, TailEntry, TailOutcome, TailPoll, TailScan};
use self::send::SendVeto;
use crate::backoff::Backoff;
use crate::clients::{polled_bytes, Cluster, Pick};
use crate::control::{ControlError, ControlPlane};
use crate::datapath::offsets::ReadFrom;
use crate::datapath::target::Copies;
use crate::datapath::unit::{named, Batch, UnitShared};
pub use crate::error::LandedMismatch;
use crate::error::{Error, Result};
use crate::provenance::{self, History};

/// What the coordinator starts a writer with.
pub(crate) struct WriterArgs<C> {
    /// The unit's shared context.
    pub(crate) shared: Arc<UnitShared<C>>,
    /// Receiving side of the bounded channel from the reader; its closing is the graceful stop.
    pub(crate) rx: mpsc::Receiver<Box<Batch>>,
    /// Tells the reader where to start, once the writer knows.
    pub(crate) start: oneshot::Sender<ReadFrom>,
    /// The pair's stop token: ends the writer's waits (the channel ends the rest).
    pub(crate) stop: CancellationToken,
}

/// Runs the writer of one unit until it ends; returns why it stopped, or the error it gave up
/// on.
pub(crate) async fn run<C: ControlPlane>(args: WriterArgs<C>) -> Result<&'static str> {
    let WriterArgs {
        shared,
        rx,
        start,
        stop,
    } = args;
    let commits = CommitTracker::new(
        shared.tuning.commit_interval,
        Instant::now(),
        shared.control.counts_totals().then(rand::random),
    );
    let core = WriterCore::new(
        shared.unit.clone(),
        shared.epoch,
        commits,
        Backoff::new(shared.tuning.backoff, shared.seed ^ 0x5eed),
        shared.tuning.retry_budget,
    );
    let mut writer = Writer {
        core,
        shared,
        rx,
        stop,
        commit_call: None,
        held: None,
        next: None,
    };
    let ended = writer.run(start).await;
    if let Ok(reason) = &ended {
        tracing::info!(reason, "writer stops");
    }
    ended
}

/// The commit call in flight.
type CommitCall =
    Pin<Box<dyn Future<Output = std::result::Result<Vec<CommitOutcome>, ControlError>> + Send>>;

/// A running writer.
struct Writer<C> {
    shared: Arc<UnitShared<C>>,
    rx: mpsc::Receiver<Box<Batch>>,
    stop: CancellationToken,
    /// What the writer knows and decides between IO calls.
    core: WriterCore,
    /// The call of the commit the core has in flight.
    commit_call: Option<CommitCall>,
    /// A batch taken from the channel but not yet sent (kept across retries), with the
    /// batches that were queued behind it when it was taken ([`join`]).
    held: Option<Batch>,
    /// The batch taken from the channel that did not join the held one: the next to send.
    next: Option<Batch>,
}

/// What the writer waits for.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// The next batch from the reader.
    Batch,
    /// The end of a pause (a lease re-check or a retry), unless the pair stops first.
    Until(tokio::time::Instant),
}

/// What ended a wait.
enum Woken {
    /// A batch arrived.
    Batch(Batch),
    /// The reader is gone and the channel is empty.
    Closed,
    /// The pause is over.
    PauseOver,
    /// The pair was stopped during a pause.
    Stopped,
    /// A commit was fenced.
    Fenced,
}

/// The outcome of one attempt to send the held batch.
enum Sent {
    /// Sent, or nothing in it needed sending.
    Done,
    /// Not sent: the lease or the epoch says no.
    Vetoed(SendVeto),
}

impl<C: ControlPlane> Writer<C> {
    /// Resuming and sending are boxed where they are awaited: a future is as large as its
    /// largest state, and this one waits for batches, idle, for most of its life, in every
    /// unit of the instance. Inline, those two paths made it 4.5 KiB; a box per batch sent
    /// costs less than that held by tens of thousands of idle writers. (Draining awaits boxed
    /// commit calls and is small.)
    async fn run(&mut self, start: oneshot::Sender<ReadFrom>) -> Result<&'static str> {
        let from = loop {
            if start.is_closed() {
                return Ok("reader gone before start");
            }
            let err = match Box::pin(self.resume()).await {
                Ok(from) => break from,
                Err(_) if self.stop.is_cancelled() => {
                    return self.drain("stopped before start").await
                }
                Err(err) => err,
            };
            let delay = self.retry_delay(err)?;
            match self.wait(Wait::Until(pause_end(delay))).await {
                Woken::Stopped => return self.drain("stopped before start").await,
                Woken::Fenced => return Ok("fenced"),
                _ => {}
            }
        };
        self.core.succeeded();
        // The reader may be gone already; the writer then drains an empty, closed channel.
        let _ = start.send(from);
        loop {
            if self.held.is_none() {
                let batch = match self.next.take() {
                    Some(batch) => batch,
                    None => match self.wait(Wait::Batch).await {
                        Woken::Batch(batch) => batch,
                        Woken::Closed => return self.drain("drained").await,
                        Woken::Fenced => return Ok("fenced"),
                        Woken::PauseOver | Woken::Stopped => continue,
                    },
                };
                self.held = Some(self.join_queued(batch));
            }
            let delay = match Box::pin(self.send_held()).await {
                Ok(Sent::Done) => {
                    self.core.succeeded();
                    self.start_commit();
                    continue;
                }
                Ok(Sent::Vetoed(veto)) => match self.core.vetoed(veto) {
                    Some(recheck) => {
                        tracing::debug!("lease not valid long enough to send; holding the batch");
                        recheck
                    }
                    None => return Ok("epoch no longer current"),
                },
                // A stop interrupted the tail re-read: no failure to count.
                Err(_) if self.stop.is_cancelled() => {
                    return self.drain("stopped while holding a batch").await
                }
                Err(err) => self.retry_delay(err)?,
            };
            match self.wait(Wait::Until(pause_end(delay))).await {
                Woken::Stopped => return self.drain("stopped while holding a batch").await,
                Woken::Fenced => return Ok("fenced"),
                _ => {}
            }
        }
    }

    /// `batch` with the batches queued behind it that go in the same send ([`join`]); the
    /// first one that does not is kept as the next to send.
    fn join_queued(&mut self, mut batch: Batch) -> Batch {
        let mut send = JoinedSend::of(&batch, self.shared.target.far());
        while let Ok(queued) = self.rx.try_recv() {
            let queued = *queued;
            if !send.admits(&queued) {
                self.next = Some(queued);
                break;
            }
            batch.join(queued);
        }
        batch
    }

    /// Waits for `wait`, meanwhile settling the commit in flight and starting the next one
    /// when it is due (so that progress held back by the commit interval is confirmed also
    /// when no batch comes). The stop token ends pauses only: a writer waiting for batches
    /// learns of the stop when the reader closes the channel, after the batches queued before.
    async fn wait(&mut self, wait: Wait) -> Woken {
        loop {
            let due = self
                .core
                .commit_due_at()
                .map(tokio::time::Instant::from_std);
            let (batches, until) = match wait {
                Wait::Batch => (true, None),
                Wait::Until(until) => (false, Some(until)),
            };
            let commit_call = &mut self.commit_call;
            tokio::select! {
                biased;
                () = self.stop.cancelled(), if !batches => return Woken::Stopped,
                answer = async { match commit_call.as_mut() { Some(call) => call.await, None => std::future::pending().await } } => {
                    self.commit_call = None;
                    if self.settle(answer).is_some() {
                        return Woken::Fenced;
                    }
                    self.start_commit();
                }
                () = sleep_until(due) => self.start_commit(),
                () = sleep_until(until) => return Woken::PauseOver,
                batch = self.rx.recv(), if batches => {
                    return batch.map_or(Woken::Closed, |batch| Woken::Batch(*batch));
                }
            }
        }
    }

    /// Works out where the unit resumes (confirmed offset, downstream tail, initial offset).
    async fn resume(&mut self) -> Result<ReadFrom> {
        let shared = self.shared.clone();
        let unit = &shared.unit;
        let (up_stream, up_topic) = shared.upstream_ids()?;
        let (down_stream, down_topic) = shared.downstream_ids()?;
        // All at once: across regions each is a round trip (a failover's new owner waits for
        // them before it writes). The tail scan's first page does not depend on the topics.
        let newest_page = TailScan::first_page(shared.tuning.tail_scan_window);
        let newest = async {
            if shared.flow.provenance {
                tail_page(&shared, newest_page).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let (up, down, newest) = tokio::join!(
            shared
                .source
                .topic_now(shared.slot(), &up_stream, &up_topic),
            shared
                .target
                .topic_now(shared.slot(), &down_stream, &down_topic),
            newest,
        );
        let (up, down) = (up?, down?);
        let (extent, created_at) = partition_figures(up, unit.partition)
            .ok_or_else(|| Error::UpstreamTopicGone { unit: unit.clone() })?;
        let progress = shared.control.progress(unit);
        let reset = match shared.control.pending_reset(unit) {
            // Decided for a topic of the same name that was deleted since: its offsets are
            // not this topic's. The new topic starts at the initial offset, as any recreated
            // topic does.
            Some(r) if r.topic_created_at.is_some_and(|t| t != created_at) => {
                tracing::warn!(
                    next = r.reset.next,
                    reset_for_created_at = r.topic_created_at,
                    created_at,
                    "an offset reset decided for an earlier topic of the same name is dropped: \
                     the topic was recreated since"
                );
                None
            }
            r => r.map(|r| r.reset),
        };
        let recorded = shared.control.recorded_start(unit);
        let down_next = partition_figures(down, unit.partition)
            .ok_or_else(|| Error::DownstreamMissing {
                stream: shared.downstream_stream.clone(),
                topic: unit.topic.clone(),
                partition: unit.partition,
            })?
            .0
            .next_offset();
        let (tail, tail_check) = if let Some(newest) = newest? {
            let reference = resume::reference(progress, created_at);
            let first = Some((newest_page, newest));
            let (tail, _) = scan_tail(&shared, created_at, reference, first, &self.stop).await?;
            let check = match tail {
                TailOutcome::Hit(hit) => check_tail(&shared, hit).await?,
                TailOutcome::Absent(_) => TailCheck::Unknown,
            };
            (Some(tail), check)
        } else {
            (None, TailCheck::Unknown)
        };
        let plan = resume::plan(&ResumeFacts {
            progress,
            created_at,
            tail,
            tail_check,
            initial: shared.flow.initial_offset,
            extent,
            reset,
            recorded,
        })
        .map_err(|_| Error::ResetsExhausted { unit: unit.clone() })?;
        if plan.record {
            // Before the first poll: a later owner starts here too, whatever the partition's
            // end is then (`latest`), until this unit's first commit.
            let start = UnitStart {
                next: plan.from.offset,
                history_label: plan.history.label(),
            };
            let newly_recorded = shared
                .control
                .record_start(unit, shared.epoch, start)
                .await
                .map_err(|e| Error::StartNotRecorded {
                    unit: unit.clone(),
                    reason: e.reason,
                    transient: e.transient,
                })?;
            if !newly_recorded {
                return Err(Error::StartNotRecorded {
                    unit: unit.clone(),
                    reason: "another start of this history was recorded meanwhile".to_owned(),
                    transient: true,
                });
            }
        }
        report(&shared, &plan, progress, extent, tail_check);
        if let Some(reset) = reset {
            tracing::info!(
                next = reset.next,
                allow_duplicates = reset.allow_duplicates,
                "unit starts where an operator reset it (flow reset)"
            );
        }
        let offset_map = crate::datapath::offset_maps::enabled(&shared.flow).then(|| {
            shared
                .offset_maps
                .resumed(unit, self::core::offset_map(&plan, progress, down_next))
        });
        self.core.resumed(&plan, tail, offset_map);
        // Lag counts from where the copy resumes: after what is downstream, or from a start
        // chosen without it (initial offset, operator reset, repair of a loss).
        shared
            .meters
            .resumed_after(plan.written.or_else(|| plan.from.offset.checked_sub(1)));
        shared.meters.set_epoch(shared.epoch);
        tracing::info!(
            offset = plan.from.offset,
            confirmed = ?plan.confirmed,
            tail = ?tail,
            resets = plan.history.resets,
            "unit resumes"
        );
        Ok(plan.from)
    }

    /// Sends the held batch (after a tail re-read if the previous attempt may have landed).
    async fn send_held(&mut self) -> Result<Sent> {
        let shared = self.shared.clone();
        if let Some(rescan) = self.core.rescan() {
            let (tail, next_down) = scan_tail(
                &shared,
                rescan.created_at,
                rescan.reference,
                None,
                &self.stop,
            )
            .await?;
            self.core
                .rescanned(tail, next_down)
                .map_err(|Lost { last_copied, tail }| Error::DownstreamLost {
                    unit: shared.unit.clone(),
                    last_copied,
                    tail,
                })?;
        }
        let Some(batch) = self.held.as_mut() else {
            return Ok(Sent::Done);
        };
        // Read per batch: a running writer switches to the compact format as soon as the
        // cluster's level allows it (it never goes back).
        let format = if shared.control.stamps_compact_provenance() {
            provenance::Format::Compact
        } else {
            provenance::Format::Entries
        };
        let stamper = shared.flow.provenance.then(|| {
            provenance::Stamper::new(&shared.flow.source, self.core.history_label(), format)
        });
        let prepared = prepare(
            batch,
            &PrepareParams {
                last_written: self.core.written(),
                target: &shared.flow.target,
                stamper: stamper.as_ref(),
            },
        )
        .map_err(|offset| Error::Message {
            unit: shared.unit.clone(),
            offset,
            reason: "its user headers with provenance exceed what Iggy accepts",
        })?;
        let (gap, last_offset) = (batch.gap, batch.last_offset);
        let recopied = self.core.recopy_until().map_or(0, |until| {
            batch.messages.partition_point(|m| m.offset <= until) as u64
        });
        let mut sent = None;
        if !batch.messages.is_empty() {
            let (stream, topic) = shared.downstream_ids()?;
            let count = batch.messages.len() as u64;
            // Through the flow's door: its throttle, then the lease and epoch, checked again
            // once the connection is ours, right before the request is written.
            let copies = Copies {
                unit: &shared.unit,
                epoch: shared.epoch,
                slot: shared.slot(),
                stream,
                topic,
                messages: &mut batch.messages,
                tail: stamper.as_ref().map(|s| s as &dyn HeadersTail),
                bytes: prepared.bytes,
            };
            let answer = shared
                .door
                .send_copies(&shared.target, copies, &shared.meters, &self.stop)
                .await;
            shared.target.open_far_slots();
            match answer {
                // The SDK leaves the messages' upstream offsets as they were.
                Ok(Ok(confirmed)) => self
                    .core
                    .acknowledged(
                        shared.unit.partition,
                        &confirmed,
                        batch.messages.iter().map(|m| m.offset),
                    )
                    .map_err(|mismatch| Error::UnexpectedAppend {
                        unit: shared.unit.clone(),
                        mismatch,
                    })?,
                Ok(Err(veto)) => return Ok(Sent::Vetoed(veto)),
                Err(err) => {
                    // The batch may have been appended even though the call failed.
                    self.core.send_unsure();
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
            }
            let now_us = IggyTimestamp::now().as_micros();
            shared.meters.latency(Duration::from_micros(
                now_us.saturating_sub(prepared.newest_timestamp),
            ));
            shared.meters.written(last_offset, count, prepared.bytes);
            if recopied > 0 {
                shared.meters.recopied(recopied);
            }
            sent = Some((count, prepared.bytes));
            tracing::debug!(offset = last_offset, count, "sent");
        }
        if let Some(done) = self.held.take() {
            if done.skipped > 0 {
                shared.meters.skipped(done.skipped);
            }
        }
        let repaired = self.core.handled(Handled {
            sent,
            recopied,
            last_offset,
            gap: gap.is_some(),
        });
        if let Some(repaired) = repaired {
            report_repair(&shared, repaired);
        }
        shared.meters.handled_through(last_offset);
        Ok(Sent::Done)
    }

    /// How long to wait before retrying after `err`, counting it; the error itself when it is
    /// not transient or the failure streak outlasted the retry budget.
    fn retry_delay(&mut self, err: Error) -> Result<Duration> {
        if !err.is_transient() {
            return Err(err);
        }
        self.shared.meters.error(err.kind());
        match self.core.failed(Instant::now()) {
            Some(delay) => {
                tracing::warn!(error = %err, backoff = ?delay, "write path failed, retrying");
                Ok(delay)
            }
            None => Err(err),
        }
    }

    /// Starts a commit if the tracker says one is due.
    fn start_commit(&mut self) {
        if let Some(commit) = self.core.commit_if_due(Instant::now()) {
            self.call_commit(commit);
        }
    }

    fn call_commit(&mut self, commit: ProgressCommit) {
        let control = self.shared.control.clone();
        self.commit_call = Some(Box::pin(async move { control.commit(vec![commit]).await }));
    }

    /// Applies a commit's answer; `Some` with the reason to stop when it was fenced.
    fn settle(
        &mut self,
        answer: std::result::Result<Vec<CommitOutcome>, ControlError>,
    ) -> Option<&'static str> {
        if let Err(err) = &answer {
            tracing::warn!(error = %err, "commit failed, will retry");
        }
        match self.core.settle(Instant::now(), answer.as_deref()) {
            Settled::Continue => None,
            Settled::Fenced { current } => {
                tracing::warn!(current = ?current, "commit fenced");
                Some("fenced")
            }
        }
    }

    /// The end of a writer that stops: settles the commit in flight, makes the final commit
    /// (without waiting for the commit interval) and returns `reason`.
    async fn drain(&mut self, reason: &'static str) -> Result<&'static str> {
        if let Some(call) = self.commit_call.take() {
            if let Some(fenced) = self.settle(call.await) {
                return Ok(fenced);
            }
        }
        if let Some(commit) = self.core.final_commit(Instant::now()) {
            self.call_commit(commit);
            if let Some(call) = self.commit_call.take() {
                if let Some(fenced) = self.settle(call.await) {
                    return Ok(fenced);
                }
            }
        }
        Ok(reason)
    }
}

/// Partition `id`'s extent in a topic's answer, and the topic's creation time (µs); `None`
/// when the topic or the partition does not exist. It takes the answer so that only these
/// figures outlive it: the answer lists every partition (1,000 of them are about 100 KiB
/// decoded), and a resume's later awaits queue behind other units' calls. Held across them by
/// every unit of an instance starting tens of thousands, those answers took gigabytes.
fn partition_figures(
    topic: Option<Arc<replicator_sdk::types::TopicDetails>>,
    id: u32,
) -> Option<(PartitionExtent, u64)> {
    let topic = topic?;
    let partition = topic.partitions.iter().find(|p| p.id == id)?;
    let extent = PartitionExtent {
        messages_count: partition.messages_count,
        current_offset: partition.current_offset,
    };
    Some((extent, topic.created_at.as_micros()))
}

/// Counts and logs what a resume plan found out: a recreated topic, a reset upstream
/// partition, confirmed messages not found downstream (read again; [`report_repair`] tells
/// whether the target lost them), a tail scan that reached its bound.
fn report<C>(
    shared: &UnitShared<C>,
    plan: &ResumePlan,
    progress: Option<UnitProgress>,
    extent: PartitionExtent,
    tail_check: TailCheck,
) {
    if let Some(forgotten) = plan.forgotten {
        shared.meters.upstream_reset();
        tracing::warn!(
            confirmed = forgotten,
            old_created_at = progress.map_or(0, |p| p.history_label),
            created_at = plan.history.created_at,
            "upstream topic was recreated; starting it from the initial offset"
        );
    }
    if let Some(last) = plan.reset {
        shared.meters.upstream_reset();
        tracing::warn!(
            last_copied = last.offset,
            resets = plan.history.resets,
            upstream_current_offset = extent.current_offset,
            upstream_messages = extent.messages_count,
            refilled = tail_check == TailCheck::Differs,
            "upstream partition was reset (purged, or its server lost its newest messages): \
             copying its new history from offset 0"
        );
    }
    if let Some(loss) = plan.loss {
        // Lost, or skipped by loop prevention and never written: reading them again tells
        // (`report_repair`).
        tracing::debug!(
            from = loss.from,
            to = loss.to,
            "confirmed messages not found downstream: reading them again"
        );
    }
    if plan.scan_exhausted {
        shared.meters.tail_scan_exhausted();
        let window = shared.tuning.tail_scan_window;
        // A unit that never committed has nothing an earlier owner could have written
        // unconfirmed, except in its very first moments.
        if progress.is_some() {
            tracing::warn!(
                window,
                "no message of this flow in the newest downstream messages scanned; writes \
                 of an earlier owner further back that were not confirmed are copied again"
            );
        } else {
            tracing::info!(
                window,
                "no message of this flow in the downstream tail scanned"
            );
        }
    }
}

/// Counts and logs how a resume's repair ended: confirmed messages sent again mean the target
/// lost them; none sent means they were all skipped by loop prevention (they came from the
/// target, as a two-way pair's copies do), and nothing was lost.
fn report_repair<C>(shared: &UnitShared<C>, repaired: Recopied) {
    let Recopied { from, to, resent } = repaired;
    if resent == 0 {
        tracing::info!(
            from,
            to,
            "the confirmed messages not found downstream all came from the target (loop \
             prevention skips them): nothing was lost"
        );
        return;
    }
    shared.meters.downstream_loss();
    tracing::warn!(
        from,
        to,
        lost = resent,
        "downstream lost confirmed messages (the target acknowledged them before it \
         persisted them); copied them again"
    );
}

/// When a pause of `delay` that starts now ends.
fn pause_end(delay: Duration) -> tokio::time::Instant {
    tokio::time::Instant::now() + delay
}

/// Sleeps until `at`, or forever without it.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The last message this flow wrote to the downstream partition for the upstream topic created
/// at `created_at` (any of its histories): reads the pages [`TailScan`] asks for, looking for
/// `reference` (the confirmed position) without a bound, or within the scan window without
/// one. `first` is a page read already, with the poll that read it: used if the scan asks for
/// that first. Ends with [`Error::Interrupted`] when the pair is stopped between two pages.
/// Also returns the partition's next offset as the newest page showed it.
async fn scan_tail<C>(
    shared: &UnitShared<C>,
    created_at: u64,
    reference: Option<Position>,
    mut first: Option<(TailPoll, Vec<Message>)>,
    stop: &CancellationToken,
) -> Result<(TailOutcome, Offset)> {
    let source = shared.flow.source.as_str();
    let ours = |m: &Message| {
        let found = provenance::find(m.user_headers.as_deref());
        if !found.from_source(source) {
            return None;
        }
        let history = History::from_label(found.history_label?);
        history.is_of(created_at).then_some(Position {
            resets: history.resets,
            offset: found.offset?,
        })
    };
    let window = shared.tuning.tail_scan_window;
    let (mut scan, mut poll) = TailScan::start(window, reference);
    let mut pages = 0u64;
    let mut next_down = None;
    loop {
        if stop.is_cancelled() {
            return Err(Error::Interrupted {
                unit: shared.unit.clone(),
                op: "downstream tail scan",
            });
        }
        let messages = match first.take() {
            Some((read, messages)) if read == poll => messages,
            _ => tail_page(shared, poll).await?,
        };
        let page: Vec<TailEntry> = messages
            .iter()
            .map(|m| TailEntry {
                offset: m.offset,
                ours: ours(m),
            })
            .collect();
        // The first page is the newest one: it ends where the partition does.
        let end = *next_down.get_or_insert(page.last().map_or(0, |e| e.offset + 1));
        match scan.feed(&page) {
            TailStep::Poll(next) => poll = next,
            TailStep::Done(found) => return Ok((found, end)),
        }
        pages += 1;
        if pages.is_multiple_of(100) {
            tracing::info!(
                scanned = scan.scanned(),
                reference = ?reference,
                "still scanning the downstream tail for the last message of this flow"
            );
        }
    }
}

/// Reads the page `poll` of the downstream partition (the tail scan's).
async fn tail_page<C>(shared: &UnitShared<C>, poll: TailPoll) -> Result<Vec<Message>> {
    let (stream, topic) = shared.downstream_ids()?;
    let partition = shared.unit.partition;
    let consumer = Consumer::new(named("iggy-replicator.tail", &shared.unit)?);
    let (strategy, count) = tail_poll(poll);
    let polled = shared
        .target
        .call_picked(
            (shared.slot(), Pick::Own),
            "poll_messages (tail)",
            |cl| async move {
                cl.poll_messages(
                    &stream,
                    &topic,
                    Some(partition),
                    &consumer,
                    &strategy,
                    count,
                    false,
                )
                .await
            },
            polled_bytes,
        )
        .await?;
    Ok(polled.messages)
}

/// The poll that reads the page `poll` asks for: strategy and message count.
pub(crate) fn tail_poll(poll: TailPoll) -> (PollingStrategy, u32) {
    match poll {
        TailPoll::Last { count } => (PollingStrategy::last(), count),
        TailPoll::From { offset, count } => (PollingStrategy::offset(offset), count),
    }
}

/// Whether upstream still holds, at the offset of `hit`, the message copied there: a reset
/// partition refilled past the unit's position holds other messages at the same offsets.
async fn check_tail<C>(shared: &UnitShared<C>, hit: TailHit) -> Result<TailCheck> {
    let consumer = Consumer::new(named("iggy-replicator.check", &shared.unit)?);
    let at = |ids, offset| MessageAt {
        ids,
        partition: shared.unit.partition,
        offset,
        consumer: consumer.clone(),
    };
    let slot = shared.slot();
    let copied = poll_one(
        &shared.target,
        slot,
        at(shared.downstream_ids()?, hit.downstream),
    );
    let original = poll_one(
        &shared.source,
        slot,
        at(shared.upstream_ids()?, hit.position.offset),
    );
    // Two clusters: one round trip's wait, not two (this is on every resume's path).
    let (original, copied) = tokio::try_join!(original, copied)?;
    Ok(match (original, copied) {
        (Some(original), Some(copied)) if provenance::same_copy(&original, &copied) => {
            TailCheck::Same
        }
        (Some(_), Some(_)) => TailCheck::Differs,
        _ => TailCheck::Unknown,
    })
}

/// Where one message is read.
struct MessageAt {
    /// Stream and topic.
    ids: (Identifier, Identifier),
    partition: u32,
    offset: Offset,
    consumer: Consumer,
}

/// The message at `at`, if the partition holds that offset.
async fn poll_one(cluster: &Cluster, slot: usize, at: MessageAt) -> Result<Option<Message>> {
    let MessageAt {
        ids: (stream, topic),
        partition,
        offset,
        consumer,
    } = at;
    let polled = cluster
        .call(slot, "poll_messages (tail check)", |c| async move {
            let strategy = PollingStrategy::offset(offset);
            c.poll_messages(
                &stream,
                &topic,
                Some(partition),
                &consumer,
                &strategy,
                1,
                false,
            )
            .await
        })
        .await?;
    Ok(polled.messages.into_iter().find(|m| m.offset == offset))
}
