//! The server's data: streams → topics → partitions (each partition a [`PartitionLog`] behind its
//! own mutex), consumer groups, users, and the registry of connected clients. Owned by the server
//! handle, so it survives `TestServer::restart`.

use crate::group::Group;
use crate::log::PartitionLog;
use crate::slab::Slab;
use crate::users::Users;
use crate::wire::Ident;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks a mutex, ignoring poisoning: every critical section leaves the data consistent before
/// anything that could panic, and one panicking connection must not take the server down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks, ignoring poisoning (see [`lock`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks, ignoring poisoning (see [`lock`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// All streams and users. Guarded by one `RwLock`, like the server's single metadata snapshot,
/// so a request resolves its stream and topic and checks its permission on the same state;
/// message traffic only takes the read lock to find its partition and then locks that partition
/// alone.
#[derive(Debug, Default)]
pub(crate) struct Meta {
    /// Streams by id.
    pub(crate) streams: Slab<Stream>,
    /// Users by id, with the permission index every request is checked against.
    pub(crate) users: Users,
}

/// A stream.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Unique name (1..255 bytes).
    pub(crate) name: String,
    /// Creation time, µs since the Unix epoch.
    pub(crate) created_at: u64,
    /// Topics by id.
    pub(crate) topics: Slab<Topic>,
}

/// A topic. Expiry and size are kept as their wire values (0 = server default, `u64::MAX` =
/// never / unlimited), exactly as the server stores what CREATE/UPDATE_TOPIC sent after defaults
/// were resolved.
#[derive(Debug)]
pub(crate) struct Topic {
    /// Unique name within the stream.
    pub(crate) name: String,
    /// Creation time, µs.
    pub(crate) created_at: u64,
    /// Message expiry in µs (wire value).
    pub(crate) message_expiry: u64,
    /// Compression algorithm code (1 none, 2 gzip); metadata only.
    pub(crate) compression: u8,
    /// Maximum topic size in bytes (wire value).
    pub(crate) max_topic_size: u64,
    /// Replication factor; metadata only.
    pub(crate) replication_factor: u8,
    /// Partitions; the id is the index.
    pub(crate) partitions: Vec<Arc<Partition>>,
    /// Consumer groups by id.
    pub(crate) groups: Slab<Group>,
    /// Round-robin counter of `Partitioning::balanced()`.
    pub(crate) round_robin: AtomicUsize,
    /// The options block a 0.9 client set on the topic (its explicit options, as sent and
    /// patched by updates); empty for a topic created over 0.8.
    pub(crate) options: Vec<u8>,
}

impl Topic {
    /// Finds a consumer group by numeric id or exact name.
    pub(crate) fn find_group(&self, id: Ident<'_>) -> Option<usize> {
        match id {
            Ident::Numeric(n) => self.groups.get(n as usize).map(|_| n as usize),
            Ident::Name(name) => self
                .groups
                .iter()
                .find(|(_, g)| g.name == name)
                .map(|(k, _)| k),
        }
    }
}

/// A partition.
#[derive(Debug)]
pub(crate) struct Partition {
    /// Creation time, µs.
    pub(crate) created_at: u64,
    /// Messages and offsets.
    pub(crate) log: Mutex<PartitionLog>,
}

impl Partition {
    pub(crate) fn new(created_at: u64) -> Arc<Self> {
        Arc::new(Self {
            created_at,
            log: Mutex::new(PartitionLog::new()),
        })
    }
}

/// A connected client as GET_ME / GET_CLIENTS report it.
#[derive(Debug, Clone)]
pub(crate) struct ClientInfo {
    /// Peer address.
    pub(crate) address: SocketAddr,
    /// Logged-in user, if any.
    pub(crate) user_id: Option<u32>,
    /// Joined groups as (stream id, topic id, group id).
    pub(crate) groups: Vec<(u32, u32, u32)>,
}

