//! How closely a throttled catch-up holds its limit: a backlog far larger than the limit allows
//! in the window, copied by one pipeline under `max_messages_per_second`; the rate is measured
//! over `BENCH_THROTTLE_SECONDS` (30) after a warm-up that spends the one-second burst.
//!
//! Run: `cargo bench --bench throttle` (prints results; it does not gate). Goal: within ±5 %.

use std::time::{Duration, Instant};

use replicator_harness::Topic;
use replicator_model::WorkUnit;
use replicator_pipeline::{FlowParams, InMemoryControl, Pipeline, PipelineParams};

#[path = "common/mod.rs"]
mod common;

use common::BenchResult;

const PARTITIONS: u32 = 4;
const LIMIT: u64 = 5_000;

fn main() -> BenchResult {
    common::block_on(run())
}

async fn run() -> BenchResult {
    let seconds: u64 = std::env::var("BENCH_THROTTLE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let per_partition = LIMIT * (seconds + 10) / u64::from(PARTITIONS);
    let (_servers, clusters) =
        common::backlog(Topic::new("throttle", "t", PARTITIONS), per_partition).await?;
    let mut flow = FlowParams::new("throttle", "us", "eu", vec!["throttle/*".into()]);
    flow.max_messages_per_second = Some(LIMIT);
    let control = InMemoryControl::new();
    let units: Vec<WorkUnit> = (0..PARTITIONS)
        .map(|p| WorkUnit::new("throttle", "throttle", "t", p))
        .collect();
    let pipeline = Pipeline::start(
        PipelineParams::new(1, clusters, vec![flow]),
        control.clone(),
    )
    .await?;
    // Warm-up: the burst (one second of the limit) and the start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (from, started) = (common::copied(&control, &units), Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (to, elapsed) = (common::copied(&control, &units), started.elapsed());
    let rate = (to - from) as f64 / elapsed.as_secs_f64();
    let deviation = (rate / LIMIT as f64 - 1.0) * 100.0;
    println!(
        "limit {LIMIT} msg/s over {PARTITIONS} partitions; measured over {:.1} s: {rate:.0} msg/s ({deviation:+.1} %); backlog left {}",
        elapsed.as_secs_f64(),
        u64::from(PARTITIONS) * per_partition - to
    );
    pipeline.shutdown().await;
    Ok(())
}
