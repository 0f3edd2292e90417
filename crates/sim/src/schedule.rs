//! The faults one run injects: drawn from the seed, printed on failure, and shrunk by
//! [`crate::minimise`] to the few that still break an invariant.

use std::fmt;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Simulated milliseconds.
pub type Ms = u64;

/// Members of the simulated cluster (ids 1..=MEMBERS); the world runs them, faults pick from
/// them.
pub const MEMBERS: u64 = 3;
/// Target clusters (each written by one flow).
pub const TARGETS: usize = 2;

/// One fault, from `at` for `for_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// When it starts (simulated ms since the run began).
    pub at: Ms,
    /// How long it lasts.
    pub for_ms: Ms,
    /// What it is.
    pub kind: FaultKind,
}

/// The fault classes (see ARCHITECTURE.md, "The simulator", for the invariants each exercises).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The member's process is killed (kill -9) and started again when the fault ends, with
    /// what Raft persisted.
    Crash {
        /// The member.
        member: u64,
    },
    /// Whichever member leads when the fault starts is killed.
    CrashLeader,
    /// The member's process is stopped (SIGSTOP) and continued: its memory, its lease as it
    /// knew it and the sends it had checked all come back late.
    Freeze {
        /// The member.
        member: u64,
    },
    /// The member is cut off from the other members (its Raft traffic is lost both ways).
    Isolate {
        /// The member.
        member: u64,
    },
    /// The member is cut off from one target.
    CutTarget {
        /// The member.
        member: u64,
        /// The target's index.
        target: usize,
    },
    /// The target is down, then restarts; with `lose_tail` it comes back without what it had
    /// acknowledged but not yet flushed (as Iggy 0.8 acknowledges before it persists).
    TargetDown {
        /// The target's index.
        target: usize,
        /// Whether unflushed messages are lost.
        lose_tail: bool,
    },
    /// Answers from the target to its writers are lost with this percentage (the send may
    /// have landed: an unknown outcome).
    LoseTargetAnswers {
        /// The target's index.
        target: usize,
        /// Percent of answers lost.
        percent: u8,
    },
    /// Answers of the control plane to its members' writes are lost with this percentage
    /// (the write may have committed: a forwarded write retried, a commit applied twice).
    LoseControlAnswers {
        /// Percent of answers lost.
        percent: u8,
    },
    /// Members' writes reach the control plane twice with this percentage, the second copy up
    /// to 300 ms later (a forwarded write retried after its answer was lost: two entries).
    DuplicateControlWrites {
        /// Percent of writes duplicated.
        percent: u8,
    },
    /// Sends and logins to the target take up to `max_ms` longer (a slow network or a busy
    /// server).
    SlowTarget {
        /// The target's index.
        target: usize,
        /// Longest extra delay.
        max_ms: Ms,
    },
    /// The member's process is killed (kill -9) and started again when the fault ends with an
    /// empty data dir (lost, or wiped): nothing persisted, so the leader replays it the whole
    /// log from index 1, its predecessor's writer identity among the entries.
    WipedRestart {
        /// The member.
        member: u64,
    },
    /// A rolling config change that turns fencing on for `target`: until the fault starts,
    /// every member writes there with the cluster's configured credential (fencing off); then
    /// the members restart one at a time onto the config with fencing on, `first` first and
    /// the next ids in turn, one every third of the fault, each down for a quarter of its
    /// turn. While it runs, members' configs of the target's flow differ.
    RollingConfig {
        /// The target's index.
        target: usize,
        /// The member restarted first.
        first: u64,
    },
}

impl FaultKind {
    /// The class's name (the variant), for counts per class.
    pub fn class(&self) -> &'static str {
        match self {
            FaultKind::Crash { .. } => "Crash",
            FaultKind::CrashLeader => "CrashLeader",
            FaultKind::Freeze { .. } => "Freeze",
            FaultKind::Isolate { .. } => "Isolate",
            FaultKind::CutTarget { .. } => "CutTarget",
            FaultKind::TargetDown { .. } => "TargetDown",
            FaultKind::LoseTargetAnswers { .. } => "LoseTargetAnswers",
            FaultKind::LoseControlAnswers { .. } => "LoseControlAnswers",
            FaultKind::DuplicateControlWrites { .. } => "DuplicateControlWrites",
            FaultKind::SlowTarget { .. } => "SlowTarget",
            FaultKind::WipedRestart { .. } => "WipedRestart",
            FaultKind::RollingConfig { .. } => "RollingConfig",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>6} ms +{:>5} ms  {:?}",
            self.at, self.for_ms, self.kind
        )
    }
}

