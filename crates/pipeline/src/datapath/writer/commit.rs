//! The writer's commit bookkeeping: how far downstream holds the unit, how far the control plane
//! confirmed it, the counters not yet confirmed, and when the next commit may start.
//!
//! Pure: the writer tells the tracker what it wrote and what a commit answered, passes `now`,
//! and runs the one commit the tracker hands out at a time. A busy unit commits at most once per
//! `commit_interval` (Raft entries follow units × 10/s, not batches); a stopping one commits at
//! once.
//!
//! What a commit counts: the counters since the previous confirmed commit, or, for a writer
//! session that counts totals (feature level 2), everything the session copied, which the
//! control plane applies with a maximum per session so that a commit applied twice or late
//! counts once.

use std::time::{Duration, Instant};

use replicator_model::{CommitCounters, CommitOutcome, Epoch, Offset, UnitCounters};

use crate::control::ControlError;

/// How long after a failed commit call the next commit may start, so that an unavailable
/// control plane is not asked again after every batch.
pub(crate) const COMMIT_RETRY_DELAY: Duration = Duration::from_millis(250);

/// One commit to make: everything up to `offset` is downstream, plus what was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommitRequest {
    /// Last upstream offset downstream.
    pub(crate) offset: Offset,
    /// What the commit counts.
    pub(crate) counters: CommitCounters,
    /// Counters taken out of the pending ones; they go back if the commit fails.
    taken: UnitCounters,
}

/// What the writer does once a commit answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Confirmed, or failed and kept for the next commit: carry on.
    Continue,
    /// The unit is owned under another epoch (`current`) or by nobody: stop at once, since
    /// nothing this writer sends can be confirmed any more.
    Fenced {
        /// The unit's epoch at the time of the commit.
        current: Option<Epoch>,
    },
}

/// Written, committed and pending progress of one writer.
#[derive(Debug)]
pub(crate) struct CommitTracker {
    /// Shortest time between two commits that are not final.
    interval: Duration,
    /// Last upstream offset known to be downstream (sent, or found in the tail).
    written: Option<Offset>,
    /// Last offset the control plane confirmed under this writer's epoch (or before it).
    committed: Option<Offset>,
    /// Counters not yet handed to a commit.
    pending: UnitCounters,
    /// The writer session, when it commits totals.
    session: Option<u64>,
    /// Everything this session counted (sent with every commit when it commits totals).
    totals: UnitCounters,
    /// The commit in flight (at most one), until it is settled.
    in_flight: Option<CommitRequest>,
    /// No commit starts before this, except the final one.
    next_at: Instant,
}

impl CommitTracker {
    /// A tracker with nothing written; the first commit is not held back. `session`: the
    /// writer session's number when it commits totals, `None` when it commits counters since
    /// the previous commit.
    pub(crate) fn new(interval: Duration, now: Instant, session: Option<u64>) -> Self {
        Self {
            interval,
            written: None,
            committed: None,
            pending: UnitCounters::default(),
            session,
            totals: UnitCounters::default(),
            in_flight: None,
            next_at: now,
        }
    }

    /// Where the writer resumed: `written` is downstream (confirmed or found in the tail),
    /// `committed` confirmed. A tail beyond the confirmed offset is committed with the next
    /// commit.
    pub(crate) fn resumed(&mut self, written: Option<Offset>, committed: Option<Offset>) {
        self.written = written;
        self.committed = committed;
    }

    /// The last upstream offset known to be downstream: a batch drops what is up to it.
    pub(crate) fn written(&self) -> Option<Offset> {
        self.written
    }

    /// Downstream holds everything up to `offset` (a batch sent or skipped as a whole, or
    /// what a tail re-read found). Never moves back.
    pub(crate) fn covered(&mut self, offset: Option<Offset>) {
        self.written = self.written.max(offset);
    }

    /// `messages` messages of `bytes` bytes were acknowledged downstream.
    pub(crate) fn sent(&mut self, messages: u64, bytes: u64) {
        self.count(UnitCounters {
            messages,
            bytes,
            ..Default::default()
        });
    }

    /// A batch came after offsets lost to retention.
    pub(crate) fn gap(&mut self) {
        self.count(UnitCounters {
            gaps: 1,
            ..Default::default()
        });
    }

    /// A failure the writer retries.
    pub(crate) fn error(&mut self) {
        self.count(UnitCounters {
            errors: 1,
            ..Default::default()
        });
    }

    fn count(&mut self, what: UnitCounters) {
        self.pending.add(&what);
        self.totals.add(&what);
    }

    /// Whether there is progress or counters the control plane has not confirmed yet. Nothing
    /// is committed before the writer knows an offset (the counters wait for it).
    fn has_uncommitted(&self) -> bool {
        self.written.is_some()
            && (self.committed < self.written || self.pending != UnitCounters::default())
    }

    /// When a commit held back by the interval becomes due; `None` while one is in flight or
    /// there is nothing to commit. An idle writer waits for this, so progress is confirmed
    /// also when no further batch comes.
    pub(crate) fn due_at(&self) -> Option<Instant> {
        (self.in_flight.is_none() && self.has_uncommitted()).then_some(self.next_at)
    }

