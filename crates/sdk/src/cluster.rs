//! [`IggyCluster`]: the calls the replicator (and its test and benchmark tools) make on one
//! connection to an Iggy cluster. Each SDK generation has one adapter implementing it
//! ([`crate::V08`], [`crate::V09`]); [`crate::Client`] is whichever of the two a cluster's
//! `iggy_version` asks for.
//!
//! Messages, offsets and errors are the replicator's own ([`Message`], [`Polled`],
//! [`StoredOffset`], [`Error`]). Ids, polling arguments and the metadata records (streams,
//! topics, users, permissions, consumer groups) keep SDK 0.10's plain value types: both
//! generations have the same fields, and the 0.9 adapter converts them.

use std::future::Future;

use iggy::prelude::{
    ClientInfoDetails, CompressionAlgorithm, Consumer, ConsumerGroupDetails, IggyExpiry,
    MaxTopicSize, Partitioning, Permissions, PollingStrategy, Stream, StreamDetails, TopicDetails,
    UserStatus,
};
use iggy_common::{ClientInfo, ConsumerGroup, Identifier, UserInfo, UserInfoDetails};
use replicator_model::IggyVersion;

use crate::{Confirmed, Error, HeadersTail, Message, Polled, StoredOffset};

/// The result of a call on a cluster.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One connection to an Iggy cluster, of the generation its adapter speaks.
pub trait IggyCluster: Send + Sync {
    /// The protocol generation it speaks.
    fn generation(&self) -> IggyVersion;

    /// Connects (and logs in with the configured credential).
    fn connect(&self) -> impl Future<Output = Result<()>> + Send;

    /// Stops the client (its heartbeat included). On 0.9 it waits for the request in flight,
    /// if any, to end (see [`crate::InFlight`]).
    fn shutdown(&self) -> impl Future<Output = Result<()>> + Send;

    fn ping(&self) -> impl Future<Output = Result<()>> + Send;

    /// The cluster's nodes as the server advertises them: (ip, TCP port).
    fn cluster_nodes(&self) -> impl Future<Output = Result<Vec<(String, u16)>>> + Send;

    fn get_me(&self) -> impl Future<Output = Result<ClientInfoDetails>> + Send;

    fn get_clients(&self) -> impl Future<Output = Result<Vec<ClientInfo>>> + Send;

    fn get_users(&self) -> impl Future<Output = Result<Vec<UserInfo>>> + Send;

    fn get_user(
        &self,
        user: &Identifier,
    ) -> impl Future<Output = Result<Option<UserInfoDetails>>> + Send;

    fn create_user(
        &self,
        username: &str,
        password: &str,
        status: UserStatus,
        permissions: Option<Permissions>,
    ) -> impl Future<Output = Result<UserInfoDetails>> + Send;

    fn update_user(
        &self,
        user: &Identifier,
        username: Option<&str>,
        status: Option<UserStatus>,
    ) -> impl Future<Output = Result<()>> + Send;

    fn update_permissions(
        &self,
        user: &Identifier,
        permissions: Option<Permissions>,
    ) -> impl Future<Output = Result<()>> + Send;

    fn delete_user(&self, user: &Identifier) -> impl Future<Output = Result<()>> + Send;

    fn get_streams(&self) -> impl Future<Output = Result<Vec<Stream>>> + Send;

    fn get_stream(
        &self,
        stream: &Identifier,
    ) -> impl Future<Output = Result<Option<StreamDetails>>> + Send;

    fn create_stream(&self, name: &str) -> impl Future<Output = Result<StreamDetails>> + Send;

    fn delete_stream(&self, stream: &Identifier) -> impl Future<Output = Result<()>> + Send;

    fn get_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> impl Future<Output = Result<Option<TopicDetails>>> + Send;

