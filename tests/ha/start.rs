//! Where a partition's copy starts is decided once: a flow with `initial_offset = "latest"`
//! over partitions that are empty when the copy starts, whose owner is killed (-9) before it
//! copied or committed anything, while the application goes on producing. The next owners
//! start where the first ones did (recorded in Raft before the first poll), not at the end of
//! the partition as it is when they take over: nothing produced during the handover is skipped.

use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::IggyMessage;
use replicator_harness::{connect, produce_bulk, serial, wait_until, Bulk, TestResult};

use crate::fixture;

/// Messages produced into every partition while the killed node's partitions move.
const PRODUCED: u64 = 50;

#[test]
fn latest_keeps_its_start_across_a_handover_before_the_first_commit() -> TestResult {
    serial(|| async {
        let (servers, mut cluster) =
            fixture::launch_idle(3, "initial_offset = \"latest\"\n").await?;
        let nodes = cluster.running();
        cluster
            .wait_all_owned(&nodes, Duration::from_secs(60))
            .await?;
        let (victim, owned) = fixture::owning_follower(&cluster, &servers.topic).await?;
        // Every writer of the victim has worked out where its partition starts (the end of an
        // empty partition: 0) and told its reader.
        let log = cluster.node(victim)?.log.clone();
        wait_until(
            &format!("the {} writers of node {victim} to resume", owned.len()),
            Duration::from_secs(60),
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                std::future::ready(text.matches("unit resumes").count() >= owned.len())
            },
        )
        .await?;
        cluster.kill(victim)?;

        // The application produces while the victim's partitions have no owner.
        let up = connect(&servers.upstream.connection_string()).await?;
        let topic = &servers.topic;
        let bulk = Bulk {
            stream: topic.stream.clone(),
            topic: topic.name.clone(),
            partitions: (0..topic.partitions).collect(),
            range: 0..PRODUCED,
            batch: 10,
        };
        produce_bulk(&up, &bulk, |partition, seq| {
            IggyMessage::builder()
                .id((u128::from(partition) << 32) | u128::from(seq))
                .payload(Bytes::from(format!("{partition}-{seq}")))
                .build()
        })
        .await?;
        println!(
            "node {victim} killed with partitions {owned:?}; {PRODUCED} messages produced into every partition"
        );
        let caught_up = servers.wait_caught_up(Duration::from_secs(60)).await;
        println!("downstream {:?}", servers.downstream_counts());
        caught_up?;
        cluster.restart(victim)?;
        fixture::finish_exact(servers, cluster).await
    })
}
