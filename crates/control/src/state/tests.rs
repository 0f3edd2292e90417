use assert2::{check, let_assert};
use replicator_model::UnitCounters;

use super::*;
use crate::identity::test_passwords;

fn unit(p: u32) -> WorkUnit {
    WorkUnit::new("f", "s", "t", p)
}

fn register(state: &mut ControlState, index: u64, node: NodeId) {
    state.apply(
        index,
        &ControlCommand::RegisterMember {
            node,
            raft_addr: format!("r{node}"),
            api_addr: format!("a{node}"),
        },
    );
}

/// Grants unit `p` to `node`.
fn grant(p: u32, node: NodeId) -> ControlCommand {
    ControlCommand::Grant {
        unit: unit(p),
        node,
    }
}

/// `node` hands unit 0 back under `epoch`.
fn release(epoch: u64, node: NodeId) -> ControlCommand {
    ControlCommand::Release {
        unit: unit(0),
        epoch: Epoch(epoch),
        node,
    }
}

/// Flow `f` has exactly `units`.
fn report(units: Vec<WorkUnit>) -> ControlCommand {
    ControlCommand::ReportUnits {
        flow: "f".into(),
        units,
    }
}

/// Two members, units 0..3 reported, unit 0 granted to node 1 at index 10.
fn setup() -> ControlState {
    let mut s = ControlState::default();
    register(&mut s, 1, 1);
    register(&mut s, 2, 2);
    s.apply(3, &report(vec![unit(0), unit(1), unit(2)]));
    let r = s.apply(10, &grant(0, 1));
    check!(r == ControlResponse::Granted { epoch: Epoch(10) });
    s
}

fn commit(epoch: u64, offset: u64, created: u64) -> OffsetCommit {
    OffsetCommit {
        unit: unit(0),
        epoch: Epoch(epoch),
        offset,
        history_label: created,
        counters: UnitCounters {
            messages: 2,
            bytes: 10,
            ..Default::default()
        },
    }
}

fn commit_as(s: &mut ControlState, index: u64, node: NodeId, c: OffsetCommit) -> CommitOutcome {
    let_assert!(
        ControlResponse::Commits(out) = s.apply(
            index,
            &ControlCommand::CommitOffsets {
                node,
                commits: vec![c]
            }
        )
    );
    out[0]
}

#[test]
fn grant_sets_epoch_to_log_index_and_refuses_owned_units() {
    let mut s = setup();
    check!(s.apply(11, &grant(0, 2)) == ControlResponse::Ignored(Rejection::AlreadyOwned));
    check!(s.apply(12, &grant(9, 2)) == ControlResponse::Ignored(Rejection::UnknownUnit));
    check!(s.apply(13, &grant(1, 7)) == ControlResponse::Ignored(Rejection::UnknownMember));
    check!(
        s.assignments_of(1)
            == vec![Assignment {
                unit: unit(0),
                epoch: Epoch(10),
                release_requested: false
            }]
    );
}

#[test]
fn offsets_never_move_backwards_within_an_upstream_history() {
    let mut s = setup();
    check!(commit_as(&mut s, 11, 1, commit(10, 50, 7)) == CommitOutcome::Committed);
    check!(commit_as(&mut s, 12, 1, commit(10, 40, 7)) == CommitOutcome::Committed);
    let p = s.units[&unit(0)].progress;
    check!(p.confirmed == Some(50));
    // Counters accumulate even for a lower offset.
    check!(p.counters.messages == 4);
    // A recreated topic starts a new history, even at a lower offset.
    check!(commit_as(&mut s, 13, 1, commit(10, 3, 8)) == CommitOutcome::Committed);
    check!(s.units[&unit(0)].progress.confirmed == Some(3));
    check!(s.units[&unit(0)].progress.history_label == 8);
}

#[test]
fn stale_epoch_or_wrong_node_is_fenced_and_changes_nothing() {
    let mut s = setup();
    commit_as(&mut s, 11, 1, commit(10, 50, 7));
    check!(
        commit_as(&mut s, 12, 1, commit(9, 60, 7))
            == CommitOutcome::Fenced {
                current: Some(Epoch(10))
            }
    );
    check!(
        commit_as(&mut s, 13, 2, commit(10, 60, 7))
            == CommitOutcome::Fenced {
                current: Some(Epoch(10))
            }
    );
    check!(s.units[&unit(0)].progress.confirmed == Some(50));
    check!(s.units[&unit(0)].progress.counters.messages == 2);
    // Released: nobody may commit, the fence reports no current epoch.
    s.apply(14, &release(10, 1));
    check!(commit_as(&mut s, 15, 1, commit(10, 60, 7)) == CommitOutcome::Fenced { current: None });
}

