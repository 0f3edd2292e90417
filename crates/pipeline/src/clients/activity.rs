//! Per-stream activity watchers: while readers of a stream are idle, one stream listing per
//! `idle_poll_interval`, and one topic request per topic whose totals moved, replace one poll
//! per idle partition and interval.
//!
//! Iggy 0.8 has no long-poll, so a caught-up reader can only learn about a new message by asking.
//! Asking per partition made 1,000 idle partitions cost 10,000 polls per second. A topic's
//! metadata (`get_topic`) lists every partition's `current_offset` and `messages_count`, so one
//! request tells all readers of the topic on this node which of them have something to read;
//! but one such request per topic and interval still grew with the topics (at 100 topics a
//! quarter of a core per instance, BENCHMARKS section 8). A stream's details (`get_stream`) list
//! every topic of the stream with its totals (`messages_count`, `size`, partition count, id and
//! creation time) in one answer. So a round lists the stream once, and asks for the partitions
//! only of the topics whose totals moved since a subscriber last looked: an idle stream costs
//! one small request per interval, however many topics it has.
//!
//! A reader whose partition stayed empty long enough subscribes to its stream's
//! [`StreamActivity`] with its topic, partition and next offset, and with the number of the
//! last listing that had completed before its empty poll was sent ([`StreamActivity::listed`],
//! see `reader::idle_wait`); it awaits the [`Subscription`] together with its stop token and a
//! safety-net timer. While the stream has subscribers, one task lists it every interval and
//! records in which listing each topic's totals last moved ([`Changes`]); a topic with a
//! subscriber that has not looked since that listing is fetched ([`plan`]), and exactly the
//! subscribers whose partition holds a message they have not read are woken ([`should_wake`]).
//! The others are marked as having looked at this listing. A woken subscriber is removed: it
//! polls, and subscribes again once it is idle again. The task ends when no subscriber is left,
//! and starts again with the next one.
//!
//! Why a topic whose totals did not move can be skipped: a subscriber's empty poll was sent
//! after its listing had completed, so a message it did not see was appended after that listing
//! and raises its topic's `messages_count` and `size` in a later one; some listing in between
//! then differs from the one before it, which is a move after the subscriber's listing. The
//! totals come back to the same values only if messages were removed meanwhile with exactly the
//! same count and bytes (retention deleting a segment, a purge) while the partition count, id
//! and creation time stayed too. That wake is then late: every [`SWEEP_ROUNDS`] listings a
//! round fetches every topic with subscribers whether it moved or not, and the readers still
//! poll on their own now and then (the reader's safety net). A late copy, never a lost one,
//! since metadata only decides when a reader polls, never what it reads. The argument needs the totals never to count a message before a
//! poll can return it, and they do not: Iggy 0.8 adds a batch to its partition's statistics in
//! the same synchronous step (on the partition's shard) that appends it to the journal polls
//! read, Iggy 0.9 right after it advanced the offset polls read up to (its per-topic sums,
//! which `get_stream` answers with, are raised by the same increments). Totals that lag (Iggy
//! calls them "inconsistent") only delay a wake.
//!
//! Metadata is only a hint. Whatever it cannot vouch for (the stream or topic is missing, the
//! topic was recreated or lost partitions, a request failed) wakes every subscriber concerned, so
//! that the readers find out by polling; and readers still poll on their own every so often (the
//! reader's safety net).

use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use replicator_model::Offset;
use replicator_sdk::types::{Identifier, StreamDetails, TopicDetails};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use crate::error::Result;
use crate::stats::Observer;

/// What a watcher needs of its source cluster: the [`ActivityRegistry`] it is kept in, and the two
/// metadata requests it makes (`clients::Cluster` implements it; the watchers hold their source
/// through it, and this file needs nothing else of the cluster).
pub(crate) trait Source: Send + Sync + 'static {
    /// The cluster's alias.
    fn alias(&self) -> &str;
    /// The activity watchers of this cluster.
    fn activity(&self) -> &ActivityRegistry;
    /// `get_stream` of `stream` on the connection of `slot` (`None`: no such stream).
    fn get_stream(&self, slot: usize, stream: Identifier) -> Request<'_, Option<StreamDetails>>;
    /// `get_topic` of `stream/topic` on the connection of `slot` (`None`: no such topic).
    fn get_topic(
        &self,
        slot: usize,
        stream: Identifier,
        topic: Identifier,
    ) -> Request<'_, Option<TopicDetails>>;
}

/// The answer to one request of a [`Source`].
pub(crate) type Request<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What tells two stream watchers apart: the flow (which fixes the source cluster and the idle
/// interval) and the upstream stream. Two flows reading the same source stream get one watcher
/// each: one more listing per interval, but each keeps its own interval.
type StreamKey = (String, String);

/// The activity watchers of one source cluster, created lazily by the first idle reader of each
/// stream. It lives in the [`Cluster`], which every unit reading from that cluster on this node
/// shares, so that `Cluster::close` (the last step of both `Pipeline::shutdown` and
/// `Pipeline::crash`) also ends the watchers' tasks.
#[derive(Default)]
pub(crate) struct ActivityRegistry {
    /// Watchers by stream. Weak: a watcher lives as long as a reader (or its own running task)
    /// holds it; dead entries are dropped whenever an entry is added, so the map stays bounded
    /// by the streams with live readers.
    streams: Mutex<HashMap<StreamKey, Weak<StreamActivity>>>,
    /// Set by [`ActivityRegistry::close`]: watchers created afterwards never start a task.
    closed: AtomicBool,
    /// Subscriptions alive over every watcher of the cluster: the readers of this instance
    /// waiting for a watcher of it (they spread their safety-net polls by it).
    watched: AtomicUsize,
}

/// Everything a watcher needs, given by the reader that creates it.
pub(crate) struct WatchParams {
    /// Flow name, e.g. `us-to-eu`.
    pub(crate) flow: String,
    /// Upstream stream name.
    pub(crate) stream: String,
    /// Named identifier of the stream (already validated by the reader).
    pub(crate) stream_id: Identifier,
    /// Pause between two rounds: the flow's `idle_poll_interval`.
    pub(crate) interval: Duration,
    /// Where failed metadata requests are counted (by error kind, under the flow).
    pub(crate) observer: Observer,
}

impl ActivityRegistry {
    /// Ends every watcher's task now; later subscriptions are still accepted but wake nobody
    /// (the readers' own safety-net polls still run). Called when the cluster is closed.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let watchers: Vec<Arc<StreamActivity>> = lock(&self.streams)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for watcher in watchers {
            let task = lock(&watcher.state).task.take();
            if let Some(task) = task {
                task.abort();
            }
        }
    }
}