/// Shared state of one server instance.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Streams, topics, partitions, groups.
    pub(crate) meta: RwLock<Meta>,
    /// Connected clients by client id.
    pub(crate) clients: Mutex<HashMap<u32, ClientInfo>>,
    /// Last client id handed out.
    pub(crate) last_client_id: AtomicU32,
}

impl State {
    /// Registers a new connection and returns its client id.
    pub(crate) fn add_client(&self, address: SocketAddr) -> u32 {
        let id = self.last_client_id.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.clients).insert(
            id,
            ClientInfo {
                address,
                user_id: None,
                groups: Vec::new(),
            },
        );
        id
    }

    /// Forgets a closed connection and removes it from every group it had joined.
    pub(crate) fn remove_client(&self, client_id: u32) {
        let info = lock(&self.clients).remove(&client_id);
        let Some(info) = info else {
            return;
        };
        if info.groups.is_empty() {
            return;
        }
        let mut meta = write(&self.meta);
        for (stream_id, topic_id, group_id) in info.groups {
            if let Some(topic) = meta
                .streams
                .get_mut(stream_id as usize)
                .and_then(|s| s.topics.get_mut(topic_id as usize))
            {
                if let Some(group) = topic.groups.get_mut(group_id as usize) {
                    crate::group::leave(group, client_id);
                }
            }
        }
    }

    /// Client ids of every open connection.
    pub(crate) fn live_client_ids(&self) -> Vec<u32> {
        lock(&self.clients).keys().copied().collect()
    }

    /// Records which user a connection is logged in as; `CLIENT_NOT_FOUND` when its registry
    /// entry is gone (the user was deleted while the connection stayed open).
    pub(crate) fn set_client_user(&self, client_id: u32, user_id: Option<u32>) -> Result<(), u32> {
        let mut clients = lock(&self.clients);
        let info = clients
            .get_mut(&client_id)
            .ok_or(crate::wire::status::CLIENT_NOT_FOUND)?;
        info.user_id = user_id;
        Ok(())
    }

    /// Drops the memberships in deleted consumer groups (`gone` says which (stream, topic, group)
    /// no longer exist) from every client's record.
    pub(crate) fn forget_groups(&self, gone: impl Fn(usize, usize, usize) -> bool) {
        for info in lock(&self.clients).values_mut() {
            info.groups
                .retain(|&(s, t, g)| !gone(s as usize, t as usize, g as usize));
        }
    }

    /// What DELETE_USER does to the registry (`delete_clients_for_user`): every client logged in
    /// as `user_id` disappears from GET_CLIENT(S) and GET_ME, while the connections themselves
    /// stay open with that user id in their session.
    pub(crate) fn forget_clients_of_user(&self, user_id: u32) {
        lock(&self.clients).retain(|_, info| info.user_id != Some(user_id));
    }
}

impl Meta {
    /// Finds a stream by slot id or exact name.
    pub(crate) fn find_stream(&self, id: Ident<'_>) -> Option<usize> {
        match id {
            Ident::Numeric(n) => self.streams.get(n as usize).map(|_| n as usize),
            Ident::Name(name) => self
                .streams
                .iter()
                .find(|(_, s)| s.name == name)
                .map(|(k, _)| k),
        }
    }

    /// A stream by slot id or exact name, with its id.
    pub(crate) fn stream(&self, id: Ident<'_>) -> Option<(usize, &Stream)> {
        let sid = self.find_stream(id)?;
        Some((sid, self.streams.get(sid)?))
    }

    /// Finds a stream by exact name.
    pub(crate) fn stream_by_name(&self, name: &str) -> Option<(usize, &Stream)> {
        self.streams.iter().find(|(_, s)| s.name == name)
    }
}

impl Stream {
    /// Finds a topic by slot id or exact name.
    pub(crate) fn find_topic(&self, id: Ident<'_>) -> Option<usize> {
        match id {
            Ident::Numeric(n) => self.topics.get(n as usize).map(|_| n as usize),
            Ident::Name(name) => self
                .topics
                .iter()
                .find(|(_, t)| t.name == name)
                .map(|(k, _)| k),
        }
    }
}
