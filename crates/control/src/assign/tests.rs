use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use assert2::check;
use replicator_model::{NodeId, WorkUnit};

use super::*;
use crate::command::{ControlCommand, ControlResponse, Rejection};
use crate::state::ControlState;

fn unit(p: u32) -> WorkUnit {
    WorkUnit::new("f", "s", "t", p)
}

/// A round with no member in grace.
fn plan_with(
    s: &ControlState,
    live: &BTreeSet<NodeId>,
    seen: &BTreeMap<NodeId, u64>,
) -> Vec<ControlCommand> {
    plan(
        s,
        &MemberLeases {
            live: live.clone(),
            grace: BTreeSet::new(),
            renewal_seen: seen.clone(),
            ..MemberLeases::default()
        },
    )
}

/// `node` joins (without addresses).
fn register(node: NodeId) -> ControlCommand {
    ControlCommand::RegisterMember {
        node,
        raft_addr: String::new(),
        api_addr: String::new(),
    }
}

/// Flow `f` has units 0..`units`.
fn report(units: u32) -> ControlCommand {
    ControlCommand::ReportUnits {
        flow: "f".into(),
        units: (0..units).map(unit).collect(),
    }
}

fn state(members: &[NodeId], units: u32) -> ControlState {
    let mut s = ControlState::default();
    for m in members {
        s.apply(1, &register(*m));
    }
    s.apply(2, &report(units));
    s
}

/// [`state`] converged with every member live; returns it and the last log index used.
fn converged(members: &[NodeId], units: u32) -> (ControlState, u64) {
    let mut s = state(members, units);
    let mut index = 10;
    converge(&mut s, &members.iter().copied().collect(), &mut index);
    (s, index)
}

/// Every member's last renewal as the leader has seen it.
fn renewals_seen(s: &ControlState) -> BTreeMap<NodeId, u64> {
    s.members
        .iter()
        .map(|(id, m)| (*id, m.last_renewal_index))
        .collect()
}

/// Applies plans (and the owners' releases) until nothing changes; returns the rounds taken.
fn converge(s: &mut ControlState, live: &BTreeSet<NodeId>, index: &mut u64) -> usize {
    for round in 0..10 {
        let cmds = plan_with(s, live, &renewals_seen(s));
        // Owners hand back what was requested (the pipeline's part).
        let releases: Vec<ControlCommand> = s
            .units
            .iter()
            .filter(|(_, r)| r.release_requested)
            .filter_map(|(u, r)| {
                r.owner.map(|node| ControlCommand::Release {
                    unit: u.clone(),
                    epoch: r.epoch,
                    node,
                })
            })
            .collect();
        if cmds.is_empty() && releases.is_empty() {
            return round;
        }
        *index += 1;
        s.apply(*index, &ControlCommand::Batch(cmds));
        *index += 1;
        s.apply(*index, &ControlCommand::Batch(releases));
    }
    panic!("assignment did not converge in 10 rounds");
}

fn owners(s: &ControlState) -> BTreeMap<WorkUnit, Option<NodeId>> {
    s.units.iter().map(|(u, r)| (u.clone(), r.owner)).collect()
}

fn loads(s: &ControlState, members: &BTreeSet<NodeId>) -> Vec<usize> {
    members.iter().map(|m| s.assignments_of(*m).len()).collect()
}

/// Whether the loads differ by at most one unit.
fn within_one(loads: &[usize]) -> bool {
    loads.iter().max().copied().unwrap_or(0) - loads.iter().min().copied().unwrap_or(0) <= 1
}

#[test]
fn unowned_units_are_spread_within_one() {
    for (n_members, n_units) in [(1, 5), (3, 10), (3, 2), (4, 17), (5, 5)] {
        let members: Vec<NodeId> = (1..=n_members).collect();
        let (s, _) = converged(&members, n_units);
        let l = loads(&s, &members.iter().copied().collect());
        check!(
            l.iter().sum::<usize>() == n_units as usize,
            "members {n_members} units {n_units}"
        );
        check!(within_one(&l), "loads {l:?}");
    }
}

#[test]
fn first_round_grants_everything_in_one_batch() {
    let s = state(&[1, 2, 3], 9);
    let live = BTreeSet::from([1, 2, 3]);
    let cmds = plan_with(&s, &live, &BTreeMap::new());
    check!(cmds.len() == 9);
    check!(cmds
        .iter()
        .all(|c| matches!(c, ControlCommand::Grant { .. })));
}

#[test]
fn a_join_moves_only_the_minimum_and_only_by_release() {
    let (mut s, mut index) = converged(&[1, 2], 10);
    let before = owners(&s);
    s.apply(index + 1, &register(3));
    index += 1;
    let live = BTreeSet::from([1, 2, 3]);
    // The first round only asks for units back: a live owner is never bypassed.
    let seen = renewals_seen(&s);
    let first = plan_with(&s, &live, &seen);
    check!(first
        .iter()
        .all(|c| matches!(c, ControlCommand::RequestRelease { .. })));
    check!(first.len() == 3); // 5/5 → 4/3/3 (or 3/4/3) moves 3 units
    converge(&mut s, &live, &mut index);
    let after = owners(&s);
    let moved = before.iter().filter(|(u, o)| after[*u] != **o).count();
    check!(moved == 3);
    check!(within_one(&loads(&s, &live)));
}

#[test]
fn units_of_an_expired_member_are_revoked_with_its_seen_renewal_and_regranted() {
    let (mut s, mut index) = converged(&[1, 2, 3], 9);
    let live = BTreeSet::from([1, 2]);
    let seen = BTreeMap::from([(1, 1), (2, 1), (3, 1)]);
    let cmds = plan_with(&s, &live, &seen);
    let revokes: Vec<_> = cmds
        .iter()
        .filter(|c| {
            matches!(
                c,
                ControlCommand::Revoke {
                    renewal_index: 1,
                    ..
                }
            )
        })
        .collect();
    check!(revokes.len() == 3);
    let grants = cmds
        .iter()
        .filter(|c| matches!(c, ControlCommand::Grant { node, .. } if *node != 3))
        .count();
    check!(grants == 3);
    converge(&mut s, &live, &mut index);
    check!(s.assignments_of(3).is_empty());
    check!(loads(&s, &live).iter().sum::<usize>() == 9);
    check!(within_one(&loads(&s, &live)));
}

#[test]
fn a_leaving_member_is_drained_by_request_not_revoke() {
    let (mut s, _) = converged(&[1, 2], 4);
    s.apply(50, &ControlCommand::LeaveMember { node: 2 });
    let mut index = 50;
    let live = BTreeSet::from([1, 2]);
    let seen = renewals_seen(&s);
    let cmds = plan_with(&s, &live, &seen);
    check!(cmds.len() == 2);
    check!(cmds
        .iter()
        .all(|c| matches!(c, ControlCommand::RequestRelease { .. })));
    converge(&mut s, &live, &mut index);
    check!(s.assignments_of(2).is_empty());
    check!(s.assignments_of(1).len() == 4);
}

