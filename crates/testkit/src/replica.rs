//! What each replica of a [`crate::TestCluster`] answers, as a pure function of the roster (who
//! runs, which view, who is primary) and the request: the behaviour `cluster` describes and
//! runs the replicas of. Each connection a replica's listener accepts carries its [`Seat`].

use iggy09_binary_protocol::consensus::Operation;
use iggy09_common::{ClusterNodeRole, ClusterNodeStatus, IggyError};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The cluster name every replica reports (the real server's `cluster.name` default).
const CLUSTER_NAME: &str = "iggy-cluster";

/// The GET_CLUSTER_METADATA code, the one read whose answer depends on the replica asked.
const GET_CLUSTER_METADATA: u32 = 12;

/// Which replicas run and which view they are in: the one fact every replica's answers derive
/// from. Pure, so that who is primary after which stop or start is unit-tested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Roster {
    /// The view number; its primary is replica `view % replicas`.
    view: u64,
    /// Per replica (by index), whether its listener runs.
    running: Vec<bool>,
}

impl Roster {
    /// `replicas` running replicas in view 0: replica 0 is the first primary, as in a real
    /// cluster.
    pub(crate) fn new(replicas: usize) -> Self {
        Self {
            view: 0,
            running: vec![true; replicas],
        }
    }

    /// The current view.
    pub(crate) fn view(&self) -> u64 {
        self.view
    }

    /// The primary's index, `None` when no replica runs.
    pub(crate) fn primary(&self) -> Option<usize> {
        let index = self.index_of(self.view)?;
        self.running[index].then_some(index)
    }

    /// Whether replica `index` runs.
    pub(crate) fn is_running(&self, index: usize) -> bool {
        self.running.get(index).copied().unwrap_or(false)
    }

    /// The replica the view names primary, running or not: the `Leader` of the roster answer
    /// (between a primary's death and the view change, a dead one).
    pub(crate) fn leader(&self) -> Option<usize> {
        self.index_of(self.view)
    }

    /// Replica `index` stops and nothing else happens yet: if it was the primary, the others
    /// are left in its view without a primary until [`Roster::elect`].
    pub(crate) fn halt(&mut self, index: usize) {
        if let Some(running) = self.running.get_mut(index) {
            *running = false;
        }
    }

    /// The view change a dead primary causes: the view moves on to the next view whose primary
    /// runs. Nothing changes while the primary runs or when no replica runs.
    pub(crate) fn elect(&mut self) {
        if self.primary().is_some() || !self.running.contains(&true) {
            return;
        }
        let mut view = self.view + 1;
        while self.index_of(view).is_some_and(|i| !self.running[i]) {
            view += 1;
        }
        self.view = view;
    }

    /// A view change that passes over the running primary (it was cut off from the others for
    /// a heartbeat timeout, or stepped down): the view moves to the next view whose primary
    /// runs, and the old primary serves on as a backup. Nothing changes with fewer than two
    /// replicas running.
    pub(crate) fn demote(&mut self) {
        let Some(primary) = self.primary() else {
            return;
        };
        if self.running.iter().filter(|r| **r).count() < 2 {
            return;
        }
        let mut view = self.view + 1;
        while self
            .index_of(view)
            .is_some_and(|i| i == primary || !self.running[i])
        {
            view += 1;
        }
        self.view = view;
    }

    /// Replica `index` runs again, as a backup of the current view (a restarted replica never
    /// takes back a primaryship the cluster moved on from).
    pub(crate) fn start(&mut self, index: usize) {
        if let Some(running) = self.running.get_mut(index) {
            *running = true;
        }
    }

    fn index_of(&self, view: u64) -> Option<usize> {
        let n = u64::try_from(self.running.len()).ok().filter(|n| *n > 0)?;
        usize::try_from(view % n).ok()
    }
}

/// What a replica does with one request of a session that is logged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicaAnswer {
    /// Handle it as a single server would.
    Serve,
    /// Answer the roster as this replica sees it (GET_CLUSTER_METADATA).
    Roster,
    /// Refuse it in the reply header's status, with an empty body.
    Status(u32),
    /// Refuse it with this code in the result section (status 0).
    Rejected(u32),
}

