//! Runtime-switchable fault injection, scoped to one server instance.

use crate::state::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Handle to a server's faults; cheap to clone, usable from any thread. Every switch takes effect
/// for the next accepted connection or the next request.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Switches shared with the accept loop and every connection.
    pub(crate) inner: Arc<FaultState>,
}

/// Whether the server answers requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Stall {
    /// It does.
    #[default]
    Off,
    /// Not before this instant.
    Until(Instant),
    /// Not until [`Faults::end_stall`].
    UntilEnded,
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

/// One "answer the next N requests of a command late" rule.
#[derive(Debug, Clone, Copy)]
struct DelayRule {
    /// Command code the rule applies to.
    command: u32,
    /// How long each request waits before the server handles it.
    delay: Duration,
    /// Whether the first request of `command` on each connection is spared.
    spare_first: bool,
    /// Requests still to delay.
    remaining: u32,
}

/// Requests of each command a connection sent while any delay rule was set (for
/// [`Faults::delay_next_after_the_first`]); one per connection.
pub(crate) type SeenOnConnection = BTreeMap<u32, u32>;

/// Shared fault switches.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    /// Close new connections right after accept.
    refuse: AtomicBool,
    /// Whether requests are answered now (see [`Faults::stall_for`], [`Faults::stall`]); the
    /// connections waiting in a stall watch it, so that its end lets them go at once.
    stall: watch::Sender<Stall>,
    /// Delay added before every response.
    latency: Mutex<Option<Duration>>,
    /// Pending "fail the next N" rules, oldest first.
    rules: Mutex<Vec<FailRule>>,
    /// Pending "answer the next N late" rules, oldest first.
    delays: Mutex<Vec<DelayRule>>,
    /// `delays.len()`, read without the lock on every request.
    delays_active: AtomicUsize,
    /// Requests a delay rule held whose delay has ended (see [`Faults::delays_ended`]).
    delays_ended: std::sync::atomic::AtomicU64,
    /// The server's shutdown token and the token of the connections accepted since the last
    /// `drop_connections`, which cancels it; every connection holds a clone of the token
    /// current at its accept. Replaced by a fresh child of the shutdown token after each use.
    connection_tokens: Mutex<Option<(CancellationToken, CancellationToken)>>,
    /// Requests read so far, by command code (a stat hook, not a fault: tests use it to show
    /// how many requests of a kind a client makes).
    requests: Mutex<BTreeMap<u32, u64>>,
    /// Active [`SendHold`]s, oldest first.
    send_holds: Mutex<Vec<Arc<HoldState>>>,
    /// `send_holds.len()`, read without the lock on every SEND_MESSAGES.
    send_holds_active: AtomicUsize,
}

/// A hold on the SEND_MESSAGES requests of one session, from [`Faults::hold_sends_to`]: a
/// writer frozen in the middle of a send, whose request is still on its way to the server.
///
/// The first session whose SEND_MESSAGES to the hold's partition is read while the hold is
/// active becomes the held session; from then on each of its SEND_MESSAGES waits, before the
/// server looks at it, until the hold is released. Other sessions are not held, whatever they
/// write to. Releasing the hold (by [`SendHold::release`] or by dropping it) lets the held
/// requests in, in the order they arrived, and each is then handled like any request read at
/// that moment: checked against the permissions of that moment, then appended. That is what a
/// real server does with a request delayed on the network: it judges a request when it reads
/// it, and once judged the append is already queued ahead of any later read of the partition
/// (see `iggy-fencing` in the shared docs).
#[derive(Debug)]
#[must_use = "dropping the hold releases it"]
pub struct SendHold {
    /// The hold's queue, shared with the held requests.
    state: Arc<HoldState>,
    /// Where the hold is registered, to unregister it on release.
    faults: Arc<FaultState>,
}

/// The destination a hold captures its session on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SendDestination {
    /// Stream name.
    pub(crate) stream: String,
    /// Topic name.
    pub(crate) topic: String,
    /// Partition id.
    pub(crate) partition: u32,
}

/// The queue of one hold.
#[derive(Debug)]
pub(crate) struct HoldState {
    /// The partition whose first sender is held.
    destination: SendDestination,
    /// Released flag, held session and tickets.
    queue: Mutex<HoldQueue>,
    /// Bumped on every change of `queue`, so waiters re-check it.
    changed: watch::Sender<()>,
}

