use std::collections::BTreeMap;
use std::time::Duration;

use replicator_model::{NodeId, WorkUnit};

use crate::util::*;

fn balanced(owners: &BTreeMap<WorkUnit, Option<NodeId>>, members: &[NodeId], total: usize) -> bool {
    let l = load(owners);
    let counts: Vec<usize> = members
        .iter()
        .map(|m| l.get(&Some(*m)).copied().unwrap_or(0))
        .collect();
    owners.len() == total
        && counts.iter().sum::<usize>() == total
        && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
}

/// Waits until the owners `via` reports spread `total` units evenly over `members`.
async fn wait_balanced(
    cluster: &TestCluster,
    what: &str,
    via: NodeId,
    members: &[NodeId],
    total: usize,
) -> TestResult {
    cluster
        .wait_owners(what, via, |owners| balanced(owners, members, total))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignment_is_complete_after_lease_expiry_and_sticky_on_rejoin() -> TestResult {
    let (mut cluster, leader) = TestCluster::start_with_units(3, 10).await?;
    wait_balanced(&cluster, "10 units over 3 members", leader, &[1, 2, 3], 10).await?;
    let follower = follower_of(leader);
    let rest: Vec<NodeId> = (1..=3).filter(|id| *id != follower).collect();
    cluster.crash(follower).await;
    wait_balanced(
        &cluster,
        "all units on the 2 live members",
        leader,
        &rest,
        10,
    )
    .await?;
    let before = cluster.owners(leader).await?;

    cluster.restart(follower).await?;
    wait_balanced(
        &cluster,
        "rebalanced over 3 members",
        leader,
        &[1, 2, 3],
        10,
    )
    .await?;
    let after = cluster.owners(leader).await?;
    // Sticky: only the units the rejoined member took moved.
    let moved = before.iter().filter(|(u, o)| after[*u] != **o).count();
    let taken = after.values().filter(|o| **o == Some(follower)).count();
    assert2::check!(moved == taken);
    assert2::check!(taken == 3);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_as_voters_and_leave_with_their_units_drained() -> TestResult {
    let (mut cluster, leader) = TestCluster::start_with_units(3, 8).await?;
    wait_balanced(&cluster, "8 units over 3", leader, &[1, 2, 3], 8).await?;

    // Join: node 4 starts knowing the cluster, then is added from a follower.
    cluster.start_extra(4).await?;
    let follower = follower_of(leader);
    let addr = cluster.addrs[&4].to_string();
    cluster
        .node(follower)
        .add_member(4, addr, "127.0.0.1:9004".into())
        .await?;
    wait_until_async(
        "node 4 is a voter with its share",
        Duration::from_secs(10),
        || async {
            let Ok(status) = cluster.node(leader).status().await else {
                return false;
            };
            let four = status.members.iter().find(|m| m.id == 4);
            four.is_some_and(|m| m.voter && m.api_addr == "127.0.0.1:9004" && m.units_owned == 2)
                && balanced(
                    &status
                        .units
                        .iter()
                        .map(|u| (u.unit.clone(), u.owner))
                        .collect(),
                    &[1, 2, 3, 4],
                    8,
                )
        },
    )
    .await?;

    // Remove: node 4's units are released (its releaser plays the pipeline), then it goes.
    cluster.node(leader).remove_member(4).await?;
    let status = cluster.node(leader).status().await?;
    assert!(status.members.iter().all(|m| m.id != 4), "{status:?}");
    wait_balanced(&cluster, "8 units back over 3", leader, &[1, 2, 3], 8).await?;

    // Leave: a member hands everything back and gets nothing new.
    let leaver = follower_of(leader);
    let stay: Vec<NodeId> = (1..=3).filter(|id| *id != leaver).collect();
    cluster.node(leaver).leave().await?;
    wait_balanced(&cluster, "leaver's units moved", leader, &stay, 8).await?;
    assert!(cluster.node(leaver).assignments().borrow().is_empty());
    cluster.shutdown().await;
    Ok(())
}

/// A graceful stop: the node marks itself leaving (`begin_leaving`), then its drain releases
/// every unit it owns, one after another as its writers finish. The leader must not grant any
/// of them back to it while it drains (it did: a released unit went back to the draining node,
/// which then left it owned by nobody running until a fence or its lease). After a restart on
/// its data dir the node registers anew and gets its share again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_member_gets_nothing_back_and_works_again_after_its_restart() -> TestResult {
    let (mut cluster, leader) = TestCluster::start_with_units(3, 9).await?;
    wait_balanced(&cluster, "9 units over 3 members", leader, &[1, 2, 3], 9).await?;
    let drainer = follower_of(leader);
    let stay: Vec<NodeId> = (1..=3).filter(|id| *id != drainer).collect();
    let node = cluster.node(drainer).clone();
    // The drainer's own state at level 2, the first that marks drains (`counts_totals`
    // reads the same level).
    wait_until(
        "the drainer at feature level 2",
        Duration::from_secs(10),
        || node.counts_totals(),
    )
    .await?;
    node.begin_drain();
    assert!(
        node.begin_leaving().await?,
        "the leave mark was not written"
    );
    // Every unit granted to the drainer from here on is a failure. Its drain releases what
    // it owns one unit at a time, each once the previous one has an owner again (the
    // leader's round that could have granted it back has run).
    let mut regranted = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        let owned = node.assignments().borrow().clone();
        let Some(next) = owned.first() else { break };
        node.release(next.unit.clone(), next.epoch).await?;
        cluster
            .wait_owners("the released unit owned again", leader, |owners| {
                owners.get(&next.unit).copied().flatten().is_some()
            })
            .await?;
        let owners = cluster.owners(leader).await?;
        if owners.get(&next.unit).copied().flatten() == Some(drainer) {
            regranted.push(next.unit.clone());
            if regranted.len() == 3 {
                break;
            }
        }
    }
    assert!(
        regranted.is_empty(),
        "granted to the draining node: {regranted:?}"
    );
    // The node's handles go with it: its next process opens the same data dir.
    drop(node);
    wait_balanced(&cluster, "the drainer's units moved", leader, &stay, 9).await?;

    cluster.stop(drainer).await;
    cluster.restart(drainer).await?;
    wait_balanced(
        &cluster,
        "the restarted node has its share",
        leader,
        &[1, 2, 3],
        9,
    )
    .await?;
    cluster.shutdown().await;
    Ok(())
}