/// The watcher of `params`' stream on `source`, created if no reader holds one yet.
pub(crate) fn watch<S: Source>(source: &Arc<S>, params: WatchParams) -> Arc<StreamActivity> {
    let registry = source.activity();
    let key = (params.flow.clone(), params.stream.clone());
    let mut streams = lock(&registry.streams);
    if let Some(existing) = streams.get(&key).and_then(Weak::upgrade) {
        return existing;
    }
    streams.retain(|_, w| w.strong_count() > 0);
    let span = tracing::info_span!(
        parent: None,
        "activity",
        cluster = %source.alias(),
        flow = %params.flow,
        stream = %params.stream,
    );
    let watcher = Arc::new(StreamActivity {
        source: source.clone(),
        slot: slot_of(&(&params.stream,)),
        stream: params.stream,
        stream_id: params.stream_id,
        flow: params.flow,
        interval: params.interval,
        observer: params.observer,
        degraded: AtomicBool::new(false),
        listed: AtomicU64::new(0),
        span,
        state: Mutex::new(WatchState::default()),
    });
    streams.insert(key, Arc::downgrade(&watcher));
    watcher
}

/// A connection slot chosen by hashing `key`, so that the watchers of different streams (and
/// their topic requests) spread over the connections like the readers do.
fn slot_of(key: &impl Hash) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish() as usize
}

/// The watcher of one stream: its subscribers by topic and the task that wakes them.
pub(crate) struct StreamActivity {
    /// The source cluster.
    source: Arc<dyn Source>,
    /// Connection slot of the stream listings.
    slot: usize,
    /// Upstream stream name.
    stream: String,
    /// Named identifier of the upstream stream.
    stream_id: Identifier,
    /// Flow name, for the error counts.
    flow: String,
    /// Pause between two rounds.
    interval: Duration,
    /// Receives the kinds of failed metadata requests.
    observer: Observer,
    /// Set while metadata requests fail: subscribers then poll every interval on their own
    /// (the per-partition polling of before), cleared by the next round without failure.
    degraded: AtomicBool,
    /// Successful stream listings so far: the number of the latest one. Raised only once the
    /// listing's answer arrived and was recorded, so a reader that reads `n` before sending a
    /// poll knows that listing `n` saw the stream no later than its poll does.
    listed: AtomicU64,
    /// The task's span: cluster, flow, stream.
    span: tracing::Span,
    /// Subscribers, recorded totals and task. A std mutex: it is held for a few map operations,
    /// never across an await, and readers subscribe from inside their (synchronous) decision
    /// paths.
    state: Mutex<WatchState>,
}

/// Mutable part of a [`StreamActivity`].
#[derive(Default)]
struct WatchState {
    /// Topics with subscribers now, or listed in the latest listing after they had some.
    topics: HashMap<String, TopicWatch>,
    /// Totals of the latest listing and when each topic last moved.
    changes: Changes,
    /// Source of tickets.
    next_ticket: u64,
    /// Whether the task runs (it clears this itself, under the lock, when it finds no waiter).
    running: bool,
    /// The task, aborted by `ActivityRegistry::close`; replaced when a new one starts after the
    /// previous one ended by itself.
    task: Option<JoinHandle<()>>,
}

/// The subscribers of one topic.
struct TopicWatch {
    /// Named identifier of the topic, for its `get_topic` (given by its first subscriber).
    id: Identifier,
    /// Idle readers waiting for their partition to grow, by ticket.
    waiters: HashMap<u64, Waiter>,
    /// Id and creation time of the topic in the latest listing or fetch that held it (`None`
    /// until one did); another one later means it was recreated.
    identity: Option<TopicIdentity>,
}

/// One idle reader.
struct Waiter {
    /// Its partition.
    partition: u32,
    /// The next offset it would poll.
    next: Offset,
    /// The latest listing after which nothing it has not read was in its partition: the last
    /// listing completed before its empty poll, or one whose topic request found nothing new
    /// for it. `None`: unknown (it polled before it had the watcher), so the next round looks.
    checked: Option<u64>,
    /// Where the wake-up goes (one at most: a woken waiter is removed).
    wake: oneshot::Sender<()>,
}

/// One idle reader's subscription: [`Subscription::woken`] completes once the watcher saw a
/// message the reader has not read. Dropping it withdraws it (a reader that polls for another
/// reason, or stops), a no-op once it was woken.
pub(crate) struct Subscription {
    watcher: Arc<StreamActivity>,
    topic: String,
    ticket: u64,
    woken: oneshot::Receiver<()>,
}

