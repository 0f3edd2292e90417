//! `flow reset` with three node processes: refused while the flow runs, refused below the
//! confirmed offsets without `--allow-duplicates`; on a paused flow it copies a range again
//! (partition 0) or skips a backlog (`--to latest`, partition 1), recorded in Raft until the
//! next owner's first commit. Partition 2 is not reset. The downstream partitions end with
//! exactly the messages that implies, in order.

use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::IggyMessage;
use replicator_harness::Client;
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, partition_ids, produce_bulk, serial, wait_until, Bulk, CommandRun, FlowEntry,
    ReplicatorCluster, ReplicatorClusterSpec, Servers, TestResult, Topic,
};

use crate::fixture;

const FLOW: &str = "fwd";
const STREAM: &str = "rs";
const TOPIC: &str = "events";
const WAIT: Duration = Duration::from_secs(60);

fn spec(servers: &Servers) -> TestResult<ReplicatorClusterSpec> {
    let flow = FlowEntry::new(FLOW, "up", "down", format!("{STREAM}/*"));
    fixture::spec_of(&fixture::up_and_down(servers).flow(flow), 3, false)
}

/// The id of message `seq` of `partition` (never 0, which asks the server for a random one).
fn id(partition: u32, seq: u64) -> u128 {
    (u128::from(partition + 1) << 64) | u128::from(seq)
}

/// Messages `range` on every partition.
async fn produce(client: &Client, range: std::ops::Range<u64>) -> TestResult {
    let bulk = Bulk {
        stream: STREAM.into(),
        topic: TOPIC.into(),
        partitions: vec![0, 1, 2],
        range,
        batch: 100,
    };
    produce_bulk(client, &bulk, |partition, seq| {
        IggyMessage::builder()
            .id(id(partition, seq))
            .payload(Bytes::from(format!("{partition}-{seq}")))
            .build()
    })
    .await?;
    Ok(())
}

/// Servers, three nodes, clients of both servers, and the first 100 messages of every
/// partition produced and copied.
async fn start_copied() -> TestResult<(Servers, ReplicatorCluster, Client, Client)> {
    let servers = Servers::start(Topic::new(STREAM, TOPIC, 3)).await?;
    let cluster = ReplicatorCluster::start(spec(&servers)?, 3).await?;
    let up = connect(&servers.upstream.connection_string()).await?;
    let down = connect(&servers.downstream.connection_string()).await?;
    produce(&up, 0..100).await?;
    wait_until("the first 100 copied", WAIT, || async {
        servers.downstream_counts() == vec![100, 100, 100]
    })
    .await?;
    Ok((servers, cluster, up, down))
}

/// `flow reset fwd --stream rs --topic events <args>` once through the leader.
async fn reset(cluster: &ReplicatorCluster, args: &[&str]) -> TestResult<CommandRun> {
    let mut command = vec!["reset", FLOW, "--stream", STREAM, "--topic", TOPIC];
    command.extend_from_slice(args);
    let run = cluster.flow_once(&command).await?;
    println!(
        "reset {args:?}: exit {:?}\n{}{}",
        run.code, run.stdout, run.stderr
    );
    Ok(run)
}

fn ids(partition: u32, seqs: impl IntoIterator<Item = u64>) -> Vec<u128> {
    seqs.into_iter().map(|seq| id(partition, seq)).collect()
}