#[test]
fn grant_and_commit_race_resolves_by_log_order() {
    // Old owner's commit ordered after the regrant: fenced. Ordered before: committed.
    let mut s = setup();
    s.apply(11, &release(10, 1));
    s.apply(12, &grant(0, 2));
    check!(
        commit_as(&mut s, 13, 1, commit(10, 99, 7))
            == CommitOutcome::Fenced {
                current: Some(Epoch(12))
            }
    );
    check!(s.units[&unit(0)].progress.confirmed == None);

    let mut s = setup();
    check!(commit_as(&mut s, 11, 1, commit(10, 99, 7)) == CommitOutcome::Committed);
    s.apply(12, &release(10, 1));
    s.apply(13, &grant(0, 2));
    check!(s.units[&unit(0)].progress.confirmed == Some(99));
    check!(s.units[&unit(0)].epoch == Epoch(13));
}

#[test]
fn revoke_loses_to_a_renewal_applied_after_the_leader_looked() {
    let mut s = setup();
    // The leader saw node 1's renewal index 1 (its registration) expire...
    s.apply(11, &ControlCommand::RenewLease { node: 1 });
    // ...but a renewal (index 11) was applied before the revoke: the revoke is ignored.
    let r = s.apply(
        12,
        &ControlCommand::Revoke {
            unit: unit(0),
            epoch: Epoch(10),
            renewal_index: 1,
        },
    );
    check!(r == ControlResponse::Ignored(Rejection::LeaseRenewed));
    check!(s.units[&unit(0)].owner == Some(1));
    // With the current renewal index it applies, and the next renewal reports it.
    let r = s.apply(
        13,
        &ControlCommand::Revoke {
            unit: unit(0),
            epoch: Epoch(10),
            renewal_index: 11,
        },
    );
    check!(r == ControlResponse::Done);
    check!(s.units[&unit(0)].owner == None);
    check!(
        s.apply(14, &ControlCommand::RenewLease { node: 1 })
            == ControlResponse::Renewed {
                revoked_since_previous: true
            }
    );
    check!(
        s.apply(15, &ControlCommand::RenewLease { node: 1 })
            == ControlResponse::Renewed {
                revoked_since_previous: false
            }
    );
}

#[test]
fn release_and_request_need_the_current_epoch() {
    let mut s = setup();
    check!(
        s.apply(
            11,
            &ControlCommand::RequestRelease {
                unit: unit(0),
                epoch: Epoch(9)
            }
        ) == ControlResponse::Ignored(Rejection::StaleEpoch)
    );
    check!(
        s.apply(
            12,
            &ControlCommand::RequestRelease {
                unit: unit(0),
                epoch: Epoch(10)
            }
        ) == ControlResponse::Done
    );
    check!(s.assignments_of(1)[0].release_requested);
    check!(s.apply(13, &release(10, 2)) == ControlResponse::Ignored(Rejection::StaleEpoch));
    check!(s.apply(14, &release(10, 1)) == ControlResponse::Done);
    check!(s.assignments_of(1).is_empty());
    // The epoch survives the release so that the next grant is strictly larger.
    check!(s.units[&unit(0)].epoch == Epoch(10));
}

#[test]
fn units_no_longer_reported_are_retired_with_progress_kept() {
    let mut s = setup();
    commit_as(&mut s, 11, 1, commit(10, 50, 7));
    s.apply(12, &report(vec![unit(1)]));
    let rec = &s.units[&unit(0)];
    check!(rec.retired);
    // The owner keeps a retired unit until it hands it back: it is asked to, its final commit
    // still counts, and nobody else can be granted it meanwhile.
    check!(rec.owner == Some(1));
    check!(rec.progress.confirmed == Some(50));
    check!(
        s.assignments_of(1)
            == vec![Assignment {
                unit: unit(0),
                epoch: Epoch(10),
                release_requested: true
            }]
    );
    check!(s.holds(1, &unit(0), Epoch(10)));
    check!(commit_as(&mut s, 13, 1, commit(10, 60, 7)) == CommitOutcome::Committed);
    check!(s.apply(13, &grant(0, 2)) == ControlResponse::Ignored(Rejection::Retired));
    check!(s.apply(13, &release(10, 1)) == ControlResponse::Done);
    check!(s.units[&unit(0)].owner == None);
    check!(s.assignments_of(1).is_empty());
    check!(s.apply(13, &grant(0, 1)) == ControlResponse::Ignored(Rejection::Retired));
    // Reported again: active again, progress still there.
    s.apply(14, &report(vec![unit(0)]));
    check!(!s.units[&unit(0)].retired);
    check!(s.units[&unit(0)].progress.confirmed == Some(60));
    // Another flow's units are untouched by a report of "f"; a foreign unit is refused.
    let other = WorkUnit::new("g", "s", "t", 0);
    s.apply(
        15,
        &ControlCommand::ReportUnits {
            flow: "g".into(),
            units: vec![other.clone()],
        },
    );
    s.apply(16, &report(vec![unit(0)]));
    check!(!s.units[&other].retired);
    check!(s.apply(17, &report(vec![other])) == ControlResponse::Ignored(Rejection::InvalidFlow));
}

