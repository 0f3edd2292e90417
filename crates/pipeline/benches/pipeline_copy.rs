//! End-to-end catch-up and latency bench of one pipeline instance against two in-process servers.
//!
//! 1. Catch-up: 16 partitions, 256-byte messages, N already produced (`PIPELINE_BENCH_MESSAGES`,
//!    default 1,000,000). The same servers copy the same topic with a raw poll→send loop (same
//!    batch size, same number of connections) and with the pipeline; msgs/s, MB/s and the ratio.
//!    Connection counts to compare: `PIPELINE_BENCH_CONNECTIONS` (default "1,4").
//! 2. Latency: the pipeline follows a topic produced at a fixed rate (`PIPELINE_BENCH_RATE`,
//!    default 20,000 msg/s, for `PIPELINE_BENCH_SECONDS`, default 5); p50/p99/max of downstream
//!    append time minus upstream append time.
//!
//! Run: `cargo bench -p replicator-pipeline --bench pipeline_copy`. It prints; it never fails on
//! a number.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::*;
use replicator_pipeline::{ClusterParams, FlowParams, InMemoryControl, Pipeline, PipelineParams};
use replicator_testkit::{TestServer, TestServerConfig};

const PARTITIONS: u32 = 16;
const PAYLOAD: usize = 256;
const BATCH: u32 = 1000;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

async fn client(server: &TestServer) -> BenchResult<IggyClient> {
    let c = IggyClient::from_connection_string(&format!(
        "{}?nodelay=true",
        server.connection_string()
    ))?;
    c.connect().await?;
    Ok(c)
}

async fn create_topic(c: &IggyClient, stream: &str, topic: &str) -> BenchResult {
    if c.get_stream(&Identifier::named(stream)?).await?.is_none() {
        c.create_stream(stream).await?;
    }
    c.create_topic(
        &Identifier::named(stream)?,
        topic,
        PARTITIONS,
        CompressionAlgorithm::None,
        None,
        IggyExpiry::NeverExpire,
        MaxTopicSize::Unlimited,
    )
    .await?;
    Ok(())
}

fn batch(n: u64) -> BenchResult<Vec<IggyMessage>> {
    let payload = Bytes::from(vec![0xAB; PAYLOAD]);
    Ok((0..n)
        .map(|_| IggyMessage::builder().payload(payload.clone()).build())
        .collect::<Result<_, _>>()?)
}

async fn fill(server: &TestServer, stream: &str, per_partition: u64) -> BenchResult {
    let c = client(server).await?;
    let (s, t) = (Identifier::named(stream)?, Identifier::named("t")?);
    for p in 0..PARTITIONS {
        let mut sent = 0;
        while sent < per_partition {
            let n = (per_partition - sent).min(u64::from(BATCH));
            c.send_messages(&s, &t, &Partitioning::partition_id(p), &mut batch(n)?)
                .await?;
            sent += n;
        }
    }
    c.shutdown().await?;
    Ok(())
}

/// The raw loop: per worker one connection to each side, round robin over its partitions.
async fn raw_worker(
    source: IggyClient,
    target: IggyClient,
    partitions: Vec<u32>,
    per_partition: u64,
) -> BenchResult<u64> {
    let (s, t) = (Identifier::named("bench")?, Identifier::named("t")?);
    let ts = Identifier::named("raw")?;
    let consumer = Consumer::new(Identifier::named("bench-raw")?);
    let mut next = vec![0u64; partitions.len()];
    let mut copied = 0;
    loop {
        let mut progressed = false;
        for (i, p) in partitions.iter().enumerate() {
            if next[i] >= per_partition {
                continue;
            }
            let mut polled = source
                .poll_messages(
                    &s,
                    &t,
                    Some(*p),
                    &consumer,
                    &PollingStrategy::offset(next[i]),
                    BATCH,
                    false,
                )
                .await?;
            let Some(last) = polled.messages.last().map(|m| m.header.offset) else {
                continue;
            };
            copied += polled.messages.len() as u64;
            target
                .send_messages(
                    &ts,
                    &t,
                    &Partitioning::partition_id(*p),
                    &mut polled.messages,
                )
                .await?;
            next[i] = last + 1;
            progressed = true;
        }
        if !progressed {
            break;
        }
    }
    source.shutdown().await?;
    target.shutdown().await?;
    Ok(copied)
}

