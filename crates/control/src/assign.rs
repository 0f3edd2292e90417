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
//! 5. unowned units go to the members furthest below their quota (lowest id on ties).
//!
//! Members whose config of a flow differs from the leader's (`PublishConfig` digests, see
//! [`Liveness::config_reference`]) get no unit of that flow, and are asked back the ones they
//! own: a node that cannot run a flow as the others do never holds its units.
//!
//! A retired unit (no longer reported by discovery) or a unit of a paused flow stays with its
//! owner, which was asked to hand it back; it is revoked like any other when the owner's lease
//! expired, and never granted.
//!
//! With fencing on (`Liveness::fencing`), only members holding a writer identity get units,
//! and the units of a member whose identity's rights were not revoked are never revoked here:
//! the leader commits `FenceMember`, then revokes the identity's rights on the target
//! clusters, then commits `FenceAcknowledged`, which takes them all (see [`fence_work`]).

use std::collections::{BTreeMap, BTreeSet};

use replicator_model::{NodeId, WorkUnit};

use crate::command::ControlCommand;
use crate::state::{ControlState, MemberState};

/// Most commands in one assignment round: keeps a round's log entry small (about 40 bytes a
/// command) however many units there are; the rest follows in the next rounds.
pub(crate) const MAX_COMMANDS_PER_ROUND: usize = 1000;

/// What the leader knows of the members' leases for one round.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
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
}

/// What the leader must do on the target clusters before the next grants (fencing only).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FenceWork {
    /// Identities (node, incarnation) to fence: commit `FenceMember` (unless committed
    /// already), revoke on the targets, commit `FenceAcknowledged`.
    pub(crate) fence: Vec<(NodeId, u64)>,
    /// Members to give a writer identity: (node, the new incarnation).
    pub(crate) provision: Vec<(NodeId, u64)>,
    /// Stale identities whose users are to be deleted, then forgotten.
    pub(crate) retire: Vec<(NodeId, u64)>,
}

/// The work on the targets that fencing needs now (empty with fencing off):
/// * a member that stopped renewing (unresponsive, or its lease expired) and owns units while
///   its identity has rights: fence it, so its units can move; and carry on every fence whose
///   revoke was not acknowledged yet;
/// * a live, active, responsive member without an identity, or whose identity was revoked:
///   provision the next incarnation (one above every incarnation it ever had);
/// * every stale identity: make sure its users are revoked, then retire it.
pub(crate) fn fence_work(state: &ControlState, lease: &Liveness) -> FenceWork {
    let mut work = FenceWork::default();
    if !lease.fencing {
        return work;
    }
    let owners: BTreeSet<NodeId> = state.units.values().filter_map(|r| r.owner).collect();
    for (node, identity) in &state.identities {
        let failed = lease.unresponsive.contains(node) || !lease.live.contains(node);
        let decide =
            !identity.fenced && failed && !lease.grace.contains(node) && owners.contains(node);
        // A fence decided by an earlier leader, whose revoke was not acknowledged yet, is
        // carried on.
        if decide || (identity.fenced && !identity.revoked) {
            work.fence.push((*node, identity.incarnation));
        }
    }
    for (node, member) in &state.members {
        if state.has_unrevoked_identity(*node)
            || member.state != MemberState::Active
            || !lease.live.contains(node)
            || lease.unresponsive.contains(node)
        {
            continue;
        }
        let highest = state
            .stale_identities
            .iter()
            .filter(|(n, _)| n == node)
            .map(|(_, i)| *i)
            .chain(state.identities.get(node).map(|i| i.incarnation))
            .chain(state.retired_incarnations.get(node).copied())
            .max()
            .unwrap_or(0);
        work.provision.push((*node, highest + 1));
    }
    work.retire = state.stale_identities.iter().copied().collect();
    work
}

/// Computes one assignment round (at most [`MAX_COMMANDS_PER_ROUND`] commands).
pub(crate) fn plan(state: &ControlState, lease: &Liveness) -> Vec<ControlCommand> {
    let mut out = plan_all(state, lease);
    out.truncate(MAX_COMMANDS_PER_ROUND);
    out
}

fn plan_all(state: &ControlState, lease: &Liveness) -> Vec<ControlCommand> {
    let live = &lease.live;
    let mut out = Vec::new();
    let eligible: BTreeSet<NodeId> = state
        .members
        .iter()
        .filter(|(id, m)| {
            m.state == MemberState::Active
                && live.contains(id)
                && !lease.unresponsive.contains(id)
                && (!lease.fencing || state.has_writer_identity(**id))
        })
        .map(|(id, _)| *id)
        .collect();
    let mut load: BTreeMap<NodeId, Vec<&WorkUnit>> =
        eligible.iter().map(|id| (*id, Vec::new())).collect();
    let mut free: Vec<&WorkUnit> = Vec::new();
    let mut active_units = 0usize;
    let agrees = |node: NodeId, unit: &WorkUnit| {
        lease
            .config_reference
            .is_none_or(|reference| state.config_agrees(reference, node, &unit.flow))
    };

    for (unit, rec) in &state.units {
        // A paused flow's units are like retired ones: asked back, granted to nobody.
        let idle = rec.retired || state.is_paused(unit);
        if !idle {
            active_units += 1;
        }
        let Some(owner) = rec.owner else {
            if !idle {
                free.push(unit);
            }
            continue;
        };
        let member = state.members.get(&owner);
        let failed = !live.contains(&owner) || lease.unresponsive.contains(&owner);
        if lease.fencing
            && state.has_unrevoked_identity(owner)
            && (failed || !state.has_writer_identity(owner))
        {
            continue; // fenced first, then taken by `FenceAcknowledged` (see `fence_work`)
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
    for (node, units) in &load {
        let quota = quotas.get(node).copied().unwrap_or(0);
        // Release the last units in unit order: deterministic, and keeps a member's low
        // partitions where they are.
        for unit in units.iter().skip(quota) {
            out.push(ControlCommand::RequestRelease {
                unit: (*unit).clone(),
                epoch: state.units.get(*unit).map(|r| r.epoch).unwrap_or_default(),
            });
        }
    }
    let mut held: BTreeMap<NodeId, usize> = load
        .iter()
        .map(|(id, units)| (*id, units.len().min(quotas.get(id).copied().unwrap_or(0))))
        .collect();
    for unit in free {
        let target = held
            .iter()
            .filter(|(id, _)| agrees(**id, unit))
            .map(|(id, n)| (*id, quotas.get(id).copied().unwrap_or(0) as i64 - *n as i64))
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|(id, _)| id);
        if let Some(node) = target {
            *held.entry(node).or_default() += 1;
            out.push(ControlCommand::Grant {
                unit: unit.clone(),
                node,
            });
        }
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
