//! Conformance suite: drives every implemented command through the unmodified `iggy` 0.10.0 SDK
//! (and raw sockets for malformed frames) and asserts the server-0.8.0 semantics of
//! `iggy-protocol.md`.
//!
//! By default each test starts its own in-process `TestServer`. With
//! `IGGY_CONFORMANCE_URL=iggy://iggy:iggy@127.0.0.1:8090` (and `IGGY_CONFORMANCE_VERSION` unset
//! or `0.8`) the same tests run against that server instead; they then create and delete only their own uniquely named streams and users
//! (root stays as it was), and checks that need in-process hooks (faults, restart, retention,
//! fresh-server ids, persistence) are skipped with a printed note. The permission semantics the
//! user tests pin are those `iggy-fencing.md` relies on.

use assert2::{assert, check};
use bytes::Bytes;
use iggy::prelude::*;
use iggy_common::UserInfoDetails;
use replicator_testkit::{TestServer, TestServerConfig};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// On a shared real server every test holds this for reading while it runs (it may create
/// streams); the one that asserts stream-id reuse holds it for writing, so that no other test's
/// stream takes the id it freed (stream ids are server-wide).
static STREAM_IDS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Serialises tests that create users, so the ones that assert user-id reuse see no other test's
/// users come and go (user ids are server-wide).
static USERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server a test talks to.
struct Target {
    server: Option<TestServer>,
    url: String,
    /// Against a real server: this test's share of [`STREAM_IDS`].
    _streams: Option<tokio::sync::RwLockReadGuard<'static, ()>>,
}

impl Target {
    async fn new() -> Self {
        Self::with_config(TestServerConfig::default()).await
    }

    async fn with_config(config: TestServerConfig) -> Self {
        Self::open(config, true).await
    }

    /// The real server (taking this test's share of [`STREAM_IDS`] when `share`), or an
    /// in-process one started with `config`.
    async fn open(config: TestServerConfig, share: bool) -> Self {
        match remote_url() {
            Some(url) => Target {
                server: None,
                url,
                _streams: if share {
                    Some(STREAM_IDS.read().await)
                } else {
                    None
                },
            },
            None => Self::start_local(config).await,
        }
    }

    /// An in-process server started with `config`, whatever `IGGY_CONFORMANCE_URL` says.
    async fn start_local(config: TestServerConfig) -> Self {
        let server = TestServer::start(config).await.expect("start test server");
        let url = server.connection_string();
        Target {
            server: Some(server),
            url,
            _streams: None,
        }
    }

    /// A fresh default target and a logged-in client of it.
    async fn connected() -> (Self, IggyClient) {
        let t = Self::new().await;
        let client = t.client().await;
        (t, client)
    }

    /// [`Target::connected`] for a test that holds [`STREAM_IDS`] for writing already.
    async fn connected_alone() -> (Self, IggyClient) {
        let t = Self::open(TestServerConfig::default(), false).await;
        let client = t.client().await;
        (t, client)
    }

    fn is_remote(&self) -> bool {
        self.server.is_none()
    }

    /// The in-process server, or `None` (with a printed note) against a real server.
    fn local(&self, what: &str) -> Option<&TestServer> {
        if self.server.is_none() {
            note_skipped(what);
        }
        self.server.as_ref()
    }

    /// `host:port` of the server.
    fn address(&self) -> String {
        let rest = self.url.split("://").nth(1).unwrap_or(&self.url);
        let rest = rest.rsplit('@').next().unwrap_or(rest);
        rest.split('?').next().unwrap_or(rest).to_owned()
    }

    /// A connected, logged-in SDK client.
    async fn client(&self) -> IggyClient {
        let url = if self.url.contains('?') {
            self.url.clone()
        } else {
            format!(
                "{}?reconnection_retries=20&reconnection_interval=100ms",
                self.url
            )
        };
        let client = IggyClient::from_connection_string(&url).expect("client from url");
        client.connect().await.expect("connect and log in");
        client
    }

    /// A connected client logged in as `username` (auto-login from the connection string).
    async fn client_as(&self, username: &str, password: &str) -> IggyClient {
        let url = format!(
            "iggy://{username}:{password}@{}?reconnection_retries=20&reconnection_interval=100ms",
            self.address()
        );
        let client = IggyClient::from_connection_string(&url).expect("client from url");
        client
            .connect()
            .await
            .expect("connect and log in as a user");
        client
    }

    /// A connected client that is not logged in.
    async fn anonymous_client(&self) -> IggyClient {
        let client = IggyClient::builder()
            .with_tcp()
            .with_server_address(self.address())
            .build()
            .expect("build client");
        client.connect().await.expect("connect");
        client
    }

    async fn raw(&self) -> TcpStream {
        TcpStream::connect(self.address())
            .await
            .expect("raw connect")
    }

    async fn stop(self) {
        if let Some(server) = self.server {
            server.shutdown().await;
        }
    }
}

/// A temporary data directory for in-process servers that persist.
struct DataDir {
    /// Removed when dropped.
    dir: tempfile::TempDir,
}

impl DataDir {
    /// A fresh directory, or `None` with a note that `what` is skipped against a real server.
    fn create(what: &str) -> std::io::Result<Option<Self>> {
        if remote_url().is_some() {
            note_skipped(what);
            return Ok(None);
        }
        Ok(Some(DataDir {
            dir: tempfile::tempdir()?,
        }))
    }

    /// Starts an in-process server on the directory and connects a root client to it; after
    /// [`close`], calling it again is what a process restart does.
    async fn start(&self) -> (Target, IggyClient) {
        let t = Target::start_local(TestServerConfig {
            data_dir: Some(self.dir.path().to_owned()),
            ..TestServerConfig::default()
        })
        .await;
        let client = t.client().await;
        (t, client)
    }
}

/// `IGGY_CONFORMANCE_URL`, when set to a real server.
/// The real server to run against: `IGGY_CONFORMANCE_URL`, unless `IGGY_CONFORMANCE_VERSION`
/// names another generation than 0.8 (that server is `conformance_09`'s; this suite then runs
/// in-process).
fn remote_url() -> Option<String> {
    let version = std::env::var("IGGY_CONFORMANCE_VERSION").unwrap_or_default();
    if !(version.is_empty() || version == "0.8") {
        return None;
    }
    std::env::var("IGGY_CONFORMANCE_URL")
        .ok()
        .filter(|url| !url.is_empty())
}

/// Says that a check is skipped against a real server.
fn note_skipped(what: &str) {
    println!("note: skipping {what}: needs in-process hooks (IGGY_CONFORMANCE_URL set)");
}

/// A stream or user name no other test (or earlier run) uses; with prefixes of up to 8 bytes it
/// stays within the server's 50-byte limit on usernames.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "conf-{prefix}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn name(s: &str) -> Identifier {
    Identifier::named(s).expect("valid name")
}

fn num(n: u32) -> Identifier {
    Identifier::numeric(n).expect("valid id")
}

fn code<T: std::fmt::Debug>(r: Result<T, IggyError>) -> u32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.as_code(),
    }
}

/// A topic's message expiry and size limit.
struct Limits {
    expiry: IggyExpiry,
    max_size: MaxTopicSize,
}

/// The limits a topic gets when it names none.
const SERVER_DEFAULTS: Limits = Limits {
    expiry: IggyExpiry::ServerDefault,
    max_size: MaxTopicSize::ServerDefault,
};

/// Creates `topic` in `stream` with `partitions` partitions and the server's defaults.
async fn create_topic(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
) -> Result<TopicDetails, IggyError> {
    create_topic_with(client, stream, topic, partitions, SERVER_DEFAULTS).await
}

/// [`create_topic`] with `limits`.
async fn create_topic_with(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partitions: u32,
    limits: Limits,
) -> Result<TopicDetails, IggyError> {
    client
        .create_topic(
            &name(stream),
            topic,
            partitions,
            CompressionAlgorithm::None,
            None,
            limits.expiry,
            limits.max_size,
        )
        .await
}

/// Creates a stream with one topic `t` of `partitions` partitions; returns (stream, topic) names.
async fn stream_with_topic(
    client: &IggyClient,
    prefix: &str,
    partitions: u32,
    limits: Limits,
) -> (String, String) {
    let stream = unique(prefix);
    client.create_stream(&stream).await.expect("create stream");
    create_topic_with(client, &stream, "t", partitions, limits)
        .await
        .expect("create topic");
    (stream, "t".to_owned())
}

async fn cleanup(client: &IggyClient, stream: &str) {
    let _ = client.delete_stream(&name(stream)).await;
}

/// Logs `client` out, then stops the server (when in-process).
async fn close(t: Target, client: IggyClient) -> TestResult {
    client.shutdown().await?;
    t.stop().await;
    Ok(())
}

/// A target, a logged-in client and a stream with one topic: what most tests start from.
struct Fixture {
    t: Target,
    client: IggyClient,
    stream: String,
    topic: String,
}

impl Fixture {
    /// A fresh default target with a stream named after `prefix` holding topic `t` of
    /// `partitions` partitions.
    async fn start(prefix: &str, partitions: u32) -> Self {
        let (t, client) = Target::connected().await;
        Self::create(t, client, prefix, partitions, SERVER_DEFAULTS).await
    }

    /// [`Fixture::start`] on an in-process server started with `config`, the topic limited by
    /// `limits`. Against a real server: `None`, with a note that `what` is skipped, and nothing
    /// created there.
    async fn start_local(
        what: &str,
        config: TestServerConfig,
        prefix: &str,
        partitions: u32,
        limits: Limits,
    ) -> Option<Self> {
        let t = Target::with_config(config).await;
        t.local(what)?;
        let client = t.client().await;
        Some(Self::create(t, client, prefix, partitions, limits).await)
    }

    async fn create(
        t: Target,
        client: IggyClient,
        prefix: &str,
        partitions: u32,
        limits: Limits,
    ) -> Self {
        let (stream, topic) = stream_with_topic(&client, prefix, partitions, limits).await;
        Fixture {
            t,
            client,
            stream,
            topic,
        }
    }

    /// The in-process server of a fixture from [`Fixture::start_local`].
    fn server(&self) -> &TestServer {
        self.t.server.as_ref().expect("an in-process server")
    }

    /// Deletes the stream, logs out and stops the server.
    async fn finish(self) -> TestResult {
        cleanup(&self.client, &self.stream).await;
        close(self.t, self.client).await
    }
}

