//! An Iggy-server-0.8.0-compatible TCP server that runs inside a test, a bench or the `demo`
//! command, and that the unmodified `iggy = "=0.10.0"` SDK talks to over real TCP. It is the
//! upstream and downstream cluster of every end-to-end test of this project, so it follows the
//! real server's framing, layouts, id allocation, error statuses and edge cases
//! (`iggy-protocol.md` Part B) rather than an idealised Iggy.
//!
//! ```no_run
//! # async fn demo() -> replicator_testkit::Result<()> {
//! use replicator_testkit::{TestServer, TestServerConfig};
//! let server = TestServer::start(TestServerConfig::default()).await?;
//! let url = server.connection_string(); // iggy://iggy:iggy@127.0.0.1:PORT
//! server.faults().drop_connections();
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! * `wire`: command/status codes, the bounds-checked payload reader, record encoders.
//! * `connection`: one task per client; reads whole frames, applies faults, writes one answer.
//! * `handlers`: one function per command, in the real server's decode → auth → resolve →
//!   permission order, one file per command group (system, users, streams, topics, partitions,
//!   messages, offsets, groups).
//! * `state` / `log` / `group`: streams, topics, partitions (contiguous message bytes + offset
//!   index per partition, behind one mutex each), consumer-group assignment.
//! * `users`: user accounts, permissions and the server's permission rules, checked on every
//!   request.
//! * `faults`, `server`: fault switches (including holding one user's sends between their
//!   permission check and their append, and a stall that answers nothing until it ends, as a
//!   server frozen by SIGSTOP), lifecycle (start, shutdown, restart), retention.
//! * `persist`: optional data directory (metadata + per-partition append-only logs).
//! * `cluster`: [`TestCluster`], several 0.9 replicas (one listener each) over one state, with
//!   a primary, the backups' refusals, the roster answer and view changes.
//! * [`dev_server`]: the standalone `dev-server` command.
//! * [`wan`]: [`WanProxy`], a loopback TCP proxy that gives a connection a WAN's delay, jitter,
//!   bandwidth and bounded buffer, and cuts it on demand.

#![warn(missing_docs)]

mod cluster;
mod config;
mod connection;
pub mod dev_server;
mod error;
mod faults;
mod group;
mod handlers;
mod log;
mod ng;
mod persist;
mod replica;
mod server;
mod slab;
mod state;
mod users;
pub mod wan;
mod wire;

pub use cluster::TestCluster;
pub use config::{IggyVersion, TestServerConfig, DEFAULT_SEGMENT_SIZE};
pub use error::{Error, Result};
pub use faults::{Faults, SendHold};
pub use server::{PartitionInfo, Retention, TestServer};
pub use wan::{WanLink, WanProxy, DEFAULT_WAN_BUFFER};
