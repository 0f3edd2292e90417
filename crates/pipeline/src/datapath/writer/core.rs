//! The writer's state between two IO calls, and every decision it takes on their answers: what
//! a resume sets up, when the downstream tail must be read again before a send, what a re-read
//! tail means (including that the target lost what it acknowledged), what a send's answer and
//! a handled batch change, which commit to make, how long to wait after a failure or a veto
//! and when to give up.
//!
//! Pure: no clock, no socket, no task. The node's writer task (`writer::run`) drives it with
//! tokio and the clusters; the deterministic simulator (`crates/sim`, through `sim_support`)
//! drives the same core with simulated time, targets and failures. A change to what the writer
//! decides is made here once, and simulated without touching the simulator; what stays in each
//! driver is how it waits and does IO.

use std::time::{Duration, Instant};

use replicator_model::{Epoch, Offset, ProgressCommit, UnitProgress, WorkUnit};
use replicator_sdk::Confirmed;

use super::commit::{CommitRequest, CommitTracker, Settled};
use super::landed::LandedCheck;
use super::resume::{Position, ResumePlan, ScanEnd, TailOutcome};
use super::send::SendVeto;
use crate::backoff::Backoff;
use crate::control::ControlError;
use crate::datapath::offset_maps::{lock_map, SharedOffsetMap};
use crate::datapath::translate::{Copied, OffsetMap};
use crate::error::LandedMismatch;
use crate::provenance::History;

/// How long a writer whose lease is not valid long enough waits before looking again.
pub(crate) const LEASE_RECHECK: Duration = Duration::from_millis(20);

/// One writer's copy of one unit under one epoch, between IO calls.
#[derive(Debug)]
pub(crate) struct WriterCore {
    unit: WorkUnit,
    epoch: Epoch,
    commits: CommitTracker,
    /// Backoff of transient failures (resume, tail re-read and send).
    backoff: Backoff,
    /// How long a streak of failures may last before the writer gives up (`retry_budget`).
    retry_budget: Duration,
    /// Label of the upstream history being copied ([`History::label`]).
    history_label: u64,
    /// The resume's repair while it lasts: the confirmed messages it did not find downstream,
    /// read again, and how many of them were sent again so far.
    recopy: Option<Recopied>,
    /// A send failed in a way that may have appended it: re-read the tail before sending again.
    resync: bool,
    /// Whether the target's send confirmations (Iggy 0.9) follow this writer's own sends.
    landed: LandedCheck,
    /// Where this writer records what it sent, when its flow syncs consumer groups.
    offset_map: Option<SharedOffsetMap>,
    /// The upstream offset of the last message of ours known to be downstream: the tail the
    /// resume found, then the last one this writer's sends were acknowledged for (skipped
    /// messages excluded). A tail re-read that finds less means the target lost messages it
    /// had acknowledged, also when this writer had not sent anything yet (found by the
    /// simulator, seed 194: a target restarted between the resume and the first send, without
    /// the copies the resume had found, and the writer went on after them, leaving a hole).
    last_copied: Option<Offset>,
}

/// The re-read of the downstream tail a writer owes before its next send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rescan {
    /// Creation time (µs) of the upstream topic copied: the scan looks for its copies.
    pub(crate) created_at: u64,
    /// The last position known downstream, which the scan looks for without a bound.
    pub(crate) reference: Option<Position>,
}

/// A re-read tail holds less than the target acknowledged to this writer: it lost messages
/// (restarted without persisting them). The writer's reader is past them, so the pair ends and
/// the next one's resume copies them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The upstream offset of the last message the target acknowledged to this writer.
    pub(crate) last_copied: Offset,
    /// The upstream offset of the last copy the target still holds (`None`: none).
    pub(crate) tail: Option<Offset>,
}

/// A batch the writer is done with: sent whole (or nothing of it needed sending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handled {
    /// Messages acknowledged downstream and their bytes; `None` when nothing was sent.
    pub(crate) sent: Option<(u64, u64)>,
    /// Of them, messages the resume found confirmed but not downstream ([`WriterCore::recopy_until`]).
    pub(crate) recopied: u64,
    /// The batch's last upstream offset: downstream now covers everything up to it.
    pub(crate) last_offset: Offset,
    /// The batch came after offsets lost to retention.
    pub(crate) gap: bool,
}

/// A resume's repair of the confirmed messages `from..=to` it did not find downstream: either
/// the target lost them (it acknowledged them before it persisted them), or they were never
/// written because loop prevention skipped them (they came from the target, as in a two-way
/// pair, where the newest copy downstream can lie well before the confirmed offset). Which,
/// only reading them again tells: the writer counts in `resent` what it sends of them, and
/// once it has handled the whole range, `resent` is what was lost (the others were skipped by
/// loop prevention: nothing of them was lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recopied {
    pub(crate) from: Offset,
    pub(crate) to: Offset,
    pub(crate) resent: u64,
}

