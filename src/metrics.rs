//! Prometheus metrics of one node.
//!
//! Two kinds of families:
//!
//! * the data-path histograms and the error counter, fed by the pipeline's observer as things
//!   happen ([`DataPath`]);
//! * everything else, read at scrape time by a prometheus-client [`Collector`] ([`Scrape`])
//!   from a [`Snapshot`] of the control plane's and the pipeline's own counters. Nothing is
//!   copied or remembered between scrapes: a counter is the source's total since this process
//!   started (the pipeline keeps a unit's meters when the unit moves away, so they never go
//!   back), a gauge is the source's value now.
//!
//! Every family is declared at every scrape, with or without samples, so the list
//! `metric-names` prints cannot depend on what the node knows yet. Until the control plane has
//! started, its families have no samples; `units_unowned` has samples only on the Raft leader
//! (the node that assigns units); `raft_leader_info` only while a leader is known; `lag_messages`
//! only for the units this node owns. Label sets are bounded by the units this node has run (at
//! most the cluster's partitions).

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;
use replicator_control::ControlMetrics;
use replicator_model::WorkUnit;
use replicator_pipeline::UnitStats;

/// The prefix of every family.
const PREFIX: &str = "iggy_replicator";

/// Labels of per-flow series.
type FlowLabels = Vec<(&'static str, String)>;

/// Labels of per-unit series, written straight from the unit: an instance with 33,000 units
/// renders nine series each per scrape, and copying four strings per sample was most of a
/// scrape's cost (BENCHMARKS.md section 22).
struct UnitLabels<'a>(&'a WorkUnit);

impl EncodeLabelSet for UnitLabels<'_> {
    fn encode(&self, mut encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let unit = self.0;
        ("flow", unit.flow.as_str()).encode(encoder.encode_label())?;
        ("stream", unit.stream.as_str()).encode(encoder.encode_label())?;
        ("topic", unit.topic.as_str()).encode(encoder.encode_label())?;
        ("partition", unit.partition).encode(encoder.encode_label())
    }
}

fn flow_labels(flow: &str) -> FlowLabels {
    vec![("flow", flow.to_owned())]
}

/// The node's metric families.
pub(crate) struct Metrics {
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

    /// Registers the families in `registry` (handles: they share their series with `self`).
    fn register(&self, registry: &mut Registry) {
        for (name, help, histograms) in [
            (
                "replication_latency_seconds",
                "Downstream acknowledgement time minus upstream append time of each batch's newest message",
                &self.replication_latency,
            ),
            ("poll_latency_seconds", "Duration of upstream polls", &self.poll_latency),
            ("send_latency_seconds", "Duration of downstream sends", &self.send_latency),
        ] {
            registry.register(name, help, histograms.clone());
        }
        registry.register(
            "errors",
            "Failed calls to Iggy (polls, sends, metadata reads) that are retried, by kind",
            self.errors.clone(),
        );
    }
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

/// What one scrape reads from the node, taken right before it is encoded.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// The control plane's metrics; `None` while it starts.
    pub(crate) control: Option<ControlMetrics>,
    /// The units the control plane's applied state grants this node (lag is exported for
    /// these only: the meters of a unit that moved away keep its last lag).
    pub(crate) owned: BTreeSet<WorkUnit>,
    /// The pipeline's per-unit statistics; empty while it starts.
    pub(crate) units: Vec<UnitStats>,
    /// Whether `GET /ready` answers 200.
    pub(crate) ready: bool,
    /// The connections to each Iggy cluster; empty while the pipeline starts.
    pub(crate) connections: Vec<replicator_pipeline::ConnectionState>,
    /// Every flow's consumer-group sync on this node (flows that sync groups only).
    pub(crate) groups: BTreeMap<String, replicator_pipeline::FlowSyncState>,
    /// Every flow's user and topic-settings sync on this node (flows whose rounds ran here).
    pub(crate) metadata: BTreeMap<String, replicator_pipeline::MetadataSyncState>,
    /// Every configured flow and whether it is paused; empty while the control plane starts.
    pub(crate) paused: Vec<(String, bool)>,
    /// This node's heartbeat counts per flow (flows with heartbeats on); empty while the
    /// pipeline starts.
    pub(crate) heartbeats: Vec<replicator_pipeline::HeartbeatStats>,
    /// The topics residency policies keep from each flow's target (every flow); empty while
    /// the pipeline starts.
    pub(crate) residency: Vec<replicator_pipeline::FlowResidency>,
    /// How the pipeline's long-running tasks fared; empty while the pipeline starts.
    pub(crate) tasks: Vec<replicator_pipeline::TaskStats>,
}

