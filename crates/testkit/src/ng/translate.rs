//! Each 0.9 command as the shared 0.8 handler it amounts to. The handler decodes, resolves,
//! checks rights and applies exactly as for a 0.8 client, so both generations share one set of
//! semantics; this module only converts the bodies on the way in and the answers on the way out:
//! * bodies both generations encode alike (most reads, deletes, purges, partitions, groups,
//!   permissions) pass unchanged;
//! * streams, topics and users carry an options block in 0.9. Stream and user blocks must be
//!   empty (no option keys exist for them yet: any key is refused by name, 4041); topic blocks
//!   carry what 0.8 had as fixed fields (compression, expiry, size limit) plus runtime knobs,
//!   parsed with the 0.9 catalog. The explicit block is kept with the topic and answered back,
//!   and the *derived* block lists what the server chose for every key the client left out;
//! * an update of a topic patches only the keys it sends;
//! * consumer-offset writes end with an ack-level byte;
//! * messages travel as 0.9 batches (see `messages`).

use crate::handlers::{handle, sync_consumer_group, Reply, Session, Shared};
use crate::state::{read, write, Meta};
use crate::wire::{command, status, Ident};
use iggy09_binary_protocol as v09;
use iggy09_binary_protocol::codes::DESCRIBE_OPTIONS_CODE;
use iggy09_binary_protocol::codes::SYNC_CONSUMER_GROUP_CODE;
use iggy09_binary_protocol::primitives::options::WireOptions;
use iggy09_binary_protocol::requests::consumer_offsets::{
    DeleteConsumerOffsetRequest, StoreConsumerOffsetRequest,
};
use iggy09_binary_protocol::requests::streams::{CreateStreamRequest, UpdateStreamRequest};
use iggy09_binary_protocol::requests::system::{DescribeOptionsRequest, OPTIONS_SCOPE_TOPIC};
use iggy09_binary_protocol::requests::topics::{CreateTopicRequest, UpdateTopicRequest};
use iggy09_binary_protocol::requests::users::{CreateUserRequest, UpdateUserRequest};
use iggy09_binary_protocol::responses::consumer_groups::SyncConsumerGroupResponse;
use iggy09_binary_protocol::responses::system::{DescribeOptionsResponse, OptionDescriptor};
use iggy09_binary_protocol::WireName;
use iggy09_binary_protocol::{WireDecode, WireEncode, WireIdentifier};
use iggy09_common::{
    topic_option_keys as keys, CompressionAlgorithm, Durability, IggyByteSize, IggyError,
    IggyExpiry, MaxTopicSize, TopicCreateOptions, TopicRuntimeDefaults, DEFAULT_MAX_TOPIC_SIZE,
    DEFAULT_MESSAGE_EXPIRY, MAX_TOPIC_SEGMENT_SIZE, MIN_TOPIC_SEGMENT_SIZE, TOPIC_OPTION_KEYS,
    UPDATABLE_TOPIC_OPTION_KEYS,
};
use iggy_binary_protocol as v08;
use iggy_binary_protocol::WireEncode as _;

