//! Consumer-group offset sync: selected upstream groups' offsets arrive translated exactly on
//! the target (the message at the translated offset downstream is the one the group stored
//! upstream, by id), also when the writers' maps are gone (a restart: the translation searches
//! the downstream partition); a group with a member on the target is skipped and left alone.

use std::time::Duration;

use iggy::prelude::Identifier;
use replicator_harness::Client;
use replicator_harness::{group_offset, store_group_offsets, translated_exactly};
use replicator_model::WorkUnit;
use replicator_pipeline::{FlowParams, Pipeline};
use replicator_sdk::IggyCluster as _;

use crate::harness::{client, create_topic, produce, wait_confirmed, wait_until, Env, TestResult};

const WAIT: Duration = Duration::from_secs(30);

fn id(name: &str) -> TestResult<Identifier> {
    Ok(Identifier::named(name)?)
}

/// A flow over `stream/*` syncing `groups` every 100 ms.
fn syncing(stream: &str, groups: &[&str]) -> FlowParams {
    let mut f = crate::harness::flow(stream, &[&format!("{stream}/*")]);
    f.consumer_groups = groups.iter().map(|g| (*g).to_owned()).collect();
    f.consumer_group_sync_interval = Duration::from_millis(100);
    f
}

/// Waits until `group` on the target stored, on `partition`, the offset of the copy of the
/// message at `upstream` upstream (same id).
async fn check_translated(
    up: &Client,
    down: &Client,
    (stream, topic, group): (&str, &str, &str),
    partition: u32,
    upstream: u64,
) -> TestResult {
    let what = format!("{group} translated on partition {partition} at upstream {upstream}");
    wait_until(&what, WAIT, || async {
        translated_exactly((up, down), (stream, topic), group, partition, upstream)
            .await
            .unwrap_or(false)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_are_translated_exactly_and_again_after_a_restart() -> TestResult {
    let (stream, topic) = ("cgsync", "t");
    let (env, up, _) = Env::seeded(stream, topic, 3, 0..200, 50).await?;
    // Foreign messages downstream first: downstream offsets differ from upstream ones.
    let down = client(&env.eu).await?;
    create_topic(&down, stream, topic, 3).await?;
    produce(&down, stream, topic, 3, 1000..1007, 7).await?;
    let billing = [(0, 49), (1, 120), (2, 199)];
    store_group_offsets(&up, (stream, topic), "billing", &billing).await?;
    store_group_offsets(&up, (stream, topic), "analytics-1", &[(0, 10)]).await?;
    store_group_offsets(&up, (stream, topic), "other", &[(0, 5)]).await?;

    let flow = syncing(stream, &["billing", "analytics-*"]);
    let (control, pipeline) = env.run(&flow).await?;
    for (partition, offset) in [(0, 49), (1, 120), (2, 199)] {
        check_translated(&up, &down, (stream, topic, "billing"), partition, offset).await?;
    }
    check_translated(&up, &down, (stream, topic, "analytics-1"), 0, 10).await?;
    let (s, t) = (id(stream)?, id(topic)?);
    assert2::check!(
        down.get_consumer_group(&s, &t, &id("other")?)
            .await?
            .is_none(),
        "a group outside the globs is not created downstream"
    );
    let state = pipeline
        .cutover()
        .group_sync_state()
        .remove(stream)
        .ok_or("no sync state")?;
    assert2::check!(state.runs > 0);
    assert2::check!(state.last.skipped.is_empty());
    assert2::check!(
        state.last.probes == 0,
        "the writers' maps translate without searching the target"
    );
    for unit in (0..3).map(|p| WorkUnit::new(stream, stream, topic, p)) {
        wait_confirmed(&control, &unit, 199, WAIT).await?;
    }
    pipeline.shutdown().await;

    // The group moves on upstream while no replicator runs; a new pipeline has no maps and
    // finds the copies by searching the downstream partitions.
    store_group_offsets(&up, (stream, topic), "billing", &[(0, 150), (1, 121)]).await?;
    let pipeline = Pipeline::start(env.params(flow.clone()), control.clone()).await?;
    check_translated(&up, &down, (stream, topic, "billing"), 0, 150).await?;
    check_translated(&up, &down, (stream, topic, "billing"), 1, 121).await?;
    let state = pipeline
        .cutover()
        .group_sync_state()
        .remove(stream)
        .ok_or("no sync state")?;
    assert2::check!(state.stored > 0);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_a_member_on_the_target_is_skipped_and_left_alone() -> TestResult {
    let (stream, topic) = ("cgbusy", "t");
    let (env, up, _) = Env::seeded(stream, topic, 1, 0..50, 50).await?;
    store_group_offsets(&up, (stream, topic), "billing", &[(0, 20)]).await?;
    // A consumer of the group is live on the target already.
    let down = client(&env.eu).await?;
    let live = client(&env.eu).await?;
    create_topic(&down, stream, topic, 1).await?;
    let (s, t, g) = (id(stream)?, id(topic)?, id("billing")?);
    down.create_consumer_group(&s, &t, "billing").await?;
    live.join_consumer_group(&s, &t, &g).await?;

    let flow = syncing(stream, &["billing"]);
    let (control, pipeline) = env.run(&flow).await?;
    wait_confirmed(&control, &WorkUnit::new(stream, stream, topic, 0), 49, WAIT).await?;
    let cutover = pipeline.cutover();
    wait_until("billing reported as skipped", WAIT, || async {
        cutover
            .group_sync_state()
            .get(stream)
            .is_some_and(|s| s.last.skipped.iter().any(|k| k.group == "billing"))
    })
    .await?;
    assert2::check!(group_offset(&down, (stream, topic), "billing", 0).await? == None);

    // Once the consumer is gone, the offset follows.
    live.leave_consumer_group(&s, &t, &g).await?;
    check_translated(&up, &down, (stream, topic, "billing"), 0, 20).await?;
    pipeline.shutdown().await;
    Ok(())
}
