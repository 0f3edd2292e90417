//! What a cluster holds and where a flow puts it: the streams and topics of one cluster by id
//! ([`Catalog`], what permissions name) and how a flow places upstream topics on its target
//! ([`Route`]). The user and settings syncs translate through them.

use std::collections::BTreeMap;

use replicator_model::Naming;
use replicator_sdk::types::Identifier;
use replicator_sdk::IggyCluster as _;

use super::settings::TopicSettings;
use crate::clients::Cluster;
use crate::error::{Error, Result};
use crate::selection::mapping::{downstream_stream, Selector};

/// The streams and topics of one cluster, by id (what permissions name).
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    pub(crate) streams: BTreeMap<u32, CatalogStream>,
}

/// One stream of a [`Catalog`].
#[derive(Debug, Clone)]
pub(crate) struct CatalogStream {
    pub(crate) name: String,
    pub(crate) topics: BTreeMap<u32, CatalogTopic>,
}

/// One topic of a [`CatalogStream`].
#[derive(Debug, Clone)]
pub(crate) struct CatalogTopic {
    pub(crate) name: String,
    /// `None` only in tests that need names alone.
    pub(crate) settings: Option<TopicSettings>,
    pub(crate) partitions: u32,
    pub(crate) replication_factor: u8,
    /// Creation time, µs (in a two-way pair the older of two namesakes is the home).
    pub(crate) created_at: u64,
}

impl Catalog {
    /// The id of the stream named `name`.
    pub(crate) fn stream_id(&self, name: &str) -> Option<u32> {
        self.streams
            .iter()
            .find_map(|(id, s)| (s.name == name).then_some(*id))
    }

    /// The id of `stream/topic`.
    pub(crate) fn topic_id(&self, stream: &str, topic: &str) -> Option<u32> {
        self.topic(stream, topic).map(|(_, id, _)| id)
    }

    /// `stream/topic` with its ids.
    pub(super) fn topic(&self, stream: &str, topic: &str) -> Option<(u32, u32, &CatalogTopic)> {
        let sid = self.stream_id(stream)?;
        let (tid, t) = self.streams[&sid]
            .topics
            .iter()
            .find(|(_, t)| t.name == topic)?;
        Some((sid, *tid, t))
    }

    /// Reads every stream and topic of `cluster`.
    pub(super) async fn read(cluster: &Cluster) -> Result<Self> {
        let streams = cluster
            .call(0, "get_streams", |c| async move { c.get_streams().await })
            .await?;
        let mut catalog = Self::default();
        for stream in streams {
            let id = Identifier::numeric(stream.id).map_err(|e| iggy_error(cluster, "id", e))?;
            let details = cluster
                .call(0, "get_stream", |c| async move { c.get_stream(&id).await })
                .await?;
            let Some(details) = details else { continue };
            let topics = details
                .topics
                .iter()
                .map(|t| {
                    (
                        t.id,
                        CatalogTopic {
                            name: t.name.clone(),
                            settings: Some(TopicSettings::of(t)),
                            partitions: t.partitions_count,
                            replication_factor: t.replication_factor,
                            created_at: t.created_at.as_micros(),
                        },
                    )
                })
                .collect();
            catalog.streams.insert(
                details.id,
                CatalogStream {
                    name: details.name,
                    topics,
                },
            );
        }
        Ok(catalog)
    }
}

/// The error of `op` on `cluster`.
pub(super) fn iggy_error(
    cluster: &Cluster,
    op: &str,
    source: impl Into<replicator_sdk::Error>,
) -> Error {
    Error::Iggy {
        cluster: cluster.alias().to_owned(),
        op: op.to_owned(),
        source: source.into(),
    }
}

/// How one flow places upstream topics on the target: what it copies, and under which stream.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) selector: Selector,
    pub(crate) naming: Naming,
    /// The source alias (prefix naming).
    pub(crate) source: String,
}

impl Route {
    /// The downstream name of upstream `stream`.
    pub(crate) fn downstream(&self, stream: &str) -> String {
        downstream_stream(self.naming, &self.source, stream)
    }
}
