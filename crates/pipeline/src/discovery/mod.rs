//! Per-flow discovery: lists upstream streams and topics, selects them by glob, mirrors their
//! shape downstream (create stream/topic, add partitions), and reports the flow's full unit set
//! to the control plane. Runs at start and then every discovery interval; a round whose report
//! the control plane could not take (a cluster still electing its first leader) or that failed
//! is followed by the next sooner ([`next_streak`]). A selected topic that
//! a residency policy forbids on the target is neither mirrored nor reported, only recorded.
//!
//! This folder holds the per-flow tasks that create topics on the flow's target beside the
//! copies' writers: discovery (here, which also tells the coordinator of recreated topics and
//! records the flow's first unit for the metadata sync, [`FirstUnit`]) and the flow's
//! heartbeats ([`heartbeat`]: its topic is created like a discovered one, and no glob selects
//! it).

pub(crate) mod heartbeat;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use replicator_model::{MetadataObject, MetadataRecord, WorkUnit};
use replicator_sdk::types::{CompressionAlgorithm, Identifier, IggyExpiry, MaxTopicSize, Topic};
use replicator_sdk::IggyCluster as _;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::next_backoff;
use crate::clients::Cluster;
use crate::control::{ControlPlane, UnitReport};
use crate::coordinator::{CoordinatorHandle, CoordinatorMsg};
use crate::error::{Error, Result};
use crate::params::{BackoffParams, FlowParams};
use crate::selection::mapping::{downstream_stream, Choice, Selector};
use crate::selection::pairing::Pairing;
use crate::selection::residency::{BlockedTopic, BlockedTopics};

/// The smallest unit of a flow as its discovery last found it (its owner runs the flow's
/// metadata sync rounds).
pub(crate) type FirstUnit = Arc<Mutex<Option<WorkUnit>>>;

/// Whether this instance runs the flow's metadata work now: it owns the flow's first unit
/// (`assignments` are this instance's) and its lease is valid. One instance at a time, so that
/// changes every instance would otherwise make at once (a user's sync, partitions added
/// downstream) are made once.
pub(crate) fn runs_flow_metadata(
    first_unit: &FirstUnit,
    assignments: &tokio::sync::watch::Receiver<Arc<Vec<replicator_model::Assignment>>>,
    control: &impl ControlPlane,
) -> bool {
    let first = first_unit
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    first.is_some_and(|unit| assignments.borrow().iter().any(|a| a.unit == unit))
        && control.lease_valid_until().is_some()
}

/// Inputs of one flow's discovery loop.
#[derive(Clone)]
pub(crate) struct DiscoveryParams<C> {
    /// The flow.
    pub(crate) flow: Arc<FlowParams>,
    /// Compiled include/exclude globs, under the flow's residency.
    pub(crate) selector: Selector,
    /// Where the topics the residency blocks are recorded.
    pub(crate) blocked: BlockedTopics,
    /// Upstream cluster.
    pub(crate) source: Arc<Cluster>,
    /// Downstream cluster.
    pub(crate) target: Arc<Cluster>,
    /// Control plane (receives the unit set).
    pub(crate) control: C,
    /// Told about recreated topics.
    pub(crate) coordinator: CoordinatorHandle,
    /// Pause between rounds.
    pub(crate) interval: Duration,
    /// Ends the loop.
    pub(crate) cancel: CancellationToken,
    /// Set to the flow's unit count after every round (the throttle's share of it).
    pub(crate) units_seen: Arc<std::sync::atomic::AtomicUsize>,
    /// Set to the flow's smallest unit after every round (its owner runs the metadata sync,
    /// and adds partitions downstream).
    pub(crate) first_unit: FirstUnit,
    /// This instance's assignments of the flow (whether it owns the first unit).
    pub(crate) assignments: tokio::sync::watch::Receiver<Arc<Vec<replicator_model::Assignment>>>,
    /// The flow's two-way pair, when flows copy back from its target (see
    /// [`crate::sync::metadata::pair`]): copies the reverse flow made are not copied back, and
    /// a topic deleted on its home is not created there again.
    pub(crate) pairing: Option<Arc<Pairing>>,
}

