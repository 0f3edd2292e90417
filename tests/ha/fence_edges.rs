//! Two edges of the writer fence (`fencing = "users"`, the default), with three node processes,
//! a producer running throughout and an exact `verify` at the end:
//!
//! * A node frozen past its fence comes back and gets its next writer identity. Its writer had
//!   begun to connect again as its old identity just before the freeze (the target held a send
//!   until it timed out, then held the login back), and the target refuses that login only
//!   after the node has switched to the next identity: a refusal of the old identity, which
//!   gives the new one nothing up. The node writes again as exactly the next incarnation.
//! * A node restarted with an empty data dir (its disk lost) is replayed the Raft log by the
//!   leader, its predecessor's identity among the entries. The dead process's last sends may
//!   still be on their way, so the new process must never write as that identity: the target
//!   sees no session of that user from the restart on, and the node writes as a later one.
//!   The predecessor's identity is set after the replay's first batch and still has its rights
//!   when the new process comes up (a third node is frozen meanwhile: the leader can commit no
//!   fence), which is when writing as it would do harm.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, serial, tick, wait_resumed, Client, Deadline, NodeId, ReplicatorCluster, Stalled,
    Status, TestResult,
};
use replicator_model::writer_username;

use crate::fixture::{self, finish_with_exact_copy};

/// Iggy's LOGIN_USER command code (the test server's fault rules name commands by code).
const LOGIN_USER: u32 = 38;

/// The writer users' `writer_user_prefix` on the target: the product default.
const WRITER_PREFIX: &str = "iggy-replicator";

/// How long the target holds the frozen node's login back before it answers it: longer than
/// the fence of its identity and the node's switch to the next one after the thaw take
/// (a second or two each; the test checks the order in the node's log).
const LATE_LOGIN: Duration = Duration::from_secs(8);

/// Logins the target holds back from the time out of the node's send on: the node's connect as
/// its identity, and two more in case another connection opens meanwhile (the rules left are
/// cleared once the node is frozen).
const HELD_LOGINS: u32 = 3;

/// What the node's log says when the target refuses a login as an inactive user (the Iggy
/// SDK's report; only a fenced identity's user is inactive).
const REFUSED_INACTIVE: &str = "(user_inactive)";

/// `node`'s writer identity as `status` reports it: (incarnation, fenced).
fn identity(status: &Status, node: NodeId) -> Option<(u64, bool)> {
    let member = status.member(node)?;
    Some((member.writer_incarnation?, member.fenced))
}

/// The incarnation `node` writes as now, per the leader: an error unless it has one unfenced.
async fn usable_incarnation(cluster: &ReplicatorCluster, node: NodeId) -> TestResult<u64> {
    let status = cluster.leader_status().await.ok_or("no leader")?;
    match identity(&status, node) {
        Some((incarnation, false)) => Ok(incarnation),
        other => Err(format!("node {node} has no usable writer identity: {other:?}").into()),
    }
}

/// What `node`'s log (all its processes) holds from byte `from` on.
fn log_since(cluster: &ReplicatorCluster, node: NodeId, from: usize) -> TestResult<String> {
    let log = std::fs::read(&cluster.node(node)?.log)?;
    Ok(String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned())
}

/// The size of `node`'s log now (where [`log_since`] starts reading what comes after).
fn log_len(cluster: &ReplicatorCluster, node: NodeId) -> TestResult<usize> {
    Ok(usize::try_from(
        std::fs::metadata(&cluster.node(node)?.log)?.len(),
    )?)
}

