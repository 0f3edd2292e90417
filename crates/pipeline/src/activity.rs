//! Per-topic activity watchers: while readers of a topic are idle, one metadata request per
//! topic and `idle_poll_interval` replaces one poll per idle partition and interval.
//!
//! Iggy 0.8 has no long-poll, so a caught-up reader can only learn about a new message by asking.
//! Asking per partition made 1,000 idle partitions cost 10,000 polls per second. But a topic's
//! metadata (`get_topic`) already lists every partition's `current_offset` and
//! `messages_count`, so one request tells all readers of the topic on this node which of them
//! have something to read. A reader whose partition stayed empty long enough subscribes to its
//! topic's [`TopicActivity`] with its next offset (see `reader::idle_wait`) and awaits the
//! [`Subscription`] together with its stop token and a safety-net timer; while the topic has
//! subscribers, one task fetches the metadata every interval and wakes exactly the subscribers
//! whose partition holds a message they have not read ([`should_wake`]). A woken subscriber is
//! removed: it polls, and subscribes again once it is idle again. The task ends when no
//! subscriber is left, and starts again with the next one.
//!
//! Metadata is only a hint. Whatever it cannot vouch for (the topic is missing, was recreated,
//! lost partitions, or the request failed) wakes every subscriber, so that the readers find out
//! by polling; and readers still poll on their own every so often (the reader's safety net).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use iggy::prelude::{Identifier, TopicDetails};
use replicator_model::Offset;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use crate::clients::Cluster;
use crate::stats::Observer;

/// What tells two topic watchers apart: the flow (which fixes the source cluster and the idle
/// interval), the upstream stream and the upstream topic. Two flows reading the same source
/// topic get one watcher each: one more request per interval, but each keeps its own interval.
type TopicKey = (String, String, String);

/// The activity watchers of one source cluster, created lazily by the first idle reader of each
/// topic. It lives in the [`Cluster`], which every unit reading from that cluster on this node
/// shares, so that `Cluster::close` (the last step of both `Pipeline::shutdown` and
/// `Pipeline::crash`) also ends the watchers' tasks.
#[derive(Default)]
pub(crate) struct ActivityRegistry {
    /// Watchers by topic. Weak: a watcher lives as long as a reader (or its own running task)
    /// holds it; dead entries are dropped whenever an entry is added, so the map stays bounded
    /// by the topics with live readers.
    topics: Mutex<HashMap<TopicKey, Weak<TopicActivity>>>,
    /// Set by [`ActivityRegistry::close`]: watchers created afterwards never start a task.
    closed: AtomicBool,
}

/// Everything a watcher needs, given by the reader that creates it.
pub(crate) struct WatchParams {
    /// Flow name, e.g. `us-to-eu`.
    pub(crate) flow: String,
    /// Upstream stream name.
    pub(crate) stream: String,
    /// Upstream topic name.
    pub(crate) topic: String,
    /// Named identifiers of the stream and the topic (already validated by the reader).
    pub(crate) ids: (Identifier, Identifier),
    /// Pause between two metadata requests: the flow's `idle_poll_interval`.
    pub(crate) interval: Duration,
    /// Where failed metadata requests are counted (by error kind, under the flow).
    pub(crate) observer: Observer,
}

impl ActivityRegistry {
    /// Ends every watcher's task now; later subscriptions are still accepted but wake nobody
    /// (the readers' own safety-net polls still run). Called when the cluster is closed.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let watchers: Vec<Arc<TopicActivity>> = lock(&self.topics)
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

/// The watcher of `params`' topic on `source`, created if no reader holds one yet.
pub(crate) fn watch(source: &Arc<Cluster>, params: WatchParams) -> Arc<TopicActivity> {
    let registry = source.activity();
    let key = (
        params.flow.clone(),
        params.stream.clone(),
        params.topic.clone(),
    );
    let mut topics = lock(&registry.topics);
    if let Some(existing) = topics.get(&key).and_then(Weak::upgrade) {
        return existing;
    }
    topics.retain(|_, w| w.strong_count() > 0);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&params.stream, &params.topic).hash(&mut hasher);
    let span = tracing::info_span!(
        parent: None,
        "activity",
        cluster = %source.alias(),
        flow = %params.flow,
        stream = %params.stream,
        topic = %params.topic,
    );
    let watcher = Arc::new(TopicActivity {
        source: source.clone(),
        slot: hasher.finish() as usize,
        ids: params.ids,
        flow: params.flow,
        interval: params.interval,
        observer: params.observer,
        degraded: AtomicBool::new(false),
        span,
        state: Mutex::new(WatchState::default()),
    });
    topics.insert(key, Arc::downgrade(&watcher));
    watcher
}

