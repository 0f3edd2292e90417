//! Inbound RPCs: an axum router over a pre-bound listener. Every handler first checks the
//! fault switch and the request's signature, receiver and stamp (`auth`), then decodes the
//! bincode body and answers in bincode.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::Raft;
use replicator_model::NodeId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::auth::{
    now_millis, AuthError, InboundGuard, Receiver, Signer, AUTH_HEADER, RECEIVER_HEADER,
};
use super::{paths, FaultSwitch, ManageRequest, PingReply, TakeOver, TakeOverReply, WriteReply};
use crate::command::{decode, encode, ControlCommand};
use crate::tls::{serve_tls_with, TlsState};
use crate::{ClusterStatus, TypeConfig};

/// What the RPC server needs of the node it serves (`node::NodeInner` implements it): the node
/// hands itself to [`serve`] through this, and the handlers reach nothing else of it.
pub(crate) trait RpcNode: Send + Sync + 'static {
    /// This node.
    fn id(&self) -> NodeId;
    /// The Raft handle openraft's RPCs go to.
    fn raft(&self) -> &Raft<TypeConfig>;
    /// The test seam cutting the node off the network.
    fn fault(&self) -> &FaultSwitch;
    /// Verifies the signature of inbound RPCs.
    fn signer(&self) -> &Signer;
    /// This run of the RPC server and its nonce record.
    fn inbound(&self) -> &InboundGuard;
    /// Writes a command a follower forwarded through this node's Raft (which must lead).
    fn local_write(&self, cmd: ControlCommand) -> impl Future<Output = WriteReply> + Send;
    /// Executes a membership change a follower forwarded (this node must lead).
    fn local_manage(&self, req: ManageRequest) -> impl Future<Output = WriteReply> + Send;
    /// Status as this node sees it.
    fn local_status(&self) -> ClusterStatus;
    /// Calls an election at a stopping leader's request (`handover`).
    fn take_over(&self, req: TakeOver) -> impl Future<Output = TakeOverReply> + Send;
}

/// Serves Raft and control RPCs on `listener` until `shutdown` is cancelled; over mutual TLS
/// when `tls` is given (each connection uses the configuration current when it was accepted).
pub(crate) async fn serve<N: RpcNode>(
    listener: tokio::net::TcpListener,
    node: Arc<N>,
    shutdown: CancellationToken,
    tls: Option<Arc<TlsState>>,
) -> std::io::Result<()> {
    let router = Router::new()
        .route(paths::APPEND, post(append::<N>))
        .route(paths::VOTE, post(vote::<N>))
        .route(paths::SNAPSHOT, post(snapshot::<N>))
        .route(paths::WRITE, post(write::<N>))
        .route(paths::MANAGE, post(manage::<N>))
        .route(paths::STATUS, post(status::<N>))
        .route(paths::PING, post(ping::<N>))
        .route(paths::TAKE_OVER, post(take_over::<N>))
        .layer(axum::extract::DefaultBodyLimit::max(super::MAX_RPC_BODY))
        .with_state(node);
    match tls {
        None => {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
        Some(tls) => {
            serve_tls_with(listener, router, shutdown, move || tls.get().server).await;
            Ok(())
        }
    }
}

/// Checks the fault switch, the signature, the receiver and that the request is no replay;
/// decodes the body. A request signed for another node or run is answered `409` with this
/// run's [`Receiver`] in [`RECEIVER_HEADER`], for the sender to sign again (`auth`,
/// "Learning a receiver's boot id"); the other refusals are `401`.
fn admit<Q: DeserializeOwned, N: RpcNode>(
    node: &N,
    headers: &HeaderMap,
    body: &[u8],
    path: &'static str,
) -> Result<Q, Refused> {
    if node.fault().is_isolated() {
        return Err(Refused::Status(StatusCode::SERVICE_UNAVAILABLE));
    }
    let checked = node.inbound().authenticate(
        node.signer(),
        path,
        body,
        headers.get(AUTH_HEADER).map(|v| v.as_bytes()),
        now_millis(),
    );
    match checked {
        Ok(()) => {}
        Err(reason) if reason.is_other_receiver() => {
            if let AuthError::OtherNode { .. } = reason {
                tracing::warn!(node = %node.id(), path, %reason, "refused an rpc signed for another node");
            } else {
                // Routine: a peer's first request, or its first since this node restarted.
                tracing::debug!(node = %node.id(), path, %reason, "asked an rpc's sender to sign for this run");
            }
            return Err(Refused::OtherReceiver(node.inbound().me()));
        }
        Err(reason) => {
            tracing::warn!(node = %node.id(), path, %reason, "refused an unauthenticated rpc");
            return Err(Refused::Status(StatusCode::UNAUTHORIZED));
        }
    }
    decode(path, body).map_err(|e| {
        tracing::warn!(node = %node.id(), path, error = %e, "undecodable rpc body");
        Refused::Status(StatusCode::BAD_REQUEST)
    })
}

/// Why [`admit`] turned a request away.
enum Refused {
    /// Answered with this status alone.
    Status(StatusCode),
    /// Signed for another receiver: `409` naming this one.
    OtherReceiver(Receiver),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Status(status) => status.into_response(),
            Refused::OtherReceiver(me) => {
                (StatusCode::CONFLICT, [(RECEIVER_HEADER, me.to_header())]).into_response()
            }
        }
    }
}

fn reply<A: Serialize>(value: &A) -> Response {
    match encode("rpc reply", value) {
        Ok(bytes) => (StatusCode::OK, bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn append<N: RpcNode>(
    State(node): State<Arc<N>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: AppendEntriesRequest<TypeConfig> = match admit(&*node, &headers, &body, paths::APPEND)
    {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.raft().append_entries(req).await)
}

async fn vote<N: RpcNode>(State(node): State<Arc<N>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: VoteRequest<NodeId> = match admit(&*node, &headers, &body, paths::VOTE) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.raft().vote(req).await)
}

async fn snapshot<N: RpcNode>(
    State(node): State<Arc<N>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: InstallSnapshotRequest<TypeConfig> =
        match admit(&*node, &headers, &body, paths::SNAPSHOT) {
            Ok(r) => r,
            Err(refused) => return refused.into_response(),
        };
    reply(&node.raft().install_snapshot(req).await)
}

async fn write<N: RpcNode>(
    State(node): State<Arc<N>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let cmd: ControlCommand = match admit(&*node, &headers, &body, paths::WRITE) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.local_write(cmd).await)
}

async fn manage<N: RpcNode>(
    State(node): State<Arc<N>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: ManageRequest = match admit(&*node, &headers, &body, paths::MANAGE) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.local_manage(req).await)
}

async fn status<N: RpcNode>(
    State(node): State<Arc<N>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (): () = match admit(&*node, &headers, &body, paths::STATUS) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.local_status())
}

async fn ping<N: RpcNode>(State(node): State<Arc<N>>, headers: HeaderMap, body: Bytes) -> Response {
    let (): () = match admit(&*node, &headers, &body, paths::PING) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    let initialized = node.raft().is_initialized().await.unwrap_or(false);
    reply(&PingReply {
        node: node.id(),
        initialized,
    })
}

async fn take_over<N: RpcNode>(
    State(node): State<Arc<N>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: TakeOver = match admit(&*node, &headers, &body, paths::TAKE_OVER) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.take_over(req).await)
}