#[test]
fn leaving_members_get_nothing_and_removal_needs_no_units() {
    let mut s = setup();
    s.apply(11, &ControlCommand::LeaveMember { node: 2 });
    check!(s.apply(12, &grant(1, 2)) == ControlResponse::Ignored(Rejection::MemberLeaving));
    check!(
        s.apply(13, &ControlCommand::RemoveMember { node: 1 })
            == ControlResponse::Ignored(Rejection::StillOwnsUnits)
    );
    check!(s.apply(14, &ControlCommand::RemoveMember { node: 2 }) == ControlResponse::Done);
    check!(!s.members.contains_key(&2));
}

#[test]
fn batches_apply_in_order_and_do_not_nest() {
    let mut s = setup();
    let r = s.apply(
        20,
        &ControlCommand::Batch(vec![
            grant(1, 2),
            grant(1, 1),
            ControlCommand::Batch(vec![]),
        ]),
    );
    check!(
        r == ControlResponse::Batch(vec![
            ControlResponse::Granted { epoch: Epoch(20) },
            ControlResponse::Ignored(Rejection::AlreadyOwned),
            ControlResponse::Ignored(Rejection::NestedBatch),
        ])
    );
}

#[test]
fn apply_is_deterministic() {
    let cmds = [
        ControlCommand::RenewLease { node: 1 },
        grant(2, 2),
        ControlCommand::CommitOffsets {
            node: 1,
            commits: vec![commit(10, 5, 1)],
        },
    ];
    let (mut a, mut b) = (setup(), setup());
    for (i, c) in cmds.iter().enumerate() {
        check!(a.apply(100 + i as u64, c) == b.apply(100 + i as u64, c));
    }
    check!(a == b);
}

#[test]
fn unowned_units_count_only_reported_units_without_an_owner() {
    let mut s = setup();
    // setup: units 0..3 reported, unit 0 owned by node 1.
    check!(s.unowned_units() == 2);
    s.apply(20, &report(vec![unit(0), unit(1)]));
    // Unit 2 is retired: not counted; unit 0 (owned) neither.
    check!(s.unowned_units() == 1);
}

fn identity(node: NodeId, incarnation: u64) -> ControlCommand {
    ControlCommand::SetWriterIdentity {
        node,
        incarnation,
        password: format!("pw{incarnation}"),
    }
}

fn fence(node: NodeId, incarnation: u64) -> ControlCommand {
    ControlCommand::FenceMember { node, incarnation }
}

fn acknowledged(node: NodeId, incarnation: u64) -> ControlCommand {
    ControlCommand::FenceAcknowledged { node, incarnation }
}

fn revoked(node: NodeId, incarnation: u64) -> ControlCommand {
    ControlCommand::IdentityRevoked { node, incarnation }
}

#[test]
fn a_writer_identity_is_replaced_only_once_fenced_and_only_upwards() {
    let mut s = setup();
    check!(s.writer_login(1, &test_passwords()).is_none());
    check!(s.apply(20, &identity(1, 1)) == ControlResponse::Done);
    let_assert!(Some(login) = s.writer_login(1, &test_passwords()));
    check!(login.incarnation == 1);
    check!(
        login.password == "pw1",
        "an older leader's stored password is kept"
    );
    // Never over an identity that still has its rights.
    check!(s.apply(21, &identity(1, 2)) == ControlResponse::Ignored(Rejection::IdentityInUse));
    check!(s.apply(22, &identity(9, 1)) == ControlResponse::Ignored(Rejection::UnknownMember));
    check!(s.apply(23, &fence(1, 1)) == ControlResponse::Done);
    check!(s.writer_login(1, &test_passwords()).is_none());
    check!(s.apply(24, &identity(1, 1)) == ControlResponse::Ignored(Rejection::StaleIncarnation));
    // Fenced but not yet revoked on the targets: still in use.
    check!(s.apply(24, &identity(1, 2)) == ControlResponse::Ignored(Rejection::IdentityInUse));
    check!(s.apply(24, &ControlCommand::fence_target(1, 1, "t", &["f"])) == ControlResponse::Done);
    check!(s.apply(24, &identity(1, 2)) == ControlResponse::Ignored(Rejection::IdentityInUse));
    check!(s.apply(24, &revoked(1, 1)) == ControlResponse::Done);
    let derived = ControlCommand::SetWriterIdentity {
        node: 1,
        incarnation: 2,
        password: String::new(),
    };
    check!(s.apply(25, &derived) == ControlResponse::Done);
    let_assert!(Some(login) = s.writer_login(1, &test_passwords()));
    check!(login.incarnation == 2);
    check!(login.password == test_passwords().password(1, 2));
    check!(
        s.target_revokes.is_empty(),
        "the old identity's acknowledgements go with it"
    );
    // The replaced identity waits for its user to be deleted.
    check!(s.stale_identities == BTreeSet::from([(1, 1)]));
    let forget = ControlCommand::ForgetIdentity {
        node: 1,
        incarnation: 1,
    };
    check!(s.apply(26, &forget) == ControlResponse::Done);
    check!(s.apply(27, &forget) == ControlResponse::Ignored(Rejection::UnknownIdentity));
    check!(s.stale_identities.is_empty());
    // Its user stays on the targets: the incarnation is remembered, never handed out again.
    check!(s.forgotten_incarnations == BTreeMap::from([(1, 1)]));
}

