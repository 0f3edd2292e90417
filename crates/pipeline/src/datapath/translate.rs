//! The pure core of consumer-group offset translation: which downstream offset holds the copy
//! of an upstream offset.
//!
//! Every copied message carries its upstream offset (`repl-offset`), so translation is exact:
//! the downstream offset of the message that carries the group's stored upstream offset. Two
//! ways to find it, cheapest first:
//! - [`OffsetMap`]: what a writer sent since it resumed, as runs of consecutive offsets on both
//!   sides (bounded per partition). Its downstream offsets are *computed* (the downstream
//!   partition's next offset when the writer resumed, plus what it sent since), so the sync
//!   checks the newest entry against the downstream message before trusting any entry: a
//!   foreign message appended in between would have shifted every later one.
//! - [`Search`]: a search of the downstream partition by `repl-offset`, for offsets the map
//!   does not know (a group far behind, a writer that restarted): from the newest copy, it
//!   gallops back (1, 2, 4… messages) until it passes the target, then bisects. Foreign
//!   messages (the target's own, another flow's) may sit anywhere, even as a long prefix (the
//!   original source, when a reverse flow fails back), so a probe asks for the first copy *at
//!   or after* an offset and before the nearest copy known to be past the target: that is
//!   monotonic whatever lies between copies.
//!
//! Both answer the copy of the upstream offset, or of the last copied one before it when it was
//! not copied (not yet, or skipped): never a later message, so a consumer that switches
//! clusters may re-read, never skip.

use std::collections::VecDeque;

use replicator_model::Offset;

/// Most runs an [`OffsetMap`] keeps per partition (oldest dropped first): about 24 KiB.
pub(crate) const MAX_RUNS: usize = 1024;

/// Consecutive upstream offsets copied to consecutive downstream offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    /// First upstream offset.
    up: Offset,
    /// Its downstream offset.
    down: Offset,
    /// Messages in the run (at least 1).
    len: u64,
}

impl Run {
    fn last(&self) -> (Offset, Offset) {
        (self.up + self.len - 1, self.down + self.len - 1)
    }
}

/// A copied message: its downstream offset and the upstream offset it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Copied {
    /// Offset downstream.
    pub(crate) down: Offset,
    /// Offset upstream (`repl-offset`).
    pub(crate) up: Offset,
}

/// What the map knows of an upstream offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The copy of it, or of the last copied offset before it.
    Found(Copied),
    /// Nothing at or before it was ever copied (of this history).
    NotCopied,
    /// Older than the map: search the downstream partition.
    Unknown,
}

/// A writer's sends since it resumed (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OffsetMap {
    /// Upstream history (`repl-created` label) the offsets belong to.
    label: u64,
    /// Downstream offset the next sent message gets; `None` once unknown (a send that failed
    /// may have been appended): the map then only answers what it knew before.
    next_down: Option<Offset>,
    /// Runs in upstream (and downstream) order.
    runs: VecDeque<Run>,
    /// Whether messages before the first run were copied by an earlier writer (then an offset
    /// before the first run is unknown, not "never copied").
    copied_before: bool,
}

impl OffsetMap {
    /// A map for a writer that resumes copying history `label` with the downstream partition's
    /// next offset at `next_down`; `copied_before` when the unit copied anything before.
    pub(crate) fn new(label: u64, next_down: Offset, copied_before: bool) -> Self {
        Self {
            label,
            next_down: Some(next_down),
            runs: VecDeque::new(),
            copied_before,
        }
    }

    /// The history the map is about.
    pub(crate) fn label(&self) -> u64 {
        self.label
    }

    /// Records messages acknowledged downstream, in send order, by their upstream offsets.
    pub(crate) fn sent(&mut self, upstream: impl IntoIterator<Item = Offset>) {
        let Some(mut next) = self.next_down else {
            return;
        };
        for up in upstream {
            match self.runs.back_mut() {
                Some(run) if run.last() == (up.wrapping_sub(1), next.wrapping_sub(1)) => {
                    run.len += 1;
                }
                _ => {
                    if self.runs.len() == MAX_RUNS {
                        self.runs.pop_front();
                        self.copied_before = true;
                    }
                    self.runs.push_back(Run {
                        up,
                        down: next,
                        len: 1,
                    });
                }
            }
            next += 1;
        }
        self.next_down = Some(next);
    }

