//! The harness of the HA scenarios: two in-process Iggy servers (upstream "up", downstream
//! "down"), replicator nodes as real OS processes of the `iggy-replicator` binary, a paced
//! producer with unique message ids, `/status` polling, downstream progress probes and
//! `verify`. Every process is killed by its pid when the [`Cluster`] is dropped, also when a
//! test fails; the node logs of a failed test are printed.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::{
    Client, CompressionAlgorithm, HeaderKey, HeaderValue, Identifier, IggyClient, IggyExpiry,
    IggyMessage, MaxTopicSize, MessageClient, Partitioning, StreamClient, TopicClient,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use replicator_testkit::{TestServer, TestServerConfig};
use serde::Deserialize;
use tokio::task::JoinHandle;

/// What every scenario returns.
pub(crate) type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Upstream stream replicated by every scenario.
pub(crate) const STREAM: &str = "ha";
/// Upstream topic replicated by every scenario.
pub(crate) const TOPIC: &str = "events";
/// Partitions of [`TOPIC`].
pub(crate) const PARTITIONS: u32 = 16;
/// The one flow of every node's config.
pub(crate) const FLOW: &str = "up-to-down";
/// Default lease expiry (the scenarios run with the product defaults).
pub(crate) const LEASE_EXPIRY: Duration = Duration::from_secs(2);

/// Node ids are the control plane's `NodeId`.
pub(crate) type NodeId = u64;

/// Runs one scenario alone (a process-wide lock: the scenarios start several processes each
/// and share two cores with the rest of the suite) on its own multi-threaded runtime.
pub(crate) fn serial<F, Fut>(scenario: F) -> TestResult
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = TestResult>,
{
    static LOCK: Mutex<()> = Mutex::new(());
    // A failed scenario poisons the lock; the next one may still run.
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(scenario());
    runtime.shutdown_timeout(Duration::from_secs(5));
    outcome
}

/// A deadline for polling loops, with a description for the error.
pub(crate) struct Deadline {
    until: Instant,
    what: String,
}

impl Deadline {
    /// A deadline `within` from now for `what`.
    pub(crate) fn new(within: Duration, what: impl Into<String>) -> Self {
        Self {
            until: Instant::now() + within,
            what: what.into(),
        }
    }

    /// `Err` once the deadline has passed.
    pub(crate) fn check(&self) -> TestResult {
        if Instant::now() > self.until {
            Err(format!("timed out waiting for {}", self.what).into())
        } else {
            Ok(())
        }
    }
}

/// Pause between two polls of a condition.
pub(crate) async fn tick() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Upstream and downstream Iggy servers, with the replicated topic created upstream.
pub(crate) struct Servers {
    /// The source cluster ("up").
    pub(crate) upstream: TestServer,
    /// The target cluster ("down").
    pub(crate) downstream: TestServer,
}

impl Servers {
    /// Starts both servers and creates [`STREAM`]/[`TOPIC`] with [`PARTITIONS`] upstream.
    pub(crate) async fn start() -> TestResult<Self> {
        Self::start_with(TestServerConfig::default(), TestServerConfig::default()).await
    }

    /// Like [`Servers::start`] with explicit server configs (e.g. another bind address).
    pub(crate) async fn start_with(
        upstream: TestServerConfig,
        downstream: TestServerConfig,
    ) -> TestResult<Self> {
        let upstream = TestServer::start(upstream).await?;
        let downstream = TestServer::start(downstream).await?;
        let client = connect(&upstream.connection_string()).await?;
        client.create_stream(STREAM).await?;
        client
            .create_topic(
                &Identifier::named(STREAM)?,
                TOPIC,
                PARTITIONS,
                CompressionAlgorithm::None,
                None,
                IggyExpiry::NeverExpire,
                MaxTopicSize::ServerDefault,
            )
            .await?;
        let _ = client.shutdown().await;
        Ok(Self {
            upstream,
            downstream,
        })
    }

    /// Messages per partition upstream.
    pub(crate) fn upstream_counts(&self) -> Vec<u64> {
        counts(&self.upstream)
    }

