//! The vocabulary every other crate speaks: what a unit of replication work is
//! ([`WorkUnit`]), who owns it under which fence ([`NodeId`], [`Epoch`],
//! [`Assignment`]), how far it has been copied ([`OffsetCommit`],
//! [`CommitOutcome`], [`UnitProgress`]), the per-flow policies
//! ([`Naming`], [`InitialOffset`]), the zone rule of residency policies ([`zones_allow`]) and
//! the protocol generation a cluster speaks ([`IggyVersion`]).
//!
//! This crate owns data types only. It has no async runtime, no IO, no clock and
//! no knowledge of Iggy's SDK, openraft or sled: the pipeline and the control
//! plane both depend on it, and on nothing of each other.
#![warn(missing_docs)]

mod cluster_url;
mod flow;
mod iggy_version;
mod metadata;
mod unit;
mod writer;

pub use cluster_url::{seed_addresses, seed_urls};
pub use flow::{
    heartbeat_topic_parts, zones_allow, InitialOffset, Naming, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_HEARTBEAT_TOPIC,
};
pub use flow::{TopicSetting, DEFAULT_GROUP_SYNC_INTERVAL, DEFAULT_METADATA_SYNC_INTERVAL};
pub use flow::{
    DEFAULT_BATCH_SIZE, DEFAULT_DISCOVERY_INTERVAL, DEFAULT_FAR_SOURCE_POLLS,
    DEFAULT_IDLE_POLL_INTERVAL, DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_IN_FLIGHT_BATCHES,
    DEFAULT_POLL_INTERVAL, DEFAULT_PROVENANCE, DEFAULT_RESTART_BACKOFF_MAX,
    DEFAULT_RESTART_BACKOFF_MIN, MAX_BATCH_SIZE, MAX_FAR_SOURCE_POLLS,
};
pub use iggy_version::IggyVersion;
pub use metadata::{ClusterPair, MetadataChange, MetadataKey, MetadataObject, MetadataRecord};
pub use unit::{
    Assignment, CommitCounters, CommitOutcome, Epoch, NodeId, Offset, OffsetCommit, OffsetReset,
    ProgressCommit, SessionCounters, UnitCounters, UnitProgress, UnitReset, UnitStart, WorkUnit,
};
pub use writer::{is_writer_username, writer_username, WriterLogin};
