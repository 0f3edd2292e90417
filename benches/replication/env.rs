//! Where the benchmarks run: two Iggy servers (upstream and downstream), either external ones
//! given by URL or two `iggy-replicator dev-server` processes started here, the topic filling
//! the scenarios share, process CPU/RSS readings, and a three-node cluster over them.

use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::IggyMessage;
use replicator_harness::{
    connect, delete_stream, ensure_topic, produce_bulk, Bulk, DevServer, Endpoint, NodeId,
    ReplicatorBinary, ReplicatorCluster, ReplicatorClusterSpec, TestResult,
};

use crate::settings::{Far, Settings};
use replicator_harness::IggyCluster as _;
use replicator_model::IggyVersion;
use replicator_testkit::wan::{WanLink, WanProxy};

/// Size of every benchmark message's payload.
pub(crate) const PAYLOAD_BYTES: usize = 256;
/// Messages per send when filling a topic (also the replicator's default batch size).
pub(crate) const FILL_BATCH: u64 = 1000;

/// The two Iggy servers of a run, and the binaries the nodes and the tools run.
pub(crate) struct Endpoints {
    /// This build's `iggy-replicator` executable (dev servers).
    pub(crate) binary: ReplicatorBinary,
    /// The executable the replicator nodes (and their `verify`) run: `BENCH_NODE_BINARY`, to
    /// measure another build (an older commit) with this build's scenarios and servers, or
    /// this build's.
    pub(crate) nodes: ReplicatorBinary,
    /// The source cluster: its connection string and generation, as the replicator nodes and
    /// the benchmark's own tools (filling, watching, the raw loop) reach it.
    pub(crate) upstream: Endpoint,
    /// The same for the target cluster.
    pub(crate) downstream: Endpoint,
    /// The dev-server processes started here (none for external servers).
    servers: Vec<DevServer>,
    /// `BENCH_SERVER_PIDS=<source pid>,<target pid>`: external servers running on this machine,
    /// whose CPU the catch-up reports and waits to settle, as it does for dev servers.
    external_pids: Option<[u32; 2]>,
}

impl Endpoints {
    /// External servers from `BENCH_SOURCE_URL` and `BENCH_TARGET_URL` when both are set,
    /// otherwise two dev-server processes on loopback ports the OS picked; either pair speaks
    /// the generations of `BENCH_IGGY_VERSIONS`.
    pub(crate) async fn from_env() -> TestResult<Self> {
        let binary = ReplicatorBinary::new(env!("CARGO_BIN_EXE_iggy-replicator"))?;
        let nodes = match std::env::var_os("BENCH_NODE_BINARY") {
            Some(path) => {
                ReplicatorBinary::new(path).map_err(|e| format!("BENCH_NODE_BINARY: {e}"))?
            }
            None => binary.clone(),
        };
        let (up_version, down_version) = versions_from_env()?;
        match (
            std::env::var("BENCH_SOURCE_URL"),
            std::env::var("BENCH_TARGET_URL"),
        ) {
            (Ok(upstream_url), Ok(downstream_url)) => {
                let upstream = Endpoint::new(up_version, upstream_url);
                let downstream = Endpoint::new(down_version, downstream_url);
                for (name, server) in [
                    ("BENCH_SOURCE_URL", &upstream),
                    ("BENCH_TARGET_URL", &downstream),
                ] {
                    let client = connect(server).await.map_err(|e| {
                        format!(
                            "{name} ({}, Iggy {} by BENCH_IGGY_VERSIONS): {e}",
                            address(&server.url),
                            server.iggy_version
                        )
                    })?;
                    client.shutdown().await?;
                }
                Ok(Self {
                    binary,
                    nodes,
                    upstream,
                    downstream,
                    servers: Vec::new(),
                    external_pids: external_pids_from_env()?,
                })
            }
            (Err(_), Err(_)) => {
                let up = DevServer::start_in(&binary, up_version).await?;
                let down = DevServer::start_in(&binary, down_version).await?;
                Ok(Self {
                    upstream: up.endpoint().clone(),
                    downstream: down.endpoint().clone(),
                    servers: vec![up, down],
                    binary,
                    nodes,
                    external_pids: None,
                })
            }
            _ => Err("set both BENCH_SOURCE_URL and BENCH_TARGET_URL, or neither".into()),
        }
    }

