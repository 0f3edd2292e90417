//! A deterministic simulation of the replicator cluster, for the bugs that are combinations:
//! a target down while a member dies, a send whose outcome is unknown while ownership moves, a
//! freeze between a writer's lease check and its socket write, an election during a fence, a
//! rolling config change while a member is cut off, a late refusal of a replaced identity.
//!
//! Each seed draws a fault [`Schedule`] and a world (`world`): three members running the
//! control plane's real state machine, leader rounds and fence decisions, the identity a
//! process may write as and what it does with a refused login, writers that are the node's
//! own writer core (`WriterCore`: resume set-up, tail re-reads, send answers, commits, the
//! group offset map, backoff and retry budget) with its real resume plan, tail scan and send
//! check, and simulated Iggy targets that check a user's rights at login and on every request (and
//! never refuse the cluster's configured credential). Simulated time, one random stream, one
//! event queue: a seed replays exactly. After every step the invariants are checked (see
//! ARCHITECTURE.md, "The simulator"):
//! - a target never accepts a second writer session of a partition interleaved with another;
//! - every upstream message is downstream exactly once and in order (each partition is always a
//!   prefix of its upstream);
//! - confirmed offsets never move backwards, nor past what a target acknowledged;
//! - a translated group offset is the copy of the group's offset or of an earlier message;
//! - while a quorum and its target are up, a unit without a live owner is owned again within
//!   [`OWNED_WITHIN`]; once the faults end, every unit is owned, copied and confirmed within
//!   [`SETTLE_WITHIN`];
//! - every member that applied the whole log holds the same state;
//! - a member gives up after a refused login only an identity a target refused.
//!
//! `cargo test -p replicator-sim` runs a few hundred seeds; the `replicator-sim` binary runs
//! any number by hand and prints a failing seed's shrunk schedule.
#![warn(missing_docs)]

mod metadata;
mod schedule;
mod target;
mod world;

pub use metadata::{run_pair, run_pair_with, PairViolation};
pub use schedule::{Fault, FaultKind, Ms, Schedule, FAULTS_FROM, FAULTS_UNTIL, MEMBERS, TARGETS};
pub use world::{Stats, Violation, World, OWNED_WITHIN, SETTLE_WITHIN};

/// How a world is set up besides its seed and schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// The writers' retry budget (`World::with_retry_budget`); `None`: the node's default,
    /// which outlasts every fault of a schedule.
    pub retry_budget: Option<std::time::Duration>,
}

impl Settings {
    fn world(&self, seed: u64, schedule: Schedule) -> World {
        let world = World::new(seed, schedule);
        match self.retry_budget {
            Some(budget) => world.with_retry_budget(budget),
            None => world,
        }
    }
}

/// A failed seed: what broke, the schedule that broke it, the run's recent history.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The schedule that was run.
    pub schedule: Schedule,
    /// How the world was set up.
    pub settings: Settings,
    /// The broken invariant.
    pub violation: Violation,
    /// The last notable events before it.
    pub trace: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {} broke an invariant at {} ms: {}",
            self.seed, self.violation.at, self.violation.what
        )?;
        if let Some(budget) = self.settings.retry_budget {
            writeln!(f, "writers' retry budget: {} ms", budget.as_millis())?;
        }
        writeln!(f, "schedule ({} faults):", self.schedule.faults.len())?;
        write!(f, "{}", self.schedule)?;
        writeln!(f, "last events:")?;
        write!(f, "{}", self.trace)
    }
}

/// Runs `seed` with `schedule`.
pub fn run_with(seed: u64, schedule: Schedule) -> Result<Stats, Failure> {
    run_set(seed, schedule, Settings::default())
}

/// Runs `seed` with `schedule` in a world set up with `settings`.
pub fn run_set(seed: u64, schedule: Schedule, settings: Settings) -> Result<Stats, Failure> {
    let mut world = settings.world(seed, schedule.clone());
    match world.run() {
        Ok(()) => Ok(world.stats),
        Err(violation) => Err(Failure {
            seed,
            schedule,
            settings,
            violation,
            trace: world.trace(),
        }),
    }
}

/// Runs `seed` with the schedule it draws.
pub fn run(seed: u64) -> Result<Stats, Failure> {
    run_with(seed, Schedule::random(seed))
}

/// Shrinks a failure's schedule: drops each fault whose removal still breaks an invariant
/// (the world's random stream stays the seed's, so the rest replays alike), until no single
/// fault can go.
pub fn minimise(failure: Failure) -> Failure {
    let mut best = failure;
    loop {
        let mut shrunk = false;
        for i in (0..best.schedule.faults.len()).rev() {
            if let Err(smaller) = run_set(best.seed, best.schedule.without(i), best.settings) {
                best = smaller;
                shrunk = true;
                break;
            }
        }
        if !shrunk {
            return best;
        }
    }
}
