//! The Iggy clusters as this node reaches them: the connections (here), the per-stream
//! activity watchers a source cluster keeps for its idle readers ([`activity`]; they live in
//! the [`Cluster`] so that closing it ends them), and which protocol generation a server
//! answers in ([`probe`]).
//!
//! Connections: a few SDK clients per cluster alias, connected lazily, rebuilt after a
//! connection failure, every call bounded by a timeout; more of them while the cluster is far
//! ([`distance`]).
//!
//! The SDK's own reconnect is turned off on purpose: after a transport failure it reconnects and
//! resends the same request once, so a `send_messages` whose response was lost would be appended
//! twice without the writer knowing. Here a failed connection is dropped, the caller sees the
//! error, and a writer re-reads the downstream tail before it sends again.

pub(crate) mod activity;
pub(crate) mod distance;
pub(crate) mod probe;
mod shared_read;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use replicator_model::IggyVersion;
use tokio::sync::Mutex;
use tracing::Instrument;

use replicator_sdk::types::{Identifier, StreamDetails, TopicDetails};

use self::activity::{ActivityRegistry, Request};
use self::distance::{Distance, Next};
use self::shared_read::SharedReads;
use crate::error::{Error, Result};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::{Client, ClientConfig, InFlight};

/// An established connection as handed to callers.
#[derive(Clone)]
pub(crate) struct Conn {
    /// The SDK client, of the cluster's generation.
    pub(crate) client: Arc<Client>,
    /// Which build of the slot this is; invalidating an older build is a no-op.
    build: u64,
    /// Slot index.
    slot: usize,
}

/// One connection slot.
#[derive(Default)]
struct Slot {
    /// The current connection (if built) and the number of builds so far.
    current: Mutex<(Option<Conn>, u64)>,
    /// Who may use the connection now; shared with the connection's heartbeat task.
    gate: Arc<Gate>,
}

/// A slot's turns: its calls and its heartbeat's pings, one at a time.
#[derive(Default)]
struct Gate {
    /// Held for the whole of every call on this slot's connection, and of every ping. The SDK
    /// serialises requests per connection anyway; taking the turn here first lets
    /// `call_checked` run its check after any wait for the connection, immediately before the
    /// request is written.
    turn: Mutex<()>,
    /// The build of the connection whose call was dropped before its answer came (0: none):
    /// its answer may still arrive and would be read as the next call's, so the next caller
    /// drops the connection first. A call is dropped so when the task making it is aborted (a
    /// unit's actors killed with their flow actor, a drain that ran out of time); a ping that
    /// failed or got no answer in time marks its connection so too.
    abandoned: std::sync::atomic::AtomicU64,
    /// Set while the heartbeat waits for its turn or pings: reads meant for the slot may take
    /// another one that is free ([`Cluster::route`]).
    pinging: std::sync::atomic::AtomicBool,
    /// The build of the slot's current connection (0: none): a heartbeat whose connection was
    /// dropped meanwhile stops instead of pinging it (its PING would wait behind whatever the
    /// SDK still has in flight there, holding the slot's turn for a whole timeout).
    current: std::sync::atomic::AtomicU64,
    /// Wakes the heartbeat for a PING ahead of its time: a probe of the distance
    /// ([`distance::Next::Probe`]).
    probe: tokio::sync::Notify,
}

/// Which connection a call may take ([`Cluster::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Its slot's, whoever else waits for it. Every write, and every call of a writer: a writer
    /// whose send timed out must re-read its tail through a new connection and its login (the
    /// target judges the login when it arrives, after a fence if the writer was frozen), never
    /// through another connection of its identity that is still open.
    Own,
    /// Its slot's, unless the heartbeat is pinging it; then a free one. For reads that must
    /// not wait a round trip behind a PING (a reader's poll).
    AroundPings,
    /// Its slot's if nobody uses it, else a free one. For reads in flight beside the caller's
    /// own (a reader's polls sent ahead or staggered).
    AnyFree,
}

impl Slot {
    /// Whether the slot holds a connection and nobody is using it (a snapshot: it may be taken
    /// the next moment, and the caller then waits its turn as on any slot).
    fn free(&self) -> bool {
        !self.gate.pinging.load(std::sync::atomic::Ordering::Relaxed)
            && self.gate.turn.try_lock().is_ok()
            && self
                .current
                .try_lock()
                .is_ok_and(|current| current.0.is_some())
    }
}

/// Marks the connection's call abandoned if the call is dropped before it finished.
struct CallGuard<'a> {
    gate: &'a Gate,
    build: u64,
    finished: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.gate
                .abandoned
                .store(self.build, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// The connections of this instance to one Iggy cluster (`clusters.<alias>`), for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionState {
    /// The cluster alias.
    pub cluster: String,
    /// Connections open now.
    pub open: usize,
    /// Connections configured (`clusters.<alias>.connections`); they open on first use.
    pub configured: usize,
}

