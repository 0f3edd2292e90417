//! Where a unit resumes, and how far back the writer looks for it downstream.
//!
//! Pure: the writer's IO loop fetches the facts (the upstream partition's extent, the confirmed
//! progress, pages of downstream messages, whether the upstream message at the tail is still
//! the one copied) and feeds them in. [`plan`] decides the resume point, the history
//! ([`History`]) the unit copies and what went wrong since the unit last ran (the upstream
//! partition was reset, the target lost acknowledged messages); [`TailScan`] decides which page
//! of the downstream partition to read next and when to stop looking for the last message this
//! flow wrote there.

use replicator_model::{InitialOffset, Offset, OffsetReset, UnitProgress, UnitStart};

use crate::datapath::offsets::ReadFrom;
use crate::provenance::History;

/// Messages per poll while scanning the downstream tail.
const TAIL_CHUNK: u32 = 1000;

/// The upstream partition's extent, from `get_topic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionExtent {
    /// Messages stored (0 = empty).
    pub(crate) messages_count: u64,
    /// Offset of the last message (meaningless when empty).
    pub(crate) current_offset: Offset,
}

impl PartitionExtent {
    /// The offset the next appended message gets.
    pub(crate) fn next_offset(&self) -> Offset {
        if self.messages_count == 0 {
            0
        } else {
            self.current_offset.saturating_add(1)
        }
    }

    /// Whether the partition no longer reaches `offset`, which this unit copied: its offsets
    /// went back, which only a reset does (a purge, or a server that lost its newest
    /// messages); retention removes the oldest messages and keeps the offsets. An empty
    /// partition at offset 0 counts as reset too (a purged partition looks like that; so would
    /// one whose every message retention removed, which Iggy does not do to the active
    /// segment).
    fn went_below(&self, offset: Offset) -> bool {
        self.current_offset < offset || (self.messages_count == 0 && self.current_offset == 0)
    }
}

/// A place in a unit's copy of one upstream topic: the partition's history (resets since the
/// topic was created) and the upstream offset in it. A later history orders after an earlier
/// one whatever the offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    /// The history: resets since the topic was created ([`History::resets`]).
    pub(crate) resets: u16,
    /// The upstream offset.
    pub(crate) offset: Offset,
}

/// The confirmed position of the unit in the topic created at `created_at`: the reference the
/// tail scan looks for ([`TailScan::start`]); `None` when nothing is confirmed for this topic
/// (never, or only for an earlier topic of the same name).
pub(crate) fn reference(progress: Option<UnitProgress>, created_at: u64) -> Option<Position> {
    let p = progress?;
    let history = History::from_label(p.history_label);
    if !history.is_of(created_at) {
        return None;
    }
    p.confirmed.map(|offset| Position {
        resets: history.resets,
        offset,
    })
}

/// Whether the upstream message at a tail hit's offset is still the one copied there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TailCheck {
    /// Same id, origin timestamp, payload and user headers.
    Same,
    /// Upstream holds another message at that offset: its history was reset and refilled.
    Differs,
    /// Not compared (no hit, or upstream no longer holds that offset).
    Unknown,
}

/// What a starting writer found out before it decides where to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResumeFacts {
    /// The unit's confirmed progress, `None` if it was never committed.
    pub(crate) progress: Option<UnitProgress>,
    /// Creation time (µs) of the upstream topic as it is now.
    pub(crate) created_at: u64,
    /// What the scan of the downstream tail found ([`TailScan`]); `None` when provenance is
    /// off.
    pub(crate) tail: Option<TailOutcome>,
    /// For a hit: whether upstream still holds the message copied there.
    pub(crate) tail_check: TailCheck,
    /// The flow's start for a unit without progress.
    pub(crate) initial: InitialOffset,
    /// The upstream partition now.
    pub(crate) extent: PartitionExtent,
    /// Where an operator reset the unit (`flow reset`), if no owner took it up yet.
    pub(crate) reset: Option<OffsetReset>,
    /// Where an earlier owner's copy started, when nothing was confirmed since.
    pub(crate) recorded: Option<UnitStart>,
}

/// Confirmed offsets the downstream partition no longer holds (inclusive range): the target
/// acknowledged them and lost them (Iggy 0.8 acknowledges before it persists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DownstreamLoss {
    /// First lost offset: one after the last message of ours found downstream, or the start of
    /// the history when none of it is left.
    pub(crate) from: Offset,
    /// The confirmed offset.
    pub(crate) to: Offset,
}

/// Where a unit resumes and what its writer starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResumePlan {
    /// Where the reader starts.
    pub(crate) from: ReadFrom,
    /// The history copied: stamped on every message and committed with every offset.
    pub(crate) history: History,
    /// The confirmed offset of that history.
    pub(crate) confirmed: Option<Offset>,
    /// The last offset of that history known downstream: the highest of `confirmed` and the
    /// tail, or the tail alone after a downstream loss.
    pub(crate) written: Option<Offset>,
    /// A confirmed offset of an earlier topic of the same name (deleted and created again),
    /// which no longer counts: the unit starts that topic from the initial offset.
    pub(crate) forgotten: Option<Offset>,
    /// The unit's last position when the upstream partition turned out to be reset (purged):
    /// the unit copies the partition's new history from offset 0 under the next history.
    pub(crate) reset: Option<Position>,
    /// Confirmed offsets the target lost: they are copied again (`from` is their first).
    pub(crate) loss: Option<DownstreamLoss>,
    /// The tail scan stopped at its bound without finding a message of ours: writes of an
    /// earlier owner further back that were never confirmed are copied again.
    pub(crate) scan_exhausted: bool,
    /// The start was worked out from the flow's initial offset just now: record it before
    /// the first poll, so that the next owner starts there too (`latest` moves).
    pub(crate) record: bool,
}