    /// Whether the servers are external (not started by this run).
    pub(crate) fn external(&self) -> bool {
        self.servers.is_empty()
    }

    /// Pids of the source and the target server, when they run on this machine as processes
    /// the run knows (dev servers, or `BENCH_SERVER_PIDS`): their CPU is reported apart.
    pub(crate) fn server_pids(&self) -> Option<[u32; 2]> {
        match self.servers.as_slice() {
            [up, down] => Some([up.pid(), down.pid()]),
            _ => self.external_pids,
        }
    }

    /// A short description for the report.
    pub(crate) fn describe(&self) -> String {
        if self.external() {
            format!(
                "external servers {} (Iggy {}) -> {} (Iggy {})",
                address(&self.upstream.url),
                self.upstream.iggy_version,
                address(&self.downstream.url),
                self.downstream.iggy_version
            )
        } else {
            format!(
                "two `iggy-replicator dev-server` processes (the Iggy-compatible in-memory \
                 server) on loopback, Iggy {} -> Iggy {}",
                self.upstream.iggy_version, self.downstream.iggy_version
            )
        }
    }
}

/// `BENCH_SERVER_PIDS=<source pid>,<target pid>`, if set; both must be running processes.
fn external_pids_from_env() -> TestResult<Option<[u32; 2]>> {
    let Ok(text) = std::env::var("BENCH_SERVER_PIDS") else {
        return Ok(None);
    };
    let malformed = || format!("BENCH_SERVER_PIDS={text:?}: want <source pid>,<target pid>");
    let pids: Vec<u32> = text
        .split(',')
        .map(|p| p.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| malformed())?;
    let [up, down] = pids[..] else {
        return Err(malformed().into());
    };
    for pid in [up, down] {
        if cpu_seconds(pid).is_none() {
            return Err(format!("BENCH_SERVER_PIDS: no process {pid} on this machine").into());
        }
    }
    Ok(Some([up, down]))
}

/// `BENCH_IGGY_VERSIONS=<source>-<target>` (e.g. `0.8-0.9`); default `0.8-0.8`.
fn versions_from_env() -> TestResult<(IggyVersion, IggyVersion)> {
    let Ok(spec) = std::env::var("BENCH_IGGY_VERSIONS") else {
        return Ok((IggyVersion::V0_8, IggyVersion::V0_8));
    };
    let parsed = spec
        .split_once('-')
        .and_then(|(up, down)| Some((up.parse().ok()?, down.parse().ok()?)));
    parsed.ok_or_else(|| {
        format!("BENCH_IGGY_VERSIONS={spec:?}: expected <source>-<target>, e.g. 0.8-0.9").into()
    })
}

/// The host:port part of a connection string (credentials are never printed).
fn address(url: &str) -> &str {
    let rest = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    rest.split('?').next().unwrap_or(rest)
}

/// Runs `scenario`, then deletes `stream` on both servers whatever the scenario's outcome;
/// the scenario's error comes first, then a cleanup error.
pub(crate) async fn cleaned_up<T>(
    endpoints: &Endpoints,
    stream: &str,
    scenario: impl std::future::Future<Output = TestResult<T>>,
) -> TestResult<T> {
    let outcome = scenario.await;
    let up = delete_stream(&endpoints.upstream, stream).await;
    let down = delete_stream(&endpoints.downstream, stream).await;
    let value = outcome?;
    up?;
    down?;
    Ok(value)
}

