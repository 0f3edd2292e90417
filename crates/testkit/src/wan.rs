//! A WAN in a box: a TCP proxy on loopback that delays, paces and bounds what it relays, so
//! tests, benches and HA scenarios can put a long, thin path between the replicator and an Iggy
//! server, or between two replicator nodes (Raft RPCs are HTTP over TCP).
//!
//! ```no_run
//! # async fn demo(upstream: std::net::SocketAddr) -> std::io::Result<()> {
//! use replicator_testkit::{WanLink, WanProxy};
//! use std::time::Duration;
//! let proxy = WanProxy::start(upstream, WanLink::symmetric(Duration::from_millis(40))).await?;
//! let via = proxy.addr(); // connect here instead of `upstream`: 80 ms round trips
//! proxy.cut(true); // a partition: every connection closes, new ones are refused
//! proxy.cut(false);
//! proxy.stop().await;
//! # Ok(()) }
//! ```
//!
//! What it models: a path's propagation delay each way (optionally with jitter), its bandwidth,
//! and how many bytes it holds before the sender feels backpressure. Each chunk is stamped when
//! it is read and written out at `read instant + delay + jitter`, never before a chunk read
//! earlier, so bytes stay in order and exact; a half-close (EOF) travels like the bytes.
//! What it does not model: loss, duplication and reordering of packets below TCP (TCP hides
//! them except as delay, which delay and jitter stand for), TCP's congestion window, and a
//! partition that leaves connections hanging silently (`cut` closes them instead). It is plain
//! userspace TCP on 127.0.0.1: no tc/netem, no root.
//!
//! Each direction of a connection is a reader and a writer joined by a channel whose bytes are
//! bounded by a semaphore of [`WanLink::buffer`] permits: the reader takes room before it reads
//! and the writer gives it back once the bytes are written, so the proxy holds at most that many
//! bytes per direction and otherwise stops reading, as a full path would.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore, SemaphorePermit};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Default bytes a direction of a connection holds before backpressure: 16 MiB, the
/// bandwidth-delay product of 1 Gbit/s at about 130 ms round trip.
pub const DEFAULT_WAN_BUFFER: usize = 16 << 20;

/// Most bytes one read takes, and so the room a reader reserves before reading.
const CHUNK: usize = 64 << 10;

/// Pause after a failed accept (out of descriptors), so the loop does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

/// The path a [`WanProxy`] models. The default is a transparent link with the default buffer;
/// set fields with struct update syntax: `WanLink { jitter, ..WanLink::symmetric(one_way) }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WanLink {
    /// One-way delay from the connecting side to upstream.
    pub delay_up: Duration,
    /// One-way delay from upstream back to the connecting side.
    pub delay_down: Duration,
    /// Each chunk waits a further uniform random time in `[0, jitter]`, but never overtakes a
    /// chunk read before it (its due time is at least the previous one's): no reordering.
    pub jitter: Duration,
    /// Bytes per second each direction of each connection carries (`None`: unlimited; values
    /// below 1 count as 1), paced in slices of 10 ms worth.
    pub bandwidth: Option<u64>,
    /// Bytes a direction of a connection holds (read, not yet written) before the proxy stops
    /// reading from the sender; at least 1. A change applies to connections accepted after it.
    pub buffer: usize,
    /// Seed of the jitter; each direction of each connection draws from its own generator.
    pub seed: u64,
}

impl Default for WanLink {
    fn default() -> Self {
        WanLink {
            delay_up: Duration::ZERO,
            delay_down: Duration::ZERO,
            jitter: Duration::ZERO,
            bandwidth: None,
            buffer: DEFAULT_WAN_BUFFER,
            seed: 0,
        }
    }
}

impl WanLink {
    /// `one_way` each way (a round trip of twice that), no jitter, no bandwidth limit.
    pub fn symmetric(one_way: Duration) -> Self {
        WanLink {
            delay_up: one_way,
            delay_down: one_way,
            ..WanLink::default()
        }
    }
}

