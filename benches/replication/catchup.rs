//! Catch-up throughput: a topic already holding `BENCH_MESSAGES` messages is copied by (a) a raw
//! poll→send loop through the SDK, (b) one replicator instance, (c) three instances; the
//! variants alternate within each round so that they share the machine's state.

use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, delete_stream, ensure_topic, raw_copy, Cluster, RawCopy, TestResult, Topic, Watch,
};

use crate::env::{
    fill, own_cpu_seconds, replication_spec, run_name, total_cpu, Endpoints, FILL_BATCH,
    PAYLOAD_BYTES,
};
use crate::metrics::Stages;
use crate::report::median_range;
use crate::settings::Settings;

/// Partitions of the catch-up topic.
const PARTITIONS: u32 = 16;
/// Topic name (in a stream named per run).
const TOPIC: &str = "t";

/// The three ways to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The baseline: poll→send through the SDK, nothing else.
    RawLoop,
    /// `iggy-replicator run`, one instance.
    OneInstance,
    /// `iggy-replicator run`, a three-instance cluster.
    ThreeInstances,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::RawLoop => "(a) raw poll→send loop",
            Variant::OneInstance => "(b) replicator, 1 instance",
            Variant::ThreeInstances => "(c) replicator, 3 instances",
        }
    }
}

/// One copy of the whole topic.
#[derive(Debug, Clone, Copy)]
struct Sample {
    variant: Variant,
    /// From the start (process spawn for the replicator) to the last message downstream.
    total: Duration,
    /// From the first message downstream to the last.
    copying: Duration,
    /// CPU seconds of the copier (the loop, or the sum of the replicator processes).
    cpu: f64,
    /// CPU seconds of the two dev servers meanwhile (0 for external servers).
    server_cpu: f64,
}

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    let stream = run_name("catchup");
    let per_partition = (settings.messages / u64::from(PARTITIONS)).max(1);
    let messages = per_partition * u64::from(PARTITIONS);
    println!(
        "## Catch-up: {messages} messages of {PAYLOAD_BYTES} B in {PARTITIONS} partitions, batches of {FILL_BATCH}, {} connection(s) per cluster\n",
        settings.connections
    );
    let outcome = measure_all(endpoints, settings, &stream, per_partition).await;
    let cleanup = delete_stream(&endpoints.upstream, &stream).await;
    let samples = outcome?;
    cleanup?;
    print_table(&samples, messages, endpoints.external());
    Ok(())
}

async fn measure_all(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    per_partition: u64,
) -> TestResult<Vec<Sample>> {
    let up = connect(&endpoints.upstream).await?;
    ensure_topic(&up, stream, TOPIC, PARTITIONS).await?;
    up.shutdown().await?;
    let filling = Instant::now();
    fill(
        &endpoints.upstream,
        stream,
        TOPIC,
        PARTITIONS,
        per_partition,
        4,
    )
    .await?;
    println!(
        "filled upstream in {:.1} s\n",
        filling.elapsed().as_secs_f64()
    );
    let mut samples = Vec::new();
    for round in 1..=settings.rounds {
        for variant in [
            Variant::RawLoop,
            Variant::OneInstance,
            Variant::ThreeInstances,
        ] {
            let sample =
                copy_once(endpoints, settings, stream, per_partition, variant, round).await?;
            println!(
                "round {round}: {:<28} {:>6.2} s copying, {:>6.2} s in all, {:.2} CPU s",
                variant.label(),
                sample.copying.as_secs_f64(),
                sample.total.as_secs_f64(),
                sample.cpu
            );
            samples.push(sample);
        }
    }
    println!();
    Ok(samples)
}

