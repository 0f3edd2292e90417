//! The leader's assignment decision: a pure function from the replicated state and the set of
//! members whose lease is alive to the commands of one assignment round.
//!
//! Rules, in order:
//! 1. a unit whose owner is gone or whose lease expired is revoked (guarded by the renewal
//!    index the leader saw, see `ControlCommand::Revoke`), unless the owner is in the grace
//!    period a new leader gives every member after its election (their renewals could not
//!    commit while there was no leader);
//! 2. a unit of a live `Leaving` member is requested back;
//! 3. every eligible (live and `Active`) member gets a quota: `n / k` units, and the `n % k`
//!    members that own the most units now get one more, so that as few units as possible move;
//! 4. members above their quota are asked to release the excess (never taken: a live owner
//!    keeps a unit until it hands it back);
//! 5. unowned units go to the members furthest below their quota (lowest id on ties); with
//!    fencing, a unit of a fenced target that only a member at its quota may take now stays
//!    unowned while a member below its quota is having its user there made sure of
//!    (`MemberLeases::ensuring`): a new cluster's first ensure would otherwise take every
//!    member's share, handed back a few hundred milliseconds later (BENCHMARKS.md section 43).
//!    A failed attempt ends the wait.
//!
//! Members whose config of a flow differs from the leader's (`PublishConfig` digests, see
//! [`MemberLeases::config_reference`]) get no unit of that flow, and are asked back the ones they
//! own: a node that cannot run a flow as the others do never holds its units.
//!
//! A retired unit (no longer reported by discovery) or a unit of a paused flow stays with its
//! owner, which was asked to hand it back; it is revoked like any other when the owner's lease
//! expired, and never granted.
//!
//! With fencing on (`MemberLeases::fencing`), a unit writing to a fenced target goes only to a
//! member whose current identity is usable and whose user the leader made sure exists there;
//! a member without one (none yet, or fenced) keeps and gets units of unfenced targets.
//! Fencing is per (member, target): a failed member's unit that writes to the fenced target T
//! is never revoked here while the member's identity may have rights on T; the leader commits
//! `FenceMember`, revokes the identity on each fenced target and commits a `FenceTarget` per
//! acknowledging target, which takes the member's units writing there (see [`fence_work`]). A
//! target that cannot acknowledge holds back only the units writing to it. Units writing to an
//! unfenced target, of a flow the leader's config does not have, or owned by a member whose
//! config of their flow differs from the leader's (during a rolling change that turns fencing
//! on, it may write with the configured credential, which no revoke stops) move on the lease
//! alone, by rule 1, whatever happened to the member's identity.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use replicator_model::{NodeId, WorkUnit};

use crate::command::ControlCommand;
use crate::fence::{EnsuredUsers, FenceTopology};
use crate::format;
use crate::lease::{LeaderView, MemberLeases};
use crate::params::ControlTiming;
use crate::retention::Retention;
use crate::state::{ControlState, MemberState};

/// Most commands in one assignment round: keeps a round's log entry small (about 40 bytes a
/// command) however many units there are; the rest follows in the next rounds.
pub(crate) const MAX_COMMANDS_PER_ROUND: usize = 1000;

// What a member may be given, as far as its lease and fencing go (the leases themselves are
// `lease`'s).
impl MemberLeases {
    /// Whether `node` may get `unit` as far as fencing goes: fencing off, an unfenced target,
    /// or the node's current identity usable and ensured on the unit's target.
    fn may_write(&self, state: &ControlState, node: NodeId, unit: &WorkUnit) -> bool {
        if !self.fencing {
            return true;
        }
        let Some(target) = self.topology.fenced_target(&unit.flow) else {
            return true;
        };
        state.identities.get(&node).is_some_and(|i| {
            !i.fenced
                && self
                    .ensured
                    .contains(&(target.to_owned(), node, i.incarnation))
        })
    }

    /// Whether `node` may not get `unit` only because the leader is making sure of its user
    /// on the unit's fenced target now (`ensuring`), no attempt failed so far.
    fn awaits_ensure(&self, state: &ControlState, node: NodeId, unit: &WorkUnit) -> bool {
        if !self.fencing {
            return false;
        }
        let Some(target) = self.topology.fenced_target(&unit.flow) else {
            return false;
        };
        state.identities.get(&node).is_some_and(|i| {
            let key = (target.to_owned(), node, i.incarnation);
            !i.fenced && !self.ensured.contains(&key) && self.ensuring.contains(&key)
        })
    }