    /// Messages per partition downstream (0 while the topic does not exist yet).
    pub(crate) fn downstream_counts(&self) -> Vec<u64> {
        counts(&self.downstream)
    }

    /// Waits until every downstream partition has messages (the copy runs everywhere).
    pub(crate) async fn wait_copy_started(&self) -> TestResult {
        let deadline = Deadline::new(Duration::from_secs(30), "every partition to be copied");
        while self.downstream_counts().contains(&0) {
            deadline.check()?;
            tick().await;
        }
        Ok(())
    }

    /// Waits until every partition downstream has as many messages as upstream.
    pub(crate) async fn wait_caught_up(&self, within: Duration) -> TestResult<Duration> {
        let started = Instant::now();
        let deadline = Deadline::new(within, "the downstream to catch up");
        loop {
            let (up, down) = (self.upstream_counts(), self.downstream_counts());
            if up == down {
                return Ok(started.elapsed());
            }
            if deadline.check().is_err() {
                return Err(format!(
                    "the downstream did not catch up within {within:?}: upstream {up:?}, downstream {down:?}"
                )
                .into());
            }
            tick().await;
        }
    }

    /// Shuts both servers down.
    pub(crate) async fn shutdown(self) {
        self.upstream.shutdown().await;
        self.downstream.shutdown().await;
    }
}

fn counts(server: &TestServer) -> Vec<u64> {
    (0..PARTITIONS)
        .map(|p| {
            server
                .partition_info(STREAM, TOPIC, p)
                .map(|i| i.messages_count)
                .unwrap_or(0)
        })
        .collect()
}

/// Connects (and logs in, the URL carries the credentials) to an Iggy server.
pub(crate) async fn connect(url: &str) -> TestResult<IggyClient> {
    let client = IggyClient::from_connection_string(url)?;
    client.connect().await?;
    Ok(client)
}

/// A producer writing continuously into every partition of the topic, round robin, each
/// message with a unique id. A failed send is retried with fresh ids (the failed batch may or
/// may not have been stored; either way ids stay unique).
pub(crate) struct Producer {
    stop: Arc<AtomicBool>,
    /// While set, the producer skips its rounds.
    paused: Arc<AtomicBool>,
    task: JoinHandle<TestResult<ProducerReport>>,
}

/// What a producer did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProducerReport {
    /// Messages acknowledged by upstream.
    pub(crate) produced: u64,
    /// Sends that failed (upstream restarts, dropped connections).
    pub(crate) failed_sends: u64,
}

impl Producer {
    /// Starts producing about `rate` messages per second.
    pub(crate) fn start(upstream_url: String, rate: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(produce(upstream_url, rate, stop.clone(), paused.clone()));
        Self { stop, paused, task }
    }

    /// Stops sending until [`Producer::resume`] (a round already under way finishes).
    pub(crate) fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }

    /// Sends again after [`Producer::pause`].
    pub(crate) fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    /// Stops producing and reports.
    pub(crate) async fn stop(self) -> TestResult<ProducerReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// Time between two rounds of sends.
const PRODUCE_TICK: Duration = Duration::from_millis(50);

async fn produce(
    url: String,
    rate: u64,
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
) -> TestResult<ProducerReport> {
    let client = connect(&url).await?;
    let stream = Identifier::named(STREAM)?;
    let topic = Identifier::named(TOPIC)?;
    let key = HeaderKey::from_str("kind")?;
    let per_partition =
        (rate * PRODUCE_TICK.as_millis() as u64 / 1000 / u64::from(PARTITIONS)).max(1);
    let mut next_id: u128 = 1;
    let mut report = ProducerReport {
        produced: 0,
        failed_sends: 0,
    };
    let mut ticker = tokio::time::interval(PRODUCE_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        if paused.load(Ordering::Relaxed) {
            continue;
        }
        for partition in 0..PARTITIONS {
            let mut messages = Vec::with_capacity(per_partition as usize);
            for _ in 0..per_partition {
                let mut payload =
                    format!("message {next_id} for partition {partition} ").into_bytes();
                payload.resize(120, b'.');
                let mut headers = BTreeMap::new();
                headers.insert(key.clone(), HeaderValue::from_str("ha-test")?);
                messages.push(
                    IggyMessage::builder()
                        .id(next_id)
                        .payload(Bytes::from(payload))
                        .user_headers(headers)
                        .build()?,
                );
                next_id += 1;
            }
            let sent = tokio::time::timeout(
                Duration::from_secs(5),
                client.send_messages(
                    &stream,
                    &topic,
                    &Partitioning::partition_id(partition),
                    &mut messages,
                ),
            )
            .await;
            match sent {
                Ok(Ok(())) => {
                    report.produced += per_partition;
                }
                // Upstream restarting or dropping connections: the SDK reconnects; the next
                // round uses new ids.
                Ok(Err(_)) | Err(_) => report.failed_sends += 1,
            }
        }
    }
    let _ = client.shutdown().await;
    Ok(report)
}