impl WriterCore {
    /// The writer of `unit` under `epoch`, before its resume: it retries failures with
    /// `backoff` for as long as a streak lasts at most `retry_budget`.
    pub(crate) fn new(
        unit: WorkUnit,
        epoch: Epoch,
        commits: CommitTracker,
        backoff: Backoff,
        retry_budget: Duration,
    ) -> Self {
        Self {
            unit,
            epoch,
            commits,
            backoff,
            retry_budget,
            history_label: 0,
            recopy: None,
            resync: false,
            landed: LandedCheck::default(),
            offset_map: None,
            last_copied: None,
        }
    }

    /// The resume decided `plan` after the tail scan found `tail` (`None`: provenance is off,
    /// no scan); `offset_map`: where sends are recorded for the consumer-group sync.
    pub(crate) fn resumed(
        &mut self,
        plan: &ResumePlan,
        tail: Option<TailOutcome>,
        offset_map: Option<SharedOffsetMap>,
    ) {
        self.recopy = plan.loss.map(|loss| Recopied {
            from: loss.from,
            to: loss.to,
            resent: 0,
        });
        self.history_label = plan.history.label();
        self.last_copied = match tail {
            Some(TailOutcome::Hit(hit)) if hit.position.resets == plan.history.resets => {
                Some(hit.position.offset)
            }
            _ => None,
        };
        self.offset_map = offset_map;
        self.commits.resumed(plan.written, plan.confirmed);
    }

    /// Label of the upstream history copied: stamped on every message, committed with every
    /// offset.
    pub(crate) fn history_label(&self) -> u64 {
        self.history_label
    }

    /// The last upstream offset known downstream: a batch drops what is up to it.
    pub(crate) fn written(&self) -> Option<Offset> {
        self.commits.written()
    }

    /// The end of the loss the resume repairs: messages up to it are re-copies.
    pub(crate) fn recopy_until(&self) -> Option<Offset> {
        self.recopy.map(|r| r.to)
    }

    /// The map the consumer-group sync translates with, if the flow syncs groups.
    pub(crate) fn offset_map(&self) -> Option<&SharedOffsetMap> {
        self.offset_map.as_ref()
    }

    /// The tail re-read owed before the next send, if the previous one may have landed.
    pub(crate) fn rescan(&self) -> Option<Rescan> {
        if !self.resync {
            return None;
        }
        let copying = History::from_label(self.history_label);
        Some(Rescan {
            created_at: copying.created_at,
            reference: self.commits.written().map(|offset| Position {
                resets: copying.resets,
                offset,
            }),
        })
    }

    /// The re-read owed found `tail`, the partition ending at `next_down`. `Err` when the
    /// target lost messages it acknowledged: the pair must end.
    pub(crate) fn rescanned(
        &mut self,
        tail: TailOutcome,
        next_down: Offset,
    ) -> std::result::Result<(), Lost> {
        let copying = History::from_label(self.history_label);
        let last = match tail {
            TailOutcome::Hit(hit) if hit.position.resets == copying.resets => {
                self.commits.covered(Some(hit.position.offset));
                Some(Copied {
                    down: hit.downstream,
                    up: hit.position.offset,
                })
            }
            _ => None,
        };
        let emptied = matches!(tail, TailOutcome::Absent(ScanEnd::Empty));
        if let Some(copied) = self.last_copied {
            if last.is_some_and(|l| l.up < copied) || (last.is_none() && emptied) {
                return Err(Lost {
                    last_copied: copied,
                    tail: last.map(|l| l.up),
                });
            }
        }
        // The consumer-group sync places this writer's sends from here on.
        if let Some(map) = &self.offset_map {
            lock_map(map).resynced(last, next_down);
        }
        self.resync = false;
        self.landed.forget();
        Ok(())
    }

    /// The target acknowledged a send to `partition` of the messages copying upstream
    /// `offsets` (in send order), with `confirmed` saying where it landed (Iggy 0.9; empty on
    /// 0.8). `Err` when it landed elsewhere than after the previous send: the outcome counts
    /// as unknown ([`WriterCore::send_unsure`] is applied).
    pub(crate) fn acknowledged(
        &mut self,
        partition: u32,
        confirmed: &[Confirmed],
        mut offsets: impl DoubleEndedIterator<Item = Offset> + Clone,
    ) -> std::result::Result<(), LandedMismatch> {
        if let Err(mismatch) = self.landed.confirm(partition, confirmed) {
            self.send_unsure();
            return Err(mismatch);
        }
        // What the consumer-group sync translates with.
        if let Some(map) = &self.offset_map {
            lock_map(map).sent(offsets.clone());
        }
        if let Some(last) = offsets.next_back() {
            self.last_copied = Some(last);
        }
        Ok(())
    }

