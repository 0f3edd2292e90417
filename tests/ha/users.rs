//! An application survives a failover, with three node processes: its Iggy user is synced to
//! the target (inactive, permissions translated to the target's ids), permission and topic
//! setting changes upstream follow also after the node that ran the sync is killed, and after
//! `flow promote --activate-users` the application logs in on the target as that user and its
//! consumer group continues with the next message. Once with an Iggy 0.8 target, once with a
//! 0.9 one.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::{
    GlobalPermissions, IggyDuration, IggyExpiry, IggyMessage, Permissions, StreamPermissions,
    TopicPermissions, UserStatus,
};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, group_next_message, message_id_at, produce_bulk, serial, store_group_offsets,
    translated_exactly, wait_until, Bulk, Client, ClusterEntry, Endpoint, FlowEntry, Replication,
    ReplicatorCluster, Servers, TestResult, Topic,
};
use replicator_model::IggyVersion;
use replicator_testkit::TestServerConfig;

use crate::fixture;

const STREAM: &str = "apps";
const TOPIC: &str = "orders";
const PARTITIONS: u32 = 3;
const APP: &str = "app-billing";
const WAIT: Duration = Duration::from_secs(60);

fn id(name: &str) -> TestResult<iggy::prelude::Identifier> {
    Ok(iggy::prelude::Identifier::named(name)?)
}

/// Reads the stream and consumes the topic (stream- and topic-level rights, by the source's
/// ids), plus `read_streams` globally while `wide`.
async fn app_permissions(up: &Client, wide: bool) -> TestResult<Permissions> {
    let stream = up.get_stream(&id(STREAM)?).await?.ok_or("no stream")?;
    let topic = up
        .get_topic(&id(STREAM)?, &id(TOPIC)?)
        .await?
        .ok_or("no topic")?;
    let consume = TopicPermissions {
        read_topic: true,
        poll_messages: true,
        ..TopicPermissions::default()
    };
    let on_stream = StreamPermissions {
        read_stream: true,
        topics: Some(BTreeMap::from([(topic.id as usize, consume)])),
        ..StreamPermissions::default()
    };
    Ok(Permissions {
        global: GlobalPermissions {
            read_streams: wide,
            ..GlobalPermissions::default()
        },
        streams: Some(BTreeMap::from([(stream.id as usize, on_stream)])),
    })
}

async fn produce(up: &Client, range: std::ops::Range<u64>) -> TestResult {
    let bulk = Bulk {
        stream: STREAM.into(),
        topic: TOPIC.into(),
        partitions: (0..PARTITIONS).collect(),
        range,
        batch: 100,
    };
    produce_bulk(up, &bulk, |partition, seq| {
        IggyMessage::builder()
            .id((u128::from(partition) << 32) | u128::from(seq + 1))
            .payload(Bytes::from(format!("{partition}-{seq}")))
            .build()
    })
    .await?;
    Ok(())
}

/// The password promote gives the application's user on the target.
const TARGET_PASSWORD: &str = "on-the-target";

/// `flow promote fwd --timeout T --activate-users FILE` through the leader, with a file that
/// names the application's user; asserts the exit code and the user's activation.
async fn promote_activating(cluster: &ReplicatorCluster, timeout: &str, code: i32) -> TestResult {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), format!("{APP} = \"{TARGET_PASSWORD}\"\n"))?;
    let path = file.path().to_string_lossy().into_owned();
    let run = cluster
        .flow_once(&[
            "promote",
            "fwd",
            "--timeout",
            timeout,
            "--activate-users",
            &path,
        ])
        .await?;
    println!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(code), "promote: {}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("user {APP}: activated on the target")),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(TARGET_PASSWORD), "no password printed");
    Ok(())
}

/// The application, logged in as its own user on the target.
async fn app_on_the_target(servers: &Servers, target: IggyVersion) -> TestResult<Client> {
    let url = servers.downstream.connection_string();
    let address = url.rsplit_once('@').map(|(_, a)| a).ok_or("no address")?;
    Ok(connect(&Endpoint::new(
        target,
        format!("iggy://{APP}:{TARGET_PASSWORD}@{address}"),
    ))
    .await?)
}

