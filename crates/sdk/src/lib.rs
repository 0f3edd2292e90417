//! The one interface iggy-replicator has to an Iggy cluster, whichever protocol generation it
//! speaks (`clusters.<alias>.iggy_version`): the [`IggyCluster`] trait, the few calls the
//! replicator makes (poll at an offset, send to a partition, topic metadata, create streams,
//! topics and partitions, users and permissions for the fence, consumer groups and their
//! offsets) and that its test and benchmark tools make (delete and purge), with one adapter
//! per SDK generation: [`V08`] (SDK 0.10) and [`V09`] (SDK 0.11).
//!
//! Messages, offsets and errors are the replicator's own ([`Message`], [`Polled`],
//! [`StoredOffset`], [`Error`]); each adapter converts its SDK's records into them. Payloads
//! and user headers are `Bytes` in both SDKs and travel through without a copy; user headers
//! are encoded alike in both generations.

#[doc(hidden)]
pub mod bench_support;
mod cluster;
mod error;
mod message;
mod v08;
mod v09;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use iggy::prelude::{
    ClientInfoDetails, ClientWrapper, CompressionAlgorithm, Consumer, ConsumerGroupDetails,
    IggyClient, IggyExpiry, MaxTopicSize, Partitioning, Permissions, PollingStrategy, Stream,
    StreamDetails, TcpClient, TcpClientConfig, TopicDetails, UserStatus,
};
use iggy_common::{
    AutoLogin, ClientInfo, ConnectionString, ConsumerGroup, Credentials, Identifier,
    TcpConnectionStringOptions, UserInfo, UserInfoDetails,
};
use replicator_model::IggyVersion;

pub use cluster::{IggyCluster, Result};
pub use error::{Error, ErrorKind};
pub use message::{apply_tail, Confirmed, HeadersTail, Message, Place, Polled, StoredOffset};
pub use v08::V08;
pub use v09::V09;

/// The vocabulary of the calls besides messages: names, topic, stream, user and consumer-group
/// records, permissions, expiry and size settings. These are SDK 0.10's model types (the 0.9
/// adapter converts its SDK's records into them); the replicator names them only through this
/// module, so that which SDK provides them is this crate's business.
pub mod types {
    pub use iggy::prelude::{
        CompressionAlgorithm, Consumer, ConsumerGroupDetails, GlobalPermissions, HeaderKey,
        HeaderValue, Identifier, IggyDuration, IggyError, IggyExpiry, IggyMessage, IggyTimestamp,
        MaxTopicSize, Partition, Partitioning, Permissions, PollingStrategy, StreamDetails,
        StreamPermissions, Topic, TopicDetails, TopicPermissions, UserStatus,
    };
    pub use iggy_common::defaults::{MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH};
    pub use iggy_common::UserInfo;
}

/// What a client being shut down may still have in flight; it sizes the wait for its shutdown
/// ([`Client::shutdown_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Requests of a connection that was in use, a send among them. SDK 0.11 replays a request
    /// the server answered `TransientNotCommitted` on the same session until it gets another
    /// answer or its 30 s response budget ends, also after the caller gave up on it, and its
    /// shutdown waits for that: a caller that must know such a request can no longer land (a
    /// writer about to re-read the target's tail and send again) waits that long.
    Requests,
    /// Only its own connect and login, given up (a replica that does not answer, a cluster
    /// still electing its primary). Nothing of the caller's can land behind a login (a
    /// register that commits late binds a session nobody uses, and the server drops it with
    /// the connection), so the shutdown is not waited for beyond a short bound: the login
    /// ends by itself, within SDK 0.11's response budget, in the SDK's own task.
    Login,
    /// A request that only reads (a poll at an explicit offset, a metadata query) was the last
    /// one: a replay of it changes nothing on the server, so nothing waits for it either.
    /// (Waiting held the connection's slot, and every other caller of it, for the SDK's whole
    /// response budget after a timed-out poll.)
    Read,
}

