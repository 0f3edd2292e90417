//! The TOML schema. Every struct rejects unknown keys; every field documents its
//! unit, default and an example, and those comments are the reference the README
//! copies.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use replicator_model::{
    heartbeat_topic_parts, zones_allow, IggyVersion, InitialOffset, Naming, NodeId, TopicSetting,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TOPIC,
};
use serde::{Deserialize, Serialize};

use crate::error::Problem;
use crate::secret::{ClusterUrl, Secret};
use crate::selection::{addresses, any_name, glob_matches, overlap, Found, Selection};

/// A whole node config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This instance: `[node]`.
    pub node: NodeConfig,
    /// The replicator cluster this instance belongs to: `[cluster]`.
    pub cluster: ClusterConfig,
    /// The Iggy clusters flows read from and write to, by alias: `[clusters.<alias>]`.
    #[serde(default)]
    pub clusters: BTreeMap<String, IggyClusterConfig>,
    /// What to replicate: `[[flows]]`.
    #[serde(default)]
    pub flows: Vec<FlowConfig>,
    /// Residency policies, which keep selected topics in some zones: `[[policies]]`.
    /// Default: none.
    #[serde(default)]
    pub policies: Vec<PolicyConfig>,
    /// Pipeline tuning shared by all flows: `[pipeline]`.
    #[serde(default)]
    pub pipeline: PipelineConfig,
}

/// `[node]`: the identity and addresses of this instance.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Node id, unique in the cluster and stable across restarts. Required. Example: `1`.
    pub id: NodeId,
    /// Directory of the Raft log and state (created if missing; must be this node's own).
    /// Required. Example: `"/var/lib/iggy-replicator"`.
    pub data_dir: PathBuf,
    /// `host:port` the Raft RPC server binds and that peers dial. Required. Example: `"10.0.0.1:7100"`.
    pub raft_addr: String,
    /// `host:port` of the admin HTTP API (health, status, metrics). Required. Example: `"0.0.0.0:7180"`.
    pub api_addr: String,
    /// Address other nodes and tools use to reach the admin API, when `api_addr` is a
    /// wildcard. Default: `api_addr`. Example: `"10.0.0.1:7180"`.
    #[serde(default)]
    pub advertised_api_addr: Option<String>,
    /// HTTPS for the admin API (`[node.api_tls]`). Default: none: plain HTTP, and `run` warns
    /// about it at start.
    #[serde(default)]
    pub api_tls: Option<ApiTlsConfig>,
}

/// `[node.api_tls]`: the admin API's certificate, and optionally the CA of client
/// certificates it requires. PEM files, re-read when they change on disk.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiTlsConfig {
    /// The admin API's certificate chain. Required. Example: `"/etc/iggy-replicator/tls/api.crt"`.
    pub cert_file: PathBuf,
    /// Its private key. Required. Example: `"/etc/iggy-replicator/tls/api.key"`.
    pub key_file: PathBuf,
    /// When set, every client (Prometheus, the CLI) must present a certificate signed by this
    /// CA. Default: none (any client; mutating calls still need the bearer token).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// `[cluster]`: the replicator cluster (the Raft group).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Shared secret that signs every Raft RPC (it never travels). Required, at least 16
    /// characters. Example: `"${REPLICATOR_SECRET}"`.
    pub secret: Secret,
    /// Bearer token of mutating admin API calls (`cluster add/remove`); must differ from the
    /// secret. Default: none: mutating calls are refused.
    #[serde(default)]
    pub admin_token: Option<Secret>,
    /// Members that bootstrap the cluster, node id → Raft `host:port`. Default: this node alone.
    /// Example: `{ 1 = "10.0.0.1:7100", 2 = "10.0.0.2:7100", 3 = "10.0.0.3:7100" }`.
    #[serde(default)]
    pub initial_members: BTreeMap<String, String>,
    /// The round trip between members, for a cluster with a node per region: the lease,
    /// renewal, election and heartbeat defaults are stretched to it
    /// (`ControlTiming::for_member_round_trip`, README "Across regions"); the four settings
    /// below still override what they name. Default: none (one site). Example: `"80ms"`.
    #[serde(default, with = "humantime_serde")]
    pub member_round_trip: Option<Duration>,
    /// How long a member may go without renewing its lease before its partitions move.
    /// Default: the control plane's (`ControlTiming::default()`, listed in the README). Example: `"1500ms"`.
    #[serde(default, with = "humantime_serde")]
    pub lease_expiry: Option<Duration>,
    /// How often a member renews its lease. Default: the control plane's. Example: `"300ms"`.
    #[serde(default, with = "humantime_serde")]
    pub lease_renew_interval: Option<Duration>,
    /// Raft heartbeat interval. Default: the control plane's. Example: `"100ms"`.
    #[serde(default, with = "humantime_serde")]
    pub heartbeat_interval: Option<Duration>,
    /// Raft election timeout (lower bound; the upper bound is twice this).
    /// Default: the control plane's. Example: `"400ms"`.
    #[serde(default, with = "humantime_serde")]
    pub election_timeout: Option<Duration>,
    /// How long a partition no longer discovered (its topic deleted, its flow removed from
    /// every member's config) keeps its confirmed offset in the control plane before it is
    /// forgotten. Default: the control plane's. Example: `"10m"`.
    #[serde(default, with = "humantime_serde")]
    pub forget_retired_after: Option<Duration>,
    /// Mutual TLS between members (`[cluster.tls]`). Default: none: Raft RPCs are plain HTTP
    /// (signed, but readable on the wire), and `run` warns about it at start.
    #[serde(default)]
    pub tls: Option<TlsFilesConfig>,
}