async fn app_user_continues_on_the_target(target: IggyVersion) -> TestResult {
    let down_config = TestServerConfig {
        iggy_version: target,
        ..TestServerConfig::default()
    };
    let servers = Servers::start_with(
        Topic::new(STREAM, TOPIC, PARTITIONS),
        TestServerConfig::default(),
        down_config,
    )
    .await?;
    let mut down_entry = ClusterEntry::new("down", servers.downstream.connection_string());
    down_entry.iggy_version = Some(target.as_str().to_owned());
    let replication = Replication::default()
        .cluster(ClusterEntry::new(
            "up",
            servers.upstream.connection_string(),
        ))
        .cluster(down_entry)
        .flow(
            FlowEntry::new("fwd", "up", "down", format!("{STREAM}/*")).extra(
                "consumer_groups = [\"billing\"]\nconsumer_group_sync_interval = \"200ms\"\n\
                 users = [\"app-*\"]\nmetadata_sync_interval = \"300ms\"",
            ),
        );
    let mut cluster = ReplicatorCluster::start(
        fixture::spec_of(&replication, PARTITIONS as usize, false)?,
        3,
    )
    .await?;
    let up = connect(&servers.upstream.connection_string()).await?;
    let down_endpoint = Endpoint::new(target, servers.downstream.connection_string());
    let down = connect(&down_endpoint).await?;

    up.create_user(
        APP,
        "upstream-only",
        UserStatus::Active,
        Some(app_permissions(&up, true).await?),
    )
    .await?;
    produce(&up, 0..300).await?;
    let consumed = [(0, 99), (1, 150), (2, 0)];
    store_group_offsets(&up, (STREAM, TOPIC), "billing", &consumed).await?;
    wait_until("the user on the target, inactive", WAIT, || async {
        down.get_user(&id(APP).unwrap())
            .await
            .ok()
            .flatten()
            .is_some_and(|u| {
                u.status == UserStatus::Inactive
                    && u.permissions.is_some_and(|p| p.global.read_streams)
            })
    })
    .await?;

    // The node that runs the sync (the owner of the flow's first partition) dies; changes
    // upstream still reach the target, from the node that owns that partition next.
    let status = cluster.leader_status().await.ok_or("no leader")?;
    let runner = status
        .units
        .iter()
        .filter(|u| u.unit.flow == "fwd")
        .min_by(|a, b| a.unit.cmp(&b.unit))
        .and_then(|u| u.owner)
        .ok_or("the first partition has no owner")?;
    cluster.kill(runner)?;
    up.update_permissions(&id(APP)?, Some(app_permissions(&up, false).await?))
        .await?;
    let topic = up
        .get_topic(&id(STREAM)?, &id(TOPIC)?)
        .await?
        .ok_or("no topic")?;
    let two_hours = IggyExpiry::ExpireDuration(IggyDuration::from(7_200_000_000));
    up.update_topic(
        &id(STREAM)?,
        &id(TOPIC)?,
        TOPIC,
        topic.compression_algorithm,
        None,
        two_hours,
        topic.max_topic_size,
    )
    .await?;
    wait_until(
        &format!("the changes on the target after node {runner} was killed"),
        WAIT,
        || async {
            let user = down.get_user(&id(APP).unwrap()).await.ok().flatten();
            let topic = down
                .get_topic(&id(STREAM).unwrap(), &id(TOPIC).unwrap())
                .await
                .ok()
                .flatten();
            user.is_some_and(|u| u.permissions.is_some_and(|p| !p.global.read_streams))
                && topic.is_some_and(|t| u64::from(t.message_expiry) == 7_200_000_000)
        },
    )
    .await?;
    for &(partition, offset) in &consumed {
        wait_until("the group translated", WAIT, || async {
            translated_exactly((&up, &down), (STREAM, TOPIC), "billing", partition, offset)
                .await
                .unwrap_or(false)
        })
        .await?;
    }
    cluster.restart(runner)?;

    // Cut over, activating the application's user with the password the operator chose.
    promote_activating(&cluster, "60s", 0).await?;

    // The application logs in on the target as itself and continues where it was.
    let app = app_on_the_target(&servers, target).await?;
    for &(partition, offset) in &consumed {
        let next = group_next_message(&app, (STREAM, TOPIC), "billing", partition).await?;
        let want = message_id_at(&up, (STREAM, TOPIC), partition, offset + 1).await?;
        assert_eq!(
            next.map(|m| m.id),
            Some(want),
            "partition {partition} continues at the next message, as {APP}"
        );
    }
    // Its rights are the translated ones: reading streams globally was taken away upstream.
    assert!(app.get_streams().await.is_err(), "no global read_streams");
    let _ = app.shutdown().await;
    cluster.passed();
    drop(cluster);
    servers.shutdown().await;
    Ok(())
}

/// The source is lost before the cutover: promote cannot say what was not copied (exit 3), but
/// it activates the user from the target's copy, as the last sync round left it.
#[test]
fn without_the_source_promote_activates_the_targets_copy_of_the_user() -> TestResult {
    serial(|| async {
        let servers = Servers::start(Topic::new(STREAM, TOPIC, PARTITIONS)).await?;
        let replication = fixture::up_and_down(&servers).flow(
            FlowEntry::new("fwd", "up", "down", format!("{STREAM}/*"))
                .extra("users = [\"app-*\"]\nmetadata_sync_interval = \"300ms\""),
        );
        let mut cluster = ReplicatorCluster::start(
            fixture::spec_of(&replication, PARTITIONS as usize, false)?,
            3,
        )
        .await?;
        let up = connect(&servers.upstream.connection_string()).await?;
        let down = connect(&servers.downstream.connection_string()).await?;
        up.create_user(
            APP,
            "upstream-only",
            UserStatus::Active,
            Some(app_permissions(&up, false).await?),
        )
        .await?;
        produce(&up, 0..100).await?;
        wait_until("the user on the target", WAIT, || async {
            down.get_user(&id(APP).unwrap())
                .await
                .ok()
                .flatten()
                .is_some()
        })
        .await?;
        servers.wait_caught_up(WAIT).await?;

        let faults = servers.upstream.faults();
        faults.refuse_connections(true);
        faults.drop_connections();
        promote_activating(&cluster, "3s", 3).await?;
        let app = app_on_the_target(&servers, IggyVersion::V0_8).await?;
        let polled = app
            .poll_messages(
                &id(STREAM)?,
                &id(TOPIC)?,
                Some(0),
                &iggy::prelude::Consumer::new(id("reader")?),
                &iggy::prelude::PollingStrategy::offset(0),
                10,
                false,
            )
            .await?;
        assert_eq!(polled.messages.len(), 10, "it reads with its synced rights");
        let _ = app.shutdown().await;
        faults.refuse_connections(false);
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}

#[test]
fn an_application_user_continues_on_an_iggy_0_8_target_after_promote() -> TestResult {
    serial(|| app_user_continues_on_the_target(IggyVersion::V0_8))
}

#[test]
fn an_application_user_continues_on_an_iggy_0_9_target_after_promote() -> TestResult {
    serial(|| app_user_continues_on_the_target(IggyVersion::V0_9))
}