/// The connections of this instance to one cluster.
pub(crate) struct Cluster {
    /// Alias, for errors and logs.
    alias: String,
    /// Client configuration of each seed address of the connection string, parsed once, for the
    /// cluster's generation (see [`replicator_model::seed_urls`]).
    seeds: Vec<ClientConfig>,
    /// The seed that connected last: new connections try it first, then the others in turn.
    preferred_seed: std::sync::atomic::AtomicUsize,
    /// The `host:port` of each seed (to tell advertised nodes that are not seeds).
    seed_addresses: Vec<String>,
    /// The nodes a replicated (0.9) cluster advertised at the last connect, as `ip:port`: tried
    /// after the configured seeds, so that the one configured address going down is not the
    /// end of the cluster for us.
    roster: std::sync::Mutex<Vec<String>>,
    /// Connection slots; callers pick one by a stable hash (e.g. the partition id) modulo the
    /// slots in use: the first `near_slots` while the cluster is near, the first `far_slots`
    /// while it is far.
    slots: Vec<Slot>,
    /// `connections`: slots in use while the cluster is near.
    near_slots: usize,
    /// `far_connections`: slots in use while it is far.
    far_slots: usize,
    /// How far the cluster is, from the round trips of its calls.
    distance: Arc<Distance>,
    /// Set once the far slots' connections were opened ahead ([`Cluster::open_far_slots`]).
    far_slots_opened: std::sync::atomic::AtomicBool,
    /// Set once every slot's connection was opened ahead ([`Cluster::open_slots_ahead`]).
    slots_opened_ahead: std::sync::atomic::AtomicBool,
    /// Slots holding an open connection now (for the connection-state metric).
    open: std::sync::atomic::AtomicUsize,
    /// Bound of every call.
    timeout: Duration,
    /// Per-stream activity watchers of the readers reading from this cluster (kept here because
    /// every unit of the instance shares the cluster, and so that `close` ends them).
    activity: ActivityRegistry,
    /// Set by `close_for_good`: no connection is opened any more (a writer identity that was
    /// fenced or replaced must never log in again).
    closed_for_good: std::sync::atomic::AtomicBool,
    /// Told when a login is refused with invalid credentials or an inactive user (writer
    /// identities only).
    login_refused: Option<LoginRefusals>,
    /// Topic metadata reads of units starting at the same time, one per topic (see
    /// [`Cluster::topic_now`]).
    topic_reads: SharedReads<(String, String), Option<Arc<TopicDetails>>>,
}

/// How long connecting and logging in through one seed address may take when the cluster
/// has others to try (with one, the operation timeout bounds it).
const SEED_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a connection attempt asks the cluster for its nodes once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Roster {
    Ask,
    /// Not again: the previous attempt through this address asked and got no answer in time.
    Skip,
}

/// How long asking a new connection for the cluster's nodes may take.
const ROSTER_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a cluster logged in as a writer identity reports that the target refused the login,
/// and which identity it was: a connect still in progress when the node switched identities
/// (a node back from a freeze reconnects as its fenced identity while it moves to the next)
/// is refused late, and that refusal says nothing about the identity current by then.
#[derive(Debug, Clone)]
pub(crate) struct LoginRefusals {
    incarnation: u64,
    to: tokio::sync::mpsc::Sender<u64>,
}

impl LoginRefusals {
    /// Refusals of identity `incarnation`'s logins, reported to `to`.
    pub(crate) fn new(incarnation: u64, to: tokio::sync::mpsc::Sender<u64>) -> Self {
        Self { incarnation, to }
    }

    fn report(&self) {
        // A full channel already holds refusals its reader has not seen: the next refused
        // connect reports again, so dropping this one loses nothing.
        let _ = self.to.try_send(self.incarnation);
    }
}

impl Cluster {
    /// Parses the connection string (TCP only) for the cluster's protocol generation and
    /// prepares `connections` lazy slots.
    pub(crate) fn new(
        alias: &str,
        iggy_version: IggyVersion,
        connection_string: &str,
        connections: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidParams {
            field: format!("clusters.{alias}.connection_string"),
            reason: reason.to_owned(),
        };
        let scheme = connection_string.split("://").next().unwrap_or_default();
        if !matches!(scheme, "iggy" | "iggy+tcp") {
            return Err(invalid("only iggy:// and iggy+tcp:// (TCP) are supported"));
        }
        let seed_addresses = replicator_model::seed_addresses(connection_string);
        let seeds = replicator_model::seed_urls(connection_string)
            .iter()
            .map(|seed| ClientConfig::parse(iggy_version, seed))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(invalid)?;
        Ok(Self {
            alias: alias.to_owned(),
            seeds,
            preferred_seed: std::sync::atomic::AtomicUsize::new(0),
            seed_addresses,
            roster: std::sync::Mutex::default(),
            slots: (0..connections.max(1)).map(|_| Slot::default()).collect(),
            near_slots: connections.max(1),
            far_slots: connections.max(1),
            distance: Arc::default(),
            far_slots_opened: std::sync::atomic::AtomicBool::new(false),
            slots_opened_ahead: std::sync::atomic::AtomicBool::new(false),
            open: std::sync::atomic::AtomicUsize::new(0),
            timeout,
            activity: ActivityRegistry::default(),
            closed_for_good: std::sync::atomic::AtomicBool::new(false),
            login_refused: None,
            topic_reads: SharedReads::default(),
        })
    }

    /// Like [`Cluster::new`], but every connection logs in as `username` instead of with the
    /// connection string's credential (a writer identity).
    pub(crate) fn with_login(
        alias: &str,
        iggy_version: IggyVersion,
        connection_string: &str,
        connections: usize,
        timeout: Duration,
        username: &str,
        password: &str,
    ) -> Result<Self> {
        let mut cluster = Self::new(alias, iggy_version, connection_string, connections, timeout)?;
        for seed in &mut cluster.seeds {
            *seed = seed.with_login(username, password);
        }
        Ok(cluster)
    }