/// The watcher of one topic: its subscribers and the task that wakes them.
pub(crate) struct TopicActivity {
    /// The source cluster.
    source: Arc<Cluster>,
    /// Connection slot of the metadata requests (a hash of the topic, so that the watchers of
    /// different topics spread over the connections like the readers do).
    slot: usize,
    /// Named identifiers of the upstream stream and topic.
    ids: (Identifier, Identifier),
    /// Flow name, for the error counts.
    flow: String,
    /// Pause between two metadata requests.
    interval: Duration,
    /// Receives the kinds of failed metadata requests.
    observer: Observer,
    /// Set while the metadata requests fail: subscribers then poll every interval on their
    /// own (the per-partition polling of before), cleared by the next successful request.
    degraded: AtomicBool,
    /// The task's span: cluster, flow, stream, topic.
    span: tracing::Span,
    /// Subscribers and task. A std mutex: it is held for a few map operations, never across an
    /// await, and readers subscribe from inside their (synchronous) decision paths.
    state: Mutex<WatchState>,
}

/// Mutable part of a [`TopicActivity`].
#[derive(Default)]
struct WatchState {
    /// Idle readers waiting for their partition to grow, by ticket.
    waiters: HashMap<u64, Waiter>,
    /// Source of tickets.
    next_ticket: u64,
    /// Whether the task runs (it clears this itself, under the lock, when it finds no waiter).
    running: bool,
    /// The task, aborted by `ActivityRegistry::close`; replaced when a new one starts after the
    /// previous one ended by itself.
    task: Option<JoinHandle<()>>,
    /// Id and creation time of the topic as first listed; another one means it was recreated.
    identity: Option<TopicIdentity>,
}

/// One idle reader.
struct Waiter {
    /// Its partition.
    partition: u32,
    /// The next offset it would poll.
    next: Offset,
    /// Where the wake-up goes (one at most: a woken waiter is removed).
    wake: oneshot::Sender<()>,
}

/// One idle reader's subscription: [`Subscription::woken`] completes once the watcher saw a
/// message the reader has not read. Dropping it withdraws it (a reader that polls for another
/// reason, or stops), a no-op once it was woken.
pub(crate) struct Subscription {
    watcher: Arc<TopicActivity>,
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
        lock(&self.watcher.state).waiters.remove(&self.ticket);
    }
}

impl TopicActivity {
    /// Whether metadata requests are failing (the reader then polls every interval itself).
    pub(crate) fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Subscribes an idle reader: woken once `partition` holds a message at or after `next`.
    /// Starts the watcher's task if it does not run.
    pub(crate) fn subscribe(self: &Arc<Self>, partition: u32, next: Offset) -> Subscription {
        let (wake, woken) = oneshot::channel();
        let mut state = lock(&self.state);
        let ticket = state.next_ticket;
        state.next_ticket = ticket.wrapping_add(1);
        state.waiters.insert(
            ticket,
            Waiter {
                partition,
                next,
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
        Subscription {
            watcher: self.clone(),
            ticket,
            woken,
        }
    }

    /// Whether any subscriber is left (a reader that stops, also an aborted one, withdraws its
    /// subscription as it drops it); if not, the task is about to end, so it is marked as not
    /// running under the same lock a new subscriber takes.
    fn keep_running(&self) -> bool {
        let mut state = lock(&self.state);
        if state.waiters.is_empty() {
            state.running = false;
            return false;
        }
        true
    }

    /// Fetches the topic's metadata. A failure is counted, logged once per failure streak, and
    /// turns on the degraded mode.
    async fn fetch(&self) -> Option<Listing> {
        let (stream, topic) = self.ids.clone();
        let result = self
            .source
            .call(self.slot, "get_topic", |c| async move {
                c.get_topic(&stream, &topic).await
            })
            .await;
        match result {
            Ok(details) => {
                if self.degraded.swap(false, Ordering::Relaxed) {
                    tracing::info!("topic metadata available again");
                }
                // A missing topic is no failure of ours: the woken readers will find out.
                details.as_ref().map(Listing::of)
            }
            Err(err) => {
                self.observer.0.error(&self.flow, err.kind());
                if !self.degraded.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %err,
                        "topic metadata unavailable; idle partitions are polled one by one"
                    );
                }
                None
            }
        }
    }