/// The upstream partition was reset more often than labels can count
/// ([`History::MAX_RESETS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResetsExhausted;

/// Decides where a unit resumes.
///
/// * The unit's position is the highest of its confirmed offset and the last message of ours
///   found downstream, both of the current topic (a confirmed offset of an earlier topic of
///   the same name is `forgotten`: that topic starts at the initial offset).
/// * If upstream no longer reaches that position, or holds another message at the tail's
///   offset, the partition was reset (purged): its new history is copied from offset 0 under
///   the next history, so nothing is skipped or labelled as the old history.
/// * If the newest message of ours downstream is below the confirmed offset (or the downstream
///   partition is empty, or holds only an older history of ours), the target lost
///   acknowledged messages: they are copied again from one after the tail (a first polled
///   offset above it is then a gap: upstream retention removed them too). A downstream
///   partition without any message of ours but with others is not attributed (provenance may
///   have been off, or the source alias renamed): the confirmed offset stands.
/// * After an operator's reset (`flow reset`) the unit starts where it says: nothing counts
///   as lost, and the tail only moves the start past copies downstream at or after it, unless
///   the reset allows duplicates (then it is copied again from there, whatever the target
///   holds).
/// * Otherwise the unit resumes after its position; without one at the flow's initial offset
///   (and then a first polled offset above it is not a gap: the server clamps to what it
///   retains).
pub(crate) fn plan(facts: &ResumeFacts) -> Result<ResumePlan, ResetsExhausted> {
    let topic = History::first(facts.created_at);
    let confirmed = reference(facts.progress, facts.created_at);
    let forgotten = match facts.progress {
        Some(p) if confirmed.is_none() => p.confirmed,
        _ => None,
    };
    let hit = match facts.tail {
        Some(TailOutcome::Hit(hit)) => Some(hit.position),
        _ => None,
    };
    let known = confirmed.max(hit);
    let resets = known.map_or(0, |k| k.resets);
    let current = History { resets, ..topic };
    let refilled =
        hit.is_some_and(|h| h.resets == resets) && facts.tail_check == TailCheck::Differs;
    if let Some(last) = known.filter(|k| refilled || facts.extent.went_below(k.offset)) {
        return Ok(ResumePlan {
            from: ReadFrom {
                offset: 0,
                contiguous: false,
            },
            history: current.next().ok_or(ResetsExhausted)?,
            confirmed: None,
            written: None,
            forgotten,
            reset: Some(last),
            loss: None,
            scan_exhausted: false,
            record: false,
        });
    }
    let confirmed = confirmed.filter(|p| p.resets == resets).map(|p| p.offset);
    let tail = hit.filter(|h| h.resets == resets).map(|h| h.offset);
    if let Some(reset) = facts.reset {
        let past = tail.filter(|w| !reset.allow_duplicates && *w >= reset.next);
        return Ok(ResumePlan {
            from: past.map_or(
                ReadFrom {
                    offset: reset.next,
                    contiguous: false,
                },
                after,
            ),
            history: current,
            confirmed,
            written: past,
            forgotten,
            reset: None,
            loss: None,
            scan_exhausted: false,
            record: false,
        });
    }
    // Where an earlier owner started this history's copy, nothing confirmed since.
    let recorded = facts
        .recorded
        .filter(|s| confirmed.is_none() && s.history_label == current.label())
        .map(|s| s.next);
    // Where this history's copy began, as far as the unit can tell.
    let start = match facts.initial {
        InitialOffset::At(offset) if resets == 0 => offset,
        _ => 0,
    };
    let loss = match (confirmed, facts.tail) {
        (Some(c), Some(TailOutcome::Hit(_))) => match tail {
            Some(w) if w < c => Some(DownstreamLoss { from: w + 1, to: c }),
            Some(_) => None,
            // Only an earlier history of ours is left downstream.
            None => Some(DownstreamLoss { from: start, to: c }),
        },
        (Some(c), Some(TailOutcome::Absent(ScanEnd::Empty))) => {
            Some(DownstreamLoss { from: start, to: c })
        }
        _ => None,
    }
    .filter(|l| l.from <= l.to);
    let (written, from) = match (loss, tail) {
        (Some(l), Some(w)) if w + 1 == l.from => (Some(w), after(w)),
        (Some(l), _) => (
            None,
            ReadFrom {
                offset: l.from,
                contiguous: false,
            },
        ),
        (None, _) => match confirmed.max(tail) {
            Some(w) => (Some(w), after(w)),
            None => (
                None,
                ReadFrom {
                    offset: recorded.unwrap_or(match facts.initial {
                        _ if resets > 0 => 0,
                        InitialOffset::Earliest => 0,
                        InitialOffset::Latest => facts.extent.next_offset(),
                        InitialOffset::At(offset) => offset,
                    }),
                    contiguous: false,
                },
            ),
        },
    };
    Ok(ResumePlan {
        from,
        history: current,
        confirmed,
        written,
        forgotten,
        reset: None,
        loss,
        scan_exhausted: matches!(facts.tail, Some(TailOutcome::Absent(ScanEnd::Bound))),
        record: written.is_none() && loss.is_none() && recorded.is_none(),
    })
}

/// Reading on after `last`, which is downstream: a jump forward is a gap.
fn after(last: Offset) -> ReadFrom {
    ReadFrom {
        offset: last.saturating_add(1),
        contiguous: true,
    }
}

/// One downstream message as the tail scan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TailEntry {
    /// Its offset in the downstream partition.
    pub(crate) offset: Offset,
    /// Its position, if this flow wrote it for the current topic (any of its histories);
    /// `None` for anything else (other producers, reverse flows, earlier topics of the same
    /// name).
    pub(crate) ours: Option<Position>,
}