#[test]
fn a_targets_acknowledgement_takes_only_the_units_writing_there() {
    let mut s = setup();
    s.apply(11, &grant(1, 1));
    s.apply(12, &identity(1, 4));
    let report_g = ControlCommand::ReportUnits {
        flow: "g".into(),
        units: vec![WorkUnit::new("g", "s", "t", 0)],
    };
    s.apply(13, &report_g);
    s.apply(
        14,
        &ControlCommand::Grant {
            unit: WorkUnit::new("g", "s", "t", 0),
            node: 1,
        },
    );
    check!(s.assignments_of(1).len() == 3);
    // Needs the decision first, and the current incarnation.
    check!(
        s.apply(15, &ControlCommand::fence_target(1, 4, "eu", &["f"]))
            == ControlResponse::Ignored(Rejection::StaleIncarnation)
    );
    s.apply(16, &fence(1, 4));
    check!(
        s.apply(17, &ControlCommand::fence_target(1, 3, "eu", &["f"]))
            == ControlResponse::Ignored(Rejection::StaleIncarnation)
    );
    check!(s.unrevoked_on(1, "eu"));
    check!(s.apply(18, &ControlCommand::fence_target(1, 4, "eu", &["f"])) == ControlResponse::Done);
    check!(!s.unrevoked_on(1, "eu"));
    check!(s.unrevoked_on(1, "ap"));
    let left: Vec<String> = s
        .assignments_of(1)
        .into_iter()
        .map(|a| a.unit.flow)
        .collect();
    check!(left == vec!["g".to_owned()]);
    check!(
        s.apply(19, &ControlCommand::RenewLease { node: 1 })
            == ControlResponse::Renewed {
                revoked_since_previous: true
            }
    );
    // Revoked everywhere: no unit moves with it, and it is no longer unrevoked anywhere.
    check!(s.apply(20, &revoked(1, 4)) == ControlResponse::Done);
    check!(s.assignments_of(1).len() == 1);
    check!(!s.unrevoked_on(1, "ap"));
}

fn replace(node: NodeId, fenced: u64, incarnation: u64, held: &[&str]) -> ControlCommand {
    ControlCommand::ReplaceFencedIdentity {
        node,
        fenced,
        incarnation,
        held_flows: held.iter().map(|f| (*f).to_owned()).collect(),
    }
}

#[test]
fn a_replaced_identitys_units_on_an_unacknowledged_target_are_held_until_it_acknowledges() {
    let mut s = setup();
    s.apply(11, &grant(1, 1));
    s.apply(12, &identity(1, 4));
    // Only a fenced identity is replaced, only upwards, only by a member.
    check!(
        s.apply(13, &replace(1, 4, 5, &["f"]))
            == ControlResponse::Ignored(Rejection::StaleIncarnation)
    );
    s.apply(14, &fence(1, 4));
    check!(
        s.apply(15, &replace(1, 4, 4, &["f"]))
            == ControlResponse::Ignored(Rejection::StaleIncarnation)
    );
    check!(
        s.apply(16, &replace(9, 4, 5, &["f"]))
            == ControlResponse::Ignored(Rejection::UnknownMember)
    );
    check!(s.apply(17, &replace(1, 4, 5, &["f"])) == ControlResponse::Done);
    check!(s.assignments_of(1).is_empty());
    check!(s.is_held(&unit(0)) && s.is_held(&unit(1)));
    check!(s.writer_login(1, &test_passwords()).is_some());
    // Nobody gets a held unit; a stale commit of the old run is fenced.
    check!(s.apply(18, &grant(0, 2)) == ControlResponse::Ignored(Rejection::HeldForRevoke));
    check!(matches!(
        commit_as(&mut s, 19, 1, commit(10, 5, 1)),
        CommitOutcome::Fenced { .. }
    ));
    // The new identity gets unit 2; the old identity's acknowledgement on `eu` frees only
    // what the old one held, never the new identity's units.
    s.apply(20, &grant(2, 1));
    check!(s.apply(21, &ControlCommand::fence_target(1, 4, "eu", &["f"])) == ControlResponse::Done);
    check!(!s.is_held(&unit(0)) && !s.is_held(&unit(1)));
    check!(s.assignments_of(1).len() == 1);
    check!(s.apply(22, &grant(0, 2)) == ControlResponse::Granted { epoch: Epoch(22) });
    // Revoked everywhere: retired like any replaced identity.
    check!(s.apply(23, &revoked(1, 4)) == ControlResponse::Done);
    check!(s.stale_identities.contains(&(1, 4)));
    check!(s.revoke_pending.is_empty() && s.held_units.is_empty());
    check!(
        s.apply(24, &ControlCommand::fence_target(1, 4, "ap", &["f"]))
            == ControlResponse::Ignored(Rejection::StaleIncarnation)
    );
}