impl Metrics {
    /// The families, with no data yet.
    pub(crate) fn new() -> Self {
        Self {
            data_path: DataPath::new(),
        }
    }

    /// The observer to put into `PipelineParams`, feeding this node's data-path families.
    pub(crate) fn observer(&self) -> replicator_pipeline::Observer {
        replicator_pipeline::Observer(std::sync::Arc::new(self.data_path.clone()))
    }

    /// Renders every family in the OpenMetrics text format: the data-path families as they
    /// are, the rest from `snapshot`.
    pub(crate) fn render(&self, snapshot: Snapshot) -> Result<String, std::fmt::Error> {
        // A registry per scrape: registering is a few pushes, and the collector owns the
        // snapshot it encodes instead of sharing a slot with concurrent scrapes.
        let mut registry = Registry::with_prefix(PREFIX);
        self.data_path.register(&mut registry);
        registry.register_collector(Box::new(Scrape(snapshot)));
        let mut text = String::new();
        encode(&mut text, &registry)?;
        Ok(text)
    }
}

/// `(family, type)` of every family `/metrics` exports, in the order a scrape lists them, read
/// from the `# TYPE` lines of a render before any data: the same registry, collector and
/// encoder as a scrape, so the list cannot drift from what is served. Names are OpenMetrics
/// family names (a counter's samples add `_total`, a histogram's `_bucket`, `_sum` and
/// `_count`).
pub(crate) fn families() -> Result<Vec<(String, String)>, std::fmt::Error> {
    let text = Metrics::new().render(Snapshot::default())?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|declaration| declaration.split_once(' '))
        .map(|(family, kind)| (family.to_owned(), kind.to_owned()))
        .collect())
}

/// Encodes the scrape-time families from one snapshot.
#[derive(Debug)]
struct Scrape(Snapshot);

fn gauge(value: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX))
}

fn flag(on: bool) -> ConstGauge<i64> {
    ConstGauge::new(i64::from(on))
}

/// Declares an unlabelled family and encodes its one sample, if any.
fn scalar<M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    sample: Option<M>,
) -> Result<(), std::fmt::Error> {
    let family = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    match sample {
        Some(metric) => metric.encode(family),
        None => Ok(()),
    }
}

/// Declares one counter family per `(name, help, total)` of `table`, with one sample per item
/// (its labels, and the total read from it).
fn counter_families<'a, T: 'a, L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    table: &[CounterOf<T>],
    items: impl Iterator<Item = (L, &'a T)> + Clone,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in table {
        let samples = items
            .clone()
            .map(|(labels, item)| (labels, ConstCounter::new(value(item))));
        labelled(e, name, help, samples)?;
    }
    Ok(())
}

/// Declares a labelled family and encodes one sample per label set (possibly none).
fn labelled<L: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Snapshot {
            control,
            owned,
            units,
            ready,
            connections,
            groups,
            metadata,
            paused,
            heartbeats,
            residency,
            tasks,
        } = &self.0;
        let e = &mut encoder;
        labelled(
            e,
            "build_info",
            "Always 1; the version of this binary is in the label",
            [([("version", env!("CARGO_PKG_VERSION"))], flag(true))],
        )?;
        scalar(
            e,
            "ready",
            "1 when GET /ready answers 200 (a Raft leader is known and the state applied), else 0",
            Some(flag(*ready)),
        )?;
        labelled(
            e,
            "cluster_connections_open",
            "Connections to the Iggy cluster open now (0: the cluster is unreachable or not used yet)",
            connections
                .iter()
                .map(|c| ([("cluster", c.cluster.as_str())], gauge(c.open as u64))),
        )?;
        labelled(
            e,
            "cluster_connections_configured",
            "Connections configured to the Iggy cluster (clusters.<alias>.connections)",
            connections.iter().map(|c| {
                (
                    [("cluster", c.cluster.as_str())],
                    gauge(c.configured as u64),
                )
            }),
        )?;
        encode_units(e, units, owned)?;
        encode_groups(e, groups)?;
        encode_metadata(e, metadata)?;
        labelled(
            e,
            "flow_paused",
            "1 while the flow is paused (flow pause, flow promote), else 0",
            paused
                .iter()
                .map(|(flow, on)| (flow_labels(flow), flag(*on))),
        )?;
        encode_heartbeats(e, heartbeats)?;
        labelled(
            e,
            "policy_blocked_topics",
            "Topics of the flow that residency policies keep from its target (upstream topics not copied, and the heartbeat topic when heartbeats are blocked)",
            residency
                .iter()
                .map(|r| (flow_labels(&r.flow), gauge(r.blocked.len() as u64))),
        )?;
        encode_tasks(e, tasks)?;
        encode_control(e, control.as_ref())
    }
}

