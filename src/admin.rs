//! The admin HTTP API on `node.api_addr`: health, readiness, status as JSON, Prometheus
//! metrics, and the authenticated membership calls behind `iggy-replicator cluster`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use replicator_config::Config;
use replicator_control::{ClusterStatus, Control, MemberStatus};
use replicator_model::{Epoch, NodeId, UnitCounters, WorkUnit};
use replicator_pipeline::{Pipeline, UnitStats};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The node's control plane.
    control: Control,
    /// The node's pipeline; `None` while it is not running.
    pipeline: Option<Arc<Pipeline>>,
    /// Bearer tokens that authorise mutating calls (the cluster secret and the admin token).
    tokens: Arc<Vec<String>>,
    /// Prometheus families, fed at every scrape.
    metrics: Arc<Metrics>,
}

impl AdminState {
    /// State for a node built from `config`.
    pub(crate) fn new(
        control: Control,
        pipeline: Option<Arc<Pipeline>>,
        metrics: Arc<Metrics>,
        config: &Config,
    ) -> Self {
        let mut tokens = vec![config.cluster.secret.expose().to_owned()];
        if let Some(token) = &config.cluster.admin_token {
            tokens.push(token.expose().to_owned());
        }
        Self {
            control,
            pipeline,
            tokens: Arc::new(tokens),
            metrics,
        }
    }
}

/// The routes.
pub(crate) fn router(state: AdminState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/cluster/members", post(add_member))
        .route("/cluster/members/{id}", delete(remove_member))
        .with_state(state)
}

/// Serves the API on `listener` until `stop` is cancelled.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    stop: CancellationToken,
) {
    let app = router(state);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    if let Err(e) = result {
        warn!(error = %e, "admin API stopped with an error");
    }
}

/// `GET /health`: the process is alive and serving.
async fn health() -> &'static str {
    "ok\n"
}

/// `GET /ready`: a member of a cluster that has a leader, with its assignments known.
async fn ready(State(state): State<AdminState>) -> Response {
    let metrics = state.control.metrics();
    match (metrics.leader, metrics.last_applied) {
        (Some(leader), Some(_)) => {
            (StatusCode::OK, format!("ready (leader {leader})\n")).into_response()
        }
        (None, _) => (StatusCode::SERVICE_UNAVAILABLE, "not ready: no leader\n").into_response(),
        (Some(_), None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: state not applied yet\n",
        )
            .into_response(),
    }
}

/// The JSON document of `GET /status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StatusView {
    /// The node that answered.
    pub(crate) node: NodeId,
    /// The leader it knows.
    pub(crate) leader: Option<NodeId>,
    /// Its Raft term.
    pub(crate) term: u64,
    /// Last applied log index.
    pub(crate) applied_index: Option<u64>,
    /// Members with liveness.
    pub(crate) members: Vec<MemberStatus>,
    /// Every unit with owner, epoch and confirmed offset; runtime figures for units this node runs.
    pub(crate) units: Vec<UnitView>,
}

/// One unit in [`StatusView`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UnitView {
    /// The unit.
    pub(crate) unit: WorkUnit,
    /// Owner node, if granted.
    pub(crate) owner: Option<NodeId>,
    /// Epoch of the latest grant.
    pub(crate) epoch: Epoch,
    /// Last upstream offset confirmed written downstream.
    pub(crate) confirmed_offset: Option<u64>,
    /// Totals over the unit's life (messages, bytes, errors, gaps).
    pub(crate) counters: UnitCounters,
    /// The leader asked the owner to hand the unit back.
    pub(crate) release_requested: bool,
    /// Discovery no longer sees the upstream partition.
    pub(crate) retired: bool,
    /// Runtime figures from the owner (present when the answering node owns the unit).
    pub(crate) live: Option<LiveView>,
}

/// Runtime figures of a unit on the node that runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LiveView {
    /// The node that runs the unit.
    pub(crate) node: NodeId,
    /// Next offset of the upstream partition as last seen.
    pub(crate) upstream_end_offset: Option<u64>,
    /// Messages not yet copied.
    pub(crate) lag: Option<u64>,
    /// Messages per second copied.
    pub(crate) rate: f64,
    /// Median replication latency of recent batches, in milliseconds.
    pub(crate) latency_p50_ms: Option<f64>,
    /// 99th percentile replication latency of recent batches, in milliseconds.
    pub(crate) latency_p99_ms: Option<f64>,
    /// Reader/writer restarts after failures.
    pub(crate) restarts: u64,
}

