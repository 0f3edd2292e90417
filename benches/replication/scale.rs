//! Partition scale: three instances carrying 16 partitions and then `BENCH_SCALE_TOPICS` ×
//! `BENCH_SCALE_PARTITIONS` (default 1,000) partitions at the same low traffic: time to assign
//! every unit, RSS and CPU when idle and under load, Raft entries per second, and the time to
//! reassign every unit after the leader is killed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_harness::{Cluster, NodeId, TestResult};

use crate::env::{cleaned_up, cpu_seconds, rss_bytes, run_name, start_three_nodes, Endpoints};
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
    reassign_after_leader_kill: Duration,
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
    let (mut cluster, assign_all) =
        start_three_nodes(endpoints, settings, stream, &names, partitions).await?;
    let window = Duration::from_secs(settings.sample_seconds);
    // Start-up work (downstream topic creation, first resumes) is over before sampling.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = sample(&cluster, window).await?;
    let producer = paced(
        &endpoints.upstream,
        targets(stream, &names, partitions),
        settings.scale_rate,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let load = sample(&cluster, window).await?;
    producer.stop().await?;

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
        reassign_after_leader_kill: reassign,
    })
}

/// CPU, RSS and Raft entries over one window.
async fn sample(cluster: &Cluster, window: Duration) -> TestResult<Window> {
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