/// Tickets of held requests; the smallest pending ticket appends first once released.
#[derive(Debug, Default)]
struct HoldQueue {
    /// Whether held requests may proceed.
    released: bool,
    /// Client id of the held session, once one sent to the destination.
    session: Option<u32>,
    /// The next ticket handed out.
    next_ticket: u64,
    /// Tickets of requests that are held or appending.
    pending: BTreeSet<u64>,
}

/// One held request's place in its hold's queue; dropping it (after the append, or when the
/// connection goes away while held) lets the next request proceed.
#[derive(Debug)]
pub(crate) struct SendTicket {
    /// The hold.
    state: Arc<HoldState>,
    /// This request's ticket.
    ticket: u64,
}

impl Faults {
    /// While on, new connections are accepted and closed at once without a byte (the client
    /// sees the connection drop and goes through its reconnect path). Existing ones stay.
    pub fn refuse_connections(&self, on: bool) {
        self.inner.refuse.store(on, Ordering::SeqCst);
    }

    /// Closes every open connection now (the server keeps listening).
    pub fn drop_connections(&self) {
        let mut tokens = lock(&self.inner.connection_tokens);
        if let Some((shutdown, current)) = tokens.take() {
            current.cancel();
            *tokens = Some((shutdown.clone(), shutdown.child_token()));
        }
    }

    /// For `duration` from now, connections are accepted and requests read, but nothing is
    /// executed or answered; the requests are handled when the stall ends (unless the
    /// connection is dropped), in no particular order across connections.
    pub fn stall_for(&self, duration: Duration) {
        self.inner
            .stall
            .send_replace(Stall::Until(Instant::now() + duration));
    }

    /// Like [`Faults::stall_for`], until [`Faults::end_stall`]: a server process frozen by
    /// SIGSTOP (its clients' connections stay open, new ones are accepted by the kernel,
    /// nothing is answered) until it is continued.
    pub fn stall(&self) {
        self.inner.stall.send_replace(Stall::UntilEnded);
    }

    /// Ends a stall (early, for [`Faults::stall_for`]): the requests waiting in it are handled
    /// now.
    pub fn end_stall(&self) {
        self.inner.stall.send_replace(Stall::Off);
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

    /// Handles the next `count` requests with command code `command` (e.g. 12
    /// GET_CLUSTER_METADATA) `delay` late, each on its own connection; other requests of that
    /// connection wait behind it, as on a real server that is slow to answer one request.
    pub fn delay_next(&self, command: u32, delay: Duration, count: u32) {
        self.push_delay(command, delay, false, count);
    }

    /// Like [`Faults::delay_next`], but the first request of `command` on each connection is
    /// answered at once (connections are counted from the moment a delay rule is set): a 0.9
    /// replica that answers the roster the SDK asks for while it connects, and is slow on the
    /// next one.
    pub fn delay_next_after_the_first(&self, command: u32, delay: Duration, count: u32) {
        self.push_delay(command, delay, true, count);
    }

    fn push_delay(&self, command: u32, delay: Duration, spare_first: bool, count: u32) {
        let mut delays = lock(&self.inner.delays);
        delays.push(DelayRule {
            command,
            delay,
            spare_first,
            remaining: count,
        });
        self.inner
            .delays_active
            .store(delays.len(), Ordering::SeqCst);
    }

    /// Delays every response by `latency` (`None` turns it off).
    pub fn set_latency(&self, latency: Option<Duration>) {
        *lock(&self.inner.latency) = latency;
    }

    /// How many requests a [`Faults::delay_next`] rule held have been let through since the
    /// server started (each is handled and answered right after).
    pub fn delays_ended(&self) -> u64 {
        self.inner.delays_ended.load(Ordering::SeqCst)
    }

    /// How many requests with command code `command` (e.g. 100 POLL_MESSAGES) this server has
    /// read from its clients since it started, including those answered by an injected fault.
    pub fn requests(&self, command: u32) -> u64 {
        lock(&self.inner.requests)
            .get(&command)
            .copied()
            .unwrap_or(0)
    }

    /// Holds the SEND_MESSAGES requests of the next session that sends to `partition` of
    /// `stream`/`topic` (names), before the server reads them, until the returned
    /// [`SendHold`] is released or dropped. Tests use it to freeze a writer in the middle of a
    /// send, whichever user it writes as.
    pub fn hold_sends_to(&self, stream: &str, topic: &str, partition: u32) -> SendHold {
        let state = Arc::new(HoldState {
            destination: SendDestination {
                stream: stream.to_owned(),
                topic: topic.to_owned(),
                partition,
            },
            queue: Mutex::new(HoldQueue::default()),
            changed: watch::Sender::new(()),
        });
        let mut holds = lock(&self.inner.send_holds);
        holds.push(Arc::clone(&state));
        self.inner
            .send_holds_active
            .store(holds.len(), Ordering::SeqCst);
        SendHold {
            state,
            faults: Arc::clone(&self.inner),
        }
    }

    /// Turns every fault off, releasing every [`SendHold`].
    pub fn clear(&self) {
        self.refuse_connections(false);
        self.end_stall();
        self.set_latency(None);
        lock(&self.inner.rules).clear();
        lock(&self.inner.delays).clear();
        self.inner.delays_active.store(0, Ordering::SeqCst);
        let holds = std::mem::take(&mut *lock(&self.inner.send_holds));
        self.inner.send_holds_active.store(0, Ordering::SeqCst);
        for hold in holds {
            hold.release();
        }
    }
}

impl SendHold {
    /// Requests currently held (arrived, not yet let in).
    pub fn held(&self) -> usize {
        lock(&self.state.queue).pending.len()
    }

