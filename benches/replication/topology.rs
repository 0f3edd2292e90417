//! Failover where several targets and flows meet: three `iggy-replicator dev-server` processes
//! started here (whatever `BENCH_*_URL` say: a target is made unreachable by SIGSTOP, which
//! needs a process of our own) and three nodes, every cluster fenced by the product default
//! unless a part says otherwise. Three parts:
//!
//! - **target down**: flow `a` copies into `eu`, flow `b` into `ap`. `ap` is frozen (its
//!   process stopped, connections open), then, while `a` is produced, rounds of `kill -9` of a
//!   node that owns units of `a`: the time until every partition of `a` the victim owned is
//!   written again on `eu`. The victim restarts before the next round. `ap` thaws at the end.
//! - **reload**: flow `up → down` runs while produced; every node's file gains a flow
//!   `down → up` of a stream holding a backlog, and every node gets SIGHUP: the time from the
//!   last SIGHUP until the backlog's first and last message are on `up`. Three rounds, each
//!   adding one more flow.
//! - **mixed**: flow `f` into a fenced target and flow `u` into one with `fencing = "off"`,
//!   both produced; rounds of `kill -9` of a random node: the time until the victim's
//!   partitions are written again, on each target.
//!
//! Every flow is verified exact at the end (no loss, no duplicates). A wait that runs past
//! [`WITHIN`] is reported as such and fails the run after its table is printed, so a build
//! that never recovers (`BENCH_NODE_BINARY` of an older commit) still gets its row.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, wait_resumed, wait_until, ClusterEntry, DevServer, Endpoint, FlowEntry,
    NodeId, Replication, ReplicatorCluster, ReplicatorClusterSpec, Stalled, Status, TestResult,
    Topic, Watch,
};

use crate::env::{fill, restart_and_rebalance, wait_balanced, Endpoints};
use crate::load::paced;
use crate::report::{median_range, secs};
use crate::settings::Settings;

