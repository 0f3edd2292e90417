//! Flow heartbeats: records arrive on the target's heartbeat topic with the flow's fields and
//! an increasing `seq`, an idle flow reports their round trip as its replication latency, a
//! zero interval writes none, and `*/*` flows in both directions never copy heartbeat topics.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use assert2::check;

use iggy::prelude::{Consumer, HeaderKey, Identifier, PollingStrategy};
use replicator_harness::Client;
use replicator_model::WorkUnit;
use replicator_pipeline::{
    HeartbeatRecord, InMemoryControl, Observer, Pipeline, PipelineObserver, HEARTBEAT_HEADER,
};
use replicator_sdk::IggyCluster as _;

use crate::harness::{
    client, count, create_topic, flow, produce, wait_confirmed, wait_until, Env, Intercept,
    Intercepted, TestResult,
};

/// Every heartbeat stored in `stream/topic/0`, with the flow named by its header.
async fn heartbeats(
    c: &Client,
    stream: &str,
    topic: &str,
) -> TestResult<Vec<(HeartbeatRecord, String)>> {
    let polled = c
        .poll_messages(
            &Identifier::named(stream)?,
            &Identifier::named(topic)?,
            Some(0),
            &Consumer::new(Identifier::named("heartbeat-check")?),
            &PollingStrategy::offset(0),
            10_000,
            false,
        )
        .await?;
    let key = HeaderKey::from_str(HEARTBEAT_HEADER)?;
    let mut records = Vec::new();
    for message in polled.messages {
        let record: HeartbeatRecord = serde_json::from_slice(&message.payload)?;
        let headers = iggy::prelude::IggyMessage::from(&message)
            .user_headers_map()?
            .unwrap_or_default();
        let flow = headers
            .get(&key)
            .ok_or("heartbeat without its header")?
            .as_str()?
            .to_owned();
        records.push((record, flow));
    }
    Ok(records)
}

/// Counts the replication latency samples of every flow.
#[derive(Default)]
struct LatencySamples(AtomicU64);

