//! A clustered 0.9 test double: several replicas, each its own TCP listener, over one shared
//! state, one of them the primary, as a three-replica Iggy 0.9 (VSR) cluster looks to its
//! clients.
//!
//! What a real cluster's replicas do with a client request (read from the `0.9.0-edge.5`
//! server: `dispatch.rs`, `metadata.rs`, `iggy_partition.rs`, `cluster_meta.rs`):
//! * reads (`NonReplicated`) are served by every replica from its own copy of the state;
//! * a login (`Register`) or a logout is answered by any replica: a backup authenticates it
//!   and forwards only the consensus proposal to the primary;
//! * a metadata write reaching a backup is refused before it enters any pipeline: a reply with
//!   status 0 whose result section carries 58 `TransientNotAccepted` ("re-issuable anywhere");
//! * a partition operation (send, consumer-offset writes) reaching a backup is refused the same
//!   way, but in the reply header's status (58), with an empty body;
//! * a metadata write whose prepare a view change canceled is answered 57
//!   `TransientNotCommitted` in the result section ("outcome unknown, replay the same request on
//!   the same session"); [`TestCluster::answer_not_committed_once`] makes the primary do that
//!   once, without applying the write, as if the prepare never reached a quorum;
//! * GET_CLUSTER_METADATA names every configured replica, each `Healthy` (the server never
//!   reports another status, a dead replica included), the one of index `view % replicas` the
//!   `Leader`, the others `Follower`, with its TCP port and 0 for the transports it does not run.
//!
//! The primary is the replica of index `view % replicas`. Stopping it (`kill`) is a view change:
//! the view moves on to the next running replica, at once. A real cluster takes about one
//! heartbeat timeout to elect; `kill_without_view_change` and `view_change` model that window,
//! in which the roster still names the dead primary and a backup refuses a login (after
//! checking its credentials) with 58 in the result section, as a real backup whose forward to
//! the primary finds no route does. A restarted replica comes back as a backup.

use crate::config::{IggyVersion, TestServerConfig};
use crate::error::{Error, Result};
use crate::faults::Faults;
use crate::handlers::Shared;
use crate::replica::{ClusterState, Seat};
use crate::server::{bind, open_shared, rebind, spawn_listener, with_partition, Running};
use crate::PartitionInfo;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One replica's listener.
#[derive(Debug)]
struct Replica {
    /// Its client address.
    addr: SocketAddr,
    /// Its own fault switches (drop its connections, refuse, stall, count requests).
    faults: Faults,
    /// The accept loop; `None` while the replica is stopped.
    running: Option<Running>,
}

/// A running clustered 0.9 test double: `replicas` listeners over one state. Dropping it without
/// `shutdown` cancels its tasks.
#[derive(Debug)]
pub struct TestCluster {
    /// The state, config and storage every replica serves.
    shared: Arc<Shared>,
    /// Roster and cluster-wide faults.
    cluster: Arc<ClusterState>,
    /// The replicas, by index.
    replicas: Vec<Replica>,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            if let Some(running) = replica.running.take() {
                running.cancel();
            }
        }
    }
}

