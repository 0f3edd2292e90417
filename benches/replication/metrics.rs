//! What the benchmarks read from the nodes' `/metrics`.

use replicator_harness::{NodeId, ReplicatorCluster, TestResult};

/// Sums, counts and buckets of the nodes' histograms that explain the latency.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stages {
    poll: Histogram,
    send: Histogram,
    /// Each batch's newest message: the node's acknowledgement time minus its upstream append
    /// time.
    replication: Histogram,
    /// Errors of every kind.
    pub(crate) errors: f64,
}

/// One histogram summed over the nodes and its label sets.
#[derive(Debug, Clone, Default)]
struct Histogram {
    sum: f64,
    count: f64,
    /// Cumulative count per bucket bound (`le`, in seconds; `+Inf` left out), ascending.
    buckets: Vec<(f64, f64)>,
}

impl Histogram {
    fn add_bucket(&mut self, le: f64, value: f64) {
        match self.buckets.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, count)) => *count += value,
            None => {
                self.buckets.push((le, value));
                self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// The bound (ms) of the first bucket holding `share` of what was observed between `self`
    /// and `later`: the percentile is at most that; `None` without observations or beyond the
    /// last bound.
    fn percentile_bound_ms(&self, later: &Self, share: f64) -> Option<f64> {
        let count = later.count - self.count;
        if count <= 0.0 {
            return None;
        }
        later.buckets.iter().find_map(|(le, cumulative)| {
            let before = self
                .buckets
                .iter()
                .find(|(bound, _)| bound == le)
                .map_or(0.0, |(_, c)| *c);
            (cumulative - before >= share * count).then_some(le * 1e3)
        })
    }
}

impl Stages {
    /// Reads every node's `/metrics`.
    pub(crate) async fn read(cluster: &ReplicatorCluster) -> TestResult<Self> {
        let mut stages = Self::default();
        for id in cluster.running() {
            let text = cluster.metrics_of(id).await?;
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let Some((name, value)) = line.rsplit_once(' ') else {
                    continue;
                };
                let value: f64 = value.parse().unwrap_or(0.0);
                let series = name.split('{').next().unwrap_or(name);
                if series == "iggy_replicator_errors_total" {
                    stages.errors += value;
                    continue;
                }
                let Some((histogram, part)) = series
                    .strip_prefix("iggy_replicator_")
                    .and_then(|rest| rest.rsplit_once("_seconds_"))
                else {
                    continue;
                };
                let histogram = match histogram {
                    "poll_latency" => &mut stages.poll,
                    "send_latency" => &mut stages.send,
                    "replication_latency" => &mut stages.replication,
                    _ => continue,
                };
                match part {
                    "sum" => histogram.sum += value,
                    "count" => histogram.count += value,
                    "bucket" => {
                        // `+Inf` is left out: the count holds it.
                        if let Some(le) = name
                            .split_once("le=\"")
                            .and_then(|(_, rest)| rest.split_once('"'))
                            .and_then(|(le, _)| le.parse::<f64>().ok())
                            .filter(|le| le.is_finite())
                        {
                            histogram.add_bucket(le, value);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(stages)
    }

    /// Mean poll and send durations (ms) and their counts between `self` and `later`.
    pub(crate) fn since(&self, later: &Self) -> (f64, f64, f64, f64) {
        let polls = later.poll.count - self.poll.count;
        let sends = later.send.count - self.send.count;
        let mean = |sum: f64, count: f64| if count > 0.0 { sum / count * 1e3 } else { 0.0 };
        (
            mean(later.poll.sum - self.poll.sum, polls),
            polls,
            mean(later.send.sum - self.send.sum, sends),
            sends,
        )
    }

    /// Upper bounds (ms, a histogram bucket's) of the 99th percentile of polls, of sends and of
    /// the nodes' replication latency between `self` and `later`, as `"≤ 1.6"`, or `"–"`
    /// without observations.
    pub(crate) fn p99_bounds(&self, later: &Self) -> [String; 3] {
        let bound = |before: &Histogram, after: &Histogram| {
            before
                .percentile_bound_ms(after, 0.99)
                .map_or("–".to_owned(), |ms| format!("≤ {ms:.1}"))
        };
        [
            bound(&self.poll, &later.poll),
            bound(&self.send, &later.send),
            bound(&self.replication, &later.replication),
        ]
    }
}

/// The highest Raft applied index any node reports.
pub(crate) async fn applied_index(cluster: &ReplicatorCluster) -> TestResult<u64> {
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
pub(crate) async fn raft_view(cluster: &ReplicatorCluster, node: NodeId) -> TestResult<RaftView> {
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
