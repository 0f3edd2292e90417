//! Where the benchmarks run: two Iggy servers (upstream and downstream), either external ones
//! given by URL or two `iggy-replicator dev-server` processes started here, plus the SDK calls
//! the scenarios share (create, fill, count, delete) and process CPU/RSS readings.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::{
    Client, CompressionAlgorithm, Identifier, IggyClient, IggyExpiry, IggyMessage, MaxTopicSize,
    MessageClient, Partitioning, StreamClient, TopicClient,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::harness::{Cluster, ClusterSpec, Deadline, DownstreamCounts, TestResult};
use crate::settings::Settings;

/// Size of every benchmark message's payload.
pub(crate) const PAYLOAD_BYTES: usize = 256;
/// Messages per send when filling a topic (also the replicator's default batch size).
pub(crate) const FILL_BATCH: u64 = 1000;

/// The two Iggy servers of a run.
pub(crate) struct Endpoints {
    /// Connection string of the source cluster.
    pub(crate) upstream_url: String,
    /// Connection string of the target cluster.
    pub(crate) downstream_url: String,
    /// The dev-server processes started here (none for external servers).
    servers: Vec<Child>,
}

impl Endpoints {
    /// External servers from `BENCH_SOURCE_URL` and `BENCH_TARGET_URL` when both are set,
    /// otherwise two dev-server processes on free loopback ports.
    pub(crate) async fn from_env() -> TestResult<Self> {
        match (
            std::env::var("BENCH_SOURCE_URL"),
            std::env::var("BENCH_TARGET_URL"),
        ) {
            (Ok(upstream_url), Ok(downstream_url)) => {
                for url in [&upstream_url, &downstream_url] {
                    connect(url).await?.shutdown().await?;
                }
                Ok(Self {
                    upstream_url,
                    downstream_url,
                    servers: Vec::new(),
                })
            }
            (Err(_), Err(_)) => {
                let mut servers = Vec::new();
                let mut urls = Vec::new();
                for _ in 0..2 {
                    let (child, url) = start_dev_server().await?;
                    servers.push(child);
                    urls.push(url);
                }
                let downstream_url = urls.pop().ok_or("no downstream server")?;
                let upstream_url = urls.pop().ok_or("no upstream server")?;
                Ok(Self {
                    upstream_url,
                    downstream_url,
                    servers,
                })
            }
            _ => Err("set both BENCH_SOURCE_URL and BENCH_TARGET_URL, or neither".into()),
        }
    }

    /// Whether the servers are external (not started by this run).
    pub(crate) fn external(&self) -> bool {
        self.servers.is_empty()
    }

    /// Pids of the dev-server processes started here (their CPU is reported apart).
    pub(crate) fn server_pids(&self) -> Vec<u32> {
        self.servers.iter().map(Child::id).collect()
    }

