//! A cross-region deployment on loopback: the source and target servers and every Raft RPC
//! between the three nodes go through `WanProxy`s with 20 ms each way (40 ms round trips).
//! `kill -9` of a follower that owns partitions, then of the Raft leader, while a producer
//! writes: the killed node's partitions resume on the others, it rejoins after a restart, and
//! the copy is exact. The same as a two-way (active/active) pair: applications write into the
//! same topic on both clusters, `up-to-down` and `down-to-up` copy it both ways with both
//! targets fenced, and after each kill, and after a rolling restart (SIGTERM and a start of
//! each node in turn), both sides come to hold every message of both; at the end both flows
//! are exact and no copy was copied back.
//! Product defaults for every timing, with `cluster.member_round_trip` set to the round trip
//! as README "Across regions" asks.
//!
//! `HA_WAN_ONE_WAY_MS` sets another one-way delay (e.g. 40 for 80 ms round trips), to measure
//! failover at other distances (BENCHMARKS.md); the test then proves the same at that
//! distance. [`start_across`] sets the same deployment up for other scenarios (the chaos
//! schedule across a WAN, `chaos.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, serial, tick, ClusterEntry, Deadline, FlowEntry, NodeId, PacedProducer,
    Replication, ReplicatorCluster, ReplicatorClusterSpec, Servers, TestResult, Topic,
};
use replicator_testkit::{WanLink, WanProxy};

use crate::failover::kill_a_follower_then_the_leader;
use crate::fixture::{self, finish_with_exact_copy, pass_if_exact};

/// One-way delay of every proxied path unless `HA_WAN_ONE_WAY_MS` says otherwise: 40 ms round
/// trips.
const ONE_WAY: Duration = Duration::from_millis(20);

/// The one-way delay of this run.
pub(crate) fn one_way() -> TestResult<Duration> {
    match std::env::var("HA_WAN_ONE_WAY_MS") {
        Err(_) => Ok(ONE_WAY),
        Ok(text) => Ok(Duration::from_millis(text.parse().map_err(|_| {
            format!("HA_WAN_ONE_WAY_MS={text:?} is not a number of milliseconds")
        })?)),
    }
}

/// The proxies of a scenario, stopped together at its end, whatever the outcome.
#[derive(Default)]
pub(crate) struct Wan {
    proxies: Vec<WanProxy>,
}

impl Wan {
    /// A proxy to `upstream` with [`one_way`] each way; returns the address to dial instead.
    async fn proxy(&mut self, upstream: SocketAddr) -> TestResult<SocketAddr> {
        let proxy = WanProxy::start(upstream, WanLink::symmetric(one_way()?)).await?;
        let addr = proxy.addr();
        self.proxies.push(proxy);
        Ok(addr)
    }

    /// Asserts that the nodes reach both servers through their proxies (the first two), as
    /// they must once they copy.
    fn assert_servers_proxied(&self) {
        let open: Vec<usize> = self.proxies.iter().map(WanProxy::connections).collect();
        println!("open connections per proxy (up, down, Raft of nodes 1..=3): {open:?}");
        assert!(
            open[0] > 0 && open[1] > 0,
            "the nodes copy without going through the server proxies: {open:?}"
        );
    }

    /// Closes every proxy and its connections.
    pub(crate) async fn stop(self) {
        for proxy in self.proxies {
            proxy.stop().await;
        }
    }
}

/// Runs `scenario` on its own (`serial`) with a [`Wan`] for the proxies it starts, all of them
/// stopped at its end whatever the outcome.
pub(crate) fn across(scenario: impl AsyncFnOnce(&mut Wan) -> TestResult) -> TestResult {
    serial(|| async move {
        let mut wan = Wan::default();
        let outcome = scenario(&mut wan).await;
        wan.stop().await;
        outcome
    })
}

/// `server`'s connection string with its address replaced by `via`.
fn url_via(server: &replicator_testkit::TestServer, via: SocketAddr) -> String {
    server
        .connection_string()
        .replace(&server.addr().to_string(), &via.to_string())
}

