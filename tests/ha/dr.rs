//! Disaster recovery, end to end with three node processes: a consumer group's offsets follow
//! the copy exactly (also after the owner of a partition is killed), `flow promote` cuts over
//! (the group continues on the target with the next message), the application produces on the
//! target, and the reverse flow fails back: the original source ends with every message once,
//! in order per partition, and the group's offsets translated back. Both flows run from the
//! start; loop prevention keeps the reverse flow from copying anything that came from the
//! source.

use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::IggyMessage;
use replicator_harness::Client;
use replicator_harness::{
    connect, group_next_message, group_offset, message_id_at, partition_counts, partition_ids,
    produce_bulk, serial, store_group_offsets, translated_exactly, wait_until, Bulk, FlowEntry,
    ReplicatorCluster, ReplicatorClusterSpec, Servers, TestResult, Topic,
};

use crate::fixture;

const STREAM: &str = "dr";
const TOPIC: &str = "orders";
const PARTITIONS: u32 = 4;
const WAIT: Duration = Duration::from_secs(60);

/// Two flows between the same clusters, both syncing the group `billing`: `fwd` (up → down)
/// and `back` (down → up).
fn spec(servers: &Servers) -> TestResult<ReplicatorClusterSpec> {
    let flow = |name: &str, source: &str, target: &str| {
        FlowEntry::new(name, source, target, format!("{STREAM}/*"))
            .extra("consumer_groups = [\"billing\"]\nconsumer_group_sync_interval = \"200ms\"")
    };
    let replication = fixture::up_and_down(servers)
        .flow(flow("fwd", "up", "down"))
        .flow(flow("back", "down", "up"));
    fixture::spec_of(&replication, 2 * PARTITIONS as usize, false)
}

/// Messages `range` on every partition; ids tell the cluster they were produced on (`origin`)
/// and their place.
async fn produce(client: &Client, origin: u128, range: std::ops::Range<u64>) -> TestResult {
    let bulk = Bulk {
        stream: STREAM.into(),
        topic: TOPIC.into(),
        partitions: (0..PARTITIONS).collect(),
        range,
        batch: 100,
    };
    produce_bulk(client, &bulk, |partition, seq| {
        IggyMessage::builder()
            .id((origin << 64) | (u128::from(partition) << 32) | u128::from(seq))
            .payload(Bytes::from(format!("{origin}-{partition}-{seq}")))
            .build()
    })
    .await?;
    Ok(())
}

/// Waits until `group` on `target` holds, on every partition, the translation of `offsets`
/// (partition, upstream offset) of `source`.
async fn wait_translated(
    (source, target): (&Client, &Client),
    offsets: &[(u32, u64)],
    what: &str,
) -> TestResult {
    for &(partition, offset) in offsets {
        let what = format!("{what}: billing on partition {partition} at {offset}");
        wait_until(&what, WAIT, || async {
            translated_exactly(
                (source, target),
                (STREAM, TOPIC),
                "billing",
                partition,
                offset,
            )
            .await
            .unwrap_or(false)
        })
        .await?;
    }
    Ok(())
}

/// `flow promote NAME` through the leader; asserts exit 0 and prints the report.
async fn promote(cluster: &ReplicatorCluster, flow: &str) -> TestResult {
    let run = cluster
        .flow_once(&["promote", flow, "--timeout", "60s"])
        .await?;
    println!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "promote {flow}: {}", run.stderr);
    assert!(run.stdout.contains("billing"), "the report lists the group");
    let status = cluster.leader_status().await.ok_or("no leader")?;
    assert!(status.is_paused(flow), "{flow} paused after promote");
    assert_eq!(status.owned_units_of(flow), 0, "nobody writes {flow}");
    Ok(())
}

