//! `kill -9` of a follower, then of the Raft leader, while a producer writes: the killed
//! node's partitions resume on the others, the killed node rejoins after a restart and
//! takes work again, and the copy is exact.

use std::time::{Duration, Instant};

use replicator_harness::{serial, NodeId, ReplicatorCluster, Servers, TestResult};

use crate::fixture::{self, finish_with_exact_copy};

/// Kills `victim`, measures until its partitions are written again, restarts it and waits
/// until it owns units again. Returns the time until every partition moved again. `role`
/// names the victim in the printed figures.
async fn kill_and_rejoin(
    servers: &Servers,
    cluster: &mut ReplicatorCluster,
    victim: NodeId,
    role: &str,
) -> TestResult<Duration> {
    let killed = cluster
        .kill_and_wait_resumed(victim, &servers.topic, servers)
        .await?;
    assert!(
        !killed.owned.is_empty(),
        "node {victim} owned nothing: {:?}",
        killed.before
    );
    println!(
        "failover ({role} node {victim} killed, {} partitions): first partition written again after {:.2} s, all after {:.2} s",
        killed.owned.len(),
        killed.resumed.first.as_secs_f64(),
        killed.resumed.all.as_secs_f64()
    );
    let survivors: Vec<NodeId> = cluster.running();
    let after = cluster
        .wait_all_owned(&survivors, Duration::from_secs(60))
        .await?;
    assert!(
        after.owned_by(&servers.topic, victim).is_empty(),
        "node {victim} still owns units after its kill"
    );

    cluster.restart(victim)?;
    let restarted_at = Instant::now();
    let mut everyone = survivors;
    everyone.push(victim);
    everyone.sort_unstable();
    let rejoined = cluster
        .wait_all_owned(&everyone, Duration::from_secs(120))
        .await?;
    println!(
        "node {victim} restarted: owns {} partitions again after {:.2} s",
        rejoined.units_owned(victim),
        restarted_at.elapsed().as_secs_f64()
    );
    Ok(killed.resumed.all)
}

/// Kills and restarts a follower that owns partitions, then the leader ([`kill_and_rejoin`]);
/// `placement` follows the role in the printed figures. Returns both failover times.
pub(crate) async fn kill_a_follower_then_the_leader(
    servers: &Servers,
    cluster: &mut ReplicatorCluster,
    placement: &str,
) -> TestResult<(Duration, Duration)> {
    let status = cluster.leader_status().await.ok_or("no leader")?;
    let leader = status.leader.ok_or("no leader")?;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader && !status.owned_by(&servers.topic, *id).is_empty())
        .ok_or("no follower owns units")?;
    let role = format!("follower{placement}");
    let follower_time = kill_and_rejoin(servers, cluster, follower, &role).await?;

    let status = cluster.leader_status().await.ok_or("no leader")?;
    let leader = status.leader.ok_or("no leader")?;
    let role = format!("leader{placement}");
    let leader_time = kill_and_rejoin(servers, cluster, leader, &role).await?;
    Ok((follower_time, leader_time))
}

#[test]
fn killed_follower_and_leader_partitions_resume_on_the_others_exactly_once() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;

        let (follower_time, leader_time) =
            kill_a_follower_then_the_leader(&servers, &mut cluster, "").await?;

        println!(
            "failover times: follower {:.2} s, leader {:.2} s",
            follower_time.as_secs_f64(),
            leader_time.as_secs_f64()
        );
        finish_with_exact_copy(producer, servers, cluster).await
    })
}
