//! The adapter for an Iggy 0.9 cluster, through SDK 0.11: arguments from SDK 0.10's value
//! types into 0.11's, answers back, messages and offsets into the replicator's own, errors by
//! their code.

use iggy::prelude::{
    ClientInfoDetails, CompressionAlgorithm, Consumer, ConsumerGroupDetails, IggyByteSize,
    IggyError, IggyExpiry, IggyTimestamp, MaxTopicSize, Partition, Partitioning, Permissions,
    PollingStrategy, Stream, StreamDetails, Topic, TopicDetails, UserStatus,
};
use iggy09::prelude::{
    Client as _, ClusterClient as _, ConsumerGroupClient as _, ConsumerOffsetClient as _,
    MessageClient as _, PartitionClient as _, StreamClient as _, SystemClient as _,
    TopicClient as _, UserClient as _,
};
use iggy09_common as n;
use iggy_common::{
    ClientInfo, ConsumerGroup, ConsumerGroupInfo, ConsumerGroupMember, GlobalPermissions, IdKind,
    Identifier, StreamPermissions, TopicPermissions, UserInfo, UserInfoDetails,
};
use replicator_model::IggyVersion;

use crate::cluster::Result;
use crate::message::{impl_sdk_message, Lent, SdkMessage as _};
use crate::{Confirmed, IggyCluster, Message, Place, Polled, StoredOffset};

/// One SDK 0.11 connection to an Iggy 0.9 cluster.
pub struct V09(pub(crate) C);

/// The 0.9 client type.
type C = iggy09::prelude::IggyClient;

/// How long SDK 0.11 waits for the answer to one request, replays on the same session
/// included (its `RESPONSE_READ_TIMEOUT`, private to the SDK).
pub(crate) const RESPONSE_BUDGET: std::time::Duration = std::time::Duration::from_secs(30);

/// The largest span of origin timestamps one 0.9 batch carries (its frames hold µs deltas from
/// the batch's earliest origin timestamp as a u32).
pub(crate) const MAX_ORIGIN_SPAN_MICROS: u64 = u32::MAX as u64;

/// A 0.11 error as the pipeline knows errors (by code). The 0.9-only outcomes whose effect is
/// unknown or that end the session become `Disconnected`, so the connection is dropped and a
/// writer re-reads the target before it sends again.
pub(crate) fn error(e: &n::IggyError) -> IggyError {
    match e {
        n::IggyError::TransientNotAccepted
        | n::IggyError::TransientNotCommitted
        | n::IggyError::StaleClient => IggyError::Disconnected,
        other => {
            let mapped = IggyError::from_code(other.as_code());
            if mapped.as_code() == other.as_code() {
                mapped
            } else {
                // A code the 0.8 generation does not have: keep the meaning in the message.
                tracing::debug!(error = %other, code = other.as_code(), "0.9 error without a 0.8 code");
                IggyError::Error
            }
        }
    }
}

fn map<T>(result: std::result::Result<T, n::IggyError>) -> Result<T> {
    result.map_err(|e| crate::Error::from(error(&e)))
}

fn ident(id: &Identifier) -> Result<n::Identifier> {
    let converted = match id.kind {
        IdKind::Numeric => n::Identifier::numeric(id.get_u32_value()?),
        IdKind::String => n::Identifier::named(&id.get_string_value()?),
    };
    map(converted)
}

fn consumer(c: &Consumer) -> Result<n::Consumer> {
    let id = ident(&c.id)?;
    Ok(match c.kind {
        iggy::prelude::ConsumerKind::Consumer => n::Consumer::new(id),
        iggy::prelude::ConsumerKind::ConsumerGroup => n::Consumer::group(id),
    })
}

fn strategy(s: &PollingStrategy) -> Result<n::PollingStrategy> {
    Ok(n::PollingStrategy {
        kind: map(n::PollingKind::from_code(s.kind.as_code()))?,
        value: s.value,
    })
}

