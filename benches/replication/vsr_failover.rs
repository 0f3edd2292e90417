//! Failover of the target's primary: the target is an in-process three-replica Iggy 0.9 cluster
//! (`TestCluster`) named by every replica's address; three instances copy a 16-partition topic
//! into it while a producer writes; its primary is killed (a view change: the next replica
//! becomes primary at once), repeatedly. Measured: the time from the kill until the target's
//! copy advances again, on its first partition and on every partition. The killed replica is
//! restarted (a backup) before the next round. At the end the copy must be exact.

use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, delete_stream, ensure_topic, tick, wait_resumed, ClusterTopic, Deadline, Endpoint,
    ReplicatorCluster, Stalled, TestResult, Topic,
};
use replicator_model::IggyVersion;
use replicator_testkit::{TestCluster, TestServerConfig};

use crate::env::{replication_spec_between, run_name, wait_balanced, Endpoints};
use crate::load::paced;
use crate::report::{percentile_of_sorted, secs};
use crate::settings::Settings;

/// Kills of the target's primary.
const KILLS: u32 = 10;
/// Partitions of the produced topic.
const PARTITIONS: u32 = 16;
/// Topic name.
const TOPIC: &str = "t";
/// How long a kill may take to be got over before the run fails at it.
const WITHIN: Duration = Duration::from_secs(60);

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    let stream = run_name("vsr-failover");
    println!(
        "## Failover of the target's primary: {KILLS} × kill of the primary of an in-process three-replica Iggy 0.9 cluster (`TestCluster`, view change at once), three instances, {} msg/s produced, target fencing {}, defaults otherwise\n",
        settings.failover_rate, settings.fencing
    );
    let target = TestCluster::start(
        TestServerConfig {
            iggy_version: IggyVersion::V0_9,
            ..TestServerConfig::default()
        },
        3,
    )
    .await?;
    let outcome = measure(endpoints, settings, &stream, target).await;
    let cleanup = delete_stream(&endpoints.upstream, &stream).await;
    outcome?;
    cleanup?;
    Ok(())
}

async fn measure(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    mut target: TestCluster,
) -> TestResult {
    let up = connect(&endpoints.upstream).await?;
    ensure_topic(&up, stream, TOPIC, PARTITIONS).await?;
    up.shutdown().await?;
    let target_endpoint = Endpoint::new(IggyVersion::V0_9, target.connection_string());
    let spec = replication_spec_between(
        endpoints,
        (&endpoints.upstream, &target_endpoint),
        "up",
        &format!("{stream}/*"),
        false,
        settings,
        PARTITIONS as usize,
    );
    let mut cluster = ReplicatorCluster::start(spec, 3).await?;
    wait_balanced(&cluster, Duration::from_secs(120)).await?;
    let topic = Topic::new(stream, TOPIC, PARTITIONS);
    let producer = paced(&endpoints.upstream, topic.targets(), settings.failover_rate);
    let deadline = Deadline::new(WITHIN, "every partition copied to the target cluster");
    while topic.counts_on_cluster(&target).contains(&0) {
        deadline.check()?;
        tick().await;
    }

    println!("| round | killed replica | view after | first partition again (s) | every partition again (s) |");
    println!("|---|---|---|---|---|");
    let (mut firsts, mut alls) = (Vec::new(), Vec::new());
    for round in 1..=KILLS {
        let primary = target.primary().ok_or("the target has no primary")?;
        target.kill(primary).await;
        // The replica's connections are closed and its tasks ended: every partition that grows
        // from here was written through the new primary.
        let stalled = Stalled::every_partition(topic.counts_on_cluster(&target));
        let downstream = ClusterTopic {
            cluster: &target,
            topic: &topic,
        };
        let resumed = wait_resumed(&downstream, &stalled, WITHIN).await?;
        println!(
            "| {round} | {primary} | {} | {} | {} |",
            target.view(),
            secs(resumed.first),
            secs(resumed.all)
        );
        firsts.push(resumed.first.as_secs_f64());
        alls.push(resumed.all.as_secs_f64());
        target.restart(primary).await?;
    }

    let produced = producer.stop().await?.produced;
    let started = Instant::now();
    let deadline = Deadline::new(Duration::from_secs(120), "the target to hold every message");
    loop {
        let total: u64 = topic.counts_on_cluster(&target).iter().sum();
        if total >= produced {
            break;
        }
        deadline.check_seeing(|| format!("{total} of {produced}"))?;
        tick().await;
    }
    let caught_up = started.elapsed();
    let exact = cluster.verify(Duration::from_secs(60)).await?;
    let stats = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        format!(
            "p50 {:.2} s, max {:.2} s",
            percentile_of_sorted(values, 50.0),
            values.last().copied().unwrap_or_default()
        )
    };
    println!(
        "\nfirst partition written again: {}; every partition written again: {}; {produced} messages produced, caught up {} s after the producer stopped; verify: {}\n",
        stats(&mut firsts),
        stats(&mut alls),
        secs(caught_up),
        if exact { "exact (no loss, no duplicates)" } else { "NOT EXACT" }
    );
    if !exact {
        return Err("verify found the copy not exact after the target's failovers".into());
    }
    cluster.passed();
    drop(cluster);
    target.shutdown().await;
    Ok(())
}