/// `[cluster.tls]` (and `[node.api_tls]`): PEM files, re-read when they change on disk.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsFilesConfig {
    /// This node's certificate chain; its subject alternative names must cover the host
    /// peers dial. Required. Example: `"/etc/iggy-replicator/tls/node.crt"`.
    pub cert_file: PathBuf,
    /// The certificate's private key. Required. Example: `"/etc/iggy-replicator/tls/node.key"`.
    pub key_file: PathBuf,
    /// The CA that signs every member's certificate; peers must present a certificate it
    /// signed. Required. Example: `"/etc/iggy-replicator/tls/ca.crt"`.
    pub ca_file: PathBuf,
}

/// Reports each given file that cannot be read, as `<section>.<field>`.
fn check_readable(problems: &mut Vec<Problem>, section: &str, files: &[(&str, Option<&PathBuf>)]) {
    for (field, path) in files {
        if let Some(path) = path {
            if let Err(e) = std::fs::File::open(path) {
                problems.push(Problem::new(
                    format!("{section}.{field}"),
                    format!("cannot read {}: {e}", path.display()),
                ));
            }
        }
    }
}

/// `[clusters.<alias>]`: one Iggy cluster.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IggyClusterConfig {
    /// Iggy TCP connection string with credentials, as the SDK takes it.
    /// Required. Example: `"iggy://replicator:${IGGY_PASSWORD}@10.1.0.1:8090?nodelay=true"`.
    // Not serialized: the digest adds it in clear, nothing else serializes the section.
    #[serde(skip_serializing)]
    pub url: ClusterUrl,
    /// TCP connections this instance opens to the cluster; partitions are spread over them
    /// (the SDK runs one request at a time per connection, so more connections let polls and
    /// sends of different partitions overlap). Default: `4`; 1 to 64.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// The connections this instance opens to the cluster instead while the cluster is far:
    /// while the shortest of a window of its calls takes 10 ms or more (README "Across
    /// regions"). Default: `16`; 1 to 64.
    #[serde(default = "default_far_connections")]
    pub far_connections: usize,
    /// The Iggy protocol generation the cluster's servers speak: `"0.8"` (Iggy server 0.8) or
    /// `"0.9"` (Iggy server 0.9, "server-ng"). The two are not wire-compatible; at start every
    /// cluster is probed and one that answers in the other generation is refused with an error
    /// naming this key. Default: `"0.8"`.
    #[serde(default)]
    pub iggy_version: IggyVersion,
    /// How stale writers are kept from appending to this cluster when it is a flow's target:
    /// `"users"` (every instance writes as an Iggy user of its own, whose rights the leader
    /// revokes before it moves a failed instance's partitions; the credential in `url` then
    /// needs the global `manage_users` permission) or `"off"` (leases only: an instance frozen
    /// in the middle of a send can append once more after its partitions moved, see README
    /// "Guarantees"). Default: `"users"`.
    #[serde(default)]
    pub fencing: FencingMode,
    /// Name prefix of the writer users fencing creates: `<prefix>-n<node>-i<incarnation>`.
    /// Replicator clusters that write to the same Iggy cluster need different prefixes.
    /// Default: `"iggy-replicator"`; 1 to 24 of `A-Z a-z 0-9 _ -`.
    #[serde(default = "default_writer_user_prefix")]
    pub writer_user_prefix: String,
    /// The zones this cluster is in, for residency policies (`[[policies]]`): a flow copies a
    /// topic a policy selects to this cluster only when one of these zones is among the
    /// policy's `allowed_zones`. Default: `[]` (no zone: no policy allows it). Example:
    /// `["eu", "eu-west-1"]`.
    #[serde(default)]
    pub zones: Vec<String>,
}

/// `clusters.<alias>.fencing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FencingMode {
    /// Writer users, revoked before a failed instance's partitions move.
    #[default]
    Users,
    /// Leases only.
    Off,
}