#[test]
fn no_live_member_means_no_grants_and_a_stable_cluster_means_no_commands() {
    let s = state(&[1, 2], 4);
    check!(plan_with(&s, &BTreeSet::new(), &BTreeMap::new()).is_empty());
    let (s, _) = converged(&[1, 2], 4);
    let live = BTreeSet::from([1, 2]);
    check!(plan_with(&s, &live, &renewals_seen(&s)).is_empty());
}

#[test]
fn release_requests_are_not_repeated_while_pending() {
    let (mut s, _) = converged(&[1], 4);
    s.apply(30, &register(2));
    let live = BTreeSet::from([1, 2]);
    let seen = renewals_seen(&s);
    let first = plan_with(&s, &live, &seen);
    check!(first.len() == 2);
    s.apply(31, &ControlCommand::Batch(first));
    // Owner has not released yet: nothing new to ask, nothing to grant.
    check!(plan_with(&s, &live, &seen).is_empty());
}

#[test]
fn members_in_the_grace_after_an_election_keep_their_units_but_get_no_more() {
    // A slow election: the new leader (1) has seen nobody renew for a whole lease. Member 2
    // is in grace (not known alive yet), member 3 is known dead.
    let (mut s, _) = converged(&[1, 2, 3], 6);
    s.apply(100, &report(7));
    let cmds = plan(
        &s,
        &MemberLeases {
            live: BTreeSet::from([1]),
            grace: BTreeSet::from([2]),
            renewal_seen: BTreeMap::new(),
            ..MemberLeases::default()
        },
    );
    let revoked_from = |node: NodeId| {
        cmds.iter()
            .filter(|c| match c {
                ControlCommand::Revoke { unit, .. } => s.units[unit].owner == Some(node),
                _ => false,
            })
            .count()
    };
    check!(revoked_from(2) == 0);
    check!(revoked_from(3) == 2);
    // Everything free (member 3's two units and the new one) goes to the live member only.
    let granted_to: Vec<NodeId> = cmds
        .iter()
        .filter_map(|c| match c {
            ControlCommand::Grant { node, .. } => Some(*node),
            _ => None,
        })
        .collect();
    check!(granted_to == vec![1, 1, 1]);
    // Nothing of member 2's is asked back either.
    check!(!cmds
        .iter()
        .any(|c| matches!(c, ControlCommand::RequestRelease { .. })));
}

#[test]
fn a_retired_unit_stays_with_a_live_owner_and_is_revoked_from_a_dead_one() {
    let (mut s, _) = converged(&[1, 2], 4);
    let live = BTreeSet::from([1, 2]);
    // Units 2 and 3 are no longer reported.
    s.apply(100, &report(2));
    let seen = renewals_seen(&s);
    // Both owners alive: the retired units wait for their owners' releases, nothing moves.
    check!(plan_with(&s, &live, &seen).is_empty());
    // The owner of unit 3 dies: its retired unit is revoked, and never granted again.
    let dead = s.units[&unit(3)].owner.unwrap_or_default();
    let alive = BTreeSet::from([if dead == 1 { 2 } else { 1 }]);
    let cmds = plan_with(&s, &alive, &seen);
    check!(cmds
        .iter()
        .any(|c| matches!(c, ControlCommand::Revoke { unit: u, .. } if *u == unit(3))));
    check!(!cmds.iter().any(
        |c| matches!(c, ControlCommand::Grant { unit: u, .. } if *u == unit(3) || *u == unit(2))
    ));
}

#[test]
fn a_round_holds_at_most_the_cap_and_the_rest_follows() {
    let n = u32::try_from(MAX_COMMANDS_PER_ROUND).unwrap_or(u32::MAX) + 500;
    let mut s = state(&[1, 2], n);
    let live = BTreeSet::from([1, 2]);
    let first = plan_with(&s, &live, &BTreeMap::new());
    check!(first.len() == MAX_COMMANDS_PER_ROUND);
    s.apply(10, &ControlCommand::Batch(first));
    let second = plan_with(&s, &live, &BTreeMap::new());
    check!(second.len() == 500);
    s.apply(11, &ControlCommand::Batch(second));
    check!(s.units.values().all(|r| r.owner.is_some()));
    check!(within_one(&loads(&s, &live)));
}

fn with_identity(s: &mut ControlState, node: NodeId, incarnation: u64) {
    let cmd = ControlCommand::SetWriterIdentity {
        node,
        incarnation,
        password: String::new(),
    };
    s.apply(3, &cmd);
}

/// Flow `f` writes to the fenced target `t`.
fn topology() -> FenceTopology {
    FenceTopology::new([("f".to_owned(), Some("t".to_owned()))])
}

/// Every current identity of `s`, ensured on every fenced target of `topology`.
fn all_ensured(s: &ControlState, topology: &FenceTopology) -> BTreeSet<(String, NodeId, u64)> {
    let targets = topology.fenced_targets();
    s.identities
        .iter()
        .flat_map(|(node, i)| {
            targets
                .iter()
                .map(move |t| ((*t).to_owned(), *node, i.incarnation))
        })
        .collect()
}

/// A fencing round over `s` with flow `f` into the fenced target `t`, every identity ensured.
fn fencing_over(s: &ControlState, live: &[NodeId], unresponsive: &[NodeId]) -> MemberLeases {
    let topology = topology();
    MemberLeases {
        live: live.iter().copied().collect(),
        fencing: true,
        unresponsive: unresponsive.iter().copied().collect(),
        ensured: all_ensured(s, &topology),
        topology,
        renewal_seen: renewals_seen(s),
        ..MemberLeases::default()
    }
}

fn granted_to(cmds: &[ControlCommand]) -> BTreeSet<NodeId> {
    cmds.iter()
        .filter_map(|c| match c {
            ControlCommand::Grant { node, .. } => Some(*node),
            _ => None,
        })
        .collect()
}

fn fence_member(node: NodeId, incarnation: u64) -> ControlCommand {
    ControlCommand::FenceMember { node, incarnation }
}

fn new_identity(node: NodeId, incarnation: u64) -> ControlCommand {
    ControlCommand::SetWriterIdentity {
        node,
        incarnation,
        password: String::new(),
    }
}

fn revokes(work: &FenceWork) -> Vec<(NodeId, u64, &str)> {
    work.revoke
        .iter()
        .map(|(n, i, t)| (*n, *i, t.as_str()))
        .collect()
}