/// Builds the status document from the control plane's view and this node's pipeline stats.
pub(crate) fn status_view(node: NodeId, cluster: ClusterStatus, local: &[UnitStats]) -> StatusView {
    let units = cluster
        .units
        .into_iter()
        .map(|unit| {
            let live = local
                .iter()
                .find(|s| s.unit == unit.unit && unit.owner == Some(node))
                .map(|s| live_view(node, s));
            UnitView {
                owner: unit.owner,
                epoch: unit.epoch,
                confirmed_offset: unit.progress.confirmed,
                counters: unit.progress.counters,
                release_requested: unit.release_requested,
                retired: unit.retired,
                unit: unit.unit,
                live,
            }
        })
        .collect();
    StatusView {
        node,
        leader: cluster.leader,
        term: cluster.term,
        applied_index: cluster.applied_index,
        members: cluster.members,
        units,
    }
}

fn live_view(node: NodeId, stats: &UnitStats) -> LiveView {
    let mut samples: Vec<Duration> = stats.latency_samples.clone();
    samples.sort_unstable();
    let quantile = |q: f64| -> Option<f64> {
        if samples.is_empty() {
            return None;
        }
        let index = ((samples.len() - 1) as f64 * q).round() as usize;
        samples.get(index).map(|d| d.as_secs_f64() * 1000.0)
    };
    LiveView {
        node,
        upstream_end_offset: stats.upstream_end,
        lag: stats.lag,
        rate: stats.messages_per_second,
        latency_p50_ms: quantile(0.5),
        latency_p99_ms: quantile(0.99),
        restarts: stats.restarts,
    }
}

async fn local_stats(state: &AdminState) -> Vec<UnitStats> {
    match &state.pipeline {
        Some(pipeline) => pipeline.stats().await.unwrap_or_else(|e| {
            warn!(error = %e, "cannot read pipeline stats");
            Vec::new()
        }),
        None => Vec::new(),
    }
}

/// `GET /status`.
async fn status(State(state): State<AdminState>) -> Response {
    match state.control.status().await {
        Ok(cluster) => {
            let local = local_stats(&state).await;
            Json(status_view(state.control.node_id(), cluster, &local)).into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cluster status unavailable: {e}\n"),
        )
            .into_response(),
    }
}