/// Copies the topic once with `variant` into a downstream stream of its own, then deletes it.
async fn copy_once(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    per_partition: u64,
    variant: Variant,
    round: u32,
) -> TestResult<Sample> {
    let messages = per_partition * u64::from(PARTITIONS);
    // The replicator names its downstream stream `<source alias>.<stream>`.
    let alias = format!(
        "r{round}{}",
        if variant == Variant::ThreeInstances {
            "c"
        } else {
            "b"
        }
    );
    let down_stream = match variant {
        Variant::RawLoop => format!("raw{round}.{stream}"),
        _ => format!("{alias}.{stream}"),
    };
    let servers = endpoints.server_pids();
    let server_cpu_before = total_cpu(&servers);
    let outcome = async {
        match variant {
            Variant::RawLoop => {
                let down = connect(&endpoints.downstream).await?;
                ensure_topic(&down, &down_stream, TOPIC, PARTITIONS).await?;
                down.shutdown().await?;
                let cpu_before = own_cpu_seconds();
                let started = Instant::now();
                raw_copy(&RawCopy {
                    source: endpoints.upstream.clone(),
                    target: endpoints.downstream.clone(),
                    topic: Topic::new(stream, TOPIC, PARTITIONS),
                    target_stream: down_stream.clone(),
                    per_partition,
                    batch: FILL_BATCH as u32,
                    connections: settings.connections,
                })
                .await?;
                let total = started.elapsed();
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                    total,
                    total,
                    own_cpu_seconds() - cpu_before,
                ))
            }
            Variant::OneInstance | Variant::ThreeInstances => {
                let nodes = if variant == Variant::OneInstance { 1 } else { 3 };
                let spec = replication_spec(
                    endpoints,
                    &alias,
                    &format!("{stream}/*"),
                    true,
                    settings,
                    PARTITIONS as usize,
                );
                let watch = Watch::new(&endpoints.downstream, &down_stream, TOPIC).await?;
                let started = Instant::now();
                let waiting = tokio::spawn(async move {
                    let times = watch
                        .wait_total(messages, started, Duration::from_secs(600))
                        .await;
                    (watch, times)
                });
                let mut cluster = Cluster::start(spec, nodes).await?;
                let (watch, times) = waiting.await?;
                let (first, total) = times?;
                let pids: Vec<u32> = cluster.pids().into_values().collect();
                let cpu = total_cpu(&pids);
                let (poll_ms, polls, send_ms, sends) =
                    Stages::default().since(&Stages::read(&cluster).await?);
                println!(
                    "round {round}: {}: {polls:.0} polls of {poll_ms:.2} ms mean, {sends:.0} sends of {send_ms:.2} ms mean",
                    variant.label()
                );
                let copied = watch.total().await?;
                watch.close().await;
                if copied != messages {
                    return Err(format!("copy not exact: {copied} of {messages} messages").into());
                }
                cluster.passed();
                drop(cluster);
                Ok((total, total.saturating_sub(first), cpu))
            }
        }
    }
    .await;
    let server_cpu = total_cpu(&servers) - server_cpu_before;
    let cleanup = delete_stream(&endpoints.downstream, &down_stream).await;
    let (total, copying, cpu) = outcome?;
    cleanup?;
    Ok(Sample {
        variant,
        total,
        copying,
        cpu,
        server_cpu,
    })
}

/// Prints the table; the server CPU column is `n/a` for external servers (not our processes).
fn print_table(samples: &[Sample], messages: u64, external_servers: bool) {
    let millions = messages as f64 / 1e6;
    let of = |variant: Variant| -> Vec<Sample> {
        samples
            .iter()
            .filter(|s| s.variant == variant)
            .copied()
            .collect()
    };
    let raw = of(Variant::RawLoop);
    println!("| variant | msgs/s while copying | payload MB/s | wall time incl. start (s) | copier CPU s per 1M msgs | server CPU s per 1M msgs | ratio to (a), per round |");
    println!("|---|---|---|---|---|---|---|");
    for variant in [
        Variant::RawLoop,
        Variant::OneInstance,
        Variant::ThreeInstances,
    ] {
        let mine = of(variant);
        let rate: Vec<f64> = mine
            .iter()
            .map(|s| messages as f64 / s.copying.as_secs_f64())
            .collect();
        let mb: Vec<f64> = rate
            .iter()
            .map(|r| r * PAYLOAD_BYTES as f64 / 1e6)
            .collect();
        let total: Vec<f64> = mine.iter().map(|s| s.total.as_secs_f64()).collect();
        let cpu: Vec<f64> = mine.iter().map(|s| s.cpu / millions).collect();
        let server: Vec<f64> = mine.iter().map(|s| s.server_cpu / millions).collect();
        let ratio: Vec<f64> = mine
            .iter()
            .zip(&raw)
            .map(|(s, r)| r.copying.as_secs_f64() / s.copying.as_secs_f64())
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            variant.label(),
            median_range(&rate, 0),
            median_range(&mb, 1),
            median_range(&total, 2),
            median_range(&cpu, 2),
            if external_servers {
                "n/a".to_owned()
            } else {
                median_range(&server, 2)
            },
            median_range(&ratio, 2),
        );
    }
    println!("\nmedian (min–max) over rounds; \"while copying\" runs from the first message downstream to the last, \"wall time\" also counts process start, Raft election and assignment.\n");
}
