//! Metadata sync: users with their permissions and topic settings follow upstream, and a
//! promote activates a synced user so that an application can log in on the target.

use std::collections::BTreeMap;
use std::time::Duration;

use iggy::prelude::{
    Consumer, GlobalPermissions, Identifier, IggyDuration, IggyExpiry, MaxTopicSize, Permissions,
    PollingStrategy, StreamPermissions, TopicPermissions, UserStatus,
};
use replicator_harness::{connect, Endpoint};
use replicator_model::{Naming, TopicSetting};
use replicator_pipeline::{ActivationOutcome, Pipeline, UserSyncState};
use replicator_sdk::IggyCluster as _;

use crate::harness::{client, create_topic, flow, produce, wait_until, Env, TestResult};

const WAIT: Duration = Duration::from_secs(30);

fn read_topic() -> TopicPermissions {
    TopicPermissions {
        read_topic: true,
        poll_messages: true,
        ..TopicPermissions::default()
    }
}

/// `read_streams` globally, `send_messages` on `orders` (upstream id `orders`), reading
/// `orders/created`, and something on `audit` (not copied by the flow).
fn upstream_permissions(orders: u32, created: u32, audit: u32) -> Permissions {
    let orders_rights = StreamPermissions {
        send_messages: true,
        topics: Some(BTreeMap::from([(created as usize, read_topic())])),
        ..StreamPermissions::default()
    };
    Permissions {
        global: GlobalPermissions {
            read_streams: true,
            ..GlobalPermissions::default()
        },
        streams: Some(BTreeMap::from([
            (orders as usize, orders_rights),
            (audit as usize, StreamPermissions::default()),
        ])),
    }
}

async fn ids(c: &replicator_harness::Client, stream: &str, topic: &str) -> TestResult<(u32, u32)> {
    let t = c
        .get_topic(&Identifier::named(stream)?, &Identifier::named(topic)?)
        .await?
        .ok_or("topic missing")?;
    let s = c
        .get_stream(&Identifier::named(stream)?)
        .await?
        .ok_or("stream missing")?;
    Ok((s.id, t.id))
}