/// One upstream topic as discovery sees it.
#[derive(Debug, Clone, PartialEq)]
struct SeenTopic {
    /// Creation time (µs): tells a recreated topic of the same name apart.
    created_at: u64,
    /// Partition count.
    partitions: u32,
    /// Whether the downstream side was mirrored successfully for this shape.
    mirrored: bool,
    /// The downstream topic's partition count when it had fewer than upstream and none were
    /// added ([`partitions_to_add`]).
    downstream_short: Option<u32>,
    /// In a two-way pair: deleted on its home, the target (see [`deleted_at_home`]).
    deleted_at_home: bool,
}

/// Runs discovery until cancelled.
pub(crate) async fn run<C: ControlPlane>(p: DiscoveryParams<C>) {
    let span = tracing::info_span!("discovery", flow = %p.flow.name);
    async {
        let mut seen: BTreeMap<(String, String), SeenTopic> = BTreeMap::new();
        // Backoff of the rounds in a row whose units did not reach the control plane.
        let mut streak = Duration::ZERO;
        loop {
            let reported = match discover_once(&p, &mut seen).await {
                Ok(units) => {
                    p.units_seen
                        .store(units.len(), std::sync::atomic::Ordering::Relaxed);
                    *p.first_unit
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        units.iter().min().cloned();
                    match p.control.report_units(&p.flow.name, units).await {
                        Ok(UnitReport::Reported) => true,
                        // The control plane says why (at debug).
                        Ok(UnitReport::Deferred) => false,
                        Err(err) => {
                            tracing::warn!(error = %err, "reporting units failed");
                            false
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "discovery failed, retrying");
                    false
                }
            };
            streak = next_streak(streak, reported, p.interval);
            tokio::select! {
                () = p.cancel.cancelled() => return,
                () = tokio::time::sleep(pause(streak, p.interval)) => {}
            }
        }
    }
    .instrument(span)
    .await
}

/// The first pause after a round whose units did not reach the control plane; it doubles with
/// every further such round, up to the discovery interval. A fresh cluster's nodes start
/// discovering before they have elected a leader, and nothing is assigned before a report is
/// taken: waiting a whole interval (5 s by default) for the next round held the first copy
/// back by that long.
const UNREPORTED_PAUSE: Duration = Duration::from_millis(100);

/// The backoff after a round, given `streak`, the one before it: from [`UNREPORTED_PAUSE`],
/// doubling up to the discovery interval, while rounds' units do not reach the control plane;
/// zero once a round's do.
fn next_streak(streak: Duration, reported: bool, interval: Duration) -> Duration {
    if reported {
        return Duration::ZERO;
    }
    next_backoff(
        streak,
        &BackoffParams {
            initial: UNREPORTED_PAUSE,
            max: interval,
        },
    )
}

/// The pause before the next round: the backoff while there is one, else the interval.
fn pause(streak: Duration, interval: Duration) -> Duration {
    if streak.is_zero() {
        interval
    } else {
        streak
    }
}

/// One discovery round: returns the flow's full unit set.
async fn discover_once<C: ControlPlane>(
    p: &DiscoveryParams<C>,
    seen: &mut BTreeMap<(String, String), SeenTopic>,
) -> Result<Vec<WorkUnit>> {
    let streams = p
        .source
        .call(0, "get_streams", |c| async move { c.get_streams().await })
        .await?;
    let mut now: BTreeMap<(String, String), (SeenTopic, Topic)> = BTreeMap::new();
    let mut blocked = Vec::new();
    let mut deleted_now = BTreeMap::new();
    // The pair's records and the target's topics of the streams asked about, read once per
    // round.
    let records = p
        .pairing
        .as_ref()
        .and_then(|pairing| p.control.metadata_records(&pairing.view.pair));
    let mut on_target = BTreeMap::new();
    for stream in streams {
        let id = named(&stream.name)?;
        let details = p
            .source
            .call(0, "get_stream", |c| async move { c.get_stream(&id).await })
            .await?;
        let Some(details) = details else { continue };
        if p.pairing
            .as_ref()
            .is_some_and(|pairing| pairing.is_reverse_copy(&stream.name))
        {
            continue;
        }
        for topic in details.topics {
            match p.selector.choose(&stream.name, &topic.name) {
                Choice::Skip => continue,
                Choice::Blocked(policy) => {
                    blocked.push(BlockedTopic {
                        stream: stream.name.clone(),
                        topic: topic.name.clone(),
                        policy: policy.to_owned(),
                        heartbeat: false,
                    });
                    continue;
                }
                Choice::Copy => {}
            }
            let deleted = deleted_at_home(
                p,
                (&stream.name, &topic.name),
                records.as_ref(),
                &mut on_target,
            )
            .await?;
            let key = (stream.name.clone(), topic.name.clone());
            if deleted {
                if !seen.get(&key).is_some_and(|t| t.deleted_at_home) {
                    tracing::warn!(
                        stream = %stream.name, topic = %topic.name, home = %p.flow.target,
                        "topic deleted on its home cluster: not created there again, its units \
                         stop (delete it here too, or create it again on its home)"
                    );
                }
                deleted_now.insert(
                    key,
                    SeenTopic {
                        created_at: topic.created_at.as_micros(),
                        partitions: topic.partitions_count,
                        mirrored: false,
                        downstream_short: None,
                        deleted_at_home: true,
                    },
                );
                continue;
            }
            let seen_topic = SeenTopic {
                created_at: topic.created_at.as_micros(),
                partitions: topic.partitions_count,
                mirrored: true,
                downstream_short: None,
                deleted_at_home: false,
            };
            now.insert(
                (stream.name.clone(), topic.name.clone()),
                (seen_topic, topic),
            );
        }
    }
    blocked.sort();
    p.blocked.discovered(&p.flow.name, blocked);
    for (key, old) in seen
        .iter()
        .filter(|(k, t)| !t.deleted_at_home && !deleted_now.contains_key(*k))
    {
        match now.get(key) {
            None => tracing::warn!(
                stream = %key.0, topic = %key.1,
                "upstream topic deleted; its units stop, their offsets are kept"
            ),
            Some((new, _)) if new.created_at != old.created_at => {
                tracing::warn!(
                    stream = %key.0, topic = %key.1,
                    "upstream topic recreated; its units restart from the initial offset"
                );
                p.coordinator.send(CoordinatorMsg::TopicRecreated {
                    flow: p.flow.name.clone(),
                    stream: key.0.clone(),
                    topic: key.1.clone(),
                });
            }
            Some(_) => {}
        }
    }
    let mut units = Vec::new();
    // Decided once a round, from the previous round's first unit.
    let adds = runs_flow_metadata(&p.first_unit, &p.assignments, &p.control);
    for ((stream, _), (seen_topic, topic)) in now.iter_mut() {
        let key = (stream.clone(), topic.name.clone());
        let old = seen.get(&key).filter(|old| {
            old.created_at == seen_topic.created_at && old.partitions == seen_topic.partitions
        });
        if !old.is_some_and(|old| old.mirrored) {
            let short_before = old.and_then(|old| old.downstream_short);
            match mirror(p, stream, topic, short_before, adds).await {
                Ok(Mirrored::Done) => {}
                Ok(Mirrored::Short { downstream }) => {
                    seen_topic.mirrored = false;
                    seen_topic.downstream_short = Some(downstream);
                }
                Err(err) => {
                    tracing::warn!(
                        stream = %stream, topic = %topic.name, error = %err,
                        "could not mirror topic downstream, retrying next round"
                    );
                    seen_topic.mirrored = false;
                }
            }
        }
        units.extend(
            (0..topic.partitions_count)
                .map(|partition| WorkUnit::new(&p.flow.name, stream, &topic.name, partition)),
        );
    }
    *seen = now.into_iter().map(|(k, (t, _))| (k, t)).collect();
    seen.extend(deleted_now);
    Ok(units)
}

/// Whether `stream/topic`, which the flow's source has, was deleted on its home, the flow's
/// target: the topic of a two-way pair recorded at home there (see
/// [`crate::sync::metadata::pair`]) and gone from it. Creating it again would undo the
/// deletion with the copy; deletion does not travel either (the copy is kept and reported).
/// Without `records` (a cluster below feature level 3) nothing is known: `false`. `on_target`
/// holds the target's topics per stream (`None`: no such stream), read once per round.
async fn deleted_at_home<C: ControlPlane>(
    p: &DiscoveryParams<C>,
    (stream, topic): (&str, &str),
    records: Option<&BTreeMap<MetadataObject, MetadataRecord>>,
    on_target: &mut BTreeMap<String, Option<BTreeSet<String>>>,
) -> Result<bool> {
    let Some(pairing) = p
        .pairing
        .as_ref()
        .filter(|pr| pr.pairs_topic(stream, topic))
    else {
        return Ok(false);
    };
    let at_home = records
        .and_then(|records| {
            records.get(&MetadataObject::Topic {
                stream: stream.to_owned(),
                topic: topic.to_owned(),
            })
        })
        .is_some_and(|r| r.home == pairing.view.target);
    if !at_home {
        return Ok(false);
    }
    if !on_target.contains_key(stream) {
        let id = named(stream)?;
        let details = p
            .target
            .call(0, "get_stream", |c| async move { c.get_stream(&id).await })
            .await?;
        on_target.insert(
            stream.to_owned(),
            details.map(|d| d.topics.into_iter().map(|t| t.name).collect()),
        );
    }
    Ok(!on_target[stream]
        .as_ref()
        .is_some_and(|topics| topics.contains(topic)))
}

/// What [`mirror`] left downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mirrored {
    /// The topic there has the upstream's partitions (or more).
    Done,
    /// It has fewer, `downstream`, and none were added this round.
    Short { downstream: u32 },
}

