//! A rolling restart that turns fencing on for a target (issue 51, item 2): a node not
//! restarted yet still writes there with the cluster's configured credential, which revoking
//! its writer identity does not stop, so the leader must move its partitions of that target
//! on the lease alone, never through the fence.
//!
//! Two flows from `src`: `to-a` into `a` (fenced in both configs, so every node has a writer
//! identity and a node that stops renewing is fenced) and `to-b` into `b` (`fencing = "off"`
//! in the old config, `"users"` in the new one). The leases are long (`cluster.lease_expiry`
//! = [`LEASE`]); `fence_after` stays the default 600 ms. Three nodes start on the old config
//! with a producer per flow; every node but one is stopped (SIGTERM) and started on the new
//! config, one at a time, until the one left on the old config, `M`, leads. Its followers
//! run `to-b` differently (their digest of it differs), so `M` owns every partition of `to-b`
//! (and some of `to-a`).
//!
//! One of `M`'s sends to `b` is held before the server reads it and `M` is frozen (SIGSTOP)
//! inside it. The followers elect a leader on the new config, which fences `M` (it owns units
//! of `to-a`): it revokes `M`'s identity on `a` and on `b` and moves `M`'s units of `to-a`.
//! `M`'s units of `to-b` must stay `M`'s, since `M` writes to `b` as the configured user,
//! which the revoke does not stop: nobody else may write them while `M`'s lease is valid.
//! Once the new owners of `M`'s `to-a` partitions wrote (and at least [`OBSERVE`] after both
//! targets acknowledged the revoke), the held send arrives and `M` thaws, well within its
//! lease: both are legitimate, the leader then asks `M` for its `to-b` units back (its config
//! differs) and `M` hands them over. `M` is restarted on the new config too, the producers
//! stop, and `verify` must find both flows exact.
//!
//! Before the fix (1213b64) the revoke on `b` took `M`'s units of `to-b` (`FenceTarget`) and
//! the others wrote them while `M`'s lease was valid; the held send then landed behind their
//! copies of the same messages: a duplicate on `b`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use replicator_harness::{
    serial, tick, Deadline, FlowEntry, NodeId, Replication, ReplicatorCluster, Status, TestResult,
    Topic,
};

use crate::fixture::{self, exact_within, Regions};

/// `cluster.lease_expiry` of every node: long, so that whatever moves `M`'s units of `to-b`
/// before the thaw does it while `M`'s lease is valid.
const LEASE: Duration = Duration::from_secs(30);
/// How long after both targets acknowledged the revoke of `M`'s identity (and once the new
/// owners of its `to-a` partitions wrote) the held partition is still watched for another
/// writer before the held send arrives. Before the fix the units of `to-b` moved with that
/// acknowledgement, as those of `to-a` do.
const OBSERVE: Duration = Duration::from_secs(3);
/// The latest the thaw may come after the freeze: well within `M`'s lease (counted from its
/// last renewal before the freeze), after which its units would move on the lease and the
/// held send would be a duplicate the README documents for an unfenced target.
const THAW_BY: Duration = Duration::from_secs(20);
/// How long a start, a restart, an election or a handover may take on a busy machine.
const WAIT: Duration = Duration::from_secs(90);
/// How long a flow may take to become exact once its producer stopped.
const EXACT_WITHIN: Duration = Duration::from_secs(60);
/// Restarts of the node leading on the new config, to move the lead to the one left on the
/// old config, before the scenario gives up (each elects one of two nodes).
const MOVE_LEAD_AT_MOST: usize = 8;
const NODES: [NodeId; 3] = [1, 2, 3];
const TO_A: &str = "to-a";
const TO_B: &str = "to-b";

/// The replication with `b`'s `fencing` (`a` keeps the product default, "users").
fn replication(regions: &Regions, b_fencing: &str) -> Replication {
    Replication::default()
        .cluster(regions.entry("src", None))
        .cluster(regions.entry("a", None))
        .cluster(regions.entry("b", Some(b_fencing)))
        .flow(FlowEntry::new(TO_A, "src", "a", "roll-a/*"))
        .flow(FlowEntry::new(TO_B, "src", "b", "roll-b/*"))
}

