//! The server handle: listener lifecycle (start, shutdown, restart on the same port), the
//! retention hooks and the periodic retention cleaner.

use crate::config::{IggyVersion, TestServerConfig};
use crate::connection;
use crate::error::{Error, Result};
use crate::faults::{FaultState, Faults};
use crate::handlers::{now_micros, Shared};
use crate::persist::Store;
use crate::replica::Seat;
use crate::state::{lock, read, write, State};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// How long `restart` keeps retrying to bind the old port (it can linger briefly after close).
const REBIND_BUDGET: Duration = Duration::from_secs(10);

/// A running Iggy-compatible server. Dropping it without `shutdown` cancels its tasks.
#[derive(Debug)]
pub struct TestServer {
    /// State, config and storage shared with the connections.
    shared: Arc<Shared>,
    /// Fault switches of this instance.
    faults: Faults,
    /// Bound address; kept across restarts.
    addr: SocketAddr,
    /// Accept loop (owns the connection tasks); `None` once shut down.
    running: Option<Running>,
    /// Periodic retention cleaner, when configured.
    cleaner: Option<Running>,
}

/// A task and the token that stops it.
#[derive(Debug)]
pub(crate) struct Running {
    /// Cancels the task and everything under it.
    stop: CancellationToken,
    /// The task, awaited on stop.
    task: JoinHandle<()>,
}

impl Running {
    /// Cancels the task without waiting for it (a drop).
    pub(crate) fn cancel(&self) {
        self.stop.cancel();
    }

    /// Cancels the task and waits for it.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "server task ended abnormally");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        for r in [self.running.take(), self.cleaner.take()]
            .into_iter()
            .flatten()
        {
            r.stop.cancel();
        }
    }
}

/// Numbers of one partition, for tests that check what the server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Retained messages.
    pub messages_count: u64,
    /// Offset of the newest message (0 also when empty).
    pub current_offset: u64,
    /// Oldest retained offset (where `first()` polling starts).
    pub first_offset: u64,
    /// Retained bytes (64-byte header + payload + user headers per message).
    pub size_bytes: u64,
    /// Logical segments (at least 1).
    pub segments_count: u32,
}

impl PartitionInfo {
    /// The numbers of `log`.
    pub(crate) fn of(log: &mut crate::log::PartitionLog) -> Self {
        PartitionInfo {
            messages_count: log.messages_count(),
            current_offset: log.current_offset(),
            first_offset: log.first_offset(),
            size_bytes: log.size_bytes(),
            segments_count: log.segments().len() as u32,
        }
    }
}

/// Retention hooks of a server; cheap to clone.
#[derive(Debug, Clone)]
pub struct Retention {
    /// State, config and storage shared with the connections.
    shared: Arc<Shared>,
}

impl TestServer {
    /// Binds `config.bind` and starts serving. With `config.data_dir` set, loads what the
    /// directory holds first.
    #[tracing::instrument(skip_all, fields(bind = %config.bind), err)]
    pub async fn start(config: TestServerConfig) -> Result<TestServer> {
        let (listener, addr) = bind(config.bind).await?;
        let cleaner_interval = config.cleaner_interval;
        let shared = open_shared(config)?;
        let faults = Faults::default();
        let running = spawn_listener(listener, &shared, &faults.inner, None);
        let cleaner = cleaner_interval.map(|every| spawn_cleaner(&shared, every));
        tracing::info!(addr = %addr, "iggy-compatible server listening");
        Ok(TestServer {
            shared,
            faults,
            addr,
            running: Some(running),
            cleaner,
        })
    }

    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `iggy://USER:PASSWORD@HOST:PORT` for `IggyClient::from_connection_string`.
    pub fn connection_string(&self) -> String {
        format!(
            "iggy://{}:{}@{}",
            self.shared.config.root_username, self.shared.config.root_password, self.addr
        )
    }

