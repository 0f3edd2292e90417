//! Whether a cluster is far from this instance, told from the round trips of its calls.
//!
//! Why it matters: the SDK runs one request at a time per connection, so a connection carries at
//! most one batch per round trip. On loopback a few connections keep up with any number of
//! partitions; 80 ms away, four connections shared by sixteen partitions held a catch-up to a
//! third of its loopback rate, where sixteen reached four fifths (BENCHMARKS.md section 28). A
//! far cluster therefore gets `far_connections` instead of `connections`.
//!
//! The signal is the shortest call of a window of eight calls: a far cluster's calls all take at least
//! the round trip, while on loopback even a busy machine answers some call of a window quickly.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

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
}

impl Default for Distance {
    fn default() -> Self {
        Self {
            window_min: AtomicU64::new(u64::MAX),
            window_calls: AtomicU32::new(0),
            far: AtomicBool::new(false),
        }
    }
}

impl Distance {
    /// Counts a call that took `round_trip` (answered, not failed: a timeout says nothing of
    /// the distance).
    pub(crate) fn observe(&self, round_trip: Duration) {
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
            distance.observe(round_trips(call));
        }
    }

    #[test]
    fn a_window_of_long_calls_is_far_and_one_short_call_makes_it_near() {
        let distance = Distance::default();
        check!(!distance.far());
        // Until a window is complete, nothing changes.
        for _ in 0..WINDOW_CALLS - 1 {
            distance.observe(Duration::from_millis(80));
        }
        check!(!distance.far());
        distance.observe(Duration::from_millis(80));
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
}
