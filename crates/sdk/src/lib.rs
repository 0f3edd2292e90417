//! The one interface iggy-replicator has to an Iggy cluster, whichever protocol generation it
//! speaks (`clusters.<alias>.iggy_version`): an SDK connection of that generation behind the
//! few calls the replicator makes (poll at an offset, send to a partition, topic metadata,
//! create streams, topics and partitions, users and permissions for the fence, consumer groups
//! and their offsets) and that its test and benchmark tools make (delete and purge).
//!
//! Its callers speak the vocabulary of SDK 0.10 (the 0.8 generation): its messages, ids and
//! records. A 0.8 connection passes every call straight to SDK 0.10; a 0.9 connection
//! (`v09`) converts the arguments and answers of SDK 0.11 field by field. Payloads and user
//! headers are `Bytes` in both SDKs and travel between them without a copy; user headers are
//! encoded alike in both generations.

mod v09;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use iggy::prelude::{
    Client as _, ClientInfoDetails, ClientWrapper, CompressionAlgorithm, Consumer,
    ConsumerGroupClient as _, ConsumerGroupDetails, ConsumerOffsetClient as _, IggyClient,
    IggyError, IggyExpiry, IggyMessage, MaxTopicSize, MessageClient as _, PartitionClient as _,
    Partitioning, Permissions, PolledMessages, PollingStrategy, Stream, StreamClient as _,
    StreamDetails, SystemClient as _, TcpClient, TcpClientConfig, TopicClient as _, TopicDetails,
    UserClient as _, UserStatus,
};
use iggy_common::ClusterClient as _;
use iggy_common::{
    AutoLogin, ClientInfo, ConnectionString, ConsumerGroup, ConsumerOffsetInfo, Credentials,
    Identifier, TcpConnectionStringOptions, UserInfo, UserInfoDetails,
};
use replicator_model::IggyVersion;

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

    /// A new, not yet connected client.
    pub fn client(&self) -> std::result::Result<Client, IggyError> {
        match self {
            Self::V08(config) => {
                let tcp = TcpClient::create(config.clone())?;
                Ok(Client::V08(IggyClient::create(
                    ClientWrapper::Tcp(tcp),
                    None,
                    None,
                )))
            }
            Self::V09(config) => {
                let tcp = iggy09::prelude::TcpClient::create(config.clone())
                    .map_err(|e| v09::error(&e))?;
                Ok(Client::V09(iggy09::prelude::IggyClient::create(
                    iggy09::prelude::ClientWrapper::Tcp(tcp),
                    None,
                    None,
                )))
            }
        }
    }
}

/// What the server confirmed of one request of a send: where its messages landed. Iggy 0.9
/// answers a send with one place per partition written; an answer without one (a request the
/// server recognised as a replay and answered from its cache) leaves `places` empty. Iggy 0.8
/// confirms nothing, so its sends return no `Confirmed` at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// How many messages the request carried.
    pub messages: u32,
    /// Where the server says they landed.
    pub places: Vec<Place>,
}

/// A partition and the offset a request's first message landed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The partition the server names.
    pub partition: u32,
    /// The offset of the request's first message in it.
    pub base_offset: u64,
}

/// One SDK connection, of the generation its cluster speaks.
pub enum Client {
    /// SDK 0.10 to an Iggy 0.8 server.
    V08(IggyClient),
    /// SDK 0.11 to an Iggy 0.9 server.
    V09(iggy09::prelude::IggyClient),
}

/// Runs `$call` on the 0.8 client, or `v09::$call` with the 0.9 one.
macro_rules! either {
    ($self:ident, $v08:ident => $on08:expr, $v09:ident => $on09:expr) => {
        match $self {
            Client::V08($v08) => $on08,
            Client::V09($v09) => $on09,
        }
    };
}

impl Client {
    /// Connects (and logs in with the configured credential).
    pub async fn connect(&self) -> Result<(), IggyError> {
        either!(self, c => c.connect().await, c => v09::connect(c).await)
    }

    /// Stops the client (its heartbeat included). On 0.9 it waits for the request in flight,
    /// if any, to end (see [`InFlight`]).
    pub async fn shutdown(&self) -> Result<(), IggyError> {
        either!(self, c => c.shutdown().await, c => v09::shutdown(c).await)
    }

