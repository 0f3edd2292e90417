//! Prometheus metrics of one node, rendered at every scrape from the control plane's
//! counters and the pipeline's per-unit meters.
//!
//! The control plane's families keep their initial values (leader -1, the rest 0) until it
//! has started: a node answers scrapes from the moment its admin API listens.
//!
//! Counters are fed by deltas between scrapes, so they only ever grow; a unit whose meters
//! restarted (it moved away and came back) counts from its new baseline. Label sets are
//! bounded by the units this node runs (at most the cluster's partitions).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use replicator_control::ControlMetrics;
use replicator_model::WorkUnit;
use replicator_pipeline::UnitStats;

/// Labels of per-unit series.
type UnitLabels = Vec<(&'static str, String)>;

fn unit_labels(unit: &WorkUnit) -> UnitLabels {
    vec![
        ("flow", unit.flow.clone()),
        ("stream", unit.stream.clone()),
        ("topic", unit.topic.clone()),
        ("partition", unit.partition.to_string()),
    ]
}

/// Labels of per-flow series.
type FlowLabels = Vec<(&'static str, String)>;

/// The node's metric families and what the previous scrape saw.
pub(crate) struct Metrics {
    /// Registry and last-seen values; one scrape at a time.
    inner: Mutex<Inner>,
    /// The families the pipeline feeds as things happen.
    data_path: DataPath,
}

/// Histograms and counters fed by the pipeline's observer (not by scrapes).
#[derive(Clone)]
struct DataPath {
    replication_latency: Family<FlowLabels, Histogram>,
    poll_latency: Family<FlowLabels, Histogram>,
    send_latency: Family<FlowLabels, Histogram>,
    errors: Family<Vec<(&'static str, String)>, Counter>,
}

impl DataPath {
    fn new() -> Self {
        // 100 µs … ~52 s in 20 doubling steps: covers loopback sends and multi-second catch-up.
        fn latency_histogram() -> Histogram {
            Histogram::new(exponential_buckets(0.0001, 2.0, 20))
        }
        Self {
            replication_latency: Family::new_with_constructor(latency_histogram),
            poll_latency: Family::new_with_constructor(latency_histogram),
            send_latency: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
        }
    }
}

fn flow_labels(flow: &str) -> FlowLabels {
    vec![("flow", flow.to_owned())]
}

impl replicator_pipeline::PipelineObserver for DataPath {
    fn polled(&self, flow: &str, elapsed: std::time::Duration) {
        self.poll_latency
            .get_or_create(&flow_labels(flow))
            .observe(elapsed.as_secs_f64());
    }

    fn sent(&self, flow: &str, elapsed: std::time::Duration) {
        self.send_latency
            .get_or_create(&flow_labels(flow))
            .observe(elapsed.as_secs_f64());
    }

    fn replicated(&self, flow: &str, latency: std::time::Duration) {
        self.replication_latency
            .get_or_create(&flow_labels(flow))
            .observe(latency.as_secs_f64());
    }

    fn error(&self, flow: &str, kind: &'static str) {
        self.errors
            .get_or_create(&vec![("flow", flow.to_owned()), ("kind", kind.to_owned())])
            .inc();
    }
}

struct Inner {
    registry: Registry,
    messages: Family<UnitLabels, Counter>,
    bytes: Family<UnitLabels, Counter>,
    gaps: Family<UnitLabels, Counter>,
    lag: Family<UnitLabels, Gauge>,
    restarts: Family<Vec<(&'static str, String)>, Counter>,
    units_owned: Gauge,
    term: Gauge,
    leader: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    lease_renewals: Counter,
    fenced_commits: Counter,
    /// (series, unit) → the meter value at the previous scrape.
    seen: HashMap<(&'static str, WorkUnit), u64>,
    /// Control counters at the previous scrape.
    seen_control: (u64, u64),
    /// Units with a lag series, to drop the series of units that left this node.
    lag_units: BTreeSet<WorkUnit>,
}

impl Metrics {
    /// Registers every family under the `iggy_replicator_` prefix.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("iggy_replicator");
        let messages = Family::<UnitLabels, Counter>::default();
        let bytes = Family::<UnitLabels, Counter>::default();
        let gaps = Family::<UnitLabels, Counter>::default();
        let lag = Family::<UnitLabels, Gauge>::default();
        let restarts = Family::<Vec<(&'static str, String)>, Counter>::default();
        let units_owned = Gauge::default();
        let term = Gauge::default();
        let leader = Gauge::default();
        // No leader known until the control plane says otherwise.
        leader.set(-1);
        let commit_index = Gauge::default();
        let applied_index = Gauge::default();
        let lease_renewals = Counter::default();
        let fenced_commits = Counter::default();
        let data_path = DataPath::new();
        registry.register(
            "replication_latency_seconds",
            "Downstream acknowledgement time minus upstream append time of each batch's newest message",
            data_path.replication_latency.clone(),
        );
        registry.register(
            "poll_latency_seconds",
            "Duration of upstream polls",
            data_path.poll_latency.clone(),
        );
        registry.register(
            "send_latency_seconds",
            "Duration of downstream sends",
            data_path.send_latency.clone(),
        );
        registry.register(
            "errors",
            "Failed Iggy or control-plane calls that were retried, by kind",
            data_path.errors.clone(),
        );
        registry.register(
            "messages_copied",
            "Messages written downstream by this node",
            messages.clone(),
        );
        registry.register(
            "bytes_copied",
            "Message bytes (header, payload, user headers) written downstream by this node",
            bytes.clone(),
        );
        registry.register(
            "gap_events",
            "Times upstream retention removed messages before they were copied",
            gaps.clone(),
        );
        registry.register(
            "lag_messages",
            "Upstream messages not yet copied, per unit this node runs",
            lag.clone(),
        );
        registry.register(
            "actor_restarts",
            "Restarts of reader/writer pairs after failures",
            restarts.clone(),
        );
        registry.register(
            "units_owned",
            "Work units this node owns",
            units_owned.clone(),
        );
        registry.register("raft_term", "Current Raft term", term.clone());
        registry.register(
            "raft_leader",
            "Node id of the known Raft leader (-1 when none)",
            leader.clone(),
        );
        registry.register(
            "raft_commit_index",
            "Index of the last Raft log entry on this node",
            commit_index.clone(),
        );
        registry.register(
            "raft_applied_index",
            "Index of the last Raft log entry applied on this node",
            applied_index.clone(),
        );
        registry.register(
            "lease_renewals",
            "Ownership lease renewals committed for this node",
            lease_renewals.clone(),
        );
        registry.register(
            "fenced_commits",
            "Offset commits rejected because their epoch was stale",
            fenced_commits.clone(),
        );
        Self {
            inner: Mutex::new(Inner {
                registry,
                messages,
                bytes,
                gaps,
                lag,
                restarts,
                units_owned,
                term,
                leader,
                commit_index,
                applied_index,
                lease_renewals,
                fenced_commits,
                seen: HashMap::new(),
                seen_control: (0, 0),
                lag_units: BTreeSet::new(),
            }),
            data_path,
        }
    }

    /// The observer to put into `PipelineParams`, feeding this registry.
    pub(crate) fn observer(&self) -> replicator_pipeline::Observer {
        replicator_pipeline::Observer(std::sync::Arc::new(self.data_path.clone()))
    }

    /// Updates every family from the given snapshots (`control` is `None` while the control
    /// plane starts) and renders the text format.
    pub(crate) fn render(
        &self,
        control: Option<&ControlMetrics>,
        units: &[UnitStats],
    ) -> Result<String, std::fmt::Error> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(control) = control {
            inner.update_control(control);
        }
        inner.update_units(units);
        let mut text = String::new();
        encode(&mut text, &inner.registry)?;
        Ok(text)
    }
}

/// `(family, type)` of every family `/metrics` exports, in registration order, read from the
/// `# TYPE` lines of a render before any data: the same registry and encoder as a scrape, so the
/// list cannot drift from what is served. Names are OpenMetrics family names (a counter's
/// samples add `_total`, a histogram's `_bucket`, `_sum` and `_count`).
pub(crate) fn families() -> Result<Vec<(String, String)>, std::fmt::Error> {
    let text = Metrics::new().render(None, &[])?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|declaration| declaration.split_once(' '))
        .map(|(family, kind)| (family.to_owned(), kind.to_owned()))
        .collect())
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Inner {
    fn update_control(&mut self, control: &ControlMetrics) {
        self.units_owned
            .set(i64::try_from(control.units_owned).unwrap_or(i64::MAX));
        self.term.set(to_i64(control.term));
        self.leader.set(control.leader.map_or(-1, to_i64));
        self.commit_index
            .set(control.last_log_index.map_or(0, to_i64));
        self.applied_index
            .set(control.last_applied.map_or(0, to_i64));
        let (renewals, fenced) = self.seen_control;
        self.lease_renewals
            .inc_by(delta(renewals, control.lease_renewals));
        self.fenced_commits
            .inc_by(delta(fenced, control.fenced_commits));
        self.seen_control = (control.lease_renewals, control.fenced_commits);
    }

    fn update_units(&mut self, units: &[UnitStats]) {
        let mut present = BTreeSet::new();
        for stats in units {
            let labels = unit_labels(&stats.unit);
            let mut grown = |series: &'static str, value: u64| {
                let previous = self.seen.insert((series, stats.unit.clone()), value);
                delta(previous.unwrap_or(0), value)
            };
            let (messages, bytes, gaps, restarts) = (
                grown("messages", stats.messages),
                grown("bytes", stats.bytes),
                grown("gaps", stats.gaps),
                grown("restarts", stats.restarts),
            );
            self.messages.get_or_create(&labels).inc_by(messages);
            self.bytes.get_or_create(&labels).inc_by(bytes);
            self.gaps.get_or_create(&labels).inc_by(gaps);
            self.restarts
                .get_or_create(&vec![
                    ("flow", stats.unit.flow.clone()),
                    ("role", "reader_writer".to_owned()),
                ])
                .inc_by(restarts);
            if let Some(lag) = stats.lag {
                self.lag.get_or_create(&labels).set(to_i64(lag));
                present.insert(stats.unit.clone());
            }
        }
        for gone in self.lag_units.difference(&present) {
            self.lag.remove(&unit_labels(gone));
        }
        self.lag_units = present;
    }
}

/// How much a meter grew since the previous scrape; a meter that restarted from zero
/// contributes its whole new value.
fn delta(previous: u64, current: u64) -> u64 {
    if current >= previous {
        current - previous
    } else {
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_before_the_control_plane_started_has_every_family() -> Result<(), std::fmt::Error> {
        let metrics = Metrics::new();
        let text = metrics.render(None, &[])?;
        for family in [
            "iggy_replicator_raft_term",
            "iggy_replicator_raft_leader",
            "iggy_replicator_units_owned",
            "iggy_replicator_lease_renewals_total",
            "iggy_replicator_fenced_commits_total",
        ] {
            assert!(text.contains(family), "{family} missing from:\n{text}");
        }
        assert!(
            text.contains("iggy_replicator_raft_leader -1"),
            "no leader is -1:\n{text}"
        );
        Ok(())
    }

    #[test]
    fn families_lists_every_registered_family_with_its_type() -> Result<(), std::fmt::Error> {
        let families = families()?;
        assert_eq!(families.len(), 16, "{families:?}");
        for expected in [
            ("iggy_replicator_messages_copied", "counter"),
            ("iggy_replicator_lag_messages", "gauge"),
            ("iggy_replicator_send_latency_seconds", "histogram"),
        ] {
            assert!(
                families
                    .iter()
                    .any(|(f, k)| (f.as_str(), k.as_str()) == expected),
                "{expected:?} missing from {families:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn delta_counts_growth_and_restarts_from_new_baseline() {
        assert_eq!(delta(10, 15), 5);
        assert_eq!(delta(10, 10), 0);
        assert_eq!(delta(10, 3), 3);
    }
}