/// What a replica is in the current view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The primary of the view, running.
    Primary,
    /// A backup whose view's primary runs (it forwards logins there).
    Backup,
    /// A backup whose view's primary is gone, before the view change: a login it forwards
    /// finds no route (on the real cluster, for about one heartbeat timeout).
    Orphan,
}

/// The answer of a replica in `role` to a request naming `operation` (and, for reads,
/// `code`). `not_committed` is the pending "answer one metadata write `TransientNotCommitted`"
/// switch; a primary that answers so clears it.
pub(crate) fn answer(
    role: Role,
    operation: Operation,
    code: Option<u32>,
    not_committed: &mut bool,
) -> ReplicaAnswer {
    let not_accepted = IggyError::TransientNotAccepted.as_code();
    let primary = role == Role::Primary;
    match operation {
        Operation::NonReplicated if code == Some(GET_CLUSTER_METADATA) => ReplicaAnswer::Roster,
        // A backup authenticates a login and forwards it; with no primary to forward to, it is
        // refused as never admitted.
        Operation::Register if role == Role::Orphan => ReplicaAnswer::Rejected(not_accepted),
        // Reads are local; logins and logouts are forwarded by a backup to the primary.
        Operation::NonReplicated | Operation::Register | Operation::Logout => ReplicaAnswer::Serve,
        op if op.is_partition() && !primary => ReplicaAnswer::Status(not_accepted),
        op if op.is_metadata() && !primary => ReplicaAnswer::Rejected(not_accepted),
        op if op.is_metadata() && std::mem::take(not_committed) => {
            ReplicaAnswer::Rejected(IggyError::TransientNotCommitted.as_code())
        }
        _ => ReplicaAnswer::Serve,
    }
}

/// What every replica of one cluster shares besides the data: the roster, each replica's
/// address, and the pending faults that belong to the cluster rather than to one replica.
#[derive(Debug)]
pub(crate) struct ClusterState {
    /// Views and running replicas.
    roster: Mutex<Roster>,
    /// Each replica's client address, by index (kept across restarts).
    pub(crate) addrs: Vec<SocketAddr>,
    /// Set by [`TestCluster::answer_not_committed_once`], cleared by the write it refuses.
    pub(crate) not_committed: AtomicBool,
    /// Logins refused because the view's primary was gone ([`TestCluster::logins_refused`]).
    pub(crate) logins_refused: AtomicU64,
}

impl ClusterState {
    /// Replicas `addrs` (by index), all running, in view 0.
    pub(crate) fn new(addrs: Vec<SocketAddr>) -> Self {
        Self {
            roster: Mutex::new(Roster::new(addrs.len())),
            addrs,
            not_committed: AtomicBool::new(false),
            logins_refused: AtomicU64::new(0),
        }
    }

    /// The roster, locked.
    pub(crate) fn roster(&self) -> std::sync::MutexGuard<'_, Roster> {
        // A poisoned roster is still a consistent one: every change is a single assignment.
        self.roster.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One replica's place in its cluster, handed to each connection its listener accepts.
#[derive(Debug, Clone)]
pub(crate) struct Seat {
    /// This replica's index (its `replica_id`).
    index: usize,
    /// The cluster it belongs to.
    cluster: Arc<ClusterState>,
}

impl Seat {
    /// Replica `index` of `cluster`.
    pub(crate) fn new(index: usize, cluster: Arc<ClusterState>) -> Self {
        Self { index, cluster }
    }

    /// This replica's role in the current view.
    fn role(&self) -> Role {
        match self.cluster.roster().primary() {
            Some(primary) if primary == self.index => Role::Primary,
            Some(_) => Role::Backup,
            None => Role::Orphan,
        }
    }

    /// What this replica does with a request naming `operation` (and `code` for reads).
    pub(crate) fn answer(&self, operation: Operation, code: Option<u32>) -> ReplicaAnswer {
        let role = self.role();
        // Only a metadata write on the primary takes the switch, and `answer` then always
        // answers it 57: taken here, it is consumed.
        let mut not_committed = role == Role::Primary
            && operation.is_metadata()
            && self.cluster.not_committed.swap(false, Ordering::SeqCst);
        answer(role, operation, code, &mut not_committed)
    }

