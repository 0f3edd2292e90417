//! Consumer-group membership and partition assignment, following server 0.8.0
//! (`metadata/consumer_group.rs`): a full round-robin rebalance when a member leaves or the
//! partition count changes, a cooperative rebalance when a member joins (idle members take
//! unassigned partitions, over-assigned members hand their last partitions to idle members once
//! the group has committed what it polled from them), and round-robin partition choice for polls
//! that name no partition.

use crate::slab::Slab;
use crate::wire::status;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A consumer group.
#[derive(Debug)]
pub(crate) struct Group {
    /// Unique name within the topic.
    pub(crate) name: String,
    /// The topic's partition ids the group spreads over its members.
    pub(crate) partitions: Vec<u32>,
    /// Members by slab id.
    pub(crate) members: Slab<Member>,
    /// Changes of the group's assignment: bumped by every rebalance and every completed
    /// handoff, as the 0.9 server's count is; SYNC_CONSUMER_GROUP answers it (the SDK's
    /// `generation` field) with the member's partitions (0.8 has no such number).
    pub(crate) assignment_changes: u64,
}

/// A member of a consumer group: one client connection.
#[derive(Debug)]
pub(crate) struct Member {
    /// Member id reported by GET_CONSUMER_GROUP (max existing + 1 at join).
    pub(crate) id: usize,
    /// The connection that joined.
    pub(crate) client_id: u32,
    /// Assigned partitions.
    pub(crate) partitions: Vec<u32>,
    /// Partitions this member is giving up once the group committed what it polled from them.
    pub(crate) pending_revocations: Vec<Revocation>,
    /// Round-robin cursor over `partitions` for polls without an explicit partition.
    pub(crate) next_index: AtomicUsize,
}

/// A partition moving from one member to another (cooperative rebalance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revocation {
    /// Partition being moved.
    pub(crate) partition: u32,
    /// Slab id of the member receiving it.
    pub(crate) target_slab: usize,
    /// Member id of the receiver, to detect a reused slab slot.
    pub(crate) target_member_id: usize,
}

/// Adds `client_id` to the group (after dropping members whose connection is gone) and runs the
/// cooperative rebalance; revocations that `can_complete` allows move at once.
pub(crate) fn join(
    group: &mut Group,
    client_id: u32,
    live_clients: &[u32],
    can_complete: &dyn Fn(u32) -> bool,
) {
    let stale: Vec<usize> = group
        .members
        .iter()
        .filter(|(_, m)| !live_clients.contains(&m.client_id))
        .map(|(k, _)| k)
        .collect();
    for key in stale {
        group.members.remove(key);
    }
    if !group.members.iter().any(|(_, m)| m.client_id == client_id) {
        let id = group
            .members
            .iter()
            .map(|(_, m)| m.id)
            .max()
            .map_or(0, |m| m + 1);
        group.members.insert(Member {
            id,
            client_id,
            partitions: Vec::new(),
            pending_revocations: Vec::new(),
            next_index: AtomicUsize::new(0),
        });
        rebalance_cooperative(group);
    }
    complete_revocations(group, can_complete);
}

/// Removes `client_id` from the group and rebalances fully; returns the partitions it owned, or
/// `None` when it was not a member.
pub(crate) fn leave(group: &mut Group, client_id: u32) -> Option<Vec<u32>> {
    let key = group
        .members
        .iter()
        .find(|(_, m)| m.client_id == client_id)
        .map(|(k, _)| k)?;
    let member = group.members.remove(key)?;
    rebalance_members(group);
    Some(member.partitions)
}

/// Sets the group's partitions to `0..count` and rebalances fully (partitions created/deleted).
pub(crate) fn set_partitions(group: &mut Group, count: u32) {
    group.partitions = (0..count).collect();
    rebalance_members(group);
}

/// Clears every assignment and deals the partitions round robin over members in slab order.
pub(crate) fn rebalance_members(group: &mut Group) {
    group.assignment_changes += 1;
    let member_keys: Vec<usize> = group.members.iter().map(|(k, _)| k).collect();
    if member_keys.is_empty() || group.partitions.is_empty() {
        return;
    }
    for &k in &member_keys {
        if let Some(m) = group.members.get_mut(k) {
            m.partitions.clear();
            m.pending_revocations.clear();
        }
    }
    for (i, &p) in group.partitions.iter().enumerate() {
        if let Some(m) = group.members.get_mut(member_keys[i % member_keys.len()]) {
            m.partitions.push(p);
        }
    }
}

