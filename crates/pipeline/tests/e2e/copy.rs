//! Copying through restarts, crashes and outages: the result stays exact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use replicator_pipeline::{InMemoryControl, Pipeline};

use crate::harness::{
    assert_exact, client, confirmed_total, count, produce, wait_until, Env, Intercepted,
    StallCommits, TestResult,
};

/// Sum of messages in the first `partitions` downstream partitions of `{stream}/created`.
fn copied(env: &Env, stream: &str, partitions: u32) -> u64 {
    (0..partitions)
        .map(|p| count(&env.eu, stream, "created", p))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_copies_100k_messages_over_8_partitions_exactly() -> TestResult {
    let (env, _up, f) = Env::seeded("orders", "created", 8, 0..12_500, 1000).await?;
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
    let (env, _up, f) = Env::seeded("restart", "created", 4, 0..5_000, 500).await?;
    let (control, first) = env.run(&f).await?;
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
    assert!(confirmed_total(&control) == copied(&env, "restart", 4));
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    producing.await??;
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == 40_000);
    second.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_write_and_commit_leaves_no_duplicates_after_restart() -> TestResult {
    let (env, up, mut f) = Env::seeded("crash", "created", 2, 0..2_000, 500).await?;
    f.batch_size = 100;
    let control = InMemoryControl::new();
    let stalling = Intercepted {
        inner: control.clone(),
        hooks: StallCommits(Arc::new(AtomicBool::new(false))),
    };
    let first = Pipeline::start(env.params(f.clone()), stalling.clone()).await?;
    wait_until("first messages copied", Duration::from_secs(30), || async {
        copied(&env, "crash", 2) >= 400
    })
    .await?;
    stalling.hooks.0.store(true, Ordering::SeqCst);
    produce(&up, "crash", "created", 2, 2_000..4_000, 500).await?;
    wait_until(
        "everything written downstream",
        Duration::from_secs(30),
        || async { copied(&env, "crash", 2) == 8_000 },
    )
    .await?;
    first.crash().await;
    let confirmed = confirmed_total(&control);
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
    let (env, up, mut f) = Env::seeded("outage", "created", 4, 0..2_000, 500).await?;
    f.batch_size = 200;
    let (control, pipeline) = env.run(&f).await?;
    wait_until("first messages copied", Duration::from_secs(30), || async {
        copied(&env, "outage", 4) >= 1_000
    })
    .await?;
    let faults = env.eu.faults();
    faults.refuse_connections(true);
    faults.drop_connections();
    produce(&up, "outage", "created", 4, 2_000..4_000, 500).await?;
    // While downstream is unreachable nothing is written, so confirmed offsets stand still.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = confirmed_total(&control);
    let held = copied(&env, "outage", 4);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(confirmed_total(&control) == during);
    assert!(copied(&env, "outage", 4) == held);
    assert!(held < 16_000);
    faults.clear();
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == 16_000);
    wait_until("all confirmed", Duration::from_secs(10), || async {
        confirmed_total(&control) == 16_000
    })
    .await?;
    pipeline.shutdown().await;
    Ok(())
}
