//! Copying through restarts, crashes and outages: the result stays exact.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use replicator_model::{Assignment, CommitOutcome, Epoch, OffsetCommit, UnitProgress, WorkUnit};
use replicator_pipeline::{ControlError, ControlPlane, InMemoryControl, Pipeline};
use tokio::sync::watch;

use crate::harness::{
    assert_exact, client, count, create_topic, flow, produce, wait_until, Env, TestResult,
};

/// Sum of messages in the first `partitions` downstream partitions of `orders/created`.
fn copied(env: &Env, stream: &str, partitions: u32) -> u64 {
    (0..partitions)
        .map(|p| count(&env.eu, stream, "created", p))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_copies_100k_messages_over_8_partitions_exactly() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "orders", "created", 8).await?;
    produce(&up, "orders", "created", 8, 0..12_500, 1000).await?;
    let f = flow("copy100k", &["orders/*"]);
    let pipeline = Pipeline::start(env.params(f.clone()), InMemoryControl::new()).await?;
    let report = env.verify(&f, Duration::from_secs(90)).await?;
    assert_exact(&report);
    assert!(report.upstream_total() == 100_000);
    assert!(report.downstream_total() == 100_000);
    let stats = pipeline.stats().await?;
    assert!(stats.len() == 8);
    assert!(stats.iter().map(|s| s.messages).sum::<u64>() == 100_000);
    assert!(stats.iter().all(|s| s.lag == Some(0)));
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_restart_mid_stream_copies_exactly_without_duplicates() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "restart", "created", 4).await?;
    produce(&up, "restart", "created", 4, 0..5_000, 500).await?;
    let f = flow("restart", &["restart/*"]);
    let control = InMemoryControl::new();
    let first = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    wait_until("some messages copied", Duration::from_secs(30), || async {
        copied(&env, "restart", 4) >= 2_000
    })
    .await?;
    let producing = {
        let up = client(&env.us).await?;
        tokio::spawn(async move { produce(&up, "restart", "created", 4, 5_000..10_000, 250).await })
    };
    first.shutdown().await;
    // A graceful stop commits and releases every unit.
    assert!(control.assigned().is_empty());
    let committed: u64 = control
        .known_units()
        .iter()
        .filter_map(|u| control.progress(u).and_then(|p| p.confirmed).map(|o| o + 1))
        .sum();
    assert!(committed == copied(&env, "restart", 4));
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    producing.await??;
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == 40_000);
    second.shutdown().await;
    Ok(())
}

/// A control plane whose commits hang forever once `stall` is set: every write after that point
/// is downstream but never confirmed.
#[derive(Clone)]
struct StallingCommits {
    inner: InMemoryControl,
    stall: Arc<AtomicBool>,
}

impl ControlPlane for StallingCommits {
    fn assignments(&self) -> watch::Receiver<Vec<Assignment>> {
        self.inner.assignments()
    }
    fn lease_valid_until(&self) -> Option<Instant> {
        self.inner.lease_valid_until()
    }
    fn progress(&self, unit: &WorkUnit) -> Option<UnitProgress> {
        self.inner.progress(unit)
    }
    fn commit(
        &self,
        commits: Vec<OffsetCommit>,
    ) -> impl Future<Output = Result<Vec<CommitOutcome>, ControlError>> + Send {
        let (inner, stall) = (self.inner.clone(), self.stall.load(Ordering::SeqCst));
        async move {
            if stall {
                std::future::pending::<()>().await;
            }
            inner.commit(commits).await
        }
    }
    fn report_units(
        &self,
        flow: &str,
        units: Vec<WorkUnit>,
    ) -> impl Future<Output = Result<(), ControlError>> + Send {
        self.inner.report_units(flow, units)
    }
    fn release(
        &self,
        unit: WorkUnit,
        epoch: Epoch,
    ) -> impl Future<Output = Result<(), ControlError>> + Send {
        self.inner.release(unit, epoch)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_write_and_commit_leaves_no_duplicates_after_restart() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "crash", "created", 2).await?;
    produce(&up, "crash", "created", 2, 0..2_000, 500).await?;
    let mut f = flow("crash", &["crash/*"]);
    f.batch_size = 100;
    let control = InMemoryControl::new();
    let stalling = StallingCommits {
        inner: control.clone(),
        stall: Arc::new(AtomicBool::new(false)),
    };
    let first = Pipeline::start(env.params(f.clone()), stalling.clone()).await?;
    wait_until("first messages copied", Duration::from_secs(30), || async {
        copied(&env, "crash", 2) >= 400
    })
    .await?;
    stalling.stall.store(true, Ordering::SeqCst);
    produce(&up, "crash", "created", 2, 2_000..4_000, 500).await?;
    wait_until(
        "everything written downstream",
        Duration::from_secs(30),
        || async { copied(&env, "crash", 2) == 8_000 },
    )
    .await?;
    first.crash().await;
    let confirmed: u64 = control
        .known_units()
        .iter()
        .filter_map(|u| control.progress(u).and_then(|p| p.confirmed).map(|o| o + 1))
        .sum();
    // The crash left written-but-unconfirmed messages behind.
    assert!(confirmed < 8_000, "confirmed {confirmed}");
    produce(&up, "crash", "created", 2, 4_000..4_500, 500).await?;
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == 9_000);
    second.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downstream_outage_mid_stream_pauses_and_resumes_exactly() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "outage", "created", 4).await?;
    produce(&up, "outage", "created", 4, 0..2_000, 500).await?;
    let mut f = flow("outage", &["outage/*"]);
    f.batch_size = 200;
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    wait_until("first messages copied", Duration::from_secs(30), || async {
        copied(&env, "outage", 4) >= 1_000
    })
    .await?;
    let faults = env.eu.faults();
    faults.refuse_connections(true);
    faults.drop_connections();
    produce(&up, "outage", "created", 4, 2_000..4_000, 500).await?;
    let confirmed = || -> u64 {
        control
            .known_units()
            .iter()
            .filter_map(|u| control.progress(u).and_then(|p| p.confirmed).map(|o| o + 1))
            .sum()
    };
    // While downstream is unreachable nothing is written, so confirmed offsets stand still.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = confirmed();
    let held = copied(&env, "outage", 4);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(confirmed() == during);
    assert!(copied(&env, "outage", 4) == held);
    assert!(held < 16_000);
    faults.clear();
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == 16_000);
    wait_until("all confirmed", Duration::from_secs(10), || async {
        confirmed() == 16_000
    })
    .await?;
    pipeline.shutdown().await;
    Ok(())
}
