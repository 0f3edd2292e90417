//! Users, their permissions, and the permission checks of server 0.8.0
//! (`metadata/reader.rs`, the `perm_*` functions, and the lookup tables `metadata/absorb.rs`
//! maintains for them).
//!
//! The checks read a [`PermissionIndex`] derived from the stored permissions, not the stored
//! permissions themselves, because the server does the same and the two can differ: deleting a
//! stream drops every user's entry for that stream id from the index only, so a later stream that
//! reuses the slot id is not covered by the old entry until the user is next updated (any
//! UPDATE_USER, UPDATE_PERMISSIONS or CHANGE_PASSWORD) or the server restarts.
//!
//! Every check is made against the shared state at the time of the request; a session holds only
//! its user id, so UPDATE_PERMISSIONS takes effect on the next request of an open session.

use crate::slab::Slab;
use crate::wire::{status, DecodeError, Ident, Put, Reader};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;

/// Id of the root user (`DEFAULT_ROOT_USER_ID`); it cannot be deleted and its permissions cannot
/// be changed.
pub(crate) const ROOT_USER_ID: u32 = 0;
/// Username length bounds (`MIN_USERNAME_LENGTH..=MAX_USERNAME_LENGTH`).
pub(crate) const USERNAME_LEN: RangeInclusive<usize> = 3..=50;
/// Password length bounds (`MIN_PASSWORD_LENGTH..=MAX_PASSWORD_LENGTH`).
pub(crate) const PASSWORD_LEN: RangeInclusive<usize> = 3..=100;

/// Whether a user may log in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum UserStatus {
    /// Code 1.
    Active,
    /// Code 2: existing sessions keep working, new logins answer 47 `UserInactive`.
    Inactive,
}

impl UserStatus {
    /// The wire code.
    pub(crate) fn code(self) -> u8 {
        match self {
            UserStatus::Active => 1,
            UserStatus::Inactive => 2,
        }
    }

    /// `UserStatus::from_code`: anything but 1 and 2 is `InvalidCommand`.
    pub(crate) fn from_code(code: u8) -> Result<Self, u32> {
        match code {
            1 => Ok(UserStatus::Active),
            2 => Ok(UserStatus::Inactive),
            _ => Err(status::INVALID_COMMAND),
        }
    }
}

/// Rights over the whole server, in wire order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GlobalPermissions {
    /// Implies nothing by itself in server 0.8.0 beyond `read_servers`.
    pub(crate) manage_servers: bool,
    /// GET_STATS, GET_CLIENT(S).
    pub(crate) read_servers: bool,
    /// Every user command.
    pub(crate) manage_users: bool,
    /// GET_USER(S).
    pub(crate) read_users: bool,
    /// Every stream, topic and message command.
    pub(crate) manage_streams: bool,
    /// Reading streams and topics, polling.
    pub(crate) read_streams: bool,
    /// Managing every topic, sending and polling.
    pub(crate) manage_topics: bool,
    /// Reading topics, consumer groups, polling.
    pub(crate) read_topics: bool,
    /// Polling every topic.
    pub(crate) poll_messages: bool,
    /// Sending to every topic.
    pub(crate) send_messages: bool,
}

/// Rights over one stream and its topics, in wire order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StreamPermissions {
    /// Updating, deleting and purging the stream, managing its topics.
    pub(crate) manage_stream: bool,
    /// Reading the stream and its topics, polling.
    pub(crate) read_stream: bool,
    /// Managing the stream's topics, sending and polling.
    pub(crate) manage_topics: bool,
    /// Reading the stream's topics, polling.
    pub(crate) read_topics: bool,
    /// Polling every topic of the stream.
    pub(crate) poll_messages: bool,
    /// Sending to every topic of the stream.
    pub(crate) send_messages: bool,
    /// Per-topic rights by topic id (empty = none, as the server's `None`).
    pub(crate) topics: BTreeMap<u32, TopicPermissions>,
}

