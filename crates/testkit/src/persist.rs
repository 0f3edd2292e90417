//! Optional persistence to a data directory, so the standalone server keeps its data across a
//! process restart.
//!
//! Layout under the data directory:
//! * `metadata.json`: streams, topics (settings, partition creation times), consumer groups and
//!   users (with their permissions; passwords as given, where the real server keeps hashes).
//!   Rewritten atomically after every metadata change: written to `metadata.json.tmp`, fsynced,
//!   renamed over the old file, then the directory is fsynced. A directory with a root user
//!   keeps it at the next start whatever the configured credentials, like the server's state.
//! * `partitions/<stream>-<topic>-<partition>/messages.log`: the partition's stored messages,
//!   exactly the stamped bytes POLL serves, appended as batches arrive. Appends are not fsynced
//!   (like the real server's default `enforce_fsync = false`): a killed process loses nothing
//!   the OS accepted, a power loss can lose the tail. Retention and purge rewrite the file
//!   atomically (temp file, fsync, rename, directory fsync).
//! * `partitions/<...>/state.json`: stored consumer and group offsets and the partition's offset
//!   counter, rewritten atomically whenever they change.
//!
//! I/O failures after start are logged (`error`) and do not fail the request: the in-memory
//! state stays authoritative for the running process.

use crate::error::{Error, Result};
use crate::group::Group;
use crate::log::PartitionLog;
use crate::slab::Slab;
use crate::state::{lock, read, Meta, Partition, State, Stream, Topic};
use crate::users::{Permissions, User, UserStatus};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

/// Durable mirror of a server's state in one directory.
#[derive(Debug)]
pub(crate) struct Store {
    /// The data directory.
    dir: PathBuf,
    /// Open append handles of `messages.log` files.
    logs: Mutex<HashMap<(usize, usize, usize), File>>,
    /// Serialises metadata rewrites so an older snapshot never overwrites a newer one.
    meta_lock: Mutex<()>,
}

/// Contents of `metadata.json`.
#[derive(Serialize, Deserialize)]
struct MetaFile {
    /// Every stream.
    streams: Vec<StreamFile>,
    /// Every user; absent in directories written before users existed (root is then created
    /// from the configuration).
    #[serde(default)]
    users: Vec<UserFile>,
}

/// A persisted user.
#[derive(Serialize, Deserialize)]
struct UserFile {
    /// Slab id.
    id: u32,
    /// Username.
    username: String,
    /// Password as given at creation or by CHANGE_PASSWORD.
    password: String,
    /// Login allowed or not.
    status: UserStatus,
    /// Creation time, µs.
    created_at: u64,
    /// Stored permissions.
    permissions: Option<Permissions>,
}

/// A persisted stream.
#[derive(Serialize, Deserialize)]
struct StreamFile {
    /// Slot id.
    id: usize,
    /// Name.
    name: String,
    /// Creation time, µs.
    created_at: u64,
    /// Topics of the stream.
    topics: Vec<TopicFile>,
}

/// A persisted topic.
#[derive(Serialize, Deserialize)]
struct TopicFile {
    /// Slot id.
    id: usize,
    /// Name.
    name: String,
    /// Creation time, µs.
    created_at: u64,
    /// Wire value, as in `Topic`.
    message_expiry: u64,
    /// Wire code, as in `Topic`.
    compression: u8,
    /// Wire value, as in `Topic`.
    max_topic_size: u64,
    /// As in `Topic`.
    replication_factor: u8,
    /// Creation time of each partition; the index is the id.
    partitions_created_at: Vec<u64>,
    /// Consumer groups (membership is per connection, not persisted).
    groups: Vec<GroupFile>,
    /// As in `Topic` (absent in files written before the 0.9 codec).
    #[serde(default)]
    options: Vec<u8>,
}

/// A persisted consumer group.
#[derive(Serialize, Deserialize)]
struct GroupFile {
    /// Slot id.
    id: usize,
    /// Name.
    name: String,
}