impl Subscription {
    /// Completes when the watcher wakes this subscriber (never, once the watcher was closed:
    /// the reader's safety-net timer then brings the next poll).
    pub(crate) async fn woken(&mut self) {
        if (&mut self.woken).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(topic) = lock(&self.watcher.state).topics.get_mut(&self.topic) {
            topic.waiters.remove(&self.ticket);
        }
        let watched = &self.watcher.source.activity().watched;
        watched.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One idle reader's place, as it subscribes.
pub(crate) struct Idle<'a> {
    /// Upstream topic name (as the stream listing names it).
    pub(crate) topic: &'a str,
    /// Its named identifier.
    pub(crate) topic_id: &'a Identifier,
    /// The reader's partition.
    pub(crate) partition: u32,
    /// The next offset it would poll.
    pub(crate) next: Offset,
    /// [`StreamActivity::listed`] as read right before its empty poll was sent (`None` if it
    /// had no watcher then).
    pub(crate) listed_before_poll: Option<u64>,
}

impl StreamActivity {
    /// Whether metadata requests are failing (the reader then polls every interval itself).
    pub(crate) fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// The number of the latest successful stream listing (0 before the first). A reader reads
    /// it right before it sends a poll, and subscribes with it if the poll finds nothing.
    pub(crate) fn listed(&self) -> u64 {
        self.listed.load(Ordering::SeqCst)
    }

    /// How many readers of this instance wait for a watcher of the source cluster now.
    pub(crate) fn watched(&self) -> usize {
        self.source.activity().watched.load(Ordering::Relaxed)
    }

    /// Subscribes an idle reader: woken once its partition holds a message at or after its
    /// next offset. Starts the watcher's task if it does not run.
    pub(crate) fn subscribe(self: &Arc<Self>, idle: Idle<'_>) -> Subscription {
        let (wake, woken) = oneshot::channel();
        let mut state = lock(&self.state);
        let ticket = state.next_ticket;
        state.next_ticket = ticket.wrapping_add(1);
        let topic = state
            .topics
            .entry(idle.topic.to_owned())
            .or_insert_with(|| TopicWatch {
                id: idle.topic_id.clone(),
                waiters: HashMap::new(),
                identity: None,
            });
        topic.waiters.insert(
            ticket,
            Waiter {
                partition: idle.partition,
                next: idle.next,
                checked: idle.listed_before_poll,
                wake,
            },
        );
        if !state.running && !self.source.activity().closed.load(Ordering::SeqCst) {
            state.running = true;
            if let Some(old) = state.task.take() {
                // It cleared `running` and returns without touching anything else.
                old.abort();
            }
            let watcher = self.clone();
            let span = self.span.clone();
            state.task = Some(tokio::spawn(run(watcher).instrument(span)));
        }
        drop(state);
        // Given back by the subscription's drop.
        let watched = &self.source.activity().watched;
        watched.fetch_add(1, Ordering::Relaxed);
        Subscription {
            watcher: self.clone(),
            topic: idle.topic.to_owned(),
            ticket,
            woken,
        }
    }

    /// Whether any subscriber is left (a reader that stops, also an aborted one, withdraws its
    /// subscription as it drops it); if not, the task is about to end, so it is marked as not
    /// running under the same lock a new subscriber takes.
    fn keep_running(&self) -> bool {
        let mut state = lock(&self.state);
        if state.topics.values().all(|t| t.waiters.is_empty()) {
            state.running = false;
            return false;
        }
        true
    }

    /// Counts and logs a failed metadata request (once per failure streak) and turns on the
    /// degraded mode.
    fn failed(&self, op: &str, err: &crate::error::Error) {
        self.observer.0.error(&self.flow, err.kind());
        if !self.degraded.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %err,
                op,
                "stream metadata unavailable; idle partitions are polled one by one"
            );
        }
    }

    /// Lists the stream: `Ok(None)` when it is missing, `Err` when the request failed.
    async fn list(&self) -> Result<Option<Vec<(String, TopicTotals)>>, ()> {
        let stream = self.stream_id.clone();
        let result = self.source.get_stream(self.slot, stream).await;
        match result {
            Ok(details) => Ok(details.as_ref().map(TopicTotals::of_stream)),
            Err(err) => {
                self.failed("get_stream", &err);
                Err(())
            }
        }
    }

    /// Fetches one topic's partitions: `Ok(None)` when it is missing, `Err` when the request
    /// failed.
    async fn fetch(&self, topic: &str, id: Identifier) -> Result<Option<Listing>, ()> {
        let stream = self.stream_id.clone();
        let result = self
            .source
            .get_topic(slot_of(&(&self.stream, topic)), stream, id)
            .await;
        match result {
            Ok(details) => Ok(details.as_ref().map(Listing::of)),
            Err(err) => {
                self.failed("get_topic", &err);
                Err(())
            }
        }
    }

    /// Applies one stream listing (`None`: the stream is missing or the request failed, and
    /// every subscriber is woken). Returns the listing's number and the topics to fetch; wakes
    /// the subscribers of topics the listing does not hold.
    fn on_listing(
        &self,
        listing: Option<Vec<(String, TopicTotals)>>,
    ) -> (u64, Vec<(String, Identifier)>) {
        let mut woken = Vec::new();
        let mut fetch = Vec::new();
        let round;
        {
            let mut state = lock(&self.state);
            let state = &mut *state;
            match listing {
                None => {
                    round = self.listed();
                    for topic in state.topics.values_mut() {
                        woken.extend(topic.waiters.drain().map(|(_, w)| w.wake));
                    }
                }
                Some(listing) => {
                    round = self.listed().wrapping_add(1);
                    state.changes.record(round, listing);
                    self.listed.store(round, Ordering::SeqCst);
                    let changes = &state.changes;
                    let sweep = round % SWEEP_ROUNDS == 0;
                    state.topics.retain(|name, topic| {
                        let moved_at = changes.moved_at(name);
                        let listed = changes.identity(name);
                        let replaced = replaced(topic.identity, listed);
                        if listed.is_some() {
                            topic.identity = listed;
                        }
                        let checked = topic.waiters.values().map(|w| w.checked);
                        let seen = TopicRound {
                            moved_at,
                            replaced,
                            sweep,
                        };
                        match plan(seen, checked) {
                            Plan::WakeAll => {
                                woken.extend(topic.waiters.drain().map(|(_, w)| w.wake));
                            }
                            Plan::Fetch => fetch.push((name.clone(), topic.id.clone())),
                            Plan::Wait => {}
                        }
                        // A topic the listing lost keeps nothing worth keeping once nobody
                        // waits: its recreation shows as a new topic, which is fetched.
                        moved_at.is_some() || !topic.waiters.is_empty()
                    });
                }
            }
        }
        wake_all(woken);
        (round, fetch)
    }

    /// Applies the partitions of `topic` fetched after listing `round` (`None`: missing or the
    /// request failed): wakes the subscribers they show something to read (everyone, if they
    /// cannot vouch for anything), and marks the others as having looked at `round`.
    fn on_topic(&self, round: u64, topic: &str, listing: Option<Listing>) {
        let woken: Vec<oneshot::Sender<()>> = {
            let mut state = lock(&self.state);
            let Some(watch) = state.topics.get_mut(topic) else {
                return;
            };
            let view = TopicView::new(watch.identity, listing);
            if let TopicView::Listed { identity, .. } | TopicView::Replaced { identity } = &view {
                watch.identity = Some(*identity);
            }
            let (due, mut waiting): (HashMap<u64, Waiter>, HashMap<u64, Waiter>) =
                std::mem::take(&mut watch.waiters)
                    .into_iter()
                    .partition(|(_, w)| should_wake(&view, w.partition, w.next));
            // Nothing new for them as late as this fetch, which came after listing `round`:
            // whatever arrives from now on moves a later listing.
            for waiter in waiting.values_mut() {
                waiter.checked = Some(waiter.checked.map_or(round, |c| c.max(round)));
            }
            watch.waiters = waiting;
            due.into_values().map(|w| w.wake).collect()
        };
        wake_all(woken);
    }
}