/// Idle members take unassigned partitions; members above their fair share mark their last
/// partitions as pending revocation towards idle members (one partition per idle member).
pub(crate) fn rebalance_cooperative(group: &mut Group) {
    group.assignment_changes += 1;
    let member_count = group.members.len();
    if member_count == 0 || group.partitions.is_empty() {
        return;
    }
    let assigned: HashSet<u32> = group
        .members
        .iter()
        .flat_map(|(_, m)| m.partitions.iter().copied())
        .collect();
    let unassigned: Vec<u32> = group
        .partitions
        .iter()
        .copied()
        .filter(|p| !assigned.contains(p))
        .collect();
    if !unassigned.is_empty() {
        let idle: Vec<usize> = idle_members(&group.members, &HashSet::new());
        if !idle.is_empty() {
            for (i, p) in unassigned.into_iter().enumerate() {
                if let Some(m) = group.members.get_mut(idle[i % idle.len()]) {
                    m.partitions.push(p);
                }
            }
        }
    }

    let partition_count = group.partitions.len();
    let fair_share = partition_count / member_count;
    let remainder = partition_count % member_count;
    let targets: HashSet<usize> = group
        .members
        .iter()
        .flat_map(|(_, m)| m.pending_revocations.iter().map(|r| r.target_slab))
        .collect();
    let mut idle = idle_members(&group.members, &targets);
    if idle.is_empty() {
        return;
    }
    let member_keys: Vec<usize> = group.members.iter().map(|(k, _)| k).collect();
    let mut with_remainder = remainder;
    for key in member_keys {
        if idle.is_empty() {
            break;
        }
        let Some(member) = group.members.get(key) else {
            continue;
        };
        let pending: HashSet<u32> = member
            .pending_revocations
            .iter()
            .map(|r| r.partition)
            .collect();
        let effective = member
            .partitions
            .iter()
            .filter(|p| !pending.contains(p))
            .count();
        let max_allowed = if with_remainder > 0 {
            fair_share + 1
        } else {
            fair_share
        };
        if effective <= max_allowed {
            if effective > fair_share {
                with_remainder = with_remainder.saturating_sub(1);
            }
            continue;
        }
        let excess = effective - max_allowed;
        if with_remainder > 0 && effective > fair_share {
            with_remainder = with_remainder.saturating_sub(1);
        }
        let revocable: Vec<u32> = member
            .partitions
            .iter()
            .rev()
            .filter(|p| !pending.contains(p))
            .copied()
            .take(excess)
            .collect();
        for partition in revocable {
            if idle.is_empty() {
                break;
            }
            let target_slab = idle.remove(0);
            let target_member_id = group.members.get(target_slab).map_or(usize::MAX, |m| m.id);
            if let Some(m) = group.members.get_mut(key) {
                m.pending_revocations.push(Revocation {
                    partition,
                    target_slab,
                    target_member_id,
                });
            }
        }
    }
}

fn idle_members(members: &Slab<Member>, exclude: &HashSet<usize>) -> Vec<usize> {
    members
        .iter()
        .filter(|(k, m)| m.partitions.is_empty() && !exclude.contains(k))
        .map(|(k, _)| k)
        .collect()
}

/// Moves every pending revocation whose partition `can_complete` (never polled by the group, or
/// committed at least up to the last polled offset) to its target member.
pub(crate) fn complete_revocations(group: &mut Group, can_complete: &dyn Fn(u32) -> bool) {
    let mut done: Vec<(usize, Revocation)> = Vec::new();
    for (key, m) in group.members.iter() {
        for r in &m.pending_revocations {
            if can_complete(r.partition) {
                done.push((key, *r));
            }
        }
    }
    for (key, r) in done {
        if let Some(m) = group.members.get_mut(key) {
            m.pending_revocations.retain(|x| x.partition != r.partition);
            m.partitions.retain(|&p| p != r.partition);
        }
        match group.members.get_mut(r.target_slab) {
            Some(target) if target.id == r.target_member_id => {
                target.partitions.push(r.partition);
                group.assignment_changes += 1;
            }
            _ => {
                rebalance_members(group);
                return;
            }
        }
    }
}

/// The partition a member polls or stores for. `Err(5006)` when `client_id` is not a member;
/// `Ok(None)` when the member has nothing to read (no assignment, or an explicit partition it
/// does not own). Without an explicit partition the member's partitions are taken round robin,
/// advancing the cursor only when `advance` (polls do, offset stores do not).
pub(crate) fn resolve_partition(
    group: &Group,
    client_id: u32,
    explicit: Option<u32>,
    advance: bool,
) -> Result<Option<u32>, u32> {
    let member = group
        .members
        .iter()
        .map(|(_, m)| m)
        .find(|m| m.client_id == client_id)
        .ok_or(status::CONSUMER_GROUP_MEMBER_NOT_FOUND)?;
    if let Some(p) = explicit {
        let owned = member.partitions.contains(&p)
            || member.pending_revocations.iter().any(|r| r.partition == p);
        return Ok(owned.then_some(p));
    }
    let usable = pollable(member);
    if usable.is_empty() {
        return Ok(None);
    }
    let n = usable.len();
    let current = if advance {
        member
            .next_index
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some((c + 1) % n))
            .unwrap_or(0)
    } else {
        member.next_index.load(Ordering::Relaxed)
    };
    Ok(Some(usable[current % n]))
}

