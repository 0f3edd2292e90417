//! The README runbook's two-way pair with users and topic settings synced on both flows, with
//! three node processes (issue 47): `fwd` (up → down) and `back` (down → up), identity naming,
//! both with `users = ["app-*"]`. Each application user stays as its home cluster has it
//! (active, with rights the copy cannot express) over many rounds of both flows; an operator's
//! `message_expiry` change travels from whichever side made it and stays, also after the node
//! running `fwd`'s rounds is killed; `flow promote fwd --activate-users` lets the application
//! log in on `down` without deactivating its original on `up`, and nothing flip-flops after,
//! also once the killed node is back.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use iggy::prelude::{
    GlobalPermissions, Identifier, IggyDuration, IggyExpiry, Permissions, StreamPermissions,
    TopicPermissions, UserStatus,
};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, serial, tick, wait_until, Client, Deadline, Endpoint, FlowEntry, NodeId,
    ReplicatorCluster, ReplicatorClusterSpec, Servers, TestResult, Topic,
};
use replicator_model::IggyVersion;

use crate::fixture;

const STREAM: &str = "apps";
const TOPIC: &str = "orders";
const PARTITIONS: u32 = 2;
/// A stream on `up` that no flow copies: rights on it cannot be expressed on `down`.
const AUDIT: &str = "audit";
/// The application's user, authored (at home) on `up`.
const BILLING: &str = "app-billing";
/// A user authored (at home) on `down`.
const REPORTS: &str = "app-reports";
const FLOWS: [&str; 2] = ["fwd", "back"];
const WAIT: Duration = Duration::from_secs(60);
/// The password promote gives `app-billing` on `down`.
const TARGET_PASSWORD: &str = "billing-on-down";

fn id(name: &str) -> TestResult<Identifier> {
    Ok(Identifier::named(name)?)
}

fn hours(h: u64) -> IggyExpiry {
    IggyExpiry::ExpireDuration(IggyDuration::from(h * 3_600_000_000))
}

/// The runbook's pair: `fwd` (up → down) and `back` (down → up) over the stream, identity
/// naming (the default), both syncing the `app-*` users and the topics' settings.
fn spec(servers: &Servers) -> TestResult<ReplicatorClusterSpec> {
    let flow = |name: &str, source: &str, target: &str| {
        FlowEntry::new(name, source, target, format!("{STREAM}/*"))
            .extra("users = [\"app-*\"]\nmetadata_sync_interval = \"300ms\"")
    };
    let replication = fixture::up_and_down(servers)
        .flow(flow("fwd", "up", "down"))
        .flow(flow("back", "down", "up"));
    fixture::spec_of(&replication, 2 * PARTITIONS as usize, false)
}

/// `app-billing`'s rights on `up`: it consumes the replicated topic and reads `audit`, which
/// no flow copies (a translation back from the copy would drop that right).
async fn billing_permissions(up: &Client) -> TestResult<Permissions> {
    let stream = up.get_stream(&id(STREAM)?).await?.ok_or("no stream")?;
    let topic = up
        .get_topic(&id(STREAM)?, &id(TOPIC)?)
        .await?
        .ok_or("no topic")?;
    let audit = up.get_stream(&id(AUDIT)?).await?.ok_or("no audit stream")?;
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
    let on_audit = StreamPermissions {
        read_stream: true,
        ..StreamPermissions::default()
    };
    Ok(Permissions {
        global: GlobalPermissions::default(),
        streams: Some(BTreeMap::from([
            (stream.id as usize, on_stream),
            (audit.id as usize, on_audit),
        ])),
    })
}

/// `app-reports`'s rights on `down`: global ones only.
fn reports_permissions() -> Permissions {
    Permissions {
        global: GlobalPermissions {
            read_streams: true,
            read_topics: true,
            ..GlobalPermissions::default()
        },
        streams: None,
    }
}

/// A user's status and permissions, `None` when it does not exist.
async fn user(c: &Client, name: &str) -> TestResult<Option<(UserStatus, Option<Permissions>)>> {
    Ok(c.get_user(&id(name)?)
        .await?
        .map(|u| (u.status, u.permissions)))
}

async fn status(c: &Client, name: &str) -> Option<UserStatus> {
    user(c, name).await.ok().flatten().map(|(s, _)| s)
}

