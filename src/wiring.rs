//! Turns a validated config into the resolved parameters of the control plane and the
//! pipeline, and adapts the Raft control handle to the pipeline's narrow `ControlPlane`
//! trait. This is the only place that knows both crates.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Instant;

use replicator_config::Config;
use std::sync::Arc;

use replicator_config::FencingMode;
use replicator_control::{
    ClusterSecret, Control, ControlParams, ControlTiming, FenceFuture, FenceTopology, Fencing,
    TlsFiles, WriterFence,
};
use replicator_model::{
    Assignment, ClusterPair, CommitOutcome, Epoch, MetadataChange, MetadataObject, MetadataRecord,
    ProgressCommit, UnitProgress, UnitReset, UnitStart, WorkUnit,
};
use replicator_model::{NodeId, WriterLogin};
use replicator_pipeline::{
    BackoffParams, ClusterParams, ControlError, ControlPlane, FlowParams, PipelineParams,
    PolicyParams, TargetFence, UnitReport,
};
use tokio::sync::watch;

/// Control-plane timing: the control crate's defaults with the config's overrides.
pub(crate) fn control_timing(config: &Config) -> ControlTiming {
    let cluster = &config.cluster;
    let mut timing = cluster
        .member_round_trip
        .map_or_else(ControlTiming::default, ControlTiming::for_member_round_trip);
    if let Some(expiry) = cluster.lease_expiry {
        timing.lease_expiry = expiry;
    }
    if let Some(renew) = cluster.lease_renew_interval {
        timing.lease_renew_interval = renew;
    }
    if let Some(heartbeat) = cluster.heartbeat_interval {
        timing.heartbeat_interval = heartbeat;
    }
    if let Some(after) = cluster.forget_retired_after {
        timing.forget_retired_after = after;
    }
    if let Some(election) = cluster.election_timeout {
        timing.election_timeout_min = election;
        timing.election_timeout_max = election * 2;
    }
    // Counted in renewal periods, so that a longer `lease_renew_interval` never fences members
    // between two of their renewals.
    timing.fence_after = timing.lease_renew_interval * ControlTiming::FENCE_AFTER_RENEWALS;
    timing
}

/// The control plane's parameters; `raft_listener` is pre-bound by the caller when it has one.
pub(crate) fn control_params(
    config: &Config,
    raft_addr: SocketAddr,
    raft_listener: Option<std::net::TcpListener>,
    fencing: Option<Fencing>,
) -> ControlParams {
    ControlParams {
        node_id: config.node.id,
        data_dir: config.node.data_dir.clone(),
        raft_addr,
        raft_listener,
        api_addr: config.advertised_api_addr().to_owned(),
        secret: ClusterSecret::new(config.cluster.secret.expose()),
        initial_members: config.initial_members(),
        timing: control_timing(config),
        tls: config.cluster.tls.as_ref().map(|t| TlsFiles {
            cert_file: t.cert_file.clone(),
            key_file: t.key_file.clone(),
            ca_file: t.ca_file.clone(),
        }),
        fencing,
    }
}

/// The control plane's fencing over the clusters with fencing on (`None` when there is
/// none), starting with the flows of `params`.
pub(crate) fn fencing(fence: Option<Arc<TargetFence>>, params: &PipelineParams) -> Option<Fencing> {
    fence.map(|fence| Fencing {
        fence: Arc::new(IggyFence(fence)),
        topology: fence_topology(params),
    })
}

/// Which flows of `params` write to which fenced target.
pub(crate) fn fence_topology(params: &PipelineParams) -> FenceTopology {
    FenceTopology::new(TargetFence::flow_targets(params))
}

/// The fenced targets some flow of `params` writes to.
pub(crate) fn fenced_targets(params: &PipelineParams) -> BTreeSet<String> {
    TargetFence::flow_targets(params)
        .into_iter()
        .filter_map(|(_, target)| target)
        .collect()
}

