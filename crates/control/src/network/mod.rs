//! The authenticated transport between nodes: HTTP POSTs with bincode bodies, served by axum
//! (`server`) and sent with reqwest (`client`). Every request is signed with the cluster
//! secret for one receiver (`auth`: an HMAC of path, receiving node and its boot id,
//! timestamp, nonce and body; the secret itself never travels). The server refuses a wrong
//! signature, a stale timestamp or a replay (401, `warn`), and answers a request signed for
//! another node or another run of itself with its own node and boot id (409), which the client
//! learns and signs one retry for.
//!
//! Besides openraft's three RPCs the same channel carries writes forwarded from followers to
//! the leader, membership changes, status queries, the bootstrap ping and a stopping leader's
//! request that a follower take over (`handover`).

pub(crate) mod auth;
pub(crate) mod ballot;
pub(crate) mod client;
pub(crate) mod gone;
pub(crate) mod server;

use std::sync::atomic::{AtomicBool, Ordering};

use replicator_model::NodeId;
use serde::{Deserialize, Serialize};

use crate::command::ControlResponse;

/// Largest request body a node accepts (axum's default is 2 MiB, below a large `ReportUnits`
/// entry or a snapshot chunk). Append batches are split below it (`client`), snapshots are
/// sent in [`SNAPSHOT_CHUNK_BYTES`] chunks, and no single entry may exceed [`MAX_ENTRY_BYTES`].
pub(crate) const MAX_RPC_BODY: usize = 64 << 20;

/// Bytes per snapshot chunk (openraft's `snapshot_max_chunk_size`), set explicitly so that it
/// stays far below [`MAX_RPC_BODY`] whatever openraft's default becomes.
pub(crate) const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;

/// Largest encoded command a node writes: one append of it, with the request around it, fits
/// in [`MAX_RPC_BODY`]. A write above it is refused with a clear error instead of stalling the
/// log for ever.
pub(crate) const MAX_ENTRY_BYTES: usize = MAX_RPC_BODY / 2;

/// Request paths, one per RPC.
pub(crate) mod paths {
    /// openraft AppendEntries.
    pub(crate) const APPEND: &str = "/raft/append";
    /// openraft Vote.
    pub(crate) const VOTE: &str = "/raft/vote";
    /// openraft InstallSnapshot (chunked).
    pub(crate) const SNAPSHOT: &str = "/raft/snapshot";
    /// A `ControlCommand` forwarded to the leader.
    pub(crate) const WRITE: &str = "/control/write";
    /// A membership change forwarded to the leader.
    pub(crate) const MANAGE: &str = "/control/manage";
    /// Cluster status, answered by the leader.
    pub(crate) const STATUS: &str = "/control/status";
    /// Liveness and initialisation probe used by bootstrap.
    pub(crate) const PING: &str = "/control/ping";
    /// A stopping leader asks a follower to call an election now (`handover`).
    pub(crate) const TAKE_OVER: &str = "/control/take-over";
}

/// A test seam that cuts a node off the network in both directions (incoming requests get
/// 503, outgoing ones fail as unreachable), like pulling its cable.
#[derive(Debug, Default)]
pub(crate) struct FaultSwitch {
    isolated: AtomicBool,
}

impl FaultSwitch {
    pub(crate) fn set_isolated(&self, isolated: bool) {
        self.isolated.store(isolated, Ordering::SeqCst);
    }

    pub(crate) fn is_isolated(&self) -> bool {
        self.isolated.load(Ordering::SeqCst)
    }
}

/// The leader's answer to a forwarded write or membership change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WriteReply {
    /// Applied at `index` with this response.
    Applied {
        /// Log index of the entry.
        index: u64,
        /// What apply returned.
        response: ControlResponse,
    },
    /// The receiver is not the leader; try `leader` if known.
    ForwardToLeader {
        /// The leader the receiver knows of.
        leader: Option<NodeId>,
    },
    /// The operation failed on the leader.
    Failed {
        /// What failed.
        reason: String,
        /// Whether retrying can help.
        transient: bool,
    },
}

/// A membership change executed by the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ManageRequest {
    /// Add as learner, wait until it caught up, then make it a voter.
    AddVoter {
        /// The new node.
        id: NodeId,
        /// Its Raft address.
        raft_addr: String,
    },
    /// Remove from the Raft membership (voter or learner).
    RemoveNode {
        /// The node to remove.
        id: NodeId,
    },
}

/// A stopping leader's request to a follower to call an election at once ([`paths::TAKE_OVER`],
/// `handover`): the leader has stopped writing, and `last_log_index` is the last entry of its
/// log, which the follower's log must hold before it calls (the leader votes only for a log
/// at least as long as its own).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TakeOver {
    /// The leader asking.
    pub(crate) leader: NodeId,
    /// Its term.
    pub(crate) term: u64,
    /// The index of the last entry of its log.
    pub(crate) last_log_index: u64,
}

/// Answer to [`paths::TAKE_OVER`]: whether the follower called the election, and if not, why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum TakeOverReply {
    /// The election is called.
    Called,
    /// Not called.
    Declined {
        /// Why.
        reason: String,
    },
}

/// Answer to [`paths::PING`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PingReply {
    /// The answering node.
    pub(crate) node: NodeId,
    /// Whether its Raft state is initialised (it belongs to a cluster already).
    pub(crate) initialized: bool,
}