    /// The fenced target whose revoke of `node`'s identity stops `node`'s writes of `flow`:
    /// fencing on, the flow writes to a fenced target in the leader's config, and `node` runs
    /// the flow as the leader does. A member whose config of the flow differs (a rolling
    /// change that turns fencing on for the target, not applied there yet) may write with the
    /// cluster's configured credential, which no revoke stops: its units of the flow move on
    /// the lease alone, as units of an unfenced target do.
    pub(crate) fn fenced_for(
        &self,
        state: &ControlState,
        node: NodeId,
        flow: &str,
    ) -> Option<&str> {
        if !self.fencing {
            return None;
        }
        self.topology
            .fenced_target(flow)
            .filter(|_| config_agrees(state, self.config_reference, node, flow))
    }
}

/// Whether `node` runs `flow` as the member whose config is the `reference` does (no
/// reference: no check).
pub(crate) fn config_agrees(
    state: &ControlState,
    reference: Option<NodeId>,
    node: NodeId,
    flow: &str,
) -> bool {
    reference.is_none_or(|reference| state.config_agrees(reference, node, flow))
}

/// What fencing needs now: commands to write with the round, and operations on the targets.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FenceWork {
    /// `FenceMember`, `IdentityRevoked`, `SetWriterIdentity` and `ReplaceFencedIdentity`
    /// decisions: no target work.
    pub(crate) commands: Vec<ControlCommand>,
    /// (node, incarnation, target): revoke the fenced identity on the target, then commit
    /// `FenceTarget` (which takes the member's units writing there).
    pub(crate) revoke: Vec<(NodeId, u64, String)>,
    /// (node, incarnation, target): make sure the usable identity's user exists on the
    /// target (this leader's memory, `MemberLeases::ensured`, records it).
    pub(crate) ensure: Vec<(NodeId, u64, String)>,
    /// Stale identities whose users are to be revoked on every fenced target, then forgotten.
    pub(crate) forget: Vec<(NodeId, u64)>,
}

impl FenceWork {
    /// Carries on the revoke of the fenced identity (`node`, `incarnation`): a revoke on each
    /// of `targets` not in `acknowledged`, or `IdentityRevoked` once there is none. Returns
    /// the targets still to acknowledge.
    fn carry_on_revoke<'t>(
        &mut self,
        node: NodeId,
        incarnation: u64,
        targets: &BTreeSet<&'t str>,
        acknowledged: &BTreeSet<&str>,
    ) -> Vec<&'t str> {
        let missing: Vec<&'t str> = targets
            .iter()
            .filter(|t| !acknowledged.contains(*t))
            .copied()
            .collect();
        if missing.is_empty() {
            self.commands
                .push(ControlCommand::IdentityRevoked { node, incarnation });
        }
        self.revoke
            .extend(missing.iter().map(|t| (node, incarnation, (*t).to_owned())));
        missing
    }
}

