//! Ownership: revoked units, lost leases and requested releases stop writes cleanly.

use std::time::Duration;

use replicator_model::WorkUnit;
use replicator_pipeline::InMemoryLease;

use crate::harness::{assert_exact, count, produce, wait_confirmed, wait_until, Env, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_unit_and_lost_lease_stop_writes_until_ownership_returns() -> TestResult {
    let (env, up, f, unit, control, pipeline) = Env::copied_unit("fence", "t").await?;

    // Revoked: the writer's epoch check refuses every send from now on.
    control.revoke(&unit);
    produce(&up, "fence", "t", 1, 100..200, 100).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(count(&env.eu, "fence", "t", 0) == 100);

    control.set_lease(InMemoryLease::Missing);
    control.grant(&unit);
    // The new pair starts and reads, but its writer holds the batch while the lease is missing.
    let granted = control.epoch(&unit);
    wait_until(
        "reading under the new grant while the lease is missing",
        Duration::from_secs(10),
        || async {
            pipeline.stats().await.is_ok_and(|s| {
                s.iter()
                    .any(|s| Some(s.epoch) == granted && s.upstream_end == Some(200))
            })
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(count(&env.eu, "fence", "t", 0) == 100);

    control.set_lease(InMemoryLease::Held);
    // Resumed.
    wait_confirmed(&control, &unit, 199, Duration::from_secs(30)).await?;
    assert_exact(&env.verify(&f, Duration::from_secs(10)).await?);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requested_release_drains_commits_and_hands_the_unit_back() -> TestResult {
    let (env, up, f) = Env::seeded("rel", "t", 1, 0..1000, 100).await?;
    let unit = WorkUnit::new("rel", "rel", "t", 0);
    let (control, pipeline) = env.run(&f).await?;
    wait_until("assigned", Duration::from_secs(10), || async {
        control.epoch(&unit).is_some()
    })
    .await?;
    let first = control.epoch(&unit).ok_or("not assigned")?;
    control.request_release(&unit);
    // The unit is released, then granted again by the next discovery round under a new epoch.
    wait_until("granted again", Duration::from_secs(10), || async {
        control.epoch(&unit).is_some_and(|e| e > first)
    })
    .await?;
    produce(&up, "rel", "t", 1, 1000..1100, 100).await?;
    assert_exact(&env.verify(&f, Duration::from_secs(30)).await?);
    wait_confirmed(&control, &unit, 1099, Duration::from_secs(10)).await?;
    pipeline.shutdown().await;
    Ok(())
}