    /// A send failed in a way that may have appended it (or it landed where something else
    /// had appended before it): the tail is re-read before the next send.
    pub(crate) fn send_unsure(&mut self) {
        self.resync = true;
        if let Some(map) = &self.offset_map {
            lock_map(map).unsure();
        }
    }

    /// The writer is done with a batch: counts what was sent and moves what downstream covers.
    /// Returns how the resume's repair ended when this batch completed it.
    pub(crate) fn handled(&mut self, batch: Handled) -> Option<Recopied> {
        if let Some((messages, bytes)) = batch.sent {
            self.commits.sent(messages, bytes);
        }
        if batch.gap {
            self.commits.gap();
        }
        self.commits.covered(Some(batch.last_offset));
        let recopy = self.recopy.as_mut()?;
        recopy.resent += batch.recopied;
        if batch.last_offset < recopy.to {
            return None;
        }
        self.recopy.take()
    }

    /// A transient failure at `now` (of the resume, a tail re-read or a send), counted with
    /// the next commit: how long to wait before trying again, or `None` once the streak of
    /// failures outlasted the retry budget, when the writer gives up (its pair ends with the
    /// error, and the coordinator starts the next one after its own backoff).
    pub(crate) fn failed(&mut self, now: Instant) -> Option<Duration> {
        self.commits.error();
        self.backoff.on_failure(now, self.retry_budget)
    }

    /// An attempt succeeded (a resume, a send): the next failure starts a new streak.
    pub(crate) fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// What a send refused by `veto` leaves: how long to hold the batch before looking again
    /// (the lease may be renewed meanwhile), or `None` when the writer ends (the unit is no
    /// longer this node's under its epoch).
    pub(crate) fn vetoed(&self, veto: SendVeto) -> Option<Duration> {
        match veto {
            SendVeto::EpochNotCurrent => None,
            SendVeto::LeaseExpiring => Some(LEASE_RECHECK),
        }
    }

    /// When the next commit held back by the commit interval is due.
    pub(crate) fn commit_due_at(&self) -> Option<Instant> {
        self.commits.due_at()
    }

    /// The commit to start at `now`, if one is due (at most one is in flight).
    pub(crate) fn commit_if_due(&mut self, now: Instant) -> Option<ProgressCommit> {
        let request = self.commits.start_if_due(now)?;
        Some(self.commit(request))
    }

    /// The final commit of a stopping writer, without waiting for the commit interval.
    pub(crate) fn final_commit(&mut self, now: Instant) -> Option<ProgressCommit> {
        let request = self.commits.start_final(now)?;
        Some(self.commit(request))
    }

    fn commit(&self, request: CommitRequest) -> ProgressCommit {
        ProgressCommit {
            unit: self.unit.clone(),
            epoch: self.epoch,
            offset: request.offset,
            history_label: self.history_label,
            counters: request.counters,
        }
    }

    /// Applies the answer to the commit in flight.
    pub(crate) fn settle(
        &mut self,
        now: Instant,
        answer: std::result::Result<&[replicator_model::CommitOutcome], &ControlError>,
    ) -> Settled {
        self.commits.settle(now, answer)
    }
}

