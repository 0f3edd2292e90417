//! A clustered Iggy 0.9 side (`TestCluster`: three replicas, one primary, view changes) named
//! by a URL that lists every replica, under three node processes and a steady producer: the
//! target's primary killed mid-copy (twice, the first one restarted as a backup in between), the
//! source's primary killed the same way (readers and producer reconnect through the seeds), and
//! the target replica of the first seed address killed and kept down while a node is killed and
//! restarted (its new connections pass the dead seed over). Each copy ends exact.

use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, serial, tick, wait_resumed, ClusterEntry, Deadline, DownstreamCounts,
    Endpoint, FlowEntry, PacedProducer, Replication, ReplicatorCluster, Stalled, TestResult, Topic,
};
use replicator_model::IggyVersion;
use replicator_testkit::{TestCluster, TestServer, TestServerConfig};

use crate::fixture::{self, owning_follower, produced_more};

/// How long anything in these scenarios may take on a busy machine: far above what it takes.
const WITHIN: Duration = Duration::from_secs(60);

/// One side of the copy: an in-process Iggy 0.8 server, or a three-replica 0.9 cluster.
enum Side {
    Server(TestServer),
    Replicas(TestCluster),
}

impl Side {
    /// A three-replica 0.9 cluster when `clustered`, one 0.8 server otherwise.
    async fn start(clustered: bool) -> TestResult<Side> {
        if !clustered {
            return Ok(Side::Server(
                TestServer::start(TestServerConfig::default()).await?,
            ));
        }
        let config = TestServerConfig {
            iggy_version: IggyVersion::V0_9,
            ..TestServerConfig::default()
        };
        Ok(Side::Replicas(TestCluster::start(config, 3).await?))
    }

    /// How the harness reaches it: every replica's address for a cluster.
    fn endpoint(&self) -> Endpoint {
        match self {
            Side::Server(server) => Endpoint::new(IggyVersion::V0_8, server.connection_string()),
            Side::Replicas(cluster) => {
                Endpoint::new(IggyVersion::V0_9, cluster.connection_string())
            }
        }
    }

    /// Its entry in the nodes' config, under `alias`.
    fn entry(&self, alias: &str) -> ClusterEntry {
        let endpoint = self.endpoint();
        let mut entry = ClusterEntry::new(alias, endpoint.url);
        entry.iggy_version = Some(endpoint.iggy_version.as_str().to_owned());
        entry
    }

    /// Messages per partition of `topic`, counted in process (no connection, so the count
    /// goes on while replicas are killed).
    fn counts(&self, topic: &Topic) -> Vec<u64> {
        match self {
            Side::Server(server) => topic.counts_on(server),
            Side::Replicas(cluster) => topic.counts_on_cluster(cluster),
        }
    }

    /// The replicas, or an error when this side is one server.
    fn replicas(&mut self) -> TestResult<&mut TestCluster> {
        match self {
            Side::Replicas(cluster) => Ok(cluster),
            Side::Server(_) => Err("this side is one server, not a cluster of replicas".into()),
        }
    }

    async fn shutdown(self) {
        match self {
            Side::Server(server) => server.shutdown().await,
            Side::Replicas(cluster) => cluster.shutdown().await,
        }
    }
}

/// A topic on one side, counted for [`wait_resumed`].
struct Counted<'a> {
    side: &'a Side,
    topic: &'a Topic,
}

impl DownstreamCounts for Counted<'_> {
    async fn counts_now(&self) -> replicator_harness::Result<Vec<u64>> {
        Ok(self.side.counts(self.topic))
    }
}

/// Which side a scenario kills replicas of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clustered {
    Source,
    Target,
}

/// The source, the target (one of them a three-replica cluster), the node processes and the
/// producer.
struct Run {
    source: Side,
    target: Side,
    cluster: ReplicatorCluster,
    producer: PacedProducer,
    topic: Topic,
}

/// The two sides (the topic created on the source), three nodes copying from one to the other
/// with every replica's address in the clustered side's URL, the producer running through the
/// same seeds, and the copy under way on every partition.
async fn start(clustered: Clustered) -> TestResult<Run> {
    let topic = fixture::topic();
    let source = Side::start(clustered == Clustered::Source).await?;
    let client = connect(source.endpoint()).await?;
    ensure_topic(&client, &topic.stream, &topic.name, topic.partitions).await?;
    let _ = client.shutdown().await;
    let target = Side::start(clustered == Clustered::Target).await?;

    let replication = Replication::default()
        .cluster(source.entry("up"))
        .cluster(target.entry("down"))
        .flow(FlowEntry::new(
            "up-to-down",
            "up",
            "down",
            format!("{}/*", topic.stream),
        ));
    let cluster = ReplicatorCluster::start(
        fixture::spec_of(&replication, topic.partitions as usize, false)?,
        3,
    )
    .await?;
    let producer = fixture::produce_into(source.endpoint());
    let run = Run {
        source,
        target,
        cluster,
        producer,
        topic,
    };
    let deadline = Deadline::new(WITHIN, "every partition copied to the target");
    loop {
        let counts = run.target_counts();
        if !counts.contains(&0) {
            return Ok(run);
        }
        deadline.check_seeing(|| format!("{counts:?}"))?;
        tick().await;
    }
}

impl Run {
    fn target_counts(&self) -> Vec<u64> {
        self.target.counts(&self.topic)
    }