fn partitioning(p: &Partitioning) -> Result<n::Partitioning> {
    Ok(n::Partitioning {
        kind: map(n::PartitioningKind::from_code(p.kind.as_code()))?,
        length: p.length,
        value: p.value.clone(),
    })
}

fn timestamp(t: n::IggyTimestamp) -> IggyTimestamp {
    IggyTimestamp::from(t.as_micros())
}

fn size(s: n::IggyByteSize) -> IggyByteSize {
    IggyByteSize::from(s.as_bytes_u64())
}

fn status(s: UserStatus) -> Result<n::UserStatus> {
    map(n::UserStatus::from_code(s.as_code()))
}

fn status_back(s: n::UserStatus) -> Result<UserStatus> {
    Ok(UserStatus::from_code(s.as_code())?)
}

fn expiry_back(e: n::IggyExpiry) -> IggyExpiry {
    IggyExpiry::from(u64::from(e))
}

fn max_size_back(m: n::MaxTopicSize) -> MaxTopicSize {
    MaxTopicSize::from(u64::from(m))
}

fn compression_back(c: n::CompressionAlgorithm) -> Result<CompressionAlgorithm> {
    Ok(CompressionAlgorithm::from_code(c.as_code())?)
}

fn permissions(p: Permissions) -> n::Permissions {
    let g = p.global;
    n::Permissions {
        global: n::GlobalPermissions {
            manage_servers: g.manage_servers,
            read_servers: g.read_servers,
            manage_users: g.manage_users,
            read_users: g.read_users,
            manage_streams: g.manage_streams,
            read_streams: g.read_streams,
            manage_topics: g.manage_topics,
            read_topics: g.read_topics,
            poll_messages: g.poll_messages,
            send_messages: g.send_messages,
        },
        streams: p.streams.map(|streams| {
            streams
                .into_iter()
                .map(|(id, s)| {
                    let topics = s.topics.map(|topics| {
                        topics
                            .into_iter()
                            .map(|(id, t)| {
                                (
                                    id,
                                    n::TopicPermissions {
                                        manage_topic: t.manage_topic,
                                        read_topic: t.read_topic,
                                        poll_messages: t.poll_messages,
                                        send_messages: t.send_messages,
                                    },
                                )
                            })
                            .collect()
                    });
                    (
                        id,
                        n::StreamPermissions {
                            manage_stream: s.manage_stream,
                            read_stream: s.read_stream,
                            manage_topics: s.manage_topics,
                            read_topics: s.read_topics,
                            poll_messages: s.poll_messages,
                            send_messages: s.send_messages,
                            topics,
                        },
                    )
                })
                .collect()
        }),
    }
}

fn permissions_back(p: n::Permissions) -> Permissions {
    let g = p.global;
    Permissions {
        global: GlobalPermissions {
            manage_servers: g.manage_servers,
            read_servers: g.read_servers,
            manage_users: g.manage_users,
            read_users: g.read_users,
            manage_streams: g.manage_streams,
            read_streams: g.read_streams,
            manage_topics: g.manage_topics,
            read_topics: g.read_topics,
            poll_messages: g.poll_messages,
            send_messages: g.send_messages,
        },
        streams: p.streams.map(|streams| {
            streams
                .into_iter()
                .map(|(id, s)| {
                    let topics = s.topics.map(|topics| {
                        topics
                            .into_iter()
                            .map(|(id, t)| {
                                (
                                    id,
                                    TopicPermissions {
                                        manage_topic: t.manage_topic,
                                        read_topic: t.read_topic,
                                        poll_messages: t.poll_messages,
                                        send_messages: t.send_messages,
                                    },
                                )
                            })
                            .collect()
                    });
                    (
                        id,
                        StreamPermissions {
                            manage_stream: s.manage_stream,
                            read_stream: s.read_stream,
                            manage_topics: s.manage_topics,
                            read_topics: s.read_topics,
                            poll_messages: s.poll_messages,
                            send_messages: s.send_messages,
                            topics,
                        },
                    )
                })
                .collect()
        }),
    }
}