/// The partitions a member polls: those assigned to it and not pending handoff (a partition
/// it gives up stays its own until the group committed what it polled there, but is not polled
/// again).
fn pollable(member: &Member) -> Vec<u32> {
    member
        .partitions
        .iter()
        .copied()
        .filter(|p| !member.pending_revocations.iter().any(|r| r.partition == *p))
        .collect()
}

/// What a 0.9 member syncs (SYNC_CONSUMER_GROUP): the group's assignment changes and the partitions
/// `client_id` polls; `None` when it is not a member.
pub(crate) fn assignment(group: &Group, client_id: u32) -> Option<(u64, Vec<u32>)> {
    let member = group
        .members
        .iter()
        .map(|(_, m)| m)
        .find(|m| m.client_id == client_id)?;
    Some((group.assignment_changes, pollable(member)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    fn group(partitions: u32) -> Group {
        Group {
            name: "g".to_owned(),
            partitions: (0..partitions).collect(),
            members: Slab::default(),
            assignment_changes: 0,
        }
    }

    fn assignments(g: &Group) -> Vec<Vec<u32>> {
        g.members
            .iter()
            .map(|(_, m)| m.partitions.clone())
            .collect()
    }

    #[test]
    fn first_member_gets_every_partition() {
        let mut g = group(3);
        join(&mut g, 1, &[1], &|_| true);
        check!(assignments(&g) == vec![vec![0, 1, 2]]);
    }

    #[test]
    fn second_member_takes_one_partition_from_the_end_when_never_polled() {
        let mut g = group(4);
        join(&mut g, 1, &[1, 2], &|_| true);
        join(&mut g, 2, &[1, 2], &|_| true);
        check!(assignments(&g) == vec![vec![0, 1, 2], vec![3]]);
    }

    #[test]
    fn revocation_waits_until_committed() {
        let mut g = group(2);
        join(&mut g, 1, &[1, 2], &|_| true);
        join(&mut g, 2, &[1, 2], &|_| false);
        check!(assignments(&g) == vec![vec![0, 1], vec![]]);
        check!(resolve_partition(&g, 1, None, true) == Ok(Some(0)));
        check!(
            resolve_partition(&g, 1, Some(1), false) == Ok(Some(1)),
            "pending still owned"
        );
        complete_revocations(&mut g, &|_| true);
        check!(assignments(&g) == vec![vec![0], vec![1]]);
    }

    #[test]
    fn leave_rebalances_round_robin() {
        let mut g = group(3);
        join(&mut g, 1, &[1, 2, 3], &|_| true);
        join(&mut g, 2, &[1, 2, 3], &|_| true);
        join(&mut g, 3, &[1, 2, 3], &|_| true);
        check!(leave(&mut g, 2).is_some());
        check!(assignments(&g) == vec![vec![0, 2], vec![1]]);
        check!(leave(&mut g, 9).is_none());
    }

    #[test]
    fn non_member_is_rejected_and_polls_cycle_partitions() {
        let mut g = group(2);
        check!(
            resolve_partition(&g, 1, None, true) == Err(status::CONSUMER_GROUP_MEMBER_NOT_FOUND)
        );
        join(&mut g, 1, &[1], &|_| true);
        check!(resolve_partition(&g, 1, None, true) == Ok(Some(0)));
        check!(resolve_partition(&g, 1, None, true) == Ok(Some(1)));
        check!(resolve_partition(&g, 1, None, false) == Ok(Some(0)));
        check!(resolve_partition(&g, 1, Some(5), true) == Ok(None));
    }

    #[test]
    fn stale_members_are_dropped_on_join() {
        let mut g = group(2);
        join(&mut g, 1, &[1], &|_| true);
        join(&mut g, 2, &[2], &|_| true);
        check!(assignments(&g) == vec![vec![0, 1]]);
        check!(g.members.iter().all(|(_, m)| m.client_id == 2));
    }

    #[test]
    fn a_member_syncs_its_pollable_partitions_under_a_count_every_change_bumps() {
        let mut g = group(2);
        check!(assignment(&g, 1).is_none(), "not a member");
        join(&mut g, 1, &[1, 2], &|_| true);
        let (first, partitions) = assignment(&g, 1).unwrap();
        check!(partitions == vec![0, 1]);
        // The second member waits for partition 1: member 1 no longer polls it.
        join(&mut g, 2, &[1, 2], &|_| false);
        let (joined, partitions) = assignment(&g, 1).unwrap();
        check!(joined > first);
        check!(partitions == vec![0]);
        check!(assignment(&g, 2).map(|(_, p)| p) == Some(vec![]));
        complete_revocations(&mut g, &|_| true);
        let (handed_over, partitions) = assignment(&g, 2).unwrap();
        check!(handed_over > joined);
        check!(partitions == vec![1]);
        check!(leave(&mut g, 2).is_some());
        check!(assignment(&g, 1).map(|(_, p)| p) == Some(vec![0, 1]));
        check!(assignment(&g, 1).unwrap().0 > handed_over);
    }
}
