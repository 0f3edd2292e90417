//! Compares what a flow copied: streams each selected upstream partition and its downstream
//! counterpart in batches (never holding a whole topic) and reports, per partition, counts,
//! missing, duplicated, out-of-order and corrupted messages.
//!
//! With provenance on, downstream messages are matched to upstream ones by the source offset in
//! their provenance header, so foreign messages in the same downstream partition (other producers,
//! a reverse flow) are ignored; messages that originated in the target cluster are expected to be
//! absent. Without provenance, partitions are compared position by position.

use replicator_model::IggyVersion;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use replicator_sdk::types::{Consumer, Identifier, PollingStrategy};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::Message;

use crate::clients::Cluster;
use crate::error::{Error, Result};
use crate::params::FlowParams;
use crate::provenance;
use crate::selection::mapping::{downstream_stream, Selector};
use crate::selection::residency::Residency;

/// What to verify.
#[derive(Debug, Clone)]
pub struct VerifyParams {
    /// The flow (source/target aliases, globs, naming, provenance).
    pub flow: FlowParams,
    /// Connection string of the flow's source cluster, e.g. `iggy://u:p@10.0.0.1:8090`.
    pub source_connection: String,
    /// Connection string of the flow's target cluster.
    pub target_connection: String,
    /// The protocol generation of the source cluster. Default: 0.8.
    pub source_version: IggyVersion,
    /// The protocol generation of the target cluster. Default: 0.8.
    pub target_version: IggyVersion,
    /// Messages per poll, e.g. 1000.
    pub batch_size: u32,
    /// How long to wait for the copy to become exact (catching up), e.g. 30 s; zero = check once.
    pub wait: Duration,
    /// Timeout of each Iggy call, e.g. 10 s.
    pub operation_timeout: Duration,
    /// The heartbeat topics of every flow of the config (`PipelineParams::heartbeat_topics`),
    /// left out like discovery leaves them out; default: the flow's own.
    pub heartbeat_topics: Vec<String>,
    /// The residency policies (`PipelineParams::policies`): the topics they keep from the
    /// target are not copied, so they are left out too. Default: none.
    pub policies: Vec<crate::params::PolicyParams>,
    /// The zones of the flow's target (`ClusterParams::zones`). Default: none.
    pub target_zones: Vec<String>,
}

impl VerifyParams {
    /// Verify `flow` between two clusters, checking once, polling 1000 messages at a time.
    pub fn new(flow: FlowParams, source_connection: String, target_connection: String) -> Self {
        Self {
            heartbeat_topics: vec![flow.heartbeat_topic.clone()],
            flow,
            source_connection,
            target_connection,
            source_version: IggyVersion::default(),
            target_version: IggyVersion::default(),
            batch_size: 1000,
            wait: Duration::ZERO,
            operation_timeout: Duration::from_secs(10),
            policies: Vec::new(),
            target_zones: Vec::new(),
        }
    }
}

/// The comparison of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionReport {
    /// Upstream stream.
    pub stream: String,
    /// Topic.
    pub topic: String,
    /// Partition id.
    pub partition: u32,
    /// Upstream messages expected downstream (retained, not originating in the target).
    pub upstream: u64,
    /// Downstream messages attributed to this flow.
    pub downstream: u64,
    /// Expected messages not found downstream.
    pub missing: u64,
    /// Downstream messages that repeat an upstream message already seen.
    pub duplicated: u64,
    /// Downstream messages whose source offset is below the previous one's.
    pub out_of_order: u64,
    /// Downstream messages whose id, payload, user headers or origin timestamp differ from
    /// their upstream message, or which have no upstream counterpart.
    pub corrupted: u64,
    /// Upstream messages not expected downstream because they originated in the target.
    pub skipped_loop: u64,
    /// Downstream messages whose upstream counterpart is no longer retained (not checked).
    pub below_retention: u64,
}

impl PartitionReport {
    /// Whether the downstream partition holds exactly the upstream messages, in order.
    pub fn is_exact(&self) -> bool {
        self.missing == 0
            && self.duplicated == 0
            && self.out_of_order == 0
            && self.corrupted == 0
            && self.upstream == self.downstream - self.below_retention.min(self.downstream)
    }
}