/// A running proxy on 127.0.0.1 to one upstream address. Dropping it without [`WanProxy::stop`]
/// aborts its tasks and so closes every connection.
#[derive(Debug)]
pub struct WanProxy {
    /// The listening address.
    addr: SocketAddr,
    /// Link, cut state and gauges, shared with the tasks.
    shared: Arc<Shared>,
    /// Cancels the accept loop and, through child tokens, every connection.
    stop: CancellationToken,
    /// The accept loop, which owns the connection tasks; `None` once stopped.
    accept: Option<JoinHandle<()>>,
}

/// What the proxy's tasks share.
#[derive(Debug)]
struct Shared {
    /// Where every connection goes.
    upstream: SocketAddr,
    /// Link and cut state, read at each accept and each read.
    control: Mutex<Control>,
    /// Open connections.
    connections: AtomicUsize,
    /// Bytes read and not yet written, over every connection and direction.
    queued: AtomicUsize,
    /// Highest `queued` seen (tests check the buffer bound with it).
    peak: AtomicUsize,
}

/// The switches `set_link` and `cut` turn.
#[derive(Debug)]
struct Control {
    /// Applies to every chunk read from now on.
    link: WanLink,
    /// While set, accepted connections are closed at once.
    cut: bool,
    /// Token of the connections accepted since the last uncut; cancelled by `cut` and `stop`.
    live: CancellationToken,
}

impl Shared {
    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        crate::state::lock(&self.control)
    }

    fn link(&self) -> WanLink {
        self.control().link
    }
}

impl WanProxy {
    /// Listens on 127.0.0.1:0 and relays every accepted connection to `upstream` over `link`.
    pub async fn start(upstream: SocketAddr, link: WanLink) -> io::Result<WanProxy> {
        let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| context(e, format_args!("wan proxy to {upstream}: binding {bind}")))?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            upstream,
            control: Mutex::new(Control {
                link,
                cut: false,
                live: stop.child_token(),
            }),
            connections: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        let span = tracing::debug_span!("wan_proxy", %addr, %upstream);
        let accept =
            tokio::spawn(accept_loop(listener, Arc::clone(&shared), stop.clone()).instrument(span));
        tracing::debug!(%addr, %upstream, ?link, "wan proxy listening");
        Ok(WanProxy {
            addr,
            shared,
            stop,
            accept: Some(accept),
        })
    }

    /// The address to connect to instead of upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The link now in force.
    pub fn link(&self) -> WanLink {
        self.shared.link()
    }

    /// Replaces the link for every chunk read from now on, on open and new connections (except
    /// `buffer`, which a connection fixes when it is accepted). A smaller delay never lets a
    /// chunk overtake one read before it.
    pub fn set_link(&self, link: WanLink) {
        self.shared.control().link = link;
    }

    /// `true`: a partition; closes every open connection (undelivered bytes are lost, as with a
    /// reset) and closes each new one as soon as it is accepted. `false`: accepts again.
    pub fn cut(&self, cut: bool) {
        let mut control = self.shared.control();
        if cut {
            control.live.cancel();
        } else if control.cut {
            control.live = self.stop.child_token();
        }
        control.cut = cut;
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Relaxed)
    }

    /// Bytes read and not yet written, over every connection and direction.
    pub fn queued_bytes(&self) -> usize {
        self.shared.queued.load(Relaxed)
    }

    /// Highest [`WanProxy::queued_bytes`] seen so far.
    #[cfg(test)]
    fn peak_queued_bytes(&self) -> usize {
        self.shared.peak.load(Relaxed)
    }

    /// Closes the listener and every connection and waits for their tasks.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(accept) = self.accept.take() {
            if let Err(e) = accept.await {
                tracing::warn!(addr = %self.addr, error = %e, "wan proxy task ended abnormally");
            }
        }
    }
}

impl Drop for WanProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(accept) = self.accept.take() {
            // Aborting the accept loop drops its `JoinSet`, which aborts every connection.
            accept.abort();
        }
    }
}