/// The common end of a scenario: stop the producer, wait for the copy to catch up, require
/// `verify` to report an exact copy, then mark the cluster passed and stop everything.
pub(crate) async fn finish_with_exact_copy(
    producer: Producer,
    servers: Servers,
    mut cluster: Cluster,
) -> TestResult {
    let report = producer.stop().await?;
    servers.wait_caught_up(Duration::from_secs(60)).await?;
    println!("produced {} messages", report.produced);
    assert!(
        cluster.verify(Duration::from_secs(30)).await?,
        "verify: not exact"
    );
    cluster.passed();
    drop(cluster);
    servers.shutdown().await;
    Ok(())
}

/// `GET /status` of a node, the fields the scenarios read.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Status {
    /// The leader it knows.
    pub(crate) leader: Option<NodeId>,
    /// Its Raft term.
    pub(crate) term: u64,
    /// Members.
    pub(crate) members: Vec<MemberView>,
    /// Units.
    pub(crate) units: Vec<UnitView>,
}

/// A member in [`Status`].
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct MemberView {
    /// Node id.
    pub(crate) id: NodeId,
    /// Units it owns.
    pub(crate) units_owned: usize,
}

/// A unit in [`Status`].
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct UnitView {
    /// The unit.
    pub(crate) unit: UnitKey,
    /// Owner.
    pub(crate) owner: Option<NodeId>,
    /// Epoch of the latest grant.
    pub(crate) epoch: serde_json::Value,
    /// Confirmed offset.
    pub(crate) confirmed_offset: Option<u64>,
    /// Release requested by the leader.
    pub(crate) release_requested: bool,
    /// No longer seen upstream.
    pub(crate) retired: bool,
}

/// A work unit's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub(crate) struct UnitKey {
    /// Flow.
    pub(crate) flow: String,
    /// Stream.
    pub(crate) stream: String,
    /// Topic.
    pub(crate) topic: String,
    /// Partition id.
    pub(crate) partition: u32,
}

impl Status {
    /// Owner of every live unit of the test topic, by partition.
    pub(crate) fn owners(&self) -> BTreeMap<u32, Option<NodeId>> {
        self.units
            .iter()
            .filter(|u| !u.retired && u.unit.stream == STREAM && u.unit.topic == TOPIC)
            .map(|u| (u.unit.partition, u.owner))
            .collect()
    }

    /// Partitions owned by `node`.
    pub(crate) fn owned_by(&self, node: NodeId) -> BTreeSet<u32> {
        self.owners()
            .into_iter()
            .filter(|(_, owner)| *owner == Some(node))
            .map(|(p, _)| p)
            .collect()
    }

    /// Whether all [`PARTITIONS`] units have an owner among `nodes`.
    pub(crate) fn all_owned_by_any_of(&self, nodes: &[NodeId]) -> bool {
        self.all_units_owned_by_any_of(nodes, PARTITIONS as usize)
    }

    /// Whether there are `units` live units (any flow, stream, topic), each owned by one of
    /// `nodes`.
    pub(crate) fn all_units_owned_by_any_of(&self, nodes: &[NodeId], units: usize) -> bool {
        let live: Vec<&UnitView> = self.units.iter().filter(|u| !u.retired).collect();
        live.len() == units
            && live
                .iter()
                .all(|u| u.owner.is_some_and(|o| nodes.contains(&o)))
    }