/// A server config whose segments are sealed every `segment_size` bytes.
fn segments_of(segment_size: u64) -> TestServerConfig {
    TestServerConfig {
        segment_size,
        ..TestServerConfig::default()
    }
}

fn msg(payload: &str) -> IggyMessage {
    IggyMessage::from_str(payload).expect("message")
}

/// Sends `messages` to `stream/topic`, routed by `partitioning`.
async fn send(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partitioning: Partitioning,
    mut messages: Vec<IggyMessage>,
) -> Result<(), IggyError> {
    client
        .send_messages(&name(stream), &name(topic), &partitioning, &mut messages)
        .await
}

/// Sends `messages` to `partition` of `stream/topic`.
async fn send_to(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    partition: u32,
    messages: Vec<IggyMessage>,
) -> Result<(), IggyError> {
    send(
        client,
        stream,
        topic,
        Partitioning::partition_id(partition),
        messages,
    )
    .await
}

/// `stream/topic`'s details (it must exist).
async fn topic_details(
    client: &IggyClient,
    stream: &str,
    topic: &str,
) -> Result<TopicDetails, IggyError> {
    Ok(client
        .get_topic(&name(stream), &name(topic))
        .await?
        .expect("topic"))
}

// ---------------------------------------------------------------------------------------------
// Raw protocol helpers

async fn send_frame(sock: &mut TcpStream, code: u32, payload: &[u8]) {
    let mut frame = Vec::with_capacity(8 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32 + 4).to_le_bytes());
    frame.extend_from_slice(&code.to_le_bytes());
    frame.extend_from_slice(payload);
    sock.write_all(&frame).await.expect("write frame");
}

/// Reads one response: (status, payload).
async fn read_response(sock: &mut TcpStream) -> (u32, Vec<u8>) {
    let mut head = [0u8; 8];
    tokio::time::timeout(Duration::from_secs(10), sock.read_exact(&mut head))
        .await
        .expect("response within 10 s")
        .expect("read response header");
    let status = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).await.expect("read body");
    (status, body)
}

async fn request(sock: &mut TcpStream, code: u32, payload: &[u8]) -> (u32, Vec<u8>) {
    send_frame(sock, code, payload).await;
    read_response(sock).await
}

fn login_payload(user: &str, password: &str) -> Vec<u8> {
    let mut p = vec![user.len() as u8];
    p.extend_from_slice(user.as_bytes());
    p.push(password.len() as u8);
    p.extend_from_slice(password.as_bytes());
    p.extend_from_slice(&6u32.to_le_bytes());
    p.extend_from_slice(b"0.10.0");
    p.extend_from_slice(&0u32.to_le_bytes());
    p
}

fn credentials(url: &str) -> (String, String) {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let creds = rest.split('@').next().unwrap_or("");
    let mut parts = creds.splitn(2, ':');
    (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    )
}

async fn raw_logged_in(t: &Target) -> TcpStream {
    let mut sock = t.raw().await;
    let (user, password) = credentials(&t.url);
    let (status, body) = request(&mut sock, 38, &login_payload(&user, &password)).await;
    assert!(status == 0);
    assert!(body.len() == 4);
    sock
}

// ---------------------------------------------------------------------------------------------
// Raw protocol

#[tokio::test]
async fn ping_works_before_login_and_data_commands_need_login() -> TestResult {
    let t = Target::new().await;
    let mut sock = t.raw().await;
    check!(request(&mut sock, 1, &[]).await == (0, vec![]));
    check!(request(&mut sock, 201, &[]).await == (40, vec![]));
    check!(
        request(&mut sock, 10, &[]).await == (40, vec![]),
        "GET_STATS needs login on the server"
    );
    let (user, _) = credentials(&t.url);
    check!(request(&mut sock, 38, &login_payload(&user, "definitely-wrong")).await == (42, vec![]));
    check!(request(&mut sock, 38, &login_payload("ab", "whatever")).await == (43, vec![]));
    let (user, password) = credentials(&t.url);
    let (status, body) = request(&mut sock, 38, &login_payload(&user, &password)).await;
    check!(status == 0);
    check!(body == 0u32.to_le_bytes().to_vec(), "root user id is 0");
    let (status, _) = request(&mut sock, 201, &[]).await;
    check!(status == 0);
    t.stop().await;
    Ok(())
}