#[test]
fn a_rolling_restart_that_fences_a_target_moves_an_old_members_units_on_its_lease() -> TestResult {
    serial(|| async {
        let ta = Topic::new("roll-a", "events", 12);
        let tb = Topic::new("roll-b", "events", 4);
        let units = (ta.partitions + tb.partitions) as usize;
        let regions = Regions::start(&["src", "a", "b"], &[&ta, &tb]).await?;
        let old = replication(&regions, "off");
        let new = replication(&regions, "users").toml();
        let mut spec = fixture::spec_of(&old, units, false)?;
        spec.cluster_toml = format!("lease_expiry = \"{}s\"", LEASE.as_secs());
        let mut cluster = ReplicatorCluster::launch(spec, fixture::loopback(3)?).await?;
        let into_a = regions.produce(&ta);
        let into_b = regions.produce(&tb);
        regions.wait_copy_started("a", &ta).await?;
        regions.wait_copy_started("b", &tb).await?;

        let m = restart_all_but_the_leader(&mut cluster, &new, units).await?;
        let before = cluster
            .wait_leader_status(
                format!("node {m} (old config) leads and owns every unit of {TO_B}"),
                WAIT,
                |s| {
                    s.leader == Some(m)
                        && s.all_units_owned_by_any_of(&NODES, units)
                        && s.owned_by(&tb, m).len() == tb.partitions as usize
                        && !s.owned_by(&ta, m).is_empty()
                        && !s.units.iter().any(|u| u.release_requested)
                        && s.members.iter().all(|n| {
                            (n.id == m || n.config_disagrees == [TO_B])
                                && n.writer_incarnation.is_some()
                                && !n.fenced
                                && n.units_owned > 0
                        })
                },
            )
            .await?;
        let m_of_a = before.owned_by(&ta, m);
        let others: Vec<NodeId> = NODES.into_iter().filter(|n| *n != m).collect();
        let mut fences_before = Vec::new();
        for node in &others {
            fences_before.push((*node, fences(&cluster, *node).await?));
        }
        println!(
            "node {m} leads on the old config (b unfenced) with partitions {:?} of {TO_B} and {m_of_a:?} of {TO_A}; nodes {others:?} run the new one",
            before.owned_by(&tb, m)
        );

        // One of M's sends to b is held on its way, and M freezes inside it.
        let partition = 0;
        let b = regions.server("b");
        let hold = b.faults().hold_sends_to(&tb.stream, &tb.name, partition);
        tokio::time::timeout(Duration::from_secs(30), hold.until_held(1))
            .await
            .map_err(|_| format!("node {m} sent nothing to partition {partition} in 30 s"))?;
        cluster.pause(m)?;
        let frozen = Instant::now();
        let held_at = tb.counts_on(b)[partition as usize];
        let grant_of_p = |s: &Status| {
            s.grants_of(TO_B)
                .into_iter()
                .find_map(|(unit, grant)| (unit.partition == partition).then_some(grant))
        };
        let granted = grant_of_p(&before);
        let a_baseline = ta.counts_on(regions.server("a"));

        // A leader on the new config fences M and moves its units of to-a.
        let deadline = Deadline::new(THAW_BY, format!("node {m} fenced and to-a moved"));
        let mut elected = None;
        let mut acknowledged = None;
        let mut a_written = None;
        let mut second_writer = None;
        let mut last = None;
        let status = loop {
            let status = cluster.leader_status().await;
            let at = frozen.elapsed();
            if let Some(s) = status.as_ref().filter(|s| s.leader != Some(m)) {
                elected.get_or_insert(at);
                let leader = s.leader.ok_or("no leader")?;
                let baseline = fences_before
                    .iter()
                    .find(|(n, _)| *n == leader)
                    .map_or(0.0, |(_, f)| *f);
                // Both targets acknowledged the revoke of M's identity (one fence each).
                if acknowledged.is_none()
                    && s.member(m).is_some_and(|mm| mm.fenced)
                    && fences(&cluster, leader).await? >= baseline + 2.0
                {
                    acknowledged = Some(at);
                }
                let a_now = ta.counts_on(regions.server("a"));
                if a_written.is_none()
                    && s.owned_by(&ta, m).is_empty()
                    && m_of_a
                        .iter()
                        .all(|p| a_now[*p as usize] > a_baseline[*p as usize])
                {
                    a_written = Some(at);
                }
                let b_now = tb.counts_on(b)[partition as usize];
                if second_writer.is_none() && (b_now > held_at || grant_of_p(s) != granted) {
                    second_writer = Some((at, grant_of_p(s), b_now - held_at));
                }
                let observed = acknowledged.is_some_and(|t| at >= t + OBSERVE);
                if second_writer.is_some() || (observed && a_written.is_some()) {
                    break s.clone();
                }
            }
            let seen = (elected, acknowledged, a_written);
            deadline.check_seeing(|| {
                format!("(elected, acknowledged, to-a written) after {seen:?}; last {last:?}")
            })?;
            last = status;
            tick().await;
        };
        let secs =
            |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        println!(
            "node {m} frozen inside a send to partition {partition} of {TO_B}: leader {:?} after {}, revoke acknowledged by a and b after {}, its to-a partitions written by others after {}; partition {partition} of {TO_B}: {}",
            status.leader,
            secs(elected),
            secs(acknowledged),
            secs(a_written),
            match &second_writer {
                None => format!("still node {m}'s ({:?}), nobody else wrote it", grant_of_p(&status)),
                Some((at, grant, n)) => format!(
                    "granted {grant:?} (was {granted:?}), {n} messages written by another after {:.2} s",
                    at.as_secs_f64()
                ),
            },
        );

        // The held send arrives, then M thaws, both within M's lease.
        tokio::time::timeout(Duration::from_secs(30), hold.release_and_wait())
            .await
            .map_err(|_| "the held send was not answered in 30 s")?;
        cluster.resume(m)?;
        let thawed = frozen.elapsed();
        println!(
            "held send let in and node {m} thawed {:.2} s after the freeze (lease {} s)",
            thawed.as_secs_f64(),
            LEASE.as_secs()
        );
        if thawed > THAW_BY {
            return Err(format!(
                "node {m} thawed {:.1} s after the freeze, too close to its lease's end for the scenario to show anything",
                thawed.as_secs_f64()
            )
            .into());
        }

        // The leader asks M for its units of to-b (its config of the flow differs).
        let handed = Instant::now();
        cluster
            .wait_leader_status(
                format!("node {m} handed its units of {TO_B} over"),
                WAIT,
                |s| {
                    s.owned_by(&tb, m).is_empty()
                        && s.owned_units_of(TO_B) == tb.partitions as usize
                },
            )
            .await?;
        println!(
            "node {m} handed its units of {TO_B} over {:.2} s after the thaw",
            handed.elapsed().as_secs_f64()
        );
        // Handed over, not taken when the lease ran out (counted from before the freeze).
        assert!(
            frozen.elapsed() < LEASE,
            "node {m}'s units of {TO_B} moved only {:.1} s after the freeze, when its lease may have run out",
            frozen.elapsed().as_secs_f64()
        );

        // M runs the new config too.
        let codes = cluster.terminate(&[m], WAIT).await?;
        assert_eq!(codes, vec![(m, Some(0))], "node {m} did not drain");
        cluster.rewrite_replication(m, &new)?;
        cluster.restart(m)?;
        cluster.wait_all_owned(&NODES, WAIT).await?;
        cluster
            .wait_leader_status("every node agrees".into(), WAIT, |s| {
                s.members.iter().all(|n| n.config_disagrees.is_empty())
            })
            .await?;
        println!("node {m} restarted on the new config; every node agrees");

        for (flow, producer) in [(TO_A, into_a), (TO_B, into_b)] {
            let report = producer.stop().await?;
            println!(
                "produced {} messages for {flow} ({} failed sends)",
                report.produced, report.failed_sends
            );
        }
        let stopped = "after the producers stopped";
        let b_exact = exact_within(&cluster, TO_B, EXACT_WITHIN, stopped).await;
        let a_exact = exact_within(&cluster, TO_A, EXACT_WITHIN, stopped).await;
        let (up, down) = (tb.counts_on(regions.source()), tb.counts_on(b));
        println!("{TO_B}: upstream {up:?}, b {down:?}");
        if let Some((at, grant, n)) = second_writer {
            return Err(format!(
                "partition {partition} of {TO_B} moved away from node {m} (old config, lease valid, a send on its way) {:.2} s after the freeze: granted {grant:?} (was {granted:?}), {n} messages written by another; b_exact: {b_exact:?}",
                at.as_secs_f64()
            )
            .into());
        }
        b_exact?;
        a_exact?;
        regions.finish(cluster).await
    })
}