/// `[[flows]]`: one direction of replication between two aliases.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FlowConfig {
    /// Unique flow name; part of every work unit's identity. Required. Example: `"us-to-eu"`.
    pub name: String,
    /// Alias (key of `[clusters]`) to read from. Required. Example: `"us"`.
    pub source: String,
    /// Alias to write to; must differ from `source`. Required. Example: `"eu"`.
    pub target: String,
    /// Glob patterns on `stream/topic` selecting what to copy. Default: `["*/*"]`.
    /// Example: `["orders/*", "billing/invoices"]`.
    #[serde(default = "default_include")]
    pub include: Vec<String>,
    /// Glob patterns on `stream/topic` excluded even if included. Default: `[]`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Downstream stream naming: `"identity"` or `"prefix"` (`<source>.<stream>`). Default: `"identity"`.
    #[serde(default)]
    pub naming: Naming,
    /// Where a partition without a confirmed offset starts: `"earliest"`, `"latest"` or an
    /// offset number. Default: `"earliest"`.
    #[serde(default)]
    pub initial_offset: InitialOffsetSetting,
    /// Messages per poll and per send. Default: [`replicator_model::DEFAULT_BATCH_SIZE`]
    /// (`1000`); 1 to 100000.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Pause between polls of a caught-up partition. Default:
    /// [`replicator_model::DEFAULT_POLL_INTERVAL`] (`"5ms"`); at most 10 s.
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// How quickly a partition that went idle notices new messages. The pause after an empty
    /// poll doubles from `poll_interval`; once it would reach this value the partition stops
    /// polling and waits for its stream's watcher, which lists the stream (one request per
    /// stream) every `idle_poll_interval`, reads the partitions of the topics whose totals
    /// moved, and wakes exactly the partitions that grew. Default:
    /// [`replicator_model::DEFAULT_IDLE_POLL_INTERVAL`] (`"100ms"`); at most 10 s. Set
    /// it to `poll_interval` (or less) to poll every partition at one pace instead.
    #[serde(default = "default_idle_poll_interval", with = "humantime_serde")]
    pub idle_poll_interval: Duration,
    /// Add provenance headers (source alias, source offset, origin) to copied messages; they
    /// make resume exact and prevent loops in two-way setups. Default:
    /// [`replicator_model::DEFAULT_PROVENANCE`] (`true`).
    #[serde(default = "default_provenance")]
    pub provenance: bool,
    /// Batches that may wait between a partition's reader and writer. Default:
    /// [`replicator_model::DEFAULT_MAX_IN_FLIGHT_BATCHES`] (`2`); 1 to 64.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_batches: usize,
    /// Message bytes a batch grown for a distant source or target may hold: while a partition
    /// is behind and its source or target is far (`far_connections`), its batches grow to this
    /// after a full poll (README "Across regions"); never below `batch_size` messages. Default:
    /// [`replicator_model::DEFAULT_MAX_BATCH_BYTES`] (4 MiB); 64 KiB to 256 MiB.
    #[serde(default = "default_max_batch_bytes")]
    pub max_batch_bytes: u64,
    /// Polls a caught-up partition keeps in flight, spread over a round trip, while its source
    /// is far (`far_connections`): more cut the wait for the next poll to reach the source
    /// (latency), at the price of polling each message more than once (README "Across
    /// regions"). Default: [`replicator_model::DEFAULT_FAR_SOURCE_POLLS`] (1); 1 to
    /// [`replicator_model::MAX_FAR_SOURCE_POLLS`].
    #[serde(default = "default_far_source_polls")]
    pub far_source_polls: u32,
    /// Glob patterns on consumer-group names whose offsets are translated to the target
    /// (README "Disaster recovery"); needs `provenance`. Default: `[]` (none). Example:
    /// `["billing", "analytics-*"]`.
    #[serde(default)]
    pub consumer_groups: Vec<String>,
    /// How often the consumer groups' offsets are synced. Default:
    /// [`replicator_model::DEFAULT_GROUP_SYNC_INTERVAL`] (`"5s"`); 100 ms to 1 h.
    #[serde(default = "default_group_sync_interval", with = "humantime_serde")]
    pub consumer_group_sync_interval: Duration,
    /// Glob patterns on user names whose users are synced to the target: created there
    /// inactive, with their permissions translated to the target's streams and topics, kept in
    /// sync, and activated by `flow promote --activate-users` (README "Disaster recovery").
    /// Default: `[]` (none). Example: `["app-*", "billing"]`.
    #[serde(default)]
    pub users: Vec<String>,
    /// Whether a synced user deleted upstream is deleted on the target too (only while it is
    /// inactive there); otherwise it is reported. Default: `false`.
    #[serde(default)]
    pub delete_users_removed_upstream: bool,
    /// Topic settings the target keeps as they are there instead of following upstream:
    /// any of `"message_expiry"`, `"max_topic_size"`, `"compression"`. Default: `[]` (all
    /// follow upstream). Example: `["message_expiry"]`.
    #[serde(default)]
    pub keep_target_settings: Vec<TopicSetting>,
    /// How often users and topic settings are synced. Default:
    /// [`replicator_model::DEFAULT_METADATA_SYNC_INTERVAL`] (`"30s"`); 100 ms to 1 day.
    #[serde(default = "default_metadata_sync_interval", with = "humantime_serde")]
    pub metadata_sync_interval: Duration,
    /// Messages per second the whole replicator cluster may copy for this flow, split among the
    /// instances by their share of the flow's partitions (README "Runtime control"). Default:
    /// unlimited. Example: `50000`.
    #[serde(default)]
    pub max_messages_per_second: Option<u64>,
    /// Message bytes per second (header, payload, user headers) the whole cluster may copy for
    /// this flow, split the same way. Default: unlimited. Example: `10485760` (10 MiB/s).
    #[serde(default)]
    pub max_bytes_per_second: Option<u64>,
    /// How often every instance that owns at least one unit of this flow writes a heartbeat
    /// record to `heartbeat_topic` on the target, so that consumers there can tell an idle
    /// flow from a dead one. Default: [`DEFAULT_HEARTBEAT_INTERVAL`] (`"1s"`); `"0s"` turns
    /// heartbeats off. Example: `"5s"`.
    #[serde(default = "default_heartbeat_interval", with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// The `stream/topic` on the target that heartbeats go to, created there (1 partition) when
    /// missing. No flow replicates a heartbeat topic unless an `include` pattern names it
    /// literally. Default: [`DEFAULT_HEARTBEAT_TOPIC`] (`"replicator/heartbeats"`); no glob
    /// characters. Example: `"ops/replicator-heartbeats"`.
    #[serde(default = "default_heartbeat_topic")]
    pub heartbeat_topic: String,
}