fn user_back(u: n::UserInfoDetails) -> Result<UserInfoDetails> {
    Ok(UserInfoDetails {
        id: u.id,
        created_at: timestamp(u.created_at),
        status: status_back(u.status)?,
        username: u.username,
        permissions: u.permissions.map(permissions_back),
    })
}

fn client_info_back(c: n::ClientInfo) -> ClientInfo {
    ClientInfo {
        client_id: c.client_id,
        user_id: c.user_id,
        address: c.address,
        transport: c.transport,
        consumer_groups_count: c.consumer_groups_count,
    }
}

fn partition_back(p: n::Partition) -> Partition {
    Partition {
        id: p.id,
        created_at: timestamp(p.created_at),
        segments_count: p.segments_count,
        current_offset: p.current_offset,
        size: size(p.size),
        messages_count: p.messages_count,
    }
}

/// A 0.9 topic as the 0.8 vocabulary has it; 0.9 topics have no replication factor of their
/// own (replication is the cluster's), so it reads as 1.
fn topic_back(t: n::Topic) -> Result<Topic> {
    Ok(Topic {
        id: t.id,
        created_at: timestamp(t.created_at),
        name: t.name,
        size: size(t.size),
        message_expiry: expiry_back(t.message_expiry),
        compression_algorithm: compression_back(t.compression_algorithm)?,
        max_topic_size: max_size_back(t.max_topic_size),
        replication_factor: 1,
        messages_count: t.messages_count,
        partitions_count: t.partitions_count,
    })
}

fn topic_details_back(t: n::TopicDetails) -> Result<TopicDetails> {
    Ok(TopicDetails {
        id: t.id,
        created_at: timestamp(t.created_at),
        name: t.name,
        size: size(t.size),
        message_expiry: expiry_back(t.message_expiry),
        compression_algorithm: compression_back(t.compression_algorithm)?,
        max_topic_size: max_size_back(t.max_topic_size),
        replication_factor: 1,
        messages_count: t.messages_count,
        partitions_count: t.partitions_count,
        partitions: t.partitions.into_iter().map(partition_back).collect(),
    })
}

fn stream_details_back(s: n::StreamDetails) -> Result<StreamDetails> {
    Ok(StreamDetails {
        id: s.id,
        created_at: timestamp(s.created_at),
        name: s.name,
        size: size(s.size),
        messages_count: s.messages_count,
        topics_count: s.topics_count,
        topics: s
            .topics
            .into_iter()
            .map(topic_back)
            .collect::<Result<_, _>>()?,
    })
}

fn group_details_back(g: n::ConsumerGroupDetails) -> ConsumerGroupDetails {
    ConsumerGroupDetails {
        id: g.id,
        name: g.name,
        partitions_count: g.partitions_count,
        members_count: g.members_count,
        members: g
            .members
            .into_iter()
            .map(|m| ConsumerGroupMember {
                id: m.id,
                partitions_count: m.partitions_count,
                partitions: m.partitions,
            })
            .collect(),
    }
}

impl_sdk_message!(n);

/// Where `messages` must be cut so that each part's origin timestamps span at most
/// [`MAX_ORIGIN_SPAN_MICROS`]: the lengths of consecutive parts, in order.
pub(crate) fn origin_span_parts(origin_timestamps: &[u64]) -> Vec<usize> {
    let mut parts = Vec::new();
    let mut start = 0;
    while start < origin_timestamps.len() {
        let (mut low, mut high) = (origin_timestamps[start], origin_timestamps[start]);
        let mut end = start + 1;
        while end < origin_timestamps.len() {
            let t = origin_timestamps[end];
            let (l, h) = (low.min(t), high.max(t));
            if h - l > MAX_ORIGIN_SPAN_MICROS {
                break;
            }
            (low, high) = (l, h);
            end += 1;
        }
        parts.push(end - start);
        start = end;
    }
    parts
}