#[test]
fn an_earlier_versions_fence_acknowledgement_still_takes_all_units() {
    let mut s = setup();
    s.apply(11, &grant(1, 1));
    s.apply(12, &grant(2, 2));
    s.apply(13, &identity(1, 4));
    // A fence of another incarnation changes nothing; an acknowledgement needs a decision.
    check!(s.apply(14, &fence(1, 3)) == ControlResponse::Ignored(Rejection::StaleIncarnation));
    check!(
        s.apply(14, &acknowledged(1, 4)) == ControlResponse::Ignored(Rejection::StaleIncarnation)
    );
    check!(s.assignments_of(1).len() == 2);
    // The decision alone stops the node's writes but leaves its units where they are.
    check!(s.apply(15, &fence(1, 4)) == ControlResponse::Done);
    check!(s.writer_login(1, &test_passwords()).is_none());
    check!(s.assignments_of(1).len() == 2);
    // The member renewed after the leader decided: the fence applies anyway (the targets
    // already refuse the identity).
    s.apply(15, &ControlCommand::RenewLease { node: 1 });
    check!(s.apply(16, &acknowledged(1, 4)) == ControlResponse::Done);
    check!(s.assignments_of(1).is_empty());
    check!(s.assignments_of(2).len() == 1);
    check!(s.unowned_units() == 2);
    let r = s.apply(17, &ControlCommand::RenewLease { node: 1 });
    check!(
        r == ControlResponse::Renewed {
            revoked_since_previous: true
        }
    );
    // Idempotent.
    check!(s.apply(18, &fence(1, 4)) == ControlResponse::Done);
    check!(s.apply(18, &acknowledged(1, 4)) == ControlResponse::Done);
}

#[test]
fn a_removed_members_identity_becomes_stale() {
    let mut s = setup();
    s.apply(11, &identity(2, 1));
    check!(s.apply(12, &ControlCommand::RemoveMember { node: 2 }) == ControlResponse::Done);
    check!(!s.identities.contains_key(&2));
    check!(s.stale_identities == BTreeSet::from([(2, 1)]));
}

fn pause(paused: bool) -> ControlCommand {
    ControlCommand::SetFlowPaused {
        flow: "f".into(),
        paused,
        requested_by: "op".into(),
        at_unix_ms: 1,
    }
}

fn reset(resets: Vec<(u32, u64)>, allow_duplicates: bool) -> ControlCommand {
    ControlCommand::ResetOffsets {
        flow: "f".into(),
        resets: resets.into_iter().map(|(p, o)| (unit(p), o)).collect(),
        allow_duplicates,
        requested_by: "op".into(),
        at_unix_ms: 2,
    }
}

/// `setup()` with unit 0 confirmed at 100 and handed back, the flow paused.
fn paused_with_progress() -> ControlState {
    let mut s = setup();
    check!(commit_as(&mut s, 11, 1, commit(10, 100, 7)) == CommitOutcome::Committed);
    check!(s.apply(12, &pause(true)) == ControlResponse::Done);
    check!(s.apply(13, &release(10, 1)) == ControlResponse::Done);
    s
}

