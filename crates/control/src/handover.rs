//! A graceful stop's last step on the leader: it hands its leadership to a follower before the
//! process exits.
//!
//! Why: openraft 0.9 has no leadership transfer. When a leader simply stops, a follower calls
//! an election only once its leader lease (`election_timeout_max`) and a random election
//! timeout have passed since the last heartbeat, and until a new leader is elected nothing
//! commits: no lease renewal, offset commit or grant. That is about a second on the default
//! timings and more across regions, at every rolling restart, and long enough for leases to
//! come close to expiring.
//!
//! How:
//! 1. The leader waits until it has led for `election_timeout_max` (step 5 says why), then
//!    stops writing: its own writes and forwarded ones are answered "retry"
//!    (`NodeInner::local_write`), and the assignment loop skips its rounds.
//! 2. It waits until everything it appended is applied, so its log no longer grows, then picks
//!    a voter whose log matches all of it ([`successor`]).
//! 3. It asks that follower to call an election now ([`crate::network::TakeOver`]); the
//!    follower first waits until its log holds the leader's last entry.
//! 4. The stopping leader grants the vote, and with the candidate's own vote that is a majority
//!    of three voters: the candidate wins in one round trip while the third voter still refuses
//!    by lease, and the old leader becomes a follower.
//! 5. Why the old leader votes at all: openraft's voters refuse a candidate while their
//!    leader's lease runs, but a leader counts its own lease from its election, not from its
//!    heartbeats, so it votes for a log as long as its own in a higher term once it has led for
//!    `election_timeout_max`.
//!
//! With more than three voters two votes are not a majority and the others refuse until their
//! lease runs out, so no handover is tried there; nor when the membership is changing. Members
//! of an older release answer the request with 404, which is taken as a refusal: the stop then
//! goes on as before, and so it does after any failure here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

use openraft::ServerState;
use replicator_model::NodeId;

use crate::network::{paths, TakeOver, TakeOverReply};
use crate::node::NodeInner;
use crate::state::MemberState;

/// The voters of a three-member (or smaller) cluster: the most a handover can win with the
/// old leader's and the candidate's own votes.
const MOST_VOTERS: usize = 3;

/// What the leader knows when it picks its successor.
#[derive(Debug, Clone)]
pub(crate) struct Candidates {
    /// This node, the leader.
    pub(crate) leader: NodeId,
    /// The voters of the current membership (empty when it is a joint one).
    pub(crate) voters: BTreeSet<NodeId>,
    /// The index of the last entry of the leader's log.
    pub(crate) last_log_index: Option<u64>,
    /// Per follower, the index of the last entry the leader knows it holds.
    pub(crate) matched: BTreeMap<NodeId, Option<u64>>,
    /// Members whose process was shown gone.
    pub(crate) gone: BTreeSet<NodeId>,
    /// Members marked `Leaving` in the replicated state (stopping or being removed).
    pub(crate) leaving: BTreeSet<NodeId>,
}

/// The follower to hand the leadership to: a voter whose log holds all of the leader's, whose
/// process is not shown gone and that is not leaving itself; the lowest id among several.
/// `None` when there is none, or when the old leader's and the candidate's votes would not be
/// a majority.
pub(crate) fn successor(c: &Candidates) -> Option<NodeId> {
    if c.voters.len() > MOST_VOTERS || !c.voters.contains(&c.leader) {
        return None;
    }
    c.voters
        .iter()
        .copied()
        .filter(|id| *id != c.leader && !c.gone.contains(id) && !c.leaving.contains(id))
        .find(|id| c.matched.get(id).copied().flatten() >= c.last_log_index)
}

/// How a handover ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Handover {
    /// This node did not lead.
    NotLeader,
    /// `to` leads now.
    HandedTo {
        /// The new leader.
        to: NodeId,
    },
    /// Not handed over; this node still leads or nobody does (the stop goes on as before).
    NotHanded {
        /// Why.
        reason: String,
    },
}

/// Hands this node's leadership to a follower, if it leads; see the module docs. This node
/// refuses writes from when its lease allows the handover until the handover ends; afterwards
/// they go to whichever node leads.
pub(crate) async fn hand_over(node: &NodeInner) -> Handover {
    let term = {
        let metrics = node.raft.metrics();
        let m = metrics.borrow();
        if m.state != ServerState::Leader || m.current_leader != Some(node.id) {
            return Handover::NotLeader;
        }
        m.current_term
    };
    // A leader votes for nobody within its lease of its own election (module docs, step 5);
    // wait that out before writes stop, not while they are refused.
    if let Some(since) = node.leading_since(term) {
        let votes_at = since + node.timing.election_timeout_max;
        if votes_at > Instant::now() {
            tokio::time::sleep_until(votes_at.into()).await;
        }
    }
    node.handing_over.store(true, Ordering::SeqCst);
    let handed = try_hand_over(node, term).await;
    node.handing_over.store(false, Ordering::SeqCst);
    handed
}

