//! Opening and validating a node's data dir: a `FORMAT` marker written atomically at creation
//! and one sled database whose tree names live here, in one place.
//!
//! A dir that cannot be read, has foreign content, a wrong marker, or a marker without its
//! database is refused with an error naming the path: a node never silently starts empty over
//! data it could not read.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Name of the marker file at the root of the data dir.
const FORMAT_FILE: &str = "FORMAT";
/// Exact content of the marker for this data layout.
const FORMAT_CONTENT: &str = "iggy-replicator control v1\n";
/// The sled database directory inside the data dir.
const SLED_DIR: &str = "sled";

/// Log entries: big-endian `u64` index → bincode `Entry`.
pub(crate) const TREE_LOGS: &str = "logs";
/// Log store metadata: see the `KEY_*` constants.
pub(crate) const TREE_META: &str = "meta";
/// The current snapshot (meta and data) under [`KEY_SNAPSHOT`].
pub(crate) const TREE_SNAPSHOT: &str = "snapshot";
/// In [`TREE_META`]: the last saved vote.
pub(crate) const KEY_VOTE: &[u8] = b"vote";
/// In [`TREE_META`]: the last saved committed log id.
pub(crate) const KEY_COMMITTED: &[u8] = b"committed";
/// In [`TREE_META`]: the last purged log id.
pub(crate) const KEY_PURGED: &[u8] = b"purged";
/// In [`TREE_META`]: present from a graceful stop that marked this node `Leaving` until a
/// later process of it registered anew (see `Control::begin_leaving`).
const KEY_LEFT_AT_STOP: &[u8] = b"left_at_stop";
/// In [`TREE_SNAPSHOT`]: the current snapshot.
pub(crate) const KEY_SNAPSHOT: &[u8] = b"current";

fn dir_err(path: &Path, reason: impl ToString) -> Error {
    Error::DataDir {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Opens (creating it if absent or empty) the data dir at `dir` and returns its database.
pub(crate) fn open(dir: &Path) -> Result<sled::Db> {
    fs::create_dir_all(dir).map_err(|e| dir_err(dir, format!("cannot create: {e}")))?;
    let entries: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| dir_err(dir, format!("cannot read: {e}")))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| dir_err(dir, format!("cannot read: {e}")))?;
    let format_path = dir.join(FORMAT_FILE);
    let sled_path = dir.join(SLED_DIR);
    if format_path.exists() {
        let content = fs::read_to_string(&format_path)
            .map_err(|e| dir_err(&format_path, format!("cannot read: {e}")))?;
        if content != FORMAT_CONTENT {
            return Err(dir_err(
                &format_path,
                "unknown or corrupt data dir format marker",
            ));
        }
        if !sled_path.is_dir() {
            return Err(dir_err(
                &sled_path,
                "database missing from an initialised data dir",
            ));
        }
    } else if entries.iter().all(|e| is_filesystem_furniture(e)) {
        write_atomically(dir, FORMAT_FILE, FORMAT_CONTENT.as_bytes())?;
    } else {
        return Err(dir_err(
            dir,
            "not empty and not a replicator data dir (no FORMAT marker)",
        ));
    }
    sled::Config::new()
        .path(&sled_path)
        // Every acknowledged write is flushed explicitly; this is only a backstop.
        .flush_every_ms(Some(1000))
        .open()
        .map_err(|e| dir_err(&sled_path, format!("cannot open database: {e}")))
}

/// What a freshly formatted volume holds before anybody wrote to it: ext4's `lost+found` (a
/// data dir at the root of a Kubernetes volume or a mounted disk starts with it), which does
/// not make the dir "not empty".
fn is_filesystem_furniture(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "lost+found") && path.is_dir()
}

/// Writes `name` in `dir` via a temporary file, fsync, rename and a directory fsync.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let target = dir.join(name);
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &target)?;
        fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| dir_err(&target, format!("cannot write: {e}")))
}

/// Makes every write to `db` so far durable, on a tokio blocking thread.
///
/// Not sled's `flush_async`: that runs the flush as a job of sled's process-wide IO pool, and
/// the flush waits for the pool's write jobs. Once as many flushes run as the pool keeps idle
/// threads (seven), a write queued behind them never gets a thread (the pool grows only when
/// its queue is deeper than that), and every flush, and a dropped `Db`'s final flush, waits
/// forever. Seen as a hung control test with several in-process nodes; a busy single node
/// can get there too. Here the flushes wait on tokio's threads and sled's pool only writes.
pub(crate) async fn flush(db: &sled::Db) -> std::io::Result<usize> {
    let db = db.clone();
    match tokio::task::spawn_blocking(move || db.flush()).await {
        Ok(flushed) => flushed.map_err(std::io::Error::other),
        Err(e) => Err(std::io::Error::other(format!(
            "database flush task failed: {e}"
        ))),
    }
}

