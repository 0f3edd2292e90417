//! The baseline the replicator is measured against: a raw poll→send copy loop through the SDK,
//! with nothing else (no provenance headers, no offsets committed, no coordination). Between
//! two 0.8 servers it is SDK 0.10's own calls, messages sent as polled; with a 0.9 end it goes
//! through the replicator's adapters, which carry a polled message from one SDK's type to the
//! other's.

use std::time::{Duration, Instant};

use iggy::prelude::{Consumer, Identifier, Partitioning, PollingStrategy};
use replicator_sdk::Client;
use replicator_sdk::IggyCluster as _;

use replicator_model::IggyVersion;

use crate::{connect, Endpoint, Error, Result, Topic};

/// What [`raw_copy`] copies, and how.
#[derive(Debug, Clone)]
pub struct RawCopy {
    /// The upstream server.
    pub source: Endpoint,
    /// The downstream server.
    pub target: Endpoint,
    /// The upstream topic; every partition is copied from offset 0.
    pub topic: Topic,
    /// The downstream stream: partition `p` goes to partition `p` of the topic of the same
    /// name there (which must exist).
    pub target_stream: String,
    /// Messages copied from every partition (each must hold at least as many).
    pub per_partition: u64,
    /// Messages polled per call, e.g. 1000.
    pub batch: u32,
    /// Workers, each with one connection to each side and every `connections`-th partition.
    pub connections: usize,
    /// The user headers each message is sent with, from its upstream offset (`None`: sent as
    /// polled). Between two 0.8 servers only.
    pub headers: Option<fn(u64) -> Option<bytes::Bytes>>,
}

/// Copies [`RawCopy::per_partition`] messages of every partition: each worker polls a batch at
/// an explicit offset and sends it, going round its partitions until all are copied. Fails
/// when a partition ends before.
///
/// Every worker's connections are opened (and logged in) before the copy starts: a login costs
/// a real server milliseconds of password hashing, one at a time, and a loop that logged its
/// workers in one after the other while the first ones copied was timed with its logins. The
/// replicator's copy is timed from its first message downstream, after its own logins.
pub async fn raw_copy(copy: &RawCopy) -> Result<RawCopied> {
    if copy.headers.is_some()
        && (copy.source.iggy_version != IggyVersion::V0_8
            || copy.target.iggy_version != IggyVersion::V0_8)
    {
        return Err(Error::Setup(
            "a raw copy with headers of its own runs between two 0.8 servers only".into(),
        ));
    }
    let connections = copy.connections.max(1) as u32;
    let connecting = Instant::now();
    let mut clients = Vec::new();
    for worker in 0..connections {
        let partitions: Vec<u32> = (0..copy.topic.partitions)
            .filter(|p| p % connections == worker)
            .collect();
        clients.push((
            connect(&copy.source).await?,
            connect(&copy.target).await?,
            partitions,
        ));
    }
    let started = Instant::now();
    let mut workers = Vec::new();
    for (source, target, partitions) in clients {
        let copy = copy.clone();
        workers.push(tokio::spawn(async move {
            copy_partitions(&source, &target, &copy, &partitions).await?;
            Ok::<_, Error>((source, target))
        }));
    }
    let mut done = Vec::new();
    for worker in workers {
        done.push(worker.await??);
    }
    let copied = RawCopied {
        connecting: started - connecting,
        copying: started.elapsed(),
    };
    for (source, target) in done {
        source.shutdown().await?;
        target.shutdown().await?;
    }
    Ok(copied)
}

/// How long a [`raw_copy`] took.
#[derive(Debug, Clone, Copy)]
pub struct RawCopied {
    /// Opening and logging in every worker's connections.
    pub connecting: Duration,
    /// From every connection open to the last send answered.
    pub copying: Duration,
}

