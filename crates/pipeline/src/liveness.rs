//! Whether the coordinator still handles its mailbox. A watchdog task sends it a heartbeat
//! every [`HEARTBEAT_INTERVAL`]; the coordinator marks each one answered when it handles it.
//! A heartbeat left unanswered for long means the coordinator (or the runtime under it) is
//! wedged: the admin API's `/health` then fails, so that a supervisor restarts the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the watchdog sends a heartbeat.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);

/// Heartbeats sent to and answered by the coordinator, in milliseconds since `base`.
#[derive(Debug)]
pub struct Liveness {
    base: Instant,
    /// When the oldest heartbeat not yet answered was sent (`u64::MAX`: none outstanding).
    outstanding_since: AtomicU64,
    /// Heartbeats sent since start (a watchdog that stopped sending is seen by this).
    sent: AtomicU64,
}

impl Liveness {
    pub(crate) fn new() -> Self {
        Self {
            base: Instant::now(),
            outstanding_since: AtomicU64::new(u64::MAX),
            sent: AtomicU64::new(0),
        }
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// A heartbeat is sent at `now` (the oldest unanswered one keeps counting).
    pub(crate) fn sent(&self, now: Instant) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let _ = self.outstanding_since.compare_exchange(
            u64::MAX,
            self.millis(now),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The coordinator handled a heartbeat: nothing is outstanding any more.
    pub(crate) fn answered(&self) {
        self.outstanding_since.store(u64::MAX, Ordering::Release);
    }

    /// Heartbeats the watchdog sent since the pipeline started.
    #[must_use]
    pub fn heartbeats_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// How long a heartbeat has waited at `now`, when that is longer than `threshold`.
    #[must_use]
    pub fn wedged_for(&self, now: Instant, threshold: Duration) -> Option<Duration> {
        let since = self.outstanding_since.load(Ordering::Acquire);
        if since == u64::MAX {
            return None;
        }
        let waited = Duration::from_millis(self.millis(now).saturating_sub(since));
        (waited > threshold).then_some(waited)
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    const THRESHOLD: Duration = Duration::from_secs(30);

    #[test]
    fn an_answered_heartbeat_is_healthy_and_an_old_unanswered_one_is_not() {
        let l = Liveness::new();
        let t0 = l.base;
        check!(l.wedged_for(t0 + Duration::from_secs(100), THRESHOLD) == None);
        l.sent(t0 + Duration::from_secs(1));
        check!(l.wedged_for(t0 + Duration::from_secs(30), THRESHOLD) == None);
        // Later heartbeats do not reset the clock of the oldest unanswered one.
        l.sent(t0 + Duration::from_secs(20));
        check!(
            l.wedged_for(t0 + Duration::from_secs(32), THRESHOLD) == Some(Duration::from_secs(31))
        );
        l.answered();
        check!(l.wedged_for(t0 + Duration::from_secs(40), THRESHOLD) == None);
    }
}