impl PipelineObserver for LatencySamples {
    fn replicated(&self, _flow: &str, _latency: Duration) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_arrive_on_the_target_with_the_flow_fields_and_increasing_seq() -> TestResult {
    let (env, _up, mut flow) = Env::seeded("orders", "created", 1, 0..50, 50).await?;
    flow.heartbeat_interval = Duration::from_millis(100);
    let samples = Arc::new(LatencySamples::default());
    let mut params = env.params(flow.clone());
    params.observer = Observer(samples.clone());
    let node = params.node_id;
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    let unit = WorkUnit::new(&flow.name, "orders", "created", 0);
    wait_confirmed(&control, &unit, 49, Duration::from_secs(30)).await?;
    wait_until(
        "5 heartbeats on the target",
        Duration::from_secs(30),
        || async { count(&env.eu, "replicator", "heartbeats", 0) >= 5 },
    )
    .await?;
    let eu = client(&env.eu).await?;
    let records = heartbeats(&eu, "replicator", "heartbeats").await?;
    assert!(records.len() >= 5, "{records:?}");
    for (record, header) in &records {
        assert!(record.source == "us" && record.target == "eu", "{record:?}");
        assert!(
            record.flow == flow.name && *header == flow.name,
            "{record:?}"
        );
        assert!(record.node == node, "{record:?}");
    }
    for pair in records.windows(2) {
        let (a, b) = (&pair[0].0, &pair[1].0);
        assert!(b.seq > a.seq, "seq not increasing: {a:?} then {b:?}");
        assert!(b.sent_at_us >= a.sent_at_us, "{a:?} then {b:?}");
    }
    // The flow is idle now: its heartbeats keep the latency metric fed.
    let before = samples.0.load(Ordering::Relaxed);
    wait_until(
        "3 latency samples from heartbeats of the idle flow",
        Duration::from_secs(30),
        || async { samples.0.load(Ordering::Relaxed) >= before + 3 },
    )
    .await?;
    let read = pipeline.heartbeats_reader();
    let stats = read();
    assert!(stats.len() == 1 && stats[0].flow == flow.name, "{stats:?}");
    assert!(
        stats[0].sent >= 5 && stats[0].last_sent_age.is_some(),
        "{stats:?}"
    );
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_heartbeat_interval_writes_no_heartbeats() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "a", "t", 1).await?;
    create_topic(&up, "b", "t", 1).await?;
    produce(&up, "a", "t", 1, 0..10, 10).await?;
    produce(&up, "b", "t", 1, 0..10, 10).await?;
    let mut silent = flow("a", &["a/*"]);
    silent.heartbeat_interval = Duration::ZERO;
    // A second flow with heartbeats elsewhere is the clock: once it has written several, the
    // silent flow had as many chances.
    let mut clock = flow("b", &["b/*"]);
    clock.heartbeat_interval = Duration::from_millis(100);
    clock.heartbeat_topic = "clock/heartbeats".into();
    let mut params = env.params(silent.clone());
    params.flows.push(clock);
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    wait_confirmed(
        &control,
        &WorkUnit::new("a", "a", "t", 0),
        9,
        Duration::from_secs(30),
    )
    .await?;
    wait_until(
        "5 heartbeats of the other flow",
        Duration::from_secs(30),
        || async { count(&env.eu, "clock", "heartbeats", 0) >= 5 },
    )
    .await?;
    assert!(count(&env.eu, "replicator", "heartbeats", 0) == 0);
    let eu = client(&env.eu).await?;
    let records = heartbeats(&eu, "clock", "heartbeats").await?;
    assert!(records.iter().all(|(r, _)| r.flow == "b"), "{records:?}");
    let read = pipeline.heartbeats_reader();
    let stats = read();
    assert!(stats.iter().all(|s| s.flow == "b"), "{stats:?}");
    pipeline.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flows_over_everything_in_both_directions_never_copy_heartbeat_topics() -> TestResult {
    let env = Env::start().await?;
    let (us, eu) = (client(&env.us).await?, client(&env.eu).await?);
    create_topic(&us, "shared", "t", 1).await?;
    produce(&us, "shared", "t", 1, 0..20, 20).await?;
    let mut there = flow("us-eu", &["*/*"]);
    there.heartbeat_interval = Duration::from_millis(100);
    let mut back = flow("eu-us", &["*/*"]);
    (back.source, back.target) = ("eu".into(), "us".into());
    back.heartbeat_interval = Duration::from_millis(100);
    let mut params = env.params(there);
    params.flows.push(back);
    let control = InMemoryControl::new();
    let pipeline = Pipeline::start(params, control.clone()).await?;
    wait_until(
        "heartbeats on both sides",
        Duration::from_secs(30),
        || async {
            count(&env.eu, "replicator", "heartbeats", 0) >= 3
                && count(&env.us, "replicator", "heartbeats", 0) >= 3
        },
    )
    .await?;
    // New topics on both sides, copied across: both discoveries ran after both heartbeat
    // topics existed.
    create_topic(&us, "late-us", "t", 1).await?;
    produce(&us, "late-us", "t", 1, 0..5, 5).await?;
    create_topic(&eu, "late-eu", "t", 1).await?;
    produce(&eu, "late-eu", "t", 1, 0..5, 5).await?;
    wait_until(
        "late topics copied both ways",
        Duration::from_secs(30),
        || async {
            count(&env.eu, "late-us", "t", 0) == 5 && count(&env.us, "late-eu", "t", 0) == 5
        },
    )
    .await?;
    let units = control.known_units();
    assert!(
        units.iter().all(|u| u.stream != "replicator"),
        "a heartbeat topic became a unit: {units:?}"
    );
    for (c, expected) in [(&eu, "us-eu"), (&us, "eu-us")] {
        let records = heartbeats(c, "replicator", "heartbeats").await?;
        assert!(!records.is_empty());
        assert!(
            records
                .iter()
                .all(|(r, h)| r.flow == expected && h == expected),
            "heartbeats of another flow were copied in: {records:?}"
        );
    }
    pipeline.shutdown().await;
    Ok(())
}

/// A node lease that ends within the writers' margin while `short` is set.
#[derive(Clone)]
struct ShortNodeLease {
    short: Arc<std::sync::atomic::AtomicBool>,
}

impl Intercept for ShortNodeLease {
    fn node_lease(&self, lease: Option<Instant>) -> Option<Instant> {
        if self.short.load(Ordering::SeqCst) {
            Some(Instant::now() + Duration::from_millis(50))
        } else {
            lease
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_goes_through_the_targets_door_only_while_the_nodes_lease_holds() -> TestResult
{
    let (env, _up, mut flow) = Env::seeded("doorbeat", "t", 1, 0..20, 20).await?;
    flow.heartbeat_interval = Duration::from_millis(100);
    let control = InMemoryControl::new();
    let short = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let intercepted = Intercepted {
        inner: control.clone(),
        hooks: ShortNodeLease {
            short: short.clone(),
        },
    };
    let pipeline = Pipeline::start(env.params(flow.clone()), intercepted).await?;
    // The copies pass (their unit's lease is long); the heartbeats are held back at the door.
    let unit = WorkUnit::new(&flow.name, "doorbeat", "t", 0);
    wait_confirmed(&control, &unit, 19, Duration::from_secs(30)).await?;
    let heartbeats = pipeline.heartbeats_reader();
    wait_until("heartbeats held back", Duration::from_secs(30), || async {
        heartbeats().iter().any(|h| h.failures >= 3)
    })
    .await?;
    let held = heartbeats().into_iter().next().ok_or("no heartbeat task")?;
    check!(held.sent == 0);
    let error = held.last_error.unwrap_or_default();
    check!(error.contains("lease"), "{error}");
    check!(count(&env.eu, "replicator", "heartbeats", 0) == 0);
    // The lease holds again: heartbeats arrive.
    short.store(false, Ordering::SeqCst);
    wait_until(
        "heartbeats on the target",
        Duration::from_secs(30),
        || async { count(&env.eu, "replicator", "heartbeats", 0) >= 2 },
    )
    .await?;
    pipeline.shutdown().await;
    Ok(())
}