    /// A short description for the report.
    pub(crate) fn describe(&self) -> String {
        if self.external() {
            format!(
                "external servers {} -> {}",
                address(&self.upstream_url),
                address(&self.downstream_url)
            )
        } else {
            "two `iggy-replicator dev-server` processes (the Iggy-compatible in-memory server) on loopback".to_owned()
        }
    }
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        for child in &mut self.servers {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

/// The host:port part of a connection string (credentials are never printed).
fn address(url: &str) -> &str {
    let rest = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    rest.split('?').next().unwrap_or(rest)
}

/// Starts `iggy-replicator dev-server` on a free port and waits until it accepts a login.
async fn start_dev_server() -> TestResult<(Child, String)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
        .args(["--log-level", "warn", "dev-server", "--port"])
        .arg(port.to_string())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let url = format!("iggy://iggy:iggy@127.0.0.1:{port}");
    let deadline = Deadline::new(Duration::from_secs(30), "the dev server to accept logins");
    loop {
        if let Ok(client) = connect(&url).await {
            client.shutdown().await?;
            return Ok((child, url));
        }
        deadline.check()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connected, logged-in SDK client with Nagle's algorithm off (batches must not wait).
pub(crate) async fn connect(url: &str) -> TestResult<IggyClient> {
    let url = if url.contains("nodelay") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&nodelay=true")
    } else {
        format!("{url}?nodelay=true")
    };
    let client = IggyClient::from_connection_string(&url)?;
    client.connect().await?;
    Ok(client)
}

/// Creates `stream` (if missing) and `topic` with `partitions` partitions.
pub(crate) async fn create_topic(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
) -> TestResult {
    let stream_id = Identifier::named(stream)?;
    if client.get_stream(&stream_id).await?.is_none() {
        client.create_stream(stream).await?;
    }
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
    Ok(())
}

/// Deletes `stream` if it exists (the cleanup of every scenario).
pub(crate) async fn delete_stream(url: &str, stream: &str) -> TestResult {
    let client = connect(url).await?;
    let id = Identifier::named(stream)?;
    if client.get_stream(&id).await?.is_some() {
        client.delete_stream(&id).await?;
    }
    client.shutdown().await?;
    Ok(())
}

/// Runs `scenario`, then deletes `stream` on both servers whatever the scenario's outcome;
/// the scenario's error comes first, then a cleanup error.
pub(crate) async fn cleaned_up<T>(
    endpoints: &Endpoints,
    stream: &str,
    scenario: impl std::future::Future<Output = TestResult<T>>,
) -> TestResult<T> {
    let outcome = scenario.await;
    let up = delete_stream(&endpoints.upstream_url, stream).await;
    let down = delete_stream(&endpoints.downstream_url, stream).await;
    let value = outcome?;
    up?;
    down?;
    Ok(value)
}

/// Messages per partition of `stream/topic` (empty while it does not exist), by partition id.
pub(crate) async fn partition_counts(
    client: &IggyClient,
    stream: &str,
    topic: &str,
) -> TestResult<Vec<u64>> {
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

/// A watched topic: its counts through one client kept open.
pub(crate) struct Watch {
    /// Client of the watched server.
    client: IggyClient,
    /// Stream name.
    stream: String,
    /// Topic name.
    topic: String,
}

impl Watch {
    /// Watches `stream/topic` on the server at `url`.
    pub(crate) async fn new(url: &str, stream: &str, topic: &str) -> TestResult<Self> {
        Ok(Self {
            client: connect(url).await?,
            stream: stream.to_owned(),
            topic: topic.to_owned(),
        })
    }

    /// Sum of the messages of every partition.
    pub(crate) async fn total(&self) -> TestResult<u64> {
        Ok(self.counts_now().await?.iter().sum())
    }

    /// Waits until the topic holds `target` messages; returns when the first message appeared
    /// (relative to `since`) and when the last did.
    pub(crate) async fn wait_total(
        &self,
        target: u64,
        since: Instant,
        within: Duration,
    ) -> TestResult<(Duration, Duration)> {
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
            if let Err(e) = deadline.check() {
                return Err(format!("{e}: {total} of {target}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Closes the client.
    pub(crate) async fn close(self) {
        let _ = self.client.shutdown().await;
    }
}

impl DownstreamCounts for Watch {
    async fn counts_now(&self) -> TestResult<Vec<u64>> {
        partition_counts(&self.client, &self.stream, &self.topic).await
    }
}

/// Fills every partition of `stream/topic` with `per_partition` messages of
/// [`PAYLOAD_BYTES`] each, with ids unique in the topic, over `connections` connections.
pub(crate) async fn fill(
    url: &str,
    stream: &str,
    topic: &str,
    partitions: u32,
    per_partition: u64,
    connections: u32,
) -> TestResult {
    let payload = Bytes::from(vec![0xA5; PAYLOAD_BYTES]);
    let mut tasks = Vec::new();
    for worker in 0..connections {
        let client = connect(url).await?;
        let (stream, topic, payload) = (stream.to_owned(), topic.to_owned(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let (s, t) = (Identifier::named(&stream)?, Identifier::named(&topic)?);
            for partition in (0..partitions).filter(|p| p % connections == worker) {
                let mut sent = 0;
                while sent < per_partition {
                    let n = (per_partition - sent).min(FILL_BATCH);
                    let mut messages = (0..n)
                        .map(|i| {
                            let id = (u128::from(partition) << 64) | u128::from(sent + i + 1);
                            IggyMessage::builder()
                                .id(id)
                                .payload(payload.clone())
                                .build()
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    client
                        .send_messages(
                            &s,
                            &t,
                            &Partitioning::partition_id(partition),
                            &mut messages,
                        )
                        .await?;
                    sent += n;
                }
            }
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

/// The replication config of a benchmark cluster: one flow from `source_alias` (the upstream
/// server) to `dst` (the downstream server) over `include`, product defaults otherwise.
/// `prefix` names downstream streams `<source_alias>.<stream>`, so that several variants can
/// copy one upstream topic side by side.
pub(crate) fn replication_spec(
    endpoints: &Endpoints,
    source_alias: &str,
    include: &str,
    prefix: bool,
    settings: &Settings,
    units: usize,
) -> ClusterSpec {
    let naming = if prefix { "prefix" } else { "identity" };
    let (connections, provenance) = (settings.connections, settings.provenance);
    ClusterSpec {
        replication_toml: format!(
            r#"[clusters.{source_alias}]
url = "{up}"
connections = {connections}

[clusters.dst]
url = "{down}"
connections = {connections}

[[flows]]
name = "bench"
source = "{source_alias}"
target = "dst"
include = ["{include}"]
naming = "{naming}"
provenance = {provenance}
"#,
            up = endpoints.upstream_url,
            down = endpoints.downstream_url,
        ),
        units,
        log_level: "warn",
        owned_within: Duration::from_secs(300),
    }
}

/// A fresh name for this run's streams: `bench-<what>-<random>`.
pub(crate) fn run_name(what: &str) -> String {
    format!("bench-{what}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// Waits until the leader reports the units spread evenly over the running nodes (counts
/// differ by at most one) with no handover pending: after a start or a rejoin the leader moves
/// units for a while, and a scenario measures the steady state only after that.
pub(crate) async fn wait_balanced(cluster: &Cluster, within: Duration) -> TestResult<Duration> {
    let started = Instant::now();
    let deadline = Deadline::new(within, "the units to be spread evenly");
    loop {
        if let Some(status) = cluster.leader_status().await {
            let running = cluster.running();
            let owned: Vec<usize> = running.iter().map(|n| status.units_owned(*n)).collect();
            let (min, max) = (owned.iter().min(), owned.iter().max());
            let handing_over = status.units.iter().any(|u| u.release_requested);
            if let (Some(min), Some(max)) = (min, max) {
                if max - min <= 1 && !handing_over {
                    return Ok(started.elapsed());
                }
            }
        }
        deadline.check()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates `topics` (each with `partitions` partitions) in `stream` upstream, starts three
/// nodes replicating `stream/*` with identity naming, and waits until the units are spread
/// evenly. Returns the cluster and how long the nodes took from start to owning every unit.
pub(crate) async fn start_three_nodes(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    topics: &[String],
    partitions: u32,
) -> TestResult<(Cluster, Duration)> {
    let up = connect(&endpoints.upstream_url).await?;
    for topic in topics {
        create_topic(&up, stream, topic, partitions).await?;
    }
    up.shutdown().await?;
    let spec = replication_spec(
        endpoints,
        "up",
        &format!("{stream}/*"),
        false,
        settings,
        topics.len() * partitions as usize,
    );
    let started = Instant::now();
    let cluster = Cluster::start_spec(spec, 3).await?;
    let assigned = started.elapsed();
    wait_balanced(&cluster, Duration::from_secs(300)).await?;
    Ok((cluster, assigned))
}