    /// Waits until at least `count` requests are held.
    pub async fn until_held(&self, count: usize) {
        let mut changed = self.state.changed.subscribe();
        while self.held() < count {
            // The sender lives as long as `self.state`, so this never fails.
            let _ = changed.changed().await;
        }
    }

    /// Lets the held requests in, in the order they arrived, and stops holding new ones.
    pub fn release(self) {
        drop(self);
    }

    /// [`SendHold::release`], then waits until every held request was handled (answered, or
    /// dropped with its connection).
    pub async fn release_and_wait(self) {
        let state = Arc::clone(&self.state);
        let mut changed = state.changed.subscribe();
        drop(self);
        while !lock(&state.queue).pending.is_empty() {
            // The sender lives as long as `state`, so this never fails.
            let _ = changed.changed().await;
        }
    }
}

impl Drop for SendHold {
    fn drop(&mut self) {
        let mut holds = lock(&self.faults.send_holds);
        holds.retain(|h| !Arc::ptr_eq(h, &self.state));
        self.faults
            .send_holds_active
            .store(holds.len(), Ordering::SeqCst);
        drop(holds);
        self.state.release();
    }
}

impl HoldState {
    fn release(&self) {
        lock(&self.queue).released = true;
        self.changed.send_replace(());
    }
}

impl SendTicket {
    /// Waits until the hold is released and every request held before this one has appended.
    /// Returns false when `cancel` fired first (the connection is closing).
    pub(crate) async fn wait(&self, cancel: &CancellationToken) -> bool {
        let mut changed = self.state.changed.subscribe();
        loop {
            {
                let queue = lock(&self.state.queue);
                if queue.released && queue.pending.first() == Some(&self.ticket) {
                    return true;
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return false,
                // The sender lives as long as `self.state`, so this never fails.
                _ = changed.changed() => {}
            }
        }
    }
}

impl Drop for SendTicket {
    fn drop(&mut self) {
        lock(&self.state.queue).pending.remove(&self.ticket);
        self.state.changed.send_replace(());
    }
}

impl FaultState {
    /// Installs the connection tokens of a (re)started listener.
    pub(crate) fn start_connection_tokens(&self, shutdown: &CancellationToken) {
        *lock(&self.connection_tokens) = Some((shutdown.clone(), shutdown.child_token()));
    }

    /// Token a newly accepted connection watches.
    pub(crate) fn connection_token(&self) -> CancellationToken {
        match &*lock(&self.connection_tokens) {
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
        let mut changed = self.stall.subscribe();
        loop {
            let until = match *changed.borrow_and_update() {
                Stall::Off => return true,
                Stall::Until(t) if t <= Instant::now() => return true,
                Stall::Until(t) => Some(t),
                Stall::UntilEnded => None,
            };
            let deadline = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = deadline => {}
                // The sender lives as long as `self`, so this never fails.
                _ = changed.changed() => {}
            }
        }
    }