#[test]
fn a_paused_flow_is_reset_to_copy_a_range_again_or_skip_a_backlog() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, up, down) = start_copied().await?;

        // Running: refused, nothing recorded.
        let run = reset(&cluster, &["--to", "0", "--allow-duplicates"]).await?;
        assert_ne!(run.code, Some(0));
        assert!(run.stderr.contains("pause it first"), "{}", run.stderr);

        cluster.flow(&["pause", FLOW]).await?;
        wait_until("every writer handed back", WAIT, || async {
            cluster
                .leader_status()
                .await
                .is_some_and(|s| s.is_paused(FLOW) && s.owned_units_of(FLOW) == 0)
        })
        .await?;
        // Below what is confirmed, without --allow-duplicates: refused, says how to allow it.
        let run = reset(&cluster, &["--to", "90"]).await?;
        assert_ne!(run.code, Some(0));
        assert!(run.stderr.contains("--allow-duplicates"), "{}", run.stderr);
        // Past the end: refused.
        let run = reset(&cluster, &["--partition", "1", "--to", "101"]).await?;
        assert_ne!(run.code, Some(0));
        assert!(
            run.stderr.contains("past the partition's end"),
            "{}",
            run.stderr
        );
        let status = cluster.leader_status().await.ok_or("no leader")?;
        assert!(
            status.pending_resets_of(FLOW).is_empty(),
            "refusals change nothing"
        );

        // Partition 0 copies 90..99 again; partition 1 skips what is produced while paused.
        let run = reset(
            &cluster,
            &["--partition", "0", "--to", "90", "--allow-duplicates"],
        )
        .await?;
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(run.stdout.contains("COPIED AGAIN"), "{}", run.stdout);
        produce(&up, 100..150).await?;
        let run = reset(&cluster, &["--partition", "1", "--to", "latest"]).await?;
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let status = cluster.leader_status().await.ok_or("no leader")?;
        assert_eq!(
            status.pending_resets_of(FLOW),
            [(0, 90), (1, 150)].into(),
            "both recorded in Raft"
        );

        cluster.flow(&["resume", FLOW]).await?;
        produce(&up, 150..160).await?;
        let expected_0: Vec<u128> = ids(0, (0..100).chain(90..160));
        let expected_1: Vec<u128> = ids(1, (0..100).chain(150..160));
        let expected_2: Vec<u128> = ids(2, 0..160);
        let counts = vec![
            expected_0.len() as u64,
            expected_1.len() as u64,
            expected_2.len() as u64,
        ];
        wait_until("the reset partitions copied", WAIT, || async {
            servers.downstream_counts() == counts
        })
        .await?;
        wait_until(
            "the resets taken up by the new owners' commits",
            WAIT,
            || async {
                cluster
                    .leader_status()
                    .await
                    .is_some_and(|s| s.pending_resets_of(FLOW).is_empty())
            },
        )
        .await?;
        assert_eq!(partition_ids(&down, (STREAM, TOPIC), 0).await?, expected_0);
        assert_eq!(partition_ids(&down, (STREAM, TOPIC), 1).await?, expected_1);
        assert_eq!(partition_ids(&down, (STREAM, TOPIC), 2).await?, expected_2);

        // From here on the copy is the usual one: a later message is copied once.
        produce(&up, 160..161).await?;
        wait_until("the next message copied", WAIT, || async {
            servers.downstream_counts() == counts.iter().map(|c| c + 1).collect::<Vec<_>>()
        })
        .await?;
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}

#[test]
fn a_reset_made_before_its_topic_was_recreated_is_dropped_and_the_new_topic_copied_whole(
) -> TestResult {
    serial(|| async {
        let (servers, mut cluster, up, down) = start_copied().await?;
        cluster.flow(&["pause", FLOW]).await?;
        let run = reset(&cluster, &["--to", "latest"]).await?;
        assert_eq!(run.code, Some(0), "{}", run.stderr);

        // While the flow is paused the application deletes the topic and creates it again:
        // the reset's offsets (100 on every partition) are about the old topic.
        let (s, t) = (
            iggy::prelude::Identifier::named(STREAM)?,
            iggy::prelude::Identifier::named(TOPIC)?,
        );
        up.delete_topic(&s, &t).await?;
        replicator_harness::ensure_topic(&up, STREAM, TOPIC, 3).await?;
        produce(&up, 1000..1030).await?;
        cluster.flow(&["resume", FLOW]).await?;

        // The new topic is copied from its first message, after the old one's copies.
        let counts = vec![130, 130, 130];
        let waited = wait_until("the new topic copied", WAIT, || async {
            servers.downstream_counts() == counts
        })
        .await;
        println!("downstream {:?}", servers.downstream_counts());
        waited?;
        for partition in 0..3 {
            let expected: Vec<u128> = ids(partition, (0..100).chain(1000..1030));
            assert_eq!(
                partition_ids(&down, (STREAM, TOPIC), partition).await?,
                expected
            );
        }
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}