#[tokio::test]
async fn malformed_frames_get_real_statuses_with_empty_bodies() -> TestResult {
    let t = Target::new().await;
    let mut sock = raw_logged_in(&t).await;
    check!(
        request(&mut sock, 9999, &[1, 2, 3]).await == (3, vec![]),
        "unknown code"
    );
    // GET_STREAM with identifier kind 9.
    check!(request(&mut sock, 200, &[9, 4, 0, 0, 0, 0]).await == (3, vec![]));
    // GET_STREAM with a numeric identifier of length 3: a validation failure.
    check!(request(&mut sock, 200, &[1, 3, 0, 0, 0]).await == (4, vec![]));
    // Truncated GET_TOPIC payload.
    check!(request(&mut sock, 300, &[1, 4, 0]).await == (3, vec![]));
    // POLL with consumer kind 7.
    let mut poll = vec![7, 1, 4, 0, 0, 0, 0];
    poll.extend_from_slice(&[1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    poll.extend_from_slice(&[0u8; 8]);
    poll.extend_from_slice(&1u32.to_le_bytes());
    poll.push(0);
    check!(request(&mut sock, 100, &poll).await == (3, vec![]));
    // A frame whose length field is < 4: answered with 3; the next frame is read normally.
    sock.write_all(&2u32.to_le_bytes()).await?;
    sock.write_all(&1u32.to_le_bytes()).await?;
    check!(read_response(&mut sock).await == (3, vec![]));
    check!(
        request(&mut sock, 1, &[]).await == (0, vec![]),
        "still in sync"
    );
    t.stop().await;
    Ok(())
}

#[tokio::test]
async fn rejected_frames_never_desynchronise_the_connection() -> TestResult {
    let t = Target::new().await;
    if t.local("oversized-frame and unauthenticated-send resync checks")
        .is_none()
    {
        // The real server answers without reading these payloads and then parses them as frames.
        return Ok(());
    }
    let mut sock = t.raw().await;
    // SEND_MESSAGES before login: 40, and its payload is consumed.
    check!(request(&mut sock, 101, &[0u8; 100]).await == (40, vec![]));
    check!(request(&mut sock, 1, &[]).await == (0, vec![]));
    // A control frame above 10 MiB: 3, and its payload is consumed.
    let big = vec![0u8; 10 * 1024 * 1024 + 1];
    check!(request(&mut sock, 201, &big).await == (3, vec![]));
    check!(request(&mut sock, 1, &[]).await == (0, vec![]));
    // A bad connection does not disturb another one.
    let mut other = raw_logged_in(&t).await;
    sock.write_all(&[1, 2, 3]).await?;
    drop(sock);
    check!(request(&mut other, 201, &[]).await.0 == 0);
    t.stop().await;
    Ok(())
}

#[tokio::test]
async fn sdk_login_errors_and_personal_access_tokens() -> TestResult {
    let t = Target::with_config(TestServerConfig {
        personal_access_token: Some("secret-token-1".to_owned()),
        ..TestServerConfig::default()
    })
    .await;
    let client = t.anonymous_client().await;
    check!(code(client.login_user("iggy", "not-the-password").await) == 42);
    check!(
        code(
            client
                .login_with_personal_access_token("no-such-token")
                .await
        ) == 20
    );
    if t.local("personal access token login").is_some() {
        let identity = client
            .login_with_personal_access_token("secret-token-1")
            .await?;
        check!(identity.user_id == 0);
        check!(client.get_streams().await.is_ok());
    }
    let (user, password) = credentials(&t.url);
    let identity = client.login_user(&user, &password).await?;
    check!(identity.user_id == 0);
    client.shutdown().await?;
    t.stop().await;
    Ok(())
}

#[tokio::test]
async fn system_commands_describe_a_single_node() -> TestResult {
    let (t, client) = Target::connected().await;
    client.ping().await?;
    let metadata = client.get_cluster_metadata().await?;
    check!(metadata.name == "single-node");
    assert!(metadata.nodes.len() == 1);
    check!(metadata.nodes[0].name == "iggy-node");
    check!(metadata.nodes[0].role == ClusterNodeRole::Leader);
    check!(metadata.nodes[0].status == ClusterNodeStatus::Healthy);
    let port: u16 = t.address().rsplit(':').next().unwrap_or("0").parse()?;
    check!(metadata.nodes[0].endpoints.tcp == port);
    let me = client.get_me().await?;
    check!(me.user_id == Some(0));
    check!(me.transport == "TCP");
    check!(me.client_id > 0);
    let (stream, _) = stream_with_topic(&client, "stats", 2, SERVER_DEFAULTS).await;
    let stats = client.get_stats().await?;
    check!(stats.streams_count >= 1);
    check!(stats.partitions_count >= 2);
    check!(stats.clients_count >= 1);
    let clients = client.get_clients().await?;
    check!(clients.iter().any(|c| c.client_id == me.client_id));
    cleanup(&client, &stream).await;
    close(t, client).await
}

// ---------------------------------------------------------------------------------------------
// Streams

#[tokio::test]
async fn streams_are_created_found_by_exact_name_updated_and_deleted() -> TestResult {
    let (t, client) = Target::connected().await;
    let s = unique("streams");
    let created = client.create_stream(&s).await?;
    check!(created.name == s);
    check!(created.topics_count == 0);
    check!(created.messages_count == 0);
    let found = client.get_stream(&name(&s)).await?.expect("stream by name");
    check!(found.id == created.id);
    let by_id = client
        .get_stream(&num(created.id))
        .await?
        .expect("stream by id");
    check!(by_id.name == s);
    check!(
        client.get_stream(&name(&s.to_uppercase())).await?.is_none(),
        "names are exact"
    );
    check!(client
        .get_stream(&name(&unique("missing")))
        .await?
        .is_none());
    check!(client
        .get_topics(&name(&unique("missing")))
        .await?
        .is_empty());
    check!(code(client.create_stream(&s).await) == 1012);

    let renamed = unique("renamed");
    client.update_stream(&name(&s), &renamed).await?;
    check!(client.get_stream(&name(&s)).await?.is_none());
    let streams = client.get_streams().await?;
    check!(streams
        .iter()
        .any(|x| x.name == renamed && x.id == created.id));
    check!(
        streams.windows(2).all(|w| w[0].id < w[1].id),
        "sorted by id"
    );
    check!(code(client.delete_stream(&name(&s)).await) == 1009);
    client.delete_stream(&name(&renamed)).await?;
    let after = client.get_stream(&num(created.id)).await?;
    if t.is_remote() {
        // The tests share a real server, which reuses freed ids: a stream another test creates
        // meanwhile may hold this id already.
        check!(after.is_none_or(|s| s.name != renamed));
    } else {
        check!(after.is_none());
    }
    close(t, client).await
}

#[tokio::test]
async fn stream_ids_start_at_zero_and_freed_ids_are_reused() -> TestResult {
    let _ids = STREAM_IDS.write().await;
    let (t, client) = Target::connected_alone().await;
    let a = client.create_stream(&unique("ids-a")).await?;
    if !t.is_remote() {
        check!(a.id == 0, "fresh server starts at 0");
    }
    let b = client.create_stream(&unique("ids-b")).await?;
    if !t.is_remote() {
        check!(b.id == a.id + 1, "no freed slot: the next id is the end");
    }
    client.delete_stream(&num(a.id)).await?;
    let c = client.create_stream(&unique("ids-c")).await?;
    check!(c.id == a.id, "the freed slot is reused");
    for id in [b.id, c.id] {
        client.delete_stream(&num(id)).await?;
    }
    close(t, client).await
}

// ---------------------------------------------------------------------------------------------
// Topics and partitions

#[tokio::test]
async fn topics_resolve_defaults_and_report_partitions() -> TestResult {
    let (t, client) = Target::connected().await;
    let s = unique("topics");
    client.create_stream(&s).await?;
    let topic = create_topic(&client, &s, "orders", 3).await?;
    check!(topic.id == 0, "topic ids are 0-based per stream");
    check!(topic.name == "orders");
    check!(topic.partitions_count == 3);
    check!(topic.partitions.iter().map(|p| p.id).collect::<Vec<_>>() == vec![0, 1, 2]);
    check!(topic.message_expiry == IggyExpiry::NeverExpire);
    check!(topic.max_topic_size == MaxTopicSize::Unlimited);
    check!(topic.replication_factor == 1);

    let second = client
        .create_topic(
            &name(&s),
            "empty",
            0,
            CompressionAlgorithm::Gzip,
            Some(3),
            IggyExpiry::ExpireDuration(IggyDuration::from(Duration::from_secs(3600))),
            MaxTopicSize::Unlimited,
        )
        .await?;
    check!(second.id == 1);
    check!(second.partitions.is_empty());
    check!(second.replication_factor == 3);
    check!(second.compression_algorithm == CompressionAlgorithm::Gzip);
    check!(
        second.message_expiry
            == IggyExpiry::ExpireDuration(IggyDuration::from(Duration::from_secs(3600)))
    );

    let below_segment = Limits {
        max_size: MaxTopicSize::Custom(IggyByteSize::from(1_000_000u64)),
        ..SERVER_DEFAULTS
    };
    let small = create_topic_with(&client, &s, "small", 1, below_segment).await;
    check!(code(small) == 1019, "below the 1 GiB segment size");
    check!(code(create_topic(&client, &s, "orders", 1).await) == 2013);
    check!(code(create_topic(&client, &s, "many", 1001).await) == 2015);
    check!(code(create_topic(&client, &unique("missing"), "x", 1).await) == 1009);

    let topics = client.get_topics(&name(&s)).await?;
    check!(topics.iter().map(|t| t.id).collect::<Vec<_>>() == vec![0, 1]);
    let details = client.get_stream(&name(&s)).await?.expect("stream");
    check!(details.topics_count == 2);
    check!(details.topics.len() == 2);
    check!(client.get_topic(&name(&s), &name("nope")).await?.is_none());
    check!(client
        .get_topic(&name(&unique("nope")), &name("orders"))
        .await?
        .is_none());

    client.delete_topic(&name(&s), &name("orders")).await?;
    let reused = create_topic(&client, &s, "again", 1).await?;
    check!(reused.id == 0, "topic id slot reused");
    check!(code(client.delete_topic(&name(&s), &name("orders")).await) == 2010);

    client
        .update_topic(
            &name(&s),
            &name("again"),
            "renamed",
            CompressionAlgorithm::Gzip,
            Some(2),
            IggyExpiry::NeverExpire,
            MaxTopicSize::Unlimited,
        )
        .await?;
    let updated = client.get_topic(&name(&s), &num(0)).await?.expect("topic");
    check!(updated.name == "renamed");
    check!(updated.replication_factor == 2);
    check!(updated.compression_algorithm == CompressionAlgorithm::Gzip);
    let clash = client
        .update_topic(
            &name(&s),
            &name("renamed"),
            "empty",
            CompressionAlgorithm::None,
            None,
            IggyExpiry::NeverExpire,
            MaxTopicSize::Unlimited,
        )
        .await;
    check!(code(clash) == 2013);

    cleanup(&client, &s).await;
    close(t, client).await
}

/// What the replicator's settings sync relies on: UPDATE_TOPIC changes expiry, size limit and
/// compression, and both GET_TOPIC and GET_STREAM's topic list report the new values.
#[tokio::test]
async fn topic_settings_updates_show_in_topic_and_stream_listings() -> TestResult {
    let f = Fixture::start("settings", 1).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    let expiry = IggyExpiry::ExpireDuration(IggyDuration::from(7_200_000_000));
    client
        .update_topic(
            &name(s),
            &name(topic),
            topic,
            CompressionAlgorithm::Gzip,
            None,
            expiry,
            MaxTopicSize::from(50_000_000),
        )
        .await?;
    let details = topic_details(client, s, topic).await?;
    check!(u64::from(details.message_expiry) == 7_200_000_000);
    check!(u64::from(details.max_topic_size) == 50_000_000);
    check!(details.compression_algorithm == CompressionAlgorithm::Gzip);
    let listed = client.get_stream(&name(s)).await?.expect("stream");
    let t = listed
        .topics
        .iter()
        .find(|t| &t.name == topic)
        .expect("topic");
    check!(u64::from(t.message_expiry) == 7_200_000_000);
    check!(u64::from(t.max_topic_size) == 50_000_000);
    check!(t.compression_algorithm == CompressionAlgorithm::Gzip);
    f.finish().await
}

#[tokio::test]
async fn partitions_are_added_after_the_last_and_removed_from_the_end() -> TestResult {
    let f = Fixture::start("parts", 2).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    client.create_partitions(&name(s), &name(topic), 1).await?;
    let details = topic_details(client, s, topic).await?;
    check!(details.partitions.iter().map(|p| p.id).collect::<Vec<_>>() == vec![0, 1, 2]);
    check!(details.partitions.iter().all(|p| p.segments_count == 1));
    check!(code(client.create_partitions(&name(s), &name(topic), 0).await) == 2015);
    check!(code(client.create_partitions(&name(s), &name("nope"), 1).await) == 2010);
    check!(code(client.delete_partitions(&name(s), &name(topic), 4).await) == 2019);
    client.delete_partitions(&name(s), &name(topic), 2).await?;
    let details = topic_details(client, s, topic).await?;
    check!(details.partitions.iter().map(|p| p.id).collect::<Vec<_>>() == vec![0]);
    check!(details.partitions_count == 1);
    f.finish().await
}

// ---------------------------------------------------------------------------------------------
// Messages

fn headers() -> BTreeMap<HeaderKey, HeaderValue> {
    let mut h = BTreeMap::new();
    h.insert(
        HeaderKey::from_str("trace").expect("key"),
        HeaderValue::from_str("abc-123").expect("value"),
    );
    h.insert(
        HeaderKey::from_str("n").expect("key"),
        HeaderValue::from(42u64),
    );
    h
}

#[tokio::test]
async fn sent_messages_get_offsets_one_timestamp_ids_and_checksums() -> TestResult {
    let f = Fixture::start("send", 2).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    let mut batch = Vec::new();
    for (i, id) in [1u128, 2, 3, 0].into_iter().enumerate() {
        let mut m = IggyMessage::builder()
            .id(id)
            .payload(Bytes::from(format!("payload-{i}")))
            .user_headers(headers())
            .build()?;
        m.header.origin_timestamp = 1_000 + i as u64;
        batch.push(m);
    }
    let sent_headers: Vec<Option<Bytes>> = batch.iter().map(|m| m.user_headers.clone()).collect();
    send_to(client, s, topic, 0, batch).await?;
    let polled = poll(client, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(polled.partition_id == 0);
    check!(polled.current_offset == 3);
    assert!(polled.messages.len() == 4);
    check!(polled.count == 4);
    let ts = polled.messages[0].header.timestamp;
    check!(ts > 0);
    for (i, m) in polled.messages.iter().enumerate() {
        check!(m.header.offset == i as u64);
        check!(m.header.timestamp == ts, "one server timestamp per batch");
        check!(m.header.origin_timestamp == 1_000 + i as u64);
        check!(m.payload == Bytes::from(format!("payload-{i}")));
        check!(
            m.user_headers == sent_headers[i],
            "user headers round-trip byte for byte"
        );
        check!(m.user_headers_map()? == Some(headers()));
        check!(m.header.reserved == 0);
        let bytes = m.to_bytes();
        check!(
            m.header.checksum == twox_hash::XxHash3_64::oneshot(&bytes[8..]),
            "XXH3-64 over bytes 8..end"
        );
    }
    check!(
        polled.messages[..3]
            .iter()
            .map(|m| m.header.id)
            .collect::<Vec<_>>()
            == vec![1, 2, 3]
    );
    check!(
        polled.messages[3].header.id != 0,
        "id 0 replaced by a random id"
    );

    let details = topic_details(client, s, topic).await?;
    let expected_size: u64 = polled
        .messages
        .iter()
        .map(|m| {
            64 + m.payload.len() as u64 + m.user_headers.as_ref().map_or(0, |h| h.len() as u64)
        })
        .sum();
    check!(details.partitions[0].current_offset == 3);
    check!(details.partitions[0].messages_count == 4);
    check!(details.partitions[0].size.as_bytes_u64() == expected_size);
    check!(details.partitions[1].messages_count == 0);
    check!(details.partitions[1].current_offset == 0);
    check!(details.messages_count == 4);
    check!(details.size.as_bytes_u64() == expected_size);
    let stream = client.get_stream(&name(s)).await?.expect("stream");
    check!(stream.messages_count == 4);
    check!(stream.size.as_bytes_u64() == expected_size);
    // Each topic of the stream answer carries its own totals (idle readers' watchers compare
    // them from one listing to the next).
    let listed = stream.topics.iter().find(|t| t.name == *topic);
    let listed = listed.expect("the topic in its stream");
    check!(listed.id == details.id);
    check!(listed.messages_count == 4);
    check!(listed.size.as_bytes_u64() == expected_size);
    check!(listed.partitions_count == details.partitions_count);
    check!(listed.created_at == details.created_at);

    send_to(client, s, topic, 0, vec![msg("e")]).await?;
    let next = poll(client, s, topic, Some(0), PollingStrategy::offset(4), 10).await?;
    check!(offsets(&next) == vec![4]);
    check!(next.messages[0].header.timestamp >= ts);
    // A message that a poll returns is already in the stream listing's totals of its topic.
    let stream = client.get_stream(&name(s)).await?.expect("stream");
    let listed = stream.topics.iter().find(|t| t.name == *topic);
    let listed = listed.expect("the topic in its stream");
    check!(listed.messages_count == 5);
    check!(listed.size.as_bytes_u64() > expected_size);
    f.finish().await
}

/// Polls `s/t` as the default consumer, without storing its offset.
async fn poll(
    client: &IggyClient,
    s: &str,
    t: &str,
    partition: Option<u32>,
    strategy: PollingStrategy,
    count: u32,
) -> Result<PolledMessages, IggyError> {
    poll_as(
        client,
        s,
        t,
        partition,
        &Consumer::default(),
        strategy,
        count,
        false,
    )
    .await
}

/// Polls `s/t` as `consumer`; the server stores the last returned offset when `auto_commit`.
#[expect(
    clippy::too_many_arguments,
    reason = "the SDK's poll_messages with names for identifiers"
)]
async fn poll_as(
    client: &IggyClient,
    s: &str,
    t: &str,
    partition: Option<u32>,
    consumer: &Consumer,
    strategy: PollingStrategy,
    count: u32,
    auto_commit: bool,
) -> Result<PolledMessages, IggyError> {
    client
        .poll_messages(
            &name(s),
            &name(t),
            partition,
            consumer,
            &strategy,
            count,
            auto_commit,
        )
        .await
}

fn offsets(p: &PolledMessages) -> Vec<u64> {
    p.messages.iter().map(|m| m.header.offset).collect()
}

fn payloads(p: &PolledMessages) -> Vec<Bytes> {
    p.messages.iter().map(|m| m.payload.clone()).collect()
}

#[tokio::test]
async fn polling_strategies_and_edges_follow_the_server() -> TestResult {
    let f = Fixture::start("poll", 2).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    send_to(client, s, topic, 0, vec![msg("a"), msg("b")]).await?;
    let after_first = poll(client, s, topic, Some(0), PollingStrategy::offset(0), 1).await?;
    let ts_first = after_first.messages[0].header.timestamp;
    tokio::time::sleep(Duration::from_millis(5)).await;
    send_to(client, s, topic, 0, vec![msg("c"), msg("d")]).await?;

    let beyond = poll(client, s, topic, Some(0), PollingStrategy::offset(100), 10).await?;
    check!(beyond.messages.is_empty());
    check!(beyond.current_offset == 3);
    check!(beyond.partition_id == 0);
    let at_end = poll(client, s, topic, Some(0), PollingStrategy::offset(4), 10).await?;
    check!(at_end.messages.is_empty());
    let empty = poll(client, s, topic, Some(1), PollingStrategy::offset(0), 10).await?;
    check!(empty.partition_id == 1);
    check!(empty.current_offset == 0);
    check!(empty.messages.is_empty());
    let default_partition = poll(client, s, topic, None, PollingStrategy::offset(0), 10).await?;
    check!(
        default_partition.partition_id == 0,
        "plain consumer without partition reads 0"
    );
    check!(offsets(&default_partition) == vec![0, 1, 2, 3]);
    check!(
        offsets(&poll(client, s, topic, Some(0), PollingStrategy::last(), 2).await?) == vec![2, 3]
    );
    check!(
        offsets(&poll(client, s, topic, Some(0), PollingStrategy::last(), 9).await?)
            == vec![0, 1, 2, 3]
    );
    check!(
        offsets(&poll(client, s, topic, Some(0), PollingStrategy::first(), 1).await?) == vec![0]
    );
    check!(
        offsets(&poll(client, s, topic, Some(0), PollingStrategy::offset(1), 2).await?)
            == vec![1, 2]
    );
    let after = |ts: u64| PollingStrategy::timestamp(IggyTimestamp::from(ts));
    let by_ts = poll(client, s, topic, Some(0), after(ts_first + 1), 10).await?;
    check!(offsets(&by_ts) == vec![2, 3]);
    let by_ts_all = poll(client, s, topic, Some(0), after(ts_first), 10).await?;
    check!(offsets(&by_ts_all) == vec![0, 1, 2, 3]);

    check!(code(poll(client, s, topic, Some(9), PollingStrategy::offset(0), 1).await) == 3007);
    let lost = send_to(client, s, topic, 9, vec![msg("x")]).await;
    check!(code(lost) == 3007);
    let missing = unique("nope");
    let from_missing = poll(
        client,
        &missing,
        topic,
        Some(0),
        PollingStrategy::offset(0),
        1,
    )
    .await;
    check!(code(from_missing) == 1009);
    let by_number = client
        .poll_messages(
            &num(999_999),
            &name(topic),
            Some(0),
            &Consumer::default(),
            &PollingStrategy::offset(0),
            1,
            false,
        )
        .await;
    check!(code(by_number) == 1009);
    check!(code(poll(client, s, "nope", Some(0), PollingStrategy::offset(0), 1).await) == 2010);
    let to_missing = send(
        client,
        &missing,
        topic,
        Partitioning::balanced(),
        vec![msg("x")],
    )
    .await;
    check!(code(to_missing) == 1009);
    f.finish().await
}

#[tokio::test]
async fn balanced_and_keyed_partitioning_pick_partitions_like_the_server() -> TestResult {
    let f = Fixture::start("route", 3).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    for i in 0..4 {
        let one = vec![msg(&format!("b{i}"))];
        send(client, s, topic, Partitioning::balanced(), one).await?;
    }
    let details = topic_details(client, s, topic).await?;
    check!(
        details
            .partitions
            .iter()
            .map(|p| p.messages_count)
            .collect::<Vec<_>>()
            == vec![2, 1, 1]
    );
    let key = b"customer-42";
    let expected = twox_hash::XxHash32::oneshot(0, key) % 3;
    let keyed = vec![msg("k1"), msg("k2")];
    send(client, s, topic, Partitioning::messages_key(key)?, keyed).await?;
    let p = poll(client, s, topic, Some(expected), PollingStrategy::last(), 2).await?;
    check!(payloads(&p) == vec![Bytes::from("k1"), Bytes::from("k2")]);
    f.finish().await
}

// ---------------------------------------------------------------------------------------------
// Consumer offsets

#[tokio::test]
async fn consumer_offsets_follow_the_4100_rules() -> TestResult {
    let f = Fixture::start("offsets", 2).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    let consumer = Consumer::new(name("replicator"));
    let (st, tp) = (name(s), name(topic));
    // `consumer`'s offset in a partition: read it, store it.
    let stored = |partition| client.get_consumer_offset(&consumer, &st, &tp, Some(partition));
    let store = |partition, offset| {
        client.store_consumer_offset(&consumer, &st, &tp, Some(partition), offset)
    };
    check!(stored(0).await?.is_none());
    check!(code(store(0, 0).await) == 4100, "never written");
    let batch = vec![msg("a"), msg("b"), msg("c"), msg("d")];
    send_to(client, s, topic, 0, batch).await?;
    store(0, 1).await?;
    let info = stored(0).await?.expect("stored");
    check!(info.partition_id == 0);
    check!(info.current_offset == 3);
    check!(info.stored_offset == 1);
    check!(code(store(0, 999).await) == 4100);
    check!(code(store(1, 0).await) == 4100, "empty partition");
    check!(code(store(9, 0).await) == 3007);
    check!(stored(9).await?.is_none());
    check!(client
        .get_consumer_offset(&consumer, &name(&unique("x")), &tp, Some(0))
        .await?
        .is_none());
    check!(client
        .get_consumer_offset(&Consumer::new(name("other")), &st, &tp, Some(0))
        .await?
        .is_none());

    let next_of = |consumer, count, auto_commit| {
        poll_as(
            client,
            s,
            topic,
            Some(0),
            consumer,
            PollingStrategy::next(),
            count,
            auto_commit,
        )
    };
    let next = next_of(&consumer, 10, true).await?;
    check!(offsets(&next) == vec![2, 3]);
    let info = stored(0).await?.expect("stored");
    check!(
        info.stored_offset == 3,
        "auto_commit stores the last returned offset"
    );
    let caught_up = next_of(&consumer, 10, true).await?;
    check!(caught_up.messages.is_empty());

    let fresh = Consumer::new(num(7));
    let from_start = next_of(&fresh, 2, false).await?;
    check!(offsets(&from_start) == vec![0, 1]);
    check!(
        client
            .get_consumer_offset(&fresh, &st, &tp, Some(0))
            .await?
            .is_none(),
        "no auto commit"
    );

    let delete = || client.delete_consumer_offset(&consumer, &st, &tp, Some(0));
    delete().await?;
    check!(stored(0).await?.is_none());
    check!(code(delete().await) == 3021);
    f.finish().await
}

// ---------------------------------------------------------------------------------------------
// Purge

#[tokio::test]
async fn purge_empties_partitions_and_restarts_offsets() -> TestResult {
    let f = Fixture::start("purge", 1).await;
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    let (st, tp) = (name(s), name(topic));
    send_to(client, s, topic, 0, vec![msg("a"), msg("b")]).await?;
    let consumer = Consumer::new(name("c"));
    client
        .store_consumer_offset(&consumer, &st, &tp, Some(0), 1)
        .await?;
    client.purge_topic(&st, &tp).await?;
    let details = topic_details(client, s, topic).await?;
    check!(details.partitions[0].messages_count == 0);
    check!(details.partitions[0].current_offset == 0);
    check!(details.messages_count == 0);
    check!(client
        .get_consumer_offset(&consumer, &st, &tp, Some(0))
        .await?
        .is_none());
    send_to(client, s, topic, 0, vec![msg("c")]).await?;
    if f.t.is_remote() {
        // Known server-0.8.0 defect: purge drops persisted segments and resets the offset, but
        // messages still in the in-memory journal (< 1024 messages / 1 MiB unsaved) survive;
        // they stay pollable at their old offsets and shadow new messages written there.
        println!("note: skipping post-purge poll check: server 0.8.0 keeps unsaved messages");
    } else {
        let polled = poll(client, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
        check!(offsets(&polled) == vec![0]);
        check!(polled.messages[0].payload == Bytes::from("c"));
    }
    client.purge_stream(&st).await?;
    check!(
        client
            .get_stream(&st)
            .await?
            .expect("stream")
            .messages_count
            == 0
    );
    f.finish().await
}

// ---------------------------------------------------------------------------------------------
// Consumer groups

#[tokio::test]
async fn consumer_groups_assign_partitions_to_members() -> TestResult {
    let f = Fixture::start("groups", 4).await;
    let (a, s, topic) = (&f.client, &f.stream, &f.topic);
    let b = f.t.client().await;
    let (st, tp) = (name(s), name(topic));
    let group = a.create_consumer_group(&st, &tp, "workers").await?;
    check!(group.id == 0);
    check!(group.partitions_count == 4);
    check!(group.members_count == 0);
    check!(code(a.create_consumer_group(&st, &tp, "workers").await) == 5004);
    check!(a
        .get_consumer_group(&st, &tp, &name("nope"))
        .await?
        .is_none());
    check!(a.get_consumer_groups(&st, &tp).await?.len() == 1);
    let gid = name("workers");
    let consumer = Consumer::group(gid.clone());
    let next_as_member = |member, count, auto_commit| {
        poll_as(
            member,
            s,
            topic,
            None,
            &consumer,
            PollingStrategy::next(),
            count,
            auto_commit,
        )
    };
    check!(code(next_as_member(a, 1, false).await) == 5006);
    check!(code(a.leave_consumer_group(&st, &tp, &gid).await) == 5006);
    check!(code(a.join_consumer_group(&st, &tp, &name("nope")).await) == 5000);

    a.join_consumer_group(&st, &tp, &gid).await?;
    let details = a.get_consumer_group(&st, &tp, &gid).await?.expect("group");
    check!(details.members_count == 1);
    check!(details.members[0].partitions == vec![0, 1, 2, 3]);
    b.join_consumer_group(&st, &tp, &gid).await?;
    let details = a.get_consumer_group(&st, &tp, &gid).await?.expect("group");
    check!(details.members_count == 2);
    let mut assigned: Vec<u32> = details
        .members
        .iter()
        .flat_map(|m| m.partitions.clone())
        .collect();
    assigned.sort_unstable();
    check!(
        assigned == vec![0, 1, 2, 3],
        "every partition has exactly one owner"
    );
    check!(
        details.members[1].partitions == vec![3],
        "the newcomer takes the last partition"
    );

    for p in 0..4 {
        let one = vec![msg(&format!("p{p}"))];
        send_to(a, s, topic, p, one).await?;
    }
    let polled = next_as_member(&b, 10, true).await?;
    check!(polled.partition_id == 3);
    check!(payloads(&polled) == vec![Bytes::from("p3")]);
    let stored = a
        .get_consumer_offset(&consumer, &st, &tp, Some(3))
        .await?
        .expect("group offset");
    check!(stored.stored_offset == 0);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_as_member(a, 10, false).await?.partition_id);
    }
    check!(
        seen == vec![0, 1, 2],
        "a member cycles through its partitions"
    );

    b.leave_consumer_group(&st, &tp, &gid).await?;
    let details = a.get_consumer_group(&st, &tp, &gid).await?.expect("group");
    check!(details.members_count == 1);
    check!(details.members[0].partitions == vec![0, 1, 2, 3]);
    let me = a.get_me().await?;
    check!(me.consumer_groups_count == 1);
    a.delete_consumer_group(&st, &tp, &gid).await?;
    check!(a.get_consumer_group(&st, &tp, &gid).await?.is_none());
    check!(code(a.delete_consumer_group(&st, &tp, &gid).await) == 5000);
    b.shutdown().await?;
    f.finish().await
}

