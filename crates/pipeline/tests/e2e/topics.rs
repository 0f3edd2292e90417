//! Topology changes upstream: new topics, more partitions, deleted and recreated topics, and
//! where units without progress start.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iggy::prelude::Identifier;
use replicator_model::{InitialOffset, Naming, WorkUnit};
use replicator_pipeline::{InMemoryControl, Pipeline};
use replicator_sdk::IggyCluster as _;

use crate::harness::{
    assert_exact, client, confirmed, count, create_topic, flow, produce, wait_confirmed,
    wait_until, Env, Intercept, Intercepted, TestResult,
};

/// A control plane that cannot take the first reports (counted down here), as the nodes of a
/// cluster that has not elected its first leader yet.
#[derive(Clone)]
struct NoLeaderYet(Arc<AtomicU32>);

impl Intercept for NoLeaderYet {
    fn takes_report(&self) -> bool {
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_the_control_plane_could_not_take_yet_are_reported_again_before_the_next_round(
) -> TestResult {
    let (env, _up, f) = Env::seeded("early", "events", 2, 0..40, 40).await?;
    let mut params = env.params(f);
    // Far longer than the test waits: only an early retry gets the units assigned in time.
    params.discovery_interval = Duration::from_secs(3600);
    let deferrals = Arc::new(AtomicU32::new(3));
    let control = Intercepted {
        inner: InMemoryControl::new(),
        hooks: NoLeaderYet(deferrals.clone()),
    };
    let pipeline = Pipeline::start(params, control).await?;
    env.wait_downstream("early", "events", 0, 40).await?;
    env.wait_downstream("early", "events", 1, 40).await?;
    assert2::check!(deferrals.load(Ordering::SeqCst) == 0);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_topics_and_added_partitions_upstream_are_replicated() -> TestResult {
    let (env, up, mut f) = Env::seeded("grow", "first", 1, 0..300, 100).await?;
    f.naming = Naming::Prefix;
    let pipeline = Pipeline::start(env.params(f.clone()), InMemoryControl::new()).await?;
    env.wait_downstream("us.grow", "first", 0, 300).await?;
    create_topic(&up, "grow", "second", 2).await?;
    produce(&up, "grow", "second", 2, 0..200, 100).await?;
    up.create_partitions(&Identifier::named("grow")?, &Identifier::named("first")?, 2)
        .await?;
    produce(&up, "grow", "first", 3, 300..400, 100).await?;
    let down = client(&env.eu).await?;
    wait_until("partitions mirrored", Duration::from_secs(30), || async {
        let topic = down
            .get_topic(
                &Identifier::named("us.grow").unwrap(),
                &Identifier::named("first").unwrap(),
            )
            .await;
        matches!(topic, Ok(Some(t)) if t.partitions_count == 3)
    })
    .await?;
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.partitions.len() == 5);
    assert!(report.downstream_total() == 400 + 100 + 100 + 200 * 2);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_topic_stops_its_units_and_recreated_topic_starts_over() -> TestResult {
    let (env, up, f, unit, control, pipeline) = Env::copied_unit("life", "cycle").await?;
    up.delete_topic(&Identifier::named("life")?, &Identifier::named("cycle")?)
        .await?;
    wait_until("unit retired", Duration::from_secs(30), || async {
        !control.is_present(&unit) && control.epoch(&unit).is_none()
    })
    .await?;
    // The offset is kept after the topic is gone.
    assert!(confirmed(&control, &unit) == Some(99));
    create_topic(&up, "life", "cycle", 1).await?;
    produce(&up, "life", "cycle", 1, 0..10, 10).await?;
    // The recreated topic is copied too.
    env.wait_downstream("life", "cycle", 0, 110).await?;
    // The new topic started from `earliest`, not after the old offset 99.
    let report = env.verify(&f, Duration::from_secs(30)).await?;
    assert_exact(&report);
    assert!(report.partitions[0].upstream == 10);
    // The new history is confirmed.
    wait_confirmed(&control, &unit, 9, Duration::from_secs(10)).await?;
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_without_progress_start_at_the_initial_offset() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "late", "t", 1).await?;
    create_topic(&up, "fixed", "t", 1).await?;
    produce(&up, "late", "t", 1, 0..50, 50).await?;
    produce(&up, "fixed", "t", 1, 0..50, 50).await?;
    let mut latest = flow("latest", &["late/*"]);
    latest.initial_offset = InitialOffset::Latest;
    let mut at = flow("at", &["fixed/*"]);
    at.initial_offset = InitialOffset::At(30);
    let mut params = env.params(latest);
    params.flows.push(at);
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    // The `at` flow copies from offset 30 on.
    env.wait_downstream("fixed", "t", 0, 20).await?;
    let late = WorkUnit::new("latest", "late", "t", 0);
    wait_until("latest unit running", Duration::from_secs(30), || async {
        let stats = pipeline.stats().await.unwrap_or_default();
        stats
            .iter()
            .any(|s| s.unit == late && s.upstream_end == Some(50))
    })
    .await?;
    produce(&up, "late", "t", 1, 50..60, 10).await?;
    // Latest copied only the new messages.
    wait_confirmed(&control, &late, 59, Duration::from_secs(30)).await?;
    assert!(count(&env.eu, "late", "t", 0) == 10);
    pipeline.shutdown().await;
    Ok(())
}
