//! Fencing at the targets, seen from the control plane: a recording `WriterFence` stands in for
//! the Iggy clusters (the Iggy side is tested in the binary's process tests). Flow `f` writes
//! to the fenced target `eu`, flow `g` to the fenced target `ap`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use replicator_control::{ControlTiming, FenceFuture, FenceTopology, Fencing, WriterFence};
use replicator_model::{NodeId, WorkUnit, WriterLogin};

use crate::util::*;

/// What happened on the "targets", in order: (target, node, incarnation).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Ensured(String, NodeId, u64),
    Revoked(String, NodeId, u64),
}

#[derive(Default)]
struct RecordingFence {
    events: Mutex<Vec<Event>>,
    /// Targets that refuse every operation (down).
    down: Mutex<BTreeSet<String>>,
}

impl RecordingFence {
    fn events(&self) -> Vec<Event> {
        self.events.lock().expect("not poisoned").clone()
    }

    fn position(&self, e: &Event) -> Option<usize> {
        self.events().iter().position(|x| x == e)
    }

    fn set_down(&self, target: &str, down: bool) {
        let mut set = self.down.lock().expect("not poisoned");
        if down {
            set.insert(target.to_owned());
        } else {
            set.remove(target);
        }
    }

    fn answer(&self, target: &str, e: Event) -> Result<(), String> {
        if self.down.lock().expect("not poisoned").contains(target) {
            return Err(format!("{target} unreachable"));
        }
        self.events.lock().expect("not poisoned").push(e);
        Ok(())
    }
}

impl WriterFence for RecordingFence {
    fn ensure<'a>(&'a self, target: &'a str, login: &'a WriterLogin) -> FenceFuture<'a, ()> {
        let e = Event::Ensured(target.to_owned(), login.node, login.incarnation);
        Box::pin(async move { self.answer(target, e) })
    }

    fn revoke<'a>(
        &'a self,
        target: &'a str,
        node: NodeId,
        incarnation: u64,
    ) -> FenceFuture<'a, ()> {
        let e = Event::Revoked(target.to_owned(), node, incarnation);
        Box::pin(async move { self.answer(target, e) })
    }
}

fn topology(flows: &[(&str, &str)]) -> FenceTopology {
    FenceTopology::new(
        flows
            .iter()
            .map(|(flow, target)| ((*flow).to_owned(), Some((*target).to_owned()))),
    )
}

type Fenced = (TestCluster, NodeId, Arc<RecordingFence>);

/// Three fenced nodes, six units of `f` and six of `g`, four per node.
async fn fenced_cluster(down: &[&str]) -> Result<Fenced, Box<dyn std::error::Error + Send + Sync>> {
    fenced_cluster_timed(fast_timing(), down).await
}

/// [`fenced_cluster`] with `timing`.
async fn fenced_cluster_timed(
    timing: ControlTiming,
    down: &[&str],
) -> Result<Fenced, Box<dyn std::error::Error + Send + Sync>> {
    let fence = Arc::new(RecordingFence::default());
    let fencing = Fencing {
        fence: fence.clone(),
        topology: topology(&[("f", "eu"), ("g", "ap")]),
    };
    let cluster = TestCluster::start_fenced(3, timing, fencing).await?;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    // Every member with its writer identity before the units come, so that both flows' units
    // are spread over all three as they are reported (the tests below need a follower owning
    // units of both).
    cluster
        .wait_status(
            "every member has a writer identity",
            leader,
            Duration::from_secs(10),
            |s| s.members.len() == 3 && s.members.iter().all(|m| m.writer_incarnation.is_some()),
        )
        .await?;
    cluster.report_units(leader, 6).await?;
    cluster
        .node(leader)
        .report_units("g", units("g", 6))
        .await?;
    cluster
        .wait_owners("four units each", leader, |o| {
            o.len() == 12 && (1..=3).all(|id| owned_by(o, id, "f") + owned_by(o, id, "g") == 4)
        })
        .await?;
    for target in down {
        fence.set_down(target, true);
    }
    Ok((cluster, leader, fence))
}

/// Crashes a follower of `leader` and waits until its units moved, which they do only once
/// both targets revoked its identity 1; returns it.
async fn crash_a_follower_until_fenced(
    cluster: &mut TestCluster,
    leader: NodeId,
    fence: &RecordingFence,
) -> Result<NodeId, Box<dyn std::error::Error + Send + Sync>> {
    let victim = follower_of(leader);
    cluster.crash(victim).await;
    cluster
        .wait_owners("the dead member's units moved", leader, |o| {
            o.values().all(|owner| owner.is_some_and(|n| n != victim))
        })
        .await?;
    for target in ["eu", "ap"] {
        assert!(
            fence
                .position(&Event::Revoked(target.into(), victim, 1))
                .is_some(),
            "{:?}",
            fence.events()
        );
    }
    Ok(victim)
}

