//! Idle partitions: once caught up for a while, readers stop polling one by one and wait for
//! their stream's activity watcher, which lists the stream once per `idle_poll_interval`, asks
//! for a topic's partitions only when its totals moved, and wakes exactly the readers whose
//! partition grew.

use std::time::Duration;

use iggy::prelude::{Identifier, Partitioning};
use replicator_harness::Client;
use replicator_pipeline::{FlowParams, InMemoryControl, Pipeline, PipelineParams};
use replicator_sdk::IggyCluster as _;
use replicator_testkit::TestServer;

use crate::harness::{
    assert_exact, client, count, create_topic, flow, message, wait_until, Env, TestResult,
};

/// Command code of POLL_MESSAGES (what an idle reader used to send every interval).
const POLL_MESSAGES: u32 = 100;
/// Command code of GET_STREAM (what the activity watcher sends once per interval).
const GET_STREAM: u32 = 200;
/// Command code of GET_TOPIC (what the activity watcher sends for a topic whose totals moved).
const GET_TOPIC: u32 = 300;
/// Partitions of the test topic.
const PARTITIONS: u32 = 50;

/// Params for `flow` with discovery out of the way: its first round (at start) sets everything
/// up, and later rounds would add GET_STREAM and GET_TOPIC requests to the ones counted here.
fn quiet_params(env: &Env, flow: FlowParams) -> PipelineParams {
    let mut p = env.params(flow);
    p.discovery_interval = Duration::from_secs(600);
    p
}

/// Sends `seq` to `partition` of `stream/t` (payload and headers as the harness makes them).
async fn produce_one(c: &Client, stream: &str, partition: u32, seq: u64) -> TestResult {
    let mut msgs = [replicator_sdk::Message::from(message(partition, seq, 64)?)];
    let (s, t) = (Identifier::named(stream)?, Identifier::named("t")?);
    c.send_messages(&s, &t, &Partitioning::partition_id(partition), &mut msgs)
        .await?;
    Ok(())
}

/// A topic of [`PARTITIONS`] partitions where the even ones hold one message (offset 0) and the
/// odd ones are empty: Iggy reports `current_offset` 0 for both, so a watcher that mixed them
/// up would wake the readers of one of the two halves in every round.
async fn half_empty_topic(env: &Env, stream: &str) -> TestResult<Client> {
    let up = client(&env.us).await?;
    create_topic(&up, stream, "t", PARTITIONS).await?;
    for partition in (0..PARTITIONS).step_by(2) {
        produce_one(&up, stream, partition, 0).await?;
    }
    Ok(up)
}

/// Messages in all downstream partitions of `stream/t`.
fn copied(env: &Env, stream: &str) -> u64 {
    (0..PARTITIONS)
        .map(|p| count(&env.eu, stream, "t", p))
        .sum()
}

/// Starts the flow over `stream/*` (with `idle_poll_interval`, the default when `None`) on a
/// [`half_empty_topic`] with [`quiet_params`] and waits until the even partitions' messages are
/// copied. Returns the env, a client of upstream, the flow and the pipeline.
async fn start_watched(
    stream: &str,
    idle_poll_interval: Option<Duration>,
) -> TestResult<(Env, Client, FlowParams, Pipeline)> {
    let env = Env::start().await?;
    let up = half_empty_topic(&env, stream).await?;
    let mut f = flow(stream, &[&format!("{stream}/*")]);
    if let Some(interval) = idle_poll_interval {
        f.idle_poll_interval = interval;
    }
    let pipeline = Pipeline::start(quiet_params(&env, f.clone()), InMemoryControl::new()).await?;
    wait_until("first messages copied", Duration::from_secs(30), || async {
        copied(&env, stream) == u64::from(PARTITIONS / 2)
    })
    .await?;
    Ok((env, up, f, pipeline))
}

