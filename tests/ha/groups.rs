//! Consumer-group translation through what a target goes through in production, with three
//! node processes: a restart of the target in the middle of the copy (the writers' sends fail,
//! their outcome unknown) and a batch that lands late at the end of a partition (what a send
//! whose outcome was unknown does with fencing off). Whatever happened, the offset the sync
//! stores on the target is the copy of the group's upstream offset, never a later message, and
//! `flow promote` afterwards leaves every partition at the next message.

use std::time::{Duration, Instant};

use replicator_harness::{
    append_again, connect, group_next_message, message_id_at, serial, store_group_offsets,
    translated_exactly, wait_until, Client, Cluster, Servers, TestResult,
};

use crate::fixture;

const GROUP: &str = "billing";

/// The flow's group sync: the group `billing`, every second.
const SYNC: &str = "consumer_groups = [\"billing\"]\nconsumer_group_sync_interval = \"1s\"\n";

/// How long a translation may take to become exact. Generous (thirty sync intervals), so that
/// a busy machine does not fail the test; a translation that drifted never becomes exact.
const EXACT_WITHIN: Duration = Duration::from_secs(30);

/// The group consumed everything upstream but the last `back` messages of every partition;
/// returns what it stored (partition, last processed offset).
async fn consume_upstream(
    servers: &Servers,
    up: &Client,
    back: u64,
) -> TestResult<Vec<(u32, u64)>> {
    let topic = &servers.topic;
    let consumed: Vec<(u32, u64)> = servers
        .upstream_counts()
        .iter()
        .zip(0..)
        .map(|(&n, p)| (p, n.saturating_sub(back)))
        .collect();
    store_group_offsets(up, (&topic.stream, &topic.name), GROUP, &consumed).await?;
    Ok(consumed)
}

/// Waits until the group on the target holds the copy of `consumed` on every partition;
/// returns how long that took.
async fn wait_translated(
    servers: &Servers,
    (up, down): (&Client, &Client),
    consumed: &[(u32, u64)],
    what: &str,
) -> TestResult<Duration> {
    let started = Instant::now();
    let topic = &servers.topic;
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
    servers: &Servers,
    cluster: &Cluster,
    (up, down): (&Client, &Client),
    consumed: &[(u32, u64)],
) -> TestResult {
    let run = cluster
        .flow_once(&["promote", "up-to-down", "--timeout", "60s"])
        .await?;
    println!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "promote: {}", run.stderr);
    let topic = &servers.topic;
    let ids = (topic.stream.as_str(), topic.name.as_str());
    for &(partition, offset) in consumed {
        let next = group_next_message(down, ids, GROUP, partition).await?;
        let want = message_id_at(up, ids, partition, offset + 1).await?;
        assert_eq!(
            next.map(|m| m.header.id),
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

        let consumed = consume_upstream(&servers, &up, 1).await?;
        wait_translated(&servers, (&up, &down), &consumed, "before the restart").await?;

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
        let consumed = consume_upstream(&servers, &up, 10).await?;
        let took = wait_translated(&servers, (&up, &down), &consumed, "after the restart").await?;
        println!(
            "produced {} ({} failed sends); the group translated exactly {:.2} s after it moved on upstream",
            report.produced,
            report.failed_sends,
            took.as_secs_f64()
        );
        promote_continues_at_next(&servers, &cluster, (&up, &down), &consumed).await?;
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
        let consumed = consume_upstream(&servers, &up, 5).await?;
        wait_translated(&servers, (&up, &down), &consumed, "after a late batch").await?;
        let at_end: Vec<(u32, u64)> = consume_upstream(&servers, &up, 1).await?;
        wait_translated(&servers, (&up, &down), &at_end, "the group at the end").await?;
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