/// The topic's message expiry on `c`, in µs.
async fn expiry(c: &Client) -> TestResult<u64> {
    let topic = c
        .get_topic(&id(STREAM)?, &id(TOPIC)?)
        .await?
        .ok_or("no topic")?;
    Ok(u64::from(topic.message_expiry))
}

/// Sets the topic's message expiry, as an operator would, keeping its other settings.
async fn set_expiry(c: &Client, to: IggyExpiry) -> TestResult {
    let now = c
        .get_topic(&id(STREAM)?, &id(TOPIC)?)
        .await?
        .ok_or("no topic")?;
    c.update_topic(
        &id(STREAM)?,
        &id(TOPIC)?,
        TOPIC,
        now.compression_algorithm,
        None,
        to,
        now.max_topic_size,
    )
    .await?;
    Ok(())
}

/// Metadata sync rounds per flow, summed over the running nodes (each counts the rounds it
/// ran since it started, in `iggy_replicator_metadata_sync_runs_total{flow=…}`); an error
/// when a node does not answer.
async fn rounds(cluster: &ReplicatorCluster) -> TestResult<BTreeMap<String, u64>> {
    let mut sums = BTreeMap::new();
    for node in cluster.running() {
        for (flow, runs) in rounds_of(cluster, node).await? {
            *sums.entry(flow).or_insert(0) += runs;
        }
    }
    Ok(sums)
}

/// The rounds per flow one node ran since it started.
async fn rounds_of(cluster: &ReplicatorCluster, node: NodeId) -> TestResult<BTreeMap<String, u64>> {
    let text = cluster.metrics_of(node).await?;
    let mut runs = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("iggy_replicator_metadata_sync_runs_total{flow=\"")
        else {
            continue;
        };
        let Some((flow, value)) = rest.split_once("\"} ") else {
            continue;
        };
        runs.insert(flow.to_owned(), value.trim().parse::<f64>()? as u64);
    }
    Ok(runs)
}

/// Checks `holds` again and again until the running nodes ran `more` rounds of each of
/// `flows` from now on; fails at the first check that does not hold (a state that changed and
/// changed back within the window fails it too) or when the rounds take longer than [`WAIT`].
async fn over_rounds<F, Fut>(
    cluster: &ReplicatorCluster,
    flows: &[&str],
    more: u64,
    what: &str,
    mut holds: F,
) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = TestResult>,
{
    let what = format!("{more} rounds of {flows:?}: {what}");
    let deadline = Deadline::new(WAIT, what.clone());
    let from = loop {
        match rounds(cluster).await {
            Ok(from) => break from,
            Err(e) => deadline.check_seeing(|| e.to_string())?,
        }
        tick().await;
    };
    loop {
        holds()
            .await
            .map_err(|e| format!("{what}: {e} (rounds from {from:?})"))?;
        // A node that does not answer once is asked again next tick.
        if let Ok(now) = rounds(cluster).await {
            let ran = |flow: &str| {
                now.get(flow)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(from.get(flow).copied().unwrap_or(0))
            };
            if flows.iter().all(|f| ran(f) >= more) {
                println!("{what}: held, rounds {from:?} -> {now:?}");
                return Ok(());
            }
            deadline.check_seeing(|| format!("rounds {from:?} -> {now:?}"))?;
        }
        tick().await;
    }
}

/// The node that runs `flow`'s metadata rounds: the owner of its first unit, as the leader
/// reports it (module docs of `sync::metadata`), confirmed by its own round counter growing.
async fn runner_of(cluster: &ReplicatorCluster, flow: &str) -> TestResult<NodeId> {
    let status = cluster.leader_status().await.ok_or("no leader")?;
    let runner = status
        .units
        .iter()
        .filter(|u| u.unit.flow == flow && !u.retired)
        .min_by(|a, b| a.unit.cmp(&b.unit))
        .and_then(|u| u.owner)
        .ok_or("the first unit has no owner")?;
    let ran = |r: &BTreeMap<String, u64>| r.get(flow).copied().unwrap_or(0);
    let before = ran(&rounds_of(cluster, runner).await?);
    wait_until(
        &format!("node {runner} running rounds of {flow}"),
        WAIT,
        || async {
            rounds_of(cluster, runner)
                .await
                .is_ok_and(|r| ran(&r) >= before + 2)
        },
    )
    .await?;
    Ok(runner)
}

