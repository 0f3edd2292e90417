//! Partition scale: three instances carrying 16 partitions and then `BENCH_SCALE_TOPICS` ×
//! `BENCH_SCALE_PARTITIONS` (default 1,000) partitions at the same low traffic: time to assign
//! every unit, RSS and CPU when idle and under load, Raft entries per second, how long a
//! restarted follower takes to be current (from the log, then by snapshot after the leader
//! purged its log past the follower), the snapshot's size and build and install times, and the
//! time to reassign every unit after the leader is killed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_harness::{NodeId, ReplicatorCluster, TestResult};

use crate::env::{
    cleaned_up, cpu_seconds, rss_bytes, run_name, start_three_nodes, wait_balanced, Endpoints,
};
use crate::load::{paced, targets};
use crate::metrics::applied_index;
use crate::report::{mib, secs};
use crate::settings::Settings;

/// One sampling window over the cluster.
#[derive(Debug, Clone, Default)]
struct Window {
    /// CPU use per node, in percent of one core.
    cpu_percent: BTreeMap<NodeId, f64>,
    /// RSS per node at the end of the window.
    rss: BTreeMap<NodeId, u64>,
    /// Raft entries applied per second (the leader's applied index).
    raft_entries_per_s: f64,
}

/// What one layout measured.
#[derive(Debug, Clone)]
struct Row {
    layout: String,
    partitions: usize,
    assign_all: Duration,
    idle: Window,
    load: Window,
    /// `None` with `BENCH_SCALE_RESTARTS=0`.
    restarts: Option<Restarts>,
    reassign_after_leader_kill: Duration,
}

/// A follower restarted under load, twice.
#[derive(Debug, Clone, Default)]
struct Restarts {
    /// Killed, restarted 5 s later: from its start to its applied index reaching the leader's
    /// at the start (catch-up from the leader's log).
    from_log: Duration,
    /// Killed, restarted once the leader purged its log past the follower: the same, by
    /// snapshot.
    by_snapshot: Duration,
    /// The follower's `raft_snapshot_install_seconds` after that.
    install: Option<f64>,
    /// The leader's `raft_snapshot_bytes` and `raft_snapshot_build_seconds` then.
    snapshot_bytes: Option<f64>,
    build: Option<f64>,
}

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    println!(
        "## Partition scale: three instances, {} msg/s of {} B spread over all partitions under load, {} s windows\n",
        settings.scale_rate,
        crate::env::PAYLOAD_BYTES,
        settings.sample_seconds
    );
    let mut rows = Vec::new();
    for (topics, partitions) in [(1, 16), (settings.scale_topics, settings.scale_partitions)] {
        let stream = run_name("scale");
        let scenario = measure(endpoints, settings, &stream, topics, partitions);
        rows.push(cleaned_up(endpoints, &stream, scenario).await?);
    }
    println!("| layout | assign all units after start (s) | RSS per instance idle / load (MiB) | CPU % per instance idle | CPU % per instance under load | Raft entries/s idle / load | reassign all after leader kill (s) |");
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        let list = |values: &BTreeMap<NodeId, f64>| {
            values
                .values()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let rss = |w: &Window| w.rss.values().copied().max().unwrap_or_default();
        println!(
            "| {} ({} partitions) | {} | {} / {} (max) | {} | {} | {:.1} / {:.1} | {} |",
            row.layout,
            row.partitions,
            secs(row.assign_all),
            mib(rss(&row.idle)),
            mib(rss(&row.load)),
            list(&row.idle.cpu_percent),
            list(&row.load.cpu_percent),
            row.idle.raft_entries_per_s,
            row.load.raft_entries_per_s,
            secs(row.reassign_after_leader_kill),
        );
    }
    println!();
    if rows.iter().all(|r| r.restarts.is_none()) {
        return Ok(());
    }
    println!("| layout | snapshot size (MiB) | snapshot build on the leader (s) | restarted follower current, from the log (s) | restarted follower current, by snapshot (s) | of which snapshot install after transfer (s) |");
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        let Some(r) = &row.restarts else { continue };
        let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or_else(|| "–".to_owned(), f);
        println!(
            "| {} ({} partitions) | {} | {} | {} | {} | {} |",
            row.layout,
            row.partitions,
            opt(r.snapshot_bytes, |b| mib(b as u64)),
            opt(r.build, |s| format!("{s:.3}")),
            secs(r.from_log),
            secs(r.by_snapshot),
            opt(r.install, |s| format!("{s:.3}")),
        );
    }
    println!();
    Ok(())
}

