//! Ownership: revoked units, lost leases and requested releases stop writes cleanly.

use std::time::Duration;

use iggy::prelude::{Identifier, Permissions, UserStatus};
use replicator_model::{WorkUnit, WriterLogin};
use replicator_pipeline::{InMemoryLease, TargetFence};
use replicator_sdk::IggyCluster as _;

use crate::harness::{
    assert_exact, client, count, flow, produce, wait_confirmed, wait_until, Env, TestResult,
};

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

/// A fence's revoke on a target (`TargetFence::revoke`, what the leader runs before it moves a
/// failed member's partitions): the writer user loses every right and can no longer sign in;
/// a user that does not exist yet is created that way, so a late `ensure` finds the name taken
/// and leaves it revoked; revoking again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_takes_every_right_and_deactivates_whether_the_user_exists_or_not() -> TestResult {
    let env = Env::start().await?;
    let eu = client(&env.eu).await?;
    let mut params = env.params(flow("f", &["revoke/*"]));
    params
        .clusters
        .get_mut("eu")
        .ok_or("no eu cluster")?
        .writer_user_prefix = Some("repl".to_owned());
    let node = params.node_id;
    let fence = TargetFence::new(&params)?.ok_or("no fenced target")?;
    let login = |incarnation: u64| WriterLogin {
        node,
        incarnation,
        password: format!("writer-password-{incarnation}"),
    };
    let user = |incarnation: u64| {
        let eu = &eu;
        async move {
            let name = login(incarnation).username("repl");
            let found = eu.get_user(&Identifier::named(&name)?).await?;
            let u = found.ok_or_else(|| format!("no user {name}"))?;
            TestResult::Ok((u.status, u.permissions.unwrap_or_default()))
        }
    };
    let revoked = (UserStatus::Inactive, Permissions::default());

    fence.ensure("eu", &login(1)).await?;
    let (status, rights) = user(1).await?;
    assert_eq!(status, UserStatus::Active);
    assert!(
        rights.global.send_messages,
        "a writer user may send: {rights:?}"
    );
    fence.revoke("eu", node, 1).await?;
    assert_eq!(user(1).await?, revoked);
    fence.revoke("eu", node, 1).await?;
    assert_eq!(user(1).await?, revoked);

    // Never created (its node died before the leader's `ensure` reached the target).
    fence.revoke("eu", node, 2).await?;
    assert_eq!(user(2).await?, revoked);
    fence.ensure("eu", &login(2)).await?;
    assert_eq!(user(2).await?, revoked);
    fence.close().await;
    Ok(())
}
