//! Where a unit resumes, and how far back the writer looks for it downstream.
//!
//! Pure: the writer's IO loop fetches the facts (the upstream partition's extent, the confirmed
//! progress, pages of downstream messages) and feeds them in. [`plan`] decides the resume
//! point; [`TailScan`] decides which page of the downstream partition to read next and when to
//! stop looking for the last message this flow wrote there.

use replicator_model::{InitialOffset, Offset, UnitProgress};

use crate::offsets::ReadFrom;

/// Messages per poll while scanning the downstream tail.
const TAIL_CHUNK: u32 = 1000;

/// The upstream partition's extent, from `get_topic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PartitionExtent {
    /// Messages stored (0 = empty).
    pub(super) messages_count: u64,
    /// Offset of the last message (meaningless when empty).
    pub(super) current_offset: Offset,
}

impl PartitionExtent {
    /// The offset the next appended message gets.
    fn next_offset(&self) -> Offset {
        if self.messages_count == 0 {
            0
        } else {
            self.current_offset.saturating_add(1)
        }
    }
}

/// What a starting writer found out before it decides where to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ResumeFacts {
    /// The unit's confirmed progress, `None` if it was never committed.
    pub(super) progress: Option<UnitProgress>,
    /// Creation time (µs) of the upstream topic as it is now (its incarnation).
    pub(super) created_at: u64,
    /// Upstream offset of the last message this flow wrote downstream for this incarnation
    /// (see [`TailScan`]); `None` when not found or provenance is off.
    pub(super) tail: Option<Offset>,
    /// The flow's start for a unit without progress.
    pub(super) initial: InitialOffset,
    /// The upstream partition now.
    pub(super) extent: PartitionExtent,
}

/// Where a unit resumes and what its writer starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ResumePlan {
    /// Where the reader starts.
    pub(super) from: ReadFrom,
    /// The confirmed offset of the current topic incarnation.
    pub(super) confirmed: Option<Offset>,
    /// The last offset known downstream: the highest of `confirmed` and the tail.
    pub(super) written: Option<Offset>,
    /// A confirmed offset of an earlier incarnation of the topic (deleted and created again),
    /// which no longer counts: the unit starts that topic from the initial offset.
    pub(super) forgotten: Option<Offset>,
}

/// Resumes after the highest of the confirmed offset and the last offset found downstream,
/// both of the current topic incarnation; without either, at the flow's initial offset (and
/// then a first polled offset above it is not a gap: the server clamps to what it retains).
pub(super) fn plan(facts: &ResumeFacts) -> ResumePlan {
    let (confirmed, forgotten) = match facts.progress {
        Some(p) if p.topic_created_at == facts.created_at => (p.confirmed, None),
        Some(p) => (None, p.confirmed),
        None => (None, None),
    };
    let written = confirmed.max(facts.tail);
    let from = match written {
        Some(last) => ReadFrom {
            offset: last.saturating_add(1),
            contiguous: true,
        },
        None => ReadFrom {
            offset: match facts.initial {
                InitialOffset::Earliest => 0,
                InitialOffset::Latest => facts.extent.next_offset(),
                InitialOffset::At(offset) => offset,
            },
            contiguous: false,
        },
    };
    ResumePlan {
        from,
        confirmed,
        written,
        forgotten,
    }
}

/// One downstream message as the tail scan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TailEntry {
    /// Its offset in the downstream partition.
    pub(super) offset: Offset,
    /// The upstream offset in its provenance, if this flow wrote it for the current topic
    /// incarnation; `None` for anything else (other producers, reverse flows, older
    /// incarnations).
    pub(super) ours: Option<Offset>,
}

/// The next page the tail scan needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TailPoll {
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
pub(super) enum TailStep {
    /// Read this page next.
    Poll(TailPoll),
    /// Done: the upstream offset of the last message this flow wrote, if it was found.
    Done(Option<Offset>),
}

/// Where the scan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanState {
    /// Waiting for the newest page.
    Newest,
    /// Reading the window `[start, end)` of downstream offsets, from `at` on, in pages (the
    /// server may return fewer messages than asked for). Pages come in ascending order, so the
    /// last match seen is the newest one in the window.
    Window {
        start: Offset,
        end: Offset,
        at: Offset,
        first: Option<Offset>,
        newest_ours: Option<Offset>,
        count: u64,
    },
}

