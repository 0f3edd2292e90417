//! Network partition with `ip netns`: each node runs in its own network namespace with two
//! links, one to a "raft" bridge (Raft RPC between nodes) and one to an "iggy" bridge (the
//! Iggy servers and the admin API). Cutting the Raft link of the leader leaves it able to
//! reach both Iggy servers but not its peers: it must stop writing within its lease, the
//! majority must take its partitions over, and after the cut heals it rejoins; the copy is
//! exact. Needs root and `ip netns`; skipped with a printed reason otherwise.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use replicator_harness::{
    serial, tick, wait_resumed, NodeId, Placement, Servers, Stalled, TestResult,
};
use replicator_testkit::TestServerConfig;

use crate::fixture::{self, finish_with_exact_copy};

/// Namespaces, bridges and links of one test; removed on drop.
struct NetLab {
    /// Prefix of every name (interface names have at most 15 characters).
    tag: String,
    /// Second octet of the 10.x.1.0/24 (raft) and 10.x.2.0/24 (iggy) subnets.
    octet: u8,
    /// Namespaces created.
    namespaces: Vec<String>,
    /// Bridges created.
    bridges: Vec<String>,
}

fn ip(args: &[&str]) -> TestResult {
    let output = Command::new("ip").args(args).output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into())
    }
}

impl NetLab {
    /// Why network namespaces cannot be used here, if they cannot.
    fn unavailable() -> Option<String> {
        let probe = format!("hap{:x}", rand::random::<u16>());
        match ip(&["netns", "add", &probe]) {
            Ok(()) => {
                let _ = ip(&["netns", "del", &probe]);
                None
            }
            Err(e) => Some(e.to_string()),
        }
    }

    fn new() -> TestResult<Self> {
        let tag = format!("h{:04x}", rand::random::<u16>());
        let octet = 100 + rand::random::<u8>() % 100;
        let mut lab = Self {
            tag,
            octet,
            namespaces: Vec::new(),
            bridges: Vec::new(),
        };
        for (suffix, net) in [("r", 1), ("i", 2)] {
            let bridge = format!("{}{suffix}", lab.tag);
            ip(&["link", "add", &bridge, "type", "bridge"])?;
            lab.bridges.push(bridge.clone());
            ip(&[
                "addr",
                "add",
                &format!("10.{octet}.{net}.1/24"),
                "dev",
                &bridge,
            ])?;
            ip(&["link", "set", &bridge, "up"])?;
        }
        Ok(lab)
    }

    /// The Iggy servers' address (on the iggy bridge).
    fn iggy_host(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, 2, 1)
    }

    /// Creates node `id`'s namespace with its two links; returns its placement.
    fn add_node(&mut self, id: NodeId) -> TestResult<Placement> {
        let ns = format!("{}-{id}", self.tag);
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let host = 10 + u8::try_from(id)?;
        for (suffix, net, inner) in [("r", 1, "raft0"), ("i", 2, "iggy0")] {
            let outer = format!("{}{suffix}{id}", self.tag);
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", inner, "netns", &ns,
            ])?;
            ip(&[
                "link",
                "set",
                &outer,
                "master",
                &format!("{}{suffix}", self.tag),
            ])?;
            ip(&["link", "set", &outer, "up"])?;
            let addr = format!("10.{}.{net}.{host}/24", self.octet);
            ip(&["-n", &ns, "addr", "add", &addr, "dev", inner])?;
            ip(&["-n", &ns, "link", "set", inner, "up"])?;
        }
        let raft = IpAddr::V4(Ipv4Addr::new(10, self.octet, 1, host));
        let iggy = IpAddr::V4(Ipv4Addr::new(10, self.octet, 2, host));
        Ok(Placement {
            raft_addr: SocketAddr::new(raft, 7100),
            api_bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 7180),
            api_addr: SocketAddr::new(iggy, 7180),
            wrapper: ["ip", "netns", "exec", &ns].map(str::to_owned).to_vec(),
        })
    }

    /// Takes node `id`'s Raft link down (`cut`) or up again.
    fn cut_raft(&self, id: NodeId, cut: bool) -> TestResult {
        let outer = format!("{}r{id}", self.tag);
        ip(&["link", "set", &outer, if cut { "down" } else { "up" }])
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
        for bridge in &self.bridges {
            let _ = ip(&["link", "del", bridge]);
        }
    }
}

