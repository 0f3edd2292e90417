//! Fencing at the targets, seen from the control plane: a recording `WriterFence` stands in for
//! the Iggy clusters (the Iggy side is tested in the binary's process tests).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use replicator_control::{FenceFuture, Fencing, WriterFence};
use replicator_model::{NodeId, WorkUnit, WriterLogin};

use crate::util::*;

/// What happened on the "targets", in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Provisioned(NodeId, u64),
    Revoked(NodeId, u64),
    Retired(NodeId, u64),
}

#[derive(Default)]
struct RecordingFence {
    events: Mutex<Vec<Event>>,
    /// While set, every revoke fails (a target that is down).
    refuse_revokes: AtomicBool,
}

impl RecordingFence {
    fn events(&self) -> Vec<Event> {
        self.events.lock().expect("not poisoned").clone()
    }

    fn record(&self, e: Event) {
        self.events.lock().expect("not poisoned").push(e);
    }
}

impl WriterFence for RecordingFence {
    fn provision<'a>(&'a self, login: &'a WriterLogin) -> FenceFuture<'a, ()> {
        Box::pin(async move {
            self.record(Event::Provisioned(login.node, login.incarnation));
            Ok(())
        })
    }

    fn revoke(&self, node: NodeId, incarnation: u64) -> FenceFuture<'_, ()> {
        Box::pin(async move {
            if self.refuse_revokes.load(Ordering::SeqCst) {
                return Err("target unreachable".to_owned());
            }
            self.record(Event::Revoked(node, incarnation));
            Ok(())
        })
    }

    fn retire(&self, node: NodeId, incarnation: u64) -> FenceFuture<'_, ()> {
        Box::pin(async move {
            self.record(Event::Retired(node, incarnation));
            Ok(())
        })
    }
}

async fn fenced_cluster(
    refuse: bool,
) -> Result<(TestCluster, NodeId, Arc<RecordingFence>), Box<dyn std::error::Error + Send + Sync>> {
    let fence = Arc::new(RecordingFence::default());
    fence.refuse_revokes.store(refuse, Ordering::SeqCst);
    let fencing = Fencing {
        fence: fence.clone(),
        every_target_fenced: true,
    };
    let cluster = TestCluster::start_fenced(3, fast_timing(), fencing).await?;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    cluster.report_units(leader, 6).await?;
    cluster
        .wait_owners("two units each", leader, |o| {
            o.len() == 6 && (1..=3).all(|id| owned_by(o, id) == 2)
        })
        .await?;
    Ok((cluster, leader, fence))
}

fn owned_by(owners: &BTreeMap<WorkUnit, Option<NodeId>>, node: NodeId) -> usize {
    owners.values().filter(|o| **o == Some(node)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_go_only_to_members_with_an_identity_and_a_dead_owner_is_fenced_first() -> TestResult
{
    let (mut cluster, leader, fence) = fenced_cluster(false).await?;
    // Every member was given incarnation 1 before it got anything.
    for id in 1..=3 {
        assert!(fence.events().contains(&Event::Provisioned(id, 1)));
        let login = cluster.node(id).writer_login().borrow().clone();
        assert2::check!(login.map(|l| l.incarnation) == Some(1));
    }
    let victim = follower_of(leader);
    cluster.crash(victim).await;
    cluster
        .wait_owners("the dead member's units moved", leader, |o| {
            owned_by(o, victim) == 0 && o.values().all(Option::is_some)
        })
        .await?;
    assert!(fence.events().contains(&Event::Revoked(victim, 1)));
    let status = cluster.node(leader).status().await?;
    let member = status.members.iter().find(|m| m.id == victim);
    assert2::check!(member.is_some_and(|m| m.fenced && m.writer_incarnation == Some(1)));

    // Back, it writes only as a new incarnation; the old one is retired.
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
    wait_until("incarnation 1 retired", Duration::from_secs(10), || {
        fence.events().contains(&Event::Retired(victim, 1))
    })
    .await?;
    let events = fence.events();
    let revoked = events.iter().position(|e| *e == Event::Revoked(victim, 1));
    let reprovisioned = events
        .iter()
        .position(|e| *e == Event::Provisioned(victim, 2));
    assert!(revoked < reprovisioned, "{events:?}");
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_the_targets_do_not_acknowledge_blocks_only_the_dead_members_units() -> TestResult
{
    let (mut cluster, leader, fence) = fenced_cluster(true).await?;
    let victim = follower_of(leader);
    let before = cluster.owners(leader).await?;
    cluster.crash(victim).await;
    cluster
        .wait_metrics("fence attempts fail and are retried", leader, |m| {
            m.fence_failures >= 3 && m.fences_pending == 1
        })
        .await?;
    // Its units stay with it (nobody else may write them), the others keep theirs.
    let now = cluster.owners(leader).await?;
    assert2::check!(now == before);
    let status = cluster.node(leader).status().await?;
    assert2::check!(status.fences_pending == 1);
    assert!(status
        .fence_error
        .is_some_and(|e| e.contains("target unreachable")));
    // The target is back: the fence goes through and the units move.
    fence.refuse_revokes.store(false, Ordering::SeqCst);
    cluster
        .wait_owners("the dead member's units moved", leader, |o| {
            owned_by(o, victim) == 0 && o.values().all(Option::is_some)
        })
        .await?;
    cluster.shutdown().await;
    Ok(())
}