    /// A send failed and may or may not have been appended: later sends cannot be placed, and
    /// nothing past the newest entry is known until [`OffsetMap::resynced`].
    pub(crate) fn unsure(&mut self) {
        self.next_down = None;
    }

    /// The writer re-read the downstream tail after an unsure send: its last copy there is
    /// `last` (of this history; `None`: none found) and the partition's next offset is
    /// `next_down`. The map starts over from there: what the unsure send did is not known
    /// message by message, so everything before `last` is left to the search.
    pub(crate) fn resynced(&mut self, last: Option<Copied>, next_down: Offset) {
        let copied_before = self.copied_before || !self.runs.is_empty() || last.is_some();
        self.runs.clear();
        self.copied_before = copied_before;
        if let Some(last) = last.filter(|l| l.down < next_down) {
            self.runs.push_back(Run {
                up: last.up,
                down: last.down,
                len: 1,
            });
        }
        self.next_down = Some(next_down);
    }

    /// The newest copy recorded (what the sync checks against the downstream message).
    pub(crate) fn newest(&self) -> Option<Copied> {
        self.runs.back().map(|r| {
            let (up, down) = r.last();
            Copied { down, up }
        })
    }

    /// The copy of `up`, or of the last copied offset before it.
    pub(crate) fn lookup(&self, up: Offset) -> Lookup {
        let index = self.runs.partition_point(|r| r.up <= up);
        if index == 0 {
            // Before the first run: copied by an earlier writer, or never copied at all.
            return if self.copied_before {
                Lookup::Unknown
            } else {
                Lookup::NotCopied
            };
        }
        let run = self.runs[index - 1];
        let (last_up, last_down) = run.last();
        if up <= last_up {
            return Lookup::Found(Copied {
                down: run.down + (up - run.up),
                up,
            });
        }
        if index == self.runs.len() && self.next_down.is_none() {
            // Past the newest entry while an unsure send may have appended more: unknown,
            // not "the newest" (which would stay put while the copy goes on).
            return Lookup::Unknown;
        }
        Lookup::Found(Copied {
            down: last_down,
            up: last_up,
        })
    }
}

/// What a [`Search`] wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The first copy in downstream offsets `[from, until)`, if any.
    Probe {
        /// First downstream offset to look at.
        from: Offset,
        /// End of the range (exclusive); nothing of interest lies beyond.
        until: Offset,
    },
    /// The copy of the target, or of the last copied offset before it (`None`: none).
    Done(Option<Copied>),
}

/// The search for the copy of upstream offset `target` (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Search {
    target: Offset,
    /// Best copy found at or before the target.
    low: Option<Copied>,
    /// Downstream offsets still in question: `[lo, hi)`; no copy at or after `hi` is at or
    /// before the target.
    lo: Offset,
    hi: Offset,
    /// While galloping back from `hi`: the next step.
    gallop: Option<u64>,
}

impl Search {
    /// A search that starts from `newest`, the newest copy downstream.
    #[cfg(test)]
    pub(crate) fn new(target: Offset, newest: Copied) -> Self {
        Self::between(target, None, newest)
    }

    /// A search between two copies known already: `low` at or before the target (none known:
    /// gallop back from `high`) and `high`, a copy past it (or the newest copy).
    pub(crate) fn between(target: Offset, low: Option<Copied>, high: Copied) -> Self {
        if high.up <= target {
            return Self {
                target,
                low: Some(high),
                lo: 0,
                hi: 0,
                gallop: None,
            };
        }
        let low = low.filter(|l| l.up <= target && l.down < high.down);
        Self {
            target,
            low,
            lo: low.map_or(0, |l| l.down + 1),
            hi: high.down,
            gallop: low.is_none().then_some(1),
        }
    }

    /// What to do next.
    pub(crate) fn next(&self) -> Step {
        if self.low.is_some_and(|l| l.up == self.target) || self.lo >= self.hi {
            return Step::Done(self.low);
        }
        let from = match self.gallop {
            Some(step) if self.hi.saturating_sub(step) > self.lo => self.hi - step,
            _ => self.lo + (self.hi - self.lo) / 2,
        };
        Step::Probe {
            from,
            until: self.hi,
        }
    }

