//! The baseline the replicator is measured against: a raw poll→send copy loop through the SDK,
//! with nothing else (no provenance headers, no offsets committed, no coordination).

use iggy::prelude::{Consumer, Identifier, Partitioning, PollingStrategy};
use replicator_sdk::Client;
use replicator_sdk::IggyCluster as _;

use crate::{connect, Endpoint, Error, Result, Topic};

/// What [`raw_copy`] copies, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// Copies [`RawCopy::per_partition`] messages of every partition: each worker polls a batch at
/// an explicit offset and sends it, going round its partitions until all are copied. Fails
/// when a partition ends before.
pub async fn raw_copy(copy: &RawCopy) -> Result<()> {
    let connections = copy.connections.max(1) as u32;
    let mut workers = Vec::new();
    for worker in 0..connections {
        let partitions: Vec<u32> = (0..copy.topic.partitions)
            .filter(|p| p % connections == worker)
            .collect();
        let source = connect(&copy.source).await?;
        let target = connect(&copy.target).await?;
        let copy = copy.clone();
        workers.push(tokio::spawn(async move {
            copy_partitions(&source, &target, &copy, &partitions).await?;
            source.shutdown().await?;
            target.shutdown().await?;
            Ok::<_, Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(())
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
    let consumer = Consumer::new(Identifier::named("bench-raw")?);
    let mut next = vec![0u64; partitions.len()];
    while next.iter().any(|n| *n < copy.per_partition) {
        for (i, partition) in partitions.iter().enumerate() {
            if next[i] >= copy.per_partition {
                continue;
            }
            let mut polled = source
                .poll_messages(
                    &stream,
                    &topic,
                    Some(*partition),
                    &consumer,
                    &PollingStrategy::offset(next[i]),
                    copy.batch,
                    false,
                )
                .await?;
            let Some(last) = polled.messages.last().map(|m| m.offset) else {
                return Err(Error::Setup(format!(
                    "partition {partition} ended at offset {}",
                    next[i]
                )));
            };
            target
                .send_messages(
                    &target_stream,
                    &topic,
                    &Partitioning::partition_id(*partition),
                    &mut polled.messages,
                )
                .await?;
            next[i] = last + 1;
        }
    }
    Ok(())
}
