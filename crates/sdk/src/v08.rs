//! The adapter for an Iggy 0.8 cluster, through SDK 0.10: the metadata calls pass straight
//! through; messages and offsets become the replicator's own.

use iggy::prelude as sdk10;
use iggy::prelude::ClientWrapper;
use iggy::prelude::{
    Client as _, ClientInfoDetails, CompressionAlgorithm, Consumer, ConsumerGroupClient as _,
    ConsumerGroupDetails, ConsumerOffsetClient as _, IggyClient, IggyError, IggyExpiry,
    IggyMessage, MaxTopicSize, PartitionClient as _, Partitioning, Permissions, PollingStrategy,
    Stream, StreamClient as _, StreamDetails, SystemClient as _, TopicClient as _, TopicDetails,
    UserClient as _, UserStatus,
};
use iggy_binary_protocol::codes::{POLL_MESSAGES_CODE, SEND_MESSAGES_CODE};
use iggy_binary_protocol::requests::messages::PollMessagesRequest;
use iggy_binary_protocol::WireEncode as _;
use iggy_common::locking::IggyRwLockFn as _;
use iggy_common::wire_conversions::{
    consumer_to_wire, identifier_to_wire, partitioning_to_wire, polling_strategy_to_wire,
};
use iggy_common::{BinaryTransport as _, ClusterClient as _};
use iggy_common::{ClientInfo, ConsumerGroup, Identifier, UserInfo, UserInfoDetails};
use replicator_model::IggyVersion;

use crate::cluster::Result;
use crate::message::{impl_sdk_message, SdkMessage as _};
use crate::{Confirmed, HeadersTail, IggyCluster, Message, Polled, StoredOffset};

pub(crate) mod wire;

/// One SDK 0.10 connection to an Iggy 0.8 server.
pub struct V08(pub(crate) IggyClient);

fn ok<T>(result: std::result::Result<T, IggyError>) -> Result<T> {
    result.map_err(crate::Error::from)
}

impl_sdk_message!(sdk10);

/// The replicator's message as SDK 0.10's (tools decode user headers with it); its payload
/// and user headers are shared, not copied.
impl From<&Message> for IggyMessage {
    fn from(m: &Message) -> Self {
        IggyMessage::borrow_from(&mut m.clone())
    }
}

/// A message made with SDK 0.10's builder (test and benchmark producers encode user headers
/// with it), as the replicator's own.
impl From<IggyMessage> for Message {
    fn from(m: IggyMessage) -> Self {
        m.into_message()
    }
}

impl V08 {
    /// Connects and logs in as [`IggyCluster::connect`] does, without the heartbeat task SDK
    /// 0.10's `IggyClient` starts: its PING takes the connection for a round trip every
    /// `heartbeat_interval` whatever else waits for it (see [`crate::Client::connect_without_heartbeat`]).
    pub(crate) async fn connect_without_heartbeat(&self) -> Result<()> {
        let wrapper = self.0.client();
        let transport = wrapper.read().await;
        ok(transport.connect().await)
    }

    /// One request of `code` on this connection's transport, as the SDK's own calls send
    /// theirs (with its reconnect and resend on a lost connection).
    async fn raw(&self, code: u32, payload: bytes::Bytes) -> Result<bytes::Bytes> {
        let wrapper = self.0.client();
        let transport = wrapper.read().await;
        let ClientWrapper::Tcp(tcp) = &*transport else {
            // `ClusterSpec::client` makes every 0.8 connection a TCP one.
            return Err(IggyError::InvalidConfiguration.into());
        };
        ok(tcp.send_raw_with_response(code, payload).await)
    }

    /// A send through `wire`: the request is written straight from the replicator's
    /// messages, with each one's `tail` if any.
    async fn send(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages: &[Message],
        tail: Option<&dyn HeadersTail>,
    ) -> Result<Vec<Confirmed>> {
        if messages.is_empty() {
            return Err(IggyError::InvalidMessagesCount.into());
        }
        let request = wire::encode_send(
            &ok(identifier_to_wire(stream))?,
            &ok(identifier_to_wire(topic))?,
            &ok(partitioning_to_wire(partitioning))?,
            messages,
            tail,
        );
        self.raw(SEND_MESSAGES_CODE, request).await?;
        // Iggy 0.8 confirms nothing.
        Ok(Vec::new())
    }

