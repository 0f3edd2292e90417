//! Conformance suite of a clustered 0.9 server: what each replica of a three-replica cluster
//! answers (the roster, a backup's refusals, logins anywhere) and what SDK 0.11 makes of it.
//!
//! By default each test starts its own in-process `TestCluster` of three replicas. With
//! `IGGY_CONFORMANCE_VERSION=0.9` and an `IGGY_CONFORMANCE_URL` that lists every replica of a
//! real cluster (`iggy://iggy:iggy@127.0.0.1:28100,127.0.0.1:28101,127.0.0.1:28102`) the tests
//! that need no in-process hook run against that cluster (the others skip themselves with a
//! note); a URL of one address skips the whole suite.

mod raw09;

use assert2::{assert, check};
use iggy09::prelude::*;
use iggy09_binary_protocol::consensus::{result_code, Operation};
use iggy09_binary_protocol::responses::system::get_cluster_metadata::ClusterMetadataResponse;
use iggy09_binary_protocol::{
    WireDecode, WireEncode, WireIdentifier, WireName, IGGY_PROTOCOL_VERSION,
};
use raw09::{Frame, Raw};
use replicator_testkit::{IggyVersion, TestCluster, TestServerConfig};
use std::sync::atomic::{AtomicU32, Ordering};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// TransientNotAccepted: refused before it entered any pipeline, re-issuable anywhere.
const NOT_ACCEPTED: u32 = 58;

/// GET_CLUSTER_METADATA.
const GET_CLUSTER_METADATA: u32 = 12;
/// GET_STREAMS.
const GET_STREAMS: u32 = 201;
/// CREATE_STREAM.
const CREATE_STREAM: u32 = 202;
/// Unauthenticated: a read before any login.
const UNAUTHENTICATED: u32 = 40;

/// The cluster a test talks to: a real one named by the environment, or an in-process one.
struct Target {
    cluster: Option<TestCluster>,
    /// Every replica's `host:port`, by replica index.
    addresses: Vec<String>,
    /// Root's credentials.
    root: (String, String),
}

/// Where the suite runs, as the environment says.
enum Place {
    /// An in-process cluster (the default).
    InProcess,
    /// A real cluster: every replica's address, and root's credentials.
    Remote(Vec<String>, (String, String)),
    /// A real server of one address: nothing to test here.
    NotACluster,
}

fn place() -> Place {
    if std::env::var("IGGY_CONFORMANCE_VERSION").unwrap_or_default() != "0.9" {
        return Place::InProcess;
    }
    let Some(url) = std::env::var("IGGY_CONFORMANCE_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        return Place::InProcess;
    };
    let rest = url.split("://").nth(1).unwrap_or(&url);
    let (credentials, hosts) = rest.rsplit_once('@').unwrap_or(("iggy:iggy", rest));
    let hosts = hosts.split('?').next().unwrap_or(hosts);
    let addresses: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    let (user, password) = credentials.split_once(':').unwrap_or(("iggy", "iggy"));
    if addresses.len() < 2 {
        return Place::NotACluster;
    }
    Place::Remote(addresses, (user.to_owned(), password.to_owned()))
}

impl Target {
    /// The cluster, or `None` when the configured real server is no cluster (printed).
    async fn new() -> Option<Self> {
        match place() {
            Place::Remote(addresses, root) => Some(Target {
                cluster: None,
                addresses,
                root,
            }),
            Place::NotACluster => {
                eprintln!("skipped: IGGY_CONFORMANCE_URL names one address, not a cluster");
                None
            }
            Place::InProcess => {
                let cluster = TestCluster::start(
                    TestServerConfig {
                        iggy_version: IggyVersion::V0_9,
                        ..TestServerConfig::default()
                    },
                    3,
                )
                .await
                .expect("start a three-replica 0.9 test cluster");
                let addresses = cluster.addrs().iter().map(|a| a.to_string()).collect();
                Some(Target {
                    cluster: Some(cluster),
                    addresses,
                    root: ("iggy".to_owned(), "iggy".to_owned()),
                })
            }
        }
    }

    /// The in-process cluster, or `None` with a printed note against a real one.
    fn in_process(&mut self, test: &str) -> Option<&mut TestCluster> {
        if self.cluster.is_none() {
            eprintln!("skipped {test}: it needs the in-process cluster's hooks");
        }
        self.cluster.as_mut()
    }

