//! The resolved parameters `Control::start` takes.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use replicator_model::NodeId;

use crate::error::{Error, Result};

/// The shared cluster secret every Raft RPC is signed with (it never travels). Prints as `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(String);

impl ClusterSecret {
    /// Wraps a secret (resolved by the binary from config or the environment).
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for ClusterSecret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for ClusterSecret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl fmt::Display for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

/// Timing of the control plane. `Default` gives the documented production values.
///
/// The failover budget these values give is in ARCHITECTURE.md ("Never two owners"); the
/// measured times are in BENCHMARKS.md.
#[derive(Debug, Clone)]
pub struct ControlTiming {
    /// Leader heartbeat period. Default 100 ms.
    pub heartbeat_interval: Duration,
    /// Lower bound of the randomised election timeout. Default 300 ms.
    pub election_timeout_min: Duration,
    /// Upper bound of the randomised election timeout. Default 600 ms.
    pub election_timeout_max: Duration,
    /// How often every node renews its lease (one Raft entry per node). Default 300 ms.
    pub lease_renew_interval: Duration,
    /// How long a lease lasts after its renewal was sent (owner) or seen (leader). Default 1.5 s.
    pub lease_expiry: Duration,
    /// Subtracted from the owner's lease to absorb clock-rate differences between the owner
    /// (which counts its lease from when it sent the renewal) and the leader (which counts
    /// from when it saw the renewal applied). Default 200 ms. Not the writer's margin before a
    /// send (the pipeline's `send_lease_margin`), which is checked on top of it.
    pub lease_drift_margin: Duration,
    /// How long the commit batcher collects commits into one Raft entry. Default 50 ms: with
    /// `commit_max_in_flight` = 1 a node writes at most ~20 commit entries per second, however
    /// many partitions it copies.
    pub commit_batch_interval: Duration,
    /// Most commits in one batch entry. Default 4096.
    pub commit_batch_max: usize,
    /// Capacity of the commit request queue (callers wait when it is full). Default 1024.
    pub commit_queue: usize,
    /// Commit batches a node keeps in flight at once (openraft pipelines them). Default 1: the
    /// next batch collects while one is written, so a node writes at most one commit entry per
    /// `commit_batch_interval` + write time, however many units commit.
    pub commit_max_in_flight: usize,
    /// Period of the leader's assignment round. Default 100 ms.
    pub assignment_interval: Duration,
    /// How long a write keeps retrying across leader changes. Default 5 s.
    pub write_timeout: Duration,
    /// Timeout of one Raft RPC when openraft gives none. Default 1 s.
    pub rpc_timeout: Duration,
    /// Build a snapshot after this many log entries. Default 2000.
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log behind a snapshot (for followers slightly behind). Default 500.
    pub logs_to_keep_after_snapshot: u64,
    /// How long `remove_member` waits for the member's units to be released. Default 30 s.
    pub drain_timeout: Duration,
    /// With fencing on every target: how long the leader waits for a member's renewal before
    /// it fences the member and moves its units (instead of waiting out `lease_expiry`).
    /// Default 600 ms: two renewal periods ([`Self::FENCE_AFTER_RENEWALS`]), so one late
    /// renewal does not fence a live member; the binary keeps it at that many periods of the
    /// configured `lease_renew_interval`.
    pub fence_after: Duration,
    /// How long a unit stays in the state once it is retired and owned by nobody (a partition
    /// of a deleted topic or of a flow no member runs) before the leader forgets it, with
    /// its confirmed offset (at feature level 2). Default 10 min: a topic excluded and
    /// included again within that keeps its offset.
    pub forget_retired_after: Duration,
}

impl Default for ControlTiming {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(300),
            election_timeout_max: Duration::from_millis(600),
            lease_renew_interval: Duration::from_millis(300),
            lease_expiry: Duration::from_millis(1500),
            lease_drift_margin: Duration::from_millis(200),
            commit_batch_interval: Duration::from_millis(50),
            commit_batch_max: 4096,
            commit_queue: 1024,
            commit_max_in_flight: 1,
            assignment_interval: Duration::from_millis(100),
            write_timeout: Duration::from_secs(5),
            rpc_timeout: Duration::from_secs(1),
            snapshot_logs_since_last: 2000,
            logs_to_keep_after_snapshot: 500,
            drain_timeout: Duration::from_secs(30),
            fence_after: Duration::from_millis(600),
            forget_retired_after: Duration::from_secs(600),
        }
    }
}

impl ControlTiming {
    /// `fence_after` in renewal periods: one late renewal never fences a live member.
    pub const FENCE_AFTER_RENEWALS: u32 = 2;

    /// The defaults, stretched for members `round_trip` apart (`cluster.member_round_trip`: a
    /// cluster with a node per region). Each value is the default or the one the distance
    /// needs, whichever is longer:
    ///
    /// - a follower's renewal is forwarded to the leader, replicated, committed and applied
    ///   back on the follower: about four round trips; renewals every three round trips keep
    ///   one in flight at a time, and `fence_after` (two periods) then outlasts one renewal;
    /// - the lease must outlast a renewal period plus that latency plus the drift margin and
    ///   the writers' send margin (together under a second), or the owners' writers stop
    ///   while they wait for their renewals (seen at 80 ms round trips with the defaults);
    ///   (and at least three renewal periods, as the config requires);
    /// - an election needs a round trip to each voter: four round trips before a follower
    ///   calls one, and heartbeats no more often than one round trip.
    #[must_use]
    pub fn for_member_round_trip(round_trip: Duration) -> Self {
        let default = Self::default();
        let renew = default.lease_renew_interval.max(round_trip * 3);
        let election = default.election_timeout_min.max(round_trip * 4);
        Self {
            heartbeat_interval: default.heartbeat_interval.max(round_trip),
            election_timeout_min: election,
            election_timeout_max: election * 2,
            lease_renew_interval: renew,
            lease_expiry: default
                .lease_expiry
                .max(renew + round_trip * 4 + Duration::from_secs(1))
                .max(renew * 3),
            fence_after: renew * Self::FENCE_AFTER_RENEWALS,
            ..default
        }
    }