/// The offset map a writer resuming under `plan` records its sends in, the downstream
/// partition ending at `next_down`.
pub(crate) fn offset_map(
    plan: &ResumePlan,
    progress: Option<UnitProgress>,
    next_down: Offset,
) -> OffsetMap {
    let copied_before = plan.written.is_some() || progress.is_some_and(|p| p.confirmed.is_some());
    OffsetMap::new(plan.history.label(), next_down, copied_before)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use assert2::check;
    use replicator_model::{CommitOutcome, InitialOffset};
    use replicator_sdk::Place;

    use super::*;
    use crate::datapath::translate::Lookup;
    use crate::datapath::writer::resume::{plan, PartitionExtent, ResumeFacts, TailCheck, TailHit};

    const CREATED: u64 = 1_700_000_000_000_000;
    const BUDGET: Duration = Duration::from_secs(30);

    fn unit() -> WorkUnit {
        WorkUnit {
            flow: "f".into(),
            stream: "s".into(),
            topic: "t".into(),
            partition: 1,
        }
    }

    fn hit(down: Offset, up: Offset) -> TailOutcome {
        TailOutcome::Hit(TailHit {
            downstream: down,
            position: Position {
                resets: 0,
                offset: up,
            },
        })
    }

    /// A writer of a partition holding 0..=199 and its resume plan, after it found copies of
    /// 0..=`up` at 0..=`up` downstream with `confirmed` committed before.
    fn planned(
        confirmed: Option<Offset>,
        up: Offset,
    ) -> (WriterCore, ResumePlan, TailOutcome, Instant) {
        let now = Instant::now();
        let commits = CommitTracker::new(Duration::from_millis(100), now, None);
        let backoff = Backoff::new(crate::params::BackoffParams::default(), 7);
        let core = WriterCore::new(unit(), Epoch(3), commits, backoff, BUDGET);
        let tail = hit(up, up);
        let plan = plan(&ResumeFacts {
            progress: confirmed.map(|confirmed| UnitProgress {
                confirmed: Some(confirmed),
                history_label: CREATED,
                counters: Default::default(),
            }),
            created_at: CREATED,
            tail: Some(tail),
            tail_check: TailCheck::Same,
            initial: InitialOffset::Earliest,
            extent: PartitionExtent {
                messages_count: 200,
                current_offset: 199,
            },
            reset: None,
            recorded: None,
        })
        .expect("plan");
        (core, plan, tail, now)
    }

    /// A writer that resumed with `confirmed` but found its newest copy downstream at `tail`
    /// (a downstream loss, or copies skipped by loop prevention).
    fn resumed_behind(confirmed: Offset, tail: Offset) -> WriterCore {
        let (mut core, plan, found, _) = planned(Some(confirmed), tail);
        core.resumed(&plan, Some(found), None);
        core
    }

    fn batch(last_offset: Offset, recopied: u64) -> Handled {
        Handled {
            sent: (recopied > 0).then_some((recopied, recopied * 100)),
            recopied,
            last_offset,
            gap: false,
        }
    }

    #[test]
    fn confirmed_messages_loop_prevention_skipped_are_no_loss() {
        // A two-way pair: 50..=99 came from the target, so nothing of them was written.
        let mut core = resumed_behind(99, 49);
        check!(core.recopy_until() == Some(99));
        check!(core.handled(batch(79, 0)) == None);
        check!(
            core.handled(batch(120, 0))
                == Some(Recopied {
                    from: 50,
                    to: 99,
                    resent: 0
                })
        );
        check!(core.recopy_until() == None);
        check!(core.handled(batch(130, 0)) == None, "reported once");
    }

    #[test]
    fn confirmed_messages_sent_again_are_counted_as_a_loss_once_the_range_is_handled() {
        let mut core = resumed_behind(99, 49);
        check!(core.handled(batch(69, 20)) == None);
        check!(
            core.handled(batch(99, 5))
                == Some(Recopied {
                    from: 50,
                    to: 99,
                    resent: 25
                })
        );
    }

    #[test]
    fn a_resume_that_found_every_confirmed_copy_repairs_nothing() {
        let mut core = resumed_behind(99, 99);
        check!(core.recopy_until() == None);
        check!(core.handled(batch(150, 0)) == None);
    }

    /// A writer resumed after finding copies of 0..=`up` at 0..=`up` downstream.
    fn resumed_after(up: Offset) -> (WriterCore, SharedOffsetMap, Instant) {
        let (mut core, plan, tail, now) = planned(None, up);
        let map = Arc::new(Mutex::new(offset_map(&plan, None, up + 1)));
        core.resumed(&plan, Some(tail), Some(map.clone()));
        (core, map, now)
    }

    fn at(base_offset: u64, messages: u32) -> Confirmed {
        Confirmed {
            messages,
            places: vec![Place {
                partition: 1,
                base_offset,
            }],
        }
    }

    #[test]
    fn a_resume_sets_the_history_and_what_is_downstream() {
        let (core, _, _) = resumed_after(9);
        assert_eq!(core.history_label(), CREATED);
        assert_eq!(core.written(), Some(9));
        assert_eq!(core.rescan(), None, "nothing unsure yet");
    }

    #[test]
    fn an_acknowledged_send_is_recorded_and_committed_with_its_history() {
        let (mut core, map, now) = resumed_after(9);
        core.acknowledged(1, &[at(10, 5)], 10..15).expect("fits");
        core.handled(Handled {
            sent: Some((5, 500)),
            recopied: 0,
            last_offset: 14,
            gap: false,
        });
        assert_eq!(core.written(), Some(14));
        assert!(matches!(lock_map(&map).lookup(12), Lookup::Found(c) if c.down == 12));
        let commit = core.commit_if_due(now).expect("due");
        assert_eq!((commit.offset, commit.history_label), (14, CREATED));
        assert_eq!(commit.epoch, Epoch(3));
        assert_eq!(
            core.commit_if_due(now),
            None,
            "one commit in flight at a time"
        );
        let settled = core.settle(now, Ok(&[CommitOutcome::Committed]));
        assert_eq!(settled, Settled::Continue);
    }

    #[test]
    fn a_send_that_landed_elsewhere_makes_the_writer_reread_the_tail() {
        let (mut core, map, _) = resumed_after(9);
        core.acknowledged(1, &[at(10, 5)], 10..15).expect("fits");
        let err = core
            .acknowledged(1, &[at(20, 5)], 15..20)
            .expect_err("a gap");
        assert_eq!(
            err,
            LandedMismatch::Offset {
                expected: 15,
                landed: 20
            }
        );
        assert_eq!(
            core.rescan(),
            Some(Rescan {
                created_at: CREATED,
                reference: Some(Position {
                    resets: 0,
                    offset: 9
                })
            })
        );
        // Past what was known before: the send that landed elsewhere may have appended more.
        assert!(matches!(lock_map(&map).lookup(17), Lookup::Unknown));
        // The re-read finds the second send after all: the writer goes on after it.
        core.rescanned(hit(24, 19), 25).expect("nothing lost");
        assert_eq!(core.rescan(), None);
        assert_eq!(core.written(), Some(19));
        assert!(matches!(lock_map(&map).lookup(19), Lookup::Found(c) if c.down == 24));
    }

    #[test]
    fn a_tail_behind_what_was_acknowledged_is_a_loss() {
        let (mut core, _, _) = resumed_after(9);
        core.acknowledged(1, &[], 10..15)
            .expect("0.8 confirms nothing");
        core.send_unsure();
        assert_eq!(
            core.rescanned(hit(11, 11), 12),
            Err(Lost {
                last_copied: 14,
                tail: Some(11)
            })
        );
        assert_eq!(
            core.rescanned(TailOutcome::Absent(ScanEnd::Empty), 0),
            Err(Lost {
                last_copied: 14,
                tail: None
            }),
            "an emptied partition lost everything"
        );
    }

    #[test]
    fn the_copies_the_resume_found_count_as_acknowledged() {
        // Seed 194 of the simulator: the target restarts between the resume and the first
        // send, without the copies the resume found.
        let (mut core, _, _) = resumed_after(9);
        core.send_unsure();
        assert_eq!(
            core.rescanned(hit(4, 4), 5),
            Err(Lost {
                last_copied: 9,
                tail: Some(4)
            })
        );
    }

    #[test]
    fn a_final_commit_does_not_wait_for_the_interval() {
        let (mut core, _, now) = resumed_after(9);
        core.handled(Handled {
            sent: None,
            recopied: 0,
            last_offset: 12,
            gap: true,
        });
        let first = core.commit_if_due(now).expect("due");
        core.settle(now, Ok(&[CommitOutcome::Committed]));
        core.handled(Handled {
            sent: Some((1, 10)),
            recopied: 0,
            last_offset: 13,
            gap: false,
        });
        assert_eq!(core.commit_if_due(now), None, "held back by the interval");
        let last = core.final_commit(now).expect("final");
        assert_eq!((first.offset, last.offset), (12, 13));
    }

    #[test]
    fn failures_back_off_until_the_streak_outlasts_the_budget() {
        let (mut core, _, now) = resumed_after(9);
        let first = core.failed(now).expect("within the budget");
        let later = core.failed(now + BUDGET).expect("the budget's last moment");
        check_grows(first, later);
        assert_eq!(core.failed(now + BUDGET + Duration::from_millis(1)), None);
        core.succeeded();
        assert!(
            core.failed(now + BUDGET * 2).is_some(),
            "a success starts a new streak"
        );
        let commit = core.final_commit(now).expect("final");
        assert!(
            matches!(commit.counters, replicator_model::CommitCounters::Since(c) if c.errors == 4),
            "every failure is counted: {:?}",
            commit.counters
        );
    }

    fn check_grows(first: Duration, later: Duration) {
        assert!(later >= first, "{later:?} after {first:?}");
    }

    #[test]
    fn a_lease_veto_holds_the_batch_an_epoch_veto_ends_the_writer() {
        let (core, _, _) = resumed_after(9);
        assert_eq!(core.vetoed(SendVeto::LeaseExpiring), Some(LEASE_RECHECK));
        assert_eq!(core.vetoed(SendVeto::EpochNotCurrent), None);
    }
}
