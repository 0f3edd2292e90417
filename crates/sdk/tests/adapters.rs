//! Each SDK adapter against the testkit server of its generation: the same scenario, written
//! once against [`IggyCluster`], must hold for both. It pins what the replicator relies on:
//! every field of a message round-trips, offsets are stored and read back, and the errors the
//! pipeline acts on get the same [`ErrorKind`] whichever generation answered.
//!
//! Against a real server: `IGGY_CONFORMANCE_URL=iggy://iggy:iggy@127.0.0.1:8090` and
//! `IGGY_CONFORMANCE_VERSION=0.8` or `0.9` (default 0.8) run that generation's test on it
//! instead (the other still runs in-process); names are unique per run and removed after.

use assert2::check;
use bytes::Bytes;
use iggy::prelude::{
    CompressionAlgorithm, Consumer, GlobalPermissions, Identifier, IggyExpiry, MaxTopicSize,
    Partitioning, Permissions, PollingStrategy, UserStatus,
};
use replicator_model::IggyVersion;
use replicator_sdk::{ClientConfig, ErrorKind, IggyCluster, Message};
use replicator_testkit::{TestServer, TestServerConfig};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn server(version: IggyVersion) -> Result<TestServer, Box<dyn std::error::Error>> {
    Ok(TestServer::start(TestServerConfig {
        iggy_version: version,
        ..TestServerConfig::default()
    })
    .await?)
}

async fn connected(
    config: &ClientConfig,
) -> Result<replicator_sdk::Client, Box<dyn std::error::Error>> {
    let client = config.client()?;
    client.connect().await?;
    Ok(client)
}

/// The real server for `version`'s test, if `IGGY_CONFORMANCE_URL` names one.
fn remote(version: IggyVersion) -> Option<String> {
    let wanted = std::env::var("IGGY_CONFORMANCE_VERSION").unwrap_or_else(|_| "0.8".into());
    let url = std::env::var("IGGY_CONFORMANCE_URL").ok()?;
    (!url.is_empty() && wanted == version.to_string()).then_some(url)
}

/// Names no earlier run on the same server used.
struct Names {
    stream: String,
    user: String,
}

impl Names {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            stream: format!("adapters-{}-{nanos}", std::process::id()),
            user: format!("reader-{}", nanos % 1_000_000_000_000),
        }
    }
}

