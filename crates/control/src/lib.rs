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
//! - `fence`: fencing failed members at the target clusters (the leader's side).
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
mod format;
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

/// The openraft configuration for `timing`, validated.
pub(crate) fn raft_config(timing: &ControlTiming) -> Result<openraft::Config> {
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    openraft::Config {
        cluster_name: "iggy-replicator".into(),
        heartbeat_interval: millis(timing.heartbeat_interval),
        election_timeout_min: millis(timing.election_timeout_min),
        election_timeout_max: millis(timing.election_timeout_max),
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(timing.snapshot_logs_since_last),
        max_in_snapshot_log_to_keep: timing.logs_to_keep_after_snapshot,
        install_snapshot_timeout: millis(timing.rpc_timeout),
        snapshot_max_chunk_size: network::SNAPSHOT_CHUNK_BYTES,
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::InvalidParams(e.to_string()))
}

#[doc(hidden)]
pub mod bench_support;

#[doc(hidden)]
pub mod sim_support;

#[cfg(test)]
mod storage_suite;
