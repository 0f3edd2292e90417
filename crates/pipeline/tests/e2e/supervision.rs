//! The data path's supervision tree (supervisor → coordinator → flow actors → a reader and a
//! writer actor per unit): whatever part of it dies mid-copy, with messages still arriving, is
//! started again by its parent, and the copy ends exact.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use replicator_model::WorkUnit;
use replicator_pipeline::{InMemoryControl, Pipeline};

use crate::harness::{
    assert_exact, confirmed, produce, wait_confirmed, wait_until, Env, Intercept, Intercepted,
    TestResult,
};

/// Partitions of the scenarios' topic.
const PARTITIONS: u32 = 3;

/// Kills the actors `depth` levels under the root (1: the coordinator, 2: the flow actors, 3:
/// the readers and writers) three times while messages keep arriving, and checks that the copy
/// ends exact, every unit confirmed to the end and the coordinator answering heartbeats again.
async fn killed_at_depth_the_copy_ends_exact(stream: &str, depth: usize) -> TestResult {
    let (env, up, f) = Env::seeded(stream, "t", PARTITIONS, 0..100, 50).await?;
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    let units: Vec<WorkUnit> = (0..PARTITIONS)
        .map(|p| WorkUnit::new(stream, stream, "t", p))
        .collect();
    for round in 0..3u64 {
        // Something copied under the actors about to die, then more to copy after.
        let first = units.first().ok_or("no unit")?;
        wait_until("a copy under way", Duration::from_secs(30), || async {
            confirmed(&control, first).is_some_and(|o| o >= 100 * round)
        })
        .await?;
        // The copy can get under way before the actors the previous round killed are all back
        // (the old units finish their batches while a new coordinator starts): wait for some.
        wait_until(
            &format!("actors at depth {depth} to kill"),
            Duration::from_secs(30),
            || std::future::ready(pipeline.kill_actors_for_tests(depth) > 0),
        )
        .await?;
        let next = 100 * (round + 1);
        produce(&up, stream, "t", PARTITIONS, next..next + 100, 50).await?;
    }
    for unit in &units {
        wait_confirmed(&control, unit, 399, Duration::from_secs(60)).await?;
    }
    assert_exact(&env.verify(&f, Duration::from_secs(30)).await?);
    // The coordinator now running answers the watchdog.
    let liveness = pipeline.liveness();
    wait_until(
        "the coordinator answers",
        Duration::from_secs(30),
        || async {
            liveness
                .wedged_for(Instant::now(), Duration::from_secs(5))
                .is_none()
        },
    )
    .await?;
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_readers_and_writers_restart_with_their_pairs_and_the_copy_stays_exact() -> TestResult
{
    killed_at_depth_the_copy_ends_exact("sup-pairs", 3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_flow_actor_is_restarted_with_its_units_and_the_copy_stays_exact() -> TestResult {
    killed_at_depth_the_copy_ends_exact("sup-flow", 2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_is_restarted_by_the_supervisor_and_the_copy_stays_exact() -> TestResult
{
    killed_at_depth_the_copy_ends_exact("sup-coord", 1).await
}

/// Commits that panic, the first `panics` times.
#[derive(Clone)]
struct PanickingCommits {
    left: Arc<AtomicU64>,
}

impl Intercept for PanickingCommits {
    fn before_commit(&self) -> impl Future<Output = ()> + Send {
        let panic_now = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        async move {
            assert!(!panic_now, "a commit panicked (injected by the test)");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_panics_restarts_with_its_pair_and_the_copy_stays_exact() -> TestResult {
    let (env, up, f) = Env::seeded("sup-panic", "t", 1, 0..100, 50).await?;
    let control = InMemoryControl::new();
    let panicking = Intercepted {
        inner: control.clone(),
        hooks: PanickingCommits {
            left: Arc::new(AtomicU64::new(2)),
        },
    };
    let unit = WorkUnit::new("sup-panic", "sup-panic", "t", 0);
    let pipeline = Pipeline::start(env.params(f.clone()), panicking).await?;
    produce(&up, "sup-panic", "t", 1, 100..200, 50).await?;
    wait_confirmed(&control, &unit, 199, Duration::from_secs(60)).await?;
    let stats = pipeline.stats().await?;
    let restarts = stats
        .iter()
        .find(|s| s.unit == unit)
        .map_or(0, |s| s.restarts);
    assert!(
        restarts >= 2,
        "the pair restarted {restarts} times, not after each panic"
    );
    assert_exact(&env.verify(&f, Duration::from_secs(30)).await?);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_that_keeps_dying_is_given_up_and_the_pipeline_says_so() -> TestResult {
    let (env, _up, f) = Env::seeded("sup-giveup", "t", 1, 0..10, 10).await?;
    let pipeline = Pipeline::start(env.params(f), InMemoryControl::new()).await?;
    let gave_up = pipeline.gave_up();
    tokio::pin!(gave_up);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut kills = 0;
    loop {
        tokio::select! {
            () = &mut gave_up => break,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        assert!(
            Instant::now() < deadline,
            "not given up after {kills} coordinators killed"
        );
        // Every coordinator the supervisor starts again, as soon as it runs.
        kills += pipeline.kill_actors_for_tests(1);
    }
    assert!(kills > 1, "given up after {kills} deaths");
    assert!(
        pipeline.kill_actors_for_tests(1) == 0,
        "a coordinator runs after the give-up"
    );
    pipeline.shutdown().await;
    Ok(())
}
