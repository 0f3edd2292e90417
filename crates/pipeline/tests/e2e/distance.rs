//! A distant cluster: the replicator reaches the source (or the target) through the testkit's
//! `WanProxy` with 40 ms round trips. The copy stays exact, the partitions' batches grow while
//! they are behind and come back to `batch_size` once caught up, and the far cluster gets its
//! `far_connections`.

use std::collections::BTreeMap;
use std::time::Duration;

use replicator_pipeline::verify::{verify, VerifyParams};
use replicator_pipeline::{ClusterParams, InMemoryControl, Pipeline};
use replicator_testkit::{WanLink, WanProxy};

use crate::harness::{
    assert_exact, client, cluster_params, count, create_topic, flow, produce, tuned_params,
    wait_until, Env, TestResult,
};

/// One-way delay of the proxied path: 40 ms round trips, four times `FAR_ROUND_TRIP`.
const ONE_WAY: Duration = Duration::from_millis(20);

/// The flow's `batch_size`: small, so that growing is plain to see.
const BATCH: u32 = 200;

/// Which server the proxy stands in front of.
#[derive(Debug, Clone, Copy)]
enum Far {
    Source,
    Target,
}

/// `env`'s clusters with `alias` (`"us"` or `"eu"`) dialled through a new `WanProxy` of
/// [`ONE_WAY`] each way, on one connection while near and three once far; and the proxy, for
/// the caller to stop.
async fn with_far(
    env: &Env,
    alias: &str,
) -> TestResult<(BTreeMap<String, ClusterParams>, WanProxy)> {
    let server = if alias == "us" { &env.us } else { &env.eu };
    let proxy = WanProxy::start(server.addr(), WanLink::symmetric(ONE_WAY)).await?;
    let mut far = cluster_params(server);
    far.connection_string = server
        .connection_string()
        .replace(&server.addr().to_string(), &proxy.addr().to_string());
    far.connections = 1;
    far.far_connections = 3;
    let mut clusters = env.clusters();
    clusters.insert(alias.to_owned(), far);
    Ok((clusters, proxy))
}