    /// Uses `far_connections` connections instead of `connections` while the cluster's round
    /// trips are long ([`distance`]).
    pub(crate) fn with_far_connections(mut self, far_connections: usize) -> Self {
        self.far_slots = far_connections.max(1);
        while self.slots.len() < self.far_slots {
            self.slots.push(Slot::default());
        }
        self
    }

    /// Whether the cluster counts as far now ([`distance`]).
    pub(crate) fn far(&self) -> bool {
        self.distance.far()
    }

    /// Once the cluster counts as far, opens the connections of all its far slots in the
    /// background, once: across regions a connection costs three round trips before its first
    /// call (connect, login, cluster metadata), and a failover's new owner would otherwise pay
    /// them on its resume for every slot this node had not used yet (BENCHMARKS.md section 28).
    pub(crate) fn open_far_slots(self: &Arc<Self>) {
        // Read first: every poll and send asks, and only the first needs the write.
        let opened = &self.far_slots_opened;
        if !self.far()
            || opened.load(std::sync::atomic::Ordering::Relaxed)
            || opened.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        self.spawn_opening(self.far_slots, true);
    }

    /// Opens the connections of every slot in use now in the background, once: for a cluster
    /// whose calls must not wait for a connect and a login when they come (the fence's
    /// managing connections: a failover's revoke uses all of them at once).
    pub(crate) fn open_slots_ahead(self: &Arc<Self>) {
        let opened = &self.slots_opened_ahead;
        if opened.load(std::sync::atomic::Ordering::Relaxed)
            || opened.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        self.spawn_opening(self.slots_in_use(), false);
    }

    /// Opens slots `0..slots` in the background, all at once: across regions a connection
    /// takes three round trips to open, and one after the other sixteen of them took ten
    /// seconds at 200 ms, during which the calls meant for the slots not open yet queued
    /// behind the open ones (BENCHMARKS.md section 40). A slot whose opening failed is left
    /// to its calls, which open it as ever; with `while_far`, nothing is opened if the cluster
    /// no longer counts as far when the task starts.
    fn spawn_opening(self: &Arc<Self>, slots: usize, while_far: bool) {
        let cluster = self.clone();
        tokio::spawn(
            async move {
                if while_far && !cluster.far() {
                    return;
                }
                let opening = (0..slots).map(|slot| {
                    let cluster = &cluster;
                    async move {
                        if let Err(e) = cluster.get(slot).await {
                            tracing::debug!(cluster = %cluster.alias, slot, error = %e, "opening a connection ahead failed");
                        }
                    }
                });
                futures::future::join_all(opening).await;
            }
            .instrument(tracing::Span::current()),
        );
    }

    /// The slots in use now.
    fn slots_in_use(&self) -> usize {
        if self.distance.far() {
            self.far_slots
        } else {
            self.near_slots
        }
    }

    /// Reports to `refused` whenever the cluster refuses the login of a new connection with
    /// invalid credentials or as an inactive user (a writer identity whose user is missing, has
    /// another password, or was revoked).
    pub(crate) fn notify_login_refused(mut self, refused: LoginRefusals) -> Self {
        self.login_refused = Some(refused);
        self
    }

    /// Closes every connection and refuses to open new ones: calls fail with
    /// [`Error::WriterRevoked`] from now on.
    pub(crate) async fn close_for_good(&self) {
        self.refuse_calls();
        self.close().await;
    }