/// Each user as its home has it: `app-billing` active on `up` with the rights it was created
/// with, `app-reports` active on `down` with its own.
async fn homes_untouched(
    (up, down): (&Client, &Client),
    billing: &Option<Permissions>,
    reports: &Option<Permissions>,
) -> TestResult {
    let on_up = user(up, BILLING).await?;
    if on_up != Some((UserStatus::Active, billing.clone())) {
        return Err(format!("{BILLING} on up changed: {on_up:?}").into());
    }
    let on_down = user(down, REPORTS).await?;
    if on_down != Some((UserStatus::Active, reports.clone())) {
        return Err(format!("{REPORTS} on down changed: {on_down:?}").into());
    }
    Ok(())
}

/// Both sides hold the expiry `want` (µs).
async fn expiry_on_both((up, down): (&Client, &Client), want: u64) -> TestResult {
    let (on_up, on_down) = (expiry(up).await?, expiry(down).await?);
    if (on_up, on_down) != (want, want) {
        return Err(format!("message_expiry up {on_up} µs, down {on_down} µs, want {want}").into());
    }
    Ok(())
}

/// Waits until `to` holds the expiry `want` (µs) that an operator set on `from`, failing at
/// once when `from` no longer holds it (the other flow undid the change) or a home user
/// changed.
async fn travels<F, Fut>(
    (from, to): (&Client, &Client),
    want: u64,
    what: &str,
    homes: F,
) -> TestResult
where
    F: Fn() -> Fut,
    Fut: Future<Output = TestResult>,
{
    let deadline = Deadline::new(WAIT, what);
    loop {
        let kept = expiry(from).await?;
        if kept != want {
            return Err(format!("{what}: the changed side now holds {kept} µs, not {want}").into());
        }
        homes().await.map_err(|e| format!("{what}: {e}"))?;
        let there = expiry(to).await?;
        if there == want {
            return Ok(());
        }
        deadline.check_seeing(|| format!("{there} µs there"))?;
        tick().await;
    }
}

/// The users' statuses on both sides: `app-billing`, then `app-reports`, each (up, down).
async fn statuses((up, down): (&Client, &Client)) -> [Option<UserStatus>; 4] {
    [
        status(up, BILLING).await,
        status(down, BILLING).await,
        status(up, REPORTS).await,
        status(down, REPORTS).await,
    ]
}

/// `flow promote fwd --activate-users FILE` through the leader, naming `app-billing`;
/// asserts exit 0, its activation, and that `fwd` is paused.
async fn promote_activating(cluster: &ReplicatorCluster) -> TestResult {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), format!("{BILLING} = \"{TARGET_PASSWORD}\"\n"))?;
    let path = file.path().to_string_lossy().into_owned();
    let run = cluster
        .flow_once(&[
            "promote",
            "fwd",
            "--timeout",
            "60s",
            "--activate-users",
            &path,
        ])
        .await?;
    println!("{}{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "promote: {}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("user {BILLING}: activated on the target")),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(TARGET_PASSWORD), "no password printed");
    let status = cluster.leader_status().await.ok_or("no leader")?;
    assert!(status.is_paused("fwd"), "fwd paused after promote");
    Ok(())
}

/// `app-billing`, logged in as itself on `down` with the password promote gave it.
async fn billing_on_down(servers: &Servers) -> TestResult<Client> {
    let url = servers.downstream.connection_string();
    let address = url.rsplit_once('@').map(|(_, a)| a).ok_or("no address")?;
    Ok(connect(&Endpoint::new(
        IggyVersion::V0_8,
        format!("iggy://{BILLING}:{TARGET_PASSWORD}@{address}"),
    ))
    .await?)
}

