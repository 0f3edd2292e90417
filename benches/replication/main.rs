//! The replication benchmarks: the figures users pick a replicator by, each next to a baseline
//! measured in the same run.
//!
//! Scenarios (run all, or name some):
//! - `catchup`: copy 1 M messages of 256 B already in a 16-partition topic with a raw poll→send
//!   loop through the SDK, with one replicator instance and with a three-instance cluster;
//!   msgs/s, MB/s, CPU seconds per million messages, ratio to the raw loop.
//! - `latency`: a three-instance cluster follows topics produced at fixed rates; p50/p99/max
//!   of downstream append time minus upstream append time, and where the time goes.
//! - `failover`: repeated `kill -9` of a random instance while producing; time until its
//!   partitions are written again, then an exact `verify` (no loss, no duplicates).
//! - `scale`: 1,000 partitions (50 topics × 20) against 16, three instances: time to assign
//!   all units, RSS and CPU idle and under load, Raft entries per second, reassignment after
//!   an instance loss.
//! - `leader-kills` (only by name: about 6 minutes): 1,000 units (10 topics × 100) on three
//!   instances at low traffic, 50 × `kill -9` of the Raft leader; p50/p99/max of the time until
//!   the survivors agree on a new leader and until every unit is owned again, the slowest kill,
//!   then an exact `verify`. A kill that stalls past 60 s fails the run at that kill.
//! - `topology` (only by name: about 5 minutes): failover where several targets and flows
//!   meet, on three dev servers of its own: a target down while nodes are killed, a flow added
//!   by reload, fenced and unfenced targets mixed under kills.
//! - `vsr-failover` (only by name: under a minute): the target is an in-process three-replica
//!   Iggy 0.9 cluster (`TestCluster`) named by every replica's address, whatever the run's
//!   servers; 10 × kill of its primary (a view change) while three instances copy `BENCH_FAILOVER_RATE` msg/s
//!   into it; p50 and max of the time from the kill until the target's copy advances again
//!   (first partition, every partition), then an exact `verify`.
//!
//! ```text
//! cargo bench --bench replication                      # the default scenarios
//! cargo bench --bench replication -- catchup latency   # some of them
//! BENCH_LEADER_KILLS=3 cargo bench --bench replication -- leader-kills
//! cargo bench --bench replication -- vsr-failover     # the 0.9 target's primary killed
//! BENCH_NODE_BINARY=/old/target/release/iggy-replicator \
//!   cargo bench --bench replication -- topology       # an older build's nodes
//! BENCH_SOURCE_URL=iggy://user:pass@10.0.0.1:8090 \
//! BENCH_TARGET_URL=iggy://user:pass@10.0.0.2:8090 \
//!   cargo bench --bench replication -- catchup         # against real Iggy servers
//! ```
//!
//! Without URLs two `iggy-replicator dev-server` processes serve as the clusters. Replicator
//! nodes are `iggy-replicator run` processes (the servers, the node cluster and the producers
//! come from `replicator-harness`); CPU and RSS come from `/proc`. Every stream a
//! scenario creates is named `bench-…` and deleted at its end, also when it fails. Tuning
//! knobs are environment variables (see [`settings::Settings`]). The benchmarks print
//! markdown tables; they never fail on a number, only when a copy is not exact.

mod catchup;
mod env;
mod failover;
mod latency;
mod leader_kills;
mod load;
mod metrics;
mod report;
mod scale;
mod settings;
mod topology;
mod vsr_failover;

use std::process::ExitCode;
use std::time::Duration;

use replicator_harness::TestResult;

use crate::env::Endpoints;
use crate::settings::Settings;

/// The scenarios a run without names runs, in this order.
const DEFAULT_SCENARIOS: [&str; 4] = ["catchup", "latency", "failover", "scale"];
/// Every scenario that can be named; the ones not in [`DEFAULT_SCENARIOS`] take too long for
/// every run.
const SCENARIOS: [&str; 7] = [
    "catchup",
    "latency",
    "failover",
    "scale",
    "leader-kills",
    "topology",
    "vsr-failover",
];

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; anything else starting with `-` is ignored the same way.
    let mut chosen: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if chosen.is_empty() {
        chosen = DEFAULT_SCENARIOS.iter().map(|s| (*s).to_owned()).collect();
    }
    if let Some(unknown) = chosen.iter().find(|c| !SCENARIOS.contains(&c.as_str())) {
        eprintln!(
            "unknown scenario {unknown:?}; known: {}",
            SCENARIOS.join(", ")
        );
        return ExitCode::from(2);
    }
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("bad benchmark setting: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(&chosen, &settings));
    runtime.shutdown_timeout(Duration::from_secs(5));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(chosen: &[String], settings: &Settings) -> TestResult {
    let endpoints = Endpoints::from_env().await?;
    println!("# iggy-replicator benchmarks\n");
    println!("- servers: {}", endpoints.describe());
    println!("- machine: {}", settings::machine());
    if endpoints.nodes.path() != endpoints.binary.path() {
        println!("- nodes run: {}", endpoints.nodes.path().display());
    }
    println!("- settings: {settings}\n");
    for scenario in chosen {
        match scenario.as_str() {
            "catchup" => catchup::run(&endpoints, settings).await?,
            "latency" => latency::run(&endpoints, settings).await?,
            "failover" => failover::run(&endpoints, settings).await?,
            "scale" => scale::run(&endpoints, settings).await?,
            "leader-kills" => leader_kills::run(&endpoints, settings).await?,
            "topology" => topology::run(&endpoints, settings).await?,
            "vsr-failover" => vsr_failover::run(&endpoints, settings).await?,
            other => return Err(format!("unknown scenario {other}").into()),
        }
    }
    Ok(())
}