    /// The commit to start at `now`, if one is due: none in flight, something to confirm, and
    /// the interval since the previous one has passed.
    pub(crate) fn start_if_due(&mut self, now: Instant) -> Option<CommitRequest> {
        if now < self.next_at {
            return None;
        }
        self.start(now)
    }

    /// The final commit of a stopping writer: as [`CommitTracker::start_if_due`], without
    /// waiting for the interval.
    pub(crate) fn start_final(&mut self, now: Instant) -> Option<CommitRequest> {
        self.start(now)
    }

    fn start(&mut self, now: Instant) -> Option<CommitRequest> {
        if self.in_flight.is_some() || !self.has_uncommitted() {
            return None;
        }
        let offset = self.written?;
        self.next_at = now + self.interval;
        let taken = std::mem::take(&mut self.pending);
        let counters = match self.session {
            Some(session) => CommitCounters::Totals {
                session,
                totals: self.totals,
            },
            None => CommitCounters::Since(taken),
        };
        let request = CommitRequest {
            offset,
            counters,
            taken,
        };
        self.in_flight = Some(request);
        Some(request)
    }

    /// Applies the answer to the commit in flight: a confirmation moves `committed` (never
    /// back); a failed call or an empty answer gives the counters back for the next commit,
    /// which a failed call also delays by [`COMMIT_RETRY_DELAY`]; a fence stops the writer.
    pub(crate) fn settle(
        &mut self,
        now: Instant,
        answer: Result<&[CommitOutcome], &ControlError>,
    ) -> Settled {
        let Some(request) = self.in_flight.take() else {
            return Settled::Continue;
        };
        match answer {
            Ok([CommitOutcome::Committed, ..]) => {
                self.committed = self.committed.max(Some(request.offset));
                Settled::Continue
            }
            Ok([CommitOutcome::Fenced { current }, ..]) => Settled::Fenced { current: *current },
            Ok([]) => {
                self.pending.add(&request.taken);
                Settled::Continue
            }
            Err(_) => {
                self.pending.add(&request.taken);
                self.next_at = self.next_at.max(now + COMMIT_RETRY_DELAY);
                Settled::Continue
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};

    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn failure() -> ControlError {
        ControlError {
            reason: "no leader".into(),
            transient: true,
        }
    }

    fn committed() -> Vec<CommitOutcome> {
        vec![CommitOutcome::Committed]
    }

    /// A tracker at `t0` that resumed with `written` downstream and `committed` confirmed.
    fn tracker(t0: Instant, written: Option<Offset>, committed: Option<Offset>) -> CommitTracker {
        let mut t = CommitTracker::new(INTERVAL, t0, None);
        t.resumed(written, committed);
        t
    }

    #[test]
    fn nothing_is_committed_before_an_offset_is_known() {
        let t0 = Instant::now();
        let mut t = tracker(t0, None, None);
        // Errors while resuming wait for the first offset.
        t.error();
        check!(t.due_at().is_none());
        check!(t.start_final(t0).is_none());
        t.covered(Some(4));
        let request = t.start_if_due(t0);
        check!(request.map(|r| (r.offset, r.taken.errors)) == Some((4, 1)));
    }

    #[test]
    fn tail_found_beyond_the_confirmed_offset_is_committed_at_once() {
        let t0 = Instant::now();
        let mut t = tracker(t0, Some(10), Some(5));
        check!(t.due_at() == Some(t0));
        check!(t.start_if_due(t0).map(|r| r.offset) == Some(10));
        // Resumed exactly at the confirmed offset: nothing to confirm.
        let mut t = tracker(t0, Some(5), Some(5));
        check!(t.due_at().is_none());
        check!(t.start_if_due(t0).is_none());
    }

    #[test]
    fn a_busy_writer_commits_at_most_once_per_interval() {
        let t0 = Instant::now();
        let mut t = tracker(t0, None, None);
        t.covered(Some(9));
        t.sent(10, 1000);
        assert!(t.start_if_due(t0).is_some());
        check!(t.settle(t0 + ms(5), Ok(&committed())) == Settled::Continue);
        t.covered(Some(19));
        t.sent(10, 1000);
        check!(t.due_at() == Some(t0 + INTERVAL));
        check!(t.start_if_due(t0 + ms(99)).is_none());
        // Exactly at the interval it is due (`<` → `<=` would hold it back one batch longer).
        let second = t.start_if_due(t0 + INTERVAL);
        check!(second.map(|r| (r.offset, r.taken.messages)) == Some((19, 10)));
    }

    #[test]
    fn only_one_commit_is_in_flight() {
        let t0 = Instant::now();
        let mut t = tracker(t0, Some(3), None);
        assert!(t.start_if_due(t0).is_some());
        t.covered(Some(8));
        check!(t.due_at().is_none());
        check!(t.start_if_due(t0 + ms(500)).is_none());
        check!(t.start_final(t0 + ms(500)).is_none());
        t.settle(t0 + ms(600), Ok(&committed()));
        check!(t.start_final(t0 + ms(600)).map(|r| r.offset) == Some(8));
    }

    #[test]
    fn the_final_commit_does_not_wait_for_the_interval() {
        let t0 = Instant::now();
        let mut t = tracker(t0, Some(3), None);
        assert!(t.start_if_due(t0).is_some());
        t.settle(t0, Ok(&committed()));
        t.covered(Some(7));
        check!(t.start_if_due(t0 + ms(1)).is_none());
        check!(t.start_final(t0 + ms(1)).map(|r| r.offset) == Some(7));
    }

    #[test]
    fn a_confirmed_commit_leaves_nothing_to_commit() {
        let t0 = Instant::now();
        let mut t = tracker(t0, None, None);
        t.covered(Some(4));
        t.sent(5, 500);
        t.gap();
        let request = t.start_if_due(t0).expect("due");
        check!(request.taken.messages == 5);
        check!(request.taken.bytes == 500);
        check!(request.taken.gaps == 1);
        check!(t.settle(t0, Ok(&committed())) == Settled::Continue);
        check!(t.due_at().is_none());
        check!(t.start_final(t0 + ms(500)).is_none());
    }

    #[test]
    fn counters_alone_are_committed_under_the_written_offset() {
        let t0 = Instant::now();
        let mut t = tracker(t0, Some(4), Some(4));
        t.error();
        let request = t.start_if_due(t0).expect("due");
        check!(request.offset == 4);
        check!(request.taken.errors == 1);
    }

    #[test]
    fn a_failed_commit_gives_its_counters_back_and_waits_the_retry_delay() {
        let t0 = Instant::now();
        let mut t = tracker(t0, None, None);
        t.covered(Some(4));
        t.sent(5, 500);
        assert!(t.start_if_due(t0).is_some());
        t.sent(1, 100);
        let failed = failure();
        check!(t.settle(t0 + ms(10), Err(&failed)) == Settled::Continue);
        check!(t.due_at() == Some(t0 + ms(10) + COMMIT_RETRY_DELAY));
        check!(t.start_if_due(t0 + ms(200)).is_none());
        let retry = t
            .start_if_due(t0 + ms(10) + COMMIT_RETRY_DELAY)
            .expect("due");
        check!(retry.offset == 4);
        // The failed commit's counters and the ones since, each counted once.
        check!(retry.taken.messages == 6);
        check!(retry.taken.bytes == 600);
    }

    #[test]
    fn an_empty_answer_gives_the_counters_back_without_delay() {
        let t0 = Instant::now();
        let mut t = tracker(t0, Some(2), None);
        t.sent(3, 30);
        assert!(t.start_if_due(t0).is_some());
        check!(t.settle(t0, Ok(&[])) == Settled::Continue);
        let retry = t.start_if_due(t0 + INTERVAL).expect("due");
        check!(retry.taken.messages == 3);
    }

    #[test]
    fn a_fenced_commit_stops_the_writer() {
        let t0 = Instant::now();
        let mut t = tracker(t0, Some(2), None);
        assert!(t.start_if_due(t0).is_some());
        let fenced = [CommitOutcome::Fenced {
            current: Some(Epoch(7)),
        }];
        check!(
            t.settle(t0, Ok(&fenced))
                == Settled::Fenced {
                    current: Some(Epoch(7))
                }
        );
    }

    #[test]
    fn written_never_moves_back() {
        let mut t = tracker(Instant::now(), Some(10), Some(10));
        t.covered(Some(4));
        t.covered(None);
        check!(t.written() == Some(10));
    }

    #[test]
    fn a_session_counting_totals_sends_them_whole_with_every_commit() {
        let t0 = Instant::now();
        let mut t = CommitTracker::new(INTERVAL, t0, Some(77));
        t.resumed(Some(0), Some(0));
        t.sent(10, 100);
        t.covered(Some(9));
        let first = t.start_if_due(t0).expect("due");
        let totals = |messages, bytes| CommitCounters::Totals {
            session: 77,
            totals: UnitCounters {
                messages,
                bytes,
                ..Default::default()
            },
        };
        check!(first.counters == totals(10, 100));
        // Failed: the next commit carries the same totals plus what came since, never less.
        t.settle(t0, Err(&failure()));
        t.sent(5, 50);
        t.covered(Some(14));
        let retry = t.start_if_due(t0 + COMMIT_RETRY_DELAY).expect("due");
        check!(retry.counters == totals(15, 150));
        t.settle(t0 + COMMIT_RETRY_DELAY, Ok(&committed()));
        t.sent(1, 10);
        t.covered(Some(15));
        let next = t
            .start_if_due(t0 + COMMIT_RETRY_DELAY + INTERVAL)
            .expect("due");
        check!(next.counters == totals(16, 160));
    }

    #[test]
    fn a_session_counting_since_the_previous_commit_sends_what_it_took() {
        let t0 = Instant::now();
        let mut t = CommitTracker::new(INTERVAL, t0, None);
        t.resumed(Some(0), Some(0));
        t.sent(3, 30);
        t.covered(Some(3));
        let request = t.start_if_due(t0).expect("due");
        check!(request.counters == CommitCounters::Since(request.taken));
        check!(request.taken.messages == 3);
    }
}