/// The topic settings 0.8 has as fields, as 0.9 options: an expiry or size limit of
/// `ServerDefault` is no option at all (the server's default applies, or the topic's own stays).
#[allow(clippy::type_complexity)]
fn topic_options(
    compression: CompressionAlgorithm,
    expiry: IggyExpiry,
    max_size: MaxTopicSize,
) -> Result<(
    n::CompressionAlgorithm,
    Option<n::IggyExpiry>,
    Option<n::MaxTopicSize>,
)> {
    Ok((
        map(n::CompressionAlgorithm::from_code(compression.as_code()))?,
        (expiry != IggyExpiry::ServerDefault).then(|| n::IggyExpiry::from(u64::from(expiry))),
        (max_size != MaxTopicSize::ServerDefault)
            .then(|| n::MaxTopicSize::from(u64::from(max_size))),
    ))
}

impl V09 {
    /// Connects and logs in as [`IggyCluster::connect`] does, without the heartbeat task SDK
    /// 0.11's `IggyClient` starts (see [`crate::Client::connect_without_heartbeat`]).
    pub(crate) async fn connect_without_heartbeat(&self) -> Result<()> {
        use iggy09_common::locking::IggyRwLockFn as _;
        let wrapper = self.0.client();
        let transport = wrapper.read().await;
        map(transport.connect().await)
    }
}

impl IggyCluster for V09 {
    fn generation(&self) -> IggyVersion {
        IggyVersion::V0_9
    }

    async fn connect(&self) -> Result<()> {
        let c = &self.0;
        map(c.connect().await)
    }

    async fn shutdown(&self) -> Result<()> {
        let c = &self.0;
        map(c.shutdown().await)
    }

    async fn ping(&self) -> Result<()> {
        let c = &self.0;
        map(c.ping().await)
    }

    async fn get_me(&self) -> Result<ClientInfoDetails> {
        let c = &self.0;
        let me = map(c.get_me().await)?;
        Ok(ClientInfoDetails {
            client_id: me.client_id,
            user_id: me.user_id,
            address: me.address,
            transport: me.transport,
            consumer_groups_count: me.consumer_groups_count,
            consumer_groups: me
                .consumer_groups
                .into_iter()
                .map(|g| ConsumerGroupInfo {
                    stream_id: g.stream_id,
                    topic_id: g.topic_id,
                    group_id: g.group_id,
                })
                .collect(),
        })
    }

    async fn get_clients(&self) -> Result<Vec<ClientInfo>> {
        let c = &self.0;
        Ok(map(c.get_clients().await)?
            .into_iter()
            .map(client_info_back)
            .collect())
    }

    async fn get_user(&self, user: &Identifier) -> Result<Option<UserInfoDetails>> {
        let c = &self.0;
        map(c.get_user(&ident(user)?).await)?
            .map(user_back)
            .transpose()
    }

    /// The nodes of the cluster as (ip, tcp port).
    async fn cluster_nodes(&self) -> Result<Vec<(String, u16)>> {
        let c = &self.0;
        Ok(map(c.get_cluster_metadata().await)?
            .nodes
            .into_iter()
            .map(|n| (n.ip, n.endpoints.tcp))
            .collect())
    }

    async fn get_users(&self) -> Result<Vec<UserInfo>> {
        let c = &self.0;
        map(c.get_users().await)?
            .into_iter()
            .map(|u| {
                Ok(UserInfo {
                    id: u.id,
                    created_at: timestamp(u.created_at),
                    status: status_back(u.status)?,
                    username: u.username,
                })
            })
            .collect()
    }

    async fn create_user(
        &self,
        username: &str,
        password: &str,
        user_status: UserStatus,
        user_permissions: Option<Permissions>,
    ) -> Result<UserInfoDetails> {
        let c = &self.0;
        let created = map(c
            .create_user(
                username,
                password,
                status(user_status)?,
                user_permissions.map(permissions),
            )
            .await)?;
        user_back(created)
    }

