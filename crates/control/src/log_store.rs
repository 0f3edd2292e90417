//! The Raft log store on sled: vote, entries, committed and purged log ids.
//!
//! Durable before acknowledged: `save_vote`, `truncate` and `purge` flush before returning and
//! `append` calls `LogFlushed` only after `flush_async` returned.
//!
//! Two rules keep a loaded cluster live (issue "never stall"): a node that restarts never
//! resumes the leadership it held before (`forget_own_leadership`), and one AppendEntries never
//! carries more than [`APPEND_BYTES_BUDGET`] of entries (`limited_get_log_entries`), because
//! openraft gives every AppendEntries one heartbeat interval to complete and retries a request
//! that timed out unchanged.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftLogId, StorageError, StorageIOError,
    Vote,
};
use replicator_model::NodeId;

use crate::command::{decode, encode};
use crate::data_dir::{self, KEY_COMMITTED, KEY_PURGED, KEY_VOTE, TREE_LOGS, TREE_META};
use crate::error::{Error, Result};
use crate::format;
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
    /// The latest committed index openraft saved, plus one (0: none yet), for metrics.
    committed: Arc<AtomicU64>,
}

/// Most encoded entry bytes one AppendEntries carries (a single larger entry still goes alone).
/// A commit entry of 1,000 units is about 40 KiB; the budget keeps a catching-up follower's
/// requests far below what loopback or a LAN moves and a follower fsyncs in a heartbeat.
pub(crate) const APPEND_BYTES_BUDGET: usize = 256 * 1024;

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// A log entry as stored: behind a header naming the format its command needs (see `format`).
pub(crate) fn encode_entry(entry: &Entry<TypeConfig>) -> Result<Vec<u8>> {
    let format = match &entry.payload {
        EntryPayload::Normal(cmd) => cmd.level(),
        EntryPayload::Blank | EntryPayload::Membership(_) => format::BASELINE_LEVEL,
    };
    Ok(format::seal(format, &encode("log entry", entry)?))
}

/// A stored log entry of any format this build reads.
pub(crate) fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>> {
    let (_, payload) = format::open("log entry", bytes)?;
    decode("log entry", payload)
}

impl LogStore {
    /// Opens the trees and checks that every stored value decodes, naming `dir` otherwise.
    pub(crate) fn open(db: &sled::Db, dir: &Path) -> Result<Self> {
        let store = Self {
            db: db.clone(),
            logs: data_dir::tree(db, dir, TREE_LOGS)?,
            meta: data_dir::tree(db, dir, TREE_META)?,
            committed: Arc::new(AtomicU64::new(0)),
        };
        let corrupt = |what: &str, e: &dyn std::fmt::Display| Error::DataDir {
            path: PathBuf::from(dir),
            reason: format!("corrupt {what}: {e}"),
        };
        store
            .read_meta::<Vote<NodeId>>(KEY_VOTE)
            .map_err(|e| corrupt("vote", &e))?;
        let committed = store
            .read_meta::<Option<LogId<NodeId>>>(KEY_COMMITTED)
            .map_err(|e| corrupt("committed id", &e))?
            .flatten();
        store.note_committed(committed);
        store
            .read_meta::<LogId<NodeId>>(KEY_PURGED)
            .map_err(|e| corrupt("purged id", &e))?;
        for item in [store.logs.first(), store.logs.last()] {
            if let Some((_, v)) = item.map_err(|e| corrupt("log", &e))? {
                decode_entry(&v).map_err(|e| corrupt("log entry", &e))?;
            }
        }
        Ok(store)
    }

    /// Demotes a vote this node granted itself and saw committed (it was the leader) to an
    /// uncommitted one of the same term, before openraft reads it.
    ///
    /// Why: openraft 0.9 restores a node whose saved vote is its own committed one as the
    /// leader of that term at once, without an election. After a crash the others have usually
    /// moved to a later term, but until it hears so the restarted node runs as leader: its
    /// assignment loop plans from stale state and every local write waits for a commit that
    /// cannot come. The demoted vote keeps the term and whom it voted for, which is all Raft's
    /// safety needs (it still refuses any other candidate of that term); the node then starts
    /// as a follower and leads again only by winning a new election, in a later term.
    pub(crate) async fn forget_own_leadership(&self, node: NodeId) -> Result<bool> {
        let Some(mut vote) = self.read_meta::<Vote<NodeId>>(KEY_VOTE)? else {
            return Ok(false);
        };
        if !vote.committed || vote.leader_id().voted_for() != Some(node) {
            return Ok(false);
        }
        vote.committed = false;
        let failed = |e: AnyError| Error::Codec {
            what: "vote",
            reason: e.to_string(),
        };
        self.write_meta(KEY_VOTE, &vote).map_err(failed)?;
        self.flush().await.map_err(failed)?;
        Ok(true)
    }

    /// The index of the last entry in the log (or of the last purged one; 0 for none): what
    /// an earlier process of this node may have applied.
    pub(crate) fn last_index(&self) -> Result<u64> {
        if let Some((_, v)) = self.logs.last().map_err(|e| Error::Codec {
            what: "log",
            reason: e.to_string(),
        })? {
            return Ok(decode_entry(&v)?.get_log_id().index);
        }
        Ok(self
            .read_meta::<LogId<NodeId>>(KEY_PURGED)?
            .map_or(0, |l| l.index))
    }