#[test]
fn a_two_way_pair_keeps_home_users_and_operator_settings_through_a_kill_and_a_promote() -> TestResult
{
    serial(|| async {
        // 1. Each cluster's own user, authored before the replicator starts.
        let servers = Servers::start(Topic::new(STREAM, TOPIC, PARTITIONS)).await?;
        let up = connect(&servers.upstream.connection_string()).await?;
        let down = connect(&servers.downstream.connection_string()).await?;
        ensure_topic(&up, AUDIT, "log", 1).await?;
        up.create_user(
            BILLING,
            "billing-on-up",
            UserStatus::Active,
            Some(billing_permissions(&up).await?),
        )
        .await?;
        down.create_user(
            REPORTS,
            "reports-on-down",
            UserStatus::Active,
            Some(reports_permissions()),
        )
        .await?;
        let billing_rights = user(&up, BILLING).await?.ok_or("no user")?.1;
        let reports_rights = user(&down, REPORTS).await?.ok_or("no user")?.1;
        assert!(billing_rights.is_some() && reports_rights.is_some());

        // 2. Three nodes running both flows; the pair's records need feature level 3.
        let mut cluster = ReplicatorCluster::start(spec(&servers)?, 3).await?;
        cluster
            .wait_leader_status("feature level 3".into(), WAIT, |s| s.feature_level >= 3)
            .await?;

        // 3. Each user is copied away from its home, inactive; the homes stay as they were
        // over many rounds of both flows.
        wait_until("each user's copy, inactive", WAIT, || async {
            status(&down, BILLING).await == Some(UserStatus::Inactive)
                && status(&up, REPORTS).await == Some(UserStatus::Inactive)
        })
        .await?;
        let pair = (&up, &down);
        let homes = || homes_untouched(pair, &billing_rights, &reports_rights);
        over_rounds(&cluster, &FLOWS, 10, "each user as its home has it", homes).await?;

        // 4. An operator's change on up reaches down and stays.
        set_expiry(&up, hours(2)).await?;
        travels((&up, &down), u64::from(hours(2)), "2 h on down", homes).await?;
        over_rounds(&cluster, &FLOWS, 2, "2 h on both sides", || async {
            expiry_on_both(pair, u64::from(hours(2))).await?;
            homes().await
        })
        .await?;
        // The node running fwd's rounds dies; an operator changes the setting on down.
        let runner = runner_of(&cluster, "fwd").await?;
        let back_runner = runner_of(&cluster, "back").await?;
        println!("fwd's rounds run on node {runner} (back's on node {back_runner}): killed");
        cluster.kill(runner)?;
        set_expiry(&down, hours(5)).await?;
        let what = format!("5 h on up after node {runner} was killed");
        travels((&down, &up), u64::from(hours(5)), &what, homes).await?;
        over_rounds(
            &cluster,
            &FLOWS,
            5,
            &format!("5 h on both sides, node {runner} killed"),
            || async {
                expiry_on_both(pair, u64::from(hours(5))).await?;
                homes().await
            },
        )
        .await?;
        let billing_copy = user(&down, BILLING).await?;
        assert!(
            billing_copy
                .as_ref()
                .is_some_and(|(s, _)| *s == UserStatus::Inactive),
            "{BILLING}'s copy on down: {billing_copy:?}"
        );

        // 5. Fail over per the runbook: the application logs in on down as itself, and its
        // original on up stays active.
        promote_activating(&cluster).await?;
        let app = billing_on_down(&servers).await?;
        assert!(
            app.get_stream(&id(STREAM)?).await?.is_some(),
            "{BILLING} reads the stream on down with its synced rights"
        );
        assert_eq!(status(&up, BILLING).await, Some(UserStatus::Active));
        let after_promote = statuses(pair).await;
        assert_eq!(
            after_promote,
            [
                Some(UserStatus::Active),
                Some(UserStatus::Active),
                Some(UserStatus::Inactive),
                Some(UserStatus::Active),
            ],
            "{BILLING} (up, down), {REPORTS} (up, down) after promote"
        );
        let stable = || async {
            let now = statuses(pair).await;
            if now != after_promote {
                return Err(format!("statuses {now:?}, were {after_promote:?}").into());
            }
            expiry_on_both(pair, u64::from(hours(5))).await
        };
        over_rounds(&cluster, &["back"], 5, "statuses unchanged", stable).await?;
        // Its rights on up now follow its new home, down, translated back; its rights on
        // `audit`, which no flow copies into, are up's own and stay.
        assert_eq!(
            user(&up, BILLING).await?,
            Some((UserStatus::Active, billing_rights.clone())),
            "{BILLING} on up after promote and rounds of back"
        );

        // 6. The killed node comes back; still nothing flip-flops.
        cluster.restart(runner)?;
        cluster
            .wait_leader_status(format!("node {runner} live again"), WAIT, |s| {
                s.member(runner).and_then(|m| m.lease_alive) == Some(true)
            })
            .await?;
        over_rounds(
            &cluster,
            &["back"],
            5,
            &format!("statuses unchanged, node {runner} back"),
            stable,
        )
        .await?;

        let _ = app.shutdown().await;
        let _ = up.shutdown().await;
        let _ = down.shutdown().await;
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}