async fn measure(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    topics: u32,
    partitions: u32,
) -> TestResult<Row> {
    let names: Vec<String> = (0..topics).map(|t| format!("t{t:03}")).collect();
    let units = names.len() * partitions as usize;
    let (mut cluster, assign_all, _wan) =
        start_three_nodes(endpoints, settings, stream, &names, partitions).await?;
    let window = Duration::from_secs(settings.sample_seconds);
    // Start-up work (downstream topic creation, first resumes) is over before sampling, and
    // with a long settle the idle readers' safety nets run at their steady rate.
    tokio::time::sleep(Duration::from_secs(settings.scale_settle_seconds)).await;
    let idle = sample(&cluster, window).await?;
    let producer = paced(
        &endpoints.upstream,
        targets(stream, &names, partitions),
        settings.scale_rate,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let load = sample(&cluster, window).await?;
    // Under the same load, which keeps the leader writing entries.
    let restarts = if settings.scale_restarts {
        Some(restart_follower(&mut cluster).await?)
    } else {
        None
    };
    producer.stop().await?;
    wait_balanced(&cluster, Duration::from_secs(300)).await?;

    let status = cluster.leader_status().await.ok_or("no leader")?;
    let leader = status.leader.ok_or("no leader")?;
    cluster.kill(leader)?;
    let killed_at = Instant::now();
    let survivors = cluster.running();
    cluster
        .wait_all_owned(&survivors, Duration::from_secs(300))
        .await?;
    let reassign = killed_at.elapsed();
    cluster.passed();
    Ok(Row {
        layout: format!("{topics} topic(s) × {partitions}"),
        partitions: units,
        assign_all,
        idle,
        load,
        restarts,
        reassign_after_leader_kill: reassign,
    })
}

/// CPU, RSS and Raft entries over one window.
async fn sample(cluster: &ReplicatorCluster, window: Duration) -> TestResult<Window> {
    let pids = cluster.pids();
    let cpu_before: BTreeMap<NodeId, f64> = pids
        .iter()
        .map(|(id, pid)| (*id, cpu_seconds(*pid).unwrap_or_default()))
        .collect();
    let applied_before = applied_index(cluster).await?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = started.elapsed().as_secs_f64();
    let applied_after = applied_index(cluster).await?;
    let mut out = Window {
        raft_entries_per_s: applied_after.saturating_sub(applied_before) as f64 / elapsed,
        ..Window::default()
    };
    for (id, pid) in &pids {
        let used = cpu_seconds(*pid).unwrap_or_default() - cpu_before[id];
        out.cpu_percent.insert(*id, used / elapsed * 100.0);
        out.rss.insert(*id, rss_bytes(*pid).unwrap_or_default());
    }
    Ok(out)
}

/// Restarts a follower twice (see [`Restarts`]) and measures until it is current each time.
async fn restart_follower(cluster: &mut ReplicatorCluster) -> TestResult<Restarts> {
    let leader = cluster
        .leader_status()
        .await
        .and_then(|s| s.leader)
        .ok_or("no leader")?;
    let follower = *cluster
        .running()
        .iter()
        .find(|id| **id != leader)
        .ok_or("no follower")?;
    cluster.kill(follower)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let from_log = restart_until_current(cluster, leader, follower).await?;
    // Ready again before it goes down a second time.
    wait_balanced(cluster, Duration::from_secs(300)).await?;

    cluster.kill(follower)?;
    // Whatever the follower had acknowledged is committed with the third node's help within
    // moments; the leader's commit index then is at or past the follower's log.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let behind = raft_index(cluster, leader, "iggy_replicator_raft_commit_index")
        .await
        .ok_or("the leader reports no commit index")?;
    poll_until(
        "the leader purged its log past the stopped follower",
        Duration::from_secs(600),
        || async {
            raft_index(cluster, leader, "iggy_replicator_raft_purged_index")
                .await
                .is_some_and(|purged| purged > behind)
        },
    )
    .await?;
    let by_snapshot = restart_until_current(cluster, leader, follower).await?;
    let cluster = &*cluster;
    let metric = |node, name| async move { cluster.metric_of(node, name).await.ok().flatten() };
    let install = metric(follower, "iggy_replicator_raft_snapshot_install_seconds").await;
    if install.is_none() {
        return Err("the restarted follower caught up without installing a snapshot".into());
    }
    Ok(Restarts {
        from_log,
        by_snapshot,
        install,
        snapshot_bytes: metric(leader, "iggy_replicator_raft_snapshot_bytes").await,
        build: metric(leader, "iggy_replicator_raft_snapshot_build_seconds").await,
    })
}

/// Starts the stopped `follower` and waits until its applied index reaches the one `leader`
/// had applied at its start; returns how long that took.
async fn restart_until_current(
    cluster: &mut ReplicatorCluster,
    leader: NodeId,
    follower: NodeId,
) -> TestResult<Duration> {
    let target = raft_index(cluster, leader, "iggy_replicator_raft_applied_index")
        .await
        .ok_or("the leader reports no applied index")?;
    cluster.restart(follower)?;
    let started = Instant::now();
    let cluster = &*cluster;
    poll_until(
        "the restarted follower applied what the leader had",
        Duration::from_secs(600),
        || async {
            raft_index(cluster, follower, "iggy_replicator_raft_applied_index")
                .await
                .is_some_and(|applied| applied >= target)
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// Polls `condition` every 100 ms until it holds, or fails once `within` has passed: more
/// slowly than `wait_until`, because every poll renders a node's whole `/metrics`, which lists
/// every unit it owns.
async fn poll_until<F, Fut>(what: &str, within: Duration, mut condition: F) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !condition().await {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A Raft index gauge of `node`'s `/metrics`; `None` while it does not answer or report it.
async fn raft_index(cluster: &ReplicatorCluster, node: NodeId, name: &str) -> Option<u64> {
    let value = cluster.metric_of(node, name).await.ok().flatten()?;
    Some(value as u64)
}