/// The comparison of a whole flow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// One entry per selected upstream partition, ordered by stream, topic, partition.
    pub partitions: Vec<PartitionReport>,
}

impl VerifyReport {
    /// Whether every partition is exact.
    pub fn is_exact(&self) -> bool {
        self.partitions.iter().all(PartitionReport::is_exact)
    }

    /// Upstream messages over all partitions.
    pub fn upstream_total(&self) -> u64 {
        self.partitions.iter().map(|p| p.upstream).sum()
    }

    /// Downstream messages over all partitions.
    pub fn downstream_total(&self) -> u64 {
        self.partitions.iter().map(|p| p.downstream).sum()
    }
}

/// Verifies the flow, re-checking until it is exact or `params.wait` has passed; returns the
/// last report.
pub async fn verify(params: &VerifyParams) -> Result<VerifyReport> {
    let selector = Selector::new(&params.flow.include, &params.flow.exclude)
        .map_err(|(field, reason)| Error::InvalidParams { field, reason })?
        .reserving(params.heartbeat_topics.iter().cloned())
        .under(Arc::new(
            Residency::new(&params.policies, &params.target_zones)
                .map_err(|(field, reason)| Error::InvalidParams { field, reason })?,
        ));
    let source = Arc::new(Cluster::new(
        &params.flow.source,
        params.source_version,
        &params.source_connection,
        1,
        params.operation_timeout,
    )?);
    let target = Arc::new(Cluster::new(
        &params.flow.target,
        params.target_version,
        &params.target_connection,
        1,
        params.operation_timeout,
    )?);
    let deadline = Instant::now() + params.wait;
    let result = loop {
        let report = verify_once(params, &selector, &source, &target).await;
        match report {
            Ok(r) if r.is_exact() || Instant::now() >= deadline => break Ok(r),
            Err(e) if Instant::now() >= deadline => break Err(e),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    source.close().await;
    target.close().await;
    result
}

/// One full pass over every selected partition.
async fn verify_once(
    params: &VerifyParams,
    selector: &Selector,
    source: &Arc<Cluster>,
    target: &Arc<Cluster>,
) -> Result<VerifyReport> {
    let streams = source
        .call(0, "get_streams", |c| async move { c.get_streams().await })
        .await?;
    let mut report = VerifyReport::default();
    for stream in streams {
        let id = name_id(&stream.name)?;
        let Some(details) = source
            .call(0, "get_stream", |c| async move { c.get_stream(&id).await })
            .await?
        else {
            continue;
        };
        for topic in details.topics {
            if !selector.matches(&stream.name, &topic.name) {
                continue;
            }
            let down_stream =
                downstream_stream(params.flow.naming, &params.flow.source, &stream.name);
            let (ds, dt) = (name_id(&down_stream)?, name_id(&topic.name)?);
            let down = target
                .call(
                    0,
                    "get_topic",
                    |c| async move { c.get_topic(&ds, &dt).await },
                )
                .await?;
            for partition in 0..topic.partitions_count {
                let up = Cursor::new(
                    source.clone(),
                    &stream.name,
                    &topic.name,
                    partition,
                    params.batch_size,
                )?;
                let exists = down
                    .as_ref()
                    .is_some_and(|d| d.partitions.iter().any(|p| p.id == partition));
                let dn = exists
                    .then(|| {
                        Cursor::new(
                            target.clone(),
                            &down_stream,
                            &topic.name,
                            partition,
                            params.batch_size,
                        )
                    })
                    .transpose()?;
                let mut p = PartitionReport {
                    stream: stream.name.clone(),
                    topic: topic.name.clone(),
                    partition,
                    ..Default::default()
                };
                let created_at = topic.created_at.as_micros();
                compare(&mut p, up, dn, &params.flow, created_at).await?;
                report.partitions.push(p);
            }
        }
    }
    Ok(report)
}

/// Offsets seen downstream, as disjoint inclusive ranges (compact for in-order copies).
#[derive(Debug, Default)]
struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    /// Whether `v` is in the set.
    fn contains(&self, v: u64) -> bool {
        self.0
            .range(..=v)
            .next_back()
            .is_some_and(|(_, &end)| v <= end)
    }

    /// Adds `v`, merging with neighbours.
    fn insert(&mut self, v: u64) {
        if self.contains(v) {
            return;
        }
        let below = self
            .0
            .range(..v)
            .next_back()
            .filter(|(_, &end)| end + 1 == v)
            .map(|(&s, _)| s);
        let above = v
            .checked_add(1)
            .and_then(|n| self.0.get(&n).copied().map(|e| (n, e)));
        let start = below.unwrap_or(v);
        let end = match above {
            Some((n, e)) => {
                self.0.remove(&n);
                e
            }
            None => v,
        };
        self.0.insert(start, end);
    }
}

/// Whether two messages carry the same id, payload, user headers (without provenance) and
/// origin timestamp.
fn same(up: &Message, down: &Message) -> bool {
    up.id == down.id
        && up.origin_timestamp == down.origin_timestamp
        && up.payload == down.payload
        && provenance::strip(up.user_headers.as_deref())
            == provenance::strip(down.user_headers.as_deref())
}

/// Compares one partition pair into `p`.
async fn compare(
    p: &mut PartitionReport,
    mut up: Cursor,
    down: Option<Cursor>,
    flow: &FlowParams,
    created_at: u64,
) -> Result<()> {
    let Some(mut down) = down else {
        while next_expected(&mut up, p, flow).await?.is_some() {}
        p.missing = p.upstream;
        return Ok(());
    };
    if !flow.provenance {
        loop {
            let u = next_expected(&mut up, p, flow).await?;
            let d = down.next().await?;
            if d.is_some() {
                p.downstream += 1;
            }
            match (u, d) {
                (Some(u), Some(d)) if !same(&u, &d) => p.corrupted += 1,
                (Some(_), Some(_)) => {}
                (Some(_), None) => p.missing += 1,
                (None, Some(_)) => p.duplicated += 1,
                (None, None) => return Ok(()),
            }
        }
    }
    // Upstream holds one history of the topic, its newest: a partition reset (purged) upstream
    // leaves the copies of its earlier histories downstream, under fewer resets and
    // before the newer ones. Only the copies of the newest are compared: when a copy of a newer
    // history shows up, what was compared so far is dropped and upstream is read again.
    let (fresh_up, before) = (up.clone(), p.clone());
    let mut history: Option<u16> = None;
    let mut matched = RangeSet::default();
    let mut in_order = 0u64;
    let mut late = 0u64;
    let mut last: Option<u64> = None;
    let mut head = next_expected(&mut up, p, flow).await?;
    let mut first_up = head.as_ref().map(|m| m.offset);
    while let Some(d) = down.next().await? {
        let found = provenance::find(d.user_headers.as_deref());
        if !found.from_source(&flow.source) {
            continue;
        }
        let Some(copied) = copied_history(&found, created_at) else {
            continue;
        };
        match history {
            Some(h) if copied < h => continue,
            Some(h) if copied > h => {
                (up, *p) = (fresh_up.clone(), before.clone());
                (matched, in_order, late, last) = (RangeSet::default(), 0, 0, None);
                head = next_expected(&mut up, p, flow).await?;
                first_up = head.as_ref().map(|m| m.offset);
            }
            _ => {}
        }
        history = Some(copied);
        let Some(s) = found.offset else { continue };
        p.downstream += 1;
        if matched.contains(s) {
            p.duplicated += 1;
            continue;
        }
        if last.is_some_and(|l| s < l) {
            p.out_of_order += 1;
            matched.insert(s);
            if first_up.is_some_and(|f| s >= f) {
                late += 1;
            }
            continue;
        }
        last = Some(s);
        while head.as_ref().is_some_and(|h| h.offset < s) {
            head = next_expected(&mut up, p, flow).await?;
        }
        match &head {
            Some(h) if h.offset == s => {
                if !same(h, &d) {
                    p.corrupted += 1;
                }
                matched.insert(s);
                in_order += 1;
                head = next_expected(&mut up, p, flow).await?;
            }
            _ if first_up.is_none_or(|f| s < f) => p.below_retention += 1,
            _ => p.corrupted += 1,
        }
    }
    while head.is_some() {
        head = next_expected(&mut up, p, flow).await?;
    }
    p.missing = p.upstream.saturating_sub(in_order + late);
    Ok(())
}

/// The history (its resets since the topic was created at `created_at`) that a
/// copy `found` belongs to, if it is a copy of that topic.
fn copied_history(found: &provenance::Found<'_>, created_at: u64) -> Option<u16> {
    let history = provenance::History::from_label(found.history_label?);
    history.is_of(created_at).then_some(history.resets)
}

/// The next upstream message expected downstream (counting skipped ones).
async fn next_expected(
    up: &mut Cursor,
    p: &mut PartitionReport,
    flow: &FlowParams,
) -> Result<Option<Message>> {
    while let Some(m) = up.next().await? {
        if flow.provenance
            && provenance::find(m.user_headers.as_deref()).originated_in(&flow.target)
        {
            p.skipped_loop += 1;
            continue;
        }
        p.upstream += 1;
        return Ok(Some(m));
    }
    Ok(None)
}

/// Streams one partition from offset 0 in batches (a clone made before the first `next`
/// streams it again from there).
#[derive(Clone)]
struct Cursor {
    /// The cluster.
    cluster: Arc<Cluster>,
    /// Stream id.
    stream: Identifier,
    /// Topic id.
    topic: Identifier,
    /// Partition id.
    partition: u32,
    /// Next offset to poll.
    next: u64,
    /// Messages polled, not yet returned.
    buf: VecDeque<Message>,
    /// The end was reached.
    done: bool,
    /// Messages per poll.
    batch: u32,
    /// Plain consumer used for polling.
    consumer: Consumer,
}

impl Cursor {
    /// A cursor at offset 0.
    fn new(
        cluster: Arc<Cluster>,
        stream: &str,
        topic: &str,
        partition: u32,
        batch: u32,
    ) -> Result<Self> {
        Ok(Self {
            cluster,
            stream: name_id(stream)?,
            topic: name_id(topic)?,
            partition,
            next: 0,
            buf: VecDeque::new(),
            done: false,
            batch: batch.max(1),
            consumer: Consumer::new(name_id("iggy-replicator.verify")?),
        })
    }

    /// The next message, polling when the buffer is empty.
    async fn next(&mut self) -> Result<Option<Message>> {
        if self.buf.is_empty() && !self.done {
            let (s, t, c) = (
                self.stream.clone(),
                self.topic.clone(),
                self.consumer.clone(),
            );
            let (partition, from, count) = (self.partition, self.next, self.batch);
            let polled = self
                .cluster
                .call(0, "poll_messages (verify)", |cl| async move {
                    cl.poll_messages(
                        &s,
                        &t,
                        Some(partition),
                        &c,
                        &PollingStrategy::offset(from),
                        count,
                        false,
                    )
                    .await
                })
                .await?;
            let fresh: VecDeque<Message> = polled
                .messages
                .into_iter()
                .filter(|m| m.offset >= from)
                .collect();
            match fresh.back() {
                Some(m) => self.next = m.offset + 1,
                None => self.done = true,
            }
            self.buf = fresh;
        }
        Ok(self.buf.pop_front())
    }
}

/// A named identifier.
fn name_id(name: &str) -> Result<Identifier> {
    Identifier::named(name).map_err(|source| Error::Iggy {
        cluster: String::new(),
        op: format!("name `{name}`"),
        source: source.into(),
    })
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn range_set_merges_neighbours_and_answers_membership() {
        let mut r = RangeSet::default();
        for v in [1, 2, 3, 7, 5, 6] {
            r.insert(v);
        }
        check!(r.0.len() == 2);
        check!(r.contains(3));
        check!(!r.contains(4));
        r.insert(4);
        check!(r.0.len() == 1);
        check!(r.contains(7));
        check!(!r.contains(0));
    }

    #[test]
    fn exact_needs_no_missing_duplicate_or_corruption() {
        let mut p = PartitionReport {
            upstream: 10,
            downstream: 10,
            ..Default::default()
        };
        check!(p.is_exact());
        p.duplicated = 1;
        check!(!p.is_exact());
    }
}
