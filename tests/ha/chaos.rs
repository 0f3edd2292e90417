//! Chaos: a producer writes continuously into 16 partitions while a seeded fault schedule
//! kills (-9) and restarts nodes, kills the Raft leader, pauses nodes (SIGSTOP/SIGCONT) while
//! they copy, half of the time with one of their sends held undelivered until after the pause,
//! restarts the upstream and downstream servers and drops their connections. After every
//! fault the cluster must recover (every partition owned and written again); at the end the
//! producer stops, the copy catches up and `verify` must report an exact copy.
//!
//! The same schedule also runs across a WAN (`wan::start_across`: the servers and every Raft
//! RPC behind 40 ms round trips), where every fault is slower to notice and to recover from.
//!
//! `CHAOS_SEED=<u64>` replays a schedule (the seed is printed); `CHAOS_FAULTS=100` runs a
//! long schedule by hand (CI runs the defaults: 12 faults on loopback, 7 across the WAN, one of
//! each kind).

use std::fmt;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use replicator_harness::{
    serial, wait_resumed, NodeId, PacedProducer, ReplicatorCluster, Servers, Stalled, TestResult,
};

use crate::fixture;
use crate::wan;

/// Seed of the CI schedule.
const DEFAULT_SEED: u64 = 0x5eed_0005;
/// Faults of the CI schedule.
const DEFAULT_FAULTS: usize = 12;
/// Seed of the CI schedule across a WAN: its freeze (4.4 s) is mid-send and outlasts the
/// failover, so the held send arrives after the partition moved and the fence must refuse it.
const DEFAULT_WAN_SEED: u64 = 0x5eed_004a;
/// Faults of the CI schedule across a WAN: each kind once.
const DEFAULT_WAN_FAULTS: usize = 7;
/// Nodes of the cluster.
const NODES: u64 = 3;

/// One fault of the schedule.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `kill -9` of a node, then a restart once its partitions moved.
    KillRestart(NodeId),
    /// `kill -9` of the current Raft leader, then a restart.
    KillLeader,
    /// SIGSTOP for a while, then SIGCONT; with `mid_send`, one send of the node's writers is
    /// held undelivered from just before the SIGSTOP until just before the SIGCONT.
    Pause {
        /// The node.
        node: NodeId,
        /// How long it stays frozen.
        frozen: Duration,
        /// Whether it is frozen inside a send.
        mid_send: bool,
    },
    /// Restart of the upstream server (same port, same data).
    RestartUpstream,
    /// Restart of the downstream server.
    RestartDownstream,
    /// Every upstream connection dropped.
    DropUpstreamConnections,
    /// Every downstream connection dropped.
    DropDownstreamConnections,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillRestart(n) => write!(f, "kill -9 node {n} + restart"),
            Fault::KillLeader => write!(f, "kill -9 leader + restart"),
            Fault::Pause {
                node,
                frozen,
                mid_send,
            } => write!(
                f,
                "SIGSTOP node {node} for {:.1} s{}",
                frozen.as_secs_f64(),
                if *mid_send { " mid-send" } else { "" }
            ),
            Fault::RestartUpstream => write!(f, "restart upstream server"),
            Fault::RestartDownstream => write!(f, "restart downstream server"),
            Fault::DropUpstreamConnections => write!(f, "drop upstream connections"),
            Fault::DropDownstreamConnections => write!(f, "drop downstream connections"),
        }
    }
}

/// The schedule: `count` faults drawn from `seed`, with the pause before each. The first
/// seven are every kind of fault once, in a seeded order, so that even a short schedule
/// covers them all; the rest are drawn at random.
fn schedule(seed: u64, count: usize) -> Vec<(Duration, Fault)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds: Vec<u32> = (0..7).collect();
    kinds.shuffle(&mut rng);
    (0..count)
        .map(|i| {
            let kind = kinds.get(i).copied().unwrap_or_else(|| rng.gen_range(0..7));
            let node = rng.gen_range(1..=NODES);
            let fault = match kind {
                0 => Fault::KillRestart(node),
                1 => Fault::KillLeader,
                2 => Fault::Pause {
                    node,
                    frozen: Duration::from_millis(rng.gen_range(500..4500)),
                    mid_send: rng.gen_bool(0.5),
                },
                3 => Fault::RestartUpstream,
                4 => Fault::RestartDownstream,
                5 => Fault::DropUpstreamConnections,
                _ => Fault::DropDownstreamConnections,
            };
            (Duration::from_millis(rng.gen_range(200..1500)), fault)
        })
        .collect()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median and maximum of durations.