/// Runs the 0.9 command `code` with `body` through the shared handlers; the 0.9 answer is
/// appended to `out`.
pub(super) fn execute(
    shared: &Shared,
    session: &mut Session,
    code: u32,
    body: &mut [u8],
    out: &mut Vec<u8>,
) -> Reply {
    match code {
        command::CREATE_STREAM => create_stream(shared, session, body, out),
        command::UPDATE_STREAM => update_stream(shared, session, body),
        command::GET_STREAM => {
            let answer = run(shared, session, code, body)?;
            stream_answer(shared, &answer, out)
        }
        command::GET_STREAMS => {
            let answer = run(shared, session, code, body)?;
            streams_answer(&answer, out)
        }
        command::CREATE_TOPIC => create_topic(shared, session, body, out),
        command::UPDATE_TOPIC => update_topic(shared, session, body),
        command::GET_TOPIC => {
            let stream = stream_of(body)?;
            let answer = run(shared, session, code, body)?;
            topic_answer(shared, &stream, &answer, out)
        }
        command::GET_TOPICS => {
            let stream = stream_of(body)?;
            let answer = run(shared, session, code, body)?;
            topics_answer(shared, &stream, &answer, out)
        }
        command::CREATE_USER => create_user(shared, session, body, out),
        command::UPDATE_USER => update_user(shared, session, body),
        command::GET_USER => {
            let answer = run(shared, session, code, body)?;
            user_answer(&answer, out)
        }
        command::GET_USERS => {
            let answer = run(shared, session, code, body)?;
            users_answer(&answer, out)
        }
        // Decoded whole first (an unknown ack level is refused like the server's decode refuses
        // it); then the 0.8 body is the 0.9 one without its trailing ack-level byte, which a
        // server of one node has nothing to wait on for.
        command::STORE_CONSUMER_OFFSET => {
            decode::<StoreConsumerOffsetRequest>(body)?;
            let without_ack = body.len() - 1;
            handle(shared, session, code, &mut body[..without_ack], out)
        }
        command::DELETE_CONSUMER_OFFSET => {
            decode::<DeleteConsumerOffsetRequest>(body)?;
            let without_ack = body.len() - 1;
            handle(shared, session, code, &mut body[..without_ack], out)
        }
        command::SEND_MESSAGES | command::POLL_MESSAGES => {
            super::messages::execute(shared, session, code, body, out)
        }
        // 0.9 only: the option catalogs and a member's assignment.
        DESCRIBE_OPTIONS_CODE => describe_options(shared, body, out),
        SYNC_CONSUMER_GROUP_CODE => {
            if let Some((changes, partitions)) = sync_consumer_group(shared, session, body) {
                out.extend_from_slice(
                    &SyncConsumerGroupResponse {
                        generation: changes,
                        partitions,
                    }
                    .to_bytes(),
                );
            }
            Ok(())
        }
        _ => handle(shared, session, code, body, out),
    }
}

/// Runs the 0.8 handler of `code` on `payload` and returns its answer.
fn run(
    shared: &Shared,
    session: &mut Session,
    code: u32,
    payload: &mut [u8],
) -> Result<Vec<u8>, u32> {
    let mut answer = Vec::new();
    handle(shared, session, code, payload, &mut answer)?;
    Ok(answer)
}

/// Decodes a whole 0.9 body; a malformed one answers 4 (`InvalidFormat`), as the server's
/// request decode does.
fn decode<T: WireDecode>(body: &[u8]) -> Result<T, u32> {
    T::decode_from(body).map_err(|_| status::INVALID_FORMAT)
}

/// Encodes a 0.8 value.
fn encode08(value: &impl v08::WireEncode) -> Vec<u8> {
    value.to_bytes().to_vec()
}

/// Decodes a 0.8 answer the shared handler wrote (a failure is a bug of this module).
fn decode08<T: v08::WireDecode>(answer: &[u8]) -> Result<T, u32> {
    T::decode_from(answer).map_err(|e| {
        tracing::error!(error = %e, "0.9 codec cannot read the 0.8 handler's answer");
        status::INVALID_COMMAND
    })
}

fn error_code(error: &IggyError) -> u32 {
    error.as_code()
}

fn name08(name: &v09::WireName) -> Result<v08::WireName, u32> {
    v08::WireName::new(name.as_str()).map_err(|_| status::INVALID_FORMAT)
}

fn name09(name: &v08::WireName) -> Result<v09::WireName, u32> {
    v09::WireName::new(name.as_str()).map_err(|_| status::INVALID_FORMAT)
}

fn ident08(id: &WireIdentifier) -> Result<v08::WireIdentifier, u32> {
    Ok(match id {
        WireIdentifier::Numeric(n) => v08::WireIdentifier::Numeric(*n),
        WireIdentifier::String(name) => v08::WireIdentifier::String(name08(name)?),
    })
}

fn ident(id: &WireIdentifier) -> Ident<'_> {
    match id {
        WireIdentifier::Numeric(n) => Ident::Numeric(*n),
        WireIdentifier::String(name) => Ident::Name(name.as_str()),
    }
}

/// Refuses any key in the options block of a resource that has no option keys yet.
fn no_options(options: &WireOptions) -> Reply {
    match options.iter().next() {
        None => Ok(()),
        Some(entry) => Err(error_code(&IggyError::UnsupportedOptionKey(
            String::from_utf8_lossy(entry.key).into_owned(),
        ))),
    }
}

// Streams.

fn create_stream(shared: &Shared, session: &mut Session, body: &[u8], out: &mut Vec<u8>) -> Reply {
    let request = decode::<CreateStreamRequest>(body)?;
    no_options(&request.options)?;
    let mut payload = encode08(&v08::requests::streams::CreateStreamRequest {
        name: name08(&request.name)?,
    });
    let answer = run(shared, session, command::CREATE_STREAM, &mut payload)?;
    stream_answer(shared, &answer, out)
}

