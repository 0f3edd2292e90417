//! Flow heartbeats: while this node owns at least one unit of a flow, it writes a small JSON
//! record ([`HeartbeatRecord`]) every `heartbeat_interval` to the flow's heartbeat topic on the
//! target, so that consumers there can tell a healthy idle flow from a dead one (a flow whose
//! owners are all gone falls silent) and measure end-to-end latency while no data flows.
//!
//! One task per flow ([`run`]). It sends through the flow's door to its target, like the flow's
//! writers (`datapath::target`): on a fenced target as this member's current writer identity,
//! so a fenced or stale node cannot write heartbeats either, and only while this node's lease
//! is valid when the send's turn comes. The topic is created (1 partition)
//! through the target's admin connection, like discovery creates downstream topics, because
//! writer users have no `manage_*` rights. A failed tick is logged (at `warn` once per failure
//! streak, then at `debug`), counted and retried on the next tick; the task never waits on
//! anything of the data path.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use replicator_model::{Assignment, NodeId};
use replicator_sdk::types::{
    CompressionAlgorithm, HeaderKey, HeaderValue, IggyError, IggyExpiry, IggyMessage,
    IggyTimestamp, MaxTopicSize, Partitioning,
};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clients::Cluster;
use crate::control::ControlPlane;
use crate::datapath::target::TargetDoor;
use crate::discovery::{create_stream_and_topic, named, TopicShape};
use crate::error::{Error, Result};
use crate::params::FlowParams;
use crate::stats::{MeterRegistry, Observer};

/// How long a heartbeat topic the replicator creates keeps its records: heartbeats tell about
/// now, and one a second per node and flow would otherwise pile up forever.
pub(crate) const HEARTBEAT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The user header every heartbeat carries; its value is the flow name.
pub const HEARTBEAT_HEADER: &str = "repl-heartbeat";

/// The JSON payload of one heartbeat message.
///
/// **API boundary:** consumers on the target parse it; fields are only ever added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRecord {
    /// The flow's source cluster alias, e.g. `us`.
    pub source: String,
    /// The flow's target cluster alias, e.g. `eu`.
    pub target: String,
    /// The flow name, e.g. `us-to-eu`.
    pub flow: String,
    /// The node that sent it.
    pub node: NodeId,
    /// When it was sent, in microseconds since the Unix epoch (the sender's wall clock).
    pub sent_at_us: u64,
    /// This node's heartbeat counter of this flow since the process started (0, 1, 2, …; a
    /// failed send leaves a hole).
    pub seq: u64,
}

/// What the admin API and the metrics read about one flow's heartbeats on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatStats {
    /// The flow name.
    pub flow: String,
    /// Heartbeats the target acknowledged since the process started.
    pub sent: u64,
    /// Heartbeats that failed (topic creation or send) since the process started.
    pub failures: u64,
    /// Time since the newest acknowledged heartbeat; `None` before the first.
    pub last_sent_age: Option<Duration>,
    /// The error of the latest failed heartbeat (kept after later successes; compare with
    /// `last_sent_age`).
    pub last_error: Option<String>,
}

/// Live heartbeat meters of one flow, written by its task and read by the admin API.
#[derive(Debug)]
pub(crate) struct HeartbeatMeters {
    /// The flow name.
    flow: String,
    /// Acknowledged heartbeats.
    sent: AtomicU64,
    /// Failed heartbeats.
    failures: AtomicU64,
    /// When the newest heartbeat was acknowledged, and the latest error.
    last: Mutex<(Option<Instant>, Option<String>)>,
}

impl HeartbeatMeters {
    /// Fresh meters of `flow`.
    pub(crate) fn new(flow: &str) -> Self {
        Self {
            flow: flow.to_owned(),
            sent: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            last: Mutex::new((None, None)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<Instant>, Option<String>)> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn acknowledged(&self, at: Instant) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.lock().0 = Some(at);
    }

    fn failed(&self, error: &Error) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.lock().1 = Some(error.to_string());
    }

    /// A snapshot at `now`.
    pub(crate) fn snapshot(&self, now: Instant) -> HeartbeatStats {
        let (acked, error) = self.lock().clone();
        HeartbeatStats {
            flow: self.flow.clone(),
            sent: self.sent.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            last_sent_age: acked.map(|at| now.saturating_duration_since(at)),
            last_error: error,
        }
    }
}

