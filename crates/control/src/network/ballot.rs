//! The answers to the latest election this node called, and whether it calls the next one at
//! once when that one made no leader.
//!
//! Why: across regions two followers of a dead leader can call their elections within less
//! than the time a vote request takes to cross (BENCHMARKS.md section 36). Each votes for
//! itself, each refuses the other, and the term ends without a leader; openraft then waits an
//! election timeout (four round trips, 0.7 s at 80 ms) before anyone tries again. The answers
//! of that split say who can win the next term: a voter grants only a candidate whose log is
//! at least as long as its own. A follower whose log is longer than every other voter's that
//! answered (ties go to the higher id, as openraft orders equal votes) calls the next election
//! as soon as all of them answered; the others leave it to it (and to openraft's timers, if it
//! fails too). At most one of any two followers calls, so two calls cannot split again.

use std::collections::{BTreeMap, BTreeSet};

use openraft::LogId;
use replicator_model::NodeId;

/// A voter's answer to one of this node's vote requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The voter's last log id, as it answered.
    pub(crate) last_log: Option<LogId<NodeId>>,
    /// Whether it granted the vote.
    pub(crate) granted: bool,
}

/// The latest election this node called: its term, this node's last log id as it asked, and
/// the answers so far.
#[derive(Debug, Default)]
pub(crate) struct Ballots {
    term: u64,
    own: Option<LogId<NodeId>>,
    answers: BTreeMap<NodeId, Answer>,
    /// The term whose failure this node already answered with an election of its own.
    retried: Option<u64>,
}

impl Ballots {
    /// This node asked for votes in `term` with its log ending at `own` (each request of an
    /// election names the same; a later term starts over).
    pub(crate) fn asked(&mut self, term: u64, own: Option<LogId<NodeId>>) {
        if term != self.term {
            self.term = term;
            self.answers.clear();
        }
        self.own = own;
    }

    /// `voter` answered the request of `term`.
    pub(crate) fn answered(&mut self, term: u64, voter: NodeId, answer: Answer) {
        if term == self.term {
            self.answers.insert(voter, answer);
        }
    }

    /// Whether `me` calls an election now: no leader is known in `term`, the election this node
    /// called in `term` was answered by every one of `voters` (the other voters whose process
    /// is not shown gone), some refused, and every answer's log is shorter than this node's
    /// (or as long, from a lower id). Once per term.
    pub(crate) fn retry_at_once(
        &mut self,
        me: NodeId,
        term: u64,
        leader: Option<NodeId>,
        voters: &BTreeSet<NodeId>,
    ) -> bool {
        let due = leader.is_none()
            && term == self.term
            && self.retried != Some(term)
            && !voters.is_empty()
            && voters.iter().all(|v| self.answers.contains_key(v))
            && self.answers.values().any(|a| !a.granted)
            && self
                .answers
                .iter()
                .all(|(voter, a)| (a.last_log, *voter) < (self.own, me));
        if due {
            self.retried = Some(term);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;
    use openraft::CommittedLeaderId;

    use super::*;

    fn log(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn refused(last_log: Option<LogId<NodeId>>) -> Answer {
        Answer {
            last_log,
            granted: false,
        }
    }

    #[test]
    fn after_a_split_only_the_follower_with_the_longest_log_calls_again_at_once() {
        let voters = |id: NodeId| BTreeSet::from([id]);
        // Node 2's log has the dead leader's last entry (150), node 3's does not (149); each
        // voted for itself in term 2 and refused the other.
        let (mut two, mut three) = (Ballots::default(), Ballots::default());
        two.asked(2, log(1, 150));
        three.asked(2, log(1, 149));
        check!(
            !two.retry_at_once(2, 2, None, &voters(3)),
            "not answered yet"
        );
        two.answered(2, 3, refused(log(1, 149)));
        three.answered(2, 2, refused(log(1, 150)));
        check!(two.retry_at_once(2, 2, None, &voters(3)));
        check!(!two.retry_at_once(2, 2, None, &voters(3)), "once per term");
        check!(
            !three.retry_at_once(3, 2, None, &voters(2)),
            "a longer log answered"
        );
        // Equal logs: the higher id calls.
        let (mut low, mut high) = (Ballots::default(), Ballots::default());
        low.asked(4, log(1, 150));
        high.asked(4, log(1, 150));
        low.answered(4, 3, refused(log(1, 150)));
        high.answered(4, 2, refused(log(1, 150)));
        check!(!low.retry_at_once(2, 4, None, &voters(3)));
        check!(high.retry_at_once(3, 4, None, &voters(2)));
    }

    #[test]
    fn no_call_with_a_leader_in_another_term_or_before_every_voter_answered() {
        let mut b = Ballots::default();
        b.asked(5, log(2, 40));
        b.answered(5, 3, refused(log(2, 39)));
        let voters = BTreeSet::from([3, 4]);
        check!(!b.retry_at_once(2, 5, None, &voters), "4 has not answered");
        b.answered(5, 4, refused(log(2, 38)));
        check!(
            !b.retry_at_once(2, 5, Some(4), &voters),
            "a leader is known"
        );
        check!(!b.retry_at_once(2, 6, None, &voters), "a later term");
        // An answer to an older term's request does not count for the current one.
        b.asked(6, log(2, 40));
        b.answered(5, 3, refused(log(2, 39)));
        check!(!b.retry_at_once(2, 6, None, &BTreeSet::from([3])));
        // Every voter granted: the election was won, nothing to call.
        let mut won = Ballots::default();
        won.asked(7, log(2, 40));
        won.answered(
            7,
            3,
            Answer {
                last_log: log(2, 40),
                granted: true,
            },
        );
        check!(!won.retry_at_once(2, 7, None, &BTreeSet::from([3])));
    }
}