async fn try_hand_over(node: &NodeInner, term: u64) -> Handover {
    let timing = &node.timing;
    // Writes that passed the gate before it closed may still append: wait for them.
    let settled = node
        .raft
        .wait(Some(timing.write_timeout))
        .metrics(
            |m| m.last_applied.map(|l| l.index) == m.last_log_index,
            "the leader's log settled",
        )
        .await;
    let m = match settled {
        Ok(m) => m,
        Err(e) => {
            return Handover::NotHanded {
                reason: format!("the log did not settle: {e}"),
            }
        }
    };
    if m.current_term != term || m.current_leader != Some(node.id) {
        return Handover::NotHanded {
            reason: "no longer the leader".into(),
        };
    }
    let membership = m.membership_config.membership();
    let voters = if membership.get_joint_config().len() == 1 {
        membership.voter_ids().collect()
    } else {
        BTreeSet::new()
    };
    let candidates = Candidates {
        leader: node.id,
        voters,
        last_log_index: m.last_log_index,
        matched: m
            .replication
            .as_ref()
            .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
            .unwrap_or_default(),
        gone: node.peers.gone_peers().into_keys().collect(),
        leaving: node
            .shared
            .read()
            .state
            .members
            .iter()
            .filter(|(_, r)| r.state == MemberState::Leaving)
            .map(|(id, _)| *id)
            .collect(),
    };
    let Some(to) = successor(&candidates) else {
        return Handover::NotHanded {
            reason: format!("no voter to hand over to ({candidates:?})"),
        };
    };
    let Some(addr) = membership.get_node(&to).map(|n| n.raft_addr.clone()) else {
        return Handover::NotHanded {
            reason: format!("no address for node {to}"),
        };
    };
    let req = TakeOver {
        leader: node.id,
        term,
        last_log_index: m.last_log_index.unwrap_or(0),
    };
    // The follower may wait up to one RPC timeout for its log before it answers.
    let answer = node
        .peers
        .call::<_, TakeOverReply>(to, &addr, paths::TAKE_OVER, &req, timing.rpc_timeout * 2)
        .await;
    match answer {
        Ok(TakeOverReply::Called) => {}
        Ok(TakeOverReply::Declined { reason }) => {
            return Handover::NotHanded {
                reason: format!("node {to} declined: {reason}"),
            }
        }
        Err(e) => {
            return Handover::NotHanded {
                reason: format!("node {to} not asked: {e}"),
            }
        }
    }
    // Its vote request, then its first heartbeat: two round trips; more is a lost election.
    let led = node
        .raft
        .wait(Some(timing.rpc_timeout * 2))
        .metrics(
            |m| m.current_leader.is_some_and(|l| l != node.id),
            "another node leads",
        )
        .await;
    match led {
        Ok(m) => Handover::HandedTo {
            to: m.current_leader.unwrap_or(to),
        },
        Err(e) => Handover::NotHanded {
            reason: format!("node {to} called an election but does not lead: {e}"),
        },
    }
}

impl NodeInner {
    /// A follower's answer to a stopping leader's [`TakeOver`]: calls an election once its
    /// log holds the leader's last entry, unless the request is not from its leader in its
    /// term, or this node is no voter or is stopping itself.
    pub(crate) async fn take_over(&self, req: TakeOver) -> TakeOverReply {
        let declined = |reason: String| TakeOverReply::Declined { reason };
        {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            if m.current_leader != Some(req.leader) || m.current_term != req.term {
                return declined(format!(
                    "node {} in term {} is not the leader here (leader {:?}, term {})",
                    req.leader, req.term, m.current_leader, m.current_term
                ));
            }
            if !m
                .membership_config
                .membership()
                .voter_ids()
                .any(|v| v == self.id)
            {
                return declined("not a voter".into());
            }
        }
        if self.draining.load(Ordering::SeqCst) || self.leaving.load(Ordering::SeqCst) {
            return declined("this node is stopping too".into());
        }
        let caught_up = self
            .raft
            .wait(Some(self.timing.rpc_timeout))
            .log_index_at_least(Some(req.last_log_index), "the leader's last entry")
            .await;
        if let Err(e) = caught_up {
            return declined(format!("log not caught up: {e}"));
        }
        tracing::info!(node = %self.id, leader = %req.leader, term = req.term, "the stopping leader hands over: calling an election");
        match self.raft.trigger().elect().await {
            Ok(()) => TakeOverReply::Called,
            Err(e) => declined(format!("election not called: {e}")),
        }
    }

    /// Since when this node leads `term`, as its assignment loop's published view says.
    fn leading_since(&self, term: u64) -> Option<Instant> {
        self.leader_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|view| view.term == term)
            .and_then(crate::lease::LeaderView::leading_since)
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    fn three(matched: [(NodeId, Option<u64>); 2]) -> Candidates {
        Candidates {
            leader: 1,
            voters: BTreeSet::from([1, 2, 3]),
            last_log_index: Some(10),
            matched: matched.into_iter().collect(),
            gone: BTreeSet::new(),
            leaving: BTreeSet::new(),
        }
    }

    #[test]
    fn the_successor_holds_all_of_the_leaders_log() {
        check!(successor(&three([(2, Some(9)), (3, Some(10))])) == Some(3));
        check!(successor(&three([(2, Some(10)), (3, Some(10))])) == Some(2));
        check!(successor(&three([(2, Some(9)), (3, None)])) == None);
    }

    #[test]
    fn a_gone_or_leaving_follower_is_not_the_successor() {
        let mut c = three([(2, Some(10)), (3, Some(10))]);
        c.gone.insert(2);
        check!(successor(&c) == Some(3));
        c.leaving.insert(3);
        check!(successor(&c) == None);
    }

    #[test]
    fn no_handover_where_two_votes_are_no_majority_or_the_membership_changes() {
        let mut five = three([(2, Some(10)), (3, Some(10))]);
        five.voters.extend([4, 5]);
        check!(successor(&five) == None);
        let mut joint = three([(2, Some(10)), (3, Some(10))]);
        joint.voters.clear();
        check!(successor(&joint) == None);
    }

    #[test]
    fn a_learner_is_not_the_successor() {
        let mut c = three([(2, Some(10)), (4, Some(10))]);
        c.voters = BTreeSet::from([1, 2]);
        c.matched.insert(2, Some(8));
        check!(successor(&c) == None);
        c.matched.insert(2, Some(10));
        check!(successor(&c) == Some(2));
    }
}