/// Inputs of one flow's heartbeat task.
#[derive(Clone)]
pub(crate) struct HeartbeatParams<C> {
    /// The flow (its interval is not zero and its heartbeat topic valid).
    pub(crate) flow: Arc<FlowParams>,
    /// This node.
    pub(crate) node: NodeId,
    /// The lease.
    pub(crate) control: C,
    /// The flow's assignments on this node (see `FlowAssignments`).
    pub(crate) assignments: watch::Receiver<Arc<Vec<Assignment>>>,
    /// The target's admin connection (configured credential): creates the topic.
    pub(crate) admin: Arc<Cluster>,
    /// The door to the flow's target: heartbeats are sent through it, as this node's writer
    /// identity, with its lease checked right before.
    pub(crate) door: Arc<TargetDoor<C>>,
    /// The units' meters: whether the flow copied data since the previous heartbeat.
    pub(crate) units: MeterRegistry,
    /// Receives the round trip of a heartbeat of an idle flow as its replication latency.
    pub(crate) observer: Observer,
    /// Where the task publishes its counts.
    pub(crate) meters: Arc<HeartbeatMeters>,
    /// Ends the task.
    pub(crate) cancel: CancellationToken,
}

/// Whether this node owns at least one unit of `flow` (and so writes its heartbeats).
pub(crate) fn owns_unit_of(assignments: &[Assignment], flow: &str) -> bool {
    assignments.iter().any(|a| a.unit.flow == flow)
}

/// Whether a heartbeat's round trip stands in for the flow's replication latency: only when
/// no message of the flow was copied since the previous heartbeat (otherwise the batches
/// measure it, and heartbeats would dilute their figure).
pub(crate) fn reports_latency(copied_before: u64, copied_now: u64) -> bool {
    copied_now == copied_before
}

/// Runs the heartbeats of one flow until cancelled.
pub(crate) async fn run<C: ControlPlane>(p: HeartbeatParams<C>) {
    let span = tracing::info_span!("heartbeat", node = %p.node, flow = %p.flow.name);
    async move {
        if p.flow.heartbeat_interval.is_zero() {
            return;
        }
        let mut task = Task {
            assignments: p.assignments.clone(),
            topic_ready: false,
            seq: 0,
            copied: p.units.flow_messages(&p.flow.name),
            failing: false,
            p,
        };
        let mut tick = tokio::time::interval(task.p.flow.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = task.p.cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            task.tick().await;
        }
    }
    .instrument(span)
    .await
}

/// The state of a running heartbeat task.
struct Task<C> {
    p: HeartbeatParams<C>,
    /// The flow's assignments on this node.
    assignments: watch::Receiver<Arc<Vec<Assignment>>>,
    /// The topic was found or created (reset when a send says it is missing).
    topic_ready: bool,
    /// The next record's `seq`.
    seq: u64,
    /// Messages of the flow copied by this node as of the previous heartbeat.
    copied: u64,
    /// The previous heartbeat failed (the next failure logs at `debug` only).
    failing: bool,
}

impl<C: ControlPlane> Task<C> {
    /// One tick: a heartbeat if this node owns a unit of the flow, holds a valid lease and has
    /// a writer connection to the target.
    async fn tick(&mut self) {
        if !owns_unit_of(&self.assignments.borrow(), &self.p.flow.name) {
            return;
        }
        let now = Instant::now();
        if self
            .p
            .control
            .lease_valid_until()
            .is_none_or(|until| until <= now)
        {
            return;
        }
        let Some(target) = self.p.door.connection() else {
            tracing::debug!("no writer identity for the target yet: no heartbeat");
            return;
        };
        let seq = self.seq;
        self.seq += 1;
        let started = Instant::now();
        match self.beat(&target, seq).await {
            Ok(()) => {
                let acked = Instant::now();
                self.p.meters.acknowledged(acked);
                let copied = self.p.units.flow_messages(&self.p.flow.name);
                if reports_latency(self.copied, copied) {
                    self.p
                        .observer
                        .0
                        .replicated(&self.p.flow.name, acked.duration_since(started));
                }
                self.copied = copied;
                if std::mem::take(&mut self.failing) {
                    tracing::info!(seq, "heartbeats sent again");
                }
            }
            Err(error) => {
                self.p.meters.failed(&error);
                if let Error::Iggy { source, .. } = &error {
                    if crate::error::is_missing(source) {
                        self.topic_ready = false;
                    }
                }
                // A heartbeat held back for a lease that is not valid long enough is the node
                // waiting for its next renewal (every node right after it was granted units):
                // counted, and the lease's own metrics and alert say if it never comes.
                if matches!(error, Error::LeaseExpiring { .. }) {
                    tracing::debug!(seq, error = %error, "heartbeat held back until the lease renews");
                } else if std::mem::replace(&mut self.failing, true) {
                    tracing::debug!(seq, error = %error, "heartbeat failed, retrying next tick");
                } else {
                    tracing::warn!(seq, error = %error, "heartbeat failed, retrying next tick");
                }
            }
        }
    }