/// Sends the wake-ups.
fn wake_all(woken: Vec<oneshot::Sender<()>>) {
    if !woken.is_empty() {
        tracing::debug!(readers = woken.len(), "waking idle readers");
    }
    for wake in woken {
        // A reader that stopped meanwhile has nothing to wake.
        let _ = wake.send(());
    }
}

/// The watcher's loop: one stream listing per interval while anybody waits, then a topic
/// request for each topic [`plan`] says to look at. The first round comes one interval after
/// the start: the subscriber that started it has just polled.
async fn run(watcher: Arc<StreamActivity>) {
    let start = tokio::time::Instant::now() + watcher.interval;
    let mut tick = tokio::time::interval_at(start, watcher.interval);
    // After a slow round, wait a whole interval again rather than catching up in a burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !watcher.keep_running() {
            tracing::debug!("no idle reader left; watcher stops");
            return;
        }
        let listing = watcher.list().await;
        let mut ok = listing.is_ok();
        let (round, fetch) = watcher.on_listing(listing.ok().flatten());
        for (topic, id) in fetch {
            let listing = watcher.fetch(&topic, id).await;
            ok &= listing.is_ok();
            watcher.on_topic(round, &topic, listing.ok().flatten());
        }
        if ok && watcher.degraded.swap(false, Ordering::Relaxed) {
            tracing::info!("stream metadata available again");
        }
    }
}

/// What a stream listing says about one topic: every figure whose change a round notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopicTotals {
    /// Id and creation time (another one: recreated).
    pub(crate) identity: TopicIdentity,
    /// Partition count (added or lost partitions).
    pub(crate) partitions: u32,
    /// Messages stored in all partitions.
    pub(crate) messages_count: u64,
    /// Bytes stored in all partitions (moves also when retention removes what as many new
    /// messages replace, unless their bytes match too).
    pub(crate) size_bytes: u64,
}

impl TopicTotals {
    /// The totals of every topic of a stream, by topic name.
    fn of_stream(details: &StreamDetails) -> Vec<(String, TopicTotals)> {
        details
            .topics
            .iter()
            .map(|t| {
                let totals = TopicTotals {
                    identity: TopicIdentity {
                        id: t.id,
                        created_at: t.created_at.as_micros(),
                    },
                    partitions: t.partitions_count,
                    messages_count: t.messages_count,
                    size_bytes: t.size.as_bytes_u64(),
                };
                (t.name.clone(), totals)
            })
            .collect()
    }
}

/// The totals of each topic in the latest listing, and the listing in which they last moved.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// By topic name.
    topics: HashMap<String, Moved>,
}

/// One topic in [`Changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Moved {
    /// Its totals in the latest listing.
    totals: TopicTotals,
    /// The number of the listing in which they last differed from the listing before.
    at: u64,
}

impl Changes {
    /// Records listing `round`: a topic whose totals differ from the previous listing's, or that
    /// the previous listing did not hold, moved at `round`; topics it does not hold are
    /// forgotten.
    pub(crate) fn record(&mut self, round: u64, listed: Vec<(String, TopicTotals)>) {
        let mut next = HashMap::with_capacity(listed.len());
        for (name, totals) in listed {
            let at = match self.topics.get(&name) {
                Some(before) if before.totals == totals => before.at,
                _ => round,
            };
            next.insert(name, Moved { totals, at });
        }
        self.topics = next;
    }

    /// The listing in which `topic` last moved; `None` when the latest listing did not hold it.
    pub(crate) fn moved_at(&self, topic: &str) -> Option<u64> {
        self.topics.get(topic).map(|m| m.at)
    }

    /// The identity of `topic` in the latest listing; `None` when it did not hold it.
    pub(crate) fn identity(&self, topic: &str) -> Option<TopicIdentity> {
        self.topics.get(topic).map(|m| m.totals.identity)
    }
}

/// Whether a topic known as `known` (`None`: not seen yet) and now listed as `listed` (`None`:
/// not listed) was deleted and created again in between: its subscribers' offsets belong to
/// the old one.
pub(crate) fn replaced(known: Option<TopicIdentity>, listed: Option<TopicIdentity>) -> bool {
    matches!((known, listed), (Some(k), Some(l)) if k != l)
}