    /// How long [`Client::shutdown`] may be given for what the client may still have
    /// `in_flight` (see [`InFlight`]).
    pub fn shutdown_budget(&self, in_flight: InFlight) -> Duration {
        let version = match self {
            Self::V08(_) => IggyVersion::V0_8,
            Self::V09(_) => IggyVersion::V0_9,
        };
        shutdown_budget(version, in_flight)
    }

    pub async fn ping(&self) -> Result<(), IggyError> {
        either!(self, c => c.ping().await, c => v09::ping(c).await)
    }

    /// The TCP addresses (`ip:port`) of the cluster's nodes as the server advertises them
    /// (nodes without a usable address left out).
    pub async fn cluster_addresses(&self) -> Result<Vec<String>, IggyError> {
        let nodes: Vec<(String, u16)> = either!(self,
            c => c.get_cluster_metadata().await.map(|m| m.nodes.into_iter().map(|n| (n.ip, n.endpoints.tcp)).collect())?,
            c => v09::cluster_nodes(c).await?);
        Ok(nodes
            .into_iter()
            .filter(|(ip, port)| {
                *port != 0
                    && ip
                        .parse::<std::net::IpAddr>()
                        .map_or(!ip.is_empty(), |a| !a.is_unspecified())
            })
            .map(|(ip, port)| {
                if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                }
            })
            .collect())
    }

    pub async fn get_me(&self) -> Result<ClientInfoDetails, IggyError> {
        either!(self, c => c.get_me().await, c => v09::get_me(c).await)
    }

    pub async fn get_clients(&self) -> Result<Vec<ClientInfo>, IggyError> {
        either!(self, c => c.get_clients().await, c => v09::get_clients(c).await)
    }

    pub async fn get_users(&self) -> Result<Vec<UserInfo>, IggyError> {
        either!(self, c => c.get_users().await, c => v09::get_users(c).await)
    }

    pub async fn get_user(&self, user: &Identifier) -> Result<Option<UserInfoDetails>, IggyError> {
        either!(self, c => c.get_user(user).await, c => v09::get_user(c, user).await)
    }

    pub async fn create_user(
        &self,
        username: &str,
        password: &str,
        status: UserStatus,
        permissions: Option<Permissions>,
    ) -> Result<UserInfoDetails, IggyError> {
        either!(self,
            c => c.create_user(username, password, status, permissions).await,
            c => v09::create_user(c, username, password, status, permissions).await)
    }

    pub async fn update_user(
        &self,
        user: &Identifier,
        username: Option<&str>,
        status: Option<UserStatus>,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.update_user(user, username, status).await,
            c => v09::update_user(c, user, username, status).await)
    }

    pub async fn update_permissions(
        &self,
        user: &Identifier,
        permissions: Option<Permissions>,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.update_permissions(user, permissions).await,
            c => v09::update_permissions(c, user, permissions).await)
    }

    pub async fn delete_user(&self, user: &Identifier) -> Result<(), IggyError> {
        either!(self, c => c.delete_user(user).await, c => v09::delete_user(c, user).await)
    }

    pub async fn get_streams(&self) -> Result<Vec<Stream>, IggyError> {
        either!(self, c => c.get_streams().await, c => v09::get_streams(c).await)
    }

    pub async fn get_stream(
        &self,
        stream: &Identifier,
    ) -> Result<Option<StreamDetails>, IggyError> {
        either!(self, c => c.get_stream(stream).await, c => v09::get_stream(c, stream).await)
    }

    pub async fn create_stream(&self, name: &str) -> Result<StreamDetails, IggyError> {
        either!(self, c => c.create_stream(name).await, c => v09::create_stream(c, name).await)
    }

    pub async fn delete_stream(&self, stream: &Identifier) -> Result<(), IggyError> {
        either!(self, c => c.delete_stream(stream).await, c => v09::delete_stream(c, stream).await)
    }

    pub async fn get_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Option<TopicDetails>, IggyError> {
        either!(self,
            c => c.get_topic(stream, topic).await,
            c => v09::get_topic(c, stream, topic).await)
    }

    /// Creates a topic. On 0.9 the replication factor is not the topic's to choose and is
    /// ignored.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_topic(
        &self,
        stream: &Identifier,
        name: &str,
        partitions: u32,
        compression: CompressionAlgorithm,
        replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> Result<TopicDetails, IggyError> {
        either!(self,
            c => c.create_topic(stream, name, partitions, compression, replication_factor, expiry, max_size).await,
            c => v09::create_topic(c, stream, name, partitions, compression, expiry, max_size).await)
    }

    /// Changes a topic's settings (the name stays). On 0.9 the replication factor is not the
    /// topic's to choose and is ignored, and an expiry or size limit of `ServerDefault` is
    /// left as the topic has it.
    #[allow(clippy::too_many_arguments)]
    pub async fn update_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
        compression: CompressionAlgorithm,
        replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.update_topic(stream, topic, name, compression, replication_factor, expiry, max_size).await,
            c => v09::update_topic(c, stream, topic, name, compression, expiry, max_size).await)
    }

    pub async fn delete_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.delete_topic(stream, topic).await,
            c => v09::delete_topic(c, stream, topic).await)
    }

    /// Deletes every message of the topic's partitions.
    pub async fn purge_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.purge_topic(stream, topic).await,
            c => v09::purge_topic(c, stream, topic).await)
    }

    pub async fn create_partitions(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        count: u32,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.create_partitions(stream, topic, count).await,
            c => v09::create_partitions(c, stream, topic, count).await)
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn poll_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        consumer: &Consumer,
        strategy: &PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Result<PolledMessages, IggyError> {
        either!(self,
            c => c.poll_messages(stream, topic, partition, consumer, strategy, count, auto_commit).await,
            c => v09::poll_messages(c, stream, topic, partition, consumer, strategy, count, auto_commit).await)
    }

    /// Sends `messages` in order. On 0.9 a batch whose origin timestamps span more than one
    /// 0.9 batch can carry goes as several sends, in order; an error after the first leaves the
    /// earlier ones appended, which the writer finds in the target's tail like any other
    /// uncertain send.
    pub async fn send_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages: &mut [IggyMessage],
    ) -> Result<Vec<Confirmed>, IggyError> {
        either!(self,
            c => c.send_messages(stream, topic, partitioning, messages).await.map(|()| Vec::new()),
            c => v09::send_messages(c, stream, topic, partitioning, messages).await)
    }

    pub async fn get_consumer_groups(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Vec<ConsumerGroup>, IggyError> {
        either!(self,
            c => c.get_consumer_groups(stream, topic).await,
            c => v09::get_consumer_groups(c, stream, topic).await)
    }

    pub async fn get_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<Option<ConsumerGroupDetails>, IggyError> {
        either!(self,
            c => c.get_consumer_group(stream, topic, group).await,
            c => v09::get_consumer_group(c, stream, topic, group).await)
    }

    pub async fn create_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
    ) -> Result<ConsumerGroupDetails, IggyError> {
        either!(self,
            c => c.create_consumer_group(stream, topic, name).await,
            c => v09::create_consumer_group(c, stream, topic, name).await)
    }

    pub async fn join_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.join_consumer_group(stream, topic, group).await,
            c => v09::join_consumer_group(c, stream, topic, group).await)
    }

    pub async fn leave_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.leave_consumer_group(stream, topic, group).await,
            c => v09::leave_consumer_group(c, stream, topic, group).await)
    }

    pub async fn get_consumer_offset(
        &self,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
    ) -> Result<Option<ConsumerOffsetInfo>, IggyError> {
        either!(self,
            c => c.get_consumer_offset(consumer, stream, topic, partition).await,
            c => v09::get_consumer_offset(c, consumer, stream, topic, partition).await)
    }

    pub async fn store_consumer_offset(
        &self,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        offset: u64,
    ) -> Result<(), IggyError> {
        either!(self,
            c => c.store_consumer_offset(consumer, stream, topic, partition, offset).await,
            c => v09::store_consumer_offset(c, consumer, stream, topic, partition, offset).await)
    }
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
