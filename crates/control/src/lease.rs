//! Lease arithmetic, kept pure so the timing argument (ARCHITECTURE.md, "Never two owners") is
//! unit-tested: the owner's side (`owner_lease_until`) and the leader's side (`LeaderView`,
//! and the `MemberLeases` of one assignment round).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use replicator_model::NodeId;

use crate::fence::{EnsuredUsers, FenceTopology};
use crate::state::MemberRecord;

/// Until when an owner may write after a renewal it sent at `sent` was committed and applied.
pub(crate) fn owner_lease_until(sent: Instant, expiry: Duration, margin: Duration) -> Instant {
    sent + expiry.saturating_sub(margin)
}

/// Lease extensions of renewals that were committed but not yet applied here: a renewal extends
/// the owner's lease only once the local state applied everything up to it, so that a revoke
/// ordered before it is visible in the assignments first. Kept aside instead of awaited, so
/// that a node whose apply lags (a slow disk, a follower catching up after a freeze) goes on
/// renewing: the leader judges it by its renewals, and one that stopped for `fence_after`
/// would be fenced alive.
#[derive(Debug, Default)]
pub(crate) struct PendingExtensions {
    /// (renewal index, lease end it gives), in the order the renewals were committed.
    pending: std::collections::VecDeque<(u64, Instant)>,
}

/// Most extensions kept aside; more renewals than a lease lasts are never useful at once.
const MAX_PENDING_EXTENSIONS: usize = 32;

impl PendingExtensions {
    /// A renewal committed at `index` gives a lease until `until`.
    pub(crate) fn push(&mut self, index: u64, until: Instant) {
        if self.pending.len() == MAX_PENDING_EXTENSIONS {
            self.pending.pop_front();
        }
        self.pending.push_back((index, until));
    }

    /// Whether any extension waits for its renewal to be applied.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The lease end to extend to now that the log is applied up to `applied` (the latest of
    /// the renewals applied), dropping those and the ones that ended before `now`.
    pub(crate) fn applied(&mut self, applied: u64, now: Instant) -> Option<Instant> {
        let mut until = None;
        self.pending.retain(|(index, end)| {
            if *index <= applied {
                until = until.max(Some(*end));
                false
            } else {
                *end > now
            }
        });
        until.filter(|end| *end > now)
    }
}

/// What the leader knows of the members' leases for one round.
#[derive(Debug, Default)]
pub(crate) struct MemberLeases {
    /// Members whose lease the leader considers alive: they keep and receive units.
    pub(crate) live: BTreeSet<NodeId>,
    /// Members not known alive but still inside the grace period after this leader's
    /// election: their units are neither revoked nor added to.
    pub(crate) grace: BTreeSet<NodeId>,
    /// The `last_renewal_index` the leader last observed per member (the guard of every
    /// `Revoke`).
    pub(crate) renewal_seen: BTreeMap<NodeId, u64>,
    /// Whether grants need a writer identity and failed members are fenced on the targets.
    pub(crate) fencing: bool,
    /// With fencing: members not seen renewing for `fence_after` and not in grace. They get
    /// nothing, and the ones holding a writer identity and units are fenced.
    pub(crate) unresponsive: BTreeSet<NodeId>,
    /// The member whose published config is the reference (the leader itself): a unit goes
    /// only to members whose digest for its flow equals the reference's. `None`: no check.
    pub(crate) config_reference: Option<NodeId>,
    /// With fencing: which flows write to which fenced target (the leader's config).
    pub(crate) topology: FenceTopology,
    /// With fencing: the identities (target, node, incarnation) whose user this leader made
    /// sure exists on the target; a unit writing to a fenced target is granted only to them.
    pub(crate) ensured: EnsuredUsers,
    /// With fencing: the identities whose user the leader is making sure of now, no attempt
    /// failed so far. Their members' shares of a fenced target's units are kept for them
    /// meanwhile instead of granted beyond another member's quota (see `assign::plan`).
    pub(crate) ensuring: EnsuredUsers,
}