#[test]
fn a_node_frozen_past_its_fence_comes_back_as_exactly_its_next_identity() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start_fencing(3, "users").await?;
        let topic = servers.topic.clone();
        let (node, owned) = fixture::owning_follower(&cluster, &topic).await?;
        let fenced = usable_incarnation(&cluster, node).await?;
        let next = fenced + 1;
        let partition = *owned.first().ok_or("no partition")?;
        let faults = servers.downstream.faults();

        // The target holds a send of the node's writer until the send times out in the node,
        // which then drops that connection and connects again, as its identity, to re-read
        // the partition's tail. The target holds the logins back from the time out on.
        let log_from = log_len(&cluster, node)?;
        let hold = faults.hold_sends_to(&topic.stream, &topic.name, partition);
        tokio::time::timeout(Duration::from_secs(30), hold.until_held(1))
            .await
            .map_err(|_| format!("node {node} sent nothing to partition {partition} in 30 s"))?;
        let timed_out = "send_messages timed out";
        let writer_of_node = format!("unit{{node={node} ");
        let deadline = Deadline::new(
            Duration::from_secs(60),
            format!("node {node}'s held send to time out"),
        );
        while !log_since(&cluster, node, log_from)?
            .lines()
            .any(|l| l.contains(&writer_of_node) && l.contains(timed_out))
        {
            deadline.check()?;
            // Short: the writer connects again after its first retry pause (about 0.1 s).
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let logins = faults.requests(LOGIN_USER);
        let answered = faults.delays_ended();
        let log_starts = cluster
            .running()
            .into_iter()
            .map(|n| Ok((n, log_len(&cluster, n)?)))
            .collect::<TestResult<Vec<_>>>()?;
        faults.delay_next(LOGIN_USER, LATE_LOGIN, HELD_LOGINS);
        // Its writer connected to the target again, and the target has read the logins of
        // every connection the nodes opened since (each node logs its connects).
        let connected = format!("has connected to server: {}", servers.downstream.addr());
        let deadline = Deadline::new(
            Duration::from_secs(30),
            format!("node {node}'s writer to log in to the target again"),
        );
        loop {
            let mut connects = 0;
            let mut reconnected = false;
            for (n, from) in &log_starts {
                let log = log_since(&cluster, *n, *from)?;
                connects += log.matches(&connected).count();
                reconnected |= *n == node
                    && log
                        .lines()
                        .any(|l| l.contains(&writer_of_node) && l.contains(&connected));
            }
            let read = faults.requests(LOGIN_USER) - logins;
            if reconnected && read >= connects as u64 {
                break;
            }
            deadline.check_seeing(|| format!("{connects} connects, {read} logins read"))?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Frozen while its login waits for the answer, it stops renewing and is fenced.
        cluster.pause(node)?;
        faults.clear();
        drop(hold);
        let frozen = Instant::now();
        let stalled = Stalled {
            partitions: owned.clone(),
            baseline: servers.downstream_counts(),
            since: frozen,
        };
        let resumed = wait_resumed(&servers, &stalled, Duration::from_secs(60)).await?;
        cluster
            .wait_leader_status(
                format!("node {node}'s identity {fenced} fenced"),
                Duration::from_secs(30),
                |s| identity(s, node) == Some((fenced, true)),
            )
            .await?;
        println!(
            "node {node} frozen with a login as identity {fenced} on its way; the identity fenced and its {} partitions written by others after {:.2} s",
            owned.len(),
            resumed.all.as_secs_f64()
        );

        let thaw_from = log_len(&cluster, node)?;
        cluster.resume(node)?;
        let thawed = Instant::now();

        // It owns partitions again, as its next identity; an incarnation beyond that means it
        // gave the next one up.
        let status = cluster
            .wait_leader_status(
                format!("node {node} owning partitions as identity {next}"),
                Duration::from_secs(60),
                |s| {
                    identity(s, node).is_some_and(|(incarnation, fenced)| {
                        incarnation > next || (!fenced && s.units_owned(node) > 0)
                    })
                },
            )
            .await?;
        println!(
            "node {node} owns {} partitions as identity {:?} {:.2} s after the thaw",
            status.units_owned(node),
            identity(&status, node),
            thawed.elapsed().as_secs_f64()
        );
        assert_eq!(
            identity(&status, node),
            Some((next, false)),
            "node {node} came back as another identity than its next one"
        );

        // The login as the fenced identity is refused after the node switched to the next one
        // (its log: the switch, then the SDK's report of the inactive user).
        let switched = format!("writing as a new writer identity incarnation={next}");
        let deadline = Deadline::new(
            LATE_LOGIN + Duration::from_secs(30),
            format!("node {node}'s login as identity {fenced} refused after its switch to {next}"),
        );
        loop {
            let log = log_since(&cluster, node, thaw_from)?;
            if let Some(at) = log.find(&switched) {
                // A refusal before the switch (a connect of the node held back and answered
                // while it was frozen) is about the identity current then, and would hide
                // what follows from a node that gives identities up at most every 30 s.
                assert!(
                    !log[..at].contains(REFUSED_INACTIVE),
                    "node {node} had a login refused before its switch to identity {next}: the test did not hold back only the connect it meant to"
                );
                if log[at..].contains(REFUSED_INACTIVE) {
                    break;
                }
            }
            deadline.check_seeing(|| {
                format!(
                    "held logins answered: {}; switched: {}; refusals: {}",
                    faults.delays_ended() - answered,
                    log.contains(&switched),
                    log.matches(REFUSED_INACTIVE).count()
                )
            })?;
            tick().await;
        }
        println!(
            "node {node}'s login as identity {fenced} refused {:.2} s after the thaw, after its switch to {next}",
            thawed.elapsed().as_secs_f64()
        );

        let report = producer.stop().await?;
        servers.wait_caught_up(Duration::from_secs(60)).await?;
        let status = cluster.leader_status().await.ok_or("no leader")?;
        println!(
            "produced {} messages; node {node} owns {} partitions as identity {:?}",
            report.produced,
            status.units_owned(node),
            identity(&status, node)
        );
        assert_eq!(
            identity(&status, node),
            Some((next, false)),
            "the late refusal of identity {fenced} made node {node} give its next one up"
        );
        fixture::finish_exact(servers, cluster).await
    })
}

