//! The test harness of iggy-replicator, shared by the HA scenarios (`tests/ha`), the
//! replication benchmarks (`benches/replication`), the pipeline's end-to-end tests and the
//! `demo` command: Iggy servers to replicate between, topics and producers on them, and
//! clusters of `iggy-replicator run` processes with real faults (`kill -9`, SIGSTOP/SIGCONT,
//! SIGTERM, restarts, membership changes). It owns no replication logic: it drives the binary
//! and the SDK from the outside and reads the admin API, as an operator would.
//!
//! # Layout
//! * `binary`: [`ReplicatorBinary`], the `iggy-replicator` executable, passed in by the caller.
//! * `servers`: [`Servers`], two in-process servers with the replicated topic created
//!   upstream, and [`DevServer`], a `dev-server` process on a port the OS picked.
//! * `topic`: [`Endpoint`] (a server's connection string and Iggy generation), [`Topic`] and
//!   the SDK calls around it: [`connect`] (a [`Client`] of either generation), [`ensure_topic`],
//!   [`delete_stream`], message counts, [`Watch`].
//! * `producer`: [`PacedProducer`] (a rate, optionally a total, pause and resume) and
//!   [`produce_bulk`] (a range of messages per partition, as fast as the server takes them).
//! * `raw_copy`: [`raw_copy`], the benchmarks' baseline: a poll→send loop through the SDK.
//! * `cluster`: [`ReplicatorCluster`] of node processes described by a
//!   [`ReplicatorClusterSpec`]; start, kill, pause, resume, terminate, restart; `/status`,
//!   `/metrics`, `cluster` and `verify` commands.
//! * `node_config`: [`NodeConfig`], [`FlowConfig`] and [`Replication`] (any number of
//!   clusters and flows), a node's config file as an operator writes it (also the demo's
//!   nodes).
//! * `groups`: consumer groups as applications use them ([`store_group_offsets`],
//!   [`group_offset`], [`message_id_at`], [`translated_exactly`]).
//! * `status`: [`Status`], the fields of a node's `GET /status` that the tests read.
//! * `failover`: [`ReplicatorCluster::kill_and_wait_resumed`] and [`wait_resumed`], "kill, then
//!   wait until the victim's partitions are written again", downstream on a [`Servers`] pair,
//!   through a [`Watch`], or on a clustered 0.9 target ([`ClusterTopic`]).
//! * `wait`: [`Deadline`], [`wait_until`], [`tick`] and [`serial`], the polling and scenario
//!   runners.
//!
//! Every process it starts is killed by its pid when its owner is dropped (also when a test
//! fails). Addresses come from the OS (port 0), never from a fixed list. Timings are the control
//! plane's defaults ([`ControlTiming::default`]), read, never copied.

#![warn(missing_docs)]

mod binary;
mod cluster;
mod error;
mod failover;
mod groups;
mod node_config;
mod producer;
mod raw_copy;
mod servers;
mod status;
mod tls;
mod topic;
mod wait;

pub use binary::ReplicatorBinary;
pub use cluster::{
    free_addr, CommandRun, Node, Placement, ReplicatorCluster, ReplicatorClusterSpec, VerifyRun,
};
pub use error::{Error, Result};
pub use failover::{wait_resumed, ClusterTopic, DownstreamCounts, Killed, Resumption, Stalled};
pub use groups::{
    append_again, group_next_message, group_offset, message_id_at, store_group_offsets,
    translated_exactly,
};
pub use node_config::{ClusterEntry, FlowConfig, FlowEntry, NodeConfig, Replication};
pub use producer::{
    produce_bulk, Bulk, MessageShape, PacedProducer, ProducerParams, ProducerReport,
};
pub use raw_copy::{raw_copy, RawCopied, RawCopy};
pub use replicator_control::ControlTiming;
pub use replicator_model::NodeId;
pub use replicator_sdk::{Client, IggyCluster, Message};
pub use servers::{DevServer, Servers};
pub use status::{MemberView, PausedView, PendingResetView, Status, UnitView};
pub use tls::{NodeTls, TestCa};
pub use topic::{
    connect, delete_stream, ensure_topic, partition_counts, partition_ids, partition_messages,
    stream_messages, Endpoint, Target, Topic, Watch,
};
pub use wait::{serial, tick, wait_until, Deadline};

/// What tests, benchmarks and scenarios return (the workspace's test convention).
pub type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