/// Every this many listings (10 s with the default `idle_poll_interval`) a round fetches every
/// topic that has subscribers, moved or not: totals that came back to the values of the listing
/// before (retention removed as many messages and bytes as arrived in between) hide a new
/// message from the listings, not from the partition figures of a fetch. The delay of such a
/// wake stays as short as the readers' own safety net was before it was stretched, at one topic
/// request per topic with subscribers per sweep.
const SWEEP_ROUNDS: u64 = 100;

/// What a listing says about one topic, for [`plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopicRound {
    /// The listing in which the topic last moved (`None`: the latest listing does not hold it).
    pub(crate) moved_at: Option<u64>,
    /// The listing holds another topic of that name than the one known (see [`replaced`]).
    pub(crate) replaced: bool,
    /// A sweep round ([`SWEEP_ROUNDS`]): look whatever moved.
    pub(crate) sweep: bool,
}

/// What a round does for the subscribers of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// The listing does not hold the topic, or holds another topic of that name (recreated):
    /// everybody polls (and finds out).
    WakeAll,
    /// Fetch the topic's partitions and wake by partition.
    Fetch,
    /// Nothing moved since every subscriber last looked.
    Wait,
}

/// What a round does for the subscribers of a topic the listing shows as `seen`, given the
/// listing each subscriber last looked at (`checked`, `None`: unknown). A subscriber that
/// looked at the listing in which the topic last moved, or a later one, has seen everything
/// the totals can tell; a sweep looks anyway.
pub(crate) fn plan(seen: TopicRound, checked: impl IntoIterator<Item = Option<u64>>) -> Plan {
    let Some(moved_at) = seen.moved_at.filter(|_| !seen.replaced) else {
        return Plan::WakeAll;
    };
    let mut checked = checked.into_iter().peekable();
    if checked.peek().is_none() {
        return Plan::Wait;
    }
    if seen.sweep || checked.any(|c| c.is_none_or(|looked| looked < moved_at)) {
        Plan::Fetch
    } else {
        Plan::Wait
    }
}

/// Id and creation time (µs) of a topic: a topic deleted and created again under the same name
/// differs in at least one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopicIdentity {
    /// Numeric id on the source cluster.
    pub(crate) id: u32,
    /// Creation time in µs.
    pub(crate) created_at: u64,
}

/// What metadata says about one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionMark {
    /// Offset of the newest message (Iggy's `current_offset`; 0 also for an empty partition).
    pub(crate) current_offset: Offset,
    /// Messages stored (0: empty, whatever `current_offset` says).
    pub(crate) messages_count: u64,
}

impl PartitionMark {
    /// Whether the partition holds a message at or after `next`. `current_offset` is the offset
    /// of the newest message, and 0 both for an empty partition and for one holding only offset
    /// 0: `messages_count` tells them apart. A partition whose messages retention removed all
    /// keeps its `current_offset` with a count of 0: nothing to read there either.
    pub(crate) fn holds_from(&self, next: Offset) -> bool {
        self.messages_count > 0 && self.current_offset >= next
    }
}

/// One successful metadata answer, reduced to what the decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    /// The topic's identity.
    pub(crate) identity: TopicIdentity,
    /// Partition ids and marks, sorted by id.
    pub(crate) partitions: Vec<(u32, PartitionMark)>,
}

impl Listing {
    /// Reduces the SDK's answer.
    fn of(details: &TopicDetails) -> Self {
        let mut partitions: Vec<(u32, PartitionMark)> = details
            .partitions
            .iter()
            .map(|p| {
                let mark = PartitionMark {
                    current_offset: p.current_offset,
                    messages_count: p.messages_count,
                };
                (p.id, mark)
            })
            .collect();
        partitions.sort_unstable_by_key(|(id, _)| *id);
        Self {
            identity: TopicIdentity {
                id: details.id,
                created_at: details.created_at.as_micros(),
            },
            partitions,
        }
    }
}

/// What one metadata round tells the subscribers of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicView {
    /// The same topic as before (or the first listing): wake by partition.
    Listed {
        /// The topic's identity.
        identity: TopicIdentity,
        /// Partition ids and marks, sorted by id.
        partitions: Vec<(u32, PartitionMark)>,
    },
    /// Listed with another identity than before: the topic was recreated, and the readers'
    /// offsets belong to the old one. Everybody polls (and finds out).
    Replaced {
        /// The new identity.
        identity: TopicIdentity,
    },
    /// Missing, or the request failed: everybody polls.
    Unknown,
}

impl TopicView {
    /// The view of `listing` given the identity seen before (`None` before the first listing).
    pub(crate) fn new(known: Option<TopicIdentity>, listing: Option<Listing>) -> Self {
        match listing {
            None => Self::Unknown,
            Some(l) if known.is_some_and(|k| k != l.identity) => Self::Replaced {
                identity: l.identity,
            },
            Some(l) => Self::Listed {
                identity: l.identity,
                partitions: l.partitions,
            },
        }
    }
}

/// Whether the reader of `partition`, next polling `next`, must be woken: when the partition
/// holds a message at or after `next`, and whenever metadata cannot vouch for the opposite (the
/// partition is not listed any more, the topic was replaced or is unknown).
pub(crate) fn should_wake(view: &TopicView, partition: u32, next: Offset) -> bool {
    match view {
        TopicView::Listed { partitions, .. } => {
            match partitions.binary_search_by_key(&partition, |(id, _)| *id) {
                Ok(i) => partitions[i].1.holds_from(next),
                Err(_) => true,
            }
        }
        TopicView::Replaced { .. } | TopicView::Unknown => true,
    }
}