/// Stops every node but one (SIGTERM, a clean drain) and starts it on `new`, one at a time,
/// each time a node on the old config that does not lead, until the one left on the old
/// config leads (the node leading on the new config is restarted to move the lead, if need
/// be). After each restart, waits until the node is back: a writer identity newer than its
/// previous process's, its lease alive, units of its own, and every unit (of `units`) owned.
/// Returns the node left on the old config.
async fn restart_all_but_the_leader(
    cluster: &mut ReplicatorCluster,
    new: &str,
    units: usize,
) -> TestResult<NodeId> {
    let mut on_old: BTreeSet<NodeId> = NODES.into_iter().collect();
    let mut moves = 0;
    loop {
        let status = cluster
            .wait_leader_status("a leader".into(), WAIT, |_| true)
            .await?;
        let leader = status.leader.ok_or("no leader")?;
        let node = if on_old.len() > 1 {
            *on_old
                .iter()
                .find(|n| **n != leader)
                .ok_or("no node to restart")?
        } else if on_old.contains(&leader) {
            return Ok(leader);
        } else {
            moves += 1;
            if moves > MOVE_LEAD_AT_MOST {
                return Err(format!(
                    "the lead stayed on the new config over {MOVE_LEAD_AT_MOST} restarts"
                )
                .into());
            }
            leader
        };
        let previous = status.member(node).and_then(|n| n.writer_incarnation);
        let started = Instant::now();
        let codes = cluster.terminate(&[node], WAIT).await?;
        assert_eq!(codes, vec![(node, Some(0))], "node {node} did not drain");
        if on_old.remove(&node) {
            cluster.rewrite_replication(node, new)?;
        }
        cluster.restart(node)?;
        let status = cluster
            .wait_leader_status(
                format!("node {node} back with a new writer identity and units"),
                WAIT,
                |s| {
                    s.all_units_owned_by_any_of(&NODES, units)
                        && s.member(node).is_some_and(|n| {
                            n.writer_incarnation > previous
                                && !n.fenced
                                && n.lease_alive == Some(true)
                                && n.units_owned > 0
                        })
                },
            )
            .await?;
        println!(
            "node {node} (leading: {}) restarted on the new config: back with writer incarnation {:?} (was {previous:?}) and units {:.2} s after its stop; leader {:?}",
            node == leader,
            status.member(node).and_then(|n| n.writer_incarnation),
            started.elapsed().as_secs_f64(),
            status.leader
        );
    }
}

/// The revokes `node` acknowledged and committed as leader since its start (one per member
/// and target).
async fn fences(cluster: &ReplicatorCluster, node: NodeId) -> TestResult<f64> {
    Ok(cluster
        .metric_of(node, "iggy_replicator_writer_fences_total")
        .await?
        .unwrap_or(0.0))
}