    /// The part of [`Cluster::close_for_good`] that takes effect at once: every call from now on
    /// fails with [`Error::WriterRevoked`]; the open connections stay until `close`.
    pub(crate) fn refuse_calls(&self) {
        self.closed_for_good
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The cluster alias.
    pub(crate) fn alias(&self) -> &str {
        &self.alias
    }

    /// How many of its connections are open now, of how many configured.
    pub(crate) fn connection_state(&self) -> ConnectionState {
        ConnectionState {
            cluster: self.alias.clone(),
            open: self.open.load(std::sync::atomic::Ordering::Relaxed),
            configured: self.slots_in_use(),
        }
    }

    /// The per-stream activity watchers of the readers reading from this cluster.
    pub(crate) fn activity(&self) -> &ActivityRegistry {
        &self.activity
    }

    /// The connection of `slot` (modulo the slots in use), connecting if needed. A change of
    /// distance moves a caller to another connection between two of its calls, never during
    /// one: each caller's calls stay one at a time, in order.
    async fn get(&self, slot: usize) -> Result<Conn> {
        let slot = slot % self.slots_in_use();
        let mut guard = self.slots[slot].current.lock().await;
        if self
            .closed_for_good
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::WriterRevoked {
                cluster: self.alias.clone(),
            });
        }
        if let Some(conn) = &guard.0 {
            return Ok(conn.clone());
        }
        let client = self.connect_to_a_seed().await?;
        guard.1 += 1;
        let conn = Conn {
            client: Arc::new(client),
            build: guard.1,
            slot,
        };
        guard.0 = Some(conn.clone());
        self.slots[slot]
            .gate
            .current
            .store(conn.build, std::sync::atomic::Ordering::SeqCst);
        self.open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(cluster = %self.alias, slot, "connected");
        self.spawn_heartbeat(&conn);
        Ok(conn)
    }

    /// The slot a call meant for `slot` takes as `pick` allows: its own (modulo the slots in
    /// use), or, when that one is taken in the sense of `pick`, the first other slot that is
    /// [`Slot::free`]. Its own when none is (all busy: the call waits its turn there).
    fn route(&self, slot: usize, pick: Pick) -> usize {
        let in_use = self.slots_in_use();
        let own = slot % in_use;
        let taken = match pick {
            Pick::Own => false,
            Pick::AroundPings => self.slots[own]
                .gate
                .pinging
                .load(std::sync::atomic::Ordering::Relaxed),
            Pick::AnyFree => !self.slots[own].free(),
        };
        if !taken {
            return own;
        }
        first_free(own, in_use, |s| self.slots[s].free()).unwrap_or(own)
    }

    /// Asks the heartbeat of a free connection (else of `slot`'s, just used) for a PING now: a
    /// probe of the distance ([`Next::Probe`]). A free one, so that no call waits behind it.
    fn probe(&self, slot: usize) {
        let probed =
            first_free(slot, self.slots_in_use(), |s| self.slots[s].free()).unwrap_or(slot);
        self.slots[probed].gate.probe.notify_one();
    }

    /// Starts the heartbeat of the new connection `conn` ([`Heartbeat`]); its first ping comes
    /// a share of the interval in that depends on the slot, so that the slots' pings are spread
    /// over the interval rather than all due at once (a call then always finds a free slot).
    fn spawn_heartbeat(&self, conn: &Conn) {
        // Every seed has the connection string's options.
        let interval = self.seeds[0].heartbeat_interval();
        let slots = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let share = u32::try_from(conn.slot).unwrap_or(0).saturating_add(1);
        let first = interval.mul_f64(f64::from(share) / (f64::from(slots) + 1.0));
        let heartbeat = Heartbeat {
            client: Arc::downgrade(&conn.client),
            gate: self.slots[conn.slot].gate.clone(),
            build: conn.build,
            timeout: self.timeout,
            distance: self.distance.clone(),
        };
        tokio::spawn(heartbeat.run(first, interval).instrument(
            tracing::debug_span!("heartbeat", cluster = %self.alias, slot = conn.slot),
        ));
    }

    /// A new connection (logged in), from the seed that connected last or else the next one
    /// that does: a replica that is down or slow costs one bounded try, not the cluster.
    /// Credentials a seed refuses are the cluster's: they end the search.
    async fn connect_to_a_seed(&self) -> Result<Client> {
        let count = self.seeds.len();
        let first = self
            .preferred_seed
            .load(std::sync::atomic::Ordering::Relaxed);
        // The configured seeds from the one that connected last, then the advertised nodes
        // that are not among them.
        let mut tries: std::collections::VecDeque<(Option<usize>, ClientConfig, Roster)> = (0
            ..count)
            .map(|k| (first + k) % count)
            .map(|seed| (Some(seed), self.seeds[seed].clone(), Roster::Ask))
            .collect();
        let roster = self
            .roster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for address in roster {
            if !self.seed_addresses.contains(&address) {
                tries.push_back((None, self.seeds[first % count].at(&address), Roster::Ask));
            }
        }
        // With other ways in, a dead one must not cost a whole operation timeout.
        let bound = if tries.len() > 1 {
            self.timeout.min(SEED_CONNECT_TIMEOUT)
        } else {
            self.timeout
        };
        let mut failure = None;
        while let Some((seed, config, roster)) = tries.pop_front() {
            let client = config
                .client()
                .map_err(|source| self.err("connect", source))?;
            match tokio::time::timeout(bound, client.connect_without_heartbeat()).await {
                Ok(Ok(())) => {
                    match seed {
                        Some(seed) if seed != first => {
                            tracing::info!(cluster = %self.alias, seed, "connected through another seed address");
                        }
                        None => tracing::info!(
                            cluster = %self.alias,
                            "connected through a node the cluster advertised"
                        ),
                        Some(_) => {}
                    }
                    if let Some(seed) = seed {
                        self.preferred_seed
                            .store(seed, std::sync::atomic::Ordering::Relaxed);
                    }
                    if config.replicated()
                        && roster == Roster::Ask
                        && !self.learn_roster(&client).await
                    {
                        // The roster request is still in flight on this connection: its late
                        // answer would be read as the next call's, or that call would wait for
                        // the SDK's response budget. A new connection through the same address,
                        // without asking again.
                        shutdown(&client, InFlight::Read).await;
                        tries.push_front((seed, config, Roster::Skip));
                        continue;
                    }
                    return Ok(client);
                }
                Ok(Err(source)) => {
                    shutdown(&client, InFlight::Login).await;
                    // A missing user or a wrong password, or a user the target keeps inactive
                    // (an earlier replicator cluster with the same `writer_user_prefix` revoked
                    // it): this identity will never log in there. Credentials are the
                    // cluster's: no other node will take them either.
                    if source.kind() == replicator_sdk::ErrorKind::CredentialsRejected {
                        if let Some(refused) = &self.login_refused {
                            refused.report();
                        }
                        return Err(self.err("connect", source));
                    }
                    failure = Some(self.err("connect", source));
                }
                Err(_) => {
                    shutdown(&client, InFlight::Login).await;
                    failure = Some(Error::Timeout {
                        cluster: self.alias.clone(),
                        op: "connect".into(),
                    });
                }
            }
        }
        Err(failure.unwrap_or_else(|| Error::Timeout {
            cluster: self.alias.clone(),
            op: "connect".into(),
        }))
    }

    /// Remembers the nodes the cluster advertises (asked on the new connection `client`,
    /// briefly; a cluster that does not answer keeps the roster it had). False when the ask
    /// timed out: its request may still be in flight on `client`.
    async fn learn_roster(&self, client: &Client) -> bool {
        let asked = tokio::time::timeout(ROSTER_TIMEOUT, client.cluster_addresses()).await;
        let Ok(answered) = asked else {
            tracing::debug!(cluster = %self.alias, "the roster was not answered in time");
            return false;
        };
        if let Ok(addresses) = answered {
            if !addresses.is_empty() {
                *self
                    .roster
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = addresses;
            }
        }
        true
    }

    /// Drops `conn` if it is still the slot's current connection.
    async fn invalidate(&self, conn: &Conn, in_flight: InFlight) {
        let mut guard = self.slots[conn.slot].current.lock().await;
        if guard.0.as_ref().is_some_and(|c| c.build == conn.build) {
            guard.0 = None;
            self.slots[conn.slot]
                .gate
                .current
                .store(0, std::sync::atomic::Ordering::SeqCst);
            drop(guard);
            self.open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            shutdown(&conn.client, in_flight).await;
        }
    }

    /// Shuts every connection down, after ending the activity watchers (which would otherwise
    /// reconnect for their next metadata request).
    pub(crate) async fn close(&self) {
        self.activity.close();
        for slot in &self.slots {
            let conn = slot.current.lock().await.0.take();
            slot.gate
                .current
                .store(0, std::sync::atomic::Ordering::SeqCst);
            if let Some(conn) = conn {
                self.open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                shutdown(&conn.client, InFlight::Requests).await;
            }
        }
    }

    /// Wraps an SDK error with this cluster's alias and the operation.
    fn err(&self, op: impl Into<String>, source: replicator_sdk::Error) -> Error {
        Error::Iggy {
            cluster: self.alias.clone(),
            op: op.into(),
            source,
        }
    }

    /// Runs one SDK call on the connection of `slot` under the timeout. A connection failure or a
    /// timeout drops the connection, so the next call reconnects. The call is light: it carries
    /// no batch ([`distance::LIGHT_CALL_BYTES`]).
    pub(crate) async fn call<T, F, Fut>(&self, slot: usize, op: &str, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = replicator_sdk::Result<T>>,
    {
        match self
            .call_checked(slot, op, 0, || Ok::<(), std::convert::Infallible>(()), f)
            .await?
        {
            Ok(value) => Ok(value),
            Err(never) => match never {},
        }
    }

    /// Like [`Cluster::call`], on the connection `pick` allows ([`Pick`]), for a
    /// read whose answer may carry a batch: `answer_bytes` tells how much it did.
    pub(crate) async fn call_picked<T, F, Fut>(
        &self,
        (slot, pick): (usize, Pick),
        op: &str,
        f: F,
        answer_bytes: impl FnOnce(&T) -> u64,
    ) -> Result<T>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = replicator_sdk::Result<T>>,
    {
        let unchecked = || Ok::<(), std::convert::Infallible>(());
        match self
            .call_routed((slot, pick), op, unchecked, f, answer_bytes)
            .await?
        {
            Ok(value) => Ok(value),
            Err(never) => match never {},
        }
    }

    /// A topic's metadata (`None`: no such topic) as the server gave it in answer to a request
    /// that started after this call did. Callers asking for the same topic meanwhile share the
    /// request ([`shared_read`]): an instance starting tens of thousands of units would
    /// otherwise fetch a topic of 1,000 partitions 1,000 times at once.
    pub(crate) async fn topic_now(
        &self,
        slot: usize,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<Option<Arc<TopicDetails>>> {
        let key = (stream.to_string(), topic.to_string());
        self.topic_reads
            .get(&key, || async {
                let (stream, topic) = (stream.clone(), topic.clone());
                let answer = self
                    .call(slot, "get_topic", |c| async move {
                        c.get_topic(&stream, &topic).await
                    })
                    .await?;
                Ok(answer.map(Arc::new))
            })
            .await
    }

    /// Like [`Cluster::call`], but runs `check` once this call's turn on the connection has
    /// come, right before the request is written, and skips the call when it fails. Writers use
    /// it to re-check their lease and epoch as late as possible: a wait for the connection
    /// (other units' sends) can no longer carry a send past the end of its lease. The request
    /// carries `request_bytes` (a send's batch; 0 for other writes).
    pub(crate) async fn call_checked<T, V, C, F, Fut>(
        &self,
        slot: usize,
        op: &str,
        request_bytes: u64,
        check: C,
        f: F,
    ) -> Result<std::result::Result<T, V>>
    where
        C: FnOnce() -> std::result::Result<(), V>,
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = replicator_sdk::Result<T>>,
    {
        self.call_routed((slot, Pick::Own), op, check, f, |_| request_bytes)
            .await
    }

    /// [`Cluster::call_checked`] on the slot [`Cluster::route`] picks for `slot`; `carried`
    /// tells from the answer what the call carried both ways, for the [`Distance`].
    async fn call_routed<T, V, C, F, Fut>(
        &self,
        (slot, pick): (usize, Pick),
        op: &str,
        check: C,
        f: F,
        carried: impl FnOnce(&T) -> u64,
    ) -> Result<std::result::Result<T, V>>
    where
        C: FnOnce() -> std::result::Result<(), V>,
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = replicator_sdk::Result<T>>,
    {
        let (conn, _turn) = loop {
            let conn = self.get(self.route(slot, pick)).await?;
            let turn = self.slots[conn.slot].gate.turn.lock().await;
            let abandoned = self.slots[conn.slot]
                .gate
                .abandoned
                .load(std::sync::atomic::Ordering::SeqCst);
            if abandoned != conn.build {
                break (conn, turn);
            }
            drop(turn);
            tracing::debug!(cluster = %self.alias, slot = conn.slot, "a call on the connection was abandoned; reconnecting");
            self.invalidate(&conn, InFlight::Requests).await;
        };
        if let Err(veto) = check() {
            return Ok(Err(veto));
        }
        let mut guard = CallGuard {
            gate: &self.slots[conn.slot].gate,
            build: conn.build,
            finished: false,
        };
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(self.timeout, f(conn.client.clone())).await;
        guard.finished = true;
        let err = match result {
            Ok(Ok(value)) => {
                if self.distance.observe(started.elapsed(), || carried(&value)) == Next::Probe {
                    self.probe(conn.slot);
                }
                return Ok(Ok(value));
            }
            Ok(Err(source)) => self.err(op, source),
            Err(_) => Error::Timeout {
                cluster: self.alias.clone(),
                op: op.to_owned(),
            },
        };
        if err.poisons_connection() {
            self.invalidate(&conn, in_flight_of(op)).await;
        }
        Err(err)
    }
}

impl activity::Source for Cluster {
    fn alias(&self) -> &str {
        Cluster::alias(self)
    }

    fn activity(&self) -> &ActivityRegistry {
        Cluster::activity(self)
    }

    fn get_stream(&self, slot: usize, stream: Identifier) -> Request<'_, Option<StreamDetails>> {
        Box::pin(self.call(slot, "get_stream", |c| async move {
            c.get_stream(&stream).await
        }))
    }

    fn get_topic(
        &self,
        slot: usize,
        stream: Identifier,
        topic: Identifier,
    ) -> Request<'_, Option<TopicDetails>> {
        Box::pin(self.call(slot, "get_topic", |c| async move {
            c.get_topic(&stream, &topic).await
        }))
    }
}