/// Locks a watcher's state; a poisoned lock is taken over (every update is a single map
/// operation or flag, valid after any panic between them).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use crate::clients::Cluster;
    use replicator_model::IggyVersion;

    const TOPIC: TopicIdentity = TopicIdentity {
        id: 3,
        created_at: 1_700_000_000_000_000,
    };

    fn mark(current_offset: Offset, messages_count: u64) -> PartitionMark {
        PartitionMark {
            current_offset,
            messages_count,
        }
    }

    fn listed(partitions: Vec<(u32, PartitionMark)>) -> TopicView {
        let listing = Listing {
            identity: TOPIC,
            partitions,
        };
        TopicView::new(Some(TOPIC), Some(listing))
    }

    /// A watcher whose task never starts (its registry is closed): tests call `on_listing` and
    /// `on_topic` as the task would.
    fn watcher() -> Arc<StreamActivity> {
        let timeout = Duration::from_secs(1);
        let cluster = Cluster::new(
            "us",
            IggyVersion::V0_8,
            "iggy://u:p@127.0.0.1:8090",
            1,
            timeout,
        )
        .expect("valid");
        let cluster = Arc::new(cluster);
        cluster.activity().close();
        let params = WatchParams {
            flow: "f".into(),
            stream: "s".into(),
            stream_id: Identifier::named("s").expect("valid"),
            interval: Duration::from_millis(100),
            observer: Observer::default(),
        };
        watch(&cluster, params)
    }

    /// Subscribes the idle reader of `topic`/`partition` at `next`, which polled after listing
    /// `listed_before_poll`.
    fn idle(
        watcher: &Arc<StreamActivity>,
        topic: &str,
        partition: u32,
        next: Offset,
        listed_before_poll: Option<u64>,
    ) -> Subscription {
        let id = Identifier::named(topic).expect("valid");
        watcher.subscribe(Idle {
            topic,
            topic_id: &id,
            partition,
            next,
            listed_before_poll,
        })
    }

    fn waiters(watcher: &StreamActivity) -> usize {
        lock(&watcher.state)
            .topics
            .values()
            .map(|t| t.waiters.len())
            .sum()
    }

    fn totals(messages_count: u64, size_bytes: u64) -> TopicTotals {
        TopicTotals {
            identity: TOPIC,
            partitions: 3,
            messages_count,
            size_bytes,
        }
    }

    /// Whether `subscription` was woken (without waiting: wake-ups are sent synchronously).
    fn was_woken(subscription: &mut Subscription) -> bool {
        subscription.woken.try_recv().is_ok()
    }

    fn fetched(fetch: &[(String, Identifier)]) -> Vec<&str> {
        fetch.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[tokio::test]
    async fn a_woken_subscriber_is_removed_and_a_dropped_one_withdrawn() {
        let watcher = watcher();
        let mut due = idle(&watcher, "t", 0, 5, None);
        let stopped = idle(&watcher, "t", 1, 5, None);
        let quiet = idle(&watcher, "t", 2, 5, None);
        check!(waiters(&watcher) == 3);
        check!(watcher.watched() == 3);
        // A reader that stops (or is aborted) drops its subscription.
        drop(stopped);
        check!(waiters(&watcher) == 2);
        check!(watcher.watched() == 2);
        let (round, fetch) = watcher.on_listing(Some(vec![("t".into(), totals(21, 2100))]));
        check!(fetched(&fetch) == ["t"]);
        let listing = Listing {
            identity: TOPIC,
            partitions: vec![(0, mark(5, 6)), (1, mark(9, 10)), (2, mark(4, 5))],
        };
        watcher.on_topic(round, "t", Some(listing));
        check!(was_woken(&mut due));
        // Partition 2 has nothing from offset 5 on: still waiting.
        check!(waiters(&watcher) == 1);
        // A woken reader counts as watched until it drops its subscription (and polls).
        check!(watcher.watched() == 2);
        drop(due);
        check!(watcher.watched() == 1);
        check!(watcher.keep_running());
        drop(quiet);
        check!(!watcher.keep_running());
    }

    #[tokio::test]
    async fn an_idle_stream_costs_one_listing_and_a_moved_topic_one_fetch() {
        let watcher = watcher();
        let quiet = totals(10, 1000);
        let listing = |a: TopicTotals, b: TopicTotals| Some(vec![("a".into(), a), ("b".into(), b)]);
        // Listing 1 is the first this watcher sees: both topics count as moved.
        let (round, fetch) = watcher.on_listing(listing(quiet, quiet));
        check!(round == 1 && watcher.listed() == 1);
        check!(fetch.is_empty(), "no subscriber yet: nothing to fetch");
        // Two readers went idle after listing 1 (their polls were sent after it completed).
        let mut a = idle(&watcher, "a", 0, 10, Some(1));
        let mut b = idle(&watcher, "b", 0, 10, Some(1));
        let (round, fetch) = watcher.on_listing(listing(quiet, quiet));
        check!(round == 2);
        check!(fetch.is_empty(), "nothing moved since they looked");
        // A message arrives in topic a.
        let (round, fetch) = watcher.on_listing(listing(totals(11, 1100), quiet));
        check!(fetched(&fetch) == ["a"]);
        let grown = Listing {
            identity: TOPIC,
            partitions: vec![(0, mark(10, 11))],
        };
        watcher.on_topic(round, "a", Some(grown));
        check!(was_woken(&mut a));
        check!(!was_woken(&mut b));
        // A new subscriber of a whose poll went out before listing 3 (it read 2) is looked at
        // although the totals stay: listing 3 moved a after its listing.
        let mut late = idle(&watcher, "a", 1, 0, Some(2));
        let (round, fetch) = watcher.on_listing(listing(totals(11, 1100), quiet));
        check!(fetched(&fetch) == ["a"]);
        let unchanged = Listing {
            identity: TOPIC,
            partitions: vec![(0, mark(10, 11)), (1, mark(0, 0))],
        };
        watcher.on_topic(round, "a", Some(unchanged));
        check!(!was_woken(&mut late));
        // Checked now: the next listing with the same totals fetches nothing.
        let (_, fetch) = watcher.on_listing(listing(totals(11, 1100), quiet));
        check!(fetch.is_empty());
        check!(waiters(&watcher) == 2);
    }

    #[tokio::test]
    async fn a_subscriber_that_polled_before_any_listing_is_looked_at_in_the_next_round() {
        let watcher = watcher();
        watcher.on_listing(Some(vec![("t".into(), totals(1, 100))]));
        watcher.on_listing(Some(vec![("t".into(), totals(1, 100))]));
        // No listing number (it had no watcher when it polled), or one from before the topic
        // last moved: its message may be counted in totals that no longer move.
        let _unknown = idle(&watcher, "t", 0, 1, None);
        let (_, fetch) = watcher.on_listing(Some(vec![("t".into(), totals(1, 100))]));
        check!(fetched(&fetch) == ["t"]);
    }

    #[tokio::test]
    async fn a_topic_recreated_between_two_listings_wakes_its_subscribers_without_a_fetch() {
        let watcher = watcher();
        let quiet = totals(10, 1000);
        watcher.on_listing(Some(vec![("t".into(), quiet)]));
        let mut a = idle(&watcher, "t", 0, 10, Some(1));
        let mut b = idle(&watcher, "t", 1, 10, Some(1));
        // Listing 2 is the first to see the topic since it had subscribers: its identity.
        let (_, fetch) = watcher.on_listing(Some(vec![("t".into(), quiet)]));
        check!(fetch.is_empty());
        // Deleted and created again under the same name: the readers' offsets belong to the
        // old topic, and a fetch of the new one (lower offsets) would wake neither.
        let recreated = TopicTotals {
            identity: TopicIdentity {
                id: TOPIC.id,
                created_at: TOPIC.created_at + 1,
            },
            ..totals(0, 0)
        };
        let (_, fetch) = watcher.on_listing(Some(vec![("t".into(), recreated)]));
        check!(fetch.is_empty());
        check!(was_woken(&mut a) && was_woken(&mut b));
        // The new identity is the known one from now on: its subscribers wait for growth.
        let mut c = idle(&watcher, "t", 0, 0, Some(3));
        let (_, fetch) = watcher.on_listing(Some(vec![("t".into(), recreated)]));
        check!(fetch.is_empty());
        check!(!was_woken(&mut c));
    }

    #[tokio::test]
    async fn every_hundredth_listing_fetches_a_watched_topic_that_did_not_move() {
        let watcher = watcher();
        let same = || Some(vec![("t".into(), totals(7, 700))]);
        watcher.on_listing(same());
        let _quiet = idle(&watcher, "t", 0, 7, Some(1));
        // Totals that came back to the same values hide a message from the listings: the
        // sweep looks at the partitions anyway, and only then.
        let swept: Vec<u64> = (2..=SWEEP_ROUNDS * 2)
            .filter_map(|_| {
                let (round, fetch) = watcher.on_listing(same());
                (!fetch.is_empty()).then_some(round)
            })
            .collect();
        check!(swept == [SWEEP_ROUNDS, SWEEP_ROUNDS * 2]);
    }

    #[tokio::test]
    async fn a_missing_stream_or_topic_or_a_failed_request_wakes_their_subscribers() {
        let watcher = watcher();
        let listing = || Some(vec![("t".into(), totals(1, 100))]);
        watcher.on_listing(listing());
        // The stream is missing or its listing failed: everybody polls.
        let mut t = idle(&watcher, "t", 0, 1, Some(1));
        let mut gone = idle(&watcher, "gone", 0, 1, Some(1));
        let (round, fetch) = watcher.on_listing(None);
        check!(round == 1 && fetch.is_empty());
        check!(was_woken(&mut t) && was_woken(&mut gone));
        // A topic the listing does not hold: its subscribers poll, the others wait.
        let mut t = idle(&watcher, "t", 0, 1, Some(1));
        let mut gone = idle(&watcher, "gone", 0, 1, Some(1));
        let (round, fetch) = watcher.on_listing(listing());
        check!(round == 2 && fetch.is_empty());
        check!(was_woken(&mut gone) && !was_woken(&mut t));
        // Its entry goes with its last subscriber.
        check!(!lock(&watcher.state).topics.contains_key("gone"));
        // A topic request that failed (or found the topic missing) wakes its subscribers.
        let _newcomer = idle(&watcher, "t", 1, 0, None);
        let (round, fetch) = watcher.on_listing(listing());
        check!(fetched(&fetch) == ["t"]);
        watcher.on_topic(round, "t", None);
        check!(was_woken(&mut t));
        check!(waiters(&watcher) == 0);
    }

    #[test]
    fn a_topic_moved_when_any_of_its_totals_differ_from_the_previous_listing() {
        let mut changes = Changes::default();
        let base = totals(100, 10_000);
        changes.record(1, vec![("t".into(), base)]);
        check!(changes.moved_at("t") == Some(1));
        check!(changes.identity("t") == Some(TOPIC));
        check!(changes.identity("u") == None);
        changes.record(2, vec![("t".into(), base)]);
        check!(changes.moved_at("t") == Some(1), "equal totals: not moved");
        // Retention removed messages that as many new ones replaced, with other bytes.
        changes.record(3, vec![("t".into(), totals(100, 10_001))]);
        check!(changes.moved_at("t") == Some(3));
        let more_partitions = TopicTotals {
            partitions: 4,
            ..totals(100, 10_001)
        };
        changes.record(4, vec![("t".into(), more_partitions)]);
        check!(changes.moved_at("t") == Some(4));
        let recreated = TopicTotals {
            identity: TopicIdentity {
                id: TOPIC.id,
                created_at: TOPIC.created_at + 1,
            },
            ..more_partitions
        };
        changes.record(5, vec![("t".into(), recreated)]);
        check!(changes.moved_at("t") == Some(5));
        // Gone from the listing: forgotten; back again: moved.
        changes.record(6, vec![]);
        check!(changes.moved_at("t") == None);
        changes.record(7, vec![("t".into(), recreated)]);
        check!(changes.moved_at("t") == Some(7));
    }

    /// A round of a topic that last moved in listing `moved_at`, neither replaced nor swept.
    fn moved(moved_at: Option<u64>) -> TopicRound {
        TopicRound {
            moved_at,
            replaced: false,
            sweep: false,
        }
    }

    #[test]
    fn a_topic_is_fetched_while_a_subscriber_has_not_looked_since_it_last_moved() {
        // Looked at the listing of the move or later: nothing to learn.
        check!(plan(moved(Some(5)), [Some(5), Some(7)]) == Plan::Wait);
        // `<` → `<=` would fetch every topic of every round again.
        check!(plan(moved(Some(5)), [Some(5)]) == Plan::Wait);
        check!(plan(moved(Some(5)), [Some(7), Some(4)]) == Plan::Fetch);
        // Polled before it had a watcher: the round cannot tell what its poll saw.
        check!(plan(moved(Some(5)), [Some(9), None]) == Plan::Fetch);
        check!(plan(moved(Some(5)), [None]) == Plan::Fetch);
        check!(
            plan(moved(Some(5)), []) == Plan::Wait,
            "no subscriber: no request"
        );
        // Not listed, or listed as another topic of the same name: everybody polls, also
        // subscribers that looked after the move.
        check!(plan(moved(None), [Some(9)]) == Plan::WakeAll);
        let replaced = TopicRound {
            replaced: true,
            ..moved(Some(5))
        };
        check!(plan(replaced, [Some(9)]) == Plan::WakeAll);
        check!(plan(replaced, []) == Plan::WakeAll);
    }

    #[test]
    fn a_sweep_fetches_every_topic_with_subscribers_whatever_moved() {
        let sweep = TopicRound {
            sweep: true,
            ..moved(Some(5))
        };
        check!(plan(sweep, [Some(9)]) == Plan::Fetch);
        check!(plan(sweep, []) == Plan::Wait, "no subscriber: no request");
        let gone = TopicRound {
            sweep: true,
            ..moved(None)
        };
        check!(plan(gone, [Some(9)]) == Plan::WakeAll);
    }

    #[test]
    fn a_topic_listed_with_another_id_or_creation_time_than_known_was_replaced() {
        let recreated = TopicIdentity {
            id: TOPIC.id,
            created_at: TOPIC.created_at + 1,
        };
        let renumbered = TopicIdentity {
            id: TOPIC.id + 1,
            ..TOPIC
        };
        check!(replaced(Some(TOPIC), Some(recreated)));
        check!(replaced(Some(TOPIC), Some(renumbered)));
        check!(!replaced(Some(TOPIC), Some(TOPIC)));
        // Nothing known yet (the first listing of a new subscriber's topic), or not listed
        // (which `plan` handles on its own): nothing to compare.
        check!(!replaced(None, Some(TOPIC)));
        check!(!replaced(Some(TOPIC), None));
    }

    #[test]
    fn empty_partition_is_not_woken_but_its_first_message_at_offset_0_is() {
        // Iggy reports `current_offset` 0 for an empty partition too.
        check!(!should_wake(&listed(vec![(0, mark(0, 0))]), 0, 0));
        check!(should_wake(&listed(vec![(0, mark(0, 1))]), 0, 0));
        // Once offset 0 was read, the same metadata wakes nobody.
        check!(!should_wake(&listed(vec![(0, mark(0, 1))]), 0, 1));
    }

    #[test]
    fn reader_is_woken_exactly_when_its_partition_holds_its_next_offset() {
        let view = listed(vec![(0, mark(41, 42)), (1, mark(9, 10)), (2, mark(0, 0))]);
        check!(should_wake(&view, 0, 41));
        check!(should_wake(&view, 0, 7));
        // `>=` → `>` leaves a reader asleep next to its one new message.
        check!(!should_wake(&view, 0, 42));
        check!(!should_wake(&view, 1, 10));
        check!(!should_wake(&view, 2, 0));
    }

    #[test]
    fn partition_emptied_by_retention_wakes_nobody() {
        // `current_offset` stays after retention removed every message; there is nothing to
        // read, and waking would poll the partition every interval for nothing.
        check!(!should_wake(&listed(vec![(0, mark(99, 0))]), 0, 50));
    }

    #[test]
    fn unlisted_partition_or_unknown_topic_wakes_everybody() {
        // The topic lost partitions (recreated with fewer): the reader finds out by polling.
        check!(should_wake(&listed(vec![(0, mark(5, 6))]), 3, 100));
        check!(should_wake(&TopicView::new(Some(TOPIC), None), 0, 100));
        check!(should_wake(&TopicView::new(None, None), 0, 100));
    }

    #[test]
    fn recreated_topic_wakes_everybody_once_then_wakes_by_partition_again() {
        let other = TopicIdentity {
            id: 4,
            created_at: TOPIC.created_at + 1,
        };
        let listing = Listing {
            identity: other,
            partitions: vec![(0, mark(0, 0))],
        };
        let view = TopicView::new(Some(TOPIC), Some(listing.clone()));
        check!(view == TopicView::Replaced { identity: other });
        check!(should_wake(&view, 0, 100));
        // The watcher adopts the new identity: the next round decides by partition again.
        let again = TopicView::new(Some(other), Some(listing.clone()));
        check!(!should_wake(&again, 0, 100));
        // The first listing of a watcher has nothing to compare with.
        check!(
            TopicView::new(None, Some(listing))
                == TopicView::Listed {
                    identity: other,
                    partitions: vec![(0, mark(0, 0))],
                }
        );
    }

    #[test]
    fn same_id_with_another_creation_time_is_another_topic() {
        // Iggy reuses the ids of deleted topics.
        let reused = TopicIdentity {
            id: TOPIC.id,
            created_at: TOPIC.created_at + 5,
        };
        let listing = Listing {
            identity: reused,
            partitions: vec![(0, mark(0, 0))],
        };
        check!(
            TopicView::new(Some(TOPIC), Some(listing)) == TopicView::Replaced { identity: reused }
        );
    }
}
