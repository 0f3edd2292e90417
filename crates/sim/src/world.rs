//! The simulated cluster: three replicator members, a committed log standing in for openraft,
//! two Iggy targets (fenced, or written with the configured credential until a rolling config
//! change turns fencing on), an upstream with a producer, a network between them, and the fault
//! schedule. Everything is driven by one seeded random stream and one event queue, so a seed
//! replays exactly.
//!
//! What runs for real (through `sim_support` of the control and pipeline crates): the
//! replicated state machine (`ControlState::apply`) on every member, the leader's assignment
//! round (lease judgement, grants, revokes, fence decisions: `assign::round`), the fence
//! operations' outcomes, the owner's lease arithmetic, the identity a process may write as
//! (`Inheritance`) and what its identity follower does with a refused login (`Refusal::of`),
//! and every writer's state and decisions: the node's own writer core (`WriterCore`, which
//! the node's writer task drives too: what a resume sets up, when a send may have landed and
//! the tail must be read again, what a re-read tail means, send answers, commits, the
//! consumer-group offset map), with the real tail scan, resume plan and send check. What stays
//! here of a writer is how it waits and does IO, in the order the node's writer task does it
//! (`datapath/writer/mod.rs`): resume (log in, scan, plan), copy (commit when due, re-read the
//! tail when the core asks, send what the lease and epoch allow), drain (final commit, hand
//! the unit back). What is simulated stands in for IO: Raft replication (a log committed while
//! a leader reaches a majority, applied by every member it reaches), Iggy (see `target`), tokio
//! tasks and sockets.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use replicator_control::sim_support::{
    acknowledged, lease_until, Answer, Command, Inheritance, Leader, Observer, State, TargetOp,
};
use replicator_control::{ControlTiming, FenceTopology};
use replicator_model::{Assignment, CommitOutcome, Epoch, NodeId, ProgressCommit, WorkUnit};
use replicator_pipeline::sim_support::{
    may_send, refusal_gives_up, resume, Page, Seen, Tail, TailScan, WriterCore, WriterDefaults,
    MIN_ABANDON_INTERVAL,
};

use crate::schedule::{FaultKind, Ms, Schedule, FAULTS_UNTIL, MEMBERS, TARGETS};
use crate::target::{Credential, Refusal, Target, Violation as TargetViolation};

/// How often members run their tasks.
const TICK: Ms = 10;
/// The producer stops here; every fault has ended.
const HEAL: Ms = FAULTS_UNTIL;
/// Once healed, the cluster must have copied everything, committed it and owned every unit
/// within this long: generous against the timings (a fence takes a few hundred ms, a lease
/// 1.5 s), so that only a cluster that is stuck fails it.
pub const SETTLE_WITHIN: Ms = 30_000;
/// Upstream creation time of every topic (µs).
const CREATED_AT: u64 = 1_700_000_000_000_000;
/// Messages per send.
const BATCH: u64 = 50;
/// A writer's pause while it waits for an identity or a release, and before the next pair
/// starts after one ended (the coordinator's restart backoff starts there). A failure's pause
/// is the writer core's backoff.
const RETRY: Ms = 100;
/// How long a member waits for an answer that was lost before it calls the write failed.
const ANSWER_TIMEOUT: Ms = 500;
/// How long a writer waits for a send's answer that was lost (a broken connection).
const SEND_TIMEOUT: Ms = 1_000;
/// While a quorum and a unit's target are up (and the leader reaches the target), a unit
/// without a live owner is owned again within this long: generous against the timings (a
/// fence takes `fence_after` and a few round trips, an election under a second).
pub const OWNED_WITHIN: Ms = 10_000;

/// A pause of the node's (`Duration`) in simulated milliseconds.
fn ms(pause: Duration) -> Ms {
    Ms::try_from(pause.as_millis()).unwrap_or(Ms::MAX)
}

/// A broken invariant, when, and what the run looked like just before.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Simulated ms.
    pub at: Ms,
    /// Which invariant, and how.
    pub what: String,
}

/// What one run did.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Log entries committed.
    pub entries: u64,
    /// Messages produced upstream.
    pub produced: u64,
    /// Leader elections.
    pub elections: u64,
    /// Revokes acknowledged by a target (a member fenced there).
    pub fences: u64,
    /// Sends a target refused because the writer's rights were gone.
    pub refused_sends: u64,
    /// Sends whose outcome the writer did not learn (answer lost or connection cut).
    pub unknown_outcomes: u64,
    /// Writers that found their target lost what it had acknowledged.
    pub downstream_losses: u64,
    /// Sends a 0.9 target confirmed elsewhere than after the writer's previous one.
    pub landed_mismatches: u64,
    /// Writers that gave up after failing for longer than the retry budget (their pair
    /// restarted).
    pub writers_given_up: u64,
    /// Group offsets translated and checked.
    pub translations: u64,
    /// Simulated ms until everything was copied after the heal.
    pub settled_after: Ms,
    /// Processes started with an empty data dir (they replayed the whole log).
    pub wiped_restarts: u64,
    /// Processes restarted onto a new config by a rolling change.
    pub rolling_restarts: u64,
    /// Sends with the cluster's configured credential (targets without fencing).
    pub configured_sends: u64,
    /// Of those, sends the lease check right before the request is written held back.
    pub held_at_departure: u64,
    /// Logins of a writer identity a target refused.
    pub logins_refused: u64,
    /// Refused logins of an identity replaced since, which gave nothing up.
    pub late_refusals: u64,
    /// Identities given up after a target refused their login.
    pub identities_given_up: u64,
}

impl Stats {
    /// Adds `other`'s counts to these (the slowest settle is the larger of the two): the
    /// totals of a run of many seeds.
    pub fn add(&mut self, other: &Stats) {
        self.entries += other.entries;
        self.produced += other.produced;
        self.elections += other.elections;
        self.fences += other.fences;
        self.refused_sends += other.refused_sends;
        self.unknown_outcomes += other.unknown_outcomes;
        self.downstream_losses += other.downstream_losses;
        self.landed_mismatches += other.landed_mismatches;
        self.writers_given_up += other.writers_given_up;
        self.translations += other.translations;
        self.settled_after = self.settled_after.max(other.settled_after);
        self.wiped_restarts += other.wiped_restarts;
        self.rolling_restarts += other.rolling_restarts;
        self.configured_sends += other.configured_sends;
        self.held_at_departure += other.held_at_departure;
        self.logins_refused += other.logins_refused;
        self.late_refusals += other.late_refusals;
        self.identities_given_up += other.identities_given_up;
    }
}

#[derive(Debug, Clone)]
enum Purpose {
    Register,
    Features,
    Report,
    Renew {
        sent: Instant,
    },
    Round,
    FenceAck,
    Commit {
        unit: WorkUnit,
        epoch: Epoch,
        session: u64,
    },
    Release,
    Abandon,
    /// The config digests of the process's config.
    Config,
    /// An identity given up after a target refused its login.
    GiveUp,
    /// The second copy of a write committed twice: nobody waits for its answer.
    Duplicate,
}

/// What a target answered a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginOutcome {
    Accepted,
    /// The credentials were refused (the user is missing, or revoked).
    Refused,
    /// No answer: the target was down, restarted under the connection, or the answer was lost.
    Failed,
}

#[derive(Debug)]
enum Event {
    /// A write reaches the leader and commits.
    Commit {
        from: NodeId,
        run: u64,
        cmd: Command,
        purpose: Purpose,
        /// A leader's own entry (a round) commits only while it still leads this term.
        term: Option<u64>,
    },
    /// The control plane's answer to a member's write (`None`: failed or lost).
    ControlAnswer {
        to: NodeId,
        run: u64,
        purpose: Purpose,
        answer: Option<(u64, Answer)>,
    },
    /// A checked send leaves the member's socket (deferred while the member is frozen).
    Depart(Send),
    /// A send reaches the target.
    Arrive(Send),
    /// The target's answer to a send (`false`: refused, failed or lost).
    SendAnswer {
        to: NodeId,
        run: u64,
        unit: WorkUnit,
        session: u64,
        /// Accepted, and where it landed if the target says (Iggy 0.9).
        landed: Option<Option<u64>>,
        /// When the writer's call started (its check before the send).
        started: Ms,
        /// No answer came: the call timed out, which drops its connection.
        timed_out: bool,
    },
    /// A member's new connection to a fenced target logs in as one of its identities.
    LoginArrive {
        from: NodeId,
        run: u64,
        target: usize,
        incarnation: u64,
        /// The target's restart count when the connection was made.
        restarts: u64,
    },
    /// The target's answer to a login.
    LoginAnswer {
        to: NodeId,
        run: u64,
        target: usize,
        incarnation: u64,
        restarts: u64,
        outcome: LoginOutcome,
    },
    /// A leader's fence operation reaches the targets.
    FenceArrive {
        leader: NodeId,
        run: u64,
        term: u64,
        op: TargetOp,
    },
    /// Its outcome comes back to the leader.
    FenceAnswer {
        leader: NodeId,
        run: u64,
        term: u64,
        op: TargetOp,
        ok: bool,
    },
}

#[derive(Debug, Clone)]
struct Send {
    from: NodeId,
    run: u64,
    target: usize,
    unit: WorkUnit,
    epoch: Epoch,
    session: u64,
    who: Credential,
    upstream: Vec<u64>,
    /// The target's restart count when the writer's connection was made.
    connection: u64,
    /// When the writer checked its lease and epoch for it (its call started).
    started: Ms,
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Resuming,
    Copying,
    Draining { release_sent: bool },
}

#[derive(Debug)]
struct Writer {
    unit: WorkUnit,
    epoch: Epoch,
    session: u64,
    /// What it logged in as when it resumed (a writer identity, or the configured credential).
    credential: Option<Credential>,
    phase: Phase,
    /// What the node's writer knows and decides between IO calls: the same core.
    core: WriterCore,
    read_at: u64,
    /// The batch sent and not answered yet (upstream offsets).
    in_flight: Option<Vec<u64>>,
    commit_in_flight: bool,
    retry_at: Ms,
    /// The target's restart count when this writer last read it (its connection).
    connection: u64,
}