/// A run's faults, in start order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The faults.
    pub faults: Vec<Fault>,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for fault in &self.faults {
            writeln!(f, "  {fault}")?;
        }
        Ok(())
    }
}

/// When faults may start and must have ended: the cluster has settled before the first one
/// (every unit granted and copying) and every fault ends before the heal.
pub const FAULTS_FROM: Ms = 2_000;
/// See [`FAULTS_FROM`].
pub const FAULTS_UNTIL: Ms = 20_000;

impl Schedule {
    /// The schedule of `seed`: 2 to 10 faults, overlapping freely, of every class.
    pub fn random(seed: u64) -> Self {
        // A stream of its own, so that the world's draws never shift the schedule.
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17_5eed_fa17);
        let n = rng.gen_range(2..=10);
        let mut faults: Vec<Fault> = (0..n)
            .map(|_| {
                let at = rng.gen_range(FAULTS_FROM..FAULTS_UNTIL - 500);
                let longest = (FAULTS_UNTIL - at).min(6_000);
                let for_ms = rng.gen_range(100..=longest);
                let member = rng.gen_range(1..=MEMBERS);
                let target = rng.gen_range(0..TARGETS);
                let kind = match rng.gen_range(0..13) {
                    0 => FaultKind::Crash { member },
                    1 => FaultKind::CrashLeader,
                    2 => FaultKind::Freeze { member },
                    3 => FaultKind::Isolate { member },
                    4 => FaultKind::CutTarget { member, target },
                    5 => FaultKind::TargetDown {
                        target,
                        lose_tail: rng.gen_bool(0.5),
                    },
                    6 => FaultKind::LoseTargetAnswers {
                        target,
                        percent: rng.gen_range(10..=60),
                    },
                    7 => FaultKind::LoseControlAnswers {
                        percent: rng.gen_range(10..=60),
                    },
                    8 => FaultKind::SlowTarget {
                        target,
                        max_ms: rng.gen_range(100..=3_000),
                    },
                    9 => FaultKind::DuplicateControlWrites {
                        percent: rng.gen_range(10..=60),
                    },
                    10 => FaultKind::WipedRestart { member },
                    11 => FaultKind::RollingConfig {
                        target,
                        first: member,
                    },
                    _ => FaultKind::Freeze { member },
                };
                Fault { at, for_ms, kind }
            })
            .collect();
        faults.sort_by_key(|f| f.at);
        Self { faults }
    }

    /// The same schedule without fault `i`.
    pub fn without(&self, i: usize) -> Self {
        let mut faults = self.faults.clone();
        faults.remove(i);
        Self { faults }
    }

    /// The targets some rolling change of this schedule turns fencing on for: the members
    /// write to them with the configured credential until it starts.
    pub(crate) fn unfenced_at_start(&self) -> Vec<usize> {
        self.faults
            .iter()
            .filter_map(|f| match f.kind {
                FaultKind::RollingConfig { target, .. } => Some(target),
                _ => None,
            })
            .collect()
    }

    /// Whether a fault of this schedule is active at `now` and matches `pick`.
    pub(crate) fn active(&self, now: Ms, pick: impl Fn(&FaultKind) -> bool) -> Vec<FaultKind> {
        self.faults
            .iter()
            .filter(|f| f.at <= now && now < f.at + f.for_ms && pick(&f.kind))
            .map(|f| f.kind)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_gives_the_same_schedule_and_every_fault_ends_before_the_heal() {
        for seed in 0..200 {
            let a = Schedule::random(seed);
            assert_eq!(a, Schedule::random(seed));
            assert!((2..=10).contains(&a.faults.len()));
            for f in &a.faults {
                assert!(
                    f.at >= FAULTS_FROM && f.at + f.for_ms <= FAULTS_UNTIL,
                    "{f}"
                );
            }
        }
        assert_ne!(Schedule::random(1), Schedule::random(2));
    }

    #[test]
    fn without_drops_one_fault() {
        let s = Schedule::random(7);
        let n = s.faults.len();
        assert_eq!(s.without(0).faults.len(), n - 1);
        assert_eq!(s.without(0).faults[..], s.faults[1..]);
    }
}