fn update_stream(shared: &Shared, session: &mut Session, body: &[u8]) -> Reply {
    let request = decode::<UpdateStreamRequest>(body)?;
    no_options(&request.options)?;
    let mut payload = encode08(&v08::requests::streams::UpdateStreamRequest {
        stream_id: ident08(&request.stream_id)?,
        name: name08(&request.name)?,
    });
    run(shared, session, command::UPDATE_STREAM, &mut payload).map(drop)
}

fn stream09(
    stream: &v08::responses::streams::StreamResponse,
) -> Result<v09::responses::streams::StreamResponse, u32> {
    Ok(v09::responses::streams::StreamResponse {
        id: stream.id,
        created_at: stream.created_at,
        topics_count: stream.topics_count,
        size_bytes: stream.size_bytes,
        messages_count: stream.messages_count,
        name: name09(&stream.name)?,
        options: WireOptions::empty(),
    })
}

/// A stream with its topics (GET_STREAM, CREATE_STREAM); an empty answer (no such stream)
/// stays empty.
fn stream_answer(shared: &Shared, answer: &[u8], out: &mut Vec<u8>) -> Reply {
    if answer.is_empty() {
        return Ok(());
    }
    let stream = decode08::<v08::responses::streams::GetStreamResponse>(answer)?;
    let meta = read(&shared.state.meta);
    let topics = stream
        .topics
        .iter()
        .map(|topic| topic09(&meta, runtime_defaults(shared), stream.stream.id, topic))
        .collect::<Result<Vec<_>, u32>>()?;
    drop(meta);
    let converted = v09::responses::streams::GetStreamResponse {
        stream: stream09(&stream.stream)?,
        topics,
    };
    out.extend_from_slice(&converted.to_bytes());
    Ok(())
}

fn streams_answer(answer: &[u8], out: &mut Vec<u8>) -> Reply {
    let streams = decode08::<v08::responses::streams::GetStreamsResponse>(answer)?;
    let converted = v09::responses::streams::GetStreamsResponse {
        streams: streams
            .streams
            .iter()
            .map(stream09)
            .collect::<Result<_, _>>()?,
    };
    out.extend_from_slice(&converted.to_bytes());
    Ok(())
}

// Topics.

/// What a 0.9 server resolves the runtime knobs of a topic to when its client leaves them out
/// (the server's defaults; the segment size is this server's).
fn runtime_defaults(shared: &Shared) -> TopicRuntimeDefaults {
    TopicRuntimeDefaults {
        segment_size: IggyByteSize::from(shared.config.segment_size),
        durability: Durability::default(),
        consumer_offset_durability: Durability::default(),
        messages_required_to_save: 1024,
        size_of_messages_required_to_save: IggyByteSize::from(1024 * 1024),
        preallocate_segments: false,
    }
}

/// The stream a topic-level body names first.
fn stream_of(body: &[u8]) -> Result<WireIdentifier, u32> {
    WireIdentifier::decode(body)
        .map(|(id, _)| id)
        .map_err(|_| status::INVALID_FORMAT)
}

fn create_topic(shared: &Shared, session: &mut Session, body: &[u8], out: &mut Vec<u8>) -> Reply {
    let request = decode::<CreateTopicRequest>(body)?;
    let options = TopicCreateOptions::parse(&request.options).map_err(|e| error_code(&e))?;
    let mut payload = encode08(&v08::requests::topics::CreateTopicRequest {
        stream_id: ident08(&request.stream_id)?,
        partitions_count: request.partitions_count,
        compression_algorithm: options.compression_algorithm.unwrap_or_default().as_code(),
        message_expiry: options.message_expiry.map_or(0, u64::from),
        max_topic_size: options.max_topic_size.map_or(0, u64::from),
        replication_factor: 0,
        name: name08(&request.name)?,
    });
    let answer = run(shared, session, command::CREATE_TOPIC, &mut payload)?;
    let created = decode08::<v08::responses::topics::GetTopicResponse>(&answer)?;
    // Keep the block as sent with the new topic, so its answers echo it.
    with_topic_options(shared, &request.stream_id, created.topic.id, |kept| {
        *kept = request.options.as_bytes().to_vec();
    })?;
    topic_answer(shared, &request.stream_id, &answer, out)
}

