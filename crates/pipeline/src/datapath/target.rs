//! The one door to a flow's target: every write the data plane makes there on behalf of the
//! flow with this node's writer identity (copies, consumer-group offsets and membership,
//! heartbeats) goes through the flow's [`TargetDoor`]. It picks the connection (the node's
//! writer identity on a fenced target, `fencing::identity`), and lets a write go only after
//! the checks of its kind, the last one run once the connection's turn is the write's, right
//! before the request goes out (`Cluster::call_checked`):
//!
//! | write | before it waits for the connection | at its turn |
//! |---|---|---|
//! | a unit's copies ([`TargetDoor::send_copies`]) | the flow's throttle; the unit's lease and epoch | the unit's lease and epoch again |
//! | group offsets, membership ([`TargetDoor::node_call`]) | | this node's lease |
//! | a heartbeat ([`TargetDoor::node_call`]) | | this node's lease |
//!
//! A lease must be valid for longer than `send_lease_margin` (`writer::send::send_verdict`).
//! What is decided before a write can exist is not checked again here: a residency policy
//! keeps a unit of a blocked topic from ever getting a writer (the flow actor), a blocked
//! heartbeat topic from a heartbeat task (`Pipeline::start`), a blocked topic's groups from
//! the sync (`GroupSync::sync`). Where a copy landed is confirmed by its writer, which keeps
//! what that takes (`writer::landed`). The admin credential's writes (discovery's mirror of
//! streams and topics, the metadata sync, the fences) do not write as the node's identity
//! and are not the flow's copies: they go through the configured connection.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use replicator_model::{Assignment, Epoch, WorkUnit};
use replicator_sdk::types::{Identifier, Partitioning};
use replicator_sdk::Confirmed;
use replicator_sdk::IggyCluster as _;
use replicator_sdk::{HeadersTail, Message};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::throttle::FlowThrottle;
use super::writer::send::{epoch_is_current, send_verdict, SendVeto};
use crate::clients::Cluster;
use crate::control::ControlPlane;
use crate::error::{Error, Result};
use crate::fencing::handover::Handover;
use crate::fencing::identity::WriterTargets;
use crate::stats::UnitMeters;

/// The door to one flow's target on this node (see the module doc); shared by the flow's
/// writers, its heartbeat task and its consumer-group sync.
pub(crate) struct TargetDoor<C> {
    /// The target's alias (whose connections [`WriterTargets`] picks).
    target: String,
    writers: Arc<WriterTargets>,
    control: C,
    /// This node's assignments, read only to tell why a copy was vetoed (see `send_verdict`).
    assignments: watch::Receiver<Vec<Assignment>>,
    throttle: Option<Arc<FlowThrottle>>,
    send_lease_margin: Duration,
}

/// One batch of a unit's copies, as its writer hands it to the door.
pub(crate) struct Copies<'a> {
    pub(crate) unit: &'a WorkUnit,
    pub(crate) epoch: Epoch,
    /// Connection slot of the unit.
    pub(crate) slot: usize,
    pub(crate) stream: Identifier,
    pub(crate) topic: Identifier,
    pub(crate) messages: &'a mut [Message],
    /// What the send appends to each message's user headers (its provenance), if anything.
    pub(crate) tail: Option<&'a dyn HeadersTail>,
    /// Their size as sent (for the throttle).
    pub(crate) bytes: u64,
}

impl<C: ControlPlane> TargetDoor<C> {
    pub(crate) fn new(
        target: &str,
        writers: Arc<WriterTargets>,
        control: C,
        throttle: Option<Arc<FlowThrottle>>,
        send_lease_margin: Duration,
    ) -> Self {
        Self {
            target: target.to_owned(),
            writers,
            assignments: control.assignments(),
            control,
            throttle,
            send_lease_margin,
        }
    }

    /// The connections writes go through now: the configured ones, or this node's writer
    /// identity's on a fenced target (`None` while it has none). A writer keeps the one it
    /// started with: a swap closes it for good, which ends the writer (`Error::WriterRevoked`).
    pub(crate) fn connection(&self) -> Option<Arc<Cluster>> {
        self.writers.current(&self.target)
    }