/// A leader's graceful stop hands its leadership to a follower
/// (`Control::hand_over_leadership`), so that the cluster leads again within a few round trips
/// instead of once its followers' election timers run out. The old leader keeps running, and
/// heartbeating, until the end here: without the handover nobody else would lead at all. The
/// handover first waits out the leader's own lease (`election_timeout_max` after its election,
/// 3 s here), during which a leader refuses every vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_its_leadership_to_a_follower() -> TestResult {
    let timing = replicator_control::ControlTiming {
        election_timeout_min: Duration::from_secs(2),
        election_timeout_max: Duration::from_secs(3),
        ..fast_timing()
    };
    let mut cluster = TestCluster::start(3, timing).await?;
    let old = cluster.wait_leader(Duration::from_secs(20)).await?;
    cluster.report_units(old, 6).await?;
    wait_balanced(&cluster, "6 units over 3 members", old, &[1, 2, 3], 6).await?;

    let new = cluster
        .node(old)
        .hand_over_leadership()
        .await
        .ok_or("the leadership was not handed over")?;
    assert_ne!(new, old, "handed to itself");
    assert_eq!(cluster.wait_leader(Duration::from_secs(10)).await?, new);
    // Writes through the old leader reach the new one, which assigns what they report.
    cluster.report_units(old, 9).await?;
    wait_balanced(&cluster, "9 units over 3 members", new, &[1, 2, 3], 9).await?;

    // The two left keep their leader: nothing to elect when the old one stops.
    cluster.stop(old).await;
    let left: Vec<NodeId> = (1..=3).filter(|id| *id != old).collect();
    assert_eq!(
        cluster
            .wait_leader_among(&left, Duration::from_secs(10))
            .await?,
        new
    );
    cluster.shutdown().await;
    Ok(())
}
