//! Outbound RPCs: a shared reqwest client that adds the secret, and openraft's network
//! factory on top of it.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use replicator_model::NodeId;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{paths, FaultSwitch, SECRET_HEADER};
use crate::command::{decode, encode};
use crate::params::ClusterSecret;
use crate::{MemberNode, TypeConfig};

/// Why an RPC got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// Connecting or sending failed, or the request timed out.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The test fault switch cut this node off.
    #[error("network cut by fault switch")]
    Isolated,
    /// The peer rejected the cluster secret.
    #[error("peer rejected the cluster secret")]
    Unauthorized,
    /// The peer answered with another non-success status.
    #[error("peer answered http {0}")]
    Status(u16),
    /// The body could not be encoded or decoded.
    #[error("codec: {0}")]
    Codec(String),
}

impl CallError {
    /// Whether another attempt (later, or at another node) can succeed.
    pub(crate) fn is_transient(&self) -> bool {
        !matches!(self, CallError::Unauthorized | CallError::Codec(_))
    }
}

/// Sends authenticated requests to peers. Cheap to clone.
#[derive(Clone)]
pub(crate) struct PeerClient {
    http: reqwest::Client,
    secret: ClusterSecret,
    fault: Arc<FaultSwitch>,
}

impl PeerClient {
    pub(crate) fn new(secret: ClusterSecret, fault: Arc<FaultSwitch>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Self {
            http,
            secret,
            fault,
        }
    }

    /// POSTs `req` to `addr` + `path` and decodes the answer.
    pub(crate) async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, CallError> {
        if self.fault.is_isolated() {
            return Err(CallError::Isolated);
        }
        let body = encode("rpc request", req).map_err(|e| CallError::Codec(e.to_string()))?;
        let resp = self
            .http
            .post(format!("http://{addr}{path}"))
            .header(SECRET_HEADER, self.secret.expose())
            .header("content-type", "application/octet-stream")
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        match resp.status().as_u16() {
            200 => {}
            401 => return Err(CallError::Unauthorized),
            other => return Err(CallError::Status(other)),
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        if self.fault.is_isolated() {
            return Err(CallError::Isolated);
        }
        decode("rpc reply", &bytes).map_err(|e| CallError::Codec(e.to_string()))
    }
}

/// openraft's connection factory.
pub(crate) struct NetworkFactory {
    pub(crate) client: PeerClient,
    pub(crate) default_timeout: Duration,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> Connection {
        Connection {
            target,
            addr: node.raft_addr.clone(),
            client: self.client.clone(),
            default_timeout: self.default_timeout,
        }
    }
}

/// One peer as openraft's replication sees it.
pub(crate) struct Connection {
    target: NodeId,
    addr: String,
    client: PeerClient,
    default_timeout: Duration,
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>;

impl Connection {
    async fn rpc<Q, A, E>(&self, path: &str, req: &Q, option: &RPCOption) -> RpcResult<A, E>
    where
        Q: Serialize,
        A: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        // openraft also wraps every call in its own timeout; this bounds the HTTP request.
        let timeout = match option.hard_ttl() {
            t if t.is_zero() => self.default_timeout,
            t => t,
        };
        let reply: Result<A, RaftError<NodeId, E>> = self
            .client
            .call(&self.addr, path, req, timeout)
            .await
            .map_err(|e| match e {
                CallError::Unreachable(_) | CallError::Isolated => {
                    RPCError::Unreachable(Unreachable::new(&e))
                }
                CallError::Unauthorized | CallError::Status(_) | CallError::Codec(_) => {
                    RPCError::Network(NetworkError::new(&e))
                }
            })?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        self.rpc(paths::APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.rpc(paths::SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        self.rpc(paths::VOTE, &rpc, &option).await
    }
}
