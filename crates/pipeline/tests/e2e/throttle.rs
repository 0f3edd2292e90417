//! Throttling: a flow limited to some messages (or bytes) per second copies no faster than
//! that (one second of burst aside), and still copies everything exactly. Bounds are generous
//! lower bounds on the time taken: a machine can be slower, never faster than the limit; the
//! bench `throttle` measures how close it holds.

use std::time::{Duration, Instant};

use replicator_model::WorkUnit;

use crate::harness::{assert_exact, wait_confirmed, Env, TestResult};

/// Copies 2 partitions × 3000 messages under `limit`; returns how long it took.
async fn throttled_copy(
    stream: &str,
    limit: impl FnOnce(&mut replicator_pipeline::FlowParams),
) -> TestResult<Duration> {
    let (env, _up, mut flow) = Env::seeded(stream, "t", 2, 0..3000, 500).await?;
    limit(&mut flow);
    let started = Instant::now();
    let (control, pipeline) = env.run(&flow).await?;
    for p in 0..2 {
        let unit = WorkUnit::new(stream, stream, "t", p);
        wait_confirmed(&control, &unit, 2999, Duration::from_secs(60)).await?;
    }
    let took = started.elapsed();
    assert_exact(&env.verify(&flow, Duration::from_secs(10)).await?);
    pipeline.shutdown().await;
    Ok(took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_limit_holds_the_copy_back_and_loses_nothing() -> TestResult {
    // 6000 messages at 2000/s with 2000 of burst: at least 2 s.
    let took = throttled_copy("throttle-msgs", |f| f.max_messages_per_second = Some(2000)).await?;
    assert!(took >= Duration::from_millis(1800), "copied in {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_limit_holds_the_copy_back_and_loses_nothing() -> TestResult {
    // Each message counts its 64-byte header, payload and headers (well over 100 bytes here):
    // 6000 messages at 200 000 bytes/s take at least 2 s.
    let took = throttled_copy("throttle-bytes", |f| f.max_bytes_per_second = Some(200_000)).await?;
    assert!(took >= Duration::from_millis(1800), "copied in {took:?}");
    Ok(())
}
