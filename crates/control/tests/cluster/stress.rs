//! The control plane under stress: 1,000 units on three nodes with the production timing,
//! every node committing all of its units in large batches, and the leader killed (in-process
//! `kill -9`) and restarted again and again. After every kill a leader must be known and every
//! unit owned by a running node again within a generous bound; the times are printed so that a
//! slow run shows up in the log (the timing goal itself lives in the bench, see BENCHMARKS.md).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_control::{Control, ControlTiming};
use replicator_model::{NodeId, ProgressCommit, WorkUnit};
use tokio::task::JoinHandle;

use crate::util::{wait_until_async, TestCluster, TestResult};

/// Units of the stress test: 10 topics × 100 partitions.
fn thousand_units() -> Vec<WorkUnit> {
    (0..10)
        .flat_map(|t| (0..100).map(move |p| WorkUnit::new("f", "bench", format!("topic-{t}"), p)))
        .collect()
}

/// Plays the writers of one node: every 100 ms it commits every unit it owns, one offset
/// further, in one call (so the node's commit batches hold hundreds of units).
fn spawn_committer(control: Control) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut offset = 0u64;
        loop {
            offset += 1;
            let commits: Vec<ProgressCommit> = control
                .assignments()
                .borrow()
                .iter()
                .map(|a| crate::util::commit(a, offset))
                .collect();
            // Fenced or failed commits are expected around a kill.
            let _ = control.commit(commits).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// How the cluster recovered from one leader kill.
struct Recovery {
    /// From the kill until every surviving node knew the same new leader.
    leader_known: Duration,
    /// From the kill until every unit was owned by a surviving node.
    all_owned: Duration,
}

/// Whether every unit is owned by one of `running`, as `via` (the leader) reports it.
async fn all_owned_by(cluster: &TestCluster, via: NodeId, total: usize) -> bool {
    let Ok(owners) = cluster.owners(via).await else {
        return false;
    };
    owners.len() == total
        && owners
            .values()
            .all(|o| o.is_some_and(|o| cluster.nodes.contains_key(&o)))
}

/// Kills the leader, waits for recovery, restarts it and waits until the restarted node
/// follows the cluster again.
async fn kill_leader_once(
    cluster: &mut TestCluster,
    committers: &mut BTreeMap<NodeId, JoinHandle<()>>,
    total: usize,
    bound: Duration,
) -> Result<Recovery, Box<dyn std::error::Error + Send + Sync>> {
    let leader = cluster.wait_leader(bound).await?;
    if let Some(c) = committers.remove(&leader) {
        c.abort();
    }
    let killed = Instant::now();
    cluster.crash(leader).await;
    let new_leader = cluster.wait_leader(bound).await?;
    let leader_known = killed.elapsed();
    wait_until_async(
        "every unit owned by a surviving node",
        bound.saturating_sub(killed.elapsed()),
        || all_owned_by(cluster, new_leader, total),
    )
    .await?;
    let all_owned = killed.elapsed();
    cluster.restart(leader).await?;
    committers.insert(leader, spawn_committer(cluster.node(leader).clone()));
    // The restarted node must follow the current leader (not lead its old term) before the
    // next kill.
    cluster.wait_leader(bound).await?;
    Ok(Recovery {
        leader_known,
        all_owned,
    })
}

fn summary(label: &str, mut times: Vec<Duration>) -> String {
    times.sort();
    let p50 = times[times.len() / 2];
    let max = times[times.len() - 1];
    format!("{label}: p50 {p50:?}, max {max:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kills_at_1000_units_always_recover() -> TestResult {
    let kills: usize = std::env::var("STRESS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    // Generous for a loaded 2-core CI machine; the bench reports the real figures.
    let bound = Duration::from_secs(30);
    let mut cluster = TestCluster::start(3, ControlTiming::default()).await?;
    let leader = cluster.wait_leader(bound).await?;
    let units = thousand_units();
    let total = units.len();
    cluster.node(leader).report_units("f", units).await?;
    wait_until_async("1,000 units assigned", bound, || {
        all_owned_by(&cluster, leader, total)
    })
    .await?;
    let mut committers: BTreeMap<NodeId, JoinHandle<()>> = cluster
        .nodes
        .iter()
        .map(|(id, c)| (*id, spawn_committer(c.clone())))
        .collect();

    let mut recoveries = Vec::new();
    for kill in 1..=kills {
        let r = kill_leader_once(&mut cluster, &mut committers, total, bound)
            .await
            .map_err(|e| format!("kill {kill}: {e}"))?;
        eprintln!(
            "kill {kill}: leader known after {:?}, all units owned after {:?}",
            r.leader_known, r.all_owned
        );
        recoveries.push(r);
    }
    eprintln!(
        "{}; {}",
        summary(
            "leader known",
            recoveries.iter().map(|r| r.leader_known).collect()
        ),
        summary(
            "all owned",
            recoveries.iter().map(|r| r.all_owned).collect()
        )
    );
    for (_, c) in committers {
        c.abort();
    }
    cluster.shutdown().await;
    Ok(())
}