fn p50_max(samples: &[Duration]) -> (Duration, Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let max = sorted.last().copied().unwrap_or_default();
    (p50, max)
}

/// Kills `victim`, waits until its partitions are written by others, restarts it; returns
/// the failover time (`None` when the victim owned nothing at the kill).
async fn kill_restart(
    servers: &Servers,
    cluster: &mut ReplicatorCluster,
    victim: NodeId,
) -> TestResult<Option<Duration>> {
    let killed = cluster
        .kill_and_wait_resumed(victim, &servers.topic, servers)
        .await?;
    println!(
        "  node {victim} killed owning partitions {:?}: first written again after {:.2} s, all after {:.2} s",
        killed.owned,
        killed.resumed.first.as_secs_f64(),
        killed.resumed.all.as_secs_f64()
    );
    cluster.restart(victim)?;
    Ok((!killed.owned.is_empty()).then_some(killed.resumed.all))
}

/// Freezes `node` for `frozen` while the producer writes; with `mid_send`, one of its writers'
/// requests is held undelivered until the end of the freeze (it arrives after the partitions
/// may have moved: the target's fence must refuse it).
async fn freeze(
    servers: &Servers,
    cluster: &mut ReplicatorCluster,
    node: NodeId,
    frozen: Duration,
    mid_send: bool,
) -> TestResult {
    let owned = match cluster.leader_status().await {
        Some(status) => status.owned_by(&servers.topic, node),
        None => Default::default(),
    };
    let hold = match owned.first() {
        Some(&partition) if mid_send => {
            let topic = &servers.topic;
            let hold =
                servers
                    .downstream
                    .faults()
                    .hold_sends_to(&topic.stream, &topic.name, partition);
            // The producer writes to every partition, so the writer sends again soon; if it
            // does not within the bound, the node is frozen without a held send.
            let held = tokio::time::timeout(Duration::from_secs(10), hold.until_held(1)).await;
            println!(
                "  partition {partition} of node {node}: {}",
                if held.is_ok() {
                    "send held"
                } else {
                    "no send to hold"
                }
            );
            Some(hold)
        }
        _ => None,
    };
    cluster.pause(node)?;
    tokio::time::sleep(frozen).await;
    if let Some(hold) = hold {
        tokio::time::timeout(Duration::from_secs(30), hold.release_and_wait())
            .await
            .map_err(|_| "the held request was not answered in 30 s")?;
    }
    cluster.resume(node)?;
    Ok(())
}

/// After a fault: all nodes run, every partition is owned by one of them, each node owns
/// some, and every partition has been written again since `since_counts`.
async fn wait_recovered(
    servers: &Servers,
    cluster: &ReplicatorCluster,
    since_counts: &[u64],
) -> TestResult<Duration> {
    let started = Instant::now();
    let all: Vec<NodeId> = (1..=NODES).collect();
    cluster
        .wait_all_owned(&all, Duration::from_secs(60))
        .await?;
    let stalled = Stalled::every_partition(since_counts.to_vec());
    wait_resumed(servers, &stalled, Duration::from_secs(60)).await?;
    Ok(started.elapsed())
}

#[test]
fn seeded_fault_schedule_ends_with_an_exact_copy() -> TestResult {
    let seed = env_or("CHAOS_SEED", DEFAULT_SEED);
    let faults = env_or("CHAOS_FAULTS", DEFAULT_FAULTS);
    println!(
        "chaos: seed {seed} ({faults} faults); replay with CHAOS_SEED={seed} CHAOS_FAULTS={faults}"
    );
    serial(|| async move {
        let started = Instant::now();
        let (servers, cluster, producer) = fixture::start(NODES).await?;
        run_schedule(seed, faults, started, servers, cluster, producer).await
    })
}

#[test]
fn across_a_wan_a_seeded_fault_schedule_ends_with_an_exact_copy() -> TestResult {
    let seed = env_or("CHAOS_SEED", DEFAULT_WAN_SEED);
    let faults = env_or("CHAOS_FAULTS", DEFAULT_WAN_FAULTS);
    let rtt = 2 * wan::one_way()?.as_millis();
    println!(
        "chaos across {rtt} ms round trips: seed {seed} ({faults} faults); replay with \
         CHAOS_SEED={seed} CHAOS_FAULTS={faults} [HA_WAN_ONE_WAY_MS=<ms>]"
    );
    wan::across(async move |wan| {
        let started = Instant::now();
        let (servers, cluster, producer) = wan::start_across(wan).await?;
        run_schedule(seed, faults, started, servers, cluster, producer).await
    })
}