/// The work fencing needs now (nothing with fencing off):
/// * a member that stopped renewing (unresponsive, or its lease expired) and owns units
///   writing to a fenced target while its identity has rights: fence it (`FenceMember`);
/// * a fenced identity: revoke it on every fenced target that did not acknowledge yet, each
///   acknowledgement committed on its own (`FenceTarget`); once all did, `IdentityRevoked`;
/// * a usable identity: make sure its user exists on every fenced target (at the start of a
///   term, when the config gains a target, for a new identity);
/// * a live, active, responsive member without an identity, or whose identity was revoked:
///   its next incarnation (one above every incarnation it ever had); one whose fenced
///   identity some target did not acknowledge yet gets it too (`ReplaceFencedIdentity`),
///   the old identity's units of those targets held until they do, and its revoke goes on;
/// * every stale identity: make sure its users are revoked, then forget it.
pub(crate) fn fence_work(state: &ControlState, lease: &MemberLeases) -> FenceWork {
    let mut work = FenceWork::default();
    if !lease.fencing {
        return work;
    }
    let targets = lease.topology.fenced_targets();
    // Members owning a unit that writes to a fenced target, which their revoke there stops.
    let owners: BTreeSet<NodeId> = state
        .units
        .iter()
        .filter_map(|(u, r)| {
            r.owner
                .filter(|o| lease.fenced_for(state, *o, &u.flow).is_some())
        })
        .collect();
    for (node, identity) in &state.identities {
        let (node, incarnation) = (*node, identity.incarnation);
        if !identity.fenced {
            let failed = lease.unresponsive.contains(&node) || !lease.live.contains(&node);
            if failed && !lease.grace.contains(&node) && owners.contains(&node) {
                work.commands
                    .push(ControlCommand::FenceMember { node, incarnation });
            } else if !failed {
                work.ensure.extend(
                    targets
                        .iter()
                        .filter(|t| {
                            !lease
                                .ensured
                                .contains(&((**t).to_owned(), node, incarnation))
                        })
                        .map(|t| (node, incarnation, (*t).to_owned())),
                );
            }
            continue;
        }
        if identity.revoked {
            continue;
        }
        // A fence decided by this leader or an earlier one is carried on, target by target.
        let acknowledged = state.revoked_targets(node, incarnation);
        let missing = work.carry_on_revoke(node, incarnation, &targets, &acknowledged);
        // Live again (restarted, or back from a freeze) while a target is still to
        // acknowledge: the next identity now, so that one target's outage does not keep the
        // member from the others; what the old one held there stays held.
        let member_ok = state.members.get(&node).is_some_and(|m| {
            m.state == MemberState::Active
                && lease.live.contains(&node)
                && !lease.unresponsive.contains(&node)
        });
        if member_ok && !missing.is_empty() {
            work.commands.push(ControlCommand::ReplaceFencedIdentity {
                node,
                fenced: incarnation,
                incarnation: highest_incarnation(state, node) + 1,
                held_flows: missing
                    .iter()
                    .flat_map(|t| lease.topology.flows_into(t))
                    .filter(|flow| config_agrees(state, lease.config_reference, node, flow))
                    .collect(),
            });
        }
    }
    for ((node, incarnation), acknowledged) in state.pending_revokes() {
        work.carry_on_revoke(node, incarnation, &targets, &acknowledged);
    }
    for (node, member) in &state.members {
        if state.has_unrevoked_identity(*node)
            || member.state != MemberState::Active
            || !lease.live.contains(node)
            || lease.unresponsive.contains(node)
        {
            continue;
        }
        work.commands.push(ControlCommand::SetWriterIdentity {
            node: *node,
            incarnation: highest_incarnation(state, *node) + 1,
            password: String::new(),
        });
    }
    work.forget = state.stale_identities.iter().copied().collect();
    work
}

/// The highest incarnation `node` ever had: current, replaced, stale or forgotten.
fn highest_incarnation(state: &ControlState, node: NodeId) -> u64 {
    state
        .stale_identities
        .iter()
        .chain(&state.revoke_pending)
        .filter(|(n, _)| *n == node)
        .map(|(_, i)| *i)
        .chain(state.identities.get(&node).map(|i| i.incarnation))
        .chain(state.forgotten_incarnations.get(&node).copied())
        .max()
        .unwrap_or(0)
}

/// What a leader knows of the fenced targets when a round starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct FencingView {
    /// Which flows write to which fenced target (the leader's config).
    pub(crate) topology: FenceTopology,
    /// The identities whose user this leader ensured on a target in its term.
    pub(crate) ensured: EnsuredUsers,
    /// The identities whose user it is ensuring now, no attempt failed so far.
    pub(crate) ensuring: EnsuredUsers,
}

/// What a leader's round needs besides the state and its own memory.
#[derive(Debug)]
pub(crate) struct RoundContext<'a> {
    /// The leader's clock, read once the state is locked (see `run_assigner`).
    pub(crate) now: Instant,
    /// The cluster's timings.
    pub(crate) timing: &'a ControlTiming,
    /// The leading node: its published config is the reference.
    pub(crate) leader: NodeId,
    /// With fencing on: what the leader knows of the fenced targets.
    pub(crate) fencing: Option<FencingView>,
    /// How many changes a round can see the state has had (`Shared::round_changes`).
    pub(crate) changes: u64,
    /// The config digests the leader's process runs (`None`: it published none, no check).
    pub(crate) own_config: Option<&'a BTreeMap<String, String>>,
    /// The members whose process the network layer found gone (`LeaderView::peers_gone`).
    pub(crate) gone: BTreeSet<NodeId>,
    /// Targets' acknowledgements of revokes (`FenceTarget`) not committed yet: the round
    /// writes them first and decides on the state as they leave it, so that the units they
    /// free are granted in the same entry (see [`round`]).
    pub(crate) acknowledged: &'a [ControlCommand],
}

