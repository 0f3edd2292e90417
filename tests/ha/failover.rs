//! `kill -9` of a follower, then of the Raft leader, while a producer writes: the killed
//! node's partitions resume on the others, the killed node rejoins after a restart and
//! takes work again, and the copy is exact.

use std::time::{Duration, Instant};

use crate::harness::{serial, wait_resumed, Cluster, NodeId, Producer, Servers, TestResult};

/// Kills `victim`, measures until its partitions are written again, restarts it and waits
/// until it owns units again. Returns the time until every partition moved again.
async fn kill_and_rejoin(
    servers: &Servers,
    cluster: &mut Cluster,
    victim: NodeId,
    role: &str,
) -> TestResult<Duration> {
    let before = cluster
        .leader_status()
        .await
        .ok_or("no leader before the kill")?;
    let owned = before.owned_by(victim);
    assert!(!owned.is_empty(), "node {victim} owns nothing: {before:?}");
    cluster.kill(victim)?;
    let killed_at = Instant::now();
    // Sends the victim had on the wire when it died may still land; start counting after them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let baseline = servers.downstream_counts();
    let resumed = wait_resumed(
        servers,
        &owned,
        &baseline,
        killed_at,
        Duration::from_secs(30),
    )
    .await?;
    println!(
        "failover ({role} node {victim} killed, {} partitions): first partition written again after {:.2} s, all after {:.2} s",
        owned.len(),
        resumed.first.as_secs_f64(),
        resumed.all.as_secs_f64()
    );
    let survivors: Vec<NodeId> = cluster.running();
    let after = cluster
        .wait_all_owned(&survivors, Duration::from_secs(30))
        .await?;
    assert!(
        after.owned_by(victim).is_empty(),
        "node {victim} still owns units after its kill"
    );

    cluster.restart(victim)?;
    let restarted_at = Instant::now();
    let mut everyone = survivors;
    everyone.push(victim);
    everyone.sort_unstable();
    let rejoined = cluster
        .wait_all_owned(&everyone, Duration::from_secs(60))
        .await?;
    println!(
        "node {victim} restarted: owns {} partitions again after {:.2} s",
        rejoined.units_owned(victim),
        restarted_at.elapsed().as_secs_f64()
    );
    Ok(resumed.all)
}

#[test]
fn killed_follower_and_leader_partitions_resume_on_the_others_exactly_once() -> TestResult {
    serial(|| async {
        let servers = Servers::start().await?;
        let mut cluster = Cluster::start(&servers, 3).await?;
        let producer = Producer::start(servers.upstream.connection_string(), 1600);
        // The copy is running on every partition before the first fault.
        servers.wait_copy_started().await?;

        let status = cluster.leader_status().await.ok_or("no leader")?;
        let leader = status.leader.ok_or("no leader")?;
        let follower = cluster
            .running()
            .into_iter()
            .find(|id| *id != leader && !status.owned_by(*id).is_empty())
            .ok_or("no follower owns units")?;
        let follower_time = kill_and_rejoin(&servers, &mut cluster, follower, "follower").await?;

        let status = cluster.leader_status().await.ok_or("no leader")?;
        let leader = status.leader.ok_or("no leader")?;
        let leader_time = kill_and_rejoin(&servers, &mut cluster, leader, "leader").await?;

        let report = producer.stop().await?;
        let caught_up = servers.wait_caught_up(Duration::from_secs(60)).await?;
        println!(
            "produced {} messages ({} failed sends); caught up {:.2} s after the producer stopped",
            report.produced,
            report.failed_sends,
            caught_up.as_secs_f64()
        );
        println!(
            "failover times: follower {:.2} s, leader {:.2} s",
            follower_time.as_secs_f64(),
            leader_time.as_secs_f64()
        );
        assert!(
            cluster.verify(Duration::from_secs(30)).await?,
            "verify: not exact"
        );
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}
