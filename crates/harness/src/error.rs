//! What can go wrong while the harness drives servers, the SDK and node processes.

use std::path::PathBuf;

/// An error of the harness. Tests turn it into their `TestResult` with `?`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `iggy-replicator` executable is not where the caller said.
    #[error("no iggy-replicator executable at {0}")]
    MissingBinary(PathBuf),
    /// An Iggy connection string that the SDK does not accept (the URL itself is not repeated:
    /// it may hold credentials).
    #[error("invalid Iggy connection string: {0}")]
    InvalidUrl(&'static str),
    /// A call to an Iggy cluster failed.
    #[error("iggy: {0}")]
    Iggy(#[from] replicator_sdk::Error),
    /// An in-process test server failed.
    #[error("test server: {0}")]
    TestServer(#[from] replicator_testkit::Error),
    /// A process, file or socket operation failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A request to a node's admin API failed.
    #[error("admin API: {0}")]
    Http(#[from] reqwest::Error),
    /// A signal could not be sent to a process.
    #[error("signal: {0}")]
    Signal(#[from] nix::errno::Errno),
    /// A task of the harness panicked or was cancelled.
    #[error("task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A condition did not hold before its deadline.
    #[error("timed out waiting for {what}{detail}")]
    TimedOut {
        /// The awaited condition.
        what: String,
        /// What was seen last (empty, or starting with "; ").
        detail: String,
    },
    /// No node with this id in the cluster.
    #[error("no node {0}")]
    NoNode(u64),
    /// The node's process does not run (killed, terminated or not started).
    #[error("node {0} is not running")]
    NotRunning(u64),
    /// The node's process still runs (a restart needs it stopped).
    #[error("node {0} is still running")]
    StillRunning(u64),
    /// A node's admin API answered with an error status.
    #[error("node {node}: {path} answered {status}")]
    AdminStatus {
        /// The node asked.
        node: u64,
        /// The request path.
        path: &'static str,
        /// Its HTTP status.
        status: reqwest::StatusCode,
    },
    /// A command of the binary failed or answered something unexpected.
    #[error("iggy-replicator {command}: {detail}")]
    Command {
        /// The subcommand and its arguments.
        command: String,
        /// Exit code and what it printed.
        detail: String,
    },
    /// A server, process or topic is not in the state the harness needs.
    #[error("{0}")]
    Setup(String),
}

impl Error {
    /// A [`Error::TimedOut`] with what was seen last.
    pub(crate) fn timed_out(what: &str, detail: impl std::fmt::Display) -> Self {
        Self::TimedOut {
            what: what.to_owned(),
            detail: format!("; {detail}"),
        }
    }
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An SDK 0.10 value that failed to build (an id, a header), as the cluster error it means.
impl From<iggy::prelude::IggyError> for Error {
    fn from(e: iggy::prelude::IggyError) -> Self {
        Self::Iggy(e.into())
    }
}