/// Stores `offset` for `group` on partition `p` as `client`.
async fn store_group(
    client: &IggyClient,
    (s, t): (&str, &str),
    group: &str,
    p: u32,
    offset: u64,
) -> Result<(), IggyError> {
    let consumer = Consumer::group(name(group));
    client
        .store_consumer_offset(&consumer, &name(s), &name(t), Some(p), offset)
        .await
}

/// What a replicator needs to know to carry a group's position to another cluster: a group's
/// offset is stored only by a member the partition is assigned to (5006 for a non-member, 3022
/// for a member without the partition), read by anyone, kept when its members leave, and where
/// a new member resumes.
#[tokio::test]
async fn group_offsets_are_stored_only_by_a_member_assigned_the_partition() -> TestResult {
    let f = Fixture::start("gstore", 2).await;
    let (a, s, topic) = (&f.client, &f.stream, &f.topic);
    let (b, reader) = (f.t.client().await, f.t.client().await);
    let (st, tp, gid) = (name(s), name(topic), name("g"));
    for p in 0..2 {
        send_to(a, s, topic, p, vec![msg("first"), msg("second")]).await?;
    }
    a.create_consumer_group(&st, &tp, "g").await?;
    let consumer = Consumer::group(gid.clone());
    check!(
        code(store_group(a, (s, topic), "g", 0, 0).await) == 5006,
        "not a member"
    );

    a.join_consumer_group(&st, &tp, &gid).await?;
    store_group(a, (s, topic), "g", 0, 0).await?;
    store_group(a, (s, topic), "g", 1, 1).await?;
    b.join_consumer_group(&st, &tp, &gid).await?;
    let details = a.get_consumer_group(&st, &tp, &gid).await?.expect("group");
    check!(details.members_count == 2);
    let mine = |client_partitions: &[u32], p: u32| client_partitions.contains(&p);
    let b_id = b.get_me().await?.client_id;
    let b_partitions = details
        .members
        .iter()
        .find(|m| m.id == b_id)
        .map(|m| m.partitions.clone())
        .unwrap_or_default();
    let foreign = (0..2)
        .find(|p| !mine(&b_partitions, *p))
        .expect("b lacks one");
    check!(
        code(store_group(&b, (s, topic), "g", foreign, 0).await) == 3022,
        "a member without the partition"
    );

    // Reading needs no membership.
    let read = |p: u32| {
        let (st, tp, consumer, reader) = (st.clone(), tp.clone(), consumer.clone(), &reader);
        async move {
            reader
                .get_consumer_offset(&consumer, &st, &tp, Some(p))
                .await
                .map(|o| o.map(|o| o.stored_offset))
        }
    };
    check!(read(0).await? == Some(0));
    check!(read(1).await? == Some(1));

    // Offsets outlive the members, and a new member resumes after them.
    a.leave_consumer_group(&st, &tp, &gid).await?;
    b.leave_consumer_group(&st, &tp, &gid).await?;
    check!(read(0).await? == Some(0));
    reader.join_consumer_group(&st, &tp, &gid).await?;
    let polled = poll_as(
        &reader,
        s,
        topic,
        Some(0),
        &consumer,
        PollingStrategy::next(),
        10,
        false,
    )
    .await?;
    check!(offsets(&polled) == vec![1]);
    reader.leave_consumer_group(&st, &tp, &gid).await?;
    b.shutdown().await?;
    reader.shutdown().await?;
    f.finish().await
}