/// The bytes a poll's answer carried (its messages as on the wire), for the [`Distance`] of
/// callers of [`Cluster::call_picked`] that poll.
pub(crate) fn polled_bytes(polled: &replicator_sdk::Polled) -> u64 {
    polled
        .messages
        .iter()
        .map(replicator_sdk::Message::wire_bytes)
        .sum()
}

/// The first slot after `own` (in turn, among `0..in_use`) that `free` says is free.
fn first_free(own: usize, in_use: usize, free: impl Fn(usize) -> bool) -> Option<usize> {
    (1..in_use).map(|k| (own + k) % in_use).find(|&s| free(s))
}

/// A connection's heartbeat: the PING the SDK would send on its own timer (its heartbeat is
/// off, see [`Client::connect_without_heartbeat`]), sent here in the slot's turn so that the
/// slot's callers can go elsewhere meanwhile. Servers with their heartbeat check on drop a
/// client that does not ping; servers without it (Iggy's default) do not need the pings, but
/// they cost little once no call waits behind them.
struct Heartbeat {
    /// The connection; the heartbeat ends once the slot dropped it.
    client: std::sync::Weak<Client>,
    gate: Arc<Gate>,
    /// Which build of the slot the connection is.
    build: u64,
    /// Bound of a ping, as of any call.
    timeout: Duration,
    /// The cluster's distance, which every answered ping tells the round trip of the path.
    distance: Arc<Distance>,
}

