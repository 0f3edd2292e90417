//! Consumer-group translation through what a target goes through in production, with three
//! node processes: a restart of the target in the middle of the copy (the writers' sends fail,
//! their outcome unknown) and a batch that lands late at the end of a partition (what a send
//! whose outcome was unknown does with fencing off). Whatever happened, the offset the sync
//! stores on the target is the copy of the group's upstream offset, never a later message, and
//! `flow promote` afterwards leaves every partition at the next message.

use std::time::{Duration, Instant};

use replicator_harness::{
    append_again, connect, ensure_topic, group_next_message, message_id_at, partition_counts,
    serial, store_group_offsets, translated_exactly, wait_until, Client, DevServer, Placement,
    ProducerReport, ReplicatorBinary, ReplicatorCluster, TestResult,
};
use replicator_testkit::{IggyVersion, TestServer, TestServerConfig};

use crate::fixture;

const GROUP: &str = "billing";

/// The flow's group sync: the group `billing`, every second.
const SYNC: &str = "consumer_groups = [\"billing\"]\nconsumer_group_sync_interval = \"1s\"\n";

/// How long a translation may take to become exact. Generous (thirty sync intervals), so that
/// a busy machine does not fail the test; a translation that drifted never becomes exact.
const EXACT_WITHIN: Duration = Duration::from_secs(30);

/// The group consumed everything upstream but the last `back` messages of every partition;
/// returns what it stored (partition, last processed offset).
async fn consume_upstream(up: &Client, back: u64) -> TestResult<Vec<(u32, u64)>> {
    let topic = fixture::topic();
    let consumed: Vec<(u32, u64)> = counts(up)
        .await?
        .iter()
        .zip(0..)
        .map(|(&n, p)| (p, n.saturating_sub(back)))
        .collect();
    store_group_offsets(up, (&topic.stream, &topic.name), GROUP, &consumed).await?;
    Ok(consumed)
}

/// The end of a target-fault scenario, the producer stopped and the copy caught up: the group
/// moves on upstream, is translated exactly on the target (the time is printed), and `flow
/// promote` leaves every partition at the next message.
async fn moves_on_then_promote(
    cluster: &ReplicatorCluster,
    (up, down): (&Client, &Client),
    report: &ProducerReport,
    what: &str,
) -> TestResult {
    let consumed = consume_upstream(up, 10).await?;
    let took = wait_translated((up, down), &consumed, what).await?;
    println!(
        "produced {} ({} failed sends); the group translated exactly {:.2} s after it moved on upstream",
        report.produced,
        report.failed_sends,
        took.as_secs_f64()
    );
    promote_continues_at_next(cluster, (up, down), &consumed).await
}

/// Messages per partition of the scenarios' topic on the server `client` is connected to.
async fn counts(client: &Client) -> replicator_harness::Result<Vec<u64>> {
    let topic = fixture::topic();
    partition_counts(client, &topic.stream, &topic.name).await
}

/// Waits until the group on the target holds the copy of `consumed` on every partition;
/// returns how long that took.
async fn wait_translated(
    (up, down): (&Client, &Client),
    consumed: &[(u32, u64)],
    what: &str,
) -> TestResult<Duration> {
    let started = Instant::now();
    let topic = &fixture::topic();
    for &(partition, offset) in consumed {
        let what = format!("{what}: {GROUP} on partition {partition} at {offset}");
        wait_until(&what, EXACT_WITHIN, || async {
            translated_exactly(
                (up, down),
                (&topic.stream, &topic.name),
                GROUP,
                partition,
                offset,
            )
            .await
            .unwrap_or(false)
        })
        .await?;
    }
    Ok(started.elapsed())
}

/// `flow promote`, then every partition continues on the target at the message after
/// `consumed`.
async fn promote_continues_at_next(
    cluster: &ReplicatorCluster,
    (up, down): (&Client, &Client),
    consumed: &[(u32, u64)],
) -> TestResult {
    let run = cluster
        .flow_once(&["promote", "up-to-down", "--timeout", "60s"])
        .await?;
    println!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "promote: {}", run.stderr);
    let topic = &fixture::topic();
    let ids = (topic.stream.as_str(), topic.name.as_str());
    for &(partition, offset) in consumed {
        let next = group_next_message(down, ids, GROUP, partition).await?;
        let want = message_id_at(up, ids, partition, offset + 1).await?;
        assert_eq!(
            next.map(|m| m.id),
            Some(want),
            "partition {partition} continues at the message after {offset}"
        );
    }
    Ok(())
}

