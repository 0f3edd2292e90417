//! Servers as the harness reaches them ([`Endpoint`]), topics by name, and the SDK calls the
//! harness makes on them: connect, create, delete, count. Every call goes through
//! [`replicator_sdk::Client`], so the tools work on servers of either Iggy generation.

use std::time::{Duration, Instant};

use iggy::prelude::PollingStrategy;
use iggy::prelude::{CompressionAlgorithm, Consumer, Identifier, IggyExpiry, MaxTopicSize};
use replicator_model::IggyVersion;
use replicator_sdk::IggyCluster as _;
use replicator_sdk::{Client, ClientConfig};
use replicator_testkit::{TestCluster, TestServer};

use crate::{Deadline, Error, Result};

/// An Iggy server as the harness's tools reach it: its connection string and the protocol
/// generation it speaks. A bare connection string (`&str`, `String`) names an Iggy 0.8 server,
/// the default generation as in the replicator's config; a 0.9 server is named with
/// [`Endpoint::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Connection string with credentials, e.g. `iggy://iggy:iggy@127.0.0.1:8090`.
    pub url: String,
    /// The generation the server speaks.
    pub iggy_version: IggyVersion,
}

impl Endpoint {
    /// The server at `url`, speaking `iggy_version`.
    pub fn new(iggy_version: IggyVersion, url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            iggy_version,
        }
    }
}

impl From<&str> for Endpoint {
    fn from(url: &str) -> Self {
        Self::new(IggyVersion::V0_8, url)
    }
}

impl From<&String> for Endpoint {
    fn from(url: &String) -> Self {
        Self::new(IggyVersion::V0_8, url.as_str())
    }
}

impl From<String> for Endpoint {
    fn from(url: String) -> Self {
        Self::new(IggyVersion::V0_8, url)
    }
}

impl From<&Endpoint> for Endpoint {
    fn from(endpoint: &Endpoint) -> Self {
        endpoint.clone()
    }
}

/// A topic by stream and topic name, with its partition count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// Stream name, e.g. `"ha"`.
    pub stream: String,
    /// Topic name, e.g. `"events"`.
    pub name: String,
    /// Partitions (ids `0..partitions`).
    pub partitions: u32,
}

impl Topic {
    /// `stream/name` with `partitions` partitions.
    pub fn new(stream: impl Into<String>, name: impl Into<String>, partitions: u32) -> Self {
        Self {
            stream: stream.into(),
            name: name.into(),
            partitions,
        }
    }

    /// Messages per partition of the topic on an in-process server, by partition id (0 where
    /// it does not exist yet).
    #[must_use]
    pub fn counts_on(&self, server: &TestServer) -> Vec<u64> {
        (0..self.partitions)
            .map(|p| partition_messages(server, &self.stream, &self.name, p))
            .collect()
    }

    /// Messages per partition of the topic on an in-process clustered 0.9 test double (its
    /// replicas share one state, so the count goes on through their kills and view changes),
    /// by partition id (0 where it does not exist yet).
    #[must_use]
    pub fn counts_on_cluster(&self, cluster: &TestCluster) -> Vec<u64> {
        (0..self.partitions)
            .map(|p| {
                cluster
                    .partition_info(&self.stream, &self.name, p)
                    .map_or(0, |info| info.messages_count)
            })
            .collect()
    }

    /// Every partition of the topic, for a producer.
    #[must_use]
    pub fn targets(&self) -> Vec<Target> {
        (0..self.partitions)
            .map(|partition| Target {
                stream: self.stream.clone(),
                topic: self.name.clone(),
                partition,
            })
            .collect()
    }
}

/// One partition a producer writes to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    /// Stream name.
    pub stream: String,
    /// Topic name.
    pub topic: String,
    /// Partition id.
    pub partition: u32,
}

/// A connected, logged-in client of the server's generation (the URL carries the
/// credentials). The SDK reconnects by itself as the URL configures (a producer rides out a
/// server restart); Nagle's algorithm is off: with delayed ACKs every small send would wait
/// about 40 ms.
pub async fn connect(server: impl Into<Endpoint>) -> Result<Client> {
    let server = server.into();
    // A cluster named by several seed addresses: the first that lets us in, found without the
    // SDK's reconnect (which would keep trying a seed that is down), then connected to with it.
    let mut seeds = replicator_model::seed_urls(&server.url);
    if seeds.len() > 1 {
        for (index, seed) in seeds.iter().enumerate() {
            let probe = ClientConfig::parse(server.iggy_version, seed)
                .map_err(Error::InvalidUrl)?
                .client()?;
            let up = tokio::time::timeout(std::time::Duration::from_secs(10), probe.connect())
                .await
                .is_ok_and(|r| r.is_ok());
            let _ = probe.shutdown().await;
            if up {
                seeds.rotate_left(index);
                break;
            }
        }
    }
    let mut failure = None;
    for seed in seeds {
        let client = ClientConfig::parse_reconnecting(server.iggy_version, &seed)
            .map_err(Error::InvalidUrl)?
            .client()?;
        match client.connect().await {
            Ok(()) => return Ok(client),
            Err(e) => {
                let _ = client.shutdown().await;
                failure = Some(e);
            }
        }
    }
    Err(failure.map_or(Error::InvalidUrl("no address"), Error::from))
}