    async fn update_user(
        &self,
        user: &Identifier,
        username: Option<&str>,
        user_status: Option<UserStatus>,
    ) -> Result<()> {
        let c = &self.0;
        let user_status = user_status.map(status).transpose()?;
        map(c
            .update_user(
                &ident(user)?,
                username,
                user_status,
                &n::UserUpdateOptions::default(),
            )
            .await)
    }

    async fn update_permissions(
        &self,
        user: &Identifier,
        user_permissions: Option<Permissions>,
    ) -> Result<()> {
        let c = &self.0;
        map(c
            .update_permissions(&ident(user)?, user_permissions.map(permissions))
            .await)
    }

    async fn delete_user(&self, user: &Identifier) -> Result<()> {
        let c = &self.0;
        map(c.delete_user(&ident(user)?).await)
    }

    async fn get_streams(&self) -> Result<Vec<Stream>> {
        let c = &self.0;
        Ok(map(c.get_streams().await)?
            .into_iter()
            .map(|s| Stream {
                id: s.id,
                created_at: timestamp(s.created_at),
                name: s.name,
                size: size(s.size),
                messages_count: s.messages_count,
                topics_count: s.topics_count,
            })
            .collect())
    }

    async fn get_stream(&self, stream: &Identifier) -> Result<Option<StreamDetails>> {
        let c = &self.0;
        map(c.get_stream(&ident(stream)?).await)?
            .map(stream_details_back)
            .transpose()
    }

    async fn create_stream(&self, name: &str) -> Result<StreamDetails> {
        let c = &self.0;
        stream_details_back(map(c.create_stream(name).await)?)
    }

    async fn delete_stream(&self, stream: &Identifier) -> Result<()> {
        let c = &self.0;
        map(c.delete_stream(&ident(stream)?).await)
    }

    async fn delete_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<()> {
        let c = &self.0;
        map(c.delete_topic(&ident(stream)?, &ident(topic)?).await)
    }

    async fn purge_topic(&self, stream: &Identifier, topic: &Identifier) -> Result<()> {
        let c = &self.0;
        map(c.purge_topic(&ident(stream)?, &ident(topic)?).await)
    }

    async fn get_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Option<TopicDetails>> {
        let c = &self.0;
        map(c.get_topic(&ident(stream)?, &ident(topic)?).await)?
            .map(topic_details_back)
            .transpose()
    }

    /// Creates a topic with the settings 0.8 had as fixed fields (compression, expiry, size
    /// limit) as its explicit options; everything else, durability included, is left to the target
    /// server's defaults. The SDK's own `create_topic` always states both durability policies,
    /// which would pin them on every mirrored topic (and which servers built before the stable SDK
    /// refuse as unknown keys), so the request is built here with only the keys that are set.
    async fn create_topic(
        &self,
        stream: &Identifier,
        name: &str,
        partitions: u32,
        compression: CompressionAlgorithm,
        _replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> Result<TopicDetails> {
        let c = &self.0;
        use iggy09_binary_protocol::{WireDecode as _, WireEncode as _};
        use n::locking::IggyRwLockFn as _;
        use n::BinaryTransport as _;
        let (compression, expiry, max_size) = topic_options(compression, expiry, max_size)?;
        let options = n::TopicCreateOptions {
            partitions_count: Some(partitions),
            compression_algorithm: Some(compression),
            message_expiry: expiry,
            max_topic_size: max_size,
            ..n::TopicCreateOptions::default()
        };
        let request = iggy09_binary_protocol::requests::topics::CreateTopicRequest {
            stream_id: map(n::wire_conversions::identifier_to_wire(&ident(stream)?))?,
            partitions_count: partitions,
            name: iggy09_binary_protocol::WireName::new(name)
                .map_err(|_| IggyError::InvalidTopicName)?,
            options: map(options.to_explicit_wire(|_| false))?,
        };
        let wrapper = c.client();
        let transport = wrapper.read().await;
        let iggy09::prelude::ClientWrapper::Tcp(tcp) = &*transport else {
            return Err(IggyError::InvalidConfiguration.into());
        };
        let answer = map(tcp
            .send_raw_with_response(
                iggy09_binary_protocol::codes::CREATE_TOPIC_CODE,
                request.to_bytes(),
            )
            .await)?;
        let created =
            iggy09_binary_protocol::responses::topics::GetTopicResponse::decode_from(&answer)
                .map_err(|_| IggyError::InvalidFormat)?;
        topic_details_back(map(n::TopicDetails::try_from(created))?)
    }

    /// Changes a topic's compression, expiry and size limit (the options 0.8 has as fields); an
    /// expiry or size limit of `ServerDefault` leaves the topic's own.
    async fn update_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
        compression: CompressionAlgorithm,
        _replication_factor: Option<u8>,
        expiry: IggyExpiry,
        max_size: MaxTopicSize,
    ) -> Result<()> {
        let c = &self.0;
        let (compression, expiry, max_size) = topic_options(compression, expiry, max_size)?;
        let options = n::TopicUpdateOptions {
            compression_algorithm: Some(compression),
            message_expiry: expiry,
            max_topic_size: max_size,
            ..n::TopicUpdateOptions::default()
        };
        map(c
            .update_topic(&ident(stream)?, &ident(topic)?, name, &options)
            .await)
    }