#[test]
fn with_fencing_only_members_with_a_writer_identity_get_units() {
    let mut s = state(&[1, 2, 3], 6);
    with_identity(&mut s, 1, 1);
    with_identity(&mut s, 2, 1);
    let lease = fencing_over(&s, &[1, 2, 3], &[]);
    check!(granted_to(&plan(&s, &lease)) == BTreeSet::from([1, 2]));
    // Member 3 gets an identity first; 1 and 2 need nothing.
    let work = fence_work(&s, &lease);
    check!(work.commands == vec![new_identity(3, 1)]);
    check!(work.revoke.is_empty());
    // Without fencing nobody needs one.
    let plain = MemberLeases {
        live: BTreeSet::from([1, 2, 3]),
        ..MemberLeases::default()
    };
    check!(granted_to(&plan(&s, &plain)) == BTreeSet::from([1, 2, 3]));
    check!(fence_work(&s, &plain) == FenceWork::default());
}

#[test]
fn a_unit_writing_to_a_fenced_target_goes_only_to_members_whose_user_exists_there() {
    let mut s = state(&[1, 2], 4);
    with_identity(&mut s, 1, 1);
    with_identity(&mut s, 2, 1);
    let mut lease = fencing_over(&s, &[1, 2], &[]);
    lease.ensured.retain(|(_, node, _)| *node == 1);
    check!(granted_to(&plan(&s, &lease)) == BTreeSet::from([1]));
    // The leader is asked to make sure of member 2's user on `t`.
    let work = fence_work(&s, &lease);
    check!(work.ensure == vec![(2, 1, "t".to_owned())]);
    // A unit of a flow writing to an unfenced target needs no user.
    lease.topology = FenceTopology::new([("f".to_owned(), None)]);
    check!(granted_to(&plan(&s, &lease)) == BTreeSet::from([1, 2]));
    check!(fence_work(&s, &lease).ensure.is_empty());
}

/// Units granted in `cmds`, per member.
fn grants_per_member(cmds: &[ControlCommand]) -> BTreeMap<NodeId, usize> {
    let mut per = BTreeMap::new();
    for c in cmds {
        if let ControlCommand::Grant { node, .. } = c {
            *per.entry(*node).or_default() += 1;
        }
    }
    per
}

#[test]
fn a_members_share_waits_while_its_user_is_being_ensured_and_not_after_a_failed_attempt() {
    let mut s = state(&[1, 2, 3], 16);
    for node in 1..=3 {
        with_identity(&mut s, node, 1);
    }
    // Only member 3's user is known to exist yet; 1's and 2's are being made sure of.
    let mut lease = fencing_over(&s, &[1, 2, 3], &[]);
    lease.ensured.retain(|(_, node, _)| *node == 3);
    lease.ensuring = BTreeSet::from([("t".to_owned(), 1, 1), ("t".to_owned(), 2, 1)]);
    // Member 3 gets its share (16 = 6 + 5 + 5, the extra one to the lowest id); the others'
    // wait for them, unowned, instead of going to 3 and coming back.
    check!(grants_per_member(&plan(&s, &lease)) == BTreeMap::from([(3, 5)]));
    // An attempt for member 1 failed: its share no longer waits.
    lease.ensuring.remove(&("t".to_owned(), 1, 1));
    check!(grants_per_member(&plan(&s, &lease)) == BTreeMap::from([(3, 11)]));
    // Nothing being ensured: every unit goes to the only member that may write (as before).
    lease.ensuring.clear();
    check!(grants_per_member(&plan(&s, &lease)) == BTreeMap::from([(3, 16)]));
    // Once every user is ensured, each gets its share.
    lease.ensured = all_ensured(&s, &topology());
    check!(grants_per_member(&plan(&s, &lease)) == BTreeMap::from([(1, 6), (2, 5), (3, 5)]));
}

#[test]
fn with_fencing_a_failed_owner_is_fenced_instead_of_revoked() {
    let mut s = state(&[1, 2], 4);
    with_identity(&mut s, 1, 3);
    with_identity(&mut s, 2, 1);
    let mut index = 10;
    converge(&mut s, &BTreeSet::from([1, 2]), &mut index);
    // Member 1 stopped renewing: its lease is still alive, but it is unresponsive.
    let lease = fencing_over(&s, &[1, 2], &[1]);
    let cmds = plan(&s, &lease);
    check!(!cmds
        .iter()
        .any(|c| matches!(c, ControlCommand::Revoke { .. })));
    check!(granted_to(&cmds).is_empty());
    let work = fence_work(&s, &lease);
    check!(
        work.commands == vec![fence_member(1, 3)],
        "decided; an unresponsive member gets no new identity"
    );
    check!(
        work.revoke.is_empty(),
        "no revoke before the decision is applied"
    );
    // Decided: member 1 stops writing, but its units wait for the target's acknowledgement,
    // and the fence is carried on (by this or a later leader) until then.
    s.apply(50, &fence_member(1, 3));
    check!(granted_to(&plan(&s, &lease)).is_empty());
    let back = fencing_over(&s, &[1, 2], &[]);
    check!(revokes(&fence_work(&s, &back)) == vec![(1, 3, "t")]);
    // Responsive again before `t` acknowledged: its next identity, the old one's units of
    // `t` held (tested below); this round does not write it, to follow the plain path.
    check!(
        fence_work(&s, &back).commands
            == vec![ControlCommand::ReplaceFencedIdentity {
                node: 1,
                fenced: 3,
                incarnation: 4,
                held_flows: vec!["f".into()],
            }]
    );
    check!(!plan(&s, &back)
        .iter()
        .any(|c| matches!(c, ControlCommand::RequestRelease { .. })));
    // Acknowledged: its units are free and go to member 2; the identity is revoked on every
    // target, so member 1, back and responsive, gets incarnation 4.
    s.apply(51, &ControlCommand::fence_target(1, 3, "t", &["f"]));
    check!(granted_to(&plan(&s, &lease)) == BTreeSet::from([2]));
    let work = fence_work(&s, &back);
    check!(
        work.commands
            == vec![ControlCommand::IdentityRevoked {
                node: 1,
                incarnation: 3
            }]
    );
    check!(work.revoke.is_empty());
    s.apply(
        52,
        &ControlCommand::IdentityRevoked {
            node: 1,
            incarnation: 3,
        },
    );
    check!(fence_work(&s, &back).commands == vec![new_identity(1, 4)]);
    check!(!granted_to(&plan(&s, &back)).contains(&1));
}