/// The scenario, for any adapter.
async fn conformance(c: &impl IggyCluster, names: &Names) -> TestResult {
    let stream = Identifier::named(&names.stream)?;
    let topic = Identifier::named("orders")?;
    c.create_stream(&names.stream).await?;
    let exists = c.create_stream(&names.stream).await.unwrap_err();
    check!(exists.kind() == ErrorKind::AlreadyExists);
    c.create_topic(
        &stream,
        "orders",
        2,
        CompressionAlgorithm::None,
        None,
        IggyExpiry::NeverExpire,
        MaxTopicSize::ServerDefault,
    )
    .await?;
    check!(c
        .get_topic(&stream, &Identifier::named("none")?)
        .await?
        .is_none());

    // Every field the replicator copies round-trips, in order; and the batch sent is whole
    // again after the send (the writer keeps it for a retry).
    let headers = Bytes::from_static(b"\x01\x00\x00\x00kraw-headers-as-encoded");
    let mut sent: Vec<Message> = (0..5u64)
        .map(|i| {
            Message::new(
                1000 + u128::from(i),
                1_600_000_000_000_000 + i,
                Bytes::from(format!("payload-{i}")),
            )
            .with_user_headers((i % 2 == 0).then(|| headers.clone()))
        })
        .collect();
    let kept = sent.clone();
    c.send_messages(&stream, &topic, &Partitioning::partition_id(1), &mut sent)
        .await?;
    check!(sent == kept);
    let consumer = Consumer::new(Identifier::numeric(1)?);
    let polled = c
        .poll_messages(
            &stream,
            &topic,
            Some(1),
            &consumer,
            &PollingStrategy::offset(0),
            10,
            false,
        )
        .await?;
    check!(polled.partition == 1);
    check!(polled.current_offset == 4);
    check!(polled.messages.len() == 5);
    for (i, (got, want)) in polled.messages.iter().zip(&sent).enumerate() {
        check!(got.offset == i as u64);
        check!(got.id == want.id);
        check!(got.origin_timestamp == want.origin_timestamp);
        check!(got.payload == want.payload);
        check!(got.user_headers == want.user_headers);
        check!(got.timestamp > 0, "the server stamps its own append time");
    }

    // Offsets a consumer stores are read back as stored.
    check!(c
        .get_consumer_offset(&consumer, &stream, &topic, Some(1))
        .await?
        .is_none());
    c.store_consumer_offset(&consumer, &stream, &topic, Some(1), 3)
        .await?;
    let stored = c
        .get_consumer_offset(&consumer, &stream, &topic, Some(1))
        .await?
        .expect("an offset was stored");
    check!(
        (
            stored.partition,
            stored.stored_offset,
            stored.current_offset
        ) == (1, 3, 4)
    );

    // What the pipeline acts on: a missing topic, a user without the permission.
    let missing = c
        .poll_messages(
            &stream,
            &Identifier::named("none")?,
            Some(1),
            &consumer,
            &PollingStrategy::offset(0),
            1,
            false,
        )
        .await
        .unwrap_err();
    check!(missing.kind() == ErrorKind::Missing, "{missing}");
    let reader = Permissions {
        global: GlobalPermissions {
            read_streams: true,
            ..GlobalPermissions::default()
        },
        streams: None,
    };
    c.create_user(
        &names.user,
        "reader-secret",
        UserStatus::Active,
        Some(reader),
    )
    .await?;
    check!(c
        .get_user(&Identifier::named(&names.user)?)
        .await?
        .is_some_and(|u| u.status == UserStatus::Active));
    Ok(())
}

/// Logs in as the reader and tries a send: refused as unauthorized. Then a wrong password.
async fn refusals(config: &ClientConfig, names: &Names) -> TestResult {
    let reader = connected(&config.with_login(&names.user, "reader-secret")).await?;
    let mut one = [Message::new(1, 1, Bytes::from_static(b"x"))];
    let refused = reader
        .send_messages(
            &Identifier::named(&names.stream)?,
            &Identifier::named("orders")?,
            &Partitioning::partition_id(1),
            &mut one,
        )
        .await
        .unwrap_err();
    check!(refused.kind() == ErrorKind::Unauthorized, "{refused}");
    let _ = reader.shutdown().await;

    let wrong = config
        .with_login(&names.user, "not-the-password")
        .client()?;
    let rejected = wrong.connect().await.unwrap_err();
    check!(
        rejected.kind() == ErrorKind::CredentialsRejected,
        "{rejected}"
    );
    Ok(())
}

async fn run(version: IggyVersion) -> TestResult {
    let (server, url) = match remote(version) {
        Some(url) => (None, url),
        None => {
            let server = server(version).await?;
            let url = server.connection_string();
            (Some(server), url)
        }
    };
    let config = ClientConfig::parse(version, &url)?;
    let client = connected(&config).await?;
    check!(client.generation() == version);
    let names = Names::new();
    let outcome = match conformance(&client, &names).await {
        Ok(()) => refusals(&config, &names).await,
        failed => failed,
    };
    // Left behind on a real server otherwise.
    let _ = client.delete_user(&Identifier::named(&names.user)?).await;
    let _ = client
        .delete_stream(&Identifier::named(&names.stream)?)
        .await;
    client.shutdown().await?;
    if let Some(server) = server {
        server.shutdown().await;
    }
    outcome
}

#[tokio::test]
async fn the_08_adapter_holds_the_interface() -> TestResult {
    run(IggyVersion::V0_8).await
}

#[tokio::test]
async fn the_09_adapter_holds_the_interface() -> TestResult {
    run(IggyVersion::V0_9).await
}
