//! Traffic for the benchmarks: paced producers over many partitions, and the append-to-append
//! latency of a finished copy.

use iggy::prelude::{Consumer, Identifier, PollingStrategy};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, Client, Endpoint, MessageShape, PacedProducer, ProducerParams, Target, TestResult,
    Topic,
};

use crate::env::PAYLOAD_BYTES;

/// Every partition of `topics` (each with `partitions` partitions) in `stream`.
pub(crate) fn targets(stream: &str, topics: &[String], partitions: u32) -> Vec<Target> {
    topics
        .iter()
        .flat_map(|topic| Topic::new(stream, topic.as_str(), partitions).targets())
        .collect()
}

/// Starts a producer sending `rate` messages of [`PAYLOAD_BYTES`] per second to `server`,
/// message by message round robin over `targets`, catching up on rounds it fell behind in,
/// until stopped.
pub(crate) fn paced(server: &Endpoint, targets: Vec<Target>, rate: u64) -> PacedProducer {
    let mut params = ProducerParams::new(server, targets, rate);
    params.shape = MessageShape::filler(PAYLOAD_BYTES);
    PacedProducer::start(params)
}

/// Append-to-append latency of a copied topic: for every message from offset `from[partition]`
/// on, the downstream append time minus the upstream append time (µs), sorted. Messages are
/// matched by offset (the copy keeps offsets); both servers must share a clock (true on one
/// machine).
pub(crate) async fn append_latencies_us(
    upstream: &Endpoint,
    downstream: &Endpoint,
    (up_stream, down_stream): (&str, &str),
    topic: &str,
    from: &[u64],
) -> TestResult<Vec<u64>> {
    let (up, down) = (connect(upstream).await?, connect(downstream).await?);
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
    client: &Client,
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
        let Some(last) = polled.messages.last().map(|m| m.offset) else {
            return Ok(times);
        };
        times.extend(polled.messages.iter().map(|m| m.timestamp));
        offset = last + 1;
    }
}