    /// Fault switches of this server.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// Retention hooks of this server.
    pub fn retention(&self) -> Retention {
        Retention {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Numbers of a partition addressed by stream and topic name.
    pub fn partition_info(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
    ) -> Result<PartitionInfo> {
        with_partition(&self.shared, stream, topic, partition, PartitionInfo::of)
    }

    /// Stops the listener and every connection and waits for their tasks.
    #[tracing::instrument(skip_all, fields(addr = %self.addr))]
    pub async fn shutdown(mut self) {
        for r in [self.running.take(), self.cleaner.take()]
            .into_iter()
            .flatten()
        {
            r.stop().await;
        }
    }

    /// Stops serving (closing every connection), then serves again on the same port with the
    /// same data. Connected clients see their connection drop and reconnect. Like a server
    /// restart, it re-derives every user's permission index from the stored permissions.
    #[tracing::instrument(skip_all, fields(addr = %self.addr), err)]
    pub async fn restart(&mut self) -> Result<()> {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
        write(&self.shared.state.meta).users.rebuild_index();
        let listener = rebind(self.addr).await?;
        self.running = Some(spawn_listener(
            listener,
            &self.shared,
            &self.faults.inner,
            None,
        ));
        Ok(())
    }

    /// The protocol generation this server speaks (`TestServerConfig::iggy_version`).
    pub fn iggy_version(&self) -> IggyVersion {
        self.shared.config.iggy_version
    }
}

/// The state, config and storage a server (or every replica of a test cluster) serves: with
/// `config.data_dir` set, what the directory holds; the configured root user when it has none.
pub(crate) fn open_shared(config: TestServerConfig) -> Result<Arc<Shared>> {
    let (store, state) = match &config.data_dir {
        Some(dir) => {
            let (store, state) = Store::open(dir, config.segment_size)?;
            (Some(store), state)
        }
        None => (None, State::default()),
    };
    write(&state.meta).users.ensure_root(
        &config.root_username,
        &config.root_password,
        now_micros(),
    );
    Ok(Arc::new(Shared {
        state: Arc::new(state),
        config,
        started_at: now_micros(),
        store,
    }))
}

/// Binds `addr` (port 0: a free port) and returns the listener with the address it got.
pub(crate) async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    Ok((listener, bound))
}

/// Binds `addr` again after a restart, retrying while the old socket lingers.
pub(crate) async fn rebind(addr: SocketAddr) -> Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + REBIND_BUDGET;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(source) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::Bind { addr, source });
            }
            Err(e) => {
                tracing::warn!(error = %e, "rebinding after restart, retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves `listener` in the server's generation; `seat` makes it one replica of a test cluster
/// (0.9 only).
pub(crate) fn spawn_listener(
    listener: TcpListener,
    shared: &Arc<Shared>,
    faults: &Arc<FaultState>,
    seat: Option<Seat>,
) -> Running {
    let stop = CancellationToken::new();
    faults.start_connection_tokens(&stop);
    let task = tokio::spawn(accept_loop(
        listener,
        Arc::clone(shared),
        Arc::clone(faults),
        seat,
        stop.clone(),
    ));
    Running { stop, task }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    faults: Arc<FaultState>,
    seat: Option<Seat>,
    stop: CancellationToken,
) {
    let version = shared.config.iggy_version;
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        {
            match accepted {
                Ok((stream, peer)) => {
                    if faults.refusing() {
                        drop(stream);
                        continue;
                    }
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "setting TCP_NODELAY failed");
                    }
                    let cancel = faults.connection_token();
                    let (shared, faults) = (Arc::clone(&shared), Arc::clone(&faults));
                    match version {
                        IggyVersion::V0_8 => connections
                            .spawn(connection::serve(stream, peer, shared, faults, cancel)),
                        IggyVersion::V0_9 => connections.spawn(crate::ng::serve(
                            stream,
                            peer,
                            shared,
                            faults,
                            seat.clone(),
                            cancel,
                        )),
                    };
                }
                Err(e) => {
                    // Out of file descriptors and similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Runs `f` on partition `partition` of `stream/topic` (by name) in `shared`.
pub(crate) fn with_partition<T>(
    shared: &Shared,
    stream: &str,
    topic: &str,
    partition: u32,
    f: impl FnOnce(&mut crate::log::PartitionLog) -> T,
) -> Result<T> {
    let not_found = || Error::PartitionNotFound {
        stream: stream.to_owned(),
        topic: topic.to_owned(),
        partition,
    };
    let meta = read(&shared.state.meta);
    let (_, s) = meta.stream_by_name(stream).ok_or_else(not_found)?;
    let (_, t) = s
        .topics
        .iter()
        .find(|(_, t)| t.name == topic)
        .ok_or_else(not_found)?;
    let p = t.partitions.get(partition as usize).ok_or_else(not_found)?;
    let mut log = lock(&p.log);
    Ok(f(&mut log))
}

impl Retention {
    /// Drops every message of the partition with an offset below `first_kept` (what the real
    /// retention cleaner does to old segments): polls below it then start at `first_kept`,
    /// `messages_count` and `size` drop, `current_offset` and stored consumer offsets stay.
    /// Returns the number of messages dropped.
    pub fn drop_before(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        first_kept: u64,
    ) -> Result<u64> {
        let shared = &self.shared;
        let meta = read(&shared.state.meta);
        let ids = meta.stream_by_name(stream).and_then(|(sid, s)| {
            s.topics
                .iter()
                .find(|(_, t)| t.name == topic)
                .map(|(tid, _)| (sid, tid))
        });
        drop(meta);
        with_partition(shared, stream, topic, partition, |log| {
            let dropped = log.drop_before(first_kept);
            if dropped > 0 {
                if let (Some(store), Some((sid, tid))) = (&shared.store, ids) {
                    store.partition_rewritten(sid, tid, partition as usize, log);
                }
            }
            dropped
        })
    }

    /// Runs one pass of the expiry/size cleaner now, whatever `cleaner_interval` says; returns
    /// the number of messages dropped.
    pub fn run_cleaner(&self) -> u64 {
        clean(&self.shared, now_micros())
    }
}

fn spawn_cleaner(shared: &Arc<Shared>, every: Duration) -> Running {
    let stop = CancellationToken::new();
    let shared = Arc::clone(shared);
    let token = stop.clone();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = token.cancelled() => break,
                _ = tick.tick() => {
                    let dropped = clean(&shared, now_micros());
                    if dropped > 0 {
                        tracing::debug!(dropped, "retention cleaner dropped messages");
                    }
                }
            }
        }
    });
    Running { stop, task }
}