#[test]
fn offsets_are_reset_only_on_a_paused_flow_with_no_owner() {
    let mut s = setup();
    check!(
        s.apply(11, &reset(vec![(1, 5)], false))
            == ControlResponse::Ignored(Rejection::FlowRunning)
    );
    s.apply(12, &pause(true));
    // Unit 0 is still owned (its writer has not handed it back): its final commit would undo
    // the reset.
    check!(
        s.apply(13, &reset(vec![(1, 5), (0, 5)], false))
            == ControlResponse::Ignored(Rejection::StillOwned)
    );
    check!(s.pending_resets.is_empty(), "all or nothing");
    check!(
        s.apply(14, &reset(vec![(9, 5)], false))
            == ControlResponse::Ignored(Rejection::UnknownUnit)
    );
    check!(s.apply(15, &reset(vec![(1, 5)], false)) == ControlResponse::Done);
    let_assert!(Some(r) = s.pending_resets.get(&unit(1)));
    check!(
        r.reset
            == OffsetReset {
                next: 5,
                allow_duplicates: false
            }
    );
    check!(r.requested_by == "op");
    check!(r.index == 15);
    // A unit that never committed keeps no confirmed offset: the reset alone says where it
    // starts.
    check!(s.units[&unit(1)].progress.confirmed == None);
}

#[test]
fn a_reset_at_or_below_the_confirmed_offset_needs_allow_duplicates() {
    let mut s = paused_with_progress();
    check!(
        s.apply(20, &reset(vec![(0, 100)], false))
            == ControlResponse::Ignored(Rejection::WouldDuplicate)
    );
    check!(s.units[&unit(0)].progress.confirmed == Some(100));
    // Forward: skips 101..=499; the confirmed offset moves to just before the start.
    check!(s.apply(21, &reset(vec![(0, 500)], false)) == ControlResponse::Done);
    check!(s.units[&unit(0)].progress.confirmed == Some(499));
    // Back, allowed: the confirmed offset follows it down.
    check!(s.apply(22, &reset(vec![(0, 50)], true)) == ControlResponse::Done);
    check!(s.units[&unit(0)].progress.confirmed == Some(49));
    check!(
        s.pending_resets[&unit(0)].reset
            == OffsetReset {
                next: 50,
                allow_duplicates: true
            }
    );
    check!(s.apply(23, &reset(vec![(0, 0)], true)) == ControlResponse::Done);
    check!(s.units[&unit(0)].progress.confirmed == None);
}

#[test]
fn the_next_owners_first_commit_takes_the_reset_up() {
    let mut s = paused_with_progress();
    check!(s.apply(20, &reset(vec![(0, 50)], true)) == ControlResponse::Done);
    check!(s.apply(21, &pause(false)) == ControlResponse::Done);
    check!(s.apply(22, &grant(0, 2)) == ControlResponse::Granted { epoch: Epoch(22) });
    check!(
        s.pending_resets.contains_key(&unit(0)),
        "until the new owner commits"
    );
    // A stale owner's commit neither moves the offset nor takes the reset up.
    check!(matches!(
        commit_as(&mut s, 23, 1, commit(10, 120, 7)),
        CommitOutcome::Fenced { .. }
    ));
    check!(s.pending_resets.contains_key(&unit(0)));
    check!(commit_as(&mut s, 24, 2, commit(22, 60, 7)) == CommitOutcome::Committed);
    check!(s.pending_resets.is_empty());
    check!(s.units[&unit(0)].progress.confirmed == Some(60));
}

fn record_start(node: NodeId, epoch: u64, next: Offset, created: u64) -> ControlCommand {
    ControlCommand::RecordStart {
        node,
        unit: unit(0),
        epoch: Epoch(epoch),
        start: UnitStart {
            next,
            history_label: created,
        },
    }
}

#[test]
fn the_first_owners_start_stands_until_the_first_commit() {
    let mut s = setup();
    // Only the owner under its epoch records.
    check!(
        s.apply(11, &record_start(2, 10, 40, 7)) == ControlResponse::Ignored(Rejection::StaleEpoch)
    );
    check!(s.apply(12, &record_start(1, 10, 40, 7)) == ControlResponse::Done);
    // The unit moves; the next owner's `latest` is further on, but the first start stands.
    s.apply(13, &release(10, 1));
    check!(s.apply(14, &grant(0, 2)) == ControlResponse::Granted { epoch: Epoch(14) });
    check!(
        s.apply(15, &record_start(2, 14, 90, 7)) == ControlResponse::Ignored(Rejection::StartKnown)
    );
    check!(s.recorded_starts[&unit(0)].next == 40);
    // A start of another history (the topic was recreated) replaces it.
    check!(s.apply(16, &record_start(2, 14, 0, 8)) == ControlResponse::Done);
    check!(s.recorded_starts[&unit(0)].history_label == 8);
    // The first commit takes it up; then a start of that history is known from progress.
    check!(commit_as(&mut s, 17, 2, commit(14, 5, 8)) == CommitOutcome::Committed);
    check!(s.recorded_starts.is_empty());
    check!(
        s.apply(18, &record_start(2, 14, 0, 8)) == ControlResponse::Ignored(Rejection::StartKnown)
    );
}