/// One worker of [`raw_copy`]: copies `partitions` round robin, a batch each in turn.
async fn copy_partitions(
    source: &Client,
    target: &Client,
    copy: &RawCopy,
    partitions: &[u32],
) -> Result<()> {
    let stream = Identifier::named(&copy.topic.stream)?;
    let topic = Identifier::named(&copy.topic.name)?;
    let target_stream = Identifier::named(&copy.target_stream)?;
    let mut next = vec![0u64; partitions.len()];
    while next.iter().any(|n| *n < copy.per_partition) {
        for (i, partition) in partitions.iter().enumerate() {
            if next[i] >= copy.per_partition {
                continue;
            }
            let copied = match (source, target) {
                // Both ends 0.8: the SDK's own calls, as an SDK user's loop makes them.
                (Client::V08(from), Client::V08(to)) => {
                    from.sdk_poll_and_send(
                        to,
                        (&stream, &topic, &target_stream),
                        *partition,
                        next[i],
                        copy.batch,
                        copy.headers,
                    )
                    .await?
                }
                // A 0.9 end: through the adapters (the polled messages must change SDK anyway).
                _ => {
                    sdk_adapters_step(
                        (source, target),
                        (&stream, &topic, &target_stream),
                        *partition,
                        next[i],
                        copy.batch,
                    )
                    .await?
                }
            };
            let Some(last) = copied else {
                return Err(Error::Setup(format!(
                    "partition {partition} ended at offset {}",
                    next[i]
                )));
            };
            next[i] = last + 1;
        }
    }
    Ok(())
}

/// One step of [`copy_partitions`] through the replicator's SDK adapters: the loop between
/// generations, or with a 0.9 end.
async fn sdk_adapters_step(
    (source, target): (&Client, &Client),
    (stream, topic, target_stream): (&Identifier, &Identifier, &Identifier),
    partition: u32,
    offset: u64,
    count: u32,
) -> Result<Option<u64>> {
    let consumer = Consumer::new(Identifier::named("bench-raw")?);
    let mut polled = source
        .poll_messages(
            stream,
            topic,
            Some(partition),
            &consumer,
            &PollingStrategy::offset(offset),
            count,
            false,
        )
        .await?;
    let Some(last) = polled.messages.last().map(|m| m.offset) else {
        return Ok(None);
    };
    target
        .send_messages(
            target_stream,
            topic,
            &Partitioning::partition_id(partition),
            &mut polled.messages,
        )
        .await?;
    Ok(Some(last))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use iggy::prelude::IggyMessage;
    use replicator_testkit::{TestServer, TestServerConfig};

    use super::*;
    use crate::{ensure_topic, produce_bulk, Bulk};

    /// What the copy gives each message: a header entry of its own, made from its offset.
    fn stamped(offset: u64) -> Option<Bytes> {
        let mut h = Vec::new();
        h.push(1u8); // a string key
        h.extend_from_slice(&1u32.to_le_bytes());
        h.push(b'o');
        h.push(1u8); // a raw value
        h.extend_from_slice(&8u32.to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        Some(Bytes::from(h))
    }

    #[tokio::test]
    async fn a_raw_copy_with_headers_sends_each_message_with_the_headers_of_its_offset(
    ) -> crate::TestResult {
        let (up, down) = (
            TestServer::start(TestServerConfig::default()).await?,
            TestServer::start(TestServerConfig::default()).await?,
        );
        let topic = Topic::new("s", "t", 2);
        let (up_url, down_url) = (up.connection_string(), down.connection_string());
        let source = connect(up_url.as_str()).await?;
        let target = connect(down_url.as_str()).await?;
        ensure_topic(&source, "s", "t", 2).await?;
        ensure_topic(&target, "copy", "t", 2).await?;
        let bulk = Bulk {
            stream: "s".into(),
            topic: "t".into(),
            partitions: vec![0, 1],
            range: 0..25,
            batch: 10,
        };
        produce_bulk(&source, &bulk, |p, seq| {
            IggyMessage::builder()
                .payload(Bytes::from(format!("{p}-{seq}")))
                .build()
        })
        .await?;
        let copy = RawCopy {
            source: Endpoint::from(up_url.as_str()),
            target: Endpoint::from(down_url.as_str()),
            topic,
            target_stream: "copy".into(),
            per_partition: 25,
            batch: 10,
            connections: 2,
            headers: Some(stamped),
        };
        raw_copy(&copy).await?;
        let (stream, name) = (Identifier::named("copy")?, Identifier::named("t")?);
        for partition in 0..2 {
            let polled = target
                .poll_messages(
                    &stream,
                    &name,
                    Some(partition),
                    &Consumer::new(Identifier::named("check")?),
                    &PollingStrategy::offset(0),
                    100,
                    false,
                )
                .await?;
            assert_eq!(polled.messages.len(), 25);
            for (seq, m) in polled.messages.iter().enumerate() {
                assert_eq!(m.payload, Bytes::from(format!("{partition}-{seq}")));
                assert_eq!(m.user_headers, stamped(m.offset));
            }
        }
        for client in [source, target] {
            client.shutdown().await?;
        }
        up.shutdown().await;
        down.shutdown().await;
        Ok(())
    }
}