    /// Waits out a [`Faults::delay_next`] rule for a request of `command`, if one applies;
    /// returns false when `cancel` fired first.
    pub(crate) async fn wait_delay(
        &self,
        command: u32,
        seen: &mut SeenOnConnection,
        cancel: &CancellationToken,
    ) -> bool {
        if self.delays_active.load(Ordering::SeqCst) == 0 {
            return true;
        }
        let nth = seen.entry(command).or_insert(0);
        *nth += 1;
        let first = *nth == 1;
        let delay = {
            let mut delays = lock(&self.delays);
            let rule = use_once(
                &mut delays,
                |r| r.command == command && !(r.spare_first && first),
                |r| &mut r.remaining,
            );
            self.delays_active.store(delays.len(), Ordering::SeqCst);
            match rule {
                Some(rule) => rule.delay,
                None => return true,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => false,
            () = tokio::time::sleep(delay) => {
                self.delays_ended.fetch_add(1, Ordering::SeqCst);
                true
            }
        }
    }

    /// Counts one request of `command` (see [`Faults::requests`]).
    pub(crate) fn count_request(&self, command: u32) {
        *lock(&self.requests).entry(command).or_insert(0) += 1;
    }

    /// Whether any [`SendHold`] is active (checked on every SEND_MESSAGES before anything else
    /// about holds, so sends pay one atomic load when none is).
    pub(crate) fn holds_sends(&self) -> bool {
        self.send_holds_active.load(Ordering::SeqCst) > 0
    }

    /// A place in the queue of the oldest active hold that holds session `client` (or, when
    /// a hold has no session yet and this send goes to its destination, captures it), if any.
    pub(crate) fn hold_send(
        &self,
        client: u32,
        destination: Option<&SendDestination>,
    ) -> Option<SendTicket> {
        let state = lock(&self.send_holds).iter().find_map(|h| {
            let mut queue = lock(&h.queue);
            match queue.session {
                Some(held) if held == client => {}
                None if destination == Some(&h.destination) => queue.session = Some(client),
                _ => return None,
            }
            let ticket = queue.next_ticket;
            queue.next_ticket += 1;
            queue.pending.insert(ticket);
            Some((Arc::clone(h), ticket))
        });
        let (state, ticket) = state?;
        state.changed.send_replace(());
        Some(SendTicket { state, ticket })
    }

    /// The injected error status for this request, consuming one use of the matching rule.
    pub(crate) fn take_failure(&self, command: u32) -> Option<u32> {
        let rule = use_once(
            &mut lock(&self.rules),
            |r| r.command == command,
            |r| &mut r.remaining,
        );
        rule.map(|r| r.status)
    }
}

/// Uses the oldest of `rules` that `applies` and has uses left once, dropping it after its
/// last use; the rule as it was before.
fn use_once<R: Copy>(
    rules: &mut Vec<R>,
    applies: impl Fn(&R) -> bool,
    remaining: impl Fn(&mut R) -> &mut u32,
) -> Option<R> {
    let idx = rules
        .iter_mut()
        .position(|r| applies(r) && *remaining(r) > 0)?;
    let rule = rules[idx];
    let left = remaining(&mut rules[idx]);
    *left -= 1;
    if *left == 0 {
        rules.remove(idx);
    }
    Some(rule)
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

    #[tokio::test]
    async fn a_delay_rule_holds_only_its_command_and_only_as_many_times_as_asked() {
        let f = Faults::default();
        let cancel = CancellationToken::new();
        let mut seen = SeenOnConnection::new();
        f.delay_next(12, Duration::from_millis(50), 1);
        check!(f.inner.wait_delay(100, &mut seen, &cancel).await);
        check!(
            f.inner.delays_active.load(Ordering::SeqCst) == 1,
            "not consumed"
        );
        let started = Instant::now();
        check!(f.inner.wait_delay(12, &mut seen, &cancel).await);
        check!(started.elapsed() >= Duration::from_millis(50));
        check!(f.inner.delays_active.load(Ordering::SeqCst) == 0, "used up");
        check!(f.delays_ended() == 1);
        f.delay_next(12, Duration::from_secs(600), 1);
        cancel.cancel();
        check!(
            !f.inner.wait_delay(12, &mut seen, &cancel).await,
            "a closed connection stops waiting"
        );
    }

    #[tokio::test]
    async fn a_delay_rule_can_spare_the_first_request_of_each_connection() {
        let f = Faults::default();
        let cancel = CancellationToken::new();
        f.delay_next_after_the_first(12, Duration::from_millis(50), 1);
        let (mut one, mut other) = (SeenOnConnection::new(), SeenOnConnection::new());
        check!(f.inner.wait_delay(12, &mut one, &cancel).await);
        check!(f.inner.wait_delay(12, &mut other, &cancel).await);
        check!(
            f.inner.delays_active.load(Ordering::SeqCst) == 1,
            "both spared"
        );
        let started = Instant::now();
        check!(f.inner.wait_delay(12, &mut one, &cancel).await);
        check!(started.elapsed() >= Duration::from_millis(50));
        check!(
            f.inner.delays_active.load(Ordering::SeqCst) == 0,
            "the second one waited"
        );
    }

    fn to(partition: u32) -> SendDestination {
        SendDestination {
            stream: "s".into(),
            topic: "t".into(),
            partition,
        }
    }

    #[tokio::test]
    async fn a_hold_captures_the_first_sender_and_lets_its_sends_in_order_after_release() {
        let f = Faults::default();
        check!(!f.inner.holds_sends());
        let hold = f.hold_sends_to("s", "t", 1);
        check!(f.inner.holds_sends());
        check!(
            f.inner.hold_send(7, Some(&to(0))).is_none(),
            "other partition"
        );
        let first = f
            .inner
            .hold_send(7, Some(&to(1)))
            .expect("captures client 7");
        check!(
            f.inner.hold_send(8, Some(&to(1))).is_none(),
            "other session"
        );
        let second = f.inner.hold_send(7, None).expect("every send of client 7");
        hold.until_held(2).await;
        check!(hold.held() == 2);
        let cancel = CancellationToken::new();
        let waiting = tokio::time::timeout(Duration::from_millis(20), second.wait(&cancel)).await;
        check!(waiting.is_err(), "held until released");
        hold.release();
        check!(!f.inner.holds_sends(), "new sends pass");
        let second_turn =
            tokio::time::timeout(Duration::from_millis(20), second.wait(&cancel)).await;
        check!(second_turn.is_err(), "the second waits for the first");
        check!(first.wait(&cancel).await);
        drop(first);
        check!(second.wait(&cancel).await);
        drop(second);
    }

    #[tokio::test]
    async fn release_and_wait_returns_once_every_held_request_was_handled() {
        let f = Faults::default();
        let hold = f.hold_sends_to("s", "t", 0);
        let held = f.inner.hold_send(3, Some(&to(0))).expect("held");
        let appended = Arc::new(AtomicBool::new(false));
        let handler = Arc::clone(&appended);
        tokio::spawn(async move {
            check!(held.wait(&CancellationToken::new()).await);
            tokio::time::sleep(Duration::from_millis(10)).await;
            handler.store(true, Ordering::SeqCst);
            drop(held);
        });
        hold.release_and_wait().await;
        check!(
            appended.load(Ordering::SeqCst),
            "returned before the request was handled"
        );
    }

    #[tokio::test]
    async fn a_dropped_ticket_does_not_block_the_queue() {
        let f = Faults::default();
        let hold = f.hold_sends_to("s", "t", 0);
        let gone = f.inner.hold_send(1, Some(&to(0))).expect("held");
        let next = f.inner.hold_send(1, Some(&to(0))).expect("held");
        drop(gone);
        f.clear();
        check!(hold.held() == 1);
        check!(next.wait(&CancellationToken::new()).await);
        let cancelled = CancellationToken::new();
        cancelled.cancel();
        let blocked = f.hold_sends_to("s", "t", 0);
        let held = f.inner.hold_send(2, Some(&to(0))).expect("held");
        check!(!held.wait(&cancelled).await, "cancellation ends the wait");
        drop(blocked);
    }

    #[tokio::test]
    async fn an_ended_stall_lets_the_requests_waiting_in_it_go_at_once() {
        let f = Faults::default();
        let cancel = CancellationToken::new();
        check!(f.inner.wait_stall(&cancel).await, "no stall: nothing waits");
        for until_ended in [true, false] {
            if until_ended {
                f.stall();
            } else {
                f.stall_for(Duration::from_secs(3600));
            }
            let inner = Arc::clone(&f.inner);
            let waiter =
                tokio::spawn(async move { inner.wait_stall(&CancellationToken::new()).await });
            let held = tokio::time::timeout(Duration::from_millis(50), async {
                while !waiter.is_finished() {
                    tokio::task::yield_now().await;
                }
            })
            .await;
            check!(held.is_err(), "held while stalled");
            f.end_stall();
            let went = tokio::time::timeout(Duration::from_secs(5), waiter).await;
            check!(matches!(went, Ok(Ok(true))), "let go when the stall ended");
        }
        f.stall();
        cancel.cancel();
        check!(
            !f.inner.wait_stall(&cancel).await,
            "cancellation ends the wait"
        );
    }

    #[test]
    fn drop_connections_cancels_the_current_connections_only() {
        let f = Faults::default();
        let shutdown = CancellationToken::new();
        f.inner.start_connection_tokens(&shutdown);
        let old = f.inner.connection_token();
        f.drop_connections();
        check!(old.is_cancelled());
        check!(!f.inner.connection_token().is_cancelled());
        shutdown.cancel();
        check!(f.inner.connection_token().is_cancelled());
    }
}
