//! Catch-up throughput: a topic already holding `BENCH_MESSAGES` messages is copied by (a) a raw
//! poll→send loop through the SDK, (a2) the same loop writing the replicator's compact
//! provenance on every message (only when asked for), (b) one replicator instance, (c) three
//! instances, (d) nine (only when asked for); the
//! variants alternate within each round, each round starting with the next variant, so that no
//! variant always follows the same one (a server still persisting what the previous copy wrote
//! slows whoever comes next). When the servers' pids are known, each copy also waits for them
//! to go quiet first.

use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, delete_stream, ensure_topic, raw_copy, RawCopy, ReplicatorCluster, TestResult, Topic,
    Watch,
};

use crate::env::{
    context_switches, cpu_seconds, distance, fill, own_cpu_seconds, replication_spec_between,
    run_name, total_cpu, Endpoints, PAYLOAD_BYTES,
};
use crate::metrics::Stages;
use crate::report::median_range;
use crate::settings::{CatchupVariant, Far, Settings};

/// Topic name (in a stream named per run).
const TOPIC: &str = "t";
/// Servers are quiet when together they use less than this share of a core...
const QUIET_SHARE: f64 = 0.05;
/// ...over a window this long.
const QUIET_WINDOW: Duration = Duration::from_millis(500);
/// How long a copy waits for quiet servers before it starts anyway (and says so).
const QUIET_DEADLINE: Duration = Duration::from_secs(30);

/// How each way to copy (`BENCH_CATCHUP_VARIANTS`) is named in the report.
impl CatchupVariant {
    fn label(self) -> &'static str {
        match self {
            CatchupVariant::RawLoop => "(a) raw poll→send loop",
            CatchupVariant::RawLoopStamped => "(a2) raw loop, provenance",
            CatchupVariant::OneInstance => "(b) replicator, 1 instance",
            CatchupVariant::ThreeInstances => "(c) replicator, 3 instances",
            CatchupVariant::NineInstances => "(d) replicator, 9 instances",
        }
    }

    /// Replicator instances it starts (none for the loop).
    fn instances(self) -> u64 {
        match self {
            CatchupVariant::RawLoop | CatchupVariant::RawLoopStamped => 0,
            CatchupVariant::OneInstance => 1,
            CatchupVariant::ThreeInstances => 3,
            CatchupVariant::NineInstances => 9,
        }
    }
}

/// One copy of the whole topic.
#[derive(Debug, Clone, Copy)]
struct Sample {
    variant: CatchupVariant,
    /// From the start (process spawn for the replicator; every connection logged in for the
    /// loop, see `raw_copy`) to the last message downstream.
    total: Duration,
    /// From the first message downstream to the last.
    copying: Duration,
    /// CPU seconds of the copier (the loop, or the sum of the replicator processes).
    cpu: f64,
    /// CPU seconds of the copier per million messages once start-up is over (the replicator:
    /// from every unit owned, over the messages copied from then on; the loop: `cpu`'s).
    /// `None` when less than a tenth of the copy was left by then.
    cpu_after_start: Option<f64>,
    /// Context switches of the copier's threads: the loop's (this process's, while it copies),
    /// or the replicator processes' since they started.
    switches: u64,
    /// CPU seconds of the source and the target server from the copier's start (the loop's
    /// first login, the replicator's spawn) to its end, the benchmark's own connections left
    /// out (`None` when the servers' pids are not known).
    server_cpu: Option<[f64; 2]>,
    /// Control-plane requests (`control_requests_sent_total`) per instance per second of
    /// `total`; `None` for the loop.
    control_requests: Option<f64>,
    /// CPU seconds of this process meanwhile: the `WanProxy` in front of a far server and the
    /// watch of the downstream topic (and the loop itself, for the loops).
    bench_cpu: f64,
}

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    let stream = run_name("catchup");
    let partitions = settings.partitions;
    let per_partition = (settings.messages / u64::from(partitions)).max(1);
    let messages = per_partition * u64::from(partitions);
    let distance = settings.wan.map_or("no proxy".to_owned(), |wan| {
        format!(
            "the {} behind a WanProxy with {} ms round trips",
            match wan.far {
                Far::Source => "source",
                Far::Target => "target",
            },
            wan.rtt.as_millis()
        )
    });
    println!(
        "## Catch-up: {messages} messages of {PAYLOAD_BYTES} B in {partitions} partitions, batches of {}, {} connection(s) per cluster, {distance}\n",
        settings.batch_size, settings.connections
    );
    let outcome = measure_all(endpoints, settings, &stream, per_partition).await;
    let cleanup = delete_stream(&endpoints.upstream, &stream).await;
    let samples = outcome?;
    cleanup?;
    print_table(&samples, messages);
    Ok(())
}

