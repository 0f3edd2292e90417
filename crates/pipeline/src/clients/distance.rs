//! Whether a cluster is far from this instance, told from the round trips of its calls.
//!
//! Why it matters: the SDK runs one request at a time per connection, so a connection carries at
//! most one batch per round trip. On loopback a few connections keep up with any number of
//! partitions; 80 ms away, four connections shared by sixteen partitions held a catch-up to a
//! third of its loopback rate, where sixteen reached four fifths (BENCHMARKS.md section 28). A
//! far cluster therefore gets `far_connections` instead of `connections`.
//!
//! The signal is the shortest call of a window of eight calls: a far cluster's calls all take at
//! least the round trip, while on loopback even a busy machine answers some call of a window
//! quickly. Only calls that say something of the path count ([`Distance::observe`]): a call
//! that carries a batch also takes the server's work on it, which on a busy server near by
//! lasts longer than a round trip across regions (a near target's 4 MiB sends took 30 to 55
//! ms, BENCHMARKS.md section 39). Such a call counts only when it was quick (then the cluster
//! is near, whatever it carried); when it was slow, the cluster asks its connection's
//! heartbeat for a PING ahead of time, whose round trip is the path's alone.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A round trip at least this long counts as distance: connections go up to
/// `far_connections`, and a partition behind grows its batches (`datapath::batch_size`).
/// Loopback calls take well under a millisecond idle and a few under load (BENCHMARKS.md
/// section 25); regions are 20 ms and more apart.
pub(crate) const FAR_ROUND_TRIP: Duration = Duration::from_millis(10);

/// Calls per window: the verdict follows the shortest call of each window this long. Short,
/// so that a partition copied across a distance is not copied with the near settings for long
/// (one partition 200 ms away makes four calls a second): a loopback server answers some call
/// of eight quickly however busy it is (a saturated real 0.8 server answered polls in 1.3 ms on
/// average, BENCHMARKS.md section 25).
const WINDOW_CALLS: u32 = 8;

/// The most a call may carry, request and answer together, and still count as light: its
/// round trip is then the path's and the server's bookkeeping, not the server's work on a
/// batch. A partition's catch-up poll of 1,000 messages of 256 B is four times this; a poll
/// of a partition that keeps up at 1,000 messages a second, a ping, a metadata or offset read
/// are well under it.
pub(crate) const LIGHT_CALL_BYTES: u64 = 64 << 10;

/// Least time between two probes asked for ([`Distance::observe`]) while the cluster counts as
/// near. A near cluster busy with big batches answers slowly call after call: its probes cost
/// it at most 50 PINGs a second (a PING is the cheapest request a server answers), not one per
/// batch. Across a distance the probes overlap, on connections that are free: the first
/// verdict comes about a round trip after eight intervals (a far source's catch-up runs with
/// the near settings until then).
const PROBE_INTERVAL_NEAR: Duration = Duration::from_millis(20);

/// Least time between two probes while the cluster counts as far: there slow batches are what
/// the verdict expects, and the probes only undo a wrong one (a near server that answered
/// slowly for a whole window, say while it checked a burst of logins' passwords) within about
/// two seconds, for a few PINGs a second.
const PROBE_INTERVAL_FAR: Duration = Duration::from_millis(250);

/// The shortest round trip of a window, folded in call by call; `far` is the verdict of the
/// latest complete window. Shared by every task calling the cluster: the fields are atomics,
/// and a window two callers close at once just starts over, which only delays a verdict.
#[derive(Debug)]
pub(crate) struct Distance {
    /// The shortest call of the current window, in µs.
    window_min: AtomicU64,
    /// Calls counted in the current window.
    window_calls: AtomicU32,
    /// Whether the latest complete window's shortest call took [`FAR_ROUND_TRIP`] or more.
    far: AtomicBool,
    /// When the latest probe was asked for, in µs since `created` (0: never).
    probe_asked: AtomicU64,
    created: Instant,
}

impl Default for Distance {
    fn default() -> Self {
        Self {
            window_min: AtomicU64::new(u64::MAX),
            window_calls: AtomicU32::new(0),
            far: AtomicBool::new(false),
            probe_asked: AtomicU64::new(0),
            created: Instant::now(),
        }
    }
}

/// What the caller of [`Distance::observe`] does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Next {
    /// Nothing.
    Nothing,
    /// Asks for a light call soon (a PING on a connection of the cluster): the call observed
    /// said nothing of the path, and the cluster, near by the verdict so far, may be far.
    Probe,
}