/// [`Client::shutdown_budget`] for a client of `version`.
fn shutdown_budget(version: IggyVersion, in_flight: InFlight) -> Duration {
    /// Closing a socket and stopping a heartbeat, when nothing is waited for.
    const CLOSE: Duration = Duration::from_secs(2);
    match (version, in_flight) {
        (IggyVersion::V0_9, InFlight::Requests) => v09::RESPONSE_BUDGET + CLOSE,
        // SDK 0.10 never replays: a given-up request holds nothing.
        (IggyVersion::V0_8, _) | (_, InFlight::Login | InFlight::Read) => CLOSE,
    }
}

/// How to open connections to one cluster, parsed once from its connection string.
#[derive(Clone)]
pub enum ClientConfig {
    /// An Iggy 0.8 cluster (SDK 0.10).
    V08(Arc<TcpClientConfig>),
    /// An Iggy 0.9 cluster (SDK 0.11).
    V09(Arc<iggy09::prelude::TcpClientConfig>),
}

impl ClientConfig {
    /// Parses `connection_string` for `version`, as the replicator connects: the SDKs' own
    /// reconnect is off (a writer must know when a send's outcome is unknown, and the SDK 0.10
    /// reconnect resends the request once) and Nagle is off: small requests must not wait.
    pub fn parse(
        version: IggyVersion,
        connection_string: &str,
    ) -> std::result::Result<Self, &'static str> {
        Self::parse_with(version, connection_string, false)
    }

    /// Parses `connection_string` for `version` with the SDK's own reconnect as the string
    /// configures it (on by default), for tools that may send a message twice after a
    /// reconnect (test producers riding out a server restart); Nagle is off.
    pub fn parse_reconnecting(
        version: IggyVersion,
        connection_string: &str,
    ) -> std::result::Result<Self, &'static str> {
        Self::parse_with(version, connection_string, true)
    }

    fn parse_with(
        version: IggyVersion,
        connection_string: &str,
        reconnect: bool,
    ) -> std::result::Result<Self, &'static str> {
        const INVALID: &str = "not a valid Iggy connection string";
        match version {
            IggyVersion::V0_8 => {
                let parsed =
                    ConnectionString::<TcpConnectionStringOptions>::from_str(connection_string)
                        .map_err(|_| INVALID)?;
                let mut config = TcpClientConfig::from(parsed);
                config.reconnection.enabled &= reconnect;
                config.nodelay = true;
                Ok(Self::V08(Arc::new(config)))
            }
            IggyVersion::V0_9 => {
                let parsed = iggy09_common::ConnectionString::<
                    iggy09_common::TcpConnectionStringOptions,
                >::from_str(connection_string)
                .map_err(|_| INVALID)?;
                let mut config = iggy09::prelude::TcpClientConfig::from(parsed);
                config.reconnection.enabled &= reconnect;
                config.nodelay = true;
                Ok(Self::V09(Arc::new(config)))
            }
        }
    }

    /// The same, logging in as `username` instead of the connection string's credential.
    pub fn with_login(&self, username: &str, password: &str) -> Self {
        match self {
            Self::V08(config) => {
                let mut config = (**config).clone();
                config.auto_login = AutoLogin::Enabled(Credentials::UsernamePassword(
                    username.to_owned(),
                    secrecy::SecretString::from(password.to_owned()),
                ));
                Self::V08(Arc::new(config))
            }
            Self::V09(config) => {
                let mut config = (**config).clone();
                config.auto_login = iggy09_common::AutoLogin::Enabled(
                    iggy09_common::Credentials::UsernamePassword(
                        username.to_owned(),
                        secrecy::SecretString::from(password.to_owned()),
                    ),
                );
                Self::V09(Arc::new(config))
            }
        }
    }

    /// The same, at `address` (`host:port`) instead of the connection string's address: a
    /// replica of the same cluster, with the same credentials and options.
    pub fn at(&self, address: &str) -> Self {
        match self {
            Self::V08(config) => {
                let mut config = (**config).clone();
                config.server_address = address.to_owned();
                Self::V08(Arc::new(config))
            }
            Self::V09(config) => {
                let mut config = (**config).clone();
                config.server_address = address.to_owned();
                Self::V09(Arc::new(config))
            }
        }
    }

    /// Whether the cluster's generation replicates (Iggy 0.9): the nodes it advertises are
    /// other ways in when the configured addresses fail. An Iggy 0.8 server is one node.
    pub fn replicated(&self) -> bool {
        matches!(self, Self::V09(_))
    }

    /// The same, connecting without logging in (PING is answered before a login).
    pub fn without_login(&self) -> Self {
        match self {
            Self::V08(config) => {
                let mut config = (**config).clone();
                config.auto_login = AutoLogin::Disabled;
                Self::V08(Arc::new(config))
            }
            Self::V09(config) => {
                let mut config = (**config).clone();
                config.auto_login = iggy09_common::AutoLogin::Disabled;
                Self::V09(Arc::new(config))
            }
        }
    }

    /// How often a connection is to be pinged: the connection string's `heartbeat_interval`,
    /// or the SDK's default (5 s). A server with its heartbeat check on drops a client that
    /// stays silent for longer than its own interval (1.2 times it).
    pub fn heartbeat_interval(&self) -> Duration {
        match self {
            Self::V08(config) => config.heartbeat_interval.get_duration(),
            Self::V09(config) => config.heartbeat_interval.get_duration(),
        }
    }

    /// A new, not yet connected client.
    pub fn client(&self) -> Result<Client> {
        match self {
            Self::V08(config) => {
                let tcp = TcpClient::create(config.clone())?;
                Ok(Client::V08(V08(IggyClient::create(
                    ClientWrapper::Tcp(tcp),
                    None,
                    None,
                ))))
            }
            Self::V09(config) => {
                let tcp = iggy09::prelude::TcpClient::create(config.clone())
                    .map_err(|e| Error::from(v09::error(&e)))?;
                Ok(Client::V09(V09(iggy09::prelude::IggyClient::create(
                    iggy09::prelude::ClientWrapper::Tcp(tcp),
                    None,
                    None,
                ))))
            }
        }
    }
}