impl TestCluster {
    /// Starts `replicas` replicas (at least one), each on its own free port of `config.bind`'s
    /// address, serving one state; replica 0 is the primary. The config must ask for 0.9
    /// (clustering is a 0.9 feature).
    #[tracing::instrument(skip_all, fields(replicas), err)]
    pub async fn start(config: TestServerConfig, replicas: usize) -> Result<TestCluster> {
        if config.iggy_version != IggyVersion::V0_9 || replicas == 0 {
            return Err(Error::NotAClusterConfig {
                version: config.iggy_version,
                replicas,
            });
        }
        let mut listeners = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let at = SocketAddr::new(config.bind.ip(), 0);
            listeners.push(bind(at).await?);
        }
        let shared = open_shared(config)?;
        let cluster = Arc::new(ClusterState::new(
            listeners.iter().map(|(_, addr)| *addr).collect(),
        ));
        let replicas = listeners
            .into_iter()
            .enumerate()
            .map(|(index, (listener, addr))| {
                let faults = Faults::default();
                let seat = Seat::new(index, Arc::clone(&cluster));
                let running = spawn_listener(listener, &shared, &faults.inner, Some(seat));
                Replica {
                    addr,
                    faults,
                    running: Some(running),
                }
            })
            .collect::<Vec<_>>();
        tracing::info!(addrs = ?cluster.addrs, "iggy-compatible 0.9 cluster listening");
        Ok(TestCluster {
            shared,
            cluster,
            replicas,
        })
    }

    /// Each replica's client address, by index.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.cluster.addrs.clone()
    }

    /// `iggy://USER:PASSWORD@HOST:PORT,HOST:PORT,...`: every replica, in index order (the
    /// replicator's cluster URL with several seed addresses).
    pub fn connection_string(&self) -> String {
        let hosts: Vec<String> = self.cluster.addrs.iter().map(|a| a.to_string()).collect();
        self.url(&hosts.join(","))
    }

    /// The connection string of replica `index` alone.
    pub fn replica_connection_string(&self, index: usize) -> String {
        let host = self
            .cluster
            .addrs
            .get(index)
            .map_or_else(String::new, |a| a.to_string());
        self.url(&host)
    }

    fn url(&self, hosts: &str) -> String {
        let config = &self.shared.config;
        format!(
            "iggy://{}:{}@{hosts}",
            config.root_username, config.root_password
        )
    }

    /// The primary's index (`None` when every replica is stopped).
    pub fn primary(&self) -> Option<usize> {
        self.cluster.roster().primary()
    }

    /// The current view number (it grows with every view change).
    pub fn view(&self) -> u64 {
        self.cluster.roster().view()
    }

    /// Replica `index`'s fault switches.
    ///
    /// # Panics
    /// When `index` is not a replica of this cluster.
    pub fn faults(&self, index: usize) -> Faults {
        self.replicas[index].faults.clone()
    }

    /// The primary answers the next metadata write (create, update, delete of streams, topics,
    /// users, ...) `TransientNotCommitted` without applying it, once; the SDK replays it on the
    /// same session, and the replay is applied.
    pub fn answer_not_committed_once(&self) {
        self.cluster.not_committed.store(true, Ordering::SeqCst);
    }

    /// Stops replica `index` as a `kill -9` would: its listener closes and every connection to
    /// it drops. If it was the primary, the next running replica becomes primary (a view
    /// change) at once. Stopping a stopped replica does nothing.
    ///
    /// # Panics
    /// When `index` is not a replica of this cluster.
    pub async fn kill(&mut self, index: usize) {
        self.kill_without_view_change(index).await;
        self.view_change();
    }

    /// Stops replica `index` like [`TestCluster::kill`], but if it was the primary the others
    /// stay in its view, without a primary, until [`TestCluster::view_change`]: the window a
    /// real cluster has before it elects (about one heartbeat timeout). Meanwhile the roster
    /// still names the dead replica `Leader`, and a backup refuses a login it authenticated as
    /// not accepted (58), as well as every write.
    ///
    /// # Panics
    /// When `index` is not a replica of this cluster.
    #[tracing::instrument(skip_all, fields(replica = index))]
    pub async fn kill_without_view_change(&mut self, index: usize) {
        // Out of the roster first, so that no connection it still serves sees it as primary.
        self.cluster.roster().halt(index);
        if let Some(running) = self.replicas[index].running.take() {
            running.stop().await;
        }
        tracing::info!(view = self.view(), primary = ?self.primary(), "replica stopped");
    }

    /// The view change after a primary's death: the next running replica becomes primary.
    /// Nothing happens while the primary runs.
    pub fn view_change(&self) {
        self.cluster.roster().elect();
        tracing::info!(view = self.view(), primary = ?self.primary(), "view");
    }

    /// A view change while the primary runs on (it was cut off from the others long enough
    /// for them to elect, and then rejoined as a backup): the next running replica becomes
    /// primary, and the connections to the old one stay open; from now on it refuses their
    /// writes as a backup does (58), and its roster answer names the new primary, which is what
    /// a client checks to move. Nothing happens with fewer than two replicas running.
    pub fn demote_primary(&self) {
        self.cluster.roster().demote();
        tracing::info!(view = self.view(), primary = ?self.primary(), "primary demoted");
    }

    /// How many logins the backups refused because the primary was gone.
    pub fn logins_refused(&self) -> u64 {
        self.cluster.logins_refused.load(Ordering::Relaxed)
    }

    /// Starts replica `index` again on its old port; it serves as a backup of the current view.
    /// Restarting a running replica does nothing.
    ///
    /// # Panics
    /// When `index` is not a replica of this cluster.
    #[tracing::instrument(skip_all, fields(replica = index), err)]
    pub async fn restart(&mut self, index: usize) -> Result<()> {
        if self.replicas[index].running.is_some() {
            return Ok(());
        }
        let replica = &mut self.replicas[index];
        let listener = rebind(replica.addr).await?;
        let seat = Seat::new(index, Arc::clone(&self.cluster));
        replica.running = Some(spawn_listener(
            listener,
            &self.shared,
            &replica.faults.inner,
            Some(seat),
        ));
        self.cluster.roster().start(index);
        Ok(())
    }

    /// Numbers of a partition addressed by stream and topic name (what every replica holds:
    /// the replicas share one state).
    pub fn partition_info(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
    ) -> Result<PartitionInfo> {
        with_partition(&self.shared, stream, topic, partition, PartitionInfo::of)
    }

    /// Whether replica `index` runs.
    pub fn is_running(&self, index: usize) -> bool {
        self.cluster.roster().is_running(index)
    }

    /// Stops every replica and waits for their tasks.
    pub async fn shutdown(mut self) {
        for replica in &mut self.replicas {
            if let Some(running) = replica.running.take() {
                running.stop().await;
            }
        }
    }
}
