//! The replication data plane: per flow, discover upstream topics and mirror them downstream;
//! per assigned unit (one upstream partition of one flow), copy messages in order to the same
//! partition downstream, exactly once, and confirm progress to the control plane.
//!
//! # Layout
//! By concern, from the bottom up: a module or folder imports only those listed before it (a
//! folder counts as one; see the `crate::` paths in its files).
//! - Crate-wide vocabulary at the top level: [`provenance`] (the headers a copy carries),
//!   `error`, [`ControlPlane`] (the narrow interface to the control plane; [`InMemoryControl`]
//!   implements it for a single node without Raft), `liveness`, `stats` (per-unit meters,
//!   [`UnitStats`], the [`PipelineObserver`]), `params` (the resolved inputs,
//!   [`PipelineParams`]) and `backoff`.
//! - `clients/`: the connections to each cluster, the per-stream activity watchers a source
//!   cluster keeps for its idle readers (`clients::activity`), and the generation probe.
//! - `selection/`: what a flow copies and where: `Selector` (globs; never another flow's
//!   heartbeat topic unless named literally), downstream names, and the topics residency
//!   policies keep from a flow's target (recorded for status and metrics, [`FlowResidency`]).
//! - `fencing/`: writer users on fenced targets ([`TargetFence`]) and the writer connections
//!   logged in as this node's current writer identity.
//! - `datapath/`: one unit's copy: the `reader` polls one upstream partition at explicit
//!   offsets and hands batches to the `writer` through a bounded channel, never through a
//!   mailbox; the writer resumes from the downstream tail, checks its lease and epoch before
//!   every send, stamps provenance and commits offsets (IO around pure cores); and what a
//!   writer sent since it resumed, for the consumer-group sync (`datapath::translate`).
//! - `coordinator/`: the data path's supervision tree of actors: a supervisor restarts the
//!   coordinator, which follows this node's assignments and supervises one actor per flow,
//!   which supervises a reader actor and a writer actor per unit (see its module doc).
//! - `discovery/`: per flow, selects topics, creates or grows them downstream and reports
//!   units; and the flow's heartbeats ([`HeartbeatRecord`]) while this node owns a unit of it.
//! - `sync/`: what a flow keeps in step on its target besides the messages: consumer-group
//!   offsets, users and topic settings, and the cutover `flow promote` asks for ([`Cutover`]).
//! - [`verify`] compares a flow's source and target partitions message by message.
//! - [`Pipeline`] starts, stops ([`Pipeline::shutdown`]) and kills ([`Pipeline::crash`]) an
//!   instance and exposes per-unit [`UnitStats`]; it also holds the checks of
//!   [`PipelineParams::validate`] that compile the flows' selections.
//! - `sim_support` and `bench_support`: the writer's pure cores as the deterministic
//!   simulator (`crates/sim`) and the benches drive them (not a stable API).
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
pub use control::{ControlError, ControlPlane, UnitReport};
pub use coordinator::{TaskKind, TaskStats};
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
pub use stats::{Gap, LatencyQuantiles, NoObserver, Observer, PipelineObserver, UnitStats};
pub use sync::cutover::{Cutover, Extent, UnitExtents};
pub use sync::groups::{FlowSyncState, GroupOffset, GroupSkip, GroupSyncReport};
pub use sync::metadata::pair::SettingConflict;
pub use sync::metadata::settings::SettingDifference;
pub use sync::metadata::users::{password_problem, ActivationOutcome, UserSyncState};
pub use sync::metadata::{
    MetadataSyncReport, MetadataSyncState, TopicSettingsReport, UserActivation, UserReport,
};

#[doc(hidden)]
pub mod bench_support;

#[doc(hidden)]
pub mod sim_support;