/// The data dir `node` runs with, from its config file.
fn data_dir(cluster: &ReplicatorCluster, node: NodeId) -> TestResult<PathBuf> {
    let config: toml::Value = std::fs::read_to_string(&cluster.node(node)?.config)?.parse()?;
    let dir = config
        .get("node")
        .and_then(|n| n.get("data_dir"))
        .and_then(toml::Value::as_str)
        .ok_or("no node.data_dir in the config")?;
    Ok(PathBuf::from(dir))
}

/// Ids of the target's sessions logged in as user `user_id`.
async fn sessions_of(target: &Client, user_id: u32) -> TestResult<BTreeSet<u32>> {
    Ok(target
        .get_clients()
        .await?
        .into_iter()
        .filter(|c| c.user_id == Some(user_id))
        .map(|c| c.client_id)
        .collect())
}

/// The id of the target's user `username`, if it exists.
async fn user_id(target: &Client, username: &str) -> TestResult<Option<u32>> {
    Ok(target
        .get_users()
        .await?
        .into_iter()
        .find(|u| u.username == username)
        .map(|u| u.id))
}

/// Raft log entries one AppendEntries carries at most (openraft's `max_payload_entries`): a
/// member that lost its log is replayed the log from its start in batches of up to this many,
/// and applies each batch as it comes.
const REPLAY_BATCH: u64 = 300;

/// Entries after which the leader snapshots its log (`snapshot_logs_since_last`): below it, a
/// member that lost its log is replayed the log itself, not sent a snapshot.
const SNAPSHOT_AFTER: u64 = 2000;