fn hours(h: u64) -> IggyExpiry {
    IggyExpiry::ExpireDuration(IggyDuration::from(h * 3_600_000_000))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_topic_settings_follow_upstream_and_promote_activates_a_user() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    let down = client(&env.eu).await?;
    create_topic(&up, "orders", "created", 1).await?;
    create_topic(&up, "audit", "log", 1).await?;
    produce(&up, "orders", "created", 1, 0..10, 10).await?;
    let (orders, created) = ids(&up, "orders", "created").await?;
    let (audit, _) = ids(&up, "audit", "log").await?;
    up.create_user(
        "app-billing",
        "upstream-secret",
        UserStatus::Active,
        Some(upstream_permissions(orders, created, audit)),
    )
    .await?;
    up.create_user("ops-admin", "x-secret", UserStatus::Active, None)
        .await?;

    let mut f = flow("meta", &["orders/*"]);
    f.naming = Naming::Prefix;
    f.users = vec!["app-*".into()];
    f.keep_target_settings = [TopicSetting::MaxTopicSize].into();
    f.metadata_sync_interval = Duration::from_millis(300);
    let pipeline = Pipeline::start(
        env.params(f.clone()),
        replicator_pipeline::InMemoryControl::new(),
    )
    .await?;
    env.wait_downstream("us.orders", "created", 0, 10).await?;

    // The user is on the target, inactive, with its permissions on the target's ids.
    let name = Identifier::named("app-billing")?;
    wait_until("app-billing on the target", WAIT, || async {
        matches!(down.get_user(&name).await, Ok(Some(_)))
    })
    .await?;
    let (d_orders, d_created) = ids(&down, "us.orders", "created").await?;
    let copy = down.get_user(&name).await?.ok_or("no user")?;
    assert!(copy.status == UserStatus::Inactive);
    let streams = copy
        .permissions
        .clone()
        .and_then(|p| p.streams)
        .ok_or("no streams")?;
    assert!(streams.len() == 1, "{streams:?}");
    let on_orders = &streams[&(d_orders as usize)];
    assert!(on_orders.send_messages);
    assert!(on_orders
        .topics
        .as_ref()
        .is_some_and(|t| t[&(d_created as usize)] == read_topic()));
    assert!(copy
        .permissions
        .as_ref()
        .is_some_and(|p| p.global.read_streams));
    // Users no glob selects stay upstream.
    assert!(down
        .get_user(&Identifier::named("ops-admin")?)
        .await?
        .is_none());

    // Changes upstream follow: permissions, and the topic's expiry (its size limit is kept).
    let mut changed = upstream_permissions(orders, created, audit);
    changed.global.read_streams = false;
    up.update_permissions(&name, Some(changed)).await?;
    let (s, t) = (Identifier::named("orders")?, Identifier::named("created")?);
    let before = down
        .get_topic(&Identifier::named("us.orders")?, &t)
        .await?
        .ok_or("no topic")?;
    up.update_topic(
        &s,
        &t,
        "created",
        before.compression_algorithm,
        None,
        hours(2),
        // At least one segment: a 0.9 source refuses a smaller cap.
        MaxTopicSize::from(5 * 1024 * 1024 * 1024),
    )
    .await?;
    wait_until("permissions and expiry on the target", WAIT, || async {
        let user = down.get_user(&name).await.ok().flatten();
        let topic = down
            .get_topic(
                &Identifier::named("us.orders").unwrap(),
                &Identifier::named("created").unwrap(),
            )
            .await
            .ok()
            .flatten();
        user.is_some_and(|u| u.permissions.is_some_and(|p| !p.global.read_streams))
            && topic.is_some_and(|t| u64::from(t.message_expiry) == u64::from(hours(2)))
    })
    .await?;
    let after = down
        .get_topic(&Identifier::named("us.orders")?, &t)
        .await?
        .ok_or("no topic")?;
    assert!(u64::from(after.max_topic_size) == u64::from(before.max_topic_size));

    // Status names what it could not translate and what it keeps.
    let cutover = pipeline.cutover();
    // A round after the changes finds the user in sync (and the next one too: nothing flaps).
    let in_sync = |s: &replicator_pipeline::MetadataSyncState| {
        s.last
            .users
            .iter()
            .any(|u| u.name == "app-billing" && u.state == UserSyncState::InSync)
            && s.last
                .topics
                .iter()
                .any(|t| t.differences.iter().any(|d| d.setting == "max_topic_size"))
    };
    wait_until("a round that finds everything in sync", WAIT, || async {
        cutover
            .metadata_sync_state()
            .get("meta")
            .is_some_and(in_sync)
    })
    .await?;
    let runs = cutover.metadata_sync_state()["meta"].runs;
    wait_until("the next round", WAIT, || async {
        cutover.metadata_sync_state()["meta"].runs > runs
    })
    .await?;
    let state = cutover.metadata_sync_state()["meta"].clone();
    let user = state
        .last
        .users
        .iter()
        .find(|u| u.name == "app-billing")
        .ok_or("no report")?;
    assert!(in_sync(&state), "{state:?}");
    assert!(
        user.not_translated == vec!["stream audit: no flow to this target copies it".to_owned()]
    );
    // Neither the untranslated stream nor the kept setting is a drift to alert on.
    assert!(state.user_drift() == 0 && state.settings_drift() == 0);
    assert!(state.settings_applied >= 1 && state.users_changed >= 2);

    // Promote's activation: the application logs in on the target and reads its topic.
    let passwords = BTreeMap::from([
        ("app-billing".to_owned(), "target-secret".to_owned()),
        ("ops-admin".to_owned(), "nope".to_owned()),
    ]);
    let (_, activated, errors) = cutover
        .promote_metadata("meta", &passwords)
        .await
        .ok_or("no flow")?;
    assert!(errors.is_empty(), "{errors:?}");
    let outcome = |n: &str| activated.iter().find(|a| a.name == n).map(|a| a.outcome);
    assert!(outcome("app-billing") == Some(ActivationOutcome::Activated));
    assert!(outcome("ops-admin") == Some(ActivationOutcome::NotSynced));
    let address = env.eu.connection_string();
    let address = address.rsplit_once('@').ok_or("no address")?.1;
    let app = connect(Endpoint::new(
        env.eu.iggy_version(),
        format!("iggy://app-billing:target-secret@{address}"),
    ))
    .await?;
    let polled = app
        .poll_messages(
            &Identifier::named("us.orders")?,
            &t,
            Some(0),
            &Consumer::new(Identifier::named("billing")?),
            &PollingStrategy::offset(0),
            100,
            false,
        )
        .await?;
    assert!(polled.messages.len() == 10);
    let active = down.get_user(&name).await?.ok_or("no user")?;
    assert!(active.status == UserStatus::Active);
    assert!(active.permissions.is_some_and(|p| !p.global.read_streams));
    // A second activation leaves it alone.
    let (_, again, _) = cutover
        .promote_metadata("meta", &passwords)
        .await
        .ok_or("no flow")?;
    assert!(again[0].outcome == ActivationOutcome::AlreadyActive);

    // Deleted upstream: reported, kept on the target (the flow does not delete users).
    up.delete_user(&name).await?;
    wait_until("deletion reported", WAIT, || async {
        cutover.metadata_sync_state()["meta"]
            .last
            .users
            .iter()
            .any(|u| u.name == "app-billing" && u.state == UserSyncState::RemovedUpstream)
    })
    .await?;
    assert!(down.get_user(&name).await?.is_some());
    pipeline.shutdown().await;
    Ok(())
}

