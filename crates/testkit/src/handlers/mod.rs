//! One function per command: decode the payload (failing like `iggy_binary_protocol`), check the
//! session is logged in, resolve what it names, check the user's permission for it, apply the
//! command to [`State`], encode the answer. The order of these steps per command follows the
//! server-0.8.0 handlers, because it decides which status a doubly-wrong request gets (e.g. a
//! missing stream answers 1009 before a missing right answers 41, but a CREATE_USER without
//! `manage_users` answers 41 before its username length is judged).
//!
//! Permissions are checked on every request against the users as they are at that moment (the
//! session holds only a user id), so a change made by UPDATE_PERMISSIONS applies to the very next
//! request of an already open session.
//!
//! This module dispatches by command code; `common` keeps what every group shares (the session,
//! the [`Request`] with its decode → auth → lock skeleton, stream/topic resolution and the
//! checks that come with it); the commands live by group:
//! * `system`: ping, login and logout, clients, stats, cluster metadata;
//! * `users`: user accounts and their permissions;
//! * `streams`, `topics`: their CRUD and purge, and the stream/topic/partition records;
//! * `partitions`: partitions, segments and FLUSH_UNSAVED_BUFFER;
//! * `messages`: SEND_MESSAGES (batch validation, partitioning, the check/append split the
//!   send hold uses) and POLL_MESSAGES;
//! * `offsets`: consumer offsets and how a consumer resolves to a partition and a storage key;
//! * `groups`: consumer groups, membership and revocations.

mod common;
mod groups;
mod messages;
mod offsets;
mod partitions;
mod streams;
mod system;
mod topics;
mod users;

pub(crate) use groups::sync_consumer_group;
pub(crate) use messages::{append_messages, send_destination};

pub(crate) use common::{now_micros, persist_meta, Reply, Session, Shared};

use crate::wire::{command, status};
use common::{auth, Request};

/// Dispatches one request. `payload` is mutable so SEND_MESSAGES can stamp it in place.
pub(crate) fn handle(
    shared: &Shared,
    session: &mut Session,
    code: u32,
    payload: &mut [u8],
    out: &mut Vec<u8>,
) -> Reply {
    match code {
        command::LOGIN_USER => return system::login_user(shared, session, payload, out),
        command::LOGOUT_USER => return system::logout_user(shared, session),
        command::LOGIN_WITH_PERSONAL_ACCESS_TOKEN => {
            return system::login_with_personal_access_token(shared, session, payload, out)
        }
        command::SEND_MESSAGES => return messages::send_messages(shared, session, payload),
        _ => {}
    }
    let req = Request {
        shared,
        session,
        payload,
    };
    match code {
        command::PING => Ok(()),
        command::GET_STATS => system::get_stats(req, out),
        command::GET_CLUSTER_METADATA => system::get_cluster_metadata(req, out),
        command::GET_ME => system::get_me(req, out),
        command::GET_CLIENT => system::get_client(req, out),
        command::GET_CLIENTS => system::get_clients(req, out),
        command::GET_USER => users::get_user(req, out),
        command::GET_USERS => users::get_users(req, out),
        command::CREATE_USER => users::create_user(req, out),
        command::DELETE_USER => users::delete_user(req),
        command::UPDATE_USER => users::update_user(req),
        command::UPDATE_PERMISSIONS => users::update_permissions(req),
        command::CHANGE_PASSWORD => users::change_password(req),
        command::GET_SNAPSHOT_FILE
        | command::GET_PERSONAL_ACCESS_TOKENS..=command::DELETE_PERSONAL_ACCESS_TOKEN => {
            auth(session)?;
            Err(status::FEATURE_UNAVAILABLE)
        }
        command::GET_STREAM => streams::get_stream(req, out),
        command::GET_STREAMS => streams::get_streams(req, out),
        command::CREATE_STREAM => streams::create_stream(req, out),
        command::DELETE_STREAM => streams::delete_stream(req),
        command::UPDATE_STREAM => streams::update_stream(req),
        command::PURGE_STREAM => streams::purge_stream(req),
        command::GET_TOPIC => topics::get_topic(req, out),
        command::GET_TOPICS => topics::get_topics(req, out),
        command::CREATE_TOPIC => topics::create_topic(req, out),
        command::DELETE_TOPIC => topics::delete_topic(req),
        command::UPDATE_TOPIC => topics::update_topic(req),
        command::PURGE_TOPIC => topics::purge_topic(req),
        command::CREATE_PARTITIONS => partitions::create_partitions(req),
        command::DELETE_PARTITIONS => partitions::delete_partitions(req),
        command::DELETE_SEGMENTS => partitions::delete_segments(req),
        command::FLUSH_UNSAVED_BUFFER => partitions::flush_unsaved_buffer(req),
        command::POLL_MESSAGES => messages::poll_messages(req, out),
        command::GET_CONSUMER_OFFSET => offsets::get_consumer_offset(req, out),
        command::STORE_CONSUMER_OFFSET => offsets::store_consumer_offset(req),
        command::DELETE_CONSUMER_OFFSET => offsets::delete_consumer_offset(req),
        command::GET_CONSUMER_GROUP => groups::get_consumer_group(req, out),
        command::GET_CONSUMER_GROUPS => groups::get_consumer_groups(req, out),
        command::CREATE_CONSUMER_GROUP => groups::create_consumer_group(req, out),
        command::DELETE_CONSUMER_GROUP => groups::delete_consumer_group(req),
        command::JOIN_CONSUMER_GROUP => groups::join_consumer_group(req),
        command::LEAVE_CONSUMER_GROUP => groups::leave_consumer_group(req),
        _ => Err(status::INVALID_COMMAND),
    }
}
