//! Per-unit runtime statistics, written by a unit's reader and writer and read by the admin API.
//!
//! These are meters, not state the pipeline decides on: unit tasks publish them with atomics (and
//! two small bounded rings) so that reading them never waits for a task busy with a batch, and the
//! coordinator registers each unit's meters in a [`MeterRegistry`] that readers of statistics
//! (the admin API, `Pipeline::stats`) read directly, never through the coordinator's mailbox.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use replicator_model::{Epoch, Offset, WorkUnit};

/// How many latency samples a unit keeps: enough for a p99 over the recent batches, few enough
/// that 30,000 busy units on an instance hold 30 MiB of them (at 16 bytes each, 1,024 samples
/// made it 500 MiB).
const LATENCY_SAMPLES: usize = 256;
/// How many gap events a unit keeps.
const GAP_EVENTS: usize = 64;
/// Marker for "no offset yet" in the atomics.
const NONE: u64 = u64::MAX;

/// Offsets removed by retention before they were copied (inclusive range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// First lost offset.
    pub from: Offset,
    /// Last lost offset.
    pub to: Offset,
}

impl Gap {
    /// Number of lost offsets.
    pub fn len(&self) -> u64 {
        self.to - self.from + 1
    }

    /// Always `false`: a gap holds at least one offset.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Receives data-path measurements as they happen, so that the binary can feed a metrics
/// system (Prometheus) without the pipeline knowing it. Every method defaults to doing nothing;
/// implementations must be cheap (they run on the data path).
pub trait PipelineObserver: Send + Sync + 'static {
    /// An upstream poll of `flow` finished (whatever its result) after `elapsed`.
    fn polled(&self, flow: &str, elapsed: Duration) {
        let _ = (flow, elapsed);
    }
    /// A downstream send of `flow` finished (whatever its result) after `elapsed`.
    fn sent(&self, flow: &str, elapsed: Duration) {
        let _ = (flow, elapsed);
    }
    /// A batch of `flow` was acknowledged downstream `latency` after its newest message was
    /// appended upstream.
    fn replicated(&self, flow: &str, latency: Duration) {
        let _ = (flow, latency);
    }
    /// A reader or writer of `flow` hit an error of `kind` (see `Error::kind`) and retries.
    fn error(&self, flow: &str, kind: &'static str) {
        let _ = (flow, kind);
    }
}

/// The observer that ignores everything (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl PipelineObserver for NoObserver {}

/// A shared observer handle, as `PipelineParams` holds it.
#[derive(Clone)]
pub struct Observer(pub std::sync::Arc<dyn PipelineObserver>);