    /// A raw connection to replica `index`, registered as root.
    async fn raw(&self, index: usize) -> Raw {
        let mut raw = Raw::connect(&self.addresses[index]).await;
        raw.register(IGGY_PROTOCOL_VERSION, &self.root.0, &self.root.1)
            .await
            .expect("register as root");
        raw
    }

    /// An SDK 0.11 client given the address `host`, connected and logged in (SDK 0.11 takes one
    /// address; it finds the others in the roster).
    async fn client(&self, host: &str) -> Result<IggyClient, IggyError> {
        let url = format!("iggy://{}:{}@{host}", self.root.0, self.root.1);
        let client = IggyClient::from_connection_string(&url)?;
        client.connect().await?;
        Ok(client)
    }

    /// The roster as replica `index` answers it.
    async fn roster(&self, index: usize) -> ClusterMetadataResponse {
        roster_of(&mut self.raw(index).await).await
    }

    /// The leader's index in `self.addresses`, as replica `index` names it.
    async fn leader_as_seen_by(&self, index: usize) -> Option<usize> {
        let roster = self.roster(index).await;
        let leader = roster
            .nodes
            .iter()
            .find(|n| n.role == ClusterNodeRole::Leader as u8)?;
        let address = format!("{}:{}", leader.ip, leader.tcp_port);
        self.addresses.iter().position(|a| *a == address)
    }
}

/// GET_CLUSTER_METADATA over `raw`.
async fn roster_of(raw: &mut Raw) -> ClusterMetadataResponse {
    match raw
        .send(Operation::NonReplicated, GET_CLUSTER_METADATA, &[], false)
        .await
    {
        Frame::Reply { status: 0, body } => {
            ClusterMetadataResponse::decode_from(&body).expect("a roster answer")
        }
        other => panic!("GET_CLUSTER_METADATA answered {other:?}"),
    }
}

/// A name no other test (or earlier run against a shared cluster) uses.
fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{}-{nanos}-{n}", std::process::id())
}

/// CREATE_STREAM `name` over `raw` (result framed).
async fn raw_create_stream(raw: &mut Raw, name: &str) -> Frame {
    let body = iggy09_binary_protocol::requests::streams::CreateStreamRequest {
        name: WireName::new(name).expect("a valid name"),
        options: iggy09_binary_protocol::WireOptions::empty(),
    }
    .to_bytes();
    raw.send(Operation::CreateStream, CREATE_STREAM, &body, true)
        .await
}

#[tokio::test]
async fn every_replica_names_every_replica_and_the_same_single_leader() {
    let Some(t) = Target::new().await else {
        return;
    };
    let mut leaders = Vec::new();
    for index in 0..t.addresses.len() {
        let roster = t.roster(index).await;
        check!(roster.nodes.len() == t.addresses.len());
        let mut named: Vec<String> = roster
            .nodes
            .iter()
            .map(|n| format!("{}:{}", n.ip, n.tcp_port))
            .collect();
        named.sort();
        let mut expected = t.addresses.clone();
        expected.sort();
        check!(named == expected);
        check!(roster
            .nodes
            .iter()
            .all(|n| n.status == ClusterNodeStatus::Healthy as u8));
        let led: Vec<usize> = roster
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.role == ClusterNodeRole::Leader as u8)
            .map(|(i, _)| i)
            .collect();
        check!(led.len() == 1, "one leader in {roster:?}");
        leaders.push(t.leader_as_seen_by(index).await);
    }
    check!(leaders.iter().all(|l| l.is_some() && *l == leaders[0]));
}

