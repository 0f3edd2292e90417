//! Resolved inputs of the pipeline. The binary builds these from validated config; tests build them
//! directly. Nothing in here is read from files or the environment.
//!
//! Pure data and defaults, imported by nearly every module: it imports only `stats` (the
//! observer). The checks that compile the flows' selections, [`PipelineParams::validate`] and
//! the flows' residency, are in `pipeline.rs`, above the modules whose compilers they call.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use replicator_model::{
    IggyVersion, InitialOffset, Naming, NodeId, TopicSetting, DEFAULT_GROUP_SYNC_INTERVAL,
    DEFAULT_METADATA_SYNC_INTERVAL,
};

/// Everything `Pipeline::start` needs.
#[derive(Debug, Clone)]
pub struct PipelineParams {
    /// This instance's node id (`[node] id`), e.g. `1`. Used in the coordinator's name and in
    /// spans.
    pub node_id: NodeId,
    /// Iggy clusters by alias (`[clusters.<alias>]`), e.g. `{"us": ..., "eu": ...}`.
    pub clusters: BTreeMap<String, ClusterParams>,
    /// The flows to run (`[[flows]]`); each names a source and a target alias of `clusters`.
    pub flows: Vec<FlowParams>,
    /// Residency policies (`[[policies]]`): no flow writes a topic a policy selects to a target
    /// outside the policy's zones. Default: none.
    pub policies: Vec<PolicyParams>,
    /// How often each flow re-lists upstream streams and topics, e.g. 5 s (the default,
    /// [`replicator_model::DEFAULT_DISCOVERY_INTERVAL`]).
    pub discovery_interval: Duration,
    /// Backoff for restarting a failed reader/writer pair and for retrying failed Iggy calls.
    pub backoff: BackoffParams,
    /// How long one transient failure streak may be retried inside a reader or writer before the
    /// error is handed to the coordinator (which restarts the pair after a backoff), e.g. 30 s.
    pub retry_budget: Duration,
    /// Timeout of every single Iggy call (connect, poll, send, metadata), e.g. 10 s. A call that
    /// times out poisons its connection, which is then rebuilt.
    pub operation_timeout: Duration,
    /// A writer sends only while its lease is valid for at least this long, e.g. 500 ms. It must
    /// exceed the time one send can take, so that a send never lands after the lease ran out.
    /// The lease it checks is already shortened by the control plane's `lease_drift_margin`.
    pub send_lease_margin: Duration,
    /// How many downstream messages a starting writer scans back to find the last one it wrote,
    /// e.g. 10 000. Must exceed the number of foreign messages (other producers, reverse flows)
    /// appended to one downstream partition between a crash and the restart.
    pub tail_scan_window: u32,
    /// How long `shutdown` waits for in-flight writes, final commits and releases, e.g. 30 s.
    pub shutdown_timeout: Duration,
    /// Shortest time between two offset commits of one unit, e.g. 100 ms (the default). Under
    /// load a unit confirms its progress at most this often instead of after every batch, which
    /// keeps Raft writes per second bounded by units / interval, not by batches. Resume stays
    /// exact: a writer starts after the last message it finds downstream, not after the last
    /// confirmed offset. A unit that stops (drain, handover) commits at once.
    pub commit_interval: Duration,
    /// Receives poll/send timings, replication latencies and errors as they happen (the binary
    /// feeds Prometheus with them); default: ignores them.
    pub observer: crate::stats::Observer,
}

impl PipelineParams {
    /// Params with the documented defaults, the given node id, clusters and flows.
    pub fn new(
        node_id: NodeId,
        clusters: BTreeMap<String, ClusterParams>,
        flows: Vec<FlowParams>,
    ) -> Self {
        Self {
            node_id,
            clusters,
            flows,
            policies: Vec::new(),
            discovery_interval: replicator_model::DEFAULT_DISCOVERY_INTERVAL,
            backoff: BackoffParams::default(),
            retry_budget: Duration::from_secs(30),
            operation_timeout: Duration::from_secs(10),
            send_lease_margin: Duration::from_millis(500),
            tail_scan_window: 10_000,
            shutdown_timeout: Duration::from_secs(30),
            commit_interval: Duration::from_millis(100),
            observer: crate::stats::Observer::default(),
        }
    }

    /// The heartbeat topics of every flow, as `stream/topic`: discovery and verify of any flow
    /// leave them out unless an include names one literally (see `Selector::reserving`).
    pub fn heartbeat_topics(&self) -> Vec<String> {
        self.flows
            .iter()
            .map(|f| f.heartbeat_topic.clone())
            .collect()
    }
}