// ---------------------------------------------------------------------------------------------
// Users and permissions

/// The password of every user the tests create.
const PASSWORD: &str = "secret-pw-1";

/// Permissions with only the global rights `grant` sets.
fn global(grant: impl FnOnce(&mut GlobalPermissions)) -> Permissions {
    let mut p = Permissions::default();
    grant(&mut p.global);
    p
}

/// What a replicator's writer needs: global send and poll, nothing else.
fn writer_rights() -> Permissions {
    global(|g| {
        g.send_messages = true;
        g.poll_messages = true;
    })
}

/// Rights on one topic only, set by `grant`.
fn on_topic(
    stream_id: u32,
    topic_id: u32,
    grant: impl FnOnce(&mut TopicPermissions),
) -> Permissions {
    let mut topic = TopicPermissions::default();
    grant(&mut topic);
    let stream = StreamPermissions {
        topics: Some([(topic_id as usize, topic)].into_iter().collect()),
        ..StreamPermissions::default()
    };
    Permissions {
        global: GlobalPermissions::default(),
        streams: Some([(stream_id as usize, stream)].into_iter().collect()),
    }
}

/// Creates an active user with [`PASSWORD`] and `permissions`.
async fn create_user(
    client: &IggyClient,
    username: &str,
    permissions: Option<Permissions>,
) -> Result<UserInfoDetails, IggyError> {
    client
        .create_user(username, PASSWORD, UserStatus::Active, permissions)
        .await
}

/// Creates a user named after `prefix` with `permissions` through `root`, and a client logged
/// in as it.
async fn user_session(
    t: &Target,
    root: &IggyClient,
    prefix: &str,
    permissions: Option<Permissions>,
) -> Result<(UserInfoDetails, IggyClient), IggyError> {
    let user = create_user(root, &unique(prefix), permissions).await?;
    let client = t.client_as(&user.username, PASSWORD).await;
    Ok((user, client))
}

/// Deletes the users a test created (best effort: a shared real server must not keep them).
async fn delete_users(client: &IggyClient, ids: &[u32]) {
    for id in ids {
        let _ = client.delete_user(&num(*id)).await;
    }
}