/// Accepts until `stop`, then waits for the connections (their tokens descend from `stop`).
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let mut conns = JoinSet::new();
    let mut accepted_so_far = 0u64;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(ended) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = ended {
                    tracing::warn!(error = %e, "wan connection task failed");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    let control = shared.control();
                    if control.cut {
                        tracing::debug!(%peer, "cut: closing new connection");
                        continue;
                    }
                    let live = control.live.clone();
                    accepted_so_far += 1;
                    // A jitter sequence per connection, all from the link's seed.
                    let seed = control.link.seed.wrapping_add(accepted_so_far);
                    drop(control);
                    let counted = Counted::new(&shared);
                    let span = tracing::debug_span!("wan_conn", %peer);
                    conns.spawn(connection(client, peer, counted, live, seed).instrument(span));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "wan proxy: accept failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
            }
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// Counts an open connection for as long as it lives.
struct Counted(Arc<Shared>);

impl Counted {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.connections.fetch_add(1, Relaxed);
        Counted(Arc::clone(shared))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Relaxed);
    }
}

/// One connection, until both directions end, one fails, or `live` is cancelled (cut, stop).
async fn connection(
    client: TcpStream,
    peer: SocketAddr,
    counted: Counted,
    live: CancellationToken,
    seed: u64,
) {
    tokio::select! {
        () = live.cancelled() => tracing::debug!("closed by cut or stop"),
        relayed = relay(client, peer, &counted.0, seed) => match relayed {
            Ok(()) => tracing::debug!("both directions ended"),
            Err(e) => tracing::debug!(error = %e, "connection ended"),
        },
    }
}

/// Connects upstream and pumps both directions.
async fn relay(client: TcpStream, peer: SocketAddr, shared: &Shared, seed: u64) -> io::Result<()> {
    let upstream = shared.upstream;
    let server = TcpStream::connect(upstream)
        .await
        .map_err(|e| context(e, format_args!("{peer} -> {upstream}: connecting upstream")))?;
    // The link's delay is the only one the proxy adds: no Nagle on its own writes.
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let buffer = shared.link().buffer.clamp(1, Semaphore::MAX_PERMITS);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = async {
        pump(
            client_read,
            server_write,
            |l| l.delay_up,
            shared,
            buffer,
            seed,
        )
        .await
        .map_err(|e| context(e, format_args!("up {peer} -> {upstream}")))
    };
    let down = async {
        pump(
            server_read,
            client_write,
            |l| l.delay_down,
            shared,
            buffer,
            !seed,
        )
        .await
        .map_err(|e| context(e, format_args!("down {upstream} -> {peer}")))
    };
    tokio::try_join!(up, down).map(drop)
}

/// What a reader hands its writer: bytes read at one instant, or the sender's EOF. Dropping it
/// (written, or the connection closed) gives its room back and leaves the `queued` gauge.
struct Chunk<'a> {
    /// When the writer may deliver it.
    due: Instant,
    /// The link's bandwidth when it was read.
    bandwidth: Option<u64>,
    /// The bytes; empty for the EOF (a read yields no bytes only at the end).
    data: Vec<u8>,
    /// The bytes' room in the direction's buffer.
    _room: SemaphorePermit<'a>,
    /// Whose `queued` gauge counts the bytes.
    shared: &'a Shared,
}

impl Drop for Chunk<'_> {
    fn drop(&mut self) {
        self.shared.queued.fetch_sub(self.data.len(), Relaxed);
    }
}

/// Relays `from` to `to` over the link, holding at most `buffer` bytes, until EOF or an error.
async fn pump(
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    delay: fn(&WanLink) -> Duration,
    shared: &Shared,
    buffer: usize,
    seed: u64,
) -> io::Result<()> {
    let room = Semaphore::new(buffer);
    // The semaphore bounds the bytes; each chunk has at least one, so this never fills first.
    let (tx, rx) = mpsc::channel(buffer);
    let read = read_side(from, tx, &room, delay, shared, seed);
    tokio::try_join!(read, write_side(to, rx)).map(drop)
}