/// A message of ours found downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TailHit {
    /// Its downstream offset.
    pub(crate) downstream: Offset,
    /// What it is a copy of.
    pub(crate) position: Position,
}

/// Why a scan found no message of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScanEnd {
    /// The downstream partition is empty.
    Empty,
    /// Every message down to the partition's first (offset 0) was read.
    Beginning,
    /// Retention removed the partition's oldest messages: what was there is unknown.
    Retention,
    /// The scan's bound was reached (only without a confirmed offset to look for).
    Bound,
}

/// What a finished scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TailOutcome {
    /// The last message of ours (see [`TailScan`]).
    Hit(TailHit),
    /// No message of ours.
    Absent(ScanEnd),
}

/// The next page the tail scan needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TailPoll {
    /// The newest `count` messages of the partition.
    Last {
        /// How many.
        count: u32,
    },
    /// Up to `count` messages from `offset` on.
    From {
        /// First downstream offset.
        offset: Offset,
        /// How many.
        count: u32,
    },
}

/// What the tail scan wants after a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TailStep {
    /// Read this page next.
    Poll(TailPoll),
    /// Done.
    Done(TailOutcome),
}

/// What a window (or the newest page) held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Seen {
    /// Its first downstream offset.
    first: Option<Offset>,
    /// Its message of ours with the highest position (the newest one, unless a stale owner's
    /// late batch landed on top of newer ones).
    highest: Option<TailHit>,
    /// Messages in it.
    count: u64,
}

impl Seen {
    fn add(&mut self, entry: &TailEntry) {
        self.first.get_or_insert(entry.offset);
        self.count += 1;
        if let Some(position) = entry.ours {
            if self.highest.is_none_or(|h| position > h.position) {
                self.highest = Some(TailHit {
                    downstream: entry.offset,
                    position,
                });
            }
        }
    }
}

/// Where the scan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanState {
    /// Waiting for the newest page.
    Newest,
    /// Reading the window `[start, end)` of downstream offsets, from `at` on, in pages (the
    /// server may return fewer messages than asked for).
    Window {
        start: Offset,
        end: Offset,
        at: Offset,
        seen: Seen,
    },
}

/// What the scan looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The newest message of ours.
    Search,
    /// The last ones of ours are below the confirmed position: up to `left` more messages are
    /// read for one at or above it (a stale owner's late batch on top of newer ones), keeping
    /// the highest seen.
    Confirm { best: TailHit, left: u64 },
}

/// The backwards scan of a downstream partition for the last message this flow wrote: the
/// newest page first, then windows of [`TAIL_CHUNK`] messages further back.
///
/// The tail is the highest position of ours in the newest window that holds any (the newest
/// message of ours, unless a stale owner's late batch landed on top of newer ones).
///
/// * With a confirmed position to look for (`reference`), the scan has no bound: it stops at
///   the newest window with a message of ours, which is at or after the confirmed offset's
///   downstream position unless the target lost it, so it reads at most the messages appended
///   downstream since then, however many of them other producers wrote. If the tail found is
///   below the reference, `window` more messages are read for a higher one, and the highest
///   found is the tail.
/// * Without one (nothing confirmed for this topic yet), nothing says how far back earlier
///   writes could be: the scan reads at most `window` messages (rounded up to whole pages) and
///   then reports [`ScanEnd::Bound`].
///
/// Either way it stops at the partition's beginning (or where retention cut it).
#[derive(Debug, Clone)]
pub(crate) struct TailScan {
    /// Most messages to scan without a reference, or while confirming.
    window: u64,
    /// Messages per page.
    chunk: u32,
    /// The confirmed position.
    reference: Option<Position>,
    /// Messages scanned in finished pages and windows.
    scanned: u64,
    phase: Phase,
    state: ScanState,
}

impl TailScan {
    /// A scan for the last message of ours, bounded by `window` (at least 1) unless a confirmed
    /// `reference` is given, and its first page.
    pub(crate) fn start(window: u32, reference: Option<Position>) -> (Self, TailPoll) {
        let window = window.max(1);
        let scan = Self {
            window: u64::from(window),
            chunk: window.min(TAIL_CHUNK),
            reference,
            scanned: 0,
            phase: Phase::Search,
            state: ScanState::Newest,
        };
        (scan, Self::first_page(window))
    }

    /// The first page every scan bounded by `window` reads, whatever it looks for: the
    /// newest messages. A resume reads it before it knows what to look for (at the same time
    /// as the topics), one round trip less before its first send.
    pub(crate) fn first_page(window: u32) -> TailPoll {
        TailPoll::Last {
            count: window.clamp(1, TAIL_CHUNK),
        }
    }

    /// Messages read so far (finished pages and windows).
    pub(crate) fn scanned(&self) -> u64 {
        self.scanned
    }

    /// Takes the page asked for last (its messages in ascending offset order) and says what
    /// comes next.
    pub(crate) fn feed(&mut self, page: &[TailEntry]) -> TailStep {
        match self.state {
            ScanState::Newest => {
                let mut seen = Seen::default();
                page.iter().for_each(|e| seen.add(e));
                let Some(first) = seen.first else {
                    return TailStep::Done(TailOutcome::Absent(ScanEnd::Empty));
                };
                // The newest page starts where the partition's messages start, or above.
                self.judge(first, seen)
            }
            ScanState::Window {
                start,
                end,
                at,
                mut seen,
            } => {
                let mut last = None;
                for entry in page.iter().filter(|e| e.offset >= at && e.offset < end) {
                    seen.add(entry);
                    last = Some(entry.offset);
                }
                // The window goes on while pages make progress and do not reach its end.
                if let Some(next) = last.map(|l| l + 1).filter(|&next| next < end) {
                    self.state = ScanState::Window {
                        start,
                        end,
                        at: next,
                        seen,
                    };
                    return TailStep::Poll(TailPoll::From {
                        offset: next,
                        count: self.count_to(next, end),
                    });
                }
                self.judge(start, seen)
            }
        }
    }