/// Fills every partition of `stream/topic` with `per_partition` messages of
/// [`PAYLOAD_BYTES`] each, with ids unique in the topic, over `connections` connections.
pub(crate) async fn fill(
    server: &Endpoint,
    stream: &str,
    topic: &str,
    partitions: u32,
    per_partition: u64,
    connections: u32,
) -> TestResult {
    let payload = Bytes::from(vec![0xA5; PAYLOAD_BYTES]);
    let mut tasks = Vec::new();
    for worker in 0..connections {
        let client = connect(server).await?;
        let bulk = Bulk {
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            partitions: (0..partitions)
                .filter(|p| p % connections == worker)
                .collect(),
            range: 0..per_partition,
            batch: FILL_BATCH,
        };
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            produce_bulk(&client, &bulk, |partition, seq| {
                IggyMessage::builder()
                    .id((u128::from(partition) << 64) | u128::from(seq + 1))
                    .payload(payload.clone())
                    .build()
            })
            .await?;
            client.shutdown().await?;
            TestResult::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// CPU seconds (user + system) a process has used so far; `None` once it is gone.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Context switches (voluntary and not) of the threads `pid` runs now (`self` for this
/// process): threads that ended no longer count; 0 when the process is gone.
pub(crate) fn context_switches(pid: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// CPU seconds this benchmark process has used so far.
pub(crate) fn own_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_cpu(&s))
        .unwrap_or_default()
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds.
fn stat_cpu(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces; fields are counted after its closing paren.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Clock ticks per second of `/proc` CPU times.
fn clock_ticks() -> f64 {
    use std::sync::OnceLock;
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .map_or(100.0, |t| t as f64)
    })
}

/// Resident set size of a process in bytes.
pub(crate) fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Sum of CPU seconds of `pids` (processes already gone count as 0).
pub(crate) fn total_cpu(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|pid| cpu_seconds(*pid)).sum()
}

/// The replication config of a benchmark cluster: one flow from `source_alias` (`source`: the
/// upstream server, or a proxy in front of it, or an in-process clustered 0.9 server named by
/// every replica's address) to `dst` (`target`, likewise) over `include`, product defaults
/// otherwise. `prefix` names downstream streams `<source_alias>.<stream>`, so that several
/// variants can copy one upstream topic side by side. Every cluster gets writer users of its own
/// prefix (`bench-<random>`): the clusters of one run share the target, and a cluster that
/// starts again at incarnation 1 would otherwise meet the users an earlier one revoked there.
pub(crate) fn replication_spec_between(
    endpoints: &Endpoints,
    (source, target): (&Endpoint, &Endpoint),
    source_alias: &str,
    include: &str,
    prefix: bool,
    settings: &Settings,
    units: usize,
) -> ReplicatorClusterSpec {
    let naming = if prefix { "prefix" } else { "identity" };
    let (connections, provenance) = (settings.connections, settings.provenance);
    let batch_size = settings.batch_size;
    let max_batch_bytes = settings.max_batch_bytes;
    // Written only when set otherwise than the default, so that nodes of releases before the
    // key (`BENCH_NODE_BINARY`) still read the config.
    let optional = |key: &str, value: u64, default: u64| {
        if value == default {
            String::new()
        } else {
            format!("{key} = {value}\n")
        }
    };
    let far_source_polls = optional(
        "far_source_polls",
        u64::from(settings.far_source_polls),
        u64::from(replicator_model::DEFAULT_FAR_SOURCE_POLLS),
    );
    let far_connections = optional(
        "far_connections",
        settings.far_connections as u64,
        replicator_config::DEFAULT_FAR_CONNECTIONS as u64,
    );
    let fencing = &settings.fencing;
    let writers = format!("bench-{:06x}", rand::random::<u32>() & 0xff_ffff);
    ReplicatorClusterSpec {
        binary: endpoints.nodes.clone(),
        replication_toml: format!(
            r#"[clusters.{source_alias}]
url = "{up}"
iggy_version = "{up_version}"
connections = {connections}
{far_connections}
[clusters.dst]
url = "{down}"
iggy_version = "{down_version}"
connections = {connections}
{far_connections}fencing = "{fencing}"
writer_user_prefix = "{writers}"

[[flows]]
name = "bench"
source = "{source_alias}"
target = "dst"
include = ["{include}"]
naming = "{naming}"
provenance = {provenance}
batch_size = {batch_size}
max_batch_bytes = {max_batch_bytes}
{far_source_polls}"#,
            up = source.url,
            down = target.url,
            up_version = source.iggy_version,
            down_version = target.iggy_version,
        ),
        cluster_toml: String::new(),
        units,
        log_level: "warn",
        owned_within: Duration::from_secs(300),
        tls: false,
    }
}