    /// How long a new leader spares members it has not seen renew (see `LeaderView::liveness`):
    /// two renewal periods, time for every live member to renew once through the new leader.
    #[must_use]
    pub fn election_grace(&self) -> Duration {
        self.lease_renew_interval * 2
    }

    /// The whole time a write may take while the node drains for shutdown: two election
    /// timeouts. A cluster with a quorum commits in milliseconds or elects a leader within
    /// one; without a quorum the drain should end rather than wait out `write_timeout` for
    /// every release.
    #[must_use]
    pub fn drain_write_timeout(&self) -> Duration {
        self.election_timeout_max * 2
    }
}

/// Everything `Control::start` needs, resolved by the binary from the validated config.
#[derive(Debug)]
pub struct ControlParams {
    /// This node's id (`[node] id`), e.g. `1`.
    pub node_id: NodeId,
    /// Data dir of this node (`[node] data_dir`), e.g. `/var/lib/iggy-replicator`.
    pub data_dir: PathBuf,
    /// Advertised Raft address other nodes dial, e.g. `10.0.0.1:7100`.
    pub raft_addr: SocketAddr,
    /// A listener already bound for Raft RPC (tests bind port 0); `None` binds `raft_addr`.
    pub raft_listener: Option<std::net::TcpListener>,
    /// Advertised admin API address, e.g. `10.0.0.1:7200`.
    pub api_addr: String,
    /// The cluster secret (`[cluster] secret`).
    pub secret: ClusterSecret,
    /// Initial members by id → Raft address (`[cluster] initial_members`), including this node.
    pub initial_members: BTreeMap<NodeId, String>,
    /// Timing values.
    pub timing: ControlTiming,
    /// Mutual TLS between members (`[cluster.tls]`); `None` serves and dials plain HTTP.
    pub tls: Option<crate::TlsFiles>,
    /// Fencing of failed members at the target clusters (`clusters.<alias>.fencing`); `None`:
    /// leases only.
    pub fencing: Option<crate::Fencing>,
}

/// The openraft configuration for `timing`, validated.
pub(crate) fn raft_config(timing: &ControlTiming) -> Result<openraft::Config> {
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    openraft::Config {
        cluster_name: "iggy-replicator".into(),
        heartbeat_interval: millis(timing.heartbeat_interval),
        election_timeout_min: millis(timing.election_timeout_min),
        election_timeout_max: millis(timing.election_timeout_max),
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(timing.snapshot_logs_since_last),
        max_in_snapshot_log_to_keep: timing.logs_to_keep_after_snapshot,
        install_snapshot_timeout: millis(timing.rpc_timeout),
        snapshot_max_chunk_size: crate::network::SNAPSHOT_CHUNK_BYTES,
        ..Default::default()
    }
    .validate()
    .map_err(|e| Error::InvalidParams(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints() {
        let s = ClusterSecret::new("hunter2");
        assert2::check!(format!("{s:?} {s}") == "**** ****");
    }

    #[test]
    fn default_timing_passes_raft_validation() {
        assert!(raft_config(&ControlTiming::default()).is_ok());
    }

    #[test]
    fn timing_for_distant_members_keeps_the_defaults_nearby_and_stretches_far() {
        use assert2::check;
        let ms = Duration::from_millis;
        // On one site nothing changes.
        let near = ControlTiming::for_member_round_trip(ms(1));
        let default = ControlTiming::default();
        check!(near.lease_expiry == default.lease_expiry);
        check!(near.lease_renew_interval == default.lease_renew_interval);
        check!(near.election_timeout_min == default.election_timeout_min);
        check!(near.fence_after == default.fence_after);
        // 150 ms apart: renewals every 450 ms, fenced after 900 ms, a lease of 2.05 s, elections
        // after 600-1200 ms, heartbeats every 150 ms.
        let far = ControlTiming::for_member_round_trip(ms(150));
        check!(far.lease_renew_interval == ms(450));
        check!(far.fence_after == ms(900));
        check!(far.lease_expiry == ms(2050));
        check!(far.election_timeout_min == ms(600));
        check!(far.election_timeout_max == ms(1200));
        check!(far.heartbeat_interval == ms(150));
        // The rules the config checks hold whatever the distance, and openraft takes them.
        for rtt in [0, 20, 80, 150, 250, 1000] {
            let t = ControlTiming::for_member_round_trip(ms(rtt));
            check!(t.lease_renew_interval * 3 <= t.lease_expiry, "{rtt}");
            check!(t.heartbeat_interval * 2 <= t.election_timeout_min, "{rtt}");
            check!(t.fence_after < t.lease_expiry, "{rtt}");
            check!(raft_config(&t).is_ok(), "{rtt}");
        }
    }
}