/// One connection, through the adapter of the generation its cluster speaks.
pub enum Client {
    /// SDK 0.10 to an Iggy 0.8 server.
    V08(V08),
    /// SDK 0.11 to an Iggy 0.9 server.
    V09(V09),
}

impl Client {
    /// Connects and logs in without the SDK's heartbeat: the caller pings the connection
    /// itself, every [`ClientConfig::heartbeat_interval`], when it suits it. The SDK pings on
    /// its own timer, and a PING holds the connection (one request at a time) for a round
    /// trip: across regions a poll or a send that came meanwhile waited that long, which was
    /// most of a far source's replication latency p99 (BENCHMARKS.md section 37).
    pub async fn connect_without_heartbeat(&self) -> Result<()> {
        match self {
            Client::V08(c) => c.connect_without_heartbeat().await,
            Client::V09(c) => c.connect_without_heartbeat().await,
        }
    }

    /// How long [`IggyCluster::shutdown`] may be given for what the client may still have
    /// `in_flight` (see [`InFlight`]).
    pub fn shutdown_budget(&self, in_flight: InFlight) -> Duration {
        shutdown_budget(self.generation(), in_flight)
    }
}

/// Implements [`IggyCluster`] for [`Client`]: each call goes to the adapter it holds.
macro_rules! dispatch {
    ($( fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )*) => {
        impl IggyCluster for Client {
            fn generation(&self) -> IggyVersion {
                match self {
                    Client::V08(c) => c.generation(),
                    Client::V09(c) => c.generation(),
                }
            }

            $(
                async fn $name(&self $(, $arg: $ty)*) -> $ret {
                    match self {
                        Client::V08(c) => c.$name($($arg),*).await,
                        Client::V09(c) => c.$name($($arg),*).await,
                    }
                }
            )*
        }
    };
}

