//! Benchmark knobs, from environment variables, and the machine they ran on.

use std::fmt;

use replicator_harness::TestResult;

/// What the scenarios do; every field has an environment variable and a default.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `BENCH_MESSAGES`: messages of the catch-up topic (default 1,000,000).
    pub(crate) messages: u64,
    /// `BENCH_ROUNDS`: rounds of each catch-up variant (default 3).
    pub(crate) rounds: u32,
    /// `BENCH_BATCH_SIZE`: messages per poll and per send of the replicator's flows and of the
    /// raw loop (default: the replicator's default).
    pub(crate) batch_size: u32,
    /// `BENCH_CONNECTIONS`: connections per Iggy cluster of every replicator instance and of the
    /// raw loop (default: the replicator's default).
    pub(crate) connections: usize,
    /// `BENCH_RATES`: latency rates in msg/s (default `1000,20000,100000`).
    pub(crate) rates: Vec<u64>,
    /// `BENCH_LATENCY_SECONDS`: how long each rate is produced (default 10).
    pub(crate) latency_seconds: u64,
    /// `BENCH_FAILOVERS`: `kill -9` rounds (default 10).
    pub(crate) failovers: u32,
    /// `BENCH_FAILOVER_RATE`: msg/s produced during the failovers (default 5,000).
    pub(crate) failover_rate: u64,
    /// `BENCH_SEED`: picks the failover victims (default 1).
    pub(crate) seed: u64,
    /// `BENCH_SCALE_TOPICS` × `BENCH_SCALE_PARTITIONS`: the partition-scale layout
    /// (default 50 × 20).
    pub(crate) scale_topics: u32,
    /// See `scale_topics`.
    pub(crate) scale_partitions: u32,
    /// `BENCH_SCALE_RATE`: msg/s spread over all partitions under load (default 2,000); also the
    /// traffic of the leader-kills scenario.
    pub(crate) scale_rate: u64,
    /// `BENCH_PROVENANCE`: `0` turns provenance headers off in every flow, to show what they
    /// cost (default 1: the product default, on).
    pub(crate) provenance: bool,
    /// `BENCH_SAMPLE_SECONDS`: CPU and Raft sampling window of the scale scenario (default 10).
    pub(crate) sample_seconds: u64,
    /// `BENCH_SCALE_SETTLE_SECONDS`: pause of the scale scenario between every unit owned and
    /// its idle window (default 3). The readers' safety-net polls reach their steady rate only
    /// after one safety-net period (up to 165 s at 3,300 watched partitions per instance), so a
    /// steady idle figure at 10,000 partitions needs about 180.
    pub(crate) scale_settle_seconds: u64,
    /// `BENCH_SCALE_RESTARTS`: `0` skips the scale scenario's follower restarts (they need the
    /// snapshot metrics, which nodes built before them, run with `BENCH_NODE_BINARY`, lack);
    /// default 1.
    pub(crate) scale_restarts: bool,
    /// `BENCH_LEADER_KILLS`: `kill -9` rounds of the Raft leader in the leader-kills scenario
    /// (default 50); its traffic is `BENCH_SCALE_RATE`.
    pub(crate) leader_kills: u32,
    /// `BENCH_KILL_TOPICS` × `BENCH_KILL_PARTITIONS`: the leader-kills layout (default 10 × 100,
    /// 1,000 units).
    pub(crate) kill_topics: u32,
    /// See `kill_topics`.
    pub(crate) kill_partitions: u32,
    /// `BENCH_FENCING`: the target cluster's `fencing`, `users` (default) or `off`.
    pub(crate) fencing: String,
    /// `BENCH_CATCHUP_VARIANTS`: which copies the catch-up makes each round, of `raw`, `1`,
    /// `3` and `9` (default `raw,1,3`; the ratio column needs `raw`).
    pub(crate) catchup_variants: Vec<CatchupVariant>,
    /// `BENCH_MAX_BATCH_BYTES`: the flows' `max_batch_bytes` (default: the flows' default).
    pub(crate) max_batch_bytes: u64,
    /// `BENCH_FAR_SOURCE_POLLS`: the flows' `far_source_polls` (default: the flows' default).
    pub(crate) far_source_polls: u32,
    /// `BENCH_FAR_CONNECTIONS`: both clusters' `far_connections` (default: the clusters'
    /// default).
    pub(crate) far_connections: usize,
    /// `BENCH_PARTITIONS`: partitions of the catch-up topic (default 16).
    pub(crate) partitions: u32,
    /// `BENCH_WAN_RTT_MS` (with `BENCH_WAN_FAR`): the catch-up's copies reach one server through
    /// the testkit's `WanProxy` with this round trip (half each way); `0` still goes through
    /// the proxy, the fair baseline of the other round trips. Unset: no proxy.
    pub(crate) wan: Option<Wan>,
}