    /// Wakes (and unsubscribes) the subscribers `listing` says have something to read.
    fn wake(&self, listing: Option<Listing>) {
        let woken: Vec<oneshot::Sender<()>> = {
            let mut state = lock(&self.state);
            let view = TopicView::new(state.identity, listing);
            if let TopicView::Listed { identity, .. } | TopicView::Replaced { identity } = &view {
                state.identity = Some(*identity);
            }
            let (due, waiting): (HashMap<u64, Waiter>, _) = std::mem::take(&mut state.waiters)
                .into_iter()
                .partition(|(_, w)| should_wake(&view, w.partition, w.next));
            state.waiters = waiting;
            due.into_values().map(|w| w.wake).collect()
        };
        if !woken.is_empty() {
            tracing::debug!(readers = woken.len(), "waking idle readers");
        }
        for wake in woken {
            // A reader that stopped meanwhile has nothing to wake.
            let _ = wake.send(());
        }
    }
}

/// The watcher's loop: one metadata request per interval while anybody waits. The first request
/// comes one interval after the start: the subscriber that started it has just polled.
async fn run(watcher: Arc<TopicActivity>) {
    let start = tokio::time::Instant::now() + watcher.interval;
    let mut tick = tokio::time::interval_at(start, watcher.interval);
    // After a slow request, wait a whole interval again rather than catching up in a burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !watcher.keep_running() {
            tracing::debug!("no idle reader left; watcher stops");
            return;
        }
        let listing = watcher.fetch().await;
        watcher.wake(listing);
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

    /// A watcher whose task never starts (its registry is closed): tests call `wake`.
    fn watcher() -> Arc<TopicActivity> {
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
            topic: "t".into(),
            ids: (
                Identifier::named("s").expect("valid"),
                Identifier::named("t").expect("valid"),
            ),
            interval: Duration::from_millis(100),
            observer: Observer::default(),
        };
        watch(&cluster, params)
    }

    fn waiters(watcher: &TopicActivity) -> usize {
        lock(&watcher.state).waiters.len()
    }

    #[tokio::test]
    async fn a_woken_subscriber_is_removed_and_a_dropped_one_withdrawn() {
        let watcher = watcher();
        let mut due = watcher.subscribe(0, 5);
        let stopped = watcher.subscribe(1, 5);
        let idle = watcher.subscribe(2, 5);
        check!(waiters(&watcher) == 3);
        // A reader that stops (or is aborted) drops its subscription.
        drop(stopped);
        check!(waiters(&watcher) == 2);
        let listing = Listing {
            identity: TOPIC,
            partitions: vec![(0, mark(5, 6)), (1, mark(9, 10)), (2, mark(4, 5))],
        };
        watcher.wake(Some(listing));
        let woken = tokio::time::timeout(Duration::from_secs(5), due.woken()).await;
        check!(woken.is_ok());
        // Partition 2 has nothing from offset 5 on: still waiting.
        check!(waiters(&watcher) == 1);
        check!(watcher.keep_running());
        drop(idle);
        check!(!watcher.keep_running());
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