#[test]
fn a_reset_names_its_topic_until_the_first_commit_and_an_older_reset_names_none() {
    let mut s = paused_with_progress();
    let named = ControlCommand::ResetTopicOffsets {
        flow: "f".into(),
        resets: vec![(unit(0), 500, 77)],
        allow_duplicates: false,
        requested_by: "op".into(),
        at_unix_ms: 2,
    };
    check!(s.apply(20, &named) == ControlResponse::Done);
    check!(s.pending_resets[&unit(0)].reset.next == 500);
    check!(s.reset_topics.get(&unit(0)) == Some(&77));
    // A reset of the older kind replaces it and names no topic.
    check!(s.apply(21, &reset(vec![(0, 600)], false)) == ControlResponse::Done);
    check!(s.reset_topics.is_empty());
    check!(s.apply(22, &named) == ControlResponse::Ignored(Rejection::WouldDuplicate));
    check!(s.reset_topics.is_empty(), "a refused reset records nothing");
    let again = ControlCommand::ResetTopicOffsets {
        flow: "f".into(),
        resets: vec![(unit(0), 700, 78)],
        allow_duplicates: false,
        requested_by: "op".into(),
        at_unix_ms: 3,
    };
    check!(s.apply(23, &again) == ControlResponse::Done);
    check!(s.apply(24, &pause(false)) == ControlResponse::Done);
    check!(s.apply(25, &grant(0, 2)) == ControlResponse::Granted { epoch: Epoch(25) });
    check!(commit_as(&mut s, 26, 2, commit(25, 3, 9)) == CommitOutcome::Committed);
    check!(s.pending_resets.is_empty() && s.reset_topics.is_empty());
}

/// `node` commits `offset` of unit 0 under `epoch`, with `session`'s totals of `messages`.
fn progress(epoch: u64, offset: u64, session: u64, messages: u64) -> ControlCommand {
    ControlCommand::CommitProgress {
        node: 1,
        commits: vec![replicator_model::ProgressCommit {
            unit: unit(0),
            epoch: Epoch(epoch),
            offset,
            history_label: 1,
            counters: replicator_model::CommitCounters::Totals {
                session,
                totals: UnitCounters {
                    messages,
                    ..Default::default()
                },
            },
        }],
    }
}

#[test]
fn session_totals_count_once_when_a_commit_entry_is_applied_twice_or_late() {
    let mut s = setup();
    let messages = |s: &ControlState| s.units[&unit(0)].progress.counters.messages;
    s.apply(11, &progress(10, 5, 7, 6));
    // A retried write lands the same entry again, then a late one arrives after a newer one.
    s.apply(12, &progress(10, 5, 7, 6));
    s.apply(13, &progress(10, 9, 7, 10));
    s.apply(14, &progress(10, 8, 7, 8));
    check!(messages(&s) == 10);
    check!(s.units[&unit(0)].progress.confirmed == Some(9));
    // The writer restarted under the same grant: a new session counts from zero.
    s.apply(15, &progress(10, 12, 8, 3));
    check!(messages(&s) == 13);
    // The level-1 form still adds what it carries.
    commit_as(&mut s, 16, 1, commit(10, 13, 1));
    check!(messages(&s) == 15);
}

#[test]
fn forgetting_takes_only_retired_unowned_unheld_units_and_everything_kept_about_them() {
    let mut s = setup();
    s.apply(11, &progress(10, 5, 7, 6));
    // Units 0 (owned) and 1, 2 leave discovery; 1 has a recorded start and a reset.
    s.apply(12, &report(vec![]));
    s.recorded_starts.insert(
        unit(1),
        UnitStart {
            next: 3,
            history_label: 1,
        },
    );
    s.held_units.insert(unit(2), (2, 1));
    s.apply(
        13,
        &ControlCommand::ForgetUnits {
            units: vec![unit(0), unit(1), unit(2), unit(9)],
        },
    );
    check!(
        s.units.contains_key(&unit(0)),
        "owned: its owner still commits"
    );
    check!(!s.units.contains_key(&unit(1)));
    check!(!s.recorded_starts.contains_key(&unit(1)));
    check!(s.units.contains_key(&unit(2)), "held for a revoke");
    // Released, then forgotten with its session counters.
    s.apply(14, &release(10, 1));
    s.apply(
        15,
        &ControlCommand::ForgetUnits {
            units: vec![unit(0)],
        },
    );
    check!(!s.units.contains_key(&unit(0)));
    check!(s.session_counters.is_empty());
    // Reported again, it starts like a new unit.
    s.apply(16, &report(vec![unit(0)]));
    check!(s.units[&unit(0)].progress == UnitProgress::default());
}

