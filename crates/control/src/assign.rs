//! The leader's assignment decision: a pure function from the replicated state and the set of
//! members whose lease is alive to the commands of one assignment round.
//!
//! Rules, in order:
//! 1. a unit whose owner is gone or whose lease expired is revoked (guarded by the renewal
//!    index the leader saw, see `ControlCommand::Revoke`);
//! 2. a unit of a live `Leaving` member is requested back;
//! 3. every eligible (live and `Active`) member gets a quota: `n / k` units, and the `n % k`
//!    members that own the most units now get one more, so that as few units as possible move;
//! 4. members above their quota are asked to release the excess (never taken: a live owner
//!    keeps a unit until it hands it back);
//! 5. unowned units go to the members furthest below their quota (lowest id on ties).

use std::collections::{BTreeMap, BTreeSet};

use replicator_model::{NodeId, WorkUnit};

use crate::command::ControlCommand;
use crate::state::{ControlState, MemberState};

/// Computes one assignment round. `live` holds the members whose lease the leader considers
/// alive; `renewal_seen` the `last_renewal_index` the leader last observed per member (the
/// guard of every `Revoke`).
pub(crate) fn plan(
    state: &ControlState,
    live: &BTreeSet<NodeId>,
    renewal_seen: &BTreeMap<NodeId, u64>,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    let eligible: BTreeSet<NodeId> = state
        .members
        .iter()
        .filter(|(id, m)| m.state == MemberState::Active && live.contains(id))
        .map(|(id, _)| *id)
        .collect();
    let mut load: BTreeMap<NodeId, Vec<&WorkUnit>> =
        eligible.iter().map(|id| (*id, Vec::new())).collect();
    let mut free: Vec<&WorkUnit> = Vec::new();
    let mut active_units = 0usize;

    for (unit, rec) in state.units.iter().filter(|(_, r)| !r.retired) {
        active_units += 1;
        let Some(owner) = rec.owner else {
            free.push(unit);
            continue;
        };
        let member = state.members.get(&owner);
        if member.is_none() || !live.contains(&owner) {
            let renewal_index = renewal_seen
                .get(&owner)
                .copied()
                .or_else(|| member.map(|m| m.last_renewal_index))
                .unwrap_or(0);
            out.push(ControlCommand::Revoke {
                unit: unit.clone(),
                epoch: rec.epoch,
                renewal_index,
            });
            free.push(unit);
            continue;
        }
        if rec.release_requested {
            continue; // on its way back; counted by nobody
        }
        match load.get_mut(&owner) {
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