async fn copies_exactly_with_grown_batches(far: Far) -> TestResult {
    let partitions = 2;
    let (env, up, mut flow) = Env::seeded("far", "created", partitions, 0..10_000, 1000).await?;
    flow.batch_size = BATCH;
    flow.max_batch_bytes = 256 << 10;
    let alias = match far {
        Far::Source => "us",
        Far::Target => "eu",
    };
    let (clusters, proxy) = with_far(&env, alias).await?;
    let mut params = tuned_params(clusters, flow.clone());
    params.operation_timeout = Duration::from_secs(10);
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    let stats = pipeline.stats_reader();
    let connections = pipeline.connections_reader();
    // Behind by 10,000 messages a partition, 40 ms away: the batches grow past `batch_size`.
    let mut largest = 0;
    wait_until("a grown batch", Duration::from_secs(60), || {
        largest = largest.max(stats().iter().map(|s| s.batch_size).max().unwrap_or(0));
        std::future::ready(largest > BATCH)
    })
    .await?;
    // And the far cluster is spread over its far connections.
    wait_until(
        "the far connections in use",
        Duration::from_secs(60),
        || {
            let state = connections();
            std::future::ready(
                state
                    .iter()
                    .any(|c| c.cluster == alias && c.configured == 3),
            )
        },
    )
    .await?;
    // More traffic while it copies, then the copy is exact.
    produce(&up, "far", "created", partitions, 10_000..12_000, 500).await?;
    let report = env.verify(&flow, Duration::from_secs(120)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == 24_000);
    // Caught up: every poll comes back short, and the batch is `batch_size` again.
    wait_until(
        "batches back to batch_size",
        Duration::from_secs(60),
        || std::future::ready(stats().iter().all(|s| s.batch_size == BATCH)),
    )
    .await?;
    pipeline.shutdown().await;
    proxy.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_source_is_copied_exactly_with_grown_batches_and_far_connections() -> TestResult {
    copies_exactly_with_grown_batches(Far::Source).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_target_is_written_exactly_with_grown_batches_and_far_connections() -> TestResult {
    copies_exactly_with_grown_batches(Far::Target).await
}

/// The DR runbook's two-way pair across a distance: `us-eu` and `eu-us` over the same topic,
/// the replicator beside `us` and `eu` 40 ms away (the one flow's target is far, the other's
/// source). Both sides produce, before and during the copy: each ends with both sets once,
/// each flow skips exactly the other's copies (loop prevention through grown batches and polls
/// sent ahead), and both copies verify exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_way_pair_across_a_distance_copies_both_ways_exactly_without_loops() -> TestResult {
    let partitions = 2;
    let env = Env::start().await?;
    let (us, eu) = (client(&env.us).await?, client(&env.eu).await?);
    create_topic(&us, "ww", "t", partitions).await?;
    create_topic(&eu, "ww", "t", partitions).await?;
    produce(&us, "ww", "t", partitions, 0..3000, 500).await?;
    produce(&eu, "ww", "t", partitions, 100_000..102_000, 500).await?;
    let mut there = flow("us-eu", &["ww/*"]);
    let mut back = flow("eu-us", &["ww/*"]);
    back.source = "eu".into();
    back.target = "us".into();
    for f in [&mut there, &mut back] {
        f.batch_size = BATCH;
        f.max_batch_bytes = 256 << 10;
    }
    let (clusters, proxy) = with_far(&env, "eu").await?;
    let mut params = tuned_params(clusters, there.clone());
    params.flows.push(back.clone());
    params.operation_timeout = Duration::from_secs(10);
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    let connections = pipeline.connections_reader();
    wait_until("eu on its far connections", Duration::from_secs(60), || {
        std::future::ready(
            connections()
                .iter()
                .any(|c| c.cluster == "eu" && c.configured == 3),
        )
    })
    .await?;
    // More on both sides while the copies run.
    produce(&us, "ww", "t", partitions, 3000..4000, 500).await?;
    produce(&eu, "ww", "t", partitions, 102_000..103_000, 500).await?;
    let each = 4000 + 3000;
    wait_until(
        "both sides hold both sets",
        Duration::from_secs(120),
        || async {
            (0..partitions).all(|p| {
                count(&env.us, "ww", "t", p) == each && count(&env.eu, "ww", "t", p) == each
            })
        },
    )
    .await?;
    let stats = pipeline.stats_reader();
    let skipped = |f: &str| -> u64 {
        stats()
            .iter()
            .filter(|s| s.unit.flow == f)
            .map(|s| s.skipped_loop)
            .sum()
    };
    // Each flow reads the other's copies on its source, and skips every one.
    wait_until("the copies skipped", Duration::from_secs(60), || {
        std::future::ready(skipped("us-eu") == 2 * 3000 && skipped("eu-us") == 2 * 4000)
    })
    .await?;
    assert_exact(&env.verify(&there, Duration::from_secs(60)).await?);
    let mut reverse =
        VerifyParams::new(back, env.eu.connection_string(), env.us.connection_string());
    reverse.source_version = env.eu.iggy_version();
    reverse.target_version = env.us.iggy_version();
    reverse.wait = Duration::from_secs(60);
    assert_exact(&verify(&reverse).await?);
    // Nothing more arrives: no copy of a copy is written late.
    for p in 0..partitions {
        assert!(count(&env.us, "ww", "t", p) == each && count(&env.eu, "ww", "t", p) == each);
    }
    pipeline.shutdown().await;
    proxy.stop().await;
    Ok(())
}

/// Command code of POLL_MESSAGES.
const POLL_MESSAGES: u32 = 100;

/// Command code of SEND_MESSAGES.
const SEND_MESSAGES: u32 = 101;

/// Behind a far target a send carries the batches the reader queued while the previous send
/// was out (`writer::join`). Each batch holds at most the largest batch size the partition
/// reached, so without joining the target would see at least `messages / largest` sends; it
/// sees far fewer, and the copy is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_targets_sends_carry_the_batches_queued_behind_them() -> TestResult {
    const MESSAGES: u64 = 20_000;
    let (env, _up, mut flow) = Env::seeded("joined", "sends", 1, 0..MESSAGES, 1000).await?;
    flow.batch_size = BATCH;
    // The smallest grown batch the config allows: a few hundred of these messages.
    flow.max_batch_bytes = 64 << 10;
    let (clusters, proxy) = with_far(&env, "eu").await?;
    let mut params = tuned_params(clusters, flow.clone());
    params.operation_timeout = Duration::from_secs(30);
    let sends_before = env.eu.faults().requests(SEND_MESSAGES);
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    let stats = pipeline.stats_reader();
    let mut largest = 0;
    wait_until("the partition copied", Duration::from_secs(120), || {
        let now = stats();
        largest = largest.max(now.iter().map(|s| s.batch_size).max().unwrap_or(0));
        std::future::ready(now.iter().map(|s| s.messages).sum::<u64>() >= MESSAGES)
    })
    .await?;
    let sends = env.eu.faults().requests(SEND_MESSAGES) - sends_before;
    println!("{sends} sends to the far target for {MESSAGES} messages, batches of up to {largest}");
    assert!(
        largest > BATCH,
        "the batches grew behind the far target: {largest}"
    );
    assert!(
        sends * u64::from(largest) < MESSAGES,
        "{sends} sends of batches of at most {largest} messages each could not carry {MESSAGES}: \
         the sends did not join the queued batches"
    );
    let report = env.verify(&flow, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == MESSAGES);
    pipeline.shutdown().await;
    proxy.stop().await;
    Ok(())
}