/// The key of topic `s/t` in the pair of `eu` and `us`.
fn metadata_key() -> MetadataKey {
    MetadataKey {
        pair: replicator_model::ClusterPair::new("us", "eu"),
        object: replicator_model::MetadataObject::Topic {
            stream: "s".into(),
            topic: "t".into(),
        },
    }
}

/// A record of an object authored on `home`, agreed on `message_expiry` = `expiry`.
fn metadata_record(home: &str, expiry: u64) -> MetadataRecord {
    MetadataRecord {
        home: home.into(),
        agreed: BTreeMap::from([("message_expiry".to_owned(), expiry)]),
    }
}

fn record_metadata(
    expected: Option<MetadataRecord>,
    record: Option<MetadataRecord>,
) -> MetadataChange {
    MetadataChange {
        key: metadata_key(),
        expected,
        record,
    }
}

fn apply_metadata(s: &mut ControlState, index: u64, changes: Vec<MetadataChange>) -> Vec<bool> {
    let_assert!(
        ControlResponse::MetadataRecorded(applied) =
            s.apply(index, &ControlCommand::RecordMetadata { changes })
    );
    applied
}

#[test]
fn a_first_metadata_record_applies_over_none() {
    let mut s = ControlState::default();
    let first = metadata_record("us", 10);
    check!(apply_metadata(&mut s, 1, vec![record_metadata(None, Some(first.clone()))]) == [true]);
    check!(s.metadata == BTreeMap::from([(metadata_key(), first.clone())]));
    // Another flow that also saw none loses.
    let other = metadata_record("eu", 10);
    check!(apply_metadata(&mut s, 2, vec![record_metadata(None, Some(other))]) == [false]);
    check!(s.metadata == BTreeMap::from([(metadata_key(), first)]));
}

#[test]
fn a_metadata_change_from_a_stale_record_is_refused_and_changes_nothing() {
    let mut s = ControlState::default();
    let (old, current) = (metadata_record("us", 10), metadata_record("us", 20));
    apply_metadata(&mut s, 1, vec![record_metadata(None, Some(old.clone()))]);
    apply_metadata(
        &mut s,
        2,
        vec![record_metadata(Some(old.clone()), Some(current.clone()))],
    );
    let before = s.clone();
    let stale = vec![
        record_metadata(Some(old.clone()), Some(metadata_record("eu", 30))),
        record_metadata(Some(old), None),
    ];
    check!(apply_metadata(&mut s, 3, stale) == [false, false]);
    check!(s == before);
    check!(s.metadata.get(&metadata_key()) == Some(&current));
}

#[test]
fn a_metadata_record_is_removed_by_a_change_without_one() {
    let mut s = ControlState::default();
    let record = metadata_record("eu", 10);
    apply_metadata(&mut s, 1, vec![record_metadata(None, Some(record.clone()))]);
    check!(apply_metadata(&mut s, 2, vec![record_metadata(Some(record.clone()), None)]) == [true]);
    check!(s.metadata.is_empty());
    // Removing what is not there any more: refused (it expected a record).
    check!(apply_metadata(&mut s, 3, vec![record_metadata(Some(record), None)]) == [false]);
    // Removing what is absent and expected absent: applies and changes nothing.
    check!(apply_metadata(&mut s, 4, vec![record_metadata(None, None)]) == [true]);
    check!(s.metadata.is_empty());
}

#[test]
fn metadata_changes_of_one_command_apply_in_order_each_seeing_the_ones_before() {
    let mut s = ControlState::default();
    let (first, second) = (metadata_record("us", 10), metadata_record("us", 20));
    // The second expects what the first writes: it applies only because the first did.
    let changes = vec![
        record_metadata(None, Some(first.clone())),
        record_metadata(Some(first.clone()), Some(second.clone())),
    ];
    check!(apply_metadata(&mut s, 1, changes.clone()) == [true, true]);
    check!(s.metadata.get(&metadata_key()) == Some(&second));
    // The same command again: the first now finds a record, and the second one that is not
    // the first's.
    check!(apply_metadata(&mut s, 2, changes) == [false, false]);
    check!(s.metadata.get(&metadata_key()) == Some(&second));
    // Records of another pair or object are independent.
    let user = MetadataKey {
        pair: metadata_key().pair,
        object: replicator_model::MetadataObject::User("u".into()),
    };
    let user_change = MetadataChange {
        key: user.clone(),
        expected: None,
        record: Some(metadata_record("eu", 0)),
    };
    let stale_topic = record_metadata(Some(first), None);
    check!(apply_metadata(&mut s, 3, vec![stale_topic, user_change]) == [false, true]);
    check!(s.metadata.len() == 2);
    check!(s.metadata.get(&user).map(|r| r.home.as_str()) == Some("eu"));
}