/// Members 1 and 2 (identities 1) own flow `a` (into fenced `eu`), `b` (into fenced `ap`) and
/// `c` (into an unfenced target), two units each, member 1 the first of each flow.
fn three_flows() -> (ControlState, FenceTopology) {
    let mut s = state(&[1, 2], 0);
    with_identity(&mut s, 1, 1);
    with_identity(&mut s, 2, 1);
    let units = |flow: &str| (0..2).map(|p| WorkUnit::new(flow, "s", "t", p)).collect();
    let mut index = 4;
    for flow in ["a", "b", "c"] {
        let units: Vec<WorkUnit> = units(flow);
        index += 1;
        s.apply(
            index,
            &ControlCommand::ReportUnits {
                flow: flow.into(),
                units: units.clone(),
            },
        );
        for (unit, node) in units.into_iter().zip([1, 2]) {
            index += 1;
            s.apply(index, &ControlCommand::Grant { unit, node });
        }
    }
    let topology = FenceTopology::new([
        ("a".to_owned(), Some("eu".to_owned())),
        ("b".to_owned(), Some("ap".to_owned())),
        ("c".to_owned(), None),
    ]);
    (s, topology)
}

fn owned_by(s: &ControlState, node: NodeId) -> BTreeSet<String> {
    s.units
        .iter()
        .filter(|(_, r)| r.owner == Some(node))
        .map(|(u, _)| format!("{}{}", u.flow, u.partition))
        .collect()
}

#[test]
fn a_target_that_does_not_acknowledge_holds_back_only_the_units_writing_to_it() {
    let (mut s, topology) = three_flows();
    s.apply(30, &fence_member(1, 1));
    let lease = MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(&s, &topology),
        ..fencing_over(&s, &[1, 2], &[1])
    };
    // Both fenced targets are asked; `ap` does not answer, `eu` does.
    check!(revokes(&fence_work(&s, &lease)) == vec![(1, 1, "ap"), (1, 1, "eu")]);
    s.apply(31, &ControlCommand::fence_target(1, 1, "eu", &["a"]));
    check!(owned_by(&s, 1) == BTreeSet::from(["b0".into(), "c0".into()]));
    let cmds = plan(&s, &lease);
    let granted: Vec<&WorkUnit> = cmds
        .iter()
        .filter_map(|c| match c {
            ControlCommand::Grant { unit, node: 2 } => Some(unit),
            _ => None,
        })
        .collect();
    check!(granted == vec![&WorkUnit::new("a", "s", "t", 0)]);
    // Still revoking on `ap`; not revoked everywhere, so no new identity either.
    let work = fence_work(&s, &lease);
    check!(revokes(&work) == vec![(1, 1, "ap")]);
    check!(work.commands.is_empty());
}

#[test]
fn units_writing_to_an_unfenced_target_move_on_the_lease_alone() {
    let (mut s, topology) = three_flows();
    s.apply(30, &fence_member(1, 1));
    s.apply(31, &ControlCommand::fence_target(1, 1, "eu", &["a"]));
    s.apply(32, &ControlCommand::fence_target(1, 1, "ap", &["b"]));
    // Fenced on both targets, but its lease is still alive: the unit writing to the unfenced
    // target stays with member 1, neither revoked nor granted (two writers could reach it).
    check!(owned_by(&s, 1) == BTreeSet::from(["c0".into()]));
    let lease = MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(&s, &topology),
        ..fencing_over(&s, &[1, 2], &[1])
    };
    let moves_c = |cmds: &[ControlCommand]| {
        cmds.iter().any(|c| match c {
            ControlCommand::Revoke { unit, .. } | ControlCommand::Grant { unit, .. } => {
                unit.flow == "c" && unit.partition == 0
            }
            _ => false,
        })
    };
    check!(!moves_c(&plan(&s, &lease)));
    // Its lease expired: revoked, guarded by the renewal the leader saw.
    let expired = MemberLeases {
        live: BTreeSet::from([2]),
        ..lease
    };
    check!(moves_c(&plan(&s, &expired)));
    check!(
        fence_work(&s, &expired).commands
            == vec![ControlCommand::IdentityRevoked {
                node: 1,
                incarnation: 1
            }]
    );
}

#[test]
fn a_target_added_to_the_config_is_fenced_and_provisioned_too() {
    let (mut s, topology) = three_flows();
    // The config had only `a` into `eu`: member 1 was fenced and acknowledged there.
    s.apply(30, &fence_member(1, 1));
    s.apply(31, &ControlCommand::fence_target(1, 1, "eu", &["a"]));
    let lease = MemberLeases {
        topology: topology.clone(),
        ensured: BTreeSet::from([("eu".to_owned(), 2, 1)]),
        ..fencing_over(&s, &[1, 2], &[1])
    };
    // Now `b` writes to `ap`: the fence must reach it, and member 2 needs a user there
    // before it gets a unit of `b`.
    let work = fence_work(&s, &lease);
    check!(revokes(&work) == vec![(1, 1, "ap")]);
    check!(work.ensure == vec![(2, 1, "ap".to_owned())]);
    s.apply(32, &ControlCommand::fence_target(1, 1, "ap", &["b"]));
    check!(!plan(&s, &lease)
        .iter()
        .any(|c| matches!(c, ControlCommand::Grant { unit, .. } if unit.flow == "b")));
}

#[test]
fn with_fencing_a_member_in_grace_or_owning_nothing_is_not_fenced() {
    let mut s = state(&[1, 2], 0);
    with_identity(&mut s, 1, 1);
    with_identity(&mut s, 2, 1);
    let decided = |w: FenceWork| {
        w.commands
            .iter()
            .any(|c| matches!(c, ControlCommand::FenceMember { .. }))
    };
    check!(!decided(fence_work(&s, &fencing_over(&s, &[2], &[1]))));
    s.apply(4, &report(2));
    let mut index = 10;
    converge(&mut s, &BTreeSet::from([1, 2]), &mut index);
    let mut lease = fencing_over(&s, &[2], &[]);
    lease.grace = BTreeSet::from([1]);
    check!(!decided(fence_work(&s, &lease)));
    lease.grace.clear();
    check!(fence_work(&s, &lease).commands == vec![fence_member(1, 1)]);
}

#[test]
fn the_next_incarnation_is_above_every_stale_one() {
    let mut s = state(&[1], 0);
    with_identity(&mut s, 1, 5);
    s.apply(4, &ControlCommand::RemoveMember { node: 1 });
    s.apply(5, &register(1));
    let work = fence_work(&s, &fencing_over(&s, &[1], &[]));
    check!(work.commands == vec![new_identity(1, 6)]);
    check!(work.forget == vec![(1, 5)]);
    // Forgotten, its user stays on the targets: the next incarnation is still above it.
    s.apply(
        6,
        &ControlCommand::ForgetIdentity {
            node: 1,
            incarnation: 5,
        },
    );
    let work = fence_work(&s, &fencing_over(&s, &[1], &[]));
    check!(work.commands == vec![new_identity(1, 6)]);
    check!(work.forget.is_empty());
}