fn owned_by(owners: &BTreeMap<WorkUnit, Option<NodeId>>, node: NodeId, flow: &str) -> usize {
    owners
        .iter()
        .filter(|(u, o)| u.flow == flow && **o == Some(node))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_go_only_to_members_with_a_user_and_a_dead_owner_is_fenced_first() -> TestResult {
    let (mut cluster, leader, fence) = fenced_cluster(&[]).await?;
    // Every member's incarnation 1 got its user on both targets before any unit.
    for id in 1..=3 {
        for target in ["eu", "ap"] {
            assert!(fence
                .position(&Event::Ensured(target.into(), id, 1))
                .is_some());
        }
        let login = cluster.node(id).writer_login().borrow().clone();
        assert2::check!(login.map(|l| l.incarnation) == Some(1));
    }
    let victim = crash_a_follower_until_fenced(&mut cluster, leader, &fence).await?;
    let status = cluster.node(leader).status().await?;
    let member = status.members.iter().find(|m| m.id == victim);
    assert2::check!(member.is_some_and(|m| m.fenced && m.writer_incarnation == Some(1)));

    // Back, it writes only as a new incarnation, whose users exist before it gets units.
    cluster.restart(victim).await?;
    wait_until(
        "the member is back as incarnation 2",
        Duration::from_secs(10),
        || {
            cluster
                .node(victim)
                .writer_login()
                .borrow()
                .as_ref()
                .is_some_and(|l| l.incarnation == 2)
        },
    )
    .await?;
    wait_until(
        "incarnation 2 ensured on both targets",
        Duration::from_secs(10),
        || {
            ["eu", "ap"].iter().all(|t| {
                fence
                    .position(&Event::Ensured((*t).into(), victim, 2))
                    .is_some()
            })
        },
    )
    .await?;
    let revoked = fence.position(&Event::Revoked("eu".into(), victim, 1));
    let ensured = fence.position(&Event::Ensured("eu".into(), victim, 2));
    assert!(revoked < ensured, "{:?}", fence.events());
    cluster.shutdown().await;
    Ok(())
}

/// A member whose process died is fenced on the evidence of its refused connections: with
/// `fence_after` and the leases far longer than the test may take, nothing else could move
/// its units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_members_refused_connections_fence_it_without_waiting_for_fence_after() -> TestResult
{
    let timing = ControlTiming {
        fence_after: Duration::from_secs(600),
        lease_expiry: Duration::from_secs(1200),
        ..fast_timing()
    };
    let (mut cluster, leader, fence) = fenced_cluster_timed(timing, &[]).await?;
    let victim = crash_a_follower_until_fenced(&mut cluster, leader, &fence).await?;
    // The survivors renew as ever: nobody else was taken for gone.
    let status = cluster.node(leader).status().await?;
    for member in status.members.iter().filter(|m| m.id != victim) {
        assert2::check!(!member.fenced, "member {}", member.id);
    }
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_does_not_acknowledge_holds_back_only_the_units_writing_to_it() -> TestResult
{
    let (mut cluster, leader, fence) = fenced_cluster(&["ap"]).await?;
    // A follower owning units of both flows.
    let before = cluster.owners(leader).await?;
    let victim = [1, 2, 3]
        .into_iter()
        .find(|id| {
            *id != leader && owned_by(&before, *id, "f") > 0 && owned_by(&before, *id, "g") > 0
        })
        .ok_or("no follower owns units of both flows")?;
    let held = owned_by(&before, victim, "g");
    cluster.crash(victim).await;
    // `eu` acknowledged: the dead member's units of `f` moved; those of `g` wait for `ap`.
    cluster
        .wait_owners("the dead member's units of f moved", leader, |o| {
            owned_by(o, victim, "f") == 0
                && o.iter()
                    .filter(|(u, _)| u.flow == "f")
                    .all(|(_, n)| n.is_some())
        })
        .await?;
    cluster
        .wait_metrics("the revoke on ap fails and is retried", leader, |m| {
            m.fence_failures >= 3 && m.fences_pending == 1
        })
        .await?;
    let now = cluster.owners(leader).await?;
    assert2::check!(owned_by(&now, victim, "g") == held);
    let status = cluster.node(leader).status().await?;
    assert!(status
        .fence_error
        .is_some_and(|e| e.contains("ap unreachable")));
    // `ap` is back: the fence goes through there too and the rest moves.
    fence.set_down("ap", false);
    cluster
        .wait_owners("the dead member's units of g moved", leader, |o| {
            o.values().all(|owner| owner.is_some_and(|n| n != victim))
        })
        .await?;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_added_by_a_reload_gets_every_identitys_user_before_its_units_move() -> TestResult
{
    let (cluster, leader, fence) = fenced_cluster(&["na"]).await?;
    // Flow `h` into the new target `na`, which does not answer yet.
    for id in 1..=3 {
        cluster
            .node(id)
            .set_fence_topology(topology(&[("f", "eu"), ("g", "ap"), ("h", "na")]));
    }
    cluster
        .node(leader)
        .report_units("h", units("h", 3))
        .await?;
    cluster
        .wait_metrics("the users on na are attempted", leader, |m| {
            m.fence_failures >= 3
        })
        .await?;
    let now = cluster.owners(leader).await?;
    assert2::check!(now
        .iter()
        .filter(|(u, _)| u.flow == "h")
        .all(|(_, o)| o.is_none()));
    fence.set_down("na", false);
    cluster
        .wait_owners("the units of h are granted", leader, |o| {
            o.iter()
                .filter(|(u, _)| u.flow == "h")
                .all(|(_, n)| n.is_some())
        })
        .await?;
    for id in 1..=3 {
        assert!(fence
            .position(&Event::Ensured("na".into(), id, 1))
            .is_some());
    }
    cluster.shutdown().await;
    Ok(())
}

/// A member restarted with an empty data dir (wiped, or its disk lost) in a young cluster: the
/// leader replays the whole log to it from index 1, the `SetWriterIdentity` of its
/// predecessor's identity among the entries. The new process never writes as that identity
/// (its predecessor's last sends may still be on their way): it gives it up and writes only as
/// the next one, whose user exists only after the old one was revoked.
///
/// The predecessor's identity is its second (the first was given up) and comes after entries
/// larger than one AppendEntries carries (`APPEND_BYTES_BUDGET`, 256 KiB), so that the replay is applied in
/// several batches, the first of them before that identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_with_an_empty_data_dir_never_writes_as_its_predecessors_identity(
) -> TestResult {
    let fence = Arc::new(RecordingFence::default());
    let fencing = Fencing {
        fence: fence.clone(),
        topology: topology(&[("f", "eu")]),
    };
    let mut cluster = TestCluster::start_fenced(3, fast_timing(), fencing).await?;
    let leader = cluster.wait_leader(Duration::from_secs(30)).await?;
    let victim = follower_of(leader);
    let writes_as = |incarnation: u64| {
        let cluster = &cluster;
        move || {
            cluster
                .node(victim)
                .writer_login()
                .borrow()
                .as_ref()
                .is_some_and(|l| l.incarnation == incarnation)
        }
    };
    wait_until(
        "the member writes as incarnation 1",
        Duration::from_secs(30),
        writes_as(1),
    )
    .await?;
    // Large entries (unit reports of a paused flow, so that no round grants them), then the
    // member's next identity.
    cluster
        .node(leader)
        .set_flow_paused("big", true, "the test".into())
        .await?;
    for part in 0..2 {
        let units: Vec<WorkUnit> = (part * 3_000..(part + 1) * 3_000)
            .map(|p| {
                WorkUnit::new(
                    "big",
                    "a-rather-long-stream-name",
                    "a-rather-long-topic-name",
                    p,
                )
            })
            .collect();
        cluster.node(leader).report_units("big", units).await?;
    }
    cluster.node(victim).abandon_writer_identity(1).await?;
    wait_until(
        "the member writes as incarnation 2",
        Duration::from_secs(30),
        writes_as(2),
    )
    .await?;
    cluster.crash(victim).await;
    std::fs::remove_dir_all(cluster.data_dir(victim))?;
    cluster.restart(victim).await?;
    // The first identity the new process gives its writers.
    let mut logins = cluster.node(victim).writer_login();
    let first = tokio::time::timeout(Duration::from_secs(60), logins.wait_for(Option::is_some))
        .await
        .map_err(|_| "no writer identity 60 s after the restart")??
        .as_ref()
        .map(|l| l.incarnation)
        .ok_or("none")?;
    assert!(
        first > 2,
        "writes as its predecessor's identity {first} (incarnations 1 and 2 were the predecessor's)"
    );
    let next = Event::Ensured("eu".into(), victim, first);
    wait_until("the next identity's user", Duration::from_secs(30), || {
        fence.position(&next).is_some()
    })
    .await?;
    let revoked = fence.position(&Event::Revoked("eu".into(), victim, 2));
    assert!(
        revoked.is_some() && revoked < fence.position(&next),
        "{:?}",
        fence.events()
    );
    cluster.shutdown().await;
    Ok(())
}
