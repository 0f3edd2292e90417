//! The pipeline's error type and its transient/permanent classification.

use replicator_model::WorkUnit;
use replicator_sdk::ErrorKind;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the pipeline, with the identity needed to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `PipelineParams` or `VerifyParams` are inconsistent (unknown cluster alias, bad glob, zero sizes).
    #[error("invalid pipeline parameters: {field}: {reason}")]
    InvalidParams {
        /// Path of the offending field, e.g. `flows[1].include[0]`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A call to an Iggy cluster failed.
    #[error("iggy cluster `{cluster}`: {op} failed")]
    Iggy {
        /// Cluster alias, e.g. `us`.
        cluster: String,
        /// The operation, e.g. `poll_messages orders/created/3`.
        op: String,
        /// What the cluster or the SDK answered.
        #[source]
        source: replicator_sdk::Error,
    },
    /// A call to an Iggy cluster did not answer within the operation timeout.
    #[error("iggy cluster `{cluster}`: {op} timed out")]
    Timeout {
        /// Cluster alias.
        cluster: String,
        /// The operation.
        op: String,
    },
    /// The upstream topic of a unit no longer exists.
    #[error("upstream topic of {unit} does not exist")]
    UpstreamTopicGone {
        /// The unit whose topic is gone.
        unit: WorkUnit,
    },
    /// The downstream topic or partition of a unit does not exist (yet): discovery creates it.
    #[error("downstream topic {stream}/{topic} partition {partition} does not exist")]
    DownstreamMissing {
        /// Downstream stream name.
        stream: String,
        /// Downstream topic name.
        topic: String,
        /// Partition id.
        partition: u32,
    },
    /// The target confirmed a send at another place than where the writer's previous send
    /// ended (Iggy 0.9 confirms where every send lands): something else appended to, purged
    /// or rewound the partition. The writer re-reads the tail before it sends again.
    #[error("target partition of {unit}: {mismatch}; re-reading its tail")]
    UnexpectedAppend {
        /// The unit whose send it was.
        unit: WorkUnit,
        /// What the confirmation said.
        mismatch: LandedMismatch,
    },
    /// This node's writer identity on the target was fenced or replaced: the unit's writer
    /// stops, and a pair started under the new identity re-reads the downstream tail.
    #[error(
        "iggy cluster `{cluster}`: this node's writer identity was revoked (fenced or replaced)"
    )]
    WriterRevoked {
        /// The target cluster alias.
        cluster: String,
    },
    /// A unit's upstream partition was reset (purged) more often than provenance labels can
    /// count (`provenance::History::MAX_RESETS`): its new history cannot be told apart
    /// from the old ones downstream, so the unit does not copy it.
    #[error(
        "upstream partition of {unit} was reset more than {} times; recreate the topic to \
         copy it again",
        crate::provenance::History::MAX_RESETS
    )]
    ResetsExhausted {
        /// The unit.
        unit: WorkUnit,
    },
    /// A unit task was stopped in the middle of a multi-step operation (the downstream tail
    /// scan); the unit's next pair starts it again.
    #[error("{op} of {unit} interrupted by a stop")]
    Interrupted {
        /// The unit.
        unit: WorkUnit,
        /// What was interrupted.
        op: &'static str,
    },
    /// A tail re-read after a failed send found less of this writer's copies than the target
    /// had acknowledged: the target lost them (it restarted without persisting them). The
    /// pair ends; the next pair's resume copies them again.
    #[error(
        "target partition of {unit} lost acknowledged messages: copied up to upstream offset \
         {last_copied}, its tail holds {tail:?}; copying them again"
    )]
    DownstreamLost {
        /// The unit.
        unit: WorkUnit,
        /// The upstream offset of the last message the target acknowledged to this writer.
        last_copied: u64,
        /// The upstream offset of the last copy the target still holds (`None`: none).
        tail: Option<u64>,
    },
    /// Where a unit's copy starts could not be recorded in the control plane before its first
    /// poll (see `ControlPlane::record_start`); the writer works its start out again.
    #[error("start of {unit} not recorded: {reason}")]
    StartNotRecorded {
        /// The unit.
        unit: WorkUnit,
        /// Why.
        reason: String,
        /// Whether a retry can succeed (the control plane's word; a recorded start of another
        /// owner is read on the retry).
        transient: bool,
    },
    /// A write for the flow was not sent: this node held no lease valid long enough when its
    /// turn on the connection came (see `datapath::target`). Retried on the next round.
    #[error("iggy cluster `{cluster}`: {op} not sent: this node's lease is not valid long enough")]
    LeaseExpiring {
        /// The target cluster alias.
        cluster: String,
        /// The write.
        op: String,
    },
    /// The coordinator actor could not be spawned.
    #[error("actor {name}: {reason}")]
    Actor {
        /// Actor name, e.g. `coordinator/n1`.
        name: String,
        /// What failed.
        reason: String,
    },
    /// A message could not be built (e.g. provenance headers would exceed Iggy's limits).
    #[error("message at offset {offset} of {unit} cannot be forwarded: {reason}")]
    Message {
        /// The unit.
        unit: WorkUnit,
        /// Upstream offset of the message.
        offset: u64,
        /// Why it cannot.
        reason: &'static str,
    },
}