/// Waits until GET_CLIENTS shows (or no longer shows) a session of `user_id`.
async fn wait_for_session(root: &IggyClient, user_id: u32, present: bool) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let clients = root.get_clients().await?;
        if clients.iter().any(|c| c.user_id == Some(user_id)) == present {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session of user {user_id} never {}",
            if present { "appeared" } else { "went away" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn users_are_created_found_updated_and_deleted() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let name_a = unique("crud");
    let rights = global(|g| {
        g.read_users = true;
        g.poll_messages = true;
    });
    let a = create_user(&root, &name_a, Some(rights.clone())).await?;
    check!(a.username == name_a);
    check!(a.status == UserStatus::Active);
    check!(a.permissions == Some(rights.clone()));
    let by_name = root.get_user(&name(&name_a)).await?.expect("user by name");
    check!(by_name.id == a.id);
    check!(by_name.permissions == Some(rights.clone()));
    check!(by_name.created_at == a.created_at);
    let by_id = root.get_user(&num(a.id)).await?.expect("user by id");
    check!(by_id.username == name_a);
    check!(root
        .get_users()
        .await?
        .iter()
        .any(|u| u.id == a.id && u.username == name_a));
    check!(
        code(create_user(&root, &name_a, None).await) == 46,
        "duplicate"
    );
    check!(code(create_user(&root, "ab", None).await) == 43);
    let short = root
        .create_user(&unique("pw"), "pw", UserStatus::Active, None)
        .await;
    check!(code(short) == 44);

    let name_b = unique("crud");
    let b = create_user(&root, &name_b, None).await?;
    check!(b.permissions.is_none());
    check!(
        root.get_user(&num(b.id)).await?.expect("b").permissions == None,
        "no permissions round-trip as none"
    );
    let renamed = unique("renamed");
    root.update_user(&num(a.id), Some(&renamed), Some(UserStatus::Inactive))
        .await?;
    let updated = root.get_user(&num(a.id)).await?.expect("renamed user");
    check!(updated.username == renamed);
    check!(updated.status == UserStatus::Inactive);
    check!(root.get_user(&name(&name_a)).await?.is_none());
    check!(code(root.update_user(&num(b.id), Some(&renamed), None).await) == 46);
    root.update_user(&num(b.id), Some(&name_b), None).await?;
    // By name as well: a fence's revoke names the writer user it takes the rights from.
    root.update_permissions(&name(&name_b), Some(rights.clone()))
        .await?;
    root.update_user(&name(&name_b), None, Some(UserStatus::Inactive))
        .await?;
    let b_now = root.get_user(&num(b.id)).await?.expect("b by id");
    check!(b_now.permissions == Some(rights.clone()));
    check!(b_now.status == UserStatus::Inactive);
    let nobody = unique("nobody");
    check!(code(root.update_permissions(&name(&nobody), None).await) == 20);
    check!(
        code(
            root.update_user(&name(&nobody), None, Some(UserStatus::Inactive))
                .await
        ) == 20
    );
    root.update_permissions(&num(a.id), None).await?;
    check!(root
        .get_user(&num(a.id))
        .await?
        .expect("user")
        .permissions
        .is_none());

    root.delete_user(&num(a.id)).await?;
    check!(root.get_user(&num(a.id)).await?.is_none());
    check!(code(root.delete_user(&num(a.id)).await) == 20);
    check!(code(root.update_user(&num(a.id), None, None).await) == 20);
    check!(code(root.update_permissions(&num(a.id), None).await) == 20);
    check!(
        code(
            root.change_password(&num(a.id), PASSWORD, "another-pw")
                .await
        ) == 20
    );
    check!(root.get_user(&name(&unique("none"))).await?.is_none());
    delete_users(&root, &[b.id]).await;

    let root_user = root.get_user(&num(0)).await?.expect("root user");
    let (root_name, _) = credentials(&t.url);
    check!(root_user.username == root_name);
    let all = root_user.permissions.expect("root permissions").global;
    check!(all.manage_users && all.manage_streams && all.send_messages && all.read_servers);
    check!(
        code(root.delete_user(&num(0)).await) == 48,
        "root cannot be deleted"
    );
    check!(
        code(root.update_permissions(&num(0), None).await) == 49,
        "root's permissions cannot be changed"
    );
    root.update_user(&num(0), None, Some(UserStatus::Active))
        .await?;
    close(t, root).await
}

#[tokio::test]
async fn user_ids_come_from_a_slab_and_freed_ids_are_reused() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let a = create_user(&root, &unique("ids"), None).await?;
    let b = create_user(&root, &unique("ids"), None).await?;
    if !t.is_remote() {
        check!((a.id, b.id) == (1, 2), "root is 0, users follow");
    }
    root.delete_user(&num(a.id)).await?;
    let c = create_user(&root, &unique("ids"), None).await?;
    check!(c.id == a.id, "the freed id is reused");
    let d = create_user(&root, &unique("ids"), None).await?;
    if !t.is_remote() {
        check!(d.id == 3, "no freed id left: the next id is the end");
    }
    delete_users(&root, &[b.id, c.id, d.id]).await;
    close(t, root).await
}

#[tokio::test]
async fn non_root_users_log_in_and_their_sessions_are_listed() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let (user, client) = user_session(&t, &root, "login", None).await?;
    let me = client.get_me().await?;
    check!(me.user_id == Some(user.id));
    wait_for_session(&root, user.id, true).await?;
    check!(root
        .get_clients()
        .await?
        .iter()
        .any(|c| c.client_id == me.client_id && c.user_id == Some(user.id)));
    // A user without rights may read itself and the cluster, nothing else.
    let own = client.get_user(&num(user.id)).await?.expect("own record");
    check!(own.username == user.username);
    check!(code(client.get_user(&num(0)).await) == 41);
    check!(code(client.get_users().await) == 41);
    check!(code(client.get_streams().await) == 41);
    check!(code(client.get_stats().await) == 41);
    check!(code(client.get_clients().await) == 41);
    check!(code(client.create_stream(&unique("denied")).await) == 41);
    check!(client.get_cluster_metadata().await.is_ok());
    client.ping().await?;
    client.shutdown().await?;
    wait_for_session(&root, user.id, false).await?;

    // The server turns a login name into an identifier first: a name that is a number logs in
    // as the user with that id.
    let by_number = t.anonymous_client().await;
    let identity = by_number
        .login_user(&format!("{:03}", user.id), PASSWORD)
        .await?;
    check!(identity.user_id == user.id);
    by_number.shutdown().await?;
    delete_users(&root, &[user.id]).await;
    close(t, root).await
}

/// What the replicator's user sync relies on: nested stream and topic permissions round-trip
/// exactly through GET_USER, GET_USERS lists status, and a user deleted and created again
/// under its name (the only way to give it a password nobody knew) logs in with the new one.
#[tokio::test]
async fn a_user_created_again_under_its_name_logs_in_with_the_new_password() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let username = unique("synced");
    let mut rights = on_topic(0, 0, |p| {
        p.read_topic = true;
        p.poll_messages = true;
    });
    rights.global.read_streams = true;
    if let Some(stream) = rights.streams.as_mut().and_then(|s| s.get_mut(&0)) {
        stream.send_messages = true;
    }
    let first = root
        .create_user(
            &username,
            "random-first",
            UserStatus::Inactive,
            Some(rights.clone()),
        )
        .await?;
    let listed = root.get_users().await?;
    let entry = listed
        .iter()
        .find(|u| u.username == username)
        .expect("listed");
    check!(entry.status == UserStatus::Inactive);
    check!(
        root.get_user(&num(first.id))
            .await?
            .expect("user")
            .permissions
            == Some(rights.clone())
    );
    root.delete_user(&num(first.id)).await?;
    let second = root
        .create_user(
            &username,
            PASSWORD,
            UserStatus::Active,
            Some(rights.clone()),
        )
        .await?;
    let by_name = root.get_user(&name(&username)).await?.expect("user");
    check!(by_name.id == second.id && by_name.permissions == Some(rights));
    let anonymous = t.anonymous_client().await;
    check!(code(anonymous.login_user(&username, "random-first").await) == 42);
    check!(anonymous.login_user(&username, PASSWORD).await?.user_id == second.id);
    anonymous.shutdown().await?;
    delete_users(&root, &[second.id]).await;
    close(t, root).await
}

#[tokio::test]
async fn inactive_users_and_wrong_credentials_cannot_log_in() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let username = unique("inactive");
    let user = root
        .create_user(&username, PASSWORD, UserStatus::Inactive, None)
        .await?;
    let anonymous = t.anonymous_client().await;
    check!(code(anonymous.login_user(&username, PASSWORD).await) == 47);
    check!(
        code(anonymous.login_user(&username, "wrong-password").await) == 47,
        "the status is judged before the password"
    );
    root.update_user(&num(user.id), None, Some(UserStatus::Active))
        .await?;
    check!(code(anonymous.login_user(&username, "wrong-password").await) == 42);
    check!(code(anonymous.login_user(&unique("nobody"), PASSWORD).await) == 42);
    let identity = anonymous.login_user(&username, PASSWORD).await?;
    check!(identity.user_id == user.id);
    // Deactivating refuses new logins only: the open session goes on.
    root.update_user(&num(user.id), None, Some(UserStatus::Inactive))
        .await?;
    check!(anonymous.get_me().await?.user_id == Some(user.id));
    let other = t.anonymous_client().await;
    check!(code(other.login_user(&username, PASSWORD).await) == 47);
    other.shutdown().await?;
    anonymous.shutdown().await?;
    delete_users(&root, &[user.id]).await;
    close(t, root).await
}