async fn raw_copy(
    source: &TestServer,
    target: &TestServer,
    workers: u32,
    per_partition: u64,
) -> BenchResult<Duration> {
    let c = client(target).await?;
    create_topic(&c, "raw", "t").await?;
    c.shutdown().await?;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let partitions: Vec<u32> = (0..PARTITIONS).filter(|p| p % workers == w).collect();
        tasks.push((partitions, client(source).await?, client(target).await?));
    }
    let started = Instant::now();
    let handles: Vec<_> = tasks
        .into_iter()
        .map(|(ps, s, t)| tokio::spawn(raw_worker(s, t, ps, per_partition)))
        .collect();
    let mut copied = 0;
    for h in handles {
        copied += h.await??;
    }
    let elapsed = started.elapsed();
    assert_eq!(copied, per_partition * u64::from(PARTITIONS));
    Ok(elapsed)
}

fn params(
    source: &TestServer,
    target: &TestServer,
    include: &str,
    connections: usize,
    provenance: bool,
) -> PipelineParams {
    let mut clusters = BTreeMap::new();
    let mut up = ClusterParams::new(source.connection_string());
    up.connections = connections;
    let mut down = ClusterParams::new(target.connection_string());
    down.connections = connections;
    clusters.insert("us".to_owned(), up);
    clusters.insert("eu".to_owned(), down);
    let mut flow = FlowParams::new("bench", "us", "eu", vec![include.to_owned()]);
    flow.batch_size = BATCH;
    flow.poll_interval = Duration::from_millis(1);
    flow.provenance = provenance;
    let mut p = PipelineParams::new(1, clusters, vec![flow]);
    p.discovery_interval = Duration::from_millis(100);
    p
}

fn downstream_count(target: &TestServer, stream: &str) -> u64 {
    (0..PARTITIONS)
        .map(|p| {
            target
                .partition_info(stream, "t", p)
                .map(|i| i.messages_count)
                .unwrap_or(0)
        })
        .sum()
}