/// Rights over one topic, in wire order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TopicPermissions {
    /// Updating, deleting and purging the topic, its partitions and segments; sending; polling.
    pub(crate) manage_topic: bool,
    /// Reading the topic and its consumer groups, polling.
    pub(crate) read_topic: bool,
    /// Polling the topic.
    pub(crate) poll_messages: bool,
    /// Sending to the topic.
    pub(crate) send_messages: bool,
}

/// A user's permissions as the server stores them after `wire_permissions_to_permissions`:
/// stream and topic maps keyed by id (a repeated id keeps its last entry), empty maps standing
/// for the server's `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Permissions {
    /// Rights over the whole server.
    pub(crate) global: GlobalPermissions,
    /// Per-stream rights by stream id.
    pub(crate) streams: BTreeMap<u32, StreamPermissions>,
}

/// Reads `N` wire booleans (any non-zero byte is true, like `read_bool`).
fn flags<const N: usize>(r: &mut Reader<'_>) -> Result<[bool; N], DecodeError> {
    let mut out = [false; N];
    for flag in &mut out {
        *flag = r.u8()? != 0;
    }
    Ok(out)
}

fn put_flags(out: &mut Vec<u8>, flags: &[bool]) {
    out.extend(flags.iter().map(|f| u8::from(*f)));
}

/// Reads a `has_next`-chained list, as `WirePermissions` encodes streams and topics: a leading
/// flag says whether any entry follows, then each entry is followed by its own flag.
fn chained<T>(
    r: &mut Reader<'_>,
    mut entry: impl FnMut(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let mut items = Vec::new();
    if r.u8()? != 0 {
        loop {
            items.push(entry(r)?);
            if r.u8()? == 0 {
                break;
            }
        }
    }
    Ok(items)
}

/// Writes `items` chained the way [`chained`] reads them.
fn put_chained<T>(out: &mut Vec<u8>, items: &BTreeMap<u32, T>, entry: impl Fn(&mut Vec<u8>, &T)) {
    out.put_u8(u8::from(!items.is_empty()));
    for (i, (id, item)) in items.iter().enumerate() {
        out.put_u32(*id);
        entry(out, item);
        out.put_u8(u8::from(i + 1 < items.len()));
    }
}

impl Permissions {
    /// `Permissions::root()`: every global right, no stream entries.
    pub(crate) fn root() -> Self {
        Permissions {
            global: GlobalPermissions {
                manage_servers: true,
                read_servers: true,
                manage_users: true,
                read_users: true,
                manage_streams: true,
                read_streams: true,
                manage_topics: true,
                read_topics: true,
                poll_messages: true,
                send_messages: true,
            },
            streams: BTreeMap::new(),
        }
    }

    /// `WirePermissions::decode` followed by the server's conversion to its domain type.
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let [manage_servers, read_servers, manage_users, read_users, manage_streams, read_streams, manage_topics, read_topics, poll_messages, send_messages] =
            flags(r)?;
        let global = GlobalPermissions {
            manage_servers,
            read_servers,
            manage_users,
            read_users,
            manage_streams,
            read_streams,
            manage_topics,
            read_topics,
            poll_messages,
            send_messages,
        };
        let streams = chained(r, |r| {
            let id = r.u32()?;
            let [manage_stream, read_stream, manage_topics, read_topics, poll_messages, send_messages] =
                flags(r)?;
            let topics = chained(r, |r| {
                let id = r.u32()?;
                let [manage_topic, read_topic, poll_messages, send_messages] = flags(r)?;
                Ok((
                    id,
                    TopicPermissions {
                        manage_topic,
                        read_topic,
                        poll_messages,
                        send_messages,
                    },
                ))
            })?;
            Ok((
                id,
                StreamPermissions {
                    manage_stream,
                    read_stream,
                    manage_topics,
                    read_topics,
                    poll_messages,
                    send_messages,
                    topics: topics.into_iter().collect(),
                },
            ))
        })?;
        Ok(Permissions {
            global,
            streams: streams.into_iter().collect(),
        })
    }

    /// The optional permissions block of CREATE_USER and UPDATE_PERMISSIONS: a `has_permissions`
    /// byte (only 1 means present), then a u32 length that must equal what the permissions
    /// decode from (a mismatch is a validation failure, 4).
    pub(crate) fn decode_optional(r: &mut Reader<'_>) -> Result<Option<Self>, DecodeError> {
        if r.u8()? != 1 {
            return Ok(None);
        }
        let declared = r.u32()? as usize;
        let start = r.position();
        let permissions = Self::decode(r)?;
        if r.position() - start != declared {
            return Err(DecodeError::Validation);
        }
        Ok(Some(permissions))
    }

    /// `WirePermissions::encode`, streams and topics in ascending id order.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let g = &self.global;
        put_flags(
            out,
            &[
                g.manage_servers,
                g.read_servers,
                g.manage_users,
                g.read_users,
                g.manage_streams,
                g.read_streams,
                g.manage_topics,
                g.read_topics,
                g.poll_messages,
                g.send_messages,
            ],
        );
        put_chained(out, &self.streams, |out, s| {
            put_flags(
                out,
                &[
                    s.manage_stream,
                    s.read_stream,
                    s.manage_topics,
                    s.read_topics,
                    s.poll_messages,
                    s.send_messages,
                ],
            );
            put_chained(out, &s.topics, |out, t| {
                put_flags(
                    out,
                    &[
                        t.manage_topic,
                        t.read_topic,
                        t.poll_messages,
                        t.send_messages,
                    ],
                );
            });
        });
    }
}

