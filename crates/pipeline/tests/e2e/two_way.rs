//! Two-way pairs (issue 47): a flow `us → eu` and one `eu → us`, both syncing users and topic
//! settings. Each object has a home; a flow never treats a copy on its source as an original,
//! only changes travel, a change on both sides is a conflict the home wins, promote moves the
//! homes, and topics are neither copied back nor created again where they were deleted.
//!
//! The metadata rounds are driven by hand (`Cutover::metadata_round`, the periodic interval
//! set to a day), so that the order of the two flows' rounds is the test's: the reverse flow
//! running first is exactly the race that undid operators' changes.

use std::collections::BTreeMap;
use std::time::Duration;

use iggy::prelude::{
    GlobalPermissions, Identifier, IggyDuration, IggyExpiry, Permissions, StreamPermissions,
    UserStatus,
};
use replicator_harness::Client;
use replicator_model::{Naming, WorkUnit};
use replicator_pipeline::{
    ActivationOutcome, Cutover, FlowParams, InMemoryControl, MetadataSyncReport, Pipeline,
    UserSyncState,
};
use replicator_sdk::IggyCluster as _;

use crate::harness::{client, create_topic, flow, wait_until, Env, TestResult};

const WAIT: Duration = Duration::from_secs(30);
const FORWARD: &str = "us-to-eu";
const BACK: &str = "eu-to-us";

fn hours(h: u64) -> IggyExpiry {
    IggyExpiry::ExpireDuration(IggyDuration::from(h * 3_600_000_000))
}

/// The runbook's pair: `us-to-eu` and `eu-to-us` over `include`, syncing `app-*` users, with
/// `naming` both ways and rounds only when the test runs them.
fn pair(include: &[&str], naming: Naming) -> (FlowParams, FlowParams) {
    let mut forward = flow(FORWARD, include);
    let mut back = flow(BACK, include);
    back.source = "eu".into();
    back.target = "us".into();
    for f in [&mut forward, &mut back] {
        f.naming = naming;
        f.users = vec!["app-*".into()];
        f.metadata_sync_interval = Duration::from_secs(86_400);
    }
    (forward, back)
}

async fn start(
    env: &Env,
    include: &[&str],
    naming: Naming,
) -> TestResult<(Pipeline, InMemoryControl)> {
    let (forward, back) = pair(include, naming);
    let mut params = env.params(forward);
    params.flows.push(back);
    let control = InMemoryControl::new();
    Ok((Pipeline::start(params, control.clone()).await?, control))
}

/// `rounds` rounds of each flow, `first` first in each.
async fn rounds(
    cutover: &Cutover,
    first: &str,
    rounds: usize,
) -> TestResult<BTreeMap<String, MetadataSyncReport>> {
    let second = if first == FORWARD { BACK } else { FORWARD };
    let mut last = BTreeMap::new();
    for _ in 0..rounds {
        for f in [first, second] {
            let report = cutover.metadata_round(f).await.ok_or("flow not run here")?;
            last.insert(f.to_owned(), report);
        }
    }
    Ok(last)
}

async fn user(c: &Client, name: &str) -> TestResult<Option<(UserStatus, Option<Permissions>)>> {
    Ok(c.get_user(&Identifier::named(name)?)
        .await?
        .map(|u| (u.status, u.permissions)))
}

async fn status(c: &Client, name: &str) -> TestResult<Option<UserStatus>> {
    Ok(user(c, name).await?.map(|(s, _)| s))
}

async fn expiry(c: &Client, stream: &str, topic: &str) -> TestResult<u64> {
    let t = c
        .get_topic(&Identifier::named(stream)?, &Identifier::named(topic)?)
        .await?
        .ok_or("topic missing")?;
    Ok(u64::from(t.message_expiry))
}

/// Sets `stream/topic`'s message expiry, as an operator would, keeping its other settings.
async fn set_expiry(c: &Client, stream: &str, topic: &str, to: IggyExpiry) -> TestResult {
    let (s, t) = (Identifier::named(stream)?, Identifier::named(topic)?);
    let now = c.get_topic(&s, &t).await?.ok_or("topic missing")?;
    c.update_topic(
        &s,
        &t,
        topic,
        now.compression_algorithm,
        None,
        to,
        now.max_topic_size,
    )
    .await?;
    Ok(())
}

