//! Inbound RPCs: an axum router over a pre-bound listener. Every handler first checks the
//! fault switch and the request's signature, receiver and stamp (`auth`), then decodes the
//! bincode body and answers in bincode.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use replicator_model::NodeId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::auth::{now_millis, AuthError, Receiver, AUTH_HEADER, RECEIVER_HEADER};
use super::{paths, ManageRequest, PingReply};
use crate::command::{decode, encode, ControlCommand};
use crate::node::NodeInner;
use crate::tls::TlsState;
use crate::TypeConfig;

/// Serves Raft and control RPCs on `listener` until `shutdown` is cancelled; over mutual TLS
/// when `tls` is given (each connection uses the configuration current when it was accepted).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    node: Arc<NodeInner>,
    shutdown: CancellationToken,
    tls: Option<Arc<TlsState>>,
) -> std::io::Result<()> {
    let router = Router::new()
        .route(paths::APPEND, post(append))
        .route(paths::VOTE, post(vote))
        .route(paths::SNAPSHOT, post(snapshot))
        .route(paths::WRITE, post(write))
        .route(paths::MANAGE, post(manage))
        .route(paths::STATUS, post(status))
        .route(paths::PING, post(ping))
        .layer(axum::extract::DefaultBodyLimit::max(super::MAX_RPC_BODY))
        .with_state(node);
    match tls {
        None => {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
        Some(tls) => {
            serve_tls(listener, router, shutdown, move || tls.get().server).await;
            Ok(())
        }
    }
}

/// How long a peer may take for its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Accepts TLS connections and serves `router` on each until `shutdown`; connections still
/// open then are closed.
pub(crate) async fn serve_tls<F>(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
    config: F,
) where
    F: Fn() -> Arc<rustls::ServerConfig> + Send + Sync + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(config());
        let router = router.clone();
        connections.spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "refused a tls connection");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%peer, "tls handshake timed out");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let served =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// Checks the fault switch, the signature, the receiver and that the request is no replay;
/// decodes the body. A request signed for another node or run is answered `409` with this
/// run's [`Receiver`] in [`RECEIVER_HEADER`], for the sender to sign again (`auth`,
/// "Learning a receiver's boot id"); the other refusals are `401`.
fn admit<Q: DeserializeOwned>(
    node: &NodeInner,
    headers: &HeaderMap,
    body: &[u8],
    path: &'static str,
) -> Result<Q, Refused> {
    if node.fault.is_isolated() {
        return Err(Refused::Status(StatusCode::SERVICE_UNAVAILABLE));
    }
    let checked = node.inbound.authenticate(
        &node.signer,
        path,
        body,
        headers.get(AUTH_HEADER).map(|v| v.as_bytes()),
        now_millis(),
    );
    match checked {
        Ok(()) => {}
        Err(reason) if reason.is_other_receiver() => {
            if let AuthError::OtherNode { .. } = reason {
                tracing::warn!(node = %node.id, path, %reason, "refused an rpc signed for another node");
            } else {
                // Routine: a peer's first request, or its first since this node restarted.
                tracing::debug!(node = %node.id, path, %reason, "asked an rpc's sender to sign for this run");
            }
            return Err(Refused::OtherReceiver(node.inbound.me()));
        }
        Err(reason) => {
            tracing::warn!(node = %node.id, path, %reason, "refused an unauthenticated rpc");
            return Err(Refused::Status(StatusCode::UNAUTHORIZED));
        }
    }
    decode(path, body).map_err(|e| {
        tracing::warn!(node = %node.id, path, error = %e, "undecodable rpc body");
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

async fn append(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: AppendEntriesRequest<TypeConfig> = match admit(&node, &headers, &body, paths::APPEND) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.raft.append_entries(req).await)
}

async fn vote(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: VoteRequest<NodeId> = match admit(&node, &headers, &body, paths::VOTE) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.raft.vote(req).await)
}

async fn snapshot(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: InstallSnapshotRequest<TypeConfig> =
        match admit(&node, &headers, &body, paths::SNAPSHOT) {
            Ok(r) => r,
            Err(refused) => return refused.into_response(),
        };
    reply(&node.raft.install_snapshot(req).await)
}

async fn write(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let cmd: ControlCommand = match admit(&node, &headers, &body, paths::WRITE) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.local_write(cmd).await)
}

async fn manage(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let req: ManageRequest = match admit(&node, &headers, &body, paths::MANAGE) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.local_manage(req).await)
}

async fn status(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let (): () = match admit(&node, &headers, &body, paths::STATUS) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    reply(&node.local_status())
}

async fn ping(State(node): State<Arc<NodeInner>>, headers: HeaderMap, body: Bytes) -> Response {
    let (): () = match admit(&node, &headers, &body, paths::PING) {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    let initialized = node.raft.is_initialized().await.unwrap_or(false);
    reply(&PingReply {
        node: node.id,
        initialized,
    })
}
