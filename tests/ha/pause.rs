//! `flow pause` and `flow resume` across a leader kill: the pause is in Raft, so a new leader
//! grants nothing of the paused flow either; nothing is copied while it is paused, and after
//! `flow resume` every partition continues exactly where it stopped.

use std::time::Duration;

use replicator_harness::{serial, wait_until, TestResult};

use crate::fixture::{self, assert_nothing_copied, finish_with_exact_copy};

const FLOW: &str = "up-to-down";

#[test]
fn a_paused_flow_stays_paused_across_a_leader_kill_and_resumes_exactly() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        cluster.flow(&["pause", FLOW]).await?;
        wait_until(
            "every writer handed back",
            Duration::from_secs(30),
            || async {
                cluster
                    .leader_status()
                    .await
                    .is_some_and(|s| s.is_paused(FLOW) && s.owned_units_of(FLOW) == 0)
            },
        )
        .await?;
        assert_nothing_copied(&servers, Duration::from_secs(2), "copied while paused").await;

        // A new leader keeps it paused (the producer keeps writing upstream meanwhile).
        let leader = cluster
            .leader_status()
            .await
            .and_then(|s| s.leader)
            .ok_or("no leader")?;
        cluster.kill(leader)?;
        wait_until("a new leader", Duration::from_secs(30), || async {
            cluster
                .leader_status()
                .await
                .is_some_and(|s| s.leader.is_some_and(|l| l != leader))
        })
        .await?;
        let status = cluster.leader_status().await.ok_or("no leader")?;
        assert!(status.is_paused(FLOW), "still paused under the new leader");
        assert_nothing_copied(&servers, Duration::from_secs(2), "copied after the kill").await;
        cluster.restart(leader)?;

        cluster.flow(&["resume", FLOW]).await?;
        wait_until("units granted again", Duration::from_secs(30), || async {
            cluster
                .leader_status()
                .await
                .is_some_and(|s| !s.is_paused(FLOW) && s.owned_units_of(FLOW) > 0)
        })
        .await?;
        finish_with_exact_copy(producer, servers, cluster).await
    })
}