    fn downstream(&self) -> Counted<'_> {
        Counted {
            side: &self.target,
            topic: &self.topic,
        }
    }

    fn side(&mut self, clustered: Clustered) -> TestResult<&mut TestCluster> {
        match clustered {
            Clustered::Source => self.source.replicas(),
            Clustered::Target => self.target.replicas(),
        }
    }

    /// Kills replica `index` of the clustered side (a view change when it is the primary) and
    /// waits until every partition is written to the target again; returns how long that took.
    async fn kill_replica(&mut self, clustered: Clustered, index: usize) -> TestResult<Duration> {
        let replicas = self.side(clustered)?;
        let view = replicas.view();
        replicas.kill(index).await;
        let (view_after, primary) = (replicas.view(), replicas.primary());
        // The replica's connections are closed and its tasks ended: nothing more reaches the
        // target through it, and every partition growing from here was copied through another
        // replica.
        let stalled = Stalled::every_partition(self.target_counts());
        let resumed = wait_resumed(&self.downstream(), &stalled, WITHIN).await?;
        println!(
            "{clustered:?} replica {index} killed (view {view} -> {view_after}, primary {primary:?}): first partition written again after {:.2} s, all after {:.2} s",
            resumed.first.as_secs_f64(),
            resumed.all.as_secs_f64()
        );
        Ok(resumed.all)
    }

    /// Twice: kills the clustered side's primary, waits until the copy moves on and more is
    /// produced, and restarts the killed replica (as a backup).
    async fn kill_the_primary_twice(&mut self, clustered: Clustered) -> TestResult {
        for _ in 0..2 {
            let primary = self.side(clustered)?.primary().ok_or("no primary")?;
            self.kill_replica(clustered, primary).await?;
            produced_more(&self.producer, 1600).await?;
            self.side(clustered)?.restart(primary).await?;
        }
        Ok(())
    }

    /// Stops the producer, waits until the target holds every message, requires `verify`
    /// (which reaches the clustered side through the same seed addresses) to report an exact
    /// copy, and stops everything.
    async fn finish_exact(self) -> TestResult {
        let Run {
            source,
            target,
            cluster,
            producer,
            topic,
        } = self;
        let report = producer.stop().await?;
        let started = Instant::now();
        let deadline = Deadline::new(WITHIN, "the target to catch up");
        loop {
            let (up, down) = (source.counts(&topic), target.counts(&topic));
            if up == down {
                break;
            }
            deadline.check_seeing(|| format!("source {up:?}, target {down:?}"))?;
            tick().await;
        }
        println!(
            "produced {} messages ({} failed sends); caught up {:.2} s after the producer stopped",
            report.produced,
            report.failed_sends,
            started.elapsed().as_secs_f64()
        );
        fixture::pass_if_exact(cluster).await?;
        target.shutdown().await;
        source.shutdown().await;
        Ok(())
    }
}

/// The target's primary is killed mid-copy: the view changes, the writers reconnect through
/// the seeds to the new primary and every partition moves again. The killed replica comes back
/// as a backup, the new primary is killed too, and the copy ends exact.
#[test]
fn the_targets_primary_killed_mid_copy_leaves_an_exact_copy() -> TestResult {
    serial(|| async {
        let mut run = start(Clustered::Target).await?;
        run.kill_the_primary_twice(Clustered::Target).await?;
        run.finish_exact().await
    })
}

/// The source's primary is killed mid-copy: the view changes, the readers whose connection it
/// held reconnect through the seeds (any replica serves their polls), the producer writes
/// through the new primary, and every partition moves again downstream. The killed replica
/// comes back as a backup, the new primary is killed too, and the copy ends exact.
#[test]
fn the_sources_primary_killed_mid_copy_leaves_an_exact_copy() -> TestResult {
    serial(|| async {
        let mut run = start(Clustered::Source).await?;
        run.kill_the_primary_twice(Clustered::Source).await?;
        run.finish_exact().await
    })
}

/// The replica of the target URL's first seed address (the first primary) is killed and stays
/// down: the copy moves on through the others. A node that owns partitions is then killed and
/// restarted, so that its new connections to the target start at the dead seed; its
/// partitions resume elsewhere, it takes work again, and the copy ends exact (`verify` also
/// passes the dead seed over).
#[test]
fn the_first_seed_replica_down_is_passed_over() -> TestResult {
    serial(|| async {
        let mut run = start(Clustered::Target).await?;
        run.kill_replica(Clustered::Target, 0).await?;
        assert_ne!(run.side(Clustered::Target)?.primary(), Some(0));

        let (victim, owned) = owning_follower(&run.cluster, &run.topic).await?;
        let downstream = Counted {
            side: &run.target,
            topic: &run.topic,
        };
        let killed = run
            .cluster
            .kill_and_wait_resumed(victim, &run.topic, &downstream)
            .await?;
        println!(
            "node {victim} killed ({} partitions): all written again after {:.2} s",
            owned.len(),
            killed.resumed.all.as_secs_f64()
        );
        run.cluster.restart(victim)?;
        let mut everyone = run.cluster.running();
        everyone.sort_unstable();
        let rejoined = run.cluster.wait_all_owned(&everyone, WITHIN).await?;
        let owned_again = rejoined.owned_by(&run.topic, victim);
        assert!(!owned_again.is_empty(), "node {victim} owns nothing again");
        // Its partitions move on (it connects to the target through the seeds, past the dead
        // first one, before it writes them).
        let stalled = Stalled {
            partitions: owned_again,
            baseline: run.target_counts(),
            since: Instant::now(),
        };
        wait_resumed(&run.downstream(), &stalled, WITHIN).await?;
        produced_more(&run.producer, 1600).await?;
        assert!(
            !run.side(Clustered::Target)?.is_running(0),
            "the first seed stayed down"
        );
        run.finish_exact().await
    })
}