/// One Iggy cluster.
#[derive(Clone)]
pub struct ClusterParams {
    /// SDK connection string, e.g. `iggy://user:secret@10.0.0.1:8090` (TCP only). Never logged.
    pub connection_string: String,
    /// The protocol generation the cluster speaks (`clusters.<alias>.iggy_version`), e.g.
    /// `IggyVersion::V0_9`. Default: 0.8.
    pub iggy_version: IggyVersion,
    /// Connections this instance opens to the cluster, e.g. 1. Units are spread over them by
    /// partition; the SDK serialises requests per connection.
    pub connections: usize,
    /// Connections it opens instead while the cluster is far (`clusters.<alias>.far_connections`),
    /// e.g. 16: while the shortest of a window of calls takes 10 ms or more
    /// (`clients::distance`).
    pub far_connections: usize,
    /// As a target: writers log in as this node's writer identity, named with this prefix
    /// (`clusters.<alias>.fencing = "users"`, e.g. `iggy-replicator`), instead of with the
    /// connection string's credential; `None`: they use the connection string's credential
    /// (fencing off).
    pub writer_user_prefix: Option<String>,
    /// The zones the cluster is in (`clusters.<alias>.zones`), e.g. `["eu"]`: as a target it
    /// receives a topic a residency policy selects only when it shares a zone with the policy.
    /// Default: none (no policy allows it).
    pub zones: Vec<String>,
}

