//! What the pipeline benches share: two in-process servers with a backlog upstream, and the
//! pipeline's clusters over them (`us` → `eu`).

use std::collections::BTreeMap;

use bytes::Bytes;
use iggy::prelude::IggyMessage;
use replicator_harness::{connect, produce_bulk, Bulk, Servers, Topic};
use replicator_model::WorkUnit;
use replicator_pipeline::{ClusterParams, ControlPlane, InMemoryControl};

pub(crate) type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Starts the servers with `topic` upstream holding `per_partition` messages (100-byte
/// payloads) in every partition; returns them and the clusters `us` (upstream) and `eu`.
pub(crate) async fn backlog(
    topic: Topic,
    per_partition: u64,
) -> BenchResult<(Servers, BTreeMap<String, ClusterParams>)> {
    let servers = Servers::start(topic).await?;
    let client = connect(&servers.upstream.connection_string()).await?;
    let bulk = Bulk {
        stream: servers.topic.stream.clone(),
        topic: servers.topic.name.clone(),
        partitions: (0..servers.topic.partitions).collect(),
        range: 0..per_partition,
        batch: 1000,
    };
    produce_bulk(&client, &bulk, |p, seq| {
        IggyMessage::builder()
            .id((u128::from(p) << 64) | (u128::from(seq) + 1))
            .payload(Bytes::from_static(&[0u8; 100]))
            .build()
    })
    .await?;
    let clusters = [
        ("us", servers.upstream.connection_string()),
        ("eu", servers.downstream.connection_string()),
    ]
    .into_iter()
    .map(|(alias, url)| (alias.to_owned(), ClusterParams::new(url)))
    .collect();
    Ok((servers, clusters))
}

/// Runs a bench's async body on a multi-threaded runtime.
pub(crate) fn block_on(bench: impl std::future::Future<Output = BenchResult>) -> BenchResult {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench)
}

/// Messages confirmed so far over `units`.
#[allow(dead_code)] // Each bench compiles this module on its own; not all of them count copies.
pub(crate) fn copied(control: &InMemoryControl, units: &[WorkUnit]) -> u64 {
    units
        .iter()
        .filter_map(|u| control.progress(u).and_then(|p| p.confirmed))
        .map(|c| c + 1)
        .sum()
}