    /// Whether a unit of the flow that this node owns may be taken up or handed back now.
    pub(crate) fn handover(&self) -> Handover {
        self.writers.handover(&self.target, Instant::now())
    }

    /// Whether a copy of `unit` under `epoch` may be sent now.
    pub(crate) fn unit_check(
        &self,
        unit: &WorkUnit,
        epoch: Epoch,
    ) -> std::result::Result<(), SendVeto> {
        send_verdict(
            Instant::now(),
            self.control.lease_valid_for(unit, epoch),
            self.send_lease_margin,
            || epoch_is_current(&self.assignments.borrow(), unit, epoch),
        )
    }

    /// Whether this node may write for the flow now (its lease valid past the margin).
    pub(crate) fn node_check(&self) -> std::result::Result<(), SendVeto> {
        send_verdict(
            Instant::now(),
            self.control.lease_valid_until(),
            self.send_lease_margin,
            || true,
        )
    }

    /// Sends `copies` through `conn` (the writer's connection): waits for the flow's throttle
    /// (a `stop` ends the wait: [`Error::Interrupted`], the batch unsent), checks the unit's
    /// lease and epoch, then again at the connection's turn. `Ok(Err(veto))`: not sent.
    /// Records the call's time in `meters`.
    pub(crate) async fn send_copies(
        &self,
        conn: &Cluster,
        copies: Copies<'_>,
        meters: &UnitMeters,
        stop: &CancellationToken,
    ) -> Result<std::result::Result<Vec<Confirmed>, SendVeto>> {
        let Copies {
            unit,
            epoch,
            slot,
            stream,
            topic,
            messages,
            tail,
            bytes,
        } = copies;
        if let Some(throttle) = &self.throttle {
            tokio::select! {
                () = throttle.admit(messages.len() as u64, bytes) => {}
                () = stop.cancelled() => {
                    return Err(Error::Interrupted {
                        unit: unit.clone(),
                        op: "throttle",
                    })
                }
            }
        }
        if let Err(veto) = self.unit_check(unit, epoch) {
            return Ok(Err(veto));
        }
        let partitioning = Partitioning::partition_id(unit.partition);
        let started = Instant::now();
        let sent = conn
            .call_checked(
                slot,
                "send_messages",
                bytes,
                || self.unit_check(unit, epoch),
                |c| async move {
                    c.send_messages_with_tail(&stream, &topic, &partitioning, messages, tail)
                        .await
                },
            )
            .await;
        meters.sent(started.elapsed());
        meters.set_target_far(conn.far());
        sent
    }

    /// Runs `f`, a write of this node for the flow (a heartbeat, a group's offset or
    /// membership), on `slot` of `conn` once the connection's turn is its own, if this node's
    /// lease is valid then; otherwise not at all ([`Error::LeaseExpiring`]).
    pub(crate) async fn node_call<T, F, Fut>(
        &self,
        conn: &Cluster,
        slot: usize,
        op: &str,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Arc<replicator_sdk::Client>) -> Fut,
        Fut: Future<Output = replicator_sdk::Result<T>>,
    {
        write_checked(conn, slot, op, || self.node_check(), f).await
    }
}

/// Runs the write `f` on `slot` of `conn` once the connection's turn is its own, if `check`
/// lets it through then; otherwise not at all ([`Error::LeaseExpiring`]). The one place a
/// node's write (not a copy) meets its check: [`TargetDoor::node_call`], and the group
/// sync's writes with [`TargetDoor::node_check`] (they keep to one slot of their own).
pub(crate) async fn write_checked<T, F, Fut>(
    conn: &Cluster,
    slot: usize,
    op: &str,
    check: impl FnOnce() -> std::result::Result<(), SendVeto>,
    f: F,
) -> Result<T>
where
    F: FnOnce(Arc<replicator_sdk::Client>) -> Fut,
    Fut: Future<Output = replicator_sdk::Result<T>>,
{
    match conn.call_checked(slot, op, 0, check, f).await? {
        Ok(value) => Ok(value),
        Err(_) => Err(Error::LeaseExpiring {
            cluster: conn.alias().to_owned(),
            op: op.to_owned(),
        }),
    }
}
