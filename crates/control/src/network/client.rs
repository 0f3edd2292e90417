//! Outbound RPCs: a shared reqwest client that signs every request for its receiver (learning
//! each peer's boot id as `auth` describes), and openraft's network factory on top of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use replicator_model::NodeId;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::auth::{now_millis, BootId, Receiver, Signer, Stamp, AUTH_HEADER, RECEIVER_HEADER};
use super::ballot::{self, Ballots};
use super::gone::{shows_peer_gone, GonePeers};
use super::{paths, FaultSwitch};
use crate::command::{decode, encode};
use crate::params::ClusterSecret;
use crate::tls::TlsConfigs;
use crate::{MemberNode, TypeConfig};

/// Why an RPC got no answer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CallError {
    /// Connecting or sending failed, or the request timed out.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The test fault switch cut this node off.
    #[error("network cut by fault switch")]
    Isolated,
    /// The peer refused the request's signature (another cluster secret, clocks apart, or a
    /// member of an older version, which refuses `v2` signatures).
    #[error("peer refused the request's signature (cluster secret, clock, or an older version)")]
    Unauthorized,
    /// The address serves another node than the one the request was for (a moved address,
    /// or a misconfiguration).
    #[error("the peer at this address is node {found}, not node {expected}")]
    WrongNode {
        /// The node the request was for.
        expected: NodeId,
        /// The node that answered.
        found: NodeId,
    },
    /// The peer refused the retry too, as signed for another run of it: it restarted again
    /// in between, or its answers are tampered with.
    #[error("peer refused the request twice as signed for another run of it (restarting?)")]
    OtherRun,
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

/// Sends authenticated requests to peers. Cheap to clone (clones share the HTTP client, which
/// is replaced when the TLS files are reloaded).
#[derive(Clone)]
pub(crate) struct PeerClient {
    http: Arc<RwLock<reqwest::Client>>,
    /// `https` with mutual TLS, `http` without.
    scheme: &'static str,
    signer: Signer,
    fault: Arc<FaultSwitch>,
    /// Per peer address, the receiver it last named in a `409` answer: requests to that
    /// node are signed for that boot id until the peer names another.
    receivers: Arc<Mutex<HashMap<String, Receiver>>>,
    /// Requests sent since start (the `control_requests_sent` metric).
    sent: Arc<AtomicU64>,
    /// Which peers' calls show their process gone (see `gone`).
    gone: Arc<Mutex<GonePeers>>,
    /// Told when a peer was just shown gone: the leader's assignment loop waits on it, so that
    /// the fence does not wait for its next tick.
    pub(crate) peer_gone: Arc<tokio::sync::Notify>,
    /// The answers to this node's latest election (see `ballot`).
    ballots: Arc<Mutex<Ballots>>,
    /// Told when a voter answered one of this node's vote requests: the assignment loop, which
    /// calls the next election after a split, waits on it.
    pub(crate) vote_answered: Arc<tokio::sync::Notify>,
}

/// What a peer answered, when it answered at all.
enum Answer {
    /// `200`, with this body.
    Ok(Bytes),
    /// `409`: the request was signed for another receiver; the peer's own, if readable.
    OtherReceiver(Option<Receiver>),
}

/// The receiver to sign the next attempt for, after a request signed for `sent` was refused
/// as signed for another receiver and the peer named `answered` (`None`: no readable
/// [`RECEIVER_HEADER`]); `retried` says whether that was already the second attempt. One
/// retry, for the same node only: the answer is not authenticated, and trusting it costs at
/// most this call (see `auth`, "Learning a receiver's boot id").
fn after_other_receiver(
    sent: Receiver,
    answered: Option<Receiver>,
    retried: bool,
) -> Result<Receiver, CallError> {
    match answered {
        None => Err(CallError::Status(409)),
        Some(peer) if peer.node != sent.node => Err(CallError::WrongNode {
            expected: sent.node,
            found: peer.node,
        }),
        Some(peer) if retried || peer.boot == sent.boot => Err(CallError::OtherRun),
        Some(peer) => Ok(peer),
    }
}