#[tokio::test]
async fn a_backup_logs_in_and_serves_reads_but_refuses_a_metadata_write_as_not_accepted() {
    let Some(t) = Target::new().await else {
        return;
    };
    let leader = t.leader_as_seen_by(0).await.expect("a leader");
    let backup = (leader + 1) % t.addresses.len();
    let mut raw = t.raw(backup).await;
    match raw
        .send(Operation::NonReplicated, GET_STREAMS, &[], false)
        .await
    {
        Frame::Reply { status, .. } => {
            check!(status == 0);
        }
        other => panic!("GET_STREAMS on a backup answered {other:?}"),
    }
    let name = unique("backup-write");
    let answer = raw_create_stream(&mut raw, &name).await;
    let Frame::Reply { status, body } = &answer else {
        panic!("CREATE_STREAM on a backup answered {answer:?}");
    };
    check!(*status == 0);
    check!(result_code(body) == Some(NOT_ACCEPTED));
    // Nothing was created: the leader knows no such stream.
    let client = t
        .client(&t.addresses[leader])
        .await
        .expect("log in at the leader");
    let id = Identifier::named(&name).expect("a valid name");
    check!(client.get_stream(&id).await.ok().flatten().is_none());
}

#[tokio::test]
async fn a_backup_refuses_a_send_as_not_accepted_in_the_status() -> TestResult {
    let Some(t) = Target::new().await else {
        return Ok(());
    };
    let leader = t.leader_as_seen_by(0).await.expect("a leader");
    let backup = (leader + 1) % t.addresses.len();
    let client = t.client(&t.addresses[leader]).await?;
    let name = unique("backup-send");
    let stream = client.create_stream(&name).await?;
    let mut raw = t.raw(leader).await;
    let topic = iggy09_binary_protocol::requests::topics::CreateTopicRequest {
        stream_id: WireIdentifier::Numeric(stream.id),
        partitions_count: 1,
        name: WireName::new("t")?,
        options: iggy09_binary_protocol::WireOptions::empty(),
    }
    .to_bytes();
    match raw.send(Operation::CreateTopic, 302, &topic, true).await {
        Frame::Reply { status: 0, body } if result_code(&body) == Some(0) => {}
        other => panic!("CREATE_TOPIC at the leader answered {other:?}"),
    }
    let mut raw = t.raw(backup).await;
    let mut body = bytes::BytesMut::new();
    iggy09_binary_protocol::requests::messages::SendMessagesEncoder::encode(
        &mut body,
        &WireIdentifier::Numeric(stream.id),
        &WireIdentifier::Numeric(0),
        &iggy09_binary_protocol::WirePartitioning::PartitionId(0),
        &[iggy09_binary_protocol::requests::messages::RawMessage {
            id: 1,
            origin_timestamp: 10,
            headers: None,
            payload: b"to a backup",
        }],
    )?;
    let answer = raw.send(Operation::SendMessages, 101, &body, false).await;
    let Frame::Reply { status, body } = &answer else {
        panic!("SEND_MESSAGES on a backup answered {answer:?}");
    };
    check!(*status == NOT_ACCEPTED);
    check!(body.is_empty());
    let stream_id = Identifier::numeric(stream.id)?;
    let polled = client
        .poll_messages(
            &stream_id,
            &Identifier::numeric(0)?,
            Some(0),
            &Consumer::default(),
            &PollingStrategy::offset(0),
            10,
            false,
        )
        .await?;
    check!(polled.messages.is_empty());
    client.delete_stream(&stream_id).await?;
    Ok(())
}

#[tokio::test]
async fn an_sdk_client_given_a_backup_is_redirected_to_the_leader_and_writes() -> TestResult {
    let Some(t) = Target::new().await else {
        return Ok(());
    };
    let leader = t.leader_as_seen_by(0).await.expect("a leader");
    let backup = (leader + 1) % t.addresses.len();
    let client = t.client(&t.addresses[backup]).await?;
    let name = unique("redirected");
    let stream = client.create_stream(&name).await?;
    check!(stream.name == name);
    let metadata = client.get_cluster_metadata().await?;
    check!(metadata.nodes.len() == t.addresses.len());
    client
        .delete_stream(&Identifier::numeric(stream.id)?)
        .await?;
    Ok(())
}

