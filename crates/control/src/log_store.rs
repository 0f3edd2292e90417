//! The Raft log store on sled: vote, entries, committed and purged log ids.
//!
//! Durable before acknowledged: `save_vote`, `truncate` and `purge` flush before returning and
//! `append` calls `LogFlushed` only after `flush_async` returned.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, OptionalSend, RaftLogId, StorageError, StorageIOError, Vote,
};
use replicator_model::NodeId;

use crate::command::{decode, encode};
use crate::data_dir::{self, KEY_COMMITTED, KEY_PURGED, KEY_VOTE, TREE_LOGS, TREE_META};
use crate::error::{Error, Result};
use crate::TypeConfig;

type StorageResult<T> = std::result::Result<T, StorageError<NodeId>>;

fn any(e: impl ToString) -> AnyError {
    AnyError::error(e.to_string())
}

/// Handle to the log trees; cheap to clone (the replication tasks read through clones).
#[derive(Clone)]
pub(crate) struct LogStore {
    /// The database (for flushing).
    db: sled::Db,
    /// Entries by big-endian index.
    logs: sled::Tree,
    /// Vote, committed, purged.
    meta: sled::Tree,
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl LogStore {
    /// Opens the trees and checks that every stored value decodes, naming `dir` otherwise.
    pub(crate) fn open(db: &sled::Db, dir: &Path) -> Result<Self> {
        let store = Self {
            db: db.clone(),
            logs: data_dir::tree(db, dir, TREE_LOGS)?,
            meta: data_dir::tree(db, dir, TREE_META)?,
        };
        let corrupt = |what: &str, e: &dyn std::fmt::Display| Error::DataDir {
            path: PathBuf::from(dir),
            reason: format!("corrupt {what}: {e}"),
        };
        store
            .read_meta::<Vote<NodeId>>(KEY_VOTE)
            .map_err(|e| corrupt("vote", &e))?;
        store
            .read_meta::<Option<LogId<NodeId>>>(KEY_COMMITTED)
            .map_err(|e| corrupt("committed id", &e))?;
        store
            .read_meta::<LogId<NodeId>>(KEY_PURGED)
            .map_err(|e| corrupt("purged id", &e))?;
        for item in [store.logs.first(), store.logs.last()] {
            if let Some((_, v)) = item.map_err(|e| corrupt("log", &e))? {
                decode::<Entry<TypeConfig>>("log entry", &v)
                    .map_err(|e| corrupt("log entry", &e))?;
            }
        }
        Ok(store)
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, k: &[u8]) -> Result<Option<T>> {
        match self.meta.get(k).map_err(|e| Error::Codec {
            what: "meta",
            reason: e.to_string(),
        })? {
            Some(v) => Ok(Some(decode("meta", &v)?)),
            None => Ok(None),
        }
    }

    fn write_meta<T: serde::Serialize>(
        &self,
        k: &[u8],
        v: &T,
    ) -> std::result::Result<(), AnyError> {
        let bytes = encode("meta", v).map_err(any)?;
        self.meta.insert(k, bytes).map_err(any)?;
        Ok(())
    }

    async fn flush(&self) -> std::result::Result<(), AnyError> {
        self.db.flush_async().await.map_err(any)?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(i) => Bound::Included(key(*i)),
            Bound::Excluded(i) => Bound::Excluded(key(*i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(key(*i)),
            Bound::Excluded(i) => Bound::Excluded(key(*i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for item in self.logs.range::<[u8; 8], _>((start, end)) {
            let (_, v) = item.map_err(|e| StorageIOError::read_logs(any(e)))?;
            out.push(
                decode::<Entry<TypeConfig>>("log entry", &v)
                    .map_err(|e| StorageIOError::read_logs(any(e)))?,
            );
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self
            .read_meta(KEY_PURGED)
            .map_err(|e| StorageIOError::read_logs(any(e)))?;
        let last = match self
            .logs
            .last()
            .map_err(|e| StorageIOError::read_logs(any(e)))?
        {
            Some((_, v)) => Some(
                *decode::<Entry<TypeConfig>>("log entry", &v)
                    .map_err(|e| StorageIOError::read_logs(any(e)))?
                    .get_log_id(),
            ),
            None => None,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        self.write_meta(KEY_VOTE, vote)
            .map_err(StorageIOError::write_vote)?;
        self.flush().await.map_err(StorageIOError::write_vote)?;
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self
            .read_meta(KEY_VOTE)
            .map_err(|e| StorageIOError::read_vote(any(e)))?)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // Not flushed: losing the latest value only means re-applying less on restart.
        self.write_meta(KEY_COMMITTED, &committed)
            .map_err(StorageIOError::write)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let v: Option<Option<LogId<NodeId>>> = self
            .read_meta(KEY_COMMITTED)
            .map_err(|e| StorageIOError::read(any(e)))?;
        Ok(v.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes =
                encode("log entry", &entry).map_err(|e| StorageIOError::write_logs(any(e)))?;
            batch.insert(&key(entry.get_log_id().index), bytes);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(any(e)))?;
        // Durable before acknowledged: the callback fires only after the flush.
        let flushed = self.db.flush_async().await;
        callback.log_io_completed(flushed.map(|_| ()).map_err(std::io::Error::other));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut batch = sled::Batch::default();
        for item in self.logs.range(key(log_id.index)..) {
            let (k, _) = item.map_err(|e| StorageIOError::write_logs(any(e)))?;
            batch.remove(k);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(any(e)))?;
        self.flush().await.map_err(StorageIOError::write_logs)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // Record the purge point first so that a crash in between never leaves a hole.
        self.write_meta(KEY_PURGED, &log_id)
            .map_err(StorageIOError::write_logs)?;
        self.flush().await.map_err(StorageIOError::write_logs)?;
        let mut batch = sled::Batch::default();
        for item in self.logs.range(..=key(log_id.index)) {
            let (k, _) = item.map_err(|e| StorageIOError::write_logs(any(e)))?;
            batch.remove(k);
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(any(e)))?;
        self.flush().await.map_err(StorageIOError::write_logs)?;
        Ok(())
    }
}
