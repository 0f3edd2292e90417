//! Raw poll→send copy loop through the `iggy` SDK between two in-process `TestServer`s:
//! 16 partitions, 256-byte messages, batches of 1000 (the speed criterion: at least half
//! of the ~1.1 M msg/s a real Iggy 0.8.0 pair reaches on a 2-core machine).
//!
//! `cargo bench -p replicator-testkit --bench raw_copy`; knobs (environment):
//! `RAW_COPY_MESSAGES` (total, default 1_600_000), `RAW_COPY_WORKERS` (concurrent copy tasks,
//! each with its own source and target connection and a share of the partitions; default 16),
//! `RAW_COPY_OPTIONS` (connection-string options, e.g. `nodelay=true`).
//! Prints messages/s and MB/s of the timed copy phase, and the process CPU time it used (on a
//! shared machine, messages per CPU-second shows what an idle 2-core machine would do).
//! Measures, never asserts a speed.

use bytes::Bytes;
use iggy::prelude::*;
use replicator_testkit::{TestServer, TestServerConfig};
use std::time::Instant;

const PARTITIONS: u32 = 16;
const PAYLOAD: usize = 256;
const BATCH: u32 = 1000;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

async fn client(server: &TestServer) -> BenchResult<IggyClient> {
    let mut url = server.connection_string();
    if let Ok(options) = std::env::var("RAW_COPY_OPTIONS") {
        url = format!("{url}?{options}");
    }
    let client = IggyClient::from_connection_string(&url)?;
    client.connect().await?;
    Ok(client)
}

async fn create_topic(client: &IggyClient) -> BenchResult {
    client.create_stream("bench").await?;
    client
        .create_topic(
            &Identifier::named("bench")?,
            "t",
            PARTITIONS,
            CompressionAlgorithm::None,
            None,
            IggyExpiry::NeverExpire,
            MaxTopicSize::Unlimited,
        )
        .await?;
    Ok(())
}

async fn fill(server: &TestServer, per_partition: u64) -> BenchResult {
    let client = client(server).await?;
    let (s, t) = (Identifier::named("bench")?, Identifier::named("t")?);
    let payload = Bytes::from(vec![0xAB; PAYLOAD]);
    for p in 0..PARTITIONS {
        let mut sent = 0;
        while sent < per_partition {
            let n = (per_partition - sent).min(u64::from(BATCH));
            let mut batch: Vec<IggyMessage> = (0..n)
                .map(|_| IggyMessage::builder().payload(payload.clone()).build())
                .collect::<Result<_, _>>()?;
            client
                .send_messages(&s, &t, &Partitioning::partition_id(p), &mut batch)
                .await?;
            sent += n;
        }
    }
    client.shutdown().await?;
    Ok(())
}

/// Copies `partitions` from source to target until each holds `per_partition` messages.
async fn copy(
    source: IggyClient,
    target: IggyClient,
    partitions: Vec<u32>,
    per_partition: u64,
) -> BenchResult<u64> {
    let (s, t) = (Identifier::named("bench")?, Identifier::named("t")?);
    let consumer = Consumer::new(Identifier::named("bench-copy")?);
    let mut next: Vec<u64> = vec![0; partitions.len()];
    let mut copied = 0u64;
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
            let n = polled.messages.len() as u64;
            target
                .send_messages(
                    &s,
                    &t,
                    &Partitioning::partition_id(*p),
                    &mut polled.messages,
                )
                .await?;
            next[i] = last + 1;
            copied += n;
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

async fn run() -> BenchResult {
    let total = env_or("RAW_COPY_MESSAGES", 1_600_000);
    let workers = env_or("RAW_COPY_WORKERS", 16).clamp(1, u64::from(PARTITIONS)) as u32;
    let per_partition = total / u64::from(PARTITIONS);
    let source = TestServer::start(TestServerConfig::default()).await?;
    let target = TestServer::start(TestServerConfig::default()).await?;
    for server in [&source, &target] {
        let c = client(server).await?;
        create_topic(&c).await?;
        c.shutdown().await?;
    }
    fill(&source, per_partition).await?;

    let mut tasks = Vec::new();
    for w in 0..workers {
        let partitions: Vec<u32> = (0..PARTITIONS).filter(|p| p % workers == w).collect();
        let (src, dst) = (client(&source).await?, client(&target).await?);
        tasks.push((partitions, src, dst));
    }
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let handles: Vec<_> = tasks
        .into_iter()
        .map(|(partitions, src, dst)| tokio::spawn(copy(src, dst, partitions, per_partition)))
        .collect();
    let mut copied = 0;
    for h in handles {
        copied += h.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds().zip(cpu_before).map(|(a, b)| a - b);
    let bytes = copied as f64 * PAYLOAD as f64;
    println!(
        "raw_copy: {copied} messages ({PARTITIONS} partitions, {PAYLOAD} B payload, batches of {BATCH}, {workers} workers) in {elapsed:.2} s: {:.0} msg/s, {:.1} MB/s payload",
        copied as f64 / elapsed,
        bytes / elapsed / 1e6
    );
    if let Some(cpu) = cpu {
        println!(
            "raw_copy: process CPU time {cpu:.2} s ({:.0} % of 2 cores): {:.0} msg per CPU-second, {:.0} msg/s if both cores were ours",
            cpu / elapsed / 2.0 * 100.0,
            copied as f64 / cpu,
            copied as f64 / cpu * 2.0
        );
    }
    let target_info = target.partition_info("bench", "t", 0)?;
    assert_eq!(
        target_info.messages_count, per_partition,
        "target holds every message"
    );
    source.shutdown().await;
    target.shutdown().await;
    Ok(())
}

/// User + system CPU time of this process (Linux `/proc/self/stat`), in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn main() -> BenchResult {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing useful either way.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}