/// Partitions of every topic.
const PARTITIONS: u32 = 8;
/// The topic of every stream.
const TOPIC: &str = "events";
/// How long any one wait may take before it counts as "did not recover".
const WITHIN: Duration = Duration::from_secs(60);
/// Messages per partition of each reverse flow's backlog in the reload part.
const BACKLOG_PER_PARTITION: u64 = 500;
/// Rounds of the reload part.
const RELOADS: u32 = 3;

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    println!(
        "## Topologies: a target down, a flow added by reload, fenced and unfenced targets mixed \
         ({} rounds of kill -9 where a part kills, {} msg/s produced, three nodes, dev servers)\n",
        settings.failovers, settings.failover_rate
    );
    let mut failures = Vec::new();
    for (part, outcome) in [
        ("target down", target_down(endpoints, settings).await),
        ("reload", reload(endpoints, settings).await),
        ("mixed", mixed(endpoints, settings).await),
    ] {
        if let Err(e) = outcome {
            println!("\n**{part}: {e}**\n");
            failures.push(format!("{part}: {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}

/// Dev servers by alias; the first is the source of every flow but the reload part's reverse
/// ones.
struct Regions {
    servers: Vec<(&'static str, DevServer)>,
}

impl Regions {
    async fn start(endpoints: &Endpoints, aliases: &[&'static str]) -> TestResult<Self> {
        let mut servers = Vec::new();
        for alias in aliases {
            servers.push((*alias, DevServer::start(&endpoints.binary).await?));
        }
        Ok(Self { servers })
    }

    fn server(&self, alias: &str) -> &DevServer {
        self.servers
            .iter()
            .find(|(a, _)| *a == alias)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no server {alias}"))
    }

    fn endpoint(&self, alias: &str) -> &Endpoint {
        self.server(alias).endpoint()
    }

    fn entry(&self, alias: &str, fencing: Option<&str>) -> ClusterEntry {
        ClusterEntry::new(alias, self.server(alias).url()).fencing(fencing)
    }

    /// Creates `topics` on the server of `alias`.
    async fn create(&self, alias: &str, topics: &[&Topic]) -> TestResult {
        let client = connect(self.endpoint(alias)).await?;
        for topic in topics {
            ensure_topic(&client, &topic.stream, &topic.name, topic.partitions).await?;
        }
        client.shutdown().await?;
        Ok(())
    }
}

/// Three nodes running `replication`, whose flows have `units` units, once they are balanced.
async fn three_nodes(
    endpoints: &Endpoints,
    replication: &Replication,
    units: usize,
) -> TestResult<ReplicatorCluster> {
    let spec = ReplicatorClusterSpec {
        binary: endpoints.nodes.clone(),
        replication_toml: replication.toml(),
        cluster_toml: String::new(),
        units,
        log_level: "warn",
        owned_within: Duration::from_secs(120),
        tls: false,
    };
    let cluster = ReplicatorCluster::start(spec, 3).await?;
    wait_balanced(&cluster, Duration::from_secs(120)).await?;
    Ok(cluster)
}

/// The victim's role for the tables.
fn role(status: &Status, node: NodeId) -> &'static str {
    if status.leader == Some(node) {
        "leader"
    } else {
        "follower"
    }
}

/// `kill -9` of `victim`; then, for each of `watched` (a topic, the partitions of it the
/// victim owned, and where its copy is counted), how long until those partitions were written
/// again; `None` for one that did not move within [`WITHIN`].
async fn kill_and_time(
    cluster: &mut ReplicatorCluster,
    victim: NodeId,
    watched: &[(&BTreeSet<u32>, &Watch)],
) -> TestResult<Vec<Option<Duration>>> {
    cluster.kill(victim)?;
    let since = Instant::now();
    // Sends the victim had on the wire when it died may still land; count from after them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut stalls = Vec::new();
    for (partitions, watch) in watched {
        stalls.push(Stalled {
            partitions: (*partitions).clone(),
            baseline: watch.counts().await?,
            since,
        });
    }
    let waits = watched
        .iter()
        .zip(&stalls)
        .map(|((_, watch), stalled)| wait_resumed(*watch, stalled, WITHIN));
    let outcomes = futures::future::join_all(waits).await;
    Ok(outcomes
        .into_iter()
        .map(|o| o.ok().map(|r| r.all))
        .collect())
}

/// `secs` of a time that may have run out.
fn secs_or_stalled(time: Option<Duration>) -> String {
    time.map_or_else(|| format!("not within {} s", WITHIN.as_secs()), secs)
}

/// Waits until the copy of `topic` on `watch` holds `produced` messages; an error says how
/// many it holds.
async fn copied(watch: &Watch, produced: u64) -> TestResult<Duration> {
    let since = Instant::now();
    Ok(watch.wait_total(produced, since, WITHIN).await?.1)
}

/// Requires every flow of `flows` to be exact.
async fn exact(cluster: &ReplicatorCluster, flows: &[&str]) -> TestResult {
    for flow in flows {
        if !cluster.verify_flow(Some(flow), WITHIN).await? {
            return Err(format!("verify found flow {flow} not exact").into());
        }
    }
    println!("verify: flows {flows:?} exact (no loss, no duplicates)\n");
    Ok(())
}

/// The "target down" part (see the module).
async fn target_down(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    println!("### Target down: flow a → eu, flow b → ap, ap frozen, kill -9 of a node owning units of a\n");
    let regions = Regions::start(endpoints, &["src", "eu", "ap"]).await?;
    let (a, b) = (
        Topic::new("fan-a", TOPIC, PARTITIONS),
        Topic::new("fan-b", TOPIC, PARTITIONS),
    );
    regions.create("src", &[&a, &b]).await?;
    let replication = Replication::default()
        .cluster(regions.entry("src", None))
        .cluster(regions.entry("eu", None))
        .cluster(regions.entry("ap", None))
        .flow(FlowEntry::new("a", "src", "eu", "fan-a/*"))
        .flow(FlowEntry::new("b", "src", "ap", "fan-b/*"));
    let mut cluster = three_nodes(endpoints, &replication, 2 * PARTITIONS as usize).await?;
    // Flow b is copied completely before ap freezes: nothing of it is in flight then.
    fill(
        regions.endpoint("src"),
        &b.stream,
        TOPIC,
        PARTITIONS,
        100,
        1,
    )
    .await?;
    let on_ap = Watch::new(regions.endpoint("ap"), &b.stream, TOPIC).await?;
    copied(&on_ap, u64::from(PARTITIONS) * 100).await?;
    on_ap.close().await;

    let producer = paced(regions.endpoint("src"), a.targets(), settings.failover_rate);
    let on_eu = Watch::new(regions.endpoint("eu"), &a.stream, TOPIC).await?;
    regions.server("ap").freeze()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(settings.seed);
    println!("| round | killed | role | partitions of a | a written again on eu (s) |");
    println!("|---|---|---|---|---|");
    let mut times = Vec::new();
    let mut stalled = None;
    for round in 1..=settings.failovers {
        let status = cluster.leader_status().await.ok_or("no leader")?;
        let owners: Vec<NodeId> = cluster
            .running()
            .into_iter()
            .filter(|n| !status.owned_by(&a, *n).is_empty())
            .collect();
        if owners.is_empty() {
            return Err("no running node owns units of flow a".into());
        }
        let victim = owners[rng.gen_range(0..owners.len())];
        let owned = status.owned_by(&a, victim);
        let [time] = kill_and_time(&mut cluster, victim, &[(&owned, &on_eu)]).await?[..] else {
            unreachable!("one watched topic");
        };
        println!(
            "| {round} | node {victim} | {} | {} | {} |",
            role(&status, victim),
            owned.len(),
            secs_or_stalled(time)
        );
        let Some(time) = time else {
            stalled = Some(format!("round {round}: flow a not written again on eu"));
            break;
        };
        times.push(time.as_secs_f64());
        cluster.restart(victim)?;
        wait_owned(&cluster, &a, victim).await?;
    }
    let produced = producer.stop().await?.produced;
    if let Some(stalled) = stalled {
        let held = on_eu.total().await?;
        println!("\n{held} of {produced} messages of flow a on eu\n");
        regions.server("ap").thaw()?;
        return Err(stalled.into());
    }
    copied(&on_eu, produced).await?;
    on_eu.close().await;
    println!(
        "\nflow a written again on eu: median (min–max) {} s while ap was down\n",
        median_range(&times, 2)
    );
    regions.server("ap").thaw()?;
    exact(&cluster, &["a", "b"]).await?;
    cluster.passed();
    Ok(())
}

/// Waits until every unit of `topic` is owned and the restarted `node` renews again.
async fn wait_owned(cluster: &ReplicatorCluster, topic: &Topic, node: NodeId) -> TestResult {
    let what = format!("node {node} back and {} owned", topic.stream);
    wait_until(&what, WITHIN, || async {
        cluster.leader_status().await.is_some_and(|status| {
            let owned = status
                .owners(topic)
                .values()
                .filter(|o| o.is_some())
                .count();
            let back = status
                .member(node)
                .is_some_and(|m| m.lease_alive == Some(true) && !m.fenced);
            owned == topic.partitions as usize && back
        })
    })
    .await?;
    Ok(())
}

/// The "reload" part (see the module).
async fn reload(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    println!("### Reload: flow up → down runs, every node's file gains a flow down → up, SIGHUP to each\n");
    let regions = Regions::start(endpoints, &["up", "down"]).await?;
    let forward = Topic::new("fwd", TOPIC, PARTITIONS);
    regions.create("up", &[&forward]).await?;
    let mut replication = Replication::default()
        .cluster(regions.entry("up", None))
        .cluster(regions.entry("down", None))
        .flow(FlowEntry::new("fwd", "up", "down", "fwd/*"));
    let mut cluster = three_nodes(endpoints, &replication, PARTITIONS as usize).await?;
    let producer = paced(
        regions.endpoint("up"),
        forward.targets(),
        settings.failover_rate,
    );
    let backlog = u64::from(PARTITIONS) * BACKLOG_PER_PARTITION;
    println!("| round | flows after the reload | first message back on up (s) | all {backlog} back on up (s) |");
    println!("|---|---|---|---|");
    let mut flows = vec!["fwd".to_owned()];
    let mut all_times = Vec::new();
    for round in 1..=RELOADS {
        let back = Topic::new(format!("back-{round}"), TOPIC, PARTITIONS);
        regions.create("down", &[&back]).await?;
        fill(
            regions.endpoint("down"),
            &back.stream,
            TOPIC,
            PARTITIONS,
            BACKLOG_PER_PARTITION,
            1,
        )
        .await?;
        replication = replication.flow(FlowEntry::new(
            &back.stream,
            "down",
            "up",
            format!("{}/*", back.stream),
        ));
        flows.push(back.stream.clone());
        let toml = replication.toml();
        for node in cluster.running() {
            cluster.rewrite_replication(node, &toml)?;
            cluster.hangup(node)?;
        }
        let reloaded = Instant::now();
        cluster.set_units(flows.len() * PARTITIONS as usize);
        let on_up = Watch::new(regions.endpoint("up"), &back.stream, TOPIC).await?;
        let outcome = on_up.wait_total(backlog, reloaded, WITHIN).await;
        let held = on_up.total().await?;
        on_up.close().await;
        match outcome {
            Ok((first, all)) => {
                println!(
                    "| {round} | {} | {} | {} |",
                    flows.len(),
                    secs(first),
                    secs(all)
                );
                all_times.push(all.as_secs_f64());
            }
            Err(_) => {
                println!(
                    "| {round} | {} | {} | not within {} s: {held} of {backlog} |",
                    flows.len(),
                    if held > 0 { "some" } else { "none" },
                    WITHIN.as_secs()
                );
                producer.stop().await?;
                return Err(
                    format!("round {round}: the reverse flow did not copy its backlog").into(),
                );
            }
        }
    }
    let produced = producer.stop().await?.produced;
    let on_down = Watch::new(regions.endpoint("down"), &forward.stream, TOPIC).await?;
    copied(&on_down, produced).await?;
    on_down.close().await;
    println!(
        "\nbacklog of the added flow copied: median (min–max) {} s after the last SIGHUP\n",
        median_range(&all_times, 2)
    );
    let names: Vec<&str> = flows.iter().map(String::as_str).collect();
    exact(&cluster, &names).await?;
    cluster.passed();
    Ok(())
}

/// The "mixed" part (see the module).
async fn mixed(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    println!(
        "### Mixed: flow f → a fenced target, flow u → an unfenced one, kill -9 of a random node\n"
    );
    let regions = Regions::start(endpoints, &["src", "fenced", "open"]).await?;
    let (f, u) = (
        Topic::new("mix-f", TOPIC, PARTITIONS),
        Topic::new("mix-u", TOPIC, PARTITIONS),
    );
    regions.create("src", &[&f, &u]).await?;
    let replication = Replication::default()
        .cluster(regions.entry("src", None))
        .cluster(regions.entry("fenced", Some("users")))
        .cluster(regions.entry("open", Some("off")))
        .flow(FlowEntry::new("f", "src", "fenced", "mix-f/*"))
        .flow(FlowEntry::new("u", "src", "open", "mix-u/*"));
    let mut cluster = three_nodes(endpoints, &replication, 2 * PARTITIONS as usize).await?;
    let mut targets = f.targets();
    targets.extend(u.targets());
    let producer = paced(regions.endpoint("src"), targets, settings.failover_rate);
    let on_fenced = Watch::new(regions.endpoint("fenced"), &f.stream, TOPIC).await?;
    let on_open = Watch::new(regions.endpoint("open"), &u.stream, TOPIC).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(settings.seed);
    println!(
        "| round | killed | role | partitions f / u | f written again (s) | u written again (s) |"
    );
    println!("|---|---|---|---|---|---|");
    let (mut fenced_times, mut open_times) = (Vec::new(), Vec::new());
    for round in 1..=settings.failovers {
        let status = cluster.leader_status().await.ok_or("no leader")?;
        let running = cluster.running();
        let victim = running[rng.gen_range(0..running.len())];
        let (owned_f, owned_u) = (status.owned_by(&f, victim), status.owned_by(&u, victim));
        let times = kill_and_time(
            &mut cluster,
            victim,
            &[(&owned_f, &on_fenced), (&owned_u, &on_open)],
        )
        .await?;
        println!(
            "| {round} | node {victim} | {} | {} / {} | {} | {} |",
            role(&status, victim),
            owned_f.len(),
            owned_u.len(),
            secs_or_stalled(times[0]),
            secs_or_stalled(times[1])
        );
        let (Some(tf), Some(tu)) = (times[0], times[1]) else {
            producer.stop().await?;
            return Err(
                format!("round {round}: a target's partitions were not written again").into(),
            );
        };
        if !owned_f.is_empty() {
            fenced_times.push(tf.as_secs_f64());
        }
        if !owned_u.is_empty() {
            open_times.push(tu.as_secs_f64());
        }
        restart_and_rebalance(&mut cluster, victim, &running).await?;
    }
    let produced = producer.stop().await?.produced;
    on_fenced.close().await;
    on_open.close().await;
    println!(
        "\nwritten again: fenced target median (min–max) {} s, unfenced target {} s; {produced} messages produced\n",
        median_range(&fenced_times, 2),
        median_range(&open_times, 2)
    );
    exact(&cluster, &["f", "u"]).await?;
    cluster.passed();
    Ok(())
}