    /// Judges a finished window that asked for messages from `start` on, then reads on below
    /// it or ends.
    fn judge(&mut self, start: Offset, seen: Seen) -> TailStep {
        self.scanned += seen.count;
        let (mut bounded, limit) = (self.reference.is_none(), self.window);
        match (self.phase, seen.highest) {
            (Phase::Search, Some(found)) => match self.reference {
                Some(reference) if found.position < reference => {
                    self.phase = Phase::Confirm {
                        best: found,
                        left: limit,
                    };
                }
                _ => return TailStep::Done(TailOutcome::Hit(found)),
            },
            (Phase::Search, None) => {}
            (Phase::Confirm { best, left }, highest) => {
                let best = match highest {
                    Some(h) if h.position > best.position => h,
                    _ => best,
                };
                let reached = self.reference.is_some_and(|r| best.position >= r);
                let left = left.saturating_sub(seen.count);
                if reached || left == 0 {
                    return TailStep::Done(TailOutcome::Hit(best));
                }
                self.phase = Phase::Confirm { best, left };
                bounded = false;
            }
        }
        let end = match seen.first {
            // Retention removed everything from `start` on: nothing older to scan.
            None => return self.finish(ScanEnd::Retention),
            Some(first) if first > start => return self.finish(ScanEnd::Retention),
            Some(0) => return self.finish(ScanEnd::Beginning),
            Some(first) => first,
        };
        if bounded && self.scanned >= limit {
            return self.finish(ScanEnd::Bound);
        }
        let start = end.saturating_sub(u64::from(self.chunk));
        self.state = ScanState::Window {
            start,
            end,
            at: start,
            seen: Seen::default(),
        };
        TailStep::Poll(TailPoll::From {
            offset: start,
            count: self.count_to(start, end),
        })
    }

    /// The end of a scan that ran out of messages: what it confirmed, or nothing found.
    fn finish(&self, end: ScanEnd) -> TailStep {
        TailStep::Done(match self.phase {
            Phase::Confirm { best, .. } => TailOutcome::Hit(best),
            Phase::Search => TailOutcome::Absent(end),
        })
    }

