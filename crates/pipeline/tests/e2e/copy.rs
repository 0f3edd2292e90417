//! Plain copying: one instance, many messages, exact result.

use std::time::Duration;

use replicator_pipeline::{InMemoryControl, Pipeline};

use crate::harness::{assert_exact, client, create_topic, flow, produce, Env, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_copies_100k_messages_over_8_partitions_exactly() -> TestResult {
    let env = Env::start().await?;
    let up = client(&env.us).await?;
    create_topic(&up, "orders", "created", 8).await?;
    produce(&up, "orders", "created", 8, 0..12_500, 1000).await?;
    let f = flow("copy100k", &["orders/*"]);
    let pipeline = Pipeline::start(env.params(f.clone()), InMemoryControl::new()).await?;
    let report = env.verify(&f, Duration::from_secs(60)).await?;
    assert_exact(&report);
    assert!(report.upstream_total() == 100_000);
    assert!(report.downstream_total() == 100_000);
    let stats = pipeline.stats().await?;
    assert!(stats.len() == 8);
    assert!(stats.iter().map(|s| s.messages).sum::<u64>() == 100_000);
    assert!(stats.iter().all(|s| s.lag == Some(0)));
    pipeline.shutdown().await;
    Ok(())
}
