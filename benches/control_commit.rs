//! Commit throughput and latency of the control plane on a 3-node loopback cluster.
//!
//! Every owned partition commits one offset every `period` through `Control::commit` (the
//! pipeline's call after each confirmed write); the batcher folds concurrent calls into one
//! Raft entry per batch interval. Two scenarios keep the commit rate equal while the partition
//! count differs tenfold, to show that Raft writes per second do not grow with partitions.
//! Run: `cargo bench --bench control_commit` (prints results; it does not gate).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use replicator_control::{ClusterSecret, Control, ControlParams, ControlTiming};
use replicator_model::{CommitCounters, ProgressCommit, UnitCounters, WorkUnit};

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Scenario {
    partitions: u32,
    period: Duration,
    duration: Duration,
}

fn main() -> BenchResult {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        for s in [
            Scenario {
                partitions: 100,
                period: Duration::from_millis(20),
                duration: Duration::from_secs(5),
            },
            Scenario {
                partitions: 1000,
                period: Duration::from_millis(200),
                duration: Duration::from_secs(5),
            },
        ] {
            run(s).await?;
        }
        Ok(())
    })
}

async fn start_cluster(dir: &std::path::Path) -> BenchResult<Vec<Control>> {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let addrs = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<Vec<_>>>()?;
    let initial: BTreeMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, a.to_string()))
        .collect();
    let mut nodes = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        nodes.push(
            Control::start(ControlParams {
                node_id: id,
                data_dir: dir.join(format!("node-{id}")),
                raft_addr: addrs[i],
                raft_listener: Some(listener),
                api_addr: String::new(),
                secret: ClusterSecret::new("bench"),
                initial_members: initial.clone(),
                timing: ControlTiming::default(),
                tls: None,
                fencing: None,
            })
            .await?,
        );
    }
    Ok(nodes)
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> BenchResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

async fn run(s: Scenario) -> BenchResult {
    let dir = tempfile::tempdir()?;
    let nodes = start_cluster(dir.path()).await?;
    wait_for("a leader", || nodes.iter().any(|n| n.metrics().is_leader)).await?;
    let units: Vec<WorkUnit> = (0..s.partitions)
        .map(|p| WorkUnit::new("bench", "orders", "created", p))
        .collect();
    nodes[0].report_units("bench", units).await?;
    wait_for("every partition assigned", || {
        nodes
            .iter()
            .map(|n| n.assignments().borrow().len())
            .sum::<usize>()
            == s.partitions as usize
    })
    .await?;

    let leader = nodes
        .iter()
        .find(|n| n.metrics().is_leader)
        .ok_or("no leader")?
        .clone();
    let log_before = leader.metrics().last_log_index.unwrap_or(0);
    let term_before = leader.metrics().term;
    let batches_before: u64 = nodes.iter().map(|n| n.metrics().commit_batches).sum();
    let started = Instant::now();
    let end = started + s.duration;
    let mut tasks = Vec::new();
    for node in &nodes {
        let mine = node.assignments().borrow().clone();
        let n = mine.len().max(1) as u32;
        for (i, a) in mine.into_iter().enumerate() {
            let node = node.clone();
            let stagger = s.period * i as u32 / n;
            let period = s.period;
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut failures = 0u64;
                tokio::time::sleep(stagger).await;
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut offset = 0u64;
                while Instant::now() < end {
                    tick.tick().await;
                    let commit = ProgressCommit {
                        unit: a.unit.clone(),
                        epoch: a.epoch,
                        offset,
                        history_label: 1,
                        counters: CommitCounters::Since(UnitCounters {
                            messages: 100,
                            bytes: 10_000,
                            ..Default::default()
                        }),
                    };
                    let t = Instant::now();
                    match node.commit(vec![commit]).await {
                        Ok(_) => latencies.push(t.elapsed()),
                        Err(_) => failures += 1,
                    }
                    offset += 100;
                }
                (latencies, failures)
            }));
        }
    }
    let mut latencies = Vec::new();
    let mut failures = 0;
    for t in tasks {
        let (l, f) = t.await?;
        latencies.extend(l);
        failures += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let log_after = leader.metrics().last_log_index.unwrap_or(0);
    let batches: u64 = nodes
        .iter()
        .map(|n| n.metrics().commit_batches)
        .sum::<u64>()
        - batches_before;
    latencies.sort();
    println!(
        "control_commit partitions={:<5} commits/s={:>8.0} p50={:>6.2?} p99={:>6.2?} max={:>6.2?} \
         raft_entries/s={:>6.0} commit_batches/s={:>6.0} failures={} elections={}",
        s.partitions,
        latencies.len() as f64 / elapsed,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
        (log_after - log_before) as f64 / elapsed,
        batches as f64 / elapsed,
        failures,
        leader.metrics().term - term_before,
    );
    for n in nodes {
        n.shutdown().await;
    }
    Ok(())
}
