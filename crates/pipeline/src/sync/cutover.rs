//! What `flow promote` asks of the data plane of the node that runs it: how far each partition
//! of a flow reaches on both clusters, and one consumer-group sync round over all of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use replicator_model::{Offset, WorkUnit};
use replicator_sdk::types::{Consumer, PollingStrategy};
use replicator_sdk::IggyCluster as _;

use crate::clients::Cluster;
use crate::datapath::unit::named;
use crate::params::FlowParams;
use crate::selection::mapping::downstream_stream;
use crate::sync::groups::{FlowSyncState, GroupSyncRegistry, GroupSyncReport, SyncFn};
use crate::sync::metadata::{
    MetadataSync, MetadataSyncRegistry, MetadataSyncReport, MetadataSyncState, UserActivation,
};

/// How far one partition reaches on one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The offset the next message gets (0: empty).
    pub next_offset: Offset,
    /// Messages stored now (below `next_offset` once retention removed old ones).
    pub messages: u64,
    /// Creation time (µs) of the topic the partition belongs to: a topic deleted and created
    /// again under the same name is another one.
    pub topic_created_at: u64,
}

impl Extent {
    /// A partition's extent as its topic's details report it.
    pub(crate) fn of(p: &replicator_sdk::types::Partition, topic_created_at: u64) -> Self {
        // `current_offset` is the last message's offset, and 0 also for an empty partition.
        let next_offset = if p.messages_count == 0 && p.current_offset == 0 {
            0
        } else {
            p.current_offset + 1
        };
        Self {
            next_offset,
            messages: p.messages_count,
            topic_created_at,
        }
    }
}

/// A partition's extent upstream and downstream, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitExtents {
    /// The unit.
    pub unit: WorkUnit,
    /// Upstream, or the error reading it (the source may be gone).
    pub upstream: Result<Extent, String>,
    /// Downstream, or the error reading it.
    pub downstream: Result<Extent, String>,
}

/// A cheap handle (clone it) on the pipeline for `flow promote` (see the module docs).
#[derive(Clone)]
pub struct Cutover {
    pub(crate) flows: BTreeMap<String, Arc<FlowParams>>,
    pub(crate) clusters: BTreeMap<String, Arc<Cluster>>,
    pub(crate) syncs: BTreeMap<String, SyncFn>,
    pub(crate) registry: GroupSyncRegistry,
    pub(crate) metadata: BTreeMap<String, Arc<MetadataSync>>,
    pub(crate) metadata_registry: MetadataSyncRegistry,
}

impl Cutover {
    /// Whether this node runs `flow`.
    #[must_use]
    pub fn has_flow(&self, flow: &str) -> bool {
        self.flows.contains_key(flow)
    }

    /// Whether `flow` syncs consumer groups.
    #[must_use]
    pub fn syncs_groups(&self, flow: &str) -> bool {
        self.syncs.contains_key(flow)
    }

    /// Every partition of `units` (all of flow `flow`) on both clusters, one metadata request
    /// per topic and cluster.
    pub async fn extents(&self, flow: &str, units: &[WorkUnit]) -> Vec<UnitExtents> {
        let Some(f) = self.flows.get(flow) else {
            return Vec::new();
        };
        let mut topics: BTreeMap<(&str, &str), Vec<&WorkUnit>> = BTreeMap::new();
        for unit in units {
            topics
                .entry((unit.stream.as_str(), unit.topic.as_str()))
                .or_default()
                .push(unit);
        }
        let mut out = Vec::new();
        for ((stream, topic), units) in topics {
            let down_stream = downstream_stream(f.naming, &f.source, stream);
            let up = self.topic_extents(&f.source, stream, topic, units[0]).await;
            let down = self
                .topic_extents(&f.target, &down_stream, topic, units[0])
                .await;
            for unit in units {
                let pick = |side: &Result<BTreeMap<u32, Extent>, String>| match side {
                    Ok(parts) => parts
                        .get(&unit.partition)
                        .copied()
                        .ok_or_else(|| format!("partition {} missing", unit.partition)),
                    Err(e) => Err(e.clone()),
                };
                out.push(UnitExtents {
                    unit: unit.clone(),
                    upstream: pick(&up),
                    downstream: pick(&down),
                });
            }
        }
        out
    }

