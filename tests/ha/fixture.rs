//! The HA scenarios' setup on top of `replicator-harness`: the replicated topic, the node
//! config (one flow "up" → "down", product defaults; or several servers and flows, see
//! [`Regions`]), the steady producer, and the common start and end of a scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, tick, ClusterEntry, Deadline, Endpoint, FlowEntry, MessageShape, NodeId,
    PacedProducer, Placement, ProducerParams, Replication, ReplicatorBinary, ReplicatorCluster,
    ReplicatorClusterSpec, Servers, TestResult, Topic,
};
use replicator_testkit::{TestServer, TestServerConfig};

/// Producer rate of every scenario's producer, in messages per second over the partitions it
/// writes to (16 in most scenarios).
const RATE: u64 = 1600;

/// The topic every scenario replicates: `ha/events`, 16 partitions.
pub(crate) fn topic() -> Topic {
    Topic::new("ha", "events", 16)
}

/// The nodes' replication: the topic's stream from "up" to "down", product defaults otherwise
/// (the control plane's timing included: see [`ReplicatorCluster::timing`]); with `tls`, mutual TLS
/// between the nodes and HTTPS admin APIs.
fn spec(
    servers: &Servers,
    tls: bool,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<ReplicatorClusterSpec> {
    let urls = (
        servers.upstream.connection_string(),
        servers.downstream.connection_string(),
    );
    spec_between((&urls.0, &urls.1), tls, fencing, flow_extra)
}

/// [`spec`] between the servers at `(source, target)` (connection strings).
pub(crate) fn spec_between(
    (source, target): (&str, &str),
    tls: bool,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<ReplicatorClusterSpec> {
    let replication = replication_between((source, target), fencing, flow_extra);
    spec_of(&replication, topic().partitions as usize, tls)
}

/// The nodes' spec for `replication`, whose flows have `units` partitions in all; product
/// defaults otherwise.
pub(crate) fn spec_of(
    replication: &Replication,
    units: usize,
    tls: bool,
) -> TestResult<ReplicatorClusterSpec> {
    Ok(ReplicatorClusterSpec {
        binary: ReplicatorBinary::new(env!("CARGO_BIN_EXE_iggy-replicator"))?,
        replication_toml: replication.toml(),
        cluster_toml: String::new(),
        units,
        log_level: "info",
        owned_within: Duration::from_secs(60),
        tls,
    })
}

/// The scenarios' `[clusters.*]` and `[[flows]]`, with `flow_extra` lines in the flow.
pub(crate) fn replication_toml(
    servers: &Servers,
    fencing: Option<&str>,
    flow_extra: &str,
) -> String {
    replication(servers, fencing, flow_extra).toml()
}

/// [`replication_toml`], to add flows to.
pub(crate) fn replication(
    servers: &Servers,
    fencing: Option<&str>,
    flow_extra: &str,
) -> Replication {
    let urls = (
        servers.upstream.connection_string(),
        servers.downstream.connection_string(),
    );
    replication_between((&urls.0, &urls.1), fencing, flow_extra)
}

/// The clusters `up` and `down` of `servers` (product defaults), without flows.
pub(crate) fn up_and_down(servers: &Servers) -> Replication {
    Replication::default()
        .cluster(ClusterEntry::new(
            "up",
            servers.upstream.connection_string(),
        ))
        .cluster(ClusterEntry::new(
            "down",
            servers.downstream.connection_string(),
        ))
}

/// [`replication`] between the servers at `(source, target)`.
fn replication_between(
    (source, target): (&str, &str),
    fencing: Option<&str>,
    flow_extra: &str,
) -> Replication {
    let include = format!("{}/*", topic().stream);
    Replication::default()
        .cluster(ClusterEntry::new("up", source))
        .cluster(ClusterEntry::new("down", target).fencing(fencing))
        .flow(FlowEntry::new("up-to-down", "up", "down", include).extra(flow_extra))
}

/// In-process servers, `n` loopback nodes owning every partition, the producer running and
/// the copy under way on every partition.
pub(crate) async fn start(n: u64) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    start_loopback(n, false).await
}

/// Like [`start`], with TLS between the nodes and on their admin APIs when `tls`.
pub(crate) async fn start_loopback(
    n: u64,
    tls: bool,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    let servers = Servers::start(topic()).await?;
    let placements = loopback(n)?;
    start_with(servers, placements, tls, None, "").await
}

/// Like [`start`], with the target cluster's `fencing` set (`"users"`, `"off"`).
pub(crate) async fn start_fencing(
    n: u64,
    fencing: &str,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    start_loopback_with(n, Some(fencing), "").await
}

/// Like [`start`], with `flow_extra` lines in the flow (e.g. its consumer-group sync).
pub(crate) async fn start_flow(
    n: u64,
    flow_extra: &str,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    start_loopback_with(n, None, flow_extra).await
}

/// In-process servers (the topic created upstream, empty) and `n` loopback nodes with
/// `flow_extra` lines in the flow; no producer.
pub(crate) async fn launch_idle(
    n: u64,
    flow_extra: &str,
) -> TestResult<(Servers, ReplicatorCluster)> {
    let servers = Servers::start(topic()).await?;
    let cluster =
        ReplicatorCluster::launch(spec(&servers, false, None, flow_extra)?, loopback(n)?).await?;
    Ok((servers, cluster))
}

/// `n` loopback placements, ids 1..=n.
pub(crate) fn loopback(n: u64) -> TestResult<BTreeMap<NodeId, Placement>> {
    (1..=n).map(|id| Ok((id, Placement::loopback()?))).collect()
}

/// `n` loopback nodes with the target's `fencing` and `flow_extra` lines in the flow.
async fn start_loopback_with(
    n: u64,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    let servers = Servers::start(topic()).await?;
    let placements = loopback(n)?;
    start_with(servers, placements, false, fencing, flow_extra).await
}

/// Like [`start`] with the given servers and node placements.
pub(crate) async fn start_placed(
    servers: Servers,
    placements: BTreeMap<NodeId, Placement>,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    start_with(servers, placements, false, None, "").await
}

async fn start_with(
    servers: Servers,
    placements: BTreeMap<NodeId, Placement>,
    tls: bool,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    let cluster =
        ReplicatorCluster::launch(spec(&servers, tls, fencing, flow_extra)?, placements).await?;
    let producer = produce_into(servers.upstream.connection_string());
    servers.wait_copy_started(Duration::from_secs(30)).await?;
    Ok((servers, cluster, producer))
}

/// The scenarios' producer into [`topic`] on `server`.
pub(crate) fn produce_into(server: impl Into<Endpoint>) -> PacedProducer {
    PacedProducer::start(producer_params(server, &[&topic()]))
}

/// The scenarios' producer parameters: [`RATE`] messages per second into every partition of
/// `topics` on `server`, until stopped.
pub(crate) fn producer_params(server: impl Into<Endpoint>, topics: &[&Topic]) -> ProducerParams {
    let targets: Vec<_> = topics.iter().flat_map(|t| t.targets()).collect();
    let partitions = targets.len() as u64;
    let mut params = ProducerParams::new(server, targets, RATE);
    // One send of a few messages per partition and round; a send that fails while a server
    // restarts or drops connections is counted and skipped.
    params.tick = Duration::from_millis(50);
    params.batch = (RATE / 20 / partitions.max(1)).max(1);
    params.shape = MessageShape {
        payload_bytes: 120,
        label: Some("ha message".to_owned()),
        header: Some(("kind".to_owned(), "ha-test".to_owned())),
    };
    params.tolerate_send_errors = true;
    params
}

/// A follower (not the Raft leader) that owns partitions of `topic`, and those partitions.
pub(crate) async fn owning_follower(
    cluster: &ReplicatorCluster,
    topic: &Topic,
) -> TestResult<(NodeId, BTreeSet<u32>)> {
    let mut followers = owning_followers(cluster, topic).await?;
    Ok(followers.swap_remove(0))
}

/// Every follower (not the Raft leader) that owns partitions of `topic`, with those
/// partitions, by node id; an error when there is none.
pub(crate) async fn owning_followers(
    cluster: &ReplicatorCluster,
    topic: &Topic,
) -> TestResult<Vec<(NodeId, BTreeSet<u32>)>> {
    let status = cluster.leader_status().await.ok_or("no leader")?;
    let leader = status.leader.ok_or("no leader")?;
    let followers: Vec<_> = cluster
        .running()
        .into_iter()
        .filter(|id| *id != leader)
        .map(|id| (id, status.owned_by(topic, id)))
        .filter(|(_, owned)| !owned.is_empty())
        .collect();
    if followers.is_empty() {
        return Err(format!("no follower owns partitions of {}", topic.stream).into());
    }
    Ok(followers)
}

/// Asserts that nothing is copied for `quiet` (failing with `why`); returns the downstream
/// message counts per partition, which stayed as they were.
pub(crate) async fn assert_nothing_copied(
    servers: &Servers,
    quiet: Duration,
    why: &str,
) -> Vec<u64> {
    let counts = servers.downstream_counts();
    tokio::time::sleep(quiet).await;
    assert_eq!(servers.downstream_counts(), counts, "{why}");
    counts
}

/// The common end of a scenario: stop the producer, wait for the copy to catch up, require
/// `verify` to report an exact copy, then mark the cluster passed and stop everything.
pub(crate) async fn finish_with_exact_copy(
    producer: PacedProducer,
    servers: Servers,
    cluster: ReplicatorCluster,
) -> TestResult {
    let report = producer.stop().await?;
    let caught_up = servers.wait_caught_up(Duration::from_secs(60)).await?;
    println!(
        "produced {} messages ({} failed sends); caught up {:.2} s after the producer stopped",
        report.produced,
        report.failed_sends,
        caught_up.as_secs_f64()
    );
    finish_exact(servers, cluster).await
}

/// Requires `verify` to report an exact copy, then marks the cluster passed and stops
/// everything.
pub(crate) async fn finish_exact(servers: Servers, cluster: ReplicatorCluster) -> TestResult {
    pass_if_exact(cluster).await?;
    servers.shutdown().await;
    Ok(())
}

/// Requires `verify` of every flow to report an exact copy, then marks the cluster passed and
/// stops its nodes.
pub(crate) async fn pass_if_exact(mut cluster: ReplicatorCluster) -> TestResult {
    assert!(
        cluster.verify(Duration::from_secs(30)).await?,
        "verify: not exact"
    );
    cluster.passed();
    drop(cluster);
    Ok(())
}

/// Requires `verify --flow <flow>` to report an exact copy (every message once, in order,
/// per partition) within `within` from now, which is `when` (e.g. "after the producer
/// stopped"); prints its table and how long it took.
pub(crate) async fn exact_within(
    cluster: &ReplicatorCluster,
    flow: &str,
    within: Duration,
    when: &str,
) -> TestResult {
    let started = Instant::now();
    let run = cluster.run_verify_flow(Some(flow), within).await?;
    println!("{}", run.stdout);
    let total = run
        .stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("total: "))
        .unwrap_or("no total");
    if !run.exact {
        return Err(format!(
            "flow {flow}: not an exact copy {:.0} s {when} ({total})",
            within.as_secs_f64()
        )
        .into());
    }
    println!(
        "flow {flow}: exact {:.2} s {when}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Waits until the producer has acknowledged `more` messages from now on (it keeps writing
/// meanwhile); fails when that takes longer than twice its rate says.
pub(crate) async fn produced_more(producer: &PacedProducer, more: u64) -> TestResult {
    let target = producer.produced() + more;
    let deadline = Deadline::new(
        Duration::from_secs(2 * more / RATE + 30),
        format!("{more} more messages produced"),
    );
    while producer.produced() < target {
        deadline.check_seeing(|| format!("{} of {target}", producer.produced()))?;
        tick().await;
    }
    Ok(())
}

/// In-process Iggy servers by cluster alias, for scenarios with more than two clusters or more
/// than one flow: the first is the source, where the scenario's topics are created.
pub(crate) struct Regions {
    /// The servers, the source first.
    servers: Vec<(&'static str, TestServer)>,
}

impl Regions {
    /// Starts a server per alias and creates `topics` on the first.
    pub(crate) async fn start(aliases: &[&'static str], topics: &[&Topic]) -> TestResult<Self> {
        let mut servers = Vec::new();
        for alias in aliases {
            servers.push((
                *alias,
                TestServer::start(TestServerConfig::default()).await?,
            ));
        }
        let regions = Self { servers };
        let source = connect(&regions.source().connection_string()).await?;
        for topic in topics {
            ensure_topic(&source, &topic.stream, &topic.name, topic.partitions).await?;
        }
        let _ = source.shutdown().await;
        Ok(regions)
    }

    /// The source server.
    pub(crate) fn source(&self) -> &TestServer {
        &self.servers[0].1
    }

    /// The server of `alias`.
    pub(crate) fn server(&self, alias: &str) -> &TestServer {
        self.servers
            .iter()
            .find(|(a, _)| *a == alias)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no server {alias}"))
    }

    /// `[clusters.<alias>]` of the server of `alias`, with its `fencing` (`None`: the product
    /// default, "users").
    pub(crate) fn entry(&self, alias: &str, fencing: Option<&str>) -> ClusterEntry {
        ClusterEntry::new(alias, self.server(alias).connection_string()).fencing(fencing)
    }

    /// Waits until every partition of `topic` on the server of `alias` holds messages.
    pub(crate) async fn wait_copy_started(&self, alias: &str, topic: &Topic) -> TestResult {
        let deadline = Deadline::new(
            Duration::from_secs(30),
            format!("every partition of {} copied to {alias}", topic.stream),
        );
        loop {
            let counts = topic.counts_on(self.server(alias));
            if !counts.contains(&0) {
                return Ok(());
            }
            deadline.check_seeing(|| format!("{counts:?}"))?;
            tick().await;
        }
    }

    /// Starts a producer into `topic` on the source.
    pub(crate) fn produce(&self, topic: &Topic) -> PacedProducer {
        let url = self.source().connection_string();
        PacedProducer::start(producer_params(&url, &[topic]))
    }

    /// Pauses `producer` (which writes into `topic`) and waits until the server of `alias`
    /// holds every message of `partitions` of `topic` that the source holds (or more: a
    /// duplicate is for `verify` to report): nothing of them is on its way there. The caller
    /// resumes the producer.
    pub(crate) async fn quiesce(
        &self,
        producer: &PacedProducer,
        alias: &str,
        topic: &Topic,
        partitions: &[u32],
    ) -> TestResult {
        producer.pause();
        let deadline = Deadline::new(
            Duration::from_secs(60),
            format!(
                "partitions {partitions:?} of {} copied to {alias}",
                topic.stream
            ),
        );
        // A round of sends under way when the producer paused still lands: wait until its
        // count stands still over a tick, and the copies caught up with it.
        let mut produced = producer.produced();
        loop {
            tick().await;
            let (up, down) = (
                topic.counts_on(self.source()),
                topic.counts_on(self.server(alias)),
            );
            let now = producer.produced();
            let still = now == produced;
            produced = now;
            if still
                && partitions
                    .iter()
                    .all(|p| down[*p as usize] >= up[*p as usize])
            {
                return Ok(());
            }
            deadline.check_seeing(|| format!("upstream {up:?}, {alias} {down:?}"))?;
        }
    }

    /// The end of a scenario: requires `verify` of every flow of `cluster` to report an exact
    /// copy, marks it passed, and stops it and the servers.
    pub(crate) async fn finish(self, cluster: ReplicatorCluster) -> TestResult {
        pass_if_exact(cluster).await?;
        for (_, server) in self.servers {
            server.shutdown().await;
        }
        Ok(())
    }
}