/// The leader's memory of when it saw each member renew (its own clock, never replicated).
#[derive(Debug, Clone)]
pub(crate) struct LeaderView {
    /// The Raft term this view belongs to; a new term starts a new view.
    pub(crate) term: u64,
    /// Per member: the `last_renewal_index` seen and when it was first seen.
    seen: BTreeMap<NodeId, (u64, Instant)>,
    /// When this node started leading `term` (`None` for the record a follower keeps).
    leading_since: Option<Instant>,
    /// The leader of the term before (gets no grace: a leader's renewals did not need one).
    previous_leader: Option<NodeId>,
    /// When a new renewal of any member was last seen, and how long the log had applied none
    /// before it. Lateness is measured up to that moment, not up to now: a member is late
    /// when the others' renewals were applied and its own was not, never because nothing
    /// could commit (a slow disk, a busy leader, a membership change); and the end of a gap
    /// at least as long as a limit gives everyone a grace, as an election does.
    progress: Option<(Instant, Duration)>,
    /// Members whose process the network layer shows gone (see [`Self::peers_gone`]).
    gone: BTreeSet<NodeId>,
}

impl LeaderView {
    pub(crate) fn new(term: u64) -> Self {
        Self {
            term,
            seen: BTreeMap::new(),
            leading_since: None,
            previous_leader: None,
            progress: None,
            gone: BTreeSet::new(),
        }
    }

    /// What the network layer shows now (`network::gone`): the members whose calls were
    /// refused, or closed before an answer, twice in a row.
    /// With fencing on, such a member is unresponsive at once, grace or not, until it answers
    /// a call again (the network layer then drops it): a dead process renews no more, and
    /// waiting out `fence_after` for it is most of a follower's failover. A renewal applied
    /// since does not count as an answer: the process may have sent it just before it died
    /// (across regions a renewal takes a few hundred milliseconds to commit), and taken as a
    /// sign of life it made the leader hand the dead member a new identity and count it as
    /// eligible for units. Leases are untouched: a unit of an unfenced target still waits for
    /// its owner's lease to end, as nothing else stops a process that is alive after all.
    pub(crate) fn peers_gone(&mut self, gone: BTreeSet<NodeId>) {
        self.gone = gone;
    }

    /// A view for a new `term` that carries on from `observed`: this node's own record, kept
    /// while it followed, of when it first saw each member's latest renewal in its applied
    /// state. The owner of a lease counts from the moment it *sent* that renewal, which was
    /// before it was committed and applied anywhere, so an expiry counted from the moment
    /// this node saw it applied never ends before the owner's own. Use it only once this node
    /// has applied an entry of `term`: then every renewal committed before the election is in
    /// its applied state, and a later one shows up as a new index and is timed afresh. A
    /// member the record does not know starts at the first `observe` (a full fresh period).
    /// This is what lets a new leader reassign a dead leader's units one `expiry` after that
    /// leader's last renewal instead of one `expiry` after the election.
    /// `previous_leader`, the leader this node followed before the election, gets no grace:
    /// it wrote its renewals itself, so a lapse of them is not the election's doing, and with
    /// fencing on its units move as soon as it is fenced instead of after the grace.
    pub(crate) fn carry_on(
        term: u64,
        observed: &LeaderView,
        now: Instant,
        previous_leader: Option<NodeId>,
    ) -> Self {
        Self {
            term,
            seen: observed.seen.clone(),
            leading_since: Some(now),
            previous_leader,
            progress: observed.progress,
            gone: observed.gone.clone(),
        }
    }

    /// When this node started leading the view's term (`None` for the record a follower keeps).
    pub(crate) fn leading_since(&self) -> Option<Instant> {
        self.leading_since
    }

    /// Records the members' renewal indexes at `now`. A member seen for the first time in this
    /// view starts at `now`: a new leader gives everyone it knows nothing about a full period.
    pub(crate) fn observe(&mut self, members: &BTreeMap<NodeId, MemberRecord>, now: Instant) {
        self.seen.retain(|id, _| members.contains_key(id));
        let mut renewed = false;
        for (id, m) in members {
            match self.seen.get_mut(id) {
                Some((index, at)) if *index != m.last_renewal_index => {
                    *index = m.last_renewal_index;
                    *at = now;
                    renewed = true;
                }
                Some(_) => {}
                None => {
                    self.seen.insert(*id, (m.last_renewal_index, now));
                    renewed = true;
                }
            }
        }
        if renewed {
            let gap = self.progress.map_or(Duration::ZERO, |(last, _)| {
                now.saturating_duration_since(last)
            });
            self.progress = Some((now, gap));
        }
    }