/// In-process servers and three nodes as a cross-region deployment: the source, the target
/// and every node's Raft listener behind a proxy of [`one_way`] each way (every proxy in
/// `wan`, which the caller stops); the producer running next to the source server and the copy
/// under way on every partition.
pub(crate) async fn start_across(
    wan: &mut Wan,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer)> {
    let servers = Servers::start(fixture::topic()).await?;
    let cluster = launch_across(wan, &servers, |source, target| {
        fixture::spec_between((source, target), false, None, "")
    })
    .await?;
    // The producer writes in the source's region, next to its server.
    let producer = fixture::produce_into(servers.upstream.connection_string());
    servers.wait_copy_started(Duration::from_secs(60)).await?;
    wan.assert_servers_proxied();
    Ok((servers, cluster, producer))
}

/// Three nodes launched with the spec `spec` gives for the connection strings of `servers`
/// behind proxies (`up`, `down`), every node's Raft listener behind a proxy too; every proxy
/// in `wan`, the servers' first.
async fn launch_across(
    wan: &mut Wan,
    servers: &Servers,
    spec: impl FnOnce(&str, &str) -> TestResult<ReplicatorClusterSpec>,
) -> TestResult<ReplicatorCluster> {
    let up = url_via(&servers.upstream, wan.proxy(servers.upstream.addr()).await?);
    let down = url_via(
        &servers.downstream,
        wan.proxy(servers.downstream.addr()).await?,
    );
    // Each node binds its own Raft listener; its peers dial a proxy in front of it, so every
    // Raft RPC between two nodes takes a round trip of twice `one_way`.
    let placements = fixture::loopback(3)?;
    let mut dial = BTreeMap::new();
    for (id, placement) in &placements {
        dial.insert(*id, wan.proxy(placement.raft_addr).await?);
    }
    let mut spec = spec(&up, &down)?;
    // The setting the README asks of a cluster across regions.
    spec.cluster_toml = format!("member_round_trip = \"{}ms\"", (2 * one_way()?).as_millis());
    let started = Instant::now();
    let cluster = ReplicatorCluster::launch_dialing(spec, placements, &dial).await?;
    println!(
        "3 nodes own every unit {:.2} s after their start",
        started.elapsed().as_secs_f64()
    );
    Ok(cluster)
}

/// The scenario; every proxy it starts is in `wan`, which the caller stops.
async fn scenario(wan: &mut Wan) -> TestResult {
    let (servers, mut cluster, producer) = start_across(wan).await?;

    let rtt = (2 * one_way()?).as_millis();
    let (follower_time, leader_time) = kill_a_follower_then_the_leader(
        &servers,
        &mut cluster,
        &format!(", {rtt} ms round trips:"),
    )
    .await?;

    println!(
        "wan failover times ({rtt} ms round trips): follower {:.2} s, leader {:.2} s",
        follower_time.as_secs_f64(),
        leader_time.as_secs_f64()
    );
    finish_with_exact_copy(producer, servers, cluster).await
}

#[test]
fn behind_40ms_round_trips_killed_follower_and_leader_resume_on_the_others_exactly_once(
) -> TestResult {
    across(scenario)
}

/// Partitions of the two-way scenario's topic, on each side.
const TWO_WAY_PARTITIONS: u32 = 8;

/// The two-way pair of README "Disaster recovery" (active/active): `up-to-down` and
/// `down-to-up` over the same topic, identity naming, both targets fenced (the default).
fn two_way_spec(up: &str, down: &str) -> TestResult<ReplicatorClusterSpec> {
    let include = format!("{}/*", fixture::topic().stream);
    let replication = Replication::default()
        .cluster(ClusterEntry::new("up", up))
        .cluster(ClusterEntry::new("down", down))
        .flow(FlowEntry::new("up-to-down", "up", "down", &include))
        .flow(FlowEntry::new("down-to-up", "down", "up", include));
    fixture::spec_of(&replication, 2 * TWO_WAY_PARTITIONS as usize, false)
}