/// Reads chunks while there is room and stamps each with its due time.
async fn read_side<'a>(
    mut from: OwnedReadHalf,
    tx: mpsc::Sender<Chunk<'a>>,
    room: &'a Semaphore,
    delay: fn(&WanLink) -> Duration,
    shared: &'a Shared,
    seed: u64,
) -> io::Result<()> {
    // The room is whole when the pump starts: this is `CHUNK.min(buffer)`.
    let reserve = CHUNK.min(room.available_permits());
    let mut scratch = vec![0; reserve];
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut last_due = Instant::now();
    loop {
        let mut permit = room
            .acquire_many(reserve as u32)
            .await
            .map_err(|_| io::Error::other("buffer semaphore closed"))?;
        let n = from.read(&mut scratch).await?;
        let taken = permit
            .split(n)
            .ok_or_else(|| io::Error::other("read past the room"))?;
        drop(permit);
        let queued = shared.queued.fetch_add(n, Relaxed) + n;
        shared.peak.fetch_max(queued, Relaxed);
        let link = shared.link();
        let due = last_due.max(Instant::now() + delay(&link) + jitter(&mut rng, link.jitter));
        last_due = due;
        let chunk = Chunk {
            due,
            bandwidth: link.bandwidth,
            data: scratch[..n].to_vec(),
            _room: taken,
            shared,
        };
        if tx.send(chunk).await.is_err() || n == 0 {
            return Ok(());
        }
    }
}

/// Writes each chunk at its due time, paced to its bandwidth; delivers the EOF as a shutdown.
async fn write_side(mut to: OwnedWriteHalf, mut rx: mpsc::Receiver<Chunk<'_>>) -> io::Result<()> {
    // When the pacing lets the next slice out (no credit builds up while idle).
    let mut next_free = Instant::now();
    while let Some(chunk) = rx.recv().await {
        sleep_until(chunk.due).await;
        if chunk.data.is_empty() {
            return to.shutdown().await;
        }
        let Some(rate) = chunk.bandwidth.map(|b| b.max(1)) else {
            to.write_all(&chunk.data).await?;
            continue;
        };
        let slice = usize::try_from(rate / 100).unwrap_or(CHUNK).clamp(1, CHUNK);
        for part in chunk.data.chunks(slice) {
            let at = next_free.max(Instant::now());
            sleep_until(at).await;
            to.write_all(part).await?;
            next_free = at + Duration::from_secs_f64(part.len() as f64 / rate as f64);
        }
    }
    Ok(())
}

/// A uniform random duration in `[0, bound]`.
fn jitter(rng: &mut SmallRng, bound: Duration) -> Duration {
    if bound.is_zero() {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.gen_range(0..=u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX)))
}