/// How many partitions to add to a downstream topic that has `downstream` of the upstream's
/// `upstream`, if any. Every instance's discovery looks at the topic, and on a real Iggy 0.8
/// server a topic being created (by another instance, a moment ago) answers with fewer
/// partitions than it is being created with: adding the difference then doubled or tripled
/// the topic's partitions (BENCHMARKS.md section 38). So partitions are added only by the
/// instance that runs the flow's metadata work (`adds`), and only once two rounds in a row
/// found the same shortfall (`short_before`: the previous round's count), so that a topic
/// still being created is left to finish.
fn partitions_to_add(
    upstream: u32,
    downstream: u32,
    short_before: Option<u32>,
    adds: bool,
) -> Option<u32> {
    (downstream < upstream && adds && short_before == Some(downstream))
        .then(|| upstream - downstream)
}

/// Creates the downstream stream and topic if missing (same partition count, compression,
/// message expiry and max size) and adds partitions when upstream has more, as
/// [`partitions_to_add`] allows.
async fn mirror<C>(
    p: &DiscoveryParams<C>,
    stream: &str,
    topic: &Topic,
    short_before: Option<u32>,
    adds: bool,
) -> Result<Mirrored> {
    let down_stream = downstream_stream(p.flow.naming, &p.flow.source, stream);
    let (sid, tid) = (named(&down_stream)?, named(&topic.name)?);
    let (s, t) = (sid.clone(), tid.clone());
    let existing = p
        .target
        .call(0, "get_topic", |c| async move { c.get_topic(&s, &t).await })
        .await?;
    match existing {
        Some(down) if down.partitions_count >= topic.partitions_count => Ok(Mirrored::Done),
        Some(down) => {
            let downstream = down.partitions_count;
            let Some(add) =
                partitions_to_add(topic.partitions_count, downstream, short_before, adds)
            else {
                tracing::debug!(
                    stream = %down_stream, topic = %topic.name, downstream,
                    upstream = topic.partitions_count, adds,
                    "downstream topic has fewer partitions; not adding this round"
                );
                return Ok(Mirrored::Short { downstream });
            };
            let (s, t) = (sid.clone(), tid.clone());
            p.target
                .call(0, "create_partitions", |c| async move {
                    c.create_partitions(&s, &t, add).await
                })
                .await?;
            tracing::info!(stream = %down_stream, topic = %topic.name, added = add, "partitions added downstream");
            Ok(Mirrored::Done)
        }
        None => {
            let shape = TopicShape {
                partitions: topic.partitions_count,
                compression: topic.compression_algorithm,
                expiry: topic.message_expiry,
                max_size: topic.max_topic_size,
            };
            create_stream_and_topic(&p.target, &down_stream, &topic.name, shape).await?;
            tracing::info!(stream = %down_stream, topic = %topic.name, partitions = shape.partitions, "topic created downstream");
            Ok(Mirrored::Done)
        }
    }
}