/// The source and the target as one copy reaches them: with `BENCH_WAN_RTT_MS`, the far one
/// through a fresh [`WanProxy`] (returned, to stop afterwards).
pub(crate) async fn distance(
    endpoints: &Endpoints,
    settings: &Settings,
) -> TestResult<(Option<WanProxy>, Endpoint, Endpoint)> {
    let (mut source, mut target) = (endpoints.upstream.clone(), endpoints.downstream.clone());
    let Some(wan) = settings.wan else {
        return Ok((None, source, target));
    };
    let far = match wan.far {
        Far::Source => &mut source,
        Far::Target => &mut target,
    };
    let (before, rest) = far
        .url
        .split_once('@')
        .ok_or_else(|| format!("no credentials in {}", far.url))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let address: std::net::SocketAddr = rest[..end]
        .parse()
        .map_err(|e| format!("{}: not an ip:port ({e})", &rest[..end]))?;
    let proxy = WanProxy::start(address, WanLink::symmetric(wan.rtt / 2)).await?;
    far.url = format!("{before}@{}{}", proxy.addr(), &rest[end..]);
    Ok((Some(proxy), source, target))
}

/// A fresh name for this run's streams: `bench-<what>-<random>`.
pub(crate) fn run_name(what: &str) -> String {
    format!("bench-{what}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// Waits until the leader reports the units spread evenly over the running nodes with no
/// handover pending: after a start or a rejoin the leader moves units for a while, and a
/// scenario measures the steady state only after that.
pub(crate) async fn wait_balanced(cluster: &ReplicatorCluster, within: Duration) -> TestResult {
    cluster.wait_balanced(&cluster.running(), within).await?;
    Ok(())
}

/// Starts the killed `victim` again and waits until `nodes` (the victim among them) own every
/// unit, spread evenly: the steady state the next failover round starts from.
pub(crate) async fn restart_and_rebalance(
    cluster: &mut ReplicatorCluster,
    victim: NodeId,
    nodes: &[NodeId],
) -> TestResult {
    cluster.restart(victim)?;
    let mut everyone = nodes.to_vec();
    everyone.sort_unstable();
    cluster
        .wait_all_owned(&everyone, Duration::from_secs(120))
        .await?;
    wait_balanced(cluster, Duration::from_secs(120)).await
}

/// Creates `topics` (each with `partitions` partitions) in `stream` upstream, starts three
/// nodes replicating `stream/*` with identity naming, and waits until the units are spread
/// evenly. Returns the cluster, how long the nodes took from start to owning every unit, and
/// the proxy in front of the far server when `BENCH_WAN_RTT_MS` asks for one (the nodes reach
/// that server through it; the benchmark's own producers and watchers go direct).
pub(crate) async fn start_three_nodes(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    topics: &[String],
    partitions: u32,
) -> TestResult<(ReplicatorCluster, Duration, Option<WanProxy>)> {
    let up = connect(&endpoints.upstream).await?;
    for topic in topics {
        ensure_topic(&up, stream, topic, partitions).await?;
    }
    up.shutdown().await?;
    let (proxy, source, target) = distance(endpoints, settings).await?;
    let spec = replication_spec_between(
        endpoints,
        (&source, &target),
        "up",
        &format!("{stream}/*"),
        false,
        settings,
        topics.len() * partitions as usize,
    );
    let started = Instant::now();
    let cluster = ReplicatorCluster::start(spec, 3).await?;
    let assigned = started.elapsed();
    wait_balanced(&cluster, Duration::from_secs(300)).await?;
    Ok((cluster, assigned, proxy))
}