    async fn create_partitions(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        count: u32,
    ) -> Result<()> {
        let c = &self.0;
        map(c
            .create_partitions(&ident(stream)?, &ident(topic)?, count)
            .await)
    }

    async fn poll_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        polling_consumer: &Consumer,
        polling_strategy: &PollingStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Result<Polled> {
        let c = &self.0;
        let polled = map(c
            .poll_messages(
                &ident(stream)?,
                &ident(topic)?,
                partition,
                &consumer(polling_consumer)?,
                &strategy(polling_strategy)?,
                count,
                auto_commit,
            )
            .await)?;
        Ok(Polled {
            partition: polled.partition_id,
            current_offset: polled.current_offset,
            messages: polled
                .messages
                .into_iter()
                .map(n::IggyMessage::into_message)
                .collect(),
        })
    }

    async fn send_messages(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        to: &Partitioning,
        messages: &mut [Message],
    ) -> Result<Vec<Confirmed>> {
        let c = &self.0;
        let (stream, topic, to) = (ident(stream)?, ident(topic)?, partitioning(to)?);
        let origins: Vec<u64> = messages.iter().map(|m| m.origin_timestamp).collect();
        let mut at = 0;
        let mut confirmed = Vec::new();
        for len in origin_span_parts(&origins) {
            let mut part = Lent::<n::IggyMessage>::new(&mut messages[at..at + len]);
            let answer = map(c.send_messages(&stream, &topic, &to, part.sdk()).await)?;
            drop(part);
            confirmed.push(Confirmed {
                // A part holds at most one batch, whose count is a u32 on the wire.
                messages: u32::try_from(len).unwrap_or(u32::MAX),
                places: answer
                    .confirmations
                    .iter()
                    .map(|c| Place {
                        partition: c.partition_id,
                        base_offset: c.base_offset,
                    })
                    .collect(),
            });
            at += len;
        }
        Ok(confirmed)
    }

    async fn get_consumer_groups(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Vec<ConsumerGroup>> {
        let c = &self.0;
        Ok(
            map(c.get_consumer_groups(&ident(stream)?, &ident(topic)?).await)?
                .into_iter()
                .map(|g| ConsumerGroup {
                    id: g.id,
                    name: g.name,
                    partitions_count: g.partitions_count,
                    members_count: g.members_count,
                })
                .collect(),
        )
    }

    async fn get_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<Option<ConsumerGroupDetails>> {
        let c = &self.0;
        Ok(map(c
            .get_consumer_group(&ident(stream)?, &ident(topic)?, &ident(group)?)
            .await)?
        .map(group_details_back))
    }

    async fn create_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        name: &str,
    ) -> Result<ConsumerGroupDetails> {
        let c = &self.0;
        Ok(group_details_back(map(c
            .create_consumer_group(&ident(stream)?, &ident(topic)?, name)
            .await)?))
    }