/// Waits until upstream saw `rounds` GET_STREAM requests (watcher rounds) in a row without a
/// single POLL_MESSAGES in between: every reader then waits for the watcher (a reader still in
/// its short pauses polls at least once per `idle_poll_interval`, the watcher's period).
async fn wait_until_readers_watch(server: &TestServer, rounds: u64) -> TestResult {
    let faults = server.faults();
    let mut mark = (faults.requests(POLL_MESSAGES), faults.requests(GET_STREAM));
    wait_until(
        "idle readers wait for the watcher",
        Duration::from_secs(60),
        || {
            let now = (faults.requests(POLL_MESSAGES), faults.requests(GET_STREAM));
            let quiet = now.0 == mark.0 && now.1 >= mark.1 + rounds;
            if now.0 != mark.0 {
                mark = now;
            }
            async move { quiet }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_partitions_stop_polling_and_one_stream_listing_per_round_replaces_them() -> TestResult
{
    // Default idle interval (100 ms): per-partition polling would make 10 polls per partition
    // and second, about 1,000 over the window below.
    let (env, _up, _, pipeline) = start_watched("quiet", None).await?;
    wait_until_readers_watch(&env.us, 3).await?;
    let faults = env.us.faults();
    let (polls, rounds) = (faults.requests(POLL_MESSAGES), faults.requests(GET_STREAM));
    let topic_requests = faults.requests(GET_TOPIC);
    wait_until("20 watcher rounds", Duration::from_secs(60), || async {
        faults.requests(GET_STREAM) >= rounds + 20
    })
    .await?;
    let polled = faults.requests(POLL_MESSAGES) - polls;
    // Nothing moved: the topic's partitions are asked for only by the watcher's sweep, once
    // per 100 rounds (a safety-net poll subscribes again with the listing it read before
    // polling, which came after the topic's last move).
    let fetched = faults.requests(GET_TOPIC) - topic_requests;
    assert!(
        fetched <= 1,
        "{fetched} GET_TOPIC in 20 rounds of an idle topic"
    );
    // Only the safety net polls a watched partition, at most once per 5 s: at most one poll per
    // partition over 20 rounds (2 s), where per-partition polling made about 20.
    assert!(
        polled <= u64::from(PARTITIONS),
        "{polled} polls of {PARTITIONS} idle partitions in 20 watcher rounds"
    );
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_idle_partitions_copy_a_new_message_after_the_watcher_wakes_their_reader(
) -> TestResult {
    // A 1 s idle interval puts the readers' safety-net polls 50–100 s away: within the
    // deadlines below, only the watcher can have woken them.
    let (env, up, f, pipeline) = start_watched("wake", Some(Duration::from_secs(1))).await?;
    let half = u64::from(PARTITIONS / 2);
    wait_until_readers_watch(&env.us, 2).await?;
    // An empty partition gets its first message (offset 0, `current_offset` unchanged at 0).
    produce_one(&up, "wake", 7, 0).await?;
    env.wait_downstream("wake", "t", 7, 1).await?;
    // The reader goes back to the watcher; a partition that already held offset 0 grows.
    wait_until_readers_watch(&env.us, 2).await?;
    produce_one(&up, "wake", 8, 1).await?;
    env.wait_downstream("wake", "t", 8, 2).await?;
    assert!(copied(&env, "wake") == half + 2);
    pipeline.shutdown().await;
    let report = env.verify(&f, Duration::from_secs(10)).await?;
    assert_exact(&report);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_stream_metadata_falls_back_to_polling_each_partition_until_it_recovers(
) -> TestResult {
    let (env, up, f, pipeline) = start_watched("fallback", Some(Duration::from_secs(1))).await?;
    wait_until_readers_watch(&env.us, 2).await?;
    // GET_STREAM now fails (status 5, FeatureUnavailable): the readers poll on their own again,
    // every idle interval, although their safety net is 50–100 s away.
    let faults = env.us.faults();
    faults.fail_next(GET_STREAM, 5, u32::MAX);
    let polls = faults.requests(POLL_MESSAGES);
    wait_until(
        "every partition polled again, twice",
        Duration::from_secs(30),
        || async { faults.requests(POLL_MESSAGES) >= polls + 2 * u64::from(PARTITIONS) },
    )
    .await?;
    produce_one(&up, "fallback", 9, 0).await?;
    // Copied without metadata.
    env.wait_downstream("fallback", "t", 9, 1).await?;
    // Metadata is back: the readers wait for the watcher again.
    faults.clear();
    wait_until_readers_watch(&env.us, 2).await?;
    pipeline.shutdown().await;
    let report = env.verify(&f, Duration::from_secs(10)).await?;
    assert_exact(&report);
    Ok(())
}