/// A user account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User {
    /// Unique username (3..=50 bytes), compared exactly.
    pub(crate) username: String,
    /// The password as given. The real server stores a hash; only equality is ever asked.
    pub(crate) password: String,
    /// Whether new logins are accepted.
    pub(crate) status: UserStatus,
    /// Creation time, µs since the Unix epoch.
    pub(crate) created_at: u64,
    /// Stored permissions; `None` grants nothing.
    pub(crate) permissions: Option<Permissions>,
}

impl User {
    /// The user header of GET_USER(S) and CREATE_USER answers (`UserResponse`).
    pub(crate) fn encode_header(&self, id: u32, out: &mut Vec<u8>) {
        out.put_u32(id);
        out.put_u64(self.created_at);
        out.put_u8(self.status.code());
        out.put_name(&self.username);
    }

    /// `UserDetailsResponse`: the header, then `1, len, permissions` or four zero bytes.
    pub(crate) fn encode_details(&self, id: u32, out: &mut Vec<u8>) {
        self.encode_header(id, out);
        match &self.permissions {
            Some(permissions) => {
                out.put_u8(1);
                let len_at = out.len();
                out.put_u32(0);
                permissions.encode(out);
                let len = (out.len() - len_at - 4) as u32;
                out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
            }
            None => out.put_u32(0),
        }
    }
}

/// What a request wants to do, for [`Users::check`]. One variant per `perm_*` rule of the server
/// (several commands share a rule, e.g. consumer groups use [`Action::ReadTopic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// GET_STATS, GET_CLIENT(S): `manage_servers` or `read_servers`.
    ReadServers,
    /// GET_USER of another user, GET_USERS: `manage_users` or `read_users`.
    ReadUsers,
    /// CREATE/DELETE/UPDATE_USER, UPDATE_PERMISSIONS, CHANGE_PASSWORD of another user.
    ManageUsers,
    /// GET_STREAMS: global `manage_streams` or `read_streams`.
    ReadStreams,
    /// CREATE_STREAM: global `manage_streams`.
    CreateStream,
    /// GET_STREAM.
    ReadStream(u32),
    /// UPDATE/DELETE/PURGE_STREAM.
    ManageStream(u32),
    /// GET_TOPICS (stream-level rights only).
    ReadTopics(u32),
    /// CREATE_TOPIC.
    CreateTopic(u32),
    /// GET_TOPIC and every consumer-group command.
    ReadTopic(u32, u32),
    /// UPDATE/DELETE/PURGE_TOPIC, CREATE/DELETE_PARTITIONS, DELETE_SEGMENTS.
    ManageTopic(u32, u32),
    /// POLL_MESSAGES and the consumer-offset commands.
    Poll(u32, u32),
    /// SEND_MESSAGES and FLUSH_UNSAVED_BUFFER.
    Send(u32, u32),
}