impl Heartbeat {
    /// Pings `first` from now, then every `interval`, until the connection is dropped or a
    /// ping is lost (the connection failed or the answer did not come in time). A connection
    /// whose ping got no answer may still get one, which would be read as the next call's: it
    /// is marked abandoned, so that the next call opens a new connection instead (as after a
    /// call given up).
    async fn run(self, first: Duration, interval: Duration) {
        let mut due = tokio::time::Instant::now() + first;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(due) => due += interval,
                // A probe leaves the schedule as it was: the next ping is due as ever.
                () = self.gate.probe.notified() => {}
            }
            let Some(client) = self.client.upgrade() else {
                return;
            };
            self.gate
                .pinging
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let pinged = {
                let _turn = self.gate.turn.lock().await;
                // A call that failed in the meantime dropped the connection in its turn.
                let current = self.gate.current.load(std::sync::atomic::Ordering::SeqCst);
                if current == self.build {
                    let started = std::time::Instant::now();
                    let pinged = tokio::time::timeout(self.timeout, client.ping()).await;
                    if let Ok(Ok(())) = pinged {
                        // A ping carries nothing: it never asks for a probe.
                        let _ = self.distance.observe(started.elapsed(), || 0);
                    }
                    Some(pinged)
                } else {
                    None
                }
            };
            self.gate
                .pinging
                .store(false, std::sync::atomic::Ordering::Relaxed);
            let Some(pinged) = pinged else {
                return;
            };
            let lost = match &pinged {
                Ok(Ok(())) => false,
                // An answer, if an error: the connection works.
                Ok(Err(e)) => crate::error::is_connection_error(e),
                Err(_) => true,
            };
            if lost {
                tracing::debug!("a ping failed or got no answer in time; the connection is dropped at its next call");
                // At most: a newer build's mark (a call of it abandoned) must stay.
                self.gate
                    .abandoned
                    .fetch_max(self.build, std::sync::atomic::Ordering::SeqCst);
                return;
            }
        }
    }
}