#[tokio::test]
async fn a_revoked_send_permission_fences_the_open_session_until_it_is_restored() -> TestResult {
    let _users = USERS.lock().await;
    let f = Fixture::start("fence", 1).await;
    let (root, s, topic) = (&f.client, &f.stream, &f.topic);
    let (user, writer) = user_session(&f.t, root, "writer", Some(writer_rights())).await?;
    let session = writer.get_me().await?.client_id;
    send_to(&writer, s, topic, 0, vec![msg("before")]).await?;

    root.update_permissions(&num(user.id), Some(global(|g| g.poll_messages = true)))
        .await?;
    check!(
        code(send_to(&writer, s, topic, 0, vec![msg("fenced")]).await) == 41,
        "the next send of the open session is refused"
    );
    let polled = poll(&writer, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(
        payloads(&polled) == vec![Bytes::from("before")],
        "polls still work, the refused batch is not there"
    );
    check!(writer.get_me().await?.client_id == session, "same session");

    root.update_permissions(&num(user.id), Some(writer_rights()))
        .await?;
    send_to(&writer, s, topic, 0, vec![msg("after")]).await?;
    check!(
        writer.get_me().await?.client_id == session,
        "still the same session"
    );
    let polled = poll(&writer, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(payloads(&polled) == vec![Bytes::from("before"), Bytes::from("after")]);
    writer.shutdown().await?;
    delete_users(root, &[user.id]).await;
    f.finish().await
}

#[tokio::test]
async fn a_user_with_only_poll_rights_on_a_topic_cannot_send() -> TestResult {
    let _users = USERS.lock().await;
    let f = Fixture::start("pollonly", 1).await;
    let (root, s, topic) = (&f.client, &f.stream, &f.topic);
    create_topic(root, s, "other", 1).await?;
    let details = topic_details(root, s, topic).await?;
    let stream_id = root.get_stream(&name(s)).await?.expect("stream").id;
    let rights = on_topic(stream_id, details.id, |t| t.poll_messages = true);
    let (user, poller) = user_session(&f.t, root, "poller", Some(rights.clone())).await?;
    check!(
        user.permissions == Some(rights),
        "per-topic rights round-trip"
    );
    send_to(root, s, topic, 0, vec![msg("a"), msg("b")]).await?;

    check!(code(send_to(&poller, s, topic, 0, vec![msg("x")]).await) == 41);
    let polled = poll(&poller, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(payloads(&polled) == vec![Bytes::from("a"), Bytes::from("b")]);
    let consumer = Consumer::new(name("poller"));
    poller
        .store_consumer_offset(&consumer, &name(s), &name(topic), Some(0), 1)
        .await?;
    check!(
        poller
            .get_consumer_offset(&consumer, &name(s), &name(topic), Some(0))
            .await?
            .expect("offset")
            .stored_offset
            == 1
    );
    let elsewhere = poll(&poller, s, "other", Some(0), PollingStrategy::offset(0), 1).await;
    check!(code(elsewhere) == 41, "the right covers its topic only");
    check!(
        code(poller.get_topic(&name(s), &name(topic)).await) == 41,
        "polling does not imply reading the topic"
    );
    check!(code(poller.get_streams().await) == 41);
    check!(
        code(
            poller
                .create_topic(
                    &name(s),
                    "new",
                    1,
                    CompressionAlgorithm::None,
                    None,
                    IggyExpiry::ServerDefault,
                    MaxTopicSize::ServerDefault
                )
                .await
        ) == 41
    );
    let missing = unique("missing");
    check!(
        code(
            poll(
                &poller,
                &missing,
                topic,
                Some(0),
                PollingStrategy::offset(0),
                1
            )
            .await
        ) == 1009,
        "a missing stream answers before the right is judged"
    );
    poller.shutdown().await?;
    delete_users(root, &[user.id]).await;
    f.finish().await
}

#[tokio::test]
async fn a_user_with_manage_users_manages_users_but_not_streams() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let manage_users = global(|g| g.manage_users = true);
    let (admin, admin_client) = user_session(&t, &root, "admin", Some(manage_users)).await?;
    let (plain, plain_client) = user_session(&t, &root, "plain", None).await?;

    let created_name = unique("created");
    let created = create_user(&admin_client, &created_name, None).await?;
    check!(admin_client.get_user(&num(created.id)).await?.is_some());
    check!(admin_client
        .get_users()
        .await?
        .iter()
        .any(|u| u.id == created.id));
    admin_client
        .update_permissions(&num(created.id), Some(global(|g| g.read_streams = true)))
        .await?;
    check!(
        code(
            admin_client
                .change_password(&num(created.id), "not-current", "new-password")
                .await
        ) == 42
    );
    admin_client
        .change_password(&num(created.id), PASSWORD, "new-password")
        .await?;
    admin_client.delete_user(&num(created.id)).await?;
    check!(code(admin_client.create_stream(&unique("admin")).await) == 41);

    check!(
        code(create_user(&plain_client, "ab", None).await) == 41,
        "the right is judged before the username"
    );
    check!(code(plain_client.delete_user(&num(admin.id)).await) == 41);
    check!(code(plain_client.update_user(&num(admin.id), None, None).await) == 41);
    check!(code(plain_client.update_permissions(&num(admin.id), None).await) == 41);
    admin_client.shutdown().await?;
    plain_client.shutdown().await?;
    delete_users(&root, &[admin.id, plain.id]).await;
    close(t, root).await
}

#[tokio::test]
async fn users_change_their_own_password_without_manage_users() -> TestResult {
    let _users = USERS.lock().await;
    let (t, root) = Target::connected().await;
    let (user, client) = user_session(&t, &root, "passwd", None).await?;
    let username = &user.username;
    check!(
        code(
            client
                .change_password(&num(user.id), "wrong-pw", "next-password")
                .await
        ) == 42
    );
    check!(code(client.change_password(&num(user.id), PASSWORD, "ab").await) == 44);
    check!(
        code(
            client
                .change_password(&num(0), "whatever", "next-password")
                .await
        ) == 41
    );
    client
        .change_password(&name(username), PASSWORD, "next-password")
        .await?;
    let anonymous = t.anonymous_client().await;
    check!(code(anonymous.login_user(username, PASSWORD).await) == 42);
    check!(
        anonymous
            .login_user(username, "next-password")
            .await?
            .user_id
            == user.id
    );
    check!(
        client.get_me().await?.user_id == Some(user.id),
        "the session goes on"
    );
    anonymous.shutdown().await?;
    client.shutdown().await?;
    delete_users(&root, &[user.id]).await;
    close(t, root).await
}

#[tokio::test]
async fn a_deleted_users_session_vanishes_from_the_client_list_and_loses_its_rights() -> TestResult
{
    let _users = USERS.lock().await;
    let f = Fixture::start("deleted", 1).await;
    let (root, s, topic) = (&f.client, &f.stream, &f.topic);
    let (user, doomed) = user_session(&f.t, root, "doomed", Some(writer_rights())).await?;
    let session = doomed.get_me().await?.client_id;
    send_to(&doomed, s, topic, 0, vec![msg("a")]).await?;
    wait_for_session(root, user.id, true).await?;
    root.delete_user(&num(user.id)).await?;
    check!(
        !root
            .get_clients()
            .await?
            .iter()
            .any(|c| c.client_id == session),
        "the registry forgets the session at once"
    );
    check!(
        code(doomed.get_me().await) == 100,
        "the open connection has no client any more"
    );
    // The server closed the connection after that answer; the SDK reconnects, and its login
    // as the deleted user fails; after that the client stays disconnected.
    check!(code(send_to(&doomed, s, topic, 0, vec![msg("b")]).await) == 42);
    check!(code(poll(&doomed, s, topic, Some(0), PollingStrategy::offset(0), 1).await) == 8);
    let polled = poll(root, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(payloads(&polled) == vec![Bytes::from("a")]);
    let _ = doomed.shutdown().await;
    f.finish().await
}

// ---------------------------------------------------------------------------------------------
// In-process hooks: faults, restart, retention

#[tokio::test]
async fn restart_keeps_data_on_the_same_port() -> TestResult {
    let config = TestServerConfig::default();
    let Some(mut f) = Fixture::start_local("restart", config, "restart", 1, SERVER_DEFAULTS).await
    else {
        return Ok(());
    };
    let addr = f.server().addr();
    send_to(&f.client, &f.stream, &f.topic, 0, vec![msg("before")]).await?;
    let server = f.t.server.as_mut().expect("local");
    server.restart().await?;
    check!(server.addr() == addr);
    // The SDK client notices the dropped connection and reconnects by itself.
    let (client, s, topic) = (&f.client, &f.stream, &f.topic);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let polled = loop {
        match poll(client, s, topic, Some(0), PollingStrategy::offset(0), 10).await {
            Ok(p) => break Some(p),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => break None,
        }
    };
    let polled = polled.expect("polled");
    check!(payloads(&polled) == vec![Bytes::from("before")]);
    f.finish().await
}

#[tokio::test]
async fn faults_refuse_drop_fail_stall_and_delay() -> TestResult {
    let t = Target::new().await;
    let Some(server) = t.local("faults") else {
        return Ok(());
    };
    let faults = server.faults();
    let mut sock = raw_logged_in(&t).await;

    faults.fail_next(201, 3007, 2);
    check!(request(&mut sock, 201, &[]).await == (3007, vec![]));
    check!(request(&mut sock, 201, &[]).await == (3007, vec![]));
    check!(
        request(&mut sock, 201, &[]).await.0 == 0,
        "only the next N fail"
    );

    faults.set_latency(Some(Duration::from_millis(200)));
    let started = std::time::Instant::now();
    check!(request(&mut sock, 1, &[]).await.0 == 0);
    check!(started.elapsed() >= Duration::from_millis(200));
    faults.set_latency(None);

    faults.stall_for(Duration::from_millis(300));
    let started = std::time::Instant::now();
    check!(
        request(&mut sock, 1, &[]).await.0 == 0,
        "answered after the stall"
    );
    check!(started.elapsed() >= Duration::from_millis(250));

    faults.drop_connections();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await?;
    check!(
        matches!(read, Ok(0) | Err(_)),
        "connection closed by the server"
    );

    faults.refuse_connections(true);
    let mut refused = t.raw().await;
    let read = tokio::time::timeout(Duration::from_secs(5), refused.read(&mut buf)).await?;
    check!(
        matches!(read, Ok(0) | Err(_)),
        "new connection closed at once"
    );
    faults.refuse_connections(false);
    let mut accepted = raw_logged_in(&t).await;
    check!(request(&mut accepted, 1, &[]).await.0 == 0);
    t.stop().await;
    Ok(())
}

#[tokio::test]
async fn retention_drops_oldest_messages_and_keeps_current_offset() -> TestResult {
    let config = TestServerConfig::default();
    let Some(f) = Fixture::start_local("retention", config, "retention", 1, SERVER_DEFAULTS).await
    else {
        return Ok(());
    };
    let (client, s, topic, server) = (&f.client, &f.stream, &f.topic, f.server());
    let batch: Vec<IggyMessage> = (0..6).map(|i| msg(&format!("m{i}"))).collect();
    send_to(client, s, topic, 0, batch).await?;
    let dropped = server.retention().drop_before(s, topic, 0, 4)?;
    check!(dropped == 4);
    let from_zero = poll(client, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(
        offsets(&from_zero) == vec![4, 5],
        "polls below the retained start begin at it"
    );
    check!(
        offsets(&poll(client, s, topic, Some(0), PollingStrategy::first(), 10).await?)
            == vec![4, 5]
    );
    let details = topic_details(client, s, topic).await?;
    check!(details.partitions[0].messages_count == 2);
    check!(details.partitions[0].current_offset == 5);
    let info = server.partition_info(s, topic, 0)?;
    check!(info.first_offset == 4);
    check!(info.messages_count == 2);
    check!(
        server.retention().drop_before(s, topic, 7, 1).is_err(),
        "unknown partition"
    );
    f.finish().await
}

#[tokio::test]
async fn expiry_cleaner_drops_sealed_segments_only() -> TestResult {
    let expiring = Limits {
        expiry: IggyExpiry::ExpireDuration(IggyDuration::from(Duration::from_millis(1))),
        ..SERVER_DEFAULTS
    };
    let Some(f) =
        Fixture::start_local("expiry cleaner", segments_of(200), "expiry", 1, expiring).await
    else {
        return Ok(());
    };
    let (client, s, topic, server) = (&f.client, &f.stream, &f.topic, f.server());
    for i in 0..6 {
        // 64-byte header + 36-byte payload: two messages fill a 200-byte segment.
        send_to(client, s, topic, 0, vec![msg(&format!("{i:036}"))]).await?;
    }
    check!(server.partition_info(s, topic, 0)?.segments_count == 3);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let dropped = server.retention().run_cleaner();
    check!(dropped == 4, "the active segment stays");
    let info = server.partition_info(s, topic, 0)?;
    check!(info.first_offset == 4);
    check!(info.current_offset == 5);
    f.finish().await
}

#[tokio::test]
async fn a_disconnected_member_leaves_its_group() -> TestResult {
    let f = Fixture::start("leave", 2).await;
    let (a, s, topic) = (&f.client, &f.stream, &f.topic);
    let (st, tp, gid) = (name(s), name(topic), name("g"));
    a.create_consumer_group(&st, &tp, "g").await?;
    a.join_consumer_group(&st, &tp, &gid).await?;
    let b = f.t.client().await;
    b.join_consumer_group(&st, &tp, &gid).await?;
    check!(
        a.get_consumer_group(&st, &tp, &gid)
            .await?
            .expect("group")
            .members_count
            == 2
    );
    b.shutdown().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let group = a.get_consumer_group(&st, &tp, &gid).await?.expect("group");
        if group.members_count == 1 {
            check!(group.members[0].partitions == vec![0, 1]);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "member never removed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f.finish().await
}

#[tokio::test]
async fn data_dir_keeps_streams_messages_and_offsets_across_process_restarts() -> TestResult {
    let Some(dir) = DataDir::create("data-dir persistence")? else {
        return Ok(());
    };
    let (t, client) = dir.start().await;
    let gone = client.create_stream("gone").await?;
    let kept = client.create_stream("kept").await?;
    create_topic(&client, "kept", "t", 2).await?;
    let (st, tp) = (name("kept"), name("t"));
    async fn from_start(client: &IggyClient) -> Result<PolledMessages, IggyError> {
        poll(client, "kept", "t", Some(0), PollingStrategy::offset(0), 10).await
    }
    send_to(&client, "kept", "t", 0, vec![msg("a"), msg("b"), msg("c")]).await?;
    send_to(&client, "kept", "t", 0, vec![msg("d")]).await?;
    let consumer = Consumer::new(name("c"));
    client
        .store_consumer_offset(&consumer, &st, &tp, Some(0), 1)
        .await?;
    client.create_consumer_group(&st, &tp, "g").await?;
    client.delete_stream(&num(gone.id)).await?;
    let server = t.server.as_ref().expect("an in-process server");
    server.retention().drop_before("kept", "t", 0, 1)?;
    let before = from_start(&client).await?;
    close(t, client).await?;

    let (t, client) = dir.start().await;
    let stream = client.get_stream(&st).await?.expect("stream persisted");
    check!(stream.id == kept.id);
    check!(client.get_stream(&name("gone")).await?.is_none());
    let after = from_start(&client).await?;
    check!(offsets(&after) == vec![1, 2, 3]);
    check!(
        after
            .messages
            .iter()
            .map(IggyMessage::to_bytes)
            .collect::<Vec<_>>()
            == before
                .messages
                .iter()
                .map(IggyMessage::to_bytes)
                .collect::<Vec<_>>(),
        "stored bytes identical"
    );
    let info = client
        .get_consumer_offset(&consumer, &st, &tp, Some(0))
        .await?
        .expect("offset");
    check!(info.stored_offset == 1);
    check!(client
        .get_consumer_group(&st, &tp, &name("g"))
        .await?
        .is_some());
    send_to(&client, "kept", "t", 0, vec![msg("e")]).await?;
    check!(
        offsets(&poll(&client, "kept", "t", Some(0), PollingStrategy::last(), 1).await?) == vec![4]
    );
    let reused = client.create_stream("new").await?;
    check!(
        reused.id == gone.id,
        "freed stream slot still reused after reload"
    );
    close(t, client).await
}

#[tokio::test]
async fn size_cleaner_and_delete_segments_keep_the_active_segment_and_stored_offsets() -> TestResult
{
    let limited = Limits {
        expiry: IggyExpiry::NeverExpire,
        max_size: MaxTopicSize::Custom(IggyByteSize::from(400u64)),
    };
    let what = "size cleaner and DELETE_SEGMENTS";
    let Some(f) = Fixture::start_local(what, segments_of(200), "size", 2, limited).await else {
        return Ok(());
    };
    let (client, s, topic, server) = (&f.client, &f.stream, &f.topic, f.server());
    for p in 0..2 {
        for i in 0..6 {
            // 100 bytes per message: two per 200-byte segment.
            send_to(client, s, topic, p, vec![msg(&format!("{i:036}"))]).await?;
        }
    }
    let (st, tp) = (name(s), name(topic));
    // Partition 1: a stored consumer offset at 1 blocks everything above it.
    client
        .store_consumer_offset(&Consumer::new(num(1)), &st, &tp, Some(1), 1)
        .await?;
    // Topic holds 1200 bytes against a 360-byte threshold (90 % of 400): partition 0 loses both
    // sealed segments, partition 1 only the segment [0, 1] below its stored offset.
    let dropped = server.retention().run_cleaner();
    check!(dropped == 6);
    check!(server.partition_info(s, topic, 0)?.first_offset == 4);
    check!(server.partition_info(s, topic, 1)?.first_offset == 2);
    client
        .store_consumer_offset(&Consumer::new(num(1)), &st, &tp, Some(1), 5)
        .await?;
    client.delete_segments(&st, &tp, 1, 10).await?;
    let info = server.partition_info(s, topic, 1)?;
    check!(info.first_offset == 4, "only sealed segments go");
    check!(info.segments_count == 1);
    check!(code(client.delete_segments(&st, &tp, 7, 1).await) == 3007);
    f.finish().await
}

#[tokio::test]
async fn a_held_send_is_judged_when_it_is_let_in() -> TestResult {
    let _users = USERS.lock().await;
    let Some(f) = Fixture::start_local(
        "send hold",
        TestServerConfig::default(),
        "hold",
        2,
        SERVER_DEFAULTS,
    )
    .await
    else {
        return Ok(());
    };
    let (root, s, topic) = (&f.client, &f.stream, &f.topic);
    let (user, writer) = user_session(&f.t, root, "held", Some(writer_rights())).await?;
    let hold = f.server().faults().hold_sends_to(s, topic, 0);

    let held_send = {
        let (s, topic) = (s.clone(), topic.clone());
        tokio::spawn(async move {
            let result = send_to(&writer, &s, &topic, 0, vec![msg("in flight")]).await;
            (writer, result)
        })
    };
    tokio::time::timeout(Duration::from_secs(10), hold.until_held(1)).await?;
    check!(
        f.server().partition_info(s, topic, 0)?.messages_count == 0,
        "not yet appended"
    );
    send_to(root, s, topic, 0, vec![msg("root")]).await?;
    send_to(root, s, topic, 1, vec![msg("root")]).await?;
    check!(hold.held() == 1, "other sessions are not held");

    root.update_permissions(&num(user.id), Some(global(|g| g.poll_messages = true)))
        .await?;
    hold.release();
    let (writer, result) = held_send.await?;
    check!(
        code(result) == 41,
        "the held send is judged when it is let in, after the revocation"
    );
    let polled = poll(root, s, topic, Some(0), PollingStrategy::offset(0), 10).await?;
    check!(payloads(&polled) == vec![Bytes::from("root")]);
    writer.shutdown().await?;
    delete_users(root, &[user.id]).await;
    f.finish().await
}

#[tokio::test]
async fn data_dir_keeps_users_and_their_permissions() -> TestResult {
    let Some(dir) = DataDir::create("data-dir persistence of users")? else {
        return Ok(());
    };
    let (t, root) = dir.start().await;
    let gone = create_user(&root, "gone-user", None).await?;
    let rights = on_topic(3, 4, |t| t.send_messages = true);
    let kept = create_user(&root, "kept-user", Some(rights.clone())).await?;
    root.change_password(&num(kept.id), PASSWORD, "changed-pw")
        .await?;
    root.update_user(&num(kept.id), None, Some(UserStatus::Inactive))
        .await?;
    root.delete_user(&num(gone.id)).await?;
    close(t, root).await?;

    let (t, root) = dir.start().await;
    let restored = root
        .get_user(&name("kept-user"))
        .await?
        .expect("user persisted");
    check!(restored.id == kept.id);
    check!(restored.status == UserStatus::Inactive);
    check!(restored.permissions == Some(rights));
    check!(restored.created_at == kept.created_at);
    check!(root.get_user(&name("gone-user")).await?.is_none());
    root.update_user(&num(kept.id), None, Some(UserStatus::Active))
        .await?;
    let anonymous = t.anonymous_client().await;
    check!(
        anonymous
            .login_user("kept-user", "changed-pw")
            .await?
            .user_id
            == kept.id
    );
    let reused = create_user(&root, "new-user", None).await?;
    check!(
        reused.id == gone.id,
        "freed user id still reused after reload"
    );
    anonymous.shutdown().await?;
    close(t, root).await
}
