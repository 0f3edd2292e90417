//! Runtime-switchable fault injection, scoped to one server instance.

use crate::state::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Handle to a server's faults; cheap to clone, usable from any thread. Every switch takes effect
/// for the next accepted connection or the next request.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Switches shared with the accept loop and every connection.
    pub(crate) inner: Arc<FaultState>,
}

/// One "fail the next N requests of a command" rule.
#[derive(Debug, Clone, Copy)]
struct FailRule {
    /// Command code the rule applies to.
    command: u32,
    /// Error status answered instead of executing the request.
    status: u32,
    /// Requests still to fail.
    remaining: u32,
}

/// Shared fault switches.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    /// Close new connections right after accept.
    refuse: AtomicBool,
    /// No request is answered before this instant.
    stall_until: Mutex<Option<Instant>>,
    /// Delay added before every response.
    latency: Mutex<Option<Duration>>,
    /// Pending "fail the next N" rules, oldest first.
    rules: Mutex<Vec<FailRule>>,
    /// Cancelled by `drop_connections`; every connection holds a clone of the token current at
    /// its accept. Replaced by a fresh child of the server's shutdown token after each use.
    generation: Mutex<Option<(CancellationToken, CancellationToken)>>,
    /// Requests read so far, by command code (a stat hook, not a fault: tests use it to show
    /// how many requests of a kind a client makes).
    requests: Mutex<BTreeMap<u32, u64>>,
}

impl Faults {
    /// While on, new connections are accepted and closed at once without a byte (the client
    /// sees the connection drop and goes through its reconnect path). Existing ones stay.
    pub fn refuse_connections(&self, on: bool) {
        self.inner.refuse.store(on, Ordering::SeqCst);
    }

    /// Closes every open connection now (the server keeps listening).
    pub fn drop_connections(&self) {
        let mut generation = lock(&self.inner.generation);
        if let Some((shutdown, current)) = generation.take() {
            current.cancel();
            *generation = Some((shutdown.clone(), shutdown.child_token()));
        }
    }

    /// For `duration` from now, connections are accepted and requests read, but nothing is
    /// answered; the answers are sent when the stall ends (unless the connection is dropped).
    pub fn stall_for(&self, duration: Duration) {
        *lock(&self.inner.stall_until) = Some(Instant::now() + duration);
    }

    /// Ends a stall early.
    pub fn end_stall(&self) {
        *lock(&self.inner.stall_until) = None;
    }

    /// Answers the next `count` requests with command code `command` (e.g. 101 SEND_MESSAGES)
    /// with error status `status` (e.g. 3007) and an empty body, without executing them.
    pub fn fail_next(&self, command: u32, status: u32, count: u32) {
        lock(&self.inner.rules).push(FailRule {
            command,
            status,
            remaining: count,
        });
    }

    /// Delays every response by `latency` (`None` turns it off).
    pub fn set_latency(&self, latency: Option<Duration>) {
        *lock(&self.inner.latency) = latency;
    }

    /// How many requests with command code `command` (e.g. 100 POLL_MESSAGES) this server has
    /// read from its clients since it started, including those answered by an injected fault.
    pub fn requests(&self, command: u32) -> u64 {
        lock(&self.inner.requests)
            .get(&command)
            .copied()
            .unwrap_or(0)
    }

    /// Turns every fault off.
    pub fn clear(&self) {
        self.refuse_connections(false);
        self.end_stall();
        self.set_latency(None);
        lock(&self.inner.rules).clear();
    }
}

impl FaultState {
    /// Installs the connection generation of a (re)started listener.
    pub(crate) fn start_generation(&self, shutdown: &CancellationToken) {
        *lock(&self.generation) = Some((shutdown.clone(), shutdown.child_token()));
    }

    /// Token a newly accepted connection watches.
    pub(crate) fn connection_token(&self) -> CancellationToken {
        match &*lock(&self.generation) {
            Some((_, current)) => current.clone(),
            None => {
                let t = CancellationToken::new();
                t.cancel();
                t
            }
        }
    }

    pub(crate) fn refusing(&self) -> bool {
        self.refuse.load(Ordering::SeqCst)
    }

    pub(crate) fn latency(&self) -> Option<Duration> {
        *lock(&self.latency)
    }

    /// Waits while a stall is active; returns false when `cancel` fired first.
    pub(crate) async fn wait_stall(&self, cancel: &CancellationToken) -> bool {
        loop {
            let until = *lock(&self.stall_until);
            match until {
                Some(t) if t > Instant::now() => {
                    tokio::select! {
                        () = cancel.cancelled() => return false,
                        () = tokio::time::sleep_until(t) => {}
                    }
                }
                _ => return true,
            }
        }
    }

    /// Counts one request of `command` (see [`Faults::requests`]).
    pub(crate) fn count_request(&self, command: u32) {
        *lock(&self.requests).entry(command).or_insert(0) += 1;
    }

    /// The injected error status for this request, consuming one use of the matching rule.
    pub(crate) fn take_failure(&self, command: u32) -> Option<u32> {
        let mut rules = lock(&self.rules);
        let idx = rules
            .iter()
            .position(|r| r.command == command && r.remaining > 0)?;
        let status = rules[idx].status;
        rules[idx].remaining -= 1;
        if rules[idx].remaining == 0 {
            rules.remove(idx);
        }
        Some(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn fail_next_counts_down_per_command() {
        let f = Faults::default();
        f.fail_next(101, 3007, 2);
        check!(f.inner.take_failure(100).is_none());
        check!(f.inner.take_failure(101) == Some(3007));
        check!(f.inner.take_failure(101) == Some(3007));
        check!(f.inner.take_failure(101).is_none());
    }

    #[test]
    fn requests_are_counted_per_command() {
        let f = Faults::default();
        check!(f.requests(100) == 0);
        f.inner.count_request(100);
        f.inner.count_request(100);
        f.inner.count_request(300);
        check!(f.requests(100) == 2);
        check!(f.requests(300) == 1);
        check!(f.requests(101) == 0);
    }

    #[test]
    fn drop_connections_cancels_the_current_generation_only() {
        let f = Faults::default();
        let shutdown = CancellationToken::new();
        f.inner.start_generation(&shutdown);
        let old = f.inner.connection_token();
        f.drop_connections();
        check!(old.is_cancelled());
        check!(!f.inner.connection_token().is_cancelled());
        shutdown.cancel();
        check!(f.inner.connection_token().is_cancelled());
    }
}