    /// The code a register whose credentials this replica accepted is refused with, if it is
    /// (the primary it would forward the register to is gone); counted.
    pub(crate) fn refuses_register(&self) -> Option<u32> {
        match self.answer(Operation::Register, None) {
            ReplicaAnswer::Rejected(code) => {
                self.cluster.logins_refused.fetch_add(1, Ordering::Relaxed);
                Some(code)
            }
            _ => None,
        }
    }

    /// The GET_CLUSTER_METADATA answer of this replica, in SDK 0.11's encoding.
    pub(crate) fn roster_answer(&self) -> Vec<u8> {
        use iggy09_binary_protocol::responses::system::get_cluster_metadata::{
            ClusterMetadataResponse, ClusterNodeResponse,
        };
        use iggy09_binary_protocol::WireEncode;
        let leader = self.cluster.roster().leader();
        let nodes = self
            .cluster
            .addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| ClusterNodeResponse {
                name: format!("iggy-node-{}", i + 1),
                ip: addr.ip().to_string(),
                tcp_port: addr.port(),
                quic_port: 0,
                http_port: 0,
                websocket_port: 0,
                role: if leader == Some(i) {
                    ClusterNodeRole::Leader as u8
                } else {
                    ClusterNodeRole::Follower as u8
                },
                status: ClusterNodeStatus::Healthy as u8,
            })
            .collect();
        ClusterMetadataResponse {
            name: CLUSTER_NAME.to_owned(),
            nodes,
        }
        .to_bytes()
        .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;

    /// A `kill`: the replica stops, then the view changes if it was the primary.
    fn stop(roster: &mut Roster, index: usize) {
        roster.halt(index);
        roster.elect();
    }

    #[test]
    fn replica_zero_is_the_first_primary() {
        let roster = Roster::new(3);
        check!(roster.primary() == Some(0));
        check!(roster.view() == 0);
    }

    #[test]
    fn stopping_the_primary_moves_the_view_to_the_next_running_replica() {
        let mut roster = Roster::new(3);
        stop(&mut roster, 0);
        check!(roster.view() == 1);
        check!(roster.primary() == Some(1));
        // With 0 back and 2 down, the failure of 1 skips view 2 (whose primary, 2, is down) for
        // view 3 (replica 0).
        roster.start(0);
        stop(&mut roster, 2);
        check!(roster.view() == 1);
        stop(&mut roster, 1);
        check!(roster.view() == 3);
        check!(roster.primary() == Some(0));
    }

    #[test]
    fn stopping_a_backup_changes_no_view() {
        let mut roster = Roster::new(3);
        stop(&mut roster, 1);
        check!(roster.view() == 0);
        check!(roster.primary() == Some(0));
        check!(!roster.is_running(1));
    }

    #[test]
    fn a_restarted_primary_comes_back_as_a_backup() {
        let mut roster = Roster::new(3);
        stop(&mut roster, 0);
        roster.start(0);
        check!(roster.primary() == Some(1));
        check!(roster.is_running(0));
    }

    #[test]
    fn with_every_replica_stopped_there_is_no_primary_and_the_view_stays() {
        let mut roster = Roster::new(2);
        stop(&mut roster, 1);
        stop(&mut roster, 0);
        check!(roster.primary() == None);
        check!(roster.view() == 0);
        roster.start(0);
        check!(roster.primary() == Some(0));
    }

    const NOT_ACCEPTED: u32 = 58;
    const NOT_COMMITTED: u32 = 57;

    #[test]
    fn the_transient_codes_are_the_sdks() {
        check!(IggyError::TransientNotAccepted.as_code() == NOT_ACCEPTED);
        check!(IggyError::TransientNotCommitted.as_code() == NOT_COMMITTED);
    }