/// The pipeline's Iggy-side fencing seen through the control plane's interface.
struct IggyFence(Arc<TargetFence>);

impl WriterFence for IggyFence {
    fn ensure<'a>(&'a self, target: &'a str, login: &'a WriterLogin) -> FenceFuture<'a, ()> {
        Box::pin(self.0.ensure(target, login))
    }

    fn revoke<'a>(
        &'a self,
        target: &'a str,
        node: NodeId,
        incarnation: u64,
    ) -> FenceFuture<'a, ()> {
        Box::pin(self.0.revoke(target, node, incarnation))
    }
}

/// The pipeline's parameters.
pub(crate) fn pipeline_params(config: &Config) -> PipelineParams {
    let clusters: BTreeMap<String, ClusterParams> = config
        .clusters
        .iter()
        .map(|(alias, cluster)| {
            let mut params = ClusterParams::new(cluster.url.expose());
            params.iggy_version = cluster.iggy_version;
            params.connections = cluster.connections;
            params.far_connections = cluster.far_connections;
            params.writer_user_prefix =
                (cluster.fencing == FencingMode::Users).then(|| cluster.writer_user_prefix.clone());
            params.zones = cluster.zones.clone();
            (alias.clone(), params)
        })
        .collect();
    let flows = config
        .flows
        .iter()
        .map(|flow| {
            let mut params = FlowParams::new(
                flow.name.clone(),
                flow.source.clone(),
                flow.target.clone(),
                flow.include.clone(),
            );
            params.exclude = flow.exclude.clone();
            params.naming = flow.naming;
            // `Config::problems` rejected unknown words, so this only falls back for a config
            // that was never validated.
            params.initial_offset = flow.initial_offset.resolve().unwrap_or_default();
            params.batch_size = flow.batch_size;
            params.poll_interval = flow.poll_interval;
            params.idle_poll_interval = flow.idle_poll_interval;
            params.provenance = flow.provenance;
            params.max_in_flight_batches = flow.max_in_flight_batches;
            params.max_batch_bytes = flow.max_batch_bytes;
            params.far_source_polls = flow.far_source_polls;
            params.consumer_groups = flow.consumer_groups.clone();
            params.consumer_group_sync_interval = flow.consumer_group_sync_interval;
            params.users = flow.users.clone();
            params.delete_users_removed_upstream = flow.delete_users_removed_upstream;
            params.keep_target_settings = flow.keep_target_settings.iter().copied().collect();
            params.metadata_sync_interval = flow.metadata_sync_interval;
            params.max_messages_per_second = flow.max_messages_per_second;
            params.max_bytes_per_second = flow.max_bytes_per_second;
            params.heartbeat_interval = flow.heartbeat_interval;
            params.heartbeat_topic = flow.heartbeat_topic.clone();
            params
        })
        .collect();
    let mut params = PipelineParams::new(config.node.id, clusters, flows);
    params.policies = config
        .policies
        .iter()
        .map(|policy| PolicyParams {
            name: policy.name.clone(),
            select: policy.select.clone(),
            allowed_zones: policy.allowed_zones.clone(),
        })
        .collect();
    params.discovery_interval = config.pipeline.discovery_interval;
    params.backoff = BackoffParams {
        initial: config.pipeline.restart_backoff_min,
        max: config.pipeline.restart_backoff_max,
    };
    params
}

/// The Raft control handle seen through the pipeline's interface.
#[derive(Clone)]
pub(crate) struct RaftControl(pub(crate) Control);

fn control_error(error: replicator_control::Error) -> ControlError {
    ControlError {
        transient: error.is_transient(),
        reason: error.to_string(),
    }
}

impl ControlPlane for RaftControl {
    fn assignments(&self) -> watch::Receiver<Vec<Assignment>> {
        self.0.assignments()
    }

    fn writer_login(&self) -> watch::Receiver<Option<WriterLogin>> {
        self.0.writer_login()
    }

    fn lease_valid_until(&self) -> Option<Instant> {
        self.0.lease_valid_until()
    }

