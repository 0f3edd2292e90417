use std::time::{Duration, Instant};

use replicator_model::{
    ClusterPair, CommitOutcome, Epoch, MetadataChange, MetadataKey, MetadataObject, MetadataRecord,
};

use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_assign_evenly_and_commit() -> TestResult {
    let (cluster, leader) = TestCluster::start_led(3).await?;
    // Any node may report; the write is forwarded to the leader.
    cluster.report_units(follower_of(leader), 9).await?;
    cluster
        .wait_owners("9 units spread 3/3/3", leader, |owners| {
            let load = load(owners);
            owners.len() == 9 && !load.contains_key(&None) && load.values().all(|n| *n == 3)
        })
        .await?;

    for id in 1..=3 {
        let node = cluster.node(id);
        let mine = cluster.wait_assigned(id, |a| a.len() == 3).await?;
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
            wait_until("progress replicated", Duration::from_secs(5), || {
                cluster.confirmed(id, &u.unit) == Some(100 + owner)
            })
            .await?;
        }
    }
    assert!(status
        .members
        .iter()
        .all(|m| m.voter && m.lease_alive == Some(true)));
    // Every member publishes the feature level its build supports; the cluster runs at the
    // lowest of them.
    let level = replicator_control::SUPPORTED_FEATURE_LEVEL;
    cluster
        .wait_status(
            "every member published its level",
            leader,
            Duration::from_secs(20),
            |s| {
                s.feature_level == level
                    && s.members.iter().all(|m| m.supported_level == Some(level))
            },
        )
        .await?;
    // At level 3 a follower's metadata records go through the leader, compare-and-set per
    // object, and every member reads them.
    let pair = ClusterPair::new("us", "eu");
    let key = MetadataKey {
        pair: pair.clone(),
        object: MetadataObject::User("app-billing".into()),
    };
    let home = |alias: &str| MetadataRecord {
        home: alias.into(),
        agreed: Default::default(),
    };
    let follower = cluster.node(follower_of(leader));
    // The follower checks the level against its own state, which applies the raise a moment
    // after the leader's (the supported level, 4, is the compact provenance's).
    wait_until(
        "the follower applied the raised level",
        Duration::from_secs(20),
        || follower.stamps_compact_provenance(),
    )
    .await?;
    let first = MetadataChange {
        key: key.clone(),
        expected: None,
        record: Some(home("us")),
    };
    assert2::check!(follower.record_metadata(vec![first.clone()]).await? == vec![true]);
    // The same decision made from the old (absent) record loses; one from the new one wins.
    let moved = MetadataChange {
        key: key.clone(),
        expected: Some(home("us")),
        record: Some(home("eu")),
    };
    assert2::check!(follower.record_metadata(vec![first, moved]).await? == vec![false, true]);
    // Read your writes: the node that wrote them reads them at once.
    assert2::check!(
        follower
            .metadata_records(&pair)
            .and_then(|r| r.get(&key.object).cloned())
            == Some(home("eu"))
    );
    for id in 1..=3 {
        wait_until("records replicated", Duration::from_secs(5), || {
            cluster
                .node(id)
                .metadata_records(&pair)
                .is_some_and(|r| r.get(&key.object) == Some(&home("eu")))
        })
        .await?;
    }
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

/// A new cluster's members register, publish their feature level and see it raised as soon as
/// they see themselves in the Raft membership, not a renewal period later: the first tick of a
/// member's renewer comes before the leader's first entries tell it that it is a member. The
/// renewal period is stretched so that the two cannot be mistaken for each other: waiting for
/// the next tick would take 20 s, twice the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_registers_its_members_without_waiting_a_renewal_period() -> TestResult {
    let timing = replicator_control::ControlTiming {
        lease_renew_interval: Duration::from_secs(20),
        lease_expiry: Duration::from_secs(60),
        fence_after: Duration::from_secs(40),
        ..fast_timing()
    };
    let cluster = TestCluster::start(3, timing).await?;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    let level = replicator_control::SUPPORTED_FEATURE_LEVEL;
    cluster
        .wait_status(
            "every member registered, and the cluster at their level",
            leader,
            Duration::from_secs(10),
            |s| {
                s.members.len() == 3
                    && s.feature_level == level
                    && s.members.iter().all(|m| m.supported_level == Some(level))
            },
        )
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// A dead leader's followers call the election themselves once their calls to it are refused
/// and its lease has run out, instead of waiting out openraft's own timer on top. The timeouts
/// are stretched so that the two cannot be mistaken for each other: openraft's timer would
/// call the election 9–12 s after the last heartbeat (its lease of `election_timeout_max`,
/// then a random `election_timeout_min`..`_max`), the followers' call comes about 6 s after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_of_a_dead_leader_call_the_election_once_its_lease_ran_out() -> TestResult {
    let timing = replicator_control::ControlTiming {
        election_timeout_min: Duration::from_secs(3),
        election_timeout_max: Duration::from_secs(6),
        lease_expiry: Duration::from_secs(20),
        ..fast_timing()
    };
    let mut cluster = TestCluster::start(3, timing).await?;
    let leader = cluster.wait_leader(Duration::from_secs(30)).await?;
    // Every member registered and renewing through the leader (a unit each): the followers'
    // calls to the leader are what shows its process gone.
    cluster.report_units(leader, 3).await?;
    cluster
        .wait_owners("a unit per member", leader, |owners| {
            owners.len() == 3 && (1..=3).all(|id| owners.values().any(|o| *o == Some(id)))
        })
        .await?;
    cluster.crash(leader).await;
    let crashed_at = Instant::now();
    let new_leader = cluster.wait_leader(Duration::from_secs(30)).await?;
    let elected = crashed_at.elapsed();
    assert2::check!(new_leader != leader);
    assert2::check!(
        elected < Duration::from_secs(9),
        "elected {elected:?} after the crash: openraft's own timer, not the followers' call"
    );
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_elects_new_leader_which_serves_writes_and_keeps_offsets() -> TestResult {
    let (mut cluster, leader) = TestCluster::start_with_units(3, 6).await?;
    cluster
        .wait_owners("6 units assigned", leader, |owners| {
            owners.len() == 6 && owners.values().all(Option::is_some)
        })
        .await?;
    let survivor = follower_of(leader);
    let mine = cluster.wait_assigned(survivor, |a| a.len() == 2).await?;
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
    cluster
        .wait_owners("crashed leader's units reassigned", new_leader, |owners| {
            owners.len() == 6 && owners.values().all(|o| o.is_some() && *o != Some(leader))
        })
        .await?;
    println!(
        "failover: leader elected after {elected:?}, first commit after {first_write:?}, units reassigned after {:?}",
        crashed_at.elapsed()
    );
    for a in &mine {
        assert2::check!(cluster.confirmed(new_leader, &a.unit) == Some(42));
    }
    // The crashed node restarts from its data dir and catches up.
    cluster.restart(leader).await?;
    let unit = mine[0].unit.clone();
    wait_until("restarted node caught up", Duration::from_secs(10), || {
        cluster.confirmed(leader, &unit) == Some(42)
    })
    .await?;
    cluster.shutdown().await;
    Ok(())
}
