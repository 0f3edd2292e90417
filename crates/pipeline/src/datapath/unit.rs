//! What a unit's reader and writer tasks share: identity, resolved names, clients, meters, and
//! the batch type that travels between them through a bounded channel.

use std::sync::Arc;
use std::time::Duration;

use replicator_model::{Epoch, Offset, WorkUnit};
use replicator_sdk::types::Identifier;
use replicator_sdk::Message;

use crate::clients::Cluster;
use crate::error::{Error, Result};
use crate::params::{BackoffParams, FlowParams};
use crate::stats::Gap;
use crate::stats::UnitMeters;

/// Tunables every unit uses, resolved once from `PipelineParams`.
#[derive(Debug, Clone)]
pub(crate) struct UnitTuning {
    pub(crate) backoff: BackoffParams,
    /// Longest failure streak a reader or writer retries before it gives up and ends with the
    /// error (the coordinator then restarts the pair after a backoff).
    pub(crate) retry_budget: Duration,
    /// Messages scanned back for the downstream tail.
    pub(crate) tail_scan_window: u32,
    /// Shortest time between two commits of the unit.
    pub(crate) commit_interval: Duration,
    /// Receives poll/send timings, replication latencies and errors.
    pub(crate) observer: crate::stats::Observer,
}

/// Immutable context of one running unit (one reader/writer pair under one epoch).
pub(crate) struct UnitShared<C> {
    pub(crate) unit: WorkUnit,
    /// Epoch of the grant the pair runs under.
    pub(crate) epoch: Epoch,
    pub(crate) flow: Arc<FlowParams>,
    pub(crate) source: Arc<Cluster>,
    pub(crate) target: Arc<Cluster>,
    pub(crate) control: C,
    pub(crate) meters: Arc<UnitMeters>,
    pub(crate) tuning: UnitTuning,
    /// Downstream stream name (the flow's naming applied to the upstream one).
    pub(crate) downstream_stream: String,
    /// Seed for this pair's jitter.
    pub(crate) seed: u64,
    /// Where the writer records what it sent, for the consumer-group sync.
    pub(crate) offset_maps: crate::datapath::offset_maps::OffsetMaps,
    /// The door to the flow's target every send goes through (throttle, lease and epoch).
    pub(crate) door: Arc<crate::datapath::target::TargetDoor<C>>,
}

impl<C> UnitShared<C> {
    /// Named identifier of the upstream stream.
    pub(crate) fn upstream_ids(&self) -> Result<(Identifier, Identifier)> {
        Ok((
            named(&self.unit.stream, &self.unit)?,
            named(&self.unit.topic, &self.unit)?,
        ))
    }

    /// Named identifiers of the downstream stream and topic.
    pub(crate) fn downstream_ids(&self) -> Result<(Identifier, Identifier)> {
        Ok((
            named(&self.downstream_stream, &self.unit)?,
            named(&self.unit.topic, &self.unit)?,
        ))
    }

    /// Connection slot of this unit on either cluster.
    pub(crate) fn slot(&self) -> usize {
        self.unit.partition as usize
    }
}

/// A named identifier; names longer than Iggy allows are a permanent error.
pub(crate) fn named(name: &str, unit: &WorkUnit) -> Result<Identifier> {
    Identifier::named(name).map_err(|_| Error::Message {
        unit: unit.clone(),
        offset: 0,
        reason: "its stream or topic name is not one Iggy accepts",
    })
}

/// Messages polled from one upstream partition, in offset order, handed from reader to writer.
/// The writer turns the messages into the downstream ones in place (see `writer::prepare`), so
/// what the batch covers upstream is kept apart from them.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The messages as polled (offset and timestamp set by the upstream server);
    /// once prepared, the ones to send downstream.
    pub(crate) messages: Vec<Message>,
    /// Offsets lost to upstream retention right before this batch.
    pub(crate) gap: Option<Gap>,
    /// Offset of the last message as polled: the batch covers upstream up to here.
    pub(crate) last_offset: Offset,
    /// Messages dropped so far because they originated in the target cluster.
    pub(crate) skipped: u64,
}

impl Batch {
    /// A batch of polled messages; `None` when there are none.
    pub(crate) fn new(messages: Vec<Message>, gap: Option<Gap>) -> Option<Self> {
        let last_offset = messages.last()?.offset;
        Some(Self {
            messages,
            gap,
            last_offset,
            skipped: 0,
        })
    }

    /// Appends `next`, the batch polled right after this one with no gap before it, so that
    /// both go in one send (`writer::join`).
    pub(crate) fn join(&mut self, mut next: Batch) {
        debug_assert!(next.gap.is_none(), "a batch after a gap is sent on its own");
        self.messages.append(&mut next.messages);
        self.last_offset = next.last_offset;
        self.skipped += next.skipped;
    }
}
