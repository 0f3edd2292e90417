//! Topic churn under load: 100 topics are created in the replicated stream, copied, and
//! deleted while the producer writes into `ha/events`. Their partitions join the control
//! state, are retired once discovery no longer sees them, and are forgotten after
//! `cluster.forget_retired_after` (1 s here): every node's state returns to the units it had
//! before, and the copy of `ha/events` stays exact.

use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::{Identifier, IggyMessage};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, partition_counts, produce_bulk, serial, wait_until, Bulk,
    ReplicatorCluster, TestResult,
};

use crate::fixture::{self, finish_with_exact_copy};

const TOPICS: usize = 100;
const MESSAGES: u64 = 5;
const WAIT: Duration = Duration::from_secs(120);

fn churn_topic(i: usize) -> String {
    format!("churn-{i:03}")
}

#[test]
fn the_state_returns_to_its_size_after_100_topics_come_and_go() -> TestResult {
    serial(|| async {
        let servers = replicator_harness::Servers::start(fixture::topic()).await?;
        let urls = (
            servers.upstream.connection_string(),
            servers.downstream.connection_string(),
        );
        let mut spec = fixture::spec_between((&urls.0, &urls.1), false, None, "")?;
        spec.cluster_toml = "forget_retired_after = \"1s\"".to_owned();
        let base_units = spec.units;
        let cluster = ReplicatorCluster::launch(spec, fixture::loopback(3)?).await?;
        let producer = fixture::produce_into(&urls.0);
        servers.wait_copy_started(Duration::from_secs(30)).await?;
        let before = units_everywhere(&cluster).await?;
        println!("units before: {before:?}");
        assert!(before.iter().all(|n| *n == base_units), "{before:?}");

        let stream = fixture::topic().stream;
        let (up, down) = (connect(&urls.0).await?, connect(&urls.1).await?);
        for i in 0..TOPICS {
            let topic = churn_topic(i);
            ensure_topic(&up, &stream, &topic, 1).await?;
            let bulk = Bulk {
                stream: stream.clone(),
                topic,
                partitions: vec![0],
                range: 0..MESSAGES,
                batch: MESSAGES,
            };
            produce_bulk(&up, &bulk, |_, seq| {
                IggyMessage::builder()
                    .id(u128::from(seq) + 1)
                    .payload(Bytes::from(format!("churn {i} {seq}")))
                    .build()
            })
            .await?;
        }
        wait_until("every churn topic copied", WAIT, || async {
            for i in 0..TOPICS {
                match partition_counts(&down, &stream, &churn_topic(i)).await {
                    Ok(counts) if counts == [MESSAGES] => {}
                    _ => return false,
                }
            }
            true
        })
        .await?;
        let grown = units_everywhere(&cluster).await?;
        println!("units with the churn topics: {grown:?}");
        assert!(grown.iter().all(|n| *n == base_units + TOPICS), "{grown:?}");

        let stream_id = Identifier::named(&stream)?;
        for i in 0..TOPICS {
            up.delete_topic(&stream_id, &Identifier::named(&churn_topic(i))?)
                .await?;
        }
        wait_until("every node's state back to its units", WAIT, || async {
            units_everywhere(&cluster)
                .await
                .is_ok_and(|units| units.iter().all(|n| *n == base_units))
        })
        .await?;
        let status = cluster
            .wait_leader_status("every partition owned".into(), WAIT, |s| {
                s.all_units_owned_by_any_of(&[1, 2, 3], base_units)
            })
            .await?;
        assert!(
            status.units.iter().all(|u| !u.retired),
            "only the live topic's units are left"
        );
        finish_with_exact_copy(producer, servers, cluster).await
    })
}

/// The number of units in the control state as each running node reports it.
async fn units_everywhere(cluster: &ReplicatorCluster) -> TestResult<Vec<usize>> {
    let mut out = Vec::new();
    for node in cluster.running() {
        out.push(cluster.status_of(node).await?.units.len());
    }
    Ok(out)
}
