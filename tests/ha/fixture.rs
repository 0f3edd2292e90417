//! The HA scenarios' setup on top of `replicator-harness`: the replicated topic, the node
//! config (one flow "up" → "down", product defaults), the steady producer, and the common
//! start and end of a scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use replicator_harness::{
    Cluster, ClusterSpec, FlowConfig, MessageShape, NodeId, PacedProducer, Placement,
    ProducerParams, ReplicatorBinary, Servers, TestResult, Topic,
};

/// Producer rate of every scenario, in messages per second over the 16 partitions.
const RATE: u64 = 1600;

/// The topic every scenario replicates: `ha/events`, 16 partitions.
pub(crate) fn topic() -> Topic {
    Topic::new("ha", "events", 16)
}

/// The nodes' replication: the topic's stream from "up" to "down", product defaults otherwise
/// (the control plane's timing included: see [`Cluster::timing`]); with `tls`, mutual TLS
/// between the nodes and HTTPS admin APIs.
fn spec(
    servers: &Servers,
    tls: bool,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<ClusterSpec> {
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
) -> TestResult<ClusterSpec> {
    Ok(ClusterSpec {
        binary: ReplicatorBinary::new(env!("CARGO_BIN_EXE_iggy-replicator"))?,
        replication_toml: toml_between((source, target), fencing, flow_extra),
        units: topic().partitions as usize,
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
    let urls = (
        servers.upstream.connection_string(),
        servers.downstream.connection_string(),
    );
    toml_between((&urls.0, &urls.1), fencing, flow_extra)
}

/// [`replication_toml`] between the servers at `(source, target)`.
fn toml_between((source, target): (&str, &str), fencing: Option<&str>, flow_extra: &str) -> String {
    FlowConfig {
        name: "up-to-down",
        source_alias: "up",
        source_url: source,
        target_alias: "down",
        target_url: target,
        include: &format!("{}/*", topic().stream),
        target_fencing: fencing,
        target_iggy_version: None,
        flow_extra,
    }
    .toml()
}

/// In-process servers, `n` loopback nodes owning every partition, the producer running and
/// the copy under way on every partition.
pub(crate) async fn start(n: u64) -> TestResult<(Servers, Cluster, PacedProducer)> {
    start_loopback(n, false).await
}

/// Like [`start`], with TLS between the nodes and on their admin APIs when `tls`.
pub(crate) async fn start_loopback(
    n: u64,
    tls: bool,
) -> TestResult<(Servers, Cluster, PacedProducer)> {
    let servers = Servers::start(topic()).await?;
    let placements = loopback(n)?;
    start_with(servers, placements, tls, None, "").await
}

/// Like [`start`], with the target cluster's `fencing` set (`"users"`, `"off"`).
pub(crate) async fn start_fencing(
    n: u64,
    fencing: &str,
) -> TestResult<(Servers, Cluster, PacedProducer)> {
    start_loopback_with(n, Some(fencing), "").await
}

/// Like [`start`], with `flow_extra` lines in the flow (e.g. its consumer-group sync).
pub(crate) async fn start_flow(
    n: u64,
    flow_extra: &str,
) -> TestResult<(Servers, Cluster, PacedProducer)> {
    start_loopback_with(n, None, flow_extra).await
}

/// In-process servers (the topic created upstream, empty) and `n` loopback nodes with
/// `flow_extra` lines in the flow; no producer.
pub(crate) async fn launch_idle(n: u64, flow_extra: &str) -> TestResult<(Servers, Cluster)> {
    let servers = Servers::start(topic()).await?;
    let cluster = Cluster::launch(spec(&servers, false, None, flow_extra)?, loopback(n)?).await?;
    Ok((servers, cluster))
}

/// `n` loopback placements, ids 1..=n.
fn loopback(n: u64) -> TestResult<BTreeMap<NodeId, Placement>> {
    (1..=n).map(|id| Ok((id, Placement::loopback()?))).collect()
}

/// `n` loopback nodes with the target's `fencing` and `flow_extra` lines in the flow.
async fn start_loopback_with(
    n: u64,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<(Servers, Cluster, PacedProducer)> {
    let servers = Servers::start(topic()).await?;
    let placements = loopback(n)?;
    start_with(servers, placements, false, fencing, flow_extra).await
}

/// Like [`start`] with the given servers and node placements.
pub(crate) async fn start_placed(
    servers: Servers,
    placements: BTreeMap<NodeId, Placement>,
) -> TestResult<(Servers, Cluster, PacedProducer)> {
    start_with(servers, placements, false, None, "").await
}

async fn start_with(
    servers: Servers,
    placements: BTreeMap<NodeId, Placement>,
    tls: bool,
    fencing: Option<&str>,
    flow_extra: &str,
) -> TestResult<(Servers, Cluster, PacedProducer)> {
    let cluster = Cluster::launch(spec(&servers, tls, fencing, flow_extra)?, placements).await?;
    let producer = produce_into(&servers.upstream.connection_string());
    servers.wait_copy_started(Duration::from_secs(30)).await?;
    Ok((servers, cluster, producer))
}

/// The scenarios' producer into [`topic`] on the server at `url`.
pub(crate) fn produce_into(url: &str) -> PacedProducer {
    let topic = topic();
    let mut params = ProducerParams::new(url, topic.targets(), RATE);
    // One send of a few messages per partition and round; a send that fails while a server
    // restarts or drops connections is counted and skipped.
    params.tick = Duration::from_millis(50);
    params.batch = (RATE / 20 / u64::from(topic.partitions)).max(1);
    params.shape = MessageShape {
        payload_bytes: 120,
        label: Some("ha message".to_owned()),
        header: Some(("kind".to_owned(), "ha-test".to_owned())),
    };
    params.tolerate_send_errors = true;
    PacedProducer::start(params)
}

/// A follower (not the Raft leader) that owns partitions of the topic, and those partitions.
pub(crate) async fn owning_follower(
    servers: &Servers,
    cluster: &Cluster,
) -> TestResult<(NodeId, BTreeSet<u32>)> {
    let status = cluster.leader_status().await.ok_or("no leader")?;
    let leader = status.leader.ok_or("no leader")?;
    let node = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader && !status.owned_by(&servers.topic, *id).is_empty())
        .ok_or("no follower owns units")?;
    Ok((node, status.owned_by(&servers.topic, node)))
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
    cluster: Cluster,
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
pub(crate) async fn finish_exact(servers: Servers, mut cluster: Cluster) -> TestResult {
    assert!(
        cluster.verify(Duration::from_secs(30)).await?,
        "verify: not exact"
    );
    cluster.passed();
    drop(cluster);
    servers.shutdown().await;
    Ok(())
}