async fn measure_all(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    per_partition: u64,
) -> TestResult<Vec<Sample>> {
    let up = connect(&endpoints.upstream).await?;
    ensure_topic(&up, stream, TOPIC, settings.partitions).await?;
    up.shutdown().await?;
    let filling = Instant::now();
    fill(
        &endpoints.upstream,
        stream,
        TOPIC,
        settings.partitions,
        per_partition,
        4,
    )
    .await?;
    println!(
        "filled upstream in {:.1} s\n",
        filling.elapsed().as_secs_f64()
    );
    let mut samples = Vec::new();
    // The first copy after the fill is slow whatever copies (on the machine of section 1, the
    // target's first writes into memory it never used cost it four times the CPU of later
    // ones): a copy that nobody counts goes first, by the first variant asked for.
    let variants = &settings.catchup_variants;
    let warm_up_variant = variants.first().copied().unwrap_or(CatchupVariant::RawLoop);
    settle(endpoints, "warm-up").await;
    let warm_up = copy_once(
        endpoints,
        settings,
        stream,
        per_partition,
        warm_up_variant,
        0,
    )
    .await?;
    println!(
        "warm-up (not counted): {:<28} {:>6.2} s copying",
        warm_up_variant.label(),
        warm_up.copying.as_secs_f64()
    );
    for round in 1..=settings.rounds {
        let first = (round as usize - 1) % variants.len();
        for variant in variants.iter().cycle().skip(first).take(variants.len()) {
            let variant = *variant;
            settle(endpoints, &format!("round {round}")).await;
            let sample =
                copy_once(endpoints, settings, stream, per_partition, variant, round).await?;
            let servers = sample.server_cpu.map_or(String::new(), |[up, down]| {
                format!(", servers {up:.2} / {down:.2} CPU s")
            });
            println!(
                "round {round}: {:<28} {:>6.2} s copying, {:>6.2} s in all, {:.2} CPU s{servers}, this process {:.2} CPU s",
                variant.label(),
                sample.copying.as_secs_f64(),
                sample.total.as_secs_f64(),
                sample.cpu,
                sample.bench_cpu
            );
            samples.push(sample);
        }
    }
    println!();
    Ok(samples)
}