impl Writer {
    /// A failure at `now` (`now_i`): the writer pauses for its core's backoff; `false` when it
    /// gives up instead (the streak outlasted the retry budget).
    fn failed(&mut self, now: Ms, now_i: Instant) -> bool {
        match self.core.failed(now_i) {
            Some(delay) => {
                self.retry_at = now + ms(delay);
                true
            }
            None => false,
        }
    }

    /// A writer of a new grant, or the next writer of a grant whose pair ended.
    fn new(unit: WorkUnit, epoch: Epoch, session: u64, core: WriterCore, retry_at: Ms) -> Self {
        Self {
            unit,
            epoch,
            session,
            credential: None,
            phase: Phase::Resuming,
            core,
            read_at: 0,
            in_flight: None,
            commit_in_flight: false,
            retry_at,
            connection: 0,
        }
    }
}

/// A member's config as far as the simulation goes: the targets it writes to with fencing on
/// (as its writer identities) and the others (with the configured credential). It is a file:
/// it outlives the process, and a restart onto a new config (`RollingConfig`) changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    fenced: [bool; TARGETS],
}

/// A member's connection to a fenced target as one of its identities, which its writers there
/// share; a new one logs in first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Connection {
    incarnation: u64,
    /// The target's restart count when it was made (a restart drops it).
    restarts: u64,
    login: Login,
}

/// Where a connection's login is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Login {
    /// Its answer is awaited.
    Pending,
    Open,
    /// Refused or failed: the writers' next call connects again from then on.
    Failed {
        retry_at: Ms,
    },
}

#[derive(Debug)]
struct Member {
    id: NodeId,
    /// The process: a restart is a new run, and answers to an old run are dropped.
    run: u64,
    up: bool,
    frozen_until: Option<Ms>,
    /// When the latest freeze began: a call in flight then may have timed out meanwhile.
    frozen_at: Option<Ms>,
    /// After a freeze the member applies the log again only from here on: the leader's next
    /// heartbeat reaches it, while its writers run at once on what it had applied.
    catch_up_at: Ms,
    /// The config file.
    config: Config,
    /// Persisted: what Raft applied (the state machine is deterministic over the log).
    state: State,
    applied: u64,
    // In memory, lost with the process:
    /// Which identity this process may write as (never its predecessor's).
    inheritance: Inheritance,
    /// Until when this process neither takes up nor hands back a unit (the pipeline's
    /// `fencing::handover`) nor gives up its inherited identity (the control plane's
    /// `Shared::inherited_to_abandon`): its predecessor's last sends with the configured
    /// credential can land until then.
    earlier_sends_landed_by: Ms,
    abandon_in_flight: bool,
    /// When the identity follower last gave an identity up after a refused login.
    last_given_up: Option<Ms>,
    /// Per fenced target: the connection its writers share.
    connections: BTreeMap<usize, Connection>,
    config_published: bool,
    /// A `PublishConfig` of this process is on its way.
    config_in_flight: bool,
    observer: Observer,
    leading: Option<(u64, Leader)>,
    lease: Option<Instant>,
    pending_lease: Vec<(u64, Instant)>,
    renew_in_flight: bool,
    next_renew: Ms,
    next_round: Ms,
    next_report: Ms,
    features_published: bool,
    register_in_flight: bool,
    writers: BTreeMap<WorkUnit, Writer>,
    ops_in_flight: BTreeSet<TargetOp>,
}

impl Member {
    fn new(id: NodeId, config: Config) -> Self {
        Self {
            id,
            run: 0,
            up: true,
            frozen_until: None,
            frozen_at: None,
            catch_up_at: 0,
            config,
            state: State::default(),
            applied: 0,
            inheritance: Inheritance::new(0),
            earlier_sends_landed_by: 0,
            abandon_in_flight: false,
            last_given_up: None,
            connections: BTreeMap::new(),
            config_published: false,
            config_in_flight: false,
            observer: Observer::default(),
            leading: None,
            lease: None,
            pending_lease: Vec::new(),
            renew_in_flight: false,
            next_renew: 0,
            next_round: 0,
            next_report: 0,
            features_published: false,
            register_in_flight: false,
            writers: BTreeMap::new(),
            ops_in_flight: BTreeSet::new(),
        }
    }

    /// A new process over the persisted state, or over none (`wiped`: an empty data dir).
    /// `local_log_bounds`: it decides what it inherited as of its local log at start, as the
    /// node did before issue 51 (item 4), for the regression test that shows the simulator
    /// finds what that does after a wipe.
    /// `landed_by`: when its predecessor's last sends can have landed.
    fn restart(&mut self, now: Ms, wiped: bool, local_log_bounds: bool, landed_by: Ms) {
        let (state, applied) = if wiped {
            (State::default(), 0)
        } else {
            (std::mem::take(&mut self.state), self.applied)
        };
        let mut inheritance = Inheritance::new(applied);
        // The identity its persisted state holds, as the node's state machine observes it
        // when it loads its snapshot.
        inheritance.observe(applied, &state, self.id);
        if local_log_bounds {
            inheritance.wrote(applied);
        }
        *self = Self {
            run: self.run + 1,
            state,
            applied,
            inheritance,
            earlier_sends_landed_by: landed_by,
            next_renew: now,
            ..Self::new(self.id, self.config)
        };
    }

    fn active(&self, now: Ms) -> bool {
        self.up && self.frozen_until.is_none_or(|t| now >= t)
    }

    /// The incarnation this process may write as. `inherit`: as the node does (never an
    /// identity an earlier process may have written with); otherwise as it did before the
    /// simulator found seeds 10 and 238 (any unfenced identity), for the regression tests.
    fn usable_identity(&self, inherit: bool) -> Option<u64> {
        if inherit {
            self.inheritance.usable(&self.state, self.id)
        } else {
            self.state
                .identity(self.id)
                .filter(|(_, fenced)| !fenced)
                .map(|(incarnation, _)| incarnation)
        }
    }
}

/// The simulated world of one seed.
pub struct World {
    rng: StdRng,
    now: Ms,
    base: Instant,
    timing: ControlTiming,
    writer: WriterDefaults,
    schedule: Schedule,
    units: Vec<(WorkUnit, usize)>,
    flows: Vec<(String, Vec<WorkUnit>)>,
    log: Vec<Command>,
    /// The state every entry is applied to at commit (the answers come from it).
    canonical: State,
    confirmed: BTreeMap<WorkUnit, Option<u64>>,
    term: u64,
    leader: Option<NodeId>,
    previous_leader: Option<NodeId>,
    election_at: Option<Ms>,
    members: BTreeMap<NodeId, Member>,
    targets: Vec<Target>,
    restarts: Vec<u64>,
    upstream: BTreeMap<WorkUnit, u64>,
    events: BTreeMap<(Ms, u64), Event>,
    seq: u64,
    started: BTreeSet<usize>,
    /// Crashed members and when they start again.
    down_until: BTreeMap<NodeId, Ms>,
    /// When each member that is down went down (what its refused connections show).
    down_since: BTreeMap<NodeId, Ms>,
    /// Crashed members whose data dir is lost: they start again with an empty one.
    wiped: BTreeSet<NodeId>,
    /// The restarts of rolling config changes done: (fault index, turn).
    rolled: BTreeSet<(usize, u64)>,
    /// Units without a live owner while they could have one, since when.
    orphaned: BTreeMap<WorkUnit, Ms>,
    trace: VecDeque<String>,
    /// Whether members give up an inherited identity (the node's behaviour; off only to show
    /// what the simulator found without it).
    inherit: bool,
    /// Whether a process decides what it inherited as of its local log at start (off: as of
    /// its first committed write, the node's behaviour; on only to show what the simulator
    /// finds without it).
    local_log_bounds: bool,
    /// Whether a refused login gives the current identity up whichever identity was refused
    /// (off: only a refusal of the current one does, the node's behaviour; on only to show
    /// what the simulator finds without it).
    any_refusal_gives_up: bool,
    /// Whether a restarted process takes up and hands back units at once (off: it waits as
    /// the pipeline does, `fencing::handover`; on only to show what the simulator finds
    /// without it).
    handover_at_once: bool,
    /// The leader fences only on missed renewals and commits each acknowledgement on its own
    /// (see `fencing_on_renewals_alone`).
    renewals_alone: bool,
    /// Whether members and leaders decide on the applied config digests whichever process
    /// published them (off: as the node does; on only to show what the simulator finds
    /// without it).
    previous_config_decides: bool,
    /// Statistics of the run.
    pub stats: Stats,
}

impl World {
    /// A world for `seed` with `schedule`.
    pub fn new(seed: u64, schedule: Schedule) -> Self {
        let flows = [
            ("f1".to_owned(), "t1".to_owned(), 3u32),
            ("f2".to_owned(), "t2".to_owned(), 2u32),
        ];
        let mut units = Vec::new();
        let mut flow_units = Vec::new();
        for (i, (flow, _, partitions)) in flows.iter().enumerate() {
            let list: Vec<WorkUnit> = (0..*partitions)
                .map(|p| WorkUnit::new(flow.as_str(), "orders", "created", p))
                .collect();
            units.extend(list.iter().map(|u| (u.clone(), i)));
            flow_units.push((flow.clone(), list));
        }
        let unfenced = schedule.unfenced_at_start();
        let config = Config {
            fenced: std::array::from_fn(|ti| !unfenced.contains(&ti)),
        };
        let targets = flows
            .iter()
            .enumerate()
            .map(|(i, (_, t, _))| {
                // The second target speaks 0.9: it confirms where each send landed.
                Target::new(
                    t,
                    i == 1,
                    units
                        .iter()
                        .filter(|(_, ti)| *ti == i)
                        .map(|(u, _)| u.clone()),
                )
            })
            .collect();
        Self {
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            base: Instant::now(),
            timing: ControlTiming::default(),
            writer: WriterDefaults::default(),
            schedule,
            upstream: units.iter().map(|(u, _)| (u.clone(), 0)).collect(),
            confirmed: units.iter().map(|(u, _)| (u.clone(), None)).collect(),
            units,
            flows: flow_units,
            log: Vec::new(),
            canonical: State::default(),
            term: 0,
            leader: None,
            previous_leader: None,
            election_at: None,
            members: (1..=MEMBERS)
                .map(|id| (id, Member::new(id, config)))
                .collect(),
            targets,
            restarts: vec![0; TARGETS],
            events: BTreeMap::new(),
            seq: 0,
            started: BTreeSet::new(),
            down_until: BTreeMap::new(),
            down_since: BTreeMap::new(),
            wiped: BTreeSet::new(),
            rolled: BTreeSet::new(),
            orphaned: BTreeMap::new(),
            trace: VecDeque::new(),
            inherit: true,
            local_log_bounds: false,
            any_refusal_gives_up: false,
            handover_at_once: false,
            renewals_alone: false,
            previous_config_decides: false,
            stats: Stats::default(),
        }
    }