/// The backwards scan of a downstream partition for the last message this flow wrote: the
/// newest page first, then windows of [`TAIL_CHUNK`] messages further back, until a message of
/// ours turns up, the partition's beginning (or what retention left of it) is reached, or
/// `window` messages were scanned. The window must exceed what other producers append to the
/// partition between a crash and the restart; a message of ours further back is not found (the
/// confirmed offset still bounds the resume point from below).
#[derive(Debug, Clone)]
pub(super) struct TailScan {
    /// Most messages to scan (rounded up to whole pages).
    window: u64,
    /// Messages per page.
    chunk: u32,
    /// Messages scanned in finished pages and windows.
    scanned: u64,
    state: ScanState,
}

impl TailScan {
    /// A scan of at most `window` messages (at least 1), and its first page.
    pub(super) fn start(window: u32) -> (Self, TailPoll) {
        let window = window.max(1);
        let chunk = window.min(TAIL_CHUNK);
        let scan = Self {
            window: u64::from(window),
            chunk,
            scanned: 0,
            state: ScanState::Newest,
        };
        (scan, TailPoll::Last { count: chunk })
    }

    /// Takes the page asked for last (its messages in ascending offset order) and says what
    /// comes next.
    pub(super) fn feed(&mut self, page: &[TailEntry]) -> TailStep {
        match self.state {
            ScanState::Newest => {
                if let Some(found) = page.iter().rev().find_map(|e| e.ours) {
                    return TailStep::Done(Some(found));
                }
                let Some(first) = page.first() else {
                    return TailStep::Done(None);
                };
                self.scanned = page.len() as u64;
                self.window_before(first.offset)
            }
            ScanState::Window {
                start,
                end,
                at,
                mut first,
                mut newest_ours,
                mut count,
            } => {
                let mut last = None;
                for entry in page.iter().filter(|e| e.offset >= at && e.offset < end) {
                    first.get_or_insert(entry.offset);
                    newest_ours = entry.ours.or(newest_ours);
                    count += 1;
                    last = Some(entry.offset);
                }
                // The window goes on while pages make progress and do not reach its end.
                if let Some(next) = last.map(|l| l + 1).filter(|&next| next < end) {
                    self.state = ScanState::Window {
                        start,
                        end,
                        at: next,
                        first,
                        newest_ours,
                        count,
                    };
                    return TailStep::Poll(TailPoll::From {
                        offset: next,
                        count: self.count_to(next, end),
                    });
                }
                if newest_ours.is_some() {
                    return TailStep::Done(newest_ours);
                }
                self.scanned += count;
                match first {
                    // Retention removed everything below: nothing older to scan.
                    Some(f) if f > start => TailStep::Done(None),
                    Some(f) => self.window_before(f),
                    None => TailStep::Done(None),
                }
            }
        }
    }