/// Copies the topic once with `variant` into a downstream stream of its own, then deletes it.
async fn copy_once(
    endpoints: &Endpoints,
    settings: &Settings,
    stream: &str,
    per_partition: u64,
    variant: CatchupVariant,
    round: u32,
) -> TestResult<Sample> {
    let partitions = settings.partitions;
    let messages = per_partition * u64::from(partitions);
    // The far server, when there is one, is reached through a proxy of this copy's own (the
    // fill before and the watch of the downstream topic go direct).
    let (proxy, source, target) = distance(endpoints, settings).await?;
    // The replicator names its downstream stream `<source alias>.<stream>`.
    let alias = format!(
        "r{round}{}",
        match variant {
            CatchupVariant::ThreeInstances => "c",
            CatchupVariant::NineInstances => "d",
            _ => "b",
        }
    );
    let down_stream = match variant {
        CatchupVariant::RawLoop => format!("raw{round}.{stream}"),
        CatchupVariant::RawLoopStamped => format!("raws{round}.{stream}"),
        _ => format!("{alias}.{stream}"),
    };
    let servers = endpoints.server_pids();
    let bench_cpu_before = own_cpu_seconds();
    let outcome = async {
        match variant {
            CatchupVariant::RawLoop | CatchupVariant::RawLoopStamped => {
                let down = connect(&endpoints.downstream).await?;
                ensure_topic(&down, &down_stream, TOPIC, partitions).await?;
                down.shutdown().await?;
                // The servers' CPU is the copy's from here: the loop's logins count, the
                // benchmark's own connections do not.
                let server_cpu_before = servers.map(server_cpu);
                let cpu_before = own_cpu_seconds();
                let switches_before = context_switches("self");
                let copied = raw_copy(&RawCopy {
                    source: source.clone(),
                    target: target.clone(),
                    topic: Topic::new(stream, TOPIC, partitions),
                    target_stream: down_stream.clone(),
                    per_partition,
                    batch: settings.batch_size,
                    connections: settings.connections,
                    headers: (variant == CatchupVariant::RawLoopStamped)
                        .then_some(compact_provenance as fn(u64) -> Option<bytes::Bytes>),
                })
                .await?;
                let cpu = own_cpu_seconds() - cpu_before;
                println!(
                    "round {round}: {}: logged in in {:.3} s (not timed)",
                    variant.label(),
                    copied.connecting.as_secs_f64()
                );
                let total = copied.copying;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                    total,
                    total,
                    (cpu, Some(cpu / (messages as f64 / 1e6))),
                    context_switches("self").saturating_sub(switches_before),
                    None,
                    server_cpu_before,
                ))
            }
            CatchupVariant::OneInstance
            | CatchupVariant::ThreeInstances
            | CatchupVariant::NineInstances => {
                let nodes = variant.instances();
                let spec = replication_spec_between(
                    endpoints,
                    (&source, &target),
                    &alias,
                    &format!("{stream}/*"),
                    true,
                    settings,
                    partitions as usize,
                );
                let watch = Watch::new(&endpoints.downstream, &down_stream, TOPIC).await?;
                // Opened before the start: a login costs the target CPU of its own.
                let counter = Watch::new(&endpoints.downstream, &down_stream, TOPIC).await?;
                let server_cpu_before = servers.map(server_cpu);
                let started = Instant::now();
                let waiting = tokio::spawn(async move {
                    let times = watch
                        .wait_total(messages, started, Duration::from_secs(600))
                        .await;
                    (watch, times)
                });
                let mut cluster = ReplicatorCluster::start(spec, nodes).await?;
                // Every unit owned: what the processes spent so far is start-up (process,
                // Raft, assignment, connections) and the copy's beginning.
                let pids: Vec<u32> = cluster.pids().into_values().collect();
                let cpu_owned = total_cpu(&pids);
                let copied_owned = counter.total().await?;
                counter.close().await;
                let (watch, times) = waiting.await?;
                let (first, total) = times?;
                let cpu = total_cpu(&pids);
                let left = messages.saturating_sub(copied_owned);
                let cpu_after_start = (left >= messages / 10)
                    .then(|| (cpu - cpu_owned) / (left as f64 / 1e6));
                let switches = pids
                    .iter()
                    .map(|pid| context_switches(&pid.to_string()))
                    .sum::<u64>();
                let (poll_ms, polls, send_ms, sends) =
                    Stages::default().since(&Stages::read(&cluster).await?);
                println!(
                    "round {round}: {}: {polls:.0} polls of {poll_ms:.2} ms mean, {sends:.0} sends of {send_ms:.2} ms mean",
                    variant.label()
                );
                let mut requests = 0.0;
                for id in cluster.running() {
                    requests += cluster
                        .metric_of(id, "iggy_replicator_control_requests_sent_total")
                        .await?
                        .unwrap_or_default();
                }
                let requests = requests / nodes as f64 / total.as_secs_f64();
                println!(
                    "round {round}: {}: {requests:.1} control-plane requests per instance per second",
                    variant.label()
                );
                let copied = watch.total().await?;
                watch.close().await;
                if copied != messages {
                    return Err(format!("copy not exact: {copied} of {messages} messages").into());
                }
                cluster.passed();
                drop(cluster);
                Ok((
                    total,
                    total.saturating_sub(first),
                    (cpu, cpu_after_start),
                    switches,
                    Some(requests),
                    server_cpu_before,
                ))
            }
        }
    }
    .await;
    if let Some(proxy) = proxy {
        proxy.stop().await;
    }
    let servers_after = servers.map(server_cpu);
    let bench_cpu = own_cpu_seconds() - bench_cpu_before;
    let cleanup = delete_stream(&endpoints.downstream, &down_stream).await;
    let (total, copying, (cpu, cpu_after_start), switches, control_requests, server_cpu_before) =
        outcome?;
    cleanup?;
    let server_cpu = servers_after
        .zip(server_cpu_before)
        .map(|(after, before)| [after[0] - before[0], after[1] - before[1]]);
    Ok(Sample {
        variant,
        total,
        copying,
        cpu,
        cpu_after_start,
        switches,
        server_cpu,
        control_requests,
        bench_cpu,
    })
}

/// The user headers the replicator writes on a message copied from `offset` with compact
/// provenance, for the `raw-stamped` loop: the loop then writes the replicator's bytes, so that
/// the two differ only in how they copy. The history is that of a topic created now (its label
/// takes as many varint bytes as a real one).
fn compact_provenance(offset: u64) -> Option<bytes::Bytes> {
    use replicator_pipeline::provenance::{stamp, Format, History, Stamp};
    static CREATED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let created = *CREATED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    });
    stamp(
        None,
        &Stamp {
            source: "src",
            offset,
            history_label: History::first(created).label(),
            format: Format::Compact,
        },
    )
}

/// CPU seconds so far of the source and the target server.
fn server_cpu(pids: [u32; 2]) -> [f64; 2] {
    pids.map(|pid| cpu_seconds(pid).unwrap_or_default())
}

