//! A clustered Iggy 0.9 target (`TestCluster`: three replicas, one primary, view changes) named
//! by a URL that lists every replica, under three node processes and a steady producer into an
//! in-process 0.8 source: the target's primary killed mid-copy (twice, the first one restarted
//! as a backup in between), and the replica of the first seed address killed and kept down
//! while a node is killed and restarted (its new connections pass the dead seed over). Each
//! copy ends exact.

use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, serial, tick, wait_resumed, Cluster, ClusterEntry, ClusterTopic,
    Deadline, FlowEntry, PacedProducer, Replication, Stalled, TestResult, Topic,
};
use replicator_model::IggyVersion;
use replicator_testkit::{TestCluster, TestServer, TestServerConfig};

use crate::fixture::{self, owning_follower, produced_more};

/// How long anything in these scenarios may take on a busy machine: far above what it takes.
const WITHIN: Duration = Duration::from_secs(60);

/// The source server, the three-replica target, the node processes and the producer.
struct Run {
    source: TestServer,
    target: TestCluster,
    cluster: Cluster,
    producer: PacedProducer,
    topic: Topic,
}

/// The source (the topic created there), the target cluster, three nodes copying from one to
/// the other with every replica's address in the target URL, the producer running, and the
/// copy under way on every partition.
async fn start() -> TestResult<Run> {
    let topic = fixture::topic();
    let source = TestServer::start(TestServerConfig::default()).await?;
    let client = connect(&source.connection_string()).await?;
    ensure_topic(&client, &topic.stream, &topic.name, topic.partitions).await?;
    let _ = client.shutdown().await;
    let target = TestCluster::start(
        TestServerConfig {
            iggy_version: IggyVersion::V0_9,
            ..TestServerConfig::default()
        },
        3,
    )
    .await?;

    let mut down = ClusterEntry::new("down", target.connection_string());
    down.iggy_version = Some(IggyVersion::V0_9.as_str().to_owned());
    let replication = Replication::default()
        .cluster(ClusterEntry::new("up", source.connection_string()))
        .cluster(down)
        .flow(FlowEntry::new(
            "up-to-down",
            "up",
            "down",
            format!("{}/*", topic.stream),
        ));
    let cluster = Cluster::start(
        fixture::spec_of(&replication, topic.partitions as usize, false)?,
        3,
    )
    .await?;
    let producer = fixture::produce_into(&source.connection_string());
    let run = Run {
        source,
        target,
        cluster,
        producer,
        topic,
    };
    let deadline = Deadline::new(WITHIN, "every partition copied to the target cluster");
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
        self.topic.counts_on_cluster(&self.target)
    }

    fn downstream(&self) -> ClusterTopic<'_> {
        ClusterTopic {
            cluster: &self.target,
            topic: &self.topic,
        }
    }

    /// Kills the target's replica `index` (a view change when it is the primary) and waits
    /// until every partition is written again; returns how long that took.
    async fn kill_replica(&mut self, index: usize) -> TestResult<Duration> {
        let view = self.target.view();
        self.target.kill(index).await;
        // The replica's connections are closed and its tasks ended: nothing more lands from
        // them, and every partition growing from here was written through another replica.
        let stalled = Stalled::every_partition(self.target_counts());
        let resumed = wait_resumed(&self.downstream(), &stalled, WITHIN).await?;
        println!(
            "target replica {index} killed (view {view} -> {}, primary {:?}): first partition written again after {:.2} s, all after {:.2} s",
            self.target.view(),
            self.target.primary(),
            resumed.first.as_secs_f64(),
            resumed.all.as_secs_f64()
        );
        Ok(resumed.all)
    }

    /// Stops the producer, waits until the target holds every message, requires `verify`
    /// (which reaches the target through the same seed addresses) to report an exact copy,
    /// and stops everything.
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
        let deadline = Deadline::new(WITHIN, "the target cluster to catch up");
        loop {
            let (up, down) = (topic.counts_on(&source), topic.counts_on_cluster(&target));
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
        let mut run = start().await?;
        for _ in 0..2 {
            let primary = run.target.primary().ok_or("the target has no primary")?;
            run.kill_replica(primary).await?;
            fixture::produced_more(&run.producer, 1600).await?;
            run.target.restart(primary).await?;
        }
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
        let mut run = start().await?;
        run.kill_replica(0).await?;
        assert_ne!(run.target.primary(), Some(0));

        let (victim, owned) = owning_follower(&run.cluster, &run.topic).await?;
        let downstream = ClusterTopic {
            cluster: &run.target,
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
        assert!(!run.target.is_running(0), "the first seed stayed down");
        run.finish_exact().await
    })
}