#[test]
fn a_group_is_translated_exactly_after_the_target_restarts() -> TestResult {
    serial(|| async {
        let (servers, cluster, producer) = fixture::start_flow(3, SYNC).await?;
        let up = connect(&servers.upstream.connection_string()).await?;
        let down = connect(&servers.downstream.connection_string()).await?;

        let consumed = consume_upstream(&up, 1).await?;
        wait_translated((&up, &down), &consumed, "before the restart").await?;

        // The target goes away for 3 s under load (every connection closed, new ones refused)
        // and comes back with its data: the writers' sends in that time fail, their outcome
        // unknown to the writer.
        let faults = servers.downstream.faults();
        faults.refuse_connections(true);
        faults.drop_connections();
        tokio::time::sleep(Duration::from_secs(3)).await;
        faults.refuse_connections(false);
        let after_outage = servers.upstream_counts();
        wait_until(
            "the copy to go on after the restart",
            Duration::from_secs(60),
            || {
                let down = servers.downstream_counts();
                std::future::ready(down.iter().zip(&after_outage).all(|(d, u)| d > u))
            },
        )
        .await?;

        let report = producer.stop().await?;
        servers.wait_caught_up(Duration::from_secs(60)).await?;
        moves_on_then_promote(&cluster, (&up, &down), &report, "after the restart").await?;
        fixture::finish_exact(servers, cluster).await
    })
}

#[test]
fn a_late_batch_at_the_end_of_a_partition_never_moves_a_group_past_unread_copies() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start_flow(3, SYNC).await?;
        let up = connect(&servers.upstream.connection_string()).await?;
        let down = connect(&servers.downstream.connection_string()).await?;
        wait_until(
            "100 messages on every partition",
            Duration::from_secs(60),
            || std::future::ready(servers.upstream_counts().iter().all(|&n| n >= 100)),
        )
        .await?;
        producer.stop().await?;
        servers.wait_caught_up(Duration::from_secs(60)).await?;

        // Copies 10..20 of every partition land once more at its end, after the newer copies.
        let topic = &servers.topic;
        for partition in 0..topic.partitions {
            append_again(&down, (&topic.stream, &topic.name), partition, 10, 10).await?;
        }
        // Every node starts again: no writer remembers what it sent, so the sync finds the
        // copies in the downstream partitions.
        for node in cluster.running() {
            cluster.kill(node)?;
        }
        for node in 1..=3 {
            cluster.restart(node)?;
        }
        cluster
            .wait_all_owned(&[1, 2, 3], Duration::from_secs(60))
            .await?;

        // The group read past the copies that landed late.
        let consumed = consume_upstream(&up, 5).await?;
        wait_translated((&up, &down), &consumed, "after a late batch").await?;
        let at_end: Vec<(u32, u64)> = consume_upstream(&up, 1).await?;
        wait_translated((&up, &down), &at_end, "the group at the end").await?;
        let copies = servers.downstream_counts();
        assert!(
            copies
                .iter()
                .zip(servers.upstream_counts())
                .all(|(&d, u)| d == u + 10),
            "every partition holds its 10 late copies: {copies:?}"
        );
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}

#[test]
fn a_group_is_translated_exactly_after_the_target_is_killed_and_started_again() -> TestResult {
    serial(|| async {
        // The source in process; the target a dev-server process over a data directory, so
        // that it can be killed (-9) and started again over its data.
        let topic = fixture::topic();
        let upstream = TestServer::start(TestServerConfig::default()).await?;
        let up = connect(&upstream.connection_string()).await?;
        ensure_topic(&up, &topic.stream, &topic.name, topic.partitions).await?;
        let binary = ReplicatorBinary::new(env!("CARGO_BIN_EXE_iggy-replicator"))?;
        let data = tempfile::tempdir()?;
        let mut target =
            DevServer::start_persistent(&binary, IggyVersion::V0_8, data.path()).await?;
        let down = connect(target.url()).await?;
        let urls = (upstream.connection_string(), target.url().to_owned());
        let spec = fixture::spec_between((&urls.0, &urls.1), false, None, SYNC)?;
        let placements = (1..=3)
            .map(|id| Ok((id, Placement::loopback()?)))
            .collect::<TestResult<_>>()?;
        let mut cluster = ReplicatorCluster::launch(spec, placements).await?;
        let producer = fixture::produce_into(&urls.0);
        wait_until(
            "every partition copied",
            Duration::from_secs(60),
            || async {
                counts(&down)
                    .await
                    .is_ok_and(|c| c.len() == topic.partitions as usize && !c.contains(&0))
            },
        )
        .await?;
        let consumed = consume_upstream(&up, 1).await?;
        wait_translated((&up, &down), &consumed, "before the kill").await?;

        target.kill_and_restart().await?;
        let after_kill = counts(&up).await?;
        wait_until(
            "the copy to go on after the kill",
            Duration::from_secs(60),
            || async {
                counts(&down)
                    .await
                    .is_ok_and(|c| c.iter().zip(&after_kill).all(|(d, u)| d > u))
            },
        )
        .await?;
        let report = producer.stop().await?;
        wait_until("the copy to catch up", Duration::from_secs(60), || async {
            match (counts(&up).await, counts(&down).await) {
                (Ok(u), Ok(d)) => u == d,
                _ => false,
            }
        })
        .await?;
        moves_on_then_promote(&cluster, (&up, &down), &report, "after the kill").await?;
        assert!(
            cluster.verify(Duration::from_secs(30)).await?,
            "verify: not exact"
        );
        cluster.passed();
        drop(cluster);
        upstream.shutdown().await;
        Ok(())
    })
}