/// The user and topic-settings sync families (README "Disaster recovery"), of the flows whose
/// rounds ran on this node.
fn encode_metadata(
    e: &mut DescriptorEncoder,
    flows: &BTreeMap<String, replicator_pipeline::MetadataSyncState>,
) -> Result<(), std::fmt::Error> {
    let counters: [CounterOf<replicator_pipeline::MetadataSyncState>; 5] = [
        (
            "metadata_sync_runs",
            "User and topic-settings sync rounds this node ran",
            |s| s.runs,
        ),
        (
            "metadata_sync_failures",
            "User and topic-settings sync rounds with at least one error (each is retried next round)",
            |s| s.failed_runs,
        ),
        (
            "users_synced",
            "Users this node created, changed or deleted on the target",
            |s| s.users_changed,
        ),
        (
            "topic_settings_synced",
            "Topic settings updates this node applied on the target",
            |s| s.settings_applied,
        ),
        (
            "metadata_conflicts_resolved",
            "Topic settings of a two-way pair changed on both clusters since they last agreed, which this node resolved by applying the home's value",
            |s| s.conflicts_resolved,
        ),
    ];
    counter_families(
        e,
        &counters,
        flows.iter().map(|(flow, s)| (flow_labels(flow), s)),
    )?;
    labelled(
        e,
        "user_sync_drift",
        "Users of the latest round the target does not match and the sync cannot fix: conflicts, failures, users deleted upstream but kept",
        flows
            .iter()
            .map(|(flow, s)| (flow_labels(flow), gauge(s.user_drift()))),
    )?;
    labelled(
        e,
        "topic_settings_drift",
        "Topics of the latest round whose settings on the target differ from upstream other than on purpose: extra partitions, failed updates, conflicts of a two-way pair",
        flows
            .iter()
            .map(|(flow, s)| (flow_labels(flow), gauge(s.settings_drift()))),
    )?;
    labelled(
        e,
        "metadata_sync_age_seconds",
        "Seconds since this node's latest user and topic-settings sync round of the flow ended",
        flows
            .iter()
            .map(|(flow, s)| (flow_labels(flow), gauge(age_seconds(s.last.at_unix_ms)))),
    )
}

/// The consumer-group sync families (README "Disaster recovery").
fn encode_groups(
    e: &mut DescriptorEncoder,
    groups: &BTreeMap<String, replicator_pipeline::FlowSyncState>,
) -> Result<(), std::fmt::Error> {
    let counters: [CounterOf<replicator_pipeline::FlowSyncState>; 3] = [
        (
            "consumer_group_sync_runs",
            "Consumer-group sync rounds this node ran",
            |s| s.runs,
        ),
        (
            "consumer_group_sync_failures",
            "Consumer-group sync rounds with at least one error (each is retried next round)",
            |s| s.failed_runs,
        ),
        (
            "consumer_group_offsets_synced",
            "Consumer-group offsets this node stored on the target",
            |s| s.stored,
        ),
    ];
    counter_families(
        e,
        &counters,
        groups.iter().map(|(flow, s)| (flow_labels(flow), s)),
    )?;
    labelled(
        e,
        "consumer_groups_skipped",
        "Groups the latest sync round left alone because they have members on the target",
        groups
            .iter()
            .map(|(flow, s)| (flow_labels(flow), gauge(s.last.skipped.len() as u64))),
    )?;
    labelled(
        e,
        "consumer_group_sync_age_seconds",
        "Seconds since this node's latest consumer-group sync round of the flow ended",
        groups
            .iter()
            .map(|(flow, s)| (flow_labels(flow), gauge(age_seconds(s.last.at_unix_ms)))),
    )
}

/// Whole seconds from `at_unix_ms` to now (0 for a time in the future).
fn age_seconds(at_unix_ms: u64) -> u64 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    now_ms.saturating_sub(at_unix_ms) / 1000
}

/// The per-flow heartbeat families.
fn encode_heartbeats(
    e: &mut DescriptorEncoder,
    heartbeats: &[replicator_pipeline::HeartbeatStats],
) -> Result<(), std::fmt::Error> {
    labelled(
        e,
        "heartbeats_sent",
        "Heartbeat records of the flow this node wrote to the target and the target acknowledged",
        heartbeats
            .iter()
            .map(|h| ([("flow", h.flow.as_str())], ConstCounter::new(h.sent))),
    )?;
    labelled(
        e,
        "heartbeat_failures",
        "Heartbeats of the flow that failed (topic creation or send; retried on the next tick)",
        heartbeats
            .iter()
            .map(|h| ([("flow", h.flow.as_str())], ConstCounter::new(h.failures))),
    )?;
    labelled(
        e,
        "heartbeat_age_seconds",
        "Seconds since this node's newest acknowledged heartbeat of the flow (no sample before the first)",
        heartbeats.iter().filter_map(|h| {
            let age = h.last_sent_age?;
            Some(([("flow", h.flow.as_str())], ConstGauge::new(age.as_secs_f64())))
        }),
    )
}

