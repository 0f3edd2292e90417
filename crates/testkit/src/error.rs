//! Errors of the testkit's public API.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong when starting, restarting or driving a [`crate::TestServer`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener could not be bound (port in use, no permission).
    #[error("binding the listener on {addr}")]
    Bind {
        /// Address that was requested.
        addr: SocketAddr,
        /// Underlying socket error.
        #[source]
        source: std::io::Error,
    },
    /// The data directory could not be read or written.
    #[error("persisting to {path}")]
    Persist {
        /// File or directory involved.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Persisted data exists but cannot be decoded.
    #[error("corrupt data in {path}: {reason}")]
    Corrupt {
        /// File that failed to decode.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// A stream, topic or partition named in a test hook does not exist.
    #[error("no partition {partition} in topic {topic:?} of stream {stream:?}")]
    PartitionNotFound {
        /// Stream name.
        stream: String,
        /// Topic name.
        topic: String,
        /// Partition id.
        partition: u32,
    },
    /// A [`crate::TestCluster`] was asked for with no replica or for a generation without
    /// clustering (only 0.9 has it).
    #[error(
        "a test cluster needs Iggy 0.9 and at least one replica, not {version} with {replicas}"
    )]
    NotAClusterConfig {
        /// The generation the config asked for.
        version: crate::IggyVersion,
        /// The number of replicas asked for.
        replicas: usize,
    },
}

impl Error {
    /// Whether retrying the same call later can succeed (a port still in TIME_WAIT, a busy disk).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Bind { .. } | Error::Persist { .. })
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
