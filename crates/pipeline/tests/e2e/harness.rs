//! The pipeline's fixtures on top of `replicator-harness`: two servers, a seeded upstream topic,
//! params and verify for one flow, confirmed offsets of the in-memory control plane, control
//! planes that hold commits or releases, recognisable test messages. Topics, producing and
//! waiting come from the harness.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Once;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::{HeaderKey, HeaderValue, IggyMessage};
use replicator_harness::Client;
use replicator_harness::{connect, produce_bulk, Bulk, Endpoint};
use replicator_model::{
    Assignment, CommitOutcome, Epoch, IggyVersion, ProgressCommit, UnitProgress, UnitReset,
    UnitStart, WorkUnit, WriterLogin,
};
use replicator_pipeline::verify::{verify, VerifyParams, VerifyReport};
use replicator_pipeline::{
    BackoffParams, ClusterParams, ControlError, ControlPlane, FlowParams, InMemoryControl,
    Pipeline, PipelineParams, UnitReport,
};
use replicator_testkit::{TestServer, TestServerConfig};
use tokio::sync::watch;

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

/// What [`Env::copied_unit`] returns: the servers, a client of upstream, the flow, its one
/// unit, the control plane and the running pipeline.
pub(crate) type CopiedUnit = (Env, Client, FlowParams, WorkUnit, InMemoryControl, Pipeline);

/// Two clusters: `us` (upstream) and `eu` (downstream).
pub(crate) struct Env {
    /// Upstream server.
    pub(crate) us: TestServer,
    /// Downstream server.
    pub(crate) eu: TestServer,
}

/// The Iggy protocol generations of `us` and `eu`: the test binary's own pair, or in `e2e`
/// `E2E_IGGY_VERSIONS=<us>-<eu>` (e.g. `0.8-0.9`; default `0.8-0.8`), so the whole suite runs
/// on any pair. Tests seed and inspect the servers in their own generation ([`client`]), as
/// the pipeline and `verify` talk to them.
pub(crate) fn generations() -> (IggyVersion, IggyVersion) {
    if let Some(pair) = crate::IGGY_VERSIONS {
        return pair;
    }
    let spec = std::env::var("E2E_IGGY_VERSIONS").unwrap_or_default();
    if spec.is_empty() {
        return (IggyVersion::V0_8, IggyVersion::V0_8);
    }
    let parsed = spec
        .split_once('-')
        .and_then(|(us, eu)| Some((us.parse().ok()?, eu.parse().ok()?)));
    parsed.unwrap_or_else(|| panic!("E2E_IGGY_VERSIONS={spec:?}: expected <us>-<eu>, e.g. 0.8-0.9"))
}

/// A server of `version` on port 0.
pub(crate) async fn server(version: IggyVersion) -> TestResult<TestServer> {
    Ok(TestServer::start(TestServerConfig {
        iggy_version: version,
        ..TestServerConfig::default()
    })
    .await?)
}

/// The pipeline's view of `server`: its own port and generation.
pub(crate) fn cluster_params(server: &TestServer) -> ClusterParams {
    let mut params = ClusterParams::new(server.connection_string());
    params.iggy_version = server.iggy_version();
    params
}

impl Env {
    /// Starts both servers on port 0, in the generations of [`generations`].
    pub(crate) async fn start() -> TestResult<Self> {
        let (us, eu) = generations();
        Self::start_pair(us, eu).await
    }

    /// Starts both servers on port 0: `us` speaking `up`, `eu` speaking `down`.
    pub(crate) async fn start_pair(up: IggyVersion, down: IggyVersion) -> TestResult<Self> {
        init_tracing();
        Ok(Self {
            us: server(up).await?,
            eu: server(down).await?,
        })
    }