    /// Messages from `at` up to (not including) `end`, at most one page.
    fn count_to(&self, at: Offset, end: Offset) -> u32 {
        u32::try_from(end - at).map_or(self.chunk, |n| n.min(self.chunk))
    }
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};

    use super::*;

    const EMPTY: PartitionExtent = PartitionExtent {
        messages_count: 0,
        current_offset: 0,
    };
    const TEN: PartitionExtent = PartitionExtent {
        messages_count: 10,
        current_offset: 9,
    };
    /// Creation time of the topic as it is now.
    const NOW: u64 = 1_700_000_000;

    fn pos(resets: u16, offset: Offset) -> Position {
        Position { resets, offset }
    }

    fn hit(resets: u16, offset: Offset) -> Option<TailOutcome> {
        Some(TailOutcome::Hit(TailHit {
            downstream: 5000 + offset,
            position: pos(resets, offset),
        }))
    }

    /// Facts of the current topic's first history (no resets) with `confirmed` and a tail hit
    /// at `tail`.
    fn facts(
        confirmed: Option<Offset>,
        tail: Option<Offset>,
        initial: InitialOffset,
    ) -> ResumeFacts {
        ResumeFacts {
            progress: Some(UnitProgress {
                confirmed,
                history_label: NOW,
                counters: Default::default(),
            }),
            created_at: NOW,
            tail: match tail {
                Some(offset) => hit(0, offset),
                None => Some(TailOutcome::Absent(ScanEnd::Retention)),
            },
            tail_check: TailCheck::Same,
            initial,
            extent: TEN,
            reset: None,
            recorded: None,
        }
    }

    #[test]
    fn a_start_worked_out_from_the_initial_offset_is_recorded_and_kept_by_the_next_owner() {
        // The first owner: `latest` is the partition's end (10) now; record it.
        let first = plan_ok(&facts(None, None, InitialOffset::Latest));
        check!(first.from == at(10, false));
        check!(first.record);
        // The next owner, after more messages arrived (end 25) and before any commit: it
        // starts where the first one did, and records nothing.
        let mut next = facts(None, None, InitialOffset::Latest);
        next.extent = PartitionExtent {
            messages_count: 25,
            current_offset: 24,
        };
        next.recorded = Some(UnitStart {
            next: 10,
            history_label: label(0),
        });
        let p = plan_ok(&next);
        check!(p.from == at(10, false));
        check!(!p.record);
        // An empty partition's `latest` is 0, and it stays 0.
        next.recorded = Some(UnitStart {
            next: 0,
            history_label: label(0),
        });
        check!(plan_ok(&next).from == at(0, false));
        // Copies of the first owner downstream: after them, as always.
        next.tail = hit(0, 13);
        let p = plan_ok(&next);
        check!(p.from == at(14, true));
        check!(!p.record);
        // A start recorded for another history (the topic was recreated since) is not this
        // one's.
        let mut other = facts(None, None, InitialOffset::Latest);
        other.recorded = Some(UnitStart {
            next: 3,
            history_label: NOW - 1,
        });
        let p = plan_ok(&other);
        check!(p.from == at(10, false));
        check!(p.record);
        // Confirmed progress is what counts once there is some.
        let mut confirmed = facts(Some(6), Some(6), InitialOffset::Latest);
        confirmed.recorded = Some(UnitStart {
            next: 3,
            history_label: label(0),
        });
        let p = plan_ok(&confirmed);
        check!(p.from == at(7, true));
        check!(!p.record);
    }

    #[test]
    fn an_operator_reset_sets_the_start_and_is_never_a_loss() {
        let reset = |next, allow_duplicates| {
            Some(OffsetReset {
                next,
                allow_duplicates,
            })
        };
        // Forward over messages never copied: the confirmed offset was moved to just before
        // the start, which is above the tail; no loss is repaired.
        let mut skip = facts(Some(6), Some(3), InitialOffset::Earliest);
        skip.reset = reset(7, false);
        let p = plan_ok(&skip);
        check!(p.from == at(7, false));
        check!(p.loss.is_none());
        check!(p.written.is_none());
        // Without duplicates, copies downstream at or past the start move it on.
        let mut past = facts(Some(4), Some(8), InitialOffset::Earliest);
        past.reset = reset(5, false);
        let p = plan_ok(&past);
        check!(p.from == at(9, true));
        check!(p.written == Some(8));
        // Allowed duplicates: from the start, whatever the target holds.
        let mut again = facts(Some(1), Some(8), InitialOffset::Earliest);
        again.reset = reset(2, true);
        let p = plan_ok(&again);
        check!(p.from == at(2, false));
        check!(p.written.is_none());
        check!(p.confirmed == Some(1));
        // Back to the very beginning (nothing confirmed any more).
        let mut all = facts(None, Some(8), InitialOffset::Latest);
        all.reset = reset(0, true);
        check!(plan_ok(&all).from == at(0, false));
        // A purged upstream partition still wins: the reset named offsets of its old history.
        let mut purged = facts(Some(8), Some(8), InitialOffset::Earliest);
        purged.extent = EMPTY;
        purged.reset = reset(3, true);
        check!(plan_ok(&purged).reset == Some(pos(0, 8)));
    }

    fn label(resets: u16) -> u64 {
        History {
            created_at: NOW,
            resets,
        }
        .label()
    }

    fn plan_ok(facts: &ResumeFacts) -> ResumePlan {
        plan(facts).expect("labels left")
    }

    fn at(offset: Offset, contiguous: bool) -> ReadFrom {
        ReadFrom { offset, contiguous }
    }

    #[test]
    fn resume_after_highest_of_confirmed_and_tail() {
        let p = plan_ok(&facts(Some(5), Some(8), InitialOffset::Earliest));
        check!(p.from == at(9, true));
        check!(p.written == Some(8));
        check!(p.confirmed == Some(5));
        check!(p.history == History::first(NOW));
        check!(p.history.label() == NOW);
        check!(p.loss.is_none());
        check!(p.reset.is_none());
        check!(
            plan_ok(&facts(None, Some(0), InitialOffset::Latest))
                .from
                .offset
                == 1
        );
        check!(
            plan_ok(&facts(Some(3), None, InitialOffset::At(100)))
                .from
                .offset
                == 4
        );
        // Provenance off: the confirmed offset alone.
        let mut off = facts(Some(3), None, InitialOffset::Earliest);
        off.tail = None;
        check!(plan_ok(&off).from == at(4, true));
    }

    #[test]
    fn no_progress_starts_at_initial_offset_without_gap_detection() {
        let earliest = plan_ok(&facts(None, None, InitialOffset::Earliest));
        check!(earliest.from == at(0, false));
        check!(earliest.written.is_none());
        check!(
            plan_ok(&facts(None, None, InitialOffset::Latest))
                .from
                .offset
                == 10
        );
        let mut empty = facts(None, None, InitialOffset::Latest);
        empty.extent = EMPTY;
        check!(plan_ok(&empty).from.offset == 0);
        check!(
            plan_ok(&facts(None, None, InitialOffset::At(42)))
                .from
                .offset
                == 42
        );
        let mut never = facts(None, None, InitialOffset::At(42));
        never.progress = None;
        check!(plan_ok(&never).from.offset == 42);
        // An empty downstream partition without a confirmed offset is no loss.
        let mut fresh = facts(None, None, InitialOffset::Earliest);
        fresh.tail = Some(TailOutcome::Absent(ScanEnd::Empty));
        check!(plan_ok(&fresh).loss.is_none());
    }

    #[test]
    fn progress_of_an_earlier_topic_of_the_same_name_is_forgotten() {
        let mut recreated = facts(Some(500), None, InitialOffset::Earliest);
        recreated.created_at = NOW + 1;
        let p = plan_ok(&recreated);
        check!(p.from == at(0, false));
        check!(p.confirmed.is_none());
        check!(p.forgotten == Some(500));
        check!(p.history == History::first(NOW + 1));
        // Not a reset of the new topic, not a loss.
        check!(p.reset.is_none());
        check!(p.loss.is_none());
        // A tail of the new topic still counts.
        recreated.tail = hit(0, 7);
        check!(plan_ok(&recreated).from.offset == 8);
        // Nothing confirmed before: nothing forgotten to warn about.
        let mut fresh = facts(None, None, InitialOffset::Earliest);
        fresh.created_at = NOW + 1;
        check!(plan_ok(&fresh).forgotten.is_none());
        // A reset history of the earlier topic is forgotten as well.
        let mut purged_then_recreated = facts(Some(20), None, InitialOffset::Earliest);
        if let Some(p) = purged_then_recreated.progress.as_mut() {
            p.history_label = label(3);
        }
        purged_then_recreated.created_at = NOW + 1;
        check!(plan_ok(&purged_then_recreated).forgotten == Some(20));
    }

    #[test]
    fn reference_is_the_confirmed_position_of_the_current_topic() {
        let progress = |confirmed, history_label| {
            Some(UnitProgress {
                confirmed,
                history_label,
                counters: Default::default(),
            })
        };
        check!(reference(progress(Some(9), NOW), NOW) == Some(pos(0, 9)));
        check!(reference(progress(Some(9), label(2)), NOW) == Some(pos(2, 9)));
        check!(reference(progress(Some(9), NOW), NOW + 1).is_none());
        check!(reference(progress(None, NOW), NOW).is_none());
        check!(reference(None, NOW).is_none());
    }

    #[test]
    fn upstream_below_the_position_is_a_reset_copied_from_zero_as_the_next_history() {
        // Purged: the partition ends below what was copied.
        let mut purged = facts(Some(99), Some(99), InitialOffset::Latest);
        purged.extent = PartitionExtent {
            messages_count: 30,
            current_offset: 29,
        };
        let p = plan_ok(&purged);
        check!(p.from == at(0, false));
        check!(p.history == History::first(NOW).next().expect("room"));
        check!(p.history.label() != NOW);
        check!(p.reset == Some(pos(0, 99)));
        check!((p.confirmed, p.written, p.loss, p.forgotten) == (None, None, None, None));
        // Purged and empty.
        purged.extent = EMPTY;
        check!(plan_ok(&purged).reset == Some(pos(0, 99)));
        // Only offset 0 was copied: an empty partition at 0 is a reset too.
        let mut first_only = facts(Some(0), Some(0), InitialOffset::Earliest);
        first_only.extent = EMPTY;
        check!(plan_ok(&first_only).reset == Some(pos(0, 0)));
        // Retention keeps the offsets: no reset.
        let mut retained = facts(Some(9), Some(9), InitialOffset::Earliest);
        retained.extent = PartitionExtent {
            messages_count: 0,
            current_offset: 9,
        };
        check!(plan_ok(&retained).reset.is_none());
        check!(plan_ok(&retained).from == at(10, true));
        // An unconfirmed tail counts: the partition ends below it.
        let mut below_tail = facts(Some(5), Some(12), InitialOffset::Earliest);
        below_tail.extent = TEN;
        check!(plan_ok(&below_tail).reset == Some(pos(0, 12)));
    }

    #[test]
    fn another_message_upstream_at_the_tail_is_a_reset_refilled_past_the_position() {
        let mut refilled = facts(Some(9), Some(9), InitialOffset::Earliest);
        refilled.extent = PartitionExtent {
            messages_count: 150,
            current_offset: 149,
        };
        refilled.tail_check = TailCheck::Differs;
        let p = plan_ok(&refilled);
        check!(p.reset == Some(pos(0, 9)));
        check!(p.from == at(0, false));
        // Unknown (upstream no longer holds it): the offsets decide.
        refilled.tail_check = TailCheck::Unknown;
        check!(plan_ok(&refilled).reset.is_none());
        // A differing message under a tail of an earlier history says nothing about this one.
        let mut older = facts(Some(3), None, InitialOffset::Earliest);
        if let Some(p) = older.progress.as_mut() {
            p.history_label = label(1);
        }
        older.tail = hit(0, 9);
        older.tail_check = TailCheck::Differs;
        check!(plan_ok(&older).reset.is_none());
    }

    #[test]
    fn later_histories_continue_under_their_own_label() {
        // Confirmed after 1 reset, downstream after 1 reset: resume there.
        let mut second = facts(Some(4), None, InitialOffset::Latest);
        if let Some(p) = second.progress.as_mut() {
            p.history_label = label(1);
        }
        second.tail = hit(1, 6);
        let p = plan_ok(&second);
        check!(p.history.resets == 1);
        check!(p.from == at(7, true));
        check!(p.confirmed == Some(4));
        // A reset of the second history makes the third.
        second.extent = PartitionExtent {
            messages_count: 2,
            current_offset: 1,
        };
        let p = plan_ok(&second);
        check!(p.history.resets == 2);
        check!(p.reset == Some(pos(1, 6)));
        // An owner reset the history and wrote before it could commit: its tail leads.
        let mut unconfirmed = facts(Some(99), None, InitialOffset::Earliest);
        unconfirmed.tail = hit(1, 3);
        let p = plan_ok(&unconfirmed);
        check!(p.history.resets == 1);
        check!(p.from == at(4, true));
        check!(p.confirmed.is_none());
        check!(p.loss.is_none());
        // Nothing written in a new history yet: it starts at 0 whatever the initial offset.
        let mut none_yet = facts(Some(0), None, InitialOffset::Latest);
        if let Some(p) = none_yet.progress.as_mut() {
            p.history_label = label(1);
            p.confirmed = None;
        }
        // (No confirmed offset: the progress is not a position; a hit after 1 reset without one.)
        none_yet.tail = hit(1, 0);
        check!(plan_ok(&none_yet).from == at(1, true));
    }

    #[test]
    fn resets_beyond_the_labels_are_an_error() {
        let mut last = facts(Some(9), Some(9), InitialOffset::Earliest);
        if let Some(p) = last.progress.as_mut() {
            p.history_label = label(History::MAX_RESETS);
        }
        last.tail = hit(History::MAX_RESETS, 9);
        check!(plan(&last).is_ok());
        last.extent = EMPTY;
        check!(plan(&last) == Err(ResetsExhausted));
    }

    #[test]
    fn a_tail_below_the_confirmed_offset_is_a_downstream_loss_copied_again() {
        let lost = |confirmed, tail| {
            let mut f = facts(Some(confirmed), Some(tail), InitialOffset::Earliest);
            f.extent = PartitionExtent {
                messages_count: 200,
                current_offset: 199,
            };
            plan_ok(&f)
        };
        let p = lost(99, 49);
        check!(p.loss == Some(DownstreamLoss { from: 50, to: 99 }));
        // From one after the tail, as a continuation: a first offset above it is a gap.
        check!(p.from == at(50, true));
        check!(p.written == Some(49));
        check!(p.confirmed == Some(99));
        check!(p.reset.is_none());
        // Equal is no loss.
        check!(lost(99, 99).loss.is_none());
        // (Upstream retention removed 50.. meanwhile: the reader reports the gap from 50.)
    }

    #[test]
    fn an_empty_downstream_partition_with_a_confirmed_offset_is_a_loss_from_the_start() {
        let empty = |initial| {
            let mut f = facts(Some(9), None, initial);
            f.tail = Some(TailOutcome::Absent(ScanEnd::Empty));
            plan_ok(&f)
        };
        let p = empty(InitialOffset::Earliest);
        check!(p.loss == Some(DownstreamLoss { from: 0, to: 9 }));
        check!(p.from == at(0, false));
        check!(p.written.is_none());
        // The flow started at 4: that is where the copy began.
        check!(empty(InitialOffset::At(4)).from == at(4, false));
        // `latest`: where the copy began is unknown; everything retained is copied again.
        check!(empty(InitialOffset::Latest).from == at(0, false));
        // Only an earlier history of ours is left downstream: the current one is copied
        // again from its start.
        let mut older = facts(Some(9), None, InitialOffset::At(4));
        if let Some(p) = older.progress.as_mut() {
            p.history_label = label(1);
        }
        older.tail = hit(0, 500);
        older.extent = PartitionExtent {
            messages_count: 50,
            current_offset: 49,
        };
        let p = plan_ok(&older);
        check!(p.loss == Some(DownstreamLoss { from: 0, to: 9 }));
        check!(p.history.resets == 1);
        check!(p.from == at(0, false));
    }

    #[test]
    fn no_message_of_ours_among_others_is_not_attributed_to_a_loss() {
        for end in [ScanEnd::Beginning, ScanEnd::Retention, ScanEnd::Bound] {
            let mut f = facts(Some(9), None, InitialOffset::Earliest);
            f.tail = Some(TailOutcome::Absent(end));
            let p = plan_ok(&f);
            check!(p.loss.is_none(), "{end:?}");
            check!(p.from == at(10, true), "{end:?}");
            check!(p.scan_exhausted == (end == ScanEnd::Bound), "{end:?}");
        }
    }

    #[test]
    fn a_reset_upstream_wins_over_a_loss_downstream() {
        let mut both = facts(Some(99), Some(49), InitialOffset::Earliest);
        both.extent = PartitionExtent {
            messages_count: 5,
            current_offset: 4,
        };
        let p = plan_ok(&both);
        check!(p.reset == Some(pos(0, 99)));
        check!(p.loss.is_none());
        check!(p.from == at(0, false));
    }

    fn page(offsets: std::ops::Range<Offset>, ours: &[(Offset, Offset)]) -> Vec<TailEntry> {
        offsets
            .map(|offset| TailEntry {
                offset,
                ours: ours
                    .iter()
                    .find(|(o, _)| *o == offset)
                    .map(|(_, up)| pos(0, *up)),
            })
            .collect()
    }

    fn found(downstream: Offset, offset: Offset) -> TailStep {
        TailStep::Done(TailOutcome::Hit(TailHit {
            downstream,
            position: pos(0, offset),
        }))
    }

    fn absent(end: ScanEnd) -> TailStep {
        TailStep::Done(TailOutcome::Absent(end))
    }

    #[test]
    fn newest_page_holding_ours_ends_the_scan_at_its_highest_position() {
        let (mut scan, first) = TailScan::start(10_000, None);
        check!(first == TailPoll::Last { count: 1000 });
        let newest = page(4000..5000, &[(4100, 41), (4990, 99), (4995, 0)]);
        // A stale owner's late batch (offset 0 on top) does not pull the tail back.
        check!(scan.feed(&newest) == found(4990, 99));
    }

    #[test]
    fn a_later_history_outranks_higher_offsets_of_an_earlier_one() {
        let (mut scan, _) = TailScan::start(10_000, None);
        let mut newest = page(0..100, &[(10, 900)]);
        newest[50].ours = Some(pos(1, 5));
        check!(
            scan.feed(&newest)
                == TailStep::Done(TailOutcome::Hit(TailHit {
                    downstream: 50,
                    position: pos(1, 5)
                }))
        );
    }

    #[test]
    fn empty_partition_has_no_tail() {
        let (mut scan, _) = TailScan::start(10_000, Some(pos(0, 5)));
        check!(scan.feed(&[]) == absent(ScanEnd::Empty));
    }

    #[test]
    fn scan_walks_back_window_by_window_until_it_finds_ours() {
        let (mut scan, _) = TailScan::start(10_000, None);
        let step = scan.feed(&page(4000..5000, &[]));
        check!(
            step == TailStep::Poll(TailPoll::From {
                offset: 3000,
                count: 1000
            })
        );
        let step = scan.feed(&page(3000..4000, &[(3500, 77), (3999, 78)]));
        check!(step == found(3999, 78));
        check!(scan.scanned() == 2000);
    }

    #[test]
    fn short_pages_fill_the_window_before_it_is_judged() {
        let (mut scan, _) = TailScan::start(10_000, None);
        scan.feed(&page(2000..3000, &[]));
        // The server returned 400 of the 1000 asked for; the rest of the window follows.
        let step = scan.feed(&page(1000..1400, &[(1100, 11)]));
        check!(
            step == TailStep::Poll(TailPoll::From {
                offset: 1400,
                count: 600
            })
        );
        // A later message of the window that is not ours does not hide the earlier match.
        let step = scan.feed(&page(1400..2000, &[]));
        check!(step == found(1100, 11));
    }

    #[test]
    fn messages_outside_the_window_are_ignored() {
        let (mut scan, _) = TailScan::start(10_000, None);
        scan.feed(&page(2000..3000, &[]));
        // A match at or above the window's end was already judged; below its start is not
        // asked for.
        let mut odd = page(900..1000, &[(950, 5)]);
        odd.extend(page(1000..2000, &[]));
        odd.extend(page(2000..2001, &[(2000, 6)]));
        check!(
            scan.feed(&odd)
                == TailStep::Poll(TailPoll::From {
                    offset: 0,
                    count: 1000
                })
        );
    }

    #[test]
    fn scan_without_a_reference_stops_after_the_window() {
        let (mut scan, first) = TailScan::start(2500, None);
        check!(first == TailPoll::Last { count: 1000 });
        check!(matches!(
            scan.feed(&page(9000..10_000, &[])),
            TailStep::Poll(_)
        ));
        check!(matches!(
            scan.feed(&page(8000..9000, &[])),
            TailStep::Poll(_)
        ));
        // 3000 scanned ≥ 2500: the window is rounded up to whole pages. Exactly at the
        // window it stops too (`>=` → `>` would read one page more).
        check!(scan.feed(&page(7000..8000, &[])) == absent(ScanEnd::Bound));
        let (mut exact, _) = TailScan::start(2000, None);
        check!(matches!(
            exact.feed(&page(9000..10_000, &[])),
            TailStep::Poll(_)
        ));
        check!(exact.feed(&page(8000..9000, &[])) == absent(ScanEnd::Bound));
    }

    #[test]
    fn scan_with_a_reference_reads_past_the_window_until_it_finds_ours() {
        // 2000 messages of window, 5000 foreign ones on top of the last write of ours.
        let (mut scan, _) = TailScan::start(2000, Some(pos(0, 40)));
        for end in (6000..=10_000).rev().step_by(1000) {
            let step = scan.feed(&page(end - 1000..end, &[]));
            check!(
                step == TailStep::Poll(TailPoll::From {
                    offset: end - 2000,
                    count: 1000
                }),
                "{end}"
            );
        }
        // The unconfirmed writes above the confirmed offset 40 are found.
        let step = scan.feed(&page(4000..5000, &[(4000, 41), (4001, 42)]));
        check!(step == found(4001, 42));
        check!(scan.scanned() == 6000);
    }

    #[test]
    fn a_tail_below_the_reference_is_confirmed_over_one_more_window() {
        // The last of ours downstream is 10, but 40 is confirmed: look further back for a
        // higher one (a late stale batch on top of newer writes).
        let (mut scan, _) = TailScan::start(1500, Some(pos(0, 40)));
        let step = scan.feed(&page(9000..10_000, &[(9990, 10)]));
        check!(
            step == TailStep::Poll(TailPoll::From {
                offset: 8000,
                count: 1000
            })
        );
        let step = scan.feed(&page(8000..9000, &[(8500, 45)]));
        check!(step == found(8500, 45));
        // Not found within the window: the highest seen is the tail (a real loss).
        let (mut lost, _) = TailScan::start(1500, Some(pos(0, 40)));
        lost.feed(&page(9000..10_000, &[(9990, 10)]));
        check!(matches!(
            lost.feed(&page(8000..9000, &[(8100, 9)])),
            TailStep::Poll(_)
        ));
        check!(lost.feed(&page(7000..8000, &[])) == found(9990, 10));
        // Or the partition's beginning comes first.
        let (mut short, _) = TailScan::start(10_000, Some(pos(0, 40)));
        short.feed(&page(500..1500, &[(1400, 10)]));
        check!(short.feed(&page(0..500, &[(3, 2)])) == found(1400, 10));
    }

    #[test]
    fn a_small_window_reads_one_small_page() {
        let (mut scan, first) = TailScan::start(300, None);
        check!(first == TailPoll::Last { count: 300 });
        check!(scan.feed(&page(700..1000, &[])) == absent(ScanEnd::Bound));
    }

    #[test]
    fn scan_stops_at_the_partition_beginning() {
        let (mut scan, _) = TailScan::start(10_000, Some(pos(0, 1)));
        check!(
            scan.feed(&page(500..1500, &[]))
                == TailStep::Poll(TailPoll::From {
                    offset: 0,
                    count: 500
                })
        );
        check!(scan.feed(&page(0..500, &[])) == absent(ScanEnd::Beginning));
        let (mut all, _) = TailScan::start(10_000, None);
        check!(all.feed(&page(0..700, &[])) == absent(ScanEnd::Beginning));
    }

    #[test]
    fn scan_stops_where_retention_removed_the_older_messages() {
        let (mut scan, _) = TailScan::start(10_000, Some(pos(0, 1)));
        scan.feed(&page(3000..4000, &[]));
        // Asked for 2000..3000, the oldest retained message is 2600.
        check!(scan.feed(&page(2600..3000, &[])) == absent(ScanEnd::Retention));
        // Nothing at all below.
        let (mut gone, _) = TailScan::start(10_000, None);
        gone.feed(&page(3000..4000, &[]));
        check!(gone.feed(&[]) == absent(ScanEnd::Retention));
    }

    #[test]
    fn a_page_without_progress_ends_the_window() {
        let (mut scan, _) = TailScan::start(10_000, None);
        scan.feed(&page(3000..4000, &[]));
        let step = scan.feed(&page(2000..2500, &[]));
        assert!(
            step == TailStep::Poll(TailPoll::From {
                offset: 2500,
                count: 500
            })
        );
        // Nothing new: the window is judged on what came (2000..2500), then the next one.
        check!(
            scan.feed(&[])
                == TailStep::Poll(TailPoll::From {
                    offset: 1000,
                    count: 1000
                })
        );
    }
}
