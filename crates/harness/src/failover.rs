//! "Kill, then wait until resumed": after a fault, how long until every partition the victim
//! owned is written again downstream, by a new owner.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use replicator_testkit::TestCluster;

use crate::{Deadline, Error, NodeId, ReplicatorCluster, Result, Servers, Status, Topic, Watch};

/// Where [`wait_resumed`] reads how many messages each downstream partition holds.
pub trait DownstreamCounts {
    /// Messages per partition of the watched downstream topic, by partition id.
    fn counts_now(&self) -> impl Future<Output = Result<Vec<u64>>>;
}

impl DownstreamCounts for Servers {
    async fn counts_now(&self) -> Result<Vec<u64>> {
        Ok(self.downstream_counts())
    }
}

impl DownstreamCounts for Watch {
    async fn counts_now(&self) -> Result<Vec<u64>> {
        self.counts().await
    }
}

/// A topic on an in-process clustered 0.9 target ([`TestCluster`]), counted in process for
/// [`wait_resumed`]: the count needs no connection, so it goes on while the target's replicas
/// are killed and restarted.
#[derive(Debug, Clone, Copy)]
pub struct ClusterTopic<'a> {
    /// The target cluster.
    pub cluster: &'a TestCluster,
    /// The topic counted on it.
    pub topic: &'a Topic,
}

impl DownstreamCounts for ClusterTopic<'_> {
    async fn counts_now(&self) -> Result<Vec<u64>> {
        Ok(self.topic.counts_on_cluster(self.cluster))
    }
}

/// The partitions a fault stalled and where they stood.
#[derive(Debug, Clone)]
pub struct Stalled {
    /// Partitions whose writer the fault stopped.
    pub partitions: BTreeSet<u32>,
    /// Downstream messages per partition after the fault (writes already on the wire landed).
    pub baseline: Vec<u64>,
    /// When the fault happened.
    pub since: Instant,
}

impl Stalled {
    /// Every partition of `baseline` (messages per partition, by partition id), from now.
    #[must_use]
    pub fn every_partition(baseline: Vec<u64>) -> Self {
        Self {
            partitions: (0..baseline.len())
                .filter_map(|p| u32::try_from(p).ok())
                .collect(),
            baseline,
            since: Instant::now(),
        }
    }
}

/// How long after a fault the stalled partitions took to get a new message downstream.
#[derive(Debug, Clone, Copy)]
pub struct Resumption {
    /// Until the first partition moved again.
    pub first: Duration,
    /// Until every partition moved again.
    pub all: Duration,
}

/// Watches the stalled partitions until each has grown past its baseline, i.e. a new owner
/// wrote to it.
pub async fn wait_resumed(
    downstream: &impl DownstreamCounts,
    stalled: &Stalled,
    within: Duration,
) -> Result<Resumption> {
    let deadline = Deadline::new(
        within,
        format!("partitions {:?} to be written again", stalled.partitions),
    );
    let mut first = None;
    let mut pending = stalled.partitions.clone();
    loop {
        let now = downstream.counts_now().await?;
        let grown = |p: u32| {
            let (now, then) = (now.get(p as usize), stalled.baseline.get(p as usize));
            now.unwrap_or(&0) > then.unwrap_or(&0)
        };
        pending.retain(|p| !grown(*p));
        if pending.len() < stalled.partitions.len() && first.is_none() {
            first = Some(stalled.since.elapsed());
        }
        if pending.is_empty() {
            let all = stalled.since.elapsed();
            return Ok(Resumption {
                first: first.unwrap_or(all),
                all,
            });
        }
        deadline.check_seeing(|| format!("still stalled: {pending:?}"))?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`ReplicatorCluster::kill_and_wait_resumed`] did.
#[derive(Debug, Clone)]
pub struct Killed {
    /// The leader's status just before the kill.
    pub before: Status,
    /// Partitions of the topic the victim owned then.
    pub owned: BTreeSet<u32>,
    /// How long until they were written again.
    pub resumed: Resumption,
}

impl ReplicatorCluster {
    /// How long a failover may take before a kill counts as stalled: far above the failover
    /// budget of any sane timing, so that only a real stall runs into it.
    const FAILOVER_WITHIN: Duration = Duration::from_secs(60);

    /// `kill -9` of `victim`, then waits until every partition of `topic` it owned is written
    /// again downstream (counted by `downstream`).
    pub async fn kill_and_wait_resumed(
        &mut self,
        victim: NodeId,
        topic: &Topic,
        downstream: &impl DownstreamCounts,
    ) -> Result<Killed> {
        let before = self
            .leader_status()
            .await
            .ok_or_else(|| Error::Setup("no leader before the kill".to_owned()))?;
        let owned = before.owned_by(topic, victim);
        self.kill(victim)?;
        let since = Instant::now();
        // Sends the victim had on the wire when it died may still land; count from after them.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stalled = Stalled {
            partitions: owned.clone(),
            baseline: downstream.counts_now().await?,
            since,
        };
        let resumed = wait_resumed(downstream, &stalled, Self::FAILOVER_WITHIN).await?;
        Ok(Killed {
            before,
            owned,
            resumed,
        })
    }
}
