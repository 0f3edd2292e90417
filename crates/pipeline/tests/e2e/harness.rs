//! Shared fixtures: two servers, producing test data, params, waiting on conditions.

use std::collections::BTreeMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::{
    Client, CompressionAlgorithm, HeaderKey, HeaderValue, Identifier, IggyClient, IggyExpiry,
    IggyMessage, MaxTopicSize, MessageClient, Partitioning, StreamClient, TopicClient,
};
use replicator_pipeline::verify::{verify, VerifyParams, VerifyReport};
use replicator_pipeline::{BackoffParams, ClusterParams, FlowParams, PipelineParams};
use replicator_testkit::{TestServer, TestServerConfig};

/// Result type of tests.
pub(crate) type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Installs a test log writer once (`RUST_LOG` selects levels; default warn).
pub(crate) fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// A fresh node id per pipeline, so actor names never collide between parallel tests.
pub(crate) fn node_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Two clusters: `us` (upstream) and `eu` (downstream).
pub(crate) struct Env {
    /// Upstream server.
    pub(crate) us: TestServer,
    /// Downstream server.
    pub(crate) eu: TestServer,
}

impl Env {
    /// Starts both servers on port 0.
    pub(crate) async fn start() -> TestResult<Self> {
        init_tracing();
        Ok(Self {
            us: TestServer::start(TestServerConfig::default()).await?,
            eu: TestServer::start(TestServerConfig::default()).await?,
        })
    }

    /// Params for one flow `us → eu` selecting `include`, tuned for fast tests.
    pub(crate) fn params(&self, flow: FlowParams) -> PipelineParams {
        let mut clusters = BTreeMap::new();
        clusters.insert(
            "us".to_owned(),
            ClusterParams::new(self.us.connection_string()),
        );
        clusters.insert(
            "eu".to_owned(),
            ClusterParams::new(self.eu.connection_string()),
        );
        let mut p = PipelineParams::new(node_id(), clusters, vec![flow]);
        p.discovery_interval = Duration::from_millis(200);
        p.backoff = BackoffParams {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(500),
        };
        p.operation_timeout = Duration::from_secs(3);
        p.shutdown_timeout = Duration::from_secs(15);
        p
    }

    /// Verify params for `flow`, waiting up to `wait` for the copy to become exact.
    pub(crate) fn verify_params(&self, flow: FlowParams, wait: Duration) -> VerifyParams {
        let mut v = VerifyParams::new(
            flow,
            self.us.connection_string(),
            self.eu.connection_string(),
        );
        v.wait = wait;
        v
    }

    /// Verifies `flow`, waiting up to `wait`.
    pub(crate) async fn verify(
        &self,
        flow: &FlowParams,
        wait: Duration,
    ) -> TestResult<VerifyReport> {
        Ok(verify(&self.verify_params(flow.clone(), wait)).await?)
    }
}

/// The default test flow `us → eu` over `include`.
pub(crate) fn flow(name: &str, include: &[&str]) -> FlowParams {
    let mut f = FlowParams::new(
        name,
        "us",
        "eu",
        include.iter().map(|s| (*s).to_owned()).collect(),
    );
    f.poll_interval = Duration::from_millis(2);
    f
}

/// A connected SDK client.
pub(crate) async fn client(server: &TestServer) -> TestResult<IggyClient> {
    let c = IggyClient::from_connection_string(&server.connection_string())?;
    c.connect().await?;
    Ok(c)
}

/// Creates `stream/topic` with `partitions` partitions.
pub(crate) async fn create_topic(
    c: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
) -> TestResult {
    if c.get_stream(&Identifier::named(stream)?).await?.is_none() {
        c.create_stream(stream).await?;
    }
    c.create_topic(
        &Identifier::named(stream)?,
        topic,
        partitions,
        CompressionAlgorithm::None,
        None,
        IggyExpiry::NeverExpire,
        MaxTopicSize::ServerDefault,
    )
    .await?;
    Ok(())
}

/// A recognisable test message: id, payload, one user header and an origin timestamp derived
/// from `(partition, seq)`.
pub(crate) fn message(partition: u32, seq: u64, payload_len: usize) -> TestResult<IggyMessage> {
    let id = (u128::from(partition) << 64) | u128::from(seq + 1);
    let mut payload = format!("p{partition}-m{seq}-").into_bytes();
    payload.resize(payload_len.max(payload.len()), b'x');
    let mut headers = BTreeMap::new();
    headers.insert(HeaderKey::from_str("seq")?, HeaderValue::from(seq));
    headers.insert(HeaderKey::from_str("kind")?, HeaderValue::from_str("test")?);
    let mut m = IggyMessage::builder()
        .id(id)
        .payload(Bytes::from(payload))
        .user_headers(headers)
        .build()?;
    m.header.origin_timestamp = 1_600_000_000_000_000 + seq;
    Ok(m)
}

/// Produces messages `from..to` to each of `partitions` partitions, `batch` per send.
pub(crate) async fn produce(
    c: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
    range: std::ops::Range<u64>,
    batch: u64,
) -> TestResult {
    let (s, t) = (Identifier::named(stream)?, Identifier::named(topic)?);
    for partition in 0..partitions {
        let mut seq = range.start;
        while seq < range.end {
            let end = (seq + batch).min(range.end);
            let mut msgs = (seq..end)
                .map(|i| message(partition, i, 64))
                .collect::<TestResult<Vec<_>>>()?;
            c.send_messages(&s, &t, &Partitioning::partition_id(partition), &mut msgs)
                .await?;
            seq = end;
        }
    }
    Ok(())
}

/// Polls `cond` every 50 ms until it holds or `deadline` passes.
pub(crate) async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut cond: F) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if cond().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("timed out waiting for: {what}").into())
}

/// Messages stored in a downstream/upstream partition.
pub(crate) fn count(server: &TestServer, stream: &str, topic: &str, partition: u32) -> u64 {
    server
        .partition_info(stream, topic, partition)
        .map(|i| i.messages_count)
        .unwrap_or(0)
}

/// Asserts a report is exact, printing it otherwise.
pub(crate) fn assert_exact(report: &VerifyReport) {
    let bad: Vec<_> = report.partitions.iter().filter(|p| !p.is_exact()).collect();
    assert!(bad.is_empty(), "copy not exact: {bad:#?}");
}
