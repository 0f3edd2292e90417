//! The Raft control plane of iggy-replicator: which instance copies which work unit under
//! which fencing epoch, and how far every unit has been confirmed written downstream.
//!
//! # Layout
//! - `command`: `ControlCommand`, the only payload written to the Raft log (bincode, append-only
//!   variants, golden-bytes test).
//! - `state`: the replicated `ControlState` and its deterministic `apply`.
//! - `assign`: the leader's pure assignment decision (balanced, sticky, lease-aware).
//! - `log_store`, `state_machine`, `data_dir`: openraft v2 storage on sled, durable before
//!   acknowledged; data dir validation.
//! - `network`: authenticated HTTP transport (axum server, reqwest client, bincode bodies)
//!   for Raft RPCs and forwarded writes.
//! - `node`: the running node's tasks: lease renewer, commit batcher, assignment loop,
//!   bootstrap.
//! - `api`: the public [`Control`] handle and the [`ClusterStatus`] it reports.
//! - `fence`: what fencing at the target clusters works with ([`Fencing`], [`FenceTopology`]);
//!   `fence_ops`: the leader's fencing operations (the node hands itself to them as a
//!   `FenceNode`, as it does to the RPC server as a `network::server::RpcNode`: neither reaches
//!   into `node`).
//! - `tls`: mutual TLS between members ([`TlsFiles`]), reloaded when the files change.
//! - `sim_support`: what the deterministic simulator (`crates/sim`) drives (not a stable API).
//!
//! # Never two owners
//! How leases, revokes and epochs keep a unit from having two writers is argued once, in the
//! repository's ARCHITECTURE.md ("Never two owners"); [`ControlTiming`] holds the numbers and
//! `lease` the arithmetic, with tests.
#![warn(missing_docs)]

mod api;
mod assign;
mod command;
mod data_dir;
mod error;
mod fence;
mod fence_ops;
mod format;
mod handover;
mod identity;
mod lease;
mod log_store;
mod network;
mod node;
mod params;
mod retention;
mod state;
mod state_machine;
pub mod tls;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use api::{
    ClusterStatus, Control, ControlMetrics, MemberStatus, PausedFlow, PendingReset, ResetRefusal,
    UnitStatus,
};
pub use error::{Error, Result};
pub use fence::{FenceFuture, FenceTopology, Fencing, WriterFence};
pub use format::SUPPORTED_LEVEL as SUPPORTED_FEATURE_LEVEL;
pub use params::{ClusterSecret, ControlParams, ControlTiming};
pub use state::MemberState;
pub use tls::TlsFiles;

/// What openraft knows about a node: where to reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberNode {
    /// Advertised Raft RPC address, e.g. `10.0.0.1:7100`.
    pub(crate) raft_addr: String,
}

openraft::declare_raft_types!(
    /// The Raft type configuration of the control plane.
    pub(crate) TypeConfig:
        D = command::ControlCommand,
        R = command::ControlResponse,
        NodeId = replicator_model::NodeId,
        Node = MemberNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// Only for this crate's criterion benches (feature `bench`, which the benches turn on through
/// the crate's dev-dependency on itself): never in a production build.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench_support;

#[doc(hidden)]
pub mod sim_support;

#[cfg(test)]
mod storage_suite;