async fn has_topic(c: &Client, stream: &str, topic: &str) -> TestResult<bool> {
    Ok(
        c.get_topic(&Identifier::named(stream)?, &Identifier::named(topic)?)
            .await?
            .is_some(),
    )
}

fn user_report<'r>(
    report: &'r MetadataSyncReport,
    name: &str,
) -> TestResult<&'r replicator_pipeline::UserReport> {
    Ok(report
        .users
        .iter()
        .find(|u| u.name == name)
        .ok_or_else(|| format!("{name} not in the report of {}", report.flow))?)
}

/// Rights on `audit`, a stream neither flow copies: the reverse flow, translating a copy's
/// permissions back, would have dropped them from the original.
fn home_permissions(audit: u32) -> Permissions {
    Permissions {
        global: GlobalPermissions {
            read_streams: true,
            ..GlobalPermissions::default()
        },
        streams: Some(BTreeMap::from([(
            audit as usize,
            StreamPermissions {
                read_stream: true,
                ..StreamPermissions::default()
            },
        )])),
    }
}

/// Both servers, `orders/created` and `audit/log` on `us`, and `app-billing` authored on `us`
/// with rights on `audit` ([`home_permissions`]).
async fn with_home_user() -> TestResult<(Env, Client, Client)> {
    let env = Env::start().await?;
    let (us, eu) = (client(&env.us).await?, client(&env.eu).await?);
    create_topic(&us, "orders", "created", 1).await?;
    create_topic(&us, "audit", "log", 1).await?;
    let audit = us
        .get_stream(&Identifier::named("audit")?)
        .await?
        .ok_or("no audit")?
        .id;
    us.create_user(
        "app-billing",
        "billing-secret",
        UserStatus::Active,
        Some(home_permissions(audit)),
    )
    .await?;
    Ok((env, us, eu))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_way_pair_leaves_home_users_and_operator_settings_as_the_operator_left_them(
) -> TestResult {
    let (env, us, eu) = with_home_user().await?;
    eu.create_user("app-reports", "reports-secret", UserStatus::Active, None)
        .await?;
    let home_rights = user(&us, "app-billing").await?.ok_or("no user")?.1;
    let (pipeline, _) = start(&env, &["orders/*"], Naming::Identity).await?;
    let cutover = pipeline.cutover();
    wait_until("orders/created on eu", WAIT, || async {
        has_topic(&eu, "orders", "created").await.unwrap_or(false)
    })
    .await?;

    // Each user is copied away from its home, inactive, and its home is left alone: many
    // rounds of both flows, in both orders.
    rounds(&cutover, BACK, 3).await?;
    let reports = rounds(&cutover, FORWARD, 3).await?;
    assert!(status(&eu, "app-billing").await? == Some(UserStatus::Inactive));
    assert!(status(&us, "app-reports").await? == Some(UserStatus::Inactive));
    for _ in 0..5 {
        assert!(user(&us, "app-billing").await? == Some((UserStatus::Active, home_rights.clone())));
        assert!(status(&eu, "app-reports").await? == Some(UserStatus::Active));
        rounds(&cutover, BACK, 2).await?;
    }
    let billing = user_report(&reports[FORWARD], "app-billing")?;
    assert!(billing.home.as_deref() == Some("us"), "{billing:?}");
    let billing_back = user_report(&reports[BACK], "app-billing")?;
    assert!(
        billing_back.state == UserSyncState::HomeOnTarget,
        "{billing_back:?}"
    );
    let reports_user = user_report(&reports[FORWARD], "app-reports")?;
    assert!(
        reports_user.state == UserSyncState::HomeOnTarget,
        "{reports_user:?}"
    );

    // An operator's change on either side reaches the other and stays, whichever flow runs
    // first after it.
    set_expiry(&us, "orders", "created", hours(7 * 24)).await?;
    rounds(&cutover, BACK, 3).await?;
    assert!(expiry(&us, "orders", "created").await? == u64::from(hours(7 * 24)));
    assert!(expiry(&eu, "orders", "created").await? == u64::from(hours(7 * 24)));
    set_expiry(&eu, "orders", "created", hours(2)).await?;
    let reports = rounds(&cutover, FORWARD, 3).await?;
    assert!(expiry(&us, "orders", "created").await? == u64::from(hours(2)));
    assert!(expiry(&eu, "orders", "created").await? == u64::from(hours(2)));
    let topic = &reports[FORWARD].topics[0];
    assert!(
        topic.home.as_deref() == Some("us") && topic.conflicts.is_empty(),
        "{topic:?}"
    );

    // Both sides changed between two rounds: a conflict, reported by both flows, and the
    // home's value wins for good.
    set_expiry(&us, "orders", "created", hours(3)).await?;
    set_expiry(&eu, "orders", "created", hours(5)).await?;
    let first = rounds(&cutover, BACK, 1).await?;
    let conflict = |f: &str| first[f].topics[0].conflicts.clone();
    assert!(
        conflict(FORWARD).len() == 1 && conflict(FORWARD)[0].applied_here,
        "{first:?}"
    );
    assert!(conflict(FORWARD)[0].winner == "us");
    assert!(
        conflict(BACK).len() == 1 && !conflict(BACK)[0].applied_here,
        "{first:?}"
    );
    rounds(&cutover, FORWARD, 3).await?;
    assert!(expiry(&us, "orders", "created").await? == u64::from(hours(3)));
    assert!(expiry(&eu, "orders", "created").await? == u64::from(hours(3)));
    let state = cutover.metadata_sync_state();
    assert!(state[FORWARD].conflicts_resolved == 1, "{state:?}");
    assert!(state[BACK].conflicts_resolved == 0);
    assert!(state[FORWARD].last.topics[0].conflicts.is_empty());
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_moves_the_homes_and_fail_back_moves_them_again() -> TestResult {
    let (env, us, eu) = with_home_user().await?;
    let home_rights = user(&us, "app-billing").await?.ok_or("no user")?.1;
    let (pipeline, _) = start(&env, &["orders/*"], Naming::Identity).await?;
    let cutover = pipeline.cutover();
    wait_until("orders/created on eu", WAIT, || async {
        has_topic(&eu, "orders", "created").await.unwrap_or(false)
    })
    .await?;
    rounds(&cutover, FORWARD, 2).await?;
    assert!(status(&eu, "app-billing").await? == Some(UserStatus::Inactive));

    // Fail over: the user is activated on eu, which becomes its home and the topic's.
    let passwords = BTreeMap::from([("app-billing".to_owned(), "eu-password-1".to_owned())]);
    let (_, activated, errors) = cutover
        .promote_metadata(FORWARD, &passwords)
        .await
        .ok_or("not run")?;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(activated[0].outcome == ActivationOutcome::Activated);
    let reports = rounds(&cutover, BACK, 3).await?;
    let back = user_report(&reports[BACK], "app-billing")?;
    assert!(
        back.home.as_deref() == Some("eu") && back.state == UserSyncState::InSync,
        "{back:?}"
    );
    // Both are active now, and neither flow deactivates the other's; the original keeps its
    // rights on `audit`, which no flow copies into (the copy has none there).
    assert!(user(&us, "app-billing").await? == Some((UserStatus::Active, home_rights)));
    assert!(status(&eu, "app-billing").await? == Some(UserStatus::Active));
    // A conflict is now decided for eu.
    set_expiry(&us, "orders", "created", hours(6)).await?;
    set_expiry(&eu, "orders", "created", hours(4)).await?;
    rounds(&cutover, FORWARD, 2).await?;
    assert!(expiry(&us, "orders", "created").await? == u64::from(hours(4)));
    assert!(expiry(&eu, "orders", "created").await? == u64::from(hours(4)));

    // Fail back: us is the home again.
    let passwords = BTreeMap::from([("app-billing".to_owned(), "us-password-1".to_owned())]);
    let (_, activated, errors) = cutover
        .promote_metadata(BACK, &passwords)
        .await
        .ok_or("not run")?;
    assert!(errors.is_empty(), "{errors:?}");
    assert!(activated[0].outcome == ActivationOutcome::AlreadyActive);
    let reports = rounds(&cutover, FORWARD, 2).await?;
    let forward = user_report(&reports[FORWARD], "app-billing")?;
    assert!(forward.home.as_deref() == Some("us"), "{forward:?}");
    assert!(reports[FORWARD].topics[0].home.as_deref() == Some("us"));
    assert!(status(&us, "app-billing").await? == Some(UserStatus::Active));
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_on_its_home_is_not_created_there_again() -> TestResult {
    let env = Env::start().await?;
    let (us, eu) = (client(&env.us).await?, client(&env.eu).await?);
    create_topic(&us, "orders", "created", 1).await?;
    create_topic(&eu, "orders", "refunds", 1).await?;
    let (pipeline, control) = start(&env, &["orders/*"], Naming::Identity).await?;
    let cutover = pipeline.cutover();
    // Created once on the other side, each.
    wait_until("each topic on the other side", WAIT, || async {
        has_topic(&eu, "orders", "created").await.unwrap_or(false)
            && has_topic(&us, "orders", "refunds").await.unwrap_or(false)
    })
    .await?;
    let reports = rounds(&cutover, FORWARD, 1).await?;
    let home = |stream: &str, topic: &str| {
        reports[FORWARD]
            .topics
            .iter()
            .find(|t| t.stream == stream && t.topic == topic)
            .and_then(|t| t.home.clone())
    };
    assert!(
        home("orders", "created").as_deref() == Some("us"),
        "{reports:?}"
    );
    assert!(
        home("orders", "refunds").as_deref() == Some("eu"),
        "{reports:?}"
    );

    // Deleted on its home: the copy on eu stays, and eu-to-us does not create it again.
    us.delete_topic(
        &Identifier::named("orders")?,
        &Identifier::named("created")?,
    )
    .await?;
    let copied_back = WorkUnit::new(BACK, "orders", "created", 0);
    wait_until("eu-to-us drops the deleted topic", WAIT, || async {
        !control.is_present(&copied_back)
    })
    .await?;
    assert!(!has_topic(&us, "orders", "created").await?);
    assert!(has_topic(&eu, "orders", "created").await?);
    // Its own units go on.
    assert!(control.is_present(&WorkUnit::new(BACK, "orders", "refunds", 0)));
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefixed_pair_does_not_copy_copies_back() -> TestResult {
    let env = Env::start().await?;
    let (us, eu) = (client(&env.us).await?, client(&env.eu).await?);
    create_topic(&us, "orders", "created", 1).await?;
    create_topic(&eu, "orders", "local", 1).await?;
    let (pipeline, control) = start(&env, &["*/*"], Naming::Prefix).await?;
    wait_until("each side's copy of the other", WAIT, || async {
        has_topic(&eu, "us.orders", "created")
            .await
            .unwrap_or(false)
            && has_topic(&us, "eu.orders", "local").await.unwrap_or(false)
    })
    .await?;
    // A round of each discovery after the copies exist: markers created now are found by it.
    create_topic(&us, "marker", "m", 1).await?;
    create_topic(&eu, "marker", "m", 1).await?;
    wait_until("both discoveries ran again", WAIT, || async {
        control.is_present(&WorkUnit::new(FORWARD, "marker", "m", 0))
            && control.is_present(&WorkUnit::new(BACK, "marker", "m", 0))
    })
    .await?;
    assert!(!has_topic(&us, "eu.us.orders", "created").await?);
    assert!(!has_topic(&eu, "us.eu.orders", "local").await?);
    let copies_of_copies = control
        .known_units()
        .into_iter()
        .filter(|u| {
            (u.flow == BACK && u.stream.starts_with("us."))
                || (u.flow == FORWARD && u.stream.starts_with("eu."))
        })
        .count();
    assert!(copies_of_copies == 0);
    pipeline.shutdown().await;
    Ok(())
}