/// Both sides' producers and their topic: applications write on both clusters at once.
struct BothSides {
    topic: Topic,
    up: PacedProducer,
    down: PacedProducer,
}

impl BothSides {
    /// Messages both producers had acknowledged.
    fn produced(&self) -> u64 {
        self.up.produced() + self.down.produced()
    }

    /// Pauses both producers and waits until each side holds every message produced on
    /// either (its own and a copy of the other's), the two sides the same partition by
    /// partition, once both wrote to every partition; resumes them unless `stop`. `what`
    /// names the moment in figures and errors. (Exactly once is `verify`'s to say at the
    /// end: a send the producer counted as failed may still have landed.)
    async fn converge(&self, servers: &Servers, what: &str, stop: bool) -> TestResult {
        self.up.pause();
        self.down.pause();
        let started = Instant::now();
        let deadline = Deadline::new(
            Duration::from_secs(60),
            format!("{what}: both sides hold both sets"),
        );
        // A send under way when the producers paused still lands: wait until their counts
        // stand still over a tick, and both sides hold all of it.
        let mut produced = self.produced();
        loop {
            tick().await;
            let (up, down) = (
                self.topic.counts_on(&servers.upstream),
                self.topic.counts_on(&servers.downstream),
            );
            let now = self.produced();
            // Both producers wrote to every partition, and each side holds all of it.
            let both_wrote = self.up.produced() > 0 && self.down.produced() > 0;
            let held = up.iter().sum::<u64>();
            if now == produced && both_wrote && !up.contains(&0) && up == down && held >= now {
                println!(
                    "{what}: both sides hold all {now} messages {:.2} s after the producers paused",
                    started.elapsed().as_secs_f64()
                );
                break;
            }
            produced = now;
            deadline.check_seeing(|| format!("{now} produced; up {up:?}, down {down:?}"))?;
        }
        if !stop {
            self.up.resume();
            self.down.resume();
        }
        Ok(())
    }
}

/// `kill -9` of `victim`; returns how long until the others owned every unit. It then
/// restarts and waits until it owns units again.
async fn kill_and_rejoin_owned(
    cluster: &mut ReplicatorCluster,
    victim: NodeId,
) -> TestResult<Duration> {
    cluster.kill(victim)?;
    let killed = Instant::now();
    let survivors = cluster.running();
    cluster
        .wait_all_owned(&survivors, Duration::from_secs(60))
        .await?;
    let moved = killed.elapsed();
    cluster.restart(victim)?;
    let mut everyone = survivors;
    everyone.push(victim);
    everyone.sort_unstable();
    cluster
        .wait_all_owned(&everyone, Duration::from_secs(120))
        .await?;
    Ok(moved)
}