fn pause(paused: bool) -> ControlCommand {
    ControlCommand::SetFlowPaused {
        flow: "f".into(),
        paused,
        requested_by: "test".into(),
        at_unix_ms: 1,
    }
}

#[test]
fn a_paused_flow_is_handed_back_granted_to_nobody_and_granted_again_on_resume() {
    let members: BTreeSet<NodeId> = [1, 2].into();
    let (mut s, mut index) = converged(&[1, 2], 4);
    index += 1;
    let paused_at = index;
    s.apply(index, &pause(true));
    check!(
        s.assignments_of(1).iter().all(|a| a.release_requested),
        "pausing asks every owner back at once"
    );
    converge(&mut s, &members, &mut index);
    check!(owners(&s).values().all(Option::is_none));
    check!(s.unowned_units() == 0, "paused units are not 'unowned'");
    let refused = s.apply(
        index + 1,
        &ControlCommand::Grant {
            unit: unit(0),
            node: 1,
        },
    );
    check!(refused == ControlResponse::Ignored(Rejection::FlowPaused));
    // Pausing again keeps the first record.
    s.apply(index + 2, &pause(true));
    check!(s.paused_flows.get("f").map(|p| p.index) == Some(paused_at));
    index += 3;
    s.apply(index, &pause(false));
    converge(&mut s, &members, &mut index);
    check!(owners(&s).values().all(Option::is_some));
    check!(within_one(&loads(&s, &members)));
}

#[test]
fn a_dead_owner_of_a_paused_flow_loses_its_units_but_nobody_gets_them() {
    let (mut s, mut index) = converged(&[1, 2], 4);
    index += 1;
    s.apply(index, &pause(true));
    // Node 2 died before handing its units back: they are revoked, not re-granted.
    let live: BTreeSet<NodeId> = [1].into();
    let cmds = plan_with(&s, &live, &renewals_seen(&s));
    check!(cmds
        .iter()
        .all(|c| matches!(c, ControlCommand::Revoke { .. })));
    check!(!cmds.is_empty());
}

fn publish(s: &mut ControlState, node: NodeId, digest: Option<&str>) {
    let digests = digest
        .map(|d| BTreeMap::from([("f".to_owned(), d.to_owned())]))
        .unwrap_or_default();
    s.apply(4, &ControlCommand::PublishConfig { node, digests });
}

fn round_from(s: &ControlState, live: &[NodeId], reference: NodeId) -> Vec<ControlCommand> {
    plan(
        s,
        &MemberLeases {
            live: live.iter().copied().collect(),
            config_reference: Some(reference),
            ..MemberLeases::default()
        },
    )
}

#[test]
fn only_members_that_run_the_flow_as_the_leader_does_get_its_units() {
    let mut s = state(&[1, 2, 3], 6);
    publish(&mut s, 1, Some("a"));
    publish(&mut s, 2, Some("a"));
    publish(&mut s, 3, Some("b"));
    let cmds = round_from(&s, &[1, 2, 3], 1);
    check!(granted_to(&cmds) == BTreeSet::from([1, 2]));
    // A leader that never published (older version, or not yet): no check.
    let mut legacy = state(&[1, 2, 3], 6);
    publish(&mut legacy, 3, Some("b"));
    check!(granted_to(&round_from(&legacy, &[1, 2, 3], 1)) == BTreeSet::from([1, 2, 3]));
    // A leader without the flow grants it to nobody.
    let mut without = state(&[1, 2], 4);
    publish(&mut without, 1, None);
    publish(&mut without, 2, Some("a"));
    check!(granted_to(&round_from(&without, &[1, 2], 1)).is_empty());
}

#[test]
fn a_member_whose_config_changed_is_asked_its_units_back() {
    let (mut s, _) = converged(&[1, 2], 4);
    publish(&mut s, 1, Some("a"));
    publish(&mut s, 2, Some("a"));
    check!(
        round_from(&s, &[1, 2], 1).is_empty(),
        "agreement changes nothing"
    );
    publish(&mut s, 2, Some("a2"));
    let cmds = round_from(&s, &[1, 2], 1);
    let asked: BTreeSet<WorkUnit> = cmds
        .iter()
        .filter_map(|c| match c {
            ControlCommand::RequestRelease { unit, .. } => Some(unit.clone()),
            _ => None,
        })
        .collect();
    let owned_by_2: BTreeSet<WorkUnit> = s
        .units
        .iter()
        .filter(|(_, r)| r.owner == Some(2))
        .map(|(u, _)| u.clone())
        .collect();
    check!(!owned_by_2.is_empty());
    check!(asked == owned_by_2);
    check!(granted_to(&cmds).is_empty(), "nothing is free yet");
    // Once handed back, they go to the member that agrees.
    for u in &owned_by_2 {
        let epoch = s.units[u].epoch;
        s.apply(
            50,
            &ControlCommand::Release {
                unit: u.clone(),
                epoch,
                node: 2,
            },
        );
    }
    check!(granted_to(&round_from(&s, &[1, 2], 1)) == BTreeSet::from([1]));
}

#[test]
fn a_member_back_while_a_target_is_down_gets_its_next_identity_and_the_old_ones_units_there_stay_held(
) {
    let (mut s, topology) = three_flows();
    let b0 = WorkUnit::new("b", "s", "t", 0);
    s.apply(30, &fence_member(1, 1));
    s.apply(31, &ControlCommand::fence_target(1, 1, "eu", &["a"]));
    // Node 1 renews again (restarted, or back from a freeze); `ap` still does not answer.
    let back = |s: &ControlState| MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(s, &topology),
        ..fencing_over(s, &[1, 2], &[])
    };
    let work = fence_work(&s, &back(&s));
    let replace = ControlCommand::ReplaceFencedIdentity {
        node: 1,
        fenced: 1,
        incarnation: 2,
        held_flows: vec!["b".into()],
    };
    check!(work.commands == vec![replace.clone()]);
    check!(revokes(&work) == vec![(1, 1, "ap")]);
    s.apply(32, &replace);
    check!(s
        .writer_login(1, &crate::identity::test_passwords())
        .is_some());
    // b0 is held for `ap`: owned by nobody and granted to nobody; c0 (an unfenced target)
    // stays with node 1's new run.
    check!(owned_by(&s, 1) == BTreeSet::from(["c0".into()]));
    check!(s.is_held(&b0));
    let cmds = plan(&s, &back(&s));
    check!(!cmds
        .iter()
        .any(|c| matches!(c, ControlCommand::Grant { unit, .. } if unit.flow == "b")));
    check!(cmds
        .iter()
        .any(|c| matches!(c, ControlCommand::Grant { unit, .. } if unit.flow == "a")));
    // The old identity's revoke goes on; `ap`'s acknowledgement frees b0, then the old
    // identity is revoked everywhere and forgotten like any replaced one.
    check!(revokes(&fence_work(&s, &back(&s))) == vec![(1, 1, "ap")]);
    s.apply(33, &ControlCommand::fence_target(1, 1, "ap", &["b"]));
    check!(!s.is_held(&b0));
    let work = fence_work(&s, &back(&s));
    check!(work.commands.contains(&ControlCommand::IdentityRevoked {
        node: 1,
        incarnation: 1
    }));
    check!(revokes(&work).is_empty());
    s.apply(34, &ControlCommand::Batch(work.commands));
    check!(s.stale_identities.contains(&(1, 1)));
    check!(s.revoke_pending.is_empty());
    check!(s.identities.get(&1).map(|i| (i.incarnation, i.fenced)) == Some((2, false)));
}