    /// Units owned per member, as the leader reports them.
    pub(crate) fn units_owned(&self, node: NodeId) -> usize {
        self.members
            .iter()
            .find(|m| m.id == node)
            .map_or(0, |m| m.units_owned)
    }

    /// Member ids.
    pub(crate) fn member_ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }
}

/// One replicator node process.
pub(crate) struct Node {
    /// Node id.
    pub(crate) id: NodeId,
    /// Raft address.
    pub(crate) raft_addr: SocketAddr,
    /// Admin API address.
    pub(crate) api_addr: SocketAddr,
    /// Its config file.
    pub(crate) config: PathBuf,
    /// Its log file (stdout and stderr).
    pub(crate) log: PathBuf,
    /// The running process, if any.
    child: Option<Child>,
    /// Stopped by SIGSTOP and not continued yet.
    paused: bool,
    /// Command prefix of its process.
    wrapper: Vec<String>,
    /// Cut off from its peers by the test: not asked for the leader's view.
    unreachable: bool,
    /// `--log-level` of its process.
    log_level: &'static str,
}

impl Node {
    /// Whether the process runs.
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn pid(&self) -> TestResult<Pid> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| format!("node {} is not running", self.id))?;
        Ok(Pid::from_raw(i32::try_from(child.id())?))
    }

    fn signal(&self, signal: Signal) -> TestResult {
        kill(self.pid()?, signal)?;
        Ok(())
    }
}

/// Where a node listens and how its process is launched.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    /// `node.raft_addr`.
    pub(crate) raft_addr: SocketAddr,
    /// `node.api_addr` (what the node binds).
    pub(crate) api_bind: SocketAddr,
    /// Where the test reaches the admin API (`node.advertised_api_addr` when it differs).
    pub(crate) api_addr: SocketAddr,
    /// Command prefix, e.g. `ip netns exec NS`; empty for a plain process.
    pub(crate) wrapper: Vec<String>,
}

impl Placement {
    /// A node on loopback with free ports.
    pub(crate) fn loopback() -> TestResult<Self> {
        let api = free_addr()?;
        Ok(Self {
            raft_addr: free_addr()?,
            api_bind: api,
            api_addr: api,
            wrapper: Vec::new(),
        })
    }
}

/// Free loopback port: bind port 0 and release it.
pub(crate) fn free_addr() -> TestResult<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// What the nodes of a [`Cluster`] replicate and how they run.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSpec {
    /// `[clusters.*]`, `[[flows]]` and `[pipeline]` TOML, appended to every node's config.
    pub(crate) replication_toml: String,
    /// Live units the nodes must own between them before a start returns.
    pub(crate) units: usize,
    /// `--log-level` of the node processes.
    pub(crate) log_level: &'static str,
    /// How long a start may take until every unit is owned.
    pub(crate) owned_within: Duration,
}

impl ClusterSpec {
    /// The HA scenarios' replication: [`STREAM`] from "up" to "down" with identity naming.
    pub(crate) fn ha(servers: &Servers) -> Self {
        Self {
            replication_toml: format!(
                r#"[clusters.up]
url = "{up}"

[clusters.down]
url = "{down}"

[[flows]]
name = "{FLOW}"
source = "up"
target = "down"
include = ["{STREAM}/*"]
poll_interval = "2ms"

[pipeline]
discovery_interval = "1s"
"#,
                up = servers.upstream.connection_string(),
                down = servers.downstream.connection_string(),
            ),
            units: PARTITIONS as usize,
            log_level: "info",
            owned_within: Duration::from_secs(60),
        }
    }
}

