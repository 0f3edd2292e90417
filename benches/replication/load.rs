//! Traffic for the benchmarks: a producer paced to a fixed rate over many partitions, and the
//! append-to-append latency of a finished copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::{
    Client, Consumer, Identifier, IggyMessage, MessageClient, Partitioning, PollingStrategy,
};
use tokio::task::JoinHandle;

use crate::env::{connect, PAYLOAD_BYTES};
use crate::harness::TestResult;

/// One partition the producer writes to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Target {
    /// Stream name.
    pub(crate) stream: String,
    /// Topic name.
    pub(crate) topic: String,
    /// Partition id.
    pub(crate) partition: u32,
}

/// Every partition of `topics` (each with `partitions` partitions) in `stream`.
pub(crate) fn targets(stream: &str, topics: &[String], partitions: u32) -> Vec<Target> {
    topics
        .iter()
        .flat_map(|topic| {
            (0..partitions).map(move |partition| Target {
                stream: stream.to_owned(),
                topic: topic.clone(),
                partition,
            })
        })
        .collect()
}

/// Time between two rounds of sends.
const TICK: Duration = Duration::from_millis(10);

/// A producer sending `rate` messages per second round robin over its targets, catching up
/// on rounds it fell behind in, until stopped.
pub(crate) struct PacedProducer {
    stop: Arc<AtomicBool>,
    task: JoinHandle<TestResult<u64>>,
}

impl PacedProducer {
    /// Starts producing to the server at `url`.
    pub(crate) fn start(url: String, targets: Vec<Target>, rate: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(produce(url, targets, rate, stop.clone()));
        Self { stop, task }
    }

    /// Stops and returns how many messages were acknowledged.
    pub(crate) async fn stop(self) -> TestResult<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

async fn produce(
    url: String,
    targets: Vec<Target>,
    rate: u64,
    stop: Arc<AtomicBool>,
) -> TestResult<u64> {
    if targets.is_empty() || rate == 0 {
        return Ok(0);
    }
    let client = connect(&url).await?;
    let ids: Vec<(Identifier, Identifier)> = targets
        .iter()
        .map(|t| Ok((Identifier::named(&t.stream)?, Identifier::named(&t.topic)?)))
        .collect::<TestResult<_>>()?;
    let payload = Bytes::from(vec![0x5A; PAYLOAD_BYTES]);
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut cursor = 0usize;
    let mut next_id: u128 = 1;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let mut batches: BTreeMap<usize, Vec<IggyMessage>> = BTreeMap::new();
        for _ in sent..due {
            batches.entry(cursor).or_default().push(
                IggyMessage::builder()
                    .id(next_id)
                    .payload(payload.clone())
                    .build()?,
            );
            next_id += 1;
            cursor = (cursor + 1) % targets.len();
        }
        for (index, mut messages) in batches {
            let (stream, topic) = &ids[index];
            let partitioning = Partitioning::partition_id(targets[index].partition);
            client
                .send_messages(stream, topic, &partitioning, &mut messages)
                .await?;
            sent += messages.len() as u64;
        }
    }
    client.shutdown().await?;
    Ok(sent)
}

/// Append-to-append latency of a copied topic: for every message from offset `from[partition]`
/// on, the downstream append time minus the upstream append time (µs), sorted. Messages are
/// matched by offset (the copy keeps offsets); both servers must share a clock (true on one
/// machine).
pub(crate) async fn append_latencies_us(
    upstream_url: &str,
    downstream_url: &str,
    (up_stream, down_stream): (&str, &str),
    topic: &str,
    from: &[u64],
) -> TestResult<Vec<u64>> {
    let (up, down) = (connect(upstream_url).await?, connect(downstream_url).await?);
    let mut latencies = Vec::new();
    for (partition, start) in (0u32..).zip(from) {
        let up_times = append_times(&up, up_stream, topic, partition, *start).await?;
        let down_times = append_times(&down, down_stream, topic, partition, *start).await?;
        if up_times.len() != down_times.len() {
            return Err(format!(
                "{topic} partition {partition}: {} messages upstream, {} downstream",
                up_times.len(),
                down_times.len()
            )
            .into());
        }
        latencies.extend(
            up_times
                .iter()
                .zip(&down_times)
                .map(|(u, d)| d.saturating_sub(*u)),
        );
    }
    up.shutdown().await?;
    down.shutdown().await?;
    latencies.sort_unstable();
    Ok(latencies)
}

/// Append timestamps (µs) of every message of one partition, by offset.
async fn append_times(
    client: &iggy::prelude::IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
    from: u64,
) -> TestResult<Vec<u64>> {
    let (s, t) = (Identifier::named(stream)?, Identifier::named(topic)?);
    let consumer = Consumer::new(Identifier::named("bench-latency")?);
    let mut times = Vec::new();
    let mut offset = from;
    loop {
        let polled = client
            .poll_messages(
                &s,
                &t,
                Some(partition),
                &consumer,
                &PollingStrategy::offset(offset),
                5_000,
                false,
            )
            .await?;
        let Some(last) = polled.messages.last().map(|m| m.header.offset) else {
            return Ok(times);
        };
        times.extend(polled.messages.iter().map(|m| m.header.timestamp));
        offset = last + 1;
    }
}