/// What a connection whose call `op` failed may still have in flight: a read (metadata, a
/// poll at an explicit offset, a ping), whose replay changes nothing, or a request that may
/// still land (every write: a send, an offset store, a user or topic change).
fn in_flight_of(op: &str) -> InFlight {
    if op.starts_with("get_") || op == "poll_messages" || op == "ping" {
        InFlight::Read
    } else {
        InFlight::Requests
    }
}

/// Shuts an SDK client down (stops its heartbeat), bounded so a wedged socket cannot hang us.
/// The bound is sized to what may be `in_flight`: a 0.9 connection that was in use is given
/// until a request it may still be replaying has ended, so that a writer re-reads the target's
/// tail only once its previous send can no longer land behind it; a login that was given up is
/// not waited for (it cannot land data, and waiting for it held the next seed address back for
/// the SDK's whole 30 s response budget).
async fn shutdown(client: &Client, in_flight: InFlight) {
    let _ = tokio::time::timeout(client.shutdown_budget(in_flight), client.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn only_a_failed_write_keeps_its_connection_until_a_replay_could_land() {
        for op in [
            "send_messages",
            "store_consumer_offset",
            "create_topic",
            "update_user",
        ] {
            check!(in_flight_of(op) == InFlight::Requests, "{op}");
        }
        for op in [
            "poll_messages",
            "get_topic",
            "get_stream",
            "get_streams",
            "ping",
        ] {
            check!(in_flight_of(op) == InFlight::Read, "{op}");
        }
    }

    #[test]
    fn a_call_whose_slot_is_pinged_takes_the_next_free_one_in_turn() {
        let free = |set: &'static [usize]| move |s: usize| set.contains(&s);
        check!(first_free(2, 4, free(&[0, 3])) == Some(3));
        check!(first_free(3, 4, free(&[0, 1])) == Some(0));
        // Its own slot is never a way around its own ping.
        check!(first_free(1, 4, free(&[1])) == None);
        check!(first_free(0, 1, free(&[0])) == None);
    }

    /// The testkit's code of PING.
    const PING: u32 = 1;

    async fn streams(cluster: &Cluster, slot: usize, pick: Pick) -> Result<usize> {
        let get = |c: Arc<Client>| async move { c.get_streams().await };
        let streams = cluster
            .call_picked((slot, pick), "get_streams", get, |_| 0)
            .await?;
        Ok(streams.len())
    }

    #[tokio::test]
    async fn connections_are_pinged_every_heartbeat_interval_and_reads_do_not_wait_behind_a_ping(
    ) -> Result<()> {
        let server = replicator_testkit::TestServer::start(Default::default())
            .await
            .expect("testkit server");
        let faults = server.faults();
        // The first ping is held for a minute: a call that waited behind it would too.
        faults.delay_next(PING, Duration::from_secs(60), 1);
        let url = format!("{}?heartbeat_interval=1s", server.connection_string());
        let cluster = Cluster::new("us", IggyVersion::V0_8, &url, 2, Duration::from_secs(120))?;
        for slot in 0..2 {
            streams(&cluster, slot, Pick::Own).await?;
        }
        // Pings come from the cluster: none is sent at connect (the SDK's heartbeat sends one
        // at once), the first a share of the interval later.
        let first_ping = || async { faults.requests(PING) >= 1 };
        replicator_harness::wait_until("the first ping", Duration::from_secs(30), first_ping)
            .await
            .expect("a ping within the deadline");
        for slot in 0..2 {
            let read = streams(&cluster, slot, Pick::AroundPings);
            let answered = tokio::time::timeout(Duration::from_secs(30), read);
            check!(matches!(answered.await, Ok(Ok(_))), "slot {slot}");
        }
        check!(faults.delays_ended() == 0, "the held ping is still held");
        // A call that must stay on its slot waits its turn behind the ping.
        let pinging = |s: usize| {
            cluster.slots[s]
                .gate
                .pinging
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let pinged = (0..2).find(|&s| pinging(s));
        check!(pinged.is_some(), "a slot is being pinged");
        if let Some(slot) = pinged {
            let own = streams(&cluster, slot, Pick::Own);
            check!(tokio::time::timeout(Duration::from_millis(300), own)
                .await
                .is_err());
        }
        // The other connection keeps being pinged, every interval.
        let more_pings = || async { faults.requests(PING) >= 4 };
        replicator_harness::wait_until("more pings", Duration::from_secs(30), more_pings)
            .await
            .expect("pings every interval");
        cluster.close().await;
        server.shutdown().await;
        Ok(())
    }

    #[tokio::test]
    async fn a_connection_whose_ping_got_no_answer_is_replaced_at_its_next_call() -> Result<()> {
        let server = replicator_testkit::TestServer::start(Default::default())
            .await
            .expect("testkit server");
        let faults = server.faults();
        // The first ping is held far longer than a call may take.
        faults.delay_next(PING, Duration::from_secs(60), 1);
        let url = format!("{}?heartbeat_interval=200ms", server.connection_string());
        let cluster = Cluster::new("us", IggyVersion::V0_8, &url, 1, Duration::from_secs(1))?;
        streams(&cluster, 0, Pick::Own).await?;
        let lost = || async {
            cluster.slots[0]
                .gate
                .abandoned
                .load(std::sync::atomic::Ordering::SeqCst)
                != 0
        };
        replicator_harness::wait_until("the ping given up", Duration::from_secs(30), lost)
            .await
            .expect("the held ping given up");
        // Its answer may still come: the call goes through a new connection, not behind it.
        let answered =
            tokio::time::timeout(Duration::from_secs(30), streams(&cluster, 0, Pick::Own));
        check!(matches!(answered.await, Ok(Ok(_))));
        check!(
            cluster.slots[0]
                .gate
                .current
                .load(std::sync::atomic::Ordering::SeqCst)
                == 2
        );
        cluster.close().await;
        server.shutdown().await;
        Ok(())
    }

    /// The testkit's code of LOGIN_USER.
    const LOGIN_USER: u32 = 38;

    #[tokio::test]
    async fn slots_opened_ahead_are_opened_all_at_once() -> Result<()> {
        let server = replicator_testkit::TestServer::start(Default::default())
            .await
            .expect("testkit server");
        let faults = server.faults();
        // Every login is held: one after the other, the second would not start meanwhile.
        faults.delay_next(LOGIN_USER, Duration::from_secs(60), 8);
        let cluster = Arc::new(Cluster::new(
            "us",
            IggyVersion::V0_8,
            &server.connection_string(),
            8,
            Duration::from_secs(120),
        )?);
        cluster.spawn_opening(8, false);
        let all_logging_in = || async { faults.requests(LOGIN_USER) >= 8 };
        replicator_harness::wait_until(
            "eight logins at once",
            Duration::from_secs(30),
            all_logging_in,
        )
        .await
        .expect("every slot's login sent while the others are held");
        // The held logins end with their connections.
        faults.drop_connections();
        cluster.close().await;
        server.shutdown().await;
        Ok(())
    }

    /// The testkit's code of GET_STREAMS.
    const GET_STREAMS: u32 = 201;

    /// A `get_streams` on `slot` that the distance takes for a call carrying a batch.
    async fn heavy_streams(cluster: &Cluster, slot: usize) -> Result<usize> {
        let get = |c: Arc<Client>| async move { c.get_streams().await };
        let heavy = |_: &_| distance::LIGHT_CALL_BYTES + 1;
        let streams = cluster
            .call_picked((slot, Pick::Own), "get_streams", get, heavy)
            .await?;
        Ok(streams.len())
    }

    #[tokio::test]
    async fn slow_calls_that_carry_batches_are_judged_by_the_pings_they_ask_for() -> Result<()> {
        // No ping on the heartbeat's own schedule during the test: only probes.
        let server = replicator_testkit::TestServer::start(Default::default())
            .await
            .expect("testkit server");
        let faults = server.faults();
        let url = |addr: std::net::SocketAddr| {
            let url = server.connection_string();
            let (credentials, _) = url.split_once('@').expect("credentials in the url");
            format!("{credentials}@{addr}?heartbeat_interval=1h")
        };
        // A near server busy with batches: every call takes 30 ms there, its pings do not.
        faults.delay_next(GET_STREAMS, Duration::from_millis(30), u32::MAX);
        let near = Cluster::new(
            "us",
            IggyVersion::V0_8,
            &url(server.addr()),
            2,
            Duration::from_secs(120),
        )?;
        let probes_answered = || faults.requests(PING) >= 16;
        // Heavy calls until then, and near: a machine busy enough to delay a whole window of
        // pings by 10 ms makes it far for a window, not for good. The checks below say which
        // of the two never came.
        let settled =
            || async { heavy_streams(&near, 0).await.is_ok() && probes_answered() && !near.far() };
        let _ =
            replicator_harness::wait_until("probes, and near", Duration::from_secs(60), settled)
                .await;
        check!(probes_answered(), "slow heavy calls asked for probes");
        check!(!near.far(), "a busy near server counted as far");
        near.close().await;
        // The same calls 30 ms away: far, told by the probes alone.
        let proxy = replicator_testkit::WanProxy::start(
            server.addr(),
            replicator_testkit::WanLink::symmetric(Duration::from_millis(15)),
        )
        .await
        .expect("proxy");
        let far = Cluster::new(
            "us",
            IggyVersion::V0_8,
            &url(proxy.addr()),
            2,
            Duration::from_secs(120),
        )?;
        let turned_far = || async { heavy_streams(&far, 0).await.is_ok() && far.far() };
        let _ = replicator_harness::wait_until("far", Duration::from_secs(60), turned_far).await;
        check!(
            far.far(),
            "a far server's slow heavy calls never made it far"
        );
        far.close().await;
        proxy.stop().await;
        server.shutdown().await;
        Ok(())
    }

    #[test]
    fn only_tcp_connection_strings_are_accepted() {
        let t = Duration::from_secs(1);
        check!(Cluster::new("us", IggyVersion::V0_8, "iggy://u:p@127.0.0.1:8090", 1, t).is_ok());
        check!(Cluster::new(
            "us",
            IggyVersion::V0_8,
            "iggy+tcp://u:p@127.0.0.1:8090?tls=false",
            2,
            t
        )
        .is_ok());
        let quic = Cluster::new(
            "us",
            IggyVersion::V0_8,
            "iggy+quic://u:p@127.0.0.1:8090",
            1,
            t,
        );
        check!(matches!(quic, Err(Error::InvalidParams { .. })));
        let bad = Cluster::new("us", IggyVersion::V0_8, "iggy://127.0.0.1", 1, t);
        check!(
            matches!(bad, Err(Error::InvalidParams { ref field, .. }) if field == "clusters.us.connection_string")
        );
    }
}