/// A cluster of replicator node processes (and the shared secret, config and data dirs).
pub(crate) struct Cluster {
    /// Temp dir with every node's config, data dir and log.
    dir: tempfile::TempDir,
    /// Cluster secret (also the admin bearer token).
    secret: String,
    /// What the nodes replicate.
    spec: ClusterSpec,
    /// Raft addresses of the bootstrap members.
    initial: BTreeMap<NodeId, SocketAddr>,
    /// The nodes by id.
    nodes: BTreeMap<NodeId, Node>,
    /// Admin API client.
    http: reqwest::Client,
    /// Set by [`Cluster::passed`]; otherwise drop prints the logs.
    passed: bool,
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) bootstrapping one cluster over `servers`, and waits until
    /// every partition is owned.
    pub(crate) async fn start(servers: &Servers, n: u64) -> TestResult<Self> {
        Self::start_spec(ClusterSpec::ha(servers), n).await
    }

    /// Starts `n` loopback nodes (ids 1..=n) replicating `spec`, and waits until every unit is
    /// owned.
    pub(crate) async fn start_spec(spec: ClusterSpec, n: u64) -> TestResult<Self> {
        let placements = (1..=n)
            .map(|id| Ok((id, Placement::loopback()?)))
            .collect::<TestResult<BTreeMap<_, _>>>()?;
        Self::launch(spec, placements).await
    }

    /// Starts the nodes of `placements` bootstrapping one cluster over `servers`, and waits
    /// until every partition is owned.
    pub(crate) async fn start_placed(
        servers: &Servers,
        placements: BTreeMap<NodeId, Placement>,
    ) -> TestResult<Self> {
        Self::launch(ClusterSpec::ha(servers), placements).await
    }

    /// Starts the nodes of `placements` bootstrapping one cluster that replicates `spec`, and
    /// waits until every unit is owned.
    pub(crate) async fn launch(
        spec: ClusterSpec,
        placements: BTreeMap<NodeId, Placement>,
    ) -> TestResult<Self> {
        let dir = tempfile::Builder::new()
            .prefix("iggy-replicator-ha-")
            .tempdir()?;
        let secret = format!("ha-test-secret-{:016x}", rand::random::<u64>());
        let mut cluster = Self {
            dir,
            secret,
            spec,
            initial: placements
                .iter()
                .map(|(id, p)| (*id, p.raft_addr))
                .collect(),
            nodes: BTreeMap::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()?,
            passed: false,
        };
        let all: Vec<NodeId> = placements.keys().copied().collect();
        for (id, placement) in placements {
            cluster.add_node_process(id, placement)?;
        }
        cluster
            .wait_all_owned(&all, cluster.spec.owned_within)
            .await?;
        Ok(cluster)
    }

    /// Writes the config of a new node `id` (bootstrap members: the cluster's initial ones)
    /// and starts its process.
    pub(crate) fn add_node_process(
        &mut self,
        id: NodeId,
        placement: Placement,
    ) -> TestResult<&Node> {
        let node_dir = self.dir.path().join(format!("node-{id}"));
        std::fs::create_dir_all(&node_dir)?;
        let config = node_dir.join("replicator.toml");
        std::fs::write(&config, self.config_text(id, &placement, &node_dir))?;
        let mut node = Node {
            id,
            raft_addr: placement.raft_addr,
            api_addr: placement.api_addr,
            config,
            log: node_dir.join("node.log"),
            child: None,
            paused: false,
            wrapper: placement.wrapper,
            unreachable: false,
            log_level: self.spec.log_level,
        };
        spawn(&mut node)?;
        self.nodes.insert(id, node);
        self.node(id)
    }

    fn config_text(&self, id: NodeId, placement: &Placement, node_dir: &Path) -> String {
        let advertised = if placement.api_addr == placement.api_bind {
            String::new()
        } else {
            format!("advertised_api_addr = \"{}\"\n", placement.api_addr)
        };
        let members = self
            .initial
            .iter()
            .map(|(id, addr)| format!("{id} = \"{addr}\""))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            r#"[node]
id = {id}
data_dir = {data:?}
raft_addr = "{raft_addr}"
api_addr = "{api_bind}"
{advertised}
[cluster]
secret = "{secret}"
initial_members = {{ {members} }}

{replication}"#,
            data = node_dir.join("data").display().to_string(),
            raft_addr = placement.raft_addr,
            api_bind = placement.api_bind,
            secret = self.secret,
            replication = self.spec.replication_toml,
        )
    }

    /// A node by id.
    pub(crate) fn node(&self, id: NodeId) -> TestResult<&Node> {
        self.nodes
            .get(&id)
            .ok_or_else(|| format!("no node {id}").into())
    }

    fn node_mut(&mut self, id: NodeId) -> TestResult<&mut Node> {
        self.nodes
            .get_mut(&id)
            .ok_or_else(|| format!("no node {id}").into())
    }

    /// Ids of the nodes whose process runs (and is not paused).
    pub(crate) fn running(&self) -> Vec<NodeId> {
        self.nodes
            .values()
            .filter(|n| n.is_running() && !n.paused && !n.unreachable)
            .map(|n| n.id)
            .collect()
    }

    /// Pids of the running node processes, by node id (the benchmarks read their CPU and RSS).
    #[allow(dead_code)]
    pub(crate) fn pids(&self) -> BTreeMap<NodeId, u32> {
        self.nodes
            .values()
            .filter_map(|n| n.child.as_ref().map(|c| (n.id, c.id())))
            .collect()
    }

    /// Config file of the first node (for `verify`).
    pub(crate) fn any_config(&self) -> TestResult<PathBuf> {
        self.nodes
            .values()
            .next()
            .map(|n| n.config.clone())
            .ok_or_else(|| "no node".into())
    }

    /// `kill -9` of a node.
    pub(crate) fn kill(&mut self, id: NodeId) -> TestResult {
        let node = self.node_mut(id)?;
        node.signal(Signal::SIGKILL)?;
        if let Some(mut child) = node.child.take() {
            child.wait()?;
        }
        node.paused = false;
        Ok(())
    }

    /// Marks a node as cut off from its peers (its view of the cluster is stale meanwhile).
    pub(crate) fn set_unreachable(&mut self, id: NodeId, unreachable: bool) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.unreachable = unreachable;
        }
    }

    /// SIGSTOP.
    pub(crate) fn pause(&mut self, id: NodeId) -> TestResult {
        let node = self.node_mut(id)?;
        node.signal(Signal::SIGSTOP)?;
        node.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub(crate) fn resume(&mut self, id: NodeId) -> TestResult {
        let node = self.node_mut(id)?;
        node.signal(Signal::SIGCONT)?;
        node.paused = false;
        Ok(())
    }

    /// SIGTERM to every running node at once, then waits for them to exit (graceful drain);
    /// returns their exit codes. A node that does not exit within `within` is killed and
    /// reported as an error.
    pub(crate) async fn terminate(
        &mut self,
        ids: &[NodeId],
        within: Duration,
    ) -> TestResult<Vec<(NodeId, Option<i32>)>> {
        for id in ids {
            self.node(*id)?.signal(Signal::SIGTERM)?;
        }
        let deadline = Deadline::new(within, format!("nodes {ids:?} to exit after SIGTERM"));
        let mut codes = Vec::new();
        for id in ids {
            loop {
                let node = self.node_mut(*id)?;
                let Some(child) = node.child.as_mut() else {
                    break;
                };
                if let Some(status) = child.try_wait()? {
                    node.child = None;
                    codes.push((*id, status.code()));
                    break;
                }
                if let Err(e) = deadline.check() {
                    self.kill(*id)?;
                    return Err(e);
                }
                tick().await;
            }
        }
        Ok(codes)
    }

    /// Starts a stopped node's process again with the same config and data dir.
    pub(crate) fn restart(&mut self, id: NodeId) -> TestResult {
        let node = self.node_mut(id)?;
        if node.child.is_some() {
            return Err(format!("node {id} is still running").into());
        }
        spawn(node)
    }

    /// `GET /status` of one node.
    pub(crate) async fn status_of(&self, id: NodeId) -> TestResult<Status> {
        let node = self.node(id)?;
        let response = self
            .http
            .get(format!("http://{}/status", node.api_addr))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("node {id}: /status answered {}", response.status()).into());
        }
        Ok(response.json().await?)
    }

    /// The status as the current leader reports it (the only one that knows lease liveness);
    /// `None` while unknown. The leader is the one named by the running nodes at the highest
    /// term: a restarted former leader briefly believes it still leads, at its old term.
    pub(crate) async fn leader_status(&self) -> Option<Status> {
        let mut views = Vec::new();
        for id in self.running() {
            if let Ok(status) = self.status_of(id).await {
                views.push((id, status));
            }
        }
        let term = views.iter().map(|(_, s)| s.term).max()?;
        let leader = views
            .iter()
            .find(|(_, s)| s.term == term && s.leader.is_some())
            .and_then(|(_, s)| s.leader)?;
        if let Some((_, status)) = views.iter().find(|(id, _)| *id == leader) {
            return (status.leader == Some(leader) && status.term == term).then(|| status.clone());
        }
        None
    }

    /// Waits until the leader reports every partition owned by one of `nodes` and each of
    /// `nodes` owning at least one; returns that status.
    pub(crate) async fn wait_all_owned(
        &self,
        nodes: &[NodeId],
        within: Duration,
    ) -> TestResult<Status> {
        let deadline = Deadline::new(
            within,
            format!("every partition owned by {nodes:?}, each owning some"),
        );
        loop {
            if let Some(status) = self.leader_status().await {
                if status.all_units_owned_by_any_of(nodes, self.spec.units)
                    && nodes.iter().all(|n| status.units_owned(*n) > 0)
                {
                    return Ok(status);
                }
            }
            if let Err(e) = deadline.check() {
                let last = self.leader_status().await;
                return Err(format!("{e}; last leader status: {last:?}").into());
            }
            tick().await;
        }
    }

    /// `iggy-replicator cluster add` against the leader's admin API (token from
    /// `REPLICATOR_TOKEN`).
    pub(crate) async fn add_member(&self, id: NodeId) -> TestResult {
        let node = self.node(id)?;
        let args = vec![
            "add".to_owned(),
            "--id".to_owned(),
            id.to_string(),
            "--raft-addr".to_owned(),
            node.raft_addr.to_string(),
            "--api-addr".to_owned(),
            node.api_addr.to_string(),
        ];
        self.cluster_command(&args).await
    }

    /// `iggy-replicator cluster remove --id N` against the leader (drain, then removal).
    pub(crate) async fn remove_member(&self, id: NodeId) -> TestResult {
        let args = vec!["remove".to_owned(), "--id".to_owned(), id.to_string()];
        self.cluster_command(&args).await
    }

    /// `iggy-replicator cluster status` of a node, as an operator sees it.
    pub(crate) async fn cluster_status_text(&self, id: NodeId) -> TestResult<String> {
        let node = self.node(id)?;
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
            .args(["cluster", "status", "--api"])
            .arg(node.api_addr.to_string())
            .env_remove("RUST_LOG")
            .kill_on_drop(true)
            .output()
            .await?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Runs `iggy-replicator cluster <args> --api <leader>` until it succeeds (the leader may
    /// change meanwhile).
    async fn cluster_command(&self, args: &[String]) -> TestResult {
        let deadline = Deadline::new(Duration::from_secs(60), format!("cluster {args:?}"));
        loop {
            let mut last = String::from("no leader");
            if let Some(status) = self.leader_status().await {
                if let Some(leader) = status.leader.and_then(|l| self.nodes.get(&l)) {
                    let output =
                        tokio::process::Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
                            .arg("cluster")
                            .args(args)
                            .arg("--api")
                            .arg(leader.api_addr.to_string())
                            .env("REPLICATOR_TOKEN", &self.secret)
                            .env_remove("RUST_LOG")
                            .kill_on_drop(true)
                            .output()
                            .await?;
                    if output.status.success() {
                        print!("{}", String::from_utf8_lossy(&output.stdout));
                        return Ok(());
                    }
                    last = format!(
                        "exit {:?}: {}",
                        output.status.code(),
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                }
            }
            if let Err(e) = deadline.check() {
                return Err(format!("{e}: {last}").into());
            }
            tick().await;
        }
    }

    /// Runs `iggy-replicator verify --config <node config> --wait <wait>`; prints its table
    /// and returns whether it reported an exact copy (exit 0).
    pub(crate) async fn verify(&self, wait: Duration) -> TestResult<bool> {
        let config = self.any_config()?;
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
            .args(["--log-level", "warn", "verify", "--wait"])
            .arg(format!("{}s", wait.as_secs()))
            .arg("--config")
            .arg(&config)
            .env_remove("RUST_LOG")
            .kill_on_drop(true)
            .output()
            .await?;
        println!("{}", String::from_utf8_lossy(&output.stdout));
        if !output.stderr.is_empty() {
            println!("verify stderr: {}", String::from_utf8_lossy(&output.stderr));
        }
        match output.status.code() {
            Some(0) => Ok(true),
            Some(3) => Ok(false),
            other => Err(format!("verify failed to run: exit {other:?}").into()),
        }
    }

    /// Prometheus text of a node's `/metrics`.
    pub(crate) async fn metrics_of(&self, id: NodeId) -> TestResult<String> {
        let node = self.node(id)?;
        Ok(self
            .http
            .get(format!("http://{}/metrics", node.api_addr))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Marks the scenario as passed: drop will not print the node logs.
    pub(crate) fn passed(&mut self) {
        self.passed = true;
    }

    /// Prints the last lines of every node log.
    pub(crate) fn print_logs(&self, lines: usize) {
        for node in self.nodes.values() {
            let text = std::fs::read_to_string(&node.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            eprintln!("---- node {} log (last {lines} lines) ----", node.id);
            for line in &all[from..] {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                let _ = child.wait();
            }
        }
        if !self.passed || std::env::var_os("HA_PRINT_LOGS").is_some() {
            self.print_logs(60);
        }
        // `HA_KEEP_DIR=1` keeps configs, Raft data and full logs for a look afterwards.
        if std::env::var_os("HA_KEEP_DIR").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
    }
}

fn spawn(node: &mut Node) -> TestResult {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&node.log)?;
    let binary = env!("CARGO_BIN_EXE_iggy-replicator");
    let mut command = match node.wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(binary);
            c
        }
        None => Command::new(binary),
    };
    let child = command
        .args(["--log-level", node.log_level, "run", "--config"])
        .arg(&node.config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    node.child = Some(child);
    node.paused = false;
    Ok(())
}

/// Where [`wait_resumed`] reads how many messages each downstream partition holds.
pub(crate) trait DownstreamCounts {
    /// Messages per partition of the watched downstream topic, by partition id.
    fn counts_now(&self) -> impl Future<Output = TestResult<Vec<u64>>>;
}

impl DownstreamCounts for Servers {
    async fn counts_now(&self) -> TestResult<Vec<u64>> {
        Ok(self.downstream_counts())
    }
}

/// How long after a fault every listed partition took to get a new message downstream.
#[derive(Debug, Clone)]
pub(crate) struct Resumption {
    /// Until the first partition moved again.
    pub(crate) first: Duration,
    /// Until every partition moved again.
    pub(crate) all: Duration,
}

/// Watches the downstream partitions `partitions` from `baseline` counts (taken after the
/// fault at `since`) until each has grown, i.e. a new owner wrote to it.
pub(crate) async fn wait_resumed(
    servers: &impl DownstreamCounts,
    partitions: &BTreeSet<u32>,
    baseline: &[u64],
    since: Instant,
    within: Duration,
) -> TestResult<Resumption> {
    let deadline = Deadline::new(
        within,
        format!("partitions {partitions:?} to be written again"),
    );
    let mut first = None;
    let mut pending = partitions.clone();
    loop {
        let now = servers.counts_now().await?;
        pending.retain(|p| now[*p as usize] <= baseline[*p as usize]);
        if pending.len() < partitions.len() && first.is_none() {
            first = Some(since.elapsed());
        }
        if pending.is_empty() {
            let all = since.elapsed();
            return Ok(Resumption {
                first: first.unwrap_or(all),
                all,
            });
        }
        if let Err(e) = deadline.check() {
            return Err(format!("{e}; still stalled: {pending:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Median and maximum of durations.
pub(crate) fn p50_max(samples: &[Duration]) -> (Duration, Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let max = sorted.last().copied().unwrap_or_default();
    (p50, max)
}