    /// The moment lateness is measured at (see `progress`): the last renewal seen of any
    /// member, never after `now`; `now` while nothing was seen.
    fn reference(&self, now: Instant) -> Instant {
        self.progress.map_or(now, |(last, _)| last.min(now))
    }

    /// Members whose latest renewal was seen less than `expiry` before the reference moment.
    pub(crate) fn live(&self, now: Instant, expiry: Duration) -> BTreeSet<NodeId> {
        let reference = self.reference(now);
        self.seen
            .iter()
            .filter(|(_, (_, at))| reference.saturating_duration_since(*at) < expiry)
            .map(|(id, _)| *id)
            .collect()
    }

    /// What one assignment round may rely on at `now`. Members not seen renewing for `expiry`
    /// are in grace while this leader has led for less than `grace`: no renewal could commit
    /// while there was no leader, so after a slow election every member looks expired, and
    /// revoking them all at once would hand every unit to whichever member renews first and
    /// then ask for most of them back. Grace only delays a revoke (the owner's own lease
    /// ends on its own clock whatever the leader does), so it never weakens "never two owners".
    ///
    /// With `fence_after` (fencing on), members seen renewing longer ago than that are
    /// `unresponsive` unless in grace: the grace covers them too, since a member with a live
    /// lease could not renew either while there was no leader.
    pub(crate) fn liveness(
        &self,
        now: Instant,
        expiry: Duration,
        grace: Duration,
        fence_after: Option<Duration>,
    ) -> MemberLeases {
        let live = self.live(now, expiry);
        let limit = fence_after.map_or(expiry, |f| f.min(expiry));
        // Renewals were applied again after the log applied none for at least `limit`: the
        // first of them does not make every other member late (theirs follow).
        let stall_ended = self
            .progress
            .filter(|(_, gap)| *gap >= limit)
            .map(|(last, _)| last);
        let in_grace = self
            .leading_since
            .into_iter()
            .chain(stall_ended)
            .any(|since| now.saturating_duration_since(since) < grace);
        let reference = self.reference(now);
        // Members that missed their renewals: lease expired, or (fencing) `fence_after` passed.
        let late: BTreeSet<NodeId> = self
            .seen
            .iter()
            .filter(|(_, (_, at))| reference.saturating_duration_since(*at) >= limit)
            .map(|(id, _)| *id)
            .collect();
        // Members whose process the network shows gone (fencing only).
        let gone: BTreeSet<NodeId> = self
            .seen
            .keys()
            .filter(|id| fence_after.is_some() && self.gone.contains(id))
            .copied()
            .collect();
        let grace: BTreeSet<NodeId> = if in_grace {
            late.iter()
                .filter(|id| Some(**id) != self.previous_leader && !gone.contains(id))
                .copied()
                .collect()
        } else {
            BTreeSet::new()
        };
        let unresponsive = if fence_after.is_some() {
            late.difference(&grace).chain(&gone).copied().collect()
        } else {
            BTreeSet::new()
        };
        MemberLeases {
            live,
            grace,
            renewal_seen: self.renewal_seen(),
            fencing: fence_after.is_some(),
            unresponsive,
            config_reference: None,
            topology: FenceTopology::default(),
            ensured: BTreeSet::new(),
            ensuring: BTreeSet::new(),
        }
    }

