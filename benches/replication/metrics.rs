//! What the benchmarks read from the nodes' `/metrics`.

use replicator_harness::{Cluster, NodeId, TestResult};

/// Sums and counts of the nodes' histograms that explain the latency.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stages {
    poll_sum: f64,
    poll_count: f64,
    send_sum: f64,
    send_count: f64,
    /// Errors of every kind.
    pub(crate) errors: f64,
}

impl Stages {
    /// Reads every node's `/metrics`.
    pub(crate) async fn read(cluster: &Cluster) -> TestResult<Self> {
        let mut stages = Self::default();
        for id in cluster.running() {
            let text = cluster.metrics_of(id).await?;
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let Some((name, value)) = line.rsplit_once(' ') else {
                    continue;
                };
                let value: f64 = value.parse().unwrap_or(0.0);
                let series = name.split('{').next().unwrap_or(name);
                match series {
                    "iggy_replicator_poll_latency_seconds_sum" => stages.poll_sum += value,
                    "iggy_replicator_poll_latency_seconds_count" => stages.poll_count += value,
                    "iggy_replicator_send_latency_seconds_sum" => stages.send_sum += value,
                    "iggy_replicator_send_latency_seconds_count" => stages.send_count += value,
                    "iggy_replicator_errors_total" => stages.errors += value,
                    _ => {}
                }
            }
        }
        Ok(stages)
    }

    /// Mean poll and send durations (ms) and their counts between `self` and `later`.
    pub(crate) fn since(&self, later: &Self) -> (f64, f64, f64, f64) {
        let polls = later.poll_count - self.poll_count;
        let sends = later.send_count - self.send_count;
        let mean = |sum: f64, count: f64| if count > 0.0 { sum / count * 1e3 } else { 0.0 };
        (
            mean(later.poll_sum - self.poll_sum, polls),
            polls,
            mean(later.send_sum - self.send_sum, sends),
            sends,
        )
    }
}

/// The highest Raft applied index any node reports.
pub(crate) async fn applied_index(cluster: &Cluster) -> TestResult<u64> {
    let mut highest = 0;
    for id in cluster.running() {
        let text = cluster.metrics_of(id).await?;
        if let Some(value) = text
            .lines()
            .find(|l| l.starts_with("iggy_replicator_raft_applied_index"))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
        {
            highest = highest.max(value as u64);
        }
    }
    Ok(highest)
}

/// One node's own view of Raft, from its `/metrics` (its `/status` would ask the leader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RaftView {
    /// The leader it knows, if any.
    pub(crate) leader: Option<NodeId>,
    /// Its current term.
    pub(crate) term: u64,
}

/// Reads `node`'s Raft term gauge and the leader id of its `raft_leader_info` series.
pub(crate) async fn raft_view(cluster: &Cluster, node: NodeId) -> TestResult<RaftView> {
    let text = cluster.metrics_of(node).await?;
    let term = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("iggy_replicator_raft_term ")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .ok_or_else(|| format!("node {node}: no iggy_replicator_raft_term in /metrics"))?;
    // `iggy_replicator_raft_leader_info{leader="2"} 1`; no such sample while no leader is known.
    let leader = text.lines().find_map(|l| {
        l.strip_prefix("iggy_replicator_raft_leader_info{leader=\"")?
            .split_once('"')?
            .0
            .parse::<NodeId>()
            .ok()
    });
    Ok(RaftView {
        leader,
        term: term as u64,
    })
}