/// [`KEY_LEFT_AT_STOP`] of one data dir: whether the last graceful stop of this node marked
/// it `Leaving` and no later process has registered it anew since.
#[derive(Clone)]
pub(crate) struct StopMark {
    db: sled::Db,
    meta: sled::Tree,
    dir: PathBuf,
}

impl StopMark {
    pub(crate) fn open(db: &sled::Db, dir: &Path) -> Result<Self> {
        Ok(Self {
            db: db.clone(),
            meta: tree(db, dir, TREE_META)?,
            dir: dir.to_path_buf(),
        })
    }

    /// Whether the mark is set.
    pub(crate) fn is_set(&self) -> Result<bool> {
        self.meta
            .contains_key(KEY_LEFT_AT_STOP)
            .map_err(|e| dir_err(&self.dir, format!("cannot read the stop mark: {e}")))
    }

    /// Sets (before a stop's `LeaveMember` is written) or clears (once a later process's
    /// registration committed) the mark, durably.
    pub(crate) async fn set(&self, left: bool) -> Result<()> {
        let changed = if left {
            self.meta.insert(KEY_LEFT_AT_STOP, &[1u8][..]).map(|_| ())
        } else {
            self.meta.remove(KEY_LEFT_AT_STOP).map(|_| ())
        };
        changed.map_err(|e| dir_err(&self.dir, format!("cannot write the stop mark: {e}")))?;
        flush(&self.db)
            .await
            .map_err(|e| dir_err(&self.dir, format!("cannot flush the stop mark: {e}")))?;
        Ok(())
    }
}

/// Opens a tree, naming the data dir on failure.
pub(crate) fn tree(db: &sled::Db, dir: &Path, name: &str) -> Result<sled::Tree> {
    db.open_tree(name)
        .map_err(|e| dir_err(dir, format!("cannot open tree {name}: {e}")))
}

/// [`open`] of a data dir whose previous database handle this process just dropped (tests
/// only: a new process never waits): sled's flusher thread lets go of the file lock a moment
/// after the last handle is gone, so a lock still held is waited for, at most 30 s.
#[cfg(test)]
pub(crate) fn reopen(dir: &Path) -> Result<sled::Db> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match open(dir) {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More concurrent flushes than sled's IO pool keeps idle threads, each after a write: with
    /// `flush_async` the pool's flushes wait for writes queued behind them (the test binary
    /// aborts after two minutes; it hung in every try).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_concurrent_flushes_all_complete() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let db = open(tmp.path()).expect("fresh dir opens");
        let flushers = (0..32u32).map(|task| {
            let db = db.clone();
            tokio::spawn(async move {
                for round in 0..40u32 {
                    let key = format!("{task}-{round}");
                    db.insert(key.as_bytes(), &[7u8; 512][..]).expect("insert");
                    flush(&db).await.expect("flush");
                }
            })
        });
        let all = futures::future::join_all(flushers);
        let Ok(done) = tokio::time::timeout(std::time::Duration::from_secs(120), all).await else {
            // Not a panic: unwinding drops the `Db`, whose final flush would hang as well.
            eprintln!("sled's flushes hang: its IO pool is starved");
            std::process::abort();
        };
        for task in done {
            task.expect("flusher task");
        }
        assert_eq!(db.len(), 32 * 40);
    }

    #[test]
    fn a_fresh_volume_with_lost_and_found_is_initialised() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::create_dir(tmp.path().join("lost+found")).expect("mkdir");
        assert!(open(tmp.path()).is_ok());
        // Anything else still refuses the dir.
        let other = tempfile::tempdir().expect("tempdir");
        fs::write(other.path().join("notes.txt"), b"x").expect("write");
        assert!(open(other.path()).is_err());
    }

    #[test]
    fn fresh_dir_is_initialised_and_reopens() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("node");
        drop(open(&dir).expect("fresh dir opens"));
        assert!(dir.join(FORMAT_FILE).is_file());
        drop(reopen(&dir).expect("initialised dir reopens"));
    }

    #[test]
    fn foreign_content_is_refused_with_the_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(tmp.path().join("something"), b"x").expect("write");
        let err = open(tmp.path()).expect_err("foreign dir must be refused");
        assert!(err.to_string().contains(&tmp.path().display().to_string()));
        assert!(!err.is_transient());
    }

    #[test]
    fn corrupt_marker_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        drop(open(tmp.path()).expect("fresh dir opens"));
        fs::write(tmp.path().join(FORMAT_FILE), b"garbage").expect("write");
        let err = open(tmp.path()).expect_err("corrupt marker must be refused");
        assert!(err.to_string().contains(FORMAT_FILE));
    }

    #[test]
    fn missing_database_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        drop(open(tmp.path()).expect("fresh dir opens"));
        fs::remove_dir_all(tmp.path().join(SLED_DIR)).expect("remove");
        let err = open(tmp.path()).expect_err("missing db must be refused");
        assert!(err.to_string().contains(SLED_DIR));
    }
}