/// `GET /metrics`: Prometheus text format.
async fn metrics(State(state): State<AdminState>) -> Response {
    let local = local_stats(&state).await;
    let control = state.control.metrics();
    match state.metrics.render(&control, &local) {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Body of `POST /cluster/members`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AddMember {
    /// The new node's id.
    pub(crate) id: NodeId,
    /// Its Raft `host:port`.
    pub(crate) raft_addr: String,
    /// Its admin API `host:port`.
    pub(crate) api_addr: String,
}

/// Checks `Authorization: Bearer <token>` against the configured tokens; logs refusals and
/// returns the 401 answer to send.
fn authorise(state: &AdminState, headers: &HeaderMap, action: &str) -> Result<(), Box<Response>> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let accepted = presented.is_some_and(|token| {
        state
            .tokens
            .iter()
            .any(|expected| constant_time_eq(expected.as_bytes(), token.as_bytes()))
    });
    if accepted {
        Ok(())
    } else {
        warn!(
            action,
            presented = presented.is_some(),
            "admin call refused: wrong or missing token"
        );
        Err(Box::new(
            (StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n").into_response(),
        ))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(!*x);
    }
    diff == 0
}

/// `POST /cluster/members`: adds a node (learner, then voter).
async fn add_member(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Json(body): Json<AddMember>,
) -> Response {
    if let Err(refused) = authorise(&state, &headers, "add_member") {
        return *refused;
    }
    info!(member = body.id, raft = %body.raft_addr, "adding member");
    match state
        .control
        .add_member(body.id, body.raft_addr, body.api_addr)
        .await
    {
        Ok(()) => (StatusCode::OK, format!("member {} added\n", body.id)).into_response(),
        Err(e) => (
            StatusCode::CONFLICT,
            format!("cannot add member {}: {e}\n", body.id),
        )
            .into_response(),
    }
}

/// `DELETE /cluster/members/{id}`: drains the node's units, then removes it.
async fn remove_member(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(id): Path<NodeId>,
) -> Response {
    if let Err(refused) = authorise(&state, &headers, "remove_member") {
        return *refused;
    }
    info!(member = id, "removing member");
    match state.control.remove_member(id).await {
        Ok(()) => (StatusCode::OK, format!("member {id} removed\n")).into_response(),
        Err(e) => (
            StatusCode::CONFLICT,
            format!("cannot remove member {id}: {e}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use replicator_testkit::{TestServer, TestServerConfig};

    use super::*;
    use crate::node::{NodeListeners, RunningNode};

    type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    const SECRET: &str = "admin-test-secret-0123456789";

    async fn single_node(
        us: &TestServer,
        eu: &TestServer,
        dir: &std::path::Path,
    ) -> Result<RunningNode, Box<dyn std::error::Error + Send + Sync>> {
        let raft = std::net::TcpListener::bind("127.0.0.1:0")?;
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let text = format!(
            r#"
[node]
id = 1
data_dir = {data:?}
raft_addr = "{raft}"
api_addr = "{api}"
[cluster]
secret = "{SECRET}"
[clusters.us]
url = "{us}"
[clusters.eu]
url = "{eu}"
[[flows]]
name = "us-to-eu"
source = "us"
target = "eu"
"#,
            data = dir.join("node").display().to_string(),
            raft = raft.local_addr()?,
            api = api.local_addr()?,
            us = us.connection_string(),
            eu = eu.connection_string(),
        );
        let config = replicator_config::parse_str(&text, "test", |_| None)?;
        RunningNode::start(&config, Some(NodeListeners { raft, api }))
            .await
            .map_err(|e| format!("{e:?}").into())
    }

    async fn wait_ready(client: &reqwest::Client, base: &str) -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = client.get(format!("{base}/ready")).send().await?;
            if ready.status() == StatusCode::OK {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("node never became ready".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admin_api_serves_health_status_metrics_and_guards_mutations() -> TestResult {
        let us = TestServer::start(TestServerConfig::default()).await?;
        let eu = TestServer::start(TestServerConfig::default()).await?;
        let dir = tempfile::tempdir()?;
        let node = single_node(&us, &eu, dir.path()).await?;
        let base = format!("http://{}", node.api_addr);
        let client = reqwest::Client::new();

        let health = client.get(format!("{base}/health")).send().await?;
        assert_eq!(health.status(), StatusCode::OK);
        wait_ready(&client, &base).await?;

        let status: StatusView = client
            .get(format!("{base}/status"))
            .send()
            .await?
            .json()
            .await?;
        assert_eq!(status.node, 1);
        assert_eq!(status.leader, Some(1));
        assert!(status.members.iter().any(|m| m.id == 1 && m.voter));

        // Some traffic, so that the data-path families have samples.
        let producer = iggy::prelude::IggyClient::from_connection_string(&us.connection_string())?;
        {
            use iggy::prelude::{Client, MessageClient, StreamClient, TopicClient};
            producer.connect().await?;
            producer.create_stream("metrics").await?;
            let stream = iggy::prelude::Identifier::named("metrics")?;
            producer
                .create_topic(
                    &stream,
                    "events",
                    1,
                    iggy::prelude::CompressionAlgorithm::None,
                    None,
                    iggy::prelude::IggyExpiry::NeverExpire,
                    iggy::prelude::MaxTopicSize::ServerDefault,
                )
                .await?;
            let mut messages = (1..=10u128)
                .map(|id| {
                    iggy::prelude::IggyMessage::builder()
                        .id(id)
                        .payload(bytes::Bytes::from_static(b"hello"))
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()?;
            producer
                .send_messages(
                    &stream,
                    &iggy::prelude::Identifier::named("events")?,
                    &iggy::prelude::Partitioning::partition_id(0),
                    &mut messages,
                )
                .await?;
        }
        let sample = |scrape: &prometheus_parse::Scrape, name: &str| -> Option<f64> {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| match s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => v,
                    _ => f64::NAN,
                })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let (text, scrape) = loop {
            let text = client
                .get(format!("{base}/metrics"))
                .send()
                .await?
                .text()
                .await?;
            let lines = text.lines().map(|l| Ok(l.to_owned()));
            let scrape = prometheus_parse::Scrape::parse(lines)?;
            if sample(&scrape, "iggy_replicator_messages_copied_total") == Some(10.0) {
                break (text, scrape);
            }
            if Instant::now() > deadline {
                return Err(format!("10 copied messages never showed in:\n{text}").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let names: Vec<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
        for expected in [
            "iggy_replicator_raft_term",
            "iggy_replicator_raft_leader",
            "iggy_replicator_units_owned",
            "iggy_replicator_bytes_copied_total",
            "iggy_replicator_lag_messages",
            "iggy_replicator_replication_latency_seconds_count",
            "iggy_replicator_send_latency_seconds_count",
            "iggy_replicator_poll_latency_seconds_count",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} missing from:\n{text}"
            );
        }
        assert_eq!(
            sample(&scrape, "iggy_replicator_raft_leader"),
            Some(1.0),
            "{text}"
        );
        let _ = iggy::prelude::Client::shutdown(&producer).await;

        let body = AddMember {
            id: 9,
            raft_addr: "127.0.0.1:1".into(),
            api_addr: "127.0.0.1:2".into(),
        };
        let missing = client
            .post(format!("{base}/cluster/members"))
            .json(&body)
            .send()
            .await?;
        assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
        let wrong = client
            .delete(format!("{base}/cluster/members/9"))
            .bearer_auth("not-the-secret")
            .send()
            .await?;
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);

        node.shutdown().await;
        us.shutdown().await;
        eu.shutdown().await;
        Ok(())
    }
}