/// The server's permission lookup tables: global rights by user, stream rights by (user, stream).
#[derive(Debug, Default)]
struct PermissionIndex {
    /// Global rights of every user that has permissions.
    global: HashMap<u32, GlobalPermissions>,
    /// Stream rights by (user id, stream id).
    streams: HashMap<(u32, u32), StreamPermissions>,
}

impl PermissionIndex {
    /// `update_permission_indexes`: replaces the user's entries with `permissions`.
    fn set_user(&mut self, user: u32, permissions: Option<&Permissions>) {
        self.clear_user(user);
        let Some(permissions) = permissions else {
            return;
        };
        self.global.insert(user, permissions.global.clone());
        for (sid, stream) in &permissions.streams {
            self.streams.insert((user, *sid), stream.clone());
        }
    }

    /// `clear_permission_indexes`.
    fn clear_user(&mut self, user: u32) {
        self.global.remove(&user);
        self.streams.retain(|(u, _), _| *u != user);
    }

    fn allows(&self, user: u32, action: Action) -> bool {
        let global = self.global.get(&user);
        let g = |f: fn(&GlobalPermissions) -> bool| global.is_some_and(f);
        let stream = |sid: u32| self.streams.get(&(user, sid));
        let topic = |sid: u32, tid: u32| stream(sid).and_then(|s| s.topics.get(&tid));
        match action {
            Action::ReadServers => g(|g| g.manage_servers || g.read_servers),
            Action::ReadUsers => g(|g| g.manage_users || g.read_users),
            Action::ManageUsers => g(|g| g.manage_users),
            Action::ReadStreams => g(|g| g.manage_streams || g.read_streams),
            Action::CreateStream => g(|g| g.manage_streams),
            Action::ReadStream(sid) => {
                g(|g| g.manage_streams || g.read_streams)
                    || stream(sid).is_some_and(|s| s.manage_stream || s.read_stream)
            }
            Action::ManageStream(sid) => {
                g(|g| g.manage_streams) || stream(sid).is_some_and(|s| s.manage_stream)
            }
            Action::ReadTopics(sid) => {
                g(reads_topics)
                    || stream(sid).is_some_and(|s| {
                        s.manage_stream || s.read_stream || s.manage_topics || s.read_topics
                    })
            }
            Action::CreateTopic(sid) => {
                g(|g| g.manage_streams || g.manage_topics)
                    || stream(sid).is_some_and(|s| s.manage_stream || s.manage_topics)
            }
            Action::ReadTopic(sid, tid) => {
                self.allows(user, Action::ReadTopics(sid))
                    || topic(sid, tid).is_some_and(|t| t.manage_topic || t.read_topic)
            }
            Action::ManageTopic(sid, tid) => {
                self.allows(user, Action::CreateTopic(sid))
                    || topic(sid, tid).is_some_and(|t| t.manage_topic)
            }
            Action::Poll(sid, tid) => {
                g(|g| g.poll_messages || reads_topics(g))
                    || stream(sid).is_some_and(|s| {
                        s.manage_stream
                            || s.read_stream
                            || s.manage_topics
                            || s.read_topics
                            || s.poll_messages
                    })
                    || topic(sid, tid)
                        .is_some_and(|t| t.manage_topic || t.read_topic || t.poll_messages)
            }
            Action::Send(sid, tid) => {
                g(|g| g.send_messages || g.manage_streams || g.manage_topics)
                    || stream(sid)
                        .is_some_and(|s| s.send_messages || s.manage_stream || s.manage_topics)
                    || topic(sid, tid).is_some_and(|t| t.manage_topic || t.send_messages)
            }
        }
    }
}

/// The global rights that let a user read every topic (and therefore poll it).
fn reads_topics(g: &GlobalPermissions) -> bool {
    g.read_streams || g.manage_streams || g.manage_topics || g.read_topics
}