#[test]
fn the_next_incarnation_is_above_a_replaced_one_still_being_revoked() {
    let (mut s, topology) = three_flows();
    s.apply(30, &fence_member(1, 1));
    s.apply(
        31,
        &ControlCommand::ReplaceFencedIdentity {
            node: 1,
            fenced: 1,
            incarnation: 2,
            held_flows: vec!["a".into(), "b".into()],
        },
    );
    // Fenced again before any target acknowledged the first revoke.
    s.apply(32, &fence_member(1, 2));
    let lease = MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(&s, &topology),
        ..fencing_over(&s, &[1, 2], &[])
    };
    let work = fence_work(&s, &lease);
    check!(work.commands.iter().any(|c| matches!(
        c,
        ControlCommand::ReplaceFencedIdentity {
            node: 1,
            fenced: 2,
            incarnation: 3,
            ..
        }
    )));
    check!(revokes(&work) == vec![(1, 2, "ap"), (1, 2, "eu"), (1, 1, "ap"), (1, 1, "eu")]);
}

#[test]
fn a_member_that_may_not_write_to_a_target_is_not_given_that_targets_units_by_release() {
    let (mut s, _) = three_flows();
    // `c`, the last flow in unit order, writes to `ap` here.
    let topology = FenceTopology::new([
        ("a".to_owned(), Some("eu".to_owned())),
        ("b".to_owned(), None),
        ("c".to_owned(), Some("ap".to_owned())),
    ]);
    s.apply(40, &register(3));
    with_identity(&mut s, 3, 1);
    // Node 3's user could not be made on `ap` (down): it may take units of `a` and `b` only.
    let mut ensured = all_ensured(&s, &topology);
    ensured.remove(&("ap".to_owned(), 3, 1));
    let lease = MemberLeases {
        topology,
        ensured,
        ..fencing_over(&s, &[1, 2, 3], &[])
    };
    let released: Vec<String> = plan(&s, &lease)
        .iter()
        .filter_map(|c| match c {
            ControlCommand::RequestRelease { unit, .. } => Some(unit.flow.clone()),
            _ => None,
        })
        .collect();
    check!(!released.is_empty());
    check!(released.iter().all(|f| f != "c"), "released {released:?}");
}

/// The node's way of running rounds: `round` on a leader view of term 1 that observed the
/// members at `now`, fencing off, `changes` as the state machine counts them.
fn leader_round(
    s: &ControlState,
    view: &mut LeaderView,
    retention: &mut Retention,
    quiet: &mut Quiet,
    now: Instant,
    changes: u64,
) -> Vec<ControlCommand> {
    round(
        s,
        view,
        retention,
        quiet,
        RoundContext {
            now,
            timing: &ControlTiming::default(),
            leader: 1,
            fencing: None,
            changes,
            own_config: None,
            gone: BTreeSet::new(),
            acknowledged: &[],
        },
    )
    .0
}

#[test]
fn a_round_on_the_inputs_of_one_that_decided_nothing_is_skipped() {
    let (mut s, mut index) = converged(&[1, 2, 3], 12);
    let (mut view, mut retention, mut quiet) =
        (LeaderView::new(1), Retention::default(), Quiet::default());
    let mut changes = 7;
    let start = Instant::now();
    let renew_all = |s: &mut ControlState, index: &mut u64, members: &[NodeId]| {
        for node in members {
            *index += 1;
            let renewal = ControlCommand::RenewLease { node: *node };
            check!(!renewal.can_change_rounds());
            s.apply(*index, &renewal);
        }
    };
    let at = |ms: u64| start + Duration::from_millis(ms);

    // Converged: the first round decides nothing, the next ones are skipped, renewals or not.
    check!(leader_round(&s, &mut view, &mut retention, &mut quiet, at(0), changes).is_empty());
    check!(quiet.skipped == 0);
    check!(leader_round(&s, &mut view, &mut retention, &mut quiet, at(100), changes).is_empty());
    renew_all(&mut s, &mut index, &[1, 2, 3]);
    check!(leader_round(&s, &mut view, &mut retention, &mut quiet, at(200), changes).is_empty());
    check!(quiet.skipped == 2);

    // A change of the state (new units): a full round, which grants them.
    index += 1;
    let more = report(15);
    check!(more.can_change_rounds());
    s.apply(index, &more);
    changes += 1;
    let grants = leader_round(&s, &mut view, &mut retention, &mut quiet, at(300), changes);
    check!(grants.len() == 3);
    check!(quiet.skipped == 2);
    // Its commands are applied (a change): the round after decides nothing, then quiet again.
    index += 1;
    s.apply(index, &ControlCommand::Batch(grants));
    changes += 1;
    check!(leader_round(&s, &mut view, &mut retention, &mut quiet, at(400), changes).is_empty());
    check!(leader_round(&s, &mut view, &mut retention, &mut quiet, at(500), changes).is_empty());
    check!(quiet.skipped == 3);

    // Member 3 stops renewing while the others go on: its lease ends without any change a
    // round counts, and the round that sees the live set shrink revokes its units.
    let expiry = ControlTiming::default().lease_expiry;
    let mut revoked = Vec::new();
    let mut ms = 600;
    while revoked.is_empty() {
        renew_all(&mut s, &mut index, &[1, 2]);
        revoked = leader_round(&s, &mut view, &mut retention, &mut quiet, at(ms), changes);
        check!(Duration::from_millis(ms) < expiry * 2 + Duration::from_secs(1));
        ms += 100;
    }
    // Its five units are revoked and granted to the two others in the same round.
    let revokes = revoked
        .iter()
        .filter(|c| matches!(c, ControlCommand::Revoke { .. }))
        .count();
    check!(revokes == 5);
    check!(revoked.len() == 10);
}