/// `[[policies]]`: a residency policy. Topics it selects are never copied to a target cluster
/// outside its allowed zones (README "Residency policies").
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Unique policy name, shown where the policy stops a topic. Required. Example:
    /// `"pii-stays-in-eu"`.
    pub name: String,
    /// Glob patterns on upstream `stream/topic` (as in `flows[].include`) selecting the topics
    /// the policy keeps in its zones; a flow's heartbeat topic counts as a topic too. Required,
    /// not empty. Example: `["pii-*/*"]`.
    pub select: Vec<String>,
    /// The zones (`clusters.<alias>.zones`) the selected topics may be copied to; a target
    /// cluster in none of them (or in no zone at all) never receives them. Required, not empty.
    /// Example: `["eu"]`.
    pub allowed_zones: Vec<String>,
}

/// `initial_offset`: a word or a number in TOML.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum InitialOffsetSetting {
    /// `"earliest"` or `"latest"`.
    Word(String),
    /// A fixed upstream offset.
    Number(u64),
}

impl Default for InitialOffsetSetting {
    fn default() -> Self {
        InitialOffsetSetting::Word("earliest".to_owned())
    }
}

impl InitialOffsetSetting {
    /// The resolved policy, or `None` for an unknown word.
    pub fn resolve(&self) -> Option<InitialOffset> {
        match self {
            InitialOffsetSetting::Word(word) if word == "earliest" => Some(InitialOffset::Earliest),
            InitialOffsetSetting::Word(word) if word == "latest" => Some(InitialOffset::Latest),
            InitialOffsetSetting::Word(_) => None,
            InitialOffsetSetting::Number(offset) => Some(InitialOffset::At(*offset)),
        }
    }
}

/// `[pipeline]`: tuning shared by all flows.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// How often upstream is listed for new topics and partitions. Default:
    /// [`replicator_model::DEFAULT_DISCOVERY_INTERVAL`] (`"5s"`).
    #[serde(default = "default_discovery_interval", with = "humantime_serde")]
    pub discovery_interval: Duration,
    /// First delay before restarting a failed reader or writer. Default:
    /// [`replicator_model::DEFAULT_RESTART_BACKOFF_MIN`] (`"100ms"`).
    #[serde(default = "default_restart_backoff_min", with = "humantime_serde")]
    pub restart_backoff_min: Duration,
    /// Longest delay between restarts of a failing reader or writer. Default:
    /// [`replicator_model::DEFAULT_RESTART_BACKOFF_MAX`] (`"10s"`).
    #[serde(default = "default_restart_backoff_max", with = "humantime_serde")]
    pub restart_backoff_max: Duration,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            discovery_interval: default_discovery_interval(),
            restart_backoff_min: default_restart_backoff_min(),
            restart_backoff_max: default_restart_backoff_max(),
        }
    }
}

fn default_include() -> Vec<String> {
    vec!["*/*".to_owned()]
}
/// Connections per Iggy cluster and instance when `connections` is not set.
pub const DEFAULT_CONNECTIONS: usize = 4;

/// Connections per far Iggy cluster and instance when `far_connections` is not set.
pub const DEFAULT_FAR_CONNECTIONS: usize = 16;

/// The `batch_size` a flow may have.
pub const BATCH_SIZE_LIMITS: std::ops::RangeInclusive<u32> = 1..=replicator_model::MAX_BATCH_SIZE;

/// The `max_batch_bytes` a flow may have: 64 KiB to 256 MiB.
pub const MAX_BATCH_BYTES_LIMITS: std::ops::RangeInclusive<u64> = (64 << 10)..=(256 << 20);

fn default_connections() -> usize {
    DEFAULT_CONNECTIONS
}
fn default_far_connections() -> usize {
    DEFAULT_FAR_CONNECTIONS
}
fn default_writer_user_prefix() -> String {
    "iggy-replicator".to_owned()
}
fn default_batch_size() -> u32 {
    replicator_model::DEFAULT_BATCH_SIZE
}
fn default_idle_poll_interval() -> Duration {
    replicator_model::DEFAULT_IDLE_POLL_INTERVAL
}
fn default_poll_interval() -> Duration {
    replicator_model::DEFAULT_POLL_INTERVAL
}
fn default_provenance() -> bool {
    replicator_model::DEFAULT_PROVENANCE
}
fn default_in_flight() -> usize {
    replicator_model::DEFAULT_MAX_IN_FLIGHT_BATCHES
}
fn default_max_batch_bytes() -> u64 {
    replicator_model::DEFAULT_MAX_BATCH_BYTES
}
fn default_far_source_polls() -> u32 {
    replicator_model::DEFAULT_FAR_SOURCE_POLLS
}
fn default_group_sync_interval() -> Duration {
    replicator_model::DEFAULT_GROUP_SYNC_INTERVAL
}
fn default_metadata_sync_interval() -> Duration {
    replicator_model::DEFAULT_METADATA_SYNC_INTERVAL
}
fn default_heartbeat_interval() -> Duration {
    DEFAULT_HEARTBEAT_INTERVAL
}
fn default_heartbeat_topic() -> String {
    DEFAULT_HEARTBEAT_TOPIC.to_owned()
}
fn default_discovery_interval() -> Duration {
    replicator_model::DEFAULT_DISCOVERY_INTERVAL
}
fn default_restart_backoff_min() -> Duration {
    replicator_model::DEFAULT_RESTART_BACKOFF_MIN
}
fn default_restart_backoff_max() -> Duration {
    replicator_model::DEFAULT_RESTART_BACKOFF_MAX
}