/// One way the catch-up copies (`BENCH_CATCHUP_VARIANTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CatchupVariant {
    /// `raw`: the raw poll→send loop.
    RawLoop,
    /// `raw-stamped`: the same loop, each message sent with the compact provenance entry the
    /// replicator would write (between two 0.8 servers only).
    RawLoopStamped,
    /// `1`: one replicator instance.
    OneInstance,
    /// `3`: three instances.
    ThreeInstances,
    /// `9`: nine instances (what an added instance costs the control plane).
    NineInstances,
}

/// Where the catch-up puts the distance (`BENCH_WAN_FAR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Far {
    /// `source` (default): the copier runs next to the target and polls across the distance.
    Source,
    /// `target`: the copier runs next to the source and sends across it.
    Target,
}

/// A distance between the copier and one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wan {
    /// Which server is far.
    pub(crate) far: Far,
    /// The round trip to it.
    pub(crate) rtt: std::time::Duration,
}

impl Settings {
    /// Reads the environment; a variable that is set but not a number is an error.
    pub(crate) fn from_env() -> TestResult<Self> {
        let rates = match std::env::var("BENCH_RATES") {
            Ok(text) => text
                .split(',')
                .map(|r| number("BENCH_RATES", r.trim()))
                .collect::<TestResult<Vec<u64>>>()?,
            Err(_) => vec![1_000, 20_000, 100_000],
        };
        Ok(Self {
            messages: var("BENCH_MESSAGES", 1_000_000)?,
            rounds: var_u32("BENCH_ROUNDS", 3)?.max(1),
            batch_size: match var_u32("BENCH_BATCH_SIZE", replicator_model::DEFAULT_BATCH_SIZE)? {
                n if replicator_config::BATCH_SIZE_LIMITS.contains(&n) => n,
                n => {
                    return Err(format!(
                        "BENCH_BATCH_SIZE={n} must be in {:?}, as a flow's batch_size",
                        replicator_config::BATCH_SIZE_LIMITS
                    )
                    .into())
                }
            },
            connections: match var(
                "BENCH_CONNECTIONS",
                replicator_config::DEFAULT_CONNECTIONS as u64,
            )? {
                n @ 1..=64 => n as usize,
                n => return Err(format!("BENCH_CONNECTIONS={n} must be 1 to 64").into()),
            },
            rates,
            latency_seconds: var("BENCH_LATENCY_SECONDS", 10)?.max(1),
            failovers: var_u32("BENCH_FAILOVERS", 10)?,
            failover_rate: var("BENCH_FAILOVER_RATE", 5_000)?,
            seed: var("BENCH_SEED", 1)?,
            scale_topics: var_u32("BENCH_SCALE_TOPICS", 50)?.max(1),
            scale_partitions: var_u32("BENCH_SCALE_PARTITIONS", 20)?.max(1),
            scale_rate: var("BENCH_SCALE_RATE", 2_000)?,
            sample_seconds: var("BENCH_SAMPLE_SECONDS", 10)?.max(1),
            scale_settle_seconds: var("BENCH_SCALE_SETTLE_SECONDS", 3)?,
            scale_restarts: var("BENCH_SCALE_RESTARTS", 1)? != 0,
            provenance: var("BENCH_PROVENANCE", 1)? != 0,
            leader_kills: var_u32("BENCH_LEADER_KILLS", 50)?,
            kill_topics: var_u32("BENCH_KILL_TOPICS", 10)?.max(1),
            kill_partitions: var_u32("BENCH_KILL_PARTITIONS", 100)?.max(1),
            fencing: match std::env::var("BENCH_FENCING") {
                Err(_) => "users".to_owned(),
                Ok(f) if f == "users" || f == "off" => f,
                Ok(f) => return Err(format!("BENCH_FENCING={f:?} must be users or off").into()),
            },
            partitions: var_u32("BENCH_PARTITIONS", 16)?.max(1),
            catchup_variants: match std::env::var("BENCH_CATCHUP_VARIANTS") {
                Err(_) => vec![
                    CatchupVariant::RawLoop,
                    CatchupVariant::OneInstance,
                    CatchupVariant::ThreeInstances,
                ],
                Ok(text) => text
                    .split(',')
                    .map(|v| match v.trim() {
                        "raw" => Ok(CatchupVariant::RawLoop),
                        "raw-stamped" => Ok(CatchupVariant::RawLoopStamped),
                        "1" => Ok(CatchupVariant::OneInstance),
                        "3" => Ok(CatchupVariant::ThreeInstances),
                        "9" => Ok(CatchupVariant::NineInstances),
                        other => Err(format!(
                            "BENCH_CATCHUP_VARIANTS: {other:?} is not raw, raw-stamped, 1, 3 or 9"
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            },
            max_batch_bytes: match var(
                "BENCH_MAX_BATCH_BYTES",
                replicator_model::DEFAULT_MAX_BATCH_BYTES,
            )? {
                n if replicator_config::MAX_BATCH_BYTES_LIMITS.contains(&n) => n,
                n => {
                    return Err(format!(
                        "BENCH_MAX_BATCH_BYTES={n} must be in {:?}, as a flow's max_batch_bytes",
                        replicator_config::MAX_BATCH_BYTES_LIMITS
                    )
                    .into())
                }
            },
            far_source_polls: match var_u32(
                "BENCH_FAR_SOURCE_POLLS",
                replicator_model::DEFAULT_FAR_SOURCE_POLLS,
            )? {
                n if (1..=replicator_model::MAX_FAR_SOURCE_POLLS).contains(&n) => n,
                n => {
                    return Err(format!(
                        "BENCH_FAR_SOURCE_POLLS={n} must be 1 to {}, as a flow's far_source_polls",
                        replicator_model::MAX_FAR_SOURCE_POLLS
                    )
                    .into())
                }
            },
            far_connections: match var_u32(
                "BENCH_FAR_CONNECTIONS",
                replicator_config::DEFAULT_FAR_CONNECTIONS as u32,
            )? {
                n @ 1..=64 => n as usize,
                n => {
                    return Err(format!(
                        "BENCH_FAR_CONNECTIONS={n} must be 1 to 64, as a cluster's far_connections"
                    )
                    .into())
                }
            },
            wan: match std::env::var("BENCH_WAN_RTT_MS") {
                Err(_) => None,
                Ok(text) => Some(Wan {
                    rtt: std::time::Duration::from_millis(number("BENCH_WAN_RTT_MS", &text)?),
                    far: match std::env::var("BENCH_WAN_FAR").as_deref() {
                        Err(_) | Ok("source") => Far::Source,
                        Ok("target") => Far::Target,
                        Ok(f) => {
                            return Err(
                                format!("BENCH_WAN_FAR={f:?} must be source or target").into()
                            )
                        }
                    },
                }),
            },
        })
    }
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "messages={} rounds={} batch_size={} connections={} rates={:?} latency_seconds={} failovers={} \
             failover_rate={} seed={} scale={}x{} scale_rate={} sample_seconds={} \
             settle_seconds={} scale_restarts={} provenance={} \
             leader_kills={} kill_layout={}x{} fencing={} partitions={} max_batch_bytes={} far_source_polls={} far_connections={} wan={:?}",
            self.messages,
            self.rounds,
            self.batch_size,
            self.connections,
            self.rates,
            self.latency_seconds,
            self.failovers,
            self.failover_rate,
            self.seed,
            self.scale_topics,
            self.scale_partitions,
            self.scale_rate,
            self.sample_seconds,
            self.scale_settle_seconds,
            self.scale_restarts,
            self.provenance,
            self.leader_kills,
            self.kill_topics,
            self.kill_partitions,
            self.fencing,
            self.partitions,
            self.max_batch_bytes,
            self.far_source_polls,
            self.far_connections,
            self.wan
        )
    }
}

fn var(name: &str, default: u64) -> TestResult<u64> {
    match std::env::var(name) {
        Ok(text) => number(name, &text),
        Err(_) => Ok(default),
    }
}

/// [`var`] for a `u32` knob (rounds, counts, layouts).
fn var_u32(name: &str, default: u32) -> TestResult<u32> {
    Ok(u32::try_from(var(name, u64::from(default))?)?)
}

fn number(name: &str, text: &str) -> TestResult<u64> {
    text.replace('_', "")
        .parse()
        .map_err(|_| format!("{name}={text:?} is not a number").into())
}

/// CPU model, cores, memory and kernel, for the report.
pub(crate) fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "{model}, {cores} cores, {mem_gib:.0} GiB, Linux {}, load average at start {load}",
        kernel.trim()
    )
}