    /// Reads the lease, then the applied state (not the assignments watch, which may lag it).
    fn lease_valid_for(&self, unit: &WorkUnit, epoch: Epoch) -> Option<Instant> {
        self.0.lease_valid_for(unit, epoch)
    }

    fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
        self.0.progress(unit)
    }

    fn pending_reset(&self, unit: &WorkUnit) -> Option<UnitReset> {
        self.0.pending_reset(unit)
    }

    fn recorded_start(&self, unit: &WorkUnit) -> Option<UnitStart> {
        self.0.recorded_start(unit)
    }

    fn record_start(
        &self,
        unit: &WorkUnit,
        epoch: Epoch,
        start: UnitStart,
    ) -> impl Future<Output = Result<bool, ControlError>> + Send {
        let (control, unit) = (self.0.clone(), unit.clone());
        async move {
            control
                .record_start(&unit, epoch, start)
                .await
                .map_err(control_error)
        }
    }

    fn abandon_writer_identity(
        &self,
        incarnation: u64,
    ) -> impl Future<Output = Result<bool, ControlError>> + Send {
        let control = self.0.clone();
        async move {
            control
                .abandon_writer_identity(incarnation)
                .await
                .map_err(control_error)
        }
    }

    fn counts_totals(&self) -> bool {
        self.0.counts_totals()
    }

    fn stamps_compact_provenance(&self) -> bool {
        self.0.stamps_compact_provenance()
    }

    fn commit(
        &self,
        commits: Vec<ProgressCommit>,
    ) -> impl Future<Output = Result<Vec<CommitOutcome>, ControlError>> + Send {
        let control = self.0.clone();
        async move { control.commit(commits).await.map_err(control_error) }
    }

    fn report_units(
        &self,
        flow: &str,
        units: Vec<WorkUnit>,
    ) -> impl Future<Output = Result<UnitReport, ControlError>> + Send {
        let control = self.0.clone();
        let flow = flow.to_owned();
        async move {
            // A node whose config of the flow differs from the leader's may select other
            // topics: its reports would retire the units the others report, back and forth.
            if !control.config_agrees_with_leader(&flow) {
                tracing::debug!(%flow, "not reporting units: this node's config of the flow differs from the leader's (or no leader)");
                return Ok(UnitReport::Deferred);
            }
            control
                .report_units(&flow, units)
                .await
                .map(|()| UnitReport::Reported)
                .map_err(control_error)
        }
    }

    fn metadata_records(
        &self,
        pair: &ClusterPair,
    ) -> Option<BTreeMap<MetadataObject, MetadataRecord>> {
        self.0.metadata_records(pair)
    }

    fn record_metadata(
        &self,
        changes: Vec<MetadataChange>,
    ) -> impl Future<Output = Result<Vec<bool>, ControlError>> + Send {
        let control = self.0.clone();
        async move {
            control
                .record_metadata(changes)
                .await
                .map_err(control_error)
        }
    }

    fn release(
        &self,
        unit: WorkUnit,
        epoch: Epoch,
    ) -> impl Future<Output = Result<(), ControlError>> + Send {
        let control = self.0.clone();
        async move { control.release(unit, epoch).await.map_err(control_error) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use replicator_config::testing::MinimalConfig;

    use super::*;

    #[test]
    fn members_apart_stretch_the_control_timing_and_fence_after_follows_the_renewals() {
        let ms = Duration::from_millis;
        let timing = |cluster: &str| {
            let config = MinimalConfig {
                cluster_extra: cluster.to_owned(),
                ..MinimalConfig::default()
            };
            control_timing(&config.parse().expect("valid config"))
        };
        let far = timing("member_round_trip = \"150ms\"");
        assert_eq!(far.lease_renew_interval, ms(450));
        assert_eq!(far.lease_expiry, ms(2050));
        assert_eq!(far.fence_after, ms(900));
        assert_eq!(far.election_timeout_min, ms(600));
        // An explicit setting wins over the stretched one.
        let explicit = timing("member_round_trip = \"150ms\"\nlease_expiry = \"3s\"");
        assert_eq!(explicit.lease_expiry, ms(3000));
        assert_eq!(explicit.lease_renew_interval, ms(450));
        // A longer renewal period moves the fence with it (two periods).
        let slow = timing("lease_expiry = \"4s\"\nlease_renew_interval = \"1s\"");
        assert_eq!(slow.fence_after, ms(2000));
        assert_eq!(timing("").fence_after, ControlTiming::default().fence_after);
    }

    #[test]
    fn cluster_connections_and_idle_poll_interval_reach_the_pipeline() {
        let config = MinimalConfig {
            us_extra: "connections = 7\nfar_connections = 9".to_owned(),
            flow_extra: "idle_poll_interval = \"250ms\"\nmax_batch_bytes = 1048576".to_owned(),
            ..MinimalConfig::default()
        };
        let params = pipeline_params(&config.parse().expect("valid config"));
        assert_eq!(params.clusters["us"].connections, 7);
        assert_eq!(params.clusters["us"].far_connections, 9);
        assert_eq!(
            params.clusters["eu"].connections,
            replicator_config::DEFAULT_CONNECTIONS
        );
        assert_eq!(
            params.clusters["eu"].far_connections,
            replicator_config::DEFAULT_FAR_CONNECTIONS
        );
        assert_eq!(params.flows[0].max_batch_bytes, 1 << 20);
        let defaults = pipeline_params(&MinimalConfig::default().parse().expect("valid config"));
        assert_eq!(
            defaults.flows[0].max_batch_bytes,
            replicator_model::DEFAULT_MAX_BATCH_BYTES
        );
        assert_eq!(
            params.flows[0].idle_poll_interval,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn heartbeat_keys_reach_the_pipeline_with_their_defaults() {
        let params = pipeline_params(&MinimalConfig::default().parse().expect("valid config"));
        assert_eq!(
            params.flows[0].heartbeat_interval,
            replicator_model::DEFAULT_HEARTBEAT_INTERVAL
        );
        assert_eq!(
            params.flows[0].heartbeat_topic,
            replicator_model::DEFAULT_HEARTBEAT_TOPIC
        );
        let config = MinimalConfig {
            flow_extra: "heartbeat_interval = \"0s\"\nheartbeat_topic = \"ops/hb\"".to_owned(),
            ..MinimalConfig::default()
        };
        let params = pipeline_params(&config.parse().expect("valid config"));
        assert_eq!(params.flows[0].heartbeat_interval, Duration::ZERO);
        assert_eq!(params.flows[0].heartbeat_topic, "ops/hb");
    }

    #[test]
    fn zones_and_policies_reach_the_pipeline_under_the_same_names() {
        let config = MinimalConfig {
            eu_extra: "zones = [\"eu\"]".to_owned(),
            flow_extra:
                "\n[[policies]]\nname = \"pii\"\nselect = [\"pii-*/*\"]\nallowed_zones = [\"us\"]"
                    .to_owned(),
            ..MinimalConfig::default()
        };
        let params = pipeline_params(&config.parse().expect("valid config"));
        assert_eq!(params.clusters["eu"].zones, ["eu"]);
        assert!(params.clusters["us"].zones.is_empty());
        assert_eq!(
            params.policies,
            [PolicyParams {
                name: "pii".to_owned(),
                select: vec!["pii-*/*".to_owned()],
                allowed_zones: vec!["us".to_owned()],
            }]
        );
    }

    #[test]
    fn max_in_flight_batches_reaches_the_pipeline_under_the_same_name() {
        let config = MinimalConfig {
            flow_extra: "max_in_flight_batches = 5".to_owned(),
            ..MinimalConfig::default()
        };
        let params = pipeline_params(&config.parse().expect("valid config"));
        assert_eq!(params.flows[0].max_in_flight_batches, 5);
    }
}
