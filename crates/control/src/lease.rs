//! Lease arithmetic, kept pure so the timing argument (crate docs, "Never two owners") is
//! unit-tested: the owner's side (`owner_lease_until`) and the leader's side (`LeaderView`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use replicator_model::NodeId;

use crate::state::MemberRecord;

/// Until when an owner may write after a renewal it sent at `sent` was committed and applied.
pub(crate) fn owner_lease_until(sent: Instant, expiry: Duration, margin: Duration) -> Instant {
    sent + expiry.saturating_sub(margin)
}

/// The leader's memory of when it saw each member renew (its own clock, never replicated).
#[derive(Debug, Clone)]
pub(crate) struct LeaderView {
    /// The Raft term this view belongs to; a new term starts a new view.
    pub(crate) term: u64,
    /// Per member: the `last_renewal_index` seen and when it was first seen.
    seen: BTreeMap<NodeId, (u64, Instant)>,
}

impl LeaderView {
    pub(crate) fn new(term: u64) -> Self {
        Self {
            term,
            seen: BTreeMap::new(),
        }
    }

    /// Records the members' renewal indexes at `now`. A member seen for the first time in this
    /// term starts at `now`: a new leader gives everyone a full fresh period.
    pub(crate) fn observe(&mut self, members: &BTreeMap<NodeId, MemberRecord>, now: Instant) {
        self.seen.retain(|id, _| members.contains_key(id));
        for (id, m) in members {
            match self.seen.get_mut(id) {
                Some((index, at)) if *index != m.last_renewal_index => {
                    *index = m.last_renewal_index;
                    *at = now;
                }
                Some(_) => {}
                None => {
                    self.seen.insert(*id, (m.last_renewal_index, now));
                }
            }
        }
    }

    /// Members whose latest renewal was seen less than `expiry` ago.
    pub(crate) fn live(&self, now: Instant, expiry: Duration) -> BTreeSet<NodeId> {
        self.seen
            .iter()
            .filter(|(_, (_, at))| now.saturating_duration_since(*at) < expiry)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether `node`'s lease is alive at `now` (`None` if the view does not know it).
    pub(crate) fn is_live(&self, node: NodeId, now: Instant, expiry: Duration) -> Option<bool> {
        self.seen
            .get(&node)
            .map(|(_, at)| now.saturating_duration_since(*at) < expiry)
    }

    /// The renewal index seen per member (the guard carried by `Revoke`).
    pub(crate) fn renewal_seen(&self) -> BTreeMap<NodeId, u64> {
        self.seen
            .iter()
            .map(|(id, (index, _))| (*id, *index))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use crate::state::MemberState;

    fn member(renewal: u64) -> MemberRecord {
        MemberRecord {
            raft_addr: String::new(),
            api_addr: String::new(),
            state: MemberState::Active,
            last_renewal_index: renewal,
            last_revoke_index: 0,
        }
    }

    const EXPIRY: Duration = Duration::from_secs(2);

    #[test]
    fn owner_stops_margin_before_expiry() {
        let t0 = Instant::now();
        check!(
            owner_lease_until(t0, EXPIRY, Duration::from_millis(200))
                == t0 + Duration::from_millis(1800)
        );
        // A margin larger than the expiry never yields a lease in the past of `sent`.
        check!(owner_lease_until(t0, EXPIRY, Duration::from_secs(5)) == t0);
    }

    #[test]
    fn new_leader_gives_everyone_a_full_period() {
        let t0 = Instant::now();
        let mut view = LeaderView::new(3);
        view.observe(&BTreeMap::from([(1, member(10)), (2, member(11))]), t0);
        check!(view.live(t0 + EXPIRY - Duration::from_millis(1), EXPIRY) == BTreeSet::from([1, 2]));
        // `<` not `<=`: at exactly `expiry` the lease is over.
        check!(view.live(t0 + EXPIRY, EXPIRY).is_empty());
    }

    #[test]
    fn only_a_new_renewal_index_refreshes_a_member() {
        let t0 = Instant::now();
        let mut view = LeaderView::new(1);
        view.observe(&BTreeMap::from([(1, member(10)), (2, member(11))]), t0);
        let t1 = t0 + Duration::from_millis(1500);
        view.observe(&BTreeMap::from([(1, member(20)), (2, member(11))]), t1);
        let t2 = t0 + EXPIRY + Duration::from_millis(1);
        check!(view.live(t2, EXPIRY) == BTreeSet::from([1]));
        check!(view.is_live(2, t2, EXPIRY) == Some(false));
        check!(view.renewal_seen() == BTreeMap::from([(1, 20), (2, 11)]));
    }

    #[test]
    fn removed_members_are_forgotten() {
        let t0 = Instant::now();
        let mut view = LeaderView::new(1);
        view.observe(&BTreeMap::from([(1, member(1)), (2, member(2))]), t0);
        view.observe(&BTreeMap::from([(1, member(1))]), t0);
        check!(view.is_live(2, t0, EXPIRY) == None);
    }
}