impl Default for Observer {
    fn default() -> Self {
        Self(std::sync::Arc::new(NoObserver))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// Live meters of one unit (shared by its reader, writer and the coordinator).
#[derive(Debug)]
pub(crate) struct UnitMeters {
    /// The unit's flow, for the observer.
    flow: String,
    /// Where measurements are forwarded as they happen.
    observer: Observer,
    /// Last upstream offset written downstream.
    last_written: AtomicU64,
    /// Upstream partition's next offset as last seen by the reader.
    upstream_end: AtomicU64,
    /// Messages written downstream by this instance.
    messages: AtomicU64,
    /// Message bytes written downstream by this instance.
    bytes: AtomicU64,
    /// Messages skipped because they originated in the target cluster.
    skipped_loop: AtomicU64,
    /// Pair restarts after failures.
    restarts: AtomicU64,
    /// Gap events.
    gaps: AtomicU64,
    /// Integrity events (see the fields of the same names in [`UnitStats`]).
    upstream_resets: AtomicU64,
    downstream_losses: AtomicU64,
    messages_recopied: AtomicU64,
    tail_scans_exhausted: AtomicU64,
    /// Epoch of the running pair.
    epoch: AtomicU64,
    /// Messages the reader asks for in its next poll (`datapath::batch_size`; 0 before the
    /// first poll).
    batch_size: AtomicU32,
    /// Whether the connections of the latest downstream send counted the target as far
    /// (`clients::distance`): the reader's batch size grows for a far target too.
    target_far: AtomicBool,
    /// Recent gap events.
    gap_events: Mutex<VecDeque<Gap>>,
    /// Recent replication latencies (downstream ack time − upstream append time).
    latencies: Mutex<LatencyRing>,
    /// Window for the message rate: (time, messages at that time, last computed rate).
    rate: Mutex<(Instant, u64, f64)>,
}

impl UnitMeters {
    /// Fresh meters of a unit of `flow`, forwarding to `observer`.
    pub(crate) fn new(flow: &str, observer: Observer) -> Self {
        Self {
            flow: flow.to_owned(),
            observer,
            last_written: AtomicU64::new(NONE),
            upstream_end: AtomicU64::new(NONE),
            messages: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            skipped_loop: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            upstream_resets: AtomicU64::new(0),
            downstream_losses: AtomicU64::new(0),
            messages_recopied: AtomicU64::new(0),
            tail_scans_exhausted: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            batch_size: AtomicU32::new(0),
            target_far: AtomicBool::new(false),
            gap_events: Mutex::new(VecDeque::new()),
            latencies: Mutex::new(LatencyRing::default()),
            rate: Mutex::new((Instant::now(), 0, 0.0)),
        }
    }

    /// Records a successful downstream write.
    pub(crate) fn written(&self, last_offset: Offset, messages: u64, bytes: u64) {
        self.last_written.store(last_offset, Ordering::Relaxed);
        self.messages.fetch_add(messages, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records that every upstream message up to `last_offset` is handled, also when the
    /// newest ones were skipped (loop prevention) rather than written: lag counts from here, so
    /// a partition whose new messages all came from the target does not look behind.
    pub(crate) fn handled_through(&self, last_offset: Offset) {
        let current = self.last_written.load(Ordering::Relaxed);
        if current == NONE || current < last_offset {
            self.last_written.store(last_offset, Ordering::Relaxed);
        }
    }

    /// Records where the writer resumed: the offset before the first one it copies.
    pub(crate) fn resumed_after(&self, last: Option<Offset>) {
        self.last_written
            .store(last.unwrap_or(NONE), Ordering::Relaxed);
    }

    /// Records the upstream partition's next offset.
    pub(crate) fn upstream_end(&self, next_offset: Offset) {
        self.upstream_end.store(next_offset, Ordering::Relaxed);
    }

    /// Records messages skipped by loop prevention.
    pub(crate) fn skipped(&self, n: u64) {
        self.skipped_loop.fetch_add(n, Ordering::Relaxed);
    }

    /// Records whether the target counted as far at the latest send.
    pub(crate) fn set_target_far(&self, far: bool) {
        self.target_far.store(far, Ordering::Relaxed);
    }

    /// Whether the target counted as far at the latest send (false before the first).
    pub(crate) fn target_far(&self) -> bool {
        self.target_far.load(Ordering::Relaxed)
    }

    /// Records the messages the reader asks for in its next poll.
    pub(crate) fn set_batch_size(&self, messages: u32) {
        self.batch_size.store(messages, Ordering::Relaxed);
    }

    /// Records a pair restart.
    pub(crate) fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the epoch of a newly started pair.
    pub(crate) fn set_epoch(&self, epoch: Epoch) {
        self.epoch.store(epoch.0, Ordering::Relaxed);
    }

    /// Records a gap event.
    pub(crate) fn gap(&self, gap: Gap) {
        self.gaps.fetch_add(1, Ordering::Relaxed);
        let mut ring = lock(&self.gap_events);
        if ring.len() == GAP_EVENTS {
            ring.pop_front();
        }
        ring.push_back(gap);
    }

    /// Records that the unit's upstream partition started a new history (topic recreated, or
    /// partition reset).
    pub(crate) fn upstream_reset(&self) {
        self.upstream_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that the target lost confirmed messages of the unit.
    pub(crate) fn downstream_loss(&self) {
        self.downstream_losses.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `n` confirmed messages the target had lost, written again.
    pub(crate) fn recopied(&self, n: u64) {
        self.messages_recopied.fetch_add(n, Ordering::Relaxed);
    }

    /// Records a tail scan that reached its bound without finding a message of the unit.
    pub(crate) fn tail_scan_exhausted(&self) {
        self.tail_scans_exhausted.fetch_add(1, Ordering::Relaxed);
    }

    /// Records how long an upstream poll took.
    pub(crate) fn polled(&self, elapsed: Duration) {
        self.observer.0.polled(&self.flow, elapsed);
    }

    /// Records how long a downstream send took.
    pub(crate) fn sent(&self, elapsed: Duration) {
        self.observer.0.sent(&self.flow, elapsed);
    }

    /// Records an error that is being retried.
    pub(crate) fn error(&self, kind: &'static str) {
        self.observer.0.error(&self.flow, kind);
    }

    /// Records one replication latency sample.
    pub(crate) fn latency(&self, sample: Duration) {
        self.observer.0.replicated(&self.flow, sample);
        lock(&self.latencies).push(sample);
    }

    /// A snapshot at `now` (updates the rate window when a second or more has passed).
    pub(crate) fn snapshot(&self, unit: &WorkUnit, now: Instant) -> UnitStats {
        let messages = self.messages.load(Ordering::Relaxed);
        let rate = {
            let mut w = lock(&self.rate);
            let elapsed = now.saturating_duration_since(w.0);
            if elapsed >= Duration::from_secs(1) {
                w.2 = (messages - w.1) as f64 / elapsed.as_secs_f64();
                *w = (now, messages, w.2);
            }
            w.2
        };
        let opt = |v: u64| (v != NONE).then_some(v);
        let last_written = opt(self.last_written.load(Ordering::Relaxed));
        let upstream_end = opt(self.upstream_end.load(Ordering::Relaxed));
        let lag = upstream_end.map(|end| end.saturating_sub(last_written.map_or(0, |l| l + 1)));
        UnitStats {
            unit: unit.clone(),
            epoch: Epoch(self.epoch.load(Ordering::Relaxed)),
            last_written,
            upstream_end,
            lag,
            messages,
            bytes: self.bytes.load(Ordering::Relaxed),
            messages_per_second: rate,
            skipped_loop: self.skipped_loop.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            gaps: self.gaps.load(Ordering::Relaxed),
            recent_gaps: lock(&self.gap_events).iter().copied().collect(),
            upstream_resets: self.upstream_resets.load(Ordering::Relaxed),
            downstream_losses: self.downstream_losses.load(Ordering::Relaxed),
            messages_recopied: self.messages_recopied.load(Ordering::Relaxed),
            tail_scans_exhausted: self.tail_scans_exhausted.load(Ordering::Relaxed),
            batch_size: self.batch_size.load(Ordering::Relaxed),
            latency: lock(&self.latencies).quantiles(),
        }
    }
}

/// The meters of every unit this instance has worked on since it started (kept after a unit
/// stops so that its statistics stay readable). Cheap to clone; clones share the map.
///
/// The coordinator is the only writer (it registers a unit when it first starts its pair); the
/// lock is held only to look up or insert an `Arc`, never while a meter is read.
#[derive(Debug, Clone, Default)]
pub(crate) struct MeterRegistry {
    /// Meters by unit.
    units: Arc<RwLock<BTreeMap<WorkUnit, Arc<UnitMeters>>>>,
}

impl MeterRegistry {
    /// The meters of `unit`, registered with `make` if the unit has none yet.
    pub(crate) fn get_or_insert(
        &self,
        unit: &WorkUnit,
        make: impl FnOnce() -> UnitMeters,
    ) -> Arc<UnitMeters> {
        if let Some(meters) = self.get(unit) {
            return meters;
        }
        let mut units = self
            .units
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        units
            .entry(unit.clone())
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }

    /// Messages of `flow` written downstream by this node since it started (all its units).
    pub(crate) fn flow_messages(&self, flow: &str) -> u64 {
        self.read()
            .iter()
            .filter(|(unit, _)| unit.flow == flow)
            .map(|(_, meters)| meters.messages.load(Ordering::Relaxed))
            .sum()
    }

    /// The meters of `unit`, if it was ever started.
    pub(crate) fn get(&self, unit: &WorkUnit) -> Option<Arc<UnitMeters>> {
        self.read().get(unit).cloned()
    }

    /// A snapshot of every unit's meters at `now`, in unit order.
    pub(crate) fn snapshot(&self, now: Instant) -> Vec<UnitStats> {
        // Clone the handles first: the map lock is not held while the meters' own locks are.
        let units: Vec<(WorkUnit, Arc<UnitMeters>)> = self
            .read()
            .iter()
            .map(|(unit, meters)| (unit.clone(), meters.clone()))
            .collect();
        units
            .iter()
            .map(|(unit, meters)| meters.snapshot(unit, now))
            .collect()
    }

    /// Read access; a poisoned lock is taken over (the map is valid after any single insert).
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<WorkUnit, Arc<UnitMeters>>> {
        self.units
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Locks a meter ring; a poisoned lock is taken over (a ring is valid after any single push).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runtime statistics of one unit on this instance.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitStats {
    /// The unit.
    pub unit: WorkUnit,
    /// Epoch of the current (or last) pair on this instance.
    pub epoch: Epoch,
    /// Last upstream offset written downstream (`None` before the first write or resume).
    pub last_written: Option<Offset>,
    /// Next offset of the upstream partition as last seen by the reader.
    pub upstream_end: Option<Offset>,
    /// Messages upstream not yet written downstream.
    pub lag: Option<u64>,
    /// Messages written by this instance since it started the unit.
    pub messages: u64,
    /// Message bytes (64-byte header + payload + user headers) written.
    pub bytes: u64,
    /// Messages per second over the last window of at least a second.
    pub messages_per_second: f64,
    /// Messages not copied because they originated in the target cluster.
    pub skipped_loop: u64,
    /// Restarts of the unit's reader/writer pair after failures.
    pub restarts: u64,
    /// Gap events (upstream retention removed messages before they were copied).
    pub gaps: u64,
    /// The most recent gap events (up to 64).
    pub recent_gaps: Vec<Gap>,
    /// Times the upstream partition started a new history while the unit copied it: the topic
    /// was deleted and recreated, or the partition was reset (purged); the new history is
    /// copied from its start under a new provenance label.
    pub upstream_resets: u64,
    /// Times a writer found that the target lost messages it had acknowledged and the control
    /// plane confirmed (the last message of the unit downstream is below the confirmed offset,
    /// or the downstream partition is empty).
    pub downstream_losses: u64,
    /// Messages written again after such a loss (those upstream retention removed meanwhile
    /// are gap events instead).
    pub messages_recopied: u64,
    /// Tail scans that read `tail_scan_window` messages without finding one of the unit (only
    /// when nothing is confirmed for the topic yet; with a confirmed offset the scan has no
    /// bound): writes of an earlier owner further back that were never confirmed are copied
    /// again.
    pub tail_scans_exhausted: u64,
    /// Messages the unit's reader asks for in its next poll: `batch_size`, or more while the
    /// partition is behind a distant source or target (`datapath::batch_size`); 0 before the
    /// first poll.
    pub batch_size: u32,
    /// Median and 99th percentile of the recent replication latencies: downstream
    /// acknowledgement time minus upstream append time of a batch's last message, over the
    /// unit's last `LATENCY_SAMPLES` batches; `None` before its first batch.
    pub latency: Option<LatencyQuantiles>,
}

/// The median and 99th percentile of a unit's recent replication latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyQuantiles {
    /// The median.
    pub p50: Duration,
    /// The 99th percentile (nearest rank).
    pub p99: Duration,
}

/// A unit's recent replication latencies in whole microseconds (saturating at about 71
/// minutes), overwriting the oldest once full. An idle unit holds no buffer; a busy one
/// `LATENCY_SAMPLES` × 4 bytes, allocated once.
#[derive(Debug, Default)]
struct LatencyRing {
    samples: Vec<u32>,
    /// Where the next sample goes once the ring is full.
    next: usize,
}

impl LatencyRing {
    fn push(&mut self, sample: Duration) {
        let micros = u32::try_from(sample.as_micros()).unwrap_or(u32::MAX);
        if self.samples.len() < LATENCY_SAMPLES {
            if self.samples.is_empty() {
                self.samples.reserve_exact(LATENCY_SAMPLES);
            }
            self.samples.push(micros);
        } else {
            self.samples[self.next] = micros;
            self.next = (self.next + 1) % LATENCY_SAMPLES;
        }
    }

    /// The nearest-rank quantiles, selected on a copy on the stack (no sort, no allocation:
    /// `/status` asks this of every unit of the instance).
    fn quantiles(&self) -> Option<LatencyQuantiles> {
        let n = self.samples.len();
        if n == 0 {
            return None;
        }
        let mut copy = [0u32; LATENCY_SAMPLES];
        let values = &mut copy[..n];
        values.copy_from_slice(&self.samples);
        let rank = |q: f64| ((n - 1) as f64 * q).round() as usize;
        let (p50, p99) = (rank(0.5), rank(0.99));
        let (below, &mut high, _) = values.select_nth_unstable(p99);
        // Everything below the p99's place is no larger than it: the median is among them.
        let low = if p50 == p99 {
            high
        } else {
            *below.select_nth_unstable(p50).1
        };
        let micros = |v: u32| Duration::from_micros(u64::from(v));
        Some(LatencyQuantiles {
            p50: micros(low),
            p99: micros(high),
        })
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn skipped_messages_count_as_handled_for_lag() {
        let m = UnitMeters::new("f", Observer::default());
        let u = WorkUnit::new("f", "s", "t", 0);
        let now = Instant::now();
        m.upstream_end(10);
        m.written(4, 5, 50);
        check!(m.snapshot(&u, now).lag == Some(5));
        // Offsets 5..=9 came from the target (loop prevention): nothing written, nothing behind.
        m.handled_through(9);
        check!(m.snapshot(&u, now).lag == Some(0));
        // Never moves back.
        m.handled_through(3);
        check!(m.snapshot(&u, now).last_written == Some(9));
    }

    #[test]
    fn latency_quantiles_follow_the_most_recent_samples() {
        let mut ring = LatencyRing::default();
        check!(ring.quantiles().is_none());
        ring.push(Duration::from_millis(7));
        let seven = Duration::from_millis(7);
        check!(
            ring.quantiles()
                == Some(LatencyQuantiles {
                    p50: seven,
                    p99: seven
                })
        );
        // A slow spell, then a full ring of fast batches: only the fast ones count.
        for _ in 0..LATENCY_SAMPLES {
            ring.push(Duration::from_secs(3));
        }
        for i in 0..LATENCY_SAMPLES as u64 {
            ring.push(Duration::from_micros(100 + i % 10));
        }
        let q = ring.quantiles().unwrap();
        check!(q.p50 >= Duration::from_micros(100));
        check!(q.p99 == Duration::from_micros(109));
        check!(ring.samples.capacity() == LATENCY_SAMPLES);
        // Beyond u32 microseconds: saturates instead of wrapping (five of 256 samples reach
        // the p99's rank).
        for _ in 0..5 {
            ring.push(Duration::from_secs(1 << 40));
        }
        check!(ring.quantiles().unwrap().p99 == Duration::from_micros(u64::from(u32::MAX)));
    }

    #[test]
    fn snapshot_reports_lag_and_rings_stay_bounded() {
        let m = UnitMeters::new("f", Observer::default());
        let u = WorkUnit::new("f", "s", "t", 0);
        let t0 = Instant::now();
        check!(m.snapshot(&u, t0).lag.is_none());
        m.upstream_end(100);
        check!(m.snapshot(&u, t0).lag == Some(100));
        m.written(39, 40, 4000);
        check!(m.snapshot(&u, t0).lag == Some(60));
        for i in 0..2000 {
            m.latency(Duration::from_micros(i));
        }
        for i in 0..100 {
            m.gap(Gap { from: i, to: i });
        }
        let s = m.snapshot(&u, t0 + Duration::from_secs(2));
        // The ring keeps the last LATENCY_SAMPLES: 1744..2000 µs.
        check!(
            s.latency
                == Some(LatencyQuantiles {
                    p50: Duration::from_micros(1872),
                    p99: Duration::from_micros(1996),
                })
        );
        check!(s.recent_gaps.len() == GAP_EVENTS);
        check!(s.gaps == 100);
        let events = |s: &UnitStats| {
            (
                s.upstream_resets,
                s.downstream_losses,
                s.messages_recopied,
                s.tail_scans_exhausted,
            )
        };
        check!(events(&s) == (0, 0, 0, 0));
        m.upstream_reset();
        m.downstream_loss();
        m.recopied(7);
        m.recopied(3);
        m.tail_scan_exhausted();
        check!(events(&m.snapshot(&u, t0)) == (1, 1, 10, 1));
        check!(s.messages_per_second > 0.0);
    }

    #[test]
    fn registry_keeps_one_meter_per_unit_and_snapshots_in_unit_order() {
        let registry = MeterRegistry::default();
        let (a, b) = (
            WorkUnit::new("f", "s", "t", 0),
            WorkUnit::new("f", "s", "t", 1),
        );
        let first = registry.get_or_insert(&b, || UnitMeters::new("f", Observer::default()));
        first.written(4, 5, 50);
        // A second registration of the same unit keeps the meters (and their counts).
        let again = registry.get_or_insert(&b, || UnitMeters::new("f", Observer::default()));
        check!(Arc::ptr_eq(&first, &again));
        registry.get_or_insert(&a, || UnitMeters::new("f", Observer::default()));
        check!(registry.get(&a).is_some());
        let stats = registry.snapshot(Instant::now());
        let units: Vec<&WorkUnit> = stats.iter().map(|s| &s.unit).collect();
        check!(units == vec![&a, &b]);
        check!(stats[1].messages == 5);
        // A clone reads the same map.
        check!(registry.clone().snapshot(Instant::now()).len() == 2);
    }
}

/// Per-flow state shared between a flow's task and the readers of status and metrics: the
/// task updates its flow's entry, readers take a copy of all of them.
#[derive(Debug)]
pub(crate) struct FlowStates<S>(
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, S>>>,
);

impl<S> Clone for FlowStates<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S> Default for FlowStates<S> {
    fn default() -> Self {
        Self(std::sync::Arc::default())
    }
}

impl<S: Default + Clone> FlowStates<S> {
    /// Applies `change` to `flow`'s entry (a default one at first).
    pub(crate) fn update(&self, flow: &str, change: impl FnOnce(&mut S)) {
        let mut flows = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(flows.entry(flow.to_owned()).or_default());
    }

    /// Every flow's state, by flow name.
    pub(crate) fn snapshot(&self) -> std::collections::BTreeMap<String, S> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