/// What a topic is created with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopicShape {
    pub(crate) partitions: u32,
    pub(crate) compression: CompressionAlgorithm,
    pub(crate) expiry: IggyExpiry,
    pub(crate) max_size: MaxTopicSize,
}

/// Creates `stream` (if missing) and `stream/topic` with `shape` on `target`; "already
/// exists" (another instance was first) counts as done.
pub(crate) async fn create_stream_and_topic(
    target: &Cluster,
    stream: &str,
    topic: &str,
    shape: TopicShape,
) -> Result<()> {
    let name = stream.to_owned();
    let created = target
        .call(0, "create_stream", |c| async move {
            c.create_stream(&name).await
        })
        .await;
    ignore_exists(created.map(|_| ()))?;
    let (sid, name) = (named(stream)?, topic.to_owned());
    let created = target
        .call(0, "create_topic", |c| async move {
            c.create_topic(
                &sid,
                &name,
                shape.partitions,
                shape.compression,
                None,
                shape.expiry,
                shape.max_size,
            )
            .await
        })
        .await;
    ignore_exists(created.map(|_| ()))
}

/// Treats "already exists" (another instance created it first) as success.
pub(crate) fn ignore_exists(result: Result<()>) -> Result<()> {
    match result {
        Err(Error::Iggy { ref source, .. })
            if source.kind() == replicator_sdk::ErrorKind::AlreadyExists =>
        {
            Ok(())
        }
        other => other,
    }
}