/// How long a connection to a peer stays open without a request.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often every member calls every other (`node::run_peer_warmer`): well within
/// [`POOL_IDLE_TIMEOUT`], so the connections stay open, and soon after a peer restarted, so
/// its new boot id is known before a vote needs it.
pub(crate) const PEER_WARM_INTERVAL: Duration = Duration::from_secs(3);

/// The HTTP client for peer RPCs; with `tls` it presents this node's certificate and trusts
/// only the cluster's CA.
fn http_client(tls: Option<&TlsConfigs>) -> crate::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT);
    if let Some(tls) = tls {
        builder = builder.tls_backend_preconfigured(tls.client.clone());
    }
    builder
        .build()
        .map_err(|e| crate::Error::InvalidParams(format!("rpc client: {e}")))
}

/// `e` with its causes: reqwest's own message ("error sending request") hides whether a
/// connection was refused or a TLS handshake failed.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl PeerClient {
    pub(crate) fn new(
        secret: &ClusterSecret,
        fault: Arc<FaultSwitch>,
        tls: Option<&TlsConfigs>,
    ) -> crate::Result<Self> {
        Ok(Self {
            http: Arc::new(RwLock::new(http_client(tls)?)),
            scheme: if tls.is_some() { "https" } else { "http" },
            signer: Signer::new(secret),
            fault,
            receivers: Arc::default(),
            sent: Arc::default(),
            gone: Arc::default(),
            peer_gone: Arc::default(),
            ballots: Arc::default(),
            vote_answered: Arc::default(),
        })
    }

    /// The peers whose calls show their process gone, each with the first failure of the run (see
    /// `gone`).
    pub(crate) fn gone_peers(&self) -> std::collections::BTreeMap<NodeId, super::gone::Gone> {
        self.gone_lock().gone()
    }

    pub(crate) fn ballots_lock(&self) -> std::sync::MutexGuard<'_, Ballots> {
        self.ballots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn gone_lock(&self) -> std::sync::MutexGuard<'_, GonePeers> {
        self.gone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records what the outcome of a call to `peer` says about its process.
    fn note_reach(&self, peer: NodeId, error: Option<&reqwest::Error>) {
        match error {
            None => self.gone_lock().answered(peer),
            Some(e) if shows_peer_gone(e) => {
                if self.gone_lock().failed(peer, Instant::now()) {
                    self.peer_gone.notify_one();
                }
            }
            Some(_) => {}
        }
    }

    /// Requests this node sent to other members since start, whatever their answer: Raft
    /// replication, votes and snapshots, writes forwarded to the leader, status and
    /// membership calls, each retry counted.
    pub(crate) fn requests_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Uses reloaded TLS material for the next connections (open ones finish as they are).
    pub(crate) fn use_tls(&self, tls: &TlsConfigs) {
        match http_client(Some(tls)) {
            Ok(client) => {
                *self
                    .http
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = client;
            }
            Err(e) => tracing::warn!(error = %e, "reloaded tls material not usable for rpc client"),
        }
    }

    /// POSTs `req` to node `target` at `addr` + `path` and decodes the answer.
    pub(crate) async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        target: NodeId,
        addr: &str,
        path: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let body = encode("rpc request", req).map_err(|e| CallError::Codec(e.to_string()))?;
        self.call_encoded(target, addr, path, body, timeout).await
    }

    /// [`Self::call`] with a body the caller encoded already (to know its size). Signed for
    /// the boot id last learnt from `addr`; when the peer answers with another one (its first
    /// contact, or it restarted), sent once more signed for that, within the same `timeout`.
    pub(crate) async fn call_encoded<A: DeserializeOwned>(
        &self,
        target: NodeId,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<A, CallError> {
        let deadline = Instant::now() + timeout;
        let body = Bytes::from(body);
        let mut to = self.receiver_at(target, addr);
        let mut retried = false;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(CallError::Unreachable(format!(
                    "timed out before the retry signed for boot id {}",
                    to.boot
                )));
            }
            match self.send(addr, path, body.clone(), to, remaining).await? {
                Answer::Ok(bytes) => {
                    return decode("rpc reply", &bytes).map_err(|e| CallError::Codec(e.to_string()))
                }
                Answer::OtherReceiver(answered) => {
                    if let Some(peer) = answered.filter(|peer| peer.node == target) {
                        self.learn(addr, peer);
                    }
                    to = after_other_receiver(to, answered, retried)?;
                    retried = true;
                }
            }
        }
    }

    /// The receiver to sign a request to node `target` at `addr` for: the run that address
    /// last named, if it is that node's; otherwise the unknown run, which the peer answers
    /// with its boot id.
    fn receiver_at(&self, target: NodeId, addr: &str) -> Receiver {
        let receivers = self
            .receivers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match receivers.get(addr) {
            Some(known) if known.node == target => *known,
            _ => Receiver {
                node: target,
                boot: BootId::UNKNOWN,
            },
        }
    }

    fn learn(&self, addr: &str, peer: Receiver) {
        self.receivers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(addr.to_string(), peer);
    }

    /// One signed POST.
    async fn send(
        &self,
        addr: &str,
        path: &str,
        body: Bytes,
        to: Receiver,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        if self.fault.is_isolated() {
            return Err(CallError::Isolated);
        }
        let http = self
            .http
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        self.sent.fetch_add(1, Ordering::Relaxed);
        let resp = http
            .post(format!("{}://{addr}{path}", self.scheme))
            .header(
                AUTH_HEADER,
                self.signer.sign(
                    path,
                    &body,
                    to,
                    Stamp {
                        millis: now_millis(),
                        nonce: rand::random(),
                    },
                ),
            )
            .header("content-type", "application/octet-stream")
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .inspect_err(|e| self.note_reach(to.node, Some(e)))
            .map_err(|e| CallError::Unreachable(with_causes(&e)))?;
        self.note_reach(to.node, None);
        match resp.status().as_u16() {
            200 => {}
            401 => return Err(CallError::Unauthorized),
            409 => {
                let answered = resp
                    .headers()
                    .get(RECEIVER_HEADER)
                    .and_then(|v| Receiver::from_header(v.as_bytes()));
                return Ok(Answer::OtherReceiver(answered));
            }
            other => return Err(CallError::Status(other)),
        }
        let bytes = resp
            .bytes()
            .await
            .inspect_err(|e| self.note_reach(to.node, Some(e)))
            .map_err(|e| CallError::Unreachable(with_causes(&e)))?;
        if self.fault.is_isolated() {
            return Err(CallError::Isolated);
        }
        Ok(Answer::Ok(bytes))
    }
}

