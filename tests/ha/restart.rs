//! SIGTERM to all three nodes at once while a producer writes, then a start of all three:
//! they resume from the confirmed offsets and the copy is exact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_harness::{serial, tick, wait_resumed, Deadline, Stalled, TestResult};

use crate::fixture::{self, assert_nothing_copied, finish_with_exact_copy};

#[test]
fn whole_cluster_stopped_mid_stream_resumes_from_confirmed_offsets_exactly_once() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        let warm = Deadline::new(Duration::from_secs(30), "2000 messages to be copied");
        while servers.downstream_counts().iter().sum::<u64>() < 2000 {
            warm.check()?;
            tick().await;
        }

        let stopping = Instant::now();
        let all = cluster.running();
        let codes = cluster.terminate(&all, Duration::from_secs(90)).await?;
        println!(
            "all nodes stopped after {:.2} s, exit codes {codes:?}",
            stopping.elapsed().as_secs_f64()
        );
        for (id, code) in &codes {
            assert_eq!(*code, Some(0), "node {id} did not drain cleanly");
        }
        // The producer keeps writing while no node runs; nothing is copied meanwhile.
        let stopped_counts = assert_nothing_copied(
            &servers,
            Duration::from_secs(1),
            "the downstream grew while every node was stopped",
        )
        .await;

        for id in &all {
            cluster.restart(*id)?;
        }
        let restarted = Instant::now();
        let status = cluster
            .wait_all_owned(&all, Duration::from_secs(60))
            .await?;
        let confirmed: BTreeMap<u32, Option<u64>> = status
            .units
            .iter()
            .map(|u| (u.unit.partition, u.confirmed_offset))
            .collect();
        println!(
            "restarted: every partition owned again after {:.2} s; confirmed offsets {confirmed:?}",
            restarted.elapsed().as_secs_f64()
        );
        // Confirmed offsets survived the restart: every partition had copied something.
        for (partition, offset) in &confirmed {
            assert!(
                offset.is_some(),
                "partition {partition} lost its confirmed offset over the restart"
            );
        }
        let stalled = Stalled {
            since: restarted,
            ..Stalled::every_partition(stopped_counts)
        };
        wait_resumed(&servers, &stalled, Duration::from_secs(30)).await?;
        println!(
            "every partition written again {:.2} s after the restart",
            restarted.elapsed().as_secs_f64()
        );

        finish_with_exact_copy(producer, servers, cluster).await
    })
}