/// The two-way scenario; every proxy it starts is in `wan`, which the caller stops.
async fn two_way_scenario(wan: &mut Wan) -> TestResult {
    let base = fixture::topic();
    let topic = Topic::new(base.stream, base.name, TWO_WAY_PARTITIONS);
    let servers = Servers::start(topic.clone()).await?;
    let down = connect(&servers.downstream.connection_string()).await?;
    ensure_topic(&down, &topic.stream, &topic.name, topic.partitions).await?;
    let _ = down.shutdown().await;
    let mut cluster = launch_across(wan, &servers, two_way_spec).await?;
    // Each application writes in its own region, next to its server.
    let producer = |server: &replicator_testkit::TestServer| {
        PacedProducer::start(fixture::producer_params(
            server.connection_string(),
            &[&topic],
        ))
    };
    let sides = BothSides {
        up: producer(&servers.upstream),
        down: producer(&servers.downstream),
        topic: topic.clone(),
    };
    for producer in [&sides.up, &sides.down] {
        fixture::produced_more(producer, 1000).await?;
    }
    sides.converge(&servers, "started", false).await?;
    wan.assert_servers_proxied();

    let rtt = (2 * one_way()?).as_millis();
    for role in ["follower", "leader"] {
        let status = cluster.leader_status().await.ok_or("no leader")?;
        let leader = status.leader.ok_or("no leader")?;
        let victim = match role {
            "leader" => leader,
            _ => cluster
                .running()
                .into_iter()
                .find(|id| *id != leader && status.units_owned(*id) > 0)
                .ok_or("no follower owns units")?,
        };
        let moved = kill_and_rejoin_owned(&mut cluster, victim).await?;
        println!(
            "two-way, {rtt} ms round trips: {role} node {victim} killed, its units owned by the others after {:.2} s",
            moved.as_secs_f64()
        );
        sides
            .converge(&servers, &format!("after the {role}'s kill"), false)
            .await?;
    }
    // A rolling restart, as a rollout does it: SIGTERM (the node drains and hands its units
    // over) and a start of each node in turn, the leader last.
    let leader = cluster
        .leader_status()
        .await
        .and_then(|s| s.leader)
        .ok_or("no leader")?;
    let mut order = cluster.running();
    order.retain(|id| *id != leader);
    order.push(leader);
    for node in order {
        let asked = Instant::now();
        let codes = cluster.terminate(&[node], Duration::from_secs(60)).await?;
        assert_eq!(codes, vec![(node, Some(0))], "node {node}'s drain");
        let drained = asked.elapsed();
        if node == leader {
            // A stopping leader hands its leadership over before it exits (`handover`).
            cluster
                .wait_leader_status(
                    "a leader among the others".into(),
                    Duration::from_secs(60),
                    |_| true,
                )
                .await?;
            println!(
                "two-way, {rtt} ms round trips: a leader again {:.2} s after the leader's SIGTERM (its process exited after {:.2} s)",
                asked.elapsed().as_secs_f64(),
                drained.as_secs_f64()
            );
        }
        // The drain handed every unit over: none waits for the stopped node's lease. (Asked
        // of a leader that applied every release as it committed, so not after the leader's
        // own stop, where its successor may not have applied the last ones yet.)
        if node != leader {
            let status = cluster.leader_status().await.ok_or("no leader")?;
            let left: Vec<String> = status
                .units
                .iter()
                .filter(|u| u.owner == Some(node))
                .map(|u| u.unit.to_string())
                .collect();
            assert!(left.is_empty(), "node {node} stopped owning {left:?}");
        }
        cluster.restart(node)?;
        let everyone = cluster.running();
        cluster
            .wait_all_owned(&everyone, Duration::from_secs(120))
            .await?;
        println!(
            "two-way, {rtt} ms round trips: node {node} drained in {:.2} s, owns units again {:.2} s after its SIGTERM",
            drained.as_secs_f64(),
            asked.elapsed().as_secs_f64()
        );
    }
    sides
        .converge(&servers, "after the rolling restart", false)
        .await?;
    sides.converge(&servers, "at the end", true).await?;
    // The resumes after the roll found, in each target, the newest copy before the confirmed
    // offset wherever the messages after it came from that target: skipped, not lost.
    for node in cluster.running() {
        let losses = cluster
            .metric_sum_of(node, "iggy_replicator_downstream_losses_total")
            .await?;
        assert_eq!(losses, 0.0, "node {node} counted downstream losses");
    }
    let (mut produced, mut failed) = (0, 0);
    for producer in [sides.up, sides.down] {
        let report = producer.stop().await?;
        produced += report.produced;
        failed += report.failed_sends;
    }
    // Both flows exact: each copied every message of its source's own producer once, in
    // order, and none of the other flow's copies.
    pass_if_exact(cluster).await?;
    // Nothing arrived late: no copy of a copy. (A send the producer counted as failed may
    // have landed: then only at least.)
    for server in [&servers.upstream, &servers.downstream] {
        let held = topic.counts_on(server).iter().sum::<u64>();
        assert!(
            held == produced || (failed > 0 && held > produced),
            "{held} messages held, {produced} produced ({failed} sends failed)"
        );
    }
    servers.shutdown().await;
    Ok(())
}

#[test]
fn a_two_way_pair_behind_40ms_round_trips_copies_both_ways_exactly_through_kills_and_a_rolling_restart(
) -> TestResult {
    across(two_way_scenario)
}