/// One cleaner pass, like the real `message_cleaner`: per topic, delete sealed segments older
/// than `message_expiry`, then, while the topic is at ≥ 90 % of `max_topic_size`, delete the
/// oldest sealed segment. The active segment and segments above the lowest stored consumer
/// offset are kept.
fn clean(shared: &Shared, now: u64) -> u64 {
    let meta = read(&shared.state.meta);
    let mut dropped = 0;
    for (sid, s) in meta.streams.iter() {
        for (tid, t) in s.topics.iter() {
            let expiry =
                (t.message_expiry != 0 && t.message_expiry != u64::MAX).then_some(t.message_expiry);
            let max_size =
                (t.max_topic_size != 0 && t.max_topic_size != u64::MAX).then_some(t.max_topic_size);
            let mut changed = vec![false; t.partitions.len()];
            if let Some(expiry) = expiry {
                for (pid, p) in t.partitions.iter().enumerate() {
                    let n = lock(&p.log).expire_segments(now, expiry);
                    changed[pid] |= n > 0;
                    dropped += n;
                }
            }
            if let Some(max) = max_size {
                let threshold = max / 10 * 9;
                let mut size: u64 = t.partitions.iter().map(|p| lock(&p.log).size_bytes()).sum();
                while size >= threshold {
                    // Oldest sealed segment across the topic's partitions.
                    let candidate = t
                        .partitions
                        .iter()
                        .enumerate()
                        .filter_map(|(pid, p)| {
                            let log = lock(&p.log);
                            log.oldest_sealed_deletable()
                                .map(|segment| (segment.max_timestamp, pid))
                        })
                        .min();
                    let Some((_, pid)) = candidate else {
                        break;
                    };
                    let mut log = lock(&t.partitions[pid].log);
                    let before = log.messages_count();
                    let freed = log.drop_oldest_sealed();
                    if freed == 0 {
                        break;
                    }
                    dropped += before - log.messages_count();
                    changed[pid] = true;
                    size -= freed;
                }
            }
            if let Some(store) = &shared.store {
                for (pid, c) in changed.into_iter().enumerate() {
                    if c {
                        store.partition_rewritten(sid, tid, pid, &lock(&t.partitions[pid].log));
                    }
                }
            }
        }
    }
    dropped
}
