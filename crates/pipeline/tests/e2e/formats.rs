//! Both provenance formats in one partition (issue 49): copies stamped in format 1 (a cluster
//! below feature level 4) followed by compact ones (after the level was raised). The writer
//! resumes exactly after either (from its confirmed offset, and from the tail alone), the
//! consumer-group translation finds copies of both, and `verify` finds the copy exact.

use std::time::Duration;

use iggy::prelude::{Consumer, Identifier, PollingStrategy};
use replicator_harness::{store_group_offsets, translated_exactly, Client};
use replicator_model::WorkUnit;
use replicator_pipeline::provenance::{self, Format};
use replicator_pipeline::{InMemoryControl, Pipeline};
use replicator_sdk::{IggyCluster as _, Message};

use crate::harness::{assert_exact, client, produce, wait_confirmed, wait_until, Env, TestResult};

const WAIT: Duration = Duration::from_secs(30);
const STREAM: &str = "formats";
const TOPIC: &str = "t";

/// The downstream message at `offset` of partition 0.
async fn downstream(c: &Client, offset: u64) -> TestResult<Message> {
    let polled = c
        .poll_messages(
            &Identifier::named(STREAM)?,
            &Identifier::named(TOPIC)?,
            Some(0),
            &Consumer::new(Identifier::named("formats-check")?),
            &PollingStrategy::offset(offset),
            1,
            false,
        )
        .await?;
    Ok(polled.messages.into_iter().next().ok_or("no message")?)
}

async fn format_at(c: &Client, offset: u64) -> TestResult<Option<Format>> {
    let m = downstream(c, offset).await?;
    Ok(provenance::find(m.user_headers.as_deref()).format)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_with_both_formats_resumes_translates_and_verifies_exactly() -> TestResult {
    let (env, up, mut flow) = Env::seeded(STREAM, TOPIC, 1, 0..100, 25).await?;
    flow.consumer_groups = vec!["billing".into()];
    flow.consumer_group_sync_interval = Duration::from_millis(100);
    let unit = WorkUnit::new(STREAM, STREAM, TOPIC, 0);
    let down = client(&env.eu).await?;

    // A cluster below level 4: format 1.
    let control = InMemoryControl::new();
    control.set_compact_provenance(false);
    let pipeline = Pipeline::start(env.params(flow.clone()), control.clone()).await?;
    wait_confirmed(&control, &unit, 99, WAIT).await?;
    pipeline.shutdown().await;
    assert!(format_at(&down, 99).await? == Some(Format::Entries));

    // The level is raised: the next owner resumes after its confirmed offset, compact.
    control.set_compact_provenance(true);
    produce(&up, STREAM, TOPIC, 1, 100..200, 25).await?;
    let pipeline = Pipeline::start(env.params(flow.clone()), control.clone()).await?;
    wait_confirmed(&control, &unit, 199, WAIT).await?;
    assert!(format_at(&down, 100).await? == Some(Format::Compact));
    assert!(format_at(&down, 199).await? == Some(Format::Compact));
    // A group positioned in each half is translated exactly.
    for upstream in [40, 160] {
        store_group_offsets(&up, (STREAM, TOPIC), "billing", &[(0, upstream)]).await?;
        wait_until(&format!("billing at {upstream}"), WAIT, || async {
            translated_exactly((&up, &down), (STREAM, TOPIC), "billing", 0, upstream)
                .await
                .unwrap_or(false)
        })
        .await?;
    }
    pipeline.shutdown().await;

    // Nothing confirmed (a new control plane): the tail alone says where the copy stopped,
    // from a compact copy; then from a format-1 one, after a partition of format-1 copies.
    produce(&up, STREAM, TOPIC, 1, 200..250, 25).await?;
    let fresh = InMemoryControl::new();
    let pipeline = Pipeline::start(env.params(flow.clone()), fresh.clone()).await?;
    wait_confirmed(&fresh, &unit, 249, WAIT).await?;
    pipeline.shutdown().await;
    let fresh = InMemoryControl::new();
    fresh.set_compact_provenance(false);
    produce(&up, STREAM, TOPIC, 1, 250..300, 25).await?;
    let pipeline = Pipeline::start(env.params(flow.clone()), fresh.clone()).await?;
    wait_confirmed(&fresh, &unit, 299, WAIT).await?;
    pipeline.shutdown().await;
    assert!(format_at(&down, 299).await? == Some(Format::Entries));
    let fresh = InMemoryControl::new();
    produce(&up, STREAM, TOPIC, 1, 300..320, 20).await?;
    let pipeline = Pipeline::start(env.params(flow.clone()), fresh.clone()).await?;
    wait_confirmed(&fresh, &unit, 319, WAIT).await?;
    pipeline.shutdown().await;

    // Every message once, in order, whatever format each copy has.
    let report = env.verify(&flow, WAIT).await?;
    assert_exact(&report);
    assert!(report.partitions[0].upstream == 320 && report.partitions[0].downstream == 320);
    Ok(())
}