impl Config {
    /// Checks every value and returns every problem found (empty when the config is valid).
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        check_host_port(&mut problems, "node.raft_addr", &self.node.raft_addr);
        check_host_port(&mut problems, "node.api_addr", &self.node.api_addr);
        if let Some(addr) = &self.node.advertised_api_addr {
            check_host_port(&mut problems, "node.advertised_api_addr", addr);
        }
        if self.node.data_dir.as_os_str().is_empty() {
            problems.push(Problem::new("node.data_dir", "must not be empty"));
        }
        if let Some(tls) = &self.node.api_tls {
            let files = [
                ("cert_file", Some(&tls.cert_file)),
                ("key_file", Some(&tls.key_file)),
                ("client_ca_file", tls.client_ca_file.as_ref()),
            ];
            check_readable(&mut problems, "node.api_tls", &files);
        }
        self.cluster.check(&mut problems);
        for (id, addr) in &self.cluster.initial_members {
            let key = format!("cluster.initial_members.{id}");
            if id.parse::<NodeId>().is_err() {
                problems.push(Problem::new(&key, "member key must be a node id number"));
            }
            check_host_port(&mut problems, &key, addr);
        }
        if self.clusters.is_empty() && !self.flows.is_empty() {
            problems.push(Problem::new("clusters", "flows need at least one cluster"));
        }
        for (alias, cluster) in &self.clusters {
            let key = format!("clusters.{alias}.url");
            if let Err(message) = check_url(cluster.url.expose()) {
                problems.push(Problem::new(key, message));
            }
            let prefix = &cluster.writer_user_prefix;
            if prefix.is_empty()
                || prefix.len() > 24
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                problems.push(Problem::new(
                    format!("clusters.{alias}.writer_user_prefix"),
                    format!("must be 1 to 24 of A-Z a-z 0-9 _ -, got {prefix:?}"),
                ));
            }
            for (key, connections) in [
                ("connections", cluster.connections),
                ("far_connections", cluster.far_connections),
            ] {
                if !(1..=64).contains(&connections) {
                    problems.push(Problem::new(
                        format!("clusters.{alias}.{key}"),
                        format!("must be 1 to 64, got {connections}"),
                    ));
                }
            }
            check_zones(
                &mut problems,
                &format!("clusters.{alias}.zones"),
                &cluster.zones,
            );
        }
        let mut policies = std::collections::BTreeSet::new();
        for (index, policy) in self.policies.iter().enumerate() {
            policy.check(&mut problems, &format!("policies[{index}]"));
            if !policies.insert(policy.name.as_str()) {
                problems.push(Problem::new(
                    format!("policies[{index}].name"),
                    format!("duplicate policy name {:?}", policy.name),
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (index, flow) in self.flows.iter().enumerate() {
            flow.check(&mut problems, &format!("flows[{index}]"), &self.clusters);
            if !names.insert(flow.name.as_str()) {
                problems.push(Problem::new(
                    format!("flows[{index}].name"),
                    format!("duplicate flow name {:?}", flow.name),
                ));
            }
        }
        self.check_overlapping_flows(&mut problems);
        self.check_residency(&mut problems);
        problems
    }

    /// The policies that forbid writing their selected topics to the cluster `target` (whose
    /// zones share none with their `allowed_zones`), with their index; none for an unknown
    /// alias (reported on its own key).
    fn policies_forbidding(&self, target: &str) -> Vec<(usize, &PolicyConfig)> {
        let Some(cluster) = self.clusters.get(target) else {
            return Vec::new();
        };
        self.policies
            .iter()
            .enumerate()
            .filter(|(_, p)| !zones_allow(&p.allowed_zones, &cluster.zones))
            .collect()
    }

    /// A flow whose target the residency policies forbid every topic it selects could copy
    /// nothing: a problem of its `include`, naming the policies. Decided exactly on the
    /// automata (`any_name` over the include minus the excludes and the forbidding policies'
    /// selections). A search too large to finish is no problem: discovery still leaves out
    /// every forbidden topic, this check only catches a flow that is useless from the start.
    ///
    /// A flow whose heartbeats go to a topic a policy forbids on its target is a problem of its
    /// `heartbeat_topic` rather than a silent loss of heartbeats: consumers and alerts on the
    /// target read a missing heartbeat as a dead flow, and the fix is a choice only the operator
    /// can make (another `heartbeat_topic`, or `heartbeat_interval = "0s"`).
    fn check_residency(&self, problems: &mut Vec<Problem>) {
        for (index, flow) in self.flows.iter().enumerate() {
            let forbidding = self.policies_forbidding(&flow.target);
            if forbidding.is_empty() {
                continue;
            }
            let zones = self
                .clusters
                .get(&flow.target)
                .map(|c| c.zones.as_slice())
                .unwrap_or_default();
            let target = if zones.is_empty() {
                format!("{:?} (in no zone)", flow.target)
            } else {
                format!("{:?} (zones {zones:?})", flow.target)
            };
            let name = |(i, p): &(usize, &PolicyConfig)| {
                format!(
                    "{:?} (policies[{i}], allowed zones {:?})",
                    p.name, p.allowed_zones
                )
            };
            let selected = Selection {
                prefix: "",
                include: &flow.include,
                exclude: &flow.exclude,
            };
            let mut exclude = flow.exclude.clone();
            exclude.extend(
                forbidding
                    .iter()
                    .flat_map(|(_, p)| p.select.iter().cloned()),
            );
            let allowed = Selection {
                exclude: &exclude,
                ..selected
            };
            // Only a flow that selects something on its own is the policies' doing.
            if matches!(any_name(&selected), Found::Name(_)) && any_name(&allowed) == Found::Nothing
            {
                // Name the policies that take a part of the flow's selection.
                let involved: Vec<String> = forbidding
                    .iter()
                    .filter(|(_, p)| {
                        let policy = Selection {
                            prefix: "",
                            include: &p.select,
                            exclude: &[],
                        };
                        overlap(&selected, &policy) != Found::Nothing
                    })
                    .map(name)
                    .collect();
                problems.push(Problem::new(
                    format!("flows[{index}].include"),
                    format!(
                        "flow {:?} (flows[{index}]) can copy nothing to {target}: every topic its \
                         include (minus exclude) selects is forbidden there by {}; narrow the \
                         flow to topics allowed there, or fix the policies' allowed_zones or \
                         clusters.{}.zones",
                        flow.name,
                        policy_list(&involved),
                        flow.target,
                    ),
                ));
            }
            if flow.heartbeat_interval.is_zero() {
                continue;
            }
            let blocking: Vec<String> = forbidding
                .iter()
                .filter(|(_, p)| glob_matches(&p.select, &flow.heartbeat_topic) == Some(true))
                .map(name)
                .collect();
            if !blocking.is_empty() {
                problems.push(Problem::new(
                    format!("flows[{index}].heartbeat_topic"),
                    format!(
                        "flow {:?} (flows[{index}]) writes heartbeats to {:?} on {target}, which \
                         {} forbids there; set another heartbeat_topic, or heartbeat_interval = \
                         \"0s\" to write none",
                        flow.name,
                        flow.heartbeat_topic,
                        policy_list(&blocking),
                    ),
                ));
            }
        }
    }

    /// Two flows between the same clusters that can write the same downstream topic corrupt
    /// each other's resume (provenance names the source cluster and the upstream topic, not
    /// the flow): each such pair is a problem of the later flow's `include`, naming both. An
    /// overlap is decided on the downstream names the flows' globs and naming can produce
    /// (see `overlap`); when that cannot be decided, the flows count as overlapping.
    fn check_overlapping_flows(&self, problems: &mut Vec<Problem>) {
        // Clusters count as the same when their aliases are equal or their addresses meet.
        let same_cluster = |a: &str, b: &str| {
            a == b
                || match (self.clusters.get(a), self.clusters.get(b)) {
                    (Some(a), Some(b)) => {
                        let a = addresses(a.url.expose());
                        addresses(b.url.expose())
                            .iter()
                            .any(|address| a.contains(address))
                    }
                    _ => false,
                }
        };
        let prefixes: Vec<String> = self
            .flows
            .iter()
            .map(|f| match f.naming {
                Naming::Identity => String::new(),
                Naming::Prefix => format!("{}.", f.source),
            })
            .collect();
        for (i, a) in self.flows.iter().enumerate() {
            for (j, b) in self.flows.iter().enumerate().skip(i + 1) {
                if !same_cluster(&a.source, &b.source) || !same_cluster(&a.target, &b.target) {
                    continue;
                }
                let selection = |index: usize| Selection {
                    prefix: &prefixes[index],
                    include: &self.flows[index].include,
                    exclude: &self.flows[index].exclude,
                };
                let what = match overlap(&selection(i), &selection(j)) {
                    Found::Nothing | Found::Invalid => continue,
                    Found::Name(name) => {
                        format!("can write the same downstream topics, e.g. {name:?}")
                    }
                    Found::Undecided => "may write the same downstream topics (their \
                                           selections could not be proven disjoint)"
                        .to_owned(),
                };
                problems.push(Problem::new(
                    format!("flows[{j}].include"),
                    format!(
                        "flow {:?} (flows[{j}]) and flow {:?} (flows[{i}]) both copy from {:?} \
                         to {:?} and {what}: each would take the other's copies for its own \
                         when it resumes (provenance does not name the flow); make their \
                         selections disjoint with `exclude`, or merge them into one flow",
                        b.name, a.name, b.source, b.target
                    ),
                ));
            }
        }
    }

    /// The initial members with parsed ids; when none are configured, this node alone.
    /// Keys that are not numbers are skipped (`problems` reports them).
    pub fn initial_members(&self) -> BTreeMap<NodeId, String> {
        let members: BTreeMap<NodeId, String> = self
            .cluster
            .initial_members
            .iter()
            .filter_map(|(id, addr)| Some((id.parse().ok()?, addr.clone())))
            .collect();
        if members.is_empty() {
            BTreeMap::from([(self.node.id, self.node.raft_addr.clone())])
        } else {
            members
        }
    }

    /// The address peers and tools use for this node's admin API.
    pub fn advertised_api_addr(&self) -> &str {
        self.node
            .advertised_api_addr
            .as_deref()
            .unwrap_or(&self.node.api_addr)
    }
}

impl ClusterConfig {
    fn check(&self, problems: &mut Vec<Problem>) {
        if self.secret.expose().chars().count() < 16 {
            problems.push(Problem::new(
                "cluster.secret",
                "must be at least 16 characters",
            ));
        }
        if let Some(token) = &self.admin_token {
            if token.expose().chars().count() < 16 {
                problems.push(Problem::new(
                    "cluster.admin_token",
                    "must be at least 16 characters",
                ));
            }
            if token.expose() == self.secret.expose() {
                problems.push(Problem::new(
                    "cluster.admin_token",
                    "must differ from cluster.secret (the secret signs Raft RPCs only)",
                ));
            }
        }
        if let Some(tls) = &self.tls {
            let files = [
                ("cert_file", Some(&tls.cert_file)),
                ("key_file", Some(&tls.key_file)),
                ("ca_file", Some(&tls.ca_file)),
            ];
            check_readable(problems, "cluster.tls", &files);
        }
        let positive = [
            ("cluster.lease_expiry", self.lease_expiry),
            ("cluster.lease_renew_interval", self.lease_renew_interval),
            ("cluster.heartbeat_interval", self.heartbeat_interval),
            ("cluster.election_timeout", self.election_timeout),
        ];
        for (key, value) in positive {
            if value == Some(Duration::ZERO) {
                problems.push(Problem::new(key, "must be greater than zero"));
            }
        }
        if self
            .member_round_trip
            .is_some_and(|rtt| rtt > Duration::from_secs(1))
        {
            problems.push(Problem::new(
                "cluster.member_round_trip",
                "must be at most 1s (the round trip between the farthest two members)",
            ));
        }
        if let (Some(expiry), Some(renew)) = (self.lease_expiry, self.lease_renew_interval) {
            if renew * 3 > expiry {
                problems.push(Problem::new(
                    "cluster.lease_renew_interval",
                    "must be at most a third of cluster.lease_expiry",
                ));
            }
        }
        if let (Some(heartbeat), Some(election)) = (self.heartbeat_interval, self.election_timeout)
        {
            if heartbeat * 2 > election {
                problems.push(Problem::new(
                    "cluster.heartbeat_interval",
                    "must be at most half of cluster.election_timeout",
                ));
            }
        }
    }
}

impl FlowConfig {
    fn check(
        &self,
        problems: &mut Vec<Problem>,
        key: &str,
        clusters: &BTreeMap<String, IggyClusterConfig>,
    ) {
        if self.name.trim().is_empty() {
            problems.push(Problem::new(format!("{key}.name"), "must not be empty"));
        }
        for (field, alias) in [("source", &self.source), ("target", &self.target)] {
            if !clusters.contains_key(alias) {
                problems.push(Problem::new(
                    format!("{key}.{field}"),
                    format!("unknown cluster alias {alias:?} (no [clusters.{alias}] section)"),
                ));
            }
        }
        if self.source == self.target {
            problems.push(Problem::new(
                format!("{key}.target"),
                "must differ from source",
            ));
        }
        if self.include.is_empty() {
            problems.push(Problem::new(format!("{key}.include"), "must not be empty"));
        }
        check_topic_globs(problems, &format!("{key}.include"), &self.include);
        check_topic_globs(problems, &format!("{key}.exclude"), &self.exclude);
        if self.initial_offset.resolve().is_none() {
            problems.push(Problem::new(
                format!("{key}.initial_offset"),
                "must be \"earliest\", \"latest\" or an offset number",
            ));
        }
        if !BATCH_SIZE_LIMITS.contains(&self.batch_size) {
            problems.push(Problem::new(
                format!("{key}.batch_size"),
                format!(
                    "must be between {} and {}",
                    BATCH_SIZE_LIMITS.start(),
                    BATCH_SIZE_LIMITS.end()
                ),
            ));
        }
        if self.poll_interval.is_zero() || self.poll_interval > Duration::from_secs(10) {
            problems.push(Problem::new(
                format!("{key}.poll_interval"),
                "must be greater than zero and at most 10s",
            ));
        }
        if self.idle_poll_interval > Duration::from_secs(10) {
            problems.push(Problem::new(
                format!("{key}.idle_poll_interval"),
                "must be at most 10s",
            ));
        }
        if !(1..=64).contains(&self.max_in_flight_batches) {
            problems.push(Problem::new(
                format!("{key}.max_in_flight_batches"),
                "must be between 1 and 64",
            ));
        }
        if !MAX_BATCH_BYTES_LIMITS.contains(&self.max_batch_bytes) {
            problems.push(Problem::new(
                format!("{key}.max_batch_bytes"),
                format!(
                    "must be between {} and {}",
                    MAX_BATCH_BYTES_LIMITS.start(),
                    MAX_BATCH_BYTES_LIMITS.end()
                ),
            ));
        }
        if !(1..=replicator_model::MAX_FAR_SOURCE_POLLS).contains(&self.far_source_polls) {
            problems.push(Problem::new(
                format!("{key}.far_source_polls"),
                format!(
                    "must be between 1 and {}",
                    replicator_model::MAX_FAR_SOURCE_POLLS
                ),
            ));
        }
        for (index, pattern) in self.consumer_groups.iter().enumerate() {
            if let Err(e) = globset::Glob::new(pattern) {
                problems.push(Problem::new(
                    format!("{key}.consumer_groups[{index}]"),
                    format!("invalid pattern {pattern:?}: {}", e.kind()),
                ));
            }
        }
        for (field, limit) in [
            ("max_messages_per_second", self.max_messages_per_second),
            ("max_bytes_per_second", self.max_bytes_per_second),
        ] {
            if limit == Some(0) {
                problems.push(Problem::new(
                    format!("{key}.{field}"),
                    "must be at least 1 (leave it out for no limit; `flow pause` stops a flow)",
                ));
            }
        }
        if !self.consumer_groups.is_empty() && !self.provenance {
            problems.push(Problem::new(
                format!("{key}.consumer_groups"),
                "needs provenance = true (offsets are translated with the provenance headers)",
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(3600))
            .contains(&self.consumer_group_sync_interval)
        {
            problems.push(Problem::new(
                format!("{key}.consumer_group_sync_interval"),
                "must be between 100ms and 1h",
            ));
        }
        for (index, pattern) in self.users.iter().enumerate() {
            if let Err(e) = globset::Glob::new(pattern) {
                problems.push(Problem::new(
                    format!("{key}.users[{index}]"),
                    format!("invalid pattern {pattern:?}: {}", e.kind()),
                ));
            }
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(86_400))
            .contains(&self.metadata_sync_interval)
        {
            problems.push(Problem::new(
                format!("{key}.metadata_sync_interval"),
                "must be between 100ms and 1d",
            ));
        }
        if let Err(reason) = heartbeat_topic_parts(&self.heartbeat_topic) {
            problems.push(Problem::new(
                format!("{key}.heartbeat_topic"),
                format!("{reason}, got {:?}", self.heartbeat_topic),
            ));
        }
    }
}

impl PolicyConfig {
    fn check(&self, problems: &mut Vec<Problem>, key: &str) {
        if self.name.trim().is_empty() {
            problems.push(Problem::new(format!("{key}.name"), "must not be empty"));
        }
        if self.select.is_empty() {
            problems.push(Problem::new(format!("{key}.select"), "must not be empty"));
        }
        check_topic_globs(problems, &format!("{key}.select"), &self.select);
        if self.allowed_zones.is_empty() {
            problems.push(Problem::new(
                format!("{key}.allowed_zones"),
                "must not be empty (a policy that allows no zone would stop its topics \
                 everywhere; narrow the flows' include instead)",
            ));
        }
        check_zones(
            problems,
            &format!("{key}.allowed_zones"),
            &self.allowed_zones,
        );
    }
}

/// Reports each glob on `stream/topic` of the list at `key` that does not compile or has no
/// `/`, as `<key>[<index>]`.
fn check_topic_globs(problems: &mut Vec<Problem>, key: &str, patterns: &[String]) {
    for (index, pattern) in patterns.iter().enumerate() {
        if let Err(error) = globset::Glob::new(pattern) {
            problems.push(Problem::new(
                format!("{key}[{index}]"),
                format!("invalid glob {pattern:?}: {}", error.kind()),
            ));
        } else if !pattern.contains('/') {
            problems.push(Problem::new(
                format!("{key}[{index}]"),
                format!("pattern {pattern:?} must have the form \"stream/topic\""),
            ));
        }
    }
}

/// Reports each blank zone name of the list at `key`, as `<key>[<index>]`.
fn check_zones(problems: &mut Vec<Problem>, key: &str, zones: &[String]) {
    for (index, zone) in zones.iter().enumerate() {
        if zone.trim().is_empty() {
            problems.push(Problem::new(
                format!("{key}[{index}]"),
                "zone names must not be empty",
            ));
        }
    }
}

/// `policy "a" (…)` or `policies "a" (…) and "b" (…)`.
fn policy_list(policies: &[String]) -> String {
    match policies {
        [one] => format!("policy {one}"),
        [first @ .., last] => format!("policies {} and {last}", first.join(", ")),
        [] => "the residency policies".to_owned(),
    }
}

fn check_host_port(problems: &mut Vec<Problem>, key: &str, value: &str) {
    let valid = match value.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    };
    if !valid {
        problems.push(Problem::new(
            key,
            format!("{value:?} is not a host:port address"),
        ));
    }
}

/// Checks an Iggy URL with the SDK's own parser, so that what passes here also
/// connects. Only TCP is offered: it is the transport the replicator is tested on.
fn check_url(url: &str) -> Result<(), String> {
    use iggy_common::{ConnectionString, TcpConnectionStringOptions};
    if !(url.starts_with("iggy://") || url.starts_with("iggy+tcp://")) {
        return Err(
            "must start with iggy:// or iggy+tcp:// (TCP is the supported transport)".into(),
        );
    }
    // Several seed addresses (`host1:port,host2:port`) share the credentials and options;
    // each must make a valid connection string of its own.
    for seed in replicator_model::seed_urls(url) {
        let normalised = seed.replacen("iggy+tcp://", "iggy://", 1);
        ConnectionString::<TcpConnectionStringOptions>::new(&normalised).map_err(|_| {
            "is not a valid Iggy connection string; expected \
             iggy://user:password@host:port[,host:port...][?options]"
                .to_owned()
        })?;
    }
    Ok(())
}