    /// Members keep writing as the identity an earlier process had (the behaviour before the
    /// fix of seeds 10 and 238), for the regression tests that show the simulator finds it.
    pub fn writing_as_predecessor(mut self) -> Self {
        self.inherit = false;
        self
    }

    /// Members decide what they inherited as of their local log at start (the behaviour before
    /// issue 51, item 4): a process started with an empty data dir inherits nothing and takes
    /// its predecessor's identity, replayed from index 1, as its own. For the regression test
    /// that shows the simulator finds it.
    pub fn inheriting_as_of_the_local_log(mut self) -> Self {
        self.local_log_bounds = true;
        self
    }

    /// Every refused login gives the identity current then up, whichever identity the login
    /// was of (the identity follower before issue 51, item 1): the late refusal of a replaced
    /// identity gives its successor up. For the regression test that shows the simulator
    /// finds it.
    pub fn giving_up_the_current_identity_on_any_refusal(mut self) -> Self {
        self.any_refusal_gives_up = true;
        self
    }

    /// The leader as it was before 2026-12-07: it fences a member only once it missed its
    /// renewals for `fence_after` (no crashed process is shown gone) and commits each target's
    /// acknowledgement of a revoke on its own, not with the next round. The regression tests
    /// that replay a seed found then use it, so that the interleaving they were shrunk to
    /// stays the same.
    pub fn fencing_on_renewals_alone(mut self) -> Self {
        self.renewals_alone = true;
        self
    }

    /// A restarted process takes up and hands back its units at once (the pipeline before
    /// `fencing::handover`): its predecessor's last sends can land behind the next copy. For
    /// the regression test that shows the simulator finds it.
    pub fn handing_over_at_once(mut self) -> Self {
        self.handover_at_once = true;
        self
    }