impl ClusterParams {
    /// One connection to the given connection string, fencing off.
    pub fn new(connection_string: impl Into<String>) -> Self {
        Self {
            connection_string: connection_string.into(),
            iggy_version: IggyVersion::default(),
            connections: 1,
            far_connections: 1,
            writer_user_prefix: None,
            zones: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ClusterParams {
    /// Prints the address only: the connection string may hold credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let address = self
            .connection_string
            .rsplit_once('@')
            .map_or("****", |(_, rest)| rest);
        f.debug_struct("ClusterParams")
            .field("address", &address)
            .field("iggy_version", &self.iggy_version)
            .field("connections", &self.connections)
            .field("far_connections", &self.far_connections)
            .field("zones", &self.zones)
            .finish()
    }
}

/// One flow: what to copy from where to where, and how.
#[derive(Debug, Clone)]
pub struct FlowParams {
    /// Flow name, unique in the cluster, e.g. `us-to-eu`. Part of every unit's identity.
    pub name: String,
    /// Source cluster alias (a key of `PipelineParams::clusters`), e.g. `us`.
    pub source: String,
    /// Target cluster alias, e.g. `eu`.
    pub target: String,
    /// Globs on `stream/topic` selecting what to copy, e.g. `["orders/*"]`. Empty selects nothing.
    pub include: Vec<String>,
    /// Globs on `stream/topic` removed from the selection, e.g. `["*/tmp-*"]`.
    pub exclude: Vec<String>,
    /// How downstream stream names are derived.
    pub naming: Naming,
    /// Where a unit without a confirmed offset starts.
    pub initial_offset: InitialOffset,
    /// Messages per poll and per send, e.g. 1000.
    pub batch_size: u32,
    /// How long a caught-up reader waits before polling again, e.g. 5 ms.
    pub poll_interval: Duration,
    /// Period of the per-topic watcher that idle readers wait for, e.g. 100 ms (see
    /// `activity`): a reader's pause doubles from `poll_interval` with every empty poll, and
    /// once it would reach this value the reader waits until its topic's metadata shows a new
    /// message (or a safety-net timer of 100 periods fires). Idle partitions then cost one
    /// metadata request per topic per period, while busy ones are polled every
    /// `poll_interval`. Set it to `poll_interval` to poll every partition at the same pace.
    pub idle_poll_interval: Duration,
    /// Whether writers add provenance headers (source alias, source offset, origin cluster).
    /// Turning it off also turns off tail-based exactly-once and loop prevention.
    pub provenance: bool,
    /// Batches in flight between one reader and its writer (`flows[].max_in_flight_batches`),
    /// e.g. 2: the capacity of the bounded channel between them; a full channel holds the
    /// reader (backpressure).
    pub max_in_flight_batches: usize,
    /// Message bytes a batch grown for a distant source or target may hold
    /// (`flows[].max_batch_bytes`), e.g. 4 MiB (the default,
    /// [`replicator_model::DEFAULT_MAX_BATCH_BYTES`]); see `datapath::batch_size`.
    pub max_batch_bytes: u64,
    /// Polls a caught-up partition keeps in flight while its source is far
    /// (`flows[].far_source_polls`), e.g. 1 (the default,
    /// [`replicator_model::DEFAULT_FAR_SOURCE_POLLS`]); see `datapath::reader`.
    pub far_source_polls: u32,
    /// Globs on consumer-group names whose upstream offsets are translated to the target
    /// (`flows[].consumer_groups`), e.g. `["billing", "analytics-*"]`; empty: no sync.
    pub consumer_groups: Vec<String>,
    /// Period of the consumer-group sync (`flows[].consumer_group_sync_interval`), e.g. 5 s.
    pub consumer_group_sync_interval: Duration,
    /// Globs on user names whose users are synced to the target (`flows[].users`), e.g.
    /// `["app-*"]`; empty: no user sync (see `metadata`).
    pub users: Vec<String>,
    /// Whether a synced user deleted upstream is deleted on the target while inactive there
    /// (`flows[].delete_users_removed_upstream`); otherwise it is only reported.
    pub delete_users_removed_upstream: bool,
    /// Topic settings the target keeps (`flows[].keep_target_settings`); the others follow
    /// upstream.
    pub keep_target_settings: BTreeSet<TopicSetting>,
    /// Period of the user and topic-settings sync (`flows[].metadata_sync_interval`), e.g.
    /// 30 s (the default, [`replicator_model::DEFAULT_METADATA_SYNC_INTERVAL`]).
    pub metadata_sync_interval: Duration,
    /// Messages per second the whole replicator cluster may copy for this flow
    /// (`flows[].max_messages_per_second`), split among instances by their share of the
    /// flow's partitions, e.g. `Some(50_000)`; `None`: unlimited.
    pub max_messages_per_second: Option<u64>,
    /// Message bytes (header, payload, headers) per second the whole cluster may copy for this
    /// flow (`flows[].max_bytes_per_second`), split the same way; `None`: unlimited.
    pub max_bytes_per_second: Option<u64>,
    /// How often each node that owns at least one unit of the flow writes a heartbeat record
    /// to `heartbeat_topic` on the target (`flows[].heartbeat_interval`), e.g. 1 s (the
    /// default, [`replicator_model::DEFAULT_HEARTBEAT_INTERVAL`]); zero: no heartbeats.
    pub heartbeat_interval: Duration,
    /// The `stream/topic` on the target heartbeats go to (`flows[].heartbeat_topic`), e.g.
    /// `replicator/heartbeats` (the default, [`replicator_model::DEFAULT_HEARTBEAT_TOPIC`]);
    /// no glob characters. Discovery of any flow skips it unless an include names it
    /// literally.
    pub heartbeat_topic: String,
}

impl FlowParams {
    /// A flow with the default batching, polling and provenance (the `DEFAULT_*` constants of
    /// `replicator_model`), identity naming, `earliest` start and the default heartbeats.
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        target: impl Into<String>,
        include: Vec<String>,
    ) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
            target: target.into(),
            include,
            exclude: Vec::new(),
            naming: Naming::Identity,
            initial_offset: InitialOffset::Earliest,
            batch_size: replicator_model::DEFAULT_BATCH_SIZE,
            poll_interval: replicator_model::DEFAULT_POLL_INTERVAL,
            idle_poll_interval: replicator_model::DEFAULT_IDLE_POLL_INTERVAL,
            provenance: replicator_model::DEFAULT_PROVENANCE,
            max_in_flight_batches: replicator_model::DEFAULT_MAX_IN_FLIGHT_BATCHES,
            max_batch_bytes: replicator_model::DEFAULT_MAX_BATCH_BYTES,
            far_source_polls: replicator_model::DEFAULT_FAR_SOURCE_POLLS,
            consumer_groups: Vec::new(),
            consumer_group_sync_interval: DEFAULT_GROUP_SYNC_INTERVAL,
            users: Vec::new(),
            delete_users_removed_upstream: false,
            keep_target_settings: BTreeSet::new(),
            metadata_sync_interval: DEFAULT_METADATA_SYNC_INTERVAL,
            max_messages_per_second: None,
            max_bytes_per_second: None,
            heartbeat_interval: replicator_model::DEFAULT_HEARTBEAT_INTERVAL,
            heartbeat_topic: replicator_model::DEFAULT_HEARTBEAT_TOPIC.to_owned(),
        }
    }

    /// The heartbeat topic as (stream, topic); `None` when it is not a valid `stream/topic`
    /// (`PipelineParams::validate` refuses that).
    pub fn heartbeat_address(&self) -> Option<(&str, &str)> {
        replicator_model::heartbeat_topic_parts(&self.heartbeat_topic).ok()
    }
}

/// One residency policy (`[[policies]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyParams {
    /// The policy's name, shown where it stops a topic, e.g. `pii-stays-in-eu`.
    pub name: String,
    /// Globs on upstream `stream/topic` (compiled like `FlowParams::include`) selecting the
    /// topics the policy keeps in its zones, e.g. `["pii-*/*"]`; a flow's heartbeat topic counts
    /// as a topic too.
    pub select: Vec<String>,
    /// The zones (`ClusterParams::zones`) the selected topics may be written to, e.g. `["eu"]`;
    /// a target in none of them never receives them.
    pub allowed_zones: Vec<String>,
}

/// Bounds of the exponential backoff with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffParams {
    /// First delay, e.g. 100 ms.
    pub initial: Duration,
    /// Cap of the delay, e.g. 10 s.
    pub max: Duration,
}

impl Default for BackoffParams {
    fn default() -> Self {
        Self {
            initial: replicator_model::DEFAULT_RESTART_BACKOFF_MIN,
            max: replicator_model::DEFAULT_RESTART_BACKOFF_MAX,
        }
    }
}
