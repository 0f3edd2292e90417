//! A two-way pair's metadata sync under faults (issue 47). Clusters `a` and `b`, flows
//! `a → b` and `b → a` both syncing one user, authored on `a`, and the message expiry of one
//! topic, created on `a` first and copied to `b`. Operators change the expiry on either
//! cluster and the user on its home while the two flows' rounds run interleaved step by step,
//! as the node runs them: read the pair's records, read both clusters, record a user's home
//! found now, write the target, record the settings both sides agree on. Faults: a round cut
//! off after any step (its node killed), a record write lost (no leader), a target write
//! refused. Half the seeds start as an upgraded cluster does: the copy exists, nothing is
//! recorded yet.
//!
//! The decisions are the pipeline's own (`sim_support::pair_user_home`, `user_actions`,
//! `pair_expiry`); this world holds only the clusters, the records and the interleaving.
//!
//! Invariants, checked after every step and at the end:
//! - an original is never changed by a flow whose source holds only its copy: no flow writes
//!   the user on its home;
//! - once the faults and the operators' changes end, two rounds of each flow make both
//!   clusters agree (the expiry; the copy inactive with the home's rights), and further rounds
//!   change nothing;
//! - the expiry they agree on is one an operator set, and the last one when that change was
//!   made while the clusters agreed and no round was under way.

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use replicator_model::MetadataRecord;
use replicator_pipeline::sim_support::{
    agreed_expiry, home_record, pair_expiry, pair_user_home, user_actions, PairExpiry, PairUser,
    PairUserAction, PairUserHome,
};

/// The clusters' aliases; flow `f` copies from `ALIASES[f]` to the other.
const ALIASES: [&str; 2] = ["a", "b"];
/// The user's home (where an operator authored it).
const HOME: usize = 0;
/// Steps of the faulty phase.
const CHAOS_STEPS: u32 = 240;
/// The expiry both topics start with, seconds.
const INITIAL_EXPIRY: u64 = 3_600;

/// What one cluster holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClusterContents {
    expiry: u64,
    user: Option<PairUser>,
    /// The topic's creation time (the older topic is its home until recorded).
    topic_created: u64,
}

/// Where a round is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    ReadRecords,
    ReadSides,
    RecordHome,
    Write,
    RecordSettings,
}

/// One round of one flow, under way.
#[derive(Debug, Clone)]
struct Round {
    flow: usize,
    stage: Stage,
    user_record: Option<MetadataRecord>,
    topic_record: Option<MetadataRecord>,
    sides: Option<(ClusterContents, ClusterContents)>,
    /// The user's home as found, and whether a home found now was recorded.
    home: Option<(PairUserHome, bool)>,
    expiry: Option<PairExpiry>,
    refused: bool,
}

/// A broken invariant.
#[derive(Debug, Clone)]
pub struct PairViolation {
    /// The seed.
    pub seed: u64,
    /// What broke.
    pub what: String,
    /// The last steps before it.
    pub trace: String,
}

impl std::fmt::Display for PairViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "pair seed {}: {}", self.seed, self.what)?;
        write!(f, "{}", self.trace)
    }
}

/// The world of one seed.
struct PairWorld {
    rng: StdRng,
    /// Each flow copies states, as before issue 47: its source is always the original.
    states_not_changes: bool,
    clusters: [ClusterContents; 2],
    user_record: Option<MetadataRecord>,
    topic_record: Option<MetadataRecord>,
    rounds: [Option<Round>; 2],
    faults: bool,
    next_user_id: u32,
    /// Every expiry an operator set (and the initial one).
    set: BTreeSet<u64>,
    /// The last one an operator set, and whether it was set while the clusters agreed and no
    /// round was under way.
    last_set: Option<(u64, bool)>,
    trace: Vec<String>,
}

/// Runs `seed`.
pub fn run_pair(seed: u64) -> Result<(), PairViolation> {
    run_pair_with(seed, false)
}

/// Runs `seed`; with `states_not_changes`, each flow decides as before issue 47 (its source
/// holds the original of everything), to show that the invariants catch that.
pub fn run_pair_with(seed: u64, states_not_changes: bool) -> Result<(), PairViolation> {
    let mut world = PairWorld::new(seed);
    world.states_not_changes = states_not_changes;
    world.run().map_err(|what| PairViolation {
        seed,
        what,
        trace: world
            .trace
            .iter()
            .rev()
            .take(40)
            .rev()
            .map(|l| format!("  {l}\n"))
            .collect(),
    })
}

