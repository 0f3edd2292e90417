//! The pipeline's fixtures on top of `replicator-harness`: two servers, params and verify for
//! one flow, recognisable test messages. Topics, producing and waiting come from the harness.

use std::collections::BTreeMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::{HeaderKey, HeaderValue, IggyClient, IggyMessage};
use replicator_harness::{connect, produce_bulk, Bulk};
use replicator_pipeline::verify::{verify, VerifyParams, VerifyReport};
use replicator_pipeline::{BackoffParams, ClusterParams, FlowParams, PipelineParams};
use replicator_testkit::{TestServer, TestServerConfig};

/// `create_topic(client, stream, topic, partitions)`: creates the stream and topic if missing.
pub(crate) use replicator_harness::ensure_topic as create_topic;
/// `count(server, stream, topic, partition)`: messages stored in one partition.
pub(crate) use replicator_harness::partition_messages as count;
pub(crate) use replicator_harness::TestResult;

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
    Ok(connect(&server.connection_string()).await?)
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

/// Produces messages `range` ([`message`]s of 64 bytes) to each of `partitions` partitions,
/// `batch` per send.
pub(crate) async fn produce(
    c: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
    range: std::ops::Range<u64>,
    batch: u64,
) -> TestResult {
    let bulk = Bulk {
        stream: stream.to_owned(),
        topic: topic.to_owned(),
        partitions: (0..partitions).collect(),
        range,
        batch,
    };
    produce_bulk(c, &bulk, |partition, seq| message(partition, seq, 64)).await
}

/// Polls `condition` every 50 ms until it holds or `within` passes.
pub(crate) async fn wait_until<F, Fut>(what: &str, within: Duration, condition: F) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    Ok(replicator_harness::wait_until(what, within, condition).await?)
}

/// Asserts a report is exact, printing it otherwise.
pub(crate) fn assert_exact(report: &VerifyReport) {
    let bad: Vec<_> = report.partitions.iter().filter(|p| !p.is_exact()).collect();
    assert!(bad.is_empty(), "copy not exact: {bad:#?}");
}