/// A confirmation that does not fit the writer's own sends (the writer's check is
/// `datapath::writer::landed`; here, below the data path, because [`Error::UnexpectedAppend`]
/// carries it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LandedMismatch {
    /// The send landed at another offset than where the writer's previous send ended.
    #[error("the send landed at offset {landed}, but {expected} was next after the writer's previous send")]
    Offset {
        /// Where the previous confirmed send ended.
        expected: u64,
        /// Where the server says this one starts.
        landed: u64,
    },
    /// The server confirmed another partition than the one the send named.
    #[error("the send named partition {sent}, but the server confirmed partition {landed}")]
    Partition {
        /// The partition the writer sent to.
        sent: u32,
        /// The partition the confirmation names.
        landed: u32,
    },
    /// A send to one partition came back with several confirmations.
    #[error("a send to one partition came back with {0} confirmations")]
    Several(usize),
}

impl Error {
    /// Whether a retry (after a backoff) can succeed without anyone changing anything.
    ///
    /// Connection failures, timeouts and missing downstream topics (discovery creates them) are
    /// transient; invalid params and malformed messages are not (a fenced writer stops without
    /// an error).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Iggy { source, .. } => is_connection_error(source) || is_missing(source),
            Error::Timeout { .. } | Error::DownstreamMissing { .. } => true,
            Error::UnexpectedAppend { .. } => true,
            Error::UpstreamTopicGone { .. } | Error::Interrupted { .. } => true,
            Error::LeaseExpiring { .. } => true,
            Error::StartNotRecorded { transient, .. } => *transient,
            // Not for this pair to retry: its reader is past what must be copied again.
            Error::DownstreamLost { .. } => false,
            Error::InvalidParams { .. }
            | Error::Actor { .. }
            | Error::Message { .. }
            | Error::WriterRevoked { .. }
            | Error::ResetsExhausted { .. } => false,
        }
    }

    /// A short, stable name of the error's kind, for metrics labels (bounded cardinality).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidParams { .. } => "invalid_params",
            Error::Iggy { source, .. } if is_connection_error(source) => "connection",
            Error::Iggy { source, .. } if source.kind() == ErrorKind::Unauthorized => {
                "unauthorized"
            }
            Error::Iggy { .. } => "iggy",
            Error::WriterRevoked { .. } => "writer_revoked",
            Error::Timeout { .. } => "timeout",
            Error::UpstreamTopicGone { .. } => "upstream_topic_gone",
            Error::DownstreamMissing { .. } => "downstream_missing",
            Error::UnexpectedAppend { .. } => "unexpected_append",
            Error::Actor { .. } => "actor",
            Error::ResetsExhausted { .. } => "resets_exhausted",
            Error::Interrupted { .. } => "interrupted",
            Error::LeaseExpiring { .. } => "lease_expiring",
            Error::StartNotRecorded { .. } => "control",
            Error::DownstreamLost { .. } => "downstream_lost",
            Error::Message { .. } => "message",
        }
    }

    /// Whether the connection that produced this error must be dropped and rebuilt.
    pub(crate) fn poisons_connection(&self) -> bool {
        match self {
            Error::Iggy { source, .. } => is_connection_error(source),
            Error::Timeout { .. } => true,
            _ => false,
        }
    }
}

/// Errors after which the connection state is unknown.
pub(crate) fn is_connection_error(err: &replicator_sdk::Error) -> bool {
    err.kind() == ErrorKind::Connection
}

/// Errors that mean "the stream, topic or partition addressed does not exist".
pub(crate) fn is_missing(err: &replicator_sdk::Error) -> bool {
    err.kind() == ErrorKind::Missing
}