    /// The window of up to one page below `end`, unless the partition's beginning or the
    /// scan's bound is reached.
    fn window_before(&mut self, end: Offset) -> TailStep {
        if end == 0 || self.scanned >= self.window {
            return TailStep::Done(None);
        }
        let start = end.saturating_sub(u64::from(self.chunk));
        self.state = ScanState::Window {
            start,
            end,
            at: start,
            first: None,
            newest_ours: None,
            count: 0,
        };
        TailStep::Poll(TailPoll::From {
            offset: start,
            count: self.count_to(start, end),
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

    fn facts(
        confirmed: Option<Offset>,
        tail: Option<Offset>,
        initial: InitialOffset,
    ) -> ResumeFacts {
        ResumeFacts {
            progress: Some(UnitProgress {
                confirmed,
                topic_created_at: NOW,
                counters: Default::default(),
            }),
            created_at: NOW,
            tail,
            initial,
            extent: TEN,
        }
    }

    #[test]
    fn resume_after_highest_of_confirmed_and_tail() {
        let p = plan(&facts(Some(5), Some(8), InitialOffset::Earliest));
        check!(
            p.from
                == ReadFrom {
                    offset: 9,
                    contiguous: true
                }
        );
        check!(p.written == Some(8));
        check!(p.confirmed == Some(5));
        check!(
            plan(&facts(Some(8), Some(5), InitialOffset::Latest))
                .from
                .offset
                == 9
        );
        check!(
            plan(&facts(None, Some(0), InitialOffset::Latest))
                .from
                .offset
                == 1
        );
        check!(
            plan(&facts(Some(3), None, InitialOffset::At(100)))
                .from
                .offset
                == 4
        );
    }

    #[test]
    fn no_progress_starts_at_initial_offset_without_gap_detection() {
        let earliest = plan(&facts(None, None, InitialOffset::Earliest));
        check!(
            earliest.from
                == ReadFrom {
                    offset: 0,
                    contiguous: false
                }
        );
        check!(earliest.written.is_none());
        check!(plan(&facts(None, None, InitialOffset::Latest)).from.offset == 10);
        let mut empty = facts(None, None, InitialOffset::Latest);
        empty.extent = EMPTY;
        check!(plan(&empty).from.offset == 0);
        check!(plan(&facts(None, None, InitialOffset::At(42))).from.offset == 42);
        let mut never = facts(None, None, InitialOffset::At(42));
        never.progress = None;
        check!(plan(&never).from.offset == 42);
    }

    #[test]
    fn progress_of_an_earlier_topic_incarnation_is_forgotten() {
        let mut recreated = facts(Some(500), None, InitialOffset::Earliest);
        recreated.created_at = NOW + 1;
        let p = plan(&recreated);
        check!(p.from.offset == 0);
        check!(!p.from.contiguous);
        check!(p.confirmed.is_none());
        check!(p.forgotten == Some(500));
        // A tail of the new incarnation still counts.
        recreated.tail = Some(7);
        check!(plan(&recreated).from.offset == 8);
        // Nothing confirmed before: nothing forgotten to warn about.
        let mut fresh = facts(None, None, InitialOffset::Earliest);
        fresh.created_at = NOW + 1;
        check!(plan(&fresh).forgotten.is_none());
    }

    fn page(offsets: std::ops::Range<Offset>, ours: &[(Offset, Offset)]) -> Vec<TailEntry> {
        offsets
            .map(|offset| TailEntry {
                offset,
                ours: ours.iter().find(|(o, _)| *o == offset).map(|(_, up)| *up),
            })
            .collect()
    }

    #[test]
    fn newest_page_holding_ours_ends_the_scan_at_its_newest_match() {
        let (mut scan, first) = TailScan::start(10_000);
        check!(first == TailPoll::Last { count: 1000 });
        let newest = page(4000..5000, &[(4100, 41), (4990, 99), (4995, 0)]);
        // The newest downstream message of ours wins, not the highest upstream offset.
        check!(scan.feed(&newest) == TailStep::Done(Some(0)));
    }

    #[test]
    fn empty_partition_has_no_tail() {
        let (mut scan, _) = TailScan::start(10_000);
        check!(scan.feed(&[]) == TailStep::Done(None));
    }

    #[test]
    fn scan_walks_back_window_by_window_until_it_finds_ours() {
        let (mut scan, _) = TailScan::start(10_000);
        let step = scan.feed(&page(4000..5000, &[]));
        check!(
            step == TailStep::Poll(TailPoll::From {
                offset: 3000,
                count: 1000
            })
        );
        let step = scan.feed(&page(3000..4000, &[(3500, 77), (3999, 78)]));
        check!(step == TailStep::Done(Some(78)));
    }

    #[test]
    fn short_pages_fill_the_window_before_it_is_judged() {
        let (mut scan, _) = TailScan::start(10_000);
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
        check!(step == TailStep::Done(Some(11)));
    }

    #[test]
    fn messages_outside_the_window_are_ignored() {
        let (mut scan, _) = TailScan::start(10_000);
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
    fn scan_stops_after_the_window() {
        let (mut scan, first) = TailScan::start(2500);
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
        check!(scan.feed(&page(7000..8000, &[])) == TailStep::Done(None));
        let (mut exact, _) = TailScan::start(2000);
        check!(matches!(
            exact.feed(&page(9000..10_000, &[])),
            TailStep::Poll(_)
        ));
        check!(exact.feed(&page(8000..9000, &[])) == TailStep::Done(None));
    }

    #[test]
    fn a_small_window_reads_one_small_page() {
        let (mut scan, first) = TailScan::start(300);
        check!(first == TailPoll::Last { count: 300 });
        check!(scan.feed(&page(700..1000, &[])) == TailStep::Done(None));
    }

    #[test]
    fn scan_stops_at_the_partition_beginning() {
        let (mut scan, _) = TailScan::start(10_000);
        check!(
            scan.feed(&page(500..1500, &[]))
                == TailStep::Poll(TailPoll::From {
                    offset: 0,
                    count: 500
                })
        );
        check!(scan.feed(&page(0..500, &[])) == TailStep::Done(None));
        let (mut all, _) = TailScan::start(10_000);
        check!(all.feed(&page(0..700, &[])) == TailStep::Done(None));
    }

    #[test]
    fn scan_stops_where_retention_removed_the_older_messages() {
        let (mut scan, _) = TailScan::start(10_000);
        scan.feed(&page(3000..4000, &[]));
        // Asked for 2000..3000, the oldest retained message is 2600.
        check!(scan.feed(&page(2600..3000, &[])) == TailStep::Done(None));
    }

    #[test]
    fn a_page_without_progress_ends_the_window() {
        let (mut scan, _) = TailScan::start(10_000);
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