fn update_topic(shared: &Shared, session: &mut Session, body: &[u8]) -> Reply {
    let request = decode::<UpdateTopicRequest>(body)?;
    // Only the keys that used to be fixed fields may change; each parses as at creation.
    if let Some(key) = request
        .options
        .iter()
        .map(|entry| String::from_utf8_lossy(entry.key))
        .find(|key| !UPDATABLE_TOPIC_OPTION_KEYS.contains(&key.as_ref()))
    {
        return Err(error_code(&IggyError::UnsupportedOptionKey(
            key.into_owned(),
        )));
    }
    let update = TopicCreateOptions::parse(&request.options).map_err(|e| error_code(&e))?;
    // 0.9 patches the keys sent; the 0.8 command sets all three, so the others keep the values
    // the topic has now. A missing topic answers like the handler would.
    let current = {
        let meta = read(&shared.state.meta);
        meta.find_stream(ident(&request.stream_id)).and_then(|sid| {
            let stream = meta.streams.get(sid)?;
            let tid = stream.find_topic(ident(&request.topic_id))?;
            let topic = stream.topics.get(tid)?;
            // The topic's resolved segment size: its explicit option, else the server's.
            let segment_size = WireOptions::from_slice(&topic.options)
                .ok()
                .and_then(|o| TopicCreateOptions::parse(&o).ok())
                .and_then(|o| o.segment_size)
                .map_or(shared.config.segment_size, |s| s.as_bytes_u64());
            Some((
                tid,
                topic.compression,
                topic.message_expiry,
                topic.max_topic_size,
                segment_size,
            ))
        })
    };
    let (_, compression, expiry, size, segment_size) =
        current.unwrap_or((0, 1, 0, 0, shared.config.segment_size));
    // A cap below one segment could never be kept: the server refuses it before anything
    // changes (ServerDefault and Unlimited pass), on update as at creation.
    if let Some(cap) = update.max_topic_size {
        if cap != MaxTopicSize::ServerDefault && cap.as_bytes_u64() < segment_size {
            return Err(error_code(&IggyError::InvalidTopicSize(
                cap,
                IggyByteSize::from(segment_size),
            )));
        }
    }
    let mut payload = encode08(&v08::requests::topics::UpdateTopicRequest {
        stream_id: ident08(&request.stream_id)?,
        topic_id: ident08(&request.topic_id)?,
        compression_algorithm: update
            .compression_algorithm
            .map_or(compression, |c| c.as_code()),
        message_expiry: update.message_expiry.map_or(expiry, u64::from),
        max_topic_size: update.max_topic_size.map_or(size, u64::from),
        replication_factor: 0,
        name: name08(&request.name)?,
    });
    run(shared, session, command::UPDATE_TOPIC, &mut payload)?;
    // The update succeeded, so the topic was found above; a rename keeps its id.
    if let Some((tid, ..)) = current {
        with_topic_options(shared, &request.stream_id, tid as u32, |kept| {
            *kept = patch_options(kept, &request.options);
        })?;
    }
    Ok(())
}

/// The topic's explicit block with every key of `patch` set to the patch's value.
fn patch_options(kept: &[u8], patch: &WireOptions) -> Vec<u8> {
    let kept = WireOptions::from_slice(kept).unwrap_or_else(|_| WireOptions::empty());
    let patched: Vec<&[u8]> = patch.iter().map(|entry| entry.key).collect();
    let entries: Vec<(u8, &[u8], u8, &[u8])> = kept
        .iter()
        .filter(|entry| !patched.contains(&entry.key))
        .chain(patch.iter())
        .map(|entry| (entry.key_kind.0, entry.key, entry.value_kind.0, entry.value))
        .collect();
    let mut out = bytes::BytesMut::new();
    v09::encode_user_headers(&entries, &mut out);
    out.to_vec()
}

/// Runs `f` on the kept options block of topic `topic_id` in `stream`, then persists.
fn with_topic_options(
    shared: &Shared,
    stream: &WireIdentifier,
    topic_id: u32,
    f: impl FnOnce(&mut Vec<u8>),
) -> Reply {
    {
        let mut meta = write(&shared.state.meta);
        let sid = meta
            .find_stream(ident(stream))
            .ok_or(status::STREAM_ID_NOT_FOUND)?;
        let topic = meta
            .streams
            .get_mut(sid)
            .and_then(|s| s.topics.get_mut(topic_id as usize))
            .ok_or(status::TOPIC_ID_NOT_FOUND)?;
        f(&mut topic.options);
    }
    crate::handlers::persist_meta(shared);
    Ok(())
}