/// Every user, by slab id (root is 0; freed ids are reused like streams'), and the permission
/// index the checks read.
#[derive(Debug, Default)]
pub(crate) struct Users {
    /// Users by id.
    slab: Slab<User>,
    /// Derived lookup tables; see the module documentation for when they differ from `slab`.
    index: PermissionIndex,
}

impl Users {
    /// Creates the root user at id 0 from the configured credentials unless a root user exists
    /// (a restored data directory keeps its root, like the server's state).
    pub(crate) fn ensure_root(&mut self, username: &str, password: &str, now: u64) {
        if self.slab.get(ROOT_USER_ID as usize).is_some() {
            return;
        }
        self.restore(
            ROOT_USER_ID,
            User {
                username: username.to_owned(),
                password: password.to_owned(),
                status: UserStatus::Active,
                created_at: now,
                permissions: Some(Permissions::root()),
            },
        );
        self.slab.rebuild_free_list();
    }

    /// Puts a persisted user back at its id; call [`Slab::rebuild_free_list`] through
    /// [`Users::finish_restore`] afterwards.
    pub(crate) fn restore(&mut self, id: u32, user: User) {
        self.index.set_user(id, user.permissions.as_ref());
        self.slab.insert_at(id as usize, user);
    }

    /// Re-links freed ids after [`Users::restore`] calls.
    pub(crate) fn finish_restore(&mut self) {
        self.slab.rebuild_free_list();
    }

    /// `rebuild_all_permission_indexes`, what a server restart does.
    pub(crate) fn rebuild_index(&mut self) {
        self.index = PermissionIndex::default();
        for (id, user) in self.slab.iter() {
            self.index.set_user(id as u32, user.permissions.as_ref());
        }
    }

    /// The user id an identifier names, like `get_user_id`: a numeric identifier is taken as
    /// is (the user may not exist), a name is looked up exactly.
    pub(crate) fn resolve(&self, id: Ident<'_>) -> Option<u32> {
        match id {
            Ident::Numeric(n) => Some(n),
            Ident::Name(name) => self.by_name(name).map(|(id, _)| id),
        }
    }

    /// The user an identifier names, or 20 `ResourceNotFound` (`IggyShard::get_user`).
    pub(crate) fn existing(&self, id: Ident<'_>) -> Result<(u32, &User), u32> {
        self.resolve(id)
            .and_then(|uid| self.get(uid).map(|u| (uid, u)))
            .ok_or(status::RESOURCE_NOT_FOUND)
    }

    pub(crate) fn get(&self, id: u32) -> Option<&User> {
        self.slab.get(id as usize)
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<(u32, &User)> {
        self.slab
            .iter()
            .find(|(_, u)| u.username == name)
            .map(|(id, u)| (id as u32, u))
    }

    /// Users in ascending id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &User)> {
        self.slab.iter().map(|(id, u)| (id as u32, u))
    }

    /// Adds a user at the next free id, or 46 `UserAlreadyExists`.
    pub(crate) fn create(&mut self, user: User) -> Result<u32, u32> {
        if self.by_name(&user.username).is_some() {
            return Err(status::USER_ALREADY_EXISTS);
        }
        let permissions = user.permissions.clone();
        let id = self.slab.insert(user) as u32;
        self.index.set_user(id, permissions.as_ref());
        Ok(id)
    }

    /// Renames and/or (de)activates an existing user; 46 when the new name belongs to another
    /// user. Like every change of a user's record, it rebuilds the user's index entries.
    pub(crate) fn update(
        &mut self,
        id: u32,
        username: Option<&str>,
        status: Option<UserStatus>,
    ) -> Result<(), u32> {
        if let Some(name) = username {
            if self.by_name(name).is_some_and(|(other, _)| other != id) {
                return Err(status::USER_ALREADY_EXISTS);
            }
        }
        self.modify(id, |user| {
            if let Some(name) = username {
                user.username = name.to_owned();
            }
            if let Some(status) = status {
                user.status = status;
            }
        })
    }

    /// Replaces an existing user's permissions (the caller refuses root first).
    pub(crate) fn set_permissions(
        &mut self,
        id: u32,
        permissions: Option<Permissions>,
    ) -> Result<(), u32> {
        self.modify(id, |user| user.permissions = permissions)
    }