/// `e` with `what` in front, keeping its kind.
fn context(e: io::Error, what: std::fmt::Arguments<'_>) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TestServer, TestServerConfig};
    use assert2::{assert, check};
    use iggy::prelude::{
        Client, CompressionAlgorithm, Consumer, Identifier, IggyClient, IggyExpiry, IggyMessage,
        MaxTopicSize, MessageClient, Partitioning, PollingStrategy, StreamClient, TopicClient,
    };
    use std::future::Future;
    use std::str::FromStr;
    use tokio::net::TcpSocket;

    type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// A generous deadline for anything a test waits on (never a pass/fail timing).
    const DEADLINE: Duration = Duration::from_secs(60);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    async fn within<T>(f: impl Future<Output = T>) -> T {
        tokio::time::timeout(DEADLINE, f)
            .await
            .expect("deadline passed")
    }

    /// Polls `done` until it holds, under [`DEADLINE`].
    async fn until(mut done: impl FnMut() -> bool) {
        within(async {
            while !done() {
                tokio::time::sleep(ms(5)).await;
            }
        })
        .await;
    }

    /// An echo server on port 0 that half-closes after the client does; its tasks end when the
    /// returned set is dropped.
    async fn echo_server() -> io::Result<(SocketAddr, JoinSet<()>)> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((mut s, _)) = listener.accept().await {
                conns.spawn(async move {
                    let (mut r, mut w) = s.split();
                    if tokio::io::copy(&mut r, &mut w).await.is_ok() {
                        w.shutdown().await.ok();
                    }
                });
            }
        });
        Ok((addr, tasks))
    }

    /// `true` once the peer closed `s` (EOF or reset).
    async fn closed(s: &mut TcpStream) -> bool {
        matches!(within(s.read(&mut [0; 16])).await, Ok(0) | Err(_))
    }

    #[tokio::test]
    async fn round_trip_takes_both_delays_and_bytes_arrive_exact() -> TestResult {
        let (echo, _echo) = echo_server().await?;
        let proxy = WanProxy::start(echo, WanLink::symmetric(ms(40))).await?;
        let mut s = TcpStream::connect(proxy.addr()).await?;
        s.set_nodelay(true)?;
        let sent = b"hello from the other side of the ocean";
        let started = std::time::Instant::now();
        s.write_all(sent).await?;
        let mut back = vec![0; sent.len()];
        within(s.read_exact(&mut back)).await?;
        check!(started.elapsed() >= ms(80));
        check!(back == sent);
        // Half-close: the EOF follows the bytes up, the echo still comes down, then its EOF.
        let started = std::time::Instant::now();
        s.write_all(b"last words").await?;
        s.shutdown().await?;
        let mut rest = Vec::new();
        within(s.read_to_end(&mut rest)).await?;
        check!(started.elapsed() >= ms(80));
        check!(rest == b"last words");
        until(|| proxy.connections() == 0).await;
        proxy.stop().await;
        Ok(())
    }

    #[tokio::test]
    async fn jittered_writes_arrive_in_order_and_intact() -> TestResult {
        let (echo, _echo) = echo_server().await?;
        let link = WanLink {
            jitter: ms(10),
            ..WanLink::symmetric(ms(2))
        };
        let proxy = WanProxy::start(echo, link).await?;
        let mut rng = SmallRng::seed_from_u64(48);
        let writes: Vec<Vec<u8>> = (0..2_000)
            .map(|_| {
                let len = rng.gen_range(1..=2_048);
                (0..len).map(|_| rng.gen()).collect()
            })
            .collect();
        let (mut r, mut w) = TcpStream::connect(proxy.addr()).await?.into_split();
        let send = async {
            for chunk in &writes {
                w.write_all(chunk).await?;
            }
            w.shutdown().await
        };
        let mut got = Vec::new();
        within(async { tokio::try_join!(send, r.read_to_end(&mut got)) }).await?;
        assert!(got.len() == writes.iter().map(Vec::len).sum::<usize>());
        check!(got == writes.concat());
        proxy.stop().await;
        Ok(())
    }

    #[tokio::test]
    async fn bandwidth_limit_paces_a_megabyte() -> TestResult {
        let sink = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let link = WanLink {
            bandwidth: Some(4 << 20),
            ..WanLink::default()
        };
        let proxy = WanProxy::start(sink.local_addr()?, link).await?;
        let sent: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8).collect();
        let started = std::time::Instant::now();
        let receive = async {
            let (mut s, _) = sink.accept().await?;
            let mut got = Vec::new();
            s.read_to_end(&mut got).await?;
            Ok::<_, io::Error>(got)
        };
        let send = async {
            let mut s = TcpStream::connect(proxy.addr()).await?;
            s.write_all(&sent).await?;
            s.shutdown().await
        };
        let (got, ()) = within(async { tokio::try_join!(receive, send) }).await?;
        // 1 MiB at 4 MiB/s is 250 ms, less the first 10 ms slice; slack for the clock.
        check!(started.elapsed() >= ms(150));
        check!(got == sent);
        proxy.stop().await;
        Ok(())
    }

    #[tokio::test]
    async fn buffer_bound_holds_back_the_sender_until_the_receiver_reads() -> TestResult {
        const BOUND: usize = 1 << 20;
        // Far more than the bound plus every kernel buffer on the way.
        const TOTAL: usize = 32 << 20;
        let socket = TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(64 << 10)?;
        socket.bind((Ipv4Addr::LOCALHOST, 0).into())?;
        let receiver = socket.listen(8)?;
        let link = WanLink {
            buffer: BOUND,
            ..WanLink::symmetric(ms(1))
        };
        let proxy = WanProxy::start(receiver.local_addr()?, link).await?;
        let client = TcpSocket::new_v4()?;
        client.set_send_buffer_size(64 << 10)?;
        let mut sender = client.connect(proxy.addr()).await?;
        let (mut incoming, _) = within(receiver.accept()).await?;
        let sent: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
        let written = AtomicUsize::new(0);
        let go = tokio::sync::Notify::new();
        let send = async {
            for piece in sent.chunks(CHUNK) {
                sender.write_all(piece).await?;
                written.fetch_add(piece.len(), Relaxed);
            }
            sender.shutdown().await
        };
        let receive = async {
            go.notified().await;
            let mut got = Vec::with_capacity(TOTAL);
            incoming.read_to_end(&mut got).await?;
            Ok::<_, io::Error>(got)
        };
        let watch = async {
            until(|| proxy.queued_bytes() > BOUND - CHUNK).await;
            // The proxy is full and the receiver reads nothing: the sender cannot be done.
            check!(written.load(Relaxed) < TOTAL);
            check!(proxy.peak_queued_bytes() <= BOUND);
            go.notify_one();
            Ok::<_, io::Error>(())
        };
        let (got, (), ()) = within(async { tokio::try_join!(receive, send, watch) }).await?;
        assert!(got.len() == TOTAL);
        check!(got == sent);
        check!(proxy.peak_queued_bytes() <= BOUND);
        proxy.stop().await;
        Ok(())
    }

    #[tokio::test]
    async fn cut_closes_connections_and_refuses_new_ones_until_uncut() -> TestResult {
        let (echo, _echo) = echo_server().await?;
        let proxy = WanProxy::start(echo, WanLink::default()).await?;
        let echoes = |mut s: TcpStream| async move {
            s.write_all(b"ping").await?;
            let mut back = [0; 4];
            within(s.read_exact(&mut back)).await?;
            Ok::<_, io::Error>((back == *b"ping", s))
        };
        let (ok, mut open) = echoes(TcpStream::connect(proxy.addr()).await?).await?;
        check!(ok);
        check!(proxy.connections() == 1);
        proxy.cut(true);
        check!(closed(&mut open).await);
        until(|| proxy.connections() == 0).await;
        // The kernel completes the handshake; the proxy closes the connection at once.
        let mut refused = TcpStream::connect(proxy.addr()).await?;
        check!(closed(&mut refused).await);
        proxy.cut(false);
        let (ok, _again) = echoes(TcpStream::connect(proxy.addr()).await?).await?;
        check!(ok);
        check!(proxy.connections() == 1);
        proxy.stop().await;
        Ok(())
    }

    #[tokio::test]
    async fn iggy_sdk_works_through_the_proxy() -> TestResult {
        let server = TestServer::start(TestServerConfig::default()).await?;
        let proxy = WanProxy::start(server.addr(), WanLink::symmetric(ms(20))).await?;
        let url = server
            .connection_string()
            .replace(&server.addr().to_string(), &proxy.addr().to_string());
        let client = IggyClient::from_connection_string(&url)?;
        within(client.connect()).await?;
        let (stream, topic) = (Identifier::named("wan")?, Identifier::named("t")?);
        within(client.create_stream("wan")).await?;
        let create = client.create_topic(
            &stream,
            "t",
            1,
            CompressionAlgorithm::None,
            None,
            IggyExpiry::ServerDefault,
            MaxTopicSize::ServerDefault,
        );
        within(create).await?;
        let mut messages = ["one", "two", "three"]
            .map(IggyMessage::from_str)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let partitioning = Partitioning::partition_id(0);
        within(client.send_messages(&stream, &topic, &partitioning, &mut messages)).await?;
        let (consumer, from_start) = (Consumer::default(), PollingStrategy::offset(0));
        let polled =
            client.poll_messages(&stream, &topic, Some(0), &consumer, &from_start, 10, false);
        let polled = within(polled).await?;
        let payloads: Vec<&[u8]> = polled.messages.iter().map(|m| &m.payload[..]).collect();
        check!(payloads == [&b"one"[..], b"two", b"three"]);
        check!(proxy.connections() == 1);
        within(client.disconnect()).await?;
        proxy.stop().await;
        server.shutdown().await;
        Ok(())
    }
}