dispatch! {
    fn connect(&self) -> Result<()>;
    fn shutdown(&self) -> Result<()>;
    fn ping(&self) -> Result<()>;
    fn cluster_nodes(&self) -> Result<Vec<(String, u16)>>;
    fn get_me(&self) -> Result<ClientInfoDetails>;
    fn get_clients(&self) -> Result<Vec<ClientInfo>>;
    fn get_users(&self) -> Result<Vec<UserInfo>>;
    fn get_user(&self, user: &Identifier) -> Result<Option<UserInfoDetails>>;
    fn create_user(&self, username: &str, password: &str, status: UserStatus, permissions: Option<Permissions>) -> Result<UserInfoDetails>;
    fn update_user(&self, user: &Identifier, username: Option<&str>, status: Option<UserStatus>) -> Result<()>;
    fn update_permissions(&self, user: &Identifier, permissions: Option<Permissions>) -> Result<()>;
    fn delete_user(&self, user: &Identifier) -> Result<()>;
    fn get_streams(&self) -> Result<Vec<Stream>>;
    fn get_stream(&self, stream: &Identifier) -> Result<Option<StreamDetails>>;
    fn create_stream(&self, name: &str) -> Result<StreamDetails>;
    fn delete_stream(&self, stream: &Identifier) -> Result<()>;
    fn get_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<Option<TopicDetails>>;
    fn create_topic(&self, stream: &Identifier, name: &str, partitions: u32, compression: CompressionAlgorithm, replication_factor: Option<u8>, expiry: IggyExpiry, max_size: MaxTopicSize) -> Result<TopicDetails>;
    fn update_topic(&self, stream: &Identifier, topic: &Identifier, name: &str, compression: CompressionAlgorithm, replication_factor: Option<u8>, expiry: IggyExpiry, max_size: MaxTopicSize) -> Result<()>;
    fn delete_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<()>;
    fn purge_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<()>;
    fn create_partitions(&self, stream: &Identifier, topic: &Identifier, count: u32) -> Result<()>;
    fn poll_messages(&self, stream: &Identifier, topic: &Identifier, partition: Option<u32>, consumer: &Consumer, strategy: &PollingStrategy, count: u32, auto_commit: bool) -> Result<Polled>;
    fn send_messages(&self, stream: &Identifier, topic: &Identifier, partitioning: &Partitioning, messages: &mut [Message]) -> Result<Vec<Confirmed>>;
    fn send_messages_with_tail(&self, stream: &Identifier, topic: &Identifier, partitioning: &Partitioning, messages: &mut [Message], tail: Option<&dyn HeadersTail>) -> Result<Vec<Confirmed>>;
    fn get_consumer_groups(&self, stream: &Identifier, topic: &Identifier) -> Result<Vec<ConsumerGroup>>;
    fn get_consumer_group(&self, stream: &Identifier, topic: &Identifier, group: &Identifier) -> Result<Option<ConsumerGroupDetails>>;
    fn create_consumer_group(&self, stream: &Identifier, topic: &Identifier, name: &str) -> Result<ConsumerGroupDetails>;
    fn join_consumer_group(&self, stream: &Identifier, topic: &Identifier, group: &Identifier) -> Result<()>;
    fn leave_consumer_group(&self, stream: &Identifier, topic: &Identifier, group: &Identifier) -> Result<()>;
    fn get_consumer_offset(&self, consumer: &Consumer, stream: &Identifier, topic: &Identifier, partition: Option<u32>) -> Result<Option<StoredOffset>>;
    fn store_consumer_offset(&self, consumer: &Consumer, stream: &Identifier, topic: &Identifier, partition: Option<u32>, offset: u64) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn a_09_connection_in_use_is_given_the_sdks_whole_response_budget() {
        // Shorter, and a send the SDK still replays could land after the writer re-read the
        // target's tail.
        check!(shutdown_budget(IggyVersion::V0_9, InFlight::Requests) > v09::RESPONSE_BUDGET);
    }

    #[test]
    fn a_given_up_login_or_read_is_not_waited_for() {
        // A login that got no answer was held for the whole 30 s response budget before the
        // next seed address was tried; a timed-out poll held its slot as long.
        for version in [IggyVersion::V0_8, IggyVersion::V0_9] {
            for in_flight in [InFlight::Login, InFlight::Read] {
                check!(shutdown_budget(version, in_flight) < v09::RESPONSE_BUDGET / 10);
            }
        }
    }

    #[test]
    fn an_08_client_holds_nothing_it_gave_up() {
        check!(
            shutdown_budget(IggyVersion::V0_8, InFlight::Requests)
                == shutdown_budget(IggyVersion::V0_8, InFlight::Login)
        );
    }
}