    async fn join_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<()> {
        let c = &self.0;
        map(c
            .join_consumer_group(&ident(stream)?, &ident(topic)?, &ident(group)?)
            .await)
    }

    async fn leave_consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<()> {
        let c = &self.0;
        map(c
            .leave_consumer_group(&ident(stream)?, &ident(topic)?, &ident(group)?)
            .await)
    }

    async fn get_consumer_offset(
        &self,
        offset_consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
    ) -> Result<Option<StoredOffset>> {
        let c = &self.0;
        Ok(map(c
            .get_consumer_offset(
                &consumer(offset_consumer)?,
                &ident(stream)?,
                &ident(topic)?,
                partition,
            )
            .await)?
        .map(|o| StoredOffset {
            partition: o.partition_id,
            current_offset: o.current_offset,
            stored_offset: o.stored_offset,
        }))
    }

    async fn store_consumer_offset(
        &self,
        offset_consumer: &Consumer,
        stream: &Identifier,
        topic: &Identifier,
        partition: Option<u32>,
        offset: u64,
    ) -> Result<()> {
        let c = &self.0;
        map(c
            .store_consumer_offset(
                &consumer(offset_consumer)?,
                &ident(stream)?,
                &ident(topic)?,
                partition,
                offset,
            )
            .await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn a_batch_is_cut_only_where_origin_timestamps_span_too_far() {
        check!(origin_span_parts(&[]).is_empty());
        check!(origin_span_parts(&[5, 1, 9]) == vec![3]);
        let far = MAX_ORIGIN_SPAN_MICROS;
        // Exactly the largest span still fits; one µs more starts a new part.
        check!(origin_span_parts(&[0, far]) == vec![2]);
        check!(origin_span_parts(&[0, far + 1]) == vec![1, 1]);
        // Out of order: the span is judged over the part, not from its first message.
        check!(origin_span_parts(&[10, 0, far + 5, far + 11]) == vec![2, 2]);
    }

    #[test]
    fn errors_map_by_code_and_unknown_outcomes_drop_the_connection() {
        check!(error(&n::IggyError::Unauthorized).as_code() == IggyError::Unauthorized.as_code());
        check!(error(&n::IggyError::TransientNotCommitted) == IggyError::Disconnected);
        check!(error(&n::IggyError::TransientNotAccepted) == IggyError::Disconnected);
        check!(
            error(&n::IggyError::TopicIdNotFound(
                n::Identifier::numeric(1).unwrap(),
                n::Identifier::numeric(2).unwrap()
            ))
            .as_code()
                == 2010
        );
    }

    #[test]
    fn messages_are_lent_to_sdk_011_with_every_field_and_are_whole_again_after() {
        let payload = bytes::Bytes::from_static(b"payload");
        let mut m = Message::new(42, 1234, payload.clone())
            .with_user_headers(Some(bytes::Bytes::from_static(b"raw-headers")));
        m.offset = 5;
        m.timestamp = 6;
        let mut batch = [m.clone()];
        {
            let mut lent = Lent::<n::IggyMessage>::new(&mut batch);
            let there = &lent.sdk()[0];
            check!(there.header.id == 42);
            check!(there.header.origin_timestamp == 1234);
            check!(there.header.user_headers_length == 11);
            check!(there.header.payload_length == 7);
            check!(
                there.payload.as_ptr() == payload.as_ptr(),
                "the payload is moved, not copied"
            );
        }
        check!(
            batch == [m.clone()],
            "the batch is whole again once the send ends"
        );
        let polled = n::IggyMessage::borrow_from(&mut m.clone());
        check!(
            polled.into_message() == m,
            "and a polled message reads back with every field"
        );
    }
}