/// openraft's connection factory.
pub(crate) struct NetworkFactory {
    pub(crate) client: PeerClient,
    pub(crate) default_timeout: Duration,
    /// The first pause before openraft calls an unreachable peer again (the heartbeat
    /// interval); see [`unreachable_backoff`].
    pub(crate) first_retry: Duration,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> Connection {
        Connection {
            target,
            addr: node.raft_addr.clone(),
            client: self.client.clone(),
            default_timeout: self.default_timeout,
            first_retry: self.first_retry,
            timed_out_entries: AtomicU64::new(0),
        }
    }
}

/// Most openraft waits before calling an unreachable peer again (its own default).
const MAX_UNREACHABLE_BACKOFF: Duration = Duration::from_millis(500);

/// The pauses before the calls that follow an unreachable one: `first`, doubling up to
/// [`MAX_UNREACHABLE_BACKOFF`]. The second call comes soon because two failures in a row show
/// a dead peer (`gone`), which the leader then fences without waiting out `fence_after`; the
/// later ones slow down to openraft's default pace for a peer that stays down.
pub(crate) fn unreachable_backoff(first: Duration) -> impl Iterator<Item = Duration> + Send {
    let cap = MAX_UNREACHABLE_BACKOFF.max(first);
    std::iter::successors(Some(first), move |d| Some((*d * 2).min(cap)))
}