/// Creates `stream` if it is missing and `stream/topic` with `partitions` partitions if it is
/// missing; an existing topic is kept as it is.
pub async fn ensure_topic(
    client: &Client,
    stream: &str,
    topic: &str,
    partitions: u32,
) -> Result<()> {
    let stream_id = Identifier::named(stream)?;
    if client.get_stream(&stream_id).await?.is_none() {
        client.create_stream(stream).await?;
    }
    if client
        .get_topic(&stream_id, &Identifier::named(topic)?)
        .await?
        .is_none()
    {
        client
            .create_topic(
                &stream_id,
                topic,
                partitions,
                CompressionAlgorithm::None,
                None,
                IggyExpiry::NeverExpire,
                MaxTopicSize::ServerDefault,
            )
            .await?;
    }
    Ok(())
}

/// Deletes `stream` on `server` if it exists (the cleanup of a run on shared servers).
pub async fn delete_stream(server: impl Into<Endpoint>, stream: &str) -> Result<()> {
    let client = connect(server).await?;
    let id = Identifier::named(stream)?;
    if client.get_stream(&id).await?.is_some() {
        client.delete_stream(&id).await?;
    }
    client.shutdown().await?;
    Ok(())
}

/// Messages per partition of `stream/topic` through the SDK, by partition id (empty while the
/// topic does not exist).
pub async fn partition_counts(client: &Client, stream: &str, topic: &str) -> Result<Vec<u64>> {
    let topic = client
        .get_topic(&Identifier::named(stream)?, &Identifier::named(topic)?)
        .await?;
    let Some(topic) = topic else {
        return Ok(Vec::new());
    };
    let mut partitions: Vec<(u32, u64)> = topic
        .partitions
        .iter()
        .map(|p| (p.id, p.messages_count))
        .collect();
    partitions.sort_unstable();
    Ok(partitions.into_iter().map(|(_, count)| count).collect())
}

/// The ids of every message of one partition of `stream/topic`, in offset order (empty while it
/// does not exist or holds nothing).
pub async fn partition_ids(
    client: &Client,
    (stream, topic): (&str, &str),
    partition: u32,
) -> Result<Vec<u128>> {
    let (stream, topic) = (Identifier::named(stream)?, Identifier::named(topic)?);
    let consumer = Consumer::new(Identifier::named("harness-reader")?);
    let mut out = Vec::new();
    loop {
        let polled = client
            .poll_messages(
                &stream,
                &topic,
                Some(partition),
                &consumer,
                &PollingStrategy::offset(out.len() as u64),
                1000,
                false,
            )
            .await?;
        if polled.messages.is_empty() {
            return Ok(out);
        }
        out.extend(polled.messages.iter().map(|m| m.id));
    }
}

/// Messages in every topic of `stream` through the SDK (0 while it does not exist).
pub async fn stream_messages(client: &Client, stream: &str) -> Result<u64> {
    Ok(client
        .get_stream(&Identifier::named(stream)?)
        .await?
        .map_or(0, |details| {
            details.topics.iter().map(|t| t.messages_count).sum()
        }))
}

/// Messages stored in one partition of an in-process server (0 while it does not exist).
#[must_use]
pub fn partition_messages(server: &TestServer, stream: &str, topic: &str, partition: u32) -> u64 {
    server
        .partition_info(stream, topic, partition)
        .map_or(0, |info| info.messages_count)
}

/// A watched topic: its message counts through one client kept open (servers of any kind).
pub struct Watch {
    /// Client of the watched server.
    client: Client,
    /// Stream name.
    stream: String,
    /// Topic name.
    topic: String,
}

impl Watch {
    /// Watches `stream/topic` on `server`.
    pub async fn new(server: impl Into<Endpoint>, stream: &str, topic: &str) -> Result<Self> {
        Ok(Self {
            client: connect(server).await?,
            stream: stream.to_owned(),
            topic: topic.to_owned(),
        })
    }

    /// Messages per partition, by partition id.
    pub async fn counts(&self) -> Result<Vec<u64>> {
        partition_counts(&self.client, &self.stream, &self.topic).await
    }

    /// Sum of the messages of every partition.
    pub async fn total(&self) -> Result<u64> {
        Ok(self.counts().await?.iter().sum())
    }

    /// Waits until the topic holds `target` messages; returns when the first message appeared
    /// and when the last did, both relative to `since`.
    pub async fn wait_total(
        &self,
        target: u64,
        since: Instant,
        within: Duration,
    ) -> Result<(Duration, Duration)> {
        let deadline = Deadline::new(
            within,
            format!("{}/{} to hold {target} messages", self.stream, self.topic),
        );
        let mut first = None;
        loop {
            let total = self.total().await?;
            if total > 0 && first.is_none() {
                first = Some(since.elapsed());
            }
            if total >= target {
                return Ok((first.unwrap_or_default(), since.elapsed()));
            }
            deadline.check_seeing(|| format!("{total} of {target}"))?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Closes the client.
    pub async fn close(self) {
        let _ = self.client.shutdown().await;
    }
}
