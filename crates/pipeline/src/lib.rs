//! The replication data plane: per flow, discover upstream topics and mirror them downstream;
//! per assigned unit (one upstream partition of one flow), copy messages in order to the same
//! partition downstream, exactly once, and confirm progress to the control plane.
//!
//! # Layout
//! - [`Pipeline`] starts, stops ([`Pipeline::shutdown`]) and kills ([`Pipeline::crash`]) an
//!   instance and exposes per-unit [`UnitStats`].
//! - `coordinator`, the data path's supervision tree of actors: a supervisor restarts the
//!   coordinator, which follows this node's assignments and supervises one actor per flow,
//!   which supervises a reader actor and a writer actor per unit (see its module doc).
//! - `reader` polls one upstream partition at explicit offsets; batches go to the writer through
//!   a bounded channel, never through a mailbox; once its partition is idle it waits for
//!   `activity`, a per-topic watcher that reads topic metadata instead of every partition.
//! - `writer` resumes after the highest of the confirmed offset and the last offset found in the
//!   downstream tail, checks its lease and epoch before every send, stamps provenance and
//!   commits offsets (its pure cores: `writer::resume`, `prepare`, `send`, `commit`).
//! - `discovery` selects topics by glob (never another flow's heartbeat topic unless named
//!   literally), creates or grows them downstream, reports units.
//! - `residency` decides which selected topics a residency policy keeps from a flow's target
//!   (never created there, never copied, no group synced on them, no heartbeats to them) and
//!   records them for status and metrics ([`FlowResidency`]).
//! - `heartbeat` writes a [`HeartbeatRecord`] per flow and interval to the target while this
//!   node owns a unit of the flow, through the writers' connections.
//! - [`ControlPlane`] is the narrow interface to the control plane; [`InMemoryControl`]
//!   implements it for a single node without Raft.
//! - [`verify`] compares a flow's source and target partitions message by message.
//! - `sim_support`: the writer's pure cores as the deterministic simulator (`crates/sim`)
//!   drives them (not a stable API).
//!
//! The pipeline knows nothing of Raft, sled or openraft (the binary adapts the control crate to
//! [`ControlPlane`]) and reads no config files.
#![warn(missing_docs)]

mod backoff;
mod clients;
mod control;
mod coordinator;
mod datapath;
mod discovery;
mod error;
mod fencing;

mod liveness;
mod memory;
mod params;
mod pipeline;
pub mod provenance;
mod selection;
mod stats;
mod sync;
pub mod verify;

pub use backoff::{next_backoff, with_jitter};
pub use clients::probe::{check_generations, probe, GenerationMismatch, Spoken, PROBE_TIMEOUT};
pub use clients::ConnectionState;
pub use control::{ControlError, ControlPlane};
pub use datapath::writer::LandedMismatch;
pub use discovery::heartbeat::{HeartbeatRecord, HeartbeatStats, HEARTBEAT_HEADER};
pub use error::{Error, Result};
pub use fencing::fence::{FenceSetupError, TargetFence};
pub use liveness::Liveness;
pub use memory::{InMemoryControl, InMemoryLease};
pub use params::{BackoffParams, ClusterParams, FlowParams, PipelineParams, PolicyParams};
pub use pipeline::Pipeline;
pub use selection::mapping::{downstream_stream, Selector};
pub use selection::residency::{BlockedTopic, FlowResidency};
pub use stats::{Gap, NoObserver, Observer, PipelineObserver, UnitStats};
pub use sync::cutover::{Cutover, Extent, UnitExtents};
pub use sync::groups::{FlowSyncState, GroupOffset, GroupSkip, GroupSyncReport};
pub use sync::metadata::settings::SettingDifference;
pub use sync::metadata::users::{password_problem, ActivationOutcome, UserSyncState};
pub use sync::metadata::{
    MetadataSyncReport, MetadataSyncState, TopicSettingsReport, UserActivation, UserReport,
};

#[doc(hidden)]
pub mod bench_support;

#[doc(hidden)]
pub mod sim_support;