async fn pipeline_copy(
    source: &TestServer,
    target: &TestServer,
    connections: usize,
    provenance: bool,
    total: u64,
) -> BenchResult<Duration> {
    let started = Instant::now();
    let pipeline = Pipeline::start(
        params(source, target, "bench/*", connections, provenance),
        InMemoryControl::new(),
    )
    .await?;
    let mut first = None;
    loop {
        let copied = downstream_count(target, "bench");
        if copied > 0 && first.is_none() {
            first = Some(started.elapsed());
        }
        if copied >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    if let Some(first) = first {
        println!(
            "  (start-up, start to first message downstream: {:.0} ms)",
            first.as_secs_f64() * 1e3
        );
    }
    pipeline.shutdown().await;
    Ok(elapsed)
}

fn rate(label: &str, messages: u64, bytes_per_message: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    let mps = messages as f64 / secs;
    println!(
        "{label:<44} {messages} msgs in {secs:>6.2} s: {mps:>9.0} msg/s, {:>6.1} MB/s",
        (messages * bytes_per_message) as f64 / secs / 1e6
    );
    mps
}

async fn catch_up(total: u64, connections: &[u32]) -> BenchResult {
    let per_partition = total / u64::from(PARTITIONS);
    let total = per_partition * u64::from(PARTITIONS);
    let source = TestServer::start(TestServerConfig::default()).await?;
    let c = client(&source).await?;
    create_topic(&c, "bench", "t").await?;
    c.shutdown().await?;
    fill(&source, "bench", per_partition).await?;
    // Stored bytes per message: 64-byte header + payload (provenance adds about 110 bytes).
    let message_bytes = 64 + PAYLOAD as u64;
    for &conns in connections {
        for provenance in [true, false] {
            let target = TestServer::start(TestServerConfig::default()).await?;
            let raw = raw_copy(&source, &target, conns, per_partition).await?;
            let piped = pipeline_copy(&source, &target, conns as usize, provenance, total).await?;
            let raw_rate = rate(
                &format!("raw poll→send, {conns} conn(s)"),
                total,
                message_bytes,
                raw,
            );
            let pipe_rate = rate(
                &format!(
                    "pipeline, {conns} conn(s), provenance {}",
                    if provenance { "on" } else { "off" }
                ),
                total,
                message_bytes,
                piped,
            );
            println!(
                "{:<44} {:.2}x",
                "ratio pipeline / raw",
                pipe_rate / raw_rate
            );
            target.shutdown().await;
        }
    }
    source.shutdown().await;
    Ok(())
}

async fn latency(rate_per_sec: u64, seconds: u64) -> BenchResult {
    let source = TestServer::start(TestServerConfig::default()).await?;
    let target = TestServer::start(TestServerConfig::default()).await?;
    let c = client(&source).await?;
    create_topic(&c, "lat", "t").await?;
    let pipeline = Pipeline::start(
        params(&source, &target, "lat/*", 1, true),
        InMemoryControl::new(),
    )
    .await?;
    // Wait until the pipeline has mirrored the topic and runs its units.
    while target.partition_info("lat", "t", PARTITIONS - 1).is_err() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tick = Duration::from_millis(10);
    let per_tick = rate_per_sec * tick.as_millis() as u64 / 1000;
    let (s, t) = (Identifier::named("lat")?, Identifier::named("t")?);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut produced = 0u64;
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut partition = 0u32;
    while Instant::now() < end {
        interval.tick().await;
        // Spread each tick's messages over the partitions in small batches.
        let per_send = per_tick.div_ceil(u64::from(PARTITIONS)).max(1);
        let mut left = per_tick;
        while left > 0 {
            let n = left.min(per_send);
            c.send_messages(
                &s,
                &t,
                &Partitioning::partition_id(partition),
                &mut batch(n)?,
            )
            .await?;
            partition = (partition + 1) % PARTITIONS;
            left -= n;
            produced += n;
        }
    }
    while downstream_count(&target, "lat") < produced {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pipeline.shutdown().await;
    let d = client(&target).await?;
    let consumer = Consumer::new(Identifier::named("bench-lat")?);
    let mut samples = Vec::with_capacity(produced as usize);
    for p in 0..PARTITIONS {
        let mut up_ts = Vec::new();
        let mut at = 0;
        loop {
            let polled = c
                .poll_messages(
                    &s,
                    &t,
                    Some(p),
                    &consumer,
                    &PollingStrategy::offset(at),
                    BATCH,
                    false,
                )
                .await?;
            let Some(last) = polled.messages.last().map(|m| m.header.offset) else {
                break;
            };
            up_ts.extend(polled.messages.iter().map(|m| m.header.timestamp));
            at = last + 1;
        }
        at = 0;
        loop {
            let polled = d
                .poll_messages(
                    &s,
                    &t,
                    Some(p),
                    &consumer,
                    &PollingStrategy::offset(at),
                    BATCH,
                    false,
                )
                .await?;
            let Some(last) = polled.messages.last().map(|m| m.header.offset) else {
                break;
            };
            for m in &polled.messages {
                let found = replicator_pipeline::provenance::find(m.user_headers.as_deref());
                if let Some(ts) = found.offset.and_then(|o| up_ts.get(o as usize)) {
                    samples.push(m.header.timestamp.saturating_sub(*ts));
                }
            }
            at = last + 1;
        }
    }
    samples.sort_unstable();
    let pct = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    println!(
        "latency at {rate_per_sec} msg/s for {seconds} s ({} samples): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        samples.len(),
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    c.shutdown().await?;
    d.shutdown().await?;
    source.shutdown().await;
    target.shutdown().await;
    Ok(())
}

fn main() -> BenchResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let total = env_u64("PIPELINE_BENCH_MESSAGES", 1_000_000);
        let connections: Vec<u32> = std::env::var("PIPELINE_BENCH_CONNECTIONS")
            .unwrap_or_else(|_| "1,4".into())
            .split(',')
            .filter_map(|c| c.trim().parse().ok())
            .filter(|c| (1..=PARTITIONS).contains(c))
            .collect();
        catch_up(total, &connections).await?;
        latency(
            env_u64("PIPELINE_BENCH_RATE", 20_000),
            env_u64("PIPELINE_BENCH_SECONDS", 5),
        )
        .await
    })
}