/// Contents of a partition's `state.json`.
#[derive(Serialize, Deserialize, Default)]
struct PartitionStateFile {
    /// Whether the partition ever held a message since creation/purge.
    has_messages: bool,
    /// Offset counter (`current_offset`), needed when no message is retained.
    last_offset: u64,
    /// Stored offsets of plain consumers (key, offset).
    consumer_offsets: Vec<(u64, u64)>,
    /// Stored offsets of groups (group id, offset).
    group_offsets: Vec<(u32, u64)>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Persist {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, directory fsync.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Some(parent) = path.parent() {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io_err(parent))?;
    }
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the data directory and loads what it holds into a new state.
    pub(crate) fn open(dir: &Path, segment_size: u64) -> Result<(Store, State)> {
        fs::create_dir_all(dir.join("partitions")).map_err(io_err(dir))?;
        let store = Store {
            dir: dir.to_owned(),
            logs: Mutex::new(HashMap::new()),
            meta_lock: Mutex::new(()),
        };
        let state = State::default();
        let meta_path = dir.join("metadata.json");
        if meta_path.exists() {
            let bytes = fs::read(&meta_path).map_err(io_err(&meta_path))?;
            let file: MetaFile = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                path: meta_path.clone(),
                reason: e.to_string(),
            })?;
            let meta = store.load_meta(file, segment_size)?;
            *crate::state::write(&state.meta) = meta;
        }
        Ok((store, state))
    }

    fn partition_dir(&self, sid: usize, tid: usize, pid: usize) -> PathBuf {
        self.dir
            .join("partitions")
            .join(format!("{sid}-{tid}-{pid}"))
    }

    fn load_meta(&self, file: MetaFile, segment_size: u64) -> Result<Meta> {
        let mut meta = Meta::default();
        for s in file.streams {
            let mut topics = Slab::default();
            for t in s.topics {
                let mut partitions = Vec::new();
                for (pid, created_at) in t.partitions_created_at.iter().enumerate() {
                    let p = Partition::new(*created_at);
                    self.load_partition(s.id, t.id, pid, &mut lock(&p.log), segment_size)?;
                    partitions.push(p);
                }
                let mut groups = Slab::default();
                for g in t.groups {
                    groups.insert_at(
                        g.id,
                        Group {
                            name: g.name,
                            partitions: (0..partitions.len() as u32).collect(),
                            members: Slab::default(),
                            assignment_changes: 0,
                        },
                    );
                }
                groups.rebuild_free_list();
                topics.insert_at(
                    t.id,
                    Topic {
                        name: t.name,
                        created_at: t.created_at,
                        message_expiry: t.message_expiry,
                        compression: t.compression,
                        max_topic_size: t.max_topic_size,
                        replication_factor: t.replication_factor,
                        partitions,
                        groups,
                        round_robin: AtomicUsize::new(0),
                        options: t.options,
                    },
                );
            }
            topics.rebuild_free_list();
            meta.streams.insert_at(
                s.id,
                Stream {
                    name: s.name,
                    created_at: s.created_at,
                    topics,
                },
            );
        }
        meta.streams.rebuild_free_list();
        for u in file.users {
            meta.users.restore(
                u.id,
                User {
                    username: u.username,
                    password: u.password,
                    status: u.status,
                    created_at: u.created_at,
                    permissions: u.permissions,
                },
            );
        }
        meta.users.finish_restore();
        Ok(meta)
    }

    fn load_partition(
        &self,
        sid: usize,
        tid: usize,
        pid: usize,
        log: &mut PartitionLog,
        segment_size: u64,
    ) -> Result<()> {
        let dir = self.partition_dir(sid, tid, pid);
        let state_path = dir.join("state.json");
        let state: PartitionStateFile = if state_path.exists() {
            let bytes = fs::read(&state_path).map_err(io_err(&state_path))?;
            serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
                path: state_path.clone(),
                reason: e.to_string(),
            })?
        } else {
            PartitionStateFile::default()
        };
        let log_path = dir.join("messages.log");
        if log_path.exists() {
            let bytes = fs::read(&log_path).map_err(io_err(&log_path))?;
            if let Err(at) = log.load_stamped(&bytes, segment_size) {
                // A torn tail (crash mid-append) is cut off, like a server recovering its log.
                tracing::warn!(path = %log_path.display(), at, "truncating torn message log");
                let f = OpenOptions::new()
                    .write(true)
                    .open(&log_path)
                    .map_err(io_err(&log_path))?;
                f.set_len(at).map_err(io_err(&log_path))?;
            }
        }
        if !log.has_messages() || log.messages_count() == 0 {
            log.restore_counters(
                state.last_offset.max(log.current_offset()),
                state.has_messages || log.has_messages(),
            );
        }
        log.consumer_offsets = state.consumer_offsets.into_iter().collect();
        log.group_offsets = state.group_offsets.into_iter().collect();
        Ok(())
    }

    /// Rewrites `metadata.json` from the current state.
    pub(crate) fn metadata_changed(&self, state: &State) {
        let _guard = lock(&self.meta_lock);
        let file = {
            let meta = read(&state.meta);
            MetaFile {
                streams: meta
                    .streams
                    .iter()
                    .map(|(id, s)| StreamFile {
                        id,
                        name: s.name.clone(),
                        created_at: s.created_at,
                        topics: s
                            .topics
                            .iter()
                            .map(|(tid, t)| TopicFile {
                                id: tid,
                                name: t.name.clone(),
                                created_at: t.created_at,
                                message_expiry: t.message_expiry,
                                compression: t.compression,
                                max_topic_size: t.max_topic_size,
                                replication_factor: t.replication_factor,
                                partitions_created_at: t
                                    .partitions
                                    .iter()
                                    .map(|p| p.created_at)
                                    .collect(),
                                groups: t
                                    .groups
                                    .iter()
                                    .map(|(gid, g)| GroupFile {
                                        id: gid,
                                        name: g.name.clone(),
                                    })
                                    .collect(),
                                options: t.options.clone(),
                            })
                            .collect(),
                    })
                    .collect(),
                users: meta
                    .users
                    .iter()
                    .map(|(id, u)| UserFile {
                        id,
                        username: u.username.clone(),
                        password: u.password.clone(),
                        status: u.status,
                        created_at: u.created_at,
                        permissions: u.permissions.clone(),
                    })
                    .collect(),
            }
        };
        let result = serde_json::to_vec_pretty(&file)
            .map_err(|e| Error::Corrupt {
                path: self.dir.join("metadata.json"),
                reason: e.to_string(),
            })
            .and_then(|bytes| write_atomic(&self.dir.join("metadata.json"), &bytes));
        if let Err(e) = result {
            tracing::error!(error = %e, "persisting metadata failed");
        }
    }

    fn remove_dirs(&self, keep: impl Fn(usize, usize, usize) -> bool) {
        let root = self.dir.join("partitions");
        let mut logs = lock(&self.logs);
        logs.retain(|(s, t, p), _| keep(*s, *t, *p));
        let Ok(entries) = fs::read_dir(&root) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let ids: Vec<usize> = name
                .to_string_lossy()
                .split('-')
                .filter_map(|x| x.parse().ok())
                .collect();
            if let [s, t, p] = ids[..] {
                if !keep(s, t, p) {
                    if let Err(e) = fs::remove_dir_all(entry.path()) {
                        tracing::error!(error = %e, "removing partition data failed");
                    }
                }
            }
        }
    }

    /// Deletes the data of every partition of a deleted stream.
    pub(crate) fn stream_deleted(&self, sid: usize) {
        self.remove_dirs(|s, _, _| s != sid);
    }

    /// Deletes the data of every partition of a deleted topic.
    pub(crate) fn topic_deleted(&self, sid: usize, tid: usize) {
        self.remove_dirs(|s, t, _| !(s == sid && t == tid));
    }

    /// Deletes the data of partitions `keep..` of a topic.
    pub(crate) fn partitions_truncated(&self, sid: usize, tid: usize, keep: usize) {
        self.remove_dirs(|s, t, p| !(s == sid && t == tid && p >= keep));
    }

    /// Appends a stamped batch to the partition's message log.
    pub(crate) fn appended(
        &self,
        sid: usize,
        tid: usize,
        pid: usize,
        _first_offset: u64,
        messages: &[u8],
    ) {
        let mut logs = lock(&self.logs);
        let file = match logs.entry((sid, tid, pid)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let dir = self.partition_dir(sid, tid, pid);
                let opened = fs::create_dir_all(&dir).and_then(|()| {
                    OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(dir.join("messages.log"))
                });
                match opened {
                    Ok(f) => v.insert(f),
                    Err(e) => {
                        tracing::error!(error = %e, "opening message log failed");
                        return;
                    }
                }
            }
        };
        if let Err(e) = file.write_all(messages) {
            tracing::error!(error = %e, "appending to message log failed");
        }
    }

    /// Rewrites the partition's message log and state after retention or a purge.
    pub(crate) fn partition_rewritten(
        &self,
        sid: usize,
        tid: usize,
        pid: usize,
        log: &PartitionLog,
    ) {
        let dir = self.partition_dir(sid, tid, pid);
        let mut logs = lock(&self.logs);
        logs.remove(&(sid, tid, pid));
        let bytes: Vec<u8> = log.encoded_messages().flatten().copied().collect();
        let result = fs::create_dir_all(&dir)
            .map_err(io_err(&dir))
            .and_then(|()| write_atomic(&dir.join("messages.log"), &bytes));
        if let Err(e) = result {
            tracing::error!(error = %e, "rewriting message log failed");
        }
        drop(logs);
        self.offsets_changed(sid, tid, pid, log);
    }

    /// Rewrites the partition's offsets file.
    pub(crate) fn offsets_changed(&self, sid: usize, tid: usize, pid: usize, log: &PartitionLog) {
        let dir = self.partition_dir(sid, tid, pid);
        let file = PartitionStateFile {
            has_messages: log.has_messages(),
            last_offset: log.current_offset(),
            consumer_offsets: log.consumer_offsets.iter().map(|(k, v)| (*k, *v)).collect(),
            group_offsets: log.group_offsets.iter().map(|(k, v)| (*k, *v)).collect(),
        };
        let result = serde_json::to_vec(&file)
            .map_err(|e| Error::Corrupt {
                path: dir.join("state.json"),
                reason: e.to_string(),
            })
            .and_then(|bytes| {
                fs::create_dir_all(&dir).map_err(io_err(&dir))?;
                write_atomic(&dir.join("state.json"), &bytes)
            });
        if let Err(e) = result {
            tracing::error!(error = %e, "persisting partition offsets failed");
        }
    }
}