#[test]
fn a_round_waiting_to_forget_a_unit_is_never_skipped() {
    let (mut s, mut index) = converged(&[1, 2], 4);
    // Unit 3 leaves the topic: retired, then released by its owner, so forgettable.
    index += 1;
    s.apply(index, &report(3));
    let owner = s.units[&unit(3)].owner.expect("owned");
    let epoch = s.units[&unit(3)].epoch;
    index += 1;
    s.apply(
        index,
        &ControlCommand::Release {
            unit: unit(3),
            epoch,
            node: owner,
        },
    );
    check!(s.forgettable_units().count() == 1);
    let (mut view, mut retention, mut quiet) =
        (LeaderView::new(1), Retention::default(), Quiet::default());
    let now = Instant::now();
    for round in 0..3 {
        let at = now + Duration::from_millis(100 * round);
        leader_round(&s, &mut view, &mut retention, &mut quiet, at, 1);
    }
    check!(!retention.is_idle());
    check!(quiet.skipped == 0);
}

/// A member fenced while live (a restarted process gives up the identity its predecessor
/// wrote with; a refused login gives up its own) keeps its units of unfenced targets and may
/// get more of them while it waits for its next identity: only the fenced targets' units
/// wait for the revoke. Asking the others back would move them on every restart.
#[test]
fn a_fenced_live_member_keeps_and_gets_units_of_unfenced_targets() {
    let (mut s, topology) = three_flows();
    s.apply(
        20,
        &ControlCommand::ReportUnits {
            flow: "c".into(),
            units: (0..3).map(|p| WorkUnit::new("c", "s", "t", p)).collect(),
        },
    );
    s.apply(30, &fence_member(1, 1));
    let lease = MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(&s, &topology),
        ..fencing_over(&s, &[1, 2], &[])
    };
    let asked_back = |cmds: &[ControlCommand]| -> Vec<String> {
        cmds.iter()
            .filter_map(|c| match c {
                ControlCommand::RequestRelease { unit, .. } => {
                    Some(format!("{}{}", unit.flow, unit.partition))
                }
                _ => None,
            })
            .collect()
    };
    let cmds = plan(&s, &lease);
    check!(asked_back(&cmds).is_empty());
    // The new unit of the unfenced target goes to member 1, below its share.
    let c2 = WorkUnit::new("c", "s", "t", 2);
    check!(cmds == vec![ControlCommand::Grant { unit: c2, node: 1 }]);
    s.apply(31, &ControlCommand::Batch(cmds));
    // `eu` acknowledged: a0 goes to member 2 (member 1 has no identity to write there with),
    // c0 and c2 stay where they are.
    s.apply(32, &ControlCommand::fence_target(1, 1, "eu", &["a"]));
    let cmds = plan(&s, &lease);
    check!(asked_back(&cmds).is_empty());
    check!(
        cmds.iter()
            .filter(|c| matches!(c, ControlCommand::Grant { .. }))
            .collect::<Vec<_>>()
            == vec![&ControlCommand::Grant {
                unit: WorkUnit::new("a", "s", "t", 0),
                node: 2
            }]
    );
}

/// Every member publishes its config digests of flows `a`, `b` and `c`; member 1 runs `a`
/// differently from member 2, the leader.
fn a_differs_on_member_1(s: &mut ControlState) {
    for (node, a) in [(1, "a-old"), (2, "a-new")] {
        let digests = BTreeMap::from([
            ("a".to_owned(), a.to_owned()),
            ("b".to_owned(), "b".to_owned()),
            ("c".to_owned(), "c".to_owned()),
        ]);
        s.apply(4, &ControlCommand::PublishConfig { node, digests });
    }
}

/// A rolling config change that turns fencing on for `eu`, not yet applied on member 1: it
/// runs flow `a` without the fence, writing to `eu` with the cluster's configured credential,
/// which the revoke of its identity does not stop. Frozen (unresponsive, its lease alive), its
/// units of `a` move on the lease alone, as an unfenced target's do; its units of `b`, a flow
/// it runs as the leader does, move once `ap` acknowledged the fence, as before.
#[test]
fn units_of_a_member_on_another_config_of_their_flow_move_on_the_lease_alone() {
    let (mut s, topology) = three_flows();
    a_differs_on_member_1(&mut s);
    let a0 = WorkUnit::new("a", "s", "t", 0);
    let frozen = |s: &ControlState| MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(s, &topology),
        config_reference: Some(2),
        ..fencing_over(s, &[1, 2], &[1])
    };
    // Fenced for `b` (it owns b0), the decision being per member.
    check!(fence_work(&s, &frozen(&s)).commands == vec![fence_member(1, 1)]);
    s.apply(30, &fence_member(1, 1));
    check!(revokes(&fence_work(&s, &frozen(&s))) == vec![(1, 1, "ap"), (1, 1, "eu")]);
    // What the leader commits for each acknowledgement takes only the flows member 1 runs as
    // the leader does: nothing on `eu`.
    let ack = |target: &str| {
        let op = crate::fence_ops::FenceOp::Revoke {
            node: 1,
            incarnation: 1,
            target: target.to_owned(),
        };
        op.acknowledged(&topology, &s, Some(2))
    };
    check!(ack("eu") == Some(ControlCommand::fence_target(1, 1, "eu", &[])));
    check!(ack("ap") == Some(ControlCommand::fence_target(1, 1, "ap", &["b"])));
    // Before any acknowledgement, a0 is neither revoked nor granted (its lease is alive), and
    // not waiting for a fence either.
    let moves_a0 = |cmds: &[ControlCommand]| {
        cmds.iter().any(|c| {
            matches!(c, ControlCommand::Revoke { unit, .. } | ControlCommand::Grant { unit, .. } if *unit == a0)
        })
    };
    check!(!moves_a0(&plan(&s, &frozen(&s))));
    let (eu, ap) = (ack("eu").expect("a command"), ack("ap").expect("a command"));
    s.apply(31, &eu);
    s.apply(32, &ap);
    check!(owned_by(&s, 1) == BTreeSet::from(["a0".into(), "c0".into()]));
    check!(!moves_a0(&plan(&s, &frozen(&s))));
    // Its lease expired: revoked, guarded by the renewal the leader saw.
    let expired = MemberLeases {
        live: BTreeSet::from([2]),
        ..frozen(&s)
    };
    let cmds = plan(&s, &expired);
    check!(cmds
        .iter()
        .any(|c| matches!(c, ControlCommand::Revoke { unit, .. } if *unit == a0)));
}