#[test]
fn a_node_restarted_with_an_empty_data_dir_never_writes_as_its_predecessors_identity() -> TestResult
{
    serial(|| async {
        let started = Instant::now();
        let (servers, mut cluster, producer) = fixture::start_fencing(3, "users").await?;
        let target = connect(&servers.downstream.connection_string()).await?;
        let (node, _) = fixture::owning_follower(&cluster, &servers.topic).await?;
        let first = usable_incarnation(&cluster, node).await?;

        // The predecessor's identity comes after the replay's first batch: the log outgrows
        // a batch, then a restart with its data dir makes the node give its first identity
        // up and write as the next one.
        let applied_index = "iggy_replicator_raft_applied_index";
        let deadline = Deadline::new(
            Duration::from_secs(90),
            format!("node {node}'s log to outgrow a replay batch"),
        );
        loop {
            let applied = cluster.metric_of(node, applied_index).await?;
            if applied.is_some_and(|a| a > (REPLAY_BATCH + 100) as f64) {
                break;
            }
            deadline.check_seeing(|| format!("applied index {applied:?}"))?;
            tick().await;
        }
        cluster.kill(node)?;
        cluster.restart(node)?;
        let status = cluster
            .wait_leader_status(
                format!("node {node} owning partitions as an identity after {first}"),
                Duration::from_secs(60),
                |s| {
                    identity(s, node).is_some_and(|(i, fenced)| i > first && !fenced)
                        && s.units_owned(node) > 0
                },
            )
            .await?;
        let predecessor = identity(&status, node).ok_or("no identity")?.0;
        let predecessors_name = writer_username(WRITER_PREFIX, node, predecessor);
        // The sessions of the process about to be killed: the only ones of that user allowed.
        let deadline = Deadline::new(
            Duration::from_secs(30),
            format!("node {node} logged in as {predecessors_name}"),
        );
        let (predecessors_user, its_own) = loop {
            if let Some(user) = user_id(&target, &predecessors_name).await? {
                let sessions = sessions_of(&target, user).await?;
                if !sessions.is_empty() {
                    break (user, sessions);
                }
            }
            deadline.check()?;
            tick().await;
        };
        let leader = status.leader.ok_or("no leader")?;
        let third = cluster
            .running()
            .into_iter()
            .find(|n| *n != node && *n != leader)
            .ok_or("no third node")?;
        let applied = cluster.metric_of(node, applied_index).await?;
        let snapshot = cluster
            .metric_of(leader, "iggy_replicator_raft_snapshot_index")
            .await?;
        assert!(
            applied.is_some_and(|a| a < SNAPSHOT_AFTER as f64) && snapshot.is_none(),
            "the log is no longer young (applied {applied:?}, leader's snapshot {snapshot:?}): a restarted node would be sent a snapshot instead of the log"
        );
        println!(
            "{:.2} s after the start, node {node} writes as identity {predecessor}; applied index {applied:?}",
            started.elapsed().as_secs_f64()
        );

        // The third node freezes (it is not lost: the leader keeps every entry), so that
        // nothing is committed, no fence of the predecessor's identity either, until the node
        // is back: when the new process comes up, that identity still has its rights. Then
        // the node is killed and comes back with an empty data dir.
        let dir = data_dir(&cluster, node)?;
        cluster.pause(third)?;
        cluster.kill(node)?;
        std::fs::remove_dir_all(&dir)?;
        cluster.restart(node)?;
        let restarted = Instant::now();

        // From the restart until the node writes again: no new session as the predecessor's
        // user, and the node ends up owning partitions as a later identity, logged in as it.
        let deadline = Deadline::new(
            Duration::from_secs(60),
            format!("node {node} writing as an identity after {predecessor}"),
        );
        let mut seen = None;
        let now_as = loop {
            let new: Vec<u32> = sessions_of(&target, predecessors_user)
                .await?
                .difference(&its_own)
                .copied()
                .collect();
            assert!(
                new.is_empty(),
                "{:.2} s after the restart with an empty data dir, node {node} logged in as its predecessor's identity {predecessor} (sessions {new:?})",
                restarted.elapsed().as_secs_f64()
            );
            let status = cluster.leader_status().await;
            seen = status.as_ref().and_then(|s| identity(s, node)).or(seen);
            if let Some((incarnation, false)) = seen {
                let owns = status.as_ref().is_some_and(|s| s.units_owned(node) > 0);
                let name = writer_username(WRITER_PREFIX, node, incarnation);
                if incarnation > predecessor && owns {
                    if let Some(user) = user_id(&target, &name).await? {
                        if !sessions_of(&target, user).await?.is_empty() {
                            break incarnation;
                        }
                    }
                }
            }
            deadline.check_seeing(|| format!("its identity per the leader: {seen:?}"))?;
            tick().await;
        };
        println!(
            "node {node} restarted with an empty data dir writes as identity {now_as} (its predecessor's was {predecessor}) {:.2} s after the restart",
            restarted.elapsed().as_secs_f64()
        );

        cluster.resume(third)?;
        let all = cluster.running();
        cluster
            .wait_all_owned(&all, Duration::from_secs(60))
            .await?;
        let new: Vec<u32> = sessions_of(&target, predecessors_user)
            .await?
            .difference(&its_own)
            .copied()
            .collect();
        assert!(
            new.is_empty(),
            "node {node} logged in as its predecessor's identity {predecessor} (sessions {new:?})"
        );
        let _ = target.shutdown().await;
        finish_with_exact_copy(producer, servers, cluster).await
    })
}