    /// The first offset each unit's upstream partition still holds (retention removes the
    /// oldest messages, the offsets stay), `None` for an empty partition, or the error reading
    /// it: where `flow reset --to earliest` starts.
    pub async fn first_offsets(
        &self,
        flow: &str,
        units: &[WorkUnit],
    ) -> Vec<Result<Option<Offset>, String>> {
        let mut out = Vec::with_capacity(units.len());
        for unit in units {
            out.push(self.first_offset(flow, unit).await);
        }
        out
    }

    async fn first_offset(&self, flow: &str, unit: &WorkUnit) -> Result<Option<Offset>, String> {
        let f = self
            .flows
            .get(flow)
            .ok_or_else(|| format!("no flow {flow} on this node"))?;
        let cluster = self
            .clusters
            .get(&f.source)
            .ok_or_else(|| format!("no cluster {}", f.source))?;
        let stream = named(&unit.stream, unit).map_err(|e| e.to_string())?;
        let topic = named(&unit.topic, unit).map_err(|e| e.to_string())?;
        let consumer =
            Consumer::new(named("iggy-replicator.reset", unit).map_err(|e| e.to_string())?);
        let partition = unit.partition;
        let polled = cluster
            .call(
                partition as usize,
                "poll_messages (first offset)",
                |c| async move {
                    // From offset 0 the server answers from the oldest message it still holds.
                    c.poll_messages(
                        &stream,
                        &topic,
                        Some(partition),
                        &consumer,
                        &PollingStrategy::offset(0),
                        1,
                        false,
                    )
                    .await
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(polled.messages.first().map(|m| m.offset))
    }

    async fn topic_extents(
        &self,
        alias: &str,
        stream: &str,
        topic: &str,
        unit: &WorkUnit,
    ) -> Result<BTreeMap<u32, Extent>, String> {
        let cluster = self
            .clusters
            .get(alias)
            .ok_or_else(|| format!("no cluster {alias}"))?;
        let s = named(stream, unit).map_err(|e| e.to_string())?;
        let t = named(topic, unit).map_err(|e| e.to_string())?;
        let details = cluster
            .call(unit.partition as usize, "get_topic", |c| async move {
                c.get_topic(&s, &t).await
            })
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{stream}/{topic} not found on {alias}"))?;
        Ok(details
            .partitions
            .iter()
            .map(|p| (p.id, Extent::of(p, details.created_at.as_micros())))
            .collect())
    }

    /// One consumer-group sync round of `flow` over `units`, from this node; `None` when the
    /// flow does not sync groups. Recorded like a periodic round.
    pub async fn sync_groups(&self, flow: &str, units: Vec<WorkUnit>) -> Option<GroupSyncReport> {
        let sync = self.syncs.get(flow)?.clone();
        Some(sync(units).await)
    }

    /// One metadata sync round of `flow` from this node, recorded like a periodic round;
    /// `None` when this node does not run the flow.
    pub async fn metadata_round(&self, flow: &str) -> Option<MetadataSyncReport> {
        let sync = self.metadata.get(flow)?;
        let report = sync.round().await;
        self.metadata_registry
            .update(flow, |s| s.add(report.clone()));
        Some(report)
    }

    /// `flow promote`'s metadata step: one metadata sync round of `flow` from this node
    /// (recorded like a periodic round), the activation of the users `passwords` names (user
    /// name to password), and in a two-way pair the move of the homes of what the flow syncs to
    /// its target; `None` when this node does not run the flow. Passwords go to the target
    /// only.
    pub async fn promote_metadata(
        &self,
        flow: &str,
        passwords: &BTreeMap<String, String>,
    ) -> Option<(MetadataSyncReport, Vec<UserActivation>, Vec<String>)> {
        let report = self.metadata_round(flow).await?;
        let sync = self.metadata.get(flow)?;
        let (activated, mut errors) = sync.activate(passwords).await;
        errors.extend(sync.take_homes().await);
        Some((report, activated, errors))
    }

    /// Every flow's metadata sync state on this node (flows whose rounds ran here).
    #[must_use]
    pub fn metadata_sync_state(&self) -> BTreeMap<String, MetadataSyncState> {
        self.metadata_registry.snapshot()
    }

    /// Every flow's consumer-group sync state on this node.
    #[must_use]
    pub fn group_sync_state(&self) -> BTreeMap<String, FlowSyncState> {
        self.registry.snapshot()
    }
}
