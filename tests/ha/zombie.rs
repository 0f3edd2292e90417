//! SIGSTOP of a node for longer than its lease while it copies what a producer writes: its partitions move
//! to the others; after SIGCONT the paused node writes and commits nothing under its old
//! grants (the copy stays exact, confirmed offsets never go back), then it rejoins and takes
//! work again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_harness::{serial, tick, wait_resumed, Deadline, NodeId, Stalled, TestResult};

use crate::fixture::{self, finish_with_exact_copy};

/// The counter of commits refused for a stale epoch.
const FENCED_COMMITS: &str = "iggy_replicator_fenced_commits_total";

#[test]
fn paused_node_loses_its_partitions_writes_nothing_after_resume_and_rejoins() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        let lease_expiry = cluster.timing().lease_expiry;

        let (zombie, owned) = fixture::owning_follower(&cluster, &servers.topic).await?;
        let fenced_before = cluster.metric_of(zombie, FENCED_COMMITS).await?;

        // Freeze the node while it copies (the producer keeps writing): whatever it was doing,
        // its partitions move, and after the thaw it neither writes nor commits under its old
        // grants (fence.rs also holds one of its sends in flight across the freeze).
        cluster.pause(zombie)?;
        let paused_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stalled = Stalled {
            partitions: owned.clone(),
            baseline: servers.downstream_counts(),
            since: paused_at,
        };
        let resumed = wait_resumed(&servers, &stalled, Duration::from_secs(30)).await?;
        let others: Vec<NodeId> = cluster.running();
        let moved = cluster
            .wait_all_owned(&others, Duration::from_secs(30))
            .await?;
        println!(
            "node {zombie} paused: its {} partitions written by others after {:.2} s",
            owned.len(),
            resumed.all.as_secs_f64()
        );
        // Keep it paused for twice the lease in all, so that a writer stuck in a send has
        // certainly outlived its lease when it wakes up.
        while paused_at.elapsed() < lease_expiry * 2 {
            tick().await;
        }
        let epochs_before: BTreeMap<u32, (serde_json::Value, Option<u64>)> = moved
            .units
            .iter()
            .filter(|u| owned.contains(&u.unit.partition))
            .map(|u| (u.unit.partition, (u.epoch.clone(), u.confirmed_offset)))
            .collect();

        cluster.resume(zombie)?;
        let resumed_at = Instant::now();
        // Watch the moved units while the zombie wakes up: their confirmed offsets never go
        // back, and only a new grant (a new epoch) may give one back to the zombie.
        let mut rejoined_after = None;
        let watch = Deadline::new(
            Duration::from_secs(60),
            format!("node {zombie} to own units again"),
        );
        loop {
            if let Some(status) = cluster.leader_status().await {
                for unit in status
                    .units
                    .iter()
                    .filter(|u| owned.contains(&u.unit.partition))
                {
                    let (epoch, confirmed) = &epochs_before[&unit.unit.partition];
                    assert!(
                        unit.confirmed_offset >= *confirmed,
                        "partition {}: confirmed offset went back from {confirmed:?} to {:?}",
                        unit.unit.partition,
                        unit.confirmed_offset
                    );
                    if unit.owner == Some(zombie) {
                        assert_ne!(
                            &unit.epoch, epoch,
                            "partition {} back at node {zombie} under its old epoch",
                            unit.unit.partition
                        );
                    }
                }
                if status.units_owned(zombie) > 0 && rejoined_after.is_none() {
                    rejoined_after = Some(resumed_at.elapsed());
                }
            }
            if rejoined_after.is_some() && resumed_at.elapsed() > lease_expiry * 2 {
                break;
            }
            watch.check()?;
            tick().await;
        }
        let everyone = {
            let mut all = others.clone();
            all.push(zombie);
            all
        };
        cluster
            .wait_all_owned(&everyone, Duration::from_secs(30))
            .await?;
        let fenced_after = cluster.metric_of(zombie, FENCED_COMMITS).await?;
        println!(
            "node {zombie} resumed: owns units again after {:.2} s; its fenced commits {fenced_before:?} → {fenced_after:?}",
            rejoined_after.unwrap_or_default().as_secs_f64()
        );

        finish_with_exact_copy(producer, servers, cluster).await
    })
}