/// `iggy_replicator_messages_copied_total` per series (label set) in a Prometheus text.
fn messages_copied(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with("iggy_replicator_messages_copied_total"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn leader_cut_off_from_its_peers_stops_writing_and_rejoins_after_the_cut_heals() -> TestResult {
    if let Some(reason) = NetLab::unavailable() {
        println!("skipped: network namespaces are not available here ({reason}); run as root on Linux with iproute2 to include this test");
        return Ok(());
    }
    serial(|| async {
        let mut lab = NetLab::new()?;
        let bind = SocketAddr::new(IpAddr::V4(lab.iggy_host()), 0);
        let config = || TestServerConfig {
            bind,
            ..TestServerConfig::default()
        };
        let servers = Servers::start_with(fixture::topic(), config(), config()).await?;
        let mut placements = BTreeMap::new();
        for id in 1..=3 {
            placements.insert(id, lab.add_node(id)?);
        }
        let (servers, mut cluster, producer) = fixture::start_placed(servers, placements).await?;

        let status = cluster.leader_status().await.ok_or("no leader")?;
        let victim = status.leader.ok_or("no leader")?;
        let owned = status.owned_by(&servers.topic, victim);
        lab.cut_raft(victim, true)?;
        let cut_at = Instant::now();
        cluster.set_unreachable(victim, true);
        // The cut-off node may write until its lease ends; count from the majority's grant.
        let others: Vec<NodeId> = cluster.running();
        let granted = cluster
            .wait_all_owned(&others, Duration::from_secs(30))
            .await?;
        let granted_after = cut_at.elapsed();
        let stalled = Stalled {
            partitions: owned.clone(),
            baseline: servers.downstream_counts(),
            since: cut_at,
        };
        let resumed = wait_resumed(&servers, &stalled, Duration::from_secs(30)).await?;
        println!(
            "leader node {victim} cut off: the majority (new leader {:?}) granted its {} partitions after {:.2} s, written by their new owners after {:.2} s",
            granted.leader,
            owned.len(),
            granted_after.as_secs_f64(),
            resumed.all.as_secs_f64()
        );
        // The minority can still reach both Iggy servers; its lease keeps it from writing.
        while cut_at.elapsed() < cluster.timing().lease_expiry + Duration::from_millis(500) {
            tick().await;
        }
        let copied = messages_copied(&cluster.metrics_of(victim).await?);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let copied_later = messages_copied(&cluster.metrics_of(victim).await?);
        // A unit it stopped running drops out of the metrics; none may have grown.
        for (series, later) in &copied_later {
            let before = copied.get(series).copied().unwrap_or(0.0);
            assert!(
                *later <= before,
                "the cut-off node kept writing after its lease: {series} {before} → {later}"
            );
        }
        println!(
            "cut-off node: {} messages copied by its running units, none after its lease",
            copied.values().sum::<f64>()
        );

        lab.cut_raft(victim, false)?;
        cluster.set_unreachable(victim, false);
        let healed = Instant::now();
        let status = cluster
            .wait_all_owned(&[1, 2, 3], Duration::from_secs(60))
            .await?;
        println!(
            "cut healed: node {victim} owns {} partitions again after {:.2} s",
            status.owned_by(&servers.topic, victim).len(),
            healed.elapsed().as_secs_f64()
        );

        finish_with_exact_copy(producer, servers, cluster).await?;
        drop(lab);
        Ok(())
    })
}