    /// Replaces an existing user's password.
    pub(crate) fn set_password(&mut self, id: u32, password: &str) -> Result<(), u32> {
        self.modify(id, |user| user.password = password.to_owned())
    }

    /// `UpdateUserMeta`: changes the record and re-derives the user's index entries from it.
    fn modify(&mut self, id: u32, change: impl FnOnce(&mut User)) -> Result<(), u32> {
        let user = self
            .slab
            .get_mut(id as usize)
            .ok_or(status::RESOURCE_NOT_FOUND)?;
        change(user);
        let permissions = user.permissions.clone();
        self.index.set_user(id, permissions.as_ref());
        Ok(())
    }

    /// Deletes a user and its index entries; its id becomes the next one handed out.
    pub(crate) fn remove(&mut self, id: u32) -> Option<User> {
        self.index.clear_user(id);
        self.slab.remove(id as usize)
    }

    /// `clear_stream_permission_indexes`: forgets every user's rights on a deleted stream id in
    /// the index (the stored permissions keep them).
    pub(crate) fn stream_deleted(&mut self, sid: u32) {
        self.index.streams.retain(|(_, s), _| *s != sid);
    }

    /// 41 `Unauthorized` unless `user` may do `action` according to the index as it is now.
    pub(crate) fn check(&self, user: u32, action: Action) -> Result<(), u32> {
        if self.index.allows(user, action) {
            Ok(())
        } else {
            Err(status::UNAUTHORIZED)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    fn user(name: &str, permissions: Option<Permissions>) -> User {
        User {
            username: name.to_owned(),
            password: "secret".to_owned(),
            status: UserStatus::Active,
            created_at: 1,
            permissions,
        }
    }

    fn stream_rights(sid: u32, rights: StreamPermissions) -> Permissions {
        Permissions {
            global: GlobalPermissions::default(),
            streams: [(sid, rights)].into_iter().collect(),
        }
    }

    #[test]
    fn permissions_round_trip_in_the_sdk_encoding() {
        let mut topics = BTreeMap::new();
        topics.insert(
            2,
            TopicPermissions {
                poll_messages: true,
                ..TopicPermissions::default()
            },
        );
        topics.insert(
            5,
            TopicPermissions {
                send_messages: true,
                ..TopicPermissions::default()
            },
        );
        let mut p = stream_rights(
            7,
            StreamPermissions {
                read_stream: true,
                topics,
                ..StreamPermissions::default()
            },
        );
        p.global.read_users = true;
        p.streams.insert(9, StreamPermissions::default());
        let mut bytes = Vec::new();
        p.encode(&mut bytes);
        // 10 global flags, has_streams, stream 7 (id, 6 flags, has_topics, two topics of id + 4
        // flags + has_next), has_next, stream 9 (id, 6 flags, no topics), no next.
        check!(bytes.len() == 10 + 1 + (4 + 6 + 1 + 2 * 9) + 1 + (4 + 6 + 1) + 1);
        check!(bytes[3] == 1, "read_users is the fourth flag");
        let mut r = Reader::new(&bytes);
        check!(Permissions::decode(&mut r) == Ok(p));
        check!(r.position() == bytes.len());
    }

    #[test]
    fn permissions_block_length_must_match() {
        let mut body = Vec::new();
        Permissions::root().encode(&mut body);
        let block = |declared: u32| {
            let mut b = vec![1];
            b.extend_from_slice(&declared.to_le_bytes());
            b.extend_from_slice(&body);
            b
        };
        let ok = block(body.len() as u32);
        check!(
            Permissions::decode_optional(&mut Reader::new(&ok)) == Ok(Some(Permissions::root()))
        );
        let wrong = block(body.len() as u32 + 1);
        check!(
            Permissions::decode_optional(&mut Reader::new(&wrong)) == Err(DecodeError::Validation)
        );
        check!(Permissions::decode_optional(&mut Reader::new(&[2])) == Ok(None));
        check!(
            Permissions::decode_optional(&mut Reader::new(&ok[..8])) == Err(DecodeError::Malformed)
        );
    }

    #[test]
    fn manage_rights_imply_send_and_poll_but_poll_does_not_imply_send() {
        let mut users = Users::default();
        let global = |f: fn(&mut GlobalPermissions)| {
            let mut p = Permissions::default();
            f(&mut p.global);
            Some(p)
        };
        let topics = users
            .create(user("topics", global(|g| g.manage_topics = true)))
            .expect("create");
        let poller = users
            .create(user("poller", global(|g| g.poll_messages = true)))
            .expect("create");
        let none = users.create(user("nothing", None)).expect("create");
        check!(users.check(topics, Action::Send(3, 4)) == Ok(()));
        check!(users.check(topics, Action::Poll(3, 4)) == Ok(()));
        check!(users.check(poller, Action::Poll(3, 4)) == Ok(()));
        check!(users.check(poller, Action::Send(3, 4)) == Err(status::UNAUTHORIZED));
        check!(users.check(poller, Action::ReadTopic(3, 4)) == Err(status::UNAUTHORIZED));
        check!(users.check(none, Action::Poll(0, 0)) == Err(status::UNAUTHORIZED));
        check!(users.check(topics, Action::ManageUsers) == Err(status::UNAUTHORIZED));
    }

    #[test]
    fn topic_rights_cover_only_their_topic() {
        let mut users = Users::default();
        let mut stream = StreamPermissions::default();
        stream.topics.insert(
            1,
            TopicPermissions {
                manage_topic: true,
                ..TopicPermissions::default()
            },
        );
        let id = users
            .create(user("topic", Some(stream_rights(0, stream))))
            .expect("create");
        check!(users.check(id, Action::Send(0, 1)) == Ok(()));
        check!(users.check(id, Action::ManageTopic(0, 1)) == Ok(()));
        check!(users.check(id, Action::ReadTopic(0, 1)) == Ok(()));
        check!(users.check(id, Action::Send(0, 2)) == Err(status::UNAUTHORIZED));
        check!(
            users.check(id, Action::ReadTopics(0)) == Err(status::UNAUTHORIZED),
            "listing topics needs stream-level rights"
        );
        check!(users.check(id, Action::ReadStream(0)) == Err(status::UNAUTHORIZED));
    }

    #[test]
    fn a_deleted_stream_id_is_forgotten_until_the_user_changes() {
        let mut users = Users::default();
        let rights = StreamPermissions {
            send_messages: true,
            ..StreamPermissions::default()
        };
        let id = users
            .create(user("w", Some(stream_rights(4, rights))))
            .expect("create");
        check!(users.check(id, Action::Send(4, 0)) == Ok(()));
        users.stream_deleted(4);
        check!(users.check(id, Action::Send(4, 0)) == Err(status::UNAUTHORIZED));
        users.set_password(id, "other").expect("user exists");
        check!(users.check(id, Action::Send(4, 0)) == Ok(()), "re-derived");
        users.stream_deleted(4);
        users.rebuild_index();
        check!(
            users.check(id, Action::Send(4, 0)) == Ok(()),
            "restart rebuilds"
        );
    }

    #[test]
    fn user_ids_are_slab_ids_reused_after_delete() {
        let mut users = Users::default();
        users.ensure_root("iggy", "iggy", 0);
        let a = users.create(user("a-user", None)).expect("create");
        let b = users.create(user("b-user", None)).expect("create");
        check!((a, b) == (1, 2));
        check!(users.create(user("a-user", None)) == Err(status::USER_ALREADY_EXISTS));
        users.remove(a);
        check!(users.create(user("c-user", None)) == Ok(1));
        check!(users.update(b, Some("c-user"), None) == Err(status::USER_ALREADY_EXISTS));
        check!(users.update(b, Some("b-user"), None) == Ok(()), "own name");
        check!(users.check(ROOT_USER_ID, Action::ManageUsers) == Ok(()));
        check!(users.resolve(Ident::Numeric(42)) == Some(42));
        check!(
            users.existing(Ident::Numeric(42)).map(|(id, _)| id) == Err(status::RESOURCE_NOT_FOUND)
        );
    }
}