    #[test]
    fn a_backup_serves_reads_and_logins_and_refuses_writes_as_not_accepted() {
        let mut pending = false;
        let mut backup = |op, code| answer(Role::Backup, op, code, &mut pending);
        check!(backup(Operation::NonReplicated, Some(10)) == ReplicaAnswer::Serve);
        check!(backup(Operation::Register, None) == ReplicaAnswer::Serve);
        check!(backup(Operation::Logout, None) == ReplicaAnswer::Serve);
        check!(backup(Operation::CreateStream, Some(202)) == ReplicaAnswer::Rejected(NOT_ACCEPTED));
        check!(backup(Operation::SendMessages, Some(101)) == ReplicaAnswer::Status(NOT_ACCEPTED));
        check!(
            backup(Operation::StoreConsumerOffset, Some(121))
                == ReplicaAnswer::Status(NOT_ACCEPTED)
        );
    }

    #[test]
    fn every_replica_answers_the_roster_itself() {
        let mut pending = false;
        for role in [Role::Primary, Role::Backup, Role::Orphan] {
            check!(
                answer(role, Operation::NonReplicated, Some(12), &mut pending)
                    == ReplicaAnswer::Roster
            );
        }
    }

    #[test]
    fn the_primary_serves_writes_and_answers_one_not_committed_when_asked() {
        let mut pending = false;
        check!(
            answer(
                Role::Primary,
                Operation::CreateStream,
                Some(202),
                &mut pending
            ) == ReplicaAnswer::Serve
        );
        check!(
            answer(
                Role::Primary,
                Operation::SendMessages,
                Some(101),
                &mut pending
            ) == ReplicaAnswer::Serve
        );
        pending = true;
        // A send is a partition operation: the switch is for the metadata plane's prepares.
        check!(
            answer(
                Role::Primary,
                Operation::SendMessages,
                Some(101),
                &mut pending
            ) == ReplicaAnswer::Serve
        );
        check!(pending);
        check!(
            answer(
                Role::Primary,
                Operation::CreateStream,
                Some(202),
                &mut pending
            ) == ReplicaAnswer::Rejected(NOT_COMMITTED)
        );
        check!(!pending);
        check!(
            answer(
                Role::Primary,
                Operation::CreateStream,
                Some(202),
                &mut pending
            ) == ReplicaAnswer::Serve
        );
    }

    #[test]
    fn without_a_primary_a_backup_refuses_logins_but_still_serves_reads() {
        let mut pending = false;
        let mut orphan = |op, code| answer(Role::Orphan, op, code, &mut pending);
        check!(orphan(Operation::Register, None) == ReplicaAnswer::Rejected(NOT_ACCEPTED));
        check!(orphan(Operation::NonReplicated, Some(10)) == ReplicaAnswer::Serve);
        check!(orphan(Operation::CreateStream, Some(202)) == ReplicaAnswer::Rejected(NOT_ACCEPTED));
        check!(orphan(Operation::SendMessages, Some(101)) == ReplicaAnswer::Status(NOT_ACCEPTED));
    }

    #[test]
    fn a_halted_primary_stays_leader_until_the_election() {
        let mut roster = Roster::new(3);
        roster.halt(0);
        check!(roster.primary() == None);
        check!(roster.leader() == Some(0));
        check!(roster.view() == 0);
        roster.elect();
        check!(roster.primary() == Some(1));
        check!(roster.leader() == Some(1));
        // An election with a running primary changes nothing.
        roster.elect();
        check!(roster.view() == 1);
    }

    #[test]
    fn a_demoted_primary_runs_on_as_a_backup() {
        let mut roster = Roster::new(3);
        roster.demote();
        check!(roster.primary() == Some(1));
        check!(roster.is_running(0));
        // With 2 down, the next demotion passes over it back to 0.
        roster.halt(2);
        roster.demote();
        check!(roster.view() == 3);
        check!(roster.primary() == Some(0));
        // Alone, a primary stays one.
        roster.halt(1);
        roster.demote();
        check!(roster.primary() == Some(0));
    }

    #[test]
    fn a_backup_leaves_the_not_committed_switch_for_the_primary() {
        let mut pending = true;
        check!(
            answer(
                Role::Backup,
                Operation::CreateStream,
                Some(202),
                &mut pending
            ) == ReplicaAnswer::Rejected(NOT_ACCEPTED)
        );
        check!(pending);
    }
}
