//! Failover time: `kill -9` of a random instance of three while producing, repeated; the time
//! until every partition it owned is written again by a new owner. The killed instance is
//! restarted and takes work again before the next round. At the end the copy must be exact.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use replicator_harness::{TestResult, Topic, Watch};

use crate::env::{cleaned_up, restart_and_rebalance, run_name, start_three_nodes, Endpoints};
use crate::load::paced;
use crate::report::{median_range, secs};
use crate::settings::Settings;

/// Partitions of the produced topic.
const PARTITIONS: u32 = 16;
/// Topic name.
const TOPIC: &str = "t";

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    let stream = run_name("failover");
    println!(
        "## Failover: {} × kill -9 of a random instance of three, {} msg/s produced, target fencing {}, defaults otherwise\n",
        settings.failovers, settings.failover_rate, settings.fencing
    );
    cleaned_up(endpoints, &stream, measure(endpoints, settings, &stream)).await
}

async fn measure(endpoints: &Endpoints, settings: &Settings, stream: &str) -> TestResult {
    let (mut cluster, _, _wan) =
        start_three_nodes(endpoints, settings, stream, &[TOPIC.to_owned()], PARTITIONS).await?;
    let topic = Topic::new(stream, TOPIC, PARTITIONS);
    let producer = paced(&endpoints.upstream, topic.targets(), settings.failover_rate);
    let watch = Watch::new(&endpoints.downstream, stream, TOPIC).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(settings.seed);
    println!(
        "| round | killed | role | partitions | first written again (s) | all written again (s) |"
    );
    println!("|---|---|---|---|---|---|");
    let mut all_times = Vec::new();
    let mut leader_times = Vec::new();
    for round in 1..=settings.failovers {
        let status = cluster.leader_status().await.ok_or("no leader")?;
        let running = cluster.running();
        let victim = running[rng.gen_range(0..running.len())];
        let role = if status.leader == Some(victim) {
            "leader"
        } else {
            "follower"
        };
        let killed = cluster
            .kill_and_wait_resumed(victim, &topic, &watch)
            .await?;
        let resumed = killed.resumed;
        println!(
            "| {round} | node {victim} | {role} | {} | {} | {} |",
            killed.owned.len(),
            secs(resumed.first),
            secs(resumed.all)
        );
        all_times.push(resumed.all.as_secs_f64());
        if role == "leader" {
            leader_times.push(resumed.all.as_secs_f64());
        }
        restart_and_rebalance(&mut cluster, victim, &running).await?;
    }
    let produced = producer.stop().await?.produced;
    watch
        .wait_total(produced, Instant::now(), Duration::from_secs(120))
        .await?;
    watch.close().await;
    let exact = cluster.verify(Duration::from_secs(60)).await?;
    let max = all_times.iter().copied().fold(0.0, f64::max);
    println!(
        "\nall partitions written again: median (min–max) {} s, max {max:.2} s; leader kills: {}; {produced} messages produced; verify: {}\n",
        median_range(&all_times, 2),
        if leader_times.is_empty() {
            "none".to_owned()
        } else {
            median_range(&leader_times, 2)
        },
        if exact { "exact (no loss, no duplicates)" } else { "NOT EXACT" }
    );
    if !exact {
        return Err("verify found the copy not exact after the failovers".into());
    }
    cluster.passed();
    Ok(())
}
