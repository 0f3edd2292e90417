//! A writer frozen in the middle of a send: the downstream server holds one `SEND_MESSAGES` of
//! a node's writer undelivered (the request is on its way, as in a network that stalls), the
//! node is frozen (SIGSTOP), its partitions move, the new owners write, and then the held
//! request arrives and the node thaws. With the target fenced (`fencing = "users"`, the
//! default) the leader revoked the node's writer user before the grant, so the late request is
//! refused and the copy stays exact. With `fencing = "off"` the same late request is appended
//! after the new owner's copy of the same messages: a duplicate, which shows that the first
//! test proves the fence and not luck.

use std::time::{Duration, Instant};

use replicator_harness::{
    serial, tick, wait_resumed, Deadline, NodeId, PacedProducer, ReplicatorCluster, Servers,
    Stalled, TestResult,
};

use crate::fixture::{self, finish_with_exact_copy};

/// What one run of the scenario left behind.
struct Frozen {
    /// The frozen node.
    node: NodeId,
    /// The partition whose send was held.
    partition: u32,
}

/// Starts three nodes with the target's `fencing`, holds a send of a follower's writer, freezes
/// that follower, waits until its partitions are written by others, lets the held request in,
/// then thaws the follower.
async fn freeze_mid_send(
    fencing: &str,
) -> TestResult<(Servers, ReplicatorCluster, PacedProducer, Frozen)> {
    let (servers, mut cluster, producer) = fixture::start_fencing(3, fencing).await?;
    let (node, owned) = fixture::owning_follower(&cluster, &servers.topic).await?;
    let partition = *owned.first().ok_or("no partition")?;

    // The producer keeps writing, so the node's writer of `partition` sends again soon; its
    // next request is held before the server reads it.
    let topic = &servers.topic;
    let hold = servers
        .downstream
        .faults()
        .hold_sends_to(&topic.stream, &topic.name, partition);
    tokio::time::timeout(Duration::from_secs(30), hold.until_held(1))
        .await
        .map_err(|_| format!("node {node} sent nothing to partition {partition} in 30 s"))?;
    cluster.pause(node)?;
    let frozen_at = Instant::now();
    let stalled = Stalled {
        partitions: owned.clone(),
        baseline: servers.downstream_counts(),
        since: frozen_at,
    };
    let resumed = wait_resumed(&servers, &stalled, Duration::from_secs(60)).await?;
    println!(
        "fencing {fencing}: node {node} frozen inside a send to partition {partition}; its {} partitions written by others after {:.2} s",
        owned.len(),
        resumed.all.as_secs_f64()
    );
    // The held request arrives while the node is still frozen, after the new owner wrote.
    tokio::time::timeout(Duration::from_secs(30), hold.release_and_wait())
        .await
        .map_err(|_| "the held request was not answered in 30 s")?;
    cluster.resume(node)?;
    Ok((servers, cluster, producer, Frozen { node, partition }))
}

#[test]
fn writer_frozen_inside_a_send_is_fenced_and_the_copy_stays_exact() -> TestResult {
    serial(|| async {
        let (servers, cluster, producer, frozen) = freeze_mid_send("users").await?;
        let others: Vec<NodeId> = cluster.running();
        cluster
            .wait_all_owned(&others, Duration::from_secs(60))
            .await?;
        println!(
            "node {} owns units again (a new writer identity); partition {} exact so far",
            frozen.node, frozen.partition
        );
        finish_with_exact_copy(producer, servers, cluster).await
    })
}

#[test]
fn without_the_fence_the_same_late_send_is_a_duplicate() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer, frozen) = freeze_mid_send("off").await?;
        let report = producer.stop().await?;
        let p = frozen.partition as usize;
        // Wait until every partition holds at least what was produced: partition `p` then
        // holds more (the late batch appended after the new owner's copy of it).
        let deadline = Deadline::new(Duration::from_secs(60), "the copy to catch up");
        let (up, down) = loop {
            let (up, down) = (servers.upstream_counts(), servers.downstream_counts());
            if up.iter().zip(&down).all(|(u, d)| d >= u) {
                break (up, down);
            }
            deadline.check_seeing(|| format!("upstream {up:?}, downstream {down:?}"))?;
            tick().await;
        };
        println!(
            "fencing off: produced {}; partition {p}: upstream {}, downstream {}",
            report.produced, up[p], down[p]
        );
        assert!(
            down[p] > up[p],
            "the late send of node {} was not appended: partition {p} upstream {}, downstream {}",
            frozen.node,
            up[p],
            down[p]
        );
        let run = cluster.run_verify(Duration::from_secs(10)).await?;
        println!("{}", run.stdout);
        assert!(!run.exact, "verify called a duplicated copy exact");
        cluster.passed();
        drop(cluster);
        servers.shutdown().await;
        Ok(())
    })
}