    /// The benchmarks' baseline, a raw copy loop's step written as an SDK 0.10 user writes it:
    /// polls up to `count` messages of `partition` from `offset` and sends them, as polled, to
    /// the same partition of `to_stream`/`topic` on `to`, through the SDK's own message calls
    /// (none of this adapter's); with `headers`, each message is sent with the user headers it
    /// gives for the message's upstream offset instead. The last offset copied; `None` when
    /// there was nothing.
    pub async fn sdk_poll_and_send(
        &self,
        to: &V08,
        (stream, topic, to_stream): (&Identifier, &Identifier, &Identifier),
        partition: u32,
        offset: u64,
        count: u32,
        headers: Option<fn(u64) -> Option<bytes::Bytes>>,
    ) -> Result<Option<u64>> {
        use iggy::prelude::MessageClient as _;
        let consumer = Consumer::new(ok(Identifier::named("bench-raw"))?);
        let strategy = PollingStrategy::offset(offset);
        let mut polled = ok(self
            .0
            .poll_messages(
                stream,
                topic,
                Some(partition),
                &consumer,
                &strategy,
                count,
                false,
            )
            .await)?;
        let Some(last) = polled.messages.last().map(|m| m.header.offset) else {
            return Ok(None);
        };
        if let Some(headers) = headers {
            for m in &mut polled.messages {
                m.user_headers = headers(m.header.offset);
                m.header.user_headers_length =
                    m.user_headers.as_ref().map_or(0, |h| h.len() as u32);
            }
        }
        let to_partition = Partitioning::partition_id(partition);
        ok(to
            .0
            .send_messages(to_stream, topic, &to_partition, &mut polled.messages)
            .await)?;
        Ok(Some(last))
    }
}

impl IggyCluster for V08 {
    fn generation(&self) -> IggyVersion {
        IggyVersion::V0_8
    }

    async fn connect(&self) -> Result<()> {
        ok(self.0.connect().await)
    }

    async fn shutdown(&self) -> Result<()> {
        ok(self.0.shutdown().await)
    }

    async fn ping(&self) -> Result<()> {
        ok(self.0.ping().await)
    }

    async fn cluster_nodes(&self) -> Result<Vec<(String, u16)>> {
        let metadata = ok(self.0.get_cluster_metadata().await)?;
        Ok(metadata
            .nodes
            .into_iter()
            .map(|n| (n.ip, n.endpoints.tcp))
            .collect())
    }

    async fn get_me(&self) -> Result<ClientInfoDetails> {
        ok(self.0.get_me().await)
    }

    async fn get_clients(&self) -> Result<Vec<ClientInfo>> {
        ok(self.0.get_clients().await)
    }

    async fn get_users(&self) -> Result<Vec<UserInfo>> {
        ok(self.0.get_users().await)
    }

    async fn get_user(&self, user: &Identifier) -> Result<Option<UserInfoDetails>> {
        ok(self.0.get_user(user).await)
    }

    async fn create_user(
        &self,
        username: &str,
        password: &str,
        status: UserStatus,
        permissions: Option<Permissions>,
    ) -> Result<UserInfoDetails> {
        ok(self
            .0
            .create_user(username, password, status, permissions)
            .await)
    }

    async fn update_user(
        &self,
        user: &Identifier,
        username: Option<&str>,
        status: Option<UserStatus>,
    ) -> Result<()> {
        ok(self.0.update_user(user, username, status).await)
    }

    async fn update_permissions(
        &self,
        user: &Identifier,
        permissions: Option<Permissions>,
    ) -> Result<()> {
        ok(self.0.update_permissions(user, permissions).await)
    }

    async fn delete_user(&self, user: &Identifier) -> Result<()> {
        ok(self.0.delete_user(user).await)
    }

    async fn get_streams(&self) -> Result<Vec<Stream>> {
        ok(self.0.get_streams().await)
    }

    async fn get_stream(&self, stream: &Identifier) -> Result<Option<StreamDetails>> {
        ok(self.0.get_stream(stream).await)
    }

    async fn create_stream(&self, name: &str) -> Result<StreamDetails> {
        ok(self.0.create_stream(name).await)
    }

    async fn delete_stream(&self, stream: &Identifier) -> Result<()> {
        ok(self.0.delete_stream(stream).await)
    }

