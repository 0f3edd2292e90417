//! Bounded exponential backoff with jitter: the pure arithmetic and a small stateful wrapper;
//! and the restart budget every supervisor of the tree counts restarts with.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::params::BackoffParams;

/// The delay after `current`: `initial` first (when `current` is zero), then doubling, never above
/// `max` (the cap applies before an overshoot, so 6 s with a 10 s cap gives 10 s, not 12 s).
pub fn next_backoff(current: Duration, params: &BackoffParams) -> Duration {
    if current.is_zero() {
        return params.initial.min(params.max);
    }
    current.saturating_mul(2).min(params.max)
}

/// Spreads `delay` over `[delay / 2, delay]` with `unit` in `[0, 1)`, so that many units failing
/// together do not retry in lock step. Never exceeds `delay`, so the cap still holds.
pub fn with_jitter(delay: Duration, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    delay.mul_f64(0.5 + 0.5 * unit)
}

/// Backoff state of one retry loop: the current delay, the start of the failure streak and an
/// injected RNG for the jitter.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// Bounds.
    params: BackoffParams,
    /// Delay used by the previous failure of this streak; zero when there is no streak.
    current: Duration,
    /// When the current failure streak began; `None` when the last attempt succeeded.
    streak_started: Option<Instant>,
    /// Jitter source, seeded by the owner (tests pass fixed seeds). A small generator: every
    /// unit holds a few backoffs, and `StdRng` is about 330 bytes against its 32.
    rng: SmallRng,
}

impl Backoff {
    /// A backoff with no failure streak.
    pub(crate) fn new(params: BackoffParams, seed: u64) -> Self {
        Self {
            params,
            current: Duration::ZERO,
            streak_started: None,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// Records a failure at `now` and returns how long to wait, or `None` when the streak has
    /// lasted longer than `budget` (the caller then gives up and reports the error).
    pub(crate) fn on_failure(&mut self, now: Instant, budget: Duration) -> Option<Duration> {
        let started = *self.streak_started.get_or_insert(now);
        if now.saturating_duration_since(started) > budget {
            return None;
        }
        self.current = next_backoff(self.current, &self.params);
        Some(with_jitter(self.current, self.rng.gen::<f64>()))
    }

    /// The next delay without a budget (the coordinator restarts pairs for as long as it runs).
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.current = next_backoff(self.current, &self.params);
        with_jitter(self.current, self.rng.gen::<f64>())
    }

    /// Ends the failure streak: the next failure starts again at `initial`.
    pub(crate) fn reset(&mut self) {
        self.current = Duration::ZERO;
        self.streak_started = None;
    }
}

/// Most restarts of one child within [`RESTART_WINDOW`] before its supervisor gives up on it
/// and escalates (the same budget at every level of the tree).
pub(crate) const MAX_RESTARTS: usize = 5;

/// The window [`MAX_RESTARTS`] counts in.
pub(crate) const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// How many times a supervisor restarted one child lately: a child that dies more than
/// [`MAX_RESTARTS`] times within [`RESTART_WINDOW`] is not restarted again; its supervisor
/// escalates instead (fails itself, up to the root, which makes the process exit so that
/// systemd or Kubernetes starts it afresh). A restart loop then ends visibly instead of
/// spinning for ever.
#[derive(Debug, Default)]
pub(crate) struct RestartBudget {
    /// When the child was restarted, within the last [`RESTART_WINDOW`].
    restarts: VecDeque<Instant>,
}

impl RestartBudget {
    /// Records a restart at `now` and returns true, unless [`MAX_RESTARTS`] happened within
    /// [`RESTART_WINDOW`] before `now` (then false: give up).
    pub(crate) fn admit(&mut self, now: Instant) -> bool {
        while self
            .restarts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > RESTART_WINDOW)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= MAX_RESTARTS {
            return false;
        }
        self.restarts.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn a_burst_of_deaths_is_restarted_up_to_the_budget_then_given_up() {
        let mut budget = RestartBudget::default();
        let t0 = Instant::now();
        for i in 0..MAX_RESTARTS {
            check!(budget.admit(t0 + Duration::from_secs(i as u64)));
        }
        check!(!budget.admit(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn deaths_spread_wider_than_the_window_are_always_restarted() {
        let mut budget = RestartBudget::default();
        let t0 = Instant::now();
        for i in 0..(3 * MAX_RESTARTS) as u32 {
            check!(budget.admit(t0 + RESTART_WINDOW / 2 * i));
        }
    }

    fn params() -> BackoffParams {
        BackoffParams {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }

    #[test]
    fn next_backoff_starts_at_initial() {
        check!(next_backoff(Duration::ZERO, &params()) == Duration::from_millis(100));
    }

    #[test]
    fn next_backoff_doubles() {
        // `*2` → `/2` would give 125 ms.
        check!(next_backoff(Duration::from_millis(250), &params()) == Duration::from_millis(500));
    }

    #[test]
    fn next_backoff_caps_before_overshoot() {
        check!(next_backoff(Duration::from_secs(6), &params()) == Duration::from_secs(10));
        check!(next_backoff(Duration::from_secs(10), &params()) == Duration::from_secs(10));
    }

    #[test]
    fn next_backoff_never_exceeds_max_even_when_initial_does() {
        let p = BackoffParams {
            initial: Duration::from_secs(20),
            max: Duration::from_secs(10),
        };
        check!(next_backoff(Duration::ZERO, &p) == Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_between_half_and_full_delay() {
        let d = Duration::from_millis(1000);
        check!(with_jitter(d, 0.0) == Duration::from_millis(500));
        check!(with_jitter(d, 0.5) == Duration::from_millis(750));
        check!(with_jitter(d, 1.0) == d);
        check!(with_jitter(d, 7.0) == d);
    }

    #[test]
    fn backoff_gives_up_after_budget_and_reset_starts_over() {
        let mut backoff = Backoff::new(params(), 7);
        let t0 = Instant::now();
        let first = backoff.on_failure(t0, Duration::from_secs(1));
        check!(first.is_some_and(|d| d <= Duration::from_millis(100)));
        let second = backoff.on_failure(t0 + Duration::from_millis(500), Duration::from_secs(1));
        check!(second.is_some_and(|d| d >= Duration::from_millis(100)));
        check!(backoff
            .on_failure(t0 + Duration::from_secs(2), Duration::from_secs(1))
            .is_none());
        backoff.reset();
        let again = backoff.on_failure(t0 + Duration::from_secs(3), Duration::from_secs(1));
        check!(again.is_some_and(|d| d <= Duration::from_millis(100)));
    }
}