    /// Creates the topic if needed and sends heartbeat `seq` through `target`.
    async fn beat(&mut self, target: &Cluster, seq: u64) -> Result<()> {
        let flow = &self.p.flow;
        let Some((stream, topic)) = flow.heartbeat_address() else {
            return Err(Error::InvalidParams {
                field: format!("flows.{}.heartbeat_topic", flow.name),
                reason: "must be stream/topic".into(),
            });
        };
        if !self.topic_ready {
            ensure_topic(&self.p.admin, stream, topic).await?;
            self.topic_ready = true;
        }
        let record = HeartbeatRecord {
            source: flow.source.clone(),
            target: flow.target.clone(),
            flow: flow.name.clone(),
            node: self.p.node,
            sent_at_us: IggyTimestamp::now().as_micros(),
            seq,
        };
        let message = message(&record).map_err(|source| Error::Iggy {
            cluster: target.alias().to_owned(),
            op: "build heartbeat".into(),
            source,
        })?;
        let (s, t) = (named(stream)?, named(topic)?);
        let mut messages = [message];
        self.p
            .door
            .node_call(target, 0, "send_heartbeat", |c| async move {
                // A heartbeat topic has no copy to keep in step: where it landed is not
                // checked.
                c.send_messages(&s, &t, &Partitioning::partition_id(0), &mut messages)
                    .await
                    .map(drop)
            })
            .await
    }
}

/// The heartbeat message of `record`: its JSON, and the flow in [`HEARTBEAT_HEADER`]. Its id
/// is 0: the server assigns one.
fn message(record: &HeartbeatRecord) -> replicator_sdk::Result<Message> {
    let payload = serde_json::to_vec(record).map_err(|_| IggyError::InvalidFormat)?;
    let headers = BTreeMap::from([(
        HeaderKey::from_str(HEARTBEAT_HEADER)?,
        HeaderValue::from_str(&record.flow)?,
    )]);
    // SDK 0.10's builder encodes the user headers (both generations encode them alike).
    let built = IggyMessage::builder()
        .payload(Bytes::from(payload))
        .user_headers(headers)
        .build()?;
    Ok(Message::from(built))
}

/// Creates `stream/topic` on the target (1 partition, server defaults) when it is missing.
async fn ensure_topic(admin: &Cluster, stream: &str, topic: &str) -> Result<()> {
    let (sid, tid) = (named(stream)?, named(topic)?);
    let (s, t) = (sid.clone(), tid.clone());
    let existing = admin
        .call(0, "get_topic", |c| async move { c.get_topic(&s, &t).await })
        .await?;
    if existing.is_some() {
        return Ok(());
    }
    let shape = TopicShape {
        partitions: 1,
        compression: CompressionAlgorithm::None,
        expiry: IggyExpiry::ExpireDuration(HEARTBEAT_RETENTION.into()),
        max_size: MaxTopicSize::ServerDefault,
    };
    create_stream_and_topic(admin, stream, topic, shape).await?;
    tracing::info!(stream, topic, "heartbeat topic created on the target");
    Ok(())
}

#[cfg(test)]
mod tests {
    use assert2::check;
    use replicator_model::{Epoch, WorkUnit};

    use super::*;

    fn assignment(flow: &str) -> Assignment {
        Assignment {
            unit: WorkUnit::new(flow, "s", "t", 0),
            epoch: Epoch(1),
            release_requested: false,
        }
    }

    #[test]
    fn only_a_node_owning_a_unit_of_the_flow_sends() {
        check!(!owns_unit_of(&[], "f"));
        check!(!owns_unit_of(&[assignment("g")], "f"));
        check!(owns_unit_of(&[assignment("g"), assignment("f")], "f"));
    }

    #[test]
    fn only_an_idle_flow_reports_the_heartbeat_as_latency() {
        check!(reports_latency(7, 7));
        check!(!reports_latency(7, 8));
    }

    #[test]
    fn heartbeat_message_carries_the_record_as_json_and_the_flow_header(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let record = HeartbeatRecord {
            source: "us".into(),
            target: "eu".into(),
            flow: "us-to-eu".into(),
            node: 3,
            sent_at_us: 1_700_000_000_000_000,
            seq: 41,
        };
        let m = message(&record)?;
        let parsed: HeartbeatRecord = serde_json::from_slice(&m.payload)?;
        check!(parsed == record);
        let headers = IggyMessage::from(&m)
            .user_headers_map()?
            .unwrap_or_default();
        let value = headers.get(&HeaderKey::from_str(HEARTBEAT_HEADER)?);
        check!(
            value.map(|v| v.as_str().map(str::to_owned).ok()) == Some(Some("us-to-eu".to_owned()))
        );
        check!(m.id == 0);
        Ok(())
    }
}