/// Before a copy: writes back what the previous one left in the page cache (otherwise whoever
/// comes next pays for it), then, when the servers' pids are known, waits until they are quiet
/// ([`QUIET_SHARE`] of a core over [`QUIET_WINDOW`]), at most [`QUIET_DEADLINE`]; says so under
/// `label` when they were not.
async fn settle(endpoints: &Endpoints, label: &str) {
    let _ = tokio::process::Command::new("sync").status().await;
    let Some(pids) = endpoints.server_pids() else {
        return;
    };
    let started = Instant::now();
    while started.elapsed() < QUIET_DEADLINE {
        let before = total_cpu(&pids);
        tokio::time::sleep(QUIET_WINDOW).await;
        if total_cpu(&pids) - before < QUIET_SHARE * QUIET_WINDOW.as_secs_f64() {
            return;
        }
    }
    println!(
        "{label}: the servers were still busy after {} s; copying anyway",
        QUIET_DEADLINE.as_secs()
    );
}

/// Prints the table; the server CPU columns are `n/a` when the servers' pids are not known.
fn print_table(samples: &[Sample], messages: u64) {
    let millions = messages as f64 / 1e6;
    let of = |variant: CatchupVariant| -> Vec<Sample> {
        samples
            .iter()
            .filter(|s| s.variant == variant)
            .copied()
            .collect()
    };
    let raw = of(CatchupVariant::RawLoop);
    let stamped = of(CatchupVariant::RawLoopStamped);
    // Per round, the copy rate's ratio to `reference`'s ("n/a" without it).
    let ratio_to = |mine: &[Sample], reference: &[Sample]| -> String {
        let ratio: Vec<f64> = mine
            .iter()
            .zip(reference)
            .map(|(s, r)| r.copying.as_secs_f64() / s.copying.as_secs_f64())
            .collect();
        if ratio.is_empty() {
            "n/a".to_owned()
        } else {
            median_range(&ratio, 2)
        }
    };
    println!("| variant | msgs/s while copying | payload MB/s | wall time incl. start (s) | copier CPU s per 1M msgs | the same after start-up | copier context switches per 1M msgs | source / target server CPU s per 1M msgs | control-plane requests per instance per s | ratio to (a), per round | ratio to (a2), per round |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for variant in [
        CatchupVariant::RawLoop,
        CatchupVariant::RawLoopStamped,
        CatchupVariant::OneInstance,
        CatchupVariant::ThreeInstances,
        CatchupVariant::NineInstances,
    ] {
        let mine = of(variant);
        let rate: Vec<f64> = mine
            .iter()
            .map(|s| messages as f64 / s.copying.as_secs_f64())
            .collect();
        let mb: Vec<f64> = rate
            .iter()
            .map(|r| r * PAYLOAD_BYTES as f64 / 1e6)
            .collect();
        let total: Vec<f64> = mine.iter().map(|s| s.total.as_secs_f64()).collect();
        let cpu: Vec<f64> = mine.iter().map(|s| s.cpu / millions).collect();
        let cpu_after_start: Option<Vec<f64>> = mine.iter().map(|s| s.cpu_after_start).collect();
        let switches: Vec<f64> = mine.iter().map(|s| s.switches as f64 / millions).collect();
        let server: Option<Vec<[f64; 2]>> = mine.iter().map(|s| s.server_cpu).collect();
        let requests: Option<Vec<f64>> = mine.iter().map(|s| s.control_requests).collect();
        if mine.is_empty() {
            continue;
        }
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            variant.label(),
            median_range(&rate, 0),
            median_range(&mb, 1),
            median_range(&total, 2),
            median_range(&cpu, 2),
            cpu_after_start.map_or("n/a".to_owned(), |c| median_range(&c, 2)),
            median_range(&switches, 0),
            server.map_or("n/a".to_owned(), |server| {
                let side =
                    |i: usize| -> Vec<f64> { server.iter().map(|s| s[i] / millions).collect() };
                format!(
                    "{} / {}",
                    median_range(&side(0), 2),
                    median_range(&side(1), 2)
                )
            }),
            requests.map_or("n/a".to_owned(), |r| median_range(&r, 1)),
            ratio_to(&mine, &raw),
            ratio_to(&mine, &stamped),
        );
    }
    println!("\nmedian (min–max) over rounds; \"while copying\" runs from the first message downstream to the last, \"wall time\" also counts process start, Raft election and assignment; \"after start-up\" is the replicator's CPU from the moment every unit is owned, per million messages copied from then on (n/a: less than a tenth was left).\n");
}