impl Distance {
    /// Counts a call that took `round_trip` and carried `carried()` bytes (request and answer;
    /// answered, not failed: a timeout says nothing of the distance). `carried` is asked only of
    /// a call slower than [`FAR_ROUND_TRIP`]: on loopback a poll's answer is never summed. A
    /// heavy call (over
    /// [`LIGHT_CALL_BYTES`]) counts only when it was quicker than [`FAR_ROUND_TRIP`]; a slow
    /// one asks for a probe instead, at most once per [`PROBE_INTERVAL_NEAR`] or
    /// [`PROBE_INTERVAL_FAR`] as the cluster counts now.
    pub(crate) fn observe(&self, round_trip: Duration, carried: impl FnOnce() -> u64) -> Next {
        let now = u64::try_from(self.created.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.observe_at(round_trip, carried, now)
    }

    /// [`Distance::observe`] at `now`, in µs since `created`.
    fn observe_at(&self, round_trip: Duration, carried: impl FnOnce() -> u64, now: u64) -> Next {
        if round_trip >= FAR_ROUND_TRIP && carried() > LIGHT_CALL_BYTES {
            let interval = if self.far() {
                PROBE_INTERVAL_FAR
            } else {
                PROBE_INTERVAL_NEAR
            };
            return if self.probe_due_at(now, interval) {
                Next::Probe
            } else {
                Next::Nothing
            };
        }
        self.count(round_trip);
        Next::Nothing
    }

    /// Folds a call that counts into the window, closing it at [`WINDOW_CALLS`].
    fn count(&self, round_trip: Duration) {
        let micros = u64::try_from(round_trip.as_micros()).unwrap_or(u64::MAX);
        self.window_min.fetch_min(micros, Ordering::Relaxed);
        if self.window_calls.fetch_add(1, Ordering::Relaxed) + 1 < WINDOW_CALLS {
            return;
        }
        let shortest = self.window_min.swap(u64::MAX, Ordering::Relaxed);
        self.window_calls.store(0, Ordering::Relaxed);
        let far = Duration::from_micros(shortest) >= FAR_ROUND_TRIP;
        if self.far.swap(far, Ordering::Relaxed) != far {
            tracing::info!(
                shortest_ms = shortest as f64 / 1000.0,
                far,
                "cluster round trips changed; connections follow"
            );
        }
    }

    /// Whether a probe may be asked for at `now` (µs since `created`), the latest having been
    /// asked for `interval` ago or more (then it is taken as asked).
    fn probe_due_at(&self, now: u64, interval: Duration) -> bool {
        // Never 0, which means "never asked".
        let now = now.max(1);
        let last = self.probe_asked.load(Ordering::Relaxed);
        let interval = u64::try_from(interval.as_micros()).unwrap_or(u64::MAX);
        (last == 0 || now.saturating_sub(last) >= interval)
            && self
                .probe_asked
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Whether the cluster counts as far now.
    pub(crate) fn far(&self) -> bool {
        self.far.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    fn window(distance: &Distance, round_trips: impl Fn(u32) -> Duration) {
        for call in 0..WINDOW_CALLS {
            check!(distance.observe(round_trips(call), || 0) == Next::Nothing);
        }
    }

    #[test]
    fn a_window_of_long_calls_is_far_and_one_short_call_makes_it_near() {
        let distance = Distance::default();
        check!(!distance.far());
        // Until a window is complete, nothing changes.
        for _ in 0..WINDOW_CALLS - 1 {
            check!(distance.observe(Duration::from_millis(80), || 0) == Next::Nothing);
        }
        check!(!distance.far());
        check!(distance.observe(Duration::from_millis(80), || 0) == Next::Nothing);
        check!(distance.far());
        // Slow calls among fast ones (a big batch on loopback) do not make it far.
        window(&distance, |call| {
            Duration::from_millis(if call == 7 { 1 } else { 200 })
        });
        check!(!distance.far());
        // Exactly the threshold is far.
        window(&distance, |_| FAR_ROUND_TRIP);
        check!(distance.far());
        window(&distance, |_| FAR_ROUND_TRIP - Duration::from_micros(1));
        check!(!distance.far());
    }

    #[test]
    fn a_slow_heavy_call_asks_for_a_probe_and_a_quick_one_counts_as_near() {
        let heavy = LIGHT_CALL_BYTES + 1;
        let ms = |n: u64| n * 1000;
        let distance = Distance::default();
        // A near target busy with 4 MiB sends: slow heavy calls never make it far; the first
        // asks for a probe, the next ones within the interval do not.
        let slow = Duration::from_millis(40);
        check!(distance.observe_at(slow, || heavy, ms(1)) == Next::Probe);
        for _ in 0..WINDOW_CALLS * 2 {
            check!(distance.observe_at(slow, || heavy, ms(20)) == Next::Nothing);
        }
        check!(!distance.far());
        check!(distance.observe_at(slow, || heavy, ms(21)) == Next::Probe);
        // The probes' answers (light calls) decide: far.
        window(&distance, |_| Duration::from_millis(80));
        check!(distance.far());
        // Far: slow heavy calls change nothing, and ask for probes far less often.
        let slower = Duration::from_millis(200);
        check!(distance.observe_at(slower, || heavy, ms(100)) == Next::Nothing);
        check!(distance.observe_at(slower, || heavy, ms(271)) == Next::Probe);
        check!(distance.observe_at(slower, || heavy, ms(300)) == Next::Nothing);
        check!(distance.far());
        // Heavy calls that were quick count: near again.
        for _ in 0..WINDOW_CALLS {
            let quick = Duration::from_millis(3);
            check!(distance.observe_at(quick, || heavy, ms(400)) == Next::Nothing);
        }
        check!(!distance.far());
        // Exactly the limit is still light.
        window(&distance, |_| Duration::from_millis(80));
        check!(distance.far());
        for _ in 0..WINDOW_CALLS {
            let quick = Duration::from_millis(2);
            check!(distance.observe_at(quick, || LIGHT_CALL_BYTES, ms(500)) == Next::Nothing);
        }
        check!(!distance.far());
    }

    #[test]
    fn probes_are_asked_for_at_most_once_an_interval() {
        let distance = Distance::default();
        let interval = PROBE_INTERVAL_NEAR;
        let micros = u64::try_from(interval.as_micros()).unwrap();
        check!(distance.probe_due_at(0, interval));
        check!(!distance.probe_due_at(micros - 1, interval));
        check!(distance.probe_due_at(micros + 1, interval));
        check!(!distance.probe_due_at(micros + 2, interval));
        check!(distance.probe_due_at(3 * micros, interval));
    }
}