/// The per-task families of the long-running tasks beside the data path.
fn encode_tasks(
    e: &mut DescriptorEncoder,
    tasks: &[replicator_pipeline::TaskStats],
) -> Result<(), std::fmt::Error> {
    let labels = |t: &replicator_pipeline::TaskStats| {
        [
            ("task", t.task.name().to_owned()),
            ("flow", t.flow.clone().unwrap_or_default()),
        ]
    };
    labelled(
        e,
        "task_restarts",
        "Times a long-running task (discovery, metadata_sync, group_sync, heartbeats per flow; identity_follower, watchdog per node; flow empty) ended while it should have run, and was restarted or given up on",
        tasks
            .iter()
            .map(|t| (labels(t), ConstCounter::new(t.restarts))),
    )?;
    labelled(
        e,
        "task_panics",
        "How many of task_restarts were panics (a bug: please report it)",
        tasks
            .iter()
            .map(|t| (labels(t), ConstCounter::new(t.panics))),
    )
}

/// A counter family: name, help, and the total it reads from a `T` (a unit's stats, the control
/// plane's metrics, a flow's group sync).
type CounterOf<T> = (&'static str, &'static str, fn(&T) -> u64);

/// The per-unit and per-flow families, from the pipeline's meters.
fn encode_units(
    e: &mut DescriptorEncoder,
    units: &[UnitStats],
    owned: &BTreeSet<WorkUnit>,
) -> Result<(), std::fmt::Error> {
    let counters: [CounterOf<UnitStats>; 8] = [
        (
            "messages_copied",
            "Messages written downstream by this node",
            |s| s.messages,
        ),
        (
            "bytes_copied",
            "Message bytes (header, payload, user headers) written downstream by this node",
            |s| s.bytes,
        ),
        (
            "messages_skipped_loop",
            "Messages not copied because they originated in the target cluster (loop prevention)",
            |s| s.skipped_loop,
        ),
        (
            "gap_events",
            "Times upstream retention removed messages before they were copied",
            |s| s.gaps,
        ),
        (
            "upstream_resets",
            "Times the upstream partition started a new history (topic recreated or partition purged) while this node copied it",
            |s| s.upstream_resets,
        ),
        (
            "downstream_losses",
            "Times a writer found the target had lost messages it had confirmed",
            |s| s.downstream_losses,
        ),
        (
            "messages_recopied",
            "Confirmed messages written again after the target lost them",
            |s| s.messages_recopied,
        ),
        (
            "tail_scans_exhausted",
            "Tail scans that reached tail_scan_window without finding a message of the unit",
            |s| s.tail_scans_exhausted,
        ),
    ];
    counter_families(e, &counters, units.iter().map(|s| (UnitLabels(&s.unit), s)))?;
    labelled(
        e,
        "lag_messages",
        "Upstream messages not yet copied, per unit this node owns (as its reader last saw the upstream end)",
        units
            .iter()
            .filter(|s| owned.contains(&s.unit))
            .filter_map(|s| Some((UnitLabels(&s.unit), gauge(s.lag?)))),
    )?;
    let mut restarts: BTreeMap<&str, u64> = BTreeMap::new();
    for s in units {
        *restarts.entry(s.unit.flow.as_str()).or_default() += s.restarts;
    }
    labelled(
        e,
        "actor_restarts",
        "Restarts of reader/writer pairs after failures",
        restarts
            .into_iter()
            .map(|(flow, n)| ([("flow", flow)], ConstCounter::new(n))),
    )
}