/// A setting the target refuses does not hold back the others: a size cap below one segment
/// (which an Iggy 0.9 target refuses on update; 0.8 takes it) is reported as a difference,
/// while the expiry and compression changed with it arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_setting_does_not_hold_back_the_others() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    let down = client(&env.eu).await?;
    create_topic(&up, "caps", "t", 1).await?;
    let mut f = flow("caps", &["caps/*"]);
    f.metadata_sync_interval = Duration::from_millis(300);
    let pipeline = Pipeline::start(
        env.params(f.clone()),
        replicator_pipeline::InMemoryControl::new(),
    )
    .await?;
    let (s, t) = (Identifier::named("caps")?, Identifier::named("t")?);
    wait_until("the topic on the target", WAIT, || async {
        matches!(down.get_topic(&s, &t).await, Ok(Some(_)))
    })
    .await?;
    // A 0.9 source refuses such a cap itself; there the whole update arrives.
    let cap = match env.us.iggy_version() {
        replicator_model::IggyVersion::V0_8 => 1_048_576,
        _ => 5 * 1024 * 1024 * 1024,
    };
    up.update_topic(
        &s,
        &t,
        "t",
        iggy::prelude::CompressionAlgorithm::Gzip,
        None,
        hours(3),
        MaxTopicSize::from(cap),
    )
    .await?;
    wait_until("expiry and compression on the target", WAIT, || async {
        down.get_topic(&s, &t)
            .await
            .ok()
            .flatten()
            .is_some_and(|d| {
                u64::from(d.message_expiry) == u64::from(hours(3))
                    && d.compression_algorithm == iggy::prelude::CompressionAlgorithm::Gzip
            })
    })
    .await?;
    let cutover = pipeline.cutover();
    let refused = |st: &replicator_pipeline::MetadataSyncState| {
        st.last.topics.iter().any(|t| {
            t.differences
                .iter()
                .any(|d| d.setting == "max_topic_size" && !d.kept)
        })
    };
    let down_size = down
        .get_topic(&s, &t)
        .await?
        .ok_or("no topic")?
        .max_topic_size;
    if env.eu.iggy_version() == replicator_model::IggyVersion::V0_8 || cap > 1_048_576 {
        wait_until("the cap on the target", WAIT, || async {
            down.get_topic(&s, &t)
                .await
                .ok()
                .flatten()
                .is_some_and(|d| u64::from(d.max_topic_size) == cap)
        })
        .await?;
    } else {
        assert!(u64::from(down_size) != cap);
        wait_until("the refused cap reported", WAIT, || async {
            cutover
                .metadata_sync_state()
                .get("caps")
                .is_some_and(refused)
        })
        .await?;
        let state = cutover.metadata_sync_state()["caps"].clone();
        assert!(state.settings_drift() == 1, "{state:?}");
        assert!(state
            .last
            .errors
            .iter()
            .any(|e| e.contains("max_topic_size")));
    }
    pipeline.shutdown().await;
    Ok(())
}

/// `users = ["*"]` never syncs the replicator's own users: the root, the user the
/// connections log in as, and writer identities (by their prefix, of any cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replicators_own_users_are_never_synced() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    let down = client(&env.eu).await?;
    create_topic(&up, "own", "t", 1).await?;
    for name in ["app-x", "iggy-replicator-n9-i1"] {
        up.create_user(name, "upstream-secret", UserStatus::Active, None)
            .await?;
    }
    let mut f = flow("own", &["own/*"]);
    f.users = vec!["*".into()];
    f.metadata_sync_interval = Duration::from_millis(300);
    let mut params = env.params(f);
    // Writer identities are named after the prefix of the cluster they write to; `us` has one
    // here although no flow writes to it.
    if let Some(us) = params.clusters.get_mut("us") {
        us.writer_user_prefix = Some("iggy-replicator".into());
    }
    let pipeline = Pipeline::start(params, replicator_pipeline::InMemoryControl::new()).await?;
    let cutover = pipeline.cutover();
    wait_until("a round that synced app-x", WAIT, || async {
        cutover
            .metadata_sync_state()
            .get("own")
            .is_some_and(|s| s.last.users.iter().any(|u| u.name == "app-x"))
    })
    .await?;
    let state = cutover.metadata_sync_state()["own"].clone();
    let names: Vec<&str> = state.last.users.iter().map(|u| u.name.as_str()).collect();
    assert!(names == vec!["app-x"], "{names:?}");
    assert!(down
        .get_user(&Identifier::named("iggy-replicator-n9-i1")?)
        .await?
        .is_none());
    // The root of the target is as it was: active.
    let root = down
        .get_user(&Identifier::numeric(0)?)
        .await?
        .ok_or("no root")?;
    assert!(root.status == UserStatus::Active);
    pipeline.shutdown().await;
    Ok(())
}