    /// The commit index as openraft last saved it (`None` before any), shared for metrics.
    pub(crate) fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn note_committed(&self, committed: Option<LogId<NodeId>>) {
        self.committed
            .store(committed.map_or(0, |c| c.index + 1), Ordering::Relaxed);
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
        data_dir::flush(&self.db).await.map_err(any)?;
        Ok(())
    }

    /// Removes the entries whose keys are in `keys` in one batch, then flushes (truncate and
    /// purge).
    async fn remove_logs(&self, keys: impl RangeBounds<[u8; 8]>) -> StorageResult<()> {
        let mut batch = sled::Batch::default();
        for item in self.logs.range(keys) {
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
            out.push(decode_entry(&v).map_err(|e| StorageIOError::read_logs(any(e)))?);
        }
        Ok(out)
    }

    /// Entries from `start` on, stopping before `end` or once [`APPEND_BYTES_BUDGET`] encoded
    /// bytes are collected (never fewer than one entry). openraft builds every AppendEntries
    /// from this call.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let mut out = Vec::new();
        if start >= end {
            return Ok(out);
        }
        let mut bytes = 0usize;
        for item in self.logs.range(key(start)..key(end)) {
            let (_, v) = item.map_err(|e| StorageIOError::read_logs(any(e)))?;
            if !out.is_empty() && bytes + v.len() > APPEND_BYTES_BUDGET {
                break;
            }
            bytes += v.len();
            out.push(decode_entry(&v).map_err(|e| StorageIOError::read_logs(any(e)))?);
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
                *decode_entry(&v)
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
        self.note_committed(committed);
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
        // One insert per entry, in index order, not one `apply_batch`: sled writes a batch as
        // the batch, a manifest and whatever was buffered before it, each with its own write and
        // sync (three per lease renewal instead of one, and each write wakes every thread of
        // sled's IO pool; BENCHMARKS.md section 23). Atomicity is not needed here: sled recovers
        // a prefix of its writes, so a crash before the flush leaves a prefix of these entries,
        // which is a valid log, and none of them was acknowledged.
        for entry in entries {
            let bytes = encode_entry(&entry).map_err(|e| StorageIOError::write_logs(any(e)))?;
            self.logs
                .insert(key(entry.get_log_id().index), bytes)
                .map_err(|e| StorageIOError::write_logs(any(e)))?;
        }
        // Durable before acknowledged: the callback fires only after the flush.
        let flushed = data_dir::flush(&self.db).await;
        callback.log_io_completed(flushed.map(|_| ()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.remove_logs(key(log_id.index)..).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        // Record the purge point first so that a crash in between never leaves a hole.
        self.write_meta(KEY_PURGED, &log_id)
            .map_err(StorageIOError::write_logs)?;
        self.flush().await.map_err(StorageIOError::write_logs)?;
        self.remove_logs(..=key(log_id.index)).await
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::command::ControlCommand;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    fn open() -> std::result::Result<(tempfile::TempDir, LogStore), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let db = data_dir::open(dir.path())?;
        let store = LogStore::open(&db, dir.path())?;
        Ok((dir, store))
    }

    /// An entry whose encoding is a little over `payload` bytes.
    fn entry(index: u64, payload: usize) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(ControlCommand::ReportUnits {
                flow: "f".repeat(payload),
                units: Vec::new(),
            }),
        }
    }

    fn insert(store: &LogStore, entries: &[Entry<TypeConfig>]) -> TestResult {
        for e in entries {
            store.logs.insert(key(e.log_id.index), encode_entry(e)?)?;
        }
        Ok(())
    }

    #[tokio::test]
    async fn appends_stop_at_the_byte_budget_but_never_send_nothing() -> TestResult {
        let (_dir, mut store) = open()?;
        let quarter = APPEND_BYTES_BUDGET / 4;
        insert(
            &store,
            &(1..=10).map(|i| entry(i, quarter)).collect::<Vec<_>>(),
        )?;
        // Each entry is a bit over a quarter of the budget: three fit, the fourth would not.
        let got = store.limited_get_log_entries(1, 11).await?;
        check!(got.len() == 3);
        check!(got[0].log_id.index == 1);
        // The range's end still bounds it.
        check!(store.limited_get_log_entries(4, 6).await?.len() == 2);
        check!(store.limited_get_log_entries(6, 6).await?.is_empty());
        // A single entry larger than the budget goes alone rather than not at all.
        insert(&store, &[entry(11, APPEND_BYTES_BUDGET * 2)])?;
        let got = store.limited_get_log_entries(11, 12).await?;
        check!(got.len() == 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_restarted_leader_forgets_only_its_own_committed_vote() -> TestResult {
        let (_dir, mut store) = open()?;
        check!(!store.forget_own_leadership(1).await?);
        let mut led = Vote::new(7, 1);
        led.commit();
        store.save_vote(&led).await?;
        // Another node's vote is left alone.
        check!(!store.forget_own_leadership(2).await?);
        check!(store.read_vote().await? == Some(led));
        check!(store.forget_own_leadership(1).await?);
        let after = store.read_vote().await?.ok_or("vote gone")?;
        check!(after == Vote::new(7, 1));
        check!(!after.is_committed());
        // A vote this node granted itself but never saw committed stays as it is.
        check!(!store.forget_own_leadership(1).await?);
        Ok(())
    }
}