/// The control plane's families; no samples while it starts.
fn encode_control(
    e: &mut DescriptorEncoder,
    control: Option<&ControlMetrics>,
) -> Result<(), std::fmt::Error> {
    let c = control;
    scalar(
        e,
        "units_owned",
        "Work units this node owns",
        c.map(|c| gauge(c.units_owned as u64)),
    )?;
    scalar(
        e,
        "units_unowned",
        "Work units discovery reports that no member owns (not retired); only the Raft leader reports it",
        c.filter(|c| c.is_leader)
            .map(|c| gauge(c.units_unowned as u64)),
    )?;
    scalar(
        e,
        "raft_term",
        "Current Raft term",
        c.map(|c| gauge(c.term)),
    )?;
    scalar(
        e,
        "raft_leader",
        "1 when this node is the Raft leader, else 0",
        c.map(|c| flag(c.is_leader)),
    )?;
    labelled(
        e,
        "raft_leader_info",
        "Always 1; the Raft leader this node knows is in the label (no sample while it knows none)",
        c.and_then(|c| c.leader)
            .map(|leader| ([("leader", leader.to_string())], flag(true))),
    )?;
    scalar(
        e,
        "raft_commit_index",
        "Raft commit index as this node knows it (entries up to it are durable on a quorum)",
        c.and_then(|c| c.commit_index).map(gauge),
    )?;
    scalar(
        e,
        "raft_applied_index",
        "Index of the last Raft log entry applied on this node",
        c.and_then(|c| c.last_applied).map(gauge),
    )?;
    scalar(
        e,
        "raft_snapshot_index",
        "Index of the last Raft log entry in this node's latest snapshot",
        c.and_then(|c| c.snapshot_index).map(gauge),
    )?;
    scalar(
        e,
        "raft_purged_index",
        "Index of the last Raft log entry this node purged: a member behind it catches up by snapshot",
        c.and_then(|c| c.purged_index).map(gauge),
    )?;
    scalar(
        e,
        "raft_snapshot_bytes",
        "Encoded size of this node's latest Raft snapshot (built, installed or loaded at start)",
        c.and_then(|c| c.snapshot_bytes).map(gauge),
    )?;
    scalar(
        e,
        "raft_snapshot_build_seconds",
        "How long this node took to build its latest Raft snapshot (applies wait while it encodes)",
        c.and_then(|c| c.snapshot_build)
            .map(|d| ConstGauge::new(d.as_secs_f64())),
    )?;
    scalar(
        e,
        "raft_snapshot_install_seconds",
        "How long this node took to install the latest Raft snapshot the leader sent, after its transfer",
        c.and_then(|c| c.snapshot_install)
            .map(|d| ConstGauge::new(d.as_secs_f64())),
    )?;
    let counters: [CounterOf<ControlMetrics>; 5] = [
        (
            "control_requests_sent",
            "Requests this node sent to other members of the Raft group (replication, votes, snapshots, forwarded writes, status and membership calls; retries included)",
            |c| c.requests_sent,
        ),
        (
            "lease_renewals",
            "Ownership lease renewals committed for this node",
            |c| c.lease_renewals,
        ),
        (
            "fenced_commits",
            "Offset commits rejected because their epoch was stale",
            |c| c.fenced_commits,
        ),
        (
            "writer_fences",
            "Revokes of a writer identity on one target cluster that this node (as Raft leader) had acknowledged and committed",
            |c| c.fences,
        ),
        (
            "writer_fence_failures",
            "Attempts to revoke, create or forget a writer user on a target cluster that failed (retried)",
            |c| c.fence_failures,
        ),
    ];
    for (name, help, value) in counters {
        scalar(e, name, help, c.map(|c| ConstCounter::new(value(c))))?;
    }
    scalar(
        e,
        "writer_fences_pending",
        "Revokes of a writer identity waiting for a target cluster's acknowledgement; the fenced member's units writing there are not granted meanwhile (leader only)",
        c.filter(|c| c.is_leader)
            .map(|c| gauge(c.fences_pending as u64)),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use replicator_model::Epoch;
    use replicator_pipeline::LatencyQuantiles;

    use super::*;

    fn control(node: u64, leader: Option<u64>) -> ControlMetrics {
        ControlMetrics {
            node,
            term: 4,
            leader,
            is_leader: leader == Some(node),
            last_log_index: Some(12),
            last_applied: Some(10),
            commit_index: Some(11),
            snapshot_index: Some(9),
            purged_index: None,
            snapshot_bytes: Some(4096),
            snapshot_build: Some(Duration::from_millis(250)),
            snapshot_install: None,
            lease_renewals: 7,
            fenced_commits: 2,
            commit_batches: 3,
            requests_sent: 40,
            units_owned: 1,
            units_unowned: 5,
            fences: 1,
            fence_failures: 0,
            fences_pending: 0,
        }
    }

    fn stats(partition: u32, lag: Option<u64>) -> UnitStats {
        UnitStats {
            unit: WorkUnit::new("us-to-eu", "orders", "created", partition),
            epoch: Epoch(1),
            last_written: Some(9),
            upstream_end: Some(10),
            lag,
            messages: 10,
            bytes: 1000,
            messages_per_second: 0.0,
            skipped_loop: 3,
            restarts: 1,
            gaps: 0,
            recent_gaps: Vec::new(),
            upstream_resets: 0,
            downstream_losses: 0,
            messages_recopied: 0,
            tail_scans_exhausted: 0,
            batch_size: 1000,
            latency: Some(LatencyQuantiles {
                p50: Duration::from_millis(1),
                p99: Duration::from_millis(1),
            }),
        }
    }

    /// The sample lines of a render (no comments, no EOF).
    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn render_before_the_control_plane_started_declares_every_family() -> Result<(), std::fmt::Error>
    {
        let text = Metrics::new().render(Snapshot::default())?;
        for family in [
            "iggy_replicator_raft_term",
            "iggy_replicator_raft_leader",
            "iggy_replicator_raft_leader_info",
            "iggy_replicator_units_owned",
            "iggy_replicator_lease_renewals",
            "iggy_replicator_fenced_commits",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{family} not declared in:\n{text}"
            );
        }
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            samples(&text),
            [
                format!("iggy_replicator_build_info{{version=\"{version}\"}} 1").as_str(),
                "iggy_replicator_ready 0",
            ],
            "only build_info and ready have samples before anything started:\n{text}"
        );
        Ok(())
    }

    #[test]
    fn leader_is_a_flag_and_its_id_an_info_label() -> Result<(), std::fmt::Error> {
        let metrics = Metrics::new();
        let leader = metrics.render(Snapshot {
            control: Some(control(2, Some(2))),
            ready: true,
            ..Snapshot::default()
        })?;
        let leader = samples(&leader);
        for expected in [
            "iggy_replicator_raft_leader 1",
            "iggy_replicator_raft_leader_info{leader=\"2\"} 1",
            "iggy_replicator_raft_commit_index 11",
            "iggy_replicator_raft_applied_index 10",
            "iggy_replicator_raft_snapshot_index 9",
            "iggy_replicator_raft_snapshot_bytes 4096",
            "iggy_replicator_raft_snapshot_build_seconds 0.25",
            "iggy_replicator_units_unowned 5",
            "iggy_replicator_lease_renewals_total 7",
            "iggy_replicator_fenced_commits_total 2",
            "iggy_replicator_ready 1",
        ] {
            assert!(leader.contains(&expected), "{expected} in {leader:?}");
        }
        assert!(
            !leader.iter().any(|l| l.contains("snapshot_install")),
            "no install sample before a snapshot was installed: {leader:?}"
        );
        let follower = metrics.render(Snapshot {
            control: Some(control(1, Some(2))),
            ..Snapshot::default()
        })?;
        let follower = samples(&follower);
        assert!(follower.contains(&"iggy_replicator_raft_leader 0"));
        assert!(follower.contains(&"iggy_replicator_raft_leader_info{leader=\"2\"} 1"));
        assert!(
            !follower.iter().any(|l| l.contains("units_unowned")),
            "only the leader reports unowned units: {follower:?}"
        );
        let leaderless = metrics.render(Snapshot {
            control: Some(control(1, None)),
            ..Snapshot::default()
        })?;
        assert!(
            !samples(&leaderless)
                .iter()
                .any(|l| l.contains("raft_leader_info")),
            "{leaderless}"
        );
        Ok(())
    }

    #[test]
    fn unit_counters_are_the_meters_totals_and_lag_only_for_owned_units(
    ) -> Result<(), std::fmt::Error> {
        let metrics = Metrics::new();
        let owned_unit = stats(0, Some(4));
        let moved_away = stats(1, Some(99));
        let snapshot = || Snapshot {
            control: Some(control(1, Some(1))),
            owned: BTreeSet::from([owned_unit.unit.clone()]),
            units: vec![owned_unit.clone(), moved_away.clone()],
            ready: true,
            connections: vec![replicator_pipeline::ConnectionState {
                cluster: "us".into(),
                open: 3,
                configured: 4,
            }],
            groups: BTreeMap::from([(
                "us-to-eu".to_owned(),
                replicator_pipeline::FlowSyncState {
                    runs: 5,
                    failed_runs: 1,
                    stored: 7,
                    last: replicator_pipeline::GroupSyncReport {
                        skipped: vec![replicator_pipeline::GroupSkip {
                            stream: "orders".into(),
                            topic: "created".into(),
                            group: "billing".into(),
                            reason: "1 active member(s) on the target".into(),
                        }],
                        ..Default::default()
                    },
                },
            )]),
            metadata: BTreeMap::from([(
                "us-to-eu".to_owned(),
                replicator_pipeline::MetadataSyncState {
                    runs: 4,
                    failed_runs: 1,
                    users_changed: 2,
                    settings_applied: 3,
                    conflicts_resolved: 0,
                    last: replicator_pipeline::MetadataSyncReport {
                        users: vec![replicator_pipeline::UserReport {
                            name: "app".into(),
                            state: replicator_pipeline::UserSyncState::RemovedUpstream,
                            not_translated: Vec::new(),
                            home: None,
                            note: None,
                        }],
                        ..Default::default()
                    },
                },
            )]),
            paused: vec![("us-to-eu".to_owned(), true)],
            heartbeats: Vec::new(),
            residency: Vec::new(),
            tasks: Vec::new(),
        };
        // Two scrapes of the same meters show the same totals (nothing is added per scrape).
        let _ = metrics.render(snapshot())?;
        let text = metrics.render(snapshot())?;
        let lines = samples(&text);
        let labels = |p: u32| {
            format!("{{flow=\"us-to-eu\",stream=\"orders\",topic=\"created\",partition=\"{p}\"}}")
        };
        for expected in [
            "iggy_replicator_cluster_connections_open{cluster=\"us\"} 3",
            "iggy_replicator_cluster_connections_configured{cluster=\"us\"} 4",
            "iggy_replicator_consumer_group_sync_runs_total{flow=\"us-to-eu\"} 5",
            "iggy_replicator_consumer_group_sync_failures_total{flow=\"us-to-eu\"} 1",
            "iggy_replicator_consumer_group_offsets_synced_total{flow=\"us-to-eu\"} 7",
            "iggy_replicator_consumer_groups_skipped{flow=\"us-to-eu\"} 1",
            "iggy_replicator_metadata_sync_runs_total{flow=\"us-to-eu\"} 4",
            "iggy_replicator_metadata_sync_failures_total{flow=\"us-to-eu\"} 1",
            "iggy_replicator_users_synced_total{flow=\"us-to-eu\"} 2",
            "iggy_replicator_topic_settings_synced_total{flow=\"us-to-eu\"} 3",
            "iggy_replicator_user_sync_drift{flow=\"us-to-eu\"} 1",
            "iggy_replicator_topic_settings_drift{flow=\"us-to-eu\"} 0",
            "iggy_replicator_flow_paused{flow=\"us-to-eu\"} 1",
        ] {
            assert!(lines.contains(&expected), "{expected} in {lines:?}");
        }
        for p in [0, 1] {
            for expected in [
                format!("iggy_replicator_messages_copied_total{} 10", labels(p)),
                format!("iggy_replicator_bytes_copied_total{} 1000", labels(p)),
                format!("iggy_replicator_messages_skipped_loop_total{} 3", labels(p)),
                format!("iggy_replicator_gap_events_total{} 0", labels(p)),
            ] {
                assert!(lines.contains(&expected.as_str()), "{expected}:\n{text}");
            }
        }
        let lag: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with("iggy_replicator_lag_messages"))
            .collect();
        assert_eq!(
            lag,
            [&format!("iggy_replicator_lag_messages{} 4", labels(0)).as_str()],
            "{text}"
        );
        assert!(
            lines.contains(&"iggy_replicator_actor_restarts_total{flow=\"us-to-eu\"} 2"),
            "restarts summed per flow, no constant label:\n{text}"
        );
        Ok(())
    }

    #[test]
    fn heartbeat_families_are_per_flow_and_the_age_only_after_a_first_heartbeat(
    ) -> Result<(), std::fmt::Error> {
        let heartbeat = |flow: &str, age: Option<Duration>| replicator_pipeline::HeartbeatStats {
            flow: flow.to_owned(),
            sent: 5,
            failures: 2,
            last_sent_age: age,
            last_error: None,
        };
        let text = Metrics::new().render(Snapshot {
            heartbeats: vec![
                heartbeat("a", Some(Duration::from_millis(1500))),
                heartbeat("b", None),
            ],
            ..Snapshot::default()
        })?;
        let lines = samples(&text);
        for expected in [
            "iggy_replicator_heartbeats_sent_total{flow=\"a\"} 5",
            "iggy_replicator_heartbeat_failures_total{flow=\"b\"} 2",
            "iggy_replicator_heartbeat_age_seconds{flow=\"a\"} 1.5",
        ] {
            assert!(lines.contains(&expected), "{expected} in {lines:?}");
        }
        assert!(
            !lines
                .iter()
                .any(|l| l.starts_with("iggy_replicator_heartbeat_age_seconds{flow=\"b\"}")),
            "no age before the first heartbeat:\n{text}"
        );
        Ok(())
    }

    #[test]
    fn policy_blocked_topics_counts_each_flows_blocked_topics_and_zero_for_none(
    ) -> Result<(), std::fmt::Error> {
        let blocked = |stream: &str| replicator_pipeline::BlockedTopic {
            stream: stream.to_owned(),
            topic: "events".to_owned(),
            policy: "pii".to_owned(),
            heartbeat: false,
        };
        let flow = |name: &str, blocked: Vec<replicator_pipeline::BlockedTopic>| {
            replicator_pipeline::FlowResidency {
                flow: name.to_owned(),
                target: "us".to_owned(),
                blocked,
            }
        };
        let text = Metrics::new().render(Snapshot {
            residency: vec![
                flow("a", vec![blocked("pii-users"), blocked("pii-cards")]),
                flow("b", Vec::new()),
            ],
            ..Snapshot::default()
        })?;
        let lines = samples(&text);
        for expected in [
            "iggy_replicator_policy_blocked_topics{flow=\"a\"} 2",
            "iggy_replicator_policy_blocked_topics{flow=\"b\"} 0",
        ] {
            assert!(lines.contains(&expected), "{expected} in {lines:?}");
        }
        Ok(())
    }

    #[test]
    fn tasks_export_restarts_and_panics_with_an_empty_flow_for_node_tasks(
    ) -> Result<(), std::fmt::Error> {
        let task = |task, flow: Option<&str>, restarts, panics| replicator_pipeline::TaskStats {
            task,
            flow: flow.map(str::to_owned),
            restarts,
            panics,
            last_failure: None,
            running: true,
        };
        let text = Metrics::new().render(Snapshot {
            tasks: vec![
                task(replicator_pipeline::TaskKind::Discovery, Some("a"), 2, 1),
                task(replicator_pipeline::TaskKind::Watchdog, None, 0, 0),
            ],
            ..Snapshot::default()
        })?;
        let lines = samples(&text);
        for expected in [
            "iggy_replicator_task_restarts_total{task=\"discovery\",flow=\"a\"} 2",
            "iggy_replicator_task_panics_total{task=\"discovery\",flow=\"a\"} 1",
            "iggy_replicator_task_restarts_total{task=\"watchdog\",flow=\"\"} 0",
        ] {
            assert!(lines.contains(&expected), "{expected} in {lines:?}");
        }
        Ok(())
    }

    #[test]
    fn families_lists_every_registered_family_with_its_type() -> Result<(), std::fmt::Error> {
        let families = families()?;
        let names: Vec<(&str, &str)> = families
            .iter()
            .map(|(f, k)| (f.strip_prefix("iggy_replicator_").unwrap_or(f), k.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("replication_latency_seconds", "histogram"),
                ("poll_latency_seconds", "histogram"),
                ("send_latency_seconds", "histogram"),
                ("errors", "counter"),
                ("build_info", "gauge"),
                ("ready", "gauge"),
                ("cluster_connections_open", "gauge"),
                ("cluster_connections_configured", "gauge"),
                ("messages_copied", "counter"),
                ("bytes_copied", "counter"),
                ("messages_skipped_loop", "counter"),
                ("gap_events", "counter"),
                ("upstream_resets", "counter"),
                ("downstream_losses", "counter"),
                ("messages_recopied", "counter"),
                ("tail_scans_exhausted", "counter"),
                ("lag_messages", "gauge"),
                ("actor_restarts", "counter"),
                ("consumer_group_sync_runs", "counter"),
                ("consumer_group_sync_failures", "counter"),
                ("consumer_group_offsets_synced", "counter"),
                ("consumer_groups_skipped", "gauge"),
                ("consumer_group_sync_age_seconds", "gauge"),
                ("metadata_sync_runs", "counter"),
                ("metadata_sync_failures", "counter"),
                ("users_synced", "counter"),
                ("topic_settings_synced", "counter"),
                ("metadata_conflicts_resolved", "counter"),
                ("user_sync_drift", "gauge"),
                ("topic_settings_drift", "gauge"),
                ("metadata_sync_age_seconds", "gauge"),
                ("flow_paused", "gauge"),
                ("heartbeats_sent", "counter"),
                ("heartbeat_failures", "counter"),
                ("heartbeat_age_seconds", "gauge"),
                ("policy_blocked_topics", "gauge"),
                ("task_restarts", "counter"),
                ("task_panics", "counter"),
                ("units_owned", "gauge"),
                ("units_unowned", "gauge"),
                ("raft_term", "gauge"),
                ("raft_leader", "gauge"),
                ("raft_leader_info", "gauge"),
                ("raft_commit_index", "gauge"),
                ("raft_applied_index", "gauge"),
                ("raft_snapshot_index", "gauge"),
                ("raft_purged_index", "gauge"),
                ("raft_snapshot_bytes", "gauge"),
                ("raft_snapshot_build_seconds", "gauge"),
                ("raft_snapshot_install_seconds", "gauge"),
                ("control_requests_sent", "counter"),
                ("lease_renewals", "counter"),
                ("fenced_commits", "counter"),
                ("writer_fences", "counter"),
                ("writer_fence_failures", "counter"),
                ("writer_fences_pending", "gauge"),
            ]
        );
        assert!(
            families
                .iter()
                .all(|(f, _)| f.starts_with("iggy_replicator_")),
            "{families:?}"
        );
        Ok(())
    }
}