/// `far_source_polls = 2`: a caught-up partition behind a far source keeps two polls in
/// flight. Shown by holding one poll at the source: with one poll at a time nothing else could
/// reach it meanwhile, with two the other does. And the copy stays exact while a producer
/// writes throughout (each answer is taken from where the reader is; the overlap is dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_partition_keeps_two_polls_in_flight_to_a_far_source() -> TestResult {
    let (env, _up, mut flow) = Env::seeded("near", "steady", 1, 0..1_000, 500).await?;
    flow.far_source_polls = 2;
    let (clusters, proxy) = with_far(&env, "us").await?;
    let mut params = tuned_params(clusters, flow.clone());
    params.operation_timeout = Duration::from_secs(30);
    let pipeline = Pipeline::start(params, InMemoryControl::new()).await?;
    // A producer beside the source, one message every 5 ms: the partition is never quiet.
    let producing = tokio_util::sync::CancellationToken::new();
    let producer = {
        let (producing, up) = (producing.clone(), client(&env.us).await?);
        tokio::spawn(async move {
            let mut next = 1_000;
            while !producing.is_cancelled() {
                produce(&up, "near", "steady", 1, next..next + 1, 1).await?;
                next += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            TestResult::Ok(next)
        })
    };
    wait_until("the copy under way", Duration::from_secs(60), || {
        std::future::ready(count(&env.eu, "near", "steady", 0) > 1_000)
    })
    .await?;
    // Hold the next poll at the source for 3 s; another must reach it meanwhile. The held
    // poll may be a lone one (after a lull in the producer's traffic under a busy machine,
    // the reader polls one at a time until a poll finds messages): then the hold ends with
    // no second poll, and the next attempt holds another. With one poll in flight no attempt
    // can succeed.
    let faults = env.us.faults();
    let mut second_poll_while_held = false;
    for _attempt in 0..5 {
        let (mark, ended) = (faults.requests(POLL_MESSAGES), faults.delays_ended());
        faults.delay_next(POLL_MESSAGES, Duration::from_secs(3), 1);
        let mut seen = false;
        wait_until("the held poll answered", Duration::from_secs(30), || {
            let held = faults.delays_ended() == ended;
            seen |= held && faults.requests(POLL_MESSAGES) >= mark + 2;
            std::future::ready(seen || faults.delays_ended() > ended)
        })
        .await?;
        if seen {
            second_poll_while_held = true;
            break;
        }
    }
    assert!(
        second_poll_while_held,
        "no poll reached the source while another was held, in 5 attempts"
    );
    producing.cancel();
    let produced = producer.await??;
    let report = env.verify(&flow, Duration::from_secs(120)).await?;
    assert_exact(&report);
    assert!(report.downstream_total() == produced);
    pipeline.shutdown().await;
    proxy.stop().await;
    Ok(())
}