/// DESCRIBE_OPTIONS: the topic option catalog, every key CREATE_TOPIC accepts with the kind
/// and default this server resolves when a client leaves it out (the same values a topic's
/// derived block lists); streams and users have no option keys. An unknown scope is refused
/// like a malformed body, as the server's decode refuses it.
fn describe_options(shared: &Shared, body: &[u8], out: &mut Vec<u8>) -> Reply {
    let request = decode::<DescribeOptionsRequest>(body)?;
    let entries = if request.scope == OPTIONS_SCOPE_TOPIC {
        topic_option_catalog(shared)?
    } else {
        Vec::new()
    };
    out.extend_from_slice(&DescribeOptionsResponse { entries }.to_bytes());
    Ok(())
}

fn topic_option_catalog(shared: &Shared) -> Result<Vec<OptionDescriptor>, u32> {
    let none = WireOptions::empty();
    let defaults = TopicCreateOptions::parse_committed(&none)
        .derived_block(
            CompressionAlgorithm::default(),
            IggyExpiry::from(DEFAULT_MESSAGE_EXPIRY),
            MaxTopicSize::from(DEFAULT_MAX_TOPIC_SIZE),
            runtime_defaults(shared),
            &none,
        )
        .map_err(|e| error_code(&e))?;
    TOPIC_OPTION_KEYS
        .iter()
        .map(|key| {
            let default = defaults
                .iter()
                .find(|entry| entry.key == key.as_bytes())
                .ok_or(status::INVALID_FORMAT)?;
            Ok(OptionDescriptor {
                key: WireName::new(*key).map_err(|_| status::INVALID_FORMAT)?,
                kind: default.value_kind.0,
                default_value: bytes::Bytes::copy_from_slice(default.value),
                description: option_description(key),
            })
        })
        .collect()
}

/// What a topic option key means, in the catalog's words.
fn option_description(key: &str) -> String {
    match key {
        keys::COMPRESSION_ALGORITHM => "Compression of stored messages: none or gzip".into(),
        keys::MESSAGE_EXPIRY => {
            "How long messages are kept: microseconds, or a duration such as 7 days".into()
        }
        keys::MAX_TOPIC_SIZE => "Largest size of the topic: bytes, or a size such as 1 GiB".into(),
        keys::SEGMENT_SIZE => format!(
            "Size of one segment: bytes, or a size such as 128 MiB; a multiple of 512 in \
             {MIN_TOPIC_SEGMENT_SIZE}..={MAX_TOPIC_SEGMENT_SIZE}"
        ),
        keys::DURABILITY => "When a send is answered: replicated or persisted".into(),
        keys::CONSUMER_OFFSET_DURABILITY => {
            "When a consumer-offset write is answered: replicated or persisted".into()
        }
        keys::MESSAGES_REQUIRED_TO_SAVE => "Flush once this many messages are unsaved".into(),
        keys::SIZE_OF_MESSAGES_REQUIRED_TO_SAVE => {
            "Flush once this many bytes are unsaved: bytes, or a size".into()
        }
        keys::PREALLOCATE_SEGMENTS => "Reserve each segment's disk space up front".into(),
        other => format!("Topic option {other}"),
    }
}

/// The 0.9 header of a topic the 0.8 handler described: the kept explicit block and the derived
/// one (each key the client left out, with the value the server resolved).
fn topic09(
    meta: &Meta,
    defaults: TopicRuntimeDefaults,
    stream_id: u32,
    topic: &v08::responses::streams::TopicHeader,
) -> Result<v09::responses::streams::TopicHeader, u32> {
    let explicit = meta
        .streams
        .get(stream_id as usize)
        .and_then(|s| s.topics.get(topic.id as usize))
        .map(|t| t.options.clone())
        .unwrap_or_default();
    let explicit = WireOptions::from_slice(&explicit).unwrap_or_else(|_| WireOptions::empty());
    let parsed = TopicCreateOptions::parse_committed(&explicit);
    let compression =
        CompressionAlgorithm::from_code(topic.compression_algorithm).unwrap_or_default();
    let derived = parsed
        .derived_block(
            compression,
            IggyExpiry::from(topic.message_expiry),
            MaxTopicSize::from(topic.max_topic_size),
            defaults,
            &explicit,
        )
        .map_err(|e| error_code(&e))?;
    Ok(v09::responses::streams::TopicHeader {
        id: topic.id,
        created_at: topic.created_at,
        partitions_count: topic.partitions_count,
        message_expiry: topic.message_expiry,
        compression_algorithm: topic.compression_algorithm,
        max_topic_size: topic.max_topic_size,
        size_bytes: topic.size_bytes,
        messages_count: topic.messages_count,
        name: name09(&topic.name)?,
        options: explicit,
        derived_options: derived,
    })
}

