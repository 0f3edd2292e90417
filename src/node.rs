//! One running replicator node: its control plane, pipeline and admin API, started
//! together and stopped in reverse order. `run` runs one; `demo` runs three in-process.

use std::net::SocketAddr;
use std::sync::Arc;

use replicator_config::Config;
use replicator_control::Control;
use replicator_model::NodeId;
use replicator_pipeline::Pipeline;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::{self, AdminState};
use crate::exit::Failure;
use crate::metrics::Metrics;
use crate::wiring::{control_params, pipeline_params, RaftControl};

/// Listeners bound before the node starts (port 0 in tests and the demo).
pub(crate) struct NodeListeners {
    /// Raft RPC listener.
    pub(crate) raft: std::net::TcpListener,
    /// Admin API listener.
    pub(crate) api: tokio::net::TcpListener,
}

/// A started node.
pub(crate) struct RunningNode {
    /// The node id.
    pub(crate) id: NodeId,
    /// Its control-plane handle.
    pub(crate) control: Control,
    /// Its pipeline (shared with the admin API for status).
    pub(crate) pipeline: Arc<Pipeline>,
    /// Where its admin API listens.
    pub(crate) api_addr: SocketAddr,
    /// Stops the admin API.
    admin_stop: CancellationToken,
    /// The admin API task.
    admin_task: JoinHandle<()>,
}

impl RunningNode {
    /// Starts control plane, pipeline and admin API; binds the configured addresses unless
    /// `listeners` are given.
    pub(crate) async fn start(
        config: &Config,
        listeners: Option<NodeListeners>,
    ) -> Result<Self, Failure> {
        let (raft_addr, raft_listener, api_listener) = match listeners {
            Some(l) => {
                let raft_addr = l.raft.local_addr().map_err(bind_failure)?;
                (raft_addr, Some(l.raft), l.api)
            }
            None => {
                let raft_addr = resolve(&config.node.raft_addr, "node.raft_addr").await?;
                let api = tokio::net::TcpListener::bind(&config.node.api_addr)
                    .await
                    .map_err(|e| {
                        Failure::runtime(
                            format!("cannot bind the admin API on {}: {e}", config.node.api_addr),
                            "choose a free node.api_addr",
                        )
                    })?;
                (raft_addr, None, api)
            }
        };
        let api_addr = api_listener.local_addr().map_err(bind_failure)?;
        info!(node = config.node.id, raft = %raft_addr, api = %api_addr, "starting node");
        let control = Control::start(control_params(config, raft_addr, raft_listener))
            .await
            .map_err(|e| {
                Failure::runtime(
                    format!("cannot start the control plane: {e}"),
                    "check node.data_dir (readable, this node's own) and node.raft_addr (free)",
                )
            })?;
        let metrics = Arc::new(Metrics::new());
        let mut params = pipeline_params(config);
        params.observer = metrics.observer();
        let pipeline = match Pipeline::start(params, RaftControl(control.clone())).await {
            Ok(pipeline) => Arc::new(pipeline),
            Err(e) => {
                control.shutdown().await;
                return Err(Failure::runtime(
                    format!("cannot start the pipeline: {e}"),
                    "check [clusters] and [[flows]]",
                ));
            }
        };
        let admin_stop = CancellationToken::new();
        let state = AdminState::new(control.clone(), Some(pipeline.clone()), metrics, config);
        let admin_task = tokio::spawn(admin::serve(api_listener, state, admin_stop.clone()));
        Ok(Self {
            id: config.node.id,
            control,
            pipeline,
            api_addr,
            admin_stop,
            admin_task,
        })
    }

    /// Graceful stop: admin API, then the pipeline drains (final commits, units released),
    /// then the control plane.
    pub(crate) async fn shutdown(self) {
        self.drain().await.shutdown().await;
    }

    /// First half of a graceful stop: stops the admin API and drains the pipeline (final
    /// commits, units released) while the control plane keeps running. Stopping several
    /// nodes of one cluster drains them all before any control plane stops, so the drains
    /// never lose their quorum.
    pub(crate) async fn drain(self) -> DrainedNode {
        self.admin_stop.cancel();
        if let Err(e) = self.admin_task.await {
            warn!(error = %e, "admin API task failed");
        }
        match Arc::try_unwrap(self.pipeline) {
            Ok(pipeline) => pipeline.shutdown().await,
            Err(_) => warn!("pipeline still shared at shutdown; it stops without draining"),
        }
        DrainedNode {
            id: self.id,
            control: self.control,
        }
    }

    /// Stops everything at once without draining, as `kill -9` would.
    pub(crate) async fn crash(self) {
        self.admin_task.abort();
        let _ = self.admin_task.await;
        match Arc::try_unwrap(self.pipeline) {
            Ok(pipeline) => pipeline.crash().await,
            Err(_) => warn!("pipeline still shared at crash"),
        }
        self.control.crash().await;
    }
}

/// A node whose pipeline has drained; only its control plane still runs.
pub(crate) struct DrainedNode {
    id: NodeId,
    control: Control,
}

impl DrainedNode {
    /// Stops the control plane.
    pub(crate) async fn shutdown(self) {
        self.control.shutdown().await;
        info!(node = self.id, "node stopped");
    }
}

fn bind_failure(e: std::io::Error) -> Failure {
    Failure::runtime(format!("listener has no local address: {e}"), "retry")
}

/// Resolves a `host:port` from the config (DNS names are allowed, e.g. in Kubernetes).
async fn resolve(address: &str, key: &str) -> Result<SocketAddr, Failure> {
    let hint = "use an IP address or a name this host can resolve";
    let mut addrs = tokio::net::lookup_host(address)
        .await
        .map_err(|e| Failure::runtime(format!("cannot resolve {key} {address:?}: {e}"), hint))?;
    addrs
        .next()
        .ok_or_else(|| Failure::runtime(format!("{key} {address:?} resolves to no address"), hint))
}
