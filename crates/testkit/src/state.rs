//! The server's data: streams → topics → partitions (each partition a [`PartitionLog`] behind its
//! own mutex), consumer groups, users, and the registry of connected clients. Owned by the server
//! handle, so it survives `TestServer::restart`.

use crate::log::PartitionLog;
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

/// Id allocation of the `slab` crate that server 0.8.0 uses for streams, topics, groups and
/// members: the next id is the most recently freed slot (a LIFO free list), or the end.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    /// Slots; vacant ones link the free list.
    entries: Vec<Entry<T>>,
    /// Head of the free list (== `entries.len()` when full).
    next: usize,
    /// Occupied slots.
    len: usize,
}

#[derive(Debug)]
enum Entry<T> {
    Vacant(usize),
    Occupied(T),
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            next: 0,
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// The key the next `insert` will use.
    #[cfg(test)]
    pub(crate) fn vacant_key(&self) -> usize {
        self.next
    }

    /// Stores `value` at the head of the free list (or the end) and returns that key.
    pub(crate) fn insert(&mut self, value: T) -> usize {
        let key = self.next;
        self.len += 1;
        if key == self.entries.len() {
            self.entries.push(Entry::Occupied(value));
            self.next = key + 1;
        } else {
            match std::mem::replace(&mut self.entries[key], Entry::Occupied(value)) {
                Entry::Vacant(next) => self.next = next,
                Entry::Occupied(_) => unreachable!("slab free list points at an occupied slot"),
            }
        }
        key
    }

    /// Stores `value` at an explicit key (restoring persisted state); the free list is rebuilt
    /// in ascending key order afterwards by [`Self::rebuild_free_list`].
    pub(crate) fn insert_at(&mut self, key: usize, value: T) {
        while self.entries.len() <= key {
            self.entries.push(Entry::Vacant(usize::MAX));
        }
        if matches!(self.entries[key], Entry::Vacant(_)) {
            self.len += 1;
        }
        self.entries[key] = Entry::Occupied(value);
    }

    /// Re-links vacant slots after [`Self::insert_at`] calls, lowest key first.
    pub(crate) fn rebuild_free_list(&mut self) {
        let mut next = self.entries.len();
        for (key, entry) in self.entries.iter_mut().enumerate().rev() {
            if let Entry::Vacant(n) = entry {
                *n = next;
                next = key;
            }
        }
        self.next = next;
    }

    /// Removes and returns the value at `key`, freeing the slot for reuse first.
    pub(crate) fn remove(&mut self, key: usize) -> Option<T> {
        let entry = self.entries.get_mut(key)?;
        if matches!(entry, Entry::Vacant(_)) {
            return None;
        }
        let old = std::mem::replace(entry, Entry::Vacant(self.next));
        self.next = key;
        self.len -= 1;
        match old {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        match self.entries.get(key)? {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self.entries.get_mut(key)? {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Occupied entries in ascending key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(k, e)| match e {
                Entry::Occupied(v) => Some((k, v)),
                Entry::Vacant(_) => None,
            })
    }
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

/// A consumer group.
#[derive(Debug)]
pub(crate) struct Group {
    /// Unique name within the topic.
    pub(crate) name: String,
    /// The topic's partition ids the group spreads over its members.
    pub(crate) partitions: Vec<u32>,
    /// Members by slab id.
    pub(crate) members: Slab<Member>,
    /// Bumped by every rebalance and every completed handoff, as the 0.9 server's is; its
    /// SYNC_CONSUMER_GROUP answers it with the member's partitions (0.8 has no such number).
    pub(crate) generation: u64,
}

/// A member of a consumer group: one client connection.
#[derive(Debug)]
pub(crate) struct Member {
    /// Member id reported by GET_CONSUMER_GROUP (max existing + 1 at join).
    pub(crate) id: usize,
    /// The connection that joined.
    pub(crate) client_id: u32,
    /// Assigned partitions.
    pub(crate) partitions: Vec<u32>,
    /// Partitions this member is giving up once the group committed what it polled from them.
    pub(crate) pending_revocations: Vec<Revocation>,
    /// Round-robin cursor over `partitions` for polls without an explicit partition.
    pub(crate) next_index: AtomicUsize,
}

/// A partition moving from one member to another (cooperative rebalance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revocation {
    /// Partition being moved.
    pub(crate) partition: u32,
    /// Slab id of the member receiving it.
    pub(crate) target_slab: usize,
    /// Member id of the receiver, to detect a reused slab slot.
    pub(crate) target_member_id: usize,
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

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    #[test]
    fn slab_reuses_the_most_recently_freed_slot() {
        let mut slab = Slab::default();
        for i in 0..5 {
            check!(slab.insert(i) == i);
        }
        slab.remove(1);
        slab.remove(3);
        check!(slab.vacant_key() == 3);
        check!(slab.insert(30) == 3);
        check!(slab.insert(10) == 1);
        check!(slab.insert(5) == 5);
        check!(slab.len() == 6);
        check!(slab.iter().map(|(k, _)| k).collect::<Vec<_>>() == vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn slab_remove_of_vacant_is_none() {
        let mut slab = Slab::default();
        slab.insert(1);
        check!(slab.remove(0) == Some(1));
        check!(slab.remove(0).is_none());
        check!(slab.remove(7).is_none());
        check!(slab.len() == 0);
    }

    #[test]
    fn slab_rebuilt_free_list_starts_at_lowest_gap() {
        let mut slab = Slab::default();
        slab.insert_at(2, 'c');
        slab.insert_at(0, 'a');
        slab.rebuild_free_list();
        check!(slab.len() == 2);
        check!(slab.insert('b') == 1);
        check!(slab.insert('d') == 3);
    }
}