    async fn get_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Option<TopicDetails>> {
        ok(self.0.get_topic(stream, topic).await)
    }

    async fn create_topic(
        &self,
        stream: &Identifier,
        name: &str,
        partitions: u32,
        compression: CompressionAlgorithm,
        replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> Result<TopicDetails> {
        ok(self
            .0
            .create_topic(
                stream,
                name,
                partitions,
                compression,
                replication_factor,
                expiry,
                max_size,
            )
            .await)
    }

    async fn update_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
        compression: CompressionAlgorithm,
        replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> Result<()> {
        ok(self
            .0
            .update_topic(
                stream,
                topic,
                name,
                compression,
                replication_factor,
                expiry,
                max_size,
            )
            .await)
    }

    async fn delete_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<()> {
        ok(self.0.delete_topic(stream, topic).await)
    }

    async fn purge_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<()> {
        ok(self.0.purge_topic(stream, topic).await)
    }

    async fn create_partitions(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        count: u32,
    ) -> Result<()> {
        ok(self.0.create_partitions(stream, topic, count).await)
    }

    /// Through `wire`: the request is the SDK's, the answer is read straight into the
    /// replicator's messages.
    async fn poll_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        consumer: &Consumer,
        strategy: &PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Result<Polled> {
        if count == 0 {
            return Err(IggyError::InvalidMessagesCount.into());
        }
        let request = PollMessagesRequest {
            consumer: ok(consumer_to_wire(consumer))?,
            stream_id: ok(identifier_to_wire(stream))?,
            topic_id: ok(identifier_to_wire(topic))?,
            partition_id: partition,
            strategy: polling_strategy_to_wire(strategy),
            count,
            auto_commit,
        };
        let answer = self.raw(POLL_MESSAGES_CODE, request.to_bytes()).await?;
        ok(wire::decode_polled(&answer))
    }

    async fn send_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages: &mut [Message],
    ) -> Result<Vec<Confirmed>> {
        self.send(stream, topic, partitioning, messages, None).await
    }

    async fn send_messages_with_tail(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning,
        messages: &mut [Message],
        tail: Option<&dyn HeadersTail>,
    ) -> Result<Vec<Confirmed>> {
        self.send(stream, topic, partitioning, messages, tail).await
    }

    async fn get_consumer_groups(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Vec<ConsumerGroup>> {
        ok(self.0.get_consumer_groups(stream, topic).await)
    }

    async fn get_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<Option<ConsumerGroupDetails>> {
        ok(self.0.get_consumer_group(stream, topic, group).await)
    }

    async fn create_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
    ) -> Result<ConsumerGroupDetails> {
        ok(self.0.create_consumer_group(stream, topic, name).await)
    }

    async fn join_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<()> {
        ok(self.0.join_consumer_group(stream, topic, group).await)
    }

    async fn leave_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<()> {
        ok(self.0.leave_consumer_group(stream, topic, group).await)
    }

    async fn get_consumer_offset(
        &self,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
    ) -> Result<Option<StoredOffset>> {
        let info = ok(self
            .0
            .get_consumer_offset(consumer, stream, topic, partition)
            .await)?;
        Ok(info.map(|o| StoredOffset {
            partition: o.partition_id,
            current_offset: o.current_offset,
            stored_offset: o.stored_offset,
        }))
    }

    async fn store_consumer_offset(
        &self,
        consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        offset: u64,
    ) -> Result<()> {
        ok(self
            .0
            .store_consumer_offset(consumer, stream, topic, partition, offset)
            .await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;
    use bytes::Bytes;

    #[test]
    fn a_message_crosses_to_sdk_010_and_back_with_every_field_and_shared_bytes() {
        let payload = Bytes::from_static(b"payload");
        let mut m = Message::new(42, 1234, payload.clone())
            .with_user_headers(Some(Bytes::from_static(b"raw-headers")));
        m.offset = 9;
        m.timestamp = 77;
        let there = IggyMessage::from(&m);
        check!(there.header.user_headers_length == 11);
        check!(there.header.payload_length == 7);
        check!(
            there.payload.as_ptr() == payload.as_ptr(),
            "the payload is shared, not copied"
        );
        check!(Message::from(there) == m);
    }
}