    /// Writers give up after failing for longer than `budget` (`retry_budget`; the default
    /// is longer than any fault of a schedule, so that a writer never gives up): their pair
    /// ends and the next one starts, as the node's coordinator does.
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.writer.retry_budget = budget;
        self
    }

    /// Members and leaders decide on the config digests applied for them, whichever process
    /// published them (before `ControlState::assignments_running` and the leader's wait for
    /// its own digests): a process restarted onto another config works on units granted by
    /// its previous one, and a leader compares the others with its previous config. For the
    /// regression test that shows the simulator finds it.
    pub fn deciding_on_a_previous_config(mut self) -> Self {
        self.previous_config_decides = true;
        self
    }

    /// The units `id` works on: its assignments of the flows whose applied config digest is
    /// the one its process runs (the node's `Shared` publishes only these).
    fn running_assignments(&self, id: NodeId) -> Vec<Assignment> {
        let m = &self.members[&id];
        if self.previous_config_decides {
            m.state.assignments_of(id)
        } else {
            m.state.assignments_running(id, &self.digests(m.config))
        }
    }

    /// The flows' config digests of `config` (what `PublishConfig` carries): a flow's target
    /// and whether fencing is on there.
    fn digests(&self, config: Config) -> BTreeMap<String, String> {
        self.flows
            .iter()
            .enumerate()
            .map(|(ti, (flow, _))| {
                let fencing = if config.fenced[ti] { "users" } else { "off" };
                (flow.clone(), format!("{}:{fencing}", self.targets[ti].name))
            })
            .collect()
    }

    /// Member `id`'s fence topology (from its config), `None` when it fences no target (a node
    /// whose config has fencing on for no cluster runs without fencing).
    fn topology_of(&self, id: NodeId) -> Option<FenceTopology> {
        let config = self.members[&id].config;
        config.fenced.iter().any(|f| *f).then(|| {
            FenceTopology::new(self.flows.iter().enumerate().map(|(ti, (flow, _))| {
                (
                    flow.clone(),
                    config.fenced[ti].then(|| self.targets[ti].name.clone()),
                )
            }))
        })
    }

    fn at(&self, ms: Ms) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    fn note(&mut self, what: impl Into<String>) {
        if self.trace.len() == 60 {
            self.trace.pop_front();
        }
        self.trace
            .push_back(format!("{:>6} ms  {}", self.now, what.into()));
    }

    /// The last notable things that happened, for a failure report.
    pub fn trace(&self) -> String {
        let mut out = String::new();
        for line in &self.trace {
            let _ = writeln!(out, "  {line}");
        }
        out
    }

    fn schedule_event(&mut self, delay: Ms, event: Event) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), event);
    }

    fn fail(&self, what: String) -> Violation {
        Violation { at: self.now, what }
    }

    /// Runs until everything settled after the heal, or an invariant broke.
    pub fn run(&mut self) -> Result<(), Violation> {
        let mut next_tick = 0;
        loop {
            let next_event = self.events.keys().next().map(|(t, _)| *t);
            if next_event.is_some_and(|t| t < next_tick) {
                let (key, event) = self.events.pop_first().expect("an event");
                self.now = key.0;
                self.start_freezes();
                self.handle(event)?;
                continue;
            }
            self.now = next_tick;
            next_tick += TICK;
            self.tick()?;
            if self.now >= HEAL && self.settled() {
                self.stats.settled_after = self.now - HEAL;
                return self.final_checks();
            }
            if self.now >= HEAL + SETTLE_WITHIN {
                return Err(self.fail(format!(
                    "not settled {SETTLE_WITHIN} ms after the last fault ended: {}",
                    self.progress_report()
                )));
            }
        }
    }

    fn progress_report(&self) -> String {
        let mut out = String::new();
        for (unit, ti) in &self.units {
            let owner = self
                .canonical
                .owners()
                .into_iter()
                .find(|(u, _, _)| u == unit)
                .and_then(|(_, o, e)| o.map(|o| (o, e.0)));
            let _ = write!(
                out,
                "[{unit}: upstream {}, downstream {}, confirmed {:?}, owner {:?}] ",
                self.upstream[unit],
                self.targets[*ti].copies(unit).len(),
                self.confirmed[unit],
                owner
            );
        }
        out
    }

    /// Every message downstream, confirmed, and every unit owned.
    fn settled(&self) -> bool {
        let owners = self.canonical.owners();
        self.units.iter().all(|(unit, ti)| {
            let n = self.upstream[unit];
            self.targets[*ti].copies(unit).len() as u64 == n
                && (n == 0 || self.confirmed[unit] == Some(n - 1))
                && owners.iter().any(|(u, o, _)| u == unit && o.is_some())
        })
    }

    fn final_checks(&self) -> Result<(), Violation> {
        for (unit, ti) in &self.units {
            let copies = self.targets[*ti].copies(unit);
            for (i, c) in copies.iter().enumerate() {
                if c.upstream != i as u64 {
                    return Err(self.fail(format!(
                        "{unit}: downstream offset {i} holds upstream {}",
                        c.upstream
                    )));
                }
            }
        }
        // The state machine is deterministic: every member that applied the whole log has
        // the state every entry was applied to at commit.
        for m in self.members.values() {
            if m.applied == self.log.len() as u64 && m.state != self.canonical {
                return Err(self.fail(format!(
                    "member {} applied the same {} entries to another state",
                    m.id, m.applied
                )));
            }
        }
        Ok(())
    }

    // ---- faults -------------------------------------------------------------------------

    fn apply_faults(&mut self) {
        let faults = self.schedule.faults.clone();
        for (i, f) in faults.iter().enumerate() {
            if f.at > self.now || self.started.contains(&i) {
                continue;
            }
            self.started.insert(i);
            self.note(format!("fault {:?} for {} ms", f.kind, f.for_ms));
            let until = f.at + f.for_ms;
            match f.kind {
                FaultKind::Crash { member } => self.crash(member, until),
                FaultKind::CrashLeader => {
                    if let Some(l) = self.leader {
                        self.crash(l, until);
                    }
                }
                FaultKind::Freeze { member } => self.freeze(member, f.at, until),
                FaultKind::WipedRestart { member } => {
                    // Lost while the process is down: it starts again with an empty data dir.
                    self.wiped.insert(member);
                    self.crash(member, until);
                }
                FaultKind::TargetDown { target, lose_tail } => {
                    self.targets[target].go_down(lose_tail);
                    self.restarts[target] += 1;
                }
                _ => {}
            }
        }
        self.roll_configs();
        // Ends: targets whose every outage is over come back.
        for ti in 0..TARGETS {
            let down = !self
                .schedule
                .active(
                    self.now,
                    |k| matches!(k, FaultKind::TargetDown { target, .. } if *target == ti),
                )
                .is_empty();
            if !down && !self.targets[ti].up {
                self.targets[ti].up = true;
                self.note(format!("target {ti} up"));
            }
        }
        let crashed: Vec<NodeId> = self
            .members
            .values()
            .filter(|m| !m.up)
            .map(|m| m.id)
            .collect();
        for id in crashed {
            if self.down_until.get(&id).is_some_and(|t| *t <= self.now) {
                self.down_until.remove(&id);
                self.down_since.remove(&id);
                let now = self.now;
                let wiped = self.wiped.remove(&id);
                let local_log_bounds = self.local_log_bounds;
                let landed_by = if self.handover_at_once {
                    now
                } else {
                    now + self.writer.send_lease_margin.as_millis() as u64
                };
                let m = self.members.get_mut(&id).expect("member");
                m.restart(now, wiped, local_log_bounds, landed_by);
                if wiped {
                    self.stats.wiped_restarts += 1;
                    self.note(format!("member {id} restarted with an empty data dir"));
                } else {
                    self.note(format!("member {id} restarted"));
                }
            }
        }
    }

    /// Starts the freezes due by now, between two ticks (the other faults start on a tick): a
    /// process may stop between a writer's check and its socket write (`Event::Depart`), or
    /// while an answer is on its way to it.
    fn start_freezes(&mut self) {
        for i in 0..self.schedule.faults.len() {
            let f = self.schedule.faults[i];
            if let FaultKind::Freeze { member } = f.kind {
                if f.at <= self.now && self.started.insert(i) {
                    self.note(format!("fault {:?} for {} ms", f.kind, f.for_ms));
                    self.freeze(member, f.at, f.at + f.for_ms);
                }
            }
        }
    }

    /// Stops member `id`'s process (SIGSTOP) from `at` until `until`.
    fn freeze(&mut self, id: NodeId, at: Ms, until: Ms) {
        let m = self.members.get_mut(&id).expect("member");
        if m.up {
            if m.frozen_until.is_none() {
                m.frozen_at = Some(at);
            }
            m.frozen_until = Some(m.frozen_until.map_or(until, |t| t.max(until)));
        }
    }

    /// The restarts of rolling config changes that are due: the member's config file gets
    /// fencing on for the change's target, and its process is killed and started again onto
    /// it (a member down already starts onto it when it comes back).
    fn roll_configs(&mut self) {
        for i in 0..self.schedule.faults.len() {
            let f = self.schedule.faults[i];
            let FaultKind::RollingConfig { target, first } = f.kind else {
                continue;
            };
            let turn_ms = f.for_ms / MEMBERS;
            for turn in 0..MEMBERS {
                if f.at + turn * turn_ms > self.now || !self.rolled.insert((i, turn)) {
                    continue;
                }
                let id = (first - 1 + turn) % MEMBERS + 1;
                self.members.get_mut(&id).expect("member").config.fenced[target] = true;
                self.stats.rolling_restarts += 1;
                self.note(format!(
                    "member {id} restarts onto the config with fencing on for target {target}"
                ));
                self.crash(id, self.now + turn_ms / 4);
            }
        }
    }

    /// What `leader`'s network shows at `now` (`network::gone` in the node): a member whose
    /// process is down refuses the heartbeats sent to it, and the second refusal, a heartbeat
    /// interval after the first, shows it gone. An isolated leader reaches nobody and learns
    /// nothing; a frozen or isolated member's calls time out, which shows nothing.
    fn gone_peers(&self, leader: NodeId, now: Ms) -> BTreeSet<NodeId> {
        if self.renewals_alone || self.isolated(leader) {
            return BTreeSet::new();
        }
        let heartbeat = self.timing.heartbeat_interval.as_millis() as u64;
        self.down_since
            .iter()
            .filter(|(id, since)| **id != leader && now >= **since + 2 * heartbeat)
            .map(|(id, _)| *id)
            .collect()
    }

    fn crash(&mut self, id: NodeId, until: Ms) {
        let m = self.members.get_mut(&id).expect("member");
        if !m.up {
            return;
        }
        m.up = false;
        m.frozen_until = None;
        self.down_until.insert(id, until);
        self.down_since.insert(id, self.now);
        if self.leader == Some(id) {
            self.leader = None;
        }
    }

    fn isolated(&self, id: NodeId) -> bool {
        !self
            .schedule
            .active(
                self.now,
                |k| matches!(k, FaultKind::Isolate { member } if *member == id),
            )
            .is_empty()
    }

    fn cut(&self, id: NodeId, target: usize) -> bool {
        !self
            .schedule
            .active(self.now, |k| {
                matches!(k, FaultKind::CutTarget { member, target: t } if *member == id && *t == target)
            })
            .is_empty()
    }

    fn lost(&mut self, pick: impl Fn(&FaultKind) -> Option<u8>) -> bool {
        let percent = self
            .schedule
            .active(self.now, |k| pick(k).is_some())
            .iter()
            .filter_map(&pick)
            .max();
        percent.is_some_and(|p| self.rng.gen_range(0..100) < u32::from(p))
    }

    fn target_delay(&mut self, target: usize) -> Ms {
        let extra = self
            .schedule
            .active(
                self.now,
                |k| matches!(k, FaultKind::SlowTarget { target: t, .. } if *t == target),
            )
            .iter()
            .map(|k| match k {
                FaultKind::SlowTarget { max_ms, .. } => *max_ms,
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        self.rng.gen_range(1..=15)
            + if extra > 0 {
                self.rng.gen_range(0..=extra)
            } else {
                0
            }
    }

    // ---- Raft, as the members see it ---------------------------------------------------

    /// Whether members `a` and `b` can exchange Raft traffic now.
    fn reach(&self, a: NodeId, b: NodeId) -> bool {
        let (ma, mb) = (&self.members[&a], &self.members[&b]);
        ma.active(self.now)
            && mb.active(self.now)
            && (a == b || (!self.isolated(a) && !self.isolated(b)))
    }

    /// Whether `id` could lead: active and reaching a majority.
    fn has_majority(&self, id: NodeId) -> bool {
        let reached = self.members.keys().filter(|m| self.reach(id, **m)).count() as u64;
        reached * 2 > MEMBERS
    }

    fn elect(&mut self) {
        let healthy = self.leader.is_some_and(|l| self.has_majority(l));
        if healthy {
            self.election_at = None;
            return;
        }
        let Some(at) = self.election_at else {
            let timeout = self.rng.gen_range(
                self.timing.election_timeout_min.as_millis() as u64
                    ..=self.timing.election_timeout_max.as_millis() as u64,
            );
            self.election_at = Some(self.now + timeout);
            return;
        };
        if self.now < at {
            return;
        }
        self.election_at = None;
        let candidates: Vec<NodeId> = self
            .members
            .keys()
            .copied()
            .filter(|id| self.has_majority(*id))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let id = candidates[self.rng.gen_range(0..candidates.len())];
        if let Some(old) = self.leader {
            self.previous_leader = Some(old);
        }
        self.term += 1;
        self.leader = Some(id);
        self.stats.elections += 1;
        self.note(format!("member {id} leads term {}", self.term));
    }

    /// A member's write: committed by the leader if the member reaches it, answered later.
    fn propose(&mut self, from: NodeId, cmd: Command, purpose: Purpose) {
        let run = self.members[&from].run;
        let reachable = self
            .leader
            .is_some_and(|l| self.reach(from, l) && self.has_majority(l));
        // Drawn whether or not the leader is reachable: a seed's random stream stays the same.
        let lost = self.control_answer_lost();
        if !reachable || lost {
            self.write_failed(from, run, purpose);
            return;
        }
        let delay = self.rng.gen_range(1..=8);
        let term = matches!(purpose, Purpose::Round).then_some(self.term);
        // A member's write forwarded twice (the leader's own rounds are not retried).
        let twice = term.is_none()
            && self.lost(|k| match k {
                FaultKind::DuplicateControlWrites { percent } => Some(*percent),
                _ => None,
            });
        if twice {
            let later = delay + self.rng.gen_range(1..=300);
            self.schedule_event(
                later,
                Event::Commit {
                    from,
                    run,
                    cmd: cmd.clone(),
                    purpose: Purpose::Duplicate,
                    term,
                },
            );
        }
        self.schedule_event(
            delay,
            Event::Commit {
                from,
                run,
                cmd,
                purpose,
                term,
            },
        );
    }

    /// A write that did not commit (no leader reachable, or lost): its writer hears so after
    /// `ANSWER_TIMEOUT`.
    fn write_failed(&mut self, from: NodeId, run: u64, purpose: Purpose) {
        let answer = Event::ControlAnswer {
            to: from,
            run,
            purpose,
            answer: None,
        };
        self.schedule_event(ANSWER_TIMEOUT, answer);
    }

    /// Whether a write or its answer is lost now (`FaultKind::LoseControlAnswers`).
    fn control_answer_lost(&mut self) -> bool {
        self.lost(|k| match k {
            FaultKind::LoseControlAnswers { percent } => Some(*percent),
            _ => None,
        })
    }

    fn commit(
        &mut self,
        from: NodeId,
        run: u64,
        cmd: Command,
        purpose: Purpose,
        term: Option<u64>,
    ) -> Result<(), Violation> {
        let committed = self.leader.is_some_and(|l| self.has_majority(l))
            && term.is_none_or(|t| t == self.term && self.leader == Some(from));
        if !committed {
            self.write_failed(from, run, purpose);
            return Ok(());
        }
        self.log.push(cmd.clone());
        let index = self.log.len() as u64;
        self.stats.entries += 1;
        let answer = self.canonical.apply(index, &cmd);
        self.check_progress()?;
        let (delay, answer) = if self.control_answer_lost() {
            (ANSWER_TIMEOUT, None)
        } else {
            (self.rng.gen_range(1..=8), Some((index, answer)))
        };
        self.schedule_event(
            delay,
            Event::ControlAnswer {
                to: from,
                run,
                purpose,
                answer,
            },
        );
        Ok(())
    }

    /// Confirmed offsets never move backwards, and never past what a target acknowledged.
    fn check_progress(&mut self) -> Result<(), Violation> {
        for (unit, ti) in &self.units {
            let now = self.canonical.progress(unit).and_then(|p| p.confirmed);
            let before = self.confirmed[unit];
            if now < before {
                return Err(self.fail(format!(
                    "{unit}: confirmed offset moved back from {before:?} to {now:?}"
                )));
            }
            if let Some(c) = now {
                let high = self.targets[*ti].high_water(unit) as u64;
                if c + 1 > high {
                    return Err(self.fail(format!(
                        "{unit}: offset {c} confirmed, but the target never held more than {high} messages"
                    )));
                }
            }
        }
        for (unit, _) in &self.units {
            let now = self.canonical.progress(unit).and_then(|p| p.confirmed);
            self.confirmed.insert(unit.clone(), now);
        }
        Ok(())
    }

    // ---- the tick ------------------------------------------------------------------------

    fn tick(&mut self) -> Result<(), Violation> {
        self.apply_faults();
        for t in &mut self.targets {
            t.tick(self.now);
        }
        if self.now < HEAL {
            for unit in self
                .units
                .iter()
                .map(|(u, _)| u.clone())
                .collect::<Vec<_>>()
            {
                let n = self.rng.gen_range(0..=3);
                *self.upstream.get_mut(&unit).expect("unit") += n;
                self.stats.produced += n;
            }
        }
        self.elect();
        let ids: Vec<NodeId> = self.members.keys().copied().collect();
        for id in ids {
            if !self.members[&id].active(self.now) {
                continue;
            }
            if self.members[&id].frozen_until.is_some() {
                // The leader's replication reaches it again with its next heartbeat.
                let heartbeat = self.timing.heartbeat_interval.as_millis() as u64;
                let catch_up_at = self.now + self.rng.gen_range(0..=heartbeat);
                let m = self.members.get_mut(&id).expect("member");
                m.frozen_until = None;
                m.catch_up_at = catch_up_at;
                self.note(format!("member {id} continues"));
            }
            self.apply_log(id);
            self.member_tasks(id);
            self.leader_round(id);
            self.coordinate(id);
            let units: Vec<WorkUnit> = self.members[&id].writers.keys().cloned().collect();
            for unit in units {
                self.writer_step(id, &unit)?;
            }
        }
        self.check_ownership()
    }

    /// Invariant 5 during the run: while a quorum leads, the unit's target is up and the
    /// leader reaches it, a unit whose owner is dead, frozen or cut off (or that has none) is
    /// owned again within [`OWNED_WITHIN`].
    fn check_ownership(&mut self) -> Result<(), Violation> {
        let leader = self.leader.filter(|l| self.has_majority(*l));
        let owners = self.canonical.owners();
        for (unit, ti) in &self.units {
            let owner = owners
                .iter()
                .find(|(u, _, _)| u == unit)
                .and_then(|(_, o, _)| *o);
            let live_owner =
                owner.is_some_and(|o| self.members[&o].active(self.now) && !self.isolated(o));
            let could = leader.is_some_and(|l| self.targets[*ti].up && !self.cut(l, *ti));
            if could && !live_owner {
                let since = *self.orphaned.entry(unit.clone()).or_insert(self.now);
                if self.now - since > OWNED_WITHIN {
                    return Err(self.fail(format!(
                        "{unit}: without a live owner for {} ms while a quorum and its target were up (owner {owner:?})",
                        self.now - since
                    )));
                }
            } else {
                self.orphaned.remove(unit);
            }
        }
        Ok(())
    }

    fn apply_log(&mut self, id: NodeId) {
        let Some(leader) = self.leader else { return };
        if !self.reach(id, leader) || self.now < self.members[&id].catch_up_at {
            return;
        }
        let now = self.at(self.now);
        let m = self.members.get_mut(&id).expect("member");
        while (m.applied as usize) < self.log.len() {
            let index = m.applied + 1;
            m.state.apply(index, &self.log[m.applied as usize]);
            m.applied = index;
            // Entry by entry, as the node's state machine does.
            m.inheritance.observe(index, &m.state, id);
        }
        m.observer.observe(&m.state, now);
        let applied = m.applied;
        let mut extended = m.lease;
        m.pending_lease.retain(|(index, until)| {
            if *index <= applied {
                extended = extended.max(Some(*until));
                false
            } else {
                true
            }
        });
        m.lease = extended;
    }

    fn member_tasks(&mut self, id: NodeId) {
        let now = self.now;
        let (registered, register_in_flight, features, renew_due, report_due) = {
            let m = &self.members[&id];
            (
                m.state.is_member(id),
                m.register_in_flight,
                m.features_published,
                !m.renew_in_flight && now >= m.next_renew,
                now >= m.next_report,
            )
        };
        if !registered {
            if !register_in_flight {
                self.members
                    .get_mut(&id)
                    .expect("member")
                    .register_in_flight = true;
                self.propose(id, Command::register(id), Purpose::Register);
            }
            return;
        }
        if !features {
            self.members
                .get_mut(&id)
                .expect("member")
                .features_published = true;
            self.propose(id, Command::publish_features(id), Purpose::Features);
        }
        let m = &self.members[&id];
        // Published again when an earlier process's `PublishConfig` (a retried write) was
        // applied after this one's, as the node's `ConfigPublisher` does.
        let stale = m.config_published
            && !m.config_in_flight
            && !m.state.config_applied(id, &self.digests(m.config));
        if !self.members[&id].config_published || stale {
            let digests = self.digests(self.members[&id].config);
            let m = self.members.get_mut(&id).expect("member");
            m.config_published = true;
            m.config_in_flight = true;
            self.propose(id, Command::publish_config(id, digests), Purpose::Config);
        }
        let m = &self.members[&id];
        // As the node: the inherited identity is given up (its units of fenced targets then
        // move through its fence) once the predecessor's last sends with the configured
        // credential can have landed.
        let landed = self.handover_at_once || now >= m.earlier_sends_landed_by;
        if self.inherit && landed && !m.abandon_in_flight {
            if let Some(incarnation) = m.inheritance.to_abandon(&m.state, id) {
                self.members.get_mut(&id).expect("member").abandon_in_flight = true;
                self.note(format!(
                    "member {id} gives up inherited identity {incarnation}"
                ));
                self.propose(id, Command::fence_member(id, incarnation), Purpose::Abandon);
            }
        }
        if renew_due {
            let sent = self.at(now);
            let m = self.members.get_mut(&id).expect("member");
            m.renew_in_flight = true;
            m.next_renew = now + self.timing.lease_renew_interval.as_millis() as u64;
            self.propose(id, Command::renew(id), Purpose::Renew { sent });
        }
        if report_due {
            self.members.get_mut(&id).expect("member").next_report = now + 5_000;
            for (flow, units) in self.flows.clone() {
                self.propose(id, Command::report_units(&flow, units), Purpose::Report);
            }
        }
    }

    fn leader_round(&mut self, id: NodeId) {
        let now = self.now;
        let leads = self.leader == Some(id) && self.has_majority(id);
        let m = self.members.get_mut(&id).expect("member");
        if !leads || m.leading.as_ref().is_some_and(|(t, _)| *t != self.term) {
            m.leading = None;
        }
        if !leads {
            return;
        }
        // A new leader carries on from what it saw while following, once it applied the log.
        if m.leading.is_none() {
            let leader = Leader::carry_on(
                id,
                self.term,
                &m.observer,
                self.base + Duration::from_millis(now),
                self.previous_leader,
            );
            m.leading = Some((self.term, leader));
            m.next_round = now;
        }
        if now < m.next_round {
            return;
        }
        m.next_round = now + self.timing.assignment_interval.as_millis() as u64;
        let topology = self.topology_of(id);
        let own_config =
            (!self.previous_config_decides).then(|| self.digests(self.members[&id].config));
        let gone = self.gone_peers(id, now);
        let m = self.members.get_mut(&id).expect("member");
        let (_, leader) = m.leading.as_mut().expect("leading");
        leader.peers_gone(gone);
        leader.ensuring(&m.ops_in_flight);
        let (cmd, ops) = leader.round(
            &m.state,
            self.base + Duration::from_millis(now),
            &self.timing,
            topology.as_ref(),
            own_config.as_ref(),
        );
        let term = self.term;
        let run = m.run;
        let fresh: Vec<TargetOp> = ops
            .into_iter()
            .filter(|op| m.ops_in_flight.insert(op.clone()))
            .collect();
        if let Some(cmd) = cmd {
            self.propose(id, cmd, Purpose::Round);
        }
        for op in fresh {
            let delay = self.rng.gen_range(1..=10);
            self.schedule_event(
                delay,
                Event::FenceArrive {
                    leader: id,
                    run,
                    term,
                    op,
                },
            );
        }
    }

    /// The member's coordinator: a writer per unit it owns, stopped when the grant is gone.
    fn coordinate(&mut self, id: NodeId) {
        let now = self.now;
        let assignments = self.running_assignments(id);
        let m = self.members.get_mut(&id).expect("member");
        let usable = m.usable_identity(self.inherit);
        let totals = m.state.feature_level() >= 2;
        // Writers whose grant is gone stop; a fenced identity's connections are closed for good.
        m.writers.retain(|unit, w| {
            let granted = assignments
                .iter()
                .any(|a| &a.unit == unit && a.epoch == w.epoch);
            // Writers with the configured credential do not follow the identity.
            let identity_ok = match w.credential {
                Some(Credential::Writer((_, inc))) => usable == Some(inc),
                Some(Credential::Configured) | None => true,
            };
            granted && identity_ok
        });
        let mut new = Vec::new();
        for a in &assignments {
            match m.writers.get_mut(&a.unit) {
                Some(w) => {
                    // As the coordinator stops a running pair asked to hand its unit back,
                    // also one still resuming (waiting for an identity or a login).
                    let running = matches!(w.phase, Phase::Resuming | Phase::Copying);
                    if a.release_requested && running {
                        w.phase = Phase::Draining {
                            release_sent: false,
                        };
                    }
                }
                None => new.push(a.clone()),
            }
        }
        for a in new {
            // As the pipeline's `fencing::handover`: nothing is taken up or handed back before
            // the predecessor's last sends can have landed.
            let start = now.max(self.members[&id].earlier_sends_landed_by);
            let mut w = self.writer_for(a.unit.clone(), a.epoch, totals, start);
            if a.release_requested {
                // Nothing written yet: hand it back at once.
                w.phase = Phase::Draining {
                    release_sent: false,
                };
            }
            self.members
                .get_mut(&id)
                .expect("member")
                .writers
                .insert(a.unit, w);
        }
    }

    fn target_of(&self, unit: &WorkUnit) -> usize {
        self.units
            .iter()
            .find(|(u, _)| u == unit)
            .map(|(_, t)| *t)
            .expect("known unit")
    }

    /// Whether member `id`'s connection to target `ti` is logged in as `who`. If not, its
    /// login starts (a new connection: after a switch of identity, a restart of the target or
    /// a call that timed out) unless one is on its way; the writer waits for it. The
    /// configured credential is never refused: its logins are not modelled.
    fn logged_in(&mut self, id: NodeId, ti: usize, who: Credential) -> bool {
        let Credential::Writer((_, incarnation)) = who else {
            return true;
        };
        let restarts = self.restarts[ti];
        let now = self.now;
        let m = self.members.get_mut(&id).expect("member");
        if let Some(c) = m.connections.get(&ti) {
            if c.incarnation == incarnation && c.restarts == restarts {
                match c.login {
                    Login::Open => return true,
                    Login::Pending => return false,
                    Login::Failed { retry_at } if now < retry_at => return false,
                    Login::Failed { .. } => {}
                }
            }
        }
        // A connection of another identity is replaced, and a login of it still on its way
        // answers later (a refusal of it is reported all the same).
        m.connections.insert(
            ti,
            Connection {
                incarnation,
                restarts,
                login: Login::Pending,
            },
        );
        let run = m.run;
        if self.cut(id, ti) {
            // The connect does not get through: it times out.
            self.schedule_event(
                SEND_TIMEOUT,
                Event::LoginAnswer {
                    to: id,
                    run,
                    target: ti,
                    incarnation,
                    restarts,
                    outcome: LoginOutcome::Failed,
                },
            );
        } else {
            let delay = self.target_delay(ti);
            self.schedule_event(
                delay,
                Event::LoginArrive {
                    from: id,
                    run,
                    target: ti,
                    incarnation,
                    restarts,
                },
            );
        }
        false
    }

    /// Member `id`'s identity follower hears that a target refused a login as its identity
    /// `refused`, and decides as the node's does (`Refusal::of`: only a refusal of the identity
    /// it writes as now gives that one up, the late answer to a connect of a replaced one gives
    /// nothing up; at most one identity per `MIN_ABANDON_INTERVAL`). Checked: every identity a
    /// member gives up after a refusal is one a target refused, so a late refusal never costs
    /// the identity that replaced the refused one, and identities are not burned one after the
    /// other.
    fn login_refused(&mut self, id: NodeId, refused: u64) -> Result<(), Violation> {
        self.stats.logins_refused += 1;
        let m = &self.members[&id];
        let current = m.usable_identity(self.inherit);
        let give_up = if self.any_refusal_gives_up {
            current
        } else {
            refusal_gives_up(id, refused, current)
        };
        let Some(incarnation) = give_up else {
            self.stats.late_refusals += 1;
            self.note(format!(
                "member {id}: a late refusal of identity {refused} (writing as {current:?}) gives nothing up"
            ));
            return Ok(());
        };
        let pause = MIN_ABANDON_INTERVAL.as_millis() as u64;
        if m.last_given_up.is_some_and(|at| self.now - at < pause) {
            self.note(format!(
                "member {id}: identity {refused} refused again; not giving another identity up yet"
            ));
            return Ok(());
        }
        if !self
            .targets
            .iter()
            .any(|t| t.refused_login((id, incarnation)))
        {
            return Err(self.fail(format!(
                "member {id} gave its identity {incarnation} up after a refused login of identity {refused}, but no target ever refused {incarnation}"
            )));
        }
        let now = self.now;
        self.members.get_mut(&id).expect("member").last_given_up = Some(now);
        self.stats.identities_given_up += 1;
        self.note(format!(
            "member {id} gives its identity {incarnation} up: a target refused its login"
        ));
        self.propose(id, Command::fence_member(id, incarnation), Purpose::GiveUp);
        Ok(())
    }

    /// A send with the configured credential checks the lease and the epoch once more as it
    /// is written to the socket (`Cluster::call_checked`: microseconds after the check, which
    /// the simulation does not split): a process frozen since its first check sends only if
    /// they still hold. `false`: held back, and its writer told.
    fn checked_at_departure(&mut self, send: &Send) -> bool {
        let holds = self
            .running_assignments(send.from)
            .iter()
            .any(|a| a.unit == send.unit && a.epoch == send.epoch);
        let m = &self.members[&send.from];
        let lease = if holds { m.lease } else { None };
        let veto = match may_send(
            self.at(self.now),
            lease,
            self.writer.send_lease_margin,
            holds,
        ) {
            Ok(()) => return true,
            Err(veto) => veto,
        };
        self.stats.held_at_departure += 1;
        self.note(format!(
            "{}: member {} holds a send back as it departs ({veto:?})",
            send.unit, send.from
        ));
        let now = self.now;
        let m = self.members.get_mut(&send.from).expect("member");
        if let Some(w) = m
            .writers
            .get_mut(&send.unit)
            .filter(|w| w.session == send.session)
        {
            w.in_flight = None;
            match w.core.vetoed(veto) {
                Some(recheck) => w.retry_at = now + ms(recheck),
                None => {
                    m.writers.remove(&send.unit);
                }
            }
        }
        false
    }

    /// A writer session of `unit` under `epoch` (totals: it commits totals, feature level 2).
    fn writer_for(&mut self, unit: WorkUnit, epoch: Epoch, totals: bool, start: Ms) -> Writer {
        let session: u64 = self.rng.gen();
        let core = WriterCore::new(
            unit.clone(),
            epoch,
            &self.writer,
            self.at(start),
            totals.then_some(session),
            session ^ 0x5eed,
        );
        Writer::new(unit, epoch, session, core, start)
    }

    /// Reads the downstream tail as `who` with the writer's real `TailScan`: what it found
    /// and the partition's next offset.
    fn scan_tail(
        &self,
        id: NodeId,
        who: Credential,
        unit: &WorkUnit,
        confirmed: Option<u64>,
    ) -> Result<(Tail, u64), Refusal> {
        let ti = self.target_of(unit);
        if self.cut(id, ti) {
            return Err(Refusal::Down);
        }
        let target = &self.targets[ti];
        let next = target.next_offset(who, unit)?;
        let (mut scan, mut page) = TailScan::start(self.writer.tail_scan_window, confirmed);
        loop {
            let (from, count) = match page {
                Page::Last { count } => (None, count),
                Page::From { offset, count } => (Some(offset), count),
            };
            let seen: Vec<Seen> = target
                .read(who, unit, from, count)?
                .into_iter()
                .map(|(offset, up)| Seen {
                    offset,
                    upstream: Some(up),
                })
                .collect();
            match scan.feed(&seen) {
                Ok(tail) => return Ok((tail, next)),
                Err(p) => page = p,
            }
        }
    }

    fn writer_step(&mut self, id: NodeId, unit: &WorkUnit) -> Result<(), Violation> {
        let now = self.now;
        let now_i = self.at(now);
        let ti = self.target_of(unit);
        let inherit = self.inherit;
        let running = self.running_assignments(id);
        let (credential, holds, lease, level, progress) = {
            let m = &self.members[&id];
            let w = &m.writers[unit];
            let holds = running
                .iter()
                .any(|a| &a.unit == unit && a.epoch == w.epoch);
            // A target with fencing on in its config is written as its current identity
            // (none usable: the writer waits), any other with the configured credential.
            let credential = if m.config.fenced[ti] {
                m.usable_identity(inherit)
                    .map(|inc| Credential::Writer((id, inc)))
            } else {
                Some(Credential::Configured)
            };
            (
                credential,
                holds,
                m.lease,
                m.state.feature_level(),
                m.state.progress(unit),
            )
        };
        let upstream = self.upstream[unit];
        let mut w = self
            .members
            .get_mut(&id)
            .expect("member")
            .writers
            .remove(unit)
            .expect("writer");
        let keep = self.writer_decide(
            id, ti, &mut w, credential, holds, lease, level, progress, upstream, now, now_i,
        )?;
        if keep {
            self.members
                .get_mut(&id)
                .expect("member")
                .writers
                .insert(unit.clone(), w);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn writer_decide(
        &mut self,
        id: NodeId,
        ti: usize,
        w: &mut Writer,
        credential: Option<Credential>,
        holds: bool,
        lease: Option<Instant>,
        level: u32,
        progress: Option<replicator_model::UnitProgress>,
        upstream: u64,
        now: Ms,
        now_i: Instant,
    ) -> Result<bool, Violation> {
        if now < w.retry_at {
            return Ok(true);
        }
        let unit = w.unit.clone();
        match w.phase {
            Phase::Resuming => {
                let Some(who) = credential else {
                    w.retry_at = now + RETRY;
                    return Ok(true);
                };
                if !self.logged_in(id, ti, who) {
                    return Ok(true);
                }
                let confirmed = progress.and_then(|p| p.confirmed);
                match self.scan_tail(id, who, &unit, confirmed) {
                    Ok((tail, next_down)) => {
                        let last = upstream.saturating_sub(1);
                        let plan = resume(progress, CREATED_AT, tail, upstream, last);
                        w.core.resumed(&plan, tail, progress, next_down);
                        w.read_at = plan.from();
                        w.core.succeeded();
                        w.credential = Some(who);
                        w.connection = self.restarts[ti];
                        w.phase = Phase::Copying;
                        self.note(format!(
                            "{unit}: member {id} resumes at {} as {who:?} (epoch {}, session {})",
                            plan.from(),
                            w.epoch.0,
                            w.session
                        ));
                        if plan.loss() {
                            self.stats.downstream_losses += 1;
                            self.note(format!("{unit}: writer of {id} repairs a downstream loss"));
                        }
                    }
                    Err(_) => {
                        if !w.failed(now, now_i) {
                            self.give_up(id, w, level);
                        }
                    }
                }
                Ok(true)
            }
            Phase::Draining { release_sent } => {
                if w.in_flight.is_some() || w.commit_in_flight {
                    return Ok(true);
                }
                if release_sent {
                    w.retry_at = now + RETRY * 5;
                    w.phase = Phase::Draining {
                        release_sent: false,
                    };
                    return Ok(true);
                }
                if let Some(commit) = w.core.final_commit(now_i) {
                    self.start_commit(id, w, commit, level);
                    return Ok(true);
                }
                if credential.is_none() && !self.handover_at_once {
                    // A fenced target and no identity of this process's own yet: its
                    // predecessor's identity may still be the node's, and a unit handed back
                    // now would move around its fence (`fencing::handover`). It moves through
                    // the fence, or once an identity arrives.
                    w.retry_at = now + RETRY;
                    return Ok(true);
                }
                w.phase = Phase::Draining { release_sent: true };
                self.propose(id, Command::release(id, unit, w.epoch), Purpose::Release);
                Ok(true)
            }
            Phase::Copying => {
                if !w.commit_in_flight {
                    if let Some(commit) = w.core.commit_if_due(now_i) {
                        self.start_commit(id, w, commit, level);
                    }
                }
                if w.in_flight.is_some() {
                    return Ok(true);
                }
                let who = w.credential.expect("a copying writer has logged in");
                if !self.logged_in(id, ti, who) {
                    return Ok(true);
                }
                if w.connection != self.restarts[ti] {
                    // The target restarted under the connection: the node's next send on it
                    // fails, and the send before may or may not have landed.
                    w.core.send_unsure();
                    w.connection = self.restarts[ti];
                }
                if let Some(reference) = w.core.rescan() {
                    match self.scan_tail(id, who, &unit, reference) {
                        Ok((tail, next_down)) => {
                            if !w.core.rescanned(tail, next_down) {
                                // The target lost what it acknowledged: the pair ends and the
                                // next one's resume copies it again.
                                self.stats.downstream_losses += 1;
                                self.note(format!(
                                    "{unit}: writer of {id} found its copies lost; pair restarts"
                                ));
                                *w = self.writer_for(unit, w.epoch, level >= 2, now + RETRY);
                                return Ok(true);
                            }
                        }
                        Err(_) => {
                            if !w.failed(now, now_i) {
                                self.give_up(id, w, level);
                            }
                            return Ok(true);
                        }
                    }
                }
                self.check_translation(w)?;
                let lo = w.read_at.max(w.core.written().map_or(0, |x| x + 1));
                let hi = upstream.min(lo + BATCH);
                if lo >= hi {
                    return Ok(true);
                }
                let lease_for_epoch = if holds { lease } else { None };
                if let Err(veto) =
                    may_send(now_i, lease_for_epoch, self.writer.send_lease_margin, holds)
                {
                    return Ok(match w.core.vetoed(veto) {
                        Some(recheck) => {
                            w.retry_at = now + ms(recheck);
                            true
                        }
                        None => false,
                    });
                }
                w.in_flight = Some((lo..hi).collect());
                let send = Send {
                    from: id,
                    run: self.members[&id].run,
                    target: ti,
                    unit,
                    epoch: w.epoch,
                    session: w.session,
                    who,
                    upstream: (lo..hi).collect(),
                    connection: w.connection,
                    started: now,
                };
                // Between the check and the socket write the process may stop (a freeze); a
                // send as a writer identity departs after it, checked before (what the fence
                // covers), one with the configured credential checks again as it departs.
                let delay = self.rng.gen_range(0..=2);
                self.schedule_event(delay, Event::Depart(send));
                Ok(true)
            }
        }
    }

    fn start_commit(&mut self, id: NodeId, w: &mut Writer, commit: ProgressCommit, level: u32) {
        w.commit_in_flight = true;
        self.propose(
            id,
            Command::commit(id, vec![commit], level),
            Purpose::Commit {
                unit: w.unit.clone(),
                epoch: w.epoch,
                session: w.session,
            },
        );
    }

    /// A translated group offset is the copy of the group's upstream offset or of an earlier
    /// copied message, never a later one; checked as the group sync uses the map (only while
    /// its newest entry is what the target holds there).
    fn check_translation(&mut self, w: &Writer) -> Result<(), Violation> {
        if w.read_at == 0 {
            return Ok(());
        }
        let copies = self.targets[self.target_of(&w.unit)].copies(&w.unit);
        let Some((nd, nu)) = w.core.newest_copy() else {
            return Ok(());
        };
        if copies.get(nd as usize).map(|c| c.upstream) != Some(nu) {
            return Ok(());
        }
        let group = self.rng.gen_range(0..w.read_at);
        if let Some((down, up)) = w.core.lookup(group) {
            self.stats.translations += 1;
            let at = copies.get(down as usize).map(|c| c.upstream);
            if up > group || at != Some(up) {
                return Err(self.fail(format!(
                    "{}: group offset {group} translated to downstream {down} (said to copy {up}), which holds {at:?}",
                    w.unit
                )));
            }
        }
        Ok(())
    }

    fn send_answer(
        &mut self,
        to: NodeId,
        unit: &WorkUnit,
        session: u64,
        landed: Option<Option<u64>>,
        timed_out: bool,
    ) {
        let now = self.now;
        let ti = self.target_of(unit);
        let now_i = self.at(now);
        let m = self.members.get_mut(&to).expect("member");
        let Some(w) = m.writers.get_mut(unit).filter(|w| w.session == session) else {
            return;
        };
        if let (true, Some(Credential::Writer((_, incarnation)))) = (timed_out, w.credential) {
            // A call that timed out drops its connection: the next one logs in again.
            let used = m
                .connections
                .get(&ti)
                .is_some_and(|c| c.incarnation == incarnation && c.restarts == w.connection);
            if used {
                m.connections.remove(&ti);
            }
        }
        let batch = w.in_flight.take();
        let acknowledged = match (landed, &batch) {
            (Some(base), Some(batch)) => {
                // A send that landed elsewhere than after the previous one is handled as one
                // whose outcome is unknown (`Error::UnexpectedAppend`).
                let fits = w.core.acknowledged(unit.partition, base, batch);
                if !fits {
                    self.stats.landed_mismatches += 1;
                }
                fits
            }
            _ => {
                // The batch may have been appended: re-read the tail before the next send.
                w.core.send_unsure();
                false
            }
        };
        match batch {
            Some(batch) if acknowledged => {
                let last = *batch.last().expect("a send is never empty");
                w.core.handled(batch.len() as u64, last);
                w.core.succeeded();
                w.read_at = last + 1;
            }
            _ => {
                if !w.failed(now, now_i) {
                    let mut w = m.writers.remove(unit).expect("writer");
                    let level = m.state.feature_level();
                    self.give_up(to, &mut w, level);
                    self.members
                        .get_mut(&to)
                        .expect("member")
                        .writers
                        .insert(unit.clone(), w);
                }
            }
        }
    }

    /// A writer whose failures outlasted the retry budget gives up: its pair ends with the
    /// error and the coordinator starts the next one (a new session) after a pause.
    fn give_up(&mut self, id: NodeId, w: &mut Writer, level: u32) {
        self.stats.writers_given_up += 1;
        self.note(format!(
            "{}: writer of {id} gives up after failing for longer than the retry budget",
            w.unit
        ));
        let next = self.now + RETRY;
        *w = self.writer_for(w.unit.clone(), w.epoch, level >= 2, next);
    }

    // ---- events ----------------------------------------------------------------------------

    fn handle(&mut self, event: Event) -> Result<(), Violation> {
        match event {
            Event::Commit {
                from,
                run,
                cmd,
                purpose,
                term,
            } => self.commit(from, run, cmd, purpose, term),
            Event::ControlAnswer {
                to,
                run,
                purpose,
                answer,
            } => {
                if self.deferred(to, run, |to| Event::ControlAnswer {
                    to,
                    run,
                    purpose: purpose.clone(),
                    answer: answer.clone(),
                }) {
                    return Ok(());
                }
                self.control_answer(to, purpose, answer);
                Ok(())
            }
            Event::Depart(send) => {
                let (from, run) = (send.from, send.run);
                if self.members[&from].run != run || !self.members[&from].up {
                    // The process died before it wrote the request.
                    return Ok(());
                }
                if let Some(t) = self.members[&from].frozen_until.filter(|t| *t > self.now) {
                    let wait = t - self.now;
                    self.schedule_event(wait, Event::Depart(send));
                    return Ok(());
                }
                let configured = send.who == Credential::Configured;
                if configured {
                    if !self.checked_at_departure(&send) {
                        return Ok(());
                    }
                    self.stats.configured_sends += 1;
                }
                if self.cut(from, send.target) {
                    self.stats.unknown_outcomes += 1;
                    self.answer_send(&send, None, SEND_TIMEOUT, true);
                    return Ok(());
                }
                let mut delay = self.target_delay(send.target);
                if configured {
                    // The lease alone rests on a send reaching its target within
                    // `send_lease_margin` (the margin is longer than one send takes).
                    let margin = self.writer.send_lease_margin.as_millis() as u64;
                    delay = delay.min(margin - 1);
                }
                self.schedule_event(delay, Event::Arrive(send));
                Ok(())
            }
            Event::Arrive(send) => {
                let target = &mut self.targets[send.target];
                let outcome = if send.connection != self.restarts[send.target] {
                    // The connection was dropped by a restart of the target.
                    Err(Refusal::Down)
                } else {
                    target.append(send.who, &send.unit, send.session, &send.upstream)
                };
                let confirms = target.confirms;
                let landed = match outcome {
                    Ok(Ok(base)) => Some(confirms.then_some(base)),
                    Ok(Err(v)) => {
                        return Err(self.fail(match v {
                            TargetViolation::TwoWriters { unit, session } => format!(
                                "{unit}: the target accepted session {session} of member {} (identity {:?}) after another session had written",
                                send.from, send.who
                            ),
                            TargetViolation::NotNext {
                                unit,
                                expected,
                                got,
                            } => format!(
                                "{unit}: the target accepted upstream offset {got} where {expected} was next (member {}, identity {:?})",
                                send.from, send.who
                            ),
                        }))
                    }
                    Err(Refusal::Denied) => {
                        self.stats.refused_sends += 1;
                        None
                    }
                    Err(Refusal::Down) => None,
                };
                let lost = self.lost(|k| match k {
                    FaultKind::LoseTargetAnswers { target, percent } if *target == send.target => {
                        Some(*percent)
                    }
                    _ => None,
                }) || self.cut(send.from, send.target);
                if lost {
                    self.stats.unknown_outcomes += 1;
                    self.answer_send(&send, None, SEND_TIMEOUT, true);
                } else {
                    let delay = self.rng.gen_range(1..=10);
                    self.answer_send(&send, landed, delay, false);
                }
                Ok(())
            }
            Event::SendAnswer {
                to,
                run,
                unit,
                session,
                landed,
                started,
                timed_out,
            } => {
                if self.deferred(to, run, |to| Event::SendAnswer {
                    to,
                    run,
                    unit: unit.clone(),
                    session,
                    landed,
                    started,
                    timed_out,
                }) {
                    return Ok(());
                }
                // A call in flight across a freeze longer than its timeout timed out when the
                // process continued, whatever the answer waiting for it.
                let frozen_meanwhile = self.members[&to].frozen_at.is_some_and(|at| at >= started);
                let late = frozen_meanwhile && self.now - started > SEND_TIMEOUT;
                if late && !timed_out {
                    self.stats.unknown_outcomes += 1;
                }
                let timed_out = timed_out || late;
                let landed = if timed_out { None } else { landed };
                self.send_answer(to, &unit, session, landed, timed_out);
                Ok(())
            }
            Event::LoginArrive {
                from,
                run,
                target,
                incarnation,
                restarts,
            } => {
                let outcome = if restarts != self.restarts[target] {
                    // The connection was dropped by a restart of the target.
                    LoginOutcome::Failed
                } else {
                    match self.targets[target].login((from, incarnation)) {
                        Ok(()) => LoginOutcome::Accepted,
                        Err(Refusal::Denied) => LoginOutcome::Refused,
                        Err(Refusal::Down) => LoginOutcome::Failed,
                    }
                };
                let lost = self.lost(|k| match k {
                    FaultKind::LoseTargetAnswers { target: t, percent } if *t == target => {
                        Some(*percent)
                    }
                    _ => None,
                }) || self.cut(from, target);
                let (delay, outcome) = if lost {
                    (SEND_TIMEOUT, LoginOutcome::Failed)
                } else {
                    (self.rng.gen_range(1..=10), outcome)
                };
                self.schedule_event(
                    delay,
                    Event::LoginAnswer {
                        to: from,
                        run,
                        target,
                        incarnation,
                        restarts,
                        outcome,
                    },
                );
                Ok(())
            }
            Event::LoginAnswer {
                to,
                run,
                target,
                incarnation,
                restarts,
                outcome,
            } => {
                if self.deferred(to, run, |to| Event::LoginAnswer {
                    to,
                    run,
                    target,
                    incarnation,
                    restarts,
                    outcome,
                }) {
                    return Ok(());
                }
                let now = self.now;
                let m = self.members.get_mut(&to).expect("member");
                let awaited = Connection {
                    incarnation,
                    restarts,
                    login: Login::Pending,
                };
                if let Some(c) = m.connections.get_mut(&target).filter(|c| **c == awaited) {
                    c.login = if outcome == LoginOutcome::Accepted {
                        Login::Open
                    } else {
                        Login::Failed {
                            retry_at: now + RETRY,
                        }
                    };
                }
                if outcome == LoginOutcome::Refused {
                    self.login_refused(to, incarnation)?;
                }
                Ok(())
            }
            Event::FenceArrive {
                leader,
                run,
                term,
                op,
            } => {
                let ok = self.run_fence_op(leader, &op);
                let delay = self.rng.gen_range(1..=10);
                self.schedule_event(
                    delay,
                    Event::FenceAnswer {
                        leader,
                        run,
                        term,
                        op,
                        ok,
                    },
                );
                Ok(())
            }
            Event::FenceAnswer {
                leader,
                run,
                term,
                op,
                ok,
            } => {
                if self.deferred(leader, run, |leader| Event::FenceAnswer {
                    leader,
                    run,
                    term,
                    op: op.clone(),
                    ok,
                }) {
                    return Ok(());
                }
                let m = self.members.get_mut(&leader).expect("member");
                m.ops_in_flight.remove(&op);
                if let Some((target, node, incarnation)) = op.ensured_user() {
                    if let Some((_, l)) = m.leading.as_mut().filter(|(t, _)| *t == term) {
                        if ok {
                            l.ensured(&target, node, incarnation);
                        } else {
                            l.ensure_failed(&target, node, incarnation);
                        }
                    }
                } else if !ok {
                    return Ok(());
                } else if let Some(cmd) = self.topology_of(leader).and_then(|topology| {
                    acknowledged(&op, &topology, &self.members[&leader].state, leader)
                }) {
                    if matches!(op, TargetOp::Revoke { .. }) {
                        self.stats.fences += 1;
                        self.note(format!("fenced on the target: {op:?}"));
                        // As the node does: written with the next round, at once, ahead of
                        // the grants of the units it frees.
                        let with_round = !self.renewals_alone;
                        let m = self.members.get_mut(&leader).expect("member");
                        if let Some((_, l)) =
                            m.leading.as_mut().filter(|(t, _)| with_round && *t == term)
                        {
                            l.write_with_round(cmd);
                            m.next_round = self.now;
                            return Ok(());
                        }
                    }
                    self.propose(leader, cmd, Purpose::FenceAck);
                }
                Ok(())
            }
        }
    }

    /// An answer to a process that is gone is dropped; one to a frozen process waits for it.
    fn deferred(&mut self, to: NodeId, run: u64, again: impl FnOnce(NodeId) -> Event) -> bool {
        let m = &self.members[&to];
        if m.run != run || !m.up {
            return true;
        }
        if let Some(t) = m.frozen_until.filter(|t| *t > self.now) {
            let wait = t - self.now;
            let event = again(to);
            self.schedule_event(wait, event);
            return true;
        }
        false
    }

    /// Answers `send` after `delay`; `timed_out`: no answer reaches the writer, which gives
    /// the call up after `SEND_TIMEOUT` (`delay`).
    fn answer_send(
        &mut self,
        send: &Send,
        landed: Option<Option<u64>>,
        delay: Ms,
        timed_out: bool,
    ) {
        self.schedule_event(
            delay,
            Event::SendAnswer {
                to: send.from,
                run: send.run,
                unit: send.unit.clone(),
                session: send.session,
                landed,
                started: send.started,
                timed_out,
            },
        );
    }

    /// Runs a leader's fence operation on the targets it names (for a forget, every target
    /// its config fences); `false` if one is down or cut off from the leader.
    fn run_fence_op(&mut self, leader: NodeId, op: &TargetOp) -> bool {
        let (who, target, revoke) = match op {
            TargetOp::Revoke {
                node,
                incarnation,
                target,
            } => ((*node, *incarnation), Some(target), true),
            TargetOp::Ensure {
                node,
                incarnation,
                target,
            } => ((*node, *incarnation), Some(target), false),
            TargetOp::Forget { node, incarnation } => ((*node, *incarnation), None, true),
        };
        let targets: Vec<usize> = match target {
            Some(name) => match self.targets.iter().position(|t| &t.name == name) {
                Some(ti) => vec![ti],
                None => return false,
            },
            None => {
                let fenced = self.members[&leader].config.fenced;
                (0..TARGETS).filter(|ti| fenced[*ti]).collect()
            }
        };
        targets.into_iter().all(|ti| {
            !self.cut(leader, ti)
                && if revoke {
                    self.targets[ti].revoke(who).is_ok()
                } else {
                    self.targets[ti].ensure(who).is_ok()
                }
        })
    }

    fn control_answer(&mut self, to: NodeId, purpose: Purpose, answer: Option<(u64, Answer)>) {
        let now = self.now;
        let now_i = self.at(now);
        let timing = self.timing.clone();
        let m = self.members.get_mut(&to).expect("member");
        if let Some((index, _)) = &answer {
            // As the node's `write_within`: an entry this process wrote, committed, bounds
            // what an earlier process can have applied (`Inheritance`).
            m.inheritance.wrote(*index);
        }
        match purpose {
            Purpose::Register => m.register_in_flight = false,
            Purpose::Features => {
                if answer.is_none() {
                    m.features_published = false;
                }
            }
            Purpose::Renew { sent } => {
                m.renew_in_flight = false;
                if let Some((
                    index,
                    Answer::Renewed {
                        revoked_since_previous: false,
                    },
                )) = answer
                {
                    // Extended only once the member applied up to the renewal.
                    m.pending_lease.push((index, lease_until(sent, &timing)));
                }
            }
            Purpose::Commit {
                unit,
                epoch,
                session,
            } => {
                let Some(w) = m
                    .writers
                    .get_mut(&unit)
                    .filter(|w| w.session == session && w.epoch == epoch)
                else {
                    return;
                };
                w.commit_in_flight = false;
                let outcomes: Option<Vec<CommitOutcome>> = match answer {
                    Some((_, Answer::Commits(o))) => Some(o),
                    Some(_) => Some(Vec::new()),
                    None => None,
                };
                if w.core.settle(now_i, outcomes.as_deref()) {
                    // Fenced: the writer stops at once.
                    m.writers.remove(&unit);
                }
            }
            Purpose::Abandon => m.abandon_in_flight = false,
            Purpose::Config => {
                m.config_in_flight = false;
                if answer.is_none() {
                    m.config_published = false;
                }
            }
            Purpose::Report
            | Purpose::Round
            | Purpose::FenceAck
            | Purpose::Release
            | Purpose::GiveUp
            | Purpose::Duplicate => {}
        }
    }
}