    /// Starts both servers and seeds upstream: `stream/topic` with `partitions` partitions,
    /// messages `seeded` in each ([`produce`], `batch` per send). Returns them with a client of
    /// upstream and the flow named `stream` over `stream/*`.
    pub(crate) async fn seeded(
        stream: &str,
        topic: &str,
        partitions: u32,
        seeded: Range<u64>,
        batch: u64,
    ) -> TestResult<(Self, Client, FlowParams)> {
        let env = Self::start().await?;
        let up = client(&env.us).await?;
        create_topic(&up, stream, topic, partitions).await?;
        produce(&up, stream, topic, partitions, seeded, batch).await?;
        Ok((env, up, flow(stream, &[&format!("{stream}/*")])))
    }

    /// The pipeline's clusters: `us` and `eu` by alias.
    pub(crate) fn clusters(&self) -> BTreeMap<String, ClusterParams> {
        [("us", &self.us), ("eu", &self.eu)]
            .into_iter()
            .map(|(alias, server)| (alias.to_owned(), cluster_params(server)))
            .collect()
    }

    /// Starts a pipeline for `flow` (with [`Env::params`]) on a fresh in-memory control plane.
    pub(crate) async fn run(&self, flow: &FlowParams) -> TestResult<(InMemoryControl, Pipeline)> {
        let control = InMemoryControl::new();
        let pipeline = Pipeline::start(self.params(flow.clone()), control.clone()).await?;
        Ok((control, pipeline))
    }

    /// One partition copied: seeds `stream/topic` with one partition holding messages `0..100`
    /// ([`Env::seeded`]) and runs its flow ([`Env::run`]) until offset 99 is confirmed (at most
    /// 30 s). The unit is `stream/topic/0`.
    pub(crate) async fn copied_unit(stream: &str, topic: &str) -> TestResult<CopiedUnit> {
        let (env, up, flow) = Self::seeded(stream, topic, 1, 0..100, 100).await?;
        let unit = WorkUnit::new(stream, stream, topic, 0);
        let (control, pipeline) = env.run(&flow).await?;
        wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
        Ok((env, up, flow, unit, control, pipeline))
    }

    /// Waits until downstream partition `stream/topic/partition` holds `messages` messages (at
    /// most 30 s).
    pub(crate) async fn wait_downstream(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        messages: u64,
    ) -> TestResult {
        let what = format!("{messages} messages in {stream}/{topic}/{partition} downstream");
        wait_until(&what, Duration::from_secs(30), || async {
            count(&self.eu, stream, topic, partition) == messages
        })
        .await
    }

    /// Params for one flow `us → eu` selecting `include`, tuned for fast tests.
    pub(crate) fn params(&self, flow: FlowParams) -> PipelineParams {
        tuned_params(self.clusters(), flow)
    }

