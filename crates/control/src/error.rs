//! The crate's error type and its transient/permanent classification.

use std::path::PathBuf;
use std::time::Duration;

use replicator_model::NodeId;

/// Everything that can go wrong in the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The data dir cannot be created, opened or read, or its content is corrupt.
    /// Never retried: the operator must look at the path.
    #[error("data dir {path}: {reason}")]
    DataDir {
        /// The directory (or the file inside it) that failed.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Binding or configuring the Raft RPC listener failed.
    #[error("raft listener {addr}: {source}")]
    Listen {
        /// The address that could not be served.
        addr: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The parameters handed to `start` are inconsistent.
    #[error("invalid control params: {0}")]
    InvalidParams(String),
    /// No leader was known, or the write could not reach it, within the deadline.
    #[error("no raft leader reachable within {waited:?}: {last}")]
    NoLeader {
        /// How long the call kept retrying.
        waited: Duration,
        /// The last failure seen while retrying.
        last: String,
    },
    /// A peer answered an RPC with an error or could not be reached.
    #[error("rpc to node {peer}: {reason}")]
    Rpc {
        /// The peer that was called.
        peer: NodeId,
        /// What failed.
        reason: String,
        /// Whether trying again (possibly at another leader) can help.
        transient: bool,
    },
    /// The cluster refused the operation (for example removing an unknown member).
    #[error("rejected: {0}")]
    Rejected(String),
    /// Raft reported a fatal error or a membership change failed.
    #[error("raft: {0}")]
    Raft(String),
    /// Encoding or decoding a stored or transported value failed.
    #[error("codec ({what}): {reason}")]
    Codec {
        /// What was being encoded or decoded.
        what: &'static str,
        /// The codec's message.
        reason: String,
    },
    /// The control plane is shutting down.
    #[error("control plane is shutting down")]
    ShuttingDown,
    /// The cluster's feature level is below the one the operation needs. Transient: the
    /// leader raises the level once every member runs a release that supports it.
    #[error(
        "the cluster is at feature level {cluster}; {what} need level {needed} \
         (every member running {release} or later)"
    )]
    FeatureLevel {
        /// What needs the level, e.g. `metadata records`.
        what: &'static str,
        /// The cluster's level now.
        cluster: u32,
        /// The level needed.
        needed: u32,
        /// The first release that supports `needed`, e.g. `v0.2.0`.
        release: &'static str,
    },
}

impl Error {
    /// Whether retrying the same call later can succeed (leader changes, unreachable peers).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Error::NoLeader { .. } | Error::FeatureLevel { .. } => true,
            Error::Rpc { transient, .. } => *transient,
            Error::DataDir { .. }
            | Error::Listen { .. }
            | Error::InvalidParams(_)
            | Error::Rejected(_)
            | Error::Raft(_)
            | Error::Codec { .. }
            | Error::ShuttingDown => false,
        }
    }
}

/// The crate's result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_loss_is_transient_and_corruption_is_not() {
        assert!(Error::NoLeader {
            waited: Duration::from_secs(1),
            last: "x".into()
        }
        .is_transient());
        assert!(!Error::DataDir {
            path: "/x".into(),
            reason: "corrupt".into()
        }
        .is_transient());
        assert!(Error::Rpc {
            peer: 1,
            reason: "refused".into(),
            transient: true
        }
        .is_transient());
    }

    #[test]
    fn a_feature_level_below_the_needed_one_is_transient_and_says_what_raises_it() {
        let e = Error::FeatureLevel {
            what: "metadata records",
            cluster: 2,
            needed: 3,
            release: "v0.2.0",
        };
        assert!(e.is_transient());
        assert_eq!(
            e.to_string(),
            "the cluster is at feature level 2; metadata records need level 3 \
             (every member running v0.2.0 or later)"
        );
    }
}