/// What a round decides from besides the state itself: the state's change count, the term and
/// the leases as judged now. Equal inputs mean equal decisions (`plan`, `fence_work` and the
/// level to raise are pure functions of the state and the leases; a lease renewal moves only
/// `MemberLeases::renewal_seen`, which a `Revoke` carries but nothing decides on).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RoundInputs {
    changes: u64,
    term: u64,
    live: BTreeSet<NodeId>,
    grace: BTreeSet<NodeId>,
    unresponsive: BTreeSet<NodeId>,
    fencing: bool,
    config_reference: Option<NodeId>,
    topology: FenceTopology,
    ensured: EnsuredUsers,
    ensuring: EnsuredUsers,
}

impl RoundInputs {
    fn of(changes: u64, term: u64, lease: &MemberLeases) -> Self {
        Self {
            changes,
            term,
            live: lease.live.clone(),
            grace: lease.grace.clone(),
            unresponsive: lease.unresponsive.clone(),
            fencing: lease.fencing,
            config_reference: lease.config_reference,
            topology: lease.topology.clone(),
            ensured: lease.ensured.clone(),
            ensuring: lease.ensuring.clone(),
        }
    }
}

/// The leader's memory of its last round that decided nothing. A round on the same inputs
/// would decide nothing again, so it is skipped: an idle leader then costs nothing per unit
/// (at 10,000 units a round walks every unit twice, about a millisecond, ten times a second).
/// A round that decided something, or whose retention clock runs (a unit is waiting to be
/// forgotten), is never skipped.
#[derive(Debug, Default)]
pub(crate) struct Quiet {
    inputs: Option<RoundInputs>,
    /// Rounds skipped so far.
    pub(crate) skipped: u64,
}

/// One whole round of the leader: it observes the renewals in `state` on its `view`, judges
/// the leases, and returns the commands to write as one batch (fence decisions first: a
/// round's grants never depend on them, and a revoke starts only once its decision is
/// applied) and the work on the targets for the fence tracker. The one home of what a round
/// does: the node's assignment loop and the simulator (`sim_support`) both run it.
pub(crate) fn round(
    state: &ControlState,
    view: &mut LeaderView,
    retention: &mut Retention,
    quiet: &mut Quiet,
    cx: RoundContext<'_>,
) -> (Vec<ControlCommand>, FenceWork) {
    let RoundContext {
        now,
        timing,
        leader,
        fencing,
        changes,
        own_config,
        gone,
        acknowledged,
    } = cx;
    if !state.config_applied(leader, own_config) {
        // The state still holds the config this leader's previous process published: it would
        // fence by its current config and compare the others with its previous one (a member
        // on the old config taken as running a flow as the leader does, its units then moved
        // by a fence that cannot stop its configured credential). Nothing is decided until
        // this process's `PublishConfig` is applied, its first write as a restarted leader.
        return (Vec::new(), FenceWork::default());
    }
    view.observe(&state.members, now);
    view.peers_gone(gone);
    // With fencing on, a member that missed its renewals for `fence_after` is fenced; only its
    // units writing to a fenced target move on that, the others wait for the lease.
    let fence_after = fencing.as_ref().map(|_| timing.fence_after);
    let mut lease = view.liveness(
        now,
        timing.lease_expiry,
        timing.election_grace(),
        fence_after,
    );
    lease.config_reference = Some(leader);
    if let Some(view) = fencing {
        lease.topology = view.topology;
        lease.ensured = view.ensured;
        lease.ensuring = view.ensuring;
    }
    if !acknowledged.is_empty() {
        // A failover's last two Raft writes in one: the acknowledgements, then what the round
        // decides once they are applied (the grants of the units they free). Across regions
        // every write is a round trip or two between them. The decision is taken on a copy of
        // the state with them applied, as the log will apply them (the index only stamps the
        // member's `last_revoke_index`, which no round reads).
        let mut after = state.clone();
        for ack in acknowledged {
            after.apply(u64::MAX, ack);
        }
        let (cmds, work) = decide(&after, &lease, retention, now, timing);
        quiet.inputs = None;
        return (acknowledged.iter().cloned().chain(cmds).collect(), work);
    }
    let inputs = RoundInputs::of(changes, view.term, &lease);
    if quiet.inputs.as_ref() == Some(&inputs) {
        // Debug builds (every test, the simulation, the process tests' nodes) check that the
        // skipped round would indeed have decided nothing.
        #[cfg(debug_assertions)]
        {
            let (cmds, work) = decide(state, &lease, &mut retention.clone(), now, timing);
            debug_assert!(
                cmds.is_empty() && work == FenceWork::default(),
                "a round skipped as quiet would have decided something"
            );
        }
        quiet.skipped += 1;
        return (Vec::new(), FenceWork::default());
    }
    let (cmds, work) = decide(state, &lease, retention, now, timing);
    let decided_nothing = cmds.is_empty() && work == FenceWork::default();
    quiet.inputs = (decided_nothing && retention.is_idle()).then_some(inputs);
    (cmds, work)
}