    /// Whether `node`'s lease is alive at `now` (`None` if the view does not know it), by
    /// the same measure as [`LeaderView::live`].
    pub(crate) fn is_live(&self, node: NodeId, now: Instant, expiry: Duration) -> Option<bool> {
        let reference = self.reference(now);
        self.seen
            .get(&node)
            .map(|(_, at)| reference.saturating_duration_since(*at) < expiry)
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
mod pending_extension_tests {
    use std::time::{Duration, Instant};

    use super::PendingExtensions;

    #[test]
    fn an_extension_waits_for_its_renewal_to_be_applied_and_the_latest_wins() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let mut p = PendingExtensions::default();
        p.push(10, now + s(1));
        p.push(12, now + s(2));
        check(p.applied(9, now), None);
        check(p.applied(12, now), Some(now + s(2)));
        assert!(p.is_empty());
        // One that ended before its renewal was applied extends nothing and is dropped.
        p.push(20, now + s(1));
        check(p.applied(19, now + s(5)), None);
        assert!(p.is_empty());
        p.push(30, now + s(1));
        check(p.applied(30, now + s(5)), None);
    }

    fn check(got: Option<Instant>, want: Option<Instant>) {
        assert_eq!(got, want);
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

    /// Active members by id, each with its last renewal index.
    fn members(renewals: &[(NodeId, u64)]) -> BTreeMap<NodeId, MemberRecord> {
        renewals
            .iter()
            .map(|(id, renewal)| (*id, member(*renewal)))
            .collect()
    }

    /// The view of a node in `term` that saw the members' `renewals` at `at`.
    fn viewed(term: u64, renewals: &[(NodeId, u64)], at: Instant) -> LeaderView {
        let mut view = LeaderView::new(term);
        view.observe(&members(renewals), at);
        view
    }

    /// The view of a leader elected in `term` at `at`, carrying on from `observed` and then
    /// seeing the members' `renewals`.
    fn carried_on(
        term: u64,
        observed: &LeaderView,
        at: Instant,
        renewals: &[(NodeId, u64)],
    ) -> LeaderView {
        let mut view = LeaderView::carry_on(term, observed, at, None);
        view.observe(&members(renewals), at);
        view
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
        let mut view = viewed(3, &[(1, 10), (2, 11)], t0);
        // Member 1 renews, member 2 does not.
        let just_before = t0 + EXPIRY - Duration::from_millis(1);
        view.observe(&members(&[(1, 12), (2, 11)]), just_before);
        check!(view.live(just_before, EXPIRY) == BTreeSet::from([1, 2]));
        // `<` not `<=`: at exactly `expiry` the lease is over.
        view.observe(&members(&[(1, 13), (2, 11)]), t0 + EXPIRY);
        check!(view.live(t0 + EXPIRY, EXPIRY) == BTreeSet::from([1]));
    }

    #[test]
    fn a_log_that_applies_no_renewal_makes_nobody_late() {
        let t0 = Instant::now();
        let view = viewed(3, &[(1, 10), (2, 11)], t0);
        // Nothing applied for three periods (a stalled disk, a busy leader): that is nobody's
        // lapse.
        check!(view.live(t0 + EXPIRY * 3, EXPIRY) == BTreeSet::from([1, 2]));
        check!(view.is_live(2, t0 + EXPIRY * 3, EXPIRY) == Some(true));
    }

    #[test]
    fn only_a_new_renewal_index_refreshes_a_member() {
        let t0 = Instant::now();
        let mut view = viewed(1, &[(1, 10), (2, 11)], t0);
        let t1 = t0 + Duration::from_millis(1500);
        view.observe(&members(&[(1, 20), (2, 11)]), t1);
        let t2 = t0 + EXPIRY + Duration::from_millis(1);
        view.observe(&members(&[(1, 21), (2, 11)]), t2);
        check!(view.live(t2, EXPIRY) == BTreeSet::from([1]));
        check!(view.is_live(2, t2, EXPIRY) == Some(false));
        check!(view.renewal_seen() == BTreeMap::from([(1, 21), (2, 11)]));
    }

    #[test]
    fn a_new_leader_carries_on_from_what_it_saw_as_a_follower() {
        let t0 = Instant::now();
        let observed = viewed(0, &[(1, 10), (2, 11)], t0);
        // Elected 600 ms later: member 1 (the old leader) renewed nothing since, member 2 did,
        // and member 3 is new to this node.
        let t1 = t0 + Duration::from_millis(600);
        let mut view = carried_on(4, &observed, t1, &[(1, 10), (2, 12), (3, 1)]);
        check!(view.term == 4);
        check!(view.renewal_seen() == BTreeMap::from([(1, 10), (2, 12), (3, 1)]));
        // Member 1 expires one period after it was seen, not one period after the election,
        // once the others' renewals show the log moves on.
        view.observe(&members(&[(1, 10), (2, 13), (3, 2)]), t0 + EXPIRY);
        check!(view.is_live(1, t0 + EXPIRY, EXPIRY) == Some(false));
        // The renewal seen at the election, and the member seen for the first time then,
        // count from then.
        let later = t1 + EXPIRY - Duration::from_millis(1);
        view.observe(&members(&[(1, 10), (2, 13), (3, 3)]), later);
        check!(view.is_live(2, later, EXPIRY) == Some(true));
        check!(view.is_live(3, later, EXPIRY) == Some(true));
    }

    #[test]
    fn removed_members_are_forgotten() {
        let t0 = Instant::now();
        let mut view = viewed(1, &[(1, 1), (2, 2)], t0);
        view.observe(&members(&[(1, 1)]), t0);
        check!(view.is_live(2, t0, EXPIRY) == None);
    }

    const LEASE: Duration = Duration::from_millis(1500);
    const GRACE: Duration = Duration::from_millis(600);

    #[test]
    fn after_a_slow_election_expired_members_get_a_grace_to_renew() {
        let t0 = Instant::now();
        let observed = viewed(0, &[(1, 10), (2, 11)], t0);
        // Elected 3 s after anybody last renewed: nothing was applied meanwhile, so nobody
        // is late yet.
        let elected = t0 + Duration::from_secs(3);
        let mut view = carried_on(5, &observed, elected, &[(1, 10), (2, 11)]);
        let l = view.liveness(elected, LEASE, GRACE, None);
        check!(l.live == BTreeSet::from([1, 2]));
        check!(l.grace.is_empty());
        // Member 2 renews: live. Member 1 does not: 3.3 s behind the log, but the log had
        // stalled, so it gets the grace to renew; revocable once that ends.
        let renewed = elected + Duration::from_millis(300);
        view.observe(&members(&[(1, 10), (2, 20)]), renewed);
        let l = view.liveness(renewed, LEASE, GRACE, None);
        check!(l.live == BTreeSet::from([2]));
        check!(l.grace == BTreeSet::from([1]));
        let l = view.liveness(renewed + GRACE, LEASE, GRACE, None);
        check!(l.live == BTreeSet::from([2]));
        check!(l.grace.is_empty());
        check!(l.renewal_seen == BTreeMap::from([(1, 10), (2, 20)]));
    }

    #[test]
    fn a_follower_record_and_a_quick_election_give_no_grace_that_matters() {
        let t0 = Instant::now();
        let observed = viewed(0, &[(1, 10), (2, 20)], t0);
        // A follower's own record never grants grace.
        check!(observed.liveness(t0, LEASE, GRACE, None).grace.is_empty());
        // Member 2 elected 500 ms after the dead member 1's last renewal: 1 is still live by
        // its lease, and once that ends (t0 + expiry, after the grace) it is revocable at once.
        let elected = t0 + Duration::from_millis(500);
        let mut view = LeaderView::carry_on(2, &observed, elected, None);
        view.observe(&members(&[(1, 10), (2, 21)]), elected);
        view.observe(&members(&[(1, 10), (2, 22)]), t0 + LEASE);
        let l = view.liveness(t0 + LEASE, LEASE, GRACE, None);
        check!(l.live == BTreeSet::from([2]));
        check!(l.grace.is_empty());
    }
}

#[cfg(test)]
mod fencing_tests {
    use assert2::check;

    use super::*;
    use crate::state::MemberState;

    const LEASE: Duration = Duration::from_millis(1500);
    const GRACE: Duration = Duration::from_millis(600);
    const FENCE_AFTER: Duration = Duration::from_millis(600);

    fn members(renewals: &[(NodeId, u64)]) -> BTreeMap<NodeId, MemberRecord> {
        renewals
            .iter()
            .map(|(id, renewal)| {
                let m = MemberRecord {
                    raft_addr: String::new(),
                    api_addr: String::new(),
                    state: MemberState::Active,
                    last_renewal_index: *renewal,
                    last_revoke_index: 0,
                };
                (*id, m)
            })
            .collect()
    }

    #[test]
    fn a_member_that_misses_renewals_is_unresponsive_long_before_its_lease_ends() {
        let t0 = Instant::now();
        let mut view = LeaderView::new(1);
        view.observe(&members(&[(1, 10), (2, 11)]), t0);
        let t1 = t0 + Duration::from_millis(400);
        view.observe(&members(&[(1, 10), (2, 12)]), t1);
        let at = t0 + FENCE_AFTER;
        view.observe(&members(&[(1, 10), (2, 13)]), at);
        let l = view.liveness(at, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.fencing);
        check!(
            l.live == BTreeSet::from([1, 2]),
            "both leases are still alive"
        );
        check!(l.unresponsive == BTreeSet::from([1]));
        // Without fencing nobody is unresponsive.
        check!(view
            .liveness(at, LEASE, GRACE, None)
            .unresponsive
            .is_empty());
    }

    #[test]
    fn after_an_election_only_the_previous_leader_goes_without_grace() {
        let t0 = Instant::now();
        let mut observed = LeaderView::new(0);
        observed.observe(&members(&[(1, 10), (2, 11), (3, 12)]), t0);
        // Member 1 led and died; member 3 won the election 700 ms later. Member 2 has not
        // renewed through the new leader yet.
        let elected = t0 + Duration::from_millis(700);
        let mut view = LeaderView::carry_on(5, &observed, elected, Some(1));
        view.observe(&members(&[(1, 10), (2, 11), (3, 13)]), elected);
        let l = view.liveness(elected, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive == BTreeSet::from([1]));
        check!(l.grace == BTreeSet::from([2]));
        // After the grace, member 2 is unresponsive too unless it renewed; member 3 did.
        view.observe(&members(&[(1, 10), (2, 11), (3, 14)]), elected + GRACE / 2);
        let l = view.liveness(elected + GRACE, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive == BTreeSet::from([1, 2]));
    }

    #[test]
    fn a_member_whose_process_is_gone_is_unresponsive_at_once_until_it_answers_again() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut view = LeaderView::new(1);
        view.observe(&members(&[(1, 10), (2, 11), (3, 12)]), t0);
        // Member 2's calls were refused twice, 100 ms after its latest renewal: fenced at
        // once, well before `fence_after`, though every lease is alive.
        let at = t0 + ms(150);
        view.peers_gone(BTreeSet::from([2]));
        let l = view.liveness(at, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive == BTreeSet::from([2]));
        check!(l.live == BTreeSet::from([1, 2, 3]));
        // Without fencing the evidence changes nothing: leases alone move units then.
        check!(view
            .liveness(at, LEASE, GRACE, None)
            .unresponsive
            .is_empty());
        // A renewal applied after the latest failure proves nothing: the process may have
        // sent it before it died.
        view.observe(&members(&[(1, 10), (2, 13), (3, 12)]), t0 + ms(200));
        let l = view.liveness(t0 + ms(200), LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive == BTreeSet::from([2]));
        // It answered a call (restarted): the network layer shows it gone no more.
        view.peers_gone(BTreeSet::new());
        let l = view.liveness(t0 + ms(250), LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive.is_empty());
    }

    #[test]
    fn a_new_leader_gives_no_grace_to_a_member_whose_process_is_gone() {
        let t0 = Instant::now();
        let mut observed = LeaderView::new(0);
        observed.observe(&members(&[(1, 10), (2, 11), (3, 12)]), t0);
        let elected = t0 + Duration::from_millis(700);
        let mut view = LeaderView::carry_on(5, &observed, elected, Some(1));
        view.observe(&members(&[(1, 10), (2, 11), (3, 13)]), elected);
        // Member 2 has not renewed through the new leader yet, and its calls were refused.
        view.peers_gone(BTreeSet::from([2]));
        let l = view.liveness(elected, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive == BTreeSet::from([1, 2]));
        check!(l.grace.is_empty());
    }

    #[test]
    fn a_stall_of_the_log_fences_no_one_and_its_end_gives_a_grace() {
        let t0 = Instant::now();
        let mut view = LeaderView::new(1);
        view.observe(&members(&[(1, 10), (2, 11), (3, 12)]), t0);
        // Two seconds without an applied renewal (the leader's own disk stalled): nobody is
        // unresponsive, every lease alive.
        let stalled = t0 + Duration::from_secs(2);
        let l = view.liveness(stalled, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive.is_empty());
        check!(l.live == BTreeSet::from([1, 2, 3]));
        // The log moves again: member 3's renewal comes first. The others are 2 s behind it,
        // but their renewals were waiting in the same stall: a grace, not a fence.
        view.observe(&members(&[(1, 10), (2, 11), (3, 13)]), stalled);
        let l = view.liveness(stalled, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive.is_empty());
        check!(l.grace == BTreeSet::from([1, 2]));
        // Member 1 renews; member 2 never does: unresponsive once the grace is over.
        view.observe(&members(&[(1, 14), (2, 11), (3, 15)]), stalled + GRACE / 2);
        let after = stalled + GRACE;
        view.observe(&members(&[(1, 16), (2, 11), (3, 17)]), after);
        let l = view.liveness(after, LEASE, GRACE, Some(FENCE_AFTER));
        check!(l.unresponsive == BTreeSet::from([2]));
        check!(l.grace.is_empty());
    }
}
