//! A rolling upgrade from the last release to this build under load: three nodes start on the
//! released executable (`IGGY_REPLICATOR_RELEASED_BINARY`, which `.ci/run` builds from the
//! latest `v*` tag); each step stops the node that leads with SIGTERM and starts it on this
//! build. Throughout, every partition stays owned by a running node and the copy keeps
//! moving; the cluster stays at the released feature level while an old member remains, is
//! raised to this build's level after the last step, and `verify` finds an exact copy.

use std::time::Duration;

use replicator_control::SUPPORTED_FEATURE_LEVEL;
use replicator_harness::{
    serial, wait_until, ReplicatorBinary, ReplicatorCluster, Servers, TestResult,
};

use crate::fixture::{self, finish_with_exact_copy};

/// Where `.ci/run` puts the released executable.
const RELEASED_BINARY: &str = "IGGY_REPLICATOR_RELEASED_BINARY";
const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_rolling_upgrade_from_the_last_release_keeps_the_copy_exact() -> TestResult {
    let Some(released) = std::env::var_os(RELEASED_BINARY) else {
        // Not proof of anything: say so loudly. CI always sets it.
        eprintln!(
            "SKIPPED: {RELEASED_BINARY} is not set, so the rolling upgrade from the last \
             release was NOT tested (.ci/run builds the release and sets it)"
        );
        return Ok(());
    };
    let released = ReplicatorBinary::new(released)?;
    let head = ReplicatorBinary::new(env!("CARGO_BIN_EXE_iggy-replicator"))?;
    serial(|| async {
        let servers = Servers::start(fixture::topic()).await?;
        let urls = (
            servers.upstream.connection_string(),
            servers.downstream.connection_string(),
        );
        let mut spec = fixture::spec_between((&urls.0, &urls.1), false, None, "")?;
        spec.binary = released;
        let units = spec.units;
        let mut cluster = ReplicatorCluster::launch(spec, fixture::loopback(3)?).await?;
        let producer = fixture::produce_into(&urls.0);
        servers.wait_copy_started(Duration::from_secs(30)).await?;
        let status = cluster
            .wait_leader_status("a leader".into(), WAIT, |_| true)
            .await?;
        let released_level = status.feature_level;
        println!("released build: feature level {released_level}");
        cluster
            .wait_leader_status("every member published its level".into(), WAIT, |s| {
                s.members.len() == 3
                    && s.members
                        .iter()
                        .all(|m| m.supported_level == Some(released_level))
            })
            .await?;
        // A release of the same level (a fix release) upgrades without a raise.
        assert!(released_level <= SUPPORTED_FEATURE_LEVEL);

        let mut upgraded = Vec::new();
        for step in 1..=3 {
            // The node that leads now: the hardest one to take away.
            // (An election may be running: a restarted node can call one before the leader's
            // heartbeats reach it.)
            let leader = cluster
                .wait_leader_status("a leader".into(), WAIT, |_| true)
                .await?
                .leader
                .filter(|l| !upgraded.contains(l))
                .or_else(|| {
                    cluster
                        .running()
                        .into_iter()
                        .find(|n| !upgraded.contains(n))
                })
                .ok_or("no node left to upgrade")?;
            let codes = cluster.terminate(&[leader], WAIT).await?;
            assert_eq!(
                codes,
                vec![(leader, Some(0))],
                "node {leader} did not drain"
            );
            cluster.restart_with(leader, &head)?;
            upgraded.push(leader);
            println!("step {step}: node {leader} runs this build");

            cluster
                .wait_leader_status(
                    "every partition owned by a running node".into(),
                    WAIT,
                    |s| s.all_units_owned_by_any_of(&[1, 2, 3], units),
                )
                .await?;
            wait_copy_moves(&servers, &format!("step {step}")).await?;
            let status = cluster
                .wait_leader_status(format!("node {leader}'s level published"), WAIT, |s| {
                    s.member(leader)
                        .is_some_and(|m| m.supported_level == Some(SUPPORTED_FEATURE_LEVEL))
                })
                .await?;
            let member = status
                .member(leader)
                .ok_or("the upgraded node is no member")?;
            println!(
                "step {step}: leader {:?}, feature level {}, node {leader} supports {:?}",
                status.leader, status.feature_level, member.supported_level
            );
            if step < 3 {
                // An old member still runs: nothing it cannot read is written.
                assert_eq!(status.feature_level, released_level, "raised too early");
            }
        }

        cluster
            .wait_leader_status(
                format!("the cluster raised to feature level {SUPPORTED_FEATURE_LEVEL}"),
                WAIT,
                |s| s.feature_level == SUPPORTED_FEATURE_LEVEL,
            )
            .await?;
        // Copy on at the new level (its commits take the new form) before the check.
        wait_copy_moves(&servers, "at the new level").await?;
        for node in [1, 2, 3] {
            wait_until(&format!("node {node} applied the raise"), WAIT, || async {
                cluster
                    .status_of(node)
                    .await
                    .is_ok_and(|s| s.feature_level == SUPPORTED_FEATURE_LEVEL)
            })
            .await?;
        }
        finish_with_exact_copy(producer, servers, cluster).await
    })
}

/// Waits until the downstream holds 1,000 messages more than now (about 0.6 s of the
/// producer's rate): the copy did not stall.
async fn wait_copy_moves(servers: &Servers, when: &str) -> TestResult {
    let before: u64 = servers.downstream_counts().iter().sum();
    wait_until(&format!("the copy moves on ({when})"), WAIT, || async {
        servers.downstream_counts().iter().sum::<u64>() >= before + 1000
    })
    .await?;
    Ok(())
}