/// Back (responsive again) while no target acknowledged: the next identity holds only the
/// units of flows whose writes the old identity's revoke stops; member 1's units of `a`
/// (another config) are not held, and are asked back as any unit of a flow it runs
/// differently.
#[test]
fn a_replaced_identity_holds_no_units_of_a_flow_run_on_another_config() {
    let (mut s, topology) = three_flows();
    a_differs_on_member_1(&mut s);
    s.apply(30, &fence_member(1, 1));
    let back = MemberLeases {
        topology: topology.clone(),
        ensured: all_ensured(&s, &topology),
        config_reference: Some(2),
        ..fencing_over(&s, &[1, 2], &[])
    };
    let replace = ControlCommand::ReplaceFencedIdentity {
        node: 1,
        fenced: 1,
        incarnation: 2,
        held_flows: vec!["b".into()],
    };
    check!(fence_work(&s, &back).commands == vec![replace.clone()]);
    s.apply(33, &replace);
    check!(owned_by(&s, 1) == BTreeSet::from(["a0".into(), "c0".into()]));
    check!(plan(&s, &back).iter().any(|c| matches!(
        c,
        ControlCommand::RequestRelease { unit, .. } if unit.flow == "a"
    )));
}

/// Seed 2406 of the simulator, in small: a leader restarted onto a new config, elected before
/// its `PublishConfig` was applied, would compare the others with its previous config.
#[test]
fn a_leader_decides_nothing_until_the_config_it_runs_is_applied() {
    let mut s = state(&[1, 2], 4);
    publish(&mut s, 1, Some("old"));
    publish(&mut s, 2, Some("old"));
    let new = BTreeMap::from([("f".to_owned(), "new".to_owned())]);
    let round_as_1 = |s: &ControlState, own: Option<&BTreeMap<String, String>>| {
        let mut view = LeaderView::new(1);
        round(
            s,
            &mut view,
            &mut Retention::default(),
            &mut Quiet::default(),
            RoundContext {
                now: Instant::now(),
                timing: &ControlTiming::default(),
                leader: 1,
                fencing: None,
                changes: 1,
                own_config: own,
                gone: BTreeSet::new(),
                acknowledged: &[],
            },
        )
        .0
    };
    // Applied: node 1's previous digest, equal to node 2's, which runs the old config.
    check!(round_as_1(&s, Some(&new)).is_empty());
    // Without the check (a leader that says nothing of its config) units go out as before.
    check!(!round_as_1(&s, None).is_empty());
    // Once its own digest is applied, node 2 (on the old config) gets nothing of `f`.
    publish(&mut s, 1, Some("new"));
    let cmds = round_as_1(&s, Some(&new));
    check!(!cmds.is_empty());
    check!(granted_to(&cmds) == BTreeSet::from([1]));
}

/// A process restarted onto another config works on no unit the leader granted or kept by
/// its previous config, until its own digest of the unit's flow is applied.
#[test]
fn a_node_runs_only_units_of_flows_whose_applied_config_it_runs() {
    let (mut s, _) = converged(&[1, 2], 4);
    publish(&mut s, 1, Some("a"));
    publish(&mut s, 2, Some("a"));
    let mine = s.assignments_of(2);
    check!(!mine.is_empty());
    let running = |d: &str| BTreeMap::from([("f".to_owned(), d.to_owned())]);
    check!(s.assignments_running(2, None) == mine);
    check!(s.assignments_running(2, Some(&running("a"))) == mine);
    check!(s.assignments_running(2, Some(&running("b"))).is_empty());
    let first = &mine[0];
    check!(!s.flow_config_applied(2, &first.unit.flow, Some(&running("b"))));
    publish(&mut s, 2, Some("b"));
    check!(s.assignments_running(2, Some(&running("b"))) == mine);
}

/// A fencing round of leader 2 at `now`, flow `f` into the fenced target `t`, every identity
/// ensured, with the network's `gone` evidence and the targets' `acknowledged` revokes.
fn fencing_round(
    s: &ControlState,
    view: &mut LeaderView,
    now: Instant,
    gone: BTreeSet<NodeId>,
    acknowledged: &[ControlCommand],
) -> (Vec<ControlCommand>, FenceWork) {
    round(
        s,
        view,
        &mut Retention::default(),
        &mut Quiet::default(),
        RoundContext {
            now,
            timing: &ControlTiming::default(),
            leader: 2,
            fencing: Some(FencingView {
                topology: topology(),
                ensured: all_ensured(s, &topology()),
                ensuring: BTreeSet::new(),
            }),
            changes: 0,
            own_config: None,
            gone,
            acknowledged,
        },
    )
}

#[test]
fn a_dead_members_acknowledged_fence_and_the_grants_it_frees_are_one_entry() {
    let ms = Duration::from_millis;
    let mut s = state(&[1, 2], 4);
    with_identity(&mut s, 1, 3);
    with_identity(&mut s, 2, 1);
    let mut index = 10;
    converge(&mut s, &BTreeSet::from([1, 2]), &mut index);
    check!(!owned_by(&s, 1).is_empty());
    let t0 = Instant::now();
    let mut view = LeaderView::new(1);
    check!(fencing_round(&s, &mut view, t0, BTreeSet::new(), &[])
        .0
        .is_empty());
    // Member 1's calls were refused twice since its latest renewal: fenced long before
    // `fence_after` (600 ms) would have.
    let gone = BTreeSet::from([1]);
    let (cmds, _) = fencing_round(&s, &mut view, t0 + ms(100), gone.clone(), &[]);
    check!(cmds == vec![fence_member(1, 3)]);
    index += 1;
    s.apply(index, &ControlCommand::Batch(cmds));
    let (cmds, work) = fencing_round(&s, &mut view, t0 + ms(200), gone.clone(), &[]);
    check!(revokes(&work) == vec![(1, 3, "t")]);
    check!(granted_to(&cmds).is_empty(), "held until `t` acknowledges");
    // `t` acknowledged: the round writes that first and grants what it frees in the same
    // entry, with the identity's end (every fenced target acknowledged).
    let ack = ControlCommand::fence_target(1, 3, "t", &["f"]);
    let (cmds, work) = fencing_round(
        &s,
        &mut view,
        t0 + ms(300),
        gone,
        std::slice::from_ref(&ack),
    );
    check!(cmds.first() == Some(&ack));
    check!(cmds.contains(&ControlCommand::IdentityRevoked {
        node: 1,
        incarnation: 3
    }));
    check!(granted_to(&cmds) == BTreeSet::from([2]));
    check!(
        work.revoke.is_empty(),
        "acknowledged: nothing to revoke again"
    );
    index += 1;
    s.apply(index, &ControlCommand::Batch(cmds));
    check!(s.units.values().all(|r| r.owner == Some(2)));
}
