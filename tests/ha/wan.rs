//! A cross-region deployment on loopback: the source and target servers and every Raft RPC
//! between the three nodes go through `WanProxy`s with 20 ms each way (40 ms round trips).
//! `kill -9` of a follower that owns partitions, then of the Raft leader, while a producer
//! writes: the killed node's partitions resume on the others, it rejoins after a restart, and
//! the copy is exact. Product defaults for every timing, with `cluster.member_round_trip` set
//! to the round trip as README "Across regions" asks.
//!
//! `HA_WAN_ONE_WAY_MS` sets another one-way delay (e.g. 40 for 80 ms round trips), to measure
//! failover at other distances (BENCHMARKS.md); the test then proves the same at that
//! distance. [`start_across`] sets the same deployment up for other scenarios (the chaos
//! schedule across a WAN, `chaos.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use replicator_harness::{serial, PacedProducer, ReplicatorCluster, Servers, TestResult};
use replicator_testkit::{WanLink, WanProxy};

use crate::failover::kill_a_follower_then_the_leader;
use crate::fixture::{self, finish_with_exact_copy};

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

    /// Closes every proxy and its connections.
    pub(crate) async fn stop(self) {
        for proxy in self.proxies {
            proxy.stop().await;
        }
    }
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
    let source = url_via(&servers.upstream, wan.proxy(servers.upstream.addr()).await?);
    let target = url_via(
        &servers.downstream,
        wan.proxy(servers.downstream.addr()).await?,
    );
    // Each node binds its own Raft listener; its peers dial a proxy in front of it, so every
    // Raft RPC between two nodes takes a 40 ms round trip.
    let placements = fixture::loopback(3)?;
    let mut dial = BTreeMap::new();
    for (id, placement) in &placements {
        dial.insert(*id, wan.proxy(placement.raft_addr).await?);
    }
    let mut spec = fixture::spec_between((&source, &target), false, None, "")?;
    // The setting the README asks of a cluster across regions.
    spec.cluster_toml = format!("member_round_trip = \"{}ms\"", (2 * one_way()?).as_millis());
    let started = Instant::now();
    let cluster = ReplicatorCluster::launch_dialing(spec, placements, &dial).await?;
    println!(
        "3 nodes own every partition {:.2} s after their start",
        started.elapsed().as_secs_f64()
    );
    // The producer writes in the source's region, next to its server.
    let producer = fixture::produce_into(servers.upstream.connection_string());
    servers.wait_copy_started(Duration::from_secs(60)).await?;
    // The nodes reach both servers only through their proxies.
    let open: Vec<usize> = wan.proxies.iter().map(WanProxy::connections).collect();
    println!("open connections per proxy (source, target, Raft of nodes 1..=3): {open:?}");
    assert!(
        open[0] > 0 && open[1] > 0,
        "the nodes copy without going through the server proxies: {open:?}"
    );
    Ok((servers, cluster, producer))
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
    serial(|| async {
        let mut wan = Wan::default();
        let outcome = scenario(&mut wan).await;
        wan.stop().await;
        outcome
    })
}