impl PairWorld {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7a1e_5ca1_ab1e_0047);
        let home_user = PairUser {
            id: 1,
            active: true,
            rights: rng.gen_range(0..8),
        };
        // An upgraded cluster: the copy is there and nothing is recorded.
        let upgraded = rng.gen_bool(0.5);
        let copy = upgraded.then_some(PairUser {
            id: 2,
            active: false,
            rights: home_user.rights,
        });
        Self {
            rng,
            states_not_changes: false,
            clusters: [
                ClusterContents {
                    expiry: INITIAL_EXPIRY,
                    user: Some(home_user),
                    topic_created: 1,
                },
                ClusterContents {
                    expiry: INITIAL_EXPIRY,
                    user: copy,
                    topic_created: 2,
                },
            ],
            user_record: None,
            topic_record: None,
            rounds: [None, None],
            faults: true,
            next_user_id: 3,
            set: BTreeSet::from([INITIAL_EXPIRY]),
            last_set: None,
            trace: Vec::new(),
        }
    }

    fn run(&mut self) -> Result<(), String> {
        for _ in 0..CHAOS_STEPS {
            self.chaos_step()?;
        }
        // The faults and the operators stop; rounds under way finish.
        self.faults = false;
        for flow in 0..2 {
            while self.rounds[flow].is_some() {
                self.advance(flow)?;
            }
        }
        for _ in 0..2 {
            let first = self.rng.gen_range(0..2);
            self.full_round(first)?;
            self.full_round(1 - first)?;
        }
        self.check_agreed()?;
        let settled = (
            self.clusters.clone(),
            self.user_record.clone(),
            self.topic_record.clone(),
        );
        for _ in 0..3 {
            self.full_round(0)?;
            self.full_round(1)?;
        }
        if (
            self.clusters.clone(),
            self.user_record.clone(),
            self.topic_record.clone(),
        ) != settled
        {
            return Err(format!(
                "rounds after the clusters agreed changed something: {settled:?} became {:?}",
                self.clusters
            ));
        }
        Ok(())
    }

    fn chaos_step(&mut self) -> Result<(), String> {
        let roll: f64 = self.rng.gen();
        if roll < 0.08 {
            let side = self.rng.gen_range(0..2);
            let value = 60 * self.rng.gen_range(1..=8);
            let clean = self.clusters[0].expiry == self.clusters[1].expiry
                && agreed_expiry(self.topic_record.as_ref()) == Some(self.clusters[0].expiry)
                && self.rounds.iter().all(Option::is_none);
            self.clusters[side].expiry = value;
            self.set.insert(value);
            self.last_set = Some((value, clean));
            self.note(format!(
                "operator sets the expiry on {} to {value} s",
                ALIASES[side]
            ));
        } else if roll < 0.12 {
            if let Some(user) = self.clusters[HOME].user.as_mut() {
                if self.rng.gen_bool(0.8) {
                    user.rights = self.rng.gen_range(0..8);
                } else {
                    user.active = !user.active;
                }
                let user = *user;
                self.note(format!("operator changes the user on its home: {user:?}"));
            }
        } else if roll < 0.16 {
            let flow = self.rng.gen_range(0..2);
            if let Some(round) = self.rounds[flow].take() {
                self.note(format!(
                    "the node running flow {flow} dies at {:?}",
                    round.stage
                ));
            }
        } else {
            let flow = self.rng.gen_range(0..2);
            self.advance(flow)?;
        }
        Ok(())
    }

    fn full_round(&mut self, flow: usize) -> Result<(), String> {
        self.advance(flow)?;
        while self.rounds[flow].is_some() {
            self.advance(flow)?;
        }
        Ok(())
    }

    fn note(&mut self, line: String) {
        self.trace.push(line);
    }

    /// A record write, lost now and then while faults run.
    fn lost(&mut self) -> bool {
        self.faults && self.rng.gen_bool(0.1)
    }

    /// Advances `flow`'s round one step (starting one if none is under way).
    fn advance(&mut self, flow: usize) -> Result<(), String> {
        let (source, target) = (flow, 1 - flow);
        let aliases = (ALIASES[source], ALIASES[target]);
        let Some(mut round) = self.rounds[flow].take() else {
            self.rounds[flow] = Some(Round {
                flow,
                stage: Stage::ReadRecords,
                user_record: None,
                topic_record: None,
                sides: None,
                home: None,
                expiry: None,
                refused: false,
            });
            return Ok(());
        };
        match round.stage {
            Stage::ReadRecords => {
                round.user_record = self.user_record.clone();
                round.topic_record = self.topic_record.clone();
                round.stage = Stage::ReadSides;
            }
            Stage::ReadSides => {
                round.sides = Some((self.clusters[source].clone(), self.clusters[target].clone()));
                round.stage = Stage::RecordHome;
            }
            Stage::RecordHome => {
                let (up, down) = round.sides.clone().unwrap_or_else(|| unreachable!());
                let home = pair_user_home(
                    aliases,
                    round.user_record.as_ref(),
                    up.user.as_ref(),
                    down.user.as_ref(),
                );
                let recorded = match &home {
                    PairUserHome::Found(at_source) => {
                        let side = if *at_source { source } else { target };
                        let record = home_record(ALIASES[side]);
                        let applied = !self.lost() && self.user_record.is_none();
                        if applied {
                            self.user_record = Some(record);
                        }
                        self.note(format!(
                            "flow {flow} records the user at home on {}: {applied}",
                            ALIASES[side]
                        ));
                        applied
                    }
                    _ => false,
                };
                round.home = Some((home, recorded));
                round.stage = Stage::Write;
            }
            Stage::Write => {
                let (up, down) = round.sides.clone().unwrap_or_else(|| unreachable!());
                let from_home = self.states_not_changes
                    || matches!(
                        round.home,
                        Some((PairUserHome::Recorded(true), _) | (PairUserHome::Found(true), true))
                    );
                if from_home {
                    for action in user_actions(up.user.as_ref(), down.user.as_ref()) {
                        self.write_user(flow, target, action)?;
                    }
                }
                let mut decision = pair_expiry(
                    aliases,
                    (up.expiry, down.expiry),
                    round.topic_record.as_ref(),
                    up.topic_created < down.topic_created,
                );
                if self.states_not_changes {
                    decision.write = (up.expiry != down.expiry).then_some(up.expiry);
                }
                if let Some(value) = decision.write {
                    round.refused = self.faults && self.rng.gen_bool(0.05);
                    if !round.refused {
                        self.clusters[target].expiry = value;
                    }
                    self.note(format!(
                        "flow {flow} writes the expiry {value} s on {} (read {} and {}){}",
                        ALIASES[target],
                        up.expiry,
                        down.expiry,
                        if round.refused { ": refused" } else { "" }
                    ));
                }
                round.expiry = Some(decision);
                round.stage = Stage::RecordSettings;
            }
            Stage::RecordSettings => {
                let decision = round.expiry.take().unwrap_or_else(|| unreachable!());
                let record = if round.refused {
                    decision.record_if_refused
                } else {
                    decision.record
                };
                if round.topic_record.as_ref() != Some(&record) {
                    let applied = !self.lost() && self.topic_record == round.topic_record;
                    if applied {
                        self.topic_record = Some(record.clone());
                    }
                    self.note(format!(
                        "flow {flow} records the topic {record:?}: {applied}"
                    ));
                }
                debug_assert_eq!(round.flow, flow);
                return Ok(());
            }
        }
        self.rounds[flow] = Some(round);
        Ok(())
    }

    /// Applies `action` of `flow` to the user on `target`, checking that it is not the home.
    fn write_user(
        &mut self,
        flow: usize,
        target: usize,
        action: PairUserAction,
    ) -> Result<(), String> {
        if target == HOME {
            return Err(format!(
                "flow {flow} changed the user on its home {}: {action:?}",
                ALIASES[HOME]
            ));
        }
        self.note(format!(
            "flow {flow} writes the user on {}: {action:?}",
            ALIASES[target]
        ));
        let there = &mut self.clusters[target].user;
        match action {
            PairUserAction::Create(rights) => {
                if there.is_none() {
                    *there = Some(PairUser {
                        id: self.next_user_id,
                        active: false,
                        rights,
                    });
                    self.next_user_id += 1;
                }
            }
            PairUserAction::SetRights(rights) => {
                if let Some(user) = there.as_mut() {
                    user.rights = rights;
                }
            }
            PairUserAction::Deactivate => {
                if let Some(user) = there.as_mut() {
                    user.active = false;
                }
            }
            PairUserAction::Delete => *there = None,
        }
        Ok(())
    }

    /// After the faults: both clusters agree, on a value an operator set.
    fn check_agreed(&self) -> Result<(), String> {
        let [a, b] = &self.clusters;
        if a.expiry != b.expiry {
            return Err(format!(
                "two rounds of each flow after the last fault: expiry {} on a, {} on b",
                a.expiry, b.expiry
            ));
        }
        if !self.set.contains(&a.expiry) {
            return Err(format!(
                "the clusters agree on {} s, which nobody set",
                a.expiry
            ));
        }
        if let Some((value, true)) = self.last_set {
            if a.expiry != value {
                return Err(format!(
                    "the last change, {value} s, made while the clusters agreed, was lost: \
                     they agree on {} s",
                    a.expiry
                ));
            }
        }
        let (home, copy) = (a.user, b.user);
        match (home, copy) {
            (Some(home), Some(copy)) if copy.rights == home.rights && !copy.active => Ok(()),
            (home, copy) => Err(format!(
                "two rounds of each flow after the last fault: the user is {home:?} at home \
                 and {copy:?} on the copy side"
            )),
        }
    }
}