    /// The best copy found so far (at or before the target).
    pub(crate) fn best(&self) -> Option<Copied> {
        self.low
    }

    /// Takes the answer of [`Step::Probe`] from `from`: the first copy in the range, if any.
    pub(crate) fn observe(&mut self, from: Offset, first: Option<Copied>) {
        match first {
            Some(copy) if copy.up <= self.target => {
                if self.low.is_none_or(|l| copy.down > l.down) {
                    self.low = Some(copy);
                }
                self.lo = copy.down + 1;
                // Passed the target: bisect what is left.
                self.gallop = None;
            }
            // Every copy from `from` on is past the target (or there is none before `hi`).
            _ => {
                self.hi = from;
                if let Some(step) = self.gallop.as_mut() {
                    *step = step.saturating_mul(2);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    fn copied(down: Offset, up: Offset) -> Lookup {
        Lookup::Found(Copied { down, up })
    }

    #[test]
    fn a_map_places_sends_in_runs_and_answers_exact_or_the_last_before() {
        // Resumed at downstream offset 100; upstream 10..=14 sent, 15..=16 skipped (loop
        // prevention), 17..=18 sent.
        let mut map = OffsetMap::new(7, 100, true);
        map.sent(10..=14);
        map.sent([17, 18]);
        check!(map.lookup(12) == copied(102, 12));
        check!(
            map.lookup(16) == copied(104, 14),
            "skipped: the last copy before"
        );
        check!(map.lookup(17) == copied(105, 17));
        check!(
            map.lookup(99) == copied(106, 18),
            "not copied yet: the newest"
        );
        check!(
            map.lookup(9) == Lookup::Unknown,
            "copied before this writer"
        );
        check!(map.newest() == Some(Copied { down: 106, up: 18 }));
    }

    #[test]
    fn a_map_without_earlier_copies_knows_nothing_before_its_first_run() {
        let mut map = OffsetMap::new(7, 0, false);
        check!(map.lookup(5) == Lookup::NotCopied);
        map.sent([5, 6]);
        check!(map.lookup(4) == Lookup::NotCopied);
        check!(map.lookup(6) == copied(1, 6));
    }

    #[test]
    fn an_unsure_send_freezes_the_map_and_leaves_what_follows_to_the_search() {
        let mut map = OffsetMap::new(7, 0, false);
        map.sent([0, 1]);
        map.unsure();
        map.sent([2, 3]);
        check!(map.newest() == Some(Copied { down: 1, up: 1 }));
        check!(
            map.lookup(1) == copied(1, 1),
            "acknowledged before: still exact"
        );
        check!(
            map.lookup(3) == Lookup::Unknown,
            "past the newest entry: unknown, never the frozen newest"
        );
    }

    #[test]
    fn a_resync_starts_the_map_over_from_the_tail_hit() {
        let mut map = OffsetMap::new(7, 100, false);
        map.sent(0..10); // 100..=109
        map.unsure();
        // The unsure send of 10..=14 landed at 110..=114, then a foreign message at 115.
        map.resynced(Some(Copied { down: 114, up: 14 }), 116);
        map.sent(15..20); // 116..=120
        check!(map.lookup(14) == copied(114, 14));
        check!(map.lookup(17) == copied(118, 17));
        check!(
            map.lookup(25) == copied(120, 19),
            "not copied yet: the newest"
        );
        check!(
            map.lookup(12) == Lookup::Unknown,
            "before the tail hit: left to the search"
        );
        check!(map.newest() == Some(Copied { down: 120, up: 19 }));

        // Nothing of this history found in the tail: what comes is placed from the end.
        let mut map = OffsetMap::new(7, 0, false);
        map.unsure();
        map.resynced(None, 3);
        check!(
            map.lookup(0) == Lookup::NotCopied,
            "nothing was ever copied"
        );
        map.sent([0]);
        check!(map.lookup(0) == copied(3, 0));
    }

    #[test]
    fn a_map_is_bounded_and_forgets_the_oldest_runs() {
        let mut map = OffsetMap::new(7, 0, false);
        for i in 0..(MAX_RUNS as u64 + 10) {
            map.sent([i * 2]); // every other offset: one run each
        }
        check!(map.runs.len() == MAX_RUNS);
        check!(
            map.lookup(0) == Lookup::Unknown,
            "forgotten, not 'never copied'"
        );
        check!(map.lookup(40) == copied(20, 40));
    }

    /// Runs a search over `downstream` (upstream offset per downstream offset; `None`: a
    /// foreign message) from its newest copy; returns the answer and the messages read.
    fn search(downstream: &[Option<Offset>], target: Offset) -> (Option<Copied>, u64) {
        let newest = downstream
            .iter()
            .enumerate()
            .rev()
            .find_map(|(d, up)| up.map(|up| Copied { down: d as u64, up }))
            .expect("a copy");
        let mut s = Search::new(target, newest);
        let mut read = 0;
        loop {
            match s.next() {
                Step::Done(found) => return (found, read),
                Step::Probe { from, until } => {
                    let first = (from..until).find_map(|d| {
                        read += 1;
                        downstream[d as usize].map(|up| Copied { down: d, up })
                    });
                    s.observe(from, first);
                }
            }
        }
    }

    /// The position of upstream offset `up` in `downstream`.
    fn position(downstream: &[Option<Offset>], up: Offset) -> u64 {
        downstream
            .iter()
            .position(|u| *u == Some(up))
            .expect("copied") as u64
    }

    #[test]
    fn search_finds_the_exact_copy_reading_little() {
        // Upstream 1000.. copied to downstream 0.., with upstream 5000..5099 skipped.
        let downstream: Vec<Option<Offset>> = (1000..5000).chain(5100..21_000).map(Some).collect();
        for target in [1000, 1001, 4999, 5100, 12_345, 20_998] {
            let (found, read) = search(&downstream, target);
            let down = position(&downstream, target);
            check!(found == Some(Copied { down, up: target }));
            check!(read <= 64, "{read} messages read for {target}");
        }
        let (found, _) = search(&downstream, 5050);
        check!(
            found
                == Some(Copied {
                    down: 3999,
                    up: 4999
                }),
            "skipped: the last before"
        );
        let (found, _) = search(&downstream, 999);
        check!(found == None, "nothing copied at or before");
        let (found, read) = search(&downstream, 30_000);
        check!(found.map(|c| c.up) == Some(20_999));
        check!(read == 0, "at or past the newest copy: no probe");
    }

    #[test]
    fn a_search_between_known_copies_reads_only_between_them() {
        let downstream: Vec<Option<Offset>> = (0..10_000).map(Some).collect();
        let copy = |d: u64| Copied { down: d, up: d };
        let mut s = Search::between(5000, Some(copy(4990)), copy(5010));
        let mut reads = Vec::new();
        while let Step::Probe { from, until } = s.next() {
            check!((4991..5010).contains(&from) && until <= 5010);
            reads.push(from);
            s.observe(
                from,
                downstream[from as usize].map(|up| Copied { down: from, up }),
            );
        }
        check!(s.next() == Step::Done(Some(copy(5000))));
        check!(reads.len() <= 6);
        // A known copy at the target ends it at once; one past the newest is the newest.
        check!(Search::between(7, None, copy(7)).next() == Step::Done(Some(copy(7))));
    }

    #[test]
    fn a_long_foreign_prefix_does_not_hide_the_copies() {
        // A reverse flow failing back: the original source's own 100 000 messages first,
        // then the copies of what was produced on the other side.
        let downstream: Vec<Option<Offset>> = std::iter::repeat_n(None, 100_000)
            .chain((0..500).map(Some))
            .collect();
        for target in [0, 9, 250, 498] {
            let (found, read) = search(&downstream, target);
            check!(
                found
                    == Some(Copied {
                        down: position(&downstream, target),
                        up: target
                    })
            );
            check!(read <= 2_000, "{read} messages read for {target}");
        }
    }

    #[test]
    fn foreign_messages_anywhere_never_make_the_answer_later() {
        // Every third downstream message is foreign, plus a long foreign stretch.
        let mut downstream = Vec::new();
        let mut up = 0;
        for d in 0..3000 {
            if d % 3 == 0 || (1200..1300).contains(&d) {
                downstream.push(None);
            } else {
                downstream.push(Some(up));
                up += 1;
            }
        }
        for target in [0, 1, 500, 777, 1500, up - 2] {
            let (found, _) = search(&downstream, target);
            check!(
                found
                    == Some(Copied {
                        down: position(&downstream, target),
                        up: target
                    })
            );
        }
    }
}