/// One peer as openraft's replication sees it.
pub(crate) struct Connection {
    target: NodeId,
    addr: String,
    client: PeerClient,
    default_timeout: Duration,
    first_retry: Duration,
    /// Entries of the latest AppendEntries that openraft cancelled at its timeout (0: none
    /// since the last shrink). Written by [`CancelledAppend`] on drop.
    timed_out_entries: AtomicU64,
}

/// The number of entries to ask openraft for instead of `entries`, after an AppendEntries of
/// `timed_out_with` entries did not finish within openraft's timeout (one heartbeat interval,
/// which openraft applies to every AppendEntries whatever its size, and after which it resends
/// the same range unchanged). Halving until a request fits turns a livelock on a slow
/// follower into smaller requests; a single entry cannot shrink and is simply retried.
pub(crate) fn shrink_after_timeout(entries: u64, timed_out_with: u64) -> Option<u64> {
    (timed_out_with > 1 && entries >= timed_out_with).then(|| (timed_out_with / 2).max(1))
}

/// Records an AppendEntries that was dropped before it finished (openraft's timeout).
struct CancelledAppend<'a> {
    slot: &'a AtomicU64,
    target: NodeId,
    entries: u64,
    bytes: usize,
    finished: bool,
}

impl Drop for CancelledAppend<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.slot.store(self.entries, Ordering::Relaxed);
            tracing::warn!(
                peer = %self.target,
                entries = self.entries,
                bytes = self.bytes,
                "append entries did not finish within the heartbeat interval"
            );
        }
    }
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
        let body = encode("rpc request", req)
            .map_err(|e| RPCError::Network(NetworkError::new(&CallError::Codec(e.to_string()))))?;
        self.rpc_encoded(path, body, option).await
    }

    async fn rpc_encoded<A, E>(
        &self,
        path: &str,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> RpcResult<A, E>
    where
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
            .call_encoded(self.target, &self.addr, path, body, timeout)
            .await
            .map_err(|e| match e {
                // No such node at that address: back off as from a node that is down.
                CallError::Unreachable(_) | CallError::Isolated | CallError::WrongNode { .. } => {
                    RPCError::Unreachable(Unreachable::new(&e))
                }
                CallError::Unauthorized
                | CallError::OtherRun
                | CallError::Status(_)
                | CallError::Codec(_) => RPCError::Network(NetworkError::new(&e)),
            })?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// How many entries to send instead of `entries` whose request is `bytes` long, when that is
/// above what the receiver accepts (`MAX_RPC_BODY`): proportionally fewer, with room to spare.
/// A single entry always fits (`MAX_ENTRY_BYTES` bounds every write).
fn shrink_to_fit(entries: u64, bytes: usize) -> Option<u64> {
    if bytes <= super::MAX_RPC_BODY || entries <= 1 {
        return None;
    }
    let fits = (entries as u128 * super::MAX_RPC_BODY as u128 / 2 / bytes as u128) as u64;
    Some(fits.clamp(1, entries - 1))
}

impl RaftNetwork<TypeConfig> for Connection {
    fn backoff(&self) -> Backoff {
        Backoff::new(unreachable_backoff(self.first_retry))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let entries = rpc.entries.len() as u64;
        let timed_out_with = self.timed_out_entries.load(Ordering::Relaxed);
        if let Some(hint) = shrink_after_timeout(entries, timed_out_with) {
            self.timed_out_entries.store(0, Ordering::Relaxed);
            tracing::info!(peer = %self.target, entries, hint, "asking for smaller append entries");
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        let body = encode("rpc request", &rpc)
            .map_err(|e| RPCError::Network(NetworkError::new(&CallError::Codec(e.to_string()))))?;
        if let Some(hint) = shrink_to_fit(entries, body.len()) {
            tracing::debug!(peer = %self.target, entries, bytes = body.len(), hint, "append entries above the body limit: asking for fewer");
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        tracing::trace!(peer = %self.target, entries, bytes = body.len(), "append entries");
        let mut cancelled = CancelledAppend {
            slot: &self.timed_out_entries,
            target: self.target,
            entries,
            bytes: body.len(),
            finished: false,
        };
        let result = self.rpc_encoded(paths::APPEND, body, &option).await;
        cancelled.finished = true;
        result
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
        let term = rpc.vote.leader_id().term;
        self.client.ballots_lock().asked(term, rpc.last_log_id);
        let answer: RpcResult<VoteResponse<NodeId>> = self.rpc(paths::VOTE, &rpc, &option).await;
        if let Ok(resp) = &answer {
            self.client.ballots_lock().answered(
                term,
                self.target,
                ballot::Answer {
                    last_log: resp.last_log_id,
                    granted: resp.vote_granted,
                },
            );
            self.client.vote_answered.notify_one();
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::{after_other_receiver, BootId, CallError, Receiver};
    use super::{shrink_after_timeout, shrink_to_fit};
    use crate::network::MAX_RPC_BODY;

    #[test]
    fn an_append_above_the_body_limit_asks_for_proportionally_fewer_entries() {
        check!(shrink_to_fit(300, MAX_RPC_BODY) == None);
        check!(
            shrink_to_fit(1, MAX_RPC_BODY * 3) == None,
            "one entry always fits"
        );
        // Four times the limit: an eighth of the entries (half of what would just fit).
        check!(shrink_to_fit(300, MAX_RPC_BODY * 4) == Some(37));
        // Just above: fewer, never all of them.
        check!(shrink_to_fit(2, MAX_RPC_BODY + 1) == Some(1));
    }

    const A: BootId = BootId(0xaaaa);
    const B: BootId = BootId(0xbbbb);

    fn node(node: u64, boot: BootId) -> Receiver {
        Receiver { node, boot }
    }

    #[test]
    fn a_request_refused_for_another_run_is_signed_again_once_for_the_run_the_peer_named() {
        // First contact: signed for the unknown run, the peer names its own.
        check!(
            after_other_receiver(node(2, BootId::UNKNOWN), Some(node(2, A)), false)
                == Ok(node(2, A))
        );
        // The peer restarted since: its new run.
        check!(after_other_receiver(node(2, A), Some(node(2, B)), false) == Ok(node(2, B)));
        // Refused again after the retry: it restarted once more, or someone feeds us boot
        // ids. No third attempt.
        check!(
            after_other_receiver(node(2, B), Some(node(2, A)), true) == Err(CallError::OtherRun)
        );
        // Refused though signed for the run it names: nothing to gain from a retry.
        check!(
            after_other_receiver(node(2, A), Some(node(2, A)), false) == Err(CallError::OtherRun)
        );
    }

    #[test]
    fn a_refusal_from_another_node_or_without_a_receiver_ends_the_call() {
        check!(
            after_other_receiver(node(2, A), Some(node(3, B)), false)
                == Err(CallError::WrongNode {
                    expected: 2,
                    found: 3
                })
        );
        check!(after_other_receiver(node(2, A), None, false) == Err(CallError::Status(409)));
    }

    #[test]
    fn an_unreachable_peer_is_called_again_soon_then_at_openrafts_pace() {
        let ms = std::time::Duration::from_millis;
        let pauses: Vec<_> = super::unreachable_backoff(ms(100)).take(5).collect();
        check!(pauses == [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        // A heartbeat interval above the cap (members far apart) is kept as it is.
        let pauses: Vec<_> = super::unreachable_backoff(ms(800)).take(2).collect();
        check!(pauses == [ms(800), ms(800)]);
    }

    #[test]
    fn a_timed_out_append_is_halved_until_it_is_one_entry() {
        // Nothing timed out: send as openraft built it.
        check!(shrink_after_timeout(300, 0) == None);
        // 300 entries timed out: the resend of the same range asks for 150.
        check!(shrink_after_timeout(300, 300) == Some(150));
        // Openraft already resends fewer than the request that timed out: let it go.
        check!(shrink_after_timeout(100, 300) == None);
        check!(shrink_after_timeout(150, 150) == Some(75));
        check!(shrink_after_timeout(3, 3) == Some(1));
        check!(shrink_after_timeout(2, 2) == Some(1));
        // One entry cannot be split: retry it as it is.
        check!(shrink_after_timeout(1, 1) == None);
        check!(shrink_after_timeout(5, 1) == None);
    }
}
