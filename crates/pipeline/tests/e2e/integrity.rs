//! Histories that change under the replicator: an upstream partition reset (purged, or its topic
//! recreated between two discovery rounds), a target that lost acknowledged messages, and more
//! foreign messages downstream than the tail scan window on top of unconfirmed writes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iggy::prelude::{Consumer, Identifier, Partitioning, PollingStrategy};
use replicator_harness::Client;
use replicator_model::{IggyVersion, WorkUnit};
use replicator_pipeline::provenance::{self, History};
use replicator_pipeline::{
    ControlPlane, FlowParams, InMemoryControl, Observer, Pipeline, PipelineObserver, UnitStats,
};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::Message;

use crate::harness::{
    assert_exact, client, count, create_topic, produce, wait_confirmed, wait_until, CopiedUnit,
    Env, Intercepted, StallCommits, TestResult,
};

/// `count` messages of `stream/topic/0` from `offset` on, as stored by `server`'s client `c`.
async fn messages(
    c: &Client,
    stream: &str,
    topic: &str,
    offset: u64,
    count: u32,
) -> TestResult<Vec<Message>> {
    let polled = c
        .poll_messages(
            &Identifier::named(stream)?,
            &Identifier::named(topic)?,
            Some(0),
            &Consumer::new(Identifier::named("integrity-check")?),
            &PollingStrategy::offset(offset),
            count,
            false,
        )
        .await?;
    Ok(polled.messages)
}

/// The upstream topic's creation time (µs).
async fn created_at(c: &Client, stream: &str, topic: &str) -> TestResult<u64> {
    let topic = c
        .get_topic(&Identifier::named(stream)?, &Identifier::named(topic)?)
        .await?
        .ok_or("no topic")?;
    Ok(topic.created_at.as_micros())
}

/// Checks that `copies` are copies of `originals`, one for one, stamped with the source offset
/// and the history of the topic created at `created` after `resets` resets.
fn assert_copies(originals: &[Message], copies: &[Message], created: u64, resets: u16) {
    assert!(
        originals.len() == copies.len(),
        "{} originals, {} copies",
        originals.len(),
        copies.len()
    );
    for (original, copy) in originals.iter().zip(copies) {
        let offset = original.offset;
        assert!(provenance::same_copy(original, copy), "offset {offset}");
        let found = provenance::find(copy.user_headers.as_deref());
        assert!(found.offset == Some(offset), "{found:?}");
        let label = found
            .history_label
            .ok_or("no label")
            .map(History::from_label);
        assert!(
            label
                == Ok(History {
                    created_at: created,
                    resets
                }),
            "offset {offset}: {label:?}"
        );
    }
}

/// The flow of `stream` with the activity watcher off (every partition polled every 2 ms), so
/// that a reset is noticed at the next poll rather than at the watcher's safety-net poll.
fn polled_flow(env_flow: FlowParams) -> FlowParams {
    let mut f = env_flow;
    f.idle_poll_interval = f.poll_interval;
    f
}

/// `stream/t` with one partition holding `0..100`, copied by the flow of `stream` until offset 99
/// is confirmed.
async fn copied(stream: &str) -> TestResult<CopiedUnit> {
    let (env, up, f) = Env::seeded(stream, "t", 1, 0..100, 100).await?;
    let unit = WorkUnit::new(stream, stream, "t", 0);
    let (control, pipeline) = env.run(&f).await?;
    wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
    Ok((env, up, f, unit, control, pipeline))
}

/// The stats of `unit`.
async fn stats_of(pipeline: &Pipeline, unit: &WorkUnit) -> TestResult<UnitStats> {
    let stats = pipeline.stats().await?;
    Ok(stats
        .into_iter()
        .find(|s| &s.unit == unit)
        .ok_or("no stats")?)
}