    /// Creates a topic. On 0.9 the replication factor is not the topic's to choose and is
    /// ignored.
    #[allow(clippy::too_many_arguments)]
    fn create_topic(
        &self,
        stream: &Identifier,
        name: &str,
        partitions: u32,
        compression: CompressionAlgorithm,
        replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> impl Future<Output = Result<TopicDetails>> + Send;

    /// Changes a topic's settings (the name stays). On 0.9 the replication factor is not the
    /// topic's to choose and is ignored, and an expiry or size limit of `ServerDefault` is
    /// left as the topic has it.
    #[allow(clippy::too_many_arguments)]
    fn update_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
        compression: CompressionAlgorithm,
        replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> impl Future<Output = Result<()>> + Send;

    fn delete_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Deletes every message of the topic's partitions.
    fn purge_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> impl Future<Output = Result<()>> + Send;

    fn create_partitions(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        count: u32,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Polls up to `count` messages of one partition (or the one the server picks for a
    /// consumer group member, `partition` `None`).
    #[allow(clippy::too_many_arguments)]
    fn poll_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        consumer: &Consumer,
        strategy: &PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> impl Future<Output = Result<Polled>> + Send;

    /// Sends `messages` in order. On 0.9 a batch whose origin timestamps span more than one
    /// 0.9 batch can carry goes as several sends, in order; an error after the first leaves the
    /// earlier ones appended, which the writer finds in the target's tail like any other
    /// uncertain send. Iggy 0.8 confirms nothing: its answer is empty. `messages` are lent to
    /// the SDK for the send and are whole again when it ends, however it ends.
    fn send_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages: &mut [Message],
    ) -> impl Future<Output = Result<Vec<Confirmed>>> + Send;

    /// [`IggyCluster::send_messages`], each message's user headers followed by its `tail`, if
    /// any, on the wire. The 0.8 adapter writes the tails into its request; otherwise they are
    /// applied to `messages` first ([`crate::apply_tail`]), which a tail must allow for (write
    /// nothing for a message that already carries one).
    fn send_messages_with_tail(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages: &mut [Message],
        tail: Option<&dyn HeadersTail>,
    ) -> impl Future<Output = Result<Vec<Confirmed>>> + Send {
        async move {
            if let Some(tail) = tail {
                crate::apply_tail(messages, tail);
            }
            self.send_messages(stream, topic, partitioning, messages)
                .await
        }
    }

    fn get_consumer_groups(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> impl Future<Output = Result<Vec<ConsumerGroup>>> + Send;

    fn get_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> impl Future<Output = Result<Option<ConsumerGroupDetails>>> + Send;

    fn create_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
    ) -> impl Future<Output = Result<ConsumerGroupDetails>> + Send;

    fn join_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> impl Future<Output = Result<()>> + Send;

    fn leave_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> impl Future<Output = Result<()>> + Send;

    fn get_consumer_offset(
        &self,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
    ) -> impl Future<Output = Result<Option<StoredOffset>>> + Send;

    fn store_consumer_offset(
        &self,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        offset: u64,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The TCP addresses (`ip:port`) of the cluster's nodes as the server advertises them
    /// (nodes without a usable address left out).
    fn cluster_addresses(&self) -> impl Future<Output = Result<Vec<String>>> + Send {
        async move { Ok(usable_addresses(self.cluster_nodes().await?)) }
    }
}

/// `host:port` of each node with a usable address (a port, and an ip that is set and not
/// unspecified).
fn usable_addresses(nodes: Vec<(String, u16)>) -> Vec<String> {
    nodes
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn only_nodes_with_a_usable_address_are_ways_in() {
        let nodes = vec![
            ("10.0.0.1".to_owned(), 8090),
            ("0.0.0.0".to_owned(), 8090),
            ("10.0.0.2".to_owned(), 0),
            (String::new(), 8090),
            ("::1".to_owned(), 8091),
            ("iggy-2".to_owned(), 8092),
        ];
        check!(usable_addresses(nodes) == ["10.0.0.1:8090", "[::1]:8091", "iggy-2:8092"]);
    }
}
