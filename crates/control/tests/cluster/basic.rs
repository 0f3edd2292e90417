use std::time::{Duration, Instant};

use replicator_model::{CommitOutcome, Epoch, OffsetCommit, UnitCounters};

use crate::util::*;

fn commit(a: &replicator_model::Assignment, offset: u64) -> OffsetCommit {
    OffsetCommit {
        unit: a.unit.clone(),
        epoch: a.epoch,
        offset,
        topic_created_at: 7,
        counters: UnitCounters {
            messages: 1,
            ..Default::default()
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_assign_evenly_and_commit() -> TestResult {
    let cluster = TestCluster::start(3, fast_timing()).await?;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    // Any node may report; the write is forwarded to the leader.
    let follower = if leader == 1 { 2 } else { 1 };
    cluster
        .node(follower)
        .report_units("f", units("f", 9))
        .await?;
    wait_until_async("9 units spread 3/3/3", Duration::from_secs(10), || async {
        let owners = cluster.owners(leader).await.unwrap_or_default();
        let load = load(&owners);
        owners.len() == 9 && !load.contains_key(&None) && load.values().all(|n| *n == 3)
    })
    .await?;

    for id in 1..=3 {
        let node = cluster.node(id);
        let mut rx = node.assignments();
        rx.wait_for(|a| a.len() == 3).await?;
        let mine = rx.borrow().clone();
        let outcomes = node
            .commit(mine.iter().map(|a| commit(a, 100 + id)).collect())
            .await?;
        assert2::check!(outcomes == vec![CommitOutcome::Committed; 3]);
        // A commit under a wrong epoch is fenced and leaves the offset alone.
        let mut stale = commit(&mine[0], 5000);
        stale.epoch = Epoch(mine[0].epoch.0 + 1_000_000);
        let outcome = node.commit(vec![stale]).await?;
        assert2::check!(
            outcome
                == vec![CommitOutcome::Fenced {
                    current: Some(mine[0].epoch)
                }]
        );
    }
    // Every node converges on the confirmed offsets.
    let status = cluster.node(leader).status().await?;
    for u in &status.units {
        let owner = u.owner.ok_or("unit without owner")?;
        for id in 1..=3 {
            let unit = u.unit.clone();
            wait_until("progress replicated", Duration::from_secs(5), || {
                cluster.node(id).progress(&unit).and_then(|p| p.confirmed) == Some(100 + owner)
            })
            .await?;
        }
    }
    assert!(status
        .members
        .iter()
        .all(|m| m.voter && m.lease_alive == Some(true)));
    // The commit index the log store saved is never behind what was applied.
    for node in cluster.nodes.values() {
        let m = node.metrics();
        assert2::check!(m.commit_index.is_some());
        assert2::check!(m.commit_index >= m.last_applied);
        assert2::check!(m.units_unowned == 0);
    }
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_elects_new_leader_which_serves_writes_and_keeps_offsets() -> TestResult {
    let mut cluster = TestCluster::start(3, fast_timing()).await?;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    cluster
        .node(leader)
        .report_units("f", units("f", 6))
        .await?;
    wait_until_async("6 units assigned", Duration::from_secs(10), || async {
        let owners = cluster.owners(leader).await.unwrap_or_default();
        owners.len() == 6 && owners.values().all(Option::is_some)
    })
    .await?;
    let survivor = if leader == 1 { 2 } else { 1 };
    let mut rx = cluster.node(survivor).assignments();
    rx.wait_for(|a| a.len() == 2).await?;
    let mine = rx.borrow().clone();
    cluster
        .node(survivor)
        .commit(mine.iter().map(|a| commit(a, 41)).collect())
        .await?;

    let crashed_at = Instant::now();
    cluster.crash(leader).await;
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    let elected = crashed_at.elapsed();
    let outcomes = cluster
        .node(survivor)
        .commit(mine.iter().map(|a| commit(a, 42)).collect())
        .await?;
    let first_write = crashed_at.elapsed();
    assert2::check!(outcomes == vec![CommitOutcome::Committed; 2]);
    assert2::check!(new_leader != leader);
    // The crashed leader's units move once its lease expired.
    wait_until_async(
        "crashed leader's units reassigned",
        Duration::from_secs(10),
        || async {
            let owners = cluster.owners(new_leader).await.unwrap_or_default();
            owners.len() == 6 && owners.values().all(|o| o.is_some() && *o != Some(leader))
        },
    )
    .await?;
    println!(
        "failover: leader elected after {elected:?}, first commit after {first_write:?}, units reassigned after {:?}",
        crashed_at.elapsed()
    );
    for a in &mine {
        assert2::check!(
            cluster
                .node(new_leader)
                .progress(&a.unit)
                .and_then(|p| p.confirmed)
                == Some(42)
        );
    }
    // The crashed node restarts from its data dir and catches up.
    cluster.restart(leader).await?;
    let unit = mine[0].unit.clone();
    wait_until("restarted node caught up", Duration::from_secs(10), || {
        cluster
            .node(leader)
            .progress(&unit)
            .and_then(|p| p.confirmed)
            == Some(42)
    })
    .await?;
    cluster.shutdown().await;
    Ok(())
}
