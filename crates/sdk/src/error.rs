//! The replicator's error for a call to an Iggy cluster: what it means for the caller
//! ([`ErrorKind`]), decided here once for both generations, plus the server's code and text
//! for people.

use iggy::prelude::IggyError;

/// What a failed call means for the replicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The connection's state is unknown (closed, never made, a request whose outcome is
    /// unknown): drop it and connect again; a writer re-reads the target's tail first.
    Connection,
    /// The stream, topic or partition addressed does not exist.
    Missing,
    /// What a create call names (a stream, topic, consumer group or user) exists already.
    AlreadyExists,
    /// The connection's user may not do this (a fenced writer identity, among others).
    Unauthorized,
    /// The credentials were refused at login, or the user is inactive.
    CredentialsRejected,
    /// Anything else the server or the SDK refused.
    Other,
}

/// A failed call to an Iggy cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text} (Iggy error {code})")]
pub struct Error {
    kind: ErrorKind,
    code: u32,
    text: String,
}

impl Error {
    /// What the failure means for the caller.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The Iggy error code (shared by both generations for every code the replicator acts on).
    pub fn code(&self) -> u32 {
        self.code
    }

    /// A connection whose state is unknown, as the SDK reports a lost one.
    pub fn disconnected() -> Self {
        Self::from(IggyError::Disconnected)
    }
}

impl From<IggyError> for Error {
    fn from(e: IggyError) -> Self {
        Self::from(&e)
    }
}

impl From<&IggyError> for Error {
    fn from(e: &IggyError) -> Self {
        Self {
            kind: kind_of(e),
            code: e.as_code(),
            text: e.to_string(),
        }
    }
}

/// The one place where Iggy's error codes get their meaning for the replicator (a 0.9 error
/// comes here by its code).
fn kind_of(e: &IggyError) -> ErrorKind {
    match e {
        // The SDK's own reconnect set, plus a client shut down.
        IggyError::Disconnected
        | IggyError::EmptyResponse
        | IggyError::Unauthenticated
        | IggyError::StaleClient
        | IggyError::NotConnected
        | IggyError::CannotEstablishConnection
        | IggyError::TcpError
        | IggyError::ClientShutdown
        | IggyError::ShardCommunicationError => ErrorKind::Connection,
        IggyError::StreamIdNotFound(_)
        | IggyError::StreamNameNotFound(_)
        | IggyError::TopicIdNotFound(_, _)
        | IggyError::TopicNameNotFound(_, _)
        | IggyError::PartitionNotFound(_, _, _) => ErrorKind::Missing,
        IggyError::StreamNameAlreadyExists(_)
        | IggyError::TopicNameAlreadyExists(_, _)
        | IggyError::ConsumerGroupNameAlreadyExists(_, _)
        | IggyError::UserAlreadyExists => ErrorKind::AlreadyExists,
        IggyError::Unauthorized => ErrorKind::Unauthorized,
        IggyError::InvalidCredentials | IggyError::UserInactive => ErrorKind::CredentialsRejected,
        _ => ErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;
    use iggy_common::Identifier;

    #[test]
    fn errors_get_their_meaning_from_the_code_table() {
        check!(Error::from(IggyError::Disconnected).kind() == ErrorKind::Connection);
        check!(Error::disconnected().kind() == ErrorKind::Connection);
        let missing = IggyError::TopicIdNotFound(Identifier::default(), Identifier::default());
        check!(Error::from(missing).kind() == ErrorKind::Missing);
        let exists =
            IggyError::ConsumerGroupNameAlreadyExists(String::new(), Identifier::default());
        check!(Error::from(exists).code() == 5004);
        check!(Error::from(IggyError::UserInactive).kind() == ErrorKind::CredentialsRejected);
        check!(Error::from(IggyError::Unauthorized).kind() == ErrorKind::Unauthorized);
        check!(Error::from(IggyError::InvalidFormat).kind() == ErrorKind::Other);
        check!(Error::from(IggyError::Unauthorized)
            .to_string()
            .contains("(Iggy error 41)"));
    }
}