/// A named identifier for discovery (names come from the server, so they are valid) and
/// heartbeats (validated names).
pub(crate) fn named(name: &str) -> Result<Identifier> {
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
    fn partitions_are_added_once_by_the_metadata_runner_after_two_rounds_agree() {
        // A topic another instance is creating shows 0 of its 16 partitions, then all 16.
        check!(partitions_to_add(16, 0, None, true) == None);
        check!(partitions_to_add(16, 16, Some(0), true) == None);
        // Upstream grew from 16 to 18: the runner adds 2 once two rounds saw 16.
        check!(partitions_to_add(18, 16, None, true) == None);
        check!(partitions_to_add(18, 16, Some(16), true) == Some(2));
        // A shortfall that changed between rounds is still moving.
        check!(partitions_to_add(18, 17, Some(16), true) == None);
        // Another instance never adds, however long the shortfall lasts.
        check!(partitions_to_add(18, 16, Some(16), false) == None);
        // More downstream than upstream is left alone.
        check!(partitions_to_add(16, 20, Some(20), true) == None);
    }

    /// The pauses after `rounds` unreported rounds in a row, following a reported one.
    fn unreported_pauses(rounds: usize, interval: Duration) -> Vec<Duration> {
        let mut streak = next_streak(Duration::ZERO, true, interval);
        (0..rounds)
            .map(|_| {
                streak = next_streak(streak, false, interval);
                pause(streak, interval)
            })
            .collect()
    }

    #[test]
    fn a_reported_round_waits_the_interval() {
        let interval = Duration::from_secs(5);
        for streak in [Duration::ZERO, Duration::from_millis(400)] {
            check!(pause(next_streak(streak, true, interval), interval) == interval);
        }
    }

    #[test]
    fn unreported_rounds_come_back_soon_then_slower_up_to_the_interval() {
        let interval = Duration::from_secs(5);
        let pauses: Vec<u64> = unreported_pauses(8, interval)
            .iter()
            .map(|p| p.as_millis() as u64)
            .collect();
        check!(pauses == vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        check!(unreported_pauses(100, interval).last() == Some(&interval));
    }

    #[test]
    fn a_short_interval_bounds_the_pause() {
        let interval = Duration::from_millis(50);
        check!(unreported_pauses(1, interval) == vec![interval]);
    }
}