/// A topic with its partitions (GET_TOPIC, CREATE_TOPIC); an empty answer stays empty.
fn topic_answer(
    shared: &Shared,
    stream: &WireIdentifier,
    answer: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    if answer.is_empty() {
        return Ok(());
    }
    let topic = decode08::<v08::responses::topics::GetTopicResponse>(answer)?;
    let meta = read(&shared.state.meta);
    let Some(sid) = meta.find_stream(ident(stream)) else {
        return Ok(());
    };
    let header = topic09(&meta, runtime_defaults(shared), sid as u32, &topic.topic)?;
    drop(meta);
    let converted = v09::responses::topics::GetTopicResponse {
        topic: header,
        partitions: topic
            .partitions
            .iter()
            .map(|p| v09::responses::topics::PartitionResponse {
                id: p.id,
                created_at: p.created_at,
                segments_count: p.segments_count,
                current_offset: p.current_offset,
                size_bytes: p.size_bytes,
                messages_count: p.messages_count,
            })
            .collect(),
    };
    out.extend_from_slice(&converted.to_bytes());
    Ok(())
}

/// The topics of a stream (GET_TOPICS), count-prefixed in 0.9.
fn topics_answer(
    shared: &Shared,
    stream: &WireIdentifier,
    answer: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let topics = decode08::<v08::responses::topics::GetTopicsResponse>(answer)?;
    let meta = read(&shared.state.meta);
    let sid = meta.find_stream(ident(stream)).unwrap_or(usize::MAX) as u32;
    let converted = v09::responses::topics::GetTopicsResponse {
        topics: topics
            .topics
            .iter()
            .map(|topic| topic09(&meta, runtime_defaults(shared), sid, topic))
            .collect::<Result<_, _>>()?,
    };
    drop(meta);
    out.extend_from_slice(&converted.to_bytes());
    Ok(())
}

// Users.

fn create_user(shared: &Shared, session: &mut Session, body: &[u8], out: &mut Vec<u8>) -> Reply {
    let request = decode::<CreateUserRequest>(body)?;
    no_options(&request.options)?;
    // The 0.8 body is the 0.9 one without its trailing options block.
    let mut payload = body[..body.len() - request.options.as_bytes().len()].to_vec();
    let answer = run(shared, session, command::CREATE_USER, &mut payload)?;
    user_answer(&answer, out)
}

fn update_user(shared: &Shared, session: &mut Session, body: &[u8]) -> Reply {
    let request = decode::<UpdateUserRequest>(body)?;
    no_options(&request.options)?;
    let mut payload = body[..body.len() - request.options.as_bytes().len()].to_vec();
    run(shared, session, command::UPDATE_USER, &mut payload).map(drop)
}

fn user09(
    user: &v08::responses::users::UserResponse,
) -> Result<v09::responses::users::UserResponse, u32> {
    Ok(v09::responses::users::UserResponse {
        id: user.id,
        created_at: user.created_at,
        status: user.status,
        username: name09(&user.username)?,
        options: WireOptions::empty(),
    })
}

/// A user with permissions (GET_USER, CREATE_USER); an empty answer stays empty.
fn user_answer(answer: &[u8], out: &mut Vec<u8>) -> Reply {
    if answer.is_empty() {
        return Ok(());
    }
    let user = decode08::<v08::responses::users::UserDetailsResponse>(answer)?;
    // Permissions encode alike in both generations.
    let permissions = user
        .permissions
        .map(|p| {
            v09::WirePermissions::decode_from(&p.to_bytes()).map_err(|_| status::INVALID_COMMAND)
        })
        .transpose()?;
    let converted = v09::responses::users::UserDetailsResponse {
        user: user09(&user.user)?,
        permissions,
    };
    out.extend_from_slice(&converted.to_bytes());
    Ok(())
}

fn users_answer(answer: &[u8], out: &mut Vec<u8>) -> Reply {
    let users = decode08::<v08::responses::users::GetUsersResponse>(answer)?;
    let converted = v09::responses::users::GetUsersResponse {
        users: users.users.iter().map(user09).collect::<Result<_, _>>()?,
    };
    out.extend_from_slice(&converted.to_bytes());
    Ok(())
}