/// Runs the schedule of `seed` (`faults` long) on a running cluster, then stops the producer
/// and requires an exact copy.
async fn run_schedule(
    seed: u64,
    faults: usize,
    started: Instant,
    mut servers: Servers,
    mut cluster: ReplicatorCluster,
    producer: PacedProducer,
) -> TestResult {
    let mut failovers = Vec::new();
    let mut first_excess: Option<(usize, String)> = None;
    for (index, (pause, fault)) in schedule(seed, faults).into_iter().enumerate() {
        tokio::time::sleep(pause).await;
        let at = started.elapsed();
        let before = servers.downstream_counts();
        let mut failover = None;
        match fault {
            Fault::KillRestart(node) => {
                failover = kill_restart(&servers, &mut cluster, node).await?;
            }
            Fault::KillLeader => {
                let leader = cluster
                    .leader_status()
                    .await
                    .and_then(|s| s.leader)
                    .ok_or("no leader to kill")?;
                failover = kill_restart(&servers, &mut cluster, leader).await?;
            }
            Fault::Pause {
                node,
                frozen,
                mid_send,
            } => freeze(&servers, &mut cluster, node, frozen, mid_send).await?,
            Fault::RestartUpstream => servers.upstream.restart().await?,
            Fault::RestartDownstream => servers.downstream.restart().await?,
            Fault::DropUpstreamConnections => servers.upstream.faults().drop_connections(),
            Fault::DropDownstreamConnections => servers.downstream.faults().drop_connections(),
        }
        let recovery = wait_recovered(&servers, &cluster, &before)
            .await
            .map_err(|e| {
                format!(
                    "fault {} ({fault}) at {at:.1?}: no recovery: {e}; seed {seed}",
                    index + 1
                )
            })?;
        let shares: Vec<usize> = match cluster.leader_status().await {
            Some(status) => (1..=NODES)
                .map(|n| status.owned_by(&servers.topic, n).len())
                .collect(),
            None => Vec::new(),
        };
        println!(
            "fault {:>3} at {:>6.1} s: {fault:<32} failover {:>6}  recovered after {:.2} s, partitions per node {shares:?}",
            index + 1,
            at.as_secs_f64(),
            failover.map_or("-".to_owned(), |d: Duration| format!("{:.2} s", d.as_secs_f64())),
            recovery.as_secs_f64()
        );
        failovers.extend(failover);
        // More messages downstream than upstream can only be duplicates: name the fault. The
        // producer is running: downstream is read first, so that what was copied between the
        // two reads is upstream too (read the other way round, a batch produced and copied in
        // between looked like duplicates; the CI run of 2026-12-07 saw five so).
        let down = servers.downstream_counts();
        let up = servers.upstream_counts();
        let over: Vec<(usize, u64)> = (0..up.len())
            .filter(|p| down[*p] > up[*p])
            .map(|p| (p, down[p] - up[p]))
            .collect();
        if !over.is_empty() && first_excess.is_none() {
            println!(
                "  DUPLICATES after fault {} ({fault}): partition → extra messages {over:?}",
                index + 1
            );
            first_excess = Some((index + 1, fault.to_string()));
        }
    }

    let report = producer.stop().await?;
    let caught_up = servers.wait_caught_up(Duration::from_secs(90)).await;
    let (p50, max) = p50_max(&failovers);
    println!(
        "chaos: {faults} faults in {:.1} s; failover p50 {:.2} s, max {:.2} s ({} node kills); {} messages produced ({} failed sends), copied {}; catch-up: {caught_up:?}",
        started.elapsed().as_secs_f64(),
        p50.as_secs_f64(),
        max.as_secs_f64(),
        failovers.len(),
        report.produced,
        report.failed_sends,
        servers.downstream_counts().iter().sum::<u64>(),
    );
    // The table shows what differs even when the copy did not catch up.
    let exact = cluster.verify(Duration::from_secs(10)).await?;
    assert!(
        exact && caught_up.is_ok() && first_excess.is_none(),
        "not an exact copy (seed {seed}); first excess after fault {first_excess:?}"
    );
    cluster.passed();
    drop(cluster);
    servers.shutdown().await;
    Ok(())
}
