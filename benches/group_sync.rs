//! Cost of the consumer-group sync: one round over 100 groups × 100 partitions (10,000
//! translated offsets), against in-process servers, from one pipeline that owns every
//! partition.
//!
//! Rounds measured, each by `Cutover::sync_groups` (what `flow promote` and the periodic task
//! run):
//! * `first`: groups missing on the target (created), every offset stored; translation from
//!   the writers' offset maps;
//! * `unchanged`: nothing moved upstream: the offsets are read on both sides, nothing stored;
//! * `moved`: every group moved on every partition: 10,000 offsets translated (maps) and
//!   stored;
//! * `moved, no maps`: the same after a restart of the pipeline (the writers' maps are empty,
//!   every translation searches the downstream partition).
//!
//! Run: `cargo bench --bench group_sync` (prints results; it does not gate).

use std::time::{Duration, Instant};

use replicator_harness::{connect, store_group_offsets, Topic};
use replicator_model::WorkUnit;
use replicator_pipeline::{ControlPlane, FlowParams, InMemoryControl, Pipeline, PipelineParams};

#[path = "common/mod.rs"]
mod common;

use common::BenchResult;

const PARTITIONS: u32 = 100;
const GROUPS: usize = 100;
const MESSAGES: u64 = 2_000;
const STREAM: &str = "bench";
const TOPIC: &str = "t";

fn main() -> BenchResult {
    common::block_on(run())
}

/// Offsets of group `g` in round `round`: spread over the first half of the partition,
/// different per group and partition, 300 further in every round (groups only move forward).
fn offsets(g: usize, round: u64) -> Vec<(u32, u64)> {
    (0..PARTITIONS)
        .map(|p| {
            let base = (g as u64 * 7919 + u64::from(p) * 104_729) % (MESSAGES / 2);
            (p, base + round * 300)
        })
        .collect()
}

async fn store_all(url: &str, round: u64) -> BenchResult {
    let client = connect(url).await?;
    for g in 0..GROUPS {
        store_group_offsets(
            &client,
            (STREAM, TOPIC),
            &format!("g-{g:03}"),
            &offsets(g, round),
        )
        .await?;
    }
    Ok(())
}

async fn run() -> BenchResult {
    let (servers, clusters) =
        common::backlog(Topic::new(STREAM, TOPIC, PARTITIONS), MESSAGES).await?;
    let up_url = servers.upstream.connection_string();
    store_all(&up_url, 0).await?;
    let mut flow = FlowParams::new("bench", "us", "eu", vec![format!("{STREAM}/*")]);
    flow.consumer_groups = vec!["g-*".into()];
    // The periodic rounds stay out of the way: every round here is run by hand.
    flow.consumer_group_sync_interval = Duration::from_secs(3600);
    let params = PipelineParams::new(1, clusters, vec![flow]);
    let control = InMemoryControl::new();
    let units: Vec<WorkUnit> = (0..PARTITIONS)
        .map(|p| WorkUnit::new("bench", STREAM, TOPIC, p))
        .collect();
    let pipeline = Pipeline::start(params.clone(), control.clone()).await?;
    let copying = Instant::now();
    while units
        .iter()
        .any(|u| control.progress(u).and_then(|p| p.confirmed) != Some(MESSAGES - 1))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "copied {} messages in {:.1} s; {GROUPS} groups × {PARTITIONS} partitions",
        u64::from(PARTITIONS) * MESSAGES,
        copying.elapsed().as_secs_f64()
    );
    println!(
        "{:<16} {:>9} {:>8} {:>8} {:>8} {:>7}",
        "round", "time", "offsets", "stored", "probes", "errors"
    );
    let round = |name: &'static str, pipeline: &Pipeline| {
        let cutover = pipeline.cutover();
        let units = units.clone();
        async move {
            let started = Instant::now();
            let report = cutover
                .sync_groups("bench", units)
                .await
                .ok_or("the flow does not sync groups")?;
            println!(
                "{name:<16} {:>7.2} s {:>8} {:>8} {:>8} {:>7}",
                started.elapsed().as_secs_f64(),
                report.offsets.len(),
                report.stored,
                report.probes,
                report.errors.len()
            );
            for e in report.errors.iter().take(3) {
                println!("  error: {e}");
            }
            BenchResult::Ok(())
        }
    };
    round("first", &pipeline).await?;
    round("unchanged", &pipeline).await?;
    store_all(&up_url, 1).await?;
    round("moved", &pipeline).await?;
    pipeline.shutdown().await;
    store_all(&up_url, 2).await?;
    let pipeline = Pipeline::start(params, control.clone()).await?;
    round("moved, no maps", &pipeline).await?;
    round("unchanged", &pipeline).await?;
    pipeline.shutdown().await;
    Ok(())
}