#[tokio::test]
async fn killing_the_primary_makes_the_next_replica_leader_of_every_roster() -> TestResult {
    let Some(mut t) = Target::new().await else {
        return Ok(());
    };
    let Some(cluster) = t.in_process("killing_the_primary_makes_the_next_replica_leader") else {
        return Ok(());
    };
    assert!(cluster.primary() == Some(0));
    cluster.kill(0).await;
    check!(cluster.primary() == Some(1));
    check!(cluster.view() == 1);
    check!(tokio::net::TcpStream::connect(&t.addresses[0])
        .await
        .is_err());
    for index in [1, 2] {
        check!(t.leader_as_seen_by(index).await == Some(1));
    }
    // A client given the other backup is redirected to the new leader and writes there.
    let client = t.client(&t.addresses[2]).await?;
    let name = unique("after-view-change");
    client.create_stream(&name).await?;
    // The old primary comes back as a backup: it names replica 1 and refuses writes.
    let cluster = t.cluster.as_mut().expect("in process");
    cluster.restart(0).await?;
    check!(cluster.primary() == Some(1));
    check!(t.leader_as_seen_by(0).await == Some(1));
    let mut raw = t.raw(0).await;
    let answer = raw_create_stream(&mut raw, &unique("on-old-primary")).await;
    let Frame::Reply { body, .. } = &answer else {
        panic!("CREATE_STREAM on the restarted replica answered {answer:?}");
    };
    check!(result_code(body) == Some(NOT_ACCEPTED));
    Ok(())
}

#[tokio::test]
async fn a_write_answered_not_committed_is_replayed_by_the_sdk_and_applied_once() -> TestResult {
    let Some(mut t) = Target::new().await else {
        return Ok(());
    };
    let Some(cluster) = t.in_process("a_write_answered_not_committed_is_replayed") else {
        return Ok(());
    };
    let faults = cluster.faults(0);
    cluster.answer_not_committed_once();
    let client = t.client(&t.addresses[0]).await?;
    let before = faults.requests(CREATE_STREAM);
    let name = unique("not-committed");
    client.create_stream(&name).await?;
    // The first CREATE_STREAM was answered 57 and the SDK sent it again.
    check!(faults.requests(CREATE_STREAM) - before == 2);
    let streams = client.get_streams().await?;
    check!(streams.iter().filter(|s| s.name == name).count() == 1);
    Ok(())
}

#[tokio::test]
async fn before_the_view_change_a_backup_refuses_logins_as_not_accepted() -> TestResult {
    let Some(mut t) = Target::new().await else {
        return Ok(());
    };
    if t.in_process("before_the_view_change_a_backup_refuses_logins")
        .is_none()
    {
        return Ok(());
    }
    // Logged in before the primary dies: a connection that can still read the roster (a new
    // one cannot log in to read it until the view change).
    let mut before = t.raw(1).await;
    let cluster = t.cluster.as_mut().expect("in process");
    cluster.kill_without_view_change(0).await;
    check!(cluster.primary() == None);
    // The roster still names the dead primary.
    let roster = roster_of(&mut before).await;
    let leader = roster
        .nodes
        .iter()
        .position(|n| n.role == ClusterNodeRole::Leader as u8);
    check!(leader == Some(0));
    let mut raw = Raw::connect(&t.addresses[1]).await;
    let body = Raw::register_body(IGGY_PROTOCOL_VERSION, &t.root.0, &t.root.1);
    let answer = raw.send(Operation::Register, 0, &body, true).await;
    let Frame::Reply { status, body } = &answer else {
        panic!("a register on a backup without a primary answered {answer:?}");
    };
    check!(*status == 0);
    check!(result_code(body) == Some(NOT_ACCEPTED));
    // Not logged in: a read is refused as before any login.
    match raw
        .send(Operation::NonReplicated, GET_STREAMS, &[], false)
        .await
    {
        Frame::Reply { status, .. } => {
            check!(status == UNAUTHENTICATED);
        }
        other => panic!("GET_STREAMS answered {other:?}"),
    }
    // Wrong credentials are still refused as such (checked before the forward).
    let mut other = Raw::connect(&t.addresses[2]).await;
    let wrong = other
        .register(IGGY_PROTOCOL_VERSION, &t.root.0, "not-the-password")
        .await;
    check!(matches!(wrong, Err(Frame::Eviction(_))));
    let cluster = t.cluster.as_ref().expect("in process");
    check!(cluster.logins_refused() == 1);
    cluster.view_change();
    check!(cluster.primary() == Some(1));
    let mut raw = Raw::connect(&t.addresses[2]).await;
    check!(raw
        .register(IGGY_PROTOCOL_VERSION, &t.root.0, &t.root.1)
        .await
        .is_ok());
    Ok(())
}
