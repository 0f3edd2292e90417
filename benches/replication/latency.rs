//! Steady-state latency: a three-instance cluster with default settings follows topics produced
//! at fixed rates; per message, downstream append time minus upstream append time. The nodes'
//! poll and send histograms say where the time goes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_harness::{TestResult, Topic, Watch};

use crate::env::{cleaned_up, run_name, start_three_nodes, Endpoints};
use crate::load::{append_latencies_us, paced};
use crate::metrics::Stages;
use crate::report::{ms_from_us, percentile_of_sorted};
use crate::settings::Settings;

/// Partitions of every latency topic.
const PARTITIONS: u32 = 16;

/// How long the measured rate runs before its window opens.
const SETTLE: Duration = Duration::from_secs(2);

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    let stream = run_name("latency");
    println!(
        "## Latency: three instances, defaults, {PARTITIONS} partitions per topic, {} s per rate\n",
        settings.latency_seconds
    );
    cleaned_up(endpoints, &stream, measure(endpoints, settings, &stream)).await
}

async fn measure(endpoints: &Endpoints, settings: &Settings, stream: &str) -> TestResult {
    let topics: BTreeMap<u64, String> = settings
        .rates
        .iter()
        .map(|rate| (*rate, format!("r{rate}")))
        .collect();
    let names: Vec<String> = topics.values().cloned().collect();
    let (mut cluster, _, _wan) =
        start_three_nodes(endpoints, settings, stream, &names, PARTITIONS).await?;
    println!("| offered msg/s | achieved msg/s | p50 ms | p99 ms | max ms | mean poll ms (polls) | mean send ms (sends) | poll / send / node's latency p99 ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for (rate, topic) in &topics {
        // Warm-up: the nodes connect to the servers lazily, and the first message of every
        // partition pays for connecting and logging in; those are not the steady state.
        let targets = Topic::new(stream, topic.as_str(), PARTITIONS).targets();
        let warm_up = paced(&endpoints.upstream, targets.clone(), (*rate).min(2_000));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let warmed = warm_up.stop().await?.produced;
        let watch = Watch::new(&endpoints.downstream, stream, topic).await?;
        watch
            .wait_total(warmed, Instant::now(), Duration::from_secs(60))
            .await?;
        // The measured rate runs a while before the window opens: partitions far from their
        // source went idle in the pause above, and their wake-up (up to two and a half round
        // trips at 200 ms) is not the steady state the figures are of (BENCHMARKS.md
        // section 38). The window starts at the downstream's counts then.
        let producer = paced(&endpoints.upstream, targets, *rate);
        tokio::time::sleep(SETTLE).await;
        let from = watch.counts().await?;
        let before = Stages::read(&cluster).await?;
        let produced_before = producer.produced();
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(settings.latency_seconds)).await;
        let produced = producer.stop().await?.produced;
        let elapsed = started.elapsed();
        let in_window = produced.saturating_sub(produced_before);
        watch
            .wait_total(warmed + produced, Instant::now(), Duration::from_secs(120))
            .await?;
        watch.close().await;
        let after = Stages::read(&cluster).await?;
        let latencies = append_latencies_us(
            &endpoints.upstream,
            &endpoints.downstream,
            (stream, stream),
            topic,
            &from,
        )
        .await?;
        let (poll_ms, polls, send_ms, sends) = before.since(&after);
        let [poll_p99, send_p99, node_p99] = before.p99_bounds(&after);
        println!(
            "| {rate} | {:.0} | {} | {} | {} | {poll_ms:.2} ({polls:.0}) | {send_ms:.2} ({sends:.0}) | {poll_p99} / {send_p99} / {node_p99} |",
            in_window as f64 / elapsed.as_secs_f64(),
            ms_from_us(percentile_of_sorted(&latencies, 50.0)),
            ms_from_us(percentile_of_sorted(&latencies, 99.0)),
            ms_from_us(latencies.last().copied().unwrap_or_default()),
        );
        // A short idle gap keeps one rate's backlog out of the next one's figures.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!("\nlatency = downstream append timestamp − upstream append timestamp of every message of the window, which opens once the rate has run for 2 s (both servers on one clock); a caught-up partition is polled every `poll_interval` (default 5 ms), so a message waits up to that long before the poll that takes it, then one poll and one send. The p99 of polls, sends and the nodes' own latency (each batch's newest message, from its upstream append to the node's acknowledgement) are bucket bounds of the nodes' histograms (buckets double from 0.1 ms).\n");
    cluster.passed();
    Ok(())
}
