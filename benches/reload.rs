//! How long a config reload stops a flow it leaves unchanged: one pipeline copies a throttled
//! backlog (a steady stream); it is replaced as a reload replaces it (`shutdown_keeping` the
//! flow, then a new pipeline), and the copy's stop is measured from the start of the drain to
//! the first offset the new pipeline confirms. Repeated `BENCH_RELOADS` (10) times.
//!
//! Run: `cargo bench --bench reload` (prints results; it does not gate).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use replicator_harness::Topic;
use replicator_model::WorkUnit;
use replicator_pipeline::{FlowParams, InMemoryControl, Pipeline, PipelineParams};

#[path = "common/mod.rs"]
mod common;

use common::BenchResult;

const PARTITIONS: u32 = 16;
/// The flow's rate: the backlog lasts the whole run.
const RATE: u64 = 20_000;

fn main() -> BenchResult {
    common::block_on(run())
}

async fn run() -> BenchResult {
    let reloads: u32 = std::env::var("BENCH_RELOADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let per_partition = RATE * (u64::from(reloads) * 2 + 10) / u64::from(PARTITIONS);
    let (_servers, clusters) =
        common::backlog(Topic::new("reload", "t", PARTITIONS), per_partition).await?;
    let mut flow = FlowParams::new("reload", "us", "eu", vec!["reload/*".into()]);
    flow.max_messages_per_second = Some(RATE);
    let params = || PipelineParams::new(1, clusters.clone(), vec![flow.clone()]);
    let control = InMemoryControl::new();
    let units: Vec<WorkUnit> = (0..PARTITIONS)
        .map(|p| WorkUnit::new("reload", "reload", "t", p))
        .collect();
    let mut pipeline = Pipeline::start(params(), control.clone()).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut drains = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..reloads {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let began = Instant::now();
        pipeline
            .shutdown_keeping(BTreeSet::from(["reload".to_owned()]))
            .await;
        drains.push(began.elapsed());
        let before = common::copied(&control, &units);
        pipeline = Pipeline::start(params(), control.clone()).await?;
        while common::copied(&control, &units) <= before {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stops.push(began.elapsed());
    }
    pipeline.shutdown().await;
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    stops.sort();
    drains.sort();
    let median = |v: &[Duration]| ms(&v[v.len() / 2]);
    println!(
        "{reloads} reloads of a pipeline copying {RATE} msg/s over {PARTITIONS} partitions, flow kept: \
         drain median {:.0} ms (max {:.0}); copy stopped median {:.0} ms (max {:.0})",
        median(&drains),
        drains.last().map_or(0.0, ms),
        median(&stops),
        stops.last().map_or(0.0, ms),
    );
    Ok(())
}
