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