/// What a round decides on `lease`: fence decisions, a feature level to raise, what retention
/// removes, and the assignment plan, as one batch; and the fence work on the targets.
fn decide(
    state: &ControlState,
    lease: &MemberLeases,
    retention: &mut Retention,
    now: Instant,
    timing: &ControlTiming,
) -> (Vec<ControlCommand>, FenceWork) {
    // A level every member supports, never above this build's own.
    let raise = state
        .level_to_raise()
        .filter(|level| *level <= format::SUPPORTED_LEVEL)
        .map(|level| ControlCommand::RaiseFeatureLevel { level });
    let removed = retention.round(state, now, timing.forget_retired_after);
    let work = fence_work(state, lease);
    let cmds = work
        .commands
        .iter()
        .cloned()
        .chain(raise)
        .chain(removed)
        .chain(plan(state, lease))
        .collect();
    (cmds, work)
}

/// Computes one assignment round (at most [`MAX_COMMANDS_PER_ROUND`] commands).
pub(crate) fn plan(state: &ControlState, lease: &MemberLeases) -> Vec<ControlCommand> {
    let mut out = plan_all(state, lease);
    out.truncate(MAX_COMMANDS_PER_ROUND);
    out
}

fn plan_all(state: &ControlState, lease: &MemberLeases) -> Vec<ControlCommand> {
    let live = &lease.live;
    let mut out = Vec::new();
    // A member without a usable writer identity (none yet, or fenced and waiting for its
    // next) keeps and gets units of unfenced targets: only a fenced target's units need one
    // (`may_write`), and asking the others back would move them on every restart.
    let eligible: BTreeSet<NodeId> = state
        .members
        .iter()
        .filter(|(id, m)| {
            m.state == MemberState::Active && live.contains(id) && !lease.unresponsive.contains(id)
        })
        .map(|(id, _)| *id)
        .collect();
    let mut load: BTreeMap<NodeId, Vec<&WorkUnit>> =
        eligible.iter().map(|id| (*id, Vec::new())).collect();
    let mut free: Vec<&WorkUnit> = Vec::new();
    let mut active_units = 0usize;
    let agrees = |node: NodeId, unit: &WorkUnit| {
        config_agrees(state, lease.config_reference, node, &unit.flow)
    };
    let may_take =
        |node: NodeId, unit: &WorkUnit| agrees(node, unit) && lease.may_write(state, node, unit);

    for (unit, rec) in &state.units {
        // A paused flow's units are like retired ones: asked back, granted to nobody.
        let idle = rec.retired || state.is_paused(unit);
        if !idle {
            active_units += 1;
        }
        let Some(owner) = rec.owner else {
            if !idle && !state.is_held(unit) {
                free.push(unit);
            }
            continue;
        };
        let member = state.members.get(&owner);
        let failed = !live.contains(&owner) || lease.unresponsive.contains(&owner);
        // A unit whose owner's writes there a revoke stops, and whose identity lost the
        // right to write (failed, or fenced) without the target's acknowledgement yet.
        let fenced_target = lease.fenced_for(state, owner, &unit.flow);
        if fenced_target.is_some_and(|t| state.unrevoked_on(owner, t))
            && (failed || !state.has_writer_identity(owner))
        {
            continue; // fenced first, then taken by `FenceTarget` (see `fence_work`)
        }
        if member.is_none() || !live.contains(&owner) {
            if member.is_some() && lease.grace.contains(&owner) {
                continue;
            }
            let renewal_index = lease
                .renewal_seen
                .get(&owner)
                .copied()
                .or_else(|| member.map(|m| m.last_renewal_index))
                .unwrap_or(0);
            out.push(ControlCommand::Revoke {
                unit: unit.clone(),
                epoch: rec.epoch,
                renewal_index,
            });
            if !idle {
                free.push(unit);
            }
            continue;
        }
        if idle || rec.release_requested {
            continue; // on its way back; counted by nobody
        }
        match load.get_mut(&owner).filter(|_| agrees(owner, unit)) {
            Some(units) => units.push(unit),
            None => out.push(ControlCommand::RequestRelease {
                unit: unit.clone(),
                epoch: rec.epoch,
            }),
        }
    }
    if eligible.is_empty() {
        return out;
    }

    let quotas = quotas(active_units, &load);
    let quota_of = |node: &NodeId| quotas.get(node).copied().unwrap_or(0);
    let below_quota: Vec<NodeId> = load
        .iter()
        .filter(|(id, units)| units.len() < quota_of(id))
        .map(|(id, _)| *id)
        .collect();
    for (node, units) in &load {
        // Release the last units in unit order (deterministic, and keeps a member's low
        // partitions where they are), among those a member below its quota may take: a unit
        // nobody short of work may take (its target is down for them, their config differs)
        // would only come back here, round after round.
        let excess = units.len().saturating_sub(quota_of(node));
        let movable = units
            .iter()
            .rev()
            .filter(|unit| {
                below_quota
                    .iter()
                    .any(|other| other != node && may_take(*other, unit))
            })
            .take(excess);
        for unit in movable {
            out.push(ControlCommand::RequestRelease {
                unit: (*unit).clone(),
                epoch: state.units.get(*unit).map(|r| r.epoch).unwrap_or_default(),
            });
        }
    }
    let mut held: BTreeMap<NodeId, usize> = load
        .iter()
        .map(|(id, units)| (*id, units.len().min(quota_of(id))))
        .collect();
    let short = |held: &BTreeMap<NodeId, usize>, id: &NodeId| {
        quota_of(id) as i64 - held.get(id).copied().unwrap_or(0) as i64
    };
    for unit in free {
        let target = held
            .keys()
            .filter(|id| may_take(**id, unit))
            .map(|id| (*id, short(&held, id)))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        let Some((node, short_of)) = target else {
            continue;
        };
        if short_of <= 0 {
            // Beyond `node`'s quota: kept instead for a member short of its own whose user on
            // the unit's target is being made sure of, counted as held by it meanwhile.
            let waiting = held.keys().copied().find(|id| {
                short(&held, id) > 0 && agrees(*id, unit) && lease.awaits_ensure(state, *id, unit)
            });
            if let Some(waiting) = waiting {
                *held.entry(waiting).or_default() += 1;
                continue;
            }
        }
        *held.entry(node).or_default() += 1;
        out.push(ControlCommand::Grant {
            unit: unit.clone(),
            node,
        });
    }
    out
}

/// `n / k` per member, plus one for the `n % k` members owning the most units (lowest id on
/// ties), so the members that already hold the extra unit keep it.
fn quotas(n: usize, load: &BTreeMap<NodeId, Vec<&WorkUnit>>) -> BTreeMap<NodeId, usize> {
    let k = load.len();
    if k == 0 {
        return BTreeMap::new();
    }
    let (base, extra) = (n / k, n % k);
    let mut order: Vec<(NodeId, usize)> = load.iter().map(|(id, u)| (*id, u.len())).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    order
        .into_iter()
        .enumerate()
        .map(|(i, (id, _))| (id, base + usize::from(i < extra)))
        .collect()
}

#[cfg(test)]
mod tests;