#[test]
fn groups_follow_failover_and_promote_then_fail_back_exactly() -> TestResult {
    serial(|| async {
        let servers = Servers::start(Topic::new(STREAM, TOPIC, PARTITIONS)).await?;
        let mut cluster = ReplicatorCluster::start(spec(&servers)?, 3).await?;
        let up = connect(&servers.upstream.connection_string()).await?;
        let down = connect(&servers.downstream.connection_string()).await?;

        // The application consumes part of each partition upstream.
        produce(&up, 1, 0..400).await?;
        let consumed = [(0, 99), (1, 199), (2, 399), (3, 0)];
        store_group_offsets(&up, (STREAM, TOPIC), "billing", &consumed).await?;
        wait_translated((&up, &down), &consumed, "before any fault").await?;
        // Both flows' owners write heartbeats to their targets, as their fenced writer users.
        for (client, side) in [(&down, "down"), (&up, "up")] {
            wait_until(&format!("heartbeats on {side}"), WAIT, || async {
                partition_counts(client, "replicator", "heartbeats")
                    .await
                    .is_ok_and(|counts| counts.iter().sum::<u64>() > 0)
            })
            .await?;
        }

        // The owner of partition 0 dies; the group moves on upstream, over new messages.
        let status = cluster.leader_status().await.ok_or("no leader")?;
        let victim = status
            .units
            .iter()
            .find(|u| u.unit.flow == "fwd" && u.unit.partition == 0)
            .and_then(|u| u.owner)
            .ok_or("partition 0 of fwd has no owner")?;
        cluster.kill(victim)?;
        produce(&up, 1, 400..500).await?;
        let consumed = [(0, 450), (1, 420), (2, 400), (3, 480)];
        store_group_offsets(&up, (STREAM, TOPIC), "billing", &consumed).await?;
        wait_translated(
            (&up, &down),
            &consumed,
            &format!("after node {victim} was killed"),
        )
        .await?;
        cluster.restart(victim)?;

        // Cut over: the producers upstream have stopped; promote the flow.
        promote(&cluster, "fwd").await?;
        // The application continues on the target, each partition at the next message.
        for &(partition, offset) in &consumed {
            let next = group_next_message(&down, (STREAM, TOPIC), "billing", partition).await?;
            let want = message_id_at(&up, (STREAM, TOPIC), partition, offset + 1).await?;
            assert_eq!(
                next.map(|m| m.id),
                Some(want),
                "partition {partition} continues at the next message"
            );
        }

        // New messages on the promoted side; the group consumes some of them there.
        let before: Vec<u64> = servers.downstream_counts();
        produce(&down, 2, 0..50).await?;
        let consumed_down: Vec<(u32, u64)> = (0..PARTITIONS)
            .map(|p| (p, before[p as usize] + 9))
            .collect();
        store_group_offsets(&down, (STREAM, TOPIC), "billing", &consumed_down).await?;

        // Fail back: the reverse flow copied only what was produced on the promoted side.
        wait_until("the new messages copied back", WAIT, || async {
            servers.upstream_counts() == vec![550; PARTITIONS as usize]
        })
        .await?;
        promote(&cluster, "back").await?;
        wait_translated((&down, &up), &consumed_down, "failed back").await?;
        for partition in 0..PARTITIONS {
            let upstream = partition_ids(&up, (STREAM, TOPIC), partition).await?;
            let expected: Vec<u128> = (0..500u64)
                .map(|seq| (1 << 64) | (u128::from(partition) << 32) | u128::from(seq))
                .chain(
                    (0..50u64)
                        .map(|seq| (2 << 64) | (u128::from(partition) << 32) | u128::from(seq)),
                )
                .collect();
            assert_eq!(
                upstream, expected,
                "partition {partition} of the original source"
            );
        }

        // Back to normal: the forward flow runs again and copies nothing twice.
        cluster.flow(&["resume", "fwd"]).await?;
        assert!(
            cluster.verify(Duration::from_secs(30)).await?,
            "verify: not exact"
        );
        assert_eq!(servers.downstream_counts(), vec![550; PARTITIONS as usize]);
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}

/// The source is lost: `flow promote` cannot know what was not copied, gives up at its
/// deadline with exit 3, and still pauses the flow; the groups keep the offsets of the last
/// sync round.
#[test]
fn promote_without_the_source_pauses_and_says_what_it_cannot_know() -> TestResult {
    serial(|| async {
        let servers = Servers::start(Topic::new(STREAM, TOPIC, PARTITIONS)).await?;
        let cluster = ReplicatorCluster::start(spec(&servers)?, 3).await?;
        let up = connect(&servers.upstream.connection_string()).await?;
        let down = connect(&servers.downstream.connection_string()).await?;
        produce(&up, 1, 0..200).await?;
        let consumed: Vec<(u32, u64)> = (0..PARTITIONS).map(|p| (p, 150)).collect();
        store_group_offsets(&up, (STREAM, TOPIC), "billing", &consumed).await?;
        wait_translated((&up, &down), &consumed, "before the loss").await?;

        let faults = servers.upstream.faults();
        faults.refuse_connections(true);
        faults.drop_connections();
        let run = cluster
            .flow_once(&["promote", "fwd", "--timeout", "3s"])
            .await?;
        println!("{}{}", run.stdout, run.stderr);
        assert_eq!(run.code, Some(3), "promote gives up: {}", run.stderr);
        assert!(run.stdout.contains("flow fwd paused"));
        assert!(
            run.stderr.contains("cutover is incomplete"),
            "{}",
            run.stderr
        );
        let status = cluster.leader_status().await.ok_or("no leader")?;
        assert!(status.is_paused("fwd"));
        assert_eq!(status.owned_units_of("fwd"), 0);
        for &(partition, offset) in &consumed {
            let stored = group_offset(&down, (STREAM, TOPIC), "billing", partition).await?;
            let want = message_id_at(&down, (STREAM, TOPIC), partition, stored.ok_or("none")?);
            let got = message_id_at(&down, (STREAM, TOPIC), partition, offset).await?;
            assert_eq!(
                want.await?,
                got,
                "partition {partition} keeps its last translation"
            );
        }
        faults.refuse_connections(false);
        let mut cluster = cluster;
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}