/// Waits until `unit` confirmed `offset` in the history after `resets` resets.
async fn wait_confirmed_in(
    control: &InMemoryControl,
    unit: &WorkUnit,
    offset: u64,
    resets: u16,
) -> TestResult {
    wait_until(
        &format!("{unit} confirmed at {offset} after {resets} resets"),
        Duration::from_secs(30),
        || async {
            control.progress(unit).is_some_and(|p| {
                p.confirmed == Some(offset) && History::from_label(p.history_label).resets == resets
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_upstream_partition_is_copied_again_as_a_new_history() -> TestResult {
    let (env, up, f) = Env::seeded("purge", "t", 1, 0..100, 100).await?;
    let f = polled_flow(f);
    let unit = WorkUnit::new("purge", "purge", "t", 0);
    let (control, pipeline) = env.run(&f).await?;
    wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
    let created = created_at(&up, "purge", "t").await?;
    // Purged (the creation time stays) and refilled below the copied position.
    up.purge_topic(&Identifier::named("purge")?, &Identifier::named("t")?)
        .await?;
    produce(&up, "purge", "t", 1, 1000..1030, 30).await?;
    // The new history is copied from its offset 0, after the old one, under the next label.
    env.wait_downstream("purge", "t", 0, 130).await?;
    let down = client(&env.eu).await?;
    let originals = messages(&up, "purge", "t", 0, 100).await?;
    let copies = messages(&down, "purge", "t", 100, 100).await?;
    assert_copies(&originals, &copies, created, 1);
    let old = messages(&down, "purge", "t", 0, 100).await?;
    assert!(old.len() == 100);
    assert!(provenance::find(old[99].user_headers.as_deref()).history_label == Some(created));
    wait_confirmed_in(&control, &unit, 29, 1).await?;
    assert!(stats_of(&pipeline, &unit).await?.upstream_resets == 1);
    // It goes on in the new history.
    produce(&up, "purge", "t", 1, 1030..1040, 10).await?;
    wait_confirmed_in(&control, &unit, 39, 1).await?;
    assert!(count(&env.eu, "purge", "t", 0) == 140);
    // `verify` compares what upstream holds now (the new history) with its copies, not with
    // the copies of the history the purge removed.
    let report = env.verify(&f, Duration::from_secs(30)).await?;
    assert_exact(&report);
    assert!(report.upstream_total() == 40);
    assert!(report.downstream_total() == 40);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_refilled_past_the_position_while_stopped_is_told_by_the_message_there() -> TestResult
{
    let (env, up, f, unit, control, first) = copied("refill").await?;
    first.shutdown().await;
    let created = created_at(&up, "refill", "t").await?;
    up.purge_topic(&Identifier::named("refill")?, &Identifier::named("t")?)
        .await?;
    // The new history already reaches beyond offset 99, the old position.
    produce(&up, "refill", "t", 1, 1000..1150, 150).await?;
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    env.wait_downstream("refill", "t", 0, 250).await?;
    let down = client(&env.eu).await?;
    let originals = messages(&up, "refill", "t", 0, 150).await?;
    let copies = messages(&down, "refill", "t", 100, 150).await?;
    assert_copies(&originals, &copies, created, 1);
    wait_confirmed_in(&control, &unit, 149, 1).await?;
    assert!(stats_of(&second, &unit).await?.upstream_resets == 1);
    second.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_recreated_between_discovery_rounds_is_noticed_by_its_reader() -> TestResult {
    let (env, up, f) = Env::seeded("again", "t", 1, 0..100, 100).await?;
    let f = polled_flow(f);
    let unit = WorkUnit::new("again", "again", "t", 0);
    let mut params = env.params(f.clone());
    // Discovery would notice the new creation time only in an hour.
    params.discovery_interval = Duration::from_secs(3600);
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
    up.delete_topic(&Identifier::named("again")?, &Identifier::named("t")?)
        .await?;
    create_topic(&up, "again", "t", 1).await?;
    produce(&up, "again", "t", 1, 0..10, 10).await?;
    let created = created_at(&up, "again", "t").await?;
    env.wait_downstream("again", "t", 0, 110).await?;
    let down = client(&env.eu).await?;
    let originals = messages(&up, "again", "t", 0, 10).await?;
    let copies = messages(&down, "again", "t", 100, 10).await?;
    assert_copies(&originals, &copies, created, 0);
    wait_confirmed_in(&control, &unit, 9, 0).await?;
    assert!(control.progress(&unit).map(|p| p.history_label) == Some(created));
    assert!(stats_of(&pipeline, &unit).await?.upstream_resets == 1);
    assert_exact(&env.verify(&f, Duration::from_secs(10)).await?);
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_the_target_lost_are_copied_again_and_those_retention_removed_are_a_gap(
) -> TestResult {
    let (env, up, f) = Env::seeded("lost", "t", 1, 0..50, 50).await?;
    let unit = WorkUnit::new("lost", "lost", "t", 0);
    let (control, first) = env.run(&f).await?;
    wait_confirmed(&control, &unit, 49, Duration::from_secs(30)).await?;
    first.shutdown().await;
    let down = client(&env.eu).await?;
    let mut kept = messages(&down, "lost", "t", 0, 50).await?;
    produce(&up, "lost", "t", 1, 50..100, 50).await?;
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
    second.shutdown().await;
    // The target loses its newest 50 messages (acknowledged, never persisted): what is left
    // is the first 50 copies.
    let (stream, topic) = (Identifier::named("lost")?, Identifier::named("t")?);
    down.purge_topic(&stream, &topic).await?;
    down.send_messages(&stream, &topic, &Partitioning::partition_id(0), &mut kept)
        .await?;
    assert!(count(&env.eu, "lost", "t", 0) == 50);
    // Meanwhile upstream retention removed 50..59: those cannot be copied again.
    env.us.retention().drop_before("lost", "t", 0, 60)?;
    let third = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    env.wait_downstream("lost", "t", 0, 90).await?;
    let s = stats_of(&third, &unit).await?;
    assert!(s.downstream_losses == 1);
    assert!(s.messages_recopied == 40);
    assert!(s.gaps == 1);
    assert!((s.recent_gaps[0].from, s.recent_gaps[0].to) == (50, 59));
    let report = env.verify(&f, Duration::from_secs(10)).await?;
    assert_exact(&report);
    assert!(report.partitions[0].below_retention == 50);
    third.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_the_target_lost_under_a_running_writer_are_copied_again() -> TestResult {
    let (env, up, f) = Env::seeded("midloss", "t", 1, 0..50, 50).await?;
    let unit = WorkUnit::new("midloss", "midloss", "t", 0);
    let (control, pipeline) = env.run(&f).await?;
    wait_confirmed(&control, &unit, 49, Duration::from_secs(30)).await?;
    // The target restarts without its newest 20 messages (acknowledged, never persisted)
    // while the writer runs: its connection drops, and the first 30 copies are what is left.
    let down = client(&env.eu).await?;
    let mut kept = messages(&down, "midloss", "t", 0, 30).await?;
    let (stream, topic) = (Identifier::named("midloss")?, Identifier::named("t")?);
    down.purge_topic(&stream, &topic).await?;
    down.send_messages(&stream, &topic, &Partitioning::partition_id(0), &mut kept)
        .await?;
    env.eu.faults().drop_connections();
    produce(&up, "midloss", "t", 1, 50..60, 10).await?;
    env.wait_downstream("midloss", "t", 0, 60).await?;
    wait_confirmed(&control, &unit, 59, Duration::from_secs(30)).await?;
    assert_exact(&env.verify(&f, Duration::from_secs(10)).await?);
    let s = stats_of(&pipeline, &unit).await?;
    assert!(s.downstream_losses == 1, "{s:?}");
    pipeline.shutdown().await;
    Ok(())
}

/// Found by the simulator (seed 194): the target loses the copies a writer's resume found
/// before the writer sent anything. The tail it re-reads after its first failed send is below
/// what the resume found, which is a loss as much as losing its own sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_the_target_lost_after_a_resume_and_before_the_first_send_are_copied_again(
) -> TestResult {
    let (env, up, f) = Env::seeded("resumeloss", "t", 1, 0..50, 50).await?;
    let unit = WorkUnit::new("resumeloss", "resumeloss", "t", 0);
    let (control, first) = env.run(&f).await?;
    wait_confirmed(&control, &unit, 49, Duration::from_secs(30)).await?;
    first.shutdown().await;
    // A new writer resumes after the 50 copies it finds and waits for more.
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    wait_until("the writer resumed", Duration::from_secs(30), || async {
        stats_of(&second, &unit)
            .await
            .is_ok_and(|s| s.lag == Some(0))
    })
    .await?;
    // The target restarts without its newest 20 messages: its connections drop.
    let down = client(&env.eu).await?;
    let mut kept = messages(&down, "resumeloss", "t", 0, 30).await?;
    let (stream, topic) = (Identifier::named("resumeloss")?, Identifier::named("t")?);
    down.purge_topic(&stream, &topic).await?;
    down.send_messages(&stream, &topic, &Partitioning::partition_id(0), &mut kept)
        .await?;
    env.eu.faults().drop_connections();
    produce(&up, "resumeloss", "t", 1, 50..60, 10).await?;
    env.wait_downstream("resumeloss", "t", 0, 60).await?;
    wait_confirmed(&control, &unit, 59, Duration::from_secs(30)).await?;
    assert_exact(&env.verify(&f, Duration::from_secs(10)).await?);
    second.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_downstream_partition_with_a_confirmed_offset_is_copied_again() -> TestResult {
    let (env, _up, f, unit, control, first) = copied("emptied").await?;
    first.shutdown().await;
    let down = client(&env.eu).await?;
    down.purge_topic(&Identifier::named("emptied")?, &Identifier::named("t")?)
        .await?;
    let second = Pipeline::start(env.params(f.clone()), control.clone()).await?;
    env.wait_downstream("emptied", "t", 0, 100).await?;
    // The writer counts a batch as recopied once its send returned, which may be just after
    // the copies show downstream.
    wait_until(
        "the 100 copies counted",
        Duration::from_secs(30),
        || async {
            stats_of(&second, &unit)
                .await
                .is_ok_and(|s| s.messages_recopied >= 100)
        },
    )
    .await?;
    let s = stats_of(&second, &unit).await?;
    assert!(s.downstream_losses == 1, "{s:?}");
    assert!(s.messages_recopied == 100, "{s:?}");
    assert_exact(&env.verify(&f, Duration::from_secs(10)).await?);
    second.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_foreign_messages_than_the_scan_window_on_unconfirmed_writes_cause_no_duplicates(
) -> TestResult {
    let (env, up, mut f) = Env::seeded("foreign", "t", 1, 0..300, 100).await?;
    f.batch_size = 100;
    let unit = WorkUnit::new("foreign", "foreign", "t", 0);
    let mut params = env.params(f.clone());
    params.tail_scan_window = 100;
    let control = InMemoryControl::new();
    let stalling = Intercepted {
        inner: control.clone(),
        hooks: StallCommits(Arc::new(AtomicBool::new(false))),
    };
    let first = Pipeline::start(params.clone(), stalling.clone()).await?;
    wait_confirmed(&control, &unit, 299, Duration::from_secs(30)).await?;
    stalling.hooks.0.store(true, Ordering::SeqCst);
    produce(&up, "foreign", "t", 1, 300..1000, 100).await?;
    env.wait_downstream("foreign", "t", 0, 1000).await?;
    first.crash().await;
    // Written but not confirmed: 300..999.
    assert!(control.progress(&unit).and_then(|p| p.confirmed) < Some(999));
    // Another producer appends five scan windows of its own messages downstream.
    let down = client(&env.eu).await?;
    produce(&down, "foreign", "t", 1, 5000..5500, 100).await?;
    let second = Pipeline::start(params, control.clone()).await?;
    produce(&up, "foreign", "t", 1, 1000..1100, 100).await?;
    wait_confirmed(&control, &unit, 1099, Duration::from_secs(30)).await?;
    assert!(count(&env.eu, "foreign", "t", 0) == 1100 + 500);
    let report = env.verify(&f, Duration::from_secs(10)).await?;
    assert_exact(&report);
    assert!(report.partitions[0].duplicated == 0);
    let s = stats_of(&second, &unit).await?;
    assert!(s.tail_scans_exhausted == 0);
    assert!(s.downstream_losses == 0);
    second.shutdown().await;
    Ok(())
}

/// Counts the retried errors of kind `unexpected_append`.
#[derive(Default)]
struct UnexpectedAppends(AtomicU64);

impl PipelineObserver for UnexpectedAppends {
    fn error(&self, _flow: &str, kind: &'static str) {
        if kind == "unexpected_append" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_append_between_two_sends_is_caught_by_a_0_9_confirmation_and_nothing_is_copied_twice(
) -> TestResult {
    let (env, up, f) = Env::seeded("landed", "t", 1, 0..100, 100).await?;
    let unit = WorkUnit::new("landed", "landed", "t", 0);
    let caught = Arc::new(UnexpectedAppends::default());
    let mut params = env.params(f.clone());
    params.observer = Observer(caught.clone());
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
    // Another producer appends one message between two of the writer's sends: on a 0.9 target
    // the next send's confirmation lands one offset further than the writer's previous send
    // ended, and the writer re-reads the tail before it goes on.
    let down = client(&env.eu).await?;
    produce(&down, "landed", "t", 1, 5000..5001, 1).await?;
    produce(&up, "landed", "t", 1, 100..200, 100).await?;
    wait_confirmed(&control, &unit, 199, Duration::from_secs(30)).await?;
    assert!(count(&env.eu, "landed", "t", 0) == 200 + 1);
    let report = env.verify(&f, Duration::from_secs(10)).await?;
    assert_exact(&report);
    assert!(report.partitions[0].duplicated == 0);
    let caught = caught.0.load(Ordering::Relaxed);
    match env.eu.iggy_version() {
        IggyVersion::V0_9 => assert!(caught == 1, "{caught} unexpected appends reported"),
        // Iggy 0.8 confirms no send: the foreign message is only skipped over.
        IggyVersion::V0_8 => assert!(caught == 0, "{caught} unexpected appends reported"),
    }
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_9_send_replayed_past_the_call_timeout_lands_once() -> TestResult {
    let (env, up, f) = Env::seeded("replayed", "t", 1, 0..100, 100).await?;
    if env.eu.iggy_version() != IggyVersion::V0_9 {
        eprintln!("SKIPPED: only an Iggy 0.9 target answers TransientNotCommitted");
        return Ok(());
    }
    let unit = WorkUnit::new("replayed", "replayed", "t", 0);
    let mut params = env.params(f.clone());
    params.operation_timeout = Duration::from_secs(1);
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    wait_confirmed(&control, &unit, 99, Duration::from_secs(30)).await?;
    // The target cannot commit the next sends for a while: SDK 0.11 replays such a send on its
    // session every 50 ms, for about five seconds here, well past the writer's 1 s call
    // timeout. The writer must not resend the batch while the replay may still land.
    const SEND_MESSAGES: u32 = 101;
    const TRANSIENT_NOT_COMMITTED: u32 = 57;
    env.eu
        .faults()
        .fail_next(SEND_MESSAGES, TRANSIENT_NOT_COMMITTED, 100);
    produce(&up, "replayed", "t", 1, 100..200, 100).await?;
    wait_confirmed(&control, &unit, 199, Duration::from_secs(90)).await?;
    let report = env.verify(&f, Duration::from_secs(10)).await?;
    assert_exact(&report);
    assert!(report.partitions[0].duplicated == 0);
    assert!(count(&env.eu, "replayed", "t", 0) == 200);
    pipeline.shutdown().await;
    Ok(())
}