    /// Verify params for `flow`, waiting up to `wait` for the copy to become exact.
    pub(crate) fn verify_params(&self, flow: FlowParams, wait: Duration) -> VerifyParams {
        let mut v = VerifyParams::new(
            flow,
            self.us.connection_string(),
            self.eu.connection_string(),
        );
        v.source_version = self.us.iggy_version();
        v.target_version = self.eu.iggy_version();
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

/// Params for one flow between `clusters`, tuned for fast tests.
pub(crate) fn tuned_params(
    clusters: BTreeMap<String, ClusterParams>,
    flow: FlowParams,
) -> PipelineParams {
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

/// A connected client of `server`, in the generation it speaks to the pipeline.
pub(crate) async fn client(server: &TestServer) -> TestResult<Client> {
    let endpoint = Endpoint::new(server.iggy_version(), server.connection_string());
    Ok(connect(endpoint).await?)
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
    c: &Client,
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

/// The offset `control` confirmed for `unit`, if any.
pub(crate) fn confirmed(control: &InMemoryControl, unit: &WorkUnit) -> Option<u64> {
    control.progress(unit).and_then(|p| p.confirmed)
}

/// Messages confirmed over every unit `control` knows: each confirmed offset + 1.
pub(crate) fn confirmed_total(control: &InMemoryControl) -> u64 {
    control
        .known_units()
        .iter()
        .filter_map(|u| confirmed(control, u).map(|o| o + 1))
        .sum()
}

/// Waits until `control` confirmed `offset` for `unit`, at most `within`.
pub(crate) async fn wait_confirmed(
    control: &InMemoryControl,
    unit: &WorkUnit,
    offset: u64,
    within: Duration,
) -> TestResult {
    wait_until(&format!("{unit} confirmed at {offset}"), within, || async {
        confirmed(control, unit) == Some(offset)
    })
    .await
}

/// What a scenario's control plane does before a commit or a release reaches
/// [`InMemoryControl`]; by default nothing.
pub(crate) trait Intercept: Clone + Send + Sync + 'static {
    /// Called as the pipeline commits; the commit goes through once this is done.
    fn before_commit(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Called as the pipeline hands a unit back; the release goes through once this is done.
    fn before_release(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The node's writer identity on fenced targets (default: none, ever).
    fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        watch::channel(None).1
    }

    /// The pipeline gives up writer identity `incarnation` (default: as if it were not the
    /// current one).
    fn abandon(&self, incarnation: u64) -> impl Future<Output = Result<bool, ControlError>> + Send {
        let _ = incarnation;
        async { Ok(false) }
    }

    /// This node's lease as the pipeline reads it, given the in-memory one (default: as is).
    /// Units' leases (`lease_valid_for`) are not changed.
    fn node_lease(&self, lease: Option<Instant>) -> Option<Instant> {
        lease
    }

    /// The unit set discovery reports, as it reaches [`InMemoryControl`] (default: as is).
    fn reported(&self, units: Vec<WorkUnit>) -> Vec<WorkUnit> {
        units
    }

    /// Whether the control plane takes this unit report (default: yes); without, the report is
    /// [`UnitReport::Deferred`], as by a cluster that has no leader yet.
    fn takes_report(&self) -> bool {
        true
    }
}

/// A writer identity for fenced targets that never changes (the users must exist on the
/// targets).
#[derive(Clone)]
pub(crate) struct FixedLogin(Arc<watch::Sender<Option<WriterLogin>>>);

impl FixedLogin {
    pub(crate) fn new(login: WriterLogin) -> Self {
        Self(Arc::new(watch::channel(Some(login)).0))
    }
}

impl Intercept for FixedLogin {
    fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        self.0.subscribe()
    }
}

/// A writer identity that is replaced by the next one when the pipeline gives it up, as the
/// control plane's leader does (by none, when there is no next one); remembers what was
/// given up. The test may also switch identities itself, as a leader that fenced one does.
#[derive(Clone)]
pub(crate) struct NextLogin {
    current: Arc<watch::Sender<Option<WriterLogin>>>,
    next: Option<WriterLogin>,
    /// The incarnations given up, in order.
    pub(crate) abandoned: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl NextLogin {
    /// Writes as `first` until it is given up, then as `next`.
    pub(crate) fn new(first: WriterLogin, next: WriterLogin) -> Self {
        Self {
            current: Arc::new(watch::channel(Some(first)).0),
            next: Some(next),
            abandoned: Arc::default(),
        }
    }

    /// No identity until the test switches to one; one given up leaves none.
    pub(crate) fn without_next() -> Self {
        Self {
            current: Arc::new(watch::channel(None).0),
            next: None,
            abandoned: Arc::default(),
        }
    }

    /// The node writes as `login` from now on.
    pub(crate) fn switch(&self, login: Option<WriterLogin>) {
        self.current.send_replace(login);
    }

    /// The incarnations given up so far.
    pub(crate) fn abandoned(&self) -> Vec<u64> {
        self.abandoned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Intercept for NextLogin {
    fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        self.current.subscribe()
    }

    fn abandon(&self, incarnation: u64) -> impl Future<Output = Result<bool, ControlError>> + Send {
        let current = self.current.borrow().as_ref().map(|l| l.incarnation);
        let taken = current == Some(incarnation);
        if taken {
            self.abandoned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(incarnation);
            self.current.send_replace(self.next.clone());
        }
        async move { Ok(taken) }
    }
}

/// Commits that hang forever once the flag is set: every write after that point is downstream
/// but never confirmed.
#[derive(Clone)]
pub(crate) struct StallCommits(pub(crate) Arc<AtomicBool>);

impl Intercept for StallCommits {
    fn before_commit(&self) -> impl Future<Output = ()> + Send {
        let stall = self.0.load(Ordering::SeqCst);
        async move {
            if stall {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The in-memory control plane with its commits, releases and unit reports changed by `hooks`.
#[derive(Clone)]
pub(crate) struct Intercepted<I> {
    /// Everything else: assignments, leases, progress, unit reports.
    pub(crate) inner: InMemoryControl,
    /// The scenario's change.
    pub(crate) hooks: I,
}

impl<I: Intercept> ControlPlane for Intercepted<I> {
    fn assignments(&self) -> watch::Receiver<Vec<Assignment>> {
        self.inner.assignments()
    }
    fn lease_valid_until(&self) -> Option<Instant> {
        self.hooks.node_lease(self.inner.lease_valid_until())
    }
    fn lease_valid_for(&self, unit: &WorkUnit, epoch: Epoch) -> Option<Instant> {
        self.inner.lease_valid_for(unit, epoch)
    }
    fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
        self.inner.progress(unit)
    }
    fn pending_reset(&self, unit: &WorkUnit) -> Option<UnitReset> {
        self.inner.pending_reset(unit)
    }
    fn recorded_start(&self, unit: &WorkUnit) -> Option<UnitStart> {
        self.inner.recorded_start(unit)
    }
    fn record_start(
        &self,
        unit: &WorkUnit,
        epoch: Epoch,
        start: UnitStart,
    ) -> impl Future<Output = Result<bool, ControlError>> + Send {
        self.inner.record_start(unit, epoch, start)
    }
    fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        self.hooks.writer_login()
    }
    fn counts_totals(&self) -> bool {
        self.inner.counts_totals()
    }
    fn stamps_compact_provenance(&self) -> bool {
        self.inner.stamps_compact_provenance()
    }
    fn metadata_records(
        &self,
        pair: &replicator_model::ClusterPair,
    ) -> Option<BTreeMap<replicator_model::MetadataObject, replicator_model::MetadataRecord>> {
        self.inner.metadata_records(pair)
    }
    fn record_metadata(
        &self,
        changes: Vec<replicator_model::MetadataChange>,
    ) -> impl Future<Output = Result<Vec<bool>, ControlError>> + Send {
        self.inner.record_metadata(changes)
    }
    fn abandon_writer_identity(
        &self,
        incarnation: u64,
    ) -> impl Future<Output = Result<bool, ControlError>> + Send {
        self.hooks.abandon(incarnation)
    }
    fn commit(
        &self,
        commits: Vec<ProgressCommit>,
    ) -> impl Future<Output = Result<Vec<CommitOutcome>, ControlError>> + Send {
        let (hold, inner) = (self.hooks.before_commit(), self.inner.clone());
        async move {
            hold.await;
            inner.commit(commits).await
        }
    }
    fn report_units(
        &self,
        flow: &str,
        units: Vec<WorkUnit>,
    ) -> impl Future<Output = Result<UnitReport, ControlError>> + Send {
        let takes = self.hooks.takes_report();
        let (inner, flow, units) = (
            self.inner.clone(),
            flow.to_owned(),
            self.hooks.reported(units),
        );
        async move {
            if !takes {
                return Ok(UnitReport::Deferred);
            }
            inner.report_units(&flow, units).await
        }
    }
    fn release(
        &self,
        unit: WorkUnit,
        epoch: Epoch,
    ) -> impl Future<Output = Result<(), ControlError>> + Send {
        let (hold, inner) = (self.hooks.before_release(), self.inner.clone());
        async move {
            hold.await;
            inner.release(unit, epoch).await
        }
    }
}
