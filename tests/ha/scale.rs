//! Scale out and in while a producer writes: a fourth node joins and takes a fair share with
//! minimal movement, `DELETE /cluster/members/{id}` drains a node gracefully, and a two-node
//! cluster that loses a node stops writing (no quorum) and resumes without loss when it
//! returns. The copy is exact at the end.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_harness::{
    serial, wait_resumed, NodeId, Placement, ReplicatorCluster, Stalled, Status, TestResult, Topic,
};

use crate::fixture::{self, assert_nothing_copied, finish_with_exact_copy};

/// Partitions whose owner differs between two owner maps, with the new owner.
fn moved(
    before: &BTreeMap<u32, Option<NodeId>>,
    after: &BTreeMap<u32, Option<NodeId>>,
) -> BTreeMap<u32, Option<NodeId>> {
    after
        .iter()
        .filter(|(p, owner)| before.get(p) != Some(owner))
        .map(|(p, owner)| (*p, *owner))
        .collect()
}

fn shares(status: &Status, topic: &Topic, nodes: &[NodeId]) -> Vec<(NodeId, usize)> {
    nodes
        .iter()
        .map(|n| (*n, status.owned_by(topic, *n).len()))
        .collect()
}

/// Waits (at most 60 s) until `nodes` share `topic` evenly after `change`, begun at `since`;
/// prints how long that took, the shares and what moved since `before`. Returns the balanced
/// status and the partitions that moved, with their new owners.
async fn rebalanced(
    cluster: &ReplicatorCluster,
    topic: &Topic,
    before: &Status,
    nodes: &[NodeId],
    change: &str,
    since: Instant,
) -> TestResult<(Status, BTreeMap<u32, Option<NodeId>>)> {
    let after = cluster
        .wait_balanced(nodes, Duration::from_secs(60))
        .await?;
    let movement = moved(&before.owners(topic), &after.owners(topic));
    println!(
        "{change}: balanced after {:.2} s, shares {:?}, moved {movement:?}",
        since.elapsed().as_secs_f64(),
        shares(&after, topic, nodes)
    );
    Ok((after, movement))
}

#[test]
fn fourth_node_joins_nodes_drain_out_and_a_two_node_cluster_waits_for_quorum() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        let topic = &servers.topic;

        // Scale out.
        let three = [1, 2, 3];
        let before = cluster
            .wait_balanced(&three, Duration::from_secs(30))
            .await?;
        cluster.add_node_process(4, Placement::loopback()?)?;
        let joining = Instant::now();
        cluster.add_member(4).await?;
        let four = [1, 2, 3, 4];
        let (after, movement) =
            rebalanced(&cluster, topic, &before, &four, "node 4 joined", joining).await?;
        assert!(
            movement.values().all(|owner| *owner == Some(4)),
            "units moved between the old nodes: {movement:?}"
        );
        assert_eq!(
            movement.len(),
            topic.partitions as usize / 4,
            "not a minimal movement: {movement:?}"
        );

        // Scale in: drain node 2.
        let removing = Instant::now();
        cluster.remove_member(2).await?;
        let rest = [1, 3, 4];
        let (drained, movement) =
            rebalanced(&cluster, topic, &after, &rest, "node 2 removed", removing).await?;
        assert!(
            !drained.member_ids().contains(&2),
            "node 2 still a member: {:?}",
            drained.member_ids()
        );
        let from_node_2 = after.owned_by(topic, 2);
        assert!(
            movement.keys().all(|p| from_node_2.contains(p)),
            "units of the remaining nodes moved: {movement:?} (node 2 had {from_node_2:?})"
        );
        let codes = cluster.terminate(&[2], Duration::from_secs(40)).await?;
        println!("removed node 2 stopped: {codes:?}");

        // Down to two nodes, then lose one of them.
        cluster.remove_member(3).await?;
        let two = [1, 4];
        cluster.wait_balanced(&two, Duration::from_secs(60)).await?;
        cluster.terminate(&[3], Duration::from_secs(40)).await?;
        let status = cluster.leader_status().await.ok_or("no leader")?;
        println!(
            "two-node cluster: members {:?}\n{}",
            status.member_ids(),
            cluster.cluster_status_text(1).await?
        );

        cluster.kill(4)?;
        // The survivor's lease cannot be renewed without a quorum: it stops within the lease.
        tokio::time::sleep(cluster.timing().lease_expiry + Duration::from_secs(1)).await;
        let stalled = assert_nothing_copied(
            &servers,
            Duration::from_secs(3),
            "node 1 kept writing without a quorum",
        )
        .await;
        println!("without quorum: nothing written for 3 s");

        cluster.restart(4)?;
        let stalled = Stalled::every_partition(stalled);
        let resumed = wait_resumed(&servers, &stalled, Duration::from_secs(60)).await?;
        println!(
            "quorum back: every partition written again {:.2} s after node 4 restarted",
            resumed.all.as_secs_f64()
        );

        finish_with_exact_copy(producer, servers, cluster).await
    })
}
